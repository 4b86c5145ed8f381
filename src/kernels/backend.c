/* backend.c - choosing a backend by name, staging memory on the host, and the answers of fl_backend_onednn() and
 * fl_backend_cuda() in builds without oneDNN or CUDA. */
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

int fl_conv_desc_check(const fl_conv_desc *d, const char *who) {
    const fl_conv_geom *g = &d->g;
    if (d->dtype != FL_DTYPE_F32 && d->dtype != FL_DTYPE_F64)
        return fl_fail(FL_EINVAL, "%s: dtype %s: need f32 or f64", who,
                       fl_dtype_name(d->dtype));
    fl_conv_geom chk = *g;
    if (d->max_batch < 1 || d->oc < 1 || d->groups < 1 || g->c % d->groups ||
        d->oc % d->groups || !fl_conv_geom_out(&chk) || chk.oh != g->oh || chk.ow != g->ow)
        return fl_fail(FL_ESHAPE,
                       "%s: bad shape: batch %lld, %lld -> %lld channels in %lld groups, "
                       "%lldx%lld input, %lldx%lld window, output %lldx%lld",
                       who, (long long)d->max_batch, (long long)g->c, (long long)d->oc,
                       (long long)d->groups, (long long)g->h, (long long)g->w,
                       (long long)g->kh, (long long)g->kw, (long long)g->oh, (long long)g->ow);
    if (d->layout != FL_LAYOUT_NCHW && d->layout != FL_LAYOUT_NHWC)
        return fl_fail(FL_EINVAL, "%s: unknown layout %d", who, (int)d->layout);
    return FL_OK;
}

void *fl_backend_host_alloc(const fl_backend *be, size_t bytes) {
    if (be && be->host_alloc)
        return be->host_alloc(bytes);
    void *p = fl_alloc_aligned(bytes);
    if (!p) {
        fl_fail(FL_ENOMEM, "cannot allocate %zu bytes of host memory", bytes);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

void fl_backend_host_free(const fl_backend *be, void *p) {
    if (be && be->host_free)
        be->host_free(p);
    else
        fl_free_aligned(p);
}

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
