/* Helpers of the C GPU tests (see gpu_kernels.h). */
#include "gpu_kernels.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

gk_driver gk;
int gk_passed, gk_failed;
static CUfunction k_fill, k_scale, k_spin;
static double cycles_per_ms;

static const char ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    /* fill_u32(out, n, seed): out[i] = (u32)i * 2654435761 ^ seed, grid-stride */
    ".visible .entry fill_u32(.param .u64 p_out, .param .u64 p_n, .param .u32 p_seed)\n{\n"
    ".reg .pred %p<2>; .reg .b32 %r<10>; .reg .b64 %rd<10>;\n"
    "ld.param.u64 %rd1, [p_out]; ld.param.u64 %rd2, [p_n]; ld.param.u32 %r1, [p_seed];\n"
    "cvta.to.global.u64 %rd1, %rd1;\n"
    "mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "cvt.u64.u32 %rd3, %r5; mov.u32 %r6, %nctaid.x; mul.lo.u32 %r7, %r6, %r3; cvt.u64.u32 %rd4, %r7;\n"
    "FILL_LOOP: setp.ge.u64 %p1, %rd3, %rd2; @%p1 bra FILL_DONE;\n"
    "cvt.u32.u64 %r8, %rd3; mul.lo.u32 %r8, %r8, -1640531535; xor.b32 %r8, %r8, %r1;\n"
    "shl.b64 %rd5, %rd3, 2; add.s64 %rd6, %rd1, %rd5; st.global.u32 [%rd6], %r8;\n"
    "add.s64 %rd3, %rd3, %rd4; bra FILL_LOOP;\nFILL_DONE: ret;\n}\n"
    /* scale_u32(out, in, n): out[i] = in[i] * 3 + 1 */
    ".visible .entry scale_u32(.param .u64 p_out, .param .u64 p_in, .param .u64 p_n)\n{\n"
    ".reg .pred %p<2>; .reg .b32 %r<10>; .reg .b64 %rd<12>;\n"
    "ld.param.u64 %rd1, [p_out]; ld.param.u64 %rd7, [p_in]; ld.param.u64 %rd2, [p_n];\n"
    "cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd7, %rd7;\n"
    "mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "cvt.u64.u32 %rd3, %r5; mov.u32 %r6, %nctaid.x; mul.lo.u32 %r7, %r6, %r3; cvt.u64.u32 %rd4, %r7;\n"
    "SCALE_LOOP: setp.ge.u64 %p1, %rd3, %rd2; @%p1 bra SCALE_DONE;\n"
    "shl.b64 %rd5, %rd3, 2; add.s64 %rd8, %rd7, %rd5; ld.global.u32 %r8, [%rd8]; mad.lo.u32 %r8, %r8, 3, 1;\n"
    "add.s64 %rd6, %rd1, %rd5; st.global.u32 [%rd6], %r8;\n"
    "add.s64 %rd3, %rd3, %rd4; bra SCALE_LOOP;\nSCALE_DONE: ret;\n}\n"
    /* spin(cycles): busy-waits about `cycles` SM clock cycles */
    ".visible .entry spin(.param .u64 p_cycles)\n{\n"
    ".reg .pred %p<2>; .reg .b64 %rd<6>;\n"
    "ld.param.u64 %rd1, [p_cycles]; mov.u64 %rd2, %clock64;\n"
    "SPIN_LOOP: mov.u64 %rd3, %clock64; sub.s64 %rd4, %rd3, %rd2; setp.lt.s64 %p1, %rd4, %rd1; @%p1 bra SPIN_LOOP;\n"
    "ret;\n}\n";

typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                CUdriverProcAddressQueryResult *status);

const char *gk_error(CUresult r) {
  const char *name = NULL;
  if (gk.get_error_name && gk.get_error_name(r, &name) == CUDA_SUCCESS && name) return name;
  return "CUDA_ERROR_UNRECOGNIZED";
}

int gk_load_driver(char *why, size_t cap) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return snprintf(why, cap, "dlopen(libcuda.so.1): %s", dlerror()), -1;
  get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
  if (!get_proc) return snprintf(why, cap, "libcuda.so.1 has no cuGetProcAddress_v2"), -1;
  const struct {
    const char *name;
    void **slot;
  } table[] = {
      {"cuInit", (void **)&gk.init},
      {"cuDeviceGet", (void **)&gk.device_get},
      {"cuDeviceGetAttribute", (void **)&gk.device_get_attribute},
      {"cuDevicePrimaryCtxRetain", (void **)&gk.primary_ctx_retain},
      {"cuDevicePrimaryCtxRelease", (void **)&gk.primary_ctx_release},
      {"cuCtxSetCurrent", (void **)&gk.ctx_set_current},
      {"cuCtxSynchronize", (void **)&gk.ctx_synchronize},
      {"cuMemGetInfo", (void **)&gk.mem_get_info},
      {"cuMemsetD8", (void **)&gk.memset_d8},
      {"cuMemsetD8Async", (void **)&gk.memset_d8_async},
      {"cuMemcpyDtoH", (void **)&gk.memcpy_dtoh},
      {"cuMemcpyHtoD", (void **)&gk.memcpy_htod},
      {"cuMemAllocHost", (void **)&gk.mem_alloc_host},
      {"cuMemFreeHost", (void **)&gk.mem_free_host},
      {"cuStreamCreate", (void **)&gk.stream_create},
      {"cuStreamDestroy", (void **)&gk.stream_destroy},
      {"cuStreamQuery", (void **)&gk.stream_query},
      {"cuStreamSynchronize", (void **)&gk.stream_synchronize},
      {"cuStreamWaitEvent", (void **)&gk.stream_wait_event},
      {"cuLaunchHostFunc", (void **)&gk.launch_host_func},
      {"cuEventCreate", (void **)&gk.event_create},
      {"cuEventRecord", (void **)&gk.event_record},
      {"cuEventQuery", (void **)&gk.event_query},
      {"cuEventDestroy", (void **)&gk.event_destroy},
      {"cuModuleLoadData", (void **)&gk.module_load_data},
      {"cuModuleGetFunction", (void **)&gk.module_get_function},
      {"cuLaunchKernel", (void **)&gk.launch_kernel},
      {"cuStreamBeginCapture", (void **)&gk.stream_begin_capture},
      {"cuStreamEndCapture", (void **)&gk.stream_end_capture},
      {"cuGraphInstantiateWithFlags", (void **)&gk.graph_instantiate}, /* (exec, graph, flags), as declared */
      {"cuGraphLaunch", (void **)&gk.graph_launch},
      {"cuGraphExecDestroy", (void **)&gk.graph_exec_destroy},
      {"cuGraphDestroy", (void **)&gk.graph_destroy},
      {"cuGetErrorName", (void **)&gk.get_error_name},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc(table[i].name, table[i].slot, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (r != CUDA_SUCCESS || !*table[i].slot || status != CU_GET_PROC_ADDRESS_SUCCESS)
      return snprintf(why, cap, "libcuda.so.1 lacks %s (result %d, status %d)", table[i].name, (int)r, (int)status), -1;
  }
  return 0;
}

int gk_init(char *why, size_t cap) {
  if (gk_load_driver(why, cap)) return -1;
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod;
  int khz = 0;
  CUresult r;
  if ((r = gk.init(0)) || (r = gk.device_get(&dev, 0)) || (r = gk.primary_ctx_retain(&ctx, dev)) ||
      (r = gk.ctx_set_current(ctx)) || (r = gk.device_get_attribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev)))
    return snprintf(why, cap, "setting up device 0: %s", gk_error(r)), -1;
  if ((r = gk.module_load_data(&mod, ptx)) || (r = gk.module_get_function(&k_fill, mod, "fill_u32")) ||
      (r = gk.module_get_function(&k_scale, mod, "scale_u32")) || (r = gk.module_get_function(&k_spin, mod, "spin")))
    return snprintf(why, cap, "loading the test kernels: %s", gk_error(r)), -1;
  cycles_per_ms = khz > 0 ? (double)khz : 1.98e6;
  return 0;
}

uint32_t gk_fill_value(size_t i, uint32_t seed) { return (uint32_t)i * 2654435761u ^ seed; }

static unsigned blocks_for(size_t n) {
  size_t b = (n + 255) / 256;
  return b > 4096 ? 4096 : b ? (unsigned)b : 1;
}

CUresult gk_fill(CUdeviceptr words, size_t n, uint32_t seed, CUstream stream) {
  void *params[] = {&words, &n, &seed};
  return gk.launch_kernel(k_fill, blocks_for(n), 1, 1, 256, 1, 1, 0, stream, params, NULL);
}

CUresult gk_scale(CUdeviceptr out, CUdeviceptr in, size_t n, CUstream stream) {
  void *params[] = {&out, &in, &n};
  return gk.launch_kernel(k_scale, blocks_for(n), 1, 1, 256, 1, 1, 0, stream, params, NULL);
}

CUresult gk_spin(double ms, CUstream stream) {
  unsigned long long cycles = (unsigned long long)(ms * cycles_per_ms);
  void *params[] = {&cycles};
  return gk.launch_kernel(k_spin, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
}

long long gk_first_mismatch(CUdeviceptr ptr, size_t n, uint32_t seed, int scaled) {
  enum { CHUNK = 1 << 20 };
  uint32_t *buf = malloc(CHUNK * sizeof *buf);
  if (!buf) return -2;
  long long bad = -1;
  for (size_t at = 0; at < n && bad == -1; at += CHUNK) {
    size_t len = n - at < CHUNK ? n - at : CHUNK;
    if (gk.memcpy_dtoh(buf, ptr + at * 4, len * 4) != CUDA_SUCCESS) {
      bad = -2;
      break;
    }
    for (size_t i = 0; i < len; i++) {
      uint32_t want = gk_fill_value(at + i, seed);
      if (scaled) want = want * 3u + 1u;
      if (buf[i] != want) {
        bad = (long long)(at + i);
        break;
      }
    }
  }
  free(buf);
  return bad;
}

void gk_check(int ok, const char *test, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (ok) gk_passed++;
  else gk_failed++;
  printf("%s %s: %s\n", ok ? "PASS" : "FAIL", test, msg);
  fflush(stdout);
}

int gk_summary(const char *suite) {
  printf("%s: %d passed, %d failed\n", suite, gk_passed, gk_failed);
  return gk_failed ? 1 : 0;
}
