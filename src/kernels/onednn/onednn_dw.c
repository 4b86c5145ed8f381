/* onednn_dw.c - the weight gradient of a channels-last f32 depthwise convolution (groups =
 * input = output channels: PP-LCNet's and MobileNet's 3x3 and 5x5), by hand. oneDNN 2.6 on AVX2
 * has no depthwise kernel for it at 5x5 (it falls back to its generic jit convolution, which
 * ran PP-LCNet x1.0's 5x5 layers at 4 GFLOP/s: 15% of a training step, batch 8, 1 thread), and
 * its 3x3 kernel needs the batch cut in slots whose partials are reordered and added. Here a
 * channel of x and dy is a vector lane: a block of 16 channels (64 bytes, a cache line) runs
 * over each image's pixels, every tap's product summed in float over an output row, the rows
 * in float over one image, the images in double. Work pieces are (channel block, range of
 * images), fixed by the shape and the batch, the ranges' partials added in range order: the
 * bits do not depend on the thread count. */
#include "onednn_impl.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* channels per block: two AVX2 vectors */
#define CW 16
/* pieces a call aims at, at least (channel blocks times image ranges), so that two to eight
 * threads all have work when the channels are few */
#define MIN_PIECES 8

/* 8 floats, loaded and stored at any 4-byte alignment (GCC's vector extension: two SSE
 * registers in the baseline clone, one AVX register in the x86-64-v3 one) */
typedef float f8 __attribute__((vector_size(32), aligned(4)));

bool onednn_dw_supported(const fl_conv_geom *g) {
    return g->kh * g->kw <= ONEDNN_DW_MAX_TAPS;
}

/* the image ranges of a call over n images with ncb channel blocks */
static int64_t ranges_of(int64_t n, int64_t ncb) {
    int64_t r = (MIN_PIECES + ncb - 1) / ncb;
    return r < n ? r : n;
}

size_t onednn_dw_scratch_bytes(const fl_conv_geom *g, int64_t max_batch) {
    int64_t ncb = (g->c + CW - 1) / CW, kk = g->kh * g->kw + 1; /* + 1: dbias */
    return (size_t)(ncb * ranges_of(max_batch, ncb) * kk * CW) * sizeof(double);
}

/* The output columns [*lo, *hi) whose input column ox s - p + j d lies in [0, w). */
static inline void valid_cols(int64_t ow, int64_t w, int64_t s, int64_t p, int64_t j, int64_t d,
                              int64_t *lo, int64_t *hi) {
    int64_t off = j * d - p;
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = w - 1 - off < 0 ? 0 : (w - 1 - off) / s + 1;
    *lo = a;
    *hi = b < ow ? b : ow;
}

/* ft[j] (j < KW, CW floats each) += sum over the output columns [lo, hi) of dy's column (at
 * py, then every C floats) times x's column of tap j (at px + j xd, then every xs floats), all
 * KW taps at once (2 KW independent accumulators: a tap at a time waits on the FMA's latency);
 * kw a constant once inlined, so that the accumulators live in registers. */
static inline __attribute__((always_inline)) void taps_row(const int kw, int64_t lo, int64_t hi,
                                                           const float *py, const float *px,
                                                           int64_t C, int64_t xs, int64_t xd,
                                                           float *ft) {
    f8 a[2 * 7];
#pragma GCC unroll 14
    for (int t = 0; t < 2 * kw; t++)
        a[t] = (f8){0};
    for (int64_t ox = lo; ox < hi; ox++, py += C, px += xs) {
        f8 y0 = *(const f8 *)py, y1 = *(const f8 *)(py + 8);
        const float *q = px; /* tap j's column: one pointer stepped, no offsets to keep */
#pragma GCC unroll 7
        for (int j = 0; j < kw; j++, q += xd) {
            a[2 * j] += y0 * *(const f8 *)q;
            a[2 * j + 1] += y1 * *(const f8 *)(q + 8);
        }
    }
#pragma GCC unroll 7
    for (int j = 0; j < kw; j++) {
        *(f8 *)(ft + j * CW) += a[2 * j];
        *(f8 *)(ft + j * CW + 8) += a[2 * j + 1];
    }
}

/* ft (cw floats) += sum over the output columns [a, e) of dy's column (py, then every C
 * floats) times x's (px, then every xs floats): one tap, vectors when cw = CW. */
static inline __attribute__((always_inline)) void tap_cols(int64_t a, int64_t e,
                                                           const float *py, const float *px,
                                                           int64_t C, int64_t xs, int64_t cw,
                                                           float *ft) {
    if (cw == CW) {
        f8 a0 = {0}, a1 = {0};
        for (int64_t ox = a; ox < e; ox++, py += C, px += xs) {
            a0 += *(const f8 *)py * *(const f8 *)px;
            a1 += *(const f8 *)(py + 8) * *(const f8 *)(px + 8);
        }
        *(f8 *)ft += a0;
        *(f8 *)(ft + 8) += a1;
    } else {
        for (int64_t ox = a; ox < e; ox++, py += C, px += xs)
            for (int64_t c = 0; c < cw; c++)
                ft[c] += py[c] * px[c];
    }
}

/* One piece: channels [c0, c0 + cw) of images [b0, b1); part (KK + 1, CW) doubles gets each
 * tap's sums and, last, dy's (the bias gradient, when bias). A full block (cw = CW) runs on
 * vectors: the output columns where every tap of a kernel row lies in the image all taps at
 * once (taps_row, for KW 3, 5 and 7), the others a tap at a time; a narrower block lane by
 * lane. */
MULTIVERSION static void dw_piece(const fl_conv_geom *g, int64_t b0, int64_t b1, int64_t c0,
                                  int64_t cw, const float *x, const float *dy, bool bias,
                                  double *part) {
    int64_t C = g->c, kk = g->kh * g->kw, xs = g->sw * C, xd = g->dw * C;
    float f[(ONEDNN_DW_MAX_TAPS + 1) * CW];
    int64_t lo[ONEDNN_DW_MAX_TAPS], hi[ONEDNN_DW_MAX_TAPS];
    for (int64_t j = 0; j < g->kw; j++)
        valid_cols(g->ow, g->w, g->sw, g->pw, j, g->dw, &lo[j], &hi[j]);
    /* the columns every tap covers: [lo[0], hi[KW - 1]) (tap 0 starts last, tap KW - 1 ends
     * first); empty where that is not a range or no all-taps kernel exists */
    bool all = cw == CW && (g->kw == 3 || g->kw == 5 || g->kw == 7);
    int64_t in0 = lo[0], in1 = all && hi[g->kw - 1] > lo[0] ? hi[g->kw - 1] : lo[0];
    memset(part, 0, (size_t)((kk + 1) * CW) * sizeof(double));
    for (int64_t b = b0; b < b1; b++) {
        memset(f, 0, (size_t)((kk + 1) * CW) * sizeof(float));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            const float *yr = dy + ((b * g->oh + oy) * g->ow) * C + c0;
            for (int64_t i = 0; i < g->kh; i++) {
                int64_t iy = oy * g->sh - g->ph + i * g->dh;
                if (iy < 0 || iy >= g->h)
                    continue;
                /* x's row iy, from its column 0 */
                const float *xr = x + (b * g->h + iy) * g->w * C + c0;
                float *fi = f + i * g->kw * CW;
                if (in1 > in0) {
                    const float *py = yr + in0 * C, *px = xr + (in0 * g->sw - g->pw) * C;
                    if (g->kw == 3)
                        taps_row(3, in0, in1, py, px, C, xs, xd, fi);
                    else if (g->kw == 5)
                        taps_row(5, in0, in1, py, px, C, xs, xd, fi);
                    else
                        taps_row(7, in0, in1, py, px, C, xs, xd, fi);
                }
                for (int64_t j = 0; j < g->kw; j++) {
                    /* tap j's columns outside [in0, in1): before, then after */
                    int64_t ra[2] = {lo[j], in1 > lo[j] ? in1 : lo[j]};
                    int64_t re[2] = {in1 > in0 && in0 < hi[j] ? in0 : hi[j], hi[j]};
                    for (int k = 0; k < (in1 > in0 ? 2 : 1); k++)
                        tap_cols(ra[k], re[k], yr + ra[k] * C,
                                 xr + (ra[k] * g->sw + j * g->dw - g->pw) * C, C, xs, cw,
                                 fi + j * CW);
                }
            }
            if (bias) { /* dy's row */
                float *fb = f + kk * CW;
                for (int64_t ox = 0; ox < g->ow; ox++)
                    for (int64_t c = 0; c < cw; c++)
                        fb[c] += yr[ox * C + c];
            }
        }
        for (int64_t t = 0; t < (kk + 1) * CW; t++)
            part[t] += f[t];
    }
}

void onednn_dw_backward_filter(const fl_conv_geom *g, int64_t n, const float *x,
                               const float *dy, float *dw, float *db, bool accumulate,
                               double *scratch) {
    int64_t C = g->c, kk = g->kh * g->kw, ncb = (C + CW - 1) / CW, nr = ranges_of(n, ncb);
    int64_t np = ncb * nr, stride = (kk + 1) * CW;
    FL_ASSERT(onednn_dw_supported(g) && n >= 1);
    /* piece p: channel block p / nr, images [n r / nr, n (r + 1) / nr), r = p % nr */
#pragma omp parallel for schedule(dynamic, 1) if (np > 1 && n * C * g->oh * g->ow * kk >= 65536)
    for (int64_t p = 0; p < np; p++) {
        int64_t cb = p / nr, r = p % nr, c0 = cb * CW;
        dw_piece(g, n * r / nr, n * (r + 1) / nr, c0, C - c0 < CW ? C - c0 : CW, x, dy,
                 db != NULL, scratch + p * stride);
    }
    /* the ranges' partials, in range order; (C, 1, KH, KW) weights */
    for (int64_t c = 0; c < C; c++) {
        int64_t cb = c / CW, lane = c % CW;
        const double *q = scratch + cb * nr * stride + lane;
        for (int64_t t = 0; t <= kk; t++) {
            if (t == kk && !db)
                break;
            float *o = t < kk ? dw + c * kk + t : db + c;
            double s = accumulate ? (double)*o : 0;
            for (int64_t r = 0; r < nr; r++)
                s += q[r * stride + t * CW];
            *o = (float)s;
        }
    }
}
