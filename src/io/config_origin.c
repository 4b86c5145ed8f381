/* config_origin.c - fl_config_origin: the override or file line that set a key, so that checks
 * running after fl_config_load_lines (the trainer's combinations of keys) can name the line
 * too. The file's lines are the loader's own (fl_config_load_lines keeps them); only the
 * overrides, short strings, are looked at again, on the error path. */
#include "fleet/config.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* Whether `path` names key or a section above it ("strategy" holds "strategy.dgc"). */
static bool covers(const char *path, size_t n, const char *key) {
    return strncmp(path, key, n) == 0 && (key[n] == '\0' || key[n] == '.');
}

int fl_config_origin(const char *path, int line, const char *const *overrides, int noverrides,
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
    if (!path || line <= 0)
        return 0;
    snprintf(buf, cap, "%s:%d", path, line);
    return 1;
}
