/* MemAvailable parsing (the headroom figure on unified-memory GPUs): sample files of
 * tests/data/meminfo and the edge cases of the line format. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meminfo.h"

#ifndef VMMARENA_TEST_DATA
#error "VMMARENA_TEST_DATA must name the tests/data directory"
#endif

#define SAMPLE_KB 119384576ull /* MemAvailable of the sample files that have one */
#define UNTOUCHED ((size_t)0xdeadbeef)

/* vmm_meminfo_read of a sample file; *available starts as UNTOUCHED. */
static int read_sample(const char *name, size_t *available) {
  char path[512];
  snprintf(path, sizeof path, "%s/meminfo/%s", VMMARENA_TEST_DATA, name);
  *available = UNTOUCHED;
  return vmm_meminfo_read(path, available);
}

static int parse_text(const char *text, size_t *available) {
  *available = UNTOUCHED;
  return vmm_meminfo_parse(text, strlen(text), available);
}

static void full_file(void **state) {
  (void)state;
  size_t available;
  assert_int_equal(read_sample("full.txt", &available), 0);
  assert_int_equal(available, SAMPLE_KB * 1024);
}

static void crlf_file(void **state) {
  (void)state;
  size_t available;
  assert_int_equal(read_sample("crlf.txt", &available), 0);
  assert_int_equal(available, SAMPLE_KB * 1024);
}

static void last_line_without_newline(void **state) {
  (void)state;
  size_t available;
  assert_int_equal(read_sample("last-line.txt", &available), 0);
  assert_int_equal(available, SAMPLE_KB * 1024);
}

/* Every bad file is refused and leaves the output untouched. */
static void bad_files(void **state) {
  (void)state;
  static const char *const bad[] = {
      "no-memavailable.txt", /* kernels before 3.14 */
      "malformed-number.txt", "missing-unit.txt",
      "overflow.txt",        /* more kB than 64 bits hold */
      "overflow-bytes.txt",  /* kB fit 64 bits, bytes do not */
      "empty.txt",           "does-not-exist.txt",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t available;
    int rc = read_sample(bad[i], &available);
    if (rc != -1) fprintf(stderr, "%s: accepted (%zu)\n", bad[i], available);
    assert_int_equal(rc, -1);
    assert_int_equal(available, UNTOUCHED);
  }
}

static void line_format(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int rc;
    size_t bytes;
  } cases[] = {
      {"MemAvailable: 0 kB\n", 0, 0},
      {"MemAvailable:\t\t42\tkB\n", 0, 42 * 1024},
      {"MemAvailable:42 kB", 0, 42 * 1024},
      {"MemAvailable: 42 kB \t\r\n", 0, 42 * 1024},
      {"MemTotal: 9 kB\nMemAvailable: 7 kB\nMemAvailable: 8 kB\n", 0, 7 * 1024}, /* the first one counts */
      {"MemAvailable: 18014398509481983 kB\n", 0, (size_t)18014398509481983ull * 1024}, /* largest that fits */
      {"MemAvailable: 18014398509481984 kB\n", -1, 0},
      {"MemAvailable: 18446744073709551615 kB\n", -1, 0},
      {"MemAvailable: 18446744073709551616 kB\n", -1, 0},
      {"MemAvailable: -5 kB\n", -1, 0},
      {"MemAvailable: +5 kB\n", -1, 0},
      {"MemAvailable: kB\n", -1, 0},
      {"MemAvailable:\n", -1, 0},
      {"MemAvailable:", -1, 0},
      {"MemAvailable: 5 KB\n", -1, 0},
      {"MemAvailable: 5 kBytes\n", -1, 0},
      {"MemAvailable: 5 MB\n", -1, 0},
      {"MemAvailable: 5 kB extra\n", -1, 0},
      {"MemAvailable: 5\n kB\n", -1, 0},
      {"MemAvailable: 5.5 kB\n", -1, 0},
      {" MemAvailable: 5 kB\n", -1, 0}, /* keys start a line */
      {"memavailable: 5 kB\n", -1, 0},
      {"MemAvailable 5 kB\n", -1, 0},
      {"XMemAvailable: 5 kB\n", -1, 0},
      {"\n\n\n", -1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t available;
    int rc = parse_text(cases[i].text, &available);
    if (rc != cases[i].rc) fprintf(stderr, "case %zu \"%s\": rc %d, expected %d\n", i, cases[i].text, rc, cases[i].rc);
    assert_int_equal(rc, cases[i].rc);
    assert_int_equal(available, rc == 0 ? cases[i].bytes : UNTOUCHED);
  }
}

/* The parser reads exactly len bytes: a number cut by len is refused, not misread, and
 * bytes past len are never looked at. */
static void length_bounds(void **state) {
  (void)state;
  const char text[] = "MemAvailable: 123456 kB\n";
  size_t available = UNTOUCHED;
  for (size_t len = 0; len < strlen("MemAvailable: 123456 kB"); len++) {
    char *exact = malloc(len ? len : 1); /* no NUL after the text: ASan sees any overread */
    assert_non_null(exact);
    memcpy(exact, text, len);
    assert_int_equal(vmm_meminfo_parse(exact, len, &available), -1);
    free(exact);
  }
  assert_int_equal(available, UNTOUCHED);
  size_t len = strlen("MemAvailable: 123456 kB");
  char *exact = malloc(len);
  assert_non_null(exact);
  memcpy(exact, text, len);
  assert_int_equal(vmm_meminfo_parse(exact, len, &available), 0);
  assert_int_equal(available, 123456 * 1024);
  free(exact);
}

/* vmm_meminfo_read looks at the first 8 KiB only; a MemAvailable line cut by that limit is
 * refused, not read as a smaller number. */
static void read_cut_at_8k(void **state) {
  (void)state;
  char path[] = "/tmp/vmmarena-meminfo-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  const char *line = "MemAvailable:   119384576 kB\n";
  size_t cut = 20; /* bytes of the line inside the first 8 KiB: "MemAvailable:   1193" */
  size_t padding = 8192 - cut;
  for (size_t i = 0; i + 1 < padding; i++) fputc(i % 64 == 63 ? '\n' : 'x', f);
  fputc('\n', f);
  fputs(line, f);
  assert_int_equal(fclose(f), 0);
  size_t available = UNTOUCHED;
  int rc = vmm_meminfo_read(path, &available);
  unlink(path);
  assert_int_equal(rc, -1);
  assert_int_equal(available, UNTOUCHED);
}

/* This machine's own /proc/meminfo parses (the CI runs on Linux). */
static void this_machine(void **state) {
  (void)state;
  size_t available = 0;
  assert_int_equal(vmm_meminfo_read("/proc/meminfo", &available), 0);
  assert_true(available > 0);
  assert_int_equal(available % 1024, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(full_file),    cmocka_unit_test(crlf_file),     cmocka_unit_test(last_line_without_newline),
      cmocka_unit_test(bad_files),    cmocka_unit_test(line_format),   cmocka_unit_test(length_bounds),
      cmocka_unit_test(read_cut_at_8k), cmocka_unit_test(this_machine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
