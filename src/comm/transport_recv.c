/* transport_recv.c - the receiving half of a sendrecv (transport_conn.h): frame headers read
 * and checked (sequence, length), keepalives consumed on the way (an encrypted one's counter
 * and tag checked), ABORT notices read whole and turned into the failure they report, and DATA
 * payloads received straight into the caller's buffer, each frame's tag and the next header
 * riding in the same recvmsg. On an encrypted connection a frame is opened in place as soon as
 * its tag is in, before on_recv sees it. */
#include "transport_conn.h"

#include "fleet/status.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

int transport_read_error(fl_transport *t, int p, ssize_t k, bool fail) {
    conn *c = &t->conns[p];
    int e = k < 0 ? errno : 0;
    c->closed = true;
    if (!fail)
        return 0;
    if (k == 0)
        return transport_fail_local(t, FL_EPEER, p, "%s closed the connection", c->name);
    if (e == ECONNRESET)
        return transport_fail_local(t, FL_EPEER, p, "%s reset the connection", c->name);
    return transport_fail_local(t, FL_EPEER, p, "receiving from %s failed: %s", c->name,
                                strerror(e));
}

bool transport_would_block(ssize_t k) {
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/* Reads c->hdr up to want bytes: HDR_DATA once they are in, HDR_BLOCKED while they are on
 * the way, HDR_GOODBYE when the peer closed between frames while we only watched, else the
 * failure. */
static int fill_hdr(fl_transport *t, int p, size_t want, bool watching) {
    conn *c = &t->conns[p];
    while (c->hdr_got < want) {
        ssize_t k = recv(c->fd, c->hdr + c->hdr_got, want - c->hdr_got, 0);
        if (transport_would_block(k))
            return HDR_BLOCKED;
        if (k <= 0)
            return transport_read_error(t, p, k, !watching || c->hdr_got > 0) < 0
                       ? t->fail_code
                       : HDR_GOODBYE;
        c->hdr_got += (size_t)k;
    }
    return HDR_DATA;
}

/* The header in c->hdr is a keepalive on an encrypted connection: reads its counter and tag
 * and checks them (wire.h). HDR_DATA when it is authentic, HDR_BLOCKED while its bytes are on
 * the way, else a failure naming the peer (or HDR_GOODBYE). */
static int keepalive_tail(fl_transport *t, int p, bool watching) {
    conn *c = &t->conns[p];
    c->in_keepalive = true;
    int rc = fill_hdr(t, p, FL_WIRE_KEEPALIVE_SEALED, watching);
    if (rc != HDR_DATA)
        return rc;
    c->in_keepalive = false;
    uint64_t n = 0;
    char reason[160];
    if (fl_wire_keepalive_parse(c->hdr, c->hdr_got, c->recv_seq, &n, reason, sizeof reason) !=
        FL_WIRE_OK)
        return transport_fail_local(t, FL_EPEER, p, "%s sent a malformed keepalive: %s",
                                    c->name, reason);
    if (fl_aead_open_empty(c->rx, FL_AEAD_KEEPALIVES, n, c->hdr, FL_WIRE_KEEPALIVE_BODY,
                           c->hdr + FL_WIRE_KEEPALIVE_BODY) < 0)
        return transport_fail_local(t, FL_EPEER, p, "%s sent a keepalive that fails "
                                    "authentication (forged or changed on the way)", c->name);
    if (n < c->ka_next)
        return transport_fail_local(t, FL_EPEER, p, "%s sent keepalive %llu again or out of "
                                    "order (the last was %llu): replayed on the way", c->name,
                                    (unsigned long long)n, (unsigned long long)c->ka_next - 1);
    c->ka_next = n + 1;
    return HDR_DATA;
}

/* The header in c->hdr is an ABORT of f->len message bytes: reads the message (and its tag),
 * opens it, and returns the failure it reports (or, an empty one, HDR_GOODBYE: the peer freed
 * its transport); HDR_BLOCKED while its bytes are on the way. */
static int read_abort(fl_transport *t, int p, const fl_wire_frame *f, bool watching) {
    conn *c = &t->conns[p];
    if (!c->in_abort) {
        c->in_abort = true;
        c->abort_got = 0;
    }
    size_t whole = f->len + transport_tag_len(c, false);
    while (c->abort_got < whole) {
        ssize_t k = recv(c->fd, c->abort_msg + c->abort_got, whole - c->abort_got, 0);
        if (transport_would_block(k))
            return HDR_BLOCKED;
        if (k <= 0)
            return transport_read_error(t, p, k, true);
        c->abort_got += (size_t)k;
        transport_count_received(t, (size_t)k);
    }
    if (c->rx && fl_aead_open(c->rx, c->recv_seq, c->hdr, HDR, (uint8_t *)c->abort_msg,
                              f->len, (const uint8_t *)c->abort_msg + f->len) < 0)
        return transport_fail_local(t, FL_EPEER, p, "%s sent an abort notice that fails "
                                    "authentication (changed, forged or replayed on the way)",
                                    c->name);
    c->abort_got = f->len;
    c->in_abort = false;
    c->hdr_got = 0;
    c->hdr_counted = false;
    c->recv_seq++;
    if (f->len == 0) { /* goodbye: the peer freed its transport */
        c->closed = true;
        if (!watching)
            return transport_fail_local(t, FL_EPEER, p, "%s closed the connection", c->name);
        return HDR_GOODBYE;
    }
    return transport_fail_reported(t, p);
}

int transport_read_header(fl_transport *t, int p, uint64_t want_len, bool *alive) {
    conn *c = &t->conns[p];
    bool watching = want_len == FL_WIRE_LEN_ANY;
    for (;;) {
        int rc = fill_hdr(t, p, HDR, watching);
        if (rc != HDR_DATA)
            return rc;
        fl_wire_frame f;
        char reason[160];
        int st = fl_wire_frame_parse(c->hdr, HDR, c->recv_seq, want_len, CHUNK, &f, reason,
                                     sizeof reason);
        if (st != FL_WIRE_OK)
            return transport_fail_local(t, FL_EPEER, p, "%s sent a malformed frame: %s",
                                        c->name, reason);
        if (f.type == FL_WIRE_KEEPALIVE) { /* does not use up a sequence number */
            if (c->rx && (rc = keepalive_tail(t, p, watching)) != HDR_DATA)
                return rc;
            c->hdr_got = 0;
            *alive = true;
            continue;
        }
        if (!c->hdr_counted) {
            transport_count_received(t, HDR);
            c->hdr_counted = true;
        }
        if (f.type != FL_WIRE_DATA)
            return read_abort(t, p, &f, watching);
        if (!watching) {
            c->recv_seq++;
            c->hdr_got = 0;
            c->hdr_counted = false;
        }
        return HDR_DATA;
    }
}

/* If the peer left because of an earlier failure, its abort notice is waiting in our receive
 * queue (maybe behind data nobody will read now): find it, so that we report the same culprit
 * as everyone else. */
int transport_salvage_abort(fl_transport *t, int p) {
    conn *c = &t->conns[p];
    for (int frames = 0; frames < 64 && !c->closed; frames++) {
        bool alive = false;
        int rc = transport_read_header(t, p, FL_WIRE_LEN_ANY, &alive);
        if (rc < 0)
            return t->fail_reporter != t->rank ? rc : 0; /* found its notice, or not */
        if (rc != HDR_DATA)
            return 0;
        fl_wire_frame f;
        fl_wire_frame_parse(c->hdr, HDR, c->recv_seq, FL_WIRE_LEN_ANY, CHUNK, &f, NULL, 0);
        for (uint64_t left = f.len + transport_tag_len(c, false); left > 0;) {
            char sink[4096]; /* data nobody awaits */
            ssize_t k = recv(c->fd, sink, left < sizeof sink ? (size_t)left : sizeof sink,
                             MSG_DONTWAIT);
            if (k <= 0)
                return 0;
            left -= (uint64_t)k;
        }
        c->hdr_got = 0;
        c->hdr_counted = false;
        c->recv_seq++;
    }
    return 0;
}

/* A received frame is whole (payload and, encrypted, tag): opens it in place, then hands it
 * to on_recv. */
static int frame_done(fl_transport *t, recv_state *r) {
    conn *c = &t->conns[r->peer];
    size_t len = transport_frame_len(r->total, r->frame);
    if (c->rx && fl_aead_open(c->rx, c->cur_seq, c->cur_hdr, HDR, r->buf + r->frame * CHUNK,
                              len, c->tag) < 0)
        return transport_fail_local(t, FL_EPEER, r->peer, "%s sent frame %llu that fails "
                                    "authentication (changed, forged or replayed on the way; "
                                    "nothing of it was used)",
                                    c->name, (unsigned long long)c->cur_seq);
    if (r->on_recv)
        r->on_recv(r->ctx, r->frame * CHUNK, len);
    r->in_payload = false;
    if (++r->frame == r->nframes)
        r->done = true;
    return 0;
}

int transport_recv_step(fl_transport *t, recv_state *r, bool *blocked, size_t *moved,
                        bool *alive) {
    conn *c = &t->conns[r->peer];
    size_t tl = transport_tag_len(c, false);
    while (!r->done) {
        size_t len = transport_frame_len(r->total, r->frame);
        if (!r->in_payload) {
            int rc = transport_read_header(t, r->peer, len, alive);
            if (rc < 0)
                return rc;
            if (rc == HDR_BLOCKED) {
                *blocked = true;
                return 0;
            }
            *moved += HDR;
            memcpy(c->cur_hdr, c->hdr, HDR);
            c->cur_seq = c->recv_seq - 1;
            r->in_payload = true;
            r->got = 0;
            c->tag_got = 0;
        }
        /* the payload straight into the caller's buffer, its tag, and the next header */
        struct iovec iov[3];
        size_t want = 0;
        int niov = 0;
        if (r->got < len)
            iov[niov++] = (struct iovec){r->buf + r->frame * CHUNK + r->got, len - r->got};
        if (c->tag_got < tl)
            iov[niov++] = (struct iovec){c->tag + c->tag_got, tl - c->tag_got};
        for (int i = 0; i < niov; i++)
            want += iov[i].iov_len;
        if (r->frame + 1 < r->nframes) {
            iov[niov++] = (struct iovec){c->hdr + c->hdr_got, HDR - c->hdr_got};
            want += HDR - c->hdr_got;
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t k = recvmsg(c->fd, &m, 0);
        if (transport_would_block(k)) {
            *blocked = true;
            return 0;
        }
        if (k <= 0)
            return transport_read_error(t, r->peer, k, true);
        *moved += (size_t)k;
        size_t left = (size_t)k;
        size_t into_payload = left < len - r->got ? left : len - r->got;
        r->got += into_payload;
        left -= into_payload;
        size_t into_tag = left < tl - c->tag_got ? left : tl - c->tag_got;
        c->tag_got += into_tag;
        left -= into_tag;
        transport_count_received(t, into_payload + into_tag); /* header bytes: once whole */
        c->hdr_got += left;
        if (r->got == len && c->tag_got == tl) {
            int rc = frame_done(t, r);
            if (rc < 0)
                return rc;
        }
        if ((size_t)k < want) {
            *blocked = true;
            return 0;
        }
    }
    return 0;
}
