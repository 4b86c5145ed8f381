/* cifar10.c - CIFAR-10's binary format (Krizhevsky 2009, cifar-10-batches-bin): each record is
 * a label byte and a 32 x 32 image stored as three 1024-byte planes (R, G, B), already CHW.
 * The files are read whole at open (150 MB for the training split) and checked there, so a
 * truncated download fails before training instead of in the middle of an epoch. Augmentation
 * is the standard one of the ResNet paper's CIFAR experiments (He et al. 2016, sec. 4.2):
 * 4 pixels of zero padding, a random 32 x 32 crop, a random horizontal flip. */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIDE 32
#define PLANE (SIDE * SIDE)
#define RECORD (1 + 3 * PLANE)
#define PAD 4

/* the training split's per-channel statistics, as commonly used with torchvision */
static const float cifar_mean[3] = {0.4914f, 0.4822f, 0.4465f};
static const float cifar_std[3] = {0.2470f, 0.2435f, 0.2616f};

typedef struct {
    uint8_t *records; /* (SIZE, RECORD) */
    bool     augment;
    uint64_t seed;
} cifar_impl;

static int load_file(const char *path, uint8_t **records, int64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = FL_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = fl_fail(FL_EIO, "%s: cannot get its size", path);
        goto done;
    }
    if (size == 0 || size % RECORD != 0) {
        rc = fl_fail(FL_EFORMAT, "%s: %ld bytes is not a whole number of %d-byte records "
                     "(truncated or not a CIFAR-10 binary file)", path, size, RECORD);
        goto done;
    }
    int64_t add = size / RECORD;
    uint8_t *nb = realloc(*records, (size_t)(*n + add) * RECORD);
    if (!nb) {
        rc = fl_fail(FL_ENOMEM, "%s: cannot allocate %ld bytes", path, size);
        goto done;
    }
    *records = nb;
    uint8_t *dst = nb + (size_t)*n * RECORD;
    if (fread(dst, 1, (size_t)size, f) != (size_t)size) {
        rc = fl_fail(FL_EIO, "%s: short read", path);
        goto done;
    }
    for (int64_t r = 0; r < add; r++)
        if (dst[(size_t)r * RECORD] > 9) {
            rc = fl_fail(FL_EFORMAT, "%s: record %lld: label %d outside [0, 10)", path,
                         (long long)r, dst[(size_t)r * RECORD]);
            goto done;
        }
    *n += add;
done:
    fclose(f);
    return rc;
}

static int cifar_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x,
                        int32_t *label) {
    const cifar_impl *p = ds->impl;
    const uint8_t *rec = p->records + (size_t)index * RECORD;
    int dx = PAD, dy = PAD;
    bool flip = false;
    if (p->augment) {
        if (epoch >= ((int64_t)1 << 22)) /* as the image list: apart from shuffle streams */
            return fl_fail(FL_EINVAL, "dataset 'cifar10': epoch %lld beyond 2^22",
                           (long long)epoch);
        fl_rng r;
        fl_rng_init(&r, p->seed, (uint64_t)epoch << 40 | (uint64_t)index);
        dy = (int)fl_rng_below(&r, 2 * PAD + 1); /* torchvision RandomCrop: top, then left */
        dx = (int)fl_rng_below(&r, 2 * PAD + 1);
        flip = fl_rng_below(&r, 2) == 1;
    }
    for (int c = 0; c < 3; c++) {
        const uint8_t *plane = rec + 1 + c * PLANE;
        float a = 1.0f / (255.0f * cifar_std[c]), b = -cifar_mean[c] / cifar_std[c];
        for (int y = 0; y < SIDE; y++) {
            int sy = y + dy - PAD;
            for (int xo = 0; xo < SIDE; xo++) {
                int sx = (flip ? SIDE - 1 - xo : xo) + dx - PAD;
                bool in = sy >= 0 && sy < SIDE && sx >= 0 && sx < SIDE;
                float v = in ? plane[sy * SIDE + sx] : 0.0f; /* zero padding, before Normalize */
                x[c * PLANE + y * SIDE + xo] = v * a + b;
            }
        }
    }
    *label = rec[0];
    return FL_OK;
}

static int cifar_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    return cifar_get_ex(ds, index, 0, x, label);
}

static void cifar_destroy(fl_dataset *ds) {
    cifar_impl *p = ds->impl;
    if (p)
        free(p->records);
    free(p);
}

static const fl_dataset_ops cifar_ops = {
    .name = "cifar10",
    .get = cifar_get,
    .get_ex = cifar_get_ex,
    .destroy = cifar_destroy,
};

fl_dataset *fl_dataset_cifar10_create(const char *dir, bool train, bool augment, uint64_t seed) {
    FL_ASSERT(dir);
    fl_dataset *ds = calloc(1, sizeof *ds);
    cifar_impl *p = calloc(1, sizeof *p);
    char *path = malloc(strlen(dir) + 32);
    if (!ds || !p || !path) {
        fl_fail(FL_ENOMEM, "dataset 'cifar10': out of memory");
        goto fail;
    }
    int64_t n = 0;
    for (int i = 1; i <= (train ? 5 : 1); i++) {
        if (train)
            sprintf(path, "%s/data_batch_%d.bin", dir, i);
        else
            sprintf(path, "%s/test_batch.bin", dir);
        if (load_file(path, &p->records, &n) < 0)
            goto fail;
    }
    free(path);
    p->augment = augment;
    p->seed = seed;
    ds->ops = &cifar_ops;
    ds->impl = p;
    ds->size = n;
    ds->ndim = 3;
    ds->shape[0] = 3;
    ds->shape[1] = SIDE;
    ds->shape[2] = SIDE;
    ds->sample_numel = 3 * PLANE;
    ds->num_classes = 10;
    return ds;

fail:
    if (p)
        free(p->records);
    free(p);
    free(path);
    free(ds);
    return NULL;
}
