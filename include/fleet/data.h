/* data.h - datasets (random access by index) and the sharded batch loader.
 *
 * A dataset is a table of function pointers that writes sample i's features (f32) and label.
 * The synthetic datasets derive every sample from (seed, index) with the counter-based RNG, so
 * they need no storage and are identical on every machine.
 *
 * The loader cuts each epoch's permutation (from seed and epoch, the same on every rank) into
 * global batches of world * batch_size samples; rank r takes the r-th slice of each. Hence the
 * union over ranks of one step's batches is exactly the single-worker batch of world *
 * batch_size, and the union of the shards is the whole epoch exactly once. */
#ifndef FLEET_DATA_H
#define FLEET_DATA_H

#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_dataset fl_dataset;

typedef struct fl_dataset_ops {
    const char *name;
    /* Writes sample `index` (0 <= index < size): sample_numel floats to x and its label. */
    int (*get)(fl_dataset *ds, int64_t index, float *x, int32_t *label);
    /* Frees impl. May be NULL. */
    void (*destroy)(fl_dataset *ds);
} fl_dataset_ops;

struct fl_dataset {
    const fl_dataset_ops *ops;
    int64_t size;                    /* number of samples */
    int     ndim;                    /* sample shape, no batch dimension */
    int64_t shape[FL_MAX_DIMS];
    int64_t sample_numel;
    int     num_classes;
    void   *impl;
};

/* Calls ops->destroy (if any), then frees ds itself, which must come from malloc (as the
 * create functions below allocate it). NULL is a no-op. */
void fl_dataset_free(fl_dataset *ds);
/* Bounds-checked ds->ops->get: FL_EINVAL naming the dataset and the index when it is outside
 * [0, size). The synthetic datasets' get is thread-safe. */
int fl_dataset_get(fl_dataset *ds, int64_t index, float *x, int32_t *label);

/* The seed document's gen_data: `features` floats uniform in [0, 1) and a label uniform in
 * [0, classes) (seed: 32 features, 2 classes). Not learnable: a smoke test of the pipeline. */
fl_dataset *fl_dataset_random_create(int64_t size, int64_t features, int classes, uint64_t seed);

/* A learnable task: x ~ N(0, 1)^features, label = argmax of a fixed random teacher network
 * features -> hidden (tanh) -> classes whose weights come from teacher_seed. `split` selects
 * disjoint sample streams (0 = train, 1 = validation) of the same teacher. */
fl_dataset *fl_dataset_teacher_create(int64_t size, int64_t features, int64_t hidden,
                                      int classes, uint64_t teacher_seed, int split);

typedef struct {
    int64_t  batch_size; /* per rank */
    bool     shuffle;    /* permute each epoch; else sequential order */
    bool     drop_last;  /* drop a final global batch smaller than world * batch_size */
    uint64_t seed;       /* shuffle seed, shared by all ranks */
    int      rank;
    int      world;
} fl_loader_config;

typedef struct fl_loader fl_loader;

/* A loader over ds (borrowed). NULL and fl_errmsg on bad config (batch_size < 1, world < 1,
 * rank not in [0, world), an epoch too small for one global batch with drop_last). Epoch e's
 * order is fl_rng_shuffle of the identity with stream e of `seed` (tagged apart from the
 * per-sample streams); global batch g is positions [g*world*B, min((g+1)*world*B, size)) and
 * rank r takes [r*B, (r+1)*B) of it, clipped. Positioned at epoch 0, step 0. */
fl_loader *fl_loader_create(fl_dataset *ds, const fl_loader_config *cfg);
void fl_loader_free(fl_loader *l);
/* Global batches per epoch (the same on every rank). */
int64_t fl_loader_steps_per_epoch(const fl_loader *l);
/* Positions the loader at batch `step` (0-based) of `epoch`: the next fl_loader_next returns
 * that batch. Used at the start of each epoch (step 0) and on resume. */
int fl_loader_seek(fl_loader *l, int64_t epoch, int64_t step);
/* Fills the next batch of this rank: *x (B, sample shape...) f32 and *labels (B), both owned
 * by the loader and valid until the next call. Returns 1 with a batch (B may be 0 for a rank
 * with nothing left in a final partial batch), 0 at the end of the epoch, or a negative
 * status. */
int fl_loader_next(fl_loader *l, const fl_tensor **x, const int32_t **labels);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_DATA_H */
