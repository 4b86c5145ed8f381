/* imagelist.c - the ImageNet file list of the seeds (`relative/path.jpeg label` per line under
 * a root directory) as a dataset: the list is checked whole at open, images are read and
 * decoded per sample (only the crop's region, DCT-scaled as far as the crop allows), then
 * flipped, resized and normalised in one pass. Bad images are skipped and counted, or fail,
 * by policy. */
#include "fleet/data.h"

#include "fleet/image.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INDEX ((int64_t)1 << 40)
/* epoch << 40 | index stays below bit 62, so it never meets the loader's shuffle streams
 * (0x5348 << 48 | epoch) when one seed serves both */
#define MAX_EPOCH ((int64_t)1 << 22)

typedef struct {
    fl_imagelist_config cfg;     /* list and root point at the copies below */
    char               *list;
    char               *root;
    char               *paths;   /* every relative path, NUL-terminated, back to back */
    size_t             *offset;  /* (SIZE) start of sample i's path in paths */
    int32_t            *labels;  /* (SIZE) */
    int32_t            *lines;   /* (SIZE) list line of sample i, for messages */
    _Atomic uint8_t    *bad;     /* (SIZE) 1 once sample i was found missing or corrupt */
    _Atomic int64_t     missing; /* distinct samples found missing / corrupt */
    _Atomic int64_t     corrupt;
} imagelist_impl;

fl_imagelist_config fl_imagelist_config_default(void) {
    return (fl_imagelist_config){
        .classes = 1000, .train = true, .crop_size = 224, .resize_short_size = 256,
        .lower_scale = 0.08, .lower_ratio = 3.0 / 4.0, .upper_ratio = 4.0 / 3.0, .flip = true,
        .seed = 0, .on_bad_image = FL_BAD_IMAGE_SKIP};
}

/* ---- the list --------------------------------------------------------------------------- */

static int check_path(const char *list, int line, const char *path) {
    if (path[0] == '/')
        return fl_fail(FL_EFORMAT, "%s:%d: path '%s' is absolute (want one relative to the root)",
                       list, line, path);
    for (const char *p = path; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return fl_fail(FL_EFORMAT, "%s:%d: path '%s' has a '..' component (it would escape "
                           "the root)", list, line, path);
        p += n + (slash ? 1 : 0);
    }
    return FL_OK;
}

static int parse_label(const char *list, int line, const char *tok, int classes, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(tok, &end, 10);
    if (*end != '\0' || errno == ERANGE || !(tok[0] == '-' || (tok[0] >= '0' && tok[0] <= '9')))
        return fl_fail(FL_EFORMAT, "%s:%d: label '%s' is not an integer", list, line, tok);
    if (v < 0 || v >= classes)
        return fl_fail(FL_EFORMAT, "%s:%d: label %ld outside [0, %d) (classes)", list, line, v,
                       classes);
    *out = (int32_t)v;
    return FL_OK;
}

/* Appends with doubling; *cap counts elements of size `elem`. */
static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return FL_OK;
    size_t ncap = *cap ? *cap : 1024;
    while (ncap < need)
        ncap *= 2;
    void *nb = realloc(*buf, ncap * elem);
    if (!nb)
        return fl_fail(FL_ENOMEM, "image list: out of memory");
    *buf = nb;
    *cap = ncap;
    return FL_OK;
}

static int read_list(imagelist_impl *p, int64_t *count) {
    FILE *f = fopen(p->list, "r");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open the image list: %s", p->list, strerror(errno));
    char *buf = NULL;
    size_t bufcap = 0, paths_len = 0, paths_cap = 0, cap[3] = {0, 0, 0};
    int64_t n = 0;
    int line = 0, rc = FL_OK;
    ssize_t len;
    while ((len = getline(&buf, &bufcap, f)) >= 0) {
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        if ((size_t)len != strlen(buf)) {
            rc = fl_fail(FL_EFORMAT, "%s:%d: line holds a NUL byte", p->list, line);
            break;
        }
        char *save = NULL, *path = strtok_r(buf, " \t", &save);
        if (!path || path[0] == '#')
            continue;
        char *label = strtok_r(NULL, " \t", &save), *extra = strtok_r(NULL, " \t", &save);
        if (!label) {
            rc = fl_fail(FL_EFORMAT, "%s:%d: '%s' has no label (want 'path label')", p->list,
                         line, path);
            break;
        }
        if (extra) {
            rc = fl_fail(FL_EFORMAT, "%s:%d: extra field '%s' after the label (want 'path "
                         "label'; paths cannot hold spaces)", p->list, line, extra);
            break;
        }
        int32_t lab = 0;
        if ((rc = check_path(p->list, line, path)) < 0 ||
            (rc = parse_label(p->list, line, label, p->cfg.classes, &lab)) < 0)
            break;
        if (n >= MAX_INDEX) {
            rc = fl_fail(FL_EFORMAT, "%s:%d: more than 2^40 samples", p->list, line);
            break;
        }
        size_t plen = strlen(path) + 1;
        if ((rc = grow((void **)&p->paths, &paths_cap, paths_len + plen, 1)) < 0 ||
            (rc = grow((void **)&p->offset, &cap[0], (size_t)n + 1, sizeof *p->offset)) < 0 ||
            (rc = grow((void **)&p->labels, &cap[1], (size_t)n + 1, sizeof *p->labels)) < 0 ||
            (rc = grow((void **)&p->lines, &cap[2], (size_t)n + 1, sizeof *p->lines)) < 0)
            break;
        memcpy(p->paths + paths_len, path, plen);
        p->offset[n] = paths_len;
        p->labels[n] = lab;
        p->lines[n] = line;
        paths_len += plen;
        n++;
    }
    if (rc >= 0 && ferror(f))
        rc = fl_fail(FL_EIO, "%s: read error", p->list);
    if (rc >= 0 && n == 0)
        rc = fl_fail(FL_EFORMAT, "%s: the image list has no samples", p->list);
    free(buf);
    fclose(f);
    *count = n;
    return rc;
}

/* ---- samples ---------------------------------------------------------------------------- */

/* A bad image: counted and skipped, or an error naming list line and file, by policy. */
static int bad_image(imagelist_impl *p, int64_t index, const char *file, bool missing,
                     int code) {
    if (p->cfg.on_bad_image == FL_BAD_IMAGE_SKIP) {
        if (atomic_exchange(&p->bad[index], 1) == 0)
            atomic_fetch_add(missing ? &p->missing : &p->corrupt, 1);
        fl_clear_error();
        return FL_DATASET_SKIP;
    }
    return fl_fail_prefix(code, "%s:%d: %s", p->list, p->lines[index], file);
}

static int read_file(const char *path, uint8_t **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "cannot open: %s", strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        uint8_t *nb = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2) : NULL;
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return fl_fail(FL_ENOMEM, "file too large (1 GiB at most)");
    if (err) {
        free(buf);
        return fl_fail(FL_EIO, "read error");
    }
    *data = buf;
    *len = n;
    return FL_OK;
}

static int imagelist_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x,
                            int32_t *label) {
    imagelist_impl *p = ds->impl;
    const fl_imagelist_config *c = &p->cfg;
    if (epoch >= MAX_EPOCH)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': epoch %lld beyond 2^22",
                       (long long)epoch);
    const char *rel = p->paths + p->offset[index];
    size_t plen = strlen(p->root) + strlen(rel) + 2;
    char *file = malloc(plen);
    if (!file)
        return fl_fail(FL_ENOMEM, "image list: out of memory");
    snprintf(file, plen, "%s/%s", p->root, rel);
    uint8_t *data = NULL;
    size_t len = 0;
    fl_image img = {0};
    int rc = read_file(file, &data, &len);
    if (rc < 0) {
        rc = bad_image(p, index, file, true, rc);
        goto done;
    }
    int W, H;
    if ((rc = fl_jpeg_size(data, len, &W, &H)) < 0) {
        rc = bad_image(p, index, file, false, rc);
        goto done;
    }
    fl_box box;
    bool flip = false;
    if (c->train) {
        fl_rng r;
        fl_rng_init(&r, c->seed, (uint64_t)epoch << 40 | (uint64_t)index);
        fl_random_resized_crop_box(&r, W, H, c->lower_scale, 1.0, c->lower_ratio, c->upper_ratio,
                                   &box);
        flip = c->flip && fl_rng_below(&r, 2) == 1;
    } else {
        box = fl_resize_center_crop_box(W, H, c->resize_short_size, c->crop_size, c->crop_size);
    }
    /* the smallest DCT scale at which the box still covers crop_size pixels */
    int min_w = (int)ceil((double)W * c->crop_size / box.w);
    int min_h = (int)ceil((double)H * c->crop_size / box.h);
    int num, ox, oy;
    if ((rc = fl_jpeg_decode_region(data, len, box, min_w, min_h, &img, &num, &ox, &oy)) < 0) {
        rc = bad_image(p, index, file, false, rc);
        goto done;
    }
    double k = num / 8.0; /* the box in the decoded region's pixels */
    fl_box sbox = {.x = box.x * k - ox, .y = box.y * k - oy, .w = box.w * k, .h = box.h * k};
    fl_image_resample_chw(&img, sbox, c->crop_size, c->crop_size, flip, fl_imagenet_mean,
                          fl_imagenet_std, x);
    *label = p->labels[index];
    rc = FL_OK;
done:
    fl_image_free(&img);
    free(data);
    free(file);
    return rc;
}

static int imagelist_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    return imagelist_get_ex(ds, index, 0, x, label);
}

static void imagelist_destroy(fl_dataset *ds) {
    imagelist_impl *p = ds->impl;
    if (!p)
        return;
    free(p->list);
    free(p->root);
    free(p->paths);
    free(p->offset);
    free(p->labels);
    free(p->lines);
    free((void *)p->bad);
    free(p);
}

static const fl_dataset_ops imagelist_ops = {
    .name = "imagelist",
    .get = imagelist_get,
    .get_ex = imagelist_get_ex,
    .destroy = imagelist_destroy,
};

static int check_config(const fl_imagelist_config *c) {
    if (!c->list || !c->root)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': list and root must be given");
    if (c->classes < 2)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': classes must be >= 2 (got %d)",
                       c->classes);
    if (c->crop_size < 1 || c->crop_size > 4096)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': crop_size %d outside [1, 4096]",
                       c->crop_size);
    if (!c->train && c->resize_short_size < c->crop_size)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': resize_short_size %d is smaller than "
                       "crop_size %d", c->resize_short_size, c->crop_size);
    if (!(c->lower_scale > 0 && c->lower_scale <= 1))
        return fl_fail(FL_EINVAL, "dataset 'imagelist': lower_scale %g outside (0, 1]",
                       c->lower_scale);
    if (!(c->lower_ratio > 0 && c->lower_ratio <= c->upper_ratio && isfinite(c->upper_ratio)))
        return fl_fail(FL_EINVAL, "dataset 'imagelist': need 0 < lower_ratio <= upper_ratio "
                       "(got %g, %g)", c->lower_ratio, c->upper_ratio);
    if (c->on_bad_image != FL_BAD_IMAGE_SKIP && c->on_bad_image != FL_BAD_IMAGE_FAIL)
        return fl_fail(FL_EINVAL, "dataset 'imagelist': unknown bad-image policy %d",
                       (int)c->on_bad_image);
    return FL_OK;
}

fl_dataset *fl_dataset_imagelist_create(const fl_imagelist_config *cfg) {
    FL_ASSERT(cfg);
    fl_dataset *ds = NULL;
    imagelist_impl *p = NULL;
    if (check_config(cfg) < 0)
        return NULL;
    ds = calloc(1, sizeof *ds);
    p = calloc(1, sizeof *p);
    if (!ds || !p) {
        fl_fail(FL_ENOMEM, "dataset 'imagelist': out of memory");
        goto fail;
    }
    ds->ops = &imagelist_ops;
    ds->impl = p;
    p->cfg = *cfg;
    p->list = strdup(cfg->list);
    p->root = strdup(cfg->root);
    if (!p->list || !p->root) {
        fl_fail(FL_ENOMEM, "dataset 'imagelist': out of memory");
        goto fail;
    }
    p->cfg.list = p->list;
    p->cfg.root = p->root;
    atomic_init(&p->missing, 0);
    atomic_init(&p->corrupt, 0);
    int64_t n = 0;
    if (read_list(p, &n) < 0)
        goto fail;
    p->bad = calloc((size_t)n, sizeof *p->bad);
    if (!p->bad) {
        fl_fail(FL_ENOMEM, "dataset 'imagelist': out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < n; i++)
        atomic_init(&p->bad[i], 0);
    ds->size = n;
    ds->ndim = 3;
    ds->shape[0] = 3;
    ds->shape[1] = cfg->crop_size;
    ds->shape[2] = cfg->crop_size;
    ds->sample_numel = 3 * (int64_t)cfg->crop_size * cfg->crop_size;
    ds->num_classes = cfg->classes;
    return ds;

fail:
    if (ds && ds->impl)
        imagelist_destroy(ds);
    else
        free(p);
    free(ds);
    return NULL;
}

int fl_dataset_imagelist_stats(const fl_dataset *ds, fl_imagelist_stats *stats) {
    FL_ASSERT(ds && stats);
    if (ds->ops != &imagelist_ops)
        return fl_fail(FL_EINVAL, "dataset '%s' is not an image list", ds->ops->name);
    imagelist_impl *p = ds->impl;
    stats->missing = atomic_load(&p->missing);
    stats->corrupt = atomic_load(&p->corrupt);
    return FL_OK;
}
