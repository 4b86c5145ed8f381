/* server_sync.c - a parameter server's table versions (server.h): sync mode's merge of a step
 * (every worker's push counted before the step is applied), the wait of a pull for the version
 * it asks for, with the workers a stuck merge still lacks named, and async staleness. */
#include "server.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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

/* sync: waits until y->version >= v (s->mu held); 0, or the refusal. */
int ps_wait_version(ps_recv *r, const fl_ps_req *q, ps_sync *y, int64_t v, const char *kind) {
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
                rc = ps_refuse(r, q->type, FL_ETIMEOUT, "%s waited %g s (FLEET_COMM_TIMEOUT) for "
                               "update %" PRId64 " of %s table %d: step %" PRId64 " still lacks "
                               "the push of %s", r->name, s->ps->msg.timeout_s, v, kind, q->table,
                               step, who);
            else
                rc = ps_refuse(r, q->type, FL_ETIMEOUT, "%s waited %g s (FLEET_COMM_TIMEOUT) for "
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

/* sync bookkeeping of a push (s->mu held): 1 when it completes the step, 0 when not, or the
 * refusal (s->mu still held). */
int ps_sync_push(ps_recv *r, const fl_ps_req *q, ps_sync *y, const char *kind) {
    ps_server *s = r->s;
    int rc;
    if (y->merged > 0 && q->step != y->merge_step) {
        int64_t m = y->merge_step;
        pthread_mutex_unlock(&s->mu);
        rc = ps_refuse(r, q->type, FL_EPEER, "%s pushes step %" PRId64 " of %s table %d while "
                       "step %" PRId64 " is being merged", r->name, q->step, kind, q->table, m);
        pthread_mutex_lock(&s->mu);
        return rc;
    }
    if (y->merged > 0 && y->pushed[r->w]) {
        pthread_mutex_unlock(&s->mu);
        rc = ps_refuse(r, q->type, FL_EPEER, "%s pushes step %" PRId64 " of %s table %d twice",
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

void ps_count_staleness(ps_server *s, int64_t st) {
    s->stale_sum += st;
    s->stale_n++;
    if (st > s->stale_max)
        s->stale_max = st;
}
