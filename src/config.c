/* Configuration: one parser for the C API, the VMMARENA_* environment and the Python package. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static __thread char config_error[512];

const char *vmm_config_error(void) { return config_error; }

static vmm_status usage(const char *name, const char *value, const char *why) {
  snprintf(config_error, sizeof config_error, "%s=\"%s\": %s", name, value ? value : "(null)", why);
  return VMM_ERR_INVALID_ARGUMENT;
}

/* How a size is written: the end of every size error, after the rule that was broken. */
#define SIZE_FORM "use a size such as 8G, 512M, 1.5G or 4096"
#define SIZE_UNITS "a number, then K, M, G, T or P (or KiB, KB, ...), such as 8G, 512M, 1.5G or 4096"
#define SIZE_TOO_LARGE "size overflows 64 bits; the largest is 18446744073709551615 (just under 16384P)"

/* Parses the size; on failure says why (static text): the rule the text broke and how a size
 * is written, so that "NAME=\"VALUE\": why" is the whole message. */
static vmm_status parse_size(const char *text, size_t *bytes, const char **why) {
  if (!text || !bytes) return *why = "NULL argument", VMM_ERR_INVALID_ARGUMENT;
  const char *p = text;
  if (*p == '\0') return *why = "a size must not be empty; " SIZE_FORM, VMM_ERR_INVALID_ARGUMENT;
  if (*p == '-') return *why = "a size must not be negative; " SIZE_FORM, VMM_ERR_INVALID_ARGUMENT;
  if (!isdigit((unsigned char)*p))
    return *why = "a size starts with a digit; " SIZE_FORM, VMM_ERR_INVALID_ARGUMENT;
  unsigned __int128 whole = 0;
  while (isdigit((unsigned char)*p)) {
    whole = whole * 10 + (unsigned)(*p++ - '0');
    if (whole > UINT64_MAX) return *why = SIZE_TOO_LARGE, VMM_ERR_INVALID_ARGUMENT;
  }
  unsigned __int128 frac = 0, frac_div = 1;
  int frac_nonzero = 0; /* any digit after the point, also past the 18 that are kept */
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p))
      return *why = "a decimal point needs digits after it; " SIZE_FORM, VMM_ERR_INVALID_ARGUMENT;
    while (isdigit((unsigned char)*p)) {
      frac_nonzero |= *p != '0';
      if (frac_div < 1000000000000000000ull) {
        frac = frac * 10 + (unsigned)(*p - '0');
        frac_div *= 10;
      }
      p++;
    }
  }
  unsigned shift = 0;
  switch (toupper((unsigned char)*p)) {
  case 'K': shift = 10; p++; break;
  case 'M': shift = 20; p++; break;
  case 'G': shift = 30; p++; break;
  case 'T': shift = 40; p++; break;
  case 'P': shift = 50; p++; break;
  default: break;
  }
  if (shift && (p[0] == 'i' || p[0] == 'I') && (p[1] == 'B' || p[1] == 'b')) p += 2;
  else if (*p == 'B' || *p == 'b') p++;
  if (*p != '\0')
    return *why = "unexpected characters after the size; a size is " SIZE_UNITS, VMM_ERR_INVALID_ARGUMENT;
  if (!shift && frac_nonzero)
    return *why = "a fraction of a byte: a size without a unit is whole bytes; " SIZE_FORM, VMM_ERR_INVALID_ARGUMENT;
  unsigned __int128 mult = (unsigned __int128)1 << shift;
  unsigned __int128 total = whole * mult + frac * mult / frac_div;
  if (total > SIZE_MAX) return *why = SIZE_TOO_LARGE, VMM_ERR_INVALID_ARGUMENT;
  *bytes = (size_t)total;
  return VMM_OK;
}

vmm_status vmm_parse_size(const char *text, size_t *bytes) {
  const char *why = NULL;
  size_t v;
  if (!bytes) return usage("size", text, "NULL result pointer");
  vmm_status s = parse_size(text, &v, &why);
  if (s != VMM_OK) return usage("size", text, why);
  *bytes = v;
  return VMM_OK;
}

void vmm_config_init(vmm_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->device = 0;
  cfg->reuse = VMM_REUSE_EXACT;
  cfg->reuse_bound = 1.0;
  cfg->package_assembly = 1;
  cfg->reserve_bytes = (size_t)256 << 30;
  cfg->retain = VMM_RETAIN_AUTO;
  cfg->log_level = 1;
  cfg->grow_in_place = 1;
  cfg->unmap_in_background = 1;
  cfg->pause_staging = VMM_STAGING_DEFAULT;
}

const char *vmm_reuse_policy_name(vmm_reuse_policy p) {
  switch (p) {
  case VMM_REUSE_EXACT: return "exact";
  case VMM_REUSE_BOUNDED: return "bounded";
  case VMM_REUSE_BEST_FIT: return "best-fit";
  case VMM_REUSE_NONE: return "none";
  }
  return "unknown";
}

static vmm_status set_switch(const char *env, const char *value, int *out) {
  if (!strcasecmp(value, "on") || !strcmp(value, "1") || !strcasecmp(value, "true")) return *out = 1, VMM_OK;
  if (!strcasecmp(value, "off") || !strcmp(value, "0") || !strcasecmp(value, "false")) return *out = 0, VMM_OK;
  return usage(env, value, "expected on or off");
}

static vmm_status set_size(const char *env, const char *value, size_t *out, int allow_zero) {
  const char *why = NULL;
  size_t v;
  if (parse_size(value, &v, &why) != VMM_OK) return usage(env, value, why);
  if (!allow_zero && v == 0) return usage(env, value, "must be greater than zero; " SIZE_FORM);
  *out = v;
  return VMM_OK;
}

/* A number that starts with a digit (no sign, "inf" or "nan") and is the whole text. */
static bool parse_number(const char *text, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  if (!isdigit((unsigned char)*text) || *end != '\0' || errno) return false;
  *out = v;
  return true;
}

static vmm_status set_reuse(const char *env, const char *value, vmm_config *cfg) {
  if (!strcasecmp(value, "exact")) return cfg->reuse = VMM_REUSE_EXACT, cfg->reuse_bound = 1.0, VMM_OK;
  if (!strcasecmp(value, "best-fit")) return cfg->reuse = VMM_REUSE_BEST_FIT, VMM_OK;
  if (!strcasecmp(value, "none")) return cfg->reuse = VMM_REUSE_NONE, VMM_OK;
  if (!strncasecmp(value, "bounded:", 8)) {
    double bound;
    if (!parse_number(value + 8, &bound) || !(bound >= 1.0) || bound > 1e6)
      return usage(env, value, "bounded:F needs a number F >= 1 (e.g. bounded:2)");
    cfg->reuse = VMM_REUSE_BOUNDED;
    cfg->reuse_bound = bound;
    return VMM_OK;
  }
  return usage(env, value, "expected exact, bounded:F (F >= 1), best-fit or none");
}

#define VMM_REFILL_SHARE_DEFAULT 0.9       /* below-peak: of the high-water mark */
#define VMM_REFILL_LIVE_SHARE_DEFAULT 1.05 /* within-live: of the most live bytes (the goal of whole-process mode) */

static vmm_status set_refill(const char *env, const char *value, vmm_config *cfg) {
  double share = 0.0, live_share = 0.0;
  if (!strcasecmp(value, "assemble")) {
  } else if (!strcasecmp(value, "below-peak")) {
    share = VMM_REFILL_SHARE_DEFAULT;
  } else if (!strncasecmp(value, "below-peak:", 11)) {
    if (!parse_number(value + 11, &share) || !(share > 0.0 && share <= 1.0))
      return usage(env, value, "below-peak:F needs a share F with 0 < F <= 1 (e.g. below-peak:0.9)");
  } else if (!strcasecmp(value, "within-live")) {
    live_share = VMM_REFILL_LIVE_SHARE_DEFAULT;
  } else if (!strncasecmp(value, "within-live:", 12)) {
    if (!parse_number(value + 12, &live_share) || !(live_share >= 1.0) || live_share > 1e6)
      return usage(env, value, "within-live:F needs a factor F >= 1 (e.g. within-live:1.05)");
  } else {
    return usage(env, value, "expected assemble, below-peak[:F] (0 < F <= 1) or within-live[:F] (F >= 1)");
  }
  cfg->refill_share = share;
  cfg->refill_live_share = live_share;
  return VMM_OK;
}

static vmm_status set_retain(const char *env, const char *value, vmm_config *cfg) {
  if (!strcasecmp(value, "on")) return cfg->retain = VMM_RETAIN_ON, VMM_OK;
  if (!strcasecmp(value, "off")) return cfg->retain = VMM_RETAIN_OFF, VMM_OK;
  if (!strcasecmp(value, "auto")) return cfg->retain = VMM_RETAIN_AUTO, VMM_OK;
  return usage(env, value, "expected on, off or auto");
}

static vmm_status set_peers(const char *env, const char *value, vmm_config *cfg) {
  if (!strcasecmp(value, "none")) return cfg->peer_access_mask = 0, VMM_OK;
  if (!strcasecmp(value, "all")) return cfg->peer_access_mask = ~(uint64_t)0, VMM_OK;
  uint64_t mask = 0;
  const char *p = value;
  if (*p == '\0') return usage(env, value, "empty; expected none, all or device ordinals such as 1,2");
  while (*p) {
    if (!isdigit((unsigned char)*p)) return usage(env, value, "expected none, all or device ordinals such as 1,2");
    unsigned long d = 0;
    while (isdigit((unsigned char)*p)) {
      d = d * 10 + (unsigned long)(*p++ - '0');
      if (d >= VMM_MAX_DEVICES) return usage(env, value, "device ordinal out of range (0..63)");
    }
    mask |= (uint64_t)1 << d;
    if (*p == ',') {
      p++;
      if (*p == '\0') return usage(env, value, "trailing comma");
    } else if (*p) {
      return usage(env, value, "expected none, all or device ordinals such as 1,2");
    }
  }
  cfg->peer_access_mask = mask;
  return VMM_OK;
}

static vmm_status set_log(const char *env, const char *value, vmm_config *cfg) {
  static const char *const levels[] = {"off", "error", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcasecmp(value, levels[i]) || (value[0] == '0' + i && value[1] == '\0')) return cfg->log_level = i, VMM_OK;
  return usage(env, value, "expected off, error, info or debug");
}

static vmm_status set_unmap(const char *env, const char *value, int *out) {
  if (!strcasecmp(value, "background")) return *out = 1, VMM_OK;
  if (!strcasecmp(value, "inline")) return *out = 0, VMM_OK;
  return usage(env, value, "expected background or inline");
}

static vmm_status set_stream_order(const char *env, const char *value, int *out) {
  if (!strcasecmp(value, "completed")) return *out = 0, VMM_OK;
  if (!strcasecmp(value, "event")) return *out = 1, VMM_OK;
  return usage(env, value, "expected completed or event");
}

/* "off" or "0" (synchronous copies), or a size of at least 1 MiB and at most 4 GiB, with
 * ",keep" to keep the staging while nothing is paused. */
static vmm_status set_staging(const char *env, const char *value, size_t *out) {
  if (!strcasecmp(value, "off") || !strcmp(value, "0")) return *out = 0, VMM_OK;
  char size[64];
  const char *comma = strchr(value, ',');
  size_t len = comma ? (size_t)(comma - value) : strlen(value);
  if (comma && strcasecmp(comma + 1, "keep")) return usage(env, value, "expected SIZE or SIZE,keep (e.g. 64M,keep)");
  if (len >= sizeof size) return usage(env, value, "the size is too long; " SIZE_FORM);
  memcpy(size, value, len);
  size[len] = '\0';
  const char *why = NULL;
  size_t v;
  if (parse_size(size, &v, &why) != VMM_OK) return usage(env, value, why);
  if (v < VMM_STAGING_MIN || v > VMM_STAGING_MAX)
    return usage(env, value, "the staging is off (0) or between 1 MiB and 4 GiB");
  *out = v | (comma ? VMM_STAGING_KEEP : 0);
  return VMM_OK;
}

/* Setting name (upper case after VMMARENA_, or lower case short name) and its setter. */
static const struct setting {
  const char *env, *short_name;
  int id;
} settings[] = {
    {"VMMARENA_REUSE", "reuse", 0},     {"VMMARENA_STITCH", "stitch", 1}, /* retired */
    {"VMMARENA_RESERVE", "reserve", 2}, {"VMMARENA_HEADROOM", "headroom", 3},
    {"VMMARENA_LIMIT", "limit", 4},     {"VMMARENA_RETAIN", "retain", 5},
    {"VMMARENA_PEER_ACCESS", "peer_access", 6}, {"VMMARENA_TRACE", "trace", 7},
    {"VMMARENA_LOG", "log", 8},         {"VMMARENA_HANDLE_BOUND", "handle_bound", 9},
    {"VMMARENA_PACKAGE_ASSEMBLY", "package_assembly", 10},
    {"VMMARENA_PAUSE_STAGING", "pause_staging", 11},
    {"VMMARENA_CACHE", "cache", 12},
    {"VMMARENA_REFILL", "refill", 13},
    {"VMMARENA_UNMAP", "unmap", 14},
    {"VMMARENA_GROW", "grow", 15},
    {"VMMARENA_STREAM_ORDER", "stream_order", 16},
};

static vmm_status apply(const struct setting *s, const char *value, vmm_config *cfg) {
  if (!value) return usage(s->env, value, "no value");
  switch (s->id) {
  case 0: return set_reuse(s->env, value, cfg);
  case 1:
    return usage(s->env, value,
                 "retired: inside a scope idle handles are always assembled before new memory is created "
                 "(docs/design.md, \"Allocation sources\"); unset it");
  case 2: return set_size(s->env, value, &cfg->reserve_bytes, 0);
  case 3: return set_size(s->env, value, &cfg->headroom_bytes, 1);
  case 4: return set_size(s->env, value, &cfg->limit_bytes, 1);
  case 5: return set_retain(s->env, value, cfg);
  case 6: return set_peers(s->env, value, cfg);
  case 7:
    if (*value == '\0') return usage(s->env, value, "empty path");
    cfg->trace_path = value;
    return VMM_OK;
  case 8: return set_log(s->env, value, cfg);
  case 9:
    if (!strcasecmp(value, "auto")) return cfg->handle_bound_bytes = 0, VMM_OK;
    return set_size(s->env, value, &cfg->handle_bound_bytes, 0);
  case 10: return set_switch(s->env, value, &cfg->package_assembly);
  case 11: return set_staging(s->env, value, &cfg->pause_staging);
  case 12: return set_switch(s->env, value, &cfg->caching);
  case 13: return set_refill(s->env, value, cfg);
  case 14: return set_unmap(s->env, value, &cfg->unmap_in_background);
  case 15: return set_switch(s->env, value, &cfg->grow_in_place);
  case 16: return set_stream_order(s->env, value, &cfg->order_by_event);
  }
  return VMM_ERR_INVALID_ARGUMENT;
}

vmm_status vmm_config_set(vmm_config *cfg, const char *name, const char *value) {
  if (!cfg || !name) return usage("setting", name, "NULL configuration or name");
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    if (strcmp(name, settings[i].env) && strcmp(name, settings[i].short_name)) continue;
    vmm_config next = *cfg;
    vmm_status s = apply(&settings[i], value, &next);
    if (s == VMM_OK) *cfg = next;
    return s;
  }
  return usage(name, value, "unknown setting");
}

vmm_status vmm_config_from_env(vmm_config *cfg) {
  if (!cfg) return usage("configuration", NULL, "NULL configuration");
  vmm_config next = *cfg;
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    const char *value = getenv(settings[i].env);
    if (!value) continue;
    vmm_status s = apply(&settings[i], value, &next);
    if (s != VMM_OK) return s;
  }
  *cfg = next;
  config_error[0] = '\0';
  return VMM_OK;
}
