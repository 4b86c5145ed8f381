/* transport_keepalive.c - keepalives (transport_conn.h): while blocked, a rank tells its idle
 * peers every keepalive_s that it is alive; a rank waiting on a peer that keeps saying so
 * allows it grace_s more, because that peer is itself waiting on someone whose own waiters
 * will time out first and name the culprit to everyone. The receiving side (an encrypted
 * keepalive's counter and tag) is in transport_recv.c. */
#include "transport_conn.h"

#include "fleet/log.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

double transport_keepalive_s(const fl_transport *t) {
    double v = t->timeout_s / 4;
    return v < 0.05 ? 0.05 : v > 5 ? 5 : v;
}

double transport_grace_s(const fl_transport *t) {
    double v = t->timeout_s / 2;
    return v > 10 ? 10 : v;
}

/* Only to a peer whose send queue is empty (so its 24 bytes, 48 encrypted, go whole, and a peer
 * that is not reading from us is not waiting on us either), and not to the one this call is
 * still sending to. Not counted in the byte counters: those depend only on the collectives. */
void transport_send_keepalives(fl_transport *t, int to, bool sending) {
    for (int p = 0; p < t->size; p++) {
        conn *c = &t->conns[p];
        int queued = -1;
        if (p == t->rank || c->fd < 0 || c->closed || c->send_left || (p == to && sending) ||
            ioctl(c->fd, SIOCOUTQ, &queued) < 0 || queued != 0)
            continue;
        uint8_t ka[FL_WIRE_KEEPALIVE_SEALED];
        size_t n = HDR;
        if (c->tx) { /* a counter never sealed before: no nonce is used twice (wire.h) */
            fl_wire_keepalive_encode(ka, c->send_seq, c->ka_sent);
            if (fl_aead_seal_empty(c->tx, FL_AEAD_KEEPALIVES, c->ka_sent++, ka,
                                   FL_WIRE_KEEPALIVE_BODY, ka + FL_WIRE_KEEPALIVE_BODY) < 0)
                continue;
            n = FL_WIRE_KEEPALIVE_SEALED;
        } else {
            fl_wire_frame_encode(ka, FL_WIRE_KEEPALIVE, c->send_seq, 0);
        }
        ssize_t k = send(c->fd, ka, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0 && k < (ssize_t)n) { /* cannot happen on an empty queue; never resume it */
            FL_WARN("comm: rank %d: keepalive to %s cut short", t->rank, c->name);
            c->closed = true;
        }
    }
}
