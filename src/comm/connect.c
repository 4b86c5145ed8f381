/* connect.c - the tcp transport's set-up (connect.h): rank r dials every rank below it and is
 * dialled by every rank above it. Dials and the listener share one poll loop, so a peer that
 * is slow to start delays nobody else, and a dial refused because its peer is not listening
 * yet is retried with backoff until the deadline. */
#include "connect.h"

#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <openssl/crypto.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the connector's side of handshake.h: hello out, challenge in, proof out, reply in */
enum { D_WAIT, D_CONNECTING, D_HELLO, D_CHALLENGE, D_PROOF, D_REPLY, D_DONE };

#define BACKOFF_FIRST_S 0.01
#define BACKOFF_MAX_S   0.5

typedef struct {
    int                     state, fd, pfd_index;
    double                  retry_at, backoff;
    struct sockaddr_storage ss;
    socklen_t               len;
    size_t                  pos;
    fl_hs_transcript        t;
    uint8_t                 out[FL_WIRE_HELLO_SIZE]; /* hello, then proof */
    size_t                  out_len;
    uint8_t                 in[FL_WIRE_CHALLENGE_SIZE]; /* challenge, then reply */
    fl_hs_session           session;
    const char             *last_err; /* why the last attempt did not get through */
} dial;

/* The attempt failed in a way that may pass (peer not listening yet, reset): try again. */
static void retry_later(dial *d, double now, const char *why) {
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    d->state = D_WAIT;
    d->last_err = why;
    d->retry_at = now + d->backoff;
    d->backoff = d->backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : d->backoff * 2;
}

static void dial_start(dial *d, double now) {
    d->fd = socket(d->ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd < 0) {
        retry_later(d, now, strerror(errno));
        return;
    }
    fl_net_tune(d->fd); /* before connect: the window scale is fixed by the SYN */
    d->pos = 0;
    d->out_len = 0; /* the hello is made once connected (its options need the address) */
    if (connect(d->fd, (struct sockaddr *)&d->ss, d->len) == 0)
        d->state = D_HELLO;
    else if (errno == EINPROGRESS || errno == EINTR)
        d->state = D_CONNECTING;
    else
        retry_later(d, now, strerror(errno));
}

/* Sends what is left of d->out; true when all of it went. */
static bool send_out(dial *d, double now) {
    ssize_t k = send(d->fd, d->out + d->pos, d->out_len - d->pos, MSG_NOSIGNAL);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            retry_later(d, now, strerror(errno));
        return false;
    }
    d->pos += (size_t)k;
    if (d->pos < d->out_len)
        return false;
    d->pos = 0;
    return true;
}

/* Reads toward d->in[want]; true when something came (d->pos advanced). */
static bool recv_in(dial *d, size_t want, double now) {
    ssize_t k = recv(d->fd, d->in + d->pos, want - d->pos, 0);
    if (k == 0) {
        retry_later(d, now, "closed the connection before answering the handshake");
        return false;
    }
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            retry_later(d, now, strerror(errno));
        return false;
    }
    d->pos += (size_t)k;
    return true;
}

/* A refusal or a bad answer from rank j. */
static int refused(int j, const char *ep, int st, uint32_t theirs, const char *reason) {
    if (st == FL_WIRE_BAD_VERSION || theirs == FL_WIRE_BAD_VERSION)
        return fl_fail(FL_EPEER, "rank %d (%s) speaks another fleet wire protocol version "
                       "(%s; this rank speaks version %d): every rank must run the same fleet "
                       "version", j, ep, theirs == FL_WIRE_BAD_VERSION ? "it refused ours"
                                                                         : reason,
                       FL_WIRE_VERSION);
    if (theirs != FL_WIRE_OK)
        return fl_fail(FL_EPEER, "rank %d (%s) refused our handshake: %s (check "
                       "FLEET_JOB_TOKEN and the endpoint list)", j, ep,
                       fl_wire_status_str((int)theirs));
    if (st == FL_WIRE_BAD_TOKEN)
        return fl_fail(FL_EPEER, "rank %d (%s) failed the handshake: %s (check FLEET_JOB_TOKEN "
                       "and the endpoint list)", j, ep, reason);
    return fl_fail(FL_EPEER, "rank %d (%s) answered our handshake with a malformed message: "
                   "%s (is another program on that port?)", j, ep, reason);
}

/* Advances one dial after poll reported on it. 0, or FL_EPEER when the peer refused us. */
static int dial_step(dial *d, short revents, int j, const char *ep, const fl_hs_config *hs,
                     int rank, int size, double now) {
    if (d->state == D_CONNECTING) {
        int err = 0;
        socklen_t el = sizeof err;
        if (getsockopt(d->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
            err = errno;
        if (err || (revents & (POLLERR | POLLHUP))) {
            retry_later(d, now, err ? strerror(err) : "connection failed");
            return 0;
        }
        if (!(revents & POLLOUT))
            return 0;
        d->state = D_HELLO;
    }
    if (d->state == D_HELLO && d->out_len == 0) { /* a fresh nonce for every attempt */
        d->t = (fl_hs_transcript){.flags = 0, .size = (uint32_t)size, .round = hs->round,
                                  .rank_c = (uint32_t)rank, .rank_a = (uint32_t)j,
                                  .opt_c = fl_hs_options(hs, fl_hs_fd_is_loopback(d->fd))};
        if (fl_crypto_random(d->t.nonce_c, FL_WIRE_HS_NONCE) < 0)
            return FL_EIO;
        fl_wire_hello h = {.rank = (uint32_t)rank, .size = (uint32_t)size, .round = hs->round,
                           .options = d->t.opt_c};
        memcpy(h.nonce, d->t.nonce_c, FL_WIRE_HS_NONCE);
        fl_wire_hello_encode(d->out, &h);
        d->out_len = FL_WIRE_HELLO_SIZE;
        d->pos = 0;
    }
    if (d->state == D_HELLO) {
        if (!send_out(d, now))
            return 0;
        d->state = D_CHALLENGE;
        return 0; /* the challenge comes later: poll for it */
    }
    char reason[160];
    uint32_t theirs;
    if (d->state == D_CHALLENGE) {
        size_t want = d->pos < FL_WIRE_REPLY_SIZE ? FL_WIRE_REPLY_SIZE : FL_WIRE_CHALLENGE_SIZE;
        if (!recv_in(d, want, now))
            return 0;
        fl_wire_challenge c;
        int st = fl_wire_challenge_parse(d->in, d->pos, (uint32_t)j, &theirs, &c, reason,
                                         sizeof reason);
        if (st == FL_WIRE_TRUNCATED)
            return 0;
        if (st != FL_WIRE_OK)
            return refused(j, ep, st, theirs, reason);
        d->t.opt_a = c.options;
        memcpy(d->t.nonce_a, c.nonce, FL_WIRE_HS_NONCE);
        if (!fl_hs_check(hs, FL_HS_ACCEPTOR, &d->t, c.mac))
            return refused(j, ep, FL_WIRE_BAD_TOKEN, FL_WIRE_OK,
                           "its proof of the job token is wrong (another job on that port?)");
        uint8_t mac[FL_WIRE_HS_MAC];
        if (fl_hs_mac(hs, FL_HS_CONNECTOR, &d->t, mac) < 0)
            return FL_EIO;
        fl_wire_auth_encode(d->out, (uint32_t)rank, mac);
        d->out_len = FL_WIRE_AUTH_SIZE;
        d->pos = 0;
        d->state = D_PROOF;
    }
    if (d->state == D_PROOF) {
        if (!send_out(d, now))
            return 0;
        d->state = D_REPLY;
        return 0;
    }
    if (d->state == D_REPLY) {
        if (!recv_in(d, FL_WIRE_REPLY_SIZE, now))
            return 0;
        int st = fl_wire_reply_parse(d->in, d->pos, (uint32_t)j, &theirs, reason,
                                     sizeof reason);
        if (st == FL_WIRE_TRUNCATED)
            return 0;
        if (st != FL_WIRE_OK)
            return refused(j, ep, st, theirs, reason);
        if (fl_hs_session_make(hs, FL_HS_CONNECTOR, &d->t, &d->session) < 0)
            return FL_EIO;
        d->state = D_DONE;
    }
    return 0;
}

/* "rank 0 (127.0.0.1:6170): Connection refused, rank 3 (...)" into buf. */
static void list_missing(int rank, int size, const char (*endpoints)[FL_ENDPOINT_MAX],
                         const dial *d, const int *fds, char *buf, size_t cap) {
    size_t n = 0;
    int listed = 0;
    buf[0] = '\0';
    for (int j = 0; j < size && n < cap; j++) {
        if (j == rank || (j < rank ? d[j].state == D_DONE : fds[j] >= 0))
            continue;
        if (listed == 8) {
            snprintf(buf + n, cap - n, ", ...");
            break;
        }
        const char *why = j > rank ? "never connected"
                          : d[j].state >= D_CHALLENGE ? "did not answer the handshake"
                          : d[j].last_err ? d[j].last_err
                                          : "no answer";
        int w = snprintf(buf + n, cap - n, "%srank %d (%s): %s", listed ? ", " : "", j,
                         endpoints[j], why);
        n += w > 0 ? (size_t)w : 0;
        listed++;
    }
}

static void wipe_dials(dial *d, int size) {
    if (d)
        OPENSSL_cleanse(d, (size_t)size * sizeof *d);
    free(d);
}

int fl_connect_all(int rank, int size, const char (*endpoints)[FL_ENDPOINT_MAX],
                   const fl_hs_config *hs, fl_listener *l, double timeout_s, int *fds,
                   fl_hs_session *sessions) {
    FL_ASSERT(l || rank == size - 1);
    int rc = 0;
    dial *d = calloc((size_t)size, sizeof *d);
    struct pollfd *pfd = calloc(FL_LISTENER_POLLFDS + (size_t)size, sizeof *pfd);
    for (int i = 0; i < size; i++)
        fds[i] = -1;
    for (int j = 0; d && j < size; j++)
        d[j].fd = -1;
    if (!d || !pfd) {
        rc = fl_fail(FL_ENOMEM, "out of memory connecting %d ranks", size);
        goto fail;
    }
    for (int j = 0; j < rank; j++) {
        char what[48];
        snprintf(what, sizeof what, "rank %d's endpoint", j);
        d[j].backoff = BACKOFF_FIRST_S;
        rc = fl_net_resolve(endpoints[j], what, &d[j].ss, &d[j].len);
        if (rc < 0)
            goto fail;
    }
    double deadline = fl_now() + timeout_s;
    int missing = size - 1;
    while (missing > 0) {
        double now = fl_now();
        if (now >= deadline) {
            char list[700];
            list_missing(rank, size, endpoints, d, fds, list, sizeof list);
            rc = fl_fail(FL_ETIMEOUT, "rank %d (%s) timed out after %g s connecting to its "
                         "peers; still missing %s", rank, endpoints[rank], timeout_s, list);
            goto fail;
        }
        for (int j = 0; j < rank; j++)
            if (d[j].state == D_WAIT && now >= d[j].retry_at)
                dial_start(&d[j], now);
        double wake = deadline;
        int n = l ? fl_listener_pollfds(l, pfd, &wake) : 0, nl = n;
        for (int j = 0; j < rank; j++) {
            d[j].pfd_index = -1;
            if (d[j].state == D_WAIT && d[j].retry_at < wake)
                wake = d[j].retry_at;
            if (d[j].state != D_WAIT && d[j].state != D_DONE) {
                short ev = d[j].state == D_CHALLENGE || d[j].state == D_REPLY ? POLLIN : POLLOUT;
                d[j].pfd_index = n;
                pfd[n++] = (struct pollfd){.fd = d[j].fd, .events = ev};
            }
        }
        int pr = poll(pfd, (nfds_t)n, fl_net_poll_ms(wake));
        if (pr < 0 && errno != EINTR) {
            rc = fl_fail(FL_EIO, "rank %d: poll failed while connecting: %s", rank,
                         strerror(errno));
            goto fail;
        }
        if (pr < 0)
            continue;
        now = fl_now();
        if (l) {
            fl_listener_handle(l, pfd, nl);
            int r, fd;
            fl_hs_session ses;
            while ((fd = fl_listener_take(l, &r, NULL, &ses)) >= 0) {
                fds[r] = fd;
                sessions[r] = ses;
                fl_hs_session_wipe(&ses);
                missing--;
            }
        }
        for (int j = 0; j < rank; j++) {
            if (d[j].pfd_index < 0 || !pfd[d[j].pfd_index].revents)
                continue;
            rc = dial_step(&d[j], pfd[d[j].pfd_index].revents, j, endpoints[j], hs, rank, size,
                           now);
            if (rc < 0)
                goto fail;
            if (d[j].state == D_DONE) {
                fds[j] = d[j].fd;
                sessions[j] = d[j].session;
                d[j].fd = -1;
                missing--;
            }
        }
    }
    wipe_dials(d, size);
    free(pfd);
    return 0;
fail:
    for (int i = 0; d && i < rank; i++)
        if (d[i].fd >= 0 && d[i].state != D_DONE)
            close(d[i].fd);
    for (int i = 0; i < size; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
        fl_hs_session_wipe(&sessions[i]);
    }
    wipe_dials(d, size);
    free(pfd);
    return rc;
}
