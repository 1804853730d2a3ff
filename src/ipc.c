/* Sharing memory between processes (CUDA IPC).
 *
 * Export: in whole-process mode the arena creates its handles exportable as POSIX file
 * descriptors (prop.requestedHandleTypes); a driver that refuses that (cuMemCreate answers
 * NOT_SUPPORTED or NOT_PERMITTED) gets plain handles from then on, and their export is refused.
 * An allocation is one mapping of one or more handles back to back (a page slot lies in its
 * page's one handle): its export is the list of those handles' descriptors with their offsets
 * and sizes. Each handle's descriptor is made at its first export and kept open, in the handle,
 * until the handle goes back to the driver (vmm_handle_release): a receiver duplicates it
 * (pidfd_getfd) while the sender keeps the allocation alive, and exporting the same memory
 * again makes no call and opens nothing more.
 *
 * Import: each descriptor becomes a handle (cuMemImportFromShareableHandle), checked to be of
 * the arena's device, mapped back to back into a VA reservation of its own, given the arena's
 * access. Imports are kept on a list of the arena, apart from its own memory: no counter, free
 * list or mapping record of the arena changes. Every step has its undo, run in reverse on a
 * failure, so a failed import leaves nothing behind. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Memory of another process mapped here: [base, base + size), its handles in address order. */
typedef struct vmm_ipc_import {
  CUdeviceptr base;
  size_t size;
  uint32_t count;                    /* handles */
  uint32_t released;                 /* handles [0, released) went back to the driver (a close resumes) */
  size_t mapped;                     /* bytes mapped from base */
  CUmemGenericAllocationHandle *handles;
  size_t *sizes;
  struct vmm_ipc_import *next;
} vmm_ipc_import;

static bool ipc_supported(const vmm_arena *a) { return a->drv->version >= 4; }

void vmm_ipc_init(vmm_arena *a) {
  if (vmm_policy_of(a)->exports_handles && ipc_supported(a)) a->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

int vmm_arena_ipc_exportable(vmm_arena *a) {
  if (!a) return 0;
  pthread_mutex_lock(&a->lock);
  int on = a->prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  pthread_mutex_unlock(&a->lock);
  return on;
}

/* ---- Export ------------------------------------------------------------------------- */

/* The live mapping that the allocation or slot at p lies in, and p's offset in it; NULL
 * (recorded) when p starts none. */
static vmm_mapping *shared_mapping(vmm_arena *a, CUdeviceptr p, size_t *offset) {
  uint32_t slot;
  vmm_page *pg = p ? vmm_pages_slot_of(a, p, &slot) : NULL;
  vmm_mapping *m = pg ? pg->m : vmm_table_find(&a->table, p);
  if (m && (pg || !m->page) && m->state == VMM_MAP_LIVE) {
    *offset = (size_t)(p - m->base);
    return m;
  }
  char b[32];
  if (m && !m->page)
    vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "ipc_export(0x%llx): the %s allocation of %s there is %s, not live",
             (unsigned long long)p, vmm_errors_kind_name(m->kind), vmm_errors_fmt_bytes(m->extent, b),
             m->state == VMM_MAP_PAUSED ? "paused (it holds no memory)" : "freed");
  else if ((m = p ? vmm_table_containing(&a->table, p) : NULL) != NULL)
    vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER,
             "ipc_export(0x%llx): interior pointer, %llu bytes into the %s mapping at 0x%llx (%s); export takes "
             "the address allocated",
             (unsigned long long)p, (unsigned long long)(p - m->base), vmm_errors_kind_name(m->kind),
             (unsigned long long)m->base, vmm_errors_fmt_bytes(m->extent, b));
  else
    vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "ipc_export(0x%llx): not an allocation of the arena of device %d (%zu mappings)",
             (unsigned long long)p, a->cfg.device, a->table.count);
  return NULL;
}

static vmm_status export_locked(vmm_arena *a, CUdeviceptr p, vmm_ipc_piece *pieces, size_t cap, size_t *count,
                                size_t *offset) {
  if (!pieces || !count || !offset)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_export(0x%llx): NULL pieces, count or offset", (unsigned long long)p);
  if (!ipc_supported(a))
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_export: the driver table \"%s\" is version %u, export needs 4",
                    a->drv->name, a->drv->version);
  size_t at;
  vmm_mapping *m = shared_mapping(a, p, &at);
  if (!m) return VMM_ERR_UNKNOWN_POINTER;
  *count = m->handle_count;
  if (cap < m->handle_count)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_export(0x%llx): room for %zu pieces, the allocation has %u handles",
                    (unsigned long long)p, cap, m->handle_count);
  size_t off = 0;
  for (uint32_t i = 0; i < m->handle_count; i++) {
    vmm_handle *h = m->handles[i];
    if (!h->ipc_fd) {
      int fd = -1;
      CUresult r = VMM_DRV(a, mem_export_to_shareable_handle, &fd, h->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (r != CUDA_SUCCESS || fd < 0) {
        for (uint32_t j = 0; j < i; j++) /* the descriptors this call made: undone */
          if (m->handles[j]->ipc_fd && !pieces[j].fd) vmm_ipc_forget_handle(m->handles[j]);
        char b[32];
        return vmm_errors_fail(a, VMM_ERR_DRIVER,
                        "ipc_export(0x%llx): handle %u of %u (%s) could not be exported as a file descriptor: %s "
                        "returned %s (%d)%s; nothing was exported",
                        (unsigned long long)p, i + 1, m->handle_count, vmm_errors_fmt_bytes(h->size, b),
                        vmm_driver_entry_name(VMM_DRV_mem_export_to_shareable_handle), vmm_errors_cu_name(a, r), (int)r,
                        a->prop.requestedHandleTypes ? ""
                                                     : " (the driver refused exportable memory: it is created plain)");
      }
      h->ipc_fd = fd + 1;
      pieces[i].fd = 0; /* marks it new for the undo above */
    } else {
      pieces[i].fd = 1;
    }
    pieces[i].offset = off;
    pieces[i].size = h->size;
    off += h->size;
  }
  for (uint32_t i = 0; i < m->handle_count; i++) pieces[i].fd = m->handles[i]->ipc_fd - 1;
  *offset = at;
  return VMM_OK;
}

vmm_status vmm_arena_ipc_export(vmm_arena *a, void *ptr, vmm_ipc_piece *pieces, size_t cap, size_t *count,
                                size_t *offset) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = export_locked(a, (CUdeviceptr)(uintptr_t)ptr, pieces, cap, count, offset);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Import ------------------------------------------------------------------------- */

static void import_free(vmm_ipc_import *im) {
  if (!im) return;
  free(im->handles);
  free(im->sizes);
  free(im);
}

/* Takes an import apart from where it got to: unmap, release its handles, free its VA. Returns
 * the first failure (the import then keeps what is left, for a later call); during destroy it
 * logs failures and carries on. */
static vmm_status import_undo(vmm_arena *a, vmm_ipc_import *im, uint32_t imported, bool reserved, const char *what) {
  CUresult r;
  if (im->mapped) {
    r = VMM_DRV(a, mem_unmap, im->base, im->mapped);
    if (r != CUDA_SUCCESS && !a->destroying)
      return vmm_errors_fail(a, VMM_ERR_DRIVER, "%s: unmapping the import at 0x%llx (%zu bytes): cuMemUnmap returned %s (%d)",
                      what, (unsigned long long)im->base, im->mapped, vmm_errors_cu_name(a, r), (int)r);
    im->mapped = 0;
  }
  for (; im->released < imported; im->released++) {
    r = VMM_DRV(a, mem_release, im->handles[im->released]);
    if (r != CUDA_SUCCESS && !a->destroying)
      return vmm_errors_fail(a, VMM_ERR_DRIVER, "%s: releasing handle %u of the import at 0x%llx: cuMemRelease returned %s (%d)",
                      what, im->released + 1, (unsigned long long)im->base, vmm_errors_cu_name(a, r), (int)r);
  }
  if (reserved) {
    r = VMM_DRV(a, mem_address_free, im->base, im->size);
    if (r != CUDA_SUCCESS && !a->destroying)
      return vmm_errors_fail(a, VMM_ERR_DRIVER, "%s: freeing the VA of the import at 0x%llx (%zu bytes): cuMemAddressFree "
                      "returned %s (%d)", what, (unsigned long long)im->base, im->size, vmm_errors_cu_name(a, r), (int)r);
    im->base = 0;
  }
  return VMM_OK;
}

/* Checks the pieces: back to back from 0, granularity multiples; their total in *total. */
static vmm_status check_pieces(vmm_arena *a, const vmm_ipc_piece *pieces, size_t count, size_t *total) {
  if (!pieces || count == 0 || count > UINT32_MAX)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_import: %zu pieces%s", count, pieces ? "" : " (NULL)");
  size_t off = 0;
  for (size_t i = 0; i < count; i++) {
    const vmm_ipc_piece *p = &pieces[i];
    if (p->offset != off || p->size == 0 || p->size % a->granularity || p->size > ((size_t)1 << 47) || p->fd < 0)
      return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                      "ipc_import: piece %zu of %zu (descriptor %d, offset %zu, %zu bytes) is not the next one back "
                      "to back (offset %zu) of a multiple of the granularity %zu",
                      i + 1, count, p->fd, p->offset, p->size, off, a->granularity);
    off += p->size;
  }
  *total = off;
  return VMM_OK;
}

/* Imports each piece's descriptor as a handle of the arena's device; *imported counts those
 * imported (to release on failure). */
static vmm_status import_handles(vmm_arena *a, vmm_ipc_import *im, const vmm_ipc_piece *pieces, size_t count,
                                 uint32_t *imported) {
  char b[32];
  for (*imported = 0; *imported < count; ++*imported) {
    uint32_t i = *imported;
    const vmm_ipc_piece *p = &pieces[i];
    CUresult r = VMM_DRV(a, mem_import_from_shareable_handle, &im->handles[i], (void *)(intptr_t)p->fd,
                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS)
      return vmm_errors_fail(a, r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_INVALID_ARGUMENT,
                      "ipc_import: descriptor %d (piece %u of %zu, %s) is not a handle this process can import: "
                      "cuMemImportFromShareableHandle returned %s (%d) (forged, stale or closed?)",
                      p->fd, i + 1, count, vmm_errors_fmt_bytes(p->size, b), vmm_errors_cu_name(a, r), (int)r);
    im->sizes[i] = p->size;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    r = VMM_DRV(a, mem_get_allocation_properties_from_handle, &prop, im->handles[i]);
    if (r != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != a->cfg.device) {
      ++*imported; /* this one is released by the undo too */
      if (r != CUDA_SUCCESS)
        return vmm_errors_fail(a, VMM_ERR_DRIVER, "ipc_import: reading the properties of piece %u of %zu: "
                        "cuMemGetAllocationPropertiesFromHandle returned %s (%d)",
                        i + 1, count, vmm_errors_cu_name(a, r), (int)r);
      return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                      "ipc_import: piece %u of %zu (descriptor %d) is memory of device %d (location type %d), not "
                      "of this arena's device %d",
                      i + 1, count, p->fd, prop.location.id, (int)prop.location.type, a->cfg.device);
    }
  }
  return VMM_OK;
}

/* Maps the imported handles back to back into the reserved range and gives the arena's access. */
static vmm_status map_pieces(vmm_arena *a, vmm_ipc_import *im, const vmm_ipc_piece *pieces, size_t count) {
  char b[32];
  for (uint32_t i = 0; i < count; i++) {
    CUresult r = VMM_DRV(a, mem_map, im->base + pieces[i].offset, pieces[i].size, 0, im->handles[i], 0);
    if (r != CUDA_SUCCESS)
      return vmm_errors_fail(a, r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_INVALID_ARGUMENT,
                      "ipc_import: piece %u of %zu (descriptor %d) could not be mapped as %s: cuMemMap returned %s "
                      "(%d) (is the handle not of that size?)",
                      i + 1, count, pieces[i].fd, vmm_errors_fmt_bytes(pieces[i].size, b), vmm_errors_cu_name(a, r), (int)r);
    im->mapped += pieces[i].size;
  }
  CUresult r = VMM_DRV(a, mem_set_access, im->base, im->size, a->access, a->access_count);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail(a, r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER,
                    "ipc_import: giving device %d access to %s: cuMemSetAccess returned %s (%d)", a->cfg.device,
                    vmm_errors_fmt_bytes(im->size, b), vmm_errors_cu_name(a, r), (int)r);
  return VMM_OK;
}

static vmm_status import_locked(vmm_arena *a, const vmm_ipc_piece *pieces, size_t count, void **base) {
  size_t total = 0;
  vmm_status st = check_pieces(a, pieces, count, &total);
  if (st != VMM_OK) return st;
  if (!ipc_supported(a))
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_import: the driver table \"%s\" is version %u, import needs 4",
                    a->drv->name, a->drv->version);
  vmm_ipc_import *im = calloc(1, sizeof *im);
  if (im) im->handles = calloc(count, sizeof *im->handles), im->sizes = calloc(count, sizeof *im->sizes);
  if (!im || !im->handles || !im->sizes) {
    import_free(im);
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "ipc_import: no host memory for a record of %zu pieces", count);
  }
  im->count = (uint32_t)count;
  im->size = total;
  uint32_t imported = 0;
  bool reserved = false;
  st = import_handles(a, im, pieces, count, &imported);
  if (st == VMM_OK) {
    CUresult r = VMM_DRV(a, mem_address_reserve, &im->base, total, a->granularity, 0, 0);
    char b[32];
    if (r != CUDA_SUCCESS)
      st = vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "ipc_import: no VA for %s: cuMemAddressReserve returned %s (%d)",
                    vmm_errors_fmt_bytes(total, b), vmm_errors_cu_name(a, r), (int)r);
    reserved = r == CUDA_SUCCESS;
  }
  if (st == VMM_OK) st = map_pieces(a, im, pieces, count);
  if (st == VMM_OK) {
    im->next = a->ipc_imports;
    a->ipc_imports = im;
    *base = (void *)(uintptr_t)im->base;
    return VMM_OK;
  }
  char kept[768];
  snprintf(kept, sizeof kept, "%s", a->last_error);
  if (import_undo(a, im, imported, reserved, "ipc_import (undo)") != VMM_OK) {
    vmm_errors_log(1, a->cfg.log_level, "vmmarena: %s; the import's undo failed too, its pieces are kept: %s", kept,
            a->last_error);
    im->count = imported;      /* what is left: a close or destroy finishes the undo */
    im->next = a->ipc_imports;
    a->ipc_imports = im;
  } else {
    import_free(im);
  }
  vmm_errors_fail(a, st, "%s", kept);
  return st;
}

vmm_status vmm_arena_ipc_import(vmm_arena *a, const vmm_ipc_piece *pieces, size_t count, void **base) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st;
  if (!base)
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "ipc_import: NULL base");
  else
    *base = NULL, st = import_locked(a, pieces, count, base);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_ipc_close(vmm_arena *a, void *base) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)base;
  pthread_mutex_lock(&a->lock);
  vmm_ipc_import **at = &a->ipc_imports;
  while (*at && (*at)->base != p) at = &(*at)->next;
  vmm_status st = VMM_OK;
  vmm_ipc_import *im = *at;
  if (!im || !p) {
    st = vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "ipc_close(0x%llx): not an open import of the arena of device %d",
                  (unsigned long long)p, a->cfg.device);
  } else {
    CUresult r = im->mapped ? VMM_DRV(a, ctx_synchronize) : CUDA_SUCCESS; /* work may still read it */
    if (r != CUDA_SUCCESS)
      st = vmm_errors_fail(a, VMM_ERR_DRIVER, "ipc_close(0x%llx): waiting for the device's work: cuCtxSynchronize returned "
                    "%s (%d); the import stays open", (unsigned long long)p, vmm_errors_cu_name(a, r), (int)r);
    else
      st = import_undo(a, im, im->count, true, "ipc_close");
    if (st == VMM_OK) {
      *at = im->next;
      import_free(im);
    }
  }
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

size_t vmm_arena_ipc_imports(vmm_arena *a) {
  if (!a) return 0;
  pthread_mutex_lock(&a->lock);
  size_t n = 0;
  for (vmm_ipc_import *im = a->ipc_imports; im; im = im->next) n++;
  pthread_mutex_unlock(&a->lock);
  return n;
}

void vmm_ipc_fini(vmm_arena *a) {
  while (a->ipc_imports) {
    vmm_ipc_import *im = a->ipc_imports;
    a->ipc_imports = im->next;
    (void)import_undo(a, im, im->count, im->base != 0, "destroy");
    import_free(im);
  }
}
