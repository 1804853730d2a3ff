/* Assembly: a mapping built in a fresh range from idle handles mapped back to back, with new
 * memory created only for what the idle handles do not cover. Inside a scope new memory is cut
 * into handles of at most the arena's bound, so that once freed it can serve any later request.
 * In whole-process mode a pooled mapping taken whole may instead grow in place: it stays where
 * it is mapped and the rest is mapped in the free VA right after or before it, so that only the
 * rest is mapped and given access (the driver charges per handle) and no old range retires.
 *
 * The plan is made first and touches nothing but the store's indexes. Then the steps run in
 * the order of the table `steps` below; when one fails, those before it are undone, last
 * first, so that the arena is exactly as it was. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct plan {
  vmm_handle **use;       /* handles to map, in address order: idle ones, then the new ones */
  uint32_t n_use, n_idle; /* n_idle of them idle, n_idle_tier of those from the idle tier */
  uint32_t n_idle_tier;
  vmm_mapping **apart;    /* pooled mappings to take apart */
  size_t n_apart;
  size_t covered;         /* bytes of the idle handles chosen */
  size_t fresh;           /* bytes to create */
  vmm_reuse_ctx *order;   /* the request's stream (NULL for a resume: nothing is taken apart early) */
  vmm_pool_id graph_pool;       /* the request's pool */
  bool early_shared;      /* shared pooled mappings may be taken apart early (no capture underway) */
  vmm_mapping *grow;      /* a pooled mapping taken whole that stays mapped where it is, or NULL */
  CUdeviceptr beside;     /* where the rest goes: right after grow or right before it */
  size_t beside_bytes;    /* the rest: the bytes of the other handles */
  CUstream **split_uses;  /* for apart[i] split early: a copy of its uses, for the piece that retires */
  size_t n_split;         /* entries of split_uses (n_apart when made: an undo zeroes n_apart) */
} plan;

vmm_assembly_mode vmm_assembly_mode_for(const vmm_arena *a, vmm_kind kind) {
  const vmm_policy *pol = vmm_policy_of(a);
  bool assembles = pol->keeps_frees && a->cfg.reuse != VMM_REUSE_NONE &&
                   (kind == VMM_KIND_TRANSIENT || !pol->holds_until_finish || a->cfg.package_assembly);
  return assembles ? VMM_ASSEMBLE_EXACT : VMM_ASSEMBLE_NEW;
}

/* ---- The plan ------------------------------------------------------------------------ */

static bool all_taken(const vmm_mapping *m) {
  for (uint32_t i = 0; i < m->handle_count; i++)
    if (!m->handles[i]->taken) return false;
  return true;
}

static bool has_handle_at_most(const vmm_mapping *m, size_t most) {
  for (uint32_t i = 0; i < m->handle_count; i++)
    if (m->handles[i]->size <= most) return true;
  return false;
}

/* A graph's pooled mapping serves only a request of its own pool, in stream order (during a
 * capture: on the capturing stream that freed it), from its first handles: those the request
 * takes leave it, and the rest stays a pooled mapping of the pool (none of its handles may
 * reach the shared idle tier while the graph lives). The range of those taken stays mapped,
 * retiring, until the pool is released: the graph's replays use that address. */
static bool graph_takes_apart(vmm_arena *a, const plan *p, vmm_mapping *m, size_t left, bool padded) {
  if (!vmm_policy_of(a)->graph_pools_keep || !p->order || m->graph_pool != p->graph_pool || padded || m->handles[0]->size > left)
    return false;
  vmm_free_work w = vmm_order_work_of(m);
  return (m->early = vmm_order_may_serve(p->order, &w, &m->join));
}

/* A pooled mapping may be taken apart if it is of the shared pool (a graph's memory stays its
 * own) and its streams can be waited for. In whole-process mode the allocation path never
 * waits on the host: once its work is known complete (a fence or a quiesce), or early, where
 * the request's stream can be ordered after that work; then its range retires (retiring.c). */
static bool can_take_apart(vmm_arena *a, const plan *p, vmm_mapping *m, size_t left, bool padded) {
  if (m->chosen) return false;
  if (m->graph_pool != VMM_POOL_SHARED) return graph_takes_apart(a, p, m, left, padded);
  if (!(padded || has_handle_at_most(m, left))) return false;
  if (!vmm_policy_of(a)->retires_taken_apart) return vmm_order_can_wait_for_free(a, m);
  m->early = false;
  vmm_free_work w = vmm_order_work_of(m);
  vmm_reuse_ctx any = vmm_order_reuse_anywhere(a);
  if (vmm_order_may_serve(&any, &w, NULL)) return true;
  /* early: its first handles only, the rest stays pooled (idle, it could serve before its work is done) */
  return p->early_shared && !padded && m->handles[0]->size <= left && (m->early = vmm_order_may_serve(p->order, &w, &m->join));
}

/* The pooled mapping to take apart for `left` bytes: the smallest that covers them, else the
 * largest smaller one. */
static vmm_mapping *pick_apart(vmm_arena *a, const plan *p, size_t left, bool padded) {
  for (vmm_bucket *b = vmm_store_pool_bucket_near(&a->store.pool, left, true); b;
       b = vmm_store_pool_bucket_near(&a->store.pool, b->size + 1, true)) {
    vmm_assert(b->head); /* no empty bucket */
    for (vmm_mapping *m = b->head; m; m = m->pool_next)
      if (can_take_apart(a, p, m, left, padded)) return m;
  }
  for (vmm_bucket *b = left > 1 ? vmm_store_pool_bucket_near(&a->store.pool, left - 1, false) : NULL; b;
       b = b->size > 1 ? vmm_store_pool_bucket_near(&a->store.pool, b->size - 1, false) : NULL) {
    vmm_assert(b->head);
    for (vmm_mapping *m = b->head; m; m = m->pool_next)
      if (can_take_apart(a, p, m, left, padded)) return m;
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
  for (uint32_t i = 0; i < p->n_idle_tier; i++) {
    vmm_kind_stats *k = &a->kind[p->use[i]->kind];
    k->idle_count += (uint64_t)(int64_t)sign;
    k->idle_bytes += (uint64_t)((int64_t)sign * (int64_t)p->use[i]->size);
  }
}

/* Puts back everything the plan took from the store's indexes. */
static void plan_undo(vmm_arena *a, plan *p) {
  for (uint32_t i = 0; i < p->n_idle; i++) {
    p->use[i]->taken = false;
    if (i < p->n_idle_tier) vmm_store_idle_put(a, p->use[i]);
  }
  for (size_t i = 0; i < p->n_apart; i++) p->apart[i]->chosen = p->apart[i]->early = false;
}

/* Chooses idle handles for `rounded` bytes: the largest unmapped handle that fits what is
 * left, repeatedly; then handles of pooled mappings taken apart. Padded: the last handle may
 * be larger than what is left. */
static void plan_idle(vmm_arena *a, plan *p, size_t rounded, bool padded) {
  size_t left = rounded;
  vmm_handle *h;
  while (left && (h = vmm_store_idle_take_at_most(a, left)) != NULL) plan_use(p, h, &left);
  if (left && padded && (h = vmm_store_idle_take_at_least(a, left)) != NULL) plan_use(p, h, &left);
  p->n_idle_tier = p->n_use;
  vmm_mapping *m;
  size_t share = vmm_policy_of(a)->overshoot_share;
  size_t over = share && p->order && !padded ? rounded / share : 0; /* not a resume: its size is fixed */
  while (left && (m = pick_apart(a, p, left, padded)) != NULL) {
    m->chosen = true;
    p->apart[p->n_apart++] = m;
    for (uint32_t i = 0; i < m->handle_count && left; i++)
      if (m->handles[i]->size <= left) plan_use(p, m->handles[i], &left);
      else if (m->handles[i]->size - left <= over) plan_use(p, m->handles[i], &left);
      else if (m->graph_pool != VMM_POOL_SHARED || m->early) break; /* a graph's, or early: its first handles only */
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

/* ---- Growing in place ---------------------------------------------------------------- */

#define VMM_GROW_LOOK 16 /* pooled mappings looked at for one to grow */

/* Where `bytes` more fit next to pooled m: right after it, else right before it; 0: nowhere. */
static CUdeviceptr room_beside(const vmm_arena *a, const vmm_mapping *m, size_t bytes) {
  if (vmm_ranges_is_free(&a->ranges, m->base + m->extent, bytes, m->reservation)) return m->base + m->extent;
  if (m->base > bytes && vmm_ranges_is_free(&a->ranges, m->base - bytes, bytes, m->reservation)) return m->base - bytes;
  return 0;
}

/* Before the plan: the largest pooled mapping smaller than the request that it may take apart
 * (can_take_apart says which: a graph's memory serves only its own pool), with room beside it
 * for the rest (and its overshoot), among the first VMM_GROW_LOOK looked at, largest first; it
 * is chosen whole. */
static vmm_mapping *pick_growth(vmm_arena *a, plan *p, size_t rounded) {
  size_t looked = 0;
  for (vmm_bucket *b = vmm_store_pool_bucket_near(&a->store.pool, rounded - 1, false); b && looked < VMM_GROW_LOOK;
       b = b->size > 1 ? vmm_store_pool_bucket_near(&a->store.pool, b->size - 1, false) : NULL) {
    vmm_assert(b->head);
    for (vmm_mapping *m = b->head; m && looked < VMM_GROW_LOOK; m = m->pool_next, looked++) {
      size_t rest = rounded - m->extent;
      if (room_beside(a, m, rest + rest / VMM_OVERSHOOT_SHARE) && can_take_apart(a, p, m, rounded, false))
        return m;
    }
  }
  return NULL;
}

/* After the plan: of the pooled mappings it takes whole, the one of the most handles with room
 * beside it for the rest, or NULL. */
static vmm_mapping *pick_taken_whole(const vmm_arena *a, const plan *p) {
  vmm_mapping *best = NULL;
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_mapping *m = p->apart[i];
    if (all_taken(m) && (!best || m->handle_count > best->handle_count) &&
        room_beside(a, m, p->covered + p->fresh - m->extent))
      best = m;
  }
  return best;
}

/* Plans the request with one pooled mapping grown in place where one fits: chosen first (the rest
 * planned after it), or else one the plan took whole. */
static void plan_growth(vmm_arena *a, plan *p, size_t rounded) {
  vmm_mapping *g = pick_growth(a, p, rounded);
  if (g) {
    g->chosen = true;
    plan_idle(a, p, rounded - g->extent, false);
    p->apart[p->n_apart++] = g;
    size_t left = SIZE_MAX;
    for (uint32_t i = 0; i < g->handle_count; i++) plan_use(p, g->handles[i], &left);
    p->n_idle = p->n_use;
  } else {
    plan_idle(a, p, rounded, false);
    g = pick_taken_whole(a, p);
  }
  if (!g) return;
  p->grow = g;
  p->beside_bytes = p->covered + p->fresh - g->extent;
  p->beside = room_beside(a, g, p->beside_bytes);
  vmm_assert(p->beside);
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
    if (m->early) { /* never unmapped */
      m->early = false;
      vmm_store_pool_push(&a->store.pool, m);
      continue;
    }
    vmm_driver_entry failed;
    size_t first_stuck = a->ranges.stuck_count;
    if (vmm_mapping_map_handles(a, m->base, m->handles, m->handle_count, m->extent, &failed) == CUDA_SUCCESS) {
      vmm_accounting_add_mapped(a, m->extent);
      vmm_store_pool_push(&a->store.pool, m); /* cannot fail: its bucket is on the spare list or in the tree */
      continue;
    }
    vmm_mapping_end_unmapped(a, m, true, first_stuck);
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
    vmm_status st = vmm_admission_admit_device(a, req->bytes, req->rounded, fresh, n, req->kind);
    if (st != VMM_OK) return st;
  }
  for (uint32_t i = 0; i < n; i++) {
    CUresult r = vmm_handle_create(a, h[i]);
    if (r == CUDA_SUCCESS) continue;
    release_created(a, h, i);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return vmm_admission_refuse_driver_oom(a, req->bytes, req->rounded, req->kind);
    char b[2][32];
    return vmm_errors_fail_driver(a, r, VMM_DRV_mem_create,
                           "%s %s (requested %zu B, rounded %zu B): creating physical memory (handle %u of %u, %s)",
                           vmm_errors_kind_name(req->kind), vmm_errors_fmt_bytes(req->rounded, b[0]), req->bytes, req->rounded, i + 1,
                           n, vmm_errors_fmt_bytes(h[i]->size, b[1]));
  }
  return VMM_OK;
}

/* For each mapping taken apart early that gives only its first handles (it stays pooled with
 * the rest), a copy of the streams record_stream added, for the piece that retires: that piece
 * is still read through its own range by their work. -1 on host out of memory. */
static int copy_split_uses(plan *p) {
  for (size_t i = 0; i < p->n_apart; i++) {
    const vmm_mapping *m = p->apart[i];
    if (!m->early || m == p->grow || all_taken(m) || !m->use_count) continue;
    if (!p->split_uses) {
      if (!(p->split_uses = calloc(p->n_apart, sizeof *p->split_uses))) return -1;
      p->n_split = p->n_apart;
    }
    if (!(p->split_uses[i] = malloc(m->use_count * sizeof **p->split_uses))) return -1;
    memcpy(p->split_uses[i], m->uses, m->use_count * sizeof **p->split_uses);
  }
  return 0;
}

static void free_split_uses(plan *p) {
  for (size_t i = 0; i < p->n_split; i++) free(p->split_uses[i]);
  free(p->split_uses);
  p->split_uses = NULL;
}

/* Unmaps the mappings taken apart, after waiting for their freeing streams (in whole-process
 * mode they are known complete already: no wait); those taken early, and in whole-process mode
 * a shared one taken whole, stay mapped: their ranges retire. */
static vmm_status unmap_apart(vmm_arena *a, plan *p) {
  CUstream waited[8];
  size_t n_waited = 0, n_early = 0;
  bool retires = vmm_policy_of(a)->retires_taken_apart;
  for (size_t i = 0; i < p->n_apart; i++) { /* a whole shared one stays mapped: it may serve again */
    vmm_mapping *m = p->apart[i];
    if (retires && m->graph_pool == VMM_POOL_SHARED && all_taken(m)) m->early = true;
    n_early += m->early && m != p->grow; /* the grown one stays mapped, but does not retire */
  }
  if (n_early && (vmm_retiring_reserve(a, n_early) || vmm_store_pool_reserve(&a->store.pool, n_early) || copy_split_uses(p)))
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for %zu retiring ranges", n_early);
  for (size_t i = 0; i < p->n_apart && !retires; i++) { /* whole-process mode: known complete */
    vmm_status st = vmm_order_wait_for_free(a, p->apart[i], "assembly", waited, &n_waited, 8);
    if (st == VMM_ERR_SCOPE_STATE) st = VMM_ERR_OUT_OF_MEMORY; /* began capturing since the plan */
    if (st != VMM_OK) return st;
  }
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_mapping *m = p->apart[i];
    vmm_store_pool_remove(&a->store.pool, m);
    if (m->early) continue;
    vmm_status st = vmm_mapping_unmap(a, m, "taking a pooled mapping apart for an assembly");
    if (st != VMM_OK) {
      vmm_store_pool_push(&a->store.pool, m); /* still mapped; its bucket is on the spare list */
      for (size_t j = i; j < p->n_apart; j++) p->apart[j]->chosen = p->apart[j]->early = false; /* pooled as before */
      restore_apart(a, p->apart, i);
      p->n_apart = 0; /* restored: nothing left to undo */
      return st;
    }
  }
  return VMM_OK;
}

/* A mapping taken apart early (or whole): its range retires, whole, or, where it gave only its
 * first handles, the part of them (with `uses`, the copy of its uses that copy_split_uses made),
 * and the rest stays pooled in place. A shared one's retired range keeps its handle list, to
 * serve again (retiring.c). */
static void retire_early(vmm_arena *a, vmm_mapping *m, CUstream *uses) {
  uint32_t taken = 0;
  while (taken < m->handle_count && m->handles[taken]->taken) taken++;
  vmm_kind kind = m->kind;
  /* a shared range keeps the list of the handles it maps; a graph's, or none for the host, only retires */
  vmm_handle **list = m->graph_pool == VMM_POOL_SHARED ? malloc(taken * sizeof *list) : NULL;
  if (list) memcpy(list, m->handles, taken * sizeof *list);
  vmm_retiring_range range;
  if (taken < m->handle_count) {
    vmm_mapping_split_off(a, m, taken, uses, &range);
    m->chosen = m->early = false;
    (void)vmm_store_pool_push(&a->store.pool, m); /* a spare bucket was reserved */
  } else { /* every handle taken */
    for (uint32_t j = 0; j < m->handle_count; j++) m->handles[j] = NULL;
    vmm_mapping_end_retiring(a, m, &range);
  }
  range.handles = list, range.handle_count = list ? taken : 0, range.kind = kind;
  vmm_retiring_add(a, &range);
}

/* The assembly has succeeded: the mappings taken apart give up their chosen handles and keep
 * the rest idle (or, a graph's, pooled); the handles in use forget their store positions. The
 * one grown in place gives its record up: its range and handles are the new mapping's. */
static void commit_apart(vmm_arena *a, plan *p) {
  for (size_t i = 0; i < p->n_apart; i++) {
    vmm_mapping *m = p->apart[i];
    if (m == p->grow) {
      vmm_mapping_end_into_grown(a, m);
      continue;
    }
    a->pooled_taken_apart++;
    if (m->early) {
      retire_early(a, m, p->split_uses ? p->split_uses[i] : NULL);
      if (p->split_uses) p->split_uses[i] = NULL; /* the retiring range's now */
      continue;
    }
    for (uint32_t j = 0; j < m->handle_count; j++)
      if (m->handles[j]->taken) m->handles[j] = NULL;
    vmm_mapping_end_unmapped(a, m, true, VMM_NO_STUCK);
  }
}

/* ---- The steps ----------------------------------------------------------------------- */

typedef struct assembly {
  const vmm_request *req;
  vmm_reuse_ctx order;   /* the request's stream, for pooled mappings taken apart early */
  vmm_assembly_mode mode;
  vmm_mapping *into, *m; /* into: a paused allocation mapped back; m: the mapping built */
  plan p;
  vmm_handle **created;  /* the n_new new handles; on failure, these are released */
  vmm_handle **slots;    /* the handles of the mapping, in the order they are mapped */
  uint32_t n_new;
  size_t extent;
  size_t first_stuck;    /* stuck pieces from here on are the failed map's own */
} assembly;

/* Plans req (a resume when `resume`: nothing is taken apart early) into *p, ordered by *order. */
static vmm_status plan_make(vmm_arena *a, const vmm_request *req, bool resume, bool padded, vmm_reuse_ctx *order,
                            plan *p) {
  *order = vmm_order_reuse_on(a, req->stream, req->last_resort);
  p->order = resume ? NULL : order;
  p->graph_pool = req->graph_pool;
  p->early_shared = vmm_policy_of(a)->retires_taken_apart && !a->captures_underway && !resume && req->graph_pool == VMM_POOL_SHARED;
  p->use = malloc((a->store.idle_count + a->store.pool.handles + 1) * sizeof *p->use);
  p->apart = malloc((a->store.pool.count + 1) * sizeof *p->apart);
  if (!p->use || !p->apart) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for an assembly");
  if (vmm_grows_in_place(a) && !resume && !padded) plan_growth(a, p, req->rounded);
  else plan_idle(a, p, req->rounded, padded);
  return VMM_OK;
}

/* The most the arena may hold after a refill of req; 0: no refill. */
static double refill_room(const vmm_arena *a, const vmm_request *req) {
  if (a->cfg.refill_share > 0.0) return a->cfg.refill_share * (double)a->high_water;
  uint64_t live = a->allocated_bytes + req->bytes;
  if (live < a->live_high_water) live = a->live_high_water;
  return a->cfg.refill_live_share * (double)live; /* 0 when off */
}

bool vmm_assembly_refill_wanted(vmm_arena *a, const vmm_request *req) {
  if (!vmm_policy_of(a)->refills || (double)(a->physical_bytes + req->rounded) > refill_room(a, req)) return false;
  plan p = {0};
  vmm_reuse_ctx order;
  bool several = plan_make(a, req, false, false, &order, &p) == VMM_OK && p.n_use > 1;
  plan_undo(a, &p); /* a dry run: the store is as it was (a plan never made took nothing) */
  free(p.use);
  free(p.apart);
  return several;
}

bool vmm_assembly_needs_new(vmm_arena *a, const vmm_request *req) {
  plan p = {0};
  vmm_reuse_ctx order;
  bool needs = plan_make(a, req, false, false, &order, &p) != VMM_OK || p.fresh > 0;
  plan_undo(a, &p); /* the dry run leaves the store as it was */
  free(p.use);
  free(p.apart);
  return needs;
}

static vmm_status plan_step(vmm_arena *a, assembly *x) {
  if (x->mode == VMM_ASSEMBLE_NEW || x->mode == VMM_ASSEMBLE_REFILL) {
    x->p.fresh = x->req->rounded;
    return VMM_OK;
  }
  vmm_status st = plan_make(a, x->req, x->into != NULL, x->mode == VMM_ASSEMBLE_PADDED, &x->order, &x->p);
  if (st == VMM_OK) count_plan(a, &x->p, +1);
  return st;
}

static void plan_step_undo(vmm_arena *a, assembly *x) {
  if (x->mode == VMM_ASSEMBLE_NEW || x->mode == VMM_ASSEMBLE_REFILL) return;
  count_plan(a, &x->p, -1);
  plan_undo(a, &x->p);
}

/* A padded assembly uses idle handles only, and at least one. */
static vmm_status padded_step(vmm_arena *a, assembly *x) {
  if (x->mode != VMM_ASSEMBLE_PADDED || (!x->p.fresh && x->p.n_idle)) return VMM_OK;
  char b[2][32];
  return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "idle handles cover %s of %s", vmm_errors_fmt_bytes(x->p.covered, b[0]),
                  vmm_errors_fmt_bytes(x->req->rounded, b[1]));
}

static vmm_status admit_step(vmm_arena *a, assembly *x) {
  return x->p.fresh ? vmm_admission_admit(a, x->req->bytes, x->req->rounded, x->p.fresh, x->req->kind) : VMM_OK;
}

static void records_step_undo(vmm_arena *a, assembly *x);

/* The record, its table slot, the handle list and the handle objects of the new memory (cut to
 * the bound). */
static vmm_status records_step(vmm_arena *a, assembly *x) {
  size_t bound = x->mode == VMM_ASSEMBLE_NEW ? SIZE_MAX : vmm_handle_bound(a, x->p.fresh); /* never cut outside a scope */
  x->n_new = cut_count(x->p.fresh, bound);
  if (!(x->slots = calloc(x->p.n_idle + x->n_new, sizeof *x->slots)) ||
      !(x->created = calloc(x->n_new + 1, sizeof *x->created)) /* +1: no calloc of 0 */ ||
      (!x->into && !(x->m = vmm_mapping_new())) ||
      (!x->into && vmm_table_reserve(&a->table))) {
    records_step_undo(a, x);
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a mapping record");
  }
  size_t rest = x->p.fresh;
  for (uint32_t i = 0; i < x->n_new; rest -= x->created[i]->size, i++)
    if (!(x->created[i] = vmm_handle_new(cut(rest, bound), x->req->kind))) {
      records_step_undo(a, x);
      return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for %u handle records", x->n_new);
    }
  x->extent = x->p.covered + x->p.fresh;
  vmm_assert(!x->into || x->extent == x->into->extent);
  return VMM_OK;
}

static void records_step_undo(vmm_arena *a, assembly *x) {
  (void)a;
  if (x->created)
    for (uint32_t i = 0; i < x->n_new; i++) free(x->created[i]);
  free(x->slots);
  x->slots = NULL;
  if (!x->into) vmm_mapping_free_record(x->m);
  x->m = x->into;
}

/* A fresh VA range; for a growth, the free VA beside the mapping grown. */
static vmm_status range_step(vmm_arena *a, assembly *x) {
  if (x->into) return VMM_OK;
  const vmm_mapping *g = x->p.grow;
  vmm_status st = g ? vmm_ranges_claim(a, x->p.beside, x->p.beside_bytes, g->reservation)
                    : vmm_ranges_alloc(a, x->extent, &x->m->base, &x->m->reservation);
  if (g && st == VMM_OK) x->m->base = x->p.beside < g->base ? x->p.beside : g->base, x->m->reservation = g->reservation;
  if (st != VMM_OK) {
    char cause[sizeof a->last_error], b[32]; /* the reservation's message names no request */
    memcpy(cause, a->last_error, sizeof cause);
    vmm_errors_fail(a, st, "%s %s (requested %zu B, rounded %zu B): %s", vmm_errors_kind_name(x->req->kind),
             vmm_errors_fmt_bytes(x->extent, b), x->req->bytes, x->req->rounded, cause);
  }
  x->first_stuck = VMM_NO_STUCK;
  return st;
}

static void range_step_undo(vmm_arena *a, assembly *x) {
  if (x->into) return;
  bool grown = x->p.grow != NULL;
  vmm_ranges_free_unless_stuck(a, grown ? x->p.beside : x->m->base, grown ? x->p.beside_bytes : x->extent,
                               x->m->reservation, x->first_stuck);
}

static vmm_status create_step(vmm_arena *a, assembly *x) {
  return create_handles(a, x->req, x->created, x->n_new, x->p.fresh);
}

static void create_step_undo(vmm_arena *a, assembly *x) { release_created(a, x->created, x->n_new); }

static vmm_status apart_step(vmm_arena *a, assembly *x) { return unmap_apart(a, &x->p); }

static void apart_step_undo(vmm_arena *a, assembly *x) {
  restore_apart(a, x->p.apart, x->p.n_apart);
  x->p.n_apart = 0;
}

static void reverse(vmm_handle **h, uint32_t from, uint32_t to) {
  for (; from + 1 < to; from++, to--) {
    vmm_handle *t = h[from];
    h[from] = h[to - 1];
    h[to - 1] = t;
  }
}

/* Puts the grown mapping's handles (one run among the n slots, in order) first when the rest
 * goes after it, last when it goes before it; the others keep their order. Returns where the
 * others start. */
static uint32_t order_around_growth(assembly *x, uint32_t n) {
  const vmm_mapping *g = x->p.grow;
  uint32_t k = g->handle_count, at = 0;
  while (x->slots[at] != g->handles[0]) at++;
  if (x->p.beside > g->base) { /* rotate [0, at + k) so that the run leads */
    reverse(x->slots, 0, at), reverse(x->slots, at, at + k), reverse(x->slots, 0, at + k);
    return k;
  }
  reverse(x->slots, at, at + k), reverse(x->slots, at + k, n), reverse(x->slots, at, n); /* the run last */
  return 0;
}

/* Maps the handles back to back in the new range and gives it access; for a growth, only the
 * others, in the VA beside the grown mapping. The mapping's handle list is put in order here:
 * idle handles, then the new ones, the grown mapping's moved to its side. */
static vmm_status map_step(vmm_arena *a, assembly *x) {
  const vmm_mapping *g = x->p.grow;
  uint32_t n = x->p.n_idle + x->n_new, from = 0;
  if (x->p.n_idle) memcpy(x->slots, x->p.use, x->p.n_idle * sizeof *x->p.use);
  if (x->n_new) memcpy(x->slots + x->p.n_idle, x->created, x->n_new * sizeof *x->created);
  if (g) from = order_around_growth(x, n);
  CUdeviceptr at = g ? x->p.beside : (x->into ? x->into : x->m)->base;
  uint32_t count = g ? n - g->handle_count : n;
  size_t bytes = g ? x->p.beside_bytes : x->extent;
  vmm_driver_entry failed = VMM_DRV_mem_map;
  x->first_stuck = a->ranges.stuck_count;
  CUresult r = vmm_mapping_map_handles(a, at, x->slots + from, count, bytes, &failed);
  if (r == CUDA_SUCCESS) return VMM_OK;
  char b[2][32];
  return vmm_errors_fail_driver(a, r, failed, "%s %s (requested %zu B, rounded %zu B): mapping %u handles (%s) at 0x%llx%s",
                         vmm_errors_kind_name(x->req->kind), vmm_errors_fmt_bytes(x->extent, b[0]), x->req->bytes, x->req->rounded,
                         count, vmm_errors_fmt_bytes(bytes, b[1]), (unsigned long long)at,
                         g ? ", beside the pooled mapping it grows" : "");
}

/* In order. A step that fails leaves nothing of its own behind; the undo of each step before
 * it then runs, last first, and reverses that step exactly. */
static const struct {
  vmm_status (*run)(vmm_arena *a, assembly *x);
  void (*undo)(vmm_arena *a, assembly *x);
} steps[] = {
    {plan_step, plan_step_undo},       /* idle handles chosen from the store's indexes */
    {padded_step, NULL},               /* a padded assembly needs no new memory */
    {admit_step, NULL},                /* the new bytes within the limit and the headroom */
    {records_step, records_step_undo}, /* record, table slot, handle objects */
    {range_step, range_step_undo},     /* a fresh VA range (none for a paused allocation) */
    {create_step, create_step_undo},   /* the new handles */
    {apart_step, apart_step_undo},     /* pooled mappings taken apart, after their freeing streams */
    {map_step, NULL},                  /* everything mapped back to back; undoes itself */
};

/* The assembly succeeded: the store forgets the handles used, the record goes live. */
static void commit(vmm_arena *a, assembly *x) {
  vmm_mapping *m = x->into ? x->into : x->m;
  uint32_t kept = x->p.grow ? x->p.grow->handle_count : 0; /* mapped where they were */
  count_plan(a, &x->p, -1);
  commit_apart(a, &x->p);
  vmm_mapping_attach(m, x->slots, x->p.n_idle + x->n_new);
  vmm_accounting_add_mapped(a, kept ? x->p.beside_bytes : x->extent);
  if (!x->into) vmm_mapping_insert_live(a, m, x->extent, x->req->kind);
  a->grown_in_place += kept > 0;
  if (x->p.n_idle) {
    a->assemblies++;
    a->assembled_idle_handles += x->p.n_idle - kept;
    a->assembly_created_bytes += x->p.fresh;
    if (x->mode == VMM_ASSEMBLE_PADDED) a->padded_assemblies++;
  }
  a->refills += x->mode == VMM_ASSEMBLE_REFILL;
}

vmm_status vmm_assembly_build(vmm_arena *a, const vmm_request *req, vmm_assembly_mode mode, vmm_mapping *into,
                        vmm_mapping **out) {
  assembly x = {.req = req, .mode = mode, .into = into, .m = into};
  vmm_status st = VMM_OK;
  vmm_retiring_settle(a); /* a new range is wanted: the ranges whose work is done go back first */
  size_t done = 0;
  vmm_unmapper_mapping(a, +1); /* the arena's thread starts no unmap until the mapping is done */
  for (; done < sizeof steps / sizeof steps[0] && st == VMM_OK; done++) st = steps[done].run(a, &x);
  if (st == VMM_OK) {
    commit(a, &x);
    *out = x.into ? x.into : x.m;
  } else {
    for (done--; done-- > 0;) /* the failed step undid itself */
      if (steps[done].undo) steps[done].undo(a, &x);
  }
  vmm_unmapper_mapping(a, -1);
  free_split_uses(&x.p);
  free(x.p.use);
  free(x.p.apart);
  free(x.created);
  return st;
}
