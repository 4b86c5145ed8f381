/* onednn_pool.c - max and average pooling on f32: oneDNN's pooling primitives for the forward
 * (each output one window's max or mean, whatever the thread count) and for NCHW's average
 * backward; the channels-last backwards by hand, each (image, channel block) on one thread
 * adding its windows' gradients in output order, so that the bits do not depend on the thread
 * count (oneDNN's NHWC average backward adds overlapping windows in an order that does: seen
 * on 64 x 112 x 112, 3x3 stride 2). The max backward is never oneDNN's (by hand on NHWC, the
 * cpu table's on NCHW) because it needs which x won each window and fleet's rule (the first
 * largest x in the window, PyTorch's) is not one oneDNN documents; finding it again from x
 * keeps no workspace between forward and backward (ResNet-50's 3x3/2 pool on 8 x 64 x 112 x
 * 112, one thread: 1.0 ms, the forward 0.1-0.16 ms, the cpu table's NCHW loop 8.4 ms). The
 * hand-written average backward costs about what oneDNN's did (3x3/2 on 8 x 64 x 112 x 112:
 * 2.4 ms against 2.1; the global pools of ResNet-20 and -50: 0.03 and 0.1 ms against 0.02 and
 * 0.05). Primitives are created per call and found again in oneDNN's primitive cache (1024
 * entries by default), which skips the JIT; what remains is a few microseconds of descriptor
 * set-up per call. */
#include "onednn_impl.h"

#include <string.h>

/* Channels per block of the hand-written loops: four AVX-512 vectors of floats, or one when
 * there are too few (image, block) pairs to keep the threads busy. */
#define CB_MAX 64
#define CB_MIN 16

/* Runs fn(g, b, c0, cn, args...) for every (image b, channels [c0, c0 + cn)) pair, over
 * threads; each pair reads and writes its own channels only, so the loops need no atomics and
 * give the same bits for any thread count. */
#define FOR_IMAGE_BLOCKS(n, g, fn, ...)                                                      \
    do {                                                                                     \
        int64_t c_ = (g)->c;                                                                 \
        int64_t cb_ = (n) * ((c_ + CB_MAX - 1) / CB_MAX) >= 2 * onednn_threads() ? CB_MAX    \
                                                                                 : CB_MIN;   \
        int64_t nb_ = (c_ + cb_ - 1) / cb_, work_ = (n) * c_ * (g)->h * (g)->w;               \
        _Pragma("omp parallel for schedule(static) if (work_ >= 32768)")                     \
        for (int64_t t_ = 0; t_ < (n) * nb_; t_++) {                                         \
            int64_t c0_ = t_ % nb_ * cb_;                                                    \
            fn((g), t_ / nb_, c0_, c_ - c0_ < cb_ ? c_ - c0_ : cb_, __VA_ARGS__);            \
        }                                                                                    \
    } while (0)

/* The rows [*i0, *i1) of a window, at output row o, that fall inside an input of size h
 * (kernel k, stride s, padding p, dilation d); empty when *i0 >= *i1. Rows are contiguous:
 * the input row grows with the window row. */
static void window_range(int64_t o, int64_t h, int64_t k, int64_t s, int64_t p, int64_t d,
                         int64_t *i0, int64_t *i1) {
    int64_t top = o * s - p; /* input row of window row 0 */
    *i0 = top >= 0 ? 0 : (-top + d - 1) / d;
    *i1 = top + (k - 1) * d < h ? k : (h - 1 - top) / d + 1;
    if (*i1 < *i0 || top + *i0 * d >= h)
        *i1 = *i0;
}

/* Offset in x (N, H, W, C) of channel c0 at window position (i, j) of output (oy, ox), image b. */
static inline int64_t at_xy(const fl_conv_geom *g, int64_t b, int64_t oy, int64_t ox, int64_t i,
                            int64_t j, int64_t c0) {
    int64_t iy = oy * g->sh - g->ph + i * g->dh, ix = ox * g->sw - g->pw + j * g->dw;
    return ((b * g->h + iy) * g->w + ix) * g->c + c0;
}

/* y (N, OH, OW, C) = max or mean over each window of x (N, H, W, C) for image b, channels
 * [c0, c0 + cn); as the cpu table: max pads with -inf (0 for a window wholly in the padding),
 * mean divides by KH KW. */
static void forward_block(const fl_conv_geom *g, int64_t b, int64_t c0, int64_t cn, fl_pool pool,
                          const float *x, float *y) {
    const float inv = (float)(1.0 / (double)(g->kh * g->kw));
    for (int64_t oy = 0; oy < g->oh; oy++)
        for (int64_t ox = 0; ox < g->ow; ox++) {
            int64_t i0, i1, j0, j1;
            window_range(oy, g->h, g->kh, g->sh, g->ph, g->dh, &i0, &i1);
            window_range(ox, g->w, g->kw, g->sw, g->pw, g->dw, &j0, &j1);
            float acc[CB_MAX] = {0};
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++) {
                    const float *xp = x + at_xy(g, b, oy, ox, i, j, c0);
                    if (pool == FL_POOL_AVG) {
#pragma omp simd
                        for (int64_t k = 0; k < cn; k++)
                            acc[k] += xp[k];
                    } else if (i == i0 && j == j0) {
#pragma omp simd
                        for (int64_t k = 0; k < cn; k++)
                            acc[k] = xp[k];
                    } else {
#pragma omp simd
                        for (int64_t k = 0; k < cn; k++)
                            acc[k] = xp[k] > acc[k] ? xp[k] : acc[k];
                    }
                }
            float *yp = y + ((b * g->oh + oy) * g->ow + ox) * g->c + c0;
            for (int64_t k = 0; k < cn; k++)
                yp[k] = pool == FL_POOL_AVG ? acc[k] * inv : acc[k];
        }
}

/* dx (N, H, W, C) = the pooling's gradient given dy (N, OH, OW, C) for image b, channels
 * [c0, c0 + cn), window by window in output order. Max: each window's dy goes to the first
 * largest x in it, row by row (the first x inside the image, then any strictly larger one), as
 * the ref table does; where several windows pick one x, their dy add up in the ref's order, so
 * the result is the ref's bit for bit. */
static void backward_block(const fl_conv_geom *g, int64_t b, int64_t c0, int64_t cn,
                           fl_pool pool, const float *x, const float *dy, float *dx) {
    const float inv = (float)(1.0 / (double)(g->kh * g->kw));
    for (int64_t p = 0; p < g->h * g->w; p++)
        memset(dx + (b * g->h * g->w + p) * g->c + c0, 0, (size_t)cn * sizeof(float));
    for (int64_t oy = 0; oy < g->oh; oy++)
        for (int64_t ox = 0; ox < g->ow; ox++) {
            int64_t i0, i1, j0, j1;
            window_range(oy, g->h, g->kh, g->sh, g->ph, g->dh, &i0, &i1);
            window_range(ox, g->w, g->kw, g->sw, g->pw, g->dw, &j0, &j1);
            if (i0 >= i1 || j0 >= j1)
                continue;
            const float *dyp = dy + ((b * g->oh + oy) * g->ow + ox) * g->c + c0;
            if (pool == FL_POOL_AVG) {
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = j0; j < j1; j++) {
                        float *dxp = dx + at_xy(g, b, oy, ox, i, j, c0);
#pragma omp simd
                        for (int64_t k = 0; k < cn; k++)
                            dxp[k] += dyp[k] * inv;
                    }
                continue;
            }
            float best[CB_MAX];
            int32_t at[CB_MAX]; /* the winner's pixel in its image, iy W + ix */
            const float *x0 = x + at_xy(g, b, oy, ox, i0, j0, c0);
            int32_t q0 = (int32_t)((oy * g->sh - g->ph + i0 * g->dh) * g->w + ox * g->sw - g->pw +
                                   j0 * g->dw);
#pragma omp simd
            for (int64_t k = 0; k < cn; k++)
                best[k] = x0[k], at[k] = q0;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1; j++) {
                    const float *xp = x + at_xy(g, b, oy, ox, i, j, c0);
                    int32_t q = (int32_t)((oy * g->sh - g->ph + i * g->dh) * g->w + ox * g->sw -
                                          g->pw + j * g->dw);
                    /* branch-free, so that it vectorises: m is all ones where x is larger */
#pragma omp simd
                    for (int64_t k = 0; k < cn; k++) {
                        int32_t m = -(int32_t)(xp[k] > best[k]);
                        best[k] = xp[k] > best[k] ? xp[k] : best[k];
                        at[k] ^= (at[k] ^ q) & m;
                    }
                }
            float *dxb = dx + b * g->h * g->w * g->c + c0;
            for (int64_t k = 0; k < cn; k++)
                dxb[(int64_t)at[k] * g->c + k] += dyp[k];
        }
}

/* --- oneDNN --- */

/* true when some window lies wholly in the padding (PyTorch forbids padding > KH / 2; the
 * geometry here allows it): oneDNN's max would be its lowest float there, the ref's is 0 */
static bool has_empty_window(const fl_conv_geom *g) {
    for (int64_t oy = 0; oy < g->oh; oy++) {
        bool hit = false;
        for (int64_t i = 0; i < g->kh && !hit; i++) {
            int64_t iy = oy * g->sh - g->ph + i * g->dh;
            hit = iy >= 0 && iy < g->h;
        }
        if (!hit)
            return true;
    }
    for (int64_t ox = 0; ox < g->ow; ox++) {
        bool hit = false;
        for (int64_t j = 0; j < g->kw && !hit; j++) {
            int64_t ix = ox * g->sw - g->pw + j * g->dw;
            hit = ix >= 0 && ix < g->w;
        }
        if (!hit)
            return true;
    }
    return false;
}

/* The pooling descriptor for n images in layout: forward (prop dnnl_forward_*) or backward
 * (dnnl_backward_data). Negative, quietly (the caller falls back), when oneDNN rejects it. */
static int pool_desc(dnnl_pooling_v2_desc_t *pd, dnnl_prop_kind_t prop, fl_layout layout,
                     fl_pool pool, int64_t n, const fl_conv_geom *g, dnnl_memory_desc_t *x_md,
                     dnnl_memory_desc_t *y_md) {
    *x_md = onednn_act_md(layout, n, g->c, g->h, g->w);
    *y_md = onednn_act_md(layout, n, g->c, g->oh, g->ow);
    dnnl_dims_t strides = {g->sh, g->sw}, kernel = {g->kh, g->kw};
    dnnl_dims_t dil = {g->dh - 1, g->dw - 1}, pad = {g->ph, g->pw};
    dnnl_alg_kind_t alg = pool == FL_POOL_MAX ? dnnl_pooling_max
                                              : dnnl_pooling_avg_include_padding;
    dnnl_status_t s =
        prop == dnnl_backward_data
            ? dnnl_pooling_v2_backward_desc_init(pd, alg, x_md, y_md, strides, kernel, dil, pad,
                                                 pad)
            : dnnl_pooling_v2_forward_desc_init(pd, prop, alg, x_md, y_md, strides, kernel, dil,
                                                pad, pad);
    return s == dnnl_success ? 0 : FL_EUNSUPPORTED;
}

/* y = pooling of x through oneDNN, for inference (max pooling keeps no workspace: its backward
 * is by hand); negative when oneDNN has no implementation. */
static int prim_forward(fl_layout layout, fl_pool pool, int64_t n, const fl_conv_geom *g,
                        const float *x, float *y) {
    dnnl_pooling_v2_desc_t pd;
    dnnl_memory_desc_t x_md, y_md;
    dnnl_primitive_t prim;
    FL_TRY(pool_desc(&pd, dnnl_forward_inference, layout, pool, n, g, &x_md, &y_md));
    FL_TRY(onednn_create(&prim, &pd, NULL, NULL, NULL, NULL));
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_SRC, &x_md, x);
    onednn_arg(&a, DNNL_ARG_DST, &y_md, y);
    onednn_run(prim, &a);
    dnnl_primitive_destroy(prim);
    return 0;
}

/* dx = the average pooling's gradient through oneDNN (the forward descriptor is the backward's
 * required hint); negative when oneDNN has no implementation. */
static int prim_avg_backward(fl_layout layout, int64_t n, const fl_conv_geom *g,
                             const float *dy, float *dx) {
    dnnl_pooling_v2_desc_t fd, bd;
    dnnl_memory_desc_t x_md, y_md;
    dnnl_primitive_desc_t hint = NULL;
    dnnl_primitive_t prim = NULL;
    FL_TRY(pool_desc(&fd, dnnl_forward_training, layout, FL_POOL_AVG, n, g, &x_md, &y_md));
    FL_TRY(pool_desc(&bd, dnnl_backward_data, layout, FL_POOL_AVG, n, g, &x_md, &y_md));
    if (dnnl_primitive_desc_create(&hint, &fd, NULL, onednn_engine(), NULL) != dnnl_success)
        return FL_EUNSUPPORTED;
    int rc = onednn_create(&prim, &bd, NULL, hint, NULL, NULL);
    dnnl_primitive_desc_destroy(hint);
    FL_TRY(rc);
    onednn_args a = {0};
    onednn_arg(&a, DNNL_ARG_DIFF_DST, &y_md, dy);
    onednn_arg(&a, DNNL_ARG_DIFF_SRC, &x_md, dx);
    onednn_run(prim, &a);
    dnnl_primitive_destroy(prim);
    return 0;
}

void onednn_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                         const fl_conv_geom *g, const void *x, void *y) {
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    if (t != FL_DTYPE_F32) {
        onednn_cpu()->pool_forward(t, layout, pool, n, g, x, y);
        return;
    }
    if (n == 0 || g->c == 0)
        return;
    if (!(pool == FL_POOL_MAX && has_empty_window(g)) &&
        prim_forward(layout, pool, n, g, x, y) == 0)
        return;
    if (layout == FL_LAYOUT_NCHW) {
        onednn_cpu()->pool_forward(t, layout, pool, n, g, x, y);
        return;
    }
    FOR_IMAGE_BLOCKS(n, g, forward_block, pool, x, y);
}

void onednn_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                          const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    if (t != FL_DTYPE_F32) {
        onednn_cpu()->pool_backward(t, layout, pool, n, g, x, dy, dx);
        return;
    }
    if (n == 0 || g->c == 0)
        return;
    if (layout == FL_LAYOUT_NCHW) {
        if (pool == FL_POOL_AVG && prim_avg_backward(layout, n, g, dy, dx) == 0)
            return;
        onednn_cpu()->pool_backward(t, layout, pool, n, g, x, dy, dx);
        return;
    }
    FL_ASSERT(g->h * g->w <= INT32_MAX); /* the max's winners are int32 pixel indices */
    FOR_IMAGE_BLOCKS(n, g, backward_block, pool, x, dy, dx);
}
