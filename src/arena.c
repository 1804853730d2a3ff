/* Arena: creation and destruction, allocate and free, admission (limit and headroom), the
 * out-of-memory fallback (any fitting pooled mapping, then stitching), deferred frees of
 * capturing streams. One mutex per arena; stream synchronization happens outside it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define VMM_MAX_ALLOC ((size_t)1 << 47) /* 128 TiB: more than any device's VA space */

static __thread char create_error[512];

const char *vmm_create_error(void) { return create_error; }

static const char *const kind_names[] = {"package", "transient"};

/* ---- Counters ------------------------------------------------------------------------ */

void vmm_stat_add(vmm_arena *a, vmm_kind k, vmm_mapping_state s, size_t bytes, int sign) {
  vmm_kind_stats *ks = &a->kind[k];
  uint64_t *count, *total;
  switch (s) {
  case VMM_MAP_POOLED: count = &ks->pooled_count, total = &ks->pooled_bytes; break;
  case VMM_MAP_ABANDONED: count = &ks->abandoned_count, total = &ks->abandoned_bytes; break;
  default: count = &ks->live_count, total = &ks->live_bytes; break;
  }
  *count += (uint64_t)(int64_t)sign;
  *total += (uint64_t)((int64_t)sign * (int64_t)bytes);
}

void vmm_tag_account(vmm_arena *a, uint32_t tag, size_t bytes, int sign) {
  if (tag >= a->tag_cap) {
    if (sign < 0) return;
    size_t cap = a->tag_cap ? a->tag_cap : 16;
    while (cap <= tag) cap *= 2;
    uint64_t *b = realloc(a->tag_bytes, cap * sizeof *b);
    if (!b) return;
    a->tag_bytes = b;
    uint64_t *c = realloc(a->tag_count, cap * sizeof *c);
    if (!c) return;
    a->tag_count = c;
    memset(a->tag_bytes + a->tag_cap, 0, (cap - a->tag_cap) * sizeof *b);
    memset(a->tag_count + a->tag_cap, 0, (cap - a->tag_cap) * sizeof *c);
    a->tag_cap = cap;
  }
  a->tag_bytes[tag] += (uint64_t)((int64_t)sign * (int64_t)bytes);
  a->tag_count[tag] += (uint64_t)(int64_t)sign;
}

static void add_physical(vmm_arena *a, size_t bytes) {
  a->physical_bytes += bytes;
  if (a->physical_bytes > a->physical_peak) a->physical_peak = a->physical_bytes;
}

static void add_mapped(vmm_arena *a, size_t bytes) {
  a->mapped_bytes += bytes;
  if (a->mapped_bytes > a->mapped_peak) a->mapped_peak = a->mapped_bytes;
}

static void trace_op(vmm_arena *a, vmm_trace_op op, int kind, size_t requested, size_t rounded, CUdeviceptr ptr,
                     CUstream stream, uint32_t tag, vmm_status result) {
  if (!a->trace) return;
  vmm_trace_record r;
  r.t_ns = vmm_now_ns();
  r.op = op;
  r.kind = kind;
  r.requested = requested;
  r.rounded = rounded;
  r.ptr = (uint64_t)ptr;
  r.stream = (uint64_t)(uintptr_t)stream;
  const char *name = tag ? vmm_tag_name(tag) : NULL;
  snprintf(r.tag, sizeof r.tag, "%s", name ? name : "");
  r.result = result;
  vmm_trace_write(a->trace, &r);
}

/* ---- Creation ------------------------------------------------------------------------ */

static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static vmm_status create_fail(vmm_arena *a, vmm_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(create_error, sizeof create_error, fmt, ap);
  va_end(ap);
  if (a) vmm_log(1, a->cfg.log_level, "vmmarena: %s", create_error);
  return s;
}

#define CREATE_DRV(a, field, ...)                                                                          \
  do {                                                                                                     \
    CUresult r_ = VMM_DRV(a, field, __VA_ARGS__);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                                              \
      st = create_fail(a, r_ == CUDA_ERROR_OUT_OF_MEMORY ? VMM_ERR_OUT_OF_MEMORY : VMM_ERR_DRIVER,           \
                       "creating the arena for device %d: %s returned %s (%d)", cfg->device,               \
                       vmm_driver_entry_name(VMM_DRV_##field), vmm_cu_error_name(a->drv, r_), (int)r_);    \
      goto fail;                                                                                           \
    }                                                                                                      \
  } while (0)

vmm_status vmm_arena_create(const vmm_config *cfg_in, vmm_arena **out) {
  if (!out) return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_create: NULL out-pointer");
  *out = NULL;
  vmm_config defaults;
  if (!cfg_in) {
    vmm_config_init(&defaults);
    cfg_in = &defaults;
  }
  const vmm_config *cfg = cfg_in;
  if (cfg->device < 0 || cfg->device >= VMM_MAX_DEVICES)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "device %d out of range (0..%d)", cfg->device, VMM_MAX_DEVICES - 1);
  if (cfg->reuse == VMM_REUSE_BOUNDED && !(cfg->reuse_bound >= 1.0))
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reuse bound %g must be at least 1", cfg->reuse_bound);
  if ((unsigned)cfg->reuse > VMM_REUSE_NONE || (unsigned)cfg->retain > VMM_RETAIN_OFF)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "unknown reuse policy %d or retention mode %d", (int)cfg->reuse,
                       (int)cfg->retain);
  if (cfg->reserve_bytes == 0)
    return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "reserve_bytes must be greater than zero");
  const struct vmm_driver *drv = cfg->driver;
  if (!drv) {
    const char *why = NULL;
    drv = vmm_driver_cuda(&why);
    if (!drv) return create_fail(NULL, VMM_ERR_NO_DRIVER, "%s", why);
  }
  if (drv->version < 1) return create_fail(NULL, VMM_ERR_INVALID_ARGUMENT, "driver table version %u < 1", drv->version);

  vmm_arena *a = calloc(1, sizeof *a);
  if (!a) return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the arena");
  a->cfg = *cfg;
  a->drv = drv;
  vmm_status st = VMM_OK;
  int retained_ctx = 0;
  if (pthread_mutex_init(&a->lock, NULL)) {
    free(a);
    return create_fail(NULL, VMM_ERR_OUT_OF_MEMORY, "pthread_mutex_init failed");
  }
  if (vmm_table_init(&a->table)) {
    st = create_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the mapping table");
    goto fail;
  }
  CREATE_DRV(a, init, 0);
  int count = 0;
  CREATE_DRV(a, device_get_count, &count);
  if (cfg->device >= count) {
    st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d not present: the driver reports %d device(s)", cfg->device,
                     count);
    goto fail;
  }
  CREATE_DRV(a, device_get, &a->dev, cfg->device);
  int vmm_supported = 0;
  CREATE_DRV(a, device_get_attribute, &vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, a->dev);
  if (!vmm_supported) {
    st = create_fail(a, VMM_ERR_DRIVER, "device %d does not support virtual memory management", cfg->device);
    goto fail;
  }
  CREATE_DRV(a, device_get_attribute, &a->integrated, CU_DEVICE_ATTRIBUTE_INTEGRATED, a->dev);
  CREATE_DRV(a, primary_ctx_retain, &a->ctx, a->dev);
  retained_ctx = 1;
  a->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  a->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->prop.location.id = cfg->device;
  CREATE_DRV(a, mem_get_allocation_granularity, &a->granularity, &a->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (a->granularity == 0 || (a->granularity & (a->granularity - 1))) {
    st = create_fail(a, VMM_ERR_DRIVER, "device %d reports granularity %zu, not a power of two", cfg->device,
                     a->granularity);
    goto fail;
  }
  a->access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->access[0].location.id = cfg->device;
  a->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  a->access_count = 1;
  int all_peers = cfg->peer_access_mask == ~(uint64_t)0;
  for (int d = 0; d < VMM_MAX_DEVICES; d++) {
    if (d == cfg->device || !(cfg->peer_access_mask >> d & 1)) continue;
    if (d >= count) {
      if (all_peers) break;
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "peer access to device %d asked, but only %d device(s) exist", d,
                       count);
      goto fail;
    }
    CUdevice peer;
    int can = 0;
    CREATE_DRV(a, device_get, &peer, d);
    CREATE_DRV(a, device_can_access_peer, &can, peer, a->dev);
    if (!can) {
      if (all_peers) continue;
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "device %d cannot access device %d's memory (no peer path)", d,
                       cfg->device);
      goto fail;
    }
    a->access[a->access_count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a->access[a->access_count].location.id = d;
    a->access[a->access_count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    a->access_count++;
  }
  a->retention_enabled =
      cfg->retain == VMM_RETAIN_ON || (cfg->retain == VMM_RETAIN_AUTO && a->integrated);
  a->next_scope_id = 0;
  if (cfg->trace_path) {
    /* Each device's arena gets its own file: "%d" in the path is its ordinal, and without
     * one, devices other than 0 append ".<ordinal>". */
    char path[4096];
    const char *mark = strstr(cfg->trace_path, "%d");
    int n = mark ? snprintf(path, sizeof path, "%.*s%d%s", (int)(mark - cfg->trace_path), cfg->trace_path, cfg->device,
                            mark + 2)
            : cfg->device ? snprintf(path, sizeof path, "%s.%d", cfg->trace_path, cfg->device)
                          : snprintf(path, sizeof path, "%s", cfg->trace_path);
    if (n < 0 || (size_t)n >= sizeof path || !(a->trace = vmm_trace_open(path))) {
      st = create_fail(a, VMM_ERR_INVALID_ARGUMENT, "VMMARENA_TRACE=\"%s\" (file %s): cannot open for writing: %s",
                       cfg->trace_path, n >= 0 && (size_t)n < sizeof path ? path : "(path too long)",
                       n >= 0 && (size_t)n < sizeof path ? strerror(errno) : "path too long");
      goto fail;
    }
  }
  a->cfg.trace_path = NULL;
  vmm_ctx_leave(a);
  *out = a;
  return VMM_OK;
fail:
  vmm_ctx_leave(a);
  if (retained_ctx) a->drv->primary_ctx_release(a->dev);
  vmm_table_fini(&a->table);
  pthread_mutex_destroy(&a->lock);
  free(a);
  return st;
}

size_t vmm_arena_granularity(const vmm_arena *a) { return a ? a->granularity : 0; }
int vmm_arena_device(const vmm_arena *a) { return a ? a->cfg.device : -1; }

/* ---- Mapping life cycle -------------------------------------------------------------- */

static vmm_mapping *record_new(void) {
  vmm_mapping *m = calloc(1, sizeof *m);
  if (m) m->pieces = &m->one;
  return m;
}

static void record_free(vmm_mapping *m) {
  if (m->pieces != &m->one) free(m->pieces);
  free(m);
}

/* Releases a handle now; a failure keeps it on the retained list for a later retry. */
static vmm_status release_piece(vmm_arena *a, vmm_piece p, vmm_kind kind) {
  CUresult r = VMM_DRV(a, mem_release, p.handle);
  if (r == CUDA_SUCCESS) {
    a->physical_bytes -= p.size;
    return VMM_OK;
  }
  if (vmm_pieces_push(&a->retained, p, kind) == 0) {
    a->kind[kind].retained_count++;
    a->kind[kind].retained_bytes += p.size;
  }
  char b[32];
  return vmm_fail_driver(a, r, VMM_DRV_mem_release, "releasing a %s handle of %s", kind_names[kind],
                         vmm_fmt_bytes(p.size, b));
}

/* Records a piece whose undo unmap failed: it stays mapped, so its VA must not be handed out
 * again; destroy unmaps it. Its handle stays with the caller (releasing a mapped handle is
 * legal: the memory goes with the last mapping). */
static void keep_stuck(vmm_arena *a, CUdeviceptr base, size_t size) {
  if (a->stuck_count == a->stuck_cap) {
    size_t cap = a->stuck_cap ? a->stuck_cap * 2 : 8;
    vmm_reservation *grown = realloc(a->stuck, cap * sizeof *grown);
    if (!grown) {
      vmm_log(1, a->cfg.log_level, "vmmarena: host out of memory; mapping 0x%llx+%zu stays mapped until the process ends",
              (unsigned long long)base, size);
      return;
    }
    a->stuck = grown;
    a->stuck_cap = cap;
  }
  a->stuck[a->stuck_count++] = (vmm_reservation){base, size};
  a->stuck_bytes += size;
}

/* Returns [base, base + extent) to the free list except the pieces recorded stuck from index
 * `first_stuck` on (map_pieces records them in address order, all inside the range). */
static void free_range_unless_stuck(vmm_arena *a, CUdeviceptr base, size_t extent, uint32_t reservation,
                                    size_t first_stuck) {
  CUdeviceptr at = base, end = base + extent;
  for (size_t k = first_stuck; k < a->stuck_count; k++) {
    if (a->stuck[k].base > at) vmm_ranges_free(a, at, a->stuck[k].base - at, reservation);
    at = a->stuck[k].base + a->stuck[k].size;
  }
  if (at < end) vmm_ranges_free(a, at, end - at, reservation);
}

/* Maps m's pieces back to back at m->base and grants access; undoes itself on failure (a
 * piece whose unmap fails there is recorded by keep_stuck). */
static CUresult map_pieces(vmm_arena *a, vmm_mapping *m, vmm_driver_entry *failed) {
  size_t off = 0;
  CUresult r = CUDA_SUCCESS;
  uint32_t i;
  for (i = 0; i < m->piece_count; i++) {
    r = VMM_DRV(a, mem_map, m->base + off, m->pieces[i].size, 0, m->pieces[i].handle, 0);
    if (r != CUDA_SUCCESS) {
      *failed = VMM_DRV_mem_map;
      break;
    }
    off += m->pieces[i].size;
  }
  if (r == CUDA_SUCCESS) {
    r = VMM_DRV(a, mem_set_access, m->base, m->extent, a->access, a->access_count);
    if (r == CUDA_SUCCESS) return r;
    *failed = VMM_DRV_mem_set_access;
  }
  /* Undo the pieces mapped so far, one by one (each is a whole mapping). */
  for (size_t done = 0, j = 0; j < i; done += m->pieces[j].size, j++)
    if (VMM_DRV(a, mem_unmap, m->base + done, m->pieces[j].size) != CUDA_SUCCESS)
      keep_stuck(a, m->base + done, m->pieces[j].size);
  return r;
}

/* Records a refusal of new memory: the request, why, and what the arena holds. */
static vmm_status refuse(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static vmm_status refuse(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, const char *fmt, ...) {
  char why[300], holds[200], b[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  vmm_describe_holdings(a, holds, sizeof holds);
  return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s %s refused (requested %zu B, rounded %zu B): %s; %s", kind_names[kind],
                  vmm_fmt_bytes(rounded, b), bytes, rounded, why, holds);
}

/* Refuses new physical memory past the limit or below the headroom. */
static vmm_status admit(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind) {
  char b[4][32];
  if (a->cfg.limit_bytes && (a->physical_bytes > a->cfg.limit_bytes || rounded > a->cfg.limit_bytes - a->physical_bytes)) {
    a->limit_refusals++;
    /* Exact bytes too: rounded units cannot tell a limit of 16 MiB - 1 from 16 MiB. */
    return refuse(a, bytes, rounded, kind, "limit %s < %s held + %s requested (limit %zu B, %llu B required)",
                  vmm_fmt_bytes(a->cfg.limit_bytes, b[0]), vmm_fmt_bytes(a->physical_bytes, b[1]),
                  vmm_fmt_bytes(rounded, b[2]), a->cfg.limit_bytes,
                  (unsigned long long)a->physical_bytes + (unsigned long long)rounded);
  }
  if (!a->cfg.headroom_bytes) return VMM_OK;
  size_t found = 0, total = 0;
  CUresult r;
  const char *figure;
  if (a->integrated) {
    figure = "MemAvailable";
    r = VMM_DRV(a, host_memory_available, &found);
    if (r != CUDA_SUCCESS)
      return vmm_fail_driver(a, r, VMM_DRV_host_memory_available, "reading host MemAvailable for the headroom check");
  } else {
    figure = "device free memory";
    r = VMM_DRV(a, mem_get_info, &found, &total);
    if (r != CUDA_SUCCESS)
      return vmm_fail_driver(a, r, VMM_DRV_mem_get_info, "reading device free memory for the headroom check");
  }
  /* A sum past SIZE_MAX is refused and reported as SIZE_MAX, not as its wrapped value. */
  int overflow = rounded > SIZE_MAX - a->cfg.headroom_bytes;
  size_t required = overflow ? SIZE_MAX : rounded + a->cfg.headroom_bytes;
  if (overflow || found < required) {
    a->headroom_refusals++;
    return refuse(a, bytes, rounded, kind, "%s %s (%zu B) < %s + headroom %s (%zu B required)", figure,
                  vmm_fmt_bytes(found, b[0]), found, vmm_fmt_bytes(rounded, b[1]),
                  vmm_fmt_bytes(a->cfg.headroom_bytes, b[2]), required);
  }
  return VMM_OK;
}

/* Creates, reserves, maps and grants a fresh mapping; on failure everything is undone. */
static vmm_status new_mapping(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, vmm_mapping **out) {
  vmm_status st = admit(a, bytes, rounded, kind);
  if (st != VMM_OK) return st;
  vmm_mapping *m = record_new();
  if (!m || vmm_table_reserve(&a->table)) {
    free(m);
    return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a mapping record");
  }
  CUmemGenericAllocationHandle h = 0;
  CUresult r = VMM_DRV(a, mem_create, &h, rounded, &a->prop, 0);
  if (r != CUDA_SUCCESS) {
    record_free(m);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      size_t free_b = 0, total_b = 0;
      char b[2][32];
      a->oom_refusals++;
      if (VMM_DRV(a, mem_get_info, &free_b, &total_b) == CUDA_SUCCESS)
        return refuse(a, bytes, rounded, kind, "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY; device free %s of %s",
                      vmm_fmt_bytes(free_b, b[0]), vmm_fmt_bytes(total_b, b[1]));
      return refuse(a, bytes, rounded, kind, "cuMemCreate returned CUDA_ERROR_OUT_OF_MEMORY");
    }
    char b[32];
    return vmm_fail_driver(a, r, VMM_DRV_mem_create, "%s %s (requested %zu B, rounded %zu B): creating physical memory",
                           kind_names[kind], vmm_fmt_bytes(rounded, b), bytes, rounded);
  }
  add_physical(a, rounded);
  m->one = (vmm_piece){h, rounded};
  m->piece_count = 1;
  m->extent = rounded;
  m->kind = kind;
  st = vmm_ranges_alloc(a, rounded, &m->base, &m->reservation);
  if (st == VMM_OK) {
    vmm_driver_entry failed = VMM_DRV_mem_map;
    size_t first_stuck = a->stuck_count;
    r = map_pieces(a, m, &failed);
    if (r == CUDA_SUCCESS) {
      add_mapped(a, rounded);
      m->state = VMM_MAP_LIVE;
      vmm_stat_add(a, kind, VMM_MAP_LIVE, rounded, +1);
      vmm_table_insert(&a->table, m);
      *out = m;
      return VMM_OK;
    }
    free_range_unless_stuck(a, m->base, rounded, m->reservation, first_stuck);
    char b[32];
    st = vmm_fail_driver(a, r, failed, "%s %s (requested %zu B, rounded %zu B): mapping at 0x%llx", kind_names[kind],
                         vmm_fmt_bytes(rounded, b), bytes, rounded, (unsigned long long)m->base);
  }
  char keep[sizeof a->last_error];
  memcpy(keep, a->last_error, sizeof keep);
  (void)release_piece(a, m->one, kind);
  memcpy(a->last_error, keep, sizeof keep);
  record_free(m);
  return st;
}

/* Unmaps m whole and releases (or, inside an active scope, retains) its handles. A failed
 * unmap leaves m live in the table and its range out of the free list. */
static vmm_status unmap_and_dispose(vmm_arena *a, vmm_mapping *m, bool *unmapped) {
  *unmapped = false;
  int retain = a->scope == VMM_SCOPE_ACTIVE && a->retention_enabled;
  if (retain && vmm_pieces_reserve(&a->retained, m->piece_count))
    return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for the retained-handle list");
  CUresult r = VMM_DRV(a, mem_unmap, m->base, m->extent);
  if (r != CUDA_SUCCESS) {
    char b[32];
    return vmm_fail_driver(a, r, VMM_DRV_mem_unmap, "unmapping %s %s at 0x%llx", kind_names[m->kind],
                           vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  }
  *unmapped = true;
  a->mapped_bytes -= m->extent;
  vmm_stat_add(a, m->kind, m->state, m->extent, -1);
  vmm_table_remove(&a->table, m->base);
  vmm_ranges_free(a, m->base, m->extent, m->reservation);
  vmm_status st = VMM_OK;
  for (uint32_t i = 0; i < m->piece_count; i++) {
    if (retain) {
      vmm_pieces_push(&a->retained, m->pieces[i], m->kind);
      a->kind[m->kind].retained_count++;
      a->kind[m->kind].retained_bytes += m->pieces[i].size;
    } else {
      vmm_status s = release_piece(a, m->pieces[i], m->kind);
      if (st == VMM_OK) st = s;
    }
  }
  record_free(m);
  return st;
}

/* ---- Stream order for pool reuse ----------------------------------------------------- */

typedef struct reuse_ctx {
  vmm_arena *a;
  CUstream stream;
  int capturing; /* -1 unknown */
} reuse_ctx;

/* 1 if the stream is capturing (or its state cannot be read), 0 if not. */
static int stream_capturing(vmm_arena *a, CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = VMM_DRV(a, stream_is_capturing, s, &status);
  return r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
}

vmm_status vmm_wait_for_free(vmm_arena *a, const vmm_mapping *m, const char *what, CUstream *waited, size_t *n_waited,
                             size_t cap) {
  if (m->free_epoch != a->epoch) return VMM_OK; /* a quiesce came after the free */
  for (size_t i = 0; i < *n_waited; i++)
    if (waited[i] == m->stream) return VMM_OK;
  char b[32];
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = VMM_DRV(a, stream_is_capturing, m->stream, &status);
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) status = CU_STREAM_CAPTURE_STATUS_ACTIVE; /* legacy stream */
  else if (r != CUDA_SUCCESS)
    return vmm_fail_driver(a, r, VMM_DRV_stream_is_capturing, "%s: reading the capture state of stream %p", what,
                           (void *)m->stream);
  if (status != CU_STREAM_CAPTURE_STATUS_NONE)
    return vmm_fail(a, VMM_ERR_SCOPE_STATE,
                    "%s: pooled %s at 0x%llx was freed on stream %p, which is capturing and cannot be waited for "
                    "before the unmap; nothing touched",
                    what, vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base, (void *)m->stream);
  r = VMM_DRV(a, stream_synchronize, m->stream);
  if (r != CUDA_SUCCESS)
    return vmm_fail_driver(a, r, VMM_DRV_stream_synchronize, "%s: waiting for stream %p before unmapping pooled %s at 0x%llx",
                           what, (void *)m->stream, vmm_fmt_bytes(m->extent, b), (unsigned long long)m->base);
  if (*n_waited < cap) waited[(*n_waited)++] = m->stream;
  return VMM_OK;
}

/* A pooled mapping may go to `stream` if it was freed on that stream, if a quiesce passed
 * since its free, or if `stream` can be made to wait for its freeing stream's work. Nothing
 * is recorded on or waited from a capturing stream. */
static bool usable_on_stream(void *arg, vmm_mapping *m) {
  reuse_ctx *c = arg;
  vmm_arena *a = c->a;
  if (m->stream == c->stream || m->free_epoch < a->epoch) return true;
  if (c->capturing < 0) c->capturing = stream_capturing(a, c->stream);
  if (c->capturing || stream_capturing(a, m->stream)) return false;
  CUresult r;
  if (!a->order_event) {
    r = VMM_DRV(a, event_create, &a->order_event, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      a->order_event = NULL;
      vmm_fail_driver(a, r, VMM_DRV_event_create, "creating the stream-order event");
      return false;
    }
  }
  r = VMM_DRV(a, event_record, a->order_event, m->stream);
  if (r != CUDA_SUCCESS) {
    vmm_fail_driver(a, r, VMM_DRV_event_record, "recording the freeing stream for reuse");
    return false;
  }
  r = VMM_DRV(a, stream_wait_event, c->stream, a->order_event, 0);
  if (r != CUDA_SUCCESS) {
    vmm_fail_driver(a, r, VMM_DRV_stream_wait_event, "ordering the reusing stream after the free");
    return false;
  }
  return true;
}

static void become_live(vmm_arena *a, vmm_mapping *m, size_t bytes, CUstream stream, uint32_t tag) {
  if (m->state != VMM_MAP_LIVE) {
    vmm_stat_add(a, m->kind, m->state, m->extent, -1);
    m->state = VMM_MAP_LIVE;
    vmm_stat_add(a, m->kind, m->state, m->extent, +1);
  }
  m->requested = bytes;
  m->stream = stream;
  m->tag = tag;
  m->scope_id = a->scope == VMM_SCOPE_ACTIVE ? a->scope_id : 0;
  vmm_tag_account(a, tag, m->extent, +1);
}

/* ---- Stitching ----------------------------------------------------------------------- */

/* Maps back the candidates [0, n) at their old bases, last first, so that each LIFO bucket
 * gets them back in their old order; one that cannot be mapped back gives its handles to the
 * retained list (released at finish) and its range to the free list. */
static void restore_candidates(vmm_arena *a, vmm_mapping **c, size_t n) {
  for (size_t i = n; i-- > 0;) {
    vmm_driver_entry failed;
    size_t first_stuck = a->stuck_count;
    if (map_pieces(a, c[i], &failed) == CUDA_SUCCESS) {
      add_mapped(a, c[i]->extent);
      vmm_pool_push(&a->pool, c[i]); /* cannot fail: the take freed a bucket or kept one */
      continue;
    }
    vmm_stat_add(a, c[i]->kind, VMM_MAP_POOLED, c[i]->extent, -1);
    vmm_table_remove(&a->table, c[i]->base);
    free_range_unless_stuck(a, c[i]->base, c[i]->extent, c[i]->reservation, first_stuck);
    for (uint32_t j = 0; j < c[i]->piece_count; j++) {
      if (vmm_pieces_push(&a->retained, c[i]->pieces[j], c[i]->kind) == 0) {
        a->kind[c[i]->kind].retained_count++;
        a->kind[c[i]->kind].retained_bytes += c[i]->pieces[j].size;
      }
    }
    record_free(c[i]);
  }
}

/* The first usable mapping not yet chosen, in the bucket at `node` or, walking up (or down)
 * the sizes, the nearest bucket that has one. */
static vmm_mapping *pick_unchosen(vmm_arena *a, vmm_avl *node, bool upward, reuse_ctx *rc) {
  while (node) {
    vmm_bucket *b = vmm_container_of(node, vmm_bucket, node);
    vmm_assert(b->head); /* no empty bucket */
    for (vmm_mapping *x = b->head; x; x = x->pool_next)
      if (!x->stitch_chosen && usable_on_stream(rc, x)) return x;
    if (upward) node = vmm_avl_ceil(a->pool.root, b->size + 1, 0);
    else node = b->size > 1 ? vmm_avl_floor(a->pool.root, b->size - 1, 0) : NULL;
  }
  return NULL;
}

/* Unmaps idle pooled mappings (never releasing them) and maps their handles back to back
 * into a fresh range of at least `rounded` bytes. */
static vmm_status stitch(vmm_arena *a, size_t rounded, size_t most, reuse_ctx *rc, vmm_mapping **out) {
  size_t n = 0, sum = 0, pieces = 0;
  vmm_mapping **c = malloc((a->pool.count ? a->pool.count : 1) * sizeof *c);
  if (!c) return vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for stitching");
  /* Tightest cover: the smallest idle mapping that covers what is left ends the choice;
   * while none does, the largest smaller one is taken and the rest looked for again. */
  while (sum < rounded) {
    size_t left = rounded - sum;
    vmm_mapping *x = pick_unchosen(a, vmm_avl_ceil(a->pool.root, left, 0), true, rc);
    if (!x) x = pick_unchosen(a, vmm_avl_floor(a->pool.root, left - 1, 0), false, rc);
    if (!x) break;
    x->stitch_chosen = true;
    c[n++] = x;
    sum += x->extent;
    pieces += x->piece_count;
  }
  for (size_t i = 0; i < n; i++) c[i]->stitch_chosen = false;
  vmm_status st = VMM_ERR_OUT_OF_MEMORY;
  /* One mapping that fits is the plain fallback's job; more than `most` would pin backing
   * the reuse policy does not allow. */
  if (sum < rounded || sum > most || n < 2) goto out;
  CUstream waited[8];
  size_t n_waited = 0;
  for (size_t i = 0; i < n; i++) { /* the candidates are unmapped below */
    st = vmm_wait_for_free(a, c[i], "stitching", waited, &n_waited, 8);
    if (st == VMM_ERR_SCOPE_STATE) st = VMM_ERR_OUT_OF_MEMORY; /* freed on this capturing stream */
    if (st != VMM_OK) goto out;
  }
  vmm_mapping *s = record_new();
  vmm_piece *list = malloc(pieces * sizeof *list);
  if (!s || !list || vmm_table_reserve(&a->table)) {
    free(s);
    free(list);
    st = vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a stitched mapping");
    goto out;
  }
  s->pieces = list;
  s->piece_count = (uint32_t)pieces;
  s->extent = sum;
  s->kind = VMM_KIND_TRANSIENT;
  st = vmm_ranges_alloc(a, sum, &s->base, &s->reservation);
  if (st != VMM_OK) {
    record_free(s);
    goto out;
  }
  for (size_t i = 0; i < n; i++) vmm_pool_remove(&a->pool, c[i]);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    CUresult r = VMM_DRV(a, mem_unmap, c[i]->base, c[i]->extent);
    if (r != CUDA_SUCCESS) {
      for (size_t j = n; j-- > i;) vmm_pool_push(&a->pool, c[j]); /* still mapped; last first */
      restore_candidates(a, c, i);
      vmm_ranges_free(a, s->base, s->extent, s->reservation);
      record_free(s);
      st = vmm_fail_driver(a, r, VMM_DRV_mem_unmap, "unmapping a pooled mapping for stitching");
      goto out;
    }
    a->mapped_bytes -= c[i]->extent;
    for (uint32_t j = 0; j < c[i]->piece_count; j++) list[k++] = c[i]->pieces[j];
  }
  vmm_driver_entry failed = VMM_DRV_mem_map;
  size_t first_stuck = a->stuck_count;
  CUresult r = map_pieces(a, s, &failed);
  if (r != CUDA_SUCCESS) {
    free_range_unless_stuck(a, s->base, s->extent, s->reservation, first_stuck);
    restore_candidates(a, c, n);
    record_free(s);
    st = vmm_fail_driver(a, r, failed, "mapping %zu stitched handles", pieces);
    goto out;
  }
  add_mapped(a, sum);
  for (size_t i = 0; i < n; i++) {
    vmm_stat_add(a, c[i]->kind, VMM_MAP_POOLED, c[i]->extent, -1);
    vmm_table_remove(&a->table, c[i]->base);
    vmm_ranges_free(a, c[i]->base, c[i]->extent, c[i]->reservation);
    record_free(c[i]);
  }
  s->state = VMM_MAP_POOLED; /* become_live moves it to live */
  vmm_stat_add(a, s->kind, s->state, s->extent, +1);
  vmm_table_insert(&a->table, s);
  *out = s;
  st = VMM_OK;
out:
  free(c);
  return st;
}

/* ---- Allocate ------------------------------------------------------------------------ */

static vmm_status alloc_locked(vmm_arena *a, size_t bytes, size_t rounded, vmm_kind kind, CUstream stream,
                               uint32_t tag, vmm_mapping **out) {
  if (a->deferred_head) vmm_process_deferred(a);
  int pooling = a->scope == VMM_SCOPE_ACTIVE && a->retention_enabled && kind == VMM_KIND_TRANSIENT &&
                a->cfg.reuse != VMM_REUSE_NONE;
  reuse_ctx rc = {a, stream, -1};
  vmm_mapping *m = NULL;
  size_t hi = rounded; /* the largest extent the reuse policy hands to this request */
  if (a->cfg.reuse == VMM_REUSE_BEST_FIT) hi = SIZE_MAX;
  else if (a->cfg.reuse == VMM_REUSE_BOUNDED) {
    double bound = (double)rounded * a->cfg.reuse_bound;
    hi = bound >= (double)SIZE_MAX ? SIZE_MAX : (size_t)bound;
  }
  if (pooling) {
    m = vmm_pool_take(&a->pool, rounded, hi, usable_on_stream, &rc);
    if (m) {
      a->pool_hits++;
      become_live(a, m, bytes, stream, tag);
      *out = m;
      return VMM_OK;
    }
    a->pool_misses++;
    /* Eager stitching: idle handles that together cover the request before new memory. */
    if (a->cfg.stitch == VMM_STITCH_EAGER && a->pool.bytes >= rounded) {
      vmm_status s = stitch(a, rounded, hi, &rc, &m);
      if (s == VMM_OK) {
        a->stitches++;
        become_live(a, m, bytes, stream, tag);
        *out = m;
        return VMM_OK;
      }
      if (s != VMM_ERR_OUT_OF_MEMORY) return s;
    }
  }
  vmm_status st = new_mapping(a, bytes, rounded, kind, &m);
  if (st == VMM_OK) {
    become_live(a, m, bytes, stream, tag);
    *out = m;
    return VMM_OK;
  }
  if (st != VMM_ERR_OUT_OF_MEMORY || !pooling) return st;
  char refusal[sizeof a->last_error];
  memcpy(refusal, a->last_error, sizeof refusal);
  m = vmm_pool_take(&a->pool, rounded, SIZE_MAX, usable_on_stream, &rc);
  if (m) {
    a->pool_fallbacks++;
    become_live(a, m, bytes, stream, tag);
    *out = m;
    return VMM_OK;
  }
  if (a->cfg.stitch) {
    vmm_status s = stitch(a, rounded, SIZE_MAX, &rc, &m);
    if (s == VMM_OK) {
      a->stitches++;
      become_live(a, m, bytes, stream, tag);
      *out = m;
      return VMM_OK;
    }
    if (s != VMM_ERR_OUT_OF_MEMORY) return s;
  }
  char b[32];
  vmm_fail(a, VMM_ERR_OUT_OF_MEMORY, "%s; no pooled mapping fits%s (pool %zu mappings, %s)", refusal,
           a->cfg.stitch ? " and stitching found too little" : "", a->pool.count, vmm_fmt_bytes(a->pool.bytes, b));
  return VMM_ERR_OUT_OF_MEMORY;
}

vmm_status vmm_arena_alloc(vmm_arena *a, size_t bytes, vmm_kind kind, CUstream stream, void **out) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st;
  size_t rounded = 0;
  uint32_t tag = vmm_tag_current_id();
  vmm_mapping *m = NULL;
  if (!out) {
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: NULL out-pointer (%zu bytes requested)", bytes);
  } else if ((unsigned)kind >= VMM_KIND_COUNT) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: unknown kind %d", (int)kind);
  } else if (bytes == 0) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "vmm_arena_alloc: 0 bytes requested (%s)", kind_names[kind]);
  } else if (bytes > VMM_MAX_ALLOC) {
    *out = NULL;
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT,
                  "vmm_arena_alloc: %zu bytes (%s) is more than the %zu-byte virtual address space", bytes,
                  kind_names[kind], VMM_MAX_ALLOC);
  } else {
    *out = NULL;
    rounded = (bytes + a->granularity - 1) & ~(a->granularity - 1);
    st = alloc_locked(a, bytes, rounded, kind, stream, tag, &m);
    if (st == VMM_OK) {
      a->allocs++;
      *out = (void *)(uintptr_t)m->base;
    }
  }
  trace_op(a, VMM_TRACE_ALLOC, (unsigned)kind < VMM_KIND_COUNT ? (int)kind : -1, bytes, rounded, m && st == VMM_OK ? m->base : 0,
           stream, tag, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Free ---------------------------------------------------------------------------- */

static const char *state_name(vmm_mapping_state s) {
  switch (s) {
  case VMM_MAP_LIVE: return "live";
  case VMM_MAP_POOLED: return "already freed (idle in the pool)";
  case VMM_MAP_FREEING: return "already being freed by another call";
  case VMM_MAP_DEFERRED: return "already freed (waiting for a capture to end)";
  case VMM_MAP_ABANDONED: return "already freed (abandoned by an aborted scope)";
  }
  return "?";
}

static vmm_status refuse_pointer(vmm_arena *a, CUdeviceptr p, vmm_mapping *m) {
  char b[32];
  if (m)
    return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): %s %s allocation of %zu bytes is %s", (unsigned long long)p,
                    vmm_fmt_bytes(m->extent, b), kind_names[m->kind], m->requested, state_name(m->state));
  vmm_mapping *c = vmm_table_containing(&a->table, p);
  if (c)
    return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER,
                    "free(0x%llx): interior pointer, %llu bytes into the %s allocation at 0x%llx (%s extent, %zu bytes "
                    "requested); free takes the base pointer",
                    (unsigned long long)p, (unsigned long long)(p - c->base), kind_names[c->kind],
                    (unsigned long long)c->base, vmm_fmt_bytes(c->extent, b), c->requested);
  return vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(0x%llx): not an allocation of the arena of device %d (%zu mappings)",
                  (unsigned long long)p, a->cfg.device, a->table.count);
}

/* Moves m to its aborted scope's abandoned memory: no driver call until destroy. */
static void abandon(vmm_arena *a, vmm_mapping *m) {
  vmm_stat_add(a, m->kind, m->state, m->extent, -1);
  m->state = VMM_MAP_ABANDONED;
  vmm_stat_add(a, m->kind, m->state, m->extent, +1);
}

void vmm_process_deferred(vmm_arena *a) {
  vmm_mapping **link = &a->deferred_head;
  while (*link) {
    vmm_mapping *m = *link;
    if (vmm_scope_aborted(a, m->scope_id)) { /* aborted while its free waited for the capture */
      *link = m->pool_next;
      m->pool_next = NULL;
      abandon(a, m);
      continue;
    }
    if (stream_capturing(a, m->stream) || VMM_DRV(a, stream_synchronize, m->stream) != CUDA_SUCCESS) {
      link = &m->pool_next;
      continue;
    }
    *link = m->pool_next;
    m->pool_next = NULL;
    bool unmapped;
    if (unmap_and_dispose(a, m, &unmapped) != VMM_OK && !unmapped) {
      /* The unmap failed: keep it deferred for the next attempt. */
      m->pool_next = *link;
      *link = m;
      return;
    }
  }
}

vmm_status vmm_arena_free(vmm_arena *a, void *ptr, CUstream stream) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  CUdeviceptr base = (CUdeviceptr)(uintptr_t)ptr;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  vmm_mapping *m = vmm_table_find(&a->table, base);
  size_t extent = 0;
  int kind = -1;
  uint32_t tag = 0;
  if (!ptr) {
    st = vmm_fail(a, VMM_ERR_UNKNOWN_POINTER, "free(NULL): not an allocation");
    goto done;
  }
  if (!m || m->state != VMM_MAP_LIVE) {
    st = refuse_pointer(a, base, m);
    goto done;
  }
  extent = m->extent;
  kind = (int)m->kind;
  tag = m->tag;
  if (a->deferred_head) vmm_process_deferred(a);
  if (vmm_scope_aborted(a, m->scope_id)) {
    abandon(a, m);
    goto freed;
  }
  if (a->scope == VMM_SCOPE_ACTIVE && a->retention_enabled && m->kind == VMM_KIND_TRANSIENT) {
    vmm_stat_add(a, m->kind, m->state, m->extent, -1);
    m->state = VMM_MAP_POOLED;
    m->stream = stream;
    m->free_epoch = a->epoch;
    if (vmm_pool_push(&a->pool, m) == 0) {
      vmm_stat_add(a, m->kind, m->state, m->extent, +1);
      goto freed;
    }
    m->state = VMM_MAP_LIVE; /* no memory for a bucket: free it the plain way */
    vmm_stat_add(a, m->kind, m->state, m->extent, +1);
  }
  if (stream_capturing(a, stream)) {
    m->state = VMM_MAP_DEFERRED;
    m->stream = stream;
    m->pool_next = a->deferred_head;
    a->deferred_head = m;
    a->deferred_frees++;
    goto freed;
  }
  m->state = VMM_MAP_FREEING;
  pthread_mutex_unlock(&a->lock);
  CUresult r = VMM_DRV(a, stream_synchronize, stream);
  pthread_mutex_lock(&a->lock);
  m->state = VMM_MAP_LIVE;
  if (r != CUDA_SUCCESS) {
    st = vmm_fail_driver(a, r, VMM_DRV_stream_synchronize, "synchronizing stream %p before freeing 0x%llx", (void *)stream,
                         (unsigned long long)base);
    goto done;
  }
  if (vmm_scope_aborted(a, m->scope_id)) { /* aborted while the stream synchronized, unlocked */
    abandon(a, m);
    goto freed;
  }
  vmm_tag_account(a, tag, extent, -1);
  a->frees++;
  bool unmapped;
  st = unmap_and_dispose(a, m, &unmapped);
  if (!unmapped) {
    /* The unmap failed: the allocation stays live; a later free retries. */
    vmm_tag_account(a, tag, extent, +1);
    a->frees--;
  }
  goto done;
freed:
  vmm_tag_account(a, tag, extent, -1);
  a->frees++;
done:
  trace_op(a, VMM_TRACE_FREE, kind, 0, extent, base, stream, tag, st);
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

vmm_status vmm_arena_quiesce(vmm_arena *a) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  if (a->deferred_head) vmm_process_deferred(a);
  CUresult r = VMM_DRV(a, ctx_synchronize);
  if (r != CUDA_SUCCESS) st = vmm_fail_driver(a, r, VMM_DRV_ctx_synchronize, "synchronizing device %d to quiesce", a->cfg.device);
  else a->epoch++;
  vmm_ctx_leave(a);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* ---- Destroy ------------------------------------------------------------------------- */

void vmm_mapping_destroy_record(vmm_arena *a, vmm_mapping *m) {
  CUresult r = VMM_DRV(a, mem_unmap, m->base, m->extent);
  if (r != CUDA_SUCCESS)
    vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemUnmap(0x%llx, %zu) failed: %s", (unsigned long long)m->base,
            m->extent, vmm_cu_error_name(a->drv, r));
  for (uint32_t i = 0; i < m->piece_count; i++) {
    r = VMM_DRV(a, mem_release, m->pieces[i].handle);
    if (r != CUDA_SUCCESS)
      vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemRelease failed: %s", vmm_cu_error_name(a->drv, r));
  }
  record_free(m);
}

static void release_list(vmm_arena *a, vmm_piece_list *l) {
  for (size_t i = 0; i < l->count; i++) {
    CUresult r = VMM_DRV(a, mem_release, l->items[i].handle);
    if (r != CUDA_SUCCESS)
      vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemRelease failed: %s", vmm_cu_error_name(a->drv, r));
  }
  free(l->items);
  free(l->kinds);
  memset(l, 0, sizeof *l);
}

void vmm_arena_destroy(vmm_arena *a) {
  if (!a) return;
  pthread_mutex_lock(&a->lock);
  (void)VMM_DRV(a, ctx_synchronize);
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) vmm_mapping_destroy_record(a, m);
  release_list(a, &a->retained);
  release_list(a, &a->abandoned);
  for (size_t i = 0; i < a->stuck_count; i++) {
    CUresult r = VMM_DRV(a, mem_unmap, a->stuck[i].base, a->stuck[i].size);
    if (r != CUDA_SUCCESS)
      vmm_log(1, a->cfg.log_level, "vmmarena: destroy: cuMemUnmap(0x%llx, %zu) failed again: %s",
              (unsigned long long)a->stuck[i].base, a->stuck[i].size, vmm_cu_error_name(a->drv, r));
  }
  free(a->stuck);
  vmm_pool_fini(&a->pool);
  vmm_table_fini(&a->table);
  vmm_ranges_fini(a);
  if (a->order_event) (void)VMM_DRV(a, event_destroy, a->order_event);
  vmm_ctx_leave(a);
  if (a->ctx) a->drv->primary_ctx_release(a->dev);
  vmm_trace_close(a->trace);
  free(a->aborted_scopes);
  free(a->tag_bytes);
  free(a->tag_count);
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

vmm_status vmm_arena_trace(vmm_arena *a, const char *path) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status st = VMM_OK;
  vmm_trace_close(a->trace);
  a->trace = NULL;
  if (path && !(a->trace = vmm_trace_open(path)))
    st = vmm_fail(a, VMM_ERR_INVALID_ARGUMENT, "trace \"%s\": cannot open for writing: %s", path, strerror(errno));
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* A copy taken under the lock into a buffer of the calling thread: stable until this thread's
 * next call, however other threads fail meanwhile. */
const char *vmm_arena_last_error(vmm_arena *a) {
  static __thread char copy[sizeof a->last_error];
  if (!a) return "no arena";
  pthread_mutex_lock(&a->lock);
  memcpy(copy, a->last_error, sizeof copy);
  pthread_mutex_unlock(&a->lock);
  return copy;
}

vmm_status vmm_arena_fatal_error(vmm_arena *a, const char **message) {
  if (!a) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_status s = a->fatal_status;
  if (message) *message = s == VMM_OK ? "" : a->fatal_message;
  pthread_mutex_unlock(&a->lock);
  return s;
}
