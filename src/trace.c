/* Operation trace: the buffered line writer and the line parser (docs/trace.md). */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct vmm_trace_writer {
  FILE *f;
  char *buf;
  uint64_t start_ns; /* vmm_driver_now_ns() at open: lines carry times since then */
};

static const char *const op_names[VMM_TRACE_OP_COUNT] = {
    "alloc", "free", "begin", "finish", "abort", "pause-discard", "pause-backup", "resume", /* version 1 */
    "capture-begin", "capture-end", "release-pool", "empty-cache", "record-stream", "set-limit"};
#define V1_OP_LIST "alloc, free, begin, finish, abort, pause-discard, pause-backup, resume"
#define OP_LIST V1_OP_LIST ", capture-begin, capture-end, release-pool, empty-cache, record-stream, set-limit"
static const char *const kind_names[] = {"package", "transient"};

const char *vmm_trace_op_name(vmm_trace_op op) { return (unsigned)op < VMM_TRACE_OP_COUNT ? op_names[op] : "?"; }

static int tag_byte_plain(unsigned char c) { return c > 0x20 && c < 0x7f && c != '%'; }

size_t vmm_trace_format(const vmm_trace_record *r, char *buf, size_t cap) {
  char tag[3 * VMM_TRACE_TAG_MAX + 2];
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)r->tag; *p && n + 4 < sizeof tag; p++) {
    if (tag_byte_plain(*p)) tag[n++] = (char)*p;
    else n += (size_t)snprintf(tag + n, sizeof tag - n, "%%%02X", *p);
  }
  if (n == 0) tag[n++] = '-';
  else if (n == 1 && tag[0] == '-') n = (size_t)snprintf(tag, sizeof tag, "%%2D"); /* the tag "-", not "none" */
  tag[n] = '\0';
  const char *kind = r->kind >= 0 && r->kind < VMM_KIND_COUNT ? kind_names[r->kind] : "-";
  const char *op = vmm_trace_op_name(r->op);
  int len = snprintf(buf, cap, "%llu %s %s %llu %llu 0x%llx 0x%llx %s %s %llu\n", (unsigned long long)r->t_ns, op,
                     kind, (unsigned long long)r->requested, (unsigned long long)r->rounded,
                     (unsigned long long)r->ptr, (unsigned long long)r->stream, tag,
                     vmm_status_name((vmm_status)r->result), (unsigned long long)r->pool);
  return len < 0 ? 0 : (size_t)len;
}

vmm_trace_writer *vmm_trace_open(const char *path) {
  vmm_trace_writer *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->f = fopen(path, "w");
  int e = errno; /* fopen's reason, before malloc can touch errno */
  w->buf = malloc(1 << 20);
  if (!w->f || !w->buf) {
    if (w->f) {
      fclose(w->f);
      e = ENOMEM;
    }
    free(w->buf);
    free(w);
    errno = e;
    return NULL;
  }
  setvbuf(w->f, w->buf, _IOFBF, 1 << 20);
  fprintf(w->f, "vmmtrace %d\n", VMM_TRACE_VERSION);
  w->start_ns = vmm_driver_now_ns();
  return w;
}

void vmm_trace_write(vmm_trace_writer *w, const vmm_trace_record *rec) {
  char line[1200];
  vmm_trace_record r = *rec;
  r.t_ns = rec->t_ns > w->start_ns ? rec->t_ns - w->start_ns : 0;
  size_t n = vmm_trace_format(&r, line, sizeof line);
  if (n < sizeof line) fwrite(line, 1, n, w->f);
}

void vmm_trace_close(vmm_trace_writer *w) {
  if (!w) return;
  fclose(w->f);
  free(w->buf);
  free(w);
}

/* ---- Parser -------------------------------------------------------------------------- */

#define FIELD_MAX 10 /* version 2; version 1 has the first 9 */
#define V1_FIELDS "time, operation, kind, requested, rounded, pointer, stream, tag, result"
#define QUOTE_MAX 40 /* bytes of a field quoted in a message; longer ones end in "..." */

/* The message of the latest malformed line parsed by this thread (vmm_trace_parse_line). */
static __thread char parse_why[256];

typedef struct span {
  const char *s;
  size_t n;
} span;

/* printf arguments for "\"%.*s%s\"": the field, cut to QUOTE_MAX bytes. */
#define QUOTED(f) (int)((f).n > QUOTE_MAX ? QUOTE_MAX : (f).n), (f).s, (f).n > QUOTE_MAX ? "..." : ""

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(parse_why, sizeof parse_why, fmt, ap);
  va_end(ap);
  return -1;
}

static int parse_u64(const char *s, size_t n, int base, uint64_t *out) {
  if (n == 0 || n > 40) return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    int d;
    char ch = s[i];
    if (ch >= '0' && ch <= '9') d = ch - '0';
    else if (base == 16 && ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    else if (base == 16 && ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
    else return -1;
    if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return -1;
    v = v * (uint64_t)base + (uint64_t)d;
  }
  *out = v;
  return 0;
}

static int match(span f, const char *const *names, int count) {
  for (int i = 0; i < count; i++)
    if (strlen(names[i]) == f.n && !memcmp(f.s, names[i], f.n)) return i;
  return -1;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

static int check_printable(const char *line, size_t len) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)line[i];
    if (c < 0x20 || c > 0x7e) return bad("byte \\x%02x at column %zu is not printable ASCII", c, i + 1);
  }
  return 0;
}

/* Splits a non-empty line at single spaces; stores the first `max` fields and returns how
 * many there are, or -1 at an empty field (a space at either end, or two in a row). */
static int split(const char *line, size_t len, span *fields, int max) {
  int count = 0;
  for (const char *p = line, *end = line + len;;) {
    const char *space = memchr(p, ' ', (size_t)(end - p));
    const char *stop = space ? space : end;
    if (stop == p && count == 0) return bad("the line begins with a space");
    if (stop == p && !space) return bad("the line ends with a space");
    if (stop == p) return bad("two spaces at column %zu (fields are separated by one space)", (size_t)(p - line));
    if (count < max) fields[count] = (span){p, (size_t)(stop - p)};
    count++;
    if (!space) return count;
    p = space + 1;
  }
}

static int decimal_field(span f, const char *name, uint64_t *out) {
  if (parse_u64(f.s, f.n, 10, out)) return bad("%s \"%.*s%s\" is not a decimal number below 2^64", name, QUOTED(f));
  return 0;
}

static int hex_field(span f, const char *name, uint64_t *out) {
  if (f.n < 3 || f.s[0] != '0' || f.s[1] != 'x' || parse_u64(f.s + 2, f.n - 2, 16, out))
    return bad("%s \"%.*s%s\" is not 0x and hex digits below 2^64", name, QUOTED(f));
  return 0;
}

/* Decodes a tag field ('-' is no tag) into tag[VMM_TRACE_TAG_MAX]. */
static int tag_field(span f, char *tag) {
  size_t out = 0;
  if (f.n == 1 && f.s[0] == '-') f.n = 0;
  for (size_t i = 0; i < f.n; i++) {
    unsigned char ch = (unsigned char)f.s[i];
    if (ch == '%') {
      if (i + 2 >= f.n) return bad("tag \"%.*s%s\": truncated %%XX escape", QUOTED(f));
      int hi = hexval(f.s[i + 1]), lo = hexval(f.s[i + 2]);
      if (hi < 0 || lo < 0) return bad("tag \"%.*s%s\": bad %%XX escape \"%.3s\"", QUOTED(f), f.s + i);
      if ((ch = (unsigned char)(hi * 16 + lo)) == 0) return bad("tag \"%.*s%s\": %%00 (a NUL byte) cannot be in a tag", QUOTED(f));
      i += 2;
    }
    if (out + 1 >= VMM_TRACE_TAG_MAX) return bad("tag \"%.*s%s\": longer than 255 bytes", QUOTED(f));
    tag[out++] = (char)ch;
  }
  tag[out] = '\0';
  return 0;
}

static int result_field(span f, int *result) {
  for (int i = 0; i < VMM_STATUS_COUNT; i++) {
    const char *name = vmm_status_name((vmm_status)i);
    if (strlen(name) == f.n && !memcmp(f.s, name, f.n)) return *result = i, 0;
  }
  return bad("unknown result \"%.*s%s\" (a status name: VMM_OK, VMM_ERR_...)", QUOTED(f));
}

/* A failed alloc or free may have no kind (an unknown pointer, a bad kind argument); the
 * other operations never have one. */
static int check_kind(const vmm_trace_record *rec, span kind) {
  int memory_op = rec->op == VMM_TRACE_ALLOC || rec->op == VMM_TRACE_FREE;
  if (memory_op && rec->kind < 0 && rec->result == VMM_OK)
    return bad("a successful %s needs a kind (package or transient), found \"-\"", op_names[rec->op]);
  if (!memory_op && rec->kind >= 0) return bad("%s takes no kind (\"-\"), found \"%.*s%s\"", op_names[rec->op], QUOTED(kind));
  return 0;
}

/* Version 2's last field: the pool an alloc asked or a pool op named; 0 for the others. */
static int pool_field(span f, vmm_trace_record *rec) {
  if (decimal_field(f, "pool", &rec->pool)) return -1;
  bool named = rec->op == VMM_TRACE_ALLOC || rec->op == VMM_TRACE_CAPTURE_BEGIN || rec->op == VMM_TRACE_CAPTURE_END ||
               rec->op == VMM_TRACE_RELEASE_POOL;
  if (!named && rec->pool != 0) return bad("%s takes no pool (0), found \"%.*s%s\"", op_names[rec->op], QUOTED(f));
  return 0;
}

static int op_field(span f, int version, vmm_trace_record *rec) {
  int op = match(f, op_names, version == 1 ? VMM_TRACE_V1_OP_COUNT : VMM_TRACE_OP_COUNT);
  if (op >= 0) return rec->op = (vmm_trace_op)op, 0;
  if (version == 1 && match(f, op_names, VMM_TRACE_OP_COUNT) >= 0)
    return bad("operation \"%.*s%s\" is not in version 1 (\"vmmtrace 1\"); it came with \"vmmtrace 2\"", QUOTED(f));
  if (version == 1) return bad("unknown operation \"%.*s%s\" (" V1_OP_LIST ")", QUOTED(f));
  return bad("unknown operation \"%.*s%s\" (" OP_LIST ")", QUOTED(f));
}

static int record_fields(const span *f, int version, vmm_trace_record *rec) {
  memset(rec, 0, sizeof *rec);
  if (decimal_field(f[0], "time", &rec->t_ns) || op_field(f[1], version, rec)) return -1;
  int no_kind = f[2].n == 1 && f[2].s[0] == '-';
  rec->kind = no_kind ? -1 : match(f[2], kind_names, 2);
  if (rec->kind < 0 && !no_kind)
    return bad("unknown kind \"%.*s%s\" (package, transient, -)", QUOTED(f[2]));
  if (decimal_field(f[3], "requested bytes", &rec->requested) || decimal_field(f[4], "rounded bytes", &rec->rounded) ||
      hex_field(f[5], "pointer", &rec->ptr) || hex_field(f[6], "stream", &rec->stream) || tag_field(f[7], rec->tag) ||
      result_field(f[8], &rec->result) || check_kind(rec, f[2]) || (version > 1 && pool_field(f[9], rec)))
    return -1;
  return 1;
}

/* A field count other than the version's; says so when the count is the other version's. */
static int bad_count(int count, int version) {
  if (version == 1)
    return bad("%d fields, expected 9 (" V1_FIELDS ")%s", count,
               count == 10 ? ": a version 1 trace (\"vmmtrace 1\") has no pool field" : "");
  return bad("%d fields, expected 10 (" V1_FIELDS ", pool)%s", count,
             count == 9 ? ": a version 2 trace (\"vmmtrace 2\") ends every line with a pool" : "");
}

static int parse(const char *line, size_t len, int version, vmm_trace_record *rec) {
  if (version != 1 && version != 2) return bad("version %d: this parser reads versions 1 and 2", version);
  if (len && line[len - 1] == '\n') len--;
  if (len && line[len - 1] == '\r') len--;
  if (len == 0) return 0;
  if (check_printable(line, len)) return -1;
  if (line[0] == '#') return 0;
  span f[FIELD_MAX];
  int count = split(line, len, f, FIELD_MAX);
  if (count < 0) return -1;
  span whole = {line, len};
  if (f[0].n == 8 && !memcmp(f[0].s, "vmmtrace", 8)) {
    if (count == 2 && f[1].n == 1 && (f[1].s[0] == '1' || f[1].s[0] == '2')) return 0;
    return bad("unsupported header \"%.*s%s\" (this reader reads \"vmmtrace 1\" and \"vmmtrace 2\")", QUOTED(whole));
  }
  if (count != (version == 1 ? 9 : 10)) return bad_count(count, version);
  return record_fields(f, version, rec);
}

int vmm_trace_parse_line_version(const char *line, size_t len, int version, vmm_trace_record *rec, const char **why) {
  int rc = parse(line, len, version, rec);
  if (rc < 0 && why) *why = parse_why;
  return rc;
}

int vmm_trace_parse_line(const char *line, size_t len, vmm_trace_record *rec, const char **why) {
  return vmm_trace_parse_line_version(line, len, VMM_TRACE_VERSION, rec, why);
}

void vmm_trace_arena_op(vmm_arena *a, vmm_trace_op op, int kind, size_t requested, size_t rounded, CUdeviceptr ptr,
                        CUstream stream, uint32_t tag, vmm_pool_id pool, vmm_status result) {
  if (!a->trace) return;
  vmm_trace_record r;
  r.t_ns = vmm_driver_now_ns();
  r.op = op;
  r.kind = kind;
  r.requested = requested;
  r.rounded = rounded;
  r.ptr = (uint64_t)ptr;
  r.stream = (uint64_t)(uintptr_t)stream;
  const char *name = tag ? vmm_tag_name(tag) : NULL;
  snprintf(r.tag, sizeof r.tag, "%s", name ? name : "");
  r.result = result;
  r.pool = pool;
  vmm_trace_write(a->trace, &r);
}

void vmm_trace_arena_limit(vmm_arena *a) {
  vmm_trace_arena_op(a, VMM_TRACE_SET_LIMIT, -1, a->cfg.limit_bytes, 0, 0, NULL, 0, VMM_POOL_SHARED, VMM_OK);
}

bool vmm_trace_arena_open(vmm_arena *a, const char *path) {
  if (!(a->trace = vmm_trace_open(path))) return false;
  if (a->cfg.limit_bytes) vmm_trace_arena_limit(a);
  return true;
}
