/* mnist.c - MNIST-format image sets (MNIST, Fashion-MNIST, KMNIST): the IDX image and label
 * files of a split read whole at open (47 MB for Fashion-MNIST's training images) and checked
 * against each other there, so a mismatched pair fails before training. Samples are
 * (1, rows, cols) grey images normalised with the training split's mean and standard deviation;
 * augmentation is the usual one for 28 x 28 sets: a random crop of the image zero-padded on each
 * side, and optionally a horizontal flip (off by default: Fashion-MNIST's classes are told apart
 * partly by orientation-dependent details, and its published baselines mostly train without). */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    fl_idx   images;  /* (N, ROWS, COLS) u8 */
    int32_t *labels;  /* (N) */
    float    scale;   /* pixel byte -> normalised value: v * scale + shift */
    float    shift;
    double   mean, std;
    bool     augment, flip;
    int      pad;
    uint64_t seed;
} mnist_impl;

/* "<dir>/<stem>.gz" if it exists, else "<dir>/<stem>" (out holds 4096 bytes). */
static void find_file(const char *dir, const char *stem, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s.gz", dir, stem);
    if (access(out, F_OK) == 0)
        return;
    snprintf(out, cap, "%s/%s", dir, stem);
}

static int load_split(mnist_impl *p, const char *dir, bool train, int classes) {
    const char *prefix = train ? "train" : "t10k";
    char ipath[4096], lpath[4096], stem[64];
    snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", prefix);
    find_file(dir, stem, ipath, sizeof ipath);
    snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", prefix);
    find_file(dir, stem, lpath, sizeof lpath);
    fl_idx labels = {0};
    FL_TRY(fl_idx_read(ipath, &p->images));
    int rc = fl_idx_read(lpath, &labels);
    if (rc < 0)
        return rc;
    if (p->images.ndim != 3) {
        rc = fl_fail(FL_EFORMAT, "%s: %d dimensions, but images are (count, rows, columns)",
                     ipath, p->images.ndim);
        goto done;
    }
    if (labels.ndim != 1) {
        rc = fl_fail(FL_EFORMAT, "%s: %d dimensions, but labels are (count)", lpath,
                     labels.ndim);
        goto done;
    }
    if (labels.dims[0] != p->images.dims[0]) {
        rc = fl_fail(FL_EFORMAT, "%s holds %lld labels but %s holds %lld images (files of "
                     "different sets or splits?)", lpath, (long long)labels.dims[0], ipath,
                     (long long)p->images.dims[0]);
        goto done;
    }
    int64_t n = labels.dims[0];
    p->labels = malloc((size_t)n * sizeof *p->labels);
    if (!p->labels) {
        rc = fl_fail(FL_ENOMEM, "%s: out of memory for %lld labels", lpath, (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        if (labels.data[i] >= classes) {
            rc = fl_fail(FL_EFORMAT, "%s: label %lld is %d, outside [0, %d) (data.classes)",
                         lpath, (long long)i, labels.data[i], classes);
            goto done;
        }
        p->labels[i] = labels.data[i];
    }
done:
    fl_idx_free(&labels);
    return rc;
}

/* mean and standard deviation of all pixels, in [0, 1] units */
static void pixel_stats(const fl_idx *im, double *mean, double *std) {
    size_t n = (size_t)(im->dims[0] * im->dims[1] * im->dims[2]);
    uint64_t hist[256] = {0};
    for (size_t i = 0; i < n; i++)
        hist[im->data[i]]++;
    double s = 0, ss = 0;
    for (int v = 0; v < 256; v++) {
        double x = v / 255.0;
        s += (double)hist[v] * x;
        ss += (double)hist[v] * x * x;
    }
    *mean = s / (double)n;
    double var = ss / (double)n - *mean * *mean;
    *std = var > 0 ? sqrt(var) : 1.0;
}

static int mnist_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x,
                        int32_t *label) {
    const mnist_impl *p = ds->impl;
    int rows = (int)p->images.dims[1], cols = (int)p->images.dims[2], pad = p->pad;
    const uint8_t *im = p->images.data + (size_t)index * (size_t)(rows * cols);
    int dx = pad, dy = pad;
    bool flip = false;
    if (p->augment) {
        if (epoch >= ((int64_t)1 << 22)) /* as the image list: apart from shuffle streams */
            return fl_fail(FL_EINVAL, "dataset 'mnist': epoch %lld beyond 2^22",
                           (long long)epoch);
        fl_rng r;
        fl_rng_init(&r, p->seed, (uint64_t)epoch << 40 | (uint64_t)index);
        dy = (int)fl_rng_below(&r, (uint64_t)(2 * pad + 1)); /* torchvision: top, then left */
        dx = (int)fl_rng_below(&r, (uint64_t)(2 * pad + 1));
        flip = p->flip && fl_rng_below(&r, 2) == 1;
    }
    for (int y = 0; y < rows; y++) {
        int sy = y + dy - pad;
        for (int xo = 0; xo < cols; xo++) {
            int sx = (flip ? cols - 1 - xo : xo) + dx - pad;
            bool in = sy >= 0 && sy < rows && sx >= 0 && sx < cols;
            float v = in ? im[sy * cols + sx] : 0.0f; /* zero padding, before normalising */
            x[y * cols + xo] = v * p->scale + p->shift;
        }
    }
    *label = p->labels[index];
    return FL_OK;
}

static int mnist_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    return mnist_get_ex(ds, index, 0, x, label);
}

static void mnist_destroy(fl_dataset *ds) {
    mnist_impl *p = ds->impl;
    if (!p)
        return;
    fl_idx_free(&p->images);
    free(p->labels);
    free(p);
}

static const fl_dataset_ops mnist_ops = {
    .name = "mnist",
    .get = mnist_get,
    .get_ex = mnist_get_ex,
    .destroy = mnist_destroy,
};

fl_mnist_config fl_mnist_config_default(void) {
    return (fl_mnist_config){.dir = FL_FASHION_MNIST_DIR, .train = true, .augment = false,
                             .crop_padding = 2, .flip = false, .mean = NAN, .std = NAN,
                             .classes = 10, .seed = 0};
}

fl_dataset *fl_dataset_mnist_create(const fl_mnist_config *cfg) {
    FL_ASSERT(cfg && cfg->dir);
    if (cfg->classes < 1 || cfg->classes > 256 || cfg->crop_padding < 0 ||
        cfg->crop_padding > 64 || (!isnan(cfg->std) && !(cfg->std > 0))) {
        fl_fail(FL_EINVAL, "dataset 'mnist': classes %d outside [1, 256], crop padding %d "
                "outside [0, 64] or std %g not positive", cfg->classes, cfg->crop_padding,
                cfg->std);
        return NULL;
    }
    fl_dataset *ds = calloc(1, sizeof *ds);
    mnist_impl *p = calloc(1, sizeof *p);
    if (!ds || !p) {
        fl_fail(FL_ENOMEM, "dataset 'mnist': out of memory");
        goto fail;
    }
    if (load_split(p, cfg->dir, cfg->train, cfg->classes) < 0)
        goto fail;
    p->mean = cfg->mean;
    p->std = cfg->std;
    if (isnan(p->mean) || isnan(p->std)) {
        double m, s;
        pixel_stats(&p->images, &m, &s);
        p->mean = isnan(p->mean) ? m : p->mean;
        p->std = isnan(p->std) ? s : p->std;
    }
    p->scale = (float)(1.0 / (255.0 * p->std));
    p->shift = (float)(-p->mean / p->std);
    p->augment = cfg->augment;
    p->flip = cfg->flip;
    p->pad = cfg->crop_padding;
    p->seed = cfg->seed;
    ds->ops = &mnist_ops;
    ds->impl = p;
    ds->size = p->images.dims[0];
    ds->ndim = 3;
    ds->shape[0] = 1;
    ds->shape[1] = p->images.dims[1];
    ds->shape[2] = p->images.dims[2];
    ds->sample_numel = p->images.dims[1] * p->images.dims[2];
    ds->num_classes = cfg->classes;
    return ds;
fail:
    if (p) {
        fl_idx_free(&p->images);
        free(p->labels);
    }
    free(p);
    free(ds);
    return NULL;
}

int fl_dataset_mnist_stats(const fl_dataset *ds, double *mean, double *std) {
    FL_ASSERT(ds && mean && std);
    if (ds->ops != &mnist_ops)
        return fl_fail(FL_EINVAL, "dataset '%s' is not an MNIST-format set", ds->ops->name);
    const mnist_impl *p = ds->impl;
    *mean = p->mean;
    *std = p->std;
    return FL_OK;
}
