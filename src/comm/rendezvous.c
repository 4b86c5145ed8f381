/* rendezvous.c - torchrun-style endpoint exchange through rank 0 (rendezvous.h). It reuses the
 * transport's handshake (with the rendezvous flag, followed by the sender's endpoint) and its
 * listener, so the master port drops strangers exactly as the data ports do; the table comes
 * back with an HMAC under the connection's key from that handshake, so nobody on the path can
 * change it unnoticed. */
#include "rendezvous.h"

#include "handshake.h"
#include "listener.h"
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

#define ENTRY FL_WIRE_ENDPOINT_LEN

/* Checks one table entry (ENTRY bytes, NUL padded) and copies it to out. */
static int entry_ok(const uint8_t *e, char *out) {
    if (!memchr(e, '\0', ENTRY))
        return 0;
    if (fl_wire_endpoint_parse((const char *)e, NULL, 0, NULL, NULL, 0) != FL_WIRE_OK)
        return 0;
    memcpy(out, e, FL_ENDPOINT_MAX < ENTRY ? FL_ENDPOINT_MAX : ENTRY);
    return 1;
}

/* Rank 0: collects every rank's endpoint on the master port and answers with the table. */
static int master_side(const fl_comm_env *env, const fl_hs_config *hs,
                       char (*endpoints)[FL_ENDPOINT_MAX], double timeout, double deadline) {
    int size = env->size, rc = 0, mfd = -1;
    fl_listener *l = NULL;
    uint8_t *table = NULL;
    int *fds = malloc((size_t)size * sizeof *fds);
    fl_hs_session *ses = calloc((size_t)size, sizeof *ses);
    if (!fds || !ses) {
        free(fds);
        free(ses);
        return fl_fail(FL_ENOMEM, "out of memory for the rendezvous of %d ranks", size);
    }
    for (int r = 0; r < size; r++)
        fds[r] = -1;
    rc = fl_net_listen_endpoint(env->master, "MASTER_ADDR:MASTER_PORT", &mfd);
    if (rc < 0) {
        fl_fail_prefix(rc, "rendezvous at MASTER_ADDR:MASTER_PORT=%s", env->master);
        goto done;
    }
    rc = fl_listener_create(mfd, 0, size, hs, FL_WIRE_FLAG_RENDEZVOUS, ENTRY, &l);
    if (rc < 0)
        goto done;
    int missing = size - 1;
    struct pollfd pfd[FL_LISTENER_POLLFDS];
    while (missing > 0) {
        if (fl_now() >= deadline) {
            char list[600];
            size_t n = 0;
            list[0] = '\0';
            for (int r = 1, k = 0; r < size && n < sizeof list; r++) {
                if (fds[r] >= 0)
                    continue;
                int w = k == 32 ? snprintf(list + n, sizeof list - n, ", ...")
                                : snprintf(list + n, sizeof list - n, k ? ", %d" : "%d", r);
                n += w > 0 ? (size_t)w : 0;
                if (k++ == 32)
                    break;
            }
            rc = fl_fail(FL_ETIMEOUT, "rank 0 timed out after %g s at MASTER_ADDR:MASTER_PORT=%s "
                         "waiting for ranks %s to check in", timeout, env->master, list);
            goto done;
        }
        double wake = deadline;
        int n = fl_listener_pollfds(l, pfd, &wake);
        if (poll(pfd, (nfds_t)n, fl_net_poll_ms(wake)) < 0 && errno != EINTR) {
            rc = fl_fail(FL_EIO, "rendezvous: poll: %s", strerror(errno));
            goto done;
        }
        fl_listener_handle(l, pfd, n);
        int r, fd;
        uint8_t extra[ENTRY];
        fl_hs_session one;
        while ((fd = fl_listener_take(l, &r, extra, &one)) >= 0) {
            fds[r] = fd;
            ses[r] = one;
            fl_hs_session_wipe(&one);
            missing--;
            if (!entry_ok(extra, endpoints[r])) {
                rc = fl_fail(FL_EPEER, "rank %d sent an unusable endpoint at the rendezvous", r);
                goto done;
            }
        }
    }
    table = calloc((size_t)size, ENTRY);
    if (!table) {
        rc = fl_fail(FL_ENOMEM, "out of memory for the rendezvous of %d ranks", size);
        goto done;
    }
    for (int r = 0; r < size; r++)
        memcpy(table + (size_t)r * ENTRY, endpoints[r], strnlen(endpoints[r], ENTRY - 1));
    for (int r = 1; r < size; r++) {
        uint8_t mac[FL_CRYPTO_MAC];
        rc = fl_crypto_hmac(ses[r].tx, FL_CRYPTO_KEY, table, (size_t)size * ENTRY, mac);
        if (rc < 0)
            goto done;
        int e = fl_net_write_full(fds[r], table, (size_t)size * ENTRY, deadline);
        if (!e)
            e = fl_net_write_full(fds[r], mac, sizeof mac, deadline);
        if (e) {
            rc = fl_fail(e == ETIMEDOUT ? FL_ETIMEOUT : FL_EPEER,
                         "rank %d (%s) left during the rendezvous: %s", r, endpoints[r],
                         e < 0 ? "connection closed" : strerror(e));
            goto done;
        }
    }
done:
    for (int r = 0; r < size; r++)
        if (fds[r] >= 0)
            close(fds[r]);
    fl_listener_free(l);
    for (int r = 0; r < size; r++)
        fl_hs_session_wipe(&ses[r]);
    free(ses);
    free(fds);
    free(table);
    return rc;
}

/* Connects to the master (retrying while it is not listening yet). Returns the fd, or -1 with
 * *why set when this attempt failed, or -2 at the deadline. */
static int dial_master(const struct sockaddr *master, socklen_t mlen, double deadline,
                       const char **why) {
    int fd = socket(master->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    if (connect(fd, master, mlen) < 0 && errno != EINPROGRESS) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int pr = poll(&p, 1, fl_net_poll_ms(deadline));
    if (pr <= 0) {
        close(fd);
        return pr == 0 ? -2 : -1;
    }
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
        *why = strerror(err ? err : errno);
        close(fd);
        return -1;
    }
    return fd;
}

/* Ranks > 0: check in with rank 0 and read the table. */
static int worker_side(const fl_comm_env *env, const fl_hs_config *hs,
                       const struct sockaddr *master, socklen_t mlen,
                       const char *mine, char (*endpoints)[FL_ENDPOINT_MAX], double timeout,
                       double deadline) {
    int size = env->size, rank = env->rank, rc = 0, fd = -1, e = 0;
    size_t tbytes = (size_t)size * ENTRY;
    uint8_t *table = malloc(tbytes);
    if (!table)
        return fl_fail(FL_ENOMEM, "out of memory for the rendezvous of %d ranks", size);
    uint8_t entry[ENTRY] = {0};
    memcpy(entry, mine, strnlen(mine, ENTRY - 1));
    const char *why = "no answer";
    double backoff = 0.01;
    char reason[160];
    uint32_t theirs = FL_WIRE_OK;
    fl_hs_session ses = {0};
    int st = FL_WIRE_OK;
    /* check in: retried while rank 0 is not listening yet */
    for (;;) {
        if (fl_now() >= deadline)
            goto timeout;
        fd = dial_master(master, mlen, deadline, &why);
        if (fd == -2)
            goto timeout;
        e = 0;
        if (fd >= 0) {
            st = fl_hs_connect_blocking(fd, hs, FL_WIRE_FLAG_RENDEZVOUS, (uint32_t)rank,
                                        (uint32_t)size, 0, entry, sizeof entry, deadline,
                                        &theirs, &ses, reason, sizeof reason);
            if (st >= 0)
                break;
            e = -st;
            why = e == 1 ? "closed before answering" : strerror(e);
            close(fd);
            fd = -1;
        }
        if (e == ETIMEDOUT)
            goto timeout;
        poll(NULL, 0, (int)(backoff * 1000));
        backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
    if (st != FL_WIRE_OK) {
        if (st == FL_WIRE_BAD_VERSION || theirs == FL_WIRE_BAD_VERSION)
            rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s speaks another fleet "
                         "wire protocol version (%s; this rank speaks version %d): every rank "
                         "must run the same fleet version", env->master,
                         theirs == FL_WIRE_BAD_VERSION ? "it refused ours" : reason,
                         FL_WIRE_VERSION);
        else if (theirs != FL_WIRE_OK)
            rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s refused our rendezvous "
                         "handshake: %s (check FLEET_JOB_TOKEN and WORLD_SIZE)", env->master,
                         fl_wire_status_str((int)theirs));
        else
            rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s failed our rendezvous "
                         "handshake: %s", env->master, reason);
        goto done;
    }
    /* the table comes once every rank has checked in */
    uint8_t mac[FL_CRYPTO_MAC];
    e = fl_net_read_full(fd, table, tbytes, deadline);
    if (!e)
        e = fl_net_read_full(fd, mac, sizeof mac, deadline);
    if (e == ETIMEDOUT) {
        why = "rank 0 never sent the endpoint table (are all WORLD_SIZE ranks started?)";
        goto timeout;
    }
    if (e) {
        rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s left during the "
                     "rendezvous: %s", env->master, e < 0 ? "connection closed" : strerror(e));
        goto done;
    }
    uint8_t want[FL_CRYPTO_MAC];
    if (fl_crypto_hmac(ses.rx, FL_CRYPTO_KEY, table, tbytes, want) < 0 ||
        !fl_crypto_equal(want, mac, sizeof mac)) {
        rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s sent an endpoint table "
                     "that fails its authentication (changed on the way?)", env->master);
        goto done;
    }
    for (int r = 0; r < size; r++) {
        if (!entry_ok(table + (size_t)r * ENTRY, endpoints[r]) ||
            (r == rank && strcmp(endpoints[r], mine) != 0)) {
            rc = fl_fail(FL_EPEER, "rank 0 at MASTER_ADDR:MASTER_PORT=%s sent a malformed "
                         "endpoint table (entry %d)", env->master, r);
            goto done;
        }
    }
    goto done;
timeout:
    rc = fl_fail(FL_ETIMEOUT, "rank %d timed out after %g s at the rendezvous with rank 0 at "
                 "MASTER_ADDR:MASTER_PORT=%s: %s", rank, timeout, env->master, why);
done:
    if (fd >= 0)
        close(fd);
    fl_hs_session_wipe(&ses);
    free(table);
    return rc;
}

int fl_rendezvous_exchange(const fl_comm_env *env, char (*endpoints)[FL_ENDPOINT_MAX],
                           int *listen_fd) {
    double timeout = env->timeout_s > 0 ? env->timeout_s : 300;
    double deadline = fl_now() + timeout;
    struct sockaddr_storage master, local;
    socklen_t mlen, llen;
    int lfd = -1;
    int rc = fl_net_resolve(env->master, "MASTER_ADDR:MASTER_PORT", &master, &mlen);
    if (rc == 0)
        rc = fl_net_route_source((struct sockaddr *)&master, mlen, &local, &llen);
    if (rc == 0)
        rc = fl_net_listen((struct sockaddr *)&local, llen, &lfd);
    if (rc < 0)
        return rc;
    char mine[FL_ENDPOINT_MAX];
    fl_net_local_str(lfd, mine, sizeof mine);
    snprintf(endpoints[env->rank], FL_ENDPOINT_MAX, "%s", mine);
    fl_hs_config hs;
    rc = fl_hs_config_init(&hs, env->token, env->round, env->encrypt);
    if (rc == 0 && env->rank == 0)
        rc = master_side(env, &hs, endpoints, timeout, deadline);
    else if (rc == 0)
        rc = worker_side(env, &hs, (struct sockaddr *)&master, mlen, mine, endpoints, timeout,
                         deadline);
    fl_hs_config_wipe(&hs);
    if (rc < 0) {
        close(lfd);
        return rc;
    }
    FL_DEBUG("comm: rank %d of %d listens on %s (exchanged through %s)", env->rank, env->size,
             mine, env->master);
    *listen_fd = lfd;
    return 0;
}
