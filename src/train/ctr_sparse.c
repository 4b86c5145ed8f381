/* ctr_sparse.c - the CTR model's two sparse tables ("embedding", "wide") in either
 * architecture (docs/ctr.md "Training"):
 *   collective: every worker holds a replica (fl_ps_sparse, the same initializer: identical
 *     rows); each step the touched rows' gradients of all workers are all-gathered (one
 *     allgather of sizes, one allgatherv of ids and gradients) and every worker merges them in
 *     rank order and applies the rule once per row with the sum / W: the sync server's
 *     computation (fl_ps_sparse_accumulate, fl_ps_sparse_apply_pending), so replicas stay
 *     bit-identical and equal a sync PS job's tables (W = 2: bit for bit);
 *   PS sync / async: tables 1 and 2 on the servers; rows pulled before forward, gradients
 *     pushed after backward (sync: the servers merge the W pushes of a step and a pull waits
 *     for them; async: applied on arrival);
 *   PS geo: a local copy trained with the rule alone; every k steps the touched rows'
 *     differences since the last exchange, / W, are pushed (the servers' rule is SUM) and the
 *     servers' sums pulled back into the copy (its rule state kept), as GEO-SGD does for dense:
 *     ctr_geo.c, from a communicator thread. */
#include "train/ctr_impl.h"

#include <stdlib.h>
#include <string.h>

const char *ctr_mode_name(ctr_mode m) {
    static const char *const names[] = {"collective", "ps sync", "ps async", "ps geo"};
    return m <= CTR_PS_GEO ? names[m] : "?";
}

/* ---- tables ---- */

int ctr_tables_init(ctr_trainer *c) {
    fl_ctr_model *m = c->model;
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        int dim = fl_ctr_model_table_dim(m, t);
        fl_ps_rule server_rule = c->rule;
        if (c->mode == CTR_PS_GEO)
            fl_ps_rule_defaults(&server_rule, FL_PS_RULE_SUM);
        if (c->mode != CTR_COLLECTIVE) {
            int rc = fl_ps_sparse_init_opts(c->base.ps, CTR_PS_TABLE(t), dim, &server_rule,
                                            &c->init[t], &c->opts);
            if (rc < 0)
                return fl_fail_prefix(rc, "sparse table '%s' on the servers",
                                      fl_ctr_model_table_name(t));
        }
        if (c->mode == CTR_COLLECTIVE || c->mode == CTR_PS_GEO) {
            /* the PS table number enters the initializer's draw: the same rows everywhere */
            FL_TRY(fl_ps_sparse_create(CTR_PS_TABLE(t), dim, &c->rule, &c->init[t], &c->rep[t]));
            if (c->mode == CTR_COLLECTIVE)
                FL_TRY(fl_ps_sparse_set_opts(c->rep[t], &c->opts));
        }
    }
    if (c->mode == CTR_PS_GEO)
        FL_TRY(ctr_geo_init(c, c->geo_background));
    return FL_OK;
}

void ctr_tables_free(ctr_trainer *c) {
    ctr_geo_free(c); /* its thread first */
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_ps_sparse_free(c->rep[t]);
        free(c->slots[t]);
        c->rep[t] = NULL;
        c->slots[t] = NULL;
        c->slots_cap[t] = 0;
    }
    free(c->xbuf);
    free(c->shows);
    free(c->clicks);
    c->shows = c->clicks = NULL;
    c->counts_cap = 0;
    c->xbuf = NULL;
    c->xcap = 0;
}

/* Room for the slots of n rows of table t (geo). */
static int slots_reserve(ctr_trainer *c, int t, int64_t n) {
    if (n <= c->slots_cap[t])
        return FL_OK;
    int64_t cap = n > 1024 ? n * 2 : 2048;
    int64_t *p = realloc(c->slots[t], (size_t)cap * sizeof *p);
    if (!p)
        return fl_fail(FL_ENOMEM, "ctr: out of memory for the slots of %lld rows", (long long)n);
    c->slots[t] = p;
    c->slots_cap[t] = cap;
    return FL_OK;
}

int ctr_tables_fill(ctr_trainer *c) {
    /* geo: an exchange the communicator finished is folded in first; after the last one the
     * tables are the servers' */
    bool geo = c->mode == CTR_PS_GEO && !ctr_geo_final(c);
    if (geo)
        FL_TRY(ctr_geo_poll(c));
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_sparse_rows *r = fl_ctr_model_rows(c->model, t);
        bool local = c->rep[t] && (c->mode == CTR_COLLECTIVE || geo);
        int rc = geo ? slots_reserve(c, t, r->n) : FL_OK;
        if (rc >= 0)
            rc = !local ? fl_ps_sparse_pull(c->base.ps, CTR_PS_TABLE(t), r->ids, r->n, r->rows)
                 : geo  ? fl_ps_sparse_pull_rows_slots(c->rep[t], r->ids, r->n, r->rows,
                                                       c->slots[t])
                        : fl_ps_sparse_pull_rows(c->rep[t], r->ids, r->n, r->rows);
        if (rc < 0)
            return fl_fail_prefix(rc, "pulling %lld rows of sparse table '%s'", (long long)r->n,
                                  fl_ctr_model_table_name(t));
    }
    return FL_OK;
}

static int xbuf_reserve(ctr_trainer *c, size_t bytes) {
    if (bytes <= c->xcap)
        return FL_OK;
    size_t cap = c->xcap ? c->xcap : 4096;
    while (cap < bytes)
        cap *= 2;
    char *p = realloc(c->xbuf, cap);
    if (!p)
        return fl_fail(FL_ENOMEM, "ctr: out of memory for %zu bytes of row gradients", cap);
    c->xbuf = p;
    c->xcap = cap;
    return FL_OK;
}

/* Bytes of one table's part of a worker's message: n (8), ids, gradients padded to 8, and
 * with the life cycle each id's shows and clicks (2 floats). */
static size_t part_bytes(int64_t n, int dim, bool counts) {
    return 8 + (size_t)n * 8 + (((size_t)n * (size_t)dim * 4 + 7) & ~(size_t)7) +
           (counts ? (size_t)n * 8 : 0);
}

/* Collective: all-gathers every worker's (ids, gradients) of both tables and applies them, in
 * rank order, as the sync servers do. */
static int exchange_collective(ctr_trainer *c) {
    fl_comm *comm = fl_fleet_comm(c->base.fleet);
    int W = c->base.world;
    size_t mine = 0;
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_sparse_rows *r = fl_ctr_model_rows(c->model, t);
        mine += part_bytes(r->n, r->dim, c->lifecycle);
    }
    int64_t *sizes = calloc((size_t)W, sizeof *sizes);
    size_t *counts = calloc((size_t)W, sizeof *counts);
    if (!sizes || !counts) {
        free(sizes);
        free(counts);
        return fl_fail(FL_ENOMEM, "ctr: out of memory");
    }
    int64_t my = (int64_t)mine;
    int rc = W > 1 ? fl_comm_allgather(comm, &my, sizes, 1, FL_DTYPE_I64) : FL_OK;
    if (W == 1)
        sizes[0] = my;
    size_t total = 0;
    for (int w = 0; w < W && rc >= 0; w++) {
        counts[w] = (size_t)sizes[w] / 8;
        total += (size_t)sizes[w];
    }
    if (rc >= 0)
        rc = xbuf_reserve(c, total + mine);
    if (rc >= 0) {
        /* this worker's message after everyone's */
        char *p = c->xbuf + total;
        for (int t = 0; t < FL_CTR_NTABLES; t++) {
            fl_sparse_rows *r = fl_ctr_model_rows(c->model, t);
            memcpy(p, &r->n, 8);
            memcpy(p + 8, r->ids, (size_t)r->n * 8);
            size_t g = (size_t)r->n * (size_t)r->dim * 4;
            memcpy(p + 8 + (size_t)r->n * 8, r->grads, g);
            size_t ncounts = c->lifecycle ? (size_t)r->n * 8 : 0;
            size_t at = part_bytes(r->n, r->dim, c->lifecycle) - ncounts;
            memset(p + 8 + (size_t)r->n * 8 + g, 0, at - 8 - (size_t)r->n * 8 - g);
            if (ncounts) {
                memcpy(p + at, c->shows, (size_t)r->n * 4);
                memcpy(p + at + (size_t)r->n * 4, c->clicks, (size_t)r->n * 4);
            }
            p += part_bytes(r->n, r->dim, c->lifecycle);
        }
        if (W > 1)
            rc = fl_comm_allgatherv(comm, c->xbuf + total, c->xbuf, counts, FL_DTYPE_I64);
        else
            memcpy(c->xbuf, c->xbuf + total, mine);
    }
    if (rc < 0) {
        free(sizes);
        free(counts);
        return fl_fail_prefix(rc, "all-gathering the sparse rows' gradients");
    }
    /* merge in rank order, then one update per row */
    const char *p = c->xbuf;
    for (int w = 0; w < W && rc >= 0; w++) {
        const char *end = p + sizes[w];
        for (int t = 0; t < FL_CTR_NTABLES && rc >= 0; t++) {
            int dim = fl_ps_sparse_dim(c->rep[t]);
            int64_t n;
            memcpy(&n, p, 8);
            size_t bytes = part_bytes(n, dim, c->lifecycle);
            if (n < 0 || n > (end - p) / 8 || p + bytes > end) {
                rc = fl_fail(FL_EPEER, "worker %d sent a malformed set of row gradients", w);
                break;
            }
            const float *cnt = c->lifecycle ? (const float *)(p + bytes - (size_t)n * 8) : NULL;
            rc = fl_ps_sparse_accumulate_counts(c->rep[t], (const uint64_t *)(p + 8), n,
                                                (const float *)(p + 8 + (size_t)n * 8), cnt,
                                                cnt ? cnt + n : NULL);
            p += bytes;
        }
    }
    for (int t = 0; t < FL_CTR_NTABLES && rc >= 0; t++)
        rc = fl_ps_sparse_apply_pending(c->rep[t], c->sparse_lr, 1.0 / W);
    free(sizes);
    free(counts);
    return rc < 0 ? fl_fail_prefix(rc, "updating the sparse replicas") : FL_OK;
}

/* The life cycle's shows and clicks of the prepared batch's distinct ids (both tables hold the
 * same ids). */
static int count_batch(ctr_trainer *c, const int32_t *labels) {
    const fl_sparse_lookup *lk = fl_ctr_model_lookup(c->model);
    if (lk->n > c->counts_cap) {
        int64_t cap = lk->n * 2;
        float *a = realloc(c->shows, (size_t)cap * sizeof *a);
        if (a)
            c->shows = a;
        float *b = a ? realloc(c->clicks, (size_t)cap * sizeof *b) : NULL;
        if (!a || !b)
            return fl_fail(FL_ENOMEM, "ctr: out of memory for the counts of %lld ids",
                           (long long)lk->n);
        c->clicks = b;
        c->counts_cap = cap;
    }
    fl_sparse_lookup_counts(lk, labels, c->shows, c->clicks);
    return FL_OK;
}

int ctr_tables_update(ctr_trainer *c, int64_t step, const int32_t *labels) {
    if (c->lifecycle)
        FL_TRY(count_batch(c, labels));
    switch (c->mode) {
    case CTR_COLLECTIVE:
        return exchange_collective(c);
    case CTR_PS_SYNC:
    case CTR_PS_ASYNC:
        for (int t = 0; t < FL_CTR_NTABLES; t++) {
            fl_sparse_rows *r = fl_ctr_model_rows(c->model, t);
            int rc = c->lifecycle
                         ? fl_ps_sparse_push_counts(c->base.ps, CTR_PS_TABLE(t), step,
                                                    c->sparse_lr, r->ids, r->n, r->grads,
                                                    c->shows, c->clicks)
                         : fl_ps_sparse_push(c->base.ps, CTR_PS_TABLE(t), step, c->sparse_lr,
                                             r->ids, r->n, r->grads);
            if (rc < 0)
                return fl_fail_prefix(rc, "pushing %lld rows of sparse table '%s'",
                                      (long long)r->n, fl_ctr_model_table_name(t));
        }
        return FL_OK;
    case CTR_PS_GEO:
        return ctr_geo_update(c, step, c->slots);
    }
    return FL_OK;
}

int ctr_tables_finish(ctr_trainer *c, int64_t step) {
    return c->mode == CTR_PS_GEO ? ctr_geo_finish(c, step) : FL_OK;
}

int ctr_tables_size(ctr_trainer *c, int64_t *rows, int64_t *bytes) {
    *rows = *bytes = 0;
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        if (c->rep[t]) {
            *rows += fl_ps_sparse_rows(c->rep[t]);
            *bytes += (int64_t)fl_ps_sparse_bytes(c->rep[t]);
            continue;
        }
        if (c->base.rank != 0) {
            *rows = *bytes = -1;
            return FL_OK;
        }
        int64_t r, b;
        int rc = fl_ps_sparse_stats(c->base.ps, CTR_PS_TABLE(t), &r, &b);
        if (rc < 0)
            return fl_fail_prefix(rc, "asking the servers the size of sparse table '%s'",
                                  fl_ctr_model_table_name(t));
        *rows += r;
        *bytes += b;
    }
    return FL_OK;
}

int ctr_tables_pass(ctr_trainer *c, int64_t removed[FL_CTR_NTABLES]) {
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        removed[t] = 0;
        if (c->mode == CTR_COLLECTIVE) {
            int64_t n = fl_ps_sparse_pass(c->rep[t]);
            if (n < 0)
                return fl_fail_prefix((int)n, "a pass of sparse table '%s'",
                                      fl_ctr_model_table_name(t));
            removed[t] = n;
        } else if (c->base.rank == 0) {
            int rc = fl_ps_sparse_shrink(c->base.ps, CTR_PS_TABLE(t), &removed[t]);
            if (rc < 0)
                return fl_fail_prefix(rc, "a pass of sparse table '%s' on the servers",
                                      fl_ctr_model_table_name(t));
        }
    }
    if (c->mode == CTR_COLLECTIVE || c->base.world == 1)
        return FL_OK;
    /* every worker waits for worker 0's pass, and learns what it removed */
    double buf[FL_CTR_NTABLES];
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        buf[t] = (double)removed[t];
    int rc = fl_comm_allreduce(fl_fleet_comm(c->base.fleet), buf, FL_CTR_NTABLES, FL_DTYPE_F64,
                               FL_REDOP_SUM);
    if (rc < 0)
        return fl_fail_prefix(rc, "waiting for worker 0's pass of the sparse tables");
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        removed[t] = (int64_t)buf[t];
    return FL_OK;
}
