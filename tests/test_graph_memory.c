/* Whole-process mode on the fake driver: a CUDA graph's memory under pause and under the
 * cache's drains, judged by the fake's device timeline. Regressions of test_random_process
 * (seeds 2, 3, 5, 12, 13) reduced to their steps:
 *   - memory allocated into a graph's pool stays the pool's while the graph lives, also when it
 *     is freed while paused: its range goes to no other allocation, and resume maps it back so
 *     that the graph replays into mapped memory (SPEC, "CUDA graphs" and "Pause and resume");
 *   - a drain (empty_cache, finish) waits for the frees a capture deferred before it unmaps
 *     them. */
#include <stdbool.h>
#include <stdio.h>

#include "test_util.h"

#define S1 TU_STREAM(1)
#define S3 TU_STREAM(3)
#define T VMM_KIND_TRANSIENT
#define P VMM_KIND_PACKAGE
#define POOL ((vmm_pool_id)1)

static vmm_arena *process_arena(vmm_retain_mode retain) {
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = retain;
  return tu_arena(NULL, &c);
}

static CUdeviceptr dp(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static void no_violation(void) {
  if (fake_violations(FAKE_VIOLATION_KINDS)) fail_msg("the device timeline: %s", fake_violation_text(0));
}

static vmm_usage usage(vmm_arena *a) {
  vmm_usage u;
  assert_int_equal(vmm_arena_usage(a, &u), VMM_OK);
  return u;
}

/* A graph captured on S1 into POOL with one kernel on `bytes` tagged "t1" (its graph in *graph). */
static void *captured(vmm_arena *a, size_t bytes, uint64_t *graph) {
  assert_int_equal(vmm_arena_capture_begin(a, POOL), VMM_OK);
  fake_set_capturing(S1, 1);
  void *g = NULL;
  vmm_tag_push("t1");
  assert_int_equal(vmm_arena_alloc_in(a, bytes, T, S1, POOL, &g), VMM_OK);
  vmm_tag_pop();
  assert_int_equal(fake_kernel(S1, dp(g), bytes, fake_owner_new()), 0); /* joins the graph */
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, POOL), VMM_OK);
  *graph = fake_graph_last();
  fake_graph_launch(*graph, S1);
  return g;
}

/* Seeds 2, 3, 13: the graph's allocation paused, freed, an eager request, resume, a replay. */
static void a_graph_keeps_a_range_freed_while_paused(void **state) {
  (void)state;
  vmm_arena *a = process_arena(VMM_RETAIN_AUTO);
  uint64_t graph;
  void *g = captured(a, 6 * MiB, &graph);
  assert_int_equal(vmm_arena_pause(a, "t1", VMM_PAUSE_BACKUP), VMM_OK);
  assert_int_equal(vmm_arena_free(a, g, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, g, S1), VMM_ERR_UNKNOWN_POINTER); /* freed: the pool's now */
  assert_int_equal(vmm_arena_record_stream(a, g, S3), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(usage(a).allocations, 0);
  tu_check(a);
  void *e = tu_alloc(a, 6 * MiB, P, S3); /* eager: another range */
  assert_true(dp(e) >= dp(g) + 6 * MiB || dp(e) + 6 * MiB <= dp(g));
  assert_int_equal(vmm_arena_resume(a, "t1"), VMM_OK); /* maps the graph's range back */
  assert_true(fake_mapped_size_at(dp(g)) > 0);
  fake_graph_launch(graph, S1);
  no_violation();
  tu_check(a);
  void *again = NULL; /* pooled in POOL: its captures take it back */
  assert_int_equal(vmm_arena_alloc_in(a, 6 * MiB, T, S1, POOL, &again), VMM_OK);
  assert_ptr_equal(again, g);
  assert_int_equal(vmm_arena_free(a, again, S1), VMM_OK);
  tu_free(a, e, S3);
  assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* Seeds 5, 12: a slot whose page the free empties while paused; the page's range is kept. */
static void a_graph_keeps_a_page_emptied_while_paused(void **state) {
  (void)state;
  vmm_arena *a = process_arena(VMM_RETAIN_AUTO);
  uint64_t graph;
  void *g = captured(a, 1033, &graph);
  CUdeviceptr page = dp(g) & ~(CUdeviceptr)(2 * MiB - 1);
  assert_int_equal(vmm_arena_pause(a, "t1", VMM_PAUSE_DISCARD), VMM_OK);
  assert_int_equal(vmm_arena_free(a, g, S1), VMM_OK);
  void *e = tu_alloc(a, 2 * MiB, P, S3);
  assert_true(dp(e) != page);
  assert_int_equal(vmm_arena_resume(a, "t1"), VMM_OK);
  assert_true(fake_mapped_size_at(dp(g)) > 0);
  fake_graph_launch(graph, S1);
  no_violation();
  tu_free(a, e, S3);
  assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* Released while still paused: the kept range goes back, and nothing is left to resume. */
static void releasing_the_pool_frees_a_kept_range(void **state) {
  (void)state;
  vmm_arena *a = process_arena(VMM_RETAIN_AUTO);
  uint64_t graph;
  void *g = captured(a, 4 * MiB, &graph);
  assert_int_equal(vmm_arena_pause(a, "t1", VMM_PAUSE_BACKUP), VMM_OK);
  assert_int_equal(vmm_arena_free(a, g, S1), VMM_OK);
  assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
  tu_check(a);
  assert_int_equal(vmm_arena_resume(a, "t1"), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_free(a, g, S1), VMM_ERR_UNKNOWN_POINTER);
  tu_free(a, tu_alloc(a, 4 * MiB, T, S3), S3);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* Shared memory freed on a capturing stream is deferred; once the capture is over a drain
 * pools it and must wait for its stream before it unmaps it (the eager kernel is not known
 * complete). `finish`: the drain of vmm_retention_finish, else of empty_cache. */
static void drain_after_a_deferred_free(bool finish) {
  vmm_arena *a = process_arena(finish ? VMM_RETAIN_ON : VMM_RETAIN_AUTO);
  if (finish) assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *x = tu_alloc(a, 4 * MiB, T, S1); /* its first use: an eager kernel on S1 */
  assert_int_equal(vmm_arena_capture_begin(a, POOL), VMM_OK);
  fake_set_capturing(S1, 1);
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_OK);
  assert_int_equal(tu_snapshot(a).deferred_frees, 1);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, POOL), VMM_OK);
  assert_int_equal(finish ? vmm_retention_finish(a) : vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  no_violation();
  assert_int_equal(vmm_arena_release_pool(a, POOL), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

static void empty_cache_waits_for_a_free_a_capture_deferred(void **state) {
  (void)state;
  drain_after_a_deferred_free(false);
}

static void finish_waits_for_a_free_a_capture_deferred(void **state) {
  (void)state;
  drain_after_a_deferred_free(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_graph_keeps_a_range_freed_while_paused),
      cmocka_unit_test(a_graph_keeps_a_page_emptied_while_paused),
      cmocka_unit_test(releasing_the_pool_frees_a_kept_range),
      cmocka_unit_test(empty_cache_waits_for_a_free_a_capture_deferred),
      cmocka_unit_test(finish_waits_for_a_free_a_capture_deferred),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
