/* json.c - JSON text in a growable buffer: escaping and numbers, for metrics and config.
 * Records are built in memory and written with one call, so a line in a metrics file is
 * either whole or absent. */
#include "io/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_json_buf_free(fl_json_buf *b) {
    free(b->p);
    *b = (fl_json_buf){0};
}

void fl_json_buf_reset(fl_json_buf *b) {
    b->len = 0;
    b->failed = false;
    if (b->p)
        b->p[0] = '\0';
}

/* Makes room for n more bytes plus the NUL; false (and b->failed) when it cannot. */
static bool reserve(fl_json_buf *b, size_t n) {
    if (b->failed)
        return false;
    if (n > (size_t)-1 / 2 - b->len - 1) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void fl_json_append(fl_json_buf *b, const char *s, size_t n) {
    if (!reserve(b, n))
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void fl_json_appendf(fl_json_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[128];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        fl_json_append(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void fl_json_string(fl_json_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    fl_json_append(b, "\"", 1);
    size_t run = 0; /* bytes s[i-run..i) that need no escape, appended in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            if (c >= 0x20) {
                run++;
                continue;
            }
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        fl_json_append(b, s + i - run, run);
        run = 0;
        fl_json_append(b, esc, elen);
    }
    fl_json_append(b, s + n - run, run);
    fl_json_append(b, "\"", 1);
}

void fl_json_number(fl_json_buf *b, double v) {
    if (!isfinite(v))
        fl_json_append(b, "null", 4);
    else
        fl_json_appendf(b, "%.17g", v);
}

void fl_json_shortest(char *buf, size_t cap, double v) {
    if (!isfinite(v)) {
        snprintf(buf, cap, "%s", isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}
