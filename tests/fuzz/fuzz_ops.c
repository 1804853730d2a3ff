/* libFuzzer target. Bytes drive public API calls on one arena over the fake driver (harness_ops.c). */
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_ops_run(data, size);
  return 0;
}
