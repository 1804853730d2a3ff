/* The program's own stream order (vmm_arena_stream_mark, vmm_arena_stream_waited): memory freed
 * on one stream serves another that the program made wait for it, at once and with no event of
 * the arena's, while the free's work is still pending on the device; a mark taken before the
 * free, a wait by another stream, or a record_stream use the wait did not cover orders nothing.
 * The device is kept behind the host, and the fake's timeline judges every reuse (a credit the
 * program did not give would be a reuse violation). */
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define S3 TU_STREAM(3)
#define T VMM_KIND_TRANSIENT
#define LAG 10 /* operations the device runs behind the host */

static vmm_arena *arena_with(int order_by_event) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = VMM_RETAIN_AUTO;
  c.handle_bound_bytes = 64 * MiB; /* one handle per request */
  c.order_by_event = order_by_event;
  vmm_arena *a = tu_arena(NULL, &c);
  fake_set_event_lag(LAG);
  fake_advance_clock(1);
  return a;
}

static uint64_t mark_of(vmm_arena *a, CUstream s) {
  uint64_t mark = UINT64_MAX;
  assert_int_equal(vmm_arena_stream_mark(a, s, &mark), VMM_OK);
  assert_true(mark != UINT64_MAX);
  return mark;
}

/* What wait_stream does: an event recorded on `source` (its mark taken just before), waited for
 * by `waiter`, then told to the arena. */
static void program_waits(vmm_arena *a, CUstream waiter, CUstream source) {
  uint64_t mark = mark_of(a, source);
  fake_program_wait(waiter, source);
  assert_int_equal(vmm_arena_stream_waited(a, waiter, source, mark), VMM_OK);
}

static void assert_no_order_since(size_t from) {
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
}

static void destroy(vmm_arena *a) {
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  tu_destroy(a);
}

/* Freed on S1, its work pending; S2 waited for S1 after the free: S2 reuses it at once. */
static void a_wait_after_the_free_orders_the_reuse(void **state) {
  (void)state;
  for (int by_event = 0; by_event <= 1; by_event++) {
    vmm_arena *a = arena_with(by_event);
    void *p = tu_alloc(a, 4 * MiB, T, S1);
    tu_free(a, p, S1);
    program_waits(a, S2, S1);
    size_t from = fake_call_count();
    void *q = tu_alloc(a, 4 * MiB, T, S2);
    assert_ptr_equal(q, p);
    assert_no_order_since(from);
    tu_free(a, q, S2);
    destroy(a);
  }
}

/* A mark taken before the free covers nothing freed after it, even once S2 waits. */
static void a_mark_before_the_free_orders_nothing(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  void *earlier = tu_alloc(a, 2 * MiB, T, S1);
  tu_free(a, earlier, S1); /* so that the mark below is not 0 (which teaches nothing) */
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  uint64_t mark = mark_of(a, S1);
  assert_true(mark > 0);
  tu_free(a, p, S1);
  fake_program_wait(S2, S1);
  assert_int_equal(vmm_arena_stream_waited(a, S2, S1, mark), VMM_OK);
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_not_equal(q, p);
  tu_free(a, q, S2);
  destroy(a);
}

/* S3 waited for S1; a request on S2 learns nothing from it. */
static void another_streams_wait_orders_nothing(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  program_waits(a, S3, S1);
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_not_equal(q, p);
  void *r = tu_alloc(a, 4 * MiB, T, S3);
  assert_ptr_equal(r, p);
  tu_free(a, q, S2);
  tu_free(a, r, S3);
  destroy(a);
}

/* A mapping S3 also used (record_stream), freed on S1: S2's wait for S1 is not enough; its wait
 * for S3 too is. */
static void a_record_stream_use_needs_its_own_wait(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  assert_int_equal(vmm_arena_record_stream(a, p, S3), VMM_OK);
  tu_use(p, S3);
  tu_free(a, p, S1);
  program_waits(a, S2, S1);
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_not_equal(q, p);
  program_waits(a, S2, S3);
  size_t from = fake_call_count();
  void *r = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_equal(r, p);
  assert_no_order_since(from);
  tu_free(a, q, S2);
  tu_free(a, r, S2);
  destroy(a);
}

/* A slot S2 used, freed on S1: it waits for S2 until S1 waits for S2 after the free. */
static void a_waiting_slot_is_freed_by_the_programs_wait(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  char *x = tu_alloc(a, 512, T, S1);
  char *keep = tu_alloc(a, 512, T, S1);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  tu_use(x, S2);
  tu_free(a, x, S1);
  char *y = tu_alloc(a, 512, T, S1);
  assert_ptr_not_equal(y, x);
  program_waits(a, S1, S2);
  size_t from = fake_call_count();
  char *z = tu_alloc(a, 512, T, S1);
  assert_ptr_equal(z, x);
  assert_no_order_since(from);
  tu_free(a, y, S1);
  tu_free(a, z, S1);
  tu_free(a, keep, S1);
  destroy(a);
}

/* Nine waiters of S1 at rising marks: the lowest mark's entry makes room, a waiter keeps its
 * highest mark, and the evicted waiter falls back to the fences. */
static void the_lowest_mark_makes_room(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  void *p[VMM_FENCE_WAITERS + 1], *apart[VMM_FENCE_WAITERS + 1]; /* live between them: no merging */
  for (int i = 0; i <= VMM_FENCE_WAITERS; i++) {
    p[i] = tu_alloc(a, (size_t)(i + 1) * 2 * MiB, T, S1);
    apart[i] = tu_alloc(a, 2 * MiB, T, S1);
  }
  for (int i = 0; i <= VMM_FENCE_WAITERS; i++) {
    tu_free(a, p[i], S1);
    program_waits(a, TU_STREAM(10 + i), S1);
  }
  assert_int_equal(vmm_arena_stream_waited(a, TU_STREAM(11), S1, 1), VMM_OK); /* lower: kept higher */
  void *q = tu_alloc(a, 2 * MiB, T, TU_STREAM(10)); /* the evicted waiter: not ordered */
  assert_ptr_not_equal(q, p[0]);
  void *r = tu_alloc(a, 4 * MiB, T, TU_STREAM(11));
  assert_ptr_equal(r, p[1]);
  void *s = tu_alloc(a, (VMM_FENCE_WAITERS + 1) * 2 * MiB, T, TU_STREAM(10 + VMM_FENCE_WAITERS));
  assert_ptr_equal(s, p[VMM_FENCE_WAITERS]);
  tu_free(a, q, TU_STREAM(10));
  tu_free(a, r, TU_STREAM(11));
  tu_free(a, s, TU_STREAM(10 + VMM_FENCE_WAITERS));
  for (int i = 0; i <= VMM_FENCE_WAITERS; i++) tu_free(a, apart[i], S1);
  destroy(a);
}

/* A capturing stream has no mark, a capturing waiter learns nothing, and a capturing request is
 * not served by an earlier wait (its graph replays outside the program's order); a mark past
 * the arena's is refused with its numbers and nothing learned. */
static void captures_and_bad_marks_teach_nothing(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0);
  void *p = tu_alloc(a, 4 * MiB, T, S1);
  tu_free(a, p, S1);
  uint64_t mark = mark_of(a, S1);
  assert_true(mark > 0);
  fake_set_capturing(S1, 1);
  assert_int_equal(mark_of(a, S1), 0);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_stream_waited(a, S2, S1, mark + 5), VMM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(vmm_arena_last_error(a), "past the"));
  assert_int_equal(vmm_arena_stream_waited(NULL, S2, S1, mark), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_stream_mark(a, S1, NULL), VMM_ERR_INVALID_ARGUMENT);
  fake_set_capturing(S2, 1);
  assert_int_equal(vmm_arena_stream_waited(a, S2, S1, mark), VMM_OK); /* while S2 captures */
  fake_set_capturing(S2, 0);
  void *q = tu_alloc(a, 4 * MiB, T, S2);
  assert_ptr_not_equal(q, p); /* learned nothing */
  program_waits(a, S3, S1);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S3, 1);
  void *g = NULL;
  assert_int_equal(vmm_arena_alloc_in(a, 4 * MiB, T, S3, 7, &g), VMM_OK);
  assert_ptr_not_equal(g, p);
  assert_int_equal(vmm_arena_free(a, g, S3), VMM_OK);
  fake_set_capturing(S3, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  tu_free(a, q, S2);
  destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_wait_after_the_free_orders_the_reuse),
      cmocka_unit_test(a_mark_before_the_free_orders_nothing),
      cmocka_unit_test(another_streams_wait_orders_nothing),
      cmocka_unit_test(a_record_stream_use_needs_its_own_wait),
      cmocka_unit_test(a_waiting_slot_is_freed_by_the_programs_wait),
      cmocka_unit_test(the_lowest_mark_makes_room),
      cmocka_unit_test(captures_and_bad_marks_teach_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
