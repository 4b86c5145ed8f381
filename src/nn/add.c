/* add.c - the residual join y = a + b (optionally followed by a fused ReLU), the one
 * two-input layer (fl_net_add2). Its backward hands dy (masked by the ReLU) to both inputs;
 * the network sums it with the other gradients of those outputs. Elementwise loops over the
 * whole tensor, one pass each way (no separate copy, add and mask passes). */
#include "nn_impl.h"

#include "fleet/status.h"

#include "kernels/relu_mask.h"

#include <string.h>

static int add_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                           int64_t *out_shape) {
    (void)l;
    *out_ndim = in_ndim;
    memcpy(out_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    return FL_OK;
}

/* y = a + b [relu]; and da = db = dy [where y > 0]: one pass each */
#define STAMP_ADD(T, S)                                                                       \
    static void add_fwd_##S(const T *a, const T *b, T *y, int64_t n, bool relu) {             \
        if (relu) {                                                                           \
            _Pragma("omp parallel for simd schedule(static) if (n >= (1 << 18))")             \
            for (int64_t i = 0; i < n; i++) {                                                 \
                T v = a[i] + b[i];                                                            \
                y[i] = v > 0 ? v : (T)0;                                                      \
            }                                                                                 \
        } else {                                                                              \
            _Pragma("omp parallel for simd schedule(static) if (n >= (1 << 18))")             \
            for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];                               \
        }                                                                                     \
    }                                                                                         \
    static void add_bwd_##S(const T *y, const T *dy, T *da, T *db, int64_t n, bool relu) {    \
        _Pragma("omp parallel for simd schedule(static) if (n >= (1 << 18))")                 \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T v = relu ? keep_##S(y[i], dy[i]) : dy[i];                                         \
            if (da)                                                                           \
                da[i] = v;                                                                    \
            if (db)                                                                           \
                db[i] = v;                                                                    \
        }                                                                                     \
    }
STAMP_ADD(float, f32)
STAMP_ADD(double, f64)

static int add_forward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, fl_tensor *y,
                       bool training) {
    (void)training;
    bool relu = l->impl != NULL;
    if (l->dtype == FL_DTYPE_F32)
        add_fwd_f32(a->data, b->data, y->data, y->numel, relu);
    else
        add_fwd_f64(a->data, b->data, y->data, y->numel, relu);
    return FL_OK;
}

static int add_backward(fl_layer *l, const fl_tensor *a, const fl_tensor *b, const fl_tensor *y,
                        const fl_tensor *dy, fl_tensor *da, fl_tensor *db, bool accumulate) {
    (void)a;
    (void)b;
    (void)accumulate;
    bool relu = l->impl != NULL;
    void *pa = da ? da->data : NULL, *pb = db ? db->data : NULL;
    if (l->dtype == FL_DTYPE_F32)
        add_bwd_f32(y->data, dy->data, pa, pb, y->numel, relu);
    else
        add_bwd_f64(y->data, dy->data, pa, pb, y->numel, relu);
    return FL_OK;
}

static const fl_layer_ops add_ops = {
    .nhwc = true,
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
