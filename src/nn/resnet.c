/* resnet.c - the ResNets of the model zoo (He et al. 2015, arXiv:1512.03385): torchvision's
 * ImageNet models (basic blocks for 18 and 34 layers, bottlenecks with the stride in the 3x3
 * for 50, 101, 152) and the CIFAR family of sec. 4.2 (6n + 2 layers). Blocks are built from
 * conv2d, batch_norm (ReLU fused), an optional shortcut branch and an add (ReLU fused), wired
 * with fl_net_add_from / fl_net_add2; names and order follow torchvision's state_dict. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>

static int conv_bn(fl_net *net, const char *conv, const char *bn, int from, int64_t in,
                   int64_t out, int64_t k, int64_t s, bool relu) {
    fl_conv2d_opts o = {.in_channels = in, .out_channels = out, .kh = k, .kw = k, .sh = s,
                        .sw = s, .ph = (k - 1) / 2, .pw = (k - 1) / 2};
    if (nn_put(net, fl_conv2d_create(conv, &o), from) < 0)
        return -1;
    return nn_put(net, fl_batch_norm_create(bn, out, relu ? FL_ACT_RELU : FL_ACT_NONE), -2);
}

/* One residual block reading layer `in` (in_ch channels); bottleneck when expansion is 4.
 * shortcut: 'A' (pad) or 'B' (1x1 conv + bn) where the shape changes. Returns the add's index. */
static int block(fl_net *net, const char *p, int in, int64_t in_ch, int64_t planes, int64_t s,
                 int expansion, char shortcut) {
    char a[96], b[96];
    int last;
    int64_t out_ch = planes * expansion;
#define NAMES(x, y) (snprintf(a, sizeof a, "%s.%s", p, x), snprintf(b, sizeof b, "%s.%s", p, y))
    if (expansion == 1) {
        NAMES("conv1", "bn1");
        if (conv_bn(net, a, b, in, in_ch, planes, 3, s, true) < 0)
            return -1;
        NAMES("conv2", "bn2");
        if ((last = conv_bn(net, a, b, -2, planes, planes, 3, 1, false)) < 0)
            return -1;
    } else {
        NAMES("conv1", "bn1");
        if (conv_bn(net, a, b, in, in_ch, planes, 1, 1, true) < 0)
            return -1;
        NAMES("conv2", "bn2");
        if (conv_bn(net, a, b, -2, planes, planes, 3, s, true) < 0)
            return -1;
        NAMES("conv3", "bn3");
        if ((last = conv_bn(net, a, b, -2, planes, out_ch, 1, 1, false)) < 0)
            return -1;
    }
    int skip = in;
    if (s != 1 || in_ch != out_ch) {
        if (shortcut == 'A') {
            NAMES("shortcut", "unused");
            skip = nn_put(net, fl_shortcut_pad_create(a, out_ch, s), in);
        } else {
            NAMES("downsample.0", "downsample.1");
            skip = conv_bn(net, a, b, in, in_ch, out_ch, 1, s, false);
        }
        if (skip < 0)
            return -1;
    }
#undef NAMES
    snprintf(a, sizeof a, "%s.add", p);
    fl_layer *add = fl_add_create(a, true);
    return add && fl_net_add2(net, add, last, skip) >= 0 ? fl_net_num_layers(net) - 1 : -1;
}

/* stages of blocks[i] blocks with planes 2^i base, stride 2 from the second; returns the last
 * layer's index and sets *ch to its channels */
static int stages(fl_net *net, int cur, int64_t *ch, int nstages, const int *blocks,
                  int64_t base, int expansion, char shortcut) {
    char p[32];
    for (int st = 0; st < nstages && cur >= 0; st++) {
        int64_t planes = base << st;
        for (int i = 0; i < blocks[st] && cur >= 0; i++) {
            snprintf(p, sizeof p, "layer%d.%d", st + 1, i);
            cur = block(net, p, cur, *ch, planes, i == 0 && st > 0 ? 2 : 1, expansion, shortcut);
            *ch = planes * expansion;
        }
    }
    return cur;
}

fl_net *fl_model_resnet(fl_dtype t, int layers, int64_t classes) {
    static const struct {
        int layers, expansion, blocks[4];
    } arch[] = {{18, 1, {2, 2, 2, 2}},
                {34, 1, {3, 4, 6, 3}},
                {50, 4, {3, 4, 6, 3}},
                {101, 4, {3, 4, 23, 3}},
                {152, 4, {3, 8, 36, 3}}};
    int a = -1;
    for (int i = 0; i < (int)(sizeof arch / sizeof arch[0]); i++)
        if (arch[i].layers == layers)
            a = i;
    if (a < 0 || classes < 1) {
        fl_fail(FL_EINVAL, "resnet: layers %d is not one of 18, 34, 50, 101, 152 (or classes "
                "%lld < 1)", layers, (long long)classes);
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    int64_t ch = 64;
    int cur = conv_bn(net, "conv1", "bn1", -2, 3, 64, 7, 2, true);
    if (cur >= 0)
        cur = nn_put(net, fl_pool2d_create("maxpool", FL_POOL_MAX, 3, 2, 1), -2);
    if (cur >= 0)
        cur = stages(net, cur, &ch, 4, arch[a].blocks, 64, arch[a].expansion, 'B');
    if (cur >= 0)
        cur = nn_put(net, fl_global_avg_pool_create("avgpool"), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_fc_create("fc", ch, classes, true), -2);
    if (cur < 0) {
        fl_fail_prefix(FL_EINVAL, "resnet%d", layers);
        fl_net_free(net);
        return NULL;
    }
    return net;
}

fl_net *fl_model_resnet_cifar(fl_dtype t, int depth, int64_t in_channels, int64_t classes,
                              char shortcut) {
    if (depth < 8 || (depth - 2) % 6 != 0 || classes < 1 || in_channels < 1 ||
        (shortcut != 'A' && shortcut != 'B')) {
        fl_fail(FL_EINVAL, "resnet_cifar: depth %d is not 6n + 2 with n >= 1 (20, 32, 44, 56, "
                "110), or in_channels %lld or classes %lld < 1, or shortcut '%c' is not A or B",
                depth, (long long)in_channels, (long long)classes, shortcut ? shortcut : '?');
        return NULL;
    }
    fl_net *net = fl_net_create(t, NULL);
    if (!net)
        return NULL;
    int n = (depth - 2) / 6, blocks[3] = {n, n, n};
    int64_t ch = 16;
    int cur = conv_bn(net, "conv1", "bn1", -2, in_channels, 16, 3, 1, true);
    if (cur >= 0)
        cur = stages(net, cur, &ch, 3, blocks, 16, 1, shortcut);
    if (cur >= 0)
        cur = nn_put(net, fl_global_avg_pool_create("avgpool"), -2);
    if (cur >= 0)
        cur = nn_put(net, fl_fc_create("fc", ch, classes, true), -2);
    if (cur < 0) {
        fl_fail_prefix(FL_EINVAL, "resnet_cifar%d", depth);
        fl_net_free(net);
        return NULL;
    }
    return net;
}
