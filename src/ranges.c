/* VA ranges: reservations from cuMemAddressReserve and a best-fit, coalescing free list.
 * Free ranges are indexed by address (for coalescing) and by (size, address) (for best fit);
 * a range never spans two reservations. Allocation cuts from the top of a free range so the
 * range keeps its base and only its size key changes. Where mappings grow in place
 * (whole-process mode), a range goes in the middle of the largest free range instead, while
 * that is at least VMM_SPREAD times its size, so that VA stays free on both sides of it. Stuck
 * pieces (a handle whose undo unmap failed, so it stays mapped) are kept out of the free list
 * until they are unmapped. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static vmm_free_range *by_addr(vmm_avl *n) { return n ? vmm_container_of(n, vmm_free_range, by_addr) : NULL; }
static vmm_free_range *by_size(vmm_avl *n) { return n ? vmm_container_of(n, vmm_free_range, by_size) : NULL; }

static void insert_range(vmm_ranges *r, vmm_free_range *f) {
  f->by_addr.k1 = f->base;
  f->by_addr.k2 = 0;
  f->by_size.k1 = f->size;
  f->by_size.k2 = f->base;
  r->by_addr = vmm_avl_insert(r->by_addr, &f->by_addr);
  r->by_size = vmm_avl_insert(r->by_size, &f->by_size);
  r->free_bytes += f->size;
  r->free_range_count++;
}

static void remove_range(vmm_ranges *r, vmm_free_range *f) {
  r->by_addr = vmm_avl_remove(r->by_addr, f->base, 0);
  r->by_size = vmm_avl_remove(r->by_size, f->size, f->base);
  r->free_bytes -= f->size;
  r->free_range_count--;
}

/* Adds a reservation of at least `size` bytes; its whole extent becomes one free range. */
static vmm_status grow(vmm_arena *a, size_t size) {
  vmm_ranges *r = &a->ranges;
  size_t g = a->granularity;
  size_t want = size > a->cfg.reserve_bytes ? size : a->cfg.reserve_bytes;
  want = (want + g - 1) / g * g;
  vmm_reservation *room = vmm_array_room(r->reservations, r->reservation_count, &r->reservation_cap, sizeof *room);
  if (!room) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory growing the reservation list");
  r->reservations = room;
  vmm_free_range *f = malloc(sizeof *f);
  if (!f) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a free-range record");
  CUdeviceptr base = 0;
  CUresult res = VMM_DRV(a, mem_address_reserve, &base, want, g, 0, 0);
  if (res != CUDA_SUCCESS && want > size) {
    /* A smaller reservation that still fits the request. */
    want = (size + g - 1) / g * g;
    res = VMM_DRV(a, mem_address_reserve, &base, want, g, 0, 0);
  }
  if (res != CUDA_SUCCESS) {
    free(f);
    char b[32];
    return vmm_errors_fail_driver(a, res, VMM_DRV_mem_address_reserve, "reserving %s of virtual address space",
                           vmm_errors_fmt_bytes(want, b));
  }
  r->reservations[r->reservation_count] = (vmm_reservation){base, want};
  f->base = base;
  f->size = want;
  f->reservation = r->reservation_count++;
  r->reserved_bytes += want;
  insert_range(r, f);
  return VMM_OK;
}

/* The free range that holds [base, base + size) whole, in `reservation`, or NULL. */
static vmm_free_range *holding(const vmm_ranges *r, CUdeviceptr base, size_t size, uint32_t reservation) {
  vmm_free_range *f = by_addr(vmm_avl_floor(r->by_addr, base, 0));
  return f && f->reservation == reservation && f->base + f->size >= base + size ? f : NULL;
}

/* Takes [base, base + size) out of f, which holds it: f keeps what lies below, a new record
 * what lies above. -1 on host OOM, nothing changed. */
static int carve(vmm_ranges *r, vmm_free_range *f, CUdeviceptr base, size_t size) {
  CUdeviceptr end = f->base + f->size;
  bool below = base > f->base, above = base + size < end;
  vmm_free_range *upper = below && above ? malloc(sizeof *upper) : NULL;
  if (below && above && !upper) return -1;
  remove_range(r, f);
  if (upper) {
    upper->base = base + size, upper->size = end - upper->base, upper->reservation = f->reservation;
    insert_range(r, upper);
  }
  if (!below && !above) {
    free(f);
    return 0;
  }
  if (below) f->size = base - f->base;
  else f->base = base + size, f->size = end - f->base;
  insert_range(r, f);
  return 0;
}

#define VMM_SPREAD 4 /* a range goes in the middle of a free range at least this many times its size */

vmm_status vmm_ranges_alloc(vmm_arena *a, size_t size, CUdeviceptr *base, uint32_t *reservation) {
  vmm_ranges *r = &a->ranges;
  vmm_free_range *f = by_size(vmm_avl_ceil(r->by_size, size, 0)); /* the best fit */
  if (!f) {
    vmm_status s = grow(a, size);
    if (s != VMM_OK) return s;
    f = by_size(vmm_avl_ceil(r->by_size, size, 0));
    vmm_assert(f);
  }
  vmm_free_range *largest = vmm_grows_in_place(a) ? by_size(vmm_avl_last(r->by_size)) : NULL;
  if (largest && largest->size / VMM_SPREAD >= size) {
    CUdeviceptr middle = largest->base + (largest->size - size) / 2 / a->granularity * a->granularity;
    *reservation = largest->reservation;
    if (carve(r, largest, middle, size) == 0) return *base = middle, VMM_OK; /* else nothing changed */
  }
  *reservation = f->reservation;
  *base = f->base + f->size - size;
  int carved = carve(r, f, *base, size); /* from the top: no new record, so it cannot fail */
  vmm_assert(carved == 0);
  (void)carved;
  return VMM_OK;
}

bool vmm_ranges_is_free(const vmm_ranges *r, CUdeviceptr base, size_t size, uint32_t reservation) {
  return size && holding(r, base, size, reservation);
}

vmm_status vmm_ranges_claim(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation) {
  vmm_free_range *f = holding(&a->ranges, base, size, reservation);
  vmm_assert(f); /* vmm_ranges_is_free said so, and nothing took VA since */
  if (f && carve(&a->ranges, f, base, size) == 0) return VMM_OK;
  char b[32];
  return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory claiming %s of VA at 0x%llx", vmm_errors_fmt_bytes(size, b),
                  (unsigned long long)base);
}

void vmm_ranges_free(vmm_arena *a, CUdeviceptr base, size_t size, uint32_t reservation) {
  vmm_ranges *r = &a->ranges;
  vmm_free_range *prev = by_addr(vmm_avl_floor(r->by_addr, base, 0));
  vmm_free_range *next = by_addr(vmm_avl_ceil(r->by_addr, base + size, 0));
  int merge_prev = prev && prev->reservation == reservation && prev->base + prev->size == base;
  int merge_next = next && next->reservation == reservation && next->base == base + size;
  if (merge_prev) {
    remove_range(r, prev);
    prev->size += size;
    if (merge_next) {
      remove_range(r, next);
      prev->size += next->size;
      free(next);
    }
    insert_range(r, prev);
    return;
  }
  if (merge_next) {
    remove_range(r, next);
    next->base = base;
    next->size += size;
    insert_range(r, next);
    return;
  }
  vmm_free_range *f = malloc(sizeof *f);
  if (!f) {
    /* Host out of memory: the range stays out of the free list (VA only, never physical). */
    vmm_errors_log(1, a->cfg.log_level, "vmmarena: host out of memory; %zu bytes of VA not returned", size);
    return;
  }
  f->base = base;
  f->size = size;
  f->reservation = reservation;
  insert_range(r, f);
}

static void free_tree(vmm_avl *n) {
  if (!n) return;
  free_tree(n->left);
  free_tree(n->right);
  free(by_addr(n));
}

/* ---- Stuck pieces -------------------------------------------------------------------- */

void vmm_ranges_keep_stuck(vmm_arena *a, CUdeviceptr base, size_t size) {
  vmm_ranges *r = &a->ranges;
  vmm_reservation *room = vmm_array_room(r->stuck, r->stuck_count, &r->stuck_cap, sizeof *room);
  if (!room) {
    vmm_errors_log(1, a->cfg.log_level, "vmmarena: host out of memory; mapping 0x%llx+%zu stays mapped until the process ends",
            (unsigned long long)base, size);
    return;
  }
  r->stuck = room;
  r->stuck[r->stuck_count++] = (vmm_reservation){base, size};
  r->stuck_bytes += size;
}

size_t vmm_ranges_stuck_bytes_in(const vmm_ranges *r, CUdeviceptr base, size_t extent) {
  size_t n = 0;
  for (size_t k = 0; k < r->stuck_count; k++)
    if (r->stuck[k].base >= base && r->stuck[k].base < base + extent) n += r->stuck[k].size;
  return n;
}

vmm_status vmm_ranges_unstick(vmm_arena *a, CUdeviceptr base, size_t extent) {
  vmm_ranges *r = &a->ranges;
  for (size_t k = 0; k < r->stuck_count;) {
    vmm_reservation s = r->stuck[k];
    if (s.base < base || s.base >= base + extent) {
      k++;
      continue;
    }
    CUresult res = VMM_DRV(a, mem_unmap, s.base, s.size);
    if (res != CUDA_SUCCESS)
      return vmm_errors_fail_driver(a, res, VMM_DRV_mem_unmap, "unmapping 0x%llx+%zu, left mapped by an earlier failure",
                             (unsigned long long)s.base, s.size);
    r->stuck[k] = r->stuck[--r->stuck_count];
    r->stuck_bytes -= s.size;
  }
  return VMM_OK;
}

void vmm_ranges_free_unless_stuck(vmm_arena *a, CUdeviceptr base, size_t extent, uint32_t reservation,
                                  size_t first_stuck) {
  const vmm_ranges *r = &a->ranges;
  CUdeviceptr at = base, end = base + extent;
  for (size_t k = first_stuck; k < r->stuck_count; k++) { /* one map call's pieces: ascending */
    if (r->stuck[k].base < base || r->stuck[k].base >= end) continue;
    if (r->stuck[k].base > at) vmm_ranges_free(a, at, r->stuck[k].base - at, reservation);
    at = r->stuck[k].base + r->stuck[k].size;
  }
  if (at < end) vmm_ranges_free(a, at, end - at, reservation);
}

/* ---- Teardown ------------------------------------------------------------------------ */

/* Logs a teardown call that failed: nothing is kept for a retry. */
static void log_teardown(vmm_arena *a, CUresult res, vmm_driver_entry e, CUdeviceptr base, size_t size) {
  if (res != CUDA_SUCCESS)
    vmm_errors_log(1, a->cfg.log_level, "vmmarena: destroy: %s(0x%llx, %zu) failed: %s", vmm_driver_entry_name(e),
            (unsigned long long)base, size, vmm_errors_cu_name(a, res));
}

void vmm_ranges_fini(vmm_arena *a) {
  vmm_ranges *r = &a->ranges;
  for (size_t i = 0; i < r->stuck_count; i++)
    log_teardown(a, VMM_DRV(a, mem_unmap, r->stuck[i].base, r->stuck[i].size), VMM_DRV_mem_unmap, r->stuck[i].base,
                 r->stuck[i].size);
  free(r->stuck);
  free_tree(r->by_addr);
  for (uint32_t i = 0; i < r->reservation_count; i++)
    log_teardown(a, VMM_DRV(a, mem_address_free, r->reservations[i].base, r->reservations[i].size),
                 VMM_DRV_mem_address_free, r->reservations[i].base, r->reservations[i].size);
  free(r->reservations);
  memset(r, 0, sizeof *r);
}

static long check_ranges(const vmm_ranges *r, const vmm_avl *n, const vmm_free_range **prev, char *why, size_t cap) {
  if (!n) return 0;
  long left = check_ranges(r, n->left, prev, why, cap);
  if (left < 0) return -1;
  const vmm_free_range *f = vmm_container_of(n, vmm_free_range, by_addr);
  if (f->reservation >= r->reservation_count) return snprintf(why, cap, "free range with bad reservation"), -1;
  const vmm_reservation *res = &r->reservations[f->reservation];
  if (f->size == 0 || f->base < res->base || f->base + f->size > res->base + res->size)
    return snprintf(why, cap, "free range 0x%llx+%zu outside its reservation", (unsigned long long)f->base, f->size), -1;
  if (*prev && (*prev)->base + (*prev)->size > f->base)
    return snprintf(why, cap, "free ranges overlap at 0x%llx", (unsigned long long)f->base), -1;
  if (*prev && (*prev)->base + (*prev)->size == f->base && (*prev)->reservation == f->reservation)
    return snprintf(why, cap, "free ranges not coalesced at 0x%llx", (unsigned long long)f->base), -1;
  if (!vmm_avl_find(r->by_size, f->size, f->base))
    return snprintf(why, cap, "free range 0x%llx missing from the size index", (unsigned long long)f->base), -1;
  *prev = f;
  long right = check_ranges(r, n->right, prev, why, cap);
  if (right < 0) return -1;
  return left + right + 1;
}

int vmm_ranges_check(const vmm_ranges *r, char *why, size_t cap) {
  long na = vmm_avl_check(r->by_addr), ns = vmm_avl_check(r->by_size);
  if (na < 0 || ns < 0 || na != ns || (size_t)na != r->free_range_count)
    return snprintf(why, cap, "free-range trees broken (%ld by address, %ld by size, %zu counted)", na, ns,
                    r->free_range_count),
           -1;
  const vmm_free_range *prev = NULL;
  if (check_ranges(r, r->by_addr, &prev, why, cap) < 0) return -1;
  return 0;
}
