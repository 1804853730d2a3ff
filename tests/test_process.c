/* Whole-process mode (vmm_config.caching) on the fake driver: pages and their slots, the cache
 * outside a scope, stream order without host waits, record_stream, graph pools and captures,
 * empty_cache, the cache released under pressure, and the usage figures. Every test ends
 * with the invariant checker and a clean ledger (tu_destroy). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define S3 TU_STREAM(3)
#define S4 TU_STREAM(4)
#define T VMM_KIND_TRANSIENT
#define P VMM_KIND_PACKAGE

/* Whole-process mode on the fake driver, retention auto (off on the fake's discrete device, as
 * on an H200); growth off, as tu_config has it, unless a test asks. */
static vmm_config process_config(void) {
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = VMM_RETAIN_AUTO;
  return c;
}

static vmm_arena *process_arena_refill(size_t limit, vmm_retain_mode retain, size_t handle_bound, double refill) {
  vmm_config c = process_config();
  c.retain = retain;
  c.limit_bytes = limit;
  c.handle_bound_bytes = handle_bound;
  c.refill_share = refill;
  return tu_arena(NULL, &c);
}

static vmm_arena *process_arena_bound(size_t limit, vmm_retain_mode retain, size_t handle_bound) {
  return process_arena_refill(limit, retain, handle_bound, 0.0);
}

static vmm_arena *process_arena(size_t limit, vmm_retain_mode retain) { return process_arena_bound(limit, retain, 0); }

/* VMMARENA_STREAM_ORDER=event: memory freed on another stream serves at once, the request's
 * stream made to wait for an event recorded after the free. */
static vmm_arena *event_ordered_arena(size_t handle_bound) {
  vmm_config c = process_config();
  c.handle_bound_bytes = handle_bound;
  c.order_by_event = 1;
  return tu_arena(NULL, &c);
}

/* One handle per new request of up to 64 MiB: no handle boundary inside, so no prefix hit. */
static vmm_arena *whole_handles_arena(void) { return process_arena_bound(0, VMM_RETAIN_AUTO, 64 * MiB); }

static void *alloc_in(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s, vmm_pool_id pool) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc_in(a, bytes, kind, s, pool, &p);
  if (st != VMM_OK) fprintf(stderr, "alloc_in %zu: %s\n", bytes, vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
  return p;
}

static vmm_usage usage(vmm_arena *a) {
  vmm_usage u;
  assert_int_equal(vmm_arena_usage(a, &u), VMM_OK);
  return u;
}

static CUdeviceptr dp(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* ---- Pages ----------------------------------------------------------------------------- */

static void slot_sizes(void **state) {
  (void)state;
  const size_t g = 2 * MiB;
  assert_int_equal(vmm_pages_slot_size(g, 1), 512);
  assert_int_equal(vmm_pages_slot_size(g, 513), 1024);
  assert_int_equal(vmm_pages_slot_size(g, 4096), 4096);
  assert_int_equal(vmm_pages_slot_size(g, 4097), 5120);   /* 4 KiB steps of 1 KiB */
  assert_int_equal(vmm_pages_slot_size(g, 40000), 40960); /* 32 KiB steps of 8 KiB */
  assert_int_equal(vmm_pages_slot_size(g, 65537), g / 31 / 512 * 512); /* 31 slots fill the page */
  assert_int_equal(vmm_pages_slot_size(g, g / 2), g / 2);
  for (size_t b = 1; b <= g / 2; b = b * 3 + 7) {
    size_t s = vmm_pages_slot_size(g, b);
    assert_true(s >= b && s % 512 == 0 && g / s >= 2);
    assert_true(s - b <= s / 4 || s <= 4096 || g / s < 32); /* at most a quarter wasted, but in big slots */
  }
}

/* vmm_arena_allocation_size: a slot's size class, a whole mapping's extent; anything else is
 * refused and leaves *bytes as it was. */
static void allocation_size_is_the_slot_or_the_extent(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  char *slot = alloc_in(a, 700, T, S1, 0);
  char *whole = alloc_in(a, 3 * MiB + 1, T, S1, 0);
  size_t bytes = 0;
  assert_int_equal(vmm_arena_allocation_size(a, slot, &bytes), VMM_OK);
  assert_int_equal(bytes, 1024);
  assert_int_equal(vmm_arena_allocation_size(a, whole, &bytes), VMM_OK);
  assert_int_equal(bytes, 4 * MiB);
  bytes = 7;
  assert_int_equal(vmm_arena_allocation_size(a, whole + 512, &bytes), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(bytes, 7);
  assert_non_null(strstr(vmm_arena_last_error(a), "not a live allocation"));
  assert_int_equal(vmm_arena_allocation_size(a, NULL, &bytes), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(vmm_arena_allocation_size(NULL, whole, &bytes), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_allocation_size(a, whole, NULL), VMM_ERR_INVALID_ARGUMENT);
  tu_free(a, whole, S1);
  assert_int_equal(vmm_arena_allocation_size(a, whole, &bytes), VMM_ERR_UNKNOWN_POINTER); /* cached, not live */
  tu_free(a, slot, S1);
  tu_destroy(a);
}

/* Small requests share a page: one mapping, slots apart by the slot size, no driver call for
 * the second; freeing them all gives the page back to the pool, still mapped. */
static void small_requests_share_a_page(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  char *x = alloc_in(a, 1000, T, S1, 0);
  size_t from = fake_call_count();
  char *y = alloc_in(a, 700, T, S1, 0);
  char *z = alloc_in(a, 1024, T, S1, 0);
  assert_int_equal(fake_call_count(), from); /* no driver call */
  assert_int_equal(dp(x) % (2 * MiB), 0);
  assert_int_equal(y - x, 1024);
  assert_int_equal(z - x, 2048);
  vmm_usage u = usage(a);
  assert_int_equal(u.pages, 1);
  assert_int_equal(u.page_slots_used, 3);
  assert_int_equal(u.allocated_bytes, 3 * 1024);
  assert_int_equal(u.reserved_bytes, 2 * MiB);
  tu_free(a, y, S1);
  char *w = alloc_in(a, 800, T, S1, 0); /* the slot freed on its own stream, at once */
  assert_ptr_equal(w, y);
  tu_free(a, x, S1);
  tu_free(a, w, S1);
  assert_int_equal(usage(a).pages, 1);
  tu_free(a, z, S1);
  u = usage(a);
  assert_int_equal(u.pages, 0);
  assert_int_equal(u.allocated_bytes, 0);
  assert_int_equal(u.reserved_bytes, 2 * MiB); /* cached: the page went to the pool */
  assert_int_equal(tu_snapshot(a).kind[T].pooled_count, 1);
  tu_destroy(a);
}

/* A page serves one kind, tag, stream, slot size and pool. */
static void pages_are_kept_apart(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *base = alloc_in(a, 512, T, S1, 0);
  void *other[5];
  other[0] = alloc_in(a, 512, P, S1, 0);
  other[1] = alloc_in(a, 512, T, S2, 0);
  other[2] = alloc_in(a, 512, T, S1, 9);
  other[3] = alloc_in(a, 4096, T, S1, 0);
  vmm_tag_push("t");
  other[4] = alloc_in(a, 512, T, S1, 0);
  vmm_tag_pop();
  for (int i = 0; i < 5; i++) assert_int_not_equal(dp(other[i]) / (2 * MiB), dp(base) / (2 * MiB));
  assert_int_equal(usage(a).pages, 6);
  assert_int_equal(vmm_arena_pause(a, "t", VMM_PAUSE_DISCARD), VMM_OK); /* exactly the tagged page */
  assert_int_equal(tu_snapshot(a).kind[T].paused_count, 1);
  vmm_tag_push("t");
  void *during = alloc_in(a, 512, T, S1, 0); /* a new page: the paused one holds no memory */
  vmm_tag_pop();
  assert_int_not_equal(dp(during) / (2 * MiB), dp(other[4]) / (2 * MiB));
  assert_int_equal(fake_mapped_size_at(dp(during)), 2 * MiB);
  tu_free(a, during, S1);
  assert_int_equal(vmm_arena_resume(a, "t"), VMM_OK);
  tu_free(a, base, S1);
  tu_free(a, other[0], S1);
  tu_free(a, other[1], S2);
  tu_free(a, other[2], S1);
  tu_free(a, other[3], S1);
  tu_free(a, other[4], S1);
  assert_int_equal(usage(a).pages, 0);
  tu_destroy(a);
}

static void bad_frees_of_slots(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  char *x = alloc_in(a, 1000, T, S1, 0);
  char *y = alloc_in(a, 1000, T, S1, 0);
  assert_int_equal(vmm_arena_free(a, x + 16, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_non_null(strstr(vmm_arena_last_error(a), "no taken slot starts there"));
  assert_int_equal(vmm_arena_free(a, x + 2048, S1), VMM_ERR_UNKNOWN_POINTER); /* a free slot */
  tu_free(a, x, S1);
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_ERR_UNKNOWN_POINTER); /* twice */
  assert_int_equal(usage(a).page_slots_used, 1);
  tu_free(a, y, S1);
  tu_destroy(a);
}

/* The last slot of a page freed, and the page's mapping then not freed (here: paused, mapped
 * again by a resume whose copy failed, and its unmap fails): the page stays a page, empty, so
 * that its slots' pointers stay refused (a second free of the first slot must not free the
 * page's mapping as an allocation of its own), and a resume and empty_cache give it back
 * later. */
static void a_page_whose_free_fails_stays_a_page(void **state) {
  (void)state;
  vmm_config c = process_config();
  c.pause_staging = 0; /* backups copied with cuMemcpyHtoD */
  vmm_arena *a = tu_arena(NULL, &c);
  vmm_tag_push("t");
  void *x = alloc_in(a, 512, T, S1, 0);
  vmm_tag_pop();
  assert_int_equal(dp(x) % (2 * MiB), 0); /* the first slot: the page's base */
  assert_int_equal(vmm_arena_pause(a, "t", VMM_PAUSE_BACKUP), VMM_OK);
  fake_fail_nth(VMM_DRV_mem_cpy_htod, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_resume(a, "t"), VMM_ERR_DRIVER); /* mapped again, the copy left to do */
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_ERR_DRIVER); /* the slot is freed, its page is not */
  assert_int_equal(fake_faults_fired(), 2);
  vmm_usage u = usage(a);
  assert_int_equal(u.allocations, 0);
  assert_int_equal(u.allocated_bytes, 0);
  assert_int_equal(u.pages, 1);
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(usage(a).allocated_bytes, 0);
  tu_check(a);
  assert_int_equal(vmm_arena_resume(a, "t"), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  u = usage(a);
  assert_int_equal(u.pages, 0);
  assert_int_equal(u.reserved_bytes, 0);
  vmm_arena_destroy(a); /* the failed unmap stays the arena's first fatal error */
  assert_true(fake_ledger_clean());
}

/* ---- The cache outside a scope -------------------------------------------------------- */

static void exact_hit_outside_a_scope(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *p = alloc_in(a, 6 * MiB, T, S1, 0);
  size_t from = fake_call_count();
  tu_free(a, p, S1);
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 0), p);
  assert_int_equal(fake_call_count(), from); /* free and hit: no driver call */
  tu_free(a, p, S1);
  void *q = alloc_in(a, 6 * MiB, P, S1, 0); /* another kind: not the pooled transient */
  assert_ptr_not_equal(q, p);
  tu_free(a, q, S1);
  assert_ptr_equal(alloc_in(a, 6 * MiB, P, S1, 0), q); /* package memory is cached too */
  tu_free(a, q, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0);
  tu_destroy(a);
}

static void cross_stream_hit_waits_on_an_event(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *p = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S2, 0), p);
  tu_assert_event_orders(from, S1, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0); /* never a host wait */
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  tu_free(a, p, S2);
  tu_destroy(a);
}

static vmm_snapshot snap(vmm_arena *a) {
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  return s;
}

/* The counts of driver calls that change mappings or memory since `from`. */
static size_t mapping_calls_since(size_t from) {
  return fake_calls_since(from, VMM_DRV_mem_create) + fake_calls_since(from, VMM_DRV_mem_map) +
         fake_calls_since(from, VMM_DRV_mem_set_access) + fake_calls_since(from, VMM_DRV_mem_unmap) +
         fake_calls_since(from, VMM_DRV_mem_release);
}

/* A smaller request takes a larger pooled mapping's first handles in place, with no driver
 * call but the event that orders another stream after the free; the rest stays pooled. The
 * two merge back when the first part is pooled on the stream that freed the rest, not on
 * another. */
static void prefix_hit_in_place_and_merged_back(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *x = alloc_in(a, 8 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  void *h = alloc_in(a, 4 * MiB, T, S2, 0);
  assert_ptr_equal(h, x);
  size_t record = tu_first_call(from, VMM_DRV_event_record), wait = tu_first_call(from, VMM_DRV_stream_wait_event);
  assert_true(record != SIZE_MAX && wait != SIZE_MAX && record < wait);
  assert_int_equal(mapping_calls_since(from), 0);
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.prefix_hits, 1);
  assert_int_equal(sn.kind[T].pooled_bytes, 4 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, h, S2); /* its rest was freed on S1: kept apart */
  assert_int_equal(snap(a).kind[T].pooled_count, 2);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S2, 0), h);
  tu_free(a, h, S1); /* now on S1: one mapping again */
  sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 1);
  assert_int_equal(sn.kind[T].pooled_bytes, 8 * MiB);
  assert_ptr_equal(alloc_in(a, 8 * MiB, T, S1, 0), x);
  tu_free(a, x, S1);
  tu_destroy(a);
}

/* A request takes a run of handles inside a larger pooled mapping, in place, with no driver
 * call; the handles before and after it stay pooled, each a mapping of its own. Parts freed on
 * one stream join again, the run with the part after it when the run is pooled, and with the
 * part before it when that one is pooled first; parts freed on different streams do not. */
static void run_hit_in_place_between_two_pooled_parts(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *p8 = alloc_in(a, 8 * MiB, T, S1, 0), *p6 = alloc_in(a, 6 * MiB, T, S1, 0), *p4 = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, p8, S1);
  tu_free(a, p6, S1);
  tu_free(a, p4, S1);
  void *z = alloc_in(a, 18 * MiB, T, S1, 0); /* stitched: the 8, then the 6, then the 4 MiB handle */
  tu_free(a, z, S1);
  fake_set_events_pending(1); /* z's work not known done: the retired 6 MiB range cannot serve */
  size_t from = fake_call_count();
  void *r = alloc_in(a, 6 * MiB, T, S1, 0);
  assert_ptr_equal(r, (char *)z + 8 * MiB);
  assert_int_equal(mapping_calls_since(from), 0);
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.run_hits, 1);
  assert_int_equal(sn.prefix_hits, 0);
  assert_int_equal(sn.revived_ranges, 0);
  assert_int_equal(sn.kind[T].pooled_count, 2);
  assert_int_equal(sn.kind[T].pooled_bytes, 12 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  assert_ptr_equal(alloc_in(a, 8 * MiB, T, S1, 0), z); /* the part before serves as it is */
  tu_free(a, z, S2);
  tu_free(a, r, S1); /* takes back the part after it (S1), not the part before (S2) */
  sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 2);
  assert_int_equal(sn.kind[T].pooled_bytes, 18 * MiB);
  assert_ptr_equal(alloc_in(a, 10 * MiB, T, S1, 0), r);
  tu_free(a, r, S2); /* now on S2: it joins the part before it */
  sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 1);
  assert_int_equal(sn.kind[T].pooled_bytes, 18 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  assert_ptr_equal(alloc_in(a, 18 * MiB, T, S2, 0), z);
  assert_int_equal(mapping_calls_since(from), 0);
  fake_set_events_pending(0);
  tu_free(a, z, S2);
  tu_destroy(a);
}

/* A tail joins the mapping it was split off after only while that one still ends where the
 * tail begins: here that mapping gave its own tail away meanwhile. */
static void a_tail_joins_only_the_mapping_it_still_follows(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(64 * MiB);
  void *p[4];
  const size_t mib[4] = {8, 6, 4, 2};
  for (int i = 0; i < 4; i++) p[i] = alloc_in(a, mib[i] * MiB, T, S1, 0);
  for (int i = 0; i < 4; i++) tu_free(a, p[i], S1);
  char *z = alloc_in(a, 20 * MiB, T, S1, 0); /* stitched: 8, 6, 4, 2 */
  tu_free(a, z, S1);
  fake_set_events_pending(1); /* z's work not known done: no retired range serves */
  void *r = alloc_in(a, 4 * MiB, T, S1, 0); /* a run: z keeps 8 + 6, the 2 after stays pooled */
  assert_ptr_equal(r, z + 14 * MiB);
  assert_ptr_equal(alloc_in(a, 8 * MiB, T, S1, 0), z); /* a prefix: z keeps 8, its 6 pooled after it */
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S2, 0), z + 8 * MiB);
  tu_free(a, z, S1);
  tu_free(a, r, S1); /* joins the 2 after it, not z, which ends 6 MiB before it */
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 2);
  assert_int_equal(sn.kind[T].pooled_bytes, 14 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  fake_set_events_pending(0);
  tu_free(a, z + 8 * MiB, S2);
  tu_destroy(a);
}

/* A tail split off by an in-place hit keeps the streams record_stream added to the free it
 * came from; the part before it, pooled again on the tail's stream, does not take it back
 * while it has them. A request on a third stream is then ordered after those streams too: one
 * mapping would carry only the first part's stream, and S4 would overwrite what S2 reads. */
static void a_tail_with_record_stream_uses_is_not_taken_back(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *x = tu_alloc(a, 8 * MiB, T, S1);
  tu_use(x, S2);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  fake_set_events_pending(1); /* S2's kernel not known done */
  tu_free(a, x, S1);
  void *h = alloc_in(a, 4 * MiB, T, S3, 0); /* a prefix in place, ordered after S1 and S2; never used */
  assert_ptr_equal(h, x);
  assert_int_equal(vmm_arena_free(a, h, S1), VMM_OK); /* pooled on S1, the tail's stream */
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 2);
  assert_int_equal(sn.kind[T].pooled_bytes, 8 * MiB);
  void *y = tu_alloc(a, 8 * MiB, T, S4);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  fake_set_events_pending(0);
  tu_free(a, y, S4);
  tu_destroy(a);
}

/* The same the other way: a tail freed with streams record_stream added does not join the
 * pooled part before it (which has none), so a request on another stream waits for them. */
static void a_tail_freed_with_record_stream_uses_stays_apart(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *x = alloc_in(a, 8 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  void *h = alloc_in(a, 4 * MiB, T, S1, 0); /* a prefix in place; the tail stays pooled */
  assert_ptr_equal(h, x);
  char *tail = tu_alloc(a, 4 * MiB, T, S1); /* the tail, exact */
  assert_ptr_equal(tail, (char *)x + 4 * MiB);
  tu_free(a, h, S1);
  tu_use(tail, S2);
  assert_int_equal(vmm_arena_record_stream(a, tail, S2), VMM_OK);
  fake_set_events_pending(1); /* S2's kernel not known done */
  tu_free(a, tail, S1);
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.kind[T].pooled_count, 2);
  assert_int_equal(sn.kind[T].pooled_bytes, 8 * MiB);
  void *y = tu_alloc(a, 8 * MiB, T, S3);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  fake_set_events_pending(0);
  tu_free(a, y, S3);
  tu_destroy(a);
}

/* A page is exactly one granule (its slots are found by rounding down to it): a larger pooled
 * mapping never becomes one, whatever the reuse policy allows whole mappings, nor after a
 * refusal, where the cache is released and a granule created instead. */
static void a_page_is_one_granule_whatever_the_reuse(void **state) {
  (void)state;
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.reuse = VMM_REUSE_BOUNDED;
  c.reuse_bound = 2.0;
  c.handle_bound_bytes = 64 * MiB; /* big is one handle: no prefix hit */
  vmm_arena *a = tu_arena(NULL, &c);
  void *big = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, big, S1);
  void *s1 = alloc_in(a, MiB, T, S1, 0), *s2 = alloc_in(a, MiB, T, S1, 0); /* two slots of a new page */
  assert_int_equal(snap(a).kind[T].pooled_bytes, 4 * MiB);
  assert_int_equal(usage(a).pages, 1);
  tu_free(a, s2, S1);
  tu_free(a, s1, S1);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_destroy(a);
  a = process_arena_bound(4 * MiB, VMM_RETAIN_AUTO, 64 * MiB); /* the limit: after a refusal, no pooled fallback */
  big = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, big, S1);
  s1 = alloc_in(a, MiB, T, S1, 0);
  assert_int_equal(usage(a).reserved_bytes, 2 * MiB); /* the cache went back, a granule came */
  assert_int_equal(usage(a).cache_releases, 1);
  tu_free(a, s1, S1);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_destroy(a);
}

/* A pooled mapping up to 1/32 larger than a request serves it whole, with no driver call, in a
 * retaining scope as out of one; one larger than that does not. */
static void a_pooled_mapping_up_to_a_32nd_larger_serves_in_and_out_of_a_scope(void **state) {
  (void)state;
  for (int scoped = 0; scoped < 2; scoped++) {
    vmm_arena *a = process_arena_bound(0, scoped ? VMM_RETAIN_ON : VMM_RETAIN_AUTO, 256 * MiB);
    if (scoped) assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *p = alloc_in(a, 66 * MiB, T, S1, 0);
    tu_free(a, p, S1);
    size_t from = fake_call_count();
    void *q = alloc_in(a, 64 * MiB, T, S1, 0); /* 2 MiB over: 64 MiB / 32 */
    assert_ptr_equal(q, p);
    assert_int_equal(mapping_calls_since(from), 0);
    assert_int_equal(snap(a).physical_bytes, 66 * MiB);
    tu_free(a, q, S1);
    from = fake_call_count();
    q = alloc_in(a, 62 * MiB, T, S1, 0); /* 4 MiB over, more than 62 MiB / 32: not served whole */
    assert_ptr_not_equal(q, p);
    assert_true(mapping_calls_since(from) > 0);
    tu_free(a, q, S1);
    if (scoped) assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_check(a);
    tu_destroy(a);
  }
}

/* A run of a pooled mapping's handles that makes the request exactly serves before one that
 * makes up to 1/32 more, and that one, in place, before any driver call. */
static void an_exact_run_before_one_up_to_a_32nd_larger(void **state) {
  (void)state;
  for (int exact = 0; exact < 2; exact++) {
    vmm_arena *a = process_arena_bound(0, VMM_RETAIN_AUTO, 256 * MiB);
    size_t second = exact ? 64 * MiB : 8 * MiB;
    void *p66 = alloc_in(a, 66 * MiB, T, S1, 0), *p2 = alloc_in(a, second, T, S1, 0);
    tu_free(a, p66, S1);
    tu_free(a, p2, S1);
    char *z = alloc_in(a, 66 * MiB + second, T, S1, 0); /* stitched: the 66 MiB handle, then the other */
    tu_free(a, z, S1);
    fake_set_events_pending(1); /* z's work not known done: no retired range serves */
    size_t from = fake_call_count();
    void *r = alloc_in(a, 64 * MiB, T, S1, 0);
    assert_ptr_equal(r, exact ? z + 66 * MiB : z); /* the exact run, else the 66 MiB one, 2 MiB over */
    assert_int_equal(snap(a).run_hits, exact);
    assert_int_equal(snap(a).prefix_hits, !exact);
    assert_int_equal(mapping_calls_since(from), 0);
    assert_int_equal(snap(a).kind[T].pooled_bytes, exact ? 66 * MiB : 8 * MiB);
    fake_set_events_pending(0);
    tu_free(a, r, S1);
    tu_check(a);
    tu_destroy(a);
  }
}

/* A miss is assembled from pooled mappings whose work is not yet known complete (the device
 * is behind): their handles are mapped into the new range at once, and their old ranges stay
 * mapped, retiring: kept to serve again (below), unmapped by empty_cache. No new memory, no
 * host wait, no unmap on the way. */
static void assembly_takes_apart_early_and_the_old_ranges_retire(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *x = alloc_in(a, 4 * MiB, T, S1, 0), *y = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  fake_set_events_pending(1); /* the device is behind */
  size_t from = fake_call_count();
  void *z = alloc_in(a, 8 * MiB, T, S1, 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 1); /* the fence, recorded once */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 0); /* the same stream: in order already */
  assert_int_equal(usage(a).reserved_bytes, 8 * MiB);
  assert_true(fake_mapped_size_at(dp(x)) && fake_mapped_size_at(dp(y))); /* the old ranges still mapped */
  vmm_snapshot s = snap(a);
  assert_int_equal(s.retiring_ranges, 2);
  assert_int_equal(s.retiring_bytes, 8 * MiB);
  assert_int_equal(s.ranges_handed_to_retiring, 2);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  void *v = alloc_in(a, 2 * MiB, T, S1, 0);
  fake_set_events_pending(0); /* the device caught up: the old ranges are kept, whole, to serve again */
  from = fake_call_count();
  void *w = alloc_in(a, 2 * MiB, T, S1, 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_true(fake_mapped_size_at(dp(x)) && fake_mapped_size_at(dp(y)));
  assert_int_equal(snap(a).retiring_ranges, 2);
  assert_int_equal(fake_calls_since(0, VMM_DRV_stream_synchronize), 0);
  tu_free(a, z, S1);
  tu_free(a, w, S1);
  tu_free(a, v, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* the cache back to the driver, old ranges first */
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* A 4 MiB and a 6 MiB mapping on S1, freed: pooled, one handle each (whole_handles_arena). */
static void two_freed(vmm_arena *a, void **x, void **y) {
  *x = alloc_in(a, 4 * MiB, T, S1, 0);
  *y = alloc_in(a, 6 * MiB, T, S1, 0);
  tu_free(a, *x, S1);
  tu_free(a, *y, S1);
}

/* A retired range serves a request of its size again, as it is mapped, once its handles are
 * free: held by pooled mappings (which retire in its place; their other handles go idle) or
 * idle. One handle per request, so that no prefix hit serves first. No driver call on the way. */
static void a_retired_range_serves_again(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *x, *y;
  two_freed(a, &x, &y);
  void *z = alloc_in(a, 10 * MiB, T, S1, 0); /* from y's handle, then x's: both ranges retire */
  assert_true(z != x && z != y);
  assert_int_equal(snap(a).retiring_ranges, 2);
  tu_free(a, z, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* z's work known done: its other handle may go idle */
  size_t from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), x); /* z gives x's handle; y's goes idle */
  vmm_snapshot s = snap(a);
  assert_int_equal(s.kind[T].idle_count, 1);
  assert_int_equal(s.retiring_ranges, 2); /* y's and z's now */
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 0), y); /* from the idle handle */
  assert_int_equal(snap(a).kind[T].idle_count, 0);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  assert_ptr_equal(alloc_in(a, 10 * MiB, T, S1, 0), z); /* x and y give theirs, whole */
  assert_int_equal(mapping_calls_since(from), 0);
  s = snap(a);
  assert_int_equal(s.revived_ranges, 3);
  assert_int_equal(s.retiring_ranges, 2);
  assert_int_equal(usage(a).reserved_bytes, 10 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, z, S1);
  tu_destroy(a);
}

/* Served again on another stream: that stream is ordered after the givers' frees by an event,
 * with no host wait. A giver whose other handles would go idle before its work is known done
 * gives nothing: a run of its handles serves in place instead, ordered the same way. */
static void a_retired_range_keeps_stream_order(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(64 * MiB);
  void *x, *y;
  two_freed(a, &x, &y);
  void *z = alloc_in(a, 10 * MiB, T, S1, 0);
  tu_free(a, z, S1);
  fake_set_events_pending(1); /* z's work not known done: its handle of y would go idle early */
  size_t from = fake_call_count();
  void *w = alloc_in(a, 4 * MiB, T, S2, 0);
  assert_ptr_equal(w, (char *)z + 6 * MiB); /* x's handle, in place in z after y's */
  assert_int_equal(snap(a).revived_ranges, 0);
  assert_int_equal(snap(a).run_hits, 1);
  assert_int_equal(mapping_calls_since(from), 0);
  assert_true(fake_calls_since(from, VMM_DRV_stream_wait_event) >= 1); /* S2 after S1 */
  tu_free(a, w, S2);
  fake_set_events_pending(0);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* again, up to x and y in their own ranges */
  two_freed(a, &x, &y);
  z = alloc_in(a, 10 * MiB, T, S1, 0);
  tu_free(a, z, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), x);
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 0), y);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  fake_set_events_pending(1); /* x and y lie wholly inside z: they give, in stream order */
  from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 10 * MiB, T, S2, 0), z);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(mapping_calls_since(from), 0);
  assert_true(fake_calls_since(from, VMM_DRV_stream_wait_event) >= 1); /* S2 after S1 */
  assert_int_equal(snap(a).revived_ranges, 3);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, z, S2);
  tu_destroy(a);
}

/* Taken early, a shared pooled mapping gives its first handles only: the rest stays pooled in
 * place, with the work of its free, so that nothing goes idle before that work is done (an
 * idle handle serves any stream with no ordering). */
static void early_take_apart_leaves_the_rest_pooled(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0); /* first requests cut into 2 MiB handles */
  void *big = alloc_in(a, 6 * MiB, T, S1, 0), *small = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, big, S1);
  tu_free(a, small, S1);
  fake_set_events_pending(1);
  size_t from = fake_call_count();
  void *c = alloc_in(a, 8 * MiB, T, S1, 0); /* big whole, then the first 2 MiB of small */
  assert_int_equal(mapping_calls_since(from) - fake_calls_since(from, VMM_DRV_mem_map) -
                       fake_calls_since(from, VMM_DRV_mem_set_access),
                   0); /* no create, unmap or release */
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.retiring_ranges, 2);
  assert_int_equal(sn.retiring_bytes, 8 * MiB);
  assert_int_equal(sn.kind[T].pooled_bytes, 2 * MiB);
  assert_int_equal(sn.kind[T].idle_bytes, 0);
  from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 2 * MiB, T, S2, 0), (char *)small + 2 * MiB); /* the rest, in stream order */
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 1);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, (char *)small + 2 * MiB, S2);
  tu_free(a, c, S1);
  tu_destroy(a);
}

/* 260 ranges retire, their work pending: two 2 MiB mappings are taken whole into each of 130
 * 4 MiB ones, kept live in live[]. */
static void retire_260_ranges(vmm_arena *a, void **live, void **oldest) {
  fake_set_events_pending(1);
  for (int i = 0; i < 130; i++) {
    void *x = alloc_in(a, 2 * MiB, T, S1, 0), *y = alloc_in(a, 2 * MiB, T, S1, 0);
    if (oldest && i < 2) oldest[2 * i] = x, oldest[2 * i + 1] = y;
    tu_free(a, x, S1);
    tu_free(a, y, S1);
    live[i] = alloc_in(a, 4 * MiB, T, S1, 0);
  }
}

/* At most 256 retired ranges stay mapped to serve again; beyond, the oldest go, but only once
 * their work is known complete. */
static void retired_ranges_kept_at_most_256_once_complete(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *live[130], *oldest[4];
  retire_260_ranges(a, live, oldest);
  assert_int_equal(snap(a).retiring_ranges, 260); /* none known complete: none unmapped */
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_unmap), 0);
  fake_set_events_pending(0);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  void *more = alloc_in(a, 6 * MiB, T, S1, 0); /* a new range: the oldest four go */
  assert_int_equal(snap(a).retiring_ranges, 256);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_unmap), 4);
  for (int i = 0; i < 4; i++) { /* the ranges of the first two rounds, not the newest */
    size_t at = tu_first_call(0, VMM_DRV_mem_unmap);
    while (at != SIZE_MAX && fake_call_at(at)->a0 != dp(oldest[i])) at = tu_first_call(at + 1, VMM_DRV_mem_unmap);
    assert_true(at != SIZE_MAX);
  }
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, more, S1);
  for (int i = 0; i < 130; i++) tu_free(a, live[i], S1);
  tu_destroy(a);
}

/* A run of a retired range's handles serves a smaller request in place, with no driver call,
 * once its handles are free: one idle, one held by a pooled mapping whose work is done (it
 * retires in its place); the part of the range before the run stays retired. No pooled mapping
 * has a run of the size and no retired range is of it, so nothing else could serve. */
static void a_run_of_a_retired_range_serves_in_place(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *c = alloc_in(a, 8 * MiB, T, S1, 0), *b = alloc_in(a, 4 * MiB, T, S1, 0), *x = alloc_in(a, 2 * MiB, T, S1, 0);
  assert_int_equal(fake_write(dp(b), "B", 2), 0); /* what handle B holds, wherever it is mapped */
  tu_free(a, c, S1);
  tu_free(a, b, S1);
  tu_free(a, x, S1);
  void *w = alloc_in(a, 14 * MiB, T, S1, 0); /* [C 8, B 4, A 2]: c, b and x taken whole */
  tu_free(a, w, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  void *v = alloc_in(a, 16 * MiB, T, S1, 0); /* w taken whole, its range retires: [C, B, A] at w */
  assert_true(v != w);
  tu_free(a, v, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  void *u = alloc_in(a, 10 * MiB, T, S1, 0); /* C and A from v, which is unmapped: B goes idle */
  tu_free(a, u, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.kind[T].idle_count, 2); /* B and the handle v created */
  size_t from = fake_call_count();
  void *r = alloc_in(a, 6 * MiB, T, S1, 0); /* [B, A] of w's old range, 8 MiB into it */
  assert_ptr_equal(r, (char *)w + 8 * MiB);
  assert_int_equal(mapping_calls_since(from), 0);
  char got[2];
  assert_int_equal(fake_read(dp(r), got, 2), 0);
  assert_string_equal(got, "B");
  s = snap(a);
  assert_int_equal(s.revived_runs, 1);
  assert_int_equal(s.kind[T].idle_count, 2); /* B left the idle tier; u's C went to it */
  assert_true(fake_mapped_size_at(dp(w))); /* the part before the run, [C], still retired */
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, r, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(w)), 0);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* ---- Growing in place (VMMARENA_GROW) -------------------------------------------------- */

/* Whole-process mode with growth on: one handle per new request of up to 64 MiB, VA
 * reservations of `reserve` bytes. */
static vmm_arena *growing_arena(size_t reserve) {
  vmm_config c = process_config();
  c.handle_bound_bytes = 64 * MiB;
  c.reserve_bytes = reserve;
  c.grow_in_place = 1;
  return tu_arena(NULL, &c);
}

/* Checks that the last mapping calls since `from` mapped one handle of `bytes` at `at` and gave
 * only it access, and unmapped nothing. */
static void expect_mapped_beside(size_t from, CUdeviceptr at, size_t bytes) {
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_set_access), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  for (size_t i = from; i < fake_call_count(); i++) {
    const fake_call *k = fake_call_at(i);
    if (k->entry == VMM_DRV_mem_map || k->entry == VMM_DRV_mem_set_access) {
      assert_int_equal(k->a0, at);
      assert_int_equal(k->a1, bytes);
    }
  }
}

/* A miss grows a pooled mapping in place: its handle stays mapped where it was (what it holds
 * is still there), the new memory is mapped in the free VA right after it, and only that is
 * given access. Its range does not retire. Ranges are placed with free VA on both sides. */
static void a_pooled_mapping_grows_in_place(void **state) {
  (void)state;
  vmm_arena *a = growing_arena(64 * GiB);
  void *x = alloc_in(a, 4 * MiB, T, S1, 0);
  assert_int_equal(fake_write(dp(x), "x", 2), 0);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 6 * MiB, T, S1, 0);
  assert_ptr_equal(y, x);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1); /* the 2 MiB the cache lacked */
  expect_mapped_beside(from, dp(x) + 4 * MiB, 2 * MiB);
  char got[2];
  assert_int_equal(fake_read(dp(y), got, 2), 0);
  assert_string_equal(got, "x");
  assert_true(fake_access_granted(dp(y), 0) && fake_access_granted(dp(y) + 4 * MiB, 0));
  vmm_snapshot s = snap(a);
  assert_int_equal(s.grown_in_place, 1);
  assert_int_equal(s.retiring_ranges, 0);
  assert_int_equal(s.assembled_idle_handles, 0); /* x's handle was not mapped again */
  assert_int_equal(usage(a).reserved_bytes, 6 * MiB);
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, y, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* the grown mapping unmapped whole */
  assert_int_equal(fake_mapped_size_at(dp(y)), 0);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* Where the VA after a pooled mapping is not free (here: the end of its reservation), it grows
 * downwards into the free VA before it; where neither side is free, the miss is assembled in
 * a fresh range as before. */
static void a_pooled_mapping_grows_down_or_not_at_all(void **state) {
  (void)state;
  vmm_arena *a = growing_arena(16 * MiB); /* too small to spread: ranges come from the top */
  void *x = alloc_in(a, 8 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 12 * MiB, T, S1, 0);
  assert_ptr_equal(y, (char *)x - 4 * MiB);
  expect_mapped_beside(from, dp(y), 4 * MiB);
  tu_free(a, y, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  from = fake_call_count();
  void *z = alloc_in(a, 20 * MiB, T, S1, 0); /* no room on either side of the 12 MiB: a new reservation */
  assert_true(z != y);
  assert_int_equal(snap(a).reservations, 2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 3); /* both old handles mapped again, and 8 MiB new */
  vmm_snapshot s = snap(a);
  assert_int_equal(s.grown_in_place, 1);
  assert_int_equal(s.retiring_ranges, 1); /* y's old range */
  assert_int_equal(vmm_arena_check(a, NULL, 0), VMM_OK);
  tu_free(a, z, S1);
  tu_destroy(a);
}

/* A growth that fails at its Nth creation, mapping or access (upwards, and downwards where the
 * rest goes before the kept mapping) leaves the arena as it was: the pooled mapping mapped
 * where it was with its contents, nothing more held, nothing left mapped or created; then the
 * same request grows it. */
static void a_failed_growth_leaves_the_arena_as_it_was(void **state) {
  (void)state;
  static const vmm_driver_entry entries[] = {VMM_DRV_mem_create, VMM_DRV_mem_map, VMM_DRV_mem_set_access};
  for (int down = 0; down < 2; down++)
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
      for (unsigned nth = 1;; nth++) {
        vmm_arena *a = growing_arena(down ? 16 * MiB : 64 * GiB); /* 16 MiB: ranges from the top, no room above */
        void *x = alloc_in(a, 8 * MiB, T, S1, 0);
        void *w = alloc_in(a, 2 * MiB, T, S1, 0); /* the rest: one idle handle and one new */
        assert_int_equal(fake_write(dp(x), "x", 2), 0);
        tu_free(a, x, S1);
        tu_free(a, w, S1);
        assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
        fake_ledger before, after;
        fake_get_ledger(&before);
        fake_fail_nth(entries[e], nth, CUDA_ERROR_UNKNOWN, 0);
        void *y = NULL;
        vmm_status st = vmm_arena_alloc_in(a, 12 * MiB, T, S1, 0, &y);
        unsigned fired = fake_faults_fired();
        fake_clear_faults();
        if (!fired) { /* every such call of the growth has failed once */
          assert_int_equal(st, VMM_OK);
          assert_int_equal(snap(a).grown_in_place, 1);
          assert_ptr_equal(y, down ? (char *)x - 4 * MiB : x);
          tu_free(a, y, S1);
          tu_destroy(a);
          break;
        }
        assert_int_equal(st, VMM_ERR_DRIVER);
        assert_null(y);
        fake_get_ledger(&after);
        assert_int_equal(after.live_handles, before.live_handles);
        assert_int_equal(after.live_handle_bytes, before.live_handle_bytes);
        assert_int_equal(after.mapped_bytes, before.mapped_bytes);
        assert_int_equal(after.errors, 0);
        assert_int_equal(usage(a).reserved_bytes, 10 * MiB);
        char got[2];
        assert_int_equal(fake_read(dp(x), got, 2), 0);
        assert_string_equal(got, "x");
        tu_check(a);
        assert_int_equal(vmm_arena_alloc_in(a, 12 * MiB, T, S1, 0, &y), VMM_OK);
        assert_int_equal(fake_read(dp(x), got, 2), 0);
        assert_string_equal(got, "x");
        tu_free(a, y, S1);
        vmm_arena_destroy(a); /* a failed call's error stays the arena's first */
        assert_true(fake_ledger_clean());
      }
}

/* In a capture, a graph's request grows a pooled mapping of its own pool in place: the graph's
 * replays keep using the kept part's address, which stays mapped, and nothing of the graph's
 * memory reaches the shared cache. An eager request never grows the graph's mapping. After
 * the pool's release the grown mapping goes back to the shared cache and empty_cache gives it
 * back whole. */
static void a_graph_grows_its_own_memory_in_place(void **state) {
  (void)state;
  vmm_arena *a = growing_arena(64 * GiB);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S1, 1);
  void *x = alloc_in(a, 4 * MiB, T, S1, 7);
  tu_free(a, x, S1);
  void *e = alloc_in(a, 6 * MiB, T, S2, 0); /* eager, on another stream: not from the graph's memory */
  assert_true((char *)e + 6 * MiB <= (char *)x || (char *)e >= (char *)x + 4 * MiB);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 6 * MiB, T, S1, 7);
  assert_ptr_equal(y, x);
  expect_mapped_beside(from, dp(x) + 4 * MiB, 2 * MiB);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.grown_in_place, 1);
  assert_int_equal(s.retiring_ranges, 0);
  tu_free(a, y, S1);
  tu_free(a, e, S2);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* the graph lives: its memory stays mapped */
  assert_true(fake_mapped_size_at(dp(y)) && fake_mapped_size_at(dp(y) + 4 * MiB));
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(y)), 0);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* With growth off (VMMARENA_GROW=off) the same miss maps every handle in a fresh range, and
 * ranges are packed: the setting is what changes the behaviour. */
static void growth_off_assembles_in_a_fresh_range(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena(); /* tu_config: growth off */
  void *x = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 6 * MiB, T, S1, 0);
  assert_true(y != x);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 2);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.grown_in_place, 0);
  assert_int_equal(s.retiring_ranges, 1);
  tu_free(a, y, S1);
  tu_destroy(a);
}

/* Pausing memory whose handles a retired range also maps unmaps that range first, so that the
 * release frees the memory and nothing can serve from a released handle. */
static void pause_unmaps_the_retired_ranges_of_its_handles(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *x, *y;
  two_freed(a, &x, &y);
  vmm_tag_push("t");
  void *z = alloc_in(a, 10 * MiB, T, S1, 0);
  vmm_tag_pop();
  assert_int_equal(snap(a).retiring_ranges, 2);
  assert_int_equal(vmm_arena_pause(a, "t", VMM_PAUSE_DISCARD), VMM_OK);
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  assert_int_equal(fake_mapped_size_at(dp(y)), 0);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_handles, 0);
  assert_int_equal(vmm_arena_resume(a, "t"), VMM_OK);
  tu_free(a, z, S1);
  tu_destroy(a);
}

/* Taken early on another stream: the request's stream is ordered after the freeing stream's
 * work by an event, with no host wait. Inside a capture nothing is taken early: new memory. */
static void early_take_apart_orders_the_stream_and_never_in_a_capture(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *x = alloc_in(a, 8 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  fake_set_events_pending(1);
  assert_int_equal(vmm_arena_capture_begin(a, 3), VMM_OK);
  fake_set_capturing(S2, 1);
  size_t from = fake_call_count();
  void *g = alloc_in(a, 4 * MiB, T, S2, 3);
  assert_true(fake_calls_since(from, VMM_DRV_mem_create) > 0); /* a graph's memory: new */
  fake_set_capturing(S1, 1);
  from = fake_call_count();
  void *c = alloc_in(a, 10 * MiB, T, S1, 0); /* shared, on the stream that freed x, but capturing */
  assert_true(fake_calls_since(from, VMM_DRV_mem_create) > 0);
  assert_int_equal(snap(a).retiring_ranges, 0);
  fake_set_capturing(S1, 0);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 3), VMM_OK);
  from = fake_call_count();
  void *y = alloc_in(a, 10 * MiB, T, S2, 0); /* x whole, early, and 2 MiB new */
  size_t record = tu_first_call(from, VMM_DRV_event_record), wait = tu_first_call(from, VMM_DRV_stream_wait_event);
  assert_true(record != SIZE_MAX && wait != SIZE_MAX && record < wait);
  assert_int_equal(fake_call_at(wait)->a0, (uintptr_t)S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(snap(a).retiring_ranges, 1);
  /* empty_cache may wait on the host: the retiring range is unmapped */
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_handle_bytes, 24 * MiB); /* y, g and c */
  fake_set_events_pending(0);
  tu_free(a, c, S1);
  tu_free(a, y, S2);
  tu_free(a, g, S2);
  assert_int_equal(vmm_arena_release_pool(a, 3), VMM_OK);
  tu_destroy(a);
}

/* empty_cache never unmaps a retiring range whose stream captures (it cannot be waited for,
 * and its work may still run): the range stays mapped until a later empty_cache, once the
 * capture ended, waits for its stream. */
static void empty_cache_keeps_the_retiring_range_of_a_capturing_stream(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *x = tu_alloc(a, 8 * MiB, T, S1);
  fake_set_events_pending(1);
  tu_free(a, x, S1); /* its kernel on S1 not known done */
  void *y = tu_alloc(a, 10 * MiB, T, S2); /* x whole, early, and 2 MiB new: x's range retires */
  assert_int_equal(snap(a).retiring_ranges, 1);
  assert_int_equal(vmm_arena_capture_begin(a, 3), VMM_OK);
  fake_set_capturing(S1, 1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(snap(a).retiring_ranges, 1);
  assert_int_equal(tu_mapped_from(x, 8 * MiB), 8 * MiB);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 3), VMM_OK);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* S1 waited for now */
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  fake_set_events_pending(0);
  tu_free(a, y, S2);
  assert_int_equal(vmm_arena_release_pool(a, 3), VMM_OK);
  tu_destroy(a);
}

/* ---- VMMARENA_REFILL ------------------------------------------------------------------ */

/* a, holding three pooled 2 MiB mappings after an empty_cache that left its high-water mark
 * (and its live peak) at 16 MiB. */
static vmm_arena *with_three_pooled(vmm_arena *a) {
  tu_free(a, alloc_in(a, 16 * MiB, T, S1, 0), S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  void *p[3];
  for (int i = 0; i < 3; i++) p[i] = alloc_in(a, 2 * MiB, T, S1, 0);
  for (int i = 0; i < 3; i++) tu_free(a, p[i], S1);
  assert_int_equal(usage(a).reserved_bytes, 6 * MiB);
  return a;
}

static vmm_arena *refill_arena_with_three_pooled(double share) {
  return with_three_pooled(process_arena_refill(0, VMM_RETAIN_AUTO, 64 * MiB, share));
}

/* A 6 MiB miss on with_three_pooled's arena, refilled: one new handle, the arena then holding
 * 12 MiB, the three cached mappings untouched. */
static void *refilled_6_mib(vmm_arena *a) {
  size_t from = fake_call_count();
  void *x = alloc_in(a, 6 * MiB, T, S1, 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 1);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.refills, 1);
  assert_int_equal(s.assemblies, 0);
  assert_int_equal(s.retained_reusable_handles, 3);
  assert_int_equal(usage(a).reserved_bytes, 12 * MiB);
  return x;
}

/* below-peak:0.9: a miss that would map three cached handles gets one new handle while the
 * arena then holds at most 0.9 of its high-water mark (12 of 14.4 MiB); above it (22 MiB) it is
 * assembled, with no new memory. The cached mappings stay pooled meanwhile. */
static void refill_creates_below_the_high_water_mark(void **state) {
  (void)state;
  vmm_arena *a = refill_arena_with_three_pooled(0.9);
  void *x = refilled_6_mib(a);
  tu_free(a, x, S1);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 10 * MiB, T, S1, 0); /* 12 + 10 > 14.4 MiB: assembled from the cache */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.refills, 1);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(usage(a).reserved_bytes, 12 * MiB);
  tu_free(a, y, S1);
  tu_destroy(a);
}

/* Off (the default) the same miss is assembled; on, a plan of one cached handle (and new memory
 * for the rest) is assembled too: one new handle would save nothing. */
static void refill_only_for_several_handles(void **state) {
  (void)state;
  vmm_arena *a = refill_arena_with_three_pooled(0.0);
  size_t from = fake_call_count();
  tu_free(a, alloc_in(a, 6 * MiB, T, S1, 0), S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  assert_int_equal(snap(a).refills, 0);
  assert_int_equal(snap(a).assemblies, 1);
  tu_destroy(a);

  a = process_arena_refill(0, VMM_RETAIN_AUTO, 64 * MiB, 0.9);
  tu_free(a, alloc_in(a, 16 * MiB, T, S1, 0), S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  tu_free(a, alloc_in(a, 4 * MiB, T, S1, 0), S1);
  tu_free(a, alloc_in(a, 6 * MiB, T, S1, 0), S1); /* the pooled 4 MiB handle + 2 MiB new */
  vmm_snapshot s = snap(a);
  assert_int_equal(s.refills, 0);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.assembly_created_bytes, 2 * MiB);
  tu_destroy(a);
}

/* A refill whose new memory is refused is assembled instead, from the cached handles: the
 * request is served, nothing is lost, and the refusal is not the request's. */
static void a_refused_refill_is_assembled(void **state) {
  (void)state;
  vmm_arena *a = refill_arena_with_three_pooled(0.9);
  fake_fail_nth(VMM_DRV_mem_create, 1, CUDA_ERROR_OUT_OF_MEMORY, 0);
  void *x = alloc_in(a, 6 * MiB, T, S1, 0);
  fake_clear_faults();
  vmm_snapshot s = snap(a);
  assert_int_equal(s.refills, 0);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(usage(a).refusals, 0);
  assert_int_equal(usage(a).reserved_bytes, 6 * MiB);
  tu_check(a);
  tu_free(a, x, S1);
  tu_destroy(a);
}

static vmm_arena *process_arena_refill_live(double live_share) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.handle_bound_bytes = 64 * MiB;
  c.refill_live_share = live_share;
  return tu_arena(NULL, &c);
}

/* within-live:1.25 after a live peak of 16 MiB, with three pooled 2 MiB mappings (6 MiB held):
 * a miss of 6 MiB gets one new handle, the arena then holding 12 MiB, at most 1.25 times the
 * live peak (20 MiB); the cached mappings stay pooled. With those 6 MiB live, a miss of 14 MiB
 * would make it hold 26 MiB, over 1.25 times the 20 MiB then live: it is assembled from the three
 * cached handles and 8 MiB new. */
static void refill_creates_within_a_share_of_the_live_peak(void **state) {
  (void)state;
  vmm_arena *a = with_three_pooled(process_arena_refill_live(1.25));
  void *x = refilled_6_mib(a);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 14 * MiB, T, S1, 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 4);
  vmm_snapshot s = snap(a);
  assert_int_equal(s.refills, 1);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.assembly_created_bytes, 8 * MiB);
  assert_int_equal(usage(a).reserved_bytes, 20 * MiB);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  tu_destroy(a);
}

/* The request's own bytes count as live: after a live peak of 6 MiB (three 2 MiB mappings,
 * pooled), a miss of 12 MiB under within-live:1.5 may make the arena hold 18 MiB, 1.5 times the
 * 12 MiB then live, and gets one new handle; under within-live:1 it is assembled (its plan maps
 * the three cached handles and 6 MiB new). */
static void refill_counts_the_request_as_live(void **state) {
  (void)state;
  for (int on = 1; on >= 0; on--) {
    vmm_arena *a = process_arena_refill_live(on ? 1.5 : 1.0);
    void *p[3];
    for (int i = 0; i < 3; i++) p[i] = alloc_in(a, 2 * MiB, T, S1, 0);
    for (int i = 0; i < 3; i++) tu_free(a, p[i], S1);
    void *x = alloc_in(a, 12 * MiB, T, S1, 0);
    vmm_snapshot s = snap(a);
    assert_int_equal(s.refills, on);
    assert_int_equal(s.assemblies, !on);
    assert_int_equal(usage(a).reserved_bytes, on ? 18 * MiB : 12 * MiB);
    tu_free(a, x, S1);
    tu_destroy(a);
  }
}

/* ---- record_stream -------------------------------------------------------------------- */

static void record_stream_orders_reuse_of_a_mapping(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  void *p = alloc_in(a, 4 * MiB, T, S1, 0);
  assert_int_equal(vmm_arena_record_stream(a, p, S2), VMM_OK);
  assert_int_equal(vmm_arena_record_stream(a, p, S2), VMM_OK); /* twice: once */
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), p); /* its own stream, but S2 used it */
  tu_assert_event_orders(from, S2, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 1);
  tu_free(a, p, S1);
  from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), p); /* the added stream was forgotten at the hit */
  assert_int_equal(fake_call_count(), from);
  tu_free(a, p, S1);
  assert_int_equal(vmm_arena_record_stream(a, p, S2), VMM_ERR_UNKNOWN_POINTER);
  tu_destroy(a);
}

static void record_stream_orders_reuse_of_a_slot(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(0);
  char *x = alloc_in(a, 512, T, S1, 0);
  char *keep = alloc_in(a, 512, T, S1, 0);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  size_t from = fake_call_count();
  tu_free(a, x, S1);
  size_t record = tu_first_call(from, VMM_DRV_event_record);
  assert_true(record != SIZE_MAX);
  assert_int_equal(fake_call_at(record)->a1, (uintptr_t)S2);
  uintptr_t event = fake_call_at(record)->a0;
  assert_int_equal(usage(a).page_slots_used, 2); /* the slot waits: not free yet */
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_ERR_UNKNOWN_POINTER);
  from = fake_call_count();
  char *y = alloc_in(a, 512, T, S1, 0);
  size_t wait = tu_first_call(from, VMM_DRV_stream_wait_event);
  assert_true(wait != SIZE_MAX);
  assert_int_equal(fake_call_at(wait)->a0, (uintptr_t)S1);
  assert_int_equal(fake_call_at(wait)->a1, event);
  assert_ptr_equal(y, x); /* given back once ordered, and taken first */
  tu_free(a, y, S1);
  tu_free(a, keep, S1);
  assert_int_equal(usage(a).pages, 0);
  tu_destroy(a);
}

/* empty_cache gives back a page whose last slot still waits for another stream's work (the
 * device behind): that stream is waited for on the host first, then the page unmapped; with
 * its synchronize refused, the call fails and the slot keeps waiting (a fuzz_process input
 * found the page held after everything was freed and the cache emptied). */
static void empty_cache_waits_for_a_slots_other_stream(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  fake_set_event_lag(1000);
  char *x = tu_alloc(a, 512, T, S1);
  tu_use(x, S2);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  tu_free(a, x, S1);
  assert_int_equal(usage(a).page_slots_used, 1); /* waits for S2 */
  fake_fail_nth(VMM_DRV_stream_synchronize, 1, CUDA_ERROR_UNKNOWN, 1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_ERR_DRIVER);
  assert_non_null(strstr(vmm_arena_last_error(a), "which used a slot of the page"));
  assert_int_equal(usage(a).page_slots_used, 1);
  fake_clear_faults();
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_true(tu_first_call(from, VMM_DRV_stream_synchronize) != SIZE_MAX);
  vmm_usage u = usage(a);
  assert_int_equal(u.pages, 0);
  assert_int_equal(u.reserved_bytes, 0);
  tu_destroy(a);
}

/* A slot that two other streams used is given back only once the page's stream is ordered
 * after both: while one of them captures (no event can be recorded on it), the slot stays
 * taken, even though the other's event has been waited for. */
static void a_slot_used_by_two_streams_waits_for_both(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  char *x = alloc_in(a, 512, T, S1, 0);
  char *keep = alloc_in(a, 512, T, S1, 0);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  assert_int_equal(vmm_arena_record_stream(a, x, S3), VMM_OK);
  fake_set_capturing(S3, 1);
  tu_free(a, x, S1);
  char *y = alloc_in(a, 512, T, S1, 0); /* S2's event waited for; S3's not recorded yet */
  assert_true(y != x);
  assert_int_equal(usage(a).page_slots_used, 3);
  tu_check(a);
  fake_set_capturing(S3, 0);
  char *z = alloc_in(a, 512, T, S1, 0); /* now ordered after S3 too */
  assert_ptr_equal(z, x);
  assert_int_equal(usage(a).page_slots_used, 3);
  tu_free(a, z, S1);
  tu_free(a, y, S1);
  tu_free(a, keep, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).pages, 0);
  tu_destroy(a);
}

/* record_stream is kept per slot: a slot recorded on a stream that already used another slot
 * of the same page waits for that stream too before the page's stream takes it again. */
static void record_stream_on_two_slots_of_a_page_keeps_both(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  char *x = tu_alloc(a, 512, T, S1);
  char *y = tu_alloc(a, 512, T, S1);
  char *keep = tu_alloc(a, 512, T, S1);
  tu_use(x, S2);
  assert_int_equal(vmm_arena_record_stream(a, x, S2), VMM_OK);
  tu_use(y, S2);
  assert_int_equal(vmm_arena_record_stream(a, y, S2), VMM_OK);
  fake_set_events_pending(1); /* S2's kernels not known done */
  tu_free(a, y, S1);
  assert_int_equal(usage(a).page_slots_used, 3); /* y waits for S2 */
  char *z = tu_alloc(a, 512, T, S1);
  assert_true(z != y);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  fake_set_events_pending(0);
  tu_free(a, x, S1);
  tu_free(a, z, S1);
  tu_free(a, keep, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).pages, 0);
  tu_destroy(a);
}

/* ---- Graph pools and captures --------------------------------------------------------- */

static void a_pool_keeps_its_memory(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *g = alloc_in(a, 6 * MiB, T, S1, 7);
  void *gs = alloc_in(a, 512, T, S1, 7);
  tu_free(a, g, S1);
  tu_free(a, gs, S1);
  void *e = alloc_in(a, 6 * MiB, T, S1, 0); /* eager: not the graph's */
  assert_ptr_not_equal(e, g);
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 7), g); /* the graph's, again */
  tu_free(a, g, S1);
  tu_free(a, e, S1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 1); /* its last replay is over */
  void *x = alloc_in(a, 6 * MiB, T, S1, 0), *y = alloc_in(a, 6 * MiB, T, S1, 0);
  assert_true((x == g || y == g) && (x == e || y == e)); /* both shared now */
  void *p;
  assert_int_equal(vmm_arena_alloc_in(a, 4096, T, S1, 7, &p), VMM_ERR_INVALID_ARGUMENT);
  assert_null(p);
  assert_int_equal(vmm_arena_release_pool(a, VMM_POOL_SHARED), VMM_ERR_INVALID_ARGUMENT);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  tu_destroy(a);
}

/* Pooled memory of a graph's pool is not taken apart for other requests, even complete. */
static void a_graph_pool_is_never_taken_apart(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *x = alloc_in(a, 4 * MiB, T, S1, 7), *y = alloc_in(a, 4 * MiB, T, S1, 7);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* complete: only the pool keeps them apart */
  size_t from = fake_call_count();
  void *z = alloc_in(a, 8 * MiB, T, S1, 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_true(fake_calls_since(from, VMM_DRV_mem_create) > 0);
  assert_int_equal(usage(a).reserved_bytes, 16 * MiB);
  void *x2 = alloc_in(a, 4 * MiB, T, S1, 7);
  assert_true(x2 == x || x2 == y); /* still the pool's */
  tu_free(a, x2, S1);
  tu_free(a, z, S1);
  tu_destroy(a);
}

/* Inside a capture a graph's freed memory serves other sizes of its pool: a larger request
 * takes it whole, with new memory only for the rest; a smaller one its first handles, the rest
 * staying pooled in the pool. The handles are mapped into the new range and the old range stays
 * mapped until the pool is released (the graph's replays use both addresses). No handle of a
 * live graph reaches the shared cache or another pool. */
static void a_graph_reuses_its_memory_in_new_ranges(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S1, 1);
  void *x = alloc_in(a, 4 * MiB, T, S1, 7);
  tu_free(a, x, S1);
  fake_ledger before, after;
  fake_get_ledger(&before);
  size_t from = fake_call_count();
  void *y = alloc_in(a, 6 * MiB, T, S1, 7);
  fake_get_ledger(&after);
  assert_int_equal(after.live_handle_bytes - before.live_handle_bytes, 2 * MiB); /* only the rest is new */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 0); /* the same stream: no driver call to order */
  assert_true(fake_mapped_size_at(dp(x)) > 0);
  assert_int_equal(snap(a).retiring_ranges, 1);
  tu_free(a, y, S1);
  from = fake_call_count();
  void *z = alloc_in(a, 4 * MiB, T, S1, 7); /* smaller than y: y's first handles, in place */
  assert_ptr_equal(z, y);
  assert_int_equal(mapping_calls_since(from), 0);
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.prefix_hits, 1);
  assert_int_equal(sn.retiring_ranges, 1);            /* x's range */
  assert_int_equal(sn.kind[T].pooled_bytes, 2 * MiB); /* the rest of y, still the pool's */
  assert_int_equal(sn.kind[T].idle_bytes, 0);        /* nothing of the graph's reaches the shared cache */
  void *e = alloc_in(a, 2 * MiB, T, S1, 0);          /* an eager request: new memory */
  assert_true((char *)e < (char *)y || (char *)e >= (char *)y + 6 * MiB);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* its work complete, but the graph replays it */
  tu_free(a, alloc_in(a, 2 * MiB, T, S1, 0), S1);
  assert_true(fake_mapped_size_at(dp(x)) > 0);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* the graph lives: its ranges and its pool stay */
  assert_true(fake_mapped_size_at(dp(x)) > 0);
  assert_int_equal(snap(a).retiring_ranges, 1);
  assert_int_equal(snap(a).kind[T].pooled_bytes, 2 * MiB);
  tu_free(a, e, S1);
  tu_free(a, z, S1); /* takes its tail back: y whole again, beside e */
  assert_int_equal(snap(a).kind[T].pooled_count, 2);
  assert_int_equal(snap(a).kind[T].pooled_bytes, 8 * MiB);
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 7), y); /* an exact hit of the whole */
  tu_free(a, y, S1);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK); /* after the device's work: x's range unmapped */
  assert_int_equal(fake_mapped_size_at(dp(x)), 0);
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* A request larger than any of a graph's pooled mappings takes the largest whole and the first
 * handles of the next; what is left of that one stays pooled in the pool, its taken part's
 * range retiring. */
static void a_graph_takes_a_pooled_mappings_first_handles(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S1, 1);
  void *big = alloc_in(a, 6 * MiB, T, S1, 7), *small = alloc_in(a, 4 * MiB, T, S1, 7);
  tu_free(a, big, S1);
  tu_free(a, small, S1);
  size_t from = fake_call_count();
  void *c = alloc_in(a, 8 * MiB, T, S1, 7);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0); /* 6 MiB whole, then 2 of the 4 */
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.retiring_ranges, 2);
  assert_int_equal(sn.retiring_bytes, 8 * MiB);
  assert_int_equal(sn.kind[T].pooled_bytes, 2 * MiB); /* the rest of the 4 MiB one, the pool's */
  assert_int_equal(sn.kind[T].idle_bytes, 0);
  assert_true(fake_mapped_size_at(dp(small)) > 0 && fake_mapped_size_at(dp(small) + 2 * MiB) > 0);
  tu_free(a, c, S1);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  assert_int_equal(snap(a).retiring_ranges, 0);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* A graph's request takes a shared pooled mapping of its size whole, with no driver call, once
 * that mapping's free is known complete (a capture cannot be ordered after another stream),
 * and never before; the mapping is the graph's until its pool is released. */
static void a_graph_takes_a_complete_shared_mapping_whole(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  fake_set_event_lag(1000); /* the device never catches up on its own */
  fake_advance_clock(1);    /* work from now on is behind */
  void *x = alloc_in(a, 6 * MiB, T, S1, 0);
  tu_free(a, x, S1);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S2, 1);
  size_t from = fake_call_count();
  void *g = alloc_in(a, 6 * MiB, T, S2, 7); /* x's free may still run: new memory */
  assert_ptr_not_equal(g, x);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 1);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* as torch.cuda.graph's entry does */
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S2, 1);
  from = fake_call_count();
  void *h = alloc_in(a, 6 * MiB, T, S2, 7);
  assert_ptr_equal(h, x);
  assert_int_equal(mapping_calls_since(from), 0);
  tu_free(a, h, S2);
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S2, 7), x); /* the graph's now: its pool serves it */
  tu_free(a, x, S2);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  void *e = alloc_in(a, 6 * MiB, T, S1, 0); /* an eager request: not the live graph's memory */
  assert_true(e != x && e != g);
  tu_free(a, e, S1);
  tu_free(a, g, S2);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  assert_int_equal(snap(a).kind[T].pooled_count, 3);
  fake_set_event_lag(0);
  tu_destroy(a);
}

/* A graph's request is served by its own pool before the shared cache: with a mapping of its
 * size pooled in each (the shared one known complete, the newer), it takes its pool's, and the
 * shared one stays for the eager request after the capture. Taking the shared one would hold
 * both in the graph's pool until its release (kept graphs grew that way, 8 MiB a step). */
static void a_graph_takes_its_own_pool_before_the_shared_cache(void **state) {
  (void)state;
  vmm_arena *a = whole_handles_arena();
  void *s1 = alloc_in(a, 6 * MiB, T, S1, 0), *s2 = alloc_in(a, 6 * MiB, T, S1, 0);
  tu_free(a, s1, S1);
  tu_free(a, s2, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S2, 1);
  void *g = alloc_in(a, 6 * MiB, T, S2, 7); /* the graph's pool is empty: a shared one, whole */
  assert_true(g == s1 || g == s2);
  tu_free(a, g, S2);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  void *e = alloc_in(a, 6 * MiB, T, S1, 0); /* the other one: the graph's is not the shared pool's */
  assert_true(e != g && (e == s1 || e == s2));
  tu_free(a, e, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S2, 1);
  size_t from = fake_call_count();
  void *h = alloc_in(a, 6 * MiB, T, S2, 7);
  assert_ptr_equal(h, g);
  assert_int_equal(mapping_calls_since(from), 0);
  tu_free(a, h, S2);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  from = fake_call_count();
  assert_ptr_equal(alloc_in(a, 6 * MiB, T, S1, 0), e); /* still shared: a hit */
  assert_int_equal(mapping_calls_since(from), 0);
  tu_free(a, e, S1);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  tu_destroy(a);
}

/* empty_cache, and a finish, leave a live graph's pooled memory mapped (its replays use it);
 * once the pool is released, empty_cache gives it back, with what is freed after the release. */
static void a_live_graph_keeps_its_memory_through_empty_cache(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *g = alloc_in(a, 4 * MiB, T, S1, 7), *e = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, g, S1);
  tu_free(a, e, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(e)), 0);
  assert_true(fake_mapped_size_at(dp(g)) > 0);
  assert_int_equal(usage(a).reserved_bytes, 4 * MiB);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_true(fake_mapped_size_at(dp(g)) > 0);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 7), g);
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  tu_free(a, g, S1); /* freed after its pool was released: shared */
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* While a capture is underway, shared memory freed on a capturing stream waits for the capture
 * to end; the pool's own memory is reused within the capture. With no capture underway a free
 * asks the driver nothing. */
static void frees_during_a_capture(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *eager = alloc_in(a, 4 * MiB, T, S1, 0);
  assert_int_equal(vmm_arena_capture_begin(a, 3), VMM_OK);
  fake_set_capturing(S1, 1);
  void *g = alloc_in(a, 4 * MiB, T, S1, 3);
  tu_free(a, g, S1);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 3), g); /* within the capture */
  tu_free(a, eager, S1);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.deferred_frees, 1);
  assert_int_equal(fake_calls_since(0, VMM_DRV_stream_synchronize), 0);
  void *again = alloc_in(a, 4 * MiB, T, S1, 3);
  assert_ptr_not_equal(again, eager); /* deferred: not reused during the capture */
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 3), VMM_OK);
  assert_int_equal(vmm_arena_capture_end(a, 3), VMM_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), eager); /* pooled once the capture is over */
  assert_int_equal(fake_calls_since(0, VMM_DRV_stream_synchronize), 0);
  size_t from = fake_call_count();
  tu_free(a, eager, S1);
  assert_int_equal(fake_call_count(), from);
  tu_free(a, g, S1);
  tu_free(a, again, S1);
  assert_int_equal(vmm_arena_capture_begin(a, VMM_POOL_SHARED), VMM_ERR_INVALID_ARGUMENT);
  tu_destroy(a);
}

/* ---- Unmapping in the background (VMMARENA_UNMAP=background) ---------------------------- */

static vmm_arena *background_arena(void) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.handle_bound_bytes = 64 * MiB;
  c.unmap_in_background = 1;
  return tu_arena(NULL, &c);
}

/* A background arena with 260 retired ranges whose work is complete (live[]: the 130 live
 * mappings that hold their handles). */
static vmm_arena *background_arena_retired(void **live) {
  vmm_arena *a = background_arena();
  retire_260_ranges(a, live, NULL);
  fake_set_events_pending(0);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  return a;
}

static void free_live_and_destroy(vmm_arena *a, void **live) {
  for (int i = 0; i < 130; i++) tu_free(a, live[i], S1);
  tu_destroy(a);
}

/* Until the unmapper thread has unmapped every range handed to it. */
static void wait_for_unmapper(vmm_arena *a) {
  pthread_mutex_lock(&a->lock);
  vmm_unmapper_wait(a);
  pthread_mutex_unlock(&a->lock);
}

/* Until the thread has unmapped every range handed to it, their VA not yet collected. */
static void until_unmapped(vmm_arena *a) {
  for (bool busy = true; busy;) {
    pthread_mutex_lock(&a->unmapper.mu);
    busy = a->unmapper.done < a->unmapper.count;
    pthread_mutex_unlock(&a->unmapper.mu);
  }
}

/* Unmaps from `from` on, and of them those made off the test's thread. */
static size_t unmaps_since(size_t from, bool other_thread_only) {
  size_t n = 0;
  for (size_t i = from; i < fake_call_count(); i++)
    n += fake_call_at(i)->entry == VMM_DRV_mem_unmap && (!other_thread_only || fake_call_at(i)->other_thread);
  return n;
}

/* 260 retired ranges, then a graph's capture wants a new range: the oldest four are handed to
 * the arena's thread, which unmaps them in relaxed capture mode (the capture stays valid), and
 * their VA comes back at the next settle. */
static void retired_ranges_unmap_on_the_arenas_thread(void **state) {
  (void)state;
  void *live[130];
  vmm_arena *a = background_arena_retired(live);
  fake_set_strict_capture(1);
  assert_int_equal(vmm_arena_capture_begin(a, 5), VMM_OK);
  fake_set_capturing(S1, 1);
  size_t from = fake_call_count();
  void *g = alloc_in(a, 6 * MiB, T, S1, 5); /* a new range: the oldest four retired ones go */
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.retiring_ranges, 256);
  assert_int_equal(sn.unmapped_in_background, 4);
  until_unmapped(a);
  assert_int_equal(unmaps_since(from, true), 4);
  assert_int_equal(unmaps_since(from, false), 4); /* none on the allocating thread */
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.errors, 0);                 /* no unsafe call outside relaxed mode: the capture is valid */
  assert_int_equal(a->unmapper.bytes, 8 * MiB); /* unmapped, the VA not yet back */
  tu_check(a);                                   /* the VA accounting counts it */
  void *h = alloc_in(a, 10 * MiB, T, S1, 5);     /* the next new range: the VA comes back first */
  assert_int_equal(a->unmapper.bytes, 0);
  tu_free(a, h, S1);
  tu_free(a, g, S1);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 5), VMM_OK);
  fake_set_strict_capture(0);
  assert_int_equal(vmm_arena_release_pool(a, 5), VMM_OK);
  free_live_and_destroy(a, live);
}

/* The thread starts no unmap while the arena maps (the driver would make the mapping wait for
 * it); a wait for the queue from inside such a window still returns. */
static void the_thread_waits_while_the_arena_maps(void **state) {
  (void)state;
  void *live[130];
  vmm_arena *a = background_arena_retired(live);
  vmm_unmapper_mapping(a, +1); /* as an assembly on another thread would */
  size_t from = fake_call_count();
  void *g = alloc_in(a, 6 * MiB, T, S1, 0); /* four ranges handed over */
  assert_int_equal(snap(a).unmapped_in_background, 4);
  assert_int_equal(a->unmapper.quiet_ns, 1000000); /* the default (docs/design.md) */
  struct timespec nap = {0, 30 * 1000 * 1000};
  nanosleep(&nap, NULL);
  assert_int_equal(unmaps_since(from, false), 0);
  wait_for_unmapper(a); /* drains past the window */
  assert_int_equal(unmaps_since(from, true), 4);
  vmm_unmapper_mapping(a, -1);
  tu_check(a);
  tu_free(a, g, S1);
  free_live_and_destroy(a, live);
}

/* Requests come in bursts, so after a mapping the thread leaves a quiet time before it starts
 * an unmap: ranges handed over just after one are unmapped no sooner. */
static void the_thread_leaves_a_quiet_time_after_mapping(void **state) {
  (void)state;
  void *live[130];
  vmm_arena *a = background_arena_retired(live);
  a->unmapper.quiet_ns = 200 * 1000 * 1000; /* longer than a busy host takes to wake the thread */
  size_t from = fake_call_count();
  pthread_mutex_lock(&a->lock);
  vmm_unmapper_mapping(a, +1); /* as an assembly does */
  vmm_unmapper_mapping(a, -1);
  uint64_t mapped = a->unmapper.mapped_ns;
  vmm_retiring_settle(a); /* the oldest four ranges handed over */
  pthread_mutex_unlock(&a->lock);
  assert_int_equal(snap(a).unmapped_in_background, 4);
  until_unmapped(a);
  size_t seen = 0;
  for (size_t i = from; i < fake_call_count(); i++) {
    const fake_call *c = fake_call_at(i);
    if (c->entry != VMM_DRV_mem_unmap || !c->other_thread) continue;
    assert_true(c->ns >= mapped + a->unmapper.quiet_ns);
    seen++;
  }
  assert_int_equal(seen, 4);
  tu_check(a);
  free_live_and_destroy(a, live);
}

/* A handle goes back to the driver only once no range handed to the thread maps it: with the
 * thread's calls slowed, empty_cache still leaves no released handle mapped. */
static void empty_cache_waits_for_the_unmapper(void **state) {
  (void)state;
  void *live[130];
  vmm_arena *a = background_arena_retired(live);
  fake_set_other_thread_delay(20000);
  tu_free(a, alloc_in(a, 6 * MiB, T, S1, 0), S1); /* four ranges handed over */
  assert_int_equal(snap(a).unmapped_in_background, 4);
  for (int i = 0; i < 130; i++) tu_free(a, live[i], S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.released_mapped_bytes, 0);
  assert_int_equal(l.live_handle_bytes, 0);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_check(a);
  tu_destroy(a);
}

/* A failed unmap on the thread keeps its range stuck, out of the free VA, and logged; the arena
 * carries on, and destroy unmaps it. */
static void a_failed_background_unmap_keeps_its_range(void **state) {
  (void)state;
  void *live[130];
  vmm_arena *a = background_arena_retired(live);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  void *g = alloc_in(a, 6 * MiB, T, S1, 0);
  wait_for_unmapper(a);
  assert_int_equal(fake_faults_fired(), 1);
  assert_int_equal(a->ranges.stuck_bytes, 2 * MiB);
  assert_int_equal(a->unmapper.bytes, 0);
  tu_check(a);
  tu_free(a, g, S1);
  free_live_and_destroy(a, live);
}

/* While a capture is underway, the arena's calls run in relaxed capture mode, so that a
 * capture begun in global mode (torch.cuda.graph's) is not invalidated by them. */
static void calls_during_a_capture_are_relaxed(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  fake_set_strict_capture(1);
  assert_int_equal(vmm_arena_capture_begin(a, 4), VMM_OK);
  fake_set_capturing(S1, 1);
  size_t from = fake_call_count();
  void *g = alloc_in(a, 6 * MiB, T, S1, 4); /* new memory: create, map, grant */
  void *s = alloc_in(a, 512, T, S1, 4);      /* a page */
  assert_int_equal(fake_calls_since(from, VMM_DRV_thread_exchange_stream_capture_mode), 4); /* relax, restore */
  assert_int_equal(fake_call_at(from)->entry, VMM_DRV_thread_exchange_stream_capture_mode);
  assert_int_equal(fake_call_at(from)->a0, CU_STREAM_CAPTURE_MODE_RELAXED);
  tu_free(a, g, S1);
  tu_free(a, s, S1);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 4), VMM_OK);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.errors, 0); /* no unsafe call outside relaxed mode */
  from = fake_call_count();
  tu_free(a, alloc_in(a, 512, T, S2, 0), S2); /* no capture underway: the mode is left alone */
  assert_int_equal(fake_calls_since(from, VMM_DRV_thread_exchange_stream_capture_mode), 0);
  fake_set_strict_capture(0);
  tu_destroy(a);
}

/* ---- Giving memory back ---------------------------------------------------------------- */

static void empty_cache_releases_outside_a_scope_only(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_ON);
  void *live = alloc_in(a, 2 * MiB, T, S1, 0);
  void *p = alloc_in(a, 4 * MiB, T, S1, 0), *s = alloc_in(a, 512, T, S2, 0);
  tu_free(a, p, S1);
  tu_free(a, s, S2);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0); /* the scope keeps everything */
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 2 * MiB);
  void *q = alloc_in(a, 4 * MiB, T, S1, 0);
  tu_free(a, q, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_handle_bytes, 2 * MiB); /* only the live allocation */
  assert_int_equal(usage(a).cached_bytes, 0);
  tu_free(a, live, S1);
  tu_destroy(a);
}

/* Inside a retaining scope a package free is cached as outside one, with no host wait: not on
 * a stream that captures (into its graph's pool, or deferred for the shared pool: a wait would
 * invalidate the capture), nor on one that does not. Nothing is released before finish; a
 * package request of the same size is then a hit. */
static void a_package_free_in_a_scope_never_waits_for_its_stream(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_ON);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *eager = alloc_in(a, 4 * MiB, P, S2, 0);
  assert_int_equal(vmm_arena_capture_begin(a, 7), VMM_OK);
  fake_set_capturing(S1, 1);
  void *graph = alloc_in(a, 6 * MiB, P, S1, 7), *shared = alloc_in(a, 8 * MiB, P, S1, 0);
  size_t from = fake_call_count();
  tu_free(a, graph, S1);  /* its graph's pool: cached there */
  tu_free(a, shared, S1); /* the shared pool, on the capturing stream: deferred to the capture's end */
  tu_free(a, eager, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.errors, 0); /* nothing unsafe during the capture */
  void *again = alloc_in(a, 6 * MiB, P, S1, 7);
  assert_ptr_equal(again, graph); /* a hit in the graph's pool */
  tu_free(a, again, S1);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_arena_capture_end(a, 7), VMM_OK);
  from = fake_call_count();
  void *hit = alloc_in(a, 4 * MiB, P, S2, 0);
  assert_ptr_equal(hit, eager);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_map), 0);
  tu_free(a, hit, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0); /* the scope keeps everything */
  assert_int_equal(vmm_arena_release_pool(a, 7), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(usage(a).reserved_bytes, 0);
  tu_destroy(a);
}

/* New memory refused (the limit): the cache goes back to the driver and the request is made. */
static void refused_memory_releases_the_cache(void **state) {
  (void)state;
  vmm_arena *a = process_arena(10 * MiB, VMM_RETAIN_AUTO);
  void *s = alloc_in(a, 512, T, S1, 0);
  assert_int_equal(vmm_arena_record_stream(a, s, S2), VMM_OK);
  tu_free(a, s, S1); /* its page waits for S2 before it can be taken apart: cached, not usable */
  void *z = alloc_in(a, 10 * MiB, T, S1, 0);
  vmm_usage u = usage(a);
  assert_int_equal(u.cache_releases, 1);
  assert_int_equal(u.reserved_bytes, 10 * MiB);
  assert_int_equal(u.refusals, 0);
  void *w;
  assert_int_equal(vmm_arena_alloc_in(a, 2 * MiB, T, S1, 0, &w), VMM_ERR_OUT_OF_MEMORY); /* nothing cached left */
  assert_non_null(strstr(vmm_arena_last_error(a), "limit"));
  assert_int_equal(usage(a).refusals, 1);
  tu_free(a, z, S1);
  tu_destroy(a);
}

/* Idle handles alone are cache too: a page (exactly one granule, which a larger idle handle
 * never serves) refused new memory releases them and is made. */
static void refused_memory_releases_idle_handles(void **state) {
  (void)state;
  vmm_arena *a = process_arena_bound(10 * MiB, VMM_RETAIN_AUTO, 64 * MiB);
  void *x, *y;
  two_freed(a, &x, &y);
  void *z = alloc_in(a, 10 * MiB, T, S1, 0); /* from y's handle, then x's */
  tu_free(a, z, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_ptr_equal(alloc_in(a, 4 * MiB, T, S1, 0), x); /* z gives x's handle; y's goes idle */
  vmm_snapshot sn = snap(a);
  assert_int_equal(sn.kind[T].idle_count, 1);
  assert_int_equal(sn.kind[T].pooled_count, 0);
  assert_int_equal(usage(a).pages, 0);
  void *s = alloc_in(a, 512, T, S1, 0); /* 2 MiB more would pass the limit: y's handle goes */
  vmm_usage u = usage(a);
  assert_int_equal(u.cache_releases, 1);
  assert_int_equal(u.refusals, 0);
  assert_int_equal(u.reserved_bytes, 6 * MiB);
  tu_free(a, s, S1);
  tu_free(a, x, S1);
  tu_destroy(a);
}

/* Inside a retaining scope a refused request fails: nothing is released before finish, not
 * even to make room (a release there is a violation of the fake's timeline). */
static void refused_memory_in_a_scope_keeps_the_cache(void **state) {
  (void)state;
  vmm_arena *a = process_arena(8 * MiB, VMM_RETAIN_ON);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *live = tu_alloc(a, 6 * MiB, T, S1);
  tu_free(a, tu_alloc(a, 2 * MiB, T, S1), S1);
  size_t from = fake_call_count();
  void *w;
  assert_int_equal(vmm_arena_alloc_in(a, 4 * MiB, T, S1, 0, &w), VMM_ERR_OUT_OF_MEMORY);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0);
  vmm_usage u = usage(a);
  assert_int_equal(u.cache_releases, 0);
  assert_int_equal(u.refusals, 1);
  assert_int_equal(u.reserved_bytes, 8 * MiB);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_free(a, live, S1);
  tu_destroy(a);
}

static void usage_and_peaks(void **state) {
  (void)state;
  vmm_arena *a = process_arena(0, VMM_RETAIN_AUTO);
  void *x = alloc_in(a, 3 * MiB, T, S1, 0), *s = alloc_in(a, 100, T, S1, 0);
  vmm_usage u = usage(a);
  assert_int_equal(u.allocated_bytes, 4 * MiB + 512);
  assert_int_equal(u.allocations, 2);
  tu_free(a, x, S1);
  u = usage(a);
  assert_int_equal(u.allocated_bytes, 512);
  assert_int_equal(u.allocated_peak_bytes, 4 * MiB + 512);
  assert_int_equal(u.allocations_peak, 2);
  assert_int_equal(u.cached_bytes, 6 * MiB - 512);
  assert_int_equal(vmm_arena_reset_peaks(a), VMM_OK);
  u = usage(a);
  assert_int_equal(u.allocated_peak_bytes, 512);
  assert_int_equal(u.reserved_peak_bytes, 6 * MiB);
  assert_int_equal(u.alloc_count, 2);
  assert_int_equal(u.free_count, 1);
  tu_free(a, s, S1);
  assert_int_equal(vmm_arena_usage(a, NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_usage(NULL, &u), VMM_ERR_INVALID_ARGUMENT);
  tu_destroy(a);
}

/* reset_peaks sets the reserved peak to what is reserved now, below the peak after an
 * empty_cache; the high-water mark VMMARENA_REFILL measures against stays. */
static void reset_peaks_resets_the_reserved_peak_not_the_high_water_mark(void **state) {
  (void)state;
  vmm_arena *a = refill_arena_with_three_pooled(0.9); /* high-water mark 16 MiB, 6 MiB reserved */
  assert_int_equal(usage(a).reserved_peak_bytes, 16 * MiB);
  assert_int_equal(vmm_arena_reset_peaks(a), VMM_OK);
  assert_int_equal(usage(a).reserved_peak_bytes, 6 * MiB);
  void *x = refilled_6_mib(a); /* 12 MiB, below 0.9 of the 16 MiB mark, not of 6 */
  assert_int_equal(usage(a).reserved_peak_bytes, 12 * MiB);
  tu_free(a, x, S1);
  tu_destroy(a);
}

/* ---- Countdown over the whole-process paths ---------------------------------------------- */

/* What a failed allocation must leave as it was. */
typedef struct held {
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical, mapped, pool_count, pages, slots;
} held;

static held holdings(vmm_arena *a) {
  vmm_snapshot s = tu_snapshot(a);
  vmm_usage u = usage(a);
  held h;
  memset(&h, 0, sizeof h);
  memcpy(h.kind, s.kind, sizeof h.kind);
  h.physical = s.physical_bytes, h.mapped = s.mapped_bytes, h.pages = u.pages, h.slots = u.page_slots_used;
  h.pool_count = s.kind[T].pooled_count + s.kind[P].pooled_count;
  return h;
}

typedef struct countdown {
  vmm_arena *a;
  void *live[16];
  CUstream stream[16];
  int n;
  bool single; /* one injected failure: a failed allocation must change nothing */
} countdown;

/* Returns the allocation's index, or -1 if it failed. */
static int cd_alloc(countdown *c, size_t bytes, vmm_kind kind, CUstream s, vmm_pool_id pool) {
  held before = holdings(c->a);
  unsigned fired = fake_faults_fired();
  void *p = NULL;
  vmm_status st = vmm_arena_alloc_in(c->a, bytes, kind, s, pool, &p);
  tu_check(c->a);
  if (st == VMM_OK) {
    c->stream[c->n] = s;
    c->live[c->n] = p;
    return c->n++;
  }
  assert_true(st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
  assert_null(p);
  held after = holdings(c->a);
  if (c->single && fake_faults_fired() == fired + 1 && st == VMM_ERR_OUT_OF_MEMORY)
    assert_memory_equal(&before, &after, sizeof before); /* a refusal changes nothing */
  return -1;
}

/* Frees the i-th allocation; a failure keeps it live for the cleanup. */
static void cd_free(countdown *c, int i) {
  if (i < 0 || i >= c->n || !c->live[i]) return;
  vmm_status st = vmm_arena_free(c->a, c->live[i], c->stream[i]);
  tu_check(c->a);
  if (st == VMM_OK) c->live[i] = NULL;
  else if (st != VMM_ERR_DRIVER && st != VMM_ERR_OUT_OF_MEMORY)
    fail_msg("free %d: %s: %s", i, vmm_status_name(st), vmm_arena_last_error(c->a));
}

/* Slots, a page given back, hits across streams, record_stream on a slot and a mapping, a
 * graph pool with a capture, the cache released under the limit, and empty_cache. */
static void cd_scenario(countdown *c) {
  vmm_arena *a = c->a;
  cd_alloc(c, 1000, T, S1, 0);
  cd_alloc(c, 3000, T, S1, 0);
  cd_alloc(c, 6 * MiB, T, S1, 0);
  if (c->n > 0 && c->live[0]) (void)vmm_arena_record_stream(a, c->live[0], S2);
  if (c->n > 2 && c->live[2]) (void)vmm_arena_record_stream(a, c->live[2], S2);
  cd_free(c, 0);
  cd_free(c, 2);
  cd_alloc(c, 1000, T, S1, 0);  /* the slot after its wait */
  cd_alloc(c, 6 * MiB, T, S2, 0); /* a hit on another stream */
  cd_free(c, cd_alloc(c, 2 * MiB, T, S1, 0));
  fake_set_events_pending(1);     /* the device behind: taken apart early, the old range retiring */
  cd_free(c, cd_alloc(c, 4 * MiB, T, S2, 0));
  fake_set_events_pending(0);
  cd_alloc(c, 2 * MiB, T, S1, 0); /* the retiring range unmapped */
  (void)vmm_arena_capture_begin(a, 5);
  fake_set_capturing(S1, 1);
  cd_free(c, cd_alloc(c, 4 * MiB, T, S1, 5));
  cd_free(c, 1);
  fake_set_capturing(S1, 0);
  (void)vmm_arena_capture_end(a, 5);
  cd_alloc(c, 10 * MiB, P, S1, 0); /* past the limit with the cache: released, then made */
  (void)vmm_arena_quiesce(a);
  tu_check(a);
  (void)vmm_arena_release_pool(a, 5);
  for (int i = 0; i < c->n; i++) cd_free(c, i);
  fake_set_events_pending(1); /* retiring still: empty_cache waits for it */
  cd_free(c, cd_alloc(c, 12 * MiB, T, S2, 0));
  (void)vmm_arena_empty_cache(a);
  fake_set_events_pending(0);
  tu_check(a);
  if (a->cfg.refill_share > 0.0) { /* below the high-water mark: new memory, not three handles */
    int k[3];
    for (int i = 0; i < 3; i++) k[i] = cd_alloc(c, 2 * MiB, T, S1, 0);
    for (int i = 0; i < 3; i++) cd_free(c, k[i]);
    cd_free(c, cd_alloc(c, 6 * MiB, T, S1, 0));
  }
  if (a->cfg.grow_in_place) { /* the cache is empty: a pooled 4 MiB mapping grows to 6 MiB in place */
    cd_free(c, cd_alloc(c, 4 * MiB, T, S1, 0));
    cd_free(c, cd_alloc(c, 6 * MiB, T, S1, 0));
  }
}

/* Returns the faults the run met. */
static unsigned countdown_run(unsigned nth, CUresult code, int persistent, double refill, int grow) {
  countdown c = {0};
  vmm_config cfg = process_config();
  cfg.limit_bytes = 24 * MiB;
  cfg.refill_share = refill;
  cfg.grow_in_place = grow;
  c.a = tu_arena(NULL, &cfg);
  c.single = !persistent;
  if (nth) fake_fail_nth_any(nth, code, persistent);
  cd_scenario(&c);
  vmm_snapshot s = snap(c.a);
  if (!nth) assert_true(s.ranges_handed_to_retiring >= (grow ? 1u : 2u)); /* the scenario takes the early paths */
  if (!nth && refill > 0.0) assert_int_equal(s.refills, 1);
  if (!nth) assert_true(grow ? s.grown_in_place >= 2 : s.grown_in_place == 0); /* growths replace some */
  unsigned fired = fake_faults_fired();
  fake_clear_faults();
  fake_set_capturing(S1, 0);
  for (int i = 0; i < c.n; i++)
    if (c.live[i]) assert_int_equal(vmm_arena_free(c.a, c.live[i], c.stream[i]), VMM_OK);
  tu_check(c.a);
  vmm_arena_destroy(c.a);
  /* Nothing is left but a context whose pop failed, or a primary retain whose release failed,
   * as the real driver would leave them. */
  size_t pops = 0, releases = 0;
  for (size_t i = 0; i < fake_call_count(); i++) {
    const fake_call *k = fake_call_at(i);
    pops += k->entry == VMM_DRV_ctx_pop_current && k->result != CUDA_SUCCESS;
    releases += k->entry == VMM_DRV_primary_ctx_release && k->result != CUDA_SUCCESS;
  }
  fake_ledger l;
  fake_get_ledger(&l);
  if (l.live_handles || l.live_mappings || l.reservations || l.live_events || l.errors || l.ctx_pushed != pops ||
      l.primary_retained != releases)
    (void)fake_ledger_clean(); /* prints what is left */
  assert_true(!l.live_handles && !l.live_mappings && !l.reservations && !l.live_events && !l.errors);
  assert_int_equal(l.ctx_pushed, pops);
  assert_int_equal(l.primary_retained, releases);
  return fired;
}

static void countdown_over_whole_process_paths(void **state) {
  (void)state;
  const struct {
    double refill; /* VMMARENA_REFILL assemble, below-peak */
    int grow;      /* VMMARENA_GROW */
  } runs[] = {{0.0, 0}, {0.9, 0}, {0.0, 1}};
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    assert_int_equal(countdown_run(0, CUDA_SUCCESS, 0, runs[r].refill, runs[r].grow), 0);
    size_t points = 0;
    const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
    for (int persistent = 0; persistent < 2; persistent++)
      for (size_t k = 0; k < 2; k++)
        for (unsigned nth = 1;; nth++) {
          if (!countdown_run(nth, codes[k], persistent, runs[r].refill, runs[r].grow)) break;
          points++;
          assert_true(nth < 10000);
        }
    fprintf(stderr, "countdown over the whole-process paths (refill share %.1f, growth %s): %zu injection points\n",
            runs[r].refill, runs[r].grow ? "on" : "off", points);
    assert_true(points > 40);
  }
}

/* An assembly that takes a pooled mapping apart in part (its first handle into a new range,
 * before its free is known complete) keeps on the piece that retires the streams record_stream
 * added: empty_cache waits for them before it unmaps that piece. The device is kept behind, so
 * that reuse is ordered by events and the piece retires early; the new owners run on S3, so
 * that nothing but the piece's own work orders S2's kernel before the unmap. */
static void split_off_piece_keeps_record_stream_uses(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(2 * MiB);
  void *six = tu_alloc(a, 6 * MiB, T, S1);
  void *four = tu_alloc(a, 4 * MiB, T, S1);
  tu_use(four, S2); /* read through four's own range on S2 */
  assert_int_equal(vmm_arena_record_stream(a, four, S2), VMM_OK);
  fake_set_events_pending(1);
  tu_free(a, six, S1);
  tu_free(a, four, S1);
  void *eight = tu_alloc(a, 8 * MiB, T, S3); /* the 6 MiB and the first handle of the 4 MiB */
  assert_int_equal(tu_snapshot(a).ranges_handed_to_retiring, 2);
  void *two = tu_alloc(a, 2 * MiB, T, S3); /* the second handle, in place */
  assert_ptr_equal(two, (char *)four + 2 * MiB);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0); /* S2's kernel known complete before the unmap */
  size_t unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  assert_true(unmap != SIZE_MAX && fake_call_at(unmap)->a0 == dp(four)); /* the piece retired; empty_cache unmapped it */
  size_t sync = tu_first_call(from, VMM_DRV_stream_synchronize);
  while (sync < unmap && fake_call_at(sync)->a0 != (uintptr_t)S2) sync = tu_first_call(sync + 1, VMM_DRV_stream_synchronize);
  assert_true(sync < unmap);
  fake_set_events_pending(0);
  tu_free(a, eight, S3);
  tu_free(a, two, S3);
  tu_destroy(a);
}

/* The same for a whole pooled mapping taken apart early: its range retires with the streams
 * record_stream added, and empty_cache waits for them before it unmaps it. */
static void a_retired_range_keeps_record_stream_uses(void **state) {
  (void)state;
  vmm_arena *a = event_ordered_arena(2 * MiB);
  void *four = tu_alloc(a, 4 * MiB, T, S1);
  void *two = tu_alloc(a, 2 * MiB, T, S1);
  tu_use(four, S2);
  assert_int_equal(vmm_arena_record_stream(a, four, S2), VMM_OK);
  fake_set_events_pending(1);
  tu_free(a, four, S1);
  tu_free(a, two, S1);
  void *six = tu_alloc(a, 6 * MiB, T, S3); /* four's handles and two's, taken apart early */
  assert_true(six != four && six != two);
  assert_int_equal(tu_snapshot(a).ranges_handed_to_retiring, 2);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fake_violations(FAKE_VIOLATION_KINDS), 0); /* S2's kernel known complete before the unmap */
  size_t unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  while (unmap != SIZE_MAX && fake_call_at(unmap)->a0 != dp(four)) unmap = tu_first_call(unmap + 1, VMM_DRV_mem_unmap);
  assert_true(unmap != SIZE_MAX); /* four's range retired; empty_cache unmapped it */
  size_t sync = tu_first_call(from, VMM_DRV_stream_synchronize);
  while (sync < unmap && fake_call_at(sync)->a0 != (uintptr_t)S2) sync = tu_first_call(sync + 1, VMM_DRV_stream_synchronize);
  assert_true(sync < unmap);
  fake_set_events_pending(0);
  tu_free(a, six, S3);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(slot_sizes),
      cmocka_unit_test(small_requests_share_a_page),
      cmocka_unit_test(allocation_size_is_the_slot_or_the_extent),
      cmocka_unit_test(pages_are_kept_apart),
      cmocka_unit_test(bad_frees_of_slots),
      cmocka_unit_test(a_page_whose_free_fails_stays_a_page),
      cmocka_unit_test(a_page_is_one_granule_whatever_the_reuse),
      cmocka_unit_test(exact_hit_outside_a_scope),
      cmocka_unit_test(cross_stream_hit_waits_on_an_event),
      cmocka_unit_test(prefix_hit_in_place_and_merged_back),
      cmocka_unit_test(run_hit_in_place_between_two_pooled_parts),
      cmocka_unit_test(a_tail_joins_only_the_mapping_it_still_follows),
      cmocka_unit_test(a_tail_with_record_stream_uses_is_not_taken_back),
      cmocka_unit_test(a_tail_freed_with_record_stream_uses_stays_apart),
      cmocka_unit_test(a_pooled_mapping_up_to_a_32nd_larger_serves_in_and_out_of_a_scope),
      cmocka_unit_test(an_exact_run_before_one_up_to_a_32nd_larger),
      cmocka_unit_test(assembly_takes_apart_early_and_the_old_ranges_retire),
      cmocka_unit_test(a_retired_range_serves_again),
      cmocka_unit_test(a_retired_range_keeps_stream_order),
      cmocka_unit_test(pause_unmaps_the_retired_ranges_of_its_handles),
      cmocka_unit_test(early_take_apart_leaves_the_rest_pooled),
      cmocka_unit_test(retired_ranges_kept_at_most_256_once_complete),
      cmocka_unit_test(a_run_of_a_retired_range_serves_in_place),
      cmocka_unit_test(a_pooled_mapping_grows_in_place),
      cmocka_unit_test(a_pooled_mapping_grows_down_or_not_at_all),
      cmocka_unit_test(a_failed_growth_leaves_the_arena_as_it_was),
      cmocka_unit_test(a_graph_grows_its_own_memory_in_place),
      cmocka_unit_test(growth_off_assembles_in_a_fresh_range),
      cmocka_unit_test(early_take_apart_orders_the_stream_and_never_in_a_capture),
      cmocka_unit_test(empty_cache_keeps_the_retiring_range_of_a_capturing_stream),
      cmocka_unit_test(refill_creates_below_the_high_water_mark),
      cmocka_unit_test(refill_only_for_several_handles),
      cmocka_unit_test(a_refused_refill_is_assembled),
      cmocka_unit_test(refill_creates_within_a_share_of_the_live_peak),
      cmocka_unit_test(refill_counts_the_request_as_live),
      cmocka_unit_test(record_stream_orders_reuse_of_a_mapping),
      cmocka_unit_test(record_stream_orders_reuse_of_a_slot),
      cmocka_unit_test(empty_cache_waits_for_a_slots_other_stream),
      cmocka_unit_test(a_slot_used_by_two_streams_waits_for_both),
      cmocka_unit_test(record_stream_on_two_slots_of_a_page_keeps_both),
      cmocka_unit_test(a_pool_keeps_its_memory),
      cmocka_unit_test(a_graph_pool_is_never_taken_apart),
      cmocka_unit_test(a_live_graph_keeps_its_memory_through_empty_cache),
      cmocka_unit_test(a_graph_reuses_its_memory_in_new_ranges),
      cmocka_unit_test(a_graph_takes_a_pooled_mappings_first_handles),
      cmocka_unit_test(a_graph_takes_a_complete_shared_mapping_whole),
      cmocka_unit_test(a_graph_takes_its_own_pool_before_the_shared_cache),
      cmocka_unit_test(frees_during_a_capture),
      cmocka_unit_test(calls_during_a_capture_are_relaxed), cmocka_unit_test(retired_ranges_unmap_on_the_arenas_thread),
      cmocka_unit_test(the_thread_waits_while_the_arena_maps),
      cmocka_unit_test(the_thread_leaves_a_quiet_time_after_mapping),
      cmocka_unit_test(empty_cache_waits_for_the_unmapper), cmocka_unit_test(a_failed_background_unmap_keeps_its_range),
      cmocka_unit_test(empty_cache_releases_outside_a_scope_only),
      cmocka_unit_test(a_package_free_in_a_scope_never_waits_for_its_stream),
      cmocka_unit_test(refused_memory_releases_the_cache),
      cmocka_unit_test(refused_memory_releases_idle_handles),
      cmocka_unit_test(refused_memory_in_a_scope_keeps_the_cache),
      cmocka_unit_test(usage_and_peaks),
      cmocka_unit_test(reset_peaks_resets_the_reserved_peak_not_the_high_water_mark),
      cmocka_unit_test(countdown_over_whole_process_paths),
      cmocka_unit_test(split_off_piece_keeps_record_stream_uses),
      cmocka_unit_test(a_retired_range_keeps_record_stream_uses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
