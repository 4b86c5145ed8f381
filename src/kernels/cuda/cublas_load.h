/* cublas_load.h - cuBLAS opened on the first device_bind, not linked: the process that loads
 * libcublas also loads libcublasLt, whose initialisers cost about 75 ms of CPU and 100 MB of
 * touched pages at every start, GPU or none (most of a CPU-only worker's start-up, paid by
 * every fleet-train and test process of a build with the cuda backend). Private to the cuda
 * backend. */
#ifndef FLEET_KERNELS_CUDA_CUBLAS_LOAD_H
#define FLEET_KERNELS_CUDA_CUBLAS_LOAD_H

#include <cublas_v2.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLAS functions the backend calls (cublasGemmEx: the f16 / bf16 gemm). A field has the
 * name the function has after cublas_v2.h's macros (cublasCreate is cublasCreate_v2), so that
 * cuda_cublas.cublasCreate(...) reads as the call it is. C only: in C++ cublas_api.h overloads
 * cublasGemmEx, and __typeof__ of an overload set does not compile. */
#define CUDA_CUBLAS_FNS(X)                                                                    \
    X(cublasCreate) X(cublasDestroy) X(cublasSetStream) X(cublasSetMathMode)                  \
    X(cublasSetWorkspace) X(cublasGetStatusString) X(cublasSgemm) X(cublasDgemm)          \
    X(cublasGemmEx)
typedef struct cuda_cublas_api {
#define CUDA_CUBLAS_FIELD(f) __typeof__(f) *f;
    CUDA_CUBLAS_FNS(CUDA_CUBLAS_FIELD)
#undef CUDA_CUBLAS_FIELD
} cuda_cublas_api;
extern cuda_cublas_api cuda_cublas;

/* Opens cuBLAS (FL_CUBLAS_LIB, the soname found at configure time, from the loader's path, else
 * from FL_CUBLAS_DIR) and fills cuda_cublas, once per process; thread-safe. FL_OK; FL_EIO naming
 * the library and the loader's reason (or the missing function) if it cannot, and every later
 * call says the same. */
int cuda_cublas_load(void);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_KERNELS_CUDA_CUBLAS_LOAD_H */
