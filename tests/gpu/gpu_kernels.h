/* Helpers of the C GPU tests: the driver calls they make themselves (resolved from
 * libcuda.so.1 at run time, as the library does; test_core_gpu.c uses only these), three
 * kernels loaded from PTX (fill, scale, spin), and a tiny pass/fail tally. */
#ifndef VMMARENA_GPU_KERNELS_H
#define VMMARENA_GPU_KERNELS_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gk_driver {
  CUresult (*init)(unsigned flags);
  CUresult (*device_get)(CUdevice *dev, int ordinal);
  CUresult (*device_get_attribute)(int *value, CUdevice_attribute attr, CUdevice dev);
  CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
  CUresult (*primary_ctx_release)(CUdevice dev);
  CUresult (*ctx_set_current)(CUcontext ctx);
  CUresult (*ctx_synchronize)(void);
  CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
  CUresult (*memset_d8)(CUdeviceptr ptr, unsigned char value, size_t n);
  CUresult (*memset_d8_async)(CUdeviceptr ptr, unsigned char value, size_t n, CUstream s);
  CUresult (*memcpy_dtoh)(void *dst, CUdeviceptr src, size_t n);
  CUresult (*memcpy_htod)(CUdeviceptr dst, const void *src, size_t n);
  CUresult (*mem_alloc_host)(void **p, size_t n);
  CUresult (*mem_free_host)(void *p);
  CUresult (*stream_create)(CUstream *s, unsigned flags);
  CUresult (*stream_destroy)(CUstream s);
  CUresult (*stream_query)(CUstream s);
  CUresult (*stream_synchronize)(CUstream s);
  CUresult (*stream_wait_event)(CUstream s, CUevent e, unsigned flags);
  CUresult (*launch_host_func)(CUstream s, CUhostFn fn, void *arg);
  CUresult (*event_create)(CUevent *e, unsigned flags);
  CUresult (*event_record)(CUevent e, CUstream s);
  CUresult (*event_query)(CUevent e);
  CUresult (*event_destroy)(CUevent e);
  CUresult (*module_load_data)(CUmodule *m, const void *image);
  CUresult (*module_get_function)(CUfunction *f, CUmodule m, const char *name);
  CUresult (*launch_kernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shared, CUstream s, void **params, void **extra);
  CUresult (*stream_begin_capture)(CUstream s, CUstreamCaptureMode mode);
  CUresult (*stream_end_capture)(CUstream s, CUgraph *graph);
  CUresult (*graph_instantiate)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
  CUresult (*graph_launch)(CUgraphExec exec, CUstream s);
  CUresult (*graph_exec_destroy)(CUgraphExec exec);
  CUresult (*graph_destroy)(CUgraph graph);
  CUresult (*get_error_name)(CUresult r, const char **name);
} gk_driver;

extern gk_driver gk;

/* Resolves gk's entry points from libcuda.so.1. Returns 0, or -1 with the reason in why. */
int gk_load_driver(char *why, size_t cap);
/* gk_load_driver, then makes device 0's primary context current and loads the kernels. Returns
 * 0, or -1 with the reason in why. */
int gk_init(char *why, size_t cap);
const char *gk_error(CUresult r);

/* Kernels on `stream`: words[i] = i * 2654435761 ^ seed; out[i] = in[i] * 3 + 1; a busy wait
 * of about `ms` milliseconds (one thread). */
CUresult gk_fill(CUdeviceptr words, size_t n, uint32_t seed, CUstream stream);
CUresult gk_scale(CUdeviceptr out, CUdeviceptr in, size_t n, CUstream stream);
CUresult gk_spin(double ms, CUstream stream);
uint32_t gk_fill_value(size_t i, uint32_t seed);
/* Index of the first of n words at ptr that differs from fill(seed) (or, with scaled, from
 * fill * 3 + 1), or -1 if all match; -2 if the copy failed. */
long long gk_first_mismatch(CUdeviceptr ptr, size_t n, uint32_t seed, int scaled);

/* Tally: CHECK records one pass or failure with a message; gk_summary prints "NAME: N passed,
 * M failed" and returns the exit status. */
extern int gk_passed, gk_failed;
void gk_check(int ok, const char *test, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gk_summary(const char *suite);

#endif
