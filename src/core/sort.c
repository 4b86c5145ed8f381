/* sort.c - the LSD radix sort of (key, value) pairs of sort.h. */
#include "core/sort.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

fl_key_pair *fl_sort_key_pairs(fl_key_pair *a, fl_key_pair *tmp, int64_t n) {
    enum { B = 8 };
    size_t count[B][256]; /* 16 KiB */
    memset(count, 0, sizeof count);
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < B; b++)
            count[b][(a[i].key >> (8 * b)) & 255]++;
    fl_key_pair *src = a, *dst = tmp;
    for (int b = 0; b < B; b++) {
        size_t *c = count[b];
        bool trivial = false;
        for (int d = 0; d < 256; d++)
            if (c[d] == (size_t)n) {
                trivial = true;
                break;
            }
        if (trivial)
            continue;
        size_t off = 0;
        for (int d = 0; d < 256; d++) {
            size_t k = c[d];
            c[d] = off;
            off += k;
        }
        for (int64_t i = 0; i < n; i++)
            dst[c[(src[i].key >> (8 * b)) & 255]++] = src[i];
        fl_key_pair *x = src;
        src = dst;
        dst = x;
    }
    return src;
}
