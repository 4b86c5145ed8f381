/* server_tables.c - creating and freeing a server's tables (dense blocks spread over its shard
 * threads, one sparse part per thread), the bookkeeping each table keeps for sync merges and
 * async staleness, and the server's waits and failure (server.h). */
#include "server.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int ps_sync_init(ps_sync *y, int W, int64_t version) {
    memset(y, 0, sizeof *y);
    y->version = version;
    y->pushed = calloc((size_t)W, sizeof *y->pushed);
    y->pushes_by = calloc((size_t)W, sizeof *y->pushes_by);
    y->last_pull = calloc((size_t)W, sizeof *y->last_pull);
    if (!y->pushed || !y->pushes_by || !y->last_pull) {
        ps_sync_free(y);
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    for (int i = 0; i < W; i++)
        y->last_pull[i] = y->pushes_by[i] = version;
    return 0;
}

void ps_sync_free(ps_sync *y) {
    free(y->pushed);
    free(y->pushes_by);
    free(y->last_pull);
    memset(y, 0, sizeof *y);
}

int ps_dense_create(ps_server *s, ps_dense *d, int64_t numel, const fl_ps_rule *r) {
    int64_t nglobal = (numel + FL_PS_DENSE_BLOCK - 1) / FL_PS_DENSE_BLOCK;
    int64_t nb = nglobal > s->s ? (nglobal - 1 - s->s) / s->S + 1 : 0;
    memset(d, 0, sizeof *d);
    d->numel = numel;
    d->rule = *r;
    d->nblocks = (int)nb;
    if (nb > 0) {
        d->blocks = calloc((size_t)nb, sizeof *d->blocks);
        if (!d->blocks)
            return fl_fail(FL_ENOMEM, "server %d: out of memory for %" PRId64 " blocks", s->s,
                           nb);
    }
    for (int64_t j = 0; j < nb; j++) {
        int64_t b = s->s + j * s->S, off = b * FL_PS_DENSE_BLOCK;
        int64_t n = numel - off < FL_PS_DENSE_BLOCK ? numel - off : FL_PS_DENSE_BLOCK;
        int rc = fl_ps_block_init(&d->blocks[j], n, r);
        if (rc < 0) {
            ps_dense_free(d);
            return rc;
        }
        d->nlocal += n;
    }
    int rc = ps_sync_init(&d->sy, s->W, 0);
    if (rc < 0) {
        ps_dense_free(d);
        return rc;
    }
    d->declared = true;
    return 0;
}

void ps_dense_free(ps_dense *d) {
    for (int j = 0; d->blocks && j < d->nblocks; j++)
        fl_ps_block_clear(&d->blocks[j]);
    free(d->blocks);
    ps_sync_free(&d->sy);
    memset(d, 0, sizeof *d);
}

int ps_sparse_table_create(ps_server *s, int table, ps_sparse_table *t, int dim,
                           const fl_ps_rule *r, const fl_ps_init_rule *init,
                           const fl_ps_sparse_opts *o) {
    memset(t, 0, sizeof *t);
    t->dim = dim;
    t->rule = *r;
    t->init = *init;
    t->opts = *o;
    t->parts = calloc((size_t)s->T, sizeof *t->parts);
    if (!t->parts)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (int i = 0; i < s->T; i++) {
        int rc = fl_ps_sparse_create(table, dim, r, init, &t->parts[i]);
        if (rc == 0)
            rc = fl_ps_sparse_set_opts(t->parts[i], o);
        if (rc < 0) {
            ps_sparse_table_free(s, t);
            return rc;
        }
    }
    int rc = ps_sync_init(&t->sy, s->W, 0);
    if (rc < 0) {
        ps_sparse_table_free(s, t);
        return rc;
    }
    t->declared = true;
    return 0;
}

void ps_sparse_table_free(ps_server *s, ps_sparse_table *t) {
    for (int i = 0; t->parts && i < s->T; i++)
        fl_ps_sparse_free(t->parts[i]);
    free(t->parts);
    ps_sync_free(&t->sy);
    memset(t, 0, sizeof *t);
}

void ps_rule_str(const fl_ps_rule *r, char *buf, size_t cap) {
    switch (r->type) {
    case FL_PS_RULE_MOMENTUM:
        snprintf(buf, cap, "momentum(%g%s, wd %g)", r->momentum, r->nesterov ? ", nesterov" : "",
                 r->weight_decay);
        break;
    case FL_PS_RULE_ADAM:
        snprintf(buf, cap, "adam(%g, %g, eps %g, wd %g)", r->beta1, r->beta2, r->epsilon,
                 r->weight_decay);
        break;
    case FL_PS_RULE_ADAGRAD:
        snprintf(buf, cap, "adagrad(g2sum %g, eps %g)", r->initial_g2sum, r->epsilon);
        break;
    case FL_PS_RULE_SGD:
        snprintf(buf, cap, "sgd(wd %g)", r->weight_decay);
        break;
    default:
        snprintf(buf, cap, "%s", fl_ps_rule_name(r->type));
        break;
    }
}

bool ps_rule_equal(const fl_ps_rule *a, const fl_ps_rule *b) {
    return a->type == b->type && a->nesterov == b->nesterov && a->momentum == b->momentum &&
           a->weight_decay == b->weight_decay && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
           a->epsilon == b->epsilon && a->initial_g2sum == b->initial_g2sum;
}

bool ps_opts_equal(const fl_ps_sparse_opts *a, const fl_ps_sparse_opts *b) {
    return a->entry == b->entry && a->entry_count == b->entry_count &&
           a->entry_probability == b->entry_probability &&
           a->show_click_decay == b->show_click_decay &&
           a->delete_threshold == b->delete_threshold && a->nonclk_coeff == b->nonclk_coeff &&
           a->click_coeff == b->click_coeff && a->delete_after_unseen == b->delete_after_unseen;
}

/* ---- waiting and failing (server.c and the request handlers) ---- */

double ps_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits on s->cv (s->mu held) until deadline (monotonic seconds); false when it passed. */
bool ps_wait_until(ps_server *s, double deadline) {
    double left = deadline - ps_now_s();
    if (left <= 0)
        return false;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + left;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    return true;
}

void ps_server_fail(ps_server *s, int code, const char *msg) {
    pthread_mutex_lock(&s->mu);
    if (!s->failed) {
        s->failed = true;
        s->fail_code = code;
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
        FL_ERROR("ps server %d: %s", s->s, msg);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
