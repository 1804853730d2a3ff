/* The rules every API harness checks (harness_rules.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_driver.h"
#include "harness_rules.h"

uint8_t fuzz_byte(fuzz_reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

void fuzz_violation(const fuzz_rules *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: op %zu: ", r->harness, r->op_index);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (r->a) fprintf(stderr, "\n  last error: %s", vmm_arena_last_error(r->a));
  fputc('\n', stderr);
  abort();
}

vmm_config fuzz_config(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  cfg.log_level = 0;
  return cfg;
}

size_t fuzz_handle_bound(unsigned choice, size_t granularity) {
  static const size_t granules_x2[8] = {0, 2, 4, 5, 8, 16, 32, 128};
  return granules_x2[choice & 7] * granularity / 2;
}

void fuzz_create(fuzz_rules *r, const vmm_config *cfg, int trace) {
  vmm_status st = vmm_arena_create(cfg, &r->a);
  if (st != VMM_OK) fuzz_violation(r, "create: %s: %s", vmm_status_name(st), vmm_create_error());
  if (trace && vmm_arena_trace(r->a, "/dev/null") != VMM_OK) fuzz_violation(r, "trace to /dev/null refused");
}

static int fault_fired(void) { return fake_faults_fired() > 0; }

void fuzz_expect_action(fuzz_rules *r, vmm_status st, int is_alloc, const char *what) {
  if (st == VMM_OK) return;
  if (st == VMM_ERR_OUT_OF_MEMORY && (is_alloc || (fault_fired() && r->oom_armed))) return;
  if (st == VMM_ERR_DRIVER && fault_fired() && r->hard_armed) return;
  fuzz_violation(r, "%s returned %s (faults fired %u, OOM armed %d, hard armed %d)", what, vmm_status_name(st),
                 fake_faults_fired(), r->oom_armed, r->hard_armed);
}

void fuzz_expect_status(fuzz_rules *r, vmm_status st, vmm_status want, const char *what) {
  if (st != want) fuzz_violation(r, "%s returned %s, expected %s", what, vmm_status_name(st), vmm_status_name(want));
  if (st != VMM_OK && !vmm_arena_last_error(r->a)[0]) fuzz_violation(r, "%s failed without a message", what);
}

void fuzz_after_call(fuzz_rules *r) {
  char why[256] = "";
  if (vmm_arena_check(r->a, why, sizeof why)) fuzz_violation(r, "vmm_arena_check: %s", why);
  const char *msg = NULL;
  vmm_status fatal = vmm_arena_fatal_error(r->a, &msg);
  if (r->fatal != VMM_OK) {
    if (fatal != r->fatal || strcmp(msg, r->fatal_msg)) fuzz_violation(r, "the first fatal error changed to: %s", msg);
  } else if (fatal != VMM_OK) {
    if (!r->hard_armed) fuzz_violation(r, "fatal error %s with no hard fault armed: %s", vmm_status_name(fatal), msg);
    if (fatal != VMM_ERR_DRIVER || !msg[0]) fuzz_violation(r, "fatal error %s without a message", vmm_status_name(fatal));
    r->fatal = fatal;
    snprintf(r->fatal_msg, sizeof r->fatal_msg, "%s", msg);
  }
}

void fuzz_arm_fault(fuzz_rules *r, uint8_t n, uint8_t c) {
  if (n == 0xff) {
    fake_clear_faults();
    return;
  }
  static const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_ERROR_INVALID_VALUE,
                                   CUDA_ERROR_ILLEGAL_ADDRESS};
  CUresult code = codes[c % 4];
  if (code == CUDA_ERROR_OUT_OF_MEMORY) r->oom_armed = 1;
  else r->hard_armed = 1;
  fake_fail_nth_any(1u + n % 24u, code, (c >> 2) & 1);
}

/* ---- JSON validity ------------------------------------------------------------------- */

typedef struct json {
  const char *p, *end;
  int depth;
} json;

static int json_value(json *j);

static void json_ws(json *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static int json_lit(json *j, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n)) return -1;
  j->p += n;
  return 0;
}

/* A string: escapes well formed, no raw control bytes, valid UTF-8 (no surrogates, no
 * overlong forms), as the snapshot writer promises. */
static int json_string(json *j) {
  if (j->p >= j->end || *j->p != '"') return -1;
  j->p++;
  while (j->p < j->end) {
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      return 0;
    }
    if (c < 0x20) return -1;
    if (c == '\\') {
      if (++j->p >= j->end) return -1;
      char e = *j->p++;
      if (e == 'u') {
        for (int i = 0; i < 4; i++, j->p++)
          if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p) || !*j->p) return -1;
      } else if (!strchr("\"\\/bfnrt", e) || !e) {
        return -1;
      }
      continue;
    }
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!n || j->end - j->p < n) return -1;
    unsigned cp = n == 1 ? c : n == 2 ? c & 0x1fu : n == 3 ? c & 0x0fu : c & 0x07u;
    for (int i = 1; i < n; i++) {
      unsigned char k = (unsigned char)j->p[i];
      if ((k & 0xc0) != 0x80) return -1;
      cp = cp << 6 | (k & 0x3fu);
    }
    static const unsigned min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
    j->p += n;
  }
  return -1;
}

static int json_number(json *j) {
  const char *start = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  int digits = 0;
  while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' || *j->p == 'E' ||
                           *j->p == '+' || *j->p == '-')) {
    digits += *j->p >= '0' && *j->p <= '9';
    j->p++;
  }
  return digits && j->p > start ? 0 : -1;
}

static int json_container(json *j, char close) {
  j->p++;
  if (++j->depth > 64) return -1;
  json_ws(j);
  if (j->p < j->end && *j->p == close) {
    j->p++;
    j->depth--;
    return 0;
  }
  for (;;) {
    json_ws(j);
    if (close == '}') {
      if (json_string(j)) return -1;
      json_ws(j);
      if (j->p >= j->end || *j->p++ != ':') return -1;
      json_ws(j);
    }
    if (json_value(j)) return -1;
    json_ws(j);
    if (j->p >= j->end) return -1;
    char c = *j->p++;
    if (c == close) break;
    if (c != ',') return -1;
  }
  j->depth--;
  return 0;
}

static int json_value(json *j) {
  json_ws(j);
  if (j->p >= j->end) return -1;
  switch (*j->p) {
  case '{': return json_container(j, '}');
  case '[': return json_container(j, ']');
  case '"': return json_string(j);
  case 't': return json_lit(j, "true");
  case 'f': return json_lit(j, "false");
  case 'n': return json_lit(j, "null");
  default: return json_number(j);
  }
}

static int json_valid(const char *text, size_t len) {
  json j = {text, text + len, 0};
  if (json_value(&j)) return 0;
  json_ws(&j);
  return j.p == j.end;
}

void fuzz_snapshot_json(fuzz_rules *r, uint8_t c) {
  size_t needed = 0;
  vmm_status st = vmm_arena_snapshot_json(r->a, NULL, 0, &needed);
  if (st != VMM_ERR_INVALID_ARGUMENT || needed < 2)
    fuzz_violation(r, "snapshot_json(NULL, 0) returned %s, needs %zu", vmm_status_name(st), needed);
  size_t cap = c == 0xff ? needed : c;
  char *buf = malloc(cap ? cap : 1); /* exactly that size, so an overrun is a heap overflow */
  size_t again = 0;
  st = vmm_arena_snapshot_json(r->a, cap ? buf : NULL, cap, &again);
  if (again != needed) fuzz_violation(r, "snapshot_json needs %zu, then %zu", needed, again);
  if (cap < needed) {
    if (st != VMM_ERR_INVALID_ARGUMENT)
      fuzz_violation(r, "snapshot_json into %zu of %zu bytes returned %s", cap, needed, vmm_status_name(st));
    if (cap && buf[cap - 1] != '\0') fuzz_violation(r, "snapshot_json into %zu bytes left no NUL", cap);
  } else {
    if (st != VMM_OK) fuzz_violation(r, "snapshot_json into %zu bytes returned %s", cap, vmm_status_name(st));
    if (strlen(buf) + 1 != needed) fuzz_violation(r, "snapshot_json wrote %zu bytes, announced %zu", strlen(buf) + 1, needed);
    if (!json_valid(buf, needed - 1)) fuzz_violation(r, "snapshot is not valid JSON: %s", buf);
  }
  free(buf);
}

/* Failed cuCtxPopCurrent calls: each leaves the context pushed, as the driver would. */
static size_t failed_pops(void) {
  size_t n = 0, count = fake_call_count();
  for (size_t i = 0; i < count; i++) {
    const fake_call *c = fake_call_at(i);
    n += c->entry == VMM_DRV_ctx_pop_current && c->result != CUDA_SUCCESS;
  }
  return n;
}

void fuzz_destroy_and_check_ledger(fuzz_rules *r) {
  size_t pops = failed_pops();
  vmm_arena_destroy(r->a);
  r->a = NULL;
  fake_ledger l;
  fake_get_ledger(&l);
  if (l.live_handles || l.live_mappings || l.reservations || l.live_events || l.errors || l.primary_retained ||
      l.ctx_pushed != pops) {
    (void)fake_ledger_clean(); /* prints what is left and the first misuse */
    fuzz_violation(r, "after destroy the ledger holds more than %zu failed pops explain", pops);
  }
}
