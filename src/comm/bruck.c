/* bruck.c - latency-optimal allgather(v) and alltoall for small messages: Bruck, Ho, Kipnis,
 * Upfal & Weathersby 1997, "Efficient algorithms for all-to-all communications in multiport
 * message-passing systems" (IEEE TPDS 8(11)), as MPICH runs them (Thakur, Rabenseifner & Gropp
 * 2005, "Optimization of collective communication operations in MPICH", sec. 4.1 and 4.6):
 * ceil(log2 n) rounds for any rank count, where the ring and pairwise exchange take n - 1.
 *
 * The allgather sends every block to every rank exactly once (the ring's bytes) and pays one
 * copy of the result for un-rotating; the alltoall forwards a block once per set bit of its
 * distance, about (n/2) log2 n blocks sent per rank where pairwise exchange sends n - 1, so it
 * is for small blocks, where the rounds cost more than the bytes. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

/* Bytes of rank i's block: counts[i] elements for allgatherv, count for allgather. */
static size_t block_len(const size_t *counts, size_t count, size_t es, int i) {
    return (counts ? counts[i] : count) * es;
}

int fl_bruck_allgatherv(fl_peers *p, fl_scratch *s, const void *in, void *out,
                        const size_t *counts, size_t count, size_t es) {
    int r = fl_peers_rank(p), n = fl_peers_size(p);
    char *o = out;
    size_t total = 0, mine_off = 0; /* the gathered bytes; this rank's block's offset in out */
    for (int i = 0; i < n; i++) {
        if (i == r)
            mine_off = total;
        total += block_len(counts, count, es, i);
    }
    if (total == 0) /* the same on every rank: nobody sends anything */
        return 0;
    /* Rotated layout: blocks r, r+1, ..., r+n-1 (mod n) back to back, this rank's first, so
     * that what a rank holds is always one prefix and what it receives lands right after it.
     * Rank 0's rotation is out's own order: it works in out. */
    char *rot = o;
    if (r != 0 && !(rot = fl_scratch_get(s, total)))
        return FL_ENOMEM;
    size_t held = block_len(counts, count, es, r); /* bytes of the blocks held */
    if (held && rot != (const char *)in)
        memcpy(rot, in, held);
    /* Round i: with have = 2^i blocks held, send min(have, n - have) of them (all but in the
     * last round) to rank r - have and receive as many from rank r + have, which are blocks
     * r + have ... of ours: each block arrives once. Lengths are summed over the blocks that
     * move, so a call costs O(n) besides the bytes. */
    for (int have = 1; have < n;) {
        int cnt = have < n - have ? have : n - have;
        int to = r - have < 0 ? r - have + n : r - have;
        int from = r + have >= n ? r + have - n : r + have;
        size_t slen = held, rlen = 0;
        if (cnt < have) { /* the last round sends only the first cnt blocks */
            slen = 0;
            for (int k = 0, b = r; k < cnt; k++, b = b + 1 == n ? 0 : b + 1)
                slen += block_len(counts, count, es, b);
        }
        for (int k = 0, b = from; k < cnt; k++, b = b + 1 == n ? 0 : b + 1)
            rlen += block_len(counts, count, es, b);
        FL_TRY(fl_peers_sendrecv(p, to, rot, slen, from, rot + held, rlen, NULL, NULL));
        held += rlen;
        have += cnt;
    }
    /* un-rotate: blocks r .. n-1 go to the end of out, blocks 0 .. r-1 to its start */
    if (rot != o) {
        memcpy(o + mine_off, rot, total - mine_off);
        memcpy(o, rot + (total - mine_off), mine_off);
    }
    return 0;
}

/* Where the paper's rotated position k lives: out's block r - k (mod n). Position k ends up
 * holding the block from rank r - k, so keeping it there from the start makes both of the
 * paper's local rotations (before and after the rounds) one placement of in's blocks. */
static size_t slot(int r, int k, int n) { return (size_t)(r - k < 0 ? r - k + n : r - k); }

int fl_bruck_alltoall(fl_peers *p, fl_scratch *s, const void *in, void *out,
                      size_t block_bytes) {
    int r = fl_peers_rank(p), n = fl_peers_size(p);
    size_t bb = block_bytes;
    const char *src = in;
    char *o = out;
    if (bb == 0)
        return 0;
    /* position k starts as in's block r + k: this rank's data for rank r + k */
    for (int k = 0, j = r; k < n; k++, j = j + 1 == n ? 0 : j + 1)
        memcpy(o + slot(r, k, n) * bb, src + (size_t)j * bb, bb);
    if (n == 1)
        return 0;
    /* at most n/2 positions have a given bit set: one send and one receive buffer of that */
    size_t half = (size_t)(n / 2) * bb;
    char *sbuf = fl_scratch_get(s, 2 * half);
    if (!sbuf)
        return FL_ENOMEM;
    char *rbuf = sbuf + half;
    /* Round i: the positions with bit i set go to rank r + 2^i, and the same positions come from
     * r - 2^i. After the rounds for bits 0 .. i-1, position k holds data from rank
     * r - (k mod 2^i) for rank r - (k mod 2^i) + k; after all, from rank r - k for r. */
    for (int bit = 1; bit < n; bit <<= 1) {
        int to = r + bit >= n ? r + bit - n : r + bit;
        int from = r - bit < 0 ? r - bit + n : r - bit;
        size_t m = 0;
        for (int k = bit; k < n; k++)
            if (k & bit)
                memcpy(sbuf + m++ * bb, o + slot(r, k, n) * bb, bb);
        FL_TRY(fl_peers_sendrecv(p, to, sbuf, m * bb, from, rbuf, m * bb, NULL, NULL));
        m = 0;
        for (int k = bit; k < n; k++)
            if (k & bit)
                memcpy(o + slot(r, k, n) * bb, rbuf + m++ * bb, bb);
    }
    return 0;
}
