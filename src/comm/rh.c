/* rh.c - Rabenseifner's allreduce for medium messages at many ranks (Rabenseifner 2004,
 * "Optimization of collective reduction operations", ICCS; Thakur, Rabenseifner & Gropp 2005,
 * "Optimization of collective communication operations in MPICH", sec. 4.4): a reduce-scatter
 * by recursive halving, then an allgather by recursive doubling. Each rank sends 2 (p-1)/p of
 * the buffer, as the ring does, but in 2 log2 p rounds instead of 2 (p-1).
 *
 * The buffer is cut into p2 blocks (p2: the largest power of two <= the rank count), as even as
 * possible; when count < p2 some are empty, which costs a few empty rounds and no special case.
 * A rank count that is not a power of two folds first exactly as rd.c does (the first 2r ranks
 * pair up, the even one hands its whole buffer to the odd one above it and gets the result back
 * at the end). Each partial sum is computed once, on one rank, as (lower rank's value) op
 * (higher rank's value), and each finished block is copied, never recomputed: every rank ends
 * with the same bits. The halving pairs ranks as recursive doubling does (distance 1 first), so
 * each element is combined in rd.c's order: the results are fl_rd_allreduce's, bit for bit, and
 * depend only on the rank count. Scratch: one buffer the size of buf, as rd.c. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

/* on_recv for the halving steps, as in ring.c: acc[i] = acc[i] op in[i] for the whole elements
 * of each completed chunk (chunks are in bytes and may split an element). acc is either this
 * rank's partial (it is the lower rank) or the received one (it is the higher). */
typedef struct {
    char       *acc;
    const char *in;
    size_t      es, done; /* element size, elements reduced so far */
    fl_dtype    t;
    fl_redop    op;
} reduce_ctx;

static void reduce_chunk(void *p, size_t off, size_t len) {
    reduce_ctx *x = p;
    size_t upto = (off + len) / x->es;
    if (upto <= x->done)
        return;
    fl_reduce_into(x->acc + x->done * x->es, x->in + x->done * x->es, upto - x->done, x->t,
                   x->op);
    x->done = upto;
}

/* First element of block i of p2 over count elements (the first count % p2 blocks get one
 * more); i = p2 gives count, so block i is [block_off(i), block_off(i + 1)). */
static size_t block_off(size_t count, int p2, int i) {
    size_t q = count / (size_t)p2, rem = count % (size_t)p2;
    return (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
}

/* The rank behind virtual rank v once the first 2 * extra ranks have folded in pairs (rd.c's
 * numbering: the odd rank of each pair stays). Increasing in v, so comparing ranks and
 * comparing virtual ranks agree. */
static int real_rank(int v, int extra) { return v < extra ? 2 * v + 1 : v + extra; }

int fl_rh_allreduce(fl_peers *tp, fl_scratch *s, void *buf, size_t count, fl_dtype t,
                    fl_redop op) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    size_t es = fl_dtype_size(t), bytes = count * es;
    if (n == 1 || count == 0) {
        fl_reduce_finalize(buf, count, t, op, n);
        return 0;
    }
    char *other = fl_scratch_get(s, bytes);
    if (!other)
        return FL_ENOMEM;
    char *cur = buf; /* holds this rank's partials: buf or scratch, in turn */

    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    int extra = n - p2; /* ranks 0 .. 2*extra-1 fold in pairs */
    int vrank;          /* rank among the p2 that halve and double; -1 if folded away */
    if (r < 2 * extra) {
        if (r % 2 == 0) {
            FL_TRY(fl_peers_sendrecv(tp, r + 1, cur, bytes, -1, NULL, 0, NULL, NULL));
            vrank = -1;
        } else {
            FL_TRY(fl_peers_sendrecv(tp, -1, NULL, 0, r - 1, other, bytes, NULL, NULL));
            fl_reduce_into(other, cur, count, t, op); /* (r-1) op r */
            char *tmp = cur;
            cur = other;
            other = tmp;
            vrank = r / 2;
        }
    } else {
        vrank = r - extra;
    }
    if (vrank < 0) /* the result, from the odd partner */
        return fl_peers_sendrecv(tp, -1, NULL, 0, r + 1, buf, bytes, NULL, NULL);

    /* Reduce-scatter by recursive halving of the vector, doubling the distance (as MPICH
     * does): before the step with mask m this rank and its peer (vrank ^ m) hold partials of
     * the same 2h blocks [lo, lo + 2h); each keeps one half (the upper one if its bit m is
     * set), combining the peer's partial of it with its own, and sends the other. The peers
     * and the order of combination are recursive doubling's (rd.c), so every element comes
     * out with the same bits as fl_rd_allreduce's. The received partial lands in `other` at
     * its offset; the higher rank combines there (theirs op mine) and the two buffers swap,
     * which is safe because later steps touch only the kept half. This rank ends holding
     * block lo, vrank's bits reversed. */
    int lo = 0, h = p2;
    for (int mask = 1; mask < p2; mask <<= 1) {
        int peer = real_rank(vrank ^ mask, extra);
        h /= 2;
        int keep = vrank & mask ? lo + h : lo, give = vrank & mask ? lo : lo + h;
        size_t koff = block_off(count, p2, keep), klen = block_off(count, p2, keep + h) - koff;
        size_t goff = block_off(count, p2, give), glen = block_off(count, p2, give + h) - goff;
        reduce_ctx x = {cur + koff * es, other + koff * es, es, 0, t, op}; /* mine op theirs */
        if (r > peer)
            x = (reduce_ctx){other + koff * es, cur + koff * es, es, 0, t, op}; /* theirs op mine */
        FL_TRY(fl_peers_sendrecv(tp, peer, cur + goff * es, glen * es, peer, other + koff * es,
                                 klen * es, reduce_chunk, &x));
        if (x.done < klen) /* a transport may report the tail only on return */
            reduce_chunk(&x, 0, klen * es);
        if (r > peer) {
            char *tmp = cur;
            cur = other;
            other = tmp;
        }
        lo = keep;
    }

    /* this rank's block is final: finish it (avg divides) and put it in buf */
    size_t moff = block_off(count, p2, lo), mlen = block_off(count, p2, lo + 1) - moff;
    fl_reduce_finalize(cur + moff * es, mlen, t, op, n);
    if (cur != (char *)buf && mlen)
        memcpy((char *)buf + moff * es, cur + moff * es, mlen * es);

    /* Allgather by recursive doubling, in buf, undoing the halving steps in reverse: before
     * the step with mask m this rank holds the h final blocks [lo, lo + h), its peer the h
     * beside them (below if bit m of vrank is set); they swap them. */
    char *b = buf;
    for (int mask = p2 / 2; mask >= 1; mask >>= 1) {
        int peer = real_rank(vrank ^ mask, extra);
        int theirs = vrank & mask ? lo - h : lo + h;
        size_t soff = block_off(count, p2, lo), slen = block_off(count, p2, lo + h) - soff;
        size_t roff = block_off(count, p2, theirs);
        size_t rlen = block_off(count, p2, theirs + h) - roff;
        FL_TRY(fl_peers_sendrecv(tp, peer, b + soff * es, slen * es, peer, b + roff * es,
                                 rlen * es, NULL, NULL));
        if (vrank & mask)
            lo = theirs;
        h *= 2;
    }
    if (r < 2 * extra) /* unfold: hand the result back to the even partner */
        FL_TRY(fl_peers_sendrecv(tp, r - 1, buf, bytes, -1, NULL, 0, NULL, NULL));
    return 0;
}
