/* Id sets: sorted arrays of 64-bit ids (aborted scopes, released pools), searched by
 * bisection. Ids mostly arrive in ascending order, so an add is an append. */
#include <string.h>

#include "internal.h"

/* The index of the first id >= `id`. */
static size_t lower_bound(const vmm_id_set *s, uint64_t id) {
  size_t lo = 0, hi = s->count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (s->ids[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

bool vmm_ids_has(const vmm_id_set *s, uint64_t id) {
  size_t i = lower_bound(s, id);
  return i < s->count && s->ids[i] == id;
}

int vmm_ids_add(vmm_id_set *s, uint64_t id) {
  size_t i = lower_bound(s, id);
  if (i < s->count && s->ids[i] == id) return 0;
  uint64_t *room = vmm_array_room(s->ids, s->count, &s->cap, sizeof *room);
  if (!room) return -1;
  s->ids = room;
  memmove(s->ids + i + 1, s->ids + i, (s->count - i) * sizeof *s->ids);
  s->ids[i] = id;
  s->count++;
  return 0;
}

void vmm_ids_fini(vmm_id_set *s) {
  free(s->ids);
  memset(s, 0, sizeof *s);
}
