/* json.h - building JSON text in memory, shared by metrics.c (JSON lines) and config.c (the
 * effective configuration as JSON): a growable buffer, string escaping, number formatting.
 * Private to the library. */
#ifndef FLEET_IO_JSON_H
#define FLEET_IO_JSON_H

#include <stdbool.h>
#include <stddef.h>

/* A growable, always NUL-terminated text buffer. Zero-initialise it; an allocation failure
 * sets `failed`, after which appends are ignored (callers check once, at the end). */
typedef struct {
    char  *p;
    size_t len;
    size_t cap;
    bool   failed;
} fl_json_buf;

void fl_json_buf_free(fl_json_buf *b);
void fl_json_buf_reset(fl_json_buf *b); /* empties b, keeps its memory */
void fl_json_append(fl_json_buf *b, const char *s, size_t n);
void fl_json_appendf(fl_json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends s[0..n) as a quoted JSON string: '"' and '\\' escaped, control characters as
 * \n, \t, ... or \u00XX; other bytes (UTF-8) as they are. */
void fl_json_string(fl_json_buf *b, const char *s, size_t n);

/* Appends v with 17 significant digits (reads back exactly); NaN and infinities as null. */
void fl_json_number(fl_json_buf *b, double v);

/* Writes into buf the shortest "%.Ng" text of finite v that strtod reads back as v exactly
 * ("0.1", not "0.10000000000000001"); integral values below 1e15 without exponent. */
void fl_json_shortest(char *buf, size_t cap, double v);

#endif /* FLEET_IO_JSON_H */
