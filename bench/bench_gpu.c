/* GPU benchmark of one allocate + free pair, on device 0, at 2 MiB, 32 MiB, 512 MiB and 4 GiB:
 *
 *   hit         vmmarena inside a retention scope: the free pools the mapping, the allocation
 *               on the same stream takes it back (no driver call)
 *   miss        vmmarena outside a scope: create, map, set access; synchronize, unmap, release
 *   raw VMM     cuMemCreate + cuMemMap + cuMemSetAccess, cuMemUnmap + cuMemRelease, into a
 *               range reserved once
 *   cudaMalloc  cudaMalloc + cudaFree
 *   mallocAsync cudaMallocAsync + cudaFreeAsync on a stream, from the device's default pool
 *               kept warm (release threshold: never trim)
 *
 * Each figure is the median wall time of many pairs (fewer at 4 GiB), after one warm-up pair.
 * Targets: a pool hit at least 5x faster than a warm mallocAsync pair; a miss within 5% of raw
 * VMM. Prints the table and one PASS or MISS line per target and size; exits 1 only if a call
 * fails (a missed target is reported, not an error).
 * Needs an NVIDIA GPU with about 5 GiB free. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cli.h"
#include "bench_stats.h"
#include "vmmarena.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

typedef struct bench_size {
  size_t bytes;
  int reps;
} bench_size;

static const bench_size sizes[] = {{2 * MIB, 2000}, {32 * MIB, 1000}, {512 * MIB, 200}, {4 * GIB, 25}};
#define SIZE_COUNT (sizeof sizes / sizeof sizes[0])
#define MAX_REPS 2000

enum { M_HIT, M_MISS, M_RAW, M_MALLOC, M_ASYNC, METHOD_COUNT };
static const char *const method_names[METHOD_COUNT] = {"hit", "miss", "raw VMM", "cudaMalloc", "mallocAsync"};


static void fail_cu(const char *what, CUresult r, size_t bytes) {
  const char *name = NULL;
  cuGetErrorName(r, &name);
  fprintf(stderr, "bench_gpu: %s (%zu bytes) failed: %s (%d)\n", what, bytes, name ? name : "?", (int)r);
  exit(1);
}

static void fail_rt(const char *what, cudaError_t e, size_t bytes) {
  fprintf(stderr, "bench_gpu: %s (%zu bytes) failed: %s (%d)\n", what, bytes, cudaGetErrorName(e), (int)e);
  exit(1);
}

static void fail_vmm(const char *what, vmm_status s, vmm_arena *a, size_t bytes) {
  fprintf(stderr, "bench_gpu: %s (%zu bytes) failed: %s: %s\n", what, bytes, vmm_status_name(s),
          a ? vmm_arena_last_error(a) : vmm_create_error());
  exit(1);
}

#define CU(call, bytes)                                  \
  do {                                                   \
    CUresult r_ = (call);                                \
    if (r_ != CUDA_SUCCESS) fail_cu(#call, r_, (bytes)); \
  } while (0)
#define RT(call, bytes)                                  \
  do {                                                   \
    cudaError_t e_ = (call);                             \
    if (e_ != cudaSuccess) fail_rt(#call, e_, (bytes));  \
  } while (0)
#define VMM(call, arena, bytes)                                 \
  do {                                                          \
    vmm_status s_ = (call);                                     \
    if (s_ != VMM_OK) fail_vmm(#call, s_, (arena), (bytes));    \
  } while (0)

typedef struct ctx {
  vmm_arena *arena;
  cudaStream_t stream;
  CUdeviceptr va; /* reserved once for the raw VMM pairs */
  size_t va_size;
  CUmemAllocationProp prop;
  CUmemAccessDesc access;
} ctx;

static void pair_vmm(ctx *c, size_t bytes) {
  void *p = NULL;
  VMM(vmm_arena_alloc(c->arena, bytes, VMM_KIND_TRANSIENT, (CUstream)c->stream, &p), c->arena, bytes);
  VMM(vmm_arena_free(c->arena, p, (CUstream)c->stream), c->arena, bytes);
}

static void pair_raw(ctx *c, size_t bytes) {
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, bytes, &c->prop, 0), bytes);
  CU(cuMemMap(c->va, bytes, 0, h, 0), bytes);
  CU(cuMemSetAccess(c->va, bytes, &c->access, 1), bytes);
  CU(cuMemUnmap(c->va, bytes), bytes);
  CU(cuMemRelease(h), bytes);
}

static void pair_malloc(ctx *c, size_t bytes) {
  (void)c;
  void *p = NULL;
  RT(cudaMalloc(&p, bytes), bytes);
  RT(cudaFree(p), bytes);
}

static void pair_async(ctx *c, size_t bytes) {
  void *p = NULL;
  RT(cudaMallocAsync(&p, bytes, c->stream), bytes);
  RT(cudaFreeAsync(p, c->stream), bytes);
}

/* Median microseconds of `reps` pairs, after one warm-up pair. */
static double measure(void (*pair)(ctx *, size_t), ctx *c, size_t bytes, int reps) {
  static double samples[MAX_REPS];
  pair(c, bytes);
  for (int i = 0; i < reps; i++) {
    double t0 = bench_now_us();
    pair(c, bytes);
    samples[i] = bench_now_us() - t0;
  }
  RT(cudaStreamSynchronize(c->stream), bytes);
  return bench_median(samples, reps);
}

static const char *size_name(size_t bytes, char buf[16]) {
  if (bytes >= GIB) snprintf(buf, 16, "%zu GiB", bytes / GIB);
  else snprintf(buf, 16, "%zu MiB", bytes / MIB);
  return buf;
}

/* Assembly cost against the handle count: inside a scope, N idle handles of one granule each
 * (package memory freed into the idle store) are mapped back to back into one package
 * allocation and freed again (unmapped, handles idle): N cuMemMap + 1 cuMemSetAccess, then a
 * synchronize + 1 cuMemUnmap. Compared with a miss pair of the same size outside a scope. */
static void assembly_costs(size_t granularity, cudaStream_t stream) {
  static const int counts[] = {1, 4, 16, 64, 256};
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.retain = VMM_RETAIN_ON;
  cfg.handle_bound_bytes = granularity;
  vmm_arena *a;
  VMM(vmm_arena_create(&cfg, &a), NULL, 0);
  printf("\nassembly: median us per package alloc+free pair assembled from N idle handles of %zu MiB\n\n",
         granularity / MIB);
  printf("| handles | bytes   | assembled pair | us per handle | miss pair (1 handle) | assembled/miss |\n");
  printf("|--------:|---------|---------------:|--------------:|---------------------:|---------------:|\n");
  CUstream s = (CUstream)stream;
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    int n = counts[k];
    size_t bytes = (size_t)n * granularity;
    static double samples[MAX_REPS];
    const int reps = 50;
    void *p = NULL;
    for (int i = 0; i < reps; i++) { /* outside a scope: create, map, grant; unmap, release */
      double t0 = bench_now_us();
      VMM(vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, s, &p), a, bytes);
      VMM(vmm_arena_free(a, p, s), a, bytes);
      samples[i] = bench_now_us() - t0;
    }
    double miss = bench_median(samples, reps);
    VMM(vmm_retention_begin(a), a, bytes);
    void *handles[256];
    for (int i = 0; i < n; i++) VMM(vmm_arena_alloc(a, granularity, VMM_KIND_PACKAGE, s, &handles[i]), a, bytes);
    for (int i = 0; i < n; i++) VMM(vmm_arena_free(a, handles[i], s), a, bytes);
    vmm_snapshot before, after;
    VMM(vmm_arena_snapshot(a, &before), a, bytes);
    for (int i = 0; i < reps; i++) {
      double t0 = bench_now_us();
      VMM(vmm_arena_alloc(a, bytes, VMM_KIND_PACKAGE, s, &p), a, bytes);
      VMM(vmm_arena_free(a, p, s), a, bytes);
      samples[i] = bench_now_us() - t0;
    }
    VMM(vmm_arena_snapshot(a, &after), a, bytes);
    double assembled = bench_median(samples, reps);
    if (after.driver[VMM_DRV_mem_create].calls != before.driver[VMM_DRV_mem_create].calls ||
        after.assemblies - before.assemblies != (uint64_t)reps) {
      fprintf(stderr, "bench_gpu: assembly of %d handles created memory or did not assemble\n", n);
      exit(1);
    }
    VMM(vmm_retention_finish(a), a, bytes);
    char name[16];
    printf("| %7d | %-7s | %14.2f | %13.2f | %20.2f | %14.2f |\n", n, size_name(bytes, name), assembled, assembled / n,
           miss, assembled / miss);
  }
  vmm_arena_destroy(a);
}

static const char USAGE[] =
    "usage: bench_gpu\n"
    "One allocate + free pair on device 0 (2 MiB to 4 GiB): a vmmarena pool hit and miss, raw VMM,\n"
    "cudaMalloc and cudaMallocAsync; median wall times, a PASS or MISS line per target and size.\n"
    "Needs a GPU; exits 1 only if a call fails.\n";

int main(int argc, char **argv) {
  bench_cli_no_arguments(argc, argv, "bench_gpu", USAGE);
  ctx c;
  memset(&c, 0, sizeof c);
  RT(cudaSetDevice(0), 0);
  RT(cudaFree(0), 0); /* creates the primary context and makes it current */
  RT(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), 0);
  cudaMemPool_t pool;
  RT(cudaDeviceGetDefaultMemPool(&pool, 0), 0);
  uint64_t keep_everything = UINT64_MAX;
  RT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything), 0);

  c.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  c.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  c.prop.location.id = 0;
  c.access.location = c.prop.location;
  c.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t granularity = 0;
  CU(cuMemGetAllocationGranularity(&granularity, &c.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), 0);
  c.va_size = sizes[SIZE_COUNT - 1].bytes;
  CU(cuMemAddressReserve(&c.va, c.va_size, granularity, 0, 0), c.va_size);

  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.retain = VMM_RETAIN_ON;
  cfg.reuse = VMM_REUSE_EXACT;
  VMM(vmm_arena_create(&cfg, &c.arena), NULL, 0);

  double us[SIZE_COUNT][METHOD_COUNT];
  for (size_t i = 0; i < SIZE_COUNT; i++) {
    size_t bytes = sizes[i].bytes;
    int reps = sizes[i].reps;
    us[i][M_MISS] = measure(pair_vmm, &c, bytes, reps);
    VMM(vmm_retention_begin(c.arena), c.arena, bytes);
    us[i][M_HIT] = measure(pair_vmm, &c, bytes, reps);
    VMM(vmm_retention_finish(c.arena), c.arena, bytes);
    us[i][M_RAW] = measure(pair_raw, &c, bytes, reps);
    us[i][M_MALLOC] = measure(pair_malloc, &c, bytes, reps);
    us[i][M_ASYNC] = measure(pair_async, &c, bytes, reps);
    RT(cudaMemPoolTrimTo(pool, 0), bytes);
  }
  vmm_snapshot snap;
  VMM(vmm_arena_snapshot(c.arena, &snap), c.arena, 0);

  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  struct cudaDeviceProp dp;
  RT(cudaGetDeviceProperties(&dp, 0), 0);
  printf("bench_gpu: %s, driver %d, runtime %d, granularity %zu MiB; median us per alloc+free pair\n\n", dp.name,
         driver, runtime, granularity / MIB);
  printf("| size    |");
  for (int m = 0; m < METHOD_COUNT; m++) printf(" %11s |", method_names[m]);
  printf(" mallocAsync/hit | miss/raw |\n|---------|");
  for (int m = 0; m < METHOD_COUNT; m++) printf("-------------|");
  printf("-----------------|----------|\n");
  char name[16];
  for (size_t i = 0; i < SIZE_COUNT; i++) {
    printf("| %-7s |", size_name(sizes[i].bytes, name));
    for (int m = 0; m < METHOD_COUNT; m++) printf(" %11.2f |", us[i][m]);
    printf(" %14.1fx | %8.3f |\n", us[i][M_ASYNC] / us[i][M_HIT], us[i][M_MISS] / us[i][M_RAW]);
  }
  printf("\n");
  int met = 0;
  for (size_t i = 0; i < SIZE_COUNT; i++) {
    double speedup = us[i][M_ASYNC] / us[i][M_HIT], overhead = us[i][M_MISS] / us[i][M_RAW];
    int hit_ok = speedup >= 5.0, miss_ok = overhead <= 1.05;
    met += hit_ok + miss_ok;
    size_name(sizes[i].bytes, name);
    printf("%s %s pool hit %.2f us vs warm cudaMallocAsync %.2f us: %.1fx faster (target >= 5x)\n",
           hit_ok ? "PASS" : "MISS", name, us[i][M_HIT], us[i][M_ASYNC], speedup);
    printf("%s %s miss %.2f us vs raw VMM %.2f us: %+.1f%% (target within 5%%)\n", miss_ok ? "PASS" : "MISS", name,
           us[i][M_MISS], us[i][M_RAW], 100.0 * (overhead - 1.0));
  }
  printf("%d of %zu targets met\n", met, 2 * SIZE_COUNT);
  assembly_costs(granularity, c.stream);
  printf("\narena: %llu pool hits, %llu pool misses, %llu cuMemCreate calls\n", (unsigned long long)snap.pool_hits,
         (unsigned long long)snap.pool_misses, (unsigned long long)snap.driver[VMM_DRV_mem_create].calls);
  vmm_arena_destroy(c.arena);
  CU(cuMemAddressFree(c.va, c.va_size), c.va_size);
  RT(cudaStreamDestroy(c.stream), 0);
  return 0;
}
