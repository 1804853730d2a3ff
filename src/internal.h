/* Internal types and helpers of the vmmarena core. Not installed. */
#ifndef VMMARENA_INTERNAL_H
#define VMMARENA_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h> /* close: vmm_ipc_forget_handle */

#include "vmmarena.h"
#include "vmmarena/trace.h"

#define VMM_INTERNAL __attribute__((visibility("hidden")))

#ifndef NDEBUG
#include <assert.h>
#define vmm_assert(cond) assert(cond)
#else
#define vmm_assert(cond) ((void)0)
#endif
#define vmm_container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* Room in `array` (of `elem`-byte elements, `count` used, *cap allocated) for one more: the
 * array itself, or a copy with twice the capacity (8 at first; *cap raised). NULL on host
 * out-of-memory, with the array and *cap unchanged. */
static inline void *vmm_array_room(void *array, size_t count, size_t *cap, size_t elem) {
  if (count < *cap) return array;
  size_t grown_cap = *cap ? *cap * 2 : 8;
  void *grown = realloc(array, grown_cap * elem);
  if (grown) *cap = grown_cap;
  return grown;
}

/* One block per file below, in the order of the layers: containers, the driver and messages
 * first, then handles, mapping records, ranges, the store, pages, stream order, retiring and
 * unmapping, the arena itself and its policy table, and the policy files (assembly, arena,
 * scope) last. A block holds its file's types (a type several files use sits with the file
 * that owns its state) and the declarations of its functions.
 *
 * An internal function's prefix names its file (SQLite's rule; tests/structure-check holds it):
 * every function declared here and defined in src/X.c is vmm_X_<verb...>, or vmm_<short>_ where
 * X has a short form, all of them in this table:
 *
 *   stream_order.c   vmm_order_       capture_join.c   vmm_join_
 *   mapping_table.c  vmm_table_       copy_engine.c    vmm_copier_
 *   tags.c           vmm_tag_
 *
 * "Pool" alone is the tier of idle mappings (vmm_pool, store.c); a graph's pool (the public
 * vmm_pool_id) is a "graph pool" in every internal name (m->graph_pool, released_graph_pools). */

/* ---- AVL tree: intrusive, keyed by (k1, k2), keys unique (avl.c) --------------------- */

typedef struct vmm_avl {
  struct vmm_avl *left, *right;
  int height;
  uint64_t k1, k2; /* ordering key, compared lexicographically */
} vmm_avl;

VMM_INTERNAL vmm_avl *vmm_avl_insert(vmm_avl *root, vmm_avl *node);
/* Removes the node with the key (which must exist); returns the new root. */
VMM_INTERNAL vmm_avl *vmm_avl_remove(vmm_avl *root, uint64_t k1, uint64_t k2);
VMM_INTERNAL vmm_avl *vmm_avl_find(vmm_avl *root, uint64_t k1, uint64_t k2);
/* Smallest node with key >= (k1, k2), or NULL. */
VMM_INTERNAL vmm_avl *vmm_avl_ceil(vmm_avl *root, uint64_t k1, uint64_t k2);
/* Largest node with key <= (k1, k2), or NULL. */
VMM_INTERNAL vmm_avl *vmm_avl_floor(vmm_avl *root, uint64_t k1, uint64_t k2);
VMM_INTERNAL vmm_avl *vmm_avl_last(vmm_avl *root);
/* Checks heights, balance and order; returns the node count or -1 if broken. */
VMM_INTERNAL long vmm_avl_check(const vmm_avl *root);

/* ---- Id sets: a sorted array of 64-bit ids (ids.c) ----------------------------------- */

typedef struct vmm_id_set {
  uint64_t *ids; /* ascending */
  size_t count, cap;
} vmm_id_set;

VMM_INTERNAL bool vmm_ids_has(const vmm_id_set *s, uint64_t id);
/* Adds id (a no-op if present); -1 on host out-of-memory, nothing changed. */
VMM_INTERNAL int vmm_ids_add(vmm_id_set *s, uint64_t id);
VMM_INTERNAL void vmm_ids_fini(vmm_id_set *s);

/* ---- Hash table of 64-bit keys (mapping_table.c) ------------------------------------- */

/* A hash table from 64-bit keys to non-NULL pointers (mapping_table.c): the arena's mapping
 * records by base address, and the trace pointers of vmmarena-replay. */
typedef struct vmm_table {
  uint64_t *keys;
  void **vals; /* NULL: an empty slot */
  size_t cap, count;
} vmm_table;

VMM_INTERNAL int vmm_table_init(vmm_table *t);
VMM_INTERNAL void vmm_table_fini(vmm_table *t);
/* The value of key, or NULL. */
VMM_INTERNAL void *vmm_table_find(const vmm_table *t, uint64_t key);
/* Reserves room for one (n) more entries so that the next inserts cannot fail. */
VMM_INTERNAL int vmm_table_reserve(vmm_table *t);
VMM_INTERNAL int vmm_table_reserve_n(vmm_table *t, size_t n);
/* Inserts a key that is absent, with a non-NULL value, into room reserved before. */
VMM_INTERNAL void vmm_table_insert(vmm_table *t, uint64_t key, void *value);
/* Removes key; returns its value, or NULL if it was absent. */
VMM_INTERNAL void *vmm_table_remove(vmm_table *t, uint64_t key);
/* The mapping record whose extent contains ptr (O(n), error paths only), or NULL. */
VMM_INTERNAL struct vmm_mapping *vmm_table_containing(const vmm_table *t, CUdeviceptr ptr);
#define vmm_table_foreach(t, i, m) \
  for (size_t i = 0; i < (t)->cap; i++) if (((m) = (t)->vals[i]) != NULL)

/* ---- Driver calls: timing, counters, context (driver.c) ------------------------------ */

VMM_INTERNAL uint64_t vmm_driver_now_ns(void);
VMM_INTERNAL void vmm_driver_account(vmm_arena *a, vmm_driver_entry e, CUresult r, uint64_t t0);
/* Makes the arena's context current on this thread for the rest of the public call. */
VMM_INTERNAL void vmm_driver_ctx_enter(vmm_arena *a);
/* Pops the context if this public call pushed it. */
VMM_INTERNAL void vmm_driver_ctx_leave(vmm_arena *a);

/* The counting wrapper: calls a driver entry point through the arena's table, timed and
 * counted. Every driver call goes through it (VMM_DRV adds the arena's context). */
#define VMM_DRV_COUNTED(a, field, ...)                                  \
  __extension__({                                                       \
    uint64_t vmm_t0_ = vmm_driver_now_ns();                                    \
    CUresult vmm_r_ = (a)->drv->field(__VA_ARGS__);                     \
    vmm_driver_account((a), VMM_DRV_##field, vmm_r_, vmm_t0_);             \
    vmm_r_;                                                             \
  })

/* A driver call with the arena's context current on this thread. */
#define VMM_DRV(a, field, ...)                                          \
  __extension__({                                                       \
    vmm_driver_ctx_enter(a);                                                   \
    VMM_DRV_COUNTED(a, field, __VA_ARGS__);                             \
  })

/* ---- Errors and messages (errors.c) -------------------------------------------------- */

/* The driver's name of r ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUDA_ERROR_UNRECOGNIZED". */
VMM_INTERNAL const char *vmm_errors_cu_name(vmm_arena *a, CUresult r);

/* Formats bytes as "7.1 GiB", "512.0 MiB", "1023 B": the largest binary unit (up to PiB) that
 * keeps the number at 1 or more, one decimal. */
VMM_INTERNAL const char *vmm_errors_fmt_bytes(uint64_t bytes, char buf[32]);
/* The same with `gib_decimals` decimals from GiB up ("8.49 GiB": vmmarena-replay's table). */
VMM_INTERNAL const char *vmm_errors_fmt_bytes_decimals(uint64_t bytes, int gib_decimals, char buf[32]);
VMM_INTERNAL vmm_status vmm_errors_fail(vmm_arena *a, vmm_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a failed driver call: sticky fatal unless it is out of memory. Returns the status. */
VMM_INTERNAL vmm_status vmm_errors_fail_driver(vmm_arena *a, CUresult r, vmm_driver_entry e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Appends "arena holds ..." to buf. */
VMM_INTERNAL void vmm_errors_describe_holdings(const vmm_arena *a, char *buf, size_t cap);
VMM_INTERNAL void vmm_errors_log(int level, int threshold, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
VMM_INTERNAL const char *vmm_errors_kind_name(int kind);

/* ---- Host memory (meminfo.c) --------------------------------------------------------- */

VMM_INTERNAL CUresult vmm_meminfo_available(size_t *bytes);

/* ---- Tags (tags.c) ------------------------------------------------------------------- */

VMM_INTERNAL uint32_t vmm_tag_current_id(void);
VMM_INTERNAL const char *vmm_tag_name(uint32_t id);
/* The interned id of a tag name, or 0 with *known = false if the name was never used. */
VMM_INTERNAL uint32_t vmm_tag_lookup(const char *name, bool *known);

/* ---- Trace writer (trace.c) ---------------------------------------------------------- */

/* Writes one operation of the arena to its trace, if one is open: one argument per field of
 * the line (docs/trace.md). kind -1: none; tag 0: none; pool 0 for ops that name no pool. */
VMM_INTERNAL void vmm_trace_arena_op(vmm_arena *a, vmm_trace_op op, int kind, size_t requested, size_t rounded,
                                     CUdeviceptr ptr, CUstream stream, uint32_t tag, vmm_pool_id pool,
                                     vmm_status result);
/* The limit in force as a set-limit record. */
VMM_INTERNAL void vmm_trace_arena_limit(vmm_arena *a);
/* Opens path as the arena's trace (a->trace, which must be NULL), its first record the limit
 * in force if there is one; false with errno set if the file cannot be opened. */
VMM_INTERNAL bool vmm_trace_arena_open(vmm_arena *a, const char *path);

/* ---- Free markers of a capture, reuse after a join (capture_join.c) ------------------ */

#define VMM_JOIN_MARKERS 8 /* markers one free keeps; past them, reuse waits for the capture's end */

/* A stream that used freed memory, and one node of its capture dependencies at the free. */
typedef struct vmm_join_marker {
  CUstream stream;
  CUgraphNode node;
} vmm_join_marker;

/* The free markers of memory freed during a capture: capture 0 where none were recorded. */
typedef struct vmm_join {
  uint64_t capture;
  uint32_t n;
  vmm_join_marker marks[VMM_JOIN_MARKERS];
} vmm_join;

/* At a free of memory of graph pool `pool` during a capture (whole-process mode): records in
 * *j the capture dependencies of `freeing` and of each of `uses` (the streams whose work the
 * reuse must follow). Where the driver lacks the capture-graph queries, a stream is not in the
 * capture, or the markers do not fit, *j records none (reuse after the capture ends). */
VMM_INTERNAL void vmm_join_record(vmm_arena *a, vmm_join *j, vmm_pool_id pool, CUstream freeing, const CUstream *uses,
                                  uint32_t n_uses);
/* Whether memory with markers *j may serve a request on `stream` now: `stream` captures in the
 * same capture and each marker of another stream is reached backwards from its dependencies
 * (a bounded walk: past its bound, not yet). Asked only by vmm_order_may_serve (answer A). */
VMM_INTERNAL bool vmm_join_reached(vmm_arena *a, const vmm_join *j, CUstream stream);
/* Destroy: frees the arena's walk (a->join_walk). */
VMM_INTERNAL void vmm_join_fini(vmm_arena *a);

/* ---- Handles (handle.c) -------------------------------------------------------------- */

/* One physical allocation (cuMemCreate), always mapped whole. Outside a mapping it sits in the
 * idle store's idle tier (keyed by size) or on the abandoned list. */
typedef struct vmm_handle {
  vmm_avl node;                    /* (size, serial) while in the idle tier */
  CUmemGenericAllocationHandle h;
  size_t size;
  vmm_kind kind;                   /* the kind its bytes are counted under while idle */
  bool taken;                      /* chosen by the assembly being planned */
  bool idle;                       /* in the idle tier */
  struct vmm_handle *next;         /* abandoned list */
  struct vmm_mapping *owner;       /* the mapping whose handles it is; NULL while idle */
  int ipc_fd;                      /* its exported descriptor + 1, closed at release; 0: none (ipc.c) */
} vmm_handle;

/* A handle object of `size` bytes (no physical memory yet), or NULL. */
VMM_INTERNAL vmm_handle *vmm_handle_new(size_t size, vmm_kind kind);
/* Creates h's physical memory (cuMemCreate) and counts it. */
VMM_INTERNAL CUresult vmm_handle_create(vmm_arena *a, vmm_handle *h);
/* The one release (cuMemRelease): frees h. A failure keeps h idle (finish or destroy tries
 * again) and is recorded; during destroy it is logged and h forgotten. */
VMM_INTERNAL vmm_status vmm_handle_release(vmm_arena *a, vmm_handle *h);

/* The largest handle to create inside a scope for `fresh` new bytes: the configured bound, or
 * where the arena chooses, the largest power of two at most 1/64 of the scope's physical peak
 * (or of `fresh`, if more), within [granularity, 256 MiB] (docs/design.md, "Handle bound").
 * Outside a scope: the bound a scope begun now would start with. */
VMM_INTERNAL size_t vmm_handle_bound(const vmm_arena *a, size_t fresh);

/* ---- Mapping records (mapping.c) ----------------------------------------------------- */

/* Where a mapping record is, in each state (set only in mapping.c). Every record, in every
 * state, is in the mapping table (a->table, by base) from vmm_mapping_insert_live until one of
 * the vmm_mapping_end_* (the ways a record ends, listed below the transitions); the other
 * structures that can hold one are the pool (a bucket's list), the deferred list, a page set (through its page), an assembly's plan
 * and a pause or resume's list. Retiring ranges, the idle tier and the unmapper hold ranges and
 * handles, never records: a record whose range retires leaves the table (end_retiring, split_off),
 * and a revived range gets a new one. A record's graph pool (`graph_pool`) is a field, not a
 * place. Meaningful in every state: base, extent, kind, tag, reservation, scope_id, graph_pool, handles
 * (in address order; none while PAUSED), before (a tail, below).
 *
 *   LIVE       table only; a carved page (sub-state: `page` set) is also in its page set
 *              (pages.c: the set's partial list while a slot is free). requested, stream (of
 *              the request), uses (record_stream) are the allocation's.
 *   POOLED     table + the pool: bucket, pool_next, pool_prev; stream, free_seq
 *              and uses describe the free. Sub-states: "out of the pool" (bucket NULL: a hit,
 *              an assembly or a drain has removed it and changes its state, or pushes it back,
 *              before the lock is released; vmm_mapping_in_pool); "chosen" (in an assembly's
 *              plan, p->apart[], during vmm_assembly_build only: `chosen`, and `early` where its range
 *              is to retire mapped rather than be unmapped).
 *   FREEING    table only: a free synchronizes `stream` with the lock released.
 *   DEFERRED   table + the deferred list (a->deferred_head, linked by pool_next): freed on a
 *              capturing `stream`, pooled or unmapped once the capture ends (stream_order.c).
 *   ABANDONED  table only, still mapped: its scope was aborted; destroy unmaps it.
 *   PAUSED     table only, no handles (unless a failed resume mapped them again), `backup`
 *              set under VMM_PAUSE_BACKUP. Sub-state `kept` (vmm_mapping_kept): freed while its
 *              graph's pool lives; no longer an allocation, its range the pool's until resume
 *              pools it (LIVE and still kept for that moment, in the resume's call) or
 *              release_pool frees it.
 *   MOVING     table + the pause or resume call's list (pause.c), mapped: its contents are
 *              copied to or from `backup` outside the lock.
 *
 * Orthogonal to the state: a tail (`before` non-zero: split off in place after the mapping at
 * `before` by a run hit, merged back when both are pooled; vmm_mapping_tail). */
typedef enum vmm_mapping_state {
  VMM_MAP_LIVE,      /* handed out */
  VMM_MAP_POOLED,    /* idle in the pool, still mapped */
  VMM_MAP_FREEING,   /* a free is synchronizing its stream outside the lock */
  VMM_MAP_DEFERRED,  /* freed on a capturing stream; unmapped once capture is over */
  VMM_MAP_ABANDONED, /* belongs to an aborted scope: no driver call until destroy */
  VMM_MAP_PAUSED,    /* paused: range and record kept, no handles (pause.c) */
  VMM_MAP_MOVING     /* mapped, its contents copied to or from its backup outside the lock (pause.c) */
} vmm_mapping_state;

struct vmm_bucket;

typedef struct vmm_mapping {
  CUdeviceptr base;
  size_t extent;          /* full mapped size (sum of handles) */
  size_t requested;       /* bytes of the current (or last) request */
  vmm_kind kind;
  vmm_mapping_state state;
  uint32_t tag;           /* interned tag id, 0 = none */
  uint32_t reservation;   /* reservation holding the range */
  uint64_t scope_id;      /* scope it was allocated in (0 = outside any) */
  CUstream stream;        /* stream of the latest alloc or free */
  uint64_t free_seq;      /* the arena's count of pooled frees at its latest free (quiesce, fences, marks) */
  vmm_pool_id graph_pool; /* the graph's pool it belongs to (VMM_POOL_SHARED: none) */
  struct vmm_page *page;  /* the page carved from it (pages.c), or NULL */
  CUstream *uses;         /* streams added by vmm_arena_record_stream (heap array), ordered before reuse */
  uint32_t use_count;
  uint32_t handle_count;  /* > 1 for an assembled mapping */
  vmm_handle **handles;   /* in address order: &first, or a heap array */
  vmm_handle *first;
  struct vmm_mapping *pool_next, *pool_prev; /* bucket list while POOLED; deferred list while DEFERRED */
  struct vmm_bucket *bucket;
  bool chosen;            /* POOLED, in the plan of the assembly under way (only during vmm_assembly_build) */
  bool early;             /* chosen before its free's work was known complete: its range retires */
  CUdeviceptr before;     /* a tail, split off in place after the mapping at `before` by a run hit
                             (merged back with it when both are pooled); 0: not a tail */
  void *backup;           /* host copy of a paused allocation's contents (VMM_PAUSE_BACKUP; backup.c) */
  bool kept;              /* PAUSED and freed: its live graph pool keeps the range; resume pools it
                             (read through vmm_mapping_kept; cleared by vmm_arena_free_kept) */
  vmm_join join;          /* free markers of its latest free, if that came during a capture */
} vmm_mapping;

/* The sub-states of the comment above vmm_mapping_state, one accessor each. */
static inline bool vmm_mapping_kept(const vmm_mapping *m) { return m->kept; }
static inline bool vmm_mapping_in_pool(const vmm_mapping *m) { return m->state == VMM_MAP_POOLED && m->bucket; }
static inline bool vmm_mapping_tail(const vmm_mapping *m) { return m->before != 0; }

#define VMM_NO_STUCK SIZE_MAX /* first_stuck when no map call failed: the whole range is free */

/* An empty record (no handles), or NULL. */
VMM_INTERNAL vmm_mapping *vmm_mapping_new(void);
/* Frees the record and its backup, not its handles. */
VMM_INTERNAL void vmm_mapping_free_record(vmm_mapping *m);
/* qsort order of mapping record pointers: ascending base address. */
VMM_INTERNAL int vmm_mapping_by_base(const void *x, const void *y);
/* Maps handles back to back at base and grants access; undoes itself on failure (a handle
 * whose undo unmap fails is kept stuck). *failed names the entry point that failed. */
VMM_INTERNAL CUresult vmm_mapping_map_handles(vmm_arena *a, CUdeviceptr base, vmm_handle *const *h, uint32_t n, size_t extent,
                                      vmm_driver_entry *failed);
/* Gives m the handles in slots (a heap array of n, kept when n > 1, freed when n == 1). */
VMM_INTERNAL void vmm_mapping_attach(vmm_mapping *m, vmm_handle **slots, uint32_t n);

/* State transitions: the only functions that set m->state. */
/* A new record, mapped: into the table, LIVE. */
VMM_INTERNAL void vmm_mapping_insert_live(vmm_arena *a, vmm_mapping *m, size_t extent, vmm_kind kind);
/* LIVE (new) or POOLED (a hit) -> LIVE, handed to a request (its size, stream, tag and graph pool)
 * of scope `scope_id`; the streams added by vmm_arena_record_stream are forgotten. */
struct vmm_request;
VMM_INTERNAL void vmm_mapping_hand_out(vmm_arena *a, vmm_mapping *m, const struct vmm_request *req, uint64_t scope_id);
/* Adds a stream that uses m (vmm_arena_record_stream); -1 on host out-of-memory, nothing changed. */
VMM_INTERNAL int vmm_mapping_add_use(vmm_mapping *m, CUstream stream);
/* LIVE -> POOLED, freed on `stream`, numbered in a->free_seq. -1 (nothing changed) when
 * no bucket could be allocated. */
VMM_INTERNAL int vmm_mapping_pool(vmm_arena *a, vmm_mapping *m, CUstream stream);
/* LIVE -> DEFERRED (freed on a capturing stream; see vmm_order_deferred_push). */
VMM_INTERNAL void vmm_mapping_defer(vmm_arena *a, vmm_mapping *m, CUstream stream);
/* LIVE -> FREEING while a free synchronizes its stream unlocked, and back. */
VMM_INTERNAL void vmm_mapping_begin_freeing(vmm_arena *a, vmm_mapping *m);
VMM_INTERNAL void vmm_mapping_end_freeing(vmm_arena *a, vmm_mapping *m);
/* LIVE, POOLED or DEFERRED -> ABANDONED: no driver call until destroy. */
VMM_INTERNAL void vmm_mapping_abandon(vmm_arena *a, vmm_mapping *m);
/* LIVE -> PAUSED (already unmapped), keeping `backup` (or NULL); its bytes move to paused. */
VMM_INTERNAL void vmm_mapping_pause(vmm_arena *a, vmm_mapping *m, void *backup);
/* PAUSED (mapped again, contents back) or MOVING -> LIVE; the backup is freed. */
VMM_INTERNAL void vmm_mapping_resume(vmm_arena *a, vmm_mapping *m);
/* LIVE (to be paused) or PAUSED and mapped again (to be resumed) -> MOVING, while its contents
 * are copied outside the lock: a free or another pause or resume of it waits or is refused. */
VMM_INTERNAL void vmm_mapping_begin_moving(vmm_arena *a, vmm_mapping *m);
/* MOVING -> where it came from: LIVE (no backup), or PAUSED, mapped, with its backup. */
VMM_INTERNAL void vmm_mapping_end_moving(vmm_arena *a, vmm_mapping *m);

/* How a record ends: it leaves the table (destroy aside: the table goes with the arena) and is
 * freed (vmm_mapping_free_record); each way's name says what becomes of its range and handles.
 *   end_unmapped      after vmm_mapping_unmap: the range back to the free list (stuck pieces
 *                     aside), the handles kept idle or released;
 *   unmap_and_end     unmaps now, then end_unmapped (the one unmap-now; "retiring" ranges
 *                     instead stay mapped);
 *   end_into_grown    range still mapped and handles attached to nothing, for the mapping an
 *                     assembly grows in place over it (no driver call);
 *   end_retiring      range still mapped, handed to the retiring ranges with the free's work,
 *                     the handles an assembly left kept idle (no driver call);
 *   end_paused        a paused allocation freed: its handles (if any) unmapped and kept idle or
 *                     released, its range back;
 *   destroy           destroy only: everything unmapped and released, failures logged.
 * Two more take part of a record, which lives on: split_off (its first handles leave, the range
 * before them retires) and split_run (a run of its handles becomes a record of its own); and a
 * tail merged back (mapping.c, merge) ends in the record it merges into, range and handles moved. */

/* Unmaps m whole. Record before unmap: on failure nothing changes and the error is recorded. */
VMM_INTERNAL vmm_status vmm_mapping_unmap(vmm_arena *a, vmm_mapping *m, const char *what);
/* After the unmap: each handle still attached to m (non-NULL) is kept idle (retain) or
 * released, and m holds none. Returns the first release error (that handle stays idle). */
VMM_INTERNAL vmm_status vmm_mapping_drop_handles(vmm_arena *a, vmm_mapping *m, bool retain);
/* After the unmap: m leaves the counters, the table and its range (less the stuck pieces of
 * a failed map from index first_stuck on); its handles go as vmm_mapping_drop_handles says;
 * the record is freed. */
VMM_INTERNAL vmm_status vmm_mapping_end_unmapped(vmm_arena *a, vmm_mapping *m, bool retain, size_t first_stuck);
/* Pooled m (out of the pool), taken whole by an assembly that grows it in place: its record
 * leaves the counters and the table and is freed; its range stays mapped and its handles
 * attached to nothing, for the grown mapping to take. No driver call. */
VMM_INTERNAL void vmm_mapping_end_into_grown(vmm_arena *a, vmm_mapping *m);
/* Unmaps m now, then vmm_mapping_end_unmapped. *unmapped says whether the unmap happened. */
VMM_INTERNAL vmm_status vmm_mapping_unmap_and_end(vmm_arena *a, vmm_mapping *m, bool retain, const char *what, bool *unmapped);
/* Pooled m's handles not NULL'ed by an assembly are kept idle while its range stays mapped (retiring):
 * m leaves the counters and the table, and its range and the work of its free (its uses
 * array) go to *range for vmm_retiring_add. */
struct vmm_retiring_range;
VMM_INTERNAL void vmm_mapping_end_retiring(vmm_arena *a, vmm_mapping *m, struct vmm_retiring_range *range);
/* Pooled m (out of the pool) gave its first k handles to an assembly: they leave m, whose
 * range now starts after them; *range is the part before, for vmm_retiring_add, its work m's
 * free with `uses` (the caller's copy of m's uses, which the range then owns; NULL when m has
 * none). */
VMM_INTERNAL void vmm_mapping_split_off(vmm_arena *a, vmm_mapping *m, uint32_t k, CUstream *uses,
                                        struct vmm_retiring_range *range);
/* POOLED m (out of the pool) gives its handles [first, first + count), fewer than all, their own
 * record in place, returned: m itself where first is 0, else a new one after m, which keeps the
 * handles before. Those after become a POOLED record of their own in *after (NULL if none).
 * The new records have m's kind, graph pool, tag and free; the caller pools m and *after. NULL on host
 * out of memory, nothing changed. No driver call. */
VMM_INTERNAL vmm_mapping *vmm_mapping_split_run(vmm_arena *a, vmm_mapping *m, uint32_t first, uint32_t count,
                                                vmm_mapping **after);
/* Frees a paused allocation (ends its record): no driver call where it holds no memory; its
 * range returns. */
VMM_INTERNAL vmm_status vmm_mapping_end_paused(vmm_arena *a, vmm_mapping *m, bool retain);
/* PAUSED m, unmapped, freed while its graph's pool lives: it becomes `kept` (no longer an
 * allocation), its backup freed; it stays PAUSED under its tag so that resume maps it back. */
VMM_INTERNAL void vmm_mapping_keep(vmm_mapping *m);
/* Whether m is a live or paused allocation (a free or record_stream may name it). */
static inline bool vmm_mapping_allocated(const vmm_mapping *m) {
  return m->state == VMM_MAP_LIVE || (m->state == VMM_MAP_PAUSED && !vmm_mapping_kept(m));
}
/* Unmaps and releases everything of m, logging failures (destroy only). */
VMM_INTERNAL void vmm_mapping_destroy(vmm_arena *a, vmm_mapping *m);

/* ---- Counters (accounting.c) --------------------------------------------------------- */

VMM_INTERNAL void vmm_accounting_add_stat(vmm_arena *a, vmm_kind k, vmm_mapping_state s, size_t bytes, int sign);
VMM_INTERNAL void vmm_accounting_add_tag(vmm_arena *a, uint32_t tag, size_t bytes, int sign);
/* Moves bytes of a tag between live (paused = false) and paused. */
VMM_INTERNAL void vmm_accounting_move_tag_paused(vmm_arena *a, uint32_t tag, size_t bytes, int sign);
VMM_INTERNAL void vmm_accounting_add_physical(vmm_arena *a, size_t bytes);
VMM_INTERNAL void vmm_accounting_add_mapped(vmm_arena *a, size_t bytes);
/* The arena's usage figures (vmm_arena_usage, the snapshot's "usage"). */
VMM_INTERNAL void vmm_accounting_fill_usage(const vmm_arena *a, vmm_usage *u);

/* ---- VA ranges (ranges.c) ------------------------------------------------------------ */

typedef struct vmm_reservation {
  CUdeviceptr base;
  size_t size;
} vmm_reservation;

typedef struct vmm_free_range {
  vmm_avl by_addr; /* (base, 0) */
  vmm_avl by_size; /* (size, base) */
  CUdeviceptr base;
  size_t size;
  uint32_t reservation; /* index into ranges.reservations: ranges never merge across two */
} vmm_free_range;

typedef struct vmm_ranges {
  vmm_reservation *reservations;
  uint32_t reservation_count;
  size_t reservation_cap;
  vmm_avl *by_addr, *by_size;
  size_t free_bytes, reserved_bytes;
  size_t free_range_count;
  vmm_reservation *stuck;  /* handles a failed undo left mapped: VA kept out of the free list, unmapped at destroy */
  size_t stuck_count, stuck_cap, stuck_bytes;
} vmm_ranges;

VMM_INTERNAL vmm_status vmm_ranges_alloc(vmm_arena *a, size_t size, CUdeviceptr *base, uint32_t *reservation);
/* Whether [base, base + size) is free VA of `reservation` (a mapping next to it can grow there). */
VMM_INTERNAL bool vmm_ranges_is_free(const vmm_ranges *r, CUdeviceptr base, size_t size, uint32_t reservation);
/* Takes [base, base + size), which vmm_ranges_is_free said is free, out of the free list;
 * VMM_ERR_OUT_OF_MEMORY (host) leaves it free. */
VMM_INTERNAL vmm_status vmm_ranges_claim(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation);
VMM_INTERNAL void vmm_ranges_free(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation);
/* Unmaps the stuck pieces, then frees the reservations (destroy). */
VMM_INTERNAL void vmm_ranges_fini(vmm_arena *a);
VMM_INTERNAL int vmm_ranges_check(const vmm_ranges *r, char *why, size_t cap);
/* Records a handle whose undo unmap failed: it stays mapped, so its VA is not handed out
 * again; destroy unmaps it. */
VMM_INTERNAL void vmm_ranges_keep_stuck(vmm_arena *a, CUdeviceptr base, size_t size);
/* Bytes of stuck pieces inside [base, base + extent). */
VMM_INTERNAL size_t vmm_ranges_stuck_bytes_in(const vmm_ranges *r, CUdeviceptr base, size_t extent);
/* Unmaps the stuck pieces inside [base, base + extent) (a paused range about to be resumed). */
VMM_INTERNAL vmm_status vmm_ranges_unstick(vmm_arena *a, CUdeviceptr base, size_t extent);
/* Returns [base, base + extent) to the free list except the stuck pieces inside it recorded
 * from index first_stuck on (VMM_NO_STUCK: none). */
VMM_INTERNAL void vmm_ranges_free_unless_stuck(vmm_arena *a, CUdeviceptr base, size_t extent, uint32_t reservation,
                                               size_t first_stuck);

/* ---- The idle-handle store (store.c) ------------------------------------------------- */

/* Mapped tier: the pool of idle transient mappings, size buckets in an AVL tree keyed by
 * extent, each a LIFO list. */
typedef struct vmm_bucket {
  vmm_avl node;            /* (size, 0) */
  size_t size;
  vmm_mapping *head;       /* LIFO list; never NULL while the bucket is in the tree */
  size_t count;
  struct vmm_bucket *next_spare;
} vmm_bucket;

/* Invariant (maintained by push/remove, asserted where a bucket is read): every bucket in the
 * tree holds at least one mapping. Emptied buckets go to the spare list, so a hit and the
 * free that follows it allocate nothing. */
typedef struct vmm_pool {
  vmm_avl *root;
  size_t buckets, count, bytes;
  size_t handles;          /* handles of the pooled mappings */
  vmm_bucket *spare;
} vmm_pool;

/* Physical memory freed inside a scope: one store, indexed by size, in two tiers. */
typedef struct vmm_store {
  vmm_pool pool;           /* mapped tier: a hit hands a mapping back with no driver call */
  vmm_avl *idle;           /* idle tier: idle handles keyed by (size, serial) */
  size_t idle_count, idle_bytes;
  uint64_t serial;
  vmm_handle *abandoned;   /* handles of aborted scopes: no driver call until destroy */
  size_t abandoned_count, abandoned_bytes;
} vmm_store;

/* Returns true if `m` may be handed to `stream`; may order `stream` after m's free. */
typedef bool (*vmm_pool_usable_fn)(void *ctx, vmm_mapping *m);

VMM_INTERNAL int vmm_store_pool_push(vmm_pool *p, vmm_mapping *m);
/* A pooled mapping larger than `bytes` in which *count handles from *first on make from `bytes`
 * to `most` bytes, usable (looking at a bounded number of candidates, smallest buckets first; in
 * each, the first such run); removed and returned, or NULL. */
VMM_INTERNAL vmm_mapping *vmm_store_pool_take_run(vmm_pool *p, size_t bytes, size_t most, vmm_pool_usable_fn usable,
                                            void *ctx, uint32_t *first, uint32_t *count);
/* At least n buckets on the spare list, so that the next n pushes cannot fail: -1 on host OOM. */
VMM_INTERNAL int vmm_store_pool_reserve(vmm_pool *p, size_t n);
VMM_INTERNAL void vmm_store_pool_remove(vmm_pool *p, vmm_mapping *m);
/* Smallest bucket of size in [lo, hi] holding a usable mapping; removes and returns it. */
VMM_INTERNAL vmm_mapping *vmm_store_pool_take(vmm_pool *p, size_t lo, size_t hi, vmm_pool_usable_fn usable, void *ctx);
/* The drain order: head of the largest bucket. */
VMM_INTERNAL vmm_mapping *vmm_store_pool_peek_drain(const vmm_pool *p);
/* The bucket of the smallest size >= lo (upward) or <= lo (downward), or NULL. */
VMM_INTERNAL vmm_bucket *vmm_store_pool_bucket_near(const vmm_pool *p, size_t lo, bool upward);
VMM_INTERNAL void vmm_store_pool_fini(vmm_pool *p);
/* Checks the pool's invariants; returns 0 if sound. */
VMM_INTERNAL int vmm_store_pool_check(const vmm_pool *p, char *why, size_t cap);

/* Unmapped tier. put/take keep the arena's per-kind retained counters. */
VMM_INTERNAL void vmm_store_idle_put(vmm_arena *a, vmm_handle *h);
VMM_INTERNAL void vmm_store_idle_remove(vmm_arena *a, vmm_handle *h);
/* The largest idle handle of at most `most` bytes (removed), or NULL. */
VMM_INTERNAL vmm_handle *vmm_store_idle_take_at_most(vmm_arena *a, size_t most);
/* The smallest idle handle of at least `least` bytes (removed), or NULL. */
VMM_INTERNAL vmm_handle *vmm_store_idle_take_at_least(vmm_arena *a, size_t least);
/* The largest idle handle (not removed), or NULL: the release order of finish. */
VMM_INTERNAL vmm_handle *vmm_store_idle_largest(const vmm_arena *a);
/* Moves every unmapped idle handle to the abandoned list (abort: no driver call). */
VMM_INTERNAL void vmm_store_idle_abandon_all(vmm_arena *a);
/* Takes the next abandoned handle off the list (destroy), or NULL. */
VMM_INTERNAL vmm_handle *vmm_store_abandoned_pop(vmm_arena *a);
/* Checks both tiers and the abandoned list; adds their bytes to the recount. */
VMM_INTERNAL int vmm_store_check(const vmm_arena *a, vmm_kind_stats *k, uint64_t *physical, char *why, size_t cap);

/* ---- Pages (pages.c) ----------------------------------------------------------------- */

/* What a page serves: requests of one slot size, kind, tag, stream and graph pool. */
typedef struct vmm_page_key {
  size_t slot_size;
  vmm_kind kind;
  uint32_t tag;
  CUstream stream;
  vmm_pool_id graph_pool;
} vmm_page_key;

/* Another stream that uses a slot (vmm_arena_record_stream): on the page's list of uses while
 * the slot is taken; once it is freed, on its set's list of waits until the page's stream
 * waits for an event recorded on the other stream after the free, when the slot is given back. */
typedef struct vmm_slot_wait {
  struct vmm_page *page;
  uint32_t slot;
  CUstream stream;             /* the other stream */
  CUevent event;               /* recorded on it after the free; NULL before (or while it captured) */
  uint64_t seq;                /* the free's number in a->free_seq (0 while still a use) */
  struct vmm_slot_wait *next;
  vmm_join join;               /* its free markers, where the slot was freed during a capture */
} vmm_slot_wait;

typedef struct vmm_page_set {
  vmm_page_key key;
  struct vmm_page *partial;    /* pages with a free slot */
  vmm_slot_wait *waits;        /* freed slots waiting for other streams */
} vmm_page_set;

typedef struct vmm_page {
  vmm_mapping *m;              /* the one-granule mapping it carves */
  vmm_page_set *set;
  uint32_t slots, used;        /* used: taken, and freed but waiting */
  struct vmm_page *next, *prev; /* the set's partial list; the spare list */
  vmm_slot_wait *uses;         /* other streams of its taken slots */
  uint64_t bits[];             /* 1 = slot taken (slots bits) */
} vmm_page;

typedef struct vmm_pages {
  vmm_page_set **slots;        /* open-addressing table of sets by key */
  size_t cap, count;
  vmm_page *spare;             /* page records kept for the next carve */
  uint64_t pages, slots_used, slot_bytes;
} vmm_pages;

/* The slot size that serves a request of `bytes` (below half the granularity): 512-byte steps
 * up to 4 KiB, four steps per doubling up to 64 KiB, then the most slots that fit a page. */
VMM_INTERNAL size_t vmm_pages_slot_size(size_t granularity, size_t bytes);
/* A free slot of a page of `k`: *out its address. VMM_STATUS_COUNT when no page of `k` has one
 * (the caller carves one: the set and a record for it are ready); VMM_ERR_OUT_OF_MEMORY
 * (recorded) when the host has no memory for them. Slots that waited for other streams are
 * given back first, where those streams' events are complete (or, under
 * VMMARENA_STREAM_ORDER=event, once the page's stream waits for them). */
VMM_INTERNAL vmm_status vmm_pages_take(vmm_arena *a, const vmm_page_key *k, CUdeviceptr *out);
/* Cuts live mapping m (one granule) into slots of k->slot_size for `k`, with the record that
 * vmm_pages_take readied (or vmm_pages_uncarve left): it cannot fail. */
VMM_INTERNAL void vmm_pages_carve(vmm_arena *a, vmm_mapping *m, const vmm_page_key *k);
/* The page and slot of a taken slot starting at ptr, or NULL. */
VMM_INTERNAL vmm_page *vmm_pages_slot_of(const vmm_arena *a, CUdeviceptr ptr, uint32_t *slot);
/* Frees a slot: at once, or, where other streams were added to it, once their events recorded
 * now are complete (see vmm_pages_take). Returns true if the page is now empty. */
VMM_INTERNAL bool vmm_pages_give_back(vmm_arena *a, vmm_page *pg, uint32_t slot);
/* Adds `stream` to a taken slot's streams; -1 on host out-of-memory, nothing changed. */
VMM_INTERNAL int vmm_pages_add_use(vmm_page *pg, uint32_t slot, CUstream stream);
/* The last resort before a refusal: the page's stream of `k` waits for the events of its
 * waiting slots, which are given back. True if any was. */
VMM_INTERNAL bool vmm_pages_order_waits(vmm_arena *a, const vmm_page_key *k);
/* Gives back every waiting slot whose events are complete (or, under
 * VMMARENA_STREAM_ORDER=event, whose page's stream can wait for them now); with `wait` (the
 * cache being given back) the other streams that do not capture are first waited for on the
 * host. A failed synchronize is returned, the slots still waiting. */
VMM_INTERNAL vmm_status vmm_pages_settle(vmm_arena *a, bool wait);
/* A live page whose slots are all free (left so by a wait given back), or NULL. */
VMM_INTERNAL vmm_mapping *vmm_pages_find_empty(const vmm_arena *a);
/* An empty page back to a plain mapping (m->page NULL). */
VMM_INTERNAL void vmm_pages_uncarve(vmm_arena *a, vmm_mapping *m);
/* Destroy: forgets m's page and its waits (no driver call but the events' destruction). */
VMM_INTERNAL void vmm_pages_forget(vmm_arena *a, vmm_mapping *m);
VMM_INTERNAL void vmm_pages_fini(vmm_arena *a);
/* Checks page m (carved) and adds its taken bytes to *slot_bytes; 0 if sound. */
VMM_INTERNAL int vmm_pages_check(const vmm_arena *a, const vmm_mapping *m, uint64_t *slot_bytes, char *why, size_t cap);

/* ---- Stream order (stream_order.c) --------------------------------------------------- */

/* What is known of a stream's frees (one per stream asked about or waited for by another):
 * an event recorded when a free of it is asked about, queried when one is asked about again
 * (a free numbered at most `recorded` is complete once the event is; `completed` remembers the
 * highest such number); and the streams the program made wait for it (vmm_arena_stream_waited:
 * its frees numbered at most `mark` are ordered before their later work). */
#define VMM_FENCE_WAITERS 8
typedef struct vmm_fence {
  CUstream stream;
  CUevent event;      /* NULL until the first record */
  uint64_t recorded;  /* free_seq when the pending event was recorded; 0 if none is pending */
  uint64_t completed; /* every pooled free of the stream numbered at most this is complete */
  struct {
    CUstream stream;
    uint64_t mark; /* 0: the entry is unused */
  } waiters[VMM_FENCE_WAITERS]; /* when full, the lowest mark makes room */
} vmm_fence;

/* The work that may still use freed memory: what was queued on `stream` and on `uses` when
 * the free numbered `seq` (a->free_seq) came. A slot wait's work is its one other stream with
 * `event`, the wait's own event (recorded on it after the free; *event NULL before), which a
 * quiesce does not end; a mapping's or a range's has event NULL and is known complete by a
 * quiesce after it or through the fences. */
typedef struct vmm_free_work {
  CUstream stream;
  CUstream *uses;
  uint32_t use_count;
  uint64_t seq;
  CUevent *event;
} vmm_free_work;

/* Whether `s` is capturing a graph; the legacy stream counts as capturing while another stream
 * captures (a synchronous call on it would join the capture). Returns a failed query's result. */
VMM_INTERNAL CUresult vmm_order_capture_query(vmm_arena *a, CUstream s, bool *capturing);
/* 1 if the stream is capturing (or its state cannot be read), 0 if not. */
VMM_INTERNAL int vmm_order_capturing(vmm_arena *a, CUstream s);
typedef struct vmm_reuse_ctx {
  vmm_arena *a;
  CUstream stream;
  int capturing;  /* -1 unknown */
  bool by_event;  /* the stream may be made to wait for an event recorded after a free */
  bool anywhere;  /* for any stream, unordered (stream unused): the work must be known complete */
} vmm_reuse_ctx;
/* The reuse context of a request on `stream`. Orders by event outside whole-process mode, under
 * VMMARENA_STREAM_ORDER=event, or as the `last_resort` of whole-process mode. */
VMM_INTERNAL vmm_reuse_ctx vmm_order_reuse_on(vmm_arena *a, CUstream stream, bool last_resort);
/* The context of a use by any stream with no order (an idle handle, a capture's take of shared
 * memory, an unmap): vmm_order_may_serve then asks only whether the work is known complete. */
VMM_INTERNAL vmm_reuse_ctx vmm_order_reuse_anywhere(vmm_arena *a);
/* THE ONE ANSWER to "may memory freed with work *w serve a request on c->stream now?"; every
 * reuse asks it: pooled mappings (arena.c hit_usable, assembly.c can_take_apart and
 * graph_takes_apart), retired ranges and their givers (retiring.c), page slots' waits (pages.c
 * release_waits). Yes when the work, on every stream of it (the freeing stream, each
 * record_stream use), is
 *  A. ordered before c->stream by the program (never where c->anywhere): the streams joined
 *     inside a capture (`markers`, the free markers, all reached from c->stream's capture
 *     dependencies: vmm_join_reached, capture_join.c); or the stream is c->stream; or, c->stream
 *     not capturing, the program made c->stream wait for it at a mark taken after the free
 *     (vmm_arena_stream_waited);
 *  B. or known complete, with no host wait: a quiesce came after the free (w->seq at most
 *     a->quiesced_seq); or, where !c->by_event, a fence event recorded on the stream after the
 *     free has completed (cuEventQuery; recorded here where none is pending), for a slot wait
 *     its own event (w->event; a quiesce does not end it);
 *  C. or, only where c->by_event (the policy orders by event, VMMARENA_STREAM_ORDER=event, or
 *     the last resort), ordered by an event of the arena's, neither stream capturing: c->stream
 *     is made to wait for an event recorded on the stream now (a slot wait's: that of its free).
 * Where c->anywhere only B is asked, of every stream (so that each fence is recorded).
 * Graph-pool membership, kind and a page's tag are not asked here: they are keys of the pool
 * and page sets (arena.c hit_usable, pages.c vmm_page_key). */
VMM_INTERNAL bool vmm_order_may_serve(vmm_reuse_ctx *c, const vmm_free_work *w, const vmm_join *markers);
/* The work of pooled mapping m's free, for vmm_order_may_serve (no copy of its uses). */
static inline vmm_free_work vmm_order_work_of(const vmm_mapping *m) {
  return (vmm_free_work){m->stream, m->uses, m->use_count, m->free_seq, NULL};
}
/* True if m's freeing stream could be waited for now (not capturing), or need not be. */
VMM_INTERNAL bool vmm_order_can_wait_for_free(vmm_arena *a, const vmm_mapping *m);
/* Before pooled mapping m is unmapped (by finish or assembly): waits for the work of the
 * stream that freed it, which may still use it, unless a quiesce came after the free or that
 * stream is in waited[0, *n_waited) (it is added while there is room for `cap`). A capturing
 * stream cannot be waited for: VMM_ERR_SCOPE_STATE; a failed query or synchronize is a driver
 * error. Messages name the caller by `what`. */
VMM_INTERNAL vmm_status vmm_order_wait_for_free(vmm_arena *a, const vmm_mapping *m, const char *what, CUstream *waited,
                                          size_t *n_waited, size_t cap);
/* Waits for the work queued on `stream` (called without the arena's lock). */
VMM_INTERNAL CUresult vmm_order_stream_wait(vmm_arena *a, CUstream stream);
/* Waits for all work on the device; then every free so far is known complete
 * (a->quiesced_seq = a->free_seq). */
VMM_INTERNAL vmm_status vmm_order_quiesce(vmm_arena *a);
/* Destroy: waits for all work on the device and destroys the order event. */
VMM_INTERNAL void vmm_order_fini(vmm_arena *a);
/* The deferred list: frees on a capturing stream wait here (DEFERRED) for the capture to end. */
VMM_INTERNAL void vmm_order_deferred_push(vmm_arena *a, vmm_mapping *m, CUstream stream);
/* Unmaps the frees that waited for a capture to end, where the capture is over. */
VMM_INTERNAL void vmm_order_process_deferred(vmm_arena *a);
/* An event for a slot wait: a spare one, or a new one; NULL (recorded) on failure. */
VMM_INTERNAL CUevent vmm_order_event_get(vmm_arena *a);
/* Keeps an event for the next vmm_order_event_get (destroys it if there is no room). */
VMM_INTERNAL void vmm_order_event_put(vmm_arena *a, CUevent e);
/* Records e on `stream` (not capturing): true on success. */
VMM_INTERNAL bool vmm_order_event_record(vmm_arena *a, CUevent e, CUstream stream);
/* A slot wait's event: where *e is NULL and `s` does not capture, one recorded on `s` now; *e
 * stays NULL where it captures or the record fails (recorded as the arena's error). */
VMM_INTERNAL void vmm_order_slot_event(vmm_arena *a, CUevent *e, CUstream s);
/* Whether e is known complete (cuEventQuery answered success). */
VMM_INTERNAL bool vmm_order_event_complete(vmm_arena *a, CUevent e);
/* Makes `stream` wait for e: true on success. */
VMM_INTERNAL bool vmm_order_wait_event(vmm_arena *a, CUstream stream, CUevent e);
/* While a capture is underway (vmm_arena_capture_begin), sets this thread's capture mode to
 * relaxed for the rest of a public call, so that the arena's calls (memory creation, mapping,
 * event queries) do not invalidate a capture begun in global mode, as PyTorch's allocator does;
 * *saved keeps the mode to restore. Returns whether it did. */
VMM_INTERNAL bool vmm_order_capture_relax(vmm_arena *a, CUstreamCaptureMode *saved);
VMM_INTERNAL void vmm_order_capture_restore(vmm_arena *a, bool relaxed, CUstreamCaptureMode saved);
/* Moves the deferred frees of an aborted scope to its abandoned memory (no driver call). */
VMM_INTERNAL void vmm_order_deferred_abandon_scope(vmm_arena *a, uint64_t scope_id);

/* ---- Retiring ranges (retiring.c) ---------------------------------------------------- */

/* The old range of a pooled mapping whose handles were mapped into a new range before the
 * work of its free was known complete: mapped until that work completes. */
typedef struct vmm_retiring_range {
  CUdeviceptr base;
  size_t size;
  uint32_t reservation;
  vmm_pool_id graph_pool;   /* a graph's pool: the range retires only once the pool is released */
  vmm_free_work work; /* its uses array is the range's own */
  vmm_handle **handles; /* a whole shared mapping's handles, in address order (its own array):
                           the range may serve again; NULL otherwise */
  uint32_t handle_count;
  vmm_kind kind;
  uint64_t serial;    /* order of retiring, oldest first */
} vmm_retiring_range;

typedef struct vmm_retiring {
  vmm_retiring_range *items;
  size_t count, cap;
  size_t bytes;         /* VA of the ranges retiring */
  size_t revivable;     /* of them, with handles */
  uint64_t serial;      /* ranges handed to the list so far (vmm_retiring_add) */
  uint64_t revived;     /* ranges that served a request again */
  uint64_t revived_runs; /* of those, runs of a larger range's handles */
} vmm_retiring;

/* Room for n more retiring ranges, so that vmm_retiring_add cannot fail: -1 on host OOM. */
VMM_INTERNAL int vmm_retiring_reserve(vmm_arena *a, size_t n);
/* A range retires: it stays mapped until its work completes (room reserved first). */
VMM_INTERNAL void vmm_retiring_add(vmm_arena *a, const vmm_retiring_range *range);
/* Unmaps and frees the retiring ranges of the shared pool whose work is known complete (no
 * host wait). */
VMM_INTERNAL void vmm_retiring_settle(vmm_arena *a);
/* After the device's work (a quiesce): unmaps and frees the ranges a graph's pool kept. */
VMM_INTERNAL void vmm_retiring_release_graph_pool(vmm_arena *a, vmm_pool_id pool);
/* Waits for the work of every retiring range whose streams do not capture, then unmaps and
 * frees those ranges (finish, empty_cache, a refusal's release). */
VMM_INTERNAL vmm_status vmm_retiring_drain(vmm_arena *a, const char *what);
/* Destroy, after all work: unmaps every retiring range, logging failures. */
VMM_INTERNAL void vmm_retiring_fini(vmm_arena *a);
/* Unmaps the retired ranges that hold any of these handles (about to be released, after the
 * work of their mapping, which came after those ranges' work); a failed unmap keeps the range
 * stuck and is logged. */
VMM_INTERNAL void vmm_retiring_unmap_holding(vmm_arena *a, vmm_handle *const *h, uint32_t n, const char *what);
struct vmm_request;
/* Whole-process mode: a retired range of exactly the request's size (or, with `part`, a run of
 * the handles of a larger one), whose handles are all idle or held by pooled mappings that may
 * give them on the request's stream: those mappings retire in its place and it serves the
 * request, mapped as it was (no driver call); the parts of the range before and after the run
 * stay retired. VMM_OK with *out live, or VMM_STATUS_COUNT when none serves, nothing changed. */
VMM_INTERNAL vmm_status vmm_retiring_revive(vmm_arena *a, const struct vmm_request *req, bool part,
                                            struct vmm_mapping **out);

/* ---- Unmapping in the background; all under the arena lock (unmapper.c) -------------- */

/* A retired range handed to the unmapper thread; result: the driver's answer, once unmapped. */
typedef struct vmm_unmap_job {
  CUdeviceptr base;
  size_t size;
  uint32_t reservation;
  CUresult result;
} vmm_unmap_job;

/* The jobs [0, done) are unmapped and wait to give their VA back (vmm_unmapper_collect, under
 * the arena lock); [done, count) wait for the thread, which works on jobs[done] unlocked. */
typedef struct vmm_unmapper {
  pthread_mutex_t mu;
  pthread_cond_t work, idle;
  pthread_t thread;
  bool running;          /* the thread is up */
  bool failed;           /* it could not start: ranges are unmapped inline */
  bool stopping;
  vmm_unmap_job *jobs;
  size_t done, count, cap;
  size_t bytes;          /* VA of the jobs not yet collected: changed under the arena lock only */
  int mapping;           /* atomic: the arena is mapping (an assembly): the thread starts no unmap */
  uint64_t mapped_ns;    /* atomic: when the last mapping ended (vmm_driver_now_ns) */
  uint64_t quiet_ns;     /* how long after a mapping the thread still starts no unmap */
  int draining;          /* atomic: a wait or stop is under way: the thread no longer yields */
  uint64_t handed;       /* ranges handed to the thread so far */
} vmm_unmapper;

/* Hands [base, base + size), mapped by nothing live and known idle on the device, to the
 * unmapper thread (started at the first); false where the arena unmaps inline
 * (VMMARENA_UNMAP=inline, destroy, no thread, or no host memory): the caller unmaps it. */
VMM_INTERNAL bool vmm_unmapper_take(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation);
/* An assembly's driver calls begin (+1) or end (-1): the thread starts no unmap meanwhile, since
 * the driver makes mapping calls wait for an unmap under way. */
VMM_INTERNAL void vmm_unmapper_mapping(vmm_arena *a, int delta);
/* Gives the VA of the ranges unmapped so far back to the free list (a failed one stays stuck). */
VMM_INTERNAL void vmm_unmapper_collect(vmm_arena *a);
/* Waits until every range handed over is unmapped, then collects: before memory goes back to
 * the driver, so that a release frees what it counts. */
VMM_INTERNAL void vmm_unmapper_wait(vmm_arena *a);
/* Waits, stops the thread and frees the queue (destroy). */
VMM_INTERNAL void vmm_unmapper_stop(vmm_arena *a);

/* ---- Admission (admission.c) --------------------------------------------------------- */

/* Refuses `fresh` bytes of new physical memory past the limit or below the headroom, for a
 * request of `bytes` (rounded `rounded`). */
VMM_INTERNAL vmm_status vmm_admission_admit(vmm_arena *a, size_t bytes, size_t rounded, size_t fresh, vmm_kind kind);
/* Before `handles` > 1 creations: refuses at once when the device has less free memory than
 * `fresh` bytes, rather than creating handles that the last ones could not complete. */
VMM_INTERNAL vmm_status vmm_admission_admit_device(vmm_arena *a, size_t bytes, size_t rounded, size_t fresh, uint32_t handles,
                                         vmm_kind kind);
/* Records a cuMemCreate out-of-memory as a refusal, with the device's free memory. */
VMM_INTERNAL vmm_status vmm_admission_refuse_driver_oom(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind);

/* ---- Copy engine (copy_engine.c) ----------------------------------------------------- */

#define VMM_STAGING_DEFAULT ((size_t)32 << 20) /* vmm_config.pause_staging */
#define VMM_STAGING_MIN ((size_t)1 << 20)
#define VMM_STAGING_MAX ((size_t)4 << 30)
#define VMM_STAGING_KEEP ((size_t)1 << 63)    /* the bit of pause_staging that keeps the staging */

/* One range copied between the device and host memory. */
typedef struct vmm_copy_segment {
  CUdeviceptr dev;
  char *host;
  size_t bytes;
} vmm_copy_segment;


/* What failed in a copy made outside the arena lock, recorded once the lock is held again. */
typedef struct vmm_copy_error {
  vmm_status status;      /* VMM_ERR_OUT_OF_MEMORY (host, or a driver out of memory) or VMM_ERR_DRIVER */
  CUresult result;        /* the failed call's result */
  vmm_driver_entry entry; /* the failed entry point; VMM_DRV_ENTRY_COUNT for a host failure */
  char what[300];         /* what failed, with its numbers */
} vmm_copy_error;

/* Makes the arena's copier on its first pause or resume (arena lock held): no thread, no
 * staging yet. VMM_ERR_OUT_OF_MEMORY, recorded, when the host has no memory for it. */
VMM_INTERNAL vmm_status vmm_copier_get(vmm_arena *a);
/* Arena lock held: waits, with the lock released, until a pause or resume ends (any tag). */
VMM_INTERNAL void vmm_copier_wait_turn(vmm_arena *a);
/* Arena lock held: a pause or resume ended; wakes the calls waiting for their turn. */
VMM_INTERNAL void vmm_copier_end_turn(vmm_arena *a);
/* Without the arena lock: copies the segments (to_host: device -> host, else host -> device)
 * through the pinned staging buffers, with the host threads, one copy of the arena at a time;
 * starts the threads on first use. The staging is allocated by the copy and released after
 * it unless another copy waits or the setting keeps it (a failed release is logged and tried
 * again after the next copy). Returns true, or false with *err filled (everything it started
 * is finished; the host side is partly written). */
VMM_INTERNAL bool vmm_copier_run(vmm_arena *a, const vmm_copy_segment *seg, size_t n, bool to_host, vmm_copy_error *err);
/* Arena lock held, before an unmap: waits for the copy streams where a copy's last wait failed
 * (its copies may still read or write the memory); a failed wait is returned and stays owed. */
VMM_INTERNAL CUresult vmm_copier_settle(vmm_arena *a);
/* Without the arena lock: waits for the work in flight on the allocations' streams (once per
 * stream): each one's own, those record_stream added, and a page's slots' other streams, which
 * may still use their memory. Returns true, or false with *err filled. */
VMM_INTERNAL bool vmm_copier_wait_streams(vmm_arena *a, vmm_mapping *const *list, size_t n, vmm_copy_error *err);
/* Stops the threads and releases the staging and the streams (destroy). */
VMM_INTERNAL void vmm_copier_stop(vmm_arena *a);

/* Records e under the arena lock as "CALL: WHAT; THEN" (call "pause(\"w\")", then what the
 * failure left); returns its status. */
VMM_INTERNAL vmm_status vmm_copier_fail(vmm_arena *a, const vmm_copy_error *e, const char *call, const char *then);
/* Fills e for a failed driver call (status from the result) or, with entry
 * VMM_DRV_ENTRY_COUNT, a host failure (out of memory). */
VMM_INTERNAL void vmm_copier_set_error(vmm_copy_error *e, CUresult r, vmm_driver_entry entry, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- Backups (backup.c) -------------------------------------------------------------- */

/* Whether the driver table has the copies a backup needs (version 2). */
VMM_INTERNAL bool vmm_backup_supported(const vmm_arena *a);
/* Arena lock held: refuses (out of memory, recorded) backups of `bytes` that the host's
 * MemAvailable cannot hold, where it is known. */
VMM_INTERNAL vmm_status vmm_backup_admit(vmm_arena *a, size_t bytes, const char *call);
/* Without the arena lock: makes a backup of each of the n allocations (out[i] for list[i])
 * and copies their contents into them. On failure none is kept (out[] NULL) and *err says
 * what failed. */
VMM_INTERNAL bool vmm_backup_save(vmm_arena *a, vmm_mapping *const *list, size_t n, void **out, vmm_copy_error *err);
/* Without the arena lock: copies the backups of the n allocations (mapped again) back into
 * their ranges; the backups stay (vmm_mapping_resume frees them). */
VMM_INTERNAL bool vmm_backup_restore(vmm_arena *a, vmm_mapping *const *list, size_t n, vmm_copy_error *err);
/* Returns a backup to the system; NULL is a no-op. `bytes` is its allocation's extent. */
VMM_INTERNAL void vmm_backup_free(void *backup, size_t bytes);

/* ---- Draining the store (drain.c) ---------------------------------------------------- */

/* Waits, once per stream, for the work that may still use a pooled mapping (see
 * vmm_order_wait_for_free); touches nothing. Messages name the caller by `what`. */
VMM_INTERNAL vmm_status vmm_drain_wait(vmm_arena *a, const char *what);
/* Pops the pool in drain order (largest bucket first, newest first within it), unmapping
 * each mapping and keeping its handles idle; a failed unmap pushes it back where it was. */
VMM_INTERNAL vmm_status vmm_drain_pool(vmm_arena *a, const char *what);
/* Releases the idle handles, largest first; stops at the first failure (that handle stays idle). */
VMM_INTERNAL vmm_status vmm_drain_idle(vmm_arena *a, const char *what);
/* Everything back to the driver, in this order: the pool's streams waited for (a failure
 * touches nothing), the retiring ranges, the deferred frees, the pool, the idle handles. */
VMM_INTERNAL vmm_status vmm_drain_all(vmm_arena *a, const char *what);

/* ---- The arena and its device (arena_create.c) --------------------------------------- */

struct vmm_arena {
  pthread_mutex_t lock;
  vmm_config cfg;
  const struct vmm_driver *drv;
  CUdevice dev;
  CUcontext ctx;
  int integrated;
  int retention_enabled;
  size_t granularity;
  size_t handle_bound;  /* largest handle created inside a scope (a granularity multiple) */
  CUmemAllocationProp prop;
  CUmemAccessDesc access[VMM_MAX_DEVICES];
  size_t access_count;
  CUevent order_event; /* recorded on a freeing stream, waited on by the reusing one */

  vmm_ranges ranges;
  vmm_retiring retiring;       /* old ranges of mappings taken apart early (retiring.c) */
  vmm_unmapper unmapper;       /* retired ranges being unmapped off the allocation path (unmapper.c) */
  vmm_table table;             /* mapping records by base address */
  vmm_store store;
  vmm_mapping *deferred_head;  /* frees waiting for a capture to end (stream_order.c) */
  vmm_pages pages;             /* requests below the granularity (pages.c) */
  vmm_id_set released_graph_pools; /* graph pools released: no allocation goes into them */
  CUevent *spare_events;       /* events kept for slot waits and fences (stream_order.c) */
  vmm_fence *fences;           /* one per stream that freed pooled memory (stream_order.c) */
  size_t fence_count, fence_cap;
  uint64_t free_seq;           /* pooled frees and slot waits so far: the order of fences and marks */
  size_t spare_event_count, spare_event_cap;
  bool destroying;             /* vmm_arena_destroy is running: failures are logged, not kept */

  vmm_scope_state scope;
  bool scope_finishing;        /* vmm_retention_finish is giving the scope's memory back */
  uint64_t scope_id, next_scope_id;
  vmm_id_set aborted_scopes;
  uint64_t quiesced_seq;       /* free_seq at the latest quiesce: every free numbered at most it is complete */

  /* counters */
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical_bytes, physical_peak, mapped_bytes, mapped_peak;
  uint64_t scope_peak;         /* the physical peak since the active scope began */
  uint64_t high_water;         /* the most physical ever held (no reset): the mark of VMMARENA_REFILL=below-peak */
  uint64_t live_high_water;    /* the most bytes ever live at once (no reset): the mark of within-live */
  uint64_t pool_hits, pool_misses, pool_fallbacks, prefix_hits, run_hits;
  uint64_t grown_in_place;     /* assemblies that grew a pooled mapping where it was mapped */
  uint64_t assemblies, padded_assemblies, assembled_idle_handles, assembly_created_bytes, pooled_taken_apart;
  uint64_t refills;            /* misses given new memory by VMMARENA_REFILL instead of several cached handles */
  uint64_t oom_refusals, limit_refusals, headroom_refusals;
  uint64_t allocs, frees, deferred_frees;
  uint64_t allocated_bytes, allocated_peak, allocations, allocations_peak; /* vmm_usage */
  uint64_t refusals, cache_releases;
  uint32_t captures_underway;  /* vmm_arena_capture_begin minus _end: frees then ask about capture */
  struct vmm_join_walk *join_walk; /* vmm_join_reached's nodes, one walk at a time (capture_join.c); NULL until the first */
  uint64_t scopes_begun, scopes_finished, scopes_aborted;
  vmm_driver_stats drv_stats[VMM_DRV_ENTRY_COUNT];
  uint64_t *tag_bytes;         /* live bytes by tag id */
  uint64_t *tag_count;
  uint64_t *tag_paused_bytes;  /* paused bytes by tag id */
  uint64_t *tag_paused_count;
  size_t tag_cap;

  vmm_status fatal_status;
  char fatal_message[768];
  char last_error[768];

  vmm_trace_writer *trace;
  struct vmm_copier *copier;   /* pause and resume: turns, threads, staging (copy_engine.c); NULL until the first */
  struct vmm_ipc_import *ipc_imports; /* memory of other processes mapped here, open (ipc.c) */
};

static inline size_t vmm_round_up(const vmm_arena *a, size_t bytes) {
  return (bytes + a->granularity - 1) & ~(a->granularity - 1);
}

/* Destroy: releases the primary context that creation retained and pops it. */
VMM_INTERNAL void vmm_arena_create_close_device(vmm_arena *a);

/* ---- Policy: what each mode decides, in one table (policy.c) ------------------------- */

static inline bool vmm_retaining(const vmm_arena *a) { return a->scope == VMM_SCOPE_ACTIVE && a->retention_enabled; }

/* Four modes, chosen by two bools: whole-process mode (vmm_config.caching, set by
 * vmmarena.install()) or not, and a retaining scope active (vmm_retaining) or not. MemPool
 * mode and the plain C API are the `plain` column outside a scope and `retain` inside one;
 * whole-process mode is `process` outside a scope and `scope` inside one. Every decision that
 * differs between the modes asks its row (vmm_policy_of) for a field of this table; nothing else
 * tests the mode. A setting named in a comment applies where the field is 1 (it is read at the
 * site). Columns: type, field, plain, retain, process, scope; then what the field decides. */
#define VMM_OVERSHOOT_SHARE 32
#define VMM_POLICY_TABLE(X)                                                                                   \
  /* A free keeps its physical memory (pooled, or idle handles) and a miss is assembled from what was   */    \
  /* kept (VMMARENA_REUSE not none), new memory only for the rest; else a free releases, a miss creates. */   \
  X(bool, keeps_frees, 0, 1, 1, 1)                                                                            \
  /* A transient free is pooled, still mapped, with no driver call.                                     */    \
  X(bool, pools_transient, 0, 1, 1, 1)                                                                        \
  /* A package free is pooled, still mapped; else it is unmapped after a synchronize of its stream,     */    \
  /* its handles kept idle where keeps_frees, released otherwise.                                       */    \
  X(bool, pools_package, 0, 0, 1, 1)                                                                          \
  /* Nothing is released before finish: empty_cache releases nothing, a pause keeps its handles idle,   */    \
  /* and a package miss is assembled only under VMMARENA_PACKAGE_ASSEMBLY (else always, where kept).     */   \
  X(bool, holds_until_finish, 0, 1, 0, 1)                                                                     \
  /* A free never waits on the host: only a shared-pool free on a capturing stream while a capture is   */    \
  /* underway is deferred, and pooled with no synchronize once the capture ends; else a free that is    */    \
  /* not pooled asks whether its stream captures, and a deferred free is synchronized, then unmapped.   */    \
  X(bool, free_never_waits, 0, 0, 1, 1)                                                                       \
  /* A request on another stream is ordered after an incomplete free by an event only as its last       */    \
  /* resort (or under VMMARENA_STREAM_ORDER=event); else always, so that a pooled mapping is usable.    */    \
  X(bool, orders_by_event_last, 0, 0, 1, 1)                                                                   \
  /* Requests of at most half a granule are slots carved from one-granule pages (pages.c).               */   \
  X(bool, carves_pages, 0, 0, 1, 1)                                                                           \
  /* Cached memory up to 1/N larger than a request serves it (an exact pool hit, a run, an assembly's   */    \
  /* last handle) where a driver call would be made otherwise; 0: only the reuse policy's sizes.         */   \
  X(size_t, overshoot_share, 0, 0, VMM_OVERSHOOT_SHARE, VMM_OVERSHOOT_SHARE)                                  \
  /* A run of a larger pooled mapping's handles serves in place (exact reuse), the rest stays pooled,   */    \
  /* and a piece being pooled merges back with its pooled neighbours (tails).                            */   \
  X(bool, splits_in_place, 0, 0, 1, 1)                                                                        \
  /* The allocation path never waits: a pooled mapping is taken apart once its free is known complete, */    \
  /* or early (ordered by event), its old range retiring mapped, and retired ranges serve again; else   */    \
  /* its freeing stream is synchronized and it is unmapped.                                              */   \
  X(bool, retires_taken_apart, 0, 0, 1, 1)                                                                    \
  /* A live graph's pool keeps its memory: its pooled mappings are taken apart only by its requests, a  */    \
  /* paused one freed keeps its range, and its request may take shared memory whose free is complete.   */    \
  X(bool, graph_pools_keep, 0, 0, 1, 1)                                                                       \
  /* A request refused new memory releases the whole cache and is tried once more.                       */   \
  X(bool, releases_on_refusal, 0, 0, 1, 0)                                                                    \
  /* A miss may grow a pooled mapping where it is mapped, ranges placed with free VA on both sides       */   \
  /* (VMMARENA_GROW).                                                                                    */   \
  X(bool, grows_in_place, 0, 0, 1, 1)                                                                         \
  /* A miss that would map several cached handles may get new memory instead (VMMARENA_REFILL).          */   \
  X(bool, refills, 0, 0, 1, 1)                                                                                \
  /* Inside a capture, memory of a graph's pool freed on a stream that the request's stream has since  */   \
  /* joined serves it (free markers, capture_join.c); else it waits for the capture's end.              */   \
  X(bool, joins_captures, 0, 0, 1, 1)                                                                         \
  /* Memory is created exportable to other processes (CUDA IPC) where the driver allows (at creation).  */    \
  X(bool, exports_handles, 0, 0, 1, 1)

#define VMM_POLICY_FIELD_(type, field, plain, retain, process, scope) type field;
typedef struct vmm_policy {
  VMM_POLICY_TABLE(VMM_POLICY_FIELD_)
} vmm_policy;
#undef VMM_POLICY_FIELD_

/* The rows: [whole-process mode][retaining scope active]. */
VMM_INTERNAL extern const vmm_policy vmm_policies[2][2];
/* The row of a's mode now (a scope begun or ended changes it). */
static inline const vmm_policy *vmm_policy_of(const vmm_arena *a) {
  return &vmm_policies[a->cfg.caching != 0][vmm_retaining(a)];
}
/* Whether a free of `kind` is pooled, still mapped. */
static inline bool vmm_policy_pools(const vmm_policy *p, vmm_kind kind) {
  return kind == VMM_KIND_TRANSIENT ? p->pools_transient : p->pools_package;
}
/* Whether a miss may grow a pooled mapping in place (assembly.c) and ranges are placed with free
 * VA on both sides (ranges.c). */
static inline bool vmm_grows_in_place(const vmm_arena *a) { return vmm_policy_of(a)->grows_in_place && a->cfg.grow_in_place; }

/* ---- Sharing between processes (ipc.c) ----------------------------------------------- */

/* Creation: in whole-process mode, with a table of version 4, asks for exportable handles
 * (a->prop.requestedHandleTypes: POSIX file descriptors). */
VMM_INTERNAL void vmm_ipc_init(vmm_arena *a);
/* After a failed cuMemCreate: true when the arena asked for exportable handles and the driver
 * refused them (NOT_SUPPORTED or NOT_PERMITTED, never out of memory): it stops asking, logs it
 * once, and the caller creates the handle again, plain. (Inline, as the next one: handle.c
 * calls them, and ipc.c calls what calls handle.c.) */
static inline bool vmm_ipc_create_refused(vmm_arena *a, CUresult r) {
  if (!a->prop.requestedHandleTypes || (r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_NOT_PERMITTED)) return false;
  a->prop.requestedHandleTypes = 0;
  vmm_errors_log(2, a->cfg.log_level,
          "vmmarena: device %d refused exportable memory (cuMemCreate returned %s): memory is created plain from "
          "now on, and sharing it with another process is refused",
          a->cfg.device, vmm_errors_cu_name(a, r));
  return true;
}
/* Before h goes back to the driver: closes its exported descriptor, if any. */
static inline void vmm_ipc_forget_handle(vmm_handle *h) {
  if (h->ipc_fd) (void)close(h->ipc_fd - 1);
  h->ipc_fd = 0;
}
/* Destroy: closes every import still open, logging failures. */
VMM_INTERNAL void vmm_ipc_fini(vmm_arena *a);

/* ---- Assembly (assembly.c) ----------------------------------------------------------- */

typedef struct vmm_request { /* a request for memory: what vmm_arena_alloc_in was asked */
  size_t bytes, rounded;
  vmm_kind kind;
  CUstream stream;
  uint32_t tag;
  vmm_pool_id graph_pool;
  bool exact; /* a page's mapping: exactly `rounded` bytes (its slots are found by granule) */
  bool last_resort; /* whole-process mode: may be ordered after incomplete frees by events */
} vmm_request;

typedef enum vmm_assembly_mode {
  VMM_ASSEMBLE_NEW,    /* one new handle, no idle handle (outside a scope) */
  VMM_ASSEMBLE_EXACT,  /* idle handles that fit what is left, new memory (cut to the bound) for the rest */
  VMM_ASSEMBLE_PADDED, /* after a refusal: idle handles only, the last one may be larger than what is left */
  VMM_ASSEMBLE_REFILL  /* new memory (cut to the bound) where vmm_assembly_refill_wanted */
} vmm_assembly_mode;

/* VMMARENA_REFILL (whole-process mode): whether a miss whose plan would map several cached
 * handles gets new memory instead, the arena then holding at most F of its high-water mark
 * (below-peak:F), or at most F times the most bytes ever live at once, this request's included
 * (within-live:F). Every handle of a range costs its own share of cuMemSetAccess and cuMemUnmap,
 * so one new handle costs a fraction of a stitched range; below the mark it raises no peak, and
 * within the live bytes' F it holds at most F of what the program needed. The plan is a dry run:
 * the store is left as it was. */
/* Whether req's assembly would create new memory: a dry run of its plan (the store is left as
 * it was). */
VMM_INTERNAL bool vmm_assembly_needs_new(vmm_arena *a, const vmm_request *req);
VMM_INTERNAL bool vmm_assembly_refill_wanted(vmm_arena *a, const vmm_request *req);

/* Builds a live mapping of at least req->rounded bytes in a fresh range, or, with `into` (a
 * paused allocation of req->rounded bytes), maps handles back into its range and attaches them.
 * On any failure everything taken is put back as it was and the error is recorded. */
VMM_INTERNAL vmm_status vmm_assembly_build(vmm_arena *a, const vmm_request *req, vmm_assembly_mode mode, vmm_mapping *into,
                                     vmm_mapping **out);
/* EXACT where requests of `kind` are assembled from idle handles now (inside a retention
 * scope, with reuse on), NEW otherwise. */
VMM_INTERNAL vmm_assembly_mode vmm_assembly_mode_for(const vmm_arena *a, vmm_kind kind);

/* ---- Whole mappings (arena.c) -------------------------------------------------------- */

/* A live mapping of at least req->rounded bytes for req, from the first source that has one
 * (pool, assembly, new memory; after a refusal the fallbacks). */
VMM_INTERNAL vmm_status vmm_arena_alloc_mapping(vmm_arena *a, const vmm_request *req, vmm_mapping **out);
/* Frees a live or paused mapping (as vmm_arena_free says); *freed: it is no longer live. */
VMM_INTERNAL vmm_status vmm_arena_free_allocation(vmm_arena *a, vmm_mapping *m, CUstream stream, bool *freed);
/* A kept mapping (vmm_mapping_keep) that resume made live again goes to its graph's pool,
 * freed on its stream. */
VMM_INTERNAL vmm_status vmm_arena_free_kept(vmm_arena *a, vmm_mapping *m);
/* Frees the mapping of an empty page m (live or paused) on the page's stream. Where that fails
 * (an unmap refused: the error is returned) m stays an empty page, found again by a later
 * empty_cache, never a plain mapping that a slot's pointer could free. */
VMM_INTERNAL vmm_status vmm_arena_free_page(vmm_arena *a, vmm_mapping *m);
/* The refusal of a free of p (m: the record at p, or NULL), naming what is there. */
VMM_INTERNAL vmm_status vmm_arena_refuse_pointer(vmm_arena *a, CUdeviceptr p, vmm_mapping *m);

/* Outside a retaining scope: empty pages back to the pool, then the pool and the idle tier
 * back to the driver (vmm_arena_empty_cache, and a request that finds new memory refused).
 * With `wait_for_slots` (empty_cache) a page's slots still waiting for other streams are given
 * back after those streams are waited for on the host; a refused request leaves them to its
 * last resort, an event. */
VMM_INTERNAL vmm_status vmm_arena_release_cache(vmm_arena *a, const char *what, bool wait_for_slots);

/* ---- Scope (scope.c) ----------------------------------------------------------------- */

/* Whether scope_id (0: none) was aborted. */
VMM_INTERNAL bool vmm_scope_aborted(const vmm_arena *a, uint64_t scope_id);

#endif