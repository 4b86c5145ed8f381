/* loader.c - the sharded batch loader. Each epoch's order is one permutation from (seed, epoch),
 * the same on every rank; it is cut into global batches of world * B and rank r takes the r-th
 * slice of each (PyTorch's DistributedSampler shards contiguously instead; slicing per global
 * batch is what makes one step's union over ranks equal the single-worker batch of world * B). */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <stdlib.h>

/* The shuffle stream of epoch e is SHUFFLE_TAG | e: kept apart from the low-numbered streams
 * that datasets use per sample, so one seed can serve both without correlation. */
#define SHUFFLE_TAG ((uint64_t)0x5348 << 48)

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
};

static int check_config(const fl_dataset *ds, const fl_loader_config *cfg) {
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
    if (check_config(ds, cfg) < 0)
        goto fail;
    l = calloc(1, sizeof *l);
    if (!l) {
        fl_fail(FL_ENOMEM, "loader: out of memory");
        goto fail;
    }
    l->ds = ds;
    l->cfg = *cfg;
    int64_t global = (int64_t)cfg->world * cfg->batch_size;
    l->steps_per_epoch = cfg->drop_last ? ds->size / global : (ds->size + global - 1) / global;
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
    if (l->cfg.shuffle && epoch != l->epoch) {
        /* every epoch starts again from the identity, so the order depends on (seed, epoch)
         * alone, not on which epochs were visited before */
        for (int64_t i = 0; i < l->ds->size; i++)
            l->perm[i] = i;
        fl_rng r;
        fl_rng_init(&r, l->cfg.seed, SHUFFLE_TAG | (uint64_t)epoch);
        fl_rng_shuffle(&r, l->perm, l->ds->size);
    }
    l->epoch = epoch;
    l->step = step;
    return FL_OK;
}

int fl_loader_next(fl_loader *l, const fl_tensor **x, const int32_t **labels) {
    FL_ASSERT(l && x && labels);
    if (l->step >= l->steps_per_epoch)
        return 0;
    int64_t B = l->cfg.batch_size, size = l->ds->size;
    int64_t start = l->step * l->cfg.world * B;
    int64_t end = start + l->cfg.world * B < size ? start + l->cfg.world * B : size;
    int64_t lo = start + l->cfg.rank * B, hi = lo + B;
    lo = lo < end ? lo : end;
    hi = hi < end ? hi : end;
    int64_t numel = l->ds->sample_numel;
    float *xdata = l->xbuf->data;
    for (int64_t i = lo; i < hi; i++) {
        int64_t idx = l->perm[i];
        int rc = fl_dataset_get(l->ds, idx, xdata + (i - lo) * numel, &l->labels[i - lo]);
        if (rc < 0)
            return fl_fail_prefix(rc, "loader: epoch %lld step %lld sample %lld",
                                  (long long)l->epoch, (long long)l->step, (long long)idx);
    }
    l->x = *l->xbuf;
    l->x.owns_data = false;
    l->x.shape[0] = hi - lo;
    l->x.numel = (hi - lo) * numel;
    l->step++;
    *x = &l->x;
    *labels = l->labels;
    return 1;
}
