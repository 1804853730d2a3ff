/* json_min: a small strict JSON parser (RFC 8259) for the snapshot test (tests/test_snapshot.c).
 *
 * Strict means: one value per document, nothing but whitespace around it; no trailing commas,
 * comments, leading zeros, NaN or Infinity; strings must be valid UTF-8 (no overlong forms, no
 * encoded surrogates, nothing above U+10FFFF), control bytes must be escaped, \u escapes must
 * pair their surrogates; an object may not repeat a key. A failure reports the line and column
 * (1-based, columns in bytes) of the first offending byte. */
#ifndef VMMARENA_JSON_MIN_H
#define VMMARENA_JSON_MIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value json_value;

typedef struct json_member {
  char *key;           /* decoded, NUL-terminated (may also hold NUL bytes: see key_len) */
  size_t key_len;
  json_value *value;
  size_t line, column; /* where the key starts, 1-based */
} json_member;

struct json_value {
  json_type type;
  int boolean;          /* JSON_BOOL: 0 or 1 */
  double number;        /* JSON_NUMBER: the value as a double */
  char *text;           /* JSON_STRING: decoded, NUL-terminated; JSON_NUMBER: the literal as written */
  size_t len;           /* bytes of text, without the terminating NUL */
  size_t count;         /* JSON_ARRAY: items; JSON_OBJECT: members */
  json_value **items;   /* JSON_ARRAY, in document order */
  json_member *members; /* JSON_OBJECT, in document order */
  size_t line, column;  /* where the value starts, 1-based */
};

typedef struct json_error {
  size_t line, column; /* 1-based position of the offending byte (or of the end of input) */
  char message[160];
} json_error;

/* Parses len bytes of text. Returns the root value (free it with json_free), or NULL with
 * err (if non-NULL) filled. */
json_value *json_parse(const char *text, size_t len, json_error *err);
void json_free(json_value *root);

/* The member of an object with this key, or NULL (also when obj is not an object). */
const json_value *json_member_get(const json_value *obj, const char *key);
/* The value at a path of keys and indexes from root: "pool.hits", "tags[0].bytes",
 * "kinds.package.live_count"; "" is root itself. NULL if any step is missing. */
const json_value *json_find(const json_value *root, const char *path);
/* The unsigned integer at path: 0 and *out set if it is a number written as decimal digits
 * only that fits 64 bits; -1 otherwise. */
int json_get_u64(const json_value *root, const char *path, uint64_t *out);
/* The decoded string at path (and its length, if len is non-NULL), or NULL. */
const char *json_get_string(const json_value *root, const char *path, size_t *len);
/* Unsigned integer value of v itself, as json_get_u64. */
int json_u64(const json_value *v, uint64_t *out);

/* Name of a type: "null", "boolean", "number", "string", "array", "object". */
const char *json_type_name(json_type t);

#ifdef __cplusplus
}
#endif
#endif
