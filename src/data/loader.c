/* loader.c - the sharded batch loader. Each epoch's order is one permutation from (seed, epoch),
 * the same on every rank; it is cut into global batches of world * B and rank r takes the r-th
 * slice of each (PyTorch's DistributedSampler shards contiguously instead; slicing per global
 * batch is what makes one step's union over ranks equal the single-worker batch of world * B). */
#include "fleet/data.h"

#include "data/loader_impl.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <stdlib.h>

struct fl_loader {
    fl_dataset      *ds; /* borrowed */
    fl_loader_config cfg;
    int64_t          steps_per_epoch;
    int64_t         *perm;     /* (SIZE) order of the current epoch */
    int64_t          epoch;    /* epoch whose permutation is in perm; -1 before the first seek */
    int64_t          step;     /* next batch to return */
    fl_tensor       *xbuf;     /* (B, sample shape...) */
    int32_t         *labels;   /* (B) */
    fl_tensor        x;        /* view of xbuf with shape[0] = this batch's count */
    int64_t          skipped;  /* samples left out (FL_DATASET_SKIP) since creation */
};

int fl_loader_check_config(const fl_dataset *ds, const fl_loader_config *cfg) {
    if (cfg->batch_size < 1)
        return fl_fail(FL_EINVAL, "loader: batch_size must be >= 1 (got %lld)",
                       (long long)cfg->batch_size);
    if (cfg->world < 1)
        return fl_fail(FL_EINVAL, "loader: world must be >= 1 (got %d)", cfg->world);
    if (cfg->rank < 0 || cfg->rank >= cfg->world)
        return fl_fail(FL_EINVAL, "loader: rank %d outside [0, %d)", cfg->rank, cfg->world);
    if (cfg->batch_size > INT64_MAX / 2 / cfg->world)
        return fl_fail(FL_EINVAL, "loader: global batch %d x %lld is too large", cfg->world,
                       (long long)cfg->batch_size);
    if (ds->ndim + 1 > FL_MAX_DIMS)
        return fl_fail(FL_EINVAL, "loader: dataset '%s' samples have %d dimensions (at most %d)",
                       ds->ops->name, ds->ndim, FL_MAX_DIMS - 1);
    int64_t global = (int64_t)cfg->world * cfg->batch_size;
    if (cfg->drop_last && ds->size < global)
        return fl_fail(FL_EINVAL,
                       "dataset '%s' has %lld samples, fewer than one global batch of %d x %lld "
                       "(drop_last would leave no steps)",
                       ds->ops->name, (long long)ds->size, cfg->world,
                       (long long)cfg->batch_size);
    return FL_OK;
}

fl_loader *fl_loader_create(fl_dataset *ds, const fl_loader_config *cfg) {
    FL_ASSERT(ds && cfg);
    fl_loader *l = NULL;
    if (fl_loader_check_config(ds, cfg) < 0)
        goto fail;
    l = calloc(1, sizeof *l);
    if (!l) {
        fl_fail(FL_ENOMEM, "loader: out of memory");
        goto fail;
    }
    l->ds = ds;
    l->cfg = *cfg;
    l->steps_per_epoch = fl_loader_count_steps(ds->size, cfg);
    l->perm = malloc((size_t)(ds->size ? ds->size : 1) * sizeof *l->perm);
    l->labels = malloc((size_t)cfg->batch_size * sizeof *l->labels);
    if (!l->perm || !l->labels) {
        fl_fail(FL_ENOMEM, "loader: cannot allocate the order of %lld samples",
                (long long)ds->size);
        goto fail;
    }
    int64_t shape[FL_MAX_DIMS];
    shape[0] = cfg->batch_size;
    for (int i = 0; i < ds->ndim; i++)
        shape[i + 1] = ds->shape[i];
    l->xbuf = fl_tensor_create(FL_DTYPE_F32, ds->ndim + 1, shape);
    if (!l->xbuf) {
        fl_fail_prefix(FL_ENOMEM, "loader: batch buffer");
        goto fail;
    }
    for (int64_t i = 0; i < ds->size; i++)
        l->perm[i] = i;
    l->epoch = -1;
    if (fl_loader_seek(l, 0, 0) < 0)
        goto fail;
    return l;

fail:
    fl_loader_free(l);
    return NULL;
}

void fl_loader_free(fl_loader *l) {
    if (!l)
        return;
    free(l->perm);
    free(l->labels);
    fl_tensor_free(l->xbuf);
    free(l);
}

int64_t fl_loader_steps_per_epoch(const fl_loader *l) { return l->steps_per_epoch; }

int fl_loader_seek(fl_loader *l, int64_t epoch, int64_t step) {
    FL_ASSERT(l);
    if (epoch < 0 || (uint64_t)epoch >= ((uint64_t)1 << 48))
        return fl_fail(FL_EINVAL, "loader: epoch %lld outside [0, 2^48)", (long long)epoch);
    if (step < 0 || step > l->steps_per_epoch)
        return fl_fail(FL_EINVAL, "loader: step %lld outside [0, %lld] (steps per epoch)",
                       (long long)step, (long long)l->steps_per_epoch);
    if (l->cfg.shuffle && epoch != l->epoch)
        fl_loader_epoch_order(l->perm, l->ds->size, &l->cfg, epoch);
    l->epoch = epoch;
    l->step = step;
    return FL_OK;
}

int fl_loader_next(fl_loader *l, const fl_tensor **x, const int32_t **labels) {
    FL_ASSERT(l && x && labels);
    if (l->step >= l->steps_per_epoch)
        return 0;
    int64_t lo, hi;
    fl_loader_slice(&l->cfg, l->ds->size, l->step, &lo, &hi);
    int64_t numel = l->ds->sample_numel, n = 0;
    float *xdata = l->xbuf->data;
    for (int64_t i = lo; i < hi; i++) {
        int64_t idx = l->perm[i];
        int rc = fl_dataset_get_ex(l->ds, idx, l->epoch, xdata + n * numel, &l->labels[n]);
        if (rc < 0)
            return fl_fail_prefix(rc, "loader: epoch %lld step %lld sample %lld",
                                  (long long)l->epoch, (long long)l->step, (long long)idx);
        if (rc == FL_DATASET_SKIP)
            l->skipped++;
        else
            n++;
    }
    l->x = *l->xbuf;
    l->x.owns_data = false;
    l->x.shape[0] = n;
    l->x.numel = n * numel;
    l->step++;
    *x = &l->x;
    *labels = l->labels;
    return 1;
}

int64_t fl_loader_skipped(const fl_loader *l) { return l->skipped; }

int64_t fl_loader_count_steps(int64_t size, const fl_loader_config *cfg) {
    int64_t global = (int64_t)cfg->world * cfg->batch_size;
    return cfg->drop_last ? size / global : (size + global - 1) / global;
}

/* The shuffle stream of epoch e is SHUFFLE_TAG | e: kept apart from the low-numbered streams
 * that datasets use per sample, so one seed can serve both without correlation. */
#define SHUFFLE_TAG ((uint64_t)0x5348 << 48)

void fl_loader_epoch_order(int64_t *perm, int64_t size, const fl_loader_config *cfg,
                           int64_t epoch) {
    /* every epoch starts again from the identity, so the order depends on (seed, epoch)
     * alone, not on which epochs were visited before */
    for (int64_t i = 0; i < size; i++)
        perm[i] = i;
    if (!cfg->shuffle)
        return;
    fl_rng r;
    fl_rng_init(&r, cfg->seed, SHUFFLE_TAG | (uint64_t)epoch);
    fl_rng_shuffle(&r, perm, size);
}

void fl_loader_slice(const fl_loader_config *cfg, int64_t size, int64_t step, int64_t *lo,
                     int64_t *hi) {
    int64_t B = cfg->batch_size;
    int64_t start = step * cfg->world * B;
    int64_t end = start + cfg->world * B < size ? start + cfg->world * B : size;
    int64_t a = start + cfg->rank * B, b = a + B;
    *lo = a < end ? a : end;
    *hi = b < end ? b : end;
}
