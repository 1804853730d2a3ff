/* Seeded random operations against a shadow model of the arena.
 *
 * Operations: allocations of both kinds (sizes from a small set and random ones) on a few
 * streams, each under a tag (none, "a" or "b"), frees of random live pointers, bad frees and
 * bad allocations, begin, finish, abort, quiesce, pause and resume of a tag (untagged, "a",
 * "b", or one no allocation carries; discard or backup, now and then a bad mode), frees of
 * paused allocations, and now and then a fault injected at one driver entry point (out of
 * memory or a generic error, once or persistently). Each arena gets a random reuse policy,
 * handle bound (mostly the arena's own), package assembly on or off, retention on or off and
 * a physical limit, so assemblies, refusals and fallbacks happen often; it is destroyed and
 * replaced from time to time, and every destroy must leave the fake driver's ledger empty.
 *
 * The model keeps what the arena keeps: every mapping with the sizes of its handles in
 * address order, the pool's buckets (newest first), and the unmapped idle handles by size
 * (newest last). From them it predicts the result of every step in which no fault fired (and
 * no free was left waiting for a capture to end, which the next call would process): the
 * status; the pointer a pool hit or fallback returns; for an assembly, which idle handles it
 * takes (the largest unmapped one that fits what is left, repeatedly, then pooled mappings
 * taken apart, the tightest first), how much it creates and how that is cut (checked against
 * the handles of the mapping the arena returns); and the snapshot counters (per kind live,
 * pooled, retained and abandoned counts and bytes; physical bytes and peak, mapped bytes;
 * reusable handles and bytes; pool hits, misses and fallbacks; assemblies, padded ones, idle
 * handles assembled, bytes created, pooled mappings taken apart; refusals; the handle bound;
 * scope state; paused counts and bytes; live and paused bytes by tag). A pause is predicted
 * whole: its status (every refusal), the records it pauses, the handles that become idle
 * inside a retaining scope or the memory released outside one. A free of a paused allocation
 * makes no driver call. A resume is checked, not planned (see op_resume), and the model then
 * adopts the arena's state. Every 256 steps it also compares its idle tier, handle by
 * handle, with the arena's. After a step a fault disturbed, the model checks what must still hold
 * (allowed statuses, the fatal-error rules) and then adopts the arena's state (internal.h)
 * so that it can predict again. After every step: no two mapped ranges overlap,
 * vmm_arena_check passes, and the driver's view (handle and mapped bytes, no misuse) equals
 * the arena's.
 *
 * At the end of every scope of an arena with the default configuration (exact reuse, the
 * arena's own handle bound) and retention on, it checks the physical limit the SPEC promises
 * (see scope_watch below): the physical peak during the scope is at most 1.02 x the peak of
 * live rounded bytes during the scope plus one handle bound, plus the memory that is outside
 * the promise, accounted for by name.
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
#define G (2 * MiB)             /* the fake's granularity */
#define MAX_GRANULES 2048       /* no handle is larger than the largest limit (4 GiB): a resume outside
                                 * a scope maps one handle of a whole extent, padding and all */
#define DEEP_CHECK_EVERY 256    /* steps between comparisons of the idle tier */

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

typedef enum { M_LIVE, M_POOLED, M_ABANDONED, M_DEFERRED, M_PAUSED } mstate;

/* The tags allocations carry (index 0: none); pause and resume also name TAG_NEVER, which no
 * allocation ever carries. */
static const char *const tag_names[] = {NULL, "a", "b", "never"};
#define TAGS 3
#define TAG_NEVER 3

typedef struct mrec {
  CUdeviceptr base;
  size_t extent;
  size_t rounded;     /* while live: the rounded request it serves (what frees-at-once would hold) */
  size_t *hs;         /* handle sizes in address order */
  uint8_t *taken;     /* plan scratch: handle i chosen by the assembly being planned */
  uint32_t nh;        /* 0 while paused (extent kept), unless a fault left it mapped */
  vmm_kind kind;
  mstate state;
  int tag;            /* index in tag_names */
  uint64_t scope;     /* scope it was allocated in, 0 = none */
  int chosen;         /* plan scratch: taken apart by the assembly being planned */
  struct mrec *next;  /* next older mapping of its bucket while pooled */
  size_t live_slot;   /* index in model.live while live */
} mrec;

typedef struct mbucket {
  size_t size;
  mrec *head; /* newest first */
} mbucket;

/* Unmapped idle handles of one size, oldest first: the arena takes the newest when it takes
 * the largest that fits, and the oldest when it takes the smallest that covers. */
typedef struct idle_entry {
  uint64_t serial;
  vmm_kind kind;
} idle_entry;

typedef struct idle_stack {
  idle_entry *e;
  size_t n, cap;
} idle_stack;

typedef struct model {
  mrec **mapped; /* every mapped record, sorted by base */
  size_t mapped_n, mapped_cap;
  mrec **live;
  size_t live_n, live_cap;
  size_t paused_n;  /* records in M_PAUSED */
  mbucket *buckets; /* sorted by size, none empty */
  size_t bucket_n, bucket_cap;
  size_t pool_handles;
  idle_stack idle[MAX_GRANULES + 1]; /* by size in granules */
  size_t idle_n, idle_bytes;
  uint64_t serial;
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical, peak, mapped_bytes, live_rounded;
  uint64_t scope_peak; /* the physical peak since the active scope began */
  uint64_t hits, misses, fallbacks, limit_refusals, allocs, frees;
  uint64_t assemblies, padded, assembled_handles, created_bytes, taken_apart;
  int scope_active;
  uint64_t scope_id, next_scope_id, begun, finished, aborted;
  uint64_t *aborted_ids; /* ascending */
  size_t aborted_n, aborted_cap;
  /* the arena's configuration */
  vmm_reuse_policy policy;
  double bound;
  size_t handle_bound; /* 0: the arena's choice */
  int package_assembly, retention;
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

static size_t round_up(size_t bytes) { return (bytes + G - 1) / G * G; }

static mrec *mrec_new(CUdeviceptr base, vmm_kind kind, const size_t *hs, uint32_t nh) {
  mrec *r = calloc(1, sizeof *r);
  EXPECT(r != NULL);
  r->hs = malloc((nh ? nh : 1) * sizeof *r->hs);
  r->taken = calloc(nh ? nh : 1, 1);
  EXPECT(r->hs != NULL && r->taken != NULL);
  r->base = base;
  r->kind = kind;
  r->nh = nh;
  for (uint32_t i = 0; i < nh; i++) r->extent += (r->hs[i] = hs[i]);
  return r;
}

static void mrec_free(mrec *r) {
  free(r->hs);
  free(r->taken);
  free(r);
}

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
  EXPECT(r->base != 0 && r->base % G == 0);
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
  m->live_rounded += r->rounded;
}

static void live_remove(model *m, mrec *r) {
  mrec *last = m->live[--m->live_n];
  m->live[r->live_slot] = last;
  last->live_slot = r->live_slot;
  m->live_rounded -= r->rounded;
}

/* Per-mapping counters of the state a record is in. */
static void stat(model *m, const mrec *r, int sign) {
  vmm_kind_stats *k = &m->kind[r->kind];
  uint64_t *count = &k->live_count, *bytes = &k->live_bytes;
  if (r->state == M_POOLED) count = &k->pooled_count, bytes = &k->pooled_bytes;
  if (r->state == M_ABANDONED) count = &k->abandoned_count, bytes = &k->abandoned_bytes;
  if (r->state == M_PAUSED) count = &k->paused_count, bytes = &k->paused_bytes;
  *count += (uint64_t)(int64_t)sign;
  *bytes += (uint64_t)((int64_t)sign * (int64_t)r->extent);
}

/* ---- The pool (mapped tier) ------------------------------------------------------------ */

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
  m->pool_handles += r->nh;
  stat(m, r, +1);
}

/* Takes r out of its bucket (anywhere in it). */
static void pool_remove(model *m, mrec *r) {
  size_t i = bucket_lower(m, r->extent);
  EXPECT(i < m->bucket_n && m->buckets[i].size == r->extent);
  mrec **link = &m->buckets[i].head;
  while (*link != r) {
    EXPECT(*link != NULL);
    link = &(*link)->next;
  }
  *link = r->next;
  r->next = NULL;
  if (!m->buckets[i].head) {
    memmove(&m->buckets[i], &m->buckets[i + 1], (m->bucket_n - i - 1) * sizeof *m->buckets);
    m->bucket_n--;
  }
  m->pool_handles -= r->nh;
  stat(m, r, -1);
}

static uint64_t pool_count(const model *m) { return m->kind[VMM_KIND_TRANSIENT].pooled_count; }

/* ---- The idle tier ----------------------------------------------------------------- */

static void idle_push(model *m, size_t size, vmm_kind kind, uint64_t serial) {
  EXPECT(size && size % G == 0 && size / G <= MAX_GRANULES);
  idle_stack *st = &m->idle[size / G];
  st->e = grow(st->e, &st->cap, st->n + 1, sizeof *st->e);
  EXPECT(st->n == 0 || st->e[st->n - 1].serial < serial);
  st->e[st->n++] = (idle_entry){serial, kind};
  m->idle_n++;
  m->idle_bytes += size;
  m->kind[kind].idle_count++;
  m->kind[kind].idle_bytes += size;
}

/* A handle that becomes idle now: the newest of its size. */
static void idle_put(model *m, size_t size, vmm_kind kind) { idle_push(m, size, kind, ++m->serial); }

/* Removes the newest (top) or the oldest (bottom) handle of g granules. */
static void idle_take(model *m, size_t g, int oldest) {
  idle_stack *st = &m->idle[g];
  EXPECT(st->n > 0);
  idle_entry e = oldest ? st->e[0] : st->e[st->n - 1];
  if (oldest) memmove(&st->e[0], &st->e[1], (st->n - 1) * sizeof *st->e);
  st->n--;
  m->idle_n--;
  m->idle_bytes -= g * G;
  m->kind[e.kind].idle_count--;
  m->kind[e.kind].idle_bytes -= g * G;
}

static void idle_clear(model *m) {
  for (size_t g = 0; g <= MAX_GRANULES; g++) m->idle[g].n = 0;
  m->idle_n = m->idle_bytes = 0;
  for (int k = 0; k < VMM_KIND_COUNT; k++) m->kind[k].idle_count = m->kind[k].idle_bytes = 0;
}

/* ---- Scopes and records ----------------------------------------------------------------- */

static int scope_aborted(const model *m, uint64_t id) {
  for (size_t lo = 0, hi = m->aborted_n; lo < hi;) {
    size_t mid = (lo + hi) / 2;
    if (m->aborted_ids[mid] == id) return 1;
    if (m->aborted_ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return 0;
}

static void make_live(model *m, mrec *r, size_t rounded) {
  r->state = M_LIVE;
  r->rounded = rounded;
  r->scope = m->scope_active ? m->scope_id : 0;
  stat(m, r, +1);
  live_add(m, r);
}

static void model_clear_records(model *m) {
  for (size_t i = 0; i < m->mapped_n; i++) mrec_free(m->mapped[i]);
  m->mapped_n = m->live_n = m->bucket_n = m->paused_n = 0;
  m->pool_handles = 0;
  m->live_rounded = 0;
  idle_clear(m);
}

static void model_free(model *m) {
  model_clear_records(m);
  free(m->mapped);
  free(m->live);
  free(m->buckets);
  free(m->aborted_ids);
  for (size_t g = 0; g <= MAX_GRANULES; g++) free(m->idle[g].e);
  memset(m, 0, sizeof *m);
}

static void add_physical(model *m, uint64_t bytes) {
  m->physical += bytes;
  if (m->physical > m->peak) m->peak = m->physical;
  if (m->physical > m->scope_peak) m->scope_peak = m->physical;
}

/* The bound vmm_handle_bound chooses for a peak: the largest power of two at most 1/64 of it,
 * within [one granule, 256 MiB]. */
static size_t bound_for(uint64_t peak) {
  size_t target = (size_t)(peak / 64), bound = G;
  while (bound * 2 <= target && bound * 2 <= ((size_t)256 << 20)) bound *= 2;
  return bound;
}

/* The largest handle the arena creates for `fresh` new bytes (vmm_handle_bound): from the
 * scope's peak, or what is held outside a scope, or `fresh` if more. */
static size_t model_bound(const model *m, size_t fresh) {
  if (m->handle_bound) return round_up(m->handle_bound);
  uint64_t peak = m->scope_active ? m->scope_peak : m->physical;
  return bound_for(fresh > peak ? fresh : peak);
}

/* ---- Assembly, as the model plans it ---------------------------------------------------- */

typedef struct mplan {
  size_t top[MAX_GRANULES + 1]; /* newest handles of each size taken from the idle tier */
  size_t oldest;                /* granules of the one oldest handle taken (padded), or 0 */
  size_t *use;                  /* the idle handles' sizes in the order they are mapped */
  size_t n_use, n_idle_tier;
  mrec **apart;
  size_t n_apart;
  size_t covered, fresh;
} mplan;

static size_t idle_available(const model *m, const mplan *p, size_t g) {
  return m->idle[g].n - p->top[g] - (p->oldest == g);
}

static int has_handle_at_most(const mrec *x, size_t most) {
  for (uint32_t i = 0; i < x->nh; i++)
    if (x->hs[i] <= most) return 1;
  return 0;
}

/* The pooled mapping to take apart for `left` bytes: the first (newest) of the smallest
 * bucket that covers them, else of the largest smaller one. Every stream can be waited for
 * here: nothing captures in this test. */
static mrec *pick_apart(const model *m, size_t left, int padded) {
  size_t lo = bucket_lower(m, left);
  for (size_t b = lo; b < m->bucket_n; b++)
    for (mrec *x = m->buckets[b].head; x; x = x->next)
      if (!x->chosen && (padded || has_handle_at_most(x, left))) return x;
  for (size_t b = lo; b-- > 0;)
    for (mrec *x = m->buckets[b].head; x; x = x->next)
      if (!x->chosen && (padded || has_handle_at_most(x, left))) return x;
  return NULL;
}

static void plan_use(mplan *p, size_t size, size_t *left) {
  p->use[p->n_use++] = size;
  p->covered += size;
  *left = size >= *left ? 0 : *left - size;
}

/* Plans an assembly of `rounded` bytes without changing the model (only scratch flags). */
static void plan(model *m, mplan *p, size_t rounded, int padded) {
  memset(p, 0, sizeof *p);
  p->use = malloc((m->idle_n + m->pool_handles + 1) * sizeof *p->use);
  p->apart = malloc((pool_count(m) + 1) * sizeof *p->apart);
  EXPECT(p->use != NULL && p->apart != NULL);
  size_t left = rounded;
  while (left) {
    size_t g = left / G < MAX_GRANULES ? left / G : MAX_GRANULES;
    while (g && !idle_available(m, p, g)) g--;
    if (!g) break;
    p->top[g]++;
    plan_use(p, g * G, &left);
  }
  if (left && padded) {
    for (size_t g = (left + G - 1) / G; g <= MAX_GRANULES; g++)
      if (idle_available(m, p, g)) {
        p->oldest = g;
        plan_use(p, g * G, &left);
        break;
      }
  }
  p->n_idle_tier = p->n_use;
  mrec *x;
  while (left && (x = pick_apart(m, left, padded)) != NULL) {
    x->chosen = 1;
    p->apart[p->n_apart++] = x;
    for (uint32_t i = 0; i < x->nh && left; i++)
      if (x->hs[i] <= left) {
        x->taken[i] = 1;
        plan_use(p, x->hs[i], &left);
      }
    if (left && padded) {
      int best = -1;
      for (uint32_t i = 0; i < x->nh; i++)
        if (!x->taken[i] && (best < 0 || x->hs[i] < x->hs[best])) best = (int)i;
      if (best >= 0) {
        x->taken[best] = 1;
        plan_use(p, x->hs[best], &left);
      }
    }
  }
  p->fresh = left;
}

static void plan_drop(mplan *p) {
  for (size_t i = 0; i < p->n_apart; i++) {
    p->apart[i]->chosen = 0;
    memset(p->apart[i]->taken, 0, p->apart[i]->nh);
  }
  free(p->use);
  free(p->apart);
}

/* The sizes new memory is cut into: inside a scope handles of the bound, and what is left
 * below it as one; outside a scope, a single handle. Returns how many. */
static size_t cut(const model *m, size_t fresh, int whole, size_t *out) {
  size_t n = 0, bound = model_bound(m, fresh);
  for (size_t rest = fresh; rest; n++) {
    size_t piece = whole || rest < bound ? rest : bound;
    out[n] = piece;
    rest -= piece;
  }
  return n;
}

/* Carries out a planned assembly (or a single new handle, p == NULL) for an allocation the
 * arena served at `got`: the idle handles used leave the store, the mappings taken apart
 * give their other handles to the idle tier, and the new mapping's handles must be the
 * ones planned, in order. */
static mrec *assemble(model *m, mplan *p, CUdeviceptr got, vmm_kind kind, size_t rounded, int padded,
                      vmm_arena *a) {
  size_t fresh = p ? p->fresh : rounded, n_idle = p ? p->n_use : 0;
  size_t *hs = malloc((n_idle + fresh / G + 1) * sizeof *hs);
  EXPECT(hs != NULL);
  if (n_idle) memcpy(hs, p->use, n_idle * sizeof *hs);
  size_t n = n_idle + cut(m, fresh, p == NULL || !m->scope_active, hs + n_idle);
  if (p) {
    for (size_t g = 1; g <= MAX_GRANULES; g++)
      for (size_t k = 0; k < p->top[g]; k++) idle_take(m, g, 0);
    if (p->oldest) idle_take(m, p->oldest, 1);
    m->taken_apart += p->n_apart;
    for (size_t i = 0; i < p->n_apart; i++) { /* the arena commits them in this order */
      mrec *x = p->apart[i];
      pool_remove(m, x);
      for (uint32_t h = 0; h < x->nh; h++)
        if (!x->taken[h]) idle_put(m, x->hs[h], x->kind);
      mapped_remove(m, x);
      m->mapped_bytes -= x->extent;
      mrec_free(x);
    }
    p->n_apart = 0;
    if (n_idle) {
      m->assemblies++;
      m->assembled_handles += n_idle;
      m->created_bytes += fresh;
      m->padded += padded;
    }
  }
  mrec *x = mrec_new(got, kind, hs, (uint32_t)n);
  free(hs);
  /* The arena's mapping: the same handle sizes in the same order. */
  vmm_mapping *real = vmm_table_find(&a->table, got);
  EXPECT(real != NULL);
  EXPECT_EQ(real->handle_count, x->nh);
  for (uint32_t i = 0; i < x->nh; i++) EXPECT_EQ(real->handles[i]->size, x->hs[i]);
  mapped_insert(m, x);
  make_live(m, x, rounded);
  add_physical(m, fresh);
  m->mapped_bytes += x->extent;
  return x;
}

/* ---- Adopting the arena's state after a disturbed step -------------------------------- */

static mstate state_of(vmm_mapping_state s) {
  switch (s) {
  case VMM_MAP_LIVE: return M_LIVE;
  case VMM_MAP_POOLED: return M_POOLED;
  case VMM_MAP_DEFERRED: return M_DEFERRED;
  case VMM_MAP_ABANDONED: return M_ABANDONED;
  case VMM_MAP_PAUSED: return M_PAUSED;
  case VMM_MAP_FREEING:
  case VMM_MAP_MOVING: break;
  }
  EXPECT(!"no mapping is mid-free or mid-copy between calls");
  return M_LIVE;
}

/* The index in tag_names of an interned tag id. */
static int tag_index(uint32_t id) {
  const char *name = id ? vmm_tag_name(id) : NULL;
  for (int t = 1; t < TAGS && name; t++)
    if (!strcmp(name, tag_names[t])) return t;
  EXPECT(name == NULL);
  return 0;
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
    m->pool_handles += r->nh;
  }
  adopt_buckets(m, n->right);
}

static void adopt_idle(model *m, const vmm_avl *n) {
  if (!n) return;
  adopt_idle(m, n->left);
  const vmm_handle *h = vmm_container_of(n, vmm_handle, node);
  idle_push(m, h->size, h->kind, h->node.k2);
  adopt_idle(m, n->right);
}

static void adopt(model *m, vmm_arena *a, const vmm_snapshot *s) {
  model_clear_records(m);
  vmm_mapping *x;
  size_t hs[4096];
  vmm_table_foreach(&a->table, i, x) {
    EXPECT(x->handle_count <= 4096);
    for (uint32_t h = 0; h < x->handle_count; h++) hs[h] = x->handles[h]->size;
    mrec *r = mrec_new(x->base, x->kind, hs, x->handle_count);
    r->state = state_of(x->state);
    if (r->state == M_PAUSED) { /* no handles, or (a failed copy back) all of them */
      EXPECT(r->nh == 0 || r->extent == x->extent);
      r->extent = x->extent;
      r->rounded = round_up(x->requested);
      m->paused_n++;
    }
    EXPECT_EQ(r->extent, x->extent);
    r->scope = x->scope_id;
    r->tag = tag_index(x->tag);
    mapped_insert(m, r);
    if (r->state == M_LIVE) {
      r->rounded = round_up(x->requested);
      live_add(m, r);
    }
  }
  adopt_buckets(m, a->store.pool.root);
  adopt_idle(m, a->store.idle);
  m->serial = a->store.serial;
  memcpy(m->kind, s->kind, sizeof m->kind);
  m->physical = s->physical_bytes;
  m->peak = s->physical_peak_bytes;
  m->scope_peak = a->scope_peak;
  m->mapped_bytes = s->mapped_bytes;
  m->hits = s->pool_hits;
  m->misses = s->pool_misses;
  m->fallbacks = s->pool_fallbacks;
  m->limit_refusals = s->limit_refusals;
  m->assemblies = s->assemblies;
  m->padded = s->padded_assemblies;
  m->assembled_handles = s->assembled_idle_handles;
  m->created_bytes = s->assembly_created_bytes;
  m->taken_apart = s->pooled_taken_apart;
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
    EXPECT_EQ(got->idle_count, want->idle_count);
    EXPECT_EQ(got->idle_bytes, want->idle_bytes);
    EXPECT_EQ(got->abandoned_count, want->abandoned_count);
    EXPECT_EQ(got->abandoned_bytes, want->abandoned_bytes);
    EXPECT_EQ(got->paused_count, want->paused_count);
    EXPECT_EQ(got->paused_bytes, want->paused_bytes);
  }
  EXPECT_EQ(s->retained_reusable_handles, m->pool_handles + m->idle_n);
  EXPECT_EQ(s->retained_reusable_bytes, m->kind[VMM_KIND_TRANSIENT].pooled_bytes + m->idle_bytes);
  EXPECT_EQ(s->pool_buckets, m->bucket_n);
  EXPECT_EQ(s->physical_bytes, m->physical);
  EXPECT_EQ(s->physical_peak_bytes, m->peak);
  EXPECT_EQ(s->mapped_bytes, m->mapped_bytes);
  EXPECT_EQ(s->handle_bound_bytes, model_bound(m, 0));
  EXPECT_EQ(s->pool_hits, m->hits);
  EXPECT_EQ(s->pool_misses, m->misses);
  EXPECT_EQ(s->pool_fallbacks, m->fallbacks);
  EXPECT_EQ(s->assemblies, m->assemblies);
  EXPECT_EQ(s->padded_assemblies, m->padded);
  EXPECT_EQ(s->assembled_idle_handles, m->assembled_handles);
  EXPECT_EQ(s->assembly_created_bytes, m->created_bytes);
  EXPECT_EQ(s->pooled_taken_apart, m->taken_apart);
  EXPECT_EQ(s->limit_refusals, m->limit_refusals);
  EXPECT_EQ(s->allocs, m->allocs);
  EXPECT_EQ(s->frees, m->frees);
  EXPECT_EQ(s->scope_state, m->scope_active ? VMM_SCOPE_ACTIVE : VMM_SCOPE_NONE);
  EXPECT_EQ(s->scopes_begun, m->begun);
  EXPECT_EQ(s->scopes_finished, m->finished);
  EXPECT_EQ(s->scopes_aborted, m->aborted);
}

/* Live and paused bytes and counts by tag, against the arena's per-tag counters. */
static void check_tags(const model *m, const vmm_arena *a) {
  for (int t = 0; t < TAGS; t++) {
    bool known = true;
    uint32_t id = t ? vmm_tag_lookup(tag_names[t], &known) : 0;
    uint64_t live = 0, live_bytes = 0, paused = 0, paused_bytes = 0;
    for (size_t i = 0; i < m->mapped_n; i++) {
      const mrec *x = m->mapped[i];
      if (x->tag != t) continue;
      if (x->state == M_LIVE) live++, live_bytes += x->extent;
      if (x->state == M_PAUSED) paused++, paused_bytes += x->extent;
    }
    int counted = known && id < a->tag_cap;
    EXPECT_EQ(counted ? a->tag_count[id] : 0, live);
    EXPECT_EQ(counted ? a->tag_bytes[id] : 0, live_bytes);
    EXPECT_EQ(counted ? a->tag_paused_count[id] : 0, paused);
    EXPECT_EQ(counted ? a->tag_paused_bytes[id] : 0, paused_bytes);
  }
}

/* The idle tier, handle by handle: size, kind and place (by size, then age). */
static void check_idle_deep(const model *m, const vmm_arena *a) {
  const vmm_avl *stack[128];
  size_t depth = 0, g = 1, k = 0, seen = 0;
  const vmm_avl *n = a->store.idle;
  while (n || depth) {
    while (n) {
      EXPECT(depth < 128);
      stack[depth++] = n;
      n = n->left;
    }
    n = stack[--depth];
    const vmm_handle *h = vmm_container_of(n, vmm_handle, node);
    while (g <= MAX_GRANULES && k == m->idle[g].n) g++, k = 0;
    EXPECT(g <= MAX_GRANULES);
    EXPECT_EQ(h->size, g * G);
    EXPECT_EQ(h->kind, m->idle[g].e[k].kind);
    EXPECT_EQ(h->node.k2, m->idle[g].e[k].serial); /* its place among handles of its size */
    k++, seen++;
    n = n->right;
  }
  EXPECT_EQ(seen, m->idle_n);
  EXPECT_EQ(a->store.serial, m->serial);
}

/* ---- The physical limit (SPEC, "Retained memory is fungible") ------------------------- */

/* For an arena with the default configuration (exact reuse, the arena's own handle bound)
 * and retention on, at the end of each scope (finish or abort):
 *
 *   physical peak during the scope <= 1.02 x peak of live rounded bytes during the scope
 *                                     + the handle bound + outside
 *
 * The live rounded bytes are what an allocator releasing every free at once would hold (the
 * rounded requests live); the bound is the arena's at the end of the scope (it only grows).
 * `outside` adds up, by name, the memory the promise does not cover:
 *  - held_at_begin: what the arena held when the scope began beyond the live rounded bytes:
 *    memory of aborted scopes (abandoned until destroy), the padding of live allocations a
 *    fallback of an earlier scope gave out, handles whose release failed (idle until the
 *    next finish or destroy);
 *  - made_before: the extents of allocations made before the scope and freed inside it. They
 *    were cut by an older, smaller peak's bound, or not at all (outside a scope a request is
 *    one handle), so only requests at least as large as their handles can use them;
 *  - aborted_freed: the extents of allocations of an aborted scope freed inside this one:
 *    they leave the live bytes but stay held, abandoned until destroy;
 *  - package_off: with package assembly off, the rounded bytes of package allocations in the
 *    scope, which take new memory whatever is idle;
 *  - fallback_padding: what a pooled mapping taken whole or a padded assembly gives beyond
 *    the rounded request after a refusal, a fault's too (held while that allocation lives,
 *    and the memory created meanwhile stays after it);
 *  - disturbed: in a step where a fault fired, what physical memory grew by beyond the live
 *    rounded bytes (a failed release keeps its handle idle; a capture state that cannot be
 *    read counts as capturing, so that step neither reuses nor takes apart pooled mappings
 *    freed on that stream: pooled mappings whose freeing stream is capturing are outside the
 *    promise, and this is the only way streams capture in this test).
 *  - resumed: in a step the model did not plan (a resume, or a free of a paused allocation a
 *    fault left mapped), what physical memory grew by beyond the live rounded bytes: a resume
 *    maps back the whole extent (a fallback's padding, which may predate the scope, included).
 *    Paused allocations hold no memory and are not live; a pause inside the scope of an
 *    allocation made before it counts under made_before, like a free.
 *  - stranded: only where the bound exceeds the one the arena would choose for this scope's
 *    own peak (the peak less all of the above), because the arena's physical peak counts
 *    memory this scope cannot use (abandoned memory, an earlier and larger scope): the most
 *    idle memory an assembly left unused while it created memory, all of it in handles
 *    larger than what was left of its request. With a bound that fits the scope, idle
 *    handles larger than a remainder are what the "+ one handle bound" covers.
 * Arenas with another policy or an explicit bound are not checked: the bound is then the
 * user's choice, and bounded:F and best-fit hand out larger mappings by design. */
typedef struct scope_watch {
  int on;
  uint64_t peak_at_begin; /* the arena's physical peak when the scope began */
  uint64_t physical_peak, live_peak;
  uint64_t held_at_begin, made_before, aborted_freed, package_off, fallback_padding, disturbed, resumed;
  uint64_t stranded; /* the most idle bytes an assembly left unused while it created memory */
} scope_watch;

static int watched(const model *m) {
  return m->retention && m->policy == VMM_REUSE_EXACT && m->handle_bound == 0;
}

/* ---- Operations and their predictions ------------------------------------------------- */

typedef struct run {
  vmm_arena *a;
  model m;
  scope_watch w;
  int deferred_at_start; /* frees waiting for a capture end: the next call processes them */
  int began;             /* the step began a scope */
  int resumed;           /* the step was a resume that acted (the model adopted the arena's state) */
  CUdeviceptr got;       /* the pointer the latest allocation returned */
  uint64_t pauses, resumes, paused_frees; /* successful ones, for the summary */
  unsigned fired_before; /* fake_faults_fired() at the start of the step */
  /* totals for the summary */
  uint64_t arenas, disturbed_steps, faults, ooms, bad_calls, hits, fallbacks, assemblies, padded, finishes, aborts;
  uint64_t scopes_checked, scopes_with_outside, scopes_inflated, deep_checks;
  double worst_ratio;    /* (physical peak - bound - outside) / live peak, over checked scopes */
  uint64_t worst_slack;  /* the least room left under the promise, bytes */
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

static int retaining(const model *m) { return m->scope_active && m->retention; }

static int pooling(const model *m, vmm_kind kind) {
  return retaining(m) && kind == VMM_KIND_TRANSIENT && m->policy != VMM_REUSE_NONE;
}

static int assembling(const model *m, vmm_kind kind) {
  return retaining(m) && m->policy != VMM_REUSE_NONE && (kind == VMM_KIND_TRANSIENT || m->package_assembly);
}

/* Whether `fresh` new bytes pass the limit. */
static int admitted(const model *m, size_t fresh) {
  return !m->limit || (m->physical <= m->limit && fresh <= m->limit - m->physical);
}

static vmm_status op_alloc(run *r, size_t bytes, vmm_kind kind) {
  model *m = &r->m;
  CUstream stream = random_stream();
  snprintf(step_what, sizeof step_what, "alloc %zu %s", bytes, kind == VMM_KIND_PACKAGE ? "package" : "transient");
  void *p = (void *)1;
  vmm_status st = vmm_arena_alloc(r->a, bytes, kind, stream, &p);
  CUdeviceptr got = r->got = (CUdeviceptr)(uintptr_t)p;
  r->ooms += st == VMM_ERR_OUT_OF_MEMORY;
  if (disturbed(r)) {
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
    EXPECT((st == VMM_OK) == (p != NULL));
    if (st == VMM_OK) EXPECT(tu_mapped_from(p, bytes) >= bytes);
    if (st == VMM_OK && r->w.on) { /* a fault may have opened the fallbacks */
      const vmm_mapping *x = vmm_table_find(&r->a->table, got);
      EXPECT(x != NULL);
      if (x->extent > round_up(bytes)) r->w.fallback_padding += x->extent - round_up(bytes);
    }
    return st;
  }
  size_t rounded = round_up(bytes);
  int pool = pooling(m, kind);
  /* 1. a pool hit by the reuse policy */
  if (pool) {
    size_t hi = rounded;
    if (m->policy == VMM_REUSE_BEST_FIT) hi = SIZE_MAX;
    if (m->policy == VMM_REUSE_BOUNDED) hi = (size_t)((double)rounded * m->bound);
    size_t i = bucket_lower(m, rounded);
    if (i < m->bucket_n && m->buckets[i].size <= hi) {
      EXPECT_EQ(st, VMM_OK);
      mrec *x = m->buckets[i].head;
      EXPECT_EQ(got, x->base);
      pool_remove(m, x);
      make_live(m, x, rounded);
      m->hits++;
      m->allocs++;
      return st;
    }
    m->misses++;
  }
  /* 2. an assembly (new memory only for what idle handles leave), or 3. one new handle */
  if (assembling(m, kind)) {
    mplan pl;
    plan(m, &pl, rounded, 0);
    if (!pl.fresh || admitted(m, pl.fresh)) {
      EXPECT_EQ(st, VMM_OK);
      uint64_t idle = m->idle_bytes + m->kind[VMM_KIND_TRANSIENT].pooled_bytes - pl.covered;
      if (pl.fresh && r->w.on && idle > r->w.stranded) r->w.stranded = idle;
      assemble(m, &pl, got, kind, rounded, 0, r->a);
      plan_drop(&pl);
      EXPECT_EQ(tu_mapped_from(p, rounded), rounded); /* exactly the request: never padded */
      m->allocs++;
      return st;
    }
    plan_drop(&pl);
  } else if (admitted(m, rounded)) {
    EXPECT_EQ(st, VMM_OK);
    assemble(m, NULL, got, kind, rounded, 0, r->a);
    EXPECT_EQ(tu_mapped_from(p, rounded), rounded);
    if (retaining(m) && kind == VMM_KIND_PACKAGE && r->w.on) r->w.package_off += rounded;
    m->allocs++;
    return st;
  }
  m->limit_refusals++;
  /* 4. after the refusal: any pooled mapping that fits, then a padded assembly */
  if (pool) {
    size_t i = bucket_lower(m, rounded);
    if (i < m->bucket_n) {
      EXPECT_EQ(st, VMM_OK);
      mrec *x = m->buckets[i].head;
      EXPECT_EQ(got, x->base);
      pool_remove(m, x);
      make_live(m, x, rounded);
      if (r->w.on) r->w.fallback_padding += x->extent - rounded;
      m->fallbacks++;
      m->allocs++;
      return st;
    }
    mplan pl;
    plan(m, &pl, rounded, 1);
    if (!pl.fresh && pl.n_use) {
      EXPECT_EQ(st, VMM_OK);
      mrec *x = assemble(m, &pl, got, kind, rounded, 1, r->a);
      plan_drop(&pl);
      EXPECT(x->extent >= rounded);
      if (r->w.on) r->w.fallback_padding += x->extent - rounded;
      m->allocs++;
      return st;
    }
    plan_drop(&pl);
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
    if (r->w.on) r->w.aborted_freed += x->extent;
    return st;
  }
  if (retaining(m) && r->w.on && x->scope != m->scope_id) r->w.made_before += x->extent;
  if (retaining(m) && x->kind == VMM_KIND_TRANSIENT) {
    pool_push(m, x);
    return st;
  }
  mapped_remove(m, x);
  m->mapped_bytes -= x->extent;
  if (retaining(m)) { /* unmapped; its handles idle until finish */
    for (uint32_t h = 0; h < x->nh; h++) idle_put(m, x->hs[h], x->kind);
  } else {
    m->physical -= x->extent;
  }
  EXPECT_EQ(fake_mapped_size_at(x->base), 0);
  mrec_free(x);
  return st;
}

/* An allocation under a random tag (none, "a" or "b"), pushed around the call: the record
 * carries it, and so must the arena's. */
static vmm_status op_alloc_tagged(run *r, size_t bytes, vmm_kind kind) {
  int t = (int)below(TAGS);
  if (t) vmm_tag_push(tag_names[t]);
  r->got = 0;
  vmm_status st = op_alloc(r, bytes, kind);
  if (t) vmm_tag_pop();
  EXPECT(vmm_tag_current() == NULL);
  if (st != VMM_OK) return st;
  const vmm_mapping *x = vmm_table_find(&r->a->table, r->got);
  EXPECT(x != NULL);
  EXPECT_EQ(tag_index(x->tag), t);
  mrec *y = mapped_find(&r->m, r->got);
  if (y) y->tag = t; /* a disturbed step adopts it */
  return st;
}

static size_t tag_records(const model *m, int tag, mstate state, uint64_t *bytes) {
  size_t n = 0;
  if (bytes) *bytes = 0;
  for (size_t i = 0; i < m->mapped_n; i++)
    if (m->mapped[i]->tag == tag && m->mapped[i]->state == state) {
      n++;
      if (bytes) *bytes += m->mapped[i]->extent;
    }
  return n;
}

/* Pause of every live allocation of a tag. Refused, with no driver call and nothing changed,
 * for a tag no allocation ever carried, a bad mode, or no live allocation with the tag. Else,
 * in address order: each one's handles become idle (the newest of their sizes, in address
 * order) inside a retaining scope and are released outside one; the record and its range stay,
 * paused, unmapped. BACKUP only where the tag holds little: the fake copies every byte. */
static vmm_status op_pause(run *r) {
  model *m = &r->m;
  int t = per_mille(50) ? TAG_NEVER : (int)below(TAGS);
  uint64_t live_bytes;
  size_t n = tag_records(m, t, M_LIVE, &live_bytes);
  int mode = per_mille(20) ? 7 : per_mille(300) && live_bytes <= 16 * MiB ? VMM_PAUSE_BACKUP : VMM_PAUSE_DISCARD;
  snprintf(step_what, sizeof step_what, "pause %s (mode %d, %zu live, %llu bytes)", t ? tag_names[t] : "untagged",
           mode, n, (unsigned long long)live_bytes);
  size_t calls = driver_calls();
  vmm_status st = vmm_arena_pause(r->a, tag_names[t], (vmm_pause_mode)mode);
  if (mode > VMM_PAUSE_BACKUP || !n) { /* checked before anything is touched */
    r->bad_calls++;
    EXPECT_EQ(st, VMM_ERR_INVALID_ARGUMENT);
    if (!r->deferred_at_start) EXPECT_EQ(driver_calls(), calls);
    return st;
  }
  if (disturbed(r)) {
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER || st == VMM_ERR_SCOPE_STATE);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  r->pauses++;
  for (size_t i = 0; i < m->mapped_n; i++) { /* address order, as the arena pauses them */
    mrec *x = m->mapped[i];
    if (x->tag != t || x->state != M_LIVE) continue;
    stat(m, x, -1);
    live_remove(m, x);
    x->state = M_PAUSED;
    stat(m, x, +1);
    m->paused_n++;
    m->mapped_bytes -= x->extent;
    /* Its handles were cut for another scope's peak (or not at all): like a free of it. */
    if (retaining(m) && r->w.on && x->scope != m->scope_id) r->w.made_before += x->extent;
    if (retaining(m)) {
      for (uint32_t h = 0; h < x->nh; h++) idle_put(m, x->hs[h], x->kind);
    } else {
      m->physical -= x->extent;
    }
    x->nh = 0;
    EXPECT_EQ(fake_mapped_size_at(x->base), 0);
    const vmm_mapping *y = vmm_table_find(&r->a->table, x->base);
    EXPECT(y != NULL && y->state == VMM_MAP_PAUSED && y->handle_count == 0 && y->extent == x->extent);
    EXPECT((y->backup != NULL) == (mode == VMM_PAUSE_BACKUP));
  }
  return st;
}

/* Resume of every paused allocation of a tag. A refusal (a tag never carried, nothing paused)
 * makes no driver call and changes nothing. Otherwise the model does not plan the assemblies;
 * it checks what must hold and adopts the arena's state: in address order, the allocations
 * resumed are live again at their bases with their extents mapped, the rest (after a refusal
 * for the limit or a fault) still paused; physical memory grew by at most the extents
 * resumed; no other allocation changed state, except pooled mappings taken apart. */
static vmm_status op_resume(run *r) {
  model *m = &r->m;
  int t = per_mille(50) ? TAG_NEVER : (int)below(TAGS);
  uint64_t paused_bytes;
  size_t n = tag_records(m, t, M_PAUSED, &paused_bytes);
  snprintf(step_what, sizeof step_what, "resume %s (%zu paused, %llu bytes, scope %s)", t ? tag_names[t] : "untagged",
           n, (unsigned long long)paused_bytes, m->scope_active ? "active" : "none");
  size_t calls = driver_calls();
  uint64_t physical_before = r->a->physical_bytes, refusals_before = r->a->limit_refusals;
  vmm_status st = vmm_arena_resume(r->a, tag_names[t]);
  if (!n) {
    r->bad_calls++;
    EXPECT_EQ(st, VMM_ERR_INVALID_ARGUMENT);
    if (!r->deferred_at_start) EXPECT_EQ(driver_calls(), calls);
    return st;
  }
  int upset = disturbed(r);
  if (upset) EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER || st == VMM_ERR_SCOPE_STATE);
  else EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY);
  r->resumed = 1;
  r->resumes += st == VMM_OK;
  r->ooms += st == VMM_ERR_OUT_OF_MEMORY;
  uint64_t resumed_bytes = 0;
  int stopped = 0;
  for (size_t i = 0; i < m->mapped_n; i++) {
    const mrec *x = m->mapped[i];
    const vmm_mapping *y = vmm_table_find(&r->a->table, x->base);
    if (!y && (x->state == M_POOLED || r->deferred_at_start)) continue; /* taken apart, or a deferred free done */
    EXPECT(y != NULL);
    EXPECT_EQ(y->extent, x->extent);
    if (x->tag != t || x->state != M_PAUSED) {
      if (!r->deferred_at_start) EXPECT_EQ(state_of(y->state), x->state); /* deferred frees are processed first */
      continue;
    }
    if (y->state == VMM_MAP_LIVE) {
      EXPECT(!stopped); /* the allocations are resumed in address order */
      EXPECT(y->handle_count > 0 && y->backup == NULL);
      EXPECT_EQ(tu_mapped_from((void *)(uintptr_t)x->base, x->extent), x->extent);
      resumed_bytes += x->extent;
    } else {
      EXPECT_EQ(y->state, VMM_MAP_PAUSED);
      if (!stopped && !upset) { /* the first one left paused was refused new memory by the limit */
        uint64_t held = r->a->physical_bytes;
        EXPECT(held > m->limit || x->extent > m->limit - held);
        EXPECT_EQ(r->a->limit_refusals, refusals_before + 1);
      }
      if (!upset) EXPECT(y->handle_count == 0);
      stopped = 1;
    }
  }
  EXPECT_EQ(stopped, st != VMM_OK);
  if (!upset) EXPECT(r->a->physical_bytes <= physical_before + resumed_bytes);
  return st;
}

/* Free of a paused allocation: no driver call, its range returns, the record goes. */
static vmm_status op_free_paused(run *r) {
  model *m = &r->m;
  size_t k = below(m->paused_n);
  mrec *x = NULL;
  for (size_t i = 0; i < m->mapped_n && !x; i++)
    if (m->mapped[i]->state == M_PAUSED && !k--) x = m->mapped[i];
  EXPECT(x != NULL);
  snprintf(step_what, sizeof step_what, "free paused 0x%llx (%zu bytes, %u handles)", (unsigned long long)x->base,
           x->extent, x->nh);
  size_t calls = driver_calls();
  vmm_status st = vmm_arena_free(r->a, (void *)(uintptr_t)x->base, random_stream());
  if (disturbed(r) || x->nh) { /* a failed copy back left it mapped: the free unmaps it */
    r->resumed = 1; /* adopt */
    EXPECT(st == VMM_OK || st == VMM_ERR_OUT_OF_MEMORY || st == VMM_ERR_DRIVER);
    return st;
  }
  EXPECT_EQ(st, VMM_OK);
  EXPECT_EQ(driver_calls(), calls);
  EXPECT(vmm_table_find(&r->a->table, x->base) == NULL);
  r->paused_frees++;
  m->frees++;
  stat(m, x, -1);
  m->paused_n--;
  mapped_remove(m, x);
  mrec_free(x);
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
  m->scope_peak = m->physical;
  m->scope_id = ++m->next_scope_id;
  m->begun++;
  r->began = 1;
  return st;
}

static vmm_status op_finish(run *r) {
  model *m = &r->m;
  snprintf(step_what, sizeof step_what, "finish (scope %s, %llu pooled, %zu idle)", m->scope_active ? "active" : "none",
           (unsigned long long)pool_count(m), m->idle_n);
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
  while (m->bucket_n) { /* drained into the idle tier, then released with it */
    mrec *x = m->buckets[m->bucket_n - 1].head;
    pool_remove(m, x);
    mapped_remove(m, x);
    m->mapped_bytes -= x->extent;
    m->physical -= x->extent;
    EXPECT_EQ(fake_mapped_size_at(x->base), 0);
    m->serial += x->nh;
    mrec_free(x);
  }
  m->physical -= m->idle_bytes;
  idle_clear(m);
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
    mrec *x = m->buckets[m->bucket_n - 1].head;
    pool_remove(m, x);
    x->state = M_ABANDONED;
    stat(m, x, +1);
  }
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    m->kind[k].abandoned_count += m->kind[k].idle_count;
    m->kind[k].abandoned_bytes += m->kind[k].idle_bytes;
  }
  idle_clear(m);
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

/* ---- Watching scopes ------------------------------------------------------------------ */

static void watch_begin(run *r, const vmm_snapshot *s) {
  const model *m = &r->m;
  memset(&r->w, 0, sizeof r->w);
  r->w.on = 1;
  r->w.peak_at_begin = s->physical_peak_bytes;
  r->w.physical_peak = s->physical_bytes;
  r->w.live_peak = m->live_rounded;
  r->w.held_at_begin = s->physical_bytes > m->live_rounded ? s->physical_bytes - m->live_rounded : 0;
}

static void watch_step(run *r, const vmm_snapshot *s, uint64_t physical_before, uint64_t peak_before,
                       uint64_t live_before, int upset, int resumed) {
  scope_watch *w = &r->w;
  const model *m = &r->m;
  /* The highest physical figure of the step: the end, or a new arena peak reached inside it. */
  uint64_t step_peak = s->physical_bytes;
  if (s->physical_peak_bytes > peak_before && s->physical_peak_bytes > step_peak) step_peak = s->physical_peak_bytes;
  if (step_peak > w->physical_peak) w->physical_peak = step_peak;
  if (m->live_rounded > w->live_peak) w->live_peak = m->live_rounded;
  if (upset || resumed) {
    uint64_t grew = step_peak > physical_before ? step_peak - physical_before : 0;
    uint64_t live = m->live_rounded > live_before ? m->live_rounded - live_before : 0;
    *(upset ? &w->disturbed : &w->resumed) += grew > live ? grew - live : 0;
  }
}

/* The scope ended: the promise, with what is outside it named. */
static void watch_end(run *r) {
  scope_watch *w = &r->w;
  w->on = 0;
  uint64_t bound = model_bound(&r->m, 0);
  uint64_t outside =
      w->held_at_begin + w->made_before + w->aborted_freed + w->package_off + w->fallback_padding + w->disturbed +
      w->resumed;
  uint64_t own_peak = w->physical_peak > outside ? w->physical_peak - outside : 0;
  if (bound > bound_for(own_peak)) { /* a bound chosen for memory this scope cannot use */
    outside += w->stranded;
    r->scopes_inflated++;
  } else {
    w->stranded = 0;
  }
  uint64_t allowed = (uint64_t)(1.02 * (double)w->live_peak) + bound + outside;
  if (w->physical_peak > allowed) {
    fprintf(stderr,
            "scope %llu: physical peak %llu > 1.02 x live peak %llu + bound %llu + outside %llu (held at begin %llu, "
            "made before %llu, aborted and freed %llu, package assembly off %llu, fallback padding %llu, disturbed "
            "%llu, resumed %llu, stranded under a larger peak's bound %llu)\n",
            (unsigned long long)r->m.scope_id, (unsigned long long)w->physical_peak, (unsigned long long)w->live_peak,
            (unsigned long long)bound, (unsigned long long)outside, (unsigned long long)w->held_at_begin,
            (unsigned long long)w->made_before, (unsigned long long)w->aborted_freed, (unsigned long long)w->package_off,
            (unsigned long long)w->fallback_padding, (unsigned long long)w->disturbed, (unsigned long long)w->resumed,
            (unsigned long long)w->stranded);
    EXPECT(!"the physical peak of the scope is within the promise");
  }
  r->scopes_checked++;
  r->scopes_with_outside += outside > 0;
  if (w->live_peak) {
    double ratio = ((double)w->physical_peak - (double)bound - (double)outside) / (double)w->live_peak;
    if (ratio > r->worst_ratio) r->worst_ratio = ratio;
  }
  if (allowed - w->physical_peak < r->worst_slack) r->worst_slack = allowed - w->physical_peak;
}

/* ---- Arenas -------------------------------------------------------------------------- */

static void arena_new(run *r) {
  static const size_t limits[] = {256 * MiB, 1 * GiB, 4 * GiB};
  static const size_t bounds[] = {2 * MiB, 6 * MiB, 8 * MiB, 32 * MiB};
  fake_options o = {.record_calls = -1};
  fake_driver_reset(&o);
  vmm_config cfg = tu_config();
  unsigned pick = (unsigned)below(10);
  cfg.reuse = pick < 5   ? VMM_REUSE_EXACT
              : pick < 7 ? VMM_REUSE_BOUNDED
              : pick < 9 ? VMM_REUSE_BEST_FIT
                         : VMM_REUSE_NONE;
  cfg.reuse_bound = per_mille(500) ? 2.0 : 1.5;
  cfg.handle_bound_bytes = per_mille(750) ? 0 : bounds[below(4)];
  cfg.package_assembly = per_mille(850);
  cfg.retain = per_mille(900) ? VMM_RETAIN_ON : VMM_RETAIN_OFF;
  cfg.limit_bytes = limits[below(3)];
  cfg.driver = fake_driver();
  vmm_status st = vmm_arena_create(&cfg, &r->a);
  if (st != VMM_OK) fprintf(stderr, "vmm_arena_create: %s\n", vmm_create_error());
  assert_int_equal(st, VMM_OK);
  model_free(&r->m);
  r->m.policy = cfg.reuse;
  r->m.bound = cfg.reuse_bound;
  r->m.handle_bound = cfg.handle_bound_bytes;
  r->m.package_assembly = cfg.package_assembly;
  r->m.retention = cfg.retain == VMM_RETAIN_ON;
  r->m.limit = cfg.limit_bytes;
  r->w.on = 0;
  r->arenas++;
}

static void arena_end(run *r) {
  snprintf(step_what, sizeof step_what, "destroy");
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(r->a, &s), VMM_OK);
  r->hits += s.pool_hits;
  r->fallbacks += s.pool_fallbacks;
  r->assemblies += s.assemblies;
  r->padded += s.padded_assemblies;
  r->finishes += s.scopes_finished;
  r->aborts += s.scopes_aborted;
  char why[256] = "";
  int rc = vmm_arena_check(r->a, why, sizeof why);
  if (rc) fprintf(stderr, "vmm_arena_check: %s\n", why);
  EXPECT_EQ(rc, 0);
  vmm_arena_destroy(r->a);
  r->a = NULL;
  r->w.on = 0; /* a scope still open is not judged */
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
  r.worst_slack = UINT64_MAX;
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
    r.began = 0;
    r.resumed = 0;
    uint64_t physical_before = r.a->physical_bytes, peak_before = r.a->physical_peak, live_before = m->live_rounded;
    CUresult code = per_mille(20) ? arm_fault() : CUDA_SUCCESS;

    unsigned pick = (unsigned)below(1000);
    int alloc = pick < 480 ? m->live_n < LIVE_TARGET : pick < 930 && !m->live_n;
    vmm_status st;
    if (alloc) st = op_alloc_tagged(&r, random_size(), per_mille(750) ? VMM_KIND_TRANSIENT : VMM_KIND_PACKAGE);
    else if (pick < 930) st = m->paused_n && per_mille(100) ? op_free_paused(&r) : op_free(&r);
    else if (pick < 940 && m->paused_n < 64) st = op_pause(&r); /* paused records stay few: checks walk them all */
    else if (pick < 950) st = op_resume(&r);
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
    if (upset || r.resumed) {
      r.disturbed_steps += upset;
      adopt(m, r.a, &s);
    } else {
      check_predicted(m, &s);
    }
    if (!has_deferred(m)) check_tags(m, r.a);
    check_common(r.a, m, &s);
    if (step_no % DEEP_CHECK_EVERY == 0) {
      check_idle_deep(m, r.a);
      r.deep_checks++;
    }

    /* The physical limit, scope by scope. */
    if (r.w.on) watch_step(&r, &s, physical_before, peak_before, live_before, upset, r.resumed);
    if (r.w.on && !m->scope_active) watch_end(&r);
    if (r.began && watched(m)) watch_begin(&r, &s);
  }
  arena_end(&r);
  model_free(&r.m);
  printf("test_random: %llu arenas, %llu scopes finished, %llu aborted; %llu pool hits, %llu fallbacks, %llu "
         "assemblies (%llu padded), %llu out-of-memory results, %llu bad calls; %llu faults fired, %llu disturbed "
         "steps; %llu deep checks of the idle tier\n",
         (unsigned long long)r.arenas, (unsigned long long)r.finishes, (unsigned long long)r.aborts,
         (unsigned long long)r.hits, (unsigned long long)r.fallbacks, (unsigned long long)r.assemblies,
         (unsigned long long)r.padded, (unsigned long long)r.ooms, (unsigned long long)r.bad_calls,
         (unsigned long long)r.faults, (unsigned long long)r.disturbed_steps, (unsigned long long)r.deep_checks);
  printf("test_random: %llu pauses, %llu resumes, %llu frees of paused allocations\n", (unsigned long long)r.pauses,
         (unsigned long long)r.resumes, (unsigned long long)r.paused_frees);
  printf("test_random: physical limit checked in %llu scopes (%llu with memory outside the promise, %llu with a "
         "bound above their own peak's); worst (peak - bound - outside) / live peak %.4f, least room left %.1f MiB\n",
         (unsigned long long)r.scopes_checked, (unsigned long long)r.scopes_with_outside,
         (unsigned long long)r.scopes_inflated, r.worst_ratio,
         r.scopes_checked ? (double)r.worst_slack / (double)MiB : 0.0);
  assert_true(r.scopes_checked > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(random_operations)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
