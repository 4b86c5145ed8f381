/* transport.c - the tcp backend's transport (transport.h): one authenticated socket per peer
 * and a full-duplex sendrecv that moves DATA frames straight between the caller's buffers and
 * the kernel (the frame header rides in the same sendmsg/recvmsg iovec list as the payload),
 * progressing both directions in one poll loop under an inactivity deadline. A failure is
 * broadcast as an ABORT frame naming the culprit, so every surviving rank reports the same one.
 * On an encrypted connection (handshake.h) each frame is sealed into a small per-connection
 * staging ring just before it is sent (the caller's buffer is const and still needed) and
 * opened in place in the caller's buffer as soon as its tag is in, before on_recv sees it:
 * the pipeline keeps its shape, a frame at a time. */
#define _GNU_SOURCE /* F_DUPFD_CLOEXEC */
#include "transport.h"

#include "connect.h"
#include "crypto.h"
#include "handshake.h"
#include "listener.h"
#include "local.h"
#include "net.h"
#include "rendezvous.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* Payload bytes per DATA frame, and so the granularity of on_recv. Measured with
 * `test_transport --bench` (2 threads on 127.0.0.1, 1-64 MiB full-duplex exchanges, medians
 * of 5 interleaved runs, TCP and unix socket): 128 KiB to 2 MiB are within the machine's
 * noise of each other; 256 KiB keeps a chunk in L2 while the caller reduces it and the next
 * one arrives. */
#define CHUNK ((size_t)256 << 10)
#define BATCH 16 /* frames handed to one sendmsg */
#define HDR   FL_WIRE_FRAME_SIZE
#define TAG   FL_CRYPTO_TAG
/* Encrypted frames sealed ahead of the socket: 4 x 256 KiB keeps the kernel's send buffer fed
 * while costing 1 MiB per encrypted peer, allocated on its first send. */
#define STAGE 4
#define SLOT  (HDR + CHUNK + TAG)
/* A sendrecv that waits this long without progress also watches its other peers for abort
 * notices (the fast path polls only the one or two sockets it moves data on). */
#define STALL_S 0.02
/* An abort notice is best effort: all peers together get this long, each at most PEER_S. */
#define ABORT_BUDGET_S 0.5
#define ABORT_PEER_S   0.2

typedef struct {
    int      fd;
    char     name[FL_ENDPOINT_MAX + 32]; /* "rank 3 (127.0.0.1:6173)" */
    uint64_t send_seq, recv_seq;         /* next frame's sequence number, per direction */
    uint64_t send_left;                  /* bytes of a frame a failure cut short */
    uint8_t  hdr[FL_WIRE_KEEPALIVE_SEALED]; /* the next frame header, maybe read ahead of its
                                         * op (and an encrypted keepalive's counter and tag) */
    size_t   hdr_got;
    bool     in_keepalive;               /* hdr is an encrypted keepalive, its tail on the way */
    uint64_t ka_sent;                    /* encrypted: keepalives sealed to this peer */
    uint64_t ka_next;                    /* encrypted: the least keepalive counter accepted */
    bool     hdr_counted;                /* hdr is complete and in the byte counters */
    bool     in_abort;                   /* hdr is an ABORT whose message is being read */
    size_t   abort_got;
    char     abort_msg[FL_WIRE_ABORT_MAX + TAG + 1];
    bool     closed;                     /* the peer closed or reset: nothing more comes */
    bool     local;                      /* a unix socket: the peer shares this host */
    fl_aead *tx, *rx;                    /* frame ciphers; NULL: frames in the clear */
    uint8_t *stage;                      /* [STAGE][SLOT] sealed frames on their way out */
    const uint8_t *left_ptr;             /* encrypted: the rest of a frame a failure cut */
    uint8_t  cur_hdr[HDR];               /* header of the frame being received (its AAD) */
    uint64_t cur_seq;                    /* and its sequence number */
    uint8_t  tag[TAG];                   /* its tag as it arrives */
    size_t   tag_got;
} conn;

struct fl_transport {
    fl_peers           peers;      /* first: the pair interface (peers.h) */
    int                rank, size;
    double             timeout_s;
    double             spin_s;     /* busy-poll budget per sendrecv before sleeping in poll */
    conn              *conns;      /* [size]; conns[rank].fd == -1 */
    fl_comm_counters  *counters;   /* borrowed, or &own_counters */
    fl_comm_counters   own_counters;
    char             (*endpoints)[FL_ENDPOINT_MAX]; /* [size], owned; NULL for from_fds */
    fl_listener       *listener;   /* NULL for from_fds and single rank */
    struct pollfd     *pfd;        /* [size] scratch for sendrecv's poll */
    int               *pfd_peer;   /* [size] the rank behind each pfd entry */
    bool               failed;
    int                fail_code, fail_reporter, abort_skip;
    char               fail_msg[1024];
    char               abort_payload[FL_WIRE_ABORT_MAX + 1]; /* "reporter:message" */
    size_t             abort_len;
};

static void count_sent(fl_transport *t, size_t n) {
    atomic_fetch_add_explicit(&t->counters->bytes_sent, n, memory_order_relaxed);
}
static void count_received(fl_transport *t, size_t n) {
    atomic_fetch_add_explicit(&t->counters->bytes_received, n, memory_order_relaxed);
}

static size_t frame_len(size_t total, size_t k) {
    size_t left = total - k * CHUNK;
    return left < CHUNK ? left : CHUNK;
}

/* Bytes after a frame's payload: the tag on an encrypted connection. */
static size_t tag_len(const conn *c, bool sending) { return (sending ? c->tx : c->rx) ? TAG : 0; }

/* ---------------------------------------------------------------- failure and abort */

/* Records the failure (message orig, first noticed by rank reporter) and what the abort
 * notice to the other peers will carry. Returns code. */
static int set_failed(fl_transport *t, int code, int skip, int reporter, const char *orig) {
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

/* A failure this rank noticed itself; skip: a peer not worth telling (it is gone), or -1. */
static int fail_local(fl_transport *t, int code, int skip, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_local(fl_transport *t, int code, int skip, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return set_failed(t, code, skip, t->rank, msg);
}

/* Best effort, bounded in time: completes any frame cut short with zeros, then sends the
 * ABORT frame to every peer still connected except t->abort_skip. */
static void broadcast_abort(fl_transport *t) {
    static const uint8_t zeros[1 << 16];
    double end = fl_now() + ABORT_BUDGET_S;
    for (int p = 0; p < t->size; p++) {
        conn *c = &t->conns[p];
        if (p == t->rank || p == t->abort_skip || c->fd < 0 || c->closed)
            continue;
        double now = fl_now(), until = now + ABORT_PEER_S < end ? now + ABORT_PEER_S : end;
        int e = 0;
        while (!e && c->send_left > 0) { /* an encrypted frame goes whole, so it verifies */
            size_t n = c->send_left < sizeof zeros ? (size_t)c->send_left : sizeof zeros;
            e = fl_net_write_full(c->fd, c->left_ptr ? c->left_ptr : zeros, n, until);
            if (!e) {
                c->send_left -= n;
                if (c->left_ptr)
                    c->left_ptr += n;
                count_sent(t, n);
            }
        }
        uint8_t hdr[HDR], sealed[FL_WIRE_ABORT_MAX + TAG];
        size_t tl = tag_len(c, true);
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
            count_sent(t, HDR + t->abort_len + tl);
        } else {
            FL_DEBUG("comm: rank %d could not tell %s about the failure", t->rank, c->name);
            c->closed = true; /* its stream is cut mid-frame: send nothing more */
        }
    }
}

/* An abort notice from peer p (message in c->abort_msg, c->abort_got bytes): fails with the
 * original culprit's message and passes the notice on. */
static int fail_reported(fl_transport *t, int p) {
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
        return fail_local(t, FL_EPEER, p, "%s sent a malformed frame: unreadable abort notice",
                          c->name);
    for (char *q = colon + 1; *q; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e)
            *q = '?';
    return set_failed(t, FL_EPEER, p, reporter, colon + 1);
}

/* ---------------------------------------------------------------- receiving */

/* Result of reading toward a frame header. */
enum { HDR_BLOCKED = 0, HDR_DATA = 1, HDR_GOODBYE = 2 };

/* Socket error or EOF while reading from peer p: records the failure (if fail) and marks
 * the connection closed. */
static int read_error(fl_transport *t, int p, ssize_t k, bool fail) {
    conn *c = &t->conns[p];
    int e = k < 0 ? errno : 0;
    c->closed = true;
    if (!fail)
        return 0;
    if (k == 0)
        return fail_local(t, FL_EPEER, p, "%s closed the connection", c->name);
    if (e == ECONNRESET)
        return fail_local(t, FL_EPEER, p, "%s reset the connection", c->name);
    return fail_local(t, FL_EPEER, p, "receiving from %s failed: %s", c->name, strerror(e));
}

static bool would_block(ssize_t k) {
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/* The header in c->hdr is a keepalive on an encrypted connection: reads its counter and tag
 * and checks them (wire.h). HDR_DATA when it is authentic, HDR_BLOCKED while its bytes are on
 * the way, else a failure naming the peer (or HDR_GOODBYE). */
static int keepalive_tail(fl_transport *t, int p, bool watching) {
    conn *c = &t->conns[p];
    c->in_keepalive = true;
    while (c->hdr_got < FL_WIRE_KEEPALIVE_SEALED) {
        ssize_t k = recv(c->fd, c->hdr + c->hdr_got, FL_WIRE_KEEPALIVE_SEALED - c->hdr_got, 0);
        if (would_block(k))
            return HDR_BLOCKED;
        if (k <= 0)
            return read_error(t, p, k, !watching || c->hdr_got > 0) < 0 ? t->fail_code
                                                                         : HDR_GOODBYE;
        c->hdr_got += (size_t)k;
    }
    c->in_keepalive = false;
    uint64_t n = 0;
    char reason[160];
    if (fl_wire_keepalive_parse(c->hdr, c->hdr_got, c->recv_seq, &n, reason, sizeof reason) !=
        FL_WIRE_OK)
        return fail_local(t, FL_EPEER, p, "%s sent a malformed keepalive: %s", c->name, reason);
    if (fl_aead_open_empty(c->rx, FL_AEAD_KEEPALIVES, n, c->hdr, FL_WIRE_KEEPALIVE_BODY,
                           c->hdr + FL_WIRE_KEEPALIVE_BODY) < 0)
        return fail_local(t, FL_EPEER, p, "%s sent a keepalive that fails authentication "
                          "(forged or changed on the way)", c->name);
    if (n < c->ka_next)
        return fail_local(t, FL_EPEER, p, "%s sent keepalive %llu again or out of order (the "
                          "last was %llu): replayed on the way", c->name, (unsigned long long)n,
                          (unsigned long long)c->ka_next - 1);
    c->ka_next = n + 1;
    return HDR_DATA;
}

/* Reads the next frame header from peer p and, for an ABORT, its message; keepalives are
 * consumed on the way (*alive set). want_len: the DATA length the caller expects, or
 * FL_WIRE_LEN_ANY when only watching for aborts (then a DATA header stays in c->hdr for the
 * operation that will consume it, and EOF is not an error: the peer may simply be done).
 * Returns HDR_BLOCKED, HDR_DATA (consumed unless watching), HDR_GOODBYE (the peer closed),
 * or a failure. */
static int read_header(fl_transport *t, int p, uint64_t want_len, bool *alive) {
    conn *c = &t->conns[p];
    bool watching = want_len == FL_WIRE_LEN_ANY;
    for (;;) {
        while (c->hdr_got < HDR) {
            ssize_t k = recv(c->fd, c->hdr + c->hdr_got, HDR - c->hdr_got, 0);
            if (would_block(k))
                return HDR_BLOCKED;
            if (k <= 0)
                return read_error(t, p, k, !watching || c->hdr_got > 0) < 0 ? t->fail_code
                                                                             : HDR_GOODBYE;
            c->hdr_got += (size_t)k;
        }
        fl_wire_frame f;
        char reason[160];
        int st = fl_wire_frame_parse(c->hdr, HDR, c->recv_seq, want_len, CHUNK, &f, reason,
                                     sizeof reason);
        if (st != FL_WIRE_OK)
            return fail_local(t, FL_EPEER, p, "%s sent a malformed frame: %s", c->name, reason);
        if (f.type == FL_WIRE_KEEPALIVE) { /* does not use up a sequence number */
            if (c->rx) {
                int rc = keepalive_tail(t, p, watching);
                if (rc != HDR_DATA)
                    return rc;
            }
            c->hdr_got = 0;
            *alive = true;
            continue;
        }
        if (!c->hdr_counted) {
            count_received(t, HDR);
            c->hdr_counted = true;
        }
        if (f.type == FL_WIRE_DATA) {
            if (!watching) {
                c->recv_seq++;
                c->hdr_got = 0;
                c->hdr_counted = false;
            }
            return HDR_DATA;
        }
        if (!c->in_abort) {
            c->in_abort = true;
            c->abort_got = 0;
        }
        size_t whole = f.len + tag_len(c, false);
        while (c->abort_got < whole) {
            ssize_t k = recv(c->fd, c->abort_msg + c->abort_got, whole - c->abort_got, 0);
            if (would_block(k))
                return HDR_BLOCKED;
            if (k <= 0)
                return read_error(t, p, k, true);
            c->abort_got += (size_t)k;
            count_received(t, (size_t)k);
        }
        if (c->rx && fl_aead_open(c->rx, c->recv_seq, c->hdr, HDR, (uint8_t *)c->abort_msg,
                                  f.len, (const uint8_t *)c->abort_msg + f.len) < 0)
            return fail_local(t, FL_EPEER, p, "%s sent an abort notice that fails "
                              "authentication (changed, forged or replayed on the way)", c->name);
        c->abort_got = f.len;
        c->in_abort = false;
        c->hdr_got = 0;
        c->hdr_counted = false;
        c->recv_seq++;
        if (f.len == 0) { /* goodbye: the peer freed its transport */
            c->closed = true;
            if (!watching)
                return fail_local(t, FL_EPEER, p, "%s closed the connection", c->name);
            return HDR_GOODBYE;
        }
        return fail_reported(t, p);
    }
}

/* Peer p went away while we sent to it. If it left because of an earlier failure, its abort
 * notice is waiting in our receive queue (maybe behind data nobody will read now): find it, so
 * that we report the same culprit as everyone else. Returns its failure, or 0 if none. */
static int salvage_abort(fl_transport *t, int p) {
    conn *c = &t->conns[p];
    for (int frames = 0; frames < 64 && !c->closed; frames++) {
        bool alive = false;
        int rc = read_header(t, p, FL_WIRE_LEN_ANY, &alive);
        if (rc < 0)
            return t->fail_reporter != t->rank ? rc : 0; /* found its notice, or not */
        if (rc != HDR_DATA)
            return 0;
        fl_wire_frame f;
        fl_wire_frame_parse(c->hdr, HDR, c->recv_seq, FL_WIRE_LEN_ANY, CHUNK, &f, NULL, 0);
        for (uint64_t left = f.len + tag_len(c, false); left > 0;) { /* data nobody awaits */
            char sink[4096];
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

typedef struct {
    int        peer;
    uint8_t   *buf;
    size_t     total, nframes;
    size_t     frame, got; /* current frame, its payload bytes received */
    bool       in_payload, done;
    fl_recv_fn on_recv;
    void      *ctx;
} recv_state;

/* A received frame is whole (payload and, encrypted, tag): opens it in place, then hands it
 * to on_recv. */
static int frame_done(fl_transport *t, recv_state *r) {
    conn *c = &t->conns[r->peer];
    size_t len = frame_len(r->total, r->frame);
    if (c->rx && fl_aead_open(c->rx, c->cur_seq, c->cur_hdr, HDR, r->buf + r->frame * CHUNK,
                              len, c->tag) < 0)
        return fail_local(t, FL_EPEER, r->peer, "%s sent frame %llu that fails authentication "
                          "(changed, forged or replayed on the way; nothing of it was used)",
                          c->name, (unsigned long long)c->cur_seq);
    if (r->on_recv)
        r->on_recv(r->ctx, r->frame * CHUNK, len);
    r->in_payload = false;
    if (++r->frame == r->nframes)
        r->done = true;
    return 0;
}

/* Receives as much as the socket has. Sets *blocked when it ran dry, *alive when a keepalive
 * came by. Returns 0 or a failure; *moved counts DATA bytes read. */
static int recv_step(fl_transport *t, recv_state *r, bool *blocked, size_t *moved,
                     bool *alive) {
    conn *c = &t->conns[r->peer];
    size_t tl = tag_len(c, false);
    while (!r->done) {
        size_t len = frame_len(r->total, r->frame);
        if (!r->in_payload) {
            int rc = read_header(t, r->peer, len, alive);
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
        if (would_block(k)) {
            *blocked = true;
            return 0;
        }
        if (k <= 0)
            return read_error(t, r->peer, k, true);
        *moved += (size_t)k;
        size_t left = (size_t)k;
        size_t into_payload = left < len - r->got ? left : len - r->got;
        r->got += into_payload;
        left -= into_payload;
        size_t into_tag = left < tl - c->tag_got ? left : tl - c->tag_got;
        c->tag_got += into_tag;
        left -= into_tag;
        count_received(t, into_payload + into_tag); /* header bytes count once it is whole */
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

/* ---------------------------------------------------------------- sending */

typedef struct {
    int            peer;
    const uint8_t *buf;
    size_t         total, nframes;
    size_t         frame, in_frame; /* current frame, its bytes sent (header included) */
    size_t         sealed;          /* encrypted: frames sealed into the staging ring */
    uint64_t       seq0;
    bool           done;
} send_state;

static uint8_t *slot(conn *c, size_t k) { return c->stage + (k % STAGE) * SLOT; }

/* Bytes frame k takes on the wire. */
static size_t frame_wire(const conn *c, const send_state *s, size_t k) {
    return HDR + frame_len(s->total, k) + tag_len(c, true);
}

/* Seals the frames the staging ring has room for (those not sent yet, up to STAGE ahead). */
static int seal_ahead(fl_transport *t, send_state *s) {
    conn *c = &t->conns[s->peer];
    if (!c->stage && !(c->stage = malloc((size_t)STAGE * SLOT)))
        return fail_local(t, FL_ENOMEM, -1, "out of memory for %s's send buffer", c->name);
    for (; s->sealed < s->nframes && s->sealed < s->frame + STAGE; s->sealed++) {
        size_t k = s->sealed, len = frame_len(s->total, k);
        uint8_t *f = slot(c, k);
        fl_wire_frame_encode(f, FL_WIRE_DATA, s->seq0 + k, len);
        if (fl_aead_seal(c->tx, s->seq0 + k, f, HDR, s->buf + k * CHUNK, f + HDR, len,
                         f + HDR + len) < 0)
            return fail_local(t, FL_EIO, -1, "sending to %s: %s", c->name, fl_errmsg());
    }
    return 0;
}

static int send_step(fl_transport *t, send_state *s, bool *blocked, size_t *moved) {
    conn *c = &t->conns[s->peer];
    struct iovec iov[2 * BATCH];
    uint8_t hdrs[BATCH][HDR];
    int niov = 0;
    size_t want = 0;
    if (c->tx) { /* whole sealed frames from the staging ring */
        int rc = seal_ahead(t, s);
        if (rc < 0)
            return rc;
        for (size_t k = s->frame; k < s->sealed; k++) {
            size_t skip = k == s->frame ? s->in_frame : 0, n = frame_wire(c, s, k) - skip;
            iov[niov++] = (struct iovec){slot(c, k) + skip, n};
            want += n;
        }
    }
    for (size_t k = s->frame; !c->tx && k < s->nframes && k < s->frame + BATCH; k++) {
        size_t len = frame_len(s->total, k), skip = k == s->frame ? s->in_frame : 0;
        if (skip < HDR) {
            uint8_t *h = hdrs[k - s->frame];
            fl_wire_frame_encode(h, FL_WIRE_DATA, s->seq0 + k, len);
            iov[niov++] = (struct iovec){h + skip, HDR - skip};
            want += HDR - skip;
            skip = 0;
        } else {
            skip -= HDR;
        }
        iov[niov++] = (struct iovec){(void *)(s->buf + k * CHUNK + skip), len - skip};
        want += len - skip;
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            *blocked = errno != EINTR;
            return 0;
        }
        int e = errno;
        if ((e == EPIPE || e == ECONNRESET) && salvage_abort(t, s->peer) < 0)
            return t->fail_code;
        c->closed = true;
        if (e == EPIPE)
            return fail_local(t, FL_EPEER, s->peer, "%s closed the connection", c->name);
        if (e == ECONNRESET)
            return fail_local(t, FL_EPEER, s->peer, "%s reset the connection", c->name);
        return fail_local(t, FL_EPEER, s->peer, "sending to %s failed: %s", c->name,
                          strerror(e));
    }
    count_sent(t, (size_t)n);
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

/* The send was cut short by a failure: remember how much of its current frame is missing, so
 * that the abort notice can complete it first (encrypted: from the staging ring, so that the
 * frame still verifies and the peer reads the notice behind it). The abort notice then takes
 * the next sequence number, which a frame sealed ahead may have used as its nonce too; that
 * frame never left the process (bytes leave in order, and none of it was sent), so no two
 * ciphertexts under one nonce ever cross the wire. */
static void send_abandon(fl_transport *t, send_state *s) {
    conn *c = &t->conns[s->peer];
    c->send_seq = s->seq0 + s->frame + (s->in_frame > 0);
    c->send_left = s->in_frame > 0 ? frame_wire(c, s, s->frame) - s->in_frame : 0;
    c->left_ptr = c->tx && s->in_frame > 0 ? slot(c, s->frame) + s->in_frame : NULL;
}

/* ---------------------------------------------------------------- sendrecv */

/* While blocked, a rank tells its idle peers every keepalive_s() that it is alive; a rank
 * waiting on a peer that keeps saying so allows it grace_s() more, because that peer is itself
 * waiting on someone whose own waiters will time out first and name the culprit to everyone. */
static double keepalive_s(const fl_transport *t) {
    double v = t->timeout_s / 4;
    return v < 0.05 ? 0.05 : v > 5 ? 5 : v;
}
static double grace_s(const fl_transport *t) {
    double v = t->timeout_s / 2;
    return v > 10 ? 10 : v;
}

/* Sends a keepalive to every peer whose send queue is empty (so its 24 bytes, 48 encrypted, go
 * whole, and a
 * peer that is not reading from us is not waiting on us either), except the one this call is
 * still sending to. Not counted in the byte counters: those depend only on the collectives. */
static void send_keepalives(fl_transport *t, int to, bool sending) {
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

/* Watches peer p (not one this call moves data with) for an abort notice. */
static bool watchable(const fl_transport *t, int p) {
    const conn *c = &t->conns[p];
    return p != t->rank && c->fd >= 0 && !c->closed &&
           (c->hdr_got < HDR || c->in_abort || c->in_keepalive);
}

int fl_transport_sendrecv(fl_transport *t, int to, const void *sbuf, size_t sbytes, int from,
                          void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx) {
    if (t->failed)
        return fl_fail(t->fail_code, "%s", t->fail_msg);
    bool do_send = to >= 0 && sbytes > 0, do_recv = from >= 0 && rbytes > 0;
    FL_ASSERT(!do_send || (to < t->size && to != t->rank && sbuf));
    FL_ASSERT(!do_recv || (from < t->size && from != t->rank && rbuf));
    send_state s = {.peer = to, .buf = sbuf, .total = sbytes, .done = !do_send};
    recv_state r = {.peer = from, .buf = rbuf, .total = rbytes, .done = !do_recv,
                    .on_recv = on_recv, .ctx = ctx};
    int rc = 0;
    if (do_send) {
        s.nframes = (sbytes + CHUNK - 1) / CHUNK;
        s.seq0 = t->conns[to].send_seq;
        if (t->conns[to].closed) {
            rc = fail_local(t, FL_EPEER, to, "%s closed the connection", t->conns[to].name);
            goto fail;
        }
    }
    if (do_recv) {
        r.nframes = (rbytes + CHUNK - 1) / CHUNK;
        if (t->conns[from].closed) {
            rc = fail_local(t, FL_EPEER, from, "%s closed the connection",
                            t->conns[from].name);
            goto fail;
        }
    }
    /* stalled: a poll found nothing for STALL_S; from then on this call also watches every
     * peer for abort notices and sends keepalives. alive: the peer we wait on sent keepalives,
     * so it is blocked on someone else: its own waiters will name the culprit. */
    /* the receive starts with a poll: right after our own send its data is rarely there yet,
     * and when it is, poll returns at once (one syscall either way) */
    bool sready = do_send, rready = false, stalled = false, alive = false;
    double last = fl_now(), ka_next = 0, spin_left = t->spin_s;
    for (;;) {
        size_t moved = 0;
        bool blocked = false, ka = false;
        if (sready && !s.done) {
            rc = send_step(t, &s, &blocked, &moved);
            if (rc < 0)
                goto fail;
            sready = !blocked;
        }
        blocked = false;
        if (rready && !r.done) {
            rc = recv_step(t, &r, &blocked, &moved, &ka);
            if (rc < 0)
                goto fail;
            rready = !blocked;
            alive |= ka;
        }
        if (s.done && r.done)
            break;
        double now = fl_now();
        if (moved)
            last = now;
        if ((sready && !s.done) || (rready && !r.done))
            continue;
        double limit = t->timeout_s + (alive ? grace_s(t) : 0);
        if (now - last >= limit) {
            const char *why = alive ? " (it is alive but waiting too: do all ranks call the same "
                                      "collectives in the same order with the same sizes?)"
                                    : "";
            if (!r.done)
                rc = fail_local(t, FL_ETIMEOUT, -1, "no data from %s for %g s%s",
                                t->conns[from].name, limit, why);
            else
                rc = fail_local(t, FL_ETIMEOUT, -1, "%s accepted no data for %g s%s",
                                t->conns[to].name, limit, why);
            goto fail;
        }
        if (stalled && now >= ka_next) {
            send_keepalives(t, to, !s.done);
            ka_next = now + keepalive_s(t);
        }
        /* wait for the sockets we move data on; after a stall also for abort notices */
        int n = 0, sidx = -1, ridx = -1;
        if (!s.done) {
            sidx = n;
            t->pfd_peer[n] = to;
            t->pfd[n++] = (struct pollfd){.fd = t->conns[to].fd, .events = POLLOUT};
        }
        if (!r.done) {
            if (sidx >= 0 && to == from) {
                ridx = sidx;
                t->pfd[sidx].events |= POLLIN;
            } else {
                ridx = n;
                t->pfd_peer[n] = from;
                t->pfd[n++] = (struct pollfd){.fd = t->conns[from].fd, .events = POLLIN};
            }
        }
        int nmain = n;
        if (stalled) {
            for (int p = 0; p < t->size; p++) {
                if (p == from || !watchable(t, p))
                    continue;
                if (p == to && sidx >= 0) {
                    t->pfd[sidx].events |= POLLIN;
                    continue;
                }
                t->pfd_peer[n] = p;
                t->pfd[n++] = (struct pollfd){.fd = t->conns[p].fd, .events = POLLIN};
            }
        }
        double until = last + limit;
        if (!stalled && now + STALL_S < until)
            until = now + STALL_S;
        if (stalled && ka_next < until)
            until = ka_next;
        /* Busy-poll briefly before sleeping: a small message's reply usually comes within tens
         * of microseconds, and waking a sleeping vCPU costs about as much again (OpenMPI spins
         * for the same reason). The budget is per call, so a long transfer sleeps as before
         * and at most spin_s of CPU is taken from ranks sharing a core. */
        int pr = 0;
        if (!stalled && spin_left > 0) {
            double spin_end = now + spin_left;
            do
                pr = poll(t->pfd, (nfds_t)n, 0);
            while (pr == 0 && fl_now() < spin_end);
            spin_left = spin_end - fl_now();
        }
        if (pr == 0)
            pr = poll(t->pfd, (nfds_t)n, fl_net_poll_ms(until));
        if (pr < 0 && errno != EINTR) {
            rc = fail_local(t, FL_EIO, -1, "rank %d: poll failed: %s", t->rank, strerror(errno));
            goto fail;
        }
        if (pr <= 0) {
            stalled = true;
            continue;
        }
        const short in = POLLIN | POLLERR | POLLHUP, out = POLLOUT | POLLERR | POLLHUP;
        if (sidx >= 0 && (t->pfd[sidx].revents & out))
            sready = true;
        if (ridx >= 0 && (t->pfd[ridx].revents & in))
            rready = true;
        for (int i = 0; i < n; i++) {
            int p = t->pfd_peer[i];
            if (p == from || !(t->pfd[i].revents & in) || (i < nmain && p != to) ||
                !watchable(t, p))
                continue;
            bool peer_alive = false;
            rc = read_header(t, p, FL_WIRE_LEN_ANY, &peer_alive);
            if (rc < 0)
                goto fail;
            if (peer_alive && p == to && !s.done)
                alive = true;
        }
    }
    return 0;
fail:
    if (do_send && !s.done)
        send_abandon(t, &s);
    broadcast_abort(t);
    return fl_fail(t->fail_code, "%s", t->fail_msg);
}

/* ---------------------------------------------------------------- creation */

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
                (void)fl_net_write_full(c->fd, hdr, HDR + tag_len(c, true), end);
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
