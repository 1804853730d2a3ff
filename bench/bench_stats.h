/* What the benchmarks share: a monotonic clock and the median of samples. */
#ifndef VMMARENA_BENCH_STATS_H
#define VMMARENA_BENCH_STATS_H

#include <stdlib.h>
#include <time.h>

static inline double bench_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static inline int bench_compare_doubles(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* The median of v[0, n), which it sorts: the middle sample, or the mean of the two middle ones. */
static inline double bench_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, bench_compare_doubles);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
