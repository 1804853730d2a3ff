/* Handles: one physical allocation each (cuMemCreate), always mapped whole. This file creates
 * and releases them; the idle store (store.c) files them while no mapping holds them. */
#include <stdlib.h>

#include "internal.h"

vmm_handle *vmm_handle_new(size_t size, vmm_kind kind) {
  vmm_handle *h = calloc(1, sizeof *h);
  if (h) h->size = size, h->kind = kind;
  return h;
}

CUresult vmm_handle_create(vmm_arena *a, vmm_handle *h) {
  CUresult r = VMM_DRV(a, mem_create, &h->h, h->size, &a->prop, 0);
  if (r != CUDA_SUCCESS && vmm_ipc_create_refused(a, r)) r = VMM_DRV(a, mem_create, &h->h, h->size, &a->prop, 0);
  if (r == CUDA_SUCCESS) vmm_accounting_add_physical(a, h->size);
  return r;
}

/* The one release. A failure keeps the handle idle (finish or destroy tries again) and is
 * recorded; while the arena is being destroyed it is logged and the handle forgotten. */
vmm_status vmm_handle_release(vmm_arena *a, vmm_handle *h) {
  vmm_unmapper_wait(a); /* a range still mapping h would keep its memory from the driver */
  vmm_ipc_forget_handle(h); /* its exported descriptor would keep it too */
  CUresult r = VMM_DRV(a, mem_release, h->h);
  if (r == CUDA_SUCCESS || a->destroying) {
    if (r != CUDA_SUCCESS)
      vmm_errors_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemRelease failed: %s", vmm_errors_cu_name(a, r));
    else
      a->physical_bytes -= h->size;
    free(h);
    return VMM_OK;
  }
  vmm_store_idle_put(a, h);
  char b[32];
  return vmm_errors_fail_driver(a, r, VMM_DRV_mem_release, "releasing a %s handle of %s", vmm_errors_kind_name(h->kind),
                         vmm_errors_fmt_bytes(h->size, b));
}

#define VMM_BOUND_SHARE 64             /* an idle handle no request can use costs at most ~1.6% of the peak */
#define VMM_BOUND_MAX ((size_t)256 << 20) /* beyond this, fewer calls gain nothing measurable */

size_t vmm_handle_bound(const vmm_arena *a, size_t fresh) {
  if (a->handle_bound) return a->handle_bound;
  uint64_t peak = a->scope == VMM_SCOPE_ACTIVE ? a->scope_peak : a->physical_bytes;
  if (fresh > peak) peak = fresh; /* a first request larger than all held is not cut finer than 1/64 of it */
  size_t target = (size_t)(peak / VMM_BOUND_SHARE), bound = a->granularity;
  while (bound * 2 <= target && bound * 2 <= VMM_BOUND_MAX) bound *= 2;
  return bound;
}
