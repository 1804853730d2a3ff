/* Operation trace: a round trip through a real arena (every line parsed back and compared with
 * what was done), whole-process mode's calls in it, switching the trace on and off, the parser
 * on malformed lines of both versions, the file reader (plain and gzip files, version 1 and 2,
 * and what it refuses), and the configuration errors of VMMARENA_TRACE. */
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vmmarena/trace.h"

#define S1 TU_STREAM(1)
#define S2 TU_STREAM(2)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A fresh directory for trace files, removed (with its files) by remove_dir. */
static char *make_dir(void) {
  char *dir = strdup("/tmp/vmmarena-trace-XXXXXX");
  assert_non_null(dir);
  assert_non_null(mkdtemp(dir));
  return dir;
}

static char *path_in(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  assert_non_null(p);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

static void remove_dir(char *dir, char **files, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unlink(files[i]);
    free(files[i]);
  }
  assert_int_equal(rmdir(dir), 0);
  free(dir);
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  assert_non_null(buf);
  while ((n += fread(buf + n, 1, cap - n, f)) == cap) {
    cap *= 2;
    buf = realloc(buf, cap);
    assert_non_null(buf);
  }
  fclose(f);
  *len = n;
  return buf;
}

/* A trace file as one string: its last '\n' becomes the terminator. */
static char *read_text(const char *path) {
  size_t len;
  char *text = read_file(path, &len);
  assert_true(len > 0 && text[len - 1] == '\n');
  text[len - 1] = '\0';
  return text;
}

/* ---- What the test did, to compare the trace with ----------------------------------------- */

typedef struct expected {
  vmm_trace_op op;
  int kind;
  uint64_t requested, rounded, ptr, stream;
  char tag[VMM_TRACE_TAG_MAX];
  vmm_status result;
  uint64_t pool;
} expected;

typedef struct oplog {
  expected items[64];
  size_t count;
} oplog;

static void expect(oplog *l, vmm_trace_op op, int kind, uint64_t requested, uint64_t rounded, const void *ptr,
                   CUstream stream, const char *tag, vmm_status result) {
  assert_true(l->count < sizeof l->items / sizeof l->items[0]);
  expected *e = &l->items[l->count++];
  *e = (expected){op, kind, requested, rounded, (uint64_t)(uintptr_t)ptr, (uint64_t)(uintptr_t)stream, "", result, 0};
  snprintf(e->tag, sizeof e->tag, "%s", tag ? tag : ""); /* the trace keeps 255 bytes of a tag */
}

/* Allocates and logs what the trace must say. */
static void *alloc_logged(oplog *l, vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s, vmm_status want) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc(a, bytes, kind, s, &p);
  if (st != want) fprintf(stderr, "alloc %zu: %s: %s\n", bytes, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, want);
  size_t g = vmm_arena_granularity(a);
  uint64_t rounded = bytes && (unsigned)kind < VMM_KIND_COUNT ? (bytes + g - 1) / g * g : 0;
  int traced_kind = (unsigned)kind < VMM_KIND_COUNT ? (int)kind : -1;
  expect(l, VMM_TRACE_ALLOC, traced_kind, bytes, rounded, p, s, vmm_tag_current(), st);
  return p;
}

/* Frees and logs: the record carries the allocation's tag and extent, not the current tag. */
static void free_logged(oplog *l, vmm_arena *a, void *p, int kind, uint64_t extent, const char *tag, CUstream s,
                        vmm_status want) {
  assert_int_equal(vmm_arena_free(a, p, s), want);
  expect(l, VMM_TRACE_FREE, kind, 0, extent, p, s, tag, want);
}

static void scope_logged(oplog *l, vmm_arena *a, vmm_trace_op op, vmm_status want) {
  vmm_status st = op == VMM_TRACE_BEGIN ? vmm_retention_begin(a) : op == VMM_TRACE_FINISH ? vmm_retention_finish(a)
                                                                                         : vmm_retention_abort(a);
  assert_int_equal(st, want);
  expect(l, op, -1, 0, 0, NULL, NULL, NULL, want);
}

/* Parses every line of the trace file and compares the records with the oplog, in order. All
 * times lie within `elapsed` and never go back. */
static void assert_trace_matches(const char *path, const oplog *l, uint64_t elapsed) {
  size_t len;
  char *text = read_file(path, &len);
  assert_true(len > 11);
  assert_memory_equal(text, "vmmtrace 2\n", 11);
  size_t records = 0, line_no = 0;
  uint64_t last_t = 0;
  for (char *p = text, *end = text + len; p < end; line_no++) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    assert_non_null(nl); /* every line is complete once the trace is closed */
    vmm_trace_record rec;
    const char *why = NULL;
    int rc = vmm_trace_parse_line(p, (size_t)(nl - p), &rec, &why);
    if (rc < 0) fprintf(stderr, "line %zu: %s: %.*s\n", line_no + 1, why, (int)(nl - p), p);
    assert_int_equal(rc, line_no == 0 ? 0 : 1);
    if (rc == 1) {
      assert_true(records < l->count);
      const expected *e = &l->items[records++];
      if (rec.op != e->op || rec.result != (int)e->result || strcmp(rec.tag, e->tag))
        fprintf(stderr, "line %zu: %.*s\n  expected op %d result %s tag \"%s\"\n", line_no + 1, (int)(nl - p), p,
                (int)e->op, vmm_status_name(e->result), e->tag);
      assert_int_equal(rec.op, e->op);
      assert_int_equal(rec.kind, e->kind);
      assert_int_equal(rec.requested, e->requested);
      assert_int_equal(rec.rounded, e->rounded);
      assert_int_equal(rec.ptr, e->ptr);
      assert_int_equal(rec.stream, e->stream);
      assert_string_equal(rec.tag, e->tag);
      assert_int_equal(rec.result, e->result);
      assert_int_equal(rec.pool, e->pool);
      assert_true(rec.t_ns >= last_t);
      assert_true(rec.t_ns <= elapsed);
      last_t = rec.t_ns;
    }
    p = nl + 1;
  }
  assert_int_equal(records, l->count);
  free(text);
}

/* ---- Round trip ------------------------------------------------------------------------------ */

static void round_trip(void **state) {
  (void)state;
  char *dir = make_dir();
  char *path = path_in(dir, "ops.trace");
  vmm_config cfg = tu_config();
  cfg.trace_path = path;
  cfg.limit_bytes = 64 * MiB;
  uint64_t t0 = now_ns();
  vmm_arena *a = tu_arena(NULL, &cfg);
  static oplog l; /* 64 records: keep it off the stack */
  l.count = 0;
  expect(&l, VMM_TRACE_SET_LIMIT, -1, 64 * MiB, 0, NULL, NULL, NULL, VMM_OK); /* the limit in force at the start */

  vmm_tag_push("weights and biases");
  void *p1 = alloc_logged(&l, a, 3 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK);
  vmm_tag_push("100% done");
  void *p2 = alloc_logged(&l, a, 1, VMM_KIND_TRANSIENT, S2, VMM_OK);
  vmm_tag_pop();
  vmm_tag_push("na\xc3\xafve \xe2\x82\xac\xf0\x9f\x98\x80");
  void *p3 = alloc_logged(&l, a, 5 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK);
  vmm_tag_pop();
  vmm_tag_pop();
  vmm_tag_push("-"); /* a tag spelled like "no tag" */
  void *p4 = alloc_logged(&l, a, 2 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK);
  vmm_tag_pop();
  vmm_tag_push("ctl\t\x01\x7f\xff%20");
  void *p5 = alloc_logged(&l, a, 2 * MiB, VMM_KIND_PACKAGE, S1, VMM_OK);
  vmm_tag_pop();
  char long_tag[300];
  memset(long_tag, 'L', sizeof long_tag - 1);
  long_tag[sizeof long_tag - 1] = '\0';
  vmm_tag_push(long_tag);
  void *p6 = alloc_logged(&l, a, 2 * MiB, VMM_KIND_PACKAGE, S2, VMM_OK);
  vmm_tag_pop();

  scope_logged(&l, a, VMM_TRACE_BEGIN, VMM_OK);
  scope_logged(&l, a, VMM_TRACE_BEGIN, VMM_ERR_SCOPE_STATE); /* no nesting */
  vmm_tag_push("step 1");
  void *t1 = alloc_logged(&l, a, 4 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK);
  free_logged(&l, a, t1, VMM_KIND_TRANSIENT, 4 * MiB, "step 1", S1, VMM_OK);
  void *t2 = alloc_logged(&l, a, 4 * MiB - 100, VMM_KIND_TRANSIENT, S1, VMM_OK);
  assert_ptr_equal(t2, t1); /* a pool hit is traced like any allocation */
  vmm_tag_pop();
  /* Failed operations. */
  alloc_logged(&l, a, 0, VMM_KIND_TRANSIENT, S1, VMM_ERR_INVALID_ARGUMENT);
  alloc_logged(&l, a, 2 * MiB, (vmm_kind)7, S1, VMM_ERR_INVALID_ARGUMENT);
  free_logged(&l, a, (void *)(uintptr_t)0x1234000, -1, 0, NULL, S1, VMM_ERR_UNKNOWN_POINTER);
  free_logged(&l, a, (char *)p1 + 4096, -1, 0, NULL, S1, VMM_ERR_UNKNOWN_POINTER); /* interior */
  free_logged(&l, a, t2, VMM_KIND_TRANSIENT, 4 * MiB, "step 1", S1, VMM_OK);
  free_logged(&l, a, t2, -1, 0, NULL, S1, VMM_ERR_UNKNOWN_POINTER); /* idle in the pool: freed twice */
  scope_logged(&l, a, VMM_TRACE_FINISH, VMM_OK);
  scope_logged(&l, a, VMM_TRACE_ABORT, VMM_ERR_SCOPE_STATE);
  alloc_logged(&l, a, 100 * MiB, VMM_KIND_PACKAGE, S1, VMM_ERR_OUT_OF_MEMORY); /* over the limit */

  /* Frees carry the allocation's tag whatever tag is current. */
  vmm_tag_push("current, not traced");
  free_logged(&l, a, p1, VMM_KIND_PACKAGE, 4 * MiB, "weights and biases", S1, VMM_OK);
  free_logged(&l, a, p2, VMM_KIND_TRANSIENT, 2 * MiB, "100% done", S2, VMM_OK);
  free_logged(&l, a, p3, VMM_KIND_TRANSIENT, 6 * MiB, "na\xc3\xafve \xe2\x82\xac\xf0\x9f\x98\x80", S1, VMM_OK);
  free_logged(&l, a, p4, VMM_KIND_PACKAGE, 2 * MiB, "-", S1, VMM_OK);
  free_logged(&l, a, p5, VMM_KIND_PACKAGE, 2 * MiB, "ctl\t\x01\x7f\xff%20", S1, VMM_OK);
  vmm_tag_pop();

  /* Off: the file is complete and later operations are not in it. */
  assert_int_equal(vmm_arena_trace(a, NULL), VMM_OK);
  uint64_t elapsed = now_ns() - t0;
  assert_int_equal(vmm_arena_free(a, p6, S2), VMM_OK);
  assert_trace_matches(path, &l, elapsed);

  /* The writer escaped what needed it: spaces, '%', control and non-ASCII bytes, the "-" tag. */
  char *text = read_text(path);
  assert_non_null(strstr(text, " weights%20and%20biases "));
  assert_non_null(strstr(text, " 100%25%20done "));
  assert_non_null(strstr(text, " na%C3%AFve%20%E2%82%AC%F0%9F%98%80 "));
  assert_non_null(strstr(text, " %2D "));
  assert_non_null(strstr(text, " ctl%09%01%7F%FF%2520 "));
  assert_null(strstr(text, "current"));
  free(text);
  tu_destroy(a);
  remove_dir(dir, &path, 1);
}

/* vmm_arena_set_limit, logged with the limit as its requested bytes. */
static void limit_logged(oplog *l, vmm_arena *a, size_t bytes) {
  assert_int_equal(vmm_arena_set_limit(a, bytes), VMM_OK);
  expect(l, VMM_TRACE_SET_LIMIT, -1, bytes, 0, NULL, NULL, NULL, VMM_OK);
}

/* vmm_arena_trace starts, switches and stops the trace of a running arena; a trace begins with
 * the limit in force, if there is one. */
static void trace_on_and_off(void **state) {
  (void)state;
  char *dir = make_dir();
  char *files[2] = {path_in(dir, "first.trace"), path_in(dir, "second.trace")};
  vmm_arena *a = tu_arena(NULL, NULL);
  void *before = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1); /* not traced */
  static oplog first, second;
  first.count = second.count = 0;
  uint64_t t0 = now_ns();
  assert_int_equal(vmm_arena_trace(a, files[0]), VMM_OK); /* no limit: nothing written before the first op */
  void *p = alloc_logged(&first, a, 6 * MiB, VMM_KIND_TRANSIENT, S1, VMM_OK);
  limit_logged(&first, a, 32 * MiB);
  assert_int_equal(vmm_arena_trace(a, files[1]), VMM_OK); /* closes the first */
  expect(&second, VMM_TRACE_SET_LIMIT, -1, 32 * MiB, 0, NULL, NULL, NULL, VMM_OK);
  alloc_logged(&second, a, 26 * MiB, VMM_KIND_TRANSIENT, S1, VMM_ERR_OUT_OF_MEMORY); /* 8 MiB held */
  free_logged(&second, a, p, VMM_KIND_TRANSIENT, 6 * MiB, NULL, S1, VMM_OK);
  free_logged(&second, a, before, VMM_KIND_PACKAGE, 2 * MiB, NULL, S1, VMM_OK);
  limit_logged(&second, a, 0);
  assert_int_equal(vmm_arena_trace(a, NULL), VMM_OK);
  assert_int_equal(vmm_arena_trace(a, NULL), VMM_OK); /* already off */
  uint64_t elapsed = now_ns() - t0;
  assert_trace_matches(files[0], &first, elapsed);
  assert_trace_matches(files[1], &second, elapsed);

  /* A path that cannot be opened: a clear error, and the trace is off. */
  char *bad = path_in(dir, "missing/dir/x.trace");
  assert_int_equal(vmm_arena_trace(a, bad), VMM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(vmm_arena_last_error(a), bad));
  assert_non_null(strstr(vmm_arena_last_error(a), "cannot open for writing: No such file or directory"));
  free(bad);
  assert_int_equal(vmm_arena_trace(NULL, files[0]), VMM_ERR_INVALID_ARGUMENT);
  tu_destroy(a);
  remove_dir(dir, files, 2);
}

/* ---- Whole-process mode ---------------------------------------------------------------------- */

/* An allocation into pool (above half the granularity: a whole mapping), logged. */
static void *alloc_in_logged(oplog *l, vmm_arena *a, size_t bytes, CUstream s, vmm_pool_id pool, vmm_status want) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc_in(a, bytes, VMM_KIND_TRANSIENT, s, pool, &p);
  if (st != want) fprintf(stderr, "alloc_in %zu: %s: %s\n", bytes, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, want);
  size_t g = vmm_arena_granularity(a);
  uint64_t rounded = st == VMM_ERR_INVALID_ARGUMENT ? 0 : (bytes + g - 1) / g * g; /* refused before rounding */
  expect(l, VMM_TRACE_ALLOC, VMM_KIND_TRANSIENT, bytes, rounded, p, s, NULL, st);
  l->items[l->count - 1].pool = pool;
  return p;
}

/* capture-begin, capture-end or release-pool of pool, logged. */
static void pool_logged(oplog *l, vmm_arena *a, vmm_trace_op op, vmm_pool_id pool, vmm_status want) {
  vmm_status st = op == VMM_TRACE_CAPTURE_BEGIN ? vmm_arena_capture_begin(a, pool)
                  : op == VMM_TRACE_CAPTURE_END ? vmm_arena_capture_end(a, pool)
                                                : vmm_arena_release_pool(a, pool);
  assert_int_equal(st, want);
  expect(l, op, -1, 0, 0, NULL, NULL, NULL, st);
  l->items[l->count - 1].pool = pool;
}

static void record_stream_logged(oplog *l, vmm_arena *a, void *p, CUstream s, vmm_status want) {
  assert_int_equal(vmm_arena_record_stream(a, p, s), want);
  expect(l, VMM_TRACE_RECORD_STREAM, -1, 0, 0, p, s, NULL, want);
}

/* empty-cache, logged with the bytes it released (the snapshot's physical bytes before less
 * after). */
static void empty_cache_logged(oplog *l, vmm_arena *a, uint64_t want_released) {
  uint64_t before = tu_snapshot(a).physical_bytes;
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(before - tu_snapshot(a).physical_bytes, want_released);
  expect(l, VMM_TRACE_EMPTY_CACHE, -1, 0, want_released, NULL, NULL, NULL, VMM_OK);
}

/* A caching arena traces its pools, captures, record_stream and empty_cache with their
 * results: refused calls too. */
static void whole_process_calls(void **state) {
  (void)state;
  char *dir = make_dir();
  char *path = path_in(dir, "process.trace");
  fake_driver_reset(NULL);
  vmm_config cfg = tu_config();
  cfg.trace_path = path;
  cfg.caching = 1;
  uint64_t t0 = now_ns();
  vmm_arena *a = tu_arena(NULL, &cfg);
  static oplog l;
  l.count = 0;
  void *x = alloc_in_logged(&l, a, 4 * MiB, S1, VMM_POOL_SHARED, VMM_OK);
  pool_logged(&l, a, VMM_TRACE_CAPTURE_BEGIN, 7, VMM_OK);
  void *g = alloc_in_logged(&l, a, 6 * MiB - 5, S2, 7, VMM_OK);
  record_stream_logged(&l, a, g, S1, VMM_OK);
  record_stream_logged(&l, a, g, S1, VMM_OK); /* already added: a no-op, traced all the same */
  pool_logged(&l, a, VMM_TRACE_CAPTURE_END, 7, VMM_OK);
  free_logged(&l, a, g, VMM_KIND_TRANSIENT, 6 * MiB, NULL, S2, VMM_OK);
  pool_logged(&l, a, VMM_TRACE_RELEASE_POOL, 7, VMM_OK);
  alloc_in_logged(&l, a, 2 * MiB, S1, 7, VMM_ERR_INVALID_ARGUMENT); /* a released pool */
  free_logged(&l, a, x, VMM_KIND_TRANSIENT, 4 * MiB, NULL, S1, VMM_OK);
  empty_cache_logged(&l, a, 10 * MiB); /* x and g, both cached */
  empty_cache_logged(&l, a, 0);
  /* Refused calls. */
  pool_logged(&l, a, VMM_TRACE_CAPTURE_BEGIN, VMM_POOL_SHARED, VMM_ERR_INVALID_ARGUMENT);
  pool_logged(&l, a, VMM_TRACE_CAPTURE_BEGIN, 7, VMM_ERR_INVALID_ARGUMENT); /* released */
  pool_logged(&l, a, VMM_TRACE_CAPTURE_END, 3, VMM_ERR_INVALID_ARGUMENT);   /* no capture underway */
  pool_logged(&l, a, VMM_TRACE_RELEASE_POOL, VMM_POOL_SHARED, VMM_ERR_INVALID_ARGUMENT);
  record_stream_logged(&l, a, (void *)(uintptr_t)0x1234000, S1, VMM_ERR_UNKNOWN_POINTER);
  record_stream_logged(&l, a, g, S1, VMM_ERR_UNKNOWN_POINTER); /* freed */
  tu_destroy(a);
  assert_trace_matches(path, &l, now_ns() - t0);

  char *text = read_text(path);
  assert_non_null(strstr(text, " capture-begin - 0 0 0x0 0x0 - VMM_OK 7\n"));
  assert_non_null(strstr(text, " release-pool - 0 0 0x0 0x0 - VMM_OK 7\n"));
  assert_non_null(strstr(text, " empty-cache - 0 10485760 0x0 0x0 - VMM_OK 0\n"));
  assert_non_null(strstr(text, " record-stream - 0 0 0x1234000 0x5001 - VMM_ERR_UNKNOWN_POINTER 0\n"));
  assert_non_null(strstr(text, " alloc transient 2097152 0 0x0 0x5001 - VMM_ERR_INVALID_ARGUMENT 7\n"));
  free(text);
  remove_dir(dir, &path, 1);
}

/* ---- The line parser ------------------------------------------------------------------------ */

/* Parses a copy of line, as a line of a version `version` trace, in a buffer of exactly its
 * length, so ASan sees any read past it. */
static int parse_exact_version(const char *line, int version, vmm_trace_record *rec, const char **why) {
  size_t n = strlen(line);
  char *copy = malloc(n ? n : 1);
  assert_non_null(copy);
  memcpy(copy, line, n);
  int rc = vmm_trace_parse_line_version(copy, n, version, rec, why);
  free(copy);
  return rc;
}

static int parse_exact(const char *line, vmm_trace_record *rec, const char **why) {
  return parse_exact_version(line, VMM_TRACE_VERSION, rec, why);
}

static void parser_accepts(void **state) {
  (void)state;
  vmm_trace_record r;
  const char *why = NULL;
  assert_int_equal(parse_exact("vmmtrace 2", &r, &why), 0);
  assert_int_equal(parse_exact("vmmtrace 1\r\n", &r, &why), 0); /* either header, in either version */
  assert_int_equal(parse_exact_version("vmmtrace 2", 1, &r, &why), 0);
  assert_int_equal(parse_exact("# a comment", &r, &why), 0);
  assert_int_equal(parse_exact("", &r, &why), 0);
  assert_int_equal(parse_exact("\r\n", &r, &why), 0);
  assert_int_equal(parse_exact("#\t", &r, &why), -1); /* a comment is printable ASCII too */
  assert_int_equal(parse_exact("12 alloc package 4096 2097152 0x7F0000000000 0x5001 a%20b%25 VMM_OK 3\r\n", &r, &why), 1);
  assert_int_equal(r.t_ns, 12);
  assert_int_equal(r.op, VMM_TRACE_ALLOC);
  assert_int_equal(r.kind, VMM_KIND_PACKAGE);
  assert_int_equal(r.requested, 4096);
  assert_int_equal(r.rounded, 2097152);
  assert_int_equal(r.ptr, 0x7f0000000000ull);
  assert_int_equal(r.stream, 0x5001);
  assert_string_equal(r.tag, "a b%");
  assert_int_equal(r.result, VMM_OK);
  assert_int_equal(r.pool, 3);
  assert_int_equal(parse_exact("0 free - 0 0 0x0 0x0 - VMM_ERR_UNKNOWN_POINTER 0", &r, &why), 1); /* failed: no kind */
  assert_int_equal(r.kind, -1);
  assert_string_equal(r.tag, "");
  assert_int_equal(parse_exact("18446744073709551615 abort - 0 0 0x0 0x0 - VMM_ERR_SCOPE_STATE 0", &r, &why), 1);
  assert_int_equal(r.t_ns, UINT64_MAX);
  assert_int_equal(r.op, VMM_TRACE_ABORT);
  assert_int_equal(parse_exact("5 begin - 0 0 0x0 0x0 %2D VMM_OK 0", &r, &why), 1);
  assert_string_equal(r.tag, "-");
  /* Version 1: nine fields, pool 0. */
  memset(&r, 0xff, sizeof r);
  assert_int_equal(parse_exact_version("12 alloc package 4096 2097152 0x7f0000000000 0x5001 w VMM_OK", 1, &r, &why), 1);
  assert_int_equal(r.op, VMM_TRACE_ALLOC);
  assert_string_equal(r.tag, "w");
  assert_int_equal(r.result, VMM_OK);
  assert_int_equal(r.pool, 0);
  assert_int_equal(parse_exact_version("7 resume - 0 4194304 0x0 0x0 kv VMM_OK", 1, &r, &why), 1);
  assert_int_equal(r.op, VMM_TRACE_RESUME);
  /* The calls of whole-process mode (version 2). */
  static const struct {
    const char *line;
    vmm_trace_op op;
    uint64_t rounded, ptr, stream, pool;
    vmm_status result;
  } process[] = {
      {"20 capture-begin - 0 0 0x0 0x0 - VMM_OK 7", VMM_TRACE_CAPTURE_BEGIN, 0, 0, 0, 7, VMM_OK},
      {"21 capture-end - 0 0 0x0 0x0 - VMM_OK 7", VMM_TRACE_CAPTURE_END, 0, 0, 0, 7, VMM_OK},
      {"22 release-pool - 0 0 0x0 0x0 - VMM_OK 18446744073709551615", VMM_TRACE_RELEASE_POOL, 0, 0, 0, UINT64_MAX,
       VMM_OK},
      {"23 empty-cache - 0 10485760 0x0 0x0 - VMM_OK 0", VMM_TRACE_EMPTY_CACHE, 10485760, 0, 0, 0, VMM_OK},
      {"24 record-stream - 0 0 0x7f0000200000 0x5002 - VMM_OK 0", VMM_TRACE_RECORD_STREAM, 0, 0x7f0000200000ull, 0x5002,
       0, VMM_OK},
      {"25 capture-begin - 0 0 0x0 0x0 - VMM_ERR_INVALID_ARGUMENT 0", VMM_TRACE_CAPTURE_BEGIN, 0, 0, 0, 0,
       VMM_ERR_INVALID_ARGUMENT},
      {"26 empty-cache - 0 0 0x0 0x0 - VMM_ERR_DRIVER 0", VMM_TRACE_EMPTY_CACHE, 0, 0, 0, 0, VMM_ERR_DRIVER},
      {"27 set-limit - 1073741824 0 0x0 0x0 - VMM_OK 0", VMM_TRACE_SET_LIMIT, 0, 0, 0, 0, VMM_OK},
  };
  for (size_t i = 0; i < sizeof process / sizeof process[0]; i++) {
    assert_int_equal(parse_exact(process[i].line, &r, &why), 1);
    assert_int_equal(r.op, process[i].op);
    assert_int_equal(r.kind, -1);
    assert_int_equal(r.rounded, process[i].rounded);
    assert_int_equal(r.ptr, process[i].ptr);
    assert_int_equal(r.stream, process[i].stream);
    assert_int_equal(r.pool, process[i].pool);
    assert_int_equal(r.result, process[i].result);
    char line[256];
    assert_int_equal(vmm_trace_format(&r, line, sizeof line), strlen(process[i].line) + 1);
    assert_memory_equal(line, process[i].line, strlen(process[i].line)); /* and back, byte for byte */
  }
  assert_int_equal(parse_exact("28 set-limit - 1073741824 0 0x0 0x0 - VMM_OK 0", &r, &why), 1);
  assert_int_equal(r.requested, 1073741824); /* the limit */
  assert_string_equal(vmm_trace_op_name(r.op), "set-limit");
  assert_string_equal(vmm_trace_op_name((vmm_trace_op)VMM_TRACE_OP_COUNT), "?");
}

/* A line of more than 255 tag bytes; filled in by parser_rejects. */
static char too_long[320];

#define ALL_OPS                                                                                                 \
  "(alloc, free, begin, finish, abort, pause-discard, pause-backup, resume, capture-begin, capture-end, "       \
  "release-pool, empty-cache, record-stream, set-limit)"
#define V2_FIELDS "(time, operation, kind, requested, rounded, pointer, stream, tag, result, pool)"
#define V1_FIELDS "(time, operation, kind, requested, rounded, pointer, stream, tag, result)"

/* Malformed lines (version 2 unless said) and the start of the message for each. */
static const struct {
  const char *line, *why;
  int version; /* 0: the current one */
} bad_lines[] = {
    {"vmmtrace 3", "unsupported header \"vmmtrace 3\" (this reader reads \"vmmtrace 1\" and \"vmmtrace 2\")", 0},
    {"vmmtrace", "unsupported header \"vmmtrace\"", 0},
    {"vmmtrace 1 extra", "unsupported header \"vmmtrace 1 extra\"", 0},
    {"vmmtrace 10", "unsupported header \"vmmtrace 10\"", 0},
    {"vmmtrace 0", "unsupported header \"vmmtrace 0\"", 1},
    {"x1 alloc package 1 2 0x1 0x2 t VMM_OK 0", "time \"x1\" is not a decimal number below 2^64", 0},
    {"-1 alloc package 1 2 0x1 0x2 t VMM_OK 0", "time \"-1\"", 0},
    {"18446744073709551616 alloc package 1 2 0x1 0x2 t VMM_OK 0", "time \"18446744073709551616\"", 0},
    {"1 allot package 1 2 0x1 0x2 t VMM_OK 0", "unknown operation \"allot\" " ALL_OPS, 0},
    {"1 allot package 1 2 0x1 0x2 t VMM_OK",
     "unknown operation \"allot\" (alloc, free, begin, finish, abort, pause-discard, pause-backup, resume)", 1},
    {"1 capture-begin - 0 0 0x0 0x0 - VMM_OK",
     "operation \"capture-begin\" is not in version 1 (\"vmmtrace 1\"); it came with \"vmmtrace 2\"", 1},
    {"1 record-stream - 0 0 0x1 0x2 - VMM_OK", "operation \"record-stream\" is not in version 1", 1},
    {"1 Empty-cache - 0 0 0x0 0x0 - VMM_OK 0", "unknown operation \"Empty-cache\"", 0},
    {"1", "1 fields, expected 10 " V2_FIELDS, 0},
    {"1", "1 fields, expected 9 " V1_FIELDS, 1},
    {"1 alloc pkg 1 2 0x1 0x2 t VMM_OK 0", "unknown kind \"pkg\" (package, transient, -)", 0},
    {"1 alloc", "2 fields, expected 10", 0},
    {"1 alloc package 4k 2 0x1 0x2 t VMM_OK 0", "requested bytes \"4k\" is not a decimal number", 0},
    {"1 alloc package 1 -2 0x1 0x2 t VMM_OK 0", "rounded bytes \"-2\"", 0},
    {"1 alloc package 1 2 7f00 0x2 t VMM_OK 0", "pointer \"7f00\" is not 0x and hex digits below 2^64", 0},
    {"1 alloc package 1 2 0x 0x2 t VMM_OK 0", "pointer \"0x\"", 0},
    {"1 alloc package 1 2 0X1 0x2 t VMM_OK 0", "pointer \"0X1\"", 0},
    {"1 alloc package 1 2 0xZZ 0x2 t VMM_OK 0", "pointer \"0xZZ\"", 0},
    {"1 alloc package 1 2 0x10000000000000000 0x2 t VMM_OK 0", "pointer \"0x10000000000000000\"", 0},
    {"1 alloc package 1 2 0x1 5001 t VMM_OK 0", "stream \"5001\"", 0},
    {"1 alloc package 1 2 0x1 0x2 t", "8 fields, expected 10", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_FINE 0", "unknown result \"VMM_FINE\" (a status name: VMM_OK, VMM_ERR_...)", 0},
    /* The field count of the other version, each way. */
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK", "9 fields, expected 10 " V2_FIELDS
     ": a version 2 trace (\"vmmtrace 2\") ends every line with a pool", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK 0", "10 fields, expected 9 " V1_FIELDS
     ": a version 1 trace (\"vmmtrace 1\") has no pool field", 1},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK 0 extra", "11 fields, expected 10 " V2_FIELDS, 0},
    /* The pool. */
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK x7", "pool \"x7\" is not a decimal number below 2^64", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK -1", "pool \"-1\"", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK 0x7", "pool \"0x7\"", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK 18446744073709551616", "pool \"18446744073709551616\"", 0},
    {"1 capture-end - 0 0 0x0 0x0 - VMM_OK -", "pool \"-\"", 0},
    {"1 free package 0 2 0x1 0x2 t VMM_OK 7", "free takes no pool (0), found \"7\"", 0},
    {"1 empty-cache - 0 0 0x0 0x0 - VMM_OK 1", "empty-cache takes no pool (0), found \"1\"", 0},
    {"1 record-stream - 0 0 0x1 0x2 - VMM_OK 3", "record-stream takes no pool", 0},
    {"1 begin - 0 0 0x0 0x0 - VMM_OK 3", "begin takes no pool", 0},
    {"1 capture-begin package 0 0 0x0 0x0 - VMM_OK 3", "capture-begin takes no kind (\"-\"), found \"package\"", 0},
    {"1 record-stream transient 0 0 0x1 0x2 - VMM_OK 0", "record-stream takes no kind", 0},
    {"1 set-limit - 1 0 0x0 0x0 - VMM_OK 2", "set-limit takes no pool (0), found \"2\"", 0},
    {"1 set-limit package 1 0 0x0 0x0 - VMM_OK 0", "set-limit takes no kind", 0},
    {"1 set-limit - 1 0 0x0 0x0 - VMM_OK", "operation \"set-limit\" is not in version 1", 1},
    {"1 alloc package 1 2 0x1 0x2 ab%4 VMM_OK 0", "tag \"ab%4\": truncated %XX escape", 0},
    {"1 alloc package 1 2 0x1 0x2 ab% VMM_OK 0", "tag \"ab%\": truncated %XX escape", 0},
    {"1 alloc package 1 2 0x1 0x2 %zz VMM_OK 0", "tag \"%zz\": bad %XX escape \"%zz\"", 0},
    {"1 alloc package 1 2 0x1 0x2 a%00b VMM_OK 0", "tag \"a%00b\": %00 (a NUL byte) cannot be in a tag", 0},
    {"1 alloc package 1 2 0x1 0x2 a\tb VMM_OK 0", "byte \\x09 at column 30 is not printable ASCII", 0},
    {"1 alloc package 1 2 0x1 0x2 caf\xc3\xa9 VMM_OK 0", "byte \\xc3 at column 32 is not printable ASCII", 0},
    {"1 alloc package 1 2 0x1 0x2 t\r VMM_OK 0", "byte \\x0d at column 30", 0},
    {"# \x1b[31m", "byte \\x1b at column 3", 0},
    {too_long, "tag \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\": longer than 255 bytes", 0},
    {"1 alloc - 1 2 0x1 0x2 t VMM_OK 0", "a successful alloc needs a kind (package or transient), found \"-\"", 0},
    {"1 free - 0 2 0x1 0x2 t VMM_OK 0", "a successful free needs a kind", 0},
    {"1 begin package 0 0 0x0 0x0 - VMM_OK 0", "begin takes no kind (\"-\"), found \"package\"", 0},
    {"1 resume transient 0 0 0x0 0x0 t VMM_OK 0", "resume takes no kind", 0},
    {"1 alloc  package 1 2 0x1 0x2 t VMM_OK 0", "two spaces at column 8 (fields are separated by one space)", 0},
    {" 1 alloc package 1 2 0x1 0x2 t VMM_OK 0", "the line begins with a space", 0},
    {"   ", "the line begins with a space", 0},
    {"1 alloc package 1 2 0x1 0x2 t VMM_OK 0 ", "the line ends with a space", 0},
    {"1 begin - 0 0 0x0 0x0 - VMM_OK", "version 3: this parser reads versions 1 and 2", 3},
};

static void parser_rejects(void **state) {
  (void)state;
  char long_tag[257];
  memset(long_tag, 'x', 256);
  long_tag[256] = '\0';
  snprintf(too_long, sizeof too_long, "1 alloc package 1 2 0x1 0x2 %s VMM_OK 0", long_tag);
  const size_t count = sizeof bad_lines / sizeof bad_lines[0];
  for (size_t i = 0; i < count; i++) {
    const char *line = bad_lines[i].line, *want = bad_lines[i].why;
    int version = bad_lines[i].version ? bad_lines[i].version : VMM_TRACE_VERSION;
    vmm_trace_record r;
    const char *why = NULL;
    int rc = parse_exact_version(line, version, &r, &why);
    if (rc != -1 || !why || strncmp(why, want, strlen(want)))
      fprintf(stderr, "\"%s\": rc %d, why \"%s\", expected \"%s\"\n", line, rc, why ? why : "(null)", want);
    assert_int_equal(rc, -1);
    assert_non_null(why);
    assert_memory_equal(why, want, strlen(want)); /* the message starts with this */
    for (const char *c = why; *c; c++) assert_true(*c >= 0x20 && *c <= 0x7e);
    assert_int_equal(parse_exact_version(line, version, &r, NULL), -1); /* why is optional */
  }
  /* A NUL byte is a byte like any other: the parser reads len bytes, not a C string. */
  vmm_trace_record r;
  const char *why = NULL;
  assert_int_equal(vmm_trace_parse_line("1 begin - 0 0 0x0 0x0 -\0VMM_OK 0", 32, &r, &why), -1);
  assert_string_equal(why, "byte \\x00 at column 24 is not printable ASCII");
  /* A good line leaves why as it was. */
  const char *kept = "unchanged";
  assert_int_equal(parse_exact("1 begin - 0 0 0x0 0x0 - VMM_OK 0", &r, &kept), 1);
  assert_string_equal(kept, "unchanged");
}

/* Every byte a tag can hold survives format and parse. */
static void format_round_trip(void **state) {
  (void)state;
  vmm_trace_record r = {.t_ns = 99, .op = VMM_TRACE_FREE, .kind = VMM_KIND_TRANSIENT, .requested = 0,
                        .rounded = 4 * MiB, .ptr = 0x7f0000200000ull, .stream = 0x5003, .result = VMM_OK};
  for (int c = 1; c < 256; c++) r.tag[c - 1] = (char)c;
  r.tag[255] = '\0';
  size_t need = vmm_trace_format(&r, NULL, 0);
  char *line = malloc(need + 1);
  assert_non_null(line);
  assert_int_equal(vmm_trace_format(&r, line, need + 1), need);
  assert_int_equal(line[need - 1], '\n');
  assert_int_equal(strlen(line), need);
  char small[16];
  assert_int_equal(vmm_trace_format(&r, small, sizeof small), need); /* like snprintf */
  vmm_trace_record back;
  const char *why = NULL;
  assert_int_equal(vmm_trace_parse_line(line, need, &back, &why), 1);
  assert_memory_equal(&back.tag, &r.tag, 256);
  assert_int_equal(back.t_ns, 99);
  assert_int_equal(back.rounded, 4 * MiB);
  assert_int_equal(back.ptr, r.ptr);
  free(line);
}

/* ---- The file reader ----------------------------------------------------------------------- */

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static size_t open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  size_t n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

/* Opens path, expecting a refusal whose message is exactly "PATH: want" (want names the line). */
static void assert_refused(const char *path, const char *want, vmm_status status) {
  char msg[512], want_msg[512];
  snprintf(want_msg, sizeof want_msg, "%s: %s", path, want);
  vmm_trace_reader *r = (vmm_trace_reader *)0x1;
  assert_int_equal(vmm_trace_reader_open(path, &r, msg, sizeof msg), status);
  assert_null(r);
  if (strcmp(msg, want_msg)) fprintf(stderr, "got      %s\nexpected %s\n", msg, want_msg);
  assert_string_equal(msg, want_msg);
}

#define GOOD_TRACE                                                                                        \
  "vmmtrace 1\n"                                                                                          \
  "# recorded by hand\n"                                                                                  \
  "10 alloc package 4096 2097152 0x7f0000000000 0x5001 a%20b VMM_OK\n"                                    \
  "\n"                                                                                                    \
  "20 alloc transient 1 2097152 0x0 0x5001 - VMM_ERR_OUT_OF_MEMORY\r\n"                                    \
  "30 free package 0 2097152 0x7f0000000000 0x5001 a%20b VMM_OK" /* the last line may lack its '\n' */

/* A plain file: every record in order with its line number; comments and empty lines skipped. */
static void reader_reads_records(void **state) {
  (void)state;
  char *dir = make_dir();
  char *path = path_in(dir, "good.trace");
  write_bytes(path, GOOD_TRACE, strlen(GOOD_TRACE));
  size_t fds = open_fds();
  char msg[256] = "stale";
  vmm_trace_reader *r = NULL;
  assert_int_equal(vmm_trace_reader_open(path, &r, msg, sizeof msg), VMM_OK);
  assert_string_equal(msg, "");
  assert_int_equal(vmm_trace_reader_records(r), 3);
  assert_string_equal(vmm_trace_reader_name(r), path);
  vmm_trace_record rec;
  size_t line = 0;
  const size_t lines[] = {3, 5, 6};
  const uint64_t times[] = {10, 20, 30};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(vmm_trace_reader_next(r, &rec, &line), 1);
    assert_int_equal(line, lines[i]);
    assert_int_equal(rec.t_ns, times[i]);
  }
  assert_int_equal(rec.op, VMM_TRACE_FREE);
  assert_string_equal(rec.tag, "a b");
  assert_int_equal(vmm_trace_reader_next(r, &rec, NULL), 0);
  assert_int_equal(vmm_trace_reader_next(r, &rec, &line), 0); /* and stays at the end */
  vmm_trace_reader_close(r);
  vmm_trace_reader_close(NULL);
  assert_int_equal(open_fds(), fds);
  remove_dir(dir, &path, 1);
}

#define GOOD_TRACE_V2                                                                                     \
  "vmmtrace 2\n"                                                                                          \
  "10 capture-begin - 0 0 0x0 0x0 - VMM_OK 3\n"                                                           \
  "20 alloc package 4096 2097152 0x7f0000000000 0x5001 a%20b VMM_OK 3\n"                                  \
  "# comments and empty lines as in version 1\n"                                                          \
  "\r\n"                                                                                                  \
  "30 record-stream - 0 0 0x7f0000000000 0x5002 - VMM_OK 0\n"                                             \
  "40 capture-end - 0 0 0x0 0x0 - VMM_OK 3\n"                                                             \
  "50 release-pool - 0 0 0x0 0x0 - VMM_OK 3\n"                                                            \
  "60 empty-cache - 0 0 0x0 0x0 - VMM_OK 0"

/* A version 2 file: the records of whole-process mode with their pools. */
static void reader_reads_version_2(void **state) {
  (void)state;
  char *dir = make_dir();
  char *path = path_in(dir, "good2.trace");
  write_bytes(path, GOOD_TRACE_V2, strlen(GOOD_TRACE_V2));
  char msg[256];
  vmm_trace_reader *r = NULL;
  assert_int_equal(vmm_trace_reader_open(path, &r, msg, sizeof msg), VMM_OK);
  assert_int_equal(vmm_trace_reader_records(r), 6);
  static const struct {
    size_t line;
    vmm_trace_op op;
    uint64_t pool;
  } want[] = {{2, VMM_TRACE_CAPTURE_BEGIN, 3}, {3, VMM_TRACE_ALLOC, 3},       {6, VMM_TRACE_RECORD_STREAM, 0},
              {7, VMM_TRACE_CAPTURE_END, 3},   {8, VMM_TRACE_RELEASE_POOL, 3}, {9, VMM_TRACE_EMPTY_CACHE, 0}};
  vmm_trace_record rec;
  size_t line = 0;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    assert_int_equal(vmm_trace_reader_next(r, &rec, &line), 1);
    assert_int_equal(line, want[i].line);
    assert_int_equal(rec.op, want[i].op);
    assert_int_equal(rec.pool, want[i].pool);
  }
  assert_int_equal(vmm_trace_reader_next(r, &rec, &line), 0);
  vmm_trace_reader_close(r);
  remove_dir(dir, &path, 1);
}

/* gzip data is decompressed; truncated and corrupt data, and no gzip to run, are refused. */
static void reader_gzip(void **state) {
  (void)state;
  char *dir = make_dir();
  char *files[5] = {path_in(dir, "t.trace"), path_in(dir, "t.trace.gz"), path_in(dir, "cut.trace.gz"),
                    path_in(dir, "bad.trace.gz"), path_in(dir, "empty.trace.gz")};
  write_bytes(files[0], GOOD_TRACE, strlen(GOOD_TRACE));
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "gzip -c -n '%s' > '%s' && gzip -c -n < /dev/null > '%s'", files[0], files[1], files[4]);
  assert_int_equal(system(cmd), 0);
  size_t len, fds = open_fds();
  char *gz = read_file(files[1], &len);
  assert_true(len > 20 && (unsigned char)gz[0] == 0x1f && (unsigned char)gz[1] == 0x8b);
  char msg[256];
  vmm_trace_reader *r = NULL;
  assert_int_equal(vmm_trace_reader_open(files[1], &r, msg, sizeof msg), VMM_OK);
  assert_int_equal(vmm_trace_reader_records(r), 3);
  vmm_trace_reader_close(r);

  write_bytes(files[2], gz, len / 2);
  assert_refused(files[2], "truncated gzip data", VMM_ERR_INVALID_ARGUMENT);
  gz[len - 8] ^= 0x5a; /* the CRC of the data */
  write_bytes(files[3], gz, len);
  assert_refused(files[3], "corrupt gzip data", VMM_ERR_INVALID_ARGUMENT);
  assert_refused(files[4], "empty file (a trace begins with the line \"vmmtrace 2\")", VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(open_fds(), fds); /* the pipes to gzip are closed */

  char *saved = strdup(getenv("PATH"));
  assert_non_null(saved);
  assert_int_equal(setenv("PATH", dir, 1), 0); /* no gzip here */
  char msg_no_gzip[512];
  assert_int_equal(vmm_trace_reader_open(files[1], &r, msg_no_gzip, sizeof msg_no_gzip), VMM_ERR_INVALID_ARGUMENT);
  snprintf(msg, sizeof msg, "%s: gzip-compressed, but gzip cannot be run", files[1]);
  assert_memory_equal(msg_no_gzip, msg, strlen(msg)); /* then ": No such file or directory" */
  assert_int_equal(setenv("PATH", saved, 1), 0);
  free(saved);
  free(gz);
  remove_dir(dir, files, 5);
}

/* Each refusal: one message naming the file and the line; the first problem wins. */
static void reader_refuses(void **state) {
  (void)state;
  static const struct {
    const char *text;
    size_t len; /* 0: strlen(text) */
    const char *want;
  } bad[] = {
      {"", 0, "empty file (a trace begins with the line \"vmmtrace 2\")"},
      {"10 begin - 0 0 0x0 0x0 - VMM_OK 0\n", 0,
       "line 1: expected the header \"vmmtrace 2\" (or \"vmmtrace 1\"), found \"10 begin - 0 0 0x0 0x0 - VMM_OK 0\""},
      {"# a comment first\nvmmtrace 1\n", 0,
       "line 1: expected the header \"vmmtrace 2\" (or \"vmmtrace 1\"), found \"# a comment first\""},
      {"\nvmmtrace 1\n", 0, "line 1: expected the header \"vmmtrace 2\" (or \"vmmtrace 1\"), found \"\""},
      {"vmmtrace 3\n", 0,
       "line 1: unsupported header \"vmmtrace 3\" (this reader reads \"vmmtrace 1\" and \"vmmtrace 2\")"},
      {"vmmtrace 1\n10 begin - 0 0 0x0 0x0 - VMM_OK\nvmmtrace 1\n", 0,
       "line 3: a second header (\"vmmtrace 1\" is the first line only)"},
      {"vmmtrace 2\n10 begin - 0 0 0x0 0x0 - VMM_OK 0\nvmmtrace 1\n", 0,
       "line 3: a second header (\"vmmtrace 2\" is the first line only)"},
      /* A line of the other version: the header decides. */
      {"vmmtrace 1\n10 begin - 0 0 0x0 0x0 - VMM_OK\n11 alloc package 1 2097152 0x1000 0x0 - VMM_OK 0\n", 0,
       "line 3: 10 fields, expected 9 (time, operation, kind, requested, rounded, pointer, stream, tag, result): a "
       "version 1 trace (\"vmmtrace 1\") has no pool field"},
      {"vmmtrace 2\n# v1 lines follow\n10 begin - 0 0 0x0 0x0 - VMM_OK\n", 0,
       "line 3: 9 fields, expected 10 (time, operation, kind, requested, rounded, pointer, stream, tag, result, "
       "pool): a version 2 trace (\"vmmtrace 2\") ends every line with a pool"},
      {"vmmtrace 1\n10 empty-cache - 0 0 0x0 0x0 - VMM_OK\n", 0,
       "line 2: operation \"empty-cache\" is not in version 1 (\"vmmtrace 1\"); it came with \"vmmtrace 2\""},
      {"vmmtrace 2\n1 allc package 1 2097152 0x1000 0x0 a VMM_OK 0\n", 0,
       "line 2: unknown operation \"allc\" (alloc, free, begin, finish, abort, pause-discard, pause-backup, resume, "
       "capture-begin, capture-end, release-pool, empty-cache, record-stream, set-limit)"},
      {"vmmtrace 2\n1 capture-begin - 0 0 0x0 0x0 - VMM_OK 0x7\n", 0, "line 2: pool \"0x7\" is not a decimal number below 2^64"},
      {"vmmtrace 1\n1 alloc package 1 2097152 0x1000 0x0 a%00b VMM_OK\n", 0,
       "line 2: tag \"a%00b\": %00 (a NUL byte) cannot be in a tag"},
      {"vmmtrace 1\n1 alloc package 1 2097152 0x1000 0x0 a  VMM_OK\n", 0,
       "line 2: two spaces at column 39 (fields are separated by one space)"},
      {"vmmtrace 1\n\n\n1 allc package 1 2097152 0x1000 0x0 a VMM_OK\n1 allc\n", 0,
       "line 4: unknown operation \"allc\" (alloc, free, begin, finish, abort, pause-discard, pause-backup, resume)"},
      {"\x7f" "ELF\x02\x01\x01\0\0\0\n", 11, "line 1: byte \\x7f at column 1 is not printable ASCII"},
      {"vmmtrace 1\n1 begin - 0 0 0x0 0x0 \x1b[2J VMM_OK\n", 0, "line 2: byte \\x1b at column 23 is not printable ASCII"},
  };
  char *dir = make_dir();
  char *path = path_in(dir, "bad.trace");
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_bytes(path, bad[i].text, bad[i].len ? bad[i].len : strlen(bad[i].text));
    assert_refused(path, bad[i].want, VMM_ERR_INVALID_ARGUMENT);
  }
  remove_dir(dir, &path, 1);
}

/* Missing files, odd names, NULL arguments and small message buffers. */
static void reader_arguments(void **state) {
  (void)state;
  char *dir = make_dir();
  char *files[2] = {path_in(dir, "missing.trace"), path_in(dir, "we\x01ird \"name\\.trace")};
  assert_refused(files[0], "cannot open: No such file or directory", VMM_ERR_INVALID_ARGUMENT);
  assert_refused(dir, "cannot read the file: Is a directory", VMM_ERR_INVALID_ARGUMENT);
  write_bytes(files[1], "vmmtrace 1\nx\n", 13);
  char msg[512], want_msg[512];
  snprintf(want_msg, sizeof want_msg,
           "%s/we\\x01ird \\\"name\\\\.trace: line 2: 1 fields, expected 9 (time, operation, kind, requested, "
           "rounded, pointer, stream, tag, result)",
           dir);
  vmm_trace_reader *r = NULL;
  assert_int_equal(vmm_trace_reader_open(files[1], &r, msg, sizeof msg), VMM_ERR_INVALID_ARGUMENT);
  assert_string_equal(msg, want_msg);

  assert_int_equal(vmm_trace_reader_open(files[1], &r, msg, 12), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(strlen(msg), 11); /* cut to fit, NUL-terminated */
  assert_int_equal(vmm_trace_reader_open(files[1], &r, NULL, 0), VMM_ERR_INVALID_ARGUMENT);
  assert_null(r);
  assert_int_equal(vmm_trace_reader_open(NULL, &r, msg, sizeof msg), VMM_ERR_INVALID_ARGUMENT);
  assert_string_equal(msg, "vmm_trace_reader_open: NULL path");
  assert_int_equal(vmm_trace_reader_open(files[1], NULL, msg, sizeof msg), VMM_ERR_INVALID_ARGUMENT);
  assert_string_equal(msg, "vmm_trace_reader_open: NULL out-pointer");
  assert_int_equal(vmm_trace_reader_records(NULL), 0);
  assert_int_equal(vmm_trace_reader_next(NULL, NULL, NULL), 0);
  remove_dir(dir, files, 2);
}

/* ---- VMMARENA_TRACE ----------------------------------------------------------------------- */

static void env_errors(void **state) {
  (void)state;
  vmm_config cfg;
  vmm_config_init(&cfg);
  assert_int_equal(setenv("VMMARENA_TRACE", "", 1), 0);
  assert_int_equal(vmm_config_from_env(&cfg), VMM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(vmm_config_error(), "VMMARENA_TRACE=\"\""));
  assert_non_null(strstr(vmm_config_error(), "empty path"));
  assert_null(cfg.trace_path); /* unchanged */

  /* A path in a directory that does not exist: the arena is not created, nothing leaks. */
  char *dir = make_dir();
  char *bad = path_in(dir, "no/such/dir/ops.trace");
  assert_int_equal(setenv("VMMARENA_TRACE", bad, 1), 0);
  cfg = tu_config();
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  assert_string_equal(cfg.trace_path, bad);
  fake_driver_reset(NULL);
  vmm_arena *a = (vmm_arena *)0x1;
  assert_int_equal(vmm_arena_create(&cfg, &a), VMM_ERR_INVALID_ARGUMENT);
  assert_null(a);
  const char *msg = vmm_create_error();
  assert_non_null(strstr(msg, "VMMARENA_TRACE=\""));
  assert_non_null(strstr(msg, bad));
  assert_non_null(strstr(msg, "cannot open for writing: No such file or directory"));
  assert_true(fake_ledger_clean());

  /* A directory is no trace file either. */
  assert_int_equal(setenv("VMMARENA_TRACE", dir, 1), 0);
  cfg = tu_config();
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  assert_int_equal(vmm_arena_create(&cfg, &a), VMM_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(vmm_create_error(), "Is a directory"));
  assert_true(fake_ledger_clean());

  /* A good path: the arena traces from its creation. */
  char *good = path_in(dir, "env.trace");
  assert_int_equal(setenv("VMMARENA_TRACE", good, 1), 0);
  cfg = tu_config();
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  assert_int_equal(unsetenv("VMMARENA_TRACE"), 0);
  uint64_t t0 = now_ns();
  a = tu_arena(NULL, &cfg);
  static oplog l;
  l.count = 0;
  scope_logged(&l, a, VMM_TRACE_BEGIN, VMM_OK);
  scope_logged(&l, a, VMM_TRACE_ABORT, VMM_OK);
  tu_destroy(a); /* destroy closes the trace */
  assert_trace_matches(good, &l, now_ns() - t0);
  free(bad);
  remove_dir(dir, &good, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip),           cmocka_unit_test(trace_on_and_off),
      cmocka_unit_test(whole_process_calls),  cmocka_unit_test(parser_accepts),
      cmocka_unit_test(parser_rejects),       cmocka_unit_test(format_round_trip),
      cmocka_unit_test(reader_reads_records), cmocka_unit_test(reader_reads_version_2),
      cmocka_unit_test(reader_gzip),          cmocka_unit_test(reader_refuses),
      cmocka_unit_test(reader_arguments),     cmocka_unit_test(env_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
