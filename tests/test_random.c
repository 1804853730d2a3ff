/* Seeded random operations against a shadow model of the arena.
 *
 * Operations: allocations of both kinds (sizes from a small set and random ones) on a few
 * streams, frees of random live pointers, bad frees and bad allocations, begin, finish,
 * abort, quiesce, and now and then a fault injected at one driver entry point (out of
 * memory or a generic error, once or persistently). Each arena gets a random reuse policy,
 * stitching on or off, retention on or off and a physical limit, so out-of-memory fallback
 * and stitching happen often; it is destroyed and replaced from time to time, and every
 * destroy must leave the fake driver's ledger empty.
 *
 * The model predicts the result of every step in which no fault fired (and no free was left
 * waiting for a capture to end, which the next call would process): the status, the
 * pointer a pool hit or fallback returns, and the snapshot counters (per kind live, pooled,
 * retained and abandoned counts and bytes; physical and mapped bytes; pool hits, misses,
 * fallbacks and stitches; scope state). After a step a fault disturbed, the model checks
 * what must still hold (allowed statuses, the fatal-error rules) and then adopts the
 * arena's state (internal.h) so that it can predict again. After every step: no two mapped
 * ranges overlap, vmm_arena_check passes, and the driver's view (handle and mapped bytes,
 * no misuse) equals the arena's.
 *
 * VMMARENA_RANDOM_OPS sets the number of operations (default 1,000,000); VMMARENA_SEED the
 * seed (printed at the start). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define DEFAULT_OPS 1000000ull
#define DEFAULT_SEED 0x5eed2026ull
#define LIVE_TARGET 200         /* no allocation while this many mappings are live */
#define ARENA_OPS 100000        /* an arena is replaced after this many operations */
#define MAX_ALLOC ((size_t)1 << 47)  /* the largest request the arena takes (128 TiB) */

/* ---- Random numbers (splitmix64) ----------------------------------------------------- */

static uint64_t rng;

static uint64_t rnd(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t below(uint64_t n) { return rnd() % n; }
static int per_mille(unsigned p) { return below(1000) < p; }

/* ---- Failure context ----------------------------------------------------------------- */

static uint64_t seed, step_no;
static char step_what[160];

#define EXPECT(cond)                                                                                  \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      fprintf(stderr, "step %llu (VMMARENA_SEED=%llu): %s: expected %s\n", (unsigned long long)step_no, \
              (unsigned long long)seed, step_what, #cond);                                            \
      fail();                                                                                         \
    }                                                                                                 \
  } while (0)

#define EXPECT_EQ(x, y)                                                                                   \
  do {                                                                                                    \
    unsigned long long x_ = (unsigned long long)(x), y_ = (unsigned long long)(y);                        \
    if (x_ != y_) {                                                                                       \
      fprintf(stderr, "step %llu (VMMARENA_SEED=%llu): %s: %s = %llu, expected %s = %llu\n",              \
              (unsigned long long)step_no, (unsigned long long)seed, step_what, #x, x_, #y, y_);          \
      fail();                                                                                             \
    }                                                                                                     \
  } while (0)

/* ---- The model ----------------------------------------------------------------------- */

typedef enum { M_LIVE, M_POOLED, M_ABANDONED, M_DEFERRED } mstate;

typedef struct mrec {
  CUdeviceptr base;
  size_t extent;
  uint32_t pieces;
  vmm_kind kind;
  mstate state;
  uint64_t scope;     /* scope it was allocated in, 0 = none */
  struct mrec *next;  /* next older mapping of its bucket while pooled */
  size_t live_slot;   /* index in model.live while live */
} mrec;

typedef struct mbucket {
  size_t size;
  mrec *head; /* newest first */
} mbucket;

typedef struct model {
  mrec **mapped; /* every mapped record, sorted by base */
  size_t mapped_n, mapped_cap;
  mrec **live;
  size_t live_n, live_cap;
  mbucket *buckets; /* sorted by size, none empty */
  size_t bucket_n, bucket_cap;
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical, mapped_bytes;
  uint64_t hits, misses, fallbacks, stitches, limit_refusals, allocs, frees;
  int scope_active;
  uint64_t scope_id, next_scope_id, begun, finished, aborted;
  uint64_t *aborted_ids; /* ascending */
  size_t aborted_n, aborted_cap;
  /* the arena's configuration */
  vmm_reuse_policy policy;
  double bound;
  int stitch, retention;
  size_t limit;
} model;

static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return p;
  size_t c = *cap ? *cap : 64;
  while (c < need) c *= 2;
  void *q = realloc(p, c * elem);
  if (!q) {
    fprintf(stderr, "test_random: out of host memory\n");
    abort();
  }
  *cap = c;
  return q;
}

static size_t round_up(size_t bytes) { return (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB); }

/* Position of the first mapped record whose base is >= base. */
static size_t mapped_lower(const model *m, CUdeviceptr base) {
  size_t lo = 0, hi = m->mapped_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (m->mapped[mid]->base < base) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static mrec *mapped_find(const model *m, CUdeviceptr base) {
  size_t i = mapped_lower(m, base);
  return i < m->mapped_n && m->mapped[i]->base == base ? m->mapped[i] : NULL;
}

/* Inserts r in address order; its range must not overlap its neighbours'. */
static void mapped_insert(model *m, mrec *r) {
  EXPECT(r->base != 0 && r->base % (2 * MiB) == 0);
  size_t i = mapped_lower(m, r->base);
  EXPECT(i == 0 || m->mapped[i - 1]->base + m->mapped[i - 1]->extent <= r->base);
  EXPECT(i == m->mapped_n || r->base + r->extent <= m->mapped[i]->base);
  m->mapped = grow(m->mapped, &m->mapped_cap, m->mapped_n + 1, sizeof *m->mapped);
  memmove(&m->mapped[i + 1], &m->mapped[i], (m->mapped_n - i) * sizeof *m->mapped);
  m->mapped[i] = r;
  m->mapped_n++;
}

static void mapped_remove(model *m, mrec *r) {
  size_t i = mapped_lower(m, r->base);
  EXPECT(i < m->mapped_n && m->mapped[i] == r);
  memmove(&m->mapped[i], &m->mapped[i + 1], (m->mapped_n - i - 1) * sizeof *m->mapped);
  m->mapped_n--;
}

static void live_add(model *m, mrec *r) {
  m->live = grow(m->live, &m->live_cap, m->live_n + 1, sizeof *m->live);
  r->live_slot = m->live_n;
  m->live[m->live_n++] = r;
}

static void live_remove(model *m, mrec *r) {
  mrec *last = m->live[--m->live_n];
  m->live[r->live_slot] = last;
  last->live_slot = r->live_slot;
}

/* Per-mapping counters of the state a record is in. */
static void stat(model *m, const mrec *r, int sign) {
  vmm_kind_stats *k = &m->kind[r->kind];
  uint64_t *count = &k->live_count, *bytes = &k->live_bytes;
  if (r->state == M_POOLED) count = &k->pooled_count, bytes = &k->pooled_bytes;
  if (r->state == M_ABANDONED) count = &k->abandoned_count, bytes = &k->abandoned_bytes;
  *count += (uint64_t)(int64_t)sign;
  *bytes += (uint64_t)((int64_t)sign * (int64_t)r->extent);
}

/* Index of the first bucket whose size is >= size. */
static size_t bucket_lower(const model *m, size_t size) {
  size_t lo = 0, hi = m->bucket_n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (m->buckets[mid].size < size) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void pool_push(model *m, mrec *r) {
  size_t i = bucket_lower(m, r->extent);
  if (i == m->bucket_n || m->buckets[i].size != r->extent) {
    m->buckets = grow(m->buckets, &m->bucket_cap, m->bucket_n + 1, sizeof *m->buckets);
    memmove(&m->buckets[i + 1], &m->buckets[i], (m->bucket_n - i) * sizeof *m->buckets);
    m->buckets[i] = (mbucket){r->extent, NULL};
    m->bucket_n++;
  }
  r->next = m->buckets[i].head;
  m->buckets[i].head = r;
  r->state = M_POOLED;
  stat(m, r, +1);
}

/* Removes the newest mapping of bucket i. */
static size_t bucket_count(const model *m, size_t i) {
  size_t n = 0;
  for (const mrec *x = m->buckets[i].head; x; x = x->next) n++;
  return n;
}

static mrec *pool_pop(model *m, size_t i) {
  mrec *r = m->buckets[i].head;
  m->buckets[i].head = r->next;
  r->next = NULL;
  if (!m->buckets[i].head) {
    memmove(&m->buckets[i], &m->buckets[i + 1], (m->bucket_n - i - 1) * sizeof *m->buckets);
    m->bucket_n--;
  }
  stat(m, r, -1);
  return r;
}

static uint64_t pool_count(const model *m) { return m->kind[VMM_KIND_TRANSIENT].pooled_count; }

static int scope_aborted(const model *m, uint64_t id) {
  for (size_t lo = 0, hi = m->aborted_n; lo < hi;) {
    size_t mid = (lo + hi) / 2;
    if (m->aborted_ids[mid] == id) return 1;
    if (m->aborted_ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return 0;
}

static void make_live(model *m, mrec *r) {
  r->state = M_LIVE;
  r->scope = m->scope_active ? m->scope_id : 0;
  stat(m, r, +1);
  live_add(m, r);
}

static void model_clear_records(model *m) {
  for (size_t i = 0; i < m->mapped_n; i++) free(m->mapped[i]);
  m->mapped_n = m->live_n = m->bucket_n = 0;
}

static void model_free(model *m) {
  model_clear_records(m);
  free(m->mapped);
  free(m->live);
  free(m->buckets);
  free(m->aborted_ids);
  memset(m, 0, sizeof *m);
}

/* ---- Adopting the arena's state after a disturbed step -------------------------------- */

static mstate state_of(vmm_mapping_state s) {
  switch (s) {
  case VMM_MAP_LIVE: return M_LIVE;
  case VMM_MAP_POOLED: return M_POOLED;
  case VMM_MAP_DEFERRED: return M_DEFERRED;
  case VMM_MAP_ABANDONED: return M_ABANDONED;
  case VMM_MAP_FREEING: break;
  }
  EXPECT(!"no mapping is mid-free between calls");
  return M_LIVE;
}

static void adopt_buckets(model *m, const vmm_avl *n) {
  if (!n) return;
  adopt_buckets(m, n->left);
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  m->buckets = grow(m->buckets, &m->bucket_cap, m->bucket_n + 1, sizeof *m->buckets);
  mbucket *mb = &m->buckets[m->bucket_n++];
  *mb = (mbucket){b->size, NULL};
  mrec **tail = &mb->head;
  for (const vmm_mapping *x = b->head; x; x = x->pool_next) {
    mrec *r = mapped_find(m, x->base);
    EXPECT(r && r->state == M_POOLED && r->extent == b->size);
    *tail = r;
    tail = &r->next;
  }
  adopt_buckets(m, n->right);
}

static void adopt(model *m, vmm_arena *a, const vmm_snapshot *s) {
  model_clear_records(m);
  vmm_mapping *x;
  vmm_table_foreach(&a->table, i, x) {
    mrec *r = calloc(1, sizeof *r);
    EXPECT(r != NULL);
    *r = (mrec){x->base, x->extent, x->piece_count, x->kind, state_of(x->state), x->scope_id, NULL, 0};
    mapped_insert(m, r);
    if (r->state == M_LIVE) live_add(m, r);
  }
  adopt_buckets(m, a->pool.root);
  memcpy(m->kind, s->kind, sizeof m->kind);
  m->physical = s->physical_bytes;
  m->mapped_bytes = s->mapped_bytes;
  m->hits = s->pool_hits;
  m->misses = s->pool_misses;
  m->fallbacks = s->pool_fallbacks;
  m->stitches = s->stitches;
  m->limit_refusals = s->limit_refusals;
  m->allocs = s->allocs;
  m->frees = s->frees;
  m->scope_active = s->scope_state == VMM_SCOPE_ACTIVE;
  m->finished = s->scopes_finished; /* a disturbed finish may have completed */
  EXPECT_EQ(a->next_scope_id, m->next_scope_id); /* only begin moves it, and begin makes no driver call */
}

static int has_deferred(const model *m) {
  for (size_t i = 0; i < m->mapped_n; i++)
    if (m->mapped[i]->state == M_DEFERRED) return 1;
  return 0;
}

/* ---- Checks after every step --------------------------------------------------------- */

static void check_common(vmm_arena *a, const model *m, const vmm_snapshot *s) {
  char why[256] = "";
  if (vmm_arena_check(a, why, sizeof why)) {
    fprintf(stderr, "vmm_arena_check: %s\n", why);
    EXPECT(!"vmm_arena_check passes");
  }
  fake_ledger l;
  fake_get_ledger(&l);
  if (l.errors) fprintf(stderr, "fake driver misuse: %s\n", fake_first_error());
  EXPECT_EQ(l.errors, 0);
  EXPECT_EQ(l.live_handle_bytes, s->physical_bytes);
  EXPECT_EQ(l.mapped_bytes, s->mapped_bytes);
  for (size_t i = 1; i < m->mapped_n; i++)
    EXPECT(m->mapped[i - 1]->base + m->mapped[i - 1]->extent <= m->mapped[i]->base);
}

static void check_predicted(const model *m, const vmm_snapshot *s) {
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    const vmm_kind_stats *want = &m->kind[k], *got = &s->kind[k];
    EXPECT_EQ(got->live_count, want->live_count);
    EXPECT_EQ(got->live_bytes, want->live_bytes);
    EXPECT_EQ(got->pooled_count, want->pooled_count);
    EXPECT_EQ(got->pooled_bytes, want->pooled_bytes);
    EXPECT_EQ(got->retained_count, want->retained_count);
    EXPECT_EQ(got->retained_bytes, want->retained_bytes);
    EXPECT_EQ(got->abandoned_count, want->abandoned_count);
    EXPECT_EQ(got->abandoned_bytes, want->abandoned_bytes);
  }
  EXPECT_EQ(s->retained_reusable_handles, pool_count(m));
  EXPECT_EQ(s->retained_reusable_bytes, m->kind[VMM_KIND_TRANSIENT].pooled_bytes);
  EXPECT_EQ(s->pool_buckets, m->bucket_n);
  EXPECT_EQ(s->physical_bytes, m->physical);
  EXPECT_EQ(s->mapped_bytes, m->mapped_bytes);
  EXPECT_EQ(s->pool_hits, m->hits);
  EXPECT_EQ(s->pool_misses, m->misses);
  EXPECT_EQ(s->pool_fallbacks, m->fallbacks);
  EXPECT_EQ(s->stitches, m->stitches);
  EXPECT_EQ(s->limit_refusals, m->limit_refusals);
  EXPECT_EQ(s->allocs, m->allocs);
  EXPECT_EQ(s->frees, m->frees);
  EXPECT_EQ(s->scope_state, m->scope_active ? VMM_SCOPE_ACTIVE : VMM_SCOPE_NONE);
  EXPECT_EQ(s->scopes_begun, m->begun);
  EXPECT_EQ(s->scopes_finished, m->finished);
  EXPECT_EQ(s->scopes_aborted, m->aborted);
}

/* ---- Operations and their predictions ------------------------------------------------- */

typedef struct run {
  vmm_arena *a;
  model m;
  int deferred_at_start; /* frees waiting for a capture end: the next call processes them */
  unsigned fired_before; /* fake_faults_fired() at the start of the step */
  /* totals for the summary */
  uint64_t arenas, disturbed_steps, faults, ooms, bad_calls, hits, fallbacks, stitches, finishes, aborts;
} run;

static size_t driver_calls(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l.calls;
}

/* Whether the step cannot be predicted: a fault fired in it, or it began with deferred frees. */
static int disturbed(const run *r) { return r->deferred_at_start || fake_faults_fired() != r->fired_before; }

static CUstream random_stream(void) {
  static const CUstream streams[] = {NULL, TU_STREAM(1), TU_STREAM(2), TU_STREAM(3)};
  return streams[below(4)];
}

static size_t random_size(void) {
  static const size_t common[] = {1, 2 * MiB, 2 * MiB + 1, 4 * MiB, 6 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB};
  if (per_mille(700)) return common[below(sizeof common / sizeof common[0])];
  return 1 + below(96 * MiB);
}

static int pooling(const model *m, vmm_kind kind) {
  return m->scope_active && m->retention && kind == VMM_KIND_TRANSIENT && m->policy != VMM_REUSE_NONE;
}

static vmm_status op_alloc(run *r, size_t bytes, vmm_kind kind) {
  model *m = &r->m;
  CUstream stream = random_stream();
  snprintf(step_what, sizeof step_what, "alloc %zu %s", bytes, kind == VMM_KIND_PACKAGE ? "package" : "transient");
  void *p = (void *)1;
  vmm_status st = vmm_arena_alloc(r->a, bytes, kind, stream, &p);
  CUdeviceptr got = (CUdeviceptr)(uintptr_t)p;
  r->ooms += st == VMM_ERR_OUT_OF_MEMORY;
  if (disturbed(r)) {
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
    EXPECT((st == VMM_OK) == (p != NULL));
    if (st == VMM_OK) EXPECT(fake_mapped_size_at(got) > 0);
    return st;
  }
  size_t rounded = round_up(bytes);
  int pool = pooling(m, kind);
  if (pool) {
    size_t hi = rounded;
    if (m->policy == VMM_REUSE_BEST_FIT) hi = SIZE_MAX;
    if (m->policy == VMM_REUSE_BOUNDED) hi = (size_t)((double)rounded * m->bound);
    size_t i = bucket_lower(m, rounded);
    if (i < m->bucket_n && m->buckets[i].size <= hi) {
      EXPECT_EQ(st, VMM_OK);
      EXPECT_EQ(got, m->buckets[i].head->base);
      make_live(m, pool_pop(m, i));
      m->hits++;
      m->allocs++;
      return st;
    }
    m->misses++;
  }
  if (!m->limit || m->physical + rounded <= m->limit) {
    EXPECT_EQ(st, VMM_OK);
    mrec *x = calloc(1, sizeof *x);
    EXPECT(x != NULL);
    *x = (mrec){got, rounded, 1, kind, M_LIVE, 0, NULL, 0};
    mapped_insert(m, x);
    EXPECT_EQ(fake_mapped_size_at(got), rounded);
    make_live(m, x);
    m->physical += rounded;
    m->mapped_bytes += rounded;
    m->allocs++;
    return st;
  }
  m->limit_refusals++;
  if (pool) {
    size_t i = bucket_lower(m, rounded); /* any pooled mapping that fits */
    if (i < m->bucket_n) {
      EXPECT_EQ(st, VMM_OK);
      EXPECT_EQ(got, m->buckets[i].head->base);
      make_live(m, pool_pop(m, i));
      m->fallbacks++;
      m->allocs++;
      return st;
    }
    /* The arena's tightest cover: the smallest bucket that covers what is left ends the
     * choice, else the largest smaller bucket gives one mapping (newest first) and the rest
     * is looked for again. taken[b] counts the mappings chosen from bucket b. */
    size_t sum = 0, n = 0;
    size_t *taken = calloc(m->bucket_n ? m->bucket_n : 1, sizeof *taken);
    size_t pooled = 1;
    for (size_t b = 0; b < m->bucket_n; b++) pooled += bucket_count(m, b);
    size_t *chosen = calloc(pooled, sizeof *chosen);
    EXPECT(taken != NULL && chosen != NULL);
    while (sum < rounded) {
      size_t left = rounded - sum, pick = SIZE_MAX;
      for (size_t b = bucket_lower(m, left); b < m->bucket_n && pick == SIZE_MAX; b++)
        if (bucket_count(m, b) > taken[b]) pick = b;
      for (size_t b = bucket_lower(m, left); b-- > 0 && pick == SIZE_MAX;)
        if (bucket_count(m, b) > taken[b]) pick = b;
      if (pick == SIZE_MAX) break;
      taken[pick]++;
      chosen[n++] = m->buckets[pick].size;
      sum += m->buckets[pick].size;
    }
    free(taken);
    if (m->stitch && sum >= rounded && n >= 2) {
      EXPECT_EQ(st, VMM_OK);
      mrec *s = calloc(1, sizeof *s);
      EXPECT(s != NULL);
      *s = (mrec){got, sum, 0, VMM_KIND_TRANSIENT, M_LIVE, 0, NULL, 0};
      for (size_t k = 0; k < n; k++) { /* each chosen mapping is at the head of its bucket */
        mrec *x = pool_pop(m, bucket_lower(m, chosen[k]));
        s->pieces += x->pieces;
        mapped_remove(m, x);
        free(x);
      }
      free(chosen);
      mapped_insert(m, s);
      make_live(m, s);
      m->stitches++;
      m->allocs++;
      return st;
    }
    free(chosen);
  }
  EXPECT_EQ(st, VMM_ERR_OUT_OF_MEMORY);
  EXPECT(p == NULL);
  return st;
}

static vmm_status op_free(run *r) {
  model *m = &r->m;
  mrec *x = m->live[below(m->live_n)];
  CUstream stream = random_stream();
  snprintf(step_what, sizeof step_what, "free 0x%llx (%zu bytes, %s)", (unsigned long long)x->base, x->extent,
           x->kind == VMM_KIND_PACKAGE ? "package" : "transient");
  size_t calls = driver_calls();
  vmm_status st = vmm_arena_free(r->a, (void *)(uintptr_t)x->base, stream);
  if (disturbed(r)) {
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  m->frees++;
  stat(m, x, -1);
  live_remove(m, x);
  if (scope_aborted(m, x->scope)) {
    x->state = M_ABANDONED; /* stays mapped and held, no driver call */
    stat(m, x, +1);
    EXPECT_EQ(driver_calls(), calls);
  } else if (m->scope_active && m->retention && x->kind == VMM_KIND_TRANSIENT) {
    pool_push(m, x);
  } else {
    mapped_remove(m, x);
    m->mapped_bytes -= x->extent;
    if (m->scope_active && m->retention) {
      m->kind[x->kind].retained_count += x->pieces;
      m->kind[x->kind].retained_bytes += x->extent;
    } else {
      m->physical -= x->extent;
    }
    EXPECT_EQ(fake_mapped_size_at(x->base), 0);
    free(x);
  }
  return st;
}

/* A pointer that is not a live allocation: NULL, an interior pointer, an idle or abandoned
 * mapping's base, or an address the arena never gave out. Nothing may change. */
static vmm_status op_bad_free(run *r) {
  model *m = &r->m;
  CUdeviceptr p = 0;
  switch (below(4)) {
  case 0: break;
  case 1:
    if (m->live_n) p = m->live[below(m->live_n)]->base + (per_mille(500) ? 1 : 2 * MiB - 1);
    break;
  case 2:
    for (size_t i = 0; i < m->mapped_n && !p; i++)
      if (m->mapped[i]->state == M_POOLED || m->mapped[i]->state == M_ABANDONED) p = m->mapped[i]->base;
    break;
  default: p = 0x1000 + below(64) * 2 * MiB; break;
  }
  snprintf(step_what, sizeof step_what, "bad free 0x%llx", (unsigned long long)p);
  r->bad_calls++;
  size_t calls = driver_calls();
  vmm_status st = vmm_arena_free(r->a, (void *)(uintptr_t)p, random_stream());
  EXPECT_EQ(st, VMM_ERR_UNKNOWN_POINTER);
  EXPECT_EQ(driver_calls(), calls);
  return st;
}

static vmm_status op_bad_alloc(run *r) {
  static const struct {
    size_t bytes;
    int kind;
  } bad[] = {{0, VMM_KIND_TRANSIENT}, {0, VMM_KIND_PACKAGE}, {MAX_ALLOC + 1, VMM_KIND_TRANSIENT}, {4096, 7}};
  size_t i = below(sizeof bad / sizeof bad[0]);
  snprintf(step_what, sizeof step_what, "bad alloc %zu of kind %d", bad[i].bytes, bad[i].kind);
  r->bad_calls++;
  void *p = (void *)1;
  size_t calls = driver_calls();
  vmm_status st = vmm_arena_alloc(r->a, bad[i].bytes, (vmm_kind)bad[i].kind, NULL, &p);
  EXPECT_EQ(st, VMM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(driver_calls(), calls);
  EXPECT(p == NULL);
  return st;
}

static vmm_status op_begin(run *r) {
  model *m = &r->m;
  snprintf(step_what, sizeof step_what, "begin (scope %s)", m->scope_active ? "active" : "none");
  size_t calls = driver_calls();
  vmm_status st = vmm_retention_begin(r->a);
  EXPECT_EQ(driver_calls(), calls);
  if (m->scope_active) {
    EXPECT_EQ(st, VMM_ERR_SCOPE_STATE);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  m->scope_active = 1;
  m->scope_id = ++m->next_scope_id;
  m->begun++;
  return st;
}

static vmm_status op_finish(run *r) {
  model *m = &r->m;
  snprintf(step_what, sizeof step_what, "finish (scope %s, %llu pooled)", m->scope_active ? "active" : "none",
           (unsigned long long)pool_count(m));
  vmm_status st = vmm_retention_finish(r->a);
  if (!m->scope_active) { /* refused before any driver call */
    EXPECT_EQ(st, VMM_ERR_SCOPE_STATE);
    return st;
  }
  if (disturbed(r)) {
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  while (m->bucket_n) {
    mrec *x = pool_pop(m, m->bucket_n - 1);
    mapped_remove(m, x);
    m->mapped_bytes -= x->extent;
    m->physical -= x->extent; /* unmapped, then released with every retained handle */
    EXPECT_EQ(fake_mapped_size_at(x->base), 0);
    free(x);
  }
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    m->physical -= m->kind[k].retained_bytes;
    m->kind[k].retained_count = m->kind[k].retained_bytes = 0;
  }
  m->scope_active = 0;
  m->finished++;
  return st;
}

static vmm_status op_abort(run *r) {
  model *m = &r->m;
  snprintf(step_what, sizeof step_what, "abort (scope %s)", m->scope_active ? "active" : "none");
  size_t calls = driver_calls();
  vmm_status st = vmm_retention_abort(r->a);
  EXPECT_EQ(driver_calls(), calls); /* abort never calls the driver */
  if (!m->scope_active) {
    EXPECT_EQ(st, VMM_ERR_SCOPE_STATE);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  while (m->bucket_n) {
    mrec *x = pool_pop(m, m->bucket_n - 1);
    x->state = M_ABANDONED;
    stat(m, x, +1);
  }
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    m->kind[k].abandoned_count += m->kind[k].retained_count;
    m->kind[k].abandoned_bytes += m->kind[k].retained_bytes;
    m->kind[k].retained_count = m->kind[k].retained_bytes = 0;
  }
  m->aborted_ids = grow(m->aborted_ids, &m->aborted_cap, m->aborted_n + 1, sizeof *m->aborted_ids);
  m->aborted_ids[m->aborted_n++] = m->scope_id;
  m->scope_active = 0;
  m->aborted++;
  return st;
}

static vmm_status op_quiesce(run *r) {
  snprintf(step_what, sizeof step_what, "quiesce");
  vmm_status st = vmm_arena_quiesce(r->a);
  if (!disturbed(r)) EXPECT_EQ(st, VMM_OK);
  return st;
}

/* ---- Arenas -------------------------------------------------------------------------- */

static void arena_new(run *r) {
  static const size_t limits[] = {256 * MiB, 1 * GiB, 4 * GiB};
  fake_options o = {.record_calls = -1};
  fake_driver_reset(&o);
  vmm_config cfg = tu_config();
  unsigned pick = (unsigned)below(10);
  cfg.reuse = pick < 5   ? VMM_REUSE_EXACT
              : pick < 7 ? VMM_REUSE_BOUNDED
              : pick < 9 ? VMM_REUSE_BEST_FIT
                         : VMM_REUSE_NONE;
  cfg.reuse_bound = per_mille(500) ? 2.0 : 1.5;
  cfg.stitch = per_mille(800);
  cfg.retain = per_mille(900) ? VMM_RETAIN_ON : VMM_RETAIN_OFF;
  cfg.limit_bytes = limits[below(3)];
  cfg.driver = fake_driver();
  vmm_status st = vmm_arena_create(&cfg, &r->a);
  if (st != VMM_OK) fprintf(stderr, "vmm_arena_create: %s\n", vmm_create_error());
  assert_int_equal(st, VMM_OK);
  model_free(&r->m);
  r->m.policy = cfg.reuse;
  r->m.bound = cfg.reuse_bound;
  r->m.stitch = cfg.stitch;
  r->m.retention = cfg.retain == VMM_RETAIN_ON;
  r->m.limit = cfg.limit_bytes;
  r->arenas++;
}

static void arena_end(run *r) {
  snprintf(step_what, sizeof step_what, "destroy");
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(r->a, &s), VMM_OK);
  r->hits += s.pool_hits;
  r->fallbacks += s.pool_fallbacks;
  r->stitches += s.stitches;
  r->finishes += s.scopes_finished;
  r->aborts += s.scopes_aborted;
  char why[256] = "";
  int rc = vmm_arena_check(r->a, why, sizeof why);
  if (rc) fprintf(stderr, "vmm_arena_check: %s\n", why);
  EXPECT_EQ(rc, 0);
  vmm_arena_destroy(r->a);
  r->a = NULL;
  EXPECT(fake_ledger_clean());
}

/* Arms a fault at one driver entry point for the coming step. */
static CUresult arm_fault(void) {
  static const vmm_driver_entry entries[] = {
      VMM_DRV_mem_create,         VMM_DRV_mem_map,         VMM_DRV_mem_set_access,  VMM_DRV_mem_unmap,
      VMM_DRV_mem_release,        VMM_DRV_stream_synchronize, VMM_DRV_stream_is_capturing,
      VMM_DRV_event_record,       VMM_DRV_stream_wait_event,  VMM_DRV_mem_address_reserve,
      VMM_DRV_ctx_synchronize,
  };
  CUresult code = per_mille(500) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
  fake_fail_nth(entries[below(sizeof entries / sizeof entries[0])], 1 + (unsigned)below(3), code,
                per_mille(100));
  return code;
}

static uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 0);
  if (errno || *end || v[0] == '-') {
    fprintf(stderr, "%s=\"%s\" is not a non-negative integer\n", name, v);
    fail();
  }
  return x;
}

static void random_operations(void **state) {
  (void)state;
  uint64_t ops = env_u64("VMMARENA_RANDOM_OPS", DEFAULT_OPS);
  seed = env_u64("VMMARENA_SEED", DEFAULT_SEED);
  rng = seed;
  printf("test_random: %llu operations, VMMARENA_SEED=%llu\n", (unsigned long long)ops, (unsigned long long)seed);
  static run r;
  memset(&r, 0, sizeof r);
  arena_new(&r);
  uint64_t arena_ops = 0;
  for (step_no = 1; step_no <= ops; step_no++) {
    model *m = &r.m;
    uint64_t abandoned = m->kind[VMM_KIND_PACKAGE].abandoned_bytes + m->kind[VMM_KIND_TRANSIENT].abandoned_bytes;
    if (arena_ops++ >= ARENA_OPS || abandoned * 2 > m->limit) {
      arena_end(&r);
      arena_new(&r);
      arena_ops = 1;
    }
    const char *fatal = NULL;
    vmm_status fatal_before = vmm_arena_fatal_error(r.a, &fatal);
    char fatal_text[sizeof r.a->fatal_message];
    snprintf(fatal_text, sizeof fatal_text, "%s", fatal);
    r.fired_before = fake_faults_fired();
    r.deferred_at_start = has_deferred(m);
    CUresult code = per_mille(20) ? arm_fault() : CUDA_SUCCESS;

    unsigned pick = (unsigned)below(1000);
    int alloc = pick < 480 ? m->live_n < LIVE_TARGET : pick < 950 && !m->live_n;
    vmm_status st;
    if (alloc) st = op_alloc(&r, random_size(), per_mille(750) ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE);
    else if (pick < 950) st = op_free(&r);
    else if (pick < 965) st = op_begin(&r);
    else if (pick < 971) st = op_finish(&r);
    else if (pick < 973) st = op_abort(&r);
    else if (pick < 988) st = op_bad_free(&r);
    else if (pick < 993) st = op_bad_alloc(&r);
    else st = op_quiesce(&r);
    int upset = disturbed(&r);
    r.faults += fake_faults_fired() != r.fired_before;
    fake_clear_faults();

    /* The first fatal error is sticky; out of memory is never fatal; a driver error is. */
    vmm_status fatal_after = vmm_arena_fatal_error(r.a, &fatal);
    if (fatal_before != VMM_OK) {
      EXPECT_EQ(fatal_after, fatal_before);
      EXPECT(strcmp(fatal, fatal_text) == 0);
    }
    if (code != CUDA_ERROR_UNKNOWN) EXPECT_EQ(fatal_after, fatal_before);
    if (st == VMM_ERR_DRIVER) EXPECT_EQ(fatal_after, VMM_ERR_DRIVER);

    vmm_snapshot s;
    assert_int_equal(vmm_arena_snapshot(r.a, &s), VMM_OK);
    if (upset) {
      r.disturbed_steps++;
      adopt(m, r.a, &s);
    } else {
      check_predicted(m, &s);
    }
    check_common(r.a, m, &s);
  }
  arena_end(&r);
  model_free(&r.m);
  printf("test_random: %llu arenas, %llu scopes finished, %llu aborted; %llu pool hits, %llu fallbacks, %llu stitches, "
         "%llu out-of-memory results, %llu bad calls; %llu faults fired, %llu disturbed steps\n",
         (unsigned long long)r.arenas, (unsigned long long)r.finishes, (unsigned long long)r.aborts,
         (unsigned long long)r.hits, (unsigned long long)r.fallbacks, (unsigned long long)r.stitches,
         (unsigned long long)r.ooms, (unsigned long long)r.bad_calls, (unsigned long long)r.faults,
         (unsigned long long)r.disturbed_steps);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(random_operations)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
