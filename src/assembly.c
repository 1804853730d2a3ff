/* Assembly: a mapping built in a fresh range from idle handles mapped back to back, with new
 * memory created only for what the idle handles do not cover. Inside a scope new memory is cut
 * into handles of at most the arena's bound, so that once freed it can serve any later request.
 *
 * The plan is made first and touches nothing but the store's indexes. Then each step that can
 * fail is undone exactly when a later one fails:
 *   1. admission of the new bytes           4. creating the new handles
 *   2. record, table slot and VA range      5. unmapping the pooled mappings taken apart
 *   3. waiting for their freeing streams    6. mapping everything and granting access */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct plan {
  vmm_handle **use;       /* handles to map, in address order: idle ones, then the new ones */
  uint32_t n_use, n_idle; /* n_idle of them idle, n_unmapped of those from the unmapped tier */
  uint32_t n_unmapped;
  vmm_mapping **apart;    /* pooled mappings to take apart */
  size_t n_apart;
  size_t covered;         /* bytes of the idle handles chosen */
  size_t fresh;           /* bytes to create */
} plan;

/* ---- Mapping handles ----------------------------------------------------------------- */

/* Records a handle whose undo unmap failed: it stays mapped, so its VA must not be handed out
 * again; destroy unmaps it. */
static void keep_stuck(vmm_arena *a, CUdeviceptr base, size_t size) {
  if (a->stuck_count == a->stuck_cap) {
    size_t cap = a->stuck_cap ? a->stuck_cap * 2 : 8;
    vmm_reservation *grown = realloc(a->stuck, cap * sizeof *grown);
    if (!grown) {
      vmm_log(1, a->cfg.log_level, "vmmarena: host out of memory; mapping 0x%llx+%zu stays mapped until the process ends",
              (unsigned long long)base, size);
      return;
    }
    a->stuck = grown;
    a->stuck_cap = cap;
  }
  a->stuck[a->stuck_count++] = (vmm_reservation){base, size};
  a->stuck_bytes += size;
}

size_t vmm_stuck_bytes_in(const vmm_arena *a, CUdeviceptr base, size_t extent) {
  size_t n = 0;
  for (size_t k = 0; k < a->stuck_count; k++)
    if (a->stuck[k].base >= base && a->stuck[k].base < base + extent) n += a->stuck[k].size;
  return n;
}

vmm_status vmm_unstick(vmm_arena *a, CUdeviceptr base, size_t extent) {
  for (size_t k = 0; k < a->stuck_count;) {
    vmm_reservation s = a->stuck[k];
    if (s.base < base || s.base >= base + extent) {
      k++;
      continue;
    }
    CUresult r = VMM_DRV(a, mem_unmap, s.base, s.size);
    if (r != CUDA_SUCCESS)
      return vmm_fail_driver(a, r, VMM_DRV_mem_unmap, "unmapping 0x%llx+%zu, left mapped by an earlier failure",
                             (unsigned long long)s.base, s.size);
    a->stuck[k] = a->stuck[--a->stuck_count];
    a->stuck_bytes -= s.size;
  }
  return VMM_OK;
}

void vmm_free_range_unless_stuck(vmm_arena *a, CUdeviceptr base, size_t extent, uint32_t reservation,
                                 size_t first_stuck) {
  CUdeviceptr at = base, end = base + extent;
  for (size_t k = first_stuck; k < a->stuck_count; k++) {
    if (a->stuck[k].base > at) vmm_ranges_free(a, at, a->stuck[k].base - at, reservation);
    at = a->stuck[k].base + a->stuck[k].size;
  }
  if (at < end) vmm_ranges_free(a, at, end - at, reservation);
}

CUresult vmm_map_handles(vmm_arena *a, CUdeviceptr base, vmm_handle *const *h, uint32_t n, size_t extent,
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
    if (VMM_DRV(a, mem_unmap, base + off, h[j]->size) != CUDA_SUCCESS) keep_stuck(a, base + off, h[j]->size);
  return r;
}

/* ---- The plan ------------------------------------------------------------------------ */

static bool has_handle_at_most(const vmm_mapping *m, size_t most) {
  for (uint32_t i = 0; i < m->handle_count; i++)
    if (m->handles[i]->size <= most) return true;
  return false;
}

static bool can_take_apart(vmm_arena *a, vmm_mapping *m, size_t left, bool padded) {
  return !m->chosen && (padded || has_handle_at_most(m, left)) && vmm_can_wait_for_free(a, m);
}

/* The pooled mapping to take apart for `left` bytes: the smallest that covers them, else the
 * largest smaller one. */
static vmm_mapping *pick_apart(vmm_arena *a, size_t left, bool padded) {
  for (vmm_bucket *b = vmm_pool_bucket_near(&a->store.pool, left, true); b;
       b = vmm_pool_bucket_near(&a->store.pool, b->size + 1, true)) {
    vmm_assert(b->head); /* no empty bucket */
    for (vmm_mapping *m = b->head; m; m = m->pool_next)
      if (can_take_apart(a, m, left, padded)) return m;
  }
  for (vmm_bucket *b = left > 1 ? vmm_pool_bucket_near(&a->store.pool, left - 1, false) : NULL; b;
       b = b->size > 1 ? vmm_pool_bucket_near(&a->store.pool, b->size - 1, false) : NULL) {
    vmm_assert(b->head);
    for (vmm_mapping *m = b->head; m; m = m->pool_next)
      if (can_take_apart(a, m, left, padded)) return m;
  }
  return NULL;
}

static void plan_use(plan *p, vmm_handle *h, size_t *left) {
  h->taken = true;
  p->use[p->n_use++] = h;
  p->covered += h->size;
  *left = h->size >= *left ? 0 : *left - h->size;
}

/* The plan's unmapped handles left the store's indexes and its counters; while the plan holds
 * them (until the commit or the undo) they are counted back as retained (sign +1, then -1),
 * so that a refusal or a failure meanwhile describes what the arena holds. */
static void count_plan(vmm_arena *a, const plan *p, int sign) {
  for (uint32_t i = 0; i < p->n_unmapped; i++) {
    vmm_kind_stats *k = &a->kind[p->use[i]->kind];
    k->retained_count += (uint64_t)(int64_t)sign;
    k->retained_bytes += (uint64_t)((int64_t)sign * (int64_t)p->use[i]->size);
  }
}

/* Puts back everything the plan took from the store's indexes. */
static void plan_undo(vmm_arena *a, plan *p) {
  for (uint32_t i = 0; i < p->n_idle; i++) {
    p->use[i]->taken = false;
    if (i < p->n_unmapped) vmm_idle_put(a, p->use[i]);
  }
  for (size_t i = 0; i < p->n_apart; i++) p->apart[i]->chosen = false;
}

/* Chooses idle handles for `rounded` bytes: the largest unmapped handle that fits what is
 * left, repeatedly; then handles of pooled mappings taken apart. Padded: the last handle may
 * be larger than what is left. */
static void plan_idle(vmm_arena *a, plan *p, size_t rounded, bool padded) {
  size_t left = rounded;
  vmm_handle *h;
  while (left && (h = vmm_idle_take_at_most(a, left)) != NULL) plan_use(p, h, &left);
  if (left && padded && (h = vmm_idle_take_at_least(a, left)) != NULL) plan_use(p, h, &left);
  p->n_unmapped = p->n_use;
  vmm_mapping *m;
  while (left && (m = pick_apart(a, left, padded)) != NULL) {
    m->chosen = true;
    p->apart[p->n_apart++] = m;
    for (uint32_t i = 0; i < m->handle_count && left; i++)
      if (m->handles[i]->size <= left) plan_use(p, m->handles[i], &left);
    if (left && padded) { /* the smallest handle left in m covers the rest */
      vmm_handle *best = NULL;
      for (uint32_t i = 0; i < m->handle_count; i++)
        if (!m->handles[i]->taken && (!best || m->handles[i]->size < best->size)) best = m->handles[i];
      if (best) plan_use(p, best, &left);
    }
  }
  p->n_idle = p->n_use;
  p->fresh = left;
}

/* ---- Cutting new memory -------------------------------------------------------------- */

/* New memory is cut into handles of `bound` bytes and one for what is left below it. */
static size_t cut(size_t rest, size_t bound) { return rest < bound ? rest : bound; }

static uint32_t cut_count(size_t fresh, size_t bound) {
  uint32_t n = 0;
  for (size_t rest = fresh; rest; rest -= cut(rest, bound)) n++;
  return n;
}

/* ---- Steps that can fail ------------------------------------------------------------- */

/* Maps the mappings taken apart [0, n) back at their old bases, last first, so that each LIFO
 * bucket gets them back in their old order; one that cannot be mapped back keeps its handles
 * idle and returns its range. */
static void restore_apart(vmm_arena *a, vmm_mapping **apart, size_t n) {
  for (size_t i = n; i-- > 0;) {
    vmm_mapping *m = apart[i];
    m->chosen = false;
    vmm_driver_entry failed;
    size_t first_stuck = a->stuck_count;
    if (vmm_map_handles(a, m->base, m->handles, m->handle_count, m->extent, &failed) == CUDA_SUCCESS) {
      vmm_add_mapped(a, m->extent);
      vmm_pool_push(&a->store.pool, m); /* cannot fail: its bucket is on the spare list or in the tree */
      continue;
    }
    vmm_stat_add(a, m->kind, m->state, m->extent, -1);
    vmm_table_remove(&a->table, m->base);
    vmm_free_range_unless_stuck(a, m->base, m->extent, m->reservation, first_stuck);
    for (uint32_t j = 0; j < m->handle_count; j++) {
      m->handles[j]->kind = m->kind;
      vmm_idle_put(a, m->handles[j]);
    }
    vmm_mapping_free(m);
  }
}

/* Releases the handles created by a failed assembly (never freed, so no retention applies);
 * their slots become NULL. */
static void release_created(vmm_arena *a, vmm_handle **h, uint32_t n) {
  char keep[sizeof a->last_error];
  memcpy(keep, a->last_error, sizeof keep);
  for (uint32_t i = 0; i < n; i++) {
    (void)vmm_handle_release(a, h[i]);
    h[i] = NULL;
  }
  memcpy(a->last_error, keep, sizeof keep);
}

/* Creates n handles (objects in h, sizes set) for fresh bytes. On failure releases those made. */
static vmm_status create_handles(vmm_arena *a, const vmm_request *req, vmm_handle **h, uint32_t n, size_t fresh) {
  if (n > 1) {
    vmm_status st = vmm_admit_device(a, req->bytes, req->rounded, fresh, n, req->kind);
    if (st != VMM_OK) return st;
  }
  for (uint32_t i = 0; i < n; i++) {
    CUresult r = VMM_DRV(a, mem_create, &h[i]->h, h[i]->size, &a->prop, 0);
    if (r == CUDA_SUCCESS) {
      vmm_add_physical(a, h[i]->size);
      continue;
    }
    release_created(a, h, i);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return vmm_refuse_driver_oom(a, req->bytes, req->rounded, req->kind);
    char b[2][32];
    return vmm_fail_driver(a, r, VMM_DRV_mem_create,
                           "%s %s (requested %zu B, rounded %zu B): creating physical memory (handle %u of %u, %s)",
                           vmm_kind_name(req->kind), vmm_fmt_bytes(req->rounded, b[0]), req->bytes, req->rounded, i + 1,
                           n, vmm_fmt_bytes(h[i]->size, b[1]));
  }
  return VMM_OK;
}

/* Unmaps the mappings taken apart, after waiting for their freeing streams. */
static vmm_status unmap_apart(vmm_arena *a, plan *p) {
  CUstream waited[8];
  size_t n_waited = 0;
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_status st = vmm_wait_for_free(a, p->apart[i], "assembly", waited, &n_waited, 8);
    if (st == VMM_ERR_SCOPE_STATE) st = VMM_ERR_OUT_OF_MEMORY; /* began capturing since the plan */
    if (st != VMM_OK) return st;
  }
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_mapping *m = p->apart[i];
    vmm_pool_remove(&a->store.pool, m);
    vmm_status st = vmm_mapping_unmap(a, m, "taking a pooled mapping apart for an assembly");
    if (st != VMM_OK) {
      vmm_pool_push(&a->store.pool, m); /* still mapped; its bucket is on the spare list */
      for (size_t j = i; j < p->n_apart; j++) p->apart[j]->chosen = false; /* pooled as before */
      restore_apart(a, p->apart, i);
      p->n_apart = 0; /* restored: nothing left to undo */
      return st;
    }
  }
  return VMM_OK;
}

/* The assembly has succeeded: the mappings taken apart give up their chosen handles and keep
 * the rest idle; the handles in use forget their store positions. */
static void commit_apart(vmm_arena *a, plan *p) {
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_mapping *m = p->apart[i];
    for (uint32_t j = 0; j < m->handle_count; j++)
      if (m->handles[j]->taken) m->handles[j] = NULL;
    vmm_mapping_dispose(a, m, true);
    a->pooled_taken_apart++;
  }
}

/* Gives m the handles in slots (a heap array of n, kept when n > 1). */
static void attach_handles(vmm_mapping *m, vmm_handle **slots, uint32_t n) {
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
    m->handles[i]->taken = false;
    m->handles[i]->node.k2 = 0; /* a fresh store position when it is idle again */
  }
}

vmm_status vmm_assemble(vmm_arena *a, const vmm_request *req, vmm_assembly_mode mode, vmm_mapping *into,
                        vmm_mapping **out) {
  plan p = {0};
  vmm_status st = VMM_OK;
  vmm_mapping *m = into;
  vmm_handle **slots = NULL;
  uint32_t n_new = 0;
  if (mode != VMM_ASSEMBLE_NEW) {
    p.use = malloc((a->store.unmapped_count + a->store.pool.handles + 1) * sizeof *p.use);
    p.apart = malloc((a->store.pool.count + 1) * sizeof *p.apart);
    if (!p.use || !p.apart) {
      free(p.use);
      free(p.apart);
      return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for an assembly");
    }
    plan_idle(a, &p, req->rounded, mode == VMM_ASSEMBLE_PADDED);
    count_plan(a, &p, +1);
  } else {
    p.fresh = req->rounded;
  }
  if (mode == VMM_ASSEMBLE_PADDED && (p.fresh || !p.n_idle)) {
    char b[2][32];
    st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "idle handles cover %s of %s", vmm_fmt_bytes(p.covered, b[0]),
                  vmm_fmt_bytes(req->rounded, b[1]));
    goto undo_plan;
  }
  /* 1. admission */
  if (p.fresh && (st = vmm_admit(a, req->bytes, req->rounded, p.fresh, req->kind)) != VMM_OK) goto undo_plan;
  /* 2. record, handle objects, table slot, range */
  size_t bound = mode == VMM_ASSEMBLE_NEW ? SIZE_MAX : vmm_handle_bound(a, p.fresh); /* never cut outside a scope */
  n_new = cut_count(p.fresh, bound);
  if (!(slots = calloc(p.n_idle + n_new, sizeof *slots)) || (!into && !(m = vmm_mapping_new(0))) ||
      (!into && vmm_table_reserve(&a->table))) {
    st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a mapping record");
    goto undo_record;
  }
  vmm_handle **fresh = slots + p.n_idle;
  size_t rest = p.fresh;
  for (uint32_t i = 0; i < n_new; rest -= fresh[i]->size, i++) {
    if (!(fresh[i] = vmm_handle_new(0, cut(rest, bound), req->kind))) {
      st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for %u handle records", n_new);
      goto undo_record;
    }
  }
  size_t extent = p.covered + p.fresh;
  vmm_assert(!into || extent == into->extent);
  if (!into && (st = vmm_ranges_alloc(a, extent, &m->base, &m->reservation)) != VMM_OK) {
    char cause[sizeof a->last_error], b[32]; /* the reservation's message names no request */
    memcpy(cause, a->last_error, sizeof cause);
    vmm_fail(a, st, "%s %s (requested %zu B, rounded %zu B): %s", vmm_kind_name(req->kind), vmm_fmt_bytes(extent, b),
             req->bytes, req->rounded, cause);
    goto undo_record;
  }
  /* 3-5. streams, new memory, pooled mappings taken apart */
  if ((st = create_handles(a, req, fresh, n_new, p.fresh)) != VMM_OK) goto undo_range;
  if ((st = unmap_apart(a, &p)) != VMM_OK) goto undo_created;
  /* 6. map and grant access */
  if (p.n_idle) memcpy(slots, p.use, p.n_idle * sizeof *p.use);
  vmm_driver_entry failed = VMM_DRV_mem_map;
  size_t first_stuck = a->stuck_count;
  CUresult r = vmm_map_handles(a, m->base, slots, p.n_idle + n_new, extent, &failed);
  if (r != CUDA_SUCCESS) {
    char b[32];
    st = vmm_fail_driver(a, r, failed, "%s %s (requested %zu B, rounded %zu B): mapping %u handles at 0x%llx",
                         vmm_kind_name(req->kind), vmm_fmt_bytes(extent, b), req->bytes, req->rounded,
                         p.n_idle + n_new, (unsigned long long)m->base);
    restore_apart(a, p.apart, p.n_apart);
    p.n_apart = 0;
    if (!into) vmm_free_range_unless_stuck(a, m->base, extent, m->reservation, first_stuck);
    goto undo_created_only;
  }
  /* commit */
  count_plan(a, &p, -1);
  commit_apart(a, &p);
  attach_handles(m, slots, p.n_idle + n_new);
  vmm_add_mapped(a, extent);
  if (!into) {
    m->extent = extent;
    m->kind = req->kind;
    m->state = VMM_MAP_LIVE;
    vmm_stat_add(a, m->kind, m->state, m->extent, +1);
    vmm_table_insert(&a->table, m);
  }
  if (p.n_idle) {
    a->assemblies++;
    a->assembled_idle_handles += p.n_idle;
    a->assembly_created_bytes += p.fresh;
    if (mode == VMM_ASSEMBLE_PADDED) a->padded_assemblies++;
  }
  free(p.use);
  free(p.apart);
  *out = m;
  return VMM_OK;

undo_created:
  if (!into) vmm_ranges_free(a, m->base, extent, m->reservation);
undo_created_only:
  release_created(a, fresh, n_new);
  goto undo_record;
undo_range:
  if (!into) vmm_ranges_free(a, m->base, extent, m->reservation);
undo_record:
  if (slots)
    for (uint32_t i = 0; i < n_new; i++) free(slots[p.n_idle + i]);
  free(slots);
  if (!into) vmm_mapping_free(m);
undo_plan:
  count_plan(a, &p, -1);
  plan_undo(a, &p);
  free(p.use);
  free(p.apart);
  return st;
}

#define VMM_BOUND_SHARE 64             /* an idle handle no request can use costs at most ~1.6% of the peak */
#define VMM_BOUND_MAX ((size_t)256 << 20) /* beyond this, fewer calls gain nothing measurable */

size_t vmm_handle_bound(const vmm_arena *a, size_t fresh) {
  if (a->handle_bound) return a->handle_bound;
  uint64_t peak = a->scope == VMM_SCOPE_ACTIVE ? a->scope_peak : a->physical_bytes;
  if (fresh > peak) peak = fresh; /* a first request larger than all held is not cut finer than 1/64 of it */
  size_t target = (size_t)(peak / VMM_BOUND_SHARE), bound = a->granularity;
  while (bound * 2 <= target && bound * 2 <= VMM_BOUND_MAX) bound *= 2;
  return bound;
}
