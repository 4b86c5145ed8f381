/* reduce.c - sum and sum of squares of the CPU table, deterministic under any thread count:
 * CHUNK-element chunks are each summed in double by the same vector loop wherever they run, and
 * the chunk sums are added serially in order (GROUP of them at a time, on the stack). */
#include "backend_private.h"

#define GROUP 256 /* chunks per group: 1M elements */

#define STAMP_REDUCE(T, S)                                                                  \
    static double sum_chunk_##S(const T *x, int64_t n) {                                    \
        double s = 0;                                                                       \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) s += x[i];     \
        return s;                                                                           \
    }                                                                                       \
    static double sumsq_chunk_##S(const T *x, int64_t n) {                                  \
        double s = 0;                                                                       \
        _Pragma("omp simd reduction(+ : s)") for (int64_t i = 0; i < n; i++) {              \
            double v = x[i];                                                                \
            s += v * v;                                                                     \
        }                                                                                   \
        return s;                                                                           \
    }                                                                                       \
    static double reduce_##S(const T *x, int64_t n, double (*chunk)(const T *, int64_t)) {  \
        double total = 0, part[GROUP];                                                      \
        if (n < PAR_MIN) { /* same chunks, same order, no parallel region */                \
            for (int64_t off = 0; off < n; off += CHUNK)                                    \
                total += chunk(x + off, n - off < CHUNK ? n - off : CHUNK);                 \
            return total;                                                                   \
        }                                                                                   \
        for (int64_t g0 = 0; g0 < n; g0 += (int64_t)GROUP * CHUNK) {                        \
            int64_t left = n - g0;                                                          \
            int64_t nchunks = (left + CHUNK - 1) / CHUNK;                                   \
            if (nchunks > GROUP)                                                            \
                nchunks = GROUP;                                                            \
            _Pragma("omp parallel for schedule(static)")                                    \
            for (int64_t c = 0; c < nchunks; c++) {                                         \
                int64_t off = c * CHUNK;                                                    \
                int64_t len = left - off < CHUNK ? left - off : CHUNK;                      \
                part[c] = chunk(x + g0 + off, len);                                         \
            }                                                                               \
            for (int64_t c = 0; c < nchunks; c++)                                           \
                total += part[c];                                                           \
        }                                                                                   \
        return total;                                                                       \
    }                                                                                       \
    static double sum_##S(const T *x, int64_t n) { return reduce_##S(x, n, sum_chunk_##S); } \
    static double sumsq_##S(const T *x, int64_t n) { return reduce_##S(x, n, sumsq_chunk_##S); }
STAMP_REDUCE(float, f32)
STAMP_REDUCE(double, f64)

double cpu_sum(fl_dtype t, const void *x, int64_t n) { DISPATCH_RET(t, sum, x, n); }

double cpu_sumsq(fl_dtype t, const void *x, int64_t n) { DISPATCH_RET(t, sumsq, x, n); }
