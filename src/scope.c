/* Retention scope: begin, finish (drain the pool by pop-then-unmap, then release every idle
 * handle) and abort (no driver call; everything idle becomes abandoned). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

bool vmm_scope_aborted(const vmm_arena *a, uint64_t scope_id) {
  return scope_id != 0 && vmm_ids_has(&a->aborted_scopes, scope_id);
}

static vmm_status scope_error(vmm_arena *a, const char *call) {
  if (a->scope == VMM_SCOPE_ACTIVE)
    return vmm_errors_fail(a, VMM_ERR_SCOPE_STATE, "%s: retention scope %llu is already active; scopes do not nest", call,
                    (unsigned long long)a->scope_id);
  return vmm_errors_fail(a, VMM_ERR_SCOPE_STATE, "%s: no retention scope is active (%llu begun, %llu finished, %llu aborted)",
                  call, (unsigned long long)a->scopes_begun, (unsigned long long)a->scopes_finished,
                  (unsigned long long)a->scopes_aborted);
}

/* Runs one scope operation under the arena's lock and traces it. */
static vmm_status scope_call(vmm_arena *a, vmm_trace_op op, vmm_status (*locked)(vmm_arena *a)) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = locked(a);
  vmm_trace_arena_op(a, op, -1, 0, 0, 0, NULL, 0, VMM_POOL_SHARED, st);
  vmm_driver_ctx_leave(a);
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

/* Validates the scope and waits for the pool's streams before anything is touched; then
 * drains the pool and releases the idle handles. */
static vmm_status finish_locked(vmm_arena *a) {
  char why[200];
  vmm_status st;
  if (a->scope != VMM_SCOPE_ACTIVE) return scope_error(a, "vmm_retention_finish");
  if (vmm_store_pool_check(&a->store.pool, why, sizeof why))
    return vmm_errors_fail(a, VMM_ERR_SCOPE_STATE, "vmm_retention_finish: pool is inconsistent, nothing touched: %s", why);
  a->scope_finishing = true;
  st = vmm_drain_all(a, "vmm_retention_finish");
  a->scope_finishing = false;
  if (st != VMM_OK) return st;
  a->scope = VMM_SCOPE_NONE;
  a->scopes_finished++;
  return VMM_OK;
}

vmm_status vmm_retention_finish(vmm_arena *a) { return scope_call(a, VMM_TRACE_FINISH, finish_locked); }

/* Records the scope as aborted: its memory freed later is abandoned too. */
static vmm_status remember_aborted(vmm_arena *a) {
  if (vmm_ids_add(&a->aborted_scopes, a->scope_id))
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "abort: host out of memory; the scope stays active");
  return VMM_OK;
}

/* No driver call: the pool, the deferred frees and the idle handles become abandoned. */
static vmm_status abort_locked(vmm_arena *a) {
  if (a->scope != VMM_SCOPE_ACTIVE) return scope_error(a, "vmm_retention_abort");
  vmm_status st = remember_aborted(a);
  if (st != VMM_OK) return st;
  vmm_mapping *m;
  while ((m = vmm_store_pool_peek_drain(&a->store.pool)) != NULL) {
    vmm_store_pool_remove(&a->store.pool, m);
    vmm_mapping_abandon(a, m);
  }
  vmm_order_deferred_abandon_scope(a, a->scope_id);
  vmm_store_idle_abandon_all(a);
  a->scope = VMM_SCOPE_NONE;
  a->scopes_aborted++;
  return VMM_OK;
}

vmm_status vmm_retention_abort(vmm_arena *a) { return scope_call(a, VMM_TRACE_ABORT, abort_locked); }
