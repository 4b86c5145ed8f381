/* gemm.c - matrix multiply of the CPU table: OpenBLAS cblas_sgemm / cblas_dgemm, row-major, in
 * blocks fixed by the shape, one single-threaded call each, so that results do not depend on
 * the thread count. Empty sizes and alpha = 0 are handled here (BLAS rejects an empty matrix's
 * leading dimension), and small products are one block: splitting them costs more than it
 * gains. */
#include "backend_private.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

/* Below this many multiply-adds (m n k), gemm is one single-threaded block. OpenBLAS splits anything
 * above 256K; measured here with 2 threads, (128, 128) x (128, 128) ran 1x-3.5x slower split,
 * (128, 256) x (256, 256) 1.4x faster. */
#define GEMM_PAR_MIN (1L << 22)

/* C (M, N) = beta * C, with beta = 0 writing zeros (so NaN in C does not survive, as in BLAS). */
#define STAMP_SCALE_C(T, S)                                                           \
    static void scale_c_##S(int64_t m, int64_t n, T beta, T *c, int64_t ldc) {        \
        for (int64_t i = 0; i < m; i++) {                                            \
            T *row = c + i * ldc;                                                     \
            if (beta == 0)                                                            \
                memset(row, 0, (size_t)n * sizeof(T));                                \
            else if (beta != 1)                                                       \
                for (int64_t j = 0; j < n; j++)                                       \
                    row[j] *= beta;                                                   \
        }                                                                             \
    }
STAMP_SCALE_C(float, f32)
STAMP_SCALE_C(double, f64)

/* The most blocks a product is cut into, and the fewest rows (columns) a block has. */
#define GEMM_BLOCKS 8
#define GEMM_BLOCK_MIN 128

/* One single-threaded OpenBLAS call (the caller has set the thread count to 1). */
static void gemm_block(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    if (t == FL_DTYPE_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)alpha, a,
                    (blasint)lda, b, (blasint)ldb, (float)beta, c, (blasint)ldc);
    else if (t == FL_DTYPE_F64)
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                    (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    else
        FL_ASSERT(!"gemm dtype must be f32 or f64");
}

void cpu_gemm(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
              void *c, int64_t ldc) {
    FL_ASSERT(m >= 0 && n >= 0 && k >= 0);
    FL_ASSERT(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX);
    if (m == 0 || n == 0)
        return;
    FL_ASSERT(ldc >= n);
    if (k == 0 || alpha == 0) {
        DISPATCH(t, scale_c, m, n, beta, c, ldc);
        return;
    }
    FL_ASSERT(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n));
    FL_ASSERT(lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    /* The product is cut into at most GEMM_BLOCKS blocks of rows (or of columns, whichever is
     * longer) by its shape alone, and each block is one single-threaded OpenBLAS call; the
     * blocks run on the OpenMP threads. OpenBLAS's own threading changes some results with the
     * thread count (its kernel choice and split follow it: ResNet-50's fc, 8 x 1000 x 2048,
     * differs between 1 and 2 threads), this does not: every element is computed by the same
     * call whatever the thread count. Small products are one block. */
    bool rows = m >= n;
    int64_t len = rows ? m : n;
    int nb = (double)m * (double)n * (double)k < (double)GEMM_PAR_MIN ? 1
             : len / GEMM_BLOCK_MIN < GEMM_BLOCKS ? (int)(len / GEMM_BLOCK_MIN)
                                                  : GEMM_BLOCKS;
    nb = nb < 1 ? 1 : nb;
    int threads = omp_get_max_threads();
    bool nested = omp_in_parallel();
    if (!nested)
        omp_set_num_threads(1); /* each OpenBLAS call on one thread; our loop below splits */
    size_t es = fl_dtype_size(t);
#pragma omp parallel for schedule(static) num_threads(threads) if (nb > 1 && !nested)
    for (int i = 0; i < nb; i++) {
        int64_t lo = len * i / nb, hi = len * (i + 1) / nb;
        if (rows) /* C[lo:hi, :] = op(A)[lo:hi, :] op(B) */
            gemm_block(t, trans_a, trans_b, hi - lo, n, k, alpha,
                       (const char *)a + (size_t)(trans_a ? lo : lo * lda) * es, lda, b, ldb,
                       beta, (char *)c + (size_t)(lo * ldc) * es, ldc);
        else /* C[:, lo:hi] = op(A) op(B)[:, lo:hi] */
            gemm_block(t, trans_a, trans_b, m, hi - lo, k, alpha, a, lda,
                       (const char *)b + (size_t)(trans_b ? lo * ldb : lo) * es, ldb, beta,
                       (char *)c + (size_t)lo * es, ldc);
    }
    if (!nested)
        omp_set_num_threads(threads);
}
