/* Intrusive AVL tree keyed by (k1, k2). Recursive: depth is at most ~1.44 log2(n). */
#include "internal.h"

static int height(const vmm_avl *n) { return n ? n->height : 0; }

static int cmp(uint64_t a1, uint64_t a2, const vmm_avl *n) {
  if (a1 != n->k1) return a1 < n->k1 ? -1 : 1;
  if (a2 != n->k2) return a2 < n->k2 ? -1 : 1;
  return 0;
}

static void update(vmm_avl *n) {
  int hl = height(n->left), hr = height(n->right);
  n->height = (hl > hr ? hl : hr) + 1;
}

/* The child slot of n on one side: 0 left, 1 right. */
static vmm_avl **child(vmm_avl *n, int side) { return side ? &n->right : &n->left; }

/* Rotates n's child on `side` up into n's place (a right rotation for side 0); returns it. */
static vmm_avl *rotate(vmm_avl *n, int side) {
  vmm_avl *c = *child(n, side);
  *child(n, side) = *child(c, !side);
  *child(c, !side) = n;
  update(n);
  update(c);
  return c;
}

static vmm_avl *rotate_right(vmm_avl *n) { return rotate(n, 0); }
static vmm_avl *rotate_left(vmm_avl *n) { return rotate(n, 1); }

static vmm_avl *rebalance(vmm_avl *n) {
  update(n);
  int balance = height(n->left) - height(n->right);
  if (balance > 1) {
    if (height(n->left->left) < height(n->left->right)) n->left = rotate_left(n->left);
    return rotate_right(n);
  }
  if (balance < -1) {
    if (height(n->right->right) < height(n->right->left)) n->right = rotate_right(n->right);
    return rotate_left(n);
  }
  return n;
}

vmm_avl *vmm_avl_insert(vmm_avl *root, vmm_avl *node) {
  if (!root) {
    node->left = node->right = NULL;
    node->height = 1;
    return node;
  }
  int c = cmp(node->k1, node->k2, root);
  vmm_assert(c != 0);
  if (c < 0)
    root->left = vmm_avl_insert(root->left, node);
  else
    root->right = vmm_avl_insert(root->right, node);
  return rebalance(root);
}

static vmm_avl *remove_min(vmm_avl *n, vmm_avl **min) {
  if (!n->left) {
    *min = n;
    return n->right;
  }
  n->left = remove_min(n->left, min);
  return rebalance(n);
}

vmm_avl *vmm_avl_remove(vmm_avl *root, uint64_t k1, uint64_t k2) {
  if (!root) return NULL;
  int c = cmp(k1, k2, root);
  if (c < 0) {
    root->left = vmm_avl_remove(root->left, k1, k2);
  } else if (c > 0) {
    root->right = vmm_avl_remove(root->right, k1, k2);
  } else {
    vmm_avl *l = root->left, *r = root->right;
    if (!r) return l;
    vmm_avl *min;
    r = remove_min(r, &min);
    min->left = l;
    min->right = r;
    return rebalance(min);
  }
  return rebalance(root);
}

vmm_avl *vmm_avl_find(vmm_avl *n, uint64_t k1, uint64_t k2) {
  while (n) {
    int c = cmp(k1, k2, n);
    if (c == 0) return n;
    n = c < 0 ? n->left : n->right;
  }
  return NULL;
}

/* The node nearest the key from one side: the smallest at or above it (side 0) or the
 * largest at or below it (side 1); NULL if there is none. */
static vmm_avl *nearest(vmm_avl *n, uint64_t k1, uint64_t k2, int side) {
  vmm_avl *best = NULL;
  while (n) {
    int c = cmp(k1, k2, n);
    if (c == 0) return n;
    bool beyond = side ? c > 0 : c < 0; /* n lies on the wanted side of the key */
    if (beyond) best = n;
    n = *child(n, beyond ? side : !side);
  }
  return best;
}

vmm_avl *vmm_avl_ceil(vmm_avl *n, uint64_t k1, uint64_t k2) { return nearest(n, k1, k2, 0); }

vmm_avl *vmm_avl_floor(vmm_avl *n, uint64_t k1, uint64_t k2) { return nearest(n, k1, k2, 1); }

vmm_avl *vmm_avl_last(vmm_avl *n) {
  while (n && n->right) n = n->right;
  return n;
}

static long check(const vmm_avl *n, const vmm_avl **prev) {
  if (!n) return 0;
  long l = check(n->left, prev);
  if (l < 0) return -1;
  if (*prev && cmp((*prev)->k1, (*prev)->k2, n) >= 0) return -1;
  *prev = n;
  long r = check(n->right, prev);
  if (r < 0) return -1;
  int hl = height(n->left), hr = height(n->right);
  if (n->height != (hl > hr ? hl : hr) + 1 || hl - hr > 1 || hr - hl > 1) return -1;
  return l + r + 1;
}

long vmm_avl_check(const vmm_avl *root) {
  const vmm_avl *prev = NULL;
  return check(root, &prev);
}
