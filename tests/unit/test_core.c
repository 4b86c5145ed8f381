/* test_core.c - core/: status messages, tensors and dtypes, f16/bf16 conversion (exhaustive
 * where the space is small), the Philox RNG against Random123's known-answer vectors, streams,
 * and timers. */
#include "fleet/log.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "fleet/tensor.h"
#include "test.h"

#include <stdint.h>

static void test_status(void) {
    fl_clear_error();
    CHECK(fl_errmsg()[0] == '\0');
    int rc = fl_fail(FL_ECONFIG, "%s:%d: unknown key '%s'", "a.yaml", 7, "foo");
    CHECK(rc == FL_ECONFIG);
    CHECK(strcmp(fl_errmsg(), "a.yaml:7: unknown key 'foo'") == 0);
    rc = fl_fail_prefix(rc, "loading %s", "config");
    CHECK(rc == FL_ECONFIG);
    CHECK(strcmp(fl_errmsg(), "loading config: a.yaml:7: unknown key 'foo'") == 0);
    CHECK(strcmp(fl_status_name(FL_ETIMEOUT), "FL_ETIMEOUT") == 0);
    /* a message longer than the buffer is truncated, not overflowed */
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fl_fail(FL_EINVAL, "%s", big);
    CHECK(strlen(fl_errmsg()) < sizeof big);
    fl_fail_prefix(FL_EINVAL, "%s", big);
    CHECK(strlen(fl_errmsg()) < sizeof big);
}

static void test_tensor(void) {
    CHECK(fl_dtype_size(FL_DTYPE_F32) == 4 && fl_dtype_size(FL_DTYPE_F64) == 8);
    CHECK(fl_dtype_size(FL_DTYPE_F16) == 2 && fl_dtype_size(FL_DTYPE_BF16) == 2);
    CHECK(fl_dtype_size(FL_DTYPE_I32) == 4 && fl_dtype_size(FL_DTYPE_I64) == 8);
    CHECK(fl_dtype_size(FL_DTYPE_U8) == 1);
    for (int t = 0; t < FL_DTYPE_COUNT; t++) {
        fl_dtype back;
        CHECK_OK(fl_dtype_parse(fl_dtype_name((fl_dtype)t), &back));
        CHECK(back == (fl_dtype)t);
    }
    fl_dtype d;
    CHECK_OK(fl_dtype_parse("bfloat16", &d));
    CHECK(d == FL_DTYPE_BF16);
    CHECK_RC(fl_dtype_parse("f8", &d), FL_EINVAL);
    CHECK_MSG("f8");

    int64_t shape[] = {3, 5, 7};
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 3, shape);
    CHECK(x && x->numel == 105 && x->owns_data && x->device.type == FL_DEVICE_CPU);
    CHECK(((uintptr_t)x->data & 63) == 0);
    CHECK(fl_tensor_nbytes(x) == 420);
    float *xf = x->data;
    int zero = 1;
    for (int i = 0; i < 105; i++)
        zero &= xf[i] == 0.0f;
    CHECK(zero);
    char buf[64];
    CHECK(strcmp(fl_shape_str(3, shape, buf, sizeof buf), "(3, 5, 7)") == 0);

    fl_tensor *v = fl_tensor_create_view(FL_DTYPE_F32, 2, (int64_t[]){15, 7}, x->data);
    CHECK(v && !v->owns_data && v->data == x->data && v->numel == 105);
    CHECK(!fl_tensor_same_shape(x, v));
    fl_tensor_free(v);
    fl_tensor_free(x);
    fl_tensor_free(NULL);

    int64_t empty[] = {0, 4};
    fl_tensor *e = fl_tensor_create(FL_DTYPE_I64, 2, empty);
    CHECK(e && e->numel == 0);
    fl_tensor_free(e);

    int64_t neg[] = {2, -1};
    CHECK(fl_tensor_create(FL_DTYPE_F32, 2, neg) == NULL);
    CHECK_MSG("negative");
    CHECK(fl_tensor_create(FL_DTYPE_F32, FL_MAX_DIMS + 1, shape) == NULL);
    CHECK(fl_shape_numel(0, NULL) == 1);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference f32 -> f16 by searching the nearest representable value (ties to even mantissa),
 * written independently of the bit tricks in half.c. */
static uint16_t f16_nearest(float f) {
    if (isnan(f))
        return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    /* 65520 is the midpoint between the largest finite f16 (65504) and 2^16: rounds to inf */
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint16_t best = 0;
    double best_d = INFINITY;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double d = fabs((double)fl_f16_to_f32((uint16_t)h) - a);
        if (d < best_d || (d == best_d && (h & 1) == 0)) {
            best_d = d;
            best = (uint16_t)h;
        }
    }
    return sign | best;
}

static void test_half(void) {
    /* exhaustive: every finite f16 decodes to a value that encodes back to itself */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = fl_f16_to_f32((uint16_t)h);
        uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
        if (exp == 0x1f && man) {
            bad += !isnan(f);
            bad += (fl_f32_to_f16(f) & 0x7c00) != 0x7c00 || !(fl_f32_to_f16(f) & 0x3ff);
            continue;
        }
        bad += fl_f32_to_f16(f) != (uint16_t)h;
    }
    CHECK(bad == 0);
    /* known values */
    CHECK(fl_f32_to_f16(1.0f) == 0x3c00);
    CHECK(fl_f32_to_f16(-2.0f) == 0xc000);
    CHECK(fl_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(fl_f32_to_f16(65520.0f) == 0x7c00);         /* rounds up to inf */
    CHECK(fl_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(fl_f32_to_f16(1e10f) == 0x7c00);
    CHECK(fl_f32_to_f16(5.9604645e-08f) == 0x0001);   /* smallest subnormal */
    CHECK(fl_f32_to_f16(2.9802322e-08f) == 0x0000);   /* half of it: tie to even = 0 */
    CHECK(fl_f32_to_f16(-0.0f) == 0x8000);
    CHECK(fl_f16_to_f32(0x3555) == 0.333251953125f);
    /* rounding of random f32 values in the f16 range against the nearest-value search */
    fl_rng r;
    fl_rng_init(&r, 42, 0);
    int mism = 0;
    for (int i = 0; i < 300; i++) {
        float f = (float)((fl_rng_uniform_f64(&r) - 0.5) * 2.0 * pow(2.0, (double)(i % 40) - 25));
        if (fl_f32_to_f16(f) != f16_nearest(f))
            mism++;
    }
    /* exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: even mantissa wins */
    CHECK(fl_f32_to_f16(bits_f32(0x3f801000)) == 0x3c00);
    CHECK(fl_f32_to_f16(bits_f32(0x3f803000)) == 0x3c02);
    CHECK(mism == 0);

    /* bf16: truncation of the low 16 bits with round to nearest even */
    CHECK(fl_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(fl_f32_to_bf16(bits_f32(0x3f808000)) == 0x3f80); /* tie, even stays */
    CHECK(fl_f32_to_bf16(bits_f32(0x3f818000)) == 0x3f82); /* tie, odd rounds up */
    CHECK(fl_f32_to_bf16(bits_f32(0x3f808001)) == 0x3f81);
    CHECK(isnan(fl_bf16_to_f32(fl_f32_to_bf16(NAN))));
    CHECK(isinf(fl_bf16_to_f32(fl_f32_to_bf16(INFINITY))));
    int bbad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = fl_bf16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        bbad += fl_f32_to_bf16(f) != (uint16_t)h;
    }
    CHECK(bbad == 0);
    CHECK(f32_bits(fl_bf16_to_f32(0x4049)) == 0x40490000);

    float src[5] = {0.5f, -1.25f, 3.0f, 1e-3f, 100.0f};
    uint16_t h[5], b[5];
    float back[5];
    fl_f32_to_f16_n(src, h, 5);
    fl_f16_to_f32_n(h, back, 5);
    CHECK_CLOSE_F32("f16 roundtrip", back, src, 5, 0, 1e-3);
    fl_f32_to_bf16_n(src, b, 5);
    fl_bf16_to_f32_n(b, back, 5);
    CHECK_CLOSE_F32("bf16 roundtrip", back, src, 5, 0, 8e-3);
}

static void test_rng(void) {
    /* Random123 kat_vectors for philox4x32-10 */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        fl_philox4x32(kat[i], kat[i] + 4, out);
        CHECK(memcmp(out, kat[i] + 6, sizeof out) == 0);
    }

    /* a stream is the Philox sequence of (position, stream) counters under the seed key */
    fl_rng r;
    fl_rng_init(&r, 0x299f31d0a4093822ull, 0);
    uint32_t first = fl_rng_u32(&r);
    uint32_t ctr[4] = {0, 0, 0, 0}, key[2] = {0xa4093822, 0x299f31d0}, out[4];
    fl_philox4x32(ctr, key, out);
    CHECK(first == out[0]);

    /* same seed and stream: same numbers; another stream or seed: different */
    fl_rng a, b, c, d;
    fl_rng_init(&a, 7, 3);
    fl_rng_init(&b, 7, 3);
    fl_rng_init(&c, 7, 4);
    fl_rng_init(&d, 8, 3);
    int same = 1, diff_stream = 0, diff_seed = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = fl_rng_u32(&a);
        same &= x == fl_rng_u32(&b);
        diff_stream += x != fl_rng_u32(&c);
        diff_seed += x != fl_rng_u32(&d);
    }
    CHECK(same && diff_stream > 990 && diff_seed > 990);

    /* uniform in [0, 1) with plausible moments; below() unbiased-looking; normal moments */
    fl_rng_init(&r, 1, 0);
    double s = 0, s2 = 0;
    int n = 200000, in_range = 1;
    for (int i = 0; i < n; i++) {
        float u = fl_rng_uniform(&r);
        in_range &= u >= 0.0f && u < 1.0f;
        s += u;
    }
    CHECK(in_range);
    CHECK_NEAR(s / n, 0.5, 0.005);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++)
        counts[fl_rng_below(&r, 7)]++;
    for (int i = 0; i < 7; i++)
        CHECK(counts[i] > 9400 && counts[i] < 10600);
    s = s2 = 0;
    for (int i = 0; i < n; i++) {
        double z = fl_rng_normal(&r);
        s += z;
        s2 += z * z;
    }
    CHECK_NEAR(s / n, 0.0, 0.01);
    CHECK_NEAR(s2 / n, 1.0, 0.02);

    /* fl_rng_normals is fl_rng_normal called n times, bit for bit, and leaves r where they do:
     * from a block boundary and from inside a block (a u32 drawn first), for counts around its
     * batch of blocks, across the 2^32 step of the position counter, with a large seed and
     * stream (every counter and key word non-zero) */
    static const int64_t counts_n[] = {0, 1, 7, 8, 9, 17, 1000};
    for (int skew = 0; skew < 2; skew++)
        for (size_t ci = 0; ci < sizeof counts_n / sizeof counts_n[0]; ci++) {
            int64_t nn = counts_n[ci];
            double want[1000], got[1000];
            fl_rng_init(&a, 0x123456789abcdefull, 0xfedcba9876543210ull);
            a.position = 0xfffffffcull;
            if (skew)
                (void)fl_rng_u32(&a);
            b = a;
            for (int64_t i = 0; i < nn; i++)
                want[i] = fl_rng_normal(&a);
            fl_rng_normals(&b, got, nn);
            CHECK(memcmp(want, got, (size_t)nn * sizeof *got) == 0);
            CHECK(a.position == b.position && a.used == b.used);
            CHECK(fl_rng_u32(&a) == fl_rng_u32(&b) && fl_rng_normal(&a) == fl_rng_normal(&b));
        }

    /* shuffle is a permutation, deterministic under the seed */
    int64_t p1[100], p2[100];
    for (int i = 0; i < 100; i++)
        p1[i] = p2[i] = i;
    fl_rng_init(&a, 99, 1);
    fl_rng_init(&b, 99, 1);
    fl_rng_shuffle(&a, p1, 100);
    fl_rng_shuffle(&b, p2, 100);
    CHECK(memcmp(p1, p2, sizeof p1) == 0);
    int seen[100] = {0}, moved = 0;
    for (int i = 0; i < 100; i++) {
        seen[p1[i]]++;
        moved += p1[i] != i;
    }
    int perm = 1;
    for (int i = 0; i < 100; i++)
        perm &= seen[i] == 1;
    CHECK(perm && moved > 80);
}

static void test_log_and_timer(void) {
    fl_log_level lv;
    CHECK_OK(fl_log_parse_level("warn", &lv));
    CHECK(lv == FL_LOG_WARN);
    CHECK_RC(fl_log_parse_level("loud", &lv), FL_EINVAL);
    fl_log_level old = fl_log_get_level();
    fl_log_set_level(FL_LOG_ERROR);
    CHECK(fl_log_get_level() == FL_LOG_ERROR);
    FL_INFO("this line is filtered out");
    fl_log_set_level(old);

    fl_timer t;
    fl_timer_reset(&t);
    double t0 = fl_now();
    fl_timer_start(&t);
    volatile double x = 0;
    for (int i = 0; i < 100000; i++)
        x += i;
    double dt = fl_timer_stop(&t);
    CHECK(dt >= 0 && t.total == dt && t.count == 1);
    CHECK(fl_now() >= t0);
}

int main(void) {
    test_status();
    test_tensor();
    test_half();
    test_rng();
    test_log_and_timer();
    TEST_DONE();
}
