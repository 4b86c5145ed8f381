/* server.c - a parameter server's life: fl_ps_init_server listens (and loads its checkpoint
 * shards), fl_ps_run_server accepts every worker and serves them until each has sent STOP. One
 * receiving thread per worker connection reads its requests and hands each to ps_handle
 * (server_requests.c), which decides what it means for the tables and replies. Any protocol
 * error, and a worker that leaves without STOP or (sync) stays silent while others wait for
 * it, fails the server with a message naming the worker; every waiting request is then
 * answered with that message. */
#include "server.h"

#include "ps_wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RECV_SLICE_S 0.5 /* how often a receiving thread looks up from its socket */
#define FAIL_GRACE_S 2.0 /* how long a failed server still answers requests with why */



/* After the server failed: answers what the worker still sends (a request already on its
 * way) with the failure, for a short while or until the worker closes, so that it hears why
 * instead of seeing the connection vanish. */
static void drain_failed(ps_recv *r) {
    double end = ps_now_s() + FAIL_GRACE_S;
    for (double left; (left = end - ps_now_s()) > 0;) {
        size_t n = 0;
        int rc = fl_msg_recv(r->m, &r->buf, &r->cap, &n, left);
        if (rc != 1)
            return;
        int type = n >= 6 ? (int)(((const uint8_t *)r->buf)[4] |
                                  ((const uint8_t *)r->buf)[5] << 8) : 0;
        pthread_mutex_lock(&r->s->mu);
        ps_failed_reply(r, type);
        pthread_mutex_unlock(&r->s->mu);
    }
}

static void *recv_main(void *arg) {
    ps_recv *r = arg;
    ps_server *s = r->s;
    bool hello = false;
    double last = ps_now_s();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool failed = s->failed;
        pthread_mutex_unlock(&s->mu);
        if (failed) {
            drain_failed(r);
            return NULL;
        }
        size_t n = 0;
        int rc = fl_msg_recv(r->m, &r->buf, &r->cap, &n, RECV_SLICE_S);
        if (rc == FL_ETIMEOUT) {
            char what[160];
            pthread_mutex_lock(&s->mu);
            bool waited = s->cfg.mode == FL_PS_SYNC && ps_now_s() - last > s->ps->msg.timeout_s &&
                          ps_waiting_on(s, r->w, what, sizeof what);
            pthread_mutex_unlock(&s->mu);
            if (waited) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s sent nothing for %g s (FLEET_COMM_TIMEOUT) while "
                         "the others wait for %s", r->name, s->ps->msg.timeout_s, what);
                ps_server_fail(s, FL_ETIMEOUT, msg);
                return NULL;
            }
            continue;
        }
        if (rc == 0 || rc < 0) {
            char msg[1024];
            if (rc == 0)
                snprintf(msg, sizeof msg, "%s closed its connection before STOP", r->name);
            else
                snprintf(msg, sizeof msg, "%s: connection failed before STOP: %s", r->name,
                         fl_errmsg());
            ps_server_fail(s, FL_EPEER, msg);
            return NULL;
        }
        last = ps_now_s();
        rc = ps_handle(r, r->buf, n, &hello);
        if (rc < 0) {
            ps_server_fail(s, rc, fl_errmsg()); /* a no-op after refuse(); send failures land here */
            return NULL;
        }
        if (rc == 1) {
            pthread_mutex_lock(&s->mu);
            s->stopped++;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
    }
}

/* ---- life cycle ---- */

int fl_ps_init_server(fl_ps *ps, const fl_ps_server_config *c) {
    FL_ASSERT(ps && c);
    if (!ps->server)
        return fl_fail(FL_ESTATE, "fl_ps_init_server on a worker (TRAINING_ROLE=TRAINER)");
    if (ps->srv)
        return fl_fail(FL_ESTATE, "fl_ps_init_server called twice");
    if (c->threads < 1 || c->threads > 256)
        return fl_fail(FL_ECONFIG, "ps.server_threads = %d (1..256)", c->threads);
    if (c->mode < FL_PS_SYNC || c->mode > FL_PS_GEO)
        return fl_fail(FL_ECONFIG, "unknown parameter-server mode %d", (int)c->mode);
    if (c->resume && !c->checkpoint_dir[0])
        return fl_fail(FL_ECONFIG, "parameter server %d asked to resume without a checkpoint "
                       "directory", ps->index);
    ps_server *s = calloc(1, sizeof *s);
    if (!s)
        return fl_fail(FL_ENOMEM, "out of memory");
    s->ps = ps;
    s->cfg = *c;
    s->S = ps->nservers;
    s->W = ps->nworkers;
    s->T = c->threads;
    s->s = ps->index;
    s->loaded_step = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    ps->srv = s;
    s->shards = calloc((size_t)s->T, sizeof *s->shards);
    s->conns = calloc((size_t)s->W, sizeof *s->conns);
    s->names = calloc((size_t)s->W, sizeof *s->names);
    if (!s->shards || !s->conns || !s->names) {
        int fd = ps->listen_fd;
        ps->listen_fd = -1;
        if (fd >= 0)
            close(fd);
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    for (int w = 0; w < s->W; w++)
        snprintf(s->names[w], sizeof s->names[w], "worker %d", w);
    int rc = 0;
    if (c->resume)
        rc = ps_load(s);
    int fd = ps->listen_fd;
    ps->listen_fd = -1;
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    rc = fl_msg_listen(&ps->msg, s->s, ps->servers[s->s], fd, &s->listener);
    if (rc < 0)
        return fl_fail_prefix(rc, "parameter server %d", s->s);
    return 0;
}

/* "worker 2 (endpoint)": the trainer endpoint when the job lists them, else the address the
 * connection came from (msgconn names it "rank R (address)"). */
static void name_worker(ps_server *s, int w) {
    const char *ep = s->ps->workers ? s->ps->workers[w] : NULL;
    char addr[128] = "";
    if (!ep) {
        const char *p = strchr(fl_msg_peer_name(s->conns[w]), '(');
        if (p) {
            snprintf(addr, sizeof addr, "%s", p + 1);
            char *e = strrchr(addr, ')');
            if (e)
                *e = '\0';
        }
        ep = addr;
    }
    if (ep[0])
        snprintf(s->names[w], sizeof s->names[w], "worker %d (%s)", w, ep);
    fl_msg_set_name(s->conns[w], s->names[w]);
}

int fl_ps_run_server(fl_ps *ps) {
    FL_ASSERT(ps);
    ps_server *s = ps->srv;
    if (!s || !s->listener)
        return fl_fail(FL_ESTATE, "fl_ps_run_server before fl_ps_init_server");
    int rc = fl_msg_accept_all(s->listener, s->S, s->S + s->W, s->conns);
    if (rc < 0)
        return fl_fail_prefix(rc, "parameter server %d (%s)", s->s, ps->servers[s->s]);
    for (int w = 0; w < s->W; w++)
        name_worker(s, w);
    FL_INFO("ps server %d (%s): %d workers connected; %s mode, %d threads", s->s,
            ps->servers[s->s], s->W, fl_ps_mode_name(s->cfg.mode), s->T);
    ps_recv *rv = calloc((size_t)s->W, sizeof *rv);
    if (!rv)
        return fl_fail(FL_ENOMEM, "out of memory");
    rc = ps_shards_start(s);
    for (int w = 0; rc == 0 && w < s->W; w++) {
        ps_recv *r = &rv[w];
        r->s = s;
        r->w = w;
        r->m = s->conns[w];
        r->name = s->names[w];
        ps_done_init(&r->done);
        r->tasks = calloc((size_t)s->T, sizeof *r->tasks);
        r->cnt = calloc((size_t)s->T, sizeof *r->cnt);
        r->off = calloc((size_t)s->T, sizeof *r->off);
        if (!r->tasks || !r->cnt || !r->off) {
            rc = fl_fail(FL_ENOMEM, "out of memory");
            ps_server_fail(s, rc, fl_errmsg());
            break;
        }
        if (pthread_create(&r->thread, NULL, recv_main, r) != 0) {
            rc = fl_fail(FL_ENOMEM, "cannot start the thread of %s", r->name);
            ps_server_fail(s, rc, fl_errmsg());
            break;
        }
        r->started = true;
    }
    pthread_mutex_lock(&s->mu);
    while (s->stopped < s->W && !s->failed)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    for (int w = 0; w < s->W; w++) {
        ps_recv *r = &rv[w];
        if (r->started)
            pthread_join(r->thread, NULL);
        if (r->s)
            ps_done_destroy(&r->done);
        free(r->buf);
        free(r->tasks);
        free(r->out);
        free(r->ids);
        free(r->pos);
        free(r->th);
        free(r->tmp);
        free(r->tmpc);
        free(r->cnt);
        free(r->off);
    }
    free(rv);
    ps_shards_stop(s);
    for (int w = 0; w < s->W; w++) {
        fl_msg_close(s->conns[w]);
        s->conns[w] = NULL;
    }
    if (s->stale_n)
        FL_INFO("ps server %d: %" PRId64 " async pushes, staleness mean %.2f, max %" PRId64,
                s->s, s->stale_n, (double)s->stale_sum / (double)s->stale_n, s->stale_max);
    if (s->failed)
        return fl_fail(FL_EPEER, "%s", s->fail_msg);
    if (rc == 0 && s->chain.n > 0) /* the workers' final `latest` has moved by now */
        ps_prune(s, s->chain.step);
    return rc;
}

void fl_ps_server_free(ps_server *s) {
    if (!s)
        return;
    for (int w = 0; s->conns && w < s->W; w++)
        fl_msg_close(s->conns[w]);
    fl_msg_listener_free(s->listener);
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        if (s->dense[t].declared)
            ps_dense_free(&s->dense[t]);
        if (s->sparse[t].declared)
            ps_sparse_table_free(s, &s->sparse[t]);
    }
    free(s->shards);
    free(s->conns);
    free(s->names);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
