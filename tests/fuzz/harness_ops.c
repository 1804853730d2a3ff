/* fuzz_ops harness: input bytes choose an arena configuration, then drive a sequence of
 * public API calls on the fake driver: allocations of random sizes, kinds and streams; bad
 * allocation arguments; frees of live, already freed, interior and invented pointers;
 * begin/finish/abort in any order; injected driver faults; streams entering and leaving
 * capture; quiesce; snapshots into buffers of any size; hostile tags.
 *
 * A model of the live allocations is checked after every call: statuses are the documented
 * ones, live ranges never overlap and are mapped whole, an allocation is never padded beyond
 * its rounded size except by a pool hit the policy allows or a fallback after a refusal (and a
 * package never), counters match, the invariant checker passes, a fatal error appears only
 * after a hard (non out-of-memory) fault and never changes, the JSON snapshot is valid JSON;
 * after destroy the fake's ledger is clean.
 *
 * Layout of the input (bytes past the end read as 0):
 *   config: 6 bytes (flags, capacity, limit, headroom, host memory, reservation size); flag
 *           bit 4 turns package assembly off, headroom bits 5-7 choose the handle bound
 *   ops:    an opcode byte, then its argument bytes (see run_op). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "harness.h"
#include "harness_rules.h"
#include "internal.h"

#define MAX_LIVE 64
#define MAX_FREED 32
#define MAX_TAG_DEPTH 8
#define STREAMS 4 /* index 0 is the legacy stream (NULL) */

typedef struct live_alloc {
  CUdeviceptr base;
  size_t extent;
  vmm_kind kind;
} live_alloc;

typedef struct model {
  fuzz_rules r;
  size_t granularity;
  live_alloc live[MAX_LIVE];
  size_t nlive;
  CUdeviceptr freed[MAX_FREED]; /* ring of bases freed earlier */
  size_t nfreed;
  int scope;
  int capturing[STREAMS];
  int tag_depth;
} model;

static CUstream stream_of(int index) { return index ? (CUstream)(uintptr_t)(0x5000 + index) : NULL; }

static int any_capturing(const model *m) {
  for (int s = 1; s < STREAMS; s++)
    if (m->capturing[s]) return 1;
  return 0;
}

/* ---- The model ----------------------------------------------------------------------- */

/* The arena's record of a base, or NULL. The harness is single-threaded, so reading the
 * table without the lock is safe. */
static vmm_mapping *record_at(const model *m, CUdeviceptr base) { return vmm_table_find(&m->r.a->table, base); }

static void add_live(model *m, CUdeviceptr base, size_t bytes, vmm_kind kind) {
  vmm_mapping *rec = record_at(m, base);
  if (!rec || rec->state != VMM_MAP_LIVE || rec->kind != kind)
    fuzz_violation(&m->r, "alloc returned 0x%llx, which the arena does not hold as a live %s allocation",
              (unsigned long long)base, kind == VMM_KIND_PACKAGE ? "package" : "transient");
  if (rec->extent < bytes || rec->extent % m->granularity || base % m->granularity)
    fuzz_violation(&m->r, "alloc of %zu bytes returned 0x%llx with extent %zu (granularity %zu)", bytes,
              (unsigned long long)base, rec->extent, m->granularity);
  /* No other record (live, pooled, deferred, abandoned) and no stuck piece may overlap it. */
  const vmm_mapping *o;
  vmm_table_foreach(&m->r.a->table, slot, o) {
    if (o != rec && base < o->base + o->extent && o->base < base + rec->extent)
      fuzz_violation(&m->r, "alloc returned 0x%llx+%zu, overlapping the %s record 0x%llx+%zu", (unsigned long long)base,
                rec->extent, o->state == VMM_MAP_LIVE ? "live" : "idle", (unsigned long long)o->base, o->extent);
  }
  for (size_t i = 0; i < m->r.a->ranges.stuck_count; i++) {
    const vmm_reservation *k = &m->r.a->ranges.stuck[i];
    if (base < k->base + k->size && k->base < base + rec->extent)
      fuzz_violation(&m->r, "alloc returned 0x%llx+%zu, overlapping the still-mapped 0x%llx+%zu", (unsigned long long)base,
                rec->extent, (unsigned long long)k->base, k->size);
  }
  /* Mapped whole, handle after handle, with access. */
  size_t off = 0, size;
  while (off < rec->extent && (size = fake_mapped_size_at(base + off)) != 0) {
    if (!fake_access_granted(base + off, vmm_arena_device(m->r.a))) break;
    off += size;
  }
  if (off != rec->extent)
    fuzz_violation(&m->r, "alloc returned 0x%llx+%zu, of which the driver has mapped %zu bytes with access",
              (unsigned long long)base, rec->extent, off);
  m->live[m->nlive++] = (live_alloc){base, rec->extent, kind};
}

/* After a free: a successful one ends the allocation; a failed one may have ended it too
 * (a release that fails after the unmap), which the arena's table tells. */
static void after_free(model *m, size_t index, vmm_status st) {
  CUdeviceptr base = m->live[index].base;
  vmm_mapping *rec = record_at(m, base);
  int still_live = rec && rec->state == VMM_MAP_LIVE;
  if (st == VMM_OK && still_live) fuzz_violation(&m->r, "free(0x%llx) returned OK but the allocation is live", (unsigned long long)base);
  if (still_live) return;
  m->live[index] = m->live[--m->nlive];
  m->freed[m->nfreed++ % MAX_FREED] = base;
}

static int is_live(const model *m, CUdeviceptr p) {
  for (size_t i = 0; i < m->nlive; i++)
    if (m->live[i].base == p) return 1;
  return 0;
}

/* Counters against the model: live = the model's allocations + frees still deferred. */
static void check_counters(model *m) {
  vmm_snapshot s;
  if (vmm_arena_snapshot(m->r.a, &s) != VMM_OK) fuzz_violation(&m->r, "snapshot failed");
  uint64_t count[VMM_KIND_COUNT] = {0}, bytes[VMM_KIND_COUNT] = {0};
  for (size_t i = 0; i < m->nlive; i++) count[m->live[i].kind]++, bytes[m->live[i].kind] += m->live[i].extent;
  for (const vmm_mapping *d = m->r.a->deferred_head; d; d = d->pool_next) count[d->kind]++, bytes[d->kind] += d->extent;
  for (int k = 0; k < VMM_KIND_COUNT; k++)
    if (s.kind[k].live_count != count[k] || s.kind[k].live_bytes != bytes[k])
      fuzz_violation(&m->r, "kind %d: snapshot says %llu live (%llu bytes), the model %llu (%llu bytes)", k,
                (unsigned long long)s.kind[k].live_count, (unsigned long long)s.kind[k].live_bytes,
                (unsigned long long)count[k], (unsigned long long)bytes[k]);
  if ((s.scope_state == VMM_SCOPE_ACTIVE) != m->scope)
    fuzz_violation(&m->r, "scope is %s, the model says %s", s.scope_state == VMM_SCOPE_ACTIVE ? "active" : "none",
              m->scope ? "active" : "none");
}

/* ---- Operations ---------------------------------------------------------------------- */

static size_t pick_size(const model *m, fuzz_reader *r) {
  uint8_t s = fuzz_byte(r), t = fuzz_byte(r);
  size_t g = m->granularity;
  if (s < 128) return (size_t)s * (g / 8) + t + 1; /* up to 16 granules, ragged */
  if (s < 192) return (size_t)(s - 127) * g;        /* whole granules */
  return (size_t)(s - 191) * 16 * g;                /* large: up to 1024 granules */
}

static void op_alloc(model *m, fuzz_reader *r) {
  size_t bytes = pick_size(m, r);
  uint8_t f = fuzz_byte(r);
  vmm_kind kind = (f & 1) ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE;
  CUstream s = stream_of((f >> 1) % STREAMS);
  if (m->nlive == MAX_LIVE) return;
  void *p = (void *)1;
  vmm_snapshot before, after;
  if (vmm_arena_snapshot(m->r.a, &before) != VMM_OK) fuzz_violation(&m->r, "snapshot failed");
  vmm_status st = vmm_arena_alloc(m->r.a, bytes, kind, s, &p);
  fuzz_expect_action(&m->r, st, 1, "alloc");
  if (st != VMM_OK) {
    if (p) fuzz_violation(&m->r, "alloc failed with %s but set *out", vmm_status_name(st));
    return;
  }
  add_live(m, (CUdeviceptr)(uintptr_t)p, bytes, kind);
  /* Never padded: more than the rounded size only from a pooled mapping (a hit the policy
   * allows, or the fallback) or a padded assembly after a refusal, and never for a package. */
  size_t rounded = (bytes + m->granularity - 1) / m->granularity * m->granularity;
  size_t extent = m->live[m->nlive - 1].extent;
  if (extent == rounded) return;
  if (vmm_arena_snapshot(m->r.a, &after) != VMM_OK) fuzz_violation(&m->r, "snapshot failed");
  int hit = after.pool_hits > before.pool_hits && before.reuse != VMM_REUSE_EXACT;
  int fallback = after.pool_fallbacks > before.pool_fallbacks || after.padded_assemblies > before.padded_assemblies;
  if (kind == VMM_KIND_PACKAGE || !(hit || fallback))
    fuzz_violation(&m->r, "%s alloc of %zu bytes (rounded %zu) got %zu bytes with no hit or fallback",
              kind == VMM_KIND_PACKAGE ? "package" : "transient", bytes, rounded, extent);
}

static void op_alloc_bad(model *m, fuzz_reader *r) {
  void *p = (void *)1;
  switch (fuzz_byte(r) % 5) {
  case 0: fuzz_expect_status(&m->r, vmm_arena_alloc(m->r.a, 0, VMM_KIND_PACKAGE, NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(0)"); break;
  case 1: fuzz_expect_status(&m->r, vmm_arena_alloc(m->r.a, SIZE_MAX, VMM_KIND_TRANSIENT, NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(SIZE_MAX)"); break;
  case 2:
    fuzz_expect_status(&m->r, vmm_arena_alloc(m->r.a, ((size_t)1 << 47) + 1, VMM_KIND_PACKAGE, NULL, &p), VMM_ERR_INVALID_ARGUMENT,
                  "alloc(128 TiB + 1)");
    break;
  case 3: fuzz_expect_status(&m->r, vmm_arena_alloc(m->r.a, 4096, (vmm_kind)(2 + fuzz_byte(r)), NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(bad kind)"); break;
  default:
    fuzz_expect_status(&m->r, vmm_arena_alloc(m->r.a, 4096, VMM_KIND_PACKAGE, NULL, NULL), VMM_ERR_INVALID_ARGUMENT, "alloc(NULL out)");
    return;
  }
  if (p) fuzz_violation(&m->r, "a refused alloc set *out");
}

static void op_free_live(model *m, fuzz_reader *r) {
  uint8_t i = fuzz_byte(r), f = fuzz_byte(r);
  if (!m->nlive) return;
  size_t index = i % m->nlive;
  vmm_status st = vmm_arena_free(m->r.a, (void *)(uintptr_t)m->live[index].base, stream_of(f % STREAMS));
  fuzz_expect_action(&m->r, st, 0, "free");
  after_free(m, index, st);
}

/* A pointer that is no live allocation's base: NULL, interior, freed before, or invented. */
static void op_free_bogus(model *m, fuzz_reader *r) {
  uint8_t which = fuzz_byte(r), x = fuzz_byte(r);
  CUdeviceptr p = 0;
  switch (which % 4) {
  case 0: break;
  case 1:
    if (!m->nlive) return;
    p = m->live[x % m->nlive].base + 1 + (CUdeviceptr)x * 4096 % m->live[x % m->nlive].extent;
    if (is_live(m, p)) return;
    break;
  case 2:
    if (!m->nfreed) return;
    p = m->freed[x % (m->nfreed < MAX_FREED ? m->nfreed : MAX_FREED)];
    if (is_live(m, p)) return; /* handed out again since */
    break;
  default:
    for (int k = 0; k < 8; k++) p = p << 8 | fuzz_byte(r);
    if (is_live(m, p)) return;
    break;
  }
  fuzz_expect_status(&m->r, vmm_arena_free(m->r.a, (void *)(uintptr_t)p, stream_of(x % STREAMS)), VMM_ERR_UNKNOWN_POINTER,
                "free(bogus pointer)");
}

static void op_finish(model *m) {
  vmm_status st = vmm_retention_finish(m->r.a);
  if (!m->scope) {
    fuzz_expect_status(&m->r, st, VMM_ERR_SCOPE_STATE, "finish without a scope");
    return;
  }
  /* Finish waits for the streams that freed pooled memory; one that is capturing cannot be
   * waited for, so finish refuses and leaves the scope as it was. */
  if (st == VMM_ERR_SCOPE_STATE && any_capturing(m)) return;
  fuzz_expect_action(&m->r, st, 0, "finish");
  if (st == VMM_OK) m->scope = 0;
}

/* Tags that break naive writers: quotes, escapes, control and invalid UTF-8 bytes, '%',
 * spaces, a surrogate, and one longer than the trace format's 255 bytes. */
static void op_tag(model *m, fuzz_reader *r) {
  static const char *const hostile[] = {
      "prefill", "", "a b", "%41%", "100%", "\"quoted\"", "back\\slash", "\x01\x1f\x7f", "\xff\xfe", "\xc3\x28",
      "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\n\r\t", "{\"x\":[1,2]}",
  };
  uint8_t c = fuzz_byte(r), suffix = fuzz_byte(r);
  if (c >= 0xf0) {
    if (m->tag_depth) vmm_tag_pop(), m->tag_depth--;
    return;
  }
  if (m->tag_depth == MAX_TAG_DEPTH) return;
  char tag[400];
  if (c == 0xe0) {
    vmm_tag_push(NULL);
  } else if (c == 0xe1) {
    memset(tag, 'L', 300);
    tag[300] = '\0';
    vmm_tag_push(tag);
  } else {
    snprintf(tag, sizeof tag, "%s%c", hostile[c % 16], suffix ? (char)suffix : 'z');
    vmm_tag_push(tag);
  }
  m->tag_depth++;
}

static void run_op(model *m, fuzz_reader *r) {
  uint8_t op = fuzz_byte(r);
  switch (op % 16) {
  case 0: case 1: case 2: case 3: op_alloc(m, r); break;
  case 4: op_alloc_bad(m, r); break;
  case 5: case 6: case 7: op_free_live(m, r); break;
  case 8: op_free_bogus(m, r); break;
  case 9:
    fuzz_expect_status(&m->r, vmm_retention_begin(m->r.a), m->scope ? VMM_ERR_SCOPE_STATE : VMM_OK, "begin");
    m->scope = 1;
    break;
  case 10: op_finish(m); break;
  case 11:
    fuzz_expect_status(&m->r, vmm_retention_abort(m->r.a), m->scope ? VMM_OK : VMM_ERR_SCOPE_STATE, "abort");
    m->scope = 0;
    break;
  case 12: {
    uint8_t n = fuzz_byte(r);
    fuzz_arm_fault(&m->r, n, fuzz_byte(r));
    break;
  }
  case 13: {
    int s = 1 + fuzz_byte(r) % (STREAMS - 1);
    m->capturing[s] = !m->capturing[s];
    fake_set_capturing(stream_of(s), m->capturing[s]);
    break;
  }
  case 14:
    switch (fuzz_byte(r) % 3) {
    case 0:
      /* Synchronizing the context during a capture is the caller's error (as with
       * cudaDeviceSynchronize), so quiesce waits until no stream captures. */
      if (!any_capturing(m)) fuzz_expect_action(&m->r, vmm_arena_quiesce(m->r.a), 0, "quiesce");
      break;
    case 1: fuzz_snapshot_json(&m->r, fuzz_byte(r)); break;
    default: check_counters(m); break;
    }
    break;
  default: op_tag(m, r); break;
  }
  fuzz_after_call(&m->r);
}

void fuzz_ops_run(const uint8_t *data, size_t size) {
  fuzz_reader r = {data, size};
  model *m = calloc(1, sizeof *m);
  m->r.harness = "fuzz_ops";
  uint8_t flags = fuzz_byte(&r), cap = fuzz_byte(&r), limit = fuzz_byte(&r), headroom = fuzz_byte(&r);
  uint8_t host = fuzz_byte(&r), reserve = fuzz_byte(&r);
  fake_options o = {0};
  o.granularity = (flags & 0x40) ? ((size_t)64 << 10) : ((size_t)2 << 20);
  o.device_count = 2;
  o.capacity = (size_t)(1 + cap) * 4 * o.granularity;
  o.integrated = (flags >> 5) & 1;
  o.host_mem_available = (size_t)(1 + host) * 4 * o.granularity;
  fake_driver_reset(&o);
  m->granularity = o.granularity;
  vmm_config cfg = fuzz_config();
  cfg.reuse = (vmm_reuse_policy)(flags & 3);
  cfg.reuse_bound = 1.0 + (double)(reserve >> 4) / 4.0;
  cfg.retain = (vmm_retain_mode)((flags >> 2) % 3);
  cfg.package_assembly = !((flags >> 4) & 1);
  cfg.handle_bound_bytes = fuzz_handle_bound(headroom >> 5, o.granularity);
  cfg.limit_bytes = (size_t)limit * 2 * o.granularity;
  cfg.headroom_bytes = (size_t)(headroom & 15) * o.granularity;
  cfg.reserve_bytes = (size_t)(1 + (reserve & 15)) * 16 * o.granularity;
  cfg.peer_access_mask = (headroom & 0x10) ? 2 : 0;
  fuzz_create(&m->r, &cfg, flags & 0x80);
  while (r.n) {
    m->r.op_index++;
    run_op(m, &r);
  }
  while (m->tag_depth--) vmm_tag_pop();
  fake_clear_faults();
  for (int s = 1; s < STREAMS; s++) fake_set_capturing(stream_of(s), 0);
  fuzz_after_call(&m->r);
  fuzz_destroy_and_check_ledger(&m->r);
  free(m);
}
