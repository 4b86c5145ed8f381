/* transport_send.c - the sending half of a sendrecv (transport_conn.h): DATA frames go in
 * batches, each frame's header riding in the same sendmsg iovec list as its payload, straight
 * from the caller's buffer. On an encrypted connection each frame is first sealed into a small
 * per-connection staging ring (the caller's buffer is const and still needed), at most STAGE
 * frames ahead of the socket, so the pipeline keeps its shape, a frame at a time. */
#include "transport_conn.h"

#include "fleet/status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

static uint8_t *slot(conn *c, size_t k) { return c->stage + (k % STAGE) * SLOT; }

/* Bytes frame k takes on the wire. */
static size_t frame_wire(const conn *c, const send_state *s, size_t k) {
    return HDR + transport_frame_len(s->total, k) + transport_tag_len(c, true);
}

/* Seals the frames the staging ring has room for (those not sent yet, up to STAGE ahead). */
static int seal_ahead(fl_transport *t, send_state *s) {
    conn *c = &t->conns[s->peer];
    if (!c->stage && !(c->stage = malloc((size_t)STAGE * SLOT)))
        return transport_fail_local(t, FL_ENOMEM, -1, "out of memory for %s's send buffer",
                                    c->name);
    for (; s->sealed < s->nframes && s->sealed < s->frame + STAGE; s->sealed++) {
        size_t k = s->sealed, len = transport_frame_len(s->total, k);
        uint8_t *f = slot(c, k);
        fl_wire_frame_encode(f, FL_WIRE_DATA, s->seq0 + k, len);
        if (fl_aead_seal(c->tx, s->seq0 + k, f, HDR, s->buf + k * CHUNK, f + HDR, len,
                         f + HDR + len) < 0)
            return transport_fail_local(t, FL_EIO, -1, "sending to %s: %s", c->name,
                                        fl_errmsg());
    }
    return 0;
}

/* The iovec list of what s sends next: whole sealed frames from the staging ring, or up to
 * BATCH frames in the clear (headers encoded into hdrs). Returns the entries; *want: bytes. */
static int gather_frames(fl_transport *t, send_state *s, struct iovec iov[2 * BATCH],
                         uint8_t hdrs[BATCH][HDR], size_t *want) {
    conn *c = &t->conns[s->peer];
    int niov = 0;
    *want = 0;
    if (c->tx) {
        for (size_t k = s->frame; k < s->sealed; k++) {
            size_t skip = k == s->frame ? s->in_frame : 0, n = frame_wire(c, s, k) - skip;
            iov[niov++] = (struct iovec){slot(c, k) + skip, n};
            *want += n;
        }
        return niov;
    }
    for (size_t k = s->frame; k < s->nframes && k < s->frame + BATCH; k++) {
        size_t len = transport_frame_len(s->total, k), skip = k == s->frame ? s->in_frame : 0;
        if (skip < HDR) {
            uint8_t *h = hdrs[k - s->frame];
            fl_wire_frame_encode(h, FL_WIRE_DATA, s->seq0 + k, len);
            iov[niov++] = (struct iovec){h + skip, HDR - skip};
            *want += HDR - skip;
            skip = 0;
        } else {
            skip -= HDR;
        }
        iov[niov++] = (struct iovec){(void *)(s->buf + k * CHUNK + skip), len - skip};
        *want += len - skip;
    }
    return niov;
}

/* sendmsg to peer p failed with e: the failure, naming the culprit that peer reports if it
 * left because of an earlier failure. */
static int send_error(fl_transport *t, int p, int e) {
    conn *c = &t->conns[p];
    if ((e == EPIPE || e == ECONNRESET) && transport_salvage_abort(t, p) < 0)
        return t->fail_code;
    c->closed = true;
    if (e == EPIPE)
        return transport_fail_local(t, FL_EPEER, p, "%s closed the connection", c->name);
    if (e == ECONNRESET)
        return transport_fail_local(t, FL_EPEER, p, "%s reset the connection", c->name);
    return transport_fail_local(t, FL_EPEER, p, "sending to %s failed: %s", c->name,
                                strerror(e));
}

int transport_send_step(fl_transport *t, send_state *s, bool *blocked, size_t *moved) {
    conn *c = &t->conns[s->peer];
    struct iovec iov[2 * BATCH];
    uint8_t hdrs[BATCH][HDR];
    size_t want = 0;
    if (c->tx) { /* whole sealed frames from the staging ring */
        int rc = seal_ahead(t, s);
        if (rc < 0)
            return rc;
    }
    int niov = gather_frames(t, s, iov, hdrs, &want);
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            *blocked = errno != EINTR;
            return 0;
        }
        return send_error(t, s->peer, errno);
    }
    transport_count_sent(t, (size_t)n);
    *moved += (size_t)n;
    for (size_t left = (size_t)n; left > 0;) {
        size_t rest = frame_wire(c, s, s->frame) - s->in_frame;
        if (left < rest) {
            s->in_frame += left;
            break;
        }
        left -= rest;
        s->frame++;
        s->in_frame = 0;
    }
    if (s->frame == s->nframes) {
        s->done = true;
        c->send_seq = s->seq0 + s->nframes;
    }
    /* encrypted: room in the ring again, so not blocked unless the socket took less */
    *blocked = (size_t)n < want;
    return 0;
}

/* Encrypted, the abort notice completes the cut frame from the staging ring, so that the
 * frame still verifies and the peer reads the notice behind it. The notice then takes the next
 * sequence number, which a frame sealed ahead may have used as its nonce too; that frame never
 * left the process (bytes leave in order, and none of it was sent), so no two ciphertexts
 * under one nonce ever cross the wire. */
void transport_send_abandon(fl_transport *t, send_state *s) {
    conn *c = &t->conns[s->peer];
    c->send_seq = s->seq0 + s->frame + (s->in_frame > 0);
    c->send_left = s->in_frame > 0 ? frame_wire(c, s, s->frame) - s->in_frame : 0;
    c->left_ptr = c->tx && s->in_frame > 0 ? slot(c, s->frame) + s->in_frame : NULL;
}
