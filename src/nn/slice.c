/* slice.c - a run of columns of a (B, F) input: y (B, COUNT) = x[:, start : start + count]
 * (paddle.slice on axis 1), what lets a network read part of its input, such as the dense
 * features of a CTR model whose input also holds the embeddings. Both directions are the
 * backend's channel_slice with one pixel per channel; backward zero-fills dx first. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    int64_t start, count, in; /* in: F, set by infer_shape */
} slice_impl;

static int slice_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                             int64_t *out_shape) {
    slice_impl *s = l->impl;
    char buf[96];
    if (in_ndim != 1 || s->start + s->count > in_shape[0])
        return fl_fail(FL_ESHAPE, "%s: input %s has no columns [%lld, %lld) (want (F) with F >= "
                       "%lld)", l->name, fl_shape_str(in_ndim, in_shape, buf, sizeof buf),
                       (long long)s->start, (long long)(s->start + s->count),
                       (long long)(s->start + s->count));
    s->in = in_shape[0];
    *out_ndim = 1;
    out_shape[0] = s->count;
    return FL_OK;
}

static int slice_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    const slice_impl *s = l->impl;
    /* channel_slice's backward direction copies channels [off, off + c) of the whole into x */
    l->k->channel_slice(l->adtype, FL_LAYOUT_NCHW, x->shape[0], 1, s->count, y->data, s->in,
                        s->start, x->data, false);
    return FL_OK;
}

static int slice_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                          const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)y;
    (void)accumulate;
    const slice_impl *s = l->impl;
    if (!dx)
        return FL_OK;
    l->k->fill(l->adtype, dx->data, dx->numel, 0.0);
    l->k->channel_slice(l->adtype, FL_LAYOUT_NCHW, x->shape[0], 1, s->count, dy->data, s->in,
                        s->start, dx->data, true);
    return FL_OK;
}

static void slice_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops slice_ops = {
    .low = true,
    .type = "slice",
    .infer_shape = slice_infer_shape,
    .forward = slice_forward,
    .backward = slice_backward,
    .destroy = slice_destroy,
};

fl_layer *fl_slice_create(const char *name, int64_t start, int64_t count) {
    if (start < 0 || count < 1) {
        fl_fail(FL_EINVAL, "%s: slice needs start >= 0 and count >= 1 (got %lld, %lld)", name,
                (long long)start, (long long)count);
        return NULL;
    }
    slice_impl *s = calloc(1, sizeof *s);
    if (!s) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    s->start = start;
    s->count = count;
    fl_layer *l = fl_layer_new(&slice_ops, name, s);
    if (!l)
        free(s);
    return l;
}
