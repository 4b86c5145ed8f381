/* pool.cu - the cuda backend's max and average pooling, NCHW and NHWC, with dilation, as
 * PyTorch's CPU kernels and the ref table define them: max pads with -inf and sends a window's
 * gradient to its FIRST largest x (cuDNN's tie rule is unspecified and it has no dilation, so
 * these are fleet's kernels); average divides by KH KW, padding included. The backward gathers:
 * one thread per input pixel adds the gradients of the windows holding it in output order, the
 * order the ref table adds them, so it gives the ref's bits (no atomics). */
#include "common.cuh"

struct pool_geom {
    int64_t C, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW;
};

static pool_geom geom(const fl_conv_geom *g) {
    pool_geom q = {g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw,
                   g->oh, g->ow};
    return q;
}

/* the window (oy, ox) of image n, channel c: max (first largest) and its position, and sum */
template <class T>
__device__ __forceinline__ void window(const pool_geom &g, bool nhwc, const T *x, int64_t n,
                                       int64_t c, int64_t oy, int64_t ox, T *best, int64_t *at,
                                       double *sum) {
    T b = 0;
    int64_t where = -1;
    double s = 0;
    for (int64_t i = 0; i < g.KH; i++) {
        int64_t iy = oy * g.SH - g.PH + i * g.DH;
        if (iy < 0 || iy >= g.H)
            continue;
        for (int64_t j = 0; j < g.KW; j++) {
            int64_t ix = ox * g.SW - g.PW + j * g.DW;
            if (ix < 0 || ix >= g.W)
                continue;
            int64_t p = index_of(nhwc, n, c, iy, ix, g.C, g.H, g.W);
            T v = x[p];
            if (where < 0 || v > b)
                b = v, where = p;
            s += (double)v;
        }
    }
    *best = b, *at = where, *sum = s;
}

template <class T>
__global__ void pool_fwd_k(pool_geom g, bool nhwc, bool max, int64_t total, const T *x, T *y) {
    T inv = (T)(1.0 / (double)(g.KH * g.KW));
    GRID_STRIDE(i, total) {
        coord4 k = coord_of(nhwc, i, g.C, g.OH, g.OW);
        T best;
        int64_t at;
        double sum;
        window(g, nhwc, x, k.n, k.c, k.y, k.x, &best, &at, &sum);
        y[i] = max ? best : (T)sum * inv;
    }
}

/* the outputs whose window holds input row iy: oy = (iy + PH - i DH) / SH for the taps i that
 * divide, visited with i descending (oy ascending) */
template <class T>
__global__ void pool_bwd_k(pool_geom g, bool nhwc, bool max, int64_t total, const T *x,
                           const T *dy, T *dx) {
    T inv = (T)(1.0 / (double)(g.KH * g.KW));
    GRID_STRIDE(p, total) {
        coord4 k = coord_of(nhwc, p, g.C, g.H, g.W);
        T acc = 0;
        for (int64_t i = g.KH - 1; i >= 0; i--) {
            int64_t ty = k.y + g.PH - i * g.DH;
            if (ty < 0 || ty % g.SH)
                continue;
            int64_t oy = ty / g.SH;
            if (oy >= g.OH)
                continue;
            for (int64_t j = g.KW - 1; j >= 0; j--) {
                int64_t tx = k.x + g.PW - j * g.DW;
                if (tx < 0 || tx % g.SW)
                    continue;
                int64_t ox = tx / g.SW;
                if (ox >= g.OW)
                    continue;
                T d = dy[index_of(nhwc, k.n, k.c, oy, ox, g.C, g.OH, g.OW)];
                if (!max) {
                    acc += d * inv;
                } else {
                    T best;
                    int64_t at;
                    double sum;
                    window(g, nhwc, x, k.n, k.c, oy, ox, &best, &at, &sum);
                    if (at == p)
                        acc += d;
                }
            }
        }
        dx[p] = acc;
    }
}

static void check_pool(const char *op, fl_pool pool, fl_layout layout) {
    if (pool != FL_POOL_MAX && pool != FL_POOL_AVG)
        cuda_fatal(op, "the pool check", "unknown pooling", __FILE__, __LINE__);
    if (layout != FL_LAYOUT_NCHW && layout != FL_LAYOUT_NHWC)
        cuda_fatal(op, "the layout check", "unknown layout", __FILE__, __LINE__);
}

extern "C" void cuda_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                                  const fl_conv_geom *g, const void *x, void *y) {
    check_pool("pool_forward", pool, layout);
    int64_t total = n * g->c * g->oh * g->ow;
    if (total <= 0)
        return;
    DISPATCH_T("pool_forward", t,
               pool_fwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   geom(g), layout == FL_LAYOUT_NHWC, pool == FL_POOL_MAX, total, (const T *)x,
                   (T *)y));
    CU_LAUNCHED("pool_forward");
}

extern "C" void cuda_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                                   const fl_conv_geom *g, const void *x, const void *dy,
                                   void *dx) {
    check_pool("pool_backward", pool, layout);
    int64_t total = n * g->c * g->h * g->w;
    if (total <= 0)
        return;
    DISPATCH_T("pool_backward", t,
               pool_bwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   geom(g), layout == FL_LAYOUT_NHWC, pool == FL_POOL_MAX, total, (const T *)x,
                   (const T *)dy, (T *)dx));
    CU_LAUNCHED("pool_backward");
}
