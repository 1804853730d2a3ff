/* bench_trace: what the operation trace costs. The same mixed loop of operations (alloc/free
 * pairs of both kinds outside a retention scope, then a scope whose transient pairs are pool
 * hits, a retained package pair, begin and finish) runs with the trace off and on (a file in
 * /tmp, deleted at the end), on the fake driver without its call log. Runs alternate off/on;
 * each figure is the median of RUNS runs. Prints ns per operation for each and the ratio.
 *
 *   bench_trace [ROUNDS]      ROUNDS loop rounds per run (default 4000, 28 operations each) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_driver.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define RUNS 7
#define OPS_PER_ROUND 28 /* 2 pairs, begin, 10 transient pairs, 1 package pair, finish */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int check(vmm_arena *a, vmm_status st, const char *what) {
  if (st == VMM_OK) return 0;
  fprintf(stderr, "bench_trace: %s: %s: %s\n", what, vmm_status_name(st), vmm_arena_last_error(a));
  return -1;
}

static int pair(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s) {
  void *p = NULL;
  if (check(a, vmm_arena_alloc(a, bytes, kind, s, &p), "alloc")) return -1;
  return check(a, vmm_arena_free(a, p, s), "free");
}

/* One round: OPS_PER_ROUND operations. */
static int round_of_ops(vmm_arena *a, unsigned i) {
  static const size_t sizes[] = {2 * MiB, 4 * MiB, 8 * MiB, 6 * MiB};
  CUstream s = (CUstream)(uintptr_t)(0x5001 + (i & 1));
  vmm_tag_push("bench step");
  int rc = pair(a, 2 * MiB, VMM_KIND_PACKAGE, s) | pair(a, 6 * MiB, VMM_KIND_TRANSIENT, s);
  rc |= check(a, vmm_retention_begin(a), "begin");
  for (unsigned k = 0; k < 10; k++) rc |= pair(a, sizes[(i + k) % 4], VMM_KIND_TRANSIENT, s);
  rc |= pair(a, 4 * MiB, VMM_KIND_PACKAGE, s); /* the free retains the handle until finish */
  rc |= check(a, vmm_retention_finish(a), "finish");
  vmm_tag_pop();
  return rc;
}

/* One run of `rounds` rounds on a fresh arena; with trace_path, traced from the first
 * operation to the close that flushes the file. Returns ns per operation, or -1. */
static double run(unsigned rounds, const char *trace_path) {
  fake_options opts = {.record_calls = -1};
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver_reset(&opts);
  cfg.retain = VMM_RETAIN_ON;
  cfg.log_level = 0;
  vmm_arena *a = NULL;
  if (vmm_arena_create(&cfg, &a) != VMM_OK) {
    fprintf(stderr, "bench_trace: creating the arena: %s\n", vmm_create_error());
    return -1;
  }
  int rc = 0;
  uint64_t t0 = now_ns();
  if (trace_path) rc = check(a, vmm_arena_trace(a, trace_path), "starting the trace");
  for (unsigned i = 0; i < rounds && rc == 0; i++) rc = round_of_ops(a, i);
  if (trace_path && rc == 0) rc = check(a, vmm_arena_trace(a, NULL), "closing the trace");
  uint64_t t1 = now_ns();
  vmm_arena_destroy(a);
  return rc ? -1 : (double)(t1 - t0) / ((double)rounds * OPS_PER_ROUND);
}

static int by_value(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  unsigned rounds = 4000;
  if (argc > 2 || (argc == 2 && (sscanf(argv[1], "%u", &rounds) != 1 || rounds == 0))) {
    fprintf(stderr, "usage: bench_trace [ROUNDS]   (ROUNDS > 0, default 4000)\n");
    return 2;
  }
  char path[] = "/tmp/vmmarena-bench-trace-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    fprintf(stderr, "bench_trace: mkstemp %s: %s\n", path, strerror(errno));
    return 1;
  }
  close(fd);
  double off[RUNS], on[RUNS];
  int rc = run(rounds / 10 + 1, NULL) < 0; /* warm-up */
  for (int r = 0; r < RUNS && rc == 0; r++) {
    off[r] = run(rounds, NULL);
    on[r] = run(rounds, path);
    rc = off[r] < 0 || on[r] < 0;
  }
  struct stat st;
  if (rc == 0 && stat(path, &st) != 0) rc = 1;
  unlink(path);
  if (rc) return 1;
  qsort(off, RUNS, sizeof off[0], by_value);
  qsort(on, RUNS, sizeof on[0], by_value);
  double ops = (double)rounds * OPS_PER_ROUND;
  printf("bench_trace: %u rounds x %d operations per run, median of %d runs, fake driver\n", rounds, OPS_PER_ROUND, RUNS);
  printf("  trace off  %8.1f ns/op  (runs %.1f .. %.1f)\n", off[RUNS / 2], off[0], off[RUNS - 1]);
  printf("  trace on   %8.1f ns/op  (runs %.1f .. %.1f)\n", on[RUNS / 2], on[0], on[RUNS - 1]);
  printf("  ratio on/off %.2f; +%.1f ns per traced operation; %.1f bytes of trace per operation\n",
         on[RUNS / 2] / off[RUNS / 2], on[RUNS / 2] - off[RUNS / 2], (double)st.st_size / ops);
  return 0;
}
