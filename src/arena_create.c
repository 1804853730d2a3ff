/* Arena creation: the configuration checked, the device opened (driver, context, granularity,
 * peers), the trace opened. A failure undoes what was done and says why in
 * vmm_create_error(), with the device and the driver's result. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static __thread char create_error[512];

const char *vmm_create_error(void) { return create_error; }

static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(create_error, sizeof create_error, fmt, ap);
  va_end(ap);
  if (a) vmm_errors_log(1, a->cfg.log_level, "vmmarena: %s", create_error);
  return s;
}

/* The status of a driver call made during creation: its failure named, with the device. */
static vmm_status created(vmm_arena *a, CUresult r, vmm_driver_entry e) {
  if (r == CUDA_SUCCESS) return VMM_OK;
  return create_fail(a, r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER,
                     "creating the arena for device %d: %s returned %s (%d)", a->cfg.device, vmm_driver_entry_name(e),
                     vmm_errors_cu_name(a, r), (int)r);
}

#define CREATED(a, field, ...) created(a, VMM_DRV(a, field, __VA_ARGS__), VMM_DRV_##field)

static vmm_status check_config(const vmm_config *cfg) {
  if (cfg->device < 0 || cfg->device >= VMM_MAX_DEVICES)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "device %d out of range (0..%d)", cfg->device, VMM_MAX_DEVICES - 1);
  if (cfg->reuse == VMM_REUSE_BOUNDED && !(cfg->reuse_bound >= 1.0))
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reuse bound %g must be at least 1", cfg->reuse_bound);
  if ((unsigned)cfg->reuse > VMM_REUSE_NONE || (unsigned)cfg->retain > VMM_RETAIN_OFF)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "unknown reuse policy %d or retention mode %d", (int)cfg->reuse,
                       (int)cfg->retain);
  if (!(cfg->refill_share >= 0.0 && cfg->refill_share <= 1.0))
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "refill share %g must be 0 (assemble first) or in (0, 1]",
                       cfg->refill_share);
  if (!(cfg->refill_live_share == 0.0 || (cfg->refill_live_share >= 1.0 && cfg->refill_live_share <= 1e6)))
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "refill live share %g must be 0 (off) or in [1, 1e6]",
                       cfg->refill_live_share);
  if (cfg->refill_share > 0.0 && cfg->refill_live_share > 0.0)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT,
                       "refill share %g and refill live share %g are both set; VMMARENA_REFILL takes one of them",
                       cfg->refill_share, cfg->refill_live_share);
  if (cfg->reserve_bytes == 0)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reserve_bytes must be greater than zero");
  if (cfg->grow_in_place != 0 && cfg->grow_in_place != 1)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "grow_in_place %d must be 0 (off) or 1 (on)", cfg->grow_in_place);
  if (cfg->order_by_event != 0 && cfg->order_by_event != 1)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "order_by_event %d must be 0 (completed) or 1 (event)",
                       cfg->order_by_event);
  if (cfg->unmap_in_background != 0 && cfg->unmap_in_background != 1)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "unmap_in_background %d must be 0 (inline) or 1 (background)",
                       cfg->unmap_in_background);
  return VMM_OK;
}

static vmm_status find_driver(const vmm_config *cfg, const struct vmm_driver **drv) {
  *drv = cfg->driver;
  if (!*drv) {
    const char *why = NULL;
    if (!(*drv = vmm_driver_cuda(&why))) return create_fail(NULL, VMM_ERR_NO_DRIVER, "%s", why);
  }
  if ((*drv)->version < 1)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "driver table version %u < 1", (*drv)->version);
  return VMM_OK;
}

/* The driver, the device and its VMM support; *count the devices present. */
static vmm_status open_device(vmm_arena *a, int *count) {
  const int dev = a->cfg.device;
  int vmm_supported = 0;
  vmm_status st;
  if ((st = CREATED(a, init, 0)) || (st = CREATED(a, device_get_count, count))) return st;
  if (dev >= *count)
    return create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d not present: the driver reports %d device(s)", dev, *count);
  if ((st = CREATED(a, device_get, &a->dev, dev)) ||
      (st = CREATED(a, device_get_attribute, &vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                    a->dev)))
    return st;
  if (!vmm_supported)
    return create_fail(a, VMM_ERR_DRIVER, "device %d does not support virtual memory management", dev);
  return CREATED(a, device_get_attribute, &a->integrated, CU_DEVICE_ATTRIBUTE_INTEGRATED, a->dev);
}

/* The allocation properties and their granularity (after the context is retained). */
static vmm_status read_granularity(vmm_arena *a) {
  a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->prop.location.id = a->cfg.device;
  vmm_ipc_init(a); /* whole-process mode: exportable handles (ipc.c) */
  vmm_status st =
      CREATED(a, mem_get_allocation_granularity, &a->granularity, &a->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (st == VMM_OK && (a->granularity == 0 || (a->granularity & (a->granularity - 1))))
    st = create_fail(a, VMM_ERR_DRIVER, "device %d reports granularity %zu, not a power of two", a->cfg.device,
                     a->granularity);
  return st;
}

static void grant(vmm_arena *a, int device) {
  a->access[a->access_count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->access[a->access_count].location.id = device;
  a->access[a->access_count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  a->access_count++;
}

/* Access for the device itself and the peers the configuration names ("all": those that can). */
static vmm_status grant_peers(vmm_arena *a, int count) {
  const vmm_config *cfg = &a->cfg;
  bool all_peers = cfg->peer_access_mask == ~(uint64_t)0;
  grant(a, cfg->device);
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    if (d == cfg->device || !(cfg->peer_access_mask >> d & 1)) continue;
    if (d >= count) {
      if (all_peers) break;
      return create_fail(a, VMM_ERR_INVALID_ARGUMENT, "peer access to device %d asked, but only %d device(s) exist", d,
                         count);
    }
    CUdevice peer;
    int can = 0;
    vmm_status st;
    if ((st = CREATED(a, device_get, &peer, d)) || (st = CREATED(a, device_can_access_peer, &can, peer, a->dev))) return st;
    if (can) grant(a, d);
    else if (!all_peers)
      return create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d cannot access device %d's memory (no peer path)", d,
                         cfg->device);
  }
  return VMM_OK;
}

/* Each device's arena gets its own trace file: "%d" in the path is its ordinal, and without
 * one, devices other than 0 append ".<ordinal>". */
static vmm_status open_trace(vmm_arena *a) {
  const char *path_in = a->cfg.trace_path;
  a->cfg.trace_path = NULL;
  if (!path_in) return VMM_OK;
  char path[4096];
  const int dev = a->cfg.device;
  const char *mark = strstr(path_in, "%d");
  int n = mark ? snprintf(path, sizeof path, "%.*s%d%s", (int)(mark - path_in), path_in, dev, mark + 2)
          : dev ? snprintf(path, sizeof path, "%s.%d", path_in, dev)
                : snprintf(path, sizeof path, "%s", path_in);
  bool fits = n >= 0 && (size_t)n < sizeof path;
  if (fits && vmm_trace_arena_open(a, path)) return VMM_OK;
  return create_fail(a, VMM_ERR_INVALID_ARGUMENT, "VMMARENA_TRACE=\"%s\" (file %s): cannot open for writing: %s", path_in,
                     fits ? path : "(path too long)", fits ? strerror(errno) : "path too long");
}

/* Undoes a creation that failed after the record was made. */
static void unmake(vmm_arena *a, bool retained_ctx) {
  vmm_driver_ctx_leave(a);
  if (retained_ctx) (void)VMM_DRV_COUNTED(a, primary_ctx_release, a->dev);
  vmm_table_fini(&a->table);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

static vmm_status make(const vmm_config *cfg, const struct vmm_driver *drv, vmm_arena **out) {
  vmm_arena *a = calloc(1, sizeof *a);
  if (!a) return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the arena");
  a->cfg = *cfg;
  a->drv = drv;
  if (pthread_mutex_init(&a->lock, NULL)) {
    free(a);
    return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "pthread_mutex_init failed");
  }
  if (vmm_table_init(&a->table)) {
    unmake(a, false);
    return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the mapping table");
  }
  *out = a;
  return VMM_OK;
}

vmm_status vmm_arena_create(const vmm_config *cfg, vmm_arena **out) {
  if (!out) return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_create: NULL out-pointer");
  *out = NULL;
  vmm_config defaults;
  if (!cfg) vmm_config_init(&defaults), cfg = &defaults;
  const struct vmm_driver *drv = NULL;
  vmm_arena *a = NULL;
  vmm_status st;
  if ((st = check_config(cfg)) || (st = find_driver(cfg, &drv)) || (st = make(cfg, drv, &a))) return st;
  int count = 0;
  bool retained_ctx = false;
  if (!(st = open_device(a, &count)) && !(st = CREATED(a, primary_ctx_retain, &a->ctx, a->dev))) {
    retained_ctx = true;
    if (!(st = read_granularity(a)) && !(st = grant_peers(a, count))) st = open_trace(a);
  }
  if (st != VMM_OK) {
    unmake(a, retained_ctx);
    return st;
  }
  a->handle_bound = cfg->handle_bound_bytes ? vmm_round_up(a, cfg->handle_bound_bytes) : 0;
  a->retention_enabled = cfg->retain == VMM_RETAIN_ON || (cfg->retain == VMM_RETAIN_AUTO && a->integrated);
  vmm_driver_ctx_leave(a);
  *out = a;
  return VMM_OK;
}

void vmm_arena_create_close_device(vmm_arena *a) {
  if (a->ctx) (void)VMM_DRV(a, primary_ctx_release, a->dev);
  vmm_driver_ctx_leave(a);
}
