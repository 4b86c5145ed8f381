/* flatten.c - (B, d1, d2, ...) -> (B, d1 d2 ...) in NCHW order, Paddle's nn.Flatten(1, -1), the
 * step between a spatial network and its fc. In an NHWC network a (C, H, W) input is reordered
 * to NCHW (the backend's reorder, one call each way), so an fc after it sees PyTorch's and
 * Paddle's order whatever the layout; otherwise a copy. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    bool    spatial; /* the input is (C, H, W) */
    int64_t c, hw;
} flat_impl;

static int flat_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                            int64_t *out_shape) {
    flat_impl *f = l->impl;
    f->spatial = in_ndim == 3;
    f->c = in_ndim > 0 ? in_shape[0] : 1;
    f->hw = f->spatial ? in_shape[1] * in_shape[2] : 1;
    *out_ndim = 1;
    out_shape[0] = fl_shape_numel(in_ndim, in_shape);
    return FL_OK;
}

/* y = x, from the layout to NCHW (to_nhwc false) or back (true) */
static void move(fl_layer *l, bool to_nhwc, const fl_tensor *src, void *dst) {
    const flat_impl *f = l->impl;
    if (f->spatial && l->layout == FL_LAYOUT_NHWC && f->hw > 1)
        l->k->reorder(l->adtype, to_nhwc, src->shape[0], f->c, f->hw, src->data, dst);
    else if (src->numel > 0)
        l->k->copy(dst, src->data, fl_tensor_nbytes(src), FL_COPY_D2D, NULL);
}

static int flat_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    move(l, false, x, y->data);
    return FL_OK;
}

static int flat_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                         const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)x;
    (void)y;
    (void)accumulate;
    if (dx)
        move(l, true, dy, dx->data);
    return FL_OK;
}

static void flat_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops flat_ops = {
    .type = "flatten",
    .infer_shape = flat_infer_shape,
    .forward = flat_forward,
    .backward = flat_backward,
    .destroy = flat_destroy,
    .nhwc = true,
    .low = true,
};

fl_layer *fl_flatten_create(const char *name) {
    flat_impl *f = calloc(1, sizeof *f);
    if (!f) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    fl_layer *l = fl_layer_new(&flat_ops, name, f);
    if (!l)
        free(f);
    return l;
}
