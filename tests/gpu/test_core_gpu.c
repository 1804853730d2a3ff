/* The core on the real CUDA driver (built and run by tests/gpu/run; needs a GPU).
 *
 * Allocation and free, bad frees, the retention scope and its pool, reuse on another stream
 * while the freeing stream is still busy, assembly (several handles mapped back to back,
 * access granted and the whole extent unmapped in one call each), allocation and free during
 * stream capture (relaxed and global mode), out of memory, the limit, abort, and that the
 * device's free memory comes back. Memory is checked without kernels: cuMemsetD8 to write, cuMemcpyDtoH to read back.
 * Prints a line per test and "core-gpu: N passed, M failed"; exits non-zero on a failure. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_kernels.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- A tiny harness ------------------------------------------------------------------ */

static char why[1200];
static vmm_arena *arena;         /* the current test's arena, destroyed by the runner */
static CUstream stream_a, stream_b, stream_c;
static unsigned char *host;      /* read-back buffer */
static size_t host_cap = 64 * MiB;

#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      int n_ = snprintf(why, sizeof why, "line %d: ", __LINE__); \
      snprintf(why + n_, sizeof why - (size_t)n_, __VA_ARGS__); \
      return 0;                                             \
    }                                                       \
  } while (0)
#define CU(call)                                                                    \
  do {                                                                              \
    CUresult r_ = (call);                                                           \
    EXPECT(r_ == CUDA_SUCCESS, "%s returned %s (%d)", #call, gk_error(r_), (int)r_); \
  } while (0)
#define VMM(call)                                                                                  \
  do {                                                                                             \
    vmm_status s_ = (call);                                                                        \
    EXPECT(s_ == VMM_OK, "%s returned %s: %s", #call, vmm_status_name(s_), vmm_arena_last_error(arena)); \
  } while (0)

static vmm_config config(int retain, size_t limit) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.retain = retain ? VMM_RETAIN_ON : VMM_RETAIN_OFF;
  cfg.limit_bytes = limit;
  cfg.reserve_bytes = 8 * GiB;
  cfg.log_level = 0;
  return cfg;
}

static int make_arena(int retain, size_t limit) {
  vmm_config cfg = config(retain, limit);
  vmm_status s = vmm_arena_create(&cfg, &arena);
  EXPECT(s == VMM_OK, "vmm_arena_create: %s: %s", vmm_status_name(s), vmm_create_error());
  return 1;
}

/* A check that failed outside EXPECT (in a helper that returns a value): the runner fails the
 * test with this message, whatever the test itself concluded. */
static char helper_error[512];

static void helper_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void helper_failed(const char *fmt, ...) {
  if (helper_error[0]) return; /* keep the first */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(helper_error, sizeof helper_error, fmt, ap);
  va_end(ap);
}

static vmm_snapshot snap(void) {
  vmm_snapshot s;
  memset(&s, 0, sizeof s);
  vmm_status st = vmm_arena_snapshot(arena, &s);
  if (st != VMM_OK) helper_failed("vmm_arena_snapshot returned %s: %s", vmm_status_name(st), vmm_arena_last_error(arena));
  return s;
}

static uint64_t driver_failures(const vmm_snapshot *s) {
  uint64_t n = 0;
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) n += s->driver[e].failures;
  return n;
}

static size_t device_free(void) {
  size_t free_b = 0, total_b = 0;
  CUresult r = gk.mem_get_info(&free_b, &total_b);
  if (r != CUDA_SUCCESS || total_b == 0)
    helper_failed("cuMemGetInfo returned %s (free %zu B of %zu B)", gk_error(r), free_b, total_b);
  return free_b;
}

static CUresult copy_result; /* of the latest read-back */

/* Index of the first byte of [ptr, ptr + n) that is not `value` (or that could not be read
 * back: copy_result says), or -1 if every byte is `value`. */
static long first_mismatch(void *ptr, size_t n, unsigned char value) {
  for (size_t done = 0; done < n; done += host_cap) {
    size_t chunk = n - done < host_cap ? n - done : host_cap;
    copy_result = gk.memcpy_dtoh(host, (CUdeviceptr)(uintptr_t)ptr + done, chunk);
    if (copy_result != CUDA_SUCCESS) return (long)done;
    for (size_t i = 0; i < chunk; i++)
      if (host[i] != value) return (long)(done + i);
  }
  return -1;
}

#define EXPECT_FILLED(ptr, n, value)                                                                      \
  do {                                                                                                    \
    long at_ = first_mismatch((ptr), (n), (value));                                                       \
    EXPECT(at_ < 0, "byte %ld of %p is 0x%02x, expected 0x%02x (read-back %s)", at_, (void *)(ptr),        \
           at_ >= 0 && copy_result == CUDA_SUCCESS ? host[at_ % (long)host_cap] : 0, (value), gk_error(copy_result)); \
  } while (0)

static void *dptr_add(void *p, size_t off) { return (void *)((uintptr_t)p + off); }

/* ---- Tests --------------------------------------------------------------------------- */

static int test_create_reports_granularity(void) {
  if (!make_arena(0, 0)) return 0;
  size_t g = vmm_arena_granularity(arena);
  EXPECT(g && !(g & (g - 1)), "granularity %zu is not a power of two", g);
  vmm_snapshot s = snap();
  EXPECT(s.physical_bytes == 0 && s.reserved_va_bytes == 0, "fresh arena holds %llu B, reserves %llu B",
         (unsigned long long)s.physical_bytes, (unsigned long long)s.reserved_va_bytes);
  printf("  granularity %zu B, integrated %d\n", g, s.integrated);
  return 1;
}

static int test_package_alloc_fill_free(void) {
  if (!make_arena(0, 0)) return 0;
  size_t before = device_free();
  void *p = NULL;
  VMM(vmm_arena_alloc(arena, 3 * MiB, VMM_KIND_PACKAGE, NULL, &p));
  vmm_snapshot s = snap();
  EXPECT(s.kind[VMM_KIND_PACKAGE].live_bytes == 4 * MiB && s.physical_bytes == 4 * MiB,
         "3 MiB request: live %llu B, physical %llu B", (unsigned long long)s.kind[VMM_KIND_PACKAGE].live_bytes,
         (unsigned long long)s.physical_bytes);
  CU(gk.memset_d8((CUdeviceptr)(uintptr_t)p, 0x3c, 4 * MiB)); /* the whole extent is usable */
  EXPECT_FILLED(p, 4 * MiB, 0x3c);
  VMM(vmm_arena_free(arena, p, NULL));
  s = snap();
  EXPECT(s.physical_bytes == 0 && s.mapped_bytes == 0, "after free: physical %llu B, mapped %llu B",
         (unsigned long long)s.physical_bytes, (unsigned long long)s.mapped_bytes);
  size_t after = device_free();
  EXPECT(after + 2 * MiB >= before, "device free memory %zu B before, %zu B after", before, after);
  return 1;
}

static int test_bad_frees_change_nothing(void) {
  if (!make_arena(0, 0)) return 0;
  void *p = NULL;
  VMM(vmm_arena_alloc(arena, 4 * MiB, VMM_KIND_PACKAGE, NULL, &p));
  EXPECT(vmm_arena_free(arena, dptr_add(p, 4096), NULL) == VMM_ERR_UNKNOWN_POINTER, "interior free accepted");
  EXPECT(strstr(vmm_arena_last_error(arena), "interior pointer"), "message: %s", vmm_arena_last_error(arena));
  EXPECT(vmm_arena_free(arena, (void *)(uintptr_t)0x1000, NULL) == VMM_ERR_UNKNOWN_POINTER, "unknown free accepted");
  EXPECT(snap().kind[VMM_KIND_PACKAGE].live_count == 1, "a refused free changed the arena");
  CU(gk.memset_d8((CUdeviceptr)(uintptr_t)p, 0x01, 4 * MiB));
  VMM(vmm_arena_free(arena, p, NULL));
  EXPECT(vmm_arena_free(arena, p, NULL) == VMM_ERR_UNKNOWN_POINTER, "second free accepted");
  EXPECT(snap().physical_bytes == 0, "physical memory left after free");
  return 1;
}

static int test_scope_pool_reuse_and_finish(void) {
  if (!make_arena(1, 0)) return 0;
  size_t before = device_free();
  VMM(vmm_retention_begin(arena));
  void *p = NULL, *q = NULL;
  VMM(vmm_arena_alloc(arena, 8 * MiB, VMM_KIND_TRANSIENT, stream_a, &p));
  CU(gk.memset_d8((CUdeviceptr)(uintptr_t)p, 0x11, 8 * MiB));
  CU(gk.ctx_synchronize()); /* the arena only knows stream A; the fill ran on the legacy stream */
  VMM(vmm_arena_free(arena, p, stream_a));
  vmm_snapshot s = snap();
  EXPECT(s.retained_reusable_bytes == 8 * MiB && s.kind[VMM_KIND_TRANSIENT].pooled_count == 1 &&
             s.physical_bytes == 8 * MiB,
         "after free in scope: %llu B reusable, %llu pooled, %llu B physical", (unsigned long long)s.retained_reusable_bytes,
         (unsigned long long)s.kind[VMM_KIND_TRANSIENT].pooled_count, (unsigned long long)s.physical_bytes);
  VMM(vmm_arena_alloc(arena, 8 * MiB, VMM_KIND_TRANSIENT, stream_a, &q));
  EXPECT(q == p, "pool miss: got %p, pooled %p", q, p);
  EXPECT(snap().pool_hits == 1, "pool hits %llu", (unsigned long long)snap().pool_hits);
  EXPECT_FILLED(q, 8 * MiB, 0x11); /* the mapping stayed live: its bytes are still there */
  VMM(vmm_arena_free(arena, q, stream_a));
  VMM(vmm_retention_finish(arena));
  s = snap();
  EXPECT(s.physical_bytes == 0 && s.retained_reusable_handles == 0 && s.scopes_finished == 1,
         "after finish: %llu B physical, %llu pooled", (unsigned long long)s.physical_bytes,
         (unsigned long long)s.retained_reusable_handles);
  EXPECT(device_free() + 2 * MiB >= before, "device memory not back after finish");
  return 1;
}

static void CUDA_CB hold_stream(void *arg) { usleep((useconds_t)(uintptr_t)arg); }

static int test_reuse_on_another_stream_waits_for_the_first(void) {
  if (!make_arena(1, 0)) return 0;
  const size_t n = 32 * MiB;
  VMM(vmm_retention_begin(arena));
  void *p = NULL, *q = NULL;
  VMM(vmm_arena_alloc(arena, n, VMM_KIND_TRANSIENT, stream_a, &p));
  /* Stream A: blocked for 300 ms by a host function, then writes 0x11. */
  CU(gk.launch_host_func(stream_a, hold_stream, (void *)(uintptr_t)300000));
  CU(gk.memset_d8_async((CUdeviceptr)(uintptr_t)p, 0x11, n, stream_a));
  VMM(vmm_arena_free(arena, p, stream_a));
  EXPECT(gk.stream_query(stream_a) == CUDA_ERROR_NOT_READY, "the free synchronized stream A (pooling must not)");
  /* Stream B reuses the mapping and writes 0x22: it must run after A's write. */
  VMM(vmm_arena_alloc(arena, n, VMM_KIND_TRANSIENT, stream_b, &q));
  EXPECT(q == p, "no reuse across streams: got %p, pooled %p", q, p);
  CU(gk.memset_d8_async((CUdeviceptr)(uintptr_t)q, 0x22, n, stream_b));
  EXPECT(gk.stream_query(stream_a) == CUDA_ERROR_NOT_READY, "stream A finished too early: the test proves nothing");
  CU(gk.ctx_synchronize());
  EXPECT_FILLED(q, n, 0x22);
  VMM(vmm_arena_free(arena, q, stream_b));
  VMM(vmm_retention_finish(arena));
  EXPECT(snap().physical_bytes == 0, "physical memory left after finish");
  return 1;
}

static int test_assembly_on_the_real_driver(void) {
  if (!make_arena(1, 64 * MiB)) return 0;
  VMM(vmm_retention_begin(arena));
  void *piece[4], *q = NULL, *again = NULL, *refused = NULL;
  for (int i = 0; i < 4; i++) {
    VMM(vmm_arena_alloc(arena, 16 * MiB, VMM_KIND_TRANSIENT, stream_a, &piece[i]));
    CU(gk.memset_d8((CUdeviceptr)(uintptr_t)piece[i], (unsigned char)(0x40 + i), 16 * MiB));
  }
  CU(gk.ctx_synchronize()); /* the fills ran on the legacy stream, not on stream A */
  for (int i = 0; i < 4; i++) VMM(vmm_arena_free(arena, piece[i], stream_a));
  /* 48 MiB: no pooled mapping of that size, so three idle 16 MiB mappings are taken apart and
   * their handles mapped back to back in a fresh range, with no new memory. */
  VMM(vmm_arena_alloc(arena, 48 * MiB, VMM_KIND_TRANSIENT, stream_a, &q));
  vmm_snapshot s = snap();
  EXPECT(s.assemblies == 1 && s.pooled_taken_apart == 3 && s.physical_bytes == 64 * MiB,
         "assemblies %llu, taken apart %llu, physical %llu B", (unsigned long long)s.assemblies,
         (unsigned long long)s.pooled_taken_apart, (unsigned long long)s.physical_bytes);
  CU(gk.memset_d8((CUdeviceptr)(uintptr_t)q, 0xa5, 48 * MiB)); /* across every handle boundary */
  EXPECT_FILLED(q, 48 * MiB, 0xa5);
  /* 24 MiB of package memory: the last idle 16 MiB cover two thirds; the 8 MiB of new memory
   * for the rest are over the limit, and the refusal says so. */
  EXPECT(vmm_arena_alloc(arena, 24 * MiB, VMM_KIND_PACKAGE, NULL, &refused) == VMM_ERR_OUT_OF_MEMORY, "limit not enforced");
  EXPECT(strstr(vmm_arena_last_error(arena),
                "limit 64.0 MiB < 64.0 MiB held + 8.0 MiB requested (16.0 MiB of the request from idle handles)"),
         "message: %s", vmm_arena_last_error(arena));
  EXPECT(snap().pooled_taken_apart == 3, "a refused assembly took a mapping apart");
  VMM(vmm_arena_free(arena, q, stream_a)); /* the assembled mapping goes to the pool whole */
  VMM(vmm_arena_alloc(arena, 48 * MiB, VMM_KIND_TRANSIENT, stream_a, &again));
  EXPECT(again == q, "assembled mapping not reused: %p, pooled %p", again, q);
  EXPECT_FILLED(again, 48 * MiB, 0xa5);
  VMM(vmm_arena_free(arena, again, stream_a));
  VMM(vmm_retention_finish(arena)); /* unmaps the assembled extent in one call */
  s = snap();
  EXPECT(s.physical_bytes == 0 && s.mapped_bytes == 0, "after finish: physical %llu B, mapped %llu B",
         (unsigned long long)s.physical_bytes, (unsigned long long)s.mapped_bytes);
  EXPECT(driver_failures(&s) == 0, "%llu driver calls failed (cuMemUnmap %llu, cuMemSetAccess %llu, cuMemMap %llu)",
         (unsigned long long)driver_failures(&s), (unsigned long long)s.driver[VMM_DRV_mem_unmap].failures,
         (unsigned long long)s.driver[VMM_DRV_mem_set_access].failures,
         (unsigned long long)s.driver[VMM_DRV_mem_map].failures);
  printf("  assembled 48 MiB at %p from 3 pooled 16 MiB mappings; access and unmap over the whole extent: ok\n", q);
  return 1;
}

static int test_allocation_and_free_during_capture(void) {
  if (!make_arena(0, 0)) return 0;
  void *p = NULL, *small = NULL;
  CUgraph graph = NULL;
  CUgraphExec exec = NULL;
  /* Allocation on a capturing stream (relaxed mode, as PyTorch's caching allocator uses). */
  CU(gk.stream_begin_capture(stream_c, CU_STREAM_CAPTURE_MODE_RELAXED));
  vmm_status st = vmm_arena_alloc(arena, 8 * MiB, VMM_KIND_PACKAGE, stream_c, &p);
  if (st == VMM_OK) gk.memset_d8_async((CUdeviceptr)(uintptr_t)p, 0x5a, 8 * MiB, stream_c);
  CUresult end = gk.stream_end_capture(stream_c, &graph);
  EXPECT(st == VMM_OK, "alloc during capture: %s: %s", vmm_status_name(st), vmm_arena_last_error(arena));
  EXPECT(end == CUDA_SUCCESS, "the capture was invalidated: %s", gk_error(end));
  CU(gk.graph_instantiate(&exec, graph, 0));
  CU(gk.graph_launch(exec, stream_c));
  CU(gk.ctx_synchronize());
  EXPECT_FILLED(p, 8 * MiB, 0x5a);
  gk.graph_exec_destroy(exec);
  gk.graph_destroy(graph);
  graph = NULL;
  /* A free on a capturing stream must not synchronize it: it is deferred. */
  CU(gk.stream_begin_capture(stream_c, CU_STREAM_CAPTURE_MODE_RELAXED));
  st = vmm_arena_free(arena, p, stream_c);
  end = gk.stream_end_capture(stream_c, &graph);
  if (graph) gk.graph_destroy(graph);
  EXPECT(st == VMM_OK, "free during capture: %s: %s", vmm_status_name(st), vmm_arena_last_error(arena));
  EXPECT(end == CUDA_SUCCESS, "the free broke the capture: %s", gk_error(end));
  vmm_snapshot s = snap();
  EXPECT(s.deferred_frees == 1 && s.physical_bytes == 8 * MiB, "deferred frees %llu, physical %llu B",
         (unsigned long long)s.deferred_frees, (unsigned long long)s.physical_bytes);
  VMM(vmm_arena_alloc(arena, 2 * MiB, VMM_KIND_PACKAGE, NULL, &small)); /* processes the deferred free */
  EXPECT(snap().physical_bytes == 2 * MiB, "deferred free not completed: physical %llu B",
         (unsigned long long)snap().physical_bytes);
  VMM(vmm_arena_free(arena, small, NULL));
  return 1;
}

/* docs/torch.md says the arena's driver calls succeed inside a global-mode capture on this
 * driver: allocation and free on the capturing stream, the capture still valid, the memory
 * usable afterwards. */
static int test_allocation_in_a_global_mode_capture(void) {
  if (!make_arena(0, 0)) return 0;
  void *p = NULL;
  CUgraph graph = NULL;
  CU(gk.stream_begin_capture(stream_c, CU_STREAM_CAPTURE_MODE_GLOBAL));
  vmm_status st = vmm_arena_alloc(arena, 2 * MiB, VMM_KIND_PACKAGE, stream_c, &p);
  CUresult end = gk.stream_end_capture(stream_c, &graph);
  if (graph) gk.graph_destroy(graph);
  printf("  allocation in a global-mode capture: %s; capture end: %s\n", vmm_status_name(st), gk_error(end));
  EXPECT(st == VMM_OK && p, "alloc during a global-mode capture: %s: %s", vmm_status_name(st), vmm_arena_last_error(arena));
  EXPECT(end == CUDA_SUCCESS, "the allocation invalidated the global-mode capture: %s", gk_error(end));
  CU(gk.memset_d8((CUdeviceptr)(uintptr_t)p, 0x6b, 2 * MiB));
  EXPECT_FILLED(p, 2 * MiB, 0x6b);
  VMM(vmm_arena_free(arena, p, NULL));
  EXPECT(snap().physical_bytes == 0, "physical memory left after the free");
  return 1;
}

static int test_out_of_memory_is_recoverable(void) {
  if (!make_arena(0, 0)) return 0;
  size_t free_b = 0, total_b = 0;
  CU(gk.mem_get_info(&free_b, &total_b));
  void *p = NULL;
  vmm_status st = vmm_arena_alloc(arena, total_b + GiB, VMM_KIND_PACKAGE, NULL, &p);
  EXPECT(st == VMM_ERR_OUT_OF_MEMORY && !p, "request larger than the card: %s", vmm_status_name(st));
  const char *msg = vmm_arena_last_error(arena);
  EXPECT(strstr(msg, "refused") && strstr(msg, "CUDA_ERROR_OUT_OF_MEMORY") && strstr(msg, "device free"), "message: %s", msg);
  const char *fatal = NULL;
  EXPECT(vmm_arena_fatal_error(arena, &fatal) == VMM_OK, "out of memory recorded as fatal: %s", fatal);
  vmm_snapshot s = snap();
  EXPECT(s.physical_bytes == 0 && s.oom_refusals == 1, "after OOM: physical %llu B, refusals %llu",
         (unsigned long long)s.physical_bytes, (unsigned long long)s.oom_refusals);
  VMM(vmm_arena_alloc(arena, 2 * MiB, VMM_KIND_PACKAGE, NULL, &p));
  VMM(vmm_arena_free(arena, p, NULL));
  printf("  %s\n", msg);
  return 1;
}

static int test_abort_keeps_memory_until_destroy(void) {
  if (!make_arena(1, 0)) return 0;
  size_t before = device_free();
  VMM(vmm_retention_begin(arena));
  void *t = NULL, *p = NULL;
  VMM(vmm_arena_alloc(arena, 8 * MiB, VMM_KIND_TRANSIENT, stream_a, &t));
  VMM(vmm_arena_alloc(arena, 4 * MiB, VMM_KIND_PACKAGE, stream_a, &p));
  VMM(vmm_arena_free(arena, t, stream_a));
  VMM(vmm_retention_abort(arena));
  VMM(vmm_arena_free(arena, p, stream_a)); /* allocated in the aborted scope: abandoned */
  vmm_snapshot s = snap();
  uint64_t abandoned = s.kind[VMM_KIND_TRANSIENT].abandoned_bytes + s.kind[VMM_KIND_PACKAGE].abandoned_bytes;
  EXPECT(abandoned == 12 * MiB && s.physical_bytes == 12 * MiB, "abandoned %llu B, physical %llu B",
         (unsigned long long)abandoned, (unsigned long long)s.physical_bytes);
  vmm_arena_destroy(arena);
  arena = NULL;
  EXPECT(device_free() + 2 * MiB >= before, "destroy did not give the abandoned memory back");
  return 1;
}

/* ---- Runner -------------------------------------------------------------------------- */

static int passed, failed;

static void run(const char *name, int (*test)(void)) {
  why[0] = '\0';
  helper_error[0] = '\0';
  int ok = test();
  if (helper_error[0]) {
    snprintf(why, sizeof why, "%s", helper_error);
    ok = 0;
  }
  if (arena) {
    if (ok) {
      char broken[256] = "";
      if (vmm_arena_check(arena, broken, sizeof broken)) {
        snprintf(why, sizeof why, "invariant check: %s", broken);
        ok = 0;
      }
    }
    vmm_arena_destroy(arena);
    arena = NULL;
  }
  if (ok) passed++;
  else failed++;
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, ok ? "" : ": ", ok ? "" : why);
  fflush(stdout);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  char err[256] = "";
  CUdevice dev = 0;
  CUcontext ctx = NULL;
  CUresult r = CUDA_SUCCESS;
  if (gk_load_driver(err, sizeof err) == 0 &&
      ((r = gk.init(0)) || (r = gk.device_get(&dev, 0)) || (r = gk.primary_ctx_retain(&ctx, dev)) ||
       (r = gk.ctx_set_current(ctx))))
    snprintf(err, sizeof err, "%s", gk_error(r));
  if (err[0]) {
    printf("FAIL setup: no usable CUDA device 0 (%s)\ncore-gpu: 0 passed, 1 failed\n", err);
    return 1;
  }
  host = malloc(host_cap);
  if (!host || gk.stream_create(&stream_a, CU_STREAM_NON_BLOCKING) || gk.stream_create(&stream_b, CU_STREAM_NON_BLOCKING) ||
      gk.stream_create(&stream_c, CU_STREAM_NON_BLOCKING)) {
    printf("FAIL setup: streams or host buffer\ncore-gpu: 0 passed, 1 failed\n");
    return 1;
  }
  size_t start_free = device_free();
  if (helper_error[0]) {
    printf("FAIL setup: %s\ncore-gpu: 0 passed, 1 failed\n", helper_error);
    return 1;
  }

  run("create_reports_granularity", test_create_reports_granularity);
  run("package_alloc_fill_free", test_package_alloc_fill_free);
  run("bad_frees_change_nothing", test_bad_frees_change_nothing);
  run("scope_pool_reuse_and_finish", test_scope_pool_reuse_and_finish);
  run("reuse_on_another_stream_waits_for_the_first", test_reuse_on_another_stream_waits_for_the_first);
  run("assembly_on_the_real_driver", test_assembly_on_the_real_driver);
  run("allocation_and_free_during_capture", test_allocation_and_free_during_capture);
  run("allocation_in_a_global_mode_capture", test_allocation_in_a_global_mode_capture);
  run("out_of_memory_is_recoverable", test_out_of_memory_is_recoverable);
  run("abort_keeps_memory_until_destroy", test_abort_keeps_memory_until_destroy);

  CUresult synced = gk.ctx_synchronize();
  helper_error[0] = '\0';
  size_t end_free = device_free();
  int released = synced == CUDA_SUCCESS && !helper_error[0] && end_free + 2 * MiB >= start_free;
  if (released) passed++;
  else failed++;
  printf("%s everything_released: device free memory %zu B at start, %zu B at end", released ? "PASS" : "FAIL",
         start_free, end_free);
  if (synced != CUDA_SUCCESS) printf("; cuCtxSynchronize returned %s", gk_error(synced));
  if (helper_error[0]) printf("; %s", helper_error);
  printf("\n");
  printf("core-gpu: %d passed, %d failed\n", passed, failed);
  gk.stream_destroy(stream_a);
  gk.stream_destroy(stream_b);
  gk.stream_destroy(stream_c);
  free(host);
  gk.primary_ctx_release(dev);
  return failed ? 1 : 0;
}
