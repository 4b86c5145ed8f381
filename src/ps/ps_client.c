/* ps_client.c - a worker's side of the parameter server: connections to every server, and the
 * table operations split over them (dense tables by blocks, sparse tables by id, each id sent
 * once per call). Every operation sends its requests to all the servers it involves first and
 * collects the replies after, so the servers work in parallel; a server that fails, closes or
 * stays silent past FLEET_COMM_TIMEOUT is named ("server 1 (127.0.0.1:6170)"). Calls on one
 * handle may come from several threads (async: the communicator's pushes and pulls, the
 * training thread's SAVE): each runs whole under the client's lock, its request and reply
 * never interleaved with another's. */
#include "ps_impl.h"
#include "ps_wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPLY_SLACK_S 2.0 /* a server's own verdict on a silent worker comes first */

typedef struct ps_client {
    fl_ps_mode    mode;
    int           S;
    fl_msg_conn **conns;      /* [S] */
    char        (*names)[FL_ENDPOINT_MAX + 32];
    void        **rbuf;       /* [S] */
    size_t       *rcap;
    int64_t       dense_numel[FL_PS_MAX_TABLES]; /* 0: not declared */
    int           sparse_dim[FL_PS_MAX_TABLES];
    fl_msg_part  *parts;      /* dense: head + a block per part */
    int64_t       parts_cap;
    /* a sparse call's distinct ids, grouped by server */
    uint64_t     *hkey;       /* open-addressing index of distinct ids */
    int32_t      *hval;
    int64_t       hcap;
    uint64_t     *uid;        /* [nuniq] grouped by server after grouping */
    int32_t      *userver, *upos, *map;
    float        *urows;
    float        *ucounts;    /* per server: its distinct ids' shows, then their clicks */
    int64_t       ucap, mapcap, rowcap, countcap;
    int64_t      *cnt, *off;  /* [S] */
    fl_ps_stats   st;
    double        stale_sum;
    pthread_mutex_t call;     /* held for each whole operation (recursive) */
} ps_client;

/* ---- connections ---- */

static int send_req(fl_ps *ps, int s, const fl_ps_req *q) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[FL_PS_REQ_PARTS];
    int np = fl_ps_req_encode(q, head, sp);
    fl_msg_part parts[FL_PS_REQ_PARTS];
    for (int i = 0; i < np; i++)
        parts[i] = (fl_msg_part){sp[i].p, sp[i].n};
    return fl_msg_sendv(ps->cli->conns[s], parts, np);
}

/* The reply of server s to a `type` request; FL_EPEER carrying the server's message. */
static int recv_rep(fl_ps *ps, int s, int type, fl_ps_rep *rep) {
    ps_client *c = ps->cli;
    size_t n = 0;
    int rc = fl_msg_recv(c->conns[s], &c->rbuf[s], &c->rcap[s], &n,
                         ps->msg.timeout_s + REPLY_SLACK_S);
    if (rc == 0)
        return fl_fail(FL_EPEER, "%s closed the connection (waiting for its %s reply)",
                       c->names[s], fl_ps_msg_name(type));
    if (rc < 0)
        return fl_fail_prefix(rc, "worker %d waiting for the %s reply of %s", ps->index,
                              fl_ps_msg_name(type), c->names[s]);
    char why[256];
    if (fl_ps_rep_parse(c->rbuf[s], n, type, rep, why, sizeof why) < 0)
        return fl_fail(FL_EPEER, "%s sent a malformed reply: %s", c->names[s], why);
    if (rep->status)
        return fl_fail(FL_EPEER, "%s refused %s: %.*s", c->names[s], fl_ps_msg_name(type),
                       (int)rep->err_len, rep->err);
    return 0;
}

/* Sends q to every server and collects the replies (no payload of interest). */
static int all_servers(fl_ps *ps, const fl_ps_req *q, fl_ps_rep *last) {
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(send_req(ps, s, q));
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(recv_rep(ps, s, q->type, last));
    return 0;
}

static int need_worker(const fl_ps *ps) {
    if (!ps->cli)
        return fl_fail(FL_ESTATE, "parameter-server call before fl_ps_init_worker");
    return 0;
}

int fl_ps_init_worker(fl_ps *ps, fl_ps_mode mode) {
    FL_ASSERT(ps);
    if (ps->server)
        return fl_fail(FL_ESTATE, "fl_ps_init_worker on a server (TRAINING_ROLE=PSERVER)");
    if (ps->cli)
        return fl_fail(FL_ESTATE, "fl_ps_init_worker called twice");
    if (mode < FL_PS_SYNC || mode > FL_PS_GEO)
        return fl_fail(FL_ECONFIG, "unknown parameter-server mode %d", (int)mode);
    int S = ps->nservers;
    ps_client *c = calloc(1, sizeof *c);
    if (!c)
        return fl_fail(FL_ENOMEM, "out of memory");
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&c->call, &ma);
    pthread_mutexattr_destroy(&ma);
    ps->cli = c;
    c->mode = mode;
    c->S = S;
    c->conns = calloc((size_t)S, sizeof *c->conns);
    c->names = calloc((size_t)S, sizeof *c->names);
    c->rbuf = calloc((size_t)S, sizeof *c->rbuf);
    c->rcap = calloc((size_t)S, sizeof *c->rcap);
    c->cnt = calloc((size_t)S, sizeof *c->cnt);
    c->off = calloc((size_t)S + 1, sizeof *c->off);
    if (!c->conns || !c->names || !c->rbuf || !c->rcap || !c->cnt || !c->off)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (int s = 0; s < S; s++) {
        snprintf(c->names[s], sizeof c->names[s], "server %d (%s)", s, ps->servers[s]);
        FL_TRY(fl_msg_connect(&ps->msg, S + ps->index, s, ps->servers[s], &c->conns[s]));
        fl_msg_set_name(c->conns[s], c->names[s]);
    }
    fl_ps_req q = {.type = FL_PS_MSG_HELLO, .worker = ps->index, .mode = mode, .servers = S,
                   .workers = ps->nworkers, .version = FL_PS_WIRE_VERSION};
    fl_ps_rep rep;
    FL_TRY(all_servers(ps, &q, &rep));
    FL_INFO("ps worker %d: connected to %d server%s (%s mode)", ps->index, S, S == 1 ? "" : "s",
            fl_ps_mode_name(mode));
    return 0;
}

static int stop_worker_locked(fl_ps *ps) {
    FL_TRY(need_worker(ps));
    ps_client *c = ps->cli;
    fl_ps_req q = {.type = FL_PS_MSG_STOP};
    fl_ps_rep rep;
    int rc = all_servers(ps, &q, &rep);
    fl_ps_stats st;
    fl_ps_get_stats(ps, &st);
    c->st = st; /* keep the counters after the connections are gone */
    for (int s = 0; s < ps->nservers; s++) {
        fl_msg_close(c->conns[s]);
        c->conns[s] = NULL;
    }
    return rc;
}

void fl_ps_client_free(ps_client *c) {
    if (!c)
        return;
    for (int s = 0; c->conns && c->rbuf && s < c->S; s++) {
        fl_msg_close(c->conns[s]);
        free(c->rbuf[s]);
    }
    free(c->conns);
    free(c->names);
    free(c->rbuf);
    free(c->rcap);
    free(c->parts);
    free(c->hkey);
    free(c->hval);
    free(c->uid);
    free(c->userver);
    free(c->upos);
    free(c->map);
    free(c->urows);
    free(c->ucounts);
    free(c->cnt);
    free(c->off);
    pthread_mutex_destroy(&c->call);
    free(c);
}

/* ---- dense ---- */

static int check_table(int table) {
    if (table < 0 || table >= FL_PS_MAX_TABLES)
        return fl_fail(FL_EINVAL, "table %d out of range (0..%d)", table, FL_PS_MAX_TABLES - 1);
    return 0;
}

/* Values of a dense table of numel on server s. */
static int64_t dense_local(int64_t numel, int S, int s) {
    int64_t nb = (numel + FL_PS_DENSE_BLOCK - 1) / FL_PS_DENSE_BLOCK, n = 0;
    for (int64_t b = s; b < nb; b += S)
        n += (b + 1) * FL_PS_DENSE_BLOCK <= numel ? FL_PS_DENSE_BLOCK
                                                  : numel - b * FL_PS_DENSE_BLOCK;
    return n;
}

/* Sends q (DENSE_INIT or DENSE_PUSH) to server s with values[] of the whole table: this
 * server's blocks, gathered by the connection without a copy. */
static int send_dense(fl_ps *ps, int s, fl_ps_req *q, int64_t numel, const float *values) {
    ps_client *c = ps->cli;
    int S = ps->nservers;
    int64_t nb = (numel + FL_PS_DENSE_BLOCK - 1) / FL_PS_DENSE_BLOCK;
    int64_t np = (nb - s + S - 1) / S + 1;
    if (np > c->parts_cap) {
        fl_msg_part *p = realloc(c->parts, (size_t)np * sizeof *p);
        if (!p)
            return fl_fail(FL_ENOMEM, "out of memory");
        c->parts = p;
        c->parts_cap = np;
    }
    q->n = values ? (uint64_t)dense_local(numel, S, s) : 0;
    q->values = NULL;
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[FL_PS_REQ_PARTS];
    fl_ps_req_encode(q, head, sp);
    int k = 0;
    c->parts[k++] = (fl_msg_part){sp[0].p, sp[0].n};
    for (int64_t b = s; values && b < nb; b += S) {
        int64_t off = b * FL_PS_DENSE_BLOCK;
        int64_t n = numel - off < FL_PS_DENSE_BLOCK ? numel - off : FL_PS_DENSE_BLOCK;
        c->parts[k++] = (fl_msg_part){values + off, (size_t)n * sizeof(float)};
    }
    return fl_msg_sendv(c->conns[s], c->parts, k);
}

static int dense_init_locked(fl_ps *ps, int table, int64_t numel, const fl_ps_rule *r,
                             const float *values, int64_t *step_out) {
    FL_TRY(need_worker(ps));
    FL_TRY(check_table(table));
    FL_ASSERT(r);
    if (numel < 1 || numel > FL_PS_MAX_NUMEL)
        return fl_fail(FL_EINVAL, "dense table %d of %" PRId64 " values", table, numel);
    FL_TRY(fl_ps_rule_check(r, false));
    ps_client *c = ps->cli;
    fl_ps_req q = {.type = FL_PS_MSG_DENSE_INIT, .table = table, .numel = numel,
                   .step = ps->resume_step, .rule = *r};
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(send_dense(ps, s, &q, numel, values));
    int64_t version = -1, step = -2;
    for (int s = 0; s < ps->nservers; s++) {
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, q.type, &rep));
        /* sync: every server applies every update, so their versions agree; async and geo
         * count each server's own pushes, which a save can catch between two servers */
        if (s > 0 && (rep.step != step || (c->mode == FL_PS_SYNC && rep.version != version)))
            return fl_fail(FL_EPEER, "%s is at version %" PRId64 " (saved step %" PRId64 ") of "
                           "dense table %d, %s at %" PRId64 " (step %" PRId64 ")", c->names[s],
                           rep.version, rep.step, table, c->names[0], version, step);
        version = rep.version;
        step = rep.step;
    }
    c->dense_numel[table] = numel;
    if (step_out)
        *step_out = version;
    return 0;
}

static int dense_table(fl_ps *ps, int table) {
    FL_TRY(need_worker(ps));
    FL_TRY(check_table(table));
    if (!ps->cli->dense_numel[table])
        return fl_fail(FL_ESTATE, "dense table %d used before fl_ps_dense_init", table);
    return 0;
}

static int dense_pull_locked(fl_ps *ps, int table, int64_t version, float *values) {
    FL_TRY(dense_table(ps, table));
    ps_client *c = ps->cli;
    int S = ps->nservers;
    int64_t numel = c->dense_numel[table];
    int64_t nb = (numel + FL_PS_DENSE_BLOCK - 1) / FL_PS_DENSE_BLOCK;
    fl_ps_req q = {.type = FL_PS_MSG_DENSE_PULL, .table = table,
                   .version64 = version < 0 ? -1 : version};
    for (int s = 0; s < S; s++)
        FL_TRY(send_req(ps, s, &q));
    for (int s = 0; s < S; s++) {
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, q.type, &rep));
        if ((int64_t)rep.n != dense_local(numel, S, s))
            return fl_fail(FL_EPEER, "%s sent %" PRIu64 " values of dense table %d, expected %"
                           PRId64, c->names[s], rep.n, table, dense_local(numel, S, s));
        const float *p = rep.values;
        for (int64_t b = s; b < nb; b += S) {
            int64_t off = b * FL_PS_DENSE_BLOCK;
            int64_t n = numel - off < FL_PS_DENSE_BLOCK ? numel - off : FL_PS_DENSE_BLOCK;
            memcpy(values + off, p, (size_t)n * sizeof(float));
            p += n;
        }
    }
    c->st.pulls++;
    return 0;
}

static void count_push(ps_client *c, int64_t stale) {
    c->st.pushes++;
    c->stale_sum += (double)stale;
    if (stale > c->st.max_staleness)
        c->st.max_staleness = stale;
}

static int dense_push_locked(fl_ps *ps, int table, int64_t step, double lr, const float *grads) {
    FL_TRY(dense_table(ps, table));
    FL_ASSERT(grads && step >= 0);
    ps_client *c = ps->cli;
    fl_ps_req q = {.type = FL_PS_MSG_DENSE_PUSH, .table = table, .step = step, .lr = lr};
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(send_dense(ps, s, &q, c->dense_numel[table], grads));
    int64_t stale = 0;
    for (int s = 0; s < ps->nservers; s++) {
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, q.type, &rep));
        if (rep.staleness > stale)
            stale = rep.staleness;
    }
    count_push(c, stale);
    return 0;
}

/* ---- sparse ---- */

static int sparse_init_locked(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                              const fl_ps_init_rule *init, const fl_ps_sparse_opts *o) {
    FL_TRY(need_worker(ps));
    FL_TRY(check_table(table));
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
    FL_TRY(all_servers(ps, &q, &rep));
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
    FL_TRY(need_worker(ps));
    FL_TRY(check_table(table));
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
        FL_TRY(send_req(ps, s, &q));
    }
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0)
            continue;
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, FL_PS_MSG_SPARSE_PULL, &rep));
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
        FL_TRY(send_req(ps, s, &q));
    }
    int64_t stale = 0;
    for (int s = 0; s < S; s++) {
        if (c->cnt[s] == 0 && !all)
            continue;
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, FL_PS_MSG_SPARSE_PUSH, &rep));
        if (rep.staleness > stale)
            stale = rep.staleness;
    }
    count_push(c, stale);
    return 0;
}

/* ---- the life cycle ---- */

/* SHRINK or STATS to every server, the replies summed. */
static int table_pass_locked(fl_ps *ps, int type, int table, int64_t *removed, int64_t *rows,
                             int64_t *bytes) {
    FL_TRY(sparse_table(ps, table, 0));
    fl_ps_req q = {.type = type, .table = table};
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(send_req(ps, s, &q));
    int64_t sum[3] = {0, 0, 0};
    for (int s = 0; s < ps->nservers; s++) {
        fl_ps_rep rep;
        FL_TRY(recv_rep(ps, s, type, &rep));
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

/* ---- save, stats ---- */

static int save_locked(fl_ps *ps, int64_t step, int mode) {
    FL_TRY(need_worker(ps));
    if (step < 0 || (mode != FL_PS_SAVE_ALL && mode != FL_PS_SAVE_DELTA))
        return fl_fail(FL_EINVAL, "fl_ps_save of step %" PRId64 " mode %d", step, mode);
    fl_ps_req q = {.type = FL_PS_MSG_SAVE, .step = step, .save_mode = mode};
    fl_ps_rep rep;
    return all_servers(ps, &q, &rep);
}

void fl_ps_get_stats(const fl_ps *ps, fl_ps_stats *out) {
    FL_ASSERT(ps && out);
    memset(out, 0, sizeof *out);
    const ps_client *c = ps->cli;
    if (!c)
        return;
    *out = c->st;
    bool live = false;
    for (int s = 0; c->conns && s < ps->nservers; s++)
        if (c->conns[s])
            live = true;
    if (live) {
        out->bytes_sent = out->bytes_received = 0;
        for (int s = 0; s < ps->nservers; s++) {
            if (!c->conns[s])
                continue;
            out->bytes_sent += fl_msg_bytes_sent(c->conns[s]);
            out->bytes_received += fl_msg_bytes_received(c->conns[s]);
        }
    }
    out->mean_staleness = c->st.pushes ? c->stale_sum / (double)c->st.pushes : 0;
}

/* ---- the public operations, each whole under the client's lock ---- */

int fl_ps_stop_worker(fl_ps *ps) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = stop_worker_locked(ps);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_dense_init(fl_ps *ps, int table, int64_t numel, const fl_ps_rule *r,
                     const float *values, int64_t *step_out) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = dense_init_locked(ps, table, numel, r, values, step_out);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_dense_pull(fl_ps *ps, int table, int64_t version, float *values) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = dense_pull_locked(ps, table, version, values);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_dense_push(fl_ps *ps, int table, int64_t step, double lr, const float *grads) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = dense_push_locked(ps, table, step, lr, grads);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_init(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                      const fl_ps_init_rule *init) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = sparse_init_locked(ps, table, dim, r, init, NULL);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_init_opts(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                           const fl_ps_init_rule *init, const fl_ps_sparse_opts *o) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = sparse_init_locked(ps, table, dim, r, init, o);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_pull(fl_ps *ps, int table, const uint64_t *ids, int64_t n, float *rows) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = sparse_pull_locked(ps, table, ids, n, rows);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_push(fl_ps *ps, int table, int64_t step, double lr, const uint64_t *ids,
                      int64_t n, const float *grads) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = sparse_push_locked(ps, table, step, lr, ids, n, grads, false, NULL, NULL);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_push_counts(fl_ps *ps, int table, int64_t step, double lr,
                             const uint64_t *ids, int64_t n, const float *grads,
                             const float *shows, const float *clicks) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = sparse_push_locked(ps, table, step, lr, ids, n, grads, true, shows, clicks);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_shrink(fl_ps *ps, int table, int64_t *removed) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = table_pass_locked(ps, FL_PS_MSG_SHRINK, table, removed, NULL, NULL);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_sparse_stats(fl_ps *ps, int table, int64_t *rows, int64_t *bytes) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = table_pass_locked(ps, FL_PS_MSG_STATS, table, NULL, rows, bytes);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int fl_ps_save(fl_ps *ps, int64_t step, int mode) {
    FL_TRY(need_worker(ps));
    pthread_mutex_lock(&ps->cli->call);
    int rc = save_locked(ps, step, mode);
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}
