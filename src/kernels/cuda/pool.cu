/* pool.cu - the cuda backend's max and average pooling, NCHW and NHWC, with dilation, as
 * PyTorch's CPU kernels and the ref table define them: max pads with -inf and sends a window's
 * gradient to its FIRST largest x (cuDNN's tie rule is unspecified and it has no dilation, so
 * these are fleet's kernels); average divides by KH KW, padding included. The backward gathers:
 * one thread per input pixel adds the gradients of the windows holding it in output order, the
 * order the ref table adds them, so it gives the ref's bits (no atomics); max pool's windows
 * find their largest once, in a pass over the outputs before (recomputing each window for each
 * of its pixels made the gather read x up to KH KW times per window: 4 ms of a ResNet-50
 * step on an H100). f16 / bf16 too (x, y, dy, dx low): max copies the largest, average's window
 * sum and the backward's gather are kept in double and rounded once, as the ref table does. */
#include "common.cuh"

/* The geometry in index type I (common.cuh's coord_of): int where every index of the call
 * fits in 31 bits, as is usual (the backward's taps divide), int64_t otherwise. */
template <class I> struct pool_geom {
    I C, H, W, KH, KW, SH, SW, PH, PW, DH, DW, OH, OW;
};

template <class I> static pool_geom<I> geom(const fl_conv_geom *g) {
    pool_geom<I> q = {(I)g->c,  (I)g->h,  (I)g->w,  (I)g->kh, (I)g->kw, (I)g->sh, (I)g->sw,
                      (I)g->ph, (I)g->pw, (I)g->dh, (I)g->dw, (I)g->oh, (I)g->ow};
    return q;
}

/* the window (oy, ox) of image n, channel c: max (first largest) and its position, and sum */
template <class T, class I>
__device__ __forceinline__ void window(const pool_geom<I> &g, bool nhwc, const T *x, I n, I c,
                                       I oy, I ox, acc_t<T> *best, I *at, double *sum) {
    acc_t<T> b = 0;
    I where = -1;
    double s = 0;
    for (I i = 0; i < g.KH; i++) {
        I iy = oy * g.SH - g.PH + i * g.DH;
        if (iy < 0 || iy >= g.H)
            continue;
        for (I j = 0; j < g.KW; j++) {
            I ix = ox * g.SW - g.PW + j * g.DW;
            if (ix < 0 || ix >= g.W)
                continue;
            I p = index_of(nhwc, n, c, iy, ix, g.C, g.H, g.W);
            acc_t<T> v = lo_get(x[p]);
            if (where < 0 || v > b)
                b = v, where = p;
            s += (double)v;
        }
    }
    *best = b, *at = where, *sum = s;
}

template <class T, class I>
__global__ void pool_fwd_k(pool_geom<I> g, bool nhwc, bool max, I total, const T *x, T *y) {
    typedef acc_t<T> A;
    double invd = 1.0 / (double)(g.KH * g.KW);
    A inv = (A)invd;
    GRID_STRIDE(i, total) {
        coord4<I> k = coord_of(nhwc, (I)i, g.C, g.OH, g.OW);
        A best;
        I at;
        double sum;
        window(g, nhwc, x, k.n, k.c, k.y, k.x, &best, &at, &sum);
        if (max)
            y[i] = lo_put<T>(best);
        else if (is_low<T>::value) /* the ref's double sum times 1 / (KH KW), rounded once */
            y[i] = lo_put_d<T>(sum * invd);
        else
            y[i] = lo_put<T>((A)sum * inv);
    }
}

/* max pool's backward, first step: each window's first largest position (-1: none) */
template <class T, class I>
__global__ void pool_argmax_k(pool_geom<I> g, bool nhwc, I total, const T *x, I *at) {
    GRID_STRIDE(i, total) {
        coord4<I> k = coord_of(nhwc, (I)i, g.C, g.OH, g.OW);
        acc_t<T> best;
        double sum;
        window(g, nhwc, x, k.n, k.c, k.y, k.x, &best, &at[i], &sum);
    }
}

/* The outputs oy whose window holds input row y without dilation: y = oy S - P + i with
 * 0 <= i < K, that is oy from ceil((y + P - K + 1) / S) to floor((y + P) / S), within
 * [0, O). Ascending oy is descending i, the dilated loop's order below. */
template <class I>
__device__ __forceinline__ void undilated_range(I y, I P, I K, I S, I O, I *lo, I *hi) {
    I t = y + P - K + 1, u = (y + P) / S; /* y + P >= 0 */
    *lo = t <= 0 ? 0 : (t + S - 1) / S;
    *hi = u < O - 1 ? u : O - 1;
}

/* window o's share of input pixel p's gradient: average pool's dy / (KH KW), max pool's dy
 * where o's largest is p; added in P (pool_sum_t) */
template <class T, class I, class P>
__device__ __forceinline__ void take_window(const T *dy, const I *at, I o, I p, P inv, P *acc) {
    if (!at)
        *acc += (P)lo_get(dy[o]) * inv;
    else if (at[o] == p)
        *acc += (P)lo_get(dy[o]);
}

/* what the backward's gather adds in: T for f32 and f64 (the bits they always had), double for
 * f16 / bf16 (the ref's double sum, so the one rounding on store is all that differs) */
template <class T> struct pool_sum {
    typedef typename acc_of<T>::type type;
};
template <> struct pool_sum<__half> {
    typedef double type;
};
template <> struct pool_sum<__nv_bfloat16> {
    typedef double type;
};

/* the outputs whose window holds input row iy: oy = (iy + PH - i DH) / SH for the taps i that
 * divide, visited with i descending (oy ascending); max pool takes a window's gradient where
 * at (pool_argmax_k) names this pixel. Without dilation (every pooling of the zoo) the
 * outputs' range is computed once instead of testing each tap for divisibility. */
template <class T, class I>
__global__ void pool_bwd_k(pool_geom<I> g, bool nhwc, const I *at, I total, const T *dy, T *dx) {
    typedef typename pool_sum<T>::type P;
    P inv = (P)(1.0 / (double)(g.KH * g.KW));
    bool plain = g.DH == 1 && g.DW == 1;
    GRID_STRIDE(q, total) {
        I p = (I)q;
        coord4<I> k = coord_of(nhwc, p, g.C, g.H, g.W);
        P acc = 0;
        if (plain) {
            I ylo, yhi, xlo, xhi;
            undilated_range(k.y, g.PH, g.KH, g.SH, g.OH, &ylo, &yhi);
            undilated_range(k.x, g.PW, g.KW, g.SW, g.OW, &xlo, &xhi);
            for (I oy = ylo; oy <= yhi; oy++)
                for (I ox = xlo; ox <= xhi; ox++)
                    take_window(dy, at, index_of(nhwc, k.n, k.c, oy, ox, g.C, g.OH, g.OW), p,
                                inv, &acc);
            dx[p] = lo_put_d<T>((double)acc);
            continue;
        }
        for (I i = g.KH - 1; i >= 0; i--) {
            I ty = k.y + g.PH - i * g.DH;
            if (ty < 0 || ty % g.SH)
                continue;
            I oy = ty / g.SH;
            if (oy >= g.OH)
                continue;
            for (I j = g.KW - 1; j >= 0; j--) {
                I tx = k.x + g.PW - j * g.DW;
                if (tx < 0 || tx % g.SW)
                    continue;
                I ox = tx / g.SW;
                if (ox >= g.OW)
                    continue;
                take_window(dy, at, index_of(nhwc, k.n, k.c, oy, ox, g.C, g.OH, g.OW), p, inv,
                            &acc);
            }
        }
        dx[p] = lo_put_d<T>((double)acc);
    }
}

/* max pool's backward in index type I: the windows' positions into scratch, then the gather */
template <class T, class I>
static void pool_backward_in(const fl_conv_geom *g, bool nhwc, bool max, int64_t n,
                             const void *x, const void *dy, void *dx) {
    const char *op = "pool_backward";
    pool_geom<I> q = geom<I>(g);
    int64_t total = n * g->c * g->h * g->w, outs = n * g->c * g->oh * g->ow;
    I *at = NULL;
    if (max && outs > 0) {
        at = (I *)cuda_get((size_t)outs * sizeof(I), op);
        pool_argmax_k<T, I><<<blocks_for(outs), THREADS, 0, cuda_stream()>>>(
            q, nhwc, (I)outs, (const T *)x, at);
        CU_LAUNCHED(op);
    }
    pool_bwd_k<T, I><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
        q, nhwc, at, (I)total, (const T *)dy, (T *)dx);
    CU_LAUNCHED(op);
    if (at)
        cuda_put(at);
}

/* whether every index of a pooling of n images fits in int */
static bool fits_int(int64_t n, const fl_conv_geom *g) {
    int64_t in = n * g->c * g->h * g->w, out = n * g->c * g->oh * g->ow;
    return in < INT32_MAX && out < INT32_MAX && g->h + g->ph + g->kh * g->dh < INT32_MAX &&
           g->w + g->pw + g->kw * g->dw < INT32_MAX;
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
    bool nhwc = layout == FL_LAYOUT_NHWC, max = pool == FL_POOL_MAX;
    if (fits_int(n, g))
        DISPATCH_TL("pool_forward", t,
                   pool_fwd_k<T, int><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                       geom<int>(g), nhwc, max, (int)total, (const T *)x, (T *)y));
    else
        DISPATCH_TL("pool_forward", t,
                   pool_fwd_k<T, int64_t><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                       geom<int64_t>(g), nhwc, max, total, (const T *)x, (T *)y));
    CU_LAUNCHED("pool_forward");
}

extern "C" void cuda_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                                   const fl_conv_geom *g, const void *x, const void *dy,
                                   void *dx) {
    check_pool("pool_backward", pool, layout);
    int64_t total = n * g->c * g->h * g->w;
    if (total <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC, max = pool == FL_POOL_MAX;
    if (fits_int(n, g))
        DISPATCH_TL("pool_backward", t, pool_backward_in<T, int>(g, nhwc, max, n, x, dy, dx));
    else
        DISPATCH_TL("pool_backward", t, pool_backward_in<T, int64_t>(g, nhwc, max, n, x, dy, dx));
}
