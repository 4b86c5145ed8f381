/* ps_client_sparse.c - a worker's sparse-table operations (include/fleet/ps.h): an id lives on
 * server fl_ps_shard_of(id, S). A pull or push first groups its ids into the distinct ones per
 * server (each sent once per call; a push sums the gradients and counts of an id's
 * occurrences), then asks every server involved (sync: every server, for each push); the
 * life cycle's passes (SHRINK) and STATS go to every server and their answers are summed. */
#include "ps_client.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int sparse_init_locked(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                              const fl_ps_init_rule *init, const fl_ps_sparse_opts *o) {
    FL_TRY(ps_client_need(ps));
    FL_TRY(ps_client_check_table(table));
    FL_ASSERT(r && init);
    if (dim < 1 || dim > FL_PS_MAX_DIM)
        return fl_fail(FL_EINVAL, "sparse table %d with rows of %d values (1..%d)", table, dim,
                       FL_PS_MAX_DIM);
    FL_TRY(fl_ps_rule_check(r, true));
    fl_ps_sparse_opts opts;
    if (o)
        opts = *o;
    else
        fl_ps_sparse_opts_defaults(&opts);
    int rc = fl_ps_sparse_opts_check(&opts);
    if (rc < 0)
        return fl_fail_prefix(rc, "sparse table %d", table);
    fl_ps_req q = {.type = FL_PS_MSG_SPARSE_INIT, .table = table, .dim = dim, .rule = *r,
                   .init = *init, .opts = opts};
    fl_ps_rep rep;
    FL_TRY(ps_client_all(ps, &q, &rep));
    ps->cli->sparse_dim[table] = dim;
    return 0;
}

static uint64_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Distinct ids of ids[0..n), grouped by server: c->uid[c->off[s] ..] are server s's, c->map[i]
 * the place of ids[i] among them. Returns the number of distinct ids. */
static int64_t group_ids(fl_ps *ps, const uint64_t *ids, int64_t n) {
    ps_client *c = ps->cli;
    int S = ps->nservers;
    int64_t hcap = 16;
    while (hcap < 2 * n)
        hcap *= 2;
    if (hcap > c->hcap) {
        free(c->hkey);
        free(c->hval);
        c->hkey = malloc((size_t)hcap * sizeof *c->hkey);
        c->hval = malloc((size_t)hcap * sizeof *c->hval);
        c->hcap = c->hkey && c->hval ? hcap : 0;
        if (!c->hcap)
            return fl_fail(FL_ENOMEM, "out of memory grouping %" PRId64 " ids", n);
    }
    if (n > c->ucap) {
        uint64_t *a = realloc(c->uid, (size_t)n * sizeof *a);
        if (a)
            c->uid = a;
        int32_t *b = realloc(c->userver, (size_t)n * sizeof *b);
        if (b)
            c->userver = b;
        int32_t *d = realloc(c->upos, (size_t)n * sizeof *d);
        if (d)
            c->upos = d;
        int32_t *e = realloc(c->map, (size_t)n * sizeof *e);
        if (e)
            c->map = e;
        if (!a || !b || !d || !e)
            return fl_fail(FL_ENOMEM, "out of memory grouping %" PRId64 " ids", n);
        c->ucap = n;
    }
    memset(c->hval, 0xff, (size_t)hcap * sizeof *c->hval);
    memset(c->cnt, 0, (size_t)S * sizeof *c->cnt);
    int64_t nu = 0;
    uint64_t mask = (uint64_t)hcap - 1;
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = hash64(ids[i]) & mask;
        while (c->hval[h] >= 0 && c->hkey[h] != ids[i])
            h = (h + 1) & mask;
        if (c->hval[h] < 0) {
            c->hkey[h] = ids[i];
            c->hval[h] = (int32_t)nu;
            int s = S > 1 ? fl_ps_shard_of(ids[i], S) : 0;
            c->userver[nu] = s;
            c->upos[nu] = (int32_t)c->cnt[s]++;
            c->map[i] = (int32_t)nu; /* fixed below to the grouped place */
            nu++;
        } else {
            c->map[i] = c->hval[h];
        }
    }
    c->off[0] = 0;
    for (int s = 0; s < S; s++)
        c->off[s + 1] = c->off[s] + c->cnt[s];
    /* uid grouped by server: the u-th distinct id goes to off[server] + upos */
    for (int64_t i = 0; i < n; i++) {
        int32_t u = c->map[i];
        int64_t g = c->off[c->userver[u]] + c->upos[u];
        c->uid[g] = ids[i];
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t u = c->map[i];
        c->map[i] = (int32_t)(c->off[c->userver[u]] + c->upos[u]);
    }
    return nu;
}

static int urows_reserve(ps_client *c, int64_t n) {
    if (n <= c->rowcap)
        return 0;
    float *p = realloc(c->urows, (size_t)n * sizeof *p);
    if (!p)
        return fl_fail(FL_ENOMEM, "out of memory for %" PRId64 " row values", n);
    c->urows = p;
    c->rowcap = n;
    return 0;
}

static int sparse_table(fl_ps *ps, int table, int64_t n) {
    FL_TRY(ps_client_need(ps));
    FL_TRY(ps_client_check_table(table));
    if (!ps->cli->sparse_dim[table])
        return fl_fail(FL_ESTATE, "sparse table %d used before fl_ps_sparse_init", table);
    if (n < 0 || n > INT32_MAX / 2)
        return fl_fail(FL_EINVAL, "sparse call with %" PRId64 " ids", n);
    return 0;
}

static int sparse_pull_locked(fl_ps *ps, int table, const uint64_t *ids, int64_t n,
                              float *rows) {
    FL_TRY(sparse_table(ps, table, n));
    ps_client *c = ps->cli;
    int S = ps->nservers, dim = c->sparse_dim[table];
    int64_t nu = group_ids(ps, ids, n);
    FL_TRY(nu);
    FL_TRY(urows_reserve(c, nu * dim));
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0)
            continue;
        fl_ps_req q = {.type = FL_PS_MSG_SPARSE_PULL, .table = table, .n = (uint64_t)c->cnt[s],
                       .ids = c->uid + c->off[s]};
        FL_TRY(ps_client_send(ps, s, &q));
    }
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0)
            continue;
        fl_ps_rep rep;
        FL_TRY(ps_client_recv(ps, s, FL_PS_MSG_SPARSE_PULL, &rep));
        if ((int64_t)rep.n != c->cnt[s] || rep.dim != dim)
            return fl_fail(FL_EPEER, "%s sent %" PRIu64 " rows of %d values of sparse table %d, "
                           "expected %" PRId64 " of %d", c->names[s], rep.n, rep.dim, table,
                           c->cnt[s], dim);
        memcpy(c->urows + c->off[s] * dim, rep.values, (size_t)rep.n * (size_t)dim * 4);
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(rows + i * dim, c->urows + (int64_t)c->map[i] * dim, (size_t)dim * 4);
    c->st.pulls++;
    return 0;
}

/* Sums shows[i] and clicks[i] (NULL: 1 and 0) per distinct id into c->ucounts, laid out per
 * server as the wire wants them: server s's shows at 2 * off[s], its clicks cnt[s] later. */
static int sum_counts(fl_ps *ps, const uint64_t *ids, int64_t n, int64_t nu, const float *shows,
                      const float *clicks) {
    ps_client *c = ps->cli;
    int S = ps->nservers;
    for (int64_t i = 0; i < n; i++) {
        float sh = shows ? shows[i] : 1, cl = clicks ? clicks[i] : 0;
        if (!(sh >= 0 && isfinite(sh)) || !(cl >= 0 && isfinite(cl)))
            return fl_fail(FL_EINVAL, "sparse push: occurrence %" PRId64 " (id %" PRIu64 ") has "
                           "show %g and click %g (finite, >= 0)", i, ids[i], (double)sh,
                           (double)cl);
    }
    if (2 * nu > c->countcap) {
        float *p = realloc(c->ucounts, (size_t)(2 * nu) * sizeof *p);
        if (!p)
            return fl_fail(FL_ENOMEM, "out of memory for the counts of %" PRId64 " ids", nu);
        c->ucounts = p;
        c->countcap = 2 * nu;
    }
    if (nu > 0)
        memset(c->ucounts, 0, (size_t)(2 * nu) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int s = S > 1 ? fl_ps_shard_of(ids[i], S) : 0;
        int64_t g = c->map[i], k = g - c->off[s];
        c->ucounts[2 * c->off[s] + k] += shows ? shows[i] : 1;
        c->ucounts[2 * c->off[s] + c->cnt[s] + k] += clicks ? clicks[i] : 0;
    }
    return 0;
}

static int sparse_push_locked(fl_ps *ps, int table, int64_t step, double lr,
                              const uint64_t *ids, int64_t n, const float *grads,
                              bool counted, const float *shows, const float *clicks) {
    FL_TRY(sparse_table(ps, table, n));
    FL_ASSERT(step >= 0);
    ps_client *c = ps->cli;
    int S = ps->nservers, dim = c->sparse_dim[table];
    int64_t nu = group_ids(ps, ids, n);
    FL_TRY(nu);
    FL_TRY(urows_reserve(c, nu * dim));
    if (counted)
        FL_TRY(sum_counts(ps, ids, n, nu, shows, clicks));
    memset(c->urows, 0, (size_t)(nu * dim) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float *u = c->urows + (int64_t)c->map[i] * dim;
        const float *g = grads + i * dim;
        for (int k = 0; k < dim; k++)
            u[k] += g[k];
    }
    /* sync: every server counts every worker's push of the step, with ids or without */
    bool all = c->mode == FL_PS_SYNC;
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0 && !all)
            continue;
        fl_ps_req q = {.type = FL_PS_MSG_SPARSE_PUSH, .table = table, .step = step, .lr = lr,
                       .n = (uint64_t)c->cnt[s], .dim = dim, .ids = c->uid + c->off[s],
                       .values = c->urows + c->off[s] * dim,
                       .counts = counted && c->cnt[s] > 0 ? c->ucounts + 2 * c->off[s]
                                                          : NULL};
        FL_TRY(ps_client_send(ps, s, &q));
    }
    int64_t stale = 0;
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0 && !all)
            continue;
        fl_ps_rep rep;
        FL_TRY(ps_client_recv(ps, s, FL_PS_MSG_SPARSE_PUSH, &rep));
        if (rep.staleness > stale)
            stale = rep.staleness;
    }
    ps_client_count_push(c, stale);
    return 0;
}

/* ---- the life cycle ---- */

/* SHRINK or STATS to every server, the replies summed. */
static int table_pass_locked(fl_ps *ps, int type, int table, int64_t *removed, int64_t *rows,
                             int64_t *bytes) {
    FL_TRY(sparse_table(ps, table, 0));
    fl_ps_req q = {.type = type, .table = table};
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(ps_client_send(ps, s, &q));
    int64_t sum[3] = {0, 0, 0};
    for (int s = 0; s < ps->nservers; s++) {
        fl_ps_rep rep;
        FL_TRY(ps_client_recv(ps, s, type, &rep));
        sum[0] += (int64_t)rep.removed;
        sum[1] += (int64_t)rep.rows;
        sum[2] += (int64_t)rep.bytes;
    }
    if (removed)
        *removed = sum[0];
    if (rows)
        *rows = sum[1];
    if (bytes)
        *bytes = sum[2];
    return 0;
}

int fl_ps_sparse_init(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                      const fl_ps_init_rule *init) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, sparse_init_locked(ps, table, dim, r, init, NULL));
}

int fl_ps_sparse_init_opts(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                           const fl_ps_init_rule *init, const fl_ps_sparse_opts *o) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, sparse_init_locked(ps, table, dim, r, init, o));
}

int fl_ps_sparse_pull(fl_ps *ps, int table, const uint64_t *ids, int64_t n, float *rows) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, sparse_pull_locked(ps, table, ids, n, rows));
}

int fl_ps_sparse_push(fl_ps *ps, int table, int64_t step, double lr, const uint64_t *ids,
                      int64_t n, const float *grads) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, sparse_push_locked(ps, table, step, lr, ids, n, grads, false,
                                                   NULL, NULL));
}

int fl_ps_sparse_push_counts(fl_ps *ps, int table, int64_t step, double lr,
                             const uint64_t *ids, int64_t n, const float *grads,
                             const float *shows, const float *clicks) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, sparse_push_locked(ps, table, step, lr, ids, n, grads, true,
                                                   shows, clicks));
}

int fl_ps_sparse_shrink(fl_ps *ps, int table, int64_t *removed) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, table_pass_locked(ps, FL_PS_MSG_SHRINK, table, removed, NULL,
                                                  NULL));
}

int fl_ps_sparse_stats(fl_ps *ps, int table, int64_t *rows, int64_t *bytes) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, table_pass_locked(ps, FL_PS_MSG_STATS, table, NULL, rows,
                                                  bytes));
}
