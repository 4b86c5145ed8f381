/* msgconn.c - one message connection (include/fleet/msgconn.h): every message is one DATA frame
 * of wire.h (header, payload and, on an encrypted connection, the AEAD tag behind it, sealed
 * as transport_send.c seals its frames: the sequence number as nonce, the header as associated
 * data). Sends go whole under a send lock; receives run a state machine under a receive lock
 * whose progress outlives the call, so that a wait that times out in the middle of a message
 * loses nothing. fl_msg_close says goodbye with an empty ABORT frame, as the transport does, so
 * that a peer that stopped is told from one that died. Listening and dialling are in
 * msg_listener.c. */
#include "msgconn_impl.h"

#include "crypto.h"
#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define HDR FL_WIRE_FRAME_SIZE
#define TAG FL_CRYPTO_TAG
#define IOV_BATCH  64                  /* iovec entries handed to one sendmsg */
#define STAGE_KEEP ((size_t)16 << 20)  /* a larger sealing buffer is freed after its message */
#define GOODBYE_S  0.5                 /* how long fl_msg_close tries to say goodbye */

enum { RECV_OPEN = 0, RECV_GOODBYE = 1 }; /* recv_state; < 0: failed with that code */
enum { STEP_DONE = 1, STEP_BLOCKED = 2, STEP_SKIP = 3 };

struct fl_msg_conn {
    int              fd;
    double           timeout_s;
    char             name[FL_ENDPOINT_MAX + 48];
    fl_aead         *tx, *rx; /* NULL: in the clear */
    _Atomic uint64_t bytes_sent, bytes_received;

    /* sending, under send_lock */
    pthread_mutex_t send_lock;
    uint64_t        send_seq;
    uint8_t        *stage; /* encrypted: the sealed frame on its way out */
    size_t          stage_cap;
    int             send_failed; /* the stream was cut mid-frame (or the peer left): its code */
    char            send_msg[512];

    /* receiving, under recv_lock: where the next frame stands */
    pthread_mutex_t recv_lock;
    uint64_t        recv_seq;
    uint8_t         hdr[HDR];
    size_t          hdr_got;
    bool            in_body; /* header parsed: reading payload and tag */
    uint32_t        type;
    uint64_t        len, got;
    uint8_t         tag[TAG];
    size_t          tag_got;
    uint8_t        *park; /* payload of a message a timeout interrupted (len bytes) */
    char            abort_msg[FL_WIRE_ABORT_MAX + 1];
    int             recv_state;
    char            recv_msg[512];
};

double fl_msg_config_timeout(const fl_msg_config *c) {
    return c && c->timeout_s > 0 ? c->timeout_s : 300;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static bool would_block(ssize_t k) {
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/* ---------------------------------------------------------------- creation */

int fl_msg_conn_create(int fd, double timeout_s, const char *name, fl_hs_session *ses,
                       fl_msg_conn **out) {
    *out = NULL;
    fl_msg_conn *m = calloc(1, sizeof *m);
    if (!m) {
        if (ses)
            fl_hs_session_wipe(ses);
        close(fd);
        return fl_fail(FL_ENOMEM, "out of memory for the connection with %s", name);
    }
    m->fd = fd;
    m->timeout_s = timeout_s > 0 ? timeout_s : 300;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "peer");
    pthread_mutex_init(&m->send_lock, NULL);
    pthread_mutex_init(&m->recv_lock, NULL);
    (void)fl_net_set_nonblock(fd);
    fl_net_tune(fd);
    int rc = 0;
    if (ses && ses->encrypt) {
        rc = fl_aead_create(ses->cipher, ses->tx, &m->tx);
        if (rc == 0)
            rc = fl_aead_create(ses->cipher, ses->rx, &m->rx);
        if (rc == 0)
            FL_DEBUG("comm: messages with %s encrypted (%s)", m->name,
                     fl_aead_cipher_name(ses->cipher));
    }
    if (ses)
        fl_hs_session_wipe(ses);
    if (rc < 0) {
        m->send_failed = rc; /* no goodbye: nothing was said yet */
        fl_msg_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

int fl_msg_conn_from_fd(int fd, const fl_msg_config *c, const char *name, fl_msg_conn **out) {
    FL_ASSERT(fd >= 0 && out);
    return fl_msg_conn_create(fd, fl_msg_config_timeout(c), name, NULL, out);
}

/* ---------------------------------------------------------------- sending */

static int send_fail(fl_msg_conn *m, int code, bool cut, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A failed send; cut: the stream is unusable from now on (part of a frame went, or the peer
 * is gone), so later sends fail with the same message. Returns code. */
static int send_fail(fl_msg_conn *m, int code, bool cut, const char *fmt, ...) {
    char msg[sizeof m->send_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (cut) {
        m->send_failed = code;
        memcpy(m->send_msg, msg, sizeof msg);
    }
    return fl_fail(code, "%s", msg);
}

/* Writes hdr (may be NULL) and then the parts, total bytes in all, waiting at most
 * m->timeout_s without progress. */
static int write_frame(fl_msg_conn *m, const uint8_t *hdr, const fl_msg_part *parts, int nparts,
                       size_t total) {
    size_t done = 0, hdr_left = hdr ? HDR : 0, off = 0; /* off: into parts[idx] */
    int idx = 0;
    double deadline = fl_now() + m->timeout_s;
    while (done < total) {
        struct iovec iov[IOV_BATCH];
        int niov = 0;
        if (hdr_left)
            iov[niov++] = (struct iovec){(void *)(hdr + HDR - hdr_left), hdr_left};
        for (int i = idx; i < nparts && niov < IOV_BATCH; i++) {
            size_t skip = i == idx ? off : 0;
            if (parts[i].n > skip)
                iov[niov++] = (struct iovec){(uint8_t *)parts[i].p + skip, parts[i].n - skip};
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t k = sendmsg(m->fd, &mh, MSG_NOSIGNAL);
        if (k > 0) {
            done += (size_t)k;
            size_t left = (size_t)k, h = left < hdr_left ? left : hdr_left;
            hdr_left -= h;
            left -= h;
            while (idx < nparts && (left > 0 || off == parts[idx].n)) {
                size_t take = parts[idx].n - off < left ? parts[idx].n - off : left;
                off += take;
                left -= take;
                if (off == parts[idx].n) {
                    idx++;
                    off = 0;
                }
            }
            deadline = fl_now() + m->timeout_s;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (fl_now() >= deadline)
                return send_fail(m, FL_ETIMEOUT, done > 0, "%s accepted no data for %g s",
                                 m->name, m->timeout_s);
            struct pollfd p = {.fd = m->fd, .events = POLLOUT};
            if (poll(&p, 1, fl_net_poll_ms(deadline)) < 0 && errno != EINTR)
                return send_fail(m, FL_EIO, done > 0, "sending to %s: poll: %s", m->name,
                                 strerror(errno));
            continue;
        }
        int e = k < 0 ? errno : EPIPE;
        if (e == EPIPE)
            return send_fail(m, FL_EPEER, true, "%s closed the connection", m->name);
        if (e == ECONNRESET)
            return send_fail(m, FL_EPEER, true, "%s reset the connection", m->name);
        return send_fail(m, FL_EPEER, true, "sending to %s failed: %s", m->name, strerror(e));
    }
    return 0;
}

/* One frame of `type` carrying the parts (total bytes), sealed when the connection is. */
static int send_frame(fl_msg_conn *m, uint32_t type, const fl_msg_part *parts, int nparts,
                      size_t total) {
    if (m->send_failed)
        return fl_fail(m->send_failed, "%s", m->send_msg);
    uint8_t hdr[HDR];
    fl_wire_frame_encode(hdr, type, m->send_seq, total);
    int rc;
    if (m->tx) { /* gather, seal in place, send the frame whole */
        size_t need = HDR + total + TAG;
        if (need > m->stage_cap) {
            free(m->stage);
            m->stage_cap = 0;
            if (!(m->stage = malloc(need)))
                return fl_fail(FL_ENOMEM, "out of memory sealing a %zu-byte message to %s",
                               total, m->name);
            m->stage_cap = need;
        }
        memcpy(m->stage, hdr, HDR);
        size_t at = HDR;
        for (int i = 0; i < nparts; i++) {
            if (parts[i].n)
                memcpy(m->stage + at, parts[i].p, parts[i].n);
            at += parts[i].n;
        }
        if (fl_aead_seal(m->tx, m->send_seq, hdr, HDR, m->stage + HDR, m->stage + HDR, total,
                         m->stage + HDR + total) < 0)
            return fl_fail(FL_EIO, "sealing a message to %s: %s", m->name, fl_errmsg());
        fl_msg_part whole = {m->stage, need};
        rc = write_frame(m, NULL, &whole, 1, need);
        if (m->stage_cap > STAGE_KEEP) {
            free(m->stage);
            m->stage = NULL;
            m->stage_cap = 0;
        }
    } else {
        rc = write_frame(m, hdr, parts, nparts, HDR + total);
    }
    if (rc == 0)
        m->send_seq++; /* a sealed frame that never left used no nonce on the wire */
    return rc;
}

int fl_msg_sendv(fl_msg_conn *m, const fl_msg_part *parts, int nparts) {
    FL_ASSERT(m && nparts >= 0 && (parts || nparts == 0));
    size_t total = 0;
    for (int i = 0; i < nparts; i++) {
        FL_ASSERT(parts[i].p || parts[i].n == 0);
        if (parts[i].n > FL_MSG_MAX_BYTES || total + parts[i].n > FL_MSG_MAX_BYTES)
            return fl_fail(FL_EINVAL, "a message to %s of more than %zu bytes (the most a "
                           "message connection carries)", m->name, FL_MSG_MAX_BYTES);
        total += parts[i].n;
    }
    pthread_mutex_lock(&m->send_lock);
    int rc = send_frame(m, FL_WIRE_DATA, parts, nparts, total);
    pthread_mutex_unlock(&m->send_lock);
    if (rc == 0)
        atomic_fetch_add_explicit(&m->bytes_sent, total, memory_order_relaxed);
    return rc;
}

int fl_msg_send(fl_msg_conn *m, const void *p, size_t n) {
    fl_msg_part part = {p, n};
    return fl_msg_sendv(m, &part, 1);
}

/* ---------------------------------------------------------------- receiving */

static int recv_fail(fl_msg_conn *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The connection cannot receive any more: later calls fail with the same message. */
static int recv_fail(fl_msg_conn *m, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->recv_msg, sizeof m->recv_msg, fmt, ap);
    va_end(ap);
    m->recv_state = code;
    return fl_fail(code, "%s", m->recv_msg);
}

/* recv returned k <= 0 (and not "would block"). */
static int read_error(fl_msg_conn *m, ssize_t k) {
    if (k < 0 && errno == ECONNRESET)
        return recv_fail(m, FL_EPEER, "%s reset the connection", m->name);
    if (k < 0)
        return recv_fail(m, FL_EPEER, "receiving from %s failed: %s", m->name, strerror(errno));
    if (m->in_body || m->hdr_got > 0)
        return recv_fail(m, FL_EPEER, "%s closed the connection in the middle of a message",
                         m->name);
    return recv_fail(m, FL_EPEER, "%s closed the connection without a goodbye (did it die?)",
                     m->name);
}

/* The header is whole: checks it and prepares for its body. STEP_SKIP for a keepalive. */
static int header_done(fl_msg_conn *m) {
    fl_wire_frame f;
    char reason[160];
    int st = fl_wire_frame_parse(m->hdr, HDR, m->recv_seq, FL_WIRE_LEN_ANY, FL_MSG_MAX_BYTES,
                                 &f, reason, sizeof reason);
    if (st == FL_WIRE_BAD_LENGTH) { /* the parser's "any length" starts at 1 byte */
        uint64_t len = le64(m->hdr + 16);
        if (len == 0 && fl_wire_frame_parse(m->hdr, HDR, m->recv_seq, 0, 0, &f, NULL, 0) ==
                            FL_WIRE_OK)
            st = FL_WIRE_OK;
        else if (len > FL_MSG_MAX_BYTES && (le64(m->hdr) >> 32) == FL_WIRE_DATA /* type */)
            snprintf(reason, sizeof reason, "a message of %llu bytes, more than the %zu a "
                     "message connection carries", (unsigned long long)len, FL_MSG_MAX_BYTES);
    }
    if (st == FL_WIRE_BAD_SEQ)
        return recv_fail(m, FL_EPEER, "%s sent message %llu where %llu was next: replayed, "
                         "reordered or lost on the way", m->name,
                         (unsigned long long)le64(m->hdr + 8), (unsigned long long)m->recv_seq);
    if (st != FL_WIRE_OK)
        return recv_fail(m, FL_EPEER, "%s sent a malformed frame: %s", m->name, reason);
    if (f.type == FL_WIRE_KEEPALIVE) { /* uses up no sequence number */
        /* nothing on a message connection sends keepalives; a bare one on a sealed
         * connection would be the one frame nobody authenticated: someone on the path */
        if (m->rx)
            return recv_fail(m, FL_EPEER, "%s sent an unauthenticated keepalive on an encrypted "
                             "message connection: injected on the way", m->name);
        m->hdr_got = 0;
        return STEP_SKIP;
    }
    m->in_body = true;
    m->type = f.type;
    m->len = f.len;
    m->got = 0;
    m->tag_got = 0;
    return 0;
}

/* Where the body of the frame being read goes: the caller's buffer (grown to hold it), the
 * connection's own while a message interrupted by a timeout is parked there, the abort
 * buffer for ABORT frames. NULL when out of memory. */
static uint8_t *body_dst(fl_msg_conn *m, void **buf, size_t *cap) {
    if (m->type != FL_WIRE_DATA || m->len == 0)
        return (uint8_t *)m->abort_msg; /* never NULL, also for empty messages */
    if (m->park)
        return m->park;
    if (m->len > *cap) {
        void *p = realloc(*buf, m->len);
        if (!p)
            return NULL;
        *buf = p;
        *cap = m->len;
    }
    return *buf;
}

/* Payload and tag are in: opens the frame and delivers it. STEP_DONE with a message, 0 after
 * a goodbye, or a failure. */
static int body_done(fl_msg_conn *m, uint8_t *dst, void **buf, size_t *cap, size_t *n) {
    bool data = m->type == FL_WIRE_DATA;
    if (m->rx && fl_aead_open(m->rx, m->recv_seq, m->hdr, HDR, dst, m->len, m->tag) < 0)
        return recv_fail(m, FL_EPEER, "%s from %s failed authentication: altered, reordered or "
                         "replayed (nothing of it was used)", data ? "message" : "goodbye",
                         m->name);
    m->recv_seq++;
    m->in_body = false;
    m->hdr_got = 0;
    if (!data) {
        if (m->len == 0) {
            m->recv_state = RECV_GOODBYE;
            return 0;
        }
        m->abort_msg[m->len] = '\0';
        for (char *q = m->abort_msg; *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e)
                *q = '?';
        return recv_fail(m, FL_EPEER, "%s gave up: %s", m->name, m->abort_msg);
    }
    if (m->park) { /* the message began before a timeout: hand over the buffer it is in */
        free(*buf);
        *buf = m->park;
        *cap = m->len;
        m->park = NULL;
    }
    *n = m->len;
    atomic_fetch_add_explicit(&m->bytes_received, m->len, memory_order_relaxed);
    return STEP_DONE;
}

/* Reads as much of the next message as the socket has. STEP_DONE, STEP_BLOCKED, 0 (goodbye)
 * or a failure; *moved when bytes came. */
static int recv_step(fl_msg_conn *m, void **buf, size_t *cap, size_t *n, bool *moved) {
    for (;;) {
        if (!m->in_body) {
            while (m->hdr_got < HDR) {
                ssize_t k = recv(m->fd, m->hdr + m->hdr_got, HDR - m->hdr_got, 0);
                if (would_block(k))
                    return STEP_BLOCKED;
                if (k <= 0)
                    return read_error(m, k);
                m->hdr_got += (size_t)k;
                *moved = true;
            }
            int rc = header_done(m);
            if (rc == STEP_SKIP)
                continue;
            if (rc < 0)
                return rc;
        }
        uint8_t *dst = body_dst(m, buf, cap);
        if (!dst)
            return recv_fail(m, FL_ENOMEM, "out of memory for a %llu-byte message from %s",
                             (unsigned long long)m->len, m->name);
        size_t tl = m->rx ? TAG : 0;
        while (m->got < m->len || m->tag_got < tl) {
            struct iovec iov[2];
            int niov = 0;
            if (m->got < m->len)
                iov[niov++] = (struct iovec){dst + m->got, (size_t)(m->len - m->got)};
            if (m->tag_got < tl)
                iov[niov++] = (struct iovec){m->tag + m->tag_got, tl - m->tag_got};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
            ssize_t k = recvmsg(m->fd, &mh, 0);
            if (would_block(k))
                return STEP_BLOCKED;
            if (k <= 0)
                return read_error(m, k);
            *moved = true;
            size_t left = (size_t)k, into = m->len - m->got < left ? m->len - m->got : left;
            m->got += into;
            m->tag_got += left - into;
        }
        return body_done(m, dst, buf, cap, n);
    }
}

/* A wait ran out: a message begun keeps its bytes in the connection (the caller's buffer is
 * the caller's again until the message is whole). */
static int recv_timeout(fl_msg_conn *m, void **buf, double wait) {
    if (m->in_body && m->type == FL_WIRE_DATA && m->got > 0 && !m->park) {
        if (!(m->park = malloc(m->len)))
            return recv_fail(m, FL_ENOMEM, "out of memory for a %llu-byte message from %s",
                             (unsigned long long)m->len, m->name);
        memcpy(m->park, *buf, m->got);
    }
    if (m->in_body)
        return fl_fail(FL_ETIMEOUT, "%s sent %llu of a %llu-byte message, then nothing for %g s",
                       m->name, (unsigned long long)m->got, (unsigned long long)m->len, wait);
    if (m->hdr_got > 0)
        return fl_fail(FL_ETIMEOUT, "%s sent part of a frame header, then nothing for %g s",
                       m->name, wait);
    return fl_fail(FL_ETIMEOUT, "no message from %s for %g s", m->name, wait);
}

static int recv_locked(fl_msg_conn *m, void **buf, size_t *cap, size_t *n, double wait) {
    if (m->recv_state == RECV_GOODBYE)
        return 0;
    if (m->recv_state < 0)
        return fl_fail(m->recv_state, "%s", m->recv_msg);
    double deadline = fl_now() + wait;
    for (;;) {
        bool moved = false;
        int rc = recv_step(m, buf, cap, n, &moved);
        if (rc == STEP_DONE)
            return 1;
        if (rc != STEP_BLOCKED)
            return rc;
        double now = fl_now();
        if (moved)
            deadline = now + wait;
        if (now >= deadline)
            return recv_timeout(m, buf, wait);
        struct pollfd p = {.fd = m->fd, .events = POLLIN};
        if (poll(&p, 1, fl_net_poll_ms(deadline)) < 0 && errno != EINTR)
            return fl_fail(FL_EIO, "receiving from %s: poll: %s", m->name, strerror(errno));
    }
}

int fl_msg_recv(fl_msg_conn *m, void **buf, size_t *cap, size_t *n, double timeout_s) {
    FL_ASSERT(m && buf && cap && n);
    pthread_mutex_lock(&m->recv_lock);
    int rc = recv_locked(m, buf, cap, n, timeout_s < 0 ? m->timeout_s : timeout_s);
    pthread_mutex_unlock(&m->recv_lock);
    return rc;
}

/* ---------------------------------------------------------------- the rest */

int fl_msg_fd(const fl_msg_conn *m) { return m->fd; }
const char *fl_msg_peer_name(const fl_msg_conn *m) { return m->name; }
void fl_msg_set_name(fl_msg_conn *m, const char *name) {
    snprintf(m->name, sizeof m->name, "%s", name);
}
bool fl_msg_encrypted(const fl_msg_conn *m) { return m->tx != NULL; }
uint64_t fl_msg_bytes_sent(const fl_msg_conn *m) {
    return atomic_load_explicit(&m->bytes_sent, memory_order_relaxed);
}
uint64_t fl_msg_bytes_received(const fl_msg_conn *m) {
    return atomic_load_explicit(&m->bytes_received, memory_order_relaxed);
}

void fl_msg_close(fl_msg_conn *m) {
    if (!m)
        return;
    if (!m->send_failed) { /* goodbye: an ABORT frame with no message, sealed if we seal */
        uint8_t bye[HDR + TAG];
        fl_wire_frame_encode(bye, FL_WIRE_ABORT, m->send_seq, 0);
        if (!m->tx || fl_aead_seal(m->tx, m->send_seq, bye, HDR, bye, bye + HDR, 0,
                                   bye + HDR) == 0)
            (void)fl_net_write_full(m->fd, bye, HDR + (m->tx ? TAG : 0),
                                    fl_now() + GOODBYE_S);
    }
    /* unread input would turn close into a reset that could discard what we sent last */
    shutdown(m->fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 64 && recv(m->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++)
        ;
    close(m->fd);
    fl_aead_free(m->tx); /* wipes the keys */
    fl_aead_free(m->rx);
    free(m->stage);
    free(m->park);
    pthread_mutex_destroy(&m->send_lock);
    pthread_mutex_destroy(&m->recv_lock);
    free(m);
}
