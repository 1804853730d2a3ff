/* Pages: requests below the granularity are carved from one-granule mappings (pages), each
 * cut into equal slots of one size class. A page serves one (slot size, kind, tag, stream,
 * pool): retention, pause and stream order stay exact, and a freed slot is reused at once by
 * the stream that freed it. A slot that other streams used (vmm_arena_record_stream) is given
 * back only once the page's stream waits for events recorded on them. Slots are tracked on
 * the host (a bitmap per page): device memory is never touched. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SLOT_MIN 512u /* the smallest slot, and the rounding of every request */

size_t vmm_pages_slot_size(size_t granularity, size_t bytes) {
  size_t size = (bytes + SLOT_MIN - 1) / SLOT_MIN * SLOT_MIN;
  if (size <= 4096) return size; /* 512-byte steps */
  if (size <= 65536) {           /* four steps per doubling */
    size_t pow2 = 4096;
    while (pow2 * 2 < size) pow2 *= 2;
    size_t step = pow2 / 4;
    return (size + step - 1) / step * step;
  }
  size_t slots = granularity / size; /* above 64 KiB: the most slots that fit, no tail left over */
  return granularity / slots / SLOT_MIN * SLOT_MIN;
}

/* ---- Sets of pages by key ------------------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

static uint64_t key_hash(const vmm_page_key *k) {
  uint64_t h = mix(mix(mix(k->slot_size, (uint64_t)k->kind << 32 | k->tag), (uint64_t)(uintptr_t)k->stream), k->graph_pool);
  return h ^ (h >> 29);
}

static bool key_equal(const vmm_page_key *x, const vmm_page_key *y) {
  return x->slot_size == y->slot_size && x->kind == y->kind && x->tag == y->tag && x->stream == y->stream &&
         x->graph_pool == y->graph_pool;
}

/* The slot of `k` in a table of `cap` (a power of two): its set's, or the empty one to fill. */
static size_t probe(vmm_page_set **slots, size_t cap, const vmm_page_key *k) {
  size_t i = key_hash(k) & (cap - 1);
  while (slots[i] && !key_equal(&slots[i]->key, k)) i = (i + 1) & (cap - 1);
  return i;
}

static int grow_sets(vmm_pages *p) {
  size_t cap = p->cap ? p->cap * 2 : 64;
  vmm_page_set **slots = calloc(cap, sizeof *slots);
  if (!slots) return -1;
  for (size_t i = 0; i < p->cap; i++)
    if (p->slots[i]) slots[probe(slots, cap, &p->slots[i]->key)] = p->slots[i];
  free(p->slots);
  p->slots = slots;
  p->cap = cap;
  return 0;
}

/* The set of `k`, made on first use; NULL on host out-of-memory. */
static vmm_page_set *set_of(vmm_pages *p, const vmm_page_key *k) {
  if (p->cap) {
    vmm_page_set *s = p->slots[probe(p->slots, p->cap, k)];
    if (s) return s;
  }
  if ((p->count + 1) * 2 > p->cap && grow_sets(p)) return NULL;
  vmm_page_set *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->key = *k;
  p->slots[probe(p->slots, p->cap, k)] = s;
  p->count++;
  return s;
}

/* ---- Slots ---------------------------------------------------------------------------- */

static void list_push(vmm_page_set *s, vmm_page *pg) {
  pg->prev = NULL;
  pg->next = s->partial;
  if (s->partial) s->partial->prev = pg;
  s->partial = pg;
}

static void list_remove(vmm_page_set *s, vmm_page *pg) {
  if (pg->prev) pg->prev->next = pg->next;
  else s->partial = pg->next;
  if (pg->next) pg->next->prev = pg->prev;
  pg->next = pg->prev = NULL;
}

static bool taken(const vmm_page *pg, uint32_t slot) { return pg->bits[slot / 64] >> (slot % 64) & 1; }

/* Marks the first free slot of a page that has one; returns its index. */
static uint32_t take_slot(vmm_page *pg) {
  for (uint32_t w = 0;; w++) {
    vmm_assert(w * 64 < pg->slots);
    uint64_t free_bits = ~pg->bits[w];
    if (!free_bits) continue;
    uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(free_bits);
    vmm_assert(slot < pg->slots);
    pg->bits[w] |= (uint64_t)1 << (slot % 64);
    pg->used++;
    return slot;
  }
}

static void count_slot(vmm_arena *a, const vmm_page *pg, int sign) {
  a->pages.slot_bytes += (uint64_t)((int64_t)sign * (int64_t)pg->set->key.slot_size);
  a->pages.slots_used += (uint64_t)(int64_t)sign;
}

/* Clears a slot's bit: free for the page's stream. */
static void release_slot(vmm_arena *a, vmm_page *pg, uint32_t slot) {
  vmm_assert(taken(pg, slot));
  if (pg->used == pg->slots) list_push(pg->set, pg);
  pg->bits[slot / 64] &= ~((uint64_t)1 << (slot % 64));
  pg->used--;
  count_slot(a, pg, -1);
}

/* Whether a slot still waits for another stream (record_stream may have added several). */
static bool still_waits(const vmm_page_set *s, const vmm_page *pg, uint32_t slot) {
  for (const vmm_slot_wait *w = s->waits; w; w = w->next)
    if (w->page == pg && w->slot == slot) return true;
  return false;
}

/* Gives back the waiting slots whose waits are over for the page's stream (vmm_order_may_serve,
 * each wait's work its other stream and event); with `by_event`, no stream is ordered while the
 * page's stream captures. Returns how many waits went. */
static size_t release_waits(vmm_arena *a, vmm_page_set *s, bool by_event) {
  size_t released = 0;
  vmm_reuse_ctx c = {a, s->key.stream, by_event ? vmm_order_capturing(a, s->key.stream) : -1, by_event, false};
  for (vmm_slot_wait **link = &s->waits; *link;) {
    vmm_slot_wait *w = *link;
    vmm_free_work work = {w->stream, NULL, 0, w->seq, &w->event};
    if (!vmm_order_may_serve(&c, &work, &w->join)) {
      link = &w->next;
      continue;
    }
    released++;
    *link = w->next;
    if (!still_waits(s, w->page, w->slot)) release_slot(a, w->page, w->slot);
    if (w->event) vmm_order_event_put(a, w->event);
    free(w);
  }
  return released;
}

static size_t record_words(const vmm_arena *a) { return (a->granularity / SLOT_MIN + 63) / 64; }

/* A spare page record, so that the carving of a new page cannot fail after its mapping is
 * made; VMM_STATUS_COUNT when there is one, else VMM_ERR_OUT_OF_MEMORY (recorded). */
static vmm_status reserve_record(vmm_arena *a) {
  if (a->pages.spare) return VMM_STATUS_COUNT;
  vmm_page *pg = malloc(sizeof *pg + record_words(a) * sizeof pg->bits[0]);
  if (!pg) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a page record");
  pg->next = NULL;
  a->pages.spare = pg;
  return VMM_STATUS_COUNT;
}

vmm_status vmm_pages_take(vmm_arena *a, const vmm_page_key *k, CUdeviceptr *out) {
  vmm_page_set *s = set_of(&a->pages, k);
  if (!s) return vmm_errors_fail(a, VMM_ERR_OUT_OF_MEMORY, "host out of memory for a page set");
  if (s->waits) release_waits(a, s, a->cfg.order_by_event);
  vmm_page *pg = s->partial;
  while (pg && pg->m->state != VMM_MAP_LIVE) pg = pg->next; /* a paused page holds no memory */
  if (!pg) return reserve_record(a); /* no live page with a free slot: the caller carves one */
  uint32_t slot = take_slot(pg);
  if (pg->used == pg->slots) list_remove(s, pg);
  count_slot(a, pg, +1);
  *out = pg->m->base + (CUdeviceptr)slot * k->slot_size;
  return VMM_OK;
}

bool vmm_pages_order_waits(vmm_arena *a, const vmm_page_key *k) {
  vmm_page_set *s = set_of(&a->pages, k);
  return s && s->waits && release_waits(a, s, true);
}

void vmm_pages_carve(vmm_arena *a, vmm_mapping *m, const vmm_page_key *k) {
  vmm_page_set *s = set_of(&a->pages, k);
  vmm_page *pg = a->pages.spare;
  vmm_assert(s && pg); /* made by the vmm_pages_take that found no page */
  a->pages.spare = pg->next;
  memset(pg->bits, 0, record_words(a) * sizeof pg->bits[0]);
  pg->m = m;
  pg->set = s;
  pg->slots = (uint32_t)(m->extent / k->slot_size);
  pg->used = 0;
  pg->uses = NULL;
  m->page = pg;
  list_push(s, pg);
  a->pages.pages++;
}

vmm_page *vmm_pages_slot_of(const vmm_arena *a, CUdeviceptr ptr, uint32_t *slot) {
  vmm_mapping *m = vmm_table_find(&a->table, ptr & ~(CUdeviceptr)(a->granularity - 1));
  if (!m || !m->page) return NULL;
  vmm_page *pg = m->page;
  size_t size = pg->set->key.slot_size;
  CUdeviceptr off = ptr - m->base;
  if (off % size || off / size >= pg->slots || !taken(pg, (uint32_t)(off / size))) return NULL;
  for (const vmm_slot_wait *w = pg->set->waits; w; w = w->next)
    if (w->page == pg && w->slot == off / size) return NULL; /* freed, waiting for other streams */
  *slot = (uint32_t)(off / size);
  return pg;
}

int vmm_pages_add_use(vmm_page *pg, uint32_t slot, CUstream stream) {
  if (stream == pg->set->key.stream) return 0;
  for (const vmm_slot_wait *u = pg->uses; u; u = u->next)
    if (u->slot == slot && u->stream == stream) return 0;
  vmm_slot_wait *u = malloc(sizeof *u);
  if (!u) return -1;
  *u = (vmm_slot_wait){pg, slot, stream, NULL, 0, pg->uses};
  pg->uses = u;
  return 0;
}

/* Moves the other streams of `slot` to the set's waits, each with an event recorded now where
 * its stream is not capturing (else the next vmm_pages_take records it). Returns how many. */
static size_t make_waits(vmm_arena *a, vmm_page *pg, uint32_t slot) {
  size_t n = 0;
  for (vmm_slot_wait **link = &pg->uses; *link;) {
    vmm_slot_wait *w = *link;
    if (w->slot != slot) {
      link = &w->next;
      continue;
    }
    *link = w->next;
    w->seq = ++a->free_seq; /* the program's marks on w->stream after this cover it */
    vmm_order_slot_event(a, &w->event, w->stream); /* none yet: made with the use */
    vmm_join_record(a, &w->join, pg->set->key.graph_pool, w->stream, NULL, 0); /* during a capture: its free markers */
    w->next = pg->set->waits;
    pg->set->waits = w;
    n++;
  }
  return n;
}

bool vmm_pages_give_back(vmm_arena *a, vmm_page *pg, uint32_t slot) {
  vmm_assert(taken(pg, slot));
  if (pg->uses && make_waits(a, pg, slot)) return false;
  release_slot(a, pg, slot);
  return pg->used == 0;
}

/* Waits on the host for the other stream of every waiting slot of s that does not capture (its
 * event recorded first), so that release_waits finds the event complete. */
static vmm_status sync_waits(vmm_arena *a, vmm_page_set *s) {
  CUstream last = NULL;
  for (vmm_slot_wait *w = s->waits; w; w = w->next) {
    if (vmm_order_capturing(a, w->stream)) continue;
    vmm_order_slot_event(a, &w->event, w->stream);
    if (w->stream == last) continue;
    CUresult r = VMM_DRV(a, stream_synchronize, w->stream);
    if (r != CUDA_SUCCESS)
      return vmm_errors_fail_driver(a, r, VMM_DRV_stream_synchronize,
                                    "giving the cache back: waiting for stream %p, which used a slot of the page at 0x%llx",
                                    (void *)w->stream, (unsigned long long)w->page->m->base);
    last = w->stream;
  }
  return VMM_OK;
}

vmm_status vmm_pages_settle(vmm_arena *a, bool wait) {
  for (size_t i = 0; i < a->pages.cap; i++) {
    vmm_page_set *s = a->pages.slots[i];
    if (!s || !s->waits) continue;
    vmm_status st = wait ? sync_waits(a, s) : VMM_OK;
    if (st != VMM_OK) return st;
    release_waits(a, s, a->cfg.order_by_event);
  }
  return VMM_OK;
}

vmm_mapping *vmm_pages_find_empty(const vmm_arena *a) {
  for (size_t i = 0; i < a->pages.cap; i++)
    for (vmm_page *pg = a->pages.slots[i] ? a->pages.slots[i]->partial : NULL; pg; pg = pg->next)
      if (!pg->used && pg->m->state == VMM_MAP_LIVE) return pg->m;
  return NULL;
}

void vmm_pages_uncarve(vmm_arena *a, vmm_mapping *m) {
  vmm_page *pg = m->page;
  vmm_assert(pg && pg->used == 0 && !pg->uses);
  list_remove(pg->set, pg);
  m->page = NULL;
  pg->next = a->pages.spare;
  a->pages.spare = pg;
  a->pages.pages--;
}

void vmm_pages_forget(vmm_arena *a, vmm_mapping *m) {
  vmm_page *pg = m->page;
  while (pg->uses) {
    vmm_slot_wait *u = pg->uses;
    pg->uses = u->next;
    free(u);
  }
  a->pages.pages--;
  m->page = NULL;
  free(pg);
}

void vmm_pages_fini(vmm_arena *a) {
  vmm_pages *p = &a->pages;
  for (size_t i = 0; i < p->cap; i++) {
    vmm_page_set *s = p->slots[i];
    while (s && s->waits) {
      vmm_slot_wait *w = s->waits;
      s->waits = w->next;
      if (w->event) vmm_order_event_put(a, w->event);
      free(w);
    }
    free(s);
  }
  free(p->slots);
  while (p->spare) {
    vmm_page *pg = p->spare;
    p->spare = pg->next;
    free(pg);
  }
  memset(p, 0, sizeof *p);
}

int vmm_pages_check(const vmm_arena *a, const vmm_mapping *m, uint64_t *slot_bytes, char *why, size_t cap) {
  const vmm_page *pg = m->page;
  uint32_t used = 0;
  for (uint32_t w = 0; w * 64 < pg->slots; w++) used += (uint32_t)__builtin_popcountll(pg->bits[w]);
  if (pg->m != m || m->extent != a->granularity || used != pg->used || pg->slots != m->extent / pg->set->key.slot_size)
    return snprintf(why, cap, "page 0x%llx counts %u of %u slots used, holds %u", (unsigned long long)m->base, pg->used,
                    pg->slots, used),
           -1;
  for (const vmm_slot_wait *w = pg->set->waits; w; w = w->next)
    if (w->page == pg && !taken(pg, w->slot))
      return snprintf(why, cap, "page 0x%llx: slot %u waits for stream %p but is free", (unsigned long long)m->base,
                      w->slot, (void *)w->stream),
             -1;
  *slot_bytes += (uint64_t)used * pg->set->key.slot_size;
  return 0;
}
