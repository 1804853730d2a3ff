/* Replays the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>) and the inputs that once
 * broke a rule (tests/fuzz/regressions/<fuzzer>) through the same harness code the libFuzzer
 * targets run, built here without libFuzzer. A harness that meets a broken rule prints it and
 * aborts; the file being replayed is printed first. VMMARENA_FUZZ_DIR overrides where the
 * corpora are (default: tests/fuzz beside this file). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_util.h"

static const char *fuzz_dir(void) {
  static char dir[4096];
  const char *env = getenv("VMMARENA_FUZZ_DIR");
  if (env) return env;
  snprintf(dir, sizeof dir, "%s", __FILE__);
  char *slash = strrchr(dir, '/');
  snprintf(slash ? slash + 1 : dir, sizeof dir - (size_t)(slash ? slash + 1 - dir : 0), "fuzz");
  return dir;
}

static uint8_t *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  uint8_t *data = NULL;
  size_t cap = 0, n = 0, got;
  do {
    if (n == cap) {
      cap = cap ? 2 * cap : 4096;
      data = realloc(data, cap);
      assert_non_null(data);
    }
    got = fread(data + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  fclose(f);
  *size = n;
  return data;
}

/* Replays every regular file of <fuzz dir>/<sub>/<fuzzer>; returns how many. */
static size_t replay(const char *sub, const char *fuzzer, void (*run)(const uint8_t *, size_t)) {
  char path[4096];
  int n = snprintf(path, sizeof path, "%s/%s/%s", fuzz_dir(), sub, fuzzer);
  assert_true(n > 0 && (size_t)n < sizeof path); /* a longer path would be cut */
  DIR *d = opendir(path);
  if (!d) return 0;
  size_t count = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char file[8192];
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    size_t size = 0;
    uint8_t *data = read_file(file, &size);
    fprintf(stderr, "replaying %s/%s/%s (%zu bytes)\n", sub, fuzzer, e->d_name, size);
    run(data, size);
    free(data);
    count++;
  }
  closedir(d);
  return count;
}

static void replay_all(const char *fuzzer, void (*run)(const uint8_t *, size_t)) {
  size_t seeds = replay("corpus", fuzzer, run);
  size_t regressions = replay("regressions", fuzzer, run);
  printf("%s: %zu seed inputs, %zu regression inputs replayed\n", fuzzer, seeds, regressions);
  assert_true(seeds > 0); /* the seed corpus is part of the tree */
}

static void fuzz_ops_inputs(void **state) {
  (void)state;
  replay_all("fuzz_ops", fuzz_ops_run);
}

static void fuzz_process_inputs(void **state) {
  (void)state;
  replay_all("fuzz_process", fuzz_process_run);
}

static void fuzz_config_inputs(void **state) {
  (void)state;
  replay_all("fuzz_config", fuzz_config_run);
}

static void fuzz_trace_line_inputs(void **state) {
  (void)state;
  replay_all("fuzz_trace_line", fuzz_trace_line_run);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fuzz_ops_inputs),
      cmocka_unit_test(fuzz_process_inputs),
      cmocka_unit_test(fuzz_config_inputs),
      cmocka_unit_test(fuzz_trace_line_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
