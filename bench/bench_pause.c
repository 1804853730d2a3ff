/* Pause and resume with VMM_PAUSE_BACKUP on device 0, against a plain pinned copy of the same
 * bytes, with other designs side by side (docs/benchmarks.md, "Pause and resume"). Every row holds 4 GiB in allocations of one size and is paused and resumed
 * three times (the median is shown, and every cycle); its contents are checked bit for bit
 * after one more cycle in which the freed device memory is overwritten, and the process's
 * resident memory (RSS) is read before, while paused and after.
 *
 *   rows          64 MiB, 256 MiB, 1 GiB and 4 GiB per allocation, and 2 MiB ones (many small)
 *   pinned copy   cuMemcpyDtoH / HtoD of the same allocations into pinned memory, no pause
 *   designs       on 16 x 256 MiB: the staging pipeline at several staging sizes and thread counts (threads limited through the CPU affinity),
 *                 kept or not; synchronous copies into pageable memory (the staging off, the
 *                 design before); the backup registered with cuMemHostRegister for the copy;
 *                 the same after the threads touched its pages first; a pinned backup
 *                 (cuMemHostAlloc) freed at resume. The last three are copies only (the
 *                 allocations stay mapped); vmmarena's figures include unmapping and mapping.
 *   host side     16 threads reading a staging buffer (pinned, registered or anonymous memory;
 *                 plain or streaming loads) into touched pages; fresh pages written, copied
 *                 into (each thread its own part, or slices taken in turn: 2 MiB ones, one
 *                 thread per huge page, or 256 KiB ones, several) or populated by 1 to 16
 *                 threads; the time to pin the staging.
 *
 * Prints its tables and, where glibc says, the sizes from which its memcpy and memset change
 * their stores; GB/s are 10^9 bytes per second; "x pinned" is the ratio to the pinned
 * copy of the same row. Exits 1 if a call fails or contents differ. --fake runs the vmmarena
 * rows on the fake driver with 64 MiB per row (a check of the benchmark itself). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_cli.h"
#include "bench_stats.h"
#include "fake_driver.h"
#include "vmmarena.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define PIECE (64 * MIB) /* fill, check and pinned copies go piece by piece */
#define CYCLES 3
#define MAX_ALLOCS 2048

static const struct vmm_driver *d;
static int fake;
static size_t row_total = 4 * GIB;
static unsigned char *pattern, *readback; /* pinned: PIECE + 1 MiB, PIECE */
static int failures;

static struct { /* entry points the library does not use */
  CUresult (*host_register)(void *p, size_t bytes, unsigned flags);
  CUresult (*host_unregister)(void *p);
  CUresult (*device_get_name)(char *name, int len, CUdevice dev);
} x;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double gbps(size_t bytes, double s) { return s > 0 ? (double)bytes / s / 1e9 : 0; }


/* The "KEY: N kB" line of a /proc file, in KiB; -1 if it cannot be read. */
static long long proc_kib(const char *path, const char *format) {
  FILE *f = fopen(path, "r");
  char line[256];
  long long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, format, &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

/* Resident memory of the process (VmRSS), in bytes; -1 if unknown. */
static long long rss(void) {
  long long kib = proc_kib("/proc/self/status", "VmRSS: %lld kB");
  return kib < 0 ? -1 : kib * 1024;
}

static int check_cu(CUresult r, const char *what, size_t bytes) {
  if (r == CUDA_SUCCESS) return 0;
  fprintf(stderr, "bench_pause: %s (%zu bytes) returned %d\n", what, bytes, (int)r);
  failures++;
  return -1;
}

/* ---- Contents: each piece of allocation k a window of the random pattern ------------ */

static size_t shift(size_t k, size_t piece) { return (k * 131 + piece * 7) % 256 * 4096; }

static int fill(void *const *p, size_t n, size_t bytes) {
  for (size_t k = 0; k < n; k++)
    for (size_t off = 0; off < bytes; off += PIECE) {
      size_t len = bytes - off < PIECE ? bytes - off : PIECE;
      CUdeviceptr dev = (CUdeviceptr)(uintptr_t)p[k] + off;
      if (check_cu(d->mem_cpy_htod(dev, pattern + shift(k, off / PIECE), len), "fill: cuMemcpyHtoD", len)) return -1;
    }
  return 0;
}

/* 0 if every allocation holds what fill wrote, else -1 (and the place is printed). */
static int same(void *const *p, size_t n, size_t bytes) {
  for (size_t k = 0; k < n; k++)
    for (size_t off = 0; off < bytes; off += PIECE) {
      size_t len = bytes - off < PIECE ? bytes - off : PIECE;
      CUdeviceptr dev = (CUdeviceptr)(uintptr_t)p[k] + off;
      if (check_cu(d->mem_cpy_dtoh(readback, dev, len), "check: cuMemcpyDtoH", len)) return -1;
      if (memcmp(readback, pattern + shift(k, off / PIECE), len)) {
        fprintf(stderr, "bench_pause: allocation %zu differs in bytes %zu to %zu\n", k, off, off + len);
        failures++;
        return -1;
      }
    }
  return 0;
}

/* A plain pinned copy of the same allocations, both ways (GB/s into out[0], out[1]). */
static void pinned_copy(void *const *p, size_t n, size_t bytes, double out[2]) {
  for (int dir = 0; dir < 2; dir++) {
    double t0 = now_s();
    for (size_t k = 0; k < n; k++)
      for (size_t off = 0; off < bytes; off += PIECE) {
        size_t len = bytes - off < PIECE ? bytes - off : PIECE;
        CUdeviceptr dev = (CUdeviceptr)(uintptr_t)p[k] + off;
        CUresult r = dir ? d->mem_cpy_htod(dev, readback, len) : d->mem_cpy_dtoh(readback, dev, len);
        if (check_cu(r, "pinned copy", len)) return;
      }
    out[dir] = gbps(n * bytes, now_s() - t0);
  }
}

static int scrub(void *const *p, size_t n, size_t bytes);

/* ---- vmmarena ------------------------------------------------------------------------ */

typedef struct variant {
  const char *name;
  const char *staging;    /* VMMARENA_PAUSE_STAGING value; NULL = the default */
  int cpus;               /* CPUs the copier's threads may use; 0 = all */
} variant;

typedef struct result {
  double pause, resume, pinned[2];
  double cycle[2][CYCLES]; /* GB/s of each pause and resume */
  long long rss[3];  /* before, paused, after */
  double staging_ms; /* in cuMemHostAlloc and cuMemFreeHost, per cycle */
  int same;
} result;

static vmm_arena *arena_for(const variant *v) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake ? fake_driver() : NULL;
  if (v->staging && vmm_config_set(&cfg, "pause_staging", v->staging) != VMM_OK) {
    fprintf(stderr, "bench_pause: %s\n", vmm_config_error());
    return NULL;
  }
  vmm_arena *a = NULL;
  if (vmm_arena_create(&cfg, &a) != VMM_OK) fprintf(stderr, "bench_pause: %s\n", vmm_create_error());
  return a;
}

/* Limits this thread (and the copier threads it starts) to the first `cpus` CPUs it may use. */
static void limit_cpus(int cpus, cpu_set_t *old) {
  sched_getaffinity(0, sizeof *old, old);
  if (cpus <= 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = 0, taken = 0; c < CPU_SETSIZE && taken < cpus; c++)
    if (CPU_ISSET(c, old)) CPU_SET(c, &set), taken++;
  sched_setaffinity(0, sizeof set, &set);
}

static double staging_ms(vmm_arena *a) {
  vmm_snapshot s;
  if (vmm_arena_snapshot(a, &s) != VMM_OK) return 0;
  return (double)(s.driver[VMM_DRV_mem_host_alloc].ns + s.driver[VMM_DRV_mem_free_host].ns) / 1e6;
}

/* CYCLES pauses and resumes of the allocations tagged "row"; the medians into r. */
static int cycles(vmm_arena *a, size_t n, size_t bytes, result *r) {
  double t[2][CYCLES];
  r->rss[0] = rss();
  for (int c = 0; c < CYCLES; c++) {
    double t0 = now_s();
    vmm_status st = vmm_arena_pause(a, "row", VMM_PAUSE_BACKUP);
    double t1 = now_s();
    if (c == 0) r->rss[1] = rss();
    vmm_status st2 = st == VMM_OK ? vmm_arena_resume(a, "row") : st;
    double t2 = now_s();
    if (st != VMM_OK || st2 != VMM_OK) {
      fprintf(stderr, "bench_pause: %s\n", vmm_arena_last_error(a));
      failures++;
      return -1;
    }
    t[0][c] = t1 - t0, t[1][c] = t2 - t1;
    r->cycle[0][c] = gbps(n * bytes, t[0][c]), r->cycle[1][c] = gbps(n * bytes, t[1][c]);
  }
  r->rss[2] = rss();
  r->pause = gbps(n * bytes, bench_median(t[0], CYCLES));
  r->resume = gbps(n * bytes, bench_median(t[1], CYCLES));
  r->staging_ms = staging_ms(a) / CYCLES;
  return 0;
}

/* One more pause and resume, untimed, with the freed device memory overwritten meanwhile (an
 * allocation of the same bytes, zeroed, then freed), so that the check reads what the resume
 * copied back, not memory that kept its contents. */
static int overwritten_cycle(vmm_arena *a) {
  void *q = NULL;
  vmm_status st = vmm_arena_pause(a, "row", VMM_PAUSE_BACKUP);
  if (st == VMM_OK) st = vmm_arena_alloc(a, row_total, VMM_KIND_PACKAGE, NULL, &q);
  if (st == VMM_OK && scrub(&q, 1, row_total)) st = VMM_ERR_DRIVER;
  if (q) vmm_arena_free(a, q, NULL);
  if (st == VMM_OK) st = vmm_arena_resume(a, "row");
  if (st == VMM_OK) return 0;
  fprintf(stderr, "bench_pause: overwritten cycle: %s\n", vmm_arena_last_error(a));
  return failures++, -1;
}

static int vmm_row(const variant *v, size_t bytes, int reference, result *r) {
  size_t n = row_total / bytes;
  void *p[MAX_ALLOCS] = {0};
  cpu_set_t old;
  memset(r, 0, sizeof *r);
  vmm_arena *a = arena_for(v);
  if (!a) return failures++, -1;
  vmm_tag_push("row");
  for (size_t k = 0; k < n; k++)
    if (vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, NULL, &p[k]) != VMM_OK) {
      fprintf(stderr, "bench_pause: %s\n", vmm_arena_last_error(a));
      failures++;
      n = k;
    }
  vmm_tag_pop();
  limit_cpus(v->cpus, &old);
  int rc = n == row_total / bytes ? fill(p, n, bytes) : -1;
  if (rc == 0) rc = cycles(a, n, bytes, r);
  sched_setaffinity(0, sizeof old, &old);
  r->same = rc == 0 && overwritten_cycle(a) == 0 && same(p, n, bytes) == 0;
  if (reference && rc == 0) pinned_copy(p, n, bytes, r->pinned);
  for (size_t k = 0; k < n; k++) vmm_arena_free(a, p[k], NULL);
  vmm_arena_destroy(a);
  return rc;
}

static void print_head(void) {
  printf("| design | allocations | pause GB/s (x pinned) | resume GB/s (x pinned) | RSS before MiB | paused | after | "
         "staging ms/cycle | identical | cycles: pause / resume GB/s |\n"
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n");
}

static void print_row(const char *name, size_t bytes, const result *r, const result *ref) {
  double pin = ref->pinned[0] > 0 ? ref->pinned[0] : 1, pin_back = ref->pinned[1] > 0 ? ref->pinned[1] : 1;
  printf("| %s | %zu x %zu MiB | %.2f (%.2fx) | %.2f (%.2fx) | %.0f | %+.0f | %+.0f | %.1f | %s |", name,
         row_total / bytes, bytes / MIB, r->pause, r->pause / pin, r->resume, r->resume / pin_back,
         (double)r->rss[0] / MIB, (double)(r->rss[1] - r->rss[0]) / MIB, (double)(r->rss[2] - r->rss[0]) / MIB,
         r->staging_ms, r->same ? "yes" : "NO");
  for (int dir = 0; dir < 2; dir++)
    for (int c = 0; c < CYCLES; c++) printf("%s%.1f", c ? " " : dir ? " / " : " ", r->cycle[dir][c]);
  printf(" |\n");
  fflush(stdout);
}

static void print_pinned(size_t bytes, const result *r) {
  printf("| plain pinned copy (cuMemcpyDtoH / HtoD) | %zu x %zu MiB | %.2f (1.00x) | %.2f (1.00x) | | | | | | |\n",
         row_total / bytes, bytes / MIB, r->pinned[0], r->pinned[1]);
}

/* ---- The designs that copy without vmmarena (on allocations that stay mapped) -------- */

enum { REGISTER, TOUCH_REGISTER, PINNED_BACKUP };
static const char *const design_names[] = {"registered backup (cuMemHostRegister for the copy)",
                                           "registered backup, pages touched first by 8 threads",
                                           "pinned backup (cuMemHostAlloc), freed at resume"};

typedef struct touch {
  char *p;
  size_t bytes;
  int populate; /* 1: madvise(MADV_POPULATE_WRITE) instead of writing; 2: copies from the pattern */
} touch;

static void *touch_pages(void *arg) {
  touch *t = arg;
#ifdef MADV_POPULATE_WRITE
  if (t->populate == 1) {
    if (madvise(t->p, t->bytes, MADV_POPULATE_WRITE)) t->populate = -1;
    return NULL;
  }
#endif
  if (t->populate == 2) {
    for (size_t off = 0; off < t->bytes; off += MIB) memcpy(t->p + off, pattern + off % PIECE, t->bytes - off < MIB ? t->bytes - off : MIB);
    return NULL;
  }
  memset(t->p, 0, t->bytes);
  return NULL;
}

/* Writes (or populates) every page of [p, p + bytes) with `threads` threads (at most 16).
 * Returns -1 if populating is not supported. */
static int touch_parallel(char *p, size_t bytes, int threads, int populate) {
  pthread_t th[16];
  touch t[16];
  size_t part = (bytes / (size_t)threads + 4095) & ~(size_t)4095;
  int started = 0, rc = 0;
  for (size_t off = 0; off < bytes && started < threads; off += part, started++) {
    t[started] = (touch){p + off, bytes - off < part ? bytes - off : part, populate};
    if (pthread_create(&th[started], NULL, touch_pages, &t[started])) touch_pages(&t[started]);
  }
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    if (t[i].populate < 0) rc = -1;
  }
#ifndef MADV_POPULATE_WRITE
  if (populate == 1) rc = -1;
#endif
  return rc;
}

static void *host_new(int design, size_t bytes) {
  void *h = NULL;
  if (design == PINNED_BACKUP) return check_cu(d->mem_host_alloc(&h, bytes, 0), "cuMemHostAlloc", bytes) ? NULL : h;
  h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (h == MAP_FAILED) return NULL;
  madvise(h, bytes, MADV_HUGEPAGE);
  if (design == TOUCH_REGISTER) touch_parallel(h, bytes, 8, 0);
  return h;
}

/* Backs up (save) or restores one allocation the design's way. */
static int design_copy(int design, CUdeviceptr dev, void **host, size_t bytes, int save) {
  if (save && !(*host = host_new(design, bytes))) return failures++, -1;
  int reg = design != PINNED_BACKUP;
  if (reg && check_cu(x.host_register(*host, bytes, 0), "cuMemHostRegister", bytes)) return -1;
  CUresult r = save ? d->mem_cpy_dtoh(*host, dev, bytes) : d->mem_cpy_htod(dev, *host, bytes);
  if (check_cu(r, save ? "cuMemcpyDtoH" : "cuMemcpyHtoD", bytes)) return -1;
  if (reg && check_cu(x.host_unregister(*host), "cuMemHostUnregister", bytes)) return -1;
  if (save) return 0;
  if (reg) munmap(*host, bytes);
  else if (check_cu(d->mem_free_host(*host), "cuMemFreeHost", bytes)) return -1;
  *host = NULL;
  return 0;
}

/* Overwrites the allocations with zeros (between a backup and its restore, untimed). */
static int scrub(void *const *p, size_t n, size_t bytes) {
  memset(readback, 0, PIECE);
  for (size_t k = 0; k < n; k++)
    for (size_t off = 0; off < bytes; off += PIECE) {
      size_t len = bytes - off < PIECE ? bytes - off : PIECE;
      if (check_cu(d->mem_cpy_htod((CUdeviceptr)(uintptr_t)p[k] + off, readback, len), "scrub", len)) return -1;
    }
  return 0;
}

static int design_cycles(int design, void *const *p, size_t n, size_t bytes, result *r) {
  static void *host[MAX_ALLOCS];
  double t[2][CYCLES];
  r->rss[0] = rss();
  for (int c = 0; c < CYCLES; c++)
    for (int save = 1; save >= 0; save--) {
      double t0 = now_s();
      for (size_t k = 0; k < n; k++)
        if (design_copy(design, (CUdeviceptr)(uintptr_t)p[k], &host[k], bytes, save)) return -1;
      t[!save][c] = now_s() - t0;
      r->cycle[!save][c] = gbps(n * bytes, t[!save][c]);
      if (save && c == 0) r->rss[1] = rss();
      if (save && scrub(p, n, bytes)) return -1;
    }
  r->rss[2] = rss();
  r->pause = gbps(n * bytes, bench_median(t[0], CYCLES));
  r->resume = gbps(n * bytes, bench_median(t[1], CYCLES));
  return 0;
}

static int design_row(int design, size_t bytes, result *r) {
  size_t n = row_total / bytes;
  void *p[MAX_ALLOCS] = {0};
  memset(r, 0, sizeof *r);
  variant v = {"", NULL, 0};
  vmm_arena *a = arena_for(&v);
  if (!a) return failures++, -1;
  size_t made = 0;
  while (made < n && vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, NULL, &p[made]) == VMM_OK) made++;
  int rc = made == n ? fill(p, n, bytes) : (failures++, -1);
  if (rc == 0) rc = design_cycles(design, p, n, bytes, r);
  r->same = rc == 0 && same(p, n, bytes) == 0;
  for (size_t k = 0; k < made; k++) vmm_arena_free(a, p[k], NULL);
  vmm_arena_destroy(a);
  return rc;
}

/* ---- The host side alone ------------------------------------------------------------- */

static long long anon_huge_kib(void) { return proc_kib("/proc/meminfo", "AnonHugePages: %lld kB"); }

/* Slices of [p, p + bytes) that threads take in turn (the copy engine's way): each copied
 * from src (a window of PIECE bytes), or where `touch`, written once at its start. */
typedef struct turns {
  char *p;
  const char *src;
  size_t bytes, slice, next; /* next: the next slice's offset (atomic) */
  int touch;
} turns;

static void *take_turns(void *arg) {
  turns *t = arg;
  for (;;) {
    size_t off = __atomic_fetch_add(&t->next, t->slice, __ATOMIC_RELAXED);
    if (off >= t->bytes) return NULL;
    if (t->touch) *(volatile char *)(t->p + off) = 0;
    else memcpy(t->p + off, t->src + off % PIECE, t->bytes - off < t->slice ? t->bytes - off : t->slice);
  }
}

static void in_turn(char *p, size_t bytes, int threads, const char *src, size_t slice, int write_once) {
  pthread_t th[16];
  turns t = {p, src, bytes, slice, 0, write_once};
  int started = 0;
  for (; started < threads && pthread_create(&th[started], NULL, take_turns, &t) == 0; started++) {}
  if (!started) take_turns(&t);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
}

/* The ways fresh pages are first written in the table below. */
enum { MEMSET, POPULATE, MEMCPY_PARTS, MEMCPY_HUGE, MEMCPY_SMALL, MEMCPY_ANON, TOUCH_THEN_MEMCPY };
static const char *const first_write[] = {
    "",
    ", MADV_POPULATE_WRITE",
    ", memcpy from pinned memory (each thread its own sixteenth, 1 MiB at a time)",
    ", memcpy from pinned memory, slices 2 MiB aligned (one thread per huge page)",
    ", memcpy from pinned memory, slices of 256 KiB in turn (8 threads per huge page, the slicing before)",
    ", memcpy from anonymous memory, slices 2 MiB aligned (one thread per huge page)",
    ", one write per 2 MiB, then memcpy from pinned memory, slices 2 MiB aligned (both timed)",
};

/* First writes [p, p + bytes) the way `how` says with `threads` threads; -1 if populating is
 * not supported. */
static int first_writes(char *p, size_t bytes, int threads, int how, const char *anon) {
  if (how <= MEMCPY_PARTS) return touch_parallel(p, bytes, threads, how);
  if (how == TOUCH_THEN_MEMCPY) in_turn(p, bytes, threads, NULL, 2 * MIB, 1);
  in_turn(p, bytes, threads, how == MEMCPY_ANON ? anon : (const char *)pattern, how == MEMCPY_SMALL ? MIB / 4 : 2 * MIB, 0);
  return 0;
}

/* First touch of fresh anonymous memory by 1 to 16 threads, then writing it again: the most a
 * copy into new backups can reach on this machine. */
static void host_side(void) {
  static const struct { int threads, huge, how; } runs[] = {
      {16, 1, MEMSET},       {16, 1, MEMCPY_PARTS}, {16, 1, MEMCPY_HUGE}, {16, 1, MEMCPY_SMALL},
      {16, 1, MEMCPY_ANON},  {16, 1, TOUCH_THEN_MEMCPY}, {16, 1, MEMSET}, {1, 1, MEMSET},
      {4, 1, MEMSET},        {16, 0, MEMSET},       {16, 1, POPULATE}};
  char *anon = mmap(NULL, PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (anon == MAP_FAILED) return;
  memcpy(anon, pattern, PIECE);
  printf("\nHost memory, %zu MiB: fresh anonymous pages written (first touch), then written again:\n\n"
         "| threads | pages | first touch GB/s | again GB/s | huge pages MiB |\n| ---: | --- | ---: | ---: | ---: |\n",
         row_total / MIB);
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    char *p = mmap(NULL, row_total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    if (runs[i].huge) madvise(p, row_total, MADV_HUGEPAGE);
    long long h0 = anon_huge_kib();
    double t0 = now_s();
    int rc = first_writes(p, row_total, runs[i].threads, runs[i].how, anon);
    double t1 = now_s();
    long long h1 = anon_huge_kib();
    touch_parallel(p, row_total, runs[i].threads, 0);
    double t2 = now_s();
    munmap(p, row_total);
    printf("| %d | %s%s | %.2f | %.2f | %lld |\n", runs[i].threads, runs[i].huge ? "huge asked" : "4 KiB",
           rc ? ", MADV_POPULATE_WRITE unsupported" : first_write[runs[i].how],
           gbps(row_total, t1 - t0), gbps(row_total, t2 - t1), (h1 - h0) / 1024);
    fflush(stdout);
  }
  munmap(anon, PIECE);
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("sse4.1"))) static void stream_copy(char *dst, const char *src, size_t n) {
  for (size_t i = 0; i + 64 <= n; i += 64) {
    __m128i *from = (__m128i *)(uintptr_t)(src + i), *to = (__m128i *)(dst + i);
    __m128i x0 = _mm_stream_load_si128(from), x1 = _mm_stream_load_si128(from + 1);
    __m128i x2 = _mm_stream_load_si128(from + 2), x3 = _mm_stream_load_si128(from + 3);
    _mm_stream_si128(to, x0), _mm_stream_si128(to + 1, x1), _mm_stream_si128(to + 2, x2), _mm_stream_si128(to + 3, x3);
  }
  _mm_sfence();
}
#else
static void stream_copy(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif

typedef struct reader {
  char *dst;
  const char *src;
  size_t bytes;
  int streaming;
} reader;

static void *read_part(void *arg) {
  reader *r = arg;
  for (size_t off = 0; off < r->bytes; off += MIB) {
    const char *src = r->src + off % PIECE;
    if (r->streaming) stream_copy(r->dst + off, src, MIB);
    else memcpy(r->dst + off, src, MIB);
  }
  return NULL;
}

/* 16 threads copy 4 GiB out of a 64 MiB source into pages already touched: how fast the host
 * reads a staging buffer, by the kind of memory and the kind of load. */
static void read_side(void) {
  size_t bytes = row_total;
  char *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *anon = mmap(NULL, PIECE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (dst == MAP_FAILED || anon == MAP_FAILED) return;
  madvise(dst, bytes, MADV_HUGEPAGE);
  touch_parallel(dst, bytes, 16, 0);
  memset(anon, 1, PIECE);
  int registered = check_cu(x.host_register(anon, PIECE, 0), "cuMemHostRegister", PIECE) == 0;
  static const char *const names[] = {"pinned (cuMemHostAlloc), memcpy", "pinned (cuMemHostAlloc), streaming loads",
                                      "anonymous memory registered (cuMemHostRegister), memcpy", "anonymous memory, memcpy"};
  printf("\nReading a staging buffer: 16 threads copy %zu MiB out of 64 MiB into touched pages:\n\n"
         "| source | GB/s |\n| --- | ---: |\n", bytes / MIB);
  for (int k = 0; k < 4; k++) {
    pthread_t th[16];
    reader rd[16];
    double t0 = now_s();
    for (int i = 0; i < 16; i++) {
      rd[i] = (reader){dst + i * (bytes / 16), k < 2 ? (const char *)pattern : anon, bytes / 16, k == 1};
      if (pthread_create(&th[i], NULL, read_part, &rd[i])) read_part(&rd[i]);
    }
    for (int i = 0; i < 16; i++) pthread_join(th[i], NULL);
    printf("| %s | %.2f |\n", names[k], gbps(bytes, now_s() - t0));
  }
  if (registered) check_cu(x.host_unregister(anon), "cuMemHostUnregister", PIECE);
  munmap(anon, PIECE);
  munmap(dst, bytes);
}

/* What a copy pays for its staging (4 buffers) when it is not kept: cuMemHostAlloc and
 * cuMemFreeHost, against memory of its own registered with cuMemHostRegister. */
static void staging_costs(void) {
  printf("\nStaging of 4 buffers, ms: pinned allocation and free, against anonymous memory touched and "
         "registered:\n\n| staging | cuMemHostAlloc | cuMemFreeHost | mmap + touch + cuMemHostRegister | "
         "cuMemHostUnregister + munmap |\n| ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t total = 16 * MIB; total <= 256 * MIB; total *= 4) {
    void *b[4];
    double t[5];
    t[0] = now_s();
    for (int i = 0; i < 4; i++) check_cu(d->mem_host_alloc(&b[i], total / 4, 0), "cuMemHostAlloc", total / 4);
    t[1] = now_s();
    for (int i = 0; i < 4; i++) check_cu(d->mem_free_host(b[i]), "cuMemFreeHost", total / 4);
    t[2] = now_s();
    for (int i = 0; i < 4; i++) {
      b[i] = mmap(NULL, total / 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      memset(b[i], 0, total / 4);
      check_cu(x.host_register(b[i], total / 4, 0), "cuMemHostRegister", total / 4);
    }
    t[3] = now_s();
    for (int i = 0; i < 4; i++) {
      check_cu(x.host_unregister(b[i]), "cuMemHostUnregister", total / 4);
      munmap(b[i], total / 4);
    }
    t[4] = now_s();
    printf("| %zu MiB | %.1f | %.1f | %.1f | %.1f |\n", total / MIB, (t[1] - t[0]) * 1e3, (t[2] - t[1]) * 1e3,
           (t[3] - t[2]) * 1e3, (t[4] - t[3]) * 1e3);
  }
}

/* ---- Setup and the table ------------------------------------------------------------- */

/* The sizes (bytes) from which glibc's memcpy and memset change their stores, as its dynamic
 * loader lists them (x86-64; glibc 2.33 and later), on one line; nothing where it says none. */
static void print_glibc_thresholds(void) {
#if defined(__x86_64__)
  FILE *f = popen("/lib64/ld-linux-x86-64.so.2 --list-diagnostics 2>/dev/null", "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) {
    char name[128];
    unsigned long long v;
    if (sscanf(line, "x86.cpu_features.%127[a-z_]=%llx", name, &v) == 2 && strstr(name, "threshold"))
      printf("%s%s %llu", n++ ? ", " : "glibc string thresholds (bytes): ", name, v);
  }
  if (f) pclose(f);
  if (n) printf("\n\n");
#endif
}

static void print_setup(CUdevice dev) {
  char name[128] = "fake", thp[2][128] = {"?", "?"};
  int version = 0;
  if (!fake) x.device_get_name(name, sizeof name, dev);
  d->driver_get_version(&version);
  const char *files[] = {"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/defrag"};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(files[i], "r");
    if (f && fgets(thp[i], sizeof thp[i], f)) thp[i][strcspn(thp[i], "\n")] = '\0';
    if (f) fclose(f);
  }
  cpu_set_t set;
  sched_getaffinity(0, sizeof set, &set);
  printf("bench_pause: %s, CUDA driver %d, %d CPUs, transparent huge pages: %s (defrag: %s); %zu MiB per row, "
         "median of %d cycles\n\n", name, version, CPU_COUNT(&set), thp[0], thp[1], row_total / MIB, CYCLES);
  print_glibc_thresholds();
}

static int setup(void) {
  const char *why = NULL;
  d = fake ? fake_driver_reset(&(fake_options){.record_calls = -1}) : vmm_driver_cuda(&why);
  if (!d) return fprintf(stderr, "bench_pause: %s\n", why), -1;
  void *lib = fake ? NULL : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    x.host_register = (CUresult(*)(void *, size_t, unsigned))dlsym(lib, "cuMemHostRegister_v2");
    x.host_unregister = (CUresult(*)(void *))dlsym(lib, "cuMemHostUnregister");
    x.device_get_name = (CUresult(*)(char *, int, CUdevice))dlsym(lib, "cuDeviceGetName");
  }
  if (!fake && (!x.host_register || !x.host_unregister || !x.device_get_name))
    return fprintf(stderr, "bench_pause: libcuda.so.1 lacks cuMemHostRegister_v2, cuMemHostUnregister or cuDeviceGetName\n"), -1;
  CUdevice dev;
  CUcontext ctx;
  if (check_cu(d->init(0), "cuInit", 0) || check_cu(d->device_get(&dev, 0), "cuDeviceGet", 0) ||
      check_cu(d->primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain", 0) ||
      check_cu(d->ctx_push_current(ctx), "cuCtxPushCurrent", 0))
    return -1;
  void *pat = NULL, *back = NULL;
  if (check_cu(d->mem_host_alloc(&pat, PIECE + MIB, 0), "cuMemHostAlloc", PIECE + MIB) ||
      check_cu(d->mem_host_alloc(&back, PIECE, 0), "cuMemHostAlloc", PIECE))
    return -1;
  pattern = pat, readback = back;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < (PIECE + MIB) / 8; i++) { /* xorshift64 */
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    memcpy(pattern + 8 * i, &s, 8);
  }
  print_setup(dev);
  return 0;
}

static const variant designs[] = {
    {"vmmarena, 32 MiB staging, 16 copy threads (the default)", NULL, 0},
    {"vmmarena, 16 MiB staging", "16M", 0},
    {"vmmarena, 64 MiB staging", "64M", 0},
    {"vmmarena, 256 MiB staging", "256M", 0},
    {"vmmarena, 32 MiB staging kept between calls", "32M,keep", 0},
    {"vmmarena, 64 MiB staging kept between calls", "64M,keep", 0},
    {"vmmarena, 4 copy threads", NULL, 4},
    {"vmmarena, 8 copy threads", NULL, 8},
    {"vmmarena, staging off: synchronous copies into pageable memory (the design before)", "0", 0},
};

static const char USAGE[] =
    "usage: bench_pause [--fake]\n"
    "Pause and resume with VMM_PAUSE_BACKUP on device 0 against a pinned copy of the same bytes, the\n"
    "copy designs side by side, and the host side alone. Exits 1 if a call fails or contents differ.\n"
    "  --fake   the vmmarena rows on the fake driver, 64 MiB per row (a check of the benchmark itself)\n";

int main(int argc, char **argv) {
  double start = now_s();
  for (int i = 1; i < argc; i++) {
    bench_cli_help_or_version("bench_pause", USAGE, argv[i]);
    if (strcmp(argv[i], "--fake")) bench_cli_refuse("bench_pause", argv[i]);
    fake = 1;
  }
  if (fake) row_total = 64 * MIB;
  if (setup()) return 1;
  static const size_t real_sizes[] = {64 * MIB, 256 * MIB, GIB, 4 * GIB, 2 * MIB};
  static const size_t fake_sizes[] = {4 * MIB, 16 * MIB, 64 * MIB, 2 * MIB};
  const size_t *sizes = fake ? fake_sizes : real_sizes;
  size_t rows = fake ? 4 : 5, design_bytes = fake ? 16 * MIB : 256 * MIB;
  variant def = {"vmmarena (32 MiB staging, 16 copy threads)", NULL, 0};
  result r, ref = {0};
  print_head();
  for (size_t i = 0; i < rows; i++) {
    vmm_row(&def, sizes[i], 1, &r);
    print_row(def.name, sizes[i], &r, &r);
    print_pinned(sizes[i], &r);
    if (sizes[i] == design_bytes) ref = r;
  }
  printf("\nThe designs, on %zu x %zu MiB (x pinned: against the pinned copy of that row above):\n\n",
         row_total / design_bytes, design_bytes / MIB);
  print_head();
  for (size_t i = 0; i < sizeof designs / sizeof designs[0]; i++) {
    vmm_row(&designs[i], design_bytes, 0, &r);
    print_row(designs[i].name, design_bytes, &r, &ref);
  }
  for (int design = fake ? PINNED_BACKUP : REGISTER; design <= PINNED_BACKUP; design++) {
    design_row(design, design_bytes, &r);
    print_row(design_names[design], design_bytes, &r, &ref);
  }
  if (!fake) {
    read_side();
    host_side();
    staging_costs();
  }
  printf("\nbench_pause: %s in %.0f s\n", failures ? "FAILED" : "done", now_s() - start);
  return failures ? 1 : 0;
}
