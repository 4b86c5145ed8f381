/* test_nn_pphgnet.c - the zoo's PP-HGNet: parameter counts at 1000 classes against the
 * architecture and PaddleClas's published sizes (which count batch norm's buffers), PaddleClas's
 * names, the shapes at 224 and at the small inputs, and one training step of PPHGNet_tiny on
 * 32 x 32 against ref (NCHW): cpu in f64 (every gradient to 1e-9 of the largest), onednn in
 * f32 on NHWC (logits to 1e-4; gradients to 5e-2 of the largest: stage 4 runs at 2 x 2, so
 * its batch norms normalise 8 values a channel and amplify f32 rounding, 2% seen). */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static fl_rng rng;

static void counts(fl_net *net, int64_t *trainable, int64_t *buffers) {
    *trainable = *buffers = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        *(fl_net_param(net, i)->trainable ? trainable : buffers) +=
            fl_net_param(net, i)->value.numel;
}

/* exact counts of pp_hgnet.py's architecture; PaddleClas publishes the totals rounded to
 * 0.01M: 14.75M, 24.38M, 71.62M */
static void test_param_counts(void) {
    static const struct {
        const char *size;
        int64_t     trainable, buffers;
        double      published;
    } want[] = {{"tiny", 14735864, 15040, 14.75},
                {"small", 24360872, 20992, 24.38},
                {"base", 71578184, 46400, 71.62}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        fl_net *net = fl_model_pphgnet(FL_DTYPE_F32, want[i].size, 3, false, 1000);
        CHECK(net != NULL);
        if (!net)
            continue;
        int64_t tr, buf;
        counts(net, &tr, &buf);
        if (tr != want[i].trainable || buf != want[i].buffers)
            fprintf(stderr, "pphgnet %s: %lld + %lld, want %lld + %lld\n", want[i].size,
                    (long long)tr, (long long)buf, (long long)want[i].trainable,
                    (long long)want[i].buffers);
        CHECK(tr == want[i].trainable && buf == want[i].buffers);
        CHECK(fabs(round((double)(tr + buf) / 1e4) / 100 - want[i].published) < 1e-9);
        fl_net_free(net);
    }
    CHECK(fl_model_pphgnet(FL_DTYPE_F32, "huge", 3, false, 1000) == NULL);
    CHECK_MSG("pphgnet");
}

static void test_names_and_shapes(void) {
    fl_net *net = fl_model_pphgnet(FL_DTYPE_F32, "tiny", 3, false, 1000);
    CHECK(net != NULL);
    if (!net)
        return;
    CHECK(strcmp(fl_net_param(net, 0)->name, "stem.0.conv.weight") == 0);
    const char *names[] = {"stem.2.bn.running_var",
                           "stages.0.blocks.0.layers.4.conv.weight",
                           "stages.0.blocks.0.aggregation_conv.conv.weight",
                           "stages.0.blocks.0.att.conv.bias",
                           "stages.1.downsample.conv.weight",
                           "stages.2.blocks.1.layers.0.bn.weight",
                           "last_conv.weight",
                           "fc.bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(fl_net_find_param(net, names[i]) != NULL);
        if (!fl_net_find_param(net, names[i]))
            fprintf(stderr, "no parameter %s\n", names[i]);
    }
    CHECK(fl_net_find_param(net, "stages.0.downsample.conv.weight") == NULL); /* stage1 */
    fl_param *agg = fl_net_find_param(net, "stages.0.blocks.0.aggregation_conv.conv.weight");
    CHECK(agg && agg->value.shape[0] == 224 && agg->value.shape[1] == 96 + 5 * 96);
    fl_param *ds = fl_net_find_param(net, "stages.3.downsample.conv.weight");
    CHECK(ds && ds->value.shape[0] == 512 && ds->value.shape[1] == 1);
    int64_t s224[] = {3, 224, 224}, out[FL_MAX_DIMS];
    CHECK_OK(fl_net_build(net, 3, s224, 1, 1));
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 1000);
    fl_net_free(net);
    int64_t sizes[][3] = {{1, 28, 28}, {3, 32, 32}};
    for (int i = 0; i < 2; i++) {
        net = fl_model_pphgnet(FL_DTYPE_F32, "tiny", sizes[i][0], true, 10);
        CHECK(net && fl_net_build(net, 3, sizes[i], 2, 1) == FL_OK);
        CHECK(net && fl_net_out_shape(net, out) == 1 && out[0] == 10);
        fl_net_free(net);
    }
}

/* one step of PPHGNet_tiny on 32 x 32 (batch 2) in dtype t on k against ref: the largest
 * gradient difference must stay under gtol times the largest gradient */
static void test_step_vs_ref(const fl_backend *k, fl_dtype t, double gtol) {
    enum { B = 2, CLS = 10, NX = B * 3 * 32 * 32 };
    int64_t shape[] = {3, 32, 32}, xs[] = {B, 3, 32, 32};
    const fl_backend *be[2] = {fl_backend_ref(), k};
    size_t es = fl_dtype_size(t);
    double *grads[2] = {NULL, NULL}, logit[2][B * CLS], loss[2] = {0, 0};
    int64_t np = 0;
    void *xd = malloc(NX * es);
    for (int i = 0; i < NX; i++) {
        double v = 2 * fl_rng_uniform_f64(&rng) - 1;
        if (t == FL_DTYPE_F32)
            ((float *)xd)[i] = (float)v;
        else
            ((double *)xd)[i] = v;
    }
    int32_t labels[B] = {2, 5};
    for (int j = 0; j < 2; j++) {
        fl_net *net = fl_model_pphgnet(t, "tiny", 3, true, CLS);
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
    snprintf(label, sizeof label, "pphgnet tiny logits [%s %s vs ref]", k->name,
             fl_dtype_name(t));
    CHECK_CLOSE(label, logit[1], logit[0], B * CLS, ltol, ltol);
    CHECK_NEAR(loss[1], loss[0], ltol);
    double mx = 0, worst = 0;
    for (int64_t i = 0; i < np; i++) {
        mx = fmax(mx, fabs(grads[0][i]));
        worst = fmax(worst, fabs(grads[1][i] - grads[0][i]));
    }
    snprintf(label, sizeof label, "pphgnet tiny gradients [%s %s vs ref]", k->name,
             fl_dtype_name(t));
    CHECK_CLOSE(label, grads[1], grads[0], np, gtol * mx, 0);
    fprintf(stderr, "%s: largest |difference| %.3g (largest gradient %.3g)\n", label, worst, mx);
    free(xd);
    free(grads[0]);
    free(grads[1]);
}

int main(void) {
    fl_rng_init(&rng, 4, 1);
    test_param_counts();
    test_names_and_shapes();
    test_step_vs_ref(fl_backend_cpu(), FL_DTYPE_F64, 1e-9);
    if (fl_backend_onednn())
        test_step_vs_ref(fl_backend_onednn(), FL_DTYPE_F32, 5e-2);
    TEST_DONE();
}
