/* A first pass through the whole life cycle on the fake driver. */
#include "test_util.h"

static void lifecycle(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 3 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t = tu_alloc(a, 5 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(1));
  assert_int_equal(vmm_arena_free(a, t, TU_STREAM(1)), VMM_OK);
  void *t2 = tu_alloc(a, 5 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(1));
  assert_ptr_equal(t, t2);
  assert_int_equal(vmm_arena_free(a, t2, TU_STREAM(1)), VMM_OK);
  tu_check(a);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  char buf[8192];
  size_t need = 0;
  assert_int_equal(vmm_arena_snapshot_json(a, buf, sizeof buf, &need), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(lifecycle)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
