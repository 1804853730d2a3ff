/* Self-test of the fake CUDA driver: it must accept what the real driver accepts, reject
 * what it rejects, count misuse, and inject faults as told. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "fake_driver.h"

#define GRAIN ((size_t)2 << 20) /* the default granularity */

static const struct vmm_driver *drv;

static int reset_defaults(void **state) {
  (void)state;
  drv = fake_driver_reset(NULL);
  return 0;
}

static size_t misuse_count(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l.errors;
}

static CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

static CUmemGenericAllocationHandle create(size_t size) {
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h = 0;
  assert_int_equal(drv->mem_create(&h, size, &prop, 0), CUDA_SUCCESS);
  return h;
}

static CUdeviceptr reserve(size_t size) {
  CUdeviceptr base = 0;
  assert_int_equal(drv->mem_address_reserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
  return base;
}

static CUmemAccessDesc rw_access(int device) {
  CUmemAccessDesc desc = {0};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return desc;
}

static void test_happy_path(void **state) {
  (void)state;
  assert_int_equal(drv->version, VMM_DRIVER_VERSION);
  assert_string_equal(drv->name, "fake");
  CUcontext ctx;
  assert_int_equal(drv->primary_ctx_retain(&ctx, 0), CUDA_SUCCESS);
  assert_int_equal(drv->ctx_push_current(ctx), CUDA_SUCCESS);
  size_t grain = 0, free_bytes, total;
  CUmemAllocationProp prop = device_prop(0);
  assert_int_equal(drv->mem_get_allocation_granularity(&grain, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                   CUDA_SUCCESS);
  assert_int_equal(grain, GRAIN);

  CUdeviceptr base = reserve(4 * GRAIN);
  assert_int_equal(base % GRAIN, 0);
  CUmemGenericAllocationHandle h = create(2 * GRAIN);
  assert_int_equal(drv->mem_map(base, 2 * GRAIN, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc rw = rw_access(0);
  assert_int_equal(drv->mem_set_access(base, 2 * GRAIN, &rw, 1), CUDA_SUCCESS);
  assert_int_equal(fake_mapped_size_at(base + GRAIN + 1), 2 * GRAIN);
  assert_true(fake_access_granted(base + 2 * GRAIN - 1, 0));
  assert_int_equal(fake_mapped_size_at(base + 2 * GRAIN), 0);
  assert_int_equal(drv->mem_get_info(&free_bytes, &total), CUDA_SUCCESS);
  assert_int_equal(total - free_bytes, 2 * GRAIN);

  assert_int_equal(drv->mem_unmap(base, 2 * GRAIN), CUDA_SUCCESS);
  assert_false(fake_access_granted(base, 0));
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(base, 4 * GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->ctx_pop_current(&ctx), CUDA_SUCCESS);
  assert_int_equal(drv->primary_ctx_release(0), CUDA_SUCCESS);
  assert_true(fake_ledger_clean());

  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_map), 1);
  const fake_call *first = fake_call_at(0);
  assert_int_equal(first->entry, VMM_DRV_primary_ctx_retain);
  assert_int_equal(first->result, CUDA_SUCCESS);
}

static void test_partial_map_not_supported(void **state) {
  (void)state;
  CUdeviceptr base = reserve(2 * GRAIN);
  CUmemGenericAllocationHandle h = create(2 * GRAIN);
  assert_int_equal(drv->mem_map(base, GRAIN, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  assert_int_equal(drv->mem_map(base, GRAIN, GRAIN, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  assert_int_equal(misuse_count(), 0); /* a driver limit, not a misuse */
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(base, 2 * GRAIN), CUDA_SUCCESS);
  assert_true(fake_ledger_clean());
}

static void test_overlapping_map_rejected(void **state) {
  (void)state;
  CUdeviceptr base = reserve(4 * GRAIN);
  CUmemGenericAllocationHandle two = create(2 * GRAIN), other = create(2 * GRAIN), one = create(GRAIN);
  assert_int_equal(drv->mem_map(base + GRAIN, 2 * GRAIN, 0, two, 0), CUDA_SUCCESS);
  assert_int_equal(drv->mem_map(base, 2 * GRAIN, 0, other, 0), CUDA_ERROR_INVALID_VALUE);         /* tail */
  assert_int_equal(drv->mem_map(base + 2 * GRAIN, 2 * GRAIN, 0, other, 0), CUDA_ERROR_INVALID_VALUE); /* head */
  assert_int_equal(drv->mem_map(base + GRAIN, GRAIN, 0, one, 0), CUDA_ERROR_INVALID_VALUE);        /* same base */
  assert_int_equal(drv->mem_map(base + 3 * GRAIN, 2 * GRAIN, 0, other, 0), CUDA_ERROR_INVALID_VALUE); /* past end */
  assert_int_equal(drv->mem_map(base + 3 * GRAIN, GRAIN, 0, one, 0), CUDA_SUCCESS);
  assert_int_equal(misuse_count(), 4);
  assert_non_null(fake_first_error());
}

static void test_misuse_counted(void **state) {
  (void)state;
  CUdeviceptr base = reserve(GRAIN);
  CUmemGenericAllocationHandle h = create(GRAIN);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(drv->mem_unmap(base, GRAIN), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(drv->mem_address_free(base, 2 * GRAIN), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(drv->primary_ctx_release(0), CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(drv->ctx_pop_current(NULL), CUDA_ERROR_INVALID_CONTEXT);
  assert_int_equal(misuse_count(), 5);
  assert_int_equal(drv->mem_address_free(base, GRAIN), CUDA_SUCCESS);
  assert_false(fake_ledger_clean()); /* nothing live, but misuse was seen */
}

static void test_capacity_out_of_memory(void **state) {
  (void)state;
  drv = fake_driver_reset(&(fake_options){.capacity = 2 * GRAIN, .va_space = 2 * GRAIN});
  CUmemGenericAllocationHandle h = create(2 * GRAIN), extra;
  CUmemAllocationProp prop = device_prop(0);
  assert_int_equal(drv->mem_create(&extra, GRAIN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr base = reserve(2 * GRAIN), more;
  assert_int_equal(drv->mem_address_reserve(&more, GRAIN, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
  assert_int_equal(misuse_count(), 0);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(base, 2 * GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(create(GRAIN)), CUDA_SUCCESS);
  assert_true(fake_ledger_clean());
}

static void test_fault_injection(void **state) {
  (void)state;
  CUmemAllocationProp prop = device_prop(0);
  CUmemGenericAllocationHandle h;
  fake_ledger l;
  fake_fail_nth(VMM_DRV_mem_create, 2, CUDA_ERROR_OUT_OF_MEMORY, 0);
  create(GRAIN);
  assert_int_equal(drv->mem_create(&h, GRAIN, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  create(GRAIN);
  fake_get_ledger(&l);
  assert_int_equal(l.live_handles, 2); /* the failed call had no effect */
  assert_int_equal(fake_faults_fired(), 1);

  fake_fail_nth(VMM_DRV_mem_create, 2, CUDA_ERROR_UNKNOWN, 1);
  create(GRAIN);
  assert_int_equal(drv->mem_create(&h, GRAIN, &prop, 0), CUDA_ERROR_UNKNOWN);
  assert_int_equal(drv->mem_create(&h, GRAIN, &prop, 0), CUDA_ERROR_UNKNOWN);
  assert_int_equal(fake_faults_fired(), 3);
  fake_clear_faults();
  create(GRAIN);

  size_t bytes;
  int version;
  fake_fail_nth_any(2, CUDA_ERROR_LAUNCH_FAILED, 0);
  assert_int_equal(drv->driver_get_version(&version), CUDA_SUCCESS);
  assert_int_equal(drv->host_memory_available(&bytes), CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(drv->host_memory_available(&bytes), CUDA_SUCCESS);
  assert_int_equal(bytes, (size_t)64 << 30);
  assert_int_equal(fake_faults_fired(), 4);
  const fake_call *last = fake_call_at(fake_call_count() - 2);
  assert_int_equal(last->entry, VMM_DRV_host_memory_available);
  assert_int_equal(last->result, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(misuse_count(), 0);
}

static void test_capturing_streams(void **state) {
  (void)state;
  CUstream capturing = (CUstream)(uintptr_t)0x100, idle = (CUstream)(uintptr_t)0x200;
  CUstreamCaptureStatus status;
  CUevent event;
  fake_set_capturing(capturing, 1);
  assert_int_equal(drv->stream_is_capturing(capturing, &status), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(drv->stream_is_capturing(idle, &status), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(drv->stream_is_capturing(NULL, &status), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(misuse_count(), 0);

  assert_int_equal(drv->event_create(&event, 0), CUDA_SUCCESS);
  assert_int_equal(drv->stream_synchronize(idle), CUDA_SUCCESS);
  assert_int_equal(drv->event_record(event, idle), CUDA_SUCCESS);
  assert_int_equal(drv->stream_synchronize(capturing), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(drv->event_record(event, capturing), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(drv->stream_wait_event(capturing, event, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(drv->ctx_synchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(drv->stream_synchronize(NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(misuse_count(), 5);

  fake_set_capturing(capturing, 0);
  assert_int_equal(drv->stream_synchronize(capturing), CUDA_SUCCESS);
  assert_int_equal(drv->ctx_synchronize(), CUDA_SUCCESS);
  assert_int_equal(drv->event_record((CUevent)(uintptr_t)0xdead, idle), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(drv->event_destroy(event), CUDA_SUCCESS);
  assert_int_equal(drv->event_destroy(event), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(misuse_count(), 7);
}

/* With a lag an event completes that many operations after its record, or at a synchronize;
 * an event never recorded is complete; a record again starts over. */
static void test_event_lag(void **state) {
  (void)state;
  CUstream s = (CUstream)(uintptr_t)0x100;
  CUevent never, e;
  assert_int_equal(drv->event_create(&never, 0), CUDA_SUCCESS);
  assert_int_equal(drv->event_create(&e, 0), CUDA_SUCCESS);
  fake_set_event_lag(3);
  fake_advance_clock(1);
  assert_int_equal(drv->event_record(e, s), CUDA_SUCCESS); /* at 1: complete at 4 */
  assert_int_equal(drv->event_query(never), CUDA_SUCCESS);
  fake_advance_clock(2);
  assert_int_equal(drv->event_query(e), CUDA_ERROR_NOT_READY);
  fake_advance_clock(1);
  assert_int_equal(drv->event_query(e), CUDA_SUCCESS);
  assert_int_equal(drv->event_record(e, s), CUDA_SUCCESS); /* at 4 */
  assert_int_equal(drv->event_query(e), CUDA_ERROR_NOT_READY);
  assert_int_equal(drv->stream_synchronize(s), CUDA_SUCCESS);
  assert_int_equal(drv->event_query(e), CUDA_SUCCESS);
  fake_advance_clock(1);
  assert_int_equal(drv->event_record(e, s), CUDA_SUCCESS); /* at 5, after the synchronize */
  assert_int_equal(drv->event_query(e), CUDA_ERROR_NOT_READY);
  assert_int_equal(drv->ctx_synchronize(), CUDA_SUCCESS);
  assert_int_equal(drv->event_query(e), CUDA_SUCCESS);
  assert_int_equal(drv->event_destroy(never), CUDA_SUCCESS);
  assert_int_equal(drv->event_destroy(e), CUDA_SUCCESS);
  assert_int_equal(misuse_count(), 0);
}

static void test_unmap_of_several_mappings(void **state) {
  (void)state;
  CUdeviceptr base = reserve(4 * GRAIN);
  CUmemGenericAllocationHandle h[3] = {create(GRAIN), create(GRAIN), create(GRAIN)};
  for (int i = 0; i < 3; i++) assert_int_equal(drv->mem_map(base + i * GRAIN, GRAIN, 0, h[i], 0), CUDA_SUCCESS);
  CUmemAccessDesc rw = rw_access(0);
  assert_int_equal(drv->mem_set_access(base, 3 * GRAIN, &rw, 1), CUDA_SUCCESS);
  assert_true(fake_access_granted(base + 2 * GRAIN, 0));
  assert_int_equal(drv->mem_unmap(base, 4 * GRAIN), CUDA_ERROR_INVALID_VALUE);     /* runs past the last */
  assert_int_equal(drv->mem_unmap(base, GRAIN + GRAIN / 2), CUDA_ERROR_INVALID_VALUE); /* ends inside one */
  assert_int_equal(drv->mem_unmap(base, 3 * GRAIN), CUDA_SUCCESS);

  assert_int_equal(drv->mem_map(base, GRAIN, 0, h[0], 0), CUDA_SUCCESS);
  assert_int_equal(drv->mem_map(base + 2 * GRAIN, GRAIN, 0, h[2], 0), CUDA_SUCCESS);
  assert_int_equal(drv->mem_set_access(base, 3 * GRAIN, &rw, 1), CUDA_ERROR_INVALID_VALUE); /* gap */
  assert_int_equal(drv->mem_unmap(base, 3 * GRAIN), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(misuse_count(), 4);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_mappings, 2);
  assert_int_equal(l.mapped_bytes, 2 * GRAIN);
}

static void test_aliased_handle_outlives_release(void **state) {
  (void)state;
  CUdeviceptr a = reserve(2 * GRAIN), b = reserve(2 * GRAIN);
  CUmemGenericAllocationHandle h = create(2 * GRAIN);
  assert_int_equal(drv->mem_map(a, 2 * GRAIN, 0, h, 0), CUDA_SUCCESS);
  assert_int_equal(drv->mem_map(b, 2 * GRAIN, 0, h, 0), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_map(a, 2 * GRAIN, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* released */
  size_t free_bytes, total;
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_handles, 0);
  assert_int_equal(drv->mem_unmap(a, 2 * GRAIN), CUDA_SUCCESS);
  assert_int_equal(fake_mapped_size_at(b), 2 * GRAIN);
  assert_int_equal(drv->mem_get_info(&free_bytes, &total), CUDA_SUCCESS);
  assert_int_equal(total - free_bytes, 2 * GRAIN); /* freed only with the last mapping */
  assert_int_equal(drv->mem_unmap(b, 2 * GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_get_info(&free_bytes, &total), CUDA_SUCCESS);
  assert_int_equal(free_bytes, total);
  assert_int_equal(misuse_count(), 1);
}

static void test_peer_access_off(void **state) {
  (void)state;
  drv = fake_driver_reset(&(fake_options){.device_count = 2, .peer_access = -1});
  int can_access = 1;
  assert_int_equal(drv->device_can_access_peer(&can_access, 0, 1), CUDA_SUCCESS);
  assert_int_equal(can_access, 0);
  CUdeviceptr base = reserve(GRAIN);
  assert_int_equal(drv->mem_map(base, GRAIN, 0, create(GRAIN), 0), CUDA_SUCCESS);
  CUmemAccessDesc both[2] = {rw_access(0), rw_access(1)};
  assert_int_equal(drv->mem_set_access(base, GRAIN, both, 2), CUDA_ERROR_INVALID_DEVICE);
  assert_false(fake_access_granted(base, 0)); /* the failed call changed nothing */
  assert_int_equal(misuse_count(), 1);
}

/* 100,000 live mappings in one reservation, mapped and unmapped in scattered orders:
 * quadratic bookkeeping in the fake would make this test crawl. */
static void test_many_mappings(void **state) {
  (void)state;
  enum { COUNT = 100000 };
  static CUmemGenericAllocationHandle handles[COUNT];
  drv = fake_driver_reset(&(fake_options){.capacity = (size_t)COUNT * GRAIN, .record_calls = -1});
  CUdeviceptr base = reserve((size_t)COUNT * GRAIN);
  for (size_t i = 0; i < COUNT; i++) {
    size_t slot = i * 7919 % COUNT; /* 7919 is prime, so this visits every slot once */
    handles[slot] = create(GRAIN);
    assert_int_equal(drv->mem_map(base + slot * GRAIN, GRAIN, 0, handles[slot], 0), CUDA_SUCCESS);
  }
  assert_int_equal(fake_mapped_size_at(base + (COUNT - 1) * GRAIN), GRAIN);
  for (size_t i = 0; i < COUNT; i++) {
    size_t slot = i * 104729 % COUNT;
    assert_int_equal(drv->mem_unmap(base + slot * GRAIN, GRAIN), CUDA_SUCCESS);
    assert_int_equal(drv->mem_release(handles[slot]), CUDA_SUCCESS);
  }
  assert_int_equal(drv->mem_address_free(base, (size_t)COUNT * GRAIN), CUDA_SUCCESS);
  assert_int_equal(fake_call_count(), 0);
  assert_true(fake_ledger_clean());
}

/* ---- The device timeline: each violation fires on a planted bug, and not without it ---- */

#define TS1 ((CUstream)(uintptr_t)0x5001)
#define TS2 ((CUstream)(uintptr_t)0x5002)

/* One handle of GRAIN mapped with access at a fresh reservation; its base in *va. */
static CUmemGenericAllocationHandle mapped(CUdeviceptr *va) {
  assert_int_equal(drv->mem_address_reserve(va, 4 * GRAIN, 0, 0, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h = create(GRAIN);
  assert_int_equal(drv->mem_map(*va, GRAIN, 0, h, 0), CUDA_SUCCESS);
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  assert_int_equal(drv->mem_set_access(*va, GRAIN, &d, 1), CUDA_SUCCESS);
  return h;
}

static void expect_violation(fake_violation_kind kind, const char *words) {
  assert_int_equal(fake_violations(kind), 1);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 1);
  if (!strstr(fake_violation_text(0), words)) fail_msg("\"%s\" lacks \"%s\"", fake_violation_text(0), words);
  fake_violations_clear();
}

/* Memory handed to a new owner on another stream with no edge after the old owner's kernel. */
static void test_timeline_reuse(void **state) {
  (void)state;
  CUdeviceptr va;
  CUmemGenericAllocationHandle h = mapped(&va);
  assert_int_equal(fake_kernel(TS1, va, 4096, 1), 0);
  assert_int_equal(fake_kernel(TS2, va + 1024, 1024, 2), 0); /* planted: no order after TS1 */
  expect_violation(FAKE_VIOLATION_REUSE, "kernel #2 of owner 2");
  CUevent e;
  assert_int_equal(drv->event_create(&e, 0), CUDA_SUCCESS);
  assert_int_equal(fake_kernel(TS1, va, 4096, 3), 0); /* planted again: owner 2's kernel is not before it */
  expect_violation(FAKE_VIOLATION_REUSE, "kernel #2 of owner 2");
  assert_int_equal(drv->event_record(e, TS1), CUDA_SUCCESS); /* the allocator's order: TS2 after TS1 */
  assert_int_equal(drv->stream_wait_event(TS2, e, 0), CUDA_SUCCESS);
  assert_int_equal(fake_kernel(TS2, va, 4096, 4), 0);
  assert_int_equal(fake_kernel(TS2, va, 4096, 4), 0); /* the same owner again: nothing to order */
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(drv->event_destroy(e), CUDA_SUCCESS);
  assert_int_equal(drv->stream_synchronize(TS2), CUDA_SUCCESS);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(va, 4 * GRAIN), CUDA_SUCCESS);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
}

/* An unmap before the host knows the kernel complete; an event the host saw complete, or a
 * synchronize, teaches it. The same handle mapped elsewhere is the same memory. */
static void test_timeline_unmap_and_release(void **state) {
  (void)state;
  CUdeviceptr va;
  CUmemGenericAllocationHandle h = mapped(&va);
  assert_int_equal(fake_kernel(TS1, va, GRAIN, 1), 0);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS); /* planted: no wait */
  expect_violation(FAKE_VIOLATION_UNMAP, "kernel #1 of owner 1");
  assert_int_equal(drv->mem_map(va + GRAIN, GRAIN, 0, h, 0), CUDA_SUCCESS); /* the handle elsewhere */
  CUmemAccessDesc d = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  assert_int_equal(drv->mem_set_access(va + GRAIN, GRAIN, &d, 1), CUDA_SUCCESS);
  assert_int_equal(fake_kernel(TS2, va + GRAIN, GRAIN, 2), 0); /* the unmap was flagged: owner 1's access is gone */
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS); /* planted: mapped, in use, no wait */
  expect_violation(FAKE_VIOLATION_RELEASE, "kernel #2 of owner 2");
  CUevent e;
  assert_int_equal(drv->event_create(&e, 0), CUDA_SUCCESS);
  assert_int_equal(drv->event_record(e, TS2), CUDA_SUCCESS);
  assert_int_equal(drv->event_query(e), CUDA_SUCCESS); /* the host learns TS2's kernel is done */
  assert_int_equal(drv->mem_unmap(va + GRAIN, GRAIN), CUDA_SUCCESS);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(drv->event_destroy(e), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(va, 4 * GRAIN), CUDA_SUCCESS);
}

static int forbid;
static int forbids(void *ctx) { return *(int *)ctx; }

/* A release inside a retaining scope (the guard says so) of memory an allocation used; memory
 * no access touched (an undo's) may go. */
static void test_timeline_scope_release(void **state) {
  (void)state;
  CUcontext ctx;
  assert_int_equal(drv->primary_ctx_retain(&ctx, 0), CUDA_SUCCESS);
  fake_set_release_guard(0, forbids, &forbid);
  forbid = 1;
  CUmemGenericAllocationHandle unused = create(GRAIN);
  assert_int_equal(drv->mem_release(unused), CUDA_SUCCESS);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h = mapped(&va);
  assert_int_equal(fake_kernel(TS1, va, 64, 1), 0);
  assert_int_equal(drv->stream_synchronize(TS1), CUDA_SUCCESS);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS); /* planted: inside the scope */
  expect_violation(FAKE_VIOLATION_SCOPE_RELEASE, "inside a retaining scope");
  assert_int_equal(drv->primary_ctx_release(0), CUDA_SUCCESS); /* the guard goes with the context */
  h = mapped(&va);
  assert_int_equal(fake_kernel(TS1, va, 64, 2), 0);
  assert_int_equal(drv->ctx_synchronize(), CUDA_SUCCESS);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
}

/* A synchronize on a capturing stream; a kernel on unmapped memory; a captured kernel runs
 * only when its graph is launched, on the launching stream. */
static void test_timeline_capture_and_unmapped(void **state) {
  (void)state;
  fake_set_capturing(TS1, 1);
  assert_int_equal(drv->stream_synchronize(TS1), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* planted */
  expect_violation(FAKE_VIOLATION_CAPTURE_SYNC, "capturing");
  CUdeviceptr va;
  CUmemGenericAllocationHandle h = mapped(&va);
  assert_int_equal(fake_kernel(TS1, va, 64, 1), 0); /* captured: nothing runs */
  fake_set_capturing(TS1, 0);
  uint64_t graph = fake_graph_last();
  assert_true(graph != 0);
  assert_int_equal(fake_kernel(TS2, va, 64, 2), 0);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  fake_graph_launch(graph, TS1); /* planted: replayed with no order after owner 2 */
  expect_violation(FAKE_VIOLATION_REUSE, "replayed kernel");
  assert_int_equal(drv->ctx_synchronize(), CUDA_SUCCESS);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS);
  assert_int_equal(fake_kernel(TS2, va, 64, 3), -1); /* planted: unmapped */
  expect_violation(FAKE_VIOLATION_UNMAPPED_ACCESS, "unmapped");
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(va, 4 * GRAIN), CUDA_SUCCESS);
}

/* The capture graph: a fork (the program's wait) brings a stream into the capture with the
 * other's dependencies; each captured kernel is a node on its stream's set; a join merges the
 * sets; cuStreamGetCaptureInfo and cuGraphNodeGetDependencies answer from it; a captured
 * kernel on bytes another owner's captured kernel touched, with no path between them, is a
 * violation; ending the origin's capture ends the side stream's and its kernels are replayed. */
static void test_capture_graph(void **state) {
  (void)state;
  CUstream s1 = TS1, s2 = TS2;
  CUstreamCaptureStatus status;
  cuuint64_t id1 = 0, id2 = 0;
  const CUgraphNode *deps;
  const CUgraphEdgeData *edges = (const CUgraphEdgeData *)1;
  size_t n = 9;
  fake_set_capturing(s1, 1);
  assert_int_equal(drv->stream_get_capture_info(s1, &status, &id1, NULL, &deps, &edges, &n), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_true(id1 != 0);
  assert_int_equal(n, 0);
  assert_null(edges);
  assert_int_equal(drv->stream_get_capture_info(s2, &status, &id2, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(drv->stream_get_capture_info(NULL, &status, NULL, NULL, NULL, NULL, NULL),
                   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h = mapped(&va);
  assert_int_equal(fake_kernel(s1, va, 64, 1), 0); /* node a */
  assert_int_equal(drv->stream_get_capture_info(s1, &status, &id1, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  assert_int_equal(n, 1);
  CUgraphNode a = deps[0], got[4];
  size_t count = 0;
  assert_int_equal(drv->graph_node_get_dependencies(a, NULL, NULL, &count), CUDA_SUCCESS);
  assert_int_equal(count, 0);
  fake_program_wait(s2, s1); /* fork: s2 joins the capture with {a} */
  assert_int_equal(drv->stream_get_capture_info(s2, &status, &id2, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_true(id2 == id1 && n == 1 && deps[0] == a);
  assert_int_equal(fake_kernel(s2, va, 64, 1), 0); /* node b, after a */
  assert_int_equal(drv->stream_get_capture_info(s2, &status, NULL, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  CUgraphNode b = deps[0];
  assert_int_equal(fake_kernel(s1, va + 64, 64, 2), 0); /* node c, after a */
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(fake_kernel(s1, va, 64, 3), 0); /* planted: owner 3 on b's bytes, no path from b */
  expect_violation(FAKE_VIOLATION_REUSE, "no path of dependencies");
  fake_program_wait(s1, s2); /* join: s1's set gains b */
  assert_int_equal(drv->stream_get_capture_info(s1, &status, NULL, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  assert_int_equal(n, 2);
  assert_int_equal(fake_kernel(s1, va, 64, 4), 0); /* node e, after d and b: ordered */
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(drv->stream_get_capture_info(s1, &status, NULL, NULL, &deps, NULL, &n), CUDA_SUCCESS);
  CUgraphEdgeData edge_data[4];
  count = 4;
  assert_int_equal(drv->graph_node_get_dependencies(deps[0], got, edge_data, &count), CUDA_SUCCESS);
  assert_int_equal(count, 2);
  assert_true((got[0] == b) != (got[1] == b));
  assert_int_equal(edge_data[0].type, CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
  count = 1; /* room for fewer than it has */
  assert_int_equal(drv->graph_node_get_dependencies(deps[0], got, NULL, &count), CUDA_SUCCESS);
  assert_int_equal(count, 1);
  assert_int_equal(drv->graph_node_get_dependencies((CUgraphNode)(uintptr_t)999, got, NULL, &count),
                   CUDA_ERROR_INVALID_VALUE); /* planted: an unknown node (misuse) */
  assert_int_equal(misuse_count(), 1);
  fake_set_capturing(s1, 0); /* the capture ends, for s2 too */
  assert_int_equal(drv->stream_get_capture_info(s2, &status, NULL, NULL, NULL, NULL, NULL), CUDA_SUCCESS);
  assert_int_equal(status, CU_STREAM_CAPTURE_STATUS_NONE);
  fake_graph_launch(fake_graph_last(), s1); /* five kernels, in capture order on one stream */
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(drv->ctx_synchronize(), CUDA_SUCCESS);
  assert_int_equal(drv->mem_unmap(va, GRAIN), CUDA_SUCCESS);
  assert_int_equal(drv->mem_release(h), CUDA_SUCCESS);
  assert_int_equal(drv->mem_address_free(va, 4 * GRAIN), CUDA_SUCCESS);
  const struct vmm_driver *older = fake_driver_without_capture_graph();
  assert_null(older->stream_get_capture_info);
  assert_null(older->graph_node_get_dependencies);
  assert_non_null(older->stream_is_capturing);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_happy_path, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_partial_map_not_supported, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_overlapping_map_rejected, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_misuse_counted, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_capacity_out_of_memory, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_fault_injection, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_capturing_streams, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_event_lag, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_unmap_of_several_mappings, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_aliased_handle_outlives_release, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_peer_access_off, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_many_mappings, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_timeline_reuse, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_timeline_unmap_and_release, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_timeline_scope_release, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_timeline_capture_and_unmapped, reset_defaults, reset_defaults),
      cmocka_unit_test_setup_teardown(test_capture_graph, reset_defaults, reset_defaults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
