/* json_parse.h - a small strict JSON parser (RFC 8259) for headers read from files (the
 * safetensors header): a tree of values in one allocation-per-node arena, with the byte offset
 * of the first error. Private to the library. */
#ifndef FLEET_IO_JSON_PARSE_H
#define FLEET_IO_JSON_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    FL_JSON_NULL = 0,
    FL_JSON_BOOL,
    FL_JSON_NUMBER,
    FL_JSON_STRING,
    FL_JSON_ARRAY,
    FL_JSON_OBJECT,
} fl_json_type;

typedef struct fl_json fl_json;
struct fl_json {
    fl_json_type type;
    bool         b;
    bool         is_int;  /* a number written without fraction or exponent that fits int64 */
    int64_t      i;       /* when is_int */
    double       d;       /* numbers */
    char        *s;       /* strings (NUL-terminated, UTF-8; len excludes the NUL) */
    size_t       len;
    /* arrays and objects: n children; objects also have keys[i] */
    int          n;
    fl_json    **items;
    char       **keys;
};

/* Parses text[0..n) as exactly one JSON value (surrounding whitespace allowed). Strict: no
 * trailing commas, no comments, no leading zeros, no control characters in strings, escapes
 * and \u surrogate pairs checked, duplicate object keys refused, nesting at most 64 deep.
 * Returns the tree (free with fl_json_free), or NULL with FL_EFORMAT and "offset N: what" in
 * fl_errmsg (FL_ENOMEM when out of memory). */
fl_json *fl_json_parse(const char *text, size_t n);
void     fl_json_free(fl_json *v);
/* The member of object o named key, or NULL. */
const fl_json *fl_json_get(const fl_json *o, const char *key);

#endif /* FLEET_IO_JSON_PARSE_H */
