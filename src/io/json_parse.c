/* json_parse.c - a strict recursive-descent JSON parser (RFC 8259) for the headers fleet reads
 * from files. Strict on purpose: a checkpoint header that is not exactly valid JSON is damaged,
 * and refusing it early gives a clearer message than a wrong tensor later. */
#include "io/json_parse.h"

#include "fleet/status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    const char *p, *end, *begin;
    int rc; /* first failure */
} parser;

static fl_json *fail_at(parser *ps, const char *what) {
    if (ps->rc == 0)
        ps->rc = fl_fail(FL_EFORMAT, "offset %zu: %s", (size_t)(ps->p - ps->begin), what);
    return NULL;
}

static fl_json *oom(parser *ps) {
    if (ps->rc == 0)
        ps->rc = fl_fail(FL_ENOMEM, "out of memory parsing JSON");
    return NULL;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses a string at ps->p (which is at '"') into a new NUL-terminated buffer. The decoded
 * text is never longer than the quoted source. */
static char *parse_string(parser *ps, size_t *len) {
    const char *start = ++ps->p;
    const char *q = start;
    while (q < ps->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= ps->end) {
        fail_at(ps, "unterminated string");
        return NULL;
    }
    char *out = malloc((size_t)(q - start) + 1);
    if (!out) {
        oom(ps);
        return NULL;
    }
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) {
            fail_at(ps, "control character in string");
            goto fail;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            ps->p++;
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) {
            fail_at(ps, "unterminated escape");
            goto fail;
        }
        char e = *ps->p++;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            int hi = ps->end - ps->p >= 4 ? hex4(ps->p) : -1;
            if (hi < 0) {
                fail_at(ps, "bad \\u escape");
                goto fail;
            }
            ps->p += 4;
            uint32_t cp = (uint32_t)hi;
            if (hi >= 0xD800 && hi <= 0xDBFF) {
                int lo = ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u'
                             ? hex4(ps->p + 2) : -1;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail_at(ps, "unpaired surrogate in \\u escape");
                    goto fail;
                }
                ps->p += 6;
                cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            } else if (hi >= 0xDC00 && hi <= 0xDFFF) {
                fail_at(ps, "unpaired surrogate in \\u escape");
                goto fail;
            }
            n += put_utf8(out + n, cp); /* at most 4 bytes for 6 or 12 source bytes */
            break;
        }
        default:
            fail_at(ps, "unknown escape");
            goto fail;
        }
    }
    ps->p++; /* the closing quote */
    out[n] = '\0';
    *len = n;
    return out;
fail:
    free(out);
    return NULL;
}

static fl_json *new_node(parser *ps, fl_json_type t) {
    fl_json *v = calloc(1, sizeof *v);
    if (!v)
        return oom(ps);
    v->type = t;
    return v;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static fl_json *parse_number(parser *ps) {
    const char *s = ps->p, *q = s;
    bool integral = true;
    if (q < ps->end && *q == '-')
        q++;
    if (q >= ps->end || !is_digit(*q))
        return fail_at(ps, "bad number");
    if (*q == '0' && q + 1 < ps->end && is_digit(q[1]))
        return fail_at(ps, "number with a leading zero");
    while (q < ps->end && is_digit(*q))
        q++;
    if (q < ps->end && *q == '.') {
        integral = false;
        q++;
        if (q >= ps->end || !is_digit(*q))
            return fail_at(ps, "bad number: no digit after '.'");
        while (q < ps->end && is_digit(*q))
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = false;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= ps->end || !is_digit(*q))
            return fail_at(ps, "bad number: no digit in exponent");
        while (q < ps->end && is_digit(*q))
            q++;
    }
    char buf[64];
    size_t n = (size_t)(q - s);
    if (n >= sizeof buf)
        return fail_at(ps, "number too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    fl_json *v = new_node(ps, FL_JSON_NUMBER);
    if (!v)
        return NULL;
    v->d = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        long long i = strtoll(buf, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->i = i;
        }
    }
    ps->p = q;
    return v;
}

static fl_json *parse_value(parser *ps, int depth);

/* Appends child (and key, for objects) to v; frees them on failure. */
static bool append(parser *ps, fl_json *v, fl_json *child, char *key) {
    fl_json **items = realloc(v->items, (size_t)(v->n + 1) * sizeof *items);
    if (items)
        v->items = items;
    char **keys = v->type == FL_JSON_OBJECT ? realloc(v->keys, (size_t)(v->n + 1) * sizeof *keys)
                                            : NULL;
    if (keys)
        v->keys = keys;
    if (!items || (v->type == FL_JSON_OBJECT && !keys)) {
        fl_json_free(child);
        free(key);
        oom(ps);
        return false;
    }
    v->items[v->n] = child;
    if (keys)
        v->keys[v->n] = key;
    v->n++;
    return true;
}

static fl_json *parse_container(parser *ps, int depth, bool object) {
    fl_json *v = new_node(ps, object ? FL_JSON_OBJECT : FL_JSON_ARRAY);
    if (!v)
        return NULL;
    char close = object ? '}' : ']';
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') {
                fail_at(ps, "expected a string key");
                goto fail;
            }
            size_t klen;
            key = parse_string(ps, &klen);
            if (!key)
                goto fail;
            if (strlen(key) != klen) {
                free(key);
                fail_at(ps, "NUL character in key");
                goto fail;
            }
            if (fl_json_get(v, key)) {
                free(key);
                fail_at(ps, "duplicate key");
                goto fail;
            }
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                free(key);
                fail_at(ps, "expected ':'");
                goto fail;
            }
            ps->p++;
        }
        fl_json *child = parse_value(ps, depth + 1);
        if (!child) {
            free(key);
            goto fail;
        }
        if (!append(ps, v, child, key))
            goto fail;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return v;
        }
        fail_at(ps, object ? "expected ',' or '}'" : "expected ',' or ']'");
        goto fail;
    }
fail:
    fl_json_free(v);
    return NULL;
}

static fl_json *parse_literal(parser *ps, const char *word, fl_json_type t, bool b) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return fail_at(ps, "unexpected character");
    ps->p += n;
    fl_json *v = new_node(ps, t);
    if (v)
        v->b = b;
    return v;
}

static fl_json *parse_value(parser *ps, int depth) {
    if (depth > MAX_DEPTH)
        return fail_at(ps, "nesting deeper than 64");
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail_at(ps, "unexpected end of text");
    switch (*ps->p) {
    case '{':
        return parse_container(ps, depth, true);
    case '[':
        return parse_container(ps, depth, false);
    case '"': {
        fl_json *v = new_node(ps, FL_JSON_STRING);
        if (!v)
            return NULL;
        v->s = parse_string(ps, &v->len);
        if (!v->s) {
            free(v);
            return NULL;
        }
        return v;
    }
    case 't':
        return parse_literal(ps, "true", FL_JSON_BOOL, true);
    case 'f':
        return parse_literal(ps, "false", FL_JSON_BOOL, false);
    case 'n':
        return parse_literal(ps, "null", FL_JSON_NULL, false);
    default:
        return parse_number(ps);
    }
}

fl_json *fl_json_parse(const char *text, size_t n) {
    parser ps = {.p = text, .end = text + n, .begin = text, .rc = 0};
    fl_json *v = parse_value(&ps, 0);
    if (!v)
        return NULL;
    skip_ws(&ps);
    if (ps.p != ps.end) {
        fl_json_free(v);
        return fail_at(&ps, "text after the JSON value");
    }
    return v;
}

void fl_json_free(fl_json *v) {
    if (!v)
        return;
    for (int i = 0; i < v->n; i++) {
        fl_json_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

const fl_json *fl_json_get(const fl_json *o, const char *key) {
    if (!o || o->type != FL_JSON_OBJECT)
        return NULL;
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0)
            return o->items[i];
    return NULL;
}
