/* devsim_ops.c - devsim's compute ops (devsim.h): each checks that its data pointers are backend
 * memory of the extent it will touch (devsim.c's ds_check_dev; host memory where the contract
 * says host) and runs the underlying table's kernel with those pages open (ds_enter/ds_leave).
 * The extents follow backend.h's contracts, low dtypes included (what stays f32 beside them). */
#include "devsim.h"
#include "devsim_impl.h"

#include <stdint.h>

/* the table whose kernels run (devsim_table.c chooses: cpu or ref) */
static const fl_backend *under;

static size_t es(fl_dtype t) { return fl_dtype_size(t); }
/* the element size of what stays f32 when t is a low dtype (biases, batch norm's scale and
 * shift and their gradients; backend.h "Low dtypes"), else of t */
static size_t side(fl_dtype t) {
    return t == FL_DTYPE_F16 || t == FL_DTYPE_BF16 ? sizeof(float) : es(t);
}
static size_t nb(int64_t n, size_t size) { return n > 0 ? (size_t)n * size : 0; }
/* extent of a (rows, cols) matrix with leading dimension ld */
static size_t mat(int64_t rows, int64_t cols, int64_t ld, size_t size) {
    return rows > 0 && cols > 0 ? ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * size : 0;
}

/* Wraps a void table function: checks, then the kernel with memory open. */
#define RUN(call)                                                                              \
    do {                                                                                       \
        ds_enter();                                                                               \
        under->call;                                                                           \
        ds_leave();                                                                               \
    } while (0)
#define RUN_RET(type, call)                                                                    \
    do {                                                                                       \
        ds_enter();                                                                               \
        type r_ = under->call;                                                                 \
        ds_leave();                                                                               \
        return r_;                                                                             \
    } while (0)

static void ds_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n) {
    ds_check_dev("convert", "src", src, nb(n, es(from)));
    ds_check_dev("convert", "dst", dst, nb(n, es(to)));
    RUN(convert(from, src, to, dst, n));
}

static void ds_fill(fl_dtype t, void *x, int64_t n, double v) {
    ds_check_dev("fill", "x", x, nb(n, es(t)));
    RUN(fill(t, x, n, v));
}

static void ds_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                       const void *src, void *dst) {
    size_t b = nb(n * c * hw, es(t));
    ds_check_dev("reorder", "src", src, b);
    ds_check_dev("reorder", "dst", dst, b);
    RUN(reorder(t, to_nhwc, n, c, hw, src, dst));
}

static void ds_gemm(fl_dtype t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                    double beta, void *c, int64_t ldc) {
    size_t s = es(t);
    if (m > 0 && n > 0) {
        ds_check_dev("gemm", "a", a, ta ? mat(k, m, lda, s) : mat(m, k, lda, s));
        ds_check_dev("gemm", "b", b, tb ? mat(n, k, ldb, s) : mat(k, n, ldb, s));
    }
    ds_check_dev("gemm", "c", c, mat(m, n, ldc, s));
    RUN(gemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

static void ds_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    ds_check_dev("add_bias", "y", y, nb(rows * cols, es(t)));
    if (rows > 0)
        ds_check_dev("add_bias", "bias", bias, nb(cols, side(t)));
    RUN(add_bias(t, y, bias, rows, cols));
}

static void ds_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                        bool acc) {
    ds_check_dev("sum_rows", "dy", dy, nb(rows * cols, es(t)));
    ds_check_dev("sum_rows", "db", db, nb(cols, side(t)));
    RUN(sum_rows(t, dy, db, rows, cols, acc));
}

static void ds_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n) {
    ds_check_dev("act_forward", "x", x, nb(n, es(t)));
    ds_check_dev("act_forward", "y", y, nb(n, es(t)));
    RUN(act_forward(t, act, x, y, n));
}

static void ds_act_backward(fl_dtype t, fl_act act, const void *x, const void *y,
                            const void *dy, void *dx, int64_t n) {
    if (x)
        ds_check_dev("act_backward", "x", x, nb(n, es(t)));
    if (y)
        ds_check_dev("act_backward", "y", y, nb(n, es(t)));
    ds_check_dev("act_backward", "dy", dy, nb(n, es(t)));
    ds_check_dev("act_backward", "dx", dx, nb(n, es(t)));
    RUN(act_backward(t, act, x, y, dy, dx, n));
}

static void ds_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    ds_check_dev("axpy", "x", x, nb(n, es(t)));
    ds_check_dev("axpy", "y", y, nb(n, es(t)));
    RUN(axpy(t, n, a, x, y));
}

static void ds_scale(fl_dtype t, int64_t n, double a, void *x) {
    ds_check_dev("scale", "x", x, nb(n, es(t)));
    RUN(scale(t, n, a, x));
}

static void ds_amp_round(fl_dtype low, int64_t n, float *x) {
    ds_check_dev("amp_round", "x", x, nb(n, sizeof(float)));
    RUN(amp_round(low, n, x));
}

static double ds_sum(fl_dtype t, const void *x, int64_t n) {
    ds_check_dev("sum", "x", x, nb(n, es(t)));
    RUN_RET(double, sum(t, x, n));
}

static double ds_sumsq(fl_dtype t, const void *x, int64_t n) {
    ds_check_dev("sumsq", "x", x, nb(n, es(t)));
    RUN_RET(double, sumsq(t, x, n));
}

static double ds_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                      void *probs, int64_t rows, int64_t classes) {
    const char *fn = "softmax_xent_forward";
    ds_check_dev(fn, "logits", logits, nb(rows * classes, es(t)));
    ds_check_dev(fn, "labels", labels, nb(rows, sizeof *labels));
    ds_check_dev(fn, "probs", probs, nb(rows * classes, es(t)));
    RUN_RET(double, softmax_xent_forward(t, logits, labels, probs, rows, classes));
}

static void ds_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                                     void *dlogits, int64_t rows, int64_t classes,
                                     double scale) {
    const char *fn = "softmax_xent_backward";
    ds_check_dev(fn, "probs", probs, nb(rows * classes, es(t)));
    ds_check_dev(fn, "labels", labels, nb(rows, sizeof *labels));
    ds_check_dev(fn, "dlogits", dlogits, nb(rows * classes, es(t)));
    RUN(softmax_xent_backward(t, probs, labels, dlogits, rows, classes, scale));
}

static void ds_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd) {
    ds_check_dev("sgd_update", "w", w, nb(n, es(t)));
    ds_check_dev("sgd_update", "g", g, nb(n, es(t)));
    RUN(sgd_update(t, n, w, g, lr, wd));
}

static void ds_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v,
                               double lr, double mu, double wd, bool nesterov) {
    ds_check_dev("momentum_update", "w", w, nb(n, es(t)));
    ds_check_dev("momentum_update", "g", g, nb(n, es(t)));
    ds_check_dev("momentum_update", "v", v, nb(n, es(t)));
    RUN(momentum_update(t, n, w, g, v, lr, mu, wd, nesterov));
}

/* --- convolution: plans are host objects; the data pointers are checked by their start --- */

static fl_conv_plan *ds_conv_plan_create(const fl_conv_desc *d) {
    ds_check_host("conv_plan_create", "d", d);
    return under->conv_plan_create(d);
}

static void ds_conv_plan_free(fl_conv_plan *p) { under->conv_plan_free(p); }

static size_t ds_conv_scratch_bytes(const fl_conv_plan *p) {
    return under->conv_scratch_bytes(p);
}

static void ds_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                            const void *bias, void *y, void *scratch) {
    size_t one = n > 0 ? SPAN_UNKNOWN : 0;
    ds_check_dev("conv_forward", "x", x, one);
    ds_check_dev("conv_forward", "w", w, one);
    if (bias)
        ds_check_dev("conv_forward", "bias", bias, one);
    ds_check_dev("conv_forward", "y", y, one);
    if (scratch)
        ds_check_dev("conv_forward", "scratch", scratch, one);
    RUN(conv_forward(p, n, x, w, bias, y, scratch));
}

static void ds_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                                  void *dx, void *scratch) {
    size_t one = n > 0 ? SPAN_UNKNOWN : 0;
    ds_check_dev("conv_backward_data", "dy", dy, one);
    ds_check_dev("conv_backward_data", "w", w, one);
    ds_check_dev("conv_backward_data", "dx", dx, one);
    if (scratch)
        ds_check_dev("conv_backward_data", "scratch", scratch, one);
    RUN(conv_backward_data(p, n, dy, w, dx, scratch));
}

static void ds_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                    void *dw, void *dbias, bool acc, void *scratch) {
    ds_check_dev("conv_backward_filter", "x", x, n > 0 ? SPAN_UNKNOWN : 0);
    ds_check_dev("conv_backward_filter", "dy", dy, n > 0 ? SPAN_UNKNOWN : 0);
    ds_check_dev("conv_backward_filter", "dw", dw, SPAN_UNKNOWN);
    if (dbias)
        ds_check_dev("conv_backward_filter", "dbias", dbias, SPAN_UNKNOWN);
    if (scratch)
        ds_check_dev("conv_backward_filter", "scratch", scratch, n > 0 ? SPAN_UNKNOWN : 0);
    RUN(conv_backward_filter(p, n, x, dy, dw, dbias, acc, scratch));
}

/* --- pooling, batch norm, the small layers --- */

static void ds_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                            const fl_conv_geom *g, const void *x, void *y) {
    ds_check_host("pool_forward", "g", g);
    ds_check_dev("pool_forward", "x", x, nb(n * g->c * g->h * g->w, es(t)));
    ds_check_dev("pool_forward", "y", y, nb(n * g->c * g->oh * g->ow, es(t)));
    RUN(pool_forward(t, layout, pool, n, g, x, y));
}

static void ds_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                             const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    ds_check_host("pool_backward", "g", g);
    ds_check_dev("pool_backward", "x", x, nb(n * g->c * g->h * g->w, es(t)));
    ds_check_dev("pool_backward", "dy", dy, nb(n * g->c * g->oh * g->ow, es(t)));
    ds_check_dev("pool_backward", "dx", dx, nb(n * g->c * g->h * g->w, es(t)));
    RUN(pool_backward(t, layout, pool, n, g, x, dy, dx));
}

static void ds_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                          const void *x, const void *gamma, const void *beta, double eps,
                          bool training, double *mean, double *var, fl_act act, void *y) {
    const char *fn = "bn_forward";
    ds_check_dev(fn, "x", x, nb(n * c * hw, es(t)));
    ds_check_dev(fn, "gamma", gamma, nb(c, side(t)));
    ds_check_dev(fn, "beta", beta, nb(c, side(t)));
    ds_check_dev(fn, "mean", mean, nb(c, sizeof *mean));
    ds_check_dev(fn, "var", var, nb(c, sizeof *var));
    ds_check_dev(fn, "y", y, nb(n * c * hw, es(t)));
    RUN(bn_forward(t, layout, n, c, hw, x, gamma, beta, eps, training, mean, var, act, y));
}

static void ds_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                           const void *x, fl_act a, const void *y, const void *dy,
                           const void *gamma, const void *beta, const double *mean,
                           const double *var, double eps, bool training, void *dx, void *dgamma,
                           void *dbeta, bool acc) {
    const char *fn = "bn_backward";
    size_t act = nb(n * c * hw, es(t)), ch = nb(c, side(t));
    ds_check_dev(fn, "x", x, act);
    if (a == FL_ACT_RELU) /* read only for the relu's mask */
        ds_check_dev(fn, "y", y, act);
    ds_check_dev(fn, "dy", dy, act);
    ds_check_dev(fn, "gamma", gamma, ch);
    ds_check_dev(fn, "beta", beta, ch);
    ds_check_dev(fn, "mean", mean, nb(c, sizeof *mean));
    ds_check_dev(fn, "var", var, nb(c, sizeof *var));
    if (dx)
        ds_check_dev(fn, "dx", dx, act);
    ds_check_dev(fn, "dgamma", dgamma, ch);
    ds_check_dev(fn, "dbeta", dbeta, ch);
    RUN(bn_backward(t, layout, n, c, hw, x, a, y, dy, gamma, beta, mean, var, eps, training, dx,
                    dgamma, dbeta, acc));
}

static void ds_bn_running(fl_dtype t, int64_t c, const double *mean, const double *var,
                          double count, double momentum, void *rm, void *rv) {
    const char *fn = "bn_running";
    ds_check_dev(fn, "mean", mean, nb(c, sizeof *mean));
    ds_check_dev(fn, "var", var, nb(c, sizeof *var));
    ds_check_dev(fn, "running_mean", rm, nb(c, es(t)));
    ds_check_dev(fn, "running_var", rv, nb(c, es(t)));
    RUN(bn_running(t, c, mean, var, count, momentum, rm, rv));
}

static void ds_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                           bool relu) {
    ds_check_dev("add_forward", "a", a, nb(n, es(t)));
    ds_check_dev("add_forward", "b", b, nb(n, es(t)));
    ds_check_dev("add_forward", "y", y, nb(n, es(t)));
    RUN(add_forward(t, a, b, y, n, relu));
}

static void ds_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                            int64_t n, bool relu) {
    if (y || relu)
        ds_check_dev("add_backward", "y", y, nb(n, es(t)));
    ds_check_dev("add_backward", "dy", dy, nb(n, es(t)));
    if (da)
        ds_check_dev("add_backward", "da", da, nb(n, es(t)));
    if (db)
        ds_check_dev("add_backward", "db", db, nb(n, es(t)));
    RUN(add_backward(t, y, dy, da, db, n, relu));
}

static void ds_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                            void *out, int64_t n) {
    ds_check_dev("dropout_mask", "in", in, nb(n, es(t)));
    ds_check_dev("dropout_mask", "out", out, nb(n, es(t)));
    RUN(dropout_mask(t, seed, step, p, in, out, n));
}

static void ds_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h,
                           int64_t w, int64_t stride, int64_t oc, void *x, void *y, bool fwd) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    ds_check_dev("channel_pad", "x", x, nb(n * c * h * w, es(t)));
    ds_check_dev("channel_pad", "y", y, nb(n * oc * oh * ow, es(t)));
    RUN(channel_pad(t, layout, n, c, h, w, stride, oc, x, y, fwd));
}

static void ds_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                   int64_t hw, const void *x, const void *s, void *y) {
    ds_check_dev("channel_mul_forward", "x", x, nb(n * c * hw, es(t)));
    ds_check_dev("channel_mul_forward", "s", s, nb(n * c, es(t)));
    ds_check_dev("channel_mul_forward", "y", y, nb(n * c * hw, es(t)));
    RUN(channel_mul_forward(t, layout, n, c, hw, x, s, y));
}

static void ds_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                    int64_t hw, const void *x, const void *s, const void *dy,
                                    void *dx, void *dsc) {
    ds_check_dev("channel_mul_backward", "x", x, nb(n * c * hw, es(t)));
    ds_check_dev("channel_mul_backward", "s", s, nb(n * c, es(t)));
    ds_check_dev("channel_mul_backward", "dy", dy, nb(n * c * hw, es(t)));
    if (dx)
        ds_check_dev("channel_mul_backward", "dx", dx, nb(n * c * hw, es(t)));
    if (dsc)
        ds_check_dev("channel_mul_backward", "ds", dsc, nb(n * c, es(t)));
    RUN(channel_mul_backward(t, layout, n, c, hw, x, s, dy, dx, dsc));
}

static void ds_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c,
                             void *x, int64_t oc, int64_t off, void *y, bool fwd) {
    ds_check_dev("channel_slice", "x", x, nb(n * c * hw, es(t)));
    ds_check_dev("channel_slice", "y", y, nb(n * oc * hw, es(t)));
    RUN(channel_slice(t, layout, n, hw, c, x, oc, off, y, fwd));
}

static double ds_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows,
                                  int64_t classes) {
    ds_check_dev("xent_smooth_term", "logits", logits, nb(rows * classes, es(t)));
    RUN_RET(double, xent_smooth_term(t, logits, rows, classes));
}

static void ds_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits,
                                    int64_t rows, int64_t classes, double on, double all) {
    ds_check_dev("xent_smooth_backward", "labels", labels, nb(rows, sizeof *labels));
    ds_check_dev("xent_smooth_backward", "dlogits", dlogits, nb(rows * classes, es(t)));
    RUN(xent_smooth_backward(t, labels, dlogits, rows, classes, on, all));
}

/* --- DGC --- */

/* the arguments of DGC's accumulation (dgc_accumulate and dgc_accumulate_select) */
static void accumulate_args(const char *fn, int64_t n, const float *grad, const float *w,
                            const float *u, const float *v, const fl_dgc_accum_args *a) {
    ds_check_dev(fn, "grad", grad, nb(n, 4));
    ds_check_dev(fn, "w", w, nb(n, 4));
    if (u || a->correction)
        ds_check_dev(fn, "u", u, nb(n, 4));
    ds_check_dev(fn, "v", v, nb(n, 4));
    ds_check_host(fn, "a", a);
}

static void ds_dgc_accumulate(int64_t n, const float *grad, const float *w, float *u, float *v,
                              const fl_dgc_accum_args *a) {
    accumulate_args("dgc_accumulate", n, grad, w, u, v, a);
    RUN(dgc_accumulate(n, grad, w, u, v, a));
}

static int64_t ds_dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx,
                                   float *scratch) {
    const char *fn = "dgc_select_exact";
    ds_check_dev(fn, "v", v, nb(n, 4));
    ds_check_dev(fn, "idx", idx, nb(n, 4));
    ds_check_dev(fn, "scratch", scratch, nb(n, 4));
    RUN_RET(int64_t, dgc_select_exact(n, v, k, idx, scratch));
}

static int64_t ds_dgc_accumulate_select(int64_t n, const float *grad, const float *w, float *u,
                                        float *v, const fl_dgc_accum_args *a, int64_t k,
                                        int32_t *idx, float *scratch, uint64_t seed,
                                        float *hint, int *passes) {
    const char *fn = "dgc_accumulate_select";
    int64_t sample = n / 100 > 4096 ? n / 100 : 4096;
    accumulate_args(fn, n, grad, w, u, v, a);
    ds_check_dev(fn, "idx", idx, nb(n, 4));
    ds_check_dev(fn, "scratch", scratch, n > 0 ? nb(n + sample, 4) : 0);
    ds_check_host(fn, "hint", hint);
    ds_check_host(fn, "passes", passes);
    RUN_RET(int64_t, dgc_accumulate_select(n, grad, w, u, v, a, k, idx, scratch, seed, hint,
                                           passes));
}

static void ds_dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                          fl_dgc_pair *pairs) {
    const char *fn = "dgc_encode";
    ds_check_dev(fn, "idx", idx, nb(count, 4));
    ds_check_dev(fn, "v", v, count > 0 ? SPAN_UNKNOWN : 0);
    if (u)
        ds_check_dev(fn, "u", u, count > 0 ? SPAN_UNKNOWN : 0);
    ds_check_dev(fn, "pairs", pairs, nb(count, sizeof *pairs));
    RUN(dgc_encode(idx, count, base, v, u, pairs));
}

/* the segmented space: start and the array of segment pointers are host memory, each segment
 * backend memory */
static void segments(const char *fn, const char *arg, int nseg, const int64_t *start,
                     float *const *seg) {
    ds_check_host(fn, "start", start);
    ds_check_host(fn, arg, seg);
    for (int s = 0; s < nseg; s++)
        ds_check_dev(fn, arg, seg[s], nb(start[s + 1] - start[s], 4));
}

static int64_t ds_dgc_scatter_add(const fl_dgc_pair *pairs, int64_t n, int nseg,
                                  const int64_t *start, float *const *dst) {
    ds_check_dev("dgc_scatter_add", "pairs", pairs, nb(n, sizeof *pairs));
    segments("dgc_scatter_add", "dst", nseg, start, dst);
    RUN_RET(int64_t, dgc_scatter_add(pairs, n, nseg, start, dst));
}

static void ds_dgc_apply_pairs(const fl_dgc_pair *pairs, int64_t n, int nseg,
                               const int64_t *start, float *const *w, double step) {
    ds_check_dev("dgc_apply_pairs", "pairs", pairs, nb(n, sizeof *pairs));
    segments("dgc_apply_pairs", "w", nseg, start, w);
    RUN(dgc_apply_pairs(pairs, n, nseg, start, w, step));
}

static void ds_dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr, double inv_n,
                               double m, bool nesterov, double decay) {
    ds_check_dev("dgc_apply_dense", "w", w, nb(n, 4));
    ds_check_dev("dgc_apply_dense", "g", g, nb(n, 4));
    if (u)
        ds_check_dev("dgc_apply_dense", "u", u, nb(n, 4));
    RUN(dgc_apply_dense(n, w, g, u, lr, inv_n, m, nesterov, decay));
}

void ds_install_ops(fl_backend *t, const fl_backend *kernels) {
    under = kernels;
    t->convert = kernels->convert ? ds_convert : NULL;
    t->fill = ds_fill;
    t->reorder = ds_reorder;
    t->gemm = ds_gemm;
    t->add_bias = ds_add_bias;
    t->sum_rows = ds_sum_rows;
    t->act_forward = ds_act_forward;
    t->act_backward = ds_act_backward;
    t->axpy = ds_axpy;
    t->scale = ds_scale;
    t->amp_round = ds_amp_round;
    t->sum = ds_sum;
    t->sumsq = ds_sumsq;
    t->softmax_xent_forward = ds_softmax_xent_forward;
    t->softmax_xent_backward = ds_softmax_xent_backward;
    t->sgd_update = ds_sgd_update;
    t->momentum_update = ds_momentum_update;
    t->conv_plan_create = ds_conv_plan_create;
    t->conv_plan_free = ds_conv_plan_free;
    t->conv_scratch_bytes = ds_conv_scratch_bytes;
    t->conv_forward = ds_conv_forward;
    t->conv_backward_data = ds_conv_backward_data;
    t->conv_backward_filter = ds_conv_backward_filter;
    t->pool_forward = ds_pool_forward;
    t->pool_backward = ds_pool_backward;
    t->bn_forward = ds_bn_forward;
    t->bn_backward = ds_bn_backward;
    t->bn_running = ds_bn_running;
    t->add_forward = ds_add_forward;
    t->add_backward = ds_add_backward;
    t->dropout_mask = ds_dropout_mask;
    t->channel_pad = ds_channel_pad;
    t->channel_mul_forward = ds_channel_mul_forward;
    t->channel_mul_backward = ds_channel_mul_backward;
    t->channel_slice = ds_channel_slice;
    t->xent_smooth_term = ds_xent_smooth_term;
    t->xent_smooth_backward = ds_xent_smooth_backward;
    t->dgc_accumulate = ds_dgc_accumulate;
    t->dgc_select_exact = ds_dgc_select_exact;
    t->dgc_accumulate_select = ds_dgc_accumulate_select;
    t->dgc_encode = ds_dgc_encode;
    t->dgc_scatter_add = ds_dgc_scatter_add;
    t->dgc_apply_pairs = ds_dgc_apply_pairs;
    t->dgc_apply_dense = ds_dgc_apply_dense;
}
