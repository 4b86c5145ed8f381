/* conv2d.c - 2-D convolution (NCHW, stride, padding, dilation, groups) as im2col + gemm
 * (Chellapilla et al. 2006), one image at a time so that each gemm writes the NCHW output in
 * place and the column matrix stays in cache; images are spread over OpenMP threads in fixed
 * slots (measured on ResNet-20, batch 64, 1 thread: batching 4 to 64 images into one wider
 * gemm cost 5-30% more CPU time, the copies to and from NCHW and the cache misses outweighing
 * the wider gemm); with one group the column matrix is built and consumed a few output rows
 * at a time so that it stays in L2. 1x1 stride-1 unpadded convolutions skip im2col (the image
 * is its own column matrix); for other stride-1 convolutions the input gradient is itself a
 * convolution (of dy with the flipped kernel), strided ones use col2im. Scratch (column
 * matrices, weight-gradient partials, the flipped kernel) comes from the network. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Images are split into at most SLOTS contiguous ranges, whatever the thread count; each range
 * has its own column matrix and weight-gradient partial, and the partials are added in range
 * order, so results do not depend on the number of threads. */
#define SLOTS 8

typedef struct {
    fl_conv2d_opts o;
    fl_conv_geom   g;       /* one image: c = IC, output OH, OW */
    int64_t        kg;      /* rows of a group's column matrix: IC / groups * KH * KW */
    int64_t        ocg;     /* output channels per group */
    size_t         slot;    /* scratch bytes per slot: column matrix, then a dW partial */
    bool           direct;  /* 1x1, stride 1, no padding, one group: no im2col */
    /* stride 1, one group, padding within the dilated kernel: dx is the convolution of dy
     * with the flipped, transposed kernel (geometry gt: c = OC over (OH, OW), padding
     * (K - 1) D - P, output (H, W)), so backward needs no col2im and no gemm that writes a
     * whole column matrix */
    bool           transposed;
    fl_conv_geom   gt;
    /* groups = 1: the column matrix is built and used TR output rows at a time (TRT rows of dx
     * for the transposed input gradient), so that it stays in the L2 cache */
    int64_t        tr, trt;
} conv_impl;

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

static int conv_infer_shape(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                            int64_t *out_shape) {
    conv_impl *c = l->impl;
    char buf[96];
    if (in_ndim != 3 || in_shape[0] != c->o.in_channels)
        return fl_fail(FL_ESHAPE, "%s: input %s is not (%lld, H, W)", l->name,
                       fl_shape_str(in_ndim, in_shape, buf, sizeof buf),
                       (long long)c->o.in_channels);
    fl_conv_geom g = {.c = in_shape[0], .h = in_shape[1], .w = in_shape[2], .kh = c->o.kh,
                      .kw = c->o.kw, .sh = c->o.sh, .sw = c->o.sw, .ph = c->o.ph,
                      .pw = c->o.pw, .dh = c->o.dh, .dw = c->o.dw};
    if (!fl_conv_geom_out(&g))
        return fl_fail(FL_ESHAPE, "%s: a %lldx%lld kernel (dilation %lld, %lld, padding %lld, "
                       "%lld) does not fit the input %s", l->name, (long long)g.kh,
                       (long long)g.kw, (long long)g.dh, (long long)g.dw, (long long)g.ph,
                       (long long)g.pw, fl_shape_str(in_ndim, in_shape, buf, sizeof buf));
    c->g = g;
    fl_conv_geom gt = {.c = c->o.out_channels, .h = g.oh, .w = g.ow, .kh = g.kh, .kw = g.kw,
                       .sh = 1, .sw = 1, .ph = (g.kh - 1) * g.dh - g.ph,
                       .pw = (g.kw - 1) * g.dw - g.pw, .dh = g.dh, .dw = g.dw};
    c->transposed = !c->direct && g.sh == 1 && g.sw == 1 && c->o.groups == 1 && gt.ph >= 0 &&
                    gt.pw >= 0 && fl_conv_geom_out(&gt) && gt.oh == g.h && gt.ow == g.w;
    c->gt = gt;
    size_t es = fl_dtype_size(l->dtype);
    c->tr = c->o.groups == 1 ? tile_rows(c->kg, g.ow, g.oh, es) : g.oh;
    c->trt = c->transposed ? tile_rows(c->o.out_channels * g.kh * g.kw, g.w, g.h, es) : g.h;
    *out_ndim = 3;
    out_shape[0] = c->o.out_channels;
    out_shape[1] = g.oh;
    out_shape[2] = g.ow;
    return FL_OK;
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static size_t conv_scratch_bytes(fl_layer *l, int64_t max_batch) {
    conv_impl *c = l->impl;
    size_t es = fl_dtype_size(l->dtype);
    int64_t k = c->o.in_channels * c->o.kh * c->o.kw, ohw = c->g.oh * c->g.ow;
    int64_t kt = c->o.out_channels * c->o.kh * c->o.kw, hw = c->g.h * c->g.w;
    (void)ohw, (void)hw;
    size_t col = c->direct ? 0 : round64((size_t)(k * c->tr * c->g.ow) * es);
    if (c->transposed && round64((size_t)(kt * c->trt * c->g.w) * es) > col)
        col = round64((size_t)(kt * c->trt * c->g.w) * es); // dy's column matrix shares it
    size_t wbytes = round64(fl_tensor_nbytes(&l->params[0].value));
    c->slot = col + wbytes;
    /* slots, then the flipped kernel (transposed) */
    return c->slot * (size_t)(max_batch < SLOTS ? max_batch : SLOTS) +
           (c->transposed ? wbytes : 0);
}

/* torchvision ResNet: kaiming_normal_(mode="fan_out", nonlinearity="relu"), bias 0 */
static void conv_init(fl_layer *l, fl_rng *rng) {
    const conv_impl *c = l->impl;
    fl_rng r;
    nn_param_rng(rng, 0, &r);
    double std = sqrt(2.0 / (double)(c->o.out_channels * c->o.kh * c->o.kw));
    fl_tensor *w = &l->params[0].value;
    for (int64_t i = 0; i < w->numel; i++) {
        double v = std * fl_rng_normal(&r);
        if (l->dtype == FL_DTYPE_F32)
            ((float *)w->data)[i] = (float)v;
        else
            ((double *)w->data)[i] = v;
    }
    if (c->o.bias)
        memset(l->params[1].value.data, 0, fl_tensor_nbytes(&l->params[1].value));
}

static inline double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* y (B, OC, HW) = bias[oc] everywhere, for gemms that then add to it */
static void fill_bias(fl_layer *l, void *y, int64_t b, int64_t oc, int64_t hw) {
    const void *bias = l->params[1].value.data;
    for (int64_t r = 0; r < b * oc; r++) {
        double v = get(l->dtype, bias, r % oc);
        if (l->dtype == FL_DTYPE_F32) {
            float *p = (float *)y + r * hw;
            for (int64_t i = 0; i < hw; i++)
                p[i] = (float)v;
        } else {
            double *p = (double *)y + r * hw;
            for (int64_t i = 0; i < hw; i++)
                p[i] = v;
        }
    }
}

/* wt[c][(o KH + i) KW + j] = W[o][c][KH - 1 - i][KW - 1 - j] (groups = 1) */
static void flip_kernel(fl_layer *l, char *wt) {
    const conv_impl *c = l->impl;
    int64_t oc = c->o.out_channels, ic = c->o.in_channels, kh = c->o.kh, kw = c->o.kw;
    size_t es = fl_dtype_size(l->dtype);
    const char *w = l->params[0].value.data;
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
static bool worth_threads(const conv_impl *c, int64_t b) {
    return (double)b * (double)(c->o.out_channels * c->g.oh * c->g.ow) *
               (double)(c->kg) >= (double)PAR_MACS;
}

/* col (C KH KW, (OY1 - OY0) OW) = the columns of output rows [oy0, oy1) of im2col(g, x): one
 * channel at a time, each a one-channel geometry whose input starts at the first input row
 * the tile reads (its top padding what remains of g's above that row). */
static void im2col_rows(const fl_layer *l, const fl_conv_geom *g, const char *x, char *col,
                        int64_t oy0, int64_t oy1) {
    size_t es = fl_dtype_size(l->dtype);
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
        l->k->im2col(l->dtype, &s, x + (size_t)((ci * g->h + iy0) * g->w) * es,
                     col + (size_t)(ci * g->kh * g->kw * ld) * es, ld);
}

/* Images [*lo, *hi) of slot s out of nslots for a batch of b. */
static void slot_range(int64_t b, int nslots, int s, int64_t *lo, int64_t *hi) {
    *lo = b * s / nslots;
    *hi = b * (s + 1) / nslots;
}

static int conv_forward(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training) {
    (void)training;
    conv_impl *c = l->impl;
    const fl_conv_geom *g = &c->g;
    int64_t b = x->shape[0], ic = c->o.in_channels, oc = c->o.out_channels;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, groups = c->o.groups;
    size_t es = fl_dtype_size(l->dtype);
    const char *w = l->params[0].value.data; // (OC, IC / groups, KH, KW)
    const char *xd = x->data;
    char *yd = y->data;
    double beta = c->o.bias ? 1.0 : 0.0;
    if (c->o.bias)
        fill_bias(l, yd, b, oc, ohw);
    int nslots = (int)(b < SLOTS ? b : SLOTS);
    /* one image at a time: its output is the gemm's C in place, no copies; images of different
     * slots in parallel (the kernels inside run single-threaded in the parallel region) */
#pragma omp parallel for schedule(static) if (nslots > 1 && worth_threads(c, b))
    for (int s = 0; s < nslots; s++) {
        int64_t lo, hi;
        slot_range(b, nslots, s, &lo, &hi);
        char *col = (char *)l->scratch + c->slot * (size_t)s; // (K, OHW)
        for (int64_t n = lo; n < hi; n++) {
            const char *xn = xd + (size_t)(n * ic * hw) * es;
            char *yn = yd + (size_t)(n * oc * ohw) * es;
            if (c->direct) { // y_n (OC, HW) = W (OC, IC) x_n (IC, HW)
                l->k->gemm(l->dtype, false, false, oc, hw, ic, 1.0, w, ic, xn, hw, beta, yn,
                           ohw);
                continue;
            }
            if (groups == 1) { // y[:, tile] (OC, T OW) = W (OC, K) col (K, T OW), tile by tile
                for (int64_t oy = 0; oy < g->oh; oy += c->tr) {
                    int64_t oy1 = oy + c->tr < g->oh ? oy + c->tr : g->oh, nt = (oy1 - oy) * g->ow;
                    im2col_rows(l, g, xn, col, oy, oy1);
                    l->k->gemm(l->dtype, false, false, oc, nt, c->kg, 1.0, w, c->kg, col, nt,
                               beta, yn + (size_t)(oy * g->ow) * es, ohw);
                }
                continue;
            }
            l->k->im2col(l->dtype, g, xn, col, ohw);
            for (int64_t gi = 0; gi < groups; gi++) // y_g (OCg, OHW) = W_g (OCg, Kg) col_g
                l->k->gemm(l->dtype, false, false, c->ocg, ohw, c->kg, 1.0,
                           w + (size_t)(gi * c->ocg * c->kg) * es, c->kg,
                           col + (size_t)(gi * c->kg * ohw) * es, ohw, beta,
                           yn + (size_t)(gi * c->ocg * ohw) * es, ohw);
        }
    }
    return FL_OK;
}

/* db (OC) [+]= sum of dy (B, OC, HW) over B and HW */
static void bias_grad(fl_layer *l, const fl_tensor *dy, int64_t oc, int64_t hw, bool acc) {
    void *db = l->params[1].grad.data;
    int64_t b = dy->shape[0];
    for (int64_t o = 0; o < oc; o++) {
        double s = acc ? get(l->dtype, db, o) : 0;
        for (int64_t n = 0; n < b; n++)
            s += l->k->sum(l->dtype, (const char *)dy->data +
                                         (size_t)((n * oc + o) * hw) * fl_dtype_size(l->dtype),
                           hw);
        if (l->dtype == FL_DTYPE_F32)
            ((float *)db)[o] = (float)s;
        else
            ((double *)db)[o] = s;
    }
}

static int conv_backward(fl_layer *l, const fl_tensor *x, const fl_tensor *y,
                         const fl_tensor *dy, fl_tensor *dx, bool accumulate) {
    (void)y;
    conv_impl *c = l->impl;
    const fl_conv_geom *g = &c->g;
    int64_t b = x->shape[0], ic = c->o.in_channels, oc = c->o.out_channels;
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, groups = c->o.groups;
    size_t es = fl_dtype_size(l->dtype);
    const char *w = l->params[0].value.data;
    fl_tensor *dwt = &l->params[0].grad;
    const char *xd = x->data, *dyd = dy->data;
    size_t colb = c->direct ? 0 : c->slot - round64(fl_tensor_nbytes(dwt));
    if (c->o.bias)
        bias_grad(l, dy, oc, ohw, accumulate);
    int nslots = (int)(b < SLOTS ? b : SLOTS);
    char *wt = (char *)l->scratch + c->slot * (size_t)nslots; // (IC, OC KH KW) flipped
    if (c->transposed && dx)
        flip_kernel(l, wt);
#pragma omp parallel for schedule(static) if (nslots > 1 && worth_threads(c, b))
    for (int s = 0; s < nslots; s++) {
        int64_t lo, hi;
        slot_range(b, nslots, s, &lo, &hi);
        char *col = (char *)l->scratch + c->slot * (size_t)s; // (K, OHW), then its gradient
        /* slot 0 sums into dW itself, the others into their partials, added below */
        char *dw = s == 0 ? (char *)dwt->data : col + colb;
        for (int64_t n = lo; n < hi; n++) {
            const char *xn = xd + (size_t)(n * ic * hw) * es;
            const char *dyn = dyd + (size_t)(n * oc * ohw) * es;
            char *dxn = dx ? (char *)dx->data + (size_t)(n * ic * hw) * es : NULL;
            double beta = n > lo || (s == 0 && accumulate) ? 1.0 : 0.0;
            if (c->direct) {
                // dW (OC, IC) [+]= dy_n (OC, HW) x_n^T (HW, IC)
                l->k->gemm(l->dtype, false, true, oc, ic, hw, 1.0, dyn, hw, xn, hw, beta, dw,
                           ic);
                if (dxn) // dx_n (IC, HW) = W^T (IC, OC) dy_n (OC, HW)
                    l->k->gemm(l->dtype, true, false, ic, hw, oc, 1.0, w, ic, dyn, hw, 0.0, dxn,
                               hw);
                continue;
            }
            if (groups == 1) { // dW (OC, K) [+]= dy[:, tile] col^T, tile by tile
                for (int64_t oy = 0; oy < g->oh; oy += c->tr) {
                    int64_t oy1 = oy + c->tr < g->oh ? oy + c->tr : g->oh, nt = (oy1 - oy) * g->ow;
                    im2col_rows(l, g, xn, col, oy, oy1);
                    l->k->gemm(l->dtype, false, true, oc, c->kg, nt, 1.0,
                               dyn + (size_t)(oy * g->ow) * es, ohw, col, nt,
                               oy > 0 ? 1.0 : beta, dw, c->kg);
                }
            } else {
                l->k->im2col(l->dtype, g, xn, col, ohw);
            }
            for (int64_t gi = 0; groups > 1 && gi < groups; gi++) // dW_g [+]= dy_g col_g^T
                l->k->gemm(l->dtype, false, true, c->ocg, c->kg, ohw, 1.0,
                           dyn + (size_t)(gi * c->ocg * ohw) * es, ohw,
                           col + (size_t)(gi * c->kg * ohw) * es, ohw, beta,
                           dw + (size_t)(gi * c->ocg * c->kg) * es, c->kg);
            if (!dxn)
                continue;
            if (c->transposed) { // dx_n[:, tile] (IC, T W) = Wt (IC, OC KH KW) im2col(dy_n)
                int64_t kt = oc * g->kh * g->kw;
                for (int64_t y0 = 0; y0 < g->h; y0 += c->trt) {
                    int64_t y1 = y0 + c->trt < g->h ? y0 + c->trt : g->h, nt = (y1 - y0) * g->w;
                    im2col_rows(l, &c->gt, dyn, col, y0, y1);
                    l->k->gemm(l->dtype, false, false, ic, nt, kt, 1.0, wt, kt, col, nt, 0.0,
                               dxn + (size_t)(y0 * g->w) * es, hw);
                }
                continue;
            }
            for (int64_t gi = 0; gi < groups; gi++) // dcol_g (Kg, OHW) = W_g^T dy_g, over col
                l->k->gemm(l->dtype, true, false, c->kg, ohw, c->ocg, 1.0,
                           w + (size_t)(gi * c->ocg * c->kg) * es, c->kg,
                           dyn + (size_t)(gi * c->ocg * ohw) * es, ohw, 0.0,
                           col + (size_t)(gi * c->kg * ohw) * es, ohw);
            l->k->col2im(l->dtype, g, col, ohw, dxn);
        }
    }
    for (int s = 1; s < nslots; s++) // in slot order: the same sum for any thread count
        l->k->axpy(l->dtype, dwt->numel, 1.0,
                   (char *)l->scratch + c->slot * (size_t)s + colb, dwt->data);
    return FL_OK;
}

static void conv_destroy(fl_layer *l) { free(l->impl); }

static const fl_layer_ops conv_ops = {
    .type = "conv2d",
    .infer_shape = conv_infer_shape,
    .init = conv_init,
    .forward = conv_forward,
    .backward = conv_backward,
    .destroy = conv_destroy,
    .scratch_bytes = conv_scratch_bytes,
};

fl_layer *fl_conv2d_create(const char *name, const fl_conv2d_opts *opts) {
    FL_ASSERT(name && opts);
    fl_conv2d_opts o = *opts;
    o.sh = o.sh ? o.sh : 1;
    o.sw = o.sw ? o.sw : 1;
    o.dh = o.dh ? o.dh : 1;
    o.dw = o.dw ? o.dw : 1;
    o.groups = o.groups ? o.groups : 1;
    if (o.in_channels < 1 || o.out_channels < 1 || o.kh < 1 || o.kw < 1 || o.sh < 1 ||
        o.sw < 1 || o.ph < 0 || o.pw < 0 || o.dh < 1 || o.dw < 1 || o.groups < 1) {
        fl_fail(FL_EINVAL, "%s: conv2d needs channels, kernel, stride and dilation >= 1 and "
                "padding >= 0 (got in %lld, out %lld, kernel %lldx%lld, stride %lld, %lld, "
                "padding %lld, %lld, dilation %lld, %lld, groups %lld)", name,
                (long long)o.in_channels, (long long)o.out_channels, (long long)o.kh,
                (long long)o.kw, (long long)o.sh, (long long)o.sw, (long long)o.ph,
                (long long)o.pw, (long long)o.dh, (long long)o.dw, (long long)o.groups);
        return NULL;
    }
    if (o.in_channels % o.groups || o.out_channels % o.groups) {
        fl_fail(FL_EINVAL, "%s: groups %lld must divide in_channels %lld and out_channels %lld",
                name, (long long)o.groups, (long long)o.in_channels, (long long)o.out_channels);
        return NULL;
    }
    conv_impl *c = calloc(1, sizeof *c);
    if (!c) {
        fl_fail(FL_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    c->o = o;
    c->ocg = o.out_channels / o.groups;
    c->kg = o.in_channels / o.groups * o.kh * o.kw;
    c->direct = o.kh == 1 && o.kw == 1 && o.sh == 1 && o.sw == 1 && o.ph == 0 && o.pw == 0 &&
                o.groups == 1;
    fl_layer *l = fl_layer_new(&conv_ops, name, c);
    if (!l) {
        free(c);
        return NULL;
    }
    int64_t wshape[4] = {o.out_channels, o.in_channels / o.groups, o.kh, o.kw};
    if (fl_layer_add_param(l, "weight", 4, wshape, true) < 0)
        goto fail;
    if (o.bias && fl_layer_add_param(l, "bias", 1, &o.out_channels, true) < 0)
        goto fail;
    return l;
fail:
    fl_layer_free(l);
    return NULL;
}
