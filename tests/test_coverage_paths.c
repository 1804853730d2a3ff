/* Paths the scenario suites rarely reach: byte formatting and status names, driver error names
 * and the sticky fatal error, the AVL tree, pool and mapping table used directly, and retention
 * scope calls on a NULL arena, an inconsistent pool and repeated aborts. */
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

static void test_fmt_bytes_units(void **state) {
  (void)state;
  char b[32];
  assert_string_equal(vmm_errors_fmt_bytes(0, b), "0 B");
  assert_string_equal(vmm_errors_fmt_bytes(1023, b), "1023 B");
  assert_string_equal(vmm_errors_fmt_bytes(1024, b), "1.0 KiB");
  assert_string_equal(vmm_errors_fmt_bytes(1536, b), "1.5 KiB");
  assert_string_equal(vmm_errors_fmt_bytes(512 * MiB, b), "512.0 MiB");
  assert_string_equal(vmm_errors_fmt_bytes(7 * GiB + GiB / 10, b), "7.1 GiB");
  assert_string_equal(vmm_errors_fmt_bytes((uint64_t)3 << 40, b), "3.0 TiB");
  assert_string_equal(vmm_errors_fmt_bytes((uint64_t)5 << 50, b), "5.0 PiB");
  /* PiB is the largest unit: larger values stay in PiB. */
  assert_string_equal(vmm_errors_fmt_bytes((uint64_t)2048 << 50, b), "2048.0 PiB");
  assert_string_equal(vmm_errors_fmt_bytes(UINT64_MAX, b), "16384.0 PiB");
  /* Two decimals from GiB up (vmmarena-replay's table), one below. */
  assert_string_equal(vmm_errors_fmt_bytes_decimals(8.49 * GiB, 2, b), "8.49 GiB");
  assert_string_equal(vmm_errors_fmt_bytes_decimals(256 * GiB, 2, b), "256.00 GiB");
  assert_string_equal(vmm_errors_fmt_bytes_decimals(16 * MiB, 2, b), "16.0 MiB");
  assert_string_equal(vmm_errors_fmt_bytes_decimals(100, 2, b), "100 B");
}

static void test_status_names_and_messages(void **state) {
  (void)state;
  static const struct {
    vmm_status status;
    const char *name, *message;
  } expected[] = {
#define VMM_STATUS_EXPECTED(name, message) {name, #name, message},
      VMM_STATUS_TABLE(VMM_STATUS_EXPECTED)
#undef VMM_STATUS_EXPECTED
  };
  assert_int_equal(sizeof expected / sizeof expected[0], VMM_STATUS_COUNT);
  for (int s = 0; s < VMM_STATUS_COUNT; s++) {
    assert_int_equal(expected[s].status, s);
    assert_string_equal(vmm_status_name((vmm_status)s), expected[s].name);
    assert_string_equal(vmm_status_message((vmm_status)s), expected[s].message);
  }
  assert_string_equal(vmm_status_name(VMM_OK), "VMM_OK");
  assert_string_equal(vmm_status_name(VMM_ERR_NO_DRIVER), "VMM_ERR_NO_DRIVER");
  assert_string_equal(vmm_status_name(VMM_STATUS_COUNT), "VMM_STATUS_UNKNOWN");
  assert_string_equal(vmm_status_name((vmm_status)-1), "VMM_STATUS_UNKNOWN");
  assert_string_equal(vmm_status_message(VMM_STATUS_COUNT), "unknown status");
  assert_string_equal(vmm_status_message((vmm_status)-1), "unknown status");
}

static CUresult name_success_but_null(CUresult error, const char **name) {
  (void)error;
  *name = NULL;
  return CUDA_SUCCESS;
}

static void test_cu_error_names(void **state) {
  (void)state;
  static vmm_arena a; /* only drv and the driver counters are read */
  a.drv = fake_driver_reset(NULL);
  assert_string_equal(vmm_errors_cu_name(&a, CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY");
  assert_int_equal(a.drv_stats[VMM_DRV_get_error_name].calls, 1); /* counted like every driver call */
  /* The fake does not know this code: it fails the lookup. */
  assert_string_equal(vmm_errors_cu_name(&a, (CUresult)12345), "CUDA_ERROR_UNRECOGNIZED");
  assert_int_equal(a.drv_stats[VMM_DRV_get_error_name].failures, 1);
  struct vmm_driver table = *a.drv;
  a.drv = &table;
  table.get_error_name = NULL;
  assert_string_equal(vmm_errors_cu_name(&a, CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_UNRECOGNIZED");
  table.get_error_name = name_success_but_null;
  assert_string_equal(vmm_errors_cu_name(&a, CUDA_ERROR_INVALID_VALUE), "CUDA_ERROR_UNRECOGNIZED");
}

/* Out of memory is recoverable; any other driver error is fatal, and the first one sticks. */
static void test_fail_driver_sticky_fatal(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  const char *msg = NULL;
  assert_int_equal(vmm_errors_fail_driver(a, CUDA_ERROR_OUT_OF_MEMORY, VMM_DRV_mem_create, "creating %d MiB", 2),
                   VMM_ERR_OUT_OF_MEMORY);
  assert_non_null(strstr(vmm_arena_last_error(a), "creating 2 MiB: cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY (2)"));
  assert_non_null(strstr(vmm_arena_last_error(a), "arena holds 0 B live"));
  assert_int_equal(vmm_arena_fatal_error(a, &msg), VMM_OK);

  assert_int_equal(vmm_errors_fail_driver(a, CUDA_ERROR_INVALID_VALUE, VMM_DRV_mem_map, "first"), VMM_ERR_DRIVER);
  assert_int_equal(vmm_errors_fail_driver(a, CUDA_ERROR_UNKNOWN, VMM_DRV_mem_unmap, "second"), VMM_ERR_DRIVER);
  assert_non_null(strstr(vmm_arena_last_error(a), "second: cuMemUnmap returned CUDA_ERROR_UNKNOWN"));
  assert_int_equal(vmm_arena_fatal_error(a, &msg), VMM_ERR_DRIVER);
  assert_non_null(strstr(msg, "first: cuMemMap returned CUDA_ERROR_INVALID_VALUE (1)"));
  /* Undo the injected failure so the arena is torn down as a healthy one. */
  a->fatal_status = VMM_OK;
  a->fatal_message[0] = '\0';
  tu_destroy(a);
}

static void test_describe_holdings(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *pkg = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(0));
  void *tr = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  char buf[200];
  vmm_errors_describe_holdings(a, buf, sizeof buf);
  assert_string_equal(buf, "arena holds 6.0 MiB live (package 4.0 MiB, transient 2.0 MiB), 0 B pooled, 0 B idle, "
                           "0 B abandoned");
  assert_int_equal(vmm_arena_free(a, pkg, TU_STREAM(0)), VMM_OK);
  assert_int_equal(vmm_arena_free(a, tr, TU_STREAM(0)), VMM_OK);
  tu_destroy(a);
}

/* Runs vmm_errors_log with stderr sent to a temporary file; returns what it wrote. */
static const char *logged(int level, int threshold, int value) {
  static char out[128];
  FILE *capture = tmpfile();
  assert_non_null(capture);
  fflush(stderr);
  int saved = dup(fileno(stderr));
  assert_true(saved >= 0);
  assert_true(dup2(fileno(capture), fileno(stderr)) >= 0);
  vmm_errors_log(level, threshold, "vmmarena: logged %d", value);
  fflush(stderr);
  assert_true(dup2(saved, fileno(stderr)) >= 0);
  close(saved);
  rewind(capture);
  size_t n = fread(out, 1, sizeof out - 1, capture);
  out[n] = '\0';
  fclose(capture);
  return out;
}

static void test_log_threshold(void **state) {
  (void)state;
  assert_string_equal(logged(1, 1, 7), "vmmarena: logged 7\n");
  assert_string_equal(logged(1, 2, 8), "vmmarena: logged 8\n");
  assert_string_equal(logged(2, 1, 9), ""); /* above the threshold: silent */
  assert_string_equal(logged(1, 0, 10), "");
}

/* ---- AVL tree ----------------------------------------------------------------------- */

#define AVL_N 64

static void test_avl_queries(void **state) {
  (void)state;
  vmm_avl nodes[AVL_N];
  vmm_avl *root = NULL;
  /* Keys 10, 20, ..., 640 with k2 = 1, inserted in a scrambled order. */
  for (int i = 0; i < AVL_N; i++) {
    int j = (i * 37) % AVL_N;
    memset(&nodes[j], 0, sizeof nodes[j]);
    nodes[j].k1 = 10 * (uint64_t)(j + 1);
    nodes[j].k2 = 1;
    root = vmm_avl_insert(root, &nodes[j]);
    assert_int_equal(vmm_avl_check(root), i + 1);
  }
  assert_ptr_equal(vmm_avl_find(root, 200, 1), &nodes[19]);
  assert_null(vmm_avl_find(root, 200, 0));
  assert_null(vmm_avl_find(root, 205, 1));
  assert_ptr_equal(vmm_avl_ceil(root, 200, 1), &nodes[19]);
  assert_ptr_equal(vmm_avl_ceil(root, 200, 2), &nodes[20]);
  assert_ptr_equal(vmm_avl_ceil(root, 0, 0), &nodes[0]);
  assert_null(vmm_avl_ceil(root, 640, 2));
  assert_ptr_equal(vmm_avl_floor(root, 200, 1), &nodes[19]);
  assert_ptr_equal(vmm_avl_floor(root, 200, 0), &nodes[18]);
  assert_ptr_equal(vmm_avl_floor(root, UINT64_MAX, 0), &nodes[AVL_N - 1]);
  assert_null(vmm_avl_floor(root, 10, 0));
  assert_ptr_equal(vmm_avl_last(root), &nodes[AVL_N - 1]);
  assert_null(vmm_avl_last(NULL));
  /* Removing a key that is not there changes nothing. */
  root = vmm_avl_remove(root, 15, 1);
  assert_int_equal(vmm_avl_check(root), AVL_N);
  assert_null(vmm_avl_remove(NULL, 10, 1));
  for (int i = 0; i < AVL_N; i++) {
    int j = (i * 23) % AVL_N;
    root = vmm_avl_remove(root, nodes[j].k1, 1);
    assert_null(vmm_avl_find(root, nodes[j].k1, 1));
    assert_int_equal(vmm_avl_check(root), AVL_N - 1 - i);
  }
  assert_null(root);
}

static void set_node(vmm_avl *n, uint64_t k1, vmm_avl *left, vmm_avl *right, int height) {
  n->k1 = k1;
  n->k2 = 0;
  n->left = left;
  n->right = right;
  n->height = height;
}

static void test_avl_check_rejects(void **state) {
  (void)state;
  vmm_avl a, b, c, d;
  /* A sound three-node tree: b(a, c). */
  set_node(&a, 1, NULL, NULL, 1);
  set_node(&c, 3, NULL, NULL, 1);
  set_node(&b, 2, &a, &c, 2);
  assert_int_equal(vmm_avl_check(&b), 3);
  assert_int_equal(vmm_avl_check(NULL), 0);
  /* Out of order on the left, then on the right. */
  a.k1 = 5;
  assert_int_equal(vmm_avl_check(&b), -1);
  a.k1 = 1;
  c.k1 = 2; /* equal keys are not allowed either */
  assert_int_equal(vmm_avl_check(&b), -1);
  c.k1 = 3;
  /* A wrong height deep in the right subtree. */
  c.height = 2;
  assert_int_equal(vmm_avl_check(&b), -1);
  c.height = 1;
  /* Heights consistent but unbalanced: a chain leaning right, then left. */
  set_node(&d, 4, NULL, NULL, 1);
  set_node(&c, 3, NULL, &d, 2);
  set_node(&b, 2, NULL, &c, 3);
  assert_int_equal(vmm_avl_check(&b), -1);
  set_node(&a, 1, NULL, NULL, 1);
  set_node(&b, 2, &a, NULL, 2);
  set_node(&c, 3, &b, NULL, 3);
  assert_int_equal(vmm_avl_check(&c), -1);
}

/* ---- Pool used directly ------------------------------------------------------------- */

static vmm_mapping pooled(CUdeviceptr base, size_t extent) {
  vmm_mapping m;
  memset(&m, 0, sizeof m);
  m.base = base;
  m.extent = extent;
  m.state = VMM_MAP_POOLED;
  return m;
}

static bool usable_unless(void *ctx, vmm_mapping *m) { return m != ctx; }

static void test_pool_direct(void **state) {
  (void)state;
  vmm_pool p;
  memset(&p, 0, sizeof p);
  char why[128];
  vmm_mapping m2a = pooled(0x100000, 2 * MiB), m2b = pooled(0x300000, 2 * MiB);
  vmm_mapping m8 = pooled(0x800000, 8 * MiB);
  assert_null(vmm_store_pool_peek_drain(&p));
  assert_null(vmm_store_pool_take(&p, 0, SIZE_MAX, NULL, NULL));
  assert_int_equal(vmm_store_pool_push(&p, &m2a), 0);
  assert_int_equal(vmm_store_pool_push(&p, &m2b), 0);
  assert_int_equal(vmm_store_pool_push(&p, &m8), 0);
  assert_int_equal(vmm_store_pool_check(&p, why, sizeof why), 0);
  assert_int_equal(p.buckets, 2);
  assert_int_equal(p.count, 3);
  assert_int_equal(p.bytes, 12 * MiB);
  assert_ptr_equal(vmm_store_pool_peek_drain(&p), &m8); /* head of the largest bucket */

  /* Nothing between 3 and 7 MiB; the 8 MiB bucket lies past the bound. */
  assert_null(vmm_store_pool_take(&p, 3 * MiB, 7 * MiB, NULL, NULL));
  /* Nothing at or above 9 MiB. */
  assert_null(vmm_store_pool_take(&p, 9 * MiB, SIZE_MAX, NULL, NULL));
  /* LIFO within a bucket, but an unusable head is skipped for the next one. */
  assert_ptr_equal(vmm_store_pool_take(&p, 2 * MiB, 2 * MiB, usable_unless, &m2b), &m2a);
  assert_int_equal(vmm_store_pool_check(&p, why, sizeof why), 0);
  /* The only 2 MiB mapping is unusable: the search moves on to the 8 MiB bucket. */
  assert_ptr_equal(vmm_store_pool_take(&p, 1, SIZE_MAX, usable_unless, &m2b), &m8);
  assert_int_equal(p.buckets, 1);
  assert_non_null(p.spare); /* the emptied 8 MiB bucket */
  /* A push of a new size reuses the spare bucket. */
  vmm_bucket *spare = p.spare;
  vmm_mapping m4 = pooled(0x2000000, 4 * MiB);
  assert_int_equal(vmm_store_pool_push(&p, &m4), 0);
  assert_ptr_equal(m4.bucket, spare);
  assert_null(p.spare);
  vmm_store_pool_remove(&p, &m2b);
  assert_null(m2b.bucket);
  assert_int_equal(vmm_store_pool_check(&p, why, sizeof why), 0);
  assert_int_equal(p.count, 1);
  assert_int_equal(p.bytes, 4 * MiB);
  vmm_store_pool_fini(&p); /* frees the live 4 MiB bucket and the spare 2 MiB one */
  assert_null(p.root);
  assert_null(p.spare);
  assert_int_equal(p.buckets + p.count + p.bytes, 0);
}

/* ---- Mapping table used directly ---------------------------------------------------- */

#define TABLE_N 1500

static void test_mapping_table_direct(void **state) {
  (void)state;
  static vmm_mapping recs[TABLE_N];
  vmm_table t;
  assert_int_equal(vmm_table_init(&t), 0);
  size_t cap0 = t.cap;
  for (size_t i = 0; i < TABLE_N; i++) {
    memset(&recs[i], 0, sizeof recs[i]);
    recs[i].base = (CUdeviceptr)(i + 1) * 2 * MiB;
    recs[i].extent = 2 * MiB;
    assert_int_equal(vmm_table_reserve(&t), 0);
    vmm_table_insert(&t, recs[i].base, &recs[i]);
  }
  assert_true(t.cap > cap0); /* grew, at most half full */
  assert_true(t.count * 2 <= t.cap);
  assert_int_equal(t.count, TABLE_N);
  assert_ptr_equal(vmm_table_containing(&t, recs[7].base + MiB), &recs[7]);
  assert_null(vmm_table_containing(&t, 0x1000));
  assert_null(vmm_table_find(&t, recs[7].base + MiB));
  assert_null(vmm_table_remove(&t, 0x1000)); /* not there: nothing changes */
  assert_int_equal(t.count, TABLE_N);
  /* Remove in a scrambled order; after each removal every remaining record is still found. */
  for (size_t k = 0; k < TABLE_N; k++) {
    size_t i = (k * 7919) % TABLE_N;
    assert_ptr_equal(vmm_table_remove(&t, recs[i].base), &recs[i]);
    assert_null(vmm_table_find(&t, recs[i].base));
    assert_int_equal(t.count, TABLE_N - 1 - k);
    if (k % 97 == 0)
      for (size_t r = k + 1; r < TABLE_N; r++) {
        size_t j = (r * 7919) % TABLE_N;
        assert_ptr_equal(vmm_table_find(&t, recs[j].base), &recs[j]);
      }
  }
  vmm_table_fini(&t);
  assert_null(t.keys);
  assert_null(t.vals);
  assert_int_equal(t.cap + t.count, 0);
}

/* ---- Retention scope edges ---------------------------------------------------------- */

static void test_scope_null_arena(void **state) {
  (void)state;
  assert_int_equal(vmm_retention_begin(NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_retention_finish(NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_retention_abort(NULL), VMM_ERR_INVALID_ARGUMENT);
}

/* finish refuses to touch an inconsistent pool and leaves the scope active. */
static void test_finish_with_inconsistent_pool(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->store.pool.count, 1);
  size_t calls = fake_call_count();
  a->store.pool.count++;
  assert_int_equal(vmm_retention_finish(a), VMM_ERR_SCOPE_STATE);
  assert_non_null(strstr(vmm_arena_last_error(a), "pool is inconsistent, nothing touched: pool totals 1/2/"));
  assert_int_equal(fake_calls_since(calls, VMM_DRV_mem_unmap), 0);
  a->store.pool.count--;
  assert_int_equal(a->scope, VMM_SCOPE_ACTIVE);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(a->store.pool.count, 0);
  tu_destroy(a);
}

/* Many aborted scopes: the list of aborted scope ids grows past its first capacity, and
 * mappings of each aborted scope stay abandoned until destroy. */
static void test_many_aborts(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  enum { SCOPES = 20 };
  for (int i = 0; i < SCOPES; i++) {
    assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *p = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
    assert_int_equal(vmm_arena_free(a, p, TU_STREAM(0)), VMM_OK);
    assert_int_equal(vmm_retention_abort(a), VMM_OK);
    assert_int_equal(a->aborted_scopes.count, (size_t)i + 1);
    tu_check(a);
  }
  assert_true(a->aborted_scopes.cap >= SCOPES);
  for (size_t i = 1; i < a->aborted_scopes.count; i++) assert_true(a->aborted_scopes.ids[i - 1] < a->aborted_scopes.ids[i]);
  assert_int_equal(a->kind[VMM_KIND_TRANSIENT].abandoned_bytes, SCOPES * 2 * MiB);
  assert_int_equal(vmm_retention_abort(a), VMM_ERR_SCOPE_STATE); /* no scope open */
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fmt_bytes_units),
      cmocka_unit_test(test_status_names_and_messages),
      cmocka_unit_test(test_cu_error_names),
      cmocka_unit_test(test_fail_driver_sticky_fatal),
      cmocka_unit_test(test_describe_holdings),
      cmocka_unit_test(test_log_threshold),
      cmocka_unit_test(test_avl_queries),
      cmocka_unit_test(test_avl_check_rejects),
      cmocka_unit_test(test_pool_direct),
      cmocka_unit_test(test_mapping_table_direct),
      cmocka_unit_test(test_scope_null_arena),
      cmocka_unit_test(test_finish_with_inconsistent_pool),
      cmocka_unit_test(test_many_aborts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
