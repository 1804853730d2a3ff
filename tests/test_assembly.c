/* Assembly inside a retention scope: a request that no pooled mapping serves by the reuse
 * policy is mapped from idle handles back to back in a fresh range, and new memory is created
 * only for what they do not cover, cut into handles of at most the bound.
 *
 * Tables: assembly with a top-up (which idle handles, how much new memory, which driver calls),
 * package assembly (exact extent; off with package_assembly = 0), "never padded" (only the
 * fallback after a refusal pads, and never for a package), the handle bound (explicit and the
 * arena's choice), and pooled mappings taken apart (the tightest first, after a wait for the
 * freeing stream, never one freed on a capturing stream). */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define GRAIN (2 * MiB)
#define MAX_H 16

static CUdeviceptr dp(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

static size_t round_up(size_t bytes) { return (bytes + GRAIN - 1) / GRAIN * GRAIN; }

static size_t calls(size_t from, vmm_driver_entry e) { return fake_calls_since(from, e); }

static vmm_mapping *mapping_of(vmm_arena *a, const void *p) {
  vmm_mapping *m = vmm_table_find(&a->table, dp(p));
  assert_non_null(m);
  return m;
}

/* An arena with retention on, the default (exact) policy and this handle bound (0: the
 * arena's choice) and limit. */
static vmm_arena *arena_with(size_t bound, size_t limit, int package_assembly) {
  vmm_config cfg = tu_config();
  cfg.handle_bound_bytes = bound;
  cfg.limit_bytes = limit;
  cfg.package_assembly = package_assembly;
  return tu_arena(NULL, &cfg);
}

/* Idle unmapped handles of exactly these sizes (MiB, 0-terminated): packages made before
 * the scope are one handle each; freed inside it, they are kept idle. Begins the scope. */
static void make_idle(vmm_arena *a, const size_t *mib, CUmemGenericAllocationHandle *h) {
  void *p[MAX_H];
  size_t n = 0;
  for (; mib[n]; n++) {
    p[n] = tu_alloc(a, mib[n] * MiB, VMM_KIND_PACKAGE, S1);
    if (h) h[n] = mapping_of(a, p[n])->handles[0]->h;
  }
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  for (size_t i = 0; i < n; i++) assert_int_equal(vmm_arena_free(a, p[i], S1), VMM_OK);
  assert_int_equal(a->store.idle_count, n);
}

/* The mapping at p has these handle sizes (MiB, 0-terminated), in address order, and the
 * driver maps each where the arena says. */
static void expect_handles(vmm_arena *a, const void *p, const size_t *mib) {
  vmm_mapping *m = mapping_of(a, p);
  size_t n = 0, off = 0;
  for (; mib[n]; n++) {
    assert_true(n < m->handle_count);
    if (m->handles[n]->size != mib[n] * MiB)
      fail_msg("handle %zu is %zu bytes, expected %zu MiB", n, m->handles[n]->size, mib[n]);
    assert_int_equal(fake_mapped_size_at(dp(p) + off), mib[n] * MiB);
    assert_true(fake_access_granted(dp(p) + off, 0));
    off += mib[n] * MiB;
  }
  assert_int_equal(m->handle_count, n);
  assert_int_equal(m->extent, off);
}

static size_t count(const size_t *mib) {
  size_t n = 0;
  while (mib[n]) n++;
  return n;
}

static size_t sum(const size_t *mib) {
  size_t s = 0;
  for (size_t i = 0; mib[i]; i++) s += mib[i];
  return s;
}

/* ---- Assembly with a top-up -------------------------------------------------------------- */

typedef struct topup_case {
  const char *name;
  size_t bound;        /* MiB; the handle bound */
  size_t idle[MAX_H];  /* MiB, 0-terminated: idle handles before the request */
  size_t request;      /* bytes */
  size_t used[MAX_H];  /* MiB, 0-terminated: the idle handles it is mapped from, in address order */
  size_t fresh[MAX_H]; /* MiB, 0-terminated: the handles created after them */
} topup_case;

#define B(x) ((size_t)(x) * MiB)

static const topup_case topup_cases[] = {
    {"all three idle, 6 MiB created in handles of the bound", 4, {8, 4, 2}, B(20), {8, 4, 2}, {4, 2}},
    {"the largest that fits, repeatedly; 4 MiB left idle", 64, {8, 4, 2}, B(10), {8, 2}, {0}},
    {"equal sizes, then stop: the 2 MiB stays idle", 64, {6, 6, 2}, B(11), {6, 6}, {0}},
    {"one granule at a time", 64, {2, 2, 2}, B(3), {2, 2}, {0}},
    {"a 12 MiB handle and a 2 MiB one", 64, {12, 2}, B(13), {12, 2}, {0}},
    {"bound of one granule: the rest in 2 MiB handles", 2, {4}, B(9), {4}, {2, 2, 2}},
    {"bound 6 MiB: 18 MiB new as three handles of the bound", 6, {2}, B(20), {2}, {6, 6, 6}},
    {"bound 6 MiB: what is left below it, one handle", 6, {2}, B(12), {2}, {6, 4}},
    {"bound 64 MiB: 14 MiB new as one handle", 64, {4}, B(18), {4}, {14}},
    {"1 byte over: one more granule", 64, {8}, B(8) + 1, {8}, {2}},
};

static void assembly_with_top_up(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof topup_cases / sizeof topup_cases[0]; k++) {
    const topup_case *c = &topup_cases[k];
    fprintf(stderr, "case %zu: %s\n", k, c->name);
    for (int kind = 0; kind < VMM_KIND_COUNT; kind++) { /* transient, and package exactly alike */
      vmm_arena *a = arena_with(B(c->bound), 0, 1);
      make_idle(a, c->idle, NULL);
      vmm_snapshot before = tu_snapshot(a);
      size_t from = fake_call_count(), rounded = round_up(c->request);
      size_t covered = B(sum(c->used)), created = B(sum(c->fresh));
      assert_int_equal(covered + created, rounded);
      void *p = tu_alloc(a, c->request, (vmm_kind)kind, S1);

      /* The handles used, then the new ones; the extent is the rounded request. */
      size_t all[2 * MAX_H] = {0}, n = 0;
      for (size_t i = 0; c->used[i]; i++) all[n++] = c->used[i];
      for (size_t i = 0; c->fresh[i]; i++) all[n++] = c->fresh[i];
      expect_handles(a, p, all);
      assert_int_equal(mapping_of(a, p)->extent, rounded);
      for (size_t i = 0; c->fresh[i]; i++) assert_true(B(c->fresh[i]) <= B(c->bound));

      /* Driver calls: a create per new handle, a map per handle, one access grant; nothing
       * unmapped (no pooled mapping), nothing released. */
      assert_int_equal(calls(from, VMM_DRV_mem_create), count(c->fresh));
      assert_int_equal(calls(from, VMM_DRV_mem_map), n);
      assert_int_equal(calls(from, VMM_DRV_mem_set_access), 1);
      assert_int_equal(calls(from, VMM_DRV_mem_unmap), 0);
      assert_int_equal(calls(from, VMM_DRV_mem_release), 0);
      for (size_t i = from, end = fake_call_count(); i < end; i++) /* every create before the first map */
        if (fake_call_at(i)->entry == VMM_DRV_mem_map) assert_int_equal(calls(i, VMM_DRV_mem_create), 0);

      vmm_snapshot s = tu_snapshot(a);
      assert_int_equal(s.assemblies, 1);
      assert_int_equal(s.assembled_idle_handles, count(c->used));
      assert_int_equal(s.assembly_created_bytes, created);
      assert_int_equal(s.padded_assemblies + s.pooled_taken_apart, 0);
      assert_int_equal(s.physical_bytes, before.physical_bytes + created);
      assert_int_equal(s.retained_reusable_handles, count(c->idle) - count(c->used));
      assert_int_equal(s.retained_reusable_bytes, B(sum(c->idle)) - covered);
      assert_int_equal(s.kind[kind].live_bytes, rounded);
      assert_int_equal(s.handle_bound_bytes, B(c->bound));
      tu_check(a);

      /* Freed inside the scope, every handle stays: none is released before finish. */
      from = fake_call_count();
      assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
      assert_int_equal(calls(from, VMM_DRV_mem_release), 0);
      s = tu_snapshot(a);
      assert_int_equal(s.retained_reusable_bytes, B(sum(c->idle)) + created);
      from = fake_call_count();
      assert_int_equal(vmm_retention_finish(a), VMM_OK);
      assert_int_equal(calls(from, VMM_DRV_mem_release), count(c->idle) - count(c->used) + n);
      tu_destroy(a);
    }
  }
}

/* Among idle handles of one size, the newest is taken first; the one left is the oldest. */
static void newest_idle_handle_of_a_size_first(void **state) {
  (void)state;
  vmm_arena *a = arena_with(B(64), 0, 1);
  CUmemGenericAllocationHandle h[3];
  make_idle(a, (const size_t[]){4, 4, 4, 0}, h);
  void *p = tu_alloc(a, B(8), VMM_KIND_TRANSIENT, S1);
  vmm_mapping *m = mapping_of(a, p);
  assert_int_equal(m->handles[0]->h, h[2]);
  assert_int_equal(m->handles[1]->h, h[1]);
  vmm_handle *left = vmm_container_of(a->store.idle, vmm_handle, node);
  assert_int_equal(a->store.idle_count, 1);
  assert_int_equal(left->h, h[0]);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- Package assembly ---------------------------------------------------------------------- */

/* A package request inside the scope is assembled exactly: its handles add up to the rounded
 * request, with no padding; outside a scope it is one new handle. With package_assembly off it
 * is one new handle inside the scope too, and the idle handles stay idle. */
static void package_assembly_exact_or_off(void **state) {
  (void)state;
  static const size_t idle[] = {8, 4, 2, 0};
  for (int on = 1; on >= 0; on--) {
    vmm_arena *a = arena_with(B(64), 0, on);
    make_idle(a, idle, NULL);
    size_t from = fake_call_count();
    void *p = tu_alloc(a, B(13) + 5, VMM_KIND_PACKAGE, S1); /* 14 MiB */
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, B(14));
    if (on) {
      expect_handles(a, p, (const size_t[]){8, 4, 2, 0});
      assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
      assert_int_equal(s.assemblies, 1);
      assert_int_equal(s.retained_reusable_handles, 0);
      assert_int_equal(s.physical_bytes, B(14));
    } else {
      expect_handles(a, p, (const size_t[]){14, 0}); /* one handle, not cut */
      assert_int_equal(calls(from, VMM_DRV_mem_create), 1);
      assert_int_equal(s.assemblies, 0);
      assert_int_equal(s.retained_reusable_handles, 3);
      assert_int_equal(s.physical_bytes, B(28));
      /* A transient request still assembles from them. */
      void *t = tu_alloc(a, B(12), VMM_KIND_TRANSIENT, S1);
      expect_handles(a, t, (const size_t[]){8, 4, 0});
      assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
    }
    assert_int_equal(tu_snapshot(a).pool_misses + tu_snapshot(a).pool_hits, on ? 0 : 1);
    /* Freed in the scope, its handles are idle; finish releases them with the rest. */
    from = fake_call_count();
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    assert_int_equal(calls(from, VMM_DRV_mem_release), 0);
    /* Off: p's 14 MiB and the idle 2 MiB the transient left (its 8 + 4 are pooled with it). */
    assert_int_equal(tu_snapshot(a).kind[VMM_KIND_PACKAGE].idle_bytes, on ? B(14) : B(16));
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    assert_int_equal(tu_snapshot(a).physical_bytes, 0);
    /* Outside a scope: one new handle whatever is configured. */
    from = fake_call_count();
    p = tu_alloc(a, B(14), VMM_KIND_PACKAGE, S1);
    expect_handles(a, p, (const size_t[]){14, 0});
    assert_int_equal(calls(from, VMM_DRV_mem_create), 1);
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- Never padded --------------------------------------------------------------------------- */

/* An idle handle larger than what is left of a request is never used to pad it: the shortfall
 * is created and the large handle stays idle, for the transient and the package kind alike.
 * Only after a refusal may a transient request take a larger idle handle (a padded assembly);
 * a package request is refused instead. */
static void never_padded(void **state) {
  (void)state;
  for (int kind = 0; kind < VMM_KIND_COUNT; kind++) {
    /* 16 MiB idle; 10 MiB asked: 10 MiB created, the 16 MiB handle untouched. */
    vmm_arena *a = arena_with(B(64), 0, 1);
    make_idle(a, (const size_t[]){16, 0}, NULL);
    void *p = tu_alloc(a, B(10), (vmm_kind)kind, S1);
    expect_handles(a, p, (const size_t[]){10, 0});
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.assemblies + s.padded_assemblies, 0);
    assert_int_equal(s.retained_reusable_bytes, B(16));
    assert_int_equal(s.physical_bytes, B(26));
    /* 20 MiB: the 16 MiB handle and 4 MiB created. */
    void *q = tu_alloc(a, B(20), (vmm_kind)kind, S1);
    expect_handles(a, q, (const size_t[]){16, 4, 0});
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);

    /* The limit leaves nothing to create: 16 MiB idle, 10 MiB asked. */
    a = arena_with(B(64), B(16), 1);
    make_idle(a, (const size_t[]){16, 0}, NULL);
    void *r = (void *)1;
    vmm_status st = vmm_arena_alloc(a, B(10), (vmm_kind)kind, S1, &r);
    s = tu_snapshot(a);
    assert_int_equal(s.limit_refusals, 1);
    if (kind == VMM_KIND_PACKAGE) {
      assert_int_equal(st, VMM_ERR_OUT_OF_MEMORY);
      assert_null(r);
      assert_int_equal(s.padded_assemblies, 0);
      assert_int_equal(s.retained_reusable_bytes, B(16));
      assert_non_null(strstr(vmm_arena_last_error(a), "limit 16.0 MiB < 16.0 MiB held + 10.0 MiB requested"));
    } else {
      assert_int_equal(st, VMM_OK);
      expect_handles(a, r, (const size_t[]){16, 0}); /* padded: the only way left */
      assert_int_equal(s.padded_assemblies, 1);
      assert_int_equal(s.assemblies, 1);
      assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, B(16));
      assert_int_equal(mapping_of(a, r)->requested, B(10));
      assert_int_equal(vmm_arena_free(a, r, S1), VMM_OK);
    }
    tu_check(a);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

/* The padded fallback takes the largest idle handles that fit, then the smallest larger one
 * (from the idle tier, or left in a pooled mapping taken apart); it creates nothing. */
static void padded_fallback_after_a_refusal(void **state) {
  (void)state;
  /* Idle 8, 4 and 16 MiB, all the limit allows: 14 MiB is 8 + 4, then the 16 MiB handle for
   * the 2 MiB left. */
  vmm_arena *a = arena_with(B(64), B(28), 1);
  make_idle(a, (const size_t[]){8, 4, 16, 0}, NULL);
  size_t from = fake_call_count();
  void *p = tu_alloc(a, B(14), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, p, (const size_t[]){8, 4, 16, 0});
  assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.padded_assemblies, 1);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.retained_reusable_handles, 0);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);

  /* Two pooled 4 MiB mappings (one handle each), all the limit allows; 6 MiB asked. The exact
   * assembly takes one and would create 2 MiB: refused. No pooled mapping holds 6 MiB. The
   * padded one takes both apart: 8 MiB for the request. */
  a = arena_with(B(64), B(8), 1);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t1 = tu_alloc(a, B(4), VMM_KIND_TRANSIENT, S1), *t2 = tu_alloc(a, B(4), VMM_KIND_TRANSIENT, S1);
  assert_int_equal(vmm_arena_free(a, t1, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t2, S1), VMM_OK);
  from = fake_call_count();
  p = tu_alloc(a, B(6), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, p, (const size_t[]){4, 4, 0});
  assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
  assert_int_equal(calls(from, VMM_DRV_mem_unmap), 2);
  s = tu_snapshot(a);
  assert_int_equal(s.padded_assemblies, 1);
  assert_int_equal(s.pooled_taken_apart, 2);
  assert_int_equal(s.pool_fallbacks, 0);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(mapping_of(a, p)->requested, B(6));
  /* A package of the same size is refused: never padded. */
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  void *q = (void *)1;
  assert_int_equal(vmm_arena_alloc(a, B(6), VMM_KIND_PACKAGE, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  assert_int_equal(tu_snapshot(a).padded_assemblies, 1);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- The handle bound ---------------------------------------------------------------------- */

/* An explicit bound is rounded up to the granularity and cuts the new memory of every
 * assembly; outside a scope memory is one handle whatever the bound. */
static void explicit_bound(void **state) {
  (void)state;
  static const struct {
    size_t bound, reported; /* bytes */
    size_t request;
    size_t handles[MAX_H];  /* MiB */
  } cases[] = {
      {B(3), B(4), B(10), {4, 4, 2, 0}},        /* 3 MiB rounds up to two granules */
      {B(4), B(4), B(16), {4, 4, 4, 4, 0}},
      {B(2), B(2), B(7), {2, 2, 2, 2, 0}},
      {B(10), B(10), B(36), {10, 10, 10, 6, 0}},
      {GiB, GiB, B(30), {30, 0}},               /* above the arena's own ceiling: honoured */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    vmm_arena *a = arena_with(cases[k].bound, 0, 1);
    assert_int_equal(tu_snapshot(a).handle_bound_bytes, cases[k].reported);
    void *outside = tu_alloc(a, cases[k].request, VMM_KIND_TRANSIENT, S1);
    assert_int_equal(mapping_of(a, outside)->handle_count, 1);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    size_t from = fake_call_count();
    void *p = tu_alloc(a, cases[k].request, VMM_KIND_TRANSIENT, S1);
    expect_handles(a, p, cases[k].handles);
    assert_int_equal(calls(from, VMM_DRV_mem_create), count(cases[k].handles));
    for (uint32_t i = 0; i < mapping_of(a, p)->handle_count; i++)
      assert_true(mapping_of(a, p)->handles[i]->size <= cases[k].reported);
    assert_int_equal(tu_snapshot(a).assemblies, 0); /* new memory only: no idle handle */
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    assert_int_equal(vmm_arena_free(a, outside, S1), VMM_OK);
    tu_destroy(a);
  }
}

/* The arena's own bound: the largest power of two at most 1/64 of the scope's physical peak
 * (what was held when it began, then the most held since), or of a request larger than that,
 * at least a granule and at most 256 MiB, reported in the snapshot. Outside a scope the
 * snapshot reports the bound a scope begun now would start with. */
static void auto_bound_follows_the_peak(void **state) {
  (void)state;
  vmm_arena *a = arena_with(0, 0, 1);
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, GRAIN); /* nothing held yet */
  void *p = tu_alloc(a, 2 * GiB, VMM_KIND_PACKAGE, S1);    /* held 2 GiB: 32 MiB */
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, B(32));
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, GRAIN); /* a scope begun now holds nothing */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t = tu_alloc(a, B(70), VMM_KIND_TRANSIENT, S1); /* 70 MiB, more than held: 1 MiB -> a granule */
  expect_handles(a, t, (const size_t[]){2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
                                        2, 2, 2, 2, 2, 2, 2, 2, 0});
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  p = tu_alloc(a, 3 * GiB, VMM_KIND_PACKAGE, S1); /* held 3 GiB: 48 MiB, down to a power of two */
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, B(32));
  void *q = tu_alloc(a, 2 * GiB, VMM_KIND_PACKAGE, S1); /* held 5 GiB: 80 MiB -> 64 MiB */
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, B(64));
  assert_int_equal(vmm_retention_begin(a), VMM_OK); /* the scope starts from the 5 GiB held */
  t = tu_alloc(a, B(150), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, t, (const size_t[]){64, 64, 22, 0});
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  void *r = tu_alloc(a, 70 * GiB, VMM_KIND_PACKAGE, S1); /* peak 75 GiB inside the scope: at most 256 MiB */
  assert_int_equal(tu_snapshot(a).handle_bound_bytes, B(256));
  assert_int_equal(vmm_arena_free(a, r, S1), VMM_OK);
  size_t from = fake_call_count();
  /* 600 MiB from idle: two 256 MiB handles of the package, 64 + 22 MiB of the pooled 150 MiB
   * mapping; the last 2 MiB are smaller than any idle handle left, so they are created. */
  t = tu_alloc(a, B(600), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, t, (const size_t[]){256, 256, 64, 22, 2, 0});
  assert_int_equal(calls(from, VMM_DRV_mem_create), 1);
  char json[16384];
  assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, NULL), VMM_OK);
  assert_non_null(strstr(json, "\"handle_bound_bytes\":268435456,\"package_assembly\":true"));
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  /* A first request larger than all held is cut into 1/64 of itself, not into granules. */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  from = fake_call_count();
  t = tu_alloc(a, 40 * GiB, VMM_KIND_TRANSIENT, S1); /* 640 MiB -> at most 256 MiB: 160 handles */
  assert_int_equal(calls(from, VMM_DRV_mem_create), 160);
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* ---- Pooled mappings taken apart ------------------------------------------------------------ */

/* Bound 4 MiB: pooled 6 (4 + 2), 12 (4 + 4 + 4) and 16 MiB (4 x 4); 10 MiB asked (no exact
 * hit). The tightest mapping that covers what is left comes first: 12, for two of its 4 MiB
 * handles; then 6, for its 2 MiB one. The handles not used (a 4 MiB one of each) stay idle,
 * unmapped; 16 stays pooled. */
static void tightest_pooled_mapping_first(void **state) {
  (void)state;
  vmm_arena *a = arena_with(B(4), 0, 1);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t6 = tu_alloc(a, B(6), VMM_KIND_TRANSIENT, S1), *t12 = tu_alloc(a, B(12), VMM_KIND_TRANSIENT, S1);
  void *t16 = tu_alloc(a, B(16), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, t12, (const size_t[]){4, 4, 4, 0});
  assert_int_equal(vmm_arena_free(a, t6, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t12, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t16, S1), VMM_OK);
  size_t from = fake_call_count();
  void *p = tu_alloc(a, B(10), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, p, (const size_t[]){4, 4, 2, 0});
  assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
  assert_int_equal(calls(from, VMM_DRV_mem_unmap), 2);
  assert_int_equal(fake_mapped_size_at(dp(t6)), 0);
  assert_int_equal(fake_mapped_size_at(dp(t12)), 0);
  assert_int_equal(tu_mapped_from(t16, B(16)), B(16));
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pooled_taken_apart, 2);
  assert_int_equal(s.assembled_idle_handles, 3);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].idle_count, 2);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].idle_bytes, B(8));
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_bytes, B(16));
  assert_int_equal(s.retained_reusable_bytes, B(24));
  tu_check(a);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* Before a pooled mapping is unmapped to be taken apart, the stream that freed it is waited
 * for (once per stream, all before the first unmap); a mapping freed on a stream that is
 * capturing cannot be waited for and is left alone; after a quiesce nothing needs a wait. */
static void taking_apart_waits_for_the_freeing_stream(void **state) {
  (void)state;
  const CUstream S3 = TU_STREAM(3);
  vmm_arena *a = arena_with(B(64), 0, 1);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *x = tu_alloc(a, B(2), VMM_KIND_TRANSIENT, S1), *y = tu_alloc(a, B(2), VMM_KIND_TRANSIENT, S2);
  void *z = tu_alloc(a, B(2), VMM_KIND_TRANSIENT, S2), *c = tu_alloc(a, B(2), VMM_KIND_TRANSIENT, S3);
  assert_int_equal(vmm_arena_free(a, x, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, y, S2), VMM_OK);
  assert_int_equal(vmm_arena_free(a, z, S2), VMM_OK);
  assert_int_equal(vmm_arena_free(a, c, S3), VMM_OK);
  fake_set_capturing(S3, 1);
  /* 8 MiB on S1: x, y and z taken apart, c skipped (S3 captures), 2 MiB created instead. */
  size_t from = fake_call_count();
  void *p = tu_alloc(a, B(8), VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 2);
  size_t first_unmap = SIZE_MAX;
  for (size_t i = from, end = fake_call_count(); i < end; i++) {
    const fake_call *k = fake_call_at(i);
    if (k->entry == VMM_DRV_mem_unmap && first_unmap == SIZE_MAX) first_unmap = i;
    if (k->entry != VMM_DRV_stream_synchronize) continue;
    assert_true(k->a0 == (uintptr_t)S1 || k->a0 == (uintptr_t)S2); /* never the capturing S3 */
    assert_true(first_unmap == SIZE_MAX);
  }
  assert_int_equal(calls(from, VMM_DRV_mem_unmap), 3);
  assert_int_equal(calls(from, VMM_DRV_mem_create), 1);
  assert_int_equal(fake_mapped_size_at(dp(c)), B(2));
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pooled_taken_apart, 3);
  assert_int_equal(s.assembly_created_bytes, B(2));
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_count, 1);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);

  /* After a quiesce no wait is needed, even for the mapping freed on the capturing stream. */
  fake_set_capturing(S3, 0);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  fake_set_capturing(S3, 1);
  from = fake_call_count();
  void *q = tu_alloc(a, B(10), VMM_KIND_TRANSIENT, S1); /* p (8) and c (2) taken apart */
  assert_int_equal(calls(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
  assert_int_equal(calls(from, VMM_DRV_mem_unmap), 2);
  assert_int_equal(fake_mapped_size_at(dp(c)), 0);
  assert_int_equal(tu_snapshot(a).pooled_taken_apart, 5);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  fake_set_capturing(S3, 0);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* An unmap that fails while pooled mappings are taken apart puts them all back as they were:
 * the one that failed and those not reached yet stay pooled and can be taken apart by the
 * next assembly. */
static void failed_unmap_leaves_pooled_mappings_choosable(void **state) {
  (void)state;
  vmm_arena *a = arena_with(B(64), B(8), 1); /* two 4 MiB mappings fill the limit */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t1 = tu_alloc(a, B(4), VMM_KIND_TRANSIENT, S1), *t2 = tu_alloc(a, B(4), VMM_KIND_TRANSIENT, S1);
  assert_int_equal(vmm_arena_free(a, t1, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t2, S1), VMM_OK);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0); /* t2, the first taken apart */
  void *p = (void *)1;
  assert_int_equal(vmm_arena_alloc(a, B(8), VMM_KIND_TRANSIENT, S1, &p), VMM_ERR_DRIVER);
  fake_clear_faults();
  assert_null(p);
  tu_check(a);
  assert_int_equal(fake_mapped_size_at(dp(t1)), B(4));
  assert_int_equal(fake_mapped_size_at(dp(t2)), B(4));
  /* The same request again: both taken apart, nothing created (the limit allows nothing). */
  size_t from = fake_call_count();
  p = tu_alloc(a, B(8), VMM_KIND_TRANSIENT, S1);
  expect_handles(a, p, (const size_t[]){4, 4, 0});
  assert_int_equal(calls(from, VMM_DRV_mem_create), 0);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.pooled_taken_apart, 2);
  assert_int_equal(s.padded_assemblies + s.limit_refusals, 0);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(assembly_with_top_up),
      cmocka_unit_test(newest_idle_handle_of_a_size_first),
      cmocka_unit_test(package_assembly_exact_or_off),
      cmocka_unit_test(never_padded),
      cmocka_unit_test(padded_fallback_after_a_refusal),
      cmocka_unit_test(explicit_bound),
      cmocka_unit_test(auto_bound_follows_the_peak),
      cmocka_unit_test(tightest_pooled_mapping_first),
      cmocka_unit_test(taking_apart_waits_for_the_freeing_stream),
      cmocka_unit_test(failed_unmap_leaves_pooled_mappings_choosable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
