/* gemm.c - the cuda backend's GEMM: cuBLAS Sgemm / Dgemm on row-major matrices by the usual
 * operand swap (row-major C = A B is column-major C^T = B^T A^T). TF32 is off unless
 * FLEET_CUDA_TF32=1 (device_bind sets the handle's math mode); k = 0 is C = beta C. f16 and
 * bf16 (backend.h, "Low dtypes": a, b and c low) through cublasGemmEx with f32 compute and
 * float alpha, beta: tensor cores, products exact in f32, f32 sums (device_bind forbids cuBLAS
 * reducing split-K partial sums in the 2-byte output type), c rounded once on store. */
#include "backend_private.h"
#include "cublas_load.h" /* device_bind opened cuBLAS */

#include <cublas_v2.h>
#include <limits.h>

static void check(cublasStatus_t s, const char *call) {
    if (s != CUBLAS_STATUS_SUCCESS)
        cuda_fatal("gemm", call, cuda_cublas.cublasGetStatusString(s), __FILE__, __LINE__);
}

static int as_int(int64_t v) {
    if (v < 0 || v > INT_MAX)
        cuda_fatal("gemm", "the size check", "a dimension or leading dimension is beyond int",
                   __FILE__, __LINE__);
    return (int)v;
}

void cuda_gemm(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
               void *c, int64_t ldc) {
    if (m <= 0 || n <= 0)
        return;
    cuda_require_bound("gemm");
    cuda_here();
    cublasHandle_t h = cuda_g.blas;
    if (k <= 0) { /* no product: C = beta C, row by row (C's padding columns untouched) */
        size_t es = fl_dtype_size(t);
        for (int64_t i = 0; i < m; i++) {
            void *row = (char *)c + (size_t)(i * ldc) * es;
            if (beta == 0)
                CU_CHECK("gemm", cudaMemsetAsync(row, 0, (size_t)n * es, cuda_stream()));
            else if (beta != 1)
                cuda_scale(t, n, beta, row);
        }
        return;
    }
    cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    int im = as_int(m), in = as_int(n), ik = as_int(k);
    int ilda = as_int(lda), ildb = as_int(ldb), ildc = as_int(ldc);
    if (t == FL_DTYPE_F32) {
        float al = (float)alpha, be = (float)beta;
        check(cuda_cublas.cublasSgemm(h, ob, oa, in, im, ik, &al, b, ildb, a, ilda, &be, c, ildc),
              "cublasSgemm");
    } else if (t == FL_DTYPE_F64) {
        check(cuda_cublas.cublasDgemm(h, ob, oa, in, im, ik, &alpha, b, ildb, a, ilda, &beta, c,
                                      ildc),
              "cublasDgemm");
    } else if (t == FL_DTYPE_F16 || t == FL_DTYPE_BF16) {
        cudaDataType dt = t == FL_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        float al = (float)alpha, be = (float)beta;
        check(cuda_cublas.cublasGemmEx(h, ob, oa, in, im, ik, &al, b, dt, ildb, a, dt, ilda, &be,
                                       c, dt, ildc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
    } else {
        cuda_bad_dtype("gemm", t);
    }
}
