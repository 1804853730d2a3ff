/* vmmarena: an in-process CUDA VMM device allocator with a retention scope and a pool of
 * live transient mappings.
 *
 * This header is the reference: each declaration says what it does, which statuses it returns
 * and when, and what a failure leaves (docs/api.md is the overview, docs/design.md the why).
 * What holds for every call that takes an arena:
 *   - A NULL arena returns VMM_ERR_INVALID_ARGUMENT (or the documented neutral value) and
 *     records nothing.
 *   - Any other failure keeps a message with its numbers for vmm_arena_last_error() (the
 *     snapshot calls' own argument errors excepted). The first VMM_ERR_DRIVER failure is also
 *     kept as the arena's fatal error (vmm_arena_fatal_error); out-of-memory is recoverable
 *     and never fatal.
 *   - A failure leaves the arena's memory as it was (mappings, pool, idle handles, free list)
 *     unless the function's comment says otherwise; refusal, pool-miss and driver-call
 *     counters still count it.
 *   - Calls on one arena are thread-safe, except vmm_arena_destroy, which must not race them.
 *   - A stream passed to the arena must stay alive while the arena holds memory freed on it:
 *     until vmm_retention_finish, vmm_arena_quiesce or vmm_arena_destroy. */
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

/* Version of this header; the library of the same release has the same (its soname carries
 * the major number). */
#define VMMARENA_VERSION_MAJOR 0
#define VMMARENA_VERSION_MINOR 1
#define VMMARENA_VERSION_PATCH 0

/* ---- Status codes: one table generates the enum, the names and the messages ---------- */

/* X(name, default message) for each status, in enum order. vmm_arena_last_error() and the
 * other message calls say more than these messages: what was asked, found and held. */
#define VMM_STATUS_TABLE(X)                                                                      \
  X(VMM_OK, "success")                                                                           \
  X(VMM_ERR_INVALID_ARGUMENT, "invalid argument: bad size, NULL arena or out-pointer, unknown kind or " \
                              "mode, bad configuration, buffer too small, or nothing to pause or resume") \
  X(VMM_ERR_UNKNOWN_POINTER, "not a live allocation of this arena: unknown, interior or freed twice") \
  X(VMM_ERR_OUT_OF_MEMORY, "out of memory (recoverable): driver, limit or headroom refused new memory") \
  X(VMM_ERR_SCOPE_STATE, "retention scope misuse (begin inside a scope, finish/abort without one) or a " \
                         "capturing stream (finish, pause or resume would wait or copy on a stream " \
                         "capturing a CUDA graph)")                                             \
  X(VMM_ERR_DRIVER, "a CUDA driver call failed")                                                 \
  X(VMM_ERR_NO_DRIVER, "libcuda.so.1 could not be loaded or lacks an entry point")

typedef enum vmm_status {
#define VMM_STATUS_ENUM(name, message) name,
  VMM_STATUS_TABLE(VMM_STATUS_ENUM)
#undef VMM_STATUS_ENUM
  VMM_STATUS_COUNT
} vmm_status;

/* Name of a status ("VMM_ERR_OUT_OF_MEMORY"); "VMM_STATUS_UNKNOWN" for a value outside the
 * enum. A static string; never NULL. */
VMM_API const char *vmm_status_name(vmm_status s);
/* The default message of a status (the table above); "unknown status" for a value outside
 * the enum. A static string; never NULL. */
VMM_API const char *vmm_status_message(vmm_status s);

/* ---- Configuration ------------------------------------------------------------------- */

/* What an allocation is for; it decides what happens to it inside a retaining scope (see
 * vmm_retention_begin).
 *   VMM_KIND_PACKAGE:   persistent memory (weights, caches, graph operands). Never handed a
 *                       pooled mapping; assembled from idle handles (unless package_assembly
 *                       is off); its free unmaps it and keeps the handles idle.
 *   VMM_KIND_TRANSIENT: temporaries of a warmup or tuning step. Its free keeps the mapping
 *                       live in the pool for a later transient allocation.
 * In whole-process mode (vmm_config.caching) both kinds are cached alike, in a scope or not: a
 * free keeps the mapping in the pool for a later allocation of its kind. */
typedef enum vmm_kind { VMM_KIND_PACKAGE, VMM_KIND_TRANSIENT } vmm_kind;
#define VMM_KIND_COUNT 2 /* number of kinds: the size of vmm_snapshot.kind[] */

/* Which pooled mapping a transient allocation inside a retaining scope may take
 * (VMMARENA_REUSE). What the policy finds nothing for is assembled from idle handles (except
 * under VMM_REUSE_NONE). */
typedef enum vmm_reuse_policy {
  VMM_REUSE_EXACT,    /* only a pooled mapping of exactly the rounded size ("exact") */
  VMM_REUSE_BOUNDED,  /* smallest mapping >= request and <= bound x request ("bounded:F") */
  VMM_REUSE_BEST_FIT, /* smallest mapping >= request ("best-fit") */
  VMM_REUSE_NONE      /* retain but never reuse ("none"): memory grows with every step; for comparison */
} vmm_reuse_policy;

/* Whether a retention scope keeps freed memory (VMMARENA_RETAIN). */
typedef enum vmm_retain_mode {
  VMM_RETAIN_AUTO, /* on for integrated (unified-memory) GPUs only */
  VMM_RETAIN_ON,
  VMM_RETAIN_OFF /* a scope is bookkeeping only: frees release at once */
} vmm_retain_mode;

#define VMM_MAX_DEVICES 64 /* device ordinals 0..63: vmm_config.device, bits of peer_access_mask */

/* The settings of an arena. Start from vmm_config_init, then set fields, vmm_config_set or
 * vmm_config_from_env. vmm_arena_create checks and copies them; it opens trace_path at once
 * and keeps the driver pointer, so that table must outlive the arena. */
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
  int caching;                     /* VMMARENA_CACHE on|off: the arena caches every free and carves small requests (whole-process mode); 0 = off */
  double refill_share;             /* VMMARENA_REFILL below-peak:F (whole-process mode): a miss that would map several cached handles creates new memory while the arena then holds at most F of its high-water mark; 0 = assemble first (the default) */
  double refill_live_share;        /* VMMARENA_REFILL within-live:F (whole-process mode, F >= 1): the same while the arena then holds at most F times the most live bytes it has had; 0 = off (the default); at most one of the two refill fields is set */
  int grow_in_place;               /* VMMARENA_GROW on|off (whole-process mode): a miss may keep a pooled mapping where it is mapped and map the rest of its handles in the free VA next to it, so that only those are mapped and given access (1, the default); ranges are then placed with free VA on both sides */
  int order_by_event;              /* VMMARENA_STREAM_ORDER completed|event (whole-process mode): memory freed on another stream (or used there, record_stream) serves a request once the program ordered the request's stream after it (vmm_arena_stream_waited) or the free's events are known complete, queried and never waited for (0, "completed", the default: PyTorch's promise), or at once, the request's stream made to wait for an event recorded after the free (1, "event"); "completed" still orders by event as the last resort, before new memory inside a scope and before a refusal */
  int unmap_in_background;         /* VMMARENA_UNMAP background|inline (whole-process mode): a retired range, whose handles serve elsewhere, is unmapped by a thread of the arena off the allocation path (1, the default) or by the call that retires it (0) */
  size_t pause_staging;            /* VMMARENA_PAUSE_STAGING: pinned staging bytes of VMM_PAUSE_BACKUP copies, 32 MiB; bit 63 set ("32M,keep"): kept while nothing is paused; 0 = synchronous copies */
  const struct vmm_driver *driver; /* NULL = the CUDA driver (libcuda.so.1) */
} vmm_config;

/* Parses a size: digits, an optional fraction, an optional binary unit K, M, G, T or P and an
 * optional 'B' or 'iB' ("8G", "512M", "1.5G", "4096", "2MiB"). Empty, negative, unparsable or
 * overflowing text, a fraction of a byte or a NULL pointer: VMM_ERR_INVALID_ARGUMENT, *bytes
 * unchanged, and vmm_config_error() says why. */
VMM_API vmm_status vmm_parse_size(const char *text, size_t *bytes);
/* Sets every field of cfg (not NULL) to its default: device 0, exact reuse, 256 GiB
 * reservations, no headroom, no limit, the arena's handle bound, package assembly on,
 * retention auto, no peers, no trace, errors logged, caching off, misses assembled before
 * new memory is created (refill_share and refill_live_share 0), mappings grown in place,
 * retired ranges unmapped in the background, 32 MiB of pause staging, the CUDA driver. Cannot
 * fail. */
VMM_API void vmm_config_init(vmm_config *cfg);
/* Applies every VMMARENA_* variable that is set (README.md, "Configuration"), all or nothing.
 * A bad value (an empty one, and the retired VMMARENA_STITCH, included) or a NULL cfg:
 * VMM_ERR_INVALID_ARGUMENT, cfg unchanged, and vmm_config_error() names the variable and the
 * value. On success it clears vmm_config_error(); trace_path then points into the
 * environment. */
VMM_API vmm_status vmm_config_from_env(vmm_config *cfg);
/* Sets one setting from text, as its variable would, by its environment name
 * ("VMMARENA_REUSE") or short name ("reuse", "limit", "trace", ...). An unknown name, a NULL
 * cfg, name or value, or a bad value: VMM_ERR_INVALID_ARGUMENT, cfg unchanged, and
 * vmm_config_error() says why. "trace" keeps the pointer value, which must live until
 * vmm_arena_create. */
VMM_API vmm_status vmm_config_set(vmm_config *cfg, const char *name, const char *value);
/* Message of the latest failed vmm_parse_size, vmm_config_set or vmm_config_from_env on this
 * thread, naming the setting and the value; "" if none. A thread-local buffer that the
 * thread's next such call overwrites. */
VMM_API const char *vmm_config_error(void);
/* Name of a policy ("exact", "bounded", "best-fit", "none"); "unknown" outside the enum. */
VMM_API const char *vmm_reuse_policy_name(vmm_reuse_policy p);

/* ---- Arena --------------------------------------------------------------------------- */

/* An allocator for one device: its address reservations, mapping records, pool and idle
 * handles. Opaque; made by vmm_arena_create, freed by vmm_arena_destroy. */
typedef struct vmm_arena vmm_arena;

/* Creates an arena for cfg->device (cfg NULL: the defaults) and stores it in *out: loads
 * libcuda.so.1 when cfg->driver is NULL, retains the device's primary context, checks the
 * peers and opens the trace file. On failure *out is NULL (out not NULL), nothing is held,
 * and vmm_create_error() says why:
 *   VMM_ERR_INVALID_ARGUMENT  NULL out; a device out of range or not present; a bad reuse bound,
 *                             policy or retention mode; reserve_bytes 0; a driver table older
 *                             than version 1; a peer that is absent or has no peer path; a
 *                             trace file that cannot be opened;
 *   VMM_ERR_NO_DRIVER         cfg->driver is NULL and libcuda.so.1 is missing or lacks an entry point;
 *   VMM_ERR_DRIVER            a driver call failed, or the device lacks virtual memory management;
 *   VMM_ERR_OUT_OF_MEMORY     the host or the driver ran out of memory. */
VMM_API vmm_status vmm_arena_create(const vmm_config *cfg, vmm_arena **out);
/* Message of the latest failed vmm_arena_create on this thread; "" if none. A thread-local
 * buffer that the thread's next failed create overwrites. */
VMM_API const char *vmm_create_error(void);
/* Synchronizes the device, then unmaps and releases everything the arena holds (live,
 * pooled, idle, paused and abandoned memory, backups), releases the primary context and
 * closes the trace. Driver failures are logged, not returned. NULL is a no-op. Must not race
 * any other call on the arena; its pointers are invalid afterwards. */
VMM_API void vmm_arena_destroy(vmm_arena *arena);

/* Allocates `bytes` (rounded up to the granularity) of `kind` for use on `stream`, tagged with
 * this thread's current tag, and stores its base in *out. Inside a retaining scope (in
 * whole-process mode outside one too, both kinds; see "Whole-process mode" below) it takes,
 * in order: a pooled mapping the reuse policy allows (transient only; no driver call); idle
 * handles mapped back to back with new memory for the rest (not under VMM_REUSE_NONE, nor for
 * package requests with package_assembly off); once new memory is refused, any pooled mapping
 * that fits, or idle handles the last of which is larger (transient only). Otherwise it
 * creates new memory. New memory must pass the limit and the headroom. A mapping freed on
 * another stream is reused only once ordered after its free. On failure *out is NULL (out not
 * NULL):
 *   VMM_ERR_INVALID_ARGUMENT  NULL out, unknown kind, 0 bytes or more than 2^47;
 *   VMM_ERR_OUT_OF_MEMORY     the limit, the headroom, the driver or the host refused new memory
 *                             and nothing idle could serve the request: recoverable, free and retry;
 *   VMM_ERR_DRIVER            a driver call failed. */
VMM_API vmm_status vmm_arena_alloc(vmm_arena *arena, size_t bytes, vmm_kind kind, CUstream stream, void **out);
/* Frees the allocation whose base is `ptr`; `stream` is the stream it was last used on.
 * Outside a retaining scope: synchronizes `stream`, unmaps and releases. Inside one a
 * transient mapping goes to the pool still mapped (no driver call), and a package one is
 * unmapped after the synchronize with its handles kept idle until finish. On a capturing
 * stream the unmap is deferred until a later call finds the capture over. In whole-process
 * mode a free, in a scope or not, keeps its memory cached and never waits for `stream` (see
 * "Whole-process mode" below); only shared-pool memory freed on a capturing stream while a
 * capture is underway is deferred until it ends. Memory of an aborted scope is only marked
 * abandoned; a paused allocation gives its range and backup back.
 *   VMM_ERR_UNKNOWN_POINTER  ptr is NULL, not from this arena, an interior pointer (the message
 *                            names the allocation) or already freed; nothing changes;
 *   VMM_ERR_DRIVER           a driver call failed; if it was the synchronize or the unmap, the
 *                            allocation stays live and a later free retries. */
VMM_API vmm_status vmm_arena_free(vmm_arena *arena, void *ptr, CUstream stream);
/* Synchronizes the device's context, so that the mappings pooled so far may go to any stream
 * with no event and finish waits for none of their streams; first completes the deferred frees
 * whose capture is over. VMM_ERR_DRIVER if the synchronize fails: the pooled mappings then
 * keep waiting for their streams. */
VMM_API vmm_status vmm_arena_quiesce(vmm_arena *arena);
/* Allocation granularity of the arena's device in bytes (0 for NULL); every extent and
 * rounded size is a multiple. */
VMM_API size_t vmm_arena_granularity(const vmm_arena *arena);
/* Device ordinal of the arena (-1 for NULL). */
VMM_API int vmm_arena_device(const vmm_arena *arena);
/* Sets the most physical bytes the arena may hold from now on, as vmm_config.limit_bytes
 * (VMMARENA_LIMIT) does at creation; 0 = none. What the arena holds already stays held, even
 * past the new limit; new memory past it is refused as any limit refusal is, and the request
 * falls back as vmm_arena_alloc says. No driver call; traced as a set-limit record. NULL arena:
 * VMM_ERR_INVALID_ARGUMENT. */
VMM_API vmm_status vmm_arena_set_limit(vmm_arena *arena, size_t bytes);
/* The device's free and total memory as the driver reports them (cuMemGetInfo); either out
 * may be NULL. NULL arena: VMM_ERR_INVALID_ARGUMENT; a failed call: VMM_ERR_DRIVER (recorded
 * as any driver failure) or VMM_ERR_OUT_OF_MEMORY, the driver's error in
 * vmm_arena_last_error, the outs unchanged. */
VMM_API vmm_status vmm_arena_device_memory(vmm_arena *arena, size_t *free_bytes, size_t *total_bytes);

/* ---- Whole-process mode: the arena as the caching layer of every allocation ---------- */

/* With vmm_config.caching on (VMMARENA_CACHE=on), the arena caches what is freed outside a
 * retention scope too, as it does inside one:
 *   - a free keeps its memory: the mapping stays mapped in the pool (either kind), and a later
 *     request of the same size, kind and pool takes it back with no driver call; any other
 *     request is assembled from idle handles (and from pooled mappings whose frees are known
 *     complete) before new memory is created;
 *   - a request below the granularity is carved from a page: a one-granule mapping cut into
 *     equal slots of one size class, serving one (size class, kind, tag, stream, pool); a
 *     page whose slots are all free goes back to the pool as a whole mapping;
 *   - nothing is released until vmm_arena_empty_cache, or until new memory is refused (the
 *     limit, the headroom or the driver): then the cache outside a scope is released and the
 *     request tried once more. Inside a scope nothing is released before finish.
 * Stream order is kept without a host wait on the allocation path: memory freed on a stream
 * is reused at once on it, and on another only once the program ordered that stream after the
 * free (vmm_arena_stream_waited), the free's work is known complete (an event queried), or
 * that stream waits for an event recorded after the free (the work of every stream
 * vmm_arena_record_stream added included). */

/* A pool of memory kept apart from the others: PyTorch's private pool of a CUDA graph. Memory
 * allocated into a pool and freed is reused only by allocations into the same pool until the
 * pool is released. 0 (VMM_POOL_SHARED) is the cache every other allocation shares. This "pool"
 * is always a graph's pool (inside the core: graph_pool; its "pool" alone is the tier of idle
 * mappings a free keeps). */
typedef uint64_t vmm_pool_id;
#define VMM_POOL_SHARED ((vmm_pool_id)0)

/* vmm_arena_alloc into `pool`. A request of pool p takes a pooled mapping or a page of pool p
 * first, else shared or new memory, which then belongs to p. Errors as vmm_arena_alloc; a
 * pool already released: VMM_ERR_INVALID_ARGUMENT, nothing allocated. */
VMM_API vmm_status vmm_arena_alloc_in(vmm_arena *arena, size_t bytes, vmm_kind kind, CUstream stream, vmm_pool_id pool,
                                      void **out);
/* Adds `stream` to the streams that use the allocation at `ptr` (a base, or a slot of a
 * page): once it is freed, its memory is reused only after the work queued on `stream` by then
 * is known complete (an event queried; or, as a last resort and under
 * VMMARENA_STREAM_ORDER=event, an event the reusing stream waits on; the host never waits). A
 * stream that is the allocation's own, or already added, is a no-op.
 *   VMM_ERR_UNKNOWN_POINTER   ptr is not a live or paused allocation; nothing changes;
 *   VMM_ERR_OUT_OF_MEMORY     no host memory to remember the stream; nothing changes. */
VMM_API vmm_status vmm_arena_record_stream(vmm_arena *arena, void *ptr, CUstream stream);

/* The program's own stream order, so that memory freed on one stream serves another that the
 * program made wait for it, with no event of the arena's and before the free is complete
 * (PyTorch's Stream.wait_stream: an event recorded on the source, waited for by the waiter).
 * vmm_arena_stream_mark, called just before the program records its event on `stream`, gives
 * the mark that event stands for: every free whose work was queued on `stream` by then (its
 * own free, or a record_stream use) lies at or before it; 0 while `stream` captures. */
VMM_API vmm_status vmm_arena_stream_mark(vmm_arena *arena, CUstream stream, uint64_t *mark);
/* The program made `waiter` wait for the event it recorded on `source` at `mark`: from now on
 * memory freed with work on `source` at or before the mark serves requests on `waiter` (not
 * while it captures) with no further order. Nothing is learned for mark 0, waiter == source,
 * or a capturing waiter. Remembers the latest marks of 8 waiters per source stream. A waiter
 * must not be a stream destroyed and made again since the mark (its handle would be reused).
 *   VMM_ERR_INVALID_ARGUMENT  arena NULL, or a mark past the arena's (from another arena, say);
 *                             nothing learned. */
VMM_API vmm_status vmm_arena_stream_waited(vmm_arena *arena, CUstream waiter, CUstream source, uint64_t mark);

/* The bytes the live (or paused) allocation at `ptr` holds: its mapping's extent, or its slot's
 * size for a slot of a page (PyTorch's block size, in the native allocator's statistics).
 *   VMM_ERR_UNKNOWN_POINTER   ptr is not the base of a live allocation; *bytes unchanged. */
VMM_API vmm_status vmm_arena_allocation_size(vmm_arena *arena, void *ptr, size_t *bytes);
/* A capture into `pool` begins or ends (PyTorch's begin and end of allocating to a pool).
 * While a capture is underway, a free of shared-pool memory on a capturing stream waits for the
 * capture to end before its memory is reused (the graph may use it until then); otherwise a
 * free asks the driver nothing. VMM_POOL_SHARED or a released pool (begin), or an end with no
 * capture underway: VMM_ERR_INVALID_ARGUMENT, nothing changed. */
VMM_API vmm_status vmm_arena_capture_begin(vmm_arena *arena, vmm_pool_id pool);
VMM_API vmm_status vmm_arena_capture_end(vmm_arena *arena, vmm_pool_id pool);
/* Releases `pool` (its graph is gone): waits for the device's work, then the pool's cached
 * memory joins the shared cache, and its live allocations join it when they are freed. Later
 * requests into `pool` are refused. Releasing VMM_POOL_SHARED: VMM_ERR_INVALID_ARGUMENT.
 * VMM_ERR_DRIVER if the wait fails; the pool then stays as it was. */
VMM_API vmm_status vmm_arena_release_pool(vmm_arena *arena, vmm_pool_id pool);
/* Gives the cached memory back to the driver: outside a retention scope, every pooled
 * mapping is unmapped (after its stream's work) and every idle handle released; empty pages
 * went back to the pool already. Inside a scope nothing is released (the scope's rule) and the
 * call returns VMM_OK. A failed unmap or release stops the call with VMM_ERR_DRIVER, keeping
 * what it had not reached cached; a later call resumes. */
VMM_API vmm_status vmm_arena_empty_cache(vmm_arena *arena);

/* Usage in the terms of PyTorch's allocator statistics. */
typedef struct vmm_usage {
  uint64_t allocated_bytes, allocated_peak_bytes;   /* handed out: whole mappings' extents and page slots */
  uint64_t allocations, allocations_peak;           /* live allocations (mappings and slots) */
  uint64_t reserved_bytes, reserved_peak_bytes;     /* physical memory held (the snapshot's physical bytes) */
  uint64_t cached_bytes;                            /* reserved but not handed out: pooled, idle, page room */
  uint64_t alloc_count, free_count;                 /* successful allocations and frees, ever */
  uint64_t refusals;                                /* allocations refused for want of memory, ever */
  uint64_t cache_releases;                          /* times the cache was released to serve a request */
  uint64_t pages, page_slots_used;                  /* pages carved now, and their slots in use */
} vmm_usage;

/* The arena's usage now. NULL arena or out: VMM_ERR_INVALID_ARGUMENT. */
VMM_API vmm_status vmm_arena_usage(vmm_arena *arena, vmm_usage *out);
/* Sets every peak of vmm_usage (and the snapshot's physical and mapped peaks) to the current
 * value. NULL arena: VMM_ERR_INVALID_ARGUMENT. */
VMM_API vmm_status vmm_arena_reset_peaks(vmm_arena *arena);

/* ---- Retention scope ----------------------------------------------------------------- */

/* Begins a retention scope. While it is active and the arena retains (VMMARENA_RETAIN on, or
 * auto on an integrated GPU: vmm_snapshot.retention_enabled), no free releases physical
 * memory: transient mappings are pooled, other freed memory is kept as idle handles, and
 * allocations use both before creating memory. Otherwise a scope is bookkeeping only. No
 * driver call. VMM_ERR_SCOPE_STATE if a scope is active already (scopes do not nest). */
VMM_API vmm_status vmm_retention_begin(vmm_arena *arena);
/* Ends the scope and releases what it retained. First, touching nothing, it returns
 * VMM_ERR_SCOPE_STATE when no scope is active, when the pool fails its consistency check, or
 * when a stream that freed a pooled mapping since the last quiesce is capturing a CUDA graph
 * (retry once the capture ends), and VMM_ERR_DRIVER when waiting for such a stream fails.
 * Then it unmaps every pooled mapping and releases every idle handle: a failed unmap or
 * release returns VMM_ERR_DRIVER with that mapping or handle kept where it was and the scope
 * still active, and a later finish carries on. Allocations live at finish stay live. */
VMM_API vmm_status vmm_retention_finish(vmm_arena *arena);
/* Gives the scope up with no driver call, now or later, for its memory: pooled mappings and
 * idle handles become abandoned, as do the scope's allocations when freed later; they stay
 * held (reported as abandoned) until vmm_arena_destroy. Paused allocations stay paused.
 * VMM_ERR_SCOPE_STATE if no scope is active; VMM_ERR_OUT_OF_MEMORY if the host has no memory
 * to record the abort. Either failure leaves the scope as it was. */
VMM_API vmm_status vmm_retention_abort(vmm_arena *arena);

/* ---- Pause and resume ---------------------------------------------------------------- */

/* What vmm_arena_pause does with the contents. */
typedef enum vmm_pause_mode {
  VMM_PAUSE_DISCARD, /* the contents are dropped */
  VMM_PAUSE_BACKUP   /* the contents are copied to host memory and back on resume */
} vmm_pause_mode;

/* Takes the physical memory of every live allocation tagged `tag` (NULL: untagged) away and
 * keeps each one's virtual range, so pointers held by graphs and tensors stay valid. Outside
 * a retaining scope the handles are released; inside one they become idle handles (used by
 * other allocations, released by finish). These refusals change nothing:
 *   VMM_ERR_INVALID_ARGUMENT  an unknown mode; VMM_PAUSE_BACKUP with a driver table that lacks
 *                             the copy entry points (older than version 2); a tag never used,
 *                             or one with no live allocation;
 *   VMM_ERR_SCOPE_STATE       an allocation's stream is capturing a CUDA graph, or with
 *                             VMM_PAUSE_BACKUP the legacy stream, which the copy uses, would
 *                             join a capture;
 *   VMM_ERR_OUT_OF_MEMORY     no host memory for the list of allocations;
 *   VMM_ERR_DRIVER            reading a capture state or synchronizing a stream failed.
 * Then it synchronizes each allocation's stream once and pauses the allocations one by one in
 * address order, each whole (with VMM_PAUSE_BACKUP copied to host memory first). A failure
 * there (VMM_ERR_OUT_OF_MEMORY: no host memory for a backup; VMM_ERR_DRIVER) stops the call:
 * what it paused stays paused, the rest stays live, and calling again pauses the rest. */
VMM_API vmm_status vmm_arena_pause(vmm_arena *arena, const char *tag, vmm_pause_mode mode);
/* Maps memory back into the range of every paused allocation tagged `tag` (NULL: untagged),
 * at the same addresses, and copies backups back. Inside a retaining scope the memory is
 * assembled from idle handles first; new memory must pass the limit and the headroom.
 *   VMM_ERR_INVALID_ARGUMENT  a tag never used, or nothing paused under it (nothing changes);
 *   VMM_ERR_SCOPE_STATE       a backup is to be copied and the legacy stream, which the copy
 *                             uses, would join a capture (nothing changes);
 *   VMM_ERR_OUT_OF_MEMORY     new memory was refused, or host memory ran out (recoverable);
 *   VMM_ERR_DRIVER            a driver call failed.
 * A failure stops the call: what it resumed stays resumed, the rest stays paused, and calling
 * again carries on (after a failed copy, only the copy is retried). */
VMM_API vmm_status vmm_arena_resume(vmm_arena *arena, const char *tag);

/* ---- Sharing memory between processes (CUDA IPC; src/ipc.c) -------------------------- */

/* One handle of a shared allocation: a POSIX file descriptor of its physical memory, and
 * where it lies in the shared range (pieces are back to back in address order from offset 0;
 * an assembled allocation has several). */
typedef struct vmm_ipc_piece {
  int fd;        /* export: the arena's descriptor (valid while the handle lives, never closed by
                    the caller); import: the caller's descriptor (the arena does not close it) */
  size_t offset; /* where the piece starts in the shared range */
  size_t size;   /* bytes of the handle: a multiple of the granularity */
} vmm_ipc_piece;

/* Whether the arena creates its memory exportable (POSIX file descriptors): on in whole-process
 * mode (vmm_config.caching) with a driver table of version 4 or later, until the driver refuses
 * an exportable handle; memory is then created plain from that call on, and exporting it is
 * refused. 0 for NULL. */
VMM_API int vmm_arena_ipc_exportable(vmm_arena *arena);
/* The handles backing the live allocation (or page slot) at `ptr`, for another process: at most
 * `cap` pieces in address order into `pieces`, their number in *count, and in *offset where ptr
 * lies in the range they make. The first export of a handle makes its descriptor
 * (cuMemExportToShareableHandle); the arena keeps it open until the handle goes back to the
 * driver, so exporting again makes no call and the receiver has until then to duplicate it
 * (pidfd_getfd). A failure exports nothing new (descriptors made by the call are closed):
 *   VMM_ERR_INVALID_ARGUMENT  NULL pieces, count or offset; cap too small (*count then says
 *                             how many are needed); a driver table older than version 4;
 *   VMM_ERR_UNKNOWN_POINTER   ptr is not the base of a live allocation or slot (the message
 *                             names what is there), or the allocation is paused;
 *   VMM_ERR_DRIVER            the driver refused to export a handle (memory created plain,
 *                             say): not recorded as fatal, the arena is untouched. */
VMM_API vmm_status vmm_arena_ipc_export(vmm_arena *arena, void *ptr, vmm_ipc_piece *pieces, size_t cap,
                                        size_t *count, size_t *offset);
/* Maps memory another process exported into a fresh VA reservation of this arena's device,
 * back to back as `pieces` (count of them, from offset 0, sizes granularity multiples) say,
 * with the arena's access (its device and peers), and stores its base in *base. The descriptors
 * stay the caller's. Nothing of the arena's own memory changes; on failure everything the call
 * made is undone and *base is NULL (base not NULL):
 *   VMM_ERR_INVALID_ARGUMENT  NULL pieces or base, no pieces, pieces not back to back, a size not
 *                             a granularity multiple, a driver table older than version 4; a
 *                             descriptor that is not a handle's (forged, closed, stale:
 *                             cuMemImportFromShareableHandle refused it), a handle of another
 *                             device, or one whose size is not the piece's (cuMemMap refused it);
 *   VMM_ERR_OUT_OF_MEMORY     no host memory, or no VA for the range;
 *   VMM_ERR_DRIVER            another driver failure (not recorded as fatal).
 * Release it with vmm_arena_ipc_close; vmm_arena_destroy releases those still open. */
VMM_API vmm_status vmm_arena_ipc_import(vmm_arena *arena, const vmm_ipc_piece *pieces, size_t count, void **base);
/* Synchronizes the context (work may still use the memory), then unmaps and releases an
 * import of vmm_arena_ipc_import and frees its VA.
 *   VMM_ERR_UNKNOWN_POINTER  base is not an open import of this arena;
 *   VMM_ERR_DRIVER           a driver call failed: the import stays open as far as it got, and a
 *                            later close carries on. */
VMM_API vmm_status vmm_arena_ipc_close(vmm_arena *arena, void *base);
/* Imports open now (0 for NULL). */
VMM_API size_t vmm_arena_ipc_imports(vmm_arena *arena);

/* ---- Errors -------------------------------------------------------------------------- */

/* Message of the arena's latest failure, from any thread, with its numbers: requested and
 * rounded bytes, what was found and required, what the arena holds, the driver entry point
 * and its CUresult name. "" if none; "no arena" for NULL. A success does not clear it. The
 * text is a copy in a buffer of the calling thread, valid until its next call here. */
VMM_API const char *vmm_arena_last_error(vmm_arena *arena);
/* The first fatal error (a driver failure other than out-of-memory), kept across later
 * failures: returns its status (VMM_ERR_DRIVER) and sets *message (if message is not NULL) to
 * its text, valid until destroy; VMM_OK and "" if there was none. VMM_ERR_INVALID_ARGUMENT for
 * a NULL arena, *message untouched. */
VMM_API vmm_status vmm_arena_fatal_error(vmm_arena *arena, const char **message);

/* ---- Tags ---------------------------------------------------------------------------- */

/* Makes `tag` the label of this thread's new allocations, in every arena, until the matching
 * vmm_tag_pop; pushes nest. NULL pushes "untagged". The text is copied once per process
 * (interned) and kept. Cannot fail: without host memory the level counts as untagged. */
VMM_API void vmm_tag_push(const char *tag);
/* Ends the latest vmm_tag_push of this thread; a no-op with none. */
VMM_API void vmm_tag_pop(void);
/* Current tag of this thread (the interned copy, kept for the process), or NULL for none. */
VMM_API const char *vmm_tag_current(void);

/* ---- Snapshot ------------------------------------------------------------------------ */

/* Allocations of one kind by state: counts and full extents in bytes (retained: handles). */
typedef struct vmm_kind_stats {
  uint64_t live_count, live_bytes;           /* allocations handed out and not freed */
  uint64_t pooled_count, pooled_bytes;       /* idle mappings in the pool, still mapped (transient) */
  uint64_t idle_count, idle_bytes;   /* idle handles unmapped: reusable, released at finish */
  uint64_t abandoned_count, abandoned_bytes; /* held by an aborted scope until destroy */
  uint64_t paused_count, paused_bytes;       /* paused allocations: VA kept, no physical memory */
} vmm_kind_stats;

/* Calls of one driver entry point, made by this arena. */
typedef struct vmm_driver_stats {
  uint64_t calls;    /* calls made */
  uint64_t failures; /* calls that returned an error */
  uint64_t ns;       /* cumulative wall time in the call */
} vmm_driver_stats;

/* Whether a retention scope is active on the arena. */
typedef enum vmm_scope_state { VMM_SCOPE_NONE, VMM_SCOPE_ACTIVE } vmm_scope_state;

/* What an arena holds and has done, read at one moment under its lock. docs/snapshot.md maps
 * each field to the JSON document, which adds the inventory, the buckets and the tags. */
typedef struct vmm_snapshot {
  int device;                      /* CUDA device ordinal */
  int integrated;                  /* device shares host memory */
  int retention_enabled;           /* the resolved retention mode: a scope keeps freed memory */
  vmm_reuse_policy reuse;          /* the reuse policy */
  double reuse_bound;              /* F of bounded:F (1 for exact) */
  size_t granularity;              /* allocation granularity; every extent is a multiple */
  size_t headroom_bytes, limit_bytes; /* configured headroom and limit; 0 = none */
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t physical_bytes, physical_peak_bytes; /* bytes of handles the arena holds */
  uint64_t mapped_bytes, mapped_peak_bytes;     /* bytes mapped into VA */
  uint64_t reserved_va_bytes, reservations;     /* VA reserved, in how many reservations */
  uint64_t retained_reusable_handles;           /* idle handles, mapped (pooled) and unmapped */
  uint64_t retained_reusable_bytes;             /* their bytes */
  uint64_t pool_buckets;                        /* distinct sizes in the pool */
  uint64_t pool_hits, pool_misses, pool_fallbacks; /* allocations that could take a pooled mapping
                                                      (transient ones in a scope; in whole-process
                                                      mode every one) that the policy served,
                                                      found nothing for, and refused ones any
                                                      pooled mapping served */
  uint64_t handle_bound_bytes;                  /* largest handle created inside a scope */
  uint64_t assemblies;                          /* allocations mapped from idle handles (+ new memory) */
  uint64_t padded_assemblies;                   /* of those, fallbacks that used a larger handle */
  uint64_t assembled_idle_handles;              /* idle handles mapped again by assemblies */
  uint64_t assembly_created_bytes;              /* new memory created to top assemblies up */
  uint64_t pooled_taken_apart;                  /* pooled mappings taken apart to serve assemblies */
  uint64_t prefix_hits;                         /* whole-process mode: requests served in place by
                                                   the first handles of a larger pooled mapping */
  uint64_t ranges_handed_to_retiring;           /* whole-process mode: ranges retired so far, kept
                                                   mapped on the retiring list instead of unmapped
                                                   (retiring_ranges: those on it now) */
  uint64_t retiring_ranges, retiring_bytes;     /* ranges retiring now (whole-process mode): the old
                                                   ranges of pooled mappings an assembly took
                                                   apart, mapped still (unmapped by empty_cache, or
                                                   beyond 256 kept to serve again) */
  uint64_t revived_ranges;                      /* retired ranges that served a request again as
                                                   they were mapped (no driver call) */
  uint64_t revived_runs;                        /* of those, runs of a larger retired range's
                                                   handles (the parts around them stay retired) */
  uint64_t refills;                             /* misses given new memory instead of several
                                                   cached handles (VMMARENA_REFILL=below-peak or
                                                   within-live) */
  uint64_t run_hits;                            /* whole-process mode: requests served in place by
                                                   handles inside a larger pooled mapping, after
                                                   its first (prefix_hits: from its first) */
  uint64_t unmapped_in_background;              /* retired ranges handed to the arena's unmapper
                                                   thread (VMMARENA_UNMAP=background) */
  uint64_t grown_in_place;                      /* whole-process mode: assemblies that kept a
                                                   pooled mapping where it was mapped and mapped
                                                   the rest beside it (VMMARENA_GROW) */
  uint64_t oom_refusals, limit_refusals, headroom_refusals; /* requests refused new memory by the
                                                               driver, the limit, the headroom */
  uint64_t allocs, frees, deferred_frees;       /* successful calls; frees deferred by a capture */
  vmm_scope_state scope_state;                  /* a scope is active or not */
  uint64_t scopes_begun, scopes_finished, scopes_aborted; /* scopes so far */
  vmm_driver_stats driver[VMM_DRV_ENTRY_COUNT]; /* per entry point, by vmm_driver_entry */
  vmm_status fatal_status;                      /* VMM_OK if no fatal error */
} vmm_snapshot;

/* Fills *out with the arena's figures, read at one moment; no driver call.
 * VMM_ERR_INVALID_ARGUMENT for a NULL out (nothing written). */
VMM_API vmm_status vmm_arena_snapshot(vmm_arena *arena, vmm_snapshot *out);
/* Writes the JSON snapshot (docs/snapshot.md) into buf, NUL-terminated, and stores in *needed
 * (if not NULL) the size the whole document needs, NUL included; buf NULL with cap 0 asks
 * for the size only. No driver call.
 *   VMM_ERR_INVALID_ARGUMENT  buf NULL with cap > 0, or cap smaller than needed: buf then holds
 *                             a NUL-terminated prefix, not a document (ask again: the size
 *                             grows when other threads allocate meanwhile);
 *   VMM_ERR_OUT_OF_MEMORY     no host memory to list the mappings: the document has none. */
VMM_API vmm_status vmm_arena_snapshot_json(vmm_arena *arena, char *buf, size_t cap, size_t *needed);

/* ---- Invariants ---------------------------------------------------------------------- */

/* Walks every structure (ranges disjoint and inside reservations, free list coalesced, pool
 * buckets non-empty and sorted, counters equal to a recount). Returns 0 if sound, otherwise
 * -1 with a description in why (cap bytes, NUL-terminated; why may be NULL); -1 for a NULL
 * arena. Changes nothing; no driver call. A failure is a bug of the library. */
VMM_API int vmm_arena_check(vmm_arena *arena, char *why, size_t cap);

/* ---- Trace --------------------------------------------------------------------------- */

/* Stops the arena's operation trace (docs/trace.md), if any, and with a path starts a new one
 * in that file (truncated). VMM_ERR_INVALID_ARGUMENT if the file cannot be opened: tracing
 * is then off. */
VMM_API vmm_status vmm_arena_trace(vmm_arena *arena, const char *path);

#ifdef __cplusplus
}
#endif
#endif
