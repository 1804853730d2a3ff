/* A program outside the tree, built against an installed vmmarena: the commands of README.md,
 * "Using it from C", build it once with find_package(vmmarena) (tests/install/cmake) and once
 * with pkg-config, against the shared library; tests/readme-check runs them. It calls
 * functions of each installed header and prints what it found:
 *   vmmarena.h        vmm_status_name, vmm_parse_size, vmm_config_init
 *   vmmarena/driver.h vmm_driver_cuda, vmm_driver_entry_name
 *   vmmarena/trace.h  vmm_trace_format, vmm_trace_parse_line (a round trip)
 * Exit status 0 when every check held. */
#include <stdio.h>
#include <string.h>

#include <vmmarena.h>
#include <vmmarena/trace.h>

static int failures;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "consumer: check failed: %s (line %d)\n", #cond, __LINE__); \
      failures++;                                                     \
    }                                                                 \
  } while (0)

int main(void) {
  size_t bytes = 0;
  CHECK(vmm_parse_size("1.5G", &bytes) == VMM_OK && bytes == 1610612736u);
  CHECK(!strcmp(vmm_status_name(VMM_ERR_NO_DRIVER), "VMM_ERR_NO_DRIVER"));
  vmm_config cfg;
  vmm_config_init(&cfg);
  CHECK(cfg.device == 0);

  /* Without an NVIDIA driver the table is NULL and `why` says what is missing. */
  const char *why = NULL;
  const struct vmm_driver *drv = vmm_driver_cuda(&why);
  if (drv) {
    printf("driver: loaded (version field %u)\n", (unsigned)drv->version);
  } else {
    CHECK(why && why[0]);
    printf("driver: none: %s\n", why ? why : "(no reason)");
  }
  printf("entry 0: %s\n", vmm_driver_entry_name((vmm_driver_entry)0));

  vmm_trace_record rec = {0}, back = {0};
  rec.t_ns = 123456;
  rec.op = VMM_TRACE_ALLOC;
  rec.kind = VMM_KIND_TRANSIENT;
  rec.requested = 3145733;
  rec.rounded = 4194304;
  rec.ptr = 0x7f0fff400000ull;
  rec.stream = 0x5001;
  strcpy(rec.tag, "prefill 100%");
  rec.result = VMM_OK;
  char line[512];
  size_t len = vmm_trace_format(&rec, line, sizeof line);
  CHECK(len > 0 && len < sizeof line);
  const char *bad = NULL;
  CHECK(vmm_trace_parse_line(line, len, &back, &bad) == 1);
  CHECK(back.t_ns == rec.t_ns && back.op == rec.op && back.kind == rec.kind && back.requested == rec.requested &&
        back.rounded == rec.rounded && back.ptr == rec.ptr && back.stream == rec.stream &&
        !strcmp(back.tag, rec.tag) && back.result == rec.result);
  printf("trace line: %s", line);
  CHECK(vmm_trace_parse_line("1 alloc nope", 12, &back, &bad) == -1 && bad && bad[0]);

  printf("consumer: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
