/* rd.c - latency-optimal collectives for small messages: recursive doubling allreduce (Thakur,
 * Rabenseifner & Gropp 2005, "Optimization of collective communication operations in MPICH",
 * sec. 4.4), and a dissemination barrier (Hensgen, Finkel & Manber 1988).
 *
 * Allreduce: ceil(log2 p) exchanges of the whole buffer with rank ^ 2^k. A rank count that is
 * not a power of two is folded first, as in the paper: of the first 2r ranks (r = p - 2^k),
 * each even one hands its buffer to the odd one above it and sits out, and gets the result
 * back at the end (fl_rd_fold_in / fl_rd_fold_out, which rh.c shares). Every combine computes (lower rank's value) op (higher rank's value) on
 * both sides of the pair, so the two agree bit for bit even where op is not commutative in
 * the last bit (NaN payloads), and the order depends only on the rank count. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

int fl_rd_fold_in(fl_peers *tp, fl_rd_fold *f, char **cur, char **other, size_t count,
                  fl_dtype t, fl_redop op) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    size_t bytes = count * fl_dtype_size(t);
    f->p2 = 1;
    while (f->p2 * 2 <= n)
        f->p2 *= 2;
    f->extra = n - f->p2; /* ranks 0 .. 2*extra-1 fold in pairs */
    if (r >= 2 * f->extra) {
        f->vrank = r - f->extra;
        return 0;
    }
    if (r % 2 == 0) {
        f->vrank = -1;
        return fl_peers_sendrecv(tp, r + 1, *cur, bytes, -1, NULL, 0, NULL, NULL);
    }
    FL_TRY(fl_peers_sendrecv(tp, -1, NULL, 0, r - 1, *other, bytes, NULL, NULL));
    fl_reduce_into(*other, *cur, count, t, op); /* (r-1) op r */
    char *tmp = *cur;
    *cur = *other;
    *other = tmp;
    f->vrank = r / 2;
    return 0;
}

int fl_rd_fold_out(fl_peers *tp, const fl_rd_fold *f, void *buf, size_t bytes) {
    int r = fl_peers_rank(tp);
    if (f->vrank < 0) /* the result, from the odd partner */
        return fl_peers_sendrecv(tp, -1, NULL, 0, r + 1, buf, bytes, NULL, NULL);
    if (r < 2 * f->extra) /* hand the result back to the even partner */
        return fl_peers_sendrecv(tp, r - 1, buf, bytes, -1, NULL, 0, NULL, NULL);
    return 0;
}

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
    fl_rd_fold f;
    FL_TRY(fl_rd_fold_in(tp, &f, &cur, &other, count, t, op));
    if (f.vrank >= 0) {
        for (int mask = 1; mask < f.p2; mask <<= 1) {
            int peer = fl_rd_fold_rank(&f, f.vrank ^ mask);
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
    }
    return fl_rd_fold_out(tp, &f, buf, bytes);
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
