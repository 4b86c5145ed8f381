/* onednn_bn.c - batch norm on f32 through oneDNN's batch normalization primitive (Ioffe &
 * Szegedy 2015, arXiv:1502.03167), in either layout; gamma and beta go in as oneDNN's separate
 * scale and shift. The fused ReLU: oneDNN's fuse_norm_relu in inference; in training it would
 * need a workspace kept from forward to backward, so the forward applies the ReLU after the
 * primitive and the backward masks dy by the ReLU's output before it. Primitives are created
 * per call and found again in oneDNN's primitive cache (1024 entries by default). Statistics
 * are double in fleet's API and float in oneDNN's: converted on the way. */
#include "onednn_impl.h"

#include "kernels/relu_mask.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The data descriptor of x (N, C, HW) in layout: as (N, C, HW, 1), so nhwc is (N, HW, C). */
static dnnl_memory_desc_t data_md(fl_layout layout, int64_t n, int64_t c, int64_t hw) {
    return onednn_act_md(layout, n, c, hw, 1);
}

static unsigned bn_flags(bool training) {
    return dnnl_use_scale | dnnl_use_shift | (training ? 0u : (unsigned)dnnl_use_global_stats);
}

void onednn_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                       const void *x, const void *gamma, const void *beta, double eps,
                       bool training, double *mean, double *var, bool relu, void *y) {
    if (t != FL_DTYPE_F32) {
        onednn_cpu()->bn_forward(t, layout, n, c, hw, x, gamma, beta, eps, training, mean, var,
                                 relu, y);
        return;
    }
    if (n == 0 || c == 0 || hw == 0)
        return;
    dnnl_memory_desc_t md = data_md(layout, n, c, hw), cmd = onednn_vec_md(c);
    /* inference fuses the ReLU (no workspace then); training applies it below */
    unsigned flags = bn_flags(training) | (relu && !training ? (unsigned)dnnl_fuse_norm_relu : 0u);
    dnnl_batch_normalization_desc_t bd;
    DNNL_MUST(dnnl_batch_normalization_forward_desc_init(
        &bd, training ? dnnl_forward_training : dnnl_forward_inference, &md, (float)eps, flags));
    dnnl_primitive_t prim;
    if (onednn_create(&prim, &bd, NULL, NULL, NULL, "batch norm forward") < 0) {
        fprintf(stderr, "fleet: %s\n", fl_errmsg());
        FL_ASSERT(!"onednn batch norm forward: no implementation");
    }
    float *m = onednn_tls_buf(2 * (size_t)c * sizeof(float)), *v = m + c;
    if (!training)
        for (int64_t i = 0; i < c; i++)
            m[i] = (float)mean[i], v[i] = (float)var[i];
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &md, x);
    onednn_arg(&a, DNNL_ARG_DST, &md, y);
    onednn_arg(&a, DNNL_ARG_SCALE, &cmd, gamma);
    onednn_arg(&a, DNNL_ARG_SHIFT, &cmd, beta);
    onednn_arg(&a, DNNL_ARG_MEAN, &cmd, m);
    onednn_arg(&a, DNNL_ARG_VARIANCE, &cmd, v);
    onednn_run(prim, &a);
    dnnl_primitive_destroy(prim);
    if (training) {
        for (int64_t i = 0; i < c; i++)
            mean[i] = m[i], var[i] = v[i];
        if (relu)
            onednn_cpu()->act_forward(t, FL_ACT_RELU, y, y, n * c * hw);
    }
}

/* dgamma, dbeta by hand, for a backward without dx (oneDNN's always computes dx, which would
 * need an activation-sized buffer): one pass in double, channels in the inner loop. */
static void param_grads(fl_layout layout, int64_t n, int64_t c, int64_t hw, const float *x,
                        const float *ry, const float *dy, const double *mean, const double *var,
                        double eps, float *dgamma, float *dbeta, bool accumulate) {
    double *sd = onednn_tls_buf(2 * (size_t)c * sizeof(double)), *sdx = sd + c;
    memset(sd, 0, 2 * (size_t)c * sizeof(double));
    for (int64_t b = 0; b < n; b++)
        for (int64_t i = 0; i < hw; i++)
            for (int64_t ch = 0; ch < c; ch++) {
                int64_t k = layout == FL_LAYOUT_NHWC ? (b * hw + i) * c + ch
                                                     : (b * c + ch) * hw + i;
                double d = ry ? keep_f32(ry[k], dy[k]) : dy[k];
                sd[ch] += d;
                sdx[ch] += d * ((double)x[k] - mean[ch]);
            }
    for (int64_t ch = 0; ch < c; ch++) {
        double g = sdx[ch] / sqrt(var[ch] + eps);
        dgamma[ch] = (float)((accumulate ? (double)dgamma[ch] : 0.0) + g);
        dbeta[ch] = (float)((accumulate ? (double)dbeta[ch] : 0.0) + sd[ch]);
    }
}

void onednn_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                        const void *x, const void *relu_y, const void *dy, const void *gamma,
                        const double *mean, const double *var, double eps, bool training,
                        void *dx, void *dgamma, void *dbeta, bool accumulate) {
    if (t != FL_DTYPE_F32) {
        onednn_cpu()->bn_backward(t, layout, n, c, hw, x, relu_y, dy, gamma, mean, var, eps,
                                  training, dx, dgamma, dbeta, accumulate);
        return;
    }
    if (c == 0)
        return;
    int64_t total = n * c * hw;
    if (!dx || total == 0) {
        param_grads(layout, n, c, hw, x, relu_y, dy, mean, var, eps, dgamma, dbeta, accumulate);
        return;
    }
    /* the ReLU's gradient first, into dx; the primitive then runs in place on dx */
    const float *d = dy;
    if (relu_y) {
        const float *ry = relu_y, *g = dy;
        float *o = dx;
#pragma omp parallel for simd schedule(static) if (total >= 32768)
        for (int64_t i = 0; i < total; i++)
            o[i] = keep_f32(ry[i], g[i]);
        d = dx;
    }
    dnnl_memory_desc_t md = data_md(layout, n, c, hw), cmd = onednn_vec_md(c);
    unsigned flags = bn_flags(training);
    dnnl_batch_normalization_desc_t fd, bd;
    DNNL_MUST(dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &md,
                                                         (float)eps, flags));
    DNNL_MUST(dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &md, &md,
                                                          (float)eps, flags));
    dnnl_primitive_desc_t hint = NULL;
    dnnl_primitive_t prim = NULL;
    if (dnnl_primitive_desc_create(&hint, &fd, NULL, onednn_engine(), NULL) != dnnl_success ||
        onednn_create(&prim, &bd, NULL, hint, NULL, "batch norm backward") < 0) {
        fprintf(stderr, "fleet: %s\n", fl_errmsg());
        FL_ASSERT(!"onednn batch norm backward: no implementation");
    }
    dnnl_primitive_desc_destroy(hint);
    /* (C) each: mean, var as float; a shift of zeros (oneDNN 2.6 wants the shift argument in
     * the backward with use_shift, though the gradients do not depend on it); dgamma, dbeta
     * before they are added */
    float *m = onednn_tls_buf(5 * (size_t)c * sizeof(float)), *v = m + c, *shift = v + c;
    float *dg = accumulate ? shift + c : dgamma, *db = accumulate ? shift + 2 * c : dbeta;
    for (int64_t i = 0; i < c; i++)
        m[i] = (float)mean[i], v[i] = (float)var[i], shift[i] = 0;
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &md, x);
    onednn_arg(&a, DNNL_ARG_MEAN, &cmd, m);
    onednn_arg(&a, DNNL_ARG_VARIANCE, &cmd, v);
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &md, d);
    onednn_arg(&a, DNNL_ARG_SCALE, &cmd, gamma);
    onednn_arg(&a, DNNL_ARG_SHIFT, &cmd, shift);
    onednn_arg(&a, DNNL_ARG_DIFF_SRC, &md, dx);
    onednn_arg(&a, DNNL_ARG_DIFF_SCALE, &cmd, dg);
    onednn_arg(&a, DNNL_ARG_DIFF_SHIFT, &cmd, db);
    onednn_run(prim, &a);
    dnnl_primitive_destroy(prim);
    if (accumulate) {
        float *g = dgamma, *b = dbeta;
        for (int64_t i = 0; i < c; i++)
            g[i] += dg[i], b[i] += db[i];
    }
}
