/* local.c - the tcp transport's same-host shortcut (local.h): an AF_UNIX socket skips the TCP/IP
 * stack (2-3x loopback TCP, test_transport --bench). Its one-time name and nonce travel over the
 * authenticated TCP connection and the nonce, MACed under the connection's key, must come back
 * through the unix socket; abstract names are per network namespace, so other hosts (and
 * bench/netlab's namespaces) stay on TCP. */
#define _GNU_SOURCE /* accept4 */
#include "local.h"

#include "crypto.h"
#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define PROOF_WAIT_S 2.0 /* an accepted unix connection must prove itself within this */

static void random_bytes(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom((char *)buf + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) { /* no getrandom: still unique enough for a name, not a secret */
            for (; got < n; got++)
                ((uint8_t *)buf)[got] = (uint8_t)((uint64_t)(fl_now() * 1e9) >> (got % 8));
            return;
        }
        got += (size_t)k;
    }
}

static socklen_t unix_addr(const char *name, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, FL_WIRE_LOCAL_NAME - 1);
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = '\0': the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* An abstract unix listening socket with a fresh random name; -1 if none can be made. */
static int local_listen(char name[FL_WIRE_LOCAL_NAME], int backlog) {
    uint64_t r;
    random_bytes(&r, sizeof r);
    snprintf(name, FL_WIRE_LOCAL_NAME, "fleet-%016llx", (unsigned long long)r);
    struct sockaddr_un a;
    socklen_t len = unix_addr(name, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, backlog) < 0) {
        FL_DEBUG("comm: no local socket (%s); peers on this host use TCP", strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* What proves a nonce on the unix socket: the nonce itself, or with the connection's key
 * (the connector's sending key, which the acceptor holds as its receiving key) an HMAC of it. */
static int proof_of(const uint8_t nonce[FL_WIRE_NONCE], const uint8_t *key,
                    uint8_t out[FL_WIRE_NONCE]) {
    if (!key) {
        memcpy(out, nonce, FL_WIRE_NONCE);
        return 0;
    }
    uint8_t msg[16 + FL_WIRE_NONCE] = "fleet local v2", mac[FL_CRYPTO_MAC];
    memcpy(msg + 16, nonce, FL_WIRE_NONCE);
    int rc = fl_crypto_hmac(key, FL_CRYPTO_KEY, msg, sizeof msg, mac);
    memcpy(out, mac, FL_WIRE_NONCE);
    return rc;
}

/* Joins the offered socket and proves who we are; -1 if it is not reachable from here. */
static int local_join(const fl_wire_offer *o, int rank, const uint8_t *key, double deadline) {
    struct sockaddr_un a;
    socklen_t len = unix_addr(o->name, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    uint8_t proof[FL_WIRE_PROOF_SIZE], p[FL_WIRE_NONCE];
    if (proof_of(o->nonce, key, p) < 0) {
        close(fd);
        return -1;
    }
    fl_wire_proof_encode(proof, (uint32_t)rank, p);
    if (connect(fd, (struct sockaddr *)&a, len) < 0 ||
        fl_net_write_full(fd, proof, sizeof proof, deadline) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool same_nonce(const uint8_t *a, const uint8_t *b) {
    return fl_crypto_equal(a, b, FL_WIRE_NONCE);
}

static int io_fail(int e, int p, const char *ep, const char *what) {
    if (e == ETIMEDOUT)
        return fl_fail(FL_ETIMEOUT, "rank %d (%s) sent no %s during set-up", p, ep, what);
    return fl_fail(FL_EPEER, "rank %d (%s) %s during set-up (%s)", p, ep,
                   e < 0 ? "closed the connection" : "broke the connection",
                   e < 0 ? what : strerror(e));
}

int fl_local_upgrade(int rank, int size, int *fds, const char (*endpoints)[FL_ENDPOINT_MAX],
                     int allow, double deadline, const fl_hs_session *sessions) {
    int rc = 0, lfd = -1, waiting = 0, upgraded = 0;
    uint8_t(*nonces)[FL_WIRE_NONCE] = calloc((size_t)size, FL_WIRE_NONCE);
    bool *want = calloc((size_t)size, sizeof *want);
    if (!nonces || !want) {
        rc = fl_fail(FL_ENOMEM, "out of memory for %d ranks", size);
        goto done;
    }
    fl_wire_offer offer;
    memset(&offer, 0, sizeof offer);
    if (allow && rank < size - 1)
        lfd = local_listen(offer.name, size + 16);
    offer.has_unix = lfd >= 0;
    /* 1. offers to every higher rank (writes that never wait on anyone's progress) */
    for (int p = rank + 1; p < size; p++) {
        uint8_t buf[FL_WIRE_OFFER_SIZE];
        random_bytes(nonces[p], FL_WIRE_NONCE);
        memcpy(offer.nonce, nonces[p], FL_WIRE_NONCE);
        /* what p must send back: kept in nonces[p] */
        if (proof_of(offer.nonce, sessions ? sessions[p].rx : NULL, nonces[p]) < 0) {
            rc = FL_EIO;
            goto done;
        }
        fl_wire_offer_encode(buf, &offer);
        int e = fl_net_write_full(fds[p], buf, sizeof buf, deadline);
        if (e) {
            rc = io_fail(e, p, endpoints[p], "local offer");
            goto done;
        }
    }
    /* 2. each lower rank's offer: join it if we can, and say so */
    for (int p = 0; p < rank; p++) {
        uint8_t buf[FL_WIRE_OFFER_SIZE], dec[FL_WIRE_DECISION_SIZE];
        char reason[128];
        fl_wire_offer o;
        int e = fl_net_read_full(fds[p], buf, sizeof buf, deadline);
        if (e) {
            rc = io_fail(e, p, endpoints[p], "local offer");
            goto done;
        }
        if (fl_wire_offer_parse(buf, sizeof buf, &o, reason, sizeof reason) != FL_WIRE_OK) {
            rc = fl_fail(FL_EPEER, "rank %d (%s) sent a malformed frame: %s", p, endpoints[p],
                         reason);
            goto done;
        }
        int u = allow && o.has_unix
                    ? local_join(&o, rank, sessions ? sessions[p].tx : NULL, deadline)
                    : -1;
        fl_wire_decision_encode(dec, u >= 0);
        e = fl_net_write_full(fds[p], dec, sizeof dec, deadline);
        if (e) {
            if (u >= 0)
                close(u);
            rc = io_fail(e, p, endpoints[p], "local decision");
            goto done;
        }
        if (u >= 0) {
            close(fds[p]);
            fds[p] = u;
            upgraded++;
        }
    }
    /* 3. each higher rank's decision, then its proof on our unix socket */
    for (int p = rank + 1; p < size; p++) {
        uint8_t dec[FL_WIRE_DECISION_SIZE];
        char reason[128];
        uint32_t use = 0;
        int e = fl_net_read_full(fds[p], dec, sizeof dec, deadline);
        if (e) {
            rc = io_fail(e, p, endpoints[p], "local decision");
            goto done;
        }
        if (fl_wire_decision_parse(dec, sizeof dec, &use, reason, sizeof reason) != FL_WIRE_OK ||
            (use && lfd < 0)) {
            rc = fl_fail(FL_EPEER, "rank %d (%s) sent a malformed frame: %s", p, endpoints[p],
                         use ? "joined a local socket that was not offered" : reason);
            goto done;
        }
        want[p] = use;
        waiting += (int)use;
    }
    while (waiting > 0) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        int pr = poll(&pf, 1, fl_net_poll_ms(deadline));
        if (pr == 0) {
            rc = fl_fail(FL_ETIMEOUT, "rank %d: %d peer(s) said they joined its local socket "
                         "but never arrived", rank, waiting);
            goto done;
        }
        int a = pr > 0 ? accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC) : -1;
        if (a < 0)
            continue;
        uint8_t proof[FL_WIRE_PROOF_SIZE], nonce[FL_WIRE_NONCE];
        uint32_t p = 0;
        double until = fl_now() + PROOF_WAIT_S < deadline ? fl_now() + PROOF_WAIT_S : deadline;
        if (fl_net_read_full(a, proof, sizeof proof, until) != 0 ||
            fl_wire_proof_parse(proof, sizeof proof, (uint32_t)size, &p, nonce, NULL, 0) !=
                FL_WIRE_OK ||
            (int)p <= rank || !want[p] || !same_nonce(nonce, nonces[p])) {
            FL_WARN("comm: rank %d dropped a local connection that did not prove itself", rank);
            close(a);
            continue;
        }
        close(fds[p]);
        fds[p] = a;
        want[p] = false;
        waiting--;
        upgraded++;
    }
    if (upgraded)
        FL_DEBUG("comm: rank %d reaches %d peer(s) through local sockets", rank, upgraded);
done:
    if (lfd >= 0)
        close(lfd);
    free(nonces);
    free(want);
    return rc;
}
