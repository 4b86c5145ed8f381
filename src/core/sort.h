/* sort.h - sorting (64-bit key, 64-bit value) pairs by key: an LSD radix sort (Knuth, TAOCP
 * vol. 3, 5.2.5), for the distinct ids of a batch (nn/sparse_lookup.c) and a table's rows
 * (ps/table_sparse.c). Private to the library. */
#ifndef FLEET_CORE_SORT_H
#define FLEET_CORE_SORT_H

#include <stdint.h>

typedef struct {
    uint64_t key, value;
} fl_key_pair;

/* Sorts a[0..n) by key, ascending and stable (equal keys keep their order), one pass of 8 bits
 * a key byte, skipping the bytes every key shares (small keys sort in few passes); tmp holds n
 * pairs of scratch. Returns a or tmp, whichever holds the sorted pairs (the other holds
 * garbage). Never fails. */
fl_key_pair *fl_sort_key_pairs(fl_key_pair *a, fl_key_pair *tmp, int64_t n);

#endif
