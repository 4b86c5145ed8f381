/* model_check.h - what the model tests share: one training step of a zoo model on a backend
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

/* One step of the model make(t, arg) builds (3 x 32 x 32 in, 10 classes, batch 4) in dtype t
 * on k against the same step on ref: logits and loss within 1e-4 (f32) or 1e-10 (f64), and the
 * largest gradient difference under gtol times the largest gradient. name labels the checks;
 * rng draws the input. */
typedef fl_net *(*model_make_fn)(fl_dtype t, const void *arg);
static inline void model_step_vs_ref(const char *name, model_make_fn make, const void *arg,
                                     const fl_backend *k, fl_dtype t, double gtol,
                                     fl_rng *rng) {
    enum { B = 4, CLS = 10, NX = B * 3 * 32 * 32 };
    int64_t shape[] = {3, 32, 32}, xs[] = {B, 3, 32, 32};
    const fl_backend *be[2] = {fl_backend_ref(), k};
    size_t es = fl_dtype_size(t);
    double *grads[2] = {NULL, NULL}, logit[2][B * CLS], loss[2] = {0, 0};
    int64_t np = 0;
    void *xd = malloc(NX * es);
    for (int i = 0; i < NX; i++) {
        double v = 2 * fl_rng_uniform_f64(rng) - 1;
        if (t == FL_DTYPE_F32)
            ((float *)xd)[i] = (float)v;
        else
            ((double *)xd)[i] = v;
    }
    int32_t labels[B] = {2, 5, 5, 9};
    for (int j = 0; j < 2; j++) {
        fl_net *net = make(t, arg);
        CHECK(net != NULL);
        if (!net)
            return;
        fl_net_set_backend(net, be[j]);
        CHECK_OK(fl_net_build(net, 3, shape, B, 7));
        fl_tensor x, probs;
        fl_tensor_view(&x, t, 4, xs, xd);
        const fl_tensor *lg = NULL;
        CHECK_OK(fl_net_forward(net, &x, true, &lg));
        double pm[B * CLS];
        for (int i = 0; i < B * CLS; i++)
            logit[j][i] = t == FL_DTYPE_F32 ? ((float *)lg->data)[i] : ((double *)lg->data)[i];
        fl_tensor_view(&probs, t, 2, lg->shape, pm);
        CHECK_OK(fl_softmax_xent_forward(be[j], lg, labels, &probs, &loss[j]));
        CHECK_OK(fl_softmax_xent_backward(be[j], &probs, labels, &probs));
        CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
        np = fl_net_numel(net);
        grads[j] = malloc((size_t)np * sizeof(double));
        for (int64_t i = 0; i < np; i++)
            grads[j][i] = t == FL_DTYPE_F32 ? ((float *)fl_net_flat_grads(net))[i]
                                            : ((double *)fl_net_flat_grads(net))[i];
        fl_net_free(net);
    }
    char label[96];
    double ltol = t == FL_DTYPE_F32 ? 1e-4 : 1e-10;
    snprintf(label, sizeof label, "%s logits [%s %s vs ref]", name, k->name, fl_dtype_name(t));
    CHECK_CLOSE(label, logit[1], logit[0], B * CLS, ltol, ltol);
    CHECK_NEAR(loss[1], loss[0], ltol);
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < np; i++) {
        mx = fmax(mx, fabs(grads[0][i]));
        worst = fmax(worst, fabs(grads[1][i] - grads[0][i]));
    }
    snprintf(label, sizeof label, "%s gradients [%s %s vs ref]", name, k->name,
             fl_dtype_name(t));
    CHECK_CLOSE(label, grads[1], grads[0], np, gtol * mx, 0);
    fprintf(stderr, "%s: largest |difference| %.3g (largest gradient %.3g)\n", label, worst, mx);
    free(xd);
    free(grads[0]);
    free(grads[1]);
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
