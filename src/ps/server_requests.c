/* server_requests.c - what a parameter server does with each request (ps_wire.h): parsed and
 * checked in order (HELLO first, once), then handed to its handler: HELLO's and SAVE's here,
 * the tables' in server_dense.c and server_sparse.c. Each is decided under the server's lock,
 * the tables' work queued to the shard threads (server_shard.c), the reply sent when it is
 * done. A request that contradicts the job is refused: the worker hears why and the server
 * fails with it (server_reply.c). */
#include "server.h"

#include "ps_wire.h"

#include "fleet/status.h"

#include <inttypes.h>
#include <stdint.h>

static int on_hello(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    if (q->worker != r->w)
        return ps_refuse(r, q->type, FL_EPEER, "%s says it is worker %d", r->name, q->worker);
    if (q->servers != s->S || q->workers != s->W)
        return ps_refuse(r, q->type, FL_ECONFIG, "%s counts %d servers and %d workers, server %d "
                         "counts %d and %d", r->name, q->servers, q->workers, s->s, s->S, s->W);
    if (q->mode != (int)s->cfg.mode)
        return ps_refuse(r, q->type, FL_ECONFIG, "%s runs %s mode, server %d serves %s mode",
                         r->name, fl_ps_mode_name((fl_ps_mode)q->mode), s->s,
                         fl_ps_mode_name(s->cfg.mode));
    fl_ps_rep rep = {.type = q->type};
    return ps_send_reply(r, &rep);
}

static int on_save(ps_recv *r, const fl_ps_req *q) {
    ps_server *s = r->s;
    if (!s->cfg.checkpoint_dir[0])
        return ps_refuse(r, q->type, FL_ECONFIG, "%s asks for a save of step %" PRId64 " but "
                         "server %d has no checkpoint directory", r->name, q->step, s->s);
    pthread_mutex_lock(&s->mu);
    ps_shards_pause(s, &r->done, r->tasks); /* queued under mu: after every decided task */
    int rc = ps_save(s, q->step, q->save_mode);
    ps_shards_release(s);
    pthread_mutex_unlock(&s->mu);
    if (rc < 0)
        return ps_refuse(r, q->type, rc, "server %d: %s", s->s, fl_errmsg());
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
        return ps_refuse(r, type, FL_EPEER, "malformed request from %s: %s", r->name, why);
    }
    if (!*hello && q.type != FL_PS_MSG_HELLO)
        return ps_refuse(r, q.type, FL_EPEER, "%s sent %s before HELLO", r->name,
                         fl_ps_msg_name(q.type));
    if (*hello && q.type == FL_PS_MSG_HELLO)
        return ps_refuse(r, q.type, FL_EPEER, "%s sent HELLO twice", r->name);
    switch (q.type) {
    case FL_PS_MSG_HELLO:
        FL_TRY(on_hello(r, &q));
        *hello = true;
        return 0;
    case FL_PS_MSG_DENSE_INIT: return ps_on_dense_init(r, &q);
    case FL_PS_MSG_DENSE_PULL: return ps_on_dense_pull(r, &q);
    case FL_PS_MSG_DENSE_PUSH: return ps_on_dense_push(r, &q);
    case FL_PS_MSG_SPARSE_INIT: return ps_on_sparse_init(r, &q);
    case FL_PS_MSG_SPARSE_PULL: return ps_on_sparse_pull(r, &q);
    case FL_PS_MSG_SPARSE_PUSH: return ps_on_sparse_push(r, &q);
    case FL_PS_MSG_SAVE: return on_save(r, &q);
    case FL_PS_MSG_SHRINK:
    case FL_PS_MSG_STATS: return ps_on_table_pass(r, &q);
    case FL_PS_MSG_STOP: {
        fl_ps_rep rep = {.type = q.type};
        FL_TRY(ps_send_reply(r, &rep));
        return 1;
    }
    }
    return ps_refuse(r, q.type, FL_EPEER, "%s: unhandled request", r->name);
}
