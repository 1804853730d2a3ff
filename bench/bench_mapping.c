/* What the driver charges for a mapping, on device 0, with the raw driver calls (no arena):
 *
 *   per handle   64 MiB mapped as 1 handle, as 4 and as 32 handles back to back
 *   per piece    one 64 MiB handle mapped as 4 and as 32 pieces (cuMemMap at an offset into it)
 *   beside       launches of small async memsets, and map cycles, on one thread while another
 *                maps and unmaps
 *   behind       each mapping call made while a stream has milliseconds of work queued: whether
 *                the call returns at once or waits for the queue to drain
 *   spread       64 ranges of 4 handles mapped (map + access) and given back (unmap + release)
 *                by 1, 2, 4 and 8 threads: whether the driver does mapping work in parallel
 *
 * Each row is the median over the repetitions of each phase: the cuMemMap calls, the one
 * cuMemSetAccess, the one cuMemUnmap. Whether the driver maps part of a handle is probed
 * first (driver 580 refuses an offset: CUDA_ERROR_NOT_SUPPORTED), and the piece layouts run
 * only where it does; bytes written through the whole handle's mapping must then read back
 * through the pieces mapped in reverse order, or the benchmark stops with exit 1. The last
 * part says whether mapping work on one thread slows the launches or the mapping work of
 * another (the question behind unmapping off the allocation path).
 * Needs an NVIDIA GPU with about 400 MiB free. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cli.h"
#include "bench_stats.h"

#define MIB ((size_t)1 << 20)
#define TOTAL (64 * MIB)
#define MAX_PARTS 32
#define REPS 40
#define LAUNCHES 4000


static void check_cu(CUresult r, const char *what, int line) {
  if (r == CUDA_SUCCESS) return;
  const char *name = NULL;
  cuGetErrorName(r, &name);
  fprintf(stderr, "bench_mapping: line %d: %s failed: %s (%d)\n", line, what, name ? name : "?", (int)r);
  exit(1);
}

static void check_rt(cudaError_t e, const char *what, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "bench_mapping: line %d: %s failed: %s\n", line, what, cudaGetErrorName(e));
  exit(1);
}

#define CU(call) check_cu((call), #call, __LINE__)
#define RT(call) check_rt((call), #call, __LINE__)

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;

/* One way to fill TOTAL bytes of address space: `parts` mappings, each of its own handle
 * (pieces == false) or each a piece of handles[0] at its offset (pieces == true). */
typedef struct layout {
  const char *name;
  int parts;
  bool pieces;
  CUmemGenericAllocationHandle handles[MAX_PARTS];
} layout;

static void layout_create(layout *l) {
  size_t part = TOTAL / (size_t)l->parts;
  for (int i = 0; i < (l->pieces ? 1 : l->parts); i++) CU(cuMemCreate(&l->handles[i], l->pieces ? TOTAL : part, &prop, 0));
}

static void layout_release(layout *l) {
  for (int i = 0; i < (l->pieces ? 1 : l->parts); i++) CU(cuMemRelease(l->handles[i]));
}

/* Part i of l mapped at va: its own handle, or the piece of handles[0] at i * part. */
static CUresult map_part(const layout *l, CUdeviceptr va, int i) {
  size_t part = TOTAL / (size_t)l->parts;
  return cuMemMap(va, part, l->pieces ? (size_t)i * part : 0, l->pieces ? l->handles[0] : l->handles[i], 0);
}

typedef struct phases {
  double map, access, unmap;
} phases;

/* One map + access + unmap cycle of l at va, each phase timed into t. */
static void cycle(const layout *l, CUdeviceptr va, phases *t) {
  size_t part = TOTAL / (size_t)l->parts;
  double t0 = bench_now_us();
  for (int i = 0; i < l->parts; i++) CU(map_part(l, va + (size_t)i * part, i));
  double t1 = bench_now_us();
  CU(cuMemSetAccess(va, TOTAL, &access_desc, 1));
  double t2 = bench_now_us();
  CU(cuMemUnmap(va, TOTAL));
  double t3 = bench_now_us();
  if (t) t->map = t1 - t0, t->access = t2 - t1, t->unmap = t3 - t2;
}

static const char *result_name(CUresult r) {
  const char *name = NULL;
  cuGetErrorName(r, &name);
  return name ? name : "?";
}

/* Whether the driver maps part of a handle: its first 2 MiB (offset 0), and 2 MiB at an
 * offset. Where it does, 32 pieces of one handle mapped in reverse order must read back what
 * was written through the handle mapped whole. Returns whether pieces at an offset work. */
static bool probe_pieces(CUdeviceptr whole, CUdeviceptr reversed) {
  layout l = {"probe", MAX_PARTS, true, {0}};
  layout_create(&l);
  size_t part = TOTAL / MAX_PARTS;
  CUresult prefix = cuMemMap(reversed, part, 0, l.handles[0], 0);
  if (prefix == CUDA_SUCCESS) CU(cuMemUnmap(reversed, part));
  CUresult offset = cuMemMap(reversed, part, part, l.handles[0], 0);
  if (offset == CUDA_SUCCESS) CU(cuMemUnmap(reversed, part));
  printf("pieces: a 2 MiB prefix of a 64 MiB handle (offset 0): %s; 2 MiB at offset 2 MiB: %s\n",
         result_name(prefix), result_name(offset));
  if (offset != CUDA_SUCCESS) {
    printf("pieces: not supported by this driver; the piece layouts are skipped\n\n");
    layout_release(&l);
    return false;
  }
  CU(cuMemMap(whole, TOTAL, 0, l.handles[0], 0));
  CU(cuMemSetAccess(whole, TOTAL, &access_desc, 1));
  for (int i = 0; i < MAX_PARTS; i++) CU(cuMemsetD32(whole + (size_t)i * part, 0x5a000000u + (unsigned)i, part / 4));
  for (int i = 0; i < MAX_PARTS; i++) CU(map_part(&l, reversed + (size_t)(MAX_PARTS - 1 - i) * part, i));
  CU(cuMemSetAccess(reversed, TOTAL, &access_desc, 1));
  int wrong = 0;
  for (int i = 0; i < MAX_PARTS; i++) {
    uint32_t first = 0, last = 0;
    CUdeviceptr at = reversed + (size_t)(MAX_PARTS - 1 - i) * part;
    CU(cuMemcpyDtoH(&first, at, sizeof first));
    CU(cuMemcpyDtoH(&last, at + part - sizeof last, sizeof last));
    wrong += first != 0x5a000000u + (unsigned)i || last != first;
  }
  CU(cuMemUnmap(reversed, TOTAL));
  CU(cuMemUnmap(whole, TOTAL));
  layout_release(&l);
  if (wrong) {
    fprintf(stderr, "bench_mapping: %d of %d pieces read other bytes than their offset names\n", wrong, MAX_PARTS);
    exit(1);
  }
  printf("pieces: 32 pieces of one 64 MiB handle, mapped in reverse order, read back what was written through the "
         "whole mapping (checked)\n\n");
  return true;
}

/* ---- Work beside mapping work on another thread ------------------------------------- */

typedef struct background {
  CUcontext ctx;
  const layout *l;
  CUdeviceptr va;
  atomic_bool stop;
  atomic_long cycles;
} background;

static void *map_loop(void *arg) {
  background *b = arg;
  CU(cuCtxSetCurrent(b->ctx));
  while (!atomic_load(&b->stop)) {
    cycle(b->l, b->va, NULL);
    atomic_fetch_add(&b->cycles, 1);
  }
  return NULL;
}

/* Microseconds per async launch (a 4 KiB memset) over LAUNCHES of them, the host side only. */
typedef struct launches {
  cudaStream_t stream;
  void *buf;
} launches;

static double launch_us(void *arg) {
  launches *l = arg;
  double t0 = bench_now_us();
  for (int i = 0; i < LAUNCHES; i++) RT(cudaMemsetAsync(l->buf, i & 0xff, 4096, l->stream));
  double us = (bench_now_us() - t0) / LAUNCHES;
  RT(cudaStreamSynchronize(l->stream));
  return us;
}

/* The median microseconds of 20 map + access + unmap cycles of a layout. */
typedef struct cycles {
  const layout *l;
  CUdeviceptr va;
} cycles;

static double cycle_us(void *arg) {
  cycles *c = arg;
  double t[20];
  for (int i = 0; i < 20; i++) {
    double t0 = bench_now_us();
    cycle(c->l, c->va, NULL);
    t[i] = bench_now_us() - t0;
  }
  return bench_median(t, 20);
}

/* `probe` measured alone and while another thread maps and unmaps `bg` at `va` without
 * pause, 5 rounds each; prints the medians and their ratio. */
static void beside(const char *what, double (*probe)(void *), void *arg, const layout *bg, CUdeviceptr va) {
  (void)probe(arg); /* warm-up */
  double alone[5], with[5];
  long ran = 0;
  for (int k = 0; k < 5; k++) {
    alone[k] = probe(arg);
    background b = {.l = bg, .va = va};
    CU(cuCtxGetCurrent(&b.ctx));
    atomic_init(&b.stop, false);
    atomic_init(&b.cycles, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, map_loop, &b)) {
      fprintf(stderr, "bench_mapping: pthread_create failed\n");
      exit(1);
    }
    double t0 = bench_now_us();
    while (atomic_load(&b.cycles) < 2 && bench_now_us() - t0 < 1e6) /* the other thread is mapping */
      ;
    with[k] = probe(arg);
    atomic_store(&b.stop, true);
    pthread_join(t, NULL);
    ran += atomic_load(&b.cycles);
  }
  double a = bench_median(alone, 5), w = bench_median(with, 5);
  printf("| %s | %.2f | %.2f | %.2f | %ld |\n", what, a, w, w / a, ran);
}

/* ---- Mapping calls behind queued work ------------------------------------------------ */

#define BEHIND_REPS 10
#define BEHIND_MEMSETS 40

typedef struct queue {
  CUstream stream;
  CUdeviceptr buf;
  size_t bytes;
} queue;

/* Queues BEHIND_MEMSETS memsets of the whole buffer: some milliseconds of device work. */
static void queue_work(const queue *q) {
  for (int i = 0; i < BEHIND_MEMSETS; i++) CU(cuMemsetD8Async(q->buf, (unsigned char)i, q->bytes, q->stream));
}

enum { STEP_CREATE, STEP_MAP, STEP_ACCESS, STEP_UNMAP, STEP_RELEASE, STEPS };
static const char *const step_names[STEPS] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"};

/* One handle's life at va, each step timed into us[]; with q, each step is made right after
 * queueing work on q->stream, and drained[] counts the steps after which that work was done. */
static void handle_life(const queue *q, CUdeviceptr va, size_t bytes, double us[STEPS], int drained[STEPS]) {
  CUmemGenericAllocationHandle h = 0;
  for (int step = 0; step < STEPS; step++) {
    if (q) queue_work(q);
    double t0 = bench_now_us();
    switch (step) {
    case STEP_CREATE: CU(cuMemCreate(&h, bytes, &prop, 0)); break;
    case STEP_MAP: CU(cuMemMap(va, bytes, 0, h, 0)); break;
    case STEP_ACCESS: CU(cuMemSetAccess(va, bytes, &access_desc, 1)); break;
    case STEP_UNMAP: CU(cuMemUnmap(va, bytes)); break;
    case STEP_RELEASE: CU(cuMemRelease(h)); break;
    }
    us[step] = bench_now_us() - t0;
    if (q) {
      CUresult r = cuStreamQuery(q->stream);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) CU(r);
      drained[step] += r == CUDA_SUCCESS;
      CU(cuStreamSynchronize(q->stream));
    }
  }
}

/* Whether each mapping call waits for work queued on a stream that never touches the mapping:
 * the call's median time idle and behind the queue, and how often the queue had drained when it
 * returned. A call that waits stalls the allocation path for the device's whole queue. */
static void behind(CUdeviceptr va) {
  queue q = {.bytes = 1024 * MIB};
  CU(cuStreamCreate(&q.stream, CU_STREAM_NON_BLOCKING));
  CU(cuMemAlloc(&q.buf, q.bytes));
  double queued[BEHIND_REPS];
  for (int r = 0; r < BEHIND_REPS; r++) {
    double t0 = bench_now_us();
    queue_work(&q);
    CU(cuStreamSynchronize(q.stream));
    queued[r] = bench_now_us() - t0;
  }
  double queue_ms = bench_median(queued, BEHIND_REPS) / 1000;
  if (queue_ms < 2.0) { /* a queue that drains within a call's own time could not show a wait */
    fprintf(stderr, "bench_mapping: the queued work took %.2f ms, too little to tell a wait from a call\n", queue_ms);
    exit(1);
  }
  printf("\nbehind: %d memsets of 1 GiB queued on a non-blocking stream take %.1f ms; one handle's calls in us, "
         "median over %d rounds\n\n", BEHIND_MEMSETS, queue_ms, BEHIND_REPS);
  printf("| call | idle, 2 MiB handle | idle, 64 MiB | behind the queue, 64 MiB | queue done on return |\n");
  printf("|---|---:|---:|---:|---:|\n");
  double small[STEPS][BEHIND_REPS], idle[STEPS][BEHIND_REPS], busy[STEPS][BEHIND_REPS];
  int drained[STEPS] = {0};
  for (int r = 0; r < BEHIND_REPS; r++) {
    double a[STEPS], b[STEPS], c[STEPS];
    handle_life(NULL, va, 2 * MIB, c, NULL);
    handle_life(NULL, va, TOTAL, a, NULL);
    handle_life(&q, va, TOTAL, b, drained);
    for (int s = 0; s < STEPS; s++) small[s][r] = c[s], idle[s][r] = a[s], busy[s][r] = b[s];
  }
  for (int s = 0; s < STEPS; s++)
    printf("| %s | %.1f | %.1f | %.1f | %d of %d |\n", step_names[s], bench_median(small[s], BEHIND_REPS),
           bench_median(idle[s], BEHIND_REPS), bench_median(busy[s], BEHIND_REPS), drained[s], BEHIND_REPS);
  CU(cuMemFree(q.buf));
  CU(cuStreamDestroy(q.stream));
}

/* ---- Mapping work spread over threads ------------------------------------------------- */

#define SPREAD_RANGES 64
#define SPREAD_HANDLES 4 /* per range, 2 MiB each */
#define SPREAD_ROUNDS 5

typedef struct spread_work {
  CUcontext ctx;
  CUdeviceptr va;
  CUmemGenericAllocationHandle *handles;
  int first, step; /* the ranges first, first + step, ... */
  bool build;      /* map + access, or unmap + release */
} spread_work;

static void *spread_loop(void *arg) {
  spread_work *w = arg;
  CU(cuCtxSetCurrent(w->ctx));
  size_t range = SPREAD_HANDLES * 2 * MIB;
  for (int r = w->first; r < SPREAD_RANGES; r += w->step) {
    CUdeviceptr base = w->va + (size_t)r * range;
    CUmemGenericAllocationHandle *h = &w->handles[r * SPREAD_HANDLES];
    if (w->build) {
      for (int k = 0; k < SPREAD_HANDLES; k++) CU(cuMemMap(base + (size_t)k * 2 * MIB, 2 * MIB, 0, h[k], 0));
      CU(cuMemSetAccess(base, range, &access_desc, 1));
    } else {
      CU(cuMemUnmap(base, range));
      for (int k = 0; k < SPREAD_HANDLES; k++) CU(cuMemRelease(h[k]));
    }
  }
  return NULL;
}

/* Microseconds for `threads` threads to map (build) or give back every range. */
static double spread_phase(CUdeviceptr va, CUmemGenericAllocationHandle *handles, int threads, bool build) {
  spread_work w[8];
  pthread_t t[8];
  CUcontext ctx;
  CU(cuCtxGetCurrent(&ctx));
  double t0 = bench_now_us();
  for (int i = 0; i < threads; i++) {
    w[i] = (spread_work){ctx, va, handles, i, threads, build};
    if (pthread_create(&t[i], NULL, spread_loop, &w[i])) {
      fprintf(stderr, "bench_mapping: pthread_create failed\n");
      exit(1);
    }
  }
  for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
  return bench_now_us() - t0;
}

/* Whether mapping and giving back ranges scales with threads: the question behind an
 * empty_cache that unmaps and releases on several threads. The last range's bytes are checked
 * after each build, so a build that mapped nothing cannot pass. */
static void spread(void) {
  size_t bytes = (size_t)SPREAD_RANGES * SPREAD_HANDLES * 2 * MIB;
  CUdeviceptr va;
  CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  static CUmemGenericAllocationHandle handles[SPREAD_RANGES * SPREAD_HANDLES];
  const int counts[] = {1, 2, 4, 8};
  printf("\nspread: %d ranges of %d handles of 2 MiB, mapped (map + access) and given back (unmap + release) by "
         "n threads; ms, median of %d rounds\n\n", SPREAD_RANGES, SPREAD_HANDLES, SPREAD_ROUNDS);
  printf("| threads | map + access | unmap + release | speed-up of the give-back |\n|---:|---:|---:|---:|\n");
  double one = 0;
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    double build[SPREAD_ROUNDS], back[SPREAD_ROUNDS];
    for (int r = 0; r < SPREAD_ROUNDS; r++) {
      for (int i = 0; i < SPREAD_RANGES * SPREAD_HANDLES; i++) CU(cuMemCreate(&handles[i], 2 * MIB, &prop, 0));
      build[r] = spread_phase(va, handles, counts[c], true);
      uint32_t word = 0x5eedu + (uint32_t)r, got = 0;
      CU(cuMemsetD32(va + bytes - sizeof word, word, 1));
      CU(cuMemcpyDtoH(&got, va + bytes - sizeof got, sizeof got));
      if (got != word) {
        fprintf(stderr, "bench_mapping: spread: read back 0x%x, wrote 0x%x\n", got, word);
        exit(1);
      }
      back[r] = spread_phase(va, handles, counts[c], false);
    }
    double b = bench_median(back, SPREAD_ROUNDS) / 1000;
    if (c == 0) one = b;
    printf("| %d | %.2f | %.2f | %.2fx |\n", counts[c], bench_median(build, SPREAD_ROUNDS) / 1000, b, one / b);
  }
  CU(cuMemAddressFree(va, bytes));
}

static const char USAGE[] =
    "usage: bench_mapping\n"
    "What the driver charges for a mapping on device 0, with the raw driver calls: per handle, per\n"
    "piece, beside other work, behind queued work and spread over threads. Needs a GPU.\n";

int main(int argc, char **argv) {
  bench_cli_no_arguments(argc, argv, "bench_mapping", USAGE);
  RT(cudaSetDevice(0));
  RT(cudaFree(0)); /* creates the primary context and makes it current */
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  access_desc.location = prop.location;
  access_desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t granularity = 0;
  CU(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (TOTAL / MAX_PARTS % granularity) {
    fprintf(stderr, "bench_mapping: granularity %zu does not divide %zu\n", granularity, TOTAL / MAX_PARTS);
    return 1;
  }
  CUdeviceptr va[3];
  for (int i = 0; i < 3; i++) CU(cuMemAddressReserve(&va[i], TOTAL, granularity, 0, 0));
  int driver = 0;
  cudaDriverGetVersion(&driver);
  struct cudaDeviceProp dp;
  RT(cudaGetDeviceProperties(&dp, 0));
  printf("bench_mapping: %s, driver %d, granularity %zu MiB\n\n", dp.name, driver, granularity / MIB);
  bool pieces = probe_pieces(va[0], va[1]);

  layout layouts[] = {{"1 handle", 1, false, {0}},  {"4 handles", 4, false, {0}},  {"32 handles", 32, false, {0}},
                      {"4 pieces of 1", 4, true, {0}}, {"32 pieces of 1", 32, true, {0}}};
  size_t n = sizeof layouts / sizeof layouts[0];
  printf("mapping 64 MiB: median us per phase over %d cycles\n\n", REPS);
  printf("| layout | cuMemMap (all) | cuMemSetAccess | cuMemUnmap | cycle | us per part | cycle / 1 handle |\n");
  printf("|---|---:|---:|---:|---:|---:|---:|\n");
  double one = 0;
  for (size_t k = 0; k < n; k++) {
    layout *l = &layouts[k];
    if (l->pieces && !pieces) continue;
    layout_create(l);
    cycle(l, va[0], NULL); /* warm-up */
    double map[REPS], acc[REPS], unmap[REPS], total[REPS];
    for (int r = 0; r < REPS; r++) {
      phases t;
      cycle(l, va[0], &t);
      map[r] = t.map, acc[r] = t.access, unmap[r] = t.unmap, total[r] = t.map + t.access + t.unmap;
    }
    double c = bench_median(total, REPS);
    if (k == 0) one = c;
    printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", l->name, bench_median(map, REPS), bench_median(acc, REPS),
           bench_median(unmap, REPS), c, c / l->parts, c / one);
  }
  printf("\nbeside: median us alone and while another thread maps and unmaps %s without pause, 5 rounds\n\n",
         layouts[2].name);
  printf("| work on this thread | alone | beside | beside/alone | cycles of the other thread |\n");
  printf("|---|---:|---:|---:|---:|\n");
  launches l = {0};
  RT(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  RT(cudaMalloc(&l.buf, 4096));
  beside("one async 4 KiB memset launch", launch_us, &l, &layouts[2], va[0]);
  cycles c = {&layouts[1], va[2]};
  beside("one map + access + unmap cycle of 4 handles", cycle_us, &c, &layouts[2], va[0]);
  RT(cudaFree(l.buf));
  RT(cudaStreamDestroy(l.stream));
  behind(va[2]);
  spread();
  for (size_t k = 0; k < n; k++)
    if (!layouts[k].pieces || pieces) layout_release(&layouts[k]);
  for (int i = 0; i < 3; i++) CU(cuMemAddressFree(va[i], TOTAL));
  return 0;
}
