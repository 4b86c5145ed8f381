/* bn.cu - the cuda backend's batch norm (Ioffe & Szegedy 2015, arXiv:1502.03167), NCHW and
 * NHWC, forward (training: the batch's mean and biased variance, in double, into the caller's
 * device arrays; inference: those arrays read) with the fused ReLU, and backward with relu_y.
 * fleet's own kernels, not cuDNN's: cuDNN keeps a float inverse variance and updates running
 * statistics itself, where fleet's contract is double statistics returned to the layer. Sums are
 * reduce.cuh's per-channel fixed-order reductions in double; the per-channel coefficients are
 * computed in double and rounded once, as the cpu table does, and the elementwise passes apply
 * them. The statistics take one pass over x (shifted sums of d and d^2), and every kernel finds
 * an element's channel with fastdiv.h's multiply-and-shift where the call's indices fit in 31
 * bits. */
#include "fastdiv.h"
#include "reduce.cuh"

#include <math.h>

/* --- where element (row r, channel c) lies: rows are the N HW pixels of the batch --- */

/* The shape of a call, with dividers for HW and C where every index fits in 31 bits (SMALL):
 * NCHW's position of (r, c) needs r / HW, an element's channel (i / HW) % C or i % C, and
 * 64-bit division per element cost these kernels most of their time. */
struct bn_shape {
    bool       nhwc;
    int64_t    C, hw;
    fl_fastdiv dhw, dc;
};

static bn_shape shape_of(bool nhwc, int64_t c, int64_t hw, bool small) {
    bn_shape s = {nhwc, c, hw, {}, {}};
    if (small)
        s.dhw = fl_fastdiv_make((uint32_t)hw), s.dc = fl_fastdiv_make((uint32_t)c);
    return s;
}

template <bool SMALL> __device__ __forceinline__ int64_t bn_at(const bn_shape &s, int64_t r, int64_t c) {
    if (s.nhwc)
        return r * s.C + c;
    if (SMALL) {
        uint32_t n = fl_fastdiv_q(s.dhw, (uint32_t)r);
        return ((int64_t)n * s.C + c) * s.hw + (r - (int64_t)n * s.hw);
    }
    return (r / s.hw * s.C + c) * s.hw + r % s.hw;
}

template <bool SMALL> __device__ __forceinline__ int64_t bn_channel(const bn_shape &s, int64_t i) {
    if (SMALL)
        return fl_fastdiv_r(s.dc, s.nhwc ? (uint32_t)i : fl_fastdiv_q(s.dhw, (uint32_t)i));
    return s.nhwc ? i % s.C : (i / s.hw) % s.C;
}

/* Runs BODY with the constant S = small (the templates' SMALL). */
#define DISPATCH_SMALL(small, ...)                                                            \
    do {                                                                                      \
        if (small) {                                                                          \
            constexpr bool S = true;                                                          \
            __VA_ARGS__;                                                                      \
        } else {                                                                              \
            constexpr bool S = false;                                                         \
            __VA_ARGS__;                                                                      \
        }                                                                                     \
    } while (0)

/* --- statistics in one pass: sums of d and d^2 with d = x - K, K the channel's first value
 * (shifted data: with K near the mean, E[d^2] - E[d]^2 loses no more than the two-pass
 * formula, where E[x^2] - E[x]^2 would cancel when |mean| >> std) --- */

template <class T, bool SMALL> struct stat_f {
    const T *x;
    bn_shape s;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        double d = (double)x[bn_at<SMALL>(s, r, c)] - (double)x[bn_at<SMALL>(s, 0, c)];
        return make_double2(d, d * d);
    }
};

template <class T, bool SMALL> struct stat_store {
    const T *x;
    bn_shape s;
    double  *mean, *var;
    double   cnt;
    __device__ void operator()(int64_t c, double2 t) const {
        double k = cnt > 0 ? (double)x[bn_at<SMALL>(s, 0, c)] : 0, m = t.x / cnt;
        double v = t.y / cnt - m * m;
        mean[c] = k + m;
        var[c] = v > 0 ? v : 0 * v; /* rounding can leave -1e-17; NaN stays NaN */
    }
};

/* --- y = [relu](x a + b), a = gamma / sqrt(var + eps), b = beta - mean a --- */

template <class T>
__global__ void bn_coef_k(const T *gamma, const T *beta, const double *mean, const double *var,
                          double eps, int64_t C, T *ab) {
    GRID_STRIDE(c, C) {
        double s = (double)gamma[c] / sqrt(var[c] + eps);
        ab[c] = (T)s;
        ab[C + c] = (T)((double)beta[c] - mean[c] * s);
    }
}

template <class T, bool SMALL>
__global__ void bn_apply_k(bn_shape s, int64_t total, const T *x, const T *ab, bool relu, T *y) {
    GRID_STRIDE(i, total) {
        int64_t c = bn_channel<SMALL>(s, i);
        T v = x[i] * ab[c] + ab[s.C + c];
        y[i] = relu ? (v > (T)0 ? v : (T)0) : v;
    }
}

static void check_layout(const char *op, fl_layout layout) {
    if (layout != FL_LAYOUT_NCHW && layout != FL_LAYOUT_NHWC)
        cuda_fatal(op, "the layout check", "unknown layout", __FILE__, __LINE__);
}

extern "C" void cuda_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                const void *x, const void *gamma, const void *beta, double eps,
                                bool training, double *mean, double *var, bool relu, void *y) {
    const char *op = "bn_forward";
    check_layout(op, layout);
    if (c <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    int64_t R = n * hw, total = R * c;
    bool small = total < INT32_MAX && hw >= 1;
    bn_shape s = shape_of(nhwc, c, hw, small);
    DISPATCH_T(op, t, DISPATCH_SMALL(small, {
        const T *xt = (const T *)x;
        if (training)
            colsum(!nhwc, stat_f<T, S>{xt, s}, stat_store<T, S>{xt, s, mean, var, (double)R}, R,
                   c, op);
        T *ab = (T *)cuda_get((size_t)(2 * c) * sizeof(T), op);
        bn_coef_k<T><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
            (const T *)gamma, (const T *)beta, mean, var, eps, c, ab);
        CU_LAUNCHED(op);
        if (total > 0) {
            bn_apply_k<T, S><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(s, total, xt, ab,
                                                                              relu, (T *)y);
            CU_LAUNCHED(op);
        }
        cuda_put(ab);
    }));
}

/* --- backward --- */

/* (d, d (x - mean)) with d = dy masked by relu_y > 0; x - mean in T as the cpu table */
template <class T, bool SMALL> struct grad_f {
    const T      *x, *ry, *dy;
    const double *mean;
    bn_shape      s;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        int64_t i = bn_at<SMALL>(s, r, c);
        T d = ry ? relu_keep(ry[i], dy[i]) : dy[i];
        return make_double2((double)d, (double)(d * (x[i] - (T)mean[c])));
    }
};

/* dgamma, dbeta (adding when accumulate), and dx's coefficients per channel:
 * dx = k (d - mean(d) - xhat mean(d xhat)) = a d + bx (x - mean) + c0 */
template <class T> struct grad_store {
    const T      *gamma;
    const double *mean, *var;
    double        eps, cnt;
    bool          training, accumulate;
    T            *dgamma, *dbeta, *coef; /* coef: a (C), bx (C), c0 (C) */
    int64_t       C;
    __device__ void operator()(int64_t c, double2 s) const {
        double is = 1.0 / sqrt(var[c] + eps), sdy = s.x, sdyx = s.y * is;
        dgamma[c] = (T)((accumulate ? (double)dgamma[c] : 0.0) + sdyx);
        dbeta[c] = (T)((accumulate ? (double)dbeta[c] : 0.0) + sdy);
        double k = (double)gamma[c] * is;
        double mdy = training ? sdy / cnt : 0, mdyx = training ? sdyx / cnt : 0;
        coef[c] = (T)k;
        coef[C + c] = (T)(-k * is * mdyx);
        coef[2 * C + c] = (T)(-k * mdy);
    }
};

template <class T, bool SMALL>
__global__ void bn_dx_k(bn_shape s, int64_t total, const T *x, const T *ry, const T *dy,
                        const double *mean, const T *coef, T *dx) {
    int64_t C = s.C;
    GRID_STRIDE(i, total) {
        int64_t c = bn_channel<SMALL>(s, i);
        T d = ry ? relu_keep(ry[i], dy[i]) : dy[i];
        dx[i] = coef[c] * d + coef[C + c] * (x[i] - (T)mean[c]) + coef[2 * C + c];
    }
}

extern "C" void cuda_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                 const void *x, const void *relu_y, const void *dy,
                                 const void *gamma, const double *mean, const double *var,
                                 double eps, bool training, void *dx, void *dgamma, void *dbeta,
                                 bool accumulate) {
    const char *op = "bn_backward";
    check_layout(op, layout);
    if (c <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    int64_t R = n * hw, total = R * c;
    bool small = total < INT32_MAX && hw >= 1;
    bn_shape s = shape_of(nhwc, c, hw, small);
    DISPATCH_T(op, t, DISPATCH_SMALL(small, {
        const T *xt = (const T *)x, *ry = (const T *)relu_y, *dyt = (const T *)dy;
        T *coef = (T *)cuda_get((size_t)(3 * c) * sizeof(T), op);
        grad_store<T> st = {(const T *)gamma, mean, var, eps, (double)R, training, accumulate,
                            (T *)dgamma, (T *)dbeta, coef, c};
        colsum(!nhwc, grad_f<T, S>{xt, ry, dyt, mean, s}, st, R, c, op);
        if (dx && total > 0) {
            bn_dx_k<T, S><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                s, total, xt, ry, dyt, mean, coef, (T *)dx);
            CU_LAUNCHED(op);
        }
        cuda_put(coef);
    }));
}
