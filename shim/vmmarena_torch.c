/* vmmarena_torch: PyTorch pluggable-allocator entry points and the control functions of the
 * Python package, over one lazily created arena per device (see vmmarena_torch.h). */
#include "vmmarena_torch.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "vmmarena.h"
#include "vmmarena/trace.h"

#define ERROR_CAP 1024

static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER; /* creation, errors, test driver */
static vmm_arena *arenas[VMM_MAX_DEVICES];                    /* published with release stores */
static const struct vmm_driver *driver_for_testing;           /* NULL = the CUDA driver */
static char errors[VMM_MAX_DEVICES][ERROR_CAP];               /* latest failure per device */

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
