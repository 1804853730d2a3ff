/* vmmarena_torch_process: the hooks of whole-process mode (vmmarena.install()), in C++ because
 * PyTorch hands some of them C++ arguments and expects a failed allocation to throw. Built
 * into libvmmarena_torch.so when a C++ compiler is found; without one these symbols are
 * absent and vmmarena.install() says so.
 *
 * The hooks, with the types PyTorch's CUDAPluggableAllocator casts their addresses to
 * (torch_abi_check.cpp checks them against PyTorch's headers):
 *   vmm_torch_process_malloc          alloc_fn:   void *(size_t, int, cudaStream_t)
 *   vmm_torch_free (vmmarena_torch.h) free_fn:    void (void *, size_t, int, cudaStream_t)
 *   vmm_torch_process_record_stream   set_record_stream_fn
 *   vmm_torch_process_empty_cache     set_reset_fn (torch.cuda.empty_cache())
 *   vmm_torch_process_memory_fraction set_memory_fraction_fn (the arena's limit: vmm_torch_set_memory_fraction)
 *   vmm_torch_process_begin_pool      set_begin_allocate_to_pool
 *   vmm_torch_process_end_pool        set_end_allocate_to_pool_fn
 *   vmm_torch_process_release_pool    set_release_pool
 *
 * Graph pools: PyTorch names a pool by a MempoolId_t (two unsigned long longs). Each device
 * keeps the pools it has seen, each with its vmm_pool_id and a use count (one per capture
 * begun into it, as PyTorch's own allocator counts them), and the captures underway, each with
 * PyTorch's filter; the arena is told of each (vmm_arena_capture_begin/end). An allocation goes into the pool of the first capture underway whose
 * filter accepts its stream, else into the shared cache. When the last use of a pool is
 * released, vmm_arena_release_pool runs; while a capture is underway on the device that waits
 * until the captures have ended, since releasing waits for the device's work. Nothing on the
 * allocation or capture path synchronizes a stream. */
#ifndef VMMARENA_TORCH_PROCESS_H
#define VMMARENA_TORCH_PROCESS_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "vmmarena_torch.h"

#ifdef __cplusplus
#include <functional>
#include <utility>

/* c10::cuda::MempoolId_t and the filter type of beginAllocateToPool. */
using vmm_torch_mempool_id = std::pair<unsigned long long, unsigned long long>;
using vmm_torch_stream_filter = std::function<bool(CUstream)>;

extern "C" {
/* Allocates through vmm_torch_process_allocate (this thread's kind and tag) into the pool
 * the captures underway route `stream` to. Size 0 returns NULL. A refusal throws std::runtime_error whose what() starts
 * "CUDA out of memory" (out of memory) or "vmmarena" (other failures) and carries the arena's
 * message; the arena is as it was. Never returns NULL for a non-zero size. */
VMM_TORCH_API void *vmm_torch_process_malloc(size_t size, int device, CUstream stream);
/* vmm_torch_record_stream; a failure throws std::runtime_error with its message. */
VMM_TORCH_API void vmm_torch_process_record_stream(void *ptr, CUstream stream);
/* Releases the pools waiting for captures to end (where none is underway), then
 * vmm_torch_empty_cache; a failure of the latter throws std::runtime_error with its message. */
VMM_TORCH_API void vmm_torch_process_empty_cache(void);
/* Whether vmm_torch_process_empty_cache keeps the cache on this thread from now on (keep
 * non-zero) or releases it (0); returns the previous setting. While it keeps it, the pools
 * waiting are released as ever and each device with no capture underway is quiesced (every
 * free known complete) instead: vmmarena.install() sets it around torch.cuda.graph's entry,
 * whose empty_cache is there to hand PyTorch's cache to the graph's pool, which in this mode
 * draws from vmmarena's cache itself. A failed quiesce throws std::runtime_error. */
VMM_TORCH_API int vmm_torch_process_keep_cache(int keep);
/* torch.cuda.set_per_process_memory_fraction: vmm_torch_set_memory_fraction; its refusal
 * (a fraction outside 0..1, a device out of range) throws std::runtime_error with the message. */
VMM_TORCH_API void vmm_torch_process_memory_fraction(double fraction, int device);
/* A capture (or any routing PyTorch asks for) into pool `id` of `device` begins; allocations
 * whose stream `filter` accepts go into that pool until vmm_torch_process_end_pool. Throws
 * std::runtime_error for a device out of range, a pool already being allocated to, or an
 * arena that refuses the capture (vmm_torch_capture_begin: it cannot be created, say). */
VMM_TORCH_API void vmm_torch_process_begin_pool(int device, vmm_torch_mempool_id id, vmm_torch_stream_filter filter);
/* Routing into `id` ends. Then, if no capture is underway on the device, the pools whose
 * release waited are released (a failure keeps them waiting; vmm_torch_last_error says why). */
VMM_TORCH_API void vmm_torch_process_end_pool(int device, vmm_torch_mempool_id id);
/* One use of pool `id` ends (a graph is reset); the last one releases it. An unknown pool is
 * a no-op. Never throws (PyTorch calls it from CUDAGraph's destructor): a failed release
 * in the driver keeps the pool waiting, vmm_torch_last_error(device) says why, and the next
 * end of a capture, release or empty_cache on the device tries again. */
VMM_TORCH_API void vmm_torch_process_release_pool(int device, vmm_torch_mempool_id id);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Tests only: the hooks above with plain C arguments ------------------------------ */
/* Each runs one hook; an exception it throws is caught, its what() written to msg
 * (NUL-terminated, truncated to cap) and 1 returned; 0 when it returned normally. */
typedef int (*vmm_torch_test_filter)(CUstream stream, void *ctx); /* non-zero: accept */
VMM_TORCH_API int vmm_torch_process_test_malloc(size_t size, int device, CUstream stream, void **out, char *msg,
                                                size_t cap);
VMM_TORCH_API int vmm_torch_process_test_record_stream(void *ptr, CUstream stream, char *msg, size_t cap);
VMM_TORCH_API int vmm_torch_process_test_empty_cache(char *msg, size_t cap);
VMM_TORCH_API int vmm_torch_process_test_memory_fraction(double fraction, int device, char *msg, size_t cap);
VMM_TORCH_API int vmm_torch_process_test_begin_pool(int device, unsigned long long first, unsigned long long second,
                                                    vmm_torch_test_filter filter, void *ctx, char *msg, size_t cap);
VMM_TORCH_API int vmm_torch_process_test_end_pool(int device, unsigned long long first, unsigned long long second,
                                                  char *msg, size_t cap);
VMM_TORCH_API int vmm_torch_process_test_release_pool(int device, unsigned long long first,
                                                      unsigned long long second, char *msg, size_t cap);
/* The vmm_pool_id that PyTorch's pool (first, second) of `device` maps to, and its use count
 * in *uses (may be NULL); 0 (and 0 uses) when the pool is not known. */
VMM_TORCH_API uint64_t vmm_torch_process_pool_of(int device, unsigned long long first, unsigned long long second,
                                                 long *uses);
/* Captures underway on `device`, and in *waiting_releases (may be NULL) the pools whose
 * release waits for them to end. */
VMM_TORCH_API int vmm_torch_process_captures(int device, int *waiting_releases);
/* Forgets every pool, capture and waiting release of every device (the arenas are not
 * told): for a test that starts over after vmm_torch_set_driver_for_testing. */
VMM_TORCH_API void vmm_torch_process_test_reset(void);

#ifdef __cplusplus
}
#endif
#endif
