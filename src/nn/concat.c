/* concat.c - concatenation along channels, a two-input layer (fl_net_add2): a (C_A, H, W) and
 * b (C_B, H, W) -> (C_A + C_B, H, W), paddle.concat(axis=1), PP-HGNet's aggregation of its
 * blocks' outputs (Paddle's PP-HGNet; a chain of these joins more than two). Forward copies each
 * input into its run of channels, backward copies each run of dy back: the backend's
 * channel_slice, in either layout. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    int64_t ca, cb, hw; /* channels of a and b, pixels of a sample */
} cat_impl;

static int cat_infer_shape2(fl_layer *l, int a_ndim, const int64_t *a_shape, int b_ndim,
                            const int64_t *b_shape, int *out_ndim, int64_t *out_shape) {
    cat_impl *c = l->impl;
    char a[96], b[96];
    bool ok = a_ndim == b_ndim && (a_ndim == 1 || a_ndim == 3);
    for (int i = 1; ok && i < a_ndim; i++)
        ok = a_shape[i] == b_shape[i];
    if (!ok)
        return fl_fail(FL_ESHAPE, "%s: inputs %s and %s are not (C, H, W) (or (C)) of one size",
                       l->name, fl_shape_str(a_ndim, a_shape, a, sizeof a),
                       fl_shape_str(b_ndim, b_shape, b, sizeof b));
    c->ca = a_shape[0];
    c->cb = b_shape[0];
    c->hw = a_ndim == 3 ? a_shape[1] * a_shape[2] : 1;
    *out_ndim = a_ndim;
    for (int i = 0; i < a_ndim; i++)
        out_shape[i] = a_shape[i];
    out_shape[0] = c->ca + c->cb;
    return FL_OK;
}

static int cat_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    return cat_infer_shape2(l, in_ndim, in_shape, in_ndim, in_shape, out_ndim, out_shape);
}

static int cat_forward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, fl_tensor *y,
                       bool training) {
    (void)training;
    const cat_impl *c = l->impl;
    int64_t n = a->shape[0], oc = c->ca + c->cb;
    l->k->channel_slice(l->dtype, l->layout, n, c->hw, c->ca, a->data, oc, 0, y->data, true);
    l->k->channel_slice(l->dtype, l->layout, n, c->hw, c->cb, b->data, oc, c->ca, y->data, true);
    return FL_OK;
}

static int cat_backward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, const fl_tensor *y,
                        const fl_tensor *dy, fl_tensor *da, fl_tensor *db, bool accumulate) {
    (void)b;
    (void)y;
    (void)accumulate;
    const cat_impl *c = l->impl;
    int64_t n = a->shape[0], oc = c->ca + c->cb;
    if (da)
        l->k->channel_slice(l->dtype, l->layout, n, c->hw, c->ca, da->data, oc, 0, dy->data,
                            false);
    if (db)
        l->k->channel_slice(l->dtype, l->layout, n, c->hw, c->cb, db->data, oc, c->ca, dy->data,
                            false);
    return FL_OK;
}

static void cat_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops cat_ops = {
    .type = "concat",
    .infer_shape = cat_infer_shape,
    .infer_shape2 = cat_infer_shape2,
    .forward2 = cat_forward,
    .backward2 = cat_backward,
    .destroy = cat_destroy,
    .nhwc = true,
};

fl_layer *fl_concat_create(const char *name) {
    cat_impl *c = calloc(1, sizeof *c);
    if (!c) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    fl_layer *l = fl_layer_new(&cat_ops, name, c);
    if (!l)
        free(c);
    return l;
}
