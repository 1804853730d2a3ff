/* The fake driver's device timeline (fake_timeline.c): a race detector for device memory.
 *
 * Each stream runs its work in order. Every happens-before edge is kept as a vector clock:
 * program order on a stream, cuEventRecord + cuStreamWaitEvent, and what the host knows
 * complete, which only the driver calls the allocator makes teach it (cuStreamSynchronize,
 * cuCtxSynchronize, an event whose completion cuEventQuery answered), never the fake's clock.
 * Work the host launches is ordered after everything the host knows complete.
 *
 * Device accesses (kernels a test declares, asynchronous copies) are kept per physical handle
 * and offset, so one handle mapped at two addresses is one memory. An access belongs to an
 * owner: the allocation a test declared it on, or 0 for the allocator's own copies. The
 * timeline flags, naming both operations:
 *   - an access while an access of another owner (or any access of the allocator's) to the
 *     same bytes has no happens-before edge to it (memory handed out too early);
 *   - an unmap or release while an access through that range or of that handle is not known
 *     complete to the host;
 *   - a release, inside a retaining scope before finish, of memory that served an allocation
 *     (it has accesses; asked of a guard the test sets);
 *   - a synchronize, record or wait on a capturing stream;
 *   - an access of unmapped memory.
 * Kernels on a capturing stream belong to the graph being captured (a node that depends on the
 * stream's capture dependencies; see "Graphs" in fake_timeline.c) and run on the stream a test
 * launches the graph on; a captured kernel not ordered, within its graph, after an earlier
 * captured kernel of another owner touching the same bytes is a REUSE violation. Internal to
 * the fake: fake_driver.c calls these with its lock held; tests use the functions fake_driver.h
 * declares. */
#ifndef VMMARENA_FAKE_TIMELINE_H
#define VMMARENA_FAKE_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "fake_driver.h"

/* A handle's accesses, owned by the timeline; NULL until the first. */
typedef struct tl_records tl_records;

/* One piece of an access: `len` bytes at `off` into the handle whose records are *acc,
 * reached through VA `va`. */
typedef struct tl_piece {
  tl_records **acc;
  size_t off, len;
  CUdeviceptr va;
  unsigned long long handle; /* for messages */
} tl_piece;

void tl_reset(void);
/* Flags a violation of `kind` (printf-style text). */
void tl_violation(fake_violation_kind kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Host-issued device work: an access of the pieces by `owner` on `stream` (a kernel or a copy,
 * named by `what`). On a capturing stream a kernel joins the capture instead (returns 1). */
int tl_capture_kernel(CUstream stream, CUdeviceptr ptr, size_t n, uint64_t owner);
void tl_access(CUstream stream, uint64_t owner, const char *what, const tl_piece *p, size_t n);

/* Edges the driver calls make (after they succeeded). */
void tl_event_record(CUevent e, CUstream s);
void tl_stream_wait_event(CUstream s, CUevent e);
void tl_stream_synchronize(CUstream s);
void tl_ctx_synchronize(void);
void tl_event_completed(CUevent e);
void tl_event_destroy(CUevent e);
/* The program's own edge: `waiter` runs after the work queued on `waited` so far. */
void tl_program_wait(CUstream waiter, CUstream waited);

/* Memory going away: an unmap of [va, va + len) of a handle (checked, records kept), a
 * release (checked), and the handle's physical memory freed (records dropped). */
void tl_unmap(tl_records **acc, CUdeviceptr va, size_t len, unsigned long long handle);
void tl_release(tl_records **acc, unsigned long long handle, size_t size, int device);
void tl_forget(tl_records **acc);
/* The release guard of a device (fake_set_release_guard); it goes when the device's primary
 * context is released. */
void tl_set_guard(int device, int (*forbids)(void *ctx), void *ctx);
void tl_device_closed(int device);

/* Capture bookkeeping: a stream starts a capture of its own, or ends the capture it is in (every
 * stream of that capture stops; the graph is kept). */
void tl_capture_state(CUstream s, int capturing);
/* Whether `s` takes part in a capture; how many streams do. */
int tl_capturing(CUstream s);
size_t tl_capturing_streams(void);
/* A capturing stream's capture id and dependency set (valid until the next timeline call): 1,
 * or 0 where it does not capture. */
int tl_capture_info(CUstream s, uint64_t *id, const CUgraphNode **deps, size_t *n);
/* A node's dependencies: 0, or -1 for an unknown node. */
int tl_node_deps(CUgraphNode node, const CUgraphNode **deps, size_t *n);
/* The kernels of a graph, for fake_graph_launch (NULL if unknown): n kernels of (ptr, len, owner). */
typedef struct tl_kernel {
  CUdeviceptr ptr;
  size_t len;
  uint64_t owner;
} tl_kernel;
const tl_kernel *tl_graph(uint64_t graph, size_t *n);
uint64_t tl_last_graph(void);
uint64_t tl_owner_new(void);

/* What fake_violations, fake_violation_text and fake_violations_clear answer. */
size_t tl_violations(fake_violation_kind kind);
const char *tl_violation_text(size_t i);
void tl_violations_clear(void);

#endif
