/* Invariant checker: walks every structure and recounts every counter. */
#include <string.h>

#include "internal.h"

static int fail(char *why, size_t cap, const char *msg) {
  if (why && cap) snprintf(why, cap, "%s", msg);
  return -1;
}

int vmm_arena_check(vmm_arena *a, char *why, size_t cap) {
  char tmp[256];
  if (!a) return fail(why, cap, "NULL arena");
  pthread_mutex_lock(&a->lock);
  int rc = -1;
  vmm_kind_stats k[VMM_KIND_COUNT];
  memset(k, 0, sizeof k);
  uint64_t mapped = 0, physical = 0, paused = 0;
  if (vmm_ranges_check(&a->ranges, tmp, sizeof tmp)) goto out;
  size_t n = 0;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) {
    n++;
    if (m->extent == 0 || m->extent % a->granularity || m->base % a->granularity) {
      snprintf(tmp, sizeof tmp, "mapping 0x%llx misaligned", (unsigned long long)m->base);
      goto out;
    }
    const vmm_reservation *r = &a->ranges.reservations[m->reservation];
    if (m->reservation >= a->ranges.reservation_count || m->base < r->base || m->base + m->extent > r->base + r->size) {
      snprintf(tmp, sizeof tmp, "mapping 0x%llx outside its reservation", (unsigned long long)m->base);
      goto out;
    }
    /* A mapping must not overlap any free range. */
    vmm_avl *f = vmm_avl_floor(a->ranges.by_addr, m->base + m->extent - 1, 0);
    if (f) {
      const vmm_free_range *fr = vmm_container_of(f, vmm_free_range, by_addr);
      if (fr->base + fr->size > m->base) {
        snprintf(tmp, sizeof tmp, "mapping 0x%llx overlaps a free range", (unsigned long long)m->base);
        goto out;
      }
    }
    if (m->state == VMM_MAP_PAUSED && !m->handle_count) {
      paused += m->extent - vmm_stuck_bytes_in(a, m->base, m->extent); /* a failed resume's leftovers */
      k[m->kind].paused_count++, k[m->kind].paused_bytes += m->extent;
      continue;
    }
    if (m->state == VMM_MAP_PAUSED && !m->backup) { /* mapped again only to take its backup back */
      snprintf(tmp, sizeof tmp, "paused mapping 0x%llx holds %u handles but no backup", (unsigned long long)m->base,
               m->handle_count);
      goto out;
    }
    size_t sum = 0;
    for (uint32_t p = 0; p < m->handle_count; p++) sum += m->handles[p]->size;
    if (m->handle_count == 0 || sum != m->extent) {
      snprintf(tmp, sizeof tmp, "mapping 0x%llx handles (%u) sum %zu != extent %zu", (unsigned long long)m->base,
               m->handle_count, sum, m->extent);
      goto out;
    }
    mapped += m->extent;
    physical += m->extent;
    vmm_kind_stats *ks = &k[m->kind];
    switch (m->state) {
    case VMM_MAP_POOLED: ks->pooled_count++, ks->pooled_bytes += m->extent; break;
    case VMM_MAP_ABANDONED: ks->abandoned_count++, ks->abandoned_bytes += m->extent; break;
    case VMM_MAP_PAUSED: ks->paused_count++, ks->paused_bytes += m->extent; break;
    default: ks->live_count++, ks->live_bytes += m->extent; break;
    }
  }
  if (n != a->table.count) {
    snprintf(tmp, sizeof tmp, "mapping table counts %zu, holds %zu", a->table.count, n);
    goto out;
  }
  if (vmm_store_check(a, k, &physical, tmp, sizeof tmp)) goto out;
  if (memcmp(k, a->kind, sizeof k)) {
    snprintf(tmp, sizeof tmp, "per-kind counters differ from a recount (transient live %llu vs %llu, pooled %llu vs %llu)",
             (unsigned long long)a->kind[1].live_count, (unsigned long long)k[1].live_count,
             (unsigned long long)a->kind[1].pooled_count, (unsigned long long)k[1].pooled_count);
    goto out;
  }
  if (mapped != a->mapped_bytes || physical != a->physical_bytes) {
    snprintf(tmp, sizeof tmp, "byte counters differ: mapped %llu vs %llu, physical %llu vs %llu",
             (unsigned long long)a->mapped_bytes, (unsigned long long)mapped, (unsigned long long)a->physical_bytes,
             (unsigned long long)physical);
    goto out;
  }
  if (a->ranges.free_bytes + mapped + paused + a->stuck_bytes != a->ranges.reserved_bytes) {
    snprintf(tmp, sizeof tmp, "VA accounting: %zu free + %llu mapped + %llu paused + %zu stuck != %zu reserved",
             a->ranges.free_bytes, (unsigned long long)mapped, (unsigned long long)paused, a->stuck_bytes,
             a->ranges.reserved_bytes);
    goto out;
  }
  rc = 0;
out:
  pthread_mutex_unlock(&a->lock);
  if (rc) fail(why, cap, tmp);
  return rc;
}
