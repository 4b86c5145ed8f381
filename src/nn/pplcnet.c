/* pplcnet.c - PP-LCNet of the model zoo (Cui et al. 2021, "PP-LCNet: A Lightweight CPU
 * Convolutional Neural Network", arXiv:2109.15099), as PaddleClas builds it
 * (ppcls/arch/backbone/legendary_models/pp_lcnet.py): a 3x3 stem, 13 depthwise-separable blocks
 * (NET_CONFIG below: 3x3 and 5x5 depthwise kernels, squeeze-and-excitation in the last two),
 * hardswish after every convolution, global average pooling, a 1x1 convolution to 1280 without
 * bias, hardswish, dropout 0.2, flatten, fc. Layer and parameter names are PaddleClas's
 * ("blocks5.3.dw_conv.conv.weight", "blocks6.0.se.conv2.bias", "last_conv.weight", "fc.bias")
 * in its order, so --print-model reads like its summary. Where fleet differs: batch norm's
 * buffers are named running_mean / running_var (Paddle: _mean / _variance), fc.weight is
 * (OUT, IN) (Paddle stores its transpose), and dropout is the inverted kind (Paddle's
 * downscale_in_infer scales at inference instead; the same in expectation). Initialisation is
 * PaddleClas's: the ConvBNLayers' convolutions KaimingNormal (fan in), the squeeze-and-
 * excitation and last convolutions Paddle's Conv2D default, fc Paddle's Linear default
 * (fl_layer_set_init). */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdio.h>

/* [k, in_c, out_c, s, use_se] per block, PaddleClas's NET_CONFIG (stages blocks2 .. blocks6) */
static const struct {
    int k, in_c, out_c, s, se;
} net_config[] = {
    {3, 16, 32, 1, 0},                                                       /* blocks2 */
    {3, 32, 64, 2, 0},   {3, 64, 64, 1, 0},                                  /* blocks3 */
    {3, 64, 128, 2, 0},  {3, 128, 128, 1, 0},                                /* blocks4 */
    {3, 128, 256, 2, 0}, {5, 256, 256, 1, 0}, {5, 256, 256, 1, 0},           /* blocks5 */
    {5, 256, 256, 1, 0}, {5, 256, 256, 1, 0}, {5, 256, 256, 1, 0},
    {5, 256, 512, 2, 1}, {5, 512, 512, 1, 1},                                /* blocks6 */
};
static const int stage_of[] = {2, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5, 6, 6};
#define NBLOCKS ((int)(sizeof net_config / sizeof net_config[0]))

/* ConvBNLayer p: conv (no bias; groups), bn with the hardswish fused (p.bn's output is the
 * hardswish's); returns the bn's index or -1 */
static int conv_bn_hs(fl_net *net, const char *p, int64_t in, int64_t out, int64_t k, int64_t s,
                      int64_t groups) {
    return nn_conv_bn(net, p, -2, in, out, k, s, groups, FL_ACT_HARDSWISH);
}

/* SEModule p on layer `in` of c channels: avg_pool, conv1 (c / 4, bias), relu, conv2 (c,
 * bias), hardsigmoid, and the channel-wise multiply with the input; returns its index or -1 */
static int se_module(fl_net *net, const char *p, int in, int64_t c) {
    char b[96];
    fl_conv2d_opts c1 = {.in_channels = c, .out_channels = c / 4, .kh = 1, .kw = 1, .bias = true};
    fl_conv2d_opts c2 = {.in_channels = c / 4, .out_channels = c, .kh = 1, .kw = 1, .bias = true};
    if (nn_put(net, fl_adaptive_avg_pool_create(nn_name(b, sizeof b, p, "avg_pool")), in) < 0 ||
        nn_put(net, nn_paddle_init(fl_conv2d_create(nn_name(b, sizeof b, p, "conv1"), &c1)),
               -2) < 0 ||
        nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "relu"), FL_ACT_RELU), -2) < 0 ||
        nn_put(net, nn_paddle_init(fl_conv2d_create(nn_name(b, sizeof b, p, "conv2"), &c2)),
               -2) < 0 ||
        nn_put(net,
               fl_activation_create(nn_name(b, sizeof b, p, "hardsigmoid"), FL_ACT_HARDSIGMOID),
               -2) < 0)
        return -1;
    fl_layer *mul = fl_channel_mul_create(nn_name(b, sizeof b, p, "multiply"));
    return mul && fl_net_add2(net, mul, in, fl_net_num_layers(net) - 1) >= 0
               ? fl_net_num_layers(net) - 1
               : -1;
}

bool fl_pplcnet_scale_known(double scale) {
    static const double scales[] = {0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++)
        if (fabs(scale - scales[i]) < 1e-9)
            return true;
    return false;
}

fl_net *fl_model_pplcnet(fl_dtype t, double scale, int64_t in_channels, bool small_input,
                         int64_t classes) {
    if (!(scale > 0 && scale <= 8) || in_channels < 1 || classes < 1) {
        fl_fail(FL_EINVAL, "pplcnet: scale %g is not in (0, 8], or in_channels %lld or classes "
                "%lld < 1", scale, (long long)in_channels, (long long)classes);
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    char p[32];
    /* small inputs: stride 1 in the stem and in blocks3, as PaddleClas's stride_list
     * [1, 1, 2, 2, 2] sets it (the CIFAR ResNets' way: 32 x 32 ends at 4 x 4, 28 x 28 at 4 x 4) */
    int64_t ch = nn_make_divisible(16 * scale);
    int cur = conv_bn_hs(net, "conv1", in_channels, ch, 3, small_input ? 1 : 2, 1);
    for (int i = 0, j = 0; i < NBLOCKS && cur >= 0; i++) {
        j = i > 0 && stage_of[i] == stage_of[i - 1] ? j + 1 : 0;
        int64_t in = nn_make_divisible(net_config[i].in_c * scale);
        int64_t out = nn_make_divisible(net_config[i].out_c * scale);
        int64_t s = small_input && stage_of[i] == 3 ? 1 : net_config[i].s;
        FL_ASSERT(in == ch);
        char q[48];
        snprintf(p, sizeof p, "blocks%d.%d", stage_of[i], j);
        cur = conv_bn_hs(net, nn_name(q, sizeof q, p, "dw_conv"), in, in, net_config[i].k, s, in);
        if (cur >= 0 && net_config[i].se)
            cur = se_module(net, nn_name(q, sizeof q, p, "se"), cur, in);
        if (cur >= 0)
            cur = conv_bn_hs(net, nn_name(q, sizeof q, p, "pw_conv"), in, out, 1, 1, 1);
        ch = out;
    }
    fl_conv2d_opts last = {.in_channels = ch, .out_channels = 1280, .kh = 1, .kw = 1};
    if (cur >= 0)
        cur = nn_put(net, fl_adaptive_avg_pool_create("avg_pool"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_paddle_init(fl_conv2d_create("last_conv", &last)), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_activation_create("hardswish", FL_ACT_HARDSWISH), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_dropout_create("dropout", 0.2, 0x504c434e6574ull), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_flatten_create("flatten"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_paddle_init(fl_fc_create("fc", 1280, classes, true)), -2);
    if (cur < 0) {
        fl_fail_prefix(FL_EINVAL, "pplcnet x%g", scale);
        fl_net_free(net);
        return NULL;
    }
    return net;
}
