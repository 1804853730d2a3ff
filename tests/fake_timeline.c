/* The fake driver's device timeline: happens-before as vector clocks, accesses by physical
 * handle and offset, and the violations fake_timeline.h lists. Called by fake_driver.c with
 * its lock held. */
#include "fake_timeline.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TL_STREAMS 128   /* streams one test may use */
#define TL_TEXTS 32      /* violations whose text is kept */
#define TL_TEXT_BYTES 480

/* clock[s]: the epochs of stream s known to have run before (every access of s numbered at
 * most that). */
typedef uint64_t tl_clock[TL_STREAMS];

typedef struct tl_access_record {
  size_t off, len;
  CUdeviceptr va;     /* where it was reached */
  uint64_t owner;     /* the allocation it belongs to; 0: the allocator's own copy */
  uint64_t epoch, op; /* its epoch on its stream; its number among all operations */
  uint32_t stream;
  const char *what;   /* "kernel", "replayed kernel", "copy" */
} tl_access_record;

struct tl_records {
  tl_access_record *a;
  size_t n, cap;
  int served; /* some access came: the memory served an allocation */
};

typedef struct tl_event {
  CUevent e;
  tl_clock vc; /* the stream's clock at its record */
} tl_event;

/* A stream taking part in a capture: the capture's id and the stream's current dependency set
 * (the nodes its next captured operation will depend on). */
typedef struct tl_capture {
  CUstream s;
  uint64_t id;
  CUgraphNode *deps;
  size_t n, cap;
} tl_capture;

/* A node of a capture graph: its dependencies (in tl.node_deps) and, for a kernel, what it
 * touches (len 0: not a kernel). Its handle is (CUgraphNode)(index + 1). */
typedef struct tl_node {
  uint64_t capture;
  size_t dep_at, n_deps;
  tl_kernel k;
  CUstream s;
} tl_node;

typedef struct tl_graph {
  uint64_t id;
  tl_kernel *k;
  size_t n;
} tl_graph_t;

typedef struct tl_guard {
  int (*forbids)(void *ctx);
  void *ctx;
} tl_guard;

static struct {
  CUstream stream[TL_STREAMS];
  size_t streams;
  tl_clock vc[TL_STREAMS];
  tl_clock host; /* what the host knows complete */
  tl_event *events;
  size_t n_events, cap_events;
  tl_capture *captures;
  size_t n_captures, cap_captures;
  tl_graph_t *graphs;
  size_t n_graphs, cap_graphs;
  tl_node *nodes;
  size_t n_nodes, cap_nodes;
  CUgraphNode *node_deps;
  size_t n_node_deps, cap_node_deps;
  uint64_t next_graph, last_graph, next_owner, ops, next_capture;
  size_t count[FAKE_VIOLATION_KINDS], total;
  char text[TL_TEXTS][TL_TEXT_BYTES];
  tl_guard guard[FAKE_MAX_DEVICES];
} tl;

static void *grow(void *array, size_t n, size_t *cap, size_t elem) {
  if (n < *cap) return array;
  size_t c = *cap ? *cap * 2 : 8;
  void *p = realloc(array, c * elem);
  if (!p) {
    fputs("fake_timeline: out of host memory\n", stderr);
    abort();
  }
  *cap = c;
  return p;
}

void tl_reset(void) {
  for (size_t i = 0; i < tl.n_captures; i++) free(tl.captures[i].deps);
  for (size_t i = 0; i < tl.n_graphs; i++) free(tl.graphs[i].k);
  free(tl.nodes);
  free(tl.node_deps);
  free(tl.events);
  free(tl.captures);
  free(tl.graphs);
  memset(&tl, 0, sizeof tl);
}

void tl_violation(fake_violation_kind kind, const char *fmt, ...) {
  tl.count[kind]++;
  if (tl.total < TL_TEXTS) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl.text[tl.total], TL_TEXT_BYTES, fmt, ap);
    va_end(ap);
  }
  tl.total++;
}

/* ---- Clocks ---------------------------------------------------------------------------- */

static int is_legacy(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY; }

static uint32_t stream_index(CUstream s) {
  if (is_legacy(s)) s = NULL;
  for (uint32_t i = 0; i < tl.streams; i++)
    if (tl.stream[i] == s) return i;
  if (tl.streams == TL_STREAMS) {
    fprintf(stderr, "fake_timeline: more than %d streams in one test\n", TL_STREAMS);
    abort();
  }
  tl.stream[tl.streams] = s;
  memset(tl.vc[tl.streams], 0, sizeof(tl_clock));
  return (uint32_t)tl.streams++;
}

static void join(tl_clock into, const tl_clock from) {
  for (size_t i = 0; i < tl.streams; i++)
    if (from[i] > into[i]) into[i] = from[i];
}

/* The clock of stream i as the host issues work to it: after everything the host knows. */
static uint64_t *issue(uint32_t i) {
  join(tl.vc[i], tl.host);
  return tl.vc[i];
}

static tl_event *event_of(CUevent e, int create) {
  for (size_t i = 0; i < tl.n_events; i++)
    if (tl.events[i].e == e) return &tl.events[i];
  if (!create) return NULL;
  tl.events = grow(tl.events, tl.n_events, &tl.cap_events, sizeof *tl.events);
  tl_event *ev = &tl.events[tl.n_events++];
  memset(ev, 0, sizeof *ev);
  ev->e = e;
  return ev;
}

void tl_event_record(CUevent e, CUstream s) {
  uint64_t *c = issue(stream_index(s));
  memcpy(event_of(e, 1)->vc, c, sizeof(tl_clock));
}

void tl_stream_wait_event(CUstream s, CUevent e) {
  uint64_t *c = issue(stream_index(s));
  tl_event *ev = event_of(e, 0);
  if (ev) join(c, ev->vc); /* never recorded: nothing to wait for */
}

void tl_stream_synchronize(CUstream s) { join(tl.host, tl.vc[stream_index(s)]); }

void tl_ctx_synchronize(void) {
  for (size_t i = 0; i < tl.streams; i++) join(tl.host, tl.vc[i]);
}

void tl_event_completed(CUevent e) {
  tl_event *ev = event_of(e, 0);
  if (ev) join(tl.host, ev->vc);
}

void tl_event_destroy(CUevent e) {
  tl_event *ev = event_of(e, 0);
  if (ev) *ev = tl.events[--tl.n_events];
}

static void capture_join(CUstream waiter, CUstream waited);

void tl_program_wait(CUstream waiter, CUstream waited) {
  uint32_t d = stream_index(waited);
  join(issue(stream_index(waiter)), tl.vc[d]);
  capture_join(waiter, waited);
}

/* ---- Accesses -------------------------------------------------------------------------- */

static int happened_before(const tl_access_record *r, const tl_clock c) { return c[r->stream] >= r->epoch; }

static const char *describe(const tl_access_record *r, char *buf, size_t cap) {
  char who[40] = "the allocator";
  if (r->owner) snprintf(who, sizeof who, "owner %llu", (unsigned long long)r->owner);
  snprintf(buf, cap, "%s #%llu of %s on stream %p (VA 0x%llx)", r->what, (unsigned long long)r->op, who,
           (void *)tl.stream[r->stream], (unsigned long long)r->va);
  return buf;
}

static void check_and_record(const tl_access_record *x, const tl_piece *p) {
  if (!*p->acc) *p->acc = calloc(1, sizeof **p->acc);
  tl_records *r = *p->acc;
  const uint64_t *c = tl.vc[x->stream];
  size_t kept = 0;
  for (size_t i = 0; i < r->n; i++) {
    tl_access_record *old = &r->a[i];
    int overlaps = old->off < x->off + x->len && x->off < old->off + old->len;
    if (overlaps && (!x->owner || old->owner != x->owner) && !happened_before(old, c)) {
      char a[160], b[160];
      tl_violation(FAKE_VIOLATION_REUSE,
                   "%s touches handle %llu [0x%zx, +%zu B) after %s with no happens-before edge between them",
                   describe(x, a, sizeof a), p->handle, x->off, x->len, describe(old, b, sizeof b));
    }
    /* x stands for an access it covers through the same mapping and comes after: checks of later
     * accesses and of this mapping's unmap find x instead. Through another mapping it stays, for
     * its own mapping's unmap. */
    int covered = old->off >= x->off && old->off + old->len <= x->off + x->len && old->va - old->off == x->va - x->off;
    if (!(covered && happened_before(old, c))) r->a[kept++] = *old;
  }
  r->n = kept;
  r->a = grow(r->a, r->n, &r->cap, sizeof *r->a);
  r->a[r->n++] = *x;
  r->served = 1;
}

void tl_access(CUstream stream, uint64_t owner, const char *what, const tl_piece *p, size_t n) {
  uint32_t s = stream_index(stream);
  uint64_t *c = issue(s);
  c[s]++;
  tl_access_record x = {0, 0, 0, owner, c[s], ++tl.ops, s, what};
  for (size_t i = 0; i < n; i++) {
    x.off = p[i].off, x.len = p[i].len, x.va = p[i].va;
    check_and_record(&x, &p[i]);
  }
}

/* The first record of *acc (through [va, va + len) when len > 0) not known complete, or NULL. */
static const tl_access_record *incomplete(tl_records *const *acc, CUdeviceptr va, size_t len) {
  if (!*acc) return NULL;
  for (size_t i = 0; i < (*acc)->n; i++) {
    const tl_access_record *r = &(*acc)->a[i];
    if ((!len || (r->va >= va && r->va < va + len)) && !happened_before(r, tl.host)) return r;
  }
  return NULL;
}

/* After the check, the accesses through the range go: each was known complete (or flagged), so
 * the host, and every access it launches later, is ordered after them. */
void tl_unmap(tl_records **acc, CUdeviceptr va, size_t len, unsigned long long handle) {
  const tl_access_record *r = incomplete(acc, va, len);
  char b[160];
  if (r)
    tl_violation(FAKE_VIOLATION_UNMAP, "unmap of 0x%llx+%zu (handle %llu) while %s is not known complete",
                 (unsigned long long)va, len, handle, describe(r, b, sizeof b));
  if (!*acc) return;
  size_t kept = 0;
  for (size_t i = 0; i < (*acc)->n; i++)
    if (!((*acc)->a[i].va >= va && (*acc)->a[i].va < va + len)) (*acc)->a[kept++] = (*acc)->a[i];
  (*acc)->n = kept;
}

void tl_release(tl_records **acc, unsigned long long handle, size_t size, int device) {
  tl_guard *g = device >= 0 && device < FAKE_MAX_DEVICES ? &tl.guard[device] : NULL;
  int served = *acc && (*acc)->served; /* memory an allocation used, not one an undo gives back unused */
  if (served && g && g->forbids && g->forbids(g->ctx))
    tl_violation(FAKE_VIOLATION_SCOPE_RELEASE, "release of handle %llu (%zu B) inside a retaining scope, before finish",
                 handle, size);
  const tl_access_record *r = incomplete(acc, 0, 0);
  char b[160];
  if (r)
    tl_violation(FAKE_VIOLATION_RELEASE, "release of handle %llu while %s is not known complete", handle,
                 describe(r, b, sizeof b));
}

void tl_forget(tl_records **acc) {
  if (!*acc) return;
  free((*acc)->a);
  free(*acc);
  *acc = NULL;
}

void tl_set_guard(int device, int (*forbids)(void *ctx), void *ctx) {
  if (device >= 0 && device < FAKE_MAX_DEVICES) tl.guard[device] = (tl_guard){forbids, ctx};
}

void tl_device_closed(int device) { tl_set_guard(device, NULL, NULL); }

/* ---- Graphs ----------------------------------------------------------------------------
 * A capture is a graph of nodes. A stream that starts capturing (fake_set_capturing) begins a
 * capture of its own with an empty dependency set; a stream that the program orders after a
 * capturing one (fake_program_wait: an event recorded on the capturing stream, which captures
 * its set, and waited for) joins that capture, and its set gains the other's. Each captured
 * kernel becomes a node that depends on its stream's set, which then is {that node}. When the
 * stream that began a capture stops capturing, every stream of the capture stops, and the
 * graph's kernels, in the order they were captured (a topological order), are what a launch
 * replays. A captured kernel that touches bytes an earlier kernel of the capture (of another
 * owner) touched, with no path of dependencies from it, is a REUSE violation. */

static tl_capture *capture_of(CUstream s) {
  for (size_t i = 0; i < tl.n_captures; i++)
    if (tl.captures[i].s == s) return &tl.captures[i];
  return NULL;
}

static tl_capture *capture_add(CUstream s, uint64_t id) {
  tl.captures = grow(tl.captures, tl.n_captures, &tl.cap_captures, sizeof *tl.captures);
  tl.captures[tl.n_captures] = (tl_capture){s, id, NULL, 0, 0};
  return &tl.captures[tl.n_captures++];
}

static void deps_add(tl_capture *c, CUgraphNode node) {
  for (size_t i = 0; i < c->n; i++)
    if (c->deps[i] == node) return;
  c->deps = grow(c->deps, c->n, &c->cap, sizeof *c->deps);
  c->deps[c->n++] = node;
}

static void capture_join(CUstream waiter, CUstream waited) {
  tl_capture *found = capture_of(waited), *into = capture_of(waiter);
  if (!found || (into && into->id != found->id)) return; /* nothing captured, or two captures: no graph edge */
  size_t from = (size_t)(found - tl.captures); /* an index: capture_add may move the array */
  if (!into) into = capture_add(waiter, found->id);
  for (size_t i = 0; i < tl.captures[from].n; i++) deps_add(into, tl.captures[from].deps[i]);
}

/* The graph of capture `id`: its kernels in the order they were captured. */
static void make_graph(uint64_t id) {
  size_t n = 0;
  tl_kernel *k = NULL;
  for (size_t i = 0; i < tl.n_nodes; i++)
    if (tl.nodes[i].capture == id && tl.nodes[i].k.len) {
      k = realloc(k, (n + 1) * sizeof *k);
      if (!k) abort();
      k[n++] = tl.nodes[i].k;
    }
  tl.graphs = grow(tl.graphs, tl.n_graphs, &tl.cap_graphs, sizeof *tl.graphs);
  tl.graphs[tl.n_graphs++] = (tl_graph_t){++tl.next_graph, k, n};
  tl.last_graph = tl.next_graph;
}

void tl_capture_state(CUstream s, int capturing) {
  tl_capture *c = capture_of(s);
  if (capturing && !c) {
    capture_add(s, ++tl.next_capture);
  } else if (!capturing && c) {
    uint64_t id = c->id;
    make_graph(id);
    for (size_t i = tl.n_captures; i-- > 0;)
      if (tl.captures[i].id == id) {
        free(tl.captures[i].deps);
        tl.captures[i] = tl.captures[--tl.n_captures];
      }
  }
}

int tl_capturing(CUstream s) { return capture_of(s) != NULL; }
size_t tl_capturing_streams(void) { return tl.n_captures; }

static tl_node *node_of(CUgraphNode node) {
  uintptr_t i = (uintptr_t)node;
  return i >= 1 && i <= tl.n_nodes ? &tl.nodes[i - 1] : NULL;
}

/* Marks in seen[] every node that node i depends on, directly or not. */
static void ancestors(size_t i, unsigned char *seen) {
  const tl_node *n = &tl.nodes[i];
  for (size_t d = 0; d < n->n_deps; d++) {
    size_t j = (uintptr_t)tl.node_deps[n->dep_at + d] - 1;
    if (!seen[j]) seen[j] = 1, ancestors(j, seen);
  }
}

/* The race check of a new kernel node (the last) against the earlier kernels of its capture. */
static void check_captured(size_t x) {
  const tl_node *n = &tl.nodes[x];
  unsigned char *seen = NULL;
  for (size_t i = 0; i < x; i++) {
    const tl_node *o = &tl.nodes[i];
    int overlaps = o->k.len && o->k.ptr < n->k.ptr + n->k.len && n->k.ptr < o->k.ptr + o->k.len;
    if (o->capture != n->capture || !overlaps || (n->k.owner && o->k.owner == n->k.owner)) continue;
    if (!seen) {
      if (!(seen = calloc(x + 1, 1))) abort();
      ancestors(x, seen);
    }
    if (!seen[i])
      tl_violation(FAKE_VIOLATION_REUSE,
                   "captured kernel of owner %llu on stream %p touches 0x%llx+%zu with no path of dependencies from "
                   "the captured kernel of owner %llu on stream %p",
                   (unsigned long long)n->k.owner, (void *)n->s, (unsigned long long)n->k.ptr, n->k.len,
                   (unsigned long long)o->k.owner, (void *)o->s);
  }
  free(seen);
}

int tl_capture_kernel(CUstream stream, CUdeviceptr ptr, size_t n, uint64_t owner) {
  tl_capture *c = capture_of(stream);
  if (!c) return 0;
  tl.nodes = grow(tl.nodes, tl.n_nodes, &tl.cap_nodes, sizeof *tl.nodes);
  tl.nodes[tl.n_nodes] = (tl_node){c->id, tl.n_node_deps, c->n, {ptr, n, owner}, stream};
  for (size_t i = 0; i < c->n; i++) {
    tl.node_deps = grow(tl.node_deps, tl.n_node_deps, &tl.cap_node_deps, sizeof *tl.node_deps);
    tl.node_deps[tl.n_node_deps++] = c->deps[i];
  }
  tl.n_nodes++;
  c->n = 0;
  deps_add(c, (CUgraphNode)(uintptr_t)tl.n_nodes);
  check_captured(tl.n_nodes - 1);
  return 1;
}

int tl_capture_info(CUstream s, uint64_t *id, const CUgraphNode **deps, size_t *n) {
  tl_capture *c = capture_of(s);
  if (!c) return 0;
  *id = c->id, *deps = c->deps, *n = c->n;
  return 1;
}

int tl_node_deps(CUgraphNode node, const CUgraphNode **deps, size_t *n) {
  tl_node *x = node_of(node);
  if (!x) return -1;
  *deps = tl.node_deps + x->dep_at, *n = x->n_deps;
  return 0;
}

const tl_kernel *tl_graph(uint64_t graph, size_t *n) {
  for (size_t i = 0; i < tl.n_graphs; i++)
    if (tl.graphs[i].id == graph) {
      *n = tl.graphs[i].n;
      return tl.graphs[i].k;
    }
  *n = 0;
  return NULL;
}

uint64_t tl_last_graph(void) { return tl.last_graph; }
uint64_t tl_owner_new(void) { return ++tl.next_owner; }

/* ---- Violations ------------------------------------------------------------------------ */

size_t tl_violations(fake_violation_kind kind) { return kind == FAKE_VIOLATION_KINDS ? tl.total : tl.count[kind]; }

const char *tl_violation_text(size_t i) { return i < tl.total && i < TL_TEXTS ? tl.text[i] : NULL; }

void tl_violations_clear(void) {
  memset(tl.count, 0, sizeof tl.count);
  tl.total = 0;
}
