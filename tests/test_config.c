/* Configuration: the size parser, vmm_config_set by environment and short name, and
 * vmm_config_from_env for every VMMARENA_* variable. A bad value is a usage error that
 * names the variable and the value and leaves the configuration unchanged. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define assert_has(text, needle) assert_has_at((text), (needle), __FILE__, __LINE__)
static void assert_has_at(const char *text, const char *needle, const char *file, int line) {
  if (text && strstr(text, needle)) return;
  fail_msg("%s:%d: \"%s\" does not contain \"%s\"", file, line, text ? text : "(null)", needle);
}

/* Every variable the parser reads; all are unset before and after each test. */
static const char *const variables[] = {
    "VMMARENA_REUSE",  "VMMARENA_RESERVE", "VMMARENA_HEADROOM",    "VMMARENA_LIMIT",        "VMMARENA_RETAIN",
    "VMMARENA_LOG",    "VMMARENA_PEER_ACCESS", "VMMARENA_TRACE", "VMMARENA_HANDLE_BOUND", "VMMARENA_PACKAGE_ASSEMBLY",
};
#define VARIABLE_COUNT (sizeof variables / sizeof variables[0])

static int unset_all(void **state) {
  (void)state;
  for (size_t i = 0; i < VARIABLE_COUNT; i++) unsetenv(variables[i]);
  unsetenv("VMMARENA_STITCH"); /* retired: every value is a usage error */
  return 0;
}

/* The short name of a variable: "VMMARENA_PEER_ACCESS" -> "peer_access". */
static const char *short_name(const char *env, char buf[32]) {
  size_t i = 0;
  for (const char *p = env + strlen("VMMARENA_"); *p && i < 31; p++) buf[i++] = (char)tolower((unsigned char)*p);
  buf[i] = '\0';
  return buf;
}

/* ---- Sizes --------------------------------------------------------------------------- */

static void parse_good_sizes(void **state) {
  (void)state;
  static const struct {
    const char *text;
    size_t bytes;
  } cases[] = {
      {"8G", (size_t)8 << 30},
      {"512M", (size_t)512 << 20},
      {"1.5G", (size_t)3 << 29},
      {"4096", 4096},
      {"1T", (size_t)1 << 40},
      {"64K", 64 << 10},
      {"2MiB", (size_t)2 << 20},
      {"0", 0},
      {"8g", (size_t)8 << 30},
      {"8GB", (size_t)8 << 30},
      {"4096B", 4096},
      {"1.25K", 1280},
      {"0.5M", (size_t)1 << 19},
      {"1P", (size_t)1 << 50},
      {"16383P", (size_t)16383 << 50},
      {"18446744073709551615", SIZE_MAX},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t bytes = 12345;
    vmm_status st = vmm_parse_size(cases[i].text, &bytes);
    if (st != VMM_OK) fail_msg("\"%s\": %s", cases[i].text, vmm_config_error());
    if (bytes != cases[i].bytes) fail_msg("\"%s\" = %zu, expected %zu", cases[i].text, bytes, cases[i].bytes);
  }
}

static void parse_bad_sizes(void **state) {
  (void)state;
  static const struct {
    const char *text, *why;
  } cases[] = {
      {"", "a size must not be empty"},
      {"-1", "a size must not be negative"},
      {"1.5", "a fraction of a byte"},
      {"8X", "unexpected characters after the size"},
      {"8G ", "unexpected characters after the size"},
      {" 8G", "a size starts with a digit"},
      {"8Gi", "unexpected characters after the size"},
      {"G", "a size starts with a digit"},
      {".5G", "a size starts with a digit"},
      {"1.", "a decimal point needs digits after it"},
      {"20000000000000000000", "size overflows 64 bits"},
      {"18446744073709551616", "size overflows 64 bits"},
      {"99999P", "size overflows 64 bits"},
      {"16384P", "size overflows 64 bits"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t bytes = 12345;
    vmm_status st = vmm_parse_size(cases[i].text, &bytes);
    if (st != VMM_ERR_INVALID_ARGUMENT) fail_msg("\"%s\" parsed as %zu", cases[i].text, bytes);
    assert_int_equal(bytes, 12345);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", cases[i].text);
    assert_has(vmm_config_error(), quoted);
    assert_has(vmm_config_error(), cases[i].why);
  }
  size_t bytes;
  assert_int_equal(vmm_parse_size(NULL, &bytes), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_parse_size("8G", NULL), VMM_ERR_INVALID_ARGUMENT);
}

/* ---- Defaults and good values -------------------------------------------------------- */

static void defaults(void **state) {
  (void)state;
  vmm_config cfg;
  memset(&cfg, 0xab, sizeof cfg);
  vmm_config_init(&cfg);
  assert_int_equal(cfg.device, 0);
  assert_int_equal(cfg.reuse, VMM_REUSE_EXACT);
  assert_true(cfg.reuse_bound == 1.0);
  assert_int_equal(cfg.handle_bound_bytes, 0); /* the arena chooses */
  assert_int_equal(cfg.package_assembly, 1);
  assert_int_equal(cfg.reserve_bytes, (size_t)256 << 30);
  assert_int_equal(cfg.headroom_bytes, 0);
  assert_int_equal(cfg.limit_bytes, 0);
  assert_int_equal(cfg.retain, VMM_RETAIN_AUTO);
  assert_int_equal(cfg.peer_access_mask, 0);
  assert_null(cfg.trace_path);
  assert_int_equal(cfg.log_level, 1);
  assert_true(cfg.refill_share == 0.0 && cfg.refill_live_share == 0.0); /* assembled before new memory */
  assert_int_equal(cfg.unmap_in_background, 1);
  assert_int_equal(cfg.grow_in_place, 1);
  assert_null(cfg.driver);
  assert_string_equal(vmm_reuse_policy_name(VMM_REUSE_BOUNDED), "bounded");
  assert_string_equal(vmm_reuse_policy_name(VMM_REUSE_BEST_FIT), "best-fit");
}

/* A good value and what it must set. */
typedef struct good_case {
  const char *env, *value;
  void (*check)(const vmm_config *cfg);
} good_case;

static void is_exact(const vmm_config *c) {
  assert_int_equal(c->reuse, VMM_REUSE_EXACT);
  assert_true(c->reuse_bound == 1.0);
}
static void is_bounded_2(const vmm_config *c) {
  assert_int_equal(c->reuse, VMM_REUSE_BOUNDED);
  assert_true(c->reuse_bound == 2.0);
}
static void is_bounded_1_5(const vmm_config *c) {
  assert_int_equal(c->reuse, VMM_REUSE_BOUNDED);
  assert_true(c->reuse_bound == 1.5);
}
static void is_best_fit(const vmm_config *c) { assert_int_equal(c->reuse, VMM_REUSE_BEST_FIT); }
static void is_reuse_none(const vmm_config *c) { assert_int_equal(c->reuse, VMM_REUSE_NONE); }
static void bound_auto(const vmm_config *c) { assert_int_equal(c->handle_bound_bytes, 0); }
static void bound_64m(const vmm_config *c) { assert_int_equal(c->handle_bound_bytes, 64 * MiB); }
static void bound_3m(const vmm_config *c) { assert_int_equal(c->handle_bound_bytes, 3 * MiB); }
static void package_assembly_on(const vmm_config *c) { assert_int_equal(c->package_assembly, 1); }
static void package_assembly_off(const vmm_config *c) { assert_int_equal(c->package_assembly, 0); }
static void reserve_8g(const vmm_config *c) { assert_int_equal(c->reserve_bytes, (size_t)8 << 30); }
static void reserve_64m(const vmm_config *c) { assert_int_equal(c->reserve_bytes, (size_t)64 << 20); }
static void headroom_1_5g(const vmm_config *c) { assert_int_equal(c->headroom_bytes, (size_t)3 << 29); }
static void headroom_0(const vmm_config *c) { assert_int_equal(c->headroom_bytes, 0); }
static void limit_40g(const vmm_config *c) { assert_int_equal(c->limit_bytes, (size_t)40 << 30); }
static void limit_0(const vmm_config *c) { assert_int_equal(c->limit_bytes, 0); }
static void retain_on(const vmm_config *c) { assert_int_equal(c->retain, VMM_RETAIN_ON); }
static void retain_off(const vmm_config *c) { assert_int_equal(c->retain, VMM_RETAIN_OFF); }
static void retain_auto(const vmm_config *c) { assert_int_equal(c->retain, VMM_RETAIN_AUTO); }
static void peers_none(const vmm_config *c) { assert_int_equal(c->peer_access_mask, 0); }
static void peers_all(const vmm_config *c) { assert_true(c->peer_access_mask == ~(uint64_t)0); }
static void peers_1_2(const vmm_config *c) { assert_int_equal(c->peer_access_mask, 0x6); }
static void peers_63(const vmm_config *c) { assert_true(c->peer_access_mask == (uint64_t)1 << 63); }
static void trace_file(const vmm_config *c) { assert_string_equal(c->trace_path, "vmm-ops.trace"); }
static void log_off(const vmm_config *c) { assert_int_equal(c->log_level, 0); }
static void log_error(const vmm_config *c) { assert_int_equal(c->log_level, 1); }
static void log_info(const vmm_config *c) { assert_int_equal(c->log_level, 2); }
static void log_debug(const vmm_config *c) { assert_int_equal(c->log_level, 3); }
static void refill_assemble(const vmm_config *c) { assert_true(c->refill_share == 0.0 && c->refill_live_share == 0.0); }
static void refill_0_9(const vmm_config *c) { assert_true(c->refill_share == 0.9 && c->refill_live_share == 0.0); }
static void refill_0_5(const vmm_config *c) { assert_true(c->refill_share == 0.5); }
static void refill_1(const vmm_config *c) { assert_true(c->refill_share == 1.0); }
static void refill_live_1_05(const vmm_config *c) { assert_true(c->refill_live_share == 1.05 && c->refill_share == 0.0); }
static void refill_live_1_2(const vmm_config *c) { assert_true(c->refill_live_share == 1.2); }
static void refill_live_1(const vmm_config *c) { assert_true(c->refill_live_share == 1.0); }
static void unmap_inline(const vmm_config *c) { assert_int_equal(c->unmap_in_background, 0); }
static void unmap_background(const vmm_config *c) { assert_int_equal(c->unmap_in_background, 1); }
static void grow_on(const vmm_config *c) { assert_int_equal(c->grow_in_place, 1); }
static void grow_off(const vmm_config *c) { assert_int_equal(c->grow_in_place, 0); }

static const good_case good_cases[] = {
    {"VMMARENA_REUSE", "exact", is_exact},
    {"VMMARENA_REUSE", "bounded:2", is_bounded_2},
    {"VMMARENA_REUSE", "bounded:1.5", is_bounded_1_5},
    {"VMMARENA_REUSE", "best-fit", is_best_fit},
    {"VMMARENA_REUSE", "none", is_reuse_none},
    {"VMMARENA_HANDLE_BOUND", "auto", bound_auto},
    {"VMMARENA_HANDLE_BOUND", "AUTO", bound_auto},
    {"VMMARENA_HANDLE_BOUND", "64M", bound_64m},
    {"VMMARENA_HANDLE_BOUND", "3MiB", bound_3m}, /* the arena rounds it up to its granularity */
    {"VMMARENA_PACKAGE_ASSEMBLY", "on", package_assembly_on},
    {"VMMARENA_PACKAGE_ASSEMBLY", "1", package_assembly_on},
    {"VMMARENA_PACKAGE_ASSEMBLY", "TRUE", package_assembly_on},
    {"VMMARENA_PACKAGE_ASSEMBLY", "off", package_assembly_off},
    {"VMMARENA_PACKAGE_ASSEMBLY", "0", package_assembly_off},
    {"VMMARENA_PACKAGE_ASSEMBLY", "false", package_assembly_off},
    {"VMMARENA_RESERVE", "8G", reserve_8g},
    {"VMMARENA_RESERVE", "64MiB", reserve_64m},
    {"VMMARENA_HEADROOM", "1.5G", headroom_1_5g},
    {"VMMARENA_HEADROOM", "0", headroom_0},
    {"VMMARENA_LIMIT", "40G", limit_40g},
    {"VMMARENA_LIMIT", "0", limit_0},
    {"VMMARENA_RETAIN", "on", retain_on},
    {"VMMARENA_RETAIN", "OFF", retain_off},
    {"VMMARENA_RETAIN", "auto", retain_auto},
    {"VMMARENA_PEER_ACCESS", "none", peers_none},
    {"VMMARENA_PEER_ACCESS", "all", peers_all},
    {"VMMARENA_PEER_ACCESS", "1,2", peers_1_2},
    {"VMMARENA_PEER_ACCESS", "63", peers_63},
    {"VMMARENA_TRACE", "vmm-ops.trace", trace_file},
    {"VMMARENA_LOG", "off", log_off},
    {"VMMARENA_LOG", "error", log_error},
    {"VMMARENA_LOG", "info", log_info},
    {"VMMARENA_LOG", "debug", log_debug},
    {"VMMARENA_LOG", "3", log_debug},
    {"VMMARENA_LOG", "0", log_off},
    {"VMMARENA_REFILL", "assemble", refill_assemble},
    {"VMMARENA_REFILL", "below-peak", refill_0_9},
    {"VMMARENA_REFILL", "Below-Peak:0.5", refill_0_5},
    {"VMMARENA_REFILL", "below-peak:1", refill_1},
    {"VMMARENA_REFILL", "within-live", refill_live_1_05},
    {"VMMARENA_REFILL", "Within-Live:1.2", refill_live_1_2},
    {"VMMARENA_REFILL", "within-live:1", refill_live_1},
    {"VMMARENA_UNMAP", "Inline", unmap_inline},
    {"VMMARENA_UNMAP", "background", unmap_background},
    {"VMMARENA_GROW", "off", grow_off},
    {"VMMARENA_GROW", "On", grow_on},
};

/* A bad value and the reason the message must give. */
typedef struct bad_case {
  const char *env, *value, *why;
} bad_case;

static const bad_case bad_cases[] = {
    {"VMMARENA_REFILL", "below-peak:0", "0 < F <= 1"},
    {"VMMARENA_REFILL", "below-peak:1.5", "0 < F <= 1"},
    {"VMMARENA_REFILL", "below-peak:", "0 < F <= 1"},
    {"VMMARENA_REFILL", "below-peak:-0.5", "0 < F <= 1"},
    {"VMMARENA_REFILL", "below-peak:nan", "0 < F <= 1"},
    {"VMMARENA_REFILL", "within-live:0.5", "F >= 1 (e.g. within-live:1.05)"},
    {"VMMARENA_REFILL", "within-live:", "F >= 1"},
    {"VMMARENA_REFILL", "within-live:inf", "F >= 1"},
    {"VMMARENA_REFILL", "within-live:1.05x", "F >= 1"},
    {"VMMARENA_REFILL", "sometimes", "expected assemble, below-peak[:F] (0 < F <= 1) or within-live[:F] (F >= 1)"},
    {"VMMARENA_UNMAP", "off", "expected background or inline"},
    {"VMMARENA_UNMAP", "", "expected background or inline"},
    {"VMMARENA_GROW", "sideways", "expected on or off"},
    {"VMMARENA_GROW", "", "expected on or off"},
    {"VMMARENA_REUSE", "bounded:0.5", "F >= 1"},
    {"VMMARENA_REUSE", "bounded:", "F >= 1"},
    {"VMMARENA_REUSE", "bounded:2x", "F >= 1"},
    {"VMMARENA_REUSE", "bounded:nan", "F >= 1"},
    {"VMMARENA_REUSE", "fast", "expected exact, bounded:F (F >= 1), best-fit or none"},
    {"VMMARENA_REUSE", "", "expected exact"},
    {"VMMARENA_HANDLE_BOUND", "0", "must be greater than zero"},
    {"VMMARENA_HANDLE_BOUND", "big", "a size starts with a digit"},
    {"VMMARENA_HANDLE_BOUND", "-2M", "a size must not be negative"},
    {"VMMARENA_PACKAGE_ASSEMBLY", "maybe", "expected on or off"},
    {"VMMARENA_PACKAGE_ASSEMBLY", "", "expected on or off"},
    {"VMMARENA_RESERVE", "0", "must be greater than zero"},
    {"VMMARENA_RESERVE", "-1", "a size must not be negative"},
    {"VMMARENA_RESERVE", "8X", "unexpected characters"},
    {"VMMARENA_HEADROOM", "-5G", "a size must not be negative"},
    {"VMMARENA_HEADROOM", "", "a size must not be empty"},
    {"VMMARENA_LIMIT", "abc", "a size starts with a digit"},
    {"VMMARENA_LIMIT", "99999P", "size overflows 64 bits"},
    {"VMMARENA_RETAIN", "maybe", "expected on, off or auto"},
    {"VMMARENA_PEER_ACCESS", "1,", "trailing comma"},
    {"VMMARENA_PEER_ACCESS", "x", "expected none, all or device ordinals"},
    {"VMMARENA_PEER_ACCESS", "1;2", "expected none, all or device ordinals"},
    {"VMMARENA_PEER_ACCESS", "64", "device ordinal out of range (0..63)"},
    {"VMMARENA_PEER_ACCESS", "", "empty"},
    {"VMMARENA_TRACE", "", "empty path"},
    {"VMMARENA_LOG", "verbose", "expected off, error, info or debug"},
    {"VMMARENA_LOG", "4", "expected off, error, info or debug"},
};

/* The configuration every case starts from: not the defaults, so a setter that resets
 * unrelated fields shows. */
static vmm_config start_config(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.device = 3;
  cfg.reuse = VMM_REUSE_BEST_FIT;
  cfg.handle_bound_bytes = 5 * MiB;
  cfg.package_assembly = 0;
  cfg.reserve_bytes = 123 * MiB;
  cfg.headroom_bytes = 7 * MiB;
  cfg.limit_bytes = 9 * MiB;
  cfg.retain = VMM_RETAIN_ON;
  cfg.peer_access_mask = 0x10;
  cfg.log_level = 2;
  cfg.refill_share = 0.25; /* both refill fields set: each VMMARENA_REFILL value must set one and clear the other */
  cfg.refill_live_share = 2.0;
  return cfg;
}

static void expect_unchanged_with_error(const vmm_config *before, const vmm_config *after, const bad_case *c) {
  assert_memory_equal(before, after, sizeof *before);
  char named[96];
  snprintf(named, sizeof named, "%s=\"%s\"", c->env, c->value);
  assert_has(vmm_config_error(), named);
  assert_has(vmm_config_error(), c->why);
}

static void set_good_values(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++) {
    const good_case *c = &good_cases[i];
    char buf[32];
    const char *names[] = {c->env, short_name(c->env, buf)};
    for (int n = 0; n < 2; n++) {
      vmm_config cfg = start_config();
      vmm_status st = vmm_config_set(&cfg, names[n], c->value);
      if (st != VMM_OK) fail_msg("%s=%s: %s", names[n], c->value, vmm_config_error());
      c->check(&cfg);
      assert_int_equal(cfg.device, 3); /* no setting touches the device */
    }
  }
}

static void set_bad_values(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_case *c = &bad_cases[i];
    char buf[32];
    const char *names[] = {c->env, short_name(c->env, buf)};
    for (int n = 0; n < 2; n++) {
      vmm_config cfg = start_config(), before;
      memcpy(&before, &cfg, sizeof cfg);
      vmm_status st = vmm_config_set(&cfg, names[n], c->value);
      if (st != VMM_ERR_INVALID_ARGUMENT) fail_msg("%s=\"%s\" was accepted", names[n], c->value);
      expect_unchanged_with_error(&before, &cfg, c); /* the message names the variable either way */
    }
  }
  vmm_config cfg = start_config(), before;
  memcpy(&before, &cfg, sizeof cfg);
  assert_int_equal(vmm_config_set(&cfg, "VMMARENA_COLOUR", "blue"), VMM_ERR_INVALID_ARGUMENT);
  assert_has(vmm_config_error(), "VMMARENA_COLOUR=\"blue\": unknown setting");
  assert_int_equal(vmm_config_set(&cfg, "reuse", NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_has(vmm_config_error(), "VMMARENA_REUSE=\"(null)\": no value");
  assert_int_equal(vmm_config_set(NULL, "reuse", "exact"), VMM_ERR_INVALID_ARGUMENT);
  assert_memory_equal(&before, &cfg, sizeof cfg);
}

/* Every variable has good and bad cases above. */
static void every_variable_is_covered(void **state) {
  (void)state;
  for (size_t v = 0; v < VARIABLE_COUNT; v++) {
    size_t good = 0, bad = 0;
    for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++)
      good += !strcmp(good_cases[i].env, variables[v]);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
      bad += !strcmp(bad_cases[i].env, variables[v]);
    if (!good || !bad) fail_msg("%s: %zu good and %zu bad cases", variables[v], good, bad);
  }
}

/* ---- The environment ----------------------------------------------------------------- */

static void env_good_values(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++) {
    const good_case *c = &good_cases[i];
    assert_int_equal(setenv(c->env, c->value, 1), 0);
    vmm_config cfg = start_config();
    vmm_status st = vmm_config_from_env(&cfg);
    if (st != VMM_OK) fail_msg("%s=%s: %s", c->env, c->value, vmm_config_error());
    c->check(&cfg);
    assert_string_equal(vmm_config_error(), "");
    unsetenv(c->env);
  }
}

static void env_bad_values(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const bad_case *c = &bad_cases[i];
    assert_int_equal(setenv(c->env, c->value, 1), 0);
    vmm_config cfg = start_config(), before;
    memcpy(&before, &cfg, sizeof cfg);
    vmm_status st = vmm_config_from_env(&cfg);
    if (st != VMM_ERR_INVALID_ARGUMENT) fail_msg("%s=\"%s\" was accepted", c->env, c->value);
    expect_unchanged_with_error(&before, &cfg, c);
    unsetenv(c->env);
  }
}

/* Several variables at once: all land, or (one bad) none does. */
static void env_all_or_nothing(void **state) {
  (void)state;
  vmm_config cfg = start_config(), before;
  memcpy(&before, &cfg, sizeof cfg);
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK); /* nothing set: nothing changes */
  assert_memory_equal(&before, &cfg, sizeof cfg);

  setenv("VMMARENA_REUSE", "bounded:2", 1);
  setenv("VMMARENA_HANDLE_BOUND", "64M", 1);
  setenv("VMMARENA_PACKAGE_ASSEMBLY", "on", 1);
  setenv("VMMARENA_RESERVE", "8G", 1);
  setenv("VMMARENA_HEADROOM", "1.5G", 1);
  setenv("VMMARENA_LIMIT", "40G", 1);
  setenv("VMMARENA_RETAIN", "off", 1);
  setenv("VMMARENA_PEER_ACCESS", "1,2", 1);
  setenv("VMMARENA_TRACE", "vmm-ops.trace", 1);
  setenv("VMMARENA_LOG", "debug", 1);
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  is_bounded_2(&cfg);
  bound_64m(&cfg);
  package_assembly_on(&cfg);
  reserve_8g(&cfg);
  headroom_1_5g(&cfg);
  limit_40g(&cfg);
  retain_off(&cfg);
  peers_1_2(&cfg);
  trace_file(&cfg);
  log_debug(&cfg);

  cfg = start_config();
  memcpy(&before, &cfg, sizeof cfg);
  setenv("VMMARENA_LIMIT", "40Q", 1);
  assert_int_equal(vmm_config_from_env(&cfg), VMM_ERR_INVALID_ARGUMENT);
  assert_memory_equal(&before, &cfg, sizeof cfg); /* the good variables did not land either */
  assert_has(vmm_config_error(), "VMMARENA_LIMIT=\"40Q\"");
  assert_int_equal(vmm_config_from_env(NULL), VMM_ERR_INVALID_ARGUMENT);
}

/* Every size error is the whole sentence a user needs: the variable, the value as given, the
 * rule the value broke and how a size is written. */
static void size_errors_say_the_rule(void **state) {
  (void)state;
  static const struct {
    const char *env, *value, *message;
  } cases[] = {
      {"VMMARENA_HEADROOM", "-5",
       "VMMARENA_HEADROOM=\"-5\": a size must not be negative; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_LIMIT", "",
       "VMMARENA_LIMIT=\"\": a size must not be empty; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_LIMIT", "lots",
       "VMMARENA_LIMIT=\"lots\": a size starts with a digit; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_RESERVE", "8X",
       "VMMARENA_RESERVE=\"8X\": unexpected characters after the size; a size is a number, then K, M, G, T or P "
       "(or KiB, KB, ...), such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_RESERVE", "1.5",
       "VMMARENA_RESERVE=\"1.5\": a fraction of a byte: a size without a unit is whole bytes; use a size such as 8G, "
       "512M, 1.5G or 4096"},
      {"VMMARENA_HEADROOM", "1.G",
       "VMMARENA_HEADROOM=\"1.G\": a decimal point needs digits after it; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_LIMIT", "16384P",
       "VMMARENA_LIMIT=\"16384P\": size overflows 64 bits; the largest is 18446744073709551615 (just under 16384P)"},
      {"VMMARENA_RESERVE", "0",
       "VMMARENA_RESERVE=\"0\": must be greater than zero; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_HANDLE_BOUND", "0",
       "VMMARENA_HANDLE_BOUND=\"0\": must be greater than zero; use a size such as 8G, 512M, 1.5G or 4096"},
      {"VMMARENA_PAUSE_STAGING", "-64M",
       "VMMARENA_PAUSE_STAGING=\"-64M\": a size must not be negative; use a size such as 8G, 512M, 1.5G or 4096"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vmm_config cfg = start_config();
    assert_int_equal(vmm_config_set(&cfg, cases[i].env, cases[i].value), VMM_ERR_INVALID_ARGUMENT);
    assert_string_equal(vmm_config_error(), cases[i].message);
    assert_int_equal(setenv(cases[i].env, cases[i].value, 1), 0); /* the same from the environment */
    cfg = start_config();
    assert_int_equal(vmm_config_from_env(&cfg), VMM_ERR_INVALID_ARGUMENT);
    assert_string_equal(vmm_config_error(), cases[i].message);
    unsetenv(cases[i].env);
  }
  size_t bytes;
  assert_int_equal(vmm_parse_size("-5", &bytes), VMM_ERR_INVALID_ARGUMENT); /* the C API names no variable */
  assert_string_equal(vmm_config_error(),
                      "size=\"-5\": a size must not be negative; use a size such as 8G, 512M, 1.5G or 4096");
}

/* VMMARENA_STITCH was retired with stitching: every value, by either name or from the
 * environment, is a usage error that says so, and nothing changes. */
static void stitch_is_retired(void **state) {
  (void)state;
  static const char *const values[] = {"on", "off", "eager", "1", ""};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    const bad_case c = {"VMMARENA_STITCH", values[i], "retired"};
    const char *names[] = {"VMMARENA_STITCH", "stitch"};
    for (int n = 0; n < 2; n++) {
      vmm_config cfg = start_config(), before;
      memcpy(&before, &cfg, sizeof cfg);
      assert_int_equal(vmm_config_set(&cfg, names[n], values[i]), VMM_ERR_INVALID_ARGUMENT);
      expect_unchanged_with_error(&before, &cfg, &c);
      assert_has(vmm_config_error(), "unset it");
    }
    assert_int_equal(setenv("VMMARENA_STITCH", values[i], 1), 0);
    vmm_config cfg = start_config(), before;
    memcpy(&before, &cfg, sizeof cfg);
    assert_int_equal(vmm_config_from_env(&cfg), VMM_ERR_INVALID_ARGUMENT);
    expect_unchanged_with_error(&before, &cfg, &c);
    unsetenv("VMMARENA_STITCH");
  }
}

/* Values from the environment take effect in an arena: reservation size and limit. */
static void env_config_drives_an_arena(void **state) {
  (void)state;
  setenv("VMMARENA_RESERVE", "8M", 1);
  setenv("VMMARENA_LIMIT", "4M", 1);
  setenv("VMMARENA_LOG", "off", 1);
  setenv("VMMARENA_HANDLE_BOUND", "3M", 1);
  vmm_config cfg = tu_config();
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  vmm_arena *a = tu_arena(NULL, &cfg);
  void *p = tu_alloc(a, 3 * MiB, VMM_KIND_PACKAGE, TU_STREAM(1));
  void *q = (void *)0x1;
  assert_int_equal(vmm_arena_alloc(a, 1, VMM_KIND_PACKAGE, TU_STREAM(1), &q), VMM_ERR_OUT_OF_MEMORY);
  assert_null(q);
  assert_has(vmm_arena_last_error(a), "limit 4.0 MiB < 4.0 MiB held + 2.0 MiB requested");
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  assert_int_equal(s.limit_bytes, 4 * MiB);
  assert_int_equal(s.limit_refusals, 1);
  assert_int_equal(s.reserved_va_bytes, 8 * MiB);
  assert_int_equal(s.handle_bound_bytes, 4 * MiB); /* 3 MiB rounded up to the 2 MiB granularity */
  assert_int_equal(vmm_arena_free(a, p, TU_STREAM(1)), VMM_OK);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(parse_good_sizes),
      cmocka_unit_test(parse_bad_sizes),
      cmocka_unit_test(defaults),
      cmocka_unit_test(set_good_values),
      cmocka_unit_test(set_bad_values),
      cmocka_unit_test(every_variable_is_covered),
      cmocka_unit_test_setup_teardown(env_good_values, unset_all, unset_all),
      cmocka_unit_test_setup_teardown(env_bad_values, unset_all, unset_all),
      cmocka_unit_test_setup_teardown(env_all_or_nothing, unset_all, unset_all),
      cmocka_unit_test_setup_teardown(env_config_drives_an_arena, unset_all, unset_all),
      cmocka_unit_test_setup_teardown(stitch_is_retired, unset_all, unset_all),
      cmocka_unit_test_setup_teardown(size_errors_say_the_rule, unset_all, unset_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
