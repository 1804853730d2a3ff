/* Status names and messages (from VMM_STATUS_TABLE), failure messages with numbers, the
 * sticky first fatal error, and logging. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const struct {
  const char *name, *message;
} statuses[] = {
#define VMM_STATUS_ROW(name, message) {#name, message},
    VMM_STATUS_TABLE(VMM_STATUS_ROW)
#undef VMM_STATUS_ROW
};

const char *vmm_status_name(vmm_status s) {
  return (unsigned)s < VMM_STATUS_COUNT ? statuses[s].name : "VMM_STATUS_UNKNOWN";
}

const char *vmm_status_message(vmm_status s) {
  return (unsigned)s < VMM_STATUS_COUNT ? statuses[s].message : "unknown status";
}

const char *vmm_errors_fmt_bytes_decimals(uint64_t bytes, int gib_decimals, char buf[32]) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) {
    snprintf(buf, 32, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  double v = (double)bytes / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, 32, "%.*f %s", u >= 2 ? gib_decimals : 1, v, units[u]);
  return buf;
}

const char *vmm_errors_fmt_bytes(uint64_t bytes, char buf[32]) { return vmm_errors_fmt_bytes_decimals(bytes, 1, buf); }

void vmm_errors_describe_holdings(const vmm_arena *a, char *buf, size_t cap) {
  char t[6][32];
  const vmm_kind_stats *p = &a->kind[VMM_KIND_PACKAGE], *tr = &a->kind[VMM_KIND_TRANSIENT];
  uint64_t idle = p->idle_bytes + tr->idle_bytes;
  uint64_t abandoned = p->abandoned_bytes + tr->abandoned_bytes;
  snprintf(buf, cap, "arena holds %s live (package %s, transient %s), %s pooled, %s idle, %s abandoned",
           vmm_errors_fmt_bytes(p->live_bytes + tr->live_bytes, t[0]), vmm_errors_fmt_bytes(p->live_bytes, t[1]),
           vmm_errors_fmt_bytes(tr->live_bytes, t[2]), vmm_errors_fmt_bytes(tr->pooled_bytes, t[3]), vmm_errors_fmt_bytes(idle, t[4]),
           vmm_errors_fmt_bytes(abandoned, t[5]));
}

static vmm_status vfail(vmm_arena *a, vmm_status s, const char *fmt, va_list ap) {
  vsnprintf(a->last_error, sizeof a->last_error, fmt, ap);
  vmm_errors_log(1, a->cfg.log_level, "vmmarena: device %d: %s: %s", a->cfg.device, vmm_status_name(s), a->last_error);
  return s;
}

vmm_status vmm_errors_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(a, s, fmt, ap);
  va_end(ap);
  return s;
}

const char *vmm_errors_cu_name(vmm_arena *a, CUresult r) {
  const char *name = NULL;
  if (a->drv->get_error_name && VMM_DRV_COUNTED(a, get_error_name, r, &name) == CUDA_SUCCESS && name) return name;
  return "CUDA_ERROR_UNRECOGNIZED";
}

vmm_status vmm_errors_fail_driver(vmm_arena *a, CUresult r, vmm_driver_entry e, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  char holds[200];
  vmm_errors_describe_holdings(a, holds, sizeof holds);
  vmm_status s = r == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER;
  vmm_errors_fail(a, s, "%s: %s returned %s (%d); %s", what, vmm_driver_entry_name(e), vmm_errors_cu_name(a, r), (int)r,
           holds);
  if (s == VMM_ERR_DRIVER && a->fatal_status == VMM_OK) {
    a->fatal_status = s;
    snprintf(a->fatal_message, sizeof a->fatal_message, "%s", a->last_error);
  }
  return s;
}

void vmm_errors_log(int level, int threshold, const char *fmt, ...) {
  if (level > threshold) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

const char *vmm_errors_kind_name(int kind) {
  static const char *const names[] = {"package", "transient"};
  return kind >= 0 && kind < VMM_KIND_COUNT ? names[kind] : "unknown kind";
}
