/* Harnesses of fuzz_config and fuzz_trace_line: the text parsers against independent checks.
 *
 * fuzz_config: the input is split at its first '=' into a name and a value (without '=',
 * the whole input is the value). The value goes through vmm_parse_size, checked against a
 * reference reading of the size grammar, and through vmm_config_set under the given name and
 * under every setting's name: a refusal leaves the configuration unchanged and names the
 * setting; an acceptance stores what the parser read, and the configuration creates an
 * arena on the fake driver or is refused as a usage error.
 *
 * fuzz_trace_line: the input is parsed as a trace line; a record that parses is formatted
 * and parsed again and must come back equal, byte for byte once formatted. The input's
 * bytes also build a record (fields and tag), which must survive format-then-parse. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "harness.h"
#include "vmmarena.h"
#include "vmmarena/trace.h"

static void broken(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void broken(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("fuzz: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

/* ---- Sizes and settings -------------------------------------------------------------- */

/* The size grammar read independently: digits, an optional '.' and digits, an optional unit
 * (K M G T P, either case, then optionally "iB"; or a lone B). */
typedef struct ref_size {
  int matches;
  int whole_overflows;    /* the integer part exceeds 64 bits */
  unsigned long long whole;
  int fraction_nonzero;   /* some digit after '.' is not 0 */
  unsigned shift;         /* 10 per unit step */
} ref_size;

static ref_size ref_read(const char *s) {
  ref_size r = {0};
  const char *p = s;
  if (*p < '0' || *p > '9') return r;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (r.whole > (~0ull - d) / 10) r.whole_overflows = 1;
    else r.whole = r.whole * 10 + d;
  }
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9') return r;
    for (; *p >= '0' && *p <= '9'; p++) r.fraction_nonzero |= *p != '0';
  }
  const char *units = "KMGTP", *u = *p ? strchr(units, *p & ~0x20) : NULL;
  if (u && *u) {
    r.shift = 10u * (unsigned)(u - units + 1);
    p++;
    if ((p[0] == 'i' || p[0] == 'I') && (p[1] == 'B' || p[1] == 'b')) p += 2;
    else if (*p == 'B' || *p == 'b') p++;
  } else if (*p == 'B' || *p == 'b') {
    p++;
  }
  r.matches = *p == '\0';
  return r;
}

static void check_parse_size(const char *value) {
  size_t bytes = 12345;
  vmm_status st = vmm_parse_size(value, &bytes);
  ref_size r = ref_read(value);
  int must_fail = !r.matches || r.whole_overflows || (r.shift == 0 && r.fraction_nonzero) ||
                  (r.shift && r.whole > (~0ull >> r.shift));
  if (must_fail) {
    if (st == VMM_OK) broken("vmm_parse_size(\"%s\") accepted a malformed or overflowing size: %zu", value, bytes);
    if (bytes != 12345) broken("vmm_parse_size(\"%s\") failed but wrote the result", value);
    if (!strstr(vmm_config_error(), "size=\"")) broken("vmm_parse_size(\"%s\"): message \"%s\"", value, vmm_config_error());
    return;
  }
  unsigned long long lo = r.whole << r.shift;
  int upper_fits = r.shift == 0 || r.whole + 1 <= (~0ull >> r.shift);
  if (!r.fraction_nonzero || upper_fits) {
    if (st != VMM_OK) broken("vmm_parse_size(\"%s\") refused a valid size: %s", value, vmm_config_error());
  }
  if (st != VMM_OK) return; /* an upper fraction of 2^64 may overflow */
  if (!r.fraction_nonzero && bytes != lo) broken("vmm_parse_size(\"%s\") = %zu, expected %llu", value, bytes, lo);
  if (r.fraction_nonzero && (bytes < lo || (upper_fits && bytes >= (r.whole + 1) << r.shift)))
    broken("vmm_parse_size(\"%s\") = %zu, outside [%llu, %llu)", value, bytes, lo, (r.whole + 1) << r.shift);
}

static const char *const setting_names[] = {
    "VMMARENA_REUSE",  "VMMARENA_STITCH",      "VMMARENA_RESERVE", "VMMARENA_HEADROOM",     "VMMARENA_LIMIT",
    "VMMARENA_RETAIN", "VMMARENA_PEER_ACCESS", "VMMARENA_TRACE",   "VMMARENA_LOG",          "VMMARENA_HANDLE_BOUND",
    "VMMARENA_PACKAGE_ASSEMBLY", "VMMARENA_PAUSE_STAGING", "VMMARENA_CACHE", "VMMARENA_REFILL",
}; /* VMMARENA_STITCH is retired: every value must be refused as a usage error */
#define SETTINGS (sizeof setting_names / sizeof setting_names[0])

static const char *env_name_of(const char *name) {
  static const char *const short_names[SETTINGS] = {"reuse",  "stitch",      "reserve", "headroom", "limit",
                                                    "retain", "peer_access", "trace",   "log",      "handle_bound",
                                                    "package_assembly", "pause_staging", "cache", "refill"};
  for (size_t i = 0; i < SETTINGS; i++)
    if (!strcmp(name, setting_names[i]) || !strcmp(name, short_names[i])) return setting_names[i];
  return NULL;
}

/* The configuration creates an arena on the fake (or is refused as a usage error), and the
 * arena leaves nothing behind. The trace path is cleared: a fuzzer must not create files. */
static void check_creates(vmm_config cfg) {
  cfg.trace_path = NULL;
  cfg.log_level = 0;
  fake_options o = {.device_count = 2};
  cfg.driver = fake_driver_reset(&o);
  vmm_arena *a = NULL;
  vmm_status st = vmm_arena_create(&cfg, &a);
  if (st == VMM_OK) {
    vmm_arena_destroy(a);
  } else if (st != VMM_ERR_INVALID_ARGUMENT || a || !vmm_create_error()[0]) {
    broken("create after an accepted setting returned %s: %s", vmm_status_name(st), vmm_create_error());
  }
  if (!fake_ledger_clean()) broken("create/destroy left the fake driver's ledger unclean");
}

static void check_set(const char *name, const char *value) {
  vmm_config cfg, before;
  vmm_config_init(&cfg);
  before = cfg;
  vmm_status st = vmm_config_set(&cfg, name, value);
  const char *env = env_name_of(name);
  if (st != VMM_OK) {
    if (st != VMM_ERR_INVALID_ARGUMENT) broken("vmm_config_set(\"%s\") returned %s", name, vmm_status_name(st));
    if (memcmp(&cfg, &before, sizeof cfg)) broken("vmm_config_set(\"%s\", \"%s\") failed but changed the config", name, value);
    const char *err = vmm_config_error(), *expected = env ? env : name;
    size_t n = strlen(expected) < 400 ? strlen(expected) : 400;
    if (strncmp(err, expected, n)) broken("vmm_config_set(\"%s\") failed with \"%s\", not naming the setting", name, err);
    return;
  }
  if (!env) broken("vmm_config_set accepted the unknown setting \"%s\"", name);
  if (!strcmp(env, "VMMARENA_STITCH")) broken("the retired VMMARENA_STITCH accepted \"%s\"", value);
  size_t size = 0, *field = NULL;
  if (!strcmp(env, "VMMARENA_RESERVE")) field = &cfg.reserve_bytes;
  if (!strcmp(env, "VMMARENA_HEADROOM")) field = &cfg.headroom_bytes;
  if (!strcmp(env, "VMMARENA_LIMIT")) field = &cfg.limit_bytes;
  if (field && (vmm_parse_size(value, &size) != VMM_OK || *field != size))
    broken("%s=\"%s\" stored %zu, vmm_parse_size reads %zu", env, value, *field, size);
  if (field == &cfg.reserve_bytes && size == 0) broken("VMMARENA_RESERVE accepted 0");
  if (cfg.reuse == VMM_REUSE_BOUNDED && !(cfg.reuse_bound >= 1.0)) broken("bounded:%g accepted", cfg.reuse_bound);
  if (!(cfg.refill_share >= 0.0 && cfg.refill_share <= 1.0)) broken("refill share %g accepted", cfg.refill_share);
  check_creates(cfg);
}

/* The environment path: the same value read by vmm_config_from_env. */
static void check_env(const char *name, const char *value) {
  const char *env = env_name_of(name);
  if (!env || getenv(env)) return;
  vmm_config direct, from_env;
  vmm_config_init(&direct);
  vmm_config_init(&from_env);
  vmm_status want = vmm_config_set(&direct, env, value);
  setenv(env, value, 1);
  vmm_status got = vmm_config_from_env(&from_env);
  unsetenv(env);
  if (want != got) broken("%s=\"%s\": vmm_config_set says %s, vmm_config_from_env %s", env, value, vmm_status_name(want), vmm_status_name(got));
  if (got == VMM_OK && strcmp(env, "VMMARENA_TRACE") && memcmp(&direct, &from_env, sizeof direct))
    broken("%s=\"%s\": the environment and vmm_config_set configure differently", env, value);
}

void fuzz_config_run(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  char *eq = memchr(text, '=', size);
  const char *value = text;
  if (eq) {
    *eq = '\0';
    value = eq + 1;
    check_set(text, value);
    check_env(text, value);
  }
  check_parse_size(value);
  for (size_t i = 0; i < SETTINGS; i++) check_set(setting_names[i], value);
  check_set("reuse", value);
  free(text);
}

/* ---- Trace lines --------------------------------------------------------------------- */

static void same_record(const vmm_trace_record *a, const vmm_trace_record *b, const char *line) {
  if (a->t_ns != b->t_ns || a->op != b->op || a->kind != b->kind || a->requested != b->requested ||
      a->rounded != b->rounded || a->ptr != b->ptr || a->stream != b->stream || a->result != b->result ||
      a->pool != b->pool || strcmp(a->tag, b->tag))
    broken("trace record changed in a format/parse round trip; line: %s", line);
}

/* Format, parse back, compare; format again, compare bytes. */
static void round_trip(const vmm_trace_record *rec) {
  char line[1024], again[1024];
  size_t n = vmm_trace_format(rec, line, sizeof line);
  if (n == 0 || n >= sizeof line || line[n - 1] != '\n' || strlen(line) != n)
    broken("vmm_trace_format wrote %zu bytes", n);
  vmm_trace_record back;
  const char *why = NULL;
  int rc = vmm_trace_parse_line(line, n, &back, &why);
  if (rc != 1) broken("the parser refuses a formatted line (%s): %s", why ? why : "not a record", line);
  same_record(rec, &back, line);
  size_t m = vmm_trace_format(&back, again, sizeof again);
  if (m != n || memcmp(line, again, n)) broken("formatting is not stable: %s then %s", line, again);
}

static uint64_t take_u64(const uint8_t **p, size_t *n) {
  uint64_t v = 0;
  for (int i = 0; i < 8 && *n; i++, (*p)++, (*n)--) v = v << 8 | **p;
  return v;
}

void fuzz_trace_line_run(const uint8_t *data, size_t size) {
  /* The bytes as a line of either version; a record of either is written back as version 2. */
  for (int version = 1; version <= VMM_TRACE_VERSION; version++) {
    vmm_trace_record rec;
    const char *why = NULL;
    int rc = vmm_trace_parse_line_version((const char *)data, size, version, &rec, &why);
    if (rc < -1 || rc > 1) broken("vmm_trace_parse_line_version(%d) returned %d", version, rc);
    if (rc == -1 && (!why || !why[0])) broken("a malformed line without a reason");
    if (rc == 1 && version == 1 && (rec.pool != 0 || rec.op >= VMM_TRACE_V1_OP_COUNT))
      broken("a version 1 line read as a version 2 op or with a pool");
    if (rc == 1) round_trip(&rec);
  }

  /* A record from the bytes: valid fields, any tag bytes but NUL, at most 255 of them. */
  if (size < 4) return;
  const uint8_t *p = data;
  size_t n = size;
  vmm_trace_record built;
  memset(&built, 0, sizeof built);
  uint8_t sel = *p++;
  n--;
  built.op = (vmm_trace_op)(sel % VMM_TRACE_OP_COUNT);
  built.kind = built.op <= VMM_TRACE_FREE ? (sel >> 4) & 1 : -1; /* only alloc and free have a kind */
  built.result = (sel >> 5) % VMM_STATUS_COUNT;
  built.t_ns = take_u64(&p, &n);
  built.requested = take_u64(&p, &n);
  built.rounded = take_u64(&p, &n);
  built.ptr = take_u64(&p, &n);
  built.stream = take_u64(&p, &n);
  int pooled = built.op == VMM_TRACE_ALLOC || built.op == VMM_TRACE_CAPTURE_BEGIN ||
                built.op == VMM_TRACE_CAPTURE_END || built.op == VMM_TRACE_RELEASE_POOL;
  if (pooled) built.pool = take_u64(&p, &n); /* the other ops take none */
  size_t t = 0;
  while (n && t < VMM_TRACE_TAG_MAX - 1 && *p) built.tag[t++] = (char)*p++, n--;
  built.tag[t] = '\0';
  round_trip(&built);
}
