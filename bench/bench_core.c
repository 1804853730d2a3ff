/* Microbenchmark of the core on the fake driver: the time of one alloc+free pair outside a
 * scope with 10 ... 100000 live allocations already present, split into the fake driver's
 * share (the snapshot's per-entry-point time) and the library's own time. The target is that
 * the library's own time grows at most 2x from 10 to 100000 live allocations. It reports
 * PASS or MISS and exits 0 either way; a non-zero exit means the benchmark itself failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cli.h"
#include "bench_stats.h"
#include "fake_driver.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define PAIR_BYTES (2 * MiB)
#define BATCHES 51
#define PAIRS_PER_BATCH 400
#define TARGET_RATIO 2.0

static const size_t live_levels[] = {10, 100, 1000, 10000, 100000};
#define LEVELS (sizeof live_levels / sizeof live_levels[0])
#define MAX_LIVE 100000

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Nanoseconds spent in driver calls so far, over every entry point. */
static uint64_t driver_ns(vmm_arena *a) {
  vmm_snapshot s;
  if (vmm_arena_snapshot(a, &s) != VMM_OK) return 0;
  uint64_t ns = 0;
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) ns += s.driver[e].ns;
  return ns;
}


typedef struct level_result {
  size_t live;
  double total_ns, driver_ns, own_ns; /* per pair, medians over the batches */
} level_result;

/* One batch of alloc+free pairs; returns 0 on success. */
static int run_batch(vmm_arena *a, CUstream stream, double *total, double *driver, double *own) {
  uint64_t d0 = driver_ns(a);
  uint64_t t0 = now_ns();
  for (int i = 0; i < PAIRS_PER_BATCH; i++) {
    void *p = NULL;
    vmm_status st = vmm_arena_alloc(a, PAIR_BYTES, VMM_KIND_TRANSIENT, stream, &p);
    if (st == VMM_OK) st = vmm_arena_free(a, p, stream);
    if (st != VMM_OK) {
      fprintf(stderr, "bench_core: %s: %s\n", vmm_status_name(st), vmm_arena_last_error(a));
      return -1;
    }
  }
  uint64_t t1 = now_ns();
  uint64_t d1 = driver_ns(a);
  *total = (double)(t1 - t0) / PAIRS_PER_BATCH;
  *driver = (double)(d1 - d0) / PAIRS_PER_BATCH;
  *own = *total - *driver;
  return 0;
}

static const char USAGE[] =
    "usage: bench_core\n"
    "The time of one alloc+free pair outside a scope with 10 ... 100000 live allocations present, on the\n"
    "fake driver, split into the driver's share and the library's own; target: the library's own time\n"
    "grows at most 2x. Prints PASS or MISS and exits 0 either way; 1 if the benchmark itself failed.\n";

int main(int argc, char **argv) {
  bench_cli_no_arguments(argc, argv, "bench_core", USAGE);
  fake_options opts = {.record_calls = -1, .capacity = 512 * GiB, .va_space = 4096 * GiB};
  fake_driver_reset(&opts);
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  vmm_arena *a = NULL;
  if (vmm_arena_create(&cfg, &a) != VMM_OK) {
    fprintf(stderr, "bench_core: %s\n", vmm_create_error());
    return 1;
  }
  void **live = malloc(MAX_LIVE * sizeof *live);
  if (!live) return 1;
  size_t n = 0;
  CUstream stream = (CUstream)(uintptr_t)0x5001;
  level_result results[LEVELS];
  double total[BATCHES], driver[BATCHES], own[BATCHES];
  for (size_t l = 0; l < LEVELS; l++) {
    for (; n < live_levels[l]; n++) {
      vmm_status st = vmm_arena_alloc(a, PAIR_BYTES, VMM_KIND_PACKAGE, stream, &live[n]);
      if (st != VMM_OK) {
        fprintf(stderr, "bench_core: live allocation %zu: %s\n", n, vmm_arena_last_error(a));
        return 1;
      }
    }
    if (run_batch(a, stream, &total[0], &driver[0], &own[0])) return 1; /* warm-up */
    for (int b = 0; b < BATCHES; b++)
      if (run_batch(a, stream, &total[b], &driver[b], &own[b])) return 1;
    results[l] = (level_result){n, bench_median(total, BATCHES), bench_median(driver, BATCHES), bench_median(own, BATCHES)};
  }

  printf("core alloc+free pair outside a scope: %zu MiB transient, fake driver, median of %d batches of %d pairs\n",
         PAIR_BYTES / MiB, BATCHES, PAIRS_PER_BATCH);
  printf("%12s %14s %15s %12s %8s\n", "live allocs", "total ns/pair", "driver ns/pair", "own ns/pair", "own x");
  for (size_t l = 0; l < LEVELS; l++)
    printf("%12zu %14.1f %15.1f %12.1f %7.2fx\n", results[l].live, results[l].total_ns, results[l].driver_ns,
           results[l].own_ns, results[l].own_ns / results[0].own_ns);
  double ratio = results[LEVELS - 1].own_ns / results[0].own_ns;
  printf("core own-time ratio %zu/%zu = %.2fx (target <= %.0fx): %s\n", live_levels[LEVELS - 1], live_levels[0], ratio,
         TARGET_RATIO, ratio <= TARGET_RATIO ? "PASS" : "MISS");

  for (size_t i = 0; i < n; i++) {
    if (vmm_arena_free(a, live[i], stream) != VMM_OK) {
      fprintf(stderr, "bench_core: free: %s\n", vmm_arena_last_error(a));
      return 1;
    }
  }
  free(live);
  vmm_arena_destroy(a);
  if (!fake_ledger_clean()) {
    fprintf(stderr, "bench_core: the fake driver's ledger is not clean after destroy\n");
    return 1;
  }
  return 0;
}
