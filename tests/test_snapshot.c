/* Snapshot: the JSON document parsed back strictly (jansson, repeated keys refused) and checked
 * against vmm_arena_snapshot, in every arena state; hostile tag strings; the buffer-size
 * contract; tags (nested, thread-local, per-tag bytes, many distinct tags). */
#include "test_util.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define S TU_STREAM(1)
#define FFFD "\xef\xbf\xbd" /* U+FFFD, what the snapshot writes for a byte that is not UTF-8 */

/* ---- Helpers --------------------------------------------------------------------------- */

/* The document text, in a buffer of exactly the size the first call asks for. */
static char *snapshot_text(vmm_arena *a, size_t *len) {
  size_t needed = 0;
  assert_int_equal(vmm_arena_snapshot_json(a, NULL, 0, &needed), VMM_ERR_INVALID_ARGUMENT);
  assert_true(needed > 1);
  char *buf = malloc(needed);
  assert_non_null(buf);
  size_t again = 0;
  assert_int_equal(vmm_arena_snapshot_json(a, buf, needed, &again), VMM_OK);
  assert_int_equal(again, needed);
  assert_int_equal(strlen(buf), needed - 1);
  if (len) *len = needed - 1;
  return buf;
}

/* The one way every document here is parsed. jansson is strict on its own: one object or
 * array and nothing after it; no trailing commas, comments, leading zeros, NaN or Infinity;
 * strings are valid UTF-8 (no overlong forms, no encoded surrogates, nothing above U+10FFFF)
 * with control bytes escaped, \u escapes pair their surrogates, and \u0000 is refused. Repeated
 * keys are refused too with JSON_REJECT_DUPLICATES. Integers are json_int_t (64-bit signed):
 * a figure above INT64_MAX would be refused, far beyond any this suite produces. */
static json_t *parse(const char *text, json_error_t *err) {
  return json_loads(text, JSON_REJECT_DUPLICATES, err);
}

/* Parses the arena's snapshot; shows where and why if it is not valid JSON. */
static json_t *snapshot_doc(vmm_arena *a) {
  char *text = snapshot_text(a, NULL);
  json_error_t err;
  json_t *root = parse(text, &err);
  if (!root) {
    size_t at = (size_t)err.position;
    fprintf(stderr, "snapshot is not valid JSON: line %d, column %d: %s\n  near: %.80s\n", err.line, err.column,
            err.text, text + (at > 40 ? at - 40 : 0));
  }
  free(text);
  assert_non_null(root);
  return root;
}

/* The value at a path of keys and indexes from root: "pool.hits", "mappings[3].state",
 * "kinds.package.live_count"; "" is root itself. NULL if a step is missing or malformed. */
static const json_t *find(const json_t *root, const char *path) {
  const json_t *v = root;
  const char *p = path;
  while (v && *p) {
    if (*p == '[') {
      char *end;
      if (p[1] < '0' || p[1] > '9') return NULL;
      unsigned long long i = strtoull(p + 1, &end, 10);
      if (*end != ']') return NULL;
      v = json_array_get(v, (size_t)i); /* NULL if v is not an array or i is past its end */
      p = end + 1;
    } else {
      if (p != path) {
        if (*p != '.') return NULL;
        p++;
      }
      size_t n = strcspn(p, ".[");
      if (n == 0) return NULL;
      v = json_object_getn(v, p, n); /* NULL if v is not an object or has no such key */
      p += n;
    }
  }
  return v;
}

/* The unsigned integer at path: 0 and *out set if it is an integer literal (no fraction, no
 * exponent) that is not negative; -1 otherwise. */
static int get_u64(const json_t *root, const char *path, uint64_t *out) {
  const json_t *v = find(root, path);
  if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

static uint64_t u64(const json_t *root, const char *path) {
  uint64_t v = 0;
  int rc = get_u64(root, path, &v);
  if (rc) fprintf(stderr, "no unsigned integer at \"%s\"\n", path);
  assert_int_equal(rc, 0);
  return v;
}

static uint64_t u64f(const json_t *root, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static uint64_t u64f(const json_t *root, const char *fmt, ...) {
  char path[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  return u64(root, path);
}

/* JSON's six types (jansson splits numbers into integers and reals, booleans into true and
 * false). */
typedef enum shape { IS_NULL, IS_BOOL, IS_NUMBER, IS_STRING, IS_ARRAY, IS_OBJECT } shape;

static const char *shape_name(shape t) {
  static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
  return names[t];
}

static int shape_of(const json_t *v) {
  if (json_is_null(v)) return IS_NULL;
  if (json_is_boolean(v)) return IS_BOOL;
  if (json_is_number(v)) return IS_NUMBER;
  if (json_is_string(v)) return IS_STRING;
  if (json_is_array(v)) return IS_ARRAY;
  assert_true(json_is_object(v));
  return IS_OBJECT;
}

static const json_t *at(const json_t *root, const char *path, shape type) {
  const json_t *v = find(root, path);
  if (!v || shape_of(v) != (int)type)
    fprintf(stderr, "\"%s\": %s, expected %s\n", path, v ? shape_name((shape)shape_of(v)) : "missing",
            shape_name(type));
  assert_non_null(v);
  assert_int_equal(shape_of(v), type);
  return v;
}

/* The boolean, string, number or array length at path, which must be of that type. */
static int flag_at(const json_t *root, const char *path) {
  return json_is_true(at(root, path, IS_BOOL));
}

static const char *str_at(const json_t *root, const char *path) {
  return json_string_value(at(root, path, IS_STRING));
}

static double number_at(const json_t *root, const char *path) {
  return json_number_value(at(root, path, IS_NUMBER));
}

static size_t items_at(const json_t *root, const char *path) {
  return json_array_size(at(root, path, IS_ARRAY));
}

static void assert_string_at(const json_t *root, const char *path, const char *expect) {
  assert_string_equal(str_at(root, path), expect);
}

static const char *const kinds[] = {"package", "transient"};

/* Every figure of the struct appears in the document with the same value, and the document's
 * lists agree with its figures. */
static void assert_doc_matches(const json_t *d, const vmm_snapshot *s, vmm_arena *a) {
  assert_string_at(d, "schema", "vmmarena.snapshot");
  assert_int_equal(u64(d, "version"), 4);
  assert_int_equal(u64(d, "device"), (uint64_t)s->device);
  assert_int_equal(flag_at(d, "integrated"), s->integrated);
  assert_int_equal(flag_at(d, "retention.enabled"), s->retention_enabled);
  assert_string_at(d, "reuse.policy", vmm_reuse_policy_name(s->reuse));
  if (isfinite(s->reuse_bound)) assert_true(fabs(number_at(d, "reuse.bound") - s->reuse_bound) < 1e-5);
  else at(d, "reuse.bound", IS_NULL);
  assert_int_equal(u64(d, "reuse.handle_bound_bytes"), s->handle_bound_bytes);
  assert_int_equal(flag_at(d, "reuse.package_assembly"), a->cfg.package_assembly != 0);
  assert_int_equal(u64(d, "granularity"), s->granularity);
  assert_int_equal(u64(d, "headroom_bytes"), s->headroom_bytes);
  assert_int_equal(u64(d, "limit_bytes"), s->limit_bytes);
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    const vmm_kind_stats *ks = &s->kind[k];
    assert_int_equal(u64f(d, "kinds.%s.live_count", kinds[k]), ks->live_count);
    assert_int_equal(u64f(d, "kinds.%s.live_bytes", kinds[k]), ks->live_bytes);
    assert_int_equal(u64f(d, "kinds.%s.pooled_count", kinds[k]), ks->pooled_count);
    assert_int_equal(u64f(d, "kinds.%s.pooled_bytes", kinds[k]), ks->pooled_bytes);
    assert_int_equal(u64f(d, "kinds.%s.idle_count", kinds[k]), ks->idle_count);
    assert_int_equal(u64f(d, "kinds.%s.idle_bytes", kinds[k]), ks->idle_bytes);
    assert_int_equal(u64f(d, "kinds.%s.abandoned_count", kinds[k]), ks->abandoned_count);
    assert_int_equal(u64f(d, "kinds.%s.abandoned_bytes", kinds[k]), ks->abandoned_bytes);
    assert_int_equal(u64f(d, "kinds.%s.paused_count", kinds[k]), ks->paused_count);
    assert_int_equal(u64f(d, "kinds.%s.paused_bytes", kinds[k]), ks->paused_bytes);
  }
  assert_int_equal(u64(d, "totals.physical_bytes"), s->physical_bytes);
  assert_int_equal(u64(d, "totals.physical_peak_bytes"), s->physical_peak_bytes);
  assert_int_equal(u64(d, "totals.mapped_bytes"), s->mapped_bytes);
  assert_int_equal(u64(d, "totals.mapped_peak_bytes"), s->mapped_peak_bytes);
  assert_int_equal(u64(d, "totals.reserved_va_bytes"), s->reserved_va_bytes);
  assert_int_equal(u64(d, "totals.reservations"), s->reservations);
  assert_int_equal(u64(d, "totals.allocs"), s->allocs);
  assert_int_equal(u64(d, "totals.frees"), s->frees);
  assert_int_equal(u64(d, "totals.deferred_frees"), s->deferred_frees);
  assert_int_equal(u64(d, "pool.retained_reusable_handles"), s->retained_reusable_handles);
  assert_int_equal(u64(d, "pool.retained_reusable_bytes"), s->retained_reusable_bytes);
  assert_int_equal(u64(d, "pool.hits"), s->pool_hits);
  assert_int_equal(u64(d, "pool.misses"), s->pool_misses);
  assert_int_equal(u64(d, "pool.fallbacks"), s->pool_fallbacks);
  assert_int_equal(u64(d, "pool.assemblies"), s->assemblies);
  assert_int_equal(u64(d, "pool.padded_assemblies"), s->padded_assemblies);
  assert_int_equal(u64(d, "pool.assembled_idle_handles"), s->assembled_idle_handles);
  assert_int_equal(u64(d, "pool.assembly_created_bytes"), s->assembly_created_bytes);
  assert_int_equal(u64(d, "pool.pooled_taken_apart"), s->pooled_taken_apart);
  assert_int_equal(u64(d, "pool.ranges_handed_to_retiring"), s->ranges_handed_to_retiring);
  assert_int_equal(u64(d, "pool.retiring_ranges"), s->retiring_ranges);
  assert_null(find(d, "pool.stitches"));
  /* The idle tier: the idle handles the kinds count as retained. */
  uint64_t idle = u64(d, "pool.idle_handles"), idle_bytes = u64(d, "pool.idle_bytes");
  assert_int_equal(idle, s->kind[0].idle_count + s->kind[1].idle_count);
  assert_int_equal(idle_bytes, s->kind[0].idle_bytes + s->kind[1].idle_bytes);
  const json_t *buckets = at(d, "pool.buckets", IS_ARRAY);
  assert_int_equal(json_array_size(buckets), s->pool_buckets);
  uint64_t pooled = 0, pooled_bytes = 0, last_size = 0;
  for (size_t i = 0; i < json_array_size(buckets); i++) {
    uint64_t size = u64f(d, "pool.buckets[%zu].size", i), count = u64f(d, "pool.buckets[%zu].count", i);
    assert_true(size > last_size); /* ascending, one bucket per size */
    assert_true(count > 0);        /* no bucket is ever empty */
    last_size = size;
    pooled += count;
    pooled_bytes += size * count;
  }
  /* Reusable: the pooled mappings (their bytes in the buckets) and the idle tier. */
  assert_int_equal(pooled, s->kind[0].pooled_count + s->kind[1].pooled_count);
  assert_int_equal(pooled_bytes, s->kind[0].pooled_bytes + s->kind[1].pooled_bytes);
  assert_int_equal(pooled_bytes + idle_bytes, s->retained_reusable_bytes);
  assert_int_equal(u64(d, "refusals.out_of_memory"), s->oom_refusals);
  assert_int_equal(u64(d, "refusals.limit"), s->limit_refusals);
  assert_int_equal(u64(d, "refusals.headroom"), s->headroom_refusals);
  assert_string_at(d, "scope.state", s->scope_state == VMM_SCOPE_ACTIVE ? "active" : "none");
  if (s->scope_state == VMM_SCOPE_ACTIVE) assert_int_equal(u64(d, "scope.id"), s->scopes_begun);
  else assert_int_equal(u64(d, "scope.id"), 0);
  assert_int_equal(u64(d, "scope.begun"), s->scopes_begun);
  assert_int_equal(u64(d, "scope.finished"), s->scopes_finished);
  assert_int_equal(u64(d, "scope.aborted"), s->scopes_aborted);
  const json_t *drv = at(d, "driver", IS_OBJECT);
  size_t called = 0;
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) {
    const char *name = vmm_driver_entry_name((vmm_driver_entry)e);
    if (!s->driver[e].calls) {
      assert_null(json_object_get(drv, name));
      continue;
    }
    called++;
    assert_int_equal(u64f(d, "driver.%s.calls", name), s->driver[e].calls);
    assert_int_equal(u64f(d, "driver.%s.failures", name), s->driver[e].failures);
    assert_int_equal(u64f(d, "driver.%s.ns", name), s->driver[e].ns);
  }
  assert_int_equal(json_object_size(drv), called);
  if (s->fatal_status == VMM_OK) {
    at(d, "fatal_error", IS_NULL);
  } else {
    const char *message = NULL;
    assert_int_equal(vmm_arena_fatal_error(a, &message), s->fatal_status);
    assert_string_at(d, "fatal_error.status", vmm_status_name(s->fatal_status));
    assert_string_at(d, "fatal_error.message", message);
  }
  assert_string_at(d, "last_error", vmm_arena_last_error(a));
  /* The inventory: sorted by base, disjoint, and its extents add up to the kind figures. */
  const json_t *maps = at(d, "mappings", IS_ARRAY);
  uint64_t live[VMM_KIND_COUNT] = {0}, pool[VMM_KIND_COUNT] = {0}, mapped = 0, end = 0, pooled_handles = 0;
  for (size_t i = 0; i < json_array_size(maps); i++) {
    char path[64];
    snprintf(path, sizeof path, "mappings[%zu].base", i);
    const char *base_text = str_at(d, path);
    assert_true(!strncmp(base_text, "0x", 2));
    uint64_t base = strtoull(base_text, NULL, 16);
    uint64_t extent = u64f(d, "mappings[%zu].extent", i);
    assert_true(base >= end);
    end = base + extent;
    assert_int_equal(extent % s->granularity, 0);
    assert_true(u64f(d, "mappings[%zu].requested", i) <= extent);
    assert_true(u64f(d, "mappings[%zu].handles", i) >= 1);
    snprintf(path, sizeof path, "mappings[%zu].kind", i);
    int k = !strcmp(str_at(d, path), "transient");
    snprintf(path, sizeof path, "mappings[%zu].state", i);
    const char *state = str_at(d, path);
    if (!strcmp(state, "pooled")) pool[k] += extent, pooled_handles += u64f(d, "mappings[%zu].handles", i);
    else if (strcmp(state, "abandoned")) live[k] += extent;
    mapped += extent;
  }
  for (int k = 0; k < VMM_KIND_COUNT; k++) {
    assert_int_equal(live[k], s->kind[k].live_bytes);
    assert_int_equal(pool[k], s->kind[k].pooled_bytes);
  }
  assert_int_equal(mapped, s->mapped_bytes);
  /* Reusable handles: those of the pooled mappings and the unmapped idle ones. */
  assert_int_equal(pooled_handles + u64(d, "pool.idle_handles"), s->retained_reusable_handles);
}

/* Snapshot, parse, compare; returns the document for more checks. */
static json_t *checked_doc(vmm_arena *a) {
  vmm_snapshot s = tu_snapshot(a);
  json_t *d = snapshot_doc(a);
  assert_doc_matches(d, &s, a);
  return d;
}

/* Index in "mappings" of the mapping at p, or -1. */
static long mapping_index(const json_t *d, const void *p) {
  const json_t *maps = at(d, "mappings", IS_ARRAY);
  for (size_t i = 0; i < json_array_size(maps); i++) {
    char path[64];
    snprintf(path, sizeof path, "mappings[%zu].base", i);
    if (strtoull(str_at(d, path), NULL, 16) == (uint64_t)(uintptr_t)p) return (long)i;
  }
  return -1;
}

/* The "tags" entry whose tag is these bytes (NULL = the untagged entry), or NULL. */
static const json_t *tag_entry(const json_t *d, const char *tag, size_t len) {
  const json_t *tags = at(d, "tags", IS_ARRAY);
  for (size_t i = 0; i < json_array_size(tags); i++) {
    const json_t *entry = json_array_get(tags, i), *t = json_object_get(entry, "tag");
    assert_non_null(t);
    if (!tag && json_is_null(t)) return entry;
    if (tag && json_is_string(t) && json_string_length(t) == len && !memcmp(json_string_value(t), tag, len))
      return entry;
  }
  return NULL;
}

/* ---- Documents in each arena state --------------------------------------------------------- */

static void empty_arena(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  json_t *d = checked_doc(a);
  assert_int_equal(items_at(d, "mappings"), 0);
  assert_int_equal(items_at(d, "tags"), 0);
  assert_int_equal(items_at(d, "pool.buckets"), 0);
  assert_string_at(d, "retention.mode", "on");
  assert_string_at(d, "last_error", "");
  assert_null(find(d, "reuse.stitch"));
  assert_int_equal(flag_at(d, "reuse.package_assembly"), 1);
  assert_int_equal(u64(d, "reuse.handle_bound_bytes"), 2 * MiB); /* auto, nothing held yet: one granule */
  json_decref(d);
  tu_destroy(a);
}

static void both_kinds(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *p1 = tu_alloc(a, 3 * MiB, VMM_KIND_PACKAGE, S);
  void *p2 = tu_alloc(a, 1, VMM_KIND_PACKAGE, S);
  void *t1 = tu_alloc(a, 7 * MiB + 3, VMM_KIND_TRANSIENT, S);
  void *t2 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  assert_int_equal(vmm_arena_free(a, t2, S), VMM_OK);
  json_t *d = checked_doc(a);
  assert_int_equal(items_at(d, "mappings"), 3);
  long i = mapping_index(d, t1);
  assert_true(i >= 0);
  assert_int_equal(u64f(d, "mappings[%ld].extent", i), 8 * MiB);
  assert_int_equal(u64f(d, "mappings[%ld].requested", i), 7 * MiB + 3);
  char path[64];
  snprintf(path, sizeof path, "mappings[%ld].kind", i);
  assert_string_at(d, path, "transient");
  snprintf(path, sizeof path, "mappings[%ld].state", i);
  assert_string_at(d, path, "live");
  snprintf(path, sizeof path, "mappings[%ld].tag", i);
  at(d, path, IS_NULL);
  i = mapping_index(d, p2);
  assert_int_equal(u64f(d, "mappings[%ld].requested", i), 1);
  assert_int_equal(u64(d, "kinds.package.live_count"), 2);
  assert_int_equal(u64(d, "kinds.package.live_bytes"), 6 * MiB);
  assert_int_equal(u64(d, "totals.allocs"), 4);
  assert_int_equal(u64(d, "totals.frees"), 1);
  const json_t *untagged = tag_entry(d, NULL, 0);
  assert_non_null(untagged);
  assert_int_equal(u64(untagged, "count"), 3);
  assert_int_equal(u64(untagged, "bytes"), 14 * MiB);
  json_decref(d);
  assert_int_equal(vmm_arena_free(a, p1, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p2, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t1, S), VMM_OK);
  tu_destroy(a);
}

/* Pooled buckets, a retained package handle and an active scope; then finish; then an abort. */
static void pooled_and_scope(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  void *pkg = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  static const size_t sizes[] = {2 * MiB, 2 * MiB, 4 * MiB, 8 * MiB};
  void *t[4];
  for (int i = 0; i < 4; i++) t[i] = tu_alloc(a, sizes[i], VMM_KIND_TRANSIENT, S);
  for (int i = 0; i < 4; i++) assert_int_equal(vmm_arena_free(a, t[i], S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, pkg, S), VMM_OK); /* retained until finish */
  void *hit = tu_alloc(a, 4 * MiB, VMM_KIND_TRANSIENT, S);
  assert_ptr_equal(hit, t[2]);

  json_t *d = checked_doc(a);
  assert_string_at(d, "scope.state", "active");
  assert_int_equal(u64(d, "scope.id"), 1);
  assert_int_equal(u64(d, "pool.buckets[0].size"), 2 * MiB);
  assert_int_equal(u64(d, "pool.buckets[0].count"), 2);
  assert_int_equal(u64(d, "pool.buckets[1].size"), 8 * MiB);
  assert_int_equal(u64(d, "pool.buckets[1].count"), 1);
  assert_int_equal(u64(d, "pool.hits"), 1);
  assert_int_equal(u64(d, "kinds.package.idle_count"), 1);
  assert_int_equal(u64(d, "kinds.package.idle_bytes"), 4 * MiB);
  assert_int_equal(u64(d, "kinds.transient.pooled_count"), 3);
  long i = mapping_index(d, t[3]);
  char path[64];
  snprintf(path, sizeof path, "mappings[%ld].state", i);
  assert_string_at(d, path, "pooled");
  assert_int_equal(u64f(d, "mappings[%ld].scope", mapping_index(d, hit)), 1);
  assert_int_equal(u64(d, "pool.idle_handles"), 1);
  assert_int_equal(u64(d, "pool.idle_bytes"), 4 * MiB);
  assert_int_equal(u64(d, "pool.retained_reusable_bytes"), 16 * MiB);
  json_decref(d);

  /* 6 MiB, no pooled mapping of that size: the idle 4 MiB handle and one pooled 2 MiB mapping
   * taken apart are mapped back to back. */
  void *six = tu_alloc(a, 6 * MiB, VMM_KIND_TRANSIENT, S);
  d = checked_doc(a);
  assert_int_equal(u64(d, "pool.assemblies"), 1);
  assert_int_equal(u64(d, "pool.assembled_idle_handles"), 2);
  assert_int_equal(u64(d, "pool.assembly_created_bytes"), 0);
  assert_int_equal(u64(d, "pool.pooled_taken_apart"), 1);
  assert_int_equal(u64(d, "pool.padded_assemblies"), 0);
  assert_int_equal(u64(d, "pool.idle_handles"), 0);
  assert_int_equal(u64(d, "pool.misses"), 5); /* the first four and this one */
  assert_int_equal(u64f(d, "mappings[%ld].handles", mapping_index(d, six)), 2);
  assert_int_equal(u64f(d, "mappings[%ld].extent", mapping_index(d, six)), 6 * MiB);
  json_decref(d);
  assert_int_equal(vmm_arena_free(a, six, S), VMM_OK);

  assert_int_equal(vmm_retention_finish(a), VMM_OK);
  d = checked_doc(a);
  assert_string_at(d, "scope.state", "none");
  assert_int_equal(u64(d, "scope.finished"), 1);
  assert_int_equal(items_at(d, "pool.buckets"), 0);
  assert_int_equal(u64(d, "kinds.package.idle_count"), 0);
  json_decref(d);

  /* An aborted scope leaves its memory abandoned until destroy. */
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *x = tu_alloc(a, 6 * MiB, VMM_KIND_TRANSIENT, S);
  assert_int_equal(vmm_arena_free(a, x, S), VMM_OK);
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  d = checked_doc(a);
  assert_int_equal(u64(d, "scope.aborted"), 1);
  assert_int_equal(u64(d, "kinds.transient.abandoned_bytes"), 6 * MiB);
  snprintf(path, sizeof path, "mappings[%ld].state", mapping_index(d, x));
  assert_string_at(d, path, "abandoned");
  json_decref(d);
  assert_int_equal(vmm_arena_free(a, hit, S), VMM_OK);
  tu_destroy(a);
}

/* The first fatal error stays in the document while later failures replace last_error. */
static void fatal_error_set(void **state) {
  (void)state;
  vmm_config cfg = tu_config();
  cfg.limit_bytes = 8 * MiB;
  vmm_arena *a = tu_arena(NULL, &cfg);
  fake_fail_nth(VMM_DRV_mem_create, 1, CUDA_ERROR_INVALID_VALUE, 0);
  void *p = NULL;
  assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S, &p), VMM_ERR_DRIVER);
  json_t *d = checked_doc(a);
  assert_string_at(d, "fatal_error.status", "VMM_ERR_DRIVER");
  assert_non_null(strstr(str_at(d, "fatal_error.message"), "CUDA_ERROR_INVALID_VALUE"));
  assert_int_equal(u64(d, "driver.cuMemCreate.failures"), 1);
  json_decref(d);
  assert_int_equal(vmm_arena_alloc(a, 10 * MiB, VMM_KIND_PACKAGE, S, &p), VMM_ERR_OUT_OF_MEMORY);
  d = checked_doc(a);
  assert_non_null(strstr(str_at(d, "last_error"), "limit 8.0 MiB"));
  assert_non_null(strstr(str_at(d, "fatal_error.message"), "CUDA_ERROR_INVALID_VALUE"));
  assert_int_equal(u64(d, "refusals.limit"), 1);
  json_decref(d);
  tu_destroy(a);
}

/* Long lines: big extents and requests, abandoned state, assembled handles. */
static void large_figures(void **state) {
  (void)state;
  fake_options opts = {.capacity = 200 * GiB};
  vmm_config cfg = tu_config();
  cfg.reserve_bytes = 256 * GiB;
  vmm_arena *a = tu_arena(&opts, &cfg);
  assert_int_equal(vmm_retention_begin(a), VMM_OK);
  void *t1 = tu_alloc(a, 40 * GiB + 1, VMM_KIND_TRANSIENT, S);
  void *t2 = tu_alloc(a, 99 * GiB + 12345, VMM_KIND_TRANSIENT, S);
  assert_int_equal(vmm_arena_free(a, t1, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, t2, S), VMM_OK);
  assert_int_equal(vmm_retention_abort(a), VMM_OK);
  void *p = tu_alloc(a, 50 * GiB + 7, VMM_KIND_PACKAGE, S);
  json_t *d = checked_doc(a);
  assert_int_equal(u64f(d, "mappings[%ld].requested", mapping_index(d, t2)), 99 * GiB + 12345);
  assert_int_equal(u64f(d, "mappings[%ld].requested", mapping_index(d, p)), 50 * GiB + 7);
  json_decref(d);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* A reuse bound that is not a finite number is written as null, never as "inf" or "nan". */
static void non_finite_bound(void **state) {
  (void)state;
  static const vmm_reuse_policy policy[] = {VMM_REUSE_BOUNDED, VMM_REUSE_EXACT};
  const double bound[] = {INFINITY, NAN};
  for (int i = 0; i < 2; i++) {
    vmm_config cfg = tu_config();
    cfg.reuse = policy[i];
    cfg.reuse_bound = bound[i];
    vmm_arena *a = tu_arena(NULL, &cfg);
    json_t *d = checked_doc(a);
    at(d, "reuse.bound", IS_NULL);
    json_decref(d);
    tu_destroy(a);
  }
}

/* ---- Hostile tags -------------------------------------------------------------------------- */

static void hostile_tags(void **state) {
  (void)state;
  static const struct {
    const char *tag, *expect;
  } cases[] = {
      {"say \"hi\"", "say \"hi\""},
      {"back\\slash\\", "back\\slash\\"},
      {"\x01\x02\x1f ctl", "\x01\x02\x1f ctl"},
      {"tab\tnl\ncr\r\b\f", "tab\tnl\ncr\r\b\f"},
      {"del\x7f", "del\x7f"},
      {"bad \xff byte", "bad " FFFD " byte"},
      {"\xfe", FFFD},
      {"\x80 lone continuation", FFFD " lone continuation"},
      {"\xc0\xaf", FFFD FFFD},                         /* overlong '/' */
      {"\xc1\xbf", FFFD FFFD},                         /* overlong DEL */
      {"\xe0\x80\xaf", FFFD FFFD FFFD},                /* overlong, 3 bytes */
      {"\xf0\x80\x80\xaf", FFFD FFFD FFFD FFFD},       /* overlong, 4 bytes */
      {"\xed\xa0\x80", FFFD FFFD FFFD},                /* U+D800 */
      {"\xed\xbf\xbf", FFFD FFFD FFFD},                /* U+DFFF */
      {"\xed\xa0\xbd\xed\xb8\x80", FFFD FFFD FFFD FFFD FFFD FFFD}, /* a surrogate pair, CESU-8 style */
      {"\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD},       /* above U+10FFFF */
      {"\xf8\x88\x80\x80\x80", FFFD FFFD FFFD FFFD FFFD}, /* 5-byte form */
      {"cut \xe2\x82", "cut " FFFD FFFD},              /* truncated at the end */
      {"cut \xe2\x82 mid", "cut " FFFD FFFD " mid"},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e \xe6\x97\xa5\xe6\x9c\xac", /* valid: 2, 3 and 4 bytes */
       "caf\xc3\xa9 \xe2\x82\xac \xf0\x9d\x84\x9e \xe6\x97\xa5\xe6\x9c\xac"},
      {"\xef\xbb\xbf bom", "\xef\xbb\xbf bom"},
      {"\xf4\x8f\xbf\xbf max", "\xf4\x8f\xbf\xbf max"}, /* U+10FFFF */
      {"\xc2\x80\xc2\x9f c1", "\xc2\x80\xc2\x9f c1"},   /* C1 controls are valid UTF-8 */
      {"\xee\x80\x80", "\xee\x80\x80"},
      {"</script>", "</script>"},
      {"", ""},
  };
  vmm_arena *a = tu_arena(NULL, NULL);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    vmm_tag_push(cases[c].tag);
    void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
    vmm_tag_pop();
    json_t *d = checked_doc(a);
    char path[64];
    snprintf(path, sizeof path, "mappings[%ld].tag", mapping_index(d, p));
    const json_t *tag = at(d, path, IS_STRING);
    size_t len = strlen(cases[c].expect);
    if (json_string_length(tag) != len || memcmp(json_string_value(tag), cases[c].expect, len))
      fprintf(stderr, "case %zu: tag decoded wrong\n", c);
    assert_int_equal(json_string_length(tag), len);
    assert_memory_equal(json_string_value(tag), cases[c].expect, len);
    const json_t *entry = tag_entry(d, cases[c].expect, len);
    assert_non_null(entry);
    assert_int_equal(u64(entry, "count"), 1);
    assert_int_equal(u64(entry, "bytes"), 2 * MiB);
    json_decref(d);
    assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  }

  /* A 10,000-byte tag with quotes, backslashes and multibyte characters comes back whole. */
  enum { LONG_TAG = 10000 };
  static const char unit[] = "x\"y\\z\xc3\xa9"; /* 7 bytes */
  char *long_tag = malloc(LONG_TAG + 1);
  assert_non_null(long_tag);
  for (size_t i = 0; i < LONG_TAG; i++) long_tag[i] = unit[i % 7];
  long_tag[LONG_TAG] = '\0'; /* 10000 = 1428 * 7 + 4: ends with x"y\, no cut character */
  vmm_tag_push(long_tag);
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  vmm_tag_pop();
  json_t *d = checked_doc(a);
  char path[64];
  snprintf(path, sizeof path, "mappings[%ld].tag", mapping_index(d, p));
  const json_t *tag = at(d, path, IS_STRING);
  assert_int_equal(json_string_length(tag), LONG_TAG);
  assert_memory_equal(json_string_value(tag), long_tag, LONG_TAG);
  assert_non_null(tag_entry(d, long_tag, LONG_TAG));
  json_decref(d);
  free(long_tag);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* ---- The buffer contract ------------------------------------------------------------------- */

static void buffer_too_small(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  vmm_tag_push("buffer \"test\"");
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
  vmm_tag_pop();
  size_t len;
  char *full = snapshot_text(a, &len);
  size_t needed = len + 1;

  /* One byte short, and much shorter: refused, *needed exact, a NUL-terminated prefix. */
  const size_t caps[] = {needed - 1, needed / 2, 1};
  for (int i = 0; i < 3; i++) {
    char *buf = malloc(caps[i]);
    assert_non_null(buf);
    size_t got = 0;
    assert_int_equal(vmm_arena_snapshot_json(a, buf, caps[i], &got), VMM_ERR_INVALID_ARGUMENT);
    assert_int_equal(got, needed);
    assert_int_equal(buf[caps[i] - 1], '\0');
    assert_memory_equal(buf, full, caps[i] - 1);
    free(buf);
  }
  /* Exactly the size needed succeeds; a larger buffer too, with the same text. */
  char *exact = malloc(needed);
  assert_non_null(exact);
  assert_int_equal(vmm_arena_snapshot_json(a, exact, needed, NULL), VMM_OK);
  assert_string_equal(exact, full);
  free(exact);
  char *roomy = malloc(needed + 100);
  assert_non_null(roomy);
  size_t got = 0;
  assert_int_equal(vmm_arena_snapshot_json(a, roomy, needed + 100, &got), VMM_OK);
  assert_int_equal(got, needed);
  assert_string_equal(roomy, full);
  free(roomy);
  /* Bad arguments. */
  assert_int_equal(vmm_arena_snapshot_json(NULL, full, needed, &got), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_snapshot_json(a, NULL, 10, &got), VMM_ERR_INVALID_ARGUMENT);
  vmm_snapshot s;
  assert_int_equal(vmm_arena_snapshot(NULL, &s), VMM_ERR_INVALID_ARGUMENT);
  assert_int_equal(vmm_arena_snapshot(a, NULL), VMM_ERR_INVALID_ARGUMENT);
  free(full);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);
}

/* ---- Tags ---------------------------------------------------------------------------------- */

static void tags_nested(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  assert_null(vmm_tag_current());
  vmm_tag_pop(); /* popping an empty stack changes nothing */
  assert_null(vmm_tag_current());
  vmm_tag_push("prefill");
  void *p1 = tu_alloc(a, 4 * MiB, VMM_KIND_PACKAGE, S);
  vmm_tag_push("decode");
  assert_string_equal(vmm_tag_current(), "decode");
  void *p2 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  vmm_tag_push(NULL); /* an untagged level inside tagged ones */
  assert_null(vmm_tag_current());
  void *p3 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  vmm_tag_pop();
  vmm_tag_pop();
  assert_string_equal(vmm_tag_current(), "prefill");
  void *p4 = tu_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S);
  vmm_tag_pop();
  assert_null(vmm_tag_current());

  json_t *d = checked_doc(a);
  const json_t *prefill = tag_entry(d, "prefill", 7), *decode = tag_entry(d, "decode", 6);
  const json_t *none = tag_entry(d, NULL, 0);
  assert_non_null(prefill);
  assert_non_null(decode);
  assert_non_null(none);
  assert_int_equal(u64(prefill, "count"), 2);
  assert_int_equal(u64(prefill, "bytes"), 6 * MiB);
  assert_int_equal(u64(decode, "count"), 1);
  assert_int_equal(u64(decode, "bytes"), 2 * MiB);
  assert_int_equal(u64(none, "count"), 1);
  char path[64];
  snprintf(path, sizeof path, "mappings[%ld].tag", mapping_index(d, p4));
  assert_string_at(d, path, "prefill");
  json_decref(d);

  /* A free takes bytes off the allocation's tag, whatever tag is current. */
  vmm_tag_push("unrelated");
  assert_int_equal(vmm_arena_free(a, p1, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p2, S), VMM_OK);
  vmm_tag_pop();
  d = checked_doc(a);
  prefill = tag_entry(d, "prefill", 7);
  assert_int_equal(u64(prefill, "count"), 1);
  assert_int_equal(u64(prefill, "bytes"), 2 * MiB);
  assert_null(tag_entry(d, "decode", 6)); /* nothing left under it: not listed */
  assert_null(tag_entry(d, "unrelated", 9));
  json_decref(d);
  assert_int_equal(vmm_arena_free(a, p3, S), VMM_OK);
  assert_int_equal(vmm_arena_free(a, p4, S), VMM_OK);
  tu_destroy(a);
}

typedef struct tag_thread {
  vmm_arena *arena;
  const char *tag;
  pthread_barrier_t *barrier;
  void *ptr;
  const char *seen_before, *seen_after;
} tag_thread;

static void *tag_thread_main(void *arg) {
  tag_thread *t = arg;
  vmm_tag_push(t->tag);
  pthread_barrier_wait(t->barrier); /* both threads hold their tag before either allocates */
  if (vmm_arena_alloc(t->arena, 2 * MiB, VMM_KIND_TRANSIENT, S, &t->ptr) != VMM_OK) t->ptr = NULL;
  t->seen_before = vmm_tag_current();
  pthread_barrier_wait(t->barrier);
  vmm_tag_pop();
  t->seen_after = vmm_tag_current();
  return NULL;
}

static void tags_thread_local(void **state) {
  (void)state;
  vmm_arena *a = tu_arena(NULL, NULL);
  vmm_tag_push("main thread");
  pthread_barrier_t barrier;
  assert_int_equal(pthread_barrier_init(&barrier, NULL, 2), 0);
  tag_thread t[2] = {{a, "thread one", &barrier, NULL, NULL, NULL}, {a, "thread two", &barrier, NULL, NULL, NULL}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, tag_thread_main, &t[i]), 0);
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
  pthread_barrier_destroy(&barrier);
  assert_string_equal(vmm_tag_current(), "main thread");
  vmm_tag_pop();
  json_t *d = checked_doc(a);
  for (int i = 0; i < 2; i++) {
    assert_non_null(t[i].ptr);
    assert_string_equal(t[i].seen_before, t[i].tag);
    assert_null(t[i].seen_after);
    char path[64];
    snprintf(path, sizeof path, "mappings[%ld].tag", mapping_index(d, t[i].ptr));
    assert_string_at(d, path, t[i].tag);
    const json_t *entry = tag_entry(d, t[i].tag, strlen(t[i].tag));
    assert_int_equal(u64(entry, "count"), 1);
  }
  assert_null(tag_entry(d, "main thread", 11));
  json_decref(d);
  for (int i = 0; i < 2; i++) assert_int_equal(vmm_arena_free(a, t[i].ptr, S), VMM_OK);
  tu_destroy(a);
}

/* 100,000 distinct tags: each is interned once (a repeat adds nothing), an allocation carries
 * only the tag's id, and tags with nothing live leave the document. */
static void many_distinct_tags(void **state) {
  (void)state;
  enum { TAGS = 100000 };
  fake_options opts = {.record_calls = -1};
  vmm_arena *a = tu_arena(&opts, NULL);
  uint32_t first = 0; /* the id of "many-tags-0"; the others follow it (ids are given in order) */
  char tag[32];
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < TAGS; i++) {
      snprintf(tag, sizeof tag, "many-tags-%d", i);
      vmm_tag_push(tag);
      if (round == 0 && i == 0) first = vmm_tag_current_id();
      assert_int_equal(vmm_tag_current_id(), first + (uint32_t)i); /* the second round interns nothing */
      void *p = NULL;
      assert_int_equal(vmm_arena_alloc(a, 2 * MiB, VMM_KIND_TRANSIENT, S, &p), VMM_OK);
      vmm_tag_pop();
      assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
    }
  }
  /* The same tag pushed 100,000 times, nested: one name, and the stack unwinds. */
  for (int i = 0; i < TAGS; i++) vmm_tag_push("many-tags-0");
  assert_int_equal(vmm_tag_current_id(), first);
  for (int i = 0; i < TAGS; i++) vmm_tag_pop();
  assert_null(vmm_tag_current());
  vmm_tag_push("many-tags-new"); /* the next id: nothing was interned in between */
  assert_int_equal(vmm_tag_current_id(), first + TAGS);
  vmm_tag_pop();

  json_t *d = checked_doc(a);
  assert_int_equal(items_at(d, "tags"), 0);
  assert_int_equal(u64(d, "totals.allocs"), 2 * TAGS);
  json_decref(d);

  /* A thousand of them live at once: one entry each. */
  void *live[1000];
  for (int i = 0; i < 1000; i++) {
    snprintf(tag, sizeof tag, "many-tags-%d", i * 7);
    vmm_tag_push(tag);
    live[i] = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
    vmm_tag_pop();
  }
  d = checked_doc(a);
  assert_int_equal(items_at(d, "tags"), 1000);
  assert_int_equal(u64(tag_entry(d, "many-tags-6993", 14), "bytes"), 2 * MiB);
  json_decref(d);
  for (int i = 0; i < 1000; i++) assert_int_equal(vmm_arena_free(a, live[i], S), VMM_OK);
  tu_destroy(a);
}

/* ---- The parse the checks rely on ------------------------------------------------------------ */

/* What the snapshot must never contain, the parse refuses, each for its own reason: every
 * document above parsed, so none held any of it. */
static void parse_is_strict(void **state) {
  (void)state;
  static const struct {
    const char *text;
    enum json_error_code code;
  } bad[] = {
      {"{\"a\":1,}", json_error_invalid_syntax},
      {"[1,]", json_error_invalid_syntax},
      {"[01]", json_error_invalid_syntax},
      {"[1.]", json_error_invalid_syntax},
      {"[.5]", json_error_invalid_syntax},
      {"[+1]", json_error_invalid_syntax},
      {"[NaN]", json_error_invalid_syntax},
      {"[Infinity]", json_error_invalid_syntax},
      {"[-Infinity]", json_error_invalid_syntax},
      {"{'a':1}", json_error_invalid_syntax},
      {"{\"a\":1 \"b\":2}", json_error_invalid_syntax},
      {"{\"a\":1,\n \"a\":2}", json_error_duplicate_key},
      {"[\"\\x\"]", json_error_invalid_syntax},
      {"[\"\\ud800\"]", json_error_invalid_syntax},
      {"[\"\\udc00\"]", json_error_invalid_syntax},
      {"[\"\\ud800\\u0041\"]", json_error_invalid_syntax},
      {"[\"\\u0000\"]", json_error_null_character},
      {"[\"a\x01\"]", json_error_invalid_syntax},
      {"[\"tab\there\"]", json_error_invalid_syntax},
      {"[\"\xc0\xaf\"]", json_error_invalid_utf8},         /* overlong */
      {"[\"\xed\xa0\x80\"]", json_error_invalid_utf8},     /* U+D800 */
      {"[\"\xf4\x90\x80\x80\"]", json_error_invalid_utf8}, /* above U+10FFFF */
      {"[\"\xe2\x82\"]", json_error_invalid_utf8},         /* cut */
      {"[\"\xff\"]", json_error_invalid_utf8},
      {"{\"\xfe\":1}", json_error_invalid_utf8}, /* in a key */
      {"[\"open", json_error_premature_end_of_input},
      {"[\n1,\n2\n", json_error_premature_end_of_input},
      {"[1] 2", json_error_end_of_input_expected},
      {"{}{}", json_error_end_of_input_expected},
      {"// comment\n{}", json_error_invalid_syntax},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_error_t err;
    json_t *v = parse(bad[i].text, &err);
    if (v || json_error_code(&err) != bad[i].code)
      fprintf(stderr, "case %zu (%s): %s, code %d (%s)\n", i, bad[i].text, v ? "accepted" : "refused",
              (int)json_error_code(&err), err.text);
    assert_null(v);
    assert_int_equal(json_error_code(&err), bad[i].code);
  }

  /* A real document parses; the same with a trailing comma, a repeated key or a second
   * document after it does not. */
  vmm_arena *a = tu_arena(NULL, NULL);
  vmm_tag_push("strict");
  void *p = tu_alloc(a, 2 * MiB, VMM_KIND_PACKAGE, S);
  vmm_tag_pop();
  size_t len;
  char *text = snapshot_text(a, &len);
  assert_true(len > 2 && text[0] == '{' && text[len - 1] == '}');
  json_error_t err;
  json_t *d = parse(text, &err);
  assert_non_null(d);
  json_decref(d);
  char *bent = malloc(len + 32);
  assert_non_null(bent);
  snprintf(bent, len + 32, "%.*s,}", (int)(len - 1), text);
  assert_null(parse(bent, &err));
  assert_int_equal(json_error_code(&err), json_error_invalid_syntax);
  snprintf(bent, len + 32, "{\"schema\":\"x\",%s", text + 1);
  assert_null(parse(bent, &err));
  assert_int_equal(json_error_code(&err), json_error_duplicate_key);
  snprintf(bent, len + 32, "%s{}", text);
  assert_null(parse(bent, &err));
  assert_int_equal(json_error_code(&err), json_error_end_of_input_expected);
  free(bent);
  free(text);
  assert_int_equal(vmm_arena_free(a, p, S), VMM_OK);
  tu_destroy(a);

  /* The path and number helpers: an unsigned integer is an integer literal, not negative; a
   * missing or malformed step finds nothing. */
  const char *good = "{\"n\":[0,-1,1.0,1e3,9223372036854775807],\"o\":{\"k\":[true,false,null]},\"s\":\"x\"}";
  json_t *v = parse(good, &err);
  assert_non_null(v);
  uint64_t x = 1;
  assert_int_equal(get_u64(v, "n[0]", &x), 0);
  assert_int_equal(x, 0);
  assert_int_equal(get_u64(v, "n[1]", &x), -1);
  assert_int_equal(get_u64(v, "n[2]", &x), -1);
  assert_int_equal(get_u64(v, "n[3]", &x), -1);
  assert_true(number_at(v, "n[3]") == 1000.0);
  assert_int_equal(get_u64(v, "n[4]", &x), 0);
  assert_int_equal(x, INT64_MAX);
  assert_int_equal(get_u64(v, "s", &x), -1);
  assert_int_equal(flag_at(v, "o.k[0]"), 1);
  assert_int_equal(flag_at(v, "o.k[1]"), 0);
  at(v, "o.k[2]", IS_NULL);
  assert_null(find(v, "o.k[3]"));
  assert_null(find(v, "o.missing"));
  assert_null(find(v, "o..k"));
  assert_null(find(v, ".o"));
  assert_null(find(v, "o.k[1"));
  assert_null(find(v, "o.k[1]x"));
  assert_null(find(v, "n[x]"));
  assert_null(find(v, "s[0]"));
  assert_null(find(v, "s.t"));
  assert_ptr_equal(find(v, ""), v);
  json_decref(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(empty_arena),       cmocka_unit_test(both_kinds),        cmocka_unit_test(pooled_and_scope),
      cmocka_unit_test(fatal_error_set),   cmocka_unit_test(large_figures),     cmocka_unit_test(non_finite_bound),
      cmocka_unit_test(hostile_tags),      cmocka_unit_test(buffer_too_small),  cmocka_unit_test(tags_nested),
      cmocka_unit_test(tags_thread_local), cmocka_unit_test(many_distinct_tags), cmocka_unit_test(parse_is_strict),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
