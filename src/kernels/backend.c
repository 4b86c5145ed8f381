/* backend.c - staging memory on the host for a backend (fl_backend_host_alloc / _free): the
 * backend's pinned host_alloc where it has one, else aligned zeroed memory. Choosing a backend
 * by name is registry.c's; window geometry is conv_geom.c's. */
#include "fleet/backend.h"
#include "fleet/status.h"

#include <string.h>

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
