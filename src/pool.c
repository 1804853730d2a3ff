/* The pool of live transient mappings: size buckets in an AVL tree keyed by extent, each a
 * LIFO list of idle mappings. No bucket in the tree is ever empty (see vmm_pool in
 * internal.h); emptied buckets are kept on a spare list for the next push. */
#include <stdlib.h>

#include "internal.h"

static vmm_bucket *bucket_of(vmm_avl *n) { return n ? vmm_container_of(n, vmm_bucket, node) : NULL; }

int vmm_pool_push(vmm_pool *p, vmm_mapping *m) {
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
  return 0;
}

void vmm_pool_remove(vmm_pool *p, vmm_mapping *m) {
  vmm_bucket *b = m->bucket;
  vmm_assert(b && b->count > 0);
  if (m->pool_prev) m->pool_prev->pool_next = m->pool_next;
  else b->head = m->pool_next;
  if (m->pool_next) m->pool_next->pool_prev = m->pool_prev;
  m->pool_next = m->pool_prev = NULL;
  m->bucket = NULL;
  p->count--;
  p->bytes -= m->extent;
  if (--b->count == 0) {
    p->root = vmm_avl_remove(p->root, b->size, 0);
    p->buckets--;
    b->next_spare = p->spare;
    p->spare = b;
  }
}

vmm_mapping *vmm_pool_take(vmm_pool *p, size_t lo, size_t hi, vmm_pool_usable_fn usable, void *ctx) {
  for (vmm_bucket *b = bucket_of(vmm_avl_ceil(p->root, lo, 0)); b && b->size <= hi;
       b = bucket_of(vmm_avl_ceil(p->root, b->size + 1, 0))) {
    vmm_assert(b->head && b->count > 0); /* no empty bucket */
    for (vmm_mapping *m = b->head; m; m = m->pool_next) {
      if (usable && !usable(ctx, m)) continue;
      vmm_pool_remove(p, m);
      return m;
    }
  }
  return NULL;
}

vmm_mapping *vmm_pool_peek_drain(const vmm_pool *p) {
  vmm_bucket *b = bucket_of(vmm_avl_last(p->root));
  vmm_assert(!b || b->head); /* no empty bucket */
  return b ? b->head : NULL;
}

static void free_buckets(vmm_avl *n) {
  if (!n) return;
  free_buckets(n->left);
  free_buckets(n->right);
  free(bucket_of(n));
}

void vmm_pool_fini(vmm_pool *p) {
  free_buckets(p->root);
  while (p->spare) {
    vmm_bucket *b = p->spare;
    p->spare = b->next_spare;
    free(b);
  }
  p->root = NULL;
  p->buckets = p->count = p->bytes = 0;
}

static int check_bucket(const vmm_avl *n, size_t *buckets, size_t *count, size_t *bytes, char *why, size_t cap) {
  if (!n) return 0;
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  if (!b->head || b->count == 0) return snprintf(why, cap, "empty pool bucket of %zu bytes", b->size), -1;
  size_t c = 0;
  for (const vmm_mapping *m = b->head; m; m = m->pool_next) {
    if (m->extent != b->size || m->bucket != b || m->state != VMM_MAP_POOLED)
      return snprintf(why, cap, "pooled mapping 0x%llx misfiled in bucket %zu", (unsigned long long)m->base, b->size), -1;
    if (m->pool_next && m->pool_next->pool_prev != m) return snprintf(why, cap, "bucket %zu list broken", b->size), -1;
    c++;
  }
  if (c != b->count) return snprintf(why, cap, "bucket %zu counts %zu, holds %zu", b->size, b->count, c), -1;
  *buckets += 1;
  *count += c;
  *bytes += c * b->size;
  if (check_bucket(n->left, buckets, count, bytes, why, cap)) return -1;
  return check_bucket(n->right, buckets, count, bytes, why, cap);
}

int vmm_pool_check(const vmm_pool *p, char *why, size_t cap) {
  if (vmm_avl_check(p->root) < 0) return snprintf(why, cap, "pool bucket tree unsorted or unbalanced"), -1;
  size_t buckets = 0, count = 0, bytes = 0;
  if (check_bucket(p->root, &buckets, &count, &bytes, why, cap)) return -1;
  if (buckets != p->buckets || count != p->count || bytes != p->bytes)
    return snprintf(why, cap, "pool totals %zu/%zu/%zu differ from recount %zu/%zu/%zu", p->buckets, p->count,
                    p->bytes, buckets, count, bytes),
           -1;
  return 0;
}
