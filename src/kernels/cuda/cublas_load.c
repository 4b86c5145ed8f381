/* cublas_load.c - opens cuBLAS with dlopen on the first device_bind and looks up the functions
 * the backend calls (cublas_load.h says why it is not linked). */
#include "cublas_load.h"

#include "fleet/status.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

cuda_cublas_api cuda_cublas;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char           why[1536]; /* empty: loaded */

#define STR_(x) #x
#define STR(x) STR_(x) /* the name after macro expansion: cublasCreate -> "cublasCreate_v2" */

static void load(void) {
    const char *name = FL_CUBLAS_LIB;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", FL_CUBLAS_DIR, FL_CUBLAS_LIB);
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            snprintf(why, sizeof why, "cannot open cuBLAS (%s, nor %s): %s", name, path,
                     e ? e : "no reason given");
            return;
        }
    }
#define CUDA_CUBLAS_SYM(f)                                                                    \
    if (!(*(void **)&cuda_cublas.f = dlsym(lib, STR(f)))) {                                   \
        snprintf(why, sizeof why, "%s has no %s", name, STR(f));                              \
        return;                                                                               \
    }
    CUDA_CUBLAS_FNS(CUDA_CUBLAS_SYM)
#undef CUDA_CUBLAS_SYM
}

int cuda_cublas_load(void) {
    pthread_once(&once, load);
    return why[0] ? fl_fail(FL_EIO, "%s", why) : FL_OK;
}
