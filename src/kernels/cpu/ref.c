/* ref.c - the fl_backend_ref() table: the plainest loops that implement kernels.h, single-
 * threaded, sums in double (gemm: each element one sum, in order). Slow on purpose; it is what
 * the tests hold the fast table to, so every line should be obviously right. */
#include "backend_private.h"
#include "fleet/backend.h"
#include "fleet/status.h"

#include <math.h>

#define ASSERT_FLOAT(t) FL_ASSERT((t) == FL_DTYPE_F32 || (t) == FL_DTYPE_F64)

/* Element i of a float or double array, as a double; and a store back in the array's dtype. */
static inline double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static inline void put(fl_dtype t, void *p, int64_t i, double v) {
    if (t == FL_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* s[j] += aip * b[p * ldb + j0 + j] for j < nj, in double: row p of b (K, N) times a(i, p), into
 * the running sums of nj elements of c's row i (ref_gemm, below). */
static inline void acc_row(double *s, int64_t nj, double aip, fl_dtype t, const void *b,
                           int64_t off) {
    if (t == FL_DTYPE_F32) {
        const float *bf = (const float *)b + off;
#pragma omp simd
        for (int64_t j = 0; j < nj; j++)
            s[j] += aip * (double)bf[j];
    } else {
        const double *bd = (const double *)b + off;
#pragma omp simd
        for (int64_t j = 0; j < nj; j++)
            s[j] += aip * bd[j];
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
    ASSERT_FLOAT(t);
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

static void ref_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    ASSERT_FLOAT(t);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            put(t, y, r * cols + j, get(t, y, r * cols + j) + get(t, bias, j));
}

static void ref_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                         bool accumulate) {
    ASSERT_FLOAT(t);
    for (int64_t j = 0; j < cols; j++) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++)
            s += get(t, dy, r * cols + j);
        put(t, db, j, (accumulate ? get(t, db, j) : 0) + s);
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
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, y, i, act(a, get(t, x, i)));
}

static void ref_act_backward(fl_dtype t, fl_act a, const void *x, const void *y, const void *dy,
                             void *dx, int64_t n) {
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++) {
        bool from_x = a == FL_ACT_RELU || a == FL_ACT_HARDSWISH || a == FL_ACT_HARDSIGMOID;
        double xi = from_x ? get(t, x, i) : 0;
        double yi = a == FL_ACT_TANH || a == FL_ACT_SIGMOID ? get(t, y, i) : 0;
        put(t, dx, i, get(t, dy, i) * act_grad(a, xi, yi));
    }
}

static void ref_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, y, i, get(t, y, i) + a * get(t, x, i));
}

static void ref_scale(fl_dtype t, int64_t n, double a, void *x) {
    ASSERT_FLOAT(t);
    for (int64_t i = 0; i < n; i++)
        put(t, x, i, a * get(t, x, i));
}

static double ref_sum(fl_dtype t, const void *x, int64_t n) {
    ASSERT_FLOAT(t);
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += get(t, x, i);
    return s;
}

static double ref_sumsq(fl_dtype t, const void *x, int64_t n) {
    ASSERT_FLOAT(t);
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
    ASSERT_FLOAT(t);
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
    ASSERT_FLOAT(t);
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

static fl_conv_plan *ref_conv_plan_create(const fl_conv_desc *d) {
    return cpu_conv_plan_create_with(fl_backend_ref(), d, false);
}

static const fl_backend ref_ops = {
    .name = "ref",
    CPU_BACKEND_SHARED,
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
    /* window and batch-norm loops: the same plain loops as the cpu table (backend_private.h) */
    .conv_plan_create = ref_conv_plan_create,
    .conv_plan_free = cpu_conv_plan_free,
    .conv_scratch_bytes = cpu_conv_scratch_bytes,
    .conv_forward = cpu_conv_forward,
    .conv_backward_data = cpu_conv_backward_data,
    .conv_backward_filter = cpu_conv_backward_filter,
    .pool_forward = cpu_pool_forward,
    .pool_backward = cpu_pool_backward,
    .bn_forward = cpu_bn_forward,
    .bn_backward = cpu_bn_backward,
    .channel_mul_forward = ref_channel_mul_forward,
    .channel_mul_backward = ref_channel_mul_backward,
};

const fl_backend *fl_backend_ref(void) { return &ref_ops; }
