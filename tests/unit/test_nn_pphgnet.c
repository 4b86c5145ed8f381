/* test_nn_pphgnet.c - the zoo's PP-HGNet: parameter counts at 1000 classes against the
 * architecture and PaddleClas's published sizes (which count batch norm's buffers), PaddleClas's
 * names, each HG block's aggregation as one concat of 6 inputs, the shapes at 224 and at the
 * small inputs, and one training step of PPHGNet_tiny on 32 x 32 against one step on ref in
 * f64 (NCHW; the same input and parameter values, f32 ones): cpu in f64 (every gradient to
 * 1e-9 of the largest), onednn in f32 on NHWC (logits to 1e-4; gradients to 5e-2 of the
 * largest: stage 4 runs at 2 x 2, so its batch norms normalise 16 values a channel (batch 4)
 * and amplify f32 rounding, 1.6% seen against ref in f32). The step itself is model_check.h's,
 * shared with test_nn_pplcnetv2.c. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "model_check.h"
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
    /* each block's aggregation is one concat of its input and its 5 layers' outputs, in
     * PaddleClas's order, read by the aggregation conv */
    int cats = 0;
    for (int i = 0; i < fl_net_num_layers(net); i++) {
        fl_layer *l = fl_net_layer(net, i);
        if (strcmp(l->ops->type, "concat") != 0)
            continue;
        cats++;
        CHECK(l->ninputs == 6 && strstr(l->name, ".concat") && !strstr(l->name, "concat1"));
        CHECK(l->inputs[0] < l->inputs[1]); /* the block's input first */
        for (int k = 1; l->ninputs == 6 && k < 6; k++) {
            char want[96];
            snprintf(want, sizeof want, "%.*s.layers.%d.bn",
                     (int)(strstr(l->name, ".concat") - l->name), l->name, k - 1);
            CHECK(l->inputs[k] >= 0 && strcmp(fl_net_layer(net, l->inputs[k])->name, want) == 0);
        }
        CHECK(i + 1 < fl_net_num_layers(net) &&
              strstr(fl_net_layer(net, i + 1)->name, "aggregation_conv.conv"));
    }
    CHECK(cats == 5); /* tiny's blocks: 1 + 1 + 2 + 1 */
    int64_t s224[] = {3, 224, 224}, out[FL_MAX_DIMS];
    CHECK_OK(fl_net_build(net, 3, s224, 1, 1));
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 1000);
    fl_net_free(net);
    /* 1 x 28 x 28 here; 3 x 32 x 32 is the training step's (model_steps_vs_ref) */
    int64_t s28[] = {1, 28, 28};
    net = fl_model_pphgnet(FL_DTYPE_F32, "tiny", 1, true, 10);
    CHECK(net && fl_net_build(net, 3, s28, 2, 1) == FL_OK);
    CHECK(net && fl_net_out_shape(net, out) == 1 && out[0] == 10);
    fl_net_free(net);
}

static fl_net *make_tiny(fl_dtype t, const void *arg) {
    (void)arg;
    return fl_model_pphgnet(t, "tiny", 3, true, 10);
}

int main(void) {
    fl_rng_init(&rng, 4, 1);
    test_param_counts();
    test_names_and_shapes();
    /* cpu in f64, and onednn in f32 where built, against one ref step */
    const fl_backend *k[] = {fl_backend_cpu(), fl_backend_onednn()};
    model_steps_vs_ref("pphgnet tiny", make_tiny, NULL, k[1] ? 2 : 1, k,
                       (fl_dtype[]){FL_DTYPE_F64, FL_DTYPE_F32}, (double[]){1e-9, 5e-2}, &rng);
    TEST_DONE();
}
