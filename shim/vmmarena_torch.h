/* vmmarena_torch: the entry points PyTorch's CUDAPluggableAllocator loads, and the control
 * functions the Python package (shim/python/vmmarena) calls through ctypes.
 *
 * One arena per device, created on first use from the VMMARENA_* environment
 * (vmm_config_from_env). A bad value is never replaced by a default: the call that would
 * have created the arena fails, and vmm_torch_last_error(device) names the variable and the
 * value. Creation is retried on every later call, so fixing the environment is enough.
 *
 * Status codes are vmm_status values (include/vmmarena.h): 0 is VMM_OK.
 * Streams: PyTorch's cudaStream_t is the driver's CUstream (both are struct CUstream_st *). */
#ifndef VMMARENA_TORCH_H
#define VMMARENA_TORCH_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(VMMARENA_TORCH_BUILD)
#define VMM_TORCH_API __attribute__((visibility("default")))
#else
#define VMM_TORCH_API
#endif

struct vmm_driver;
struct vmm_trace_reader;
struct vmm_trace_record;
struct vmm_snapshot;
struct vmm_usage;

/* ---- PyTorch's allocator signatures -------------------------------------------------- */

/* Allocate `size` bytes of PACKAGE (persistent) or TRANSIENT memory on `device`, for use on
 * `stream`. NULL on failure (PyTorch then frees cached blocks, retries, and raises
 * torch.OutOfMemoryError); vmm_torch_last_error(device) says why, with the numbers.
 * A size of 0 returns NULL without an error: an empty tensor needs no memory. */
VMM_TORCH_API void *vmm_torch_package_allocate(ssize_t size, int device, CUstream stream);
VMM_TORCH_API void *vmm_torch_transient_allocate(ssize_t size, int device, CUstream stream);
/* Free an allocation of either kind. PyTorch passes the size and stream of the allocation;
 * the arena knows each allocation's extent, so `size` is only checked for being
 * non-negative. An unknown pointer changes nothing and keeps the error. NULL is a no-op. */
VMM_TORCH_API void vmm_torch_free(void *ptr, ssize_t size, int device, CUstream stream);

/* ---- Control functions (each creates the device's arena if it does not exist yet) ---- */

VMM_TORCH_API int vmm_torch_retention_begin(int device);
VMM_TORCH_API int vmm_torch_retention_finish(int device);
VMM_TORCH_API int vmm_torch_retention_abort(int device);
/* Synchronizes the device and marks every pooled mapping reusable on any stream. */
VMM_TORCH_API int vmm_torch_quiesce(int device);
/* vmm_arena_pause / vmm_arena_resume of the device's arena; tag NULL means untagged, backup
 * non-zero means VMM_PAUSE_BACKUP. */
VMM_TORCH_API int vmm_torch_pause(int device, const char *tag, int backup);
VMM_TORCH_API int vmm_torch_resume(int device, const char *tag);

/* Writes the JSON snapshot (docs/snapshot.md), NUL-terminated, into buf. A buffer smaller
 * than vmm_torch_snapshot_json_size(device) returns VMM_ERR_INVALID_ARGUMENT and leaves a
 * truncated, NUL-terminated prefix. */
VMM_TORCH_API int vmm_torch_snapshot_json(int device, char *buf, size_t cap);
/* Bytes the snapshot needs now, including the NUL; 0 if the arena cannot be created. The
 * document can grow between this call and the next, so leave some slack. */
VMM_TORCH_API size_t vmm_torch_snapshot_json_size(int device);

/* Message of the latest failure of a call through this shim for `device` ("" if none). The
 * text stays valid until the next failure on that device. */
VMM_TORCH_API const char *vmm_torch_last_error(int device);
/* "VMM_ERR_OUT_OF_MEMORY" for a status code returned above. */
VMM_TORCH_API const char *vmm_torch_status_name(int status);
/* Parses the VMMARENA_* environment as arena creation would. Writes the error message ("" if
 * none) into buf (NUL-terminated, truncated to cap) and returns the status. */
VMM_TORCH_API int vmm_torch_config_check(char *buf, size_t cap);
/* Runs the arena's invariant checker; on failure writes why into buf. */
VMM_TORCH_API int vmm_torch_check(int device, char *buf, size_t cap);

/* Thread-local label for the segments allocated from now on (nested; NULL = no tag). */
VMM_TORCH_API void vmm_torch_tag_push(const char *tag);
VMM_TORCH_API void vmm_torch_tag_pop(void);

/* ---- Whole-process mode (vmmarena.install(); docs/torch.md) ------------------------ */

/* Makes the arenas created from now on caching arenas (vmm_config.caching = 1, whatever
 * VMMARENA_CACHE says) when `on` is non-zero, and leaves the environment's choice otherwise.
 * Once an arena exists a change is refused (VMM_ERR_INVALID_ARGUMENT, with why in msg,
 * NUL-terminated and truncated to cap; msg may be NULL); asking for the setting in force is
 * VMM_OK. */
VMM_TORCH_API int vmm_torch_set_caching(int on, char *msg, size_t cap);
/* The setting of vmm_torch_set_caching (0 or 1). */
VMM_TORCH_API int vmm_torch_caching(void);
/* Sets the kind (0 = PACKAGE, 1 = TRANSIENT) of this thread's whole-process allocations and
 * returns the previous one; -1 and no change for another value. A thread starts TRANSIENT. */
VMM_TORCH_API int vmm_torch_set_kind(int kind);
/* This thread's kind for whole-process allocations. */
VMM_TORCH_API int vmm_torch_kind(void);
/* Allocates `size` bytes of this thread's kind, with this thread's tag, into `pool` (0: the
 * shared cache; else a graph's pool, vmm_arena_alloc_in) of `device`'s arena, for `stream`.
 * Size 0 stores NULL and returns VMM_OK. On failure *out (out not NULL) is NULL, the status is
 * returned and the message (with its numbers) goes to msg (may be NULL) and to
 * vmm_torch_last_error. */
VMM_TORCH_API int vmm_torch_process_allocate(size_t size, int device, CUstream stream, uint64_t pool, void **out,
                                             char *msg, size_t cap);
/* vmm_arena_free of `device`'s arena: frees an allocation of vmm_torch_process_allocate on
 * `stream` (the stream it was made for). NULL is a no-op. The status is returned and its
 * message goes to msg (may be NULL) and to vmm_torch_last_error. */
VMM_TORCH_API int vmm_torch_process_free(void *ptr, int device, CUstream stream, char *msg, size_t cap);
/* vmm_arena_record_stream on the arena that holds `ptr` (the arenas that exist are asked in
 * device order). NULL is a no-op. VMM_ERR_UNKNOWN_POINTER when no arena holds it; the message
 * goes to msg. */
VMM_TORCH_API int vmm_torch_record_stream(void *ptr, CUstream stream, char *msg, size_t cap);
/* vmm_arena_stream_mark of `device`'s arena: 0 where the device has no arena yet (or the
 * device is invalid, or the stream captures). */
VMM_TORCH_API uint64_t vmm_torch_stream_mark(int device, CUstream stream);
/* vmm_arena_stream_waited of `device`'s arena; VMM_OK with nothing learned for mark 0 or a
 * device with no arena. A failure's message goes to vmm_torch_last_error. */
VMM_TORCH_API int vmm_torch_stream_waited(int device, CUstream waiter, CUstream source, uint64_t mark);
/* The bytes the live allocation at ptr on `device` holds (vmm_arena_allocation_size). */
VMM_TORCH_API int vmm_torch_allocation_size(void *ptr, int device, size_t *bytes);
/* vmm_arena_capture_begin / vmm_arena_capture_end of `device`'s arena: a capture into `pool`
 * begins (the arena is created if it does not exist yet) or ends (VMM_OK with nothing to do
 * when the device has no arena). */
VMM_TORCH_API int vmm_torch_capture_begin(int device, uint64_t pool);
VMM_TORCH_API int vmm_torch_capture_end(int device, uint64_t pool);
/* vmm_arena_release_pool of `device`'s arena; VMM_OK with nothing to do when it has no arena. */
VMM_TORCH_API int vmm_torch_release_pool(int device, uint64_t pool);
/* vmm_torch_quiesce of `device`'s arena; VMM_OK with nothing to do when it has no arena. */
VMM_TORCH_API int vmm_torch_quiesce_existing(int device);
/* vmm_arena_empty_cache on every arena that exists. Every arena is tried; the first failure's
 * status is returned and its message goes to msg. */
VMM_TORCH_API int vmm_torch_empty_cache(char *msg, size_t cap);
/* vmm_arena_usage of `device`'s arena into *out; all zeros when it has no arena. */
VMM_TORCH_API int vmm_torch_usage(int device, struct vmm_usage *out);
/* vmm_arena_snapshot of `device`'s arena into *out (the mapping counts and driver calls the
 * native allocator's statistics report); all zeros when it has no arena. */
VMM_TORCH_API int vmm_torch_arena_snapshot(int device, struct vmm_snapshot *out);
/* sizeof(vmm_usage), which the Python package's ctypes copy of it must match. */
VMM_TORCH_API size_t vmm_torch_usage_size(void);
/* vmm_arena_reset_peaks of `device`'s arena; VMM_OK when it has none. */
VMM_TORCH_API int vmm_torch_reset_peaks(int device);
/* torch.cuda.set_per_process_memory_fraction: `device`'s arena (created if it does not exist
 * yet) may hold at most fraction x the device's total memory from now on (vmm_arena_set_limit;
 * a fraction of 0 is a limit of 1 byte, since 0 would mean none). A fraction outside 0..1 or a
 * bad device: VMM_ERR_INVALID_ARGUMENT, nothing changed; the message goes to msg. */
VMM_TORCH_API int vmm_torch_set_memory_fraction(int device, double fraction, char *msg, size_t cap);
/* torch.cuda.get_per_process_memory_fraction: the arena's limit over the device's total memory
 * into *out, 1 with no limit or a limit at least the total; errors as above. */
VMM_TORCH_API int vmm_torch_memory_fraction(int device, double *out, char *msg, size_t cap);

/* ---- Trace files (`vmmarena memviz`) ------------------------------------------------- */

/* The core's trace reader (include/vmmarena/trace.h), so that the Python package reads traces
 * with the parser the replay tool uses: vmm_trace_reader_open, _records, _name, _next and
 * _close under the shim's names. None of them creates an arena. */
VMM_TORCH_API int vmm_torch_trace_open(const char *path, struct vmm_trace_reader **out, char *msg, size_t cap);
VMM_TORCH_API size_t vmm_torch_trace_records(const struct vmm_trace_reader *r);
VMM_TORCH_API const char *vmm_torch_trace_name(const struct vmm_trace_reader *r);
VMM_TORCH_API int vmm_torch_trace_next(struct vmm_trace_reader *r, struct vmm_trace_record *rec, size_t *line);
VMM_TORCH_API void vmm_torch_trace_close(struct vmm_trace_reader *r);
/* sizeof(vmm_trace_record), which the Python package's ctypes copy of it must match. */
VMM_TORCH_API size_t vmm_torch_trace_record_size(void);
/* vmm_trace_op_name: an op's name as a trace line writes it ("alloc", "set-limit"); "?" for none. */
VMM_TORCH_API const char *vmm_torch_trace_op_name(int op);

/* Tests only: destroys every arena (pointers handed out become invalid), then creates later
 * arenas on `drv` (NULL = the CUDA driver). Lets CI run the shim on the fake driver. The
 * caching setting and the threads' kinds stay as they are. */
VMM_TORCH_API int vmm_torch_set_driver_for_testing(const struct vmm_driver *drv);

#ifdef __cplusplus
}
#endif
#endif
