/* peers.h - the pair interface every collective algorithm is written against, as gloo's
 * algorithms only use pairs: this rank, the rank count, and one primitive, "send to one peer
 * while receiving from another". Transports implement it (transport.c: TCP or unix sockets;
 * shm.c: shared memory between ranks of one host), and so does a group (group.c: a subset of
 * another fl_peers' ranks, renumbered 0 .. n-1, for the hierarchical collectives). Algorithms
 * (ring.c, rd.c, rh.c, bcast.c, alltoall.c, bruck.c, hier.c) never see a socket or a segment.
 * Private to src/comm and its tests. */
#ifndef FLEET_PEERS_H
#define FLEET_PEERS_H

#include <stddef.h>

typedef struct fl_peers fl_peers;

/* Called as each received chunk [off, off + len) of rbuf is complete, in order, so the caller
 * can reduce it while later chunks are still in flight (pipelining). */
typedef void (*fl_recv_fn)(void *ctx, size_t off, size_t len);

struct fl_peers_ops {
    /* Sends sbytes of sbuf to rank `to` while receiving exactly rbytes into rbuf from rank
     * `from` (either side may be skipped with rank -1 or 0 bytes; to may equal from). Both
     * sides of a pair must agree on the sizes. on_recv (may be NULL) is called per completed
     * received chunk. Fails with FL_EPEER (the peer died, closed, or broke the protocol) or
     * FL_ETIMEOUT (no progress within the timeout), the message naming the rank and endpoint;
     * after a failure the implementation makes every peer it can reach fail too, naming the
     * same culprit, and refuses further calls. */
    int (*sendrecv)(fl_peers *p, int to, const void *sbuf, size_t sbytes, int from, void *rbuf,
                    size_t rbytes, fl_recv_fn on_recv, void *ctx);
    /* "rank 3 (127.0.0.1:6173)" for messages (rank in this fl_peers' numbering). */
    const char *(*peer_name)(const fl_peers *p, int rank);
    /* Releases the implementation (a group does not free its parent). NULL-safe wrapper below. */
    void (*free)(fl_peers *p);
};

/* The common head of every implementation (embedded first in its struct). */
struct fl_peers {
    const struct fl_peers_ops *ops;
    int                        rank, size;
};

static inline int fl_peers_rank(const fl_peers *p) { return p->rank; }
static inline int fl_peers_size(const fl_peers *p) { return p->size; }

static inline int fl_peers_sendrecv(fl_peers *p, int to, const void *sbuf, size_t sbytes,
                                    int from, void *rbuf, size_t rbytes, fl_recv_fn on_recv,
                                    void *ctx) {
    return p->ops->sendrecv(p, to, sbuf, sbytes, from, rbuf, rbytes, on_recv, ctx);
}

static inline const char *fl_peers_name(const fl_peers *p, int rank) {
    return p->ops->peer_name(p, rank);
}

static inline void fl_peers_free(fl_peers *p) {
    if (p)
        p->ops->free(p);
}

#endif /* FLEET_PEERS_H */
