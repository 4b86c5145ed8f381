/* transport.c - the tcp backend's transport (transport.h): its life cycle. Opening listens,
 * connects to every peer and authenticates each connection (connect.h, handshake.h), moves
 * peers on the same host to unix sockets (local.h) and attaches each peer's frame ciphers;
 * freeing says goodbye to every peer. The data path is in transport_sendrecv.c and the files
 * beside it (transport_conn.h says which does what). */
#define _GNU_SOURCE /* F_DUPFD_CLOEXEC */
#include "transport_conn.h"

#include "connect.h"
#include "handshake.h"
#include "local.h"
#include "net.h"
#include "rendezvous.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int peers_sendrecv(fl_peers *p, int to, const void *sbuf, size_t sbytes, int from,
                          void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx) {
    return fl_transport_sendrecv((fl_transport *)p, to, sbuf, sbytes, from, rbuf, rbytes, on_recv,
                                 ctx);
}

static const char *peers_name(const fl_peers *p, int rank) {
    return fl_transport_peer_name((const fl_transport *)p, rank);
}

static void peers_free(fl_peers *p) { fl_transport_free((fl_transport *)p); }

static const struct fl_peers_ops transport_peer_ops = {
    .sendrecv = peers_sendrecv, .peer_name = peers_name, .free = peers_free};

/* Sets up peer p's frame ciphers from its handshake's session (wiped here). "auto" turns
 * encryption off on a unix socket: the same kernel carries both ends. */
static int attach_session(fl_transport *t, int p, fl_hs_session *ses) {
    conn *c = &t->conns[p];
    int rc = 0;
    if (ses->encrypt && !(ses->automatic && c->local)) {
        rc = fl_aead_create(ses->cipher, ses->tx, &c->tx);
        if (rc == 0)
            rc = fl_aead_create(ses->cipher, ses->rx, &c->rx);
        if (rc == 0)
            FL_DEBUG("comm: rank %d: frames with %s encrypted (%s)", t->rank, c->name,
                     fl_aead_cipher_name(ses->cipher));
    }
    fl_hs_session_wipe(ses);
    return rc;
}

/* A transport over connected fds (ownership passes, also on failure). endpoints: [size] or
 * NULL (ownership passes). sessions: [size] each peer's handshake outcome, or NULL (no
 * encryption); wiped. */
static int create(int rank, int size, int *fds, double timeout_s, fl_comm_counters *counters,
                  char (*endpoints)[FL_ENDPOINT_MAX], fl_hs_session *sessions,
                  fl_transport **out) {
    fl_transport *t = calloc(1, sizeof *t);
    if (!t)
        goto nomem;
    t->peers = (fl_peers){.ops = &transport_peer_ops, .rank = rank, .size = size};
    t->rank = rank;
    t->size = size;
    t->timeout_s = timeout_s > 0 ? timeout_s : 300;
    t->spin_s = fl_comm_spin_budget_s();
    t->counters = counters ? counters : &t->own_counters;
    t->abort_skip = -1;
    t->conns = calloc((size_t)size, sizeof *t->conns);
    t->pfd = calloc((size_t)size, sizeof *t->pfd);
    t->pfd_peer = calloc((size_t)size, sizeof *t->pfd_peer);
    if (!t->conns || !t->pfd || !t->pfd_peer)
        goto nomem;
    for (int p = 0; p < size; p++) {
        conn *c = &t->conns[p];
        c->fd = p == rank ? -1 : fds[p];
        fds[p] = -1;
        char where[FL_NET_ADDR_MAX];
        if (endpoints && endpoints[p][0])
            snprintf(where, sizeof where, "%s", endpoints[p]);
        else if (c->fd >= 0)
            fl_net_peer_str(c->fd, where, sizeof where);
        else
            snprintf(where, sizeof where, "local");
        snprintf(c->name, sizeof c->name, "rank %d (%s)", p, where);
        if (c->fd >= 0) {
            struct sockaddr_storage sa;
            socklen_t len = sizeof sa;
            c->local = getsockname(c->fd, (struct sockaddr *)&sa, &len) == 0 &&
                       sa.ss_family == AF_UNIX;
            (void)fl_net_set_nonblock(c->fd);
            fl_net_tune(c->fd);
            if (sessions && attach_session(t, p, &sessions[p]) < 0) {
                int rc = FL_EIO;
                for (int q = p + 1; q < size; q++) {
                    t->conns[q].fd = -1;
                    if (q != rank && fds[q] >= 0)
                        close(fds[q]);
                }
                t->endpoints = endpoints;
                t->failed = true; /* no goodbyes: nothing was said yet */
                fl_transport_free(t);
                return rc;
            }
        }
    }
    t->endpoints = endpoints;
    *out = t;
    return 0;
nomem:
    for (int p = 0; p < size; p++)
        if (p != rank && fds[p] >= 0)
            close(fds[p]);
    free(endpoints);
    fl_transport_free(t);
    return fl_fail(FL_ENOMEM, "out of memory creating a transport for %d ranks", size);
}

int fl_transport_from_fds(int rank, int size, const int *fds, double timeout_s,
                          fl_comm_counters *counters, fl_transport **out) {
    FL_ASSERT(size >= 1 && size <= FL_COMM_MAX_RANKS && rank >= 0 && rank < size && out);
    int *own = malloc((size_t)size * sizeof *own);
    if (!own) {
        for (int p = 0; p < size; p++)
            if (p != rank && fds[p] >= 0)
                close(fds[p]);
        return fl_fail(FL_ENOMEM, "out of memory creating a transport for %d ranks", size);
    }
    memcpy(own, fds, (size_t)size * sizeof *own);
    int rc = 0;
    for (int p = 0; p < size && rc == 0; p++)
        if (p != rank && own[p] < 0)
            rc = fl_fail(FL_EINVAL, "fl_transport_from_fds: no socket for rank %d", p);
    if (rc < 0) {
        for (int p = 0; p < size; p++)
            if (p != rank && own[p] >= 0)
                close(own[p]);
    } else {
        rc = create(rank, size, own, timeout_s, counters, NULL, NULL, out);
    }
    free(own);
    return rc;
}

int fl_transport_open(const fl_comm_env *env, fl_comm_counters *counters, fl_transport **out) {
    FL_ASSERT(env && out && env->size >= 1 && env->rank >= 0 && env->rank < env->size);
    int rank = env->rank, size = env->size, listen_fd = -1, rc = 0;
    double timeout = env->timeout_s > 0 ? env->timeout_s : 300;
    fl_listener *l = NULL;
    fl_hs_config hs;
    int *fds = calloc((size_t)size, sizeof *fds);
    char (*eps)[FL_ENDPOINT_MAX] = calloc((size_t)size, sizeof *eps);
    fl_hs_session *ses = calloc((size_t)size, sizeof *ses);
    if (!fds || !eps || !ses) {
        free(fds);
        free(eps);
        free(ses);
        return fl_fail(FL_ENOMEM, "out of memory opening a transport for %d ranks", size);
    }
    memset(&hs, 0, sizeof hs);
    for (int p = 0; p < size; p++)
        fds[p] = -1;
    if (size == 1) {
        if (env->endpoints)
            memcpy(eps[0], env->endpoints[0], FL_ENDPOINT_MAX);
        eps[0][FL_ENDPOINT_MAX - 1] = '\0';
        rc = create(rank, size, fds, timeout, counters, eps, NULL, out);
        free(fds);
        free(ses); /* one rank: no connections, no sessions */
        return rc;
    }
    if (env->master[0]) {
        rc = fl_rendezvous_exchange(env, eps, &listen_fd);
        if (rc < 0)
            goto fail;
    } else {
        if (!env->endpoints) {
            rc = fl_fail(FL_ECONFIG, "tcp transport: no endpoints for %d ranks (set "
                         "PADDLE_TRAINER_ENDPOINTS, or MASTER_ADDR and MASTER_PORT)", size);
            goto fail;
        }
        memcpy(eps, env->endpoints, (size_t)size * sizeof *eps);
        for (int p = 0; p < size; p++)
            eps[p][FL_ENDPOINT_MAX - 1] = '\0';
        if (env->listen_fd >= 0) {
            listen_fd = fcntl(env->listen_fd, F_DUPFD_CLOEXEC, 3);
            if (listen_fd < 0) {
                rc = fl_fail(FL_EIO, "FLEET_LISTEN_FD=%d: %s", env->listen_fd, strerror(errno));
                goto fail;
            }
            fl_net_tune(listen_fd);
        } else {
            char what[48];
            snprintf(what, sizeof what, "rank %d's endpoint", rank);
            rc = fl_net_listen_endpoint(eps[rank], what, &listen_fd);
            if (rc < 0)
                goto fail;
        }
    }
    rc = fl_hs_config_init(&hs, env->token, env->round, env->encrypt);
    if (rc < 0)
        goto fail;
    rc = fl_listener_create(listen_fd, rank, size, &hs, 0, 0, &l);
    listen_fd = -1;
    if (rc < 0)
        goto fail;
    rc = fl_connect_all(rank, size, (const char(*)[FL_ENDPOINT_MAX])eps, &hs, l, timeout, fds,
                        ses);
    if (rc == 0)
        rc = fl_local_upgrade(rank, size, fds, (const char(*)[FL_ENDPOINT_MAX])eps,
                              !env->tcp_only, fl_now() + timeout, ses);
    if (rc < 0)
        goto fail;
    fl_transport *t;
    rc = create(rank, size, fds, timeout, counters, eps, ses, &t);
    eps = NULL;
    if (rc < 0)
        goto fail;
    t->listener = l;
    l = NULL;
    rc = fl_listener_start(t->listener);
    if (rc < 0) {
        fl_transport_free(t);
        goto fail;
    }
    free(fds);
    free(ses);
    fl_hs_config_wipe(&hs);
    *out = t;
    return 0;
fail:
    if (listen_fd >= 0)
        close(listen_fd);
    for (int p = 0; fds && p < size; p++)
        if (fds[p] >= 0)
            close(fds[p]);
    fl_listener_free(l);
    for (int p = 0; p < size; p++)
        fl_hs_session_wipe(&ses[p]);
    fl_hs_config_wipe(&hs);
    free(ses);
    free(fds);
    free(eps);
    return rc;
}

void fl_transport_free(fl_transport *t) {
    if (!t)
        return;
    fl_listener_free(t->listener);
    double end = fl_now() + ABORT_BUDGET_S;
    for (int p = 0; t->conns && p < t->size; p++) {
        conn *c = &t->conns[p];
        if (c->fd < 0)
            continue;
        if (!t->failed && !c->closed) { /* goodbye: an abort notice with no message */
            uint8_t hdr[HDR + TAG];
            fl_wire_frame_encode(hdr, FL_WIRE_ABORT, c->send_seq, 0);
            if (!c->tx || fl_aead_seal(c->tx, c->send_seq, hdr, HDR, hdr, hdr + HDR, 0,
                                       hdr + HDR) == 0)
                (void)fl_net_write_full(c->fd, hdr, HDR + transport_tag_len(c, true), end);
        }
        /* unread input would turn close into a reset that could discard what we sent last */
        shutdown(c->fd, SHUT_WR);
        char sink[4096];
        for (int i = 0; i < 64 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
            ;
        close(c->fd);
    }
    for (int p = 0; t->conns && p < t->size; p++) { /* wipes the keys */
        fl_aead_free(t->conns[p].tx);
        fl_aead_free(t->conns[p].rx);
        free(t->conns[p].stage);
    }
    free(t->conns);
    free(t->endpoints);
    free(t->pfd);
    free(t->pfd_peer);
    free(t);
}

int fl_transport_rank(const fl_transport *t) { return t->rank; }
int fl_transport_size(const fl_transport *t) { return t->size; }
fl_peers *fl_transport_peers(fl_transport *t) { return &t->peers; }

bool fl_transport_is_local(const fl_transport *t, int rank) {
    return rank >= 0 && rank < t->size && rank != t->rank && t->conns[rank].local;
}

const char *fl_transport_endpoint(const fl_transport *t, int rank) {
    if (rank < 0 || rank >= t->size || !t->endpoints)
        return "";
    return t->endpoints[rank];
}

const char *fl_transport_peer_name(const fl_transport *t, int rank) {
    if (rank < 0 || rank >= t->size)
        return "rank ?";
    return t->conns[rank].name;
}
