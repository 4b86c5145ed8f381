/* random.c - the seed document's gen_data as a dataset: features uniform in [0, 1), labels
 * uniform in [0, classes). Sample i is drawn from Philox stream i of the seed, so any sample
 * can be made on any rank in any order and comes out the same. */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <stdlib.h>

typedef struct {
    uint64_t seed;
    int64_t  features;
    int      classes;
} random_impl;

static int random_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    const random_impl *p = ds->impl;
    fl_rng r;
    fl_rng_init(&r, p->seed, (uint64_t)index);
    for (int64_t j = 0; j < p->features; j++)
        x[j] = fl_rng_uniform(&r);
    *label = (int32_t)fl_rng_below(&r, (uint64_t)p->classes);
    return FL_OK;
}

static void random_destroy(fl_dataset *ds) { free(ds->impl); }

static const fl_dataset_ops random_ops = {
    .name = "random",
    .get = random_get,
    .destroy = random_destroy,
};

fl_dataset *fl_dataset_random_create(int64_t size, int64_t features, int classes, uint64_t seed) {
    fl_dataset *ds = NULL;
    random_impl *p = NULL;
    if (size < 0) {
        fl_fail(FL_EINVAL, "dataset 'random': size %lld is negative", (long long)size);
        goto fail;
    }
    if (features < 1) {
        fl_fail(FL_EINVAL, "dataset 'random': features must be >= 1 (got %lld)",
                (long long)features);
        goto fail;
    }
    if (classes < 2) {
        fl_fail(FL_EINVAL, "dataset 'random': classes must be >= 2 (got %d)", classes);
        goto fail;
    }
    ds = calloc(1, sizeof *ds);
    p = malloc(sizeof *p);
    if (!ds || !p) {
        fl_fail(FL_ENOMEM, "dataset 'random': out of memory");
        goto fail;
    }
    *p = (random_impl){.seed = seed, .features = features, .classes = classes};
    ds->ops = &random_ops;
    ds->size = size;
    ds->ndim = 1;
    ds->shape[0] = features;
    ds->sample_numel = features;
    ds->num_classes = classes;
    ds->impl = p;
    return ds;

fail:
    free(p);
    free(ds);
    return NULL;
}
