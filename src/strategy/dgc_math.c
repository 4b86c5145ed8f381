/* dgc_math.c - Deep Gradient Compression's scalar arithmetic (Lin et al. 2018, arXiv:1712.01887):
 * the warm-up schedule, k, when sparse pays, local clipping's threshold, and the check of
 * received pairs. The array kernels (accumulation, selection, encoding, the updates) are the
 * backend's (fl_backend.dgc_*; the CPU ones in src/kernels/cpu/dgc.c). */
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

bool dgc_sparse_pays(int world, double s) {
    return (double)world * (1.0 - s) * 2.0 < 1.0;
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
