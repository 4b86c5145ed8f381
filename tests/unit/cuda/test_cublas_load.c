/* test_cublas_load.c - the cuda backend opens cuBLAS itself (src/kernels/cuda/cublas_load.c):
 * a process that links fleet has no libcublas (nor libcublasLt) mapped until cuda_cublas_load,
 * which then finds every function the backend calls, answers the same way a second time, and
 * whose cublasGetStatusString is cuBLAS's own. Needs no GPU. Built only with CUDA. */
#include "fleet/status.h"
#include "kernels/cuda/cublas_load.h"
#include "test.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static bool mapped(const char *lib) { /* lib in this process's /proc/self/maps */
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f != NULL);
    if (!f)
        return false;
    char line[4096];
    bool seen = false;
    while (fgets(line, sizeof line, f))
        seen = seen || strstr(line, lib) != NULL;
    fclose(f);
    return seen;
}

int main(void) {
    CHECK(!mapped("libcublas")); /* neither libcublas nor libcublasLt: nothing linked them */
    CHECK_OK(cuda_cublas_load());
    CHECK(mapped("libcublas.so") && mapped("libcublasLt.so"));
#define NOT_NULL(f) CHECK(cuda_cublas.f != NULL);
    CUDA_CUBLAS_FNS(NOT_NULL)
#undef NOT_NULL
    CHECK_OK(cuda_cublas_load()); /* once per process; the second call answers the same */
    const char *s = cuda_cublas.cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED);
    printf("cuBLAS says: %s\n", s ? s : "(null)");
    CHECK(s != NULL && strstr(s, "not initialized") != NULL);
    if (test_failures)
        fprintf(stderr, "test_cublas_load: %d failure(s)\n", test_failures);
    return test_failures ? 1 : 0;
}
