/* bench_trace: what the operation trace costs. The same mixed loop of operations (alloc/free
 * pairs of both kinds outside a retention scope, then a scope whose transient pairs are mostly
 * pool hits, a retained package pair, begin and finish) runs with the trace off and on (a file in
 * /tmp, deleted at the end), on the fake driver without its call log. Runs alternate off/on;
 * each figure is the median of RUNS runs. Prints ns per operation for each and the ratio, in
 * wall time and in the process's CPU time (steadier where other work shares the cores).
 *
 *   bench_trace [ROUNDS]      ROUNDS loop rounds per run (default 4000, 28 operations each) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_cli.h"
#include "fake_driver.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define RUNS 7
#define OPS_PER_ROUND 28 /* 2 pairs, begin, 10 transient pairs, 1 package pair, finish */

static uint64_t clock_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct cost {
  double wall, cpu; /* ns per operation */
} cost;

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
 * operation to the close that flushes the file. Returns 0 with the cost per operation, or -1. */
static int run(unsigned rounds, const char *trace_path, cost *out) {
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
  uint64_t t0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  if (trace_path) rc = check(a, vmm_arena_trace(a, trace_path), "starting the trace");
  for (unsigned i = 0; i < rounds && rc == 0; i++) rc = round_of_ops(a, i);
  if (trace_path && rc == 0) rc = check(a, vmm_arena_trace(a, NULL), "closing the trace");
  uint64_t t1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
  vmm_arena_destroy(a);
  double ops = (double)rounds * OPS_PER_ROUND;
  *out = (cost){(double)(t1 - t0) / ops, (double)(c1 - c0) / ops};
  return rc;
}

static int by_value(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static const char USAGE[] =
    "usage: bench_trace [ROUNDS]\n"
    "What the operation trace costs: the same mixed loop of operations with the trace off and on, on\n"
    "the fake driver; ns per operation, in wall and CPU time, and the ratio.\n"
    "  ROUNDS   loop rounds per run (> 0, default 4000, 28 operations each)\n";

int main(int argc, char **argv) {
  unsigned rounds = 4000;
  for (int i = 1; i < argc; i++) {
    bench_cli_help_or_version("bench_trace", USAGE, argv[i]);
    char *end = NULL;
    unsigned long n = argv[i][0] >= '0' && argv[i][0] <= '9' ? strtoul(argv[i], &end, 10) : 0;
    if (i > 1 || !end || *end || n == 0 || n > 100000000) {
      if (argv[i][0] == '-') bench_cli_refuse("bench_trace", argv[i]);
      fprintf(stderr, "bench_trace: ROUNDS \"%s\": expected one count of rounds, 1 to 100000000 (bench_trace --help)\n",
              argv[i]);
      return 2;
    }
    rounds = (unsigned)n;
  }
  char path[] = "/tmp/vmmarena-bench-trace-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    fprintf(stderr, "bench_trace: mkstemp %s: %s\n", path, strerror(errno));
    return 1;
  }
  close(fd);
  cost warm, off[RUNS], on[RUNS];
  int rc = run(rounds / 10 + 1, NULL, &warm);
  for (int r = 0; r < RUNS && rc == 0; r++) rc = run(rounds, NULL, &off[r]) || run(rounds, path, &on[r]);
  struct stat st;
  if (rc == 0 && stat(path, &st) != 0) rc = 1;
  unlink(path);
  if (rc) return 1;
  printf("bench_trace: %u rounds x %d operations per run, median of %d runs, fake driver\n", rounds, OPS_PER_ROUND, RUNS);
  printf("            trace off ns/op   trace on ns/op   on/off   cost of a traced op\n");
  for (int use_cpu = 0; use_cpu < 2; use_cpu++) {
    double x[RUNS], y[RUNS];
    for (int r = 0; r < RUNS; r++) {
      x[r] = use_cpu ? off[r].cpu : off[r].wall;
      y[r] = use_cpu ? on[r].cpu : on[r].wall;
    }
    qsort(x, RUNS, sizeof x[0], by_value);
    qsort(y, RUNS, sizeof y[0], by_value);
    double a = x[RUNS / 2], b = y[RUNS / 2];
    printf("  %-6s %16.1f %16.1f %8.2f %14.1f ns\n", use_cpu ? "cpu" : "wall", a, b, b / a, b - a);
  }
  printf("  %.1f bytes of trace per operation\n", (double)st.st_size / ((double)rounds * OPS_PER_ROUND));
  return 0;
}
