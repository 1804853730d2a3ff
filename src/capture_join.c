/* Reuse inside a capture once the streams join, as PyTorch's allocator does with
 * graph_capture_record_stream_reuse. Memory of a graph's pool freed during a capture with work
 * on other streams (freed on another stream, or used there: record_stream) keeps, as its free
 * markers, each of those streams' capture dependencies at the free (cuStreamGetCaptureInfo). A
 * request on a stream of the same capture may take it once every marker is reached backwards,
 * through the graph's edges (cuGraphNodeGetDependencies), from the request stream's own
 * dependencies: the request's next node then runs after every use. Nothing is recorded on,
 * waited from or synchronized on any stream: these are queries of the graph being built. Where
 * the driver lacks the queries, markers overflow or a walk runs past its bound, the answer is
 * "not yet", and the memory waits for the capture to end as before (stream_order.c). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define JOIN_WALK 256  /* the most nodes one walk visits */
#define JOIN_FANIN 32  /* the most dependencies of one node a walk follows */

static bool has_queries(const vmm_arena *a) {
  return a->drv->version >= 4 && a->drv->stream_get_capture_info && a->drv->graph_node_get_dependencies;
}

/* An edge the next node waits on fully: default type, from the whole upstream node. */
static bool full_edge(const CUgraphEdgeData *edges, size_t i) {
  return !edges || (edges[i].type == CU_GRAPH_DEPENDENCY_TYPE_DEFAULT && edges[i].from_port == 0);
}

/* s's capture id and dependencies: false where s does not capture or cannot be asked. */
static bool capture_info(vmm_arena *a, CUstream s, cuuint64_t *id, const CUgraphNode **deps,
                         const CUgraphEdgeData **edges, size_t *n) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  *deps = NULL, *edges = NULL, *n = 0, *id = 0;
  CUresult r = VMM_DRV(a, stream_get_capture_info, s, &status, id, NULL, deps, edges, n);
  return r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE && *id && (*deps || !*n);
}

/* Adds s's dependencies to j's markers: false where they do not fit. */
static bool add_markers(vmm_join *j, CUstream s, const CUgraphNode *deps, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (j->n == VMM_JOIN_MARKERS) return false;
    j->marks[j->n++] = (vmm_join_marker){s, deps[i]};
  }
  return true;
}

void vmm_join_record(vmm_arena *a, vmm_join *j, vmm_pool_id pool, CUstream freeing, const CUstream *uses,
                     uint32_t n_uses) {
  j->capture = 0, j->n = 0;
  if (!vmm_policy_of(a)->joins_captures || !a->captures_underway || pool == VMM_POOL_SHARED || !has_queries(a)) return;
  cuuint64_t capture = 0;
  for (int64_t i = -1; i < (int64_t)n_uses; i++) {
    CUstream s = i < 0 ? freeing : uses[i];
    cuuint64_t id;
    const CUgraphNode *deps;
    const CUgraphEdgeData *edges;
    size_t n;
    if (!capture_info(a, s, &id, &deps, &edges, &n) || (capture && id != capture) || !add_markers(j, s, deps, n)) {
      j->n = 0; /* a stream outside the capture, or too many markers: after the capture's end */
      return;
    }
    capture = id;
  }
  j->capture = capture;
}

/* The nodes a walk has reached (an open-addressing set) and those still to expand; one per
 * arena (a->join_walk), used under the arena lock. */
typedef struct vmm_join_walk {
  CUgraphNode seen[2 * JOIN_WALK];
  CUgraphNode todo[JOIN_WALK];
  size_t n_seen, n_todo;
} walk;

/* The arena's walk, emptied; made on the first walk: NULL on host OOM. */
static walk *walk_begin(vmm_arena *a) {
  if (!a->join_walk && !(a->join_walk = malloc(sizeof *a->join_walk))) return NULL;
  walk *w = a->join_walk;
  memset(w->seen, 0, sizeof w->seen);
  w->n_seen = w->n_todo = 0;
  return w;
}

void vmm_join_fini(vmm_arena *a) {
  free(a->join_walk);
  a->join_walk = NULL;
}

/* Adds a node to the walk unless reached already: false once the walk would pass its bound. */
static bool reach(walk *w, CUgraphNode node) {
  size_t i = ((uintptr_t)node >> 4 ^ (uintptr_t)node) % (2 * JOIN_WALK);
  while (w->seen[i] && w->seen[i] != node) i = (i + 1) % (2 * JOIN_WALK);
  if (w->seen[i]) return true;
  if (w->n_seen == JOIN_WALK) return false;
  w->seen[i] = node, w->n_seen++;
  w->todo[w->n_todo++] = node;
  return true;
}

/* Crosses off the markers (not of the request's stream) that are `node`; returns how many. */
static uint32_t cross_off(const vmm_join *j, CUstream stream, CUgraphNode node, bool *found) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < j->n; i++)
    if (!found[i] && j->marks[i].stream != stream && j->marks[i].node == node) found[i] = true, n++;
  return n;
}

/* Reaches the dependencies of `node` over full edges: false where they are too many, cannot
 * be read, or pass the walk's bound. */
static bool expand(vmm_arena *a, walk *w, CUgraphNode node) {
  CUgraphNode deps[JOIN_FANIN + 1];
  CUgraphEdgeData edges[JOIN_FANIN + 1];
  size_t n = JOIN_FANIN + 1;
  memset(edges, 0, sizeof edges);
  if (VMM_DRV(a, graph_node_get_dependencies, node, deps, edges, &n) != CUDA_SUCCESS || n > JOIN_FANIN) return false;
  for (size_t i = 0; i < n; i++)
    if (deps[i] && full_edge(edges, i) && !reach(w, deps[i])) return false;
  return true;
}

bool vmm_join_reached(vmm_arena *a, const vmm_join *j, CUstream stream) {
  if (!j->capture || !has_queries(a)) return false;
  bool found[VMM_JOIN_MARKERS] = {false};
  uint32_t left = 0;
  for (uint32_t i = 0; i < j->n; i++) left += j->marks[i].stream != stream;
  cuuint64_t id;
  const CUgraphNode *deps;
  const CUgraphEdgeData *edges;
  size_t n;
  if (!capture_info(a, stream, &id, &deps, &edges, &n) || id != j->capture) return false;
  if (!left) return true; /* every use was on the request's stream: stream order */
  walk *w = walk_begin(a);
  bool ok = w != NULL;
  for (size_t i = 0; ok && i < n; i++) ok = !full_edge(edges, i) || reach(w, deps[i]);
  while (ok && left && w->n_todo) {
    CUgraphNode node = w->todo[--w->n_todo];
    left -= cross_off(j, stream, node, found);
    ok = !left || expand(a, w, node);
  }
  return ok && !left;
}
