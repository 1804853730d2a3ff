/* Whole-process mode's stream semantics, as PyTorch's own allocator promises: memory
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

/* (6) Two captures at once, each stream its own (no fork joins them): memory S2 freed into the
 * pool during its capture is not given to S1's (no path of S1's graph leads to S2's work), and
 * nothing is recorded on, waited from or synchronized on a capturing stream. Streams of one
 * capture that join: below. */
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

/* ---- (6) Inside a capture: reuse after the streams join ---------------------------------
 * PyTorch's test of graph_capture_record_stream_reuse: S1 captures and forks to side streams
 * (the program's wait_stream), each reads data1 (record_stream); data1 is freed on S1. A
 * request on S1 before every side stream joined back must not get data1's memory; after the
 * joins it must, with nothing recorded, waited for or synchronized. Each allocation's kernels
 * go on the fake's capture graph, which flags a captured kernel not ordered after another
 * owner's kernel on the same bytes. */

#define POOL 3
#define SIDE(i) TU_STREAM(10 + (i))
#define WHOLE (4 * MiB)
#define SLOT 32 /* a sub-granule request: a slot of a page (torch.empty(8)) */

typedef struct captured {
  void *p;
  uint64_t owner;
  size_t bytes;
} captured;

static captured cap_alloc(vmm_arena *a, size_t bytes, CUstream s) {
  captured c = {NULL, fake_owner_new(), bytes};
  assert_int_equal(vmm_arena_alloc_in(a, bytes, T, s, POOL, &c.p), VMM_OK);
  return c;
}

static void cap_kernel(const captured *c, CUstream s) {
  assert_int_equal(fake_kernel(s, (CUdeviceptr)(uintptr_t)c->p, c->bytes, c->owner), 0);
}

static void cap_free(vmm_arena *a, const captured *c, CUstream s) { assert_int_equal(vmm_arena_free(a, c->p, s), VMM_OK); }

/* An arena of whole-process mode on the fake driver `drv` (no release guard). */
static vmm_arena *arena_on(const struct vmm_driver *drv) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = VMM_RETAIN_AUTO;
  c.handle_bound_bytes = 64 * MiB;
  c.driver = drv;
  vmm_arena *a = NULL;
  assert_int_equal(vmm_arena_create(&c, &a), VMM_OK);
  fake_set_event_lag(LAG);
  fake_advance_clock(1);
  return a;
}

/* What one scenario asks: `sides` side streams (1 or 3), allocations of `bytes`; `joins`:
 * whether the request after the joins must get data1's memory (false: the fallback cases). */
typedef struct join_case {
  uint32_t sides;
  size_t bytes;
  bool joins;
  uint32_t crowd; /* > 0: side stream 0 also waits on this many other forked streams before the free */
  uint32_t chain; /* kernels on S1 between the joins and the request (a long walk back) */
} join_case;

/* S1 forks to the side streams, each reads data1 (record_stream), and it is freed on S1. */
static captured fork_and_free(vmm_arena *a, const join_case *k, captured *side_bufs) {
  captured data1 = cap_alloc(a, k->bytes, S1);
  cap_kernel(&data1, S1);
  for (uint32_t i = 0; i < k->sides; i++) {
    fake_program_wait(SIDE(i), S1); /* s.wait_stream(s1): the side stream joins the capture */
    side_bufs[i] = cap_alloc(a, k->bytes, SIDE(i));
    cap_kernel(&data1, SIDE(i)); /* add(data1, 2.0, out=buf) */
    cap_kernel(&side_bufs[i], SIDE(i));
    assert_int_equal(vmm_arena_record_stream(a, data1.p, SIDE(i)), VMM_OK);
  }
  for (uint32_t i = 0; i < k->crowd; i++) { /* side stream 0's dependencies grow past the markers' bound */
    fake_program_wait(SIDE(8 + i), S1);
    assert_int_equal(fake_kernel(SIDE(8 + i), 0, 0, 0), 0);
    fake_program_wait(SIDE(0), SIDE(8 + i));
  }
  assert_int_equal(vmm_arena_free(a, data1.p, S1), VMM_OK);
  return data1;
}

static void run_join_case(vmm_arena *a, const join_case *k) {
  assert_int_equal(vmm_arena_capture_begin(a, POOL), VMM_OK);
  fake_set_capturing(S1, 1);
  captured sink = cap_alloc(a, k->bytes, S1), side_bufs[3], after[3];
  size_t from = fake_call_count();
  captured data1 = fork_and_free(a, k, side_bufs);
  captured before = cap_alloc(a, k->bytes, S1); /* before the joins: not data1's memory */
  assert_ptr_not_equal(before.p, data1.p);
  cap_kernel(&before, S1);
  for (uint32_t i = 0; i < k->sides; i++) {
    fake_program_wait(S1, SIDE(i)); /* s1.wait_stream(s): joined back */
    if (i + 1 == k->sides) break;
    after[i] = cap_alloc(a, k->bytes, S1); /* not every side stream joined yet */
    assert_ptr_not_equal(after[i].p, data1.p);
    cap_kernel(&after[i], S1);
  }
  cap_kernel(&sink, S1); /* sink1.fill_(1.0) */
  for (uint32_t i = 0; i < k->chain; i++) cap_kernel(&sink, S1);
  captured data3 = cap_alloc(a, k->bytes, S1);
  if (k->joins) assert_ptr_equal(data3.p, data1.p);
  else assert_ptr_not_equal(data3.p, data1.p);
  cap_kernel(&data3, S1);
  assert_no_wait_since(from);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 0);
  for (uint32_t i = 0; i < k->sides; i++) cap_free(a, &side_bufs[i], SIDE(i));
  for (uint32_t i = 0; i + 1 < k->sides; i++) cap_free(a, &after[i], S1);
  cap_free(a, &before, S1), cap_free(a, &data3, S1), cap_free(a, &sink, S1);
  fake_set_capturing(S1, 0); /* the capture ends, for the side streams too */
  assert_int_equal(vmm_arena_capture_end(a, POOL), VMM_OK);
  fake_graph_launch(fake_graph_last(), S1);
  assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
  destroy(a);
}

static void a_slot_is_reused_after_its_side_stream_joins(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){1, SLOT, true, 0, 0});
}

static void a_mapping_is_reused_after_its_side_stream_joins(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){1, WHOLE, true, 0, 0});
}

static void a_slot_is_reused_only_after_three_side_streams_join(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){3, SLOT, true, 0, 0});
}

static void a_mapping_is_reused_only_after_three_side_streams_join(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){3, WHOLE, true, 0, 0});
}

/* A driver without cuStreamGetCaptureInfo and cuGraphNodeGetDependencies: no reuse inside the
 * capture (and no error); after it ends and its work is done, the memory serves the pool again. */
static void without_the_graph_queries_reuse_waits_for_the_capture_end(void **state) {
  (void)state;
  for (int whole = 0; whole < 2; whole++) {
    run_join_case(arena_on(fake_driver_without_capture_graph()), &(join_case){1, whole ? WHOLE : SLOT, false, 0, 0});
    vmm_arena *a = arena_on(fake_driver_without_capture_graph());
    assert_int_equal(vmm_arena_capture_begin(a, POOL), VMM_OK);
    fake_set_capturing(S1, 1);
    captured side[3], keep = cap_alloc(a, whole ? WHOLE : SLOT, S1);
    captured data1 = fork_and_free(a, &(join_case){1, whole ? WHOLE : SLOT, false, 0, 0}, side);
    fake_program_wait(S1, SIDE(0));
    cap_free(a, &side[0], SIDE(0));
    fake_set_capturing(S1, 0);
    assert_int_equal(vmm_arena_capture_end(a, POOL), VMM_OK);
    captured probe = cap_alloc(a, whole ? WHOLE : SLOT, S1); /* asks: an event or fence recorded */
    fake_advance_clock(LAG);
    captured again = cap_alloc(a, whole ? WHOLE : SLOT, S1), third = cap_alloc(a, whole ? WHOLE : SLOT, S1);
    assert_ptr_not_equal(probe.p, data1.p); /* asked before the work of the side stream was done */
    assert_true(again.p == data1.p || third.p == data1.p);
    cap_free(a, &probe, S1), cap_free(a, &again, S1), cap_free(a, &third, S1), cap_free(a, &keep, S1);
    assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
    destroy(a);
  }
}

/* A failing query answers "not yet": no reuse inside the capture, no error. */
static void a_failing_graph_query_answers_not_yet(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0);
  fake_fail_nth(VMM_DRV_graph_node_get_dependencies, 1, CUDA_ERROR_UNKNOWN, 1);
  run_join_case(a, &(join_case){1, SLOT, false, 0, 0});
  a = arena_with(0, 0);
  fake_fail_nth(VMM_DRV_graph_node_get_dependencies, 1, CUDA_ERROR_UNKNOWN, 1);
  run_join_case(a, &(join_case){1, WHOLE, false, 0, 1}); /* one node back: its read fails */
  a = arena_with(0, 0);
  fake_fail_nth(VMM_DRV_stream_get_capture_info, 1, CUDA_ERROR_UNKNOWN, 1);
  run_join_case(a, &(join_case){1, SLOT, false, 0, 0});
}

/* More markers than a free keeps (a side stream whose dependencies are many nodes): reuse
 * waits for the capture's end. */
static void markers_past_their_bound_wait_for_the_capture_end(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){1, SLOT, true, VMM_JOIN_MARKERS - 2, 0}); /* fits */
  run_join_case(arena_with(0, 0), &(join_case){1, SLOT, false, VMM_JOIN_MARKERS, 0});
  run_join_case(arena_with(0, 0), &(join_case){1, WHOLE, false, VMM_JOIN_MARKERS, 0});
}

/* A walk back past its bound answers "not yet"; within it, the join is found. */
static void a_walk_past_its_bound_answers_not_yet(void **state) {
  (void)state;
  run_join_case(arena_with(0, 0), &(join_case){1, WHOLE, true, 0, 200});
  run_join_case(arena_with(0, 0), &(join_case){1, WHOLE, false, 0, 300});
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
      cmocka_unit_test(a_slot_is_reused_after_its_side_stream_joins),
      cmocka_unit_test(a_mapping_is_reused_after_its_side_stream_joins),
      cmocka_unit_test(a_slot_is_reused_only_after_three_side_streams_join),
      cmocka_unit_test(a_mapping_is_reused_only_after_three_side_streams_join),
      cmocka_unit_test(without_the_graph_queries_reuse_waits_for_the_capture_end),
      cmocka_unit_test(a_failing_graph_query_answers_not_yet),
      cmocka_unit_test(markers_past_their_bound_wait_for_the_capture_end),
      cmocka_unit_test(a_walk_past_its_bound_answers_not_yet),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
