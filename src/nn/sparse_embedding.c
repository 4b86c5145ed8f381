/* sparse_embedding.c - the sparse embedding's forward (pool each bag's rows, EmbeddingBag) and
 * backward (the gradient of the batch's distinct rows only, never of the whole table).
 * Forward gives each thread whole samples; backward gives each thread whole rows and sums a
 * row's occurrences in the lookup's fixed order (bags ascending), so both are the same bits
 * whatever the thread count. Stamped for f32 and f64 outputs (f64: gradient checks). */
#include "fleet/sparse.h"

#include "fleet/status.h"

#include <string.h>

/* Below this many multiply-adds a pass stays on one thread (a parallel region costs a few
 * microseconds, more than a small batch's work). */
#define PAR_WORK 32768

static int check_args(const char *what, const fl_sparse_lookup *lk, const fl_sparse_rows *r,
                      fl_sparse_pool pool, fl_dtype t, int64_t *ld) {
    if (t != FL_DTYPE_F32 && t != FL_DTYPE_F64)
        return fl_fail(FL_EINVAL, "sparse embedding %s: output type %s (f32 or f64 expected)",
                       what, fl_dtype_name(t));
    if (pool != FL_SPARSE_SUM && pool != FL_SPARSE_MEAN)
        return fl_fail(FL_EINVAL, "sparse embedding %s: pooling %d is not sum or mean", what,
                       (int)pool);
    if (r->dim < 1)
        return fl_fail(FL_EINVAL, "sparse embedding %s: rows of dim %d", what, r->dim);
    if (r->n != lk->n)
        return fl_fail(FL_EINVAL, "sparse embedding %s: %lld rows for a lookup of %lld ids",
                       what, (long long)r->n, (long long)lk->n);
    if (lk->n > 0 && memcmp(r->ids, lk->ids, (size_t)lk->n * sizeof *lk->ids) != 0)
        return fl_fail(FL_EINVAL, "sparse embedding %s: the rows hold other ids than the "
                       "lookup (prepare them from this lookup)", what);
    int64_t width = (int64_t)lk->nslots * r->dim;
    if (*ld == 0)
        *ld = width;
    if (*ld < width)
        return fl_fail(FL_EINVAL, "sparse embedding %s: stride %lld is less than %d slots x %d",
                       what, (long long)*ld, lk->nslots, r->dim);
    return FL_OK;
}

#define STAMP_EMBEDDING(T, S)                                                                \
    static void forward_##S(const fl_sparse_lookup *lk, const float *rows, int dim, bool mean, \
                            T *out, int64_t ld) {                                            \
        int64_t B = lk->batch;                                                               \
        int nslots = lk->nslots;                                                             \
        _Pragma("omp parallel for schedule(static) if (lk->nocc * dim >= PAR_WORK)")          \
        for (int64_t i = 0; i < B; i++)                                                      \
            for (int j = 0; j < nslots; j++) {                                               \
                int64_t k = i * nslots + j, lo = lk->offsets[k], hi = lk->offsets[k + 1];     \
                T *y = out + i * ld + (int64_t)j * dim;                                      \
                for (int c = 0; c < dim; c++)                                                \
                    y[c] = 0;                                                                \
                for (int64_t q = lo; q < hi; q++) {                                          \
                    const float *w = rows + (int64_t)lk->index[q] * dim;                     \
                    for (int c = 0; c < dim; c++)                                            \
                        y[c] += (T)w[c];                                                     \
                }                                                                            \
                if (mean && hi - lo > 1) {                                                   \
                    T inv = (T)1 / (T)(hi - lo);                                             \
                    for (int c = 0; c < dim; c++)                                            \
                        y[c] *= inv;                                                         \
                }                                                                            \
            }                                                                                \
    }                                                                                        \
    static void backward_##S(const fl_sparse_lookup *lk, float *grads, int dim, bool mean,   \
                             const T *dout, int64_t ld) {                                    \
        int64_t n = lk->n;                                                                   \
        int nslots = lk->nslots;                                                             \
        _Pragma("omp parallel for schedule(static) if (lk->nocc * dim >= PAR_WORK)")          \
        for (int64_t r = 0; r < n; r++) {                                                    \
            T acc[64];                                                                       \
            float *g = grads + r * dim;                                                      \
            for (int c0 = 0; c0 < dim; c0 += 64) { /* dims above 64 in chunks */             \
                int cn = dim - c0 < 64 ? dim - c0 : 64;                                      \
                for (int c = 0; c < cn; c++)                                                 \
                    acc[c] = 0;                                                              \
                for (int64_t q = lk->row_start[r]; q < lk->row_start[r + 1]; q++) {          \
                    int64_t k = lk->occ_bag[q];                                              \
                    const T *dy = dout + (k / nslots) * ld + (k % nslots) * dim + c0;        \
                    if (mean) {                                                              \
                        T inv = (T)1 / (T)(lk->offsets[k + 1] - lk->offsets[k]);             \
                        for (int c = 0; c < cn; c++)                                         \
                            acc[c] += dy[c] * inv;                                           \
                    } else {                                                                 \
                        for (int c = 0; c < cn; c++)                                         \
                            acc[c] += dy[c];                                                 \
                    }                                                                        \
                }                                                                            \
                for (int c = 0; c < cn; c++)                                                 \
                    g[c0 + c] = (float)acc[c];                                               \
            }                                                                                \
        }                                                                                    \
    }
STAMP_EMBEDDING(float, f32)
STAMP_EMBEDDING(double, f64)

int fl_sparse_embedding_forward(const fl_sparse_lookup *lk, const fl_sparse_rows *r,
                                fl_sparse_pool pool, fl_dtype t, void *out, int64_t ld) {
    FL_ASSERT(lk && r);
    FL_TRY(check_args("forward", lk, r, pool, t, &ld));
    FL_ASSERT(out || lk->batch == 0);
    bool mean = pool == FL_SPARSE_MEAN;
    if (t == FL_DTYPE_F32)
        forward_f32(lk, r->rows, r->dim, mean, out, ld);
    else
        forward_f64(lk, r->rows, r->dim, mean, out, ld);
    return FL_OK;
}

int fl_sparse_embedding_backward(const fl_sparse_lookup *lk, fl_sparse_rows *r,
                                 fl_sparse_pool pool, fl_dtype t, const void *dout, int64_t ld) {
    FL_ASSERT(lk && r);
    FL_TRY(check_args("backward", lk, r, pool, t, &ld));
    FL_ASSERT(dout || lk->batch == 0);
    bool mean = pool == FL_SPARSE_MEAN;
    if (t == FL_DTYPE_F32)
        backward_f32(lk, r->grads, r->dim, mean, dout, ld);
    else
        backward_f64(lk, r->grads, r->dim, mean, dout, ld);
    return FL_OK;
}
