/* shortcut.c - the parameter-free "option A" shortcut of the CIFAR ResNets (He et al. 2015,
 * arXiv:1512.03385, sec. 4.2): y[b, o + c, i, j] = x[b, c, s i, s j] with o = (OC - C) / 2 zero
 * channels on each side (as the widely used PyTorch CIFAR ResNet pads), zero elsewhere; in the
 * network's layout, NCHW or NHWC. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t oc, s, c, h, w, oh, ow;
} shortcut_impl;

static int sc_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                          int64_t *out_shape) {
    shortcut_impl *s = l->impl;
    char buf[96];
    if (in_ndim != 3 || in_shape[0] > s->oc)
        return fl_fail(FL_ESHAPE, "%s: input %s is not (C, H, W) with C <= %lld", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf), (long long)s->oc);
    s->c = in_shape[0];
    s->h = in_shape[1];
    s->w = in_shape[2];
    s->oh = (s->h + s->s - 1) / s->s;
    s->ow = (s->w + s->s - 1) / s->s;
    *out_ndim = 3;
    out_shape[0] = s->oc;
    out_shape[1] = s->oh;
    out_shape[2] = s->ow;
    return FL_OK;
}

/* forward: x into y's middle channels; backward: dy back into dx (the backend's channel_pad) */
static void move(fl_layer *l, int64_t b, void *x, void *y, bool forward) {
    const shortcut_impl *s = l->impl;
    l->k->channel_pad(l->adtype, l->layout, b, s->c, s->h, s->w, s->s, s->oc, x, y, forward);
}

static int sc_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    move(l, x->shape[0], x->data, y->data, true);
    return FL_OK;
}

static int sc_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y, const fl_tensor *dy,
                       fl_tensor *dx, bool accumulate) {
    (void)y;
    (void)accumulate;
    if (dx)
        move(l, x->shape[0], dx->data, dy->data, false);
    return FL_OK;
}

static void sc_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops sc_ops = {
    .type = "shortcut_pad",
    .nhwc = true,
    .low = true,
    .infer_shape = sc_infer_shape,
    .forward = sc_forward,
    .backward = sc_backward,
    .destroy = sc_destroy,
};

fl_layer *fl_shortcut_pad_create(const char *name, int64_t out_channels, int64_t stride) {
    if (out_channels < 1 || stride < 1) {
        fl_fail(FL_EINVAL, "%s: shortcut_pad needs out_channels and stride >= 1 (got %lld, %lld)",
                name, (long long)out_channels, (long long)stride);
        return NULL;
    }
    shortcut_impl *s = calloc(1, sizeof *s);
    if (!s) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    s->oc = out_channels;
    s->s = stride;
    fl_layer *l = fl_layer_new(&sc_ops, name, s);
    if (!l)
        free(s);
    return l;
}
