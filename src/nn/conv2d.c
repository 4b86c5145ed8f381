/* conv2d.c - the 2-D convolution layer (NCHW or NHWC activations, stride, padding, dilation,
 * groups): shapes, parameters and their initialisation; the computation is the backend's
 * (conv_plan_create once the shapes and the largest batch are known, then conv_forward,
 * conv_backward_filter and conv_backward_data). */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_conv2d_opts o;
    fl_conv_geom   g;    /* one image: c = IC, output OH, OW */
    fl_conv_plan  *plan; /* the backend's, for g and the network's largest batch */
} conv_impl;

static int conv_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                            int64_t *out_shape) {
    conv_impl *c = l->impl;
    char buf[96];
    if (in_ndim != 3 || in_shape[0] != c->o.in_channels)
        return fl_fail(FL_ESHAPE, "%s: input %s is not (%lld, H, W)", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf),
                       (long long)c->o.in_channels);
    fl_conv_geom g = {.c = in_shape[0], .h = in_shape[1], .w = in_shape[2], .kh = c->o.kh,
                      .kw = c->o.kw, .sh = c->o.sh, .sw = c->o.sw, .ph = c->o.ph,
                      .pw = c->o.pw, .dh = c->o.dh, .dw = c->o.dw};
    if (!fl_conv_geom_out(&g))
        return fl_fail(FL_ESHAPE, "%s: a %lldx%lld kernel (dilation %lld, %lld, padding %lld, "
                       "%lld) does not fit the input %s", l->name, (long long)g.kh,
                       (long long)g.kw, (long long)g.dh, (long long)g.dw, (long long)g.ph,
                       (long long)g.pw, fl_shape_str(in_ndim, in_shape, buf, sizeof buf));
    c->g = g;
    *out_ndim = 3;
    out_shape[0] = c->o.out_channels;
    out_shape[1] = g.oh;
    out_shape[2] = g.ow;
    return FL_OK;
}

/* The backend's plan for the shape infer_shape settled and the network's largest batch; its
 * scratch is what the layer asks the network for. A plan the backend cannot make is a build
 * error: SIZE_MAX, with the backend's message. */
static size_t conv_scratch_bytes(fl_layer *l, int64_t max_batch) {
    conv_impl *c = l->impl;
    if (c->plan)
        l->k->conv_plan_free(c->plan);
    fl_conv_desc d = {.dtype = l->adtype, .layout = l->layout, .max_batch = max_batch,
                      .oc = c->o.out_channels, .groups = c->o.groups, .bias = c->o.bias,
                      .g = c->g};
    c->plan = l->k->conv_plan_create(&d);
    return c->plan ? l->k->conv_scratch_bytes(c->plan) : SIZE_MAX;
}

/* torchvision ResNet: kaiming_normal_(mode="fan_out", nonlinearity="relu"), bias 0; or
 * Paddle's (fl_layer_set_init: the conv's default, KaimingNormal's fan in) */
static void conv_init(fl_layer *l, fl_rng *rng) {
    const conv_impl *c = l->impl;
    fl_rng r;
    nn_param_rng(rng, 0, &r);
    double k = (double)(c->o.kh * c->o.kw);
    double fan = l->init == FL_INIT_PADDLE           ? (double)c->o.in_channels * k
                 : l->init == FL_INIT_KAIMING_FAN_IN ? (double)(c->o.in_channels / c->o.groups) * k
                                                     : (double)c->o.out_channels * k;
    double std = sqrt(2.0 / fan);
    fl_tensor *w = &l->params[0].value;
    double z[256]; /* fl_rng_normal's draws, a batch at a time (fl_rng_normals: the same draws) */
    for (int64_t i0 = 0; i0 < w->numel; i0 += 256) {
        int64_t nb = w->numel - i0 < 256 ? w->numel - i0 : 256;
        fl_rng_normals(&r, z, nb);
        for (int64_t i = 0; i < nb; i++) {
            double v = std * z[i];
            if (l->dtype == FL_DTYPE_F32)
                ((float *)w->data)[i0 + i] = (float)v;
            else
                ((double *)w->data)[i0 + i] = v;
        }
    }
    /* init writes host memory (fl_net_build moves it to a device): no table function here */
    if (c->o.bias)
        memset(l->params[1].value.data, 0, fl_tensor_nbytes(&l->params[1].value));
}

static int conv_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    conv_impl *c = l->impl;
    FL_ASSERT(c->plan); // fl_net_build failed otherwise
    l->k->conv_forward(c->plan, x->shape[0], x->data, l->params[0].value.data,
                       c->o.bias ? l->params[1].value.data : NULL, y->data, l->scratch);
    return FL_OK;
}

static int conv_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                         const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)y;
    conv_impl *c = l->impl;
    l->k->conv_backward_filter(c->plan, x->shape[0], x->data, dy->data, l->params[0].grad.data,
                               c->o.bias ? l->params[1].grad.data : NULL, accumulate,
                               l->scratch);
    if (dx)
        l->k->conv_backward_data(c->plan, x->shape[0], dy->data, l->params[0].value.data,
                                 dx->data, l->scratch);
    return FL_OK;
}

static void conv_destroy(fl_layer *l) {
    conv_impl *c = l->impl;
    if (c->plan)
        l->k->conv_plan_free(c->plan);
    free(c);
}

static const fl_layer_ops conv_ops = {
    .type = "conv2d",
    .infer_shape = conv_infer_shape,
    .init = conv_init,
    .forward = conv_forward,
    .backward = conv_backward,
    .destroy = conv_destroy,
    .scratch_bytes = conv_scratch_bytes,
    .nhwc = true,
    .low = true,
};

fl_layer *fl_conv2d_create(const char *name, const fl_conv2d_opts *opts) {
    FL_ASSERT(name && opts);
    fl_conv2d_opts o = *opts;
    o.sh = o.sh ? o.sh : 1;
    o.sw = o.sw ? o.sw : 1;
    o.dh = o.dh ? o.dh : 1;
    o.dw = o.dw ? o.dw : 1;
    o.groups = o.groups ? o.groups : 1;
    if (o.in_channels < 1 || o.out_channels < 1 || o.kh < 1 || o.kw < 1 || o.sh < 1 ||
        o.sw < 1 || o.ph < 0 || o.pw < 0 || o.dh < 1 || o.dw < 1 || o.groups < 1) {
        fl_fail(FL_EINVAL, "%s: conv2d needs channels, kernel, stride and dilation >= 1 and "
                "padding >= 0 (got in %lld, out %lld, kernel %lldx%lld, stride %lld, %lld, "
                "padding %lld, %lld, dilation %lld, %lld, groups %lld)", name,
                (long long)o.in_channels, (long long)o.out_channels, (long long)o.kh,
                (long long)o.kw, (long long)o.sh, (long long)o.sw, (long long)o.ph,
                (long long)o.pw, (long long)o.dh, (long long)o.dw, (long long)o.groups);
        return NULL;
    }
    if (o.in_channels % o.groups || o.out_channels % o.groups) {
        fl_fail(FL_EINVAL, "%s: groups %lld must divide in_channels %lld and out_channels %lld",
                name, (long long)o.groups, (long long)o.in_channels, (long long)o.out_channels);
        return NULL;
    }
    conv_impl *c = calloc(1, sizeof *c);
    if (!c) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    c->o = o;
    fl_layer *l = fl_layer_new(&conv_ops, name, c);
    if (!l) {
        free(c);
        return NULL;
    }
    int64_t wshape[4] = {o.out_channels, o.in_channels / o.groups, o.kh, o.kw};
    if (fl_layer_add_param(l, "weight", 4, wshape, true) < 0)
        goto fail;
    if (o.bias && fl_layer_add_param(l, "bias", 1, &o.out_channels, true) < 0)
        goto fail;
    return l;
fail:
    fl_layer_free(l);
    return NULL;
}
