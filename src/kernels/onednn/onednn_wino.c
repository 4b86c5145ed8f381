/* onednn_wino.c - Winograd's minimal filtering F(4x4, 3x3) (Lavin & Gray 2016, "Fast Algorithms
 * for Convolutional Neural Networks", arXiv:1509.09308: Y = A^T [(G g G^T) . (B^T d B)] A, the
 * matrices of its points 0, 1, -1, 2, -2 and infinity) for channels-last f32 3x3 stride-1
 * convolutions: forward, backward data as the forward of dy with the weights turned 180
 * degrees and their channels swapped, and the weight gradient by F(3x3, 4x4) (its section
 * below). oneDNN 2.6 runs Winograd on AVX-512 only; on AVX2 its direct kernels do 9
 * multiply-adds per output and channel pair where this does 36 per 4x4 outputs (2.25 per
 * output, 4x fewer), paid in transforms and rounding.
 *
 * The output is cut in 4x4 tiles (6x6 input tiles overlapping by 2), tiles numbered image by
 * image, row by row; a piece is a fixed range of tiles (set by the shape and batch alone, never
 * by the thread count), whose inputs are transformed channel-wise (in NHWC a pixel's channels
 * are contiguous, so a block of 8 channels is one vector), multiplied at each of the 36
 * transformed positions by the transformed weights as one GEMM [tiles x C] x [C x OC]
 * (dnnl_sgemm, single-threaded: inside a parallel region, or with OpenMP's count set to 1),
 * and transformed back into its output tiles. Each output is computed by one piece in one
 * order: the bits do not depend on the thread count. */
#include "onednn_impl.h"

#include <omp.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

/* input tile side, output tile side, transformed positions */
#define TI 6
#define TO 4
#define NPOS (TI * TI)
/* lanes per vector */
#define VL 8
/* A piece has at most this many tiles: the GEMMs' M. dnnl_sgemm measured near its peak
 * (80-88 GFLOP/s, one core of the development machine) from M = 64 at K = N = 48..384. */
#define TILES_MAX 64

/* 8 floats at any 4-byte alignment (GCC's vector extension: one AVX register in the
 * x86-64-v3 clone, two SSE ones in the baseline) */
typedef float f8 __attribute__((vector_size(32), aligned(4)));

bool onednn_wino_supported(const fl_conv_desc *d) {
    const fl_conv_geom *g = &d->g;
    return d->dtype == FL_DTYPE_F32 && d->layout == FL_LAYOUT_NHWC && d->groups == 1 &&
           g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->ph <= 2 && g->pw <= 2;
}

size_t onednn_wino_scratch_bytes(const fl_conv_desc *d) {
    return (size_t)(NPOS * d->g.c * d->oc) * sizeof(float);
}

/* --- the transforms (Lavin & Gray's B^T, G and A^T for the points 0, 1, -1, 2, -2, inf) --- */

/* u (6) = G g (3), vectors; g at stride gs, u at stride us (multiplications by 1/4, 1/6, 1/12
 * and 1/24 rounded to float: an error of an eps in the weights, below the transforms') */
static inline __attribute__((always_inline)) void filter_1d(const f8 *g, int gs, f8 *u,
                                                            int us) {
    f8 g0 = g[0], g1 = g[gs], g2 = g[2 * gs], e = g0 + g2;
    u[0] = g0 * 0.25f;
    u[us] = (e + g1) * (-1.0f / 6);
    u[2 * us] = (e - g1) * (-1.0f / 6);
    u[3 * us] = g0 * (1.0f / 24) + g1 * (1.0f / 12) + g2 * (1.0f / 6);
    u[4 * us] = g0 * (1.0f / 24) - g1 * (1.0f / 12) + g2 * (1.0f / 6);
    u[5 * us] = g2;
}

/* t (6) = B^T d (6), vectors; d and t at stride s */
static inline __attribute__((always_inline)) void input_1d(const f8 *d, int s, f8 *t, int ts) {
    f8 d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    t[0] = 4 * d0 - 5 * d2 + d4;
    t[ts] = d4 + d3 - 4 * (d1 + d2);
    t[2 * ts] = d4 - d3 + 4 * (d1 - d2);
    t[3 * ts] = d4 - d2 + 2 * (d3 - d1);
    t[4 * ts] = d4 - d2 - 2 * (d3 - d1);
    t[5 * ts] = 4 * d1 - 5 * d3 + d5;
}

/* o (4) = A^T m (6), vectors; m at stride s, o at stride os */
static inline __attribute__((always_inline)) void output_1d(const f8 *m, int s, f8 *o, int os) {
    f8 a = m[s] + m[2 * s], b = m[s] - m[2 * s], c = m[3 * s] + m[4 * s],
       e = m[3 * s] - m[4 * s];
    o[0] = m[0] + a + c;
    o[os] = b + 2 * e;
    o[2 * os] = a + 4 * c;
    o[3 * os] = b + 8 * e + m[5 * s];
}

/* U (36, K, N): position p's (K, N) matrix the transform G g G^T of the 3x3 kernel that
 * connects input channel k to output channel n; forward: w (N, K, 3, 3) as given; turned
 * (backward data): w (K, N, 3, 3), its kernels turned 180 degrees. 8 output channels at once,
 * their taps gathered into vectors. */
MULTIVERSION static void weights_transform(const float *w, int64_t K, int64_t N, bool turned,
                                           float *U) {
    int64_t sk = turned ? N * 9 : 9, sn = turned ? 9 : K * 9;
#pragma omp parallel for schedule(static) if (K * N >= 16384)
    for (int64_t k = 0; k < K; k++) {
        for (int64_t n0 = 0; n0 < N; n0 += VL) {
            int64_t nw = N - n0 < VL ? N - n0 : VL;
            f8 r[9], t[TI * 3], u[NPOS];
            for (int tap = 0; tap < 9; tap++) {
                const float *q = w + k * sk + n0 * sn + (turned ? 8 - tap : tap);
                float v[VL] = {0};
                for (int64_t l = 0; l < nw; l++)
                    v[l] = q[l * sn];
                memcpy(&r[tap], v, sizeof v);
            }
            for (int j = 0; j < 3; j++) /* columns: t (6, 3) = G r */
                filter_1d(r + j, 3, t + j, 3);
            for (int i = 0; i < TI; i++) /* rows: u (6, 6) = t G^T */
                filter_1d(t + i * 3, 1, u + i * TI, 1);
            float *o = U + k * N + n0;
            for (int p = 0; p < NPOS; p++) {
                if (nw == VL)
                    *(f8 *)(o + p * K * N) = u[p];
                else
                    memcpy(o + p * K * N, &u[p], (size_t)nw * sizeof(float));
            }
        }
    }
}

/* --- one piece --- */

/* A convolution as this file runs it: x (N, H, W, C) -> y (N, OH, OW, OC), 3x3, stride 1,
 * padding ph, pw; U the transformed weights (36, C, OC); bias (OC) or NULL. */
typedef struct wino_conv {
    int64_t n, h, w, c, oh, ow, oc, ph, pw;
    int64_t th, tw, tiles; /* tiles down, across, in all */
    const float *x, *U, *bias;
    float *y;
} wino_conv;

/* *v = the 8 (cw <= 8) floats at p, zero beyond cw (through a pointer: a function returning
 * an AVX vector would change the baseline clone's ABI) */
static inline __attribute__((always_inline)) void load_part(f8 *v, const float *p, int64_t cw) {
    if (cw == VL) {
        *v = *(const f8 *)p;
    } else {
        *v = (f8){0};
        memcpy(v, p, (size_t)cw * sizeof(float));
    }
}

/* V (36, nt, C), position p's matrix at V + p ps: the input transforms B^T d B of tiles
 * [t0, t0 + nt), channels at a time */
static inline __attribute__((always_inline)) void input_tiles(const wino_conv *cv, int64_t t0,
                                                              int64_t nt, float *V, int64_t ps) {
    int64_t C = cv->c, per = cv->th * cv->tw;
    for (int64_t t = 0; t < nt; t++) {
        int64_t b = (t0 + t) / per, r = (t0 + t) % per;
        int64_t iy0 = r / cv->tw * TO - cv->ph, ix0 = r % cv->tw * TO - cv->pw;
        bool inner = iy0 >= 0 && ix0 >= 0 && iy0 + TI <= cv->h && ix0 + TI <= cv->w;
        const float *xb = cv->x + b * cv->h * cv->w * C;
        for (int64_t c0 = 0; c0 < C; c0 += VL) {
            int64_t cw = C - c0 < VL ? C - c0 : VL;
            f8 d[NPOS], s[NPOS];
            for (int i = 0; i < TI; i++) {
                int64_t iy = iy0 + i;
                for (int j = 0; j < TI; j++) {
                    int64_t ix = ix0 + j;
                    if (inner || (iy >= 0 && iy < cv->h && ix >= 0 && ix < cv->w))
                        load_part(&d[i * TI + j], xb + (iy * cv->w + ix) * C + c0, cw);
                    else
                        d[i * TI + j] = (f8){0};
                }
            }
            for (int j = 0; j < TI; j++) /* columns, then rows */
                input_1d(d + j, TI, s + j, TI);
            for (int i = 0; i < TI; i++)
                input_1d(s + i * TI, 1, d + i * TI, 1);
            float *v = V + t * C + c0;
            if (cw == VL) {
                for (int p = 0; p < NPOS; p++)
                    *(f8 *)(v + p * ps) = d[p];
            } else {
                for (int p = 0; p < NPOS; p++)
                    memcpy(v + p * ps, &d[p], (size_t)cw * sizeof(float));
            }
        }
    }
}

/* y's tiles [t0, t0 + nt) from M (36, nt, OC): A^T m A, plus the bias, cut at the image's
 * edge */
static inline __attribute__((always_inline)) void output_tiles(const wino_conv *cv, int64_t t0,
                                                               int64_t nt, const float *M) {
    int64_t OC = cv->oc, ps = nt * OC, per = cv->th * cv->tw;
    for (int64_t t = 0; t < nt; t++) {
        int64_t b = (t0 + t) / per, r = (t0 + t) % per;
        int64_t oy0 = r / cv->tw * TO, ox0 = r % cv->tw * TO;
        int64_t ny = cv->oh - oy0 < TO ? cv->oh - oy0 : TO;
        int64_t nx = cv->ow - ox0 < TO ? cv->ow - ox0 : TO;
        float *yb = cv->y + ((b * cv->oh + oy0) * cv->ow + ox0) * OC;
        for (int64_t o0 = 0; o0 < OC; o0 += VL) {
            int64_t cw = OC - o0 < VL ? OC - o0 : VL;
            const float *m = M + t * OC + o0;
            f8 mv[NPOS], s[TO * TI], o[TO * TO];
            for (int p = 0; p < NPOS; p++)
                load_part(&mv[p], m + p * ps, cw);
            for (int j = 0; j < TI; j++) /* columns: s (4, 6) */
                output_1d(mv + j, TI, s + j, TI);
            for (int i = 0; i < TO; i++) /* rows: o (4, 4) */
                output_1d(s + i * TI, 1, o + i * TO, 1);
            f8 bv = {0};
            if (cv->bias)
                load_part(&bv, cv->bias + o0, cw);
            for (int i = 0; i < ny; i++) {
                for (int j = 0; j < nx; j++) {
                    float *q = yb + (i * cv->ow + j) * OC + o0;
                    f8 v = o[i * TO + j] + bv;
                    if (cw == VL)
                        *(f8 *)q = v;
                    else
                        memcpy(q, &v, (size_t)cw * sizeof(float));
                }
            }
        }
    }
}

/* tiles [t0, t0 + nt): transforms in, 36 GEMMs, transforms out; buf (36 nt (C + OC)) */
MULTIVERSION static void piece(const wino_conv *cv, int64_t t0, int64_t nt, float *buf) {
    float *V = buf, *M = buf + NPOS * nt * cv->c;
    input_tiles(cv, t0, nt, V, nt * cv->c);
    for (int p = 0; p < NPOS; p++)
        DNNL_MUST(dnnl_sgemm('N', 'N', nt, cv->oc, cv->c, 1.0f, V + p * nt * cv->c, cv->c,
                             cv->U + p * cv->c * cv->oc, cv->oc, 0.0f, M + p * nt * cv->oc,
                             cv->oc));
    output_tiles(cv, t0, nt, M);
}

static void tiles_of(wino_conv *cv) {
    cv->th = (cv->oh + TO - 1) / TO;
    cv->tw = (cv->ow + TO - 1) / TO;
    cv->tiles = cv->n * cv->th * cv->tw;
}

/* Runs cv in pieces of equal tile counts (at most TILES_MAX each, the count fixed by the
 * tiles alone), in parallel over pieces. */
static void run(wino_conv *cv) {
    tiles_of(cv);
    int64_t np = (cv->tiles + TILES_MAX - 1) / TILES_MAX, most = (cv->tiles + np - 1) / np;
    size_t bytes = (size_t)(NPOS * most * (cv->c + cv->oc)) * sizeof(float);
    bytes = (bytes + 63) / 64 * 64;
    int nthr = omp_get_max_threads();
    int team = (int64_t)nthr < np ? nthr : (int)np;
    team = team > 1 ? team : 1;
    /* a piece's transformed tiles, one buffer per thread of the team, for this call only (a
     * thread-local buffer would outlive, unfreed, the OpenMP threads that a smaller team
     * retires) */
    char *bufs = onednn_alloc((size_t)team * bytes);
    FL_ASSERT(bufs);
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) if (team > 1)
    for (int64_t k = 0; k < np; k++) {
        /* dnnl_sgemm on one thread: inside an active parallel region it takes one; outside
         * (one thread, or one piece) OpenMP's count says 1 */
        omp_set_num_threads(1);
        int64_t a = cv->tiles * k / np, e = cv->tiles * (k + 1) / np;
        piece(cv, a, e - a, (float *)(void *)(bufs + (size_t)omp_get_thread_num() * bytes));
    }
    omp_set_num_threads(nthr);
    onednn_free(bufs);
}

void onednn_wino_forward(const fl_conv_desc *d, int64_t n, const float *x, const float *w,
                         const float *bias, float *y, void *scratch) {
    FL_ASSERT(onednn_wino_supported(d));
    const fl_conv_geom *g = &d->g;
    float *U = scratch;
    weights_transform(w, g->c, d->oc, false, U);
    wino_conv cv = {.n = n, .h = g->h, .w = g->w, .c = g->c, .oh = g->oh, .ow = g->ow,
                    .oc = d->oc, .ph = g->ph, .pw = g->pw, .x = x, .U = U, .bias = bias, .y = y};
    run(&cv);
}

void onednn_wino_backward_data(const fl_conv_desc *d, int64_t n, const float *dy,
                               const float *w, float *dx, void *scratch) {
    FL_ASSERT(onednn_wino_supported(d));
    const fl_conv_geom *g = &d->g;
    float *U = scratch;
    weights_transform(w, d->oc, g->c, true, U);
    /* dx = dy (N, OH, OW, OC) convolved with the turned kernels, padding 2 - p: OH + 2 (2 -
     * p) - 2 = H */
    wino_conv cv = {.n = n, .h = g->oh, .w = g->ow, .c = d->oc, .oh = g->h, .ow = g->w,
                    .oc = g->c, .ph = 2 - g->ph, .pw = 2 - g->pw, .x = dy, .U = U, .y = dx};
    run(&cv);
}

/* Where this measured faster than oneDNN 2.6's jit:avx2 direct kernel (forward and backward
 * data, one thread of the development machine's AMD EPYC, padding 1, ms, oneDNN against this;
 * a throw-away program timing both plans alternately, best of 5):
 *   batch 8: 48->48 48x48 10.7 / 6.2, 48->96 48x48 19.7 / 10.4, 96->96 24x24 10.0 / 4.3,
 *   128->128 12x12 5.0 / 2.3, 224->128 12x12 7.9 / 4.1, 64->64 12x12 1.04 / 0.64,
 *   160->160 10x10 5.7 / 3.6, 160->160 8x8 2.9 / 2.2, 64->64 56x56 25.1 / 11.0;
 *   slower: 160->160 6x6 1.6 / 2.1, 512->160 6x6 5.3 / 6.3, 192->192 3x3 0.62 / 1.73 (a 6x6
 *   or 3x3 output fills its 4x4 tiles to 56%), 16->16 32x32 0.59 / 0.81 (transforms dominate);
 *   32->32 32x32 1.86 / 1.77 and 24->24 48x48 2.5 / 2.4: even;
 *   batch 2: 96->96 24x24 2.6 / 1.5, 128->128 12x12 1.10 / 0.99, 64->64 12x12 0.27 / 0.28,
 *   160->160 10x10 1.4 / 1.7, 256->256 8x8 2.3 / 3.9 (fewer than 32 tiles: the weights'
 *   transform, C OC 36 floats, and the GEMMs' packing are paid for few tiles).
 * Hence: at least 40 channels in and out, 32 tiles in the plan's largest batch, and outputs
 * that fill at least two thirds of their tiles. Not measured on AVX-512, where oneDNN's
 * direct kernels run about twice as fast: there oneDNN keeps every shape. */
bool onednn_wino_faster(const fl_conv_desc *d) {
    const fl_conv_geom *g = &d->g;
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    /* the bits AVX-512's two families add to AVX2's */
    unsigned avx512 = (dnnl_cpu_isa_avx512_mic | dnnl_cpu_isa_avx512_core) & ~dnnl_cpu_isa_avx2;
    if ((unsigned)isa & avx512)
        return false;
    int64_t th = (g->oh + TO - 1) / TO, tw = (g->ow + TO - 1) / TO;
    int64_t tiles = d->max_batch * th * tw;
    bool filled = 3 * g->oh * g->ow >= 2 * TO * TO * th * tw;
    return g->c >= 40 && d->oc >= 40 && tiles >= 32 && filled;
}

/* --- the weight gradient: F(3x3, 4x4) ---
 * dw's 3x3 kernel of (o, c) is the correlation of x with dy, summed over images: per tile, the
 * 3x3 correlation of a 6x6 input tile with the 4x4 dy tile, F(3x3, 4x4) on the same points.
 * By the transposition principle (Lavin & Gray sec. 4; F(4x4, 3x3)'s bilinear form
 * sum e_i g_k d_(i+k) = sum_p (A e)_p (G g)_p (B^T d)_p, differentiated by g), it is
 * G^T [(A E A^T) . (B^T X B)] G: dy's tiles take A (6x4), the output G^T (3x6). The sum over
 * tiles is, at each of the 36 positions, one GEMM [C x tiles] x [tiles x OC] over all the
 * batch's tiles (transformed whole first), the positions' GEMMs in parallel, each on one
 * thread: nothing is split by the thread count. */

/* t (6) = A e (4), vectors; e at stride s, t at stride ts */
static inline __attribute__((always_inline)) void dy_1d(const f8 *e, int s, f8 *t, int ts) {
    f8 e0 = e[0], e1 = e[s], e2 = e[2 * s], e3 = e[3 * s];
    f8 a = e0 + e2, b = e1 + e3, c = e0 + 4 * e2, d = 2 * e1 + 8 * e3;
    t[0] = e0;
    t[ts] = a + b;
    t[2 * ts] = a - b;
    t[3 * ts] = c + d;
    t[4 * ts] = c - d;
    t[5 * ts] = e3;
}

/* D (36, *, OC), position p's matrix at D + p ps: A E A^T of dy's tiles [t0, t0 + nt) (dy
 * (N, OH, OW, OC); zero beyond the output's edge) */
static inline __attribute__((always_inline)) void dy_tiles(const wino_conv *cv, int64_t t0,
                                                           int64_t nt, const float *dy,
                                                           float *D, int64_t ps) {
    int64_t OC = cv->oc, per = cv->th * cv->tw;
    for (int64_t t = 0; t < nt; t++) {
        int64_t b = (t0 + t) / per, r = (t0 + t) % per;
        int64_t oy0 = r / cv->tw * TO, ox0 = r % cv->tw * TO;
        int64_t ny = cv->oh - oy0 < TO ? cv->oh - oy0 : TO;
        int64_t nx = cv->ow - ox0 < TO ? cv->ow - ox0 : TO;
        const float *yb = dy + ((b * cv->oh + oy0) * cv->ow + ox0) * OC;
        for (int64_t o0 = 0; o0 < OC; o0 += VL) {
            int64_t cw = OC - o0 < VL ? OC - o0 : VL;
            f8 e[TO * TO], s[TO * TI], u[NPOS];
            for (int i = 0; i < TO; i++)
                for (int j = 0; j < TO; j++) {
                    if (i < ny && j < nx)
                        load_part(&e[i * TO + j], yb + (i * cv->ow + j) * OC + o0, cw);
                    else
                        e[i * TO + j] = (f8){0};
                }
            for (int i = 0; i < TO; i++) /* rows: s (4, 6) */
                dy_1d(e + i * TO, 1, s + i * TI, 1);
            for (int j = 0; j < TI; j++) /* columns: u (6, 6) */
                dy_1d(s + j, TI, u + j, TI);
            float *v = D + t * OC + o0;
            for (int p = 0; p < NPOS; p++) {
                if (cw == VL)
                    *(f8 *)(v + p * ps) = u[p];
                else
                    memcpy(v + p * ps, &u[p], (size_t)cw * sizeof(float));
            }
        }
    }
}

/* tiles [t0, t0 + nt) of x into V (36, T, C) and of dy into D (36, T, OC) */
MULTIVERSION static void wgrad_tiles(const wino_conv *cv, int64_t t0, int64_t nt,
                                     const float *dy, float *V, float *D) {
    input_tiles(cv, t0, nt, V + t0 * cv->c, cv->tiles * cv->c);
    dy_tiles(cv, t0, nt, dy, D + t0 * cv->oc, cv->tiles * cv->oc);
}

/* G's entries, multiplied by rather than divided by (a division costs ten multiplications) */
#define Q4 0.25
#define Q6 (1.0 / 6)
#define Q12 (1.0 / 12)
#define Q24 (1.0 / 24)

size_t onednn_wino_wgrad_scratch_bytes(const fl_conv_desc *d, int64_t max_batch) {
    const fl_conv_geom *g = &d->g;
    int64_t tiles = max_batch * ((g->oh + TO - 1) / TO) * ((g->ow + TO - 1) / TO);
    return (size_t)(NPOS * (tiles * (g->c + d->oc) + g->c * d->oc)) * sizeof(float);
}

void onednn_wino_backward_filter(const fl_conv_desc *d, int64_t n, const float *x,
                                 const float *dy, float *dw, float *db, bool accumulate,
                                 void *scratch) {
    FL_ASSERT(onednn_wino_supported(d) && n >= 1);
    const fl_conv_geom *g = &d->g;
    wino_conv cv = {.n = n, .h = g->h, .w = g->w, .c = g->c, .oh = g->oh, .ow = g->ow,
                    .oc = d->oc, .ph = g->ph, .pw = g->pw, .x = x};
    tiles_of(&cv);
    int64_t T = cv.tiles, C = g->c, OC = d->oc;
    float *V = scratch, *D = V + NPOS * T * C, *W = D + NPOS * T * OC;
    int64_t nc = (T + TILES_MAX - 1) / TILES_MAX;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nc; k++) {
        int64_t a = T * k / nc, e = T * (k + 1) / nc;
        wgrad_tiles(&cv, a, e - a, dy, V, D);
    }
    int nthr = omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) if (nthr > 1)
    for (int p = 0; p < NPOS; p++) {
        omp_set_num_threads(1); /* dnnl_sgemm on one thread, as in run() */
        DNNL_MUST(dnnl_sgemm('T', 'N', C, OC, T, 1.0f, V + p * T * C, C, D + p * T * OC, OC,
                             0.0f, W + p * C * OC, OC));
    }
    omp_set_num_threads(nthr);
    /* dw (OC, C, 3, 3) = G^T m G of each (c, o)'s 36 sums, in double */
#pragma omp parallel for schedule(static) if (C * OC >= 4096)
    for (int64_t c = 0; c < C; c++) {
        for (int64_t o = 0; o < OC; o++) { /* W's 36 rows read along o */
            double m[NPOS], h[TI][3];
            for (int p = 0; p < NPOS; p++)
                m[p] = W[(p * C + c) * OC + o];
            for (int i = 0; i < TI; i++) { /* rows: h (6, 3) = m G */
                const double *r = m + i * TI;
                h[i][0] = r[0] * Q4 - (r[1] + r[2]) * Q6 + (r[3] + r[4]) * Q24;
                h[i][1] = (r[2] - r[1]) * Q6 + (r[3] - r[4]) * Q12;
                h[i][2] = (r[3] + r[4] - r[1] - r[2]) * Q6 + r[5];
            }
            float *q = dw + (o * C + c) * 9;
            for (int j = 0; j < 3; j++) { /* columns: G^T h */
                double v[3] = {h[0][j] * Q4 - (h[1][j] + h[2][j]) * Q6 + (h[3][j] + h[4][j]) * Q24,
                               (h[2][j] - h[1][j]) * Q6 + (h[3][j] - h[4][j]) * Q12,
                               (h[3][j] + h[4][j] - h[1][j] - h[2][j]) * Q6 + h[5][j]};
                for (int i = 0; i < 3; i++)
                    q[i * 3 + j] = (float)(accumulate ? q[i * 3 + j] + v[i] : v[i]);
            }
        }
    }
    if (db) { /* the bias: dy's sum per channel, pixels in order, in double */
        double *sb = onednn_tls_buf((size_t)OC * sizeof(double));
        for (int64_t o = 0; o < OC; o++)
            sb[o] = accumulate ? db[o] : 0;
        for (int64_t i = 0; i < n * g->oh * g->ow; i++)
            for (int64_t o = 0; o < OC; o++)
                sb[o] += dy[i * OC + o];
        for (int64_t o = 0; o < OC; o++)
            db[o] = (float)sb[o];
    }
}

/* Where the weight gradient measured faster than oneDNN's (one thread, batch 8 unless said,
 * oneDNN / this, ms): 48->48 48x48 12.3 / 6.6, 48->96 48x48 25.3 / 11.6, 96->96 24x24
 * 12.0 / 5.8 (batch 2: 2.6 / 2.0); 64->64 12x12 1.14 / 1.04; slower: 128->128 12x12 4.7 / 5.4,
 * 224->128 12x12 8.3 / 8.7, 160->160 8x8 3.3 / 5.7 (its GEMMs' K, the tiles, is short, and
 * the 36 C OC sums are transformed whatever the batch). Hence: where the forward runs
 * Winograd and the output has at least 16x16 pixels. */
bool onednn_wino_wgrad_faster(const fl_conv_desc *d) {
    return onednn_wino_faster(d) && d->g.oh * d->g.ow >= 256;
}
