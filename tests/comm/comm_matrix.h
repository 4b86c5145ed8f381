/* comm_matrix.h - the collective test matrix shared by comm_check (one process per rank),
 * test_comm_algorithms and test_comm_hier (one thread per rank over socketpairs): every
 * collective x dtype x op x count, each rank filling its input from (seed, case, rank) and
 * computing the expected result for all ranks serially. Two kinds of input: small integers,
 * whose float sums are exact and so compared bit for bit, and floats spread over magnitudes
 * (random sign, exponent in [-6, 6] and every mantissa bit the dtype holds), whose sums depend
 * on the order (compared with a tolerance against a compensated sum in double, and across
 * ranks by a 64-bit hash of the output: every rank must hold the same bits).
 *
 * Cheap by construction, the checks being most of a run's CPU: every value is made directly
 * as the bits of its dtype (no rounding through f32) from a quarter of a splitmix64 step (a
 * half for spread floats, a whole one for f64's) of a stream keyed by (case, rank, block), a
 * chunk at a time with one loop per dtype; expected results come from integer sums (small integers) or double sums of
 * the values rebuilt exactly from their bits, never from the library's reduction kernels.
 * Header-only; thread-safe per communicator (no globals). */
#ifndef FLEET_TESTS_COMM_MATRIX_H
#define FLEET_TESTS_COMM_MATRIX_H

#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"
#include "fleet/tensor.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_comm  *c;
    int       rank, size;
    uint64_t  seed;
    bool      verbose;
    int       max_reports; /* mismatch lines printed before going quiet */
    /* results */
    long      checks, failures;
    uint64_t  hash;  /* of every output of every rank, in case order: equal on all ranks */
    bool      fatal; /* a collective returned an error; the communicator is unusable */
    long      case_id;
} mx_ctx;

enum { MX_EXACT = 0, MX_ORDER = 1 }; /* input kinds */

static const fl_dtype mx_dtypes[] = {FL_DTYPE_F32, FL_DTYPE_F64, FL_DTYPE_F16,
                                     FL_DTYPE_BF16, FL_DTYPE_I32, FL_DTYPE_I64};
#define MX_NDTYPES ((int)(sizeof mx_dtypes / sizeof mx_dtypes[0]))

static inline uint64_t mx_mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t mx_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return mx_mix(h ^ n);
}

/* Element i of a buffer of es-byte elements as bits (zero-extended), and back (truncated). */
static inline uint64_t mx_load(const void *b, size_t es, size_t i) {
    const char *p = (const char *)b + i * es;
    switch (es) {
    case 1: return *(const uint8_t *)p;
    case 2: { uint16_t x; memcpy(&x, p, 2); return x; }
    case 4: { uint32_t x; memcpy(&x, p, 4); return x; }
    default: { uint64_t x; memcpy(&x, p, 8); return x; }
    }
}

static inline void mx_store(void *b, size_t es, size_t i, uint64_t bits) {
    char *p = (char *)b + i * es;
    switch (es) {
    case 1: *(uint8_t *)p = (uint8_t)bits; break;
    case 2: { uint16_t x = (uint16_t)bits; memcpy(p, &x, 2); break; }
    case 4: { uint32_t x = (uint32_t)bits; memcpy(p, &x, 4); break; }
    default: memcpy(p, &bits, 8); break;
    }
}

static inline double mx_f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value of an element of dtype t held as bits, exactly (f16 decoded here, not by the
 * library: zero, subnormals, infinities and NaNs included). */
static inline double mx_to_double(fl_dtype t, uint64_t bits) {
    switch (t) {
    case FL_DTYPE_F32: return mx_f32_of((uint32_t)bits);
    case FL_DTYPE_F64: { double d; memcpy(&d, &bits, 8); return d; }
    case FL_DTYPE_F16: {
        int e = (int)(bits >> 10 & 31);
        double v = (double)(bits & 0x3ff);
        v = e == 31 ? (v != 0 ? NAN : INFINITY)
                    : e == 0 ? v * (1.0 / 16777216.0) /* 2^-24 */
                             : mx_f32_of((uint32_t)(e - 15 + 127) << 23 | (uint32_t)(bits & 0x3ff) << 13);
        return bits & 0x8000 ? -v : v;
    }
    case FL_DTYPE_BF16: return mx_f32_of((uint32_t)(bits & 0xffff) << 16);
    case FL_DTYPE_I32: return (int32_t)(uint32_t)bits;
    case FL_DTYPE_I64: return (double)(int64_t)bits;
    default: return (double)(uint8_t)bits;
    }
}

/* The bits of v in dtype t, rounded to nearest as core/half.c rounds (for tables, and the
 * expected averages, which the library divides in the dtype's precision). */
static inline uint64_t mx_bits_of(fl_dtype t, double v) {
    switch (t) {
    case FL_DTYPE_F32: { float f = (float)v; uint32_t u; memcpy(&u, &f, 4); return u; }
    case FL_DTYPE_F64: { uint64_t u; memcpy(&u, &v, 8); return u; }
    case FL_DTYPE_F16: return fl_f32_to_f16((float)v);
    case FL_DTYPE_BF16: return fl_f32_to_bf16((float)v);
    case FL_DTYPE_I32: return (uint32_t)(int32_t)v;
    case FL_DTYPE_I64: return (uint64_t)(int64_t)v;
    default: return (uint8_t)(int64_t)v;
    }
}

/* How the elements of one dtype and input kind are made from a random word x of each element,
 * of wbits bits (64 / wbits elements per splitmix64 step):
 *  MX_EXACT: an integer in [-span, span] (8 for floats, whose sums of 8 ranks stay exact even in
 *            bf16; 1000 for integers), x (2 span + 1) / 2^16 - span from 16-bit words; floats
 *            by a table of their bits;
 *  MX_ORDER: a sign bit, an exponent in [-6, 6] from 6 bits (times 13 / 64), the dtype's mbits
 *            mantissa bits from the low bits: exact in the dtype, and as a double by moving bit
 *            fields. f64's words have 64 bits (sign bit 57, exponent bits 58..63), the others'
 *            32 (exponent bits 25..30, sign bit 31). */
typedef struct {
    fl_dtype t;
    int      kind;
    size_t   es;
    bool     is_float;
    int      wbits;       /* bits per word: 16, 32 or 64 */
    int      span;
    uint64_t small[17];   /* MX_EXACT floats: the bits of -8 .. 8 */
    int      mbits, ebias, sbit; /* mantissa bits, exponent bias, sign bit */
    int      sat, eat;            /* in the word: the sign bit, the exponent's 6 bits */
    uint64_t mmask;
    double   eps;         /* the dtype's unit roundoff, for tolerances */
} mx_gen;

static inline void mx_gen_init(mx_gen *g, fl_dtype t, int kind) {
    memset(g, 0, sizeof *g);
    g->t = t;
    g->es = fl_dtype_size(t);
    g->is_float = t == FL_DTYPE_F32 || t == FL_DTYPE_F64 || t == FL_DTYPE_F16 ||
                  t == FL_DTYPE_BF16;
    g->kind = g->is_float ? kind : MX_EXACT;
    g->span = g->is_float ? 8 : 1000;
    if (g->is_float)
        for (int v = -8; v <= 8; v++)
            g->small[v + 8] = mx_bits_of(t, v);
    switch (t) {
    case FL_DTYPE_F32: g->mbits = 23, g->ebias = 127, g->sbit = 31, g->eps = 0x1p-24; break;
    case FL_DTYPE_F64: g->mbits = 52, g->ebias = 1023, g->sbit = 63, g->eps = 0x1p-53; break;
    case FL_DTYPE_F16: g->mbits = 10, g->ebias = 15, g->sbit = 15, g->eps = 0x1p-11; break;
    case FL_DTYPE_BF16: g->mbits = 7, g->ebias = 127, g->sbit = 15, g->eps = 0x1p-8; break;
    default: break;
    }
    g->mmask = (1ull << g->mbits) - 1;
    g->wbits = g->kind == MX_EXACT ? 16 : t == FL_DTYPE_F64 ? 64 : 32;
    g->sat = g->wbits == 64 ? 57 : 31;
    g->eat = g->wbits == 64 ? 58 : 25;
}

/* Rank q's key for block blk of the current case (blk: the destination rank in alltoalls). */
static inline uint64_t mx_key(const mx_ctx *m, int q, size_t blk) {
    return mx_mix(mx_mix(m->seed ^ ((uint64_t)m->case_id << 20)) ^ ((uint64_t)q << 48) ^
                  ((uint64_t)blk << 32));
}

/* The words of elements first .. first + n-1 of stream `key`: with k = 64 / wbits words per
 * step, element i is piece i mod k (from the low bits up) of mx_mix(key + i / k). */
static inline void mx_words(const mx_gen *g, uint64_t key, size_t first, size_t n,
                            uint64_t *w) {
    const int b = g->wbits;
    const size_t k = (size_t)(64 / b);
    const uint64_t mask = b == 64 ? ~0ull : (1ull << b) - 1;
    size_t i = 0;
    for (; i < n && (first + i) % k; i++) /* up to a whole step */
        w[i] = mx_mix(key + (first + i) / k) >> (b * (int)((first + i) % k)) & mask;
    switch (k) {
    case 1:
        for (; i < n; i++)
            w[i] = mx_mix(key + first + i);
        break;
    case 2:
        for (; i + 2 <= n; i += 2) {
            uint64_t x = mx_mix(key + (first + i) / 2);
            w[i] = x & mask;
            w[i + 1] = x >> 32;
        }
        break;
    default:
        for (; i + 4 <= n; i += 4) {
            uint64_t x = mx_mix(key + (first + i) / 4);
            w[i] = x & mask;
            w[i + 1] = x >> 16 & mask;
            w[i + 2] = x >> 32 & mask;
            w[i + 3] = x >> 48;
        }
        break;
    }
    for (; i < n; i++) /* what is left of a step */
        w[i] = mx_mix(key + (first + i) / k) >> (b * (int)((first + i) % k)) & mask;
}

enum { MX_CHUNK = 512 }; /* elements made or checked at a time */

/* Writes elements first .. first + n-1 of stream `key` into buf: a chunk of words at a time,
 * then one loop per element size and kind, g's fields in locals (stores through buf may alias
 * them). */
static inline void mx_fill_at(const mx_gen *g, uint64_t key, size_t first, void *buf, size_t n) {
    const int sbit = g->sbit, mbits = g->mbits, ebias = g->ebias, span = g->span, sat = g->sat,
              eat = g->eat;
    const uint64_t mmask = g->mmask, mul = (uint64_t)(2 * span + 1);
    const bool order = g->kind == MX_ORDER, is_float = g->is_float;
    uint64_t small[17], w[MX_CHUNK];
    memcpy(small, g->small, sizeof small);
#define MX_FILL_(T)                                                                               \
    do {                                                                                          \
        T *b_ = (T *)buf + c0;                                                                    \
        if (order)                                                                                \
            for (size_t i = 0; i < len; i++)                                                      \
                b_[i] = (T)((w[i] >> sat & 1) << sbit |                                           \
                            (uint64_t)(((w[i] >> eat & 63) * 13 >> 6) - 6 + ebias)                \
                                << mbits |                                                        \
                            (w[i] & mmask));                                                      \
        else if (is_float)                                                                        \
            for (size_t i = 0; i < len; i++)                                                      \
                b_[i] = (T)small[(w[i] * mul) >> 16];                                             \
        else                                                                                      \
            for (size_t i = 0; i < len; i++)                                                      \
                b_[i] = (T)(int64_t)((int64_t)((w[i] * mul) >> 16) - span);                       \
    } while (0)
    for (size_t c0 = 0; c0 < n; c0 += MX_CHUNK) {
        size_t len = n - c0 < MX_CHUNK ? n - c0 : MX_CHUNK;
        mx_words(g, key, first + c0, len, w);
        switch (g->es) {
        case 1: MX_FILL_(uint8_t); break;
        case 2: MX_FILL_(uint16_t); break;
        case 4: MX_FILL_(uint32_t); break;
        default: MX_FILL_(uint64_t); break;
        }
    }
#undef MX_FILL_
}

/* Writes elements 0 .. n-1 of stream `key` into buf. */
static inline void mx_fill(const mx_gen *g, uint64_t key, void *buf, size_t n) {
    mx_fill_at(g, key, 0, buf, n);
}

/* MX_EXACT's integers of elements first .. first + n-1 (n <= MX_CHUNK) of stream `key`. */
static inline void mx_small_at(const mx_gen *g, uint64_t key, size_t first, int32_t *out,
                               size_t n) {
    const uint64_t mul = (uint64_t)(2 * g->span + 1);
    const int span = g->span;
    uint64_t w[MX_CHUNK];
    mx_words(g, key, first, n, w);
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)((w[i] * mul) >> 16) - span;
}

/* MX_ORDER's elements first .. first + n-1 (n <= MX_CHUNK) of stream `key`, as doubles. */
static inline void mx_order_at(const mx_gen *g, uint64_t key, size_t first, double *out,
                               size_t n) {
    const uint64_t mmask = g->mmask;
    const int shift = 52 - g->mbits, sat = g->sat, eat = g->eat;
    uint64_t w[MX_CHUNK];
    mx_words(g, key, first, n, w);
    for (size_t i = 0; i < n; i++) {
        uint64_t b = (w[i] >> sat & 1) << 63 |
                     (uint64_t)(((w[i] >> eat & 63) * 13 >> 6) - 6 + 1023) << 52 |
                     (w[i] & mmask) << shift;
        memcpy(&out[i], &b, 8);
    }
}

/* n elements of dtype t as doubles (a loop per dtype). */
static inline void mx_decode(fl_dtype t, const void *in, double *out, size_t n) {
    const char *p = in;
    switch (t) {
    case FL_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            out[i] = f;
        }
        break;
    case FL_DTYPE_F64: memcpy(out, in, n * 8); break;
    default: {
        size_t es = fl_dtype_size(t);
        for (size_t i = 0; i < n; i++)
            out[i] = mx_to_double(t, mx_load(in, es, i));
        break;
    }
    }
}

/* The first of n elements at a and b (es bytes each) that differ, or n. */
static inline size_t mx_first_diff(const void *a, const void *b, size_t es, size_t n) {
    if (memcmp(a, b, n * es) == 0)
        return n;
    size_t j = 0;
    while (j < n && mx_load(a, es, j) == mx_load(b, es, j))
        j++;
    return j;
}

/* The part-th of `parts` contiguous parts of n elements: [*lo, *hi). */
static inline void mx_part(size_t n, size_t part, size_t parts, size_t *lo, size_t *hi) {
    *lo = n / parts * part + (part < n % parts ? part : n % parts);
    *hi = *lo + n / parts + (part < n % parts);
}

static inline void *mx_alloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "comm matrix: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static inline void mx_fail(mx_ctx *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void mx_fail(mx_ctx *m, const char *fmt, ...) {
    m->failures++;
    if (m->failures > m->max_reports)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: FAIL: %s\n", m->rank, line);
}

/* A collective returned an error: report it; everything after is skipped. */
static inline bool mx_rc(mx_ctx *m, int rc, const char *what) {
    if (rc >= 0)
        return true;
    fprintf(stderr, "rank %d: %s: error %s: %s\n", m->rank, what, fl_status_name(rc),
            fl_errmsg());
    m->failures++;
    m->fatal = true;
    return false;
}

/* Allgathers h; if same_everywhere, every rank's must equal ours. Folds all into m->hash. */
static inline void mx_hashes(mx_ctx *m, const char *what, uint64_t h, bool same_everywhere) {
    uint64_t *all = mx_alloc((size_t)m->size * sizeof *all);
    if (mx_rc(m, fl_comm_allgather(m->c, &h, all, 1, FL_DTYPE_I64), "allgather of hashes")) {
        for (int q = 0; q < m->size; q++) {
            if (same_everywhere && all[q] != h)
                mx_fail(m, "%s: rank %d's result differs from rank %d's (hash %016llx vs "
                        "%016llx)", what, q, m->rank, (unsigned long long)all[q],
                        (unsigned long long)h);
            m->hash = mx_mix(m->hash ^ all[q]);
        }
        m->checks++;
    }
    free(all);
}

/* The expected result of a reduction over the ranks' streams of the current case (block 0):
 * for MX_EXACT the integer sum (max) of the ranks' integers, turned into the dtype's bits
 * (floats: a table over every sum, averages divided in the dtype's precision as the library
 * does; integers: avg rounds toward zero); for MX_ORDER a compensated sum (TwoSum) in double
 * of the values, exact for f32, f16 and bf16, and the sum of magnitudes, to scale the
 * tolerance. Build with mx_red_init, free with mx_red_free. */
typedef struct {
    mx_gen    g;
    fl_redop  op;
    int       size;
    uint64_t *keys; /* [size] */
    uint64_t *want; /* MX_EXACT floats: [16 size + 1], the bits for sums -8 size .. 8 size */
} mx_red;

static inline void mx_red_init(mx_red *r, const mx_ctx *m, fl_dtype t, fl_redop op, int kind) {
    mx_gen_init(&r->g, t, kind);
    r->op = op;
    r->size = m->size;
    r->keys = mx_alloc((size_t)m->size * sizeof *r->keys);
    for (int q = 0; q < m->size; q++)
        r->keys[q] = mx_key(m, q, 0);
    r->want = NULL;
    if (r->g.kind == MX_EXACT && r->g.is_float) {
        int lim = 8 * m->size;
        r->want = mx_alloc((size_t)(2 * lim + 1) * sizeof *r->want);
        for (int s = -lim; s <= lim; s++) {
            uint64_t b;
            if (op != FL_REDOP_AVG || m->size == 1)
                b = mx_bits_of(t, s);
            else if (t == FL_DTYPE_F64)
                b = mx_bits_of(t, (double)s / m->size);
            else /* f32, and f16 / bf16 as the library: in f32, then rounded */
                b = mx_bits_of(t, (float)s / (float)m->size);
            r->want[s + lim] = b;
        }
    }
}

static inline void mx_red_free(mx_red *r) {
    free(r->keys);
    free(r->want);
}

/* MX_EXACT: the expected elements first .. first + n-1 (n <= MX_CHUNK), as the dtype's bits
 * into out. */
static inline void mx_red_exact(const mx_red *r, size_t first, size_t n, void *out) {
    int32_t acc[MX_CHUNK], v[MX_CHUNK];
    uint64_t bits[MX_CHUNK];
    mx_small_at(&r->g, r->keys[0], first, acc, n);
    for (int q = 1; q < r->size; q++) {
        mx_small_at(&r->g, r->keys[q], first, v, n);
        if (r->op == FL_REDOP_MAX)
            for (size_t i = 0; i < n; i++)
                acc[i] = v[i] > acc[i] ? v[i] : acc[i];
        else
            for (size_t i = 0; i < n; i++)
                acc[i] += v[i];
    }
    if (r->want) {
        const uint64_t *w = r->want + 8 * r->size;
        for (size_t i = 0; i < n; i++)
            bits[i] = w[acc[i]];
    } else {
        int d = r->op == FL_REDOP_AVG ? r->size : 1;
        for (size_t i = 0; i < n; i++)
            bits[i] = (uint64_t)(int64_t)(acc[i] / d);
    }
    size_t es = r->g.es;
    for (size_t i = 0; i < n; i++)
        mx_store(out, es, i, bits[i]);
}

/* MX_ORDER: the reduction of elements first .. first + n-1 (n <= MX_CHUNK) into want, the
 * sums of magnitudes into mag. */
static inline void mx_red_order(const mx_red *r, size_t first, size_t n, double *want,
                                double *mag) {
    double c[MX_CHUNK], v[MX_CHUNK];
    mx_order_at(&r->g, r->keys[0], first, want, n);
    for (size_t i = 0; i < n; i++) {
        c[i] = 0;
        mag[i] = fabs(want[i]);
    }
    for (int q = 1; q < r->size; q++) {
        mx_order_at(&r->g, r->keys[q], first, v, n);
        if (r->op == FL_REDOP_MAX) {
            for (size_t i = 0; i < n; i++) {
                mag[i] += fabs(v[i]);
                want[i] = v[i] > want[i] ? v[i] : want[i];
            }
            continue;
        }
        for (size_t i = 0; i < n; i++) { /* Knuth's TwoSum: t + its error is s + v exactly */
            double s = want[i], t = s + v[i], bv = t - s;
            mag[i] += fabs(v[i]);
            c[i] += (s - (t - bv)) + (v[i] - bv);
            want[i] = t;
        }
    }
    for (size_t i = 0; i < n; i++)
        want[i] += c[i];
}

/* Checks the part-th of `parts` contiguous parts of `got` (n elements: element j is element
 * base + j of the reduction of the current case). An output that every rank holds whole
 * (allreduce) is checked in parts, the ranks' parts together all of it: mx_hashes proves the
 * ranks hold the same bits. */
static inline void mx_check_reduced(mx_ctx *m, const char *what, fl_dtype t, fl_redop op,
                                    int kind, const void *got, size_t base, size_t n,
                                    size_t part, size_t parts) {
    mx_red r;
    mx_red_init(&r, m, t, op, kind);
    size_t es = r.g.es, lo, hi;
    mx_part(n, part, parts, &lo, &hi);
    m->checks++;
    double div = op == FL_REDOP_AVG ? m->size : 1;
    double tol = (m->size + 2) * r.g.eps / div;
    for (size_t c0 = lo; c0 < hi; c0 += MX_CHUNK) {
        size_t len = hi - c0 < MX_CHUNK ? hi - c0 : MX_CHUNK;
        const char *g = (const char *)got + c0 * es;
        if (r.g.kind == MX_EXACT) {
            uint64_t want[MX_CHUNK];
            mx_red_exact(&r, base + c0, len, want);
            size_t j = mx_first_diff(g, want, es, len);
            if (j < len) {
                mx_fail(m, "%s: element %zu: got %.9g want %.9g", what, c0 + j,
                        mx_to_double(t, mx_load(g, es, j)), mx_to_double(t, mx_load(want, es, j)));
                break;
            }
        } else {
            double want[MX_CHUNK], mag[MX_CHUNK], gd[MX_CHUNK];
            mx_red_order(&r, base + c0, len, want, mag);
            mx_decode(t, g, gd, len);
            size_t j = 0;
            while (j < len && fabs(gd[j] - want[j] / div) <= tol * mag[j])
                j++;
            if (j < len) {
                mx_fail(m, "%s: element %zu: got %.9g want %.9g (tolerance %.3g)", what, c0 + j,
                        gd[j], want[j] / div, tol * mag[j]);
                break;
            }
        }
    }
    mx_red_free(&r);
}

static inline void mx_name(char *buf, size_t cap, const char *coll, fl_dtype t, int op,
                           int kind, size_t count) {
    snprintf(buf, cap, "%s %s%s%s count %zu%s", coll, fl_dtype_name(t), op >= 0 ? " " : "",
             op >= 0 ? fl_redop_name((fl_redop)op) : "", count,
             kind == MX_ORDER ? " (order-sensitive values)" : "");
}

static inline void mx_allreduce(mx_ctx *m, fl_dtype t, fl_redop op, int kind, size_t count) {
    char what[160];
    mx_name(what, sizeof what, "allreduce", t, (int)op, kind, count);
    m->case_id++;
    size_t es = fl_dtype_size(t);
    void *buf = mx_alloc(count * es);
    mx_gen g;
    mx_gen_init(&g, t, kind);
    mx_fill(&g, mx_key(m, m->rank, 0), buf, count);
    double t0 = fl_now();
    if (mx_rc(m, fl_comm_allreduce(m->c, buf, count, t, op), what)) {
        double dt = fl_now() - t0;
        if (m->verbose && m->rank == 0)
            fprintf(stderr, "%s: %.3f ms\n", what, dt * 1e3);
        mx_check_reduced(m, what, t, op, kind, buf, 0, count, (size_t)m->rank, (size_t)m->size);
        mx_hashes(m, what, mx_hash_bytes(0, buf, count * es), true);
    }
    free(buf);
}

static inline void mx_reduce_scatter(mx_ctx *m, fl_dtype t, fl_redop op, int kind,
                                     size_t count) {
    char what[160];
    mx_name(what, sizeof what, "reduce_scatter", t, (int)op, kind, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), total = count * (size_t)m->size;
    void *in = mx_alloc(total * es), *out = mx_alloc(count * es);
    mx_gen g;
    mx_gen_init(&g, t, kind);
    mx_fill(&g, mx_key(m, m->rank, 0), in, total);
    if (mx_rc(m, fl_comm_reduce_scatter(m->c, in, out, count, t, op), what)) {
        mx_check_reduced(m, what, t, op, kind, out, (size_t)m->rank * count, count, 0, 1);
        mx_hashes(m, what, mx_hash_bytes(0, out, count * es), false);
    }
    free(in);
    free(out);
}

/* Checks the part-th of `parts` contiguous parts of `got` (n elements) against elements
 * 0 .. n-1 of stream `key`; reports the first that differs. Returns whether all matched. */
static inline bool mx_check_copy(mx_ctx *m, const char *what, const char *whose,
                                 const mx_gen *g, uint64_t key, const void *got, size_t n,
                                 size_t part, size_t parts) {
    size_t lo, hi, es = g->es;
    mx_part(n, part, parts, &lo, &hi);
    uint64_t want[MX_CHUNK];
    for (size_t c0 = lo; c0 < hi; c0 += MX_CHUNK) {
        size_t len = hi - c0 < MX_CHUNK ? hi - c0 : MX_CHUNK;
        const char *gp = (const char *)got + c0 * es;
        mx_fill_at(g, key, c0, want, len);
        size_t j = mx_first_diff(gp, want, es, len);
        if (j < len) {
            mx_fail(m, "%s: %selement %zu: got %.9g want %.9g", what, whose, c0 + j,
                    mx_to_double(g->t, mx_load(gp, es, j)),
                    mx_to_double(g->t, mx_load(want, es, j)));
            return false;
        }
    }
    return true;
}

/* allgather (counts NULL: count each; in_place: in is out's own block) or allgatherv; every
 * rank checks its part of each rank's block of the output (the ranks' parts together all of
 * it), mx_hashes that all hold the same bits. */
static inline void mx_allgather(mx_ctx *m, fl_dtype t, size_t count, const size_t *counts,
                                bool in_place) {
    char what[160];
    mx_name(what, sizeof what, counts ? "allgatherv" : in_place ? "allgather (in place)"
                                                                : "allgather",
            t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), total = 0, mine = 0;
    for (int q = 0; q < m->size; q++) {
        if (q == m->rank)
            mine = total;
        total += counts ? counts[q] : count;
    }
    size_t my_n = counts ? counts[m->rank] : count;
    void *out = mx_alloc(total * es);
    void *in = in_place ? (char *)out + mine * es : mx_alloc(my_n * es);
    memset(out, 0xa5, total * es);
    mx_gen g;
    mx_gen_init(&g, t, MX_EXACT);
    mx_fill(&g, mx_key(m, m->rank, 0), in, my_n);
    int rc = counts ? fl_comm_allgatherv(m->c, in, out, counts, t)
                    : fl_comm_allgather(m->c, in, out, count, t);
    if (mx_rc(m, rc, what)) {
        m->checks++;
        size_t off = 0;
        for (int q = 0; q < m->size; q++) { /* this rank's part of each rank's block */
            size_t n = counts ? counts[q] : count;
            char whose[32];
            snprintf(whose, sizeof whose, "rank %d's ", q);
            if (!mx_check_copy(m, what, whose, &g, mx_key(m, q, 0), (char *)out + off * es, n,
                               (size_t)m->rank, (size_t)m->size))
                break;
            off += n;
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, total * es), true);
    }
    if (!in_place)
        free(in);
    free(out);
}

/* alltoallv: rank q sends rank p a block of mx_a2a_count(q, p) elements (0 for a third of the
 * pairs, sizes that differ per pair), block p of q's stream; every rank checks every block it
 * received and that the results agree (hash of all blocks, gathered). */
static inline size_t mx_a2a_count(size_t count, int q, int p) {
    return (q + p) % 3 == 1 || count == 0 ? 0 : count + (size_t)q + 2 * (size_t)p;
}

static inline void mx_alltoallv(mx_ctx *m, fl_dtype t, size_t count) {
    char what[160];
    mx_name(what, sizeof what, "alltoallv", t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), stotal = 0, rtotal = 0, n = (size_t)m->size;
    size_t *sc = mx_alloc(2 * n * sizeof *sc), *rc_ = sc + n;
    for (int p = 0; p < m->size; p++) {
        sc[p] = mx_a2a_count(count, m->rank, p);
        rc_[p] = mx_a2a_count(count, p, m->rank);
        stotal += sc[p];
        rtotal += rc_[p];
    }
    char *in = mx_alloc(stotal * es), *out = mx_alloc(rtotal * es);
    memset(out, 0xa5, rtotal * es);
    mx_gen g;
    mx_gen_init(&g, t, MX_EXACT);
    size_t off = 0;
    for (int p = 0; p < m->size; p++) {
        mx_fill(&g, mx_key(m, m->rank, (size_t)p), in + off * es, sc[p]);
        off += sc[p];
    }
    if (mx_rc(m, fl_comm_alltoallv(m->c, in, sc, out, rc_, t), what)) {
        m->checks++;
        off = 0;
        for (int q = 0; q < m->size; q++) {
            char whose[32];
            snprintf(whose, sizeof whose, "from rank %d, ", q);
            if (!mx_check_copy(m, what, whose, &g, mx_key(m, q, (size_t)m->rank), out + off * es,
                               rc_[q], 0, 1))
                break;
            off += rc_[q];
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, rtotal * es), false);
    }
    free(in);
    free(out);
    free(sc);
}

/* alltoall: rank q sends rank p a block of count elements, block p of q's stream, by the
 * blocking or the async call; every rank checks every block it received bit for bit (they are
 * copies) and the results fold into the hash. */
static inline void mx_alltoall(mx_ctx *m, fl_dtype t, size_t count, bool async) {
    char what[160];
    mx_name(what, sizeof what, async ? "ialltoall" : "alltoall", t, -1, MX_EXACT, count);
    m->case_id++;
    size_t es = fl_dtype_size(t), n = (size_t)m->size;
    char *in = mx_alloc(n * count * es), *out = mx_alloc(n * count * es);
    memset(out, 0xa5, n * count * es);
    mx_gen g;
    mx_gen_init(&g, t, MX_EXACT);
    for (size_t p = 0; p < n; p++)
        mx_fill(&g, mx_key(m, m->rank, p), in + p * count * es, count);
    fl_request *r = NULL;
    int rc = async ? fl_comm_ialltoall(m->c, in, out, count, t, &r)
                   : fl_comm_alltoall(m->c, in, out, count, t);
    if (rc >= 0)
        rc = fl_request_wait(r);
    if (mx_rc(m, rc, what)) {
        m->checks++;
        for (int q = 0; q < m->size; q++) {
            char whose[32];
            snprintf(whose, sizeof whose, "from rank %d, ", q);
            if (!mx_check_copy(m, what, whose, &g, mx_key(m, q, (size_t)m->rank),
                               out + (size_t)q * count * es, count, 0, 1))
                break;
        }
        mx_hashes(m, what, mx_hash_bytes(0, out, n * count * es), false);
    }
    free(in);
    free(out);
}

static inline void mx_broadcast(mx_ctx *m, fl_dtype t, size_t count, int root) {
    char what[160];
    mx_name(what, sizeof what, "broadcast", t, -1, MX_EXACT, count);
    snprintf(what + strlen(what), sizeof what - strlen(what), " root %d", root);
    m->case_id++;
    size_t es = fl_dtype_size(t);
    void *buf = mx_alloc(count * es);
    mx_gen g;
    mx_gen_init(&g, t, MX_EXACT);
    mx_fill(&g, mx_key(m, m->rank, 0), buf, count); /* non-roots start from their own values */
    if (mx_rc(m, fl_comm_broadcast(m->c, buf, count, t, root), what)) {
        m->checks++;
        mx_check_copy(m, what, "", &g, mx_key(m, root, 0), buf, count, 0, 1);
        mx_hashes(m, what, mx_hash_bytes(0, buf, count * es), true);
    }
    free(buf);
}

/* Several iallreduces (and an iallgather, an ibroadcast) outstanding at once while this thread
 * computes the expected results; then a blocking allreduce right behind more async ones. They
 * must complete in issue order with the right results. */
static inline void mx_async(mx_ctx *m, size_t count) {
    enum { NA = 4 };
    static const fl_dtype ts[NA] = {FL_DTYPE_F32, FL_DTYPE_I64, FL_DTYPE_F16, FL_DTYPE_F64};
    static const fl_redop ops[NA] = {FL_REDOP_SUM, FL_REDOP_MAX, FL_REDOP_AVG, FL_REDOP_SUM};
    static const int kinds[NA] = {MX_EXACT, MX_EXACT, MX_EXACT, MX_ORDER};
    void *bufs[NA];
    long ids[NA];
    fl_request *req[NA + 2] = {0};
    char what[160];
    snprintf(what, sizeof what, "async iallreduce x%d + iallgather + ibroadcast count %zu", NA,
             count);
    mx_gen g;
    for (int k = 0; k < NA; k++) {
        ids[k] = ++m->case_id;
        bufs[k] = mx_alloc(count * fl_dtype_size(ts[k]));
        mx_gen_init(&g, ts[k], kinds[k]);
        mx_fill(&g, mx_key(m, m->rank, 0), bufs[k], count);
    }
    long gid = ++m->case_id;
    mx_gen gi32, gf64;
    mx_gen_init(&gi32, FL_DTYPE_I32, MX_EXACT);
    mx_gen_init(&gf64, FL_DTYPE_F64, MX_EXACT);
    int32_t *gin = mx_alloc(count * 4), *gout = mx_alloc(count * 4 * (size_t)m->size);
    mx_fill(&gi32, mx_key(m, m->rank, 0), gin, count);
    long bid = ++m->case_id;
    int root = (int)(count % (size_t)m->size);
    double *bbuf = mx_alloc(count * 8);
    if (m->rank == root)
        mx_fill(&gf64, mx_key(m, root, 0), bbuf, count);
    else
        for (size_t i = 0; i < count; i++)
            bbuf[i] = -1;

    bool ok = true;
    for (int k = 0; k < NA && ok; k++)
        ok = mx_rc(m, fl_comm_iallreduce(m->c, bufs[k], count, ts[k], ops[k], &req[k]), what);
    if (ok)
        ok = mx_rc(m, fl_comm_iallgather(m->c, gin, gout, count, FL_DTYPE_I32, &req[NA]), what);
    if (ok)
        ok = mx_rc(m, fl_comm_ibroadcast(m->c, bbuf, count, FL_DTYPE_F64, root, &req[NA + 1]),
                   what);
    /* the caller computes meanwhile: here, the expected results */
    void *want[NA];
    long saved = m->case_id;
    for (int k = 0; k < NA; k++) {
        size_t es = fl_dtype_size(ts[k]);
        want[k] = mx_alloc(count * es);
        m->case_id = ids[k];
        if (kinds[k] == MX_EXACT) {
            mx_red r;
            mx_red_init(&r, m, ts[k], ops[k], kinds[k]);
            for (size_t i = 0; i < count; i += MX_CHUNK)
                mx_red_exact(&r, i, count - i < MX_CHUNK ? count - i : MX_CHUNK,
                             (char *)want[k] + i * es);
            mx_red_free(&r);
        }
    }
    m->case_id = saved;
    if (ok) {
        /* the last one done means all before it are done (issue order) */
        int rc = fl_request_wait(req[NA + 1]);
        req[NA + 1] = NULL;
        if (mx_rc(m, rc, what)) {
            m->checks++;
            for (int k = 0; k < NA + 1; k++)
                if (!fl_request_test(req[k]))
                    mx_fail(m, "%s: request %d not complete after request %d", what, k, NA + 1);
        }
    }
    for (int k = 0; k < NA + 2; k++) {
        int rc = fl_request_wait(req[k]);
        if (ok && rc < 0)
            ok = mx_rc(m, rc, what);
    }
    if (ok) {
        for (int k = 0; k < NA; k++) {
            saved = m->case_id;
            m->case_id = ids[k];
            if (kinds[k] == MX_EXACT) {
                m->checks++;
                if (memcmp(want[k], bufs[k], count * fl_dtype_size(ts[k])) != 0)
                    mx_fail(m, "%s: iallreduce %d (%s %s) result wrong", what, k,
                            fl_dtype_name(ts[k]), fl_redop_name(ops[k]));
            } else {
                mx_check_reduced(m, what, ts[k], ops[k], kinds[k], bufs[k], 0, count, 0, 1);
            }
            m->case_id = saved;
        }
        saved = m->case_id;
        m->checks++;
        m->case_id = gid;
        for (int q = 0; q < m->size; q++)
            if (!mx_check_copy(m, what, "iallgather: ", &gi32, mx_key(m, q, 0),
                               gout + (size_t)q * count, count, 0, 1))
                break;
        m->case_id = bid;
        mx_check_copy(m, what, "ibroadcast: ", &gf64, mx_key(m, root, 0), bbuf, count, 0, 1);
        m->case_id = saved;
        uint64_t h = 0;
        for (int k = 0; k < NA; k++)
            h = mx_hash_bytes(h, bufs[k], count * fl_dtype_size(ts[k]));
        mx_hashes(m, what, h, true);
    }
    for (int k = 0; k < NA; k++) {
        free(bufs[k]);
        free(want[k]);
    }
    free(gin);
    free(gout);
    free(bbuf);
    if (!ok)
        return;

    /* a blocking call behind async ones waits for them */
    snprintf(what, sizeof what, "iallreduce then blocking allreduce count %zu", count);
    long id1 = ++m->case_id, id2 = ++m->case_id;
    float *a = mx_alloc(count * 4), *b = mx_alloc(count * 4);
    mx_gen_init(&g, FL_DTYPE_F32, MX_EXACT);
    m->case_id = id1;
    mx_fill(&g, mx_key(m, m->rank, 0), a, count);
    m->case_id = id2;
    mx_fill(&g, mx_key(m, m->rank, 0), b, count);
    fl_request *r = NULL;
    if (mx_rc(m, fl_comm_iallreduce(m->c, a, count, FL_DTYPE_F32, FL_REDOP_SUM, &r), what) &&
        mx_rc(m, fl_comm_allreduce(m->c, b, count, FL_DTYPE_F32, FL_REDOP_MAX), what)) {
        m->checks++;
        if (!fl_request_test(r))
            mx_fail(m, "%s: the blocking call returned before the async one completed", what);
        if (mx_rc(m, fl_request_wait(r), what)) {
            m->case_id = id1;
            mx_check_reduced(m, what, FL_DTYPE_F32, FL_REDOP_SUM, MX_EXACT, a, 0, count, 0, 1);
            m->case_id = id2;
            mx_check_reduced(m, what, FL_DTYPE_F32, FL_REDOP_MAX, MX_EXACT, b, 0, count, 0, 1);
        }
        r = NULL;
    }
    fl_request_wait(r);
    m->case_id = id2;
    free(a);
    free(b);
}

/* Runs the whole matrix for each count. Returns this rank's failures (and m->fatal). */
static inline long mx_run(mx_ctx *m, const size_t *counts, int ncounts) {
    static const fl_redop ops[] = {FL_REDOP_SUM, FL_REDOP_AVG, FL_REDOP_MAX};
    m->rank = fl_comm_rank(m->c);
    m->size = fl_comm_size(m->c);
    if (m->max_reports == 0)
        m->max_reports = 20;
    for (int ci = 0; ci < ncounts && !m->fatal; ci++) {
        size_t count = counts[ci];
        for (int d = 0; d < MX_NDTYPES && !m->fatal; d++) {
            fl_dtype t = mx_dtypes[d];
            for (int o = 0; o < 3 && !m->fatal; o++) {
                mx_allreduce(m, t, ops[o], MX_EXACT, count);
                mx_reduce_scatter(m, t, ops[o], MX_EXACT, count);
                if (fl_dtype_is_float(t) && ops[o] != FL_REDOP_MAX) {
                    mx_allreduce(m, t, ops[o], MX_ORDER, count);
                    mx_reduce_scatter(m, t, ops[o], MX_ORDER, count);
                }
            }
        }
        size_t *vc = mx_alloc(2 * (size_t)m->size * sizeof *vc), *uc = vc + m->size;
        for (int q = 0; q < m->size; q++) { /* some ranks contribute nothing */
            vc[q] = q % 3 == 1 ? 0 : (count ? count + (size_t)q : 0);
            /* very unequal: rank 0 nothing, one rank 3 * count + 5, the others 0 or 1 */
            uc[q] = q == m->size - 1 ? 3 * count + 5 : (size_t)(q % 2);
        }
        for (int d = 0; d < MX_NDTYPES && !m->fatal; d++) {
            fl_dtype t = mx_dtypes[d];
            mx_allgather(m, t, count, NULL, false);
            mx_allgather(m, t, count, vc, false);
            mx_allgather(m, t, count, uc, false);
            mx_alltoallv(m, t, count);
            mx_alltoall(m, t, count, d % 2 == 1);
            mx_broadcast(m, t, count, (int)((count + (size_t)d) % (size_t)m->size));
        }
        if (!m->fatal) {
            mx_allgather(m, FL_DTYPE_U8, count, NULL, true);
            mx_allgather(m, FL_DTYPE_I32, count, vc, true);
            mx_allgather(m, FL_DTYPE_F16, count, uc, true);
        }
        free(vc);
        if (count <= 1000) /* every root */
            for (int root = 0; root < m->size && !m->fatal; root++)
                mx_broadcast(m, FL_DTYPE_F32, count, root);
        if (!m->fatal)
            mx_rc(m, fl_comm_barrier(m->c), "barrier");
        if (!m->fatal && count > 0)
            mx_async(m, count);
    }
    return m->failures;
}

#endif /* FLEET_TESTS_COMM_MATRIX_H */
