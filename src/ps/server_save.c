/* server_save.c - a parameter server's checkpoint: its shards of every table (dense blocks'
 * values and rule state, sparse rows with their state) as one safetensors file per save,
 * written atomically into the checkpoint directory, and a pointer file naming the chain a
 * restart loads: the last full save and the delta saves on top of it (Paddle's save modes
 * for sparse tables: all rows, or only the rows changed since the previous save).
 *
 *   ps.server<s>.<step>.safetensors         a full save
 *   ps.server<s>.<step>.delta.safetensors   a delta: every dense block, changed sparse rows
 *   ps.server<s>.latest                     "fleet-ps-checkpoint 1", "server s of S",
 *                                           "step N", then "file <name>" per file, oldest first
 *
 * Tensors: dense.<t>.<b>.value F32 [n] and dense.<t>.<b>.state F32 [k] per block b (the
 * global block index); sparse.<t>.ids I64 [rows], sparse.<t>.values F32 [rows, dim],
 * sparse.<t>.state F32 [rows, k], sparse.<t>.stat F32 [rows, 3] (show, click, passes unseen),
 * and the candidates of entry COUNT, sparse.<t>.cand_ids I64 [n] and sparse.<t>.cand F32
 * [n, 2] (shows seen, passes unseen), all of them in every save, a delta too. Metadata:
 * fleet.ps.server, fleet.ps.servers, fleet.ps.step, fleet.ps.kind (all|delta), dense.<t>.numel
 * / .rule / .version, sparse.<t>.dim / .rule / .init / .opts / .version / .rows / .cands /
 * .passes (rule: "type nesterov momentum wd beta1 beta2 eps g2sum"; init: "type a b seed";
 * opts: "entry count probability decay threshold nonclk_coeff click_coeff unseen"; doubles
 * with 17 digits, so they read back exactly). A file without .stat / .opts (an older save)
 * loads with zero counters and the default life cycle. A pass (shrink) since the last save
 * makes the next one full: a delta cannot say which rows went. */
#include "server.h"

#include "fleet/checkpoint.h"
#include "fleet/log.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"
#include "io/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_LEN 64
#define META_LEN 192

/* ---- writing ---- */

typedef struct {
    fl_st_entry *e;
    int64_t     *shapes;     /* 2 per entry */
    char        (*names)[NAME_LEN];
    int          n, cap;
    fl_st_meta  *m;
    char        (*mk)[NAME_LEN], (*mv)[META_LEN];
    int          nm, mcap;
    void       **owned;      /* buffers to free after writing */
    int          nowned, ocap;
} save_list;

static int add_entry(save_list *l, const char *name, fl_dtype t, int ndim, int64_t d0,
                     int64_t d1, const void *data) {
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 64;
        fl_st_entry *e = realloc(l->e, (size_t)c * sizeof *e);
        if (e)
            l->e = e;
        int64_t *sh = realloc(l->shapes, (size_t)c * 2 * sizeof *sh);
        if (sh)
            l->shapes = sh;
        char (*nm)[NAME_LEN] = realloc(l->names, (size_t)c * sizeof *nm);
        if (nm)
            l->names = nm;
        if (!e || !sh || !nm)
            return fl_fail(FL_ENOMEM, "out of memory listing a checkpoint's tensors");
        l->cap = c;
        for (int i = 0; i < l->n; i++) { /* re-point after the moves */
            l->e[i].name = l->names[i];
            l->e[i].shape = l->shapes + 2 * i;
        }
    }
    int i = l->n++;
    snprintf(l->names[i], NAME_LEN, "%s", name);
    l->shapes[2 * i] = d0;
    l->shapes[2 * i + 1] = d1;
    l->e[i] = (fl_st_entry){.name = l->names[i], .dtype = t, .ndim = ndim,
                            .shape = l->shapes + 2 * i, .data = data};
    return 0;
}

static int add_meta(save_list *l, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int add_meta(save_list *l, const char *key, const char *fmt, ...) {
    if (l->nm == l->mcap) {
        int c = l->mcap ? 2 * l->mcap : 32;
        fl_st_meta *m = realloc(l->m, (size_t)c * sizeof *m);
        if (m)
            l->m = m;
        char (*k)[NAME_LEN] = realloc(l->mk, (size_t)c * sizeof *k);
        if (k)
            l->mk = k;
        char (*v)[META_LEN] = realloc(l->mv, (size_t)c * sizeof *v);
        if (v)
            l->mv = v;
        if (!m || !k || !v)
            return fl_fail(FL_ENOMEM, "out of memory listing a checkpoint's metadata");
        l->mcap = c;
        for (int i = 0; i < l->nm; i++)
            l->m[i] = (fl_st_meta){l->mk[i], l->mv[i]};
    }
    int i = l->nm++;
    snprintf(l->mk[i], NAME_LEN, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->mv[i], META_LEN, fmt, ap);
    va_end(ap);
    l->m[i] = (fl_st_meta){l->mk[i], l->mv[i]};
    return 0;
}

static void *own(save_list *l, size_t bytes) {
    if (l->nowned == l->ocap) {
        int c = l->ocap ? 2 * l->ocap : 16;
        void **o = realloc(l->owned, (size_t)c * sizeof *o);
        if (!o)
            return NULL;
        l->owned = o;
        l->ocap = c;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        l->owned[l->nowned++] = p;
    return p;
}

static void save_list_free(save_list *l) {
    for (int i = 0; i < l->nowned; i++)
        free(l->owned[i]);
    free(l->owned);
    free(l->e);
    free(l->shapes);
    free(l->names);
    free(l->m);
    free(l->mk);
    free(l->mv);
}

static void rule_fmt(const fl_ps_rule *r, char *buf, size_t cap) {
    snprintf(buf, cap, "%d %d %.17g %.17g %.17g %.17g %.17g %.17g", (int)r->type,
             r->nesterov ? 1 : 0, r->momentum, r->weight_decay, r->beta1, r->beta2, r->epsilon,
             r->initial_g2sum);
}

void ps_opts_fmt(const fl_ps_sparse_opts *o, char *buf, size_t cap) {
    snprintf(buf, cap, "%d %.17g %.17g %.17g %.17g %.17g %.17g %d", (int)o->entry,
             o->entry_count, o->entry_probability, o->show_click_decay, o->delete_threshold,
             o->nonclk_coeff, o->click_coeff, o->delete_after_unseen);
}

/* Rows gathered from the shard parts of one sparse table. */
typedef struct {
    int64_t *ids;
    float   *values, *state, *stat;
    int64_t  n, cap;
    int      dim, sr;
} rows_buf;

static int take_row(void *ctx, uint64_t id, const float *values, const float *state,
                    const fl_ps_row_stat *st) {
    rows_buf *b = ctx;
    if (b->n >= b->cap)
        return FL_EINVAL; /* more rows than counted: cannot happen while shards are paused */
    b->ids[b->n] = (int64_t)id;
    memcpy(b->values + b->n * b->dim, values, (size_t)b->dim * sizeof(float));
    if (b->sr)
        memcpy(b->state + b->n * b->sr, state, (size_t)b->sr * sizeof(float));
    b->stat[3 * b->n] = st->show;
    b->stat[3 * b->n + 1] = st->click;
    b->stat[3 * b->n + 2] = (float)st->unseen;
    b->n++;
    return 0;
}

/* Candidates gathered from the shard parts. */
typedef struct {
    int64_t *ids;
    float   *cnt;
    int64_t  n, cap;
} cand_buf;

static int take_cand(void *ctx, uint64_t id, float seen, int unseen) {
    cand_buf *b = ctx;
    if (b->n >= b->cap)
        return FL_EINVAL;
    b->ids[b->n] = (int64_t)id;
    b->cnt[2 * b->n] = seen;
    b->cnt[2 * b->n + 1] = (float)unseen;
    b->n++;
    return 0;
}

static int list_tables(ps_server *s, save_list *l, bool delta) {
    char key[NAME_LEN], val[META_LEN];
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        ps_dense *d = &s->dense[t];
        if (!d->declared)
            continue;
        rule_fmt(&d->rule, val, sizeof val);
        snprintf(key, sizeof key, "dense.%d.rule", t);
        FL_TRY(add_meta(l, key, "%s", val));
        snprintf(key, sizeof key, "dense.%d.numel", t);
        FL_TRY(add_meta(l, key, "%" PRId64, d->numel));
        snprintf(key, sizeof key, "dense.%d.version", t);
        FL_TRY(add_meta(l, key, "%" PRId64, d->sy.version));
        int64_t k1 = fl_ps_rule_state_per_value(&d->rule), k2 = fl_ps_rule_state_per_row(&d->rule);
        for (int j = 0; j < d->nblocks; j++) {
            fl_ps_block *b = &d->blocks[j];
            int64_t gb = s->s + (int64_t)j * s->S, k = b->numel * k1 + k2;
            snprintf(key, sizeof key, "dense.%d.%" PRId64 ".value", t, gb);
            FL_TRY(add_entry(l, key, FL_DTYPE_F32, 1, b->numel, 0, b->value));
            if (k > 0) {
                snprintf(key, sizeof key, "dense.%d.%" PRId64 ".state", t, gb);
                FL_TRY(add_entry(l, key, FL_DTYPE_F32, 1, k, 0, b->state));
            }
        }
    }
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        ps_sparse_table *sp = &s->sparse[t];
        if (!sp->declared)
            continue;
        rows_buf rb = {.dim = sp->dim,
                       .sr = sp->dim * fl_ps_rule_state_per_value(&sp->rule) +
                             fl_ps_rule_state_per_row(&sp->rule)};
        cand_buf cb = {0};
        for (int i = 0; i < s->T; i++) {
            rb.cap += fl_ps_sparse_rows(sp->parts[i]);
            cb.cap += fl_ps_sparse_candidates(sp->parts[i]);
        }
        rb.ids = own(l, (size_t)rb.cap * 8);
        rb.values = own(l, (size_t)rb.cap * (size_t)rb.dim * 4);
        rb.state = own(l, (size_t)rb.cap * (size_t)rb.sr * 4);
        rb.stat = own(l, (size_t)rb.cap * 3 * 4);
        cb.ids = own(l, (size_t)cb.cap * 8);
        cb.cnt = own(l, (size_t)cb.cap * 2 * 4);
        if (!rb.ids || !rb.values || !rb.state || !rb.stat || !cb.ids || !cb.cnt)
            return fl_fail(FL_ENOMEM, "out of memory gathering %" PRId64 " rows of sparse table "
                           "%d", rb.cap, t);
        for (int i = 0; i < s->T; i++) {
            int rc = fl_ps_sparse_visit(sp->parts[i], delta, take_row, &rb);
            if (rc == 0)
                rc = fl_ps_sparse_visit_candidates(sp->parts[i], take_cand, &cb);
            if (rc < 0)
                return fl_fail(rc, "gathering the rows of sparse table %d", t);
        }
        rule_fmt(&sp->rule, val, sizeof val);
        snprintf(key, sizeof key, "sparse.%d.rule", t);
        FL_TRY(add_meta(l, key, "%s", val));
        snprintf(key, sizeof key, "sparse.%d.dim", t);
        FL_TRY(add_meta(l, key, "%d", sp->dim));
        snprintf(key, sizeof key, "sparse.%d.init", t);
        FL_TRY(add_meta(l, key, "%d %.17g %.17g %" PRIu64, (int)sp->init.type, sp->init.a,
                        sp->init.b, sp->init.seed));
        ps_opts_fmt(&sp->opts, val, sizeof val);
        snprintf(key, sizeof key, "sparse.%d.opts", t);
        FL_TRY(add_meta(l, key, "%s", val));
        snprintf(key, sizeof key, "sparse.%d.passes", t);
        FL_TRY(add_meta(l, key, "%" PRId64, fl_ps_sparse_passes(sp->parts[0])));
        snprintf(key, sizeof key, "sparse.%d.version", t);
        FL_TRY(add_meta(l, key, "%" PRId64, sp->sy.version));
        snprintf(key, sizeof key, "sparse.%d.rows", t);
        FL_TRY(add_meta(l, key, "%" PRId64, rb.n));
        snprintf(key, sizeof key, "sparse.%d.cands", t);
        FL_TRY(add_meta(l, key, "%" PRId64, cb.n));
        if (cb.n > 0) {
            snprintf(key, sizeof key, "sparse.%d.cand_ids", t);
            FL_TRY(add_entry(l, key, FL_DTYPE_I64, 1, cb.n, 0, cb.ids));
            snprintf(key, sizeof key, "sparse.%d.cand", t);
            FL_TRY(add_entry(l, key, FL_DTYPE_F32, 2, cb.n, 2, cb.cnt));
        }
        if (rb.n == 0)
            continue;
        snprintf(key, sizeof key, "sparse.%d.stat", t);
        FL_TRY(add_entry(l, key, FL_DTYPE_F32, 2, rb.n, 3, rb.stat));
        snprintf(key, sizeof key, "sparse.%d.ids", t);
        FL_TRY(add_entry(l, key, FL_DTYPE_I64, 1, rb.n, 0, rb.ids));
        snprintf(key, sizeof key, "sparse.%d.values", t);
        FL_TRY(add_entry(l, key, FL_DTYPE_F32, 2, rb.n, rb.dim, rb.values));
        if (rb.sr) {
            snprintf(key, sizeof key, "sparse.%d.state", t);
            FL_TRY(add_entry(l, key, FL_DTYPE_F32, 2, rb.n, rb.sr, rb.state));
        }
    }
    return 0;
}

static int write_pointer(ps_server *s, const ps_chain *c) {
    char path[1200], *text = malloc((size_t)PS_CHAIN_MAX * 110 + 256);
    if (!text)
        return fl_fail(FL_ENOMEM, "out of memory");
    size_t len = (size_t)sprintf(text, "fleet-ps-checkpoint 1\nserver %d of %d\nstep %" PRId64
                                 "\n", s->s, s->S, c->step);
    for (int i = 0; i < c->n; i++)
        len += (size_t)sprintf(text + len, "file %s\n", c->files[i]);
    snprintf(path, sizeof path, "%s/ps.server%d.latest", s->cfg.checkpoint_dir, s->s);
    int rc = fl_atomic_write_file(path, text, len);
    free(text);
    return rc;
}

/* ---- pruning ---- */

/* The step and kind of "ps.server<s>.<step>[.delta].safetensors[.tmp-<pid>]" of server s;
 * -1 when name is not one. *tmp: an unfinished write's leftover. */
static int64_t file_step(const char *name, int s, bool *tmp) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "ps.server%d.", s);
    if (strncmp(name, prefix, (size_t)n) != 0)
        return -1;
    const char *p = name + n;
    int64_t v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    if (strncmp(p, ".delta", 6) == 0)
        p += 6;
    if (strncmp(p, ".safetensors", 12) != 0)
        return -1;
    p += 12;
    *tmp = strncmp(p, ".tmp-", 5) == 0;
    return *p == '\0' || *tmp ? v : -1;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* After the save of `step`: keeps the shards of the steps the workers' checkpoints keep (the
 * newest cfg.keep at or below the step their `latest` names, which moves only after this save
 * completed on every worker), this step's, and the current chain's files; removes the other
 * steps' files, those above `step` (a run killed before its save completed, then resumed from
 * an earlier one) and unfinished writes. Without the workers' `latest`, the newest keep steps
 * at or below `step`. Failures to remove are logged, not fatal: the save itself is complete.
 * Called again when serving ends, after the workers' last `latest` moved. */
void ps_prune(ps_server *s, int64_t step) {
    if (s->cfg.keep <= 0)
        return;
    const char *root = s->cfg.checkpoint_dir;
    int64_t latest;
    if (fl_ckpt_latest_step(root, &latest) < 0 || latest > step) {
        FL_WARN("ps server %d: not pruning old shards: %s", s->s,
                latest > step ? "the workers' latest is beyond this save" : fl_errmsg());
        return;
    }
    int64_t bound = latest >= 0 ? latest : step;
    DIR *d = opendir(root);
    if (!d)
        return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    bool tmp;
    while ((e = readdir(d)) != NULL) { /* the distinct steps at or below bound */
        int64_t v = file_step(e->d_name, s->s, &tmp);
        if (v < 0 || tmp || v > bound)
            continue;
        bool seen = false;
        for (size_t i = 0; i < n && !seen; i++)
            seen = steps[i] == v;
        if (seen)
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            int64_t *g = realloc(steps, c * sizeof *g);
            if (!g)
                break;
            steps = g;
            cap = c;
        }
        steps[n++] = v;
    }
    qsort(steps, n, sizeof *steps, cmp_desc);
    int64_t oldest_kept = n > (size_t)s->cfg.keep ? steps[s->cfg.keep - 1] : -1;
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        int64_t v = file_step(e->d_name, s->s, &tmp);
        if (v < 0 || (!tmp && (v == step || (v <= bound && v >= oldest_kept))))
            continue;
        bool chained = false;
        for (int i = 0; i < s->chain.n && !chained; i++)
            chained = strcmp(s->chain.files[i], e->d_name) == 0;
        if (chained)
            continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (unlink(path) < 0 && errno != ENOENT)
            FL_WARN("ps server %d: cannot remove %s: %s", s->s, path, strerror(errno));
    }
    closedir(d);
    free(steps);
}

int ps_save(ps_server *s, int64_t step, int mode) {
    bool delta = mode == FL_PS_SAVE_DELTA, passed = false;
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        for (int i = 0; s->sparse[t].declared && i < s->T; i++)
            passed = passed || fl_ps_sparse_passed(s->sparse[t].parts[i]);
    if (delta && (s->chain.n == 0 || s->chain.n >= PS_CHAIN_MAX || passed)) {
        FL_INFO("ps server %d: a full save at step %" PRId64 " in place of a delta (%s)", s->s,
                step, passed ? "a shrink pass ran since the last save"
                : s->chain.n ? "the chain of deltas is full" : "no full save to build on");
        delta = false;
    }
    ps_chain next = delta ? s->chain : (ps_chain){0};
    char file[96], path[1200];
    snprintf(file, sizeof file, "ps.server%d.%" PRId64 "%s.safetensors", s->s, step,
             delta ? ".delta" : "");
    snprintf(path, sizeof path, "%s/%s", s->cfg.checkpoint_dir, file);
    FL_TRY(fl_ckpt_mkdirs(s->cfg.checkpoint_dir)); /* the workers make it only after this */
    save_list l = {0};
    int rc = add_meta(&l, "fleet.ps.server", "%d", s->s);
    if (rc == 0)
        rc = add_meta(&l, "fleet.ps.servers", "%d", s->S);
    if (rc == 0)
        rc = add_meta(&l, "fleet.ps.step", "%" PRId64, step);
    if (rc == 0)
        rc = add_meta(&l, "fleet.ps.kind", "%s", delta ? "delta" : "all");
    if (rc == 0)
        rc = list_tables(s, &l, delta);
    if (rc == 0)
        rc = fl_safetensors_write(path, l.e, l.n, l.m, l.nm);
    save_list_free(&l);
    if (rc < 0)
        return rc;
    if (!(delta && next.n > 0 && strcmp(next.files[next.n - 1], file) == 0))
        snprintf(next.files[next.n++], sizeof next.files[0], "%s", file);
    next.step = step;
    FL_TRY(write_pointer(s, &next));
    s->chain = next;
    ps_prune(s, step);
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        for (int i = 0; s->sparse[t].declared && i < s->T; i++)
            fl_ps_sparse_mark_clean(s->sparse[t].parts[i]);
    FL_INFO("ps server %d: saved step %" PRId64 " (%s) to %s", s->s, step,
            delta ? "delta" : "all", path);
    return 0;
}

/* ---- loading ---- */

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

static int load_dense(ps_server *s, const fl_safetensors *st, int t) {
    char key[NAME_LEN];
    const char *path = fl_safetensors_path(st);
    int64_t numel, version;
    snprintf(key, sizeof key, "dense.%d.numel", t);
    if (ps_meta_i64(st, key, &numel) < 0)
        return 0; /* not in this file */
    snprintf(key, sizeof key, "dense.%d.version", t);
    fl_ps_rule r;
    if (ps_meta_i64(st, key, &version) < 0 || version < 0 || numel < 1 || numel > ((int64_t)1 << 40))
        return fl_fail(FL_EFORMAT, "%s: dense table %d has no valid numel/version", path, t);
    snprintf(key, sizeof key, "dense.%d.rule", t);
    FL_TRY(ps_parse_rule(st, key, &r));
    ps_dense *d = &s->dense[t];
    if (!d->declared) {
        FL_TRY(ps_dense_create(s, d, numel, &r));
    } else if (d->numel != numel || !ps_rule_equal(&d->rule, &r)) {
        return fl_fail(FL_EFORMAT, "%s: dense table %d has %" PRId64 " values, the save it "
                       "builds on %" PRId64 " (or another rule)", path, t, numel, d->numel);
    }
    int64_t k1 = fl_ps_rule_state_per_value(&r), k2 = fl_ps_rule_state_per_row(&r);
    for (int j = 0; j < d->nblocks; j++) {
        fl_ps_block *b = &d->blocks[j];
        int64_t gb = s->s + (int64_t)j * s->S, k = b->numel * k1 + k2;
        snprintf(key, sizeof key, "dense.%d.%" PRId64 ".value", t, gb);
        const fl_st_tensor *v = fl_safetensors_find(st, key);
        if (!v || v->dtype != FL_DTYPE_F32 || v->numel != b->numel)
            return fl_fail(FL_EFORMAT, "%s: tensor %s is missing or not F32 [%" PRId64 "]",
                           path, key, b->numel);
        memcpy(b->value, v->data, (size_t)b->numel * 4);
        if (k > 0) {
            snprintf(key, sizeof key, "dense.%d.%" PRId64 ".state", t, gb);
            v = fl_safetensors_find(st, key);
            if (!v || v->dtype != FL_DTYPE_F32 || v->numel != k)
                return fl_fail(FL_EFORMAT, "%s: tensor %s is missing or not F32 [%" PRId64 "]",
                               path, key, k);
            memcpy(b->state, v->data, (size_t)k * 4);
        }
    }
    d->sy.version = version;
    for (int w = 0; w < s->W; w++)
        d->sy.last_pull[w] = d->sy.pushes_by[w] = version;
    d->loaded = d->ready = true;
    d->declared_by = -1;
    return 0;
}

static int load_sparse(ps_server *s, const fl_safetensors *st, int t) {
    char key[NAME_LEN];
    const char *path = fl_safetensors_path(st);
    int64_t dim, version, rows;
    snprintf(key, sizeof key, "sparse.%d.dim", t);
    if (ps_meta_i64(st, key, &dim) < 0)
        return 0;
    snprintf(key, sizeof key, "sparse.%d.version", t);
    int rc1 = ps_meta_i64(st, key, &version);
    snprintf(key, sizeof key, "sparse.%d.rows", t);
    if (rc1 < 0 || ps_meta_i64(st, key, &rows) < 0 || dim < 1 || dim > 4096 || version < 0 ||
        rows < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has no valid dim/version/rows", path, t);
    fl_ps_rule r;
    snprintf(key, sizeof key, "sparse.%d.rule", t);
    FL_TRY(ps_parse_rule(st, key, &r));
    fl_ps_init_rule init;
    snprintf(key, sizeof key, "sparse.%d.init", t);
    FL_TRY(ps_parse_init(st, key, &init));
    fl_ps_sparse_opts opts;
    snprintf(key, sizeof key, "sparse.%d.opts", t);
    FL_TRY(ps_parse_opts(st, key, &opts));
    int64_t passes = 0, cands = 0;
    snprintf(key, sizeof key, "sparse.%d.passes", t);
    if (ps_meta_i64(st, key, &passes) == FL_EFORMAT || passes < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d: bad %s", path, t, key);
    snprintf(key, sizeof key, "sparse.%d.cands", t);
    if (ps_meta_i64(st, key, &cands) == FL_EFORMAT || cands < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d: bad %s", path, t, key);
    ps_sparse_table *sp = &s->sparse[t];
    if (!sp->declared) {
        FL_TRY(ps_sparse_table_create(s, t, sp, (int)dim, &r, &init, &opts));
    } else if (sp->dim != dim || !ps_rule_equal(&sp->rule, &r) ||
               !ps_opts_equal(&sp->opts, &opts)) {
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has rows of %" PRId64 ", the save it "
                       "builds on %d (or another rule or life cycle)", path, t, dim, sp->dim);
    }
    int64_t sr = dim * fl_ps_rule_state_per_value(&r) + fl_ps_rule_state_per_row(&r);
    const fl_st_tensor *ti = NULL, *tv = NULL, *ts = NULL, *tc = NULL;
    if (rows > 0) {
        snprintf(key, sizeof key, "sparse.%d.stat", t);
        tc = fl_safetensors_find(st, key); /* absent in an older save: zero counters */
        if (tc && (tc->dtype != FL_DTYPE_F32 || tc->numel != rows * 3))
            return fl_fail(FL_EFORMAT, "%s: tensor %s is not F32 [%" PRId64 ", 3]", path, key,
                           rows);
    }
    const fl_st_tensor *cid = NULL, *ccnt = NULL;
    if (cands > 0) {
        snprintf(key, sizeof key, "sparse.%d.cand_ids", t);
        cid = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.cand", t);
        ccnt = fl_safetensors_find(st, key);
        if (!cid || cid->dtype != FL_DTYPE_I64 || cid->numel != cands || !ccnt ||
            ccnt->dtype != FL_DTYPE_F32 || ccnt->numel != cands * 2)
            return fl_fail(FL_EFORMAT, "%s: the %" PRId64 " entry candidates of sparse table %d "
                           "are missing or of the wrong shape", path, cands, t);
    }
    if (rows > 0) {
        snprintf(key, sizeof key, "sparse.%d.ids", t);
        ti = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.values", t);
        tv = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.state", t);
        ts = sr ? fl_safetensors_find(st, key) : NULL;
        if (!ti || ti->dtype != FL_DTYPE_I64 || ti->numel != rows || !tv ||
            tv->dtype != FL_DTYPE_F32 || tv->numel != rows * dim ||
            (sr && (!ts || ts->dtype != FL_DTYPE_F32 || ts->numel != rows * sr)))
            return fl_fail(FL_EFORMAT, "%s: the rows of sparse table %d are missing or do not "
                           "match %" PRId64 " rows of dim %" PRId64, path, t, rows, dim);
    }
    float *vals = malloc((size_t)(dim + sr) * sizeof(float));
    if (!vals)
        return fl_fail(FL_ENOMEM, "out of memory");
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < rows; i++) {
        uint64_t id;
        memcpy(&id, (const char *)ti->data + i * 8, 8);
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s) {
            rc = fl_fail(FL_EFORMAT, "%s: id %" PRIu64 " of sparse table %d belongs to server "
                         "%d, not %d", path, id, t, fl_ps_shard_of(id, s->S), s->s);
            break;
        }
        memcpy(vals, (const char *)tv->data + i * dim * 4, (size_t)dim * 4);
        if (sr)
            memcpy(vals + dim, (const char *)ts->data + i * sr * 4, (size_t)sr * 4);
        int th = s->T > 1 ? fl_ps_thread_of(id, s->T) : 0;
        fl_ps_row_stat rs = {0, 0, 0};
        if (tc) {
            float c3[3];
            memcpy(c3, (const char *)tc->data + i * 12, 12);
            rs = (fl_ps_row_stat){c3[0], c3[1], (int)c3[2]};
        }
        rc = fl_ps_sparse_put(sp->parts[th], id, vals, sr ? vals + dim : NULL, &rs);
    }
    free(vals);
    FL_TRY(rc);
    /* each save holds every candidate: the last file's replace the ones before */
    for (int i = 0; i < s->T; i++) {
        fl_ps_sparse_clear_candidates(sp->parts[i]);
        fl_ps_sparse_set_passes(sp->parts[i], passes);
    }
    for (int64_t i = 0; i < cands; i++) {
        uint64_t id;
        float c2[2];
        memcpy(&id, (const char *)cid->data + i * 8, 8);
        memcpy(c2, (const char *)ccnt->data + i * 8, 8);
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s)
            return fl_fail(FL_EFORMAT, "%s: candidate id %" PRIu64 " of sparse table %d belongs "
                           "to server %d, not %d", path, id, t, fl_ps_shard_of(id, s->S), s->s);
        int th = s->T > 1 ? fl_ps_thread_of(id, s->T) : 0;
        FL_TRY(fl_ps_sparse_put_candidate(sp->parts[th], id, c2[0], (int)c2[1]));
    }
    sp->sy.version = version;
    for (int w = 0; w < s->W; w++) { /* sync: every worker pushed each update applied */
        sp->sy.last_pull[w] = version;
        sp->sy.pushes_by[w] = version;
    }
    sp->loaded = true;
    sp->declared_by = -1;
    return 0;
}

/* Loads one file of a chain from dir; the chain's last file must say step `step` (-1: any). */
static int load_file(ps_server *s, const char *dir, const char *file, bool base, int64_t step) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    int64_t server = -1, servers = -1, saved = -1;
    const char *kind = fl_safetensors_meta(st, "fleet.ps.kind");
    int rc = 0;
    if (ps_meta_i64(st, "fleet.ps.server", &server) < 0 ||
        ps_meta_i64(st, "fleet.ps.servers", &servers) < 0 || !kind)
        rc = fl_fail(FL_EFORMAT, "%s: not a parameter-server checkpoint (no fleet.ps.* "
                     "metadata)", path);
    else if (server != s->s || servers != s->S)
        rc = fl_fail(FL_EFORMAT, "%s is server %" PRId64 " of %" PRId64 "'s shards; this is "
                     "server %d of %d", path, server, servers, s->s, s->S);
    else if (step >= 0 && (ps_meta_i64(st, "fleet.ps.step", &saved) < 0 || saved != step))
        rc = fl_fail(FL_EFORMAT, "%s: holds step %" PRId64 ", the chain ends at step %" PRId64,
                     path, saved, step);
    else if (base && strcmp(kind, "all") != 0)
        rc = fl_fail(FL_EFORMAT, "%s: the chain starts with a %s save, not a full one", path,
                     kind);
    for (int t = 0; rc == 0 && t < FL_PS_MAX_TABLES; t++) {
        rc = load_dense(s, st, t);
        if (rc == 0)
            rc = load_sparse(s, st, t);
    }
    fl_safetensors_close(st);
    return rc;
}

int ps_read_pointer(const char *dir, int me, int *nservers, ps_chain *c, bool *have) {
    char path[1200];
    snprintf(path, sizeof path, "%s/ps.server%d.latest", dir, me);
    *have = false;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT)
            return 0;
        return fl_fail(FL_EIO, "%s: %s", path, strerror(errno));
    }
    memset(c, 0, sizeof *c);
    char line[256];
    int ln = 0, rc = 0, server = -1, servers = -1;
    bool magic = false, have_step = false;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        ln++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n')
            line[--len] = '\0';
        long long x;
        int used = 0;
        if (ln == 1) {
            magic = strcmp(line, "fleet-ps-checkpoint 1") == 0;
            if (!magic)
                rc = fl_fail(FL_EFORMAT, "%s:1: not a parameter-server checkpoint pointer", path);
        } else if (sscanf(line, "server %d of %d%n", &server, &servers, &used) == 2 &&
                   !line[used]) {
            if (server != me || (*nservers > 0 && servers != *nservers))
                rc = fl_fail(FL_EFORMAT, "%s:%d: the checkpoint is server %d of %d's; this is "
                             "server %d of %d", path, ln, server, servers, me, *nservers);
            else if (servers < 1 || servers > FL_PS_MAX_SERVERS || server >= servers)
                rc = fl_fail(FL_EFORMAT, "%s:%d: server %d of %d?", path, ln, server, servers);
            else
                *nservers = servers;
        } else if (sscanf(line, "step %lld%n", &x, &used) == 1 && !line[used] && x >= 0) {
            c->step = x;
            have_step = true;
        } else if (strncmp(line, "file ", 5) == 0 && len > 5 && len - 5 < sizeof c->files[0] &&
                   !strchr(line + 5, '/') && c->n < PS_CHAIN_MAX) {
            memcpy(c->files[c->n++], line + 5, len - 5 + 1);
        } else {
            rc = fl_fail(FL_EFORMAT, "%s:%d: cannot read '%s'", path, ln, line);
        }
    }
    fclose(f);
    if (rc == 0 && (!magic || !have_step || c->n == 0 || server < 0))
        rc = fl_fail(FL_EFORMAT, "%s: incomplete pointer (needs server, step and files)", path);
    *have = rc == 0;
    return rc;
}

int ps_load(ps_server *s) {
    const char *dir = s->cfg.resume_dir[0] ? s->cfg.resume_dir : s->cfg.checkpoint_dir;
    bool here = strcmp(dir, s->cfg.checkpoint_dir) == 0, have;
    int64_t want = s->cfg.resume_step;
    ps_chain c;
    int S = s->S;
    int rc = ps_read_pointer(dir, s->s, &S, &c, &have);
    if (rc == 0 && want >= 0 && (!have || c.step != want)) {
        /* the workers resume from another step than the pointer's (a save the workers never
         * completed, or a resume by hand): that step's full save alone */
        char file[96], path[1200], why[96];
        snprintf(file, sizeof file, "ps.server%d.%" PRId64 ".safetensors", s->s, want);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (have)
            snprintf(why, sizeof why, "ps.server%d.latest is at step %" PRId64, s->s, c.step);
        else
            snprintf(why, sizeof why, "nor is ps.server%d.latest", s->s);
        if (access(path, F_OK) != 0)
            return fl_fail(FL_EIO, "parameter server %d cannot resume step %" PRId64 ", the "
                           "workers' step: %s is not there (%s)", s->s, want, path, why);
        if (have)
            FL_INFO("ps server %d: the workers resume from step %" PRId64 ", %s: loading %s",
                    s->s, want, why, path);
        c = (ps_chain){.n = 1, .step = want};
        snprintf(c.files[0], sizeof c.files[0], "%s", file);
        have = true;
    }
    if (rc == 0 && !have) {
        FL_INFO("ps server %d: no checkpoint in %s; starting fresh", s->s, dir);
        return 0;
    }
    for (int i = 0; rc == 0 && i < c.n; i++)
        rc = load_file(s, dir, c.files[i], i == 0, i == c.n - 1 ? c.step : -1);
    if (rc < 0)
        return fl_fail_prefix(rc, "parameter server %d cannot resume", s->s);
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        for (int i = 0; s->sparse[t].declared && i < s->T; i++)
            fl_ps_sparse_mark_clean(s->sparse[t].parts[i]);
    s->chain = here ? c : (ps_chain){0}; /* deltas build on files of checkpoint_dir only */
    s->loaded_step = c.step;
    FL_INFO("ps server %d: resumed step %" PRId64 " from %s (%d file%s)", s->s, c.step, dir,
            c.n, c.n == 1 ? "" : "s");
    return 0;
}
