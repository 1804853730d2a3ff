/* Driver calls: per-entry-point timing and counters, the arena's context, and the real
 * table loaded from libcuda.so.1 at run time. This is the only file that names cu* symbols. */
#include <dlfcn.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static const char *const entry_names[] = {
#define VMM_ENTRY_NAME(field, symbol) symbol,
    VMM_DRIVER_ENTRY_POINTS(VMM_ENTRY_NAME)
#undef VMM_ENTRY_NAME
};

const char *vmm_driver_entry_name(vmm_driver_entry entry) {
  return (unsigned)entry < VMM_DRV_ENTRY_COUNT ? entry_names[entry] : "unknown entry point";
}

uint64_t vmm_driver_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void vmm_driver_account(vmm_arena *a, vmm_driver_entry e, CUresult r, uint64_t t0) {
  uint64_t dt = vmm_driver_now_ns() - t0;
  vmm_driver_stats *s = &a->drv_stats[e];
  __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&s->ns, dt, __ATOMIC_RELAXED);
  if (r != CUDA_SUCCESS) __atomic_fetch_add(&s->failures, 1, __ATOMIC_RELAXED);
}

/* The arena whose context this thread pushed during the current public call. */
static __thread vmm_arena *ctx_pushed_for;

void vmm_driver_ctx_enter(vmm_arena *a) {
  if (ctx_pushed_for == a || !a->ctx) return;
  if (VMM_DRV_COUNTED(a, ctx_push_current, a->ctx) == CUDA_SUCCESS) ctx_pushed_for = a;
}

void vmm_driver_ctx_leave(vmm_arena *a) {
  if (ctx_pushed_for != a) return;
  CUcontext popped;
  (void)VMM_DRV_COUNTED(a, ctx_pop_current, &popped);
  ctx_pushed_for = NULL;
}

/* ---- The real table ------------------------------------------------------------------ */

static struct vmm_driver cuda_table;
static const char *cuda_why;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static char cuda_why_buf[256];

typedef CUresult (*get_proc_address_fn)(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status);

/* The CUDA version whose form of an entry point the table's prototype is: the capture-graph
 * queries are the 12.3 forms (with edge data), the rest the 12.0 forms. */
static int entry_cuda_version(int e) {
  return e == VMM_DRV_stream_get_capture_info || e == VMM_DRV_graph_node_get_dependencies ? 12030 : 12000;
}

/* Entry points a driver may lack: the field stays NULL and the library does without. */
static bool entry_optional(int e) {
  return e == VMM_DRV_stream_get_capture_info || e == VMM_DRV_graph_node_get_dependencies;
}

static void load_cuda(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(cuda_why_buf, sizeof cuda_why_buf, "libcuda.so.1 could not be loaded (%s): no NVIDIA driver on this machine?",
             dlerror());
    cuda_why = cuda_why_buf;
    return;
  }
  get_proc_address_fn get_proc = (get_proc_address_fn)dlsym(lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    cuda_why = "libcuda.so.1 has no cuGetProcAddress_v2: the driver is older than CUDA 12";
    return;
  }
  struct vmm_driver t;
  memset(&t, 0, sizeof t);
  t.version = VMM_DRIVER_VERSION;
  t.name = "cuda";
  void **fields[] = {
#define VMM_ENTRY_FIELD(field, symbol) (void **)&t.field,
      VMM_DRIVER_ENTRY_POINTS(VMM_ENTRY_FIELD)
#undef VMM_ENTRY_FIELD
  };
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) {
    if (e == VMM_DRV_host_memory_available) continue; /* read from /proc, not the driver */
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    void *fn = NULL;
    CUresult r = get_proc(entry_names[e], &fn, entry_cuda_version(e), CU_GET_PROC_ADDRESS_DEFAULT, &status);
    bool found = r == CUDA_SUCCESS && fn && status == CU_GET_PROC_ADDRESS_SUCCESS;
    if (!found && entry_optional(e)) continue;
    if (!found) {
      snprintf(cuda_why_buf, sizeof cuda_why_buf, "libcuda.so.1 lacks %s (cuGetProcAddress returned %d, status %d)",
               entry_names[e], (int)r, (int)status);
      cuda_why = cuda_why_buf;
      return;
    }
    *fields[e] = fn;
  }
  t.host_memory_available = vmm_meminfo_available;
  cuda_table = t;
}

const struct vmm_driver *vmm_driver_cuda(const char **why) {
  pthread_once(&cuda_once, load_cuda);
  if (cuda_why) {
    if (why) *why = cuda_why;
    return NULL;
  }
  return &cuda_table;
}
