/* vmmarena-replay: replays an operation trace (docs/trace.md) under every retention and reuse
 * policy in one run and prints one table: peak physical and reserved VA, driver calls by entry
 * point, pool hit rate, allocations refused for want of memory, and the replay's wall time.
 *
 *   vmmarena-replay [--driver fake|cuda] [--capacity SIZE] [--granularity SIZE]
 *                   [--handle-bound SIZE] [--refill HOW] [--grow on|off] [--stream-order HOW] [--lag N]
 *                   [--csv OUT.csv] [--plot OUT.png] [TRACE]
 *
 * TRACE is a trace file, plain or gzip, read by vmm_trace_reader_open (include/vmmarena/trace.h);
 * without it the trace compiled into the binary is replayed. A trace the reader refuses is
 * reported in its one line, exit status 2. Only operations the trace records as successful are
 * replayed; an allocation the replay cannot place (out of memory) is counted and skipped
 * together with its later free. A trace with whole-process calls (captures, graph pools,
 * empty_cache, record_stream: format version 2) is replayed in whole-process mode, as with
 * --cache. A limit the trace sets (set-limit: vmm_arena_set_limit, or the limit in force when
 * the trace began) is set on the replay's arena too. */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_cli.h"
#include "fake_driver.h"
#include "internal.h" /* the core's hash table (vmm_table) and byte formatting */
#include "vmmarena.h"
#include "vmmarena/trace.h"

/* Capacity of the fake driver without --capacity: more than any trace asks for. */
#define UNBOUNDED_CAPACITY ((size_t)1 << 50)
#define FAKE_VA_SPACE ((size_t)1 << 46)
/* Exit status of plot_replay.py when matplotlib cannot be imported. */
#define PLOT_NO_MATPLOTLIB 3

extern const unsigned char vmmarena_default_trace[];
extern const size_t vmmarena_default_trace_size;
extern const char vmmarena_default_trace_name[];

/* ---- Options ------------------------------------------------------------------------- */

typedef enum driver_kind { DRIVER_FAKE, DRIVER_CUDA } driver_kind;

typedef struct options {
  driver_kind driver;
  size_t capacity;    /* 0 = unbounded (fake) or no limit (cuda) */
  size_t granularity; /* fake only; 0 = the fake's default */
  size_t handle_bound; /* 0 = the arena's choice */
  int cache;           /* whole-process mode: every free cached, small requests carved (vmm_config.caching) */
  int keep_cache;      /* each empty-cache replayed as a quiesce (a graph's entry under vmmarena.install()) */
  double refill_share; /* VMMARENA_REFILL as parsed (vmm_config.refill_share); 0 = assemble first */
  double refill_live_share; /* and vmm_config.refill_live_share (within-live:F) */
  int grow;            /* whole-process mode's VMMARENA_GROW (vmm_config.grow_in_place) */
  int order_by_event;  /* whole-process mode's VMMARENA_STREAM_ORDER (vmm_config.order_by_event) */
  uint64_t lag;        /* fake only: an event completes this many operations after its record */
  const char *csv, *plot, *trace;
} options;

static const char USAGE[] =
    "usage: vmmarena-replay [--driver fake|cuda] [--capacity SIZE] [--granularity SIZE] [--handle-bound SIZE]\n"
    "                       [--cache] [--keep-cache] [--refill HOW] [--grow on|off] [--stream-order HOW]\n"
    "                       [--lag N] [--csv OUT.csv] [--plot OUT.png] [TRACE]\n"
    "  TRACE          trace file (plain or gzip); default: the trace built into this binary\n"
    "  --driver       fake (default: simulated driver, no GPU needed) or cuda (device 0)\n"
    "  --capacity     physical memory of the fake device, or the arena limit with cuda (e.g. 96G); a limit\n"
    "                 the trace sets (set-limit) applies as well, with cuda never above this one\n"
    "  --granularity  allocation granularity of the fake device (default 2M)\n"
    "  --handle-bound largest handle created inside a scope (default: the arena's choice)\n"
    "  --cache        whole-process mode (VMMARENA_CACHE=on): frees cached outside a scope too, requests\n"
    "                 below half the granularity carved from pages (a trace recorded in that mode; on by\n"
    "                 itself for a trace with captures, graph pools, empty-cache or record-stream)\n"
    "  --keep-cache   each empty-cache of the trace replayed as a quiesce, as vmmarena.install() keeps\n"
    "                 the cache on torch.cuda.graph's entry (VMMARENA_GRAPH_EMPTY_CACHE=keep); for a\n"
    "                 trace recorded with VMMARENA_GRAPH_EMPTY_CACHE=release or before the setting\n"
    "  --refill       whole-process mode's VMMARENA_REFILL: assemble (default), below-peak[:F] or within-live[:F]\n"
    "  --grow         whole-process mode's VMMARENA_GROW: on (default: a pooled mapping may grow in place)\n"
    "                 or off\n"
    "  --stream-order whole-process mode's VMMARENA_STREAM_ORDER: completed (default: memory freed on another\n"
    "                 stream reused once the free's events are queried complete) or event (the request's stream\n"
    "                 waits on an event recorded after the free)\n"
    "  --lag          fake only: the device N operations behind, an event complete N operations after\n"
    "                 its record or at a synchronize (default 0: at once)\n"
    "  --csv          one row per policy\n"
    "  --plot         physical bytes over the operations, per policy (needs python3-matplotlib)\n"
    "  --version      the version, --help this text\n";

static int parse_size_option(const char *name, const char *value, size_t *out) {
  if (vmm_parse_size(value, out) != VMM_OK) {
    fprintf(stderr, "vmmarena-replay: %s %s: %s\n", name, value, vmm_config_error());
    return -1;
  }
  return 0;
}

/* The options that take a value; every other option is --help, --version, --cache or
 * --keep-cache, or refused as unknown. */
static int takes_a_value(const char *arg) {
  static const char *const with_value[] = {"--driver", "--capacity", "--granularity", "--handle-bound", "--refill",
                                           "--grow",   "--stream-order", "--lag",   "--csv",         "--plot"};
  for (size_t i = 0; i < sizeof with_value / sizeof with_value[0]; i++)
    if (!strcmp(arg, with_value[i])) return 1;
  return 0;
}

static int parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->grow = 1;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    bench_cli_help_or_version("vmmarena-replay", USAGE, arg);
    if (arg[0] != '-') {
      if (o->trace) {
        fprintf(stderr, "vmmarena-replay: one trace at a time (got \"%s\" and \"%s\")\n", o->trace, arg);
        return -1;
      }
      o->trace = arg;
      continue;
    }
    if (!strcmp(arg, "--cache")) {
      o->cache = 1;
      continue;
    }
    if (!strcmp(arg, "--keep-cache")) {
      o->keep_cache = 1;
      continue;
    }
    if (!takes_a_value(arg)) bench_cli_refuse("vmmarena-replay", arg);
    if (i + 1 >= argc) {
      fprintf(stderr, "vmmarena-replay: %s needs a value (vmmarena-replay --help)\n", arg);
      return -1;
    }
    const char *value = argv[++i];
    if (!strcmp(arg, "--driver")) {
      if (!strcmp(value, "fake")) o->driver = DRIVER_FAKE;
      else if (!strcmp(value, "cuda")) o->driver = DRIVER_CUDA;
      else {
        fprintf(stderr, "vmmarena-replay: --driver %s: expected fake or cuda\n", value);
        return -1;
      }
    } else if (!strcmp(arg, "--refill") || !strcmp(arg, "--grow") || !strcmp(arg, "--stream-order")) {
      vmm_config parsed; /* parsed as the library parses VMMARENA_REFILL and VMMARENA_GROW */
      vmm_config_init(&parsed);
      parsed.refill_share = o->refill_share, parsed.refill_live_share = o->refill_live_share;
      parsed.grow_in_place = o->grow;
      parsed.order_by_event = o->order_by_event;
      const char *key = strcmp(arg, "--stream-order") ? arg + 2 : "stream_order";
      if (vmm_config_set(&parsed, key, value) != VMM_OK) {
        fprintf(stderr, "vmmarena-replay: %s: %s\n", arg, vmm_config_error());
        return -1;
      }
      o->refill_share = parsed.refill_share, o->refill_live_share = parsed.refill_live_share;
      o->grow = parsed.grow_in_place;
      o->order_by_event = parsed.order_by_event;
    } else if (!strcmp(arg, "--lag")) {
      char *end = NULL;
      errno = 0;
      unsigned long long n = strtoull(value, &end, 10);
      if (!isdigit((unsigned char)*value) || *end || errno) {
        fprintf(stderr, "vmmarena-replay: --lag %s: expected a count of operations\n", value);
        return -1;
      }
      o->lag = n;
    } else if (!strcmp(arg, "--handle-bound")) {
      if (parse_size_option(arg, value, &o->handle_bound)) return -1;
    } else if (!strcmp(arg, "--capacity")) {
      if (parse_size_option(arg, value, &o->capacity)) return -1;
      if (o->capacity == 0) {
        fprintf(stderr, "vmmarena-replay: --capacity %s: must be greater than zero\n", value);
        return -1;
      }
    } else if (!strcmp(arg, "--granularity")) {
      if (parse_size_option(arg, value, &o->granularity)) return -1;
      if (o->granularity == 0 || (o->granularity & (o->granularity - 1))) {
        fprintf(stderr, "vmmarena-replay: --granularity %s (%zu bytes): must be a power of two\n", value, o->granularity);
        return -1;
      }
    } else if (!strcmp(arg, "--csv")) {
      o->csv = value;
    } else if (!strcmp(arg, "--plot")) {
      o->plot = value;
    }
  }
  if (o->driver == DRIVER_CUDA && o->granularity) {
    fputs("vmmarena-replay: --granularity sets the fake driver's granularity; the CUDA driver reports its own\n", stderr);
    return -1;
  }
  if (o->driver == DRIVER_CUDA && o->lag) {
    fputs("vmmarena-replay: --lag sets the fake driver's lag; a GPU has its own\n", stderr);
    return -1;
  }
  return 0;
}

/* ---- The built-in trace -------------------------------------------------------------- */

/* Writes the built-in trace, under its own name, into a fresh directory for the reader; fills
 * path. Returns 0, or -1 after saying why. */
static int write_embedded(char *dir, size_t dir_cap, char *path, size_t path_cap) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, dir_cap, "%s/vmmarena-replay-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "vmmarena-replay: cannot create a temporary directory in %s: %s\n", tmp && *tmp ? tmp : "/tmp",
            strerror(errno));
    return -1;
  }
  snprintf(path, path_cap, "%s/%s", dir, vmmarena_default_trace_name);
  FILE *f = fopen(path, "wb");
  size_t done = f ? fwrite(vmmarena_default_trace, 1, vmmarena_default_trace_size, f) : 0;
  if (!f || fclose(f) != 0 || done != vmmarena_default_trace_size) {
    fprintf(stderr, "vmmarena-replay: writing %s: %s\n", path, strerror(errno));
    unlink(path);
    rmdir(dir);
    return -1;
  }
  return 0;
}

/* Whether path is a plain file, not empty, whose first line does not begin with "vmmtrace": a
 * text file that is no trace, which the reader would answer with what is wrong in its first
 * line as a record ("5 fields, expected 10"). Gzip data, an empty file and one that cannot be
 * read are left to the reader. `vmmarena memviz` makes the same check (lacks_header in
 * shim/python/vmmarena/_memviz.py), so both tools still answer every file alike. */
static int lacks_header(const char *path) {
  FILE *f = fopen(path, "rb");
  char head[8];
  size_t n = f ? fread(head, 1, sizeof head, f) : 0;
  if (f) fclose(f);
  if (n == 0 || (n >= 2 && (unsigned char)head[0] == 0x1f && (unsigned char)head[1] == 0x8b)) return 0;
  return n < sizeof head || memcmp(head, "vmmtrace", sizeof head) != 0;
}

/* path as the reader's messages write it: printable ASCII as it is, '\' and '"' escaped, any
 * other byte \xNN. */
static void print_escaped(FILE *out, const char *path) {
  for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
    if (*p == '\\' || *p == '"') fprintf(out, "\\%c", *p);
    else if (*p >= 0x20 && *p <= 0x7e) fputc(*p, out);
    else fprintf(out, "\\x%02x", *p);
  }
}

/* Opens the trace named on the command line, or the built-in one; NULL after printing the
 * reader's message. */
static vmm_trace_reader *open_trace(const char *trace) {
  char dir[4096], path[4400], msg[2048]; /* msg: as large as the Python package's */
  if (trace && lacks_header(trace)) {
    fputs("vmmarena-replay: ", stderr);
    print_escaped(stderr, trace);
    fputs(": no vmmtrace header (a trace begins with the line \"vmmtrace 2\")\n", stderr);
    return NULL;
  }
  if (!trace) {
    if (write_embedded(dir, sizeof dir, path, sizeof path)) return NULL;
  }
  vmm_trace_reader *r = NULL;
  if (vmm_trace_reader_open(trace ? trace : path, &r, msg, sizeof msg) != VMM_OK)
    fprintf(stderr, "vmmarena-replay: %s\n", msg);
  if (!trace) {
    unlink(path);
    rmdir(dir);
  }
  return r;
}

/* ---- Parsed trace -------------------------------------------------------------------- */

typedef struct op {
  uint8_t type;    /* vmm_trace_op */
  uint8_t kind;    /* vmm_kind (alloc and free) */
  uint32_t stream; /* index into trace.streams */
  uint32_t tag;    /* 0 = none, else 1 + index into trace.tags (alloc, pause, resume) */
  uint64_t bytes;  /* requested bytes (alloc) */
  uint64_t ptr;    /* trace pointer (alloc, free, record-stream) */
  uint64_t pool;   /* vmm_pool_id (alloc, capture-begin, capture-end, release-pool) */
} op;

typedef struct trace {
  op *ops;
  size_t count, allocs, frees, scope_ops, limits;
  size_t process_ops[VMM_TRACE_OP_COUNT]; /* by op, the calls of whole-process mode to replay */
  int whole_process;        /* a record of such a call, or an alloc into a pool: replay with --cache */
  size_t recorded_failures; /* records with a failed result: not replayed */
  size_t unknown_frees;     /* frees of pointers allocated before the trace started: not replayed */
  size_t unknown_uses;      /* record-streams of such pointers: not replayed */
  uint64_t *streams;        /* distinct stream values of the trace */
  size_t stream_count;
  char **tags;              /* distinct tags of the trace */
  size_t tag_count;
} trace;

/* 0 for no tag, else 1 + the tag's index (added if new); -1 on host out-of-memory. */
static int tag_index(trace *t, const char *tag, uint32_t *index) {
  *index = 0;
  if (!*tag) return 0;
  for (size_t i = 0; i < t->tag_count; i++)
    if (!strcmp(t->tags[i], tag)) return *index = (uint32_t)i + 1, 0;
  char **grown = realloc(t->tags, (t->tag_count + 1) * sizeof *grown);
  if (!grown) return -1;
  t->tags = grown;
  if (!(t->tags[t->tag_count] = strdup(tag))) return -1;
  *index = (uint32_t)++t->tag_count;
  return 0;
}

static void trace_free(trace *t) {
  for (size_t i = 0; i < t->tag_count; i++) free(t->tags[i]);
  free(t->tags);
  free(t->ops);
  free(t->streams);
}

static int stream_index(trace *t, uint64_t stream, uint32_t *index) {
  for (size_t i = 0; i < t->stream_count; i++)
    if (t->streams[i] == stream) return *index = (uint32_t)i, 0;
  uint64_t *grown = realloc(t->streams, (t->stream_count + 1) * sizeof *grown);
  if (!grown) return -1;
  t->streams = grown;
  t->streams[t->stream_count] = stream;
  *index = (uint32_t)t->stream_count++;
  return 0;
}

/* The calls that only whole-process mode makes (format version 2). */
static int process_op(vmm_trace_op type) { return type >= VMM_TRACE_CAPTURE_BEGIN && type <= VMM_TRACE_RECORD_STREAM; }

/* The value of a pointer in the table of the trace's live pointers (any non-NULL one). */
static char live_mark;

/* Adds one record to t; checks that no allocation returns a pointer that is still live in
 * the trace (`live`, with room for every record). Returns 0, or -1 after printing what is
 * wrong and where. */
static int add_record(trace *t, vmm_table *live, const vmm_trace_record *rec, const char *name, size_t line) {
  op o = {.type = (uint8_t)rec->op, .kind = (uint8_t)(rec->kind < 0 ? 0 : rec->kind), .bytes = rec->requested,
          .ptr = rec->ptr, .pool = rec->pool};
  if (process_op(rec->op) || rec->pool != VMM_POOL_SHARED) t->whole_process = 1; /* failed calls too */
  if (rec->result != VMM_OK) {
    t->recorded_failures++;
    return 0;
  }
  if (rec->op == VMM_TRACE_ALLOC && (rec->ptr == 0 || vmm_table_find(live, rec->ptr))) {
    fprintf(stderr, "vmmarena-replay: %s: line %zu: alloc returned 0x%llx, %s\n", name, line,
            (unsigned long long)rec->ptr, rec->ptr ? "which is still live in the trace" : "a NULL pointer, with VMM_OK");
    return -1;
  }
  if (rec->op == VMM_TRACE_FREE && !vmm_table_remove(live, rec->ptr)) {
    t->unknown_frees++;
    return 0;
  }
  if (rec->op == VMM_TRACE_RECORD_STREAM && !vmm_table_find(live, rec->ptr)) {
    t->unknown_uses++;
    return 0;
  }
  if (stream_index(t, rec->stream, &o.stream) || tag_index(t, rec->tag, &o.tag)) {
    fputs("vmmarena-replay: out of host memory for the stream or tag list\n", stderr);
    return -1;
  }
  if (rec->op == VMM_TRACE_ALLOC) {
    vmm_table_insert(live, rec->ptr, &live_mark);
    t->allocs++;
  } else if (rec->op == VMM_TRACE_FREE) {
    t->frees++;
  } else if (process_op(rec->op)) {
    t->process_ops[rec->op]++;
  } else if (rec->op == VMM_TRACE_SET_LIMIT) {
    t->limits++;
  } else {
    t->scope_ops++;
  }
  t->ops[t->count++] = o;
  return 0;
}

/* Takes every record of the reader into t. Returns 0, or -1 after printing what is wrong. */
static int load_trace(vmm_trace_reader *r, trace *t) {
  size_t records = vmm_trace_reader_records(r);
  const char *name = vmm_trace_reader_name(r);
  memset(t, 0, sizeof *t);
  if (records == 0) {
    fprintf(stderr, "vmmarena-replay: %s: no records to replay (the trace holds only its header and comments)\n", name);
    return -1;
  }
  t->ops = malloc(records * sizeof *t->ops);
  vmm_table live = {0};
  if (!t->ops || vmm_table_init(&live) || vmm_table_reserve_n(&live, records)) {
    vmm_table_fini(&live);
    fprintf(stderr, "vmmarena-replay: out of host memory for %zu trace records\n", records);
    return -1;
  }
  vmm_trace_record rec;
  size_t line = 0;
  int rc = 0;
  while (rc == 0 && vmm_trace_reader_next(r, &rec, &line)) rc = add_record(t, &live, &rec, name, line);
  vmm_table_fini(&live);
  return rc;
}

/* ---- Streams of the real driver ------------------------------------------------------ */

/* With the CUDA driver every trace stream but the legacy and per-thread default streams is
 * replaced by a stream created here; the fake takes any value as a stream. */
typedef CUresult (*stream_create_fn)(CUstream *stream, unsigned int flags);
typedef CUresult (*stream_destroy_fn)(CUstream stream);

typedef struct replay_streams {
  CUstream *handles; /* one per trace stream */
  size_t count;
  const struct vmm_driver *drv;
  CUdevice dev;
  CUcontext ctx; /* retained, and pushed when `pushed` */
  int pushed;
  stream_destroy_fn destroy;
} replay_streams;

static int is_default_stream(uint64_t s) {
  return s == 0 || s == (uint64_t)(uintptr_t)CU_STREAM_LEGACY || s == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD;
}

static int streams_open(replay_streams *rs, const trace *t, driver_kind driver) {
  memset(rs, 0, sizeof *rs);
  rs->handles = calloc(t->stream_count ? t->stream_count : 1, sizeof *rs->handles);
  if (!rs->handles) {
    fprintf(stderr, "vmmarena-replay: out of host memory for %zu streams\n", t->stream_count);
    return -1;
  }
  rs->count = t->stream_count;
  if (driver == DRIVER_FAKE) {
    for (size_t i = 0; i < t->stream_count; i++) rs->handles[i] = (CUstream)(uintptr_t)t->streams[i];
    return 0;
  }
  const char *why = NULL;
  rs->drv = vmm_driver_cuda(&why);
  if (!rs->drv) {
    fprintf(stderr, "vmmarena-replay: --driver cuda: %s\n", why);
    return -1;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  stream_create_fn create = lib ? (stream_create_fn)dlsym(lib, "cuStreamCreate") : NULL;
  rs->destroy = lib ? (stream_destroy_fn)dlsym(lib, "cuStreamDestroy_v2") : NULL;
  if (!create || !rs->destroy) {
    fputs("vmmarena-replay: libcuda.so.1 lacks cuStreamCreate or cuStreamDestroy_v2\n", stderr);
    return -1;
  }
  CUresult r = rs->drv->init(0);
  if (r == CUDA_SUCCESS) r = rs->drv->device_get(&rs->dev, 0);
  if (r == CUDA_SUCCESS) r = rs->drv->primary_ctx_retain(&rs->ctx, rs->dev);
  if (r == CUDA_SUCCESS) r = rs->drv->ctx_push_current(rs->ctx);
  rs->pushed = r == CUDA_SUCCESS;
  for (size_t i = 0; i < t->stream_count && r == CUDA_SUCCESS; i++) {
    if (is_default_stream(t->streams[i])) rs->handles[i] = (CUstream)(uintptr_t)t->streams[i];
    else r = create(&rs->handles[i], 0);
  }
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "vmmarena-replay: setting up device 0 and %zu streams failed: CUresult %d\n", t->stream_count, (int)r);
    return -1;
  }
  return 0;
}

static void streams_close(replay_streams *rs, const trace *t) {
  if (rs->pushed) {
    for (size_t i = 0; i < rs->count; i++)
      if (rs->handles[i] && !is_default_stream(t->streams[i])) rs->destroy(rs->handles[i]);
    CUcontext popped;
    rs->drv->ctx_pop_current(&popped);
  }
  if (rs->ctx) rs->drv->primary_ctx_release(rs->dev);
  free(rs->handles);
}

/* ---- Policies ------------------------------------------------------------------------ */

/* A policy is its row's name and the values of VMMARENA_RETAIN and VMMARENA_REUSE, set on the
 * replay's configuration by the library's own parser (vmm_config_set). Rows are found by
 * name (result_of), never by their place here. */
typedef struct policy {
  const char *name;
  const char *retain; /* VMMARENA_RETAIN */
  const char *reuse;  /* VMMARENA_REUSE */
} policy;

static const policy policies[] = {
    {"no-retention", "off", "exact"},   /* frees release at once: the physical limit */
    {"retain-no-reuse", "on", "none"},  /* the seeds' failing behaviour */
    {"exact", "on", "exact"},           /* the default */
    {"bounded:2", "on", "bounded:2"},
    {"best-fit", "on", "best-fit"},
};
#define POLICY_COUNT (sizeof policies / sizeof policies[0])

typedef struct result {
  int failed;          /* a non-OOM error stopped the replay */
  vmm_snapshot snap;   /* at the end of the trace */
  size_t oom;          /* allocations refused for want of memory (skipped with their frees) */
  size_t skipped_frees;
  uint64_t driver_calls;
  double ms;
} result;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A limit the trace set, as this replay applies it: with cuda, never above --capacity. */
static size_t replay_limit(const options *o, uint64_t traced) {
  if (o->driver == DRIVER_FAKE || !o->capacity) return (size_t)traced;
  return traced && traced < o->capacity ? (size_t)traced : o->capacity;
}

/* Replays the trace under one policy. series (if non-NULL) gets the physical bytes after
 * every operation. Returns 0, or -1 if the arena could not be created. */
static int replay(const options *o, const policy *p, const trace *t, const replay_streams *rs, vmm_table *map,
                  uint64_t *series, result *res) {
  memset(res, 0, sizeof *res);
  vmm_config cfg;
  vmm_config_init(&cfg);
  if (vmm_config_set(&cfg, "retain", p->retain) != VMM_OK || vmm_config_set(&cfg, "reuse", p->reuse) != VMM_OK) {
    fprintf(stderr, "vmmarena-replay: %s: %s\n", p->name, vmm_config_error()); /* a bug of this file */
    return -1;
  }
  cfg.handle_bound_bytes = o->handle_bound;
  cfg.caching = o->cache;
  cfg.refill_share = o->refill_share;
  cfg.refill_live_share = o->refill_live_share;
  cfg.grow_in_place = o->grow;
  cfg.order_by_event = o->order_by_event;
  cfg.log_level = 0; /* refusals are counted, not logged */
  cfg.unmap_in_background = o->driver != DRIVER_FAKE; /* the fake: every call in one order, run to run */
  if (o->driver == DRIVER_FAKE) {
    fake_options fo = {.capacity = o->capacity ? o->capacity : UNBOUNDED_CAPACITY,
                       .granularity = o->granularity,
                       .va_space = FAKE_VA_SPACE,
                       .record_calls = -1};
    cfg.driver = fake_driver_reset(&fo);
    fake_set_event_lag(o->lag);
  } else {
    cfg.limit_bytes = o->capacity;
  }
  vmm_arena *a = NULL;
  vmm_status st = vmm_arena_create(&cfg, &a);
  if (st != VMM_OK) {
    fprintf(stderr, "vmmarena-replay: %s: creating the arena: %s: %s\n", p->name, vmm_status_name(st), vmm_create_error());
    return -1;
  }
  double t0 = now_ms();
  for (size_t i = 0; i < t->count && !res->failed; i++) {
    const op *x = &t->ops[i];
    if (o->driver == DRIVER_FAKE) fake_advance_clock(1);
    CUstream stream = rs->handles[x->stream];
    void *replay_ptr;
    switch ((vmm_trace_op)x->type) {
    case VMM_TRACE_ALLOC: {
      void *ptr = NULL;
      if (x->tag) vmm_tag_push(t->tags[x->tag - 1]);
      st = vmm_arena_alloc_in(a, x->bytes, (vmm_kind)x->kind, stream, x->pool, &ptr);
      if (x->tag) vmm_tag_pop();
      if (st == VMM_OK) vmm_table_insert(map, x->ptr, ptr);
      else if (st == VMM_ERR_OUT_OF_MEMORY) res->oom++, st = VMM_OK;
      break;
    }
    case VMM_TRACE_FREE:
      if ((replay_ptr = vmm_table_remove(map, x->ptr))) st = vmm_arena_free(a, replay_ptr, stream);
      else res->skipped_frees++;
      break;
    case VMM_TRACE_BEGIN: st = vmm_retention_begin(a); break;
    case VMM_TRACE_FINISH: st = vmm_retention_finish(a); break;
    case VMM_TRACE_ABORT: st = vmm_retention_abort(a); break;
    case VMM_TRACE_PAUSE_DISCARD:
    case VMM_TRACE_PAUSE_BACKUP:
      st = vmm_arena_pause(a, x->tag ? t->tags[x->tag - 1] : NULL,
                           x->type == VMM_TRACE_PAUSE_BACKUP ? VMM_PAUSE_BACKUP : VMM_PAUSE_DISCARD);
      break;
    case VMM_TRACE_RESUME:
      st = vmm_arena_resume(a, x->tag ? t->tags[x->tag - 1] : NULL);
      if (st == VMM_ERR_OUT_OF_MEMORY) res->oom++, st = VMM_OK; /* stays paused */
      break;
    /* No capture happens here: the arena is only told that one begins and ends. */
    case VMM_TRACE_CAPTURE_BEGIN: st = vmm_arena_capture_begin(a, x->pool); break;
    case VMM_TRACE_CAPTURE_END: st = vmm_arena_capture_end(a, x->pool); break;
    case VMM_TRACE_RELEASE_POOL: st = vmm_arena_release_pool(a, x->pool); break;
    case VMM_TRACE_EMPTY_CACHE: st = o->keep_cache ? vmm_arena_quiesce(a) : vmm_arena_empty_cache(a); break;
    case VMM_TRACE_RECORD_STREAM: /* skipped when its allocation was refused here (counted as OOM) */
      if ((replay_ptr = vmm_table_find(map, x->ptr))) st = vmm_arena_record_stream(a, replay_ptr, stream);
      break;
    case VMM_TRACE_SET_LIMIT: st = vmm_arena_set_limit(a, replay_limit(o, x->bytes)); break;
    }
    if (st != VMM_OK) {
      fprintf(stderr, "vmmarena-replay: %s: operation %zu (%s %llu bytes): %s: %s\n", p->name, i + 1,
              vmm_trace_op_name((vmm_trace_op)x->type), (unsigned long long)x->bytes, vmm_status_name(st),
              vmm_arena_last_error(a));
      res->failed = 1;
    }
    if (series) { /* not timed */
      double s0 = now_ms();
      vmm_snapshot s;
      vmm_arena_snapshot(a, &s);
      series[i] = s.physical_bytes;
      t0 += now_ms() - s0;
    }
  }
  res->ms = now_ms() - t0;
  vmm_arena_snapshot(a, &res->snap);
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) res->driver_calls += res->snap.driver[e].calls;
  char why[256] = "";
  if (vmm_arena_check(a, why, sizeof why)) {
    fprintf(stderr, "vmmarena-replay: %s: invariant check failed after the replay: %s\n", p->name, why);
    res->failed = 1;
  }
  vmm_arena_destroy(a);
  if (o->driver == DRIVER_FAKE && !fake_ledger_clean()) {
    fprintf(stderr, "vmmarena-replay: %s: the fake driver's ledger is not clean after destroy\n", p->name);
    res->failed = 1;
  }
  return 0;
}

/* ---- Output -------------------------------------------------------------------------- */

/* "35.27 GiB", "512.0 MiB", "64.0 KiB", "100 B": the core's formatting, two decimals from GiB
 * up, so that peaks a few percent apart differ in the table. */
static const char *human(uint64_t bytes, char buf[32]) { return vmm_errors_fmt_bytes_decimals(bytes, 2, buf); }

static uint64_t calls_of(const result *r, vmm_driver_entry e) { return r->snap.driver[e].calls; }

static const char *hit_rate(const result *r, char buf[32]) {
  uint64_t tries = r->snap.pool_hits + r->snap.pool_misses;
  if (tries == 0) snprintf(buf, 32, "-");
  else snprintf(buf, 32, "%.1f%%", 100.0 * (double)r->snap.pool_hits / (double)tries);
  return buf;
}

/* The result of the policy named `name` (one of policies[]): the table's rows are found by
 * name, not by their place in the list. */
static const result *result_of(const result *res, const char *name) {
  for (size_t i = 0; i < POLICY_COUNT; i++)
    if (!strcmp(policies[i].name, name)) return &res[i];
  fprintf(stderr, "vmmarena-replay: no policy named %s\n", name); /* a bug of this file */
  abort();
}

static void print_table(const result *res) {
  printf("%-16s %13s %8s %12s %11s %9s %10s %12s %12s %8s %9s %6s %7s %9s\n", "policy", "peak physical",
         "x limit", "peak VA", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "driver calls", "hit rate",
         "assembled", "OOM", "rescued", "time ms");
  const uint64_t limit = result_of(res, "no-retention")->snap.physical_peak_bytes; /* the physical limit */
  for (size_t i = 0; i < POLICY_COUNT; i++) {
    const result *r = &res[i];
    char b[3][32];
    char ratio[32] = "-";
    if (limit) snprintf(ratio, sizeof ratio, "%.3fx", (double)r->snap.physical_peak_bytes / (double)limit);
    printf("%-16s %13s %8s %12s %11llu %9llu %10llu %12llu %12llu %8s %9llu %6zu %7llu %9.1f%s\n", policies[i].name,
           human(r->snap.physical_peak_bytes, b[0]), ratio, human(r->snap.reserved_va_bytes, b[1]),
           (unsigned long long)calls_of(r, VMM_DRV_mem_create), (unsigned long long)calls_of(r, VMM_DRV_mem_map),
           (unsigned long long)calls_of(r, VMM_DRV_mem_unmap), (unsigned long long)calls_of(r, VMM_DRV_mem_release),
           (unsigned long long)r->driver_calls, hit_rate(r, b[2]), (unsigned long long)r->snap.assemblies, r->oom,
           (unsigned long long)(r->snap.pool_fallbacks + r->snap.padded_assemblies), r->ms, r->failed ? "  FAILED" : "");
  }
}

/* The policy with the lowest peak physical among those that met no OOM (only those that
 * retain if `retaining`), or -1. */
static int lowest_peak(const result *res, int retaining) {
  int best = -1;
  for (size_t p = 0; p < POLICY_COUNT; p++) {
    if (res[p].failed || res[p].oom || (retaining && !strcmp(policies[p].retain, "off"))) continue;
    if (best < 0 || res[p].snap.physical_peak_bytes < res[best].snap.physical_peak_bytes) best = (int)p;
  }
  return best;
}

static int write_csv(const char *path, const result *res) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "vmmarena-replay: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  fputs("policy,peak_physical_bytes,peak_reserved_va_bytes,peak_mapped_bytes,cuMemCreate,cuMemMap,cuMemUnmap,"
        "cuMemRelease,cuMemSetAccess,driver_calls,pool_hits,pool_misses,pool_hit_rate,oom,skipped_frees,fallbacks,"
        "assemblies,padded_assemblies,pooled_taken_apart,grown_in_place,handle_bound_bytes,time_ms,"
        "status\n",
        f);
  for (size_t i = 0; i < POLICY_COUNT; i++) {
    const result *r = &res[i];
    uint64_t tries = r->snap.pool_hits + r->snap.pool_misses;
    char rate[32] = "";
    if (tries) snprintf(rate, sizeof rate, "%.4f", (double)r->snap.pool_hits / (double)tries);
    fprintf(f, "%s,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%llu,%s,%zu,%zu,%llu,%llu,%llu,%llu,%llu,%llu,%.3f,%s\n",
            policies[i].name,
            (unsigned long long)r->snap.physical_peak_bytes, (unsigned long long)r->snap.reserved_va_bytes,
            (unsigned long long)r->snap.mapped_peak_bytes, (unsigned long long)calls_of(r, VMM_DRV_mem_create),
            (unsigned long long)calls_of(r, VMM_DRV_mem_map), (unsigned long long)calls_of(r, VMM_DRV_mem_unmap),
            (unsigned long long)calls_of(r, VMM_DRV_mem_release), (unsigned long long)calls_of(r, VMM_DRV_mem_set_access),
            (unsigned long long)r->driver_calls,
            (unsigned long long)r->snap.pool_hits, (unsigned long long)r->snap.pool_misses, rate, r->oom,
            r->skipped_frees, (unsigned long long)r->snap.pool_fallbacks, (unsigned long long)r->snap.assemblies,
            (unsigned long long)r->snap.padded_assemblies, (unsigned long long)r->snap.pooled_taken_apart,
            (unsigned long long)r->snap.grown_in_place, (unsigned long long)r->snap.handle_bound_bytes, r->ms,
            r->failed ? "failed" : "ok");
  }
  int rc = fclose(f) == 0 ? 0 : -1;
  if (rc) fprintf(stderr, "vmmarena-replay: writing %s: %s\n", path, strerror(errno));
  return rc;
}

/* "out.png" -> "out-series.csv" beside it. */
static void series_path(const char *png, char *out, size_t cap) {
  const char *slash = strrchr(png, '/');
  const char *dot = strrchr(png, '.');
  size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - png) : strlen(png);
  snprintf(out, cap, "%.*s-series.csv", (int)stem, png);
}

static int write_series(const char *path, uint64_t *const series[POLICY_COUNT], size_t count) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "vmmarena-replay: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  fputs("op", f);
  for (size_t p = 0; p < POLICY_COUNT; p++) fprintf(f, ",%s", policies[p].name);
  fputc('\n', f);
  for (size_t i = 0; i < count; i++) {
    fprintf(f, "%zu", i + 1);
    for (size_t p = 0; p < POLICY_COUNT; p++) fprintf(f, ",%llu", (unsigned long long)series[p][i]);
    fputc('\n', f);
  }
  int rc = fclose(f) == 0 ? 0 : -1;
  if (rc) fprintf(stderr, "vmmarena-replay: writing %s: %s\n", path, strerror(errno));
  return rc;
}

/* Runs plot_replay.py; a missing python3 or matplotlib is reported and is not an error. */
/* plot_replay.py: where `cmake --install` puts it beside an installed binary
 * (VMMARENA_PLOT_SCRIPT_FROM_BIN, relative to the binary's directory), else in the source tree
 * the binary was built from (VMMARENA_PLOT_SCRIPT). */
static const char *plot_script(char *buf, size_t cap) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
  if (slash) {
    *slash = '\0';
    int len = snprintf(buf, cap, "%s/%s", exe, VMMARENA_PLOT_SCRIPT_FROM_BIN);
    if (len > 0 && (size_t)len < cap && access(buf, R_OK) == 0) return buf;
  }
  return VMMARENA_PLOT_SCRIPT;
}

static int run_plot(const char *series, const char *png) {
  char buf[4400];
  const char *script = plot_script(buf, sizeof buf);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execlp("python3", "python3", script, series, png, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) {
    printf("plot: %s (series %s)\n", png, series);
    return 0;
  }
  if (code == 127 || code == PLOT_NO_MATPLOTLIB) {
    printf("plot: skipped, %s is not installed; the series is in %s\n", code == 127 ? "python3" : "matplotlib", series);
    return 0;
  }
  fprintf(stderr, "vmmarena-replay: %s failed (status %d); the series is in %s\n", script, code, series);
  return -1;
}

/* ---- Main ---------------------------------------------------------------------------- */

static const char *lag_text(uint64_t lag, char buf[64]) {
  snprintf(buf, 64, ", device %llu operations behind", (unsigned long long)lag);
  return buf;
}

static void print_summary(const options *o, const result *res) {
  char b[3][64];
  if (o->driver == DRIVER_FAKE)
    printf("driver: fake, capacity %s, granularity %s%s\n\n", o->capacity ? human(o->capacity, b[0]) : "unbounded",
           human(result_of(res, "no-retention")->snap.granularity, b[1]), o->lag ? lag_text(o->lag, b[2]) : "");
  else
    printf("driver: cuda, device 0, limit %s, granularity %s\n\n", o->capacity ? human(o->capacity, b[0]) : "none",
           human(result_of(res, "no-retention")->snap.granularity, b[1]));
  print_table(res);
  printf("\nx limit: peak physical over the no-retention peak (the physical limit); peak VA: reserved address\n"
         "space; assembled: allocations mapped from idle handles (new memory only for the rest); OOM: allocations\n"
         "refused for want of memory, skipped with their frees; rescued: refusals served by a larger pooled mapping\n"
         "or a padded assembly. Inside a scope new memory is cut into handles of at most 1/64 of the scope's\n"
         "peak (VMMARENA_HANDLE_BOUND, --handle-bound); at the end of this trace that is %s.\n",
         human(result_of(res, "exact")->snap.handle_bound_bytes, b[0])); /* the default policy's */
  if (o->refill_share > 0.0 || o->refill_live_share > 0.0) {
    printf("VMMARENA_REFILL=%s:%g: misses given new memory in place of several cached handles:",
           o->refill_share > 0.0 ? "below-peak" : "within-live", o->refill_share > 0.0 ? o->refill_share : o->refill_live_share);
    for (size_t p = 0; p < POLICY_COUNT; p++)
      printf("%s %s %llu", p ? "," : "", policies[p].name, (unsigned long long)res[p].snap.refills);
    printf("\n");
  }
  if (o->cache) {
    printf("VMMARENA_GROW=%s: pooled mappings grown in place (the rest mapped beside them):", o->grow ? "on" : "off");
    for (size_t p = 0; p < POLICY_COUNT; p++)
      printf("%s %s %llu", p ? "," : "", policies[p].name, (unsigned long long)res[p].snap.grown_in_place);
    printf("\n");
  }
  int best = lowest_peak(res, 0), best_retaining = lowest_peak(res, 1);
  if (best < 0) {
    printf("every policy ran out of memory at this capacity\n");
    return;
  }
  printf("lowest peak physical with no OOM: %s (%s)", policies[best].name,
         human(res[best].snap.physical_peak_bytes, b[0]));
  if (best_retaining >= 0 && best_retaining != best)
    printf("; under retention: %s (%s)", policies[best_retaining].name,
           human(res[best_retaining].snap.physical_peak_bytes, b[0]));
  printf("\n");
}

/* Replays t under every policy and reports. Returns the exit status. */
static int run_policies(const options *o, const trace *t) {
  replay_streams rs;
  result res[POLICY_COUNT];
  uint64_t *series[POLICY_COUNT] = {0};
  int ran = streams_open(&rs, t, o->driver) == 0, failed = 0;
  /* A policy whose replay fails is marked in the table; the others still run. */
  for (size_t p = 0; p < POLICY_COUNT && ran; p++) {
    vmm_table map = {0}; /* trace pointer -> this replay's pointer, room for every allocation */
    if (vmm_table_init(&map) || vmm_table_reserve_n(&map, t->allocs)) {
      fputs("vmmarena-replay: out of host memory for the table of pointers\n", stderr);
      ran = 0;
    } else if (o->plot && !(series[p] = calloc(t->count ? t->count : 1, sizeof *series[p]))) {
      fputs("vmmarena-replay: out of host memory for the plot series\n", stderr);
      ran = 0;
    } else if (replay(o, &policies[p], t, &rs, &map, series[p], &res[p])) {
      ran = 0;
    } else {
      failed |= res[p].failed;
    }
    vmm_table_fini(&map);
  }
  streams_close(&rs, t);
  if (ran) {
    print_summary(o, res);
    if (o->csv && write_csv(o->csv, res)) failed = 1;
    if (o->plot) {
      char path[4096];
      series_path(o->plot, path, sizeof path);
      if (write_series(path, series, t->count) || run_plot(path, o->plot)) failed = 1;
    }
  }
  for (size_t p = 0; p < POLICY_COUNT; p++) free(series[p]);
  return ran && !failed ? 0 : 1;
}

/* ", 9 whole-process: 2 capture-begin, ..." for the ops there are; nothing without any. */
static void print_process_ops(const trace *t) {
  size_t total = 0;
  for (int i = 0; i < VMM_TRACE_OP_COUNT; i++) total += t->process_ops[i];
  if (total == 0) return;
  printf(", %zu whole-process:", total);
  const char *sep = " ";
  for (int i = 0; i < VMM_TRACE_OP_COUNT; i++)
    if (t->process_ops[i])
      printf("%s%zu %s", sep, t->process_ops[i], vmm_trace_op_name((vmm_trace_op)i)), sep = ", ";
}

/* Whether an output path names a trace already there (gzip or "vmmtrace"): `--csv TRACE` with
 * the CSV's own path forgotten would write over it. */
static int output_is_a_trace(const char *option, const char *path) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  unsigned char head[8] = {0};
  size_t n = f ? fread(head, 1, sizeof head, f) : 0;
  if (f) fclose(f);
  if (!(n >= 2 && head[0] == 0x1f && head[1] == 0x8b) && !(n == 8 && !memcmp(head, "vmmtrace", 8))) return 0;
  fprintf(stderr, "vmmarena-replay: %s %s: that file is a trace; not writing over it (the output's path missing?)\n",
          option, path);
  return 1;
}

int main(int argc, char **argv) {
  options o;
  if (parse_options(argc, argv, &o)) return 2;
  if (output_is_a_trace("--csv", o.csv) || output_is_a_trace("--plot", o.plot)) return 2;
  trace t = {0};
  vmm_trace_reader *reader = open_trace(o.trace);
  int loaded = reader && load_trace(reader, &t) == 0;
  vmm_trace_reader_close(reader);
  if (!loaded) {
    trace_free(&t);
    return 2;
  }
  printf("trace: %s%s: %zu operations (%zu alloc, %zu free, %zu scope", o.trace ? o.trace : vmmarena_default_trace_name,
         o.trace ? "" : " (built in)", t.count, t.allocs, t.frees, t.scope_ops);
  if (t.limits) printf(", %zu set-limit", t.limits);
  print_process_ops(&t);
  printf(")");
  if (t.recorded_failures || t.unknown_frees || t.unknown_uses)
    printf("; not replayed: %zu recorded failures, %zu frees of memory allocated before the trace", t.recorded_failures,
           t.unknown_frees);
  if (t.unknown_uses) printf(", %zu record-streams of such memory", t.unknown_uses);
  printf("\n");
  if (t.whole_process && !o.cache) {
    o.cache = 1;
    printf("whole-process mode: on, as with --cache (the trace has captures, graph pools, empty-cache or "
           "record-stream)\n");
  }
  fflush(stdout);
  int rc = run_policies(&o, &t);
  trace_free(&t);
  return rc;
}
