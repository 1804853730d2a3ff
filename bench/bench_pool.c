/* Pool benchmark on the fake driver (call log off):
 *   1. a pool-hit transient alloc+free pair inside a scope, on one stream: median ns per
 *      pair and the driver calls made in the timed loop (target: none, under 150 ns);
 *   2. the same pair outside a scope, where every pair calls the driver: median ns;
 *   3. the hit pair with 10 pooled mappings against 100,000 pooled mappings spread over
 *      1,000 sizes (target: at most 2x);
 *   4. whole-process mode (vmm_config.caching), outside a scope: a slot pair (4 KiB and
 *      100 KiB requests, carved from pages) and an exact-size hit pair (6 MiB), with no
 *      driver call, against the scope's hit pair (target: at most 1.5x).
 * Prints a PASS or MISS line per target and exits 0 either way; a failed call exits 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cli.h"
#include "fake_driver.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define TiB ((size_t)1 << 40)
#define STREAM ((CUstream)(uintptr_t)0x5001)

#define HIT_TARGET_NS 150.0
#define POOL_RATIO_TARGET 2.0

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void check(vmm_arena *a, vmm_status st, const char *what) {
  if (st == VMM_OK) return;
  fprintf(stderr, "bench_pool: %s: %s: %s\n", what, vmm_status_name(st),
          a ? vmm_arena_last_error(a) : vmm_create_error());
  exit(1);
}

static size_t driver_calls(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l.calls;
}

/* An arena on a fresh fake with room for `physical` bytes of handles; whole-process mode
 * (caching) or not. */
static vmm_arena *arena_with(size_t physical, int caching) {
  fake_options o = {.record_calls = -1, .capacity = physical, .va_space = 2 * physical};
  fake_driver_reset(&o);
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  cfg.retain = VMM_RETAIN_ON;
  cfg.log_level = 0;
  cfg.reserve_bytes = physical;
  cfg.caching = caching;
  vmm_arena *a = NULL;
  check(NULL, vmm_arena_create(&cfg, &a), "vmm_arena_create");
  return a;
}

static vmm_arena *arena(size_t physical) { return arena_with(physical, 0); }

static int by_value(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

typedef struct pair_timing {
  double median_ns; /* per alloc+free pair */
  size_t driver_calls;
} pair_timing;

/* Times `samples` batches of `batch` alloc+free pairs of transients on one stream; pair i
 * asks for sizes[i % count] bytes. */
static pair_timing time_pairs(vmm_arena *a, const size_t *sizes, size_t count, int samples, int batch) {
  double *per_pair = malloc((size_t)samples * sizeof *per_pair);
  if (!per_pair) exit(1);
  void *p;
  for (int i = 0; i < batch; i++) { /* warm up */
    check(a, vmm_arena_alloc(a, sizes[(size_t)i % count], VMM_KIND_TRANSIENT, STREAM, &p), "warm-up alloc");
    check(a, vmm_arena_free(a, p, STREAM), "warm-up free");
  }
  size_t calls = driver_calls(), next = 0;
  for (int s = 0; s < samples; s++) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < batch; i++) {
      vmm_status st = vmm_arena_alloc(a, sizes[next], VMM_KIND_TRANSIENT, STREAM, &p);
      if (st == VMM_OK) st = vmm_arena_free(a, p, STREAM);
      check(a, st, "timed pair");
      if (++next == count) next = 0;
    }
    per_pair[s] = (double)(now_ns() - t0) / batch;
  }
  pair_timing t = {0, driver_calls() - calls};
  qsort(per_pair, (size_t)samples, sizeof *per_pair, by_value);
  t.median_ns = per_pair[samples / 2];
  free(per_pair);
  return t;
}

/* The sizes k x 2 MiB, k = 1..count (the caller frees). */
static size_t *pool_sizes(size_t count) {
  size_t *sizes = malloc(count * sizeof *sizes);
  if (!sizes) exit(1);
  for (size_t k = 0; k < count; k++) sizes[k] = (k + 1) * 2 * MiB;
  return sizes;
}

/* Allocates `per_size` transients of each of the sizes k x 2 MiB, k = 1..sizes, then frees
 * them all inside the active scope, so that they are pooled. */
static void fill_pool(vmm_arena *a, size_t sizes, size_t per_size) {
  void **live = malloc(sizes * per_size * sizeof *live);
  if (!live) exit(1);
  size_t n = 0;
  for (size_t k = 1; k <= sizes; k++)
    for (size_t j = 0; j < per_size; j++)
      check(a, vmm_arena_alloc(a, k * 2 * MiB, VMM_KIND_TRANSIENT, STREAM, &live[n++]), "filling the pool");
  for (size_t i = 0; i < n; i++) check(a, vmm_arena_free(a, live[i], STREAM), "pooling");
  free(live);
  vmm_snapshot s;
  check(a, vmm_arena_snapshot(a, &s), "snapshot");
  if (s.kind[VMM_KIND_TRANSIENT].pooled_count != n || s.pool_buckets != sizes) {
    fprintf(stderr, "bench_pool: pool holds %llu mappings in %llu buckets, expected %zu in %zu\n",
            (unsigned long long)s.kind[VMM_KIND_TRANSIENT].pooled_count, (unsigned long long)s.pool_buckets, n, sizes);
    exit(1);
  }
}

static void verdict(int pass, const char *target, const char *measured) {
  printf("%s %s (%s)\n", pass ? "PASS" : "MISS", target, measured);
}

static const char USAGE[] =
    "usage: bench_pool\n"
    "Pool benchmark on the fake driver: a pool-hit pair inside a scope, the same pair outside one,\n"
    "10 against 100,000 pooled mappings, and whole-process mode's slot and exact-size hits. Prints a\n"
    "PASS or MISS line per target and exits 0 either way; 1 if a call fails.\n";

int main(int argc, char **argv) {
  bench_cli_no_arguments(argc, argv, "bench_pool", USAGE);
  enum { HIT_SAMPLES = 2001, HIT_BATCH = 200, DRIVER_SAMPLES = 501, DRIVER_BATCH = 20 };
  printf("bench_pool: fake driver, call log off, 2 MiB granularity; medians of per-pair means over batches\n");

  /* 1. Pool hit inside a scope. */
  static const size_t two_mib[] = {2 * MiB};
  vmm_arena *a = arena(64 * GiB);
  check(a, vmm_retention_begin(a), "begin");
  pair_timing hit = time_pairs(a, two_mib, 1, HIT_SAMPLES, HIT_BATCH);
  check(a, vmm_retention_finish(a), "finish");

  /* 2. The same pair outside a scope: create, map, grant, synchronize, unmap, release. */
  pair_timing plain = time_pairs(a, two_mib, 1, DRIVER_SAMPLES, DRIVER_BATCH);
  vmm_arena_destroy(a);
  printf("hit pair in a scope, same stream:    %7.1f ns/pair, %zu driver calls in %d pairs\n", hit.median_ns,
         hit.driver_calls, HIT_SAMPLES * HIT_BATCH);
  printf("pair outside a scope:                %7.1f ns/pair, %.1f driver calls per pair (%.1fx the hit pair)\n",
         plain.median_ns, (double)plain.driver_calls / (DRIVER_SAMPLES * DRIVER_BATCH),
         plain.median_ns / hit.median_ns);

  /* 3. Pool size: 10 mappings of 10 sizes against 100,000 of 1,000 sizes. The target is the
   * pair of one size (10 MiB in the small pool, whose bucket the take empties; 1000 MiB of
   * 100 in the large one); a pair cycling through every pooled size is shown beside it. */
  size_t *small_sizes = pool_sizes(10), *large_sizes = pool_sizes(1000);
  a = arena(64 * GiB);
  check(a, vmm_retention_begin(a), "begin");
  fill_pool(a, 10, 1);
  pair_timing small = time_pairs(a, &small_sizes[4], 1, HIT_SAMPLES, HIT_BATCH);
  pair_timing small_cycle = time_pairs(a, small_sizes, 10, HIT_SAMPLES, HIT_BATCH);
  vmm_arena_destroy(a);

  a = arena(128 * TiB); /* 100 mappings of each of 2 MiB .. 2000 MiB: about 95.5 TiB */
  check(a, vmm_retention_begin(a), "begin");
  uint64_t t0 = now_ns();
  fill_pool(a, 1000, 100);
  double fill_s = (double)(now_ns() - t0) / 1e9;
  pair_timing large = time_pairs(a, &large_sizes[499], 1, HIT_SAMPLES, HIT_BATCH);
  pair_timing large_cycle = time_pairs(a, large_sizes, 1000, HIT_SAMPLES, HIT_BATCH);
  t0 = now_ns();
  check(a, vmm_retention_finish(a), "finish");
  double finish_s = (double)(now_ns() - t0) / 1e9;
  vmm_arena_destroy(a);
  free(small_sizes);
  free(large_sizes);
  double ratio = large.median_ns / small.median_ns;
  printf("hit pair, 10 pooled mappings:        %7.1f ns/pair; cycling through the 10 sizes %.1f ns/pair\n",
         small.median_ns, small_cycle.median_ns);
  printf("hit pair, 100000 pooled, 1000 sizes: %7.1f ns/pair (%.2fx); cycling through the 1000 sizes %.1f ns/pair "
         "(%.2fx)\n",
         large.median_ns, ratio, large_cycle.median_ns, large_cycle.median_ns / small_cycle.median_ns);
  printf("the 100000-mapping pool filled in %.2f s, drained by finish in %.2f s\n", fill_s, finish_s);

  /* 4. Whole-process mode outside a scope: slots and an exact-size hit. */
  static const size_t slot_sizes[] = {4096, 100 << 10}, six_mib[] = {6 * MiB};
  a = arena_with(64 * GiB, 1);
  pair_timing slots = time_pairs(a, slot_sizes, 2, HIT_SAMPLES, HIT_BATCH);
  pair_timing process_hit = time_pairs(a, six_mib, 1, HIT_SAMPLES, HIT_BATCH);
  vmm_arena_destroy(a);
  double slot_ratio = slots.median_ns / hit.median_ns;
  printf("whole-process slot pair (4K, 100K):  %7.1f ns/pair (%.2fx the scope's hit pair), %zu driver calls\n",
         slots.median_ns, slot_ratio, slots.driver_calls);
  printf("whole-process exact hit pair (6M):   %7.1f ns/pair, %zu driver calls\n", process_hit.median_ns,
         process_hit.driver_calls);

  size_t hit_calls = hit.driver_calls + small.driver_calls + small_cycle.driver_calls + large.driver_calls +
                     large_cycle.driver_calls + slots.driver_calls + process_hit.driver_calls;
  char m[96];
  snprintf(m, sizeof m, "%zu calls", hit_calls);
  verdict(hit_calls == 0, "hit pairs make no driver call", m);
  snprintf(m, sizeof m, "%.1f ns", hit.median_ns);
  verdict(hit.median_ns < HIT_TARGET_NS, "hit pair median under 150 ns", m);
  snprintf(m, sizeof m, "%.2fx", ratio);
  verdict(ratio <= POOL_RATIO_TARGET, "hit pair with 100000 pooled mappings at most 2x the 10-mapping pool", m);
  snprintf(m, sizeof m, "%.2fx", slot_ratio);
  verdict(slot_ratio <= 1.5, "whole-process slot pair at most 1.5x the scope's hit pair", m);
  return 0;
}
