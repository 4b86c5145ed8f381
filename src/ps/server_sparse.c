/* server_sparse.c - what a parameter server does with the sparse-table requests (server.h):
 * SPARSE_INIT (the declaration, checked against what another worker or the checkpoint
 * declared), SPARSE_PULL and SPARSE_PUSH (ids grouped by the shard thread that owns them; sync
 * merges, async and geo on arrival), and the life cycle's SHRINK and STATS, run on every shard
 * thread and summed. */
#include "server.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_on_sparse_init(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    ps_sparse_table *t = &s->sparse[q->table];
    int rc = fl_ps_rule_check(&q->rule, true);
    if (rc == 0)
        rc = fl_ps_sparse_opts_check(&q->opts);
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "%s declares sparse table %d: %s", r->name, q->table,
                         fl_errmsg());
    pthread_mutex_lock(&s->mu);
    if (!t->declared) {
        rc = ps_sparse_table_create(s, q->table, t, q->dim, &q->rule, &q->init, &q->opts);
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return ps_refuse(r, q->type, rc, "sparse table %d of %s: %s", q->table, r->name,
                             fl_errmsg());
        }
        t->declared_by = r->w;
    } else if (t->dim != q->dim || !ps_rule_equal(&t->rule, &q->rule) ||
               t->init.type != q->init.type || t->init.a != q->init.a ||
               t->init.b != q->init.b || t->init.seed != q->init.seed) {
        char a[160], b[160], who[200];
        ps_rule_str(&q->rule, a, sizeof a);
        ps_rule_str(&t->rule, b, sizeof b);
        ps_describe_owner(s, t->declared_by, who, sizeof who);
        int dim = t->dim;
        pthread_mutex_unlock(&s->mu);
        return ps_refuse(r, q->type, FL_ECONFIG, "%s declares sparse table %d with rows of %d and "
                         "rule %s (initializer %d %g %g seed %" PRIu64 "), but %s rows of %d and "
                         "rule %s (or another initializer)", r->name, q->table, q->dim, a,
                         (int)q->init.type, q->init.a, q->init.b, q->init.seed, who, dim, b);
    } else if (!ps_opts_equal(&t->opts, &q->opts)) {
        char a[300], b[300], who[200];
        ps_opts_fmt(&q->opts, a, sizeof a);
        ps_opts_fmt(&t->opts, b, sizeof b);
        ps_describe_owner(s, t->declared_by, who, sizeof who);
        pthread_mutex_unlock(&s->mu);
        return ps_refuse(r, q->type, FL_ECONFIG, "%s declares sparse table %d with life cycle "
                         "(entry count probability decay threshold nonclk click unseen) %s, but %s "
                         "%s", r->name, q->table, a, who, b);
    }
    pthread_mutex_unlock(&s->mu);
    fl_ps_rep rep = {.type = q->type};
    return ps_send_reply(r, &rep);
}

/* Groups ids[0..n) by shard thread into r->ids / r->pos (r->off, r->cnt); checks that each
 * belongs to this server. */
static int split_ids(ps_recv *r, const fl_ps_req *q, int dim) {
    ps_server *s = r->s;
    int64_t n = (int64_t)q->n;
    if (n > r->part_cap) {
        int64_t c = n < 1024 ? 1024 : n;
        uint64_t *a = realloc(r->ids, (size_t)c * sizeof *a);
        if (a)
            r->ids = a;
        int64_t *b = realloc(r->pos, (size_t)c * sizeof *b);
        if (b)
            r->pos = b;
        int32_t *d = realloc(r->th, (size_t)c * sizeof *d);
        if (d)
            r->th = d;
        if (!a || !b || !d)
            return ps_refuse(r, q->type, FL_ENOMEM, "server %d: out of memory for %" PRId64
                             " ids", s->s, n);
        r->part_cap = c;
    }
    if (ps_grow((void **)&r->tmp, &r->tmp_cap, n * dim, sizeof *r->tmp) < 0 ||
        (q->counts && ps_grow((void **)&r->tmpc, &r->tmpc_cap, 2 * n, sizeof *r->tmpc) < 0))
        return ps_refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    memset(r->cnt, 0, (size_t)s->T * sizeof *r->cnt);
    for (int64_t i = 0; i < n; i++) {
        uint64_t id = q->ids[i];
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s)
            return ps_refuse(r, q->type, FL_EPEER, "%s sends id %" PRIu64 " of sparse table %d to "
                             "server %d, but it lives on server %d", r->name, id, q->table, s->s,
                             fl_ps_shard_of(id, s->S));
        int t = s->T > 1 ? fl_ps_thread_of(id, s->T) : 0;
        r->th[i] = t;
        r->cnt[t]++;
    }
    int64_t o = 0;
    for (int t = 0; t < s->T; t++) {
        r->off[t] = o;
        o += r->cnt[t];
    }
    int64_t *at = r->cnt; /* reuse as fill cursors, then restore */
    for (int t = 0; t < s->T; t++)
        at[t] = r->off[t];
    for (int64_t i = 0; i < n; i++) {
        int64_t k = at[r->th[i]]++;
        r->ids[k] = q->ids[i];
        r->pos[k] = i;
    }
    for (int t = 0; t < s->T; t++)
        r->cnt[t] = at[t] - r->off[t];
    return 0;
}

/* Sparse tasks (s->mu held): to every thread with ids, or to all when `all`; counts: the
 * request's n shows then n clicks, or NULL. */
static int dispatch_sparse(ps_recv *r, int op, int table, int dim, float *dst,
                           const float *grads, const float *counts, int64_t n, double lr,
                           double scale, bool apply, bool all) {
    ps_server *s = r->s;
    int m = 0;
    r->done.rc = 0;
    r->done.left = 0;
    for (int t = 0; t < s->T; t++)
        if (r->cnt[t] > 0 || all)
            r->done.left++;
    for (int t = 0; t < s->T; t++) {
        if (r->cnt[t] == 0 && !all)
            continue;
        ps_task *k = &r->tasks[t];
        memset(k, 0, sizeof *k);
        k->op = op;
        k->table = table;
        k->dst = dst;
        k->grads = grads;
        k->ids = r->ids + r->off[t];
        k->pos = r->pos + r->off[t];
        k->tmp = r->tmp + r->off[t] * dim;
        if (counts) {
            k->shows = counts;
            k->clicks = counts + n;
            k->tmpc = r->tmpc + 2 * r->off[t];
        }
        k->n = r->cnt[t];
        k->lr = lr;
        k->scale = scale;
        k->apply = apply;
        k->done = &r->done;
        ps_task_enqueue(s, t, k);
        m++;
    }
    return m;
}

/* Takes s->mu and, sync, waits until the steps worker r->w pushed to t are applied, so that
 * what follows falls between the same two steps whatever the other workers' timing. 0 with
 * s->mu held, or the refusal with s->mu released. */
static int lock_after_own_pushes(ps_recv *r, const fl_ps_req *q, ps_sparse_table *t) {
    ps_server *s = r->s;
    pthread_mutex_lock(&s->mu);
    if (s->cfg.mode != FL_PS_SYNC)
        return 0;
    int rc = ps_wait_version(r, q, &t->sy, t->sy.pushes_by[r->w], "sparse");
    if (rc < 0)
        pthread_mutex_unlock(&s->mu);
    return rc;
}

int ps_on_sparse_pull(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(ps_need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    int dim = t->dim;
    FL_TRY(split_ids(r, q, dim));
    if (ps_out_reserve(r, (int64_t)q->n * dim) < 0)
        return ps_refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    FL_TRY(lock_after_own_pushes(r, q, t));
    t->sy.last_pull[r->w] = t->sy.version;
    int n = dispatch_sparse(r, TASK_SPARSE_PULL, q->table, dim, r->out, NULL, NULL, 0, 0, 1,
                            false, false);
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "server %d, sparse table %d, pull of %s: %s", s->s,
                         q->table, r->name, r->done.err);
    fl_ps_rep rep = {.type = q->type, .n = q->n, .dim = dim, .values = r->out};
    return ps_send_reply(r, &rep);
}

int ps_on_sparse_push(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(ps_need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    if (q->dim != t->dim)
        return ps_refuse(r, q->type, FL_EPEER, "%s pushes rows of %d values to sparse table %d of "
                         "rows of %d", r->name, q->dim, q->table, t->dim);
    FL_TRY(split_ids(r, q, t->dim));
    pthread_mutex_lock(&s->mu);
    int64_t stale = 0;
    int last = 0, n;
    if (s->cfg.mode == FL_PS_SYNC) {
        last = ps_sync_push(r, q, &t->sy, "sparse");
        if (last < 0) {
            pthread_mutex_unlock(&s->mu);
            return last;
        }
        n = dispatch_sparse(r, TASK_SPARSE_ACC, q->table, t->dim, NULL, q->values, q->counts,
                            (int64_t)q->n, q->lr, 1.0 / s->W, last, last);
    } else {
        stale = t->sy.version - t->sy.last_pull[r->w];
        t->sy.version++;
        ps_count_staleness(s, stale);
        n = dispatch_sparse(r, TASK_SPARSE_PUSH, q->table, t->dim, NULL, q->values, q->counts,
                            (int64_t)q->n, q->lr, 1, false, false);
    }
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "server %d, sparse table %d, push of %s: %s", s->s,
                         q->table, r->name, r->done.err);
    pthread_mutex_lock(&s->mu);
    if (last) {
        t->sy.version++;
        pthread_cond_broadcast(&s->cv);
    }
    fl_ps_rep rep = {.type = q->type, .version = t->sy.version, .staleness = stale};
    pthread_mutex_unlock(&s->mu);
    return ps_send_reply(r, &rep);
}

/* SHRINK (a pass of the life cycle) and STATS: one task on every shard thread, the results
 * summed. Sync: first waits, as a pull does, until the steps this worker pushed are applied,
 * so that the pass falls between the same two steps whatever the other workers' timing. */
int ps_on_table_pass(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(ps_need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    memset(r->cnt, 0, (size_t)s->T * sizeof *r->cnt);
    memset(r->off, 0, (size_t)s->T * sizeof *r->off);
    FL_TRY(lock_after_own_pushes(r, q, t));
    bool shrink = q->type == FL_PS_MSG_SHRINK;
    int n = dispatch_sparse(r, shrink ? TASK_SPARSE_SHRINK : TASK_SPARSE_STATS, q->table,
                            t->dim, NULL, NULL, NULL, 0, 0, 1, false, true);
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "server %d, sparse table %d, %s of %s: %s", s->s,
                         q->table, fl_ps_msg_name(q->type), r->name, r->done.err);
    fl_ps_rep rep = {.type = q->type};
    if (shrink) { /* rows removed, then the table's rows and bytes after the pass */
        for (int i = 0; i < s->T; i++)
            rep.removed += (uint64_t)r->tasks[i].result[0];
        pthread_mutex_lock(&s->mu);
        n = dispatch_sparse(r, TASK_SPARSE_STATS, q->table, t->dim, NULL, NULL, NULL, 0, 0, 1,
                            false, true);
        pthread_mutex_unlock(&s->mu);
        if (n)
            ps_done_wait(&r->done);
    }
    for (int i = 0; i < s->T; i++) {
        rep.rows += (uint64_t)r->tasks[i].result[0];
        rep.bytes += (uint64_t)r->tasks[i].result[1];
    }
    if (shrink)
        FL_INFO("ps server %d: sparse table %d: a pass removed %" PRIu64 " rows, %" PRIu64
                " left (%" PRIu64 " bytes)", s->s, q->table, rep.removed, rep.rows, rep.bytes);
    return ps_send_reply(r, &rep);
}
