/* Invariants of SPEC.md that the mutation campaign (tests/mutation/) found untested, or
 * tested only by tests of something else (the random run, the countdown, the fault sweeps):
 * each test is named for the rule it checks. Black-box: the public API, the snapshot and the
 * fake's ledger and call log. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)

static CUdeviceptr dp(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static fake_ledger ledger(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l;
}

static void *tagged(vmm_arena *a, const char *tag, size_t bytes, vmm_kind kind, CUstream s) {
  vmm_tag_push(tag);
  void *p = tu_alloc(a, bytes, kind, s);
  vmm_tag_pop();
  return p;
}

/* Index of the first call of `e` with first argument `a0` at or after `from`, or SIZE_MAX. */
static size_t first_call_with(size_t from, vmm_driver_entry e, uintptr_t a0) {
  for (size_t i = from, end = fake_call_count(); i < end; i++)
    if (fake_call_at(i)->entry == e && fake_call_at(i)->a0 == a0) return i;
  return SIZE_MAX;
}

static uint64_t idle_bytes(vmm_arena *a) {
  vmm_snapshot s = tu_snapshot(a);
  return s.kind[VMM_KIND_PACKAGE].idle_bytes + s.kind[VMM_KIND_TRANSIENT].idle_bytes;
}

static uint64_t idle_count(vmm_arena *a) {
  vmm_snapshot s = tu_snapshot(a);
  return s.kind[VMM_KIND_PACKAGE].idle_count + s.kind[VMM_KIND_TRANSIENT].idle_count;
}

/* A tag's figures from the JSON snapshot: live count and bytes, paused count and bytes (all 0
 * when the snapshot does not list the tag). */
typedef struct tag_figures {
  unsigned long long count, bytes, paused_count, paused_bytes;
} tag_figures;

static tag_figures tag_of(vmm_arena *a, const char *tag) {
  static char buf[65536];
  assert_int_equal(vmm_arena_snapshot_json(a, buf, sizeof buf, NULL), VMM_OK);
  char key[128];
  snprintf(key, sizeof key, "{\"tag\":\"%s\",", tag);
  tag_figures f = {0, 0, 0, 0};
  const char *at = strstr(buf, key);
  if (at)
    assert_int_equal(sscanf(at + strlen(key), "\"count\":%llu,\"bytes\":%llu,\"paused_count\":%llu,\"paused_bytes\":%llu",
                            &f.count, &f.bytes, &f.paused_count, &f.paused_bytes),
                     4);
  return f;
}

static void assert_tag(vmm_arena *a, const char *tag, unsigned long long count, unsigned long long bytes,
                       unsigned long long paused_count, unsigned long long paused_bytes) {
  tag_figures f = tag_of(a, tag);
  if (f.count != count || f.bytes != bytes || f.paused_count != paused_count || f.paused_bytes != paused_bytes)
    fail_msg("tag %s: live %llu (%llu B), paused %llu (%llu B); expected live %llu (%llu B), paused %llu (%llu B)", tag,
             f.count, f.bytes, f.paused_count, f.paused_bytes, count, bytes, paused_count, paused_bytes);
}

/* ---- Record before unmap ------------------------------------------------------------- */

/* A free deferred by a capture whose unmap then fails stays deferred, still mapped and still
 * refused as a second free; a later call unmaps it. */
static void deferred_free_whose_unmap_fails_is_retried(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  fake_set_capturing(S1, 1);
  tu_free(a, p, S1);
  fake_set_capturing(S1, 0);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 1);
  assert_int_equal(fake_mapped_size_at(dp(p)), 4 * MiB);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_ERR_UNKNOWN_POINTER);
  if (!strstr(vmm_arena_last_error(a), "waiting for a capture to end")) fail_msg("%s", vmm_arena_last_error(a));
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_ERR_DRIVER);
  tu_check(a);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* the retry */
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  assert_int_equal(ledger().live_handles, 0);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_ERR_UNKNOWN_POINTER);
  if (!strstr(vmm_arena_last_error(a), "not an allocation")) fail_msg("%s", vmm_arena_last_error(a));
  tu_destroy(a);
}

/* Freeing a paused allocation whose resume left a piece mapped (its undo unmap failed) unmaps
 * that piece before the range returns to the free list. */
static void freed_paused_range_holds_nothing_mapped(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tagged(a, "operands", 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_pause(a, "operands", VMM_PAUSE_DISCARD), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  fake_fail_nth(VMM_DRV_mem_set_access, 1, CUDA_ERROR_UNKNOWN, 0);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_resume(a, "operands"), VMM_ERR_DRIVER);
  assert_int_equal(fake_mapped_size_at(dp(p)), 2 * MiB); /* the piece the failed undo left */
  fake_clear_faults();
  tu_free(a, p, S1);
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  tu_check(a);
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1); /* the range is usable again */
  tu_free(a, q, S1);
  tu_destroy(a);
}

/* ---- Stream order -------------------------------------------------------------------- */

/* A free on a capturing stream waits for that stream's capture, not for the stream the
 * memory was allocated on, and the stream it synchronizes before the unmap is the freeing one. */
static void deferred_free_waits_for_the_stream_it_was_freed_on(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  fake_set_capturing(S2, 1);
  tu_free(a, p, S2);
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1); /* a later call while S2 still captures */
  assert_int_equal(fake_mapped_size_at(dp(p)), 4 * MiB);
  fake_set_capturing(S2, 0);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  size_t sync = first_call_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S2);
  size_t unmap = first_call_with(from, VMM_DRV_mem_unmap, dp(p));
  assert_true(sync != SIZE_MAX && unmap != SIZE_MAX && sync < unmap);
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  tu_free(a, q, S1);
  tu_destroy(a);
}

/* A pooled mapping belongs to the stream that freed it: reuse there is immediate (no driver
 * call), and reuse on the stream that allocated it waits on an event recorded on the freeing one. */
static void reuse_is_ordered_after_the_freeing_stream(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  tu_free(a, p, S2);
  size_t from = fake_call_count();
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2), p);
  assert_int_equal(fake_call_count(), from);
  tu_free(a, p, S2);
  from = fake_call_count();
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1), p);
  tu_assert_event_orders(from, S2, S1);
  tu_free(a, p, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- Retention scope ----------------------------------------------------------------- */

/* A package free inside a scope that a capture deferred keeps its handles idle when it is
 * completed: no handle freed inside the scope is released before finish. */
static void deferred_free_inside_a_scope_keeps_its_handles_until_finish(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  fake_set_capturing(S1, 1);
  tu_free(a, p, S1);
  fake_set_capturing(S1, 0);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* completes the deferred free */
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0);
  assert_int_equal(ledger().live_handle_bytes, 4 * MiB);
  assert_int_equal(idle_bytes(a), 4 * MiB);
  tu_check(a);
  from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_true(fake_calls_since(from, VMM_DRV_mem_release) > 0);
  assert_int_equal(ledger().live_handles, 0);
  tu_destroy(a);
}

/* ---- Assembly ------------------------------------------------------------------------ */

/* An assembly that fails at its last step puts every idle handle it had chosen back in the
 * store, and holds no new memory; the same request then succeeds from those handles. */
static void failed_assembly_puts_every_idle_handle_back(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1); /* two 2 MiB handles, cut in the scope */
  tu_free(a, p, S1);
  assert_int_equal(idle_count(a), 2);
  vmm_snapshot before = tu_snapshot(a);
  fake_fail_nth(VMM_DRV_mem_map, 1, CUDA_ERROR_OUT_OF_MEMORY, 0);
  void *q = NULL;
  assert_int_equal(vmm_arena_alloc(a, 6 * MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  vmm_snapshot after = tu_snapshot(a);
  assert_int_equal(idle_count(a), 2);
  assert_int_equal(idle_bytes(a), 4 * MiB);
  assert_int_equal(after.physical_bytes, before.physical_bytes);
  assert_int_equal(ledger().live_handle_bytes, 4 * MiB);
  assert_int_equal(after.assemblies, before.assemblies);
  tu_check(a);
  q = tu_alloc(a, 6 * MiB, VMM_KIND_TRANSIENT, S1);
  after = tu_snapshot(a);
  assert_int_equal(after.assembled_idle_handles, before.assembled_idle_handles + 2);
  assert_int_equal(after.assembly_created_bytes, before.assembly_created_bytes + 2 * MiB);
  assert_int_equal(idle_count(a), 0);
  tu_free(a, q, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* A pooled mapping whose handles are all larger than the request is left in the pool: it is
 * taken apart only for handles the request can use. */
static void pooled_mapping_is_taken_apart_only_for_handles_the_request_uses(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *big = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1); /* outside a scope: one 8 MiB handle */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  tu_free(a, big, S1); /* pooled whole */
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pooled_taken_apart, 0);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_count, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_bytes, 8 * MiB);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 2 * MiB);
  assert_int_equal(fake_mapped_size_at(dp(big)), 8 * MiB);
  tu_free(a, q, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* Taking a pooled mapping apart uses only its handles that fit what is left: a request of
 * 4 MiB from a pooled [8 MiB, 2 MiB] mapping gets its 2 MiB handle and 2 MiB of new memory,
 * never the 8 MiB handle as padding; that one stays idle. */
static void pooled_mapping_never_pads_a_request(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *w = tu_alloc(a, 8 * MiB, VMM_KIND_PACKAGE, S1); /* outside a scope: one 8 MiB handle */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  tu_free(a, w, S1); /* an idle 8 MiB handle */
  void *t = tu_alloc(a, 10 * MiB, VMM_KIND_TRANSIENT, S1); /* the 8 MiB handle + 2 MiB new */
  assert_int_equal(tu_snapshot(a).assembled_idle_handles, 1);
  tu_free(a, t, S1); /* pooled: 10 MiB of handles [8 MiB, 2 MiB] */
  vmm_snapshot before = tu_snapshot(a);
  void *q = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  vmm_snapshot after = tu_snapshot(a);
  assert_int_equal(after.pooled_taken_apart, before.pooled_taken_apart + 1);
  assert_int_equal(after.kind[VMM_KIND_TRANSIENT].live_bytes, 4 * MiB);
  assert_int_equal(after.padded_assemblies, 0);
  assert_int_equal(after.assembly_created_bytes, before.assembly_created_bytes + 2 * MiB);
  assert_int_equal(idle_bytes(a), 8 * MiB);
  assert_int_equal(idle_count(a), 1);
  tu_free(a, q, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- Pause and resume ---------------------------------------------------------------- */

/* A tag's bytes move from live to paused and back, and leave both when the paused allocation
 * is freed. */
static void tag_bytes_follow_pause_resume_and_free(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tagged(a, "weights", 4 * MiB, VMM_KIND_PACKAGE, S1);
  assert_tag(a, "weights", 1, 4 * MiB, 0, 0);
  assert_int_equal(vmm_arena_pause(a, "weights", VMM_PAUSE_DISCARD), VMM_OK);
  assert_tag(a, "weights", 0, 0, 1, 4 * MiB);
  assert_int_equal(vmm_arena_resume(a, "weights"), VMM_OK);
  assert_tag(a, "weights", 1, 4 * MiB, 0, 0);
  assert_int_equal(vmm_arena_pause(a, "weights", VMM_PAUSE_DISCARD), VMM_OK);
  tu_free(a, p, S1);
  assert_tag(a, "weights", 0, 0, 0, 0);
  tu_destroy(a);
}

/* ---- Errors -------------------------------------------------------------------------- */

/* Out of memory from any driver call (here cuMemMap and cuMemSetAccess, not only cuMemCreate)
 * is a recoverable VMM_ERR_OUT_OF_MEMORY, never the fatal error; the retry succeeds. */
static void out_of_memory_from_any_driver_call_is_recoverable(void **state) {
  (void)state;
  static const vmm_driver_entry entries[] = {VMM_DRV_mem_map, VMM_DRV_mem_set_access};
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    vmm_arena *a = tu_arena(NULL, NULL);
    fake_fail_nth(entries[i], 1, CUDA_ERROR_OUT_OF_MEMORY, 0);
    void *p = NULL;
    assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1, &p), VMM_ERR_OUT_OF_MEMORY);
    assert_null(p);
    if (!strstr(vmm_arena_last_error(a), "CUDA_ERROR_OUT_OF_MEMORY")) fail_msg("%s", vmm_arena_last_error(a));
    const char *fatal = NULL;
    assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
    assert_string_equal(fatal, "");
    assert_int_equal(tu_snapshot(a).fatal_status, VMM_OK);
    p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
    tu_free(a, p, S1);
    tu_destroy(a);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(deferred_free_whose_unmap_fails_is_retried),
      cmocka_unit_test(freed_paused_range_holds_nothing_mapped),
      cmocka_unit_test(deferred_free_waits_for_the_stream_it_was_freed_on),
      cmocka_unit_test(reuse_is_ordered_after_the_freeing_stream),
      cmocka_unit_test(deferred_free_inside_a_scope_keeps_its_handles_until_finish),
      cmocka_unit_test(failed_assembly_puts_every_idle_handle_back),
      cmocka_unit_test(pooled_mapping_is_taken_apart_only_for_handles_the_request_uses),
      cmocka_unit_test(pooled_mapping_never_pads_a_request),
      cmocka_unit_test(tag_bytes_follow_pause_resume_and_free),
      cmocka_unit_test(out_of_memory_from_any_driver_call_is_recoverable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
