/* dgc_math.c - Deep Gradient Compression's scalar arithmetic (Lin et al. 2018, arXiv:1712.01887):
 * the warm-up schedule, k, which exchange a step uses and whether it pays, local clipping's
 * threshold, the check of received pairs and the sparse exchange's return of dropped pairs.
 * The array kernels (accumulation, selection, encoding, the updates) are the backend's
 * (fl_backend.dgc_*; the CPU ones in src/kernels/cpu/dgc.c). */
#include "dgc_math.h"

#include <math.h>
#include <string.h>

double dgc_sparsity_at(int64_t step, int64_t begin, int64_t rampup_step, const double *sparsity,
                       int n, bool warmup) {
    if (step < begin)
        return -1;
    if (!warmup || n == 1)
        return sparsity[n - 1];
    int64_t i = (step - begin) * n / (rampup_step > 0 ? rampup_step : 1);
    return sparsity[i < n - 1 ? i : n - 1];
}

int64_t dgc_k(int64_t numel, double s) {
    if (numel <= 0)
        return 0;
    double x = (double)numel * (1.0 - s);
    int64_t k = (int64_t)ceil(x - x * 1e-9);
    return k < 0 ? 0 : k > numel ? numel : k;
}

/* Rounds of an allgather of `bytes` in all on the tcp backend over sockets: Bruck's up to its
 * switch point (fl_tcp_gather_bruck), else the ring. */
static double gather_rounds(double n, double bytes) {
    double lg = ceil(log2(n)), saved = n - 1 - lg;
    bool bruck = bytes <= DGC_COST_BRUCK_MAX_BYTES ||
                 (saved > 0 && bytes <= saved * DGC_COST_BRUCK_ROUND_BYTES);
    return bruck ? lg : n - 1;
}

double dgc_exchange_seconds(dgc_exchange e, int world, int64_t k, int budget) {
    double n = world, bytes = 8.0 * (double)k;
    if (world <= 1)
        return 0;
    if (e == DGC_EXCHANGE_SPARSE) {
        /* message rounds on the tcp backend (docs/dgc.md): the pairs' alltoallv, pairwise, n - 1;
         * Bruck's alltoall of the counts and allgather of the kept counts, ceil(log2 n) each;
         * the allgatherv of the kept sums (up to BUDGET k pairs); two histogram allreduces by
         * recursive doubling, which folds a rank count that is not a power of two (2 more) */
        int f = (int)floor(log2(n));
        double rd = (1 << f) == world ? f : f + 2;
        double rounds = (n - 1) + 2 * ceil(log2(n)) + gather_rounds(n, bytes * budget) +
                        2 * rd;
        return rounds * DGC_COST_ALPHA_S + bytes * (1 + budget) * (n - 1) / n *
                                               DGC_COST_BYTE_S;
    }
    return gather_rounds(n, bytes * n) * DGC_COST_ALPHA_S + (n - 1) * bytes * DGC_COST_BYTE_S;
}

static bool pays(dgc_exchange e, int world, double s, int budget) {
    if (e == DGC_EXCHANGE_SPARSE && world > 1)
        return (1.0 + budget) * (1.0 - s) * 2.0 < 1.0;
    return (double)world * (1.0 - s) * 2.0 < 1.0;
}

bool dgc_sparse_pays(int world, double s, dgc_exchange mode, int budget) {
    if (mode != DGC_EXCHANGE_AUTO)
        return pays(mode, world, s, budget);
    return pays(DGC_EXCHANGE_ALLGATHER, world, s, budget) ||
           pays(DGC_EXCHANGE_SPARSE, world, s, budget);
}

dgc_exchange dgc_choose_exchange(dgc_exchange mode, int world, int64_t k, double s,
                                 int budget) {
    if (world <= 1)
        return DGC_EXCHANGE_ALLGATHER;
    if (mode != DGC_EXCHANGE_AUTO)
        return mode;
    bool ag = pays(DGC_EXCHANGE_ALLGATHER, world, s, budget),
         sp = pays(DGC_EXCHANGE_SPARSE, world, s, budget);
    if (ag != sp)
        return sp ? DGC_EXCHANGE_SPARSE : DGC_EXCHANGE_ALLGATHER;
    return dgc_exchange_seconds(DGC_EXCHANGE_SPARSE, world, k, budget) <
                   dgc_exchange_seconds(DGC_EXCHANGE_ALLGATHER, world, k, budget)
               ? DGC_EXCHANGE_SPARSE
               : DGC_EXCHANGE_ALLGATHER;
}

void dgc_settle_split(int64_t m, const int32_t *idx, const float *val, const uint8_t *kept,
                      bool mask, int32_t *masked, int64_t *nmasked, dgc_pair *back,
                      int64_t *nback) {
    int64_t nm = 0, nb = 0;
    for (int64_t i = 0; i < m; i++) {
        if (!kept[i])
            back[nb++] = (dgc_pair){.index = idx[i], .value = val[i]};
        else if (mask)
            masked[nm++] = idx[i];
    }
    *nmasked = nm;
    *nback = nb;
}

double dgc_local_clip_norm(double clip_norm, int world) {
    return clip_norm / sqrt((double)world);
}

int64_t dgc_check_pairs(const dgc_pair *pairs, int64_t n, int64_t space) {
    for (int64_t j = 0; j < n; j++)
        if (pairs[j].index < 0 || pairs[j].index >= space)
            return j;
    return -1;
}
