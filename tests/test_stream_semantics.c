/* Whole-process mode's stream semantics, as PyTorch's own allocator promises (issue #41): memory
 * freed on another stream, or used there (record_stream), serves a request only once the
 * free's events are known complete (cuEventQuery), and no stream is made to wait for work the
 * program did not order itself; ordering by event is the setting VMMARENA_STREAM_ORDER=event and
 * the last resort, inside a scope before new memory and before a refusal. The device is kept
 * behind the host (fake_set_event_lag) so that a free's work is pending until the clock moves;
 * the fake's timeline judges every reuse. */
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define T VMM_KIND_TRANSIENT
#define LAG 10 /* operations the device runs behind the host */

static vmm_arena *arena_with(size_t limit, int order_by_event) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = VMM_RETAIN_AUTO;
  c.handle_bound_bytes = 64 * MiB; /* one handle per request: no run or prefix of a larger one */
  c.limit_bytes = limit;
  c.order_by_event = order_by_event;
  vmm_arena *a = tu_arena(NULL, &c);
  fake_set_event_lag(LAG);
  fake_advance_clock(1); /* work from now on is behind */
  return a;
}

/* No driver call since `from` made a stream wait or the host wait. */
static void assert_no_wait_since(size_t from) {
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
}

/* Since `from`, `waiting` waited for an event last recorded on `freeing` (after the free). */
static void assert_ordered_by_event(size_t from, CUstream freeing, CUstream waiting) {
  for (size_t k = from; k < fake_call_count(); k++) {
    const fake_call *w = fake_call_at(k);
    if (w->entry != VMM_DRV_stream_wait_event || w->a0 != (uintptr_t)waiting || w->result != CUDA_SUCCESS) continue;
    for (size_t j = k; j-- > from;) {
      const fake_call *r = fake_call_at(j);
      if (r->entry != VMM_DRV_event_record || r->a0 != w->a1) continue;
      if (r->a1 == (uintptr_t)freeing) return;
      break;
    }
  }
  fail_msg("stream %p never waited for an event recorded on %p", (void *)waiting, (void *)freeing);
}

static void destroy(vmm_arena *a) {
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  tu_destroy(a);
}

/* (1) Freed on S1, its work pending: S2 gets other memory, and S2 is made to wait for nothing. */
static void a_pending_free_elsewhere_is_not_handed_out(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_not_equal(q, p);
  assert_no_wait_since(from);
  assert_true(fake_calls_since(from, VMM_DRV_event_query) >= 1); /* asked, not waited for */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
  tu_free(a, q, S2);
  destroy(a);
}

/* (2) Once the device has done the free's work, S2 reuses it: no wait, no synchronize. */
static void a_completed_free_elsewhere_is_reused_without_a_wait(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 8 * MiB, T, S2); /* another size: asks about S1's free (a fence recorded) */
  fake_advance_clock(LAG);                /* the device caught up */
  void *r = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(r, p);
  assert_no_wait_since(from);
  tu_free(a, q, S2);
  tu_free(a, r, S2);
  destroy(a);
}

/* (3) A mapping S2 used (record_stream), freed on S1: not even S1 reuses it while S2's work is
 * pending, and S1 waits for nothing; once that work is done S1 reuses it. */
static void record_stream_uses_must_complete(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  assert_int_equal(vmm_arena_record_stream(a, p, S2), VMM_OK);
  tu_use(p, S2);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S1);
  assert_ptr_not_equal(q, p);
  fake_advance_clock(LAG);
  void *r = tu_alloc(a, 4 * MiB, T, S1);
  assert_ptr_equal(r, p);
  assert_no_wait_since(from);
  tu_free(a, q, S1);
  tu_free(a, r, S1);
  destroy(a);
}

/* (3) The same for a slot of a page. */
static void record_stream_uses_of_a_slot_must_complete(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  char *x = tu_alloc(a, 512, T, S1);
  char *keep = tu_alloc(a, 512, T, S1);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  tu_use(x, S2);
  size_t from = fake_call_count();
  tu_free(a, x, S1);
  char *y = tu_alloc(a, 512, T, S1);
  assert_ptr_not_equal(y, x);
  fake_advance_clock(LAG);
  char *z = tu_alloc(a, 512, T, S1);
  assert_ptr_equal(z, x);
  assert_no_wait_since(from);
  tu_free(a, y, S1);
  tu_free(a, z, S1);
  tu_free(a, keep, S1);
  destroy(a);
}

/* (4) Inside a scope, with nothing else to give, the pending free serves S2 ordered by an event
 * (S2 waits for it on the device) instead of new memory. */
static void in_a_scope_an_event_orders_before_new_memory(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(q, p);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_ordered_by_event(from, S1, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  tu_free(a, q, S2);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  destroy(a);
}

/* (4) Inside a scope, memory whose free is known complete serves before an event orders any. */
static void in_a_scope_complete_memory_comes_before_an_event(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, T, S1), *done = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, done, S1);
  fake_advance_clock(LAG);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* done's free known complete */
  fake_advance_clock(1);                          /* work from now on is behind again */
  tu_free(a, p, S1);                              /* p's pending */
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(q, done);
  assert_no_wait_since(from);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  tu_free(a, q, S2);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  destroy(a);
}

/* (4) Before a refusal (the limit reached) the pending free serves S2 ordered by an event; the
 * cache is not released and the host waits for nothing. */
static void before_a_refusal_an_event_orders(void **state) {
  (void)state;
  vmm_arena *a = arena_with(4 * MiB, 0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(q, p);
  assert_ordered_by_event(from, S1, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  tu_free(a, q, S2);
  destroy(a);
}

/* (4) The same for a slot that waits for another stream's use. */
static void before_a_refusal_a_waiting_slot_is_ordered(void **state) {
  (void)state;
  vmm_arena *a = arena_with(2 * MiB, 0); /* one page */
  char *x = tu_alloc(a, 512 * 1024, T, S1), *rest[3];
  for (int i = 0; i < 3; i++) rest[i] = tu_alloc(a, 512 * 1024, T, S1);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  tu_use(x, S2);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  char *y = tu_alloc(a, 512 * 1024, T, S1);
  assert_ptr_equal(y, x);
  size_t wait = tu_first_call(from, VMM_DRV_stream_wait_event);
  assert_true(wait != SIZE_MAX);
  assert_int_equal(fake_call_at(wait)->a0, (uintptr_t)S1);
  tu_free(a, y, S1);
  for (int i = 0; i < 3; i++) tu_free(a, rest[i], S1);
  destroy(a);
}

/* (5) VMMARENA_STREAM_ORDER=event: the pending free serves S2 at once, S2 ordered by an event. */
static void the_setting_orders_by_event(void **state) {
  (void)state;
  vmm_config c;
  vmm_config_init(&c);
  assert_int_equal(c.order_by_event, 0);
  assert_int_equal(vmm_config_set(&c, "VMMARENA_STREAM_ORDER", "event"), VMM_OK);
  assert_int_equal(c.order_by_event, 1);
  assert_int_equal(vmm_config_set(&c, "stream_order", "completed"), VMM_OK);
  assert_int_equal(c.order_by_event, 0);
  assert_int_equal(vmm_config_set(&c, "VMMARENA_STREAM_ORDER", "later"), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(c.order_by_event, 0);
  vmm_arena *a = arena_with(0, 1);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(q, p);
  assert_ordered_by_event(from, S1, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  tu_free(a, q, S2);
  destroy(a);
}

/* (6) Inside a capture: memory a side stream freed into the graph's pool is not given to the
 * capturing stream (the join cannot be seen: see docs), and nothing is recorded on, waited from
 * or synchronized on a capturing stream; once the capture is over and its work done, it is. */
static void a_capture_reuses_a_side_streams_free_only_once_done(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  assert_int_equal(vmm_arena_capture_begin(a, 3), VMM_OK);
  fake_set_capturing(S1, 1);
  fake_set_capturing(S2, 1);
  void *side = NULL, *main = NULL;
  assert_int_equal(vmm_arena_alloc_in(a, 4 * MiB, T, S2, 3, &side), VMM_OK);
  assert_int_equal(vmm_arena_free(a, side, S2), VMM_OK);
  fake_program_wait(S1, S2); /* the join */
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_alloc_in(a, 4 * MiB, T, S1, 3, &main), VMM_OK);
  assert_ptr_not_equal(main, side);
  assert_no_wait_since(from);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 0);
  assert_int_equal(vmm_arena_free(a, main, S1), VMM_OK);
  fake_set_capturing(S1, 0);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 3), VMM_OK);
  assert_int_equal(vmm_arena_release_pool(a, 3), VMM_OK);
  destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_pending_free_elsewhere_is_not_handed_out),
      cmocka_unit_test(a_completed_free_elsewhere_is_reused_without_a_wait),
      cmocka_unit_test(record_stream_uses_must_complete),
      cmocka_unit_test(record_stream_uses_of_a_slot_must_complete),
      cmocka_unit_test(in_a_scope_an_event_orders_before_new_memory),
      cmocka_unit_test(in_a_scope_complete_memory_comes_before_an_event),
      cmocka_unit_test(before_a_refusal_an_event_orders),
      cmocka_unit_test(before_a_refusal_a_waiting_slot_is_ordered),
      cmocka_unit_test(the_setting_orders_by_event),
      cmocka_unit_test(a_capture_reuses_a_side_streams_free_only_once_done),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
