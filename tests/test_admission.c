/* Admission: the limit and the headroom (device free memory on discrete GPUs, host
 * MemAvailable on integrated ones) at their boundaries, the numbers in every refusal, the
 * counters, the pool fallback inside a retention scope, and failures to read the figures. */
#include "test_util.h"

#include <stdio.h>
#include <string.h>

#define S TU_STREAM(1)

/* An arena with the given limit and headroom on a fake with these options; package
 * allocations inside a scope are assembled from idle handles where package_assembly is set. */
static vmm_arena *arena_with(const fake_options *opts, size_t headroom, size_t limit, int package_assembly) {
  vmm_config cfg = tu_config();
  cfg.headroom_bytes = headroom;
  cfg.limit_bytes = limit;
  cfg.package_assembly = package_assembly;
  return tu_arena(opts, &cfg);
}

static void assert_contains(const char *text, const char *needle) {
  if (!strstr(text, needle)) fprintf(stderr, "message: %s\nlacks:   %s\n", text, needle);
  assert_non_null(strstr(text, needle));
}

/* What the arena holds, as the refusal and the snapshot see it. */
static void assert_same_holdings(const vmm_snapshot *x, const vmm_snapshot *y) {
  assert_memory_equal(x->kind, y->kind, sizeof x->kind);
  assert_int_equal(x->physical_bytes, y->physical_bytes);
  assert_int_equal(x->physical_peak_bytes, y->physical_peak_bytes);
  assert_int_equal(x->mapped_bytes, y->mapped_bytes);
  assert_int_equal(x->mapped_peak_bytes, y->mapped_peak_bytes);
  assert_int_equal(x->reserved_va_bytes, y->reserved_va_bytes);
  assert_int_equal(x->retained_reusable_handles, y->retained_reusable_handles);
  assert_int_equal(x->retained_reusable_bytes, y->retained_reusable_bytes);
  assert_int_equal(x->pool_buckets, y->pool_buckets);
  assert_int_equal(x->allocs, y->allocs);
  assert_int_equal(x->frees, y->frees);
}

/* Asserts that allocating `bytes` of `kind` is refused as recoverable out of memory, that
 * nothing changed (arena, fake ledger, no cuMemCreate) and that the message holds every
 * needle. Returns the snapshot after the refusal. */
static vmm_snapshot expect_refusal(vmm_arena *a, size_t bytes, vmm_kind kind, const char *const *needles) {
  vmm_snapshot before = tu_snapshot(a);
  fake_ledger lb, la;
  fake_get_ledger(&lb);
  void *p = (void *)0x1;
  assert_int_equal(vmm_arena_alloc(a, bytes, kind, S, &p), VMM_ERR_OUT_OF_MEMORY);
  assert_null(p);
  for (; *needles; needles++) assert_contains(vmm_arena_last_error(a), *needles);
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
  assert_string_equal(fatal, "");
  vmm_snapshot after = tu_snapshot(a);
  assert_same_holdings(&before, &after);
  assert_int_equal(after.fatal_status, VMM_OK);
  fake_get_ledger(&la);
  assert_int_equal(la.live_handles, lb.live_handles);
  assert_int_equal(la.live_mappings, lb.live_mappings);
  assert_int_equal(la.reservations, lb.reservations);
  tu_check(a);
  return after;
}

/* "requested N B, rounded M B" as the refusal writes it. */
static const char *req(char buf[96], size_t bytes, size_t rounded) {
  snprintf(buf, 96, "(requested %zu B, rounded %zu B)", bytes, rounded);
  return buf;
}

/* ---- Headroom on a discrete device: free memory = capacity - used --------------------- */

static void headroom_discrete_boundary(void **state) {
  (void)state;
  const size_t headroom = 10 * MiB;
  vmm_arena *a = arena_with(NULL, headroom, 0, 1);
  void *pkg = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
  void *tr = tu_alloc(a, 3 * MiB + 1, VMM_KIND_TRANSIENT, S); /* 4 MiB */

  /* One byte short: free = 14 MiB - 1 for 4 MiB + 10 MiB of headroom. */
  fake_set_capacity(0, 6 * MiB + 14 * MiB - 1);
  char r[96], found[96], holds[160];
  snprintf(found, sizeof found, "device free memory 14.0 MiB (%zu B) < 4.0 MiB + headroom 10.0 MiB (%zu B required)",
           14 * MiB - 1, 14 * MiB);
  snprintf(holds, sizeof holds,
           "arena holds 6.0 MiB live (package 2.0 MiB, transient 4.0 MiB), 0 B pooled, 0 B idle, 0 B abandoned");
  const char *transient[] = {"transient 4.0 MiB refused", req(r, 3 * MiB, 4 * MiB), found, holds, NULL};
  vmm_snapshot s = expect_refusal(a, 3 * MiB, VMM_KIND_TRANSIENT, transient);
  assert_int_equal(s.headroom_refusals, 1);
  assert_int_equal(s.limit_refusals, 0);
  assert_int_equal(s.oom_refusals, 0);
  assert_int_equal(s.headroom_bytes, headroom);

  char r2[96];
  const char *package[] = {"package 4.0 MiB refused", req(r2, 4 * MiB, 4 * MiB), found, holds, NULL};
  s = expect_refusal(a, 4 * MiB, VMM_KIND_PACKAGE, package);
  assert_int_equal(s.headroom_refusals, 2);

  /* Exactly enough: free = request + headroom is admitted, with one cuMemGetInfo. */
  fake_set_capacity(0, 6 * MiB + 14 * MiB);
  size_t from = fake_call_count();
  void *fits = tu_alloc(a, 3 * MiB, VMM_KIND_TRANSIENT, S);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_get_info), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_host_memory_available), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
  s = tu_snapshot(a);
  assert_int_equal(s.headroom_refusals, 2);
  assert_int_equal(s.physical_bytes, 10 * MiB);

  /* Now free = 10 MiB = the headroom itself: even one granule is refused. */
  char r3[96], found3[96];
  snprintf(found3, sizeof found3, "device free memory 10.0 MiB (%zu B) < 2.0 MiB + headroom 10.0 MiB (%zu B required)",
           10 * MiB, 12 * MiB);
  const char *one[] = {req(r3, 1, 2 * MiB), found3, "arena holds 10.0 MiB live (package 2.0 MiB, transient 8.0 MiB)",
                       NULL};
  s = expect_refusal(a, 1, VMM_KIND_TRANSIENT, one);
  assert_int_equal(s.headroom_refusals, 3);

  assert_int_equal(vmm_arena_free(a, fits, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, tr, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK);
  tu_destroy(a);
}

/* A headroom so large that request + headroom overflows is refused, and the message does not
 * show a wrapped-around figure. */
static void headroom_overflow(void **state) {
  (void)state;
  vmm_arena *a = arena_with(NULL, SIZE_MAX - 2 * MiB + 1, 0, 1);
  char r[96], required[64];
  snprintf(required, sizeof required, "(%zu B required)", SIZE_MAX);
  const char *needles[] = {req(r, 4 * MiB, 4 * MiB), required, NULL};
  vmm_snapshot s = expect_refusal(a, 4 * MiB, VMM_KIND_PACKAGE, needles);
  assert_int_equal(s.headroom_refusals, 1);
  tu_destroy(a);
}

/* Headroom 0 means no check: the figure is not even read. */
static void headroom_zero_reads_nothing(void **state) {
  (void)state;
  fake_options opts = {.integrated = 1, .host_mem_available = 1};
  vmm_arena *a = arena_with(&opts, 0, 0, 1);
  size_t from = fake_call_count();
  void *p = tu_alloc(a, 64 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_get_info), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_host_memory_available), 0);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* ---- Headroom on an integrated device: host MemAvailable ------------------------------ */

static void headroom_integrated_boundary(void **state) {
  (void)state;
  fake_options opts = {.integrated = 1, .host_mem_available = 14 * MiB - 1};
  vmm_arena *a = arena_with(&opts, 10 * MiB, 0, 1);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.integrated, 1);

  char r[96], found[128];
  snprintf(found, sizeof found, "MemAvailable 14.0 MiB (%zu B) < 4.0 MiB + headroom 10.0 MiB (%zu B required)",
           14 * MiB - 1, 14 * MiB);
  const char *needles[] = {"transient 4.0 MiB refused", req(r, 3 * MiB + 5, 4 * MiB), found,
                           "arena holds 0 B live (package 0 B, transient 0 B)", NULL};
  size_t from = fake_call_count();
  s = expect_refusal(a, 3 * MiB + 5, VMM_KIND_TRANSIENT, needles);
  assert_int_equal(fake_calls_since(from, VMM_DRV_host_memory_available), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_get_info), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_int_equal(s.headroom_refusals, 1);

  fake_set_host_mem_available(14 * MiB);
  void *p = tu_alloc(a, 3 * MiB + 5, VMM_KIND_TRANSIENT, S);
  /* The fake's MemAvailable does not shrink with allocations: the same figure admits again. */
  void *q = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S);

  fake_set_host_mem_available(0);
  char r2[96], found2[128];
  snprintf(found2, sizeof found2, "MemAvailable 0 B (0 B) < 2.0 MiB + headroom 10.0 MiB (%zu B required)", 12 * MiB);
  const char *empty[] = {req(r2, 100, 2 * MiB), found2,
                         "arena holds 8.0 MiB live (package 4.0 MiB, transient 4.0 MiB)", NULL};
  s = expect_refusal(a, 100, VMM_KIND_PACKAGE, empty);
  assert_int_equal(s.headroom_refusals, 2);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, q, S), VMM_OK);
  tu_destroy(a);
}

/* ---- Limit ------------------------------------------------------------------------------ */

static void limit_boundary(void **state) {
  (void)state;
  vmm_arena *a = arena_with(NULL, 0, 16 * MiB, 1);
  void *pkg = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
  void *tr = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S);

  /* Exactly the limit: 6 MiB held + 10 MiB = 16 MiB. */
  void *fits = tu_alloc(a, 10 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(tu_snapshot(a).physical_bytes, 16 * MiB);
  assert_int_equal(vmm_arena_free(a, fits, S), VMM_OK);

  /* One byte more rounds to 12 MiB: 18 MiB > 16 MiB. */
  char r[96], numbers[128];
  snprintf(numbers, sizeof numbers, "limit 16.0 MiB < 6.0 MiB held + 12.0 MiB requested (limit %zu B, %zu B required)",
           16 * MiB, 18 * MiB);
  const char *needles[] = {"package 12.0 MiB refused", req(r, 10 * MiB + 1, 12 * MiB), numbers,
                           "arena holds 6.0 MiB live (package 2.0 MiB, transient 4.0 MiB)", NULL};
  size_t from = fake_call_count();
  vmm_snapshot s = expect_refusal(a, 10 * MiB + 1, VMM_KIND_PACKAGE, needles);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.headroom_refusals, 0);
  assert_int_equal(s.limit_bytes, 16 * MiB);
  assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, tr, S), VMM_OK);
  tu_destroy(a);
}

/* A limit one byte under what is needed refuses; the exact figures tell 16 MiB - 1 from 16 MiB
 * where the rounded units cannot. */
static void limit_one_byte_under(void **state) {
  (void)state;
  vmm_arena *a = arena_with(NULL, 0, 16 * MiB - 1, 1);
  void *pkg = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S);
  char r[96], numbers[128];
  snprintf(numbers, sizeof numbers, "(limit %zu B, %zu B required)", 16 * MiB - 1, 16 * MiB);
  const char *needles[] = {"transient 10.0 MiB refused", req(r, 10 * MiB, 10 * MiB), numbers,
                           "arena holds 6.0 MiB live (package 6.0 MiB, transient 0 B)", NULL};
  vmm_snapshot s = expect_refusal(a, 10 * MiB, VMM_KIND_TRANSIENT, needles);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK);
  tu_destroy(a);
}

/* Limit 0 is no limit; a limit applies whatever the device has free. */
static void limit_zero_is_none(void **state) {
  (void)state;
  vmm_arena *a = arena_with(NULL, 0, 0, 1);
  void *p[3];
  for (int i = 0; i < 3; i++) p[i] = tu_alloc(a, 16 * GiB, VMM_KIND_PACKAGE, S);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.limit_bytes, 0);
  assert_int_equal(s.limit_refusals, 0);
  assert_int_equal(s.physical_bytes, 48 * GiB);
  for (int i = 0; i < 3; i++) assert_int_equal(vmm_arena_free(a, p[i], S), VMM_OK);
  tu_destroy(a);

  a = arena_with(NULL, 0, 8 * MiB, 1); /* 80 GiB free on the device */
  char r[96];
  const char *needles[] = {req(r, 10 * MiB, 10 * MiB), "limit 8.0 MiB < 0 B held + 10.0 MiB requested", NULL};
  s = expect_refusal(a, 10 * MiB, VMM_KIND_PACKAGE, needles);
  assert_int_equal(s.limit_refusals, 1);
  tu_destroy(a);
}

/* A limit set on a running arena applies to the next request; what is held past it stays
 * held; 0 lifts it. */
static void limit_set_at_run_time(void **state) {
  (void)state;
  assert_int_equal(vmm_arena_set_limit(NULL, MiB), VMM_ERR_INVALID_ARGUMENT);
  vmm_arena *a = arena_with(NULL, 0, 0, 1);
  void *held = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(vmm_arena_set_limit(a, 8 * MiB), VMM_OK);
  assert_int_equal(tu_snapshot(a).limit_bytes, 8 * MiB);
  char r[96];
  const char *needles[] = {req(r, 4 * MiB, 4 * MiB), "limit 8.0 MiB < 6.0 MiB held + 4.0 MiB requested", NULL};
  vmm_snapshot s = expect_refusal(a, 4 * MiB, VMM_KIND_PACKAGE, needles);
  assert_int_equal(s.limit_refusals, 1);
  void *fits = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S); /* exactly the limit */
  assert_int_equal(vmm_arena_set_limit(a, 4 * MiB), VMM_OK);
  s = tu_snapshot(a);
  assert_int_equal(s.physical_bytes, 8 * MiB); /* past the new limit, and kept */
  assert_int_equal(s.limit_bytes, 4 * MiB);
  assert_int_equal(vmm_arena_free(a, fits, S), VMM_OK);
  assert_int_equal(vmm_arena_set_limit(a, 0), VMM_OK);
  void *big = tu_alloc(a, 16 * GiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(tu_snapshot(a).limit_refusals, 1);
  assert_int_equal(vmm_arena_free(a, big, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, held, S), VMM_OK);
  tu_destroy(a);
}

/* The device's memory as the driver reports it; a failed read says so and writes nothing. */
static void device_memory_read_and_unreadable(void **state) {
  (void)state;
  size_t free_b = 1, total_b = 2;
  assert_int_equal(vmm_arena_device_memory(NULL, &free_b, &total_b), VMM_ERR_INVALID_ARGUMENT);
  vmm_arena *a = arena_with(NULL, 0, 0, 1);
  void *p = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(vmm_arena_device_memory(a, &free_b, &total_b), VMM_OK);
  assert_int_equal(total_b, 80 * GiB);
  assert_int_equal(free_b, 80 * GiB - 6 * MiB);
  assert_int_equal(vmm_arena_device_memory(a, NULL, NULL), VMM_OK);
  vmm_snapshot before = tu_snapshot(a);
  fake_fail_nth(VMM_DRV_mem_get_info, 1, CUDA_ERROR_UNKNOWN, 0);
  free_b = 1, total_b = 2;
  assert_int_equal(vmm_arena_device_memory(a, &free_b, &total_b), VMM_ERR_DRIVER);
  assert_int_equal(free_b, 1);
  assert_int_equal(total_b, 2);
  assert_contains(vmm_arena_last_error(a),
                  "device_memory: reading the device's free and total memory: cuMemGetInfo returned "
                  "CUDA_ERROR_UNKNOWN (999)");
  vmm_snapshot after = tu_snapshot(a);
  assert_same_holdings(&before, &after);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* Retained and pooled memory counts toward the limit, and the message says where it is.
 * Without package assembly a package request creates all its bytes; with it, the idle
 * handles cover part of the request and only the rest counts against the limit. */
static void limit_counts_retained_and_pooled(void **state) {
  (void)state;
  for (int assembly = 0; assembly < 2; assembly++) {
    vmm_arena *a = arena_with(NULL, 0, 12 * MiB, assembly);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *pkg = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S);
    void *tr = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
    assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK); /* retained until finish */
    assert_int_equal(vmm_arena_free(a, tr, S), VMM_OK);  /* pooled */
    const char *holds = "arena holds 0 B live (package 0 B, transient 0 B), 2.0 MiB pooled, 4.0 MiB idle";
    char r[96];
    vmm_snapshot s;
    if (!assembly) {
      const char *needles[] = {req(r, 8 * MiB, 8 * MiB), "limit 12.0 MiB < 6.0 MiB held + 8.0 MiB requested", holds,
                               NULL};
      s = expect_refusal(a, 8 * MiB, VMM_KIND_PACKAGE, needles);
      assert_int_equal(s.limit_refusals, 1);
      assert_int_equal(s.pool_fallbacks, 0);
      assert_int_equal(s.assemblies, 0);
    } else {
      /* 16 MiB: the 6 MiB idle cover part of it, the 10 MiB left are refused; the idle
       * handles stay where they were. */
      const char *needles[] = {req(r, 16 * MiB, 16 * MiB),
                               "limit 12.0 MiB < 6.0 MiB held + 10.0 MiB requested (6.0 MiB of the request from idle "
                               "handles)",
                               holds, NULL};
      s = expect_refusal(a, 16 * MiB, VMM_KIND_PACKAGE, needles);
      assert_int_equal(s.limit_refusals, 1);
      assert_int_equal(s.assemblies, 0);
      /* 8 MiB: the package's two idle 2 MiB handles (made in the scope, cut to the bound), the
       * pooled 2 MiB taken apart, 2 MiB created: 8 MiB held. */
      size_t from = fake_call_count();
      void *p = tu_alloc(a, 8 * MiB, VMM_KIND_PACKAGE, S);
      assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
      s = tu_snapshot(a);
      assert_int_equal(s.physical_bytes, 8 * MiB);
      assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, 8 * MiB);
      assert_int_equal(s.assemblies, 1);
      assert_int_equal(s.assembled_idle_handles, 3);
      assert_int_equal(s.assembly_created_bytes, 2 * MiB);
      assert_int_equal(s.pooled_taken_apart, 1);
      assert_int_equal(s.retained_reusable_handles, 0);
      assert_int_equal(s.limit_refusals, 1);
      assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
    }
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    void *p = tu_alloc(a, 8 * MiB, VMM_KIND_PACKAGE, S); /* fits once finish released what the scope held */
    assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- Driver out of memory ------------------------------------------------------------- */

static void driver_out_of_memory(void **state) {
  (void)state;
  fake_options opts = {.capacity = 8 * MiB};
  vmm_arena *a = arena_with(&opts, 0, 0, 1);
  void *p = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S);
  char r[96];
  const char *needles[] = {"transient 4.0 MiB refused", req(r, 4 * MiB, 4 * MiB),
                           "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY; device free 2.0 MiB of 8.0 MiB",
                           "arena holds 6.0 MiB live (package 6.0 MiB, transient 0 B)", NULL};
  vmm_snapshot s = expect_refusal(a, 4 * MiB, VMM_KIND_TRANSIENT, needles);
  assert_int_equal(s.oom_refusals, 1);
  assert_int_equal(s.limit_refusals + s.headroom_refusals, 0);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* New memory is refused for the part of an assembly that idle handles do not cover, by
 * cuMemCreate (one handle to create) or by the device's free memory read before creating
 * several: either refusal says what the arena holds, the idle handle the assembly had chosen
 * included. */
static void driver_out_of_memory_during_an_assembly(void **state) {
  (void)state;
  for (int several = 0; several < 2; several++) {
    fake_options opts = {.capacity = 8 * MiB};
    vmm_arena *a = arena_with(&opts, 0, 0, 1);
    size_t idle_bytes = several ? 4 * MiB : 6 * MiB; /* 4 or 2 MiB left: two handles or one */
    void *idle = tu_alloc(a, idle_bytes, VMM_KIND_PACKAGE, S); /* one handle, idle once freed in the scope */
    void *live = tu_alloc(a, 8 * MiB - idle_bytes, VMM_KIND_PACKAGE, S);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    assert_int_equal(vmm_arena_free(a, idle, S), VMM_OK);
    char r[96], holds[160];
    snprintf(holds, sizeof holds, "arena holds %s live (package %s, transient 0 B), 0 B pooled, %s idle",
             several ? "4.0 MiB" : "2.0 MiB", several ? "4.0 MiB" : "2.0 MiB", several ? "4.0 MiB" : "6.0 MiB");
    const char *needles[] = {"transient 8.0 MiB refused", req(r, 8 * MiB, 8 * MiB),
                             several ? "device free 0 B of 8.0 MiB < 4.0 MiB of new memory in 2 handles"
                                     : "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY; device free 0 B of 8.0 MiB",
                             holds, NULL};
    size_t from = fake_call_count();
    vmm_snapshot s = expect_refusal(a, 8 * MiB, VMM_KIND_TRANSIENT, needles);
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), several ? 0 : 1);
    assert_int_equal(s.oom_refusals, 1);
    assert_int_equal(s.retained_reusable_bytes, idle_bytes);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    assert_int_equal(vmm_arena_free(a, live, S), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- The pool fallback inside a retention scope --------------------------------------- */

/* A transient refusal inside the scope hands out a pooled mapping that fits (whatever the reuse
 * policy would pick) instead of failing; package requests never draw from the pool. The
 * pooled mapping is one 8 MiB handle created before the scope, so no assembly can use it for
 * 4 MiB (an idle handle larger than what is left is never used to pad a request). */
static void refusal_falls_back_to_pool(void **state) {
  (void)state;
  for (int by_headroom = 0; by_headroom < 2; by_headroom++) {
    /* 14 MiB held after the setup; the 4 MiB request is refused by the limit (16 MiB) or
     * by the headroom (20 MiB device, 4 MiB headroom: free 6 MiB < 8 MiB). */
    fake_options opts = {.capacity = 20 * MiB};
    vmm_arena *a = by_headroom ? arena_with(&opts, 4 * MiB, 0, 1) : arena_with(NULL, 0, 16 * MiB, 1);
    void *big = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    assert_int_equal(vmm_arena_free(a, big, S), VMM_OK);
    void *pkg = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S);

    /* A package request is refused: the pooled transient mapping is not for it. */
    const char *package[] = {"package 4.0 MiB refused", by_headroom ? "headroom 4.0 MiB" : "limit 16.0 MiB", NULL};
    vmm_snapshot s = expect_refusal(a, 4 * MiB, VMM_KIND_PACKAGE, package);
    assert_int_equal(s.pool_fallbacks, 0);

    fake_ledger before, after;
    fake_get_ledger(&before);
    size_t from = fake_call_count();
    void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S);
    assert_ptr_equal(p, big); /* exact policy missed; the fallback took the 8 MiB mapping whole */
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
    fake_get_ledger(&after);
    assert_int_equal(after.live_handles, before.live_handles);
    assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p), 8 * MiB);
    const char *fatal = NULL;
    assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
    s = tu_snapshot(a);
    assert_int_equal(s.pool_misses, 1); /* this one: the 8 MiB request came before the scope */
    assert_int_equal(s.pool_fallbacks, 1);
    assert_int_equal(s.assemblies + s.padded_assemblies, 0);
    assert_int_equal(s.pool_hits, 0);
    assert_int_equal(by_headroom ? s.headroom_refusals : s.limit_refusals, 2);
    assert_int_equal(s.retained_reusable_handles, 0);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 8 * MiB);
    assert_int_equal(s.physical_bytes, 14 * MiB);
    tu_check(a);
    assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
    assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

/* Two idle 2 MiB mappings were freed on a stream that is capturing: an assembly cannot wait
 * for it, so they cannot be taken apart, and nothing in the pool fits 4 MiB: the refusal
 * keeps its numbers and adds what the store held. Once the capture is over, the same request
 * is assembled from the two handles with no new memory and no refusal. */
static void fallback_finds_nothing_then_assembles(void **state) {
  (void)state;
  const CUstream S2 = TU_STREAM(2);
  vmm_arena *a = arena_with(NULL, 0, 8 * MiB, 1);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *x = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S2);
  void *y = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S2);
  void *pkg = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S);
  fake_set_capturing(S2, 1);
  assert_int_equal(vmm_arena_free(a, x, S2), VMM_OK);
  assert_int_equal(vmm_arena_free(a, y, S2), VMM_OK);
  char r[96];
  const char *needles[] = {req(r, 4 * MiB, 4 * MiB), "limit 8.0 MiB < 8.0 MiB held + 4.0 MiB requested",
                           "no pooled mapping fits (pool 2 mappings, 4.0 MiB; 0 idle handles, 0 B)", NULL};
  size_t from = fake_call_count();
  vmm_snapshot s = expect_refusal(a, 4 * MiB, VMM_KIND_TRANSIENT, needles);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0); /* never waits on a capture */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.pool_fallbacks + s.assemblies + s.padded_assemblies + s.pooled_taken_apart, 0);
  assert_int_equal(s.retained_reusable_handles, 2);

  fake_set_capturing(S2, 0);
  from = fake_call_count();
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 1); /* S2, once for both */
  s = tu_snapshot(a);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.pooled_taken_apart, 2);
  assert_int_equal(s.assembled_idle_handles, 2);
  assert_int_equal(s.assembly_created_bytes, 0);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.physical_bytes, 8 * MiB);
  assert_int_equal(s.retained_reusable_handles, 0);
  assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p), 2 * MiB);
  assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p + 2 * MiB), 2 * MiB);
  tu_check(a);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK);
  tu_destroy(a);
}

/* ---- Failures to read the figure ------------------------------------------------------ */

static void host_memory_unreadable(void **state) {
  (void)state;
  fake_options opts = {.integrated = 1};
  vmm_arena *a = arena_with(&opts, 1 * MiB, 0, 1);
  vmm_snapshot before = tu_snapshot(a);
  fake_fail_nth(VMM_DRV_host_memory_available, 1, CUDA_ERROR_NOT_SUPPORTED, 0);
  void *p = (void *)0x1;
  vmm_status st = vmm_arena_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S, &p);
  assert_int_equal(st, VMM_ERR_DRIVER);
  assert_null(p);
  const char *msg = vmm_arena_last_error(a);
  assert_contains(msg, "reading host MemAvailable for the headroom check");
  assert_contains(msg, "host_memory_available returned CUDA_ERROR_NOT_SUPPORTED (801)");
  assert_contains(msg, "arena holds 0 B live");
  vmm_snapshot after = tu_snapshot(a);
  assert_same_holdings(&before, &after);
  assert_int_equal(after.headroom_refusals, 0);
  assert_int_equal(after.driver[VMM_DRV_host_memory_available].failures, 1);
  /* Once the figure reads again, allocations go through. */
  p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

static void device_free_memory_unreadable(void **state) {
  (void)state;
  vmm_arena *a = arena_with(NULL, 1 * MiB, 0, 1);
  vmm_snapshot before = tu_snapshot(a);
  fake_fail_nth(VMM_DRV_mem_get_info, 1, CUDA_ERROR_UNKNOWN, 0);
  void *p = (void *)0x1;
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S, &p), VMM_ERR_DRIVER);
  assert_null(p);
  const char *msg = vmm_arena_last_error(a);
  assert_contains(msg, "reading device free memory for the headroom check");
  assert_contains(msg, "cuMemGetInfo returned CUDA_ERROR_UNKNOWN (999)");
  vmm_snapshot after = tu_snapshot(a);
  assert_same_holdings(&before, &after);
  assert_int_equal(after.headroom_refusals, 0);
  p = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(headroom_discrete_boundary),
      cmocka_unit_test(headroom_overflow),
      cmocka_unit_test(headroom_zero_reads_nothing),
      cmocka_unit_test(headroom_integrated_boundary),
      cmocka_unit_test(limit_boundary),
      cmocka_unit_test(limit_one_byte_under),
      cmocka_unit_test(limit_zero_is_none),
      cmocka_unit_test(limit_set_at_run_time),
      cmocka_unit_test(device_memory_read_and_unreadable),
      cmocka_unit_test(limit_counts_retained_and_pooled),
      cmocka_unit_test(driver_out_of_memory),
      cmocka_unit_test(driver_out_of_memory_during_an_assembly),
      cmocka_unit_test(refusal_falls_back_to_pool),
      cmocka_unit_test(fallback_finds_nothing_then_assembles),
      cmocka_unit_test(host_memory_unreadable),
      cmocka_unit_test(device_free_memory_unreadable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
