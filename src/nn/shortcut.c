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

/* Element strides of an (n, c, h, w) image batch in layout l. */
typedef struct {
    int64_t n, c, y, x;
} strides;
static strides strides_of(fl_layout l, int64_t c, int64_t h, int64_t w) {
    return l == FL_LAYOUT_NHWC ? (strides){h * w * c, 1, w * c, c}
                               : (strides){c * h * w, h * w, w, 1};
}

/* forward: gather x into y's middle channels; backward: scatter dy back into dx (either
 * layout: every element is addressed through its layout's strides) */
#define STAMP_SC(T, S)                                                                        \
    static void move_##S(const shortcut_impl *s, fl_layout l, int64_t b, T *x, T *y,          \
                         bool forward) {                                                      \
        int64_t off = (s->oc - s->c) / 2;                                                     \
        strides sx = strides_of(l, s->c, s->h, s->w), sy = strides_of(l, s->oc, s->oh, s->ow); \
        if (forward)                                                                          \
            memset(y, 0, (size_t)(b * s->oc * s->oh * s->ow) * sizeof(T));                    \
        else                                                                                  \
            memset(x, 0, (size_t)(b * s->c * s->h * s->w) * sizeof(T));                       \
        for (int64_t n = 0; n < b; n++)                                                       \
            for (int64_t i = 0; i < s->oh; i++)                                               \
                for (int64_t j = 0; j < s->ow; j++)                                           \
                    for (int64_t c = 0; c < s->c; c++) {                                      \
                        T *xv = x + n * sx.n + c * sx.c + i * s->s * sx.y + j * s->s * sx.x;  \
                        T *yv = y + n * sy.n + (c + off) * sy.c + i * sy.y + j * sy.x;        \
                        if (forward)                                                          \
                            *yv = *xv;                                                        \
                        else                                                                  \
                            *xv = *yv;                                                        \
                    }                                                                         \
    }
STAMP_SC(float, f32)
STAMP_SC(double, f64)

static void move(fl_layer *l, int64_t b, void *x, void *y, bool forward) {
    if (l->dtype == FL_DTYPE_F32)
        move_f32(l->impl, l->layout, b, x, y, forward);
    else
        move_f64(l->impl, l->layout, b, x, y, forward);
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
