/* Counters: bytes and counts per kind and state, per tag, and the physical and mapped
 * totals with their peaks. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

void vmm_add_physical(vmm_arena *a, size_t bytes) {
  a->physical_bytes += bytes;
  if (a->physical_bytes > a->physical_peak) a->physical_peak = a->physical_bytes;
}

void vmm_add_mapped(vmm_arena *a, size_t bytes) {
  a->mapped_bytes += bytes;
  if (a->mapped_bytes > a->mapped_peak) a->mapped_peak = a->mapped_bytes;
}
