/* softmax.c - fused softmax cross-entropy of the CPU table: per row, max-shifted exp, sum in
 * double, loss = logsumexp - logit[label] (huge logits never overflow); row losses are added in
 * row order whatever the thread count. probs may alias logits, dlogits may alias probs. */
#include "backend_private.h"

#include <math.h>

#define GROUP_ROWS 1024

#define STAMP_XENT(T, S, EXP)                                                                 \
    static double xent_row_##S(const T *x, int32_t label, T *p, int64_t classes) {            \
        T mx = x[0];                                                                          \
        for (int64_t j = 1; j < classes; j++)                                                 \
            mx = x[j] > mx ? x[j] : mx;                                                       \
        T xl = x[label];                                                                      \
        double s = 0;                                                                         \
        for (int64_t j = 0; j < classes; j++) {                                               \
            T e = EXP(x[j] - mx);                                                             \
            p[j] = e;                                                                         \
            s += e;                                                                           \
        }                                                                                     \
        T inv = (T)(1.0 / s);                                                                 \
        _Pragma("omp simd") for (int64_t j = 0; j < classes; j++) p[j] *= inv;                \
        return log(s) + (double)mx - (double)xl;                                              \
    }                                                                                         \
    static double xent_forward_##S(const T *x, const int32_t *labels, T *p, int64_t rows,     \
                                   int64_t classes) {                                         \
        double total = 0;                                                                     \
        if (rows * classes < PAR_MIN) {                                                       \
            for (int64_t r = 0; r < rows; r++)                                                \
                total += xent_row_##S(x + r * classes, labels[r], p + r * classes, classes);  \
            return total;                                                                     \
        }                                                                                     \
        double loss[GROUP_ROWS];                                                              \
        for (int64_t r0 = 0; r0 < rows; r0 += GROUP_ROWS) {                                   \
            int64_t nr = rows - r0 < GROUP_ROWS ? rows - r0 : GROUP_ROWS;                     \
            _Pragma("omp parallel for schedule(static)")                                      \
            for (int64_t i = 0; i < nr; i++) {                                                \
                int64_t r = r0 + i;                                                           \
                loss[i] = xent_row_##S(x + r * classes, labels[r], p + r * classes, classes); \
            }                                                                                 \
            for (int64_t i = 0; i < nr; i++)                                                  \
                total += loss[i];                                                             \
        }                                                                                     \
        return total;                                                                         \
    }                                                                                         \
    static inline void xent_backward_row_##S(const T *p, int32_t label, T *d, int64_t classes, \
                                             T scale) {                                       \
        T pl = p[label];                                                                      \
        _Pragma("omp simd") for (int64_t j = 0; j < classes; j++) d[j] = scale * p[j];        \
        d[label] = scale * (pl - 1);                                                          \
    }                                                                                         \
    static void xent_backward_##S(const T *p, const int32_t *labels, T *d, int64_t rows,      \
                                  int64_t classes, T scale) {                                 \
        if (rows * classes < PAR_MIN) {                                                       \
            for (int64_t r = 0; r < rows; r++)                                                \
                xent_backward_row_##S(p + r * classes, labels[r], d + r * classes, classes,   \
                                      scale);                                                 \
        } else {                                                                              \
            _Pragma("omp parallel for schedule(static)")                                      \
            for (int64_t r = 0; r < rows; r++)                                                \
                xent_backward_row_##S(p + r * classes, labels[r], d + r * classes, classes,   \
                                      scale);                                                 \
        }                                                                                     \
    }
STAMP_XENT(float, f32, expf)
STAMP_XENT(double, f64, exp)

static void check_labels(const int32_t *labels, int64_t rows, int64_t classes) {
    FL_ASSERT(rows == 0 || classes > 0);
    for (int64_t r = 0; r < rows; r++)
        FL_ASSERT(labels[r] >= 0 && labels[r] < classes);
}

double cpu_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                void *probs, int64_t rows, int64_t classes) {
    check_labels(labels, rows, classes);
    DISPATCH_RET(t, xent_forward, logits, labels, probs, rows, classes);
}

void cpu_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                               void *dlogits, int64_t rows, int64_t classes, double scale) {
    check_labels(labels, rows, classes);
    DISPATCH(t, xent_backward, probs, labels, dlogits, rows, classes, scale);
}
