/* backend.c - choosing a backend by name, and the answer to fl_backend_onednn() in builds
 * without oneDNN. */
#include "fleet/backend.h"
#include "fleet/status.h"

#include <string.h>

#ifndef FL_USE_ONEDNN
const fl_backend *fl_backend_onednn(void) { return NULL; }
#endif

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
                "libdnnl-dev: scripts/install-deps.sh, then rebuild); valid here: auto cpu ref");
        return NULL;
    }
    fl_fail(FL_EINVAL, "unknown backend '%s' (valid: auto cpu ref%s)", name,
            fl_backend_onednn() ? " onednn" : "");
    return NULL;
}
