#include "test_util.h"

#include <pthread.h>
#include <stdio.h>

#include "internal.h"

/* Whether a release on the arena's device is a violation now: inside a retaining scope that
 * is not finishing, unless the arena is being destroyed (the fake's release guard). */
static int release_forbidden(void *ctx) {
  const vmm_arena *a = ctx;
  return vmm_retaining(a) && !a->scope_finishing && !a->destroying;
}

/* The allocations tu_alloc made and tu_free has not freed: each one's owner on the fake's
 * timeline and the stream it was allocated on, so that its kernels are declared as a correct
 * program's would be. */
typedef struct tu_owned {
  void *p;
  size_t bytes;
  CUstream stream;
  uint64_t owner;
} tu_owned;

static struct {
  pthread_mutex_t lock;
  tu_owned *items;
  size_t n, cap;
} owned = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static void own(void *p, size_t bytes, CUstream stream, uint64_t owner) {
  pthread_mutex_lock(&owned.lock);
  size_t i = 0;
  while (i < owned.n && owned.items[i].p != p) i++; /* a pointer freed by another path is reused */
  if (i == owned.n) {
    if (owned.n == owned.cap) {
      owned.cap = owned.cap ? 2 * owned.cap : 64;
      owned.items = realloc(owned.items, owned.cap * sizeof *owned.items);
      assert_non_null(owned.items);
    }
    owned.n++;
  }
  owned.items[i] = (tu_owned){p, bytes, stream, owner};
  pthread_mutex_unlock(&owned.lock);
}

/* The record of p (removed), or one with owner 0 if tu_alloc did not make it. */
static tu_owned disown(void *p) {
  tu_owned x = {p, 0, NULL, 0};
  pthread_mutex_lock(&owned.lock);
  for (size_t i = 0; i < owned.n; i++)
    if (owned.items[i].p == p) {
      x = owned.items[i];
      owned.items[i] = owned.items[--owned.n];
      break;
    }
  pthread_mutex_unlock(&owned.lock);
  return x;
}

vmm_config tu_config(void) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  cfg.driver = fake_driver();
  cfg.retain = VMM_RETAIN_ON;
  cfg.log_level = 0;
  cfg.reserve_bytes = 64 * GiB;
  cfg.grow_in_place = 0;       /* ranges packed and never grown, unless a test asks */
  cfg.unmap_in_background = 0; /* every driver call on the test's thread, in one order */
  return cfg;
}

vmm_arena *tu_arena(const fake_options *opts, const vmm_config *cfg) {
  fake_driver_reset(opts);
  vmm_config c = cfg ? *cfg : tu_config();
  c.driver = fake_driver();
  vmm_arena *a = NULL;
  vmm_status s = vmm_arena_create(&c, &a);
  if (s != VMM_OK) fprintf(stderr, "vmm_arena_create: %s: %s\n", vmm_status_name(s), vmm_create_error());
  assert_int_equal(s, VMM_OK);
  assert_non_null(a);
  fake_set_release_guard(c.device, release_forbidden, a);
  return a;
}

void tu_check(vmm_arena *a) {
  char why[256] = "";
  int rc = vmm_arena_check(a, why, sizeof why);
  if (rc) fprintf(stderr, "vmm_arena_check: %s\n", why);
  assert_int_equal(rc, 0);
}

void tu_destroy(vmm_arena *a) {
  tu_check(a);
  vmm_arena_destroy(a);
  assert_true(fake_ledger_clean());
}

void *tu_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream s) {
  void *p = NULL;
  vmm_status st = vmm_arena_alloc(a, bytes, kind, s, &p);
  if (st != VMM_OK) fprintf(stderr, "alloc %zu: %s: %s\n", bytes, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
  assert_non_null(p);
  uint64_t owner = fake_owner_new(); /* its first use: a kernel on its stream */
  assert_int_equal(fake_kernel(s, (CUdeviceptr)(uintptr_t)p, bytes, owner), 0);
  own(p, bytes, s, owner);
  return p;
}

vmm_snapshot tu_snapshot(vmm_arena *a) {
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(a, &s), VMM_OK);
  return s;
}

size_t tu_mapped_from(const void *base, size_t most) {
  size_t off = 0, size;
  while (off < most && (size = fake_mapped_size_at((CUdeviceptr)(uintptr_t)base + off)) != 0) off += size;
  return off;
}

void tu_use(void *p, CUstream s) {
  pthread_mutex_lock(&owned.lock);
  tu_owned x = {0};
  for (size_t i = 0; i < owned.n; i++)
    if (owned.items[i].p == p) x = owned.items[i];
  pthread_mutex_unlock(&owned.lock);
  if (!x.owner) fail_msg("tu_use(%p): not an allocation of tu_alloc", p);
  if (s != x.stream) fake_program_wait(s, x.stream);
  assert_int_equal(fake_kernel(s, (CUdeviceptr)(uintptr_t)p, x.bytes, x.owner), 0);
}

/* Whether p is a live allocation of a (not paused): a program uses only those. */
static bool usable(vmm_arena *a, void *p) {
  pthread_mutex_lock(&a->lock);
  uint32_t slot;
  vmm_mapping *m = vmm_table_find(&a->table, (CUdeviceptr)(uintptr_t)p);
  vmm_page *pg = m ? NULL : vmm_pages_slot_of(a, (CUdeviceptr)(uintptr_t)p, &slot);
  bool live = (m && m->state == VMM_MAP_LIVE && !m->page) || (pg && pg->m->state == VMM_MAP_LIVE);
  pthread_mutex_unlock(&a->lock);
  return live;
}

void tu_free(vmm_arena *a, void *p, CUstream s) {
  tu_owned x = disown(p);
  if (x.owner && usable(a, p)) { /* its last use, ordered before the free as a program does */
    if (s != x.stream) fake_program_wait(s, x.stream);
    assert_int_equal(fake_kernel(s, (CUdeviceptr)(uintptr_t)p, x.bytes, x.owner), 0);
  }
  vmm_status st = vmm_arena_free(a, p, s);
  if (st != VMM_OK) fprintf(stderr, "free %p: %s: %s\n", p, vmm_status_name(st), vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
}

size_t tu_first_call(size_t from, vmm_driver_entry e) {
  for (size_t i = from, end = fake_call_count(); i < end; i++)
    if (fake_call_at(i)->entry == e) return i;
  return SIZE_MAX;
}

void tu_assert_event_orders(size_t from, CUstream recorded_on, CUstream waiting) {
  size_t record = tu_first_call(from, VMM_DRV_event_record);
  if (record == SIZE_MAX) fail_msg("no event recorded since call %zu", from);
  const fake_call *r = fake_call_at(record);
  if (r->a1 != (uintptr_t)recorded_on)
    fail_msg("the first event was recorded on stream 0x%lx, not 0x%lx", (unsigned long)r->a1,
             (unsigned long)(uintptr_t)recorded_on);
  for (size_t i = record + 1, end = fake_call_count(); i < end; i++) {
    const fake_call *w = fake_call_at(i);
    if (w->entry == VMM_DRV_stream_wait_event && w->a0 == (uintptr_t)waiting && w->a1 == r->a0) return;
  }
  fail_msg("stream 0x%lx never waited for the event recorded on 0x%lx", (unsigned long)(uintptr_t)waiting,
           (unsigned long)(uintptr_t)recorded_on);
}
