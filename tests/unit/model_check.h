/* model_check.h - what the model tests share: one training step of a zoo model on backends
 * against the same step on the ref backend (test_nn_pphgnet.c, test_nn_pplcnetv2.c), and a
 * network's gradients by central differences (test_nn_pplcnet.c, test_nn_concat.c). Header
 * only, included by one test file each. */
#ifndef FLEET_TEST_MODEL_CHECK_H
#define FLEET_TEST_MODEL_CHECK_H

#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>

/* One training step of a network on its backend (built with seed 7, 3 x 32 x 32 in, 10 classes,
 * batch B; its output shape checked): logits, loss and every gradient as doubles (grads:
 * malloc'd, the caller frees). Its parameter values (all, buffers too, in order) are first
 * *vals's; with *vals NULL, those it was built with rounded to f32 ones, kept in a malloc'd
 * *vals for the next networks (f32 init draws some values otherwise than f64's: fc's). x holds
 * the NX inputs, f32 values. */
enum { MODEL_B = 4, MODEL_CLS = 10, MODEL_NX = MODEL_B * 3 * 32 * 32 };
static inline bool model_step(fl_net *net, const fl_backend *k, fl_dtype t, const double *x,
                              double **vals, double *logit, double *loss, double **grads,
                              int64_t *np) {
    int64_t shape[] = {3, 32, 32}, xs[] = {MODEL_B, 3, 32, 32};
    fl_net_set_backend(net, k);
    CHECK_OK(fl_net_build(net, 3, shape, MODEL_B, 7));
    int64_t out[FL_MAX_DIMS];
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == MODEL_CLS);
    int64_t nv = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        nv += fl_net_param(net, i)->value.numel;
    bool keep = *vals == NULL;
    if (keep)
        *vals = malloc((size_t)nv * sizeof(double));
    int64_t o = 0;
    for (int i = 0; i < fl_net_num_params(net); i++) { /* host memory: cpu backends */
        fl_param *p = fl_net_param(net, i);
        for (int64_t e = 0; e < p->value.numel; e++, o++) {
            double *d = t == FL_DTYPE_F64 ? (double *)p->value.data + e : NULL;
            float *f = t == FL_DTYPE_F32 ? (float *)p->value.data + e : NULL;
            if (keep)
                (*vals)[o] = d ? (float)*d : *f;
            if (d)
                *d = (*vals)[o];
            else
                *f = (float)(*vals)[o];
        }
    }
    size_t es = fl_dtype_size(t);
    void *xd = malloc(MODEL_NX * es);
    for (int i = 0; i < MODEL_NX; i++) {
        if (t == FL_DTYPE_F32)
            ((float *)xd)[i] = (float)x[i];
        else
            ((double *)xd)[i] = x[i];
    }
    int32_t labels[MODEL_B] = {2, 5, 5, 9};
    fl_tensor xt, probs;
    fl_tensor_view(&xt, t, 4, xs, xd);
    const fl_tensor *lg = NULL;
    CHECK_OK(fl_net_forward(net, &xt, true, &lg));
    if (!lg) {
        free(xd);
        return false;
    }
    double pm[MODEL_B * MODEL_CLS];
    for (int i = 0; i < MODEL_B * MODEL_CLS; i++)
        logit[i] = t == FL_DTYPE_F32 ? ((float *)lg->data)[i] : ((double *)lg->data)[i];
    fl_tensor_view(&probs, t, 2, lg->shape, pm);
    CHECK_OK(fl_softmax_xent_forward(k, lg, labels, &probs, loss));
    CHECK_OK(fl_softmax_xent_backward(k, &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    *np = fl_net_numel(net);
    *grads = malloc((size_t)*np * sizeof(double));
    for (int64_t i = 0; i < *np; i++)
        (*grads)[i] = t == FL_DTYPE_F32 ? ((float *)fl_net_flat_grads(net))[i]
                                        : ((double *)fl_net_flat_grads(net))[i];
    free(xd);
    return true;
}

/* One step of the model make(t, arg) builds (3 x 32 x 32 in, 10 classes, batch 4) on each of
 * the n backends k[i] in dtype t[i] against the same step on ref in f64, taken once for all
 * (the ref step was most of these tests' time): the same input (f32 values, drawn from rng)
 * and the same parameter values everywhere (ref's initial ones rounded to f32, so the f32
 * networks start where ref does); logits and loss within 1e-4 (f32) or 1e-10 (f64), and the
 * largest gradient difference under gtol[i] times the largest gradient. name labels the
 * checks. */
typedef fl_net *(*model_make_fn)(fl_dtype t, const void *arg);
static inline void model_steps_vs_ref(const char *name, model_make_fn make, const void *arg,
                                      int n, const fl_backend *const *k, const fl_dtype *t,
                                      const double *gtol, fl_rng *rng) {
    double *x = malloc(MODEL_NX * sizeof(double));
    for (int i = 0; i < MODEL_NX; i++)
        x[i] = (float)(2 * fl_rng_uniform_f64(rng) - 1);
    double ref_logit[MODEL_B * MODEL_CLS], ref_loss = 0, *ref_grads = NULL;
    int64_t ref_np = 0;
    fl_net *net = make(FL_DTYPE_F64, arg);
    CHECK(net != NULL);
    double *vals = NULL;
    bool ok = net && model_step(net, fl_backend_ref(), FL_DTYPE_F64, x, &vals, ref_logit,
                                &ref_loss, &ref_grads, &ref_np);
    fl_net_free(net);
    double mx = 0;
    for (int64_t i = 0; ok && i < ref_np; i++)
        mx = fmax(mx, fabs(ref_grads[i]));
    for (int j = 0; ok && j < n; j++) {
        double logit[MODEL_B * MODEL_CLS], loss = 0, *grads = NULL;
        int64_t np = 0;
        net = make(t[j], arg);
        CHECK(net != NULL);
        if (!net || !model_step(net, k[j], t[j], x, &vals, logit, &loss, &grads, &np)) {
            fl_net_free(net);
            continue;
        }
        fl_net_free(net);
        char label[96];
        double ltol = t[j] == FL_DTYPE_F32 ? 1e-4 : 1e-10;
        snprintf(label, sizeof label, "%s logits [%s %s vs ref f64]", name, k[j]->name,
                 fl_dtype_name(t[j]));
        CHECK_CLOSE(label, logit, ref_logit, MODEL_B * MODEL_CLS, ltol, ltol);
        CHECK_NEAR(loss, ref_loss, ltol);
        CHECK(np == ref_np);
        double worst = 0;
        for (int64_t i = 0; np == ref_np && i < np; i++)
            worst = fmax(worst, fabs(grads[i] - ref_grads[i]));
        snprintf(label, sizeof label, "%s gradients [%s %s vs ref f64]", name, k[j]->name,
                 fl_dtype_name(t[j]));
        if (np == ref_np)
            CHECK_CLOSE(label, grads, ref_grads, np, gtol[j] * mx, 0);
        fprintf(stderr, "%s: largest |difference| %.3g (largest gradient %.3g)\n", label, worst,
                mx);
        free(grads);
    }
    free(ref_grads);
    free(vals);
    free(x);
}

/* L = sum(r * net(x)), the network's output in f32 or f64 */
static inline double net_proj(fl_net *net, const fl_tensor *x, const double *r) {
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, x, true, &y));
    if (!y)
        return NAN;
    double s = 0;
    for (int64_t i = 0; i < y->numel; i++)
        s += r[i] * (fl_net_dtype(net) == FL_DTYPE_F64 ? ((const double *)y->data)[i]
                                                       : ((const float *)y->data)[i]);
    return s;
}

/* out[i] = dL/dv[i] for the n doubles at v (parameters or input values the network reads), by
 * central differences with step eps; v is left as it was */
static inline void fd_grads(fl_net *net, const fl_tensor *x, const double *r, double *v,
                            int64_t n, double eps, double *out) {
    for (int64_t i = 0; i < n; i++) {
        double keep = v[i];
        v[i] = keep + eps;
        double lp = net_proj(net, x, r);
        v[i] = keep - eps;
        double lm = net_proj(net, x, r);
        v[i] = keep;
        out[i] = (lp - lm) / (2 * eps);
    }
}

#endif /* FLEET_TEST_MODEL_CHECK_H */
