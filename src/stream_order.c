/* Stream order: when freed memory may be used again (vmm_order_may_serve), in three answers.
 * Ordered by the program: the same stream, a wait the program made (vmm_arena_stream_waited),
 * or, inside a capture, the streams' join (capture_join.c). Known complete: a quiesce after the
 * free, or a fence event queried. Ordered by an event of the arena's, where the policy allows.
 * Nothing is recorded on, waited from or synchronized on a capturing stream; frees of shared
 * memory on a capturing stream are deferred until the capture is over. */
#include <stdlib.h>

#include "internal.h"

CUresult vmm_order_capture_query(vmm_arena *a, CUstream s, bool *capturing) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = VMM_DRV(a, stream_is_capturing, s, &status);
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) { /* the legacy stream, while another stream captures */
    *capturing = true;
    return CUDA_SUCCESS;
  }
  *capturing = r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
  return r;
}

int vmm_order_capturing(vmm_arena *a, CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = VMM_DRV(a, stream_is_capturing, s, &status);
  return r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The arena's order event, made on first use; NULL (recorded) if it cannot be made. */
static CUevent order_event(vmm_arena *a) {
  if (!a->order_event) {
    CUresult r = VMM_DRV(a, event_create, &a->order_event, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      a->order_event = NULL;
      vmm_errors_fail_driver(a, r, VMM_DRV_event_create, "creating the stream-order event");
    }
  }
  return a->order_event;
}

/* Whether c's stream captures (asked once). */
static bool ctx_capturing(vmm_reuse_ctx *c) {
  if (c->capturing < 0) c->capturing = vmm_order_capturing(c->a, c->stream);
  return c->capturing;
}

/* Orders c->stream after the work queued on `s` by now, with no host wait; false where one of
 * the two captures or a driver call fails. Nothing to do for c->stream itself. */
static bool order_after(vmm_reuse_ctx *c, CUstream s) {
  vmm_arena *a = c->a;
  if (s == c->stream) return true;
  if (ctx_capturing(c) || vmm_order_capturing(a, s)) return false;
  CUevent e = order_event(a);
  if (!e) return false;
  CUresult r = VMM_DRV(a, event_record, e, s);
  if (r != CUDA_SUCCESS) {
    vmm_errors_fail_driver(a, r, VMM_DRV_event_record, "recording the freeing stream for reuse");
    return false;
  }
  r = VMM_DRV(a, stream_wait_event, c->stream, e, 0);
  if (r != CUDA_SUCCESS) {
    vmm_errors_fail_driver(a, r, VMM_DRV_stream_wait_event, "ordering the reusing stream after the free");
    return false;
  }
  return true;
}

vmm_reuse_ctx vmm_order_reuse_on(vmm_arena *a, CUstream stream, bool last_resort) {
  return (vmm_reuse_ctx){a, stream, -1, !vmm_policy_of(a)->orders_by_event_last || a->cfg.order_by_event || last_resort,
                         false};
}

vmm_reuse_ctx vmm_order_reuse_anywhere(vmm_arena *a) { return (vmm_reuse_ctx){a, NULL, -1, false, true}; }

static bool stream_done(vmm_arena *a, CUstream s, uint64_t seq);

static vmm_fence *fence_find(vmm_arena *a, CUstream s);

/* A: the work on `s` that freed number `seq` is before c->stream's next work in the program's
 * own order: the same stream, or a wait the program made (vmm_arena_stream_waited) at a later
 * mark, while c->stream does not capture (a graph replays outside that order). */
static bool program_ordered(vmm_reuse_ctx *c, CUstream s, uint64_t seq) {
  if (c->anywhere) return false;
  if (s == c->stream) return true;
  const vmm_fence *f = fence_find(c->a, s);
  for (int i = 0; f && i < VMM_FENCE_WAITERS; i++)
    if (f->waiters[i].mark && f->waiters[i].mark >= seq && f->waiters[i].stream == c->stream) return !ctx_capturing(c);
  return false;
}

/* B or C for a slot wait: its own event, recorded here where the free could not
 * (the other stream captured then), is known complete or, by event, waited for by c->stream;
 * nothing is recorded or waited for while c->stream captures and orders by event (its graph
 * would wait on outside work). */
static bool slot_event_over(vmm_reuse_ctx *c, const vmm_free_work *w) {
  vmm_arena *a = c->a;
  CUevent *e = w->event;
  if (c->by_event && ctx_capturing(c)) return false;
  vmm_order_slot_event(a, e, w->stream);
  return *e && (c->by_event ? vmm_order_wait_event(a, c->stream, *e) : vmm_order_event_complete(a, *e));
}

bool vmm_order_may_serve(vmm_reuse_ctx *c, const vmm_free_work *w, const vmm_join *markers) {
  vmm_arena *a = c->a;
  if (!c->anywhere && markers && markers->capture && vmm_join_reached(a, markers, c->stream)) return true; /* A */
  if (w->event) return program_ordered(c, w->stream, w->seq) || slot_event_over(c, w); /* A, B or C */
  bool queryable = a->drv->version >= 3 && a->drv->event_query;
  bool all = true;
  for (int64_t i = -1; i < (int64_t)w->use_count; i++) {
    CUstream s = i < 0 ? w->stream : w->uses[i];
    if (program_ordered(c, s, w->seq) || w->seq <= a->quiesced_seq) continue; /* A; B by a quiesce */
    if (c->by_event ? order_after(c, s) : queryable && stream_done(a, s, w->seq)) continue; /* C; B by a fence */
    all = false;
    if (!c->anywhere) return false;
  }
  return all;
}

bool vmm_order_can_wait_for_free(vmm_arena *a, const vmm_mapping *m) {
  return m->free_seq <= a->quiesced_seq || !vmm_order_capturing(a, m->stream);
}

/* Waits for one stream that used pooled mapping m, unless waited already (see below). */
static vmm_status wait_for_one(vmm_arena *a, const vmm_mapping *m, CUstream s, const char *what, CUstream *waited,
                               size_t *n_waited, size_t cap) {
  for (size_t i = 0; i < *n_waited; i++)
    if (waited[i] == s) return VMM_OK;
  char b[32];
  bool capturing;
  CUresult r = vmm_order_capture_query(a, s, &capturing);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_stream_is_capturing, "%s: reading the capture state of stream %p", what,
                           (void *)s);
  if (capturing)
    return vmm_errors_fail(a, VMM_ERR_SCOPE_STATE,
                    "%s: pooled %s at 0x%llx was used on stream %p, which is capturing and cannot be waited for "
                    "before the unmap; nothing touched",
                    what, vmm_errors_fmt_bytes(m->extent, b), (unsigned long long)m->base, (void *)s);
  r = VMM_DRV(a, stream_synchronize, s);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_stream_synchronize, "%s: waiting for stream %p before unmapping pooled %s at 0x%llx",
                           what, (void *)s, vmm_errors_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  if (*n_waited < cap) waited[(*n_waited)++] = s;
  return VMM_OK;
}

vmm_status vmm_order_wait_for_free(vmm_arena *a, const vmm_mapping *m, const char *what, CUstream *waited, size_t *n_waited,
                             size_t cap) {
  if (m->free_seq <= a->quiesced_seq) return VMM_OK; /* a quiesce came after the free */
  vmm_status st = wait_for_one(a, m, m->stream, what, waited, n_waited, cap);
  for (uint32_t i = 0; i < m->use_count && st == VMM_OK; i++) st = wait_for_one(a, m, m->uses[i], what, waited, n_waited, cap);
  return st;
}

CUresult vmm_order_stream_wait(vmm_arena *a, CUstream stream) { return VMM_DRV(a, stream_synchronize, stream); }

vmm_status vmm_order_quiesce(vmm_arena *a) {
  CUresult r = VMM_DRV(a, ctx_synchronize);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_ctx_synchronize, "synchronizing device %d to quiesce", a->cfg.device);
  a->quiesced_seq = a->free_seq; /* every free before now is complete */
  return VMM_OK;
}

void vmm_order_fini(vmm_arena *a) {
  (void)VMM_DRV(a, ctx_synchronize);
  if (a->order_event) (void)VMM_DRV(a, event_destroy, a->order_event);
  a->order_event = NULL;
  for (size_t i = 0; i < a->fence_count; i++)
    if (a->fences[i].event) (void)VMM_DRV(a, event_destroy, a->fences[i].event);
  free(a->fences);
  a->fences = NULL;
  a->fence_count = 0;
  while (a->spare_event_count) (void)VMM_DRV(a, event_destroy, a->spare_events[--a->spare_event_count]);
  free(a->spare_events);
  a->spare_events = NULL;
}

/* ---- Capture mode ---------------------------------------------------------------------- */

bool vmm_order_capture_relax(vmm_arena *a, CUstreamCaptureMode *saved) {
  if (!a->captures_underway || a->drv->version < 3 || !a->drv->thread_exchange_stream_capture_mode) return false;
  *saved = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (VMM_DRV_COUNTED(a, thread_exchange_stream_capture_mode, saved) == CUDA_SUCCESS) return true;
  vmm_errors_log(1, a->cfg.log_level, "vmmarena: cuThreadExchangeStreamCaptureMode failed: a capture in global mode may be "
                               "invalidated by the arena's calls");
  return false;
}

void vmm_order_capture_restore(vmm_arena *a, bool relaxed, CUstreamCaptureMode saved) {
  if (relaxed) (void)VMM_DRV_COUNTED(a, thread_exchange_stream_capture_mode, &saved);
}

/* ---- Fences: frees known complete without a host wait ----------------------------------- */

static vmm_fence *fence_find(vmm_arena *a, CUstream s) {
  for (size_t i = 0; i < a->fence_count; i++)
    if (a->fences[i].stream == s) return &a->fences[i];
  return NULL;
}

/* The fence of `s`, made where it has none; NULL when the host is out of memory. */
static vmm_fence *fence_of(vmm_arena *a, CUstream s) {
  vmm_fence *f = fence_find(a, s);
  if (f) return f;
  vmm_fence *room = vmm_array_room(a->fences, a->fence_count, &a->fence_cap, sizeof *room);
  if (!room) return NULL;
  a->fences = room;
  a->fences[a->fence_count] = (vmm_fence){.stream = s};
  return &a->fences[a->fence_count++];
}

/* Whether the frees on `s` numbered at most `seq` are known complete. Where none is pending, a
 * fence is recorded on `s` (not while it captures) and asked about at once. */
static bool stream_done(vmm_arena *a, CUstream s, uint64_t seq) {
  vmm_fence *f = fence_of(a, s);
  if (!f) return false;
  if (f->completed >= seq) return true;
  if (!f->recorded && !vmm_order_capturing(a, s) && (f->event || (f->event = vmm_order_event_get(a))) &&
      vmm_order_event_record(a, f->event, s))
    f->recorded = a->free_seq;
  if (f->recorded && VMM_DRV(a, event_query, f->event) == CUDA_SUCCESS) f->completed = f->recorded, f->recorded = 0;
  return f->completed >= seq;
}

/* ---- The program's own order (vmm_arena_stream_mark, vmm_arena_stream_waited) -------------- */

vmm_status vmm_arena_stream_mark(vmm_arena *a, CUstream stream, uint64_t *mark) {
  if (!a || !mark) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  *mark = vmm_order_capturing(a, stream) ? 0 : a->free_seq;
  pthread_mutex_unlock(&a->lock);
  return VMM_OK;
}

/* Keeps the highest mark per waiter; a new waiter takes an unused entry or the lowest mark's. */
static void learn_wait(vmm_fence *f, CUstream waiter, uint64_t mark) {
  int room = 0;
  for (int i = 0; i < VMM_FENCE_WAITERS; i++) {
    if (f->waiters[i].mark && f->waiters[i].stream == waiter) {
      if (f->waiters[i].mark < mark) f->waiters[i].mark = mark;
      return;
    }
    if (f->waiters[i].mark < f->waiters[room].mark) room = i;
  }
  f->waiters[room].stream = waiter;
  f->waiters[room].mark = mark;
}

vmm_status vmm_arena_stream_waited(vmm_arena *a, CUstream waiter, CUstream source, uint64_t mark) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (mark > a->free_seq)
    st = vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                         "stream_waited(stream %p after %p): mark %llu is past the %llu frees of device %d so far; "
                         "nothing learned",
                         (void *)waiter, (void *)source, (unsigned long long)mark, (unsigned long long)a->free_seq,
                         a->cfg.device);
  else if (mark && waiter != source && !vmm_order_capturing(a, waiter)) {
    vmm_fence *f = fence_of(a, source); /* none (host out of memory): nothing learned, which is safe */
    if (f) learn_wait(f, waiter, mark);
  }
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Events of slot waits ------------------------------------------------------------- */

CUevent vmm_order_event_get(vmm_arena *a) {
  if (a->spare_event_count) return a->spare_events[--a->spare_event_count];
  CUevent e = NULL;
  CUresult r = VMM_DRV(a, event_create, &e, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) return e;
  vmm_errors_fail_driver(a, r, VMM_DRV_event_create, "creating an event for a slot another stream used");
  return NULL;
}

void vmm_order_event_put(vmm_arena *a, CUevent e) {
  CUevent *room = vmm_array_room(a->spare_events, a->spare_event_count, &a->spare_event_cap, sizeof *room);
  if (!room) {
    (void)VMM_DRV(a, event_destroy, e);
    return;
  }
  a->spare_events = room;
  a->spare_events[a->spare_event_count++] = e;
}

bool vmm_order_event_record(vmm_arena *a, CUevent e, CUstream stream) {
  CUresult r = VMM_DRV(a, event_record, e, stream);
  if (r == CUDA_SUCCESS) return true;
  vmm_errors_fail_driver(a, r, VMM_DRV_event_record, "recording an event on stream %p after a slot it used was freed",
                  (void *)stream);
  return false;
}

void vmm_order_slot_event(vmm_arena *a, CUevent *e, CUstream s) {
  if (*e || vmm_order_capturing(a, s) || !(*e = vmm_order_event_get(a)) || vmm_order_event_record(a, *e, s)) return;
  vmm_order_event_put(a, *e);
  *e = NULL;
}

bool vmm_order_event_complete(vmm_arena *a, CUevent e) {
  return a->drv->version >= 3 && a->drv->event_query && VMM_DRV(a, event_query, e) == CUDA_SUCCESS;
}

bool vmm_order_wait_event(vmm_arena *a, CUstream stream, CUevent e) {
  CUresult r = VMM_DRV(a, stream_wait_event, stream, e, 0);
  if (r == CUDA_SUCCESS) return true;
  vmm_errors_fail_driver(a, r, VMM_DRV_stream_wait_event, "ordering stream %p after another stream's use of a slot",
                  (void *)stream);
  return false;
}

/* ---- Frees deferred by a capture ------------------------------------------------------ */

void vmm_order_deferred_push(vmm_arena *a, vmm_mapping *m, CUstream stream) {
  vmm_mapping_defer(a, m, stream);
  m->pool_next = a->deferred_head;
  a->deferred_head = m;
  a->deferred_frees++;
}

void vmm_order_deferred_abandon_scope(vmm_arena *a, uint64_t scope_id) {
  for (vmm_mapping **link = &a->deferred_head; *link;) {
    vmm_mapping *m = *link;
    if (m->scope_id != scope_id) {
      link = &m->pool_next;
      continue;
    }
    *link = m->pool_next;
    m->pool_next = NULL;
    vmm_mapping_abandon(a, m);
  }
}

void vmm_order_process_deferred(vmm_arena *a) {
  vmm_mapping **link = &a->deferred_head;
  while (*link) {
    vmm_mapping *m = *link;
    bool pool = vmm_policy_of(a)->free_never_waits; /* pooled: reuse is ordered by events, no wait */
    if (vmm_order_capturing(a, m->stream) || (!pool && VMM_DRV(a, stream_synchronize, m->stream) != CUDA_SUCCESS)) {
      link = &m->pool_next;
      continue;
    }
    *link = m->pool_next;
    m->pool_next = NULL;
    if (pool && vmm_mapping_pool(a, m, m->stream) == 0) continue;
    bool unmapped;
    if (vmm_mapping_unmap_and_end(a, m, vmm_policy_of(a)->keeps_frees, "a deferred free", &unmapped) != VMM_OK && !unmapped) {
      /* The unmap failed: keep it deferred for the next attempt. */
      m->pool_next = *link;
      *link = m;
      return;
    }
  }
}
