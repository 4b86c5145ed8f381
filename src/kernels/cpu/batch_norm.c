/* batch_norm.c - the per-channel loops of batch normalisation (Ioffe & Szegedy 2015,
 * arXiv:1502.03167, Algorithm 1 and its backward): statistics, the affine apply (with an
 * optional fused ReLU) and the backward. Each (image, channel) row is summed in the dtype
 * (vectorised) and the row sums in double, in a fixed order per channel; channels are split
 * over OpenMP threads, so results do not depend on the thread count. */
#include "backend_private.h"

#include "kernels/relu_mask.h"

#include <math.h>
#include <string.h>

#define STAMP_BN(T, S)                                                                        \
    static void bn_stats_channel_##S(int64_t n, int64_t c, int64_t hw, const T *x, int64_t ch, \
                                     double *mean, double *var) {                             \
        double s = 0;                                                                         \
        for (int64_t b = 0; b < n; b++) {                                                     \
            const T *p = x + (b * c + ch) * hw;                                               \
            double part = 0;                                                                  \
            _Pragma("omp simd reduction(+ : part)") for (int64_t i = 0; i < hw; i++) part +=  \
                p[i];                                                                         \
            s += part;                                                                        \
        }                                                                                     \
        double m = s / (double)(n * hw), q = 0;                                               \
        for (int64_t b = 0; b < n; b++) {                                                     \
            const T *p = x + (b * c + ch) * hw;                                               \
            double part = 0;                                                                  \
            _Pragma("omp simd reduction(+ : part)") for (int64_t i = 0; i < hw; i++) {        \
                double d = (double)p[i] - m;                                                  \
                part += d * d;                                                                \
            }                                                                                 \
            q += part;                                                                        \
        }                                                                                     \
        mean[ch] = m;                                                                         \
        var[ch] = q / (double)(n * hw);                                                       \
    }                                                                                         \
    static void bn_stats_##S(int64_t n, int64_t c, int64_t hw, const T *x, double *mean,      \
                             double *var) {                                                   \
        _Pragma("omp parallel for schedule(static) if (n * c * hw >= PAR_MIN)")               \
        for (int64_t ch = 0; ch < c; ch++)                                                    \
            bn_stats_channel_##S(n, c, hw, x, ch, mean, var);                                 \
    }                                                                                         \
    /* scale = gamma / sqrt(var + eps), shift = beta - mean scale, per (image, channel) row */ \
    static void bn_apply_##S(int64_t n, int64_t c, int64_t hw, const T *x, const T *gamma,    \
                             const T *beta, const double *mean, const double *var, double eps, \
                             bool relu, T *y) {                                               \
        _Pragma("omp parallel for schedule(static) if (n * c * hw >= PAR_MIN)")               \
        for (int64_t r = 0; r < n * c; r++) {                                                 \
            int64_t ch = r % c;                                                               \
            double sc = (double)gamma[ch] / sqrt(var[ch] + eps);                              \
            T a = (T)sc, b = (T)((double)beta[ch] - mean[ch] * sc);                           \
            const T *p = x + r * hw;                                                          \
            T *q = y + r * hw;                                                                \
            if (relu) {                                                                       \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) {                        \
                    T v = p[i] * a + b;                                                       \
                    q[i] = v > 0 ? v : 0;                                                     \
                }                                                                             \
            } else {                                                                          \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) q[i] = p[i] * a + b;     \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* d = dy masked by relu_y (when given); one row of HW values at a time, in T with the  \
     * row sums added in double (vectorised; the mask is a blend, not a branch) */            \
    static void bn_backward_channel_##S(int64_t n, int64_t c, int64_t hw, const T *x,         \
                                        const T *ry, const T *dy, const T *gamma,             \
                                        const double *mean, const double *var, double eps,    \
                                        bool training, T *dx, T *dgamma, T *dbeta,            \
                                        bool accumulate, int64_t ch) {                        \
        double m = mean[ch], is = 1.0 / sqrt(var[ch] + eps), sdy = 0, sdyx = 0;               \
        T mt = (T)m;                                                                          \
        for (int64_t b = 0; b < n; b++) {                                                     \
            int64_t off = (b * c + ch) * hw;                                                  \
            const T *xr = x + off, *dr = dy + off;                                            \
            T p1 = 0, p2 = 0;                                                                 \
            if (ry) {                                                                         \
                const T *yr = ry + off;                                                       \
                _Pragma("omp simd reduction(+ : p1, p2)") for (int64_t i = 0; i < hw; i++) {  \
                    T d = keep_##S(yr[i], dr[i]);                                           \
                    p1 += d;                                                                  \
                    p2 += d * (xr[i] - mt);                                                   \
                }                                                                             \
            } else {                                                                          \
                _Pragma("omp simd reduction(+ : p1, p2)") for (int64_t i = 0; i < hw; i++) {  \
                    p1 += dr[i];                                                              \
                    p2 += dr[i] * (xr[i] - mt);                                               \
                }                                                                             \
            }                                                                                 \
            sdy += (double)p1;                                                                \
            sdyx += (double)p2;                                                               \
        }                                                                                     \
        sdyx *= is; /* sum of dy xhat */                                                      \
        dgamma[ch] = (T)((accumulate ? (double)dgamma[ch] : 0.0) + sdyx);                     \
        dbeta[ch] = (T)((accumulate ? (double)dbeta[ch] : 0.0) + sdy);                        \
        if (!dx)                                                                              \
            return;                                                                           \
        /* dx = k (d - mean(d) - xhat mean(d xhat)) = a d + bx x + c0 */                      \
        double cnt = (double)(n * hw), k = (double)gamma[ch] * is;                            \
        double mdy = training ? sdy / cnt : 0, mdyx = training ? sdyx / cnt : 0;              \
        T a = (T)k, bx = (T)(-k * is * mdyx), c0 = (T)(-k * mdy + k * is * mdyx * m);         \
        for (int64_t b = 0; b < n; b++) {                                                     \
            int64_t off = (b * c + ch) * hw;                                                  \
            const T *xr = x + off, *dr = dy + off;                                            \
            T *o = dx + off;                                                                  \
            if (ry) {                                                                         \
                const T *yr = ry + off;                                                       \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) {                        \
                    T d = keep_##S(yr[i], dr[i]);                                           \
                    o[i] = a * d + bx * xr[i] + c0;                                           \
                }                                                                             \
            } else {                                                                          \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) o[i] =                   \
                    a * dr[i] + bx * xr[i] + c0;                                              \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void bn_backward_##S(int64_t n, int64_t c, int64_t hw, const T *x, const T *ry,    \
                                const T *dy, const T *gamma, const double *mean,              \
                                const double *var, double eps, bool training, T *dx,          \
                                T *dgamma, T *dbeta, bool accumulate) {                       \
        _Pragma("omp parallel for schedule(static) if (n * c * hw >= PAR_MIN)")               \
        for (int64_t ch = 0; ch < c; ch++)                                                    \
            bn_backward_channel_##S(n, c, hw, x, ry, dy, gamma, mean, var, eps, training, dx, \
                                    dgamma, dbeta, accumulate, ch);                           \
    }
STAMP_BN(float, f32)
STAMP_BN(double, f64)

/* y = [relu](x scale + shift), scale = gamma / sqrt(var + eps), shift = beta - mean scale: the
 * batch's statistics in training, the given (running) ones otherwise. NCHW only. */
void cpu_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                    const void *x, const void *gamma, const void *beta, double eps,
                    bool training, double *mean, double *var, bool relu, void *y) {
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    if (training)
        DISPATCH(t, bn_stats, n, c, hw, x, mean, var);
    DISPATCH(t, bn_apply, n, c, hw, x, gamma, beta, mean, var, eps, relu, y);
}

void cpu_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                     const void *x, const void *relu_y, const void *dy, const void *gamma,
                     const double *mean, const double *var, double eps, bool training, void *dx,
                     void *dgamma, void *dbeta, bool accumulate) {
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    DISPATCH(t, bn_backward, n, c, hw, x, relu_y, dy, gamma, mean, var, eps, training, dx,
             dgamma, dbeta, accumulate);
}
