/* Shared helpers for the cmocka suites: an arena on a fresh fake driver, and the checks
 * every test ends with (invariants hold, nothing leaked, no driver misuse). */
#ifndef VMMARENA_TEST_UTIL_H
#define VMMARENA_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake_driver.h"
#include "vmmarena.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Resets the fake with opts (NULL = defaults) and creates an arena with cfg (NULL = defaults
 * with retention on); asserts success. A release on its device inside a retaining scope,
 * before finish, is a violation of the fake's timeline. */
vmm_arena *tu_arena(const fake_options *opts, const vmm_config *cfg);
/* A default config on the current fake, retention on. */
vmm_config tu_config(void);
/* Asserts the invariant checker passes. */
void tu_check(vmm_arena *a);
/* Checks, destroys the arena and asserts the fake's ledger is clean. */
void tu_destroy(vmm_arena *a);
/* The arena's snapshot; asserts it is taken. */
vmm_snapshot tu_snapshot(vmm_arena *a);
/* Asserts that an allocation succeeds and returns its pointer. Its first use, a kernel of a
 * fresh owner on `s`, goes on the fake's timeline. */
void *tu_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s);
/* Asserts that a free succeeds (printing the arena's message if not). For an allocation of
 * tu_alloc, still mapped, its last use goes on the timeline first: a kernel on `s`, ordered
 * after its allocation stream as a program orders it. */
void tu_free(vmm_arena *a, void *p, CUstream s);
/* A kernel using p (of tu_alloc) on s, which the program first orders after p's stream, as
 * a program does before it uses memory on another stream (then record_stream). */
void tu_use(void *p, CUstream s);
/* Index of the first call of `e` in the fake's log at or after `from`, or SIZE_MAX. */
size_t tu_first_call(size_t from, vmm_driver_entry e);
/* Asserts that since `from` the first event was recorded on `recorded_on` and that `waiting`
 * then waited for that event (a reuse ordered after a free without a host wait). */
void tu_assert_event_orders(size_t from, CUstream recorded_on, CUstream waiting);
/* Bytes mapped back to back from base on, one handle at a time (an assembled mapping has
 * several), stopping at the first gap or once `most` bytes are reached. */
size_t tu_mapped_from(const void *base, size_t most);
/* A stream value for the fake. */
#define TU_STREAM(n) ((CUstream)(uintptr_t)(0x5000 + (n)))

#endif
