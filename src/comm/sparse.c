/* sparse.c - a sparse allreduce whose traffic per rank does not grow with the number of ranks,
 * for Deep Gradient Compression's exchange (docs/dgc.md). Allgather, DGC's usual exchange,
 * hands every rank the k pairs of every other rank: k (N - 1) pairs received per rank. Here
 * (after SparCML's split allreduce, Renggli et al. SC 2019, and Ok-Topk's balanced index
 * space, Li & Hoefler PPoPP 2022):
 *   1. the index space is cut into N equal ranges; range j belongs to rank j; every rank sends
 *      each owner the pairs that fall in its range (alltoallv: k pairs sent in all);
 *   2. each owner sums what it received per index, in rank order (so every sum is the one a
 *      dense sum in rank order gives, bit for bit);
 *   3. when more distinct indices survive than the caller's budget, a global magnitude
 *      threshold is chosen with two allreduces of 256-bin histograms (the float's exponent,
 *      then the next 8 bits), and only sums above it are kept;
 *   4. the kept sums are allgathered: at most `max_keep` pairs received per rank.
 * A rank sends about k and receives about k + max_keep pairs, whatever N. Message rounds:
 * N - 1 for the pairs (pairwise exchange: each pair sent once), a few log2 N for the rest (the
 * counts by alltoall, the kept counts and sums by allgather: Bruck's on the tcp backend; the
 * histograms by recursive doubling). What is not kept is
 * reported per input pair (kept[i] = 0), so that the caller returns its own contribution to
 * its residual: nothing is lost, only delayed (as DGC's own unsent gradients are). */
#include "fleet/comm.h"
#include "fleet/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A received pair and the rank it came from (the order of summation). */
typedef struct {
    int32_t idx;
    int32_t from;
    float   val;
} triple;

static int cmp_triple(const void *a, const void *b) {
    const triple *x = a, *y = b;
    if (x->idx != y->idx)
        return x->idx < y->idx ? -1 : 1;
    return (x->from > y->from) - (x->from < y->from);
}

static uint32_t mag_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u & 0x7fffffffu;
}

/* First bin, scanning from the top, at which the running count would pass budget; bins above
 * it hold *above entries in all. 256 bins; -1 when everything fits. */
static int boundary(const int64_t *hist, int64_t budget, int64_t *above) {
    int64_t cum = 0;
    for (int b = 255; b >= 0; b--) {
        if (cum + hist[b] > budget) {
            *above = cum;
            return b;
        }
        cum += hist[b];
    }
    *above = cum;
    return -1;
}

/* Step 3 of fl_comm_sparse_allreduce: with U distinct summed pairs in tr here, keeps the
 * pairs above a threshold common to every rank so that at most max_keep are kept over all
 * ranks, moving them to the front of tr in order; *K gets how many. The count of distinct
 * indices travels with the exponent histogram (one allreduce, not two: the histogram is cheap
 * to make and 2 KiB to send, a message round is not); the threshold's mantissa bits take a
 * second histogram only when the budget binds. 0 or the failed collective's status. */
static int keep_within_budget(fl_comm *c, triple *tr, int64_t U, int64_t max_keep, int64_t *K) {
    int64_t h1[257] = {0}, hist[256] = {0}, above = 0;
    int rc;
    h1[256] = U;
    for (int64_t i = 0; i < U; i++)
        h1[mag_bits(tr[i].val) >> 23]++;
    if ((rc = fl_comm_allreduce(c, h1, 257, FL_DTYPE_I64, FL_REDOP_SUM)) < 0)
        return rc;
    int b1 = -1, b2 = -1;
    if (h1[256] > max_keep) {
        b1 = boundary(h1, max_keep, &above);
        for (int64_t i = 0; i < U; i++)
            if ((int)(mag_bits(tr[i].val) >> 23) == b1)
                hist[(mag_bits(tr[i].val) >> 15) & 0xff]++;
        if ((rc = fl_comm_allreduce(c, hist, 256, FL_DTYPE_I64, FL_REDOP_SUM)) < 0)
            return rc;
        int64_t above2 = 0;
        b2 = boundary(hist, max_keep - above, &above2);
    }
    int64_t k = 0;
    for (int64_t i = 0; i < U; i++) {
        uint32_t mb = mag_bits(tr[i].val);
        int e = (int)(mb >> 23), f = (int)((mb >> 15) & 0xff);
        if (b1 < 0 || e > b1 || (e == b1 && f > b2))
            tr[k++] = tr[i];
    }
    *K = k;
    return 0;
}

int fl_comm_sparse_allreduce(fl_comm *c, int64_t n, const int32_t *idx, const float *val,
                             int64_t m, int64_t max_keep, int32_t *out_idx, float *out_val,
                             int64_t *out_count, uint8_t *kept) {
    int size = fl_comm_size(c);
    *out_count = 0;
    if (n < 0 || n > INT32_MAX || m < 0 || m > n || max_keep < 0)
        return fl_fail(FL_EINVAL, "sparse allreduce: tensor of %lld, %lld pairs, budget %lld: "
                       "out of range", (long long)n, (long long)m, (long long)max_keep);
    for (int64_t i = 0; i < m; i++)
        if (idx[i] < 0 || idx[i] >= n || (i > 0 && idx[i] <= idx[i - 1]))
            return fl_fail(FL_EINVAL, "sparse allreduce: pair %lld: index %d is %s", (long long)i,
                           idx[i], idx[i] < 0 || idx[i] >= n ? "outside the tensor"
                                                             : "not above the one before");
    int rc = 0;
    size_t N = (size_t)size;
    int64_t *cnt = calloc(3 * N, sizeof *cnt); /* pairs sent to, received from, kept by q */
    size_t *sc = malloc(3 * N * sizeof *sc), *rcn = sc + N, *kc = sc + 2 * N;
    int32_t *sbuf = malloc((size_t)(2 * m + 1) * sizeof *sbuf);
    int32_t *rbuf = NULL, *gbuf = NULL;
    triple *tr = NULL;
    if (!cnt || !sc || !sbuf) {
        rc = fl_fail(FL_ENOMEM, "sparse allreduce: out of memory");
        goto done;
    }
    /* 1. pairs to the owners of their ranges: owner j has [n j / N, n (j + 1) / N) */
    for (int64_t i = 0, j = 0; i < m; i++) {
        while (idx[i] >= n * (j + 1) / size)
            j++;
        cnt[j]++;
        sbuf[2 * i] = idx[i];
        memcpy(&sbuf[2 * i + 1], &val[i], 4);
    }
    if ((rc = fl_comm_alltoall(c, cnt, cnt + N, 1, FL_DTYPE_I64)) < 0) /* the counts first */
        goto done;
    int64_t R = 0;
    for (size_t j = 0; j < N; j++) {
        sc[j] = (size_t)cnt[j] * 2;
        rcn[j] = (size_t)cnt[N + j] * 2;
        R += cnt[N + j];
    }
    rbuf = malloc((size_t)(2 * R + 1) * sizeof *rbuf);
    tr = malloc((size_t)(R + 1) * sizeof *tr);
    if (!rbuf || !tr) {
        rc = fl_fail(FL_ENOMEM, "sparse allreduce: out of memory for %lld pairs", (long long)R);
        goto done;
    }
    if ((rc = fl_comm_alltoallv(c, sbuf, sc, rbuf, rcn, FL_DTYPE_I32)) < 0)
        goto done;
    /* 2. sums per index, in rank order */
    for (int64_t i = 0, q = 0, left = 0; i < R; i++) {
        while (left == 0)
            left = cnt[N + q++];
        tr[i].idx = rbuf[2 * i];
        tr[i].from = (int32_t)(q - 1);
        memcpy(&tr[i].val, &rbuf[2 * i + 1], 4);
        left--;
    }
    qsort(tr, (size_t)R, sizeof *tr, cmp_triple);
    int64_t U = 0; /* distinct indices, summed into tr[0 .. U) */
    for (int64_t i = 0; i < R; i++) {
        if (U > 0 && tr[U - 1].idx == tr[i].idx)
            tr[U - 1].val += tr[i].val;
        else
            tr[U++] = tr[i];
    }
    /* 3. the budget: a global threshold when the distinct indices exceed it */
    int64_t K = 0; /* kept here, moved to the front of tr */
    if ((rc = keep_within_budget(c, tr, U, max_keep, &K)) < 0)
        goto done;
    /* 4. the kept sums to every rank, in range (= index) order */
    int64_t kk = K;
    if ((rc = fl_comm_allgather(c, &kk, cnt + 2 * N, 1, FL_DTYPE_I64)) < 0)
        goto done;
    /* cnt[2N + q] is rank q's kept count */
    int64_t G = 0;
    for (size_t q = 0; q < N; q++) {
        kc[q] = (size_t)cnt[2 * N + q] * 2;
        G += cnt[2 * N + q];
    }
    if (G > max_keep) {
        rc = fl_fail(FL_ESTATE, "sparse allreduce: %lld pairs kept over the budget of %lld",
                     (long long)G, (long long)max_keep);
        goto done;
    }
    gbuf = malloc((size_t)(2 * G + 1) * sizeof *gbuf);
    if (!gbuf) {
        rc = fl_fail(FL_ENOMEM, "sparse allreduce: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < K; i++) { /* packed in place of the received pairs */
        rbuf[2 * i] = tr[i].idx;
        memcpy(&rbuf[2 * i + 1], &tr[i].val, 4);
    }
    if ((rc = fl_comm_allgatherv(c, rbuf, gbuf, kc, FL_DTYPE_I32)) < 0)
        goto done;
    for (int64_t i = 0; i < G; i++) {
        out_idx[i] = gbuf[2 * i];
        memcpy(&out_val[i], &gbuf[2 * i + 1], 4);
    }
    *out_count = G;
    /* which of this rank's pairs made it (both lists ascending) */
    for (int64_t i = 0, g = 0; i < m; i++) {
        while (g < G && out_idx[g] < idx[i])
            g++;
        kept[i] = g < G && out_idx[g] == idx[i];
    }
done:
    free(cnt);
    free(sc);
    free(sbuf);
    free(rbuf);
    free(gbuf);
    free(tr);
    return rc;
}
