/* ref.c - the fl_backend_ref() table: the plainest loops that implement kernels.h, single-
 * threaded, sums in double (gemm: each element one sum, in order). Slow on purpose; it is what
 * the tests hold the fast table to, so every line should be obviously right. The ops over
 * activations also take f16 / bf16 (backend.h, "Low dtypes"): this file's loops read and write
 * them through get / put, the ops it borrows from the cpu table go to ref_lowp.c instead. */
#include "backend_private.h"
#include "fleet/backend.h"
#include "fleet/status.h"
#include "ref_lowp.h"

#include <math.h>

#define ASSERT_FLOAT(t) FL_ASSERT((t) == FL_DTYPE_F32 || (t) == FL_DTYPE_F64)
/* the ops over activations: f32, f64, f16, bf16 */
#define ASSERT_ACT(t) FL_ASSERT((t) == FL_DTYPE_F32 || (t) == FL_DTYPE_F64 || ref_lowp_is(t))

/* Element i of a float, double, f16 or bf16 array, as a double (exact); and a store back in the
 * array's dtype, one rounding of v. */
static inline double get(fl_dtype t, const void *p, int64_t i) {
    if (t == FL_DTYPE_F32)
        return (double)((const float *)p)[i];
    if (t == FL_DTYPE_F64)
        return ((const double *)p)[i];
    return ref_lowp_get(t, p, i);
}
static inline void put(fl_dtype t, void *p, int64_t i, double v) {
    if (t == FL_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else if (t == FL_DTYPE_F64)
        ((double *)p)[i] = v;
    else
        ref_lowp_put(t, p, i, v);
}

/* The dtype of what stays f32 beside low activations (biases, their gradients): t itself when
 * t is f32 or f64. */
static inline fl_dtype param_dtype(fl_dtype t) { return ref_lowp_is(t) ? FL_DTYPE_F32 : t; }

/* s[j] += aip * b[p * ldb + j0 + j] for j < nj, in double: row p of b (K, N) times a(i, p), into
 * the running sums of nj elements of c's row i (ref_gemm, below). */
static inline void acc_row(double *s, int64_t nj, double aip, fl_dtype t, const void *b,
                           int64_t off) {
    if (t == FL_DTYPE_F32) {
        const float *bf = (const float *)b + off;
#pragma omp simd
        for (int64_t j = 0; j < nj; j++)
            s[j] += aip * (double)bf[j];
    } else if (t == FL_DTYPE_F64) {
        const double *bd = (const double *)b + off;
#pragma omp simd
        for (int64_t j = 0; j < nj; j++)
            s[j] += aip * bd[j];
    } else {
        for (int64_t j = 0; j < nj; j++)
            s[j] += aip * ref_lowp_get(t, b, off + j);
    }
}

/* c (M, N) = alpha op(a) op(b) + beta c, each element's sum over p in ascending order in double,
 * as a dot product per element would give it, and so the same bits however the loops are
 * ordered around that sum. They are ordered for speed (a dot product per element, one chain of
 * dependent adds walking down b's columns, made most of the ref-backend tests' time): with b
 * (K, N), a row of c is summed JT columns at a time with p outermost (acc_row: JT independent
 * sums along b's rows, in vector registers); with b transposed (N, K), four dot products along
 * b's rows at a time. */
static void ref_gemm(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                     double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                     double beta, void *c, int64_t ldc) {
    ASSERT_ACT(t);
    enum { JT = 64 };
    double s[JT];
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j0 = 0; j0 < n; j0 += JT) {
            int64_t nj = n - j0 < JT ? n - j0 : JT;
            for (int64_t j = 0; j < nj; j++)
                s[j] = 0;
            for (int64_t p = 0; p < k; p++) {
                double aip = trans_a ? get(t, a, p * lda + i) : get(t, a, i * lda + p);
                if (!trans_b)
                    acc_row(s, nj, aip, t, b, p * ldb + j0);
            }
            for (int64_t j = 0; trans_b && j < nj; j += 4) {
                int64_t nq = nj - j < 4 ? nj - j : 4, r[4];
                for (int q = 0; q < 4; q++) /* rows of b; past nj, the last again */
                    r[q] = (j0 + j + (q < nq ? q : nq - 1)) * ldb;
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                for (int64_t p = 0; p < k; p++) {
                    double aip = trans_a ? get(t, a, p * lda + i) : get(t, a, i * lda + p);
                    s0 += aip * get(t, b, r[0] + p);
                    s1 += aip * get(t, b, r[1] + p);
                    s2 += aip * get(t, b, r[2] + p);
                    s3 += aip * get(t, b, r[3] + p);
                }
                double four[4] = {s0, s1, s2, s3};
                for (int q = 0; q < nq; q++)
                    s[j + q] = four[q];
            }
            for (int64_t j = 0; j < nj; j++) {
                double old = beta == 0 ? 0 : beta * get(t, c, i * ldc + j0 + j);
                put(t, c, i * ldc + j0 + j, alpha * s[j] + old);
            }
        }
    }
}

/* low t: bias f32 */
static void ref_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    ASSERT_ACT(t);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            put(t, y, r * cols + j, get(t, y, r * cols + j) + get(param_dtype(t), bias, j));
}

/* low t: db f32 */
static void ref_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                         bool accumulate) {
    ASSERT_ACT(t);
    fl_dtype bt = param_dtype(t);
    for (int64_t j = 0; j < cols; j++) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++)
            s += get(t, dy, r * cols + j);
        put(bt, db, j, (accumulate ? get(bt, db, j) : 0) + s);
    }
}

static double act(fl_act a, double x) {
    switch (a) {
    case FL_ACT_NONE: return x;
    case FL_ACT_RELU: return x < 0 ? 0 : x;
    case FL_ACT_TANH: return tanh(x);
    case FL_ACT_SIGMOID: return 1 / (1 + exp(-x));
    /* x relu6(x + 3) / 6 and relu6(x + 3) / 6, as written (MobileNetV3, arXiv:1905.02244);
     * the comparisons keep NaN, and hardswish is 0 at or below -3 (so -inf gives 0) */
    case FL_ACT_HARDSWISH: return x <= -3 ? 0 : x >= 3 ? x : x * fmin(fmax(x + 3, 0), 6) / 6;
    case FL_ACT_HARDSIGMOID: return x + 3 < 0 ? 0 : x + 3 > 6 ? 1 : (x + 3) / 6;
    }
    FL_ASSERT(!"unknown activation");
    return 0;
}

/* d act / dx, from x (relu, hardswish, hardsigmoid) or y = act(x) (tanh, sigmoid); the kinks
 * as PyTorch's (backend.h) */
static double act_grad(fl_act a, double x, double y) {
    switch (a) {
    case FL_ACT_NONE: return 1;
    case FL_ACT_RELU: return x > 0 ? 1 : 0;
    case FL_ACT_TANH: return 1 - y * y;
    case FL_ACT_SIGMOID: return y * (1 - y);
    case FL_ACT_HARDSWISH: return x < -3 ? 0 : x > 3 ? 1 : 2 * x / 6 + 0.5;
    case FL_ACT_HARDSIGMOID: return x > -3 && x < 3 ? 1.0 / 6 : 0;
    }
    FL_ASSERT(!"unknown activation");
    return 0;
}

static void ref_act_forward(fl_dtype t, fl_act a, const void *x, void *y, int64_t n) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, y, i, act(a, get(t, x, i)));
}

static void ref_act_backward(fl_dtype t, fl_act a, const void *x, const void *y, const void *dy,
                             void *dx, int64_t n) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++) {
        bool from_x = a == FL_ACT_RELU || a == FL_ACT_HARDSWISH || a == FL_ACT_HARDSIGMOID;
        double xi = from_x ? get(t, x, i) : 0;
        double yi = a == FL_ACT_TANH || a == FL_ACT_SIGMOID ? get(t, y, i) : 0;
        put(t, dx, i, get(t, dy, i) * act_grad(a, xi, yi));
    }
}

static void ref_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, y, i, get(t, y, i) + a * get(t, x, i));
}

static void ref_scale(fl_dtype t, int64_t n, double a, void *x) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, x, i, a * get(t, x, i));
}

static double ref_sum(fl_dtype t, const void *x, int64_t n) {
    ASSERT_ACT(t);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += get(t, x, i);
    return s;
}

static double ref_sumsq(fl_dtype t, const void *x, int64_t n) {
    ASSERT_ACT(t);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += get(t, x, i) * get(t, x, i);
    return s;
}

static double ref_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                       void *probs, int64_t rows, int64_t classes) {
    ASSERT_FLOAT(t);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = r * classes;
        FL_ASSERT(labels[r] >= 0 && labels[r] < classes);
        double mx = get(t, logits, off);
        for (int64_t j = 1; j < classes; j++)
            mx = fmax(mx, get(t, logits, off + j));
        double s = 0;
        for (int64_t j = 0; j < classes; j++)
            s += exp(get(t, logits, off + j) - mx);
        total += log(s) + mx - get(t, logits, off + labels[r]);
        for (int64_t j = 0; j < classes; j++)
            put(t, probs, off + j, exp(get(t, logits, off + j) - mx) / s);
    }
    return total;
}

static void ref_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                                      void *dlogits, int64_t rows, int64_t classes,
                                      double scale) {
    ASSERT_FLOAT(t);
    for (int64_t r = 0; r < rows; r++) {
        FL_ASSERT(labels[r] >= 0 && labels[r] < classes);
        for (int64_t j = 0; j < classes; j++) {
            int64_t i = r * classes + j;
            double onehot = j == labels[r] ? 1 : 0;
            put(t, dlogits, i, scale * (get(t, probs, i) - onehot));
        }
    }
}

static void ref_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd) {
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++) {
        double wi = get(t, w, i);
        put(t, w, i, wi - lr * (get(t, g, i) + wd * wi));
    }
}

static void ref_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v,
                                double lr, double mu, double wd, bool nesterov) {
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++) {
        double wi = get(t, w, i);
        double d = get(t, g, i) + wd * wi;
        double vi = mu * get(t, v, i) + d;
        put(t, v, i, vi);
        put(t, w, i, wi - lr * (nesterov ? d + mu * vi : vi));
    }
}

/* The reference rounding: a cast to f16 / bf16 and back through core/half.c's conversions. */
static void ref_amp_round(fl_dtype low, int64_t n, float *x) {
    FL_ASSERT(low == FL_DTYPE_F16 || low == FL_DTYPE_BF16);
    for (int64_t i = 0; i < n; i++)
        x[i] = low == FL_DTYPE_F16 ? fl_f16_to_f32(fl_f32_to_f16(x[i]))
                                   : fl_bf16_to_f32(fl_f32_to_bf16(x[i]));
}

/* Element (i, ch, p) of an (N, C, HW) tensor in layout l: its index. */
static inline int64_t at(fl_layout l, int64_t c, int64_t hw, int64_t i, int64_t ch, int64_t p) {
    return l == FL_LAYOUT_NHWC ? (i * hw + p) * c + ch : (i * c + ch) * hw + p;
}

static void ref_channel_mul_forward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                                    const void *x, const void *s, void *y) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = at(l, c, hw, i, ch, p);
                put(t, y, e, get(t, x, e) * get(t, s, i * c + ch));
            }
}

static void ref_channel_mul_backward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                                     const void *x, const void *s, const void *dy, void *dx,
                                     void *ds) {
    ASSERT_ACT(t);
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++) {
            double acc = 0;
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = at(l, c, hw, i, ch, p);
                acc += get(t, dy, e) * get(t, x, e);
                if (dx)
                    put(t, dx, e, get(t, dy, e) * get(t, s, i * c + ch));
            }
            if (ds)
                put(t, ds, i * c + ch, acc);
        }
}

/* --- what the cpu table's loops do for f32 / f64 and ref_lowp.c for f16 / bf16 --- */

static void ref_fill(fl_dtype t, void *x, int64_t n, double v) {
    if (ref_lowp_is(t))
        ref_lowp_fill(t, x, n, v);
    else
        cpu_fill(t, x, n, v);
}

static void ref_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                        const void *src, void *dst) {
    if (ref_lowp_is(t))
        ref_lowp_reorder(t, to_nhwc, n, c, hw, src, dst);
    else
        cpu_reorder(t, to_nhwc, n, c, hw, src, dst);
}

static void ref_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                            bool relu) {
    if (ref_lowp_is(t))
        ref_lowp_add_forward(t, a, b, y, n, relu);
    else
        cpu_add_forward(t, a, b, y, n, relu);
}

static void ref_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                             int64_t n, bool relu) {
    if (ref_lowp_is(t))
        ref_lowp_add_backward(t, y, dy, da, db, n, relu);
    else
        cpu_add_backward(t, y, dy, da, db, n, relu);
}

static void ref_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                             void *out, int64_t n) {
    if (ref_lowp_is(t))
        ref_lowp_dropout_mask(t, seed, step, p, in, out, n);
    else
        cpu_dropout_mask(t, seed, step, p, in, out, n);
}

static void ref_channel_pad(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t h, int64_t w,
                            int64_t stride, int64_t oc, void *x, void *y, bool forward) {
    if (ref_lowp_is(t))
        ref_lowp_channel_pad(t, l, n, c, h, w, stride, oc, x, y, forward);
    else
        cpu_channel_pad(t, l, n, c, h, w, stride, oc, x, y, forward);
}

static void ref_channel_slice(fl_dtype t, fl_layout l, int64_t n, int64_t hw, int64_t c, void *x,
                              int64_t oc, int64_t off, void *y, bool forward) {
    if (ref_lowp_is(t))
        ref_lowp_channel_slice(t, l, n, hw, c, x, oc, off, y, forward);
    else
        cpu_channel_slice(t, l, n, hw, c, x, oc, off, y, forward);
}

static void ref_pool_forward(fl_dtype t, fl_layout l, fl_pool pool, int64_t n,
                             const fl_conv_geom *g, const void *x, void *y) {
    if (ref_lowp_is(t))
        ref_lowp_pool_forward(t, l, pool, n, g, x, y);
    else
        cpu_pool_forward(t, l, pool, n, g, x, y);
}

static void ref_pool_backward(fl_dtype t, fl_layout l, fl_pool pool, int64_t n,
                              const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    if (ref_lowp_is(t))
        ref_lowp_pool_backward(t, l, pool, n, g, x, dy, dx);
    else
        cpu_pool_backward(t, l, pool, n, g, x, dy, dx);
}

static void ref_bn_forward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                           const void *x, const void *gamma, const void *beta, double eps,
                           bool training, double *mean, double *var, fl_act act, void *y) {
    if (ref_lowp_is(t))
        ref_lowp_bn_forward(t, l, n, c, hw, x, gamma, beta, eps, training, mean, var, act, y);
    else
        cpu_bn_forward(t, l, n, c, hw, x, gamma, beta, eps, training, mean, var, act, y);
}

static void ref_bn_backward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                            const void *x, fl_act act, const void *y, const void *dy,
                            const void *gamma, const void *beta, const double *mean,
                            const double *var, double eps, bool training, void *dx,
                            void *dgamma, void *dbeta, bool accumulate) {
    if (ref_lowp_is(t))
        ref_lowp_bn_backward(t, l, n, c, hw, x, act, y, dy, gamma, beta, mean, var, eps,
                             training, dx, dgamma, dbeta, accumulate);
    else
        cpu_bn_backward(t, l, n, c, hw, x, act, y, dy, gamma, beta, mean, var, eps, training,
                        dx, dgamma, dbeta, accumulate);
}

/* f32 / f64: conv.c's im2col + gemm on this table's gemm, NCHW; f16 / bf16: a plan that holds
 * the descriptor for ref_lowp.c's direct loops, either layout */
static fl_conv_plan *ref_conv_plan_create(const fl_conv_desc *d) {
    if (!ref_lowp_is(d->dtype))
        return cpu_conv_plan_create_with(fl_backend_ref(), d, false);
    if (fl_conv_desc_check_low(d, "ref conv") < 0)
        return NULL;
    return cpu_conv_plan_hold(d);
}

static void ref_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                             const void *bias, void *y, void *scratch) {
    const fl_conv_desc *d = cpu_conv_plan_desc(p);
    if (ref_lowp_is(d->dtype))
        ref_lowp_conv_forward(d, n, x, w, bias, y);
    else
        cpu_conv_forward(p, n, x, w, bias, y, scratch);
}

static void ref_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                                   void *dx, void *scratch) {
    const fl_conv_desc *d = cpu_conv_plan_desc(p);
    if (ref_lowp_is(d->dtype))
        ref_lowp_conv_backward_data(d, n, dy, w, dx);
    else
        cpu_conv_backward_data(p, n, dy, w, dx, scratch);
}

static void ref_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                     void *dw, void *dbias, bool accumulate, void *scratch) {
    const fl_conv_desc *d = cpu_conv_plan_desc(p);
    if (ref_lowp_is(d->dtype))
        ref_lowp_conv_backward_filter(d, n, x, dy, dw, dbias, accumulate);
    else
        cpu_conv_backward_filter(p, n, x, dy, dw, dbias, accumulate, scratch);
}

static const fl_backend ref_ops = {
    .name = "ref",
    CPU_BACKEND_SHARED,
    .low_dtypes = true,
    .convert = ref_lowp_convert,
    .fill = ref_fill,
    .reorder = ref_reorder,
    .add_forward = ref_add_forward,
    .add_backward = ref_add_backward,
    .dropout_mask = ref_dropout_mask,
    .channel_pad = ref_channel_pad,
    .channel_slice = ref_channel_slice,
    .gemm = ref_gemm,
    .add_bias = ref_add_bias,
    .sum_rows = ref_sum_rows,
    .act_forward = ref_act_forward,
    .act_backward = ref_act_backward,
    .axpy = ref_axpy,
    .scale = ref_scale,
    .amp_round = ref_amp_round,
    .sum = ref_sum,
    .sumsq = ref_sumsq,
    .softmax_xent_forward = ref_softmax_xent_forward,
    .softmax_xent_backward = ref_softmax_xent_backward,
    .sgd_update = ref_sgd_update,
    .momentum_update = ref_momentum_update,
    /* window and batch-norm loops: for f32 / f64 the same plain loops as the cpu table
     * (backend_private.h), for f16 / bf16 ref_lowp.c's */
    .conv_plan_create = ref_conv_plan_create,
    .conv_plan_free = cpu_conv_plan_free,
    .conv_scratch_bytes = cpu_conv_scratch_bytes,
    .conv_forward = ref_conv_forward,
    .conv_backward_data = ref_conv_backward_data,
    .conv_backward_filter = ref_conv_backward_filter,
    .pool_forward = ref_pool_forward,
    .pool_backward = ref_pool_backward,
    .bn_forward = ref_bn_forward,
    .bn_backward = ref_bn_backward,
    .bn_running = cpu_bn_running,
    .channel_mul_forward = ref_channel_mul_forward,
    .channel_mul_backward = ref_channel_mul_backward,
};

const fl_backend *fl_backend_ref(void) { return &ref_ops; }
