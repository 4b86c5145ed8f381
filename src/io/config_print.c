/* config_print.c - the effective configuration shown: fl_config_print writes YAML that
 * fl_config_load reads back to the same values (fleet-train --print-config, the copy in a
 * checkpoint), fl_config_to_json one JSON object of dotted keys. Both walk the schema in order
 * through one writer (put_value), so the two forms cannot drift apart. */
#include "fleet/config.h"

#include "io/json.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether s can be written as a plain YAML scalar that reads back as the same string. */
static bool plain_safe(const char *s, size_t n) {
    if (n == 0 || !(isalnum((unsigned char)s[0]) || s[0] == '_' || s[0] == '/'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_./+-", s[i]))
            return false;
    return !(strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0);
}

static void put_double(fl_json_buf *b, double v, bool json) {
    char t[40];
    if (!isfinite(v)) {
        if (json)
            fl_json_append(b, "null", 4);
        else
            fl_json_appendf(b, "%s", isnan(v) ? ".nan" : v > 0 ? ".inf" : "-.inf");
        return;
    }
    fl_json_shortest(t, sizeof t, v);
    fl_json_append(b, t, strlen(t));
}

static void put_value(fl_json_buf *b, const fl_cfg_key *key, const char *obj, bool json) {
    const char *src = obj + key->offset;
    const char *sep = json ? "," : ", ";
    switch (key->type) {
    case FL_CFG_BOOL: fl_json_appendf(b, "%s", *(const bool *)src ? "true" : "false"); break;
    case FL_CFG_INT: {
        int64_t v;
        memcpy(&v, src, sizeof v);
        fl_json_appendf(b, "%" PRId64, v);
        break;
    }
    case FL_CFG_DOUBLE: {
        double v;
        memcpy(&v, src, sizeof v);
        put_double(b, v, json);
        break;
    }
    case FL_CFG_STRING: {
        size_t n = strnlen(src, key->size);
        if (!json && n < key->size && plain_safe(src, n))
            fl_json_append(b, src, n);
        else
            fl_json_string(b, src, n); /* a JSON string is also a YAML double-quoted scalar */
        break;
    }
    case FL_CFG_ENUM: {
        int idx = *(const int *)src, i = 0;
        const char *p = key->choices;
        for (; i < idx && p; i++) {
            p = strchr(p, '|');
            if (p)
                p++;
        }
        if (idx < 0 || !p) { /* not a valid index: show the number */
            fl_json_appendf(b, "%d", idx);
            break;
        }
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (json)
            fl_json_string(b, p, n);
        else
            fl_json_append(b, p, n);
        break;
    }
    case FL_CFG_INT_LIST:
    case FL_CFG_DOUBLE_LIST: {
        fl_cfg_int_list il;
        fl_cfg_double_list dl;
        bool is_int = key->type == FL_CFG_INT_LIST;
        int n;
        if (is_int) {
            memcpy(&il, src, sizeof il);
            n = il.n;
        } else {
            memcpy(&dl, src, sizeof dl);
            n = dl.n;
        }
        n = n < 0 ? 0 : n > FL_CFG_LIST_MAX ? FL_CFG_LIST_MAX : n;
        fl_json_append(b, "[", 1);
        for (int i = 0; i < n; i++) {
            if (i)
                fl_json_appendf(b, "%s", sep);
            if (is_int)
                fl_json_appendf(b, "%" PRId64, il.v[i]);
            else
                put_double(b, dl.v[i], json);
        }
        fl_json_append(b, "]", 1);
        break;
    }
    }
}

void fl_config_print(const fl_cfg_key *schema, int nkeys, const void *obj, FILE *out) {
    fl_json_buf b = {0};
    for (int k = 0; k < nkeys; k++) {
        fl_json_buf_reset(&b);
        fl_json_appendf(&b, "%s: ", schema[k].path);
        put_value(&b, &schema[k], obj, false);
        fl_json_append(&b, "\n", 1);
        if (!b.failed)
            fwrite(b.p, 1, b.len, out);
    }
    fl_json_buf_free(&b);
}

size_t fl_config_to_json(const fl_cfg_key *schema, int nkeys, const void *obj, char *buf,
                         size_t cap) {
    fl_json_buf b = {0};
    fl_json_append(&b, "{", 1);
    for (int k = 0; k < nkeys; k++) {
        if (k)
            fl_json_append(&b, ",", 1);
        fl_json_string(&b, schema[k].path, strlen(schema[k].path));
        fl_json_append(&b, ":", 1);
        put_value(&b, &schema[k], obj, true);
    }
    fl_json_append(&b, "}", 1);
    size_t need = b.failed ? 0 : b.len;
    if (cap > 0) {
        size_t n = need < cap - 1 ? need : cap - 1;
        if (n)
            memcpy(buf, b.p, n);
        buf[n] = '\0';
    }
    fl_json_buf_free(&b);
    return need;
}
