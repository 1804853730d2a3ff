/* Reading a whole trace file, plain or gzip, for the replay tool and `vmmarena memviz`: one
 * reader, so that both accept and refuse the same files with the same message
 * (include/vmmarena/trace.h, docs/trace.md). Gzip data is decompressed by a `gzip -dc` child. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vmmarena.h"
#include "vmmarena/trace.h"

extern char **environ;

#define GZIP_ERR_MAX 4096 /* bytes of gzip's standard error kept to tell truncation apart */

struct vmm_trace_reader {
  char *text; /* the whole file, decompressed */
  size_t len;
  size_t pos;  /* where the next line starts */
  size_t line; /* lines handed out so far */
  size_t records;
  int version; /* of the header: 1 or 2 */
  char name[]; /* the path as messages write it */
};

typedef struct bytes {
  char *data;
  size_t len, cap;
} bytes;

/* Where a message goes: the caller's buffer, and the escaped file name that starts it. */
typedef struct report {
  char *msg;
  size_t cap;
  const char *name;
} report;

/* ---- Messages ------------------------------------------------------------------------ */

/* Writes path into out (cap > 0, NUL-terminated): printable ASCII as it is, '\' and '"'
 * escaped, every other byte as \xNN. 4 * strlen(path) + 1 bytes always suffice. */
static void escape_name(const char *path, char *out, size_t cap) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)path; *p && n + 4 < cap; p++) {
    if (*p == '\\' || *p == '"') n += (size_t)snprintf(out + n, cap - n, "\\%c", *p);
    else if (*p >= 0x20 && *p <= 0x7e) out[n++] = (char)*p;
    else n += (size_t)snprintf(out + n, cap - n, "\\x%02x", *p);
  }
  out[n] = '\0';
}

/* "NAME: line N: what" (no line part when line is 0) into the caller's buffer; returns st. */
static vmm_status fail(const report *r, vmm_status st, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static vmm_status fail(const report *r, vmm_status st, size_t line, const char *fmt, ...) {
  if (r->cap == 0) return st;
  int n = line ? snprintf(r->msg, r->cap, "%s: line %zu: ", r->name, line) : snprintf(r->msg, r->cap, "%s: ", r->name);
  if (n >= 0 && (size_t)n < r->cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg + n, r->cap - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return st;
}

/* ---- Reading bytes ------------------------------------------------------------------- */

/* Makes room for 64 KiB more; -1 when the host has no memory. */
static int bytes_reserve(bytes *b) {
  if (b->cap - b->len > 65536) return 0;
  size_t cap = b->cap ? 2 * b->cap : 1 << 20;
  char *grown = realloc(b->data, cap);
  if (!grown) return -1;
  b->data = grown;
  b->cap = cap;
  return 0;
}

/* Appends what one read() of fd gives: >0 bytes read, 0 at the end, -1 with errno set
 * (ENOMEM when the buffer cannot grow). */
static ssize_t bytes_read_some(bytes *b, int fd) {
  if (bytes_reserve(b)) return errno = ENOMEM, -1;
  ssize_t n;
  while ((n = read(fd, b->data + b->len, b->cap - b->len - 1)) < 0 && errno == EINTR) {
  }
  if (n > 0) b->len += (size_t)n;
  return n;
}

/* A failed read (errno err) of what is named by `what`. */
static vmm_status read_error(const report *r, const bytes *b, const char *what, int err) {
  if (err == ENOMEM)
    return fail(r, VMM_ERR_OUT_OF_MEMORY, 0, "out of host memory after %zu bytes of %s", b->len, what);
  return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "cannot read %s: %s", what, strerror(err));
}

/* ---- gzip -dc ------------------------------------------------------------------------ */

typedef struct child {
  pid_t pid;
  int out, err; /* read ends of its standard output and standard error */
} child;

/* Starts `gzip -dc -- path` with standard input from /dev/null; 0 or an errno value. */
static int gzip_start(const char *path, child *c) {
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
    int e = errno;
    for (int i = 0; i < 2; i++) {
      if (out[i] >= 0) close(out[i]);
      if (err[i] >= 0) close(err[i]);
    }
    return e;
  }
  posix_spawn_file_actions_t fa;
  int rc = posix_spawn_file_actions_init(&fa);
  if (rc == 0) {
    char *argv[] = {"gzip", "-dc", "--", (char *)path, NULL};
    rc = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
    if (rc == 0) rc = posix_spawnp(&c->pid, "gzip", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
  }
  close(out[1]);
  close(err[1]);
  c->out = out[0];
  c->err = err[0];
  if (rc) {
    close(out[0]);
    close(err[0]);
  }
  return rc;
}

/* Reads the child's output into b and the start of its standard error into why, until both
 * end. 0, or an errno value (the child is killed). */
static int gzip_drain(child *c, bytes *b, char *why, size_t why_cap) {
  size_t why_len = 0;
  int e = 0;
  struct pollfd p[2] = {{.fd = c->out, .events = POLLIN}, {.fd = c->err, .events = POLLIN}};
  while (e == 0 && (p[0].fd >= 0 || p[1].fd >= 0)) {
    if (poll(p, 2, -1) < 0) {
      if (errno != EINTR) e = errno;
      continue;
    }
    if (p[0].fd >= 0 && p[0].revents) {
      ssize_t n = bytes_read_some(b, p[0].fd);
      if (n < 0) e = errno;
      else if (n == 0) p[0].fd = -1;
    }
    if (p[1].fd >= 0 && p[1].revents) {
      char chunk[512];
      ssize_t n = read(p[1].fd, chunk, sizeof chunk);
      if (n > 0 && why_len + 1 < why_cap) {
        size_t keep = (size_t)n < why_cap - 1 - why_len ? (size_t)n : why_cap - 1 - why_len;
        memcpy(why + why_len, chunk, keep);
        why_len += keep;
      } else if (n == 0 || (n < 0 && errno != EINTR)) {
        p[1].fd = -1;
      }
    }
  }
  why[why_len] = '\0';
  if (e) kill(c->pid, SIGKILL);
  close(c->out);
  close(c->err);
  return e;
}

/* Decompresses path into b through `gzip -dc`; turns gzip's failures into one message. */
static vmm_status gunzip(const char *path, bytes *b, const report *r) {
  child c;
  int e = gzip_start(path, &c);
  if (e) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "gzip-compressed, but gzip cannot be run: %s", strerror(e));
  char why[GZIP_ERR_MAX];
  e = gzip_drain(&c, b, why, sizeof why);
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(c.pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (e) return read_error(r, b, "the output of gzip -dc", e);
  if (waited < 0) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "waiting for gzip -dc: %s", strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return VMM_OK;
  if (WIFSIGNALED(status)) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "gzip -dc killed by signal %d", WTERMSIG(status));
  if (WEXITSTATUS(status) == 127) /* where the spawn cannot report exec's failure (under valgrind) */
    return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "gzip-compressed, but gzip cannot be run (exit status 127)");
  if (strstr(why, "unexpected end of file")) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "truncated gzip data");
  return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "corrupt gzip data");
}

/* The file's bytes into b, decompressed when they begin with the gzip magic (1f 8b). */
static vmm_status load(const char *path, bytes *b, const report *r) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "cannot open: %s", strerror(errno));
  ssize_t n;
  while ((n = bytes_read_some(b, fd)) > 0) {
  }
  int e = errno;
  close(fd);
  if (n < 0) return read_error(r, b, "the file", e);
  if (b->len >= 2 && (unsigned char)b->data[0] == 0x1f && (unsigned char)b->data[1] == 0x8b) {
    b->len = 0;
    return gunzip(path, b, r);
  }
  return VMM_OK;
}

/* ---- Lines --------------------------------------------------------------------------- */

static size_t line_length(const vmm_trace_reader *t, size_t pos) {
  const char *nl = memchr(t->text + pos, '\n', t->len - pos);
  return nl ? (size_t)(nl - (t->text + pos)) : t->len - pos;
}

static int is_header(const char *s, size_t n) { return n >= 8 && !memcmp(s, "vmmtrace", 8); }

/* The first line: the header, which sets the version the other lines are read in. */
static vmm_status check_header(vmm_trace_reader *t, const report *r, const char *s, size_t n) {
  vmm_trace_record rec;
  const char *why = NULL;
  int rc = vmm_trace_parse_line(s, n, &rec, &why);
  if (rc < 0) return fail(r, VMM_ERR_INVALID_ARGUMENT, 1, "%s", why);
  if (rc == 0 && is_header(s, n)) { /* exactly "vmmtrace 1" or "vmmtrace 2" */
    t->version = s[9] - '0';
    return VMM_OK;
  }
  size_t shown = n > 0 && s[n - 1] == '\r' ? n - 1 : n;
  return fail(r, VMM_ERR_INVALID_ARGUMENT, 1, "expected the header \"vmmtrace 2\" (or \"vmmtrace 1\"), found \"%.*s%s\"",
              (int)(shown > 40 ? 40 : shown), s, shown > 40 ? "..." : "");
}

/* Parses every line once: the header first, then records, comments and empty lines. */
static vmm_status check_lines(vmm_trace_reader *t, const report *r) {
  if (t->len == 0) return fail(r, VMM_ERR_INVALID_ARGUMENT, 0, "empty file (a trace begins with the line \"vmmtrace 2\")");
  size_t n = line_length(t, 0), line = 1;
  vmm_status st = check_header(t, r, t->text, n);
  for (size_t pos = n + 1; st == VMM_OK && pos < t->len; line++) {
    const char *s = t->text + pos;
    n = line_length(t, pos);
    pos += n + 1;
    vmm_trace_record rec;
    const char *why = NULL;
    int rc = vmm_trace_parse_line_version(s, n, t->version, &rec, &why);
    if (rc < 0) return fail(r, VMM_ERR_INVALID_ARGUMENT, line + 1, "%s", why);
    if (rc == 0 && is_header(s, n))
      return fail(r, VMM_ERR_INVALID_ARGUMENT, line + 1, "a second header (\"vmmtrace %d\" is the first line only)",
                  t->version);
    t->records += (size_t)rc;
  }
  return st;
}

/* ---- Public calls -------------------------------------------------------------------- */

vmm_status vmm_trace_reader_open(const char *path, vmm_trace_reader **out, char *msg, size_t cap) {
  if (out) *out = NULL;
  if (cap) msg[0] = '\0';
  size_t name_cap = path ? 4 * strlen(path) + 1 : 0;
  vmm_trace_reader *t = path && out ? calloc(1, sizeof *t + name_cap) : NULL;
  if (!t) {
    const char *why = !path ? "NULL path" : !out ? "NULL out-pointer" : "out of host memory";
    if (cap) snprintf(msg, cap, "vmm_trace_reader_open: %s", why);
    return path && out ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_INVALID_ARGUMENT;
  }
  escape_name(path, t->name, name_cap);
  report r = {msg, cap, t->name};
  bytes b = {0};
  vmm_status st = load(path, &b, &r);
  t->text = b.data;
  t->len = b.len;
  if (st == VMM_OK) st = check_lines(t, &r);
  if (st != VMM_OK) {
    vmm_trace_reader_close(t);
    return st;
  }
  *out = t;
  return VMM_OK;
}

size_t vmm_trace_reader_records(const vmm_trace_reader *r) { return r ? r->records : 0; }

const char *vmm_trace_reader_name(const vmm_trace_reader *r) { return r ? r->name : ""; }

int vmm_trace_reader_next(vmm_trace_reader *r, vmm_trace_record *rec, size_t *line) {
  while (r && r->pos < r->len) {
    const char *s = r->text + r->pos;
    size_t n = line_length(r, r->pos);
    r->pos += n + 1;
    r->line++;
    if (vmm_trace_parse_line_version(s, n, r->version, rec, NULL) == 1) {
      if (line) *line = r->line;
      return 1;
    }
  }
  return 0;
}

void vmm_trace_reader_close(vmm_trace_reader *r) {
  if (!r) return;
  free(r->text);
  free(r);
}
