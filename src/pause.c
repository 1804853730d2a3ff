/* Pause and resume: the physical memory of tagged allocations goes away while their records
 * and virtual ranges stay, so pointers held by CUDA graphs, kernels and tensors stay valid;
 * resume maps memory back at the same addresses. Inside a scope the handles of a pause become
 * idle handles (reused by other allocations, released only by finish); outside one they are
 * released. Each allocation is paused or resumed whole: a failure stops the call with what it
 * had not reached still as it was, and a retry carries on. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *label(const char *tag, char buf[300]) {
  if (!tag) return "untagged";
  snprintf(buf, 300, "\"%.280s\"", tag);
  return buf;
}

static size_t count_state(vmm_arena *a, uint32_t id, vmm_mapping_state s) {
  size_t n = 0;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) if (m->tag == id && m->state == s) n++;
  return n;
}

/* The allocations tagged `id` in state `s`, by base address; *n their count. NULL with *n 0
 * when there are none, or on host out-of-memory (*oom). */
static vmm_mapping **collect(vmm_arena *a, uint32_t id, vmm_mapping_state s, size_t *n, bool *oom) {
  *oom = false;
  if (!(*n = count_state(a, id, s))) return NULL;
  vmm_mapping **list = malloc(*n * sizeof *list);
  if (!list) {
    *oom = true;
    *n = 0;
    return NULL;
  }
  size_t k = 0;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) if (m->tag == id && m->state == s) list[k++] = m;
  qsort(list, k, sizeof *list, vmm_mapping_by_base);
  return list;
}

/* Checks the call's arguments and finds the allocations it acts on. Refusals change nothing. */
static vmm_status prepare(vmm_arena *a, const char *call, const char *tag, vmm_mapping_state s, vmm_mapping ***list,
                          size_t *n, uint32_t *tag_id) {
  char t[300];
  uint32_t id = 0;
  *tag_id = 0;
  if (tag) {
    bool known;
    id = vmm_tag_lookup(tag, &known);
    if (!known)
      return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s(%s): no allocation was ever tagged so; nothing changed", call,
                      label(tag, t));
  }
  *tag_id = id;
  bool oom;
  *list = collect(a, id, s, n, &oom);
  if (oom) return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s(%s): host out of memory for the list; nothing changed", call, label(tag, t));
  if (*n) return VMM_OK;
  size_t live = count_state(a, id, VMM_MAP_LIVE), paused = count_state(a, id, VMM_MAP_PAUSED);
  if (s == VMM_MAP_LIVE && paused)
    return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s(%s): its %zu allocation(s) are already paused; nothing changed",
                    call, label(tag, t), paused);
  if (s == VMM_MAP_PAUSED && live)
    return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT,
                    "%s(%s): nothing is paused (%zu live allocation(s) carry the tag); nothing changed", call,
                    label(tag, t), live);
  return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "%s(%s): no live or paused allocation carries the tag; nothing changed",
                  call, label(tag, t));
}

/* Refuses while a stream the call would synchronize or copy on is capturing a CUDA graph. */
static vmm_status refuse_capture(vmm_arena *a, const char *call, const char *tag, CUstream stream, CUdeviceptr base) {
  char t[300];
  return vmm_fail(a, VMM_ERR_SCOPE_STATE,
                  "%s(%s): stream %p (of the allocation at 0x%llx) is capturing a CUDA graph, and the call would "
                  "synchronize or copy on it; nothing changed",
                  call, label(tag, t), (void *)stream, (unsigned long long)base);
}

/* Refuses (VMM_ERR_SCOPE_STATE) while `stream` captures a CUDA graph, or the legacy stream
 * would join a capture; a failed query is a driver error. */
static vmm_status check_not_capturing(vmm_arena *a, const char *call, const char *tag, CUstream stream, CUdeviceptr base) {
  bool capturing;
  CUresult r = vmm_capture_query(a, stream, &capturing);
  char t[300];
  if (r != CUDA_SUCCESS)
    return vmm_fail_driver(a, r, VMM_DRV_stream_is_capturing,
                           "%s(%s): reading the capture state of stream %p; nothing changed", call, label(tag, t),
                           (void *)stream);
  return capturing ? refuse_capture(a, call, tag, stream, base) : VMM_OK;
}

/* Pauses one live allocation: backup, unmap, handles away. */
static vmm_status pause_one(vmm_arena *a, vmm_mapping *m, vmm_pause_mode mode) {
  void *backup = NULL;
  vmm_status st = mode == VMM_PAUSE_BACKUP ? vmm_backup_save(a, m->base, m->extent, &backup) : VMM_OK;
  if (st == VMM_OK && (st = vmm_mapping_unmap(a, m, "pause")) != VMM_OK) vmm_backup_free(backup, m->extent);
  if (st != VMM_OK) return st;
  vmm_mapping_pause(a, m, backup);
  return vmm_mapping_drop_handles(a, m, vmm_retaining(a)); /* m keeps its record and range */
}

/* Waits for the work in flight on each allocation's stream (once per stream): it may still
 * use the memory. Touches nothing. */
static vmm_status wait_for_streams(vmm_arena *a, const char *tag, vmm_mapping **list, size_t n) {
  char t[300];
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = list[j]->stream == list[i]->stream;
    CUresult r = seen ? CUDA_SUCCESS : VMM_DRV(a, stream_synchronize, list[i]->stream);
    if (r != CUDA_SUCCESS)
      return vmm_fail_driver(a, r, VMM_DRV_stream_synchronize, "pause(%s): synchronizing stream %p; nothing changed",
                             label(tag, t), (void *)list[i]->stream);
  }
  return VMM_OK;
}

/* Checks what pause refuses before it touches anything: the mode, the driver's copies, and
 * a capturing stream it would synchronize or copy on. */
static vmm_status check_pause(vmm_arena *a, const char *tag, vmm_pause_mode mode, vmm_mapping **list, size_t n) {
  vmm_status st = VMM_OK;
  if (mode == VMM_PAUSE_BACKUP && (st = check_not_capturing(a, "pause", tag, NULL, list[0]->base)) != VMM_OK) return st;
  for (size_t i = 0; i < n && st == VMM_OK; i++) st = check_not_capturing(a, "pause", tag, list[i]->stream, list[i]->base);
  return st;
}

static vmm_status check_mode(vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  char t[300];
  if ((unsigned)mode > VMM_PAUSE_BACKUP)
    return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "pause(%s): unknown mode %d; nothing changed", label(tag, t), (int)mode);
  if (mode == VMM_PAUSE_BACKUP && !vmm_backup_supported(a))
    return vmm_fail(a, VMM_ERR_INVALID_ARGUMENT,
                    "pause(%s): the driver table (version %u) has no copy entry points (version 2); nothing changed",
                    label(tag, t), a->drv->version);
  return VMM_OK;
}

/* Pauses the allocations in list order; a failure stops there, with those not reached live. */
static vmm_status pause_all(vmm_arena *a, const char *tag, vmm_pause_mode mode, vmm_mapping **list, size_t n,
                            uint64_t *bytes) {
  size_t paused = 0;
  vmm_status st = VMM_OK;
  for (size_t i = 0; i < n && st == VMM_OK; i++) {
    st = pause_one(a, list[i], mode);
    if (list[i]->state == VMM_MAP_PAUSED) paused++, *bytes += list[i]->extent;
  }
  if (st != VMM_OK) {
    char cause[sizeof a->last_error], t[300];
    memcpy(cause, a->last_error, sizeof cause);
    vmm_fail(a, st, "pause(%s): %zu of %zu allocation(s) paused, then: %s", label(tag, t), paused, n, cause);
  }
  return st;
}

vmm_status vmm_arena_pause(vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_mapping **list = NULL;
  size_t n = 0;
  uint64_t bytes = 0;
  uint32_t id = 0;
  vmm_status st = check_mode(a, tag, mode);
  if (st == VMM_OK) {
    vmm_process_deferred(a);
    st = prepare(a, "pause", tag, VMM_MAP_LIVE, &list, &n, &id);
  }
  if (st == VMM_OK) st = check_pause(a, tag, mode, list, n);
  if (st == VMM_OK) st = wait_for_streams(a, tag, list, n);
  if (st == VMM_OK) st = pause_all(a, tag, mode, list, n, &bytes);
  vmm_trace_arena_op(a, mode == VMM_PAUSE_BACKUP ? VMM_TRACE_PAUSE_BACKUP : VMM_TRACE_PAUSE_DISCARD, -1, 0, bytes, 0,
                     NULL, id, st);
  free(list);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* Resumes one paused allocation: memory mapped back into its range, then its backup. A
 * failed copy leaves it paused but mapped, with its backup: a retry only copies again. */
static vmm_status resume_one(vmm_arena *a, vmm_mapping *m) {
  if (!m->handle_count) {
    vmm_status st = vmm_ranges_unstick(a, m->base, m->extent);
    if (st != VMM_OK) return st;
    vmm_request req = {m->extent, m->extent, m->kind, m->stream, m->tag};
    vmm_mapping *out;
    st = vmm_assemble(a, &req, vmm_assembly_mode_for(a, m->kind), m, &out);
    if (st != VMM_OK) return st;
  }
  if (m->backup) {
    vmm_status st = vmm_backup_restore(a, m->base, m->backup, m->extent);
    if (st != VMM_OK) return st;
  }
  vmm_mapping_resume(a, m);
  return VMM_OK;
}

vmm_status vmm_arena_resume(vmm_arena *a, const char *tag) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_mapping **list = NULL;
  size_t n = 0, resumed = 0;
  uint64_t bytes = 0;
  uint32_t id = 0;
  char t[300];
  vmm_process_deferred(a);
  vmm_status st = prepare(a, "resume", tag, VMM_MAP_PAUSED, &list, &n, &id);
  for (size_t i = 0; st == VMM_OK && i < n; i++)
    if (list[i]->backup) {
      st = check_not_capturing(a, "resume", tag, NULL, list[i]->base);
      break;
    }
  for (size_t i = 0; i < n && st == VMM_OK; i++) {
    st = resume_one(a, list[i]);
    if (st == VMM_OK) resumed++, bytes += list[i]->extent;
  }
  if (st != VMM_OK && list) {
    char cause[sizeof a->last_error];
    memcpy(cause, a->last_error, sizeof cause);
    vmm_fail(a, st, "resume(%s): %zu of %zu allocation(s) resumed; the rest stay paused: %s", label(tag, t), resumed,
             n, cause);
  }
  vmm_trace_arena_op(a, VMM_TRACE_RESUME, -1, 0, bytes, 0, NULL, id, st);
  free(list);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}
