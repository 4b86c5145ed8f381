/* data.h - datasets (random access by index) and the sharded batch loader.
 *
 * A dataset is a table of function pointers that writes sample i's features (f32) and label.
 * The synthetic datasets derive every sample from (seed, index) with the counter-based RNG, so
 * they need no storage and are identical on every machine.
 *
 * The loader cuts each epoch's permutation (from seed and epoch, the same on every rank) into
 * global batches of world * batch_size samples; rank r takes the r-th slice of each. Hence the
 * union over ranks of one step's batches is exactly the single-worker batch of world *
 * batch_size, and the union of the shards is the whole epoch exactly once.
 *
 * Datasets with random augmentation (the image list, CIFAR-10) implement get_ex, which also
 * takes the epoch: a sample's crop and flip come from (seed, epoch, index) alone, so the
 * prefetching loader's worker threads produce exactly the single-threaded loader's bytes. */
#ifndef FLEET_DATA_H
#define FLEET_DATA_H

#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_dataset fl_dataset;

/* Returned (positive) by get_ex for a sample that cannot be made (a missing or corrupt image
 * under the skip policy): the dataset has counted it, and the loaders leave it out of its
 * batch, which then holds fewer samples. Not an error: fl_errmsg is not set. */
#define FL_DATASET_SKIP 1

typedef struct fl_dataset_ops {
    const char *name;
    /* Writes sample `index` (0 <= index < size): sample_numel floats to x and its label. */
    int (*get)(fl_dataset *ds, int64_t index, float *x, int32_t *label);
    /* Frees impl. May be NULL. */
    void (*destroy)(fl_dataset *ds);
    /* Optional (NULL: get is used and the epoch ignored). Sample `index` as seen in `epoch`:
     * datasets with random augmentation draw it from (their seed, epoch, index) alone, so a
     * sample comes out the same whichever thread makes it and in whatever order, and differs
     * between epochs. Returns FL_OK, FL_DATASET_SKIP, or a negative status. Must be safe to
     * call from several threads at once (the prefetching loader does). */
    int (*get_ex)(fl_dataset *ds, int64_t index, int64_t epoch, float *x, int32_t *label);
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
 * [0, size). The synthetic datasets' get is thread-safe. A dataset that can skip samples (the
 * image list) may return FL_DATASET_SKIP here too; get is get_ex at epoch 0 for those. */
int fl_dataset_get(fl_dataset *ds, int64_t index, float *x, int32_t *label);
/* Bounds-checked get_ex (or get where a dataset has no get_ex); epoch must be >= 0. What the
 * loaders call. Returns FL_OK, FL_DATASET_SKIP or a negative status. */
int fl_dataset_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x, int32_t *label);

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
/* Samples left out of this loader's batches (FL_DATASET_SKIP) since it was created. A skipped
 * sample shrinks its rank's batch; it is never replaced, so the sharding above still holds for
 * the samples that remain. */
int64_t fl_loader_skipped(const fl_loader *l);

/* ---- images (imagelist.c, cifar10.c, shapes.c; transforms in fleet/image.h) -------------- */

typedef enum {
    FL_BAD_IMAGE_SKIP = 0, /* count it (fl_dataset_imagelist_stats) and leave it out */
    FL_BAD_IMAGE_FAIL = 1, /* the loader fails naming the image file and its list line */
} fl_bad_image_policy;

/* The ImageNet file list of the seeds (seed 002): one `relative/path.jpeg label` per line,
 * fields separated by spaces or tabs, paths relative to `root`. Blank lines and lines whose
 * first non-blank character is '#' are skipped; a trailing '\r' is ignored. Paths cannot hold
 * spaces. Refused at open with "list:line: what": a missing label, a label that is not a
 * decimal integer or is outside [0, classes), a third field, an absolute path or one with a
 * ".." component (it would escape root); a list with no samples is refused too. Images are
 * only opened when a sample is loaded. */
typedef struct {
    const char *list;              /* path of the list file */
    const char *root;              /* directory the list's paths are relative to */
    int         classes;           /* labels in [0, classes); class_dim (1000 for ImageNet) */
    bool        train;             /* random resized crop + flip; else resize + centre crop */
    int         crop_size;         /* output is 3 x crop_size x crop_size (224) */
    int         resize_short_size; /* evaluation: short side resized to this first (256) */
    double      lower_scale;       /* random resized crop area range [lower_scale, 1] (0.08) */
    double      lower_ratio;       /* aspect ratio range [lower_ratio, upper_ratio] (3/4, 4/3) */
    double      upper_ratio;
    bool        flip;              /* train: mirror left-right with probability 1/2 (true) */
    uint64_t    seed;              /* augmentation seed */
    fl_bad_image_policy on_bad_image;
} fl_imagelist_config;

/* The seeds' defaults: crop 224, resize_short_size 256, lower_scale 0.08, ratios 3/4 and 4/3,
 * flip on, train, skip bad images, 1000 classes; list and root left NULL. */
fl_imagelist_config fl_imagelist_config_default(void);

/* An image-list dataset: samples (3, crop, crop) f32 normalised with the ImageNet mean and std
 * (fl_imagenet_mean/std), labels from the list. Sample i of epoch e in train mode draws its crop
 * and flip from Philox stream (e << 40 | i) of the seed, so indices must stay below 2^40 and
 * epochs below 2^22 (which keeps these streams apart from the loader's shuffle streams when one
 * seed serves both; get_ex refuses a later epoch). NULL and fl_errmsg on a bad config or list.
 * cfg's strings are copied. */
fl_dataset *fl_dataset_imagelist_create(const fl_imagelist_config *cfg);

typedef struct {
    int64_t missing; /* images that could not be opened or read */
    int64_t corrupt; /* images that failed to decode (bad or truncated JPEG) */
} fl_imagelist_stats;
/* Distinct samples found bad so far by any thread under the skip policy (an image missing in
 * every epoch counts once), so the counts do not depend on timing or on batches a loader made
 * ahead and discarded. FL_EINVAL if ds is not an image list. */
int fl_dataset_imagelist_stats(const fl_dataset *ds, fl_imagelist_stats *stats);

/* CIFAR-10's binary version (cifar-10-batches-bin): records of 1 label byte and 3072 pixel bytes
 * (1024 R, 1024 G, 1024 B, rows of 32); the training split is data_batch_1.bin .. _5.bin, the
 * test split test_batch.bin, all in `dir`. A file whose size is not a positive multiple of 3073
 * is refused naming it (truncated), as is a label byte above 9 (file and record). Samples are
 * (3, 32, 32) f32 normalised with CIFAR-10's mean and std; with `augment`, a random 32 x 32 crop
 * of the image zero-padded by 4 on each side and a flip with probability 1/2, from stream
 * (e << 40 | i) of `seed` as the image list does. The files are read into memory at open. */
fl_dataset *fl_dataset_cifar10_create(const char *dir, bool train, bool augment, uint64_t seed);

/* ---- MNIST-format sets (idx.c, mnist.c) --------------------------------------------------- */

#define FL_IDX_MAX_DIMS 4

/* One IDX file (the format of MNIST and Fashion-MNIST): unsigned-byte elements only. */
typedef struct {
    int      ndim;
    int64_t  dims[FL_IDX_MAX_DIMS];
    uint8_t *data; /* prod(dims) bytes, row-major; owned, freed by fl_idx_free */
} fl_idx;

/* Reads path, gzip-compressed or plain (zlib's gzread reads both), into *out. Checks the magic
 * (two zero bytes, element type 0x08, 1 to FL_IDX_MAX_DIMS dimensions), that no dimension is 0
 * and that the file holds exactly the elements its header announces: a short file is refused
 * as "truncated", a longer one as "longer than its header says", a corrupt gzip stream with
 * zlib's reason; every message starts with the path. On failure *out is empty. */
int  fl_idx_read(const char *path, fl_idx *out);
/* Frees out's data and empties it; an empty fl_idx is a no-op. */
void fl_idx_free(fl_idx *idx);

/* Where Debian's dataset-fashion-mnist package installs the set. */
#define FL_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct {
    const char *dir;     /* holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or .gz */
    bool        train;   /* the training split (train-*), else the test split (t10k-*) */
    bool        augment; /* a random crop of the image zero-padded by crop_padding (and a flip) */
    int         crop_padding; /* [0, 64] */
    bool        flip;    /* with augment: mirror left-right with probability 1/2 */
    double      mean, std; /* normalisation in [0, 1] pixel units; NaN: this split's own pixels'
                            * (give the training split's values to the test split) */
    int         classes; /* labels must lie in [0, classes) */
    uint64_t    seed;    /* augmentation seed */
} fl_mnist_config;

/* Fashion-MNIST's directory, training split, no augmentation (padding 2, flip off when on),
 * statistics from the split's own pixels, 10 classes. */
fl_mnist_config fl_mnist_config_default(void);

/* An MNIST-format dataset: samples (1, rows, cols) f32, (pixel / 255 - mean) / std, labels from
 * the label file. Both files are read at open and must agree: images (count, rows, cols) and
 * labels (count), the same count, every label below classes; otherwise NULL with a message
 * naming the file and what is wrong. With augment, sample i of epoch e draws its crop (and flip)
 * from Philox stream (e << 40 | i) of seed, as the other image sets do. */
fl_dataset *fl_dataset_mnist_create(const fl_mnist_config *cfg);
/* The mean and std the dataset normalises with. FL_EINVAL if ds is not an MNIST-format set. */
int fl_dataset_mnist_stats(const fl_dataset *ds, double *mean, double *std);

/* A learnable synthetic image task: class c draws shape c % 5 (disk, square, triangle, ring,
 * cross) in a colour of palette c / 5 (warm, cool) at a random position and size on a noisy
 * background, with pixel noise, from (seed, index) alone. classes in [2, 10], images
 * 3 x size x size, size in [8, 256]; values normalised to about zero mean, unit variance.
 * `split` 0 and 1 are disjoint streams (train, validation). */
fl_dataset *fl_dataset_shapes_create(int64_t n, int classes, int size, uint64_t seed, int split);

/* ---- prefetching loader (prefetch.c) ------------------------------------------------------ */

typedef struct {
    fl_loader_config base;   /* batch, shuffle, drop_last, seed, rank, world: as fl_loader */
    int              num_workers; /* threads making samples; 0 makes them in fl_prefetch_next */
    int              prefetch;    /* batches made ahead of the consumer, >= 1 */
} fl_prefetch_config;

typedef struct fl_prefetch fl_prefetch;

/* fl_loader with worker threads: the same batches, bit for bit, in the same order (the same
 * permutation and slicing; samples from fl_dataset_get_ex, compacted in order past skips), made
 * by num_workers threads up to `prefetch` batches ahead of the consumer within the current
 * epoch. ds (borrowed) must have a thread-safe get/get_ex. NULL and fl_errmsg on a bad config
 * or when threads cannot start. Positioned at epoch 0, step 0. Not itself thread-safe: one
 * consumer thread calls the functions below. */
fl_prefetch *fl_prefetch_create(fl_dataset *ds, const fl_prefetch_config *cfg);
/* Stops the workers (each finishes the sample in hand) and frees everything; safe at any point
 * of an epoch. NULL is a no-op. */
void    fl_prefetch_free(fl_prefetch *p);
int64_t fl_prefetch_steps_per_epoch(const fl_prefetch *p);
/* As fl_loader_seek. Discards the batches made ahead, except when it names the position the
 * loader is already at (the seek to step 0 right after create), which keeps them. */
int     fl_prefetch_seek(fl_prefetch *p, int64_t epoch, int64_t step);
/* As fl_loader_next: 1 with a batch (valid until the next call of next, seek or free), 0 at the
 * end of the epoch, or a negative status with the failing sample's message (and again on
 * every call until the next seek). */
int     fl_prefetch_next(fl_prefetch *p, const fl_tensor **x, const int32_t **labels);
/* Samples left out (FL_DATASET_SKIP) of the batches returned so far. */
int64_t fl_prefetch_skipped(const fl_prefetch *p);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_DATA_H */
