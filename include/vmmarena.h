/* vmmarena: an in-process CUDA VMM device allocator with a retention scope and a pool of
 * live transient mappings. See docs/api.md for the whole contract. */
#ifndef VMMARENA_H
#define VMMARENA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "vmmarena/api.h"
#include "vmmarena/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VMMARENA_VERSION_MAJOR 0
#define VMMARENA_VERSION_MINOR 1
#define VMMARENA_VERSION_PATCH 0

/* ---- Status codes: one table generates the enum, the names and the messages ---------- */

#define VMM_STATUS_TABLE(X)                                                                      \
  X(VMM_OK, "success")                                                                           \
  X(VMM_ERR_INVALID_ARGUMENT, "invalid argument: bad size, NULL out-pointer or bad configuration") \
  X(VMM_ERR_UNKNOWN_POINTER, "not a live allocation of this arena: unknown, interior or freed twice") \
  X(VMM_ERR_OUT_OF_MEMORY, "out of memory (recoverable): driver, limit or headroom refused new memory") \
  X(VMM_ERR_SCOPE_STATE, "retention scope misuse: begin inside a scope, or finish/abort without one") \
  X(VMM_ERR_DRIVER, "a CUDA driver call failed")                                                 \
  X(VMM_ERR_NO_DRIVER, "libcuda.so.1 could not be loaded or lacks an entry point")

typedef enum vmm_status {
#define VMM_STATUS_ENUM(name, message) name,
  VMM_STATUS_TABLE(VMM_STATUS_ENUM)
#undef VMM_STATUS_ENUM
  VMM_STATUS_COUNT
} vmm_status;

/* "VMM_ERR_OUT_OF_MEMORY"; "VMM_STATUS_UNKNOWN" for a value outside the enum. */
VMM_API const char *vmm_status_name(vmm_status s);
/* The default message of a status code. */
VMM_API const char *vmm_status_message(vmm_status s);

/* ---- Configuration ------------------------------------------------------------------- */

typedef enum vmm_kind { VMM_KIND_PACKAGE, VMM_KIND_TRANSIENT } vmm_kind;
#define VMM_KIND_COUNT 2

typedef enum vmm_reuse_policy {
  VMM_REUSE_EXACT,    /* only a pooled mapping of exactly the rounded size ("exact") */
  VMM_REUSE_BOUNDED,  /* smallest mapping >= request and <= bound x request ("bounded:F") */
  VMM_REUSE_BEST_FIT, /* smallest mapping >= request ("best-fit") */
  VMM_REUSE_NONE      /* retain but never reuse ("none"): the seeds' failing behaviour, for comparison */
} vmm_reuse_policy;

typedef enum vmm_retain_mode {
  VMM_RETAIN_AUTO, /* on for integrated (unified-memory) GPUs only */
  VMM_RETAIN_ON,
  VMM_RETAIN_OFF /* a scope is bookkeeping only: frees release at once */
} vmm_retain_mode;

#define VMM_MAX_DEVICES 64

typedef struct vmm_config {
  int device;                      /* CUDA device ordinal */
  vmm_reuse_policy reuse;          /* VMMARENA_REUSE */
  double reuse_bound;              /* F of bounded:F, >= 1 */
  size_t reserve_bytes;            /* VMMARENA_RESERVE: size of each VA reservation */
  size_t headroom_bytes;           /* VMMARENA_HEADROOM: memory that must stay free */
  size_t limit_bytes;              /* VMMARENA_LIMIT: most physical bytes the arena may hold; 0 = none */
  size_t handle_bound_bytes;       /* VMMARENA_HANDLE_BOUND: largest handle created inside a scope; 0 = the arena's choice */
  int package_assembly;            /* VMMARENA_PACKAGE_ASSEMBLY: package allocations in a scope reuse idle handles (1) */
  vmm_retain_mode retain;          /* VMMARENA_RETAIN on|off|auto */
  uint64_t peer_access_mask;       /* VMMARENA_PEER_ACCESS: bit d grants device d access to mappings */
  const char *trace_path;          /* VMMARENA_TRACE: operation trace file, NULL = off */
  int log_level;                   /* VMMARENA_LOG: 0 off, 1 error, 2 info, 3 debug */
  const struct vmm_driver *driver; /* NULL = the CUDA driver (libcuda.so.1) */
} vmm_config;

/* Parses "8G", "512M", "1.5G", "4096", "1T", "64K" (binary units, optional trailing 'B'/'iB'). */
VMM_API vmm_status vmm_parse_size(const char *text, size_t *bytes);
/* Defaults: device 0, exact reuse, 256 GiB reservations, no headroom, no limit, the arena's
 * handle bound, package assembly on, retention auto, no peers, no trace, errors logged, CUDA
 * driver. */
VMM_API void vmm_config_init(vmm_config *cfg);
/* Reads every VMMARENA_* variable that is set over cfg. On a bad value returns
 * VMM_ERR_INVALID_ARGUMENT, leaves cfg unchanged and keeps a message naming the variable and
 * the value for vmm_config_error(). */
VMM_API vmm_status vmm_config_from_env(vmm_config *cfg);
/* Sets one setting by its environment name ("VMMARENA_REUSE") or short name ("reuse"). */
VMM_API vmm_status vmm_config_set(vmm_config *cfg, const char *name, const char *value);
/* Message of the latest vmm_config_* failure on this thread ("" if none). */
VMM_API const char *vmm_config_error(void);
/* Name of a policy ("exact", "bounded", "best-fit", "none"). */
VMM_API const char *vmm_reuse_policy_name(vmm_reuse_policy p);

/* ---- Arena --------------------------------------------------------------------------- */

typedef struct vmm_arena vmm_arena;

/* Creates an arena for cfg->device. On failure *out is NULL and vmm_create_error() says why. */
VMM_API vmm_status vmm_arena_create(const vmm_config *cfg, vmm_arena **out);
/* Message of the latest vmm_arena_create failure on this thread. */
VMM_API const char *vmm_create_error(void);
/* Synchronizes the device, then releases everything, abandoned memory too. NULL is a no-op. */
VMM_API void vmm_arena_destroy(vmm_arena *arena);

/* Allocates `bytes` (rounded up to the granularity) of `kind` for use on `stream`. */
VMM_API vmm_status vmm_arena_alloc(vmm_arena *arena, size_t bytes, vmm_kind kind, CUstream stream, void **out);
/* Frees the allocation whose base is `ptr`, used on `stream` (synchronized before unmap). */
VMM_API vmm_status vmm_arena_free(vmm_arena *arena, void *ptr, CUstream stream);
/* Synchronizes the context and marks every pooled mapping as reusable on any stream. */
VMM_API vmm_status vmm_arena_quiesce(vmm_arena *arena);
/* Granularity in bytes of this arena's device. */
VMM_API size_t vmm_arena_granularity(const vmm_arena *arena);
/* Device ordinal of the arena. */
VMM_API int vmm_arena_device(const vmm_arena *arena);

/* ---- Retention scope ----------------------------------------------------------------- */

VMM_API vmm_status vmm_retention_begin(vmm_arena *arena);
VMM_API vmm_status vmm_retention_finish(vmm_arena *arena);
VMM_API vmm_status vmm_retention_abort(vmm_arena *arena);

/* ---- Pause and resume ---------------------------------------------------------------- */

typedef enum vmm_pause_mode {
  VMM_PAUSE_DISCARD, /* the contents are dropped */
  VMM_PAUSE_BACKUP   /* the contents are copied to host memory and back on resume */
} vmm_pause_mode;

/* Takes the physical memory of every live allocation tagged `tag` (NULL: untagged) away and
 * keeps each one's virtual range, so pointers stay valid. Outside a scope the handles are
 * released; inside one they become idle handles (reused, never released before finish).
 * Synchronizes each allocation's stream first; refused while one of them is capturing. */
VMM_API vmm_status vmm_arena_pause(vmm_arena *arena, const char *tag, vmm_pause_mode mode);
/* Maps memory back at the same addresses (from idle handles where possible) for every paused
 * allocation tagged `tag`, and restores backups. A failed resume leaves what it did not finish
 * paused and can be retried. */
VMM_API vmm_status vmm_arena_resume(vmm_arena *arena, const char *tag);

/* ---- Errors -------------------------------------------------------------------------- */

/* Message of the arena's latest failure, with its numbers ("" if none). */
VMM_API const char *vmm_arena_last_error(vmm_arena *arena);
/* First fatal (non-OOM driver) error: returns its status and sets *message, or VMM_OK. */
VMM_API vmm_status vmm_arena_fatal_error(vmm_arena *arena, const char **message);

/* ---- Tags ---------------------------------------------------------------------------- */

/* Thread-local label for new allocations; nested. Strings are copied (interned). */
VMM_API void vmm_tag_push(const char *tag);
VMM_API void vmm_tag_pop(void);
/* Current tag of this thread, or NULL. */
VMM_API const char *vmm_tag_current(void);

/* ---- Snapshot ------------------------------------------------------------------------ */

typedef struct vmm_kind_stats {
  uint64_t live_count, live_bytes;           /* allocations handed out and not freed */
  uint64_t pooled_count, pooled_bytes;       /* idle mappings in the pool, still mapped (transient) */
  uint64_t retained_count, retained_bytes;   /* idle handles unmapped: reusable, released at finish */
  uint64_t abandoned_count, abandoned_bytes; /* held by an aborted scope until destroy */
  uint64_t paused_count, paused_bytes;       /* paused allocations: VA kept, no physical memory */
} vmm_kind_stats;

typedef struct vmm_driver_stats {
  uint64_t calls;    /* calls made */
  uint64_t failures; /* calls that returned an error */
  uint64_t ns;       /* cumulative wall time in the call */
} vmm_driver_stats;

typedef enum vmm_scope_state { VMM_SCOPE_NONE, VMM_SCOPE_ACTIVE } vmm_scope_state;

typedef struct vmm_snapshot {
  int device;
  int integrated;                  /* device shares host memory */
  int retention_enabled;           /* the resolved retention mode */
  vmm_reuse_policy reuse;
  double reuse_bound;
  size_t granularity;
  size_t headroom_bytes, limit_bytes;
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical_bytes, physical_peak_bytes; /* bytes of handles the arena holds */
  uint64_t mapped_bytes, mapped_peak_bytes;     /* bytes mapped into VA */
  uint64_t reserved_va_bytes, reservations;
  uint64_t retained_reusable_handles;           /* idle handles, mapped (pooled) and unmapped */
  uint64_t retained_reusable_bytes;             /* their bytes */
  uint64_t pool_buckets;
  uint64_t pool_hits, pool_misses, pool_fallbacks;
  uint64_t handle_bound_bytes;                  /* largest handle created inside a scope */
  uint64_t assemblies;                          /* allocations mapped from idle handles (+ new memory) */
  uint64_t padded_assemblies;                   /* of those, fallbacks that used a larger handle */
  uint64_t assembled_idle_handles;              /* idle handles mapped again by assemblies */
  uint64_t assembly_created_bytes;              /* new memory created to top assemblies up */
  uint64_t pooled_taken_apart;                  /* pooled mappings unmapped to serve assemblies */
  uint64_t oom_refusals, limit_refusals, headroom_refusals;
  uint64_t allocs, frees, deferred_frees;
  vmm_scope_state scope_state;
  uint64_t scopes_begun, scopes_finished, scopes_aborted;
  vmm_driver_stats driver[VMM_DRV_ENTRY_COUNT];
  vmm_status fatal_status;                      /* VMM_OK if no fatal error */
} vmm_snapshot;

VMM_API vmm_status vmm_arena_snapshot(vmm_arena *arena, vmm_snapshot *out);
/* Writes the JSON snapshot (docs/snapshot.md) into buf, NUL-terminated. *needed (if non-NULL)
 * gets the size the whole document needs including the NUL; a buffer too small returns
 * VMM_ERR_INVALID_ARGUMENT and writes nothing useful. */
VMM_API vmm_status vmm_arena_snapshot_json(vmm_arena *arena, char *buf, size_t cap, size_t *needed);

/* ---- Invariants ---------------------------------------------------------------------- */

/* Walks every structure (ranges disjoint and inside reservations, free list coalesced, pool
 * buckets non-empty and sorted, counters equal to a recount). Returns 0 if sound, otherwise
 * non-zero with a description in why. */
VMM_API int vmm_arena_check(vmm_arena *arena, char *why, size_t cap);

/* ---- Trace --------------------------------------------------------------------------- */

/* Starts (path non-NULL) or stops (NULL) the operation trace (docs/trace.md). */
VMM_API vmm_status vmm_arena_trace(vmm_arena *arena, const char *path);

#ifdef __cplusplus
}
#endif
#endif
