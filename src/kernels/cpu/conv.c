/* conv.c - the cpu and ref backends' convolution (NCHW, stride, padding, dilation, groups) as
 * im2col + gemm (Chellapilla et al. 2006), one image at a time so that each gemm writes the NCHW
 * output in place and the column matrix stays in cache; images are spread over OpenMP threads
 * in fixed slots (measured on ResNet-20, batch 64, 1 thread: batching 4 to 64 images into one
 * wider gemm cost 5-30% more CPU time, the copies to and from NCHW and the cache misses
 * outweighing the wider gemm); with one group the column matrix is built and consumed a few
 * output rows at a time so that it stays in L2. 1x1 stride-1 unpadded convolutions skip im2col
 * (the image is its own column matrix); for other stride-1 convolutions the input gradient is
 * itself a convolution (of dy with the flipped kernel), strided ones use col2im. The plan keeps
 * the table whose gemm it runs: the cpu table's (OpenBLAS) or the ref table's (plain
 * loops), so the reference backend's convolution is the same algorithm on the plainest kernels.
 * The cpu table runs depthwise convolutions (groups = IC = OC) with direct loops instead
 * (conv_depthwise.c); the ref table keeps im2col + GEMM per group, which the tests hold them to.
 * Which of the two a plan does is the caller's word (cpu.c, ref.c), so this file knows no table. */
#include "backend_private.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

/* Images are split into at most SLOTS contiguous ranges, whatever the thread count; each range
 * has its own column matrix and weight-gradient partial, and the partials are added in range
 * order, so results do not depend on the number of threads. */
#define SLOTS 8

struct fl_conv_plan {
    const fl_backend *be;    /* whose gemm and axpy run it (im2col, col2im: im2col.c) */
    fl_conv_desc      d;
    int64_t           ic;
    int64_t           kg;    /* rows of a group's column matrix: IC / groups * KH * KW */
    int64_t           ocg;   /* output channels per group */
    size_t            slot;  /* scratch bytes per slot: column matrix, then a dW partial */
    size_t            wbytes;
    bool              direct; /* 1x1, stride 1, no padding, one group: no im2col */
    bool              depthwise; /* direct_depthwise, groups = IC = OC: conv_depthwise.c's loops */
    /* stride 1, one group, padding within the dilated kernel: dx is the convolution of dy
     * with the flipped, transposed kernel (geometry gt: c = OC over (OH, OW), padding
     * (K - 1) D - P, output (H, W)), so backward needs no col2im and no gemm that writes a
     * whole column matrix */
    bool              transposed;
    fl_conv_geom      gt;
    /* groups = 1: the column matrix is built and used TR output rows at a time (TRT rows of dx
     * for the transposed input gradient), so that it stays in the L2 cache */
    int64_t           tr, trt;
};

/* Bytes of column matrix per tile: well within a 512 KiB L2 beside the gemm's packed panels,
 * where a whole-image column matrix (590 KiB on ResNet-20's 16x32x32 layers, 7 MiB on
 * ResNet-50's 64x56x56 ones) is not. Measured (ResNet-20 batch 64 and ResNet-50 batch 8,
 * 1 thread): tiles of 96 KiB to 384 KiB and whole images all within the noise (+-3%) of one
 * another, so the tiles are kept for the smaller scratch (per slot, 8 slots). */
#define TILE_BYTES (192 * 1024)

/* Fewest columns per tile: narrower gemms lose more than the cache gains (ResNet-50's 3x3
 * layers, K = 576-4608, would otherwise get one output row, 7-56 columns, per gemm). */
#define TILE_MIN_COLS 256

/* Output rows per tile for a column matrix of k rows and ow columns per output row: tiles of
 * equal height, each at most TILE_BYTES or else TILE_MIN_COLS columns wide. */
static int64_t tile_rows(int64_t k, int64_t ow, int64_t oh, size_t es) {
    int64_t max = (int64_t)(TILE_BYTES / es) / (k * ow), min = (TILE_MIN_COLS + ow - 1) / ow;
    max = max < min ? min : max;
    int64_t tiles = (oh + max - 1) / max;
    return (oh + tiles - 1) / tiles;
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

fl_conv_plan *cpu_conv_plan_create_with(const fl_backend *be, const fl_conv_desc *d,
                                        bool direct_depthwise) {
    const fl_conv_geom *g = &d->g;
    if (d->dtype != FL_DTYPE_F32 && d->dtype != FL_DTYPE_F64) {
        bool low = d->dtype == FL_DTYPE_F16 || d->dtype == FL_DTYPE_BF16;
        fl_fail(low ? FL_EUNSUPPORTED : FL_EINVAL,
                "conv: the %s backend computes in f32 or f64, not %s%s", be->name,
                fl_dtype_name(d->dtype), low ? " (f16 / bf16 plans: the ref backend's)" : "");
        return NULL;
    }
    if (d->layout != FL_LAYOUT_NCHW) {
        fl_fail(FL_EINVAL, "conv: the %s backend runs NCHW only, not %s", be->name,
                fl_layout_name(d->layout));
        return NULL;
    }
    if (d->groups < 1 || g->c % d->groups || d->oc % d->groups || d->max_batch < 0 ||
        g->oh < 1 || g->ow < 1) {
        fl_fail(FL_EINVAL, "conv: bad plan (channels %lld -> %lld, groups %lld, output %lldx%lld)",
                (long long)g->c, (long long)d->oc, (long long)d->groups, (long long)g->oh,
                (long long)g->ow);
        return NULL;
    }
    fl_conv_plan *p = calloc(1, sizeof *p);
    if (!p) {
        fl_fail(FL_ENOMEM, "conv: out of memory");
        return NULL;
    }
    p->be = be;
    p->d = *d;
    p->ic = g->c;
    p->ocg = d->oc / d->groups;
    p->kg = g->c / d->groups * g->kh * g->kw;
    p->direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
                g->pw == 0 && d->groups == 1;
    fl_conv_geom gt = {.c = d->oc, .h = g->oh, .w = g->ow, .kh = g->kh, .kw = g->kw, .sh = 1,
                       .sw = 1, .ph = (g->kh - 1) * g->dh - g->ph,
                       .pw = (g->kw - 1) * g->dw - g->pw, .dh = g->dh, .dw = g->dw};
    p->transposed = !p->direct && g->sh == 1 && g->sw == 1 && d->groups == 1 && gt.ph >= 0 &&
                    gt.pw >= 0 && fl_conv_geom_out(&gt) && gt.oh == g->h && gt.ow == g->w;
    p->gt = gt;
    p->depthwise = direct_depthwise && d->groups > 1 && d->groups == g->c && d->oc == g->c;
    size_t es = fl_dtype_size(d->dtype);
    p->tr = d->groups == 1 ? tile_rows(p->kg, g->ow, g->oh, es) : g->oh;
    p->trt = p->transposed ? tile_rows(d->oc * g->kh * g->kw, g->w, g->h, es) : g->h;
    int64_t k = g->c * g->kh * g->kw, kt = d->oc * g->kh * g->kw;
    size_t col = p->direct ? 0
                 : d->groups == 1 ? round64((size_t)(k * p->tr * g->ow) * es)
                                  : round64((size_t)(k * g->oh * g->ow) * es);
    if (p->transposed && round64((size_t)(kt * p->trt * g->w) * es) > col)
        col = round64((size_t)(kt * p->trt * g->w) * es); // dy's column matrix shares it
    /* the other input gradients (strided) write a whole image's column matrix for col2im */
    if (!p->direct && !p->transposed && round64((size_t)(k * g->oh * g->ow) * es) > col)
        col = round64((size_t)(k * g->oh * g->ow) * es);
    p->wbytes = round64((size_t)(d->oc * p->kg) * es);
    p->slot = p->depthwise ? 0 : col + p->wbytes; /* the direct loops need no scratch */
    return p;
}

void cpu_conv_plan_free(fl_conv_plan *p) { free(p); }

fl_conv_plan *cpu_conv_plan_hold(const fl_conv_desc *d) {
    fl_conv_plan *p = calloc(1, sizeof *p);
    if (!p) {
        fl_fail(FL_ENOMEM, "conv: out of memory");
        return NULL;
    }
    p->d = *d;
    p->ic = d->g.c;
    return p;
}

const fl_conv_desc *cpu_conv_plan_desc(const fl_conv_plan *p) { return &p->d; }

/* slots, then the flipped kernel (transposed) */
size_t cpu_conv_scratch_bytes(const fl_conv_plan *p) {
    int64_t b = p->d.max_batch;
    return p->slot * (size_t)(b < SLOTS ? (b > 0 ? b : 1) : SLOTS) +
           (p->transposed ? p->wbytes : 0);
}

static inline double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* y (B, OC, HW) = bias[oc] everywhere, for gemms that then add to it */
static void fill_bias(const fl_conv_plan *p, const void *bias, void *y, int64_t b, int64_t hw) {
    int64_t oc = p->d.oc;
    for (int64_t r = 0; r < b * oc; r++) {
        double v = get(p->d.dtype, bias, r % oc);
        if (p->d.dtype == FL_DTYPE_F32) {
            float *q = (float *)y + r * hw;
            for (int64_t i = 0; i < hw; i++)
                q[i] = (float)v;
        } else {
            double *q = (double *)y + r * hw;
            for (int64_t i = 0; i < hw; i++)
                q[i] = v;
        }
    }
}

/* wt[c][(o KH + i) KW + j] = W[o][c][KH - 1 - i][KW - 1 - j] (groups = 1) */
static void flip_kernel(const fl_conv_plan *p, const char *w, char *wt) {
    int64_t oc = p->d.oc, ic = p->ic, kh = p->d.g.kh, kw = p->d.g.kw;
    size_t es = fl_dtype_size(p->d.dtype);
    for (int64_t o = 0; o < oc; o++)
        for (int64_t ci = 0; ci < ic; ci++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++)
                    memcpy(wt + (size_t)(((ci * oc + o) * kh + i) * kw + j) * es,
                           w + (size_t)(((o * ic + ci) * kh + (kh - 1 - i)) * kw + (kw - 1 - j)) *
                                   es,
                           es);
}

/* Whether a batch is worth a parallel region (a few microseconds, far more on a loaded
 * machine): at least PAR_MACS multiply-adds. The slots, and so the results, stay the same. */
#define PAR_MACS (1 << 22)
static bool worth_threads(const fl_conv_plan *p, int64_t b) {
    return (double)b * (double)(p->d.oc * p->d.g.oh * p->d.g.ow) * (double)(p->kg) >=
           (double)PAR_MACS;
}

/* col (C KH KW, (OY1 - OY0) OW) = the columns of output rows [oy0, oy1) of im2col(g, x): one
 * channel at a time, each a one-channel geometry whose input starts at the first input row
 * the tile reads (its top padding what remains of g's above that row). */
static void im2col_rows(const fl_conv_plan *p, const fl_conv_geom *g, const char *x, char *col,
                        int64_t oy0, int64_t oy1) {
    size_t es = fl_dtype_size(p->d.dtype);
    int64_t top = oy0 * g->sh - g->ph, iy0 = top > 0 ? top : 0;
    if (iy0 > g->h - 1)
        iy0 = g->h - 1;
    fl_conv_geom s = *g;
    s.c = 1;
    s.h = g->h - iy0;
    s.ph = iy0 - top;
    s.oh = oy1 - oy0;
    int64_t ld = s.oh * s.ow;
    for (int64_t ci = 0; ci < g->c; ci++)
        cpu_im2col(p->d.dtype, &s, x + (size_t)((ci * g->h + iy0) * g->w) * es,
                      col + (size_t)(ci * g->kh * g->kw * ld) * es, ld);
}

/* Images [*lo, *hi) of slot s out of nslots for a batch of b. */
static void slot_range(int64_t b, int nslots, int s, int64_t *lo, int64_t *hi) {
    *lo = b * s / nslots;
    *hi = b * (s + 1) / nslots;
}

void cpu_conv_forward(fl_conv_plan *p, int64_t b, const void *x, const void *wv,
                      const void *bias, void *y, void *scratch) {
    FL_ASSERT(b <= p->d.max_batch);
    const fl_conv_geom *g = &p->d.g;
    const fl_backend *k = p->be;
    fl_dtype t = p->d.dtype;
    int64_t ic = p->ic, oc = p->d.oc;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, groups = p->d.groups;
    size_t es = fl_dtype_size(t);
    const char *w = wv; // (OC, IC / groups, KH, KW)
    const char *xd = x;
    char *yd = y;
    if (p->depthwise) {
        cpu_conv_dw_forward(t, g, b, x, wv, bias, y);
        return;
    }
    double beta = bias ? 1.0 : 0.0;
    if (bias)
        fill_bias(p, bias, yd, b, ohw);
    int nslots = (int)(b < SLOTS ? b : SLOTS);
    /* one image at a time: its output is the gemm's C in place, no copies; images of different
     * slots in parallel (the kernels inside run single-threaded in the parallel region) */
#pragma omp parallel for schedule(static) if (nslots > 1 && worth_threads(p, b))
    for (int s = 0; s < nslots; s++) {
        int64_t lo, hi;
        slot_range(b, nslots, s, &lo, &hi);
        char *col = (char *)scratch + p->slot * (size_t)s; // (K, OHW)
        for (int64_t n = lo; n < hi; n++) {
            const char *xn = xd + (size_t)(n * ic * hw) * es;
            char *yn = yd + (size_t)(n * oc * ohw) * es;
            if (p->direct) { // y_n (OC, HW) = W (OC, IC) x_n (IC, HW)
                k->gemm(t, false, false, oc, hw, ic, 1.0, w, ic, xn, hw, beta, yn, ohw);
                continue;
            }
            if (groups == 1) { // y[:, tile] (OC, T OW) = W (OC, K) col (K, T OW), tile by tile
                for (int64_t oy = 0; oy < g->oh; oy += p->tr) {
                    int64_t oy1 = oy + p->tr < g->oh ? oy + p->tr : g->oh, nt = (oy1 - oy) * g->ow;
                    im2col_rows(p, g, xn, col, oy, oy1);
                    k->gemm(t, false, false, oc, nt, p->kg, 1.0, w, p->kg, col, nt, beta,
                            yn + (size_t)(oy * g->ow) * es, ohw);
                }
                continue;
            }
            cpu_im2col(t, g, xn, col, ohw);
            for (int64_t gi = 0; gi < groups; gi++) // y_g (OCg, OHW) = W_g (OCg, Kg) col_g
                k->gemm(t, false, false, p->ocg, ohw, p->kg, 1.0,
                        w + (size_t)(gi * p->ocg * p->kg) * es, p->kg,
                        col + (size_t)(gi * p->kg * ohw) * es, ohw, beta,
                        yn + (size_t)(gi * p->ocg * ohw) * es, ohw);
        }
    }
}

/* db (OC) [+]= sum of dy (B, OC, HW) over B and HW */
static void bias_grad(const fl_conv_plan *p, const void *dy, int64_t b, void *db, bool acc) {
    int64_t oc = p->d.oc, hw = p->d.g.oh * p->d.g.ow;
    fl_dtype t = p->d.dtype;
    for (int64_t o = 0; o < oc; o++) {
        double s = acc ? get(t, db, o) : 0;
        for (int64_t n = 0; n < b; n++)
            s += p->be->sum(t, (const char *)dy + (size_t)((n * oc + o) * hw) * fl_dtype_size(t),
                            hw);
        if (t == FL_DTYPE_F32)
            ((float *)db)[o] = (float)s;
        else
            ((double *)db)[o] = s;
    }
}

void cpu_conv_backward_filter(fl_conv_plan *p, int64_t b, const void *x, const void *dyv,
                              void *dwv, void *dbias, bool accumulate, void *scratch) {
    FL_ASSERT(b <= p->d.max_batch);
    const fl_conv_geom *g = &p->d.g;
    const fl_backend *k = p->be;
    fl_dtype t = p->d.dtype;
    int64_t ic = p->ic, oc = p->d.oc;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, groups = p->d.groups;
    size_t es = fl_dtype_size(t);
    const char *xd = x, *dyd = dyv;
    size_t colb = p->slot - p->wbytes;
    if (dbias)
        bias_grad(p, dyv, b, dbias, accumulate);
    if (b == 0) {
        if (!accumulate)
            memset(dwv, 0, (size_t)(oc * p->kg) * es);
        return;
    }
    if (p->depthwise) {
        cpu_conv_dw_backward_filter(t, g, b, x, dyv, dwv, accumulate);
        return;
    }
    int nslots = (int)(b < SLOTS ? b : SLOTS);
#pragma omp parallel for schedule(static) if (nslots > 1 && worth_threads(p, b))
    for (int s = 0; s < nslots; s++) {
        int64_t lo, hi;
        slot_range(b, nslots, s, &lo, &hi);
        char *col = (char *)scratch + p->slot * (size_t)s; // (K, OHW)
        /* slot 0 sums into dW itself, the others into their partials, added below */
        char *dw = s == 0 ? (char *)dwv : col + colb;
        for (int64_t n = lo; n < hi; n++) {
            const char *xn = xd + (size_t)(n * ic * hw) * es;
            const char *dyn = dyd + (size_t)(n * oc * ohw) * es;
            double beta = n > lo || (s == 0 && accumulate) ? 1.0 : 0.0;
            if (p->direct) { // dW (OC, IC) [+]= dy_n (OC, HW) x_n^T (HW, IC)
                k->gemm(t, false, true, oc, ic, hw, 1.0, dyn, hw, xn, hw, beta, dw, ic);
                continue;
            }
            if (groups == 1) { // dW (OC, K) [+]= dy[:, tile] col^T, tile by tile
                for (int64_t oy = 0; oy < g->oh; oy += p->tr) {
                    int64_t oy1 = oy + p->tr < g->oh ? oy + p->tr : g->oh, nt = (oy1 - oy) * g->ow;
                    im2col_rows(p, g, xn, col, oy, oy1);
                    k->gemm(t, false, true, oc, p->kg, nt, 1.0, dyn + (size_t)(oy * g->ow) * es,
                            ohw, col, nt, oy > 0 ? 1.0 : beta, dw, p->kg);
                }
                continue;
            }
            cpu_im2col(t, g, xn, col, ohw);
            for (int64_t gi = 0; gi < groups; gi++) // dW_g [+]= dy_g col_g^T
                k->gemm(t, false, true, p->ocg, p->kg, ohw, 1.0,
                        dyn + (size_t)(gi * p->ocg * ohw) * es, ohw,
                        col + (size_t)(gi * p->kg * ohw) * es, ohw, beta,
                        dw + (size_t)(gi * p->ocg * p->kg) * es, p->kg);
        }
    }
    for (int s = 1; s < nslots; s++) // in slot order: the same sum for any thread count
        k->axpy(t, oc * p->kg, 1.0, (char *)scratch + p->slot * (size_t)s + colb, dwv);
}

void cpu_conv_backward_data(fl_conv_plan *p, int64_t b, const void *dyv, const void *wv,
                            void *dxv, void *scratch) {
    FL_ASSERT(b <= p->d.max_batch);
    const fl_conv_geom *g = &p->d.g;
    const fl_backend *k = p->be;
    fl_dtype t = p->d.dtype;
    int64_t ic = p->ic, oc = p->d.oc;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, groups = p->d.groups;
    size_t es = fl_dtype_size(t);
    const char *w = wv, *dyd = dyv;
    if (p->depthwise) {
        cpu_conv_dw_backward_data(t, g, b, dyv, wv, dxv);
        return;
    }
    int nslots = (int)(b < SLOTS ? b : SLOTS);
    char *wt = (char *)scratch + p->slot * (size_t)(nslots > 0 ? nslots : 1); // flipped kernel
    if (p->transposed)
        flip_kernel(p, w, wt);
#pragma omp parallel for schedule(static) if (nslots > 1 && worth_threads(p, b))
    for (int s = 0; s < nslots; s++) {
        int64_t lo, hi;
        slot_range(b, nslots, s, &lo, &hi);
        char *col = (char *)scratch + p->slot * (size_t)s; // the column matrix's gradient
        for (int64_t n = lo; n < hi; n++) {
            const char *dyn = dyd + (size_t)(n * oc * ohw) * es;
            char *dxn = (char *)dxv + (size_t)(n * ic * hw) * es;
            if (p->direct) { // dx_n (IC, HW) = W^T (IC, OC) dy_n (OC, HW)
                k->gemm(t, true, false, ic, hw, oc, 1.0, w, ic, dyn, hw, 0.0, dxn, hw);
                continue;
            }
            if (p->transposed) { // dx_n[:, tile] (IC, T W) = Wt (IC, OC KH KW) im2col(dy_n)
                int64_t kt = oc * g->kh * g->kw;
                for (int64_t y0 = 0; y0 < g->h; y0 += p->trt) {
                    int64_t y1 = y0 + p->trt < g->h ? y0 + p->trt : g->h, nt = (y1 - y0) * g->w;
                    im2col_rows(p, &p->gt, dyn, col, y0, y1);
                    k->gemm(t, false, false, ic, nt, kt, 1.0, wt, kt, col, nt, 0.0,
                            dxn + (size_t)(y0 * g->w) * es, hw);
                }
                continue;
            }
            for (int64_t gi = 0; gi < groups; gi++) // dcol_g (Kg, OHW) = W_g^T dy_g, over col
                k->gemm(t, true, false, p->kg, ohw, p->ocg, 1.0,
                        w + (size_t)(gi * p->ocg * p->kg) * es, p->kg,
                        dyn + (size_t)(gi * p->ocg * ohw) * es, ohw, 0.0,
                        col + (size_t)(gi * p->kg * ohw) * es, ohw);
            cpu_col2im(t, g, col, ohw, dxn);
        }
    }
}
