/* layer_ops.c - the CPU backends' operations of the small layers: the residual add with its
 * fused ReLU, inverted dropout's mask, the option-A shortcut's channel padding, and label
 * smoothing's extra terms of the cross-entropy. Elementwise loops, one pass each way; what
 * sums (the smoothing term) sums rows in order, so nothing depends on the thread count. */
#include "backend_private.h"

#include "fleet/rng.h"
#include "kernels/relu_mask.h"

#include <math.h>
#include <string.h>

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
            T v = relu ? keep_##S(y[i], dy[i]) : dy[i];                                       \
            if (da)                                                                           \
                da[i] = v;                                                                    \
            if (db)                                                                           \
                db[i] = v;                                                                    \
        }                                                                                     \
    }
STAMP_ADD(float, f32)
STAMP_ADD(double, f64)

void cpu_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n, bool relu) {
    DISPATCH(t, add_fwd, a, b, y, n, relu);
}

void cpu_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db, int64_t n,
                      bool relu) {
    DISPATCH(t, add_bwd, y, dy, da, db, n, relu);
}

/* out = in * mask / (1 - p), element i kept when word i % 4 of Philox block i / 4 (counter
 * (i / 4, step), key seed) is at least p 2^32 */
#define STAMP_MASK(T, S)                                                                      \
    static void mask_##S(uint64_t seed, uint64_t step, double p, const T *in, T *out,         \
                         int64_t n) {                                                         \
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};                           \
        uint32_t thresh = (uint32_t)(p * 4294967296.0);                                       \
        T scale = (T)(1.0 / (1.0 - p));                                                       \
        _Pragma("omp parallel for schedule(static) if (n >= (1 << 16))")                      \
        for (int64_t q = 0; q < (n + 3) / 4; q++) {                                           \
            uint32_t ctr[4] = {(uint32_t)q, (uint32_t)((uint64_t)q >> 32), (uint32_t)step,    \
                               (uint32_t)(step >> 32)},                                       \
                     r[4];                                                                    \
            fl_philox4x32(ctr, key, r);                                                       \
            for (int64_t j = 0; j < 4 && 4 * q + j < n; j++) {                                \
                int64_t i = 4 * q + j;                                                        \
                out[i] = r[j] >= thresh ? in[i] * scale : 0;                                  \
            }                                                                                 \
        }                                                                                     \
    }
STAMP_MASK(float, f32)
STAMP_MASK(double, f64)

void cpu_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                      void *out, int64_t n) {
    DISPATCH(t, mask, seed, step, p, in, out, n);
}

/* Element strides of an (n, c, h, w) image batch in layout l. */
typedef struct {
    int64_t n, c, y, x;
} strides;
static strides strides_of(fl_layout l, int64_t c, int64_t h, int64_t w) {
    return l == FL_LAYOUT_NHWC ? (strides){h * w * c, 1, w * c, c}
                               : (strides){c * h * w, h * w, w, 1};
}

/* forward: y = 0, then x's every stride-th pixel into y's channels [off, off + c); backward:
 * x = 0, then those entries of y back (either layout, through its strides) */
#define STAMP_PAD(T, S)                                                                       \
    static void pad_##S(fl_layout l, int64_t b, int64_t c, int64_t h, int64_t w,              \
                        int64_t stride, int64_t oc, T *x, T *y, bool forward) {               \
        int64_t off = (oc - c) / 2, oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride; \
        strides sx = strides_of(l, c, h, w), sy = strides_of(l, oc, oh, ow);                  \
        if (forward)                                                                          \
            memset(y, 0, (size_t)(b * oc * oh * ow) * sizeof(T));                             \
        else                                                                                  \
            memset(x, 0, (size_t)(b * c * h * w) * sizeof(T));                                \
        for (int64_t n = 0; n < b; n++)                                                       \
            for (int64_t i = 0; i < oh; i++)                                                  \
                for (int64_t j = 0; j < ow; j++)                                              \
                    for (int64_t ch = 0; ch < c; ch++) {                                      \
                        T *xv = x + n * sx.n + ch * sx.c + i * stride * sx.y + j * stride * sx.x; \
                        T *yv = y + n * sy.n + (ch + off) * sy.c + i * sy.y + j * sy.x;       \
                        if (forward)                                                          \
                            *yv = *xv;                                                        \
                        else                                                                  \
                            *xv = *yv;                                                        \
                    }                                                                         \
    }
STAMP_PAD(float, f32)
STAMP_PAD(double, f64)

void cpu_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h, int64_t w,
                     int64_t stride, int64_t oc, void *x, void *y, bool forward) {
    DISPATCH(t, pad, layout, n, c, h, w, stride, oc, x, y, forward);
}

static inline double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

double cpu_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows, int64_t classes) {
    FL_ASSERT(t == FL_DTYPE_F32 || t == FL_DTYPE_F64);
    double total = 0;
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, s = 0, mean = 0;
        for (int64_t j = 0; j < classes; j++) {
            double v = get(t, logits, r * classes + j);
            mx = v > mx ? v : mx;
            mean += v;
        }
        for (int64_t j = 0; j < classes; j++)
            s += exp(get(t, logits, r * classes + j) - mx);
        total += log(s) + mx - mean / (double)classes;
    }
    return total;
}

void cpu_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits, int64_t rows,
                              int64_t classes, double on, double all) {
    FL_ASSERT(t == FL_DTYPE_F32 || t == FL_DTYPE_F64);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < classes; j++) {
            double add = (j == labels[r] ? on : 0.0) - all;
            if (t == FL_DTYPE_F32)
                ((float *)dlogits)[r * classes + j] += (float)add;
            else
                ((double *)dlogits)[r * classes + j] += add;
        }
}
