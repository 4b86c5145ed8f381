/* reduce.c - the elementwise reductions every self-reducing backend uses (acc = acc op in), and
 * the final division of avg. Plain `omp simd` loops; f16/bf16 are converted with branch-free
 * copies of core/half.c's conversions (bit-identical to them) so that those loops vectorise too. */
#include "comm_impl.h"

#include "fleet/status.h"

#include <string.h>

/* The f16 loops compute both sides of each select; GCC if-converts the float additions in
 * them only when FP traps are declared unobserved (values are unchanged). */
#pragma GCC optimize("no-trapping-math")

/* --- names --- */

static const char *const redop_names[FL_REDOP_COUNT] = {"sum", "avg", "max"};

const char *fl_redop_name(fl_redop op) {
    if ((unsigned)op >= FL_REDOP_COUNT)
        return "?";
    return redop_names[op];
}

int fl_redop_parse(const char *name, fl_redop *out) {
    if (!name)
        return fl_fail(FL_EINVAL, "reduction op: missing name (want sum, avg or max)");
    for (int i = 0; i < FL_REDOP_COUNT; i++) {
        if (strcmp(name, redop_names[i]) == 0) {
            *out = (fl_redop)i;
            return 0;
        }
    }
    if (strcmp(name, "mean") == 0) {
        *out = FL_REDOP_AVG;
        return 0;
    }
    return fl_fail(FL_EINVAL, "unknown reduction op \"%s\" (want sum, avg or max)", name);
}

/* --- branch-free f16 / bf16 conversions (F. Giesen's "half <-> float" method), equal bit for
 * bit to fl_f32_to_f16 / fl_f16_to_f32 / fl_f32_to_bf16 on every input (the unit test checks
 * all 2^16 halves and a sweep of floats) --- */

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float h2f(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t exp = o & (0x7c00u << 13);
    o += (127u - 15u) << 23;
    uint32_t inf_nan = o + ((128u - 16u) << 23);
    float sub = u2f(o + (1u << 23)) - u2f(113u << 23); /* zero and subnormals, exact */
    o = exp == (0x7c00u << 13) ? inf_nan : o;
    o = exp == 0 ? f2u(sub) : o;
    return u2f(o | (uint32_t)(h & 0x8000u) << 16);
}

static inline uint16_t f2h(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = x & 0x80000000u;
    uint32_t a = x ^ sign;
    /* normal: rebias, round to nearest even, carry may reach inf (correct) */
    uint32_t normal = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* subnormal or zero: adding 0.5 rounds |f| to a multiple of 2^-24 (nearest even) */
    uint32_t sub = f2u(u2f(a) + 0.5f) - f2u(0.5f);
    /* NaN keeps its top payload bits and becomes quiet, as fl_f32_to_f16 does */
    uint32_t nan = 0x7c00u | 0x200u | ((a & 0x7fffffu) >> 13);
    uint32_t o = a < (113u << 23) ? sub : normal;
    o = a >= (143u << 23) ? 0x7c00u : o; /* overflow to inf */
    o = a > 0x7f800000u ? nan : o;
    return (uint16_t)(o | sign >> 16);
}

static inline float b2f(uint16_t h) { return u2f((uint32_t)h << 16); }

static inline uint16_t f2b(float f) {
    uint32_t x = f2u(f);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : r);
}

/* --- max: a total order on the bits (NaN, either sign, above +inf; -0 below +0), so that
 * max(a, b) and max(b, a) are the same bits; recursive doubling relies on commutativity --- */

static inline int32_t key32(uint32_t u) {
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) >> 1));
}

static inline int64_t key64(uint64_t u) {
    return (int64_t)(u ^ ((uint64_t)((int64_t)u >> 63) >> 1));
}

static inline uint32_t max_bits32(uint32_t a, uint32_t b) {
    a = (a & 0x7fffffffu) > 0x7f800000u ? a & 0x7fffffffu : a;
    b = (b & 0x7fffffffu) > 0x7f800000u ? b & 0x7fffffffu : b;
    return key32(a) >= key32(b) ? a : b;
}

static inline uint64_t max_bits64(uint64_t a, uint64_t b) {
    const uint64_t abs = 0x7fffffffffffffffull, inf = 0x7ff0000000000000ull;
    a = (a & abs) > inf ? a & abs : a;
    b = (b & abs) > inf ? b & abs : b;
    return key64(a) >= key64(b) ? a : b;
}

/* 16-bit floats: inf_bits is 0x7c00 (f16) or 0x7f80 (bf16); the order of the bits is the
 * order of the values, so no conversion is needed and the result is exact. */
static inline uint16_t max_bits16(uint16_t a, uint16_t b, uint16_t inf_bits) {
    a = (uint16_t)((a & 0x7fffu) > inf_bits ? a & 0x7fffu : a);
    b = (uint16_t)((b & 0x7fffu) > inf_bits ? b & 0x7fffu : b);
    int32_t ka = (int16_t)a, kb = (int16_t)b;
    ka ^= (int32_t)((uint32_t)(ka >> 15) & 0x7fffu);
    kb ^= (int32_t)((uint32_t)(kb >> 15) & 0x7fffu);
    return ka >= kb ? a : b;
}

/* --- the loops --- */

static void sum_f32(float *restrict a, const float *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

static void sum_f64(double *restrict a, const double *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

static void sum_f16(uint16_t *restrict a, const uint16_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = f2h(h2f(a[i]) + h2f(b[i]));
}

static void sum_bf16(uint16_t *restrict a, const uint16_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = f2b(b2f(a[i]) + b2f(b[i]));
}

/* integer sums wrap (two's complement) instead of overflowing: unsigned arithmetic */
static void sum_i32(int32_t *restrict a, const int32_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = (int32_t)((uint32_t)a[i] + (uint32_t)b[i]);
}

static void sum_i64(int64_t *restrict a, const int64_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]);
}

static void max_u32(uint32_t *restrict a, const uint32_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = max_bits32(a[i], b[i]);
}

static void max_u64(uint64_t *restrict a, const uint64_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = max_bits64(a[i], b[i]);
}

static void max_u16(uint16_t *restrict a, const uint16_t *restrict b, size_t n, uint16_t inf) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = max_bits16(a[i], b[i], inf);
}

static void max_i32(int32_t *restrict a, const int32_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] > a[i] ? b[i] : a[i];
}

static void max_i64(int64_t *restrict a, const int64_t *restrict b, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] > a[i] ? b[i] : a[i];
}

void fl_reduce_into(void *acc, const void *in, size_t n, fl_dtype t, fl_redop op) {
    if (n == 0)
        return;
    if (op == FL_REDOP_MAX) {
        switch (t) {
        case FL_DTYPE_F32: max_u32(acc, in, n); return;
        case FL_DTYPE_F64: max_u64(acc, in, n); return;
        case FL_DTYPE_F16: max_u16(acc, in, n, 0x7c00u); return;
        case FL_DTYPE_BF16: max_u16(acc, in, n, 0x7f80u); return;
        case FL_DTYPE_I32: max_i32(acc, in, n); return;
        case FL_DTYPE_I64: max_i64(acc, in, n); return;
        default: break;
        }
    } else if (op == FL_REDOP_SUM || op == FL_REDOP_AVG) {
        switch (t) {
        case FL_DTYPE_F32: sum_f32(acc, in, n); return;
        case FL_DTYPE_F64: sum_f64(acc, in, n); return;
        case FL_DTYPE_F16: sum_f16(acc, in, n); return;
        case FL_DTYPE_BF16: sum_bf16(acc, in, n); return;
        case FL_DTYPE_I32: sum_i32(acc, in, n); return;
        case FL_DTYPE_I64: sum_i64(acc, in, n); return;
        default: break;
        }
    }
    FL_ASSERT(!"fl_reduce_into: dtype or op not reducible (comm.c validates)");
}

void fl_reduce_finalize(void *buf, size_t n, fl_dtype t, fl_redop op, int nranks) {
    if (op != FL_REDOP_AVG || nranks <= 1 || n == 0)
        return;
    switch (t) {
    case FL_DTYPE_F32: {
        float *x = buf, d = (float)nranks;
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
        return;
    }
    case FL_DTYPE_F64: {
        double *x = buf, d = (double)nranks;
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
        return;
    }
    case FL_DTYPE_F16: {
        uint16_t *x = buf;
        float d = (float)nranks;
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            x[i] = f2h(h2f(x[i]) / d);
        return;
    }
    case FL_DTYPE_BF16: {
        uint16_t *x = buf;
        float d = (float)nranks;
#pragma omp simd
        for (size_t i = 0; i < n; i++)
            x[i] = f2b(b2f(x[i]) / d);
        return;
    }
    case FL_DTYPE_I32: { /* C division rounds toward zero */
        int32_t *x = buf, d = nranks;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
        return;
    }
    case FL_DTYPE_I64: {
        int64_t *x = buf, d = nranks;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
        return;
    }
    default: break;
    }
    FL_ASSERT(!"fl_reduce_finalize: dtype not reducible (comm.c validates)");
}
