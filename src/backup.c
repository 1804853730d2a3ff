/* Backups of paused allocations (VMM_PAUSE_BACKUP): the host memory that holds a paused
 * allocation's contents, the check that the host can hold it, and the copies into it and back:
 * through the copy engine (copy_engine.c), or with synchronous copies where the driver table
 * (before version 3) or the setting (pause_staging 0) has no staging. */
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* Host memory for a backup: anonymous pages asked to be huge, its start on a 2 MiB boundary
 * (the slack around it unmapped at once), so that the copy into it faults in 2 MiB at a time,
 * a 2 MiB allocation included. Returned to the system whole when the backup is freed, so the
 * process's resident memory goes back to where it was. NULL on failure. */
static void *backup_new(size_t bytes) {
  if (bytes > SIZE_MAX - HUGE_PAGE) return NULL;
  char *p = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  char *start = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (start > p) munmap(p, (size_t)(start - p));
  if (start + bytes < p + bytes + HUGE_PAGE) munmap(start + bytes, (size_t)(p + bytes + HUGE_PAGE - (start + bytes)));
#ifdef MADV_HUGEPAGE
  (void)madvise(start, bytes, MADV_HUGEPAGE); /* a hint: without huge pages the copy is only slower */
#endif
  return start;
}

void vmm_backup_free(void *backup, size_t bytes) {
  if (backup) munmap(backup, bytes);
}

bool vmm_backup_supported(const vmm_arena *a) {
  return a->drv->version >= 2 && a->drv->mem_cpy_dtoh && a->drv->mem_cpy_htod;
}

/* Whether copies go through the staging: the table has its entry points and the setting is on. */
static bool staged(const vmm_arena *a) {
  const struct vmm_driver *d = a->drv;
  return d->version >= 3 && d->mem_host_alloc && d->mem_free_host && d->mem_cpy_dtoh_async && d->mem_cpy_htod_async &&
         d->stream_create && d->stream_destroy && (a->cfg.pause_staging & ~VMM_STAGING_KEEP);
}

vmm_status vmm_backup_admit(vmm_arena *a, size_t bytes, const char *call) {
  size_t available = 0;
  char b[2][32];
  CUresult r = VMM_DRV(a, host_memory_available, &available);
  if (r == CUDA_ERROR_NOT_SUPPORTED || (r == CUDA_SUCCESS && bytes <= available)) return VMM_OK;
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_host_memory_available,
                           "%s: reading host MemAvailable for %s of backups; nothing changed", call,
                           vmm_errors_fmt_bytes(bytes, b[0]));
  return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY,
                  "%s: the host cannot hold the backups: %s (%zu B) to copy, MemAvailable %s (%zu B); nothing changed",
                  call, vmm_errors_fmt_bytes(bytes, b[0]), bytes, vmm_errors_fmt_bytes(available, b[1]), available);
}

/* One synchronous copy per segment (before version 3, or with the staging off). */
static bool copy_plain(vmm_arena *a, const vmm_copy_segment *seg, size_t n, bool to_host, vmm_copy_error *err) {
  for (size_t i = 0; i < n; i++) {
    CUresult r = to_host ? VMM_DRV(a, mem_cpy_dtoh, seg[i].host, seg[i].dev, seg[i].bytes)
                         : VMM_DRV(a, mem_cpy_htod, seg[i].dev, seg[i].host, seg[i].bytes);
    if (r != CUDA_SUCCESS) {
      char b[32];
      vmm_copier_set_error(err, r, to_host ? VMM_DRV_mem_cpy_dtoh : VMM_DRV_mem_cpy_htod,
                         "copying %s %s 0x%llx (allocation %zu of %zu)", vmm_errors_fmt_bytes(seg[i].bytes, b),
                         to_host ? "from" : "back to", (unsigned long long)seg[i].dev, i + 1, n);
      return false;
    }
  }
  return true;
}

static bool copy(vmm_arena *a, const vmm_copy_segment *seg, size_t n, bool to_host, vmm_copy_error *err) {
  return staged(a) ? vmm_copier_run(a, seg, n, to_host, err) : copy_plain(a, seg, n, to_host, err);
}

/* The segments of the n allocations: their ranges and backups[i] (backups NULL: their own). */
static vmm_copy_segment *segments(vmm_mapping *const *list, size_t n, void *const *backups, vmm_copy_error *err) {
  vmm_copy_segment *seg = malloc(n * sizeof *seg);
  if (!seg) {
    vmm_copier_set_error(err, CUDA_SUCCESS, VMM_DRV_ENTRY_COUNT, "host out of memory for the list of %zu copies", n);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    seg[i] = (vmm_copy_segment){list[i]->base, backups ? backups[i] : list[i]->backup, list[i]->extent};
  }
  return seg;
}

bool vmm_backup_save(vmm_arena *a, vmm_mapping *const *list, size_t n, void **out, vmm_copy_error *err) {
  size_t made = 0, bytes = 0;
  char b[2][32];
  for (size_t i = 0; i < n; i++) out[i] = NULL;
  for (; made < n && (out[made] = backup_new(list[made]->extent)) != NULL; made++) bytes += list[made]->extent;
  bool ok = made == n;
  if (!ok)
    vmm_copier_set_error(err, CUDA_SUCCESS, VMM_DRV_ENTRY_COUNT,
                       "host out of memory for a %s backup of 0x%llx (%zu of %zu backups made, %s)",
                       vmm_errors_fmt_bytes(list[made]->extent, b[0]), (unsigned long long)list[made]->base, made, n,
                       vmm_errors_fmt_bytes(bytes, b[1]));
  vmm_copy_segment *seg = ok ? segments(list, n, out, err) : NULL;
  ok = seg && copy(a, seg, n, true, err);
  free(seg);
  for (size_t i = 0; !ok && i < made; i++) {
    vmm_backup_free(out[i], list[i]->extent);
    out[i] = NULL;
  }
  return ok;
}

bool vmm_backup_restore(vmm_arena *a, vmm_mapping *const *list, size_t n, vmm_copy_error *err) {
  vmm_copy_segment *seg = segments(list, n, NULL, err);
  bool ok = seg && copy(a, seg, n, false, err);
  free(seg);
  return ok;
}
