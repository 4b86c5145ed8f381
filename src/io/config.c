/* config.c - fl_config_load checks a YAML file and "-o key=value" overrides against a schema of
 * dotted keys and writes the values into the caller's struct. Every refusal names the key and
 * where it came from; fl_config_load_lines also hands out the line of each key, so that later
 * checks can name it (config_origin.c). Showing the result (fl_config_print, fl_config_to_json) is
 * config_print.c's. Just over 600 lines: the loader's walk over the YAML tree, its overrides and
 * its value parsers share the per-key bookkeeping (set, file_line) that its messages quote. */
#include "fleet/config.h"

#include "fleet/status.h"
#include "io/json.h"
#include "io/yaml_tree.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Larger files are refused before parsing: a config is kilobytes, and this keeps a path such
 * as /dev/zero from eating memory. */
#define MAX_FILE_BYTES ((size_t)64 << 20)
/* Keys longer than this get no did-you-mean (the edit distance table is fixed-size). */
#define SUGGEST_MAX_LEN 256
#define CLIP_CAP 96

typedef struct {
    const fl_cfg_key *schema;
    int nkeys;
    char *out;            /* the caller's struct */
    bool *set;            /* (nkeys) set by the file or an override */
    int *file_line;       /* (nkeys) line where the file set the key; 0: it did not */
    const char *path;     /* the config file, or NULL */
    const char *override; /* the override being applied, or NULL while in the file */
} loader;

/* Copies at most ~80 bytes of s[0..n) into buf for a message: control bytes as \xNN, "..."
 * when cut (never inside a UTF-8 sequence). */
static const char *clip(const char *s, size_t n, char buf[CLIP_CAP]) {
    size_t o = 0, i = 0;
    for (; i < n && o + 8 < CLIP_CAP; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, CLIP_CAP - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    if (i < n) {
        while (o > 0 && ((unsigned char)buf[o - 1] & 0xc0) == 0x80)
            o--;
        if (o > 0 && (unsigned char)buf[o - 1] >= 0xc0)
            o--;
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* Fails with FL_ECONFIG and "origin: message", origin being "file.yaml:LINE" or "-o TEXT". */
static int fail_at(const loader *ld, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(const loader *ld, int line, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ld->override) {
        char c[CLIP_CAP];
        return fl_fail(FL_ECONFIG, "-o %s: %s", clip(ld->override, strlen(ld->override), c), msg);
    }
    return fl_fail(FL_ECONFIG, "%s:%d: %s", ld->path, line, msg);
}

/* "'text'" for a scalar, "a mapping" / "a sequence" otherwise: what a value turned out to be. */
static const char *describe(const fl_yaml_node *v, char buf[CLIP_CAP + 2]) {
    if (v->kind != FL_YAML_SCALAR)
        return fl_yaml_kind_name(v->kind);
    char c[CLIP_CAP];
    snprintf(buf, CLIP_CAP + 2, "'%s'", clip(v->text, v->len, c));
    return buf;
}

static int find_key(const loader *ld, const char *full) {
    for (int k = 0; k < ld->nkeys; k++)
        if (strcmp(ld->schema[k].path, full) == 0)
            return k;
    return -1;
}

/* The first key inside section full ("optimizer" → "optimizer.type"), or -1: not a section. */
static int section_child(const loader *ld, const char *full, size_t len) {
    for (int k = 0; k < ld->nkeys; k++) {
        const char *p = ld->schema[k].path;
        if (strncmp(p, full, len) == 0 && p[len] == '.')
            return k;
    }
    return -1;
}

/* Optimal string alignment distance (Levenshtein plus adjacent transpositions); both strings
 * at most SUGGEST_MAX_LEN bytes. */
static int edit_distance(const char *a, size_t m, const char *b, size_t n) {
    int rows[3][SUGGEST_MAX_LEN + 1];
    int *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= n; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= m; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= n; j++) {
            int cost = a[i - 1] != b[j - 1];
            int d = prev[j] + 1;
            if (cur[j - 1] + 1 < d)
                d = cur[j - 1] + 1;
            if (prev[j - 1] + cost < d)
                d = prev[j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < d)
                d = pp[j - 2] + 1;
            cur[j] = d;
        }
        int *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[n];
}

/* The schema path or section closest to an unknown key, if close enough to be a likely typo
 * (at most 3 edits, and at most a third of its length): writes its length to *len. */
static const char *suggest(const loader *ld, const char *full, size_t *len) {
    size_t m = strlen(full);
    const char *best = NULL;
    int best_d = 4;
    if (m > SUGGEST_MAX_LEN)
        return NULL;
    for (int k = 0; k < ld->nkeys; k++) {
        const char *p = ld->schema[k].path;
        /* Every section prefix of the path, then the whole path. */
        for (const char *dot = p;; dot++) {
            if (*dot != '.' && *dot != '\0')
                continue;
            size_t n = (size_t)(dot - p);
            if (n <= SUGGEST_MAX_LEN && (n > m ? n - m : m - n) < (size_t)best_d) {
                int d = edit_distance(full, m, p, n);
                if (d < best_d && (size_t)d * 3 <= n) {
                    best = p;
                    best_d = d;
                    *len = n;
                }
            }
            if (*dot == '\0')
                break;
        }
    }
    return best;
}

static int unknown_key(const loader *ld, const char *full, int line) {
    char c[CLIP_CAP];
    size_t n = 0;
    const char *near = suggest(ld, full, &n);
    if (near)
        return fail_at(ld, line, "unknown key '%s' (did you mean '%.*s'?)",
                       clip(full, strlen(full), c), (int)n, near);
    return fail_at(ld, line, "unknown key '%s'", clip(full, strlen(full), c));
}

/* --- scalars --- */

static bool parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    for (int i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return true;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return true;
        }
    }
    return false;
}

/* 0, -1: not an integer, -2: beyond int64. Decimal only, no surrounding blanks. */
static int parse_int(const char *s, int64_t *out) {
    if (!*s || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end)
        return -1;
    if (errno == ERANGE)
        return -2;
    *out = (int64_t)v;
    return 0;
}

/* 0, -1: not a number, -2: not finite (inf, nan, 1e999). Decimal only, no surrounding blanks. */
static int parse_double(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s) || strpbrk(s, "xX"))
        return -1;
    char *end;
    double v = strtod(s, &end);
    if (*end)
        return -1;
    if (!isfinite(v))
        return -2;
    *out = v;
    return 0;
}

static bool has_range(const fl_cfg_key *k) {
    return k->min <= k->max && !(k->min == 0 && k->max == 0);
}

/* Index of text in choices "a|b|c", or -1. */
static int choice_index(const char *choices, const char *text, size_t len) {
    int i = 0;
    for (const char *p = choices;; i++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && memcmp(p, text, n) == 0)
            return i;
        if (!bar)
            return -1;
        p = bar + 1;
    }
}

static const char *expected(fl_cfg_type t) {
    switch (t) {
    case FL_CFG_BOOL: return "true or false";
    case FL_CFG_INT: return "an integer";
    case FL_CFG_DOUBLE: return "a number";
    case FL_CFG_STRING: return "a string";
    case FL_CFG_ENUM: return "one of the choices";
    case FL_CFG_INT_LIST: return "a list of integers";
    case FL_CFG_DOUBLE_LIST: return "a list of numbers";
    }
    return "a value";
}

/* Parses one number (an INT or DOUBLE key, or one element of a list) from scalar v and checks
 * the key's range. name is the key, or "key[i]" for a list element. */
static int parse_number(const loader *ld, const fl_cfg_key *key, const char *name,
                        const fl_yaml_node *v, int line, bool is_int, int64_t *iv, double *dv) {
    char c[CLIP_CAP + 2];
    if (fl_yaml_is_null(v))
        return fail_at(ld, line, "%s: has no value", name);
    if (v->kind != FL_YAML_SCALAR)
        return fail_at(ld, line, "%s: expected %s, got %s", name,
                       is_int ? "an integer" : "a number", describe(v, c));
    double x;
    int r;
    if (is_int) {
        r = parse_int(v->text, iv);
        x = (double)*iv;
    } else {
        r = parse_double(v->text, dv);
        x = *dv;
    }
    if (r == -1 || strlen(v->text) != v->len)
        return fail_at(ld, line, "%s: expected %s, got %s", name,
                       is_int ? "an integer" : "a number", describe(v, c));
    if (r == -2)
        return fail_at(ld, line, "%s: %s is %s", name, describe(v, c),
                       is_int ? "beyond the 64-bit integer range" : "not a finite number");
    if (has_range(key) && !(x >= key->min && x <= key->max)) {
        char lo[40], hi[40], t[CLIP_CAP];
        fl_json_shortest(lo, sizeof lo, key->min);
        fl_json_shortest(hi, sizeof hi, key->max);
        return fail_at(ld, line, "%s: %s is out of range [%s, %s]", name, clip(v->text, v->len, t),
                       lo, hi);
    }
    return FL_OK;
}

/* Checks value v for schema key k and writes it into the struct. line: the key's line. */
static int set_value(loader *ld, int k, const fl_yaml_node *v, int line) {
    const fl_cfg_key *key = &ld->schema[k];
    char *dst = ld->out + key->offset;
    char c[CLIP_CAP + 2];
    bool is_list = key->type == FL_CFG_INT_LIST || key->type == FL_CFG_DOUBLE_LIST;

    if (!ld->override) {
        if (ld->file_line[k])
            return fail_at(ld, line, "duplicate key '%s' (first set at line %d)", key->path,
                           ld->file_line[k]);
        ld->file_line[k] = line;
    }
    if (fl_yaml_is_null(v))
        return fail_at(ld, line, "%s: has no value", key->path);
    if (v->kind == FL_YAML_MAPPING)
        return fail_at(ld, line, "%s: expected %s, got a mapping ('%s' is a value, not a section)",
                       key->path, expected(key->type), key->path);
    if (v->kind == FL_YAML_SEQUENCE && !is_list)
        return fail_at(ld, line, "%s: expected %s, got a sequence", key->path, expected(key->type));
    if (v->kind == FL_YAML_SCALAR && strlen(v->text) != v->len)
        return fail_at(ld, line, "%s: the value contains a NUL character", key->path);

    switch (key->type) {
    case FL_CFG_BOOL: {
        bool b;
        if (!parse_bool(v->text, &b))
            return fail_at(ld, line, "%s: expected true or false, got %s", key->path,
                           describe(v, c));
        *(bool *)dst = b;
        break;
    }
    case FL_CFG_INT:
    case FL_CFG_DOUBLE: {
        int64_t i = 0;
        double d = 0;
        bool is_int = key->type == FL_CFG_INT;
        FL_TRY(parse_number(ld, key, key->path, v, line, is_int, &i, &d));
        if (is_int)
            memcpy(dst, &i, sizeof i);
        else
            memcpy(dst, &d, sizeof d);
        break;
    }
    case FL_CFG_STRING:
        if (v->len >= key->size)
            return fail_at(ld, line, "%s: %s is %zu bytes long, more than the %zu allowed",
                           key->path, describe(v, c), v->len, key->size - 1);
        memcpy(dst, v->text, v->len + 1);
        break;
    case FL_CFG_ENUM: {
        int idx = choice_index(key->choices, v->text, v->len);
        if (idx < 0) {
            char shown[512]; /* "a|b|c" as "a, b, c" */
            size_t o = 0;
            for (const char *p = key->choices; *p && o + 3 < sizeof shown; p++) {
                if (*p == '|') {
                    shown[o++] = ',';
                    shown[o++] = ' ';
                } else {
                    shown[o++] = *p;
                }
            }
            shown[o] = '\0';
            return fail_at(ld, line, "%s: %s is not one of %s", key->path, describe(v, c), shown);
        }
        *(int *)dst = idx;
        break;
    }
    case FL_CFG_INT_LIST:
    case FL_CFG_DOUBLE_LIST: {
        /* A single scalar is a list of one. */
        size_t n = v->kind == FL_YAML_SEQUENCE ? v->n : 1;
        bool is_int = key->type == FL_CFG_INT_LIST;
        if (n > FL_CFG_LIST_MAX)
            return fail_at(ld, line, "%s: the list has %zu elements, more than the %d allowed",
                           key->path, n, FL_CFG_LIST_MAX);
        fl_cfg_int_list il = {.n = (int)n};
        fl_cfg_double_list dl = {.n = (int)n};
        for (size_t i = 0; i < n; i++) {
            const fl_yaml_node *e = v->kind == FL_YAML_SEQUENCE ? v->items[i] : v;
            char name[320];
            if (v->kind == FL_YAML_SEQUENCE)
                snprintf(name, sizeof name, "%s[%zu]", key->path, i);
            else
                snprintf(name, sizeof name, "%s", key->path);
            FL_TRY(parse_number(ld, key, name, e, line, is_int, &il.v[i], &dl.v[i]));
        }
        if (is_int)
            memcpy(dst, &il, sizeof il);
        else
            memcpy(dst, &dl, sizeof dl);
        break;
    }
    }
    ld->set[k] = true;
    return FL_OK;
}

/* --- walking the tree --- */

static int walk_mapping(loader *ld, const char *prefix, const fl_yaml_node *map);

/* Applies one "key: value" pair found in the mapping of section prefix ("" at the top). A key
 * may itself be dotted ("optimizer.momentum: 0.9" at the top level works). */
static int apply_pair(loader *ld, const char *prefix, const fl_yaml_node *k,
                      const fl_yaml_node *v) {
    int rc = FL_OK;
    char c[CLIP_CAP], d[CLIP_CAP + 2];
    size_t plen = strlen(prefix);
    char *full = NULL;

    if (k->len == 0 || strlen(k->text) != k->len) {
        rc = fail_at(ld, k->line, "an empty key or a key with a NUL character in %s%s",
                     plen ? "section " : "the top level", prefix);
        goto fail;
    }
    full = malloc(plen + 1 + k->len + 1);
    if (!full) {
        rc = fl_fail(FL_ENOMEM, "out of memory reading the config");
        goto fail;
    }
    if (plen)
        snprintf(full, plen + 1 + k->len + 1, "%s.%s", prefix, k->text);
    else
        memcpy(full, k->text, k->len + 1);

    int idx = find_key(ld, full);
    if (idx >= 0) {
        rc = set_value(ld, idx, v, k->line);
        goto fail;
    }
    int child = section_child(ld, full, strlen(full));
    if (child < 0) {
        rc = unknown_key(ld, full, k->line);
        goto fail;
    }
    if (v && v->kind == FL_YAML_MAPPING) {
        rc = walk_mapping(ld, full, v);
    } else if (!(fl_yaml_is_null(v) && !ld->override)) {
        /* A section left empty in a file ("optimizer:" with its keys commented out) is fine. */
        rc = fail_at(ld, k->line, "'%s' is a section (with keys such as '%s'), not a value; got %s",
                     clip(full, strlen(full), c), ld->schema[child].path,
                     v ? describe(v, d) : "nothing");
    }
fail:
    free(full);
    return rc;
}

static int walk_mapping(loader *ld, const char *prefix, const fl_yaml_node *map) {
    for (size_t i = 0; i < map->n; i++) {
        const fl_yaml_node *k = map->items[2 * i];
        /* Earlier keys here were all valid and distinct (or we would have stopped), so this
         * scan stays short however many keys the mapping holds. */
        for (size_t j = 0; j < i; j++) {
            const fl_yaml_node *prev = map->items[2 * j];
            if (prev->len == k->len && memcmp(prev->text, k->text, k->len) == 0) {
                char c[CLIP_CAP];
                if (ld->override)
                    return fail_at(ld, k->line, "duplicate key '%s%s%s'", prefix,
                                   *prefix ? "." : "", clip(k->text, k->len, c));
                return fail_at(ld, k->line, "duplicate key '%s%s%s' (first at line %d)", prefix,
                               *prefix ? "." : "", clip(k->text, k->len, c), prev->line);
            }
        }
        FL_TRY(apply_pair(ld, prefix, k, map->items[2 * i + 1]));
    }
    return FL_OK;
}

static int read_file(const char *path, char **text, size_t *len) {
    int rc = FL_OK;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "cannot open config file '%s': %s", path, strerror(errno));
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) {
                rc = fl_fail(FL_ECONFIG, "%s: larger than %zu MiB; not a config file?", path,
                             MAX_FILE_BYTES >> 20);
                goto fail;
            }
            cap = cap ? 2 * cap : 4096;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                rc = fl_fail(FL_ENOMEM, "out of memory reading '%s'", path);
                goto fail;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        rc = fl_fail(FL_EIO, "cannot read config file '%s': %s", path, strerror(errno));
        goto fail;
    }
    fclose(f);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return FL_OK;
fail:
    fclose(f);
    free(buf);
    return rc;
}

static int load_file(loader *ld, const char *path) {
    char *text = NULL;
    size_t len = 0;
    fl_yaml_node *root = NULL;
    int rc = read_file(path, &text, &len);
    if (rc < 0)
        goto fail;
    rc = fl_yaml_tree_parse(text, len, path, true, &root);
    if (rc < 0)
        goto fail;
    if (fl_yaml_is_null(root)) /* empty file, only comments, or "---": no keys */
        goto fail;
    if (root->kind != FL_YAML_MAPPING) {
        char d[CLIP_CAP + 2];
        rc = fl_fail(FL_ECONFIG, "%s:%d: the top level must be a mapping of keys, got %s", path,
                     root->line, describe(root, d));
        goto fail;
    }
    rc = walk_mapping(ld, "", root);
fail:
    fl_yaml_tree_free(root);
    free(text);
    return rc;
}

/* "a.b.c=value": the value is parsed as YAML and applied as if the file had said
 * "a.b.c: value" at its top level (so "-o optimizer={type: sgd}" sets a section's keys). */
static int apply_override(loader *ld, const char *text) {
    int rc = FL_OK;
    char c[CLIP_CAP];
    fl_yaml_node *value = NULL;
    fl_yaml_node key = {.kind = FL_YAML_SCALAR, .line = 1, .plain = true};
    const char *eq = strchr(text, '=');
    if (!eq)
        return fl_fail(FL_ECONFIG, "-o %s: expected key=value", clip(text, strlen(text), c));
    const char *b = text, *e = eq;
    while (b < e && isspace((unsigned char)*b))
        b++;
    while (e > b && isspace((unsigned char)e[-1]))
        e--;
    if (b == e)
        return fl_fail(FL_ECONFIG, "-o %s: empty key (expected key=value)",
                       clip(text, strlen(text), c));

    char origin[CLIP_CAP + 4];
    snprintf(origin, sizeof origin, "-o %s", clip(text, strlen(text), c));
    rc = fl_yaml_tree_parse(eq + 1, strlen(eq + 1), origin, false, &value);
    if (rc < 0)
        goto fail;
    key.len = (size_t)(e - b);
    key.text = malloc(key.len + 1);
    if (!key.text) {
        rc = fl_fail(FL_ENOMEM, "out of memory reading overrides");
        goto fail;
    }
    memcpy(key.text, b, key.len);
    key.text[key.len] = '\0';
    ld->override = text;
    rc = apply_pair(ld, "", &key, value);
    ld->override = NULL;
fail:
    free(key.text);
    fl_yaml_tree_free(value);
    return rc;
}

int fl_config_load(const char *path, const char *const *overrides, int noverrides,
                   const fl_cfg_key *schema, int nkeys, void *out, bool *was_set) {
    return fl_config_load_lines(path, overrides, noverrides, schema, nkeys, out, was_set, NULL);
}

int fl_config_load_lines(const char *path, const char *const *overrides, int noverrides,
                         const fl_cfg_key *schema, int nkeys, void *out, bool *was_set,
                         int *line) {
    FL_ASSERT(nkeys >= 0 && (schema || nkeys == 0) && out);
    FL_ASSERT(noverrides >= 0 && (overrides || noverrides == 0));
    for (int k = 0; k < nkeys; k++) {
        FL_ASSERT(schema[k].path && schema[k].path[0]);
        FL_ASSERT(schema[k].type != FL_CFG_ENUM || schema[k].choices);
        FL_ASSERT(schema[k].type != FL_CFG_STRING || schema[k].size > 0);
    }
    int rc = FL_OK;
    loader ld = {.schema = schema, .nkeys = nkeys, .out = out, .path = path};
    ld.set = calloc((size_t)nkeys + 1, sizeof *ld.set);
    ld.file_line = calloc((size_t)nkeys + 1, sizeof *ld.file_line);
    if (!ld.set || !ld.file_line) {
        rc = fl_fail(FL_ENOMEM, "out of memory loading the config");
        goto fail;
    }
    if (path) {
        rc = load_file(&ld, path);
        if (rc < 0)
            goto fail;
    }
    for (int i = 0; i < noverrides; i++) {
        FL_ASSERT(overrides[i]);
        rc = apply_override(&ld, overrides[i]);
        if (rc < 0)
            goto fail;
    }
    for (int k = 0; k < nkeys; k++) {
        if (!schema[k].required || ld.set[k])
            continue;
        if (path)
            rc = fl_fail(FL_ECONFIG, "%s: missing required key '%s'", path, schema[k].path);
        else
            rc = fl_fail(FL_ECONFIG,
                         "missing required key '%s' (no config file; set it with -o %s=...)",
                         schema[k].path, schema[k].path);
        goto fail;
    }
fail:
    if (was_set && ld.set)
        memcpy(was_set, ld.set, (size_t)nkeys * sizeof *was_set);
    if (line && ld.file_line)
        memcpy(line, ld.file_line, (size_t)nkeys * sizeof *line);
    free(ld.set);
    free(ld.file_line);
    return rc;
}
