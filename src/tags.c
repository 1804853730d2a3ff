/* Tags: thread-local, nested labels for new allocations. Tag strings are interned once per
 * process into small ids, so an allocation carries 4 bytes of tag whatever the text. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static char **names;          /* names[id], id >= 1 */
static uint32_t name_count = 1, name_cap;
static uint32_t *index_slots; /* open addressing over ids, 0 = empty */
static size_t index_cap;

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int index_grow(void) {
  size_t cap = index_cap ? index_cap * 2 : 64;
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return -1;
  for (uint32_t id = 1; id < name_count; id++) {
    size_t i = hash_str(names[id]) & (cap - 1);
    while (slots[i]) i = (i + 1) & (cap - 1);
    slots[i] = id;
  }
  free(index_slots);
  index_slots = slots;
  index_cap = cap;
  return 0;
}

/* The id of an interned tag, or 0. Called with intern_lock held. */
static uint32_t find(const char *tag) {
  if (!index_cap) return 0;
  for (size_t i = hash_str(tag) & (index_cap - 1); index_slots[i]; i = (i + 1) & (index_cap - 1))
    if (!strcmp(names[index_slots[i]], tag)) return index_slots[i];
  return 0;
}

uint32_t vmm_tag_lookup(const char *name, bool *known) {
  pthread_mutex_lock(&intern_lock);
  uint32_t id = find(name);
  pthread_mutex_unlock(&intern_lock);
  *known = id != 0;
  return id;
}

/* Returns the id of the tag, interning it; 0 if out of memory. */
static uint32_t intern(const char *tag) {
  pthread_mutex_lock(&intern_lock);
  uint32_t id = find(tag);
  if (id) goto out;
  if ((name_count + 1) * 2 > index_cap && index_grow()) goto out;
  if (name_count >= name_cap) { /* ids start at 1, so the first tag finds name_count 1 > name_cap 0 */
    uint32_t cap = name_cap ? name_cap * 2 : 64;
    char **grown = realloc(names, cap * sizeof *grown);
    if (!grown) goto out;
    names = grown;
    name_cap = cap;
  }
  char *copy = strdup(tag);
  if (!copy) goto out;
  id = name_count++;
  names[id] = copy;
  size_t i = hash_str(tag) & (index_cap - 1);
  while (index_slots[i]) i = (i + 1) & (index_cap - 1);
  index_slots[i] = id;
out:
  pthread_mutex_unlock(&intern_lock);
  return id;
}

const char *vmm_tag_name(uint32_t id) {
  pthread_mutex_lock(&intern_lock);
  const char *name = id && id < name_count ? names[id] : NULL;
  pthread_mutex_unlock(&intern_lock);
  return name;
}

static __thread uint32_t *tag_stack;
static __thread size_t tag_depth, tag_stack_cap;

void vmm_tag_push(const char *tag) {
  uint32_t id = tag ? intern(tag) : 0;
  if (tag_depth == tag_stack_cap) {
    size_t cap = tag_stack_cap ? tag_stack_cap * 2 : 8;
    uint32_t *grown = realloc(tag_stack, cap * sizeof *grown);
    if (!grown) {
      /* Keep push and pop balanced: count the level without storing it. */
      tag_depth++;
      return;
    }
    tag_stack = grown;
    tag_stack_cap = cap;
  }
  tag_stack[tag_depth++] = id;
}

void vmm_tag_pop(void) {
  if (tag_depth) tag_depth--;
  if (tag_depth == 0) {
    free(tag_stack);
    tag_stack = NULL;
    tag_stack_cap = 0;
  }
}

uint32_t vmm_tag_current_id(void) {
  if (!tag_depth) return 0;
  return tag_depth <= tag_stack_cap ? tag_stack[tag_depth - 1] : 0;
}

const char *vmm_tag_current(void) { return vmm_tag_name(vmm_tag_current_id()); }
