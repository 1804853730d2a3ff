/* The idle-handle store: physical memory freed inside a scope, indexed by size.
 *  - mapped tier, the pool: idle transient mappings in size buckets (an AVL tree keyed by
 *    extent, each a LIFO list). No bucket in the tree is ever empty (see vmm_pool in
 *    internal.h); emptied buckets are kept on a spare list for the next push.
 *  - idle tier: idle handles in an AVL tree keyed by (size, serial).
 *  - the abandoned list: handles of aborted scopes, touched again only by destroy.
 * The store only files handles: it makes no driver call. */
#include <stdlib.h>

#include "internal.h"

static vmm_bucket *bucket_of(vmm_avl *n) { return n ? vmm_container_of(n, vmm_bucket, node) : NULL; }

int vmm_store_pool_push(vmm_pool *p, vmm_mapping *m) {
  vmm_bucket *b = bucket_of(vmm_avl_find(p->root, m->extent, 0));
  if (!b) {
    b = p->spare;
    if (b) p->spare = b->next_spare;
    else if (!(b = malloc(sizeof *b))) return -1;
    b->size = m->extent;
    b->head = NULL;
    b->count = 0;
    b->node.k1 = m->extent;
    b->node.k2 = 0;
    p->root = vmm_avl_insert(p->root, &b->node);
    p->buckets++;
  }
  m->pool_prev = NULL;
  m->pool_next = b->head;
  if (b->head) b->head->pool_prev = m;
  b->head = m;
  b->count++;
  m->bucket = b;
  p->count++;
  p->bytes += m->extent;
  p->handles += m->handle_count;
  return 0;
}

int vmm_store_pool_reserve(vmm_pool *p, size_t n) {
  size_t spare = 0;
  for (vmm_bucket *b = p->spare; b && spare < n; b = b->next_spare) spare++;
  for (; spare < n; spare++) {
    vmm_bucket *b = malloc(sizeof *b);
    if (!b) return -1;
    b->next_spare = p->spare;
    p->spare = b;
  }
  return 0;
}

void vmm_store_pool_remove(vmm_pool *p, vmm_mapping *m) {
  vmm_bucket *b = m->bucket;
  vmm_assert(b && b->count > 0);
  if (m->pool_prev) m->pool_prev->pool_next = m->pool_next;
  else b->head = m->pool_next;
  if (m->pool_next) m->pool_next->pool_prev = m->pool_prev;
  m->pool_next = m->pool_prev = NULL;
  m->bucket = NULL;
  p->count--;
  p->bytes -= m->extent;
  p->handles -= m->handle_count;
  if (--b->count == 0) {
    p->root = vmm_avl_remove(p->root, b->size, 0);
    p->buckets--;
    b->next_spare = p->spare;
    p->spare = b;
  }
}

vmm_mapping *vmm_store_pool_take(vmm_pool *p, size_t lo, size_t hi, vmm_pool_usable_fn usable, void *ctx) {
  for (vmm_bucket *b = bucket_of(vmm_avl_ceil(p->root, lo, 0)); b && b->size <= hi;
       b = bucket_of(vmm_avl_ceil(p->root, b->size + 1, 0))) {
    vmm_assert(b->head && b->count > 0); /* no empty bucket */
    for (vmm_mapping *m = b->head; m; m = m->pool_next) {
      if (usable && !usable(ctx, m)) continue;
      vmm_store_pool_remove(p, m);
      return m;
    }
  }
  return NULL;
}

/* The first run of m's handles that makes from `bytes` to `most` bytes: its count (0 if none)
 * and *first. Sizes are positive, so one window slides over the handles. */
static uint32_t run_within(const vmm_mapping *m, size_t bytes, size_t most, uint32_t *first) {
  size_t sum = 0;
  for (uint32_t lo = 0, hi = 0; hi < m->handle_count; hi++) {
    sum += m->handles[hi]->size;
    while (sum > most) sum -= m->handles[lo++]->size;
    if (sum >= bytes) {
      *first = lo;
      return hi - lo + 1;
    }
  }
  return 0;
}

/* A run that makes exactly `bytes`, else one that makes up to `most`. */
static uint32_t run_handles(const vmm_mapping *m, size_t bytes, size_t most, uint32_t *first) {
  uint32_t count = run_within(m, bytes, bytes, first);
  return count || most == bytes ? count : run_within(m, bytes, most, first);
}

#define RUN_SCAN 64 /* pooled mappings looked at, at most, for a run */

vmm_mapping *vmm_store_pool_take_run(vmm_pool *p, size_t bytes, size_t most, vmm_pool_usable_fn usable, void *ctx,
                               uint32_t *first, uint32_t *count) {
  unsigned seen = 0;
  for (vmm_bucket *b = bucket_of(vmm_avl_ceil(p->root, bytes + 1, 0)); b && seen < RUN_SCAN;
       b = bucket_of(vmm_avl_ceil(p->root, b->size + 1, 0)))
    for (vmm_mapping *m = b->head; m && seen < RUN_SCAN; m = m->pool_next, seen++) { /* larger: fewer than all */
      if (m->page || !(*count = run_handles(m, bytes, most, first)) || *count == m->handle_count || !usable(ctx, m))
        continue; /* a whole mapping within `most` is a pool hit (vmm_store_pool_take), not a run */
      vmm_store_pool_remove(p, m);
      return m;
    }
  return NULL;
}

vmm_mapping *vmm_store_pool_peek_drain(const vmm_pool *p) {
  vmm_bucket *b = bucket_of(vmm_avl_last(p->root));
  vmm_assert(!b || b->head); /* no empty bucket */
  return b ? b->head : NULL;
}

vmm_bucket *vmm_store_pool_bucket_near(const vmm_pool *p, size_t lo, bool upward) {
  if (upward) return bucket_of(vmm_avl_ceil(p->root, lo, 0));
  return bucket_of(vmm_avl_floor(p->root, lo, 0));
}

static void free_buckets(vmm_avl *n) {
  if (!n) return;
  free_buckets(n->left);
  free_buckets(n->right);
  free(bucket_of(n));
}

void vmm_store_pool_fini(vmm_pool *p) {
  free_buckets(p->root);
  while (p->spare) {
    vmm_bucket *b = p->spare;
    p->spare = b->next_spare;
    free(b);
  }
  p->root = NULL;
  p->buckets = p->count = p->bytes = p->handles = 0;
}

static int check_bucket(const vmm_avl *n, size_t *buckets, size_t *count, size_t *bytes, size_t *handles, char *why,
                        size_t cap) {
  if (!n) return 0;
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  if (!b->head || b->count == 0) return snprintf(why, cap, "empty pool bucket of %zu bytes", b->size), -1;
  size_t c = 0;
  for (const vmm_mapping *m = b->head; m; m = m->pool_next) {
    if (m->extent != b->size || !vmm_mapping_in_pool(m) || m->bucket != b)
      return snprintf(why, cap, "pooled mapping 0x%llx misfiled in bucket %zu", (unsigned long long)m->base, b->size), -1;
    if (m->pool_next && m->pool_next->pool_prev != m) return snprintf(why, cap, "bucket %zu list broken", b->size), -1;
    *handles += m->handle_count;
    c++;
  }
  if (c != b->count) return snprintf(why, cap, "bucket %zu counts %zu, holds %zu", b->size, b->count, c), -1;
  *buckets += 1;
  *count += c;
  *bytes += c * b->size;
  if (check_bucket(n->left, buckets, count, bytes, handles, why, cap)) return -1;
  return check_bucket(n->right, buckets, count, bytes, handles, why, cap);
}

int vmm_store_pool_check(const vmm_pool *p, char *why, size_t cap) {
  if (vmm_avl_check(p->root) < 0) return snprintf(why, cap, "pool bucket tree unsorted or unbalanced"), -1;
  size_t buckets = 0, count = 0, bytes = 0, handles = 0;
  if (check_bucket(p->root, &buckets, &count, &bytes, &handles, why, cap)) return -1;
  if (buckets != p->buckets || count != p->count || bytes != p->bytes || handles != p->handles)
    return snprintf(why, cap, "pool totals %zu/%zu/%zu/%zu differ from recount %zu/%zu/%zu/%zu", p->buckets, p->count,
                    p->bytes, p->handles, buckets, count, bytes, handles),
           -1;
  return 0;
}

/* ---- Unmapped tier ------------------------------------------------------------------- */

static vmm_handle *handle_of(vmm_avl *n) { return n ? vmm_container_of(n, vmm_handle, node) : NULL; }

void vmm_store_idle_put(vmm_arena *a, vmm_handle *h) {
  vmm_store *s = &a->store;
  h->node.k1 = h->size;
  if (!h->node.k2) h->node.k2 = ++s->serial; /* a handle put back by an undone assembly keeps its place */
  s->idle = vmm_avl_insert(s->idle, &h->node);
  h->idle = true;
  s->idle_count++;
  s->idle_bytes += h->size;
  a->kind[h->kind].idle_count++;
  a->kind[h->kind].idle_bytes += h->size;
}

void vmm_store_idle_remove(vmm_arena *a, vmm_handle *h) {
  vmm_store *s = &a->store;
  s->idle = vmm_avl_remove(s->idle, h->node.k1, h->node.k2);
  h->idle = false;
  s->idle_count--;
  s->idle_bytes -= h->size;
  a->kind[h->kind].idle_count--;
  a->kind[h->kind].idle_bytes -= h->size;
}

vmm_handle *vmm_store_idle_take_at_most(vmm_arena *a, size_t most) {
  vmm_handle *h = handle_of(vmm_avl_floor(a->store.idle, most, UINT64_MAX));
  if (h) vmm_store_idle_remove(a, h);
  return h;
}

vmm_handle *vmm_store_idle_take_at_least(vmm_arena *a, size_t least) {
  vmm_handle *h = handle_of(vmm_avl_ceil(a->store.idle, least, 0));
  if (h) vmm_store_idle_remove(a, h);
  return h;
}

vmm_handle *vmm_store_idle_largest(const vmm_arena *a) { return handle_of(vmm_avl_last(a->store.idle)); }

void vmm_store_idle_abandon_all(vmm_arena *a) {
  vmm_store *s = &a->store;
  vmm_handle *h;
  while ((h = vmm_store_idle_largest(a)) != NULL) {
    vmm_store_idle_remove(a, h);
    h->next = s->abandoned;
    s->abandoned = h;
    s->abandoned_count++;
    s->abandoned_bytes += h->size;
    a->kind[h->kind].abandoned_count++;
    a->kind[h->kind].abandoned_bytes += h->size;
  }
}

vmm_handle *vmm_store_abandoned_pop(vmm_arena *a) {
  vmm_store *s = &a->store;
  vmm_handle *h = s->abandoned;
  if (!h) return NULL;
  s->abandoned = h->next;
  s->abandoned_count--;
  s->abandoned_bytes -= h->size;
  a->kind[h->kind].abandoned_count--;
  a->kind[h->kind].abandoned_bytes -= h->size;
  return h;
}

static int check_idle(const vmm_avl *n, vmm_kind_stats *k, size_t *count, uint64_t *bytes, char *why, size_t cap) {
  if (!n) return 0;
  const vmm_handle *h = vmm_container_of(n, vmm_handle, node);
  if (h->node.k1 != h->size || h->size == 0 || (unsigned)h->kind >= VMM_KIND_COUNT)
    return snprintf(why, cap, "idle handle of %zu bytes misfiled under %llu", h->size, (unsigned long long)h->node.k1), -1;
  if (!h->idle || h->owner)
    return snprintf(why, cap, "idle handle of %zu bytes marked %s, owned by %p", h->size, h->idle ? "idle" : "not idle",
                    (void *)h->owner),
           -1;
  k[h->kind].idle_count++;
  k[h->kind].idle_bytes += h->size;
  *count += 1;
  *bytes += h->size;
  if (check_idle(n->left, k, count, bytes, why, cap)) return -1;
  return check_idle(n->right, k, count, bytes, why, cap);
}

int vmm_store_check(const vmm_arena *a, vmm_kind_stats *k, uint64_t *physical, char *why, size_t cap) {
  const vmm_store *s = &a->store;
  if (vmm_store_pool_check(&s->pool, why, cap)) return -1;
  if (vmm_avl_check(s->idle) < 0) return snprintf(why, cap, "idle handle tree unsorted or unbalanced"), -1;
  size_t count = 0;
  uint64_t bytes = 0;
  if (check_idle(s->idle, k, &count, &bytes, why, cap)) return -1;
  if (count != s->idle_count || bytes != s->idle_bytes)
    return snprintf(why, cap, "idle handle totals %zu/%zu differ from recount %zu/%llu", s->idle_count,
                    s->idle_bytes, count, (unsigned long long)bytes),
           -1;
  *physical += bytes;
  count = 0, bytes = 0;
  for (const vmm_handle *h = s->abandoned; h; h = h->next) {
    k[h->kind].abandoned_count++;
    k[h->kind].abandoned_bytes += h->size;
    count++, bytes += h->size;
  }
  if (count != s->abandoned_count || bytes != s->abandoned_bytes)
    return snprintf(why, cap, "abandoned handle totals %zu/%zu differ from recount %zu/%llu", s->abandoned_count,
                    s->abandoned_bytes, count, (unsigned long long)bytes),
           -1;
  *physical += bytes;
  return 0;
}
