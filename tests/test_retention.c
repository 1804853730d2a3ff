/* Retention scope on the fake driver: reuse across warmups, scope state rules, the drain at
 * finish (order, failures, retries), abort, package frees, retention modes, assembly from
 * idle handles, the out-of-memory fallback, and stream order of reuse.
 *
 * Memory created inside a scope is cut into handles of the arena's bound, which is one
 * granule (2 MiB) while the arena has held less than 256 MiB: a 4 MiB mapping made in a
 * scope is two handles. Some checks look inside the arena (internal.h) to compare the pool,
 * the free list and the unmapped idle handles before and after a failed call. */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define GRAIN (2 * MiB)
#define MAX_VIEW 32

static CUdeviceptr dp(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static size_t round_up(size_t bytes) { return (bytes + GRAIN - 1) / GRAIN * GRAIN; }

static fake_ledger ledger(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l;
}


static void *transient(vmm_arena *a, size_t bytes) { return tu_alloc(a, bytes, VMM_KIND_TRANSIENT, S1); }

/* Calls of `e` in the log from index `from` on whose first argument is `a0`. */
static size_t calls_with(size_t from, vmm_driver_entry e, uintptr_t a0) {
  size_t n = 0, end = fake_call_count();
  for (size_t i = from; i < end; i++) {
    const fake_call *c = fake_call_at(i);
    n += c->entry == e && c->a0 == a0;
  }
  return n;
}


/* The (ptr, size) of every cuMemUnmap from `from` on, in order; returns how many. */
static size_t unmaps_since(size_t from, CUdeviceptr *base, size_t *size, size_t cap) {
  size_t n = 0, end = fake_call_count();
  for (size_t i = from; i < end; i++) {
    const fake_call *c = fake_call_at(i);
    if (c->entry != VMM_DRV_mem_unmap) continue;
    assert_true(n < cap);
    base[n] = c->a0;
    size[n] = c->a1;
    n++;
  }
  return n;
}

/* The handles of the mapping at `base`, in address order; returns how many. */
static size_t handles_of(vmm_arena *a, void *base, CUmemGenericAllocationHandle *out, size_t cap) {
  vmm_mapping *m = vmm_table_find(&a->table, dp(base));
  assert_non_null(m);
  assert_true(m->handle_count <= cap);
  for (uint32_t i = 0; i < m->handle_count; i++) out[i] = m->handles[i]->h;
  return m->handle_count;
}

/* ---- White-box view of the pool, the free list and the unmapped idle handles --------- */

typedef struct arena_view {
  uint64_t pooled, pooled_bytes, buckets;     /* pooled mappings */
  uint64_t reusable, reusable_bytes;          /* idle handles of both tiers, from the snapshot */
  CUdeviceptr drain[MAX_VIEW];                /* pooled mappings in drain order */
  size_t drain_count;
  CUdeviceptr free_base[MAX_VIEW];            /* free VA ranges by address */
  size_t free_size[MAX_VIEW], free_count, free_bytes;
  CUmemGenericAllocationHandle retained[MAX_VIEW]; /* unmapped idle handles by (size, age) */
  size_t retained_size[MAX_VIEW];
  uint64_t retained_key[MAX_VIEW];            /* the serial that orders handles of one size */
  vmm_kind retained_kind[MAX_VIEW];
  size_t idle_count;
} arena_view;

/* Largest bucket first, each bucket from its head: the order finish drains in. */
static void view_drain(const vmm_avl *n, arena_view *v) {
  if (!n) return;
  view_drain(n->right, v);
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  for (const vmm_mapping *m = b->head; m; m = m->pool_next) {
    assert_true(v->drain_count < MAX_VIEW);
    v->drain[v->drain_count++] = m->base;
  }
  view_drain(n->left, v);
}

static void view_free(const vmm_avl *n, arena_view *v) {
  if (!n) return;
  view_free(n->left, v);
  const vmm_free_range *f = vmm_container_of(n, vmm_free_range, by_addr);
  assert_true(v->free_count < MAX_VIEW);
  v->free_base[v->free_count] = f->base;
  v->free_size[v->free_count++] = f->size;
  view_free(n->right, v);
}

static void view_idle(const vmm_avl *n, arena_view *v) {
  if (!n) return;
  view_idle(n->left, v);
  const vmm_handle *h = vmm_container_of(n, vmm_handle, node);
  assert_true(v->idle_count < MAX_VIEW);
  v->retained[v->idle_count] = h->h;
  v->retained_size[v->idle_count] = h->size;
  v->retained_key[v->idle_count] = h->node.k2;
  v->retained_kind[v->idle_count++] = h->kind;
  view_idle(n->right, v);
}

static arena_view view(vmm_arena *a) {
  arena_view v;
  memset(&v, 0, sizeof v);
  vmm_snapshot s = tu_snapshot(a);
  v.pooled = a->store.pool.count;
  v.pooled_bytes = a->store.pool.bytes;
  v.buckets = s.pool_buckets;
  v.reusable = s.retained_reusable_handles;
  v.reusable_bytes = s.retained_reusable_bytes;
  view_drain(a->store.pool.root, &v);
  view_free(a->ranges.by_addr, &v);
  v.free_bytes = a->ranges.free_bytes;
  view_idle(a->store.idle, &v);
  assert_int_equal(v.idle_count, a->store.idle_count);
  return v;
}

static void assert_views_equal(const arena_view *x, const arena_view *y) {
  assert_int_equal(x->pooled, y->pooled);
  assert_int_equal(x->pooled_bytes, y->pooled_bytes);
  assert_int_equal(x->buckets, y->buckets);
  assert_int_equal(x->reusable, y->reusable);
  assert_int_equal(x->reusable_bytes, y->reusable_bytes);
  assert_int_equal(x->drain_count, y->drain_count);
  for (size_t i = 0; i < x->drain_count; i++) assert_int_equal(x->drain[i], y->drain[i]);
  assert_int_equal(x->free_count, y->free_count);
  assert_int_equal(x->free_bytes, y->free_bytes);
  for (size_t i = 0; i < x->free_count; i++) {
    assert_int_equal(x->free_base[i], y->free_base[i]);
    assert_int_equal(x->free_size[i], y->free_size[i]);
  }
  assert_int_equal(x->idle_count, y->idle_count);
  for (size_t i = 0; i < x->idle_count; i++) {
    assert_int_equal(x->retained[i], y->retained[i]);
    assert_int_equal(x->retained_size[i], y->retained_size[i]);
    assert_int_equal(x->retained_key[i], y->retained_key[i]);
    assert_int_equal(x->retained_kind[i], y->retained_kind[i]);
  }
}

/* ---- Reuse across warmups ------------------------------------------------------------ */

static void twelve_warmups_create_memory_once(void **state) {
  (void)state;
  static const size_t sizes[] = {3 * MiB, 17 * MiB, 64 * MiB, 64 * MiB, 200 * MiB, 5 * MiB};
  enum { N = sizeof sizes / sizeof sizes[0], WARMUPS = 12 };
  vmm_arena *a = tu_arena(NULL, NULL);
  size_t warmup_bytes = 0;
  for (int i = 0; i < N; i++) warmup_bytes += round_up(sizes[i]);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *first[N];
  size_t creates_after_first = 0;
  for (int w = 0; w < WARMUPS; w++) {
    void *p[N];
    for (int i = 0; i < N; i++) p[i] = transient(a, sizes[i]);
    for (int i = 0; i < N; i++) {
      if (w == 0) {
        first[i] = p[i];
        continue;
      }
      int seen = 0; /* every later warmup gets back the first warmup's mappings */
      for (int j = 0; j < N; j++) seen += p[i] == first[j] && round_up(sizes[i]) == round_up(sizes[j]);
      assert_true(seen >= 1);
    }
    for (int i = 0; i < N; i++) tu_free(a, p[i], S1);
    if (w == 0) creates_after_first = ledger().calls_by_entry[VMM_DRV_mem_create];
    assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates_after_first);
  }
  /* The first warmup created every byte, cut by the bound (one granule until the peak reaches
   * 256 MiB, then 4 MiB): 4 + 18 + 64 + 64 + 200 MiB in 2 MiB handles, then 6 MiB as 4 + 2;
   * every later warmup found each size pooled. */
  assert_int_equal(creates_after_first, 2 + 9 + 32 + 32 + 100 + 2);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.handle_bound_bytes, 4 * MiB);
  assert_int_equal(s.pool_hits, (WARMUPS - 1) * N);
  assert_int_equal(s.pool_misses, N);
  assert_int_equal(s.assemblies, 0);
  assert_int_equal(s.physical_peak_bytes, warmup_bytes);
  assert_int_equal(s.physical_bytes, warmup_bytes);
  assert_int_equal(s.retained_reusable_handles, creates_after_first);
  assert_int_equal(s.retained_reusable_bytes, warmup_bytes);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(tu_snapshot(a).physical_bytes, 0);
  assert_int_equal(ledger().live_handles, 0);
  tu_destroy(a);
}

/* ---- Scope state rules --------------------------------------------------------------- */

static void scope_state_rules(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_SCOPE_STATE);
  assert_non_null(strstr(vmm_arena_last_error(a), "no retention scope is active"));
  assert_int_equal(vmm_retention_abort(a), VMM_ERR_SCOPE_STATE);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(vmm_retention_begin(a), VMM_ERR_SCOPE_STATE);
  assert_non_null(strstr(vmm_arena_last_error(a), "already active"));
  assert_int_equal(tu_snapshot(a).scope_state, VMM_SCOPE_ACTIVE);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_SCOPE_STATE);
  assert_int_equal(vmm_retention_abort(a), VMM_ERR_SCOPE_STATE);

  /* A new scope after finish works and pools; after abort, another one starts clean. */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t = transient(a, 4 * MiB);
  tu_free(a, t, S1);
  assert_int_equal(tu_snapshot(a).retained_reusable_handles, 2); /* its two handles */
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  assert_int_equal(vmm_retention_abort(a), VMM_ERR_SCOPE_STATE);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  size_t creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  void *u = transient(a, 4 * MiB);
  assert_ptr_not_equal(u, t); /* the abandoned mapping is never handed out again, nor its handles */
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates + 2);
  assert_int_equal(tu_snapshot(a).assemblies, 0);
  tu_free(a, u, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);

  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.scope_state, VMM_SCOPE_NONE);
  assert_int_equal(s.scopes_begun, 3);
  assert_int_equal(s.scopes_finished, 2);
  assert_int_equal(s.scopes_aborted, 1);
  assert_int_equal(s.fatal_status, VMM_OK);
  tu_destroy(a);
}

/* ---- Draining the pool at finish ----------------------------------------------------- */

typedef struct drain_shape {
  const char *name;
  size_t sizes[8]; /* transients allocated, then freed in this order: the pool */
  size_t count;
  size_t take;     /* a request served from the pool before finish and live through it, or 0 */
} drain_shape;

static const drain_shape drain_shapes[] = {
    {"empty pool", {0}, 0, 0},
    {"one bucket with one mapping", {4 * MiB}, 1, 0},
    {"three buckets with one each", {2 * MiB, 8 * MiB, 4 * MiB}, 3, 0},
    {"two buckets with several each", {4 * MiB, 10 * MiB, 4 * MiB, 4 * MiB, 10 * MiB}, 5, 0},
    {"only small bucket emptied by a take", {2 * MiB, 8 * MiB, 8 * MiB}, 3, 2 * MiB},
};

static void finish_drains_pool_shapes(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof drain_shapes / sizeof drain_shapes[0]; k++) {
    const drain_shape *shape = &drain_shapes[k];
    fprintf(stderr, "shape: %s\n", shape->name);
    vmm_arena *a = tu_arena(NULL, NULL);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *p[8];
    for (size_t i = 0; i < shape->count; i++) p[i] = transient(a, shape->sizes[i]);
    for (size_t i = 0; i < shape->count; i++) tu_free(a, p[i], S1);
    int pooled[8];
    for (size_t i = 0; i < shape->count; i++) pooled[i] = 1;
    void *taken = NULL;
    if (shape->take) {
      taken = transient(a, shape->take);
      for (size_t i = 0; i < shape->count; i++)
        if (p[i] == taken) pooled[i] = 0;
      assert_int_equal(tu_snapshot(a).pool_hits, 1);
    }
    /* Expected drain: largest size first, the latest freed first within a size. */
    CUdeviceptr want_base[8];
    size_t want_size[8], want = 0, handles = 0;
    CUmemGenericAllocationHandle want_handle[64];
    int used[8] = {0};
    for (;;) {
      int best = -1;
      for (int i = (int)shape->count - 1; i >= 0; i--)
        if (pooled[i] && !used[i] && (best < 0 || shape->sizes[i] > shape->sizes[best])) best = i;
      if (best < 0) break;
      used[best] = 1;
      want_base[want] = dp(p[best]);
      want_size[want] = shape->sizes[best];
      handles += handles_of(a, p[best], want_handle + handles, 64 - handles);
      want++;
    }
    assert_int_equal(tu_snapshot(a).retained_reusable_handles, handles);

    size_t from = fake_call_count();
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    CUdeviceptr got_base[16];
    size_t got_size[16];
    assert_int_equal(unmaps_since(from, got_base, got_size, 16), want);
    for (size_t i = 0; i < want; i++) {
      assert_int_equal(got_base[i], want_base[i]);
      assert_int_equal(got_size[i], want_size[i]);
    }
    /* Every handle of every pooled mapping released once. */
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), handles);
    for (size_t i = 0; i < handles; i++) assert_int_equal(calls_with(from, VMM_DRV_mem_release, want_handle[i]), 1);
    fake_ledger l = ledger();
    assert_int_equal(l.live_handles, taken ? 1 : 0);
    assert_int_equal(l.live_mappings, taken ? 1 : 0);
    assert_int_equal(l.errors, 0);
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.retained_reusable_handles, 0);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].idle_count, 0);
    assert_int_equal(s.physical_bytes, taken ? shape->take : 0);
    tu_check(a);
    if (taken) {
      from = fake_call_count();
      tu_free(a, taken, S1);
      assert_int_equal(calls_with(from, VMM_DRV_mem_unmap, dp(taken)), 1);
      assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 1);
    }
    tu_destroy(a);
  }
}

/* Two idle mappings of one size: finish unmaps each exactly once. */
static void finish_unmaps_two_of_one_size_once_each(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *x = transient(a, 4 * MiB), *y = transient(a, 4 * MiB);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(calls_with(from, VMM_DRV_mem_unmap, dp(x)), 1);
  assert_int_equal(calls_with(from, VMM_DRV_mem_unmap, dp(y)), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 4); /* two handles each */
  assert_int_equal(ledger().live_mappings, 0);
  tu_destroy(a);
}

/* A pool of an 8 MiB bucket [y] (four handles) and a 2 MiB bucket [x2, x1], plus the three
 * idle handles of a package freed in the scope; returns the arena with the scope active. */
static vmm_arena *two_bucket_pool(void **y, void **x2, void **x1) {
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *pkg = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S1);
  *x1 = transient(a, 2 * MiB);
  *y = transient(a, 8 * MiB);
  *x2 = transient(a, 2 * MiB);
  tu_free(a, pkg, S1);
  tu_free(a, *x1, S1);
  tu_free(a, *y, S1);
  tu_free(a, *x2, S1);
  return a;
}

/* The second unmap fails: the first mapping stays drained, the failed one goes back to the
 * head of its bucket, and a retry resumes with it. */
static void finish_second_unmap_fails_then_resumes(void **state) {
  (void)state;
  void *y, *x2, *x1;
  vmm_arena *a = two_bucket_pool(&y, &x2, &x1);
  arena_view before = view(a);
  assert_int_equal(before.drain_count, 3);
  assert_int_equal(before.drain[0], dp(y));
  assert_int_equal(before.drain[1], dp(x2));
  assert_int_equal(before.drain[2], dp(x1));
  CUmemGenericAllocationHandle hy[4];
  assert_int_equal(handles_of(a, y, hy, 4), 4);

  fake_fail_nth(VMM_DRV_mem_unmap, 2, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_DRIVER);
  fake_clear_faults();
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
  assert_non_null(strstr(fatal, "cuMemUnmap"));
  tu_check(a);

  /* Expected: the state just before the failed unmap, with y drained and retained. */
  arena_view after = view(a);
  assert_int_equal(after.pooled, before.pooled - 1);
  assert_int_equal(after.pooled_bytes, before.pooled_bytes - 8 * MiB);
  assert_int_equal(after.buckets, before.buckets - 1);
  assert_int_equal(after.reusable, before.reusable); /* y's handles still idle, unmapped now */
  assert_int_equal(after.reusable_bytes, before.reusable_bytes);
  assert_int_equal(after.drain_count, 2);
  assert_int_equal(after.drain[0], dp(x2));
  assert_int_equal(after.drain[1], dp(x1));
  assert_int_equal(after.free_bytes, before.free_bytes + 8 * MiB);
  int y_free = 0;
  for (size_t i = 0; i < after.free_count; i++)
    y_free += after.free_base[i] <= dp(y) && dp(y) + 8 * MiB <= after.free_base[i] + after.free_size[i];
  assert_int_equal(y_free, 1);
  /* y's four handles joined the idle ones, after those already there (one size, newer). */
  assert_int_equal(before.idle_count, 3);
  assert_int_equal(after.idle_count, before.idle_count + 4);
  for (size_t i = 0; i < before.idle_count; i++) assert_int_equal(after.retained[i], before.retained[i]);
  for (size_t i = 0; i < 4; i++) assert_int_equal(after.retained[before.idle_count + i], hy[i]);
  assert_int_equal(fake_mapped_size_at(dp(y)), 0);
  assert_int_equal(fake_mapped_size_at(dp(x2)), 2 * MiB);
  assert_int_equal(fake_mapped_size_at(dp(x1)), 2 * MiB);
  assert_int_equal(tu_snapshot(a).scope_state, VMM_SCOPE_ACTIVE);

  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  CUdeviceptr base[8];
  size_t size[8];
  assert_int_equal(unmaps_since(from, base, size, 8), 2);
  assert_int_equal(base[0], dp(x2));
  assert_int_equal(base[1], dp(x1));
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 9); /* package 3, y 4, x2, x1 */
  assert_int_equal(ledger().live_handles, 0);
  tu_destroy(a);
}

/* The first unmap fails and its pop had emptied the largest bucket: everything is exactly
 * as before the call, and a retry drains in the same order. */
static void finish_first_unmap_fails_state_unchanged(void **state) {
  (void)state;
  void *y, *x2, *x1;
  vmm_arena *a = two_bucket_pool(&y, &x2, &x1);
  arena_view before = view(a);
  vmm_snapshot s0 = tu_snapshot(a);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_DRIVER);
  fake_clear_faults();
  tu_check(a);
  arena_view after = view(a);
  assert_views_equal(&before, &after);
  vmm_snapshot s1 = tu_snapshot(a);
  assert_memory_equal(s0.kind, s1.kind, sizeof s0.kind);
  assert_int_equal(s1.physical_bytes, s0.physical_bytes);
  assert_int_equal(s1.mapped_bytes, s0.mapped_bytes);
  assert_int_equal(tu_mapped_from(y, 8 * MiB), 8 * MiB);

  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  CUdeviceptr base[8];
  size_t size[8];
  assert_int_equal(unmaps_since(from, base, size, 8), 3);
  for (size_t i = 0; i < 3; i++) assert_int_equal(base[i], before.drain[i]);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 9);
  tu_destroy(a);
}

/* ---- Abort --------------------------------------------------------------------------- */

static void abort_makes_no_driver_call(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *pooled = transient(a, 4 * MiB);
  void *t6 = transient(a, 6 * MiB), *t8 = transient(a, 8 * MiB);
  void *retained = tu_alloc(a, 10 * MiB, VMM_KIND_PACKAGE, S1);
  void *pkg = tu_alloc(a, 12 * MiB, VMM_KIND_PACKAGE, S1);
  tu_free(a, pooled, S1);
  tu_free(a, retained, S1);
  size_t calls = fake_call_count();
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  tu_free(a, t6, S1);
  tu_free(a, t8, S1);
  tu_free(a, pkg, S1);
  assert_int_equal(vmm_arena_free(a, t6, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_non_null(strstr(vmm_arena_last_error(a), "abandoned"));
  assert_int_equal(fake_call_count(), calls);

  vmm_snapshot s = tu_snapshot(a);
  const vmm_kind_stats *t = &s.kind[VMM_KIND_TRANSIENT], *p = &s.kind[VMM_KIND_PACKAGE];
  assert_int_equal(t->abandoned_count, 3);
  assert_int_equal(t->abandoned_bytes, 18 * MiB);
  assert_int_equal(p->abandoned_count, 6); /* pkg's mapping and the five idle handles of `retained` */
  assert_int_equal(p->abandoned_bytes, 22 * MiB);
  assert_int_equal(t->live_count + t->pooled_count + t->idle_count, 0);
  assert_int_equal(p->live_count + p->idle_count, 0);
  assert_int_equal(s.retained_reusable_handles, 0);
  assert_int_equal(s.physical_bytes, 40 * MiB);
  assert_int_equal(s.scope_state, VMM_SCOPE_NONE);
  assert_int_equal(s.scopes_aborted, 1);
  tu_check(a);
  assert_int_equal(fake_call_count(), calls);
  tu_destroy(a);
}

/* ---- Package memory inside a scope --------------------------------------------------- */

static void package_free_in_scope_defers_release(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S2);
  size_t from = fake_call_count();
  tu_free(a, p, S2);
  size_t sync = tu_first_call(from, VMM_DRV_stream_synchronize), unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  assert_true(sync != SIZE_MAX && unmap != SIZE_MAX);
  assert_true(sync < unmap);
  assert_int_equal(fake_call_at(sync)->a0, (uintptr_t)S2);
  assert_int_equal(fake_call_at(unmap)->a0, dp(p));
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_count, 3);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_bytes, 6 * MiB);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 0);
  assert_int_equal(s.pool_buckets, 0); /* never pooled, but reusable: idle handles */
  assert_int_equal(s.retained_reusable_handles, 3);
  assert_int_equal(s.retained_reusable_bytes, 6 * MiB);
  assert_int_equal(s.physical_bytes, 6 * MiB);
  assert_int_equal(ledger().live_handles, 3);
  assert_int_equal(ledger().live_mappings, 0);
  from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 3);
  assert_int_equal(ledger().live_handles, 0);
  assert_int_equal(tu_snapshot(a).kind[VMM_KIND_PACKAGE].idle_count, 0);
  tu_destroy(a);
}

/* A package request never takes a pooled mapping whole (no hit, no fallback), but it is
 * assembled from handles of pooled mappings that fit it exactly. t and u are made before the
 * scope: one 4 MiB handle each. */
static void package_alloc_never_takes_a_pooled_mapping_whole(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *t = transient(a, 4 * MiB), *u = transient(a, 4 * MiB);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  tu_free(a, t, S1);
  tu_free(a, u, S1); /* the head of the 4 MiB bucket */
  size_t creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  assert_ptr_not_equal(p, u);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates);
  assert_int_equal(fake_mapped_size_at(dp(u)), 0); /* u was taken apart: its handle is p's */
  assert_int_equal(fake_mapped_size_at(dp(p)), 4 * MiB);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.retained_reusable_handles, 1);
  assert_int_equal(s.pool_hits + s.pool_fallbacks, 0);
  assert_int_equal(s.pool_misses, 0); /* a package request never looks for a hit */
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.pooled_taken_apart, 1);

  /* Out of memory, a package request falls back neither to the pool nor to a padded
   * assembly: t's one 4 MiB handle is larger than 2 MiB. */
  fake_set_capacity(0, 8 * MiB);
  void *q = NULL;
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  s = tu_snapshot(a);
  assert_int_equal(s.retained_reusable_handles, 1);
  assert_int_equal(s.pool_fallbacks + s.padded_assemblies, 0);
  assert_int_equal(s.oom_refusals, 1);
  assert_int_equal(s.fatal_status, VMM_OK);
  assert_int_equal(fake_mapped_size_at(dp(t)), 4 * MiB);
  assert_ptr_equal(transient(a, 4 * MiB), t); /* the transient still gets it whole */
  tu_free(a, t, S1);
  tu_free(a, p, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

static void live_mappings_survive_finish(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t = transient(a, 4 * MiB);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  void *idle = transient(a, 8 * MiB);
  tu_free(a, idle, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(tu_mapped_from(t, 4 * MiB), 4 * MiB);
  assert_int_equal(fake_mapped_size_at(dp(p)), 2 * MiB);
  assert_int_equal(fake_mapped_size_at(dp(idle)), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 1);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 1);
  assert_int_equal(s.physical_bytes, 6 * MiB);
  size_t from = fake_call_count();
  tu_free(a, t, S1); /* outside any scope: synchronized, unmapped and released at once */
  assert_int_equal(calls_with(from, VMM_DRV_mem_unmap, dp(t)), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 2); /* its two handles */
  assert_int_equal(tu_snapshot(a).retained_reusable_handles, 0);
  tu_free(a, p, S1);
  assert_int_equal(ledger().live_handles, 0);
  tu_destroy(a);
}

/* ---- Retention modes ----------------------------------------------------------------- */

static void retention_off_is_bookkeeping(void **state) {
  (void)state;
  vmm_config cfg = tu_config();
  cfg.retain = VMM_RETAIN_OFF;
  vmm_arena *a = tu_arena(NULL, &cfg);
  assert_int_equal(tu_snapshot(a).retention_enabled, 0);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(tu_snapshot(a).scope_state, VMM_SCOPE_ACTIVE);
  void *t = transient(a, 4 * MiB);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  size_t from = fake_call_count();
  tu_free(a, t, S1);
  tu_free(a, p, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 2);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.retained_reusable_handles, 0);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_count, 0);
  assert_int_equal(s.physical_bytes, 0);
  size_t creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  tu_free(a, transient(a, 4 * MiB), S1);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates + 1);
  assert_int_equal(tu_snapshot(a).pool_hits, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  tu_destroy(a);
}

static void retention_auto_follows_integrated(void **state) {
  (void)state;
  for (int integrated = 0; integrated <= 1; integrated++) {
    fake_options o = {.integrated = integrated};
    vmm_config cfg = tu_config();
    cfg.retain = VMM_RETAIN_AUTO;
    vmm_arena *a = tu_arena(&o, &cfg);
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.integrated, integrated);
    assert_int_equal(s.retention_enabled, integrated);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    tu_free(a, transient(a, 2 * MiB), S1);
    assert_int_equal(tu_snapshot(a).retained_reusable_handles, (uint64_t)integrated);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- Out of memory inside a scope ---------------------------------------------------- */

/* t8 was made before the scope: one 8 MiB handle, which no assembly for 4 MiB may use (it
 * would pad the request). Refused new memory, the request takes it whole. */
static void oom_falls_back_to_larger_pooled(void **state) {
  (void)state;
  fake_options o = {.capacity = 16 * MiB};
  vmm_arena *a = tu_arena(&o, NULL); /* exact reuse */
  void *t8 = transient(a, 8 * MiB);
  void *p = tu_alloc(a, 8 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  tu_free(a, t8, S1);
  void *t4 = transient(a, 4 * MiB);
  assert_ptr_equal(t4, t8);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pool_fallbacks, 1);
  assert_int_equal(s.pool_misses, 1); /* the 4 MiB request: t8 was made outside the scope */
  assert_int_equal(s.pool_hits, 0);
  assert_int_equal(s.oom_refusals, 1);
  assert_int_equal(s.assemblies + s.padded_assemblies, 0);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 8 * MiB);
  assert_int_equal(s.fatal_status, VMM_OK);
  tu_free(a, t4, S1);
  assert_int_equal(tu_snapshot(a).retained_reusable_bytes, 8 * MiB);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_free(a, p, S1);
  tu_destroy(a);
}

/* Three idle mappings (one, two and three handles) cover 12 MiB exactly: the request is
 * assembled from their six handles, with no new memory and no refusal on the full device. */
static void assembles_three_idle_mappings(void **state) {
  (void)state;
  fake_options o = {.capacity = 12 * MiB};
  vmm_arena *a = tu_arena(&o, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t2 = transient(a, 2 * MiB), *t4 = transient(a, 4 * MiB), *t6 = transient(a, 6 * MiB);
  CUmemGenericAllocationHandle h[6];
  size_t n = handles_of(a, t2, h, 6);
  n += handles_of(a, t4, h + n, 6 - n);
  n += handles_of(a, t6, h + n, 6 - n);
  assert_int_equal(n, 6);
  tu_free(a, t2, S1);
  tu_free(a, t4, S1);
  tu_free(a, t6, S1);
  size_t creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  void *s12 = transient(a, 12 * MiB);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.pooled_taken_apart, 3);
  assert_int_equal(s.assembled_idle_handles, 6);
  assert_int_equal(s.assembly_created_bytes, 0);
  assert_int_equal(s.oom_refusals + s.pool_fallbacks + s.padded_assemblies, 0);
  assert_int_equal(s.retained_reusable_handles, 0);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 12 * MiB);
  assert_int_equal(s.physical_bytes, 12 * MiB);
  assert_int_equal(s.mapped_bytes, 12 * MiB);
  assert_int_equal(s.fatal_status, VMM_OK);
  /* The whole request is backed and accessible: six handles mapped back to back. */
  size_t off = 0, pieces = 0;
  while (off < 12 * MiB) {
    size_t piece = fake_mapped_size_at(dp(s12) + off);
    assert_true(piece > 0);
    assert_true(fake_access_granted(dp(s12) + off, 0));
    off += piece;
    pieces++;
  }
  assert_int_equal(off, 12 * MiB);
  assert_int_equal(pieces, 6);
  assert_int_equal(fake_mapped_size_at(dp(t2)), 0);
  assert_int_equal(ledger().live_handles, 6);
  char json[8192], want[128];
  assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, NULL), VMM_OK);
  snprintf(want, sizeof want, "\"base\":\"0x%llx\",\"extent\":%zu,", (unsigned long long)dp(s12), 12 * MiB);
  assert_non_null(strstr(json, want));
  assert_non_null(strstr(json, "\"handles\":6"));

  tu_free(a, s12, S1); /* pools one mapping of the full extent */
  s = tu_snapshot(a);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_count, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_bytes, 12 * MiB);
  assert_int_equal(s.retained_reusable_bytes, 12 * MiB);
  assert_int_equal(s.pool_buckets, 1);
  assert_ptr_equal(transient(a, 12 * MiB), s12); /* and an exact request takes it whole */
  tu_free(a, s12, S1);

  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 1);
  const fake_call *unmap = fake_call_at(tu_first_call(from, VMM_DRV_mem_unmap));
  assert_int_equal(unmap->a0, dp(s12));
  assert_int_equal(unmap->a1, 12 * MiB);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 6);
  for (int i = 0; i < 6; i++) assert_int_equal(calls_with(from, VMM_DRV_mem_release, h[i]), 1);
  assert_int_equal(ledger().live_handles, 0);
  tu_destroy(a);
}

/* The idle 2 MiB mapping covers part of 8 MiB; the 6 MiB left are refused by the limit, no
 * pooled mapping fits whole, and idle handles alone cannot cover it either: a recoverable
 * refusal that leaves the pool as it was. Once the package is freed inside the scope, its
 * idle handles and the pooled mapping cover the same request with no new memory. */
static void oom_with_nothing_fitting_is_recoverable(void **state) {
  (void)state;
  vmm_config cfg = tu_config();
  cfg.limit_bytes = 8 * MiB;
  vmm_arena *a = tu_arena(NULL, &cfg);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t2 = transient(a, 2 * MiB);
  void *p = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S1);
  tu_free(a, t2, S1);
  arena_view before = view(a);
  void *q = (void *)1;
  assert_int_equal(vmm_arena_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  const char *msg = vmm_arena_last_error(a);
  assert_non_null(strstr(msg, "requested 8388608 B"));
  assert_non_null(strstr(msg, "limit 8.0 MiB < 8.0 MiB held + 6.0 MiB requested (2.0 MiB of the request from idle handles)"));
  assert_non_null(strstr(msg, "no pooled mapping fits (pool 1 mappings, 2.0 MiB; 0 idle handles, 0 B)"));
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.pool_fallbacks + s.assemblies + s.padded_assemblies + s.pooled_taken_apart, 0);
  assert_int_equal(s.retained_reusable_handles, 1);
  assert_int_equal(s.retained_reusable_bytes, 2 * MiB);
  tu_check(a);
  arena_view after = view(a);
  assert_views_equal(&before, &after);
  assert_int_equal(fake_mapped_size_at(dp(t2)), 2 * MiB);
  /* Once memory is given back, the same request succeeds from it. */
  tu_free(a, p, S1);
  size_t creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  q = transient(a, 8 * MiB);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates);
  s = tu_snapshot(a);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.assembled_idle_handles, 4);
  assert_int_equal(s.limit_refusals, 1);
  tu_free(a, q, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_free(a, transient(a, 8 * MiB), S1);
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
  tu_destroy(a);
}

/* A driver error while assembling (waiting for a freeing stream, unmapping a pooled mapping
 * taken apart, mapping the handles or granting access to them) is fatal, and every pooled
 * mapping goes back where it was, mapped at its old address, in the same drain order. */
static void assembly_failure_restores_pool(void **state) {
  (void)state;
  static const struct {
    vmm_driver_entry entry;
    unsigned nth;
  } faults[] = {{VMM_DRV_mem_map, 2},         {VMM_DRV_mem_map, 7},       {VMM_DRV_mem_unmap, 2},
                {VMM_DRV_mem_unmap, 4},       {VMM_DRV_mem_set_access, 1}, {VMM_DRV_stream_synchronize, 1}};
  for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
    fprintf(stderr, "fault: %s #%u\n", vmm_driver_entry_name(faults[f].entry), faults[f].nth);
    fake_options o = {.capacity = 14 * MiB};
    vmm_arena *a = tu_arena(&o, NULL);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *x1 = transient(a, 2 * MiB), *x2 = transient(a, 2 * MiB);
    void *t4 = transient(a, 4 * MiB), *t6 = transient(a, 6 * MiB);
    tu_free(a, x1, S1);
    tu_free(a, x2, S1);
    tu_free(a, t4, S1);
    tu_free(a, t6, S1);
    arena_view before = view(a);
    vmm_snapshot s0 = tu_snapshot(a);
    /* 14 MiB: t6, t4, x2 and x1 taken apart (four unmaps), seven handles mapped. */
    fake_fail_nth(faults[f].entry, faults[f].nth, CUDA_ERROR_UNKNOWN, 0);
    void *q = (void *)1;
    assert_int_equal(vmm_arena_alloc(a, 14 * MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_DRIVER);
    fake_clear_faults();
    assert_int_equal(fake_faults_fired(), 1);
    assert_null(q);
    const char *fatal = NULL;
    assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
    assert_non_null(strstr(fatal, vmm_driver_entry_name(faults[f].entry)));
    tu_check(a);
    arena_view after = view(a);
    assert_views_equal(&before, &after);
    vmm_snapshot s1 = tu_snapshot(a);
    assert_memory_equal(s0.kind, s1.kind, sizeof s0.kind);
    assert_int_equal(s1.mapped_bytes, 14 * MiB);
    assert_int_equal(s1.assemblies + s1.pooled_taken_apart, 0);
    void *bases[] = {x1, x2, t4, t6};
    size_t sizes[] = {2 * MiB, 2 * MiB, 4 * MiB, 6 * MiB};
    for (int i = 0; i < 4; i++) {
      assert_int_equal(tu_mapped_from(bases[i], sizes[i]), sizes[i]);
      for (size_t off = 0; off < sizes[i]; off += GRAIN) assert_true(fake_access_granted(dp(bases[i]) + off, 0));
    }
    assert_int_equal(ledger().errors, 0);
    assert_int_equal(ledger().live_handles, 7);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- Stream order of reuse ----------------------------------------------------------- */

static void reuse_on_other_stream_waits_on_event(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  void *q = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2);
  assert_ptr_equal(q, p);
  tu_assert_event_orders(from, S1, S2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_create), 0);
  tu_free(a, q, S2);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* A quiesce orders only the frees made before it. A mapping freed after an earlier quiesce
 * still needs the event before another stream reuses it. */
static void reuse_after_an_earlier_quiesce_still_waits_on_event(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  tu_free(a, p, S1);
  size_t from = fake_call_count();
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2), p);
  tu_assert_event_orders(from, S1, S2);
  tu_free(a, p, S2);
  /* A second quiesce orders that free: the next cross-stream hit needs no event. */
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  from = fake_call_count();
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1), p);
  assert_int_equal(fake_call_count(), from);
  tu_free(a, p, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* Finish unmaps a pooled mapping only after the work of the stream that freed it, even when
 * a quiesce came before that free. */
static void finish_after_an_earlier_quiesce_still_waits_for_the_freeing_stream(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2);
  tu_free(a, p, S2);
  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  size_t sync = tu_first_call(from, VMM_DRV_stream_synchronize), unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  assert_true(sync != SIZE_MAX && unmap != SIZE_MAX && sync < unmap);
  assert_int_equal(fake_call_at(sync)->a0, (uintptr_t)S2);
  assert_int_equal(fake_call_at(unmap)->a0, dp(p));
  tu_destroy(a);
}

static void hit_on_same_stream_makes_no_driver_call(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = transient(a, 4 * MiB);
  tu_free(a, p, S1);
  size_t calls = fake_call_count();
  for (int i = 0; i < 3; i++) {
    assert_ptr_equal(transient(a, 4 * MiB), p);
    tu_free(a, p, S1);
  }
  assert_int_equal(fake_call_count(), calls);
  assert_int_equal(tu_snapshot(a).pool_hits, 3);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* A pool hit across streams needs the new stream ordered after the free, which a capturing
 * stream cannot be; taking a pooled mapping apart needs a wait for its freeing stream, which
 * cannot be done while that stream captures. */
static void capturing_stream_reuses_only_its_own(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  tu_free(a, p, S1);
  fake_set_capturing(S2, 1);

  /* From the capturing stream, p (freed on S1) is no hit; its handles are assembled into a
   * new range after a host wait for S1, which is not capturing. No event, no new memory. */
  size_t from = fake_call_count(), creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  void *q = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2);
  assert_ptr_not_equal(q, p);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 1);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S1), 1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 0);
  assert_int_equal(fake_mapped_size_at(dp(p)), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pool_misses, 2); /* p's own allocation, then q */
  assert_int_equal(s.pooled_taken_apart, 1);
  assert_int_equal(s.retained_reusable_handles, 0);

  /* A free and a take on the capturing stream itself: reuse, no driver call. */
  size_t calls = fake_call_count();
  tu_free(a, q, S2);
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2), q);
  assert_int_equal(fake_call_count(), calls);

  /* From another stream, the mapping freed on the capturing stream is neither a hit nor taken
   * apart: new memory, and q stays pooled and mapped. */
  tu_free(a, q, S2);
  from = fake_call_count();
  creates = ledger().calls_by_entry[VMM_DRV_mem_create];
  void *r = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_ptr_not_equal(r, q);
  assert_int_equal(ledger().calls_by_entry[VMM_DRV_mem_create], creates + 2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_event_record), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_wait_event), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(tu_mapped_from(q, 4 * MiB), 4 * MiB);
  s = tu_snapshot(a);
  assert_int_equal(s.pooled_taken_apart, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_count, 1);
  tu_free(a, r, S1);
  assert_int_equal(ledger().errors, 0);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

static void reuse_after_quiesce_needs_no_event(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
  tu_free(a, p, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  size_t calls = fake_call_count();
  assert_ptr_equal(tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S2), p);
  assert_int_equal(fake_call_count(), calls);
  tu_free(a, p, S2);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- Waiting for in-flight work before an idle mapping is unmapped ------------------ */

/* Finish unmaps idle mappings whose freeing streams may still run work on them: it waits
 * for each such stream once, before the first unmap; after a quiesce it need not. */
static void finish_waits_for_freeing_streams(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p1 = transient(a, 2 * MiB), *p2 = transient(a, 4 * MiB), *p3 = transient(a, 6 * MiB);
  tu_free(a, p1, S1);
  tu_free(a, p2, S2);
  tu_free(a, p3, S1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 2);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S1), 1);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S2), 1);
  size_t unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  for (size_t i = from; i < fake_call_count(); i++)
    if (fake_call_at(i)->entry == VMM_DRV_stream_synchronize) assert_true(i < unmap);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 3);

  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  tu_free(a, transient(a, 2 * MiB), S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 1);
  tu_destroy(a);
}

/* A stream that freed an idle mapping is capturing: it cannot be waited for, so finish is
 * refused before it touches anything, and succeeds once the capture is over. */
static void finish_refused_while_freeing_stream_captures(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = transient(a, 4 * MiB), *q = transient(a, 2 * MiB);
  tu_free(a, p, S1);
  tu_free(a, q, S2);
  arena_view before = view(a);
  fake_set_capturing(S2, 1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_SCOPE_STATE);
  assert_non_null(strstr(vmm_arena_last_error(a), "capturing"));
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 0);
  arena_view after = view(a);
  assert_views_equal(&before, &after);
  assert_int_equal(tu_snapshot(a).scope_state, VMM_SCOPE_ACTIVE);
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
  assert_int_equal(ledger().errors, 0);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* An assembly unmaps pooled mappings too: it waits for their freeing streams first, each
 * once. A mapping freed on a stream that is capturing cannot be waited for, so it is not taken
 * apart (neither by the exact assembly nor by the padded fallback), whichever stream asks. */
static void assembly_waits_for_freeing_streams(void **state) {
  (void)state;
  fake_options o = {.capacity = 12 * MiB};
  vmm_arena *a = tu_arena(&o, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t2 = transient(a, 2 * MiB), *t4 = transient(a, 4 * MiB), *t6 = transient(a, 6 * MiB);
  tu_free(a, t2, S2);
  tu_free(a, t4, S2);
  tu_free(a, t6, S1);
  size_t from = fake_call_count();
  void *s12 = tu_alloc(a, 12 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(tu_snapshot(a).assemblies, 1);
  assert_int_equal(tu_snapshot(a).pooled_taken_apart, 3);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S1), 1);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S2), 1);
  size_t unmap = tu_first_call(from, VMM_DRV_mem_unmap);
  assert_true(unmap != SIZE_MAX);
  for (size_t i = from; i < fake_call_count(); i++)
    if (fake_call_at(i)->entry == VMM_DRV_stream_synchronize) assert_true(i < unmap);
  tu_free(a, s12, S1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);

  a = tu_arena(&o, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  t2 = transient(a, 2 * MiB);
  t4 = transient(a, 4 * MiB);
  t6 = transient(a, 6 * MiB);
  tu_free(a, t2, S2);
  tu_free(a, t4, S1);
  tu_free(a, t6, S1);
  fake_set_capturing(S2, 1);
  from = fake_call_count();
  void *s10 = tu_alloc(a, 10 * MiB, VMM_KIND_TRANSIENT, S1); /* t6 + t4 */
  assert_int_equal(tu_snapshot(a).assemblies, 1);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S2), 0);
  assert_int_equal(fake_mapped_size_at(dp(t2)), 2 * MiB);
  assert_int_equal(tu_snapshot(a).retained_reusable_handles, 1);
  void *q = (void *)1; /* 12 MiB would need t2: refused, with everything left as it was */
  tu_free(a, s10, S1);
  arena_view before = view(a);
  from = fake_call_count();
  assert_int_equal(vmm_arena_alloc(a, 12 * MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  assert_int_equal(calls_with(from, VMM_DRV_stream_synchronize, (uintptr_t)S2), 0);
  arena_view after = view(a);
  assert_views_equal(&before, &after);
  assert_int_equal(tu_snapshot(a).padded_assemblies, 0);
  assert_int_equal(ledger().errors, 0);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);

  a = tu_arena(&o, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  t2 = transient(a, 2 * MiB);
  t4 = transient(a, 4 * MiB);
  t6 = transient(a, 6 * MiB);
  tu_free(a, t2, S1);
  tu_free(a, t4, S1);
  tu_free(a, t6, S1);
  before = view(a);
  fake_set_capturing(S1, 1);
  size_t calls = fake_call_count();
  assert_int_equal(vmm_arena_alloc(a, 12 * MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  assert_int_equal(fake_calls_since(calls, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_calls_since(calls, VMM_DRV_stream_synchronize), 0);
  after = view(a);
  assert_views_equal(&before, &after);
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
  assert_int_equal(ledger().errors, 0);
  fake_set_capturing(S1, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(twelve_warmups_create_memory_once),
      cmocka_unit_test(scope_state_rules),
      cmocka_unit_test(finish_drains_pool_shapes),
      cmocka_unit_test(finish_unmaps_two_of_one_size_once_each),
      cmocka_unit_test(finish_second_unmap_fails_then_resumes),
      cmocka_unit_test(finish_first_unmap_fails_state_unchanged),
      cmocka_unit_test(abort_makes_no_driver_call),
      cmocka_unit_test(package_free_in_scope_defers_release),
      cmocka_unit_test(package_alloc_never_takes_a_pooled_mapping_whole),
      cmocka_unit_test(live_mappings_survive_finish),
      cmocka_unit_test(retention_off_is_bookkeeping),
      cmocka_unit_test(retention_auto_follows_integrated),
      cmocka_unit_test(oom_falls_back_to_larger_pooled),
      cmocka_unit_test(assembles_three_idle_mappings),
      cmocka_unit_test(oom_with_nothing_fitting_is_recoverable),
      cmocka_unit_test(assembly_failure_restores_pool),
      cmocka_unit_test(reuse_on_other_stream_waits_on_event),
      cmocka_unit_test(reuse_after_an_earlier_quiesce_still_waits_on_event),
      cmocka_unit_test(finish_after_an_earlier_quiesce_still_waits_for_the_freeing_stream),
      cmocka_unit_test(hit_on_same_stream_makes_no_driver_call),
      cmocka_unit_test(capturing_stream_reuses_only_its_own),
      cmocka_unit_test(reuse_after_quiesce_needs_no_event),
      cmocka_unit_test(finish_waits_for_freeing_streams),
      cmocka_unit_test(finish_refused_while_freeing_stream_captures),
      cmocka_unit_test(assembly_waits_for_freeing_streams),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
