/* batch_norm.c - batch normalisation (Ioffe & Szegedy 2015, arXiv:1502.03167) over the channel
 * dimension of (B, C, ...) inputs with PyTorch's BatchNorm2d semantics: batch statistics and a
 * running-average update (momentum 0.1, unbiased running variance) in training, running
 * statistics in inference, eps 1e-5; optionally with the following ReLU or hardswish fused in
 * (one pass over the activations instead of two each way, one tensor fewer kept). The
 * computation is the backend's (bn_forward, bn_backward); the layer keeps the mean and
 * variance a forward used (C doubles each, the backend's memory, allocated when the network is
 * built) for backward, and updates the running statistics on the host: in place on the CPU
 * backends, through host copies of the 4 C values on a device. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BN_MOMENTUM 0.1
#define BN_EPS NN_BN_EPS

typedef struct {
    int64_t   c, hw;
    fl_layout layout;         /* of the input: the network's for (C, H, W), else NCHW */
    fl_act    act;            /* fused: none, relu or hardswish */
    bool      training;       /* of the last forward */
    const fl_backend *mk;     /* the backend whose memory holds mean and var */
    double   *mean, *var;     /* (C) each, one allocation of mk's: what the last forward used */
    /* host copies where mk's memory is not the host's (NULL on the CPU backends): the
     * statistics (mean, then var) and the running statistics (running_mean, then
     * running_var, in the network's dtype) */
    double   *hstat;
    void     *hrun;
} bn_impl;

static void free_stats(bn_impl *bn) {
    if (bn->mk)
        bn->mk->free(bn->mean);
    free(bn->hstat);
    free(bn->hrun);
    bn->mk = NULL;
    bn->mean = bn->var = bn->hstat = NULL;
    bn->hrun = NULL;
}

/* mean and var in the memory of the layer's backend (set by the network before it infers
 * shapes), and their host copies on a device */
static int alloc_stats(fl_layer *l, bn_impl *bn) {
    if (bn->mk == l->k)
        return FL_OK;
    free_stats(bn);
    size_t bytes = (size_t)(2 * bn->c) * sizeof(double);
    if (!(bn->mean = l->k->alloc(bytes)))
        return fl_fail(FL_ENOMEM, "%s: cannot allocate its statistics", l->name);
    bn->mk = l->k;
    bn->var = bn->mean + bn->c;
    if (!l->k->host_memory &&
        (!(bn->hstat = malloc(bytes)) || !(bn->hrun = malloc(bytes)))) {
        free_stats(bn);
        return fl_fail(FL_ENOMEM, "%s: out of memory", l->name);
    }
    return FL_OK;
}

static int bn_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                          int64_t *out_shape) {
    bn_impl *bn = l->impl;
    char buf[96];
    if (in_ndim < 1 || in_shape[0] != bn->c)
        return fl_fail(FL_ESHAPE, "%s: input %s does not have %lld channels first", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf), (long long)bn->c);
    bn->hw = fl_shape_numel(in_ndim - 1, in_shape + 1);
    bn->layout = in_ndim == 3 ? l->layout : FL_LAYOUT_NCHW;
    FL_TRY(alloc_stats(l, bn));
    *out_ndim = in_ndim;
    memcpy(out_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    return FL_OK;
}

static void put(fl_dtype t, void *p, int64_t i, double v) {
    if (t == FL_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

static double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* weight 1, bias 0, running_mean 0, running_var 1 (PyTorch's reset_parameters) */
static void bn_init(fl_layer *l, fl_rng *rng) {
    (void)rng;
    bn_impl *bn = l->impl;
    for (int64_t i = 0; i < bn->c; i++) {
        put(l->dtype, l->params[0].value.data, i, 1.0);
        put(l->dtype, l->params[1].value.data, i, 0.0);
        put(l->dtype, l->params[2].value.data, i, 0.0);
        put(l->dtype, l->params[3].value.data, i, 1.0);
    }
}

/* Host views of the running statistics (running_mean, running_var: the parameters themselves on
 * the CPU backends, else copies in hrun made now when `read`). */
static void running_on_host(fl_layer *l, bn_impl *bn, bool read, void **rm, void **rv) {
    const fl_backend *k = l->k;
    void *drm = l->params[2].value.data, *drv = l->params[3].value.data;
    size_t rb = (size_t)bn->c * fl_dtype_size(l->dtype);
    *rm = fl_backend_stage_buf(k, drm, bn->hrun);
    *rv = fl_backend_stage_buf(k, drv, (char *)bn->hrun + rb);
    if (read && !k->host_memory) {
        k->copy(*rm, drm, rb, FL_COPY_D2H, NULL);
        k->copy(*rv, drv, rb, FL_COPY_D2H, NULL);
        k->stream_sync(NULL);
    }
}

static int bn_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    bn_impl *bn = l->impl;
    const fl_backend *k = l->k;
    int64_t b = x->shape[0], c = bn->c;
    size_t sbytes = (size_t)(2 * c) * sizeof(double); /* mean, then var */
    const void *gamma = l->params[0].value.data, *beta = l->params[1].value.data;
    void *rm, *rv;
    if (!training) { /* mean, var (double) = the running statistics (the network's dtype) */
        running_on_host(l, bn, true, &rm, &rv);
        double *hmean = fl_backend_stage_buf(k, bn->mean, bn->hstat), *hvar = hmean + c;
        for (int64_t i = 0; i < c; i++) {
            hmean[i] = get(l->dtype, rm, i);
            hvar[i] = get(l->dtype, rv, i);
        }
        fl_backend_stage_in(k, bn->mean, hmean, sbytes, NULL);
    }
    k->bn_forward(l->adtype, bn->layout, b, c, bn->hw, x->data, gamma, beta, BN_EPS, training,
                  bn->mean, bn->var, bn->act, y->data);
    if (training && !l->replay) /* a recomputation changes no state; on the device: no wait */
        k->bn_running(l->dtype, c, bn->mean, bn->var, (double)(b * bn->hw), BN_MOMENTUM,
                      l->params[2].value.data, l->params[3].value.data);
    bn->training = training;
    return FL_OK;
}

static int bn_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y, const fl_tensor *dy,
                       fl_tensor *dx, bool accumulate) {
    bn_impl *bn = l->impl;
    l->k->bn_backward(l->adtype, bn->layout, x->shape[0], bn->c, bn->hw, x->data, bn->act,
                      y->data, dy->data, l->params[0].value.data, l->params[1].value.data,
                      bn->mean, bn->var, BN_EPS, bn->training, dx ? dx->data : NULL,
                      l->params[0].grad.data, l->params[1].grad.data, accumulate);
    return FL_OK;
}

static void bn_destroy(fl_layer *l) {
    bn_impl *bn = l->impl;
    free_stats(bn);
    free(bn);
}

static const fl_layer_ops bn_ops = {
    .type = "batch_norm",
    .infer_shape = bn_infer_shape,
    .init = bn_init,
    .forward = bn_forward,
    .backward = bn_backward,
    .destroy = bn_destroy,
    .nhwc = true,
    .low = true,
};

fl_layer *fl_batch_norm_create(const char *name, int64_t channels, fl_act act) {
    if (channels < 1) {
        fl_fail(FL_EINVAL, "%s: batch_norm needs at least 1 channel (got %lld)", name,
                (long long)channels);
        return NULL;
    }
    if (act != FL_ACT_NONE && act != FL_ACT_RELU && act != FL_ACT_HARDSWISH) {
        fl_fail(FL_EINVAL, "%s: batch_norm fuses relu or hardswish, not %s", name,
                fl_act_name(act));
        return NULL;
    }
    bn_impl *bn = calloc(1, sizeof *bn);
    if (!bn) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    bn->c = channels;
    bn->act = act;
    fl_layer *l = fl_layer_new(&bn_ops, name, bn);
    if (!l) {
        free(bn);
        return NULL;
    }
    if (fl_layer_add_param(l, "weight", 1, &channels, true) < 0 ||
        fl_layer_add_param(l, "bias", 1, &channels, true) < 0 ||
        fl_layer_add_param(l, "running_mean", 1, &channels, false) < 0 ||
        fl_layer_add_param(l, "running_var", 1, &channels, false) < 0) {
        fl_layer_free(l);
        return NULL;
    }
    return l;
}
