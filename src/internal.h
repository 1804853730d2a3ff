/* Internal types and helpers of the vmmarena core. Not installed. */
#ifndef VMMARENA_INTERNAL_H
#define VMMARENA_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "vmmarena.h"
#include "vmmarena/trace.h"

#define VMM_INTERNAL __attribute__((visibility("hidden")))

#ifndef NDEBUG
#include <assert.h>
#define vmm_assert(cond) assert(cond)
#else
#define vmm_assert(cond) ((void)0)
#endif

/* ---- AVL tree (avl.c): intrusive, keyed by (k1, k2), keys unique ---------------------- */

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

#define vmm_container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

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
  uint32_t reservation_count, reservation_cap;
  vmm_avl *by_addr, *by_size;
  size_t free_bytes, reserved_bytes;
  size_t free_range_count;
} vmm_ranges;

/* ---- Mappings ------------------------------------------------------------------------ */

typedef struct vmm_piece {
  CUmemGenericAllocationHandle handle;
  size_t size;
} vmm_piece;

typedef enum vmm_mapping_state {
  VMM_MAP_LIVE,      /* handed out */
  VMM_MAP_POOLED,    /* idle in the pool, still mapped */
  VMM_MAP_FREEING,   /* a free is synchronizing its stream outside the lock */
  VMM_MAP_DEFERRED,  /* freed on a capturing stream; unmapped once capture is over */
  VMM_MAP_ABANDONED  /* belongs to an aborted scope: no driver call until destroy */
} vmm_mapping_state;

struct vmm_bucket;

typedef struct vmm_mapping {
  CUdeviceptr base;
  size_t extent;          /* full mapped size (sum of pieces) */
  size_t requested;       /* bytes of the current (or last) request */
  vmm_kind kind;
  vmm_mapping_state state;
  uint32_t tag;           /* interned tag id, 0 = none */
  uint32_t reservation;   /* reservation holding the range */
  uint64_t scope_id;      /* scope it was allocated in (0 = outside any) */
  CUstream stream;        /* stream of the latest alloc or free */
  uint64_t free_epoch;    /* arena quiesce epoch at the latest free */
  uint32_t piece_count;   /* > 1 for a stitched mapping */
  vmm_piece *pieces;      /* &one, or a heap array for stitched mappings */
  vmm_piece one;
  struct vmm_mapping *pool_next, *pool_prev; /* bucket list while POOLED; deferred list while DEFERRED */
  struct vmm_bucket *bucket;
  bool stitch_chosen;     /* picked as a stitching candidate (only during stitch()) */
} vmm_mapping;

/* Open-addressing hash of mapping records by base address (mapping_table.c). */
typedef struct vmm_mapping_table {
  vmm_mapping **slots;
  size_t cap, count;
} vmm_mapping_table;

VMM_INTERNAL int vmm_table_init(vmm_mapping_table *t);
VMM_INTERNAL void vmm_table_fini(vmm_mapping_table *t);
VMM_INTERNAL vmm_mapping *vmm_table_find(const vmm_mapping_table *t, CUdeviceptr base);
/* Reserves room for one more record so the next insert cannot fail. */
VMM_INTERNAL int vmm_table_reserve(vmm_mapping_table *t);
VMM_INTERNAL void vmm_table_insert(vmm_mapping_table *t, vmm_mapping *m);
VMM_INTERNAL void vmm_table_remove(vmm_mapping_table *t, CUdeviceptr base);
/* The record whose extent contains ptr (O(n), error paths only), or NULL. */
VMM_INTERNAL vmm_mapping *vmm_table_containing(const vmm_mapping_table *t, CUdeviceptr ptr);
#define vmm_table_foreach(t, i, m) \
  for (size_t i = 0; i < (t)->cap; i++) if (((m) = (t)->slots[i]) != NULL)

/* ---- Pool of live transient mappings (pool.c) ---------------------------------------- */

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
  vmm_bucket *spare;
} vmm_pool;

/* Returns true if `m` may be handed to `stream`; may order `stream` after m's free. */
typedef bool (*vmm_pool_usable_fn)(void *ctx, vmm_mapping *m);

VMM_INTERNAL int vmm_pool_push(vmm_pool *p, vmm_mapping *m);
VMM_INTERNAL void vmm_pool_remove(vmm_pool *p, vmm_mapping *m);
/* Smallest bucket of size in [lo, hi] holding a usable mapping; removes and returns it. */
VMM_INTERNAL vmm_mapping *vmm_pool_take(vmm_pool *p, size_t lo, size_t hi, vmm_pool_usable_fn usable, void *ctx);
/* The drain order: head of the largest bucket. */
VMM_INTERNAL vmm_mapping *vmm_pool_peek_drain(const vmm_pool *p);
VMM_INTERNAL void vmm_pool_fini(vmm_pool *p);
/* Checks the pool's invariants; returns 0 if sound. */
VMM_INTERNAL int vmm_pool_check(const vmm_pool *p, char *why, size_t cap);

/* ---- Arena --------------------------------------------------------------------------- */

typedef struct vmm_piece_list {
  vmm_piece *items;
  vmm_kind *kinds;
  size_t count, cap;
} vmm_piece_list;

struct vmm_arena {
  pthread_mutex_t lock;
  vmm_config cfg;
  const struct vmm_driver *drv;
  CUdevice dev;
  CUcontext ctx;
  int integrated;
  int retention_enabled;
  size_t granularity;
  CUmemAllocationProp prop;
  CUmemAccessDesc access[VMM_MAX_DEVICES];
  size_t access_count;
  CUevent order_event; /* recorded on a freeing stream, waited on by the reusing one */

  vmm_ranges ranges;
  vmm_mapping_table table;
  vmm_pool pool;
  vmm_mapping *deferred_head;  /* frees waiting for a capture to end */
  vmm_piece_list retained;     /* unmapped handles whose release is deferred */
  vmm_piece_list abandoned;    /* unmapped handles of aborted scopes, released at destroy */
  vmm_reservation *stuck;      /* pieces a failed undo left mapped: VA kept out of the free list, unmapped at destroy */
  size_t stuck_count, stuck_cap, stuck_bytes;

  vmm_scope_state scope;
  uint64_t scope_id, next_scope_id;
  uint64_t *aborted_scopes;    /* ascending */
  size_t aborted_count, aborted_cap;
  uint64_t epoch;              /* raised by every quiesce */

  /* counters */
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical_bytes, physical_peak, mapped_bytes, mapped_peak;
  uint64_t pool_hits, pool_misses, pool_fallbacks, stitches;
  uint64_t oom_refusals, limit_refusals, headroom_refusals;
  uint64_t allocs, frees, deferred_frees;
  uint64_t scopes_begun, scopes_finished, scopes_aborted;
  vmm_driver_stats drv_stats[VMM_DRV_ENTRY_COUNT];
  uint64_t *tag_bytes;         /* live bytes by tag id */
  uint64_t *tag_count;
  size_t tag_cap;

  vmm_status fatal_status;
  char fatal_message[768];
  char last_error[768];

  vmm_trace_writer *trace;
};

/* ---- Driver calls (driver.c): timing, counters, context ------------------------------ */

VMM_INTERNAL uint64_t vmm_now_ns(void);
VMM_INTERNAL void vmm_drv_account(vmm_arena *a, vmm_driver_entry e, CUresult r, uint64_t t0);
/* Makes the arena's context current on this thread for the rest of the public call. */
VMM_INTERNAL void vmm_ctx_enter(vmm_arena *a);
/* Pops the context if this public call pushed it. */
VMM_INTERNAL void vmm_ctx_leave(vmm_arena *a);

/* Calls a driver entry point through the arena's table, timed and counted. */
#define VMM_DRV(a, field, ...)                                          \
  __extension__({                                                       \
    vmm_ctx_enter(a);                                                   \
    uint64_t vmm_t0_ = vmm_now_ns();                                    \
    CUresult vmm_r_ = (a)->drv->field(__VA_ARGS__);                     \
    vmm_drv_account((a), VMM_DRV_##field, vmm_r_, vmm_t0_);             \
    vmm_r_;                                                             \
  })

VMM_INTERNAL const char *vmm_cu_error_name(const struct vmm_driver *drv, CUresult r);

/* ---- Ranges (ranges.c) --------------------------------------------------------------- */
VMM_INTERNAL vmm_status vmm_ranges_alloc(vmm_arena *a, size_t size, CUdeviceptr *base, uint32_t *reservation);
VMM_INTERNAL void vmm_ranges_free(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation);
VMM_INTERNAL void vmm_ranges_fini(vmm_arena *a);
VMM_INTERNAL int vmm_ranges_check(const vmm_ranges *r, char *why, size_t cap);

/* ---- Errors and messages (errors.c) -------------------------------------------------- */
/* Formats bytes as "7.1 GiB", "512.0 MiB", "4096 B". */
VMM_INTERNAL const char *vmm_fmt_bytes(uint64_t bytes, char buf[32]);
VMM_INTERNAL vmm_status vmm_fail(vmm_arena *a, vmm_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a failed driver call: sticky fatal unless it is out of memory. Returns the status. */
VMM_INTERNAL vmm_status vmm_fail_driver(vmm_arena *a, CUresult r, vmm_driver_entry e, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Appends "arena holds ..." to buf. */
VMM_INTERNAL void vmm_describe_holdings(const vmm_arena *a, char *buf, size_t cap);
VMM_INTERNAL void vmm_log(int level, int threshold, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- Tags (tags.c) ------------------------------------------------------------------- */
VMM_INTERNAL uint32_t vmm_tag_current_id(void);
VMM_INTERNAL const char *vmm_tag_name(uint32_t id);
VMM_INTERNAL uint32_t vmm_tag_count(void);

/* ---- Meminfo (meminfo.c) ------------------------------------------------------------- */
VMM_INTERNAL CUresult vmm_host_memory_available(size_t *bytes);

/* ---- Scope helpers (scope.c) --------------------------------------------------------- */
VMM_INTERNAL bool vmm_scope_aborted(const vmm_arena *a, uint64_t scope_id);
VMM_INTERNAL int vmm_pieces_push(vmm_piece_list *l, vmm_piece p, vmm_kind kind);
VMM_INTERNAL int vmm_pieces_reserve(vmm_piece_list *l, size_t more);

/* ---- Arena internals shared by scope.c and arena.c ----------------------------------- */
VMM_INTERNAL void vmm_stat_add(vmm_arena *a, vmm_kind k, vmm_mapping_state s, size_t bytes, int sign);
VMM_INTERNAL void vmm_mapping_destroy_record(vmm_arena *a, vmm_mapping *m);
VMM_INTERNAL void vmm_process_deferred(vmm_arena *a);
VMM_INTERNAL void vmm_tag_account(vmm_arena *a, uint32_t tag, size_t bytes, int sign);
/* Before pooled mapping m is unmapped (by finish or stitching): waits for the work of the
 * stream that freed it, which may still use it, unless a quiesce came after the free or that
 * stream is in waited[0, *n_waited) (it is added while there is room for `cap`). A capturing
 * stream cannot be waited for: VMM_ERR_SCOPE_STATE; a failed query or synchronize is a driver
 * error. Messages name the caller by `what`. */
VMM_INTERNAL vmm_status vmm_wait_for_free(vmm_arena *a, const vmm_mapping *m, const char *what, CUstream *waited,
                                          size_t *n_waited, size_t cap);

#endif
