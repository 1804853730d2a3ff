/* The copy engine of backups (VMM_PAUSE_BACKUP): a few pinned staging buffers, each with its
 * own stream, and host threads. Device to host, the device copies the next chunks into their
 * buffers while the threads copy the finished ones out into the pageable backups, out of up to
 * SLOTS finished chunks at once, in slices cut on the backups' 2 MiB pages, so that one thread
 * writes a fresh huge page (the others writing into it would wait for its fault), and idle
 * threads touch the backups' pages of the chunks to come (docs/benchmarks.md, "Pause and
 * resume", says why); host to device the other way round, one chunk at a time, in slices of
 * any 4 KiB.
 * Only the calling thread calls the driver (so a run's calls come in one order); the worker
 * threads only copy (and touch) host memory. One copy of an arena runs at a time (they share
 * the link) and outside the arena lock. Also here: the wait for the allocations' streams that
 * comes before a pause copies or unmaps them, and the condition on which pause and resume
 * calls wait for their turn (pause.c). */
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define SLOTS 4                          /* staging buffers, each with its stream */
#define MAX_THREADS 16                   /* host threads copying at once, the caller included */
#define MIN_SLICE ((size_t)256 << 10)    /* the least a thread copies at a time */
#define PAGE ((size_t)4096)
#define HUGE ((size_t)2 << 20)           /* a huge page: backups start on one (backup.c) */
#define SPIN_NS 2000000ull               /* a thread spins this long for the next chunk, then sleeps */

typedef struct vmm_copier vmm_copier;

/* A copy: the segments back to back; start[i] is where segment i begins, start[n] the total. */
typedef struct plan {
  const vmm_copy_segment *seg; /* the segments, in copy order */
  size_t *start;               /* n + 1 offsets */
  size_t n;                    /* segments */
  bool to_host;                /* device -> host (pause), else host -> device (resume) */
} plan;

/* One chunk's host side, cut into slices that the threads take one at a time. */
typedef struct job {
  const plan *p;     /* the copy it belongs to */
  size_t at, len;    /* bytes [at, at + len) of the copy */
  char *buf;         /* the chunk's staging buffer */
  size_t want;       /* bytes a slice takes at least (the last one excepted) */
  bool pages;        /* slices end on the backups' 2 MiB pages */
  size_t next, done; /* the first byte not taken; bytes copied (atomic) */
} job;

struct vmm_copier {
  vmm_arena *a;            /* the arena it copies for */
  pthread_mutex_t mu;      /* a leaf: never held while taking the arena lock */
  pthread_cond_t work;     /* the threads sleep here when no chunk came for SPIN_NS */
  pthread_cond_t finished; /* the caller waits for a chunk's last slice */
  pthread_cond_t touched;  /* the caller waits for the touches of a chunk it posts */
  pthread_cond_t idle;     /* a copy waits for the one running */
  pthread_cond_t turn;     /* with the arena lock: a pause or resume waits for another's end */
  pthread_t thread[MAX_THREADS - 1]; /* the worker threads */
  int threads, sleepers, ids; /* workers started; workers asleep on `work`; ids given */
  bool started, stopping, busy; /* threads started once; destroy stops them; a copy runs */
  int waiting;             /* copies waiting for the one running */
  job jobs[SLOTS];         /* the chunks posted, oldest first from `head` */
  int head, count;         /* the oldest posted; how many */
  size_t posted;           /* jobs posted so far: the threads spin on it (atomic) */
  const plan *touching;    /* the copy whose backups idle threads touch ahead; NULL: none */
  size_t front;            /* the end of the last chunk posted: touches start there or later */
  size_t touch_next, ahead; /* the next byte to touch; how far past `front` at most */
  size_t touch_step;       /* bytes one write faults in: 2 MiB with huge pages, else 4 KiB */
  size_t touch_at[MAX_THREADS - 1]; /* where each worker touches now; SIZE_MAX: nowhere */
  char *buf[SLOTS];        /* pinned; NULL while released */
  CUstream stream[SLOTS];  /* made on first use, destroyed by stop */
  int owed;                /* atomic: a copy whose last wait failed may still run on the streams */
};

/* ---- Errors ------------------------------------------------------------------------- */

void vmm_copier_set_error(vmm_copy_error *e, CUresult r, vmm_driver_entry entry, const char *fmt, ...) {
  e->result = r;
  e->entry = entry;
  e->status = entry == VMM_DRV_ENTRY_COUNT || r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->what, sizeof e->what, fmt, ap);
  va_end(ap);
}

vmm_status vmm_copier_fail(vmm_arena *a, const vmm_copy_error *e, const char *call, const char *then) {
  if (e->entry == VMM_DRV_ENTRY_COUNT) return vmm_errors_fail(a, e->status, "%s: %s; %s", call, e->what, then);
  return vmm_errors_fail_driver(a, e->result, e->entry, "%s: %s; %s", call, e->what, then);
}

/* ---- The copier and the turns of pause and resume ------------------------------------ */

/* Bytes one write faults in: 2 MiB where transparent huge pages are on (the backups ask for
 * them), else 4 KiB. */
static size_t fault_bytes(void) {
  char s[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f && !fgets(s, sizeof s, f)) s[0] = '\0';
  if (f) fclose(f);
  return s[0] && !strstr(s, "[never]") ? HUGE : PAGE;
}

vmm_status vmm_copier_get(vmm_arena *a) {
  if (a->copier) return VMM_OK;
  vmm_copier *c = calloc(1, sizeof *c);
  if (!c) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the copier (%zu B); nothing changed", sizeof *c);
  c->a = a;
  c->touch_step = fault_bytes();
  for (int i = 0; i < MAX_THREADS - 1; i++) c->touch_at[i] = SIZE_MAX;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->work, NULL);
  pthread_cond_init(&c->finished, NULL);
  pthread_cond_init(&c->touched, NULL);
  pthread_cond_init(&c->idle, NULL);
  pthread_cond_init(&c->turn, NULL);
  a->copier = c;
  return VMM_OK;
}

void vmm_copier_wait_turn(vmm_arena *a) { pthread_cond_wait(&a->copier->turn, &a->lock); }

void vmm_copier_end_turn(vmm_arena *a) {
  if (a->copier) pthread_cond_broadcast(&a->copier->turn);
}

/* ---- Slices -------------------------------------------------------------------------- */

/* The segment holding byte `at` of the copy (the last one starting at or before it). */
static size_t segment_of(const plan *p, size_t at) {
  size_t lo = 0, hi = p->n;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->start[mid] <= at) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* The first place at or after byte x of the copy (x < total) where its host side enters
 * another 2 MiB page: a 2 MiB boundary of the host address, or a segment's start. */
static size_t page_cut(const plan *p, size_t x) {
  size_t s = segment_of(p, x), in = x - p->start[s], rest = p->start[s + 1] - x;
  size_t into = ((uintptr_t)p->seg[s].host + in) & (HUGE - 1);
  if (in == 0 || into == 0) return x;
  return x + (HUGE - into < rest ? HUGE - into : rest);
}

/* The end of the slice of job j that starts at byte `off` of it: `want` bytes on, moved on to
 * the next page cut where the job cuts on pages; the job's end at most. */
static size_t slice_end(const job *j, size_t off) {
  if (j->len - off <= j->want) return j->len;
  if (!j->pages) return off + j->want;
  size_t end = page_cut(j->p, j->at + off + j->want) - j->at;
  return end < j->len ? end : j->len;
}

/* Copies bytes [off, end) of job j between its staging buffer and the segments' host side. */
static void copy_range(const job *j, size_t off, size_t end) {
  const plan *p = j->p;
  for (size_t s = segment_of(p, j->at + off); off < end; s++) {
    size_t at = j->at + off, in = at - p->start[s], n = p->start[s + 1] - at;
    if (n > end - off) n = end - off;
    if (p->to_host) memcpy(p->seg[s].host + in, j->buf + off, n);
    else memcpy(j->buf + off, p->seg[s].host + in, n);
    off += n;
  }
}

/* Writes a zero at the start of each page of the host side of bytes [at, end) of the copy
 * (every `step` bytes of host memory), which nothing has copied into yet, so that the copy out
 * finds them faulted in. */
static void touch_range(const plan *p, size_t at, size_t end, size_t step) {
  for (size_t s = segment_of(p, at); at < end; s++) {
    size_t in = at - p->start[s], n = p->start[s + 1] - at < end - at ? p->start[s + 1] - at : end - at;
    for (uintptr_t h = (uintptr_t)p->seg[s].host + in, stop = h + n; h < stop; h = (h | (step - 1)) + 1)
      *(volatile char *)h = 0;
    at += n;
  }
}

/* ---- Host threads -------------------------------------------------------------------- */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins (no lock held) until *word reaches `want` (at_least) or differs from it (else), for
 * at most SPIN_NS; returns whether it did. Waking a sleeping thread for every chunk costs
 * more than a chunk takes to copy on some machines (virtual ones above all). */
static bool spin(const size_t *word, size_t want, bool at_least) {
  uint64_t t0 = vmm_driver_now_ns();
  for (unsigned i = 1;; i++) {
    size_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (at_least ? v >= want : v != want) return true;
    if (!(i & 255) && vmm_driver_now_ns() - t0 > SPIN_NS) return false;
    cpu_relax();
  }
}

/* The oldest posted job with slices left to take, or NULL. mu held. */
static job *open_job(vmm_copier *c) {
  for (int k = 0; k < c->count; k++) {
    job *j = &c->jobs[(c->head + k) % SLOTS];
    if (j->next < j->len) return j;
  }
  return NULL;
}

/* Takes and copies slices, of job `only` or else of the oldest job with some left, until none
 * is left; mu held, released while copying. Returns whether it copied any. A job's last slice
 * wakes the caller. */
static bool take_slices(vmm_copier *c, job *only) {
  bool took = false;
  for (job *j; (j = only ? (only->next < only->len ? only : NULL) : open_job(c)) != NULL; took = true) {
    size_t off = j->next, end = slice_end(j, off);
    j->next = end;
    pthread_mutex_unlock(&c->mu);
    copy_range(j, off, end);
    pthread_mutex_lock(&c->mu);
    if (__atomic_add_fetch(&j->done, end - off, __ATOMIC_RELEASE) == j->len) pthread_cond_signal(&c->finished);
  }
  return took;
}

/* Whether a worker touches a byte of the copy before x. mu held. */
static bool touching_below(const vmm_copier *c, size_t x) {
  for (int i = 0; i < MAX_THREADS - 1; i++)
    if (c->touch_at[i] < x) return true;
  return false;
}

/* Touch ahead: takes the next 2 MiB page of the backups past the chunks posted (at most
 * `ahead` bytes past them) and writes into it. mu held, released while writing. Returns
 * whether it touched any. */
static bool touch_some(vmm_copier *c, int me) {
  const plan *p = c->touching;
  if (!p) return false;
  size_t total = p->start[p->n], stop = total - c->front > c->ahead ? c->front + c->ahead : total;
  if (c->touch_next < c->front) c->touch_next = c->front;
  if (c->touch_next >= stop) return false;
  size_t at = c->touch_next, end = at + 1 < total ? page_cut(p, at + 1) : total;
  c->touch_next = end;
  c->touch_at[me] = at;
  pthread_mutex_unlock(&c->mu);
  touch_range(p, at, end, c->touch_step);
  pthread_mutex_lock(&c->mu);
  c->touch_at[me] = SIZE_MAX;
  pthread_cond_broadcast(&c->touched);
  return true;
}

static void *worker(void *arg) {
  vmm_copier *c = arg;
  pthread_mutex_lock(&c->mu);
  int me = c->ids++;
  while (!c->stopping) {
    if (take_slices(c, NULL) || touch_some(c, me)) continue;
    size_t seen = c->posted;
    pthread_mutex_unlock(&c->mu);
    bool posted = spin(&c->posted, seen, false);
    pthread_mutex_lock(&c->mu);
    if (!posted && c->posted == seen && !c->stopping) {
      c->sleepers++;
      pthread_cond_wait(&c->work, &c->mu);
      c->sleepers--;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static int cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Starts the worker threads, once: one fewer than the CPUs, at most MAX_THREADS - 1. Those
 * that fail to start are done without; signals are blocked in them. */
static void start_threads(vmm_copier *c) {
  if (c->started) return;
  c->started = true;
  int want = cpu_count() < MAX_THREADS ? cpu_count() : MAX_THREADS;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 0; i < want - 1; i++)
    if (pthread_create(&c->thread[c->threads], NULL, worker, c) == 0) c->threads++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Posts bytes [at, at + len) of the copy, in `buf`, to the threads, once no touch ahead
 * writes into them: slices of len / 2 (threads + 1) bytes or more, in whole pages (whole 2 MiB
 * pages of the backups to the host). */
static void post(vmm_copier *c, const plan *p, size_t at, size_t len, char *buf) {
  bool pages = p->to_host;
  size_t parts = 2 * (size_t)(c->threads + 1), want = ((len + parts - 1) / parts + PAGE - 1) & ~(PAGE - 1);
  if (want < MIN_SLICE) want = MIN_SLICE;
  if (pages) want = (want + HUGE - 1) & ~(HUGE - 1);
  pthread_mutex_lock(&c->mu);
  c->front = at + len;
  while (touching_below(c, c->front)) pthread_cond_wait(&c->touched, &c->mu);
  c->jobs[(c->head + c->count++) % SLOTS] = (job){p, at, len, buf, want, pages, 0, 0};
  __atomic_store_n(&c->posted, c->posted + 1, __ATOMIC_RELEASE);
  if (c->sleepers && (len > want || c->touching)) pthread_cond_broadcast(&c->work);
  pthread_mutex_unlock(&c->mu);
}

/* Copies slices of the oldest job posted until it has none left, waits for the threads' last
 * ones and retires it. */
static void finish(vmm_copier *c) {
  pthread_mutex_lock(&c->mu);
  job *j = &c->jobs[c->head];
  size_t len = j->len;
  take_slices(c, j);
  if (j->done < len) {
    pthread_mutex_unlock(&c->mu);
    (void)spin(&j->done, len, true);
    pthread_mutex_lock(&c->mu);
  }
  while (j->done < len) pthread_cond_wait(&c->finished, &c->mu);
  c->head = (c->head + 1) % SLOTS, c->count--;
  pthread_mutex_unlock(&c->mu);
}

/* Starts the touching ahead of a copy to the host. */
static void touch_begin(vmm_copier *c, const plan *p, size_t chunk) {
  pthread_mutex_lock(&c->mu);
  c->touching = p, c->front = 0, c->touch_next = 0, c->ahead = 2 * SLOTS * chunk;
  __atomic_store_n(&c->posted, c->posted + 1, __ATOMIC_RELEASE);
  if (c->sleepers) pthread_cond_broadcast(&c->work);
  pthread_mutex_unlock(&c->mu);
}

/* Ends the touching and waits for the touches in flight (the backups may be freed next). */
static void touch_end(vmm_copier *c) {
  pthread_mutex_lock(&c->mu);
  c->touching = NULL;
  while (touching_below(c, SIZE_MAX)) pthread_cond_wait(&c->touched, &c->mu);
  pthread_mutex_unlock(&c->mu);
}

/* ---- Staging ------------------------------------------------------------------------- */

/* Bytes of each staging buffer: the setting over SLOTS, in whole pages. */
static size_t chunk_bytes(const vmm_arena *a) {
  size_t staging = a->cfg.pause_staging & ~VMM_STAGING_KEEP;
  if (staging < VMM_STAGING_MIN) staging = VMM_STAGING_MIN;
  if (staging > VMM_STAGING_MAX) staging = VMM_STAGING_MAX;
  return staging / SLOTS & ~(PAGE - 1);
}

/* Frees the staging buffers. One whose free fails is kept for the next try (logged), except
 * during destroy, which forgets it. */
static void release_buffers(vmm_copier *c) {
  vmm_arena *a = c->a;
  char b[32];
  for (int i = 0; i < SLOTS; i++) {
    if (!c->buf[i]) continue;
    CUresult r = VMM_DRV(a, mem_free_host, c->buf[i]);
    if (r != CUDA_SUCCESS)
      vmm_errors_log(1, a->cfg.log_level, "vmmarena: device %d: freeing pinned staging buffer %d of %d (%s at %p): "
              "cuMemFreeHost returned %s (%d)%s", a->cfg.device, i + 1, SLOTS, vmm_errors_fmt_bytes(chunk_bytes(a), b),
              (void *)c->buf[i], vmm_errors_cu_name(a, r), (int)r, a->destroying ? "" : "; tried again later");
    if (r == CUDA_SUCCESS || a->destroying) c->buf[i] = NULL;
  }
}

/* Releases the staging when no copy runs or waits, unless the setting keeps it. mu held. */
static void trim(vmm_copier *c) {
  if (!c->busy && !c->waiting && !(c->a->cfg.pause_staging & VMM_STAGING_KEEP)) release_buffers(c);
}

/* Starts the threads and makes the streams and the staging buffers that are missing. */
static bool prepare(vmm_copier *c, vmm_copy_error *err) {
  vmm_arena *a = c->a;
  size_t chunk = chunk_bytes(a);
  char b[2][32];
  start_threads(c);
  for (int i = 0; i < SLOTS; i++) {
    CUresult r = c->stream[i] ? CUDA_SUCCESS : VMM_DRV(a, stream_create, &c->stream[i], CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
      c->stream[i] = NULL;
      vmm_copier_set_error(err, r, VMM_DRV_stream_create, "creating copy stream %d of %d", i + 1, SLOTS);
      return false;
    }
  }
  for (int i = 0; i < SLOTS; i++) {
    void *p = NULL;
    CUresult r = c->buf[i] ? CUDA_SUCCESS : VMM_DRV(a, mem_host_alloc, &p, chunk, 0);
    if (r != CUDA_SUCCESS) {
      vmm_copier_set_error(err, r, VMM_DRV_mem_host_alloc, "allocating pinned staging buffer %d of %d (%s, %s in all)",
                         i + 1, SLOTS, vmm_errors_fmt_bytes(chunk, b[0]), vmm_errors_fmt_bytes(chunk * SLOTS, b[1]));
      return false;
    }
    if (p) c->buf[i] = p;
  }
  return true;
}

/* ---- The pipeline -------------------------------------------------------------------- */

/* Queues the device side of bytes [at, at + len) of the copy on slot i's stream: one call per
 * run of segments that follow each other on the device (many small allocations in a row take
 * one call). */
static bool issue(vmm_copier *c, const plan *p, int i, size_t at, size_t len, vmm_copy_error *err) {
  vmm_arena *a = c->a;
  for (size_t s = segment_of(p, at), off = 0; off < len;) {
    size_t first = s, in = at + off - p->start[s], n = p->start[s + 1] - (at + off);
    CUdeviceptr d = p->seg[s].dev + in;
    if (n > len - off) n = len - off;
    for (s++; off + n < len && p->seg[s].dev == d + n; s++) n += p->seg[s].bytes < len - off - n ? p->seg[s].bytes : len - off - n;
    char *h = c->buf[i] + off;
    CUresult r = p->to_host ? VMM_DRV(a, mem_cpy_dtoh_async, h, d, n, c->stream[i])
                            : VMM_DRV(a, mem_cpy_htod_async, d, h, n, c->stream[i]);
    if (r != CUDA_SUCCESS) {
      char b[2][32];
      vmm_copier_set_error(err, r, p->to_host ? VMM_DRV_mem_cpy_dtoh_async : VMM_DRV_mem_cpy_htod_async,
                         "copying %s %s 0x%llx (%zu B into the %s allocation at 0x%llx) %s staging buffer %d of %d",
                         vmm_errors_fmt_bytes(n, b[0]), p->to_host ? "from" : "to", (unsigned long long)d, in,
                         vmm_errors_fmt_bytes(p->seg[first].bytes, b[1]), (unsigned long long)p->seg[first].dev,
                         p->to_host ? "into" : "from", i + 1, SLOTS);
      return false;
    }
    off += n;
  }
  return true;
}

/* Waits for slot i's copies of bytes [at, at + len); err NULL: a failure is not reported. */
static bool sync_slot(vmm_copier *c, int i, size_t at, size_t len, vmm_copy_error *err) {
  CUresult r = VMM_DRV(c->a, stream_synchronize, c->stream[i]);
  if (r == CUDA_SUCCESS) return true;
  char b[32];
  if (err)
    vmm_copier_set_error(err, r, VMM_DRV_stream_synchronize, "waiting for the copy of bytes %zu to %zu (%s) on stream %p",
                       at, at + len, vmm_errors_fmt_bytes(len, b), (void *)c->stream[i]);
  return false;
}

/* Takes the next chunk of the copy into slot i and queues its device side. */
static bool queue(vmm_copier *c, const plan *p, int i, size_t chunk, size_t *next, size_t *at, size_t *len, bool *busy,
                  vmm_copy_error *err) {
  size_t left = p->start[p->n] - *next;
  at[i] = *next, len[i] = left < chunk ? left : chunk;
  *next += len[i];
  busy[i] = true; /* waited for even if the issue fails half way */
  return issue(c, p, i, at[i], len[i], err);
}

/* Device to host: SLOTS chunks in flight. The caller waits for the device's chunks in the
 * order they fill and posts each to the threads, up to SLOTS at once; a chunk
 * copied out gives its buffer the next chunk. Device and host slots both go round in order. */
static bool pump_to_host(vmm_copier *c, const plan *p, size_t chunk, vmm_copy_error *err) {
  size_t total = p->start[p->n], next = 0, at[SLOTS] = {0}, len[SLOTS] = {0};
  bool busy[SLOTS] = {false}, ok = true;
  int d = 0, h = 0, posted = 0; /* device's next; host's oldest; chunks posted */
  touch_begin(c, p, chunk);
  for (int i = 0; i < SLOTS && ok && next < total; i++) ok = queue(c, p, i, chunk, &next, at, len, busy, err);
  while (ok && (busy[d] || posted)) {
    if (busy[d] && posted < SLOTS) {
      if (!(ok = sync_slot(c, d, at[d], len[d], err))) break; /* still busy: waited for again below */
      busy[d] = false;
      post(c, p, at[d], len[d], c->buf[d]);
      posted++, d = (d + 1) % SLOTS;
    } else {
      finish(c);
      posted--;
      if (next < total) ok = queue(c, p, h, chunk, &next, at, len, busy, err);
      h = (h + 1) % SLOTS;
    }
  }
  for (; posted; posted--) finish(c);
  touch_end(c);
  for (int i = 0; i < SLOTS; i++)
    if (busy[i] && !sync_slot(c, i, at[i], len[i], NULL)) __atomic_store_n(&c->owed, 1, __ATOMIC_RELEASE);
  return ok;
}

/* Host to device: the threads fill a buffer while the device copies the previous ones. */
static bool pump_to_device(vmm_copier *c, const plan *p, size_t chunk, vmm_copy_error *err) {
  size_t total = p->start[p->n], at[SLOTS] = {0}, len[SLOTS] = {0};
  bool busy[SLOTS] = {false}, ok = true;
  for (size_t next = 0, k = 0; ok && next < total; k++) {
    int i = (int)(k % SLOTS);
    if (busy[i]) {
      if (!(ok = sync_slot(c, i, at[i], len[i], err))) break; /* still busy: waited for again below */
      busy[i] = false;
    }
    size_t n = total - next < chunk ? total - next : chunk;
    post(c, p, next, n, c->buf[i]);
    finish(c);
    ok = queue(c, p, i, chunk, &next, at, len, busy, err);
  }
  for (int i = 0; i < SLOTS; i++) { /* the last copies; the first failure is the one reported */
    if (!busy[i]) continue;
    bool done = sync_slot(c, i, at[i], len[i], ok ? err : NULL);
    if (!done) __atomic_store_n(&c->owed, 1, __ATOMIC_RELEASE);
    ok = ok && done;
  }
  return ok;
}

bool vmm_copier_run(vmm_arena *a, const vmm_copy_segment *seg, size_t n, bool to_host, vmm_copy_error *err) {
  vmm_copier *c = a->copier;
  plan p = {seg, malloc((n + 1) * sizeof(size_t)), n, to_host};
  if (!p.start) {
    vmm_copier_set_error(err, CUDA_SUCCESS, VMM_DRV_ENTRY_COUNT, "host out of memory for the plan of %zu copies", n);
    return false;
  }
  p.start[0] = 0;
  for (size_t i = 0; i < n; i++) p.start[i + 1] = p.start[i] + seg[i].bytes;
  pthread_mutex_lock(&c->mu);
  for (c->waiting++; c->busy;) pthread_cond_wait(&c->idle, &c->mu);
  c->waiting--;
  c->busy = true;
  pthread_mutex_unlock(&c->mu);
  bool ok = p.start[n] == 0 || prepare(c, err);
  if (ok && p.start[n])
    ok = to_host ? pump_to_host(c, &p, chunk_bytes(a), err) : pump_to_device(c, &p, chunk_bytes(a), err);
  pthread_mutex_lock(&c->mu);
  c->busy = false;
  pthread_cond_signal(&c->idle);
  trim(c);
  pthread_mutex_unlock(&c->mu);
  free(p.start);
  return ok;
}

CUresult vmm_copier_settle(vmm_arena *a) {
  vmm_copier *c = a->copier;
  if (!c || !__atomic_load_n(&c->owed, __ATOMIC_ACQUIRE)) return CUDA_SUCCESS;
  for (int i = 0; i < SLOTS; i++) {
    CUresult r = c->stream[i] ? VMM_DRV(a, stream_synchronize, c->stream[i]) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS) return r;
  }
  __atomic_store_n(&c->owed, 0, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

/* Waits for stream s of the allocation at base unless it is among seen[0, *n) (added while
 * there is room for `cap`). */
static bool wait_once(vmm_arena *a, CUstream s, CUdeviceptr base, CUstream *seen, size_t *n, size_t cap,
                      vmm_copy_error *err) {
  for (size_t i = 0; i < *n; i++)
    if (seen[i] == s) return true;
  CUresult r = VMM_DRV(a, stream_synchronize, s);
  if (r != CUDA_SUCCESS) {
    vmm_copier_set_error(err, r, VMM_DRV_stream_synchronize, "synchronizing stream %p (of the allocation at 0x%llx)",
                       (void *)s, (unsigned long long)base);
    return false;
  }
  if (*n < cap) seen[(*n)++] = s;
  return true;
}

bool vmm_copier_wait_streams(vmm_arena *a, vmm_mapping *const *list, size_t n, vmm_copy_error *err) {
  CUstream seen[16];
  size_t n_seen = 0, cap = sizeof seen / sizeof seen[0];
  for (size_t i = 0; i < n; i++) { /* its stream, those record_stream added, its slots' other streams */
    const vmm_mapping *m = list[i];
    bool ok = wait_once(a, m->stream, m->base, seen, &n_seen, cap, err);
    for (uint32_t k = 0; ok && k < m->use_count; k++) ok = wait_once(a, m->uses[k], m->base, seen, &n_seen, cap, err);
    for (const vmm_slot_wait *w = m->page ? m->page->uses : NULL; ok && w; w = w->next)
      ok = wait_once(a, w->stream, m->base, seen, &n_seen, cap, err);
    for (const vmm_slot_wait *w = m->page ? m->page->set->waits : NULL; ok && w; w = w->next) /* freed slots' */
      if (w->page == m->page) ok = wait_once(a, w->stream, m->base, seen, &n_seen, cap, err);
    if (!ok) return false;
  }
  return true;
}

void vmm_copier_stop(vmm_arena *a) {
  vmm_copier *c = a->copier;
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = true;
  __atomic_store_n(&c->posted, c->posted + 1, __ATOMIC_RELEASE); /* ends the spinning too */
  pthread_cond_broadcast(&c->work);
  pthread_mutex_unlock(&c->mu);
  for (int i = 0; i < c->threads; i++) pthread_join(c->thread[i], NULL);
  release_buffers(c);
  for (int i = 0; i < SLOTS; i++) {
    CUresult r = c->stream[i] ? VMM_DRV(a, stream_destroy, c->stream[i]) : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
      vmm_errors_log(1, a->cfg.log_level, "vmmarena: device %d: destroying copy stream %d of %d (%p): cuStreamDestroy returned %s (%d)",
              a->cfg.device, i + 1, SLOTS, (void *)c->stream[i], vmm_errors_cu_name(a, r), (int)r);
  }
  pthread_cond_destroy(&c->work);
  pthread_cond_destroy(&c->finished);
  pthread_cond_destroy(&c->touched);
  pthread_cond_destroy(&c->idle);
  pthread_cond_destroy(&c->turn);
  pthread_mutex_destroy(&c->mu);
  free(c);
  a->copier = NULL;
}
