/* test_kernels.c - every kernel of fl_backend_cpu() against the plain loops of fl_backend_ref(),
 * in f32 and f64, over sizes 0, 1, odd, and above the OpenMP threshold; plus reductions that
 * must be bit-identical for any thread count, softmax on huge logits, and the small helpers. */
#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "fleet/tensor.h"
#include "backend_cases.h"
#include "test.h"

#include <stdint.h>

static const fl_dtype dtypes[] = {FL_DTYPE_F32, FL_DTYPE_F64};
static const fl_backend *cpu, *ref;
static fl_rng rng;

/* Tolerances that fit the dtype: f32 kernels differ from the double-accumulating reference by
 * a few float ulps; f64 by rounding order only. */
static double tol(fl_dtype t) { return t == FL_DTYPE_F32 ? 2e-6 : 1e-13; }

static void *alloc_buf(fl_dtype t, int64_t n) {
    void *p = fl_alloc_aligned((size_t)(n > 0 ? n : 1) * fl_dtype_size(t));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static void set(fl_dtype t, void *p, int64_t i, double v) {
    if (t == FL_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

static double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? ((const float *)p)[i] : ((const double *)p)[i];
}

/* n values uniform in [lo, hi) */
static void *rand_buf(fl_dtype t, int64_t n, double lo, double hi) {
    void *p = alloc_buf(t, n);
    for (int64_t i = 0; i < n; i++)
        set(t, p, i, lo + (hi - lo) * fl_rng_uniform_f64(&rng));
    return p;
}

static void *copy_buf(fl_dtype t, const void *src, int64_t n) {
    void *p = alloc_buf(t, n);
    if (n > 0)
        memcpy(p, src, (size_t)n * fl_dtype_size(t));
    return p;
}

/* CHECK_CLOSE on n values of dtype t; returns 1 if they match. */
static int same(const char *what, fl_dtype t, const void *got, const void *want, int64_t n,
                double atol, double rtol) {
    double *g = malloc((size_t)(n > 0 ? n : 1) * sizeof *g);
    double *w = malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    for (int64_t i = 0; i < n; i++) {
        g[i] = get(t, got, i);
        w[i] = get(t, want, i);
    }
    char label[160];
    snprintf(label, sizeof label, "%s [%s]", what, fl_dtype_name(t));
    int ok = CHECK_CLOSE(label, g, w, n, atol, rtol);
    free(g);
    free(w);
    return ok;
}

static void test_gemm(fl_dtype t) {
    const int64_t(*sizes)[3] = gemm_sizes;
    const double(*ab)[2] = gemm_ab;
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                for (size_t c = 0; c < sizeof gemm_ab / sizeof gemm_ab[0]; c++) {
                    if (m * n * k > 100000 && c != 1) // big sizes: one alpha/beta is enough
                        continue;
                    /* non-trivial leading dimensions: 3 padding columns everywhere */
                    int64_t arows = ta ? k : m, acols = ta ? m : k;
                    int64_t brows = tb ? n : k, bcols = tb ? k : n;
                    int64_t lda = acols + 3, ldb = bcols + 3, ldc = n + 3;
                    void *a = rand_buf(t, arows * lda, -1, 1);
                    void *b = rand_buf(t, brows * ldb, -1, 1);
                    void *c_cpu = rand_buf(t, m * ldc, -1, 1);
                    if (ab[c][1] == 0) // beta = 0 must ignore C entirely, NaN included
                        for (int64_t i = 0; i < m * ldc; i += 2)
                            set(t, c_cpu, i, NAN);
                    void *c_ref = copy_buf(t, c_cpu, m * ldc);
                    cpu->gemm(t, ta, tb, m, n, k, ab[c][0], a, lda, b, ldb, ab[c][1], c_cpu, ldc);
                    ref->gemm(t, ta, tb, m, n, k, ab[c][0], a, lda, b, ldb, ab[c][1], c_ref, ldc);
                    /* C's padding columns must be left alone: compare whole buffers, NaN
                     * padding included, by replacing NaN with a marker first */
                    for (int64_t i = 0; i < m * ldc; i++) {
                        if (isnan(get(t, c_cpu, i)) && isnan(get(t, c_ref, i))) {
                            set(t, c_cpu, i, 12345);
                            set(t, c_ref, i, 12345);
                        }
                    }
                    char what[96];
                    snprintf(what, sizeof what, "gemm %c%c m=%lld n=%lld k=%lld alpha=%g beta=%g",
                             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
                             (long long)k, ab[c][0], ab[c][1]);
                    double atol = tol(t) * (double)(k + 1) * 2;
                    same(what, t, c_cpu, c_ref, m * ldc, atol, tol(t));
                    fl_free_aligned(a);
                    fl_free_aligned(b);
                    fl_free_aligned(c_cpu);
                    fl_free_aligned(c_ref);
                }
            }
        }
    }
}


static void test_bias_and_sum_rows(fl_dtype t) {
    for (size_t s = 0; s < NSHAPES2D; s++) {
        int64_t rows = shapes2d[s][0], cols = shapes2d[s][1];
        char what[96];
        void *y = rand_buf(t, rows * cols, -2, 2);
        void *bias = rand_buf(t, cols, -1, 1);
        void *y_ref = copy_buf(t, y, rows * cols);
        cpu->add_bias(t, y, bias, rows, cols);
        ref->add_bias(t, y_ref, bias, rows, cols);
        snprintf(what, sizeof what, "add_bias %lldx%lld", (long long)rows, (long long)cols);
        same(what, t, y, y_ref, rows * cols, tol(t), tol(t));
        for (int acc = 0; acc < 2; acc++) {
            void *db = rand_buf(t, cols, -1, 1);
            void *db_ref = copy_buf(t, db, cols);
            cpu->sum_rows(t, y, db, rows, cols, acc);
            ref->sum_rows(t, y, db_ref, rows, cols, acc);
            snprintf(what, sizeof what, "sum_rows %lldx%lld accumulate=%d", (long long)rows,
                     (long long)cols, acc);
            same(what, t, db, db_ref, cols, tol(t) * (double)(rows + 1), tol(t));
            fl_free_aligned(db);
            fl_free_aligned(db_ref);
        }
        fl_free_aligned(y);
        fl_free_aligned(bias);
        fl_free_aligned(y_ref);
    }
}


static void test_activations(fl_dtype t) {
    for (int a = FL_ACT_NONE; a < FL_ACT_COUNT; a++) {
        for (size_t s = 0; s < NCOUNTS; s++) {
            int64_t n = counts[s];
            char what[96];
            /* relu: keep inputs off 0 (its kink); tanh and sigmoid: cover both branches of the
             * fast f32 tanh (|x| < 0.55 and above) and the saturated tails */
            void *x = rand_buf(t, n, -12, 12);
            if (n > 3) {
                set(t, x, 0, 0.3);
                set(t, x, 1, -100);
                set(t, x, 2, 100);
            }
            if (n > 7) { /* the hard activations' kinks, where the derivative is defined */
                set(t, x, 3, -3);
                set(t, x, 4, 3);
                set(t, x, 5, -2.999);
                set(t, x, 6, 2.999);
            }
            void *y = alloc_buf(t, n), *y_ref = alloc_buf(t, n);
            cpu->act_forward(t, (fl_act)a, x, y, n);
            ref->act_forward(t, (fl_act)a, x, y_ref, n);
            snprintf(what, sizeof what, "act_forward %s n=%lld", fl_act_name((fl_act)a),
                     (long long)n);
            same(what, t, y, y_ref, n, tol(t) / 2, tol(t) / 2);
            /* in place: y may alias x */
            void *xy = copy_buf(t, x, n);
            cpu->act_forward(t, (fl_act)a, xy, xy, n);
            snprintf(what, sizeof what, "act_forward in place %s n=%lld",
                     fl_act_name((fl_act)a), (long long)n);
            same(what, t, xy, y, n, 0, 0);

            void *dy = rand_buf(t, n, -1, 1);
            void *dx = alloc_buf(t, n), *dx_ref = alloc_buf(t, n);
            cpu->act_backward(t, (fl_act)a, x, y_ref, dy, dx, n);
            ref->act_backward(t, (fl_act)a, x, y_ref, dy, dx_ref, n);
            snprintf(what, sizeof what, "act_backward %s n=%lld", fl_act_name((fl_act)a),
                     (long long)n);
            same(what, t, dx, dx_ref, n, tol(t) / 2, tol(t) / 2);
            cpu->act_backward(t, (fl_act)a, x, y_ref, dy, dy, n); // dx may alias dy
            snprintf(what, sizeof what, "act_backward in place %s n=%lld",
                     fl_act_name((fl_act)a), (long long)n);
            same(what, t, dy, dx, n, 0, 0);
            fl_free_aligned(x);
            fl_free_aligned(y);
            fl_free_aligned(y_ref);
            fl_free_aligned(xy);
            fl_free_aligned(dy);
            fl_free_aligned(dx);
            fl_free_aligned(dx_ref);
        }
    }
    /* NaN propagates through every activation; +-inf saturate */
    double special[] = {NAN, INFINITY, -INFINITY};
    double want[][3] = {{NAN, INFINITY, -INFINITY}, {NAN, INFINITY, 0}, {NAN, 1, -1}, {NAN, 1, 0},
                        {NAN, INFINITY, 0},          {NAN, 1, 0}};
    for (int a = FL_ACT_NONE; a < FL_ACT_COUNT; a++) {
        void *x = alloc_buf(t, 3), *y = alloc_buf(t, 3);
        for (int i = 0; i < 3; i++)
            set(t, x, i, special[i]);
        cpu->act_forward(t, (fl_act)a, x, y, 3);
        CHECK(isnan(get(t, y, 0)));
        CHECK(get(t, y, 1) == want[a][1]);
        CHECK(get(t, y, 2) == want[a][2]);
        fl_free_aligned(x);
        fl_free_aligned(y);
    }
}

/* hardswish and hardsigmoid at points worked by hand (PyTorch's values: hardswish' is x / 3 + 1/2
 * on the closed [-3, 3], so -1/2 at -3) */
static void test_hard_values(fl_dtype t) {
    double x[] = {-4, -3, -1.5, 0, 1.5, 3, 4};
    double hs[] = {0, 0, -0.375, 0, 1.125, 3, 4}, hsig[] = {0, 0, 0.25, 0.5, 0.75, 1, 1};
    double dhs[] = {0, -0.5, 0, 0.5, 1, 1.5, 1}, dhsig[] = {0, 0, 1.0 / 6, 1.0 / 6, 1.0 / 6, 0, 0};
    const fl_backend *tables[] = {cpu, ref};
    for (int k = 0; k < 2; k++) {
        void *xb = alloc_buf(t, 7), *yb = alloc_buf(t, 7), *ones = alloc_buf(t, 7);
        void *db = alloc_buf(t, 7);
        for (int i = 0; i < 7; i++) {
            set(t, xb, i, x[i]);
            set(t, ones, i, 1);
        }
        tables[k]->act_forward(t, FL_ACT_HARDSWISH, xb, yb, 7);
        for (int i = 0; i < 7; i++)
            CHECK_NEAR(get(t, yb, i), hs[i], 1e-7);
        tables[k]->act_backward(t, FL_ACT_HARDSWISH, xb, yb, ones, db, 7);
        for (int i = 0; i < 7; i++)
            CHECK_NEAR(get(t, db, i), dhs[i], 1e-7);
        tables[k]->act_forward(t, FL_ACT_HARDSIGMOID, xb, yb, 7);
        for (int i = 0; i < 7; i++)
            CHECK_NEAR(get(t, yb, i), hsig[i], 1e-7);
        tables[k]->act_backward(t, FL_ACT_HARDSIGMOID, xb, yb, ones, db, 7);
        for (int i = 0; i < 7; i++)
            CHECK_NEAR(get(t, db, i), dhsig[i], 1e-7);
        fl_free_aligned(xb);
        fl_free_aligned(yb);
        fl_free_aligned(ones);
        fl_free_aligned(db);
    }
}

/* channel_mul_forward / _backward and channel_slice against the ref table, both layouts */
static void test_channel_ops(fl_dtype t) {
    static const int64_t shapes[][3] = {{0, 3, 4}, {1, 1, 1}, {2, 5, 7}, {3, 70, 9},
                                        {4, 130, 49}, {16, 64, 64}}; /* n, c, hw */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int lay = 0; lay < 2; lay++) {
            fl_layout l = lay ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], e = n * c * hw;
            char what[128];
            void *x = rand_buf(t, e, -2, 2), *sc = rand_buf(t, n * c, -1, 1);
            void *dy = rand_buf(t, e, -1, 1);
            void *y = alloc_buf(t, e), *yr = alloc_buf(t, e);
            cpu->channel_mul_forward(t, l, n, c, hw, x, sc, y);
            ref->channel_mul_forward(t, l, n, c, hw, x, sc, yr);
            snprintf(what, sizeof what, "channel_mul_forward %s n=%lld c=%lld hw=%lld",
                     fl_layout_name(l), (long long)n, (long long)c, (long long)hw);
            same(what, t, y, yr, e, 0, 0);
            void *dx = alloc_buf(t, e), *dxr = alloc_buf(t, e);
            void *ds = alloc_buf(t, n * c), *dsr = alloc_buf(t, n * c);
            cpu->channel_mul_backward(t, l, n, c, hw, x, sc, dy, dx, ds);
            ref->channel_mul_backward(t, l, n, c, hw, x, sc, dy, dxr, dsr);
            snprintf(what, sizeof what, "channel_mul_backward dx %s n=%lld c=%lld hw=%lld",
                     fl_layout_name(l), (long long)n, (long long)c, (long long)hw);
            same(what, t, dx, dxr, e, 0, 0);
            snprintf(what, sizeof what, "channel_mul_backward ds %s n=%lld c=%lld hw=%lld",
                     fl_layout_name(l), (long long)n, (long long)c, (long long)hw);
            same(what, t, ds, dsr, n * c, 0, 0); /* both sum in double, pixels in order */
            /* in place (dx = dy) and with one of the outputs left out */
            void *dyc = copy_buf(t, dy, e);
            cpu->channel_mul_backward(t, l, n, c, hw, x, sc, dyc, dyc, NULL);
            same("channel_mul_backward in place", t, dyc, dxr, e, 0, 0);
            cpu->channel_mul_backward(t, l, n, c, hw, x, sc, dy, NULL, ds);
            same("channel_mul_backward ds only", t, ds, dsr, n * c, 0, 0);

            /* concatenation: x (c) and x2 (3) into y (c + 3) and back */
            int64_t c2 = 3, oc = c + c2;
            void *x2 = rand_buf(t, n * c2 * hw, -1, 1), *cat = alloc_buf(t, n * oc * hw);
            cpu->channel_slice(t, l, n, hw, c, x, oc, 0, cat, true);
            cpu->channel_slice(t, l, n, hw, c2, x2, oc, c, cat, true);
            int bad = 0;
            for (int64_t i = 0; i < n && !bad; i++)
                for (int64_t ch = 0; ch < oc; ch++)
                    for (int64_t p = 0; p < hw; p++) {
                        int64_t at = l == FL_LAYOUT_NHWC ? (i * hw + p) * oc + ch
                                                         : (i * oc + ch) * hw + p;
                        bool first = ch < c;
                        int64_t cc = first ? c : c2, k = first ? ch : ch - c;
                        int64_t from = l == FL_LAYOUT_NHWC ? (i * hw + p) * cc + k
                                                           : (i * cc + k) * hw + p;
                        bad += get(t, cat, at) != get(t, first ? x : x2, from);
                    }
            CHECK(bad == 0);
            void *back = alloc_buf(t, n * c2 * hw);
            cpu->channel_slice(t, l, n, hw, c2, back, oc, c, cat, false);
            same("channel_slice backward", t, back, x2, n * c2 * hw, 0, 0);
            void *bufs[] = {x, sc, dy, y, yr, dx, dxr, ds, dsr, dyc, x2, cat, back};
            for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
                fl_free_aligned(bufs[b]);
        }
}

static void test_axpy_scale(fl_dtype t) {
    for (size_t s = 0; s < NCOUNTS; s++) {
        int64_t n = counts[s];
        char what[96];
        void *x = rand_buf(t, n, -1, 1), *y = rand_buf(t, n, -1, 1);
        void *y_ref = copy_buf(t, y, n);
        cpu->axpy(t, n, -0.37, x, y);
        ref->axpy(t, n, -0.37, x, y_ref);
        snprintf(what, sizeof what, "axpy n=%lld", (long long)n);
        same(what, t, y, y_ref, n, tol(t), tol(t));
        cpu->scale(t, n, 1.7, y);
        ref->scale(t, n, 1.7, y_ref);
        snprintf(what, sizeof what, "scale n=%lld", (long long)n);
        same(what, t, y, y_ref, n, tol(t), tol(t));
        fl_free_aligned(x);
        fl_free_aligned(y);
        fl_free_aligned(y_ref);
    }
}

static void test_reductions(fl_dtype t) {
    for (size_t s = 0; s < sizeof reduce_ns / sizeof reduce_ns[0]; s++) {
        int64_t n = reduce_ns[s];
        void *x = rand_buf(t, n, -1, 1.5);
        /* both sum in double, in different orders: error ~ n^(1/2) eps of the sum of |terms| */
        double asum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) {
            asum += fabs(get(t, x, i));
            sq += get(t, x, i) * get(t, x, i);
        }
        char what[96];
        snprintf(what, sizeof what, "sum n=%lld [%s]", (long long)n, fl_dtype_name(t));
        double got = cpu->sum(t, x, n), want = ref->sum(t, x, n);
        CHECK_CLOSE(what, &got, &want, 1, 1e-12 * (asum + 1), 0);
        snprintf(what, sizeof what, "sumsq n=%lld [%s]", (long long)n, fl_dtype_name(t));
        double got2 = cpu->sumsq(t, x, n), want2 = ref->sumsq(t, x, n);
        CHECK_CLOSE(what, &got2, &want2, 1, 1e-12 * (sq + 1), 0);
        /* deterministic: bit-identical for 1, 2 and 3 threads */
        for (int threads = 1; threads <= 3; threads++) {
            fl_kernels_set_threads(threads);
            double again = cpu->sum(t, x, n), again2 = cpu->sumsq(t, x, n);
            if (memcmp(&again, &got, sizeof got) || memcmp(&again2, &got2, sizeof got2)) {
                fprintf(stderr, "sum/sumsq n=%lld [%s], %d threads: %.17g %.17g != %.17g %.17g\n",
                        (long long)n, fl_dtype_name(t), threads, again, again2, got, got2);
                test_failures++;
            }
        }
        fl_kernels_set_threads(0);
        fl_free_aligned(x);
    }
}

static int32_t *rand_labels(int64_t rows, int64_t classes) {
    int32_t *labels = malloc((size_t)(rows > 0 ? rows : 1) * sizeof *labels);
    for (int64_t r = 0; r < rows; r++)
        labels[r] = (int32_t)fl_rng_below(&rng, (uint64_t)classes);
    return labels;
}

static void test_softmax(fl_dtype t) {
    for (size_t s = 0; s < sizeof softmax_shapes / sizeof softmax_shapes[0]; s++) {
        int64_t rows = softmax_shapes[s][0], classes = softmax_shapes[s][1], n = rows * classes;
        for (int huge = 0; huge < 2; huge++) {
            char what[96];
            double scale = huge ? 1e4 : 3; // 1e4: exp would overflow without the max shift
            void *logits = rand_buf(t, n, -scale, scale);
            int32_t *labels = rand_labels(rows, classes);
            void *p = alloc_buf(t, n), *p_ref = alloc_buf(t, n);
            double loss = cpu->softmax_xent_forward(t, logits, labels, p, rows, classes);
            double loss_ref = ref->softmax_xent_forward(t, logits, labels, p_ref, rows, classes);
            snprintf(what, sizeof what, "softmax_xent_forward loss %lldx%lld scale=%g [%s]",
                     (long long)rows, (long long)classes, scale, fl_dtype_name(t));
            CHECK(isfinite(loss));
            CHECK_CLOSE(what, &loss, &loss_ref, 1, tol(t) * (double)(rows + 1), tol(t));
            snprintf(what, sizeof what, "softmax_xent_forward probs %lldx%lld scale=%g",
                     (long long)rows, (long long)classes, scale);
            same(what, t, p, p_ref, n, tol(t), tol(t));
            for (int64_t r = 0; r < rows; r++) { // every row a distribution
                double rs = 0;
                for (int64_t j = 0; j < classes; j++)
                    rs += get(t, p, r * classes + j);
                CHECK_NEAR(rs, 1.0, tol(t) * (double)classes);
            }
            /* deterministic loss for any thread count */
            for (int threads = 1; threads <= 3; threads++) {
                fl_kernels_set_threads(threads);
                double again = cpu->softmax_xent_forward(t, logits, labels, p, rows, classes);
                CHECK(memcmp(&again, &loss, sizeof loss) == 0);
            }
            fl_kernels_set_threads(0);

            double bscale = rows ? 1.0 / (double)rows : 1;
            void *d = alloc_buf(t, n), *d_ref = alloc_buf(t, n);
            cpu->softmax_xent_backward(t, p, labels, d, rows, classes, bscale);
            ref->softmax_xent_backward(t, p, labels, d_ref, rows, classes, bscale);
            snprintf(what, sizeof what, "softmax_xent_backward %lldx%lld scale=%g",
                     (long long)rows, (long long)classes, scale);
            same(what, t, d, d_ref, n, tol(t), tol(t));
            cpu->softmax_xent_backward(t, p, labels, p, rows, classes, bscale); // in place
            snprintf(what, sizeof what, "softmax_xent_backward in place %lldx%lld",
                     (long long)rows, (long long)classes);
            same(what, t, p, d, n, 0, 0);
            free(labels);
            fl_free_aligned(logits);
            fl_free_aligned(p);
            fl_free_aligned(p_ref);
            fl_free_aligned(d);
            fl_free_aligned(d_ref);
        }
    }
    /* one row by hand: logits (0, ln 3), label 1: p = (1/4, 3/4), loss = ln(4/3) */
    double lg[2] = {0, log(3.0)}, pr[2];
    int32_t lab = 1;
    double l = cpu->softmax_xent_forward(FL_DTYPE_F64, lg, &lab, pr, 1, 2);
    CHECK_NEAR(l, log(4.0 / 3.0), 1e-15);
    CHECK_NEAR(pr[0], 0.25, 1e-15);
    CHECK_NEAR(pr[1], 0.75, 1e-15);
}

static void test_updates(fl_dtype t) {
    for (size_t s = 0; s < NCOUNTS; s++) {
        int64_t n = counts[s];
        char what[96];
        for (int wd = 0; wd < 2; wd++) {
            double decay = wd ? 1e-2 : 0;
            void *w = rand_buf(t, n, -1, 1), *g = rand_buf(t, n, -1, 1);
            void *w_ref = copy_buf(t, w, n);
            cpu->sgd_update(t, n, w, g, 0.1, decay);
            ref->sgd_update(t, n, w_ref, g, 0.1, decay);
            snprintf(what, sizeof what, "sgd_update n=%lld wd=%g", (long long)n, decay);
            same(what, t, w, w_ref, n, tol(t), tol(t));
            for (int nesterov = 0; nesterov < 2; nesterov++) {
                void *v = rand_buf(t, n, -1, 1);
                void *v_ref = copy_buf(t, v, n);
                for (int step = 0; step < 3; step++) {
                    cpu->momentum_update(t, n, w, g, v, 0.1, 0.9, decay, nesterov);
                    ref->momentum_update(t, n, w_ref, g, v_ref, 0.1, 0.9, decay, nesterov);
                }
                snprintf(what, sizeof what, "momentum_update w n=%lld wd=%g nesterov=%d",
                         (long long)n, decay, nesterov);
                same(what, t, w, w_ref, n, tol(t) * 4, tol(t) * 4);
                snprintf(what, sizeof what, "momentum_update v n=%lld wd=%g nesterov=%d",
                         (long long)n, decay, nesterov);
                same(what, t, v, v_ref, n, tol(t) * 4, tol(t) * 4);
                fl_free_aligned(v);
                fl_free_aligned(v_ref);
            }
            fl_free_aligned(w);
            fl_free_aligned(g);
            fl_free_aligned(w_ref);
        }
    }
    /* momentum by hand, f64: w=1, g=0.5, v=0.2, lr=0.1, mu=0.9, wd=0.1: d=0.6, v=0.78 */
    double w = 1, g = 0.5, v = 0.2;
    cpu->momentum_update(FL_DTYPE_F64, 1, &w, &g, &v, 0.1, 0.9, 0.1, false);
    CHECK_NEAR(v, 0.78, 1e-15);
    CHECK_NEAR(w, 1 - 0.078, 1e-15);
    w = 1, v = 0.2;
    cpu->momentum_update(FL_DTYPE_F64, 1, &w, &g, &v, 0.1, 0.9, 0.1, true);
    CHECK_NEAR(w, 1 - 0.1 * (0.6 + 0.9 * 0.78), 1e-15);
}

static void test_helpers(void) {
    fl_act a;
    CHECK_OK(fl_act_parse("relu", &a));
    CHECK(a == FL_ACT_RELU);
    CHECK_OK(fl_act_parse("tanh", &a));
    CHECK(a == FL_ACT_TANH);
    CHECK_OK(fl_act_parse("sigmoid", &a));
    CHECK(a == FL_ACT_SIGMOID);
    CHECK_OK(fl_act_parse("none", &a));
    CHECK(a == FL_ACT_NONE);
    CHECK_RC(fl_act_parse("gelu", &a), FL_EINVAL);
    CHECK_MSG("gelu");
    CHECK(strcmp(fl_act_name(FL_ACT_TANH), "tanh") == 0);
    CHECK(strcmp(fl_act_name(FL_ACT_RELU), "relu") == 0);

    float xf[] = {1, 5, 2, 5, -1};
    CHECK(fl_argmax(FL_DTYPE_F32, xf, 5) == 1); // first on ties
    CHECK(fl_argmax(FL_DTYPE_F32, xf, 1) == 0);
    double xd[] = {-3, -2, -7};
    CHECK(fl_argmax(FL_DTYPE_F64, xd, 3) == 1);

    CHECK(strcmp(cpu->name, "cpu") == 0 && strcmp(ref->name, "ref") == 0);
    fl_kernels_set_threads(1);
    CHECK(fl_kernels_get_threads() == 1);
    fl_kernels_set_threads(0);
}

/* bn_running: the momentum rule, each product and sum rounded on its own in double, rounded
 * once to t: the bits of the plain expression, on both tables; var as it is at a count of 1;
 * 0, 1 and 17 channels */
static void test_bn_running(fl_dtype t) {
    static const int64_t cs[] = {0, 1, 17};
    static const double batch_counts[] = {1, 2, 37};
    for (size_t ci = 0; ci < 3; ci++)
        for (size_t ni = 0; ni < 3; ni++) {
            int64_t c = cs[ci];
            double count = batch_counts[ni], mom = 0.1;
            double *mean = rand_buf(FL_DTYPE_F64, c, -3, 3), *var = rand_buf(FL_DTYPE_F64, c, 0, 4);
            void *rm = rand_buf(t, c, -1, 1), *rv = rand_buf(t, c, 0.5, 2);
            void *want_m = alloc_buf(t, c), *want_v = alloc_buf(t, c);
            for (int64_t i = 0; i < c; i++) {
                double unbiased = count > 1 ? var[i] * count / (count - 1) : var[i];
                double km = (1 - mom) * get(t, rm, i), am = mom * mean[i];
                double kv = (1 - mom) * get(t, rv, i), av = mom * unbiased;
                set(t, want_m, i, km + am);
                set(t, want_v, i, kv + av);
            }
            const fl_backend *tables[] = {cpu, ref};
            for (int k = 0; k < 2; k++) {
                void *m = copy_buf(t, rm, c), *v = copy_buf(t, rv, c);
                tables[k]->bn_running(t, c, mean, var, count, mom, m, v);
                CHECK(c == 0 || memcmp(m, want_m, (size_t)c * fl_dtype_size(t)) == 0);
                CHECK(c == 0 || memcmp(v, want_v, (size_t)c * fl_dtype_size(t)) == 0);
                fl_free_aligned(m);
                fl_free_aligned(v);
            }
            fl_free_aligned(mean), fl_free_aligned(var), fl_free_aligned(rm), fl_free_aligned(rv);
            fl_free_aligned(want_m), fl_free_aligned(want_v);
        }
}

int main(void) {
    cpu = fl_backend_cpu();
    ref = fl_backend_ref();
    fl_rng_init(&rng, 1234, 0);
    test_helpers();
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        fl_dtype t = dtypes[i];
        test_gemm(t);
        test_bias_and_sum_rows(t);
        test_activations(t);
        test_hard_values(t);
        test_channel_ops(t);
        test_axpy_scale(t);
        test_reductions(t);
        test_softmax(t);
        test_updates(t);
        test_bn_running(t);
    }
    TEST_DONE();
}
