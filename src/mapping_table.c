/* A hash table from 64-bit keys to non-NULL pointers: open addressing with linear probing and
 * backward-shift deletion (no tombstones), kept at most half full. The arena's mapping records
 * by base address; vmmarena-replay's trace pointers. */
#include <stdlib.h>

#include "internal.h"

static size_t slot_of(uint64_t key, size_t cap) {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32) & (cap - 1); /* high bits: bases are granule-aligned, their low bits zero */
}

int vmm_table_init(vmm_table *t) {
  t->cap = 1024;
  t->count = 0;
  t->keys = calloc(t->cap, sizeof *t->keys);
  t->vals = calloc(t->cap, sizeof *t->vals);
  if (t->keys && t->vals) return 0;
  vmm_table_fini(t);
  return -1;
}

void vmm_table_fini(vmm_table *t) {
  free(t->keys);
  free(t->vals);
  t->keys = NULL;
  t->vals = NULL;
  t->cap = t->count = 0;
}

void *vmm_table_find(const vmm_table *t, uint64_t key) {
  for (size_t i = slot_of(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
    if (!t->vals[i]) return NULL;
    if (t->keys[i] == key) return t->vals[i];
  }
}

int vmm_table_reserve_n(vmm_table *t, size_t n) {
  if ((t->count + n) * 2 <= t->cap) return 0;
  size_t cap = t->cap * 2;
  while ((t->count + n) * 2 > cap) cap *= 2;
  uint64_t *keys = calloc(cap, sizeof *keys);
  void **vals = calloc(cap, sizeof *vals);
  if (!keys || !vals) {
    free(keys);
    free(vals);
    return -1;
  }
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->vals[i]) continue;
    size_t j = slot_of(t->keys[i], cap);
    while (vals[j]) j = (j + 1) & (cap - 1);
    keys[j] = t->keys[i];
    vals[j] = t->vals[i];
  }
  free(t->keys);
  free(t->vals);
  t->keys = keys;
  t->vals = vals;
  t->cap = cap;
  return 0;
}

int vmm_table_reserve(vmm_table *t) { return vmm_table_reserve_n(t, 1); }

void vmm_table_insert(vmm_table *t, uint64_t key, void *value) {
  vmm_assert((t->count + 1) * 2 <= t->cap && value);
  size_t i = slot_of(key, t->cap);
  while (t->vals[i]) i = (i + 1) & (t->cap - 1);
  t->keys[i] = key;
  t->vals[i] = value;
  t->count++;
}

void *vmm_table_remove(vmm_table *t, uint64_t key) {
  size_t mask = t->cap - 1, i = slot_of(key, t->cap);
  while (t->vals[i] && t->keys[i] != key) i = (i + 1) & mask;
  void *value = t->vals[i];
  if (!value) return NULL;
  t->vals[i] = NULL;
  t->count--;
  /* Shift back later entries of the same probe run that could live at i. */
  for (size_t j = (i + 1) & mask; t->vals[j]; j = (j + 1) & mask) {
    size_t home = slot_of(t->keys[j], t->cap);
    int movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
    if (movable) {
      t->keys[i] = t->keys[j];
      t->vals[i] = t->vals[j];
      t->vals[j] = NULL;
      i = j;
    }
  }
  return value;
}

vmm_mapping *vmm_table_containing(const vmm_table *t, CUdeviceptr ptr) {
  vmm_mapping *m;
  vmm_table_foreach(t, i, m) {
    if (ptr >= m->base && ptr - m->base < m->extent) return m;
  }
  return NULL;
}
