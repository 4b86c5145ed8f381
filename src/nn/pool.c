/* pool.c - max and average pooling layers over (B, C, H, W) in the network's layout, and
 * global average pooling (B, C, H, W) -> (B, C), which is average pooling with an H x W window
 * (its (B, C, 1, 1) output is the same in either layout), and the same keeping the (1, 1)
 * (adaptive_avg_pool, Paddle's AdaptiveAvgPool2D(1)). The computation is the backend's
 * pool_forward / pool_backward. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    fl_pool      pool;
    int64_t      k, s, p;
    bool         global;
    bool         keepdim; /* global: (C, 1, 1) rather than (C) */
    fl_conv_geom g; /* per image: c channels */
} pool_impl;

static int pool_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                            int64_t *out_shape) {
    pool_impl *pi = l->impl;
    char buf[96];
    if (in_ndim != 3)
        return fl_fail(FL_ESHAPE, "%s: input %s is not (C, H, W)", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf));
    fl_conv_geom g = {.c = in_shape[0], .h = in_shape[1], .w = in_shape[2], .kh = pi->k,
                      .kw = pi->k, .sh = pi->s, .sw = pi->s, .ph = pi->p, .pw = pi->p,
                      .dh = 1, .dw = 1};
    if (pi->global) {
        g.kh = g.h;
        g.kw = g.w;
        g.sh = g.sw = 1;
    }
    if (!pi->global && 2 * pi->p > pi->k)
        return fl_fail(FL_ESHAPE, "%s: padding %lld is more than half the window %lld", l->name,
                       (long long)pi->p, (long long)pi->k);
    if (!fl_conv_geom_out(&g))
        return fl_fail(FL_ESHAPE, "%s: a %lldx%lld window does not fit the input %s", l->name,
                       (long long)g.kh, (long long)g.kw,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf));
    pi->g = g;
    out_shape[0] = in_shape[0];
    if (pi->global && !pi->keepdim) {
        *out_ndim = 1;
    } else {
        *out_ndim = 3;
        out_shape[1] = g.oh;
        out_shape[2] = g.ow;
    }
    return FL_OK;
}

static int pool_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    pool_impl *pi = l->impl;
    l->k->pool_forward(l->adtype, l->layout, pi->pool, x->shape[0], &pi->g, x->data, y->data);
    return FL_OK;
}

static int pool_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                         const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)y;
    (void)accumulate;
    pool_impl *pi = l->impl;
    if (!dx)
        return FL_OK;
    l->k->pool_backward(l->adtype, l->layout, pi->pool, x->shape[0], &pi->g, x->data, dy->data,
                        dx->data);
    return FL_OK;
}

static void pool_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops pool_ops = {
    .type = "pool2d",
    .infer_shape = pool_infer_shape,
    .forward = pool_forward,
    .backward = pool_backward,
    .nhwc = true,
    .low = true,
    .destroy = pool_destroy,
};

static const fl_layer_ops gap_ops = {
    .type = "global_avg_pool",
    .infer_shape = pool_infer_shape,
    .forward = pool_forward,
    .backward = pool_backward,
    .nhwc = true,
    .low = true,
    .destroy = pool_destroy,
};

static const fl_layer_ops adaptive_ops = {
    .type = "adaptive_avg_pool",
    .infer_shape = pool_infer_shape,
    .forward = pool_forward,
    .backward = pool_backward,
    .nhwc = true,
    .low = true,
    .destroy = pool_destroy,
};

static fl_layer *create(const char *name, const fl_layer_ops *ops, fl_pool pool, int64_t k,
                        int64_t s, int64_t p, bool global) {
    pool_impl *pi = calloc(1, sizeof *pi);
    if (!pi) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    *pi = (pool_impl){.pool = pool, .k = k, .s = s ? s : k, .p = p, .global = global,
                      .keepdim = ops == &adaptive_ops};
    fl_layer *l = fl_layer_new(ops, name, pi);
    if (!l)
        free(pi);
    return l;
}

fl_layer *fl_pool2d_create(const char *name, fl_pool pool, int64_t k, int64_t s, int64_t p) {
    if ((pool != FL_POOL_MAX && pool != FL_POOL_AVG) || k < 1 || s < 0 || p < 0) {
        fl_fail(FL_EINVAL, "%s: pool2d needs max or avg, window >= 1, stride >= 0 (0: window) "
                "and padding >= 0 (got window %lld, stride %lld, padding %lld)", name,
                (long long)k, (long long)s, (long long)p);
        return NULL;
    }
    return create(name, &pool_ops, pool, k, s, p, false);
}

fl_layer *fl_global_avg_pool_create(const char *name) {
    return create(name, &gap_ops, FL_POOL_AVG, 1, 1, 0, true);
}

fl_layer *fl_adaptive_avg_pool_create(const char *name) {
    return create(name, &adaptive_ops, FL_POOL_AVG, 1, 1, 0, true);
}
