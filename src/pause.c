/* Pause and resume: the physical memory of tagged allocations goes away while their records
 * and virtual ranges stay, so pointers held by CUDA graphs, kernels and tensors stay valid;
 * resume maps memory back at the same addresses. Inside a scope the handles of a pause become
 * idle handles (reused by other allocations, released only by finish); outside one they are
 * released. Each allocation is paused or resumed whole: a failure stops the call with what it
 * had not reached still as it was, and a retry carries on. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

/* Host memory for a backup: anonymous pages asked to be huge, so that the copy into it faults
 * in 2 MiB at a time (first-touch faults, not the bus, bound a copy into fresh pageable
 * memory). Returned to the system whole by the resume. NULL on failure. */
static void *backup_alloc(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without huge pages the copy is only slower */
#endif
  return p;
}

void vmm_backup_free(void *backup, size_t bytes) {
  if (backup) munmap(backup, bytes);
}

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

static bool can_copy(const vmm_arena *a) { return a->drv->version >= 2 && a->drv->mem_cpy_dtoh && a->drv->mem_cpy_htod; }

static void set_paused(vmm_arena *a, vmm_mapping *m, bool paused) {
  vmm_tag_account(a, m->tag, m->extent, paused ? -1 : +1);
  vmm_tag_account_paused(a, m->tag, m->extent, paused ? +1 : -1);
  vmm_mapping_set_state(a, m, paused ? VMM_MAP_PAUSED : VMM_MAP_LIVE);
}

/* Pauses one live allocation: backup, unmap, handles away. */
static vmm_status pause_one(vmm_arena *a, vmm_mapping *m, vmm_pause_mode mode) {
  char b[32];
  void *backup = NULL;
  if (mode == VMM_PAUSE_BACKUP) {
    if (!(backup = backup_alloc(m->extent)))
      return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a %s backup of 0x%llx",
                      vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
    CUresult r = VMM_DRV(a, mem_cpy_dtoh, backup, m->base, m->extent);
    if (r != CUDA_SUCCESS) {
      vmm_backup_free(backup, m->extent);
      return vmm_fail_driver(a, r, VMM_DRV_mem_cpy_dtoh, "copying %s at 0x%llx to host memory",
                             vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
    }
  }
  vmm_status st = vmm_mapping_unmap(a, m, "pause");
  if (st != VMM_OK) {
    vmm_backup_free(backup, m->extent);
    return st;
  }
  m->backup = backup;
  set_paused(a, m, true);
  return vmm_mapping_drop_handles(a, m, vmm_retaining(a)); /* m keeps its record and range */
}

vmm_status vmm_arena_pause(vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_mapping **list = NULL;
  size_t n = 0, paused = 0;
  uint64_t bytes = 0;
  uint32_t id = 0;
  char t[300];
  vmm_status st;
  if ((unsigned)mode > VMM_PAUSE_BACKUP) {
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "pause(%s): unknown mode %d; nothing changed", label(tag, t), (int)mode);
    goto out;
  }
  if (mode == VMM_PAUSE_BACKUP && !can_copy(a)) {
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT,
                  "pause(%s): the driver table (version %u) has no copy entry points (version 2); nothing changed",
                  label(tag, t), a->drv->version);
    goto out;
  }
  if (a->deferred_head) vmm_process_deferred(a);
  if ((st = prepare(a, "pause", tag, VMM_MAP_LIVE, &list, &n, &id)) != VMM_OK) goto out;
  if (mode == VMM_PAUSE_BACKUP && (st = check_not_capturing(a, "pause", tag, NULL, list[0]->base)) != VMM_OK) goto out;
  for (size_t i = 0; i < n; i++)
    if ((st = check_not_capturing(a, "pause", tag, list[i]->stream, list[i]->base)) != VMM_OK) goto out;
  for (size_t i = 0; i < n; i++) { /* each stream once: work in flight may still use the memory */
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = list[j]->stream == list[i]->stream;
    CUresult r = seen ? CUDA_SUCCESS : VMM_DRV(a, stream_synchronize, list[i]->stream);
    if (r != CUDA_SUCCESS) {
      st = vmm_fail_driver(a, r, VMM_DRV_stream_synchronize, "pause(%s): synchronizing stream %p; nothing changed",
                           label(tag, t), (void *)list[i]->stream);
      goto out;
    }
  }
  for (size_t i = 0; i < n && st == VMM_OK; i++) {
    st = pause_one(a, list[i], mode);
    if (list[i]->state == VMM_MAP_PAUSED) paused++, bytes += list[i]->extent;
  }
  if (st != VMM_OK) {
    char cause[sizeof a->last_error];
    memcpy(cause, a->last_error, sizeof cause);
    vmm_fail(a, st, "pause(%s): %zu of %zu allocation(s) paused, then: %s", label(tag, t), paused, n, cause);
  }
out:
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
    vmm_status st = vmm_unstick(a, m->base, m->extent);
    if (st != VMM_OK) return st;
    vmm_request req = {m->extent, m->extent, m->kind, m->stream, m->tag};
    bool assemble = vmm_retaining(a) && a->cfg.reuse != VMM_REUSE_NONE &&
                    (m->kind == VMM_KIND_TRANSIENT || a->cfg.package_assembly);
    vmm_mapping *out;
    st = vmm_assemble(a, &req, assemble ? VMM_ASSEMBLE_EXACT : VMM_ASSEMBLE_NEW, m, &out);
    if (st != VMM_OK) return st;
  }
  if (m->backup) {
    CUresult r = VMM_DRV(a, mem_cpy_htod, m->base, m->backup, m->extent);
    if (r != CUDA_SUCCESS) {
      char b[32];
      return vmm_fail_driver(a, r, VMM_DRV_mem_cpy_htod, "copying the backup of %s back to 0x%llx",
                             vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
    }
    vmm_backup_free(m->backup, m->extent);
    m->backup = NULL;
  }
  set_paused(a, m, false);
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
  if (a->deferred_head) vmm_process_deferred(a);
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

vmm_status vmm_paused_free(vmm_arena *a, vmm_mapping *m) {
  if (m->handle_count) { /* mapped again, its backup not yet copied back */
    uint32_t tag = m->tag;
    size_t extent = m->extent;
    bool unmapped;
    vmm_status st = vmm_mapping_retire(a, m, vmm_retaining(a), "free", &unmapped);
    if (unmapped) vmm_tag_account_paused(a, tag, extent, -1);
    return st;
  }
  vmm_status st = vmm_unstick(a, m->base, m->extent); /* a failed resume's leftovers go first */
  if (st != VMM_OK) return st;
  vmm_tag_account_paused(a, m->tag, m->extent, -1);
  vmm_stat_add(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  vmm_ranges_free(a, m->base, m->extent, m->reservation);
  vmm_mapping_free(m);
  return VMM_OK;
}
