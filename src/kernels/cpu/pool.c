/* pool.c - max and average pooling over independent (H, W) planes, forward and backward, as
 * PyTorch defines them (max pads with -inf and sends the gradient to the first maximum; average
 * divides by KH KW, padding included). Planes are split over OpenMP threads. */
#include "backend_private.h"

#include <string.h>

#define STAMP_POOL(T, S)                                                                      \
    static void pool_plane_##S(fl_pool pool, const fl_conv_geom *g, const T *x, T *y) {       \
        T inv = (T)(1.0 / (double)(g->kh * g->kw));                                           \
        for (int64_t oy = 0; oy < g->oh; oy++) {                                              \
            for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                T best = 0;                                                                   \
                bool any = false;                                                             \
                double sum = 0;                                                               \
                for (int64_t i = 0; i < g->kh; i++) {                                         \
                    int64_t iy = oy * g->sh - g->ph + i * g->dh;                              \
                    if (iy < 0 || iy >= g->h)                                                 \
                        continue;                                                             \
                    for (int64_t j = 0; j < g->kw; j++) {                                     \
                        int64_t ix = ox * g->sw - g->pw + j * g->dw;                          \
                        if (ix < 0 || ix >= g->w)                                             \
                            continue;                                                         \
                        T v = x[iy * g->w + ix];                                              \
                        if (!any || v > best)                                                 \
                            best = v;                                                         \
                        any = true;                                                           \
                        sum += v;                                                             \
                    }                                                                         \
                }                                                                             \
                y[oy * g->ow + ox] = pool == FL_POOL_MAX ? best : (T)sum * inv;               \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void pool_plane_back_##S(fl_pool pool, const fl_conv_geom *g, const T *x,          \
                                    const T *dy, T *dx) {                                     \
        T inv = (T)(1.0 / (double)(g->kh * g->kw));                                           \
        memset(dx, 0, (size_t)(g->h * g->w) * sizeof(T));                                     \
        for (int64_t oy = 0; oy < g->oh; oy++) {                                              \
            for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                T d = dy[oy * g->ow + ox], best = 0;                                          \
                int64_t at = -1;                                                              \
                for (int64_t i = 0; i < g->kh; i++) {                                         \
                    int64_t iy = oy * g->sh - g->ph + i * g->dh;                              \
                    if (iy < 0 || iy >= g->h)                                                 \
                        continue;                                                             \
                    for (int64_t j = 0; j < g->kw; j++) {                                     \
                        int64_t ix = ox * g->sw - g->pw + j * g->dw;                          \
                        if (ix < 0 || ix >= g->w)                                             \
                            continue;                                                         \
                        int64_t p = iy * g->w + ix;                                           \
                        if (pool == FL_POOL_AVG) {                                            \
                            dx[p] += d * inv;                                                 \
                        } else if (at < 0 || x[p] > best) {                                   \
                            best = x[p];                                                      \
                            at = p;                                                           \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
                if (pool == FL_POOL_MAX && at >= 0)                                           \
                    dx[at] += d;                                                              \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void pool_forward_##S(fl_pool pool, const fl_conv_geom *g, const T *x, T *y) {     \
        int64_t in = g->h * g->w, out = g->oh * g->ow;                                        \
        _Pragma("omp parallel for schedule(static) if (g->c * in >= PAR_MIN)")                \
        for (int64_t p = 0; p < g->c; p++)                                                    \
            pool_plane_##S(pool, g, x + p * in, y + p * out);                                 \
    }                                                                                         \
    static void pool_backward_##S(fl_pool pool, const fl_conv_geom *g, const T *x,            \
                                  const T *dy, T *dx) {                                       \
        int64_t in = g->h * g->w, out = g->oh * g->ow;                                        \
        _Pragma("omp parallel for schedule(static) if (g->c * in >= PAR_MIN)")                \
        for (int64_t p = 0; p < g->c; p++)                                                    \
            pool_plane_back_##S(pool, g, x + p * in, dy + p * out, dx + p * in);              \
    }
STAMP_POOL(float, f32)
STAMP_POOL(double, f64)

/* n images of g->c channels: n * c independent planes (NCHW only) */
void cpu_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                      const fl_conv_geom *g, const void *x, void *y) {
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    fl_conv_geom planes = *g;
    planes.c = n * g->c;
    DISPATCH(t, pool_forward, pool, &planes, x, y);
}

void cpu_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                       const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    FL_ASSERT(layout == FL_LAYOUT_NCHW);
    fl_conv_geom planes = *g;
    planes.c = n * g->c;
    DISPATCH(t, pool_backward, pool, &planes, x, dy, dx);
}
