/* channel_ops.c - the cpu table's per-channel operations of the squeeze-and-excitation and
 * concatenation layers (backend.h): y = x * s per image and channel, its backward, and the
 * copy of a run of channels in or out of a wider tensor, in either layout. Images (NCHW) or
 * pixels (NHWC) run in parallel; each per-channel sum runs over the pixels in order on one
 * thread, so the results do not depend on the thread count. */
#include "backend_private.h"

#include <string.h>

/* parallel only when the work pays for a parallel region */
#define BIG(total) ((total) >= PAR_MIN)

#define STAMP_CHANNEL_MUL(T, S)                                                               \
    static void mul_fwd_##S(fl_layout l, int64_t n, int64_t c, int64_t hw, const T *x,        \
                            const T *s, T *y) {                                               \
        if (l == FL_LAYOUT_NCHW) { /* plane (i, ch) times s[i][ch] */                         \
            _Pragma("omp parallel for schedule(static) if (BIG(n * c * hw))")                 \
            for (int64_t ic = 0; ic < n * c; ic++) {                                          \
                T f = s[ic];                                                                  \
                const T *xp = x + ic * hw;                                                    \
                T *yp = y + ic * hw;                                                          \
                _Pragma("omp simd") for (int64_t p = 0; p < hw; p++) yp[p] = xp[p] * f;       \
            }                                                                                 \
        } else { /* pixel (i, p) times the row s[i] */                                        \
            _Pragma("omp parallel for schedule(static) if (BIG(n * c * hw))")                 \
            for (int64_t ip = 0; ip < n * hw; ip++) {                                         \
                const T *f = s + ip / hw * c, *xp = x + ip * c;                               \
                T *yp = y + ip * c;                                                           \
                _Pragma("omp simd") for (int64_t ch = 0; ch < c; ch++) yp[ch] = xp[ch] * f[ch]; \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* ds[i][ch] = sum over p of dy x, in double, p in order; dx = dy s */                    \
    static void mul_bwd_##S(fl_layout l, int64_t n, int64_t c, int64_t hw, const T *x,        \
                            const T *s, const T *dy, T *dx, T *ds) {                          \
        if (ds && l == FL_LAYOUT_NCHW) {                                                      \
            _Pragma("omp parallel for schedule(static) if (BIG(n * c * hw))")                 \
            for (int64_t ic = 0; ic < n * c; ic++) {                                          \
                double acc = 0;                                                               \
                for (int64_t p = 0; p < hw; p++)                                              \
                    acc += (double)dy[ic * hw + p] * (double)x[ic * hw + p];                  \
                ds[ic] = (T)acc;                                                              \
            }                                                                                 \
        } else if (ds) { /* blocks of 64 channels of one image, pixels in order */            \
            int64_t nb = (c + 63) / 64;                                                       \
            _Pragma("omp parallel for schedule(static) if (BIG(n * c * hw))")                 \
            for (int64_t ib = 0; ib < n * nb; ib++) {                                         \
                int64_t i = ib / nb, c0 = ib % nb * 64, c1 = c0 + 64 < c ? c0 + 64 : c;       \
                double acc[64] = {0};                                                         \
                for (int64_t p = 0; p < hw; p++) {                                            \
                    const T *dp = dy + (i * hw + p) * c, *xp = x + (i * hw + p) * c;          \
                    for (int64_t ch = c0; ch < c1; ch++)                                      \
                        acc[ch - c0] += (double)dp[ch] * (double)xp[ch];                      \
                }                                                                             \
                for (int64_t ch = c0; ch < c1; ch++)                                          \
                    ds[i * c + ch] = (T)acc[ch - c0];                                         \
            }                                                                                 \
        }                                                                                     \
        if (dx) /* after ds: dx may alias dy */                                               \
            mul_fwd_##S(l, n, c, hw, dy, s, dx);                                              \
    }
STAMP_CHANNEL_MUL(float, f32)
STAMP_CHANNEL_MUL(double, f64)

void cpu_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                             const void *x, const void *s, void *y) {
    DISPATCH(t, mul_fwd, layout, n, c, hw, x, s, y);
}

void cpu_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                              const void *x, const void *s, const void *dy, void *dx,
                              void *ds) {
    DISPATCH(t, mul_bwd, layout, n, c, hw, x, s, dy, dx, ds);
}

/* One run of c channels: NCHW, n runs of c * hw values (y's run at channel off of oc); NHWC,
 * n * hw runs of c values. */
void cpu_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c, void *x,
                       int64_t oc, int64_t off, void *y, bool forward) {
    FL_ASSERT(t == FL_DTYPE_F32 || t == FL_DTYPE_F64);
    FL_ASSERT(off >= 0 && off + c <= oc);
    size_t es = fl_dtype_size(t);
    bool nchw = layout == FL_LAYOUT_NCHW;
    int64_t runs = nchw ? n : n * hw, len = nchw ? c * hw : c;
    int64_t xs = len, ys = nchw ? oc * hw : oc, yo = nchw ? off * hw : off;
    char *xb = x, *yb = y;
#pragma omp parallel for schedule(static) if (BIG(n * c * hw))
    for (int64_t r = 0; r < runs; r++) {
        char *xp = xb + (size_t)(r * xs) * es, *yp = yb + (size_t)(r * ys + yo) * es;
        if (forward)
            memcpy(yp, xp, (size_t)len * es);
        else
            memcpy(xp, yp, (size_t)len * es);
    }
}
