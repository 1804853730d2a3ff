/* Retired ranges (whole-process mode): the old range of a pooled mapping whose handles an
 * assembly mapped into a new range, taken early (before the work of its free was known
 * complete: the handles serve the new range at once, ordered after that work on the device) or
 * whole. The old range stays mapped, used by nothing new. A shared one keeps its handle list
 * and serves a request of its size again, as it is mapped, once those handles are free again
 * (GMLake's stitched blocks), or a run of its handles serves a smaller request in place and the
 * parts around the run stay retired; up to 256 are kept, and beyond them, or without a list, a range is
 * unmapped once its work completes. So a request never waits on the host for cached memory,
 * never creates memory it could reuse, and a cycle of sizes is stitched once. The old range of a
 * graph's pooled mapping retires only once the pool is released: the graph's replays still use
 * that address. */
#include <stdlib.h>
#include <string.h>

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

/* Range joins the list as it is (its serial included). */
static void put_item(vmm_retiring *r, const vmm_retiring_range *range) {
  vmm_assert(r->count < r->cap); /* vmm_retiring_reserve came first */
  r->items[r->count++] = *range;
  r->bytes += range->size;
  r->revivable += range->handles != NULL;
}

void vmm_retiring_add(vmm_arena *a, const vmm_retiring_range *range) {
  vmm_retiring *r = &a->retiring;
  vmm_retiring_range x = *range;
  x.serial = ++r->serial;
  put_item(r, &x);
}

/* Item i leaves the list (replaced by the last); returns it. */
static vmm_retiring_range take_item(vmm_retiring *r, size_t i) {
  vmm_retiring_range x = r->items[i];
  r->items[i] = r->items[--r->count];
  r->bytes -= x.size;
  r->revivable -= x.handles != NULL;
  return x;
}

/* Unmaps item i and frees its range, or with `background` hands it to the unmapper thread
 * where there is one; a failed unmap keeps the range stuck (unmapped at destroy), as an undo's
 * failure does. Item i is replaced by the last. */
static void unmap_one(vmm_arena *a, size_t i, const char *what, bool background) {
  vmm_retiring_range x = take_item(&a->retiring, i);
  free(x.work.uses);
  free(x.handles);
  if (background && vmm_unmapper_take(a, x.base, x.size, x.reservation)) return;
  CUresult res = VMM_DRV(a, mem_unmap, x.base, x.size);
  if (res == CUDA_SUCCESS) {
    vmm_ranges_free(a, x.base, x.size, x.reservation);
    return;
  }
  vmm_errors_log(1, a->cfg.log_level, "vmmarena: %s: unmapping the retiring range 0x%llx+%zu failed: %s; it stays mapped",
          what, (unsigned long long)x.base, x.size, vmm_errors_cu_name(a, res));
  vmm_ranges_keep_stuck(a, x.base, x.size);
}

#define VMM_REVIVABLE_MAX 256 /* retired ranges kept mapped to serve again, at most */

/* The oldest range that could serve again whose work is complete, or SIZE_MAX. */
static size_t oldest_complete(vmm_arena *a) {
  vmm_retiring *r = &a->retiring;
  size_t best = SIZE_MAX;
  vmm_reuse_ctx any = vmm_order_reuse_anywhere(a);
  for (size_t i = 0; i < r->count; i++)
    if (r->items[i].handles && (best == SIZE_MAX || r->items[i].serial < r->items[best].serial) &&
        vmm_order_may_serve(&any, &r->items[i].work, NULL))
      best = i;
  return best;
}

void vmm_retiring_settle(vmm_arena *a) {
  vmm_retiring *r = &a->retiring;
  vmm_unmapper_collect(a); /* the VA the thread has unmapped comes back first */
  vmm_reuse_ctx any = vmm_order_reuse_anywhere(a); /* unmapped once its work is complete */
  for (size_t i = r->count; i-- > 0;) /* a graph's range waits for its pool's release */
    if (r->items[i].graph_pool == VMM_POOL_SHARED && !r->items[i].handles && vmm_order_may_serve(&any, &r->items[i].work, NULL))
      unmap_one(a, i, "settling", true);
  size_t i;
  while (r->revivable > VMM_REVIVABLE_MAX && (i = oldest_complete(a)) != SIZE_MAX) unmap_one(a, i, "settling", true);
}

/* Item i can no longer serve again (its handles may go): it only retires. */
static void forget_handles(vmm_retiring *r, size_t i) {
  free(r->items[i].handles);
  r->items[i].handles = NULL;
  r->items[i].handle_count = 0;
  r->revivable--;
}

void vmm_retiring_unmap_holding(vmm_arena *a, vmm_handle *const *h, uint32_t n, const char *what) {
  vmm_retiring *r = &a->retiring;
  if (!r->revivable) return;
  for (uint32_t k = 0; k < n; k++) h[k]->taken = true;
  for (size_t i = r->count; i-- > 0;) {
    bool holds = false;
    for (uint32_t k = 0; k < r->items[i].handle_count && !holds; k++) holds = r->items[i].handles[k]->taken;
    if (holds) unmap_one(a, i, what, false); /* its handles are released next */
  }
  for (uint32_t k = 0; k < n; k++) h[k]->taken = false;
}

/* ---- Serving again ------------------------------------------------------------------- */

/* The pooled mapping holding h, if it may give h to a request of this kind on c's stream (that
 * stream is then ordered after its free); NULL otherwise. The handles of the run are marked
 * taken: a mapping with handles outside it gives them up too, to the idle tier, so only once its
 * work is known complete. */
static vmm_mapping *giver(vmm_reuse_ctx *c, const vmm_handle *h, vmm_kind kind) {
  vmm_mapping *m = h->owner;
  if (!m || m->state != VMM_MAP_POOLED || m->graph_pool != VMM_POOL_SHARED || m->page || m->kind != kind) return NULL;
  bool inside = true;
  for (uint32_t k = 0; k < m->handle_count && inside; k++) inside = m->handles[k]->taken;
  vmm_free_work w = vmm_order_work_of(m);
  vmm_reuse_ctx any = vmm_order_reuse_anywhere(c->a);
  if (!inside && !vmm_order_may_serve(&any, &w, NULL)) return NULL;
  return vmm_order_may_serve(c, &w, &m->join) ? m : NULL;
}

/* A run of a retired range's handles, [from, to), `offset` bytes into it. */
typedef struct run {
  uint32_t from, to;
  size_t offset;
} run;

static void mark_run(const vmm_retiring_range *x, run u, bool taken) {
  for (uint32_t k = u.from; k < u.to; k++) x->handles[k]->taken = taken;
}

/* Whether each handle of run u is idle or held by a pooled mapping that may give it; those
 * mappings, each once, into givers[] (room for the run's handle count) and their count into *n. */
static bool find_givers(vmm_arena *a, const vmm_retiring_range *x, run u, const vmm_request *req,
                        vmm_mapping **givers, uint32_t *count) {
  vmm_reuse_ctx c = vmm_order_reuse_on(a, req->stream, req->last_resort);
  uint32_t n = 0;
  bool ready = true;
  mark_run(x, u, true);
  for (uint32_t k = u.from; k < u.to && ready; k++) {
    vmm_handle *h = x->handles[k];
    if (h->idle || (h->owner && h->owner->chosen)) continue; /* idle: its work is done */
    vmm_mapping *m = giver(&c, h, req->kind);
    if ((ready = m != NULL)) m->chosen = true, givers[n++] = m;
  }
  mark_run(x, u, false);
  for (uint32_t g = 0; g < n; g++) givers[g]->chosen = false;
  *count = n;
  return ready;
}

/* Pooled m gives up the handles marked taken: its range retires with all its handles (it may
 * serve again), and those not taken go idle. `copy` is room for its handle list. */
static void retire_giver(vmm_arena *a, vmm_mapping *m, vmm_handle **copy) {
  uint32_t n = m->handle_count;
  vmm_kind kind = m->kind;
  memcpy(copy, m->handles, n * sizeof *copy);
  vmm_store_pool_remove(&a->store.pool, m);
  for (uint32_t k = 0; k < n; k++)
    if (m->handles[k]->taken) m->handles[k]->owner = NULL, m->handles[k] = NULL;
  vmm_retiring_range range;
  vmm_mapping_end_retiring(a, m, &range); /* the handles left go idle */
  range.handles = copy, range.handle_count = n, range.kind = kind;
  vmm_retiring_add(a, &range);
}

/* Room for serving run u of x again, so that nothing after can fail: a record, a table slot,
 * places in the list, each giver's handle list, and, for a run of part of x, the run's handle
 * list and the parts of x before and after it (their own handle lists and uses), which stay
 * retired. */
typedef struct revival {
  vmm_mapping *live;
  vmm_mapping **givers;
  vmm_handle ***lists;
  uint32_t n_givers;
  vmm_handle **handles;           /* the run's, for the live mapping */
  vmm_retiring_range parts[2];
  uint32_t n_parts;
} revival;

static void revival_free(revival *v, bool lists_too) {
  for (uint32_t g = 0; lists_too && v->lists && g < v->n_givers; g++) free(v->lists[g]);
  for (uint32_t k = 0; lists_too && k < v->n_parts; k++) free(v->parts[k].handles), free(v->parts[k].work.uses);
  if (lists_too) free(v->handles);
  free(v->lists);
  free(v->givers);
  vmm_mapping_free_record(v->live);
}

/* Part of x, its handles [from, to) at `offset` bytes into it, with copies of their list and of
 * x's uses; false on host OOM (what was copied is in *y, for revival_free). */
static bool part_of(const vmm_retiring_range *x, uint32_t from, uint32_t to, size_t offset, size_t size,
                    vmm_retiring_range *y) {
  *y = *x;
  y->base = x->base + offset, y->size = size, y->handle_count = to - from;
  y->work.uses = x->work.use_count ? malloc(x->work.use_count * sizeof *y->work.uses) : NULL;
  y->handles = malloc((to - from) * sizeof *y->handles);
  if (y->work.uses) memcpy(y->work.uses, x->work.uses, x->work.use_count * sizeof *y->work.uses);
  if (y->handles) memcpy(y->handles, x->handles + from, (to - from) * sizeof *y->handles);
  return y->handles && (y->work.uses || !x->work.use_count);
}

static bool revival_room(vmm_arena *a, const vmm_retiring_range *x, run u, size_t bytes, revival *v) {
  if (!(v->live = vmm_mapping_new()) || vmm_table_reserve(&a->table) ||
      vmm_retiring_reserve(a, v->n_givers + 2) || !(v->lists = calloc(v->n_givers ? v->n_givers : 1, sizeof *v->lists)))
    return false;
  for (uint32_t g = 0; g < v->n_givers; g++)
    if (!(v->lists[g] = malloc(v->givers[g]->handle_count * sizeof *v->lists[g]))) return false;
  if (u.from == 0 && u.to == x->handle_count) return true; /* all of x: its own list serves */
  if (!(v->handles = malloc((u.to - u.from) * sizeof *v->handles))) return false;
  memcpy(v->handles, x->handles + u.from, (u.to - u.from) * sizeof *v->handles);
  if (u.from > 0 && !part_of(x, 0, u.from, 0, u.offset, &v->parts[v->n_parts++])) return false;
  if (u.to < x->handle_count &&
      !part_of(x, u.to, x->handle_count, u.offset + bytes, x->size - u.offset - bytes, &v->parts[v->n_parts++]))
    return false;
  return true;
}

/* Run u of item i serves: its givers retire, its handles leave the idle tier, and it is live
 * again; the parts of item i before and after it stay retired. */
static vmm_mapping *revive_run(vmm_arena *a, size_t i, run u, size_t bytes, revival *v) {
  vmm_retiring *r = &a->retiring;
  mark_run(&r->items[i], u, true);
  for (uint32_t g = 0; g < v->n_givers; g++) retire_giver(a, v->givers[g], v->lists[g]);
  vmm_retiring_range x = take_item(r, i);
  mark_run(&x, u, false);
  for (uint32_t k = u.from; k < u.to; k++)
    if (x.handles[k]->idle) vmm_store_idle_remove(a, x.handles[k]);
  for (uint32_t k = 0; k < v->n_parts; k++) put_item(r, &v->parts[k]);
  free(x.work.uses);
  if (v->handles) free(x.handles); /* each part and the run have their own list */
  vmm_mapping *m = v->live;
  v->live = NULL;
  m->base = x.base + u.offset, m->reservation = x.reservation;
  vmm_mapping_attach(m, v->handles ? v->handles : x.handles, u.to - u.from);
  v->handles = NULL;
  vmm_accounting_add_mapped(a, bytes);
  vmm_mapping_insert_live(a, m, bytes, x.kind);
  r->revived++;
  r->revived_runs += u.from > 0 || u.to < x.handle_count;
  return m;
}

/* Tries run u of item i; VMM_STATUS_COUNT when its handles are not all free, or on host OOM. */
static vmm_status try_run(vmm_arena *a, size_t i, run u, const vmm_request *req, vmm_mapping **out) {
  vmm_retiring_range x = a->retiring.items[i]; /* a copy: making room may move the list */
  revival v = {0};
  if (!(v.givers = malloc((u.to - u.from) * sizeof *v.givers)) || !find_givers(a, &x, u, req, v.givers, &v.n_givers) ||
      !revival_room(a, &x, u, req->rounded, &v)) {
    revival_free(&v, true);
    return VMM_STATUS_COUNT;
  }
  *out = revive_run(a, i, u, req->rounded, &v);
  revival_free(&v, false);
  return VMM_OK;
}

vmm_status vmm_retiring_revive(vmm_arena *a, const vmm_request *req, bool part, vmm_mapping **out) {
  vmm_retiring *r = &a->retiring;
  size_t bytes = req->rounded;
  for (size_t i = r->count; i-- > 0;) {
    if (!r->items[i].handles || r->items[i].kind != req->kind) continue;
    if (!part) {
      run all = {0, r->items[i].handle_count, 0};
      if (r->items[i].size == bytes && try_run(a, i, all, req, out) == VMM_OK) return VMM_OK;
      continue;
    }
    if (r->items[i].size <= bytes) continue;
    vmm_handle **h = r->items[i].handles; /* the item's own array: it stays while the item does */
    run u = {0, 0, 0};
    size_t sum = 0; /* the bytes of [u.from, u.to) */
    while (u.to < r->items[i].handle_count) {
      sum += h[u.to++]->size;
      while (sum > bytes) sum -= h[u.from]->size, u.offset += h[u.from++]->size;
      if (sum == bytes && try_run(a, i, u, req, out) == VMM_OK) return VMM_OK;
    }
  }
  return VMM_STATUS_COUNT;
}

void vmm_retiring_release_graph_pool(vmm_arena *a, vmm_pool_id pool) {
  vmm_retiring *r = &a->retiring;
  for (size_t i = r->count; i-- > 0;)
    if (r->items[i].graph_pool == pool) unmap_one(a, i, "release_pool", true);
}

/* Waits for stream s unless it captures (*skipped then). */
static vmm_status wait_stream(vmm_arena *a, CUstream s, const char *what, bool *skipped) {
  bool capturing;
  vmm_driver_entry e = VMM_DRV_stream_is_capturing;
  CUresult res = vmm_order_capture_query(a, s, &capturing);
  if (res == CUDA_SUCCESS && capturing) *skipped = true;
  if (res == CUDA_SUCCESS && !capturing) e = VMM_DRV_stream_synchronize, res = VMM_DRV(a, stream_synchronize, s);
  if (res == CUDA_SUCCESS) return VMM_OK;
  return vmm_errors_fail_driver(a, res, e, "%s: waiting for stream %p before unmapping a retiring range", what, (void *)s);
}

vmm_status vmm_retiring_drain(vmm_arena *a, const char *what) {
  vmm_retiring *r = &a->retiring;
  for (size_t i = r->count; i-- > 0;) {
    vmm_free_work *w = &r->items[i].work;
    if (r->items[i].graph_pool != VMM_POOL_SHARED) continue; /* a live graph's: its replays use it */
    bool skipped = false;
    bool quiesced = w->seq <= a->quiesced_seq;
    vmm_status st = quiesced ? VMM_OK : wait_stream(a, w->stream, what, &skipped);
    for (uint32_t k = 0; k < w->use_count && st == VMM_OK && !quiesced; k++)
      st = wait_stream(a, w->uses[k], what, &skipped);
    if (st != VMM_OK) return st;
    if (!skipped) unmap_one(a, i, what, false); /* the cache is given back: no queue */
    else if (r->items[i].handles) forget_handles(r, i); /* mapped on, but its handles may go */
  }
  return VMM_OK;
}

void vmm_retiring_fini(vmm_arena *a) {
  vmm_retiring *r = &a->retiring;
  while (r->count) unmap_one(a, r->count - 1, "destroy", false);
  free(r->items);
  r->items = NULL;
  r->cap = 0;
}
