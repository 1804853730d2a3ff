/* Eager stitching (VMMARENA_STITCH=eager): inside a scope, a transient request that no single
 * pooled mapping serves is stitched from idle handles before any new memory is created, within
 * what the reuse policy allows. */
#include <string.h>

#include "test_util.h"

#define S1 TU_STREAM(1)

static vmm_arena *eager_arena(vmm_reuse_policy reuse) {
  vmm_config cfg = tu_config();
  assert_int_equal(vmm_config_set(&cfg, "VMMARENA_STITCH", "eager"), VMM_OK);
  assert_int_equal(cfg.stitch, VMM_STITCH_EAGER);
  cfg.reuse = reuse;
  return tu_arena(NULL, &cfg);
}

/* Pools mappings of the given sizes (MiB), freed on one stream. */
static void pool_sizes(vmm_arena *a, const size_t *mib, size_t n) {
  void *p[8];
  for (size_t i = 0; i < n; i++) p[i] = tu_alloc(a, mib[i] * MiB, VMM_KIND_TRANSIENT, S1);
  for (size_t i = 0; i < n; i++) assert_int_equal(vmm_arena_free(a, p[i], S1), VMM_OK);
}

static void best_fit_stitches_before_creating(void **state) {
  (void)state;
  vmm_arena *a = eager_arena(VMM_REUSE_BEST_FIT);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  const size_t sizes[] = {8, 6, 4, 2};
  pool_sizes(a, sizes, 4);
  size_t creates = fake_calls_since(0, VMM_DRV_mem_create);
  /* 10 MiB: no single mapping covers it; the tightest cover is 8 + 2, not 8 + 6. */
  void *p = tu_alloc(a, 10 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_create), creates);
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.stitches, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 10 * MiB);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_bytes, 10 * MiB); /* the 6 and the 4 */
  assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p), 8 * MiB);
  assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)p + 8 * MiB), 2 * MiB);
  tu_check(a);
  /* Freed, the stitched mapping pools whole, and finish releases all four handles once. */
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(tu_snapshot(a).kind[VMM_KIND_TRANSIENT].pooled_bytes, 20 * MiB);
  size_t from = fake_call_count();
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 4);
  tu_destroy(a);
}

static void exact_stitches_only_an_exact_cover(void **state) {
  (void)state;
  vmm_arena *a = eager_arena(VMM_REUSE_EXACT);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  const size_t sizes[] = {8, 4};
  pool_sizes(a, sizes, 2);
  size_t creates = fake_calls_since(0, VMM_DRV_mem_create);
  /* 12 MiB is covered exactly by 8 + 4: stitched. */
  void *p = tu_alloc(a, 12 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_create), creates);
  assert_int_equal(tu_snapshot(a).stitches, 1);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);

  /* 10 MiB from the same 8 + 4 would pin 12 MiB: exact does not allow it, so new memory. */
  a = eager_arena(VMM_REUSE_EXACT);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  pool_sizes(a, sizes, 2);
  creates = fake_calls_since(0, VMM_DRV_mem_create);
  void *q = tu_alloc(a, 10 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_create), creates + 1);
  assert_int_equal(tu_snapshot(a).stitches, 0);
  assert_int_equal(tu_snapshot(a).kind[VMM_KIND_TRANSIENT].pooled_bytes, 12 * MiB);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

static void plain_stitching_waits_for_a_refusal(void **state) {
  (void)state;
  vmm_config cfg = tu_config(); /* stitch on: only when new memory is refused */
  cfg.reuse = VMM_REUSE_BEST_FIT;
  vmm_arena *a = tu_arena(NULL, &cfg);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  const size_t sizes[] = {8, 2};
  pool_sizes(a, sizes, 2);
  size_t creates = fake_calls_since(0, VMM_DRV_mem_create);
  void *p = tu_alloc(a, 10 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_create), creates + 1);
  assert_int_equal(tu_snapshot(a).stitches, 0);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

static void eager_is_a_configuration_value(void **state) {
  (void)state;
  vmm_config cfg;
  vmm_config_init(&cfg);
  assert_int_equal(cfg.stitch, VMM_STITCH_ON);
  assert_int_equal(vmm_config_set(&cfg, "stitch", "EAGER"), VMM_OK);
  assert_int_equal(cfg.stitch, VMM_STITCH_EAGER);
  assert_int_equal(vmm_config_set(&cfg, "stitch", "sometimes"), VMM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(vmm_config_error(), "VMMARENA_STITCH=\"sometimes\""));
  assert_int_equal(cfg.stitch, VMM_STITCH_EAGER);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(best_fit_stitches_before_creating),
      cmocka_unit_test(exact_stitches_only_an_exact_cover),
      cmocka_unit_test(plain_stitching_waits_for_a_refusal),
      cmocka_unit_test(eager_is_a_configuration_value),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
