/* conv_depthwise.c - the cpu table's depthwise convolution (groups = input = output channels,
 * PP-LCNet's and MobileNet's 3x3 / 5x5 convolutions) as direct loops over each (image, channel)
 * plane: the im2col path would run one tiny GEMM per channel (K = KH KW rows, one output row),
 * whose call overhead dominates. Each plane is one thread's (results independent of the thread
 * count); for each tap the loop runs over the output columns whose input column lies in the
 * image, unit-stride where the stride is 1, so it vectorises. Forward and the input gradient
 * accumulate in the dtype, tap by tap, as a GEMM would; the weight gradient sums each tap over
 * images and pixels in order in double. NCHW, as the rest of the cpu convolution. */
#include "backend_private.h"

/* The output columns [*lo, *hi) whose input column ox s - p + j d lies in [0, w). */
static inline void valid_cols(int64_t ow, int64_t w, int64_t s, int64_t p, int64_t j, int64_t d,
                              int64_t *lo, int64_t *hi) {
    int64_t off = j * d - p; /* input column of output column 0 */
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = w - 1 - off < 0 ? 0 : (w - 1 - off) / s + 1;
    *lo = a;
    *hi = b < ow ? b : ow;
}

#define STAMP_DW(T, S)                                                                        \
    static void dw_fwd_##S(const fl_conv_geom *g, int64_t n, const T *x, const T *w,          \
                           const T *bias, T *y) {                                             \
        int64_t c = g->c, hw = g->h * g->w, ohw = g->oh * g->ow, kk = g->kh * g->kw;          \
        _Pragma("omp parallel for schedule(static) if (n * c * ohw * kk >= (1 << 18))")       \
        for (int64_t pl = 0; pl < n * c; pl++) {                                              \
            int64_t ch = pl % c;                                                              \
            const T *xp = x + pl * hw, *wp = w + ch * kk;                                     \
            T *yp = y + pl * ohw;                                                             \
            T b0 = bias ? bias[ch] : (T)0;                                                    \
            for (int64_t q = 0; q < ohw; q++)                                                 \
                yp[q] = b0;                                                                   \
            for (int64_t i = 0; i < g->kh; i++)                                               \
                for (int64_t j = 0; j < g->kw; j++) {                                         \
                    T wv = wp[i * g->kw + j];                                                 \
                    int64_t lo, hi;                                                           \
                    valid_cols(g->ow, g->w, g->sw, g->pw, j, g->dw, &lo, &hi);                \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                  \
                        int64_t iy = oy * g->sh - g->ph + i * g->dh;                          \
                        if (iy < 0 || iy >= g->h)                                             \
                            continue;                                                         \
                        const T *xr = xp + iy * g->w + j * g->dw - g->pw;                     \
                        T *yr = yp + oy * g->ow;                                              \
                        if (g->sw == 1) {                                                     \
                            _Pragma("omp simd") for (int64_t ox = lo; ox < hi; ox++)          \
                                yr[ox] += wv * xr[ox];                                        \
                        } else {                                                              \
                            for (int64_t ox = lo; ox < hi; ox++)                              \
                                yr[ox] += wv * xr[ox * g->sw];                                \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
        }                                                                                     \
    }                                                                                         \
    static void dw_bwd_data_##S(const fl_conv_geom *g, int64_t n, const T *dy, const T *w,    \
                                T *dx) {                                                      \
        int64_t c = g->c, hw = g->h * g->w, ohw = g->oh * g->ow, kk = g->kh * g->kw;          \
        _Pragma("omp parallel for schedule(static) if (n * c * ohw * kk >= (1 << 18))")       \
        for (int64_t pl = 0; pl < n * c; pl++) {                                              \
            int64_t ch = pl % c;                                                              \
            const T *dyp = dy + pl * ohw, *wp = w + ch * kk;                                  \
            T *dxp = dx + pl * hw;                                                            \
            for (int64_t q = 0; q < hw; q++)                                                  \
                dxp[q] = (T)0;                                                                \
            for (int64_t i = 0; i < g->kh; i++)                                               \
                for (int64_t j = 0; j < g->kw; j++) {                                         \
                    T wv = wp[i * g->kw + j];                                                 \
                    int64_t lo, hi;                                                           \
                    valid_cols(g->ow, g->w, g->sw, g->pw, j, g->dw, &lo, &hi);                \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                  \
                        int64_t iy = oy * g->sh - g->ph + i * g->dh;                          \
                        if (iy < 0 || iy >= g->h)                                             \
                            continue;                                                         \
                        T *xr = dxp + iy * g->w + j * g->dw - g->pw;                          \
                        const T *yr = dyp + oy * g->ow;                                       \
                        if (g->sw == 1) {                                                     \
                            _Pragma("omp simd") for (int64_t ox = lo; ox < hi; ox++)          \
                                xr[ox] += wv * yr[ox];                                        \
                        } else {                                                              \
                            for (int64_t ox = lo; ox < hi; ox++)                              \
                                xr[ox * g->sw] += wv * yr[ox];                                \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
        }                                                                                     \
    }                                                                                         \
    static void dw_bwd_filter_##S(const fl_conv_geom *g, int64_t n, const T *x, const T *dy,  \
                                  T *dw, bool acc) {                                          \
        int64_t c = g->c, hw = g->h * g->w, ohw = g->oh * g->ow, kk = g->kh * g->kw;          \
        _Pragma("omp parallel for schedule(static) if (n * c * ohw * kk >= (1 << 18))")       \
        for (int64_t ck = 0; ck < c * kk; ck++) {                                             \
            int64_t ch = ck / kk, i = ck % kk / g->kw, j = ck % g->kw;                        \
            int64_t lo, hi;                                                                   \
            valid_cols(g->ow, g->w, g->sw, g->pw, j, g->dw, &lo, &hi);                        \
            double s = acc ? (double)dw[ck] : 0;                                              \
            for (int64_t b = 0; b < n; b++) {                                                 \
                const T *xp = x + (b * c + ch) * hw, *dyp = dy + (b * c + ch) * ohw;          \
                for (int64_t oy = 0; oy < g->oh; oy++) {                                      \
                    int64_t iy = oy * g->sh - g->ph + i * g->dh;                              \
                    if (iy < 0 || iy >= g->h)                                                 \
                        continue;                                                             \
                    const T *xr = xp + iy * g->w + j * g->dw - g->pw;                         \
                    const T *yr = dyp + oy * g->ow;                                           \
                    for (int64_t ox = lo; ox < hi; ox++)                                      \
                        s += (double)yr[ox] * (double)xr[ox * g->sw];                         \
                }                                                                             \
            }                                                                                 \
            dw[ck] = (T)s;                                                                    \
        }                                                                                     \
    }
STAMP_DW(float, f32)
STAMP_DW(double, f64)

void cpu_conv_dw_forward(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *x,
                         const void *w, const void *bias, void *y) {
    DISPATCH(t, dw_fwd, g, n, x, w, bias, y);
}

void cpu_conv_dw_backward_data(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *dy,
                               const void *w, void *dx) {
    DISPATCH(t, dw_bwd_data, g, n, dy, w, dx);
}

void cpu_conv_dw_backward_filter(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *x,
                                 const void *dy, void *dw, bool accumulate) {
    DISPATCH(t, dw_bwd_filter, g, n, x, dy, dw, accumulate);
}
