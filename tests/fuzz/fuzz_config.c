/* libFuzzer target. Sizes and settings: vmm_parse_size and vmm_config_set on arbitrary text (harness_text.c). */
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_config_run(data, size);
  return 0;
}
