/* add.c - the residual join y = a + b (optionally followed by a fused ReLU), the one
 * two-input layer (fl_net_add2). Its backward hands dy (masked by the ReLU) to both inputs;
 * the network sums it with the other gradients of those outputs. The loops are the backend's
 * add_forward / add_backward, one pass each way. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <string.h>

static int add_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    (void)l;
    *out_ndim = in_ndim;
    memcpy(out_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    return FL_OK;
}

static int add_forward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, fl_tensor *y,
                       bool training) {
    (void)training;
    bool relu = l->impl != NULL;
    l->k->add_forward(l->adtype, a->data, b->data, y->data, y->numel, relu);
    return FL_OK;
}

static int add_backward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, const fl_tensor *y,
                        const fl_tensor *dy, fl_tensor *da, fl_tensor *db, bool accumulate) {
    (void)a;
    (void)b;
    (void)accumulate;
    bool relu = l->impl != NULL;
    void *pa = da ? da->data : NULL, *pb = db ? db->data : NULL;
    l->k->add_backward(l->adtype, y->data, dy->data, pa, pb, y->numel, relu);
    return FL_OK;
}

static const fl_layer_ops add_ops = {
    .nhwc = true,
    .low = true,
    .type = "add",
    .infer_shape = add_infer_shape,
    .forward2 = add_forward,
    .backward2 = add_backward,
};

/* impl is a non-NULL marker for the fused ReLU (no state to free) */
static char relu_marker;

fl_layer *fl_add_create(const char *name, bool relu) {
    return fl_layer_new(&add_ops, name, relu ? &relu_marker : NULL);
}
