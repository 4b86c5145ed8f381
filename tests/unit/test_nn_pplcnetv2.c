/* test_nn_pplcnetv2.c - the zoo's PP-LCNetV2 (base): its counts at 1000 classes against the
 * architecture (trainable and buffers exactly; the re-parameterised count, each rep block's
 * branches replaced by one k x k depthwise kernel with bias, against PaddleClas's published
 * 6.6M), PaddleClas's names, the shapes at 224 and at the small inputs, and one training step
 * on 32 x 32 against one step on ref in f64 (the same input and parameter values, f32 ones):
 * cpu in f64 (every gradient to 1e-9 of the largest), onednn in f32 on NHWC (logits to 1e-4,
 * gradients to 5e-2 of the largest: small late maps, as PP-HGNet). */
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

static void test_counts_and_names(void) {
    fl_net *net = fl_model_pplcnetv2(FL_DTYPE_F32, 3, false, 1000);
    CHECK(net != NULL);
    if (!net)
        return;
    int64_t tr = 0, buf = 0, branches = 0, fused = 0;
    for (int i = 0; i < fl_net_num_params(net); i++) {
        const fl_param *p = fl_net_param(net, i);
        *(p->trainable ? &tr : &buf) += p->value.numel;
        if (p->trainable && strstr(p->name, ".dw_conv_list."))
            branches += p->value.numel;
        /* the first branch (kernel k) of each rep block: the fused kernel's shape, plus bias */
        if (strstr(p->name, ".dw_conv_list.0.conv.weight"))
            fused += p->value.numel + p->value.shape[0];
    }
    CHECK(tr == 6687208);
    CHECK(buf == 40832);
    if (tr != 6687208 || buf != 40832)
        fprintf(stderr, "pplcnetv2: %lld + %lld\n", (long long)tr, (long long)buf);
    int64_t deploy = tr - branches + fused;
    CHECK(deploy == 6624232);
    CHECK(fabs(round((double)deploy / 1e5) / 10 - 6.6) < 1e-9);
    const char *names[] = {"stem.0.conv.weight",
                           "stem.1.dw_conv.conv.weight",
                           "stem.1.pw_conv.bn.bias",
                           "stage1.0.dw_conv.bn.weight",
                           "stage3.0.dw_conv_list.1.conv.weight",
                           "stage3.1.dw_conv_list.2.bn.running_var",
                           "stage3.5.se.conv2.bias",
                           "stage3.5.pw_conv_1.conv.weight",
                           "stage3.5.pw_conv_2.bn.weight",
                           "stage4.1.pw_conv.conv.weight",
                           "last_conv.weight",
                           "fc.bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(fl_net_find_param(net, names[i]) != NULL);
        if (!fl_net_find_param(net, names[i]))
            fprintf(stderr, "no parameter %s\n", names[i]);
    }
    /* stride 2: no 1x1 branch */
    CHECK(fl_net_find_param(net, "stage3.0.dw_conv_list.2.conv.weight") == NULL);
    fl_param *k1 = fl_net_find_param(net, "stage4.1.dw_conv_list.2.conv.weight");
    CHECK(k1 && k1->value.shape[0] == 1024 && k1->value.shape[2] == 1);
    int64_t s224[] = {3, 224, 224}, out[FL_MAX_DIMS];
    CHECK_OK(fl_net_build(net, 3, s224, 1, 1));
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 1000);
    fl_net_free(net);
    /* 1 x 28 x 28 here; 3 x 32 x 32 is the training step's (model_steps_vs_ref) */
    int64_t s28[] = {1, 28, 28};
    net = fl_model_pplcnetv2(FL_DTYPE_F32, 1, true, 10);
    CHECK(net && fl_net_build(net, 3, s28, 2, 1) == FL_OK);
    CHECK(net && fl_net_out_shape(net, out) == 1 && out[0] == 10);
    fl_net_free(net);
}

static fl_net *make_base(fl_dtype t, const void *arg) {
    (void)arg;
    return fl_model_pplcnetv2(t, 3, true, 10);
}

int main(void) {
    fl_rng_init(&rng, 5, 1);
    test_counts_and_names();
    /* cpu in f64, and onednn in f32 where built, against one ref step */
    const fl_backend *k[] = {fl_backend_cpu(), fl_backend_onednn()};
    model_steps_vs_ref("pplcnetv2", make_base, NULL, k[1] ? 2 : 1, k,
                       (fl_dtype[]){FL_DTYPE_F64, FL_DTYPE_F32}, (double[]){1e-9, 5e-2}, &rng);
    TEST_DONE();
}
