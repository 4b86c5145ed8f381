/* transport_abort.c - how the transport fails (transport_conn.h): the first failure sticks, and
 * is broadcast as an ABORT frame naming the culprit, so that every surviving rank reports the
 * same one; a notice received from a peer is checked and passed on the same way. */
#include "transport_conn.h"

#include "net.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int transport_set_failed(fl_transport *t, int code, int skip, int reporter, const char *orig) {
    t->failed = true;
    t->fail_code = code;
    t->fail_reporter = reporter;
    t->abort_skip = skip;
    if (reporter == t->rank)
        snprintf(t->fail_msg, sizeof t->fail_msg, "%s", orig);
    else
        snprintf(t->fail_msg, sizeof t->fail_msg, "%s (reported by rank %d)", orig, reporter);
    int n = snprintf(t->abort_payload, sizeof t->abort_payload, "%d:%s", reporter, orig);
    t->abort_len = n < 0 ? 0 : (size_t)n > FL_WIRE_ABORT_MAX ? FL_WIRE_ABORT_MAX : (size_t)n;
    return code;
}

int transport_fail_local(fl_transport *t, int code, int skip, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return transport_set_failed(t, code, skip, t->rank, msg);
}

/* Completes with zeros (or, encrypted, with the sealed frame's rest) any frame of c that a
 * failure cut short, so that the peer reads the notice behind it. 0 or an errno. */
static int finish_cut_frame(fl_transport *t, conn *c, double until) {
    static const uint8_t zeros[1 << 16];
    int e = 0;
    while (!e && c->send_left > 0) { /* an encrypted frame goes whole, so it verifies */
        size_t n = c->send_left < sizeof zeros ? (size_t)c->send_left : sizeof zeros;
        e = fl_net_write_full(c->fd, c->left_ptr ? c->left_ptr : zeros, n, until);
        if (!e) {
            c->send_left -= n;
            if (c->left_ptr)
                c->left_ptr += n;
            transport_count_sent(t, n);
        }
    }
    return e;
}

void transport_broadcast_abort(fl_transport *t) {
    double end = fl_now() + ABORT_BUDGET_S;
    for (int p = 0; p < t->size; p++) {
        conn *c = &t->conns[p];
        if (p == t->rank || p == t->abort_skip || c->fd < 0 || c->closed)
            continue;
        double now = fl_now(), until = now + ABORT_PEER_S < end ? now + ABORT_PEER_S : end;
        int e = finish_cut_frame(t, c, until);
        uint8_t hdr[HDR], sealed[FL_WIRE_ABORT_MAX + TAG];
        size_t tl = transport_tag_len(c, true);
        fl_wire_frame_encode(hdr, FL_WIRE_ABORT, c->send_seq, t->abort_len);
        if (!e && c->tx && fl_aead_seal(c->tx, c->send_seq, hdr, HDR,
                                        (const uint8_t *)t->abort_payload, sealed, t->abort_len,
                                        sealed + t->abort_len) < 0)
            e = EIO;
        if (!e)
            e = fl_net_write_full(c->fd, hdr, HDR, until);
        if (!e)
            e = fl_net_write_full(c->fd, c->tx ? (const void *)sealed : t->abort_payload,
                                  t->abort_len + tl, until);
        if (!e) {
            c->send_seq++;
            transport_count_sent(t, HDR + t->abort_len + tl);
        } else {
            FL_DEBUG("comm: rank %d could not tell %s about the failure", t->rank, c->name);
            c->closed = true; /* its stream is cut mid-frame: send nothing more */
        }
    }
}

int transport_fail_reported(fl_transport *t, int p) {
    conn *c = &t->conns[p];
    c->abort_msg[c->abort_got] = '\0';
    char *colon = memchr(c->abort_msg, ':', c->abort_got);
    int reporter = 0, digits = 0;
    for (const char *q = c->abort_msg; colon && q < colon && digits < 5; q++, digits++) {
        if (*q < '0' || *q > '9') {
            digits = 0;
            break;
        }
        reporter = reporter * 10 + (*q - '0');
    }
    if (!colon || digits == 0 || digits >= 5 || colon != c->abort_msg + digits ||
        reporter >= t->size)
        return transport_fail_local(t, FL_EPEER, p, "%s sent a malformed frame: unreadable "
                                    "abort notice", c->name);
    for (char *q = colon + 1; *q; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e)
            *q = '?';
    return transport_set_failed(t, FL_EPEER, p, reporter, colon + 1);
}
