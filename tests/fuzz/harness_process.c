/* fuzz_process harness: whole-process mode (vmm_config.caching, as vmmarena.install() runs
 * it) on the fake driver. Input bytes choose the configuration (growth in place, the reuse
 * policy, retention, a refill share, the handle bound, capacity, limit, a device that lags
 * behind the host) and then drive the calls PyTorch makes through the shim: allocations of
 * any size (page slots below half a granule) on three streams, under three tags and into a
 * capture's pool; frees; record_stream; captures begun and ended; pools released (and a
 * request into a released pool); quiesce, empty_cache and the limit set at run time; scopes
 * begun, finished and aborted; pause (backup or discard) and resume of a tag; injected driver
 * faults; the device's clock.
 *
 * After every call: the status is a documented one; a new allocation overlaps no live one and
 * can be written through the fake at both ends; each live allocation's contents (a pattern
 * written at its allocation) are intact, whatever failed meanwhile (a tag that may be paused
 * is checked again once resumed; after a discard its pattern is written again); the usage
 * figures equal the model's, an allocation that takes new memory stays within the limit in
 * force, a refused allocation changes them not at all and a failed free ends the allocation
 * or leaves it whole; the invariant checker passes; the fatal-error rule
 * holds (harness_rules.h). At the end, with the faults cleared, everything is freed (t1
 * resumed first where memory allows), pools released, the scope finished; empty_cache then
 * leaves nothing held (unless a scope was aborted, or a hard fault may have left memory the
 * arena cannot give back); after destroy the ledger is clean.
 *
 * Layout of the input (bytes past the end read as 0):
 *   config: 6 bytes (flags, capacity, limit, handle bound and headroom, device lag, refill)
 *   ops:    an opcode byte, then its argument bytes (see run_op). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "harness.h"
#include "harness_rules.h"

#define LIVE_MAX 64
#define KEPT_MAX 8 /* graphs captured and not released */
#define TAG_PAUSED 1 /* the tag pause and resume act on: "t1" */

static const char *const process_tags[] = {"t0", "t1", "t2"};

typedef struct process_alloc {
  CUdeviceptr at;
  size_t bytes, held; /* requested, and what the arena counts for it */
  int stream;         /* 1..3 */
  int tag;            /* -1: none */
  uint32_t seed;
} process_alloc;

typedef struct process_model {
  fuzz_rules r;
  size_t granularity;
  process_alloc live[LIVE_MAX];
  size_t nlive;
  uint64_t allocated; /* the held bytes of the live allocations */
  size_t limit;       /* the arena's limit in force (0 = none): configured, then set at run time */
  int scope, aborted;
  vmm_pool_id capture;                 /* the pool of the capture underway on stream 1, or 0 */
  vmm_pool_id next_pool;
  vmm_pool_id ended[KEPT_MAX];     /* captured, not released */
  size_t nended;
  vmm_pool_id released;                /* a pool released, or 0 */
  int t1_maybe_paused;                 /* a pause of t1 was called and no resume has since answered for all */
  int t1_discarded;                    /* ... with VMM_PAUSE_DISCARD: the contents are gone */
} process_model;

static CUstream process_stream(int index) { return (CUstream)(uintptr_t)(0x6000 + index); }

/* ---- Contents and usage ---------------------------------------------------------------- */

static void process_pattern(const process_alloc *x, unsigned char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(x->seed * 131u + i * 7u);
}

/* 64 bytes at each end (at the start only, when they would overlap). */
static void write_ends(process_model *m, const process_alloc *x) {
  unsigned char buf[64] = {0};
  size_t n = x->bytes < 64 ? x->bytes : 64;
  process_pattern(x, buf, n);
  if (fake_write(x->at, buf, n) || (x->bytes >= 2 * n && fake_write(x->at + x->bytes - n, buf, n)))
    fuzz_violation(&m->r, "0x%llx+%zu cannot be written through the driver", (unsigned long long)x->at, x->bytes);
}

static int contents_known(const process_model *m, const process_alloc *x) {
  return !(x->tag == TAG_PAUSED && m->t1_maybe_paused);
}

static void check_ends(process_model *m, const process_alloc *x) {
  if (!contents_known(m, x)) return;
  unsigned char want[64] = {0}, got[64] = {0};
  size_t n = x->bytes < 64 ? x->bytes : 64;
  process_pattern(x, want, n);
  int bad = fake_read(x->at, got, n) || memcmp(got, want, n);
  if (!bad && x->bytes >= 2 * n) bad = fake_read(x->at + x->bytes - n, got, n) || memcmp(got, want, n);
  if (bad)
    fuzz_violation(&m->r, "the contents of 0x%llx+%zu (stream %d, tag %d) changed", (unsigned long long)x->at, x->bytes,
                   x->stream, x->tag);
}

static vmm_usage usage_now(process_model *m) {
  vmm_usage u;
  if (vmm_arena_usage(m->r.a, &u) != VMM_OK) fuzz_violation(&m->r, "usage refused");
  return u;
}

static void check_usage(process_model *m) {
  vmm_usage u = usage_now(m);
  if (u.allocations != m->nlive || u.allocated_bytes != m->allocated)
    fuzz_violation(&m->r, "usage: %llu allocations of %llu bytes, the model %zu of %llu",
                   (unsigned long long)u.allocations, (unsigned long long)u.allocated_bytes, m->nlive,
                   (unsigned long long)m->allocated);
  vmm_snapshot s;
  if (vmm_arena_snapshot(m->r.a, &s) != VMM_OK) fuzz_violation(&m->r, "snapshot refused");
  uint64_t paused = s.kind[VMM_KIND_PACKAGE].paused_bytes + s.kind[VMM_KIND_TRANSIENT].paused_bytes;
  if (paused && !m->t1_maybe_paused) fuzz_violation(&m->r, "%llu bytes paused, the model none", (unsigned long long)paused);
  if (u.reserved_bytes + paused < u.allocated_bytes) /* a paused allocation holds no memory */
    fuzz_violation(&m->r, "usage: %llu bytes reserved, fewer than the %llu allocated less %llu paused",
                   (unsigned long long)u.reserved_bytes, (unsigned long long)u.allocated_bytes, (unsigned long long)paused);
}

/* ---- Operations ------------------------------------------------------------------------ */

static size_t process_size(const process_model *m, fuzz_reader *r) {
  uint8_t s = fuzz_byte(r), t = fuzz_byte(r);
  size_t g = m->granularity;
  if (s < 96) return 1 + ((size_t)s * 257u + t) % (g / 2); /* page slots */
  if (s < 160) return (size_t)(s - 95) * (g / 16) + t + 1;  /* up to 4 granules, ragged */
  if (s < 224) return (size_t)(s - 159) * g / 2;            /* whole and half granules, up to 32 */
  return (size_t)(s - 223) * 2 * g;                         /* large: up to 64 granules (a pause
                                                               copies the whole of one) */
}

static void op_alloc(process_model *m, fuzz_reader *r) {
  size_t bytes = process_size(m, r);
  uint8_t f = fuzz_byte(r);
  if (m->nlive == LIVE_MAX) return;
  process_alloc x = {0, bytes, 0, 1 + f % 3, (int)((f >> 2) % 4) - 1, (uint32_t)m->r.op_index};
  if (x.tag == TAG_PAUSED && m->t1_maybe_paused) x.tag = 2; /* a paused tag takes no new memory here */
  vmm_kind kind = (f & 0x40) ? VMM_KIND_PACKAGE : VMM_KIND_TRANSIENT;
  vmm_pool_id pool = m->capture && x.stream == 1 ? m->capture : VMM_POOL_SHARED;
  vmm_usage before = usage_now(m);
  void *p = (void *)1;
  if (x.tag >= 0) vmm_tag_push(process_tags[x.tag]);
  vmm_status st = vmm_arena_alloc_in(m->r.a, bytes, kind, process_stream(x.stream), pool, &p);
  if (x.tag >= 0) vmm_tag_pop();
  fuzz_expect_action(&m->r, st, 1, "alloc");
  vmm_usage after = usage_now(m);
  if (st != VMM_OK) {
    if (p) fuzz_violation(&m->r, "alloc failed with %s but set *out", vmm_status_name(st));
    if (after.allocations != before.allocations || after.allocated_bytes != before.allocated_bytes)
      fuzz_violation(&m->r, "a refused alloc of %zu bytes changed the allocations", bytes);
    return;
  }
  if (m->limit && after.reserved_bytes > before.reserved_bytes && after.reserved_bytes > m->limit)
    fuzz_violation(&m->r, "alloc of %zu bytes took the arena from %llu to %llu bytes, past the limit of %zu", bytes,
                   (unsigned long long)before.reserved_bytes, (unsigned long long)after.reserved_bytes, m->limit);
  x.at = (CUdeviceptr)(uintptr_t)p;
  x.held = after.allocated_bytes - before.allocated_bytes;
  if (after.allocations != before.allocations + 1 || x.held < bytes)
    fuzz_violation(&m->r, "alloc of %zu bytes: %llu allocations after %llu, %zu bytes held", bytes,
                   (unsigned long long)after.allocations, (unsigned long long)before.allocations, x.held);
  for (size_t i = 0; i < m->nlive; i++) {
    const process_alloc *o = &m->live[i];
    if (x.at < o->at + o->held && o->at < x.at + x.held)
      fuzz_violation(&m->r, "alloc returned 0x%llx+%zu, overlapping the live 0x%llx+%zu", (unsigned long long)x.at,
                     x.held, (unsigned long long)o->at, o->held);
  }
  write_ends(m, &x);
  m->allocated += x.held;
  m->live[m->nlive++] = x;
}

static void forget(process_model *m, size_t i) {
  m->allocated -= m->live[i].held;
  m->live[i] = m->live[--m->nlive];
}

static void op_free(process_model *m, fuzz_reader *r) {
  uint8_t i = fuzz_byte(r);
  if (!m->nlive) return;
  size_t index = i % m->nlive;
  process_alloc x = m->live[index];
  check_ends(m, &x);
  vmm_usage before = usage_now(m);
  vmm_status st = vmm_arena_free(m->r.a, (void *)(uintptr_t)x.at, process_stream(x.stream));
  fuzz_expect_action(&m->r, st, 0, "free");
  vmm_usage after = usage_now(m);
  if (after.allocations == before.allocations) { /* a failed free that left it live and whole */
    if (st == VMM_OK) fuzz_violation(&m->r, "free(0x%llx) returned OK, the allocation is still counted", (unsigned long long)x.at);
    return;
  }
  if (after.allocations != before.allocations - 1 || before.allocated_bytes - after.allocated_bytes != x.held)
    fuzz_violation(&m->r, "free of 0x%llx+%zu: %llu allocations of %llu bytes after %llu of %llu", (unsigned long long)x.at,
                   x.held, (unsigned long long)after.allocations, (unsigned long long)after.allocated_bytes,
                   (unsigned long long)before.allocations, (unsigned long long)before.allocated_bytes);
  forget(m, index);
  fuzz_expect_status(&m->r, vmm_arena_free(m->r.a, (void *)(uintptr_t)x.at, process_stream(x.stream)),
                     VMM_ERR_UNKNOWN_POINTER, "a second free");
}

static int is_live(const process_model *m, CUdeviceptr p) {
  for (size_t i = 0; i < m->nlive; i++)
    if (m->live[i].at == p) return 1;
  return 0;
}

/* record_stream on a live allocation (no driver call: it cannot fail), or on a pointer that is
 * no allocation's base (refused, nothing changes). */
static void op_record_stream(process_model *m, fuzz_reader *r) {
  uint8_t i = fuzz_byte(r), s = fuzz_byte(r);
  if (!m->nlive) return;
  const process_alloc *x = &m->live[i % m->nlive];
  if (!(s & 0x80)) {
    fuzz_expect_status(&m->r, vmm_arena_record_stream(m->r.a, (void *)(uintptr_t)x->at, process_stream(1 + s % 3)),
                       VMM_OK, "record_stream");
    return;
  }
  CUdeviceptr inside = x->at + 1 + (s & 0x3f) % x->bytes;
  if (inside >= x->at + x->bytes || is_live(m, inside)) return;
  fuzz_expect_status(&m->r, vmm_arena_record_stream(m->r.a, (void *)(uintptr_t)inside, process_stream(1)),
                     VMM_ERR_UNKNOWN_POINTER, "record_stream inside an allocation");
  fuzz_expect_status(&m->r, vmm_arena_free(m->r.a, (void *)(uintptr_t)inside, process_stream(1)),
                     VMM_ERR_UNKNOWN_POINTER, "free inside an allocation");
}

/* The capture underway ends; its graph (its pool) lives on until released. */
static void end_capture(process_model *m) {
  fake_set_capturing(process_stream(1), 0);
  fuzz_expect_status(&m->r, vmm_arena_capture_end(m->r.a, m->capture), VMM_OK, "capture_end");
  int known = 0;
  for (size_t i = 0; i < m->nended; i++) known |= m->ended[i] == m->capture;
  if (!known) m->ended[m->nended++] = m->capture;
  m->capture = 0;
}

/* A capture on stream 1 begins, or the one underway ends (and its pool is released at once,
 * as PyTorch does for a graph that is not kept, or later). */
static void op_capture(process_model *m, fuzz_reader *r) {
  uint8_t f = fuzz_byte(r);
  if (!m->capture) {
    if (m->nended == KEPT_MAX) return; /* graphs kept: a pool must be released first */
    vmm_pool_id pool = f & 1 && m->nended ? m->ended[f % m->nended] : ++m->next_pool; /* or shared with a kept graph's */
    fuzz_expect_status(&m->r, vmm_arena_capture_begin(m->r.a, pool), VMM_OK, "capture_begin");
    fake_set_capturing(process_stream(1), 1);
    m->capture = pool;
    return;
  }
  end_capture(m);
}

/* Releases a kept graph's pool (it waits for the device: never during a capture), or asks
 * for memory in one released before (refused, nothing allocated). */
static void op_pool(process_model *m, fuzz_reader *r) {
  uint8_t f = fuzz_byte(r);
  if (f & 1) {
    if (!m->released) return;
    void *p = (void *)1;
    fuzz_expect_status(&m->r, vmm_arena_alloc_in(m->r.a, 4096, VMM_KIND_TRANSIENT, process_stream(1), m->released, &p),
                       VMM_ERR_INVALID_ARGUMENT, "alloc into a released pool");
    if (p) fuzz_violation(&m->r, "a refused alloc set *out");
    return;
  }
  if (m->capture || !m->nended) return;
  size_t i = (f >> 1) % m->nended;
  vmm_status st = vmm_arena_release_pool(m->r.a, m->ended[i]);
  fuzz_expect_action(&m->r, st, 0, "release_pool");
  if (st != VMM_OK) return; /* the pool stays as it was */
  m->released = m->ended[i];
  m->ended[i] = m->ended[--m->nended];
}

static void op_scope(process_model *m, fuzz_reader *r) {
  switch (fuzz_byte(r) % 3) {
  case 0:
    fuzz_expect_status(&m->r, vmm_retention_begin(m->r.a), m->scope ? VMM_ERR_SCOPE_STATE : VMM_OK, "begin");
    m->scope = 1;
    break;
  case 1: {
    vmm_status st = vmm_retention_finish(m->r.a);
    if (!m->scope) {
      fuzz_expect_status(&m->r, st, VMM_ERR_SCOPE_STATE, "finish without a scope");
      break;
    }
    if (st == VMM_ERR_SCOPE_STATE && m->capture) break; /* a capturing stream's frees cannot be waited for */
    fuzz_expect_action(&m->r, st, 0, "finish");
    if (st == VMM_OK) m->scope = 0;
    break;
  }
  default:
    fuzz_expect_status(&m->r, vmm_retention_abort(m->r.a), m->scope ? VMM_OK : VMM_ERR_SCOPE_STATE, "abort");
    m->aborted |= m->scope;
    m->scope = 0;
    break;
  }
}

/* Writes t1's patterns again once its contents were discarded. */
static void t1_resumed(process_model *m) {
  m->t1_maybe_paused = 0;
  if (m->t1_discarded)
    for (size_t i = 0; i < m->nlive; i++)
      if (m->live[i].tag == TAG_PAUSED) write_ends(m, &m->live[i]);
  m->t1_discarded = 0;
}

/* Pause (backup or discard) or resume of t1; neither during a capture (PyTorch's graphs keep
 * their streams for themselves). A failure leaves some paused and some not: t1 is then checked
 * again only once a resume has answered for all of it. */
static void op_pause(process_model *m, fuzz_reader *r) {
  uint8_t f = fuzz_byte(r);
  if (m->capture) return;
  if (f & 1) {
    vmm_status st = vmm_arena_resume(m->r.a, process_tags[TAG_PAUSED]);
    if (st == VMM_ERR_INVALID_ARGUMENT) st = VMM_OK; /* nothing of it paused */
    fuzz_expect_action(&m->r, st, 1, "resume");
    if (st == VMM_OK) t1_resumed(m);
    return;
  }
  vmm_pause_mode mode = f & 2 ? VMM_PAUSE_DISCARD : VMM_PAUSE_BACKUP;
  for (size_t i = 0; i < m->nlive; i++) check_ends(m, &m->live[i]);
  vmm_status st = vmm_arena_pause(m->r.a, process_tags[TAG_PAUSED], mode);
  if (st == VMM_ERR_INVALID_ARGUMENT) return; /* no live allocation of t1: nothing changed */
  fuzz_expect_action(&m->r, st, 0, "pause");
  m->t1_maybe_paused = 1;
  m->t1_discarded |= mode == VMM_PAUSE_DISCARD;
}

static void op_device(process_model *m, fuzz_reader *r) {
  uint8_t f = fuzz_byte(r);
  switch (f % 5) {
  case 0: /* the context cannot be synchronized during a capture */
    if (!m->capture) fuzz_expect_action(&m->r, vmm_arena_quiesce(m->r.a), 0, "quiesce");
    break;
  case 1: {
    vmm_status st = vmm_arena_empty_cache(m->r.a);
    if (!(st == VMM_ERR_SCOPE_STATE && m->capture)) fuzz_expect_action(&m->r, st, 0, "empty_cache");
    break;
  }
  case 2: fake_advance_clock(1 + (f >> 3)); break;
  case 3: fuzz_snapshot_json(&m->r, fuzz_byte(r)); break;
  default:
    if (f & 0x80) { /* a limit set at run time (PyTorch's memory fraction); 0 lifts it */
      m->limit = (size_t)((f >> 3) & 15) * 2 * m->granularity;
      fuzz_expect_status(&m->r, vmm_arena_set_limit(m->r.a, m->limit), VMM_OK, "set_limit");
    } else {
      fuzz_expect_status(&m->r, vmm_arena_reset_peaks(m->r.a), VMM_OK, "reset_peaks");
    }
    break;
  }
}

static void run_op(process_model *m, fuzz_reader *r) {
  uint8_t op = fuzz_byte(r);
  switch (op % 16) {
  case 0: case 1: case 2: case 3: case 4: op_alloc(m, r); break;
  case 5: case 6: case 7: op_free(m, r); break;
  case 8: op_record_stream(m, r); break;
  case 9: op_capture(m, r); break;
  case 10: op_pool(m, r); break;
  case 11: op_scope(m, r); break;
  case 12: {
    uint8_t n = fuzz_byte(r);
    fuzz_arm_fault(&m->r, n, fuzz_byte(r));
    break;
  }
  case 13: op_pause(m, r); break;
  default: op_device(m, r); break;
  }
  fuzz_after_call(&m->r);
  check_usage(m);
  if (m->r.op_index % 4 == 0)
    for (size_t i = 0; i < m->nlive; i++) check_ends(m, &m->live[i]);
}

/* ---- The run ----------------------------------------------------------------------------- */

/* Frees every live allocation, or only those that are not of a tag that may be paused. */
static void free_all(process_model *m, int even_paused) {
  for (size_t i = m->nlive; i-- > 0;) {
    process_alloc x = m->live[i];
    if (!even_paused && !contents_known(m, &x)) continue;
    check_ends(m, &x);
    fuzz_expect_status(&m->r, vmm_arena_free(m->r.a, (void *)(uintptr_t)x.at, process_stream(x.stream)), VMM_OK,
                       "free, faults cleared");
    forget(m, i);
  }
}

/* With the faults cleared: the capture ended, the rest freed, the pools released, the scope
 * finished and the cache emptied; then t1 resumed (new memory may still be refused: an
 * aborted scope's memory stays held) and checked, freed, and the cache emptied again. */
static void tear_down(process_model *m) {
  fake_clear_faults();
  if (m->capture) end_capture(m);
  free_all(m, 0);
  while (m->nended)
    fuzz_expect_status(&m->r, vmm_arena_release_pool(m->r.a, m->ended[--m->nended]), VMM_OK, "release_pool, faults cleared");
  if (m->scope) fuzz_expect_status(&m->r, vmm_retention_finish(m->r.a), VMM_OK, "finish, faults cleared");
  m->scope = 0;
  fuzz_expect_status(&m->r, vmm_arena_empty_cache(m->r.a), VMM_OK, "empty_cache, faults cleared");
  if (m->t1_maybe_paused) {
    vmm_status st = vmm_arena_resume(m->r.a, process_tags[TAG_PAUSED]);
    if (st == VMM_OK || st == VMM_ERR_INVALID_ARGUMENT) t1_resumed(m);
    else fuzz_expect_status(&m->r, st, VMM_ERR_OUT_OF_MEMORY, "resume, faults cleared");
  }
  free_all(m, 1);
  fuzz_expect_status(&m->r, vmm_arena_empty_cache(m->r.a), VMM_OK, "empty_cache, faults cleared");
  fuzz_after_call(&m->r);
  check_usage(m);
  vmm_usage u = usage_now(m);
  if (u.reserved_bytes && !m->aborted && !m->r.hard_armed)
    fuzz_violation(&m->r, "everything freed and the cache emptied, %llu bytes are still held",
                   (unsigned long long)u.reserved_bytes);
}

void fuzz_process_run(const uint8_t *data, size_t size) {
  fuzz_reader r = {data, size};
  process_model *m = calloc(1, sizeof *m);
  m->r.harness = "fuzz_process";
  uint8_t flags = fuzz_byte(&r), cap = fuzz_byte(&r), limit = fuzz_byte(&r), bound = fuzz_byte(&r);
  uint8_t lag = fuzz_byte(&r), refill = fuzz_byte(&r);
  fake_options o = {0};
  o.granularity = (flags & 0x40) ? ((size_t)64 << 10) : ((size_t)2 << 20);
  o.capacity = (size_t)(1 + cap) * 2 * o.granularity;
  fake_driver_reset(&o);
  fake_set_event_lag(lag % 8);
  m->granularity = o.granularity;
  vmm_config cfg = fuzz_config();
  cfg.caching = 1;
  cfg.unmap_in_background = 0; /* one order of calls, so that an input replays the same */
  cfg.pause_staging = 0;       /* backups copied by the calling thread (no copy threads) */
  cfg.grow_in_place = flags & 1;
  cfg.retain = (vmm_retain_mode)((flags >> 1) % 3);
  cfg.reuse = (flags & 8) ? VMM_REUSE_BOUNDED : VMM_REUSE_EXACT;
  cfg.reuse_bound = 1.25;
  if (flags & 0x10) cfg.refill_live_share = 1.0 + (double)(refill % 8) / 8.0;
  else if (flags & 0x20) cfg.refill_share = (double)(1 + refill % 10) / 10.0;
  cfg.handle_bound_bytes = fuzz_handle_bound(bound, o.granularity);
  cfg.headroom_bytes = (size_t)((bound >> 3) & 3) * o.granularity;
  cfg.limit_bytes = (size_t)limit * 2 * o.granularity;
  m->limit = cfg.limit_bytes;
  cfg.reserve_bytes = (size_t)(1 + (lag >> 4)) * 64 * o.granularity;
  fuzz_create(&m->r, &cfg, flags & 0x80);
  while (r.n) {
    m->r.op_index++;
    run_op(m, &r);
  }
  tear_down(m);
  fuzz_destroy_and_check_ledger(&m->r);
  free(m);
}
