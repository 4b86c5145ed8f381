/* ctr_batch.c - the CTR batch (labels, dense rows and per-slot bags of feature ids in one CSR
 * layout, fleet/ctr.h), the hash that turns a categorical value into a feature id, and the
 * transforms that turn Criteo's integer features into floats. */
#include "fleet/ctr.h"

#include "ctr_impl.h"
#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* PaddleRec's CTR-DNN reader (models/rank/dnn/data/get_slot_data.py): cont_min_ and
 * cont_diff_ for I1..I13. */
const int32_t fl_criteo_cont_min[FL_CRITEO_DENSE] = {0, -3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
const int32_t fl_criteo_cont_diff[FL_CRITEO_DENSE] = {20, 603, 100, 50, 64000, 500, 100,
                                                      50, 500, 10, 10, 10, 50};

int fl_ctr_batch_init(fl_ctr_batch *b, int ndense, int nslots, int64_t cap_samples,
                      int64_t cap_ids) {
    memset(b, 0, sizeof *b);
    if (ndense < 0 || nslots < 0 || nslots > FL_CTR_MAX_SLOTS || cap_samples < 0 || cap_ids < 0)
        return fl_fail(FL_EINVAL, "ctr batch: ndense %d, nslots %d (want <= %d), capacities "
                       "%lld and %lld: out of range", ndense, nslots, FL_CTR_MAX_SLOTS,
                       (long long)cap_samples, (long long)cap_ids);
    b->ndense = ndense;
    b->nslots = nslots;
    if (cap_samples < 1)
        cap_samples = 1;
    if (cap_ids < 1)
        cap_ids = 1;
    b->labels = malloc((size_t)cap_samples * sizeof *b->labels);
    b->dense = malloc((size_t)cap_samples * (size_t)(ndense ? ndense : 1) * sizeof *b->dense);
    b->offsets = malloc(((size_t)cap_samples * (size_t)nslots + 1) * sizeof *b->offsets);
    b->ids = malloc((size_t)cap_ids * sizeof *b->ids);
    if (!b->labels || !b->dense || !b->offsets || !b->ids) {
        fl_ctr_batch_free(b);
        return fl_fail(FL_ENOMEM, "ctr batch: out of memory (%lld samples, %lld ids)",
                       (long long)cap_samples, (long long)cap_ids);
    }
    b->offsets[0] = 0;
    b->cap_samples = cap_samples;
    b->cap_ids = cap_ids;
    return FL_OK;
}

void fl_ctr_batch_free(fl_ctr_batch *b) {
    if (!b)
        return;
    free(b->labels);
    free(b->dense);
    free(b->offsets);
    free(b->ids);
    memset(b, 0, sizeof *b);
}

void fl_ctr_batch_clear(fl_ctr_batch *b) {
    b->batch = 0;
    b->offsets[0] = 0;
}

int fl_ctr_batch_reserve(fl_ctr_batch *b, int64_t samples, int64_t ids) {
    if (samples > b->cap_samples) {
        int64_t cap = b->cap_samples;
        while (cap < samples)
            cap *= 2;
        size_t nd = (size_t)(b->ndense ? b->ndense : 1);
        int32_t *l = realloc(b->labels, (size_t)cap * sizeof *l);
        if (l)
            b->labels = l;
        float *d = l ? realloc(b->dense, (size_t)cap * nd * sizeof *d) : NULL;
        if (d)
            b->dense = d;
        int64_t *o = d ? realloc(b->offsets, ((size_t)cap * (size_t)b->nslots + 1) * sizeof *o)
                       : NULL;
        if (!o)
            return fl_fail(FL_ENOMEM, "ctr batch: out of memory (%lld samples)", (long long)cap);
        b->offsets = o;
        b->cap_samples = cap;
    }
    if (ids > b->cap_ids) {
        int64_t cap = b->cap_ids;
        while (cap < ids)
            cap *= 2;
        uint64_t *p = realloc(b->ids, (size_t)cap * sizeof *p);
        if (!p)
            return fl_fail(FL_ENOMEM, "ctr batch: out of memory (%lld ids)", (long long)cap);
        b->ids = p;
        b->cap_ids = cap;
    }
    return FL_OK;
}

int fl_ctr_batch_add(fl_ctr_batch *b, int32_t label, const float *dense, const uint64_t *ids,
                     const int32_t *counts) {
    int64_t total = 0;
    for (int s = 0; s < b->nslots; s++) {
        if (counts[s] < 0)
            return fl_fail(FL_EINVAL, "ctr batch: slot %d has a negative count %d", s,
                           (int)counts[s]);
        total += counts[s];
    }
    int64_t k0 = b->batch * b->nslots, base = b->offsets[k0];
    FL_TRY(fl_ctr_batch_reserve(b, b->batch + 1, base + total));
    b->labels[b->batch] = label;
    if (b->ndense)
        memcpy(b->dense + b->batch * b->ndense, dense, (size_t)b->ndense * sizeof *dense);
    if (total)
        memcpy(b->ids + base, ids, (size_t)total * sizeof *ids);
    for (int s = 0; s < b->nslots; s++)
        b->offsets[k0 + s + 1] = b->offsets[k0 + s] + counts[s];
    b->batch++;
    return FL_OK;
}

int fl_ctr_batch_copy(fl_ctr_batch *dst, const fl_ctr_batch *src) {
    FL_ASSERT(dst->ndense == src->ndense && dst->nslots == src->nslots);
    int64_t nids = fl_ctr_batch_nids(src);
    FL_TRY(fl_ctr_batch_reserve(dst, src->batch, nids));
    memcpy(dst->labels, src->labels, (size_t)src->batch * sizeof *src->labels);
    memcpy(dst->dense, src->dense, (size_t)(src->batch * src->ndense) * sizeof *src->dense);
    memcpy(dst->offsets, src->offsets,
           (size_t)(src->batch * src->nslots + 1) * sizeof *src->offsets);
    memcpy(dst->ids, src->ids, (size_t)nids * sizeof *src->ids);
    dst->batch = src->batch;
    return FL_OK;
}

/* ---- hashing ------------------------------------------------------------------------------ */

uint64_t fl_ctr_hash(const char *s, size_t len) {
    /* FNV-1a, 64-bit offset basis and prime (Fowler, Noll, Vo) */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    /* splitmix64's finaliser (Steele, Lea, Flood, OOPSLA 2014): FNV's high bits depend weakly
     * on the last bytes; this mixes every input bit into every output bit */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h & FL_CTR_HASH_MASK;
}

/* ---- dense transforms --------------------------------------------------------------------- */

float fl_ctr_dense_value(fl_ctr_dense_transform t, int j, int64_t x) {
    switch (t) {
    case FL_CTR_DENSE_MINMAX:
        FL_ASSERT(j >= 0 && j < FL_CRITEO_DENSE);
        return (float)(((double)x - fl_criteo_cont_min[j]) / fl_criteo_cont_diff[j]);
    case FL_CTR_DENSE_LOG:
        return (float)(x >= 0 ? log1p((double)x) : -log1p(-(double)x));
    case FL_CTR_DENSE_RAW:
        return (float)x;
    }
    FL_ASSERT(!"unknown dense transform");
    return 0;
}

static const char *const dense_names[] = {"minmax", "log", "raw"};

const char *fl_ctr_dense_name(fl_ctr_dense_transform t) {
    return (unsigned)t < 3 ? dense_names[t] : "?";
}

int fl_ctr_dense_parse(const char *name, fl_ctr_dense_transform *t) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, dense_names[i]) == 0) {
            *t = (fl_ctr_dense_transform)i;
            return FL_OK;
        }
    return fl_fail(FL_EINVAL, "dense transform '%s' is not one of minmax, log, raw", name);
}
