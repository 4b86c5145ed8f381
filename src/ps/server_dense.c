/* server_dense.c - what a parameter server does with the dense-table requests (server.h):
 * DENSE_INIT (the declaration, checked against what another worker or the checkpoint declared;
 * worker 0's initial values; the others wait until it made the table ready), DENSE_PULL and
 * DENSE_PUSH (sync merges, async and geo on arrival), their work queued to the shard threads
 * that hold the table's blocks. */
#include "server.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Dense tasks to the shards that hold blocks of d (s->mu held); returns how many. */
static int dispatch_dense(ps_recv *r, int op, int table, const ps_dense *d, float *dst,
                          const float *src, double lr, double scale, bool apply) {
    ps_server *s = r->s;
    int n = d->nblocks < s->T ? d->nblocks : s->T;
    r->done.left = n;
    r->done.rc = 0;
    for (int t = 0; t < n; t++) {
        ps_task *k = &r->tasks[t];
        memset(k, 0, sizeof *k);
        k->op = op;
        k->table = table;
        k->dst = dst;
        k->src = src;
        k->lr = lr;
        k->scale = scale;
        k->apply = apply;
        k->done = &r->done;
        ps_task_enqueue(s, t, k);
    }
    return n;
}

static int check_resume(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    if (q->step < 0 || q->step == s->loaded_step)
        return 0;
    if (s->loaded_step < 0)
        return ps_refuse(r, q->type, FL_ECONFIG, "%s resumes from step %" PRId64 " but server %d "
                         "loaded no checkpoint (%s)", r->name, q->step, s->s,
                         s->cfg.checkpoint_dir[0] ? s->cfg.checkpoint_dir : "no checkpoint_dir");
    return ps_refuse(r, q->type, FL_ECONFIG, "%s resumes from step %" PRId64 " but server %d "
                     "loaded step %" PRId64 " from %s", r->name, q->step, s->s, s->loaded_step,
                     s->cfg.checkpoint_dir);
}

int ps_on_dense_init(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    ps_dense *d = &s->dense[q->table];
    char a[160], b[160], who[200];
    int rc = fl_ps_rule_check(&q->rule, false);
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "%s declares dense table %d: %s", r->name, q->table,
                         fl_errmsg());
    FL_TRY(check_resume(r, q));
    pthread_mutex_lock(&s->mu);
    if (!d->declared) {
        rc = ps_dense_create(s, d, q->numel, &q->rule);
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return ps_refuse(r, q->type, rc, "dense table %d of %s: %s", q->table, r->name,
                             fl_errmsg());
        }
        d->declared_by = r->w;
    } else if (d->numel != q->numel || !ps_rule_equal(&d->rule, &q->rule)) {
        ps_rule_str(&q->rule, a, sizeof a);
        ps_rule_str(&d->rule, b, sizeof b);
        ps_describe_owner(s, d->declared_by, who, sizeof who);
        int64_t numel = d->numel;
        pthread_mutex_unlock(&s->mu);
        return ps_refuse(r, q->type, FL_ECONFIG, "%s declares dense table %d with %" PRId64
                         " values and rule %s, but %s %" PRId64 " values and rule %s", r->name,
                         q->table, q->numel, a, who, numel, b);
    }
    if (q->n > 0 && (int64_t)q->n != d->nlocal) {
        int64_t nl = d->nlocal;
        pthread_mutex_unlock(&s->mu);
        return ps_refuse(r, q->type, FL_EPEER, "%s sends %" PRIu64 " initial values of dense table "
                         "%d, server %d holds %" PRId64 " of its values", r->name, q->n, q->table,
                         s->s, nl);
    }
    if (r->w == 0 && !d->ready) {
        if (q->n > 0 && !d->loaded) {
            int n = dispatch_dense(r, TASK_DENSE_SET, q->table, d, NULL, q->values, 0, 1, false);
            pthread_mutex_unlock(&s->mu);
            if (n)
                ps_done_wait(&r->done);
            pthread_mutex_lock(&s->mu);
        }
        d->ready = true;
        pthread_cond_broadcast(&s->cv);
    }
    double deadline = ps_now_s() + s->ps->msg.timeout_s;
    while (!d->ready && !s->failed)
        if (!ps_wait_until(s, deadline)) {
            pthread_mutex_unlock(&s->mu);
            return ps_refuse(r, q->type, FL_ETIMEOUT, "%s declared dense table %d, but worker 0 "
                             "did not within %g s (FLEET_COMM_TIMEOUT)", r->name, q->table,
                             s->ps->msg.timeout_s);
        }
    if (s->failed) {
        rc = ps_failed_reply(r, q->type);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    fl_ps_rep rep = {.type = q->type, .version = d->sy.version, .step = s->loaded_step};
    pthread_mutex_unlock(&s->mu);
    return ps_send_reply(r, &rep);
}

int ps_on_dense_pull(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(ps_need_table(r, q, true));
    ps_dense *d = &s->dense[q->table];
    if (ps_out_reserve(r, d->nlocal) < 0)
        return ps_refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    pthread_mutex_lock(&s->mu);
    if (s->cfg.mode == FL_PS_SYNC && q->version64 >= 0) {
        int rc = ps_wait_version(r, q, &d->sy, q->version64, "dense");
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
    }
    int64_t version = d->sy.version;
    d->sy.last_pull[r->w] = version;
    int n = dispatch_dense(r, TASK_DENSE_GET, q->table, d, r->out, NULL, 0, 1, false);
    pthread_mutex_unlock(&s->mu);
    if (n)
        ps_done_wait(&r->done);
    fl_ps_rep rep = {.type = q->type, .version = version, .n = (uint64_t)d->nlocal,
                     .values = r->out};
    return ps_send_reply(r, &rep);
}

int ps_on_dense_push(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(ps_need_table(r, q, true));
    ps_dense *d = &s->dense[q->table];
    if ((int64_t)q->n != d->nlocal)
        return ps_refuse(r, q->type, FL_EPEER, "%s pushes %" PRIu64 " gradients of dense table %d, "
                         "server %d holds %" PRId64 " of its values", r->name, q->n, q->table, s->s,
                         d->nlocal);
    pthread_mutex_lock(&s->mu);
    int64_t stale = 0;
    int last = 0, n;
    if (s->cfg.mode == FL_PS_SYNC) {
        last = ps_sync_push(r, q, &d->sy, "dense");
        if (last < 0) {
            pthread_mutex_unlock(&s->mu);
            return last;
        }
        n = dispatch_dense(r, TASK_DENSE_ACC, q->table, d, NULL, q->values, q->lr,
                           1.0 / s->W, last);
    } else {
        stale = d->sy.version - d->sy.last_pull[r->w];
        d->sy.version++;
        ps_count_staleness(s, stale);
        n = dispatch_dense(r, TASK_DENSE_APPLY, q->table, d, NULL, q->values, q->lr, 1, false);
    }
    pthread_mutex_unlock(&s->mu);
    if (n)
        ps_done_wait(&r->done);
    pthread_mutex_lock(&s->mu);
    if (last) {
        d->sy.version++;
        pthread_cond_broadcast(&s->cv);
    }
    fl_ps_rep rep = {.type = q->type, .version = d->sy.version, .staleness = stale};
    pthread_mutex_unlock(&s->mu);
    return ps_send_reply(r, &rep);
}
