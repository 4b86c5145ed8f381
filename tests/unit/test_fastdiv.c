/* test_fastdiv.c - the cuda kernels' division by an invariant divisor (src/kernels/cuda/
 * fastdiv.h: multiply-high and shift) against C's / and %, on the host (the header is plain C
 * too): every divisor up to 4096 and the ones around each power of two up to 2^31 - 1, each with
 * dividends at 0, near multiples of it, near 2^31 - 1 and at random. */
#include "fleet/rng.h"
#include "kernels/cuda/fastdiv.h"
#include "test.h"

#include <stdint.h>

static int64_t bad;

static void check(uint32_t d, uint32_t n) {
    fl_fastdiv f = fl_fastdiv_make(d);
    uint32_t q = fl_fastdiv_q(f, n), r = fl_fastdiv_r(f, n);
    if (q != n / d || r != n % d) {
        if (bad++ < 5)
            fprintf(stderr, "fastdiv: %u / %u gave %u rem %u, want %u rem %u\n", n, d, q, r,
                    n / d, n % d);
    }
}

static void check_divisor(uint32_t d, fl_rng *rng) {
    const uint32_t top = INT32_MAX; /* the largest dividend allowed: 2^31 - 1 */
    for (uint32_t n = 0; n < 64; n++)
        check(d, n);
    for (uint32_t k = 1; k < 64; k++) { /* around multiples of d */
        uint64_t m = (uint64_t)k * d;
        for (int e = -1; e <= 1; e++)
            if (m + (uint64_t)(int64_t)e <= top)
                check(d, (uint32_t)(m + (uint64_t)(int64_t)e));
    }
    uint64_t last = (uint64_t)top / d * d; /* the largest multiple, and its neighbours */
    for (int e = -2; e <= 2; e++)
        if (last + (uint64_t)(int64_t)e <= top)
            check(d, (uint32_t)(last + (uint64_t)(int64_t)e));
    for (uint32_t n = top - 64; n < top; n++)
        check(d, n);
    check(d, top);
    for (int i = 0; i < 64; i++)
        check(d, (uint32_t)(fl_rng_u64(rng) & top));
}

int main(void) {
    fl_rng rng;
    fl_rng_init(&rng, 31, 0);
    for (uint32_t d = 1; d <= 4096; d++)
        check_divisor(d, &rng);
    for (int b = 12; b <= 31; b++)
        for (int e = -3; e <= 3; e++) {
            int64_t d = ((int64_t)1 << b) + e;
            if (d >= 1 && d <= INT32_MAX)
                check_divisor((uint32_t)d, &rng);
        }
    for (int i = 0; i < 2000; i++)
        check_divisor((uint32_t)(fl_rng_u64(&rng) % INT32_MAX) + 1, &rng);
    CHECK(bad == 0);
    TEST_DONE();
}
