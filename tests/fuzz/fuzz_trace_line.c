/* libFuzzer target. Trace lines: vmm_trace_parse_line, and format/parse round trips (harness_text.c). */
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_trace_line_run(data, size);
  return 0;
}
