/* rd.c - latency-optimal collectives for small messages: recursive doubling allreduce (Thakur,
 * Rabenseifner & Gropp 2005, "Optimization of collective communication operations in MPICH",
 * sec. 4.4), and a dissemination barrier (Hensgen, Finkel & Manber 1988).
 *
 * Allreduce: ceil(log2 p) exchanges of the whole buffer with rank ^ 2^k. A rank count that is
 * not a power of two is folded first, as in the paper: of the first 2r ranks (r = p - 2^k),
 * each even one hands its buffer to the odd one above it and sits out, and gets the result
 * back at the end. Every combine computes (lower rank's value) op (higher rank's value) on
 * both sides of the pair, so the two agree bit for bit even where op is not commutative in
 * the last bit (NaN payloads), and the order depends only on the rank count. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

int fl_rd_allreduce(fl_peers *tp, fl_scratch *s, void *buf, size_t count, fl_dtype t,
                    fl_redop op) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    size_t bytes = count * fl_dtype_size(t);
    if (n == 1 || count == 0) {
        fl_reduce_finalize(buf, count, t, op, n);
        return 0;
    }
    char *other = fl_scratch_get(s, bytes);
    if (!other)
        return FL_ENOMEM;
    char *cur = buf; /* holds this rank's running value: buf or scratch, in turn */

    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    int extra = n - p2; /* ranks 0 .. 2*extra-1 fold in pairs */
    int vrank;          /* rank among the p2 that do the doubling; -1 if folded away */
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

    if (vrank >= 0) {
        for (int mask = 1; mask < p2; mask <<= 1) {
            int vpeer = vrank ^ mask;
            int peer = vpeer < extra ? vpeer * 2 + 1 : vpeer + extra;
            FL_TRY(fl_peers_sendrecv(tp, peer, cur, bytes, peer, other, bytes, NULL, NULL));
            if (r < peer) {
                fl_reduce_into(cur, other, count, t, op); /* mine op theirs */
            } else {
                fl_reduce_into(other, cur, count, t, op); /* theirs op mine */
                char *tmp = cur;
                cur = other;
                other = tmp;
            }
        }
        fl_reduce_finalize(cur, count, t, op, n);
        if (cur != (char *)buf)
            memcpy(buf, cur, bytes);
        if (r < 2 * extra) /* unfold: hand the result back to the even partner */
            FL_TRY(fl_peers_sendrecv(tp, r - 1, buf, bytes, -1, NULL, 0, NULL, NULL));
    } else {
        FL_TRY(fl_peers_sendrecv(tp, -1, NULL, 0, r + 1, buf, bytes, NULL, NULL));
    }
    return 0;
}

int fl_rd_barrier(fl_peers *tp) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    unsigned char out = 1, in = 0;
    for (int dist = 1; dist < n; dist *= 2) {
        int to = (r + dist) % n, from = (r - dist % n + n) % n;
        FL_TRY(fl_peers_sendrecv(tp, to, &out, 1, from, &in, 1, NULL, NULL));
    }
    return 0;
}
