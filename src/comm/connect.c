/* connect.c - the tcp transport's set-up (connect.h): rank r dials every rank below it and is
 * dialled by every rank above it. Dials and the listener share one poll loop, so a peer that
 * is slow to start delays nobody else, and a dial refused because its peer is not listening
 * yet is retried with backoff until the deadline. */
#include "connect.h"

#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { D_WAIT, D_CONNECTING, D_HELLO, D_REPLY, D_DONE };

#define BACKOFF_FIRST_S 0.01
#define BACKOFF_MAX_S   0.5

typedef struct {
    int                     state, fd, pfd_index;
    double                  retry_at, backoff;
    struct sockaddr_storage ss;
    socklen_t               len;
    size_t                  pos;
    uint8_t                 reply[FL_WIRE_REPLY_SIZE];
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
    if (connect(d->fd, (struct sockaddr *)&d->ss, d->len) == 0)
        d->state = D_HELLO;
    else if (errno == EINPROGRESS || errno == EINTR)
        d->state = D_CONNECTING;
    else
        retry_later(d, now, strerror(errno));
}

/* Advances one dial after poll reported on it. 0, or FL_EPEER when the peer refused us. */
static int dial_step(dial *d, short revents, int j, const char *ep, const uint8_t *hello,
                     double now) {
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
    if (d->state == D_HELLO) {
        ssize_t k = send(d->fd, hello + d->pos, FL_WIRE_HELLO_SIZE - d->pos, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                retry_later(d, now, strerror(errno));
            return 0;
        }
        d->pos += (size_t)k;
        if (d->pos < FL_WIRE_HELLO_SIZE)
            return 0;
        d->state = D_REPLY;
        d->pos = 0;
        return 0; /* the reply comes later: poll for it */
    }
    if (d->state == D_REPLY) {
        ssize_t k = recv(d->fd, d->reply + d->pos, FL_WIRE_REPLY_SIZE - d->pos, 0);
        if (k == 0) {
            retry_later(d, now, "closed the connection before answering the handshake");
            return 0;
        }
        if (k < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                retry_later(d, now, strerror(errno));
            return 0;
        }
        d->pos += (size_t)k;
        char reason[160];
        uint32_t theirs;
        int st = fl_wire_reply_parse(d->reply, d->pos, (uint32_t)j, &theirs, reason,
                                     sizeof reason);
        if (st == FL_WIRE_TRUNCATED)
            return 0;
        if (st != FL_WIRE_OK && theirs != FL_WIRE_OK)
            return fl_fail(FL_EPEER, "rank %d (%s) refused our handshake: %s (check "
                           "FLEET_JOB_TOKEN and the endpoint list)", j, ep,
                           fl_wire_status_str((int)theirs));
        if (st != FL_WIRE_OK)
            return fl_fail(FL_EPEER, "rank %d (%s) answered our handshake with a malformed "
                           "reply: %s (is another program on that port?)", j, ep, reason);
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
                          : d[j].state == D_REPLY ? "did not answer the handshake"
                          : d[j].last_err ? d[j].last_err
                                          : "no answer";
        int w = snprintf(buf + n, cap - n, "%srank %d (%s): %s", listed ? ", " : "", j,
                         endpoints[j], why);
        n += w > 0 ? (size_t)w : 0;
        listed++;
    }
}

int fl_connect_all(int rank, int size, const char (*endpoints)[FL_ENDPOINT_MAX],
                   const char *token, fl_listener *l, double timeout_s, int *fds) {
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
    uint8_t hello[FL_WIRE_HELLO_SIZE];
    fl_wire_hello_encode(hello, 0, (uint32_t)rank, (uint32_t)size, token);
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
            if (d[j].state == D_CONNECTING || d[j].state == D_HELLO || d[j].state == D_REPLY) {
                short ev = d[j].state == D_REPLY ? POLLIN : POLLOUT;
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
            while ((fd = fl_listener_take(l, &r, NULL)) >= 0) {
                fds[r] = fd;
                missing--;
            }
        }
        for (int j = 0; j < rank; j++) {
            if (d[j].pfd_index < 0 || !pfd[d[j].pfd_index].revents)
                continue;
            rc = dial_step(&d[j], pfd[d[j].pfd_index].revents, j, endpoints[j], hello, now);
            if (rc < 0)
                goto fail;
            if (d[j].state == D_DONE) {
                fds[j] = d[j].fd;
                d[j].fd = -1;
                missing--;
            }
        }
    }
    free(d);
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
    }
    free(d);
    free(pfd);
    return rc;
}
