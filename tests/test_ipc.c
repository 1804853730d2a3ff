/* Sharing memory between processes (src/ipc.c) on the fake driver: export of a one-handle,
 * an assembled and a page-slot allocation, import into another arena (the receiver) with the
 * contents shared, close; forged, stale, closed, wrong-size, misplaced and other-device
 * descriptors refused with the arena as it was; a driver refusal at each step undone; a
 * driver that refuses exportable memory; and no descriptor leaked over thousands of cycles
 * (exported descriptors are real ones, counted in /proc/self/fd). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#define S1 TU_STREAM(1)
#define MAX_PIECES 16

static CUdeviceptr dptr(void *p) { return (CUdeviceptr)(uintptr_t)p; }

static int open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

static vmm_config caching_config(int device) {
  vmm_config cfg = tu_config();
  cfg.caching = 1;
  cfg.retain = VMM_RETAIN_OFF;
  cfg.device = device;
  return cfg;
}

/* A second arena on the current fake (the receiving process's). */
static vmm_arena *receiver(int device) {
  vmm_config cfg = caching_config(device);
  vmm_arena *b = NULL;
  assert_int_equal(vmm_arena_create(&cfg, &b), VMM_OK);
  return b;
}

static void fill(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char *buf = malloc(n);
  assert_non_null(buf);
  for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 31u + seed);
  assert_int_equal(fake_write(p, buf, n), 0);
  free(buf);
}

static int holds(CUdeviceptr p, size_t n, unsigned seed) {
  unsigned char *buf = malloc(n);
  assert_non_null(buf);
  assert_int_equal(fake_read(p, buf, n), 0);
  int same = 1;
  for (size_t i = 0; i < n && same; i++) same = buf[i] == (unsigned char)(i * 31u + seed);
  free(buf);
  return same;
}

/* What must not change across a refused call: the fake's ledger of live objects and the
 * arena's figures. */
typedef struct state {
  size_t handles, mappings, reservations, imports;
  uint64_t physical, mapped, reserved_va;
  int fds;
} state;

static state state_of(vmm_arena *a) {
  fake_ledger l;
  fake_get_ledger(&l);
  vmm_snapshot s = tu_snapshot(a);
  tu_check(a);
  return (state){l.live_handles, l.live_mappings, l.reservations, vmm_arena_ipc_imports(a),
                 s.physical_bytes, s.mapped_bytes, s.reserved_va_bytes, open_fds()};
}

static void assert_same(state x, state y) {
  assert_int_equal(x.handles, y.handles);
  assert_int_equal(x.mappings, y.mappings);
  assert_int_equal(x.reservations, y.reservations);
  assert_int_equal(x.imports, y.imports);
  assert_int_equal(x.physical, y.physical);
  assert_int_equal(x.mapped, y.mapped);
  assert_int_equal(x.reserved_va, y.reserved_va);
  assert_int_equal(x.fds, y.fds);
}

static void export_ok(vmm_arena *a, void *p, vmm_ipc_piece *pieces, size_t *n, size_t *offset) {
  vmm_status st = vmm_arena_ipc_export(a, p, pieces, MAX_PIECES, n, offset);
  if (st != VMM_OK) fprintf(stderr, "export: %s\n", vmm_arena_last_error(a));
  assert_int_equal(st, VMM_OK);
}

static void *import_ok(vmm_arena *b, const vmm_ipc_piece *pieces, size_t n) {
  void *q = NULL;
  vmm_status st = vmm_arena_ipc_import(b, pieces, n, &q);
  if (st != VMM_OK) fprintf(stderr, "import: %s\n", vmm_arena_last_error(b));
  assert_int_equal(st, VMM_OK);
  assert_non_null(q);
  return q;
}

static void destroy_both(vmm_arena *a, vmm_arena *b) {
  tu_check(b);
  vmm_arena_destroy(b);
  tu_destroy(a);
}

static void single_handle_shared_and_closed(void **state_) {
  (void)state_;
  int fds0 = open_fds();
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(NULL, &cfg);
  vmm_arena *b = receiver(0);
  assert_int_equal(vmm_arena_ipc_exportable(a), 1);
  void *p = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  fill(dptr(p), 4 * MiB, 7);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 99;
  export_ok(a, p, pc, &n, &off);
  assert_true(n >= 1); /* new memory may come in handles of the arena's bound */
  assert_int_equal(off, 0);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(pc[i].offset, total);
    assert_true(pc[i].fd >= 0);
    total += pc[i].size;
  }
  assert_int_equal(total, 4 * MiB);
  assert_int_equal(open_fds(), fds0 + (int)n);
  /* exporting again makes no call and opens nothing */
  size_t calls = fake_call_count();
  vmm_ipc_piece again[MAX_PIECES];
  export_ok(a, p, again, &n, &off);
  assert_int_equal(again[0].fd, pc[0].fd);
  assert_int_equal(fake_calls_since(calls, VMM_DRV_mem_export_to_shareable_handle), 0);
  assert_int_equal(open_fds(), fds0 + (int)n);

  void *q = import_ok(b, pc, n);
  assert_int_equal(vmm_arena_ipc_imports(b), 1);
  assert_true(holds(dptr(q), 4 * MiB, 7));     /* the receiver reads the sender's bytes */
  fill(dptr(q) + MiB, 4096, 9);                /* and writes them */
  assert_true(holds(dptr(p) + MiB, 4096, 9));
  assert_int_equal(vmm_arena_usage(b, &(vmm_usage){0}), VMM_OK);
  vmm_snapshot sb = tu_snapshot(b);
  assert_int_equal(sb.physical_bytes, 0); /* the receiver's arena holds none of it */

  assert_int_equal(vmm_arena_ipc_close(b, q), VMM_OK);
  assert_int_equal(vmm_arena_ipc_imports(b), 0);
  assert_int_equal(vmm_arena_ipc_close(b, q), VMM_ERR_UNKNOWN_POINTER); /* twice */
  assert_non_null(strstr(vmm_arena_last_error(b), "not an open import"));
  tu_free(a, p, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK); /* the handle goes back: its descriptor closes */
  assert_int_equal(open_fds(), fds0);
  destroy_both(a, b);
  assert_int_equal(open_fds(), fds0);
}

/* A miss served by two cached handles mapped back to back. */
static void *assembled(vmm_arena *a) {
  void *x = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  void *y = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  tu_free(a, x, S1);
  tu_free(a, y, S1);
  assert_int_equal(vmm_arena_quiesce(a), VMM_OK);
  return tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
}

static void assembled_allocation_exports_every_handle(void **state_) {
  (void)state_;
  int fds0 = open_fds();
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(NULL, &cfg);
  vmm_arena *b = receiver(0);
  void *p = assembled(a);
  fill(dptr(p), 4 * MiB, 3);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 0;
  /* too little room: refused, nothing exported, and the count says what is needed */
  assert_int_equal(vmm_arena_ipc_export(a, p, pc, 1, &n, &off), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(n, 2);
  assert_int_equal(open_fds(), fds0);
  export_ok(a, p, pc, &n, &off);
  assert_int_equal(n, 2);
  assert_int_equal(pc[0].offset, 0);
  assert_int_equal(pc[1].offset, pc[0].size);
  assert_int_equal(pc[0].size + pc[1].size, 4 * MiB);
  assert_int_not_equal(pc[0].fd, pc[1].fd);
  void *q = import_ok(b, pc, n);
  assert_true(holds(dptr(q), 4 * MiB, 3));
  assert_int_equal(vmm_arena_ipc_close(b, q), VMM_OK);
  tu_free(a, p, S1);
  destroy_both(a, b);
  assert_int_equal(open_fds(), fds0);
}

static void page_slot_is_shared_with_its_offset(void **state_) {
  (void)state_;
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(NULL, &cfg);
  vmm_arena *b = receiver(0);
  void *s0 = tu_alloc(a, 4096, VMM_KIND_TRANSIENT, S1);
  void *s1 = tu_alloc(a, 4096, VMM_KIND_TRANSIENT, S1);
  fill(dptr(s1), 4096, 5);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 0;
  export_ok(a, s1, pc, &n, &off);
  assert_int_equal(n, 1);
  assert_int_equal(pc[0].size, 2 * MiB);
  assert_int_equal(off, (size_t)(dptr(s1) - (dptr(s1) & ~(CUdeviceptr)(2 * MiB - 1))));
  void *q = import_ok(b, pc, n);
  assert_true(holds(dptr(q) + off, 4096, 5));
  /* an interior pointer is refused and named */
  assert_int_equal(vmm_arena_ipc_export(a, (char *)s1 + 8, pc, MAX_PIECES, &n, &off), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(vmm_arena_ipc_close(b, q), VMM_OK);
  tu_free(a, s0, S1);
  tu_free(a, s1, S1);
  destroy_both(a, b);
}

static void refused(vmm_arena *b, const vmm_ipc_piece *pc, size_t n, vmm_status want, const char *says) {
  state before = state_of(b);
  void *q = (void *)1;
  vmm_status st = vmm_arena_ipc_import(b, pc, n, &q);
  if (st != want) fprintf(stderr, "import: %s: %s\n", vmm_status_name(st), vmm_arena_last_error(b));
  assert_int_equal(st, want);
  assert_null(q);
  if (!strstr(vmm_arena_last_error(b), says)) fprintf(stderr, "message: %s\n", vmm_arena_last_error(b));
  assert_non_null(strstr(vmm_arena_last_error(b), says));
  assert_same(before, state_of(b));
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(b, &fatal), VMM_OK); /* a refusal is not fatal */
}

static void forged_stale_and_misfit_handles_are_refused(void **state_) {
  (void)state_;
  fake_options opts = {.device_count = 2};
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(&opts, &cfg);
  vmm_arena *b = receiver(0);
  vmm_arena *other = receiver(1);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 0;
  export_ok(a, p, pc, &n, &off);

  int devnull = open("/dev/null", O_RDONLY);
  assert_true(devnull >= 0);
  vmm_ipc_piece forged = {devnull, 0, 2 * MiB};
  refused(b, &forged, 1, VMM_ERR_INVALID_ARGUMENT, "not a handle this process can import");
  vmm_ipc_piece unknown = {1000, 0, 2 * MiB}; /* no such descriptor */
  refused(b, &unknown, 1, VMM_ERR_INVALID_ARGUMENT, "descriptor 1000");
  vmm_ipc_piece big = {pc[0].fd, 0, 4 * MiB}; /* the handle is 2 MiB */
  refused(b, &big, 1, VMM_ERR_INVALID_ARGUMENT, "could not be mapped as 4.0 MiB");
  vmm_ipc_piece gap[2] = {{pc[0].fd, 0, 2 * MiB}, {pc[0].fd, 4 * MiB, 2 * MiB}};
  refused(b, gap, 2, VMM_ERR_INVALID_ARGUMENT, "not the next one back to back");
  vmm_ipc_piece odd = {pc[0].fd, 0, MiB};
  refused(b, &odd, 1, VMM_ERR_INVALID_ARGUMENT, "granularity");
  refused(b, pc, 0, VMM_ERR_INVALID_ARGUMENT, "0 pieces");
  /* a second piece that fails after the first was imported: the first is released again */
  vmm_ipc_piece second_forged[2] = {{pc[0].fd, 0, 2 * MiB}, {devnull, 2 * MiB, 2 * MiB}};
  refused(b, second_forged, 2, VMM_ERR_INVALID_ARGUMENT, "piece 2 of 2");
  /* memory of device 0 into the arena of device 1 */
  refused(other, pc, n, VMM_ERR_INVALID_ARGUMENT, "memory of device 0");

  /* stale: the sender's memory went back to the driver; a copy of its descriptor outlived it */
  int copy = dup(pc[0].fd);
  assert_true(copy >= 0);
  tu_free(a, p, S1);
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(fcntl(pc[0].fd, F_GETFD), -1); /* the arena closed its descriptor */
  vmm_ipc_piece stale = {copy, 0, 2 * MiB};
  refused(b, &stale, 1, VMM_ERR_INVALID_ARGUMENT, "forged, stale or closed");
  close(copy);
  close(devnull);

  /* export refusals: freed, never allocated, interior, NULL arguments */
  assert_int_equal(vmm_arena_ipc_export(a, p, pc, MAX_PIECES, &n, &off), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(vmm_arena_ipc_export(a, (void *)0x1234, pc, MAX_PIECES, &n, &off), VMM_ERR_UNKNOWN_POINTER);
  assert_non_null(strstr(vmm_arena_last_error(a), "not an allocation"));
  assert_int_equal(vmm_arena_ipc_export(a, p, NULL, MAX_PIECES, &n, &off), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_ipc_import(b, pc, 1, NULL), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_ipc_close(b, NULL), VMM_ERR_UNKNOWN_POINTER);
  assert_int_equal(vmm_arena_ipc_export(NULL, p, pc, MAX_PIECES, &n, &off), VMM_ERR_INVALID_ARGUMENT);
  vmm_arena_destroy(other);
  destroy_both(a, b);
}

static void thousands_of_cycles_leak_no_descriptor(void **state_) {
  (void)state_;
  int fds0 = open_fds();
  fake_options opts = {.record_calls = -1};
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(&opts, &cfg);
  vmm_arena *b = receiver(0);
  static const size_t sizes[] = {4096, 2 * MiB, 4 * MiB, 6 * MiB, 64 << 10};
  vmm_ipc_piece pc[MAX_PIECES];
  int most = 0;
  for (int i = 0; i < 3000; i++) {
    void *p = tu_alloc(a, sizes[i % 5], VMM_KIND_TRANSIENT, S1);
    size_t n = 0, off = 0;
    export_ok(a, p, pc, &n, &off);
    void *q = import_ok(b, pc, n);
    assert_int_equal(vmm_arena_ipc_close(b, q), VMM_OK);
    tu_free(a, p, S1);
    if (i % 500 == 499) assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
    int fds = open_fds();
    if (fds > most) most = fds;
  }
  assert_true(most - fds0 <= 16); /* one per cached handle at most */
  assert_int_equal(vmm_arena_empty_cache(a), VMM_OK);
  assert_int_equal(open_fds(), fds0);
  fake_ledger l;
  fake_get_ledger(&l);
  assert_true(l.imports >= 3000);
  destroy_both(a, b);
  assert_int_equal(open_fds(), fds0);
}

/* A driver refusal at each step of an import, export and close: undone, then it succeeds. */
static void driver_refusals_are_undone(void **state_) {
  (void)state_;
  int fds0 = open_fds();
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(NULL, &cfg);
  vmm_arena *b = receiver(0);
  void *p = assembled(a);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 0;

  /* export: the second handle's export fails; the first one's new descriptor is closed again */
  state sa = state_of(a);
  fake_fail_nth(VMM_DRV_mem_export_to_shareable_handle, 2, CUDA_ERROR_UNKNOWN, 0);
  assert_int_equal(vmm_arena_ipc_export(a, p, pc, MAX_PIECES, &n, &off), VMM_ERR_DRIVER);
  assert_non_null(strstr(vmm_arena_last_error(a), "handle 2 of 2"));
  assert_same(sa, state_of(a));
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
  fake_clear_faults();
  export_ok(a, p, pc, &n, &off);
  assert_int_equal(n, 2);

  struct {
    vmm_driver_entry entry;
    unsigned nth;
  } steps[] = {
      {VMM_DRV_mem_import_from_shareable_handle, 1},
      {VMM_DRV_mem_import_from_shareable_handle, 2},
      {VMM_DRV_mem_get_allocation_properties_from_handle, 2},
      {VMM_DRV_mem_address_reserve, 1},
      {VMM_DRV_mem_map, 1},
      {VMM_DRV_mem_map, 2},
      {VMM_DRV_mem_set_access, 1},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    state sb = state_of(b);
    fake_fail_nth(steps[i].entry, steps[i].nth, CUDA_ERROR_UNKNOWN, 0);
    void *q = (void *)1;
    vmm_status st = vmm_arena_ipc_import(b, pc, n, &q);
    assert_int_not_equal(st, VMM_OK);
    assert_null(q);
    assert_int_equal(fake_faults_fired(), i + 2); /* the export's, then one per step */
    fake_clear_faults();
    assert_same(sb, state_of(b));
    assert_int_equal(vmm_arena_fatal_error(b, &fatal), VMM_OK);
  }
  /* close: a failed synchronize, unmap or release keeps the import open; a later close ends it */
  vmm_driver_entry close_steps[] = {VMM_DRV_ctx_synchronize, VMM_DRV_mem_unmap, VMM_DRV_mem_release,
                                    VMM_DRV_mem_address_free};
  for (size_t i = 0; i < sizeof close_steps / sizeof close_steps[0]; i++) {
    void *q = import_ok(b, pc, n);
    fake_fail_nth(close_steps[i], close_steps[i] == VMM_DRV_mem_release ? 2 : 1, CUDA_ERROR_UNKNOWN, 0);
    assert_int_equal(vmm_arena_ipc_close(b, q), VMM_ERR_DRIVER);
    fake_clear_faults();
    assert_int_equal(vmm_arena_ipc_imports(b), 1);
    assert_int_equal(vmm_arena_ipc_close(b, q), VMM_OK);
    assert_int_equal(vmm_arena_ipc_imports(b), 0);
  }
  /* an import left open is closed by destroy */
  (void)import_ok(b, pc, n);
  tu_free(a, p, S1);
  destroy_both(a, b);
  assert_int_equal(open_fds(), fds0);
}

static void a_driver_refusing_exportable_memory_falls_back(void **state_) {
  (void)state_;
  vmm_config cfg = caching_config(0);
  vmm_arena *a = tu_arena(NULL, &cfg);
  fake_set_export_refused(1);
  assert_int_equal(vmm_arena_ipc_exportable(a), 1);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1); /* created plain after the refusal */
  assert_int_equal(vmm_arena_ipc_exportable(a), 0);
  void *p2 = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S1);
  vmm_ipc_piece pc[MAX_PIECES];
  size_t n = 0, off = 0;
  assert_int_equal(vmm_arena_ipc_export(a, p, pc, MAX_PIECES, &n, &off), VMM_ERR_DRIVER);
  assert_non_null(strstr(vmm_arena_last_error(a), "created plain"));
  const char *fatal = NULL;
  assert_int_equal(vmm_arena_fatal_error(a, &fatal), VMM_OK);
  tu_free(a, p, S1);
  tu_free(a, p2, S1);
  fake_set_export_refused(0);
  tu_destroy(a);

  /* outside whole-process mode nothing is created exportable */
  vmm_config plain = tu_config();
  a = tu_arena(NULL, &plain);
  assert_int_equal(vmm_arena_ipc_exportable(a), 0);
  p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S1);
  assert_int_equal(vmm_arena_ipc_export(a, p, pc, MAX_PIECES, &n, &off), VMM_ERR_DRIVER);
  tu_free(a, p, S1);
  tu_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(single_handle_shared_and_closed),
      cmocka_unit_test(assembled_allocation_exports_every_handle),
      cmocka_unit_test(page_slot_is_shared_with_its_offset),
      cmocka_unit_test(forged_stale_and_misfit_handles_are_refused),
      cmocka_unit_test(thousands_of_cycles_leak_no_descriptor),
      cmocka_unit_test(driver_refusals_are_undone),
      cmocka_unit_test(a_driver_refusing_exportable_memory_falls_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
