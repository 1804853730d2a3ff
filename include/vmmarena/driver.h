/* vmmarena driver seam: every CUDA driver call the library makes goes through this table.
 *
 * Rules of the table (like sqlite3_vfs):
 *   - `version` is the first field; fields are only ever appended, and `version` is raised
 *     when they are. The library reads a field only if the table's version has it.
 *   - Every entry returns a CUresult (CUDA_SUCCESS = 0) and has the prototype of the CUDA
 *     driver function of the same name, except `host_memory_available`, which is the
 *     library's own seam for reading host memory on unified-memory GPUs.
 *   - Out-parameters are non-NULL. Sizes and addresses passed by the library are multiples of
 *     the granularity the table reported.
 *   - The real table (vmm_driver_cuda) is filled from libcuda.so.1 at run time; tests pass a
 *     fake table through vmm_config.driver.
 */
#ifndef VMMARENA_DRIVER_H
#define VMMARENA_DRIVER_H

#include <cuda.h>
#include <stddef.h>

#include "api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VMM_DRIVER_VERSION 4 /* 2: mem_cpy_dtoh, mem_cpy_htod appended; 3: the staged backup copies, event_query, thread_exchange_stream_capture_mode; 4: the sharing of memory between processes (export, import, properties), and the capture graph's
                               * dependencies (stream_get_capture_info, graph_node_get_dependencies) */

/* CUresult cuInit(unsigned int flags); */
typedef CUresult (*vmm_drv_init_fn)(unsigned int flags);
/* CUresult cuDriverGetVersion(int *version); */
typedef CUresult (*vmm_drv_driver_get_version_fn)(int *version);
/* CUresult cuGetErrorName(CUresult error, const char **name); */
typedef CUresult (*vmm_drv_get_error_name_fn)(CUresult error, const char **name);
/* CUresult cuDeviceGetCount(int *count); */
typedef CUresult (*vmm_drv_device_get_count_fn)(int *count);
/* CUresult cuDeviceGet(CUdevice *device, int ordinal); */
typedef CUresult (*vmm_drv_device_get_fn)(CUdevice *device, int ordinal);
/* CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device); */
typedef CUresult (*vmm_drv_device_get_attribute_fn)(int *value, CUdevice_attribute attribute, CUdevice device);
/* CUresult cuDeviceCanAccessPeer(int *can_access, CUdevice device, CUdevice peer); */
typedef CUresult (*vmm_drv_device_can_access_peer_fn)(int *can_access, CUdevice device, CUdevice peer);
/* CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device); */
typedef CUresult (*vmm_drv_primary_ctx_retain_fn)(CUcontext *context, CUdevice device);
/* CUresult cuDevicePrimaryCtxRelease(CUdevice device); */
typedef CUresult (*vmm_drv_primary_ctx_release_fn)(CUdevice device);
/* CUresult cuCtxPushCurrent(CUcontext context); */
typedef CUresult (*vmm_drv_ctx_push_current_fn)(CUcontext context);
/* CUresult cuCtxPopCurrent(CUcontext *popped); */
typedef CUresult (*vmm_drv_ctx_pop_current_fn)(CUcontext *popped);
/* CUresult cuCtxSynchronize(void); */
typedef CUresult (*vmm_drv_ctx_synchronize_fn)(void);
/* CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes); */
typedef CUresult (*vmm_drv_mem_get_info_fn)(size_t *free_bytes, size_t *total_bytes);
/* CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
 *                                        CUmemAllocationGranularity_flags option); */
typedef CUresult (*vmm_drv_mem_get_allocation_granularity_fn)(size_t *granularity, const CUmemAllocationProp *prop,
                                                              CUmemAllocationGranularity_flags option);
/* CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
 *                              unsigned long long flags); */
typedef CUresult (*vmm_drv_mem_address_reserve_fn)(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                   unsigned long long flags);
/* CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size); */
typedef CUresult (*vmm_drv_mem_address_free_fn)(CUdeviceptr ptr, size_t size);
/* CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
 *                      unsigned long long flags); */
typedef CUresult (*vmm_drv_mem_create_fn)(CUmemGenericAllocationHandle *handle, size_t size,
                                          const CUmemAllocationProp *prop, unsigned long long flags);
/* CUresult cuMemRelease(CUmemGenericAllocationHandle handle); */
typedef CUresult (*vmm_drv_mem_release_fn)(CUmemGenericAllocationHandle handle);
/* CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
 *                   unsigned long long flags); */
typedef CUresult (*vmm_drv_mem_map_fn)(CUdeviceptr ptr, size_t size, size_t offset,
                                       CUmemGenericAllocationHandle handle, unsigned long long flags);
/* CUresult cuMemUnmap(CUdeviceptr ptr, size_t size); */
typedef CUresult (*vmm_drv_mem_unmap_fn)(CUdeviceptr ptr, size_t size);
/* CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count); */
typedef CUresult (*vmm_drv_mem_set_access_fn)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                              size_t count);
/* CUresult cuStreamSynchronize(CUstream stream); */
typedef CUresult (*vmm_drv_stream_synchronize_fn)(CUstream stream);
/* CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status); */
typedef CUresult (*vmm_drv_stream_is_capturing_fn)(CUstream stream, CUstreamCaptureStatus *status);
/* CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags); */
typedef CUresult (*vmm_drv_stream_wait_event_fn)(CUstream stream, CUevent event, unsigned int flags);
/* CUresult cuEventCreate(CUevent *event, unsigned int flags); */
typedef CUresult (*vmm_drv_event_create_fn)(CUevent *event, unsigned int flags);
/* CUresult cuEventRecord(CUevent event, CUstream stream); */
typedef CUresult (*vmm_drv_event_record_fn)(CUevent event, CUstream stream);
/* CUresult cuEventDestroy(CUevent event); */
typedef CUresult (*vmm_drv_event_destroy_fn)(CUevent event);
/* Not a CUDA call: host memory available for new allocations (Linux MemAvailable), in bytes.
 * CUresult host_memory_available(size_t *bytes); CUDA_ERROR_NOT_SUPPORTED where it is unknown. */
typedef CUresult (*vmm_drv_host_memory_available_fn)(size_t *bytes);
/* CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes): synchronous copy to host
 * memory (pause with VMM_PAUSE_BACKUP). Since version 2. */
typedef CUresult (*vmm_drv_mem_cpy_dtoh_fn)(void *dst, CUdeviceptr src, size_t bytes);
/* CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes): synchronous copy from
 * host memory (resume of a backup). Since version 2. */
typedef CUresult (*vmm_drv_mem_cpy_htod_fn)(CUdeviceptr dst, const void *src, size_t bytes);
/* CUresult cuMemHostAlloc(void **host, size_t bytes, unsigned int flags): pinned host memory
 * (the staging buffers of backup copies). Since version 3. */
typedef CUresult (*vmm_drv_mem_host_alloc_fn)(void **host, size_t bytes, unsigned int flags);
/* CUresult cuMemFreeHost(void *host): frees what cuMemHostAlloc returned. Since version 3. */
typedef CUresult (*vmm_drv_mem_free_host_fn)(void *host);
/* CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes, CUstream stream): copy
 * into pinned host memory, ordered on `stream`. Since version 3. */
typedef CUresult (*vmm_drv_mem_cpy_dtoh_async_fn)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
/* CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream):
 * copy from pinned host memory, ordered on `stream`. Since version 3. */
typedef CUresult (*vmm_drv_mem_cpy_htod_async_fn)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
/* CUresult cuStreamCreate(CUstream *stream, unsigned int flags): the copy streams of the
 * backups. Since version 3. */
typedef CUresult (*vmm_drv_stream_create_fn)(CUstream *stream, unsigned int flags);
/* CUresult cuStreamDestroy(CUstream stream). Since version 3. */
typedef CUresult (*vmm_drv_stream_destroy_fn)(CUstream stream);

/* CUresult cuEventQuery(CUevent event): CUDA_SUCCESS once the work before the event's record
 * is complete, CUDA_ERROR_NOT_READY before (whole-process mode: a free known complete). Since
 * version 3. */
typedef CUresult (*vmm_drv_event_query_fn)(CUevent event);

/* CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode): sets this thread's
 * capture mode to *mode and returns the old one in *mode (whole-process mode: the arena's
 * calls run relaxed while a capture is underway, as PyTorch's allocator does). Since version 3. */
typedef CUresult (*vmm_drv_thread_exchange_stream_capture_mode_fn)(CUstreamCaptureMode *mode);

/* CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
 *                                       CUmemAllocationHandleType type, unsigned long long flags):
 * with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, stores in *(int *)shareable a new file
 * descriptor of the handle (the caller closes it). Since version 4. */
typedef CUresult (*vmm_drv_mem_export_to_shareable_handle_fn)(void *shareable, CUmemGenericAllocationHandle handle,
                                                              CUmemAllocationHandleType type,
                                                              unsigned long long flags);
/* CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
 *                                         CUmemAllocationHandleType type): a handle of the memory
 * a descriptor (passed as (void *)(intptr_t)fd) refers to; the descriptor stays the caller's.
 * Since version 4. */
typedef CUresult (*vmm_drv_mem_import_from_shareable_handle_fn)(CUmemGenericAllocationHandle *handle,
                                                                void *os_handle, CUmemAllocationHandleType type);
/* CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
 *                                                 CUmemGenericAllocationHandle handle): the
 * properties a handle was created with (an imported handle's device). Since version 4. */
typedef CUresult (*vmm_drv_mem_get_allocation_properties_from_handle_fn)(CUmemAllocationProp *prop,
                                                                         CUmemGenericAllocationHandle handle);

/* CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
 *                                 CUgraph *graph, const CUgraphNode **dependencies,
 *                                 const CUgraphEdgeData **edge_data, size_t *count):
 * the CUDA 12.3 form (cuStreamGetCaptureInfo_v3, what CUDA 13's header maps the name to): a
 * capturing stream's capture id, graph and current dependency set, the nodes the next captured
 * operation on it will depend on (*dependencies stays valid until the next call on the stream).
 * Pointers other than status may be NULL. Since version 4; optional: NULL where the driver
 * lacks it (reuse inside a capture then waits for the capture to end). */
typedef CUresult (*vmm_drv_stream_get_capture_info_fn)(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                                                       CUgraph *graph, const CUgraphNode **dependencies,
                                                       const CUgraphEdgeData **edge_data, size_t *count);
/* CUresult cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode *dependencies,
 *                                     CUgraphEdgeData *edge_data, size_t *count):
 * the CUDA 12.3 form (cuGraphNodeGetDependencies_v2, what CUDA 13's header maps the name to):
 * with dependencies NULL, *count becomes the number of the node's dependencies; otherwise up
 * to *count of them are stored (edge_data, if non-NULL, gets each edge's data) and *count
 * becomes the number stored. Since version 4; optional, as stream_get_capture_info. */
typedef CUresult (*vmm_drv_graph_node_get_dependencies_fn)(CUgraphNode node, CUgraphNode *dependencies,
                                                           CUgraphEdgeData *edge_data, size_t *count);

/* X-macro of every entry point: X(field, cuda_symbol). Order = field order in the table. */
#define VMM_DRIVER_ENTRY_POINTS(X)                                     \
  X(init, "cuInit")                                                    \
  X(driver_get_version, "cuDriverGetVersion")                          \
  X(get_error_name, "cuGetErrorName")                                  \
  X(device_get_count, "cuDeviceGetCount")                              \
  X(device_get, "cuDeviceGet")                                         \
  X(device_get_attribute, "cuDeviceGetAttribute")                      \
  X(device_can_access_peer, "cuDeviceCanAccessPeer")                   \
  X(primary_ctx_retain, "cuDevicePrimaryCtxRetain")                    \
  X(primary_ctx_release, "cuDevicePrimaryCtxRelease")                  \
  X(ctx_push_current, "cuCtxPushCurrent")                              \
  X(ctx_pop_current, "cuCtxPopCurrent")                                \
  X(ctx_synchronize, "cuCtxSynchronize")                               \
  X(mem_get_info, "cuMemGetInfo")                                      \
  X(mem_get_allocation_granularity, "cuMemGetAllocationGranularity")   \
  X(mem_address_reserve, "cuMemAddressReserve")                        \
  X(mem_address_free, "cuMemAddressFree")                              \
  X(mem_create, "cuMemCreate")                                         \
  X(mem_release, "cuMemRelease")                                       \
  X(mem_map, "cuMemMap")                                               \
  X(mem_unmap, "cuMemUnmap")                                           \
  X(mem_set_access, "cuMemSetAccess")                                  \
  X(stream_synchronize, "cuStreamSynchronize")                         \
  X(stream_is_capturing, "cuStreamIsCapturing")                        \
  X(stream_wait_event, "cuStreamWaitEvent")                            \
  X(event_create, "cuEventCreate")                                     \
  X(event_record, "cuEventRecord")                                     \
  X(event_destroy, "cuEventDestroy")                                   \
  X(host_memory_available, "host_memory_available")                    \
  X(mem_cpy_dtoh, "cuMemcpyDtoH")                                      \
  X(mem_cpy_htod, "cuMemcpyHtoD")                                      \
  X(mem_host_alloc, "cuMemHostAlloc")                                  \
  X(mem_free_host, "cuMemFreeHost")                                    \
  X(mem_cpy_dtoh_async, "cuMemcpyDtoHAsync")                           \
  X(mem_cpy_htod_async, "cuMemcpyHtoDAsync")                           \
  X(stream_create, "cuStreamCreate")                                   \
  X(stream_destroy, "cuStreamDestroy")                                 \
  X(event_query, "cuEventQuery")                                       \
  X(thread_exchange_stream_capture_mode, "cuThreadExchangeStreamCaptureMode") \
  X(mem_export_to_shareable_handle, "cuMemExportToShareableHandle")   \
  X(mem_import_from_shareable_handle, "cuMemImportFromShareableHandle") \
  X(mem_get_allocation_properties_from_handle, "cuMemGetAllocationPropertiesFromHandle") \
  X(stream_get_capture_info, "cuStreamGetCaptureInfo")                 \
  X(graph_node_get_dependencies, "cuGraphNodeGetDependencies")

/* Index of each entry point, for per-entry-point counters and fault injection. */
typedef enum vmm_driver_entry {
#define VMM_DRIVER_ENTRY_ENUM(field, symbol) VMM_DRV_##field,
  VMM_DRIVER_ENTRY_POINTS(VMM_DRIVER_ENTRY_ENUM)
#undef VMM_DRIVER_ENTRY_ENUM
  VMM_DRV_ENTRY_COUNT
} vmm_driver_entry;

/* The table itself: pass one through vmm_config.driver, or NULL for vmm_driver_cuda(). It
 * must outlive every arena created with it. */
struct vmm_driver {
  unsigned version;                                              /* VMM_DRIVER_VERSION this table was built for */
  const char *name;                                              /* "cuda", "fake", ...: shown in messages */
  vmm_drv_init_fn init;                                          /* cuInit */
  vmm_drv_driver_get_version_fn driver_get_version;              /* cuDriverGetVersion */
  vmm_drv_get_error_name_fn get_error_name;                      /* cuGetErrorName */
  vmm_drv_device_get_count_fn device_get_count;                  /* cuDeviceGetCount */
  vmm_drv_device_get_fn device_get;                              /* cuDeviceGet */
  vmm_drv_device_get_attribute_fn device_get_attribute;          /* cuDeviceGetAttribute */
  vmm_drv_device_can_access_peer_fn device_can_access_peer;      /* cuDeviceCanAccessPeer */
  vmm_drv_primary_ctx_retain_fn primary_ctx_retain;              /* cuDevicePrimaryCtxRetain */
  vmm_drv_primary_ctx_release_fn primary_ctx_release;            /* cuDevicePrimaryCtxRelease */
  vmm_drv_ctx_push_current_fn ctx_push_current;                  /* cuCtxPushCurrent */
  vmm_drv_ctx_pop_current_fn ctx_pop_current;                    /* cuCtxPopCurrent */
  vmm_drv_ctx_synchronize_fn ctx_synchronize;                    /* cuCtxSynchronize */
  vmm_drv_mem_get_info_fn mem_get_info;                          /* cuMemGetInfo */
  vmm_drv_mem_get_allocation_granularity_fn mem_get_allocation_granularity; /* cuMemGetAllocationGranularity */
  vmm_drv_mem_address_reserve_fn mem_address_reserve;            /* cuMemAddressReserve */
  vmm_drv_mem_address_free_fn mem_address_free;                  /* cuMemAddressFree */
  vmm_drv_mem_create_fn mem_create;                              /* cuMemCreate */
  vmm_drv_mem_release_fn mem_release;                            /* cuMemRelease */
  vmm_drv_mem_map_fn mem_map;                                    /* cuMemMap */
  vmm_drv_mem_unmap_fn mem_unmap;                                /* cuMemUnmap */
  vmm_drv_mem_set_access_fn mem_set_access;                      /* cuMemSetAccess */
  vmm_drv_stream_synchronize_fn stream_synchronize;              /* cuStreamSynchronize */
  vmm_drv_stream_is_capturing_fn stream_is_capturing;            /* cuStreamIsCapturing */
  vmm_drv_stream_wait_event_fn stream_wait_event;                /* cuStreamWaitEvent */
  vmm_drv_event_create_fn event_create;                          /* cuEventCreate */
  vmm_drv_event_record_fn event_record;                          /* cuEventRecord */
  vmm_drv_event_destroy_fn event_destroy;                        /* cuEventDestroy */
  vmm_drv_host_memory_available_fn host_memory_available;        /* /proc/meminfo MemAvailable */
  vmm_drv_mem_cpy_dtoh_fn mem_cpy_dtoh;                          /* cuMemcpyDtoH (version 2) */
  vmm_drv_mem_cpy_htod_fn mem_cpy_htod;                          /* cuMemcpyHtoD (version 2) */
  vmm_drv_mem_host_alloc_fn mem_host_alloc;                      /* cuMemHostAlloc (version 3) */
  vmm_drv_mem_free_host_fn mem_free_host;                        /* cuMemFreeHost (version 3) */
  vmm_drv_mem_cpy_dtoh_async_fn mem_cpy_dtoh_async;              /* cuMemcpyDtoHAsync (version 3) */
  vmm_drv_mem_cpy_htod_async_fn mem_cpy_htod_async;              /* cuMemcpyHtoDAsync (version 3) */
  vmm_drv_stream_create_fn stream_create;                        /* cuStreamCreate (version 3) */
  vmm_drv_stream_destroy_fn stream_destroy;                      /* cuStreamDestroy (version 3) */
  vmm_drv_event_query_fn event_query;                            /* cuEventQuery (version 3) */
  vmm_drv_thread_exchange_stream_capture_mode_fn thread_exchange_stream_capture_mode; /* (version 3) */
  vmm_drv_mem_export_to_shareable_handle_fn mem_export_to_shareable_handle;     /* (version 4) */
  vmm_drv_mem_import_from_shareable_handle_fn mem_import_from_shareable_handle; /* (version 4) */
  vmm_drv_mem_get_allocation_properties_from_handle_fn mem_get_allocation_properties_from_handle; /* (version 4) */
  vmm_drv_stream_get_capture_info_fn stream_get_capture_info;         /* (version 4; optional) */
  vmm_drv_graph_node_get_dependencies_fn graph_node_get_dependencies; /* (version 4; optional) */
};

/* Name of an entry point as the driver spells it ("cuMemCreate"; the host-memory seam is
 * "host_memory_available"); "unknown entry point" outside the enum. A static string. */
VMM_API const char *vmm_driver_entry_name(vmm_driver_entry entry);

/* The real table, loaded from libcuda.so.1 on first use (dlopen, then cuGetProcAddress for
 * each entry point). Returns NULL where the library or an entry point is missing; *why (if
 * non-NULL) then says which. Thread-safe; loaded once, so every call gives the same answer;
 * the table lives as long as the process. */
VMM_API const struct vmm_driver *vmm_driver_cuda(const char **why);

#ifdef __cplusplus
}
#endif
#endif
