/* zoo_blocks.c - the steps the model zoo's builders share (resnet.c and the PaddleClas models
 * pplcnet.c, pplcnetv2.c, pphgnet.c): appending a layer that reads a given earlier one, dotted
 * names, PaddleClas's channel rounding and its ConvBNLayer. */
#include "nn_impl.h"

#include <stdio.h>

int nn_put(fl_net *net, fl_layer *l, int from) {
    if (!l)
        return -1;
    int rc = from == -2 ? fl_net_add(net, l) : fl_net_add_from(net, l, from);
    return rc < 0 ? -1 : fl_net_num_layers(net) - 1;
}

const char *nn_name(char *buf, size_t len, const char *p, const char *s) {
    snprintf(buf, len, "%s.%s", p, s);
    return buf;
}

int64_t nn_make_divisible(double v) {
    int64_t d = 8, nv = (int64_t)(v + d / 2.0) / d * d;
    if (nv < d)
        nv = d;
    if ((double)nv < 0.9 * v)
        nv += d;
    return nv;
}

int nn_conv_bn(fl_net *net, const char *p, int from, int64_t in, int64_t out, int64_t k,
                   int64_t s, int64_t groups, fl_act act) {
    char b[256];
    fl_conv2d_opts o = {.in_channels = in, .out_channels = out, .kh = k, .kw = k, .sh = s,
                        .sw = s, .ph = (k - 1) / 2, .pw = (k - 1) / 2, .groups = groups};
    fl_layer *conv = fl_conv2d_create(nn_name(b, sizeof b, p, "conv"), &o);
    if (nn_put(net, nn_kaiming_in(conv), from) < 0)
        return -1;
    return nn_put(net, fl_batch_norm_create(nn_name(b, sizeof b, p, "bn"), out, act), -2);
}
