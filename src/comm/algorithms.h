/* algorithms.h - the collective algorithms, written against the pair interface (peers.h) so that
 * any transport runs them (sockets, shared memory, a group of another transport's ranks). Every
 * call is made by all ranks of the fl_peers with the same arguments except the buffers.
 * Elements of es = fl_dtype_size(t) bytes. Private to src/comm and its tests. */
#ifndef FLEET_ALGORITHMS_H
#define FLEET_ALGORITHMS_H

#include "comm_impl.h"
#include "peers.h"
#include "scratch.h"

#include <stddef.h>

/* --- reducing as chunks land (ring.c, rh.c) --- */
/* An on_recv context (peers.h): acc[i] = acc[i] op in[i] for the whole elements of each
 * completed chunk (chunks are in bytes and may split an element), so that the reduction
 * overlaps the transfer of later chunks. */
typedef struct {
    char       *acc;
    const char *in;
    size_t      es, done; /* element size, elements reduced so far */
    fl_dtype    t;
    fl_redop    op;
} fl_chunk_reduce;

static inline void fl_chunk_reduce_on_recv(void *p, size_t off, size_t len) {
    fl_chunk_reduce *x = p;
    size_t upto = (off + len) / x->es;
    if (upto <= x->done)
        return;
    fl_reduce_into(x->acc + x->done * x->es, x->in + x->done * x->es, upto - x->done, x->t,
                   x->op);
    x->done = upto;
}

/* After the exchange of n elements: reduces whatever the callbacks did not (a transport may
 * report the tail only on return). */
static inline void fl_chunk_reduce_rest(fl_chunk_reduce *x, size_t n) {
    if (x->done < n)
        fl_chunk_reduce_on_recv(x, 0, n * x->es);
}

/* --- ring.c: Patarasuk & Yuan 2009 --- */
/* buf (count) becomes op over all ranks: ring reduce-scatter, then ring allgather, in passes of
 * at most seg_max_bytes per segment. */
int fl_ring_allreduce(fl_peers *p, fl_scratch *s, size_t seg_max_bytes, void *buf, size_t count,
                      fl_dtype t, fl_redop op);
/* The two halves of one ring allreduce pass, in place: buf (count) is cut into size segments
 * (fl_ring_segment); after the reduce-scatter rank r's segment fl_ring_owned(r) holds op over
 * all ranks (not finalised: avg is still the sum); the allgather then copies every rank's
 * owned segment to all. Used by the hierarchical allreduce (hier.c). */
int fl_ring_reduce_scatter_inplace(fl_peers *p, fl_scratch *s, void *buf, size_t count,
                                   fl_dtype t, fl_redop op);
int fl_ring_allgather_inplace(fl_peers *p, void *buf, size_t count, size_t es);
/* Which segment rank r of n holds after fl_ring_reduce_scatter_inplace (r + 1 mod n), and
 * where segment i of a buffer of count elements lies: [*off, *off + *len). One pass, no
 * segment limit: callers bound memory by cutting the buffer (fl_ring_passes). */
int    fl_ring_owned(int r, int n);
void   fl_ring_segment(size_t count, int n, int i, size_t *off, size_t *len);
/* How many passes fl_ring_allreduce makes for count elements (segments <= seg_max_bytes). */
size_t fl_ring_passes(size_t count, int n, size_t es, size_t seg_max_bytes);
/* in (size * count), out (count) = op over ranks of block rank of in; out must not overlap in. */
int fl_ring_reduce_scatter(fl_peers *p, fl_scratch *s, size_t seg_max_bytes, const void *in,
                           void *out, size_t count, fl_dtype t, fl_redop op);
/* in (counts[rank] * es bytes) of every rank concatenated in rank order into out; counts NULL
 * means every rank contributes `count` elements. in may be out's own slot (in place). */
int fl_ring_allgatherv(fl_peers *p, const void *in, void *out, const size_t *counts,
                       size_t count, size_t es);

/* --- rd.c: Thakur, Rabenseifner & Gropp 2005 --- */
/* buf (count) becomes op over all ranks in ceil(log2 size) (+2 for non-powers of two) steps. */
int fl_rd_allreduce(fl_peers *p, fl_scratch *s, void *buf, size_t count, fl_dtype t,
                    fl_redop op);
/* Dissemination barrier: ceil(log2 size) rounds of one byte. */
int fl_rd_barrier(fl_peers *p);
/* The fold of a rank count that is not a power of two (Thakur et al. sec. 4.4), shared by
 * recursive doubling and Rabenseifner's: of the first 2 extra ranks (extra = size - p2, p2 the
 * largest power of two <= size) each even one hands its buffer to the odd one above it, which
 * combines (r-1) op r, and sits out; the other p2 ranks work as virtual ranks 0 .. p2-1. */
typedef struct {
    int p2, extra;
    int vrank; /* this rank's virtual rank; -1 when it sat out */
} fl_rd_fold;
/* Folds *cur (count elements): a rank that stays and received its partner's buffer combines
 * into *other and swaps the two pointers, so *cur holds its running value. */
int fl_rd_fold_in(fl_peers *p, fl_rd_fold *f, char **cur, char **other, size_t count,
                  fl_dtype t, fl_redop op);
/* Unfolds: a rank that sat out receives the result (buf, bytes) from its odd partner, which
 * sends it. */
int fl_rd_fold_out(fl_peers *p, const fl_rd_fold *f, void *buf, size_t bytes);
/* The rank behind virtual rank v (increasing in v: ranks and virtual ranks compare alike). */
static inline int fl_rd_fold_rank(const fl_rd_fold *f, int v) {
    return v < f->extra ? 2 * v + 1 : v + f->extra;
}

/* --- rh.c: Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005 --- */
/* buf (count) becomes op over all ranks: recursive-halving reduce-scatter, then
 * recursive-doubling allgather, 2 log2 p2 steps (p2: the largest power of two <= size; +2
 * when size is not one, folded as in rd.c) that send about 2 (p2-1)/p2 of the buffer per rank.
 * Any count (blocks may be empty); scratch of count elements. */
int fl_rh_allreduce(fl_peers *p, fl_scratch *s, void *buf, size_t count, fl_dtype t,
                    fl_redop op);

/* --- alltoall.c: Thakur, Rabenseifner & Gropp 2005 --- */
/* Pairwise exchange: rank r's in block j (send_counts[j] elements) goes to rank j's out block r
 * (its recv_counts[r]); blocks in rank order. n - 1 full-duplex steps. */
int fl_pairwise_alltoallv(fl_peers *p, const void *in, const size_t *send_counts, void *out,
                          const size_t *recv_counts, size_t es);

/* --- bruck.c: Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005 --- */
/* fl_ring_allgatherv's contract (counts NULL: `count` each; in may be out's own slot; blocks
 * may be empty) in ceil(log2 size) rounds, each rank receiving every other block once (the
 * ring's bytes). Uses scratch of the gathered size (not on rank 0), plus one copy of it. */
int fl_bruck_allgatherv(fl_peers *p, fl_scratch *s, const void *in, void *out,
                        const size_t *counts, size_t count, size_t es);
/* Alltoall of fixed blocks: in's block j (block_bytes) goes to rank j's out block r; in and out
 * do not overlap. ceil(log2 size) rounds, forwarding blocks up to that many times (about
 * size/2 blocks sent per round): for small blocks. Scratch of size/2 * 2 blocks. */
int fl_bruck_alltoall(fl_peers *p, fl_scratch *s, const void *in, void *out,
                      size_t block_bytes);

/* --- bcast.c --- */
/* Binomial tree: ceil(log2 size) rounds of the whole buffer (small messages). */
int fl_bcast_tree(fl_peers *p, void *buf, size_t nbytes, int root);
/* Pipelined chain root -> root+1 -> ...: each rank receives and forwards chunk by chunk
 * (large messages: every link carries the buffer once). */
int fl_bcast_chain(fl_peers *p, void *buf, size_t nbytes, int root, size_t chunk);

/* --- hier.c: hierarchical allreduce --- */
typedef struct {
    size_t rd_max_bytes;  /* the cross-node allreduce of a segment: recursive doubling up to
                             this many bytes, else ring */
    size_t seg_max_bytes; /* ring segments (node and cross rings) of at most this many bytes */
} fl_hier_tuning;
/* buf (count) becomes op over all ranks: node (L ranks of this node) reduce-scatter, cross (this
 * local rank on each of M nodes) allreduce of the owned segment, node allgather. Every node has
 * the same L, and node / cross number the ranks consistently (node rank l of node j is cross
 * rank j of the group of local rank l). Bit-identical on every rank and repeatable; equal to
 * the flat allreduce up to rounding. */
int fl_hier_allreduce(fl_peers *node, fl_peers *cross, fl_scratch *s,
                      const fl_hier_tuning *tune, void *buf, size_t count, fl_dtype t,
                      fl_redop op);

#endif /* FLEET_ALGORITHMS_H */
