/* Pause and resume: the physical memory of tagged allocations goes away while their records
 * and virtual ranges stay, so pointers held by CUDA graphs, kernels and tensors stay valid;
 * resume maps memory back at the same addresses. Inside a scope the handles of a pause become
 * idle handles (reused by other allocations, released only by finish); outside one they are
 * released.
 *
 * A call works in three steps. Under the arena lock it checks, finds the tag's allocations and
 * marks them MOVING (a resume first maps memory back into their ranges). Without the lock it
 * waits for their streams (pause) and copies their contents to new host memory or back
 * (backup.c). Under the lock again it unmaps them and gives their handles away (pause), or makes
 * them live (resume). A free of a MOVING allocation is refused; a pause or resume of the same
 * tag waits for its turn. Each allocation is paused or resumed whole: a failure leaves every
 * allocation live, or paused with its backup, and a retry carries on. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* One pause or resume call. */
typedef struct call {
  const char *tag;
  char label[300];      /* pause("tag"), resume(untagged): the start of its messages */
  uint32_t id;          /* the tag's id */
  vmm_mapping **list;   /* the allocations it acts on, by base address */
  size_t n, total;      /* in the list; found at the start (resume collects again) */
  size_t first, moving; /* list[first, first + moving) are MOVING */
  void **backups;       /* pause: the backup of list[i] until it is paused */
} call;

static size_t count_state(vmm_arena *a, uint32_t id, vmm_mapping_state s) {
  size_t n = 0;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) if (m->tag == id && m->state == s) n++;
  return n;
}

/* The allocations tagged `id` in state `s`, by base address, into c->list (c->n of them).
 * Returns -1 on host out-of-memory (c->n 0). */
static int collect(vmm_arena *a, call *c, vmm_mapping_state s) {
  free(c->list);
  c->list = NULL;
  if (!(c->n = count_state(a, c->id, s))) return 0;
  if (!(c->list = malloc(c->n * sizeof *c->list))) return c->n = 0, -1;
  size_t k = 0;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) if (m->tag == c->id && m->state == s) c->list[k++] = m;
  qsort(c->list, k, sizeof *c->list, vmm_mapping_by_base);
  return 0;
}

/* Refuses, changing nothing, a tag never used and a tag with nothing to act on. */
static vmm_status refuse_tag(vmm_arena *a, call *c, vmm_mapping_state s, bool known) {
  if (!known)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s: no allocation was ever tagged so; nothing changed", c->label);
  size_t live = count_state(a, c->id, VMM_MAP_LIVE), paused = count_state(a, c->id, VMM_MAP_PAUSED);
  if (s == VMM_MAP_LIVE && paused)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s: its %zu allocation(s) are already paused; nothing changed",
                    c->label, paused);
  if (s == VMM_MAP_PAUSED && live)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                    "%s: nothing is paused (%zu live allocation(s) carry the tag); nothing changed", c->label, live);
  return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s: no live or paused allocation carries the tag; nothing changed",
                  c->label);
}

/* Finds the allocations the call acts on (state `s`), once no other call moves the tag's
 * allocations (waiting, the lock released, for that call to end). Refusals change nothing. */
static vmm_status start(vmm_arena *a, call *c, const char *name, vmm_mapping_state s) {
  bool known = true;
  if (c->tag) snprintf(c->label, sizeof c->label, "%s(\"%.280s\")", name, c->tag);
  else snprintf(c->label, sizeof c->label, "%s(untagged)", name);
  if (c->tag) c->id = vmm_tag_lookup(c->tag, &known);
  if (!known) return refuse_tag(a, c, s, false);
  vmm_status st = vmm_copier_get(a);
  if (st != VMM_OK) return st;
  while (count_state(a, c->id, VMM_MAP_MOVING)) vmm_copier_wait_turn(a);
  vmm_order_process_deferred(a);
  if (collect(a, c, s))
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s: host out of memory for the list; nothing changed", c->label);
  c->total = c->n;
  return c->n ? VMM_OK : refuse_tag(a, c, s, true);
}

/* Refuses (VMM_ERR_SCOPE_STATE) while `stream` captures a CUDA graph, or the legacy stream
 * would join a capture; a failed query is a driver error. */
static vmm_status check_not_capturing(vmm_arena *a, const call *c, CUstream stream, CUdeviceptr base) {
  bool capturing;
  CUresult r = vmm_order_capture_query(a, stream, &capturing);
  if (r != CUDA_SUCCESS)
    return vmm_errors_fail_driver(a, r, VMM_DRV_stream_is_capturing, "%s: reading the capture state of stream %p; nothing changed",
                           c->label, (void *)stream);
  if (!capturing) return VMM_OK;
  return vmm_errors_fail(a, VMM_ERR_SCOPE_STATE,
                  "%s: stream %p (of the allocation at 0x%llx) is capturing a CUDA graph, and the call would "
                  "synchronize or copy on it; nothing changed",
                  c->label, (void *)stream, (unsigned long long)base);
}

/* ---- Pause --------------------------------------------------------------------------- */

static vmm_status check_mode(vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  const char *t = tag ? tag : "untagged";
  if ((unsigned)mode > VMM_PAUSE_BACKUP)
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT, "pause(%s%.280s%s): unknown mode %d; nothing changed", tag ? "\"" : "",
                    t, tag ? "\"" : "", (int)mode);
  if (mode == VMM_PAUSE_BACKUP && !vmm_backup_supported(a))
    return vmm_errors_fail(a, VMM_ERR_INVALID_ARGUMENT,
                    "pause(%s%.280s%s): the driver table (version %u) has no copy entry points (version 2); nothing "
                    "changed",
                    tag ? "\"" : "", t, tag ? "\"" : "", a->drv->version);
  return VMM_OK;
}

/* What pause refuses before it touches anything: a capturing stream it would synchronize or
 * copy on, and backups the host cannot hold. */
static vmm_status check_pause(vmm_arena *a, const call *c, vmm_pause_mode mode) {
  vmm_status st = VMM_OK;
  size_t bytes = 0;
  if (mode == VMM_PAUSE_BACKUP) st = check_not_capturing(a, c, NULL, c->list[0]->base);
  for (size_t i = 0; i < c->n && st == VMM_OK; i++) {
    st = check_not_capturing(a, c, c->list[i]->stream, c->list[i]->base);
    bytes += c->list[i]->extent;
  }
  return st == VMM_OK && mode == VMM_PAUSE_BACKUP ? vmm_backup_admit(a, bytes, c->label) : st;
}

/* Marks the allocations MOVING, then without the lock waits for their streams and copies
 * their contents into new backups (VMM_PAUSE_BACKUP). */
static vmm_status move_out(vmm_arena *a, call *c, vmm_pause_mode mode) {
  if (!(c->backups = calloc(c->n, sizeof *c->backups)))
    return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s: host out of memory for the list; nothing changed", c->label);
  for (size_t i = 0; i < c->n; i++) vmm_mapping_begin_moving(a, c->list[i]);
  c->moving = c->n;
  vmm_copy_error err;
  pthread_mutex_unlock(&a->lock);
  bool ok = vmm_copier_wait_streams(a, c->list, c->n, &err) &&
            (mode != VMM_PAUSE_BACKUP || vmm_backup_save(a, c->list, c->n, c->backups, &err));
  pthread_mutex_lock(&a->lock);
  return ok ? VMM_OK : vmm_copier_fail(a, &err, c->label, "nothing changed");
}

/* Unmaps one allocation and gives its handles away; it keeps its record and range. */
static vmm_status pause_one(vmm_arena *a, vmm_mapping *m, void *backup) {
  vmm_status st = vmm_mapping_unmap(a, m, "pause");
  if (st != VMM_OK) return st;
  vmm_mapping_pause(a, m, backup);
  bool holds = vmm_policy_of(a)->holds_until_finish;
  if (!holds) vmm_retiring_unmap_holding(a, m->handles, m->handle_count, "pause"); /* released next */
  return vmm_mapping_drop_handles(a, m, holds);
}

/* Under the lock again: pauses the MOVING allocations in address order while nothing has
 * failed (st); the rest are live again and their backups freed. */
static vmm_status pause_all(vmm_arena *a, call *c, vmm_status st, uint64_t *bytes) {
  vmm_status before = st;
  size_t paused = 0;
  for (size_t i = 0; i < c->n; i++) {
    vmm_mapping *m = c->list[i];
    if (st == VMM_OK) st = pause_one(a, m, c->backups[i]);
    if (m->state == VMM_MAP_PAUSED) {
      paused++, *bytes += m->extent;
    } else {
      vmm_mapping_end_moving(a, m);
      vmm_backup_free(c->backups[i], m->extent);
    }
    c->backups[i] = NULL;
  }
  c->moving = 0;
  if (st != VMM_OK && before == VMM_OK) {
    char cause[sizeof a->last_error];
    memcpy(cause, a->last_error, sizeof cause);
    vmm_errors_fail(a, st, "%s: %zu of %zu allocation(s) paused, then: %s", c->label, paused, c->n, cause);
  }
  return st;
}

/* The end of a call: others may take their turn. */
static void end(vmm_arena *a, call *c) {
  vmm_copier_end_turn(a);
  free(c->list);
  free(c->backups);
  vmm_driver_ctx_leave(a);
}

vmm_status vmm_arena_pause(vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  call c = {.tag = tag};
  uint64_t bytes = 0;
  vmm_status st = check_mode(a, tag, mode);
  if (st == VMM_OK) st = start(a, &c, "pause", VMM_MAP_LIVE);
  if (st == VMM_OK) st = check_pause(a, &c, mode);
  if (st == VMM_OK) st = move_out(a, &c, mode);
  if (c.moving) st = pause_all(a, &c, st, &bytes);
  vmm_trace_arena_op(a, mode == VMM_PAUSE_BACKUP ? VMM_TRACE_PAUSE_BACKUP : VMM_TRACE_PAUSE_DISCARD, -1, 0, bytes, 0,
                     NULL, c.id, VMM_POOL_SHARED, st);
  end(a, &c);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Resume -------------------------------------------------------------------------- */

/* Maps memory back into a paused range (one that a failed copy left mapped keeps its memory). */
static vmm_status map_one(vmm_arena *a, vmm_mapping *m) {
  if (m->handle_count) return VMM_OK;
  vmm_status st = vmm_ranges_unstick(a, m->base, m->extent);
  if (st != VMM_OK) return st;
  vmm_request req = {m->extent, m->extent, m->kind, m->stream, m->tag};
  vmm_mapping *out;
  return vmm_assembly_build(a, &req, vmm_assembly_mode_for(a, m->kind), m, &out);
}

/* Maps memory back into the listed allocations in address order: one without a backup is
 * live at once; a run of ones with a backup becomes MOVING and ends the step (*all: the list
 * ended). Stops at the first failure. */
static vmm_status map_run(vmm_arena *a, call *c, size_t *resumed, uint64_t *bytes, bool *all) {
  c->moving = 0;
  for (size_t i = 0; i < c->n; i++) {
    vmm_mapping *m = c->list[i];
    if (c->moving && !m->backup) return VMM_OK;
    vmm_status st = map_one(a, m);
    if (st != VMM_OK) return st;
    if (m->backup) {
      vmm_mapping_begin_moving(a, m);
      if (!c->moving++) c->first = i;
    } else {
      vmm_mapping_resume(a, m);
      (*resumed)++, *bytes += m->extent;
      if (vmm_mapping_kept(m) && (st = vmm_arena_free_kept(a, m)) != VMM_OK) return st; /* freed while paused: the graph's */
    }
  }
  *all = true;
  return VMM_OK;
}

/* Without the lock, copies the MOVING run's backups back; under it again the run is live, or
 * after a failed copy paused again, mapped, with its backups: a retry only copies. */
static vmm_status move_in(vmm_arena *a, call *c, size_t *resumed, uint64_t *bytes) {
  vmm_mapping **run = c->list + c->first;
  vmm_copy_error err;
  pthread_mutex_unlock(&a->lock);
  bool ok = vmm_backup_restore(a, run, c->moving, &err);
  pthread_mutex_lock(&a->lock);
  for (size_t j = 0; j < c->moving; j++) {
    if (!ok) {
      vmm_mapping_end_moving(a, run[j]);
      continue;
    }
    vmm_mapping_resume(a, run[j]);
    (*resumed)++, *bytes += run[j]->extent;
  }
  c->moving = 0;
  return ok ? VMM_OK : vmm_copier_fail(a, &err, c->label, "the allocations being copied stay paused, mapped, with their backups");
}

/* Resumes in address order, run by run: the allocations a copy waited for were not MOVING
 * (they may have been freed meanwhile), so each later run collects the tag's paused ones
 * again. */
static vmm_status resume_all(vmm_arena *a, call *c, size_t *resumed, uint64_t *bytes) {
  vmm_status st = VMM_OK;
  for (bool all = false; st == VMM_OK && !all && c->n;) {
    st = map_run(a, c, resumed, bytes, &all);
    if (c->moving) {
      vmm_status copied = move_in(a, c, resumed, bytes);
      if (st == VMM_OK) st = copied;
    }
    if (st == VMM_OK && !all && collect(a, c, VMM_MAP_PAUSED))
      st = vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s: host out of memory for the list", c->label);
  }
  return st;
}

vmm_status vmm_arena_resume(vmm_arena *a, const char *tag) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  call c = {.tag = tag};
  size_t resumed = 0;
  uint64_t bytes = 0;
  vmm_status st = start(a, &c, "resume", VMM_MAP_PAUSED);
  for (size_t i = 0; st == VMM_OK && i < c.n; i++)
    if (c.list[i]->backup) {
      st = check_not_capturing(a, &c, NULL, c.list[i]->base);
      break;
    }
  if (st == VMM_OK && (st = resume_all(a, &c, &resumed, &bytes)) != VMM_OK) {
    char cause[sizeof a->last_error];
    memcpy(cause, a->last_error, sizeof cause);
    vmm_errors_fail(a, st, "%s: %zu of %zu allocation(s) resumed; the rest stay paused: %s", c.label, resumed, c.total,
             cause);
  }
  vmm_trace_arena_op(a, VMM_TRACE_RESUME, -1, 0, bytes, 0, NULL, c.id, VMM_POOL_SHARED, st);
  end(a, &c);
  pthread_mutex_unlock(&a->lock);
  return st;
}
