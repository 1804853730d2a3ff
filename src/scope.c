/* Retention scope: begin, finish (drain the pool by pop-then-unmap, then release every
 * retained handle) and abort (no driver call; everything becomes abandoned). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int vmm_pieces_reserve(vmm_piece_list *l, size_t more) {
  if (l->count + more <= l->cap) return 0;
  size_t cap = l->cap ? l->cap : 16;
  while (cap < l->count + more) cap *= 2;
  vmm_piece *items = realloc(l->items, cap * sizeof *items);
  if (!items) return -1;
  l->items = items;
  vmm_kind *kinds = realloc(l->kinds, cap * sizeof *kinds);
  if (!kinds) return -1;
  l->kinds = kinds;
  l->cap = cap;
  return 0;
}

int vmm_pieces_push(vmm_piece_list *l, vmm_piece p, vmm_kind kind) {
  if (vmm_pieces_reserve(l, 1)) return -1;
  l->items[l->count] = p;
  l->kinds[l->count] = kind;
  l->count++;
  return 0;
}

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

/* Writes a scope operation to the trace, if one is open. */
static void trace_scope(vmm_arena *a, vmm_trace_op op, vmm_status st) {
  if (!a->trace) return;
  vmm_trace_record r = {.t_ns = vmm_now_ns(), .op = op, .kind = -1, .result = st};
  vmm_trace_write(a->trace, &r);
}

static vmm_status scope_error(vmm_arena *a, const char *call) {
  if (a->scope == VMM_SCOPE_ACTIVE)
    return vmm_fail(a, VMM_ERR_SCOPE_STATE, "%s: retention scope %llu is already active; scopes do not nest", call,
                    (unsigned long long)a->scope_id);
  return vmm_fail(a, VMM_ERR_SCOPE_STATE, "%s: no retention scope is active (%llu begun, %llu finished, %llu aborted)",
                  call, (unsigned long long)a->scopes_begun, (unsigned long long)a->scopes_finished,
                  (unsigned long long)a->scopes_aborted);
}

vmm_status vmm_retention_begin(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (a->scope == VMM_SCOPE_ACTIVE) {
    st = scope_error(a, "vmm_retention_begin");
  } else {
    a->scope = VMM_SCOPE_ACTIVE;
    a->scope_id = ++a->next_scope_id;
    a->scopes_begun++;
  }
  trace_scope(a, VMM_TRACE_BEGIN, st);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* Pops the pool in drain order (largest bucket first, newest first within it) and unmaps
 * each mapping; a failed unmap pushes the mapping back where it was. */
static vmm_status drain_pool(vmm_arena *a) {
  vmm_mapping *m;
  while ((m = vmm_pool_peek_drain(&a->pool)) != NULL) {
    if (vmm_pieces_reserve(&a->retained, m->piece_count))
      return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "finish: host out of memory for the retained-handle list");
    vmm_pool_remove(&a->pool, m);
    CUresult r = VMM_DRV(a, mem_unmap, m->base, m->extent);
    if (r != CUDA_SUCCESS) {
      vmm_pool_push(&a->pool, m); /* the bucket it left is on the spare list: cannot fail */
      char b[32];
      return vmm_fail_driver(a, r, VMM_DRV_mem_unmap, "finish: unmapping pooled %s at 0x%llx (%zu mappings left in the pool)",
                             vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base, a->pool.count);
    }
    a->mapped_bytes -= m->extent;
    vmm_stat_add(a, m->kind, VMM_MAP_POOLED, m->extent, -1);
    for (uint32_t i = 0; i < m->piece_count; i++) {
      vmm_pieces_push(&a->retained, m->pieces[i], m->kind);
      a->kind[m->kind].retained_count++;
      a->kind[m->kind].retained_bytes += m->pieces[i].size;
    }
    vmm_table_remove(&a->table, m->base);
    vmm_ranges_free(a, m->base, m->extent, m->reservation);
    if (m->pieces != &m->one) free(m->pieces);
    free(m);
  }
  return VMM_OK;
}

/* Waits, once per stream, for in-flight work that may still use a pooled mapping the drain
 * is about to unmap (see vmm_wait_for_free). Touches nothing. */
static vmm_status wait_for_pool(vmm_arena *a) {
  CUstream waited[16];
  size_t n_waited = 0;
  for (vmm_avl *node = vmm_avl_last(a->pool.root); node;) {
    vmm_bucket *b = vmm_container_of(node, vmm_bucket, node);
    for (vmm_mapping *m = b->head; m; m = m->pool_next) {
      vmm_status st = vmm_wait_for_free(a, m, "vmm_retention_finish", waited, &n_waited, 16);
      if (st != VMM_OK) return st;
    }
    node = vmm_avl_floor(a->pool.root, b->size - 1, 0);
  }
  return VMM_OK;
}

/* Releases retained handles from the end of the list; stops at the first failure. */
static vmm_status release_retained(vmm_arena *a) {
  vmm_piece_list *l = &a->retained;
  while (l->count) {
    vmm_piece p = l->items[l->count - 1];
    vmm_kind k = l->kinds[l->count - 1];
    CUresult r = VMM_DRV(a, mem_release, p.handle);
    if (r != CUDA_SUCCESS) {
      char b[32];
      return vmm_fail_driver(a, r, VMM_DRV_mem_release, "finish: releasing a retained %s handle (%zu handles left)",
                             vmm_fmt_bytes(p.size, b), l->count);
    }
    l->count--;
    a->physical_bytes -= p.size;
    a->kind[k].retained_count--;
    a->kind[k].retained_bytes -= p.size;
  }
  return VMM_OK;
}

vmm_status vmm_retention_finish(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st;
  char why[200];
  if (a->scope != VMM_SCOPE_ACTIVE) {
    st = scope_error(a, "vmm_retention_finish");
  } else if (vmm_pool_check(&a->pool, why, sizeof why)) {
    st = vmm_fail(a, VMM_ERR_SCOPE_STATE, "vmm_retention_finish: pool is inconsistent, nothing touched: %s", why);
  } else if ((st = wait_for_pool(a)) != VMM_OK) {
    /* a stream could not be waited for: nothing touched */
  } else {
    if (a->deferred_head) vmm_process_deferred(a);
    st = drain_pool(a);
    if (st == VMM_OK) st = release_retained(a);
    if (st == VMM_OK) {
      a->scope = VMM_SCOPE_NONE;
      a->scopes_finished++;
    }
  }
  trace_scope(a, VMM_TRACE_FINISH, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_retention_abort(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (a->scope != VMM_SCOPE_ACTIVE) {
    st = scope_error(a, "vmm_retention_abort");
    goto out;
  }
  if (a->aborted_count == a->aborted_cap) {
    size_t cap = a->aborted_cap ? a->aborted_cap * 2 : 8;
    uint64_t *grown = realloc(a->aborted_scopes, cap * sizeof *grown);
    if (!grown || vmm_pieces_reserve(&a->abandoned, a->retained.count)) {
      if (grown) a->aborted_scopes = grown, a->aborted_cap = cap;
      st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "abort: host out of memory; the scope stays active");
      goto out;
    }
    a->aborted_scopes = grown;
    a->aborted_cap = cap;
  } else if (vmm_pieces_reserve(&a->abandoned, a->retained.count)) {
    st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "abort: host out of memory; the scope stays active");
    goto out;
  }
  a->aborted_scopes[a->aborted_count++] = a->scope_id;
  vmm_mapping *m;
  while ((m = vmm_pool_peek_drain(&a->pool)) != NULL) {
    vmm_pool_remove(&a->pool, m);
    vmm_stat_add(a, m->kind, VMM_MAP_POOLED, m->extent, -1);
    m->state = VMM_MAP_ABANDONED;
    vmm_stat_add(a, m->kind, VMM_MAP_ABANDONED, m->extent, +1);
  }
  for (size_t i = 0; i < a->retained.count; i++) {
    vmm_piece p = a->retained.items[i];
    vmm_kind k = a->retained.kinds[i];
    vmm_pieces_push(&a->abandoned, p, k);
    a->kind[k].retained_count--;
    a->kind[k].retained_bytes -= p.size;
    a->kind[k].abandoned_count++;
    a->kind[k].abandoned_bytes += p.size;
  }
  a->retained.count = 0;
  a->scope = VMM_SCOPE_NONE;
  a->scopes_aborted++;
out:
  trace_scope(a, VMM_TRACE_ABORT, st);
  pthread_mutex_unlock(&a->lock);
  return st;
}
