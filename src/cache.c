/* The cache of whole-process mode: given back to the driver on request (empty_cache), graph
 * pools released, and the peaks of the usage figures reset. */
#include <string.h>

#include "internal.h"

vmm_status vmm_arena_empty_cache(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  uint64_t held = a->physical_bytes;
  vmm_status st = vmm_policy_of(a)->holds_until_finish ? VMM_OK : vmm_arena_release_cache(a, "vmm_arena_empty_cache", true);
  /* the bytes released: nothing is created while the cache is emptied */
  vmm_trace_arena_op(a, VMM_TRACE_EMPTY_CACHE, -1, 0, held - a->physical_bytes, 0, NULL, 0, VMM_POOL_SHARED, st);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* The pool's pooled mappings join the shared cache. */
static void share_graph_pool(vmm_arena *a, vmm_pool_id pool) {
  for (vmm_bucket *b = vmm_store_pool_bucket_near(&a->store.pool, SIZE_MAX, false); b;
       b = vmm_store_pool_bucket_near(&a->store.pool, b->size - 1, false))
    for (vmm_mapping *m = b->head; m; m = m->pool_next)
      if (m->graph_pool == pool) m->graph_pool = VMM_POOL_SHARED;
}

/* The ranges the pool kept of allocations freed while paused go back (nothing is mapped there). */
static vmm_status free_kept(vmm_arena *a, vmm_pool_id pool) {
  vmm_status st = VMM_OK;
  for (bool again = true; again && st == VMM_OK;) {
    again = false;
    vmm_mapping *m;
    vmm_table_foreach(&a->table, i, m) if (vmm_mapping_kept(m) && m->graph_pool == pool) {
      st = vmm_mapping_end_paused(a, m, vmm_policy_of(a)->keeps_frees); /* changes the table: look again */
      again = true;
      break;
    }
  }
  return st;
}

vmm_status vmm_arena_release_pool(vmm_arena *a, vmm_pool_id pool) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (pool == VMM_POOL_SHARED)
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "release_pool: the shared pool is never released");
  else if ((st = vmm_order_quiesce(a)) != VMM_OK) /* its graph's last replay must be over first */
    ;                                         /* the pool stays as it was */
  else if (vmm_ids_add(&a->released_graph_pools, pool))
    st = vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "release_pool(%llu): host out of memory; the pool stays",
                  (unsigned long long)pool);
  else
    share_graph_pool(a, pool), vmm_retiring_release_graph_pool(a, pool), st = free_kept(a, pool);
  vmm_trace_arena_op(a, VMM_TRACE_RELEASE_POOL, -1, 0, 0, 0, NULL, 0, pool, st);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_reset_peaks(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  a->allocated_peak = a->allocated_bytes;
  a->allocations_peak = a->allocations;
  a->physical_peak = a->physical_bytes;
  a->mapped_peak = a->mapped_bytes;
  pthread_mutex_unlock(&a->lock);
  return VMM_OK;
}
