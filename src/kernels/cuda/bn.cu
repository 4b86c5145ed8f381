/* bn.cu - the cuda backend's batch norm (Ioffe & Szegedy 2015, arXiv:1502.03167), NCHW and
 * NHWC, forward (training: the batch's mean and biased variance, in double, into the caller's
 * device arrays; inference: those arrays read) with the fused ReLU, and backward with relu_y.
 * fleet's own kernels, not cuDNN's: cuDNN keeps a float inverse variance and updates running
 * statistics itself, where fleet's contract is double statistics returned to the layer. Sums are
 * reduce.cuh's per-channel fixed-order reductions in double (two passes for the variance, as the
 * ref table); the per-channel coefficients are computed in double and rounded once, as the
 * cpu table does, and the elementwise passes apply them. */
#include "reduce.cuh"

#include <math.h>

/* --- statistics --- */

template <class T> struct x_f {
    const T *x;
    bool     nhwc;
    int64_t  C, hw;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        return make_double2((double)x[nchw_at(nhwc, r, c, C, hw)], 0);
    }
};

template <class T> struct dev2_f { /* (x - mean)^2 */
    const T      *x;
    const double *mean;
    bool          nhwc;
    int64_t       C, hw;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        double d = (double)x[nchw_at(nhwc, r, c, C, hw)] - mean[c];
        return make_double2(d * d, 0);
    }
};

struct div_store {
    double *out;
    double  cnt;
    __device__ void operator()(int64_t c, double2 s) const { out[c] = s.x / cnt; }
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

template <class T>
__global__ void bn_apply_k(bool nhwc, int64_t total, int64_t C, int64_t hw, const T *x,
                           const T *ab, bool relu, T *y) {
    GRID_STRIDE(i, total) {
        int64_t c = nhwc ? i % C : (i / hw) % C;
        T v = x[i] * ab[c] + ab[C + c];
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
    DISPATCH_T(op, t, {
        const T *xt = (const T *)x;
        if (training) {
            colsum(!nhwc, x_f<T>{xt, nhwc, c, hw}, div_store{mean, (double)R}, R, c, op);
            colsum(!nhwc, dev2_f<T>{xt, mean, nhwc, c, hw}, div_store{var, (double)R}, R, c, op);
        }
        T *ab = (T *)cuda_get((size_t)(2 * c) * sizeof(T), op);
        bn_coef_k<T><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
            (const T *)gamma, (const T *)beta, mean, var, eps, c, ab);
        CU_LAUNCHED(op);
        if (total > 0) {
            bn_apply_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(nhwc, total, c, hw,
                                                                            xt, ab, relu, (T *)y);
            CU_LAUNCHED(op);
        }
        cuda_put(ab);
    });
}

/* --- backward --- */

/* (d, d (x - mean)) with d = dy masked by relu_y > 0; x - mean in T as the cpu table */
template <class T> struct grad_f {
    const T      *x, *ry, *dy;
    const double *mean;
    bool          nhwc;
    int64_t       C, hw;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        int64_t i = nchw_at(nhwc, r, c, C, hw);
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

template <class T>
__global__ void bn_dx_k(bool nhwc, int64_t total, int64_t C, int64_t hw, const T *x, const T *ry,
                        const T *dy, const double *mean, const T *coef, T *dx) {
    GRID_STRIDE(i, total) {
        int64_t c = nhwc ? i % C : (i / hw) % C;
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
    DISPATCH_T(op, t, {
        const T *xt = (const T *)x, *ry = (const T *)relu_y, *dyt = (const T *)dy;
        T *coef = (T *)cuda_get((size_t)(3 * c) * sizeof(T), op);
        grad_store<T> st = {(const T *)gamma, mean, var, eps, (double)R, training, accumulate,
                            (T *)dgamma, (T *)dbeta, coef, c};
        colsum(!nhwc, grad_f<T>{xt, ry, dyt, mean, nhwc, c, hw}, st, R, c, op);
        if (dx && total > 0) {
            bn_dx_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                nhwc, total, c, hw, xt, ry, dyt, mean, coef, (T *)dx);
            CU_LAUNCHED(op);
        }
        cuda_put(coef);
    });
}
