/* ring.c - bandwidth-optimal ring collectives (Patarasuk & Yuan 2009, "Bandwidth optimal
 * all-reduce algorithms for clusters of workstations"): reduce-scatter then allgather around
 * the ring, each step sending to the right while receiving from the left (full duplex), each
 * received chunk reduced as it lands (pipelined), straight from scratch into the user's buffer.
 *
 * Every rank sends 2(n-1)/n of the buffer. Segment boundaries, and so the order in which a
 * segment's n contributions are combined, depend only on (rank count, count): results are
 * repeatable, and the allgather hands out one final value per segment, so all ranks agree bit
 * for bit. Buffers larger than n * seg_max_bytes go round in several passes, which bounds the
 * scratch buffer to one segment. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

static int right_of(int r, int n) { return r + 1 == n ? 0 : r + 1; }
static int left_of(int r, int n) { return r == 0 ? n - 1 : r - 1; }
static int wrap(long i, int n) { return (int)(((i % n) + n) % n); }

/* Segment i of m elements split as evenly as possible over n (the first m % n get one more). */
static size_t seg_len(size_t m, int n, int i) {
    return m / (size_t)n + ((size_t)i < m % (size_t)n ? 1 : 0);
}
static size_t seg_off(size_t m, int n, int i) {
    size_t extra = m % (size_t)n;
    return (size_t)i * (m / (size_t)n) + ((size_t)i < extra ? (size_t)i : extra);
}

/* Passes of at most seg_max_bytes per segment: the number of passes, then the (balanced)
 * length of each. */
static size_t pass_count(size_t count, int n, size_t es, size_t seg_max_bytes) {
    size_t seg_elems = seg_max_bytes / es;
    if (seg_elems == 0)
        seg_elems = 1;
    size_t per_pass = seg_elems * (size_t)n;
    return count == 0 ? 1 : (count + per_pass - 1) / per_pass;
}

int fl_ring_owned(int r, int n) { return right_of(r, n); }

void fl_ring_segment(size_t count, int n, int i, size_t *off, size_t *len) {
    *off = seg_off(count, n, i);
    *len = seg_len(count, n, i);
}

/* Reduce-scatter half of one pass over m elements at b: at step s send segment r-s, receive
 * and reduce segment r-s-1; after n-1 steps rank r holds segment r+1 complete (combined in
 * the order r+2, r+3, ..., r+1), not finalised. scratch holds one segment. */
static int reduce_scatter_half(fl_peers *p, char *b, size_t m, fl_dtype t, fl_redop op,
                               size_t es, char *scratch) {
    int r = fl_peers_rank(p), n = fl_peers_size(p);
    int right = right_of(r, n), left = left_of(r, n);
    for (int s = 0; s < n - 1; s++) {
        int si = wrap((long)r - s, n), ri = wrap((long)r - s - 1, n);
        size_t rl = seg_len(m, n, ri);
        fl_chunk_reduce x = {b + seg_off(m, n, ri) * es, scratch, es, 0, t, op};
        FL_TRY(fl_peers_sendrecv(p, right, b + seg_off(m, n, si) * es, seg_len(m, n, si) * es,
                                 left, scratch, rl * es, fl_chunk_reduce_on_recv, &x));
        fl_chunk_reduce_rest(&x, rl);
    }
    return 0;
}

/* Allgather half: at step s send segment r+1-s (final), receive segment r-s in place. */
static int allgather_half(fl_peers *p, char *b, size_t m, size_t es) {
    int r = fl_peers_rank(p), n = fl_peers_size(p);
    int right = right_of(r, n), left = left_of(r, n);
    for (int s = 0; s < n - 1; s++) {
        int si = wrap((long)r + 1 - s, n), ri = wrap((long)r - s, n);
        FL_TRY(fl_peers_sendrecv(p, right, b + seg_off(m, n, si) * es, seg_len(m, n, si) * es,
                                 left, b + seg_off(m, n, ri) * es, seg_len(m, n, ri) * es, NULL,
                                 NULL));
    }
    return 0;
}

int fl_ring_reduce_scatter_inplace(fl_peers *p, fl_scratch *s, void *buf, size_t count,
                                   fl_dtype t, fl_redop op) {
    int n = fl_peers_size(p);
    size_t es = fl_dtype_size(t);
    if (n == 1 || count == 0)
        return 0;
    char *scratch = fl_scratch_get(s, seg_len(count, n, 0) * es);
    if (!scratch)
        return FL_ENOMEM;
    return reduce_scatter_half(p, buf, count, t, op, es, scratch);
}

int fl_ring_allgather_inplace(fl_peers *p, void *buf, size_t count, size_t es) {
    if (fl_peers_size(p) == 1 || count == 0)
        return 0;
    return allgather_half(p, buf, count, es);
}

/* One pass of ring allreduce over m elements at b. */
static int allreduce_pass(fl_peers *p, char *b, size_t m, fl_dtype t, fl_redop op, size_t es,
                          char *scratch) {
    int r = fl_peers_rank(p), n = fl_peers_size(p);
    FL_TRY(reduce_scatter_half(p, b, m, t, op, es, scratch));
    int own = right_of(r, n);
    fl_reduce_finalize(b + seg_off(m, n, own) * es, seg_len(m, n, own), t, op, n);
    return allgather_half(p, b, m, es);
}

size_t fl_ring_passes(size_t count, int n, size_t es, size_t seg_max_bytes) {
    return pass_count(count, n, es, seg_max_bytes);
}

int fl_ring_allreduce(fl_peers *tp, fl_scratch *s, size_t seg_max_bytes, void *buf,
                      size_t count, fl_dtype t, fl_redop op) {
    int n = fl_peers_size(tp);
    size_t es = fl_dtype_size(t);
    if (n == 1 || count == 0) {
        fl_reduce_finalize(buf, count, t, op, n);
        return 0;
    }
    size_t passes = pass_count(count, n, es, seg_max_bytes);
    size_t biggest = count / passes + (count % passes ? 1 : 0);
    char *scratch = fl_scratch_get(s, seg_len(biggest, n, 0) * es);
    if (!scratch)
        return FL_ENOMEM;
    char *b = buf;
    for (size_t p = 0; p < passes; p++) {
        size_t m = count / passes + (p < count % passes ? 1 : 0);
        FL_TRY(allreduce_pass(tp, b, m, t, op, es, scratch));
        b += m * es;
    }
    return 0;
}

/* One pass of ring reduce-scatter over elements [lo, lo + m) of every block. Partial sums
 * travel in two buffers used in turn, scratch and out, arranged so that the last step lands
 * in out: at step s rank r receives block r-s-2's partial from the left, adds its own
 * contribution, and at step s+1 sends it on. Block b is combined in the order b+1, b+2, ..., b. */
static int reduce_scatter_pass(fl_peers *tp, const char *in, char *out, size_t count,
                               size_t lo, size_t m, fl_dtype t, fl_redop op, size_t es,
                               char *scratch) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    int right = right_of(r, n), left = left_of(r, n);
    size_t bytes = m * es, stride = count * es;
    const char *mine = in + lo * es; /* block 0's slice; block i at mine + i * stride */
    const char *send = mine + (size_t)wrap((long)r - 1, n) * stride;
    for (int s = 0; s < n - 1; s++) {
        char *recv = (n - 2 - s) % 2 == 0 ? out + lo * es : scratch;
        int ri = wrap((long)r - s - 2, n);
        fl_chunk_reduce x = {recv, mine + (size_t)ri * stride, es, 0, t, op};
        FL_TRY(fl_peers_sendrecv(tp, right, send, bytes, left, recv, bytes,
                                 fl_chunk_reduce_on_recv, &x));
        fl_chunk_reduce_rest(&x, m);
        send = recv;
    }
    fl_reduce_finalize(out + lo * es, m, t, op, n);
    return 0;
}

int fl_ring_reduce_scatter(fl_peers *tp, fl_scratch *s, size_t seg_max_bytes,
                           const void *in, void *out, size_t count, fl_dtype t, fl_redop op) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    size_t es = fl_dtype_size(t);
    if (count == 0)
        return 0;
    if (n == 1) {
        memcpy(out, (const char *)in + (size_t)r * count * es, count * es);
        return 0;
    }
    size_t seg_elems = seg_max_bytes / es ? seg_max_bytes / es : 1;
    size_t passes = (count + seg_elems - 1) / seg_elems;
    size_t biggest = count / passes + (count % passes ? 1 : 0);
    char *scratch = NULL;
    if (n > 2) { /* with two ranks the single step receives straight into out */
        scratch = fl_scratch_get(s, biggest * es);
        if (!scratch)
            return FL_ENOMEM;
    }
    size_t lo = 0;
    for (size_t p = 0; p < passes; p++) {
        size_t m = count / passes + (p < count % passes ? 1 : 0);
        FL_TRY(reduce_scatter_pass(tp, in, out, count, lo, m, t, op, es, scratch));
        lo += m;
    }
    return 0;
}

/* Bytes of rank i's block: counts[i] elements for allgatherv, count for allgather. */
static size_t block_len(const size_t *counts, size_t count, size_t es, int i) {
    return (counts ? counts[i] : count) * es;
}

int fl_ring_allgatherv(fl_peers *tp, const void *in, void *out, const size_t *counts,
                       size_t count, size_t es) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    int right = right_of(r, n), left = left_of(r, n);
    char *o = out;
    size_t mine_off = 0, mine_len = block_len(counts, count, es, r);
    for (int i = 0; i < r; i++)
        mine_off += block_len(counts, count, es, i);
    if (mine_len != 0 && o + mine_off != (const char *)in)
        memcpy(o + mine_off, in, mine_len);
    /* at step s send block r-s (ours, then what arrived last step), receive block r-s-1;
     * offsets are walked down the ring, so allgatherv stays O(n) per call */
    size_t send_off = mine_off, send_len = mine_len;
    for (int s = 0; s < n - 1; s++) {
        int ri = wrap((long)r - s - 1, n);
        size_t recv_len = block_len(counts, count, es, ri), recv_off;
        if (ri == n - 1) { /* wrapping round: block n-1 ends the buffer */
            recv_off = 0;
            for (int i = 0; i < n - 1; i++)
                recv_off += block_len(counts, count, es, i);
        } else { /* block ri ends where the block just sent begins */
            recv_off = send_off - recv_len;
        }
        FL_TRY(fl_peers_sendrecv(tp, right, o + send_off, send_len, left, o + recv_off,
                                     recv_len, NULL, NULL));
        send_off = recv_off;
        send_len = recv_len;
    }
    return 0;
}
