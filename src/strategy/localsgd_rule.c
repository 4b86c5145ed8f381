/* localsgd_rule.c - when Local SGD synchronises and the interval adaptive communication picks
 * (see localsgd_rule.h): Paddle's LocalSGDOptimizer and AdaptiveLocalSGDOptimizer, step by
 * step. */
#include "localsgd_rule.h"

#include <math.h>

bool fl_localsgd_rule_due(int64_t step, int64_t begin_step, int64_t last_sync, int64_t k) {
    if (step <= begin_step)
        return true;
    return step - last_sync >= k; /* >: the due step was skipped (strategy.amp) */
}

double fl_localsgd_rule_lr0(double lr0, double lr) {
    return lr > lr0 ? lr : lr0; /* a NaN lr compares false: lr0 stays */
}

int64_t fl_localsgd_rule_next_k(double lr0, double loss0, double lr, double loss,
                                int64_t init_k) {
    double x = lr0 * loss / (lr * loss0) * (double)init_k;
    /* ceil(sqrt(x)) <= 1 for x <= 1; >= 16 exactly for x > 225 (also +inf); NaN fails both
     * tests below and gives 1 */
    if (!(x > 1))
        return 1;
    if (x > (double)(FL_LOCALSGD_MAX_K - 1) * (FL_LOCALSGD_MAX_K - 1))
        return FL_LOCALSGD_MAX_K;
    return (int64_t)ceil(sqrt(x));
}

int64_t fl_localsgd_rule_next_k_adacomm(double lr0, double loss0, double lr, double loss,
                                        int64_t init_k) {
    double x = sqrt(lr0 * loss / (lr * loss0)) * (double)init_k;
    if (!(x > 1)) /* NaN too */
        return 1;
    if (x > (double)(FL_LOCALSGD_MAX_K - 1))
        return FL_LOCALSGD_MAX_K;
    return (int64_t)ceil(x);
}
