/* ctr_idset.c - a set of 64-bit ids (ctr_impl.h's ctr_idset): open addressing with linear
 * probing (Knuth, TAOCP vol. 3, 6.4, algorithm L), key 0 meaning empty and id 0 kept aside as a
 * flag, doubled past half full; listed sorted. Geo mode's touched rows between exchanges
 * (ctr_geo.c). */
#include "train/ctr_impl.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t id_hash(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int idset_grow(ctr_idset *s) {
    int64_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *k = calloc((size_t)cap, sizeof *k);
    if (!k)
        return fl_fail(FL_ENOMEM, "ctr: out of memory for an id set of %lld", (long long)cap);
    for (int64_t i = 0; i < s->cap; i++) {
        if (!s->keys[i])
            continue;
        int64_t j = (int64_t)(id_hash(s->keys[i]) & (uint64_t)(cap - 1));
        while (k[j])
            j = (j + 1) & (cap - 1);
        k[j] = s->keys[i];
    }
    free(s->keys);
    s->keys = k;
    s->cap = cap;
    return FL_OK;
}

int ctr_idset_add(ctr_idset *s, const uint64_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] == 0) {
            s->has_zero = true;
            continue;
        }
        if ((s->n + 1) * 2 > s->cap)
            FL_TRY(idset_grow(s));
        int64_t j = (int64_t)(id_hash(ids[i]) & (uint64_t)(s->cap - 1));
        while (s->keys[j] && s->keys[j] != ids[i])
            j = (j + 1) & (s->cap - 1);
        if (!s->keys[j]) {
            s->keys[j] = ids[i];
            s->n++;
        }
    }
    return FL_OK;
}

void ctr_idset_clear(ctr_idset *s) {
    if (s->keys)
        memset(s->keys, 0, (size_t)s->cap * sizeof *s->keys);
    s->n = 0;
    s->has_zero = false;
}

void ctr_idset_free(ctr_idset *s) {
    free(s->keys);
    memset(s, 0, sizeof *s);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int ctr_idset_sorted(const ctr_idset *s, uint64_t **ids, int64_t *n) {
    int64_t total = s->n + s->has_zero;
    *ids = malloc((size_t)(total > 0 ? total : 1) * sizeof **ids);
    if (!*ids)
        return fl_fail(FL_ENOMEM, "ctr: out of memory for %lld ids", (long long)total);
    int64_t k = 0;
    if (s->has_zero)
        (*ids)[k++] = 0;
    for (int64_t i = 0; i < s->cap; i++)
        if (s->keys[i])
            (*ids)[k++] = s->keys[i];
    qsort(*ids, (size_t)k, sizeof **ids, cmp_u64);
    *n = k;
    return FL_OK;
}
