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
/* torch.cuda.MemPool's createOrIncrefPool: one use more of pool `id` of `device`, made (with a
 * vmm_pool_id of its own) when it has none, with no capture begun. Throws std::runtime_error
 * for a device out of range. */
VMM_TORCH_API void vmm_torch_process_incref_pool(int device, vmm_torch_mempool_id id);
}
#endif

/* ---- The native allocator's bookkeeping (shim/torch_allocator/vmmarena_allocator.cpp) ----
 *
 * vmmarena.install() makes vmmarena a c10::cuda::CUDACachingAllocator::CUDAAllocator, a thin
 * C++ class built against the installed PyTorch. Everything that class needs to remember
 * about an allocation lives here, in C-callable functions over the shim (and so on the fake
 * driver in CI): each live allocation's device, size, stream and pool, PyTorch's statistics,
 * the pools' live sets for cudagraph trees, and the checkpoints of those trees. Which memory
 * serves a request, stream order and pools stay in the core (vmm_torch_process_allocate,
 * vmm_arena_free); nothing here picks memory.
 *
 * Checkpoints (torch.compile mode="reduce-overhead"): a checkpoint lists the allocations live
 * in a pool. An allocation a live checkpoint lists is, when PyTorch frees it, not given back
 * to the arena but kept ("held") until no checkpoint lists it, so that restoring the
 * checkpoint can hand it back at the same address. Restoring frees what the pool holds now
 * and the checkpoint does not list, and makes what it lists live again. */

/* One of PyTorch's statistics (c10::CachingAllocator::Stat). */
typedef struct vmm_torch_stat {
  int64_t current, peak, allocated, freed;
} vmm_torch_stat;

/* c10::CachingDeviceAllocator::DeviceStats, in PyTorch's units with vmmarena's meaning
 * (docs/torch.md, "Statistics"): [0] all, [1] small_pool (requests of 1 MiB or less), [2]
 * large_pool. An allocation is a block; a mapping (a page or a whole mapping) a segment;
 * reserved bytes are the physical bytes the arena holds. */
typedef struct vmm_torch_device_stats {
  vmm_torch_stat allocation[3];           /* live allocations through the native allocator */
  vmm_torch_stat segment[3];              /* mappings: current now, peak as seen by the queries */
  vmm_torch_stat active[3];               /* as allocation */
  vmm_torch_stat inactive_split[3];       /* 0: no split blocks */
  vmm_torch_stat allocated_bytes[3];      /* all: the arena's extents handed out (vmm_usage); small/large: each allocation's slot size or extent */
  vmm_torch_stat reserved_bytes[3];       /* all: the arena's physical bytes (vmm_usage) */
  vmm_torch_stat active_bytes[3];         /* as allocated_bytes */
  vmm_torch_stat inactive_split_bytes[3]; /* 0 */
  vmm_torch_stat requested_bytes[3];      /* bytes requested, exactly */
  int64_t num_alloc_retries;              /* vmm_usage.cache_releases since the last reset */
  int64_t num_ooms;                       /* vmm_usage.refusals since the last reset */
  vmm_torch_stat oversize_allocations, oversize_segments; /* 0 */
  int64_t num_sync_all_streams;           /* cuCtxSynchronize calls */
  int64_t num_device_alloc, num_device_free; /* cuMemCreate, cuMemRelease calls */
  int64_t max_split_size;                 /* -1: no limit */
  int64_t cached_bytes;                   /* vmm_usage.cached_bytes (not one of PyTorch's) */
  int64_t held_count, held_bytes;         /* allocations held for checkpoints (not one of PyTorch's) */
} vmm_torch_device_stats;

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates `size` bytes through vmm_torch_process_allocate into the pool the captures
 * underway route `stream` to, and records it. Size 0 stores NULL and returns VMM_OK. On
 * failure *out is NULL, the status is returned and the arena's message goes to msg. */
VMM_TORCH_API int vmm_torch_native_alloc(size_t size, int device, CUstream stream, void **out, char *msg,
                                         size_t cap);
/* Frees an allocation of vmm_torch_native_alloc (on the stream it was made for; the arena
 * orders reuse after the streams record_stream added), or holds it for a checkpoint.
 * VMM_ERR_UNKNOWN_POINTER (message in msg) for a pointer it did not hand out; NULL is a no-op.
 * *device (may be NULL) gets the allocation's device, -1 if unknown. */
VMM_TORCH_API int vmm_torch_native_free(void *ptr, int *device, char *msg, size_t cap);
/* The live allocation that holds `ptr` (its base or inside it): its device, base and size.
 * VMM_ERR_UNKNOWN_POINTER when none does. */
VMM_TORCH_API int vmm_torch_native_lookup(void *ptr, int *device, void **base, size_t *size);
/* PyTorch's statistics of `device` (zeros with no arena). VMM_ERR_INVALID_ARGUMENT for a bad
 * device. */
VMM_TORCH_API int vmm_torch_native_stats(int device, vmm_torch_device_stats *out);
/* sizeof(vmm_torch_device_stats), for ctypes. */
VMM_TORCH_API size_t vmm_torch_native_stats_size(void);
/* resetPeakStats: every peak (the arena's too) to its current value. */
VMM_TORCH_API int vmm_torch_native_reset_peaks(int device);
/* resetAccumulatedStats: the allocated/freed counts and num_ooms, num_alloc_retries to 0. */
VMM_TORCH_API int vmm_torch_native_reset_accumulated(int device);
/* Uses of pool (first, second) of `device`: createOrIncrefPool, captures and use_mem_pool
 * blocks begun, less releases; 0 for a pool it does not know. */
VMM_TORCH_API int vmm_torch_native_pool_uses(int device, unsigned long long first, unsigned long long second);
/* checkPoolLiveAllocations: 1 when the allocations live in pool (first, second) are exactly
 * the n pointers of `ptrs` (duplicates allowed), else 0. */
VMM_TORCH_API int vmm_torch_native_pool_live_equal(int device, unsigned long long first, unsigned long long second,
                                                   void *const *ptrs, size_t n);

/* A checkpoint of a pool (getCheckpointState). */
typedef struct vmm_torch_checkpoint vmm_torch_checkpoint;
/* Lists the allocations live in pool (first, second) of `device` into *out. A pool it does
 * not know: VMM_ERR_INVALID_ARGUMENT, the message in msg. */
VMM_TORCH_API int vmm_torch_native_checkpoint(int device, unsigned long long first, unsigned long long second,
                                              vmm_torch_checkpoint **out, char *msg, size_t cap);
/* The checkpoint's device, and how many allocations it lists. */
VMM_TORCH_API int vmm_torch_native_checkpoint_device(const vmm_torch_checkpoint *c);
VMM_TORCH_API size_t vmm_torch_native_checkpoint_count(const vmm_torch_checkpoint *c);
/* Drops a checkpoint: what only it held goes back to the arena. NULL is a no-op. */
VMM_TORCH_API void vmm_torch_native_checkpoint_drop(vmm_torch_checkpoint *c);
/* setCheckpointPoolState: the pool's live allocations become exactly those the checkpoint
 * lists. Into freed (room for freed_cap) go the allocations live in the pool before the call
 * (those it does not list are freed); into allocd (room for allocd_cap) those it lists (live
 * again, at their addresses); a pointer may be in both. The counts go to *n_freed and
 * *n_allocd. Room for vmm_torch_native_checkpoint_count(c) plus the pool's live allocations
 * is enough; too little: VMM_ERR_INVALID_ARGUMENT, nothing changed. A listed allocation that
 * is neither live nor held (the pool was released since): VMM_ERR_INVALID_ARGUMENT, nothing
 * changed. Messages go to msg. */
VMM_TORCH_API int vmm_torch_native_restore(vmm_torch_checkpoint *c, void **freed, size_t freed_cap, size_t *n_freed,
                                           void **allocd, size_t allocd_cap, size_t *n_allocd, char *msg, size_t cap);
/* Allocations live in pool (first, second) of `device` now (0 for an unknown pool). */
VMM_TORCH_API size_t vmm_torch_native_pool_live_count(int device, unsigned long long first, unsigned long long second);

/* One block of snapshot(): a live allocation, or the free room between them. */
typedef struct vmm_torch_block {
  uintptr_t address;
  size_t size;      /* the allocation's size, or the free room's */
  size_t requested; /* bytes requested; 0 for free room */
  int state;        /* 0 free, 1 allocated, 2 held for a checkpoint */
} vmm_torch_block;
/* One segment of snapshot(): a mapping of the arena. */
typedef struct vmm_torch_segment {
  uintptr_t address;
  size_t size;                      /* the mapping's extent */
  CUstream stream;                  /* the stream of its first live allocation, else NULL */
  unsigned long long pool_first, pool_second; /* PyTorch's pool; (0, 0) for the shared cache */
  int is_page;                      /* a page of slots (PyTorch's small pool) */
  size_t first_block, block_count;  /* its blocks in the block array */
} vmm_torch_segment;
/* The segments and blocks of `device` (pool (first, second) only, unless both are 0), by
 * address: fills at most seg_cap segments and block_cap blocks and stores how many there are
 * in *n_seg and *n_block; call again with more room when either count exceeds its room.
 * VMM_OK with nothing when the device has no arena. */
VMM_TORCH_API int vmm_torch_native_segments(int device, unsigned long long first, unsigned long long second,
                                            vmm_torch_segment *segs, size_t seg_cap, size_t *n_seg,
                                            vmm_torch_block *blocks, size_t block_cap, size_t *n_block, char *msg,
                                            size_t cap);

#ifdef __cplusplus
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
VMM_TORCH_API int vmm_torch_process_test_incref_pool(int device, unsigned long long first, unsigned long long second,
                                                     char *msg, size_t cap);
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
