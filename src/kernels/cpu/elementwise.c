/* elementwise.c - bias, column sums, axpy, scale and optimizer updates of the CPU table.
 * Each loop is vectorised with `omp simd` and split over threads only above PAR_MIN elements;
 * none of them reduces across elements except sum_rows, whose columns are independent. Also
 * mixed precision's f16/bf16 rounding. */
#include "backend_private.h"

#include <math.h>
#include <string.h>

/* --- y (ROWS, COLS) += bias (COLS) --- */
#define STAMP_ADD_BIAS(T, S)                                                              \
    static inline void add_bias_row_##S(T *restrict y, const T *restrict b, int64_t cols) { \
        _Pragma("omp simd") for (int64_t j = 0; j < cols; j++) y[j] += b[j];              \
    }                                                                                     \
    static void add_bias_##S(T *y, const T *b, int64_t rows, int64_t cols) {              \
        if (rows * cols < PAR_MIN) {                                                      \
            for (int64_t r = 0; r < rows; r++)                                            \
                add_bias_row_##S(y + r * cols, b, cols);                                  \
        } else {                                                                          \
            _Pragma("omp parallel for schedule(static)")                                  \
            for (int64_t r = 0; r < rows; r++)                                            \
                add_bias_row_##S(y + r * cols, b, cols);                                  \
        }                                                                                 \
    }
STAMP_ADD_BIAS(float, f32)
STAMP_ADD_BIAS(double, f64)

void cpu_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    DISPATCH(t, add_bias, y, bias, rows, cols);
}

/* --- db (COLS) = [db +] sum over rows of dy (ROWS, COLS) ---
 * Rows are added in order into db itself (no scratch); threads split the columns into blocks
 * of SUM_COLS_BLOCK, so every column is summed in the same order whatever the thread count. */
#define SUM_COLS_BLOCK 256
#define STAMP_SUM_ROWS(T, S)                                                                 \
    static inline void sum_rows_block_##S(const T *restrict dy, T *restrict db, int64_t rows, \
                                          int64_t cols, int64_t j0, int64_t j1,              \
                                          bool accumulate) {                                 \
        if (!accumulate)                                                                     \
            memset(db + j0, 0, (size_t)(j1 - j0) * sizeof(T));                               \
        for (int64_t r = 0; r < rows; r++) {                                                 \
            const T *row = dy + r * cols;                                                    \
            _Pragma("omp simd") for (int64_t j = j0; j < j1; j++) db[j] += row[j];           \
        }                                                                                    \
    }                                                                                        \
    static void sum_rows_##S(const T *dy, T *db, int64_t rows, int64_t cols, bool accumulate) { \
        int64_t nblocks = (cols + SUM_COLS_BLOCK - 1) / SUM_COLS_BLOCK;                      \
        if (rows * cols < PAR_MIN || nblocks < 2) {                                          \
            sum_rows_block_##S(dy, db, rows, cols, 0, cols, accumulate);                     \
            return;                                                                          \
        }                                                                                    \
        _Pragma("omp parallel for schedule(static)")                                         \
        for (int64_t blk = 0; blk < nblocks; blk++) {                                        \
            int64_t j0 = blk * SUM_COLS_BLOCK;                                               \
            int64_t j1 = j0 + SUM_COLS_BLOCK < cols ? j0 + SUM_COLS_BLOCK : cols;            \
            sum_rows_block_##S(dy, db, rows, cols, j0, j1, accumulate);                      \
        }                                                                                    \
    }
STAMP_SUM_ROWS(float, f32)
STAMP_SUM_ROWS(double, f64)

void cpu_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                  bool accumulate) {
    DISPATCH(t, sum_rows, dy, db, rows, cols, accumulate);
}

/* --- y += a * x;  x *= a --- */
#define STAMP_AXPY_SCALE(T, S)                                                   \
    static void axpy_##S(int64_t n, T a, const T *restrict x, T *restrict y) {   \
        ELEMENTWISE(n, i, y[i] += a * x[i]);                                     \
    }                                                                            \
    static void scale_##S(int64_t n, T a, T *x) { ELEMENTWISE(n, i, x[i] *= a); }
STAMP_AXPY_SCALE(float, f32)
STAMP_AXPY_SCALE(double, f64)

void cpu_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    DISPATCH(t, axpy, n, a, x, y);
}

void cpu_scale(fl_dtype t, int64_t n, double a, void *x) { DISPATCH(t, scale, n, a, x); }

/* --- optimizer updates (formulas in kernels.h) --- */
#define STAMP_UPDATES(T, S)                                                                  \
    static void sgd_##S(int64_t n, T *restrict w, const T *restrict g, T lr, T wd) {         \
        ELEMENTWISE(n, i, w[i] -= lr * (g[i] + wd * w[i]));                                  \
    }                                                                                        \
    static void momentum_##S(int64_t n, T *restrict w, const T *restrict g, T *restrict v,   \
                             T lr, T mu, T wd, bool nesterov) {                              \
        if (nesterov)                                                                        \
            ELEMENTWISE(n, i, T d = g[i] + wd * w[i]; T vi = mu * v[i] + d; v[i] = vi;       \
                        w[i] -= lr * (d + mu * vi));                                         \
        else                                                                                 \
            ELEMENTWISE(n, i, T d = g[i] + wd * w[i]; T vi = mu * v[i] + d; v[i] = vi;       \
                        w[i] -= lr * vi);                                                    \
    }
STAMP_UPDATES(float, f32)
STAMP_UPDATES(double, f64)

void cpu_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd) {
    DISPATCH(t, sgd, n, w, g, lr, wd);
}

void cpu_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                         double mu, double wd, bool nesterov) {
    DISPATCH(t, momentum, n, w, g, v, lr, mu, wd, nesterov);
}

/* --- x = (float)(low)x: f16 / bf16 rounding in f32 bits (mixed precision's emulation) ---
 * Round to nearest even by adding half an ulp of the target (minus one, plus the kept lowest
 * bit) and clearing the dropped bits; the carry moves into the exponent where it must. f16's
 * subnormals (|x| < 2^-14, spacing 2^-24) are rounded by adding and taking away 0.5, whose
 * f32 ulp is 2^-24 (exact under the default rounding mode; the build uses no -ffast-math). The
 * reference (ref.c) converts with fl_f32_to_f16 and back; tests compare the two bit for bit. */
static inline float amp_round_f16(float x) {
    uint32_t u, a;
    memcpy(&u, &x, sizeof u);
    a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf and NaN stay */
        return x;
    if (a < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        float t = fabsf(x) + 0.5f;
        return copysignf(t - 0.5f, x);
    }
    a += 0x0fffu + ((a >> 13) & 1u);
    a &= ~0x1fffu;
    if (a > 0x477fe000u) /* above 65504, f16's largest: inf */
        a = 0x7f800000u;
    u = (u & 0x80000000u) | a;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float amp_round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return x;
    u += 0x7fffu + ((u >> 16) & 1u); /* near FLT_MAX this carries into inf, as bf16 does */
    u &= 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

void cpu_amp_round(fl_dtype low, int64_t n, float *x) {
    FL_ASSERT(low == FL_DTYPE_F16 || low == FL_DTYPE_BF16);
    if (low == FL_DTYPE_F16)
        ELEMENTWISE(n, i, x[i] = amp_round_f16(x[i]));
    else
        ELEMENTWISE(n, i, x[i] = amp_round_bf16(x[i]));
}
