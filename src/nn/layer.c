/* layer.c - the generic part of a layer: its struct, its declared parameters, and freeing it.
 * Parameters are declared here with names and shapes only; fl_net_build gives them memory. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fl_layer *fl_layer_set_init(fl_layer *l, fl_init_scheme s) {
    if (!l)
        return NULL;
    bool conv = strcmp(l->ops->type, "conv2d") == 0, fc = strcmp(l->ops->type, "fc") == 0;
    bool ok = s == FL_INIT_TORCH || (s == FL_INIT_PADDLE && (conv || fc)) ||
              (s == FL_INIT_KAIMING_FAN_IN && conv);
    if (!ok) {
        fl_fail(FL_EINVAL, "%s: a %s layer has no initialisation scheme %d", l->name,
                l->ops->type, (int)s);
        fl_layer_free(l);
        return NULL;
    }
    l->init = (int)s;
    return l;
}

fl_layer *fl_layer_new(const fl_layer_ops *ops, const char *name, void *impl) {
    FL_ASSERT(ops && name);
    if (strlen(name) >= sizeof ((fl_layer *)0)->name) {
        fl_fail(FL_EINVAL, "layer name '%s' is longer than %zu characters", name,
                sizeof ((fl_layer *)0)->name - 1);
        return NULL;
    }
    fl_layer *l = calloc(1, sizeof *l);
    if (!l) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    l->ops = ops;
    strcpy(l->name, name);
    l->dtype = l->adtype = FL_DTYPE_F32;
    l->impl = impl;
    return l;
}

int fl_layer_add_param(fl_layer *l, const char *suffix, int ndim, const int64_t *shape,
                       bool trainable) {
    FL_ASSERT(l && suffix && ndim >= 0 && ndim <= FL_MAX_DIMS);
    fl_param p;
    memset(&p, 0, sizeof p);
    int len = snprintf(p.name, sizeof p.name, "%s.%s", l->name, suffix);
    if (len < 0 || (size_t)len >= sizeof p.name)
        return fl_fail(FL_EINVAL, "%s: parameter name '%s.%s' is longer than %zu characters",
                       l->name, l->name, suffix, sizeof p.name - 1);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return fl_fail(FL_EINVAL, "%s: dimension %d of %s is negative", l->name, i, p.name);
    fl_param *grown = realloc(l->params, (size_t)(l->nparams + 1) * sizeof *grown);
    if (!grown)
        return fl_fail(FL_ENOMEM, "%s: out of memory", l->name);
    l->params = grown;
    fl_tensor_view(&p.value, l->dtype, ndim, shape, NULL);
    fl_tensor_view(&p.grad, l->dtype, ndim, shape, NULL);
    p.trainable = trainable;
    l->params[l->nparams] = p;
    return l->nparams++;
}

void fl_layer_free(fl_layer *l) {
    if (!l)
        return;
    if (l->ops && l->ops->destroy)
        l->ops->destroy(l);
    free(l->params);
    free(l);
}

void nn_fill_uniform(fl_tensor *t, fl_rng *r, double bound) {
    if (t->dtype == FL_DTYPE_F32) {
        float *v = t->data, b = (float)bound;
        for (int64_t i = 0; i < t->numel; i++)
            v[i] = (2.0f * fl_rng_uniform(r) - 1.0f) * b;
    } else {
        FL_ASSERT(t->dtype == FL_DTYPE_F64);
        double *v = t->data;
        for (int64_t i = 0; i < t->numel; i++)
            v[i] = (2.0 * fl_rng_uniform_f64(r) - 1.0) * bound;
    }
}

/* Every ops->type of the layers in src/nn, for mixed precision's lists (fl_net_set_amp). */
static const char *const layer_types[] = {"fc", "conv2d", "batch_norm", "pool2d",
                                          "global_avg_pool", "add", "dropout", "shortcut_pad",
                                          "relu", "tanh", "sigmoid", "identity",
                                          "hardswish", "hardsigmoid", "adaptive_avg_pool",
                                          "flatten", "channel_mul", "concat", "slice"};

bool fl_layer_type_known(const char *type) {
    for (size_t i = 0; i < sizeof layer_types / sizeof layer_types[0]; i++)
        if (strcmp(type, layer_types[i]) == 0)
            return true;
    return false;
}

const char *fl_layer_type_names(void) {
    return "fc, conv2d, batch_norm, pool2d, global_avg_pool, add, dropout, shortcut_pad, relu, "
           "tanh, sigmoid, identity, hardswish, hardsigmoid, adaptive_avg_pool, flatten, "
           "channel_mul, concat, slice";
}
