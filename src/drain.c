/* Draining the store: the memory cached in the pool and the idle tier given back to the
 * driver, by vmm_retention_finish, vmm_arena_empty_cache and a request that finds new memory
 * refused in whole-process mode. First the frees a capture deferred, once it is over, join the
 * pool (or are unmapped after a wait, where frees do not pool), then the pool's streams are
 * waited for (touching nothing more), then the ranges retiring are unmapped once their streams are waited for, then the pool is
 * drained by one stated order through one operation (pop, then unmap), then the idle handles
 * are released. The pooled memory of a graph's pool stays until PyTorch releases the pool:
 * the graph's replays use it. A failure stops where it is; a later call resumes. */
#include <string.h>

#include "internal.h"

vmm_status vmm_drain_wait(vmm_arena *a, const char *what) {
  CUstream waited[16];
  size_t n_waited = 0;
  for (vmm_bucket *b = vmm_store_pool_bucket_near(&a->store.pool, SIZE_MAX, false); b;
       b = vmm_store_pool_bucket_near(&a->store.pool, b->size - 1, false)) /* largest first; sizes are >= 1 granule */
    for (vmm_mapping *m = b->head; m; m = m->pool_next) {
      vmm_status st = m->graph_pool == VMM_POOL_SHARED ? vmm_order_wait_for_free(a, m, what, waited, &n_waited, 16) : VMM_OK;
      if (st != VMM_OK) return st;
    }
  return VMM_OK;
}

static vmm_status drain_one(vmm_arena *a, vmm_mapping *m, const char *what) {
  vmm_store_pool_remove(&a->store.pool, m);
  vmm_status st = vmm_mapping_unmap(a, m, what);
  if (st == VMM_OK) return vmm_mapping_end_unmapped(a, m, true, VMM_NO_STUCK), VMM_OK;
  vmm_store_pool_push(&a->store.pool, m); /* the bucket it left is on the spare list: cannot fail */
  char cause[sizeof a->last_error], b[32];
  memcpy(cause, a->last_error, sizeof cause);
  return vmm_errors_fail(a, st, "%s (%zu mappings left in the pool, %s)", cause, a->store.pool.count,
                  vmm_errors_fmt_bytes(a->store.pool.bytes, b));
}

vmm_status vmm_drain_pool(vmm_arena *a, const char *what) {
  for (vmm_bucket *b = vmm_store_pool_bucket_near(&a->store.pool, SIZE_MAX, false); b;) {
    size_t size = b->size; /* b goes once its last mapping does */
    for (vmm_mapping *m = b->head, *next; m; m = next) {
      next = m->pool_next;
      if (m->graph_pool != VMM_POOL_SHARED) continue; /* a live graph's: its replays use it */
      vmm_status st = drain_one(a, m, what);
      if (st != VMM_OK) return st;
    }
    b = vmm_store_pool_bucket_near(&a->store.pool, size - 1, false);
  }
  return VMM_OK;
}

vmm_status vmm_drain_all(vmm_arena *a, const char *what) {
  vmm_status st;
  vmm_order_process_deferred(a); /* before the wait: the pool's streams then include theirs */
  if ((st = vmm_drain_wait(a, what)) != VMM_OK) return st; /* nothing more touched */
  if ((st = vmm_retiring_drain(a, what)) != VMM_OK) return st;
  if ((st = vmm_drain_pool(a, what)) != VMM_OK) return st;
  return vmm_drain_idle(a, what);
}

vmm_status vmm_drain_idle(vmm_arena *a, const char *what) {
  vmm_handle *h;
  while ((h = vmm_store_idle_largest(a)) != NULL) {
    vmm_store_idle_remove(a, h);
    vmm_status st = vmm_handle_release(a, h);
    if (st != VMM_OK) {
      char cause[sizeof a->last_error];
      memcpy(cause, a->last_error, sizeof cause);
      return vmm_errors_fail(a, st, "%s: %s (%zu idle handles left)", what, cause, a->store.idle_count);
    }
  }
  return VMM_OK;
}
