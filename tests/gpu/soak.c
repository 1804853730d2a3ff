/* GPU soak: host threads, each with its own stream, allocate both kinds at random sizes
 * (2 MiB .. 256 MiB) from one arena on the real driver, inside retention scopes that a
 * controller finishes or, now and then, aborts. Each allocation is filled with a 32-bit value
 * derived from its address (cuMemsetD32Async) and its first, middle and last 4 KiB are read
 * back and compared before the free. Half of the allocations are then overwritten with a
 * poison value and freed at once, without waiting: a transient that goes back to the pool
 * and is handed to another thread's stream must be ordered after that poison, or its check
 * finds the poison.
 *
 * The run ends after the duration or once the bytes allocated reach the total cap. It
 * passes with zero mismatches, no driver error (the arena's fatal error stays VMM_OK and
 * every call of the program succeeds; out of memory under the budget is counted, not an
 * error), and device free memory back to its starting figure within 2 MiB after destroy.
 *
 *   soak [SECONDS] [--threads N] [--budget BYTES] [--total BYTES] [--device D]
 *     SECONDS   default 120
 *     --threads default 4
 *     --budget  the arena's limit (VMMARENA_LIMIT): physical memory it may hold, default 48G
 *     --total   stop once this many bytes were allocated, default 1P (an H200 allocates and
 *               fills about 2 TiB/s here, so the duration is what ends a default run)
 * VMMARENA_* variables apply (say VMMARENA_REUSE=best-fit), except VMMARENA_LIMIT, which
 * --budget sets; retention is on unless VMMARENA_RETAIN says otherwise.
 *
 * Build: cmake --build BUILD --target soak (tests/gpu/CMakeLists.txt), then BUILD/tests/gpu/soak. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define MAX_THREADS 64
#define LIVE_PER_THREAD 6
#define PROBE 4096 /* bytes read back at each of three places */
#define POISON 0xDEADBEEFu

static vmm_arena *arena;
static CUcontext context;
/* One stream per worker, created before the workers and destroyed after the arena: the
 * arena uses a freeing stream again later (to order a reuse on another stream after it, and
 * when finish waits for the work that may still touch pooled memory), so a stream must live
 * until its pooled memory is reused or finished, or a quiesce has come after its frees. */
static CUstream streams[MAX_THREADS];
static double seconds = 120;
static int thread_count = 4;
static size_t budget = 48 * GiB, total_cap = (size_t)1 << 50;
static int device;
static struct timespec started;

static atomic_int stopping;
static atomic_ullong bytes_allocated, operations, mismatches, driver_errors, oom_refusals, other_errors;

static double elapsed(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - started.tv_sec) + (double)(now.tv_nsec - started.tv_nsec) / 1e9;
}

static int running(void) {
  return !atomic_load(&stopping) && elapsed() < seconds && atomic_load(&bytes_allocated) < total_cap;
}

/* A failed call of the program's own: counted, first few printed. */
static int cu_ok(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 1;
  const char *name = NULL;
  cuGetErrorName(r, &name);
  if (atomic_fetch_add(&driver_errors, 1) < 10) fprintf(stderr, "soak: %s: %s (%d)\n", what, name ? name : "?", (int)r);
  return 0;
}

static uint32_t pattern_of(CUdeviceptr p) { return (uint32_t)(p >> 21) * 2654435761u ^ (uint32_t)(p >> 40) ^ 0x5A5A5A5Au; }

static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

typedef struct allocation {
  CUdeviceptr ptr;
  size_t bytes;
  vmm_kind kind;
} allocation;

/* Reads back three probes of the allocation and counts words that differ from its pattern. */
static void check(CUstream s, const allocation *x, uint32_t *host) {
  size_t words = x->bytes / 4, probe_words = PROBE / 4;
  size_t at[3] = {0, (words / 2) & ~(size_t)1023, words - probe_words};
  for (int i = 0; i < 3; i++)
    if (!cu_ok(cuMemcpyDtoHAsync(host + i * probe_words, x->ptr + at[i] * 4, PROBE, s), "cuMemcpyDtoHAsync")) return;
  if (!cu_ok(cuStreamSynchronize(s), "cuStreamSynchronize")) return;
  uint32_t want = pattern_of(x->ptr);
  unsigned long long bad = 0;
  for (size_t w = 0; w < 3 * probe_words; w++) bad += host[w] != want;
  if (bad && atomic_fetch_add(&mismatches, bad) < 10)
    fprintf(stderr, "soak: %llu words of %s 0x%llx (%zu bytes) differ from 0x%08x\n", bad,
            x->kind == VMM_KIND_PACKAGE ? "package" : "transient", (unsigned long long)x->ptr, x->bytes, want);
}

static void release(CUstream s, allocation *x, int poison) {
  if (poison) cu_ok(cuMemsetD32Async(x->ptr, POISON, x->bytes / 4, s), "cuMemsetD32Async (poison)");
  vmm_status st = vmm_arena_free(arena, (void *)(uintptr_t)x->ptr, s);
  atomic_fetch_add(&operations, 1);
  if (st != VMM_OK) {
    atomic_fetch_add(&other_errors, 1);
    fprintf(stderr, "soak: free 0x%llx: %s: %s\n", (unsigned long long)x->ptr, vmm_status_name(st), vmm_arena_last_error(arena));
  }
}

static atomic_ullong pauses, resume_refusals;

/* Pauses this thread's tag and resumes it; every live allocation is checked afterwards by the
 * caller. Returns the number of live allocations still usable (a resume that keeps failing
 * for want of memory frees what stayed paused). */
static int pause_and_resume(CUstream s, const char *tag, allocation *live, int n, int backup) {
  vmm_status st = vmm_arena_pause(arena, tag, backup ? VMM_PAUSE_BACKUP : VMM_PAUSE_DISCARD);
  if (st != VMM_OK) {
    atomic_fetch_add(&other_errors, 1);
    fprintf(stderr, "soak: pause %s: %s: %s\n", tag, vmm_status_name(st), vmm_arena_last_error(arena));
    return n;
  }
  atomic_fetch_add(&pauses, 1);
  for (int tries = 0; (st = vmm_arena_resume(arena, tag)) == VMM_ERR_OUT_OF_MEMORY && tries < 50; tries++) {
    atomic_fetch_add(&resume_refusals, 1);
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  if (st == VMM_ERR_OUT_OF_MEMORY) { /* the others hold the budget: free what stayed paused */
    for (int i = 0; i < n; i++) vmm_arena_free(arena, (void *)(uintptr_t)live[i].ptr, s);
    return 0;
  }
  if (st != VMM_OK) {
    atomic_fetch_add(&other_errors, 1);
    fprintf(stderr, "soak: resume %s: %s: %s\n", tag, vmm_status_name(st), vmm_arena_last_error(arena));
    return n;
  }
  if (!backup)
    for (int i = 0; i < n; i++)
      cu_ok(cuMemsetD32Async(live[i].ptr, pattern_of(live[i].ptr), live[i].bytes / 4, s), "cuMemsetD32Async (refill)");
  return n;
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  char tag[32];
  snprintf(tag, sizeof tag, "soak-thread-%d", id);
  vmm_tag_push(tag);
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
  CUstream s = streams[id];
  uint32_t *host = malloc(3 * PROBE);
  allocation live[LIVE_PER_THREAD];
  int n = 0;
  if (!host || !cu_ok(cuCtxSetCurrent(context), "cuCtxSetCurrent")) {
    atomic_store(&stopping, 1);
    free(host);
    return NULL;
  }
  while (running()) {
    uint64_t r = next_random(&rng);
    if (n < LIVE_PER_THREAD && (n == 0 || r % 2)) {
      allocation x;
      x.bytes = 2 * MiB + (size_t)((r >> 8) % (254 * MiB)) - (size_t)((r >> 40) % 4096);
      x.kind = (r >> 50) & 3 ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE; /* one in four is a package */
      void *p = NULL;
      vmm_status st = vmm_arena_alloc(arena, x.bytes, x.kind, s, &p);
      atomic_fetch_add(&operations, 1);
      if (st == VMM_ERR_OUT_OF_MEMORY) { /* over the budget: recoverable; make room */
        atomic_fetch_add(&oom_refusals, 1);
        if (n) release(s, &live[--n], 0);
        continue;
      }
      if (st != VMM_OK) {
        atomic_fetch_add(&other_errors, 1);
        fprintf(stderr, "soak: alloc %zu: %s: %s\n", x.bytes, vmm_status_name(st), vmm_arena_last_error(arena));
        break;
      }
      x.ptr = (CUdeviceptr)(uintptr_t)p;
      atomic_fetch_add(&bytes_allocated, x.bytes);
      cu_ok(cuMemsetD32Async(x.ptr, pattern_of(x.ptr), x.bytes / 4, s), "cuMemsetD32Async");
      live[n++] = x;
    } else if ((r >> 30) % 16 == 0) {
      n = pause_and_resume(s, tag, live, n, (r >> 34) & 1);
      for (int i = 0; i < n; i++) check(s, &live[i], host);
    } else {
      int i = (int)((r >> 8) % (uint64_t)n);
      check(s, &live[i], host);
      release(s, &live[i], (r >> 20) & 1);
      live[i] = live[--n];
    }
  }
  while (n) {
    check(s, &live[n - 1], host);
    release(s, &live[--n], 0);
  }
  cu_ok(cuStreamSynchronize(s), "cuStreamSynchronize");
  free(host);
  return NULL;
}

static size_t parse_bytes(const char *flag, const char *text) {
  size_t v = 0;
  if (!text || vmm_parse_size(text, &v) != VMM_OK) {
    fprintf(stderr, "soak: %s needs a size (8G, 512M, ...): %s\n", flag, vmm_config_error());
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--threads") && next) thread_count = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--budget")) budget = parse_bytes("--budget", next), i++;
    else if (!strcmp(argv[i], "--total")) total_cap = parse_bytes("--total", next), i++;
    else if (!strcmp(argv[i], "--device") && next) device = atoi(argv[++i]);
    else if (argv[i][0] != '-' && atof(argv[i]) > 0) seconds = atof(argv[i]);
    else {
      fprintf(stderr, "usage: soak [SECONDS] [--threads N] [--budget BYTES] [--total BYTES] [--device D]\n");
      return 2;
    }
  }
  if (thread_count < 1 || thread_count > MAX_THREADS) {
    fprintf(stderr, "soak: --threads %d is not in 1..%d\n", thread_count, MAX_THREADS);
    return 2;
  }
  CUdevice dev;
  if (!cu_ok(cuInit(0), "cuInit") || !cu_ok(cuDeviceGet(&dev, device), "cuDeviceGet") ||
      !cu_ok(cuDevicePrimaryCtxRetain(&context, dev), "cuDevicePrimaryCtxRetain") ||
      !cu_ok(cuCtxSetCurrent(context), "cuCtxSetCurrent")) {
    printf("SOAK FAIL (no device)\n");
    return 1;
  }
  /* The driver loads its memset and copy kernels on first use and keeps memory for every
   * stream it has created, even after cuStreamDestroy (about 0.5 MiB each on an H200, driver
   * 580), for the context's life: create the workers' streams and use each once before
   * reading the starting figure. */
  CUdeviceptr scratch;
  uint32_t word = 0;
  if (!cu_ok(cuMemAlloc(&scratch, 2 * MiB), "cuMemAlloc")) return 1;
  for (int i = 0; i < thread_count; i++)
    if (!cu_ok(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
        !cu_ok(cuMemsetD32Async(scratch, 1, 2 * MiB / 4, streams[i]), "cuMemsetD32Async") ||
        !cu_ok(cuMemcpyDtoHAsync(&word, scratch, 4, streams[i]), "cuMemcpyDtoHAsync") ||
        !cu_ok(cuStreamSynchronize(streams[i]), "cuStreamSynchronize")) {
      printf("SOAK FAIL (warm-up)\n");
      return 1;
    }
  cu_ok(cuMemFree(scratch), "cuMemFree");
  size_t free_before = 0, free_after = 0, total_mem = 0;
  cu_ok(cuMemGetInfo(&free_before, &total_mem), "cuMemGetInfo");

  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.device = device;
  cfg.retain = VMM_RETAIN_ON;
  cfg.log_level = 0; /* refusals under the budget are expected; VMMARENA_LOG=error shows them */
  if (vmm_config_from_env(&cfg) != VMM_OK) {
    fprintf(stderr, "soak: %s\n", vmm_config_error());
    return 2;
  }
  cfg.limit_bytes = budget;
  vmm_status st = vmm_arena_create(&cfg, &arena);
  if (st != VMM_OK) {
    fprintf(stderr, "soak: vmm_arena_create: %s: %s\n", vmm_status_name(st), vmm_create_error());
    printf("SOAK FAIL (no arena)\n");
    return 1;
  }
  clock_gettime(CLOCK_MONOTONIC, &started);
  pthread_t threads[MAX_THREADS];
  for (int i = 0; i < thread_count; i++) pthread_create(&threads[i], NULL, worker, (void *)(intptr_t)i);

  /* Scopes of about 2 s each, finished. One in five is chosen at its begin to be aborted,
   * while abandoned memory is under a quarter of the budget, and lasts 2 ms: an aborted
   * scope's memory (its pooled and retained memory too) is held until destroy, and the
   * workers fill the budget in well under a second. */
  unsigned long long scopes_finished = 0, scopes_aborted = 0, scope_errors = 0;
  uint64_t rng = 777;
  while (running()) {
    vmm_snapshot s;
    vmm_arena_snapshot(arena, &s);
    uint64_t abandoned = s.kind[0].abandoned_bytes + s.kind[1].abandoned_bytes;
    int to_abort = next_random(&rng) % 5 == 0 && abandoned < budget / 4;
    if (vmm_retention_begin(arena) != VMM_OK) scope_errors++;
    for (int t = 0; t < (to_abort ? 1 : 40) && running(); t++) {
      struct timespec pause = {0, to_abort ? 2000000 : 50000000};
      nanosleep(&pause, NULL);
    }
    if (to_abort) {
      st = vmm_retention_abort(arena);
      scopes_aborted++;
    } else {
      st = vmm_retention_finish(arena);
      scopes_finished++;
    }
    if (st != VMM_OK) {
      scope_errors++;
      fprintf(stderr, "soak: finish/abort: %s: %s\n", vmm_status_name(st), vmm_arena_last_error(arena));
    }
  }
  atomic_store(&stopping, 1);
  for (int i = 0; i < thread_count; i++) pthread_join(threads[i], NULL);
  double duration = elapsed();

  vmm_snapshot s;
  vmm_arena_snapshot(arena, &s);
  const char *msg = "";
  vmm_status fatal = vmm_arena_fatal_error(arena, &msg);
  char fatal_msg[800];
  snprintf(fatal_msg, sizeof fatal_msg, "%s", msg); /* the arena's text goes with destroy */
  vmm_arena_destroy(arena);
  for (int i = 0; i < thread_count; i++) cu_ok(cuStreamDestroy(streams[i]), "cuStreamDestroy");
  cu_ok(cuCtxSynchronize(), "cuCtxSynchronize");
  cu_ok(cuMemGetInfo(&free_after, &total_mem), "cuMemGetInfo");
  long long free_delta = (long long)free_before - (long long)free_after;

  printf("soak: device %d, %d threads, budget %.1f GiB, %.1f s\n", device, thread_count, (double)budget / GiB, duration);
  printf("soak: operations %llu, bytes allocated %.1f GiB, out-of-memory refusals %llu\n",
         (unsigned long long)atomic_load(&operations), (double)atomic_load(&bytes_allocated) / GiB,
         (unsigned long long)atomic_load(&oom_refusals));
  printf("soak: scopes finished %llu, aborted %llu; pool hits %llu, misses %llu, assemblies %llu (%llu pooled mappings "
         "taken apart); pauses %llu (resume refused %llu times); peak physical %.1f GiB, %.1f GiB held at destroy "
         "(%.1f GiB abandoned)\n",
         scopes_finished, scopes_aborted, (unsigned long long)s.pool_hits, (unsigned long long)s.pool_misses,
         (unsigned long long)s.assemblies, (unsigned long long)s.pooled_taken_apart,
         (unsigned long long)atomic_load(&pauses), (unsigned long long)atomic_load(&resume_refusals),
         (double)s.physical_peak_bytes / GiB, (double)s.physical_bytes / GiB,
         (double)(s.kind[0].abandoned_bytes + s.kind[1].abandoned_bytes) / GiB);
  printf("soak: mismatches %llu, driver errors %llu, other errors %llu, fatal %s%s%s\n",
         (unsigned long long)atomic_load(&mismatches), (unsigned long long)atomic_load(&driver_errors),
         (unsigned long long)(atomic_load(&other_errors) + scope_errors), vmm_status_name(fatal), fatal ? ": " : "",
         fatal ? fatal_msg : "");
  printf("soak: device free memory %.1f MiB before, %.1f MiB after destroy (difference %lld bytes)\n",
         (double)free_before / MiB, (double)free_after / MiB, free_delta);
  int pass = atomic_load(&mismatches) == 0 && atomic_load(&driver_errors) == 0 && atomic_load(&other_errors) == 0 &&
             scope_errors == 0 && fatal == VMM_OK && free_delta <= (long long)(2 * MiB) && s.allocs > 0 &&
             s.assemblies > 0 && atomic_load(&pauses) > 0; /* the new paths ran */
  printf("%s\n", pass ? "SOAK PASS" : "SOAK FAIL");
  cuDevicePrimaryCtxRelease(dev);
  return pass ? 0 : 1;
}
