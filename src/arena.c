/* Arena: whole mappings. Where a mapping comes from (the ordered list of sources below), how a
 * live one is freed (pooled, deferred, abandoned or unmapped), quiesce, destroy, and the error
 * accessors. One mutex per arena; stream synchronization happens outside it. The public
 * allocate and free are in alloc.c, creation in arena_create.c; docs/design.md draws how the
 * other files divide the work. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

size_t vmm_arena_granularity(const vmm_arena *a) { return a ? a->granularity : 0; }
int vmm_arena_device(const vmm_arena *a) { return a ? a->cfg.device : -1; }

/* ---- Allocate ------------------------------------------------------------------------ */

#define NOTHING VMM_STATUS_COUNT /* a source that does not apply, or found nothing */

static bool pooling(const vmm_arena *a, const vmm_request *req) {
  return vmm_policy_pools(vmm_policy_of(a), req->kind) && a->cfg.reuse != VMM_REUSE_NONE;
}

static bool assembling(const vmm_arena *a, const vmm_request *req) {
  return vmm_assembly_mode_for(a, req->kind) == VMM_ASSEMBLE_EXACT;
}

/* The largest extent the reuse policy hands to a request of `rounded` bytes. */
static size_t reuse_limit(const vmm_arena *a, const vmm_request *req) {
  size_t rounded = req->rounded;
  if (req->exact) return rounded;
  if (a->cfg.reuse == VMM_REUSE_BEST_FIT) return SIZE_MAX;
  size_t share = vmm_policy_of(a)->overshoot_share;
  if (a->cfg.reuse != VMM_REUSE_BOUNDED) return rounded + (share ? rounded / share : 0); /* exact */
  double bound = (double)rounded * a->cfg.reuse_bound;
  return bound >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bound;
}

/* A pooled mapping goes only to a request of its kind and pool, ordered after its streams; in
 * whole-process mode a graph's request whose own pool has nothing for it then takes a shared one
 * whose free is known complete (nothing can be ordered after another stream from a capture),
 * which joins the graph's pool as it is handed out. */
typedef struct hit_ctx {
  vmm_reuse_ctx order;
  vmm_kind kind;
  vmm_pool_id graph_pool;
  bool shared; /* a graph's request, from the shared cache */
} hit_ctx;

static bool hit_usable(void *arg, vmm_mapping *m) {
  hit_ctx *c = arg;
  if (m->kind != c->kind) return false;
  vmm_free_work w = vmm_order_work_of(m);
  if (c->shared) return m->graph_pool == VMM_POOL_SHARED && vmm_order_may_serve(&c->order, &w, NULL);
  return m->graph_pool == c->graph_pool && vmm_order_may_serve(&c->order, &w, &m->join);
}

/* The hit context of `req`; for a graph's request from the shared cache (`shared`), of any
 * stream, unordered: the free must be known complete. */
static hit_ctx hit_of(vmm_arena *a, const vmm_request *req, bool shared) {
  return (hit_ctx){shared ? vmm_order_reuse_anywhere(a) : vmm_order_reuse_on(a, req->stream, req->last_resort), req->kind,
                   req->graph_pool, shared};
}

static vmm_mapping *take_pooled(vmm_arena *a, const vmm_request *req, size_t most, bool shared) {
  hit_ctx c = hit_of(a, req, shared);
  return vmm_store_pool_take(&a->store.pool, req->rounded, most, hit_usable, &c);
}

static vmm_status from_pool(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req)) return NOTHING;
  *out = take_pooled(a, req, reuse_limit(a, req), false);
  if (*out) a->pool_hits++;
  else a->pool_misses++;
  return *out ? VMM_OK : NOTHING;
}

/* Whole-process mode: a run of a larger pooled mapping's handles, in place, where they make the
 * request (or up to 1/32 more); those before and after it stay pooled (no driver call, as a
 * caching allocator splits a block). */
static vmm_status take_run(vmm_arena *a, const vmm_request *req, bool shared, vmm_mapping **out) {
  if (!vmm_policy_of(a)->splits_in_place || !pooling(a, req) || a->cfg.reuse != VMM_REUSE_EXACT) return NOTHING;
  if (vmm_store_pool_reserve(&a->store.pool, 2)) return NOTHING;
  hit_ctx c = hit_of(a, req, shared);
  uint32_t first, count;
  vmm_mapping *m = vmm_store_pool_take_run(&a->store.pool, req->rounded, reuse_limit(a, req), hit_usable, &c, &first, &count);
  vmm_mapping *after = NULL;
  if (!m) return NOTHING;
  vmm_mapping *run = vmm_mapping_split_run(a, m, first, count, &after);
  if (run != m) (void)vmm_store_pool_push(&a->store.pool, m); /* spare buckets were reserved */
  if (after) (void)vmm_store_pool_push(&a->store.pool, after);
  if (!run) return NOTHING; /* host out of memory: m is pooled as it was */
  if (first) a->run_hits++;
  else a->prefix_hits++;
  *out = run;
  return VMM_OK;
}

static vmm_status from_pool_run(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return take_run(a, req, false, out);
}

/* Whole-process mode: a graph's request that its own pool cannot serve takes a shared pooled
 * mapping of its size, or a run of one, whose free is known complete, with no driver call. Its
 * own pool first: what the graph's pool holds is the graph's until the pool is released, so a
 * shared mapping taken while the pool had one would be held twice. */
static vmm_status from_shared_whole(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!vmm_policy_of(a)->graph_pools_keep || req->graph_pool == VMM_POOL_SHARED || !pooling(a, req)) return NOTHING;
  if ((*out = take_pooled(a, req, reuse_limit(a, req), true)) != NULL) {
    a->pool_misses--, a->pool_hits++; /* what from_pool counted a miss of the graph's pool is a hit */
    return VMM_OK;
  }
  return take_run(a, req, true, out);
}

/* Whole-process mode: a retired range of exactly the request's size (or a run of a larger
 * one's handles), its handles free again, serves as it is mapped (no driver call; retiring.c). */
static vmm_status revive_retired_range(vmm_arena *a, const vmm_request *req, bool part, vmm_mapping **out) {
  if (!vmm_policy_of(a)->retires_taken_apart || !pooling(a, req) || req->graph_pool != VMM_POOL_SHARED) return NOTHING;
  return vmm_retiring_revive(a, req, part, out);
}

static vmm_status from_retired(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return revive_retired_range(a, req, false, out);
}

static vmm_status from_retired_run(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return revive_retired_range(a, req, true, out);
}

static vmm_status from_refill(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return assembling(a, req) && vmm_assembly_refill_wanted(a, req) ? vmm_assembly_build(a, req, VMM_ASSEMBLE_REFILL, NULL, out)
                                                         : NOTHING; /* refused: the assembly it replaced is next */
}

static vmm_status from_idle_and_new(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return assembling(a, req) ? vmm_assembly_build(a, req, VMM_ASSEMBLE_EXACT, NULL, out) : NOTHING;
}

static vmm_status from_new_memory(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return assembling(a, req) ? NOTHING : vmm_assembly_build(a, req, VMM_ASSEMBLE_NEW, NULL, out);
}

static vmm_status from_any_pooled(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req) || req->exact) return NOTHING;
  *out = take_pooled(a, req, SIZE_MAX, false);
  if (*out) a->pool_fallbacks++;
  return *out ? VMM_OK : NOTHING;
}

static vmm_status from_idle_padded(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!pooling(a, req) || req->exact) return NOTHING;
  vmm_status st = vmm_assembly_build(a, req, VMM_ASSEMBLE_PADDED, NULL, out);
  return st == VMM_ERR_OUT_OF_MEMORY ? NOTHING : st;
}

/* Whole-process mode outside a scope: the cache goes back to the driver, then the request is
 * tried once more. */
static bool has_cache(const vmm_arena *a) { return a->store.pool.count || a->store.idle_count || a->pages.pages; }

static vmm_status from_released_cache(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (!vmm_policy_of(a)->releases_on_refusal || !has_cache(a)) return NOTHING;
  char refusal[sizeof a->last_error];
  memcpy(refusal, a->last_error, sizeof refusal);
  vmm_status st = vmm_arena_release_cache(a, "a request refused new memory", false);
  memcpy(a->last_error, refusal, sizeof refusal); /* the refusal stays the message if the retry fails too */
  if (st != VMM_OK) return NOTHING;
  a->cache_releases++;
  return vmm_assembly_build(a, req, vmm_assembly_mode_for(a, req->kind), NULL, out);
}

/* Whole-process mode orders a request after incomplete frees by events (the request's stream
 * waits for them) only as its last resort: inside a scope before new memory, and before a
 * refusal. Then the reuse sources are tried again, the assembly last. */
static bool may_order_by_event(const vmm_arena *a, const vmm_request *req) {
  return vmm_policy_of(a)->orders_by_event_last && !a->cfg.order_by_event && !req->last_resort && pooling(a, req) &&
         a->store.pool.count;
}

static vmm_status take_by_event(vmm_arena *a, const vmm_request *req, bool refused, vmm_mapping **out) {
  static vmm_status (*const reuse[])(vmm_arena *, const vmm_request *, vmm_mapping **) = {
      from_retired, from_pool_run, from_retired_run, from_idle_and_new, from_any_pooled};
  vmm_request ordered = *req;
  ordered.last_resort = true;
  if ((*out = take_pooled(a, &ordered, reuse_limit(a, &ordered), false)) != NULL) {
    a->pool_misses--, a->pool_hits++; /* what from_pool counted a miss is a hit */
    return VMM_OK;
  }
  size_t n = refused ? 5 : 4; /* any pooled mapping, whatever its size, only once new memory was refused */
  vmm_status st = NOTHING;
  for (size_t i = 0; i < n && (st == NOTHING || st == VMM_ERR_OUT_OF_MEMORY); i++) st = reuse[i](a, &ordered, out);
  return st;
}

static vmm_status from_ordered_before_new(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  if (a->scope != VMM_SCOPE_ACTIVE || !may_order_by_event(a, req) || !vmm_assembly_needs_new(a, req)) return NOTHING;
  return take_by_event(a, req, false, out);
}

static vmm_status from_ordered_before_refusal(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  return may_order_by_event(a, req) ? take_by_event(a, req, true, out) : NOTHING;
}

/* Where a mapping comes from, in this order. A source answers with a mapping, NOTHING (the
 * next one tries), a refusal of new memory (VMM_ERR_OUT_OF_MEMORY: the next one tries, and
 * the fallbacks open), or another error, which ends the list. */
static const struct {
  bool after_refusal; /* tried only once new memory was refused */
  vmm_status (*take)(vmm_arena *a, const vmm_request *req, vmm_mapping **out);
} sources[] = {
    {false, from_pool},          /* pool hit: a pooled mapping the reuse policy allows, no driver call */
    {false, from_retired},       /* whole-process mode: a retired range of the size, its handles free again */
    {false, from_pool_run},      /* whole-process mode: a run of a larger pooled mapping's handles, in place */
    {false, from_retired_run},   /* whole-process mode: a run of a larger retired range's handles, in place */
    {false, from_shared_whole},  /* whole-process mode, a graph's request: a complete shared mapping or run, whole */
    {false, from_ordered_before_new}, /* whole-process mode in a scope: the above and the assembly ordered by events */
    {false, from_refill},        /* VMMARENA_REFILL: new memory within its mark, not several cached handles */
    {false, from_idle_and_new},  /* assembly: idle handles back to back, new memory only for the rest */
    {false, from_new_memory},    /* new memory: one handle, where nothing is kept */
    {true, from_any_pooled},     /* pooled fallback: any pooled mapping that fits, whatever its size */
    {true, from_idle_padded},    /* padded assembly: idle handles, the last one larger than what is left */
    {true, from_ordered_before_refusal}, /* whole-process mode: the reuse sources ordered by events */
    {true, from_released_cache}, /* whole-process mode: the cache released, then new memory again */
};

vmm_status vmm_arena_alloc_mapping(vmm_arena *a, const vmm_request *req, vmm_mapping **out) {
  vmm_order_process_deferred(a);
  char refusal[sizeof a->last_error];
  bool refused = false;
  for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
    if (sources[i].after_refusal && !refused) continue;
    vmm_status st = sources[i].take(a, req, out);
    if (st == VMM_OK) {
      vmm_mapping_hand_out(a, *out, req, a->scope == VMM_SCOPE_ACTIVE ? a->scope_id : 0);
      return VMM_OK;
    }
    if (st == NOTHING) continue;
    if (st != VMM_ERR_OUT_OF_MEMORY) return st;
    if (!refused) memcpy(refusal, a->last_error, sizeof refusal);
    refused = true;
  }
  vmm_assert(refused);
  a->refusals++;
  if (!pooling(a, req)) {
    memcpy(a->last_error, refusal, sizeof refusal);
    return VMM_ERR_OUT_OF_MEMORY;
  }
  char b[2][32];
  return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s; no pooled mapping fits (pool %zu mappings, %s; %zu idle handles, %s)",
                  refusal, a->store.pool.count, vmm_errors_fmt_bytes(a->store.pool.bytes, b[0]), a->store.idle_count,
                  vmm_errors_fmt_bytes(a->store.idle_bytes, b[1]));
}

/* ---- Releasing the cache ---------------------------------------------------------- */

vmm_status vmm_arena_free_page(vmm_arena *a, vmm_mapping *m) {
  vmm_page_key key = m->page->set->key;
  bool freed;
  vmm_pages_uncarve(a, m);
  vmm_status st = vmm_arena_free_allocation(a, m, key.stream, &freed);
  if (freed) return VMM_OK;
  vmm_pages_carve(a, m, &key); /* with the record just given up */
  return st;
}

/* Empty pages (their last slot given back once its other streams' work is complete, waited for
 * on the host with `wait`) back to the pool as whole mappings; the first that cannot be freed
 * stops the call. */
static vmm_status free_empty_pages(vmm_arena *a, bool wait) {
  vmm_status st = vmm_pages_settle(a, wait);
  vmm_mapping *m;
  while (st == VMM_OK && (m = vmm_pages_find_empty(a)) != NULL) st = vmm_arena_free_page(a, m);
  return st;
}

vmm_status vmm_arena_release_cache(vmm_arena *a, const char *what, bool wait_for_slots) {
  vmm_status st = free_empty_pages(a, wait_for_slots);
  return st == VMM_OK ? vmm_drain_all(a, what) : st;
}

/* ---- Free ---------------------------------------------------------------------------- */

static const char *state_name(vmm_mapping_state s) {
  switch (s) {
  case VMM_MAP_LIVE: return "live";
  case VMM_MAP_POOLED: return "already freed (idle in the pool)";
  case VMM_MAP_FREEING: return "already being freed by another call";
  case VMM_MAP_DEFERRED: return "already freed (waiting for a capture to end)";
  case VMM_MAP_ABANDONED: return "already freed (abandoned by an aborted scope)";
  case VMM_MAP_PAUSED: return "paused";
  case VMM_MAP_MOVING: return "being paused or resumed by another call";
  }
  return "?";
}

vmm_status vmm_arena_refuse_pointer(vmm_arena *a, CUdeviceptr p, vmm_mapping *m) {
  char b[32];
  if (m && !m->page)
    return vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): %s %s allocation of %zu bytes is %s", (unsigned long long)p,
                    vmm_errors_fmt_bytes(m->extent, b), vmm_errors_kind_name(m->kind), m->requested,
                    vmm_mapping_kept(m) ? "already freed (paused; its graph's pool keeps the range)" : state_name(m->state));
  vmm_mapping *c = m ? m : vmm_table_containing(&a->table, p);
  if (c && c->page)
    return vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER,
                    "free(0x%llx): no taken slot starts there in the %s page at 0x%llx (slots of %zu bytes, %u of %u "
                    "taken); free takes the address allocated",
                    (unsigned long long)p, vmm_errors_kind_name(c->kind), (unsigned long long)c->base,
                    c->page->set->key.slot_size, c->page->used, c->page->slots);
  if (c)
    return vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER,
                    "free(0x%llx): interior pointer, %llu bytes into the %s allocation at 0x%llx (%s extent, %zu bytes "
                    "requested); free takes the base pointer",
                    (unsigned long long)p, (unsigned long long)(p - c->base), vmm_errors_kind_name(c->kind),
                    (unsigned long long)c->base, vmm_errors_fmt_bytes(c->extent, b), c->requested);
  return vmm_errors_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): not an allocation of the arena of device %d (%zu mappings)",
                  (unsigned long long)p, a->cfg.device, a->table.count);
}

/* Unmaps a live allocation now, after its stream's work: the stream is synchronized with the
 * lock released (the record FREEING meanwhile). *freed: it left the live allocations. */
static vmm_status free_now(vmm_arena *a, vmm_mapping *m, CUstream stream, bool *freed) {
  vmm_mapping_begin_freeing(a, m);
  pthread_mutex_unlock(&a->lock);
  CUresult r = vmm_order_stream_wait(a, stream);
  pthread_mutex_lock(&a->lock);
  vmm_mapping_end_freeing(a, m);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_stream_synchronize, "synchronizing stream %p before freeing 0x%llx",
                           (void *)stream, (unsigned long long)m->base);
  if (vmm_scope_aborted(a, m->scope_id)) { /* aborted while the stream synchronized, unlocked */
    vmm_mapping_abandon(a, m);
    *freed = true;
    return VMM_OK;
  }
  /* A failed unmap leaves the allocation live (*freed false): a later free retries. */
  return vmm_mapping_unmap_and_end(a, m, vmm_policy_of(a)->keeps_frees, "free", freed);
}

/* Whether a free on `stream` waits for a capture to end before its memory is kept or given
 * back (the graph may use it until then). Outside whole-process mode only what is not pooled is
 * asked about. In whole-process mode only shared-pool memory, and only while a capture is
 * underway, so that a free makes no driver call otherwise. */
static bool waits_for_capture(vmm_arena *a, const vmm_mapping *m, CUstream stream, bool pooled) {
  if (vmm_policy_of(a)->free_never_waits)
    return a->captures_underway && m->graph_pool == VMM_POOL_SHARED && vmm_order_capturing(a, stream);
  return !pooled && vmm_order_capturing(a, stream);
}

/* Frees a live mapping: abandoned with its aborted scope, pooled where frees keep their
 * memory, deferred while its stream captures, or unmapped now. */
static vmm_status free_live(vmm_arena *a, vmm_mapping *m, CUstream stream, bool *freed) {
  vmm_order_process_deferred(a);
  *freed = true;
  if (vmm_scope_aborted(a, m->scope_id)) {
    vmm_mapping_abandon(a, m);
    return VMM_OK;
  }
  if (m->graph_pool != VMM_POOL_SHARED && vmm_ids_has(&a->released_graph_pools, m->graph_pool))
    m->graph_pool = VMM_POOL_SHARED; /* its graph is gone: shared, as release_pool made what was pooled */
  const vmm_policy *pol = vmm_policy_of(a);
  bool pooled = vmm_policy_pools(pol, m->kind);
  bool capturing = waits_for_capture(a, m, stream, pooled);
  /* where no bucket can be allocated, the mapping is freed the plain way (handles kept idle) */
  if (pooled && !capturing && vmm_mapping_pool(a, m, stream) == 0) return VMM_OK;
  if (pooled && !pol->free_never_waits) capturing = vmm_order_capturing(a, stream); /* the pool had no room */
  if (capturing) {
    vmm_order_deferred_push(a, m, stream);
    return VMM_OK;
  }
  *freed = false;
  return free_now(a, m, stream, freed);
}

/* Memory allocated into a graph's pool stays the pool's while the graph lives (SPEC, "CUDA
 * graphs"): the graph replays into it even after the allocation is freed. */
static bool graph_keeps(const vmm_arena *a, const vmm_mapping *m) {
  return vmm_policy_of(a)->graph_pools_keep && m->graph_pool != VMM_POOL_SHARED && !vmm_ids_has(&a->released_graph_pools, m->graph_pool);
}

vmm_status vmm_arena_free_allocation(vmm_arena *a, vmm_mapping *m, CUstream stream, bool *freed) {
  *freed = false;
  if (m->state == VMM_MAP_PAUSED && graph_keeps(a, m)) {
    if (m->handle_count) { /* mapped again by a resume whose copy failed: pooled as it is */
      vmm_mapping_resume(a, m);
      return vmm_arena_free_allocation(a, m, stream, freed);
    }
    vmm_mapping_keep(m); /* its range stays the pool's, unbacked, until resume or release_pool */
    *freed = true;
    return VMM_OK;
  }
  if (m->state == VMM_MAP_PAUSED) {
    vmm_status st = vmm_mapping_end_paused(a, m, vmm_policy_of(a)->keeps_frees);
    *freed = st == VMM_OK;
    return st;
  }
  uint32_t tag = m->tag;
  size_t extent = m->extent;
  vmm_status st = free_live(a, m, stream, freed);
  if (*freed) vmm_accounting_add_tag(a, tag, extent, -1);
  return st;
}

vmm_status vmm_arena_free_kept(vmm_arena *a, vmm_mapping *m) {
  bool freed;
  m->kept = false;
  return vmm_arena_free_allocation(a, m, m->stream, &freed);
}

vmm_status vmm_arena_quiesce(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_order_process_deferred(a);
  vmm_status st = vmm_order_quiesce(a);
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Destroy ------------------------------------------------------------------------- */

void vmm_arena_destroy(vmm_arena *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  a->destroying = true; /* failures are logged, and nothing is kept for a retry */
  vmm_pages_fini(a);
  vmm_order_fini(a); /* waits for all work first */
  vmm_join_fini(a);
  vmm_unmapper_stop(a);
  vmm_retiring_fini(a);
  vmm_ipc_fini(a); /* imports of other processes' memory still open */
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) {
    if (m->page) vmm_pages_forget(a, m);
    vmm_mapping_destroy(a, m);
  }
  vmm_handle *h;
  while ((h = vmm_store_idle_largest(a)) != NULL) {
    vmm_store_idle_remove(a, h);
    (void)vmm_handle_release(a, h);
  }
  while ((h = vmm_store_abandoned_pop(a)) != NULL) (void)vmm_handle_release(a, h);
  vmm_store_pool_fini(&a->store.pool);
  vmm_table_fini(&a->table);
  vmm_ranges_fini(a);
  vmm_copier_stop(a); /* threads, staging and copy streams of pause and resume */
  vmm_arena_create_close_device(a);
  vmm_trace_close(a->trace);
  vmm_ids_fini(&a->aborted_scopes);
  vmm_ids_fini(&a->released_graph_pools);
  free(a->tag_bytes);
  free(a->tag_count);
  free(a->tag_paused_bytes);
  free(a->tag_paused_count);
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

vmm_status vmm_arena_trace(vmm_arena *a, const char *path) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  vmm_trace_close(a->trace);
  a->trace = NULL;
  if (path && !vmm_trace_arena_open(a, path))
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "trace \"%s\": cannot open for writing: %s", path, strerror(errno));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* A copy taken under the lock into a buffer of the calling thread: stable until this thread's
 * next call, however other threads fail meanwhile. */
const char *vmm_arena_last_error(vmm_arena *a) {
  static __thread char copy[sizeof a->last_error];
  if (!a) return "no arena";
  pthread_mutex_lock(&a->lock);
  memcpy(copy, a->last_error, sizeof copy);
  pthread_mutex_unlock(&a->lock);
  return copy;
}

vmm_status vmm_arena_fatal_error(vmm_arena *a, const char **message) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status s = a->fatal_status;
  if (message) *message = s == VMM_OK ? "" : a->fatal_message;
  pthread_mutex_unlock(&a->lock);
  return s;
}
