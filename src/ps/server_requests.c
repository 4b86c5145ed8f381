/* server_requests.c - what a parameter server does with each request (ps_wire.h): HELLO's
 * checks, the dense and sparse tables' declarations, pulls and pushes (sync merges, async and
 * geo on arrival, versions and staleness), SAVE; decided under the server's lock, the tables'
 * work queued to the shard threads (server_shard.c), the reply sent when it is done. A request
 * that contradicts the job is refused: the worker hears why and the server fails with it. */
#include "server.h"

#include "ps_wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ps_send_reply(ps_recv *r, const fl_ps_rep *rep) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[2];
    int np = fl_ps_rep_encode(rep, head, sp);
    fl_msg_part parts[2];
    for (int i = 0; i < np; i++)
        parts[i] = (fl_msg_part){sp[i].p, sp[i].n};
    return fl_msg_sendv(r->m, parts, np);
}

/* Refuses the request: answers the worker with the message, fails the server with it, and
 * returns code. */
static int refuse(ps_recv *r, int type, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(ps_recv *r, int type, int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fl_ps_rep rep = {.type = type, .status = 1, .err = msg, .err_len = strlen(msg)};
    ps_send_reply(r, &rep); /* best effort: the worker may be gone */
    ps_server_fail(r->s, code, msg);
    return fl_fail(code, "%s", msg);
}

/* The refusal for a request that found the server already failed (s->mu held). */
int ps_failed_reply(ps_recv *r, int type) {
    char msg[1100];
    snprintf(msg, sizeof msg, "server %d stopped serving: %s", r->s->s, r->s->fail_msg);
    pthread_mutex_unlock(&r->s->mu);
    fl_ps_rep rep = {.type = type, .status = 1, .err = msg, .err_len = strlen(msg)};
    ps_send_reply(r, &rep);
    pthread_mutex_lock(&r->s->mu);
    return fl_fail(FL_EPEER, "%s", msg);
}

static int grow(void **p, int64_t *cap, int64_t want, size_t size) {
    if (want <= *cap)
        return 0;
    int64_t n = want < 1024 ? 1024 : want;
    void *q = realloc(*p, (size_t)n * size);
    if (!q)
        return fl_fail(FL_ENOMEM, "out of memory for %" PRId64 " entries", n);
    *p = q;
    *cap = n;
    return 0;
}

static int out_reserve(ps_recv *r, int64_t n) {
    int64_t cap = (int64_t)r->out_cap;
    int rc = grow((void **)&r->out, &cap, n, sizeof(float));
    r->out_cap = (size_t)cap;
    return rc;
}

/* Names the workers that have not pushed y's step (s->mu held). */
static void missing_pushers(ps_server *s, const ps_sync *y, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int w = 0; w < s->W && len + 1 < cap; w++)
        if (!y->pushed[w])
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", s->names[w]);
}

/* sync: whether some table's merge is waiting for worker w (s->mu held). */
bool ps_waiting_on(ps_server *s, int w, char *what, size_t cap) {
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        const ps_sync *y = s->dense[t].declared ? &s->dense[t].sy : NULL;
        for (int k = 0; k < 2; k++) {
            if (y && y->merged > 0 && !y->pushed[w]) {
                snprintf(what, cap, "its push of step %" PRId64 " of %s table %d", y->merge_step,
                         k ? "sparse" : "dense", t);
                return true;
            }
            y = s->sparse[t].declared ? &s->sparse[t].sy : NULL;
        }
    }
    return false;
}

/* ---- requests ---- */

static int on_hello(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    if (q->worker != r->w)
        return refuse(r, q->type, FL_EPEER, "%s says it is worker %d", r->name, q->worker);
    if (q->servers != s->S || q->workers != s->W)
        return refuse(r, q->type, FL_ECONFIG, "%s counts %d servers and %d workers, server %d "
                      "counts %d and %d", r->name, q->servers, q->workers, s->s, s->S, s->W);
    if (q->mode != (int)s->cfg.mode)
        return refuse(r, q->type, FL_ECONFIG, "%s runs %s mode, server %d serves %s mode",
                      r->name, fl_ps_mode_name((fl_ps_mode)q->mode), s->s,
                      fl_ps_mode_name(s->cfg.mode));
    fl_ps_rep rep = {.type = q->type};
    return ps_send_reply(r, &rep);
}

static void describe_owner(ps_server *s, int by, char *buf, size_t cap) {
    if (by >= 0)
        snprintf(buf, cap, "%s declared", s->names[by]);
    else
        snprintf(buf, cap, "server %d's checkpoint (step %" PRId64 ") has", s->s,
                 s->loaded_step);
}

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
        return refuse(r, q->type, FL_ECONFIG, "%s resumes from step %" PRId64 " but server %d "
                      "loaded no checkpoint (%s)", r->name, q->step, s->s,
                      s->cfg.checkpoint_dir[0] ? s->cfg.checkpoint_dir : "no checkpoint_dir");
    return refuse(r, q->type, FL_ECONFIG, "%s resumes from step %" PRId64 " but server %d "
                  "loaded step %" PRId64 " from %s", r->name, q->step, s->s, s->loaded_step,
                  s->cfg.checkpoint_dir);
}

static int on_dense_init(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    ps_dense *d = &s->dense[q->table];
    char a[160], b[160], who[200];
    int rc = fl_ps_rule_check(&q->rule, false);
    if (rc < 0)
        return refuse(r, q->type, rc, "%s declares dense table %d: %s", r->name, q->table,
                      fl_errmsg());
    FL_TRY(check_resume(r, q));
    pthread_mutex_lock(&s->mu);
    if (!d->declared) {
        rc = ps_dense_create(s, d, q->numel, &q->rule);
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return refuse(r, q->type, rc, "dense table %d of %s: %s", q->table, r->name,
                          fl_errmsg());
        }
        d->declared_by = r->w;
    } else if (d->numel != q->numel || !ps_rule_equal(&d->rule, &q->rule)) {
        ps_rule_str(&q->rule, a, sizeof a);
        ps_rule_str(&d->rule, b, sizeof b);
        describe_owner(s, d->declared_by, who, sizeof who);
        int64_t numel = d->numel;
        pthread_mutex_unlock(&s->mu);
        return refuse(r, q->type, FL_ECONFIG, "%s declares dense table %d with %" PRId64
                      " values and rule %s, but %s %" PRId64 " values and rule %s", r->name,
                      q->table, q->numel, a, who, numel, b);
    }
    if (q->n > 0 && (int64_t)q->n != d->nlocal) {
        int64_t nl = d->nlocal;
        pthread_mutex_unlock(&s->mu);
        return refuse(r, q->type, FL_EPEER, "%s sends %" PRIu64 " initial values of dense table "
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
            return refuse(r, q->type, FL_ETIMEOUT, "%s declared dense table %d, but worker 0 "
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

/* A table request's table must exist (and, dense, be ready). */
static int need_table(ps_recv *r, const fl_ps_req *q, bool dense) {
    pthread_mutex_lock(&r->s->mu);
    bool ok = dense ? r->s->dense[q->table].declared && r->s->dense[q->table].ready
                    : r->s->sparse[q->table].declared;
    pthread_mutex_unlock(&r->s->mu);
    if (!ok)
        return refuse(r, q->type, FL_EPEER, "%s sends %s for %s table %d, which it has not "
                      "declared", r->name, fl_ps_msg_name(q->type), dense ? "dense" : "sparse",
                      q->table);
    return 0;
}

/* sync: waits until y->version >= v (s->mu held); 0, or the refusal. */
static int wait_version(ps_recv *r, const fl_ps_req *q, ps_sync *y, int64_t v,
                        const char *kind) {
    ps_server *s = r->s;
    double deadline = ps_now_s() + s->ps->msg.timeout_s;
    while (y->version < v && !s->failed)
        if (!ps_wait_until(s, deadline)) {
            char who[600];
            if (y->merged > 0)
                missing_pushers(s, y, who, sizeof who);
            int64_t have = y->version, step = y->merge_step;
            bool merging = y->merged > 0;
            pthread_mutex_unlock(&s->mu);
            int rc;
            if (merging)
                rc = refuse(r, q->type, FL_ETIMEOUT, "%s waited %g s (FLEET_COMM_TIMEOUT) for "
                            "update %" PRId64 " of %s table %d: step %" PRId64 " still lacks "
                            "the push of %s", r->name, s->ps->msg.timeout_s, v, kind, q->table,
                            step, who);
            else
                rc = refuse(r, q->type, FL_ETIMEOUT, "%s waited %g s (FLEET_COMM_TIMEOUT) for "
                            "update %" PRId64 " of %s table %d, which has %" PRId64 " and no "
                            "push pending", r->name, s->ps->msg.timeout_s, v, kind, q->table,
                            have);
            pthread_mutex_lock(&s->mu);
            return rc;
        }
    if (s->failed)
        return ps_failed_reply(r, q->type);
    return 0;
}

static int on_dense_pull(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(need_table(r, q, true));
    ps_dense *d = &s->dense[q->table];
    if (out_reserve(r, d->nlocal) < 0)
        return refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    pthread_mutex_lock(&s->mu);
    if (s->cfg.mode == FL_PS_SYNC && q->version64 >= 0) {
        int rc = wait_version(r, q, &d->sy, q->version64, "dense");
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

/* sync bookkeeping of a push (s->mu held): 1 when it completes the step, 0 when not, or the
 * refusal (s->mu still held). */
static int sync_push(ps_recv *r, const fl_ps_req *q, ps_sync *y, const char *kind) {
    ps_server *s = r->s;
    int rc;
    if (y->merged > 0 && q->step != y->merge_step) {
        int64_t m = y->merge_step;
        pthread_mutex_unlock(&s->mu);
        rc = refuse(r, q->type, FL_EPEER, "%s pushes step %" PRId64 " of %s table %d while "
                    "step %" PRId64 " is being merged", r->name, q->step, kind, q->table, m);
        pthread_mutex_lock(&s->mu);
        return rc;
    }
    if (y->merged > 0 && y->pushed[r->w]) {
        pthread_mutex_unlock(&s->mu);
        rc = refuse(r, q->type, FL_EPEER, "%s pushes step %" PRId64 " of %s table %d twice",
                    r->name, q->step, kind, q->table);
        pthread_mutex_lock(&s->mu);
        return rc;
    }
    if (y->merged == 0)
        y->merge_step = q->step;
    y->pushed[r->w] = true;
    y->pushes_by[r->w]++;
    if (++y->merged < s->W)
        return 0;
    y->merged = 0;
    memset(y->pushed, 0, (size_t)s->W * sizeof *y->pushed);
    return 1;
}

static void count_staleness(ps_server *s, int64_t st) {
    s->stale_sum += st;
    s->stale_n++;
    if (st > s->stale_max)
        s->stale_max = st;
}

static int on_dense_push(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(need_table(r, q, true));
    ps_dense *d = &s->dense[q->table];
    if ((int64_t)q->n != d->nlocal)
        return refuse(r, q->type, FL_EPEER, "%s pushes %" PRIu64 " gradients of dense table %d, "
                      "server %d holds %" PRId64 " of its values", r->name, q->n, q->table, s->s,
                      d->nlocal);
    pthread_mutex_lock(&s->mu);
    int64_t stale = 0;
    int last = 0, n;
    if (s->cfg.mode == FL_PS_SYNC) {
        last = sync_push(r, q, &d->sy, "dense");
        if (last < 0) {
            pthread_mutex_unlock(&s->mu);
            return last;
        }
        n = dispatch_dense(r, TASK_DENSE_ACC, q->table, d, NULL, q->values, q->lr,
                           1.0 / s->W, last);
    } else {
        stale = d->sy.version - d->sy.last_pull[r->w];
        d->sy.version++;
        count_staleness(s, stale);
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

static int on_sparse_init(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    ps_sparse_table *t = &s->sparse[q->table];
    int rc = fl_ps_rule_check(&q->rule, true);
    if (rc == 0)
        rc = fl_ps_sparse_opts_check(&q->opts);
    if (rc < 0)
        return refuse(r, q->type, rc, "%s declares sparse table %d: %s", r->name, q->table,
                      fl_errmsg());
    pthread_mutex_lock(&s->mu);
    if (!t->declared) {
        rc = ps_sparse_table_create(s, q->table, t, q->dim, &q->rule, &q->init, &q->opts);
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return refuse(r, q->type, rc, "sparse table %d of %s: %s", q->table, r->name,
                          fl_errmsg());
        }
        t->declared_by = r->w;
    } else if (t->dim != q->dim || !ps_rule_equal(&t->rule, &q->rule) ||
               t->init.type != q->init.type || t->init.a != q->init.a ||
               t->init.b != q->init.b || t->init.seed != q->init.seed) {
        char a[160], b[160], who[200];
        ps_rule_str(&q->rule, a, sizeof a);
        ps_rule_str(&t->rule, b, sizeof b);
        describe_owner(s, t->declared_by, who, sizeof who);
        int dim = t->dim;
        pthread_mutex_unlock(&s->mu);
        return refuse(r, q->type, FL_ECONFIG, "%s declares sparse table %d with rows of %d and "
                      "rule %s (initializer %d %g %g seed %" PRIu64 "), but %s rows of %d and "
                      "rule %s (or another initializer)", r->name, q->table, q->dim, a,
                      (int)q->init.type, q->init.a, q->init.b, q->init.seed, who, dim, b);
    } else if (!ps_opts_equal(&t->opts, &q->opts)) {
        char a[300], b[300], who[200];
        ps_opts_fmt(&q->opts, a, sizeof a);
        ps_opts_fmt(&t->opts, b, sizeof b);
        describe_owner(s, t->declared_by, who, sizeof who);
        pthread_mutex_unlock(&s->mu);
        return refuse(r, q->type, FL_ECONFIG, "%s declares sparse table %d with life cycle "
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
            return refuse(r, q->type, FL_ENOMEM, "server %d: out of memory for %" PRId64
                          " ids", s->s, n);
        r->part_cap = c;
    }
    if (grow((void **)&r->tmp, &r->tmp_cap, n * dim, sizeof *r->tmp) < 0 ||
        (q->counts && grow((void **)&r->tmpc, &r->tmpc_cap, 2 * n, sizeof *r->tmpc) < 0))
        return refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    memset(r->cnt, 0, (size_t)s->T * sizeof *r->cnt);
    for (int64_t i = 0; i < n; i++) {
        uint64_t id = q->ids[i];
        if (s->S > 1 && fl_ps_shard_of(id, s->S) != s->s)
            return refuse(r, q->type, FL_EPEER, "%s sends id %" PRIu64 " of sparse table %d to "
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

static int on_sparse_pull(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    int dim = t->dim;
    FL_TRY(split_ids(r, q, dim));
    if (out_reserve(r, (int64_t)q->n * dim) < 0)
        return refuse(r, q->type, FL_ENOMEM, "server %d: %s", s->s, fl_errmsg());
    pthread_mutex_lock(&s->mu);
    if (s->cfg.mode == FL_PS_SYNC) {
        int rc = wait_version(r, q, &t->sy, t->sy.pushes_by[r->w], "sparse");
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
    }
    t->sy.last_pull[r->w] = t->sy.version;
    int n = dispatch_sparse(r, TASK_SPARSE_PULL, q->table, dim, r->out, NULL, NULL, 0, 0, 1,
                            false, false);
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return refuse(r, q->type, rc, "server %d, sparse table %d, pull of %s: %s", s->s,
                      q->table, r->name, r->done.err);
    fl_ps_rep rep = {.type = q->type, .n = q->n, .dim = dim, .values = r->out};
    return ps_send_reply(r, &rep);
}

static int on_sparse_push(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    if (q->dim != t->dim)
        return refuse(r, q->type, FL_EPEER, "%s pushes rows of %d values to sparse table %d of "
                      "rows of %d", r->name, q->dim, q->table, t->dim);
    FL_TRY(split_ids(r, q, t->dim));
    pthread_mutex_lock(&s->mu);
    int64_t stale = 0;
    int last = 0, n;
    if (s->cfg.mode == FL_PS_SYNC) {
        last = sync_push(r, q, &t->sy, "sparse");
        if (last < 0) {
            pthread_mutex_unlock(&s->mu);
            return last;
        }
        n = dispatch_sparse(r, TASK_SPARSE_ACC, q->table, t->dim, NULL, q->values, q->counts,
                            (int64_t)q->n, q->lr, 1.0 / s->W, last, last);
    } else {
        stale = t->sy.version - t->sy.last_pull[r->w];
        t->sy.version++;
        count_staleness(s, stale);
        n = dispatch_sparse(r, TASK_SPARSE_PUSH, q->table, t->dim, NULL, q->values, q->counts,
                            (int64_t)q->n, q->lr, 1, false, false);
    }
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return refuse(r, q->type, rc, "server %d, sparse table %d, push of %s: %s", s->s,
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
static int on_table_pass(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    FL_TRY(need_table(r, q, false));
    ps_sparse_table *t = &s->sparse[q->table];
    memset(r->cnt, 0, (size_t)s->T * sizeof *r->cnt);
    memset(r->off, 0, (size_t)s->T * sizeof *r->off);
    pthread_mutex_lock(&s->mu);
    if (s->cfg.mode == FL_PS_SYNC) {
        int rc = wait_version(r, q, &t->sy, t->sy.pushes_by[r->w], "sparse");
        if (rc < 0) {
            pthread_mutex_unlock(&s->mu);
            return rc;
        }
    }
    bool shrink = q->type == FL_PS_MSG_SHRINK;
    int n = dispatch_sparse(r, shrink ? TASK_SPARSE_SHRINK : TASK_SPARSE_STATS, q->table,
                            t->dim, NULL, NULL, NULL, 0, 0, 1, false, true);
    pthread_mutex_unlock(&s->mu);
    int rc = n ? ps_done_wait(&r->done) : 0;
    if (rc < 0)
        return refuse(r, q->type, rc, "server %d, sparse table %d, %s of %s: %s", s->s,
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

static int on_save(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    if (!s->cfg.checkpoint_dir[0])
        return refuse(r, q->type, FL_ECONFIG, "%s asks for a save of step %" PRId64 " but "
                      "server %d has no checkpoint directory", r->name, q->step, s->s);
    pthread_mutex_lock(&s->mu);
    ps_shards_pause(s, &r->done, r->tasks); /* queued under mu: after every decided task */
    int rc = ps_save(s, q->step, q->save_mode);
    ps_shards_release(s);
    pthread_mutex_unlock(&s->mu);
    if (rc < 0)
        return refuse(r, q->type, rc, "server %d: %s", s->s, fl_errmsg());
    fl_ps_rep rep = {.type = q->type, .step = q->step};
    return ps_send_reply(r, &rep);
}

/* One request; 1 after STOP, 0 to go on, < 0 failed (the server has failed with it). */
int ps_handle(ps_recv *r, const void *buf, size_t n, bool *hello) {
    fl_ps_req q;
    char why[256];
    if (fl_ps_req_parse(buf, n, &q, why, sizeof why) < 0) {
        int type = n >= 6 ? (int)(((const uint8_t *)buf)[4] | ((const uint8_t *)buf)[5] << 8)
                          : 0;
        return refuse(r, type, FL_EPEER, "malformed request from %s: %s", r->name, why);
    }
    if (!*hello && q.type != FL_PS_MSG_HELLO)
        return refuse(r, q.type, FL_EPEER, "%s sent %s before HELLO", r->name,
                      fl_ps_msg_name(q.type));
    if (*hello && q.type == FL_PS_MSG_HELLO)
        return refuse(r, q.type, FL_EPEER, "%s sent HELLO twice", r->name);
    switch (q.type) {
    case FL_PS_MSG_HELLO:
        FL_TRY(on_hello(r, &q));
        *hello = true;
        return 0;
    case FL_PS_MSG_DENSE_INIT: return on_dense_init(r, &q);
    case FL_PS_MSG_DENSE_PULL: return on_dense_pull(r, &q);
    case FL_PS_MSG_DENSE_PUSH: return on_dense_push(r, &q);
    case FL_PS_MSG_SPARSE_INIT: return on_sparse_init(r, &q);
    case FL_PS_MSG_SPARSE_PULL: return on_sparse_pull(r, &q);
    case FL_PS_MSG_SPARSE_PUSH: return on_sparse_push(r, &q);
    case FL_PS_MSG_SAVE: return on_save(r, &q);
    case FL_PS_MSG_SHRINK:
    case FL_PS_MSG_STATS: return on_table_pass(r, &q);
    case FL_PS_MSG_STOP: {
        fl_ps_rep rep = {.type = q.type};
        FL_TRY(ps_send_reply(r, &rep));
        return 1;
    }
    }
    return refuse(r, q.type, FL_EPEER, "%s: unhandled request", r->name);
}

