/* A fake CUDA driver for tests; see fake_driver.h.
 *
 * One global state guarded by one mutex. Every entry point locks it, counts the call,
 * consults the fault rules, does its work unless a fault fired, and logs
 * (entry, result, a0, a1), where a0 and a1 are the first two input arguments (a property
 * struct is logged as its device id).
 *
 * Options: a zero field means its default. peer_access and record_calls default to on, so
 * a negative value turns them off.
 *
 * Misuse: calls that a correct library never makes (double release, unmap of unmapped
 * memory, an overlapping map, sizes that are not granularity multiples, touching a
 * capturing stream, ...) fail as the real driver would and count in ledger.errors.
 * Failures a correct library can meet are not misuse: out of memory, the NOT_SUPPORTED
 * the real driver gives for mapping part of a handle, cuDeviceGet of an unknown ordinal.
 *
 * Structures: handles, events and capturing streams live in open-addressing hash maps;
 * reservations and mappings in AVL trees keyed by base address, so finding the one that
 * contains an address (and so the overlap check of cuMemMap) is O(log n). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif
#include "fake_driver.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_timeline.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define FAKE_VA_BASE 0x7f0000000000ull
#define FAKE_CTX_BASE 0x1000u
#define FAKE_CUDA_VERSION 13000
#define CTX_STACK_MAX 64

static const char *const entry_names[VMM_DRV_ENTRY_COUNT] = {
#define FAKE_ENTRY_NAME(field, symbol) symbol,
    VMM_DRIVER_ENTRY_POINTS(FAKE_ENTRY_NAME)
#undef FAKE_ENTRY_NAME
};

static void *xcalloc(size_t count, size_t size) {
  void *p = calloc(count, size);
  if (!p) {
    fputs("fake_driver: out of host memory\n", stderr);
    abort();
  }
  return p;
}

/* ---- Hash map: nonzero 64-bit keys to non-NULL values ---------------------------------
 * Linear probing, at most half full, deletion by backward shift (no tombstones). */
typedef struct hmap {
  uint64_t *keys; /* 0 = empty slot */
  void **vals;
  size_t cap, count; /* cap is 0 or a power of two */
} hmap;

static size_t hmap_slot(const hmap *m, uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return (size_t)key & (m->cap - 1);
}

static void *hmap_get(const hmap *m, uint64_t key) {
  if (m->count == 0 || key == 0) return NULL;
  for (size_t i = hmap_slot(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (m->keys[i] == key) return m->vals[i];
    if (m->keys[i] == 0) return NULL;
  }
}

static void hmap_put(hmap *m, uint64_t key, void *val);

static void hmap_grow(hmap *m) {
  hmap old = *m;
  m->cap = old.cap ? 2 * old.cap : 64;
  m->keys = xcalloc(m->cap, sizeof *m->keys);
  m->vals = xcalloc(m->cap, sizeof *m->vals);
  m->count = 0;
  for (size_t i = 0; i < old.cap; i++)
    if (old.keys[i]) hmap_put(m, old.keys[i], old.vals[i]);
  free(old.keys);
  free(old.vals);
}

/* `key` must be absent. */
static void hmap_put(hmap *m, uint64_t key, void *val) {
  if (2 * (m->count + 1) > m->cap) hmap_grow(m);
  size_t i = hmap_slot(m, key);
  while (m->keys[i] != 0) i = (i + 1) & (m->cap - 1);
  m->keys[i] = key;
  m->vals[i] = val;
  m->count++;
}

/* Removes `key`; returns its value, or NULL if it was absent. */
static void *hmap_del(hmap *m, uint64_t key) {
  if (m->count == 0 || key == 0) return NULL;
  size_t mask = m->cap - 1, i = hmap_slot(m, key);
  while (m->keys[i] != key) {
    if (m->keys[i] == 0) return NULL;
    i = (i + 1) & mask;
  }
  void *val = m->vals[i];
  /* Pull later entries of the probe run into the hole when the hole is not before their
   * home slot, so that every entry stays reachable from its home. */
  for (size_t j = (i + 1) & mask; m->keys[j] != 0; j = (j + 1) & mask) {
    size_t home = hmap_slot(m, m->keys[j]);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = NULL;
  m->count--;
  return val;
}

static void hmap_free(hmap *m, int free_values) {
  if (free_values)
    for (size_t i = 0; i < m->cap; i++) free(m->vals[i]);
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ---- AVL tree keyed by base address, embedded first in reservations and mappings ----- */
typedef struct avl {
  uint64_t key;
  struct avl *left, *right;
  int height;
} avl;

static int avl_height(const avl *n) { return n ? n->height : 0; }

static void avl_fix_height(avl *n) {
  int l = avl_height(n->left), r = avl_height(n->right);
  n->height = 1 + (l > r ? l : r);
}

static avl *avl_rotate_right(avl *n) {
  avl *l = n->left;
  n->left = l->right;
  l->right = n;
  avl_fix_height(n);
  avl_fix_height(l);
  return l;
}

static avl *avl_rotate_left(avl *n) {
  avl *r = n->right;
  n->right = r->left;
  r->left = n;
  avl_fix_height(n);
  avl_fix_height(r);
  return r;
}

static avl *avl_balance(avl *n) {
  avl_fix_height(n);
  int tilt = avl_height(n->left) - avl_height(n->right);
  if (tilt > 1) {
    if (avl_height(n->left->left) < avl_height(n->left->right)) n->left = avl_rotate_left(n->left);
    return avl_rotate_right(n);
  }
  if (tilt < -1) {
    if (avl_height(n->right->right) < avl_height(n->right->left)) n->right = avl_rotate_right(n->right);
    return avl_rotate_left(n);
  }
  return n;
}

/* `node->key` must be absent. Returns the new root. */
static avl *avl_insert(avl *root, avl *node) {
  if (!root) {
    node->left = node->right = NULL;
    node->height = 1;
    return node;
  }
  if (node->key < root->key)
    root->left = avl_insert(root->left, node);
  else
    root->right = avl_insert(root->right, node);
  return avl_balance(root);
}

static avl *avl_remove_min(avl *n, avl **min) {
  if (!n->left) {
    *min = n;
    return n->right;
  }
  n->left = avl_remove_min(n->left, min);
  return avl_balance(n);
}

/* `key` must be present. Returns the new root. */
static avl *avl_remove(avl *root, uint64_t key) {
  if (key < root->key) {
    root->left = avl_remove(root->left, key);
  } else if (key > root->key) {
    root->right = avl_remove(root->right, key);
  } else {
    avl *left = root->left, *right = root->right, *successor;
    if (!right) return left;
    right = avl_remove_min(right, &successor);
    successor->left = left;
    successor->right = right;
    return avl_balance(successor);
  }
  return avl_balance(root);
}

/* The node with the greatest key <= `key`, or NULL. */
static avl *avl_floor(avl *n, uint64_t key) {
  avl *best = NULL;
  while (n) {
    if (n->key <= key) {
      best = n;
      n = n->right;
    } else {
      n = n->left;
    }
  }
  return best;
}

/* The node with the smallest key > `key`, or NULL. */
static avl *avl_after(avl *n, uint64_t key) {
  avl *best = NULL;
  while (n) {
    if (n->key > key) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}

static avl *avl_find(avl *root, uint64_t key) {
  avl *n = avl_floor(root, key);
  return n && n->key == key ? n : NULL;
}

static void avl_free(avl *n, void (*free_node)(avl *)) {
  if (!n) return;
  avl_free(n->left, free_node);
  avl_free(n->right, free_node);
  free_node(n);
}

/* ---- Simulated objects ---------------------------------------------------------------- */
typedef struct reservation {
  avl node; /* key = base */
  size_t size;
  size_t mappings; /* live mappings inside */
} reservation;

/* A handle leaves the handle map when released but lives on while mapped: its physical
 * memory is freed with its last mapping, as in CUDA. */
typedef struct handle {
  size_t size;
  int device;
  int released;
  size_t mappings;
  unsigned long long id;
  int refs;               /* ids naming it: its own and its imports' (cuMemImportFromShareableHandle) */
  int exportable;         /* created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested */
  tl_records *acc;        /* device accesses of its memory (fake_timeline.c) */
  unsigned char **chunks; /* contents in FAKE_CHUNK pieces, each allocated on its first write
                             of a non-zero byte; a NULL piece (or list) reads as zeros */
} handle;

#define FAKE_CHUNK ((size_t)64 << 10)

typedef struct mapping {
  avl node; /* key = base */
  size_t size;
  handle *handle;
  reservation *reservation;
  unsigned access; /* bit d: device d may read and write */
} mapping;

/* Pinned host memory (cuMemHostAlloc): plain heap memory, known by its address range. */
typedef struct host_alloc {
  avl node; /* key = address */
  size_t size;
} host_alloc;

typedef struct fault_rule {
  unsigned nth; /* 0 = no rule */
  unsigned long long seen;
  CUresult result;
  int persistent;
} fault_rule;

static pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
  fake_options opts; /* defaults resolved; peer_access, record_calls and integrated are 0 or 1 */
  size_t capacity[FAKE_MAX_DEVICES];
  size_t physical_used[FAKE_MAX_DEVICES];
  size_t retained[FAKE_MAX_DEVICES];
  avl *reservations, *mappings, *host_allocs;
  hmap handles, events, streams; /* streams: created (capture state is the timeline's) */
  hmap imports;        /* ids made by cuMemImportFromShareableHandle (a marker set) */
  int export_refused;  /* cuMemCreate refuses exportable handles (fake_set_export_refused) */
  CUdeviceptr next_va;
  fault_rule rules[VMM_DRV_ENTRY_COUNT], any_rule;
  unsigned faults_fired;
  fake_ledger ledger;
  vmm_driver_entry entry; /* entry point running, for misuse messages */
  char first_error[256];
  fake_call *log;
  size_t log_len, log_cap;
  unsigned generation; /* raised by every reset: thread context stacks older than it are empty */
  int events_pending;  /* cuEventQuery answers CUDA_ERROR_NOT_READY: the device is behind */
  uint64_t clock;      /* operations the host has issued (fake_advance_clock) */
  uint64_t event_lag;  /* an event completes this many operations after its record */
  uint64_t synced_at;  /* the clock at the last synchronize: events recorded before are complete */
  int strict_capture;  /* an unsafe call during a capture, not in relaxed mode, is misuse */
  pthread_t test_thread; /* the thread of the last reset: calls from others are logged as such */
} fk;

/* Calls from threads other than the test's wait this long first (fake_set_other_thread_delay). */
static unsigned other_thread_delay_us;

/* This thread's capture mode (cuThreadExchangeStreamCaptureMode). */
static _Thread_local int tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* Never reset, so that an id from an earlier test is never valid again. */
static uint64_t next_id = 1;

static _Thread_local struct {
  unsigned generation;
  int depth;
  CUcontext stack[CTX_STACK_MAX];
} tls_ctx;

/* Records a misuse (the first one's text is kept) and returns `code`. */
static CUresult misuse(CUresult code, const char *fmt, ...) {
  if (fk.ledger.errors++ == 0) {
    int n = snprintf(fk.first_error, sizeof fk.first_error, "%s: ", entry_names[fk.entry]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fk.first_error + n, sizeof fk.first_error - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return code;
}

static int rule_fires(fault_rule *rule) {
  if (!rule->nth) return 0;
  rule->seen++;
  return rule->seen == rule->nth || (rule->persistent && rule->seen > rule->nth);
}

/* Counts the call; 1 (with the result in *result) if a fault rule fails it. */
static int fault_fires(vmm_driver_entry entry, CUresult *result) {
  fk.entry = entry;
  fk.ledger.calls++;
  fk.ledger.calls_by_entry[entry]++;
  int entry_fires = rule_fires(&fk.rules[entry]);
  int any_fires = rule_fires(&fk.any_rule);
  if (!entry_fires && !any_fires) return 0;
  fk.faults_fired++;
  *result = entry_fires ? fk.rules[entry].result : fk.any_rule.result;
  return 1;
}

static void log_call(vmm_driver_entry entry, CUresult result, uintptr_t a0, uintptr_t a1) {
  if (!fk.opts.record_calls) return;
  if (fk.log_len == fk.log_cap) {
    size_t cap = fk.log_cap ? 2 * fk.log_cap : 1024;
    fake_call *log = realloc(fk.log, cap * sizeof *log);
    if (!log) {
      fputs("fake_driver: out of host memory\n", stderr);
      abort();
    }
    fk.log = log;
    fk.log_cap = cap;
  }
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  fk.log[fk.log_len++] = (fake_call){entry, result, a0, a1, !pthread_equal(pthread_self(), fk.test_thread),
                                     (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec};
}

static void other_thread_wait(void) {
  unsigned us = __atomic_load_n(&other_thread_delay_us, __ATOMIC_RELAXED);
  if (us && !pthread_equal(pthread_self(), fk.test_thread)) usleep(us);
}

/* Body of every entry point: lock, count, fail if a fault fires or else run `body`, log. */
#define FAKE_CALL(field, a0, a1, body)                               \
  do {                                                               \
    other_thread_wait();                                             \
    pthread_mutex_lock(&fk_lock);                                    \
    CUresult result_;                                                \
    if (!fault_fires(VMM_DRV_##field, &result_)) result_ = (body);   \
    log_call(VMM_DRV_##field, result_, (uintptr_t)(a0), (uintptr_t)(a1)); \
    pthread_mutex_unlock(&fk_lock);                                  \
    return result_;                                                  \
  } while (0)

/* ---- Helpers of the entry points (called with the lock held) -------------------------- */
static int valid_device(int device) { return device >= 0 && device < fk.opts.device_count; }

static int context_device(CUcontext ctx) {
  uintptr_t v = (uintptr_t)ctx;
  return v >= FAKE_CTX_BASE && v < FAKE_CTX_BASE + (uintptr_t)fk.opts.device_count ? (int)(v - FAKE_CTX_BASE) : -1;
}

static void tls_ctx_sync(void) {
  if (tls_ctx.generation != fk.generation) {
    tls_ctx.generation = fk.generation;
    tls_ctx.depth = 0;
  }
}

/* Device of the calling thread's current context; device 0 if none. */
static int current_device(void) {
  tls_ctx_sync();
  return tls_ctx.depth ? context_device(tls_ctx.stack[tls_ctx.depth - 1]) : 0;
}

static size_t free_physical(int device) {
  size_t cap = fk.capacity[device], used = fk.physical_used[device];
  return cap > used ? cap - used : 0;
}

static int granule_multiple(size_t size) { return size != 0 && size % fk.opts.granularity == 0; }

static CUresult check_prop(const CUmemAllocationProp *prop) {
  if (!prop) return misuse(CUDA_ERROR_INVALID_VALUE, "prop is NULL");
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
    return misuse(CUDA_ERROR_INVALID_VALUE, "prop->type %d is not PINNED", (int)prop->type);
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return misuse(CUDA_ERROR_INVALID_VALUE, "prop->location.type %d is not DEVICE", (int)prop->location.type);
  if (!valid_device(prop->location.id))
    return misuse(CUDA_ERROR_INVALID_DEVICE, "prop->location.id %d is not a device", prop->location.id);
  return CUDA_SUCCESS;
}

static uintptr_t prop_device(const CUmemAllocationProp *prop) { return prop ? (uintptr_t)prop->location.id : 0; }

static void free_handle(handle *h) {
  fk.physical_used[h->device] -= h->size;
  tl_forget(&h->acc);
  if (h->chunks)
    for (size_t i = 0; i < (h->size + FAKE_CHUNK - 1) / FAKE_CHUNK; i++) free(h->chunks[i]);
  free(h->chunks);
  free(h);
}

/* Copies [off, off+len) of h's contents to or from host memory, piece by piece; zeros written
 * where nothing was written read as zeros still, with no memory behind them. */
static void copy_handle(handle *h, size_t off, unsigned char *at, size_t len, int to_device) {
  while (len) {
    size_t i = off / FAKE_CHUNK, in = off % FAKE_CHUNK, k = FAKE_CHUNK - in < len ? FAKE_CHUNK - in : len;
    unsigned char *chunk = h->chunks ? h->chunks[i] : NULL;
    if (to_device) {
      static const unsigned char zeros[FAKE_CHUNK];
      if (chunk || memcmp(at, zeros, k)) {
        if (!h->chunks) h->chunks = xcalloc((h->size + FAKE_CHUNK - 1) / FAKE_CHUNK, sizeof *h->chunks);
        if (!chunk) chunk = h->chunks[i] = xcalloc(1, FAKE_CHUNK);
        memcpy(chunk + in, at, k);
      }
    } else if (chunk) {
      memcpy(at, chunk + in, k);
    } else {
      memset(at, 0, k);
    }
    at += k, off += k, len -= k;
  }
}

static mapping *find_mapping(CUdeviceptr base) { return (mapping *)avl_find(fk.mappings, base); }

static mapping *mapping_containing(CUdeviceptr ptr) {
  mapping *m = (mapping *)avl_floor(fk.mappings, ptr);
  return m && ptr - m->node.key < m->size ? m : NULL;
}

/* The mapping that starts where `m` ends, or NULL. */
static mapping *next_mapping(const mapping *m) { return find_mapping(m->node.key + m->size); }

/* Checks that [ptr, ptr+size) is exactly a run of back-to-back mappings of one reservation;
 * on success *first is the first of them. */
static CUresult check_mapped_run(CUdeviceptr ptr, size_t size, mapping **first) {
  unsigned long long p = ptr;
  if (size == 0 || size > UINT64_MAX - ptr) return misuse(CUDA_ERROR_INVALID_VALUE, "bad range 0x%llx+%zu", p, size);
  mapping *m = find_mapping(ptr);
  if (!m) return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx is not the start of a mapping", p);
  CUdeviceptr end = ptr + size;
  for (mapping *run = m;;) {
    CUdeviceptr run_end = run->node.key + run->size;
    if (run_end == end) break;
    if (run_end > end)
      return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx+%zu ends inside a mapping", p, size);
    mapping *next = next_mapping(run);
    if (!next || next->reservation != m->reservation)
      return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx+%zu is not all mapped: gap at 0x%llx", p, size,
                    (unsigned long long)run_end);
    run = next;
  }
  *first = m;
  return CUDA_SUCCESS;
}

/* Copies between host memory and the mapped device range [ptr, ptr+n), mapping by mapping
 * (to_device: host -> device). Every byte must be mapped with access granted. */
static CUresult copy_mapped(CUdeviceptr ptr, void *host, size_t n, int to_device) {
  unsigned long long p = ptr;
  if (!host || n == 0 || n > UINT64_MAX - ptr) return misuse(CUDA_ERROR_INVALID_VALUE, "bad copy 0x%llx+%zu", p, n);
  unsigned char *at = host;
  while (n) {
    mapping *m = mapping_containing(ptr);
    if (!m) return misuse(CUDA_ERROR_INVALID_VALUE, "copy touches unmapped 0x%llx", (unsigned long long)ptr);
    if (!m->access) return misuse(CUDA_ERROR_INVALID_VALUE, "copy touches 0x%llx with no access granted", (unsigned long long)ptr);
    size_t off = (size_t)(ptr - m->node.key), len = m->size - off < n ? m->size - off : n;
    copy_handle(m->handle, off, at, len, to_device);
    at += len, ptr += len, n -= len;
  }
  return CUDA_SUCCESS;
}

/* A device access of [ptr, ptr + n) by `owner` on `stream`, handed to the timeline piece by
 * piece (one piece per mapping); -1, a violation, where some byte is not mapped. */
static int access_range(CUstream stream, CUdeviceptr ptr, size_t n, uint64_t owner, const char *what) {
  enum { MAX_PIECES = 64 };
  tl_piece p[MAX_PIECES];
  size_t count = 0;
  for (CUdeviceptr at = ptr, end = ptr + n; at < end;) {
    mapping *m = mapping_containing(at);
    if (!m) {
      tl_violation(FAKE_VIOLATION_UNMAPPED_ACCESS, "a %s of owner %llu on stream %p touches unmapped 0x%llx (of 0x%llx+%zu)",
                   what, (unsigned long long)owner, (void *)stream, (unsigned long long)at, (unsigned long long)ptr, n);
      return -1;
    }
    size_t off = (size_t)(at - m->node.key), len = m->size - off < end - at ? m->size - off : end - at;
    p[count++] = (tl_piece){&m->handle->acc, off, len, at, m->handle->id};
    at += len;
    if (count == MAX_PIECES || at == end) tl_access(stream, owner, what, p, count), count = 0;
  }
  return 0;
}

static void remove_mapping(mapping *m) {
  fk.mappings = avl_remove(fk.mappings, m->node.key);
  m->reservation->mappings--;
  handle *h = m->handle;
  if (h->released) fk.ledger.released_mapped_bytes -= m->size;
  if (--h->mappings == 0 && h->released) free_handle(h);
  fk.ledger.live_mappings--;
  fk.ledger.mapped_bytes -= m->size;
  free(m);
}

static int is_legacy_stream(CUstream stream) { return stream == NULL || stream == CU_STREAM_LEGACY; }

static int is_capturing(CUstream stream) { return tl_capturing(stream); }

/* Work on `stream` is misuse while it captures, and on the legacy stream while any
 * stream captures (it would synchronize with the capture). */
static CUresult check_stream_usable(CUstream stream) {
  if (is_capturing(stream)) {
    tl_violation(FAKE_VIOLATION_CAPTURE_SYNC, "%s on stream %p, which is capturing", entry_names[fk.entry],
                 (void *)stream);
    return misuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "stream %p is capturing", (void *)stream);
  }
  if (is_legacy_stream(stream) && tl_capturing_streams()) {
    tl_violation(FAKE_VIOLATION_CAPTURE_SYNC, "%s on the legacy stream while a stream captures", entry_names[fk.entry]);
    return misuse(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "legacy stream used while a stream is capturing");
  }
  return CUDA_SUCCESS;
}

/* With strict capture on: a potentially unsafe call (memory creation, mapping, release, an
 * event query) while a capture is underway invalidates it unless this thread is relaxed. */
static CUresult check_safe_during_capture(void) {
  if (!fk.strict_capture || !tl_capturing_streams() || tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_SUCCESS;
  return misuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "an unsafe call while a capture is underway, not relaxed");
}

#define SAFE(body) (check_safe_during_capture() == CUDA_SUCCESS ? (body) : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)

static CUresult check_event(CUevent event) {
  if (!hmap_get(&fk.events, (uintptr_t)event))
    return misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)event);
  return CUDA_SUCCESS;
}

/* ---- Entry points: do_* run with the lock held, drv_* are the table's functions ------- */
static CUresult do_init(unsigned flags) {
  return flags ? misuse(CUDA_ERROR_INVALID_VALUE, "flags %u are not 0", flags) : CUDA_SUCCESS;
}

static CUresult do_driver_get_version(int *version) {
  *version = FAKE_CUDA_VERSION;
  return CUDA_SUCCESS;
}

static CUresult do_get_error_name(CUresult error, const char **name) {
#define FAKE_ERROR_NAME(code) {code, #code}
  static const struct {
    CUresult code;
    const char *name;
  } names[] = {
      FAKE_ERROR_NAME(CUDA_SUCCESS),
      FAKE_ERROR_NAME(CUDA_ERROR_INVALID_VALUE),
      FAKE_ERROR_NAME(CUDA_ERROR_OUT_OF_MEMORY),
      FAKE_ERROR_NAME(CUDA_ERROR_NOT_INITIALIZED),
      FAKE_ERROR_NAME(CUDA_ERROR_DEINITIALIZED),
      FAKE_ERROR_NAME(CUDA_ERROR_NO_DEVICE),
      FAKE_ERROR_NAME(CUDA_ERROR_INVALID_DEVICE),
      FAKE_ERROR_NAME(CUDA_ERROR_INVALID_CONTEXT),
      FAKE_ERROR_NAME(CUDA_ERROR_INVALID_HANDLE),
      FAKE_ERROR_NAME(CUDA_ERROR_NOT_READY),
      FAKE_ERROR_NAME(CUDA_ERROR_ILLEGAL_ADDRESS),
      FAKE_ERROR_NAME(CUDA_ERROR_LAUNCH_FAILED),
      FAKE_ERROR_NAME(CUDA_ERROR_NOT_PERMITTED),
      FAKE_ERROR_NAME(CUDA_ERROR_NOT_SUPPORTED),
      FAKE_ERROR_NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
      FAKE_ERROR_NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
      FAKE_ERROR_NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
      FAKE_ERROR_NAME(CUDA_ERROR_UNKNOWN),
  };
#undef FAKE_ERROR_NAME
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (names[i].code == error) {
      *name = names[i].name;
      return CUDA_SUCCESS;
    }
  }
  *name = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult do_device_get_count(int *count) {
  *count = fk.opts.device_count;
  return CUDA_SUCCESS;
}

static CUresult do_device_get(CUdevice *device, int ordinal) {
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

static CUresult do_device_get_attribute(int *value, CUdevice_attribute attribute, CUdevice device) {
  if (!valid_device(device)) return misuse(CUDA_ERROR_INVALID_DEVICE, "unknown device %d", device);
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = fk.opts.integrated; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}

static CUresult do_device_can_access_peer(int *can_access, CUdevice device, CUdevice peer) {
  if (!valid_device(device) || !valid_device(peer))
    return misuse(CUDA_ERROR_INVALID_DEVICE, "unknown device %d or %d", device, peer);
  *can_access = device != peer && fk.opts.peer_access;
  return CUDA_SUCCESS;
}

static CUresult do_primary_ctx_retain(CUcontext *ctx, CUdevice device) {
  if (!valid_device(device)) return misuse(CUDA_ERROR_INVALID_DEVICE, "unknown device %d", device);
  fk.retained[device]++;
  fk.ledger.primary_retained++;
  *ctx = (CUcontext)(uintptr_t)(FAKE_CTX_BASE + (unsigned)device);
  return CUDA_SUCCESS;
}

static CUresult do_primary_ctx_release(CUdevice device) {
  if (!valid_device(device)) return misuse(CUDA_ERROR_INVALID_DEVICE, "unknown device %d", device);
  if (fk.retained[device] == 0)
    return misuse(CUDA_ERROR_INVALID_CONTEXT, "device %d released more often than retained", device);
  fk.retained[device]--;
  fk.ledger.primary_retained--;
  tl_device_closed(device);
  return CUDA_SUCCESS;
}

static CUresult do_ctx_push_current(CUcontext ctx) {
  int device = context_device(ctx);
  if (device < 0) return misuse(CUDA_ERROR_INVALID_CONTEXT, "%p is not a primary context", (void *)ctx);
  if (fk.retained[device] == 0)
    return misuse(CUDA_ERROR_INVALID_CONTEXT, "primary context of device %d is not retained", device);
  tls_ctx_sync();
  if (tls_ctx.depth == CTX_STACK_MAX)
    return misuse(CUDA_ERROR_INVALID_CONTEXT, "context stack deeper than %d: pushes without pops?", CTX_STACK_MAX);
  tls_ctx.stack[tls_ctx.depth++] = ctx;
  fk.ledger.ctx_pushed++;
  return CUDA_SUCCESS;
}

static CUresult do_ctx_pop_current(CUcontext *popped) {
  tls_ctx_sync();
  if (tls_ctx.depth == 0) return misuse(CUDA_ERROR_INVALID_CONTEXT, "context stack of this thread is empty");
  CUcontext ctx = tls_ctx.stack[--tls_ctx.depth];
  if (popped) *popped = ctx;
  fk.ledger.ctx_pushed--;
  return CUDA_SUCCESS;
}

static CUresult do_ctx_synchronize(void) {
  if (tl_capturing_streams()) {
    tl_violation(FAKE_VIOLATION_CAPTURE_SYNC, "cuCtxSynchronize while a stream captures");
    return misuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a stream is capturing");
  }
  fk.synced_at = fk.clock;
  tl_ctx_synchronize();
  return CUDA_SUCCESS;
}

static CUresult do_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  int device = current_device();
  *free_bytes = free_physical(device);
  *total_bytes = fk.capacity[device];
  return CUDA_SUCCESS;
}

static CUresult do_mem_get_allocation_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option) {
  CUresult r = check_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return misuse(CUDA_ERROR_INVALID_VALUE, "unknown option %d", (int)option);
  *granularity = fk.opts.granularity;
  return CUDA_SUCCESS;
}

static CUresult do_mem_address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, unsigned long long flags) {
  if (flags) return misuse(CUDA_ERROR_INVALID_VALUE, "flags %llu are not 0", flags);
  if (!granule_multiple(size)) return misuse(CUDA_ERROR_INVALID_VALUE, "size %zu is not a granularity multiple", size);
  if (alignment & (alignment - 1))
    return misuse(CUDA_ERROR_INVALID_VALUE, "alignment %zu is not a power of two", alignment);
  if (size > fk.opts.va_space - fk.ledger.reserved_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t step = alignment > fk.opts.granularity ? alignment : fk.opts.granularity;
  uint64_t base = (fk.next_va + step - 1) / step * step;
  if (base < fk.next_va || size > UINT64_MAX - base) return CUDA_ERROR_OUT_OF_MEMORY;
  reservation *res = xcalloc(1, sizeof *res);
  res->node.key = base;
  res->size = size;
  fk.reservations = avl_insert(fk.reservations, &res->node);
  fk.next_va = base + size;
  fk.ledger.reservations++;
  fk.ledger.reserved_bytes += size;
  *ptr = base;
  return CUDA_SUCCESS;
}

static CUresult do_mem_address_free(CUdeviceptr ptr, size_t size) {
  unsigned long long p = ptr;
  reservation *res = (reservation *)avl_find(fk.reservations, ptr);
  if (!res) return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx is not a reservation", p);
  if (res->size != size)
    return misuse(CUDA_ERROR_INVALID_VALUE, "size %zu of 0x%llx, reserved %zu", size, p, res->size);
  if (res->mappings)
    return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx still holds %zu mappings", p, res->mappings);
  fk.reservations = avl_remove(fk.reservations, ptr);
  fk.ledger.reservations--;
  fk.ledger.reserved_bytes -= size;
  free(res);
  return CUDA_SUCCESS;
}

static CUresult do_mem_create(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop,
                              unsigned long long flags) {
  if (flags) return misuse(CUDA_ERROR_INVALID_VALUE, "flags %llu are not 0", flags);
  CUresult r = check_prop(prop);
  if (r != CUDA_SUCCESS) return r;
  if (!granule_multiple(size)) return misuse(CUDA_ERROR_INVALID_VALUE, "size %zu is not a granularity multiple", size);
  int device = prop->location.id;
  if (prop->requestedHandleTypes & ~(CUmemAllocationHandleType)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_NOT_SUPPORTED; /* the fake shares through file descriptors only */
  if (prop->requestedHandleTypes && fk.export_refused) return CUDA_ERROR_NOT_SUPPORTED;
  if (size > free_physical(device)) return CUDA_ERROR_OUT_OF_MEMORY;
  handle *h = xcalloc(1, sizeof *h);
  h->size = size;
  h->device = device;
  h->refs = 1;
  h->exportable = prop->requestedHandleTypes != 0;
  uint64_t id = next_id++;
  h->id = id;
  hmap_put(&fk.handles, id, h);
  fk.physical_used[device] += size;
  fk.ledger.live_handles++;
  fk.ledger.live_handle_bytes += size;
  *out = id;
  return CUDA_SUCCESS;
}

static CUresult do_mem_release(CUmemGenericAllocationHandle id) {
  handle *h = hmap_del(&fk.handles, id);
  if (!h) return misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %llu", (unsigned long long)id);
  hmap_del(&fk.imports, id);
  if (--h->refs > 0) { /* other ids (imports) still name its memory */
    fk.ledger.live_handles--;
    fk.ledger.live_handle_bytes -= h->size;
    return CUDA_SUCCESS;
  }
  tl_release(&h->acc, h->id, h->size, h->device);
  h->released = 1;
  fk.ledger.released_mapped_bytes += h->mappings * h->size;
  fk.ledger.live_handles--;
  fk.ledger.live_handle_bytes -= h->size;
  if (h->mappings == 0) free_handle(h);
  return CUDA_SUCCESS;
}

static CUresult do_mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle id,
                           unsigned long long flags) {
  unsigned long long p = ptr;
  if (flags) return misuse(CUDA_ERROR_INVALID_VALUE, "flags %llu are not 0", flags);
  handle *h = hmap_get(&fk.handles, id);
  if (!h) return misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %llu", (unsigned long long)id);
  if (size > h->size && offset == 0 && hmap_get(&fk.imports, id))
    return CUDA_ERROR_INVALID_VALUE; /* an import's size is the sender's word: not misuse */
  if (size == 0 || offset > h->size || size > h->size - offset)
    return misuse(CUDA_ERROR_INVALID_VALUE, "offset %zu + size %zu outside a handle of %zu", offset, size, h->size);
  if (offset != 0 || size != h->size) return CUDA_ERROR_NOT_SUPPORTED; /* as the real H200 driver */
  if (ptr % fk.opts.granularity) return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx is not granule aligned", p);
  reservation *res = (reservation *)avl_floor(fk.reservations, ptr);
  if (!res || ptr - res->node.key > res->size || size > res->size - (ptr - res->node.key))
    return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx+%zu is not inside one reservation", p, size);
  /* Mappings are disjoint, so only the one starting at or before ptr and the first one
   * after ptr can overlap the new range. */
  mapping *before = (mapping *)avl_floor(fk.mappings, ptr);
  mapping *after = (mapping *)avl_after(fk.mappings, ptr);
  if ((before && ptr - before->node.key < before->size) || (after && after->node.key - ptr < size))
    return misuse(CUDA_ERROR_INVALID_VALUE, "0x%llx+%zu overlaps a mapping", p, size);
  mapping *m = xcalloc(1, sizeof *m);
  m->node.key = ptr;
  m->size = size;
  m->handle = h;
  m->reservation = res;
  fk.mappings = avl_insert(fk.mappings, &m->node);
  h->mappings++;
  res->mappings++;
  fk.ledger.live_mappings++;
  fk.ledger.mapped_bytes += size;
  return CUDA_SUCCESS;
}

static CUresult do_mem_unmap(CUdeviceptr ptr, size_t size) {
  mapping *m;
  CUresult r = check_mapped_run(ptr, size, &m);
  if (r != CUDA_SUCCESS) return r;
  for (CUdeviceptr end = ptr + size; m;) {
    CUdeviceptr next = m->node.key + m->size;
    tl_unmap(&m->handle->acc, m->node.key, m->size, m->handle->id);
    remove_mapping(m);
    m = next < end ? find_mapping(next) : NULL;
  }
  return CUDA_SUCCESS;
}

static CUresult do_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  if (!desc || count == 0) return misuse(CUDA_ERROR_INVALID_VALUE, "no access descriptors");
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return misuse(CUDA_ERROR_INVALID_VALUE, "desc[%zu].location.type is not DEVICE", i);
    if (!valid_device(desc[i].location.id))
      return misuse(CUDA_ERROR_INVALID_DEVICE, "desc[%zu].location.id %d is not a device", i, desc[i].location.id);
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
      return misuse(CUDA_ERROR_INVALID_VALUE, "desc[%zu].flags %d are not READWRITE or NONE", i, (int)desc[i].flags);
  }
  mapping *first;
  CUresult r = check_mapped_run(ptr, size, &first);
  if (r != CUDA_SUCCESS) return r;
  CUdeviceptr end = ptr + size;
  if (!fk.opts.peer_access) {
    for (mapping *m = first; m && m->node.key < end; m = next_mapping(m))
      for (size_t i = 0; i < count; i++)
        if (desc[i].location.id != m->handle->device)
          return misuse(CUDA_ERROR_INVALID_DEVICE, "device %d has no peer access to device %d",
                        desc[i].location.id, m->handle->device);
  }
  for (mapping *m = first; m && m->node.key < end; m = next_mapping(m)) {
    for (size_t i = 0; i < count; i++) {
      unsigned bit = 1u << desc[i].location.id;
      m->access = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? m->access | bit : m->access & ~bit;
    }
  }
  return CUDA_SUCCESS;
}

static CUresult do_stream_is_capturing(CUstream stream, CUstreamCaptureStatus *status) {
  if (is_capturing(stream)) {
    *status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
  }
  /* As CUDA: asking about the legacy stream while a stream captures is an error. */
  if (is_legacy_stream(stream) && tl_capturing_streams()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

/* Recording or waiting on an event in a capturing stream is legal in CUDA but turns into
 * graph nodes; the library must never do it, so the fake counts it as misuse. */
static CUresult check_event_and_stream(CUstream stream, CUevent event) {
  CUresult r = check_event(event);
  return r != CUDA_SUCCESS ? r : check_stream_usable(stream);
}

/* An event's value in fk.events: 1 + the clock at its last record (1 for none: complete). */
static CUresult do_event_create(CUevent *event) {
  uint64_t id = next_id++;
  hmap_put(&fk.events, id, (void *)(uintptr_t)1);
  fk.ledger.live_events++;
  *event = (CUevent)(uintptr_t)id;
  return CUDA_SUCCESS;
}

static CUresult do_event_destroy(CUevent event) {
  if (!hmap_del(&fk.events, (uintptr_t)event))
    return misuse(CUDA_ERROR_INVALID_HANDLE, "unknown event %p", (void *)event);
  tl_event_destroy(event);
  fk.ledger.live_events--;
  return CUDA_SUCCESS;
}

static CUresult do_host_memory_available(size_t *bytes) {
  *bytes = fk.opts.host_mem_available;
  return CUDA_SUCCESS;
}

static CUresult do_mem_host_alloc(void **host, size_t bytes, unsigned flags) {
  if (flags) return misuse(CUDA_ERROR_INVALID_VALUE, "flags %u are not 0", flags);
  if (bytes == 0) return misuse(CUDA_ERROR_INVALID_VALUE, "0 bytes of pinned memory");
  host_alloc *ha = xcalloc(1, sizeof *ha);
  void *p = malloc(bytes);
  if (!p) {
    free(ha);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ha->node.key = (uintptr_t)p;
  ha->size = bytes;
  fk.host_allocs = avl_insert(fk.host_allocs, &ha->node);
  fk.ledger.live_host_allocs++;
  fk.ledger.pinned_host_bytes += bytes;
  *host = p;
  return CUDA_SUCCESS;
}

static CUresult do_mem_free_host(void *host) {
  host_alloc *ha = (host_alloc *)avl_find(fk.host_allocs, (uintptr_t)host);
  if (!ha) return misuse(CUDA_ERROR_INVALID_VALUE, "%p is not pinned memory of cuMemHostAlloc", host);
  fk.host_allocs = avl_remove(fk.host_allocs, ha->node.key);
  fk.ledger.live_host_allocs--;
  fk.ledger.pinned_host_bytes -= ha->size;
  free(host);
  free(ha);
  return CUDA_SUCCESS;
}

static CUresult do_stream_create(CUstream *stream, unsigned flags) {
  if (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING)
    return misuse(CUDA_ERROR_INVALID_VALUE, "stream flags %u", flags);
  uint64_t id = next_id++;
  hmap_put(&fk.streams, id, &fk.streams); /* any non-NULL value marks the stream live */
  fk.ledger.live_streams++;
  *stream = (CUstream)(uintptr_t)id;
  return CUDA_SUCCESS;
}

static CUresult do_stream_destroy(CUstream stream) {
  if (!hmap_del(&fk.streams, (uintptr_t)stream))
    return misuse(CUDA_ERROR_INVALID_HANDLE, "stream %p was not created by cuStreamCreate", (void *)stream);
  fk.ledger.live_streams--;
  return CUDA_SUCCESS;
}

/* An asynchronous copy: on a stream of cuStreamCreate, between the mapped device range and
 * pinned host memory (as CUDA requires for the copy to be asynchronous); done at once. */
static CUresult do_mem_cpy_async(CUdeviceptr ptr, void *host, size_t n, CUstream stream, int to_device) {
  if (!hmap_get(&fk.streams, (uintptr_t)stream))
    return misuse(CUDA_ERROR_INVALID_HANDLE, "asynchronous copy on stream %p, not one of cuStreamCreate", (void *)stream);
  CUresult r = check_stream_usable(stream);
  if (r != CUDA_SUCCESS) return r;
  host_alloc *ha = (host_alloc *)avl_floor(fk.host_allocs, (uintptr_t)host);
  if (!ha || (uintptr_t)host - ha->node.key > ha->size || n > ha->size - ((uintptr_t)host - ha->node.key))
    return misuse(CUDA_ERROR_INVALID_VALUE, "asynchronous copy of %zu B at %p: not inside pinned memory", n, host);
  r = copy_mapped(ptr, host, n, to_device);
  if (r == CUDA_SUCCESS) access_range(stream, ptr, n, 0, "copy");
  return r;
}

static CUresult drv_init(unsigned int flags) { FAKE_CALL(init, flags, 0, do_init(flags)); }
static CUresult drv_driver_get_version(int *version) {
  FAKE_CALL(driver_get_version, 0, 0, do_driver_get_version(version));
}
static CUresult drv_get_error_name(CUresult error, const char **name) {
  FAKE_CALL(get_error_name, error, 0, do_get_error_name(error, name));
}
static CUresult drv_device_get_count(int *count) { FAKE_CALL(device_get_count, 0, 0, do_device_get_count(count)); }
static CUresult drv_device_get(CUdevice *device, int ordinal) {
  FAKE_CALL(device_get, ordinal, 0, do_device_get(device, ordinal));
}
static CUresult drv_device_get_attribute(int *value, CUdevice_attribute attribute, CUdevice device) {
  FAKE_CALL(device_get_attribute, attribute, device, do_device_get_attribute(value, attribute, device));
}
static CUresult drv_device_can_access_peer(int *can_access, CUdevice device, CUdevice peer) {
  FAKE_CALL(device_can_access_peer, device, peer, do_device_can_access_peer(can_access, device, peer));
}
static CUresult drv_primary_ctx_retain(CUcontext *ctx, CUdevice device) {
  FAKE_CALL(primary_ctx_retain, device, 0, do_primary_ctx_retain(ctx, device));
}
static CUresult drv_primary_ctx_release(CUdevice device) {
  FAKE_CALL(primary_ctx_release, device, 0, do_primary_ctx_release(device));
}
static CUresult drv_ctx_push_current(CUcontext ctx) { FAKE_CALL(ctx_push_current, ctx, 0, do_ctx_push_current(ctx)); }
static CUresult drv_ctx_pop_current(CUcontext *popped) { FAKE_CALL(ctx_pop_current, 0, 0, do_ctx_pop_current(popped)); }
static CUresult drv_ctx_synchronize(void) { FAKE_CALL(ctx_synchronize, 0, 0, do_ctx_synchronize()); }
static CUresult drv_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  FAKE_CALL(mem_get_info, 0, 0, do_mem_get_info(free_bytes, total_bytes));
}
static CUresult drv_mem_get_allocation_granularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags option) {
  FAKE_CALL(mem_get_allocation_granularity, prop_device(prop), option,
            do_mem_get_allocation_granularity(granularity, prop, option));
}
static CUresult drv_mem_address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                        unsigned long long flags) {
  (void)addr; /* the fake ignores the address hint */
  FAKE_CALL(mem_address_reserve, size, alignment, do_mem_address_reserve(ptr, size, alignment, flags));
}
static CUresult drv_mem_address_free(CUdeviceptr ptr, size_t size) {
  FAKE_CALL(mem_address_free, ptr, size, do_mem_address_free(ptr, size));
}
static CUresult drv_mem_create(CUmemGenericAllocationHandle *hnd, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
  FAKE_CALL(mem_create, size, prop_device(prop), SAFE(do_mem_create(hnd, size, prop, flags)));
}
static CUresult drv_mem_release(CUmemGenericAllocationHandle hnd) {
  FAKE_CALL(mem_release, hnd, 0, SAFE(do_mem_release(hnd)));
}
static CUresult drv_mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle hnd,
                            unsigned long long flags) {
  FAKE_CALL(mem_map, ptr, size, SAFE(do_mem_map(ptr, size, offset, hnd, flags)));
}
static CUresult drv_mem_unmap(CUdeviceptr ptr, size_t size) {
  FAKE_CALL(mem_unmap, ptr, size, SAFE(do_mem_unmap(ptr, size)));
}
static CUresult drv_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  FAKE_CALL(mem_set_access, ptr, size, SAFE(do_mem_set_access(ptr, size, desc, count)));
}
/* The fake has one queue: a stream's synchronize completes everything issued so far. */
static CUresult do_stream_synchronize(CUstream stream) {
  CUresult r = check_stream_usable(stream);
  if (r == CUDA_SUCCESS) fk.synced_at = fk.clock, tl_stream_synchronize(stream);
  return r;
}
static CUresult drv_stream_synchronize(CUstream stream) {
  FAKE_CALL(stream_synchronize, stream, 0, do_stream_synchronize(stream));
}
static CUresult drv_stream_is_capturing(CUstream stream, CUstreamCaptureStatus *status) {
  FAKE_CALL(stream_is_capturing, stream, 0, do_stream_is_capturing(stream, status));
}
static CUresult do_stream_wait_event(CUstream stream, CUevent event) {
  CUresult r = check_event_and_stream(stream, event);
  if (r == CUDA_SUCCESS) tl_stream_wait_event(stream, event);
  return r;
}
static CUresult drv_stream_wait_event(CUstream stream, CUevent event, unsigned int flags) {
  (void)flags;
  FAKE_CALL(stream_wait_event, stream, event, do_stream_wait_event(stream, event));
}
static CUresult drv_event_create(CUevent *event, unsigned int flags) {
  FAKE_CALL(event_create, flags, 0, do_event_create(event));
}
static CUresult do_event_record(CUevent event, CUstream stream) {
  CUresult r = check_event_and_stream(stream, event);
  if (r == CUDA_SUCCESS) { /* the record's clock replaces the last one */
    hmap_del(&fk.events, (uintptr_t)event);
    hmap_put(&fk.events, (uintptr_t)event, (void *)(uintptr_t)(fk.clock + 1));
    tl_event_record(event, stream);
  }
  return r;
}
static CUresult drv_event_record(CUevent event, CUstream stream) {
  FAKE_CALL(event_record, event, stream, do_event_record(event, stream));
}
static CUresult drv_event_destroy(CUevent event) { FAKE_CALL(event_destroy, event, 0, do_event_destroy(event)); }
static CUresult do_event_query(CUevent event) {
  CUresult r = check_event(event);
  if (r != CUDA_SUCCESS) return r;
  if (fk.events_pending) return CUDA_ERROR_NOT_READY;
  uint64_t recorded = (uint64_t)(uintptr_t)hmap_get(&fk.events, (uintptr_t)event) - 1;
  int behind = recorded > fk.synced_at && fk.clock - recorded < fk.event_lag;
  if (!behind) tl_event_completed(event);
  return behind ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult drv_event_query(CUevent event) { FAKE_CALL(event_query, event, 0, SAFE(do_event_query(event))); }
static CUresult do_exchange_capture_mode(CUstreamCaptureMode *mode) {
  int old = tls_capture_mode;
  tls_capture_mode = (int)*mode;
  *mode = (CUstreamCaptureMode)old;
  return CUDA_SUCCESS;
}
static CUresult drv_thread_exchange_stream_capture_mode(CUstreamCaptureMode *mode) {
  uintptr_t asked = (uintptr_t)*mode; /* logged: the mode asked for */
  FAKE_CALL(thread_exchange_stream_capture_mode, asked, 0, do_exchange_capture_mode(mode));
}
static CUresult drv_host_memory_available(size_t *bytes) {
  FAKE_CALL(host_memory_available, 0, 0, do_host_memory_available(bytes));
}
static CUresult do_mem_cpy(CUdeviceptr ptr, void *host, size_t n, int to_device) {
  CUresult r = check_stream_usable(NULL); /* a synchronous copy runs on the legacy stream */
  if (r == CUDA_SUCCESS) r = copy_mapped(ptr, host, n, to_device);
  if (r == CUDA_SUCCESS) access_range(NULL, ptr, n, 0, "copy"), tl_stream_synchronize(NULL);
  return r;
}
static CUresult drv_mem_cpy_dtoh(void *dst, CUdeviceptr src, size_t bytes) {
  FAKE_CALL(mem_cpy_dtoh, src, bytes, do_mem_cpy(src, dst, bytes, 0));
}
static CUresult drv_mem_cpy_htod(CUdeviceptr dst, const void *src, size_t bytes) {
  FAKE_CALL(mem_cpy_htod, dst, bytes, do_mem_cpy(dst, (void *)(uintptr_t)src, bytes, 1));
}

static CUresult drv_mem_host_alloc(void **host, size_t bytes, unsigned int flags) {
  FAKE_CALL(mem_host_alloc, bytes, flags, do_mem_host_alloc(host, bytes, flags));
}
static CUresult drv_mem_free_host(void *host) { FAKE_CALL(mem_free_host, host, 0, do_mem_free_host(host)); }
static CUresult drv_mem_cpy_dtoh_async(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKE_CALL(mem_cpy_dtoh_async, src, bytes, do_mem_cpy_async(src, dst, bytes, stream, 0));
}
static CUresult drv_mem_cpy_htod_async(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
  FAKE_CALL(mem_cpy_htod_async, dst, bytes, do_mem_cpy_async(dst, (void *)(uintptr_t)src, bytes, stream, 1));
}
static CUresult drv_stream_create(CUstream *stream, unsigned int flags) {
  FAKE_CALL(stream_create, flags, 0, do_stream_create(stream, flags));
}
static CUresult drv_stream_destroy(CUstream stream) { FAKE_CALL(stream_destroy, stream, 0, do_stream_destroy(stream)); }

/* Sharing between processes. An exported descriptor is a real one (a memfd), so that a test
 * counts descriptors in /proc/self/fd and close() works on it, and it carries what names the
 * memory, as the real driver's does: the fake reads its record back on import. A descriptor
 * that holds no record (forged), or names a handle released since (stale), is refused with
 * CUDA_ERROR_INVALID_VALUE; an import is a new id naming the same memory (contents shared). */
#define FAKE_EXPORT_MAGIC 0x66616b65657870ull /* "fakeexp" */
typedef struct export_record {
  uint64_t magic;
  uint64_t id;     /* the exported handle's id */
  uint64_t size;
  int64_t device;
} export_record;

static CUresult do_mem_export(void *shareable, CUmemGenericAllocationHandle id, CUmemAllocationHandleType type,
                              unsigned long long flags) {
  if (!shareable) return misuse(CUDA_ERROR_INVALID_VALUE, "shareable is NULL");
  if (flags) return misuse(CUDA_ERROR_INVALID_VALUE, "flags %llu are not 0", flags);
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  handle *h = hmap_get(&fk.handles, id);
  if (!h) return misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %llu", (unsigned long long)id);
  if (!h->exportable) return CUDA_ERROR_INVALID_VALUE; /* created without the handle type: as CUDA */
  int fd = memfd_create("fake-cuda-export", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  export_record rec = {FAKE_EXPORT_MAGIC, h->id, h->size, h->device};
  if (pwrite(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *(int *)shareable = fd;
  fk.ledger.exports++;
  return CUDA_SUCCESS;
}

static CUresult do_mem_import(CUmemGenericAllocationHandle *out, void *os_handle, CUmemAllocationHandleType type) {
  if (!out) return misuse(CUDA_ERROR_INVALID_VALUE, "handle is NULL");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = (int)(intptr_t)os_handle;
  export_record rec;
  if (fd < 0 || pread(fd, &rec, sizeof rec, 0) != (ssize_t)sizeof rec || rec.magic != FAKE_EXPORT_MAGIC)
    return CUDA_ERROR_INVALID_VALUE; /* not a descriptor of exported memory */
  handle *h = hmap_get(&fk.handles, rec.id);
  if (!h) return CUDA_ERROR_INVALID_VALUE; /* its memory was released */
  uint64_t id = next_id++;
  h->refs++;
  hmap_put(&fk.handles, id, h);
  hmap_put(&fk.imports, id, h);
  fk.ledger.live_handles++;
  fk.ledger.live_handle_bytes += h->size;
  fk.ledger.imports++;
  *out = id;
  return CUDA_SUCCESS;
}

static CUresult do_mem_get_properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle id) {
  if (!prop) return misuse(CUDA_ERROR_INVALID_VALUE, "prop is NULL");
  handle *h = hmap_get(&fk.handles, id);
  if (!h) return misuse(CUDA_ERROR_INVALID_VALUE, "unknown or released handle %llu", (unsigned long long)id);
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = h->device;
  prop->requestedHandleTypes = h->exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return CUDA_SUCCESS;
}

static CUresult drv_mem_export_to_shareable_handle(void *shareable, CUmemGenericAllocationHandle hnd,
                                                   CUmemAllocationHandleType type, unsigned long long flags) {
  FAKE_CALL(mem_export_to_shareable_handle, hnd, type, do_mem_export(shareable, hnd, type, flags));
}
static CUresult drv_mem_import_from_shareable_handle(CUmemGenericAllocationHandle *hnd, void *os_handle,
                                                     CUmemAllocationHandleType type) {
  FAKE_CALL(mem_import_from_shareable_handle, os_handle, type, do_mem_import(hnd, os_handle, type));
}
static CUresult drv_mem_get_allocation_properties_from_handle(CUmemAllocationProp *prop,
                                                              CUmemGenericAllocationHandle hnd) {
  FAKE_CALL(mem_get_allocation_properties_from_handle, hnd, 0, do_mem_get_properties(prop, hnd));
}

/* cuStreamGetCaptureInfo (12.3 form): the timeline's capture of the stream. Edge data: all
 * default, reported as NULL. */
static CUresult do_stream_get_capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                                           CUgraph *graph, const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                           size_t *count) {
  if (!status) return misuse(CUDA_ERROR_INVALID_VALUE, "cuStreamGetCaptureInfo without a status");
  uint64_t capture = 0;
  const CUgraphNode *d = NULL;
  size_t n = 0;
  if (is_legacy_stream(stream) && tl_capturing_streams()) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = tl_capture_info(stream, &capture, &d, &n) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = capture;
  if (graph) *graph = (CUgraph)(uintptr_t)capture;
  if (deps) *deps = d;
  if (edges) *edges = NULL;
  if (count) *count = n;
  return CUDA_SUCCESS;
}
static CUresult drv_stream_get_capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id,
                                            CUgraph *graph, const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                            size_t *count) {
  FAKE_CALL(stream_get_capture_info, stream, 0,
            do_stream_get_capture_info(stream, status, id, graph, deps, edges, count));
}

/* cuGraphNodeGetDependencies (12.3 form): with deps NULL the count; else up to *count of them
 * (the rest of a larger array NULL) and *count the number stored. */
static CUresult do_graph_node_get_dependencies(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *edges,
                                               size_t *count) {
  const CUgraphNode *d;
  size_t n;
  if (!count || tl_node_deps(node, &d, &n)) return misuse(CUDA_ERROR_INVALID_VALUE, "unknown graph node %p", (void *)node);
  if (edges && !deps) return misuse(CUDA_ERROR_INVALID_VALUE, "edge data asked without the dependencies");
  if (!deps) {
    *count = n;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < *count; i++) {
    deps[i] = i < n ? d[i] : NULL;
    if (edges) memset(&edges[i], 0, sizeof edges[i]);
  }
  if (*count > n) *count = n;
  return CUDA_SUCCESS;
}
static CUresult drv_graph_node_get_dependencies(CUgraphNode node, CUgraphNode *deps, CUgraphEdgeData *edges,
                                                size_t *count) {
  FAKE_CALL(graph_node_get_dependencies, node, 0, do_graph_node_get_dependencies(node, deps, edges, count));
}

/* Filled from the X-macro, so a missing entry point fails to compile. */
static const struct vmm_driver fake_table = {
    .version = VMM_DRIVER_VERSION,
    .name = "fake",
#define FAKE_TABLE_FIELD(field, symbol) .field = drv_##field,
    VMM_DRIVER_ENTRY_POINTS(FAKE_TABLE_FIELD)
#undef FAKE_TABLE_FIELD
};

/* The same table without the capture-graph queries, as a driver older than CUDA 12.3. */
const struct vmm_driver *fake_driver_without_capture_graph(void) {
  static struct vmm_driver table;
  table = fake_table;
  table.stream_get_capture_info = NULL;
  table.graph_node_get_dependencies = NULL;
  return &table;
}

/* ---- Control and inspection ----------------------------------------------------------- */
static fake_options resolve_options(const fake_options *in) {
  fake_options o = in ? *in : (fake_options){0};
  if (o.device_count == 0) o.device_count = 1;
  if (o.device_count < 0 || o.device_count > FAKE_MAX_DEVICES) {
    fprintf(stderr, "fake_driver: device_count %d is not in 1..%d\n", o.device_count, FAKE_MAX_DEVICES);
    abort();
  }
  if (o.granularity == 0) o.granularity = 2 * MIB;
  if (o.capacity == 0) o.capacity = 80 * GIB;
  if (o.va_space == 0) o.va_space = 1024 * GIB;
  if (o.host_mem_available == 0) o.host_mem_available = 64 * GIB;
  o.integrated = o.integrated != 0;
  o.peer_access = o.peer_access >= 0;
  o.record_calls = o.record_calls >= 0;
  return o;
}

static void free_mapping_node(avl *node) {
  mapping *m = (mapping *)node;
  handle *h = m->handle;
  if (--h->mappings == 0 && h->released) tl_forget(&h->acc), free(h);
  free(m);
}

static void free_reservation_node(avl *node) { free(node); }

static void free_host_alloc_node(avl *node) {
  free((void *)(uintptr_t)node->key);
  free(node);
}

const struct vmm_driver *fake_driver_reset(const fake_options *opts) {
  fake_options resolved = resolve_options(opts);
  pthread_mutex_lock(&fk_lock);
  avl_free(fk.mappings, free_mapping_node); /* frees released handles; live ones go with the map */
  avl_free(fk.reservations, free_reservation_node);
  avl_free(fk.host_allocs, free_host_alloc_node);
  for (size_t i = 0; i < fk.handles.cap; i++) /* an imported handle is named by several ids */
    if (fk.handles.keys[i]) {
      handle *h = fk.handles.vals[i];
      if (--h->refs == 0) free_handle(h);
    }
  hmap_free(&fk.handles, 0);
  hmap_free(&fk.imports, 0);
  hmap_free(&fk.events, 0);
  hmap_free(&fk.streams, 0);
  free(fk.log);
  unsigned generation = fk.generation;
  memset(&fk, 0, sizeof fk);
  tl_reset();
  fk.generation = generation + 1;
  fk.opts = resolved;
  for (int d = 0; d < FAKE_MAX_DEVICES; d++) fk.capacity[d] = resolved.capacity;
  fk.next_va = FAKE_VA_BASE;
  fk.test_thread = pthread_self();
  __atomic_store_n(&other_thread_delay_us, 0, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&fk_lock);
  return &fake_table;
}

const struct vmm_driver *fake_driver(void) { return &fake_table; }

void fake_set_other_thread_delay(unsigned us) { __atomic_store_n(&other_thread_delay_us, us, __ATOMIC_RELAXED); }

void fake_fail_nth(vmm_driver_entry entry, unsigned nth, CUresult result, int persistent) {
  if ((unsigned)entry >= VMM_DRV_ENTRY_COUNT) return;
  pthread_mutex_lock(&fk_lock);
  fk.rules[entry] = (fault_rule){nth, 0, result, persistent};
  pthread_mutex_unlock(&fk_lock);
}

void fake_fail_nth_any(unsigned nth, CUresult result, int persistent) {
  pthread_mutex_lock(&fk_lock);
  fk.any_rule = (fault_rule){nth, 0, result, persistent};
  pthread_mutex_unlock(&fk_lock);
}

void fake_clear_faults(void) {
  pthread_mutex_lock(&fk_lock);
  memset(fk.rules, 0, sizeof fk.rules);
  memset(&fk.any_rule, 0, sizeof fk.any_rule);
  pthread_mutex_unlock(&fk_lock);
}

unsigned fake_faults_fired(void) {
  pthread_mutex_lock(&fk_lock);
  unsigned fired = fk.faults_fired;
  pthread_mutex_unlock(&fk_lock);
  return fired;
}

void fake_set_capacity(int device, size_t bytes) {
  if (device < 0 || device >= FAKE_MAX_DEVICES) return;
  pthread_mutex_lock(&fk_lock);
  fk.capacity[device] = bytes;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_host_mem_available(size_t bytes) {
  pthread_mutex_lock(&fk_lock);
  fk.opts.host_mem_available = bytes;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_export_refused(int refused) {
  pthread_mutex_lock(&fk_lock);
  fk.export_refused = refused != 0;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_integrated(int integrated) {
  pthread_mutex_lock(&fk_lock);
  fk.opts.integrated = integrated != 0;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_strict_capture(int strict) {
  pthread_mutex_lock(&fk_lock);
  fk.strict_capture = strict;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_events_pending(int pending) {
  pthread_mutex_lock(&fk_lock);
  fk.events_pending = pending;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_event_lag(uint64_t ops) {
  pthread_mutex_lock(&fk_lock);
  fk.event_lag = ops;
  pthread_mutex_unlock(&fk_lock);
}

void fake_advance_clock(uint64_t ops) {
  pthread_mutex_lock(&fk_lock);
  fk.clock += ops;
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_capturing(CUstream stream, int capturing) {
  if (is_legacy_stream(stream)) return; /* the legacy stream cannot capture */
  pthread_mutex_lock(&fk_lock);
  tl_capture_state(stream, capturing);
  pthread_mutex_unlock(&fk_lock);
}

void fake_get_ledger(fake_ledger *out) {
  pthread_mutex_lock(&fk_lock);
  *out = fk.ledger;
  pthread_mutex_unlock(&fk_lock);
}

int fake_ledger_clean(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  int clean = !l.live_handles && !l.live_mappings && !l.reservations && !l.live_events && !l.ctx_pushed &&
              !l.primary_retained && !l.errors && !l.live_host_allocs && !l.live_streams;
  if (!clean) {
    fprintf(stderr,
            "fake_driver: not clean: %zu handles (%zu bytes), %zu mappings (%zu bytes), %zu reservations "
            "(%zu bytes), %zu events, %zu pushed contexts, %zu retained primary contexts, %zu misuse errors, "
            "%zu pinned host allocations (%zu bytes), %zu streams\n",
            l.live_handles, l.live_handle_bytes, l.live_mappings, l.mapped_bytes, l.reservations, l.reserved_bytes,
            l.live_events, l.ctx_pushed, l.primary_retained, l.errors, l.live_host_allocs, l.pinned_host_bytes,
            l.live_streams);
    if (l.errors) fprintf(stderr, "fake_driver: first misuse: %s\n", fake_first_error());
  }
  size_t violations = fake_violations(FAKE_VIOLATION_KINDS);
  for (size_t i = 0; i < violations && fake_violation_text(i); i++)
    fprintf(stderr, "fake_driver: timeline violation: %s\n", fake_violation_text(i));
  return clean && !violations;
}

const char *fake_first_error(void) {
  pthread_mutex_lock(&fk_lock);
  const char *text = fk.ledger.errors ? fk.first_error : NULL;
  pthread_mutex_unlock(&fk_lock);
  return text;
}

size_t fake_call_count(void) {
  pthread_mutex_lock(&fk_lock);
  size_t n = fk.log_len;
  pthread_mutex_unlock(&fk_lock);
  return n;
}

/* The pointer is valid until the next driver call or reset. */
const fake_call *fake_call_at(size_t index) {
  pthread_mutex_lock(&fk_lock);
  const fake_call *call = index < fk.log_len ? &fk.log[index] : NULL;
  pthread_mutex_unlock(&fk_lock);
  return call;
}

size_t fake_calls_since(size_t from, vmm_driver_entry entry) {
  pthread_mutex_lock(&fk_lock);
  size_t n = 0;
  for (size_t i = from; i < fk.log_len; i++) n += fk.log[i].entry == entry;
  pthread_mutex_unlock(&fk_lock);
  return n;
}

int fake_write(CUdeviceptr ptr, const void *src, size_t n) {
  pthread_mutex_lock(&fk_lock);
  int rc = copy_mapped(ptr, (void *)(uintptr_t)src, n, 1) == CUDA_SUCCESS ? 0 : -1;
  pthread_mutex_unlock(&fk_lock);
  return rc;
}

int fake_read(CUdeviceptr ptr, void *dst, size_t n) {
  pthread_mutex_lock(&fk_lock);
  int rc = copy_mapped(ptr, dst, n, 0) == CUDA_SUCCESS ? 0 : -1;
  pthread_mutex_unlock(&fk_lock);
  return rc;
}

size_t fake_mapped_size_at(CUdeviceptr ptr) {
  pthread_mutex_lock(&fk_lock);
  mapping *m = mapping_containing(ptr);
  size_t size = m ? m->size : 0;
  pthread_mutex_unlock(&fk_lock);
  return size;
}

int fake_access_granted(CUdeviceptr ptr, int dev) {
  if (dev < 0 || dev >= FAKE_MAX_DEVICES) return 0;
  pthread_mutex_lock(&fk_lock);
  mapping *m = mapping_containing(ptr);
  int granted = m && (m->access >> dev & 1u);
  pthread_mutex_unlock(&fk_lock);
  return granted;
}

/* ---- Device timeline ----------------------------------------------------------------- */

uint64_t fake_owner_new(void) {
  pthread_mutex_lock(&fk_lock);
  uint64_t owner = tl_owner_new();
  pthread_mutex_unlock(&fk_lock);
  return owner;
}

int fake_kernel(CUstream stream, CUdeviceptr ptr, size_t n, uint64_t owner) {
  pthread_mutex_lock(&fk_lock);
  int rc = tl_capture_kernel(stream, ptr, n, owner) ? 0 : access_range(stream, ptr, n, owner, "kernel");
  pthread_mutex_unlock(&fk_lock);
  return rc;
}

void fake_program_wait(CUstream waiter, CUstream waited) {
  pthread_mutex_lock(&fk_lock);
  tl_program_wait(waiter, waited);
  pthread_mutex_unlock(&fk_lock);
}

uint64_t fake_graph_last(void) {
  pthread_mutex_lock(&fk_lock);
  uint64_t graph = tl_last_graph();
  pthread_mutex_unlock(&fk_lock);
  return graph;
}

void fake_graph_launch(uint64_t graph, CUstream stream) {
  pthread_mutex_lock(&fk_lock);
  size_t n;
  const tl_kernel *k = tl_graph(graph, &n);
  for (size_t i = 0; i < n; i++) (void)access_range(stream, k[i].ptr, k[i].len, k[i].owner, "replayed kernel");
  pthread_mutex_unlock(&fk_lock);
}

void fake_set_release_guard(int device, int (*forbids)(void *ctx), void *ctx) {
  pthread_mutex_lock(&fk_lock);
  tl_set_guard(device, forbids, ctx);
  pthread_mutex_unlock(&fk_lock);
}

size_t fake_violations(fake_violation_kind kind) {
  pthread_mutex_lock(&fk_lock);
  size_t n = tl_violations(kind);
  pthread_mutex_unlock(&fk_lock);
  return n;
}

/* The text stays valid until the next reset. */
const char *fake_violation_text(size_t i) {
  pthread_mutex_lock(&fk_lock);
  const char *text = tl_violation_text(i);
  pthread_mutex_unlock(&fk_lock);
  return text;
}

void fake_violations_clear(void) {
  pthread_mutex_lock(&fk_lock);
  tl_violations_clear();
  pthread_mutex_unlock(&fk_lock);
}
