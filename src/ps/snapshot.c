/* snapshot.c - a parameter-server job's saved tables read back whole, off line (fleet-ckpt
 * merge-ps): every server's shards of one step (server_save.c's files: its chain when its
 * pointer is at that step, else its full save of the step), each dense table assembled in
 * table order (block b from server b % S) and each sparse table as its rows sorted by id, a
 * delta's rows replacing the rows of the saves before it. Every file is checked against the
 * others (server count, step, each table's shape and rule) before its values are used. */
#define _GNU_SOURCE /* qsort_r */
#include "server.h"

#include "fleet/ps.h"
#include "fleet/safetensors.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEY_LEN 64

/* Sparse rows gathered from every file, in file order (a later row of an id wins). */
typedef struct {
    int64_t *ids;
    float   *values;
    int64_t  n, cap;
} rows_acc;

typedef struct {
    const char     *dir;
    fl_ps_snapshot *out;
    int             S;
    rows_acc        acc[FL_PS_MAX_TABLES];
    unsigned char  *seen_dense, *seen_sparse; /* [FL_PS_MAX_TABLES * S]: tables per server */
} loader;

void fl_ps_snapshot_clear(fl_ps_snapshot *s) {
    if (!s)
        return;
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        free(s->dense[t].values);
        free(s->sparse[t].ids);
        free(s->sparse[t].values);
    }
    memset(s, 0, sizeof *s);
}

/* The files of server s's save of `step` (-1: the step its pointer names) into *c. */
static int chain_of(loader *L, int s, int64_t step, ps_chain *c) {
    ps_chain p;
    bool have;
    int S = L->S;
    FL_TRY(ps_read_pointer(L->dir, s, &S, &p, &have));
    if (step < 0) {
        if (!have)
            return fl_fail(FL_EIO, "%s/ps.server%d.latest: missing: server %d has no saved "
                           "step to merge", L->dir, s, s);
        *c = p;
        return 0;
    }
    if (have && p.step == step) {
        *c = p;
        return 0;
    }
    char file[96], path[1200], why[96];
    if (have)
        snprintf(why, sizeof why, "ps.server%d.latest is at step %" PRId64, s, p.step);
    else
        snprintf(why, sizeof why, "nor is ps.server%d.latest", s);
    snprintf(file, sizeof file, "ps.server%d.%" PRId64 ".delta.safetensors", s, step);
    snprintf(path, sizeof path, "%s/%s", L->dir, file);
    if (access(path, F_OK) == 0)
        return fl_fail(FL_EFORMAT, "%s is a delta save, and %s, not the chain it builds on: "
                       "merge the pointer's step or a full save", path, why);
    snprintf(file, sizeof file, "ps.server%d.%" PRId64 ".safetensors", s, step);
    snprintf(path, sizeof path, "%s/%s", L->dir, file);
    if (access(path, F_OK) != 0)
        return fl_fail(FL_EIO, "server %d has no shards of step %" PRId64 ": %s is missing (%s)",
                       s, step, path, why);
    *c = (ps_chain){.n = 1, .step = step};
    snprintf(c->files[0], sizeof c->files[0], "%s", file);
    return 0;
}

static int add_dense(loader *L, const fl_safetensors *st, int s, int t) {
    char key[KEY_LEN];
    const char *path = fl_safetensors_path(st);
    int64_t numel, version;
    snprintf(key, sizeof key, "dense.%d.numel", t);
    if (ps_meta_i64(st, key, &numel) < 0)
        return 0;
    snprintf(key, sizeof key, "dense.%d.version", t);
    if (ps_meta_i64(st, key, &version) < 0 || version < 0 || numel < 1 ||
        numel > ((int64_t)1 << 40))
        return fl_fail(FL_EFORMAT, "%s: dense table %d has no valid numel/version", path, t);
    fl_ps_rule r;
    snprintf(key, sizeof key, "dense.%d.rule", t);
    FL_TRY(ps_parse_rule(st, key, &r));
    fl_ps_dense_snapshot *d = &L->out->dense[t];
    if (!d->present) {
        d->values = calloc((size_t)numel, sizeof *d->values);
        if (!d->values)
            return fl_fail(FL_ENOMEM, "out of memory for dense table %d (%" PRId64 " values)", t,
                           numel);
        d->present = true;
        d->numel = numel;
        d->rule = r;
        d->version_min = d->version_max = version;
    } else if (d->numel != numel || !ps_rule_equal(&d->rule, &r)) {
        return fl_fail(FL_EFORMAT, "%s: dense table %d has %" PRId64 " values (or another rule); "
                       "the shards read before it say %" PRId64, path, t, numel, d->numel);
    }
    if (version < d->version_min)
        d->version_min = version;
    if (version > d->version_max)
        d->version_max = version;
    int64_t nb = (numel + FL_PS_DENSE_BLOCK - 1) / FL_PS_DENSE_BLOCK;
    for (int64_t b = s; b < nb; b += L->S) {
        int64_t n = b + 1 < nb ? FL_PS_DENSE_BLOCK : numel - b * FL_PS_DENSE_BLOCK;
        snprintf(key, sizeof key, "dense.%d.%" PRId64 ".value", t, b);
        const fl_st_tensor *v = fl_safetensors_find(st, key);
        if (!v || v->dtype != FL_DTYPE_F32 || v->numel != n)
            return fl_fail(FL_EFORMAT, "%s: tensor %s is missing or not F32 [%" PRId64 "] (block "
                           "%" PRId64 " of %" PRId64 " values of dense table %d)", path, key, n,
                           b, numel, t);
        memcpy(d->values + b * FL_PS_DENSE_BLOCK, v->data, (size_t)n * sizeof(float));
    }
    L->seen_dense[t * L->S + s] = 1;
    return 0;
}

static int add_sparse(loader *L, const fl_safetensors *st, int s, int t) {
    char key[KEY_LEN];
    const char *path = fl_safetensors_path(st);
    int64_t dim, rows;
    snprintf(key, sizeof key, "sparse.%d.dim", t);
    if (ps_meta_i64(st, key, &dim) < 0)
        return 0;
    snprintf(key, sizeof key, "sparse.%d.rows", t);
    if (ps_meta_i64(st, key, &rows) < 0 || dim < 1 || dim > 4096 || rows < 0)
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has no valid dim/rows", path, t);
    fl_ps_rule r;
    fl_ps_init_rule init;
    snprintf(key, sizeof key, "sparse.%d.rule", t);
    FL_TRY(ps_parse_rule(st, key, &r));
    snprintf(key, sizeof key, "sparse.%d.init", t);
    FL_TRY(ps_parse_init(st, key, &init));
    fl_ps_sparse_snapshot *sp = &L->out->sparse[t];
    if (!sp->present) {
        sp->present = true;
        sp->dim = (int)dim;
        sp->rule = r;
        sp->init = init;
    } else if (sp->dim != dim || !ps_rule_equal(&sp->rule, &r)) {
        return fl_fail(FL_EFORMAT, "%s: sparse table %d has rows of %" PRId64 " (or another "
                       "rule); the shards read before it say %d", path, t, dim, sp->dim);
    }
    L->seen_sparse[t * L->S + s] = 1;
    if (rows == 0)
        return 0;
    snprintf(key, sizeof key, "sparse.%d.ids", t);
    const fl_st_tensor *ti = fl_safetensors_find(st, key);
    snprintf(key, sizeof key, "sparse.%d.values", t);
    const fl_st_tensor *tv = fl_safetensors_find(st, key);
    if (!ti || ti->dtype != FL_DTYPE_I64 || ti->numel != rows || !tv ||
        tv->dtype != FL_DTYPE_F32 || tv->numel != rows * dim)
        return fl_fail(FL_EFORMAT, "%s: the rows of sparse table %d are missing or do not match "
                       "%" PRId64 " rows of dim %" PRId64, path, t, rows, dim);
    rows_acc *a = &L->acc[t];
    if (a->n + rows > a->cap) {
        int64_t c = a->cap ? a->cap : 1024;
        while (c < a->n + rows)
            c *= 2;
        int64_t *ids = realloc(a->ids, (size_t)c * sizeof *ids);
        if (ids)
            a->ids = ids;
        float *v = realloc(a->values, (size_t)c * (size_t)dim * sizeof *v);
        if (v)
            a->values = v;
        if (!ids || !v)
            return fl_fail(FL_ENOMEM, "out of memory for %" PRId64 " rows of sparse table %d", c,
                           t);
        a->cap = c;
    }
    for (int64_t i = 0; i < rows; i++) {
        uint64_t id;
        memcpy(&id, (const char *)ti->data + i * 8, 8);
        if (L->S > 1 && fl_ps_shard_of(id, L->S) != s)
            return fl_fail(FL_EFORMAT, "%s: id %" PRIu64 " of sparse table %d belongs to server "
                           "%d, not %d", path, id, t, fl_ps_shard_of(id, L->S), s);
        a->ids[a->n + i] = (int64_t)id;
    }
    memcpy(a->values + a->n * dim, tv->data, (size_t)(rows * dim) * sizeof(float));
    a->n += rows;
    return 0;
}

/* One file of server s's chain; the last must hold `step`, the first be a full save. */
static int add_file(loader *L, int s, const char *file, bool first, bool last, int64_t step) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", L->dir, file);
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    int64_t server = -1, servers = -1, saved = -1;
    const char *kind = fl_safetensors_meta(st, "fleet.ps.kind");
    int rc = 0;
    if (ps_meta_i64(st, "fleet.ps.server", &server) < 0 ||
        ps_meta_i64(st, "fleet.ps.servers", &servers) < 0 ||
        ps_meta_i64(st, "fleet.ps.step", &saved) < 0 || !kind)
        rc = fl_fail(FL_EFORMAT, "%s: not a parameter-server checkpoint (no fleet.ps.* "
                     "metadata)", path);
    else if (L->S == 0 && (servers < 1 || servers > FL_PS_MAX_SERVERS))
        rc = fl_fail(FL_EFORMAT, "%s: fleet.ps.servers %" PRId64 "?", path, servers);
    else if (server != s || (L->S && servers != L->S))
        rc = fl_fail(FL_EFORMAT, "%s holds server %" PRId64 " of %" PRId64 "'s shards, not "
                     "server %d of %d's", path, server, servers, s, L->S ? L->S : (int)servers);
    else if (last ? saved != step : saved >= step)
        rc = fl_fail(FL_EFORMAT, "%s holds step %" PRId64 ", but the step merged is %" PRId64,
                     path, saved, step);
    else if (first && strcmp(kind, "all") != 0)
        rc = fl_fail(FL_EFORMAT, "%s: the chain starts with a %s save, not a full one", path,
                     kind);
    if (rc == 0 && L->S == 0) {
        L->S = (int)servers;
        L->seen_dense = calloc((size_t)FL_PS_MAX_TABLES * (size_t)L->S, 1);
        L->seen_sparse = calloc((size_t)FL_PS_MAX_TABLES * (size_t)L->S, 1);
        if (!L->seen_dense || !L->seen_sparse)
            rc = fl_fail(FL_ENOMEM, "out of memory");
    }
    for (int t = 0; rc == 0 && t < FL_PS_MAX_TABLES; t++) {
        rc = add_dense(L, st, s, t);
        if (rc == 0)
            rc = add_sparse(L, st, s, t);
    }
    fl_safetensors_close(st);
    return rc;
}

static int cmp_row(const void *a, const void *b, void *ctx) {
    const int64_t *ids = ctx, x = *(const int64_t *)a, y = *(const int64_t *)b;
    if (ids[x] != ids[y])
        return ids[x] < ids[y] ? -1 : 1;
    return x < y ? -1 : x > y; /* file order: the later row last */
}

/* The rows of table t sorted by id, the last row of each id kept. */
static int finish_sparse(loader *L, int t) {
    rows_acc *a = &L->acc[t];
    fl_ps_sparse_snapshot *sp = &L->out->sparse[t];
    int64_t *order = malloc((size_t)(a->n + 1) * sizeof *order);
    sp->ids = malloc((size_t)(a->n + 1) * sizeof *sp->ids);
    sp->values = malloc((size_t)(a->n * sp->dim + 1) * sizeof *sp->values);
    if (!order || !sp->ids || !sp->values) {
        free(order);
        return fl_fail(FL_ENOMEM, "out of memory for sparse table %d", t);
    }
    for (int64_t i = 0; i < a->n; i++)
        order[i] = i;
    qsort_r(order, (size_t)a->n, sizeof *order, cmp_row, a->ids);
    int64_t n = 0;
    for (int64_t i = 0; i < a->n; i++) {
        int64_t r = order[i];
        if (i + 1 < a->n && a->ids[order[i + 1]] == a->ids[r])
            continue; /* a later save has this id again */
        sp->ids[n] = a->ids[r];
        memcpy(sp->values + n * sp->dim, a->values + r * sp->dim,
               (size_t)sp->dim * sizeof(float));
        n++;
    }
    sp->rows = n;
    free(order);
    return 0;
}

/* Every table on every server, or on none (workers declare each table to all servers). */
static int check_everywhere(loader *L, int64_t step) {
    for (int t = 0; t < FL_PS_MAX_TABLES; t++)
        for (int k = 0; k < 2; k++) {
            bool present = k ? L->out->sparse[t].present : L->out->dense[t].present;
            const unsigned char *seen = k ? L->seen_sparse : L->seen_dense;
            for (int s = 0; present && s < L->S; s++)
                if (!seen[t * L->S + s])
                    return fl_fail(FL_EFORMAT, "%s/ps.server%d.*: server %d's shards of step "
                                   "%" PRId64 " have no %s table %d, which other servers' have",
                                   L->dir, s, s, step, k ? "sparse" : "dense", t);
        }
    return 0;
}

int fl_ps_snapshot_load(const char *dir, int64_t step, fl_ps_snapshot *out) {
    FL_ASSERT(dir && out);
    memset(out, 0, sizeof *out);
    loader L = {.dir = dir, .out = out};
    ps_chain *c = malloc(sizeof *c);
    int rc = c ? 0 : fl_fail(FL_ENOMEM, "out of memory");
    int64_t want = step;
    for (int s = 0; rc == 0 && (s == 0 || s < L.S); s++) {
        rc = chain_of(&L, s, want, c);
        if (rc == 0 && want < 0) {
            want = c->step; /* server 0's pointer: the others' must say the same */
        } else if (rc == 0 && step < 0 && c->step != want) {
            rc = fl_fail(FL_EFORMAT, "%s/ps.server%d.latest is at step %" PRId64 ", "
                         "ps.server0.latest at step %" PRId64 ": the servers' newest saves "
                         "disagree (a save cut short?); merge a step every server holds",
                         dir, s, c->step, want);
        }
        for (int i = 0; rc == 0 && i < c->n; i++)
            rc = add_file(&L, s, c->files[i], i == 0, i == c->n - 1, want);
    }
    if (rc == 0)
        rc = check_everywhere(&L, want);
    for (int t = 0; rc == 0 && t < FL_PS_MAX_TABLES; t++)
        if (out->sparse[t].present)
            rc = finish_sparse(&L, t);
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        free(L.acc[t].ids);
        free(L.acc[t].values);
    }
    free(L.seen_dense);
    free(L.seen_sparse);
    free(c);
    if (rc < 0) {
        fl_ps_snapshot_clear(out);
        return rc;
    }
    out->step = want;
    out->servers = L.S;
    return 0;
}
