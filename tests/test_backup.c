/* Backups through the copy engine (VMM_PAUSE_BACKUP with the pinned staging), on the fake
 * driver: the pipeline's chunking at odd sizes (each chunk's device copies counted against a model), the
 * copier's slices of segments that start and end off 2 MiB and 4 KiB boundaries (1 byte, 4097
 * bytes, 2 MiB +- 1, several in a huge page; nothing written outside them), contents
 * bit-identical over cycles, the staging released after every call or kept,
 * the synchronous copies where the staging is off or the driver table older, a host that
 * cannot hold the backups, faults at every driver call the copies make (fail the Nth, once and
 * from N on, until a run meets none), a free, a snapshot and other calls while a copy runs
 * outside the arena lock, concurrent pauses of different tags from several threads, and
 * destroy while paused. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "internal.h"
#include "test_util.h"

#define G ((size_t)64 << 10) /* the fake's granularity in these tests */
#define S1 TU_STREAM(1)

static CUdeviceptr dptr(void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* The bytes [start, start+len) of the pattern of `seed`: byte x is x * 131 + seed + x / 4093
 * (mod 256), so that no two chunks or pages of one allocation hold the same bytes. */
static void pattern(unsigned char *buf, size_t start, size_t len, unsigned seed) {
  size_t r = start % 4093;
  unsigned char v = (unsigned char)(start * 131u + seed + start / 4093);
  for (size_t i = 0; i < len; i++) {
    buf[i] = v;
    v = (unsigned char)(v + 131u);
    if (++r == 4093) r = 0, v++;
  }
}

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char buf[4096];
  for (size_t off = 0; off < n; off += sizeof buf) {
    size_t len = n - off < sizeof buf ? n - off : sizeof buf;
    pattern(buf, off, len, seed);
    assert_int_equal(fake_write(dptr(p) + off, buf, len), 0);
  }
}

/* 1 if [p, p+n) holds fill(p, n, seed), 0 if it holds something else or is not mapped. */
static int holds(void *p, size_t n, unsigned seed) {
  unsigned char buf[4096], want[4096];
  for (size_t off = 0; off < n; off += sizeof buf) {
    size_t len = n - off < sizeof buf ? n - off : sizeof buf;
    if (fake_read(dptr(p) + off, buf, len)) return 0;
    pattern(want, off, len, seed);
    if (memcmp(buf, want, len)) return 0;
  }
  return 1;
}

static void *tagged(vmm_arena *a, const char *tag, size_t bytes) {
  vmm_tag_push(tag);
  void *p = tu_alloc(a, bytes, VMM_KIND_PACKAGE, S1);
  vmm_tag_pop();
  return p;
}

/* An arena on a fresh fake of granularity G with the staging set as VMMARENA_PAUSE_STAGING
 * would (NULL: the default). */
static vmm_arena *arena(const char *staging, const struct vmm_driver *drv) {
  fake_options fo = {.granularity = G};
  fake_driver_reset(&fo);
  vmm_config cfg = tu_config();
  if (staging) assert_int_equal(vmm_config_set(&cfg, "VMMARENA_PAUSE_STAGING", staging), VMM_OK);
  if (drv) cfg.driver = drv;
  vmm_arena *a = NULL;
  assert_int_equal(vmm_arena_create(&cfg, &a), VMM_OK);
  return a;
}

static size_t pinned_bytes(void) {
  fake_ledger l;
  fake_get_ledger(&l);
  return l.pinned_host_bytes;
}

static const vmm_mapping *record(vmm_arena *a, void *p) { return vmm_table_find(&a->table, dptr(p)); }

/* ---- Chunking ------------------------------------------------------------------------ */

static const struct {
  const char *staging;
  size_t chunk;        /* a quarter of the staging, in whole pages */
  int gaps;            /* an untagged granule after each allocation: no two follow on the device */
  size_t granules[12]; /* allocation sizes in granules, 0 ends */
} layouts[] = {
    {"1M", 256 << 10, 0, {1, 0}},                             /* one granule, less than a chunk */
    {"1M", 256 << 10, 0, {5, 0}},                             /* one allocation, not a multiple of the chunk */
    {"1M", 256 << 10, 0, {3, 1, 7, 2, 9, 1, 1, 4, 0}},        /* chunks across allocations */
    {"1M", 256 << 10, 1, {3, 1, 7, 2, 9, 1, 1, 4, 0}},        /* the same, apart on the device */
    {"3M", 768 << 10, 0, {13, 11, 1, 12, 0}},                 /* a staging that is no power of two */
    {"1M", 256 << 10, 0, {40, 0}},                            /* many chunks, the buffers reused */
    {"64M", 16 << 20, 0, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}}, /* many small allocations in one chunk */
    {"64M", 16 << 20, 1, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}}, /* the same, apart */
};

typedef struct alloc {
  void *p;
  size_t bytes;
  unsigned seed;
} alloc;

static int by_address(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)((const alloc *)x)->p, b = (uintptr_t)((const alloc *)y)->p;
  return a < b ? -1 : a > b;
}

/* Device copies the pipeline makes for allocations x (by address), back to back, cut into
 * chunks of `chunk` bytes: one per run of allocations inside a chunk that follow each other on
 * the device. */
static size_t device_copies(const alloc *x, size_t n, size_t chunk) {
  size_t total = 0, count = 0;
  for (size_t i = 0; i < n; i++) total += x[i].bytes;
  for (size_t at = 0; at < total; at += chunk) {
    size_t end = total - at < chunk ? total : at + chunk;
    const alloc *prev = NULL;
    for (size_t i = 0, start = 0; i < n; start += x[i++].bytes) {
      if (start >= end || start + x[i].bytes <= at) continue;
      count += !prev || (char *)prev->p + prev->bytes != (char *)x[i].p;
      prev = &x[i];
    }
  }
  return count;
}

/* One pause and resume of tag "w": each direction's device copies against the model, four
 * staging buffers of a chunk each, released with the copy; the contents come back. */
static void chunked_cycle(vmm_arena *a, const alloc *x, size_t n, size_t chunk, const char *what) {
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_OK);
  if (fake_calls_since(from, VMM_DRV_mem_cpy_dtoh_async) != device_copies(x, n, chunk))
    fail_msg("%s: %zu device copies to the host, the model says %zu", what,
             fake_calls_since(from, VMM_DRV_mem_cpy_dtoh_async), device_copies(x, n, chunk));
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_host_alloc), 4);
  for (size_t i = from; i < fake_call_count(); i++)
    if (fake_call_at(i)->entry == VMM_DRV_mem_host_alloc) assert_int_equal(fake_call_at(i)->a0, chunk);
  assert_int_equal(pinned_bytes(), 0); /* released with the copy */
  tu_check(a);
  from = fake_call_count();
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_OK);
  assert_int_equal(fake_calls_since(from, VMM_DRV_mem_cpy_htod_async), device_copies(x, n, chunk));
  assert_int_equal(pinned_bytes(), 0);
  for (size_t i = 0; i < n; i++)
    if (!holds(x[i].p, x[i].bytes, x[i].seed)) fail_msg("%s: allocation %zu differs", what, i);
}

/* Each layout. */
static void chunking_at_odd_sizes(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof layouts / sizeof layouts[0]; c++) {
    vmm_arena *a = arena(layouts[c].staging, NULL);
    alloc x[12];
    size_t n = 0;
    for (; layouts[c].granules[n]; n++) {
      x[n] = (alloc){tagged(a, "w", layouts[c].granules[n] * G), layouts[c].granules[n] * G, (unsigned)(c * 16 + n)};
      fill(x[n].p, x[n].bytes, x[n].seed);
      if (layouts[c].gaps) (void)tu_alloc(a, G, VMM_KIND_PACKAGE, S1); /* freed by destroy */
    }
    qsort(x, n, sizeof *x, by_address); /* the order the pause copies them in */
    for (int cycle = 0; cycle < 3; cycle++) {
      char what[64];
      snprintf(what, sizeof what, "layout %zu, cycle %d", c, cycle);
      chunked_cycle(a, x, n, layouts[c].chunk, what);
    }
    for (size_t i = 0; i < n; i++) assert_int_equal(vmm_arena_free(a, x[i].p, S1), VMM_OK);
    tu_destroy(a);
  }
}

/* ---- The host side's slices at odd sizes --------------------------------------------- */

#define AREA (24 * MiB) /* the host area of the copies below, 2 MiB aligned, and the device allocation */

/* One copy's segments, in copy order: their offsets into the host area and into one device
 * allocation, and sizes. They start and end off 2 MiB and 4 KiB boundaries, share huge pages of
 * the host area, follow each other on the device in runs, and go back in the host area. */
static const struct {
  size_t host, dev, bytes;
} odd[] = {
    {1 * MiB + 3, 0, 1},                              /* 1 byte */
    {1 * MiB + 4, 1, 4097},                           /* in the same huge page; next on the device */
    {2 * MiB - 4095, 8 * 1024 + 5, 2 * MiB - 1},      /* across a 2 MiB boundary */
    {4 * MiB, 3 * MiB, 2 * MiB},                      /* one whole huge page */
    {6 * MiB + 1, 5 * MiB, 2 * MiB + 1},              /* next on the device, and the one after too */
    {9 * MiB - 7, 7 * MiB + 1, 5 * MiB + 123},        /* several huge pages, ends off everything */
    {15 * MiB, 13 * MiB, 4096},
    {15 * MiB + 4096, 13 * MiB + 4096, 2 * MiB + 1},  /* right after it in both */
    {20 * MiB - 1, 16 * MiB, 1},                      /* the last byte of a huge page */
    {18 * MiB, 16 * MiB + 1, 2 * MiB - 1},            /* before the one above in the host area */
};
#define ODD (sizeof odd / sizeof odd[0])

static unsigned char pat[AREA], want_host[AREA], want_dev[AREA]; /* the device's bytes; what each side holds after */

/* The device's pattern, and what the host area (0xA5 outside the segments) and the device
 * (zeroed, then copied back) hold after the copies. */
static void odd_images(void) {
  pattern(pat, 0, AREA, 9);
  memset(want_host, 0xA5, AREA);
  memset(want_dev, 0, AREA);
  for (size_t i = 0; i < ODD; i++) {
    memcpy(want_host + odd[i].host, pat + odd[i].dev, odd[i].bytes);
    memcpy(want_dev + odd[i].dev, pat + odd[i].dev, odd[i].bytes);
  }
}

/* A 2 MiB aligned host area of AREA bytes; *map: what to unmap. */
static unsigned char *host_area(char **map) {
  *map = mmap(NULL, AREA + 2 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(*map != MAP_FAILED);
  return (unsigned char *)(((uintptr_t)*map + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
}

static void same_bytes(const unsigned char *got, const unsigned char *want, const char *side, const char *what) {
  if (!memcmp(got, want, AREA)) return;
  size_t off = 0;
  while (got[off] == want[off]) off++;
  fail_msg("%s: %s byte %zu is 0x%02x, not 0x%02x", what, side, off, got[off], want[off]);
}

/* The segments above copied to the host area and back with the copier itself, with chunks of
 * 256 KiB, 2.25 MiB and 8 MiB: the bytes arrive bit-identical, and nothing outside the segments
 * is written (touch ahead included). */
static void slices_at_odd_sizes(void **state) {
  (void)state;
  static const char *const stagings[] = {"1M", "9M", "32M"};
  static unsigned char dev[AREA];
  char *map, what[64];
  unsigned char *h = host_area(&map);
  odd_images();
  for (size_t st = 0; st < 3; st++) {
    vmm_arena *a = arena(stagings[st], NULL);
    void *p = tu_alloc(a, AREA, VMM_KIND_PACKAGE, S1);
    assert_int_equal(vmm_arena_quiesce(a), VMM_OK); /* the copies come after its use, as a pause orders them */
    vmm_copy_segment seg[ODD];
    for (size_t i = 0; i < ODD; i++) seg[i] = (vmm_copy_segment){dptr(p) + odd[i].dev, (char *)h + odd[i].host, odd[i].bytes};
    snprintf(what, sizeof what, "staging %s", stagings[st]);
    vmm_copy_error err;
    assert_int_equal(vmm_copier_get(a), VMM_OK);
    for (int cycle = 0; cycle < 2; cycle++) {
      memset(h, 0xA5, AREA);
      assert_int_equal(fake_write(dptr(p), pat, AREA), 0);
      if (!vmm_copier_run(a, seg, ODD, true, &err)) fail_msg("%s: to the host: %s", what, err.what);
      same_bytes(h, want_host, "host", what);
      memset(dev, 0, AREA);
      assert_int_equal(fake_write(dptr(p), dev, AREA), 0);
      if (!vmm_copier_run(a, seg, ODD, false, &err)) fail_msg("%s: to the device: %s", what, err.what);
      assert_int_equal(fake_read(dptr(p), dev, AREA), 0);
      same_bytes(dev, want_dev, "device", what);
    }
    vmm_driver_ctx_leave(a);
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    tu_destroy(a);
  }
  munmap(map, AREA + 2 * MiB);
}

/* ---- The staging: released, kept, off; an older driver table ------------------------- */

/* Pause and resume of one 9-granule allocation "w", contents checked. */
static void cycle(vmm_arena *a, void *p) {
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_OK);
  assert_int_equal(fake_mapped_size_at(dptr(p)), 0);
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_OK);
  assert_true(holds(p, 9 * G, 7));
}

static void staging_kept_or_not(void **state) {
  (void)state;
  for (int keep = 0; keep < 2; keep++) {
    vmm_arena *a = arena(keep ? "1M,keep" : "1M", NULL);
    void *p = tagged(a, "w", 9 * G);
    fill(p, 9 * G, 7);
    size_t from = fake_call_count();
    for (int i = 0; i < 3; i++) cycle(a, p);
    /* released after every copy, or allocated once and kept */
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_host_alloc), keep ? 4 : 6 * 4);
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_free_host), keep ? 0 : 6 * 4);
    assert_int_equal(fake_calls_since(from, VMM_DRV_stream_create), 4); /* made once */
    assert_int_equal(pinned_bytes(), keep ? 1 * MiB : 0);
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    tu_destroy(a); /* frees what was kept, destroys the streams */
  }
}

/* With the staging off, or a driver table of version 2, backups use synchronous copies. */
static void synchronous_copies(void **state) {
  (void)state;
  static struct vmm_driver older;
  for (int how = 0; how < 2; how++) {
    fake_options fo = {.granularity = G};
    older = *fake_driver_reset(&fo);
    older.version = 2;
    vmm_arena *a = how ? arena(NULL, &older) : arena("off", NULL);
    void *p = tagged(a, "w", 9 * G), *q = tagged(a, "w", 2 * G);
    fill(p, 9 * G, 7);
    fill(q, 2 * G, 8);
    size_t from = fake_call_count();
    cycle(a, p);
    assert_true(holds(q, 2 * G, 8));
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_cpy_dtoh), 2);
    assert_int_equal(fake_calls_since(from, VMM_DRV_mem_cpy_htod), 2);
    for (int e = VMM_DRV_mem_host_alloc; e <= VMM_DRV_stream_destroy; e++)
      assert_int_equal(fake_calls_since(0, (vmm_driver_entry)e), 0);
    assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
    assert_int_equal(vmm_arena_free(a, q, S1), VMM_OK);
    tu_destroy(a);
  }
}

/* Backups the host cannot hold (MemAvailable) are refused with the numbers; nothing changed. */
static void host_cannot_hold_the_backups(void **state) {
  (void)state;
  vmm_arena *a = arena(NULL, NULL);
  void *p = tagged(a, "w", 9 * G);
  fill(p, 9 * G, 7);
  fake_set_host_mem_available(9 * G - 1);
  size_t from = fake_call_count();
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_ERR_OUT_OF_MEMORY);
  char want[160];
  snprintf(want, sizeof want, "%zu B) to copy, MemAvailable 576.0 KiB (%zu B); nothing changed", 9 * G, 9 * G - 1);
  if (!strstr(vmm_arena_last_error(a), "pause(\"w\"): the host cannot hold the backups") ||
      !strstr(vmm_arena_last_error(a), want))
    fail_msg("%s", vmm_arena_last_error(a));
  for (size_t i = from; i < fake_call_count(); i++) { /* queries only */
    vmm_driver_entry e = fake_call_at(i)->entry;
    if (e != VMM_DRV_stream_is_capturing && e != VMM_DRV_host_memory_available && e != VMM_DRV_ctx_push_current &&
        e != VMM_DRV_ctx_pop_current)
      fail_msg("a refused pause called %s", vmm_driver_entry_name(e));
  }
  assert_int_equal(record(a, p)->state, VMM_MAP_LIVE);
  assert_true(holds(p, 9 * G, 7));
  fake_set_host_mem_available(9 * G);
  cycle(a, p);
  assert_int_equal(vmm_arena_free(a, p, S1), VMM_OK);
  tu_destroy(a);
}

/* VMMARENA_PAUSE_STAGING: a size of 1 MiB to 4 GiB, with ",keep", or off; anything else names
 * the variable and the value. */
static void staging_setting(void **state) {
  (void)state;
  static const struct {
    const char *value;
    size_t want;          /* when accepted */
    const char *refusal;  /* or the message */
  } cases[] = {
      {"64M", 64 * MiB, NULL},
      {"1M,keep", 1 * MiB | VMM_STAGING_KEEP, NULL},
      {"4G", 4 * GiB, NULL},
      {"off", 0, NULL},
      {"0", 0, NULL},
      {"512K", 0, "VMMARENA_PAUSE_STAGING=\"512K\": the staging is off (0) or between 1 MiB and 4 GiB"},
      {"5G", 0, "VMMARENA_PAUSE_STAGING=\"5G\": the staging is off (0) or between 1 MiB and 4 GiB"},
      {"64M,kept", 0, "VMMARENA_PAUSE_STAGING=\"64M,kept\": expected SIZE or SIZE,keep"},
      {"", 0, "VMMARENA_PAUSE_STAGING=\"\": a size must not be empty"},
      {"-1M", 0, "VMMARENA_PAUSE_STAGING=\"-1M\": a size must not be negative"},
  };
  vmm_config def;
  vmm_config_init(&def);
  assert_int_equal(def.pause_staging, 32 * MiB);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    vmm_config cfg = def;
    vmm_status st = vmm_config_set(&cfg, "VMMARENA_PAUSE_STAGING", cases[i].value);
    if (cases[i].refusal) {
      assert_int_equal(st, VMM_ERR_INVALID_ARGUMENT);
      if (!strstr(vmm_config_error(), cases[i].refusal)) fail_msg("%s: %s", cases[i].value, vmm_config_error());
      assert_int_equal(cfg.pause_staging, def.pause_staging);
    } else {
      assert_int_equal(st, VMM_OK);
      assert_int_equal(cfg.pause_staging, cases[i].want);
    }
  }
  setenv("VMMARENA_PAUSE_STAGING", "2M,keep", 1);
  vmm_config cfg = def;
  assert_int_equal(vmm_config_from_env(&cfg), VMM_OK);
  assert_int_equal(cfg.pause_staging, 2 * MiB | VMM_STAGING_KEEP);
  unsetenv("VMMARENA_PAUSE_STAGING");
}

/* ---- Faults at every driver call of the copies --------------------------------------- */

/* The entry points a staged copy calls (cuStreamDestroy only at destroy: test_countdown.c). */
static const vmm_driver_entry copy_entries[] = {
    VMM_DRV_host_memory_available, VMM_DRV_stream_create,     VMM_DRV_mem_host_alloc, VMM_DRV_mem_cpy_dtoh_async,
    VMM_DRV_mem_cpy_htod_async,    VMM_DRV_stream_synchronize, VMM_DRV_mem_free_host,
};

/* Each allocation is whole: live and mapped with its contents, or paused with its backup. */
static void each_whole(vmm_arena *a, const alloc *x, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    const vmm_mapping *m = record(a, x[i].p);
    if (!m) fail_msg("%s: allocation %zu lost its record", what, i);
    if (m->state == VMM_MAP_LIVE && !m->backup && holds(x[i].p, x[i].bytes, x[i].seed)) continue;
    if (m->state == VMM_MAP_PAUSED && m->backup) continue;
    fail_msg("%s: allocation %zu is neither live with its contents nor paused with a backup (state %d, backup %p)",
             what, i, (int)m->state, m->backup);
  }
}

/* Tag "w" (three allocations over several 256 KiB chunks) and tag "v": pause and resume each
 * with `entry` failing at its Nth call. Every call returns OK or the fault's status (or, where a
 * pause failed, "nothing is paused") with the numbers; the arena is sound and every allocation
 * whole after each; with the faults gone a resume finishes, the contents are back, the next
 * cycle works and no pinned memory is left. Returns the faults that fired. */
static unsigned countdown_run(vmm_driver_entry entry, unsigned nth, CUresult code, int persistent) {
  vmm_arena *a = arena("1M", NULL);
  alloc x[4] = {{tagged(a, "w", 5 * G), 5 * G, 1}, {tagged(a, "w", 1 * G), 1 * G, 2}, {tagged(a, "w", 9 * G), 9 * G, 3},
                {tagged(a, "v", 3 * G), 3 * G, 4}};
  for (size_t i = 0; i < 4; i++) fill(x[i].p, x[i].bytes, x[i].seed);
  char what[128];
  snprintf(what, sizeof what, "%s N=%u %s %s", vmm_driver_entry_name(entry), nth, persistent ? "persistent" : "once",
           code == CUDA_ERROR_OUT_OF_MEMORY ? "OOM" : "UNKNOWN");
  vmm_status fault = code == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER;
  fake_fail_nth(entry, nth, code, persistent);
  static const char *const tags[] = {"w", "w", "v", "v"};
  for (int step = 0; step < 4; step++) {
    vmm_status st = step % 2 ? vmm_arena_resume(a, tags[step]) : vmm_arena_pause(a, tags[step], VMM_PAUSE_BACKUP);
    const char *msg = vmm_arena_last_error(a);
    if (st != VMM_OK && st != fault && st != VMM_ERR_INVALID_ARGUMENT) fail_msg("%s step %d: %s: %s", what, step, vmm_status_name(st), msg);
    if (st != VMM_OK && !strpbrk(msg, "0123456789")) fail_msg("%s step %d: no numbers in: %s", what, step, msg);
    if (st == fault && entry == VMM_DRV_mem_host_alloc && !strstr(msg, "allocating pinned staging buffer"))
      fail_msg("%s step %d: %s", what, step, msg);
    tu_check(a);
    each_whole(a, x, 4, what);
  }
  unsigned fired = fake_faults_fired();
  fake_clear_faults();
  for (int t = 0; t < 2; t++) {
    vmm_status st = vmm_arena_resume(a, t ? "v" : "w");
    if (st != VMM_OK && st != VMM_ERR_INVALID_ARGUMENT) fail_msg("%s: resume after: %s", what, vmm_arena_last_error(a));
  }
  each_whole(a, x, 4, what);
  assert_int_equal(tu_snapshot(a).kind[VMM_KIND_PACKAGE].paused_count, 0);
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_OK);
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_OK);
  each_whole(a, x, 4, what);
  if (pinned_bytes()) fail_msg("%s: %zu pinned bytes held after the last resume", what, pinned_bytes());
  for (size_t i = 0; i < 4; i++) assert_int_equal(vmm_arena_free(a, x[i].p, S1), VMM_OK);
  tu_destroy(a);
  return fired;
}

/* Several chunks posted at once, touches in flight: a failed pause ends them all. */
static void faults_at_every_copy_call(void **state) {
  (void)state;
  static const CUresult codes[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
  size_t runs = 0;
  for (size_t e = 0; e < sizeof copy_entries / sizeof copy_entries[0]; e++) {
    unsigned points = 0;
    for (int c = 0; c < 2; c++)
      for (int persistent = 0; persistent < 2; persistent++)
        for (unsigned nth = 1; countdown_run(copy_entries[e], nth, codes[c], persistent); nth++) points++, runs++;
    if (points < 4) fail_msg("%s: only %u injection points", vmm_driver_entry_name(copy_entries[e]), points);
  }
  printf("copy countdown: %zu runs that met a fault, every one sound\n", runs);
}

/* ---- A tag paused partly with backups, partly without -------------------------------- */

/* x1 and x2 paused without backups, y1 and y2 (allocated later into the holes between them)
 * with: resume goes in address order, run by run, so a copy that fails leaves every
 * allocation it did not resume after every one it resumed. */
static void mixed_backups_resume_in_address_order(void **state) {
  (void)state;
  vmm_arena *a = arena("1M", NULL);
  void *x1 = tagged(a, "w", 3 * G), *h1 = tu_alloc(a, 5 * G, VMM_KIND_PACKAGE, S1);
  void *x2 = tagged(a, "w", 3 * G), *h2 = tu_alloc(a, 6 * G, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_DISCARD), VMM_OK);
  assert_int_equal(vmm_arena_free(a, h1, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, h2, S1), VMM_OK);
  void *y1 = tagged(a, "w", 5 * G), *y2 = tagged(a, "w", 6 * G);
  assert_true(y1 == h1 && y2 == h2); /* the holes were reused: with and without backups alternate */
  fill(y1, 5 * G, 1);
  fill(y2, 6 * G, 2);
  assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_OK);
  alloc by[4] = {{x1, 3 * G, 0}, {x2, 3 * G, 0}, {y1, 5 * G, 1}, {y2, 6 * G, 2}};
  qsort(by, 4, sizeof *by, by_address);
  size_t lead = 0; /* those without a backup before the first with one: resumed before the copy */
  while (!by[lead].seed) lead++;
  fake_fail_nth(VMM_DRV_mem_cpy_htod_async, 1, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_ERR_DRIVER);
  char want[80];
  snprintf(want, sizeof want, "resume(\"w\"): %zu of 4 allocation(s) resumed; the rest stay paused", lead);
  if (!strstr(vmm_arena_last_error(a), want)) fail_msg("%s", vmm_arena_last_error(a));
  for (size_t i = 0; i < 4; i++) {
    const vmm_mapping *m = record(a, by[i].p);
    assert_int_equal(m->state, i < lead ? VMM_MAP_LIVE : VMM_MAP_PAUSED);
    if (i == lead) assert_true(m->handle_count > 0 && m->backup); /* mapped, with its backup: a retry copies */
  }
  tu_check(a);
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_OK);
  assert_true(holds(y1, 5 * G, 1) && holds(y2, 6 * G, 2));
  for (int i = 0; i < 4; i++) assert_int_equal(vmm_arena_free(a, by[i].p, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- Other calls while a copy runs outside the arena lock ----------------------------- */

/* The fake's table with the device-to-host copy held at its first call until released. */
static struct vmm_driver held_table;
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cv = PTHREAD_COND_INITIALIZER;
static int held_state; /* 0 armed, 1 holding, 2 released */

static CUresult held_dtoh(void *dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  pthread_mutex_lock(&held_mu);
  if (held_state == 0) {
    held_state = 1;
    pthread_cond_broadcast(&held_cv);
    while (held_state == 1) pthread_cond_wait(&held_cv, &held_mu);
  }
  pthread_mutex_unlock(&held_mu);
  return fake_driver()->mem_cpy_dtoh_async(dst, src, bytes, stream);
}

static void held_set(int s) {
  pthread_mutex_lock(&held_mu);
  if (s == 1)
    while (held_state != 1) pthread_cond_wait(&held_cv, &held_mu); /* wait until a copy is held */
  held_state = s;
  pthread_cond_broadcast(&held_cv);
  pthread_mutex_unlock(&held_mu);
}

typedef struct pauser {
  vmm_arena *a;
  const char *tag;
  vmm_pause_mode mode;
  vmm_status st;
  int done;
  pthread_t th;
} pauser;

static void *pause_thread(void *arg) {
  pauser *p = arg;
  p->st = vmm_arena_pause(p->a, p->tag, p->mode);
  __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void start_pause(pauser *p, vmm_arena *a, const char *tag, vmm_pause_mode mode) {
  *p = (pauser){a, tag, mode, VMM_OK, 0, 0};
  assert_int_equal(pthread_create(&p->th, NULL, pause_thread, p), 0);
}

/* While a pause of "w" copies (held): a free of its allocation is refused and the snapshot says
 * "moving"; the arena is sound; allocations and frees of other memory go on; a second pause of
 * "w" waits for its turn and then finds it paused; a pause of "v" waits for the copier and then
 * succeeds. */
static void calls_during_a_copy(void **state) {
  (void)state;
  fake_options fo = {.granularity = G};
  held_table = *fake_driver_reset(&fo);
  held_table.mem_cpy_dtoh_async = held_dtoh;
  held_state = 0;
  vmm_arena *a = arena("1M", &held_table);
  void *w = tagged(a, "w", 9 * G), *v = tagged(a, "v", 3 * G);
  fill(w, 9 * G, 5);
  fill(v, 3 * G, 6);
  pauser first, again, other;
  start_pause(&first, a, "w", VMM_PAUSE_BACKUP);
  held_set(1);
  assert_int_equal(vmm_arena_free(a, w, S1), VMM_ERR_UNKNOWN_POINTER);
  if (!strstr(vmm_arena_last_error(a), "is being paused or resumed by another call")) fail_msg("%s", vmm_arena_last_error(a));
  char json[8192];
  assert_int_equal(vmm_arena_snapshot_json(a, json, sizeof json, NULL), VMM_OK);
  assert_non_null(strstr(json, "\"state\":\"moving\""));
  tu_check(a);
  void *t = tu_alloc(a, 2 * G, VMM_KIND_TRANSIENT, S1);
  assert_int_equal(vmm_arena_free(a, t, S1), VMM_OK);
  start_pause(&again, a, "w", VMM_PAUSE_DISCARD);
  start_pause(&other, a, "v", VMM_PAUSE_BACKUP);
  struct timespec nap = {0, 50 * 1000 * 1000};
  nanosleep(&nap, NULL);
  assert_int_equal(__atomic_load_n(&again.done, __ATOMIC_ACQUIRE), 0); /* waits for its turn */
  assert_int_equal(__atomic_load_n(&other.done, __ATOMIC_ACQUIRE), 0); /* waits for the copier */
  held_set(2);
  pthread_join(first.th, NULL);
  pthread_join(again.th, NULL);
  pthread_join(other.th, NULL);
  assert_int_equal(first.st, VMM_OK);
  assert_int_equal(other.st, VMM_OK);
  assert_int_equal(again.st, VMM_ERR_INVALID_ARGUMENT); /* "w" was paused meanwhile */
  assert_int_equal(vmm_arena_resume(a, "w"), VMM_OK);
  assert_int_equal(vmm_arena_resume(a, "v"), VMM_OK);
  assert_true(holds(w, 9 * G, 5));
  assert_true(holds(v, 3 * G, 6));
  assert_int_equal(vmm_arena_free(a, w, S1), VMM_OK);
  assert_int_equal(vmm_arena_free(a, v, S1), VMM_OK);
  tu_destroy(a);
}

/* ---- Several threads, each pausing and resuming its own tag --------------------------- */

typedef struct worker {
  vmm_arena *a;
  char tag[16];
  alloc x[3];
  int failed;
  pthread_t th;
} worker;

static void *cycles_thread(void *arg) {
  worker *w = arg;
  for (int c = 0; c < 25 && !w->failed; c++) {
    vmm_pause_mode mode = c % 5 == 4 ? VMM_PAUSE_DISCARD : VMM_PAUSE_BACKUP;
    if (vmm_arena_pause(w->a, w->tag, mode) != VMM_OK || vmm_arena_resume(w->a, w->tag) != VMM_OK) w->failed = 1;
    for (size_t i = 0; i < 3 && mode == VMM_PAUSE_BACKUP; i++)
      if (!holds(w->x[i].p, w->x[i].bytes, w->x[i].seed)) w->failed = 2;
    if (mode == VMM_PAUSE_DISCARD)
      for (size_t i = 0; i < 3; i++) fill(w->x[i].p, w->x[i].bytes, w->x[i].seed); /* discarded: written again */
  }
  return NULL;
}

static void concurrent_pauses_of_different_tags(void **state) {
  (void)state;
  enum { THREADS = 6 };
  vmm_arena *a = arena("1M", NULL);
  static worker w[THREADS];
  for (int t = 0; t < THREADS; t++) {
    w[t] = (worker){.a = a};
    snprintf(w[t].tag, sizeof w[t].tag, "tag %d", t);
    for (size_t i = 0; i < 3; i++) {
      size_t bytes = (size_t)(1 + (t + (int)i) % 7) * G;
      w[t].x[i] = (alloc){tagged(a, w[t].tag, bytes), bytes, (unsigned)(t * 8 + (int)i)};
      fill(w[t].x[i].p, bytes, w[t].x[i].seed);
    }
  }
  for (int t = 0; t < THREADS; t++) assert_int_equal(pthread_create(&w[t].th, NULL, cycles_thread, &w[t]), 0);
  for (int t = 0; t < THREADS; t++) pthread_join(w[t].th, NULL);
  for (int t = 0; t < THREADS; t++) {
    if (w[t].failed) fail_msg("thread %d: %s", t, w[t].failed == 2 ? "contents differ" : vmm_arena_last_error(a));
    for (size_t i = 0; i < 3; i++) assert_int_equal(vmm_arena_free(a, w[t].x[i].p, S1), VMM_OK);
  }
  assert_int_equal(pinned_bytes(), 0);
  tu_destroy(a);
}

/* ---- Destroy while paused ------------------------------------------------------------ */

/* Paused with backups (staging released, or kept), paused without, in a scope or not: destroy
 * leaves nothing (tu_destroy checks the ledger: no pinned memory, no stream). */
static void destroy_while_paused(void **state) {
  (void)state;
  for (int how = 0; how < 4; how++) {
    vmm_arena *a = arena(how == 1 ? "1M,keep" : "1M", NULL);
    if (how == 3) assert_int_equal(vmm_retention_begin(a), VMM_OK);
    void *w = tagged(a, "w", 9 * G);
    (void)tagged(a, "d", 3 * G); /* live at destroy (how 2), or paused without a backup */
    fill(w, 9 * G, 1);
    assert_int_equal(vmm_arena_pause(a, "w", VMM_PAUSE_BACKUP), VMM_OK);
    if (how != 2) assert_int_equal(vmm_arena_pause(a, "d", VMM_PAUSE_DISCARD), VMM_OK);
    assert_int_equal(pinned_bytes(), how == 1 ? 1 * MiB : 0);
    tu_destroy(a);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(chunking_at_odd_sizes),
      cmocka_unit_test(slices_at_odd_sizes),
      cmocka_unit_test(staging_kept_or_not),
      cmocka_unit_test(synchronous_copies),
      cmocka_unit_test(host_cannot_hold_the_backups),
      cmocka_unit_test(staging_setting),
      cmocka_unit_test(faults_at_every_copy_call),
      cmocka_unit_test(mixed_backups_resume_in_address_order),
      cmocka_unit_test(calls_during_a_copy),
      cmocka_unit_test(concurrent_pauses_of_different_tags),
      cmocka_unit_test(destroy_while_paused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
