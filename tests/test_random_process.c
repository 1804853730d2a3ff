/* Seeded random operations in whole-process mode against a shadow model of the live
 * allocations: whole mappings and slots of pages, of both kinds, three tags, three streams,
 * graph pools with captures and replays, record_stream, pause and resume of a tag, quiesce,
 * empty_cache and pool releases, with kernels declared on the allocations (on their stream, or
 * on another one the program orders after it and then records) and the device kept behind by
 * a random lag that the host's steps advance. After every operation: the fake's device
 * timeline saw no violation (no memory handed out, unmapped or released before the work that
 * used it is ordered or known complete), no two live allocations overlap, each one's contents
 * (a pattern written at its allocation, through the fake driver) are intact, the usage figures
 * equal the model's, and every few steps the invariant checker passes. At the end everything
 * is freed, empty_cache leaves nothing held, and the ledger is clean.
 * VMMARENA_RANDOM_PROCESS_OPS overrides the step count, VMMARENA_SEED the seed. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define MAX_LIVE 256
#define STEPS 10000
#define DEFAULT_SEED 17ull /* takes every path in every configuration below */

typedef struct live {
  CUdeviceptr at;
  size_t bytes, held; /* requested, and what the arena counts for it */
  CUstream stream;
  int tag;            /* -1: none */
  uint32_t seed;
  uint64_t owner;     /* on the fake's timeline */
  vmm_pool_id pool;   /* a capture's, or VMM_POOL_SHARED */
} live;

#define MAX_GRAPHS 8

/* A captured graph whose pool is not released: it may be replayed. */
typedef struct graph {
  uint64_t id;        /* the fake's */
  vmm_pool_id pool;
} graph;

typedef struct model {
  vmm_arena *a;
  uint64_t rng;
  live l[MAX_LIVE];
  int n;
  uint64_t allocated;
  bool paused;        /* tag "t1" is paused */
  vmm_pool_id capture; /* 0: none underway */
  vmm_pool_id next_pool;
  graph graphs[MAX_GRAPHS];
  int n_graphs;
  size_t step;
  size_t kernels, replays; /* declared so far */
} model;

static const char *const tags[] = {"t0", "t1", "t2"};

static uint32_t next(model *m) {
  m->rng ^= m->rng << 13, m->rng ^= m->rng >> 7, m->rng ^= m->rng << 17;
  return (uint32_t)(m->rng >> 16);
}

static CUstream stream_of(uint32_t r) { return TU_STREAM(1 + r % 3); }

/* The allocation's pattern: 64 bytes at each end (at the start only when they would overlap). */
static void pattern(const live *x, unsigned char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(x->seed * 131u + i * 7u);
}

static void write_ends(const live *x) {
  unsigned char buf[64];
  size_t n = x->bytes < 64 ? x->bytes : 64;
  pattern(x, buf, n);
  assert_int_equal(fake_write(x->at, buf, n), 0);
  if (x->bytes >= 2 * n) assert_int_equal(fake_write(x->at + x->bytes - n, buf, n), 0);
}

static void check_ends(const live *x) {
  unsigned char want[64], got[64];
  size_t n = x->bytes < 64 ? x->bytes : 64;
  pattern(x, want, n);
  assert_int_equal(fake_read(x->at, got, n), 0);
  assert_memory_equal(got, want, n);
  if (x->bytes < 2 * n) return;
  assert_int_equal(fake_read(x->at + x->bytes - n, got, n), 0);
  assert_memory_equal(got, want, n);
}

/* A new allocation overlaps no live one (so no two ever do). */
static void check_apart(const model *m, const live *x) {
  for (int i = 0; i < m->n; i++)
    if (x->at < m->l[i].at + m->l[i].bytes && m->l[i].at < x->at + x->bytes)
      fail_msg("step %zu: 0x%llx+%zu overlaps the live 0x%llx+%zu", m->step, (unsigned long long)x->at, x->bytes,
               (unsigned long long)m->l[i].at, m->l[i].bytes);
}

static bool capturing(const model *m, CUstream s) { return m->capture && s == TU_STREAM(1); }

/* A kernel of x's owner on `s`. While s captures it joins the graph, and only for memory of the
 * capture's pool (whole mappings and slots): a graph of this program uses no memory it does not
 * own, which may be freed while the graph lives. Memory of the capture's pool stays the pool's
 * while the graph lives, however it is freed (paused too), so the graph replays into it. */
static void kernel(model *m, const live *x, CUstream s) {
  if (capturing(m, s) && x->pool != m->capture) return;
  assert_int_equal(fake_kernel(s, x->at, x->bytes, x->owner), 0);
  m->kernels++;
}

static void check_model(model *m) {
  if (fake_violations(FAKE_VIOLATION_KINDS))
    fail_msg("step %zu: the device timeline: %s", m->step, fake_violation_text(0));
  if (m->step % 16 == 0)
    for (int i = 0; i < m->n; i++)
      if (!(m->paused && m->l[i].tag == 1)) check_ends(&m->l[i]);
  vmm_usage u;
  assert_int_equal(vmm_arena_usage(m->a, &u), VMM_OK);
  assert_int_equal(u.allocations, (uint64_t)m->n);
  assert_int_equal(u.allocated_bytes, m->allocated);
  if (m->step % 64 == 0) tu_check(m->a);
}

static size_t size_of(model *m) {
  uint32_t r = next(m);
  switch (r % 4) {
  case 0: return 1 + r % 4096;             /* small slots */
  case 1: return 4096 + r % (1u << 20);    /* large slots */
  case 2: return (1u << 20) + r % (6u << 20); /* whole mappings */
  default: return 1 + r % (256u << 10);
  }
}

static void op_alloc(model *m) {
  if (m->n == MAX_LIVE) return;
  uint32_t r = next(m);
  live x = {0, size_of(m), 0, stream_of(r), (int)(r % 4) - 1, next(m)};
  if (x.tag == 1 && m->paused) x.tag = 2; /* a paused tag takes no new memory in this model */
  vmm_pool_id pool = m->capture && x.stream == TU_STREAM(1) ? m->capture : VMM_POOL_SHARED;
  if (x.tag >= 0) vmm_tag_push(tags[x.tag]);
  void *p = NULL;
  vmm_usage before;
  assert_int_equal(vmm_arena_usage(m->a, &before), VMM_OK);
  vmm_status st = vmm_arena_alloc_in(m->a, x.bytes, r & 16 ? VMM_KIND_PACKAGE : VMM_KIND_TRANSIENT, x.stream, pool, &p);
  if (x.tag >= 0) vmm_tag_pop();
  if (st != VMM_OK) fail_msg("step %zu: alloc %zu: %s", m->step, x.bytes, vmm_arena_last_error(m->a));
  vmm_usage after;
  assert_int_equal(vmm_arena_usage(m->a, &after), VMM_OK);
  x.at = (CUdeviceptr)(uintptr_t)p;
  x.pool = pool;
  x.held = after.allocated_bytes - before.allocated_bytes;
  assert_true(x.held >= x.bytes);
  check_apart(m, &x);
  write_ends(&x);
  x.owner = fake_owner_new();
  kernel(m, &x, x.stream); /* its first use */
  m->allocated += x.held;
  m->l[m->n++] = x;
}

/* A kernel on a live allocation: on its stream, or on another that the program orders after
 * it (wait_stream) and then records (record_stream). Paused memory is not used; across streams
 * only where neither captures. */
static void op_use(model *m) {
  if (!m->n) return;
  live *x = &m->l[next(m) % (uint32_t)m->n];
  if (m->paused && x->tag == 1) return;
  CUstream s = stream_of(next(m));
  if (s == x->stream) {
    kernel(m, x, s);
    return;
  }
  if (capturing(m, s) || capturing(m, x->stream) || x->pool != VMM_POOL_SHARED) return; /* a graph's: on its stream */
  fake_program_wait(s, x->stream);
  kernel(m, x, s);
  assert_int_equal(vmm_arena_record_stream(m->a, (void *)(uintptr_t)x->at, s), VMM_OK);
}

/* The device: a random lag, a step of its clock, or a replay of a live graph, on the stream
 * its memory is used on eagerly (so the program orders the replay after those uses). */
static void op_device(model *m) {
  uint32_t r = next(m) % 8;
  if (r < 2) fake_set_event_lag(next(m) % 24);
  else if (r < 6) fake_advance_clock(1 + next(m) % 8);
  else if (m->n_graphs && !m->capture && !m->paused) { /* a paused tag may hold a graph's memory */
    graph *g = &m->graphs[next(m) % (uint32_t)m->n_graphs];
    fake_graph_launch(g->id, TU_STREAM(1));
    m->replays++;
  }
}

/* A graph's pool released: it is never replayed again. */
static void release_graph(model *m, int i) {
  assert_int_equal(vmm_arena_release_pool(m->a, m->graphs[i].pool), VMM_OK);
  m->graphs[i] = m->graphs[--m->n_graphs];
}

static void op_free(model *m) {
  if (!m->n) return;
  int i = (int)(next(m) % (uint32_t)m->n);
  live x = m->l[i];
  if (!(m->paused && x.tag == 1)) check_ends(&x), kernel(m, &x, x.stream); /* its last use */
  if (next(m) % 8 == 0) assert_int_equal(vmm_arena_record_stream(m->a, (void *)(uintptr_t)x.at, stream_of(next(m))), VMM_OK);
  assert_int_equal(vmm_arena_free(m->a, (void *)(uintptr_t)x.at, x.stream), VMM_OK);
  assert_int_equal(vmm_arena_free(m->a, (void *)(uintptr_t)x.at, x.stream), VMM_ERR_UNKNOWN_POINTER);
  m->allocated -= x.held;
  m->l[i] = m->l[--m->n];
}

static void op_control(model *m) {
  uint32_t r = next(m) % 6;
  if (r == 0 && !m->capture && vmm_arena_quiesce(m->a) != VMM_OK) /* the device cannot sync during a capture */
    fail_msg("step %zu: quiesce: %s", m->step, vmm_arena_last_error(m->a));
  if (r == 1) { /* during a capture, memory freed on the capturing stream cannot be waited for */
    vmm_status st = vmm_arena_empty_cache(m->a);
    if (st != VMM_OK && !(m->capture && st == VMM_ERR_SCOPE_STATE))
      fail_msg("step %zu: empty_cache: %s", m->step, vmm_arena_last_error(m->a));
  }
  if (r == 2 && !m->capture) {
    m->capture = ++m->next_pool;
    assert_int_equal(vmm_arena_capture_begin(m->a, m->capture), VMM_OK);
    fake_set_capturing(TU_STREAM(1), 1);
  } else if (r == 2) {
    fake_set_capturing(TU_STREAM(1), 0);
    assert_int_equal(vmm_arena_capture_end(m->a, m->capture), VMM_OK);
    if (m->n_graphs == MAX_GRAPHS) release_graph(m, 0);
    m->graphs[m->n_graphs++] = (graph){fake_graph_last(), m->capture};
    if (next(m) % 2) release_graph(m, m->n_graphs - 1);
    m->capture = 0;
  }
  if (r == 5 && m->n_graphs && !m->capture) release_graph(m, (int)(next(m) % (uint32_t)m->n_graphs));
  if (r == 3 && !m->capture) { /* pause and resume need no capture on their streams */
    vmm_status st = m->paused ? vmm_arena_resume(m->a, "t1") : vmm_arena_pause(m->a, "t1", VMM_PAUSE_BACKUP);
    assert_true(st == VMM_OK || st == VMM_ERR_INVALID_ARGUMENT); /* nothing of t1 left to pause or resume */
    m->paused = st == VMM_OK && !m->paused;
  }
}

/* The model's run; with a refill share (VMMARENA_REFILL=below-peak:F) misses below the
 * high-water mark get new memory in place of several cached handles; with `background` the
 * arena's thread unmaps retired ranges (the calls' order then varies from run to run); with
 * `grow` (the default configuration) pooled mappings grow in place, in ranges spread apart;
 * with `by_event` (VMMARENA_STREAM_ORDER=event) a request on another stream is ordered after an
 * incomplete free by an event instead of waiting for the free to be known complete. */
static void run_model(double refill, int background, int grow, int by_event) {
  fake_driver_reset(NULL);
  vmm_config c = tu_config();
  c.caching = 1;
  c.retain = VMM_RETAIN_AUTO;
  c.refill_share = refill;
  c.unmap_in_background = background;
  c.grow_in_place = grow;
  c.order_by_event = by_event;
  const char *seed = getenv("VMMARENA_SEED");
  model m = {.a = tu_arena(NULL, &c), .rng = seed ? strtoull(seed, NULL, 0) : DEFAULT_SEED};
  const char *env = getenv("VMMARENA_RANDOM_PROCESS_OPS");
  size_t steps = env ? strtoul(env, NULL, 10) : STEPS;
  if (!m.rng) fail_msg("VMMARENA_SEED=%s: the generator needs a non-zero seed", seed);
  printf("whole-process model: %zu steps, VMMARENA_SEED=%llu\n", steps, (unsigned long long)m.rng);
  for (m.step = 0; m.step < steps; m.step++) {
    uint32_t r = next(&m) % 24;
    if (r < 7) op_alloc(&m);
    else if (r < 14) op_free(&m);
    else if (r < 18) op_use(&m);
    else if (r < 22) op_device(&m);
    else op_control(&m);
    check_model(&m);
  }
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(m.a, &s), VMM_OK);
  printf("whole-process model (refill share %.1f, growth %s, stream order %s): %llu prefix hits, %llu ranges served again (%llu of "
         "them runs), %llu ranges retired, %llu refills, %llu grown in place, %llu stream waits; the timeline judged %zu kernels "
         "(%zu graph replays) on 3 streams, no violation\n",
         refill, grow ? "on" : "off", by_event ? "event" : "completed", (unsigned long long)s.prefix_hits, (unsigned long long)s.revived_ranges,
         (unsigned long long)s.revived_runs, (unsigned long long)s.ranges_handed_to_retiring,
         (unsigned long long)s.refills, (unsigned long long)s.grown_in_place,
         (unsigned long long)s.driver[VMM_DRV_stream_wait_event].calls, m.kernels, m.replays);
  /* the default run takes every path (another seed may miss a rare one: they are its figures) */
  if (steps >= STEPS && !seed) assert_true(s.prefix_hits > 0 && s.revived_ranges > 0 && s.revived_runs > 0);
  if (steps >= STEPS) assert_true(grow ? s.grown_in_place > 0 : s.grown_in_place == 0);
  if (steps >= STEPS) assert_true(refill > 0.0 ? s.refills > 0 : s.refills == 0);
  if (steps >= STEPS) assert_true(background ? s.unmapped_in_background > 0 : s.unmapped_in_background == 0);
  if (steps >= STEPS && by_event) assert_true(s.driver[VMM_DRV_stream_wait_event].calls > 0); /* the path ran */
  if (m.capture) {
    fake_set_capturing(TU_STREAM(1), 0);
    assert_int_equal(vmm_arena_capture_end(m.a, m.capture), VMM_OK);
  }
  if (m.paused) {
    vmm_status st = vmm_arena_resume(m.a, "t1");
    assert_true(st == VMM_OK || st == VMM_ERR_INVALID_ARGUMENT); /* every paused one was freed */
  }
  m.paused = false;
  while (m.n) op_free(&m);
  for (vmm_pool_id pool = 1; pool <= m.next_pool; pool++) /* a live graph's memory outlasts empty_cache */
    assert_int_equal(vmm_arena_release_pool(m.a, pool), VMM_OK);
  check_model(&m);
  assert_int_equal(vmm_arena_empty_cache(m.a), VMM_OK);
  vmm_usage u;
  assert_int_equal(vmm_arena_usage(m.a, &u), VMM_OK);
  assert_int_equal(u.reserved_bytes, 0);
  assert_int_equal(u.allocated_bytes, 0);
  tu_destroy(m.a);
}

static void random_operations(void **state) {
  (void)state;
  run_model(0.0, 0, 1, 0);
}

static void random_operations_packed_and_never_grown(void **state) {
  (void)state;
  run_model(0.0, 0, 0, 0);
}

static void random_operations_with_refill(void **state) {
  (void)state;
  run_model(0.9, 0, 1, 0);
}

static void random_operations_unmapping_in_the_background(void **state) {
  (void)state;
  run_model(0.0, 1, 1, 0);
}

static void random_operations_ordered_by_event(void **state) {
  (void)state;
  run_model(0.0, 0, 1, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(random_operations),
                                     cmocka_unit_test(random_operations_ordered_by_event),
                                     cmocka_unit_test(random_operations_packed_and_never_grown),
                                     cmocka_unit_test(random_operations_with_refill),
                                     cmocka_unit_test(random_operations_unmapping_in_the_background)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
