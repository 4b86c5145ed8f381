/* shapes.c - a learnable synthetic image task for convolutional networks, so CNN training can
 * be tested without downloads: the class is a shape (and, above 5 classes, a colour palette)
 * drawn at a random position and size on a random background with pixel noise. Like the other
 * synthetic sets, sample i is a pure function of (seed, split, i) through Philox stream i. */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>

#define NSHAPES 5
#define SPLIT_SHIFT 56

typedef struct {
    uint64_t seed;
    int      classes;
    int      size;
    int      split;
} shapes_impl;

/* Is (dx, dy), relative to the centre, inside shape `s` of radius r? */
static bool inside(int s, double dx, double dy, double r) {
    double ax = fabs(dx), ay = fabs(dy);
    switch (s) {
    case 0: /* disk */
        return dx * dx + dy * dy <= r * r;
    case 1: /* square */
        return ax <= 0.8 * r && ay <= 0.8 * r;
    case 2: /* triangle, apex up: half-width grows from 0 at the top to r at the bottom */
        return dy >= -r && dy <= 0.8 * r && ax <= (dy + r) / 1.8;
    case 3: /* ring */
        return dx * dx + dy * dy <= r * r && dx * dx + dy * dy >= 0.3 * r * r;
    default: /* cross */
        return (ax <= 0.3 * r && ay <= r) || (ay <= 0.3 * r && ax <= r);
    }
}

static double uniform(fl_rng *r, double lo, double hi) {
    return lo + (hi - lo) * fl_rng_uniform_f64(r);
}

static int shapes_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    const shapes_impl *p = ds->impl;
    fl_rng r;
    fl_rng_init(&r, p->seed, (uint64_t)p->split << SPLIT_SHIFT | (uint64_t)index);
    int cls = (int)fl_rng_below(&r, (uint64_t)p->classes);
    int shape = cls % NSHAPES;
    /* with 5 classes or fewer the palette is a nuisance drawn per sample, else part of the class */
    int palette = p->classes > NSHAPES ? cls / NSHAPES : (int)fl_rng_below(&r, 2);
    double fg[3], bg[3];
    if (palette == 0) { /* warm */
        fg[0] = uniform(&r, 0.7, 1.0), fg[1] = uniform(&r, 0.2, 0.6), fg[2] = uniform(&r, 0.0, 0.3);
    } else { /* cool */
        fg[0] = uniform(&r, 0.0, 0.3), fg[1] = uniform(&r, 0.3, 0.7), fg[2] = uniform(&r, 0.7, 1.0);
    }
    double grey = uniform(&r, 0.2, 0.5);
    for (int c = 0; c < 3; c++)
        bg[c] = grey + uniform(&r, -0.1, 0.1);
    int S = p->size;
    double rad = uniform(&r, 0.2 * S, 0.4 * S);
    double cx = uniform(&r, rad, S - rad), cy = uniform(&r, rad, S - rad);
    size_t plane = (size_t)S * S;
    for (int y = 0; y < S; y++)
        for (int xx = 0; xx < S; xx++) {
            bool in = inside(shape, xx + 0.5 - cx, y + 0.5 - cy, rad);
            for (int c = 0; c < 3; c++) {
                double v = (in ? fg[c] : bg[c]) + 0.08 * fl_rng_normal(&r);
                x[c * plane + (size_t)y * S + xx] = (float)((v - 0.5) / 0.25);
            }
        }
    *label = cls;
    return FL_OK;
}

static void shapes_destroy(fl_dataset *ds) { free(ds->impl); }

static const fl_dataset_ops shapes_ops = {
    .name = "shapes",
    .get = shapes_get,
    .destroy = shapes_destroy,
};

fl_dataset *fl_dataset_shapes_create(int64_t n, int classes, int size, uint64_t seed, int split) {
    if (n < 0 || n >= ((int64_t)1 << SPLIT_SHIFT)) {
        fl_fail(FL_EINVAL, "dataset 'shapes': size %lld outside [0, 2^56)", (long long)n);
        return NULL;
    }
    if (classes < 2 || classes > 2 * NSHAPES) {
        fl_fail(FL_EINVAL, "dataset 'shapes': classes %d outside [2, %d]", classes, 2 * NSHAPES);
        return NULL;
    }
    if (size < 8 || size > 256) {
        fl_fail(FL_EINVAL, "dataset 'shapes': image size %d outside [8, 256]", size);
        return NULL;
    }
    if (split < 0 || split > 255) {
        fl_fail(FL_EINVAL, "dataset 'shapes': split %d outside [0, 255]", split);
        return NULL;
    }
    fl_dataset *ds = calloc(1, sizeof *ds);
    shapes_impl *p = malloc(sizeof *p);
    if (!ds || !p) {
        free(ds);
        free(p);
        fl_fail(FL_ENOMEM, "dataset 'shapes': out of memory");
        return NULL;
    }
    *p = (shapes_impl){.seed = seed, .classes = classes, .size = size, .split = split};
    ds->ops = &shapes_ops;
    ds->impl = p;
    ds->size = n;
    ds->ndim = 3;
    ds->shape[0] = 3;
    ds->shape[1] = size;
    ds->shape[2] = size;
    ds->sample_numel = 3 * (int64_t)size * size;
    ds->num_classes = classes;
    return ds;
}
