/* sparse_lookup.c - a batch's distinct feature ids and, per bag, where its ids sit among them
 * (fl_sparse_lookup), plus the rows buffer a table's owner fills (fl_sparse_rows).
 * Deduplication is an open-addressing hash table (linear probing, at most half full) that
 * numbers ids as first seen; the distinct ids are then sorted so the order never depends on
 * the batch's, and a counting sort by row builds the transpose backward walks. */
#include "fleet/sparse.h"

#include "core/sort.h"
#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

const char *fl_sparse_pool_name(fl_sparse_pool p) {
    return p == FL_SPARSE_MEAN ? "mean" : "sum";
}

int fl_sparse_pool_parse(const char *name, fl_sparse_pool *p) {
    if (name && strcmp(name, "sum") == 0)
        *p = FL_SPARSE_SUM;
    else if (name && strcmp(name, "mean") == 0)
        *p = FL_SPARSE_MEAN;
    else
        return fl_fail(FL_EINVAL, "sparse pooling '%s' is not sum or mean", name ? name : "");
    return FL_OK;
}

void fl_sparse_lookup_free(fl_sparse_lookup *lk) {
    if (!lk)
        return;
    free(lk->ids);
    free(lk->offsets);
    free(lk->index);
    free(lk->row_start);
    free(lk->occ_bag);
    free(lk->hash_ids);
    free(lk->hash_pos);
    free(lk->fill);
    free(lk->rank);
    memset(lk, 0, sizeof *lk);
}

/* *p grown to hold want elements of size sz (the capacity *cap doubles); 0 or -1. */
static int grow(void **p, int64_t *cap, int64_t want, size_t sz) {
    if (want <= *cap)
        return 0;
    int64_t c = *cap > 0 ? *cap : 64;
    while (c < want)
        c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* Grows arrays[0..n) (element sizes sizes[]) together to hold want elements: the struct keeps
 * one capacity per group. A failed grow leaves the arrays grown so far bigger than *cap says,
 * which is harmless. */
static int grow_group(void **arrays[], const size_t *sizes, int n, int64_t *cap, int64_t want) {
    if (want <= *cap)
        return 0;
    for (int i = 0; i < n; i++) {
        int64_t c = *cap;
        if (grow(arrays[i], &c, want, sizes[i]) < 0)
            return -1;
    }
    int64_t c = *cap > 0 ? *cap : 64;
    while (c < want)
        c *= 2;
    *cap = c;
    return 0;
}

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser: every bit of the id counts */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A distinct id (key) and the number it got when first seen (value), sorted by id. */
typedef fl_key_pair id_seen;

int fl_sparse_lookup_collect(fl_sparse_lookup *lk, const fl_ctr_batch *b, const int *slots,
                             int nslots) {
    FL_ASSERT(lk && b);
    int S = slots ? nslots : b->nslots;
    if (S < 0 || S > FL_CTR_MAX_SLOTS)
        return fl_fail(FL_EINVAL, "sparse lookup: %d slots chosen (0 to %d)", S,
                       FL_CTR_MAX_SLOTS);
    for (int j = 0; j < S; j++) {
        int s = slots ? slots[j] : j;
        if (s < 0 || s >= b->nslots)
            return fl_fail(FL_EINVAL, "sparse lookup: chosen slot %d (entry %d) is not a slot "
                           "of the batch (0 to %d)", s, j, b->nslots - 1);
        lk->slots[j] = s;
    }
    lk->n = lk->nocc = lk->batch = 0;
    lk->nslots = S;
    int64_t B = b->batch, bags = B * S;
    int64_t nocc = 0;
    for (int64_t i = 0; i < B; i++)
        for (int j = 0; j < S; j++) {
            int64_t k = i * b->nslots + lk->slots[j];
            nocc += b->offsets[k + 1] - b->offsets[k];
        }
    if (nocc >= INT32_MAX || bags >= INT32_MAX)
        return fl_fail(FL_EINVAL, "sparse lookup: the batch holds %lld ids in %lld bags (at "
                       "most 2^31 - 1 each)", (long long)nocc, (long long)bags);
    int64_t hcap = 64;
    while (hcap < 2 * nocc)
        hcap *= 2;
    int64_t cap_occ = lk->cap_occ, cap_bags = lk->cap_bags, cap_hash = lk->cap_hash;
    void **occ_arrays[] = {(void **)&lk->index, (void **)&lk->occ_bag};
    size_t occ_sizes[] = {sizeof *lk->index, sizeof *lk->occ_bag};
    /* n <= nocc: the per-id arrays are sized for nocc distinct ids */
    void **id_arrays[] = {(void **)&lk->ids, (void **)&lk->row_start, (void **)&lk->fill,
                          (void **)&lk->rank};
    size_t id_sizes[] = {sizeof(id_seen), sizeof *lk->row_start, sizeof *lk->fill,
                         sizeof *lk->rank};
    void **hash_arrays[] = {(void **)&lk->hash_ids, (void **)&lk->hash_pos};
    size_t hash_sizes[] = {sizeof *lk->hash_ids, sizeof *lk->hash_pos};
    if (grow_group(occ_arrays, occ_sizes, 2, &cap_occ, nocc) < 0 ||
        grow((void **)&lk->offsets, &cap_bags, bags + 1, sizeof *lk->offsets) < 0 ||
        grow_group(id_arrays, id_sizes, 4, &lk->cap_n, nocc + 1) < 0 ||
        grow_group(hash_arrays, hash_sizes, 2, &cap_hash, hcap) < 0)
        return fl_fail(FL_ENOMEM, "sparse lookup: out of memory for %lld ids", (long long)nocc);
    lk->cap_occ = cap_occ;
    lk->cap_bags = cap_bags;
    lk->cap_hash = cap_hash;

    /* 1. number the distinct ids as first seen; index[o] holds that number for now */
    uint64_t hmask = (uint64_t)hcap - 1;
    memset(lk->hash_pos, 0xff, (size_t)hcap * sizeof *lk->hash_pos); /* -1: empty */
    id_seen *pairs = (id_seen *)lk->ids; /* the ids array has room for (id, seen) pairs */
    int64_t n = 0, o = 0;
    lk->offsets[0] = 0;
    for (int64_t i = 0; i < B; i++)
        for (int j = 0; j < S; j++) {
            int64_t len;
            const uint64_t *ids = fl_ctr_bag(b, i, lk->slots[j], &len);
            for (int64_t q = 0; q < len; q++) {
                uint64_t id = ids[q], h = mix(id) & hmask;
                while (lk->hash_pos[h] >= 0 && lk->hash_ids[h] != id)
                    h = (h + 1) & hmask;
                if (lk->hash_pos[h] < 0) {
                    lk->hash_ids[h] = id;
                    lk->hash_pos[h] = (int32_t)n;
                    pairs[n].key = id;
                    pairs[n].value = (uint64_t)n;
                    n++;
                }
                lk->index[o++] = lk->hash_pos[h];
            }
            lk->offsets[i * S + j + 1] = o;
        }
    /* 2. sort the distinct ids (a radix sort, the hash table's ids as scratch: hcap >= 2 n
     * words); rank[first-seen number] = position in ascending order */
    id_seen *sorted = fl_sort_key_pairs(pairs, (id_seen *)lk->hash_ids, n);
    for (int64_t r = 0; r < n; r++)
        lk->rank[sorted[r].value] = (int32_t)r;
    for (int64_t r = 0; r < n; r++) /* in place when sorted is pairs: entry r's id moves to
                                     * ids[r] (r <= 2r) */
        lk->ids[r] = sorted[r].key;
    for (int64_t q = 0; q < nocc; q++)
        lk->index[q] = lk->rank[lk->index[q]];
    /* 3. the transpose: a counting sort of the occurrences by row, stable (bags ascending) */
    memset(lk->row_start, 0, (size_t)(n + 1) * sizeof *lk->row_start);
    for (int64_t q = 0; q < nocc; q++)
        lk->row_start[lk->index[q] + 1]++;
    for (int64_t r = 0; r < n; r++)
        lk->row_start[r + 1] += lk->row_start[r];
    int32_t *fill = lk->fill; /* next free place of each row */
    for (int64_t r = 0; r < n; r++)
        fill[r] = (int32_t)lk->row_start[r];
    for (int64_t k = 0; k < bags; k++)
        for (int64_t q = lk->offsets[k]; q < lk->offsets[k + 1]; q++)
            lk->occ_bag[fill[lk->index[q]]++] = (int32_t)k;
    lk->batch = B;
    lk->n = n;
    lk->nocc = nocc;
    return FL_OK;
}

void fl_sparse_lookup_counts(const fl_sparse_lookup *lk, const int32_t *labels, float *shows,
                             float *clicks) {
    int S = lk->nslots > 0 ? lk->nslots : 1;
    for (int64_t r = 0; r < lk->n; r++) {
        int64_t a = lk->row_start[r], b = lk->row_start[r + 1];
        shows[r] = (float)(b - a);
        int64_t k = 0;
        for (int64_t o = a; labels && o < b; o++)
            k += labels[lk->occ_bag[o] / S] != 0;
        clicks[r] = (float)k;
    }
}

int fl_sparse_rows_prepare(fl_sparse_rows *r, int dim, const fl_sparse_lookup *lk) {
    FL_ASSERT(r && lk);
    if (dim < 1)
        return fl_fail(FL_EINVAL, "sparse rows: dim %d must be at least 1", dim);
    if (r->cap == 0 && (r->ids || r->rows || r->grads))
        return fl_fail(FL_EINVAL, "sparse rows: the arrays are borrowed (cap 0), cannot resize");
    int64_t want = lk->n > 0 ? lk->n : 1;
    r->n = 0;
    if (want > r->cap || dim != r->dim) {
        int64_t c = r->cap > 0 ? r->cap : 64;
        while (c < want)
            c *= 2;
        uint64_t *ids = malloc((size_t)c * sizeof *ids);
        float *rows = malloc((size_t)c * (size_t)dim * sizeof *rows);
        float *grads = malloc((size_t)c * (size_t)dim * sizeof *grads);
        if (!ids || !rows || !grads) {
            free(ids);
            free(rows);
            free(grads);
            return fl_fail(FL_ENOMEM, "sparse rows: out of memory for %lld rows of %d",
                           (long long)c, dim);
        }
        free(r->ids);
        free(r->rows);
        free(r->grads);
        r->ids = ids;
        r->rows = rows;
        r->grads = grads;
        r->cap = c;
    }
    r->dim = dim;
    memcpy(r->ids, lk->ids, (size_t)lk->n * sizeof *r->ids);
    r->n = lk->n;
    return FL_OK;
}

void fl_sparse_rows_free(fl_sparse_rows *r) {
    if (!r)
        return;
    if (r->cap > 0) {
        free(r->ids);
        free(r->rows);
        free(r->grads);
    }
    memset(r, 0, sizeof *r);
}
