/* Counters: bytes and counts per kind and state, per tag, and the physical and mapped
 * totals with their peaks. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void vmm_accounting_add_stat(vmm_arena *a, vmm_kind k, vmm_mapping_state s, size_t bytes, int sign) {
  vmm_kind_stats *ks = &a->kind[k];
  uint64_t *count, *total;
  switch (s) {
  case VMM_MAP_POOLED: count = &ks->pooled_count, total = &ks->pooled_bytes; break;
  case VMM_MAP_ABANDONED: count = &ks->abandoned_count, total = &ks->abandoned_bytes; break;
  case VMM_MAP_PAUSED: count = &ks->paused_count, total = &ks->paused_bytes; break;
  default: count = &ks->live_count, total = &ks->live_bytes; break;
  }
  *count += (uint64_t)(int64_t)sign;
  *total += (uint64_t)((int64_t)sign * (int64_t)bytes);
}

/* Grows one per-tag array from `old` to `cap` entries, zeroing the new ones. */
static int grow(uint64_t **array, size_t old, size_t cap) {
  uint64_t *grown = realloc(*array, cap * sizeof *grown);
  if (!grown) return -1;
  memset(grown + old, 0, (cap - old) * sizeof *grown);
  *array = grown;
  return 0;
}

/* Makes room for tag ids up to `tag`; 0 on success. */
static int tag_room(vmm_arena *a, uint32_t tag) {
  if (tag < a->tag_cap) return 0;
  size_t cap = a->tag_cap ? a->tag_cap : 16;
  while (cap <= tag) cap *= 2;
  if (grow(&a->tag_bytes, a->tag_cap, cap) || grow(&a->tag_count, a->tag_cap, cap) ||
      grow(&a->tag_paused_bytes, a->tag_cap, cap) || grow(&a->tag_paused_count, a->tag_cap, cap))
    return -1;
  a->tag_cap = cap;
  return 0;
}

void vmm_accounting_add_tag(vmm_arena *a, uint32_t tag, size_t bytes, int sign) {
  if (tag >= a->tag_cap && (sign < 0 || tag_room(a, tag))) return;
  a->tag_bytes[tag] += (uint64_t)((int64_t)sign * (int64_t)bytes);
  a->tag_count[tag] += (uint64_t)(int64_t)sign;
}

void vmm_accounting_move_tag_paused(vmm_arena *a, uint32_t tag, size_t bytes, int sign) {
  if (tag >= a->tag_cap && (sign < 0 || tag_room(a, tag))) return;
  a->tag_paused_bytes[tag] += (uint64_t)((int64_t)sign * (int64_t)bytes);
  a->tag_paused_count[tag] += (uint64_t)(int64_t)sign;
}

void vmm_accounting_add_physical(vmm_arena *a, size_t bytes) {
  a->physical_bytes += bytes;
  if (a->physical_bytes > a->physical_peak) a->physical_peak = a->physical_bytes;
  if (a->physical_bytes > a->scope_peak) a->scope_peak = a->physical_bytes;
  if (a->physical_bytes > a->high_water) a->high_water = a->physical_bytes;
}

void vmm_accounting_add_mapped(vmm_arena *a, size_t bytes) {
  a->mapped_bytes += bytes;
  if (a->mapped_bytes > a->mapped_peak) a->mapped_peak = a->mapped_bytes;
}

void vmm_accounting_fill_usage(const vmm_arena *a, vmm_usage *u) {
  *u = (vmm_usage){
      .allocated_bytes = a->allocated_bytes,
      .allocated_peak_bytes = a->allocated_peak,
      .allocations = a->allocations,
      .allocations_peak = a->allocations_peak,
      .reserved_bytes = a->physical_bytes,
      .reserved_peak_bytes = a->physical_peak,
      .cached_bytes = a->physical_bytes > a->allocated_bytes ? a->physical_bytes - a->allocated_bytes : 0,
      .alloc_count = a->allocs,
      .free_count = a->frees,
      .refusals = a->refusals,
      .cache_releases = a->cache_releases,
      .pages = a->pages.pages,
      .page_slots_used = a->pages.slots_used,
  };
}
