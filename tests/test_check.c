/* The invariant checker against deliberately corrupted internal structures: each corruption
 * must be reported with a message that names it, and each is undone before the arena is
 * destroyed, so the checker passes again and the fake's ledger stays clean. */
#include <string.h>

#include "internal.h"
#include "test_util.h"

/* Asserts the checker fails and its message contains `expected`. */
static void expect_broken(vmm_arena *a, const char *expected) {
  char why[256] = "";
  assert_int_equal(vmm_arena_check(a, why, sizeof why), -1);
  if (!strstr(why, expected)) fprintf(stderr, "check said \"%s\", expected \"%s\"\n", why, expected);
  assert_non_null(strstr(why, expected));
}

static vmm_mapping *mapping_of(vmm_arena *a, void *p) {
  vmm_mapping *m = vmm_table_find(&a->table, (CUdeviceptr)(uintptr_t)p);
  assert_non_null(m);
  return m;
}

static vmm_free_range *lowest_free_range(vmm_arena *a) {
  vmm_avl *n = a->ranges.by_addr;
  assert_non_null(n);
  while (n->left) n = n->left;
  return vmm_container_of(n, vmm_free_range, by_addr);
}

static vmm_free_range *free_range_at(vmm_arena *a, CUdeviceptr base) {
  vmm_avl *n = vmm_avl_find(a->ranges.by_addr, base, 0);
  assert_non_null(n);
  return vmm_container_of(n, vmm_free_range, by_addr);
}

static void test_null_arena(void **state) {
  (void)state;
  char why[64] = "";
  assert_int_equal(vmm_arena_check(NULL, why, sizeof why), -1);
  assert_string_equal(why, "NULL arena");
  /* No message buffer: still a failure, nothing written. */
  assert_int_equal(vmm_arena_check(NULL, NULL, 0), -1);
  strcpy(why, "untouched");
  assert_int_equal(vmm_arena_check(NULL, why, 0), -1);
  assert_string_equal(why, "untouched");
}

static void test_mapping_records(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  size_t g = a->granularity;
  void *p = tu_alloc(a, 3 * g, VMM_KIND_PACKAGE, TU_STREAM(0));
  vmm_mapping *m = mapping_of(a, p);
  tu_check(a);

  m->extent += 1;
  expect_broken(a, "misaligned");
  m->extent -= 1;
  size_t extent = m->extent;
  m->extent = 0;
  expect_broken(a, "misaligned");
  m->extent = extent;
  m->base += 1;
  expect_broken(a, "misaligned");
  m->base -= 1;

  m->reservation = a->ranges.reservation_count;
  expect_broken(a, "outside its reservation");
  m->reservation = 0;
  a->ranges.reservations[0].size -= g; /* the mapping is cut from the top of the reservation */
  expect_broken(a, "outside its reservation");
  a->ranges.reservations[0].size += g;

  /* Moving the mapping down by one granule makes it overlap the free range below it. */
  m->base -= g;
  expect_broken(a, "overlaps a free range");
  m->base += g;

  m->handles[0]->size += g;
  expect_broken(a, "handles (1) sum");
  m->handles[0]->size -= g;
  m->handle_count = 0;
  expect_broken(a, "handles (0) sum 0 != extent");
  m->handle_count = 1;

  a->table.count++;
  expect_broken(a, "mapping table counts 2, holds 1");
  a->table.count--;
  tu_check(a);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(0)), VMM_OK);
  tu_destroy(a);
}

/* Two reservations filled exactly: no free range at all, and each mapping lies outside the
 * other's reservation, one below its base and one past its end. */
static void test_mapping_in_wrong_reservation(void **state) {
  (void)state;
  vmm_config cfg = tu_config();
  cfg.reserve_bytes = 2 * MiB;
  vmm_arena *a = tu_arena(NULL, &cfg);
  void *p0 = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, TU_STREAM(0));
  void *p1 = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, TU_STREAM(0));
  assert_int_equal(a->ranges.reservation_count, 2);
  assert_null(a->ranges.by_addr);
  tu_check(a);
  vmm_mapping *m0 = mapping_of(a, p0), *m1 = mapping_of(a, p1);
  uint32_t r0 = m0->reservation, r1 = m1->reservation;
  assert_int_not_equal(r0, r1);
  m0->reservation = r1;
  expect_broken(a, "outside its reservation");
  m0->reservation = r0;
  m1->reservation = r0;
  expect_broken(a, "outside its reservation");
  m1->reservation = r1;
  tu_check(a);
  assert_int_equal(vmm_arena_free(a, p0, TU_STREAM(0)), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p1, TU_STREAM(0)), VMM_OK);
  tu_destroy(a);
}

static void test_counters(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  tu_check(a);

  a->kind[VMM_KIND_TRANSIENT].live_count++;
  expect_broken(a, "per-kind counters differ from a recount (transient live 2 vs 1");
  a->kind[VMM_KIND_TRANSIENT].live_count--;

  a->mapped_bytes++;
  expect_broken(a, "byte counters differ: mapped");
  a->mapped_bytes--;
  a->physical_bytes++;
  expect_broken(a, "byte counters differ");
  a->physical_bytes--;

  a->ranges.free_bytes += a->granularity;
  expect_broken(a, "VA accounting");
  a->ranges.free_bytes -= a->granularity;
  a->ranges.stuck_bytes += a->granularity;
  expect_broken(a, "stuck");
  a->ranges.stuck_bytes -= a->granularity;
  tu_check(a);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(0)), VMM_OK);
  tu_destroy(a);
}

/* Three mappings cut from the top of one reservation, the middle one freed: two free ranges,
 * the reservation's bottom and the hole. */
static void test_free_ranges(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  size_t g = a->granularity;
  void *top = tu_alloc(a, g, VMM_KIND_PACKAGE, TU_STREAM(0));
  void *mid = tu_alloc(a, g, VMM_KIND_PACKAGE, TU_STREAM(0));
  void *low = tu_alloc(a, g, VMM_KIND_PACKAGE, TU_STREAM(0));
  assert_int_equal(vmm_arena_free(a, mid, TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->ranges.free_range_count, 2);
  tu_check(a);
  vmm_free_range *bottom = lowest_free_range(a);
  vmm_free_range *hole = free_range_at(a, (CUdeviceptr)(uintptr_t)mid);
  CUdeviceptr hole_base = hole->base;

  a->ranges.free_range_count++;
  expect_broken(a, "free-range trees broken (2 by address, 2 by size, 3 counted)");
  a->ranges.free_range_count--;
  int height = a->ranges.by_addr->height;
  a->ranges.by_addr->height = height + 5;
  expect_broken(a, "free-range trees broken (-1 by address");
  a->ranges.by_addr->height = height;
  height = a->ranges.by_size->height;
  a->ranges.by_size->height = height + 5;
  expect_broken(a, "-1 by size");
  a->ranges.by_size->height = height;
  /* The size index loses one of the two ranges. */
  vmm_avl *by_size = a->ranges.by_size, *kept = by_size->left ? by_size->left : by_size->right;
  assert_non_null(kept);
  a->ranges.by_size = kept;
  expect_broken(a, "free-range trees broken (2 by address, 1 by size, 2 counted)");
  a->ranges.by_size = by_size;

  hole->reservation = 7;
  expect_broken(a, "free range with bad reservation");
  hole->reservation = bottom->reservation;

  bottom->base -= g;
  expect_broken(a, "outside its reservation");
  bottom->base += g;
  hole->size += 3 * g;
  expect_broken(a, "outside its reservation");
  hole->size -= 3 * g;
  size_t hole_size = hole->size;
  hole->size = 0;
  expect_broken(a, "outside its reservation");
  hole->size = hole_size;

  /* The hole's base moved onto the bottom range (keys unchanged, so the trees stay sorted). */
  hole->base = bottom->base + bottom->size - g;
  expect_broken(a, "free ranges overlap");
  hole->base = bottom->base + bottom->size;
  expect_broken(a, "free ranges not coalesced");
  hole->base = hole_base;

  bottom->size -= g;
  expect_broken(a, "missing from the size index");
  bottom->size += g;

  tu_check(a);
  assert_int_equal(vmm_arena_free(a, top, TU_STREAM(0)), VMM_OK);
  assert_int_equal(vmm_arena_free(a, low, TU_STREAM(0)), VMM_OK);
  tu_destroy(a);
}

/* Inside a scope, two idle 2 MiB mappings in one bucket and one each in 4 and 8 MiB buckets:
 * the 2 MiB bucket is the tree's left leaf, so its corruption is found below the root. */
static void test_pool(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p[4];
  p[0] = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  p[1] = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  p[2] = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  p[3] = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  for (int i = 0; i < 4; i++) assert_int_equal(vmm_arena_free(a, p[i], TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->store.pool.buckets, 3);
  assert_int_equal(a->store.pool.count, 4);
  tu_check(a);
  vmm_bucket *small = vmm_container_of(vmm_avl_find(a->store.pool.root, 2 * MiB, 0), vmm_bucket, node);
  assert_ptr_equal(a->store.pool.root->left, &small->node);
  assert_int_equal(small->count, 2);
  vmm_mapping *first = small->head, *second = first->pool_next;
  assert_non_null(second);

  int height = a->store.pool.root->height;
  a->store.pool.root->height = height + 3;
  expect_broken(a, "pool bucket tree unsorted or unbalanced");
  a->store.pool.root->height = height;

  small->count = 0;
  expect_broken(a, "empty pool bucket of 2097152 bytes");
  small->count = 2;
  small->head = NULL;
  expect_broken(a, "empty pool bucket");
  small->head = first;

  second->state = VMM_MAP_LIVE;
  expect_broken(a, "misfiled in bucket 2097152");
  second->state = VMM_MAP_POOLED;
  second->bucket = NULL;
  expect_broken(a, "misfiled");
  second->bucket = small;
  small->size += MiB; /* its key unchanged: the tree stays sorted */
  expect_broken(a, "misfiled");
  small->size -= MiB;

  second->pool_prev = NULL;
  expect_broken(a, "bucket 2097152 list broken");
  second->pool_prev = first;

  small->count = 3;
  expect_broken(a, "bucket 2097152 counts 3, holds 2");
  small->count = 2;

  a->store.pool.buckets++;
  expect_broken(a, "pool totals 4/4/");
  a->store.pool.buckets--;
  a->store.pool.count++;
  expect_broken(a, "pool totals");
  a->store.pool.count--;
  a->store.pool.bytes++;
  expect_broken(a, "pool totals");
  a->store.pool.bytes--;
  a->store.pool.handles++;
  expect_broken(a, "pool totals");
  a->store.pool.handles--;
  tu_check(a);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* The in-order list of the idle tier's handles. */
static size_t idle_handles(vmm_avl *n, vmm_handle **out, size_t i) {
  if (!n) return i;
  i = idle_handles(n->left, out, i);
  out[i++] = vmm_container_of(n, vmm_handle, node);
  return idle_handles(n->right, out, i);
}

/* The store's idle tier, the handles of an assembled mapping and the abandoned list.
 * Packages of 2, 4 and 6 MiB made before the scope (one handle each) are freed inside it:
 * three idle handles keyed by size, the 4 MiB one at the root. */
static void test_store(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  size_t g = a->granularity;
  void *p[3];
  for (int i = 0; i < 3; i++) p[i] = tu_alloc(a, (size_t)(i + 1) * 2 * MiB, VMM_KIND_PACKAGE, TU_STREAM(0));
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(vmm_arena_free(a, p[i], TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->store.idle_count, 3);
  assert_int_equal(a->store.idle_bytes, 12 * MiB);
  tu_check(a);
  vmm_handle *h[3];
  assert_int_equal(idle_handles(a->store.idle, h, 0), 3);
  assert_ptr_equal(a->store.idle, &h[1]->node);
  assert_int_equal(h[0]->size, 2 * MiB);

  /* Misfiled: a size that is not its key, no size, an unknown kind. */
  h[1]->size += g;
  expect_broken(a, "idle handle of 6291456 bytes misfiled under 4194304");
  h[1]->size -= g;
  h[0]->size = 0;
  expect_broken(a, "idle handle of 0 bytes misfiled");
  h[0]->size = 2 * MiB;
  h[2]->kind = (vmm_kind)VMM_KIND_COUNT;
  expect_broken(a, "misfiled");
  /* Counted under the other kind: the per-kind recount differs. */
  h[2]->kind = VMM_KIND_TRANSIENT;
  expect_broken(a, "per-kind counters differ from a recount");
  h[2]->kind = VMM_KIND_PACKAGE;
  a->kind[VMM_KIND_PACKAGE].idle_bytes += g;
  expect_broken(a, "per-kind counters differ");
  a->kind[VMM_KIND_PACKAGE].idle_bytes -= g;

  /* Out of order: the smallest handle (the left leaf) grows past the largest, key and all. */
  h[0]->size = h[0]->node.k1 = 8 * MiB;
  expect_broken(a, "idle handle tree unsorted or unbalanced");
  h[0]->size = h[0]->node.k1 = 2 * MiB;
  int height = a->store.idle->height;
  a->store.idle->height = height + 2;
  expect_broken(a, "idle handle tree unsorted or unbalanced");
  a->store.idle->height = height;

  /* Totals that differ from the recount. */
  a->store.idle_count++;
  expect_broken(a, "idle handle totals 4/12582912 differ from recount 3/12582912");
  a->store.idle_count--;
  a->store.idle_bytes -= g;
  expect_broken(a, "idle handle totals 3/10485760 differ");
  a->store.idle_bytes += g;
  /* Bytes held in the tier but missing from the arena's physical total. */
  a->physical_bytes -= g;
  expect_broken(a, "byte counters differ");
  a->physical_bytes += g;
  tu_check(a);

  /* 12 MiB assembled from the three idle handles, largest first: 6 + 4 + 2 MiB. */
  void *q = tu_alloc(a, 12 * MiB, VMM_KIND_TRANSIENT, TU_STREAM(0));
  vmm_mapping *m = mapping_of(a, q);
  assert_int_equal(m->handle_count, 3);
  assert_int_equal(m->handles[0]->size, 6 * MiB);
  assert_int_equal(m->handles[2]->size, 2 * MiB);
  assert_int_equal(a->store.idle_count, 0);
  tu_check(a);
  m->handles[1]->size -= g;
  expect_broken(a, "handles (3) sum 10485760 != extent 12582912");
  m->handles[1]->size += g;
  m->handle_count = 2;
  expect_broken(a, "handles (2) sum 10485760 != extent 12582912");
  m->handle_count = 3;
  tu_check(a);

  /* Freed into the pool, its handles count among the pool's. */
  void *r = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, TU_STREAM(0)); /* new memory: nothing is idle */
  assert_int_equal(vmm_arena_free(a, q, TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->store.pool.handles, 3);
  a->store.pool.handles = 1;
  expect_broken(a, "pool totals 1/1/12582912/1 differ from recount 1/1/12582912/3");
  a->store.pool.handles = 3;
  tu_check(a);

  /* Aborted: the pooled mapping and an idle handle (a package freed in the scope) are
   * abandoned, the handle on the abandoned list. */
  assert_int_equal(vmm_arena_free(a, r, TU_STREAM(0)), VMM_OK);
  assert_int_equal(a->store.idle_count, 1);
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  assert_int_equal(a->store.abandoned_count, 1);
  assert_int_equal(a->store.idle_count, 0);
  tu_check(a);
  a->store.abandoned_count++;
  expect_broken(a, "abandoned handle totals 2/2097152 differ from recount 1/2097152");
  a->store.abandoned_count--;
  a->store.abandoned_bytes += g;
  expect_broken(a, "abandoned handle totals 1/4194304 differ");
  a->store.abandoned_bytes -= g;
  a->store.abandoned->kind = VMM_KIND_TRANSIENT;
  expect_broken(a, "per-kind counters differ");
  a->store.abandoned->kind = VMM_KIND_PACKAGE;
  a->store.abandoned->size += g;
  expect_broken(a, "abandoned handle totals 1/2097152 differ from recount 1/4194304");
  a->store.abandoned->size -= g;
  tu_check(a);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_null_arena),  cmocka_unit_test(test_mapping_records),
      cmocka_unit_test(test_mapping_in_wrong_reservation), cmocka_unit_test(test_counters),
      cmocka_unit_test(test_free_ranges), cmocka_unit_test(test_pool),
      cmocka_unit_test(test_store),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
