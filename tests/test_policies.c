/* Reuse policies: which pooled mapping each transient request inside a scope receives under
 * exact, bounded:2, best-fit and none, and the rule that a pooled mapping is handed back
 * whole, never split. Where the policy finds no mapping (a miss), the request is assembled:
 * pooled mappings whose handles fit what is left are taken apart and new memory is created
 * only for the rest; with reuse none, nothing is reused at all. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#define S1 TU_STREAM(1)
#define MISS (-1)
#define MAX_POOLED 6

typedef struct policy_case {
  vmm_reuse_policy policy;
  double bound;
  size_t pooled[MAX_POOLED]; /* MiB, freed in this order (the later of two equal sizes is the bucket head) */
  size_t pooled_count;
  size_t request;            /* bytes */
  int expect;                /* index into pooled of the mapping handed out, or MISS */
  unsigned apart;            /* on a miss: bit i set if pooled mapping i is taken apart for the assembly */
  size_t created;            /* on a miss: MiB created for what the handles taken do not cover */
} policy_case;

#define B(x) ((size_t)(x) * MiB)

static const policy_case cases[] = {
    /* exact: only the rounded size itself */
    {VMM_REUSE_EXACT, 0, {4, 8, 16}, 3, B(8), 1},
    {VMM_REUSE_EXACT, 0, {4, 8, 16}, 3, B(7), 1},     /* 7 MiB rounds to 8 */
    {VMM_REUSE_EXACT, 0, {4, 8, 16}, 3, B(6), MISS, 0x1, 2},  /* 8 fits but is not exact: 4 taken apart, 2 new */
    {VMM_REUSE_EXACT, 0, {4, 8, 16}, 3, B(16) + 1, MISS, 0x4, 2}, /* 18 MiB: 16 + 2 new; 4 and 8 would pad */
    {VMM_REUSE_EXACT, 0, {2, 4}, 2, 1, 0},            /* 1 byte rounds to one granule */
    {VMM_REUSE_EXACT, 0, {8, 4, 8}, 3, B(8), 2},      /* the latest freed of a size */
    /* 66 MiB is 1/32 over: only whole-process mode takes it; here the handle would pad: 64 new */
    {VMM_REUSE_EXACT, 0, {66}, 1, B(64), MISS, 0, 64},
    /* bounded:2: the smallest mapping in [request, 2 x request] */
    {VMM_REUSE_BOUNDED, 2, {4, 8, 16}, 3, B(3), 0},   /* 3 rounds to 4 */
    {VMM_REUSE_BOUNDED, 2, {4, 8, 16}, 3, B(6), 1},
    {VMM_REUSE_BOUNDED, 2, {4, 8, 16}, 3, B(9), 2},   /* 10 rounded: [10, 20] holds 16 */
    {VMM_REUSE_BOUNDED, 2, {6, 8}, 2, B(4), 0},       /* [4, 8]: 6 is the smallest */
    {VMM_REUSE_BOUNDED, 2, {4, 32}, 2, B(12), MISS, 0x1, 8}, /* [12, 24] holds nothing: 4 + 8 new */
    {VMM_REUSE_BOUNDED, 2, {4, 32}, 2, B(16), 1},     /* the bound is inclusive */
    /* [16, 32] holds nothing; the 34 MiB handle is larger than 16 and never pads it: 4 + 12 new */
    {VMM_REUSE_BOUNDED, 2, {4, 34}, 2, B(16), MISS, 0x1, 12},
    /* best-fit: the smallest mapping at least the request */
    {VMM_REUSE_BEST_FIT, 0, {4, 8, 64}, 3, B(10), 2},
    {VMM_REUSE_BEST_FIT, 0, {4, 8, 64}, 3, B(2), 0},
    {VMM_REUSE_BEST_FIT, 0, {4, 8, 64}, 3, B(8), 1},
    {VMM_REUSE_BEST_FIT, 0, {4, 8, 64}, 3, B(64) + 1, MISS, 0x4, 2},
    {VMM_REUSE_BEST_FIT, 0, {64, 8, 8}, 3, B(5), 2},
    /* none: retain, never reuse */
    {VMM_REUSE_NONE, 0, {4}, 1, B(4), MISS, 0, 4},
    {VMM_REUSE_NONE, 0, {2, 4, 8}, 3, B(3), MISS, 0, 4},
};

static size_t creates(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l.calls_by_entry[VMM_DRV_mem_create];
}

/* Handles created inside a scope for `bytes` under a bound of 1 GiB: one. */
static size_t pieces(size_t bytes) { return bytes ? 1 : 0; }

/* With handle_bound (0 = the arena's choice). */
static vmm_arena *policy_arena_bound(vmm_reuse_policy policy, double bound, size_t handle_bound) {
  vmm_config cfg = tu_config();
  cfg.reuse = policy;
  cfg.reuse_bound = bound;
  cfg.handle_bound_bytes = handle_bound;
  vmm_arena *a = tu_arena(NULL, &cfg);
  assert_int_equal(tu_snapshot(a).reuse, policy);
  return a;
}

static vmm_arena *policy_arena(vmm_reuse_policy policy, double bound) { return policy_arena_bound(policy, bound, 0); }

static void policy_table(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const policy_case *c = &cases[k];
    fprintf(stderr, "case %zu: %s:%g, request %zu bytes\n", k, vmm_reuse_policy_name(c->policy), c->bound, c->request);
    /* A bound above every size here: each pooled mapping is one handle. */
    vmm_arena *a = policy_arena_bound(c->policy, c->bound, GiB);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *pooled[MAX_POOLED];
    for (size_t i = 0; i < c->pooled_count; i++) pooled[i] = tu_alloc(a, c->pooled[i] * MiB, VMM_KIND_TRANSIENT, S1);
    for (size_t i = 0; i < c->pooled_count; i++) assert_int_equal(vmm_arena_free(a, pooled[i], S1), VMM_OK);
    vmm_snapshot before = tu_snapshot(a);
    size_t handles = 0;
    for (size_t i = 0; i < c->pooled_count; i++) handles += pieces(c->pooled[i] * MiB);
    assert_int_equal(before.retained_reusable_handles, handles);
    size_t created = creates();

    void *got = tu_alloc(a, c->request, VMM_KIND_TRANSIENT, S1);
    vmm_snapshot after = tu_snapshot(a);
    if (c->expect == MISS) {
      size_t rounded = (c->request + B(2) - 1) / B(2) * B(2), apart = 0;
      for (size_t i = 0; i < c->pooled_count; i++) {
        assert_ptr_not_equal(got, pooled[i]);
        apart += c->apart >> i & 1;
      }
      /* Exactly the request: the idle handles taken and the new memory add up to it. */
      size_t taken = rounded - c->created * MiB;
      assert_int_equal(after.kind[VMM_KIND_TRANSIENT].live_bytes, rounded);
      assert_int_equal(creates(), created + pieces(c->created * MiB));
      assert_int_equal(after.pool_hits, before.pool_hits);
      assert_int_equal(after.pooled_taken_apart, apart);
      assert_int_equal(after.assemblies, apart ? 1 : 0);
      assert_int_equal(after.assembly_created_bytes, apart ? c->created * MiB : 0);
      assert_int_equal(after.retained_reusable_handles, before.retained_reusable_handles - after.assembled_idle_handles);
      assert_int_equal(after.retained_reusable_bytes, before.retained_reusable_bytes - taken);
      for (size_t i = 0; i < c->pooled_count; i++) /* what is taken apart is no longer mapped where it was */
        assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)pooled[i]) == 0, (c->apart >> i & 1) != 0);
      if (c->policy != VMM_REUSE_NONE) assert_int_equal(after.pool_misses, before.pool_misses + 1);
    } else {
      size_t extent = c->pooled[c->expect] * MiB;
      assert_ptr_equal(got, pooled[c->expect]);
      assert_int_equal(creates(), created);
      assert_int_equal(after.pool_hits, before.pool_hits + 1);
      assert_int_equal(after.retained_reusable_handles, before.retained_reusable_handles - pieces(extent));
      assert_int_equal(after.retained_reusable_bytes, before.retained_reusable_bytes - extent);
      assert_int_equal(after.kind[VMM_KIND_TRANSIENT].live_bytes, extent); /* whole mapping */
    }
    assert_int_equal(vmm_arena_free(a, got, S1), VMM_OK);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

/* The JSON inventory entry of the mapping at base (the text from its "base" key on). */
static const char *inventory_entry(const char *json, void *base) {
  char key[64];
  snprintf(key, sizeof key, "{\"base\":\"0x%llx\"", (unsigned long long)(uintptr_t)base);
  const char *e = strstr(json, key);
  assert_non_null(e);
  return e;
}

/* A 4 MiB request served by an 8 MiB mapping records the full 8 MiB extent, and its free
 * returns all 8 MiB to the pool. The mapping was created inside the scope, while little was
 * held: four handles of the bound, one granule each. */
static void pooled_mapping_handed_back_whole(void **state) {
  (void)state;
  static const struct {
    vmm_reuse_policy policy;
    double bound;
  } policies[] = {{VMM_REUSE_BEST_FIT, 0}, {VMM_REUSE_BOUNDED, 2}};
  for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
    vmm_arena *a = policy_arena(policies[k].policy, policies[k].bound);
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *big = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1);
    assert_int_equal(vmm_arena_free(a, big, S1), VMM_OK);
    void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
    assert_ptr_equal(p, big);
    for (size_t off = 0; off < 8 * MiB; off += 2 * MiB)
      assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p + off), 2 * MiB);

    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 1);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 8 * MiB);
    assert_int_equal(s.retained_reusable_handles, 0);
    assert_int_equal(s.assemblies, 0);
    static char json[16384];
    char want[160];
    assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, NULL), VMM_OK);
    snprintf(want, sizeof want,
             "{\"base\":\"0x%llx\",\"extent\":%zu,\"requested\":%zu,\"kind\":\"transient\",\"state\":\"live\"",
             (unsigned long long)(uintptr_t)p, 8 * MiB, 4 * MiB);
    assert_ptr_equal(strstr(json, want), inventory_entry(json, p));

    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    s = tu_snapshot(a);
    assert_int_equal(s.retained_reusable_handles, 4);
    assert_int_equal(s.retained_reusable_bytes, 8 * MiB);
    assert_int_equal(s.handle_bound_bytes, 2 * MiB);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 0);
    assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, NULL), VMM_OK);
    snprintf(want, sizeof want, "{\"size\":%zu,\"count\":1}", 8 * MiB);
    assert_non_null(strstr(json, want));
    snprintf(want, sizeof want,
             "{\"base\":\"0x%llx\",\"extent\":%zu,\"requested\":%zu,\"kind\":\"transient\",\"state\":\"pooled\"",
             (unsigned long long)(uintptr_t)p, 8 * MiB, 4 * MiB);
    assert_ptr_equal(strstr(json, want), inventory_entry(json, p));
    /* The whole mapping serves an exact 8 MiB request next. */
    assert_ptr_equal(tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1), big);
    assert_int_equal(vmm_arena_free(a, big, S1), VMM_OK);
    assert_int_equal(vmm_retention_finish(a), VMM_OK);
    tu_destroy(a);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(policy_table),
      cmocka_unit_test(pooled_mapping_handed_back_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
