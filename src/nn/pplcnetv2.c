/* pplcnetv2.c - PP-LCNetV2 of the model zoo (PaddleClas's PPLCNetV2_base,
 * ppcls/arch/backbone/legendary_models/pp_lcnet_v2.py), in its training form: a 3x3 stride-2
 * ConvBNLayer and a depthwise-separable block as the stem, four stages (depths 2, 2, 6, 2) of
 * RepDepthwiseSeparable blocks: a depthwise ConvBNLayer with ReLU, or (stages 3, 4: use_rep) the
 * sum of depthwise ConvBN branches of kernel 5, 3 and, at stride 1, 1 followed by ReLU (the
 * re-parameterisable multi-scale form, after RepVGG, Ding et al. 2021, arXiv:2101.03697);
 * squeeze-and-excitation with a sigmoid in stage 3; the pointwise ConvBNLayer split in two
 * (C -> C_out / 2 -> C_out) in stage 3; an identity shortcut where stage 4's shape allows; then
 * pooling, a 1x1 convolution to 1280 without bias, ReLU, dropout 0.2, flatten, fc. Names are
 * PaddleClas's ("stage3.0.dw_conv_list.1.bn.weight", "stage3.2.pw_conv_2.conv.weight"); the
 * branch sums are "<block>.add<i>" (the last with the block's ReLU fused), the shortcut
 * "<block>.shortcut". Paddle also creates each rep block's fused kernel ("dw_conv", k x k with
 * bias), unused in training and set by rep() for inference: fleet leaves it out of the training
 * network and builds it in the re-parameterised inference form instead
 * (fl_model_pplcnetv2_fused: "<block>.dw_conv" and "<block>.act" in place of the branches and
 * their sums; pplcnetv2_fuse.c sets its kernels). Otherwise as pplcnet.c. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>

/* in_channels, kernel_size, split_pw, use_rep, use_se, use_shortcut (PaddleClas's NET_CONFIG) */
static const int net_config[4][6] = {
    {64, 3, 0, 0, 0, 0}, {128, 3, 0, 0, 0, 0}, {256, 5, 1, 1, 1, 0}, {512, 5, 0, 1, 0, 1}};
static const int depths[4] = {2, 2, 6, 2};

/* RepDepthwiseSeparable p reading layer `in`; fused: a rep block's one k x k depthwise
 * convolution with bias and its ReLU in place of the branches; returns its last layer's index
 * or -1 */
static int block(fl_net *net, const char *p, int in, int64_t c, int64_t out, int64_t s, int k,
                 bool split, bool rep, bool se, bool shortcut, bool fused) {
    char q[128], b[256];
    int cur;
    if (rep && fused) {
        fl_conv2d_opts o = {.in_channels = c, .out_channels = c, .kh = k, .kw = k, .sh = s,
                            .sw = s, .ph = (k - 1) / 2, .pw = (k - 1) / 2, .groups = c,
                            .bias = true};
        cur = nn_put(net, fl_conv2d_create(nn_name(b, sizeof b, p, "dw_conv"), &o), in);
        if (cur >= 0)
            cur =
                nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "act"), FL_ACT_RELU), -2);
    } else if (rep) { /* branches of kernel k, k - 2, .., 1 (not 1 when strided), summed, ReLU */
        int br[4] = {-1, -1, -1, -1}, nb = 0;
        for (int ks = k; ks > 0 && nb < 4; ks -= 2) {
            if (ks == 1 && s != 1)
                continue;
            snprintf(q, sizeof q, "%s.dw_conv_list.%d", p, nb);
            if ((br[nb++] = nn_conv_bn(net, q, in, c, c, ks, s, c, FL_ACT_NONE)) < 0)
                return -1;
        }
        cur = br[0];
        for (int j = 1; j < nb; j++) {
            snprintf(q, sizeof q, "add%d", j);
            fl_layer *add = fl_add_create(nn_name(b, sizeof b, p, q), j == nb - 1);
            if (!add || (cur = fl_net_add2(net, add, cur, br[j])) < 0)
                return -1;
        }
        if (nb == 1)
            cur =
                nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "act"), FL_ACT_RELU), -2);
    } else {
        cur = nn_conv_bn(net, nn_name(q, sizeof q, p, "dw_conv"), in, c, c, k, s, c, FL_ACT_RELU);
    }
    if (cur >= 0 && se) { /* SEModule with a sigmoid (PaddleClas names it hardsigmoid) */
        fl_conv2d_opts c1 = {.in_channels = c, .out_channels = c / 4, .kh = 1, .kw = 1,
                             .bias = true};
        fl_conv2d_opts c2 = {.in_channels = c / 4, .out_channels = c, .kh = 1, .kw = 1,
                             .bias = true};
        int x = cur;
        if (nn_put(net, fl_adaptive_avg_pool_create(nn_name(b, sizeof b, p, "se.avg_pool")), x) <
                0 ||
            nn_put(net,
                   nn_paddle_init(fl_conv2d_create(nn_name(b, sizeof b, p, "se.conv1"), &c1)),
                   -2) < 0 ||
            nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "se.relu"), FL_ACT_RELU), -2) <
                0 ||
            nn_put(net,
                   nn_paddle_init(fl_conv2d_create(nn_name(b, sizeof b, p, "se.conv2"), &c2)),
                   -2) < 0 ||
            nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "se.sigmoid"), FL_ACT_SIGMOID),
                   -2) < 0)
            return -1;
        fl_layer *mul = fl_channel_mul_create(nn_name(b, sizeof b, p, "se.multiply"));
        if (!mul || (cur = fl_net_add2(net, mul, x, fl_net_num_layers(net) - 1)) < 0)
            return -1;
    }
    if (cur >= 0 && split) {
        int64_t half = out / 2; /* int(out_channels * 0.5) */
        cur = nn_conv_bn(net, nn_name(q, sizeof q, p, "pw_conv_1"), -2, c, half, 1, 1, 1, FL_ACT_RELU);
        if (cur >= 0)
            cur =
                nn_conv_bn(net, nn_name(q, sizeof q, p, "pw_conv_2"), -2, half, out, 1, 1, 1, FL_ACT_RELU);
    } else if (cur >= 0) {
        cur = nn_conv_bn(net, nn_name(q, sizeof q, p, "pw_conv"), -2, c, out, 1, 1, 1, FL_ACT_RELU);
    }
    if (cur >= 0 && shortcut && s == 1 && c == out) {
        fl_layer *add = fl_add_create(nn_name(b, sizeof b, p, "shortcut"), false);
        cur = add ? fl_net_add2(net, add, cur, in) : -1;
    }
    return cur;
}

static fl_net *build(fl_dtype t, int64_t in_channels, bool small_input, int64_t classes,
                     bool fused) {
    if (in_channels < 1 || classes < 1) {
        fl_fail(FL_EINVAL, "pplcnetv2: in_channels %lld or classes %lld < 1",
                (long long)in_channels, (long long)classes);
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    /* small inputs: stride 1 in the stem and in stage1, as pplcnet's small-input stem */
    int cur = nn_conv_bn(net, "stem.0", -2, in_channels, nn_make_divisible(32), 3,
                      small_input ? 1 : 2, 1, FL_ACT_RELU);
    if (cur >= 0)
        cur = block(net, "stem.1", cur, nn_make_divisible(32), nn_make_divisible(64), 1, 3, false,
                    false, false, false, false);
    char p[32];
    for (int st = 0; st < 4 && cur >= 0; st++) {
        const int *cfg = net_config[st];
        for (int i = 0; i < depths[st] && cur >= 0; i++) {
            int64_t in = nn_make_divisible(i == 0 ? cfg[0] : cfg[0] * 2);
            int64_t out = nn_make_divisible(cfg[0] * 2);
            int64_t s = i == 0 && !(small_input && st == 0) ? 2 : 1;
            snprintf(p, sizeof p, "stage%d.%d", st + 1, i);
            cur = block(net, p, cur, in, out, s, cfg[1], cfg[2], cfg[3], cfg[4], cfg[5],
                        fused);
        }
    }
    fl_conv2d_opts last = {.in_channels = nn_make_divisible(1024), .out_channels = 1280, .kh = 1,
                           .kw = 1};
    if (cur >= 0)
        cur = nn_put(net, fl_adaptive_avg_pool_create("avg_pool"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_paddle_init(fl_conv2d_create("last_conv", &last)), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_activation_create("act", FL_ACT_RELU), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_dropout_create("dropout", 0.2, 0x4c434e657432ull), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_flatten_create("flatten"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_paddle_init(fl_fc_create("fc", 1280, classes, true)), -2);
    if (cur < 0) {
        fl_fail_prefix(FL_EINVAL, fused ? "pplcnetv2_base (fused)" : "pplcnetv2_base");
        fl_net_free(net);
        return NULL;
    }
    return net;
}

fl_net *fl_model_pplcnetv2(fl_dtype t, int64_t in_channels, bool small_input, int64_t classes) {
    return build(t, in_channels, small_input, classes, false);
}

fl_net *fl_model_pplcnetv2_fused(fl_dtype t, int64_t in_channels, bool small_input,
                                 int64_t classes) {
    return build(t, in_channels, small_input, classes, true);
}
