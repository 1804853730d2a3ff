/* Threads on one arena (fake driver): random allocations and frees of both kinds checked
 * against a shadow model of live ranges (no two may overlap), first outside any scope,
 * then while another thread opens and closes retention scopes. cmocka is not thread-safe,
 * so the threads record failures and the main thread asserts on them after the join. */
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#define THREADS 8
#define OPS_PER_THREAD 20000
#define LIVE_PER_THREAD 16
#define GRAIN (2 * MiB)

/* ---- Failures recorded by the threads ------------------------------------------------ */

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned failures;
static char first_failure[512];

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...) {
  pthread_mutex_lock(&report_lock);
  if (failures++ == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(first_failure, sizeof first_failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&report_lock);
}

static void assert_no_failures(void) {
  if (failures) fail_msg("%u failures in the threads; first: %s", failures, first_failure);
}

/* ---- Shadow model: the live ranges [lo, hi) handed out ------------------------------- */

typedef struct range {
  uintptr_t lo, hi;
} range;

static struct {
  pthread_mutex_t lock;
  range live[THREADS * LIVE_PER_THREAD];
  size_t count;
} shadow = {PTHREAD_MUTEX_INITIALIZER, {{0, 0}}, 0};

static void shadow_add(uintptr_t lo, uintptr_t hi) {
  pthread_mutex_lock(&shadow.lock);
  for (size_t i = 0; i < shadow.count; i++) {
    if (lo < shadow.live[i].hi && shadow.live[i].lo < hi)
      report("0x%llx+%llu overlaps live 0x%llx+%llu", (unsigned long long)lo, (unsigned long long)(hi - lo),
             (unsigned long long)shadow.live[i].lo, (unsigned long long)(shadow.live[i].hi - shadow.live[i].lo));
  }
  if (shadow.count < sizeof shadow.live / sizeof shadow.live[0]) shadow.live[shadow.count++] = (range){lo, hi};
  else report("shadow model full");
  pthread_mutex_unlock(&shadow.lock);
}

/* Called before the free, so that nobody can be handed the range while it is still listed. */
static void shadow_remove(uintptr_t lo) {
  pthread_mutex_lock(&shadow.lock);
  size_t i = 0;
  while (i < shadow.count && shadow.live[i].lo != lo) i++;
  if (i == shadow.count) report("0x%llx freed but not live in the model", (unsigned long long)lo);
  else shadow.live[i] = shadow.live[--shadow.count];
  pthread_mutex_unlock(&shadow.lock);
}

/* ---- Workers ------------------------------------------------------------------------- */

static unsigned next_random(unsigned *state) {
  unsigned x = *state;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *state = x;
}

typedef struct worker {
  vmm_arena *arena;
  int id;
  int scoped;       /* second phase: mostly transients of few sizes, so the pool is used */
  unsigned seed;
  unsigned allocs, frees;
} worker;

static volatile unsigned long ops_done; /* all workers, for the scope thread's pace */
static volatile int workers_running;
static pthread_barrier_t start_line;    /* workers (and the scope thread) start together */

static size_t random_size(worker *w) {
  unsigned r = next_random(&w->seed);
  if (!w->scoped) return 1 + r % (16 * MiB); /* any size up to 16 MiB */
  /* 1..4 granules, minus up to a granule, so exact reuse finds matches */
  size_t granules = 1 + r % 4;
  return granules * GRAIN - (next_random(&w->seed) % GRAIN);
}

static void *work(void *arg) {
  worker *w = arg;
  void *live[LIVE_PER_THREAD];
  size_t n = 0;
  CUstream own = TU_STREAM(w->id);
  pthread_barrier_wait(&start_line);
  for (int op = 0; op < OPS_PER_THREAD; op++) {
    unsigned r = next_random(&w->seed);
    if (n < LIVE_PER_THREAD && (n == 0 || r % 100 < 55)) {
      vmm_kind kind = w->scoped ? (r >> 8) % 5 ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE
                                : (r >> 8) & 1 ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE;
      size_t bytes = random_size(w);
      void *p = NULL;
      vmm_status st = vmm_arena_alloc(w->arena, bytes, kind, own, &p);
      if (st != VMM_OK || !p) {
        report("thread %d: alloc %zu: %s: %s", w->id, bytes, vmm_status_name(st), vmm_arena_last_error(w->arena));
        continue;
      }
      uintptr_t lo = (uintptr_t)p;
      if (lo % GRAIN) report("thread %d: 0x%llx not granule aligned", w->id, (unsigned long long)lo);
      if (!fake_access_granted((CUdeviceptr)lo, 0))
        report("thread %d: 0x%llx handed out but not mapped with access", w->id, (unsigned long long)lo);
      shadow_add(lo, lo + (bytes + GRAIN - 1) / GRAIN * GRAIN);
      live[n++] = p;
      w->allocs++;
    } else {
      size_t i = (r >> 8) % n;
      void *p = live[i];
      live[i] = live[--n];
      /* Mostly the own stream; sometimes another thread's, which must be synchronized or ordered. */
      CUstream s = (r >> 16) % 4 ? own : TU_STREAM((w->id + 1) % THREADS);
      shadow_remove((uintptr_t)p);
      vmm_status st = vmm_arena_free(w->arena, p, s);
      if (st != VMM_OK)
        report("thread %d: free %p: %s: %s", w->id, p, vmm_status_name(st), vmm_arena_last_error(w->arena));
      w->frees++;
    }
    __atomic_fetch_add(&ops_done, 1, __ATOMIC_RELAXED);
  }
  while (n) {
    void *p = live[--n];
    shadow_remove((uintptr_t)p);
    vmm_status st = vmm_arena_free(w->arena, p, own);
    if (st != VMM_OK) report("thread %d: final free %p: %s", w->id, p, vmm_status_name(st));
    w->frees++;
  }
  __atomic_fetch_sub(&workers_running, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Runs the workers (and, if given, the scope thread) to completion. */
static void run_workers(vmm_arena *a, int scoped, void *(*scope_thread)(void *), void *scope_arg, unsigned *allocs) {
  pthread_t t[THREADS], scope;
  worker w[THREADS];
  ops_done = 0;
  workers_running = THREADS;
  assert_int_equal(pthread_barrier_init(&start_line, NULL, THREADS + (scope_thread != NULL)), 0);
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.arena = a, .id = i, .scoped = scoped, .seed = 0x9E3779B9u * (unsigned)(i + 1) + (unsigned)scoped};
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  if (scope_thread) assert_int_equal(pthread_create(&scope, NULL, scope_thread, scope_arg), 0);
  *allocs = 0;
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(w[i].allocs, w[i].frees);
    *allocs += w[i].allocs;
  }
  if (scope_thread) assert_int_equal(pthread_join(scope, NULL), 0);
  assert_int_equal(pthread_barrier_destroy(&start_line), 0);
  assert_int_equal(shadow.count, 0);
}

static void threads_outside_scopes(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  unsigned allocs;
  run_workers(a, 0, NULL, NULL, &allocs);
  assert_no_failures();
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.allocs, allocs);
  assert_int_equal(s.frees, allocs);
  assert_int_equal(s.kind[VMM_KIND_PACKAGE].live_count + s.kind[VMM_KIND_TRANSIENT].live_count, 0);
  assert_int_equal(s.physical_bytes, 0);
  printf("outside scopes: %u threads, %u allocations and frees, peak %llu MiB mapped\n", THREADS, allocs,
         (unsigned long long)(s.mapped_peak_bytes / MiB));
  tu_destroy(a);
}

/* ---- Scope cycles beside the workers ------------------------------------------------- */

typedef struct scope_cycler {
  vmm_arena *arena;
  unsigned cycles;
} scope_cycler;

static void wait_for_ops(unsigned long ops) {
  unsigned long target = __atomic_load_n(&ops_done, __ATOMIC_RELAXED) + ops;
  while (__atomic_load_n(&ops_done, __ATOMIC_RELAXED) < target && __atomic_load_n(&workers_running, __ATOMIC_ACQUIRE))
    sched_yield();
}

/* Begin, let the workers run inside the scope, finish, let them run outside it. A second
 * begin or finish is the documented scope-state error; any other failure is a bug. The
 * workers start once the first scope is open. */
static void *cycle_scopes(void *arg) {
  scope_cycler *c = arg;
  do {
    vmm_status st = vmm_retention_begin(c->arena);
    if (st != VMM_OK) report("begin: %s: %s", vmm_status_name(st), vmm_arena_last_error(c->arena));
    st = vmm_retention_begin(c->arena);
    if (st != VMM_ERR_SCOPE_STATE) report("second begin returned %s", vmm_status_name(st));
    if (c->cycles == 0) pthread_barrier_wait(&start_line);
    wait_for_ops(200);
    st = vmm_retention_finish(c->arena);
    if (st != VMM_OK) report("finish: %s: %s", vmm_status_name(st), vmm_arena_last_error(c->arena));
    st = vmm_retention_finish(c->arena);
    if (st != VMM_ERR_SCOPE_STATE) report("second finish returned %s", vmm_status_name(st));
    c->cycles++;
    wait_for_ops(50);
  } while (__atomic_load_n(&workers_running, __ATOMIC_ACQUIRE));
  return NULL;
}

static void threads_with_scope_cycles(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  scope_cycler c = {a, 0};
  unsigned allocs;
  run_workers(a, 1, cycle_scopes, &c, &allocs);
  assert_no_failures();
  tu_check(a);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.scope_state, VMM_SCOPE_NONE);
  assert_true(c.cycles > 0);
  assert_int_equal(s.scopes_begun, c.cycles);
  assert_int_equal(s.scopes_finished, c.cycles);
  assert_true(s.pool_hits > 0); /* the scopes really reused pooled mappings */
  assert_int_equal(s.allocs, allocs);
  assert_int_equal(s.frees, allocs);
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    assert_int_equal(s.kind[k].live_count, 0);
    assert_int_equal(s.kind[k].pooled_count, 0);
    assert_int_equal(s.kind[k].idle_count, 0);
  }
  assert_int_equal(s.physical_bytes, 0);
  printf("with scopes: %u threads, %u allocations and frees, %u scope cycles, %llu pool hits, %llu misses\n", THREADS,
         allocs, c.cycles, (unsigned long long)s.pool_hits, (unsigned long long)s.pool_misses);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(threads_outside_scopes),
      cmocka_unit_test(threads_with_scope_cycles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
