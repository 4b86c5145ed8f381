/* ps_client_dense.c - a worker's dense-table operations (include/fleet/ps.h): a table is split
 * into blocks of FL_PS_DENSE_BLOCK values, block b on server b % S; declaring it (and worker
 * 0's initial values), pulling and pushing send each server only its blocks, gathered straight
 * from the caller's array by the connection. */
#include "ps_client.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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
    return ps_client_sendv(ps, s, c->parts, k);
}

static int dense_init_locked(fl_ps *ps, int table, int64_t numel, const fl_ps_rule *r,
                             const float *values, int64_t *step_out) {
    FL_TRY(ps_client_need(ps));
    FL_TRY(ps_client_check_table(table));
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
        FL_TRY(ps_client_recv(ps, s, q.type, &rep));
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
    FL_TRY(ps_client_need(ps));
    FL_TRY(ps_client_check_table(table));
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
        FL_TRY(ps_client_send(ps, s, &q));
    for (int s = 0; s < S; s++) {
        fl_ps_rep rep;
        FL_TRY(ps_client_recv(ps, s, q.type, &rep));
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
        FL_TRY(ps_client_recv(ps, s, q.type, &rep));
        if (rep.staleness > stale)
            stale = rep.staleness;
    }
    ps_client_count_push(c, stale);
    return 0;
}

int fl_ps_dense_init(fl_ps *ps, int table, int64_t numel, const fl_ps_rule *r,
                     const float *values, int64_t *step_out) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, dense_init_locked(ps, table, numel, r, values, step_out));
}

int fl_ps_dense_pull(fl_ps *ps, int table, int64_t version, float *values) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, dense_pull_locked(ps, table, version, values));
}

int fl_ps_dense_push(fl_ps *ps, int table, int64_t step, double lr, const float *grads) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, dense_push_locked(ps, table, step, lr, grads));
}
