/* Retention scope: begin, finish (drain the pool by pop-then-unmap, then release every idle
 * handle) and abort (no driver call; everything idle becomes abandoned). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

bool vmm_scope_aborted(const vmm_arena *a, uint64_t scope_id) {
  if (scope_id == 0) return false;
  size_t lo = 0, hi = a->aborted_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (a->aborted_scopes[mid] == scope_id) return true;
    if (a->aborted_scopes[mid] < scope_id) lo = mid + 1;
    else hi = mid;
  }
  return false;
}

static vmm_status scope_error(vmm_arena *a, const char *call) {
  if (a->scope == VMM_SCOPE_ACTIVE)
    return vmm_fail(a, VMM_ERR_SCOPE_STATE, "%s: retention scope %llu is already active; scopes do not nest", call,
                    (unsigned long long)a->scope_id);
  return vmm_fail(a, VMM_ERR_SCOPE_STATE, "%s: no retention scope is active (%llu begun, %llu finished, %llu aborted)",
                  call, (unsigned long long)a->scopes_begun, (unsigned long long)a->scopes_finished,
                  (unsigned long long)a->scopes_aborted);
}

/* Runs one scope operation under the arena's lock and traces it. */
static vmm_status scope_call(vmm_arena *a, vmm_trace_op op, vmm_status (*locked)(vmm_arena *a)) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = locked(a);
  vmm_trace_arena_op(a, op, -1, 0, 0, 0, NULL, 0, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

static vmm_status begin_locked(vmm_arena *a) {
  if (a->scope == VMM_SCOPE_ACTIVE) return scope_error(a, "vmm_retention_begin");
  a->scope = VMM_SCOPE_ACTIVE;
  a->scope_id = ++a->next_scope_id;
  a->scope_peak = a->physical_bytes;
  a->scopes_begun++;
  return VMM_OK;
}

vmm_status vmm_retention_begin(vmm_arena *a) { return scope_call(a, VMM_TRACE_BEGIN, begin_locked); }

/* Pops the pool in drain order (largest bucket first, newest first within it) and retires
 * each mapping, keeping its handles idle; a failed unmap pushes the mapping back where it was. */
static vmm_status drain_pool(vmm_arena *a) {
  vmm_mapping *m;
  while ((m = vmm_pool_peek_drain(&a->store.pool)) != NULL) {
    vmm_pool_remove(&a->store.pool, m);
    vmm_status st = vmm_mapping_unmap(a, m, "finish");
    if (st != VMM_OK) {
      vmm_pool_push(&a->store.pool, m); /* the bucket it left is on the spare list: cannot fail */
      char cause[sizeof a->last_error], b[32];
      memcpy(cause, a->last_error, sizeof cause);
      return vmm_fail(a, st, "%s (%zu mappings left in the pool, %s)", cause, a->store.pool.count,
                      vmm_fmt_bytes(a->store.pool.bytes, b));
    }
    vmm_mapping_dispose(a, m, true, VMM_NO_STUCK);
  }
  return VMM_OK;
}

/* Waits, once per stream, for in-flight work that may still use a pooled mapping the drain
 * is about to unmap (see vmm_wait_for_free). Touches nothing. */
static vmm_status wait_for_pool(vmm_arena *a) {
  CUstream waited[16];
  size_t n_waited = 0;
  for (vmm_avl *node = vmm_avl_last(a->store.pool.root); node;) {
    vmm_bucket *b = vmm_container_of(node, vmm_bucket, node);
    for (vmm_mapping *m = b->head; m; m = m->pool_next) {
      vmm_status st = vmm_wait_for_free(a, m, "vmm_retention_finish", waited, &n_waited, 16);
      if (st != VMM_OK) return st;
    }
    node = vmm_avl_floor(a->store.pool.root, b->size - 1, 0);
  }
  return VMM_OK;
}

/* Releases the idle handles, largest first; stops at the first failure (that handle stays idle). */
static vmm_status release_idle(vmm_arena *a) {
  vmm_handle *h;
  while ((h = vmm_idle_largest(a)) != NULL) {
    vmm_idle_remove(a, h);
    vmm_status st = vmm_handle_release(a, h);
    if (st != VMM_OK) {
      char cause[sizeof a->last_error];
      memcpy(cause, a->last_error, sizeof cause);
      return vmm_fail(a, st, "finish: %s (%zu idle handles left)", cause, a->store.idle_count);
    }
  }
  return VMM_OK;
}

/* Validates the scope and waits for the pool's streams before anything is touched; then
 * drains the pool and releases the idle handles. */
static vmm_status finish_locked(vmm_arena *a) {
  char why[200];
  vmm_status st;
  if (a->scope != VMM_SCOPE_ACTIVE) return scope_error(a, "vmm_retention_finish");
  if (vmm_pool_check(&a->store.pool, why, sizeof why))
    return vmm_fail(a, VMM_ERR_SCOPE_STATE, "vmm_retention_finish: pool is inconsistent, nothing touched: %s", why);
  if ((st = wait_for_pool(a)) != VMM_OK) return st; /* a stream could not be waited for: nothing touched */
  vmm_process_deferred(a);
  if ((st = drain_pool(a)) != VMM_OK || (st = release_idle(a)) != VMM_OK) return st;
  a->scope = VMM_SCOPE_NONE;
  a->scopes_finished++;
  return VMM_OK;
}

vmm_status vmm_retention_finish(vmm_arena *a) { return scope_call(a, VMM_TRACE_FINISH, finish_locked); }

/* Records the scope as aborted: its memory freed later is abandoned too. */
static vmm_status remember_aborted(vmm_arena *a) {
  uint64_t *room = vmm_array_room(a->aborted_scopes, a->aborted_count, &a->aborted_cap, sizeof *room);
  if (!room) return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "abort: host out of memory; the scope stays active");
  a->aborted_scopes = room;
  a->aborted_scopes[a->aborted_count++] = a->scope_id;
  return VMM_OK;
}

/* No driver call: the pool, the deferred frees and the idle handles become abandoned. */
static vmm_status abort_locked(vmm_arena *a) {
  if (a->scope != VMM_SCOPE_ACTIVE) return scope_error(a, "vmm_retention_abort");
  vmm_status st = remember_aborted(a);
  if (st != VMM_OK) return st;
  vmm_mapping *m;
  while ((m = vmm_pool_peek_drain(&a->store.pool)) != NULL) {
    vmm_pool_remove(&a->store.pool, m);
    vmm_mapping_abandon(a, m);
  }
  vmm_deferred_abandon_scope(a, a->scope_id);
  vmm_idle_abandon_all(a);
  a->scope = VMM_SCOPE_NONE;
  a->scopes_aborted++;
  return VMM_OK;
}

vmm_status vmm_retention_abort(vmm_arena *a) { return scope_call(a, VMM_TRACE_ABORT, abort_locked); }
