/* onednn_bn.c - batch norm on f32 channels-last (Ioffe & Szegedy 2015, arXiv:1502.03167),
 * hand-written so that no sum depends on the thread count: oneDNN 2.6's batch normalization
 * sums a channel's statistics and gradients per thread (NHWC, and NCHW when the channels are
 * fewer than the threads). x is N HW rows of C contiguous channels, cut into blocks of rows and
 * channels fixed by the shape; each block sums its rows (float over a few rows, then double,
 * one vector lane per channel), and the blocks' per-channel partials are added in row-block
 * order; the normalisation and dx are elementwise, blocks of rows over threads. A fused ReLU
 * or hardswish is applied in the forward's loop; the backward masks dy by the ReLU's output
 * (y > 0) as it reads it, or multiplies it by hardswish' at z = x a + b, recomputed from x with
 * the forward's a and b (the forward's own expression, so the same bits). NCHW and f64 go to the cpu table, whose per-channel sums are fixed likewise.
 * As fast as oneDNN's kernels or faster (all batch norms of a ResNet-50 training step, batch
 * 8, 1 thread: forward 29-31 ms against 30-31, backward 49-53 against 57-60). */
#include "onednn_impl.h"

#include "kernels/relu_mask.h"

#include <math.h>
#include <string.h>

/* no FP exception is ever enabled: the fused hardswish's division may then run in every lane of
 * a vector, and the loops with it vectorise (as in src/kernels/cpu/act_kernels.c); hardswish.h
 * after it, so that its inline functions carry the same options and inline */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "kernels/hardswish.h"

/* ------------------------------------------------------------------------------------------ */
/* channels-last by hand */

/* The block loops are compiled twice, for x86-64-v3 (AVX2 + FMA) and the baseline, and the
 * loader picks one per machine (as src/kernels/cpu/act_kernels.c does): the sums twice as fast
 * on this AVX-512 machine. The choice is per machine, so it changes no result between thread
 * counts. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* Channels per block, at most: a block's accumulators (2 x 1024 doubles and floats, 24 KB on
 * the stack) stay in L1 or L2, and its rows are read in long contiguous runs (128-channel
 * blocks of ResNet-50's 1024- and 2048-channel rows cost 40-60% more in a training step). */
#define CB 1024
/* Rows summed in float before they are added to the double accumulators: float's 24 bits hold
 * eight values with room, and float sums vectorise twice as wide (ResNet-50's shapes, 1
 * thread: 1.4x faster than all-double). */
#define FROWS 8
/* Floats per block, about: a block has max(1, ROW_FLOATS / min(C, CB)) rows, so that a block is
 * worth a thread and the partials (two kinds, C doubles per row block) stay a few percent of
 * x's size. */
#define ROW_FLOATS 65536
/* Fewest floats before the loops go parallel (a parallel region costs microseconds). */
#define PAR_FLOATS 32768

/* The fixed blocks of x (rows, c): nrb row blocks of rb rows, ncb channel blocks of CB. */
typedef struct bn_blocks {
    int64_t rows, c, rb, nrb, ncb;
} bn_blocks;

static bn_blocks blocks_of(int64_t rows, int64_t c) {
    bn_blocks k = {.rows = rows, .c = c};
    int64_t cw = c < CB ? c : CB;
    k.rb = ROW_FLOATS / cw > 1 ? ROW_FLOATS / cw : 1;
    k.nrb = (rows + k.rb - 1) / k.rb;
    k.ncb = (c + CB - 1) / CB;
    return k;
}

/* Block t of k: rows [*r0, *r1), channels [*c0, *c0 + *cn); its partials go to row i = t / ncb
 * of the (nrb, C) partial arrays. */
static void block_range(const bn_blocks *k, int64_t t, int64_t *r0, int64_t *r1, int64_t *c0,
                        int64_t *cn) {
    int64_t i = t / k->ncb, j = t % k->ncb;
    *r0 = i * k->rb;
    *r1 = *r0 + k->rb < k->rows ? *r0 + k->rb : k->rows;
    *c0 = j * CB;
    *cn = k->c - *c0 < CB ? k->c - *c0 : CB;
}

/* o1, o2 (cn) = sums over rows [r0, r1) of x (rows, ld) - s and its square, for cn channels
 * from x's first: float over FROWS rows at a time, those sums added in double, in row order. */
MULTIVERSION static void stats_block(const float *x, int64_t ld, int64_t r0, int64_t r1,
                                     int64_t cn, const float *s, double *o1, double *o2) {
    double a1[CB], a2[CB];
    float f1[CB], f2[CB];
    for (int64_t j = 0; j < cn; j++)
        a1[j] = 0, a2[j] = 0;
    for (int64_t r = r0; r < r1; r += FROWS) {
        int64_t re = r + FROWS < r1 ? r + FROWS : r1;
        for (int64_t j = 0; j < cn; j++)
            f1[j] = 0, f2[j] = 0;
        for (int64_t q = r; q < re; q++) {
            const float *xr = x + q * ld;
#pragma omp simd
            for (int64_t j = 0; j < cn; j++) {
                float d = xr[j] - s[j];
                f1[j] += d;
                f2[j] += d * d;
            }
        }
#pragma omp simd
        for (int64_t j = 0; j < cn; j++) {
            a1[j] += f1[j];
            a2[j] += f2[j];
        }
    }
    memcpy(o1, a1, (size_t)cn * sizeof(double));
    memcpy(o2, a2, (size_t)cn * sizeof(double));
}

/* dz[j] = dy[j] hardswish'(z), z = x a + b recomputed with the forward's per-channel scale a
 * and shift b (its own expression, so the same bits), for j < cn: a fused hardswish's
 * gradient, written to a buffer that the loops below then read as they read dy */
MULTIVERSION static void hardswish_dz(const float *x, const float *dy, const float *a,
                                      const float *b, int64_t cn, float *dz) {
#pragma omp simd
    for (int64_t j = 0; j < cn; j++)
        dz[j] = dy[j] * hardswish_grad_f32(x[j] * a[j] + b[j]);
}

/* o1, o2 (cn) = sums over rows [r0, r1) of dz and dz (x - m): dz = dy, masked by y > 0 for
 * the relu, or for the hardswish first written to a row buffer by hardswish_dz (so that the sums' own
 * loops stay the simple ones that vectorise); float over FROWS rows, then double, as
 * stats_block */
MULTIVERSION static void grad_block(const float *x, fl_act act, const float *ry, const float *dy,
                                    int64_t ld, int64_t r0, int64_t r1, int64_t cn,
                                    const float *m, const float *za, const float *zb, double *o1,
                                    double *o2) {
    double a1[CB], a2[CB];
    float f1[CB], f2[CB], dz[CB];
    for (int64_t j = 0; j < cn; j++)
        a1[j] = 0, a2[j] = 0;
    for (int64_t r = r0; r < r1; r += FROWS) {
        int64_t re = r + FROWS < r1 ? r + FROWS : r1;
        for (int64_t j = 0; j < cn; j++)
            f1[j] = 0, f2[j] = 0;
        for (int64_t q = r; q < re; q++) {
            const float *xr = x + q * ld, *dr = dy + q * ld;
            if (act == FL_ACT_RELU) {
                const float *yr = ry + q * ld;
#pragma omp simd
                for (int64_t j = 0; j < cn; j++) {
                    float d = keep_f32(yr[j], dr[j]);
                    f1[j] += d;
                    f2[j] += d * (xr[j] - m[j]);
                }
                continue;
            }
            if (act == FL_ACT_HARDSWISH) {
                hardswish_dz(xr, dr, za, zb, cn, dz);
                dr = dz;
            }
#pragma omp simd
            for (int64_t j = 0; j < cn; j++) {
                f1[j] += dr[j];
                f2[j] += dr[j] * (xr[j] - m[j]);
            }
        }
#pragma omp simd
        for (int64_t j = 0; j < cn; j++) {
            a1[j] += f1[j];
            a2[j] += f2[j];
        }
    }
    memcpy(o1, a1, (size_t)cn * sizeof(double));
    memcpy(o2, a2, (size_t)cn * sizeof(double));
}

/* p1, p2 (nrb, C): per row block, the sums over its rows of x - s and (x - s)^2; s (C) is the
 * first row, a shift that keeps the one-pass variance free of cancellation. */
static void nhwc_stats_partials(const bn_blocks *k, const float *x, const float *s, double *p1,
                                double *p2) {
    int64_t nt = k->nrb * k->ncb;
#pragma omp parallel for schedule(static) if (k->rows * k->c >= PAR_FLOATS)
    for (int64_t t = 0; t < nt; t++) {
        int64_t r0, r1, c0, cn, o = t / k->ncb * k->c;
        block_range(k, t, &r0, &r1, &c0, &cn);
        stats_block(x + c0, k->c, r0, r1, cn, s + c0, p1 + o + c0, p2 + o + c0);
    }
}

/* p1, p2 (nrb, C): per row block, the sums over its rows of dz and dz (x - m) (grad_block) */
static void nhwc_grad_partials(const bn_blocks *k, const float *x, fl_act act, const float *ry,
                               const float *dy, const float *m, const float *za,
                               const float *zb, double *p1, double *p2) {
    int64_t nt = k->nrb * k->ncb;
#pragma omp parallel for schedule(static) if (k->rows * k->c >= PAR_FLOATS)
    for (int64_t t = 0; t < nt; t++) {
        int64_t r0, r1, c0, cn, o = t / k->ncb * k->c;
        block_range(k, t, &r0, &r1, &c0, &cn);
        grad_block(x + c0, act, ry ? ry + c0 : NULL, dy + c0, k->c, r0, r1, cn, m + c0, za + c0,
                   zb + c0, p1 + o + c0, p2 + o + c0);
    }
}

/* s[c] = sum over row blocks, in order, of p[i][c] (0 without rows) */
static void sum_partials(const bn_blocks *k, const double *p, double *s) {
    if (k->nrb == 0) {
        memset(s, 0, (size_t)k->c * sizeof(double));
        return;
    }
    memcpy(s, p, (size_t)k->c * sizeof(double));
    for (int64_t i = 1; i < k->nrb; i++) {
        const double *q = p + i * k->c;
#pragma omp simd
        for (int64_t j = 0; j < k->c; j++)
            s[j] += q[j];
    }
}

/* y = act(x a + b) per channel (a, b: C floats), rows [r0, r1) */
MULTIVERSION static void apply_rows(int64_t r0, int64_t r1, int64_t c, const float *x,
                                    const float *a, const float *b, fl_act act, float *y) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        if (act == FL_ACT_RELU) {
#pragma omp simd
            for (int64_t j = 0; j < c; j++) {
                float v = xr[j] * a[j] + b[j];
                yr[j] = v > 0 ? v : 0;
            }
        } else if (act == FL_ACT_HARDSWISH) {
#pragma omp simd
            for (int64_t j = 0; j < c; j++)
                yr[j] = hardswish_f32(xr[j] * a[j] + b[j]);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < c; j++)
                yr[j] = xr[j] * a[j] + b[j];
        }
    }
}

/* dx = a dz + bx (x - m) + c0 per channel, rows [r0, r1): dz = dy, masked by y > 0 for the
 * relu, or for the hardswish hardswish_dz's, CB channels at a time (za, zb: the forward's scale
 * and shift) */
MULTIVERSION static void dx_rows(int64_t r0, int64_t r1, int64_t c, const float *x, fl_act act,
                                 const float *ry, const float *dy, const float *za,
                                 const float *zb, const float *a, const float *bx,
                                 const float *m, const float *c0, float *dx) {
    float dz[CB];
    for (int64_t r = r0; r < r1; r++) {
        int64_t off = r * c;
        const float *xr = x + off, *dr = dy + off;
        float *o = dx + off;
        if (act == FL_ACT_RELU) {
            const float *yr = ry + off;
#pragma omp simd
            for (int64_t j = 0; j < c; j++)
                o[j] = a[j] * keep_f32(yr[j], dr[j]) + bx[j] * (xr[j] - m[j]) + c0[j];
            continue;
        }
        for (int64_t j0 = 0; j0 < c; j0 += CB) {
            int64_t cn = c - j0 < CB ? c - j0 : CB;
            const float *d = dr + j0;
            if (act == FL_ACT_HARDSWISH) {
                hardswish_dz(xr + j0, d, za + j0, zb + j0, cn, dz);
                d = dz;
            }
#pragma omp simd
            for (int64_t j = 0; j < cn; j++)
                o[j0 + j] = a[j0 + j] * d[j] + bx[j0 + j] * (xr[j0 + j] - m[j0 + j]) + c0[j0 + j];
        }
    }
}

/* The elementwise passes over rows in blocks of about ROW_FLOATS floats, blocks over threads
 * (which rows a thread gets changes no result). */
static void nhwc_apply(int64_t rows, int64_t c, const float *x, const float *a, const float *b,
                       fl_act act, float *y) {
    int64_t rb = ROW_FLOATS / c > 1 ? ROW_FLOATS / c : 1, nrb = (rows + rb - 1) / rb;
#pragma omp parallel for schedule(static) if (rows * c >= PAR_FLOATS)
    for (int64_t i = 0; i < nrb; i++)
        apply_rows(i * rb, (i + 1) * rb < rows ? (i + 1) * rb : rows, c, x, a, b, act, y);
}

static void nhwc_dx(int64_t rows, int64_t c, const float *x, fl_act act, const float *ry,
                    const float *dy, const float *za, const float *zb, const float *a,
                    const float *bx, const float *m, const float *c0, float *dx) {
    int64_t rb = ROW_FLOATS / c > 1 ? ROW_FLOATS / c : 1, nrb = (rows + rb - 1) / rb;
#pragma omp parallel for schedule(static) if (rows * c >= PAR_FLOATS)
    for (int64_t i = 0; i < nrb; i++)
        dx_rows(i * rb, (i + 1) * rb < rows ? (i + 1) * rb : rows, c, x, act, ry, dy, za, zb, a,
                bx, m, c0, dx);
}

/* a, b (C floats) = the forward's scale gamma / sqrt(var + eps) and shift beta - mean scale */
static void affine_of(int64_t c, const float *gamma, const float *beta, const double *mean,
                      const double *var, double eps, float *a, float *b) {
    for (int64_t j = 0; j < c; j++) {
        double sc = (double)gamma[j] / sqrt(var[j] + eps);
        a[j] = (float)sc;
        b[j] = (float)((double)beta[j] - mean[j] * sc);
    }
}

static void nhwc_forward(int64_t rows, int64_t c, const float *x, const float *gamma,
                         const float *beta, double eps, bool training, double *mean, double *var,
                         fl_act act, float *y) {
    bn_blocks k = blocks_of(rows, c);
    /* the calling thread's: scale, shift, the statistics' shift (C floats each), then when
     * training the partials (2 nrb C doubles) and their sums (2 C) */
    size_t fb = 3 * (size_t)c * sizeof(float), pd = training ? 2 * (size_t)((k.nrb + 1) * c) : 0;
    float *a = onednn_tls_buf((fb + 7) / 8 * 8 + pd * sizeof(double)), *b = a + c, *sh = b + c;
    if (training) {
        double *p1 = (double *)((char *)a + (fb + 7) / 8 * 8), *p2 = p1 + k.nrb * c;
        double *s1 = p2 + k.nrb * c, *s2 = s1 + c;
        memcpy(sh, x, (size_t)c * sizeof(float)); /* copied: y may alias x */
        nhwc_stats_partials(&k, x, sh, p1, p2);
        sum_partials(&k, p1, s1);
        sum_partials(&k, p2, s2);
        for (int64_t j = 0; j < c; j++) {
            double m1 = s1[j] / (double)rows, v = s2[j] / (double)rows - m1 * m1;
            mean[j] = (double)sh[j] + m1;
            var[j] = v > 0 ? v : 0;
        }
    }
    affine_of(c, gamma, beta, mean, var, eps, a, b);
    nhwc_apply(rows, c, x, a, b, act, y);
}

static void nhwc_backward(int64_t rows, int64_t c, const float *x, fl_act act, const float *ry,
                          const float *dy, const float *gamma, const float *beta,
                          const double *mean, const double *var, double eps, bool training,
                          float *dx, float *dgamma, float *dbeta, bool accumulate) {
    bn_blocks k = blocks_of(rows, c);
    size_t pd = 2 * (size_t)((k.nrb + 1) * c);
    double *p1 = onednn_tls_buf(pd * sizeof(double) + 6 * (size_t)c * sizeof(float));
    double *p2 = p1 + k.nrb * c, *sdy = p2 + k.nrb * c, *sdyx = sdy + c;
    float *a = (float *)(p1 + pd), *bx = a + c, *m = bx + c, *c0 = m + c, *za = c0 + c;
    float *zb = za + c;
    for (int64_t j = 0; j < c; j++)
        m[j] = (float)mean[j];
    if (act == FL_ACT_HARDSWISH)
        affine_of(c, gamma, beta, mean, var, eps, za, zb);
    nhwc_grad_partials(&k, x, act, ry, dy, m, za, zb, p1, p2);
    sum_partials(&k, p1, sdy);
    sum_partials(&k, p2, sdyx);
    for (int64_t j = 0; j < c; j++) {
        /* sum of d (x - mean) = sum of d (x - m) + (m - mean) sum of d, m the float mean */
        sdyx[j] += ((double)m[j] - mean[j]) * sdy[j];
        /* dx = k (d - mean(d) - xhat mean(d xhat)) = a d + bx (x - m) + c0, x - m in float as
         * oneDNN does (the cpu table's a d + bx x + c0 cancels: both terms grow with the mean) */
        double is = 1.0 / sqrt(var[j] + eps), g = sdyx[j] * is, kk = (double)gamma[j] * is;
        double mdy = training ? sdy[j] / (double)rows : 0, mdyx = training ? g / (double)rows : 0;
        dgamma[j] = (float)((accumulate ? (double)dgamma[j] : 0.0) + g);
        dbeta[j] = (float)((accumulate ? (double)dbeta[j] : 0.0) + sdy[j]);
        a[j] = (float)kk;
        bx[j] = (float)(-kk * is * mdyx);
        c0[j] = (float)(-kk * mdy - kk * is * mdyx * ((double)m[j] - mean[j]));
    }
    if (dx)
        nhwc_dx(rows, c, x, act, ry, dy, za, zb, a, bx, m, c0, dx);
}

/* ------------------------------------------------------------------------------------------ */

void onednn_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                       const void *x, const void *gamma, const void *beta, double eps,
                       bool training, double *mean, double *var, fl_act act, void *y) {
    if (t != FL_DTYPE_F32 || layout == FL_LAYOUT_NCHW) {
        onednn_cpu()->bn_forward(t, layout, n, c, hw, x, gamma, beta, eps, training, mean, var,
                                 act, y);
        return;
    }
    if (n == 0 || c == 0 || hw == 0)
        return;
    nhwc_forward(n * hw, c, x, gamma, beta, eps, training, mean, var, act, y);
}

void onednn_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                        const void *x, fl_act act, const void *y, const void *dy,
                        const void *gamma, const void *beta, const double *mean,
                        const double *var, double eps, bool training, void *dx, void *dgamma,
                        void *dbeta, bool accumulate) {
    if (t != FL_DTYPE_F32 || layout == FL_LAYOUT_NCHW) {
        onednn_cpu()->bn_backward(t, layout, n, c, hw, x, act, y, dy, gamma, beta, mean, var,
                                  eps, training, dx, dgamma, dbeta, accumulate);
        return;
    }
    if (c == 0)
        return;
    nhwc_backward(n * hw, c, x, act, act == FL_ACT_RELU ? y : NULL, dy, gamma, beta, mean, var,
                  eps, training, dx, dgamma, dbeta, accumulate);
}
