/* gemm.c - matrix multiply of the CPU table: OpenBLAS cblas_sgemm / cblas_dgemm, row-major.
 * Empty sizes and alpha = 0 are handled here (BLAS rejects an empty matrix's leading
 * dimension), and small products run on one thread: splitting them costs more than it gains. */
#include "cpu_impl.h"

#include <cblas.h>
#include <limits.h>
#include <omp.h>
#include <string.h>

/* Below this many multiply-adds (m n k), gemm runs single-threaded. OpenBLAS splits anything
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
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    /* OpenBLAS (OpenMP build) takes its thread count from omp_get_max_threads() per call */
    int threads = omp_get_max_threads();
    bool serial = threads > 1 && (double)m * (double)n * (double)k < (double)GEMM_PAR_MIN;
    if (serial)
        omp_set_num_threads(1);
    if (t == FL_DTYPE_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, (float)alpha, a,
                    (blasint)lda, b, (blasint)ldb, (float)beta, c, (blasint)ldc);
    else if (t == FL_DTYPE_F64)
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                    (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    else
        FL_ASSERT(!"gemm dtype must be f32 or f64");
    if (serial)
        omp_set_num_threads(threads);
}
