/* Allocate and free: the public entry points. The arguments are checked, the operation traced
 * and counted; a request below half the granularity is a slot of a page in whole-process mode
 * (pages.c), any other a whole mapping (arena.c). */
#include "internal.h"

#define VMM_MAX_ALLOC ((size_t)1 << 47) /* 128 TiB: more than any device's VA space */
#define NOTHING VMM_STATUS_COUNT

static bool carved(const vmm_arena *a, size_t bytes) { return vmm_policy_of(a)->carves_pages && bytes <= a->granularity / 2; }

/* The live allocations and their bytes, with their peaks (vmm_usage). */
static void count_allocation(vmm_arena *a, size_t bytes, int sign) {
  a->allocated_bytes += (uint64_t)((int64_t)sign * (int64_t)bytes);
  a->allocations += (uint64_t)(int64_t)sign;
  if (a->allocated_bytes > a->allocated_peak) a->allocated_peak = a->allocated_bytes;
  if (a->allocated_bytes > a->live_high_water) a->live_high_water = a->allocated_bytes;
  if (a->allocations > a->allocations_peak) a->allocations_peak = a->allocations;
}

/* A slot for req: from a page of its key with room, else from a page carved now. */
static vmm_status alloc_slot(vmm_arena *a, const vmm_request *req, CUdeviceptr *out, size_t *size) {
  vmm_page_key k = {vmm_pages_slot_size(a->granularity, req->bytes), req->kind, req->tag, req->stream, req->graph_pool};
  *size = k.slot_size;
  vmm_status st = vmm_pages_take(a, &k, out);
  if (st != NOTHING) return st;
  vmm_request page = *req;
  page.bytes = page.rounded = a->granularity;
  page.exact = true;
  vmm_mapping *m;
  if ((st = vmm_arena_alloc_mapping(a, &page, &m)) != VMM_OK) { /* the last resort: slots waiting for events */
    bool ordered = st == VMM_ERR_OUT_OF_MEMORY && vmm_pages_order_waits(a, &k) && vmm_pages_take(a, &k, out) == VMM_OK;
    return ordered ? VMM_OK : st;
  }
  vmm_pages_carve(a, m, &k);
  return vmm_pages_take(a, &k, out);
}

static vmm_status check_request(vmm_arena *a, const vmm_request *req) {
  const char *kind = vmm_errors_kind_name(req->kind);
  if ((unsigned)req->kind >= VMM_KIND_COUNT)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: unknown kind %d", (int)req->kind);
  if (req->bytes == 0) return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: 0 bytes requested (%s)", kind);
  if (req->bytes > VMM_MAX_ALLOC)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                    "vmm_arena_alloc: %zu bytes (%s) is more than the %zu-byte virtual address space", req->bytes, kind,
                    VMM_MAX_ALLOC);
  if (req->graph_pool != VMM_POOL_SHARED && vmm_ids_has(&a->released_graph_pools, req->graph_pool))
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: pool %llu was released (%zu bytes, %s)",
                    (unsigned long long)req->graph_pool, req->bytes, kind);
  return VMM_OK;
}

/* Serves a checked request: *out its address, *size the bytes it holds; req->rounded the
 * request rounded (to the granularity, or to its slot). */
static vmm_status alloc_checked(vmm_arena *a, vmm_request *req, CUdeviceptr *out, size_t *size) {
  req->rounded = vmm_round_up(a, req->bytes);
  if (carved(a, req->bytes)) {
    vmm_status st = alloc_slot(a, req, out, size);
    req->rounded = *size;
    return st;
  }
  vmm_mapping *m;
  vmm_status st = vmm_arena_alloc_mapping(a, req, &m);
  if (st == VMM_OK) *out = m->base, *size = m->extent;
  return st;
}

vmm_status vmm_arena_alloc_in(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream stream, vmm_pool_id pool,
                              void **out) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  CUstreamCaptureMode mode;
  bool relaxed = vmm_order_capture_relax(a, &mode);
  vmm_request req = {bytes, 0, kind, stream, vmm_tag_current_id(), pool};
  CUdeviceptr at = 0;
  size_t size = 0;
  vmm_status st = out ? check_request(a, &req)
                      : vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: NULL out-pointer (%zu bytes requested)",
                                 bytes);
  if (out) *out = NULL;
  if (st == VMM_OK && (st = alloc_checked(a, &req, &at, &size)) == VMM_OK) {
    a->allocs++;
    count_allocation(a, size, +1);
    *out = (void *)(uintptr_t)at;
  }
  vmm_trace_arena_op(a, VMM_TRACE_ALLOC, (unsigned)kind < VMM_KIND_COUNT ? (int)kind : -1, bytes, req.rounded, at,
                     stream, req.tag, pool, st);
  vmm_order_capture_restore(a, relaxed, mode);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream stream, void **out) {
  return vmm_arena_alloc_in(a, bytes, kind, stream, VMM_POOL_SHARED, out);
}

/* Frees a slot; an emptied page goes back as a whole mapping (on the page's stream). */
static vmm_status free_slot(vmm_arena *a, vmm_page *pg, uint32_t slot) {
  vmm_mapping *m = pg->m;
  if (!vmm_pages_give_back(a, pg, slot) || (m->state != VMM_MAP_LIVE && m->state != VMM_MAP_PAUSED)) return VMM_OK;
  return vmm_arena_free_page(a, m);
}

vmm_status vmm_arena_free(vmm_arena *a, void *ptr, CUstream stream) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)ptr;
  pthread_mutex_lock(&a->lock);
  CUstreamCaptureMode mode;
  bool relaxed = vmm_order_capture_relax(a, &mode);
  vmm_status st;
  uint32_t slot;
  vmm_page *pg = ptr ? vmm_pages_slot_of(a, base, &slot) : NULL;
  vmm_mapping *m = pg ? pg->m : vmm_table_find(&a->table, base);
  bool whole = !pg && m && !m->page && vmm_mapping_allocated(m), freed = false;
  size_t size = pg ? pg->set->key.slot_size : whole ? m->extent : 0;
  int kind = pg || whole ? (int)m->kind : -1;
  uint32_t tag = pg || whole ? m->tag : 0;
  if (!ptr) {
    st = vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(NULL): not an allocation");
  } else if (pg) {
    st = free_slot(a, pg, slot);
    freed = true;
  } else if (whole) {
    st = vmm_arena_free_allocation(a, m, stream, &freed);
  } else {
    st = vmm_arena_refuse_pointer(a, base, m);
  }
  if (freed) a->frees++, count_allocation(a, size, -1);
  vmm_trace_arena_op(a, VMM_TRACE_FREE, kind, 0, size, base, stream, tag, VMM_POOL_SHARED, st);
  vmm_order_capture_restore(a, relaxed, mode);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* The live (or paused) allocation at `base`: a slot of a page (*pg, *slot) or a whole mapping
 * (*m); false when there is none (arena lock held). */
static bool find_allocation(vmm_arena *a, CUdeviceptr base, vmm_page **pg, uint32_t *slot, vmm_mapping **m) {
  *pg = base ? vmm_pages_slot_of(a, base, slot) : NULL;
  *m = *pg ? NULL : vmm_table_find(&a->table, base);
  return *pg || (*m && !(*m)->page && vmm_mapping_allocated(*m));
}

vmm_status vmm_arena_record_stream(vmm_arena *a, void *ptr, CUstream stream) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)ptr;
  pthread_mutex_lock(&a->lock);
  uint32_t slot;
  vmm_page *pg;
  vmm_mapping *m;
  vmm_status st = VMM_OK;
  if (!find_allocation(a, base, &pg, &slot, &m))
    st = vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "record_stream(0x%llx, stream %p): not a live allocation of device %d",
                  (unsigned long long)base, (void *)stream, a->cfg.device);
  else if (pg ? vmm_pages_add_use(pg, slot, stream) : vmm_mapping_add_use(m, stream))
    st = vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "record_stream(0x%llx, stream %p): host out of memory; nothing changed",
                  (unsigned long long)base, (void *)stream);
  vmm_trace_arena_op(a, VMM_TRACE_RECORD_STREAM, -1, 0, 0, base, stream, 0, VMM_POOL_SHARED, st);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_allocation_size(vmm_arena *a, void *ptr, size_t *bytes) {
  if (!a || !bytes) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)ptr;
  pthread_mutex_lock(&a->lock);
  uint32_t slot;
  vmm_page *pg;
  vmm_mapping *m;
  vmm_status st = VMM_OK;
  if (!find_allocation(a, base, &pg, &slot, &m))
    st = vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "allocation_size(0x%llx): not a live allocation of device %d",
                  (unsigned long long)base, a->cfg.device);
  else
    *bytes = pg ? pg->set->key.slot_size : m->extent;
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* A capture into `pool` begins (+1) or ends (-1). */
static vmm_status capture(vmm_arena *a, vmm_pool_id pool, int step) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  const char *call = step > 0 ? "capture_begin" : "capture_end";
  if (step > 0 && (pool == VMM_POOL_SHARED || vmm_ids_has(&a->released_graph_pools, pool)))
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s: pool %llu is %s", call, (unsigned long long)pool,
                  pool == VMM_POOL_SHARED ? "the shared pool" : "released");
  else if (step < 0 && !a->captures_underway)
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s: pool %llu: no capture is underway", call, (unsigned long long)pool);
  else
    a->captures_underway += (uint32_t)step;
  vmm_trace_arena_op(a, step > 0 ? VMM_TRACE_CAPTURE_BEGIN : VMM_TRACE_CAPTURE_END, -1, 0, 0, 0, NULL, 0, pool, st);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_capture_begin(vmm_arena *a, vmm_pool_id pool) { return capture(a, pool, +1); }

vmm_status vmm_arena_capture_end(vmm_arena *a, vmm_pool_id pool) { return capture(a, pool, -1); }
