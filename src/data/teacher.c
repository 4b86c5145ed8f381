/* teacher.c - a learnable synthetic task: x ~ N(0, 1)^F labelled by the argmax of a fixed random
 * teacher MLP F -> H (tanh) -> C (the student-teacher setting). Everything derives from the
 * teacher seed through separate Philox streams, so samples are random access and identical on
 * every machine; the label is computed in double from the f32 features the student sees. */
#include "fleet/data.h"

#include "fleet/rng.h"
#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>

/* Stream layout under the teacher seed: the top bits say what a stream is for, the low bits
 * are the sample index, so the train and validation streams never meet. */
#define STREAM_SHIFT   60
#define STREAM_WEIGHTS ((uint64_t)1 << STREAM_SHIFT)
#define STREAM_CALIB   ((uint64_t)2 << STREAM_SHIFT)
#define STREAM_SPLIT0  ((uint64_t)3 << STREAM_SHIFT)
#define MAX_SIZE       ((int64_t)1 << STREAM_SHIFT)
#define CALIB_SAMPLES  1024
#define STACK_CLASSES  256

typedef struct {
    int64_t  features, hidden;
    int      classes;
    uint64_t stream0; /* stream of sample 0 of this split */
    uint64_t seed;
    double  *w1; /* (HIDDEN, FEATURES) */
    double  *b1; /* (HIDDEN) */
    double  *w2; /* (CLASSES, HIDDEN) */
    double  *b2; /* (CLASSES) */
} teacher_impl;

/* Draws x (FEATURES) from r, rounded to f32 as the student will see it. */
static void draw_x(fl_rng *r, int64_t features, float *x) {
    for (int64_t j = 0; j < features; j++)
        x[j] = (float)fl_rng_normal(r);
}

/* logits (CLASSES) = W2 tanh(W1 x + b1) + b2, in double, in a fixed order. */
static void teacher_logits(const teacher_impl *p, const float *x, double *logits) {
    for (int c = 0; c < p->classes; c++)
        logits[c] = p->b2[c];
    for (int64_t h = 0; h < p->hidden; h++) {
        const double *w = p->w1 + h * p->features;
        double a = p->b1[h];
        for (int64_t j = 0; j < p->features; j++)
            a += w[j] * (double)x[j];
        double t = tanh(a);
        for (int c = 0; c < p->classes; c++)
            logits[c] += p->w2[(int64_t)c * p->hidden + h] * t;
    }
}

static int32_t argmax(const double *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

/* A raw random teacher favours the classes whose output row happens to be long or aligned with
 * the mean hidden activation. Standardising each class's logit over a calibration sample
 * (zero mean, unit variance) gives every class a fair share without changing the function
 * class: it only rescales rows of W2 and sets b2. */
static int calibrate(teacher_impl *p) {
    int rc = FL_OK;
    int C = p->classes;
    float  *x = malloc((size_t)p->features * sizeof *x);
    double *logits = malloc((size_t)C * sizeof *logits);
    double *sum = calloc((size_t)C, sizeof *sum);
    double *sumsq = calloc((size_t)C, sizeof *sumsq);
    if (!x || !logits || !sum || !sumsq) {
        rc = fl_fail(FL_ENOMEM, "dataset 'teacher': out of memory");
        goto fail;
    }
    for (int i = 0; i < CALIB_SAMPLES; i++) {
        fl_rng r;
        fl_rng_init(&r, p->seed, STREAM_CALIB | (uint64_t)i);
        draw_x(&r, p->features, x);
        teacher_logits(p, x, logits);
        for (int c = 0; c < C; c++) {
            sum[c] += logits[c];
            sumsq[c] += logits[c] * logits[c];
        }
    }
    for (int c = 0; c < C; c++) {
        double mean = sum[c] / CALIB_SAMPLES;
        double var = sumsq[c] / CALIB_SAMPLES - mean * mean;
        double sd = var > 1e-24 ? sqrt(var) : 1.0;
        for (int64_t h = 0; h < p->hidden; h++)
            p->w2[(int64_t)c * p->hidden + h] /= sd;
        p->b2[c] = (p->b2[c] - mean) / sd;
    }

fail:
    free(x);
    free(logits);
    free(sum);
    free(sumsq);
    return rc;
}

static int teacher_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    const teacher_impl *p = ds->impl;
    double stack_logits[STACK_CLASSES];
    double *logits = stack_logits;
    if (p->classes > STACK_CLASSES) {
        logits = malloc((size_t)p->classes * sizeof *logits);
        if (!logits)
            return fl_fail(FL_ENOMEM, "dataset 'teacher': out of memory");
    }
    fl_rng r;
    fl_rng_init(&r, p->seed, p->stream0 + (uint64_t)index);
    draw_x(&r, p->features, x);
    teacher_logits(p, x, logits);
    *label = argmax(logits, p->classes);
    if (logits != stack_logits)
        free(logits);
    return FL_OK;
}

static void teacher_destroy(fl_dataset *ds) {
    teacher_impl *p = ds->impl;
    if (!p)
        return;
    free(p->w1);
    free(p);
}

static const fl_dataset_ops teacher_ops = {
    .name = "teacher",
    .get = teacher_get,
    .destroy = teacher_destroy,
};

fl_dataset *fl_dataset_teacher_create(int64_t size, int64_t features, int64_t hidden,
                                      int classes, uint64_t teacher_seed, int split) {
    fl_dataset *ds = NULL;
    teacher_impl *p = NULL;
    if (size < 0 || size > MAX_SIZE) {
        fl_fail(FL_EINVAL, "dataset 'teacher': size %lld outside [0, 2^%d]", (long long)size,
                STREAM_SHIFT);
        goto fail;
    }
    if (features < 1 || hidden < 1) {
        fl_fail(FL_EINVAL, "dataset 'teacher': features and hidden must be >= 1 (got %lld, %lld)",
                (long long)features, (long long)hidden);
        goto fail;
    }
    if (classes < 2) {
        fl_fail(FL_EINVAL, "dataset 'teacher': classes must be >= 2 (got %d)", classes);
        goto fail;
    }
    if (split != 0 && split != 1) {
        fl_fail(FL_EINVAL, "dataset 'teacher': split must be 0 (train) or 1 (validation), got %d",
                split);
        goto fail;
    }
    ds = calloc(1, sizeof *ds);
    p = calloc(1, sizeof *p);
    if (!ds || !p) {
        fl_fail(FL_ENOMEM, "dataset 'teacher': out of memory");
        goto fail;
    }
    p->features = features;
    p->hidden = hidden;
    p->classes = classes;
    p->seed = teacher_seed;
    p->stream0 = STREAM_SPLIT0 + ((uint64_t)split << STREAM_SHIFT);
    /* one block: W1, b1, W2, b2 */
    size_t n = (size_t)(hidden * features + hidden + (int64_t)classes * hidden + classes);
    p->w1 = malloc(n * sizeof *p->w1);
    if (!p->w1) {
        fl_fail(FL_ENOMEM, "dataset 'teacher': cannot allocate the teacher (%zu doubles)", n);
        goto fail;
    }
    p->b1 = p->w1 + hidden * features;
    p->w2 = p->b1 + hidden;
    p->b2 = p->w2 + (int64_t)classes * hidden;

    /* W ~ N(0, 1) / sqrt(fan_in) keeps tanh out of saturation; b1 ~ N(0, 1/4) moves the
     * hidden units' thresholds off the origin so the decision boundary is not a cone. */
    fl_rng r;
    fl_rng_init(&r, teacher_seed, STREAM_WEIGHTS);
    double s1 = 1.0 / sqrt((double)features), s2 = 1.0 / sqrt((double)hidden);
    for (int64_t i = 0; i < hidden * features; i++)
        p->w1[i] = fl_rng_normal(&r) * s1;
    for (int64_t i = 0; i < hidden; i++)
        p->b1[i] = 0.5 * fl_rng_normal(&r);
    for (int64_t i = 0; i < (int64_t)classes * hidden; i++)
        p->w2[i] = fl_rng_normal(&r) * s2;
    for (int c = 0; c < classes; c++)
        p->b2[c] = 0.0;
    if (calibrate(p) < 0)
        goto fail;

    ds->ops = &teacher_ops;
    ds->size = size;
    ds->ndim = 1;
    ds->shape[0] = features;
    ds->sample_numel = features;
    ds->num_classes = classes;
    ds->impl = p;
    return ds;

fail:
    if (p)
        free(p->w1);
    free(p);
    free(ds);
    return NULL;
}
