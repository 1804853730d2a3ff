/* Backups of paused allocations: host memory that holds a paused allocation's contents
 * (VMM_PAUSE_BACKUP), the copy into it and the copy back. */
#include <sys/mman.h>

#include "internal.h"

/* Host memory for a backup: anonymous pages asked to be huge, so that the copy into it faults
 * in 2 MiB at a time (first-touch faults, not the bus, bound a copy into fresh pageable
 * memory). Returned to the system whole by the resume. NULL on failure. */
static void *backup_alloc(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without huge pages the copy is only slower */
#endif
  return p;
}

void vmm_backup_free(void *backup, size_t bytes) {
  if (backup) munmap(backup, bytes);
}

bool vmm_backup_supported(const vmm_arena *a) {
  return a->drv->version >= 2 && a->drv->mem_cpy_dtoh && a->drv->mem_cpy_htod;
}

vmm_status vmm_backup_save(vmm_arena *a, CUdeviceptr base, size_t bytes, void **out) {
  char b[32];
  void *backup = backup_alloc(bytes);
  *out = NULL;
  if (!backup)
    return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a %s backup of 0x%llx", vmm_fmt_bytes(bytes, b),
                    (unsigned long long)base);
  CUresult r = VMM_DRV(a, mem_cpy_dtoh, backup, base, bytes);
  if (r != CUDA_SUCCESS) {
    vmm_backup_free(backup, bytes);
    return vmm_fail_driver(a, r, VMM_DRV_mem_cpy_dtoh, "copying %s at 0x%llx to host memory", vmm_fmt_bytes(bytes, b),
                           (unsigned long long)base);
  }
  *out = backup;
  return VMM_OK;
}

vmm_status vmm_backup_restore(vmm_arena *a, CUdeviceptr base, const void *backup, size_t bytes) {
  CUresult r = VMM_DRV(a, mem_cpy_htod, base, backup, bytes);
  if (r == CUDA_SUCCESS) return VMM_OK;
  char b[32];
  return vmm_fail_driver(a, r, VMM_DRV_mem_cpy_htod, "copying the backup of %s back to 0x%llx", vmm_fmt_bytes(bytes, b),
                         (unsigned long long)base);
}
