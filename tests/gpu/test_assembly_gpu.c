/* Assembly on the real driver (built and run by tests/gpu/run; needs a GPU): one allocation
 * mapped from the handles of earlier allocations of other sizes (pooled mappings taken apart,
 * package memory freed into the idle store), written by kernels on two streams and checked
 * against the fill pattern; the freeing streams are busy at the frees, so the assembly must
 * wait for them; package assembly is exact. Prints "assembly-gpu: N passed, M failed". */
#include <stdio.h>
#include <string.h>

#include "gpu_kernels.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)

static vmm_arena *arena_on(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.retain = VMM_RETAIN_ON;
  vmm_arena *a = NULL;
  vmm_status st = vmm_arena_create(&cfg, &a);
  if (st != VMM_OK) fprintf(stderr, "vmm_arena_create: %s: %s\n", vmm_status_name(st), vmm_create_error());
  return a;
}

static void *alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc(a, bytes, kind, s, &p);
  if (st != VMM_OK) fprintf(stderr, "alloc %zu: %s: %s\n", bytes, vmm_status_name(st), vmm_arena_last_error(a));
  return st == VMM_OK ? p : NULL;
}

static CUdeviceptr d(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static uint64_t creates(vmm_arena *a) {
  vmm_snapshot s;
  vmm_arena_snapshot(a, &s);
  return s.driver[VMM_DRV_mem_create].calls;
}

static void assembled_from_other_sizes(void) {
  const char *t = "assembled_from_other_sizes";
  CUstream s1, s2;
  gk.stream_create(&s1, CU_STREAM_NON_BLOCKING);
  gk.stream_create(&s2, CU_STREAM_NON_BLOCKING);
  size_t free0, total;
  gk.mem_get_info(&free0, &total);
  vmm_arena *a = arena_on();
  if (!a) {
    gk_check(0, t, "no arena");
    return;
  }
  vmm_retention_begin(a);
  size_t sizes[] = {6 * MiB, 10 * MiB, 20 * MiB};
  void *p[3];
  for (int i = 0; i < 3; i++) {
    p[i] = alloc(a, sizes[i], VMM_KIND_TRANSIENT, i == 1 ? s2 : s1);
    if (!p[i]) {
      gk_check(0, t, "allocating %zu MiB", sizes[i] / MiB);
      return;
    }
  }
  void *pkg = alloc(a, 8 * MiB, VMM_KIND_PACKAGE, s2);
  gk_fill(d(pkg), 8 * MiB / 4, 7, s2);
  gk.stream_synchronize(s2);
  gk_check(vmm_arena_free(a, pkg, s2) == VMM_OK, t, "package free inside the scope keeps its handles idle");
  /* Busy streams: each mapping is written after a spin, then freed while the work runs. */
  gk_spin(150, s1);
  gk_spin(150, s2);
  for (int i = 0; i < 3; i++) gk_fill(d(p[i]), sizes[i] / 4, 100u + (unsigned)i, i == 1 ? s2 : s1);
  int busy = gk.stream_query(s1) == CUDA_ERROR_NOT_READY && gk.stream_query(s2) == CUDA_ERROR_NOT_READY;
  for (int i = 0; i < 3; i++) vmm_arena_free(a, p[i], i == 1 ? s2 : s1);
  gk_check(busy, t, "precondition: both freeing streams busy at the frees");
  uint64_t c0 = creates(a);
  vmm_snapshot before;
  vmm_arena_snapshot(a, &before);
  void *x = alloc(a, 40 * MiB, VMM_KIND_TRANSIENT, s2); /* no pooled 40 MiB: assembled */
  vmm_snapshot after;
  vmm_arena_snapshot(a, &after);
  gk_check(x != NULL, t, "40 MiB allocated");
  if (!x) return;
  gk_check(after.assemblies == before.assemblies + 1 && creates(a) == c0 && after.physical_bytes == before.physical_bytes,
           t, "assembled from idle handles with no new memory (assemblies %llu -> %llu, cuMemCreate %llu -> %llu, "
           "physical %llu -> %llu)",
           (unsigned long long)before.assemblies, (unsigned long long)after.assemblies, (unsigned long long)c0,
           (unsigned long long)creates(a), (unsigned long long)before.physical_bytes,
           (unsigned long long)after.physical_bytes);
  gk_check(after.pooled_taken_apart > before.pooled_taken_apart, t, "pooled mappings taken apart: %llu",
           (unsigned long long)(after.pooled_taken_apart - before.pooled_taken_apart));
  gk_check(gk.stream_query(s1) == CUDA_SUCCESS, t, "the assembly waited for the freeing stream s1");
  /* Two streams write halves of the assembled allocation; s1 is ordered after the alloc on s2. */
  CUevent e;
  gk.event_create(&e, CU_EVENT_DISABLE_TIMING);
  gk.event_record(e, s2);
  gk.stream_wait_event(s1, e, 0);
  size_t words = 40 * MiB / 4, half = words / 2;
  gk_fill(d(x), half, 0xabcdu, s1);
  gk_fill(d(x) + half * 4, words - half, 0x1234u, s2);
  gk.stream_synchronize(s1);
  gk.stream_synchronize(s2);
  long long bad1 = gk_first_mismatch(d(x), half, 0xabcdu, 0), bad2 = gk_first_mismatch(d(x) + half * 4, words - half, 0x1234u, 0);
  gk_check(bad1 == -1 && bad2 == -1, t, "kernels on two streams wrote the assembled handles (first mismatch %lld, %lld)",
           bad1, bad2);
  gk.event_destroy(e);
  /* Package assembly is exact: the idle handles left make up 4 MiB with no padding. */
  void *exact = alloc(a, 4 * MiB, VMM_KIND_PACKAGE, s1);
  vmm_snapshot pk;
  vmm_arena_snapshot(a, &pk);
  gk_check(exact && pk.kind[VMM_KIND_PACKAGE].live_bytes == 4 * MiB, t, "package assembled exactly: live %llu bytes",
           (unsigned long long)pk.kind[VMM_KIND_PACKAGE].live_bytes);
  if (exact) {
    gk_fill(d(exact), MiB, 9, s1);
    gk.stream_synchronize(s1);
    gk_check(gk_first_mismatch(d(exact), MiB, 9, 0) == -1, t, "package memory holds what a kernel wrote");
  }
  vmm_arena_free(a, x, s2);
  gk_check(vmm_retention_finish(a) == VMM_OK, t, "finish: %s", vmm_arena_last_error(a));
  if (exact) vmm_arena_free(a, exact, s1);
  vmm_arena_destroy(a);
  size_t free1;
  gk.mem_get_info(&free1, &total);
  gk_check(free1 + 64 * MiB >= free0, t, "device memory back: free %zu MiB before, %zu MiB after", free0 / MiB, free1 / MiB);
  gk.stream_destroy(s1);
  gk.stream_destroy(s2);
}

int main(void) {
  char why[256];
  if (gk_init(why, sizeof why)) {
    fprintf(stderr, "%s\n", why);
    gk_check(0, "setup", "%s", why);
    return gk_summary("assembly-gpu");
  }
  assembled_from_other_sizes();
  return gk_summary("assembly-gpu");
}
