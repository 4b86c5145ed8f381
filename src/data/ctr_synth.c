/* ctr_synth.c - the synthetic CTR task: Zipf-popular categorical values, log-uniform dense
 * integers and labels from a hidden logistic teacher whose bias is calibrated to a positive
 * rate. Everything derives from (seed, split, index) or (seed, slot, value) through Philox, so
 * samples are random access, identical on every machine, and each id's weight needs no table
 * (vocabularies of 10^8). The ids are those Criteo's reader gives the values' text, so a model
 * sees the same batches from memory and from a file fleet-ctrgen wrote. */
#include "fleet/ctr.h"

#include "ctr_impl.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "zipf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Philox streams under the seed: the top byte says what a stream is for. Sample i of split p
 * is stream TAG_SAMPLE | p << 40 | i; calibration samples are split CALIB_SPLIT. A value's
 * weight is the block at counter (value, 0, slot, TAG_WEIGHT). */
#define TAG_SAMPLE   ((uint64_t)0x43 << 56)
#define TAG_DENSE_W  ((uint64_t)0x44 << 56)
#define TAG_WEIGHT   0x57000000u
#define CALIB_SPLIT  2
#define CALIB_N      (1 << 15)
#define MAX_INDEX    ((int64_t)1 << 40)
#define MAX_DENSE    256
#define MAX_IDS      16
#define HEX_DIGITS   8

struct fl_ctr_synth {
    fl_ctr_synth_config cfg;
    fl_zipf             zipf;
    double              wscale;          /* std of a value's weight */
    double              u[MAX_DENSE];    /* dense weights */
    double              bias;
};

/* One sample before it is written anywhere. */
typedef struct {
    int32_t  counts[FL_CTR_MAX_SLOTS];
    uint32_t values[FL_CTR_MAX_SLOTS * MAX_IDS]; /* slot s's at [s * max_ids, + counts[s]) */
    int64_t  dense[MAX_DENSE];
    uint8_t  missing[MAX_DENSE];
    float    dense_f[MAX_DENSE];                 /* as the model sees them */
    int32_t  label;
    double   p;
} draw_t;

fl_ctr_synth_config fl_ctr_synth_config_default(void) {
    return (fl_ctr_synth_config){.seed = 1, .split = 0, .ndense = FL_CRITEO_DENSE,
                                 .nslots = FL_CRITEO_SLOTS, .vocab = 1000000, .zipf = 1.1,
                                 .max_ids = 1, .missing = 0.1, .ctr = 0.26,
                                 .sparse_scale = 1.5, .dense_scale = 1.0,
                                 .transform = FL_CTR_DENSE_MINMAX};
}

/* Box-Muller on one Philox block: u1 in (0, 1] and u2 in [0, 1) of 53 bits each. */
static double block_normal(const uint32_t out[4]) {
    double u1 = ((double)(((uint64_t)out[0] << 21) ^ (out[1] >> 11)) + 1.0) * 0x1p-53;
    double u2 = (double)(((uint64_t)out[2] << 21) ^ (out[3] >> 11)) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double fl_ctr_synth_weight(const fl_ctr_synth *s, int slot, uint32_t v) {
    uint32_t ctr[4] = {v, 0, (uint32_t)slot, TAG_WEIGHT}, key[2], out[4];
    key[0] = (uint32_t)s->cfg.seed;
    key[1] = (uint32_t)(s->cfg.seed >> 32);
    fl_philox4x32(ctr, key, out);
    return s->wscale * block_normal(out);
}

static double sigmoid(double z) {
    return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
}

/* Draws sample `index` of `split`; the label uses the current bias. */
static void draw(const fl_ctr_synth *s, int split, int64_t index, draw_t *d) {
    const fl_ctr_synth_config *c = &s->cfg;
    fl_rng r;
    fl_rng_init(&r, c->seed, TAG_SAMPLE | (uint64_t)split << 40 | (uint64_t)index);
    double z = s->bias;
    for (int k = 0; k < c->nslots; k++) {
        d->counts[k] = 0;
        if (c->missing > 0 && fl_rng_uniform_f64(&r) < c->missing)
            continue;
        int n = 1 + (int)fl_rng_below(&r, (uint64_t)c->max_ids);
        double sum = 0;
        uint32_t *v = d->values + k * c->max_ids;
        for (int i = 0; i < n; i++) {
            v[i] = (uint32_t)(fl_zipf_sample(&s->zipf, &r) - 1);
            sum += fl_ctr_synth_weight(s, k, v[i]);
        }
        d->counts[k] = n;
        z += sum / n;
    }
    for (int j = 0; j < c->ndense; j++) {
        d->missing[j] = c->missing > 0 && fl_rng_uniform_f64(&r) < c->missing;
        int t = j % FL_CRITEO_DENSE;
        double e = exp(fl_rng_uniform_f64(&r) * log((double)fl_criteo_cont_diff[t] + 2.0));
        d->dense[j] = fl_criteo_cont_min[t] + (int64_t)floor(e) - 1;
        d->dense_f[j] = d->missing[j] ? 0.0f : fl_ctr_dense_value(c->transform, j, d->dense[j]);
        z += s->u[j] * (double)d->dense_f[j];
    }
    d->p = sigmoid(z);
    d->label = fl_rng_uniform_f64(&r) < d->p;
}

static int hex8(uint32_t v, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (int i = HEX_DIGITS - 1; i >= 0; i--, v >>= 4)
        out[i] = digits[v & 15];
    return HEX_DIGITS;
}

/* Bisection for the bias whose mean p over the calibration logits z is `ctr`. */
static double calibrate(const double *z, int n, double ctr) {
    double lo = -40, hi = 40;
    for (int it = 0; it < 100; it++) {
        double mid = 0.5 * (lo + hi), mean = 0;
        for (int i = 0; i < n; i++)
            mean += sigmoid(mid + z[i]);
        if (mean / n < ctr)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

fl_ctr_synth *fl_ctr_synth_create(const fl_ctr_synth_config *cfg) {
    const fl_ctr_synth_config *c = cfg;
    const char *bad = NULL;
    if (c->split != 0 && c->split != 1)
        bad = "split (0 train, 1 validation)";
    else if (c->ndense < 0 || c->ndense > MAX_DENSE)
        bad = "ndense (0..256)";
    else if (c->nslots < 0 || c->nslots > FL_CTR_MAX_SLOTS)
        bad = "nslots (0..256)";
    else if (c->vocab < 1 || c->vocab > (int64_t)UINT32_MAX)
        bad = "vocab (1..2^32-1)";
    else if (!(c->zipf > 0) || !isfinite(c->zipf))
        bad = "zipf (> 0)";
    else if (c->max_ids < 1 || c->max_ids > MAX_IDS)
        bad = "max_ids (1..16)";
    else if (!(c->missing >= 0 && c->missing < 1))
        bad = "missing ([0, 1))";
    else if (!(c->ctr > 0 && c->ctr < 1))
        bad = "ctr ((0, 1))";
    else if (!(c->sparse_scale >= 0) || !isfinite(c->sparse_scale) || !(c->dense_scale >= 0) ||
             !isfinite(c->dense_scale))
        bad = "sparse_scale / dense_scale (>= 0)";
    else if ((unsigned)c->transform > FL_CTR_DENSE_RAW ||
             (c->transform == FL_CTR_DENSE_MINMAX && c->ndense != FL_CRITEO_DENSE))
        bad = "transform (minmax needs ndense 13)";
    if (bad) {
        fl_fail(FL_ECONFIG, "ctr_synth: bad %s", bad);
        return NULL;
    }
    fl_ctr_synth *s = calloc(1, sizeof *s);
    double *z = malloc(CALIB_N * sizeof *z);
    draw_t *d = malloc(sizeof *d);
    if (!s || !z || !d) {
        fl_fail(FL_ENOMEM, "ctr_synth: out of memory");
        goto fail;
    }
    s->cfg = *c;
    if (fl_zipf_init(&s->zipf, c->vocab, c->zipf) < 0)
        goto fail;
    s->wscale = c->nslots ? c->sparse_scale / sqrt((double)c->nslots) : 0;
    fl_rng r;
    fl_rng_init(&r, c->seed, TAG_DENSE_W);
    for (int j = 0; j < c->ndense; j++)
        s->u[j] = fl_rng_normal(&r) * c->dense_scale / sqrt((double)c->ndense);
    s->bias = 0;
    for (int i = 0; i < CALIB_N; i++) {
        draw(s, CALIB_SPLIT, i, d);
        z[i] = log(d->p) - log1p(-d->p); /* the logit without a bias */
    }
    s->bias = calibrate(z, CALIB_N, c->ctr);
    free(z);
    free(d);
    return s;
fail:
    free(z);
    free(d);
    free(s);
    return NULL;
}

void fl_ctr_synth_free(fl_ctr_synth *s) {
    free(s);
}

const fl_ctr_synth_config *fl_ctr_synth_config_of(const fl_ctr_synth *s) {
    return &s->cfg;
}

double fl_ctr_synth_bias(const fl_ctr_synth *s) {
    return s->bias;
}

static int check_index(int64_t index) {
    if (index < 0 || index >= MAX_INDEX)
        return fl_fail(FL_EINVAL, "ctr_synth: sample index %lld outside [0, 2^40)",
                       (long long)index);
    return FL_OK;
}

int fl_ctr_synth_add(const fl_ctr_synth *s, int64_t index, fl_ctr_batch *b, double *p) {
    const fl_ctr_synth_config *c = &s->cfg;
    FL_ASSERT(b->ndense == c->ndense && b->nslots == c->nslots);
    FL_TRY(check_index(index));
    draw_t *d = malloc(sizeof *d);
    if (!d)
        return fl_fail(FL_ENOMEM, "ctr_synth: out of memory");
    draw(s, c->split, index, d);
    int64_t k0 = b->batch * c->nslots, nid = b->offsets[k0], total = 0;
    for (int k = 0; k < c->nslots; k++)
        total += d->counts[k];
    int rc = fl_ctr_batch_reserve(b, b->batch + 1, nid + total);
    if (rc < 0) {
        free(d);
        return rc;
    }
    char hex[HEX_DIGITS];
    for (int k = 0; k < c->nslots; k++) {
        for (int i = 0; i < d->counts[k]; i++) {
            int len = hex8(d->values[k * c->max_ids + i], hex);
            b->ids[nid++] = fl_ctr_id(k, fl_ctr_hash(hex, (size_t)len));
        }
        b->offsets[k0 + k + 1] = nid;
    }
    if (c->ndense)
        memcpy(b->dense + b->batch * c->ndense, d->dense_f, (size_t)c->ndense * sizeof(float));
    b->labels[b->batch++] = d->label;
    if (p)
        *p = d->p;
    free(d);
    return FL_OK;
}

int fl_ctr_synth_batch(const fl_ctr_synth *s, int64_t step, int rank, int world, int64_t B,
                       fl_ctr_batch *b) {
    if (step < 0 || world < 1 || rank < 0 || rank >= world || B < 1)
        return fl_fail(FL_EINVAL, "ctr_synth: step %lld, rank %d, world %d, batch %lld: out of "
                       "range", (long long)step, rank, world, (long long)B);
    fl_ctr_batch_clear(b);
    int64_t first = (step * world + rank) * B;
    for (int64_t i = 0; i < B; i++)
        FL_TRY(fl_ctr_synth_add(s, first + i, b, NULL));
    return FL_OK;
}

size_t fl_ctr_synth_line_max(const fl_ctr_synth *s) {
    const fl_ctr_synth_config *c = &s->cfg;
    return 2 + (size_t)c->ndense * 21 + (size_t)c->nslots * (1 + (size_t)c->max_ids * 9) + 1;
}

int fl_ctr_synth_line(const fl_ctr_synth *s, int64_t index, char *buf, size_t cap, double *p) {
    const fl_ctr_synth_config *c = &s->cfg;
    if (cap < fl_ctr_synth_line_max(s))
        return fl_fail(FL_EINVAL, "ctr_synth: line buffer of %zu bytes, want %zu", cap,
                       fl_ctr_synth_line_max(s));
    FL_TRY(check_index(index));
    draw_t *d = malloc(sizeof *d);
    if (!d)
        return fl_fail(FL_ENOMEM, "ctr_synth: out of memory");
    draw(s, c->split, index, d);
    char *o = buf;
    *o++ = (char)('0' + d->label);
    for (int j = 0; j < c->ndense; j++) {
        *o++ = '\t';
        if (!d->missing[j])
            o += sprintf(o, "%lld", (long long)d->dense[j]);
    }
    for (int k = 0; k < c->nslots; k++) {
        *o++ = '\t';
        for (int i = 0; i < d->counts[k]; i++) {
            if (i)
                *o++ = ',';
            o += hex8(d->values[k * c->max_ids + i], o);
        }
    }
    *o = '\0';
    if (p)
        *p = d->p;
    free(d);
    return (int)(o - buf);
}

/* (p, label) pairs ordered by p */
typedef struct {
    double p;
    int    label;
} scored;

static int by_p(const void *a, const void *b) {
    double x = ((const scored *)a)->p, y = ((const scored *)b)->p;
    return (x > y) - (x < y);
}

int fl_ctr_synth_best_auc(const fl_ctr_synth *s, int64_t n, double *auc) {
    if (n < 2 || n > MAX_INDEX)
        return fl_fail(FL_EINVAL, "ctr_synth: best AUC over %lld samples (want 2 .. 2^40)",
                       (long long)n);
    scored *v = malloc((size_t)n * sizeof *v);
    draw_t *d = malloc(sizeof *d);
    if (!v || !d) {
        free(v);
        free(d);
        return fl_fail(FL_ENOMEM, "ctr_synth: out of memory for %lld samples", (long long)n);
    }
    for (int64_t i = 0; i < n; i++) {
        draw(s, s->cfg.split, i, d);
        v[i] = (scored){d->p, d->label};
    }
    free(d);
    qsort(v, (size_t)n, sizeof *v, by_p);
    /* each positive counts the negatives below it, and half of those tied with it */
    double pairs = 0, neg_below = 0, pos = 0;
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        double gp = 0, gn = 0;
        for (; j < n && v[j].p == v[i].p; j++) {
            gp += v[j].label;
            gn += 1 - v[j].label;
        }
        pairs += gp * (neg_below + 0.5 * gn);
        neg_below += gn;
        pos += gp;
        i = j;
    }
    free(v);
    if (pos == 0 || neg_below == 0)
        return fl_fail(FL_EINVAL, "ctr_synth: the %lld samples hold only %s", (long long)n,
                       pos == 0 ? "negatives" : "positives");
    *auc = pairs / (pos * neg_below);
    return FL_OK;
}
