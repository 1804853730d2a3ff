/* Invariant checker: walks every structure and recounts every counter. */
#include <string.h>

#include "internal.h"

typedef struct recount {
  vmm_kind_stats kind[VMM_KIND_COUNT];
  uint64_t mapped, physical, paused; /* paused: VA of paused allocations less their stuck pieces */
  size_t mappings;
  uint64_t allocated, allocations;   /* live or paused whole mappings, and page slots handed out */
  uint64_t slot_bytes, pages;
} recount;

/* A mapping's range: aligned, inside its reservation, overlapping no free range. */
static int check_range(const vmm_arena *a, const vmm_mapping *m, char *why, size_t cap) {
  if (m->extent == 0 || m->extent % a->granularity || m->base % a->granularity)
    return snprintf(why, cap, "mapping 0x%llx misaligned", (unsigned long long)m->base), -1;
  const vmm_reservation *r = &a->ranges.reservations[m->reservation];
  if (m->reservation >= a->ranges.reservation_count || m->base < r->base || m->base + m->extent > r->base + r->size)
    return snprintf(why, cap, "mapping 0x%llx outside its reservation", (unsigned long long)m->base), -1;
  vmm_avl *f = vmm_avl_floor(a->ranges.by_addr, m->base + m->extent - 1, 0);
  if (f) {
    const vmm_free_range *fr = vmm_container_of(f, vmm_free_range, by_addr);
    if (fr->base + fr->size > m->base)
      return snprintf(why, cap, "mapping 0x%llx overlaps a free range", (unsigned long long)m->base), -1;
  }
  return 0;
}

/* One mapping: its range, its handles, and its bytes added to the recount. */
static int check_mapping(const vmm_arena *a, const vmm_mapping *m, recount *c, char *why, size_t cap) {
  if (check_range(a, m, why, cap)) return -1;
  if (m->page) {
    c->pages++;
    if (vmm_pages_check(a, m, &c->slot_bytes, why, cap)) return -1;
  } else if (vmm_mapping_allocated(m) || m->state == VMM_MAP_FREEING || m->state == VMM_MAP_MOVING) {
    c->allocated += m->extent, c->allocations++;
  }
  vmm_kind_stats *ks = &c->kind[m->kind];
  if (m->state == VMM_MAP_PAUSED && !m->handle_count) {
    c->paused += m->extent - vmm_ranges_stuck_bytes_in(&a->ranges, m->base, m->extent); /* a failed resume's leftovers */
    ks->paused_count++, ks->paused_bytes += m->extent;
    return 0;
  }
  if (m->state == VMM_MAP_PAUSED && !m->backup) /* mapped again only to take its backup back */
    return snprintf(why, cap, "paused mapping 0x%llx holds %u handles but no backup", (unsigned long long)m->base,
                    m->handle_count),
           -1;
  size_t sum = 0;
  for (uint32_t p = 0; p < m->handle_count; p++) {
    sum += m->handles[p]->size;
    if (m->handles[p]->owner != m || m->handles[p]->idle)
      return snprintf(why, cap, "mapping 0x%llx: its handle %u names another owner", (unsigned long long)m->base, p),
             -1;
  }
  if (m->handle_count == 0 || sum != m->extent)
    return snprintf(why, cap, "mapping 0x%llx handles (%u) sum %zu != extent %zu", (unsigned long long)m->base,
                    m->handle_count, sum, m->extent),
           -1;
  c->mapped += m->extent;
  c->physical += m->extent;
  switch (m->state) {
  case VMM_MAP_POOLED: ks->pooled_count++, ks->pooled_bytes += m->extent; break;
  case VMM_MAP_ABANDONED: ks->abandoned_count++, ks->abandoned_bytes += m->extent; break;
  case VMM_MAP_PAUSED: ks->paused_count++, ks->paused_bytes += m->extent; break;
  default: ks->live_count++, ks->live_bytes += m->extent; break;
  }
  return 0;
}

/* The arena's counters against the recount. */
static int check_totals(const vmm_arena *a, const recount *c, char *why, size_t cap) {
  if (c->mappings != a->table.count)
    return snprintf(why, cap, "mapping table counts %zu, holds %zu", a->table.count, c->mappings), -1;
  if (memcmp(c->kind, a->kind, sizeof c->kind))
    return snprintf(why, cap,
                    "per-kind counters differ from a recount (transient live %llu vs %llu, pooled %llu vs %llu)",
                    (unsigned long long)a->kind[1].live_count, (unsigned long long)c->kind[1].live_count,
                    (unsigned long long)a->kind[1].pooled_count, (unsigned long long)c->kind[1].pooled_count),
           -1;
  uint64_t pooled = 0;
  for (int k = 0; k < VMM_KIND_COUNT; k++) pooled += c->kind[k].pooled_count;
  if (pooled != a->store.pool.count)
    return snprintf(why, cap, "%llu mappings are pooled, the pool holds %zu", (unsigned long long)pooled,
                    a->store.pool.count),
           -1;
  if (c->mapped != a->mapped_bytes || c->physical != a->physical_bytes)
    return snprintf(why, cap, "byte counters differ: mapped %llu vs %llu, physical %llu vs %llu",
                    (unsigned long long)a->mapped_bytes, (unsigned long long)c->mapped,
                    (unsigned long long)a->physical_bytes, (unsigned long long)c->physical),
           -1;
  if (c->pages != a->pages.pages || c->slot_bytes != a->pages.slot_bytes)
    return snprintf(why, cap, "pages: %llu pages with %llu slot bytes taken, the counters say %llu and %llu",
                    (unsigned long long)c->pages, (unsigned long long)c->slot_bytes,
                    (unsigned long long)a->pages.pages, (unsigned long long)a->pages.slot_bytes),
           -1;
  if (c->allocated + c->slot_bytes < a->allocated_bytes || c->allocations > a->allocations)
    return snprintf(why, cap, "usage: %llu bytes in %llu whole mappings + %llu slot bytes, but %llu bytes allocated",
                    (unsigned long long)c->allocated, (unsigned long long)c->allocations,
                    (unsigned long long)c->slot_bytes, (unsigned long long)a->allocated_bytes),
           -1;
  const vmm_ranges *r = &a->ranges;
  size_t retiring = a->retiring.bytes, unmapping = a->unmapper.bytes;
  if (r->free_bytes + c->mapped + c->paused + r->stuck_bytes + retiring + unmapping != r->reserved_bytes)
    return snprintf(why, cap,
                    "VA accounting: %zu free + %llu mapped + %llu paused + %zu stuck + %zu retiring + %zu unmapping "
                    "!= %zu reserved",
                    r->free_bytes, (unsigned long long)c->mapped, (unsigned long long)c->paused, r->stuck_bytes,
                    retiring, unmapping, r->reserved_bytes),
           -1;
  return 0;
}

static int check_locked(vmm_arena *a, char *why, size_t cap) {
  recount c;
  memset(&c, 0, sizeof c);
  if (vmm_ranges_check(&a->ranges, why, cap)) return -1;
  vmm_mapping *m;
  vmm_table_foreach(&a->table, i, m) {
    c.mappings++;
    if (check_mapping(a, m, &c, why, cap)) return -1;
  }
  if (vmm_store_check(a, c.kind, &c.physical, why, cap)) return -1;
  return check_totals(a, &c, why, cap);
}

int vmm_arena_check(vmm_arena *a, char *why, size_t cap) {
  char tmp[256];
  if (!a) {
    if (why && cap) snprintf(why, cap, "NULL arena");
    return -1;
  }
  pthread_mutex_lock(&a->lock);
  int rc = check_locked(a, tmp, sizeof tmp);
  pthread_mutex_unlock(&a->lock);
  if (rc && why && cap) snprintf(why, cap, "%s", tmp);
  return rc;
}
