/* Operation trace: buffered line writer and the line parser the replay tool uses. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct vmm_trace_writer {
  FILE *f;
  char *buf;
  uint64_t start_ns; /* vmm_now_ns() at open: lines carry times since then */
};

static const char *const op_names[VMM_TRACE_OP_COUNT] = {"alloc",  "free",          "begin",        "finish",
                                                          "abort", "pause-discard", "pause-backup", "resume"};
static const char *const kind_names[] = {"package", "transient"};

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
  const char *op = (unsigned)r->op < VMM_TRACE_OP_COUNT ? op_names[r->op] : "?";
  int len = snprintf(buf, cap, "%llu %s %s %llu %llu 0x%llx 0x%llx %s %s\n", (unsigned long long)r->t_ns, op, kind,
                     (unsigned long long)r->requested, (unsigned long long)r->rounded, (unsigned long long)r->ptr,
                     (unsigned long long)r->stream, tag, vmm_status_name((vmm_status)r->result));
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
  fputs("vmmtrace 1\n", w->f);
  w->start_ns = vmm_now_ns();
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

typedef struct cursor {
  const char *p, *end;
} cursor;

/* Next space-separated field; returns its length (0 at the end). */
static size_t field(cursor *c, const char **start) {
  while (c->p < c->end && *c->p == ' ') c->p++;
  *start = c->p;
  while (c->p < c->end && *c->p != ' ') c->p++;
  return (size_t)(c->p - *start);
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

static int parse_hex(const char *s, size_t n, uint64_t *out) {
  if (n < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return -1;
  return parse_u64(s + 2, n - 2, 16, out);
}

static int match(const char *s, size_t n, const char *const *names, int count) {
  for (int i = 0; i < count; i++)
    if (strlen(names[i]) == n && !memcmp(s, names[i], n)) return i;
  return -1;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

#define BAD(msg) return (why ? (void)(*why = (msg)) : (void)0), -1

int vmm_trace_parse_line(const char *line, size_t len, vmm_trace_record *rec, const char **why) {
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
  cursor c = {line, line + len};
  const char *s;
  size_t n = field(&c, &s);
  if (n == 0 || s[0] == '#') return 0;
  if (n == 8 && !memcmp(s, "vmmtrace", 8)) {
    n = field(&c, &s);
    if (n != 1 || s[0] != '1') BAD("unsupported trace version (expected 'vmmtrace 1')");
    if (field(&c, &s)) BAD("extra fields after 'vmmtrace 1'");
    return 0;
  }
  memset(rec, 0, sizeof *rec);
  if (parse_u64(s, n, 10, &rec->t_ns)) BAD("time is not a decimal number");
  n = field(&c, &s);
  int op = match(s, n, op_names, VMM_TRACE_OP_COUNT);
  if (op < 0) BAD("unknown operation (alloc, free, begin, finish, abort)");
  rec->op = (vmm_trace_op)op;
  n = field(&c, &s);
  if (n == 1 && s[0] == '-') rec->kind = -1;
  else if ((rec->kind = match(s, n, kind_names, 2)) < 0) BAD("unknown kind (package, transient, -)");
  n = field(&c, &s);
  if (parse_u64(s, n, 10, &rec->requested)) BAD("requested bytes is not a decimal number");
  n = field(&c, &s);
  if (parse_u64(s, n, 10, &rec->rounded)) BAD("rounded bytes is not a decimal number");
  n = field(&c, &s);
  if (parse_hex(s, n, &rec->ptr)) BAD("pointer is not 0x-prefixed hex");
  n = field(&c, &s);
  if (parse_hex(s, n, &rec->stream)) BAD("stream is not 0x-prefixed hex");
  n = field(&c, &s);
  if (n == 0) BAD("missing tag");
  if (!(n == 1 && s[0] == '-')) {
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
      unsigned char ch = (unsigned char)s[i];
      if (ch == '%') {
        int hi, lo;
        if (i + 2 >= n) BAD("truncated %XX escape in tag");
        if ((hi = hexval(s[i + 1])) < 0 || (lo = hexval(s[i + 2])) < 0) BAD("bad %XX escape in tag");
        ch = (unsigned char)(hi * 16 + lo);
        if (ch == 0) BAD("NUL byte in tag");
        i += 2;
      } else if (!tag_byte_plain(ch)) {
        BAD("unescaped byte in tag");
      }
      if (out + 1 >= VMM_TRACE_TAG_MAX) BAD("tag longer than 255 bytes");
      rec->tag[out++] = (char)ch;
    }
    rec->tag[out] = '\0';
  }
  n = field(&c, &s);
  int result = -1;
  for (int i = 0; i < VMM_STATUS_COUNT; i++) {
    const char *name = vmm_status_name((vmm_status)i);
    if (strlen(name) == n && !memcmp(s, name, n)) result = i;
  }
  if (result < 0) BAD("unknown result status");
  rec->result = result;
  n = field(&c, &s);
  if (n != 0) BAD("extra fields after the result");
  /* A failed alloc or free may have no kind (an unknown pointer, a bad kind argument). */
  int memory_op = rec->op == VMM_TRACE_ALLOC || rec->op == VMM_TRACE_FREE;
  if (memory_op && rec->kind < 0 && rec->result == VMM_OK) BAD("a successful alloc or free needs a kind");
  if (!memory_op && rec->kind >= 0) BAD("begin, finish and abort take no kind ('-')");
  return 1;
}

void vmm_trace_arena_op(vmm_arena *a, vmm_trace_op op, int kind, size_t requested, size_t rounded, CUdeviceptr ptr,
                        CUstream stream, uint32_t tag, vmm_status result) {
  if (!a->trace) return;
  vmm_trace_record r;
  r.t_ns = vmm_now_ns();
  r.op = op;
  r.kind = kind;
  r.requested = requested;
  r.rounded = rounded;
  r.ptr = (uint64_t)ptr;
  r.stream = (uint64_t)(uintptr_t)stream;
  const char *name = tag ? vmm_tag_name(tag) : NULL;
  snprintf(r.tag, sizeof r.tag, "%s", name ? name : "");
  r.result = result;
  vmm_trace_write(a->trace, &r);
}
