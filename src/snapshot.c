/* Snapshot: the C struct and the JSON document (schema in docs/snapshot.md). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void fill(const vmm_arena *a, vmm_snapshot *s) {
  memset(s, 0, sizeof *s);
  s->device = a->cfg.device;
  s->integrated = a->integrated;
  s->retention_enabled = a->retention_enabled;
  s->reuse = a->cfg.reuse;
  s->reuse_bound = a->cfg.reuse_bound;
  s->granularity = a->granularity;
  s->headroom_bytes = a->cfg.headroom_bytes;
  s->limit_bytes = a->cfg.limit_bytes;
  memcpy(s->kind, a->kind, sizeof s->kind);
  s->physical_bytes = a->physical_bytes;
  s->physical_peak_bytes = a->physical_peak;
  s->mapped_bytes = a->mapped_bytes;
  s->mapped_peak_bytes = a->mapped_peak;
  s->reserved_va_bytes = a->ranges.reserved_bytes;
  s->reservations = a->ranges.reservation_count;
  s->retained_reusable_handles = a->store.pool.handles + a->store.idle_count;
  s->retained_reusable_bytes = a->store.pool.bytes + a->store.idle_bytes;
  s->pool_buckets = a->store.pool.buckets;
  s->pool_hits = a->pool_hits;
  s->pool_misses = a->pool_misses;
  s->pool_fallbacks = a->pool_fallbacks;
  s->handle_bound_bytes = vmm_handle_bound(a, 0);
  s->assemblies = a->assemblies;
  s->padded_assemblies = a->padded_assemblies;
  s->assembled_idle_handles = a->assembled_idle_handles;
  s->assembly_created_bytes = a->assembly_created_bytes;
  s->pooled_taken_apart = a->pooled_taken_apart;
  s->ranges_handed_to_retiring = a->retiring.serial;
  s->prefix_hits = a->prefix_hits;
  s->retiring_ranges = a->retiring.count;
  s->retiring_bytes = a->retiring.bytes;
  s->revived_ranges = a->retiring.revived;
  s->revived_runs = a->retiring.revived_runs;
  s->refills = a->refills;
  s->run_hits = a->run_hits;
  s->unmapped_in_background = a->unmapper.handed;
  s->grown_in_place = a->grown_in_place;
  s->oom_refusals = a->oom_refusals;
  s->limit_refusals = a->limit_refusals;
  s->headroom_refusals = a->headroom_refusals;
  s->allocs = a->allocs;
  s->frees = a->frees;
  s->deferred_frees = a->deferred_frees;
  s->scope_state = a->scope;
  s->scopes_begun = a->scopes_begun;
  s->scopes_finished = a->scopes_finished;
  s->scopes_aborted = a->scopes_aborted;
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) {
    s->driver[e].calls = __atomic_load_n(&a->drv_stats[e].calls, __ATOMIC_RELAXED);
    s->driver[e].failures = __atomic_load_n(&a->drv_stats[e].failures, __ATOMIC_RELAXED);
    s->driver[e].ns = __atomic_load_n(&a->drv_stats[e].ns, __ATOMIC_RELAXED);
  }
  s->fatal_status = a->fatal_status;
}

/* Fills `out` under the arena's lock. */
static vmm_status read_locked(vmm_arena *a, void *out, void (*read)(const vmm_arena *a, void *out)) {
  if (!a || !out) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  read(a, out);
  pthread_mutex_unlock(&a->lock);
  return VMM_OK;
}

static void read_snapshot(const vmm_arena *a, void *out) { fill(a, out); }
static void read_usage(const vmm_arena *a, void *out) { vmm_accounting_fill_usage(a, out); }

vmm_status vmm_arena_snapshot(vmm_arena *a, vmm_snapshot *out) { return read_locked(a, out, read_snapshot); }

vmm_status vmm_arena_usage(vmm_arena *a, vmm_usage *out) { return read_locked(a, out, read_usage); }

/* ---- JSON ---------------------------------------------------------------------------- */

typedef struct jw {
  char *buf;
  size_t cap, len; /* len counts every byte the document needs, written or not */
} jw;

static void put(jw *w, const char *s, size_t n) {
  if (w->len < w->cap) {
    size_t room = w->cap - w->len;
    memcpy(w->buf + w->len, s, n < room ? n : room);
  }
  w->len += n;
}

static void puts_(jw *w, const char *s) { put(w, s, strlen(s)); }

/* Formats straight into the buffer, so no item is cut however long. vsnprintf's NUL lands
 * where the next write (or the document's own NUL) goes; text that does not fit means the
 * document does not fit either, which the caller reports. */
static void printf_(jw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void printf_(jw *w, const char *fmt, ...) {
  size_t room = w->len < w->cap ? w->cap - w->len : 0;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(room ? w->buf + w->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n > 0) w->len += (size_t)n;
}

/* Writes s as a JSON string: quotes, backslashes and control bytes escaped; bytes that are
 * not valid UTF-8 become U+FFFD so the document is always valid. */
static void str(jw *w, const char *s) {
  put(w, "\"", 1);
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    unsigned char c = *p;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      put(w, e, 2);
      p++;
    } else if (c < 0x20 || c == 0x7f) {
      printf_(w, "\\u%04x", c);
      p++;
    } else if (c < 0x80) {
      put(w, (const char *)p, 1);
      p++;
    } else {
      int n = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
      int ok = n > 0 && !(n == 2 && c < 0xc2) && !(n == 4 && c > 0xf4);
      for (int i = 1; ok && i < n; i++) ok = (p[i] & 0xc0) == 0x80;
      if (ok && n == 3) {
        unsigned cp = (unsigned)(c & 0x0f) << 12 | (unsigned)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
        ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
      }
      if (ok && n == 4) {
        unsigned cp = (unsigned)(c & 0x07) << 18 | (unsigned)(p[1] & 0x3f) << 12 | (unsigned)(p[2] & 0x3f) << 6 |
                      (p[3] & 0x3f);
        ok = cp >= 0x10000 && cp <= 0x10ffff;
      }
      if (ok) {
        put(w, (const char *)p, (size_t)n);
        p += n;
      } else {
        puts_(w, "\\ufffd");
        p++;
      }
    }
  }
  put(w, "\"", 1);
}

static void kv_u64(jw *w, const char *key, uint64_t v, int comma) {
  printf_(w, "%s\"%s\":%llu", comma ? "," : "", key, (unsigned long long)v);
}

/* A JSON key and the uint64_t member of a struct it reports. */
typedef struct field {
  const char *key;
  size_t offset;
} field;

#define FIELD(type, member) {#member, offsetof(type, member)}
#define FIELD_AS(key, type, member) {key, offsetof(type, member)}

static const field kind_fields[] = {
    FIELD(vmm_kind_stats, live_count),      FIELD(vmm_kind_stats, live_bytes),
    FIELD(vmm_kind_stats, pooled_count),    FIELD(vmm_kind_stats, pooled_bytes),
    FIELD(vmm_kind_stats, idle_count),  FIELD(vmm_kind_stats, idle_bytes),
    FIELD(vmm_kind_stats, paused_count),    FIELD(vmm_kind_stats, paused_bytes),
    FIELD(vmm_kind_stats, abandoned_count), FIELD(vmm_kind_stats, abandoned_bytes),
};

static const field total_fields[] = {
    FIELD(vmm_snapshot, physical_bytes), FIELD(vmm_snapshot, physical_peak_bytes), FIELD(vmm_snapshot, mapped_bytes),
    FIELD(vmm_snapshot, mapped_peak_bytes), FIELD(vmm_snapshot, reserved_va_bytes), FIELD(vmm_snapshot, reservations),
    FIELD(vmm_snapshot, allocs), FIELD(vmm_snapshot, frees), FIELD(vmm_snapshot, deferred_frees),
};

static const field refusal_fields[] = {
    FIELD_AS("out_of_memory", vmm_snapshot, oom_refusals),
    FIELD_AS("limit", vmm_snapshot, limit_refusals),
    FIELD_AS("headroom", vmm_snapshot, headroom_refusals),
};

/* Writes "{" (open), the fields of obj as "key":value pairs, and "}" (close). */
static void fields_json(jw *w, const void *obj, const field *f, size_t n, bool open, bool close) {
  if (open) puts_(w, "{");
  for (size_t i = 0; i < n; i++)
    kv_u64(w, f[i].key, *(const uint64_t *)(const void *)((const char *)obj + f[i].offset), i > 0);
  if (close) puts_(w, "}");
}

#define FIELDS_JSON(w, obj, table, open, close) fields_json(w, obj, table, sizeof table / sizeof table[0], open, close)

static void buckets_json(jw *w, const vmm_avl *n, int *first) {
  if (!n) return;
  buckets_json(w, n->left, first);
  const vmm_bucket *b = vmm_container_of(n, vmm_bucket, node);
  printf_(w, "%s{\"size\":%zu,\"count\":%zu}", *first ? "" : ",", b->size, b->count);
  *first = 0;
  buckets_json(w, n->right, first);
}


static const char *state_json(vmm_mapping_state s) {
  static const char *const names[] = {"live", "pooled", "freeing", "deferred", "abandoned", "paused", "moving"};
  return names[s];
}

static void settings_json(jw *w, const vmm_arena *a, const vmm_snapshot *s) {
  static const char *const retain_modes[] = {"auto", "on", "off"};
  printf_(w, "{\"schema\":\"vmmarena.snapshot\",\"version\":4,\"device\":%d,\"integrated\":%s,\"caching\":%s,",
          s->device, s->integrated ? "true" : "false", a->cfg.caching ? "true" : "false");
  printf_(w, "\"retention\":{\"mode\":\"%s\",\"enabled\":%s},", retain_modes[a->cfg.retain],
          s->retention_enabled ? "true" : "false");
  printf_(w, "\"reuse\":{\"policy\":\"%s\",\"bound\":", vmm_reuse_policy_name(s->reuse));
  if (isfinite(s->reuse_bound)) printf_(w, "%g", s->reuse_bound);
  else puts_(w, "null"); /* JSON has no inf or nan */
  printf_(w, ",\"handle_bound_bytes\":%llu,\"package_assembly\":%s,\"refill_share\":%g,\"refill_live_share\":%g,",
          (unsigned long long)s->handle_bound_bytes, a->cfg.package_assembly ? "true" : "false", a->cfg.refill_share,
          a->cfg.refill_live_share);
  printf_(w, "\"grow_in_place\":%s},", vmm_grows_in_place(a) ? "true" : "false");
  kv_u64(w, "granularity", s->granularity, 0);
  kv_u64(w, "headroom_bytes", s->headroom_bytes, 1);
  kv_u64(w, "limit_bytes", s->limit_bytes, 1);
}

static void totals_json(jw *w, const vmm_snapshot *s) {
  puts_(w, ",\"totals\":");
  FIELDS_JSON(w, s, total_fields, true, true);
  puts_(w, ",\"kinds\":{\"package\":");
  FIELDS_JSON(w, &s->kind[VMM_KIND_PACKAGE], kind_fields, true, true);
  puts_(w, ",\"transient\":");
  FIELDS_JSON(w, &s->kind[VMM_KIND_TRANSIENT], kind_fields, true, true);
  puts_(w, "}");
}

static const field reuse_fields[] = {
    FIELD(vmm_snapshot, retained_reusable_handles), FIELD(vmm_snapshot, retained_reusable_bytes),
    FIELD_AS("hits", vmm_snapshot, pool_hits),      FIELD_AS("misses", vmm_snapshot, pool_misses),
    FIELD_AS("fallbacks", vmm_snapshot, pool_fallbacks),
};

static const field assembly_fields[] = {
    FIELD(vmm_snapshot, assemblies), FIELD(vmm_snapshot, padded_assemblies), FIELD(vmm_snapshot, assembled_idle_handles),
    FIELD(vmm_snapshot, assembly_created_bytes), FIELD(vmm_snapshot, pooled_taken_apart),
    FIELD(vmm_snapshot, ranges_handed_to_retiring), FIELD(vmm_snapshot, retiring_ranges), FIELD(vmm_snapshot, prefix_hits),
    FIELD(vmm_snapshot, retiring_bytes), FIELD(vmm_snapshot, revived_ranges), FIELD(vmm_snapshot, revived_runs),
    FIELD(vmm_snapshot, refills),
    FIELD(vmm_snapshot, run_hits), FIELD(vmm_snapshot, unmapped_in_background), FIELD(vmm_snapshot, grown_in_place),
};

static const field usage_fields[] = {
    FIELD(vmm_usage, allocated_bytes), FIELD(vmm_usage, allocated_peak_bytes), FIELD(vmm_usage, allocations),
    FIELD(vmm_usage, allocations_peak), FIELD(vmm_usage, cached_bytes),       FIELD(vmm_usage, refusals),
    FIELD(vmm_usage, cache_releases),  FIELD(vmm_usage, pages),              FIELD(vmm_usage, page_slots_used),
};

/* The figures of vmm_usage that the totals do not already give. */
static void usage_json(jw *w, const vmm_arena *a) {
  vmm_usage u;
  vmm_accounting_fill_usage(a, &u);
  puts_(w, ",\"usage\":");
  FIELDS_JSON(w, &u, usage_fields, true, true);
}

static void pool_json(jw *w, const vmm_arena *a, const vmm_snapshot *s) {
  puts_(w, ",\"pool\":");
  FIELDS_JSON(w, s, reuse_fields, true, false);
  kv_u64(w, "idle_handles", a->store.idle_count, 1);
  kv_u64(w, "idle_bytes", a->store.idle_bytes, 1);
  puts_(w, ",");
  FIELDS_JSON(w, s, assembly_fields, false, false);
  puts_(w, ",\"buckets\":[");
  int first = 1;
  buckets_json(w, a->store.pool.root, &first);
  puts_(w, "]}");
}

static void scope_json(jw *w, const vmm_arena *a, const vmm_snapshot *s) {
  puts_(w, ",\"refusals\":");
  FIELDS_JSON(w, s, refusal_fields, true, true);
  printf_(w, ",\"scope\":{\"state\":\"%s\",\"id\":%llu", s->scope_state == VMM_SCOPE_ACTIVE ? "active" : "none",
          (unsigned long long)(s->scope_state == VMM_SCOPE_ACTIVE ? a->scope_id : 0));
  kv_u64(w, "begun", s->scopes_begun, 1);
  kv_u64(w, "finished", s->scopes_finished, 1);
  kv_u64(w, "aborted", s->scopes_aborted, 1);
  puts_(w, "}");
}

static void tags_json(jw *w, const vmm_arena *a) {
  puts_(w, ",\"tags\":[");
  int first = 1;
  for (size_t t = 0; t < a->tag_cap; t++) {
    if (!a->tag_count[t] && !a->tag_bytes[t] && !a->tag_paused_count[t]) continue;
    puts_(w, first ? "{\"tag\":" : ",{\"tag\":");
    if (t == 0) puts_(w, "null");
    else str(w, vmm_tag_name((uint32_t)t));
    kv_u64(w, "count", a->tag_count[t], 1);
    kv_u64(w, "bytes", a->tag_bytes[t], 1);
    kv_u64(w, "paused_count", a->tag_paused_count[t], 1);
    kv_u64(w, "paused_bytes", a->tag_paused_bytes[t], 1);
    puts_(w, "}");
    first = 0;
  }
  puts_(w, "]");
}

static void driver_json(jw *w, const vmm_arena *a, const vmm_snapshot *s) {
  puts_(w, ",\"driver\":{");
  int first = 1;
  for (int e = 0; e < VMM_DRV_ENTRY_COUNT; e++) {
    if (!s->driver[e].calls) continue;
    printf_(w, "%s\"%s\":{\"calls\":%llu,\"failures\":%llu,\"ns\":%llu}", first ? "" : ",",
            vmm_driver_entry_name((vmm_driver_entry)e), (unsigned long long)s->driver[e].calls,
            (unsigned long long)s->driver[e].failures, (unsigned long long)s->driver[e].ns);
    first = 0;
  }
  puts_(w, "},\"fatal_error\":");
  if (s->fatal_status == VMM_OK) {
    puts_(w, "null");
  } else {
    printf_(w, "{\"status\":\"%s\",\"message\":", vmm_status_name(s->fatal_status));
    str(w, a->fatal_message);
    puts_(w, "}");
  }
  puts_(w, ",\"last_error\":");
  str(w, a->last_error);
}

/* The inventory, by base address; VMM_ERR_OUT_OF_MEMORY (and an empty list) when the host
 * has no memory to sort it. */
static vmm_status mappings_json(jw *w, const vmm_arena *a) {
  puts_(w, ",\"mappings\":[");
  vmm_mapping **list = a->table.count ? malloc(a->table.count * sizeof *list) : NULL;
  size_t n = 0;
  vmm_mapping *m;
  if (list) {
    vmm_table_foreach(&a->table, i, m) list[n++] = m;
    qsort(list, n, sizeof *list, vmm_mapping_by_base);
  }
  for (size_t i = 0; i < n; i++) {
    m = list[i];
    printf_(w, "%s{\"base\":\"0x%llx\",\"extent\":%zu,\"requested\":%zu,\"kind\":\"%s\",\"state\":\"%s\",\"handles\":%u,\"tag\":",
            i ? "," : "", (unsigned long long)m->base, m->extent, m->requested,
            m->kind == VMM_KIND_PACKAGE ? "package" : "transient", state_json(m->state), m->handle_count);
    if (m->tag) str(w, vmm_tag_name(m->tag));
    else puts_(w, "null");
    printf_(w, ",\"scope\":%llu,\"pool\":%llu,\"slot_size\":%zu}", (unsigned long long)m->scope_id,
            (unsigned long long)m->graph_pool, m->page ? m->page->set->key.slot_size : (size_t)0);
  }
  free(list);
  puts_(w, "]");
  return a->table.count && !list ? VMM_ERR_OUT_OF_MEMORY : VMM_OK;
}

vmm_status vmm_arena_snapshot_json(vmm_arena *a, char *buf, size_t cap, size_t *needed) {
  if (!a || (!buf && cap)) return VMM_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&a->lock);
  vmm_snapshot s;
  fill(a, &s);
  jw w = {buf, cap, 0};
  settings_json(&w, a, &s);
  totals_json(&w, &s);
  pool_json(&w, a, &s);
  usage_json(&w, a);
  scope_json(&w, a, &s);
  tags_json(&w, a);
  driver_json(&w, a, &s);
  vmm_status st = mappings_json(&w, a);
  puts_(&w, "}");
  put(&w, "", 1); /* the NUL */
  pthread_mutex_unlock(&a->lock);
  if (needed) *needed = w.len;
  if (w.len > cap) {
    if (cap) buf[cap - 1] = '\0';
    return VMM_ERR_INVALID_ARGUMENT;
  }
  return st;
}
