/* fc.c - the fully connected layer: y (B, OUT) = x (B, IN) W^T + b, W (OUT, IN) as in PyTorch.
 * Forward pre-fills y with the bias and lets gemm add x W^T to it (beta = 1), so the bias costs
 * no extra pass over y; backward is two gemms and a column sum. In f16 / bf16 activations
 * (l->adtype low, docs/amp.md) gemm's a, b and c are all low: forward converts the f32 master
 * weights into a low copy the layer keeps, and backward converts its low weight gradient into
 * the f32 gradient block (an f32 add when accumulating); the bias stays f32. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t in, out;
    bool    bias;
    void   *wlow; /* (OUT, IN) in l->adtype when that is low: W converted by forward */
} fc_impl;

static bool is_low(fl_dtype t) { return t == FL_DTYPE_F16 || t == FL_DTYPE_BF16; }

/* Low activations: the weight copy (allocated here, at planning) and scratch for the low weight
 * gradient and its f32 conversion; f32 / f64: nothing. SIZE_MAX when out of memory. */
static size_t fc_scratch_bytes(fl_layer *l, int64_t max_batch) {
    (void)max_batch;
    fc_impl *fc = l->impl;
    size_t n = (size_t)(fc->in * fc->out);
    l->k->free(fc->wlow);
    fc->wlow = NULL;
    if (!is_low(l->adtype))
        return 0;
    if (!(fc->wlow = l->k->alloc(n * fl_dtype_size(l->adtype)))) {
        fl_fail(FL_ENOMEM, "cannot allocate the %s copy of its weights",
                fl_dtype_name(l->adtype));
        return SIZE_MAX;
    }
    return nn_round64(n * fl_dtype_size(l->adtype)) + n * sizeof(float);
}

/* Low activations: y = x W^T with W's low copy made now, then + bias (f32) */
static void fc_forward_low(fl_layer *l, const fl_tensor *x, fl_tensor *y) {
    const fc_impl *fc = l->impl;
    fl_dtype t = l->adtype;
    int64_t b = x->shape[0];
    l->k->convert(l->dtype, l->params[0].value.data, t, fc->wlow, fc->in * fc->out);
    l->k->gemm(t, false, true, b, fc->out, fc->in, 1.0, x->data, fc->in, fc->wlow, fc->in, 0.0,
               y->data, fc->out);
    if (fc->bias)
        l->k->add_bias(t, y->data, l->params[1].value.data, b, fc->out);
}

/* Low activations: dx with forward's weight copy, dW (OUT, IN) low in the scratch, then into
 * the f32 gradient (written, or converted and added), db summed into f32 */
static void fc_backward_low(fl_layer *l, const fl_tensor *x, const fl_tensor *dy,
                            fl_tensor *dx, bool accumulate) {
    const fc_impl *fc = l->impl;
    fl_dtype t = l->adtype;
    int64_t b = x->shape[0], n = fc->in * fc->out;
    if (dx)
        l->k->gemm(t, false, false, b, fc->in, fc->out, 1.0, dy->data, fc->out, fc->wlow,
                   fc->in, 0.0, dx->data, fc->in);
    void *dw = l->scratch, *dw32 = (char *)l->scratch + nn_round64((size_t)n * fl_dtype_size(t));
    void *grad = l->params[0].grad.data;
    l->k->gemm(t, true, false, fc->out, fc->in, b, 1.0, dy->data, fc->out, x->data, fc->in, 0.0,
               dw, fc->in);
    l->k->convert(t, dw, l->dtype, accumulate ? dw32 : grad, n);
    if (accumulate)
        l->k->axpy(l->dtype, n, 1.0, dw32, grad);
    if (fc->bias)
        l->k->sum_rows(t, dy->data, l->params[1].grad.data, b, fc->out, accumulate);
}

static int fc_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                          int64_t *out_shape) {
    const fc_impl *fc = l->impl;
    int64_t features = fl_shape_numel(in_ndim, in_shape);
    if (features != fc->in) {
        char buf[96];
        return fl_fail(FL_ESHAPE, "%s: input %s has %lld features, expected %lld", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf), (long long)features,
                       (long long)fc->in);
    }
    *out_ndim = 1;
    out_shape[0] = fc->out;
    return FL_OK;
}

/* PyTorch nn.Linear.reset_parameters: kaiming_uniform(a = sqrt(5)) on W is U(-1/sqrt(IN),
 * 1/sqrt(IN)), and the bias uses the same bound. FL_INIT_PADDLE (paddle.nn.Linear): W Xavier
 * uniform, U(-sqrt(6 / (IN + OUT)), +) (Glorot and Bengio 2010), the bias 0. */
static void fc_init(fl_layer *l, fl_rng *rng) {
    const fc_impl *fc = l->impl;
    bool paddle = l->init == FL_INIT_PADDLE;
    double bound = paddle ? sqrt(6.0 / (double)(fc->in + fc->out))
                   : fc->in > 0 ? 1.0 / sqrt((double)fc->in) : 0;
    for (int i = 0; i < l->nparams; i++) {
        fl_rng r;
        nn_param_rng(rng, i, &r);
        if (paddle && i > 0)
            memset(l->params[i].value.data, 0, fl_tensor_nbytes(&l->params[i].value));
        else
            nn_fill_uniform(&l->params[i].value, &r, bound);
    }
}

static int fc_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    const fc_impl *fc = l->impl;
    int64_t b = x->shape[0];
    FL_ASSERT(x->numel == b * fc->in && y->numel == b * fc->out);
    if (is_low(l->adtype)) {
        fc_forward_low(l, x, y);
        return FL_OK;
    }
    const void *w = l->params[0].value.data; // (OUT, IN)
    double beta = 0;
    if (fc->bias) {
        size_t row = (size_t)fc->out * fl_dtype_size(l->dtype);
        const void *bias = l->params[1].value.data; // (OUT)
        /* every row of y = bias: one row, then the rows so far doubled (log2 B copies, which
         * on a device are as many launches) */
        if (b > 0)
            l->k->copy(y->data, bias, row, FL_COPY_D2D, NULL);
        for (int64_t r = 1; r < b; r *= 2)
            l->k->copy((char *)y->data + (size_t)r * row, y->data,
                       (size_t)(r < b - r ? r : b - r) * row, FL_COPY_D2D, NULL);
        beta = 1;
    }
    // y (B, OUT) = x (B, IN) @ W^T (IN, OUT) + y
    l->k->gemm(l->dtype, false, true, b, fc->out, fc->in, 1.0, x->data, fc->in, w, fc->in, beta,
               y->data, fc->out);
    return FL_OK;
}

static int fc_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y, const fl_tensor *dy,
                       fl_tensor *dx, bool accumulate) {
    const fc_impl *fc = l->impl;
    int64_t b = x->shape[0];
    FL_ASSERT(dy->numel == b * fc->out && (!dx || dx->numel == b * fc->in));
    if (is_low(l->adtype)) {
        fc_backward_low(l, x, dy, dx, accumulate);
        return FL_OK;
    }
    fl_param *w = &l->params[0];
    // dW (OUT, IN) = dy^T (OUT, B) @ x (B, IN) [+ dW]
    l->k->gemm(l->dtype, true, false, fc->out, fc->in, b, 1.0, dy->data, fc->out, x->data,
               fc->in, accumulate ? 1.0 : 0.0, w->grad.data, fc->in);
    if (fc->bias) // db (OUT) = sum over rows of dy [+ db]
        l->k->sum_rows(l->dtype, dy->data, l->params[1].grad.data, b, fc->out, accumulate);
    if (dx) { // dx (B, IN) = dy (B, OUT) @ W (OUT, IN)
        FL_ASSERT(dx->numel == b * fc->in);
        l->k->gemm(l->dtype, false, false, b, fc->in, fc->out, 1.0, dy->data, fc->out,
                   w->value.data, fc->in, 0.0, dx->data, fc->in);
    }
    return FL_OK;
}

static void fc_destroy(fl_layer *l) {
    fc_impl *fc = l->impl;
    if (fc->wlow)
        l->k->free(fc->wlow);
    free(fc);
}

static const fl_layer_ops fc_ops = {
    .type = "fc",
    .infer_shape = fc_infer_shape,
    .init = fc_init,
    .forward = fc_forward,
    .backward = fc_backward,
    .destroy = fc_destroy,
    .scratch_bytes = fc_scratch_bytes,
    .low = true,
};

fl_layer *fl_fc_create(const char *name, int64_t in_features, int64_t out_features, bool bias) {
    if (in_features < 1 || out_features < 1) {
        fl_fail(FL_EINVAL, "%s: fc needs at least 1 input and 1 output feature (got %lld, %lld)",
                name, (long long)in_features, (long long)out_features);
        return NULL;
    }
    fc_impl *fc = malloc(sizeof *fc);
    if (!fc) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    fc->in = in_features;
    fc->out = out_features;
    fc->bias = bias;
    fc->wlow = NULL;
    fl_layer *l = fl_layer_new(&fc_ops, name, fc);
    if (!l) {
        free(fc);
        return NULL;
    }
    int64_t wshape[2] = {out_features, in_features};
    if (fl_layer_add_param(l, "weight", 2, wshape, true) < 0)
        goto fail;
    if (bias && fl_layer_add_param(l, "bias", 1, &out_features, true) < 0)
        goto fail;
    return l;
fail:
    fl_layer_free(l); // frees fc through fc_destroy
    return NULL;
}
