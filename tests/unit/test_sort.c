/* test_sort.c - the radix sort of (key, value) pairs (src/core/sort.h): against a plain
 * insertion-sort reference on random 64-bit keys with repeats (ascending, stable: equal keys
 * keep their values' order), on small keys (most bytes shared, so passes are skipped and the
 * result may end in either buffer), on keys that differ in one high byte only, and on 0 and 1
 * pairs. */
#include "core/sort.h"

#include "fleet/rng.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void reference(fl_key_pair *a, int64_t n) { /* insertion sort: stable */
    for (int64_t i = 1; i < n; i++) {
        fl_key_pair x = a[i];
        int64_t j = i - 1;
        for (; j >= 0 && a[j].key > x.key; j--)
            a[j + 1] = a[j];
        a[j + 1] = x;
    }
}

/* Sorts n pairs of keys key_of(i) both ways; the values are the input positions. */
static void check_sort(const char *what, int64_t n, uint64_t (*key_of)(fl_rng *, int64_t)) {
    fl_key_pair *a = malloc((size_t)(n ? n : 1) * sizeof *a);
    fl_key_pair *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    fl_key_pair *want = malloc((size_t)(n ? n : 1) * sizeof *want);
    if (!a || !tmp || !want)
        return;
    fl_rng r;
    fl_rng_init(&r, 3, 0);
    for (int64_t i = 0; i < n; i++)
        a[i] = (fl_key_pair){key_of(&r, i), (uint64_t)i};
    memcpy(want, a, (size_t)n * sizeof *a);
    reference(want, n);
    fl_key_pair *got = fl_sort_key_pairs(a, tmp, n);
    CHECK(got == a || got == tmp);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += got[i].key != want[i].key || got[i].value != want[i].value;
    if (bad)
        fprintf(stderr, "%s: %d of %lld pairs out of place\n", what, bad, (long long)n);
    CHECK(bad == 0);
    free(a);
    free(tmp);
    free(want);
}

static uint64_t random_key(fl_rng *r, int64_t i) {
    (void)i;
    uint64_t k = fl_rng_u64(r);
    return k % 5 == 0 ? 12345 : k; /* a fifth share one key: stability shows */
}
static uint64_t small_key(fl_rng *r, int64_t i) { return fl_rng_below(r, 300) + (i & 1); }
static uint64_t high_byte_key(fl_rng *r, int64_t i) {
    return (fl_rng_below(r, 256) << 56) | 0x00ffee0000000000ull;
}

int main(void) {
    check_sort("random keys", 3000, random_key);
    check_sort("small keys", 3001, small_key);
    check_sort("one high byte", 2000, high_byte_key);
    check_sort("one pair", 1, random_key);
    check_sort("no pair", 0, random_key);
    if (test_failures)
        fprintf(stderr, "test_sort: %d failures\n", test_failures);
    return test_failures ? 1 : 0;
}
