/* Mapping records: creation, mapping handles whole, the state transitions (one function for
 * each, the only code that sets a record's state) and the ways a record ends (listed in
 * internal.h): the one unmap-now, vmm_mapping_unmap_and_end (unmap whole, then end_unmapped:
 * leave the table and the range, keep the handles idle or release them), among them.
 * Record before unmap: a record leaves the table only after its unmap succeeded. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

vmm_mapping *vmm_mapping_new(void) {
  vmm_mapping *m = calloc(1, sizeof *m);
  if (m) m->handles = &m->first;
  return m;
}

void vmm_mapping_free_record(vmm_mapping *m) {
  if (!m) return;
  vmm_backup_free(m->backup, m->extent);
  if (m->handles != &m->first) free(m->handles);
  free(m->uses);
  free(m);
}

int vmm_mapping_by_base(const void *x, const void *y) {
  CUdeviceptr a = (*(vmm_mapping *const *)x)->base, b = (*(vmm_mapping *const *)y)->base;
  return a < b ? -1 : a > b;
}

/* ---- Mapping handles ----------------------------------------------------------------- */

CUresult vmm_mapping_map_handles(vmm_arena *a, CUdeviceptr base, vmm_handle *const *h, uint32_t n, size_t extent,
                         vmm_driver_entry *failed) {
  size_t off = 0;
  CUresult r = CUDA_SUCCESS;
  uint32_t i;
  for (i = 0; i < n; i++) {
    r = VMM_DRV(a, mem_map, base + off, h[i]->size, 0, h[i]->h, 0);
    if (r != CUDA_SUCCESS) {
      *failed = VMM_DRV_mem_map;
      break;
    }
    off += h[i]->size;
  }
  if (r == CUDA_SUCCESS) {
    r = VMM_DRV(a, mem_set_access, base, extent, a->access, a->access_count);
    if (r == CUDA_SUCCESS) return r;
    *failed = VMM_DRV_mem_set_access;
  }
  /* Undo the handles mapped so far, one by one (each is a whole mapping). */
  off = 0;
  for (uint32_t j = 0; j < i; off += h[j]->size, j++)
    if (VMM_DRV(a, mem_unmap, base + off, h[j]->size) != CUDA_SUCCESS) vmm_ranges_keep_stuck(a, base + off, h[j]->size);
  return r;
}

void vmm_mapping_attach(vmm_mapping *m, vmm_handle **slots, uint32_t n) {
  if (m->handles != &m->first) free(m->handles);
  if (n == 1) {
    m->first = slots[0];
    m->handles = &m->first;
    free(slots);
  } else {
    m->handles = slots;
  }
  m->handle_count = n;
  for (uint32_t i = 0; i < n; i++) {
    m->handles[i]->owner = m;
    m->handles[i]->taken = false;
    m->handles[i]->node.k2 = 0; /* a fresh store position when it is idle again */
  }
}

/* ---- State transitions --------------------------------------------------------------- */

static void set_state(vmm_arena *a, vmm_mapping *m, vmm_mapping_state s) {
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  m->state = s;
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, +1);
}

void vmm_mapping_insert_live(vmm_arena *a, vmm_mapping *m, size_t extent, vmm_kind kind) {
  m->extent = extent;
  m->kind = kind;
  m->state = VMM_MAP_LIVE;
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, +1);
  vmm_table_insert(&a->table, m->base, m);
}

void vmm_mapping_hand_out(vmm_arena *a, vmm_mapping *m, const vmm_request *req, uint64_t scope_id) {
  if (m->state != VMM_MAP_LIVE) set_state(a, m, VMM_MAP_LIVE);
  m->requested = req->bytes;
  m->stream = req->stream;
  m->tag = req->tag;
  m->graph_pool = req->graph_pool;
  m->scope_id = scope_id;
  free(m->uses);
  m->uses = NULL;
  m->use_count = 0;
  vmm_accounting_add_tag(a, req->tag, m->extent, +1);
}

int vmm_mapping_add_use(vmm_mapping *m, CUstream stream) {
  if (stream == m->stream) return 0;
  for (uint32_t i = 0; i < m->use_count; i++)
    if (m->uses[i] == stream) return 0;
  CUstream *grown = realloc(m->uses, (m->use_count + 1) * sizeof *grown);
  if (!grown) return -1;
  m->uses = grown;
  m->uses[m->use_count++] = stream;
  return 0;
}

/* Whether pooled-to-be m and pooled t, next to each other, may be one mapping: freed on
 * `stream`, used by no other stream, of the same kind, pool, scope and reservation. */
static bool mergeable(const vmm_mapping *m, const vmm_mapping *t, CUstream stream) {
  return t->state == VMM_MAP_POOLED && !t->chosen && !m->page && !t->page && t->kind == m->kind &&
         t->graph_pool == m->graph_pool && t->scope_id == m->scope_id && t->reservation == m->reservation && t->stream == stream &&
         !t->use_count;
}

/* Pooled t, right after m and out of the pool, becomes part of m; its record goes. False
 * where the host has no memory for the handles: nothing changed. */
static bool merge(vmm_arena *a, vmm_mapping *m, vmm_mapping *t) {
  vmm_handle **hs = malloc((m->handle_count + t->handle_count) * sizeof *hs);
  if (!hs) return false;
  memcpy(hs, m->handles, m->handle_count * sizeof *hs);
  memcpy(hs + m->handle_count, t->handles, t->handle_count * sizeof *hs);
  for (uint32_t i = 0; i < t->handle_count; i++) t->handles[i]->owner = m;
  vmm_accounting_add_stat(a, t->kind, t->state, t->extent, -1);
  vmm_table_remove(&a->table, t->base);
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  if (m->handles != &m->first) free(m->handles);
  m->handles = hs;
  m->handle_count += t->handle_count;
  m->extent += t->extent;
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, +1);
  if (t->handles != &t->first) free(t->handles);
  t->handles = &t->first, t->handle_count = 0; /* its handles are m's now */
  vmm_mapping_free_record(t);
  return true;
}

/* In whole-process mode a mapping being pooled on `stream` takes back the tail an in-place hit
 * split off it, if that one is pooled and mergeable: the two are one mapping again. No driver
 * call. */
static void absorb_tail(vmm_arena *a, vmm_mapping *m, CUstream stream) {
  vmm_mapping *t = vmm_table_find(&a->table, m->base + m->extent);
  if (!t || !vmm_mapping_tail(t) || !mergeable(m, t, stream)) return;
  vmm_store_pool_remove(&a->store.pool, t);
  if (!merge(a, m, t)) (void)vmm_store_pool_push(&a->store.pool, t); /* its bucket went to the spare list */
}

/* The same the other way: a tail being pooled merges into the pooled mapping it was split off after,
 * if that one still ends where the tail begins. Returns the mapping to pool (m, or the one it
 * merged into, out of the pool). A spare bucket must be reserved. */
static vmm_mapping *merge_into_before(vmm_arena *a, vmm_mapping *m, CUstream stream) {
  vmm_mapping *h = vmm_mapping_tail(m) ? vmm_table_find(&a->table, m->before) : NULL;
  if (!h || h->base + h->extent != m->base || m->use_count || !mergeable(m, h, stream)) return m;
  vmm_store_pool_remove(&a->store.pool, h);
  if (merge(a, h, m)) return h;
  (void)vmm_store_pool_push(&a->store.pool, h); /* its bucket went to the spare list */
  return m;
}

int vmm_mapping_pool(vmm_arena *a, vmm_mapping *m, CUstream stream) {
  bool merges = vmm_policy_of(a)->splits_in_place;
  if (merges) absorb_tail(a, m, stream);
  if (merges && vmm_store_pool_reserve(&a->store.pool, 1) == 0) m = merge_into_before(a, m, stream);
  CUstream old_stream = m->stream;
  m->stream = stream; /* reuse elsewhere and unmapping wait for this stream ... */
  m->free_seq = ++a->free_seq; /* ... until a quiesce, a fence or the program's wait after this */
  vmm_join_record(a, &m->join, m->graph_pool, stream, m->uses, m->use_count); /* during a capture: its free markers */
  if (vmm_store_pool_push(&a->store.pool, m)) {
    m->stream = old_stream;
    return -1;
  }
  set_state(a, m, VMM_MAP_POOLED);
  return 0;
}

void vmm_mapping_defer(vmm_arena *a, vmm_mapping *m, CUstream stream) {
  m->stream = stream;
  set_state(a, m, VMM_MAP_DEFERRED);
}

void vmm_mapping_begin_freeing(vmm_arena *a, vmm_mapping *m) { set_state(a, m, VMM_MAP_FREEING); }

void vmm_mapping_end_freeing(vmm_arena *a, vmm_mapping *m) { set_state(a, m, VMM_MAP_LIVE); }

void vmm_mapping_abandon(vmm_arena *a, vmm_mapping *m) { set_state(a, m, VMM_MAP_ABANDONED); }

void vmm_mapping_pause(vmm_arena *a, vmm_mapping *m, void *backup) {
  m->backup = backup;
  vmm_accounting_add_tag(a, m->tag, m->extent, -1);
  vmm_accounting_move_tag_paused(a, m->tag, m->extent, +1);
  set_state(a, m, VMM_MAP_PAUSED);
}

void vmm_mapping_resume(vmm_arena *a, vmm_mapping *m) {
  vmm_backup_free(m->backup, m->extent);
  m->backup = NULL;
  vmm_accounting_move_tag_paused(a, m->tag, m->extent, -1);
  vmm_accounting_add_tag(a, m->tag, m->extent, +1);
  set_state(a, m, VMM_MAP_LIVE);
}

void vmm_mapping_begin_moving(vmm_arena *a, vmm_mapping *m) { set_state(a, m, VMM_MAP_MOVING); }

void vmm_mapping_end_moving(vmm_arena *a, vmm_mapping *m) {
  set_state(a, m, m->backup ? VMM_MAP_PAUSED : VMM_MAP_LIVE);
}

/* ---- Retire -------------------------------------------------------------------------- */

vmm_status vmm_mapping_unmap(vmm_arena *a, vmm_mapping *m, const char *what) {
  CUresult r = vmm_copier_settle(a); /* a pause's copy whose wait failed may still touch it */
  if (r != CUDA_SUCCESS) {
    char b[32];
    return vmm_errors_fail_driver(a, r, VMM_DRV_stream_synchronize, "%s: waiting for an earlier pause or resume's copies "
                           "before unmapping %s %s at 0x%llx", what, vmm_errors_kind_name(m->kind),
                           vmm_errors_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  }
  r = VMM_DRV(a, mem_unmap, m->base, m->extent);
  if (r != CUDA_SUCCESS) {
    char b[32];
    return vmm_errors_fail_driver(a, r, VMM_DRV_mem_unmap, "%s: unmapping %s %s at 0x%llx", what, vmm_errors_kind_name(m->kind),
                           vmm_errors_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  }
  a->mapped_bytes -= m->extent;
  return VMM_OK;
}

vmm_status vmm_mapping_drop_handles(vmm_arena *a, vmm_mapping *m, bool retain) {
  vmm_status st = VMM_OK;
  for (uint32_t i = 0; i < m->handle_count; i++) {
    vmm_handle *h = m->handles[i];
    if (!h) continue; /* taken by an assembly */
    h->kind = m->kind;
    h->owner = NULL;
    if (retain) {
      vmm_store_idle_put(a, h);
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

/* The bytes of m's handles [from, to). */
static size_t handle_bytes(const vmm_mapping *m, uint32_t from, uint32_t to) {
  size_t bytes = 0;
  for (uint32_t i = from; i < to; i++) bytes += m->handles[i]->size;
  return bytes;
}

void vmm_mapping_split_off(vmm_arena *a, vmm_mapping *m, uint32_t k, CUstream *uses, vmm_retiring_range *range) {
  size_t size = handle_bytes(m, 0, k);
  vmm_assert(k > 0 && k < m->handle_count && (uses || !m->use_count));
  *range = (vmm_retiring_range){m->base, size, m->reservation, m->graph_pool,
                                {m->stream, uses, uses ? m->use_count : 0, m->free_seq, NULL}};
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  memmove(m->handles, m->handles + k, (m->handle_count - k) * sizeof *m->handles);
  m->handle_count -= k;
  m->base += size;
  m->extent -= size;
  a->mapped_bytes -= size;
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, +1);
  vmm_table_insert(&a->table, m->base, m); /* the slot just freed: cannot fail */
}

/* A record for m's n handles from k on, in place at `offset` bytes into m, of `bytes`, with m's
 * kind, pool, tag and free; a tail, split off after the part at `before` bytes into m. */
static vmm_mapping *part_record(const vmm_mapping *m, uint32_t k, uint32_t n, size_t offset, size_t bytes,
                                size_t before) {
  vmm_mapping *t = vmm_mapping_new();
  vmm_handle **hs = n > 1 ? malloc(n * sizeof *hs) : NULL;
  CUstream *uses = m->use_count ? malloc(m->use_count * sizeof *uses) : NULL;
  if (!t || (n > 1 && !hs) || (m->use_count && !uses)) {
    vmm_mapping_free_record(t);
    free(hs);
    free(uses);
    return NULL;
  }
  if (n > 1) t->handles = memcpy(hs, m->handles + k, n * sizeof *hs);
  else t->first = m->handles[k];
  if (uses) memcpy(uses, m->uses, m->use_count * sizeof *uses);
  t->handle_count = n;
  t->base = m->base + offset, t->extent = bytes, t->reservation = m->reservation;
  t->kind = m->kind, t->graph_pool = m->graph_pool, t->tag = m->tag, t->scope_id = m->scope_id;
  t->stream = m->stream, t->uses = uses, t->use_count = m->use_count;
  t->free_seq = m->free_seq;
  t->join = m->join;
  t->state = VMM_MAP_POOLED;
  t->before = m->base + before; /* a tail: m->base is never 0 */
  return t;
}

static void add_part(vmm_arena *a, vmm_mapping *t) {
  vmm_accounting_add_stat(a, t->kind, t->state, t->extent, +1);
  vmm_table_insert(&a->table, t->base, t);
  for (uint32_t i = 0; i < t->handle_count; i++) t->handles[i]->owner = t;
}

vmm_mapping *vmm_mapping_split_run(vmm_arena *a, vmm_mapping *m, uint32_t first, uint32_t count, vmm_mapping **after) {
  uint32_t end = first + count;
  vmm_assert(count > 0 && end <= m->handle_count && count < m->handle_count && m->state == VMM_MAP_POOLED && !m->page);
  size_t before = handle_bytes(m, 0, first), run = handle_bytes(m, first, end);
  vmm_mapping *r = first ? part_record(m, first, count, before, run, 0) : m;
  vmm_mapping *t = end < m->handle_count ? part_record(m, end, m->handle_count - end, before + run,
                                                       m->extent - before - run, before)
                                         : NULL;
  if (!r || (end < m->handle_count && !t) || vmm_table_reserve_n(&a->table, (first > 0) + (t != NULL))) {
    if (r != m) vmm_mapping_free_record(r);
    vmm_mapping_free_record(t);
    return NULL;
  }
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  m->handle_count = first ? first : count;
  m->extent = first ? before : run;
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, +1);
  if (r != m) add_part(a, r);
  if (t) add_part(a, t);
  *after = t;
  return r;
}

/* m leaves the counters and the table; its handles go, and the record is freed. */
static vmm_status forget(vmm_arena *a, vmm_mapping *m, bool retain) {
  if (m->state == VMM_MAP_PAUSED) vmm_accounting_move_tag_paused(a, m->tag, m->extent, -1);
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  vmm_status st = vmm_mapping_drop_handles(a, m, retain);
  vmm_mapping_free_record(m);
  return st;
}

void vmm_mapping_end_into_grown(vmm_arena *a, vmm_mapping *m) {
  vmm_accounting_add_stat(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  vmm_mapping_free_record(m); /* the record and its array; the handles are the grown mapping's */
}

vmm_status vmm_mapping_end_unmapped(vmm_arena *a, vmm_mapping *m, bool retain, size_t first_stuck) {
  vmm_ranges_free_unless_stuck(a, m->base, m->extent, m->reservation, first_stuck);
  return forget(a, m, retain);
}

void vmm_mapping_end_retiring(vmm_arena *a, vmm_mapping *m, vmm_retiring_range *range) {
  *range = (vmm_retiring_range){m->base, m->extent, m->reservation, m->graph_pool,
                                {m->stream, m->uses, m->use_count, m->free_seq, NULL}};
  m->uses = NULL;
  m->use_count = 0;
  a->mapped_bytes -= m->extent; /* mapped still, but by a retiring range, no longer a mapping */
  (void)forget(a, m, true);     /* keeping handles idle makes no driver call */
}

vmm_status vmm_mapping_unmap_and_end(vmm_arena *a, vmm_mapping *m, bool retain, const char *what, bool *unmapped) {
  vmm_status st = vmm_mapping_unmap(a, m, what);
  *unmapped = st == VMM_OK;
  return st == VMM_OK ? vmm_mapping_end_unmapped(a, m, retain, VMM_NO_STUCK) : st;
}

vmm_status vmm_mapping_end_paused(vmm_arena *a, vmm_mapping *m, bool retain) {
  if (m->handle_count) { /* mapped again, its backup not yet copied back */
    bool unmapped;
    return vmm_mapping_unmap_and_end(a, m, retain, "free", &unmapped);
  }
  vmm_status st = vmm_ranges_unstick(a, m->base, m->extent); /* a failed resume's leftovers go first */
  return st == VMM_OK ? vmm_mapping_end_unmapped(a, m, retain, VMM_NO_STUCK) : st;
}

void vmm_mapping_keep(vmm_mapping *m) {
  vmm_backup_free(m->backup, m->extent); /* a freed allocation's contents do not matter */
  m->backup = NULL;
  m->kept = true;
}

void vmm_mapping_destroy(vmm_arena *a, vmm_mapping *m) {
  if (m->handle_count) (void)vmm_mapping_unmap(a, m, "destroy"); /* a failure is logged; paused: nothing mapped */
  (void)vmm_mapping_drop_handles(a, m, false);
  vmm_mapping_free_record(m);
}
