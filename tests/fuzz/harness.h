/* Fuzz harnesses, shared by the libFuzzer targets (fuzz_*.c) and the regression test that
 * replays the corpora (tests/test_fuzz_regressions.c). A harness takes any bytes; when the
 * library breaks a documented rule it prints the rule and the numbers to stderr and calls
 * abort(), which libFuzzer reports as a crash and saves the input. */
#ifndef VMMARENA_FUZZ_HARNESS_H
#define VMMARENA_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes drive public API calls on one arena over the fake driver (harness_ops.c). */
void fuzz_ops_run(const uint8_t *data, size_t size);
/* Bytes drive whole-process mode's calls on one arena over the fake driver (harness_process.c). */
void fuzz_process_run(const uint8_t *data, size_t size);
/* Bytes split at the first '=' into a setting name and value (harness_text.c). */
void fuzz_config_run(const uint8_t *data, size_t size);
/* Bytes as a trace line, and as the fields of a trace record (harness_text.c). */
void fuzz_trace_line_run(const uint8_t *data, size_t size);

#endif
