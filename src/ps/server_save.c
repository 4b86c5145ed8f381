/* server_save.c - a parameter server's checkpoint: its shards of every table (dense blocks'
 * values and rule state, sparse rows with their state) as one safetensors file per save,
 * written atomically into the checkpoint directory, and a pointer file naming the chain a
 * restart loads: the last full save and the delta saves on top of it (Paddle's save modes
 * for sparse tables: all rows, or only the rows changed since the previous save). This file
 * writes them; server_meta.c formats the metadata, server_pointer.c the pointer,
 * server_prune.c removes old steps' files, server_load.c reads a chain back. The layout:
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

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_st_entry *e;
    int64_t     *shapes;     /* 2 per entry */
    char        (*names)[PS_META_KEY];
    int          n, cap;
    fl_st_meta  *m;
    char        (*mk)[PS_META_KEY], (*mv)[PS_META_VAL];
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
        char (*nm)[PS_META_KEY] = realloc(l->names, (size_t)c * sizeof *nm);
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
    snprintf(l->names[i], PS_META_KEY, "%s", name);
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
        char (*k)[PS_META_KEY] = realloc(l->mk, (size_t)c * sizeof *k);
        if (k)
            l->mk = k;
        char (*v)[PS_META_VAL] = realloc(l->mv, (size_t)c * sizeof *v);
        if (v)
            l->mv = v;
        if (!m || !k || !v)
            return fl_fail(FL_ENOMEM, "out of memory listing a checkpoint's metadata");
        l->mcap = c;
        for (int i = 0; i < l->nm; i++)
            l->m[i] = (fl_st_meta){l->mk[i], l->mv[i]};
    }
    int i = l->nm++;
    snprintf(l->mk[i], PS_META_KEY, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->mv[i], PS_META_VAL, fmt, ap);
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

/* Dense table t's metadata and its blocks' values and state (borrowed from the table). */
static int list_dense(ps_server *s, save_list *l, int t) {
    char key[PS_META_KEY], val[PS_META_VAL];
    ps_dense *d = &s->dense[t];
    ps_rule_fmt(&d->rule, val, sizeof val);
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
    return 0;
}

/* Gathers sparse table t's rows (all, or the delta's changed ones) and candidates from its
 * shard parts into buffers l owns. */
static int gather_sparse(ps_server *s, save_list *l, int t, bool delta, rows_buf *rb,
                         cand_buf *cb) {
    ps_sparse_table *sp = &s->sparse[t];
    *rb = (rows_buf){.dim = sp->dim,
                     .sr = sp->dim * fl_ps_rule_state_per_value(&sp->rule) +
                           fl_ps_rule_state_per_row(&sp->rule)};
    *cb = (cand_buf){0};
    for (int i = 0; i < s->T; i++) {
        rb->cap += fl_ps_sparse_rows(sp->parts[i]);
        cb->cap += fl_ps_sparse_candidates(sp->parts[i]);
    }
    rb->ids = own(l, (size_t)rb->cap * 8);
    rb->values = own(l, (size_t)rb->cap * (size_t)rb->dim * 4);
    rb->state = own(l, (size_t)rb->cap * (size_t)rb->sr * 4);
    rb->stat = own(l, (size_t)rb->cap * 3 * 4);
    cb->ids = own(l, (size_t)cb->cap * 8);
    cb->cnt = own(l, (size_t)cb->cap * 2 * 4);
    if (!rb->ids || !rb->values || !rb->state || !rb->stat || !cb->ids || !cb->cnt)
        return fl_fail(FL_ENOMEM, "out of memory gathering %" PRId64 " rows of sparse table "
                       "%d", rb->cap, t);
    for (int i = 0; i < s->T; i++) {
        int rc = fl_ps_sparse_visit(sp->parts[i], delta, take_row, rb);
        if (rc == 0)
            rc = fl_ps_sparse_visit_candidates(sp->parts[i], take_cand, cb);
        if (rc < 0)
            return fl_fail(rc, "gathering the rows of sparse table %d", t);
    }
    return 0;
}

/* Sparse table t's metadata, candidates and rows (all, or the delta's changed ones). */
static int list_sparse(ps_server *s, save_list *l, int t, bool delta) {
    char key[PS_META_KEY], val[PS_META_VAL];
    ps_sparse_table *sp = &s->sparse[t];
    rows_buf rb;
    cand_buf cb;
    FL_TRY(gather_sparse(s, l, t, delta, &rb, &cb));
    ps_rule_fmt(&sp->rule, val, sizeof val);
    snprintf(key, sizeof key, "sparse.%d.rule", t);
    FL_TRY(add_meta(l, key, "%s", val));
    snprintf(key, sizeof key, "sparse.%d.dim", t);
    FL_TRY(add_meta(l, key, "%d", sp->dim));
    ps_init_fmt(&sp->init, val, sizeof val);
    snprintf(key, sizeof key, "sparse.%d.init", t);
    FL_TRY(add_meta(l, key, "%s", val));
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
        return 0;
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
    return 0;
}

static int list_tables(ps_server *s, save_list *l, bool delta) {
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        if (s->dense[t].declared)
            FL_TRY(list_dense(s, l, t));
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        if (s->sparse[t].declared)
            FL_TRY(list_sparse(s, l, t, delta));
    return 0;
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
    FL_TRY(ps_write_pointer(s, &next));
    s->chain = next;
    ps_prune(s, step);
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        for (int i = 0; s->sparse[t].declared && i < s->T; i++)
            fl_ps_sparse_mark_clean(s->sparse[t].parts[i]);
    FL_INFO("ps server %d: saved step %" PRId64 " (%s) to %s", s->s, step,
            delta ? "delta" : "all", path);
    return 0;
}
