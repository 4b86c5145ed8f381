/* onednn_dw.c - the weight gradient of a channels-last f32 depthwise convolution (groups =
 * input = output channels: PP-LCNet's and MobileNet's 3x3 and 5x5), by hand. oneDNN 2.6 on AVX2
 * has no depthwise kernel for it at 5x5 (it falls back to its generic jit convolution, which
 * ran PP-LCNet x1.0's 5x5 layers at 4 GFLOP/s: 15% of a training step, batch 8, 1 thread), and
 * its 3x3 kernel needs the batch cut in slots whose partials are reordered and added. Here a
 * channel of x and dy is a vector lane: blocks of 16 channels (64 bytes, a cache line) run
 * over each output row, every tap's product summed in float over the row, the rows in float
 * over one image, the images in double. Work pieces are (range of images, group of channel
 * blocks; groups only when the images are few), fixed by the shape and the batch, the ranges'
 * partials added in range order: the bits do not depend on the thread count. */
#include "onednn_impl.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* channels per block: two AVX2 vectors */
#define CW 16
/* Pieces a call aims at, at least: MAX_RANGES ranges of images, each cut into channel groups
 * (whole blocks of CW channels) only when there are fewer images than that, so that two to
 * eight threads all have work. */
#define MAX_RANGES 8

/* 8 floats, loaded and stored at any 4-byte alignment (GCC's vector extension: two SSE
 * registers in the baseline clone, one AVX register in the x86-64-v3 one) */
typedef float f8 __attribute__((vector_size(32), aligned(4)));

bool onednn_dw_supported(const fl_conv_geom *g) {
    return g->kh * g->kw <= ONEDNN_DW_MAX_TAPS;
}

/* A call's pieces over n images: nr ranges of images times ng groups of gb channel blocks
 * (of ncb); scratch: nr per-range partials of (ncb, KK + 1, CW) doubles (a range's groups
 * write disjoint blocks of it), then nr ng per-piece float sums of one image, gb blocks each. */
typedef struct dw_pieces {
    int64_t ncb, nr, ng, gb, kk1;
    size_t part_doubles, bytes;
} dw_pieces;

static dw_pieces pieces_of(const fl_conv_geom *g, int64_t n) {
    dw_pieces k = {.ncb = (g->c + CW - 1) / CW, .kk1 = g->kh * g->kw + 1};
    k.nr = n < MAX_RANGES ? n : MAX_RANGES;
    k.ng = (MAX_RANGES + k.nr - 1) / k.nr;
    k.ng = k.ng < k.ncb ? k.ng : k.ncb;
    k.gb = (k.ncb + k.ng - 1) / k.ng;
    k.ng = (k.ncb + k.gb - 1) / k.gb; /* no empty group */
    k.part_doubles = (size_t)(k.nr * k.ncb * k.kk1 * CW);
    k.bytes = k.part_doubles * sizeof(double) +
              (size_t)(k.nr * k.ng * k.gb * k.kk1 * CW) * sizeof(float);
    return k;
}

size_t onednn_dw_scratch_bytes(const fl_conv_geom *g, int64_t max_batch) {
    size_t most = 0;
    for (int64_t n = 1; n <= max_batch; n++) {
        size_t b = pieces_of(g, n).bytes;
        most = b > most ? b : most;
    }
    return most;
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

/* One piece: channel blocks [cb0, cb1) of images [b0, b1). part (NCB, KK + 1, CW) doubles
 * (its blocks written) gets each tap's sums and, last, dy's (the bias gradient, when bias);
 * f ((cb1 - cb0) (KK + 1) CW floats) holds one image's. Each output row runs over all the
 * piece's channel blocks, so that the rows of x and dy it reads are read whole, once, from
 * memory. A full block (CW channels) runs on vectors: the output columns where every tap of a
 * kernel row lies in the image all taps at once (taps_row, for KW 3, 5 and 7), the others a
 * tap at a time; a narrower last block lane by lane. */
MULTIVERSION static void dw_piece(const fl_conv_geom *g, int64_t b0, int64_t b1, int64_t cb0,
                                  int64_t cb1, const float *x, const float *dy, bool bias,
                                  double *part, float *f) {
    int64_t C = g->c, kk = g->kh * g->kw, xs = g->sw * C, xd = g->dw * C, kk1 = kk + 1;
    int64_t lo[ONEDNN_DW_MAX_TAPS], hi[ONEDNN_DW_MAX_TAPS];
    for (int64_t j = 0; j < g->kw; j++)
        valid_cols(g->ow, g->w, g->sw, g->pw, j, g->dw, &lo[j], &hi[j]);
    /* the columns every tap covers: [lo[0], hi[KW - 1]) (tap 0 starts last, tap KW - 1 ends
     * first); empty where that is not a range or no all-taps kernel exists */
    bool all = g->kw == 3 || g->kw == 5 || g->kw == 7;
    int64_t in0 = lo[0], in1 = all && hi[g->kw - 1] > lo[0] ? hi[g->kw - 1] : lo[0];
    size_t fn = (size_t)((cb1 - cb0) * kk1 * CW);
    double *pp = part + cb0 * kk1 * CW;
    memset(pp, 0, fn * sizeof(double));
    for (int64_t b = b0; b < b1; b++) {
        memset(f, 0, fn * sizeof(float));
        for (int64_t oy = 0; oy < g->oh; oy++) {
            for (int64_t cb = cb0; cb < cb1; cb++) {
                int64_t c0 = cb * CW, cw = C - c0 < CW ? C - c0 : CW;
                bool vec = cw == CW && in1 > in0;
                const float *yr = dy + ((b * g->oh + oy) * g->ow) * C + c0;
                float *fc = f + (cb - cb0) * kk1 * CW;
                for (int64_t i = 0; i < g->kh; i++) {
                    int64_t iy = oy * g->sh - g->ph + i * g->dh;
                    if (iy < 0 || iy >= g->h)
                        continue;
                    /* x's row iy, from its column 0 */
                    const float *xr = x + (b * g->h + iy) * g->w * C + c0;
                    float *fi = fc + i * g->kw * CW;
                    if (vec) {
                        const float *py = yr + in0 * C, *px = xr + (in0 * g->sw - g->pw) * C;
                        if (g->kw == 3)
                            taps_row(3, in0, in1, py, px, C, xs, xd, fi);
                        else if (g->kw == 5)
                            taps_row(5, in0, in1, py, px, C, xs, xd, fi);
                        else
                            taps_row(7, in0, in1, py, px, C, xs, xd, fi);
                    }
                    for (int64_t j = 0; j < g->kw; j++) {
                        /* tap j's columns outside [in0, in1) (all of them when !vec): before,
                         * then after */
                        int64_t ra[2] = {lo[j], in1 > lo[j] ? in1 : lo[j]};
                        int64_t re[2] = {vec && in0 < hi[j] ? in0 : hi[j], hi[j]};
                        for (int k = 0; k < (vec ? 2 : 1); k++)
                            tap_cols(ra[k], re[k], yr + ra[k] * C,
                                     xr + (ra[k] * g->sw + j * g->dw - g->pw) * C, C, xs, cw,
                                     fi + j * CW);
                    }
                }
                if (bias) { /* dy's row */
                    float *fb = fc + kk * CW;
                    for (int64_t ox = 0; ox < g->ow; ox++)
                        for (int64_t c = 0; c < cw; c++)
                            fb[c] += yr[ox * C + c];
                }
            }
        }
        for (size_t t = 0; t < fn; t++)
            pp[t] += f[t];
    }
}

void onednn_dw_backward_filter(const fl_conv_geom *g, int64_t n, const float *x,
                               const float *dy, float *dw, float *db, bool accumulate,
                               double *scratch) {
    FL_ASSERT(onednn_dw_supported(g) && n >= 1);
    dw_pieces k = pieces_of(g, n);
    int64_t C = g->c, kk = k.kk1 - 1, np = k.nr * k.ng, fstride = k.gb * k.kk1 * CW;
    int64_t rstride = k.ncb * k.kk1 * CW;
    float *f0 = (float *)(scratch + k.part_doubles);
    /* piece p: images [n r / nr, n (r + 1) / nr) of range r = p / ng, blocks of group p % ng */
#pragma omp parallel for schedule(dynamic, 1) if (np > 1 && n * C * g->oh * g->ow * kk >= 65536)
    for (int64_t p = 0; p < np; p++) {
        int64_t r = p / k.ng, cb0 = p % k.ng * k.gb;
        int64_t cb1 = cb0 + k.gb < k.ncb ? cb0 + k.gb : k.ncb;
        dw_piece(g, n * r / k.nr, n * (r + 1) / k.nr, cb0, cb1, x, dy, db != NULL,
                 scratch + r * rstride, f0 + p * fstride);
    }
    /* the ranges' partials, in range order; (C, 1, KH, KW) weights */
    for (int64_t c = 0; c < C; c++) {
        const double *q = scratch + c / CW * k.kk1 * CW + c % CW;
        for (int64_t t = 0; t <= kk; t++) {
            if (t == kk && !db)
                break;
            float *o = t < kk ? dw + c * kk + t : db + c;
            double s = accumulate ? (double)*o : 0;
            for (int64_t r = 0; r < k.nr; r++)
                s += q[r * rstride + t * CW];
            *o = (float)s;
        }
    }
}
