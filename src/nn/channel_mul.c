/* channel_mul.c - the channel-wise scale of squeeze-and-excitation (Hu et al. 2018,
 * arXiv:1709.01507; PP-LCNet's SEModule ends with paddle.multiply(x, s)): y = x * s with s one
 * factor per sample and channel, a two-input layer (fl_net_add2) whose second input is smaller
 * than the first (infer_shape2). One backend call each way (channel_mul_forward / _backward),
 * in either layout: s (C, 1, 1) has the same memory in both. Runs in the activations' dtype
 * (l->adtype: under native amp x, s and y all f16 / bf16, docs/amp.md). */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t c, hw; /* channels, pixels of a sample of x */
} mul_impl;

static int mul_infer_shape2(fl_layer *l, int a_ndim, const int64_t *a_shape, int b_ndim,
                            const int64_t *b_shape, int *out_ndim, int64_t *out_shape) {
    mul_impl *m = l->impl;
    char a[96], b[96];
    bool ok = a_ndim >= 1 && (b_ndim == 1 || b_ndim == a_ndim) && b_shape[0] == a_shape[0];
    for (int i = 1; ok && i < b_ndim; i++)
        ok = b_shape[i] == 1;
    if (!ok)
        return fl_fail(FL_ESHAPE, "%s: the scale %s is not (C) or (C, 1, 1) for the input %s",
                       l->name, fl_shape_str(b_ndim, b_shape, b, sizeof b),
                       fl_shape_str(a_ndim, a_shape, a, sizeof a));
    m->c = a_shape[0];
    m->hw = fl_shape_numel(a_ndim - 1, a_shape + 1);
    *out_ndim = a_ndim;
    memcpy(out_shape, a_shape, (size_t)a_ndim * sizeof *a_shape);
    return FL_OK;
}

static int mul_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    return mul_infer_shape2(l, in_ndim, in_shape, in_ndim, in_shape, out_ndim, out_shape);
}

static int mul_forward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, fl_tensor *y,
                       bool training) {
    (void)training;
    const mul_impl *m = l->impl;
    l->k->channel_mul_forward(l->adtype, l->layout, a->shape[0], m->c, m->hw, a->data, b->data,
                              y->data);
    return FL_OK;
}

static int mul_backward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, const fl_tensor *y,
                        const fl_tensor *dy, fl_tensor *da, fl_tensor *db, bool accumulate) {
    (void)y;
    (void)accumulate;
    const mul_impl *m = l->impl;
    if (!da && !db)
        return FL_OK;
    l->k->channel_mul_backward(l->adtype, l->layout, a->shape[0], m->c, m->hw, a->data, b->data,
                               dy->data, da ? da->data : NULL, db ? db->data : NULL);
    return FL_OK;
}

static void mul_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops mul_ops = {
    .type = "channel_mul",
    .infer_shape = mul_infer_shape,
    .infer_shape2 = mul_infer_shape2,
    .forward2 = mul_forward,
    .backward2 = mul_backward,
    .destroy = mul_destroy,
    .nhwc = true,
    .low = true,
};

fl_layer *fl_channel_mul_create(const char *name) {
    mul_impl *m = calloc(1, sizeof *m);
    if (!m) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    fl_layer *l = fl_layer_new(&mul_ops, name, m);
    if (!l)
        free(m);
    return l;
}
