/* vmmarena_torch: PyTorch pluggable-allocator entry points and the control functions of the
 * Python package, over one lazily created arena per device (see vmmarena_torch.h). */
#include "vmmarena_torch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "vmmarena.h"
#include "vmmarena/trace.h"

#define ERROR_CAP 1024

static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER; /* creation, errors, test driver */
static vmm_arena *arenas[VMM_MAX_DEVICES];                    /* published with release stores */
static const struct vmm_driver *driver_for_testing;           /* NULL = the CUDA driver */
static char errors[VMM_MAX_DEVICES][ERROR_CAP];               /* latest failure per device */
static int caching;                                           /* vmm_torch_set_caching; under shim_lock */
static __thread int thread_kind = VMM_KIND_TRANSIENT;         /* kind of whole-process allocations */

static int device_valid(int device) { return device >= 0 && device < VMM_MAX_DEVICES; }

static const char *device_range_error(void) {
  return "device ordinal out of range (vmmarena supports devices 0..63)";
}

/* Records the latest failure of `device` (caller holds shim_lock). */
static void set_error_locked(int device, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error_locked(int device, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errors[device], ERROR_CAP, fmt, ap);
  va_end(ap);
}

/* Keeps the arena's message for the failure it just returned. */
static int keep_arena_error(int device, vmm_arena *a, vmm_status st) {
  pthread_mutex_lock(&shim_lock);
  set_error_locked(device, "%s", vmm_arena_last_error(a));
  pthread_mutex_unlock(&shim_lock);
  return (int)st;
}

/* The arena of `device`, created from the environment on first use; NULL with the error kept
 * (and *status set) when the configuration is bad or creation fails. */
static vmm_arena *arena_for(int device, vmm_status *status) {
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (a) return a;
  pthread_mutex_lock(&shim_lock);
  a = arenas[device];
  if (!a) {
    vmm_config cfg;
    vmm_config_init(&cfg);
    vmm_status st = vmm_config_from_env(&cfg);
    if (st != VMM_OK) {
      set_error_locked(device, "device %d: bad configuration: %s", device, vmm_config_error());
      *status = st;
    } else {
      cfg.device = device;
      cfg.driver = driver_for_testing;
      if (caching) cfg.caching = 1;
      st = vmm_arena_create(&cfg, &a);
      if (st == VMM_OK) __atomic_store_n(&arenas[device], a, __ATOMIC_RELEASE);
      else set_error_locked(device, "device %d: creating the arena: %s", device, vmm_create_error());
      *status = st;
    }
  }
  pthread_mutex_unlock(&shim_lock);
  return a;
}

/* ---- PyTorch's allocator signatures -------------------------------------------------- */

static void *allocate(ssize_t size, int device, CUstream stream, vmm_kind kind) {
  if (!device_valid(device) || size <= 0) {
    if (device_valid(device) && size < 0) {
      pthread_mutex_lock(&shim_lock);
      set_error_locked(device, "allocate: negative size %zd", size);
      pthread_mutex_unlock(&shim_lock);
    }
    return NULL;
  }
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return NULL;
  void *ptr = NULL;
  st = vmm_arena_alloc(a, (size_t)size, kind, stream, &ptr);
  if (st != VMM_OK) {
    keep_arena_error(device, a, st);
    return NULL;
  }
  return ptr;
}

void *vmm_torch_package_allocate(ssize_t size, int device, CUstream stream) {
  return allocate(size, device, stream, VMM_KIND_PACKAGE);
}

void *vmm_torch_transient_allocate(ssize_t size, int device, CUstream stream) {
  return allocate(size, device, stream, VMM_KIND_TRANSIENT);
}

void vmm_torch_free(void *ptr, ssize_t size, int device, CUstream stream) {
  if (!ptr || !device_valid(device)) return;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a || size < 0) {
    pthread_mutex_lock(&shim_lock);
    if (!a) set_error_locked(device, "free(%p, %zd B): device %d has no arena, so this is not its allocation", ptr, size, device);
    else set_error_locked(device, "free(%p): negative size %zd", ptr, size);
    pthread_mutex_unlock(&shim_lock);
    return;
  }
  vmm_status st = vmm_arena_free(a, ptr, stream);
  if (st != VMM_OK) keep_arena_error(device, a, st);
}

/* ---- Control functions --------------------------------------------------------------- */

typedef vmm_status (*arena_op)(vmm_arena *a);

static int control(int device, arena_op op) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return (int)st;
  st = op(a);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

int vmm_torch_retention_begin(int device) { return control(device, vmm_retention_begin); }
int vmm_torch_retention_finish(int device) { return control(device, vmm_retention_finish); }
int vmm_torch_retention_abort(int device) { return control(device, vmm_retention_abort); }
int vmm_torch_quiesce(int device) { return control(device, vmm_arena_quiesce); }

int vmm_torch_pause(int device, const char *tag, int backup) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return (int)st;
  st = vmm_arena_pause(a, tag, backup ? VMM_PAUSE_BACKUP : VMM_PAUSE_DISCARD);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

int vmm_torch_resume(int device, const char *tag) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return (int)st;
  st = vmm_arena_resume(a, tag);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

int vmm_torch_snapshot_json(int device, char *buf, size_t cap) {
  if (!device_valid(device) || !buf || cap == 0) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) {
    buf[0] = '\0';
    return (int)st;
  }
  size_t needed = 0;
  st = vmm_arena_snapshot_json(a, buf, cap, &needed);
  if (st != VMM_OK) {
    pthread_mutex_lock(&shim_lock);
    if (needed > cap) set_error_locked(device, "snapshot: %zu bytes needed, buffer holds %zu", needed, cap);
    else set_error_locked(device, "snapshot: %s", vmm_status_message(st));
    pthread_mutex_unlock(&shim_lock);
  }
  return (int)st;
}

size_t vmm_torch_snapshot_json_size(int device) {
  if (!device_valid(device)) return 0;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return 0;
  size_t needed = 0;
  (void)vmm_arena_snapshot_json(a, NULL, 0, &needed);
  return needed;
}

const char *vmm_torch_last_error(int device) {
  return device_valid(device) ? errors[device] : device_range_error();
}

const char *vmm_torch_status_name(int status) { return vmm_status_name((vmm_status)status); }

int vmm_torch_config_check(char *buf, size_t cap) {
  vmm_config cfg;
  vmm_config_init(&cfg);
  vmm_status st = vmm_config_from_env(&cfg);
  if (buf && cap) snprintf(buf, cap, "%s", st == VMM_OK ? "" : vmm_config_error());
  return (int)st;
}

int vmm_torch_check(int device, char *buf, size_t cap) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return (int)st;
  char why[512] = "";
  int broken = vmm_arena_check(a, why, sizeof why);
  if (buf && cap) snprintf(buf, cap, "%s", why);
  return broken ? VMM_ERR_INVALID_ARGUMENT : VMM_OK;
}

void vmm_torch_tag_push(const char *tag) { vmm_tag_push(tag); }
void vmm_torch_tag_pop(void) { vmm_tag_pop(); }

/* ---- Whole-process mode ------------------------------------------------------------- */

/* Writes a message into a caller's buffer (msg may be NULL). */
static void put_message(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put_message(char *msg, size_t cap, const char *fmt, ...) {
  if (!msg || !cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
}

/* The first device with an arena, or -1 (caller holds shim_lock). */
static int first_arena_locked(void) {
  for (int d = 0; d < VMM_MAX_DEVICES; d++)
    if (arenas[d]) return d;
  return -1;
}

/* arena_for, with the reason it failed copied into msg. */
static vmm_arena *arena_with_message(int device, vmm_status *status, char *msg, size_t cap) {
  vmm_arena *a = arena_for(device, status);
  if (!a) {
    pthread_mutex_lock(&shim_lock);
    put_message(msg, cap, "%s", errors[device]);
    pthread_mutex_unlock(&shim_lock);
  }
  return a;
}

int vmm_torch_set_caching(int on, char *msg, size_t cap) {
  on = on != 0;
  pthread_mutex_lock(&shim_lock);
  int device = first_arena_locked();
  int refused = on != caching && device >= 0;
  if (!refused) caching = on;
  pthread_mutex_unlock(&shim_lock);
  if (refused) {
    put_message(msg, cap, "caching %s refused: device %d's arena exists already, and arenas keep the setting they were "
                "created with (switch caching on before the first allocation or control call)", on ? "on" : "off", device);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  put_message(msg, cap, "%s", "");
  return VMM_OK;
}

int vmm_torch_caching(void) {
  pthread_mutex_lock(&shim_lock);
  int on = caching;
  pthread_mutex_unlock(&shim_lock);
  return on;
}

int vmm_torch_set_kind(int kind) {
  if (kind != VMM_KIND_PACKAGE && kind != VMM_KIND_TRANSIENT) return -1;
  int previous = thread_kind;
  thread_kind = kind;
  return previous;
}

int vmm_torch_kind(void) { return thread_kind; }

int vmm_torch_process_allocate(size_t size, int device, CUstream stream, uint64_t pool, void **out, char *msg,
                               size_t cap) {
  *out = NULL;
  if (!device_valid(device)) {
    put_message(msg, cap, "allocate %zu B on device %d: %s", size, device, device_range_error());
    return VMM_ERR_INVALID_ARGUMENT;
  }
  if (size == 0) return VMM_OK;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_with_message(device, &st, msg, cap);
  if (!a) return (int)st;
  st = vmm_arena_alloc_in(a, size, (vmm_kind)thread_kind, stream, (vmm_pool_id)pool, out);
  if (st == VMM_OK) return VMM_OK;
  const char *why = vmm_arena_last_error(a); /* this thread's copy */
  put_message(msg, cap, "%s", why);
  pthread_mutex_lock(&shim_lock);
  set_error_locked(device, "%s", why);
  pthread_mutex_unlock(&shim_lock);
  return (int)st;
}

int vmm_torch_process_free(void *ptr, int device, CUstream stream, char *msg, size_t cap) {
  put_message(msg, cap, "%s", "");
  if (!ptr) return VMM_OK;
  if (!device_valid(device)) {
    put_message(msg, cap, "free(%p) on device %d: %s", ptr, device, device_range_error());
    return VMM_ERR_INVALID_ARGUMENT;
  }
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a) {
    put_message(msg, cap, "free(%p): device %d has no arena, so this is not its allocation", ptr, device);
    return VMM_ERR_UNKNOWN_POINTER;
  }
  vmm_status st = vmm_arena_free(a, ptr, stream);
  if (st == VMM_OK) return VMM_OK;
  put_message(msg, cap, "free(%p) on device %d: %s", ptr, device, vmm_arena_last_error(a));
  return keep_arena_error(device, a, st);
}

int vmm_torch_record_stream(void *ptr, CUstream stream, char *msg, size_t cap) {
  if (!ptr) return VMM_OK;
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    vmm_arena *a = __atomic_load_n(&arenas[d], __ATOMIC_ACQUIRE);
    if (!a) continue;
    vmm_status st = vmm_arena_record_stream(a, ptr, stream);
    if (st == VMM_OK) return VMM_OK;
    if (st != VMM_ERR_UNKNOWN_POINTER) {
      put_message(msg, cap, "record_stream(%p) on device %d: %s", ptr, d, vmm_arena_last_error(a));
      return keep_arena_error(d, a, st);
    }
  }
  put_message(msg, cap, "record_stream(%p, stream %p): not a live allocation of any vmmarena arena", ptr, (void *)stream);
  return VMM_ERR_UNKNOWN_POINTER;
}

uint64_t vmm_torch_stream_mark(int device, CUstream stream) {
  uint64_t mark = 0;
  vmm_arena *a = device_valid(device) ? __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE) : NULL;
  if (a) (void)vmm_arena_stream_mark(a, stream, &mark);
  return mark;
}

int vmm_torch_stream_waited(int device, CUstream waiter, CUstream source, uint64_t mark) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a || !mark) return VMM_OK;
  vmm_status st = vmm_arena_stream_waited(a, waiter, source, mark);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

int vmm_torch_allocation_size(void *ptr, int device, size_t *bytes) {
  if (!device_valid(device) || !bytes) return VMM_ERR_INVALID_ARGUMENT;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  return a ? vmm_arena_allocation_size(a, ptr, bytes) : VMM_ERR_UNKNOWN_POINTER;
}

int vmm_torch_capture_begin(int device, uint64_t pool) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_for(device, &st);
  if (!a) return (int)st;
  st = vmm_arena_capture_begin(a, (vmm_pool_id)pool);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

typedef vmm_status (*pool_op)(vmm_arena *a, vmm_pool_id pool);

/* op on `device`'s arena and pool; VMM_OK with nothing to do when it has none (none is created). */
static int on_existing(int device, pool_op op, vmm_pool_id pool) {
  if (!device_valid(device)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a) return VMM_OK;
  vmm_status st = op(a, pool);
  return st == VMM_OK ? VMM_OK : keep_arena_error(device, a, st);
}

static vmm_status quiesce(vmm_arena *a, vmm_pool_id none) { return (void)none, vmm_arena_quiesce(a); }
static vmm_status reset_peaks(vmm_arena *a, vmm_pool_id none) { return (void)none, vmm_arena_reset_peaks(a); }

int vmm_torch_capture_end(int device, uint64_t pool) { return on_existing(device, vmm_arena_capture_end, pool); }
int vmm_torch_release_pool(int device, uint64_t pool) { return on_existing(device, vmm_arena_release_pool, pool); }
int vmm_torch_quiesce_existing(int device) { return on_existing(device, quiesce, VMM_POOL_SHARED); }

int vmm_torch_empty_cache(char *msg, size_t cap) {
  int first = VMM_OK;
  put_message(msg, cap, "%s", "");
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    vmm_arena *a = __atomic_load_n(&arenas[d], __ATOMIC_ACQUIRE);
    if (!a) continue;
    vmm_status st = vmm_arena_empty_cache(a);
    if (st == VMM_OK || first != VMM_OK) continue;
    put_message(msg, cap, "empty_cache on device %d: %s", d, vmm_arena_last_error(a));
    first = keep_arena_error(d, a, st);
  }
  return first;
}

int vmm_torch_usage(int device, vmm_usage *out) {
  if (!device_valid(device) || !out) return VMM_ERR_INVALID_ARGUMENT;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a) {
    memset(out, 0, sizeof *out);
    return VMM_OK;
  }
  return (int)vmm_arena_usage(a, out);
}

size_t vmm_torch_usage_size(void) { return sizeof(vmm_usage); }

int vmm_torch_arena_snapshot(int device, vmm_snapshot *out) {
  if (!device_valid(device) || !out) return VMM_ERR_INVALID_ARGUMENT;
  vmm_arena *a = __atomic_load_n(&arenas[device], __ATOMIC_ACQUIRE);
  if (!a) {
    memset(out, 0, sizeof *out);
    return VMM_OK;
  }
  return (int)vmm_arena_snapshot(a, out);
}

int vmm_torch_reset_peaks(int device) { return on_existing(device, reset_peaks, VMM_POOL_SHARED); }

/* Clears msg; false, with `what` and the valid range in msg, for a device out of range. */
static bool device_checked(int device, const char *what, char *msg, size_t cap) {
  put_message(msg, cap, "%s", "");
  if (device_valid(device)) return true;
  put_message(msg, cap, "%s: %s", what, device_range_error());
  return false;
}

/* The device's total memory, or the driver's failure kept and put into msg after `what`. */
static int device_total(int device, vmm_arena *a, size_t *total, const char *what, char *msg, size_t cap) {
  vmm_status st = vmm_arena_device_memory(a, NULL, total);
  if (st == VMM_OK) return VMM_OK;
  put_message(msg, cap, "%s: %s", what, vmm_arena_last_error(a));
  return keep_arena_error(device, a, st);
}

int vmm_torch_set_memory_fraction(int device, double fraction, char *msg, size_t cap) {
  char what[96];
  snprintf(what, sizeof what, "memory fraction %g on device %d", fraction, device);
  if (!device_checked(device, what, msg, cap)) return VMM_ERR_INVALID_ARGUMENT;
  if (!(fraction >= 0.0 && fraction <= 1.0)) { /* NaN too */
    put_message(msg, cap, "%s: outside 0..1", what);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_with_message(device, &st, msg, cap);
  size_t total = 0;
  if (!a) return (int)st;
  if ((st = device_total(device, a, &total, what, msg, cap)) != VMM_OK) return (int)st;
  size_t limit = (size_t)(fraction * (double)total);
  return (int)vmm_arena_set_limit(a, limit ? limit : 1); /* a limit of 0 would mean none */
}

int vmm_torch_memory_fraction(int device, double *out, char *msg, size_t cap) {
  char what[64];
  snprintf(what, sizeof what, "memory fraction of device %d", device);
  *out = 1.0;
  if (!device_checked(device, what, msg, cap)) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = VMM_OK;
  vmm_arena *a = arena_with_message(device, &st, msg, cap);
  vmm_snapshot s;
  size_t total = 0;
  if (!a) return (int)st;
  if ((st = vmm_arena_snapshot(a, &s)) != VMM_OK || !s.limit_bytes) return (int)st;
  if ((st = device_total(device, a, &total, what, msg, cap)) != VMM_OK) return (int)st;
  if (s.limit_bytes < total) *out = (double)s.limit_bytes / (double)total;
  return VMM_OK;
}

/* ---- Trace files --------------------------------------------------------------------- */

int vmm_torch_trace_open(const char *path, vmm_trace_reader **out, char *msg, size_t cap) {
  return (int)vmm_trace_reader_open(path, out, msg, cap);
}
size_t vmm_torch_trace_records(const vmm_trace_reader *r) { return vmm_trace_reader_records(r); }
const char *vmm_torch_trace_name(const vmm_trace_reader *r) { return vmm_trace_reader_name(r); }
int vmm_torch_trace_next(vmm_trace_reader *r, vmm_trace_record *rec, size_t *line) {
  return vmm_trace_reader_next(r, rec, line);
}
void vmm_torch_trace_close(vmm_trace_reader *r) { vmm_trace_reader_close(r); }
size_t vmm_torch_trace_record_size(void) { return sizeof(vmm_trace_record); }
const char *vmm_torch_trace_op_name(int op) { return vmm_trace_op_name((vmm_trace_op)op); }

int vmm_torch_set_driver_for_testing(const struct vmm_driver *drv) {
  pthread_mutex_lock(&shim_lock);
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    vmm_arena_destroy(arenas[d]);
    __atomic_store_n(&arenas[d], NULL, __ATOMIC_RELEASE);
    errors[d][0] = '\0';
  }
  driver_for_testing = drv;
  pthread_mutex_unlock(&shim_lock);
  return VMM_OK;
}

/* The arena of `device` for the shim's IPC (vmmarena_torch_ipc.c), created on first use as by
 * any call; NULL with the reason in msg. Not exported. */
__attribute__((visibility("hidden"))) vmm_arena *vmm_torch__arena(int device, char *msg, size_t cap) {
  vmm_status st = VMM_OK;
  if (!device_valid(device)) {
    put_message(msg, cap, "device %d is not a device ordinal (0..%d)", device, VMM_MAX_DEVICES - 1);
    return NULL;
  }
  return arena_with_message(device, &st, msg, cap);
}
