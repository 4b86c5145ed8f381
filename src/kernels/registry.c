/* registry.c - the backends by name (fl_backend_by_name) and the answers of fl_backend_onednn()
 * and fl_backend_cuda() in builds without oneDNN or CUDA. It sits above the backends: the one
 * file that names them all, and the only one in src/kernels outside a backend's folder that
 * knows FL_USE_ONEDNN / FL_USE_CUDA (STYLE.md). */
#include "fleet/backend.h"
#include "fleet/status.h"

#include <stdio.h>
#include <string.h>

#ifndef FL_USE_ONEDNN
const fl_backend *fl_backend_onednn(void) { return NULL; }
#endif
#ifndef FL_USE_CUDA
const fl_backend *fl_backend_cuda(void) { return NULL; }
#endif

/* " onednn cuda" as built, for the lists of valid names */
static const char *optional_names(void) {
    static char buf[32];
    snprintf(buf, sizeof buf, "%s%s", fl_backend_onednn() ? " onednn" : "",
             fl_backend_cuda() ? " cuda" : "");
    return buf;
}

const fl_backend *fl_backend_by_name(const char *name) {
    if (!name || !strcmp(name, "auto")) {
        const fl_backend *be = fl_backend_onednn();
        return be ? be : fl_backend_cpu();
    }
    if (!strcmp(name, "cpu"))
        return fl_backend_cpu();
    if (!strcmp(name, "ref"))
        return fl_backend_ref();
    if (!strcmp(name, "onednn")) {
        if (fl_backend_onednn())
            return fl_backend_onednn();
        fl_fail(FL_EINVAL, "backend 'onednn': this fleet was built without oneDNN (install "
                "libdnnl-dev: scripts/install-deps.sh, then rebuild); valid here: auto cpu ref%s",
                optional_names());
        return NULL;
    }
    if (!strcmp(name, "cuda")) {
        if (fl_backend_cuda())
            return fl_backend_cuda();
        fl_fail(FL_EINVAL, "backend 'cuda': this fleet was built without CUDA (nvcc, cuBLAS and "
                "cuDNN were not found at configure time); valid here: auto cpu ref%s",
                optional_names());
        return NULL;
    }
    fl_fail(FL_EINVAL, "unknown backend '%s' (valid: auto cpu ref%s)", name, optional_names());
    return NULL;
}
