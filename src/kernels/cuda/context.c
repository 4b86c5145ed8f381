/* context.c - the cuda backend's one device context (cuda_g: the bound device, its stream and
 * library handles, which device_bind in cuda.c fills) and what every op file uses with it: the
 * per-thread current device, the stream's wait, and the fatal-error path of device failures.
 * Apart from cuda.c so that the allocator (alloc.c) and the table (cuda.c) both use it
 * without calling into each other. */
#include "backend_private.h"

#include <stdio.h>
#include <stdlib.h>

cuda_ctx cuda_g;

void cuda_fatal(const char *op, const char *call, const char *what, const char *file, int line) {
    fprintf(stderr, "fleet: cuda backend: %s: %s failed: %s (%s:%d)\n", op, call, what, file,
            line);
    fflush(stderr);
    abort();
}

void cuda_require_bound(const char *op) {
    if (!cuda_g.bound)
        cuda_fatal(op, "the op", "called before device_bind (bind a GPU first)", __FILE__,
                   __LINE__);
}

void cuda_bad_dtype(const char *op, fl_dtype t) {
    char what[96];
    snprintf(what, sizeof what, "dtype %d (%s) is not one this op takes", (int)t,
             fl_dtype_name(t));
    cuda_fatal(op, "the dtype check", what, __FILE__, __LINE__);
}

void cuda_sync(const char *op) { CU_CHECK(op, cudaStreamSynchronize(cuda_stream())); }

__thread int cuda_tl_device = -1;

void cuda_enter(void) {
    if (!cuda_g.bound)
        cuda_fatal("an op", "the device check", "called before device_bind (bind a GPU first)",
                   __FILE__, __LINE__);
    CU_CHECK("making the bound device this thread's", cudaSetDevice(cuda_g.device));
    cuda_tl_device = cuda_g.device;
}
