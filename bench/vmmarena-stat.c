/* vmmarena-stat: shows a vmmarena snapshot (the JSON of vmm_arena_snapshot_json, schema in
 * docs/snapshot.md) as readable tables.
 *
 *   vmmarena-stat [FILE]        FILE, or standard input when FILE is absent or "-"
 *
 * Exit status: 0 when shown; 2 for a usage error, an unreadable file, malformed JSON (with
 * its line and column) or a document that is not a version-1 snapshot (with the key). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_min.h"

#define SNAPSHOT_SCHEMA "vmmarena.snapshot"
#define SNAPSHOT_VERSION 1
#define TAG_WIDTH 32
#define LARGEST_SHOWN 10
#define BUCKETS_SHOWN 16

static const char *const kind_names[] = {"package", "transient"};
static const char *const state_names[] = {"live", "pooled", "freeing", "deferred", "abandoned"};
#define KIND_COUNT 2
#define STATE_COUNT 5

/* The document being shown and the first thing wrong with it. */
typedef struct doc {
  const json_value *root;
  int failed;
  char error[320];
} doc;

static void doc_fail(doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void doc_fail(doc *d, const char *fmt, ...) {
  if (d->failed) return;
  d->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->error, sizeof d->error, fmt, ap);
  va_end(ap);
}

/* The value at path, which must have one of two types (pass the same type twice for one). */
static const json_value *need(doc *d, const char *path, json_type type, json_type or_type) {
  const json_value *v = json_find(d->root, path);
  if (!v) {
    doc_fail(d, "snapshot key \"%s\" is missing", path);
    return NULL;
  }
  if (v->type != type && v->type != or_type) {
    if (type == or_type)
      doc_fail(d, "snapshot key \"%s\" (line %zu, column %zu) is %s %s, expected %s %s", path, v->line, v->column,
               v->type == JSON_ARRAY || v->type == JSON_OBJECT ? "an" : "a", json_type_name(v->type),
               type == JSON_ARRAY || type == JSON_OBJECT ? "an" : "a", json_type_name(type));
    else
      doc_fail(d, "snapshot key \"%s\" (line %zu, column %zu) is a %s, expected a %s or %s", path, v->line, v->column,
               json_type_name(v->type), json_type_name(type), json_type_name(or_type));
    return NULL;
  }
  return v;
}

static uint64_t u64_at(doc *d, const char *path) {
  const json_value *v = need(d, path, JSON_NUMBER, JSON_NUMBER);
  uint64_t x = 0;
  if (v && json_u64(v, &x))
    doc_fail(d, "snapshot key \"%s\" (line %zu, column %zu) is %s, expected a non-negative integer", path, v->line,
             v->column, v->text);
  return x;
}

static uint64_t u64f(doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint64_t u64f(doc *d, const char *fmt, ...) {
  char path[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  return u64_at(d, path);
}

/* The string at path ("" after an error); *len gets its length when len is non-NULL. */
static const char *text_at(doc *d, const char *path, size_t *len) {
  const json_value *v = need(d, path, JSON_STRING, JSON_STRING);
  if (len) *len = v ? v->len : 0;
  return v ? v->text : "";
}

static int flag_at(doc *d, const char *path) {
  const json_value *v = need(d, path, JSON_BOOL, JSON_BOOL);
  return v ? v->boolean : 0;
}

/* Index of text in names, or -1 with an error. */
static int name_index(doc *d, const char *path, const char *text, const char *const *names, int count) {
  for (int i = 0; i < count; i++)
    if (!strcmp(text, names[i])) return i;
  if (!d->failed) doc_fail(d, "snapshot key \"%s\" has an unknown value \"%.40s\"", path, text);
  return -1;
}

/* ---- Formatting ---------------------------------------------------------------------- */

static const char *fmt_bytes(uint64_t bytes, char buf[32]) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, 32, "%" PRIu64 " B", bytes);
    return buf;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, 32, "%.1f %s", v, units[u]);
  return buf;
}

/* Length of the UTF-8 sequence at s (the parser has validated it). */
static size_t sequence_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

/* Writes a decoded snapshot string for a terminal: control characters (C0, DEL and C1, which
 * could drive the terminal) and backslashes escaped, at most `width` characters (then "...");
 * pads with spaces to `width` when pad is set. */
static void put_text(FILE *out, const char *s, size_t len, size_t width, int pad) {
  size_t shown = 0, i = 0;
  while (i < len) {
    unsigned char c = (unsigned char)s[i];
    size_t n = sequence_length(c);
    char cell[16];
    if (c < 0x20 || c == 0x7f) snprintf(cell, sizeof cell, "\\x%02x", c);
    else if (c == 0xc2 && i + 1 < len && (unsigned char)s[i + 1] < 0xa0) /* C1: U+0080..U+009F */
      snprintf(cell, sizeof cell, "\\u%04x", (unsigned char)s[i + 1]);
    else if (c == '\\') snprintf(cell, sizeof cell, "\\\\");
    else cell[0] = '\0';
    size_t cost = cell[0] ? strlen(cell) : 1;
    if (shown + cost > width || (shown + cost + 3 > width && i + n < len)) {
      fputs("...", out);
      shown += 3;
      break;
    }
    if (cell[0]) fputs(cell, out);
    else fwrite(s + i, 1, n, out);
    shown += cost;
    i += n;
  }
  for (; pad && shown < width; shown++) fputc(' ', out);
}

static void put_tag(FILE *out, const json_value *tag, size_t width, int pad) {
  if (tag->type == JSON_NULL) {
    fprintf(out, "%-*s", pad ? (int)width : 0, "(no tag)");
    return;
  }
  put_text(out, tag->text, tag->len, width, pad);
}

/* ---- Sections -------------------------------------------------------------------------- */

static void show_header(doc *d, FILE *out) {
  char b[3][32];
  uint64_t limit = u64_at(d, "limit_bytes");
  const char *policy = text_at(d, "reuse.policy", NULL);
  fprintf(out, "vmmarena snapshot (schema version %d): device %" PRIu64 ", %s GPU\n", SNAPSHOT_VERSION,
          u64_at(d, "device"), flag_at(d, "integrated") ? "integrated (unified-memory)" : "discrete");
  fprintf(out, "  retention %s (mode %s); reuse %s", flag_at(d, "retention.enabled") ? "on" : "off",
          text_at(d, "retention.mode", NULL), policy);
  if (!strcmp(policy, "bounded")) {
    const json_value *bound = need(d, "reuse.bound", JSON_NUMBER, JSON_NULL);
    if (bound && bound->type == JSON_NUMBER) fprintf(out, ":%g", bound->number);
  }
  fprintf(out, "; stitching %s; granularity %s\n", flag_at(d, "reuse.stitch") ? "on" : "off",
          fmt_bytes(u64_at(d, "granularity"), b[0]));
  fprintf(out, "  headroom %s; limit %s\n", fmt_bytes(u64_at(d, "headroom_bytes"), b[1]),
          limit ? fmt_bytes(limit, b[2]) : "none");
}

static void show_totals(doc *d, FILE *out) {
  char b[5][32];
  uint64_t reservations = u64_at(d, "totals.reservations");
  fprintf(out, "\nTotals              current         peak\n");
  fprintf(out, "  physical     %12s %12s\n", fmt_bytes(u64_at(d, "totals.physical_bytes"), b[0]),
          fmt_bytes(u64_at(d, "totals.physical_peak_bytes"), b[1]));
  fprintf(out, "  mapped       %12s %12s\n", fmt_bytes(u64_at(d, "totals.mapped_bytes"), b[2]),
          fmt_bytes(u64_at(d, "totals.mapped_peak_bytes"), b[3]));
  fprintf(out, "  reserved VA  %12s in %" PRIu64 " reservation%s\n",
          fmt_bytes(u64_at(d, "totals.reserved_va_bytes"), b[4]), reservations, reservations == 1 ? "" : "s");
  fprintf(out, "  operations   %" PRIu64 " allocs, %" PRIu64 " frees, %" PRIu64 " deferred frees\n",
          u64_at(d, "totals.allocs"), u64_at(d, "totals.frees"), u64_at(d, "totals.deferred_frees"));
}

static void show_kinds(doc *d, FILE *out) {
  static const char *const columns[] = {"live", "pooled", "retained", "abandoned"};
  fprintf(out, "\n%-12s  %-17s  %-17s  %-17s  %s\n", "By kind", "live", "pooled", "retained", "abandoned");
  for (int k = 0; k < KIND_COUNT; k++) {
    fprintf(out, "  %-10s", kind_names[k]);
    for (int c = 0; c < 4; c++) {
      char b[32], cell[64];
      uint64_t count = u64f(d, "kinds.%s.%s_count", kind_names[k], columns[c]);
      uint64_t bytes = u64f(d, "kinds.%s.%s_bytes", kind_names[k], columns[c]);
      snprintf(cell, sizeof cell, "%" PRIu64 " / %s", count, fmt_bytes(bytes, b));
      fprintf(out, c < 3 ? "  %-17s" : "  %s", cell);
    }
    fputc('\n', out);
  }
}

static void show_pool(doc *d, FILE *out) {
  char b[2][32];
  uint64_t hits = u64_at(d, "pool.hits"), misses = u64_at(d, "pool.misses");
  const json_value *buckets = need(d, "pool.buckets", JSON_ARRAY, JSON_ARRAY);
  fprintf(out, "\nPool\n");
  fprintf(out, "  idle mappings  %" PRIu64 " (%s) in %zu bucket%s\n", u64_at(d, "pool.retained_reusable_handles"),
          fmt_bytes(u64_at(d, "pool.retained_reusable_bytes"), b[0]), buckets ? buckets->count : 0,
          buckets && buckets->count == 1 ? "" : "s");
  fprintf(out, "  hits %" PRIu64 ", misses %" PRIu64 ", hit rate ", hits, misses);
  if (hits + misses) fprintf(out, "%.1f%%", 100.0 * (double)hits / (double)(hits + misses));
  else fputs("n/a", out);
  fprintf(out, ", fallbacks %" PRIu64 ", stitches %" PRIu64 "\n", u64_at(d, "pool.fallbacks"), u64_at(d, "pool.stitches"));
  for (size_t i = 0; buckets && i < buckets->count; i++) {
    uint64_t size = u64f(d, "pool.buckets[%zu].size", i), count = u64f(d, "pool.buckets[%zu].count", i);
    if (i < BUCKETS_SHOWN) fprintf(out, "  bucket %12s x %" PRIu64 "\n", fmt_bytes(size, b[1]), count);
  }
  if (buckets && buckets->count > BUCKETS_SHOWN) fprintf(out, "  ... %zu more buckets\n", buckets->count - BUCKETS_SHOWN);
}

static void show_refusals_and_scope(doc *d, FILE *out) {
  fprintf(out, "\nRefusals\n  out of memory %" PRIu64 ", limit %" PRIu64 ", headroom %" PRIu64 "\n",
          u64_at(d, "refusals.out_of_memory"), u64_at(d, "refusals.limit"), u64_at(d, "refusals.headroom"));
  const char *state = text_at(d, "scope.state", NULL);
  fprintf(out, "\nRetention scope\n  %s", state);
  if (!strcmp(state, "active")) fprintf(out, " (id %" PRIu64 ")", u64_at(d, "scope.id"));
  else if (strcmp(state, "none") && !d->failed)
    doc_fail(d, "snapshot key \"scope.state\" has an unknown value \"%.40s\"", state);
  fprintf(out, "; begun %" PRIu64 ", finished %" PRIu64 ", aborted %" PRIu64 "\n", u64_at(d, "scope.begun"),
          u64_at(d, "scope.finished"), u64_at(d, "scope.aborted"));
}

typedef struct tag_row {
  const json_value *tag;
  uint64_t count, bytes;
} tag_row;

static int tag_order(const void *x, const void *y) {
  const tag_row *a = x, *b = y;
  if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  if ((a->tag->type == JSON_NULL) != (b->tag->type == JSON_NULL)) return a->tag->type == JSON_NULL ? 1 : -1;
  return a->tag->type == JSON_NULL ? 0 : strcmp(a->tag->text, b->tag->text);
}

static void show_tags(doc *d, FILE *out) {
  const json_value *tags = need(d, "tags", JSON_ARRAY, JSON_ARRAY);
  if (!tags) return;
  tag_row *rows = calloc(tags->count ? tags->count : 1, sizeof *rows);
  if (!rows) {
    doc_fail(d, "out of memory for %zu tags", tags->count);
    return;
  }
  for (size_t i = 0; i < tags->count; i++) {
    char path[64];
    snprintf(path, sizeof path, "tags[%zu].tag", i);
    rows[i].tag = need(d, path, JSON_STRING, JSON_NULL);
    rows[i].count = u64f(d, "tags[%zu].count", i);
    rows[i].bytes = u64f(d, "tags[%zu].bytes", i);
  }
  if (!d->failed) {
    qsort(rows, tags->count, sizeof *rows, tag_order);
    fprintf(out, "\nTags (live bytes, largest first)\n");
    if (!tags->count) fprintf(out, "  none\n");
    for (size_t i = 0; i < tags->count; i++) {
      char b[32];
      fputs("  ", out);
      put_tag(out, rows[i].tag, TAG_WIDTH, 1);
      fprintf(out, " %12s  %" PRIu64 " allocation%s\n", fmt_bytes(rows[i].bytes, b), rows[i].count,
              rows[i].count == 1 ? "" : "s");
    }
  }
  free(rows);
}

typedef struct driver_row {
  const char *name;
  uint64_t calls, failures, ns;
} driver_row;

static int driver_order(const void *x, const void *y) {
  const driver_row *a = x, *b = y;
  if (a->ns != b->ns) return a->ns > b->ns ? -1 : 1;
  return strcmp(a->name, b->name);
}

static void show_driver(doc *d, FILE *out) {
  const json_value *drv = need(d, "driver", JSON_OBJECT, JSON_OBJECT);
  if (!drv) return;
  driver_row *rows = calloc(drv->count ? drv->count : 1, sizeof *rows);
  if (!rows) {
    doc_fail(d, "out of memory for %zu driver entries", drv->count);
    return;
  }
  uint64_t calls = 0, failures = 0, ns = 0;
  for (size_t i = 0; i < drv->count; i++) {
    const json_member *m = &drv->members[i];
    rows[i].name = m->key;
    if (strlen(m->key) != m->key_len || strchr(m->key, '.') || strchr(m->key, '[')) {
      doc_fail(d, "snapshot key \"driver\" holds an entry named \"%.40s\", not a driver entry point", m->key);
      break;
    }
    rows[i].calls = u64f(d, "driver.%.60s.calls", m->key);
    rows[i].failures = u64f(d, "driver.%.60s.failures", m->key);
    rows[i].ns = u64f(d, "driver.%.60s.ns", m->key);
    calls += rows[i].calls, failures += rows[i].failures, ns += rows[i].ns;
  }
  if (!d->failed) {
    qsort(rows, drv->count, sizeof *rows, driver_order);
    fprintf(out, "\n%-32s %10s %10s %12s %10s\n", "Driver calls (by total time)", "calls", "failures", "total ms",
            "mean us");
    for (size_t i = 0; i < drv->count; i++)
      fprintf(out, "  %-30s %10" PRIu64 " %10" PRIu64 " %12.3f %10.2f\n", rows[i].name, rows[i].calls, rows[i].failures,
              (double)rows[i].ns / 1e6, rows[i].calls ? (double)rows[i].ns / 1e3 / (double)rows[i].calls : 0.0);
    fprintf(out, "  %-30s %10" PRIu64 " %10" PRIu64 " %12.3f\n", "all", calls, failures, (double)ns / 1e6);
  }
  free(rows);
}

static void show_errors(doc *d, FILE *out) {
  const json_value *fatal = need(d, "fatal_error", JSON_OBJECT, JSON_NULL);
  fprintf(out, "\nFatal error\n  ");
  if (fatal && fatal->type == JSON_OBJECT) {
    size_t len;
    const char *message = text_at(d, "fatal_error.message", &len);
    fprintf(out, "%s: ", text_at(d, "fatal_error.status", NULL));
    put_text(out, message, len, (size_t)-1, 0);
    fputc('\n', out);
  } else {
    fprintf(out, "none\n");
  }
  size_t len;
  const char *last = text_at(d, "last_error", &len);
  fprintf(out, "\nLast error\n  ");
  if (len) put_text(out, last, len, (size_t)-1, 0);
  else fputs("none", out);
  fputc('\n', out);
}

typedef struct mapping_row {
  const char *base;
  uint64_t extent, requested, handles, scope;
  int kind, state;
  const json_value *tag;
} mapping_row;

static int mapping_order(const void *x, const void *y) {
  const mapping_row *a = x, *b = y;
  if (a->extent != b->extent) return a->extent > b->extent ? -1 : 1;
  return strcmp(a->base, b->base);
}

static void show_inventory(doc *d, FILE *out) {
  const json_value *list = need(d, "mappings", JSON_ARRAY, JSON_ARRAY);
  if (!list) return;
  mapping_row *rows = calloc(list->count ? list->count : 1, sizeof *rows);
  if (!rows) {
    doc_fail(d, "out of memory for %zu mappings", list->count);
    return;
  }
  uint64_t count[KIND_COUNT][STATE_COUNT] = {{0}}, bytes[KIND_COUNT][STATE_COUNT] = {{0}}, total = 0;
  for (size_t i = 0; i < list->count && !d->failed; i++) {
    char path[64];
    mapping_row *r = &rows[i];
    snprintf(path, sizeof path, "mappings[%zu].base", i);
    r->base = text_at(d, path, NULL);
    r->extent = u64f(d, "mappings[%zu].extent", i);
    r->requested = u64f(d, "mappings[%zu].requested", i);
    r->handles = u64f(d, "mappings[%zu].handles", i);
    r->scope = u64f(d, "mappings[%zu].scope", i);
    snprintf(path, sizeof path, "mappings[%zu].kind", i);
    r->kind = name_index(d, path, text_at(d, path, NULL), kind_names, KIND_COUNT);
    snprintf(path, sizeof path, "mappings[%zu].state", i);
    r->state = name_index(d, path, text_at(d, path, NULL), state_names, STATE_COUNT);
    snprintf(path, sizeof path, "mappings[%zu].tag", i);
    r->tag = need(d, path, JSON_STRING, JSON_NULL);
    if (d->failed) break;
    count[r->kind][r->state]++;
    bytes[r->kind][r->state] += r->extent;
    total += r->extent;
  }
  if (!d->failed) {
    char b[3][32];
    fprintf(out, "\nInventory: %zu mapping%s, %s\n", list->count, list->count == 1 ? "" : "s", fmt_bytes(total, b[0]));
    for (int k = 0; k < KIND_COUNT; k++)
      for (int s = 0; s < STATE_COUNT; s++)
        if (count[k][s])
          fprintf(out, "  %-10s %-10s %8" PRIu64 " %12s\n", kind_names[k], state_names[s], count[k][s],
                  fmt_bytes(bytes[k][s], b[1]));
    qsort(rows, list->count, sizeof *rows, mapping_order);
    size_t shown = list->count < LARGEST_SHOWN ? list->count : LARGEST_SHOWN;
    if (shown) {
      fprintf(out, "  Largest %zu:\n  %-18s %12s %12s  %-10s %-10s %7s %6s  %s\n", shown, "base", "extent", "requested",
              "kind", "state", "handles", "scope", "tag");
      for (size_t i = 0; i < shown; i++) {
        const mapping_row *r = &rows[i];
        fputs("  ", out);
        put_text(out, r->base, strlen(r->base), 18, 1);
        fprintf(out, " %12s %12s  %-10s %-10s %7" PRIu64 " %6" PRIu64 "  ", fmt_bytes(r->extent, b[1]),
                fmt_bytes(r->requested, b[2]), kind_names[r->kind], state_names[r->state], r->handles, r->scope);
        put_tag(out, r->tag, TAG_WIDTH, 0);
        fputc('\n', out);
      }
    }
  }
  free(rows);
}

/* ---- Main -------------------------------------------------------------------------------- */

/* Reads the whole stream; NULL with errno set on failure. */
static char *read_all(FILE *f, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    char *grown = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
    if (!grown) {
      free(buf);
      errno = ENOMEM;
      return NULL;
    }
    buf = grown;
    cap *= 2;
  }
  if (buf && ferror(f)) {
    free(buf);
    errno = EIO;
    return NULL;
  }
  *len = n;
  return buf;
}

static int usage(FILE *to, int status) {
  fputs("usage: vmmarena-stat [FILE]\n"
        "Shows a vmmarena snapshot (JSON from vmm_arena_snapshot_json) as tables.\n"
        "FILE is read, or standard input when FILE is absent or \"-\".\n",
        to);
  return status;
}

int main(int argc, char **argv) {
  if (argc > 2) return usage(stderr, 2);
  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return usage(stdout, 0);
  const char *name = argc == 2 ? argv[1] : "-";
  int from_stdin = !strcmp(name, "-");
  FILE *f = from_stdin ? stdin : fopen(name, "rb");
  if (!f) {
    fprintf(stderr, "vmmarena-stat: cannot open %s: %s\n", name, strerror(errno));
    return 2;
  }
  size_t len = 0;
  char *text = read_all(f, &len);
  int read_errno = errno;
  if (!from_stdin) fclose(f);
  if (from_stdin) name = "standard input";
  if (!text) {
    fprintf(stderr, "vmmarena-stat: cannot read %s: %s\n", name, strerror(read_errno));
    return 2;
  }
  json_error err;
  json_value *root = json_parse(text, len, &err);
  free(text);
  if (!root) {
    fprintf(stderr, "vmmarena-stat: %s: line %zu, column %zu: %s\n", name, err.line, err.column, err.message);
    return 2;
  }
  doc d = {.root = root};
  const char *schema = text_at(&d, "schema", NULL);
  uint64_t version = u64_at(&d, "version");
  if (!d.failed && strcmp(schema, SNAPSHOT_SCHEMA))
    doc_fail(&d, "not a vmmarena snapshot: \"schema\" is \"%.40s\", expected \"%s\"", schema, SNAPSHOT_SCHEMA);
  if (!d.failed && version != SNAPSHOT_VERSION)
    doc_fail(&d, "snapshot version %" PRIu64 " is not supported (this tool reads version %d)", version, SNAPSHOT_VERSION);

  /* Everything is written to memory first, so a bad key shows an error and no half table. */
  char *shown = NULL;
  size_t shown_len = 0;
  FILE *out = d.failed ? NULL : open_memstream(&shown, &shown_len);
  if (!d.failed && !out) doc_fail(&d, "cannot buffer the output: %s", strerror(errno));
  if (!d.failed) {
    show_header(&d, out);
    show_totals(&d, out);
    show_kinds(&d, out);
    show_pool(&d, out);
    show_refusals_and_scope(&d, out);
    show_tags(&d, out);
    show_driver(&d, out);
    show_errors(&d, out);
    show_inventory(&d, out);
  }
  if (out) fclose(out);
  json_free(root);
  if (d.failed) {
    free(shown);
    fprintf(stderr, "vmmarena-stat: %s: %s\n", name, d.error);
    return 2;
  }
  fwrite(shown, 1, shown_len, stdout);
  free(shown);
  return fflush(stdout) == 0 ? 0 : 1;
}
