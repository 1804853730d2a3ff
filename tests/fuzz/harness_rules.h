/* What every API harness checks (harness_rules.c), shared by fuzz_ops (harness_ops.c) and
 * fuzz_process (harness_process.c): the input reader, the documented statuses, the fatal-error
 * rule, injected faults, the JSON snapshot and the ledger after destroy. */
#ifndef VMMARENA_FUZZ_HARNESS_RULES_H
#define VMMARENA_FUZZ_HARNESS_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "vmmarena.h"

/* The input, read a byte at a time; bytes past the end read as 0. */
typedef struct fuzz_reader {
  const uint8_t *p;
  size_t n;
} fuzz_reader;

uint8_t fuzz_byte(fuzz_reader *r);

/* One run's arena and what the rules remember of it. */
typedef struct fuzz_rules {
  const char *harness;       /* "fuzz_ops", ...: the first word of a violation */
  vmm_arena *a;
  size_t op_index;           /* the call being made, from 1 */
  int oom_armed, hard_armed; /* fault codes armed at some point */
  vmm_status fatal;          /* the first fatal error, once seen */
  char fatal_msg[768];
} fuzz_rules;

/* The configuration both API harnesses start from: the defaults on the fake driver, no log. */
vmm_config fuzz_config(void);
/* The handle bound an input's 3 bits choose: the arena's choice, or granules: one, two, a bound
 * that rounds up to three, 4, 8, 16 or 64. */
size_t fuzz_handle_bound(unsigned choice, size_t granularity);
/* Creates r->a from cfg (a refusal is a violation), tracing to /dev/null when `trace`. */
void fuzz_create(fuzz_rules *r, const vmm_config *cfg, int trace);
/* Prints the broken rule with the arena's last error and aborts (libFuzzer saves the input). */
void fuzz_violation(const fuzz_rules *r, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* A call that touches the driver returned OK, or what a fault that fired can explain;
 * allocations may always meet out of memory. */
void fuzz_expect_action(fuzz_rules *r, vmm_status st, int is_alloc, const char *what);
/* The call returned exactly `want`, and a failure left a message. */
void fuzz_expect_status(fuzz_rules *r, vmm_status st, vmm_status want, const char *what);
/* After every call: the invariant checker passes, and a fatal error appears only after a hard
 * fault was armed, carries a message, and never changes. */
void fuzz_after_call(fuzz_rules *r);
/* Arms a fault from two input bytes: the Nth driver call from now fails (once or from then
 * on) with out of memory or a hard error; 0xff clears every fault. */
void fuzz_arm_fault(fuzz_rules *r, uint8_t n, uint8_t c);
/* A snapshot into a buffer of the size the byte picks (0xff: the size announced); when it
 * fits, valid JSON of the announced length; when not, refused with a NUL at the end. */
void fuzz_snapshot_json(fuzz_rules *r, uint8_t c);
/* Destroys the arena; the fake's ledger must then be clean (but for the contexts that failed
 * pops left pushed, as the driver would). */
void fuzz_destroy_and_check_ledger(fuzz_rules *r);

#endif
