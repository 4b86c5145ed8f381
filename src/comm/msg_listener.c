/* msg_listener.c - opening message connections (include/fleet/msgconn.h): the server side
 * listens through the tcp transport's listener (listener.h), driven by a poll loop here until
 * every expected client passed the handshake and by the listener's own thread afterwards; the
 * client side dials with fl_hs_connect_blocking, retrying while the server is not listening
 * yet. Both say FL_WIRE_FLAG_MSG in the hello, so collective ranks and message clients never
 * take each other for peers. The connections themselves are msgconn.c's. */
#include "msgconn_impl.h"

#include "listener.h"
#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BACKOFF_FIRST_S 0.01
#define BACKOFF_MAX_S   0.5
#define MISSING_NAMED   16 /* ranks listed by name in a timeout message */

struct fl_msg_listener {
    fl_listener *l;
    int          rank, world;
    double       timeout_s;
    bool         started; /* accept_all succeeded: the listener's thread refuses newcomers */
    char         where[FL_NET_ADDR_MAX];
};

/* What both ends check before any socket: 0 or FL_ECONFIG naming the value. */
static int check_config(const fl_msg_config *c, int rank) {
    if (c->world < 1 || c->world > FL_WIRE_MAX_RANKS)
        return fl_fail(FL_ECONFIG, "message connections: a job of %d ranks (servers + workers; "
                       "1 to %d)", c->world, FL_WIRE_MAX_RANKS);
    if (rank < 0 || rank >= c->world)
        return fl_fail(FL_ECONFIG, "message connections: rank %d out of range for %d ranks",
                       rank, c->world);
    if (!c->token[0] && c->world > 1)
        return fl_fail(FL_ECONFIG, "message connections: no job token (FLEET_JOB_TOKEN) for a "
                       "job of %d ranks", c->world);
    if (c->encrypt < FL_COMM_ENCRYPT_AUTO || c->encrypt > FL_COMM_ENCRYPT_ON)
        return fl_fail(FL_ECONFIG, "message connections: encryption mode %d (auto 0, off 1, "
                       "on 2)", c->encrypt);
    return 0;
}

/* ---------------------------------------------------------------- server side */

int fl_msg_listen(const fl_msg_config *c, int rank, const char *endpoint, int listen_fd,
                  fl_msg_listener **out) {
    FL_ASSERT(c && out && (endpoint || listen_fd >= 0));
    *out = NULL;
    fl_hs_config hs;
    memset(&hs, 0, sizeof hs);
    fl_msg_listener *ml = NULL;
    int fd = listen_fd, rc = check_config(c, rank);
    if (rc < 0)
        goto fail;
    if (fd < 0) {
        char what[48];
        snprintf(what, sizeof what, "server %d's endpoint", rank);
        rc = fl_net_listen_endpoint(endpoint, what, &fd);
        if (rc < 0)
            goto fail;
    } else {
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
        fl_net_tune(fd);
    }
    ml = calloc(1, sizeof *ml);
    if (!ml) {
        rc = fl_fail(FL_ENOMEM, "out of memory for server %d's listener", rank);
        goto fail;
    }
    ml->rank = rank;
    ml->world = c->world;
    ml->timeout_s = fl_msg_config_timeout(c);
    if (endpoint)
        snprintf(ml->where, sizeof ml->where, "%s", endpoint);
    else
        fl_net_local_str(fd, ml->where, sizeof ml->where);
    rc = fl_hs_config_init(&hs, c->token, c->round, c->encrypt);
    if (rc < 0)
        goto fail;
    rc = fl_listener_create(fd, rank, c->world, &hs, FL_WIRE_FLAG_MSG, 0, &ml->l);
    fd = -1; /* the listener owns it now, also on failure */
    fl_hs_config_wipe(&hs);
    if (rc < 0)
        goto fail;
    *out = ml;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    fl_hs_config_wipe(&hs);
    free(ml);
    return rc;
}

/* "3, 4, 7" (the first MISSING_NAMED, then a count) of the ranks lo + i with !got[i]. */
static void missing_list(const fl_msg_conn *const *conns, int lo, int hi, char *buf,
                         size_t cap) {
    size_t at = 0;
    int named = 0, more = 0;
    buf[0] = '\0';
    for (int i = 0; i < hi - lo; i++) {
        if (conns[i])
            continue;
        if (named++ >= MISSING_NAMED) {
            more++;
            continue;
        }
        int k = snprintf(buf + at, cap - at, "%s%d", at ? ", " : "", lo + i);
        if (k > 0 && (size_t)k < cap - at)
            at += (size_t)k;
    }
    if (more)
        snprintf(buf + at, cap - at, " and %d more", more);
}

int fl_msg_accept_all(fl_msg_listener *ml, int lo, int hi, fl_msg_conn **conns) {
    FL_ASSERT(ml && !ml->started && ml->rank < lo && lo <= hi && hi <= ml->world &&
              (conns || lo == hi));
    for (int i = 0; i < hi - lo; i++)
        conns[i] = NULL;
    int want = hi - lo, have = 0, rc = 0;
    double deadline = fl_now() + ml->timeout_s;
    while (have < want) {
        struct pollfd pfd[FL_LISTENER_POLLFDS];
        double until = deadline;
        int n = fl_listener_pollfds(ml->l, pfd, &until);
        int pr = poll(pfd, (nfds_t)n, fl_net_poll_ms(until));
        if (pr < 0 && errno != EINTR) {
            rc = fl_fail(FL_EIO, "server %d (%s): poll: %s", ml->rank, ml->where,
                         strerror(errno));
            goto fail;
        }
        fl_listener_handle(ml->l, pfd, pr > 0 ? n : 0);
        int r, fd;
        fl_hs_session ses;
        while ((fd = fl_listener_take(ml->l, &r, NULL, &ses)) >= 0) {
            char addr[FL_NET_ADDR_MAX], name[FL_NET_ADDR_MAX + 32];
            fl_net_peer_str(fd, addr, sizeof addr);
            if (r < lo || r >= hi) { /* a rank that passed the handshake but is not a client */
                FL_WARN("comm: server %d dropped rank %d from %s: not one of the clients "
                        "expected here (ranks %d to %d)", ml->rank, r, addr, lo, hi - 1);
                fl_hs_session_wipe(&ses);
                close(fd);
                continue;
            }
            snprintf(name, sizeof name, "rank %d (%s)", r, addr);
            rc = fl_msg_conn_create(fd, ml->timeout_s, name, &ses, &conns[r - lo]);
            if (rc < 0)
                goto fail;
            have++;
        }
        if (have < want && fl_now() >= deadline) {
            char missing[256];
            missing_list((const fl_msg_conn *const *)conns, lo, hi, missing, sizeof missing);
            rc = fl_fail(FL_ETIMEOUT, "server %d (%s): no client connected as rank %s within %g "
                         "s (FLEET_COMM_TIMEOUT; connections refused meanwhile are in the log)",
                         ml->rank, ml->where, missing, ml->timeout_s);
            goto fail;
        }
    }
    rc = fl_listener_start(ml->l);
    if (rc < 0)
        goto fail;
    ml->started = true;
    return 0;
fail:
    for (int i = 0; i < hi - lo; i++) {
        fl_msg_close(conns[i]);
        conns[i] = NULL;
    }
    return rc;
}

void fl_msg_listener_free(fl_msg_listener *ml) {
    if (!ml)
        return;
    fl_listener_free(ml->l); /* stops its thread, closes what it holds, wipes its keys */
    free(ml);
}

/* ---------------------------------------------------------------- client side */

/* A refusal or a bad answer from the server (name: "server 1 (127.0.0.1:6170)"). */
static int refused(const char *name, int st, uint32_t theirs, const char *reason) {
    if (st == FL_WIRE_BAD_VERSION || theirs == FL_WIRE_BAD_VERSION)
        return fl_fail(FL_EPEER, "%s speaks another fleet wire protocol version (%s; this rank "
                       "speaks version %d): every rank must run the same fleet version", name,
                       theirs == FL_WIRE_BAD_VERSION ? "it refused ours" : reason,
                       FL_WIRE_VERSION);
    if (theirs == FL_WIRE_BAD_FLAGS)
        return fl_fail(FL_EPEER, "%s refused our handshake: it is not a message listener (a "
                       "collective rank's port? check the server endpoints)", name);
    if (theirs == FL_WIRE_BAD_TOKEN)
        return fl_fail(FL_EPEER, "%s refused our handshake: wrong job token (check "
                       "FLEET_JOB_TOKEN)", name);
    if (theirs != FL_WIRE_OK)
        return fl_fail(FL_EPEER, "%s refused our handshake: %s (check FLEET_JOB_TOKEN and the "
                       "server endpoints)", name, fl_wire_status_str((int)theirs));
    if (st == FL_WIRE_BAD_TOKEN)
        return fl_fail(FL_EPEER, "%s failed the handshake: %s (check FLEET_JOB_TOKEN)", name,
                       reason);
    return fl_fail(FL_EPEER, "%s answered our handshake with a malformed message: %s (is "
                   "another program on that port?)", name, reason);
}

/* One attempt: a connected socket, or -1 with why in *why (static text or errbuf). */
static int dial_once(const struct sockaddr_storage *ss, socklen_t len, double deadline,
                     const char **why, char *errbuf, size_t cap) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(errbuf, cap, "socket: %s", strerror(errno));
        *why = errbuf;
        return -1;
    }
    fl_net_tune(fd); /* before connect: the window scale is fixed by the SYN */
    int err = 0;
    if (connect(fd, (const struct sockaddr *)ss, len) < 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int pr;
            do
                pr = poll(&p, 1, fl_net_poll_ms(deadline));
            while (pr < 0 && errno == EINTR);
            socklen_t el = sizeof err;
            if (pr == 0)
                err = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
                err = errno;
        }
    }
    if (err) {
        snprintf(errbuf, cap, "%s", strerror(err));
        *why = errbuf;
        close(fd);
        return -1;
    }
    return fd;
}

int fl_msg_connect(const fl_msg_config *c, int rank, int server, const char *endpoint,
                   fl_msg_conn **out) {
    FL_ASSERT(c && endpoint && out);
    *out = NULL;
    FL_TRY(check_config(c, rank));
    if (server < 0 || server >= rank)
        return fl_fail(FL_ECONFIG, "message connections: rank %d cannot dial rank %d (clients "
                       "dial lower ranks)", rank, server);
    char name[FL_ENDPOINT_MAX + 32], what[48];
    snprintf(name, sizeof name, "server %d (%s)", server, endpoint);
    snprintf(what, sizeof what, "server %d's endpoint", server);
    struct sockaddr_storage ss;
    socklen_t len;
    FL_TRY(fl_net_resolve(endpoint, what, &ss, &len));
    fl_hs_config hs;
    FL_TRY(fl_hs_config_init(&hs, c->token, c->round, c->encrypt));
    double timeout = fl_msg_config_timeout(c), deadline = fl_now() + timeout;
    double backoff = BACKOFF_FIRST_S;
    const char *why = "no attempt";
    char errbuf[160], reason[160];
    int rc;
    for (;;) {
        int fd = dial_once(&ss, len, deadline, &why, errbuf, sizeof errbuf);
        if (fd >= 0) {
            uint32_t theirs = FL_WIRE_OK;
            fl_hs_session ses;
            int st = fl_hs_connect_blocking(fd, &hs, FL_WIRE_FLAG_MSG, (uint32_t)rank,
                                            (uint32_t)c->world, (uint32_t)server, NULL, 0,
                                            deadline, &theirs, &ses, reason, sizeof reason);
            if (st == FL_WIRE_OK) {
                rc = fl_msg_conn_create(fd, timeout, name, &ses, out);
                break;
            }
            close(fd);
            if (st > 0) {
                rc = refused(name, st, theirs, reason);
                break;
            }
            /* closed or reset during the handshake (its queue of pending connections was
             * full, say): try again; a timeout ends the loop below */
            snprintf(errbuf, sizeof errbuf, "%s during the handshake",
                     st == -1 ? "closed" : strerror(-st));
            why = errbuf;
        }
        double now = fl_now();
        if (now + backoff >= deadline) {
            rc = fl_fail(FL_ETIMEOUT, "cannot reach %s within %g s (FLEET_COMM_TIMEOUT): %s",
                         name, timeout, why);
            break;
        }
        usleep((useconds_t)(backoff * 1e6));
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    fl_hs_config_wipe(&hs);
    return rc;
}
