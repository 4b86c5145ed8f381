/* zipf.c - rejection-inversion sampling of a Zipf law (Hörmann and Derflinger 1996): invert
 * the integral H of the hat function x^-s over [k - 1/2, k + 1/2] cells, accept k when the
 * point falls under the cell's true mass k^-s. Expected draws per sample are close to 1. */
#include "zipf.h"

#include "fleet/status.h"

#include <math.h>

/* log1p(y) / y and expm1(y) / y, with their series near 0 (both -> 1) */
static double log1p_over(double y) {
    return fabs(y) > 1e-8 ? log1p(y) / y : 1.0 - y * (0.5 - y * (1.0 / 3.0 - 0.25 * y));
}
static double expm1_over(double y) {
    return fabs(y) > 1e-8 ? expm1(y) / y : 1.0 + y * 0.5 * (1.0 + y * (1.0 / 3.0) * (1.0 + 0.25 * y));
}

/* h(x) = x^-s; H(x) = (x^(1-s) - 1) / (1 - s) (log x at s = 1), an antiderivative of h;
 * H_inv its inverse. */
static double h(const fl_zipf *z, double x) {
    return exp(-z->s * log(x));
}
static double H(const fl_zipf *z, double x) {
    double lx = log(x);
    return expm1_over((1.0 - z->s) * lx) * lx;
}
static double H_inv(const fl_zipf *z, double u) {
    return exp(log1p_over((1.0 - z->s) * u) * u);
}

int fl_zipf_init(fl_zipf *z, int64_t n, double s) {
    if (n < 1 || !(s > 0) || !isfinite(s))
        return fl_fail(FL_EINVAL, "zipf: want n >= 1 and a finite exponent > 0, got n %lld, "
                       "s %g", (long long)n, s);
    z->n = n;
    z->s = s;
    z->h_x1 = H(z, 1.5) - 1.0;
    z->h_n = H(z, (double)n + 0.5);
    z->sval = 2.0 - H_inv(z, H(z, 2.5) - h(z, 2.0));
    return FL_OK;
}

int64_t fl_zipf_sample(const fl_zipf *z, fl_rng *r) {
    for (;;) {
        double u = z->h_n + fl_rng_uniform_f64(r) * (z->h_x1 - z->h_n);
        double x = H_inv(z, u);
        int64_t k = (int64_t)(x + 0.5);
        if (k < 1)
            k = 1;
        else if (k > z->n)
            k = z->n;
        if ((double)k - x <= z->sval || u >= H(z, (double)k + 0.5) - h(z, (double)k))
            return k;
    }
}
