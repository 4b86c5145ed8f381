/* transport_conn.h - the connection state private to the tcp backend's transport (transport.h),
 * which is six files: transport.c, the handle's life cycle (connecting, authenticating, the
 * goodbye at free); transport_sendrecv.c, the one poll loop that moves both directions of a
 * sendrecv; transport_send.c and transport_recv.c, its two halves (DATA frames straight
 * between the caller's buffers and the kernel, sealed through a staging ring or opened in place
 * when the connection is encrypted); transport_abort.c, failures and the ABORT frames that carry
 * them to every peer; and transport_keepalive.c, the keepalives a blocked rank sends to its idle
 * peers (transport_recv.c checks those it receives). What they share: the frame sizes, each
 * peer's connection, the handle, and the steps each file offers the others. */
#ifndef FLEET_TRANSPORT_CONN_H
#define FLEET_TRANSPORT_CONN_H

#include "transport.h"

#include "crypto.h"
#include "listener.h"
#include "wire.h"

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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

static inline void transport_count_sent(fl_transport *t, size_t n) {
    atomic_fetch_add_explicit(&t->counters->bytes_sent, n, memory_order_relaxed);
}
static inline void transport_count_received(fl_transport *t, size_t n) {
    atomic_fetch_add_explicit(&t->counters->bytes_received, n, memory_order_relaxed);
}

/* Payload bytes of frame k of a transfer of total bytes. */
static inline size_t transport_frame_len(size_t total, size_t k) {
    size_t left = total - k * CHUNK;
    return left < CHUNK ? left : CHUNK;
}

/* Bytes after a frame's payload: the tag on an encrypted connection. */
static inline size_t transport_tag_len(const conn *c, bool sending) {
    return (sending ? c->tx : c->rx) ? TAG : 0;
}

/* ---- transport_abort.c ---- */

/* Records the failure (message orig, first noticed by rank reporter) and what the abort
 * notice to the other peers will carry; skip: a peer not worth telling, or -1. Returns code. */
int transport_set_failed(fl_transport *t, int code, int skip, int reporter, const char *orig);
/* A failure this rank noticed itself; skip: a peer not worth telling (it is gone), or -1.
 * Returns code. */
int transport_fail_local(fl_transport *t, int code, int skip, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An abort notice from peer p (its message in conns[p].abort_msg): fails with the original
 * culprit's message, to be passed on. Returns the failure. */
int transport_fail_reported(fl_transport *t, int p);
/* Best effort, bounded in time: completes any frame cut short, then sends the ABORT frame to
 * every peer still connected except t->abort_skip. */
void transport_broadcast_abort(fl_transport *t);

/* ---- transport_recv.c ---- */

/* Result of reading toward a frame header. */
enum { HDR_BLOCKED = 0, HDR_DATA = 1, HDR_GOODBYE = 2 };

/* Socket error or EOF while reading from peer p: records the failure (if fail) and marks the
 * connection closed. Returns the failure, or 0 when not failing. */
int transport_read_error(fl_transport *t, int p, ssize_t k, bool fail);
/* A recv/recvmsg result that only means "try again later". */
bool transport_would_block(ssize_t k);
/* Reads the next frame header from peer p and, for an ABORT, its message; keepalives are
 * consumed on the way (*alive set). want_len: the DATA length the caller expects, or
 * FL_WIRE_LEN_ANY when only watching for aborts (then a DATA header stays in conns[p].hdr for
 * the operation that will consume it, and EOF is not an error: the peer may simply be done).
 * Returns HDR_BLOCKED, HDR_DATA (consumed unless watching), HDR_GOODBYE (the peer closed), or
 * a failure. */
int transport_read_header(fl_transport *t, int p, uint64_t want_len, bool *alive);
/* Peer p went away while we sent to it: finds its abort notice in our receive queue, if it
 * left because of an earlier failure. Returns that failure, or 0 if none. */
int transport_salvage_abort(fl_transport *t, int p);

/* One sendrecv's receiving side. */
typedef struct {
    int        peer;
    uint8_t   *buf;
    size_t     total, nframes;
    size_t     frame, got; /* current frame, its payload bytes received */
    bool       in_payload, done;
    fl_recv_fn on_recv;
    void      *ctx;
} recv_state;

/* Receives as much as the socket has. Sets *blocked when it ran dry, *alive when a keepalive
 * came by. Returns 0 or a failure; *moved counts DATA bytes read. */
int transport_recv_step(fl_transport *t, recv_state *r, bool *blocked, size_t *moved,
                        bool *alive);

/* ---- transport_send.c ---- */

/* One sendrecv's sending side. */
typedef struct {
    int            peer;
    const uint8_t *buf;
    size_t         total, nframes;
    size_t         frame, in_frame; /* current frame, its bytes sent (header included) */
    size_t         sealed;          /* encrypted: frames sealed into the staging ring */
    uint64_t       seq0;
    bool           done;
} send_state;

/* Sends as much as the socket takes. Sets *blocked when it took less than offered. Returns 0
 * or a failure; *moved counts bytes sent. */
int transport_send_step(fl_transport *t, send_state *s, bool *blocked, size_t *moved);
/* The send was cut short by a failure: remembers what its current frame still owes, so that
 * the abort notice can complete it first. */
void transport_send_abandon(fl_transport *t, send_state *s);

/* ---- transport_keepalive.c ---- */

/* How often a blocked rank tells its idle peers it is alive, and how much longer a rank waits
 * on a peer that keeps saying so. */
double transport_keepalive_s(const fl_transport *t);
double transport_grace_s(const fl_transport *t);
/* Sends a keepalive to every peer whose send queue is empty, except `to` while sending. */
void transport_send_keepalives(fl_transport *t, int to, bool sending);

#endif /* FLEET_TRANSPORT_CONN_H */
