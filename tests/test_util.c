#include "test_util.h"

#include <stdio.h>

vmm_config tu_config(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  cfg.retain = VMM_RETAIN_ON;
  cfg.log_level = 0;
  cfg.reserve_bytes = 64 * GiB;
  cfg.grow_in_place = 0;       /* ranges packed and never grown, unless a test asks */
  cfg.unmap_in_background = 0; /* every driver call on the test's thread, in one order */
  return cfg;
}

vmm_arena *tu_arena(const fake_options *opts, const vmm_config *cfg) {
  fake_driver_reset(opts);
  vmm_config c = cfg ? *cfg : tu_config();
  c.driver = fake_driver();
  vmm_arena *a = NULL;
  vmm_status s = vmm_arena_create(&c, &a);
  if (s != VMM_OK) fprintf(stderr, "vmm_arena_create: %s: %s\n", vmm_status_name(s), vmm_create_error());
  assert_int_equal(s, VMM_OK);
  assert_non_null(a);
  return a;
}

void tu_check(vmm_arena *a) {
  char why[256] = "";
  int rc = vmm_arena_check(a, why, sizeof why);
  if (rc) fprintf(stderr, "vmm_arena_check: %s\n", why);
  assert_int_equal(rc, 0);
}

void tu_destroy(vmm_arena *a) {
  tu_check(a);
  vmm_arena_destroy(a);
  assert_true(fake_ledger_clean());
}

void *tu_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc(a, bytes, kind, s, &p);
  if (st != VMM_OK) fprintf(stderr, "alloc %zu: %s: %s\n", bytes, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
  assert_non_null(p);
  return p;
}

vmm_snapshot tu_snapshot(vmm_arena *a) {
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  return s;
}

size_t tu_mapped_from(const void *base, size_t most) {
  size_t off = 0, size;
  while (off < most && (size = fake_mapped_size_at((CUdeviceptr)(uintptr_t)base + off)) != 0) off += size;
  return off;
}

void tu_free(vmm_arena *a, void *p, CUstream s) {
  vmm_status st = vmm_arena_free(a, p, s);
  if (st != VMM_OK) fprintf(stderr, "free %p: %s: %s\n", p, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
}

size_t tu_first_call(size_t from, vmm_driver_entry e) {
  for (size_t i = from, end = fake_call_count(); i < end; i++)
    if (fake_call_at(i)->entry == e) return i;
  return SIZE_MAX;
}

void tu_assert_event_orders(size_t from, CUstream recorded_on, CUstream waiting) {
  size_t record = tu_first_call(from, VMM_DRV_event_record);
  if (record == SIZE_MAX) fail_msg("no event recorded since call %zu", from);
  const fake_call *r = fake_call_at(record);
  if (r->a1 != (uintptr_t)recorded_on)
    fail_msg("the first event was recorded on stream 0x%lx, not 0x%lx", (unsigned long)r->a1,
             (unsigned long)(uintptr_t)recorded_on);
  for (size_t i = record + 1, end = fake_call_count(); i < end; i++) {
    const fake_call *w = fake_call_at(i);
    if (w->entry == VMM_DRV_stream_wait_event && w->a0 == (uintptr_t)waiting && w->a1 == r->a0) return;
  }
  fail_msg("stream 0x%lx never waited for the event recorded on 0x%lx", (unsigned long)(uintptr_t)waiting,
           (unsigned long)(uintptr_t)recorded_on);
}
