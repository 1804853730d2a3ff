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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "harness.h"
#include "internal.h"

#define MAX_LIVE 64
#define MAX_FREED 32
#define MAX_TAG_DEPTH 8
#define STREAMS 4 /* index 0 is the legacy stream (NULL) */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint8_t next_byte(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

typedef struct live_alloc {
  CUdeviceptr base;
  size_t extent;
  vmm_kind kind;
} live_alloc;

typedef struct model {
  vmm_arena *a;
  size_t granularity;
  live_alloc live[MAX_LIVE];
  size_t nlive;
  CUdeviceptr freed[MAX_FREED]; /* ring of bases freed earlier */
  size_t nfreed;
  int scope;
  int capturing[STREAMS];
  int oom_armed, hard_armed; /* fault codes armed at some point */
  vmm_status fatal;
  char fatal_msg[768];
  int tag_depth;
  size_t op_index;
} model;

static void violation(const model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void violation(const model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_ops: op %zu: ", m->op_index);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (m->a) fprintf(stderr, "\n  last error: %s", vmm_arena_last_error(m->a));
  fputc('\n', stderr);
  abort();
}

static CUstream stream_of(int index) { return index ? (CUstream)(uintptr_t)(0x5000 + index) : NULL; }

static int any_capturing(const model *m) {
  for (int s = 1; s < STREAMS; s++)
    if (m->capturing[s]) return 1;
  return 0;
}

static int fault_fired(void) { return fake_faults_fired() > 0; }

/* A call that touches the driver returned OK, or what a fault that fired can explain;
 * allocations may always meet out of memory. */
static void expect_action(model *m, vmm_status st, int is_alloc, const char *what) {
  if (st == VMM_OK) return;
  if (st == VMM_ERR_OUT_OF_MEMORY && (is_alloc || (fault_fired() && m->oom_armed))) return;
  if (st == VMM_ERR_DRIVER && fault_fired() && m->hard_armed) return;
  violation(m, "%s returned %s (faults fired %u, OOM armed %d, hard armed %d)", what, vmm_status_name(st),
            fake_faults_fired(), m->oom_armed, m->hard_armed);
}

static void expect_status(model *m, vmm_status st, vmm_status want, const char *what) {
  if (st != want) violation(m, "%s returned %s, expected %s", what, vmm_status_name(st), vmm_status_name(want));
  if (st != VMM_OK && !vmm_arena_last_error(m->a)[0]) violation(m, "%s failed without a message", what);
}

/* ---- JSON validity ------------------------------------------------------------------- */

typedef struct json {
  const char *p, *end;
  int depth;
} json;

static int json_value(json *j);

static void json_ws(json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static int json_lit(json *j, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n)) return -1;
  j->p += n;
  return 0;
}

/* A string: escapes well formed, no raw control bytes, valid UTF-8 (no surrogates, no
 * overlong forms), as the snapshot writer promises. */
static int json_string(json *j) {
  if (j->p >= j->end || *j->p != '"') return -1;
  j->p++;
  while (j->p < j->end) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      return 0;
    }
    if (c < 0x20) return -1;
    if (c == '\\') {
      if (++j->p >= j->end) return -1;
      char e = *j->p++;
      if (e == 'u') {
        for (int i = 0; i < 4; i++, j->p++)
          if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p) || !*j->p) return -1;
      } else if (!strchr("\"\\/bfnrt", e) || !e) {
        return -1;
      }
      continue;
    }
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || j->end - j->p < n) return -1;
    unsigned cp = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
    for (int i = 1; i < n; i++) {
      unsigned char k = (unsigned char)j->p[i];
      if ((k & 0xc0) != 0x80) return -1;
      cp = cp << 6 | (k & 0x3fu);
    }
    static const unsigned min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
    j->p += n;
  }
  return -1;
}

static int json_number(json *j) {
  const char *start = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  int digits = 0;
  while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' || *j->p == 'E' ||
                           *j->p == '+' || *j->p == '-')) {
    digits += *j->p >= '0' && *j->p <= '9';
    j->p++;
  }
  return digits && j->p > start ? 0 : -1;
}

static int json_container(json *j, char close) {
  j->p++;
  if (++j->depth > 64) return -1;
  json_ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    j->depth--;
    return 0;
  }
  for (;;) {
    json_ws(j);
    if (close == '}') {
      if (json_string(j)) return -1;
      json_ws(j);
      if (j->p >= j->end || *j->p++ != ':') return -1;
      json_ws(j);
    }
    if (json_value(j)) return -1;
    json_ws(j);
    if (j->p >= j->end) return -1;
    char c = *j->p++;
    if (c == close) break;
    if (c != ',') return -1;
  }
  j->depth--;
  return 0;
}

static int json_value(json *j) {
  json_ws(j);
  if (j->p >= j->end) return -1;
  switch (*j->p) {
  case '{': return json_container(j, '}');
  case '[': return json_container(j, ']');
  case '"': return json_string(j);
  case 't': return json_lit(j, "true");
  case 'f': return json_lit(j, "false");
  case 'n': return json_lit(j, "null");
  default: return json_number(j);
  }
}

static int json_valid(const char *text, size_t len) {
  json j = {text, text + len, 0};
  if (json_value(&j)) return 0;
  json_ws(&j);
  return j.p == j.end;
}

/* ---- The model ----------------------------------------------------------------------- */

/* The arena's record of a base, or NULL. The harness is single-threaded, so reading the
 * table without the lock is safe. */
static vmm_mapping *record_at(const model *m, CUdeviceptr base) { return vmm_table_find(&m->a->table, base); }

static void add_live(model *m, CUdeviceptr base, size_t bytes, vmm_kind kind) {
  vmm_mapping *rec = record_at(m, base);
  if (!rec || rec->state != VMM_MAP_LIVE || rec->kind != kind)
    violation(m, "alloc returned 0x%llx, which the arena does not hold as a live %s allocation",
              (unsigned long long)base, kind == VMM_KIND_PACKAGE ? "package" : "transient");
  if (rec->extent < bytes || rec->extent % m->granularity || base % m->granularity)
    violation(m, "alloc of %zu bytes returned 0x%llx with extent %zu (granularity %zu)", bytes,
              (unsigned long long)base, rec->extent, m->granularity);
  /* No other record (live, pooled, deferred, abandoned) and no stuck piece may overlap it. */
  const vmm_mapping *o;
  vmm_table_foreach(&m->a->table, slot, o) {
    if (o != rec && base < o->base + o->extent && o->base < base + rec->extent)
      violation(m, "alloc returned 0x%llx+%zu, overlapping the %s record 0x%llx+%zu", (unsigned long long)base,
                rec->extent, o->state == VMM_MAP_LIVE ? "live" : "idle", (unsigned long long)o->base, o->extent);
  }
  for (size_t i = 0; i < m->a->ranges.stuck_count; i++) {
    const vmm_reservation *k = &m->a->ranges.stuck[i];
    if (base < k->base + k->size && k->base < base + rec->extent)
      violation(m, "alloc returned 0x%llx+%zu, overlapping the still-mapped 0x%llx+%zu", (unsigned long long)base,
                rec->extent, (unsigned long long)k->base, k->size);
  }
  /* Mapped whole, handle after handle, with access. */
  size_t off = 0, size;
  while (off < rec->extent && (size = fake_mapped_size_at(base + off)) != 0) {
    if (!fake_access_granted(base + off, vmm_arena_device(m->a))) break;
    off += size;
  }
  if (off != rec->extent)
    violation(m, "alloc returned 0x%llx+%zu, of which the driver has mapped %zu bytes with access",
              (unsigned long long)base, rec->extent, off);
  m->live[m->nlive++] = (live_alloc){base, rec->extent, kind};
}

/* After a free: a successful one ends the allocation; a failed one may have ended it too
 * (a release that fails after the unmap), which the arena's table tells. */
static void after_free(model *m, size_t index, vmm_status st) {
  CUdeviceptr base = m->live[index].base;
  vmm_mapping *rec = record_at(m, base);
  int still_live = rec && rec->state == VMM_MAP_LIVE;
  if (st == VMM_OK && still_live) violation(m, "free(0x%llx) returned OK but the allocation is live", (unsigned long long)base);
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
  if (vmm_arena_snapshot(m->a, &s) != VMM_OK) violation(m, "snapshot failed");
  uint64_t count[VMM_KIND_COUNT] = {0}, bytes[VMM_KIND_COUNT] = {0};
  for (size_t i = 0; i < m->nlive; i++) count[m->live[i].kind]++, bytes[m->live[i].kind] += m->live[i].extent;
  for (const vmm_mapping *d = m->a->deferred_head; d; d = d->pool_next) count[d->kind]++, bytes[d->kind] += d->extent;
  for (int k = 0; k < VMM_KIND_COUNT; k++)
    if (s.kind[k].live_count != count[k] || s.kind[k].live_bytes != bytes[k])
      violation(m, "kind %d: snapshot says %llu live (%llu bytes), the model %llu (%llu bytes)", k,
                (unsigned long long)s.kind[k].live_count, (unsigned long long)s.kind[k].live_bytes,
                (unsigned long long)count[k], (unsigned long long)bytes[k]);
  if ((s.scope_state == VMM_SCOPE_ACTIVE) != m->scope)
    violation(m, "scope is %s, the model says %s", s.scope_state == VMM_SCOPE_ACTIVE ? "active" : "none",
              m->scope ? "active" : "none");
}

static void after_op(model *m) {
  char why[256] = "";
  if (vmm_arena_check(m->a, why, sizeof why)) violation(m, "vmm_arena_check: %s", why);
  const char *msg = NULL;
  vmm_status fatal = vmm_arena_fatal_error(m->a, &msg);
  if (m->fatal != VMM_OK) {
    if (fatal != m->fatal || strcmp(msg, m->fatal_msg)) violation(m, "the first fatal error changed to: %s", msg);
  } else if (fatal != VMM_OK) {
    if (!m->hard_armed) violation(m, "fatal error %s with no hard fault armed: %s", vmm_status_name(fatal), msg);
    if (fatal != VMM_ERR_DRIVER || !msg[0]) violation(m, "fatal error %s without a message", vmm_status_name(fatal));
    m->fatal = fatal;
    snprintf(m->fatal_msg, sizeof m->fatal_msg, "%s", msg);
  }
}

/* ---- Operations ---------------------------------------------------------------------- */

static size_t pick_size(const model *m, reader *r) {
  uint8_t s = next_byte(r), t = next_byte(r);
  size_t g = m->granularity;
  if (s < 128) return (size_t)s * (g / 8) + t + 1; /* up to 16 granules, ragged */
  if (s < 192) return (size_t)(s - 127) * g;        /* whole granules */
  return (size_t)(s - 191) * 16 * g;                /* large: up to 1024 granules */
}

static void op_alloc(model *m, reader *r) {
  size_t bytes = pick_size(m, r);
  uint8_t f = next_byte(r);
  vmm_kind kind = (f & 1) ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE;
  CUstream s = stream_of((f >> 1) % STREAMS);
  if (m->nlive == MAX_LIVE) return;
  void *p = (void *)1;
  vmm_snapshot before, after;
  if (vmm_arena_snapshot(m->a, &before) != VMM_OK) violation(m, "snapshot failed");
  vmm_status st = vmm_arena_alloc(m->a, bytes, kind, s, &p);
  expect_action(m, st, 1, "alloc");
  if (st != VMM_OK) {
    if (p) violation(m, "alloc failed with %s but set *out", vmm_status_name(st));
    return;
  }
  add_live(m, (CUdeviceptr)(uintptr_t)p, bytes, kind);
  /* Never padded: more than the rounded size only from a pooled mapping (a hit the policy
   * allows, or the fallback) or a padded assembly after a refusal, and never for a package. */
  size_t rounded = (bytes + m->granularity - 1) / m->granularity * m->granularity;
  size_t extent = m->live[m->nlive - 1].extent;
  if (extent == rounded) return;
  if (vmm_arena_snapshot(m->a, &after) != VMM_OK) violation(m, "snapshot failed");
  int hit = after.pool_hits > before.pool_hits && before.reuse != VMM_REUSE_EXACT;
  int fallback = after.pool_fallbacks > before.pool_fallbacks || after.padded_assemblies > before.padded_assemblies;
  if (kind == VMM_KIND_PACKAGE || !(hit || fallback))
    violation(m, "%s alloc of %zu bytes (rounded %zu) got %zu bytes with no hit or fallback",
              kind == VMM_KIND_PACKAGE ? "package" : "transient", bytes, rounded, extent);
}

static void op_alloc_bad(model *m, reader *r) {
  void *p = (void *)1;
  switch (next_byte(r) % 5) {
  case 0: expect_status(m, vmm_arena_alloc(m->a, 0, VMM_KIND_PACKAGE, NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(0)"); break;
  case 1: expect_status(m, vmm_arena_alloc(m->a, SIZE_MAX, VMM_KIND_TRANSIENT, NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(SIZE_MAX)"); break;
  case 2:
    expect_status(m, vmm_arena_alloc(m->a, ((size_t)1 << 47) + 1, VMM_KIND_PACKAGE, NULL, &p), VMM_ERR_INVALID_ARGUMENT,
                  "alloc(128 TiB + 1)");
    break;
  case 3: expect_status(m, vmm_arena_alloc(m->a, 4096, (vmm_kind)(2 + next_byte(r)), NULL, &p), VMM_ERR_INVALID_ARGUMENT, "alloc(bad kind)"); break;
  default:
    expect_status(m, vmm_arena_alloc(m->a, 4096, VMM_KIND_PACKAGE, NULL, NULL), VMM_ERR_INVALID_ARGUMENT, "alloc(NULL out)");
    return;
  }
  if (p) violation(m, "a refused alloc set *out");
}

static void op_free_live(model *m, reader *r) {
  uint8_t i = next_byte(r), f = next_byte(r);
  if (!m->nlive) return;
  size_t index = i % m->nlive;
  vmm_status st = vmm_arena_free(m->a, (void *)(uintptr_t)m->live[index].base, stream_of(f % STREAMS));
  expect_action(m, st, 0, "free");
  after_free(m, index, st);
}

/* A pointer that is no live allocation's base: NULL, interior, freed before, or invented. */
static void op_free_bogus(model *m, reader *r) {
  uint8_t which = next_byte(r), x = next_byte(r);
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
    for (int k = 0; k < 8; k++) p = p << 8 | next_byte(r);
    if (is_live(m, p)) return;
    break;
  }
  expect_status(m, vmm_arena_free(m->a, (void *)(uintptr_t)p, stream_of(x % STREAMS)), VMM_ERR_UNKNOWN_POINTER,
                "free(bogus pointer)");
}

static void op_finish(model *m) {
  vmm_status st = vmm_retention_finish(m->a);
  if (!m->scope) {
    expect_status(m, st, VMM_ERR_SCOPE_STATE, "finish without a scope");
    return;
  }
  /* Finish waits for the streams that freed pooled memory; one that is capturing cannot be
   * waited for, so finish refuses and leaves the scope as it was. */
  if (st == VMM_ERR_SCOPE_STATE && any_capturing(m)) return;
  expect_action(m, st, 0, "finish");
  if (st == VMM_OK) m->scope = 0;
}

static void op_fault(model *m, reader *r) {
  uint8_t n = next_byte(r), c = next_byte(r);
  if (n == 0xff) {
    fake_clear_faults();
    return;
  }
  static const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_ERROR_INVALID_VALUE,
                                   CUDA_ERROR_ILLEGAL_ADDRESS};
  CUresult code = codes[c % 4];
  if (code == CUDA_ERROR_OUT_OF_MEMORY) m->oom_armed = 1;
  else m->hard_armed = 1;
  fake_fail_nth_any(1u + n % 24u, code, (c >> 2) & 1);
}

/* Snapshot into a buffer of a size the input picks (exactly that size, so an overrun is a
 * heap overflow); when it fits, it must be valid JSON of the announced length. */
static void op_snapshot_json(model *m, reader *r) {
  uint8_t c = next_byte(r);
  size_t needed = 0;
  vmm_status st = vmm_arena_snapshot_json(m->a, NULL, 0, &needed);
  if (st != VMM_ERR_INVALID_ARGUMENT || needed < 2) violation(m, "snapshot_json(NULL, 0) returned %s, needs %zu", vmm_status_name(st), needed);
  size_t cap = c == 0xff ? needed : c;
  char *buf = malloc(cap ? cap : 1);
  size_t again = 0;
  st = vmm_arena_snapshot_json(m->a, cap ? buf : NULL, cap, &again);
  if (again != needed) violation(m, "snapshot_json needs %zu, then %zu", needed, again);
  if (cap < needed) {
    if (st != VMM_ERR_INVALID_ARGUMENT) violation(m, "snapshot_json into %zu of %zu bytes returned %s", cap, needed, vmm_status_name(st));
    if (cap && buf[cap - 1] != '\0') violation(m, "snapshot_json into %zu bytes left no NUL", cap);
  } else {
    if (st != VMM_OK) violation(m, "snapshot_json into %zu bytes returned %s", cap, vmm_status_name(st));
    if (strlen(buf) + 1 != needed) violation(m, "snapshot_json wrote %zu bytes, announced %zu", strlen(buf) + 1, needed);
    if (!json_valid(buf, needed - 1)) violation(m, "snapshot is not valid JSON: %s", buf);
  }
  free(buf);
}

/* Tags that break naive writers: quotes, escapes, control and invalid UTF-8 bytes, '%',
 * spaces, a surrogate, and one longer than the trace format's 255 bytes. */
static void op_tag(model *m, reader *r) {
  static const char *const hostile[] = {
      "prefill", "", "a b", "%41%", "100%", "\"quoted\"", "back\\slash", "\x01\x1f\x7f", "\xff\xfe", "\xc3\x28",
      "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\n\r\t", "{\"x\":[1,2]}",
  };
  uint8_t c = next_byte(r), suffix = next_byte(r);
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

static void run_op(model *m, reader *r) {
  uint8_t op = next_byte(r);
  switch (op % 16) {
  case 0: case 1: case 2: case 3: op_alloc(m, r); break;
  case 4: op_alloc_bad(m, r); break;
  case 5: case 6: case 7: op_free_live(m, r); break;
  case 8: op_free_bogus(m, r); break;
  case 9:
    expect_status(m, vmm_retention_begin(m->a), m->scope ? VMM_ERR_SCOPE_STATE : VMM_OK, "begin");
    m->scope = 1;
    break;
  case 10: op_finish(m); break;
  case 11:
    expect_status(m, vmm_retention_abort(m->a), m->scope ? VMM_OK : VMM_ERR_SCOPE_STATE, "abort");
    m->scope = 0;
    break;
  case 12: op_fault(m, r); break;
  case 13: {
    int s = 1 + next_byte(r) % (STREAMS - 1);
    m->capturing[s] = !m->capturing[s];
    fake_set_capturing(stream_of(s), m->capturing[s]);
    break;
  }
  case 14:
    switch (next_byte(r) % 3) {
    case 0:
      /* Synchronizing the context during a capture is the caller's error (as with
       * cudaDeviceSynchronize), so quiesce waits until no stream captures. */
      if (!any_capturing(m)) expect_action(m, vmm_arena_quiesce(m->a), 0, "quiesce");
      break;
    case 1: op_snapshot_json(m, r); break;
    default: check_counters(m); break;
    }
    break;
  default: op_tag(m, r); break;
  }
  after_op(m);
}

/* Failed cuCtxPopCurrent calls: each leaves the context pushed, as the driver would. */
static size_t failed_pops(void) {
  size_t n = 0, count = fake_call_count();
  for (size_t i = 0; i < count; i++) {
    const fake_call *c = fake_call_at(i);
    n += c->entry == VMM_DRV_ctx_pop_current && c->result != CUDA_SUCCESS;
  }
  return n;
}

void fuzz_ops_run(const uint8_t *data, size_t size) {
  reader r = {data, size};
  model *m = calloc(1, sizeof *m);
  uint8_t flags = next_byte(&r), cap = next_byte(&r), limit = next_byte(&r), headroom = next_byte(&r);
  uint8_t host = next_byte(&r), reserve = next_byte(&r);
  fake_options o = {0};
  o.granularity = (flags & 0x40) ? ((size_t)64 << 10) : ((size_t)2 << 20);
  o.device_count = 2;
  o.capacity = (size_t)(1 + cap) * 4 * o.granularity;
  o.integrated = (flags >> 5) & 1;
  o.host_mem_available = (size_t)(1 + host) * 4 * o.granularity;
  fake_driver_reset(&o);
  m->granularity = o.granularity;
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  cfg.log_level = 0;
  cfg.reuse = (vmm_reuse_policy)(flags & 3);
  cfg.reuse_bound = 1.0 + (double)(reserve >> 4) / 4.0;
  cfg.retain = (vmm_retain_mode)((flags >> 2) % 3);
  cfg.package_assembly = !((flags >> 4) & 1);
  /* The arena's choice, or granules: one, two, a bound that rounds up to three, up to 64. */
  static const size_t bound_granules_x2[8] = {0, 2, 4, 5, 8, 16, 32, 128};
  cfg.handle_bound_bytes = bound_granules_x2[(headroom >> 5) & 7] * o.granularity / 2;
  cfg.limit_bytes = (size_t)limit * 2 * o.granularity;
  cfg.headroom_bytes = (size_t)(headroom & 15) * o.granularity;
  cfg.reserve_bytes = (size_t)(1 + (reserve & 15)) * 16 * o.granularity;
  cfg.peer_access_mask = (headroom & 0x10) ? 2 : 0;
  vmm_status st = vmm_arena_create(&cfg, &m->a);
  if (st != VMM_OK) violation(m, "create: %s: %s", vmm_status_name(st), vmm_create_error());
  if ((flags & 0x80) && vmm_arena_trace(m->a, "/dev/null") != VMM_OK) violation(m, "trace to /dev/null refused");
  while (r.n) {
    m->op_index++;
    run_op(m, &r);
  }
  while (m->tag_depth--) vmm_tag_pop();
  fake_clear_faults();
  for (int s = 1; s < STREAMS; s++) fake_set_capturing(stream_of(s), 0);
  after_op(m);
  size_t pops = failed_pops();
  vmm_arena_destroy(m->a);
  m->a = NULL;
  fake_ledger l;
  fake_get_ledger(&l);
  if (l.live_handles || l.live_mappings || l.reservations || l.live_events || l.errors || l.primary_retained ||
      l.ctx_pushed != pops) {
    (void)fake_ledger_clean(); /* prints what is left and the first misuse */
    violation(m, "after destroy the ledger holds more than %zu failed pops explain", pops);
  }
  free(m);
}
