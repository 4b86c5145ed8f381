/* dropout.c - inverted dropout (Srivastava et al. 2014, JMLR 15): in training each element is
 * kept with probability 1 - p and scaled by 1 / (1 - p), so inference is the identity. The
 * mask is drawn from Philox stream `step` of the layer's seed, element i from position i / 4
 * (random access: threads and backward regenerate it instead of storing it), by the
 * backend's dropout_mask. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double   p;
    uint64_t seed, step, last_step; /* step of the next training forward, and of the last */
    bool     training;              /* of the last forward */
} dropout_impl;

static int dropout_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                               int64_t *out_shape) {
    (void)l;
    *out_ndim = in_ndim;
    memcpy(out_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    return FL_OK;
}

/* out = in * mask / (1 - p) for the mask of `step` (in and out may alias) */
static void apply(const fl_layer *l, uint64_t step, const void *in, void *out, int64_t n) {
    const dropout_impl *d = l->impl;
    l->k->dropout_mask(l->adtype, d->seed, step, d->p, in, out, n);
}

static int dropout_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    dropout_impl *d = l->impl;
    d->training = training && d->p > 0;
    if (!d->training) {
        l->k->copy(y->data, x->data, fl_tensor_nbytes(x), FL_COPY_D2D, NULL);
        return FL_OK;
    }
    if (!l->replay) /* a recomputation draws the last forward's mask again */
        d->last_step = d->step++;
    apply(l, d->last_step, x->data, y->data, x->numel);
    return FL_OK;
}

static int dropout_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                            const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)x;
    (void)y;
    (void)accumulate;
    dropout_impl *d = l->impl;
    if (!dx)
        return FL_OK;
    if (!d->training)
        l->k->copy(dx->data, dy->data, fl_tensor_nbytes(dy), FL_COPY_D2D, NULL);
    else
        apply(l, d->last_step, dy->data, dx->data, dy->numel);
    return FL_OK;
}

static void dropout_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops dropout_ops = {
    .nhwc = true,
    .low = true,
    .type = "dropout",
    .infer_shape = dropout_infer_shape,
    .forward = dropout_forward,
    .backward = dropout_backward,
    .destroy = dropout_destroy,
};

fl_layer *fl_dropout_create(const char *name, double p, uint64_t seed) {
    if (!(p >= 0 && p < 1)) {
        fl_fail(FL_EINVAL, "%s: dropout probability %g is outside [0, 1)", name, p);
        return NULL;
    }
    dropout_impl *d = calloc(1, sizeof *d);
    if (!d) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    d->p = p;
    d->seed = seed;
    fl_layer *l = fl_layer_new(&dropout_ops, name, d);
    if (!l)
        free(d);
    return l;
}

void fl_dropout_set_step(fl_layer *l, uint64_t step) {
    FL_ASSERT(l && l->ops == &dropout_ops);
    ((dropout_impl *)l->impl)->step = step;
}
