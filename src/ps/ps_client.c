/* ps_client.c - a worker's side of the parameter server: its connections to every server and
 * the calls over them. An operation sends its requests to all the servers it involves first and
 * collects the replies after, so the servers work in parallel; a server that fails, closes or
 * stays silent past FLEET_COMM_TIMEOUT is named ("server 1 (127.0.0.1:6170)"). Calls on one
 * handle may come from several threads (async: the communicator's pushes and pulls, the
 * training thread's SAVE): each runs whole under the client's lock, its request and reply
 * never interleaved with another's. Here too: HELLO, STOP, SAVE and the client's counters; the
 * table operations are ps_client_dense.c's and ps_client_sparse.c's. */
#include "ps_client.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPLY_SLACK_S 2.0 /* a server's own verdict on a silent worker comes first */
/* After one server's refusal, how long the others owing a reply of the same operation may
 * take: the servers of an operation get its requests at once and give up on a missing worker
 * at the same moment, so a healthy one answers within milliseconds of the first */
#define REFUSAL_GRACE_S 1.0

int ps_client_sendv(fl_ps *ps, int s, const fl_msg_part *parts, int nparts) {
    ps->cli->pending[s] = 1;
    return fl_msg_sendv(ps->cli->conns[s], parts, nparts);
}

int ps_client_send(fl_ps *ps, int s, const fl_ps_req *q) {
    uint8_t head[FL_PS_HEAD_MAX];
    fl_ps_span sp[FL_PS_REQ_PARTS];
    int np = fl_ps_req_encode(q, head, sp);
    fl_msg_part parts[FL_PS_REQ_PARTS];
    for (int i = 0; i < np; i++)
        parts[i] = (fl_msg_part){sp[i].p, sp[i].n};
    return ps_client_sendv(ps, s, parts, np);
}

/* Server s refused a `type` request with `refusal`: a server still owing this operation its
 * reply that closed, or stays silent for REFUSAL_GRACE_S more, is the likelier cause and is
 * named first (its reply, if one comes, is dropped: the operation fails either way). */
static int refused(fl_ps *ps, int s, int type, const char *refusal) {
    ps_client *c = ps->cli;
    for (int t = 0; t < ps->nservers; t++) {
        if (t == s || !c->pending[t] || !c->conns[t])
            continue;
        c->pending[t] = 0;
        size_t n = 0;
        int rc = fl_msg_recv(c->conns[t], &c->rbuf[t], &c->rcap[t], &n, REFUSAL_GRACE_S);
        if (rc == 0)
            return fl_fail(FL_EPEER, "%s closed the connection (waiting for its %s reply); "
                           "besides, %s", c->names[t], fl_ps_msg_name(type), refusal);
        if (rc == FL_ETIMEOUT)
            return fl_fail(FL_EPEER, "%s is silent: no %s reply %.1f s after %s; besides, %s",
                           c->names[t], fl_ps_msg_name(type), REFUSAL_GRACE_S,
                           c->names[s], refusal);
        if (rc < 0) /* reset, broken framing, failed authentication: the connection says which */
            return fl_fail_prefix(FL_EPEER, "%s, waiting for its %s reply (besides, %s)",
                                  c->names[t], fl_ps_msg_name(type), refusal);
    }
    return fl_fail(FL_EPEER, "%s", refusal);
}

int ps_client_recv(fl_ps *ps, int s, int type, fl_ps_rep *rep) {
    ps_client *c = ps->cli;
    size_t n = 0;
    c->pending[s] = 0;
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
    if (rep->status) {
        char refusal[FL_PS_ERR_MAX + 128];
        snprintf(refusal, sizeof refusal, "%s refused %s: %.*s", c->names[s],
                 fl_ps_msg_name(type), (int)rep->err_len, rep->err);
        return refused(ps, s, type, refusal);
    }
    return 0;
}

int ps_client_all(fl_ps *ps, const fl_ps_req *q, fl_ps_rep *last) {
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(ps_client_send(ps, s, q));
    for (int s = 0; s < ps->nservers; s++)
        FL_TRY(ps_client_recv(ps, s, q->type, last));
    return 0;
}

int ps_client_need(const fl_ps *ps) {
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
    c->pending = calloc((size_t)S, sizeof *c->pending);
    if (!c->conns || !c->names || !c->rbuf || !c->rcap || !c->cnt || !c->off || !c->pending)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (int s = 0; s < S; s++) {
        snprintf(c->names[s], sizeof c->names[s], "server %d (%s)", s, ps->servers[s]);
        FL_TRY(fl_msg_connect(&ps->msg, S + ps->index, s, ps->servers[s], &c->conns[s]));
        fl_msg_set_name(c->conns[s], c->names[s]);
    }
    fl_ps_req q = {.type = FL_PS_MSG_HELLO, .worker = ps->index, .mode = mode, .servers = S,
                   .workers = ps->nworkers, .version = FL_PS_WIRE_VERSION};
    fl_ps_rep rep;
    FL_TRY(ps_client_all(ps, &q, &rep));
    FL_INFO("ps worker %d: connected to %d server%s (%s mode)", ps->index, S, S == 1 ? "" : "s",
            fl_ps_mode_name(mode));
    return 0;
}

static int stop_worker_locked(fl_ps *ps) {
    FL_TRY(ps_client_need(ps));
    ps_client *c = ps->cli;
    fl_ps_req q = {.type = FL_PS_MSG_STOP};
    fl_ps_rep rep;
    int rc = ps_client_all(ps, &q, &rep);
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
    free(c->pending);
    pthread_mutex_destroy(&c->call);
    free(c);
}

int ps_client_lock(fl_ps *ps) {
    FL_TRY(ps_client_need(ps));
    pthread_mutex_lock(&ps->cli->call);
    return 0;
}

int ps_client_unlock(fl_ps *ps, int rc) {
    pthread_mutex_unlock(&ps->cli->call);
    return rc;
}

int ps_client_check_table(int table) {
    if (table < 0 || table >= FL_PS_MAX_TABLES)
        return fl_fail(FL_EINVAL, "table %d out of range (0..%d)", table, FL_PS_MAX_TABLES - 1);
    return 0;
}

void ps_client_count_push(ps_client *c, int64_t stale) {
    c->st.pushes++;
    c->stale_sum += (double)stale;
    if (stale > c->st.max_staleness)
        c->st.max_staleness = stale;
}

static int save_locked(fl_ps *ps, int64_t step, int mode) {
    FL_TRY(ps_client_need(ps));
    if (step < 0 || (mode != FL_PS_SAVE_ALL && mode != FL_PS_SAVE_DELTA))
        return fl_fail(FL_EINVAL, "fl_ps_save of step %" PRId64 " mode %d", step, mode);
    fl_ps_req q = {.type = FL_PS_MSG_SAVE, .step = step, .save_mode = mode};
    fl_ps_rep rep;
    return ps_client_all(ps, &q, &rep);
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

int fl_ps_stop_worker(fl_ps *ps) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, stop_worker_locked(ps));
}

int fl_ps_save(fl_ps *ps, int64_t step, int mode) {
    FL_TRY(ps_client_lock(ps));
    return ps_client_unlock(ps, save_locked(ps, step, mode));
}
