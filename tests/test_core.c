/* The core allocator on the fake driver: allocate and free outside a scope, argument and
 * pointer errors, stream safety of free (synchronize before unmap, defer on a capturing
 * stream), record before unmap, a fault at every driver call of alloc, free and create,
 * VA range coalescing and reservation growth, the sticky first fatal error, and peers. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)

/* ---- Helpers ------------------------------------------------------------------------- */

static void take(vmm_arena *a, vmm_snapshot *s) { assert_int_equal(vmm_arena_snapshot(a, s), VMM_OK); }

#define assert_has(text, needle) assert_has_at((text), (needle), __FILE__, __LINE__)
static void assert_has_at(const char *text, const char *needle, const char *file, int line) {
  if (text && strstr(text, needle)) return;
  fail_msg("%s:%d: \"%s\" does not contain \"%s\"", file, line, text ? text : "(null)", needle);
}

static void hex(char buf[32], const void *p) { snprintf(buf, 32, "0x%llx", (unsigned long long)(uintptr_t)p); }

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* The arena's byte counters agree with what the fake driver holds, and no misuse happened.
 * With `stuck_allowed` the driver may hold more mapped bytes than the arena counts: pieces
 * whose undo unmap failed stay mapped, out of the free list, until destroy. */
static void assert_driver_agrees_at(vmm_arena *a, int stuck_allowed) {
  vmm_snapshot s;
  fake_ledger l;
  take(a, &s);
  fake_get_ledger(&l);
  if (l.errors) fprintf(stderr, "fake misuse: %s\n", fake_first_error());
  assert_int_equal(l.errors, 0);
  assert_int_equal(l.live_handle_bytes, s.physical_bytes);
  if (stuck_allowed) assert_true(l.mapped_bytes >= s.mapped_bytes);
  else assert_int_equal(l.mapped_bytes, s.mapped_bytes);
  assert_int_equal(l.reserved_bytes, s.reserved_va_bytes);
}

static void assert_driver_agrees(vmm_arena *a) { assert_driver_agrees_at(a, 0); }

/* A failed cuCtxPopCurrent leaves the arena's context on this thread's stack, as CUDA would;
 * pop it here so that the ledger can be compared afterwards. */
static void pop_leftover_contexts(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  for (size_t i = 0; i < l.ctx_pushed; i++) {
    CUcontext c;
    assert_int_equal(fake_driver()->ctx_pop_current(&c), CUDA_SUCCESS);
  }
}

/* Index in the call log of the first call of `entry` with first argument a0, from `from`. */
static size_t find_call(size_t from, vmm_driver_entry entry, uintptr_t a0) {
  for (size_t i = from, n = fake_call_count(); i < n; i++) {
    const fake_call *c = fake_call_at(i);
    if (c->entry == entry && c->a0 == a0) return i;
  }
  return SIZE_MAX;
}

/* ---- Allocate and free outside a scope ----------------------------------------------- */

static void alloc_free_outside_scope(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_arena_granularity(a), 2 * MiB);
  void *one = tu_alloc(a, 1, VMM_KIND_PACKAGE, S1);
  void *over = tu_alloc(a, 2 * MiB + 1, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(dptr(one) % (2 * MiB), 0);
  assert_int_equal(fake_mapped_size_at(dptr(one)), 2 * MiB);
  assert_int_equal(fake_mapped_size_at(dptr(over)), 4 * MiB);
  assert_true(fake_access_granted(dptr(one), 0));
  vmm_snapshot s;
  take(a, &s);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 1);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, 2 * MiB);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 1);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_bytes, 4 * MiB);
  assert_int_equal(s.physical_bytes, 6 * MiB);
  assert_int_equal(s.mapped_bytes, 6 * MiB);
  assert_int_equal(s.allocs, 2);
  assert_driver_agrees(a);
  tu_check(a);

  /* Outside a scope a free releases at once, for both kinds: nothing is pooled or retained. */
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_free(a, over, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, one, S1), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 2);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_release), 2);
  take(a, &s);
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    assert_int_equal(s.kind[k].live_count, 0);
    assert_int_equal(s.kind[k].pooled_count, 0);
    assert_int_equal(s.kind[k].idle_count, 0);
  }
  assert_int_equal(s.physical_bytes, 0);
  assert_int_equal(s.physical_peak_bytes, 6 * MiB);
  assert_int_equal(s.frees, 2);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_int_equal(l.live_handles, 0);
  assert_int_equal(l.live_mappings, 0);
  tu_destroy(a);
}

/* Calls alloc with bad arguments and checks: the status, a message with `needle`, no
 * driver call and an unchanged snapshot. */
static void expect_bad_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, void **out, const char *needle) {
  vmm_snapshot before, after;
  take(a, &before);
  size_t calls = fake_call_count();
  if (out) *out = (void *)0x1;
  assert_int_equal(vmm_arena_alloc(a, bytes, kind, S1, out), VMM_ERR_INVALID_ARGUMENT);
  if (out) assert_null(*out);
  assert_has(vmm_arena_last_error(a), needle);
  assert_int_equal(fake_call_count(), calls);
  take(a, &after);
  assert_memory_equal(&before, &after, sizeof before);
}

static void alloc_bad_arguments(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *keep = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1); /* so "unchanged" covers a live mapping */
  void *p;
  expect_bad_alloc(a, 0, VMM_KIND_PACKAGE, &p, "0 bytes requested (package)");
  expect_bad_alloc(a, 0, VMM_KIND_TRANSIENT, &p, "0 bytes requested (transient)");
  expect_bad_alloc(a, ((size_t)1 << 47) + 1, VMM_KIND_PACKAGE, &p, "140737488355329 bytes (package)");
  expect_bad_alloc(a, ((size_t)1 << 47) + 1, VMM_KIND_PACKAGE, &p, "140737488355328-byte virtual address space");
  expect_bad_alloc(a, SIZE_MAX, VMM_KIND_TRANSIENT, &p, "18446744073709551615 bytes (transient)");
  expect_bad_alloc(a, 4096, VMM_KIND_PACKAGE, NULL, "NULL out-pointer (4096 bytes requested)");
  expect_bad_alloc(a, 4096, (vmm_kind)7, &p, "unknown kind 7");
  expect_bad_alloc(a, 4096, (vmm_kind)-1, &p, "unknown kind -1");
  /* The largest size accepted is exactly the VA bound; the fake then refuses the memory. */
  assert_int_equal(vmm_arena_alloc(a, (size_t)1 << 47, VMM_KIND_PACKAGE, S1, &p), VMM_ERR_OUT_OF_MEMORY);
  assert_has(vmm_arena_last_error(a), "requested 140737488355328 B");
  assert_has(vmm_arena_last_error(a), "reserving 128.0 TiB of virtual address space");
  assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
  assert_int_equal(vmm_arena_free(a, keep, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- Free errors --------------------------------------------------------------------- */

static void expect_bad_free(vmm_arena *a, void *ptr, const char *needle1, const char *needle2) {
  vmm_snapshot before, after;
  take(a, &before);
  size_t calls = fake_call_count();
  assert_int_equal(vmm_arena_free(a, ptr, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_has(vmm_arena_last_error(a), needle1);
  if (needle2) assert_has(vmm_arena_last_error(a), needle2);
  assert_int_equal(fake_call_count(), calls);
  take(a, &after);
  assert_memory_equal(&before, &after, sizeof before);
}

static void free_bad_pointers(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  char *p = tu_alloc(a, 3 * MiB, VMM_KIND_PACKAGE, S1);
  char *gone = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_free(a, gone, S1), VMM_OK);
  char h[4][32];
  hex(h[0], p);
  hex(h[1], p + MiB);
  hex(h[2], gone);
  hex(h[3], (void *)0x1234000);

  expect_bad_free(a, (void *)0x1234000, h[3], "not an allocation of the arena of device 0 (1 mappings)");
  expect_bad_free(a, p + MiB, h[1], "interior pointer, 1048576 bytes into the package allocation");
  expect_bad_free(a, p + MiB, h[0], "4.0 MiB extent, 3145728 bytes requested");
  expect_bad_free(a, gone, h[2], "not an allocation");
  expect_bad_free(a, NULL, "free(NULL)", NULL);

  /* A second free of a pooled transient names the state it is in. */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  size_t calls = fake_call_count();
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  assert_int_equal(fake_call_count(), calls); /* pooling a transient makes no driver call */
  hex(h[0], t);
  expect_bad_free(a, t, h[0], "already freed (idle in the pool)");
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  expect_bad_free(a, t, h[0], "not an allocation");

  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- Stream safety ------------------------------------------------------------------- */

static void free_synchronizes_before_unmap(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  for (int kind = 0; kind < VMM_KIND_COUNT; kind++) {
    void *p = tu_alloc(a, 4 * MiB, (vmm_kind)kind, S2);
    fake_program_wait(S1, S2); /* the program's last use of p is on S1 */
    size_t from = fake_call_count();
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK); /* the stream passed to free, not the alloc's */
    size_t sync = find_call(from, VMM_DRV_stream_synchronize, (uintptr_t)S1);
    size_t unmap = find_call(from, VMM_DRV_mem_unmap, dptr(p));
    assert_true(sync != SIZE_MAX);
    assert_true(unmap != SIZE_MAX);
    assert_true(sync < unmap);
    assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 1);
    assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
    assert_int_equal(fake_call_at(unmap + 1)->entry, VMM_DRV_mem_release);
  }
  tu_destroy(a);
}

/* Frees on a capturing stream are deferred with no synchronize; `complete` finishes them
 * once the capture is over. */
static void deferred_free_case(int complete_by_quiesce) {
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  void *t = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  fake_set_capturing(S1, 1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_ctx_synchronize), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 4 * MiB);
  vmm_snapshot s;
  take(a, &s);
  assert_int_equal(s.deferred_frees, 2);
  assert_int_equal(s.frees, 2);
  char h[32];
  hex(h, p);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_has(vmm_arena_last_error(a), h);
  assert_has(vmm_arena_last_error(a), "already freed (waiting for a capture to end)");

  /* Allocation during capture still works, and the deferred frees stay deferred. */
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_unmap), 0);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  tu_check(a);
  assert_driver_agrees(a);

  fake_set_capturing(S1, 0);
  from = fake_call_count();
  if (complete_by_quiesce) {
    assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  } else {
    void *r = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S2);
    assert_int_equal(vmm_arena_free(a, r, S2), VMM_OK);
  }
  size_t sync = find_call(from, VMM_DRV_stream_synchronize, (uintptr_t)S1);
  size_t unmap = find_call(from, VMM_DRV_mem_unmap, dptr(p));
  assert_true(sync != SIZE_MAX && unmap != SIZE_MAX && sync < unmap);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 0);
  assert_int_equal(fake_mapped_size_at(dptr(t)), 0);
  take(a, &s);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 0);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 1); /* q */
  assert_driver_agrees(a);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  tu_destroy(a);
}

static void free_on_capturing_stream_completed_by_quiesce(void **state) {
  (void)state;
  deferred_free_case(1);
}

static void free_on_capturing_stream_completed_by_alloc(void **state) {
  (void)state;
  deferred_free_case(0);
}

/* The legacy stream may not be touched while any stream captures: free on it defers too. */
static void free_on_legacy_stream_during_capture(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, NULL);
  fake_set_capturing(S2, 1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_free(a, p, NULL), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_stream_synchronize), 0);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 2 * MiB);
  fake_set_capturing(S2, 0);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 0);
  tu_destroy(a);
}

/* ---- Record before unmap ------------------------------------------------------------- */

static void failed_unmap_keeps_the_record(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  fake_fail_nth(VMM_DRV_mem_unmap, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_ERR_DRIVER);
  char h[32];
  hex(h, p);
  assert_has(vmm_arena_last_error(a), "cuMemUnmap returned CUDA_ERROR_UNKNOWN (999)");
  assert_has(vmm_arena_last_error(a), h);
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
  assert_has(fatal, "cuMemUnmap");
  vmm_snapshot s;
  take(a, &s);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 1);
  assert_int_equal(s.frees, 0);
  assert_int_equal(s.fatal_status, VMM_ERR_DRIVER);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 2 * MiB);
  tu_check(a);
  assert_driver_agrees(a);

  /* While p is live its range is not handed out again. */
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_ptr_not_equal(q, p);
  assert_true(dptr(q) + 2 * MiB <= dptr(p) || dptr(p) + 2 * MiB <= dptr(q));

  /* A second free retries and succeeds; then the range is free again. */
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  take(a, &s);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 1);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 0);
  void *r = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_ptr_equal(r, p); /* best fit: the 2 MiB hole p left */
  assert_int_equal(vmm_arena_free(a, r, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- A fault at every driver call ---------------------------------------------------- */

/* Failures an operation survives: a failed context push is retried by the next call, a
 * failed pop is not retried, a reservation that fails is retried at the request's size, a
 * stream whose capture state cannot be read counts as capturing (a free is deferred, a
 * pooled mapping is neither reused nor taken apart), and a failed free-memory query after
 * cuMemCreate ran out only drops figures from the refusal. */
static int absorbed_silently(vmm_driver_entry e) {
  return e == VMM_DRV_ctx_push_current || e == VMM_DRV_ctx_pop_current || e == VMM_DRV_mem_address_reserve ||
         e == VMM_DRV_stream_is_capturing || e == VMM_DRV_mem_get_info;
}

/* A failed stream-order step makes the pooled mapping unusable; a new one is made, and the
 * driver failure is still recorded as fatal. */
static int absorbed_with_fatal(vmm_driver_entry e) {
  return e == VMM_DRV_event_create || e == VMM_DRV_event_record || e == VMM_DRV_stream_wait_event;
}

typedef enum fault_mode {
  FAULT_ONCE,     /* the Nth call fails */
  FAULT_FROM_ANY, /* the Nth call and every later call fail */
  FAULT_FROM_SAME /* the Nth call and every later call of its entry point fail */
} fault_mode;

static const char *const fault_mode_names[] = {"one call", "that call and every later one",
                                               "that call and every later one of its entry point"};

#define FAULT_MAX_CALLS 64

typedef struct fault_run {
  CUresult code;
  fault_mode mode;
  vmm_driver_entry ref[FAULT_MAX_CALLS]; /* FAULT_FROM_SAME: the calls of a run without faults */
  size_t ref_len;
  size_t from;           /* call log index where the rule was set */
  unsigned nth;
  vmm_driver_entry entry; /* the entry point of the Nth call */
  unsigned fired_before;  /* faults fired before the rule was set */
  int fired;
  int failed_fatal;       /* an absorbed_with_fatal entry failed */
  int failed_other;       /* an entry outside both absorbed sets failed */
  int full_device;        /* the device has no memory left: new memory is refused */
} fault_run;

/* Keeps the calls made since `from` (by a run without faults) for FAULT_FROM_SAME. */
static void fault_reference(fault_run *f, size_t from) {
  f->ref_len = 0;
  for (size_t i = from, n = fake_call_count(); i < n; i++) {
    assert_true(f->ref_len < FAULT_MAX_CALLS);
    f->ref[f->ref_len++] = fake_call_at(i)->entry;
  }
}

static void fault_arm(fault_run *f, unsigned nth) {
  f->nth = nth;
  f->from = fake_call_count();
  f->fired_before = fake_faults_fired();
  if (f->mode != FAULT_FROM_SAME) {
    fake_fail_nth_any(nth, f->code, f->mode == FAULT_FROM_ANY);
  } else if (nth <= f->ref_len) {
    /* Call `nth` is call `k` of its entry point. */
    unsigned k = 0;
    for (unsigned i = 0; i < nth; i++) k += f->ref[i] == f->ref[nth - 1];
    fake_fail_nth(f->ref[nth - 1], k, f->code, 1);
  }
}

/* Clears the rule and reads which calls it failed; returns whether it fired. */
static int fault_disarm(fault_run *f) {
  fake_clear_faults();
  f->fired = fake_faults_fired() != f->fired_before;
  f->failed_fatal = f->failed_other = 0;
  if (!f->fired) return 0;
  f->entry = fake_call_at(f->from + f->nth - 1)->entry;
  for (size_t i = f->from + f->nth - 1, n = fake_call_count(); i < n; i++) {
    const fake_call *c = fake_call_at(i);
    if (c->result != f->code || c->entry == VMM_DRV_get_error_name) continue;
    if (absorbed_with_fatal(c->entry)) f->failed_fatal = 1;
    else if (!absorbed_silently(c->entry)) f->failed_other = 1;
  }
  pop_leftover_contexts();
  return 1;
}

/* Checks status, messages and the fatal error after a fault. */
static void check_fault_status(vmm_arena *a, const fault_run *f, vmm_status st, const char *op) {
  int oom = f->code == CUDA_ERROR_OUT_OF_MEMORY;
  vmm_status expect = oom ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER;
  const char *fatal = NULL;
  vmm_status fatal_st = vmm_arena_fatal_error(a, &fatal);
  char code[16];
  snprintf(code, sizeof code, "(%d)", (int)f->code);
  if (st == VMM_ERR_OUT_OF_MEMORY && f->full_device && !f->failed_other && !f->failed_fatal &&
      strstr(vmm_arena_last_error(a), "refused")) {
    /* Absorbed: the pooled mappings counted as unusable (their stream's capture state could
     * not be read), and the full device refused the new memory, whatever code the absorbed
     * call failed with. A refusal, not fatal. */
    assert_int_equal(fatal_st, VMM_OK);
    return;
  }
  if (st != VMM_OK && st != expect)
    fail_msg("%s, call %u (%s) failed with %d: status %s: %s", op, f->nth, vmm_driver_entry_name(f->entry),
             (int)f->code, vmm_status_name(st), vmm_arena_last_error(a));
  if (oom) {
    assert_int_equal(fatal_st, VMM_OK);
    /* The name, or its number where the failing driver cannot name it either. */
    if (st != VMM_OK && !strstr(vmm_arena_last_error(a), "OUT_OF_MEMORY")) assert_has(vmm_arena_last_error(a), code);
    return;
  }
  if (st == VMM_ERR_DRIVER) {
    assert_has(vmm_arena_last_error(a), code);
    assert_int_equal(fatal_st, VMM_ERR_DRIVER);
    assert_has(fatal, code);
    if (f->mode == FAULT_ONCE) {
      assert_has(vmm_arena_last_error(a), vmm_driver_entry_name(f->entry));
      assert_has(fatal, vmm_driver_entry_name(f->entry));
    }
    return;
  }
  /* Success after a non-OOM fault: only the failures stated above may be survived. */
  if (f->failed_other)
    fail_msg("%s succeeded although call %u (%s) failed with %d", op, f->nth, vmm_driver_entry_name(f->entry),
             (int)f->code);
  assert_int_equal(fatal_st, f->failed_fatal ? VMM_ERR_DRIVER : VMM_OK);
}

typedef enum alloc_setup {
  ALLOC_PLAIN,               /* outside a scope */
  ALLOC_HEADROOM,            /* outside a scope, headroom checked against device free memory */
  ALLOC_HEADROOM_INTEGRATED, /* the same on a unified-memory GPU: host MemAvailable */
  ALLOC_SCOPE,               /* inside a scope, pool empty: a new mapping */
  ALLOC_SCOPE_POOLED,        /* inside a scope, a pooled mapping freed on another stream: reuse by event order */
  ALLOC_SCOPE_ASSEMBLY,      /* inside a scope, device full, two 2 MiB pooled: taken apart, assembled into 4 MiB */
  ALLOC_SETUP_COUNT
} alloc_setup;

static const char *const alloc_setup_names[] = {
    "outside a scope", "with headroom", "with headroom on an integrated GPU", "in a scope",
    "in a scope, pooled on another stream", "in a scope, assembled from pooled mappings"};

static vmm_arena *alloc_setup_arena(alloc_setup setup, size_t *request, CUstream *stream) {
  fake_options o = {0};
  vmm_config cfg = tu_config();
  if (setup == ALLOC_SCOPE_ASSEMBLY) o.capacity = 4 * MiB;
  if (setup == ALLOC_HEADROOM || setup == ALLOC_HEADROOM_INTEGRATED) cfg.headroom_bytes = GiB;
  o.integrated = setup == ALLOC_HEADROOM_INTEGRATED;
  vmm_arena *a = tu_arena(&o, &cfg);
  *request = 3 * MiB;
  *stream = S1;
  if (setup < ALLOC_SCOPE) return a;
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  if (setup == ALLOC_SCOPE_POOLED) {
    void *t = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S1);
    assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
    *stream = S2;
  } else if (setup == ALLOC_SCOPE_ASSEMBLY) {
    void *t1 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
    void *t2 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1);
    assert_int_equal(vmm_arena_free(a, t1, S1), VMM_OK);
    assert_int_equal(vmm_arena_free(a, t2, S1), VMM_OK);
  }
  return a;
}

/* Frees what the case left and ends its scope, then destroys with a clean ledger. */
static void fault_cleanup(vmm_arena *a, void *p) {
  if (p) tu_free(a, p, S1);
  vmm_snapshot s;
  take(a, &s);
  if (s.scope_state == VMM_SCOPE_ACTIVE) assert_int_equal(vmm_retention_finish(a), VMM_OK);
  tu_destroy(a);
}

/* Fails call N of one allocation for N = 1, 2, ... until it completes without meeting the
 * fault. Returns the number of calls failed. */
static unsigned alloc_fault_sweep(alloc_setup setup, vmm_kind kind, CUresult code, fault_mode mode) {
  fault_run f = {.code = code, .mode = mode, .full_device = setup == ALLOC_SCOPE_ASSEMBLY};
  if (mode == FAULT_FROM_SAME) {
    size_t request;
    CUstream stream;
    vmm_arena *a = alloc_setup_arena(setup, &request, &stream);
    size_t from = fake_call_count();
    void *p = tu_alloc(a, request, kind, stream);
    fault_reference(&f, from);
    fault_cleanup(a, p);
  }
  for (unsigned n = 1;; n++) {
    size_t request;
    CUstream stream;
    vmm_arena *a = alloc_setup_arena(setup, &request, &stream);
    vmm_snapshot before, after;
    take(a, &before);
    void *p = (void *)0x1;
    fault_arm(&f, n);
    vmm_status st = vmm_arena_alloc(a, request, kind, stream, &p);
    if (!fault_disarm(&f)) {
      assert_int_equal(st, VMM_OK);
      take(a, &after);
      /* The sweep ran through the path the setup was made for. */
      if (setup == ALLOC_SCOPE_POOLED) assert_int_equal(after.pool_hits, before.pool_hits + 1);
      if (setup == ALLOC_SCOPE_ASSEMBLY) {
        assert_int_equal(after.assemblies, 1);
        assert_int_equal(after.pooled_taken_apart, 2);
        assert_int_equal(after.assembly_created_bytes, 0);
      }
      if (setup == ALLOC_HEADROOM) assert_int_equal(after.driver[VMM_DRV_mem_get_info].calls, 1);
      if (setup == ALLOC_HEADROOM_INTEGRATED) assert_int_equal(after.driver[VMM_DRV_host_memory_available].calls, 1);
      fault_cleanup(a, p);
      return n - 1;
    }
    char op[128];
    snprintf(op, sizeof op, "%s alloc %s", kind == VMM_KIND_PACKAGE ? "package" : "transient",
             alloc_setup_names[setup]);
    check_fault_status(a, &f, st, op);
    take(a, &after);
    if (st == VMM_OK) {
      assert_non_null(p);
      assert_int_equal(after.kind[kind].live_count, before.kind[kind].live_count + 1);
      assert_true(fake_mapped_size_at(dptr(p)) > 0);
    } else {
      assert_null(p);
      assert_int_equal(after.kind[kind].live_count, before.kind[kind].live_count);
      p = NULL;
    }
    tu_check(a);
    /* Only a fault at every later call can fail the unmap that undoes a failed map. */
    assert_driver_agrees_at(a, mode == FAULT_FROM_ANY);
    /* The arena still works: a new allocation is not placed over anything still mapped
     * (the fake counts that as misuse). With the device full it may be refused. */
    void *q = NULL;
    vmm_status again = vmm_arena_alloc(a, request, kind, stream, &q);
    if (again != VMM_OK && again != VMM_ERR_OUT_OF_MEMORY)
      fail_msg("%s: alloc after the fault: %s: %s", op, vmm_status_name(again), vmm_arena_last_error(a));
    assert_driver_agrees_at(a, mode == FAULT_FROM_ANY);
    if (q) assert_int_equal(vmm_arena_free(a, q, stream), VMM_OK);
    fault_cleanup(a, p);
  }
}

static unsigned alloc_points, free_points, create_points;

static void sweep_alloc(fault_mode mode) {
  static const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
  unsigned total = 0;
  for (size_t c = 0; c < 2; c++) {
    for (int setup = ALLOC_PLAIN; setup < ALLOC_SETUP_COUNT; setup++) {
      for (int kind = 0; kind < VMM_KIND_COUNT; kind++) {
        /* A package never takes a pooled mapping whole; it is assembled from pooled handles. */
        if (setup == ALLOC_SCOPE_POOLED && kind == VMM_KIND_PACKAGE) continue;
        unsigned n = alloc_fault_sweep((alloc_setup)setup, (vmm_kind)kind, codes[c], mode);
        assert_true(n >= 3);
        total += n;
      }
    }
  }
  printf("alloc: %u injection points (%s)\n", total, fault_mode_names[mode]);
  alloc_points += total;
}

static void fault_at_every_alloc_call(void **state) {
  (void)state;
  sweep_alloc(FAULT_ONCE);
}

static void fault_from_every_alloc_call(void **state) {
  (void)state;
  sweep_alloc(FAULT_FROM_ANY);
}

static void fault_from_every_alloc_call_on_its_entry_point(void **state) {
  (void)state;
  sweep_alloc(FAULT_FROM_SAME);
}

typedef enum free_setup { FREE_PLAIN, FREE_SCOPE } free_setup;

/* Like alloc_fault_sweep, for one free. */
static unsigned free_fault_sweep(free_setup setup, vmm_kind kind, CUresult code, fault_mode mode) {
  fault_run f = {.code = code, .mode = mode};
  if (mode == FAULT_FROM_SAME) {
    vmm_arena *a = tu_arena(NULL, NULL);
    if (setup == FREE_SCOPE) assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *p = tu_alloc(a, 3 * MiB, kind, S1);
    fake_program_wait(S2, S1); /* freed on S2: the program ordered S2 after its use on S1 */
    size_t from = fake_call_count();
    assert_int_equal(vmm_arena_free(a, p, S2), VMM_OK);
    fault_reference(&f, from);
    fault_cleanup(a, NULL);
  }
  for (unsigned n = 1;; n++) {
    vmm_arena *a = tu_arena(NULL, NULL);
    if (setup == FREE_SCOPE) assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *p = tu_alloc(a, 3 * MiB, kind, S1);
    fake_program_wait(S2, S1);
    vmm_snapshot before, after;
    take(a, &before);
    fault_arm(&f, n);
    vmm_status st = vmm_arena_free(a, p, S2);
    if (!fault_disarm(&f)) {
      assert_int_equal(st, VMM_OK);
      fault_cleanup(a, NULL);
      return n - 1;
    }
    char op[128];
    snprintf(op, sizeof op, "%s free %s", kind == VMM_KIND_PACKAGE ? "package" : "transient",
             setup == FREE_SCOPE ? "in a scope" : "outside a scope");
    check_fault_status(a, &f, st, op);
    take(a, &after);
    int still_mapped = fake_mapped_size_at(dptr(p)) != 0;
    if (st == VMM_OK) {
      assert_int_equal(after.frees, before.frees + 1);
      if (still_mapped) assert_int_equal(after.deferred_frees, before.deferred_frees + 1);
    } else if (still_mapped) {
      /* Record before unmap: still live, and a second free retries. */
      assert_int_equal(after.kind[kind].live_count, before.kind[kind].live_count);
      assert_int_equal(after.frees, before.frees);
    } else {
      /* Unmapped, but the release failed: the handle waits on the retained list. */
      assert_int_equal(after.kind[kind].live_count, before.kind[kind].live_count - 1);
      assert_int_equal(after.kind[kind].idle_count, before.kind[kind].idle_count + 1);
      if (mode == FAULT_ONCE) assert_int_equal(f.entry, VMM_DRV_mem_release);
    }
    tu_check(a);
    assert_driver_agrees(a);
    if (st != VMM_OK && still_mapped) {
      assert_int_equal(vmm_arena_free(a, p, S2), VMM_OK);
    } else {
      assert_int_equal(vmm_arena_free(a, p, S2), VMM_ERR_UNKNOWN_POINTER);
      assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* completes a deferred free */
    }
    assert_int_equal(fake_mapped_size_at(dptr(p)), 0);
    fault_cleanup(a, NULL);
  }
}

static void sweep_free(fault_mode mode) {
  static const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
  unsigned total = 0;
  for (size_t c = 0; c < 2; c++) {
    for (int kind = 0; kind < VMM_KIND_COUNT; kind++) {
      unsigned n = free_fault_sweep(FREE_PLAIN, (vmm_kind)kind, codes[c], mode);
      assert_true(n >= 4); /* push, capture query, synchronize, unmap, release, pop */
      total += n;
    }
    /* In a scope a package free unmaps and retains; a transient free makes no driver call. */
    unsigned n = free_fault_sweep(FREE_SCOPE, VMM_KIND_PACKAGE, codes[c], mode);
    assert_true(n >= 3);
    total += n;
    assert_int_equal(free_fault_sweep(FREE_SCOPE, VMM_KIND_TRANSIENT, codes[c], mode), 0);
  }
  printf("free: %u injection points (%s)\n", total, fault_mode_names[mode]);
  free_points += total;
}

static void fault_at_every_free_call(void **state) {
  (void)state;
  sweep_free(FAULT_ONCE);
}

static void fault_from_every_free_call(void **state) {
  (void)state;
  sweep_free(FAULT_FROM_ANY);
}

static void fault_from_every_free_call_on_its_entry_point(void **state) {
  (void)state;
  sweep_free(FAULT_FROM_SAME);
}

/* ---- Ranges and reservations --------------------------------------------------------- */

static void ranges_coalesce_and_reservations_grow(void **state) {
  (void)state;
  vmm_config cfg = tu_config();
  cfg.reserve_bytes = 8 * MiB;
  vmm_arena *a = tu_arena(NULL, &cfg);
  char *q[4];
  for (int i = 0; i < 4; i++) q[i] = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  vmm_snapshot s;
  take(a, &s);
  assert_int_equal(s.reservations, 1);
  assert_int_equal(s.reserved_va_bytes, 8 * MiB);
  char *lowest = q[0];
  for (int i = 1; i < 4; i++) lowest = q[i] < lowest ? q[i] : lowest;

  /* The first reservation is full: the next request makes a second one. */
  void *big = tu_alloc(a, 8 * MiB, VMM_KIND_PACKAGE, S1);
  take(a, &s);
  assert_int_equal(s.reservations, 2);
  assert_int_equal(s.reserved_va_bytes, 16 * MiB);
  assert_true((char *)big < lowest || (char *)big >= lowest + 8 * MiB);

  /* Two 2 MiB holes that do not touch cannot hold 4 MiB: a third reservation. */
  char *hole1 = lowest + 2 * MiB, *middle = lowest + 4 * MiB, *hole2 = lowest + 6 * MiB;
  assert_int_equal(vmm_arena_free(a, hole1, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, hole2, S1), VMM_OK);
  void *four = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  take(a, &s);
  assert_int_equal(s.reservations, 3);
  tu_check(a);

  /* Freeing the mapping between them coalesces the three into 6 MiB, which fits 6 MiB. */
  assert_int_equal(vmm_arena_free(a, middle, S1), VMM_OK);
  tu_check(a); /* the checker rejects adjacent free ranges that were not merged */
  void *six = tu_alloc(a, 6 * MiB, VMM_KIND_PACKAGE, S1);
  assert_ptr_equal(six, hole1);
  take(a, &s);
  assert_int_equal(s.reservations, 3);
  assert_driver_agrees(a);

  assert_int_equal(vmm_arena_free(a, six, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, four, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, big, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, lowest, S1), VMM_OK);
  /* Everything free again: one whole reservation's worth is one range per reservation. */
  void *whole = tu_alloc(a, 8 * MiB, VMM_KIND_TRANSIENT, S1);
  take(a, &s);
  assert_int_equal(s.reservations, 3);
  assert_int_equal(vmm_arena_free(a, whole, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- The first fatal error ----------------------------------------------------------- */

static void first_fatal_error_is_sticky(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
  assert_string_equal(fatal, "");
  void *p;
  fake_fail_nth(VMM_DRV_mem_map, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1, &p), VMM_ERR_DRIVER);
  assert_has(vmm_arena_last_error(a), "cuMemMap returned CUDA_ERROR_UNKNOWN (999)");
  char first[768];
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
  snprintf(first, sizeof first, "%s", fatal);
  assert_has(first, "cuMemMap");

  fake_fail_nth(VMM_DRV_mem_create, 1, CUDA_ERROR_ILLEGAL_ADDRESS, 0);
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1, &p), VMM_ERR_DRIVER);
  assert_has(vmm_arena_last_error(a), "cuMemCreate returned CUDA_ERROR_ILLEGAL_ADDRESS (700)");
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
  assert_string_equal(fatal, first);

  /* An out-of-memory refusal after it changes the latest error, not the fatal one. */
  fake_set_capacity(0, 0);
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S1, &p), VMM_ERR_OUT_OF_MEMORY);
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_ERR_DRIVER);
  assert_string_equal(fatal, first);
  tu_destroy(a);
}

static void out_of_memory_is_not_fatal(void **state) {
  (void)state;
  fake_options o = {.capacity = 4 * MiB};
  vmm_arena *a = tu_arena(&o, NULL);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  void *q = (void *)0x1;
  assert_int_equal(vmm_arena_alloc(a, MiB, VMM_KIND_TRANSIENT, S1, &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  const char *msg = vmm_arena_last_error(a);
  assert_has(msg, "requested 1048576 B, rounded 2097152 B");
  assert_has(msg, "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY");
  assert_has(msg, "device free 0 B of 4.0 MiB");
  assert_has(msg, "arena holds 4.0 MiB live (package 4.0 MiB, transient 0 B)");
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
  vmm_snapshot s;
  take(a, &s);
  assert_int_equal(s.oom_refusals, 1);
  assert_int_equal(s.fatal_status, VMM_OK);
  assert_int_equal(s.kind[VMM_KIND_TRANSIENT].live_count, 0);
  tu_check(a);
  assert_driver_agrees(a);
  /* Once memory is freed the same request succeeds (the retry PyTorch makes). */
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  q = tu_alloc(a, MiB, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- Creation ------------------------------------------------------------------------ */

static void expect_create_error(const vmm_config *cfg, vmm_status want, const char *needle) {
  vmm_arena *a = (vmm_arena *)0x1;
  assert_int_equal(vmm_arena_create(cfg, &a), want);
  assert_null(a);
  assert_has(vmm_create_error(), needle);
  assert_true(fake_ledger_clean());
}

static void create_bad_config(void **state) {
  (void)state;
  fake_driver_reset(NULL);
  vmm_config cfg = tu_config();
  cfg.device = -1;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "device -1 out of range (0..63)");
  cfg.device = VMM_MAX_DEVICES;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "device 64 out of range (0..63)");
  cfg.device = 1;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "device 1 not present: the driver reports 1 device(s)");

  struct vmm_driver old = *fake_driver();
  old.version = 0;
  cfg = tu_config();
  cfg.driver = &old;
  size_t calls = fake_call_count();
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "driver table version 0 < 1");
  assert_int_equal(fake_call_count(), calls);

  cfg = tu_config();
  cfg.reserve_bytes = 0;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "reserve_bytes must be greater than zero");
  cfg = tu_config();
  cfg.reuse = VMM_REUSE_BOUNDED;
  cfg.reuse_bound = 0.5;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "reuse bound 0.5 must be at least 1");
  cfg = tu_config();
  cfg.refill_share = 1.5;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "refill share 1.5 must be 0 (assemble first) or in (0, 1]");
  cfg.refill_share = -0.25;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "refill share -0.25 must be 0");
  cfg.refill_share = 0.0;
  cfg.refill_live_share = 0.5;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "refill live share 0.5 must be 0 (off) or in [1, 1e6]");
  cfg.refill_live_share = 1.05;
  cfg.refill_share = 0.9;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT,
                      "refill share 0.9 and refill live share 1.05 are both set; VMMARENA_REFILL takes one of them");
  cfg = tu_config();
  cfg.unmap_in_background = 2;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "unmap_in_background 2 must be 0 (inline) or 1 (background)");
  cfg = tu_config();
  cfg.grow_in_place = -1;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "grow_in_place -1 must be 0 (off) or 1 (on)");
  cfg = tu_config();
  assert_int_equal(vmm_arena_create(&cfg, NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_has(vmm_create_error(), "NULL out-pointer");
}

/* Fails call N of arena creation (two devices, peer access asked) for N = 1, 2, ... */
static void fault_at_every_create_call(void **state) {
  (void)state;
  static const CUresult codes[] = {CUDA_ERROR_UNKNOWN, CUDA_ERROR_OUT_OF_MEMORY};
  fake_options o = {.device_count = 2};
  unsigned total = 0;
  for (size_t c = 0; c < 2; c++) {
    fault_run f = {.code = codes[c]};
    for (unsigned n = 1;; n++) {
      fake_driver_reset(&o);
      vmm_config cfg = tu_config();
      cfg.peer_access_mask = 1u << 1;
      vmm_arena *a = (vmm_arena *)0x1;
      fault_arm(&f, n);
      vmm_status st = vmm_arena_create(&cfg, &a);
      if (!fault_disarm(&f)) {
        assert_int_equal(st, VMM_OK);
        tu_destroy(a);
        total += n - 1;
        assert_true(n - 1 >= 8);
        break;
      }
      if (st == VMM_OK) {
        /* Only the context push and pop are survived (the next call pushes again). */
        assert_true(f.entry == VMM_DRV_ctx_push_current || f.entry == VMM_DRV_ctx_pop_current);
        assert_int_equal(vmm_arena_fatal_error(a, NULL), VMM_OK);
        tu_destroy(a);
        continue;
      }
      assert_null(a);
      assert_int_equal(st, codes[c] == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER);
      char code[16];
      snprintf(code, sizeof code, "(%d)", (int)codes[c]);
      const char *msg = vmm_create_error();
      assert_has(msg, "creating the arena for device 0");
      assert_has(msg, vmm_driver_entry_name(f.entry));
      assert_has(msg, code);
      assert_true(fake_ledger_clean());
    }
  }
  printf("create: %u injection points\n", total);
  create_points += total;
}

static void create_without_libcuda(void **state) {
  (void)state;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    dlclose(lib);
    skip(); /* a machine with a driver: this case is about machines without one */
  }
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.log_level = 0;
  assert_null(cfg.driver);
  for (int attempt = 0; attempt < 2; attempt++) { /* loaded once; the answer stays the same */
    vmm_arena *a = (vmm_arena *)0x1;
    assert_int_equal(vmm_arena_create(&cfg, &a), VMM_ERR_NO_DRIVER);
    assert_null(a);
    assert_has(vmm_create_error(), "libcuda.so.1");
  }
  const char *why = NULL;
  assert_null(vmm_driver_cuda(&why));
  assert_has(why, "libcuda.so.1");
}

/* ---- Two devices and peer access ----------------------------------------------------- */

static vmm_arena *create_on(int device, uint64_t peers) {
  vmm_config cfg = tu_config();
  cfg.device = device;
  cfg.peer_access_mask = peers;
  vmm_arena *a = NULL;
  vmm_status st = vmm_arena_create(&cfg, &a);
  if (st != VMM_OK) fail_msg("create on device %d: %s", device, vmm_create_error());
  return a;
}

static void two_devices_and_peer_access(void **state) {
  (void)state;
  fake_options o = {.device_count = 2};
  fake_driver_reset(&o);
  vmm_arena *with_peer = create_on(0, 1u << 1);
  vmm_arena *dev1 = create_on(1, 0);
  vmm_arena *alone = create_on(0, 0);
  assert_int_equal(vmm_arena_device(dev1), 1);
  void *p = tu_alloc(with_peer, 2 * MiB, VMM_KIND_PACKAGE, S1);
  void *q = tu_alloc(dev1, 2 * MiB, VMM_KIND_PACKAGE, S1);
  void *r = tu_alloc(alone, 2 * MiB, VMM_KIND_TRANSIENT, S1);
  assert_true(fake_access_granted(dptr(p), 0));
  assert_true(fake_access_granted(dptr(p), 1));
  assert_true(fake_access_granted(dptr(q), 1));
  assert_false(fake_access_granted(dptr(q), 0));
  assert_true(fake_access_granted(dptr(r), 0));
  assert_false(fake_access_granted(dptr(r), 1));
  vmm_snapshot s;
  take(dev1, &s);
  assert_int_equal(s.device, 1);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count, 1);
  /* Each arena knows only its own pointers. */
  assert_int_equal(vmm_arena_free(dev1, p, S1), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(vmm_arena_free(with_peer, p, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(dev1, q, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(alone, r, S1), VMM_OK);
  tu_check(with_peer);
  tu_check(dev1);
  vmm_arena_destroy(with_peer);
  vmm_arena_destroy(dev1);
  tu_destroy(alone);

  /* "all" grants every device that can reach this one, and skips those that cannot. */
  fake_driver_reset(&o);
  vmm_arena *all = create_on(0, ~(uint64_t)0);
  p = tu_alloc(all, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_true(fake_access_granted(dptr(p), 1));
  assert_int_equal(vmm_arena_free(all, p, S1), VMM_OK);
  tu_destroy(all);
  fake_options no_peer = {.device_count = 2, .peer_access = -1};
  fake_driver_reset(&no_peer);
  all = create_on(0, ~(uint64_t)0);
  p = tu_alloc(all, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_false(fake_access_granted(dptr(p), 1));
  assert_int_equal(vmm_arena_free(all, p, S1), VMM_OK);
  tu_destroy(all);
}

static void peer_access_errors(void **state) {
  (void)state;
  fake_options o = {.device_count = 2};
  fake_driver_reset(&o);
  vmm_config cfg = tu_config();
  cfg.peer_access_mask = 1u << 3;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "peer access to device 3 asked, but only 2 device(s) exist");
  fake_options no_peer = {.device_count = 2, .peer_access = -1};
  fake_driver_reset(&no_peer);
  cfg = tu_config();
  cfg.peer_access_mask = 1u << 1;
  expect_create_error(&cfg, VMM_ERR_INVALID_ARGUMENT, "device 1 cannot access device 0's memory (no peer path)");
}

static int print_totals(void **state) {
  (void)state;
  printf("fault injection: %u alloc, %u free, %u create points exercised\n", alloc_points, free_points, create_points);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(alloc_free_outside_scope),
      cmocka_unit_test(alloc_bad_arguments),
      cmocka_unit_test(free_bad_pointers),
      cmocka_unit_test(free_synchronizes_before_unmap),
      cmocka_unit_test(free_on_capturing_stream_completed_by_quiesce),
      cmocka_unit_test(free_on_capturing_stream_completed_by_alloc),
      cmocka_unit_test(free_on_legacy_stream_during_capture),
      cmocka_unit_test(failed_unmap_keeps_the_record),
      cmocka_unit_test(fault_at_every_alloc_call),
      cmocka_unit_test(fault_from_every_alloc_call),
      cmocka_unit_test(fault_from_every_alloc_call_on_its_entry_point),
      cmocka_unit_test(fault_at_every_free_call),
      cmocka_unit_test(fault_from_every_free_call),
      cmocka_unit_test(fault_from_every_free_call_on_its_entry_point),
      cmocka_unit_test(ranges_coalesce_and_reservations_grow),
      cmocka_unit_test(first_fatal_error_is_sticky),
      cmocka_unit_test(out_of_memory_is_not_fatal),
      cmocka_unit_test(create_bad_config),
      cmocka_unit_test(fault_at_every_create_call),
      cmocka_unit_test(create_without_libcuda),
      cmocka_unit_test(two_devices_and_peer_access),
      cmocka_unit_test(peer_access_errors),
  };
  return cmocka_run_group_tests(tests, NULL, print_totals);
}
