/* Arena: the public entry points. Creation and destruction, allocate (the ordered list of
 * sources below), free, quiesce, and the error accessors. One mutex per arena; stream
 * synchronization happens outside it. The other concerns have files of their own: mapping.c
 * (records, the one retire), store.c (idle handles), assembly.c, stream_order.c, admission.c,
 * scope.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define VMM_MAX_ALLOC ((size_t)1 << 47) /* 128 TiB: more than any device's VA space */

static __thread char create_error[512];

const char *vmm_create_error(void) { return create_error; }

/* ---- Creation ------------------------------------------------------------------------ */

static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(create_error, sizeof create_error, fmt, ap);
  va_end(ap);
  if (a) vmm_log(1, a->cfg.log_level, "vmmarena: %s", create_error);
  return s;
}

#define CREATE_DRV(a, field, ...)                                                                          \
  do {                                                                                                     \
    CUresult r_ = VMM_DRV(a, field, __VA_ARGS__);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                              \
      st = create_fail(a, r_ == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER,           \
                       "creating the arena for device %d: %s returned %s (%d)", cfg->device,               \
                       vmm_driver_entry_name(VMM_DRV_##field), vmm_cu_error_name(a->drv, r_), (int)r_);    \
      goto fail;                                                                                           \
    }                                                                                                      \
  } while (0)

vmm_status vmm_arena_create(const vmm_config *cfg_in, vmm_arena **out) {
  if (!out) return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_create: NULL out-pointer");
  *out = NULL;
  vmm_config defaults;
  if (!cfg_in) {
    vmm_config_init(&defaults);
    cfg_in = &defaults;
  }
  const vmm_config *cfg = cfg_in;
  if (cfg->device < 0 || cfg->device >= VMM_MAX_DEVICES)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "device %d out of range (0..%d)", cfg->device, VMM_MAX_DEVICES - 1);
  if (cfg->reuse == VMM_REUSE_BOUNDED && !(cfg->reuse_bound >= 1.0))
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reuse bound %g must be at least 1", cfg->reuse_bound);
  if ((unsigned)cfg->reuse > VMM_REUSE_NONE || (unsigned)cfg->retain > VMM_RETAIN_OFF)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "unknown reuse policy %d or retention mode %d", (int)cfg->reuse,
                       (int)cfg->retain);
  if (cfg->reserve_bytes == 0)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reserve_bytes must be greater than zero");
  const struct vmm_driver *drv = cfg->driver;
  if (!drv) {
    const char *why = NULL;
    drv = vmm_driver_cuda(&why);
    if (!drv) return create_fail(NULL, VMM_ERR_NO_DRIVER, "%s", why);
  }
  if (drv->version < 1) return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "driver table version %u < 1", drv->version);

  vmm_arena *a = calloc(1, sizeof *a);
  if (!a) return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the arena");
  a->cfg = *cfg;
  a->drv = drv;
  vmm_status st = VMM_OK;
  int retained_ctx = 0;
  if (pthread_mutex_init(&a->lock, NULL)) {
    free(a);
    return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "pthread_mutex_init failed");
  }
  if (vmm_table_init(&a->table)) {
    st = create_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the mapping table");
    goto fail;
  }
  CREATE_DRV(a, init, 0);
  int count = 0;
  CREATE_DRV(a, device_get_count, &count);
  if (cfg->device >= count) {
    st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d not present: the driver reports %d device(s)", cfg->device,
                     count);
    goto fail;
  }
  CREATE_DRV(a, device_get, &a->dev, cfg->device);
  int vmm_supported = 0;
  CREATE_DRV(a, device_get_attribute, &vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, a->dev);
  if (!vmm_supported) {
    st = create_fail(a, VMM_ERR_DRIVER, "device %d does not support virtual memory management", cfg->device);
    goto fail;
  }
  CREATE_DRV(a, device_get_attribute, &a->integrated, CU_DEVICE_ATTRIBUTE_INTEGRATED, a->dev);
  CREATE_DRV(a, primary_ctx_retain, &a->ctx, a->dev);
  retained_ctx = 1;
  a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->prop.location.id = cfg->device;
  CREATE_DRV(a, mem_get_allocation_granularity, &a->granularity, &a->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (a->granularity == 0 || (a->granularity & (a->granularity - 1))) {
    st = create_fail(a, VMM_ERR_DRIVER, "device %d reports granularity %zu, not a power of two", cfg->device,
                     a->granularity);
    goto fail;
  }
  a->access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->access[0].location.id = cfg->device;
  a->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  a->access_count = 1;
  int all_peers = cfg->peer_access_mask == ~(uint64_t)0;
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    if (d == cfg->device || !(cfg->peer_access_mask >> d & 1)) continue;
    if (d >= count) {
      if (all_peers) break;
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "peer access to device %d asked, but only %d device(s) exist", d,
                       count);
      goto fail;
    }
    CUdevice peer;
    int can = 0;
    CREATE_DRV(a, device_get, &peer, d);
    CREATE_DRV(a, device_can_access_peer, &can, peer, a->dev);
    if (!can) {
      if (all_peers) continue;
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d cannot access device %d's memory (no peer path)", d,
                       cfg->device);
      goto fail;
    }
    a->access[a->access_count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a->access[a->access_count].location.id = d;
    a->access[a->access_count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    a->access_count++;
  }
  a->handle_bound = cfg->handle_bound_bytes ? vmm_round_up(a, cfg->handle_bound_bytes) : 0;
  a->retention_enabled =
      cfg->retain == VMM_RETAIN_ON || (cfg->retain == VMM_RETAIN_AUTO && a->integrated);
  a->next_scope_id = 0;
  if (cfg->trace_path) {
    /* Each device's arena gets its own file: "%d" in the path is its ordinal, and without
     * one, devices other than 0 append ".<ordinal>". */
    char path[4096];
    const char *mark = strstr(cfg->trace_path, "%d");
    int n = mark ? snprintf(path, sizeof path, "%.*s%d%s", (int)(mark - cfg->trace_path), cfg->trace_path, cfg->device,
                            mark + 2)
            : cfg->device ? snprintf(path, sizeof path, "%s.%d", cfg->trace_path, cfg->device)
                          : snprintf(path, sizeof path, "%s", cfg->trace_path);
    if (n < 0 || (size_t)n >= sizeof path || !(a->trace = vmm_trace_open(path))) {
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "VMMARENA_TRACE=\"%s\" (file %s): cannot open for writing: %s",
                       cfg->trace_path, n >= 0 && (size_t)n < sizeof path ? path : "(path too long)",
                       n >= 0 && (size_t)n < sizeof path ? strerror(errno) : "path too long");
      goto fail;
    }
  }
  a->cfg.trace_path = NULL;
  vmm_ctx_leave(a);
  *out = a;
  return VMM_OK;
fail:
  vmm_ctx_leave(a);
  if (retained_ctx) a->drv->primary_ctx_release(a->dev);
  vmm_table_fini(&a->table);
  pthread_mutex_destroy(&a->lock);
  free(a);
  return st;
}

size_t vmm_arena_granularity(const vmm_arena *a) { return a ? a->granularity : 0; }
int vmm_arena_device(const vmm_arena *a) { return a ? a->cfg.device : -1; }

/* ---- Allocate ------------------------------------------------------------------------ */

#define NOTHING VMM_STATUS_COUNT /* a source that does not apply, or found nothing */

static bool pooling(const vmm_arena *a, const vmm_request *req) {
  return vmm_retaining(a) && req->kind == VMM_KIND_TRANSIENT && a->cfg.reuse != VMM_REUSE_NONE;
}

static bool assembling(const vmm_arena *a, const vmm_request *req) {
  return vmm_retaining(a) && a->cfg.reuse != VMM_REUSE_NONE &&
         (req->kind == VMM_KIND_TRANSIENT || a->cfg.package_assembly);
}

/* The largest extent the reuse policy hands to a request of `rounded` bytes. */
static size_t reuse_limit(const vmm_arena *a, size_t rounded) {
  if (a->cfg.reuse == VMM_REUSE_BEST_FIT) return SIZE_MAX;
  if (a->cfg.reuse != VMM_REUSE_BOUNDED) return rounded;
  double bound = (double)rounded * a->cfg.reuse_bound;
  return bound >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bound;
}

static vmm_status from_pool(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req)) return NOTHING;
  vmm_reuse_ctx rc = {a, req->stream, -1};
  *out = vmm_pool_take(&a->store.pool, req->rounded, reuse_limit(a, req->rounded), vmm_usable_on_stream, &rc);
  if (*out) a->pool_hits++;
  else a->pool_misses++;
  return *out ? VMM_OK : NOTHING;
}

static vmm_status from_idle_and_new(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return assembling(a, req) ? vmm_assemble(a, req, VMM_ASSEMBLE_EXACT, NULL, out) : NOTHING;
}

static vmm_status from_new_memory(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return assembling(a, req) ? NOTHING : vmm_assemble(a, req, VMM_ASSEMBLE_NEW, NULL, out);
}

static vmm_status from_any_pooled(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req)) return NOTHING;
  vmm_reuse_ctx rc = {a, req->stream, -1};
  *out = vmm_pool_take(&a->store.pool, req->rounded, SIZE_MAX, vmm_usable_on_stream, &rc);
  if (*out) a->pool_fallbacks++;
  return *out ? VMM_OK : NOTHING;
}

static vmm_status from_idle_padded(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req)) return NOTHING;
  vmm_status st = vmm_assemble(a, req, VMM_ASSEMBLE_PADDED, NULL, out);
  return st == VMM_ERR_OUT_OF_MEMORY ? NOTHING : st;
}

/* Where an allocation comes from, in this order. A source answers with a mapping, NOTHING
 * (the next one tries), a refusal of new memory (VMM_ERR_OUT_OF_MEMORY: the next one tries,
 * and the fallbacks open), or another error, which ends the list. */
static const struct {
  bool after_refusal; /* tried only once new memory was refused */
  vmm_status (*take)(vmm_arena *a, const vmm_request *req, vmm_mapping **out);
} sources[] = {
    {false, from_pool},         /* pool hit: a pooled mapping the reuse policy allows, no driver call */
    {false, from_idle_and_new}, /* assembly: idle handles back to back, new memory only for the rest */
    {false, from_new_memory},   /* new memory: one handle, where nothing is retained */
    {true, from_any_pooled},    /* pooled fallback: any pooled mapping that fits, whatever its size */
    {true, from_idle_padded},   /* padded assembly: idle handles, the last one larger than what is left */
};

static void become_live(vmm_arena *a, vmm_mapping *m, const vmm_request *req) {
  if (m->state != VMM_MAP_LIVE) vmm_mapping_set_state(a, m, VMM_MAP_LIVE);
  m->requested = req->bytes;
  m->stream = req->stream;
  m->tag = req->tag;
  m->scope_id = a->scope == VMM_SCOPE_ACTIVE ? a->scope_id : 0;
  vmm_tag_account(a, req->tag, m->extent, +1);
}

static vmm_status alloc_locked(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (a->deferred_head) vmm_process_deferred(a);
  char refusal[sizeof a->last_error];
  bool refused = false;
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    if (sources[i].after_refusal && !refused) continue;
    vmm_status st = sources[i].take(a, req, out);
    if (st == VMM_OK) {
      become_live(a, *out, req);
      return VMM_OK;
    }
    if (st == NOTHING) continue;
    if (st != VMM_ERR_OUT_OF_MEMORY) return st;
    if (!refused) memcpy(refusal, a->last_error, sizeof refusal);
    refused = true;
  }
  vmm_assert(refused);
  if (!pooling(a, req)) {
    memcpy(a->last_error, refusal, sizeof refusal);
    return VMM_ERR_OUT_OF_MEMORY;
  }
  char b[2][32];
  return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s; no pooled mapping fits (pool %zu mappings, %s; %zu idle handles, %s)",
                  refusal, a->store.pool.count, vmm_fmt_bytes(a->store.pool.bytes, b[0]), a->store.unmapped_count,
                  vmm_fmt_bytes(a->store.unmapped_bytes, b[1]));
}

vmm_status vmm_arena_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream stream, void **out) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st;
  vmm_request req = {bytes, 0, kind, stream, vmm_tag_current_id()};
  vmm_mapping *m = NULL;
  if (!out) {
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: NULL out-pointer (%zu bytes requested)", bytes);
  } else if ((unsigned)kind >= VMM_KIND_COUNT) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: unknown kind %d", (int)kind);
  } else if (bytes == 0) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: 0 bytes requested (%s)", vmm_kind_name(kind));
  } else if (bytes > VMM_MAX_ALLOC) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT,
                  "vmm_arena_alloc: %zu bytes (%s) is more than the %zu-byte virtual address space", bytes,
                  vmm_kind_name(kind), VMM_MAX_ALLOC);
  } else {
    *out = NULL;
    req.rounded = vmm_round_up(a, bytes);
    st = alloc_locked(a, &req, &m);
    if (st == VMM_OK) {
      a->allocs++;
      *out = (void *)(uintptr_t)m->base;
    }
  }
  vmm_trace_arena_op(a, VMM_TRACE_ALLOC, (unsigned)kind < VMM_KIND_COUNT ? (int)kind : -1, bytes, req.rounded,
                     m && st == VMM_OK ? m->base : 0, stream, req.tag, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Free ---------------------------------------------------------------------------- */

static const char *state_name(vmm_mapping_state s) {
  switch (s) {
  case VMM_MAP_LIVE: return "live";
  case VMM_MAP_POOLED: return "already freed (idle in the pool)";
  case VMM_MAP_FREEING: return "already being freed by another call";
  case VMM_MAP_DEFERRED: return "already freed (waiting for a capture to end)";
  case VMM_MAP_ABANDONED: return "already freed (abandoned by an aborted scope)";
  case VMM_MAP_PAUSED: return "paused";
  }
  return "?";
}

static vmm_status refuse_pointer(vmm_arena *a, CUdeviceptr p, vmm_mapping *m) {
  char b[32];
  if (m)
    return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): %s %s allocation of %zu bytes is %s", (unsigned long long)p,
                    vmm_fmt_bytes(m->extent, b), vmm_kind_name(m->kind), m->requested, state_name(m->state));
  vmm_mapping *c = vmm_table_containing(&a->table, p);
  if (c)
    return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER,
                    "free(0x%llx): interior pointer, %llu bytes into the %s allocation at 0x%llx (%s extent, %zu bytes "
                    "requested); free takes the base pointer",
                    (unsigned long long)p, (unsigned long long)(p - c->base), vmm_kind_name(c->kind),
                    (unsigned long long)c->base, vmm_fmt_bytes(c->extent, b), c->requested);
  return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): not an allocation of the arena of device %d (%zu mappings)",
                  (unsigned long long)p, a->cfg.device, a->table.count);
}

vmm_status vmm_arena_free(vmm_arena *a, void *ptr, CUstream stream) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)ptr;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  vmm_mapping *m = vmm_table_find(&a->table, base);
  size_t extent = 0;
  int kind = -1;
  uint32_t tag = 0;
  if (!ptr) {
    st = vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(NULL): not an allocation");
    goto done;
  }
  if (m && m->state == VMM_MAP_PAUSED) {
    extent = m->extent;
    kind = (int)m->kind;
    tag = m->tag;
    if ((st = vmm_paused_free(a, m)) == VMM_OK) a->frees++;
    goto done;
  }
  if (!m || m->state != VMM_MAP_LIVE) {
    st = refuse_pointer(a, base, m);
    goto done;
  }
  extent = m->extent;
  kind = (int)m->kind;
  tag = m->tag;
  if (a->deferred_head) vmm_process_deferred(a);
  if (vmm_scope_aborted(a, m->scope_id)) {
    vmm_abandon(a, m);
    goto freed;
  }
  if (vmm_retaining(a) && m->kind == VMM_KIND_TRANSIENT) {
    m->stream = stream;
    m->free_epoch = a->epoch;
    if (vmm_pool_push(&a->store.pool, m) == 0) {
      vmm_mapping_set_state(a, m, VMM_MAP_POOLED);
      goto freed;
    }
    /* no memory for a bucket: free it the plain way (unmapped, its handles kept idle) */
  }
  if (vmm_stream_capturing(a, stream)) {
    m->state = VMM_MAP_DEFERRED;
    m->stream = stream;
    m->pool_next = a->deferred_head;
    a->deferred_head = m;
    a->deferred_frees++;
    goto freed;
  }
  m->state = VMM_MAP_FREEING;
  pthread_mutex_unlock(&a->lock);
  CUresult r = VMM_DRV(a, stream_synchronize, stream);
  pthread_mutex_lock(&a->lock);
  m->state = VMM_MAP_LIVE;
  if (r != CUDA_SUCCESS) {
    st = vmm_fail_driver(a, r, VMM_DRV_stream_synchronize, "synchronizing stream %p before freeing 0x%llx", (void *)stream,
                         (unsigned long long)base);
    goto done;
  }
  if (vmm_scope_aborted(a, m->scope_id)) { /* aborted while the stream synchronized, unlocked */
    vmm_abandon(a, m);
    goto freed;
  }
  vmm_tag_account(a, tag, extent, -1);
  a->frees++;
  bool unmapped;
  st = vmm_mapping_retire(a, m, vmm_retaining(a), "free", &unmapped);
  if (!unmapped) {
    /* The unmap failed: the allocation stays live; a later free retries. */
    vmm_tag_account(a, tag, extent, +1);
    a->frees--;
  }
  goto done;
freed:
  vmm_tag_account(a, tag, extent, -1);
  a->frees++;
done:
  vmm_trace_arena_op(a, VMM_TRACE_FREE, kind, 0, extent, base, stream, tag, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_quiesce(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (a->deferred_head) vmm_process_deferred(a);
  CUresult r = VMM_DRV(a, ctx_synchronize);
  if (r != CUDA_SUCCESS) st = vmm_fail_driver(a, r, VMM_DRV_ctx_synchronize, "synchronizing device %d to quiesce", a->cfg.device);
  else a->epoch++;
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Destroy ------------------------------------------------------------------------- */

void vmm_arena_destroy(vmm_arena *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  (void)VMM_DRV(a, ctx_synchronize);
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) vmm_mapping_destroy_record(a, m);
  vmm_store_destroy(a);
  for (size_t i = 0; i < a->stuck_count; i++) {
    CUresult r = VMM_DRV(a, mem_unmap, a->stuck[i].base, a->stuck[i].size);
    if (r != CUDA_SUCCESS)
      vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemUnmap(0x%llx, %zu) failed again: %s",
              (unsigned long long)a->stuck[i].base, a->stuck[i].size, vmm_cu_error_name(a->drv, r));
  }
  free(a->stuck);
  vmm_table_fini(&a->table);
  vmm_ranges_fini(a);
  if (a->order_event) (void)VMM_DRV(a, event_destroy, a->order_event);
  vmm_ctx_leave(a);
  if (a->ctx) a->drv->primary_ctx_release(a->dev);
  vmm_trace_close(a->trace);
  free(a->aborted_scopes);
  free(a->tag_bytes);
  free(a->tag_count);
  free(a->tag_paused_bytes);
  free(a->tag_paused_count);
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

vmm_status vmm_arena_trace(vmm_arena *a, const char *path) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  vmm_trace_close(a->trace);
  a->trace = NULL;
  if (path && !(a->trace = vmm_trace_open(path)))
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "trace \"%s\": cannot open for writing: %s", path, strerror(errno));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* A copy taken under the lock into a buffer of the calling thread: stable until this thread's
 * next call, however other threads fail meanwhile. */
const char *vmm_arena_last_error(vmm_arena *a) {
  static __thread char copy[sizeof a->last_error];
  if (!a) return "no arena";
  pthread_mutex_lock(&a->lock);
  memcpy(copy, a->last_error, sizeof copy);
  pthread_mutex_unlock(&a->lock);
  return copy;
}

vmm_status vmm_arena_fatal_error(vmm_arena *a, const char **message) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status s = a->fatal_status;
  if (message) *message = s == VMM_OK ? "" : a->fatal_message;
  pthread_mutex_unlock(&a->lock);
  return s;
}
