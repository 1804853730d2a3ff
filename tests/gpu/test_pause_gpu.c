/* Pause and resume on the real driver (built and run by tests/gpu/run; needs a GPU):
 *  - a CUDA graph captured over tagged package memory replays right after pause(DISCARD),
 *    which cuMemGetInfo shows freeing the memory, then resume and a refill;
 *  - VMM_PAUSE_BACKUP through the pinned staging: 4 GiB in 16 allocations come back
 *    bit-identical over four cycles, with the freed device memory overwritten while paused;
 *    the backups are resident while paused, and after each resume the process's resident
 *    memory is back within 64 MiB of where it was;
 *  - a pause during a capture is refused and changes nothing;
 *  - pausing memory that a busy stream is writing waits for it: no corruption;
 *  - time per GiB of pause and resume (DISCARD, BACKUP, in a scope) against the copy
 *    bandwidth the card reaches to pageable and pinned host memory ("bench:" lines).
 * Prints "pause-gpu: N passed, M failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_kernels.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static CUdeviceptr d(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t device_free(void) {
  size_t f = 0, t = 0;
  CUresult r = gk.mem_get_info(&f, &t);
  if (r != CUDA_SUCCESS) {
    gk_check(0, "cuMemGetInfo", "%s", gk_error(r));
    return 0;
  }
  return f;
}

static vmm_arena *arena(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.retain = VMM_RETAIN_ON;
  vmm_arena *a = NULL;
  if (vmm_arena_create(&cfg, &a) != VMM_OK) fprintf(stderr, "vmm_arena_create: %s\n", vmm_create_error());
  return a;
}

static void *tagged(vmm_arena *a, const char *tag, size_t bytes, CUstream s) {
  void *p = NULL;
  vmm_tag_push(tag);
  vmm_status st = vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, s, &p);
  vmm_tag_pop();
  if (st != VMM_OK) fprintf(stderr, "alloc %zu: %s\n", bytes, vmm_arena_last_error(a));
  return st == VMM_OK ? p : NULL;
}

static void graph_survives_discard(vmm_arena *a, CUstream s) {
  const char *t = "graph_survives_discard";
  const size_t bytes = 256 * MiB, words = bytes / 4;
  void *in = tagged(a, "operands", bytes, s), *out = tagged(a, "operands", bytes, s);
  if (!in || !out) {
    gk_check(0, t, "allocating the operands");
    return;
  }
  gk_fill(d(in), words, 1, s);
  CUgraph g;
  CUgraphExec ge;
  CUresult r = gk.stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (!r) r = gk_scale(d(out), d(in), words, s);
  CUresult r2 = gk.stream_end_capture(s, &g);
  if (r || r2 || (r = gk.graph_instantiate(&ge, g, 0))) {
    gk_check(0, t, "capturing the graph: %s", gk_error(r ? r : r2));
    return;
  }
  gk.graph_launch(ge, s);
  gk.stream_synchronize(s);
  gk_check(gk_first_mismatch(d(out), words, 1, 1) == -1, t, "the graph computes out = in * 3 + 1");
  size_t f0 = device_free();
  vmm_status st = vmm_arena_pause(a, "operands", VMM_PAUSE_DISCARD);
  size_t f1 = device_free();
  gk_check(st == VMM_OK && f1 >= f0 + 2 * bytes - 8 * MiB, t, "pause(DISCARD) frees %zu MiB of device memory (%zu -> %zu MiB free)",
           2 * bytes / MiB, f0 / MiB, f1 / MiB);
  st = vmm_arena_resume(a, "operands");
  size_t f2 = device_free();
  gk_check(st == VMM_OK && f2 + 2 * bytes >= f1 - 8 * MiB, t, "resume maps it back at the same addresses (%zu MiB free)",
           f2 / MiB);
  gk_fill(d(in), words, 2, s);
  gk.graph_launch(ge, s);
  gk.stream_synchronize(s);
  long long bad = gk_first_mismatch(d(out), words, 2, 1);
  gk_check(bad == -1, t, "the graph replays on the resumed memory after a refill (first mismatch %lld)", bad);
  gk.graph_exec_destroy(ge);
  gk.graph_destroy(g);
  vmm_arena_free(a, in, s);
  vmm_arena_free(a, out, s);
}

/* Resident memory of the process (VmRSS), in bytes; -1 if unknown. */
static long long rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %lld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib < 0 ? -1 : kib * 1024;
}

/* While paused: an allocation of the same bytes takes the freed device memory and is
 * overwritten, then freed, so that the resume cannot find the old contents in place. */
static void overwrite_freed(vmm_arena *a, size_t bytes, CUstream s) {
  void *q = NULL;
  if (vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, s, &q) != VMM_OK) return;
  gk_fill(d(q), bytes / 4, 0xbad, s);
  gk.stream_synchronize(s);
  vmm_arena_free(a, q, s);
}

#define PARTS 16
#define CYCLES 4

/* One cycle: pause, overwrite, resume, compare; the times into ms[0..1], the resident memory
 * while paused into *paused. */
static void backup_cycle(vmm_arena *a, void *const *p, size_t part, CUstream s, int cycle, double ms[2],
                         long long *paused) {
  const char *t = "backup_cycles_are_bit_identical";
  size_t f0 = device_free();
  double t0 = now_ms();
  vmm_status st = vmm_arena_pause(a, "weights", VMM_PAUSE_BACKUP);
  double t1 = now_ms();
  *paused = rss();
  size_t f1 = device_free();
  gk_check(st == VMM_OK && f1 >= f0 + PARTS * part - 8 * MiB, t, "cycle %d: pause(BACKUP) frees %zu MiB (%zu -> %zu MiB free): %s",
           cycle, PARTS * part / MiB, f0 / MiB, f1 / MiB, st == VMM_OK ? "ok" : vmm_arena_last_error(a));
  overwrite_freed(a, PARTS * part, s);
  double t2 = now_ms();
  st = vmm_arena_resume(a, "weights");
  double t3 = now_ms();
  long long bad = -1;
  size_t k = 0;
  for (; k < PARTS && bad == -1; k++) bad = gk_first_mismatch(d(p[k]), part / 4, 0x5eed + (uint32_t)k, 0);
  gk_check(st == VMM_OK && bad == -1, t, "cycle %d: resume restores %d x %zu MiB bit-identically (first mismatch %lld in part %zu): %s",
           cycle, PARTS, part / MiB, bad, k - 1, st == VMM_OK ? "ok" : vmm_arena_last_error(a));
  ms[0] = t1 - t0, ms[1] = t3 - t2;
}

static void backup_cycles_are_bit_identical(vmm_arena *a, CUstream s) {
  const char *t = "backup_cycles_are_bit_identical";
  const size_t part = 256 * MiB, total = PARTS * part;
  void *p[PARTS] = {0};
  for (int k = 0; k < PARTS; k++) {
    if (!(p[k] = tagged(a, "weights", part, s))) {
      gk_check(0, t, "allocating %d x %zu MiB", PARTS, part / MiB);
      return;
    }
    gk_fill(d(p[k]), part / 4, 0x5eed + (uint32_t)k, s);
  }
  gk.stream_synchronize(s);
  long long before = rss();
  for (int c = 1; c <= CYCLES; c++) {
    double ms[2];
    long long paused = 0;
    backup_cycle(a, p, part, s, c, ms, &paused);
    long long after = rss();
    gk_check(paused - before >= (long long)(total - 64 * MiB), t,
             "cycle %d: while paused the backups are resident (RSS %+lld MiB for %zu MiB)", c, (paused - before) / (long long)MiB,
             total / MiB);
    gk_check(before >= 0 && after - before <= (long long)(64 * MiB), t,
             "cycle %d: after the resume RSS is back within 64 MiB (%lld -> %lld MiB)", c, before / (long long)MiB,
             after / (long long)MiB);
    printf("bench: BACKUP %d x %zu MiB, cycle %d: pause %.1f ms (%.1f GB/s), resume %.1f ms (%.1f GB/s)\n", PARTS,
           part / MiB, c, ms[0], total / ms[0] / 1e6, ms[1], total / ms[1] / 1e6);
  }
  for (int k = 0; k < PARTS; k++) vmm_arena_free(a, p[k], s);
}

static void capture_is_refused(vmm_arena *a, CUstream s) {
  const char *t = "capture_is_refused";
  void *p = tagged(a, "captured", 64 * MiB, s);
  if (!p) {
    gk_check(0, t, "allocating");
    return;
  }
  gk_fill(d(p), 16 * MiB, 3, s);
  gk.stream_synchronize(s);
  CUgraph g;
  gk.stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_RELAXED);
  vmm_status st = vmm_arena_pause(a, "captured", VMM_PAUSE_DISCARD);
  CUresult r = gk.stream_end_capture(s, &g);
  gk_check(st == VMM_ERR_SCOPE_STATE && strstr(vmm_arena_last_error(a), "capturing"), t, "%s: %s", vmm_status_name(st),
           vmm_arena_last_error(a));
  gk_check(r == CUDA_SUCCESS, t, "the capture was not disturbed: %s", gk_error(r));
  if (r == CUDA_SUCCESS) gk.graph_destroy(g);
  gk_check(gk_first_mismatch(d(p), 16 * MiB, 3, 0) == -1, t, "the memory is untouched");
  vmm_arena_free(a, p, s);
}

static void busy_stream_is_waited_for(vmm_arena *a, CUstream s) {
  const char *t = "busy_stream_is_waited_for";
  const size_t bytes = 512 * MiB;
  void *p = tagged(a, "busy", bytes, s);
  if (!p) {
    gk_check(0, t, "allocating");
    return;
  }
  gk_spin(300, s);
  gk_fill(d(p), bytes / 4, 44, s);
  int busy = gk.stream_query(s) == CUDA_ERROR_NOT_READY;
  double t0 = now_ms();
  vmm_status st = vmm_arena_pause(a, "busy", VMM_PAUSE_BACKUP);
  double waited = now_ms() - t0;
  gk_check(busy, t, "precondition: the writing stream was busy at the pause");
  gk_check(st == VMM_OK, t, "pause: %s", st == VMM_OK ? "ok" : vmm_arena_last_error(a));
  st = vmm_arena_resume(a, "busy");
  long long bad = gk_first_mismatch(d(p), bytes / 4, 44, 0);
  gk_check(st == VMM_OK && bad == -1, t, "the backup holds what the busy stream wrote (first mismatch %lld; pause took %.0f ms)",
           bad, waited);
  vmm_arena_free(a, p, s);
}

/* Pause and resume time per GiB against plain copies, 4 GiB. */
static void timing(CUstream s) {
  const size_t bytes = 4 * GiB;
  vmm_arena *a = arena();
  if (!a) return;
  void *p = tagged(a, "timed", bytes, s);
  char *pageable = malloc(bytes);
  void *pinned = NULL;
  if (!p || !pageable || gk.mem_alloc_host(&pinned, bytes) != CUDA_SUCCESS) {
    gk_check(0, "timing", "allocating 4 GiB on the device and the host");
    free(pageable);
    if (p) vmm_arena_free(a, p, s);
    vmm_arena_destroy(a);
    return;
  }
  memset(pageable, 1, bytes); /* touched: the first copy measures no page faults */
  gk_fill(d(p), bytes / 4, 8, s);
  gk.stream_synchronize(s);
  double t0 = now_ms();
  gk.memcpy_dtoh(pageable, d(p), bytes);
  double t1 = now_ms();
  gk.memcpy_dtoh(pinned, d(p), bytes);
  double t2 = now_ms();
  gk.memcpy_htod(d(p), pinned, bytes);
  double t3 = now_ms();
  printf("bench: copy 4 GiB: to pageable %.2f GiB/s, to pinned %.2f GiB/s, from pinned %.2f GiB/s\n", 4e3 / (t1 - t0),
         4e3 / (t2 - t1), 4e3 / (t3 - t2));
  free(pageable);
  gk.mem_free_host(pinned);
  static const struct {
    const char *name;
    vmm_pause_mode mode;
    int scope;
  } runs[] = {{"DISCARD", VMM_PAUSE_DISCARD, 0}, {"DISCARD in a scope", VMM_PAUSE_DISCARD, 1}, {"BACKUP", VMM_PAUSE_BACKUP, 0}};
  for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
    gk_fill(d(p), bytes / 4, 8, s); /* a discarding pause dropped the last fill */
    gk.stream_synchronize(s);
    if (runs[i].scope) vmm_retention_begin(a);
    double a0 = now_ms();
    vmm_status s1 = vmm_arena_pause(a, "timed", runs[i].mode);
    double a1 = now_ms();
    vmm_status s2 = vmm_arena_resume(a, "timed");
    double a2 = now_ms();
    if (runs[i].scope) vmm_retention_finish(a);
    gk_check(s1 == VMM_OK && s2 == VMM_OK, "timing", "%s: %s", runs[i].name, vmm_arena_last_error(a));
    printf("bench: %s 4 GiB: pause %.2f ms/GiB, resume %.2f ms/GiB\n", runs[i].name, (a1 - a0) / 4, (a2 - a1) / 4);
  }
  gk_check(gk_first_mismatch(d(p), bytes / 4, 8, 0) == -1, "timing", "4 GiB intact after the BACKUP round trip");
  vmm_arena_free(a, p, s);
  vmm_arena_destroy(a);
}

int main(void) {
  char why[256];
  if (gk_init(why, sizeof why)) {
    gk_check(0, "setup", "%s", why);
    return gk_summary("pause-gpu");
  }
  CUstream s;
  gk.stream_create(&s, CU_STREAM_NON_BLOCKING);
  vmm_arena *a = arena();
  if (!a) {
    gk_check(0, "setup", "%s", vmm_create_error());
    return gk_summary("pause-gpu");
  }
  backup_cycles_are_bit_identical(a, s);
  graph_survives_discard(a, s);
  capture_is_refused(a, s);
  busy_stream_is_waited_for(a, s);
  vmm_arena_destroy(a);
  timing(s);
  gk.stream_destroy(s);
  return gk_summary("pause-gpu");
}
