/* kernels.h - the compute kernels behind layers and optimizers, as a table of function pointers.
 *
 * Two CPU tables exist: fl_kernels_cpu() (OpenBLAS cblas_sgemm/dgemm, OpenMP loops) and
 * fl_kernels_ref() (plain single-threaded loops, the reference tests compare against). A CUDA
 * table joins later behind the same interface. Every kernel takes a dtype, FL_DTYPE_F32 or
 * FL_DTYPE_F64 (f64 exists so gradient checks can use finite differences), and raw row-major
 * pointers; sizes may be 0. Reductions are deterministic: they sum fixed-size chunks in a fixed
 * order, so results do not depend on the thread count. All kernels are thread-safe except gemm:
 * OpenBLAS keeps its thread count in globals, so concurrent gemm calls from several threads must
 * be serialised by the caller (fleet runs them on the training thread only). */
#ifndef FLEET_KERNELS_H
#define FLEET_KERNELS_H

#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FL_ACT_NONE = 0, FL_ACT_RELU, FL_ACT_TANH, FL_ACT_SIGMOID } fl_act;

/* Parses "relu", "tanh", "sigmoid", "none"; returns 0 or FL_EINVAL. */
int fl_act_parse(const char *name, fl_act *out);
const char *fl_act_name(fl_act a);

/* Geometry of a 2-D window operation on one (C, H, W) image: convolution (im2col/col2im) or
 * pooling (then c counts the planes, N * C, pooled independently). Output size as PyTorch:
 * OH = (H + 2 PH - DH (KH - 1) - 1) / SH + 1, likewise OW. */
typedef struct fl_conv_geom {
    int64_t c, h, w;          /* input channels (planes), height, width */
    int64_t kh, kw;           /* window */
    int64_t sh, sw;           /* stride */
    int64_t ph, pw;           /* zero (conv) or -inf (max pool) padding on each side */
    int64_t dh, dw;           /* dilation (1: dense window) */
    int64_t oh, ow;           /* output height, width (fl_conv_geom_out fills them) */
} fl_conv_geom;

/* Fills g->oh, g->ow from the rest; returns false when the window does not fit (OH or OW < 1)
 * or a field is out of range (sizes < 1, padding < 0). */
bool fl_conv_geom_out(fl_conv_geom *g);

typedef enum { FL_POOL_MAX = 0, FL_POOL_AVG = 1 } fl_pool;

typedef struct fl_kernel_ops {
    const char *name; /* "cpu", "ref" */

    /* C (M, N) = alpha * op(A) op(B) + beta * C, row-major; op(A) is (M, K): A is (M, K) with
     * lda >= K, or (K, M) with lda >= M when trans_a. Likewise B (K, N) or (N, K). */
    void (*gemm)(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                 double beta, void *c, int64_t ldc);

    /* y (ROWS, COLS) += bias (COLS) broadcast over rows. */
    void (*add_bias)(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols);
    /* db (COLS) = (accumulate ? db : 0) + sum over rows of dy (ROWS, COLS). */
    void (*sum_rows)(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                     bool accumulate);

    /* y = act(x), n elements; y may alias x. */
    void (*act_forward)(fl_dtype t, fl_act act, const void *x, void *y, int64_t n);
    /* dx = dy * act'(x): relu uses x, tanh and sigmoid use y = act(x); dx may alias dy. */
    void (*act_backward)(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                         void *dx, int64_t n);

    /* y += a * x */
    void (*axpy)(fl_dtype t, int64_t n, double a, const void *x, void *y);
    /* x *= a */
    void (*scale)(fl_dtype t, int64_t n, double a, void *x);
    /* sum of x, and sum of x^2, accumulated in double */
    double (*sum)(fl_dtype t, const void *x, int64_t n);
    double (*sumsq)(fl_dtype t, const void *x, int64_t n);

    /* Fused softmax cross-entropy, numerically stable (max subtracted before exp).
     * logits, probs (ROWS, CLASSES); labels (ROWS) in [0, CLASSES). Writes probs = softmax and
     * returns the sum over rows of -log p[label] (computed as logsumexp - logit[label]). */
    double (*softmax_xent_forward)(fl_dtype t, const void *logits, const int32_t *labels,
                                   void *probs, int64_t rows, int64_t classes);
    /* dlogits = scale * (probs - onehot(labels)); dlogits may alias probs. */
    void (*softmax_xent_backward)(fl_dtype t, const void *probs, const int32_t *labels,
                                  void *dlogits, int64_t rows, int64_t classes, double scale);

    /* Optimizer updates over n elements (w, g, v of the same dtype):
     * sgd:      w -= lr * (g + wd * w)
     * momentum: d = g + wd * w;  v = mu * v + d;  w -= lr * (nesterov ? d + mu * v : v)
     * (Paddle's Momentum / PyTorch SGD(momentum, dampening=0), L2 decay folded into d). */
    void (*sgd_update)(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd);
    void (*momentum_update)(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                            double mu, double wd, bool nesterov);

    /* --- convolution, pooling and batch norm (NCHW); the CPU and reference tables share
     * these plain loops (OpenMP over channels or planes), the fast path of a convolution is
     * the gemm it feeds (src/nn/conv2d.c). --- */
    /* col (C KH KW, OH OW), row stride ldc >= OH OW:
     * col[(c KH + i) KW + j][oy OW + ox] = x[c][oy SH - PH + i DH][ox SW - PW + j DW], or 0
     * outside the image. x is one image (C, H, W). */
    void (*im2col)(fl_dtype t, const fl_conv_geom *g, const void *x, void *col, int64_t ldc);
    /* The adjoint: x (C, H, W) = sum of the col entries that im2col reads from each pixel
     * (overwrites x). */
    void (*col2im)(fl_dtype t, const fl_conv_geom *g, const void *col, int64_t ldc, void *x);
    /* y (P, OH, OW) = max or mean over each window of x (P, H, W), P = g->c planes. Max pool
     * pads with -inf; average pool divides by KH KW, padding included (PyTorch's
     * count_include_pad = True). */
    void (*pool_forward)(fl_dtype t, fl_pool pool, const fl_conv_geom *g, const void *x,
                         void *y);
    /* dx (P, H, W) = gradient of the pooling given dy (P, OH, OW) (overwrites dx); max pool
     * sends each window's gradient to its first largest x, as PyTorch's CPU kernel does. */
    void (*pool_backward)(fl_dtype t, fl_pool pool, const fl_conv_geom *g, const void *x,
                          const void *dy, void *dx);
    /* Per channel c of x (N, C, HW): mean[c] and biased variance var[c] over N HW values
     * (two passes, accumulated in double). */
    void (*bn_stats)(fl_dtype t, int64_t n, int64_t c, int64_t hw, const void *x, double *mean,
                     double *var);
    /* y = x * scale[c] + shift[c], then max(0, .) when relu; y may alias x. */
    void (*bn_apply)(fl_dtype t, int64_t n, int64_t c, int64_t hw, const void *x,
                     const double *scale, const double *shift, bool relu, void *y);
    /* Backward of y = [relu](gamma xhat + beta), xhat = (x - mean[c]) invstd[c]. relu_y, when
     * not NULL, is the relu's output y: dy counts only where y > 0. Writes dgamma, dbeta
     * (adding when accumulate) and, unless dx is NULL, dx: with batch statistics (training)
     * dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), else dx = gamma invstd dy. */
    void (*bn_backward)(fl_dtype t, int64_t n, int64_t c, int64_t hw, const void *x,
                        const void *relu_y, const void *dy, const void *gamma,
                        const double *mean, const double *invstd, bool training, void *dx,
                        void *dgamma, void *dbeta, bool accumulate);
} fl_kernel_ops;

/* The OpenBLAS + OpenMP table. */
const fl_kernel_ops *fl_kernels_cpu(void);
/* The plain reference table (single-threaded loops; naive gemm). */
const fl_kernel_ops *fl_kernels_ref(void);

/* Number of threads the CPU kernels use: OpenMP loops and OpenBLAS both follow it. n <= 0
 * restores the default (OMP_NUM_THREADS, else one per core). Affects kernels called from the
 * calling thread afterwards; call it at set-up, not concurrently with kernels. */
void fl_kernels_set_threads(int n);
int  fl_kernels_get_threads(void);

/* Index of the largest of n values (first on ties); used by accuracy and the teacher task. */
int64_t fl_argmax(fl_dtype t, const void *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_KERNELS_H */
