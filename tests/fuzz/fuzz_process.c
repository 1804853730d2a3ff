/* libFuzzer target. Bytes drive whole-process mode's calls on one arena over the fake driver
 * (harness_process.c). */
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_process_run(data, size);
  return 0;
}
