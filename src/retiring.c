/* Retiring ranges: the old range of a pooled mapping whose handles an assembly mapped into a
 * new range before the work of its free was known complete (whole-process mode). The handles
 * serve the new range at once, ordered after that work on the device; the old range stays
 * mapped, used by nothing new, until that work completes, and is then unmapped and freed. So a
 * request never waits on the host for cached memory, and never creates memory it could reuse.
 * The old range of a graph's pooled mapping retires only once the pool is released: the
 * graph's replays still use that address. */
#include <stdlib.h>

#include "internal.h"

int vmm_retiring_reserve(vmm_arena *a, size_t n) {
  vmm_retiring *r = &a->retiring;
  if (r->count + n <= r->cap) return 0;
  size_t cap = r->cap ? r->cap : 8;
  while (cap < r->count + n) cap *= 2;
  vmm_retiring_range *grown = realloc(r->items, cap * sizeof *grown);
  if (!grown) return -1;
  r->items = grown;
  r->cap = cap;
  return 0;
}

void vmm_retiring_add(vmm_arena *a, const vmm_retiring_range *range) {
  vmm_retiring *r = &a->retiring;
  vmm_assert(r->count < r->cap); /* vmm_retiring_reserve came first */
  r->items[r->count++] = *range;
  r->bytes += range->size;
  r->handed_over++;
}

/* Unmaps item i and frees its range; a failed unmap keeps the range stuck (unmapped at
 * destroy), as an undo's failure does. Item i is replaced by the last. */
static void unmap_one(vmm_arena *a, size_t i, const char *what) {
  vmm_retiring *r = &a->retiring;
  vmm_retiring_range x = r->items[i];
  r->items[i] = r->items[--r->count];
  r->bytes -= x.size;
  free(x.work.uses);
  CUresult res = VMM_DRV(a, mem_unmap, x.base, x.size);
  if (res == CUDA_SUCCESS) {
    vmm_ranges_free(a, x.base, x.size, x.reservation);
    return;
  }
  vmm_log(1, a->cfg.log_level, "vmmarena: %s: unmapping the retiring range 0x%llx+%zu failed: %s; it stays mapped",
          what, (unsigned long long)x.base, x.size, vmm_cu_error_name(a, res));
  vmm_ranges_keep_stuck(a, x.base, x.size);
}

void vmm_retiring_settle(vmm_arena *a) {
  vmm_retiring *r = &a->retiring;
  for (size_t i = r->count; i-- > 0;) /* a graph's range waits for its pool's release */
    if (r->items[i].pool == VMM_POOL_SHARED && vmm_work_complete(a, &r->items[i].work)) unmap_one(a, i, "settling");
}

void vmm_retiring_release_pool(vmm_arena *a, vmm_pool_id pool) {
  vmm_retiring *r = &a->retiring;
  for (size_t i = r->count; i-- > 0;)
    if (r->items[i].pool == pool) unmap_one(a, i, "release_pool");
}

/* Waits for stream s unless it captures (*skipped then). */
static vmm_status wait_stream(vmm_arena *a, CUstream s, const char *what, bool *skipped) {
  bool capturing;
  vmm_driver_entry e = VMM_DRV_stream_is_capturing;
  CUresult res = vmm_capture_query(a, s, &capturing);
  if (res == CUDA_SUCCESS && capturing) *skipped = true;
  if (res == CUDA_SUCCESS && !capturing) e = VMM_DRV_stream_synchronize, res = VMM_DRV(a, stream_synchronize, s);
  if (res == CUDA_SUCCESS) return VMM_OK;
  return vmm_fail_driver(a, res, e, "%s: waiting for stream %p before unmapping a retiring range", what, (void *)s);
}

vmm_status vmm_retiring_drain(vmm_arena *a, const char *what) {
  vmm_retiring *r = &a->retiring;
  for (size_t i = r->count; i-- > 0;) {
    vmm_free_work *w = &r->items[i].work;
    if (r->items[i].pool != VMM_POOL_SHARED) continue; /* a live graph's: its replays use it */
    bool skipped = false;
    vmm_status st = w->epoch < a->epoch ? VMM_OK : wait_stream(a, w->stream, what, &skipped);
    for (uint32_t k = 0; k < w->use_count && st == VMM_OK && w->epoch >= a->epoch; k++)
      st = wait_stream(a, w->uses[k], what, &skipped);
    if (st != VMM_OK) return st;
    if (!skipped) unmap_one(a, i, what);
  }
  return VMM_OK;
}

void vmm_retiring_fini(vmm_arena *a) {
  vmm_retiring *r = &a->retiring;
  while (r->count) unmap_one(a, r->count - 1, "destroy");
  free(r->items);
  r->items = NULL;
  r->cap = 0;
}
