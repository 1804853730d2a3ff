/* CUDA IPC of whole-process mode: vmmarena_torch_ipc.h says the format and the choices. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vmmarena_torch_ipc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vmmarena.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif
#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

vmm_arena *vmm_torch__arena(int device, char *msg, size_t cap); /* vmmarena_torch.c */

static const char magic[4] = {'V', 'M', 'M', 'A'};
#define IPC_VERSION 1u
#define HEADER_BYTES 40 /* magic 4, version 4, pid 4, pad 4, start time 8, device 4, count 4, total 8 */
#define PIECE_BYTES 24
#define CHECK_BYTES 8

static void put(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put(char *msg, size_t cap, const char *fmt, ...) {
  if (!msg || !cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, cap, fmt, ap);
  va_end(ap);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void w32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void w64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t r32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t r64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Field 22 of /proc/PID/stat (the start time in clock ticks); 0 when unknown. */
static uint64_t start_time(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
  if (!p) return 0;
  unsigned long long v = 0;
  /* after ")": state (3), then fields 4..21, then starttime (22) */
  if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu", &v) != 1)
    return 0;
  return v;
}

static int ptrace_scope(void) {
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = 0;
  if (f) {
    if (fscanf(f, "%d", &scope) != 1) scope = 0;
    fclose(f);
  }
  return scope;
}

/* Under Yama ptrace_scope 1, lets processes of the same user duplicate this one's descriptors
 * (a child receiving from its parent); once per process. */
static void allow_receivers(void) {
  static int done;
  if (__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL)) return;
  if (ptrace_scope() == 1) (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

int vmm_torch_ipc_is_ours(const char *handle, size_t len) {
  return handle && len >= sizeof magic && memcmp(handle, magic, sizeof magic) == 0;
}

int vmm_torch_ipc_share(void *ptr, int device, char *buf, size_t cap, size_t *len, size_t *offset, char *msg,
                        size_t msg_cap) {
  vmm_arena *a = vmm_torch__arena(device, msg, msg_cap);
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  vmm_ipc_piece pieces[VMM_TORCH_IPC_MAX_PIECES];
  size_t n = 0, at = 0;
  vmm_status st = vmm_arena_ipc_export(a, ptr, pieces, VMM_TORCH_IPC_MAX_PIECES, &n, &at);
  if (st != VMM_OK) {
    put(msg, msg_cap, "%s", vmm_arena_last_error(a));
    return st;
  }
  size_t need = HEADER_BYTES + n * PIECE_BYTES + CHECK_BYTES;
  if (!buf || !len || !offset || cap < need) {
    put(msg, msg_cap, "ipc share of %p: room for %zu bytes of handle, %zu needed", ptr, cap, need);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  unsigned char *p = (unsigned char *)buf;
  memset(p, 0, need);
  memcpy(p, magic, 4);
  w32(p + 4, IPC_VERSION);
  w32(p + 8, (uint32_t)getpid());
  w64(p + 16, start_time(getpid()));
  w32(p + 24, (uint32_t)device);
  w32(p + 28, (uint32_t)n);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char *q = p + HEADER_BYTES + i * PIECE_BYTES;
    w32(q, (uint32_t)pieces[i].fd);
    w64(q + 8, pieces[i].offset);
    w64(q + 16, pieces[i].size);
    total += pieces[i].size;
  }
  w64(p + 32, total);
  w64(p + need - CHECK_BYTES, fnv1a(p, need - CHECK_BYTES));
  *len = need;
  *offset = at;
  allow_receivers();
  return VMM_OK;
}

int vmm_torch_ipc_open(const char *handle, size_t len, int device, void **base, char *msg, size_t msg_cap) {
  const unsigned char *p = (const unsigned char *)handle;
  if (!base) {
    put(msg, msg_cap, "ipc open: NULL base");
    return VMM_ERR_INVALID_ARGUMENT;
  }
  *base = NULL;
  if (!vmm_torch_ipc_is_ours(handle, len) || len < HEADER_BYTES + CHECK_BYTES) {
    put(msg, msg_cap, "not a CUDA IPC handle of vmmarena (%zu bytes; vmmarena's start with \"VMMA\"): shared by a "
        "process on PyTorch's own allocator? Only tensors of processes that run vmmarena.install() can be opened "
        "under it", len);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  uint32_t version = r32(p + 4), count = r32(p + 28);
  int pid = (int)r32(p + 8), from_device = (int)r32(p + 24);
  uint64_t started = r64(p + 16), total = r64(p + 32);
  if (version != IPC_VERSION) {
    put(msg, msg_cap, "vmmarena IPC handle of version %u, this vmmarena reads version %u", version, IPC_VERSION);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  if (count == 0 || count > VMM_TORCH_IPC_MAX_PIECES || len != HEADER_BYTES + (size_t)count * PIECE_BYTES + CHECK_BYTES ||
      fnv1a(p, len - CHECK_BYTES) != r64(p + len - CHECK_BYTES)) {
    put(msg, msg_cap, "malformed vmmarena IPC handle: %zu bytes for %u pieces, or its checksum does not match "
        "(forged or corrupted)", len, count);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  vmm_ipc_piece pieces[VMM_TORCH_IPC_MAX_PIECES];
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; i++) {
    const unsigned char *q = p + HEADER_BYTES + (size_t)i * PIECE_BYTES;
    pieces[i].fd = (int)r32(q);
    pieces[i].offset = (size_t)r64(q + 8);
    pieces[i].size = (size_t)r64(q + 16);
    sum += pieces[i].size;
  }
  if (sum != total) {
    put(msg, msg_cap, "malformed vmmarena IPC handle: pieces of %llu bytes in all, the header says %llu",
        (unsigned long long)sum, (unsigned long long)total);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  vmm_arena *a = vmm_torch__arena(device, msg, msg_cap);
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) {
    int e = errno;
    put(msg, msg_cap, "the process %d that shared this tensor (%llu bytes of device %d) %s (pidfd_open: %s)", pid,
        (unsigned long long)total, from_device, e == ESRCH ? "has exited" : "cannot be reached", strerror(e));
    return VMM_ERR_INVALID_ARGUMENT;
  }
  uint64_t now = start_time(pid);
  if (started && now && now != started) {
    close(pidfd);
    put(msg, msg_cap, "the process %d that shared this tensor has exited (pid %d is now another process, started at "
        "tick %llu, not %llu)", pid, pid, (unsigned long long)now, (unsigned long long)started);
    return VMM_ERR_INVALID_ARGUMENT;
  }
  int status = VMM_OK;
  uint32_t got = 0;
  vmm_ipc_piece mine[VMM_TORCH_IPC_MAX_PIECES];
  for (; got < count; got++) {
    int fd = (int)syscall(SYS_pidfd_getfd, pidfd, pieces[got].fd, 0);
    if (fd < 0) {
      int e = errno;
      if (e == EPERM)
        put(msg, msg_cap, "not permitted to take descriptor %d of process %d (pidfd_getfd: %s): ptrace_scope is %d "
            "here and the sender did not allow this process (Yama: PR_SET_PTRACER, or CAP_SYS_PTRACE)",
            pieces[got].fd, pid, strerror(e), ptrace_scope());
      else
        put(msg, msg_cap, "descriptor %d of process %d (piece %u of %u, %llu bytes) cannot be taken (pidfd_getfd: %s): "
            "the tensor was freed there, or the handle is stale or forged", pieces[got].fd, pid, got + 1, count,
            (unsigned long long)pieces[got].size, strerror(e));
      status = VMM_ERR_INVALID_ARGUMENT;
      break;
    }
    mine[got] = pieces[got];
    mine[got].fd = fd;
  }
  close(pidfd);
  if (status == VMM_OK) {
    vmm_status st = vmm_arena_ipc_import(a, mine, count, base);
    if (st != VMM_OK) {
      put(msg, msg_cap, "opening %llu bytes shared by process %d (its device %d) on device %d: %s",
          (unsigned long long)total, pid, from_device, device, vmm_arena_last_error(a));
      status = st;
    }
  }
  for (uint32_t i = 0; i < got; i++) close(mine[i].fd); /* the import holds the memory now */
  return status;
}

int vmm_torch_ipc_close(int device, void *base, char *msg, size_t msg_cap) {
  vmm_arena *a = vmm_torch__arena(device, msg, msg_cap);
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  vmm_status st = vmm_arena_ipc_close(a, base);
  if (st != VMM_OK) put(msg, msg_cap, "%s", vmm_arena_last_error(a));
  return st;
}
