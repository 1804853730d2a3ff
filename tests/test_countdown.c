/* Countdown fault injection, after SQLite's malloc tests: one scripted scenario that reaches
 * every driver entry point the library uses is run again and again with driver call N
 * failing, for N = 1, 2, 3 ... until a run meets no fault: once with a single failure and
 * once with every call failing from N on, for an out-of-memory code and for a hard error.
 *
 * The scenario assembles inside a scope: a transient request from an unmapped idle handle,
 * two pooled mappings taken apart and new memory for the rest; a package request from a
 * pooled mapping taken apart; and a package request from unmapped idle handles topped up
 * with new memory.
 *
 * Each run checks every public call's status against the documented set (the fault-free
 * result, or the failure the fault implies), the invariant checker after every step, the
 * sticky first fatal error (never set by an out-of-memory fault, never rewritten once set),
 * that an allocation which fails having met at most one failed driver call leaves the arena
 * exactly as it was (every mapping, pooled mapping and idle handle in its place), and, after
 * destroy, that the fake driver's ledger is empty. Destroy runs with the faults
 * cleared there; it returns nothing and only logs its failures, so its own countdown (the last
 * test) checks instead that a failed call in destroy leaves only what that call would have
 * released. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)
#define S3 TU_STREAM(3) /* captured into a graph for one step */

/* Entry points the core never calls; every other one must be called by the fault-free run. */
static const struct {
  vmm_driver_entry entry;
  const char *reason;
} unused_entries[] = {
    {VMM_DRV_driver_get_version,
     "the binding asks cuGetProcAddress for CUDA 12 entry points and no code path depends on the driver version"},
    {VMM_DRV_event_query, "only whole-process mode asks whether a free is complete: test_process's countdown reaches it"},
    {VMM_DRV_thread_exchange_stream_capture_mode,
     "only whole-process mode relaxes the capture mode, during captures: test_process reaches it"},
    {VMM_DRV_mem_export_to_shareable_handle, "only sharing between processes: test_ipc fails each step of it"},
    {VMM_DRV_mem_import_from_shareable_handle, "only sharing between processes: test_ipc fails each step of it"},
    {VMM_DRV_mem_get_allocation_properties_from_handle, "only sharing between processes: test_ipc fails each step of it"},
    {VMM_DRV_stream_get_capture_info,
     "only whole-process mode, freeing and reusing a graph's memory inside a capture: test_stream_semantics fails it"},
    {VMM_DRV_graph_node_get_dependencies,
     "only whole-process mode, reusing a graph's memory inside a capture: test_stream_semantics fails it"},
};

static int entry_unused(vmm_driver_entry e) {
  for (size_t i = 0; i < sizeof unused_entries / sizeof unused_entries[0]; i++)
    if (unused_entries[i].entry == e) return 1;
  return 0;
}

/* ---- One run ------------------------------------------------------------------------- */

typedef struct run {
  CUresult code;           /* injected result; CUDA_SUCCESS for the fault-free run */
  int persistent;          /* every call from N on fails */
  unsigned nth;            /* N; 0 for the fault-free run */
  vmm_status fault_status; /* what the fault becomes at the API: OOM or DRIVER */
  int saw_driver[2];       /* arena A, B returned VMM_ERR_DRIVER from some call */
  vmm_status fatal_seen[2];
  char fatal_text[2][768];
  size_t steps;            /* public calls checked */
} run;

static run *current;

/* Fails the test naming the run; `got` is the call's status, or VMM_STATUS_COUNT for a check
 * that is no call's status. */
static void fail_run(const char *what, vmm_status got, const char *detail) {
  run *r = current;
  fail_msg("run %s %s N=%u: %s%s%s: %s", r->persistent ? "persistent" : "single",
           r->code == CUDA_SUCCESS ? "fault-free" : r->code == CUDA_ERROR_OUT_OF_MEMORY ? "OOM" : "UNKNOWN", r->nth,
           what, got == VMM_STATUS_COUNT ? "" : " returned ", got == VMM_STATUS_COUNT ? "" : vmm_status_name(got), detail);
}

/* Invariants hold, and a fatal error once recorded never changes. */
static void after_step(vmm_arena *a, int which) {
  char why[256] = "";
  if (vmm_arena_check(a, why, sizeof why)) fail_run("vmm_arena_check", VMM_STATUS_COUNT, why);
  const char *msg = NULL;
  vmm_status fatal = vmm_arena_fatal_error(a, &msg);
  run *r = current;
  if (r->code == CUDA_ERROR_OUT_OF_MEMORY && fatal != VMM_OK)
    fail_run("vmm_arena_fatal_error after an out-of-memory fault", fatal, msg);
  if (r->fatal_seen[which] != VMM_OK) {
    if (fatal != r->fatal_seen[which] || strcmp(msg, r->fatal_text[which]))
      fail_run("vmm_arena_fatal_error: the first fatal error changed", fatal, msg);
  } else if (fatal != VMM_OK) {
    if (fatal != VMM_ERR_DRIVER || !msg[0]) fail_run("vmm_arena_fatal_error", fatal, "not DRIVER, or no message");
    r->fatal_seen[which] = fatal;
    snprintf(r->fatal_text[which], sizeof r->fatal_text[which], "%s", msg);
  }
}

/* The call returned `want` (the fault-free result) or, once a fault may have fired, the
 * status the fault implies; `oom_ok` also admits out of memory (an allocation meeting memory
 * that an earlier failed free left held). */
static void expect(vmm_arena *a, int which, vmm_status got, vmm_status want, int oom_ok, const char *what) {
  run *r = current;
  r->steps++;
  int faulty = r->code != CUDA_SUCCESS && fake_faults_fired() > 0;
  int allowed = got == want || (faulty && (got == r->fault_status || (oom_ok && got == VMM_ERR_OUT_OF_MEMORY)));
  if (!allowed) fail_run(what, got, a ? vmm_arena_last_error(a) : vmm_create_error());
  if (got != VMM_OK && a) {
    const char *msg = vmm_arena_last_error(a);
    if (!msg[0] || !strpbrk(msg, "0123456789")) fail_run(what, got, "failure message without numbers");
  }
  if (got == VMM_ERR_DRIVER && a) r->saw_driver[which] = 1;
  if (a) after_step(a, which);
}

/* ---- The arena as it stands ------------------------------------------------------- */

typedef struct text {
  char buf[16384];
  size_t len;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t room = sizeof t->buf - t->len;
  int n = vsnprintf(t->buf + t->len, room, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= room) fail_msg("arena description longer than %zu bytes", sizeof t->buf);
  t->len += (size_t)n;
}

static int by_base(const void *x, const void *y) {
  CUdeviceptr a = (*(vmm_mapping *const *)x)->base, b = (*(vmm_mapping *const *)y)->base;
  return a < b ? -1 : a > b;
}

static void add_handles(text *t, const vmm_mapping *m) {
  for (uint32_t i = 0; i < m->handle_count; i++)
    add(t, "%s%llx:%zu", i ? "," : "[", (unsigned long long)m->handles[i]->h, m->handles[i]->size);
  add(t, "]");
}

static void add_idle(text *t, const vmm_avl *n) {
  if (!n) return;
  add_idle(t, n->left);
  const vmm_handle *h = vmm_container_of(n, vmm_handle, node);
  add(t, " %llx:%zu#%llu/%d", (unsigned long long)h->h, h->size, (unsigned long long)h->node.k2, (int)h->kind);
  add_idle(t, n->right);
}

static void add_buckets(text *t, const vmm_avl *n) {
  if (!n) return;
  add_buckets(t, n->left);
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  add(t, " %zu:", b->size);
  for (const vmm_mapping *m = b->head; m; m = m->pool_next) add(t, "%llx,", (unsigned long long)m->base);
  add_buckets(t, n->right);
}

/* Everything an allocation could take or leave behind: counters, every mapping with its
 * handles, the pool's buckets in order, the idle tier in order (with each handle's place
 * in it), the abandoned and deferred lists, and the handles kept mapped by a failed undo. Not
 * the peaks, the failure counters, or the VA reserved (a reservation made for a request that
 * then failed is kept for the next one). */
static void describe(vmm_arena *a, text *t) {
  t->len = 0;
  t->buf[0] = '\0';
  add(t, "physical %llu mapped %llu allocs %llu frees %llu stuck %zu scope %d\n", (unsigned long long)a->physical_bytes,
      (unsigned long long)a->mapped_bytes, (unsigned long long)a->allocs, (unsigned long long)a->frees,
      a->ranges.stuck_count, (int)a->scope);
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    const vmm_kind_stats *ks = &a->kind[k];
    add(t, "kind %d: live %llu/%llu pooled %llu/%llu retained %llu/%llu abandoned %llu/%llu\n", k,
        (unsigned long long)ks->live_count, (unsigned long long)ks->live_bytes, (unsigned long long)ks->pooled_count,
        (unsigned long long)ks->pooled_bytes, (unsigned long long)ks->idle_count,
        (unsigned long long)ks->idle_bytes, (unsigned long long)ks->abandoned_count,
        (unsigned long long)ks->abandoned_bytes);
  }
  vmm_mapping **list = malloc((a->table.count + 1) * sizeof *list), *m;
  assert_non_null(list);
  size_t n = 0;
  vmm_table_foreach(&a->table, i, m) list[n++] = m;
  qsort(list, n, sizeof *list, by_base);
  for (size_t i = 0; i < n; i++) {
    add(t, "mapping %llx +%zu kind %d state %d ", (unsigned long long)list[i]->base, list[i]->extent,
        (int)list[i]->kind, (int)list[i]->state);
    add_handles(t, list[i]);
    add(t, "\n");
  }
  free(list);
  add(t, "pool %zu/%zu/%zu/%zu:", a->store.pool.buckets, a->store.pool.count, a->store.pool.bytes,
      a->store.pool.handles);
  add_buckets(t, a->store.pool.root);
  add(t, "\nidle %zu/%zu:", a->store.idle_count, a->store.idle_bytes);
  add_idle(t, a->store.idle);
  add(t, "\nabandoned %zu/%zu:", a->store.abandoned_count, a->store.abandoned_bytes);
  for (const vmm_handle *h = a->store.abandoned; h; h = h->next) add(t, " %llx", (unsigned long long)h->h);
  add(t, "\ndeferred:");
  for (const vmm_mapping *d = a->deferred_head; d; d = d->pool_next) add(t, " %llx", (unsigned long long)d->base);
  add(t, "\n");
}

/* Failed driver calls from the log index `from` on that can change what the arena holds (not
 * the context push and pop, error names, free-memory figures or capture-state reads, which an
 * operation absorbs). */
static size_t failed_since(size_t from) {
  size_t n = 0;
  for (size_t i = from, count = fake_call_count(); i < count; i++) {
    const fake_call *c = fake_call_at(i);
    if (c->result == CUDA_SUCCESS) continue;
    switch (c->entry) {
    case VMM_DRV_ctx_push_current:
    case VMM_DRV_ctx_pop_current:
    case VMM_DRV_get_error_name:
    case VMM_DRV_mem_get_info:
    case VMM_DRV_stream_is_capturing: break;
    default: n++;
    }
  }
  return n;
}

static text before_step, after_step_text;
static unsigned exact_compares; /* failed allocations found to have left the arena exactly as it was */

static void *alloc_step(vmm_arena *a, int which, size_t bytes, vmm_kind kind, CUstream s, vmm_status want,
                        const char *what) {
  void *p = (void *)1;
  describe(a, &before_step);
  size_t from = fake_call_count();
  vmm_status st = vmm_arena_alloc(a, bytes, kind, s, &p);
  expect(a, which, st, want, 1, what);
  if (st != VMM_OK) {
    if (p) fail_run(what, st, "failed, but *out is not NULL");
    /* A refusal, or a failure whose one failed call was undone: nothing moved. Where more
     * calls failed (a persistent fault), an undo may itself fail: a handle whose release
     * failed stays idle, a handle whose unmap failed stays stuck; the checker covers those. */
    if (failed_since(from) <= 1) {
      describe(a, &after_step_text);
      if (strcmp(before_step.buf, after_step_text.buf)) {
        fprintf(stderr, "before:\n%safter:\n%s", before_step.buf, after_step_text.buf);
        fail_run(what, st, "the failed allocation changed the arena");
      }
      exact_compares++;
    }
    return NULL;
  }
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)p;
  if (!p || base % vmm_arena_granularity(a)) fail_run(what, st, "NULL or misaligned pointer");
  if (tu_mapped_from(p, bytes) < bytes || !fake_access_granted(base, vmm_arena_device(a)))
    fail_run(what, st, "the driver has no accessible mapping of the whole request at the pointer");
  return p;
}

/* Frees *p if the allocation succeeded; the pointer is not used again either way (a free
 * that failed leaves it to destroy). */
static void free_step(vmm_arena *a, int which, void **p, CUstream s, const char *what) {
  if (!*p) return;
  expect(a, which, vmm_arena_free(a, *p, s), VMM_OK, 0, what);
  *p = NULL;
}

/* Finish; a failed finish is retried once, and once no fault is left to fire the retry must
 * succeed (a later finish resumes where the failed one stopped). */
static void finish_step(vmm_arena *a, int which, int *scope) {
  if (!*scope) {
    expect(a, which, vmm_retention_finish(a), VMM_ERR_SCOPE_STATE, 0, "finish without a scope");
    return;
  }
  vmm_status st = vmm_retention_finish(a);
  expect(a, which, st, VMM_OK, 0, "finish");
  if (st != VMM_OK) {
    st = vmm_retention_finish(a);
    expect(a, which, st, VMM_OK, 0, "finish, retried");
    if (st != VMM_OK && !current->persistent) fail_run("finish retried after a single fault", st, vmm_arena_last_error(a));
  }
  *scope = st != VMM_OK;
}

static void begin_step(vmm_arena *a, int which, int *scope) {
  /* A scope left open by a failed finish makes begin a scope error. */
  expect(a, which, vmm_retention_begin(a), *scope ? VMM_ERR_SCOPE_STATE : VMM_OK, 0, "begin");
  *scope = 1;
}

static void abort_step(vmm_arena *a, int which, int *scope) {
  expect(a, which, vmm_retention_abort(a), *scope ? VMM_OK : VMM_ERR_SCOPE_STATE, 0, "abort");
  *scope = 0;
}

static vmm_arena *create_step(const vmm_config *cfg, const char *what) {
  vmm_arena *a = (vmm_arena *)1;
  vmm_status st = vmm_arena_create(cfg, &a);
  expect(NULL, 0, st, VMM_OK, 0, what);
  if (st != VMM_OK) {
    if (a) fail_run(what, st, "failed, but *out is not NULL");
    if (!vmm_create_error()[0]) fail_run(what, st, "no creation error message");
  }
  return a;
}

/* Failed calls among the log's entries `e`: each failed cuCtxPopCurrent leaves the context
 * current on this thread and each failed cuDevicePrimaryCtxRelease leaves a retain, as the
 * real driver would; nothing else may be left. */
static size_t failed_calls(vmm_driver_entry e) {
  size_t n = 0, count = fake_call_count();
  for (size_t i = 0; i < count; i++) {
    const fake_call *c = fake_call_at(i);
    n += c->entry == e && c->result != CUDA_SUCCESS;
  }
  return n;
}

static void expect_ledger_clean(void) {
  size_t pops = failed_calls(VMM_DRV_ctx_pop_current), releases = failed_calls(VMM_DRV_primary_ctx_release);
  if (pops == 0 && releases == 0) {
    if (!fake_ledger_clean()) fail_run("after destroy", VMM_STATUS_COUNT, "the fake driver's ledger is not clean");
    return;
  }
  fake_ledger l;
  fake_get_ledger(&l);
  if (l.live_handles || l.live_mappings || l.reservations || l.live_events || l.errors || l.ctx_pushed != pops ||
      l.primary_retained != releases) {
    (void)fake_ledger_clean(); /* prints what is left */
    fail_run("after destroy", VMM_STATUS_COUNT, "the ledger holds more than the failed pops and releases explain");
  }
}

/* Fake with two discrete devices (peer access between them), 8 GiB of VA in all, and a
 * 36 MiB device 0. */
static void reset_fake(void) {
  fake_options o = {.device_count = 2, .va_space = 8 * GiB};
  fake_driver_reset(&o);
  fake_set_capacity(0, 36 * MiB);
}

/* The scenario. Arena A: device 0, peer access for device 1, 2 MiB headroom (device free
 * memory). Arena B: device 1 seen as integrated, 1 GiB headroom (host MemAvailable). */
static void scenario(void) {
  run *r = current;
  int faultless = r->code == CUDA_SUCCESS;
  vmm_config ca = tu_config();
  ca.peer_access_mask = (uint64_t)1 << 1;
  ca.headroom_bytes = 2 * MiB;
  ca.reserve_bytes = 1 * GiB;
  vmm_arena *a = create_step(&ca, "create A (peer access, headroom)");
  if (!a) {
    fake_clear_faults();
    expect_ledger_clean();
    return;
  }
  int scope = 0;
  void *p1 = alloc_step(a, 0, 6 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "package 6 MiB (one handle, before the scope)");
  begin_step(a, 0, &scope);
  /* Created inside the scope: cut into handles of the bound (2 MiB while the peak is small). */
  void *t1 = alloc_step(a, 0, 8 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK, "transient 8 MiB (t1)");
  void *t2 = alloc_step(a, 0, 8 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK, "transient 8 MiB (t2)");
  void *t1_base = t1;
  free_step(a, 0, &t1, S1, "free t1 into the pool");
  /* Reuse on another stream: the new stream waits on an event recorded on the freeing one. */
  void *t3 = alloc_step(a, 0, 8 * MiB, VMM_KIND_TRANSIENT, S2, VMM_OK, "transient 8 MiB on S2 (t3)");
  if (faultless) assert_ptr_equal(t3, t1_base);
  free_step(a, 0, &t2, S1, "free t2 into the pool");
  free_step(a, 0, &t3, S2, "free t3 into the pool");
  /* A package free inside the scope unmaps and keeps the handle idle until finish. */
  free_step(a, 0, &p1, S1, "free package in scope");
  if (faultless) assert_int_equal(tu_snapshot(a).kind[VMM_KIND_PACKAGE].idle_count, 1);
  /* 26 MiB: the idle 6 MiB handle, t3 and t2 taken apart (waiting for S2 and S1), and 4 MiB
   * created (22 MiB held of 36, 2 MiB headroom). */
  void *t4 = alloc_step(a, 0, 26 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK, "transient 26 MiB (assembled, topped up)");
  if (faultless) {
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.assemblies, 1);
    assert_int_equal(s.assembled_idle_handles, 9);
    assert_int_equal(s.assembly_created_bytes, 4 * MiB);
    assert_int_equal(s.pooled_taken_apart, 2);
    assert_int_equal(s.pool_hits, 1);
    assert_int_equal(s.headroom_refusals, 0);
    assert_int_equal(s.retained_reusable_handles, 0);
    assert_int_equal(s.physical_bytes, 26 * MiB);
    assert_int_equal(fake_mapped_size_at((CUdeviceptr)(uintptr_t)t4), 6 * MiB);
  }
  free_step(a, 0, &t4, S1, "free the assembled mapping into the pool");
  /* A package allocated on a capturing stream is assembled from the pooled mapping taken
   * apart (its freeing stream, S1, is not capturing); its free is deferred until the capture
   * is over. */
  fake_set_capturing(S3, 1);
  void *p2 = alloc_step(a, 0, 2 * MiB, VMM_KIND_PACKAGE, S3, VMM_OK, "package 2 MiB during capture (assembled)");
  free_step(a, 0, &p2, S3, "free during capture (deferred)");
  if (faultless) {
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.deferred_frees, 1);
    assert_int_equal(s.assemblies, 2);
    assert_int_equal(s.pooled_taken_apart, 3);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].idle_count, 10); /* t4's other handles */
  }
  fake_set_capturing(S3, 0);
  expect(a, 0, vmm_arena_quiesce(a), VMM_OK, 0, "quiesce");
  /* 30 MiB of package: all 26 MiB idle (11 handles) and 4 MiB created. */
  void *pk = alloc_step(a, 0, 30 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "package 30 MiB (assembled, topped up)");
  if (faultless) {
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.assemblies, 3);
    assert_int_equal(s.assembled_idle_handles, 9 + 1 + 11);
    assert_int_equal(s.assembly_created_bytes, 8 * MiB);
    assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, 30 * MiB);
    assert_int_equal(s.physical_bytes, 30 * MiB);
    assert_int_equal(s.retained_reusable_handles, 0);
  }
  free_step(a, 0, &pk, S1, "free the assembled package in scope");
  size_t calls_before_finish = fake_call_count();
  finish_step(a, 0, &scope);
  if (faultless) {
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.physical_bytes, 0);
    assert_int_equal(s.scopes_finished, 1);
    assert_int_equal(fake_calls_since(calls_before_finish, VMM_DRV_mem_release), 13);
  }
  /* Second scope, aborted: its memory is held without any driver call until destroy. */
  begin_step(a, 0, &scope);
  void *t6 = alloc_step(a, 0, 4 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK, "transient 4 MiB (t6)");
  void *t7 = alloc_step(a, 0, 4 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK, "transient 4 MiB (t7)");
  void *q = alloc_step(a, 0, 2 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "package 2 MiB (q)");
  free_step(a, 0, &t6, S1, "free t6 into the pool");
  free_step(a, 0, &q, S1, "free q: its handle idle");
  size_t calls_before_abort = fake_call_count();
  abort_step(a, 0, &scope);
  free_step(a, 0, &t7, S1, "free t7 of the aborted scope");
  if (faultless) {
    assert_int_equal(fake_call_count(), calls_before_abort); /* abort and that free made no driver call */
    vmm_snapshot s = tu_snapshot(a);
    assert_int_equal(s.kind[VMM_KIND_TRANSIENT].abandoned_bytes, 8 * MiB);
    assert_int_equal(s.kind[VMM_KIND_PACKAGE].abandoned_bytes, 2 * MiB);
  }

  /* Pause with a backup through the pinned staging (the copy engine's entry points) and
   * resume; B below copies synchronously. A failed resume is retried once. */
  vmm_tag_push("operands");
  void *op = alloc_step(a, 0, 2 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "package 2 MiB tagged (op)");
  vmm_tag_pop();
  if (op) {
    expect(a, 0, vmm_arena_pause(a, "operands", VMM_PAUSE_BACKUP), VMM_OK, 1, "pause with backup, staged");
    if (tu_snapshot(a).kind[VMM_KIND_PACKAGE].paused_count) {
      vmm_status st = vmm_arena_resume(a, "operands");
      expect(a, 0, st, VMM_OK, 1, "resume, staged");
      if (st != VMM_OK) expect(a, 0, vmm_arena_resume(a, "operands"), VMM_OK, 1, "resume, staged, retried");
    }
    if (faultless) {
      fake_ledger l;
      fake_get_ledger(&l);
      assert_int_equal(l.pinned_host_bytes, 0); /* the staging went with the copy */
    }
  }
  free_step(a, 0, &op, S1, "free op");

  fake_set_integrated(1);
  vmm_config cb = tu_config();
  cb.device = 1;
  cb.headroom_bytes = 1 * GiB;
  cb.reserve_bytes = 1 * GiB;
  cb.pause_staging = 0; /* synchronous copies: cuMemcpyDtoH and cuMemcpyHtoD */
  vmm_arena *b = create_step(&cb, "create B (integrated, headroom)");
  if (b) {
    void *x1 = alloc_step(b, 1, 4 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "B: package 4 MiB (MemAvailable)");
    /* Larger than the VA left: the reservation fails before any memory is created, OOM. */
    void *x2 = alloc_step(b, 1, 16 * GiB, VMM_KIND_PACKAGE, S1, VMM_ERR_OUT_OF_MEMORY, "B: package 16 GiB");
    if (faultless) assert_non_null(strstr(vmm_arena_last_error(b), "cuMemAddressReserve returned CUDA_ERROR_OUT_OF_MEMORY"));
    free_step(b, 1, &x2, S1, "B: free 16 GiB");
    free_step(b, 1, &x1, S1, "B: free package");
    /* Pause with a backup to host memory and resume at the same address (the copy entry
     * points); a failed resume is retried once, and a paused allocation may be freed. */
    vmm_tag_push("weights");
    void *w = alloc_step(b, 1, 4 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK, "B: tagged package 4 MiB");
    vmm_tag_pop();
    if (w) {
      expect(b, 1, vmm_arena_pause(b, "weights", VMM_PAUSE_BACKUP), VMM_OK, 1, "B: pause with backup");
      if (tu_snapshot(b).kind[VMM_KIND_PACKAGE].paused_count) {
        vmm_status st = vmm_arena_resume(b, "weights");
        expect(b, 1, st, VMM_OK, 1, "B: resume");
        if (st != VMM_OK) expect(b, 1, vmm_arena_resume(b, "weights"), VMM_OK, 1, "B: resume, retried");
      }
      if (faultless) assert_int_equal(tu_mapped_from(w, 4 * MiB), 4 * MiB);
    }
    free_step(b, 1, &w, S1, "B: free the tagged package");
  }

  char json[16384];
  size_t needed = 0;
  assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, &needed), VMM_OK);
  assert_int_equal(strlen(json) + 1, needed);
  assert_int_equal(vmm_arena_snapshot_json(a, json, 16, &needed), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(json[15], '\0');

  fake_clear_faults();
  after_step(a, 0);
  if (b) after_step(b, 1);
  for (int which = 0; which < 2; which++) {
    vmm_arena *x = which ? b : a;
    if (!x) continue;
    const char *msg;
    vmm_status fatal = vmm_arena_fatal_error(x, &msg);
    if (faultless && fatal != VMM_OK) fail_run("fatal error after a fault-free run", fatal, msg);
    if (r->saw_driver[which] && fatal != VMM_ERR_DRIVER) fail_run("VMM_ERR_DRIVER returned, but no fatal error", fatal, msg);
  }
  vmm_arena_destroy(b);
  vmm_arena_destroy(a);
  expect_ledger_clean();
}

/* ---- The countdowns ------------------------------------------------------------------ */

static unsigned total_points;
static unsigned points_by_entry[VMM_DRV_ENTRY_COUNT];

/* Runs the scenario with call N failing for N = 1, 2, ... until a run meets no fault. */
static void countdown(CUresult code, int persistent) {
  unsigned points = 0;
  size_t steps = 0;
  exact_compares = 0;
  for (unsigned n = 1;; n++) {
    run r = {.code = code, .persistent = persistent, .nth = n};
    r.fault_status = code == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER;
    current = &r;
    reset_fake();
    fake_fail_nth_any(n, code, persistent);
    scenario();
    steps += r.steps;
    if (fake_faults_fired() == 0) break; /* the run ended before call N */
    const fake_call *c = fake_call_at(n - 1); /* the call that met the fault */
    assert_int_equal(c->result, code);
    points++;
    points_by_entry[c->entry]++;
    assert_true(n < 100000);
  }
  total_points += points;
  printf("countdown %-10s %-26s: %u injection points, %zu checked calls, %u failed allocations left the arena "
         "as it was, every run sound\n",
         persistent ? "persistent" : "single", code == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN",
         points, steps, exact_compares);
  assert_true(exact_compares > 0);
}

static void fault_free_run_reaches_every_entry_point(void **state) {
  (void)state;
  run r = {.code = CUDA_SUCCESS};
  current = &r;
  reset_fake();
  scenario();
  fake_ledger l;
  fake_get_ledger(&l);
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) {
    if (entry_unused((vmm_driver_entry)e)) {
      assert_int_equal(l.calls_by_entry[e], 0); /* still unused: drop it from the list if not */
      continue;
    }
    if (l.calls_by_entry[e] == 0) fail_msg("the fault-free scenario never calls %s", vmm_driver_entry_name((vmm_driver_entry)e));
  }
  printf("fault-free scenario: %zu driver calls, %zu checked API calls; unused entry points:", l.calls, r.steps);
  for (size_t i = 0; i < sizeof unused_entries / sizeof unused_entries[0]; i++)
    printf(" %s (%s)", vmm_driver_entry_name(unused_entries[i].entry), unused_entries[i].reason);
  printf("\n");
}

static void single_oom(void **state) { (void)state; countdown(CUDA_ERROR_OUT_OF_MEMORY, 0); }
static void persistent_oom(void **state) { (void)state; countdown(CUDA_ERROR_OUT_OF_MEMORY, 1); }
static void single_unknown(void **state) { (void)state; countdown(CUDA_ERROR_UNKNOWN, 0); }
static void persistent_unknown(void **state) { (void)state; countdown(CUDA_ERROR_UNKNOWN, 1); }

/* Destroy meeting a single fault at its call N: an arena holding live, pooled (an assembled
 * mapping of several handles), retained, abandoned (a mapping and an unmapped handle) and
 * paused (with a backup) memory, with the stream-order event and the copy streams created.
 * Whatever fails, destroy goes on; what is left is exactly the failed call's object: a handle
 * (cuMemRelease), a reservation (cuMemAddressFree), an event, a copy stream, a pushed or
 * retained context, or for cuMemUnmap the range it
 * was to unmap (one mapping per handle in it) and the reservation that still holds it (whose
 * cuMemAddressFree the fake then counts as misuse). */
static vmm_arena *arena_with_everything(void) {
  fake_driver_reset(NULL);
  vmm_config cfg = tu_config();
  vmm_arena *a = NULL;
  assert_int_equal(vmm_arena_create(&cfg, &a), VMM_OK);
  (void)tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  vmm_tag_push("paused");
  (void)tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  vmm_tag_pop();
  assert_int_equal(vmm_arena_pause(a, "paused", VMM_PAUSE_BACKUP), VMM_OK); /* a backup, and the copy streams */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t1 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(vmm_arena_free(a, t1, S1), VMM_OK);
  void *t2 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S2); /* t1 again, ordered by the event */
  void *k = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_free(a, t2, S2), VMM_OK);
  assert_int_equal(vmm_arena_free(a, k, S1), VMM_OK);  /* an idle handle */
  assert_int_equal(vmm_retention_abort(a), VMM_OK); /* t1 and k's handle abandoned */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *q = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK); /* three idle 2 MiB handles */
  void *t3 = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1); /* assembled: q's handles and 2 MiB new */
  void *r = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_free(a, t3, S1), VMM_OK); /* pooled */
  assert_int_equal(vmm_arena_free(a, r, S1), VMM_OK);  /* retained */
  vmm_snapshot s = tu_snapshot(a);
  assert_int_equal(s.assemblies, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].pooled_bytes, 8 * MiB);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_bytes, 2 * MiB);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].abandoned_bytes + s.kind[VMM_KIND_PACKAGE].abandoned_bytes, 4 * MiB);
  tu_check(a);
  return a;
}

static void destroy_meets_a_fault(void **state) {
  (void)state;
  unsigned points = 0;
  for (unsigned n = 1;; n++) {
    vmm_arena *a = arena_with_everything();
    size_t first = fake_call_count();
    fake_fail_nth_any(n, CUDA_ERROR_UNKNOWN, 0);
    vmm_arena_destroy(a);
    if (fake_faults_fired() == 0) {
      assert_true(fake_ledger_clean());
      break;
    }
    points++;
    const fake_call *failed = fake_call_at(first + n - 1);
    vmm_driver_entry e = failed->entry;
    points_by_entry[e]++;
    fake_ledger l;
    fake_get_ledger(&l);
    int unmap = e == VMM_DRV_mem_unmap;
    size_t handles = e == VMM_DRV_mem_release, reservations = unmap || e == VMM_DRV_mem_address_free;
    size_t mapped = unmap ? (size_t)failed->a1 : 0, misuse = unmap;
    if (l.live_handles != handles || l.mapped_bytes != mapped || (l.live_mappings != 0) != unmap ||
        l.reservations != reservations ||
        l.live_events != (e == VMM_DRV_event_destroy) || l.live_streams != (e == VMM_DRV_stream_destroy) ||
        l.live_host_allocs || l.ctx_pushed != (e == VMM_DRV_ctx_pop_current) ||
        l.primary_retained != (e == VMM_DRV_primary_ctx_release) || l.errors != misuse) {
      (void)fake_ledger_clean();
      fail_msg("destroy with call %u (%s) failing left more than that call's object", n, vmm_driver_entry_name(e));
    }
  }
  total_points += points;
  printf("destroy countdown: %u injection points, each leaving only the failed call's object\n", points);
}

static int report(void **state) {
  (void)state;
  printf("injection points exercised in total: %u; by entry point:", total_points);
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++)
    if (points_by_entry[e]) printf(" %s %u", vmm_driver_entry_name((vmm_driver_entry)e), points_by_entry[e]);
  printf("\n");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fault_free_run_reaches_every_entry_point),
      cmocka_unit_test(single_oom),
      cmocka_unit_test(persistent_oom),
      cmocka_unit_test(single_unknown),
      cmocka_unit_test(persistent_unknown),
      cmocka_unit_test(destroy_meets_a_fault),
  };
  return cmocka_run_group_tests(tests, NULL, report);
}
