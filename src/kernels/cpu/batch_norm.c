/* batch_norm.c - the per-channel loops of batch normalisation (Ioffe & Szegedy 2015,
 * arXiv:1502.03167, Algorithm 1 and its backward): statistics, the affine apply (with an
 * optional fused ReLU or hardswish) and the backward. Each (image, channel) row is summed in the dtype
 * (vectorised) and the row sums in double, in a fixed order per channel; channels are split
 * over OpenMP threads, so results do not depend on the thread count. */
#include "backend_private.h"

#include "kernels/relu_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* no FP exception is ever enabled: the fused hardswish's division may then run in every lane,
 * and its loops vectorise (as in act_kernels.c); hardswish.h after it, so that its inline
 * functions carry the same options and inline */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "kernels/hardswish.h"

/* BODY over i in [0, hw) under PRAGMA, one loop for the relu and one for none, with A the
 * constant act (each loop's bn_dz folds to its one expression) */
#define BN_ACT_LOOP(act, PRAGMA, BODY)                                                        \
    do {                                                                                      \
        if ((act) == FL_ACT_RELU) {                                                           \
            const fl_act A = FL_ACT_RELU;                                                     \
            PRAGMA for (int64_t i = 0; i < hw; i++) BODY                                      \
        } else {                                                                              \
            const fl_act A = FL_ACT_NONE;                                                     \
            PRAGMA for (int64_t i = 0; i < hw; i++) BODY                                      \
        }                                                                                     \
    } while (0)

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
    /* z = x a + b, a = gamma / sqrt(var + eps), b = beta - mean a rounded to T (the forward's \
     * and, for a fused hardswish, the backward's recomputation) */                           \
    static void bn_affine_##S(const T *gamma, const T *beta, const double *mean,              \
                              const double *var, double eps, int64_t ch, T *a, T *b) {        \
        double sc = (double)gamma[ch] / sqrt(var[ch] + eps);                                  \
        *a = (T)sc;                                                                           \
        *b = (T)((double)beta[ch] - mean[ch] * sc);                                           \
    }                                                                                         \
    static void bn_apply_##S(int64_t n, int64_t c, int64_t hw, const T *x, const T *gamma,    \
                             const T *beta, const double *mean, const double *var, double eps, \
                             fl_act act, T *y) {                                              \
        _Pragma("omp parallel for schedule(static) if (n * c * hw >= PAR_MIN)")               \
        for (int64_t r = 0; r < n * c; r++) {                                                 \
            T a, b;                                                                           \
            bn_affine_##S(gamma, beta, mean, var, eps, r % c, &a, &b);                        \
            const T *p = x + r * hw;                                                          \
            T *q = y + r * hw;                                                                \
            if (act == FL_ACT_RELU) {                                                         \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) {                        \
                    T v = p[i] * a + b;                                                       \
                    q[i] = v > 0 ? v : 0;                                                     \
                }                                                                             \
            } else if (act == FL_ACT_HARDSWISH) {                                             \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) q[i] =                   \
                    hardswish_##S(p[i] * a + b);                                              \
            } else {                                                                          \
                _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) q[i] = p[i] * a + b;     \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* the activation's gradient dz at element i of a row: dy masked by y (relu), or dy */    \
    static inline T bn_dz_##S(fl_act act, const T *yr, const T *dr, int64_t i) {              \
        return act == FL_ACT_RELU ? keep_##S(yr[i], dr[i]) : dr[i];                           \
    }                                                                                         \
    /* a row's dz for a fused hardswish: dy times hardswish' at z = x a + b, recomputed with  \
     * the forward's expression, into buf (then read as the unfused dz would be, so that the  \
     * sums below vectorise alike and give the unfused bits); else dy itself */               \
    static const T *bn_row_dz_##S(fl_act act, const T *xr, const T *dr, T a, T b, int64_t hw, \
                                  T *buf) {                                                   \
        if (act != FL_ACT_HARDSWISH)                                                          \
            return dr;                                                                        \
        _Pragma("omp simd") for (int64_t i = 0; i < hw; i++) buf[i] =                         \
            dr[i] * hardswish_grad_##S(xr[i] * a + b);                                        \
        return buf;                                                                           \
    }                                                                                         \
    /* one row of HW values at a time, in T with the row sums added in double (vectorised;    \
     * the relu mask is a blend, not a branch); the relu and none their own loops, so that    \
     * the branch on act leaves the loops; buf: a row (HW) for a hardswish's dz */            \
    static void bn_backward_channel_##S(int64_t n, int64_t c, int64_t hw, const T *x,         \
                                        fl_act act, const T *y, const T *dy, const T *gamma,  \
                                        const T *beta, const double *mean, const double *var, \
                                        double eps, bool training, T *dx, T *dgamma,          \
                                        T *dbeta, bool accumulate, int64_t ch, T *buf) {      \
        double m = mean[ch], is = 1.0 / sqrt(var[ch] + eps), sdy = 0, sdyx = 0;               \
        T mt = (T)m, za = 0, zb = 0;                                                          \
        if (act == FL_ACT_HARDSWISH)                                                          \
            bn_affine_##S(gamma, beta, mean, var, eps, ch, &za, &zb);                         \
        for (int64_t b = 0; b < n; b++) {                                                     \
            int64_t off = (b * c + ch) * hw;                                                  \
            const T *xr = x + off, *yr = y ? y + off : NULL;                                  \
            const T *dr = bn_row_dz_##S(act, xr, dy + off, za, zb, hw, buf);                  \
            T p1 = 0, p2 = 0;                                                                 \
            BN_ACT_LOOP(act, _Pragma("omp simd reduction(+ : p1, p2)"), {                     \
                T d = bn_dz_##S(A, yr, dr, i);                                                \
                p1 += d;                                                                      \
                p2 += d * (xr[i] - mt);                                                       \
            });                                                                               \
            sdy += (double)p1;                                                                \
            sdyx += (double)p2;                                                               \
        }                                                                                     \
        sdyx *= is; /* sum of dz xhat */                                                      \
        dgamma[ch] = (T)((accumulate ? (double)dgamma[ch] : 0.0) + sdyx);                     \
        dbeta[ch] = (T)((accumulate ? (double)dbeta[ch] : 0.0) + sdy);                        \
        if (!dx)                                                                              \
            return;                                                                           \
        /* dx = k (dz - mean(dz) - xhat mean(dz xhat)) = a dz + bx x + c0 */                  \
        double cnt = (double)(n * hw), k = (double)gamma[ch] * is;                            \
        double mdy = training ? sdy / cnt : 0, mdyx = training ? sdyx / cnt : 0;              \
        T a = (T)k, bx = (T)(-k * is * mdyx), c0 = (T)(-k * mdy + k * is * mdyx * m);         \
        for (int64_t b = 0; b < n; b++) {                                                     \
            int64_t off = (b * c + ch) * hw;                                                  \
            const T *xr = x + off, *yr = y ? y + off : NULL;                                  \
            const T *dr = bn_row_dz_##S(act, xr, dy + off, za, zb, hw, buf);                  \
            T *o = dx + off;                                                                  \
            BN_ACT_LOOP(act, _Pragma("omp simd"), {                                           \
                T d = bn_dz_##S(A, yr, dr, i);                                                \
                o[i] = a * d + bx * xr[i] + c0;                                               \
            });                                                                               \
        }                                                                                     \
    }                                                                                         \
    static void bn_backward_##S(int64_t n, int64_t c, int64_t hw, const T *x, fl_act act,     \
                                const T *y, const T *dy, const T *gamma, const T *beta,       \
                                const double *mean, const double *var, double eps,            \
                                bool training, T *dx, T *dgamma, T *dbeta, bool accumulate) { \
        _Pragma("omp parallel if (n * c * hw >= PAR_MIN)") {                                  \
            T *buf = NULL; /* this thread's row of dz (hardswish) */                          \
            if (act == FL_ACT_HARDSWISH)                                                      \
                FL_ASSERT((buf = malloc((size_t)hw * sizeof(T))) != NULL);                    \
            _Pragma("omp for schedule(static)") for (int64_t ch = 0; ch < c; ch++)            \
                bn_backward_channel_##S(n, c, hw, x, act, y, dy, gamma, beta, mean, var, eps, \
                                        training, dx, dgamma, dbeta, accumulate, ch, buf);    \
            free(buf);                                                                        \
        }                                                                                     \
    }
STAMP_BN(float, f32)
STAMP_BN(double, f64)

/* y = act(x scale + shift), scale = gamma / sqrt(var + eps), shift = beta - mean scale: the
 * batch's statistics in training, the given (running) ones otherwise. NCHW only. */
void cpu_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                    const void *x, const void *gamma, const void *beta, double eps,
                    bool training, double *mean, double *var, fl_act act, void *y) {
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    FL_ASSERT(act == FL_ACT_NONE || act == FL_ACT_RELU || act == FL_ACT_HARDSWISH);
    if (training)
        DISPATCH(t, bn_stats, n, c, hw, x, mean, var);
    DISPATCH(t, bn_apply, n, c, hw, x, gamma, beta, mean, var, eps, act, y);
}

void cpu_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                     const void *x, fl_act act, const void *y, const void *dy,
                     const void *gamma, const void *beta, const double *mean, const double *var,
                     double eps, bool training, void *dx, void *dgamma, void *dbeta,
                     bool accumulate) {
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    DISPATCH(t, bn_backward, n, c, hw, x, act, act == FL_ACT_RELU ? y : NULL, dy, gamma, beta,
             mean, var, eps, training, dx, dgamma, dbeta, accumulate);
}

/* the momentum rule of backend.h's bn_running, one statement per product and sum (this file is
 * built without FMA, so none is fused: the cuda table rounds each the same way) */
static double running_step(double r, double v, double momentum) {
    double keep = (1 - momentum) * r;
    double add = momentum * v;
    return keep + add;
}

void cpu_bn_running(fl_dtype t, int64_t c, const double *mean, const double *var, double count,
                    double momentum, void *running_mean, void *running_var) {
    FL_ASSERT(t == FL_DTYPE_F32 || t == FL_DTYPE_F64);
    for (int64_t i = 0; i < c; i++) {
        double unbiased = count > 1 ? var[i] * count / (count - 1) : var[i];
        if (t == FL_DTYPE_F32) {
            float *rm = running_mean, *rv = running_var;
            rm[i] = (float)running_step(rm[i], mean[i], momentum);
            rv[i] = (float)running_step(rv[i], unbiased, momentum);
        } else {
            double *rm = running_mean, *rv = running_var;
            rm[i] = running_step(rm[i], mean[i], momentum);
            rv[i] = running_step(rv[i], unbiased, momentum);
        }
    }
}
