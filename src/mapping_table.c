/* Mapping records by base address: open addressing with linear probing and backward-shift
 * deletion (no tombstones), kept at most half full. */
#include <stdlib.h>

#include "internal.h"

static size_t slot_of(CUdeviceptr base, size_t cap) {
  uint64_t h = (uint64_t)base * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32) & (cap - 1); /* high bits: bases are granule-aligned, their low bits zero */
}

int vmm_table_init(vmm_mapping_table *t) {
  t->cap = 1024;
  t->count = 0;
  t->slots = calloc(t->cap, sizeof *t->slots);
  return t->slots ? 0 : -1;
}

void vmm_table_fini(vmm_mapping_table *t) {
  free(t->slots);
  t->slots = NULL;
  t->cap = t->count = 0;
}

vmm_mapping *vmm_table_find(const vmm_mapping_table *t, CUdeviceptr base) {
  for (size_t i = slot_of(base, t->cap);; i = (i + 1) & (t->cap - 1)) {
    vmm_mapping *m = t->slots[i];
    if (!m) return NULL;
    if (m->base == base) return m;
  }
}

int vmm_table_reserve_n(vmm_mapping_table *t, size_t n) {
  if ((t->count + n) * 2 <= t->cap) return 0;
  size_t cap = t->cap * 2;
  while ((t->count + n) * 2 > cap) cap *= 2;
  vmm_mapping **slots = calloc(cap, sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < t->cap; i++) {
    vmm_mapping *m = t->slots[i];
    if (!m) continue;
    size_t j = slot_of(m->base, cap);
    while (slots[j]) j = (j + 1) & (cap - 1);
    slots[j] = m;
  }
  free(t->slots);
  t->slots = slots;
  t->cap = cap;
  return 0;
}

int vmm_table_reserve(vmm_mapping_table *t) { return vmm_table_reserve_n(t, 1); }

void vmm_table_insert(vmm_mapping_table *t, vmm_mapping *m) {
  vmm_assert((t->count + 1) * 2 <= t->cap);
  size_t i = slot_of(m->base, t->cap);
  while (t->slots[i]) i = (i + 1) & (t->cap - 1);
  t->slots[i] = m;
  t->count++;
}

void vmm_table_remove(vmm_mapping_table *t, CUdeviceptr base) {
  size_t mask = t->cap - 1, i = slot_of(base, t->cap);
  while (t->slots[i] && t->slots[i]->base != base) i = (i + 1) & mask;
  if (!t->slots[i]) return;
  t->slots[i] = NULL;
  t->count--;
  /* Shift back later entries of the same probe run that could live at i. */
  for (size_t j = (i + 1) & mask; t->slots[j]; j = (j + 1) & mask) {
    size_t home = slot_of(t->slots[j]->base, t->cap);
    int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      t->slots[i] = t->slots[j];
      t->slots[j] = NULL;
      i = j;
    }
  }
}

vmm_mapping *vmm_table_containing(const vmm_mapping_table *t, CUdeviceptr ptr) {
  vmm_mapping *m;
  vmm_table_foreach(t, i, m) {
    if (ptr >= m->base && ptr - m->base < m->extent) return m;
  }
  return NULL;
}
