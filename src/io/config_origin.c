/* config_origin.c - fl_config_origin: the override or file line that set a key, so that checks
 * running after fl_config_load (the trainer's combinations of keys) can name the line too. It
 * re-reads the file rather than keeping lines around: it runs once, on the error path. */
#include "fleet/config.h"
#include "io/yaml_tree.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BYTES ((size_t)64 << 20)

/* Whether `path` names key or a section above it ("strategy" holds "strategy.dgc"). */
static bool covers(const char *path, size_t n, const char *key) {
    return strncmp(path, key, n) == 0 && (key[n] == '\0' || key[n] == '.');
}

/* Line of the last entry under mapping m (whose keys sit below prefix) that sets key; 0: none.
 * Recursion only follows prefixes of key, so it is no deeper than key has dots. */
static int find_line(const fl_yaml_node *m, const char *prefix, const char *key) {
    int line = 0;
    size_t np = strlen(prefix);
    for (size_t i = 0; i < m->n && 2 * i + 1 < m->nitems; i++) {
        const fl_yaml_node *k = m->items[2 * i], *v = m->items[2 * i + 1];
        char full[512];
        int len = snprintf(full, sizeof full, "%s%s%.*s", prefix, np ? "." : "", (int)k->len,
                           k->text);
        if (len < 0 || (size_t)len >= sizeof full || !covers(full, (size_t)len, key))
            continue;
        if (key[len] == '\0' || !v || v->kind != FL_YAML_MAPPING) {
            line = k->line;
        } else {
            int l = find_line(v, full, key);
            if (l)
                line = l;
        }
    }
    return line;
}

static int file_line(const char *path, const char *key) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char *text = NULL;
    size_t len = 0;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= 0 && (size_t)size <= MAX_BYTES && fseek(f, 0, SEEK_SET) == 0 &&
        (text = malloc((size_t)size + 1)))
        len = fread(text, 1, (size_t)size, f);
    fclose(f);
    fl_yaml_node *root = NULL;
    int line = 0;
    if (text && fl_yaml_tree_parse(text, len, path, true, &root) == 0 && root &&
        root->kind == FL_YAML_MAPPING)
        line = find_line(root, "", key);
    fl_yaml_tree_free(root);
    free(text);
    return line;
}

int fl_config_origin(const char *path, const char *const *overrides, int noverrides,
                     const char *key, char *buf, size_t cap) {
    if (cap)
        buf[0] = '\0';
    for (int i = noverrides - 1; i >= 0; i--) {
        const char *o = overrides[i], *eq = strchr(o, '=');
        if (!eq)
            continue;
        const char *b = o, *e = eq;
        while (b < e && isspace((unsigned char)*b))
            b++;
        while (e > b && isspace((unsigned char)e[-1]))
            e--;
        if (e > b && covers(b, (size_t)(e - b), key)) {
            snprintf(buf, cap, "-o %s", o);
            return 1;
        }
    }
    int line = path ? file_line(path, key) : 0;
    if (!line)
        return 0;
    snprintf(buf, cap, "%s:%d", path, line);
    return 1;
}
