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

/* First element of block i of p2 over count elements (the first count % p2 blocks get one
 * more); i = p2 gives count, so block i is [block_off(i), block_off(i + 1)). */
static size_t block_off(size_t count, int p2, int i) {
    size_t q = count / (size_t)p2, rem = count % (size_t)p2;
    return (size_t)i * q + ((size_t)i < rem ? (size_t)i : rem);
}

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

    fl_rd_fold f;
    FL_TRY(fl_rd_fold_in(tp, &f, &cur, &other, count, t, op));
    if (f.vrank < 0)
        return fl_rd_fold_out(tp, &f, buf, bytes);
    int p2 = f.p2, vrank = f.vrank;

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
        int peer = fl_rd_fold_rank(&f, vrank ^ mask);
        h /= 2;
        int keep = vrank & mask ? lo + h : lo, give = vrank & mask ? lo : lo + h;
        size_t koff = block_off(count, p2, keep), klen = block_off(count, p2, keep + h) - koff;
        size_t goff = block_off(count, p2, give), glen = block_off(count, p2, give + h) - goff;
        fl_chunk_reduce x = {cur + koff * es, other + koff * es, es, 0, t, op}; /* mine op theirs */
        if (r > peer) /* theirs op mine */
            x = (fl_chunk_reduce){other + koff * es, cur + koff * es, es, 0, t, op};
        FL_TRY(fl_peers_sendrecv(tp, peer, cur + goff * es, glen * es, peer, other + koff * es,
                                 klen * es, fl_chunk_reduce_on_recv, &x));
        fl_chunk_reduce_rest(&x, klen);
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
        int peer = fl_rd_fold_rank(&f, vrank ^ mask);
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
    return fl_rd_fold_out(tp, &f, buf, bytes);
}
