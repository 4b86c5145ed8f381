/* concat.c - concatenation along channels of N inputs in one layer (forwardn: fl_net_add_n):
 * x_k (C_k, H, W), k = 0 .. n - 1, -> (C_0 + .. + C_{n-1}, H, W), paddle.concat(axis=1),
 * PP-HGNet's aggregation of a block's input and its layers' outputs (Paddle's PP-HGNet). Forward
 * copies each input once into its run of channels, backward copies each run of dy back: the
 * backend's channel_slice, in either layout. One layer of n inputs copies each value once each
 * way, where a chain of two-input concatenations copied the growing tensor again at every link.
 * It copies in the activations' dtype (l->adtype: f16 / bf16 under native amp, docs/amp.md). */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    int     n;                    /* inputs */
    int64_t c[FL_NET_MAX_INPUTS]; /* channels of each */
    int64_t oc, hw;               /* channels of the output, pixels of a sample */
} cat_impl;

static int cat_infer_shapen(fl_layer *l, int n, const int *ndim, const int64_t *const *shape,
                            int *out_ndim, int64_t *out_shape) {
    cat_impl *c = l->impl;
    char a[96], b[96];
    if (n < 1 || n > FL_NET_MAX_INPUTS)
        return fl_fail(FL_EINVAL, "%s: %d inputs (1 to %d)", l->name, n, FL_NET_MAX_INPUTS);
    if (ndim[0] != 1 && ndim[0] != 3)
        return fl_fail(FL_ESHAPE, "%s: input 0 %s is not (C, H, W) or (C)", l->name,
                       fl_shape_str(ndim[0], shape[0], a, sizeof a));
    c->n = n;
    c->oc = 0;
    for (int k = 0; k < n; k++) {
        bool ok = ndim[k] == ndim[0];
        for (int i = 1; ok && i < ndim[0]; i++)
            ok = shape[k][i] == shape[0][i];
        if (!ok)
            return fl_fail(FL_ESHAPE, "%s: input %d %s does not fit input 0 %s (the same H and "
                           "W, or both (C))", l->name, k,
                           fl_shape_str(ndim[k], shape[k], b, sizeof b),
                           fl_shape_str(ndim[0], shape[0], a, sizeof a));
        c->c[k] = shape[k][0];
        c->oc += shape[k][0];
    }
    c->hw = ndim[0] == 3 ? shape[0][1] * shape[0][2] : 1;
    *out_ndim = ndim[0];
    for (int i = 0; i < ndim[0]; i++)
        out_shape[i] = shape[0][i];
    out_shape[0] = c->oc;
    return FL_OK;
}

/* one input: the network does not call it (infer_shapen is set); a copy */
static int cat_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    return cat_infer_shapen(l, 1, &in_ndim, &in_shape, out_ndim, out_shape);
}

static int cat_forward(fl_layer *l, int n, const fl_tensor *const *x, fl_tensor *y,
                       bool training) {
    (void)training;
    const cat_impl *c = l->impl;
    FL_ASSERT(n == c->n);
    int64_t b = x[0]->shape[0], off = 0;
    for (int k = 0; k < n; k++) {
        l->k->channel_slice(l->adtype, l->layout, b, c->hw, c->c[k], x[k]->data, c->oc, off,
                            y->data, true);
        off += c->c[k];
    }
    return FL_OK;
}

static int cat_backward(fl_layer *l, int n, const fl_tensor *const *x, const fl_tensor *y,
                        const fl_tensor *dy, fl_tensor *const *dx, bool accumulate) {
    (void)y;
    (void)accumulate; /* no parameters */
    const cat_impl *c = l->impl;
    FL_ASSERT(n == c->n);
    int64_t b = x[0]->shape[0], off = 0;
    for (int k = 0; k < n; k++) {
        if (dx[k])
            l->k->channel_slice(l->adtype, l->layout, b, c->hw, c->c[k], dx[k]->data, c->oc,
                                off, dy->data, false);
        off += c->c[k];
    }
    return FL_OK;
}

static void cat_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops cat_ops = {
    .type = "concat",
    .infer_shape = cat_infer_shape,
    .infer_shapen = cat_infer_shapen,
    .forwardn = cat_forward,
    .backwardn = cat_backward,
    .destroy = cat_destroy,
    .nhwc = true,
    .low = true,
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
