/* Threads on one arena. A free synchronizes its stream with the arena unlocked, so other
 * calls can run inside that window: first each such interleaving is forced, deterministically,
 * from a driver hook; then 8 threads allocate and free both kinds at random while a ninth
 * runs retention scopes (finish, sometimes abort), quiesces and snapshots, for a bounded time
 * (VMMARENA_STRESS_SECONDS, default 5). A shadow list of live ranges asserts that no two
 * allocations ever overlap. Meant to run clean under ThreadSanitizer (tests/run-tsan). */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

/* ---- Forced interleavings -------------------------------------------------------------- */

/* The fake's table with cuStreamSynchronize wrapped: the hook runs once, on the freeing
 * thread, while the free waits with the arena unlocked. */
static struct vmm_driver hooked;
static vmm_arena *hook_arena;
static void (*hook)(vmm_arena *a);

static CUresult sync_with_hook(CUstream s) {
  CUresult r = fake_driver()->stream_synchronize(s);
  void (*h)(vmm_arena *) = hook;
  hook = NULL;
  if (h) h(hook_arena);
  return r;
}

static vmm_arena *hooked_arena(void) {
  fake_driver_reset(NULL);
  hooked = *fake_driver();
  hooked.stream_synchronize = sync_with_hook;
  vmm_config cfg = tu_config();
  cfg.driver = &hooked;
  vmm_arena *a = NULL;
  assert_int_equal(vmm_arena_create(&cfg, &a), VMM_OK);
  hook_arena = a;
  return a;
}

static void *free_target;
static vmm_status hook_status;

static void hook_abort(vmm_arena *a) { hook_status = vmm_retention_abort(a); }
static void hook_finish(vmm_arena *a) { hook_status = vmm_retention_finish(a); }
static void hook_begin(vmm_arena *a) { hook_status = vmm_retention_begin(a); }
static void hook_free_again(vmm_arena *a) { hook_status = vmm_arena_free(a, free_target, TU_STREAM(1)); }

/* An abort that lands while a package free of its scope synchronizes: the scope's memory
 * gets no driver call after the abort, so the handle is abandoned, not unmapped. */
static void abort_during_free(void **state) {
  (void)state;
  vmm_arena *a = hooked_arena();
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  hook = hook_abort;
  size_t unmaps = fake_calls_since(0, VMM_DRV_mem_unmap), releases = fake_calls_since(0, VMM_DRV_mem_release);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  assert_int_equal(hook_status, VMM_OK);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_unmap), unmaps);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_release), releases);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].abandoned_bytes, 4 * MiB);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, 0);
  assert_int_equal(s.frees, 1);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_ERR_UNKNOWN_POINTER);
  tu_destroy(a);
}

/* The same with a free that waits for a capture to end: an abort before the capture ends
 * leaves the allocation abandoned, and the capture's end brings no unmap or release. */
static void abort_while_free_waits_for_capture(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  fake_set_capturing(TU_STREAM(1), 1);
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  fake_set_capturing(TU_STREAM(1), 0);
  size_t unmaps = fake_calls_since(0, VMM_DRV_mem_unmap), releases = fake_calls_since(0, VMM_DRV_mem_release);
  void *q = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, TU_STREAM(2)); /* processes the deferred frees */
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_unmap), unmaps);
  assert_int_equal(fake_calls_since(0, VMM_DRV_mem_release), releases);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].abandoned_bytes, 4 * MiB);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_bytes, 2 * MiB);
  assert_int_equal(vmm_arena_free(a, q, TU_STREAM(2)), VMM_OK);
  tu_destroy(a);
}

/* A finish inside the window ends the scope; the free then releases at once. */
static void finish_during_free(void **state) {
  (void)state;
  vmm_arena *a = hooked_arena();
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  hook = hook_finish;
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  assert_int_equal(hook_status, VMM_OK);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.physical_bytes, 0);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_count, 0);
  tu_destroy(a);
}

/* A begin inside the window: the free, finishing inside the new scope, retains the handle
 * until that scope's finish. */
static void begin_during_free(void **state) {
  (void)state;
  vmm_arena *a = hooked_arena();
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  hook = hook_begin;
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  assert_int_equal(hook_status, VMM_OK);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].idle_bytes, 4 * MiB);
  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.physical_bytes, 0);
  tu_destroy(a);
}

/* A second free of the same pointer inside the window is refused and changes nothing. */
static void double_free_during_free(void **state) {
  (void)state;
  vmm_arena *a = hooked_arena();
  free_target = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  hook = hook_free_again;
  assert_int_equal(vmm_arena_free(a, free_target, TU_STREAM(1)), VMM_OK);
  assert_int_equal(hook_status, VMM_ERR_UNKNOWN_POINTER);
  assert_non_null(strstr(vmm_arena_last_error(a), "already being freed"));
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.frees, 1);
  assert_int_equal(s.physical_bytes, 0);
  tu_destroy(a);
}

/* ---- Random stress --------------------------------------------------------------------- */

#define WORKERS 8
#define LIVE_MAX 24
#define ABANDON_CAP (256 * GiB) /* no more aborts once this much is abandoned (retained package frees too) */

typedef struct shadow_range {
  uintptr_t base;
  size_t size;
  int owner;
} shadow_range;

static pthread_mutex_t shadow_lock = PTHREAD_MUTEX_INITIALIZER;
static shadow_range shadow[WORKERS * LIVE_MAX];
static size_t shadow_count;

static vmm_arena *stress_arena;
static uint64_t deadline_ns;
static int stop; /* set by the first failure; read with atomics */
static char failure[512];

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int running(void) { return !__atomic_load_n(&stop, __ATOMIC_ACQUIRE) && now_ns() < deadline_ns; }

static void fail_stress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_stress(const char *fmt, ...) {
  pthread_mutex_lock(&shadow_lock);
  if (!failure[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure, sizeof failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&shadow_lock);
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
}

/* Adds [base, base + size); an overlap with any live range is a failure. */
static void shadow_add(uintptr_t base, size_t size, int owner) {
  pthread_mutex_lock(&shadow_lock);
  for (size_t i = 0; i < shadow_count; i++) {
    const shadow_range *r = &shadow[i];
    if (base < r->base + r->size && r->base < base + size) {
      pthread_mutex_unlock(&shadow_lock);
      fail_stress("worker %d got 0x%lx+%zu, overlapping worker %d's live 0x%lx+%zu", owner, (unsigned long)base, size,
                  r->owner, (unsigned long)r->base, r->size);
      return;
    }
  }
  shadow[shadow_count++] = (shadow_range){base, size, owner};
  pthread_mutex_unlock(&shadow_lock);
}

/* Removed before the free, so that nobody can be handed the range while it is still listed. */
static void shadow_remove(uintptr_t base) {
  pthread_mutex_lock(&shadow_lock);
  for (size_t i = 0; i < shadow_count; i++) {
    if (shadow[i].base == base) {
      shadow[i] = shadow[--shadow_count];
      break;
    }
  }
  pthread_mutex_unlock(&shadow_lock);
}

static uint64_t next_random(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

typedef struct worker {
  int id;
  uint64_t allocs, frees;
} worker;

typedef struct live_alloc {
  void *ptr;
  size_t bytes;
} live_alloc;

static void free_one(worker *w, live_alloc *l, CUstream s) {
  shadow_remove((uintptr_t)l->ptr);
  vmm_status st = vmm_arena_free(stress_arena, l->ptr, s);
  if (st != VMM_OK) fail_stress("worker %d: free(%p): %s", w->id, l->ptr, vmm_status_name(st));
  w->frees++;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
  live_alloc live[LIVE_MAX];
  size_t n = 0;
  char tag[32];
  snprintf(tag, sizeof tag, "worker-%d", w->id);
  vmm_tag_push(tag);
  CUstream own = TU_STREAM(w->id), other = TU_STREAM((w->id + 1) % WORKERS);
  while (running()) {
    uint64_t r = next_random(&rng);
    if (n < LIVE_MAX && (n == 0 || r % 3 != 0)) {
      size_t bytes = (size_t)(1 + (r >> 8) % 16) * MiB - (size_t)((r >> 16) % 4096);
      vmm_kind kind = (r >> 32) & 1 ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE;
      int nested = ((r >> 40) & 7) == 0;
      if (nested) vmm_tag_push("nested");
      void *p = NULL;
      vmm_status st = vmm_arena_alloc(stress_arena, bytes, kind, own, &p);
      if (nested) vmm_tag_pop();
      if (st != VMM_OK) {
        fail_stress("worker %d: alloc %zu: %s", w->id, bytes, vmm_status_name(st));
        break;
      }
      w->allocs++;
      if (tu_mapped_from(p, bytes) < bytes) fail_stress("worker %d: %p is not mapped", w->id, p);
      shadow_add((uintptr_t)p, bytes, w->id);
      live[n++] = (live_alloc){p, bytes};
    } else {
      size_t i = (size_t)((r >> 8) % n);
      /* Now and then free on another thread's stream: its reuse must then be ordered. */
      free_one(w, &live[i], ((r >> 24) & 3) == 0 ? other : own);
      live[i] = live[--n];
    }
  }
  while (n) free_one(w, &live[--n], own);
  vmm_tag_pop();
  return NULL;
}

typedef struct controller {
  bool whole_process; /* empty_cache in place of scopes */
  uint64_t finished, aborted, snapshots, quiesces, emptied;
} controller;

/* Whole-process mode: no scopes; now and then the cache goes back (the unmapper drained first). */
static void empty_now_and_then(controller *c, uint64_t *rng) {
  if (next_random(rng) % 4) return;
  vmm_status st = vmm_arena_empty_cache(stress_arena);
  if (st != VMM_OK) fail_stress("empty_cache: %s", vmm_status_name(st));
  c->emptied++;
}

static void *controller_main(void *arg) {
  controller *c = arg;
  uint64_t rng = 12345;
  size_t json_cap = 1 << 20;
  char *json = malloc(json_cap);
  char why[256];
  while (running()) {
    vmm_status st = c->whole_process ? VMM_OK : vmm_retention_begin(stress_arena);
    if (st != VMM_OK) {
      fail_stress("begin: %s", vmm_status_name(st));
      break;
    }
    for (int i = 0; i < 4 && running(); i++) {
      vmm_snapshot s;
      if (vmm_arena_snapshot(stress_arena, &s) != VMM_OK) fail_stress("snapshot failed");
      size_t needed = 0;
      st = vmm_arena_snapshot_json(stress_arena, json, json_cap, &needed);
      char *grown = st == VMM_ERR_INVALID_ARGUMENT && needed > json_cap ? realloc(json, 2 * needed) : NULL;
      if (grown) { /* the mappings listed outgrew it (more under a loaded host): grow, as a caller would */
        json = grown, json_cap = 2 * needed;
        st = vmm_arena_snapshot_json(stress_arena, json, json_cap, &needed);
      }
      if (st != VMM_OK) fail_stress("snapshot_json: %s (needs %zu bytes)", vmm_status_name(st), needed);
      if (vmm_arena_check(stress_arena, why, sizeof why)) fail_stress("vmm_arena_check: %s", why);
      c->snapshots++;
      struct timespec pause = {0, 200000};
      nanosleep(&pause, NULL);
    }
    if (next_random(&rng) % 16 == 0) {
      st = vmm_arena_quiesce(stress_arena);
      if (st != VMM_OK) fail_stress("quiesce: %s", vmm_status_name(st));
      c->quiesces++;
    }
    if (c->whole_process) {
      empty_now_and_then(c, &rng);
      continue;
    }
    vmm_snapshot s;
    vmm_arena_snapshot(stress_arena, &s);
    uint64_t abandoned = s.kind[0].abandoned_bytes + s.kind[1].abandoned_bytes;
    if (next_random(&rng) % 4 == 0 && abandoned < ABANDON_CAP) {
      st = vmm_retention_abort(stress_arena);
      c->aborted++;
    } else {
      st = vmm_retention_finish(stress_arena);
      c->finished++;
    }
    if (st != VMM_OK) fail_stress("finish/abort: %s", vmm_status_name(st));
  }
  free(json);
  return NULL;
}

/* The workers and the controller on one arena until the deadline; the arena is left for the
 * caller's checks. */
static void run_threads(vmm_config *cfg, controller *ctl, worker *workers, double seconds) {
  fake_options opts = {.record_calls = -1, .capacity = 1024 * GiB, .va_space = 4096 * GiB};
  stress_arena = tu_arena(&opts, cfg);
  deadline_ns = now_ns() + (uint64_t)(seconds * 1e9);
  pthread_t threads[WORKERS + 1];
  for (int i = 0; i < WORKERS; i++) {
    workers[i] = (worker){.id = i};
    assert_int_equal(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
  }
  assert_int_equal(pthread_create(&threads[WORKERS], NULL, controller_main, ctl), 0);
  for (int i = 0; i <= WORKERS; i++) pthread_join(threads[i], NULL);
  if (failure[0]) fail_msg("%s", failure);
}

/* The arena's counts against the workers' once they are done: every allocation freed; *allocs:
 * the workers' allocations. */
static vmm_snapshot counted(const worker *workers, uint64_t *allocs) {
  uint64_t frees = 0;
  *allocs = 0;
  for (int i = 0; i < WORKERS; i++) *allocs += workers[i].allocs, frees += workers[i].frees;
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(stress_arena, &s), VMM_OK);
  assert_int_equal(s.allocs, *allocs);
  assert_int_equal(s.frees, frees);
  assert_int_equal(*allocs, frees);
  assert_int_equal(s.fatal_status, VMM_OK);
  assert_int_equal(shadow_count, 0);
  return s;
}

static double stress_seconds(void) {
  const char *env = getenv("VMMARENA_STRESS_SECONDS");
  return env ? atof(env) : 5.0;
}

/* Whole-process mode with retired ranges unmapped on the arena's thread, against workers
 * freeing on each other's streams and a controller emptying the cache. */
static void threads_on_one_whole_process_arena(void **state) {
  (void)state;
  double seconds = stress_seconds();
  vmm_config cfg = tu_config();
  cfg.caching = 1;
  cfg.retain = VMM_RETAIN_AUTO;
  cfg.unmap_in_background = 1;
  worker workers[WORKERS];
  controller ctl = {.whole_process = true};
  run_threads(&cfg, &ctl, workers, seconds);
  uint64_t allocs;
  vmm_snapshot s = counted(workers, &allocs);
  assert_true(s.unmapped_in_background > 0);
  printf("whole-process stress: %.1f s, %llu allocs, %llu ranges unmapped in the background, %llu empty_cache\n",
         seconds, (unsigned long long)allocs, (unsigned long long)s.unmapped_in_background,
         (unsigned long long)ctl.emptied);
  tu_check(stress_arena);
  tu_destroy(stress_arena);
}

static void threads_on_one_arena(void **state) {
  (void)state;
  double seconds = stress_seconds();
  vmm_config cfg = tu_config();
  cfg.reuse = VMM_REUSE_BEST_FIT; /* more reuse across sizes, more interleavings */
  worker workers[WORKERS];
  controller ctl = {0};
  run_threads(&cfg, &ctl, workers, seconds);
  uint64_t allocs;
  vmm_snapshot s = counted(workers, &allocs);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count + s.kind[VMM_KIND_TRANSIENT].live_count, 0);
  assert_true(ctl.finished > 0);
  printf("stress: %.1f s, %llu allocs and frees, pool hits %llu, %llu scopes finished, %llu aborted "
         "(%llu MiB abandoned), %llu snapshots, %llu quiesces\n",
         seconds, (unsigned long long)allocs, (unsigned long long)s.pool_hits,
         (unsigned long long)ctl.finished, (unsigned long long)ctl.aborted,
         (unsigned long long)((s.kind[0].abandoned_bytes + s.kind[1].abandoned_bytes) / MiB),
         (unsigned long long)ctl.snapshots, (unsigned long long)ctl.quiesces);
  tu_destroy(stress_arena);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(abort_during_free),
      cmocka_unit_test(threads_on_one_whole_process_arena),
      cmocka_unit_test(abort_while_free_waits_for_capture),
      cmocka_unit_test(finish_during_free),
      cmocka_unit_test(begin_during_free),
      cmocka_unit_test(double_free_during_free),
      cmocka_unit_test(threads_on_one_arena),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
