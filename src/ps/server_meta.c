/* server_meta.c - a parameter server's checkpoint metadata as text (the layout is in
 * server_save.c): rules, initializers and sparse life cycles written with 17 significant
 * digits, so that they read back exactly, and read back with every field checked; integers.
 * Loading (server_load.c) and the offline reader (snapshot.c) parse what saving wrote. */
#include "server.h"

#include "fleet/status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_rule_fmt(const fl_ps_rule *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%d %d %.17g %.17g %.17g %.17g %.17g %.17g", (int)r->type,
             r->nesterov ? 1 : 0, r->momentum, r->weight_decay, r->beta1, r->beta2, r->epsilon,
             r->initial_g2sum);
}

void ps_opts_fmt(const fl_ps_sparse_opts *o, char *buf, size_t cap) {
    snprintf(buf, cap, "%d %.17g %.17g %.17g %.17g %.17g %.17g %d", (int)o->entry,
             o->entry_count, o->entry_probability, o->show_click_decay, o->delete_threshold,
             o->nonclk_coeff, o->click_coeff, o->delete_after_unseen);
}

void ps_init_fmt(const fl_ps_init_rule *init, char *buf, size_t cap) {
    snprintf(buf, cap, "%d %.17g %.17g %" PRIu64, (int)init->type, init->a, init->b,
             init->seed);
}

int ps_meta_i64(const fl_safetensors *st, const char *key, int64_t *out) {
    const char *v = fl_safetensors_meta(st, key);
    char *end;
    if (!v)
        return -1;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end)
        return fl_fail(FL_EFORMAT, "%s: metadata %s=%s is not an integer",
                       fl_safetensors_path(st), key, v);
    *out = x;
    return 0;
}

int ps_parse_rule(const fl_safetensors *st, const char *key, fl_ps_rule *r) {
    const char *v = fl_safetensors_meta(st, key);
    int type, nest, used = 0;
    memset(r, 0, sizeof *r);
    if (!v || sscanf(v, "%d %d %lg %lg %lg %lg %lg %lg%n", &type, &nest, &r->momentum,
                     &r->weight_decay, &r->beta1, &r->beta2, &r->epsilon, &r->initial_g2sum,
                     &used) != 8 || v[used] || type < 0 || type > FL_PS_RULE_SUM)
        return fl_fail(FL_EFORMAT, "%s: metadata %s is missing or not a rule",
                       fl_safetensors_path(st), key);
    r->type = (fl_ps_rule_type)type;
    r->nesterov = nest != 0;
    return 0;
}

int ps_parse_init(const fl_safetensors *st, const char *key, fl_ps_init_rule *init) {
    const char *v = fl_safetensors_meta(st, key);
    int it, used = 0;
    memset(init, 0, sizeof *init);
    if (!v || sscanf(v, "%d %lg %lg %" SCNu64 "%n", &it, &init->a, &init->b, &init->seed,
                     &used) != 4 || v[used] || it < 0 || it > FL_PS_INIT_NORMAL)
        return fl_fail(FL_EFORMAT, "%s: metadata %s is missing or not an initializer",
                       fl_safetensors_path(st), key);
    init->type = (fl_ps_init_type)it;
    return 0;
}

int ps_parse_opts(const fl_safetensors *st, const char *key, fl_ps_sparse_opts *o) {
    const char *v = fl_safetensors_meta(st, key);
    fl_ps_sparse_opts_defaults(o);
    if (!v)
        return 0; /* an older save: the defaults */
    int entry, used = 0;
    if (sscanf(v, "%d %lg %lg %lg %lg %lg %lg %d%n", &entry, &o->entry_count,
               &o->entry_probability, &o->show_click_decay, &o->delete_threshold,
               &o->nonclk_coeff, &o->click_coeff, &o->delete_after_unseen, &used) != 8 ||
        v[used])
        return fl_fail(FL_EFORMAT, "%s: metadata %s=%s is not a sparse table's life cycle",
                       fl_safetensors_path(st), key, v);
    o->entry = (fl_ps_entry_type)entry;
    if (fl_ps_sparse_opts_check(o) < 0)
        return fl_fail(FL_EFORMAT, "%s: metadata %s: %s", fl_safetensors_path(st), key,
                       fl_errmsg());
    return 0;
}
