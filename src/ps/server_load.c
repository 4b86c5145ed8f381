/* server_load.c - a parameter server's restart: the chain of checkpoint files its pointer
 * names (server_pointer.c), or the one full save of the step the workers resume from, read
 * back into its tables (the layout is in server_save.c). Each file must be this server's (of
 * this many servers), a chain must start with a full save, and a table must agree with the one
 * it builds on; a refusal names the file. */
#include "server.h"

#include "fleet/log.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int load_dense(ps_server *s, const fl_safetensors *st, int t) {
    char key[PS_META_KEY];
    const char *path = fl_safetensors_path(st);
    int64_t numel, version;
    snprintf(key, sizeof key, "dense.%d.numel", t);
    if (ps_meta_i64(st, key, &numel) < 0)
        return 0; /* not in this file */
    snprintf(key, sizeof key, "dense.%d.version", t);
    fl_ps_rule r;
    if (ps_meta_i64(st, key, &version) < 0 || version < 0 || numel < 1 ||
        numel > ((int64_t)1 << 40))
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

/* What a file says of sparse table t besides its rows. */
typedef struct {
    int64_t dim, version, rows, passes, cands;
    fl_ps_rule rule;
    fl_ps_init_rule init;
    fl_ps_sparse_opts opts;
} sparse_meta;

/* Sparse table t's metadata in st: 1, 0 when the file has no such table, or FL_EFORMAT. */
static int read_sparse_meta(const fl_safetensors *st, int t, sparse_meta *m) {
    char key[PS_META_KEY];
    const char *path = fl_safetensors_path(st);
    snprintf(key, sizeof key, "sparse.%d.dim", t);
    if (ps_meta_i64(st, key, &m->dim) < 0)
        return 0;
    snprintf(key, sizeof key, "sparse.%d.version", t);
    int rc1 = ps_meta_i64(st, key, &m->version);
    snprintf(key, sizeof key, "sparse.%d.rows", t);
    if (rc1 < 0 || ps_meta_i64(st, key, &m->rows) < 0 || m->dim < 1 || m->dim > 4096 ||
        m->version < 0 || m->rows < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has no valid dim/version/rows", path, t);
    snprintf(key, sizeof key, "sparse.%d.rule", t);
    FL_TRY(ps_parse_rule(st, key, &m->rule));
    snprintf(key, sizeof key, "sparse.%d.init", t);
    FL_TRY(ps_parse_init(st, key, &m->init));
    snprintf(key, sizeof key, "sparse.%d.opts", t);
    FL_TRY(ps_parse_opts(st, key, &m->opts));
    m->passes = m->cands = 0;
    snprintf(key, sizeof key, "sparse.%d.passes", t);
    if (ps_meta_i64(st, key, &m->passes) == FL_EFORMAT || m->passes < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d: bad %s", path, t, key);
    snprintf(key, sizeof key, "sparse.%d.cands", t);
    if (ps_meta_i64(st, key, &m->cands) == FL_EFORMAT || m->cands < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d: bad %s", path, t, key);
    return 1;
}

/* Sparse table t's tensors in st: its rows' ids, values, state (sr per row) and counters (stat:
 * NULL in an older save), and its entry candidates' ids and counts. */
typedef struct {
    const fl_st_tensor *ids, *values, *state, *stat, *cand_ids, *cand;
} sparse_tensors;

static int find_sparse_tensors(const fl_safetensors *st, int t, const sparse_meta *m,
                               int64_t sr, sparse_tensors *x) {
    char key[PS_META_KEY];
    const char *path = fl_safetensors_path(st);
    int64_t rows = m->rows, cands = m->cands, dim = m->dim;
    *x = (sparse_tensors){0};
    if (rows > 0) {
        snprintf(key, sizeof key, "sparse.%d.stat", t);
        x->stat = fl_safetensors_find(st, key); /* absent in an older save: zero counters */
        if (x->stat && (x->stat->dtype != FL_DTYPE_F32 || x->stat->numel != rows * 3))
            return fl_fail(FL_EFORMAT, "%s: tensor %s is not F32 [%" PRId64 ", 3]", path, key,
                           rows);
    }
    if (cands > 0) {
        snprintf(key, sizeof key, "sparse.%d.cand_ids", t);
        const fl_st_tensor *cid = x->cand_ids = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.cand", t);
        const fl_st_tensor *ccnt = x->cand = fl_safetensors_find(st, key);
        if (!cid || cid->dtype != FL_DTYPE_I64 || cid->numel != cands || !ccnt ||
            ccnt->dtype != FL_DTYPE_F32 || ccnt->numel != cands * 2)
            return fl_fail(FL_EFORMAT, "%s: the %" PRId64 " entry candidates of sparse table %d "
                           "are missing or of the wrong shape", path, cands, t);
    }
    if (rows > 0) {
        snprintf(key, sizeof key, "sparse.%d.ids", t);
        const fl_st_tensor *ti = x->ids = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.values", t);
        const fl_st_tensor *tv = x->values = fl_safetensors_find(st, key);
        snprintf(key, sizeof key, "sparse.%d.state", t);
        const fl_st_tensor *ts = x->state = sr ? fl_safetensors_find(st, key) : NULL;
        if (!ti || ti->dtype != FL_DTYPE_I64 || ti->numel != rows || !tv ||
            tv->dtype != FL_DTYPE_F32 || tv->numel != rows * dim ||
            (sr && (!ts || ts->dtype != FL_DTYPE_F32 || ts->numel != rows * sr)))
            return fl_fail(FL_EFORMAT, "%s: the rows of sparse table %d are missing or do not "
                           "match %" PRId64 " rows of dim %" PRId64, path, t, rows, dim);
    }
    return 0;
}

/* Puts the file's rows into the shard parts of sparse table t, each checked to be this
 * server's. */
static int put_rows(ps_server *s, const char *path, int t, const sparse_meta *m, int64_t sr,
                    const sparse_tensors *x) {
    ps_sparse_table *sp = &s->sparse[t];
    int64_t dim = m->dim;
    float *vals = malloc((size_t)(dim + sr) * sizeof(float));
    if (!vals)
        return fl_fail(FL_ENOMEM, "out of memory");
    int rc = 0;
    for (int64_t i = 0; rc == 0 && i < m->rows; i++) {
        uint64_t id;
        memcpy(&id, (const char *)x->ids->data + i * 8, 8);
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s) {
            rc = fl_fail(FL_EFORMAT, "%s: id %" PRIu64 " of sparse table %d belongs to server "
                         "%d, not %d", path, id, t, fl_ps_shard_of(id, s->S), s->s);
            break;
        }
        memcpy(vals, (const char *)x->values->data + i * dim * 4, (size_t)dim * 4);
        if (sr)
            memcpy(vals + dim, (const char *)x->state->data + i * sr * 4, (size_t)sr * 4);
        int th = s->T > 1 ? fl_ps_thread_of(id, s->T) : 0;
        fl_ps_row_stat rs = {0, 0, 0};
        if (x->stat) {
            float c3[3];
            memcpy(c3, (const char *)x->stat->data + i * 12, 12);
            rs = (fl_ps_row_stat){c3[0], c3[1], (int)c3[2]};
        }
        rc = fl_ps_sparse_put(sp->parts[th], id, vals, sr ? vals + dim : NULL, &rs);
    }
    free(vals);
    return rc;
}

/* Replaces the candidates of sparse table t with the file's (each save holds every candidate:
 * the last file's replace the ones before) and sets its passes. */
static int put_candidates(ps_server *s, const char *path, int t, const sparse_meta *m,
                          const sparse_tensors *x) {
    ps_sparse_table *sp = &s->sparse[t];
    for (int i = 0; i < s->T; i++) {
        fl_ps_sparse_clear_candidates(sp->parts[i]);
        fl_ps_sparse_set_passes(sp->parts[i], m->passes);
    }
    for (int64_t i = 0; i < m->cands; i++) {
        uint64_t id;
        float c2[2];
        memcpy(&id, (const char *)x->cand_ids->data + i * 8, 8);
        memcpy(c2, (const char *)x->cand->data + i * 8, 8);
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s)
            return fl_fail(FL_EFORMAT, "%s: candidate id %" PRIu64 " of sparse table %d belongs "
                           "to server %d, not %d", path, id, t, fl_ps_shard_of(id, s->S), s->s);
        int th = s->T > 1 ? fl_ps_thread_of(id, s->T) : 0;
        FL_TRY(fl_ps_sparse_put_candidate(sp->parts[th], id, c2[0], (int)c2[1]));
    }
    return 0;
}

static int load_sparse(ps_server *s, const fl_safetensors *st, int t) {
    const char *path = fl_safetensors_path(st);
    sparse_meta m;
    int have = read_sparse_meta(st, t, &m);
    if (have <= 0)
        return have;
    ps_sparse_table *sp = &s->sparse[t];
    if (!sp->declared) {
        FL_TRY(ps_sparse_table_create(s, t, sp, (int)m.dim, &m.rule, &m.init, &m.opts));
    } else if (sp->dim != m.dim || !ps_rule_equal(&sp->rule, &m.rule) ||
               !ps_opts_equal(&sp->opts, &m.opts)) {
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has rows of %" PRId64 ", the save it "
                       "builds on %d (or another rule or life cycle)", path, t, m.dim, sp->dim);
    }
    int64_t sr = m.dim * fl_ps_rule_state_per_value(&m.rule) + fl_ps_rule_state_per_row(&m.rule);
    sparse_tensors x;
    FL_TRY(find_sparse_tensors(st, t, &m, sr, &x));
    FL_TRY(put_rows(s, path, t, &m, sr, &x));
    FL_TRY(put_candidates(s, path, t, &m, &x));
    sp->sy.version = m.version;
    for (int w = 0; w < s->W; w++) { /* sync: every worker pushed each update applied */
        sp->sy.last_pull[w] = m.version;
        sp->sy.pushes_by[w] = m.version;
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
