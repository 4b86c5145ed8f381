/* dataset.c - what every dataset shares: freeing through its ops table and the bounds-checked
 * get. A dataset is random access by index (PyTorch's map-style Dataset), so the loader can
 * shard and shuffle without knowing how samples are made. */
#include "fleet/data.h"

#include "fleet/status.h"

#include <stdlib.h>

void fl_dataset_free(fl_dataset *ds) {
    if (!ds)
        return;
    if (ds->ops && ds->ops->destroy)
        ds->ops->destroy(ds);
    free(ds);
}

int fl_dataset_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    FL_ASSERT(ds && ds->ops && ds->ops->get && x && label);
    if (index < 0 || index >= ds->size)
        return fl_fail(FL_EINVAL, "dataset '%s': index %lld outside [0, %lld)", ds->ops->name,
                       (long long)index, (long long)ds->size);
    return ds->ops->get(ds, index, x, label);
}

int fl_dataset_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x, int32_t *label) {
    FL_ASSERT(ds && ds->ops && (ds->ops->get_ex || ds->ops->get) && x && label);
    if (index < 0 || index >= ds->size)
        return fl_fail(FL_EINVAL, "dataset '%s': index %lld outside [0, %lld)", ds->ops->name,
                       (long long)index, (long long)ds->size);
    if (epoch < 0)
        return fl_fail(FL_EINVAL, "dataset '%s': epoch %lld is negative", ds->ops->name,
                       (long long)epoch);
    if (ds->ops->get_ex)
        return ds->ops->get_ex(ds, index, epoch, x, label);
    return ds->ops->get(ds, index, x, label);
}
