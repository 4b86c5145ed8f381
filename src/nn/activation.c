/* activation.c - the elementwise activation layer (relu, tanh, sigmoid, hardswish, hardsigmoid)
 * for any shape.
 * No parameters; forward and backward are one kernel call each over all B * features values. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    fl_act act;
} act_impl;

static int act_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    *out_ndim = in_ndim;
    for (int i = 0; i < in_ndim; i++)
        out_shape[i] = in_shape[i];
    return FL_OK;
}

static int act_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    const act_impl *a = l->impl;
    FL_ASSERT(x->numel == y->numel);
    l->k->act_forward(l->adtype, a->act, x->data, y->data, x->numel);
    return FL_OK;
}

static int act_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y, const fl_tensor *dy,
                        fl_tensor *dx, bool accumulate) {
    const act_impl *a = l->impl;
    if (!dx) // no parameters: nothing to do without an input gradient
        return FL_OK;
    FL_ASSERT(dx->numel == dy->numel && dy->numel == x->numel);
    l->k->act_backward(l->adtype, a->act, x->data, y->data, dy->data, dx->data, x->numel);
    return FL_OK;
}

static void act_destroy(fl_layer *l) { free(l->impl); }

/* One table per activation so that ops->type names it ("relu", "tanh", ...). */
#define ACT_OPS(name_)                                                                   \
    {                                                                                    \
        .type = name_, .infer_shape = act_infer_shape, .forward = act_forward,           \
        .backward = act_backward, .destroy = act_destroy, .nhwc = true, .low = true,     \
    }
static const fl_layer_ops act_ops[] = {
    [FL_ACT_NONE] = ACT_OPS("identity"),
    [FL_ACT_RELU] = ACT_OPS("relu"),
    [FL_ACT_TANH] = ACT_OPS("tanh"),
    [FL_ACT_SIGMOID] = ACT_OPS("sigmoid"),
    [FL_ACT_HARDSWISH] = ACT_OPS("hardswish"),
    [FL_ACT_HARDSIGMOID] = ACT_OPS("hardsigmoid"),
};

fl_layer *fl_activation_create(const char *name, fl_act act) {
    if ((unsigned)act >= sizeof act_ops / sizeof act_ops[0]) {
        fl_fail(FL_EINVAL, "%s: unknown activation %d", name, (int)act);
        return NULL;
    }
    act_impl *a = malloc(sizeof *a);
    if (!a) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    a->act = act;
    fl_layer *l = fl_layer_new(&act_ops[act], name, a);
    if (!l)
        free(a);
    return l;
}
