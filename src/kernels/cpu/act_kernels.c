/* act_kernels.c - relu, tanh, sigmoid, hardswish and hardsigmoid of the CPU table, forward and
 * backward (the hard ones as MobileNetV3 defines them, arXiv:1905.02244; backend.h).
 * f32 tanh and sigmoid use an inline, vectorisable exp (glibc's tanhf costs ~20 ns per element
 * and would dominate a small MLP's step); f64 keeps libm, since it exists for gradient checks. */
#include "backend_private.h"

#include <math.h>
#include <string.h>

/* Both sides of tanh's branch select and the clamps must be computed unconditionally for the
 * loops to vectorise; GCC only if-converts a division when FP traps are declared unobserved. */
#pragma GCC optimize("no-trapping-math")

/* after the pragma: an inline function of other optimisation options is not inlined here */
#include "kernels/hardswish.h"

/* e^y for y in [-87, 89] (callers clamp; above ln(FLT_MAX) = 88.72 it returns +inf):
 * y = n ln2 + r, |r| <= ln2/2, e^r by Taylor to r^7 (truncation < 1e-8 relative), 2^n built
 * in the exponent bits. */
static inline __attribute__((always_inline)) float exp_f32(float y) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f; /* Cephes' split of ln 2 */
    const float round_magic = 12582912.0f;                        /* 1.5 * 2^23 */
    float nf = (y * log2e + round_magic) - round_magic;           /* round to nearest */
    float r = (y - nf * ln2_hi) - nf * ln2_lo;
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)nf + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh: for |x| < 0.55 its Taylor series to x^19 (next term < 4e-10 relative); above,
 * 1 - 2 / (e^{2|x|} + 1), which loses nothing to cancellation there since tanh >= 0.5.
 * NaN takes the series branch and stays NaN; the exp argument is clamped so that e^{2|x|}
 * stays finite (tanh(20) is 1 in float). */
static inline __attribute__((always_inline)) float tanh_f32(float x) {
    float a = fabsf(x);
    float ac = a < 20.0f ? a : 20.0f;
    float e = exp_f32(2.0f * ac);
    float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
    float x2 = x * x;
    float p = -0.000239129114f;
    p = p * x2 + 0.000590027440f;
    p = p * x2 - 0.00145583438f;
    p = p * x2 + 0.00359212803f;
    p = p * x2 - 0.00886323552f;
    p = p * x2 + 0.0218694885f;
    p = p * x2 - 0.0539682540f;
    p = p * x2 + 0.133333333f;
    p = p * x2 - 0.333333333f;
    float small = x + x * x2 * p;
    return a >= 0.55f ? big : small;
}

/* 1 / (1 + e^-x), with -x clamped to [-87, 89]: below, the result is 1 in float; above,
 * e^-x overflows to inf and the result is 0 (the true value is denormal). NaN passes through. */
static inline __attribute__((always_inline)) float sigmoid_f32(float x) {
    float t = -x;
    t = t < 89.0f ? (t > -87.0f ? t : -87.0f) : 89.0f;
    float s = 1.0f / (1.0f + exp_f32(t));
    return x == x ? s : x;
}

/* The f32 tanh and sigmoid loops are compiled twice, for x86-64-v3 (AVX2 + FMA: 8 lanes,
 * 3.5x faster here) and for the baseline, and the loader picks one per machine (GCC function
 * multi-versioning). The helpers above are always_inline so that each clone gets its own copy. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MULTIVERSION
#endif

MULTIVERSION static void tanh_span(const float *x, float *y, int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = tanh_f32(x[i]);
}

MULTIVERSION static void sigmoid_span(const float *x, float *y, int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = sigmoid_f32(x[i]);
}

/* Runs span over x, y (N) on the calling thread, or in blocks over threads when large. */
#define SPAN_BLOCK 8192
static void run_span(void (*span)(const float *, float *, int64_t), const float *x, float *y,
                     int64_t n) {
    if (n < PAR_MIN) {
        span(x, y, n);
        return;
    }
    int64_t nblocks = (n + SPAN_BLOCK - 1) / SPAN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t off = b * SPAN_BLOCK;
        span(x + off, y + off, n - off < SPAN_BLOCK ? n - off : SPAN_BLOCK);
    }
}

/* hardsigmoid(x) = min(max(x + 3, 0), 6) / 6, written as PyTorch computes it, with its
 * derivative (backend.h); NaN passes through: every comparison fails on it. hardswish(x) =
 * x hardsigmoid(x) is kernels/hardswish.h's. */
#define STAMP_HARD(T, S)                                                                     \
    static inline T hardsigmoid_##S(T x) {                                                   \
        T v = x + (T)3;                                                                      \
        return (v < (T)0 ? (T)0 : v > (T)6 ? (T)6 : v) / (T)6;                               \
    }                                                                                        \
    static inline T hardsigmoid_grad_##S(T x) {                                              \
        return x > (T)-3 && x < (T)3 ? (T)1 / (T)6 : (T)0;                                   \
    }
STAMP_HARD(float, f32)
STAMP_HARD(double, f64)

/* The f32 hard ones as spans too, compiled for x86-64-v3 as well: their divisions (by 6, by 3:
 * kept, as PyTorch's, rather than a multiplication by a rounded reciprocal) made the SSE loops
 * as slow as the memory they stream (PP-LCNet's hardswish layers, 5-6% of a training step);
 * eight lanes halve that. Division and the selects are exact, so both clones give the same
 * bits. */
MULTIVERSION static void hardswish_span(const float *x, float *y, int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = hardswish_f32(x[i]);
}
MULTIVERSION static void hardsigmoid_span(const float *x, float *y, int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = hardsigmoid_f32(x[i]);
}
/* dx = dy act'(x), x and dy read before dx is written (dx may alias dy) */
MULTIVERSION static void hardswish_grad_span(const float *x, const float *dy, float *dx,
                                             int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {
        float d = dy[i];
        dx[i] = d * hardswish_grad_f32(x[i]);
    }
}
MULTIVERSION static void hardsigmoid_grad_span(const float *x, const float *dy, float *dx,
                                               int64_t n) {
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {
        float d = dy[i];
        dx[i] = d * hardsigmoid_grad_f32(x[i]);
    }
}

/* run_span for a backward span: dx = f(x, dy) */
static void run_grad_span(void (*span)(const float *, const float *, float *, int64_t),
                          const float *x, const float *dy, float *dx, int64_t n) {
    if (n < PAR_MIN) {
        span(x, dy, dx, n);
        return;
    }
    int64_t nblocks = (n + SPAN_BLOCK - 1) / SPAN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t off = b * SPAN_BLOCK;
        span(x + off, dy + off, dx + off, n - off < SPAN_BLOCK ? n - off : SPAN_BLOCK);
    }
}

static void act_forward_f32(fl_act act, const float *x, float *y, int64_t n) {
    switch (act) {
    case FL_ACT_NONE:
        if (x != y && n > 0)
            memcpy(y, x, (size_t)n * sizeof(float));
        return;
    case FL_ACT_RELU: ELEMENTWISE(n, i, y[i] = x[i] < 0 ? 0.0f : x[i]); return;
    case FL_ACT_TANH: run_span(tanh_span, x, y, n); return;
    case FL_ACT_SIGMOID: run_span(sigmoid_span, x, y, n); return;
    case FL_ACT_HARDSWISH: run_span(hardswish_span, x, y, n); return;
    case FL_ACT_HARDSIGMOID: run_span(hardsigmoid_span, x, y, n); return;
    }
    FL_ASSERT(!"unknown activation");
}

static void act_forward_f64(fl_act act, const double *x, double *y, int64_t n) {
    switch (act) {
    case FL_ACT_NONE:
        if (x != y && n > 0)
            memcpy(y, x, (size_t)n * sizeof(double));
        return;
    case FL_ACT_RELU: ELEMENTWISE(n, i, y[i] = x[i] < 0 ? 0.0 : x[i]); return;
    case FL_ACT_TANH: ELEMENTWISE(n, i, y[i] = tanh(x[i])); return;
    case FL_ACT_SIGMOID: ELEMENTWISE(n, i, y[i] = 1.0 / (1.0 + exp(-x[i]))); return;
    case FL_ACT_HARDSWISH: ELEMENTWISE(n, i, y[i] = hardswish_f64(x[i])); return;
    case FL_ACT_HARDSIGMOID: ELEMENTWISE(n, i, y[i] = hardsigmoid_f64(x[i])); return;
    }
    FL_ASSERT(!"unknown activation");
}

/* dx = dy * act'(x): relu, hardswish and hardsigmoid from x, tanh and sigmoid from y. dx may
 * alias dy. */
#define STAMP_ACT_BACKWARD(T, S)                                                             \
    static void act_backward_##S(fl_act act, const T *x, const T *y, const T *dy, T *dx,     \
                                 int64_t n) {                                                \
        switch (act) {                                                                       \
        case FL_ACT_NONE:                                                                    \
            if (dx != dy && n > 0)                                                           \
                memcpy(dx, dy, (size_t)n * sizeof(T));                                       \
            return;                                                                          \
        case FL_ACT_RELU: /* dy read unconditionally: a select, which vectorises */        \
            ELEMENTWISE(n, i, T d = dy[i]; dx[i] = x[i] > 0 ? d : (T)0);                     \
            return;                                                                          \
        case FL_ACT_TANH: ELEMENTWISE(n, i, dx[i] = dy[i] * ((T)1 - y[i] * y[i])); return;   \
        case FL_ACT_SIGMOID: ELEMENTWISE(n, i, dx[i] = dy[i] * y[i] * ((T)1 - y[i])); return; \
        case FL_ACT_HARDSWISH:                                                               \
            ELEMENTWISE(n, i, dx[i] = dy[i] * hardswish_grad_##S(x[i]));                     \
            return;                                                                          \
        case FL_ACT_HARDSIGMOID:                                                             \
            ELEMENTWISE(n, i, dx[i] = dy[i] * hardsigmoid_grad_##S(x[i]));                   \
            return;                                                                          \
        }                                                                                    \
        FL_ASSERT(!"unknown activation");                                                    \
    }
STAMP_ACT_BACKWARD(float, f32)
STAMP_ACT_BACKWARD(double, f64)

void cpu_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n) {
    DISPATCH(t, act_forward, act, x, y, n);
}

void cpu_act_backward(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                      void *dx, int64_t n) {
    if (t == FL_DTYPE_F32 && (act == FL_ACT_HARDSWISH || act == FL_ACT_HARDSIGMOID)) {
        run_grad_span(act == FL_ACT_HARDSWISH ? hardswish_grad_span : hardsigmoid_grad_span, x,
                      dy, dx, n);
        return;
    }
    DISPATCH(t, act_backward, act, x, y, dy, dx, n);
}
