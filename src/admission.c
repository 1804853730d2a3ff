/* Admission: new physical memory is refused past the limit or below the headroom, and every
 * refusal says what was requested, what was found, what was required and what the arena
 * holds. Refusals are recoverable out-of-memory errors, never fatal. The limit may also be set
 * on a running arena, and the device's memory read, for PyTorch's per-process memory fraction. */
#include "internal.h"

/* Records a refusal of new memory: the request, why, and what the arena holds. */
static vmm_status refuse(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static vmm_status refuse(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, const char *fmt, ...) {
  char why[360], holds[200], b[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  vmm_errors_describe_holdings(a, holds, sizeof holds);
  return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s %s refused (requested %zu B, rounded %zu B): %s; %s", vmm_errors_kind_name(kind),
                  vmm_errors_fmt_bytes(rounded, b), bytes, rounded, why, holds);
}

vmm_status vmm_admission_admit(vmm_arena *a, size_t bytes, size_t rounded, size_t fresh, vmm_kind kind) {
  char b[4][32], idle[80] = "";
  if (fresh < rounded)
    snprintf(idle, sizeof idle, " (%s of the request from idle handles)", vmm_errors_fmt_bytes(rounded - fresh, b[3]));
  if (a->cfg.limit_bytes && (a->physical_bytes > a->cfg.limit_bytes || fresh > a->cfg.limit_bytes - a->physical_bytes)) {
    a->limit_refusals++;
    /* Exact bytes too: rounded units cannot tell a limit of 16 MiB - 1 from 16 MiB. */
    return refuse(a, bytes, rounded, kind, "limit %s < %s held + %s requested%s (limit %zu B, %llu B required)",
                  vmm_errors_fmt_bytes(a->cfg.limit_bytes, b[0]), vmm_errors_fmt_bytes(a->physical_bytes, b[1]),
                  vmm_errors_fmt_bytes(fresh, b[2]), idle, a->cfg.limit_bytes,
                  (unsigned long long)a->physical_bytes + (unsigned long long)fresh);
  }
  if (!a->cfg.headroom_bytes) return VMM_OK;
  size_t found = 0, total = 0;
  CUresult r;
  const char *figure;
  if (a->integrated) {
    figure = "MemAvailable";
    r = VMM_DRV(a, host_memory_available, &found);
    if (r != CUDA_SUCCESS)
      return vmm_errors_fail_driver(a, r, VMM_DRV_host_memory_available, "reading host MemAvailable for the headroom check");
  } else {
    figure = "device free memory";
    r = VMM_DRV(a, mem_get_info, &found, &total);
    if (r != CUDA_SUCCESS)
      return vmm_errors_fail_driver(a, r, VMM_DRV_mem_get_info, "reading device free memory for the headroom check");
  }
  /* A sum past SIZE_MAX is refused and reported as SIZE_MAX, not as its wrapped value. */
  int overflow = fresh > SIZE_MAX - a->cfg.headroom_bytes;
  size_t required = overflow ? SIZE_MAX : fresh + a->cfg.headroom_bytes;
  if (overflow || found < required) {
    a->headroom_refusals++;
    return refuse(a, bytes, rounded, kind, "%s %s (%zu B) < %s%s + headroom %s (%zu B required)", figure,
                  vmm_errors_fmt_bytes(found, b[0]), found, vmm_errors_fmt_bytes(fresh, b[1]), idle,
                  vmm_errors_fmt_bytes(a->cfg.headroom_bytes, b[2]), required);
  }
  return VMM_OK;
}

vmm_status vmm_admission_refuse_driver_oom(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind) {
  size_t free_b = 0, total_b = 0;
  char b[2][32];
  a->oom_refusals++;
  if (VMM_DRV(a, mem_get_info, &free_b, &total_b) == CUDA_SUCCESS)
    return refuse(a, bytes, rounded, kind, "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY; device free %s of %s",
                  vmm_errors_fmt_bytes(free_b, b[0]), vmm_errors_fmt_bytes(total_b, b[1]));
  return refuse(a, bytes, rounded, kind, "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY");
}

vmm_status vmm_admission_admit_device(vmm_arena *a, size_t bytes, size_t rounded, size_t fresh, uint32_t handles, vmm_kind kind) {
  size_t free_b = 0, total_b = 0;
  if (VMM_DRV(a, mem_get_info, &free_b, &total_b) != CUDA_SUCCESS || free_b >= fresh) return VMM_OK;
  char b[3][32];
  a->oom_refusals++;
  return refuse(a, bytes, rounded, kind, "device free %s of %s < %s of new memory in %u handles (cuMemGetInfo)",
                vmm_errors_fmt_bytes(free_b, b[0]), vmm_errors_fmt_bytes(total_b, b[1]), vmm_errors_fmt_bytes(fresh, b[2]), handles);
}

vmm_status vmm_arena_set_limit(vmm_arena *a, size_t bytes) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  a->cfg.limit_bytes = bytes;
  vmm_trace_arena_limit(a);
  pthread_mutex_unlock(&a->lock);
  return VMM_OK;
}

vmm_status vmm_arena_device_memory(vmm_arena *a, size_t *free_bytes, size_t *total_bytes) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  size_t found = 0, total = 0;
  vmm_status st = VMM_OK;
  CUresult r = VMM_DRV(a, mem_get_info, &found, &total);
  if (r != CUDA_SUCCESS)
    st = vmm_errors_fail_driver(a, r, VMM_DRV_mem_get_info, "device_memory: reading the device's free and total memory");
  else {
    if (free_bytes) *free_bytes = found;
    if (total_bytes) *total_bytes = total;
  }
  vmm_driver_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}
