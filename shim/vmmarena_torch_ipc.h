/* vmmarena_torch_ipc: CUDA IPC of whole-process mode (vmmarena.install()), the C part of the
 * native allocator's shareIpcHandle and getIpcDevPtr (shim/torch_allocator/vmmarena_allocator.cpp).
 *
 * The handle (vmmarena's own format, little-endian, binary):
 *   "VMMA" magic (its first byte, 0x56, is above PyTorch's SHAREABLE_HANDLE_VERSION, so a
 *   receiver on PyTorch's own allocator refuses it as "a sharable handle from a future version
 *   of torch"), u32 version (1), i32 sender pid, u64 the sender's start time (/proc/PID/stat
 *   field 22, so that a recycled pid is refused), i32 sender device, u32 piece count, u64
 *   total bytes; per piece: i32 descriptor number in the sender, u32 0, u64 offset, u64 size;
 *   u64 FNV-1a of everything before it.
 * The sender's arena keeps each exported descriptor open while its handle lives; the receiver
 * duplicates them (pidfd_open + pidfd_getfd), imports them into its own arena's VA, and closes
 * its duplicates at once: nothing stays open in either process beyond the handles' lives.
 * ptrace: pidfd_getfd needs ptrace rights over the sender. Under Yama ptrace_scope 1 a child
 * has none over its parent (torch.multiprocessing's usual direction), so the first share of a
 * process whose ptrace_scope is 1 calls prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY): processes
 * of the same user may then duplicate its descriptors, as under ptrace_scope 0. Scope 2 or 3
 * forbids it: the receiver's error says so. */
#ifndef VMMARENA_TORCH_IPC_H
#define VMMARENA_TORCH_IPC_H

#include <stddef.h>

#include "vmmarena_torch.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VMM_TORCH_IPC_MAX_PIECES 256 /* pieces of one shared allocation */

/* The handle of the live allocation at ptr (its base or a page slot) of `device`'s arena into
 * buf (cap bytes; *len its length) and in *offset where ptr lies in the range it maps. A
 * status of vmmarena (VMM_OK = 0); on failure the message (with the numbers) is in msg. */
VMM_TORCH_API int vmm_torch_ipc_share(void *ptr, int device, char *buf, size_t cap, size_t *len, size_t *offset,
                                      char *msg, size_t msg_cap);
/* Opens a handle of vmm_torch_ipc_share in `device`'s arena: *base is the start of the range
 * (add the offset). A stale, forged or other-device handle, or one of a process that exited,
 * is refused with a status and a message; nothing is mapped and no descriptor stays open. */
VMM_TORCH_API int vmm_torch_ipc_open(const char *handle, size_t len, int device, void **base, char *msg,
                                     size_t msg_cap);
/* Unmaps and releases what vmm_torch_ipc_open mapped (after the device's work). */
VMM_TORCH_API int vmm_torch_ipc_close(int device, void *base, char *msg, size_t msg_cap);
/* Whether `handle` starts with vmmarena's magic (1) or not (0). */
VMM_TORCH_API int vmm_torch_ipc_is_ours(const char *handle, size_t len);

#ifdef __cplusplus
}
#endif
#endif
