/* Mapping records and handles: creation, the one state transition, and the one retire
 * (unmap whole, then dispose: leave the table and the range, keep the handles idle or release
 * them). Record before unmap: a record leaves the table only after its unmap succeeded. */
#include <stdlib.h>

#include "internal.h"

vmm_mapping *vmm_mapping_new(uint32_t handles) {
  vmm_mapping *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->handles = &m->first;
  if (handles > 1 && !(m->handles = calloc(handles, sizeof *m->handles))) {
    free(m);
    return NULL;
  }
  return m;
}

void vmm_mapping_free(vmm_mapping *m) {
  if (!m) return;
  vmm_backup_free(m->backup, m->extent);
  if (m->handles != &m->first) free(m->handles);
  free(m);
}

vmm_handle *vmm_handle_new(CUmemGenericAllocationHandle h, size_t size, vmm_kind kind) {
  vmm_handle *x = calloc(1, sizeof *x);
  if (x) x->h = h, x->size = size, x->kind = kind;
  return x;
}

int vmm_mapping_by_base(const void *x, const void *y) {
  CUdeviceptr a = (*(vmm_mapping *const *)x)->base, b = (*(vmm_mapping *const *)y)->base;
  return a < b ? -1 : a > b;
}

void vmm_mapping_set_state(vmm_arena *a, vmm_mapping *m, vmm_mapping_state s) {
  vmm_stat_add(a, m->kind, m->state, m->extent, -1);
  m->state = s;
  vmm_stat_add(a, m->kind, m->state, m->extent, +1);
}

vmm_status vmm_mapping_unmap(vmm_arena *a, vmm_mapping *m, const char *what) {
  CUresult r = VMM_DRV(a, mem_unmap, m->base, m->extent);
  if (r != CUDA_SUCCESS) {
    char b[32];
    return vmm_fail_driver(a, r, VMM_DRV_mem_unmap, "%s: unmapping %s %s at 0x%llx", what, vmm_kind_name(m->kind),
                           vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  }
  a->mapped_bytes -= m->extent;
  return VMM_OK;
}

vmm_status vmm_handle_release(vmm_arena *a, vmm_handle *h) {
  CUresult r = VMM_DRV(a, mem_release, h->h);
  if (r == CUDA_SUCCESS) {
    a->physical_bytes -= h->size;
    free(h);
    return VMM_OK;
  }
  vmm_idle_put(a, h);
  char b[32];
  return vmm_fail_driver(a, r, VMM_DRV_mem_release, "releasing a %s handle of %s", vmm_kind_name(h->kind),
                         vmm_fmt_bytes(h->size, b));
}

vmm_status vmm_mapping_drop_handles(vmm_arena *a, vmm_mapping *m, bool retain) {
  vmm_status st = VMM_OK;
  for (uint32_t i = 0; i < m->handle_count; i++) {
    vmm_handle *h = m->handles[i];
    if (!h) continue; /* taken by an assembly */
    h->kind = m->kind;
    if (retain) {
      vmm_idle_put(a, h);
    } else {
      vmm_status s = vmm_handle_release(a, h);
      if (st == VMM_OK) st = s;
    }
  }
  if (m->handles != &m->first) free(m->handles);
  m->handles = &m->first;
  m->first = NULL;
  m->handle_count = 0;
  return st;
}

vmm_status vmm_mapping_dispose(vmm_arena *a, vmm_mapping *m, bool retain) {
  vmm_stat_add(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  vmm_ranges_free(a, m->base, m->extent, m->reservation);
  vmm_status st = vmm_mapping_drop_handles(a, m, retain);
  vmm_mapping_free(m);
  return st;
}

vmm_status vmm_mapping_retire(vmm_arena *a, vmm_mapping *m, bool retain, const char *what, bool *unmapped) {
  vmm_status st = vmm_mapping_unmap(a, m, what);
  *unmapped = st == VMM_OK;
  return st == VMM_OK ? vmm_mapping_dispose(a, m, retain) : st;
}

void vmm_mapping_destroy_record(vmm_arena *a, vmm_mapping *m) {
  CUresult r = m->handle_count ? VMM_DRV(a, mem_unmap, m->base, m->extent) : CUDA_SUCCESS; /* paused: nothing mapped */
  if (r != CUDA_SUCCESS)
    vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemUnmap(0x%llx, %zu) failed: %s", (unsigned long long)m->base,
            m->extent, vmm_cu_error_name(a->drv, r));
  for (uint32_t i = 0; i < m->handle_count; i++) {
    r = VMM_DRV(a, mem_release, m->handles[i]->h);
    if (r != CUDA_SUCCESS)
      vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemRelease failed: %s", vmm_cu_error_name(a->drv, r));
    free(m->handles[i]);
  }
  vmm_mapping_free(m);
}
