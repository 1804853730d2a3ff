/* A fake CUDA driver for tests: simulates granularity, physical capacity, VA reservations,
 * handles, mappings, access, streams (capture state, creation), events, pinned host memory
 * (heap memory) and memory figures; keeps a ledger of every live object and every call;
 * injects faults at any entry point.
 * Not thread-safe by itself except where noted: one global fake, guarded by one mutex. */
#ifndef VMMARENA_FAKE_DRIVER_H
#define VMMARENA_FAKE_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "vmmarena/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_MAX_DEVICES 4

typedef struct fake_options {
  int device_count;          /* default 1, at most FAKE_MAX_DEVICES */
  size_t granularity;        /* default 2 MiB */
  size_t capacity;           /* physical bytes per device; default 80 GiB */
  size_t va_space;           /* total VA the fake hands out; default 1 TiB */
  int integrated;            /* CU_DEVICE_ATTRIBUTE_INTEGRATED of every device; default 0 */
  size_t host_mem_available; /* what host_memory_available reports; default 64 GiB */
  int peer_access;           /* cuDeviceCanAccessPeer answer; default 1 */
  int record_calls;          /* keep the call log (default 1; -1 = off); off for benchmarks */
} fake_options;

/* Resets the fake to a clean state with these options (NULL = defaults) and returns its table. */
const struct vmm_driver *fake_driver_reset(const fake_options *opts);
/* The table of the current fake (valid after a reset). */
const struct vmm_driver *fake_driver(void);
/* The same fake without cuStreamGetCaptureInfo and cuGraphNodeGetDependencies (NULL fields), as
 * a driver that lacks them. */
const struct vmm_driver *fake_driver_without_capture_graph(void);

/* ---- Fault injection ----------------------------------------------------------------- */
/* Fail the Nth call (1-based, counted from now) of `entry` with `result`; once, or that call
 * and every later call of that entry point while `persistent`. One rule per entry point;
 * a new rule replaces the old. */
void fake_fail_nth(vmm_driver_entry entry, unsigned nth, CUresult result, int persistent);
/* Fail the Nth driver call of any entry point (counted from now), once or persistently. */
void fake_fail_nth_any(unsigned nth, CUresult result, int persistent);
void fake_clear_faults(void);
/* Calls that an injected fault failed so far. */
unsigned fake_faults_fired(void);

/* ---- Simulated state ----------------------------------------------------------------- */
void fake_set_capacity(int device, size_t bytes);
void fake_set_host_mem_available(size_t bytes);
void fake_set_integrated(int integrated);
/* While set, cuMemCreate refuses (CUDA_ERROR_NOT_SUPPORTED) a handle with a shareable handle
 * type requested, as drivers that cannot export do. An exported descriptor is a real one (a
 * memfd holding the handle's id): tests count them in /proc/self/fd. */
void fake_set_export_refused(int refused);
/* While set, a potentially unsafe call (cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease,
 * cuMemSetAccess, cuEventQuery) made while a stream captures, by a thread whose capture mode
 * is not relaxed, is misuse and fails: a capture begun in global mode would be invalidated. */
void fake_set_strict_capture(int strict);
/* While set, cuEventQuery answers CUDA_ERROR_NOT_READY for every event (the device is
 * behind the host); otherwise every recorded event is complete. */
void fake_set_events_pending(int pending);
/* A device `ops` operations behind the host: an event recorded when the clock stood at t
 * completes once fake_advance_clock has taken it to t + ops, or at the next synchronize of a
 * stream or the context (one queue: everything issued before it completes). 0 (the default
 * after a reset): at once. The clock starts at 0 and only fake_advance_clock moves it. */
void fake_set_event_lag(uint64_t ops);
void fake_advance_clock(uint64_t ops);
/* Streams are any non-NULL pointer value the test invents. Set capturing, a stream begins a
 * capture of its own (a graph, empty dependency set); unset, the capture it is in ends, for
 * every stream in it (fake_program_wait brings a stream into a capture). */
void fake_set_capturing(CUstream stream, int capturing);
/* Calls made on threads other than the one of the last reset wait `us` microseconds before
 * they run (0, the default after a reset: none), so that a test can see what waits for them. */
void fake_set_other_thread_delay(unsigned us);

/* ---- Ledger -------------------------------------------------------------------------- */
typedef struct fake_ledger {
  size_t live_handles, live_handle_bytes; /* created, not released */
  size_t live_mappings, mapped_bytes;     /* mapped, not unmapped */
  size_t reservations, reserved_bytes;    /* reserved, not freed */
  size_t live_events;
  size_t live_host_allocs, pinned_host_bytes; /* cuMemHostAlloc, not freed */
  size_t live_streams;                    /* cuStreamCreate, not destroyed */
  size_t calls;                           /* every call so far */
  size_t errors;                          /* misuse the fake detected (double release, unmap of unmapped, ...) */
  size_t ctx_pushed;                      /* push minus pop */
  size_t primary_retained;                /* retain minus release */
  size_t calls_by_entry[VMM_DRV_ENTRY_COUNT];
  size_t exports, imports;                /* cuMemExportToShareableHandle, cuMemImportFromShareableHandle
                                             successes (an import is a live handle until released) */
  size_t released_mapped_bytes;           /* of released handles, still mapped: memory the real
                                             driver would still hold */
} fake_ledger;

void fake_get_ledger(fake_ledger *out);
/* 1 if nothing is live (handles, mappings, reservations, events, pushed contexts, retained
 * primary contexts, pinned host memory, created streams) and no misuse was detected; otherwise
 * 0 and prints what is left. */
int fake_ledger_clean(void);
/* Text of the first misuse the fake detected, or NULL. */
const char *fake_first_error(void);

/* The call log: entry point and result of every call in order (if record_calls). */
typedef struct fake_call {
  vmm_driver_entry entry;
  CUresult result;
  uintptr_t a0, a1; /* first two arguments as integers: ptr/size, handle, stream, event ... */
  int other_thread; /* made by a thread other than the one of the last reset */
  uint64_t ns;      /* when it was made (CLOCK_MONOTONIC, as vmm_driver_now_ns) */
} fake_call;
size_t fake_call_count(void);
const fake_call *fake_call_at(size_t index);
/* Number of calls of `entry` in the log from index `from` on. */
size_t fake_calls_since(size_t from, vmm_driver_entry entry);

/* Handles and the physical memory they hold, for checks: bytes of handle backing `ptr`
 * through a mapping, 0 if unmapped. */
size_t fake_mapped_size_at(CUdeviceptr ptr);
/* What a kernel would write or read: contents of the mapped range [ptr, ptr+n) (0, or -1 if
 * some byte is unmapped or has no access; a failed read or write counts as misuse). */
int fake_write(CUdeviceptr ptr, const void *src, size_t n);
int fake_read(CUdeviceptr ptr, void *dst, size_t n);
/* Whether device `dev` was given access to the mapping at ptr. */
int fake_access_granted(CUdeviceptr ptr, int dev);

/* ---- Device timeline (fake_timeline.c, fake_timeline.h says what it checks) ---------- */
typedef enum fake_violation_kind {
  FAKE_VIOLATION_REUSE,           /* an access not ordered after another owner's access of the same bytes */
  FAKE_VIOLATION_UNMAP,           /* an unmap while an access through the range is not known complete */
  FAKE_VIOLATION_RELEASE,         /* a release while an access of the handle is not known complete */
  FAKE_VIOLATION_SCOPE_RELEASE,   /* a release inside a retaining scope, before finish */
  FAKE_VIOLATION_CAPTURE_SYNC,    /* a synchronize, record or wait on a capturing stream */
  FAKE_VIOLATION_UNMAPPED_ACCESS, /* an access of memory that is not mapped */
  FAKE_VIOLATION_KINDS
} fake_violation_kind;

/* A fresh owner: the allocation a test's kernels belong to. */
uint64_t fake_owner_new(void);
/* A kernel of `owner` reading and writing [ptr, ptr + n) on `stream`, launched now; on a
 * capturing stream it joins the graph being captured. Returns 0, or -1 where it touched
 * unmapped memory (a violation). */
int fake_kernel(CUstream stream, CUdeviceptr ptr, size_t n, uint64_t owner);
/* The program orders `waiter` after the work queued on `waited` (an event it records and
 * waits for itself, as torch's wait_stream). Where `waited` captures, the record captures its
 * dependency set and the wait adds it to `waiter`'s, which joins the capture if it was not in
 * one (cuStreamGetCaptureInfo, cuGraphNodeGetDependencies answer from these graphs). */
void fake_program_wait(CUstream waiter, CUstream waited);
/* The graph of the capture that ended last (fake_set_capturing(s, 0)), 0 if none. */
uint64_t fake_graph_last(void);
/* Launches a graph's kernels on `stream`, at the addresses they were captured at. */
void fake_graph_launch(uint64_t graph, CUstream stream);
/* A release on `device` is a violation while forbids(ctx) is non-zero (a retaining scope is
 * active and not finishing). The guard goes when the device's primary context is released,
 * at a reset, or with forbids NULL. */
void fake_set_release_guard(int device, int (*forbids)(void *ctx), void *ctx);
/* Violations so far of `kind` (FAKE_VIOLATION_KINDS: of every kind). */
size_t fake_violations(fake_violation_kind kind);
/* The text of the i-th violation (the first 32 are kept), or NULL. */
const char *fake_violation_text(size_t i);
/* Forgets the violations (a test that planted them, once it has checked them). */
void fake_violations_clear(void);

#ifdef __cplusplus
}
#endif
#endif
