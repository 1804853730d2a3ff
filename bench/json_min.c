/* json_min: a small strict JSON parser; see json_min.h for what "strict" covers. */
#include "json_min.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 512

typedef struct parser {
  const unsigned char *text;
  size_t len, pos;
  size_t line, line_start; /* newlines occur only in whitespace, so skip_ws keeps these */
  int depth;
  json_error *err;
  int failed;
} parser;

/* Records the first error, at a line and column. */
static void fail_line_col(parser *p, size_t line, size_t column, const char *fmt, va_list ap) {
  if (p->failed) return;
  p->failed = 1;
  if (!p->err) return;
  p->err->line = line;
  p->err->column = column;
  vsnprintf(p->err->message, sizeof p->err->message, fmt, ap);
}

/* Records the first error, at byte offset `at` of the current line. */
static void fail_at(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(parser *p, size_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_line_col(p, p->line, at - p->line_start + 1, fmt, ap);
  va_end(ap);
}

/* Records the first error at the key of member m (an earlier line, perhaps). */
static void fail_at_key(parser *p, const json_member *m, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at_key(parser *p, const json_member *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_line_col(p, m->line, m->column, fmt, ap);
  va_end(ap);
}

/* "'x'", "byte 0x01" or "end of input", for messages. */
static const char *describe(const parser *p, size_t at, char buf[24]) {
  if (at >= p->len) return "end of input";
  unsigned char c = p->text[at];
  if (c > 0x20 && c < 0x7f) snprintf(buf, 24, "'%c'", c);
  else snprintf(buf, 24, "byte 0x%02x", c);
  return buf;
}

static void skip_ws(parser *p) {
  while (p->pos < p->len) {
    unsigned char c = p->text[p->pos];
    if (c == '\n') {
      p->line++;
      p->line_start = p->pos + 1;
    } else if (c != ' ' && c != '\t' && c != '\r') {
      return;
    }
    p->pos++;
  }
}

static json_value *new_value(parser *p, json_type type) {
  json_value *v = calloc(1, sizeof *v);
  if (!v) {
    fail_at(p, p->pos, "out of memory");
    return NULL;
  }
  v->type = type;
  v->line = p->line;
  v->column = p->pos - p->line_start + 1;
  return v;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 if it is not one: overlong
 * forms, encoded surrogates and code points above U+10FFFF are invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
  unsigned char c = s[0];
  size_t len;
  uint32_t cp, min;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1fu, min = 0x80;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0fu, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07u, min = 0x10000;
  else return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

static size_t utf8_encode(uint32_t cp, char *out) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | cp >> 12);
    out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | cp >> 18);
  out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
  out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
  out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* Four hex digits at `at`; -1 if they are not. */
static long hex4(const parser *p, size_t at) {
  if (at + 4 > p->len) return -1;
  long v = 0;
  for (size_t i = at; i < at + 4; i++) {
    unsigned char c = p->text[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

/* Parses the string whose opening quote is at p->pos into a fresh NUL-terminated buffer. */
static char *parse_string(parser *p, size_t *out_len) {
  size_t start = ++p->pos, end = start;
  while (end < p->len && p->text[end] != '"') end += p->text[end] == '\\' ? 2 : 1;
  if (end >= p->len) {
    fail_at(p, p->len, "unterminated string (opened at column %zu)", start - p->line_start);
    return NULL;
  }
  char *out = malloc(end - start + 1);
  if (!out) {
    fail_at(p, start, "out of memory");
    return NULL;
  }
  size_t n = 0, i = start;
  while (i < end) {
    unsigned char c = p->text[i];
    char buf[24];
    if (c < 0x20) {
      fail_at(p, i, "unescaped control %s in a string", describe(p, i, buf));
      goto bad;
    }
    if (c != '\\') {
      size_t seq = utf8_sequence(p->text + i, end - i);
      if (!seq) {
        fail_at(p, i, "invalid UTF-8 (%s) in a string", describe(p, i, buf));
        goto bad;
      }
      memcpy(out + n, p->text + i, seq);
      n += seq;
      i += seq;
      continue;
    }
    unsigned char e = p->text[i + 1];
    static const char plain_from[] = "\"\\/bfnrt", plain_to[] = "\"\\/\b\f\n\r\t";
    const char *hit = e ? strchr(plain_from, e) : NULL;
    if (hit) {
      out[n++] = plain_to[hit - plain_from];
      i += 2;
      continue;
    }
    if (e != 'u') {
      fail_at(p, i, "bad escape \\%c in a string (valid: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
              e > 0x20 && e < 0x7f ? e : '?');
      goto bad;
    }
    long cp = hex4(p, i + 2);
    if (cp < 0) {
      fail_at(p, i, "\\u needs four hex digits");
      goto bad;
    }
    size_t used = 6;
    if (cp >= 0xdc00 && cp <= 0xdfff) {
      fail_at(p, i, "\\u%04lx is a low surrogate without a high one before it", cp);
      goto bad;
    }
    if (cp >= 0xd800 && cp <= 0xdbff) {
      long lo = i + 12 <= end && p->text[i + 6] == '\\' && p->text[i + 7] == 'u' ? hex4(p, i + 8) : -1;
      if (lo < 0xdc00 || lo > 0xdfff) {
        fail_at(p, i, "\\u%04lx is a high surrogate without a low one after it", cp);
        goto bad;
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      used = 12;
    }
    n += utf8_encode((uint32_t)cp, out + n);
    i += used;
  }
  out[n] = '\0';
  p->pos = end + 1;
  *out_len = n;
  return out;
bad:
  free(out);
  return NULL;
}

static size_t digits(const parser *p, size_t at) {
  size_t n = 0;
  while (at + n < p->len && p->text[at + n] >= '0' && p->text[at + n] <= '9') n++;
  return n;
}

static json_value *parse_number(parser *p) {
  size_t start = p->pos, i = start;
  char buf[24];
  if (i < p->len && p->text[i] == '-') i++;
  size_t whole = digits(p, i);
  if (whole == 0) {
    fail_at(p, i, "expected a digit, found %s", describe(p, i, buf));
    return NULL;
  }
  if (whole > 1 && p->text[i] == '0') {
    fail_at(p, i, "leading zero in a number");
    return NULL;
  }
  i += whole;
  if (i < p->len && p->text[i] == '.') {
    size_t frac = digits(p, ++i);
    if (!frac) {
      fail_at(p, i, "expected a digit after the decimal point, found %s", describe(p, i, buf));
      return NULL;
    }
    i += frac;
  }
  if (i < p->len && (p->text[i] == 'e' || p->text[i] == 'E')) {
    i++;
    if (i < p->len && (p->text[i] == '+' || p->text[i] == '-')) i++;
    size_t exp = digits(p, i);
    if (!exp) {
      fail_at(p, i, "expected a digit in the exponent, found %s", describe(p, i, buf));
      return NULL;
    }
    i += exp;
  }
  json_value *v = new_value(p, JSON_NUMBER);
  if (!v) return NULL;
  v->len = i - start;
  v->text = malloc(v->len + 1);
  if (!v->text) {
    free(v);
    fail_at(p, start, "out of memory");
    return NULL;
  }
  memcpy(v->text, p->text + start, v->len);
  v->text[v->len] = '\0';
  v->number = strtod(v->text, NULL);
  p->pos = i;
  return v;
}

static json_value *parse_value(parser *p);

/* Grows *items (of `size`-byte elements) to hold one more than count. */
static int grow(void **items, size_t *cap, size_t count, size_t size) {
  if (count < *cap) return 0;
  size_t next = *cap ? *cap * 2 : 4;
  void *grown = realloc(*items, next * size);
  if (!grown) return -1;
  *items = grown;
  *cap = next;
  return 0;
}

static json_value *parse_array(parser *p) {
  json_value *v = new_value(p, JSON_ARRAY);
  if (!v) return NULL;
  size_t cap = 0;
  char buf[24];
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->text[p->pos] == ']') {
    p->pos++;
    return v;
  }
  for (;;) {
    json_value *item = parse_value(p);
    if (!item) break;
    if (grow((void **)&v->items, &cap, v->count, sizeof *v->items)) {
      json_free(item);
      fail_at(p, p->pos, "out of memory");
      break;
    }
    v->items[v->count++] = item;
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->text[p->pos] == ']') {
      p->pos++;
      return v;
    }
    fail_at(p, p->pos, "expected ',' or ']' after an array item, found %s", describe(p, p->pos, buf));
    break;
  }
  json_free(v);
  return NULL;
}

typedef struct key_ref {
  const json_member *m;
  size_t index;
} key_ref;

static int key_order(const void *x, const void *y) {
  const key_ref *a = x, *b = y;
  size_t n = a->m->key_len < b->m->key_len ? a->m->key_len : b->m->key_len;
  int c = memcmp(a->m->key, b->m->key, n);
  if (c) return c;
  if (a->m->key_len != b->m->key_len) return a->m->key_len < b->m->key_len ? -1 : 1;
  return a->index < b->index ? -1 : a->index > b->index;
}

/* The first member (in document order) whose key an earlier member already has, or NULL. */
static const json_member *first_duplicate(const json_value *obj, int *oom) {
  *oom = 0;
  if (obj->count < 2) return NULL;
  key_ref *refs = malloc(obj->count * sizeof *refs);
  if (!refs) {
    *oom = 1;
    return NULL;
  }
  for (size_t i = 0; i < obj->count; i++) refs[i] = (key_ref){&obj->members[i], i};
  qsort(refs, obj->count, sizeof *refs, key_order);
  size_t first = obj->count;
  for (size_t i = 1; i < obj->count; i++) {
    const json_member *a = refs[i - 1].m, *b = refs[i].m;
    if (a->key_len == b->key_len && !memcmp(a->key, b->key, a->key_len) && refs[i].index < first) first = refs[i].index;
  }
  free(refs);
  return first < obj->count ? &obj->members[first] : NULL;
}

static json_value *parse_object(parser *p) {
  json_value *v = new_value(p, JSON_OBJECT);
  if (!v) return NULL;
  size_t cap = 0;
  char buf[24];
  p->pos++;
  skip_ws(p);
  if (p->pos < p->len && p->text[p->pos] == '}') {
    p->pos++;
    return v;
  }
  for (;;) {
    skip_ws(p);
    if (p->pos >= p->len || p->text[p->pos] != '"') {
      fail_at(p, p->pos, "expected a string key, found %s", describe(p, p->pos, buf));
      break;
    }
    json_member m = {.line = p->line, .column = p->pos - p->line_start + 1};
    m.key = parse_string(p, &m.key_len);
    if (!m.key) break;
    skip_ws(p);
    if (p->pos >= p->len || p->text[p->pos] != ':') {
      fail_at(p, p->pos, "expected ':' after the key \"%.40s\", found %s", m.key, describe(p, p->pos, buf));
      free(m.key);
      break;
    }
    p->pos++;
    m.value = parse_value(p);
    if (!m.value || grow((void **)&v->members, &cap, v->count, sizeof *v->members)) {
      if (m.value) fail_at(p, p->pos, "out of memory");
      free(m.key);
      json_free(m.value);
      break;
    }
    v->members[v->count++] = m;
    skip_ws(p);
    if (p->pos < p->len && p->text[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->text[p->pos] == '}') {
      int oom;
      const json_member *dup = first_duplicate(v, &oom);
      if (!dup && !oom) {
        p->pos++;
        return v;
      }
      if (oom) fail_at(p, p->pos, "out of memory");
      else fail_at_key(p, dup, "duplicate key \"%.40s\" in an object", dup->key);
      break;
    }
    fail_at(p, p->pos, "expected ',' or '}' after an object member, found %s", describe(p, p->pos, buf));
    break;
  }
  json_free(v);
  return NULL;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->text + p->pos, word, n)) return 0;
  p->pos += n;
  return 1;
}

static json_value *parse_value(parser *p) {
  skip_ws(p);
  char buf[24];
  if (p->pos >= p->len) {
    fail_at(p, p->pos, "expected a value, found end of input");
    return NULL;
  }
  unsigned char c = p->text[p->pos];
  json_value *v = NULL;
  switch (c) {
  case '{':
  case '[':
    if (p->depth >= JSON_MAX_DEPTH) {
      fail_at(p, p->pos, "nesting deeper than %d", JSON_MAX_DEPTH);
      return NULL;
    }
    p->depth++;
    v = c == '{' ? parse_object(p) : parse_array(p);
    p->depth--;
    return v;
  case '"':
    if (!(v = new_value(p, JSON_STRING))) return NULL;
    if (!(v->text = parse_string(p, &v->len))) {
      free(v);
      return NULL;
    }
    return v;
  case 't':
  case 'f':
  case 'n':
    if (!(v = new_value(p, c == 'n' ? JSON_NULL : JSON_BOOL))) return NULL;
    if (literal(p, c == 't' ? "true" : c == 'f' ? "false" : "null")) {
      v->boolean = c == 't';
      return v;
    }
    free(v);
    break;
  default:
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
    break;
  }
  fail_at(p, p->pos, "expected a value, found %s", describe(p, p->pos, buf));
  return NULL;
}

json_value *json_parse(const char *text, size_t len, json_error *err) {
  parser p = {(const unsigned char *)text, len, 0, 1, 0, 0, err, 0};
  if (err) memset(err, 0, sizeof *err);
  if (!text && len) {
    fail_at(&p, 0, "NULL text");
    return NULL;
  }
  json_value *root = parse_value(&p);
  if (!root) return NULL;
  skip_ws(&p);
  if (p.pos < p.len) {
    char buf[24];
    fail_at(&p, p.pos, "unexpected %s after the document", describe(&p, p.pos, buf));
    json_free(root);
    return NULL;
  }
  return root;
}

void json_free(json_value *v) {
  if (!v) return;
  for (size_t i = 0; v->type == JSON_ARRAY && i < v->count; i++) json_free(v->items[i]);
  for (size_t i = 0; v->type == JSON_OBJECT && i < v->count; i++) {
    free(v->members[i].key);
    json_free(v->members[i].value);
  }
  free(v->items);
  free(v->members);
  free(v->text);
  free(v);
}

static const json_value *member_n(const json_value *obj, const char *key, size_t n) {
  if (!obj || obj->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->count; i++)
    if (obj->members[i].key_len == n && !memcmp(obj->members[i].key, key, n)) return obj->members[i].value;
  return NULL;
}

const json_value *json_member_get(const json_value *obj, const char *key) {
  return key ? member_n(obj, key, strlen(key)) : NULL;
}

const json_value *json_find(const json_value *v, const char *path) {
  if (!path) return NULL;
  const char *s = path;
  int need_key = *s != '[';
  while (v && *s) {
    if (*s == '[') {
      s++;
      size_t index = 0, n = 0;
      for (; s[n] >= '0' && s[n] <= '9'; n++) {
        if (index > (SIZE_MAX - 9) / 10) return NULL;
        index = index * 10 + (size_t)(s[n] - '0');
      }
      if (n == 0 || s[n] != ']') return NULL;
      s += n + 1;
      v = v->type == JSON_ARRAY && index < v->count ? v->items[index] : NULL;
      need_key = 0;
      continue;
    }
    if (!need_key) {
      if (*s != '.') return NULL;
      s++;
    }
    size_t n = strcspn(s, ".[");
    if (n == 0) return NULL;
    v = member_n(v, s, n);
    s += n;
    need_key = 0;
  }
  return v;
}

int json_u64(const json_value *v, uint64_t *out) {
  if (!v || v->type != JSON_NUMBER || v->len == 0) return -1;
  uint64_t x = 0;
  for (size_t i = 0; i < v->len; i++) {
    char c = v->text[i];
    if (c < '0' || c > '9') return -1;
    uint64_t d = (uint64_t)(c - '0');
    if (x > (UINT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  *out = x;
  return 0;
}

int json_get_u64(const json_value *root, const char *path, uint64_t *out) { return json_u64(json_find(root, path), out); }

const char *json_get_string(const json_value *root, const char *path, size_t *len) {
  const json_value *v = json_find(root, path);
  if (!v || v->type != JSON_STRING) return NULL;
  if (len) *len = v->len;
  return v->text;
}

const char *json_type_name(json_type t) {
  static const char *const names[] = {"null", "boolean", "number", "string", "array", "object"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}
