/* test_ref_lowp.c - the ref table's f16 / bf16 operations (backend.h, "Low dtypes") against the
 * same table's f64 operations on the same values: inputs are drawn already representable in
 * the low dtype, the f64 op runs on them (weights rounded as a low plan reads them, f32 biases
 * as they are), and its result, rounded to the low dtype, must be the low op's within one unit
 * in the last place (ulp). One ulp, not zero: the test rounds the f64 result through f32 (a
 * cast to f32, then to the low dtype: two roundings, which miss by one unit next to a tie,
 * where the table rounds once), and where the two ops sum in different orders (im2col + gemm
 * against direct loops, two batch-norm formulas) their doubles differ in the last bits and may
 * fall on either side of a rounding boundary; neither moves a result further than the
 * neighbouring low value. Copies (reorder, slicing, padding, the residual add's gradient) must
 * be exact. Also: the one rounding itself at every tie of both dtypes, f16's overflow, f32
 * parameter gradients (a convolution's f32 dw is the low-rounded gradient added in f32), both
 * layouts, and the cpu and onednn tables refusing a low convolution plan with a message. */
#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "fleet/tensor.h"
#include "backend_cases.h"
#include "kernels/cpu/ref_lowp.h"
#include "test.h"

#include <float.h>
#include <stdint.h>

static const fl_dtype lows[2] = {FL_DTYPE_F16, FL_DTYPE_BF16};
static const fl_backend *ref;
static fl_rng rng;

static void *xalloc(size_t bytes) {
    void *p = fl_alloc_aligned(bytes > 0 ? bytes : 64);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(p, 0, bytes > 0 ? bytes : 64);
    return p;
}

static double lowval(fl_dtype t, uint16_t h) {
    return t == FL_DTYPE_F16 ? fl_f16_to_f32(h) : fl_bf16_to_f32(h);
}
static uint16_t f32_to_low(fl_dtype t, float f) {
    return t == FL_DTYPE_F16 ? fl_f32_to_f16(f) : fl_f32_to_bf16(f);
}
/* the test's rounding of an f64 result: through f32, so two roundings (see the top) */
static uint16_t to_low(fl_dtype t, double v) { return f32_to_low(t, (float)v); }

/* A position on the number line: neighbouring low values differ by 1 (+0 and -0 both 0). */
static int32_t ord(uint16_t h) { return h & 0x8000 ? -(int32_t)(h & 0x7fff) : (int32_t)h; }

/* n low values: bits h and the same values as doubles d */
typedef struct {
    int64_t   n;
    uint16_t *h;
    double   *d;
} lowbuf;

static lowbuf lb_new(int64_t n) {
    return (lowbuf){n, xalloc((size_t)n * 2), xalloc((size_t)n * sizeof(double))};
}
/* uniform in [lo, hi), then rounded to t */
static lowbuf lb_rand(fl_dtype t, int64_t n, double lo, double hi) {
    lowbuf b = lb_new(n);
    for (int64_t i = 0; i < n; i++) {
        b.h[i] = to_low(t, lo + (hi - lo) * fl_rng_uniform_f64(&rng));
        b.d[i] = lowval(t, b.h[i]);
    }
    return b;
}
static void lb_free(lowbuf *b) { fl_free_aligned(b->h), fl_free_aligned(b->d); }

static float *rand_f32(int64_t n, double lo, double hi) {
    float *p = xalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(lo + (hi - lo) * fl_rng_uniform_f64(&rng));
    return p;
}

/* got (low) against the f64 results want, rounded to t: at most maxulp apart */
static void check_low(const char *what, fl_dtype t, const uint16_t *got, const double *want,
                      int64_t n, int maxulp) {
    int32_t worst = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t d = abs(ord(got[i]) - ord(to_low(t, want[i])));
        if (d > maxulp && first < 0)
            first = i;
        worst = d > worst ? d : worst;
    }
    if (first >= 0) {
        fprintf(stderr, "%s [%s]: [%lld] got %.9g (0x%04x), want %.9g rounded to %.9g: %d ulp "
                "apart (at most %d here; worst %d)\n", what, fl_dtype_name(t), (long long)first,
                lowval(t, got[first]), got[first], want[first],
                lowval(t, to_low(t, want[first])), abs(ord(got[first]) - ord(to_low(t, want[first]))),
                maxulp, worst);
        test_failures++;
    }
}

/* f32 results against the f64 ones: within one f32 ulp */
static void check_f32(const char *what, fl_dtype t, const float *got, const double *want,
                      int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float w = (float)want[i];
        if (got[i] != w && got[i] != nextafterf(w, INFINITY) && got[i] != nextafterf(w, -INFINITY)) {
            fprintf(stderr, "%s [%s]: [%lld] got %.9g want %.9g (f32)\n", what,
                    fl_dtype_name(t), (long long)i, got[i], want[i]);
            test_failures++;
            return;
        }
    }
}

/* (N, C, HW) low bits from NCHW to layout l, and back */
static uint16_t *to_layout(fl_dtype t, fl_layout l, const uint16_t *x, int64_t n, int64_t c,
                           int64_t hw) {
    uint16_t *y = xalloc((size_t)(n * c * hw) * 2);
    if (l == FL_LAYOUT_NHWC)
        ref->reorder(t, true, n, c, hw, x, y);
    else
        memcpy(y, x, (size_t)(n * c * hw) * 2);
    return y;
}
static uint16_t *from_layout(fl_dtype t, fl_layout l, const uint16_t *x, int64_t n, int64_t c,
                             int64_t hw) {
    uint16_t *y = xalloc((size_t)(n * c * hw) * 2);
    if (l == FL_LAYOUT_NHWC)
        ref->reorder(t, false, n, c, hw, x, y);
    else
        memcpy(y, x, (size_t)(n * c * hw) * 2);
    return y;
}

/* --- the one rounding --- */

/* At every midpoint m between neighbouring finite values of t: m goes to the even one, the
 * doubles just above and below it to the upper and lower one; values of t stay. And what a
 * cast through f32 gets wrong there (so that the test sees the difference it is about). */
static void test_rounding(fl_dtype t) {
    uint16_t maxfin = t == FL_DTYPE_F16 ? 0x7bff : 0x7f7f;
    int64_t naive_wrong = 0;
    for (int s = 0; s < 2; s++)
        for (uint16_t m = 0; m < maxfin; m++) {
            uint16_t h = (uint16_t)(m | (s ? 0x8000 : 0)), h1 = (uint16_t)(h + 1);
            double a = lowval(t, h), b = lowval(t, h1), mid = (a + b) / 2;
            double up = nextafter(mid, b > a ? INFINITY : -INFINITY);
            double down = nextafter(mid, b > a ? -INFINITY : INFINITY);
            uint16_t even = (h & 1) ? h1 : h;
            if (ref_lowp_from_double(t, a) != h || ref_lowp_from_double(t, mid) != even ||
                ref_lowp_from_double(t, up) != h1 || ref_lowp_from_double(t, down) != h) {
                fprintf(stderr, "rounding [%s]: between 0x%04x and 0x%04x: got 0x%04x 0x%04x "
                        "0x%04x 0x%04x\n", fl_dtype_name(t), h, h1, ref_lowp_from_double(t, a),
                        ref_lowp_from_double(t, mid), ref_lowp_from_double(t, up),
                        ref_lowp_from_double(t, down));
                test_failures++;
                return;
            }
            naive_wrong += to_low(t, up) != h1 || to_low(t, down) != h;
        }
    CHECK(naive_wrong > 0);
    /* beyond the range: f16 overflows to inf from its last midpoint (65520) on, bf16 only
     * beyond f32's; tiny values go to a signed zero; NaN stays NaN */
    uint16_t inf = t == FL_DTYPE_F16 ? 0x7c00 : 0x7f80;
    CHECK(ref_lowp_from_double(t, 1e300) == inf);
    CHECK(ref_lowp_from_double(t, -1e300) == (inf | 0x8000));
    CHECK(ref_lowp_from_double(t, INFINITY) == inf);
    CHECK(ref_lowp_from_double(t, 1e-300) == 0);
    CHECK(ref_lowp_from_double(t, -1e-300) == 0x8000);
    CHECK(isnan(lowval(t, ref_lowp_from_double(t, NAN))));
    if (t == FL_DTYPE_F16) {
        CHECK(ref_lowp_from_double(t, 65520.0) == inf);
        CHECK(ref_lowp_from_double(t, nextafter(65520.0, 0)) == 0x7bff);
        CHECK(ref_lowp_from_double(t, 0x1p-25) == 0);                      /* a tie: even */
        CHECK(ref_lowp_from_double(t, nextafter(0x1p-25, 1)) == 1);        /* 2^-24 */
    } else {
        CHECK(ref_lowp_from_double(t, 70000.0) == to_low(t, 70000.0));    /* finite */
        CHECK(ref_lowp_from_double(t, (double)FLT_MAX * 1.5) == inf);
    }
}

/* --- elementwise ops and reductions --- */

static void test_elementwise(fl_dtype t) {
    for (size_t ci = 0; ci < NCOUNTS; ci++) {
        int64_t n = counts[ci];
        char what[96];
        lowbuf a = lb_rand(t, n, -4, 4), b = lb_rand(t, n, -4, 4), y = lb_new(n);
        double *w = xalloc((size_t)n * sizeof(double));
        /* fill */
        ref->fill(t, y.h, n, -0.1);
        ref->fill(FL_DTYPE_F64, w, n, -0.1);
        check_low("fill", t, y.h, w, n, 1);
        /* activations, forward and backward (tanh and sigmoid from y) */
        for (int act = 0; act < FL_ACT_COUNT; act++) {
            snprintf(what, sizeof what, "act_forward %s, %lld", fl_act_name((fl_act)act),
                     (long long)n);
            ref->act_forward(t, (fl_act)act, a.h, y.h, n);
            ref->act_forward(FL_DTYPE_F64, (fl_act)act, a.d, w, n);
            check_low(what, t, y.h, w, n, 1);
            lowbuf yy = lb_new(n);
            memcpy(yy.h, y.h, (size_t)n * 2);
            for (int64_t i = 0; i < n; i++)
                yy.d[i] = lowval(t, yy.h[i]);
            snprintf(what, sizeof what, "act_backward %s, %lld", fl_act_name((fl_act)act),
                     (long long)n);
            ref->act_backward(t, (fl_act)act, a.h, yy.h, b.h, y.h, n);
            ref->act_backward(FL_DTYPE_F64, (fl_act)act, a.d, yy.d, b.d, w, n);
            check_low(what, t, y.h, w, n, 1);
            lb_free(&yy);
        }
        /* the residual add, forward with and without relu; backward copies exactly */
        for (int relu = 0; relu < 2; relu++) {
            ref->add_forward(t, a.h, b.h, y.h, n, relu);
            ref->add_forward(FL_DTYPE_F64, a.d, b.d, w, n, relu);
            check_low(relu ? "add_forward relu" : "add_forward", t, y.h, w, n, 1);
            lowbuf da = lb_new(n), db = lb_new(n);
            for (int64_t i = 0; i < n; i++)
                y.d[i] = lowval(t, y.h[i]);
            ref->add_backward(t, y.h, b.h, da.h, db.h, n, relu);
            ref->add_backward(FL_DTYPE_F64, y.d, b.d, da.d, w, n, relu);
            check_low("add_backward da", t, da.h, da.d, n, 0);
            check_low("add_backward db", t, db.h, w, n, 0);
            ref->add_backward(t, y.h, a.h, NULL, db.h, n, relu);
            ref->add_backward(FL_DTYPE_F64, y.d, a.d, NULL, w, n, relu);
            check_low("add_backward db only", t, db.h, w, n, 0);
            lb_free(&da), lb_free(&db);
        }
        /* dropout: the f64 mask on the same seed */
        ref->dropout_mask(t, 77, 3, 0.3, a.h, y.h, n);
        ref->dropout_mask(FL_DTYPE_F64, 77, 3, 0.3, a.d, w, n);
        check_low("dropout_mask", t, y.h, w, n, 1);
        /* axpy, scale (activation gradients summed where a layer's output has two readers) */
        memcpy(y.h, b.h, (size_t)n * 2), memcpy(w, b.d, (size_t)n * sizeof(double));
        ref->axpy(t, n, -0.7, a.h, y.h);
        ref->axpy(FL_DTYPE_F64, n, -0.7, a.d, w);
        check_low("axpy", t, y.h, w, n, 1);
        memcpy(y.h, b.h, (size_t)n * 2), memcpy(w, b.d, (size_t)n * sizeof(double));
        ref->scale(t, n, 1.0 / 3, y.h);
        ref->scale(FL_DTYPE_F64, n, 1.0 / 3, w);
        check_low("scale", t, y.h, w, n, 1);
        /* sum and sumsq: exact values in double, summed in the same order */
        CHECK(ref->sum(t, a.h, n) == ref->sum(FL_DTYPE_F64, a.d, n));
        CHECK(ref->sumsq(t, a.h, n) == ref->sumsq(FL_DTYPE_F64, a.d, n));
        lb_free(&a), lb_free(&b), lb_free(&y), fl_free_aligned(w);
    }
    /* f16 overflows where bf16 does not */
    uint16_t big[2];
    ref->fill(t, big, 2, 40000.0);
    ref->scale(t, 2, 2.0, big);
    CHECK(big[0] == to_low(t, 80000.0));
    CHECK(t == FL_DTYPE_F16 ? isinf(lowval(t, big[1])) : !isinf(lowval(t, big[1])));
}

/* gemm with every transposition and padded leading dimensions; add_bias and sum_rows with
 * f32 bias and db */
static void test_gemm_bias(fl_dtype t) {
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++)
        for (int tr = 0; tr < 4; tr++)
            for (size_t ab = 0; ab < sizeof gemm_ab / sizeof gemm_ab[0]; ab++) {
                int64_t m = gemm_sizes[s][0], n = gemm_sizes[s][1], k = gemm_sizes[s][2];
                if (m * n * k > 100000 && (tr || ab != 1))
                    continue; /* the large ones once */
                bool ta = tr & 1, tb = tr & 2;
                int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
                lowbuf a = lb_rand(t, (ta ? k : m) * lda, -2, 2),
                       b = lb_rand(t, (tb ? n : k) * ldb, -2, 2),
                       c = lb_rand(t, m * ldc, -2, 2);
                ref->gemm(t, ta, tb, m, n, k, gemm_ab[ab][0], a.h, lda, b.h, ldb,
                          gemm_ab[ab][1], c.h, ldc);
                ref->gemm(FL_DTYPE_F64, ta, tb, m, n, k, gemm_ab[ab][0], a.d, lda, b.d, ldb,
                          gemm_ab[ab][1], c.d, ldc);
                char what[96];
                snprintf(what, sizeof what, "gemm %lldx%lldx%lld trans %d%d ab %zu",
                         (long long)m, (long long)n, (long long)k, ta, tb, ab);
                check_low(what, t, c.h, c.d, m * ldc, 1);
                lb_free(&a), lb_free(&b), lb_free(&c);
            }
    for (size_t s = 0; s < NSHAPES2D; s++) {
        int64_t rows = shapes2d[s][0], cols = shapes2d[s][1];
        lowbuf y = lb_rand(t, rows * cols, -3, 3);
        float *bias = rand_f32(cols, -1, 1), *db = rand_f32(cols, -1, 1);
        double *b64 = xalloc((size_t)cols * sizeof(double)),
               *db64 = xalloc((size_t)cols * sizeof(double));
        for (int64_t j = 0; j < cols; j++)
            b64[j] = bias[j], db64[j] = db[j];
        ref->sum_rows(t, y.h, db, rows, cols, true); /* onto db's random values */
        ref->sum_rows(FL_DTYPE_F64, y.d, db64, rows, cols, true);
        check_f32("sum_rows accumulate", t, db, db64, cols);
        ref->sum_rows(t, y.h, db, rows, cols, false);
        ref->sum_rows(FL_DTYPE_F64, y.d, db64, rows, cols, false);
        check_f32("sum_rows", t, db, db64, cols);
        ref->add_bias(t, y.h, bias, rows, cols);
        ref->add_bias(FL_DTYPE_F64, y.d, b64, rows, cols);
        check_low("add_bias", t, y.h, y.d, rows * cols, 1);
        lb_free(&y), fl_free_aligned(bias), fl_free_aligned(db), fl_free_aligned(b64),
            fl_free_aligned(db64);
    }
}

/* --- the ops with a layout: each in NCHW and NHWC against f64 in NCHW --- */

static void test_channel_ops(fl_dtype t, fl_layout l) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {2, 3, 5}, {3, 7, 13}, {2, 16, 49}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], e = n * c * hw;
        lowbuf x = lb_rand(t, e, -3, 3), dy = lb_rand(t, e, -3, 3), sc = lb_rand(t, n * c, 0, 1);
        uint16_t *xl = to_layout(t, l, x.h, n, c, hw), *dyl = to_layout(t, l, dy.h, n, c, hw);
        uint16_t *yl = xalloc((size_t)e * 2), *ds = xalloc((size_t)(n * c) * 2);
        double *w = xalloc((size_t)e * sizeof(double)), *ds64 = xalloc((size_t)(n * c) * 8);
        /* squeeze-and-excitation's scale: s and ds low */
        ref->channel_mul_forward(t, l, n, c, hw, xl, sc.h, yl);
        ref->channel_mul_forward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, hw, x.d, sc.d, w);
        uint16_t *y = from_layout(t, l, yl, n, c, hw);
        check_low("channel_mul_forward", t, y, w, e, 1);
        fl_free_aligned(y);
        ref->channel_mul_backward(t, l, n, c, hw, xl, sc.h, dyl, yl, ds);
        ref->channel_mul_backward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, hw, x.d, sc.d, dy.d, w,
                                  ds64);
        y = from_layout(t, l, yl, n, c, hw);
        check_low("channel_mul_backward dx", t, y, w, e, 1);
        check_low("channel_mul_backward ds", t, ds, ds64, n * c, 1);
        fl_free_aligned(y);
        ref->channel_mul_backward(t, l, n, c, hw, xl, sc.h, dyl, NULL, ds);
        check_low("channel_mul_backward ds only", t, ds, ds64, n * c, 1);
        /* concatenation: c channels at offset 2 of c + 3, and back: exact copies */
        int64_t oc = c + 3, off = 2, ee = n * oc * hw;
        lowbuf big = lb_rand(t, ee, -1, 1);
        uint16_t *bigl = to_layout(t, l, big.h, n, oc, hw);
        ref->channel_slice(t, l, n, hw, c, xl, oc, off, bigl, true);
        ref->channel_slice(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, hw, c, x.d, oc, off, big.d, true);
        y = from_layout(t, l, bigl, n, oc, hw);
        check_low("channel_slice forward", t, y, big.d, ee, 0);
        fl_free_aligned(y);
        ref->channel_slice(t, l, n, hw, c, yl, oc, off, bigl, false);
        ref->channel_slice(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, hw, c, w, oc, off, big.d, false);
        y = from_layout(t, l, yl, n, c, hw);
        check_low("channel_slice backward", t, y, w, e, 0);
        fl_free_aligned(y);
        lb_free(&big), fl_free_aligned(bigl);
        lb_free(&x), lb_free(&dy), lb_free(&sc), fl_free_aligned(xl), fl_free_aligned(dyl),
            fl_free_aligned(yl), fl_free_aligned(ds), fl_free_aligned(w), fl_free_aligned(ds64);
    }
    /* option-A padding: (c, h, w) -> (oc, ceil(h / 2), ceil(w / 2)) and back, exact */
    int64_t n = 2, c = 3, h = 5, wd = 7, oc = 8, st = 2, oh = 3, ow = 4;
    lowbuf x = lb_rand(t, n * c * h * wd, -2, 2), y = lb_new(n * oc * oh * ow);
    uint16_t *xl = to_layout(t, l, x.h, n, c, h * wd), *yl = xalloc((size_t)y.n * 2);
    ref->channel_pad(t, l, n, c, h, wd, st, oc, xl, yl, true);
    ref->channel_pad(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, h, wd, st, oc, x.d, y.d, true);
    uint16_t *got = from_layout(t, l, yl, n, oc, oh * ow);
    check_low("channel_pad forward", t, got, y.d, y.n, 0);
    fl_free_aligned(got);
    ref->channel_pad(t, l, n, c, h, wd, st, oc, xl, yl, false);
    ref->channel_pad(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, h, wd, st, oc, x.d, y.d, false);
    got = from_layout(t, l, xl, n, c, h * wd);
    check_low("channel_pad backward", t, got, x.d, x.n, 0);
    fl_free_aligned(got), fl_free_aligned(xl), fl_free_aligned(yl), lb_free(&x), lb_free(&y);
}

/* reorder: the f64 table's, both ways, exact */
static void test_reorder(fl_dtype t) {
    int64_t n = 3, c = 5, hw = 7, e = n * c * hw;
    lowbuf x = lb_rand(t, e, -1, 1), y = lb_new(e), z = lb_new(e);
    ref->reorder(t, true, n, c, hw, x.h, y.h);
    ref->reorder(FL_DTYPE_F64, true, n, c, hw, x.d, y.d);
    check_low("reorder to NHWC", t, y.h, y.d, e, 0);
    ref->reorder(t, false, n, c, hw, y.h, z.h);
    check_low("reorder back", t, z.h, x.d, e, 0);
    lb_free(&x), lb_free(&y), lb_free(&z);
}

static void test_pool(fl_dtype t, fl_layout l) {
    for (size_t pc = 0; pc < N_POOL_CASES; pc++) {
        const pool_case *p = &pool_cases[pc];
        if (p->n * p->c * p->h * p->w > 100000)
            continue; /* the large ones are the fast tables' */
        fl_conv_geom g = {.c = p->c, .h = p->h, .w = p->w, .kh = p->kh, .kw = p->kw,
                          .sh = p->sh, .sw = p->sw, .ph = p->ph, .pw = p->pw, .dh = p->dh,
                          .dw = p->dw};
        CHECK(fl_conv_geom_out(&g));
        int64_t hw = p->h * p->w, ohw = g.oh * g.ow, ein = p->n * p->c * hw,
                eout = p->n * p->c * ohw;
        lowbuf x = lb_rand(t, ein, -2, 2), dy = lb_rand(t, eout, -2, 2);
        if (p->ties) /* mostly 0, some 1 and 2 */
            for (int64_t i = 0; i < ein; i++) {
                x.d[i] = (double)(fl_rng_below(&rng, 5) > 2 ? fl_rng_below(&rng, 3) : 0);
                x.h[i] = to_low(t, x.d[i]);
            }
        uint16_t *xl = to_layout(t, l, x.h, p->n, p->c, hw), *dyl = to_layout(t, l, dy.h, p->n, p->c, ohw);
        uint16_t *yl = xalloc((size_t)eout * 2), *dxl = xalloc((size_t)ein * 2);
        double *y64 = xalloc((size_t)eout * 8), *dx64 = xalloc((size_t)ein * 8);
        for (int pool = 0; pool < 2; pool++) {
            char what[128];
            snprintf(what, sizeof what, "%s pool %s, %s", pool ? "avg" : "max", p->name,
                     fl_layout_name(l));
            ref->pool_forward(t, l, (fl_pool)pool, p->n, &g, xl, yl);
            ref->pool_forward(FL_DTYPE_F64, FL_LAYOUT_NCHW, (fl_pool)pool, p->n, &g, x.d, y64);
            uint16_t *y = from_layout(t, l, yl, p->n, p->c, ohw);
            check_low(what, t, y, y64, eout, pool == FL_POOL_MAX ? 0 : 1);
            ref->pool_backward(t, l, (fl_pool)pool, p->n, &g, xl, dyl, dxl);
            ref->pool_backward(FL_DTYPE_F64, FL_LAYOUT_NCHW, (fl_pool)pool, p->n, &g, x.d, dy.d,
                               dx64);
            uint16_t *dx = from_layout(t, l, dxl, p->n, p->c, hw);
            strncat(what, " backward", sizeof what - strlen(what) - 1);
            check_low(what, t, dx, dx64, ein, 1);
            fl_free_aligned(y), fl_free_aligned(dx);
        }
        lb_free(&x), lb_free(&dy), fl_free_aligned(xl), fl_free_aligned(dyl),
            fl_free_aligned(yl), fl_free_aligned(dxl), fl_free_aligned(y64), fl_free_aligned(dx64);
    }
}

/* batch norm: x, y, dy, dx low; gamma, beta, dgamma, dbeta f32; mean and var double */
static void test_bn(fl_dtype t, fl_layout l) {
    for (size_t bc = 0; bc < N_BN_CASES; bc++) {
        int64_t n = bn_cases[bc].n, c = bn_cases[bc].c, hw = bn_cases[bc].hw, e = n * c * hw;
        if (e > 100000)
            continue;
        lowbuf x = lb_rand(t, e, -1, 3), dy = lb_rand(t, e, -2, 2);
        float *gamma = rand_f32(c, 0.5, 1.5), *beta = rand_f32(c, -0.5, 0.5);
        double *g64 = xalloc((size_t)c * 8), *b64 = xalloc((size_t)c * 8);
        for (int64_t i = 0; i < c; i++)
            g64[i] = gamma[i], b64[i] = beta[i];
        uint16_t *xl = to_layout(t, l, x.h, n, c, hw), *dyl = to_layout(t, l, dy.h, n, c, hw);
        uint16_t *yl = xalloc((size_t)e * 2), *dxl = xalloc((size_t)e * 2);
        double *y64 = xalloc((size_t)e * 8), *dx64 = xalloc((size_t)e * 8);
        double *mean = xalloc((size_t)c * 8), *var = xalloc((size_t)c * 8),
               *mean64 = xalloc((size_t)c * 8), *var64 = xalloc((size_t)c * 8);
        for (int mode = 0; mode < 6; mode++) { /* training or not, times none, relu, hardswish */
            bool training = mode & 1;
            fl_act act = mode >> 1 == 0 ? FL_ACT_NONE : mode >> 1 == 1 ? FL_ACT_RELU
                                                                        : FL_ACT_HARDSWISH;
            char what[128];
            snprintf(what, sizeof what, "bn (%lld, %lld, %lld) %s%s %s", (long long)n,
                     (long long)c, (long long)hw, training ? "training" : "inference",
                     act == FL_ACT_NONE ? "" : act == FL_ACT_RELU ? " relu" : " hardswish",
                     fl_layout_name(l));
            if (!training) /* running statistics, the same for both */
                for (int64_t i = 0; i < c; i++)
                    mean[i] = mean64[i] = 0.3 * (double)i - 0.5, var[i] = var64[i] = 0.5 + (double)i;
            ref->bn_forward(t, l, n, c, hw, xl, gamma, beta, 1e-5, training, mean, var, act, yl);
            ref->bn_forward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, hw, x.d, g64, b64, 1e-5,
                            training, mean64, var64, act, y64);
            for (int64_t i = 0; i < c; i++)
                if (fabs(mean[i] - mean64[i]) > 1e-12 || fabs(var[i] - var64[i]) > 1e-12 * var64[i]) {
                    fprintf(stderr, "%s: channel %lld: mean %.17g var %.17g, want %.17g %.17g\n",
                            what, (long long)i, mean[i], var[i], mean64[i], var64[i]);
                    test_failures++;
                    break;
                }
            uint16_t *y = from_layout(t, l, yl, n, c, hw);
            check_low(what, t, y, y64, e, 1);
            /* backward, relu_y the low output (as doubles for f64), accumulate onto random
             * dgamma / dbeta, then overwrite; and without dx */
            double *ry64 = xalloc((size_t)e * 8);
            for (int64_t i = 0; i < e; i++)
                ry64[i] = lowval(t, y[i]);
            float *dg = rand_f32(c, -1, 1), *db = rand_f32(c, -1, 1);
            double *dg64 = xalloc((size_t)c * 8), *db64 = xalloc((size_t)c * 8);
            for (int64_t i = 0; i < c; i++)
                dg64[i] = dg[i], db64[i] = db[i];
            for (int acc = 1; acc >= 0; acc--) {
                ref->bn_backward(t, l, n, c, hw, xl, act, yl, dyl, gamma, beta, mean, var,
                                 1e-5, training, dxl, dg, db, acc);
                ref->bn_backward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, c, hw, x.d, act, ry64, dy.d,
                                 g64, b64, mean64, var64, 1e-5, training, dx64, dg64, db64, acc);
                uint16_t *dx = from_layout(t, l, dxl, n, c, hw);
                check_low(acc ? "bn backward dx (accumulate)" : "bn backward dx", t, dx, dx64, e, 1);
                check_f32("bn backward dgamma", t, dg, dg64, c);
                check_f32("bn backward dbeta", t, db, db64, c);
                fl_free_aligned(dx);
            }
            ref->bn_backward(t, l, n, c, hw, xl, act, yl, dyl, gamma, beta, mean, var, 1e-5,
                             training, NULL, dg, db, false);
            check_f32("bn backward dgamma without dx", t, dg, dg64, c);
            fl_free_aligned(y), fl_free_aligned(ry64), fl_free_aligned(dg), fl_free_aligned(db),
                fl_free_aligned(dg64), fl_free_aligned(db64);
        }
        lb_free(&x), lb_free(&dy), fl_free_aligned(gamma), fl_free_aligned(beta),
            fl_free_aligned(g64), fl_free_aligned(b64), fl_free_aligned(xl), fl_free_aligned(dyl),
            fl_free_aligned(yl), fl_free_aligned(dxl), fl_free_aligned(y64), fl_free_aligned(dx64),
            fl_free_aligned(mean), fl_free_aligned(var), fl_free_aligned(mean64),
            fl_free_aligned(var64);
    }
}

/* --- convolution: a low plan (f32 weights read rounded, f32 dw and db) against f64 --- */

static void check_conv(fl_dtype t, const conv_case *cc, fl_layout l) {
    fl_conv_desc d = {.dtype = t, .layout = l, .max_batch = cc->n + cc->extra, .oc = cc->oc,
                      .groups = cc->groups, .bias = cc->bias,
                      .g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh, .kw = cc->kw,
                            .sh = cc->sh, .sw = cc->sw, .ph = cc->ph, .pw = cc->pw, .dh = cc->dh,
                            .dw = cc->dw}};
    CHECK(fl_conv_geom_out(&d.g));
    fl_conv_desc d64 = d;
    d64.dtype = FL_DTYPE_F64, d64.layout = FL_LAYOUT_NCHW;
    fl_conv_plan *p = ref->conv_plan_create(&d), *q = ref->conv_plan_create(&d64);
    if (!p || !q) {
        fprintf(stderr, "conv %s [%s]: plan: %s\n", cc->name, fl_dtype_name(t), fl_errmsg());
        test_failures++;
        ref->conv_plan_free(p), ref->conv_plan_free(q);
        return;
    }
    void *scr = xalloc(ref->conv_scratch_bytes(p)), *scr64 = xalloc(ref->conv_scratch_bytes(q));
    int64_t n = cc->n, hw = cc->h * cc->w, ohw = d.g.oh * d.g.ow, xs = n * cc->ic * hw,
            ys = n * cc->oc * ohw, ws = cc->oc * (cc->ic / cc->groups) * cc->kh * cc->kw;
    lowbuf x = lb_rand(t, xs, -2, 2), dy = lb_rand(t, ys, -2, 2);
    float *w = rand_f32(ws, -1, 1), *bias = rand_f32(cc->oc, -1, 1);
    double *w64 = xalloc((size_t)ws * 8), *b64 = xalloc((size_t)cc->oc * 8);
    for (int64_t i = 0; i < ws; i++) /* what the plan reads: w rounded once to t */
        w64[i] = lowval(t, f32_to_low(t, w[i]));
    for (int64_t i = 0; i < cc->oc; i++)
        b64[i] = bias[i];
    char what[256];
    snprintf(what, sizeof what, "conv %s, %s", cc->name, fl_layout_name(l));
    size_t wl = strlen(what);
    uint16_t *xl = to_layout(t, l, x.h, n, cc->ic, hw), *dyl = to_layout(t, l, dy.h, n, cc->oc, ohw);
    uint16_t *yl = xalloc((size_t)ys * 2), *dxl = xalloc((size_t)xs * 2);
    double *y64 = xalloc((size_t)ys * 8), *dx64 = xalloc((size_t)xs * 8);
    /* forward (bias f32, added before the one rounding) */
    ref->conv_forward(p, n, xl, w, cc->bias ? bias : NULL, yl, scr);
    ref->conv_forward(q, n, x.d, w64, cc->bias ? b64 : NULL, y64, scr64);
    uint16_t *y = from_layout(t, l, yl, n, cc->oc, ohw);
    strncat(what, " forward", sizeof what - wl - 1);
    check_low(what, t, y, y64, ys, 1);
    what[wl] = 0;
    /* input gradient */
    ref->conv_backward_data(p, n, dyl, w, dxl, scr);
    ref->conv_backward_data(q, n, dy.d, w64, dx64, scr64);
    uint16_t *dx = from_layout(t, l, dxl, n, cc->ic, hw);
    strncat(what, " backward data", sizeof what - wl - 1);
    check_low(what, t, dx, dx64, xs, 1);
    what[wl] = 0;
    /* weight gradient: overwritten (over NaN), each element a value of t, the f64 one rounded
     * within 1 ulp; db the f64 sum within 1 f32 ulp */
    float *dw = xalloc((size_t)ws * 4), *db = xalloc((size_t)cc->oc * 4);
    double *dw64 = xalloc((size_t)ws * 8), *db64 = xalloc((size_t)cc->oc * 8);
    for (int64_t i = 0; i < ws; i++)
        dw[i] = NAN;
    ref->conv_backward_filter(p, n, xl, dyl, dw, cc->bias ? db : NULL, false, scr);
    ref->conv_backward_filter(q, n, x.d, dy.d, dw64, cc->bias ? db64 : NULL, false, scr64);
    uint16_t *dwh = xalloc((size_t)ws * 2);
    for (int64_t i = 0; i < ws; i++) {
        dwh[i] = f32_to_low(t, dw[i]);
        if (lowval(t, dwh[i]) != (double)dw[i]) {
            fprintf(stderr, "%s: dw[%lld] = %.9g is not a value of %s\n", what, (long long)i,
                    dw[i], fl_dtype_name(t));
            test_failures++;
            break;
        }
    }
    strncat(what, " backward filter", sizeof what - wl - 1);
    check_low(what, t, dwh, dw64, ws, 1);
    if (cc->bias)
        check_f32(what, t, db, db64, cc->oc);
    /* accumulate: dw0 + the same rounded gradient, an f32 add, bit for bit; db0 + the sum */
    float *dwa = rand_f32(ws, -1, 1), *dba = rand_f32(cc->oc, -1, 1);
    float *dw0 = xalloc((size_t)ws * 4);
    memcpy(dw0, dwa, (size_t)ws * 4);
    for (int64_t i = 0; i < cc->oc; i++)
        db64[i] += dba[i];
    ref->conv_backward_filter(p, n, xl, dyl, dwa, cc->bias ? dba : NULL, true, scr);
    for (int64_t i = 0; i < ws; i++)
        if (dwa[i] != dw0[i] + dw[i]) {
            fprintf(stderr, "%s accumulate: dw[%lld] = %.9g, want %.9g + %.9g\n", what,
                    (long long)i, dwa[i], dw0[i], dw[i]);
            test_failures++;
            break;
        }
    if (cc->bias)
        check_f32("conv db accumulate", t, dba, db64, cc->oc);
    lb_free(&x), lb_free(&dy), fl_free_aligned(w), fl_free_aligned(bias), fl_free_aligned(w64),
        fl_free_aligned(b64), fl_free_aligned(xl), fl_free_aligned(dyl), fl_free_aligned(yl),
        fl_free_aligned(dxl), fl_free_aligned(y64), fl_free_aligned(dx64), fl_free_aligned(y),
        fl_free_aligned(dx), fl_free_aligned(dw), fl_free_aligned(db), fl_free_aligned(dw64),
        fl_free_aligned(db64), fl_free_aligned(dwh), fl_free_aligned(dwa), fl_free_aligned(dba),
        fl_free_aligned(dw0), fl_free_aligned(scr), fl_free_aligned(scr64);
    ref->conv_plan_free(p), ref->conv_plan_free(q);
}

static int64_t conv_macs(const conv_case *c) {
    fl_conv_geom g = {.c = c->ic, .h = c->h, .w = c->w, .kh = c->kh, .kw = c->kw, .sh = c->sh,
                      .sw = c->sw, .ph = c->ph, .pw = c->pw, .dh = c->dh, .dw = c->dw};
    if (!fl_conv_geom_out(&g))
        return 0;
    return c->n * c->oc * g.oh * g.ow * (c->ic / c->groups) * c->kh * c->kw;
}

static void test_conv(fl_dtype t, fl_layout l) {
    for (size_t i = 0; i < N_CONV_CASES; i++)
        if (conv_macs(&conv_cases[i]) <= 2000000) /* the large ones are the fast tables' */
            check_conv(t, &conv_cases[i], l);
    for (int i = 0; i < N_CONV_RANDOM; i++) {
        conv_case c;
        char name[200];
        conv_case_random(&rng, i, &c, name, sizeof name);
        check_conv(t, &c, l);
    }
}

/* Low plans: the ref table's only; the others refuse them with a message, and the ref table
 * still checks the shape. */
static void test_conv_refusals(void) {
    fl_conv_desc d = {.dtype = FL_DTYPE_F16, .layout = FL_LAYOUT_NCHW, .max_batch = 2, .oc = 4,
                      .groups = 1, .g = {.c = 3, .h = 5, .w = 5, .kh = 3, .kw = 3, .sh = 1,
                                         .sw = 1, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    const fl_backend *others[2] = {fl_backend_cpu(), fl_backend_onednn()};
    for (int b = 0; b < 2; b++) {
        if (!others[b])
            continue; /* onednn not built in */
        for (int k = 0; k < 2; k++) {
            d.dtype = lows[k];
            fl_clear_error();
            CHECK(others[b]->conv_plan_create(&d) == NULL);
            CHECK_MSG("f32 or f64");
            CHECK_MSG(fl_dtype_name(lows[k]));
        }
    }
    CHECK_RC(fl_conv_desc_check(&d, "x conv"), FL_EUNSUPPORTED);
    CHECK_OK(fl_conv_desc_check_low(&d, "x conv"));
    d.dtype = FL_DTYPE_I32;
    CHECK_RC(fl_conv_desc_check_low(&d, "x conv"), FL_EINVAL);
    d.dtype = FL_DTYPE_BF16, d.oc = 5, d.groups = 2; /* 3 channels in 2 groups */
    CHECK(ref->conv_plan_create(&d) == NULL);
    CHECK_MSG("ref conv: bad shape");
    d.groups = 1, d.layout = FL_LAYOUT_NHWC;
    fl_conv_plan *p = ref->conv_plan_create(&d);
    CHECK(p != NULL);
    if (p)
        CHECK(ref->conv_scratch_bytes(p) == 0);
    ref->conv_plan_free(p);
}

int main(void) {
    ref = fl_backend_by_name("ref");
    CHECK(ref != NULL);
    fl_rng_init(&rng, 2024, 34);
    for (int k = 0; k < 2; k++) {
        fl_dtype t = lows[k];
        test_rounding(t);
        test_elementwise(t);
        test_gemm_bias(t);
        test_reorder(t);
        for (int l = 0; l < 2; l++) {
            test_channel_ops(t, (fl_layout)l);
            test_pool(t, (fl_layout)l);
            test_bn(t, (fl_layout)l);
            test_conv(t, (fl_layout)l);
        }
    }
    test_conv_refusals();
    if (test_failures)
        fprintf(stderr, "test_ref_lowp: %d failures\n", test_failures);
    return test_failures ? 1 : 0;
}
