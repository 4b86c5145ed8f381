/* tcp.h - the tcp backend's insides: its tuning knobs, its scratch buffer, and the algorithms
 * it picks from (ring.c, rd.c, bcast.c), which talk to ranks through the transport and never
 * see a socket. Private to src/comm and its tests. */
#ifndef FLEET_COMM_TCP_H
#define FLEET_COMM_TCP_H

#include "comm_impl.h"
#include "transport.h"

#include <stddef.h>

/* Where the tcp backend switches algorithms (see tcp.c for how the defaults were measured). */
typedef struct {
    size_t rd_max_bytes;      /* allreduce: recursive doubling up to this many bytes, else ring
                                 (env FLEET_TCP_RD_MAX_BYTES overrides the default) */
    size_t seg_max_bytes;     /* ring: at most this many bytes per segment; larger buffers go
                                 round the ring in several passes (bounds the scratch buffer) */
    size_t bcast_tree_max_bytes; /* broadcast: binomial tree up to this many bytes, else chain */
    size_t bcast_chunk_bytes; /* broadcast chain: pipeline chunk */
} fl_tcp_tuning;

/* One growable buffer per communicator: allocated on first use, grown (never shrunk) when a
 * collective needs more, freed with the communicator. */
typedef struct {
    void  *data;
    size_t cap;
} fl_tcp_scratch;

/* Returns a buffer of at least nbytes (NULL with FL_ENOMEM's message when out of memory). */
void *fl_tcp_scratch_get(fl_tcp_scratch *s, size_t nbytes);
void  fl_tcp_scratch_free(fl_tcp_scratch *s);

/* A tcp communicator over already-connected sockets (fds[r] for r != rank, fds[rank] = -1;
 * ownership passes to the communicator), e.g. socketpair()s between threads in tests. */
int fl_comm_tcp_from_fds(int rank, int size, const int *fds, double timeout_s, fl_comm **out);
/* Reads / replaces the switch points of a tcp communicator (tests force each algorithm). */
void fl_comm_tcp_get_tuning(const fl_comm *c, fl_tcp_tuning *out);
void fl_comm_tcp_set_tuning(fl_comm *c, const fl_tcp_tuning *tuning);

/* --- ring.c: Patarasuk & Yuan 2009; every call is made by all ranks with the same arguments
 * except the buffers. Elements of es = fl_dtype_size(t) bytes. --- */
/* buf (count) becomes op over all ranks: ring reduce-scatter, then ring allgather. */
int fl_ring_allreduce(fl_transport *tp, fl_tcp_scratch *s, size_t seg_max_bytes, void *buf,
                      size_t count, fl_dtype t, fl_redop op);
/* in (size * count), out (count) = op over ranks of block rank of in; out must not overlap in. */
int fl_ring_reduce_scatter(fl_transport *tp, fl_tcp_scratch *s, size_t seg_max_bytes,
                           const void *in, void *out, size_t count, fl_dtype t, fl_redop op);
/* in (counts[rank] * es bytes) of every rank concatenated in rank order into out; counts NULL
 * means every rank contributes `count` elements. in may be out's own slot (in place). */
int fl_ring_allgatherv(fl_transport *tp, const void *in, void *out, const size_t *counts,
                       size_t count, size_t es);

/* --- rd.c: Thakur, Rabenseifner & Gropp 2005 --- */
/* buf (count) becomes op over all ranks in ceil(log2 size) (+2 for non-powers of two) steps. */
int fl_rd_allreduce(fl_transport *tp, fl_tcp_scratch *s, void *buf, size_t count, fl_dtype t,
                    fl_redop op);
/* Dissemination barrier: ceil(log2 size) rounds of one byte. */
int fl_rd_barrier(fl_transport *tp);

/* --- alltoall.c: Thakur, Rabenseifner & Gropp 2005 --- */
/* Pairwise exchange: rank r's in block j (send_counts[j] elements) goes to rank j's out block r
 * (its recv_counts[r]); blocks in rank order. n - 1 full-duplex steps. */
int fl_pairwise_alltoallv(fl_transport *tp, const void *in, const size_t *send_counts, void *out,
                          const size_t *recv_counts, size_t es);

/* --- bcast.c --- */
/* Binomial tree: ceil(log2 size) rounds of the whole buffer (small messages). */
int fl_bcast_tree(fl_transport *tp, void *buf, size_t nbytes, int root);
/* Pipelined chain root -> root+1 -> ...: each rank receives and forwards chunk by chunk
 * (large messages: every link carries the buffer once). */
int fl_bcast_chain(fl_transport *tp, void *buf, size_t nbytes, int root, size_t chunk);

#endif /* FLEET_COMM_TCP_H */
