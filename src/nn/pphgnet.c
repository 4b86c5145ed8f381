/* pphgnet.c - PP-HGNet of the model zoo (PaddleClas's "High Performance GPU Net", 2022: VoVNet's
 * one-shot aggregation, Lee et al. 2019, arXiv:1904.09730, with a learnable depthwise
 * downsampling and an ESE attention; ppcls/arch/backbone/legendary_models/pp_hgnet.py): a stem
 * of three 3x3 ConvBNAct and a max pool, four stages of HG blocks (layer_num 3x3 ConvBNAct in a
 * chain, their outputs and the block input concatenated along channels, a 1x1 aggregation
 * ConvBNAct, ESE: pooling, 1x1 convolution with bias, sigmoid, channel-wise multiply; an
 * identity add in every block but a stage's first), stages 2-4 opened by a depthwise 3x3
 * stride-2 ConvBN, then pooling, a 1x1 convolution to 2048 without bias, ReLU, dropout (base
 * only), flatten, fc. Names and order are PaddleClas's ("stages.2.blocks.1.layers.4.conv.weight",
 * "stages.1.downsample.bn.bias", "stages.0.blocks.0.att.conv.bias"); the ReLUs are fused into
 * the batch norms (no parameters), a block's concatenation (one layer of layer_num + 1 inputs)
 * and add are named "<block>.concat" and "<block>.add". Where fleet differs: as pplcnet.c says
 * (batch norm's buffer names, fc's weight order, inverted dropout). Initialisation is
 * PaddleClas's _init_weights: every convolution KaimingNormal (fan in), fc Paddle's Linear
 * default (Xavier uniform) with a zero bias. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int64_t     stem[3];
    int64_t     stage[4][5]; /* in, mid, out, blocks, downsample */
    int         layer_num;
    double      dropout;
} hg_arch;

static const hg_arch archs[] = {
    {"tiny", {48, 48, 96},
     {{96, 96, 224, 1, 0}, {224, 128, 448, 1, 1}, {448, 160, 512, 2, 1}, {512, 192, 768, 1, 1}},
     5, 0.0},
    {"small", {64, 64, 128},
     {{128, 128, 256, 1, 0}, {256, 160, 512, 1, 1}, {512, 192, 768, 2, 1},
      {768, 224, 1024, 1, 1}},
     6, 0.0},
    {"base", {96, 96, 160},
     {{160, 192, 320, 1, 0}, {320, 224, 640, 2, 1}, {640, 256, 960, 3, 1},
      {960, 288, 1280, 2, 1}},
     7, 0.2},
};

/* HG_Block p reading layer `in` (in_ch channels); returns its last layer's index or -1 */
static int hg_block(fl_net *net, const char *p, int in, int64_t in_ch, int64_t mid, int64_t out,
                    int layer_num, bool identity) {
    char q[96], b[256];
    int outs[FL_NET_MAX_INPUTS] = {in}, cur = in;
    FL_ASSERT(layer_num + 1 <= FL_NET_MAX_INPUTS);
    for (int i = 0; i < layer_num; i++) {
        snprintf(q, sizeof q, "%s.layers.%d", p, i);
        if ((cur = nn_conv_bn(net, q, cur, i ? mid : in_ch, mid, 3, 1, 1, FL_ACT_RELU)) < 0)
            return -1;
        outs[i + 1] = cur;
    }
    /* paddle.concat([x, l0, .., l(n-1)], axis=1): one layer of layer_num + 1 inputs */
    fl_layer *cat = fl_concat_create(nn_name(b, sizeof b, p, "concat"));
    if (!cat || fl_net_add_n(net, cat, layer_num + 1, outs) < 0)
        return -1;
    snprintf(q, sizeof q, "%s.aggregation_conv", p);
    int agg = nn_conv_bn(net, q, -2, in_ch + layer_num * mid, out, 1, 1, 1, FL_ACT_RELU);
    if (agg < 0)
        return -1;
    /* ESEModule: avg_pool, conv (bias), sigmoid, multiply */
    fl_conv2d_opts e = {.in_channels = out, .out_channels = out, .kh = 1, .kw = 1, .bias = true};
    if (nn_put(net, fl_adaptive_avg_pool_create(nn_name(b, sizeof b, p, "att.avg_pool")), -2) < 0 ||
        nn_put(net, nn_kaiming_in(fl_conv2d_create(nn_name(b, sizeof b, p, "att.conv"), &e)),
               -2) < 0 ||
        nn_put(net, fl_activation_create(nn_name(b, sizeof b, p, "att.sigmoid"), FL_ACT_SIGMOID),
               -2) < 0)
        return -1;
    fl_layer *mul = fl_channel_mul_create(nn_name(b, sizeof b, p, "att.multiply"));
    int last = mul ? fl_net_add2(net, mul, agg, fl_net_num_layers(net) - 1) : -1;
    if (last < 0 || !identity)
        return last;
    fl_layer *add = fl_add_create(nn_name(b, sizeof b, p, "add"), false);
    return add ? fl_net_add2(net, add, last, in) : -1;
}

fl_net *fl_model_pphgnet(fl_dtype t, const char *size, int64_t in_channels, bool small_input,
                         int64_t classes) {
    const hg_arch *a = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (size && strcmp(size, archs[i].name) == 0)
            a = &archs[i];
    if (!a || in_channels < 1 || classes < 1) {
        fl_fail(FL_EINVAL, "pphgnet: size '%s' is not tiny, small or base, or in_channels %lld or "
                "classes %lld < 1", size ? size : "(null)", (long long)in_channels,
                (long long)classes);
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    char p[64], q[96];
    /* small inputs: stride 1 in the stem's first convolution (the max pool keeps its 2), so
     * 32 x 32 reaches stage 4 at 2 x 2 */
    int cur = -2;
    int64_t ch = in_channels;
    for (int i = 0; i < 3 && cur != -1; i++) {
        snprintf(p, sizeof p, "stem.%d", i);
        cur = nn_conv_bn(net, p, -2, ch, a->stem[i], 3, i == 0 && !small_input ? 2 : 1, 1, FL_ACT_RELU);
        ch = a->stem[i];
    }
    if (cur >= 0)
        cur = nn_put(net, fl_pool2d_create("pool", FL_POOL_MAX, 3, 2, 1), -2);
    for (int s = 0; s < 4 && cur >= 0; s++) {
        const int64_t *st = a->stage[s];
        if (st[4]) {
            snprintf(p, sizeof p, "stages.%d.downsample", s);
            cur = nn_conv_bn(net, p, cur, st[0], st[0], 3, 2, st[0], FL_ACT_NONE);
        }
        for (int64_t bi = 0; bi < st[3] && cur >= 0; bi++) {
            snprintf(p, sizeof p, "stages.%d.blocks.%lld", s, (long long)bi);
            cur = hg_block(net, p, cur, bi ? st[2] : st[0], st[1], st[2], a->layer_num, bi > 0);
        }
        ch = st[2];
    }
    fl_conv2d_opts last = {.in_channels = ch, .out_channels = 2048, .kh = 1, .kw = 1};
    if (cur >= 0)
        cur = nn_put(net, fl_adaptive_avg_pool_create("avg_pool"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_kaiming_in(fl_conv2d_create("last_conv", &last)), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_activation_create("act", FL_ACT_RELU), -2);
    if (cur >= 0 && a->dropout > 0)
        cur = nn_put(net, fl_dropout_create("dropout", a->dropout, 0x48474e6574ull), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_flatten_create("flatten"), -2);
    if (cur >= 0)
        cur = nn_put(net, nn_paddle_init(fl_fc_create("fc", 2048, classes, true)), -2);
    (void)q;
    if (cur < 0) {
        fl_fail_prefix(FL_EINVAL, "pphgnet_%s", a->name);
        fl_net_free(net);
        return NULL;
    }
    return net;
}
