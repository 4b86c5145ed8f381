/* backend_cases.h - the shapes every backend is checked on against fl_backend_ref(): GEMM sizes,
 * 2-D shapes, element counts and softmax shapes (test_kernels.c, the cpu table), convolution,
 * pooling and batch-norm cases (test_backend_onednn.c), all of them for the cuda table
 * (test_cuda_backend.c). One list, so a shape added here is checked on every backend. */
#ifndef FLEET_TEST_BACKEND_CASES_H
#define FLEET_TEST_BACKEND_CASES_H

#include "fleet/rng.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define CASES_UNUSED __attribute__((unused))

/* --- the cpu table's kernels --- */

/* gemm (m, n, k): empty, tiny, odd, above the blocking thresholds; with each alpha, beta */
static const int64_t gemm_sizes[][3] CASES_UNUSED = {
    {0, 3, 4}, {3, 0, 4}, {3, 4, 0}, {1, 1, 1}, {7, 5, 3}, {2, 9, 1}, {33, 17, 65},
    {130, 97, 71}, {200, 180, 190}};
static const double gemm_ab[][2] CASES_UNUSED = {{1, 0}, {0.7, -1.3}, {1, 1}, {0, 0.5}};

/* rows x cols shapes: empty, tiny, odd, and above the threshold (with > 256 columns so
 * sum_rows splits columns over threads) */
static const int64_t shapes2d[][2] CASES_UNUSED = {{0, 5}, {5, 0}, {1, 1},
                                                   {3, 7}, {300, 129}, {150, 600}};
#define NSHAPES2D (sizeof shapes2d / sizeof shapes2d[0])

/* element counts: empty, one, odd, around the OpenMP threshold and well above it */
static const int64_t counts[] CASES_UNUSED = {0, 1, 7, 1001, 32767, 40000, 100003};
#define NCOUNTS (sizeof counts / sizeof counts[0])

/* sum and sumsq: 1M + 123 elements spans two groups of chunks */
static const int64_t reduce_ns[] CASES_UNUSED = {0, 1, 7, 4096, 4097, 40000, (1 << 20) + 123};

/* softmax (rows, classes) */
static const int64_t softmax_shapes[][2] CASES_UNUSED = {{0, 3},     {1, 1},     {5, 2},
                                                         {7, 10},    {128, 1000}, {3001, 11}};

/* --- convolution --- */

typedef struct conv_case {
    const char *name;
    int64_t n, ic, h, w, oc, kh, kw, sh, sw, ph, pw, dh, dw, groups;
    bool bias;
    int64_t extra; /* the plan is made for n + extra images (a smaller batch runs) */
} conv_case;

static const conv_case conv_cases[] CASES_UNUSED = {
    /* name, n, ic, h, w, oc, kh, kw, sh, sw, ph, pw, dh, dw, groups, bias, extra */
    {"3x3 p1, 3 -> 5, batch 1", 1, 3, 9, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, 1},
    {"1x1, 7 -> 5", 3, 7, 6, 5, 5, 1, 1, 1, 1, 0, 0, 1, 1, 1, false, 1},
    {"1x1 s2, 5 -> 7", 2, 5, 7, 9, 7, 1, 1, 2, 2, 0, 0, 1, 1, 1, true, 1},
    {"7x7 s2 p3, 3 -> 8", 2, 3, 19, 17, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, false, 1},
    {"3x3 s2 p1, 16 -> 32", 3, 16, 12, 12, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, true, 2},
    {"3x3 groups 2, 6 -> 10", 2, 6, 8, 7, 10, 3, 3, 1, 1, 1, 1, 1, 1, 2, true, 1},
    {"3x3 d2 p2, 5 -> 3", 2, 5, 11, 10, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, false, 1},
    {"5x3 s(1,3) p(2,0) d(2,1)", 2, 2, 9, 10, 3, 5, 3, 1, 3, 2, 0, 2, 1, 1, true, 1},
    {"3x3 groups 2 s2 d2, 4 -> 6", 1, 4, 13, 11, 6, 3, 3, 2, 2, 1, 1, 2, 2, 2, false, 2},
    {"kernel = image", 2, 3, 4, 3, 4, 4, 3, 1, 1, 0, 0, 1, 1, 1, true, 1},
    {"depthwise 3x3", 2, 8, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, true, 1},
    /* PP-LCNet's depthwise convolutions (groups = channels, no bias): 3x3 and 5x5, stride 1
     * and 2, odd sizes; and a grouped one of 4 channels per group */
    {"depthwise 3x3 s2, 32", 2, 32, 15, 14, 32, 3, 3, 2, 2, 1, 1, 1, 1, 32, false, 1},
    {"depthwise 5x5, 24", 2, 24, 9, 11, 24, 5, 5, 1, 1, 2, 2, 1, 1, 24, false, 1},
    {"depthwise 5x5 s2, 64", 3, 64, 14, 14, 64, 5, 5, 2, 2, 2, 2, 1, 1, 64, false, 0},
    {"pplcnet dw 3x3 on 56x56, 64", 1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 64, false, 0},
    {"groups 4 3x3, 16 -> 32", 2, 16, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 4, true, 1},
    /* onednn's channels-last depthwise weight gradient (onednn_dw.c): blocks of 16 channels
     * and a narrower last one, image ranges, all-taps rows of 3, 5 and 7 taps and the columns
     * outside them, windows wider than the image, dilation, bias, one-row and one-column
     * kernels */
    {"depthwise 3x3 d2 bias, 40 ch, 10 images", 10, 40, 9, 10, 40, 3, 3, 1, 1, 2, 2, 2, 2, 40,
     true, 0},
    {"depthwise 5x5 on 3x3, 16", 2, 16, 3, 3, 16, 5, 5, 1, 1, 2, 2, 1, 1, 16, false, 0},
    {"depthwise 1x7 s2 p1, 32", 2, 32, 5, 17, 32, 1, 7, 1, 2, 0, 1, 1, 1, 32, true, 1},
    {"depthwise 7x1 s2, 24", 3, 24, 12, 9, 24, 7, 1, 2, 1, 3, 0, 1, 1, 24, false, 1},
    {"resnet-20 3x3, 16 -> 16", 4, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, 1},
    /* the onednn weight gradient's pieces: batch slots of two sizes (10 images in 8 slots),
     * and output-channel blocks (a large kernel on a small image) */
    {"3x3, 10 images: slots of 1 and 2", 10, 5, 6, 6, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, 2},
    {"3x3 on 7x7, 128 -> 64: channel blocks", 3, 128, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, true,
     1},
    /* ResNet-50: the stem, a bottleneck at 56 x 56, a strided 3x3 */
    {"r50 stem 7x7 s2 p3", 1, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1, false, 0},
    {"r50 3x3, 64 -> 64", 2, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, 0},
    {"r50 1x1, 256 -> 64", 2, 256, 56, 56, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, false, 0},
    {"r50 1x1, 64 -> 256", 2, 64, 56, 56, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1, false, 0},
    {"r50 3x3 s2, 128 -> 128", 1, 128, 56, 56, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1, false, 1},
};
#define N_CONV_CASES (sizeof conv_cases / sizeof conv_cases[0])
#define N_CONV_RANDOM 8

/* Random shape i: kernel 1, 3, 5 or 7, stride 1-2, padding 0 to K/2, dilation 1-2, groups
 * 1-2, batch 1-3, odd and even channel counts; its name written to name. */
static inline void conv_case_random(fl_rng *rng, int i, conv_case *c, char *name, size_t len) {
    static const int64_t ks[] = {1, 3, 5, 7};
    *c = (conv_case){.name = name};
    c->groups = 1 + (int64_t)fl_rng_below(rng, 2);
    c->ic = c->groups * (1 + (int64_t)fl_rng_below(rng, 9));
    c->oc = c->groups * (1 + (int64_t)fl_rng_below(rng, 9));
    c->kh = ks[fl_rng_below(rng, 4)], c->kw = ks[fl_rng_below(rng, 4)];
    c->sh = 1 + (int64_t)fl_rng_below(rng, 2), c->sw = 1 + (int64_t)fl_rng_below(rng, 2);
    c->dh = 1 + (int64_t)fl_rng_below(rng, 2), c->dw = 1 + (int64_t)fl_rng_below(rng, 2);
    c->ph = (int64_t)fl_rng_below(rng, (uint64_t)c->kh / 2 + 1);
    c->pw = (int64_t)fl_rng_below(rng, (uint64_t)c->kw / 2 + 1);
    c->h = (c->kh - 1) * c->dh + 1 + (int64_t)fl_rng_below(rng, 9);
    c->w = (c->kw - 1) * c->dw + 1 + (int64_t)fl_rng_below(rng, 9);
    c->n = 1 + (int64_t)fl_rng_below(rng, 3);
    c->bias = fl_rng_below(rng, 2);
    c->extra = (int64_t)fl_rng_below(rng, 2);
    snprintf(name, len,
             "random %d: n %lld, %lld -> %lld (groups %lld), %lldx%lld, k %lldx%lld "
             "s %lld,%lld p %lld,%lld d %lld,%lld%s",
             i, (long long)c->n, (long long)c->ic, (long long)c->oc, (long long)c->groups,
             (long long)c->h, (long long)c->w, (long long)c->kh, (long long)c->kw,
             (long long)c->sh, (long long)c->sw, (long long)c->ph, (long long)c->pw,
             (long long)c->dh, (long long)c->dw, c->bias ? ", bias" : "");
}

/* --- pooling --- */

typedef struct pool_case {
    const char *name;
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw;
    bool ties; /* x in {0, 1, 2}, mostly 0 (a ReLU's output, coarsely): windows with ties */
} pool_case;

static const pool_case pool_cases[] CASES_UNUSED = {
    /* name, n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, ties */
    {"2x2 stride 2", 2, 5, 8, 7, 2, 2, 2, 2, 0, 0, 1, 1, false},
    {"3x3 stride 2 pad 1, ties", 2, 7, 9, 10, 3, 3, 2, 2, 1, 1, 1, 1, true},
    {"3x3 stride 1 pad 1, ties", 1, 3, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, true},
    {"3x2 stride (1,2) pad (1,0) dilation 2, ties", 2, 17, 9, 8, 3, 2, 1, 2, 1, 0, 2, 2, true},
    {"1x1 pad 1 (windows in the padding only)", 1, 3, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1, false},
    {"global 7x7", 2, 64, 7, 7, 7, 7, 1, 1, 0, 0, 1, 1, false},
    {"r50 3x3 s2 p1, 64 x 112 x 112, ties", 1, 64, 112, 112, 3, 3, 2, 2, 1, 1, 1, 1, true},
};
#define N_POOL_CASES (sizeof pool_cases / sizeof pool_cases[0])

/* --- batch norm: (N, C, HW) --- */

typedef struct bn_case {
    int64_t n, c, hw;
} bn_case;

static const bn_case bn_cases[] CASES_UNUSED = {
    {1, 3, 49}, {4, 5, 9}, {2, 7, 1}, {3, 16, 64}, {2, 64, 56 * 56}, {2, 256, 28 * 28},
    {1, 2048, 7 * 7}, {3, 5, 1525},
};
#define N_BN_CASES (sizeof bn_cases / sizeof bn_cases[0])

#endif /* FLEET_TEST_BACKEND_CASES_H */
