/* test_cuda_backend.c - every op of the cuda table against fl_backend_ref() (and, where the cuda
 * kernels promise the CPU's bits, against the cpu table bit for bit), on the shapes of
 * backend_cases.h, forward and backward, f32 (TF32 off) and f64: inputs made on the host, copied
 * to the device with the table's copy, results copied back and compared on the host. Also the
 * allocator (zero-filled, aligned, peak reused), streams and events, determinism (ops run twice
 * give the same bits), and device_bind's errors; and the low dtypes (f16, bf16) of the ops over
 * activations, gemm, the convolution plans and convert against the ref table's low ops
 * (test_low), and the table's low_dtypes flag and preferred layouts (test_low_flag). Skipped
 * (77) without a GPU; a summary table of the worst error per op against its tolerance ends the
 * run. */
#include "fleet/backend.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "backend_cases.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

static fl_rng rng;
static const fl_backend *G, *R, *CPU; /* cuda, ref, cpu */

/* ------------------------------------------------------------------------------------------ */
/* host and device buffers */

static size_t esz(fl_dtype t) { return t == FL_DTYPE_F64 ? 8 : 4; }

static double get(fl_dtype t, const void *p, int64_t i) {
    return t == FL_DTYPE_F32 ? ((const float *)p)[i] : ((const double *)p)[i];
}
static void set(fl_dtype t, void *p, int64_t i, double v) {
    if (t == FL_DTYPE_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

static void *hbuf(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    FL_ASSERT(p);
    return p;
}
static void *hrand(fl_dtype t, int64_t n, double lo, double hi) {
    void *p = hbuf((size_t)n * esz(t));
    for (int64_t i = 0; i < n; i++)
        set(t, p, i, lo + (hi - lo) * fl_rng_uniform_f64(&rng));
    return p;
}
static void *hdup(const void *src, size_t bytes) {
    void *p = hbuf(bytes);
    if (bytes)
        memcpy(p, src, bytes);
    return p;
}
/* a device copy of bytes of host memory */
static void *dput(const void *h, size_t bytes) {
    void *d = G->alloc(bytes);
    if (!d) {
        fprintf(stderr, "cuda alloc of %zu bytes: %s\n", bytes, fl_errmsg());
        exit(1);
    }
    G->copy(d, h, bytes, FL_COPY_H2D, NULL);
    return d;
}
/* a host copy of bytes of device memory */
static void *dget(const void *d, size_t bytes) {
    void *h = hbuf(bytes);
    G->copy(h, d, bytes, FL_COPY_D2H, NULL);
    G->stream_sync(NULL);
    return h;
}
static void dback(void *h, const void *d, size_t bytes) {
    G->copy(h, d, bytes, FL_COPY_D2H, NULL);
    G->stream_sync(NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* comparisons, and the worst error seen per op for the summary */

#define MAX_OPS 96
static struct {
    const char *op;
    double worst, tol;
    long checks;
} ops[MAX_OPS];
static int nops;

static void note(const char *op, double err, double tol) {
    int i = 0;
    while (i < nops && strcmp(ops[i].op, op))
        i++;
    if (i == nops) {
        FL_ASSERT(nops < MAX_OPS);
        ops[nops++].op = op;
    }
    ops[i].worst = fmax(ops[i].worst, err);
    ops[i].tol = fmax(ops[i].tol, tol);
    ops[i].checks++;
}

/* |got - want| <= atol + rtol |want| elementwise; the worst |diff| / (atol + rtol max|want|)
 * ... noted as |diff| relative to 1 + max |want| */
static int near(const char *op, const char *what, fl_dtype t, const void *got, const void *want,
                int64_t n, double atol, double rtol) {
    double *g = hbuf((size_t)n * sizeof *g), *w = hbuf((size_t)n * sizeof *w), mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        g[i] = get(t, got, i), w[i] = get(t, want, i);
        mx = fmax(mx, fabs(w[i]));
        double d = fabs(g[i] - w[i]);
        md = isnan(d) ? INFINITY : fmax(md, d);
    }
    note(op, md / (1 + mx), (atol + rtol * mx) / (1 + mx));
    char label[400];
    snprintf(label, sizeof label, "%s [%s]", what, fl_dtype_name(t));
    int ok = CHECK_CLOSE(label, g, w, n, atol, rtol);
    free(g), free(w);
    return ok;
}

/* max |got - want| <= tol (1 + max |want|), as test_backend_onednn.c */
static int rel(const char *op, const char *what, fl_dtype t, const void *got, const void *want,
               int64_t n, double tol) {
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(get(t, want, i)));
    return near(op, what, t, got, want, n, tol * (1 + mx), 0);
}

/* the same bytes */
static int same_bits(const char *op, const char *what, const void *got, const void *want,
                     size_t bytes) {
    note(op, memcmp(got, want, bytes) ? INFINITY : 0, 0);
    if (!memcmp(got, want, bytes))
        return 1;
    const unsigned char *a = got, *b = want;
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    fprintf(stderr, "%s: %s: bits differ from byte %zu on (of %zu)\n", op, what, i, bytes);
    test_failures++;
    return 0;
}

/* f32 kernels differ from the double-accumulating ref by a few ulps; f64 by rounding order */
static double tol(fl_dtype t) { return t == FL_DTYPE_F32 ? 2e-6 : 1e-13; }

static const fl_dtype dtypes[] = {FL_DTYPE_F32, FL_DTYPE_F64};

/* NCHW (N, C, HW) <-> layout on the host, of dtype t */
static void to_layout(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw, const void *src,
                      void *dst) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < hw; i++)
                set(t, dst, l == FL_LAYOUT_NHWC ? (b * hw + i) * c + ch : (b * c + ch) * hw + i,
                    get(t, src, (b * c + ch) * hw + i));
}
static void from_layout(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                        const void *src, void *dst) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < hw; i++)
                set(t, dst, (b * c + ch) * hw + i,
                    get(t, src, l == FL_LAYOUT_NHWC ? (b * hw + i) * c + ch : (b * c + ch) * hw + i));
}

/* ------------------------------------------------------------------------------------------ */
/* memory, copies, streams, events, the allocator's peak, device_bind's errors */

/* alloc, fill, sum, free on a thread of its own */
static void *other_thread(void *arg) {
    void *d = G->alloc(1000 * sizeof(float));
    G->fill(FL_DTYPE_F32, d, 1000, 1.5);
    *(double *)arg = G->sum(FL_DTYPE_F32, d, 1000);
    G->free(d);
    return NULL;
}

static void test_memory(void) {
    size_t peak0 = G->memory_peak();
    CHECK(peak0 > 0); /* device_bind allocated cuBLAS's workspace */
    size_t big = 3u << 20;
    float *d = G->alloc(big);
    CHECK(d && (uintptr_t)d % 64 == 0);
    size_t peak1 = G->memory_peak();
    CHECK(peak1 >= peak0 + big);
    float *h = dget(d, big);
    bool zero = true;
    for (size_t i = 0; i < big / 4; i++)
        zero &= h[i] == 0;
    CHECK(zero);
    G->fill(FL_DTYPE_F32, d, (int64_t)(big / 4), 3.5);
    dback(h, d, big);
    CHECK(h[0] == 3.5f && h[big / 4 - 1] == 3.5f);
    G->free(d);
    /* the same size again: from the cache (no new device memory), zero-filled again */
    float *d2 = G->alloc(big);
    CHECK(G->memory_peak() == peak1);
    dback(h, d2, big);
    zero = true;
    for (size_t i = 0; i < big / 4; i++)
        zero &= h[i] == 0;
    CHECK(zero);
    G->free(d2);
    free(h);
    /* a step's worth of sizes, freed and allocated again: the peak stays */
    static const size_t sizes[] = {0, 1, 63, 64, 4096, 4097, 100000, 1 << 20, 12345678};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            p[i] = G->alloc(sizes[i]);
            CHECK(p[i] && (uintptr_t)p[i] % 64 == 0);
        }
        size_t peak = G->memory_peak();
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            G->free(p[i]);
        if (round > 0)
            CHECK(G->memory_peak() == peak);
        static size_t first;
        if (round == 0)
            first = peak;
        else
            CHECK(peak == first);
    }
    G->free(NULL);

    /* copies of every kind; a pageable host buffer works */
    int64_t n = 100003;
    double *a = hrand(FL_DTYPE_F64, n, -1, 1), *b = hbuf((size_t)n * 8), *c = hbuf((size_t)n * 8);
    void *da = dput(a, (size_t)n * 8), *db = G->alloc((size_t)n * 8);
    G->copy(db, da, (size_t)n * 8, FL_COPY_D2D, NULL);
    dback(b, db, (size_t)n * 8);
    CHECK(!memcmp(a, b, (size_t)n * 8));
    G->copy(c, a, (size_t)n * 8, FL_COPY_H2H, NULL);
    G->stream_sync(NULL);
    CHECK(!memcmp(a, c, (size_t)n * 8));

    /* a copy in a stream of its own, then the default stream waits for its event */
    fl_stream *s = G->stream_create();
    fl_event *e = G->event_create();
    CHECK(s && e);
    for (int64_t i = 0; i < n; i++)
        c[i] = 2 * a[i];
    G->copy(db, c, (size_t)n * 8, FL_COPY_H2D, s);
    G->event_record(e, s);
    G->event_wait(NULL, e);
    G->scale(FL_DTYPE_F64, n, 0.5, db);
    G->event_sync(e);
    G->stream_sync(s);
    dback(b, db, (size_t)n * 8);
    CHECK(!memcmp(a, b, (size_t)n * 8));
    /* and the other way: the stream copies back what the default stream wrote */
    G->scale(FL_DTYPE_F64, n, 4, db);
    G->event_record(e, NULL);
    G->event_wait(s, e);
    G->copy(b, db, (size_t)n * 8, FL_COPY_D2H, s);
    G->stream_sync(s);
    bool ok = true;
    for (int64_t i = 0; i < n; i++)
        ok &= b[i] == 4 * a[i];
    CHECK(ok);
    G->event_free(e);
    G->stream_free(s);
    G->free(da), G->free(db);
    free(a), free(b), free(c);

    /* another thread than the one that bound the device: the same device */
    pthread_t th;
    double sum = 0;
    CHECK(pthread_create(&th, NULL, other_thread, &sum) == 0);
    pthread_join(th, NULL);
    CHECK(sum == 1.5 * 1000);

    /* device_bind: the bound device again is fine; a device that is not there is named */
    CHECK_OK(G->device_bind(0));
    CHECK_RC(G->device_bind(999), FL_EINVAL);
    CHECK_MSG("CUDA device 999");
    CHECK_MSG("device(s) visible");
}

/* ------------------------------------------------------------------------------------------ */
/* the fc layer's and optimizers' ops */

static void test_gemm(fl_dtype t) {
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++) {
        int64_t m = gemm_sizes[s][0], n = gemm_sizes[s][1], k = gemm_sizes[s][2];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t c = 0; c < sizeof gemm_ab / sizeof gemm_ab[0]; c++) {
                    if (m * n * k > 100000 && c != 1)
                        continue;
                    double alpha = gemm_ab[c][0], beta = gemm_ab[c][1];
                    int64_t arows = ta ? k : m, acols = ta ? m : k;
                    int64_t brows = tb ? n : k, bcols = tb ? k : n;
                    int64_t lda = acols + 3, ldb = bcols + 3, ldc = n + 3;
                    void *a = hrand(t, arows * lda, -1, 1), *b = hrand(t, brows * ldb, -1, 1);
                    void *cr = hrand(t, m * ldc, -1, 1);
                    if (beta == 0)
                        for (int64_t i = 0; i < m * ldc; i += 2)
                            set(t, cr, i, NAN);
                    size_t cb = (size_t)(m * ldc) * esz(t);
                    void *da = dput(a, (size_t)(arows * lda) * esz(t));
                    void *dbb = dput(b, (size_t)(brows * ldb) * esz(t)), *dc = dput(cr, cb);
                    G->gemm(t, ta, tb, m, n, k, alpha, da, lda, dbb, ldb, beta, dc, ldc);
                    R->gemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cr, ldc);
                    void *cg = dget(dc, cb);
                    for (int64_t i = 0; i < m * ldc; i++) /* NaN padding kept on both: equal */
                        if (isnan(get(t, cg, i)) && isnan(get(t, cr, i)))
                            set(t, cg, i, 12345), set(t, cr, i, 12345);
                    char what[128];
                    snprintf(what, sizeof what, "gemm %c%c m=%lld n=%lld k=%lld alpha=%g beta=%g",
                             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
                             (long long)k, alpha, beta);
                    near("gemm", what, t, cg, cr, m * ldc, tol(t) * (double)(k + 1) * 2, tol(t));
                    G->free(da), G->free(dbb), G->free(dc);
                    free(a), free(b), free(cr), free(cg);
                }
    }
}

static void test_bias_sum_rows(fl_dtype t) {
    for (size_t s = 0; s < NSHAPES2D; s++) {
        int64_t rows = shapes2d[s][0], cols = shapes2d[s][1], n = rows * cols;
        char what[96];
        void *y = hrand(t, n, -2, 2), *bias = hrand(t, cols, -1, 1);
        void *dy = dput(y, (size_t)n * esz(t)), *dbias = dput(bias, (size_t)cols * esz(t));
        G->add_bias(t, dy, dbias, rows, cols);
        R->add_bias(t, y, bias, rows, cols);
        void *got = dget(dy, (size_t)n * esz(t));
        snprintf(what, sizeof what, "add_bias %lldx%lld", (long long)rows, (long long)cols);
        near("add_bias", what, t, got, y, n, tol(t), tol(t));
        for (int acc = 0; acc < 2; acc++) {
            void *db = hrand(t, cols, -1, 1), *ddb = dput(db, (size_t)cols * esz(t));
            G->sum_rows(t, dy, ddb, rows, cols, acc);
            R->sum_rows(t, y, db, rows, cols, acc);
            void *g = dget(ddb, (size_t)cols * esz(t));
            snprintf(what, sizeof what, "sum_rows %lldx%lld accumulate=%d", (long long)rows,
                     (long long)cols, acc);
            near("sum_rows", what, t, g, db, cols, tol(t) * (double)(rows + 1), tol(t));
            if (!acc) { /* deterministic: again, the same bits */
                G->sum_rows(t, dy, ddb, rows, cols, false);
                void *g2 = dget(ddb, (size_t)cols * esz(t));
                same_bits("sum_rows", "run twice", g2, g, (size_t)cols * esz(t));
                free(g2);
            }
            G->free(ddb), free(db), free(g);
        }
        G->free(dy), G->free(dbias), free(y), free(bias), free(got);
    }
}

static void test_activations(fl_dtype t) {
    for (int a = FL_ACT_NONE; a < FL_ACT_COUNT; a++)
        for (size_t s = 0; s < NCOUNTS; s++) {
            int64_t n = counts[s];
            size_t nb = (size_t)n * esz(t);
            char what[96];
            void *x = hrand(t, n, -12, 12);
            if (n > 3)
                set(t, x, 0, 0.3), set(t, x, 1, -100), set(t, x, 2, 100);
            if (n > 7) /* the hard activations' kinks */
                set(t, x, 3, -3), set(t, x, 4, 3), set(t, x, 5, -2.999), set(t, x, 6, 2.999);
            void *y = hbuf(nb), *dx = hbuf(nb), *dy = hrand(t, n, -1, 1);
            R->act_forward(t, (fl_act)a, x, y, n);
            R->act_backward(t, (fl_act)a, x, y, dy, dx, n);
            void *gx = dput(x, nb), *gy = G->alloc(nb), *gdy = dput(dy, nb), *gdx = G->alloc(nb);
            G->act_forward(t, (fl_act)a, gx, gy, n);
            void *h = dget(gy, nb);
            snprintf(what, sizeof what, "act_forward %s n=%lld", fl_act_name((fl_act)a),
                     (long long)n);
            near("act_forward", what, t, h, y, n, tol(t) / 2, tol(t) / 2);
            G->act_forward(t, (fl_act)a, gx, gx, n); /* in place */
            void *h2 = dget(gx, nb);
            same_bits("act_forward", "in place", h2, h, nb);
            /* backward from the ref's y, as test_kernels.c */
            G->copy(gy, y, nb, FL_COPY_H2D, NULL);
            G->copy(gx, x, nb, FL_COPY_H2D, NULL);
            G->act_backward(t, (fl_act)a, gx, gy, gdy, gdx, n);
            void *h3 = dget(gdx, nb);
            snprintf(what, sizeof what, "act_backward %s n=%lld", fl_act_name((fl_act)a),
                     (long long)n);
            near("act_backward", what, t, h3, dx, n, tol(t) / 2, tol(t) / 2);
            G->act_backward(t, (fl_act)a, gx, gy, gdy, gdy, n); /* dx aliases dy */
            void *h4 = dget(gdy, nb);
            same_bits("act_backward", "in place", h4, h3, nb);
            G->free(gx), G->free(gy), G->free(gdy), G->free(gdx);
            free(x), free(y), free(dx), free(dy), free(h), free(h2), free(h3), free(h4);
        }
    /* NaN propagates; +-inf saturate */
    double special[] = {NAN, INFINITY, -INFINITY};
    double want[][3] = {{NAN, INFINITY, -INFINITY}, {NAN, INFINITY, 0}, {NAN, 1, -1}, {NAN, 1, 0},
                        {NAN, INFINITY, 0},          {NAN, 1, 0}};
    for (int a = FL_ACT_NONE; a < FL_ACT_COUNT; a++) {
        void *x = hbuf(3 * esz(t));
        for (int i = 0; i < 3; i++)
            set(t, x, i, special[i]);
        void *gx = dput(x, 3 * esz(t)), *gy = G->alloc(3 * esz(t));
        G->act_forward(t, (fl_act)a, gx, gy, 3);
        void *y = dget(gy, 3 * esz(t));
        CHECK(isnan(get(t, y, 0)));
        CHECK(get(t, y, 1) == want[a][1]);
        CHECK(get(t, y, 2) == want[a][2]);
        G->free(gx), G->free(gy), free(x), free(y);
    }
}

/* axpy, scale and the optimizer updates: within tol of the ref, and the cpu table's bits (the
 * same float operations: .cu files are built with --fmad=false) */
static void test_axpy_scale_updates(fl_dtype t) {
    for (size_t s = 0; s < NCOUNTS; s++) {
        int64_t n = counts[s];
        size_t nb = (size_t)n * esz(t);
        char what[128];
        void *x = hrand(t, n, -1, 1), *y = hrand(t, n, -1, 1);
        void *yr = hdup(y, nb), *yc = hdup(y, nb), *gx = dput(x, nb), *gy = dput(y, nb);
        G->axpy(t, n, -0.37, gx, gy);
        R->axpy(t, n, -0.37, x, yr);
        CPU->axpy(t, n, -0.37, x, yc);
        G->scale(t, n, 1.7, gy);
        R->scale(t, n, 1.7, yr);
        CPU->scale(t, n, 1.7, yc);
        void *h = dget(gy, nb);
        snprintf(what, sizeof what, "axpy + scale n=%lld", (long long)n);
        near("axpy, scale", what, t, h, yr, n, 2 * tol(t), 2 * tol(t));
        same_bits("axpy, scale (cpu bits)", what, h, yc, nb);
        if (n > 1) { /* one element off 16-byte alignment: the element-at-a-time path's bits */
            size_t e = esz(t);
            G->copy(gy, y, nb, FL_COPY_H2D, NULL);
            G->axpy(t, n - 1, -0.37, (char *)gx + e, (char *)gy + e);
            G->scale(t, n - 1, 1.7, (char *)gy + e);
            void *h3 = dget((char *)gy + e, nb - e);
            same_bits("axpy, scale (cpu bits)", "arrays not 16-byte aligned", h3, (char *)yc + e,
                      nb - e);
            free(h3);
        }
        G->free(gx), G->free(gy), free(x), free(y), free(yr), free(yc), free(h);

        for (int wd = 0; wd < 2; wd++) {
            double decay = wd ? 1e-2 : 0;
            void *w = hrand(t, n, -1, 1), *g = hrand(t, n, -1, 1);
            void *wr = hdup(w, nb), *wc = hdup(w, nb), *gw = dput(w, nb), *gg = dput(g, nb);
            G->sgd_update(t, n, gw, gg, 0.1, decay);
            R->sgd_update(t, n, wr, g, 0.1, decay);
            CPU->sgd_update(t, n, wc, g, 0.1, decay);
            void *hw = dget(gw, nb);
            snprintf(what, sizeof what, "sgd_update n=%lld wd=%g", (long long)n, decay);
            near("sgd_update", what, t, hw, wr, n, tol(t), tol(t));
            same_bits("sgd_update (cpu bits)", what, hw, wc, nb);
            free(hw);
            for (int nesterov = 0; nesterov < 2; nesterov++) {
                void *v = hrand(t, n, -1, 1), *vr = hdup(v, nb), *vc = hdup(v, nb);
                void *gv = dput(v, nb);
                for (int step = 0; step < 3; step++) {
                    G->momentum_update(t, n, gw, gg, gv, 0.1, 0.9, decay, nesterov);
                    R->momentum_update(t, n, wr, g, vr, 0.1, 0.9, decay, nesterov);
                    CPU->momentum_update(t, n, wc, g, vc, 0.1, 0.9, decay, nesterov);
                }
                void *hw2 = dget(gw, nb), *hv = dget(gv, nb);
                snprintf(what, sizeof what, "momentum_update n=%lld wd=%g nesterov=%d",
                         (long long)n, decay, nesterov);
                near("momentum_update", what, t, hw2, wr, n, 4 * tol(t), 4 * tol(t));
                near("momentum_update", what, t, hv, vr, n, 4 * tol(t), 4 * tol(t));
                same_bits("momentum_update (cpu bits)", what, hw2, wc, nb);
                same_bits("momentum_update (cpu bits)", what, hv, vc, nb);
                G->free(gv), free(v), free(vr), free(vc), free(hw2), free(hv);
            }
            G->free(gw), G->free(gg), free(w), free(g), free(wr), free(wc);
        }
    }
}

/* bn_running (batch norm's running statistics, on the device): the cpu table's bits, 0, 1 and
 * odd channel counts, a count of 1 (var as it is) and larger */
static void test_bn_running(fl_dtype t) {
    static const double batch_counts[] = {1, 2, 37};
    for (size_t s = 0; s < NCOUNTS; s++)
        for (int k = 0; k < 3; k++) {
            int64_t c = counts[s];
            size_t nb = (size_t)c * esz(t), db = (size_t)c * sizeof(double);
            double *mean = hrand(FL_DTYPE_F64, c, -3, 3), *var = hrand(FL_DTYPE_F64, c, 0, 4);
            void *rm = hrand(t, c, -1, 1), *rv = hrand(t, c, 0.5, 2);
            void *cm = hdup(rm, nb), *cv = hdup(rv, nb);
            void *gmean = dput(mean, db), *gvar = dput(var, db), *gm = dput(rm, nb),
                 *gv = dput(rv, nb);
            G->bn_running(t, c, gmean, gvar, batch_counts[k], 0.1, gm, gv);
            CPU->bn_running(t, c, mean, var, batch_counts[k], 0.1, cm, cv);
            void *hm = dget(gm, nb), *hv = dget(gv, nb);
            char what[96];
            snprintf(what, sizeof what, "c=%lld count %g", (long long)c, batch_counts[k]);
            same_bits("bn_running (cpu bits)", what, hm, cm, nb);
            same_bits("bn_running (cpu bits)", what, hv, cv, nb);
            G->free(gmean), G->free(gvar), G->free(gm), G->free(gv);
            free(mean), free(var), free(rm), free(rv), free(cm), free(cv), free(hm), free(hv);
        }
}

/* lars_update_run: LARS over a run of tensors in three launches, the bits of the optimizer's
 * tensor-by-tensor path on this table (sumsq, axpy, scale: the same table without the op),
 * over 3 steps; sizes around the reduction's blocks (8192 and more), excluded names, L2 decay
 * on and off, a run split in two by a gradient elsewhere */
static void test_lars_run(fl_dtype t) {
    static const int64_t sizes[] = {1, 7, 8192, 8193, 70001, 3};
    static const char *names[] = {"a.weight", "a.bias", "b.weight", "b.bn.weight", "c.weight",
                                  "c.bias"};
    enum { NT = 6 };
    fl_backend nolars = *G;
    nolars.lars_update_run = NULL;
    size_t es = esz(t);
    int64_t total = 0;
    for (int k = 0; k < NT; k++)
        total += sizes[k];
    for (int variant = 0; variant < 3; variant++) {
        double l2 = variant == 1 ? 0 : 1e-4;
        bool split = variant == 2;
        fl_optim_config c = {.type = FL_OPTIM_LARS, .momentum = 0.9, .weight_decay = l2,
                             .lars_coeff = 0.001, .lars_weight_decay = 0.0005, .epsilon = 1e-8,
                             .exclude_from_weight_decay = "bn, bias"};
        void *hw = hrand(t, total, -1, 1);
        char *dw[2], *dg[2];
        fl_param params[2][NT];
        fl_optim *opt[2];
        for (int k = 0; k < 2; k++) {
            dw[k] = dput(hw, (size_t)total * es);
            dg[k] = G->alloc((size_t)total * es);
            memset(params[k], 0, sizeof params[k]);
            size_t off = 0;
            for (int p = 0; p < NT; p++) {
                snprintf(params[k][p].name, sizeof params[k][p].name, "%s", names[p]);
                fl_tensor_view(&params[k][p].value, t, 1, &sizes[p], dw[k] + off);
                /* split: the third tensor's gradient after the last, so the run breaks there */
                size_t goff = split && p == 2 ? (size_t)(total - sizes[2]) * es : off;
                if (split && p > 2)
                    goff = off - (size_t)sizes[2] * es;
                fl_tensor_view(&params[k][p].grad, t, 1, &sizes[p], dg[k] + goff);
                params[k][p].value.device = params[k][p].grad.device = fl_backend_device(G);
                params[k][p].trainable = true;
                off += (size_t)sizes[p] * es;
            }
            opt[k] = fl_optim_create(&c, params[k], NT, t, k ? &nolars : G);
            CHECK(opt[k] != NULL);
        }
        for (int step = 0; step < 3 && opt[0] && opt[1]; step++) {
            void *hg = hrand(t, total, -0.1, 0.1);
            G->copy(dg[0], hg, (size_t)total * es, FL_COPY_H2D, NULL);
            G->copy(dg[1], hg, (size_t)total * es, FL_COPY_H2D, NULL);
            CHECK_OK(fl_optim_step(opt[0], 0.1 * (step + 1), NULL));
            CHECK_OK(fl_optim_step(opt[1], 0.1 * (step + 1), NULL));
            void *w0 = dget(dw[0], (size_t)total * es), *w1 = dget(dw[1], (size_t)total * es);
            void *v0 = dget(fl_optim_state(opt[0], 0)->value.data, (size_t)total * es);
            void *v1 = dget(fl_optim_state(opt[1], 0)->value.data, (size_t)total * es);
            char what[96];
            snprintf(what, sizeof what, "l2 %g%s, step %d", l2, split ? ", split" : "", step);
            same_bits("lars_update_run (the table's own bits)", what, w0, w1, (size_t)total * es);
            same_bits("lars_update_run (the table's own bits)", what, v0, v1, (size_t)total * es);
            free(hg), free(w0), free(w1), free(v0), free(v1);
        }
        for (int k = 0; k < 2; k++)
            fl_optim_free(opt[k]), G->free(dw[k]), G->free(dg[k]);
        free(hw);
    }
}

/* amp_round: the cpu table's bits on random values over f32's whole range and on the edges
 * (f16's overflow, its subnormals and their ties, bf16's carry into inf, inf, NaN, -0) */
static void test_amp_round(void) {
    static const float edge[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e-8f,
                                 2.9802322e-8f, 5.9604645e-8f, 8.940697e-8f, 6.1035156e-5f,
                                 6.0975552e-5f, 3.4028235e38f, -3.4028235e38f, 1.0009766f,
                                 1.0029297f, INFINITY, -INFINITY, NAN, 1.0f / 3};
    int64_t n = 100003;
    size_t nb = (size_t)n * sizeof(float);
    float *x = hbuf(nb);
    for (int64_t i = 0; i < n; i++) { /* random bits: every exponent, both signs */
        uint32_t u = (uint32_t)fl_rng_below(&rng, UINT32_MAX);
        memcpy(&x[i], &u, 4);
    }
    memcpy(x, edge, sizeof edge);
    fl_dtype lows[2] = {FL_DTYPE_F16, FL_DTYPE_BF16};
    for (int l = 0; l < 2; l++) {
        float *want = hdup(x, nb);
        void *d = dput(x, nb);
        CPU->amp_round(lows[l], n, want);
        G->amp_round(lows[l], n, d);
        G->amp_round(lows[l], 0, d);
        float *got = dget(d, nb);
        same_bits("amp_round (cpu bits)", fl_dtype_name(lows[l]), got, want, nb);
        G->free(d), free(want), free(got);
    }
    free(x);
}

static void test_reductions(fl_dtype t) {
    for (size_t s = 0; s < sizeof reduce_ns / sizeof reduce_ns[0]; s++) {
        int64_t n = reduce_ns[s];
        void *x = hrand(t, n, -1, 1.5), *gx = dput(x, (size_t)n * esz(t));
        double asum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++)
            asum += fabs(get(t, x, i)), sq += get(t, x, i) * get(t, x, i);
        char what[96];
        snprintf(what, sizeof what, "sum n=%lld", (long long)n);
        double got = G->sum(t, gx, n), want = R->sum(t, x, n);
        near("sum", what, FL_DTYPE_F64, &got, &want, 1, 1e-12 * (asum + 1), 0);
        snprintf(what, sizeof what, "sumsq n=%lld", (long long)n);
        double got2 = G->sumsq(t, gx, n), want2 = R->sumsq(t, x, n);
        near("sumsq", what, FL_DTYPE_F64, &got2, &want2, 1, 1e-12 * (sq + 1), 0);
        double again = G->sum(t, gx, n), again2 = G->sumsq(t, gx, n);
        same_bits("sum", "run twice", &again, &got, sizeof got);
        same_bits("sumsq", "run twice", &again2, &got2, sizeof got2);
        G->free(gx), free(x);
    }
}

static int32_t *rand_labels(int64_t rows, int64_t classes) {
    int32_t *l = hbuf((size_t)rows * sizeof *l);
    for (int64_t r = 0; r < rows; r++)
        l[r] = (int32_t)fl_rng_below(&rng, (uint64_t)classes);
    return l;
}

static void test_softmax(fl_dtype t) {
    for (size_t s = 0; s < sizeof softmax_shapes / sizeof softmax_shapes[0]; s++) {
        int64_t rows = softmax_shapes[s][0], classes = softmax_shapes[s][1], n = rows * classes;
        size_t nb = (size_t)n * esz(t), lb = (size_t)rows * sizeof(int32_t);
        for (int huge = 0; huge < 2; huge++) {
            char what[128];
            double scale = huge ? 1e4 : 3;
            void *x = hrand(t, n, -scale, scale), *p = hbuf(nb);
            int32_t *lab = rand_labels(rows, classes);
            void *gx = dput(x, nb), *gp = G->alloc(nb), *gl = dput(lab, lb);
            double loss = G->softmax_xent_forward(t, gx, gl, gp, rows, classes);
            double loss_ref = R->softmax_xent_forward(t, x, lab, p, rows, classes);
            snprintf(what, sizeof what, "softmax_xent_forward %lldx%lld scale %g",
                     (long long)rows, (long long)classes, scale);
            CHECK(isfinite(loss));
            near("softmax_xent_forward loss", what, FL_DTYPE_F64, &loss, &loss_ref, 1,
                 tol(t) * (double)(rows + 1), tol(t));
            void *hp = dget(gp, nb);
            near("softmax_xent_forward probs", what, t, hp, p, n, tol(t), tol(t));
            double again = G->softmax_xent_forward(t, gx, gl, gp, rows, classes);
            same_bits("softmax_xent_forward loss", "run twice", &again, &loss, sizeof loss);
            /* probs may alias logits */
            void *gx2 = dput(x, nb);
            double loss2 = G->softmax_xent_forward(t, gx2, gl, gx2, rows, classes);
            void *hp2 = dget(gx2, nb);
            same_bits("softmax_xent_forward probs", "in place", hp2, hp, nb);
            same_bits("softmax_xent_forward loss", "in place", &loss2, &loss, sizeof loss);
            /* backward from the ref's probs */
            double bs = rows ? 1.0 / (double)rows : 1;
            void *d = hbuf(nb), *gd = G->alloc(nb);
            G->copy(gp, p, nb, FL_COPY_H2D, NULL);
            G->softmax_xent_backward(t, gp, gl, gd, rows, classes, bs);
            R->softmax_xent_backward(t, p, lab, d, rows, classes, bs);
            void *hd = dget(gd, nb);
            near("softmax_xent_backward", what, t, hd, d, n, tol(t), tol(t));
            G->softmax_xent_backward(t, gp, gl, gp, rows, classes, bs); /* in place */
            void *hd2 = dget(gp, nb);
            same_bits("softmax_xent_backward", "in place", hd2, hd, nb);
            /* label smoothing's terms */
            double st = G->xent_smooth_term(t, gx, rows, classes);
            double st_ref = R->xent_smooth_term(t, x, rows, classes);
            near("xent_smooth_term", what, FL_DTYPE_F64, &st, &st_ref, 1,
                 1e-12 * (double)(rows + 1) * (1 + scale), 1e-12);
            void *dc = hdup(d, nb); /* all three from the ref's gradient */
            G->copy(gd, d, nb, FL_COPY_H2D, NULL);
            G->xent_smooth_backward(t, gl, gd, rows, classes, 0.9, 0.1 / (double)classes);
            R->xent_smooth_backward(t, lab, d, rows, classes, 0.9, 0.1 / (double)classes);
            CPU->xent_smooth_backward(t, lab, dc, rows, classes, 0.9, 0.1 / (double)classes);
            void *hs = dget(gd, nb);
            near("xent_smooth_backward", what, t, hs, d, n, tol(t), tol(t));
            same_bits("xent_smooth_backward (cpu bits)", what, hs, dc, nb);
            G->free(gx), G->free(gp), G->free(gl), G->free(gx2), G->free(gd);
            free(x), free(p), free(lab), free(hp), free(hp2), free(d), free(hd), free(hd2);
            free(dc), free(hs);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the small layers: residual add, dropout, option-A shortcut, reorder, fill */

static void test_layer_ops(fl_dtype t) {
    for (size_t s = 0; s < NCOUNTS; s++) {
        int64_t n = counts[s];
        size_t nb = (size_t)n * esz(t);
        char what[96];
        snprintf(what, sizeof what, "n=%lld", (long long)n);
        void *a = hrand(t, n, -1, 1), *b = hrand(t, n, -1, 1), *dy = hrand(t, n, -1, 1);
        void *ga = dput(a, nb), *gb = dput(b, nb), *gdy = dput(dy, nb), *gy = G->alloc(nb);
        void *gda = G->alloc(nb), *gdb = G->alloc(nb);
        for (int relu = 0; relu < 2; relu++) {
            void *y = hbuf(nb), *da = hbuf(nb), *db = hbuf(nb);
            R->add_forward(t, a, b, y, n, relu);
            G->add_forward(t, ga, gb, gy, n, relu);
            void *hy = dget(gy, nb);
            same_bits("add_forward", what, hy, y, nb);
            R->add_backward(t, y, dy, da, db, n, relu);
            G->add_backward(t, gy, gdy, gda, gdb, n, relu);
            void *hda = dget(gda, nb), *hdb = dget(gdb, nb);
            same_bits("add_backward", what, hda, da, nb);
            same_bits("add_backward", what, hdb, db, nb);
            G->add_backward(t, gy, gdy, NULL, gdb, n, relu); /* either may be NULL */
            G->add_forward(t, ga, gb, ga, n, relu);         /* y may alias a */
            void *hy2 = dget(ga, nb);
            same_bits("add_forward", "in place", hy2, y, nb);
            G->copy(ga, a, nb, FL_COPY_H2D, NULL);
            if (n > 1) { /* arrays one element off 16-byte alignment: the bits of the rest */
                size_t e = esz(t), mb = nb - e;
                G->add_forward(t, (char *)ga + e, (char *)gb + e, (char *)gy + e, n - 1, relu);
                void *hy3 = dget((char *)gy + e, mb);
                same_bits("add_forward", "arrays not 16-byte aligned", hy3, (char *)y + e, mb);
                G->add_backward(t, (char *)gy + e, (char *)gdy + e, (char *)gda + e,
                                (char *)gdb + e, n - 1, relu);
                void *hda3 = dget((char *)gda + e, mb), *hdb3 = dget((char *)gdb + e, mb);
                same_bits("add_backward", "arrays not 16-byte aligned", hda3, (char *)da + e, mb);
                same_bits("add_backward", "arrays not 16-byte aligned", hdb3, (char *)db + e, mb);
                free(hy3), free(hda3), free(hdb3);
            }
            free(y), free(da), free(db), free(hy), free(hda), free(hdb), free(hy2);
        }
        /* dropout: the cpu table's masks, bit for bit */
        static const double ps[] = {0.1, 0.5};
        for (int i = 0; i < 2; i++) {
            void *o = hbuf(nb);
            uint64_t seed = 0x123456789abcdefULL + (uint64_t)i, step = 7 + (uint64_t)i * 0x100000001ULL;
            CPU->dropout_mask(t, seed, step, ps[i], a, o, n);
            G->dropout_mask(t, seed, step, ps[i], ga, gy, n);
            void *h = dget(gy, nb);
            same_bits("dropout_mask (cpu bits)", what, h, o, nb);
            G->dropout_mask(t, seed, step, ps[i], gy, gy, n); /* in place: the mask again */
            CPU->dropout_mask(t, seed, step, ps[i], o, o, n);
            void *h2 = dget(gy, nb);
            same_bits("dropout_mask (cpu bits)", "in place", h2, o, nb);
            free(o), free(h), free(h2);
        }
        G->free(ga), G->free(gb), G->free(gdy), G->free(gy), G->free(gda), G->free(gdb);
        free(a), free(b), free(dy);
    }
    /* fill */
    void *gf = G->alloc(1001 * esz(t)), *hf = hbuf(1001 * esz(t)), *rf = hbuf(1001 * esz(t));
    G->fill(t, gf, 1001, -2.75);
    R->fill(t, rf, 1001, -2.75);
    dback(hf, gf, 1001 * esz(t));
    same_bits("fill", "1001", hf, rf, 1001 * esz(t));
    G->free(gf), free(hf), free(rf);

    /* reorder and the option-A shortcut, both layouts, against the ref */
    static const int64_t shapes[][5] = {/* n, c, h, w, stride -> oc */
                                        {2, 3, 5, 7, 2}, {1, 16, 32, 32, 2}, {3, 5, 4, 4, 1},
                                        {2, 8, 7, 9, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n = shapes[s][0], c = shapes[s][1], h = shapes[s][2], w = shapes[s][3];
        int64_t st = shapes[s][4], oc = 2 * c + (s == 2), oh = (h + st - 1) / st;
        int64_t ow = (w + st - 1) / st, nx = n * c * h * w, ny = n * oc * oh * ow;
        char what[96];
        snprintf(what, sizeof what, "%lldx%lldx%lldx%lld stride %lld -> %lld", (long long)n,
                 (long long)c, (long long)h, (long long)w, (long long)st, (long long)oc);
        void *x = hrand(t, nx, -1, 1), *r = hbuf((size_t)nx * esz(t));
        void *gx = dput(x, (size_t)nx * esz(t)), *gr = G->alloc((size_t)nx * esz(t));
        for (int to = 0; to < 2; to++) {
            R->reorder(t, to, n, c, h * w, x, r);
            G->reorder(t, to, n, c, h * w, gx, gr);
            void *hr = dget(gr, (size_t)nx * esz(t));
            same_bits("reorder", what, hr, r, (size_t)nx * esz(t));
            free(hr);
        }
        for (int li = 0; li < 2; li++) {
            fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            void *y = hbuf((size_t)ny * esz(t)), *xb = hbuf((size_t)nx * esz(t));
            void *gy = G->alloc((size_t)ny * esz(t)), *gxb = G->alloc((size_t)nx * esz(t));
            void *yv = hrand(t, ny, -1, 1), *gyv = dput(yv, (size_t)ny * esz(t));
            R->channel_pad(t, l, n, c, h, w, st, oc, x, y, true);
            G->channel_pad(t, l, n, c, h, w, st, oc, gx, gy, true);
            void *hy = dget(gy, (size_t)ny * esz(t));
            same_bits("channel_pad forward", what, hy, y, (size_t)ny * esz(t));
            R->channel_pad(t, l, n, c, h, w, st, oc, xb, yv, false);
            G->channel_pad(t, l, n, c, h, w, st, oc, gxb, gyv, false);
            void *hx = dget(gxb, (size_t)nx * esz(t));
            same_bits("channel_pad backward", what, hx, xb, (size_t)nx * esz(t));
            G->free(gy), G->free(gxb), G->free(gyv);
            free(y), free(xb), free(yv), free(hy), free(hx);
        }
        G->free(gx), G->free(gr), free(x), free(r);
    }
}

/* squeeze-and-excitation's channel-wise scale and concatenation's copies against ref, both
 * layouts: the products and copies bit for bit, ds (summed in double, pixels in order on both)
 * bit for bit too */
static void test_channel_ops(fl_dtype t) {
    static const int64_t shapes[][3] = {{0, 3, 4}, {1, 1, 1}, {2, 5, 7}, {3, 70, 9},
                                        {4, 130, 49}, {16, 64, 64}}; /* n, c, hw */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int li = 0; li < 2; li++) {
            fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            int64_t n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], e = n * c * hw;
            size_t nb = (size_t)e * esz(t), sb = (size_t)(n * c) * esz(t);
            char what[96];
            snprintf(what, sizeof what, "%s n=%lld c=%lld hw=%lld", fl_layout_name(l),
                     (long long)n, (long long)c, (long long)hw);
            void *x = hrand(t, e, -2, 2), *sc = hrand(t, n * c, -1, 1), *dy = hrand(t, e, -1, 1);
            void *y = hbuf(nb), *dx = hbuf(nb), *ds = hbuf(sb);
            void *gx = dput(x, nb), *gs = dput(sc, sb), *gdy = dput(dy, nb);
            void *gy = G->alloc(nb), *gdx = G->alloc(nb), *gds = G->alloc(sb);
            R->channel_mul_forward(t, l, n, c, hw, x, sc, y);
            G->channel_mul_forward(t, l, n, c, hw, gx, gs, gy);
            void *hy = dget(gy, nb);
            same_bits("channel_mul_forward", what, hy, y, nb);
            R->channel_mul_backward(t, l, n, c, hw, x, sc, dy, dx, ds);
            G->channel_mul_backward(t, l, n, c, hw, gx, gs, gdy, gdx, gds);
            void *hdx = dget(gdx, nb), *hds = dget(gds, sb);
            same_bits("channel_mul_backward", what, hdx, dx, nb);
            same_bits("channel_mul_backward ds", what, hds, ds, sb);
            /* concatenation of x (c) and y (c) into (2c), and y's half back */
            void *cat = hbuf(2 * nb), *gcat = G->alloc(2 * nb), *back = G->alloc(nb);
            R->channel_slice(t, l, n, hw, c, x, 2 * c, 0, cat, true);
            R->channel_slice(t, l, n, hw, c, y, 2 * c, c, cat, true);
            G->channel_slice(t, l, n, hw, c, gx, 2 * c, 0, gcat, true);
            G->channel_slice(t, l, n, hw, c, gy, 2 * c, c, gcat, true);
            void *hcat = dget(gcat, 2 * nb);
            same_bits("channel_slice forward", what, hcat, cat, 2 * nb);
            G->channel_slice(t, l, n, hw, c, back, 2 * c, c, gcat, false);
            void *hback = dget(back, nb);
            same_bits("channel_slice backward", what, hback, y, nb);
            G->free(gx), G->free(gs), G->free(gdy), G->free(gy), G->free(gdx), G->free(gds);
            G->free(gcat), G->free(back);
            free(x), free(sc), free(dy), free(y), free(dx), free(ds), free(hy), free(hdx);
            free(hds), free(cat), free(hcat), free(hback);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* convolution: every case in both layouts (f32), the small ones in f64 */

/* FLEET_CUDNN_DETERMINISTIC=0 (the backend's train.deterministic: false): the backwards may
 * use algorithms whose bits vary from call to call */
static bool fast_algorithms(void) {
    const char *v = getenv("FLEET_CUDNN_DETERMINISTIC");
    return v && v[0] == '0';
}

static double conv_tol(fl_dtype t, int64_t k) {
    if (t == FL_DTYPE_F64)
        return 1e-12 * sqrt((double)k + 1);
    double v = 2.5e-7 * sqrt((double)k);
    return v < 1e-5 ? 1e-5 : v > 1e-4 ? 1e-4 : v;
}

static void check_conv(fl_dtype t, const conv_case *cc) {
    fl_conv_desc d = {.dtype = t, .oc = cc->oc, .groups = cc->groups, .bias = cc->bias,
                      .g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh, .kw = cc->kw,
                            .sh = cc->sh, .sw = cc->sw, .ph = cc->ph, .pw = cc->pw, .dh = cc->dh,
                            .dw = cc->dw}};
    CHECK(fl_conv_geom_out(&d.g));
    int64_t n = cc->n, N = cc->n + cc->extra, oh = d.g.oh, ow = d.g.ow;
    int64_t in = cc->ic * cc->h * cc->w, out = cc->oc * oh * ow;
    int64_t nw = cc->oc * (cc->ic / cc->groups) * cc->kh * cc->kw;
    size_t e = esz(t);
    double ws = 1 / sqrt((double)nw / (double)cc->oc);
    void *x = hrand(t, N * in, -1, 1), *w = hrand(t, nw, -ws, ws), *b = hrand(t, cc->oc, -.5, .5);
    void *dy = hrand(t, n * out, -1, 1), *dw0 = hrand(t, nw, -1, 1), *db0 = hrand(t, cc->oc, -1, 1);
    const void *bias = cc->bias ? b : NULL;

    /* the reference: forward on N images, the backwards on the first n */
    d.layout = FL_LAYOUT_NCHW, d.max_batch = N;
    fl_conv_plan *rp = R->conv_plan_create(&d);
    CHECK(rp);
    if (!rp)
        return;
    void *rs = R->alloc(R->conv_scratch_bytes(rp));
    void *y_ref = hbuf((size_t)(N * out) * e), *dx_ref = hbuf((size_t)(n * in) * e);
    void *dw_ref = hbuf((size_t)nw * e), *db_ref = hbuf((size_t)cc->oc * e);
    void *dwa_ref = hbuf((size_t)nw * e), *dba_ref = hbuf((size_t)cc->oc * e);
    R->conv_forward(rp, N, x, w, bias, y_ref, rs);
    R->conv_backward_data(rp, n, dy, w, dx_ref, rs);
    R->conv_backward_filter(rp, n, x, dy, dw_ref, cc->bias ? db_ref : NULL, false, rs);
    for (int64_t i = 0; i < nw; i++)
        set(t, dwa_ref, i, get(t, dw0, i) + get(t, dw_ref, i));
    for (int64_t i = 0; i < cc->oc; i++)
        set(t, dba_ref, i, get(t, db0, i) + get(t, db_ref, i));
    R->free(rs);
    R->conv_plan_free(rp);

    int64_t kf = cc->ic / cc->groups * cc->kh * cc->kw, kd = cc->oc / cc->groups * cc->kh * cc->kw;
    int64_t kw_ = n * oh * ow;
    void *xl = hbuf((size_t)(N * in) * e), *dyl = hbuf((size_t)(n * out) * e);
    void *tmp = hbuf((size_t)(N * out + n * in) * e);
    void *gw = dput(w, (size_t)nw * e), *gb = dput(b, (size_t)cc->oc * e);
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        char what[600];
        d.layout = l, d.max_batch = N;
        fl_conv_plan *p = G->conv_plan_create(&d);
        if (!p && t == FL_DTYPE_F64 && l == FL_LAYOUT_NHWC) {
            /* cuDNN may have no f64 channels-last algorithm: then a clear refusal */
            fprintf(stderr, "%s f64 NHWC: not planned: %s\n", cc->name, fl_errmsg());
            CHECK_MSG("NHWC");
            continue;
        }
        CHECK(p);
        if (!p) {
            fprintf(stderr, "%s %s: cuda plan: %s\n", cc->name, fl_layout_name(l), fl_errmsg());
            continue;
        }
        size_t sb = G->conv_scratch_bytes(p);
        void *s = G->alloc(sb);
        to_layout(t, l, N, cc->ic, cc->h * cc->w, x, xl);
        to_layout(t, l, n, cc->oc, oh * ow, dy, dyl);
        void *gx = dput(xl, (size_t)(N * in) * e), *gdy = dput(dyl, (size_t)(n * out) * e);
        void *gy = G->alloc((size_t)(N * out) * e), *gdx = G->alloc((size_t)(n * in) * e);
        void *gdw = G->alloc((size_t)nw * e), *gdb = G->alloc((size_t)cc->oc * e);
        const void *gbias = cc->bias ? gb : NULL;
        /* forward at the plan's max batch, then the batch of n (other algorithms) */
        for (int k = 0; k < 2; k++) {
            int64_t nn = k ? n : N;
            G->conv_forward(p, nn, gx, gw, gbias, gy, s);
            void *h = dget(gy, (size_t)(nn * out) * e);
            from_layout(t, l, nn, cc->oc, oh * ow, h, tmp);
            snprintf(what, sizeof what, "%s %s: forward, batch %lld", cc->name,
                     fl_layout_name(l), (long long)nn);
            rel("conv forward", what, t, tmp, y_ref, nn * out, conv_tol(t, kf));
            free(h);
        }
        G->conv_backward_data(p, n, gdy, gw, gdx, s);
        void *hdx = dget(gdx, (size_t)(n * in) * e);
        from_layout(t, l, n, cc->ic, cc->h * cc->w, hdx, tmp);
        snprintf(what, sizeof what, "%s %s: backward data", cc->name, fl_layout_name(l));
        rel("conv backward data", what, t, tmp, dx_ref, n * in, conv_tol(t, kd));
        G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, false, s);
        void *hdw = dget(gdw, (size_t)nw * e), *hdb = dget(gdb, (size_t)cc->oc * e);
        snprintf(what, sizeof what, "%s %s: dw", cc->name, fl_layout_name(l));
        rel("conv backward filter", what, t, hdw, dw_ref, nw, conv_tol(t, kw_));
        if (cc->bias) {
            snprintf(what, sizeof what, "%s %s: dbias", cc->name, fl_layout_name(l));
            rel("conv backward filter", what, t, hdb, db_ref, cc->oc, conv_tol(t, kw_));
        }
        /* bit-repeatable (unless FLEET_CUDNN_DETERMINISTIC=0 lets any algorithm serve, when
         * the ref tolerances above are what holds): the backwards again */
        G->conv_backward_data(p, n, gdy, gw, gdx, s);
        G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, false, s);
        void *hdx2 = dget(gdx, (size_t)(n * in) * e), *hdw2 = dget(gdw, (size_t)nw * e);
        void *hdb2 = dget(gdb, (size_t)cc->oc * e);
        snprintf(what, sizeof what, "%s %s: run twice", cc->name, fl_layout_name(l));
        if (!fast_algorithms()) {
            same_bits("conv backward data (repeat)", what, hdx2, hdx, (size_t)(n * in) * e);
            same_bits("conv backward filter (repeat)", what, hdw2, hdw, (size_t)nw * e);
        } else { /* the first run's values, both in the device's layout */
            rel("conv backward data", what, t, hdx2, hdx, n * in, conv_tol(t, kd));
            rel("conv backward filter", what, t, hdw2, hdw, nw, conv_tol(t, kw_));
        }
        same_bits("conv backward filter (repeat)", what, hdb2, hdb, (size_t)cc->oc * e);
        /* accumulating into dw0, db0 */
        G->copy(gdw, dw0, (size_t)nw * e, FL_COPY_H2D, NULL);
        G->copy(gdb, db0, (size_t)cc->oc * e, FL_COPY_H2D, NULL);
        G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, true, s);
        void *hdwa = dget(gdw, (size_t)nw * e), *hdba = dget(gdb, (size_t)cc->oc * e);
        snprintf(what, sizeof what, "%s %s: dw accumulated", cc->name, fl_layout_name(l));
        rel("conv backward filter", what, t, hdwa, dwa_ref, nw, conv_tol(t, kw_));
        if (cc->bias) {
            snprintf(what, sizeof what, "%s %s: dbias accumulated", cc->name, fl_layout_name(l));
            rel("conv backward filter", what, t, hdba, dba_ref, cc->oc, conv_tol(t, kw_));
        }
        G->free(gx), G->free(gdy), G->free(gy), G->free(gdx), G->free(gdw), G->free(gdb);
        G->free(s);
        G->conv_plan_free(p);
        free(hdx), free(hdw), free(hdb), free(hdx2), free(hdw2), free(hdb2), free(hdwa), free(hdba);
    }
    G->free(gw), G->free(gb);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0), free(xl), free(dyl), free(tmp);
    free(y_ref), free(dx_ref), free(dw_ref), free(db_ref), free(dwa_ref), free(dba_ref);
}

static void test_conv(void) {
    for (size_t i = 0; i < N_CONV_CASES; i++)
        check_conv(FL_DTYPE_F32, &conv_cases[i]);
    for (int i = 0; i < N_CONV_RANDOM; i++) {
        conv_case c;
        char name[400];
        conv_case_random(&rng, i, &c, name, sizeof name);
        check_conv(FL_DTYPE_F32, &c);
        check_conv(FL_DTYPE_F64, &c);
    }
    for (size_t i = 0; i < 12; i++) /* the small named cases in f64 */
        check_conv(FL_DTYPE_F64, &conv_cases[i]);

    /* a bad descriptor fails with a message, not an abort */
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NCHW, .max_batch = 2, .oc = 5,
                      .groups = 2, .g = {.c = 4, .h = 5, .w = 5, .kh = 3, .kw = 3, .sh = 1,
                                         .sw = 1, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(G->conv_plan_create(&d) == NULL); /* 5 output channels in 2 groups */
    CHECK_MSG("groups");
    d.oc = 6, d.dtype = FL_DTYPE_F16; /* f16 and bf16 plans: test_low_flag, test_low_conv */
    fl_conv_plan *p = G->conv_plan_create(&d);
    CHECK(p != NULL);
    G->conv_plan_free(p);
}

/* ------------------------------------------------------------------------------------------ */
/* pooling: max exactly the ref's (first largest on ties), average within rounding */

static void check_pool(fl_dtype t, const pool_case *pc, fl_pool pool) {
    fl_conv_geom g = {.c = pc->c, .h = pc->h, .w = pc->w, .kh = pc->kh, .kw = pc->kw,
                      .sh = pc->sh, .sw = pc->sw, .ph = pc->ph, .pw = pc->pw, .dh = pc->dh,
                      .dw = pc->dw};
    CHECK(fl_conv_geom_out(&g));
    int64_t n = pc->n, in = pc->c * pc->h * pc->w, out = pc->c * g.oh * g.ow;
    size_t e = esz(t);
    void *x = hbuf((size_t)(n * in) * e), *dy = hrand(t, n * out, -1, 1);
    if (pc->ties)
        for (int64_t i = 0; i < n * in; i++)
            set(t, x, i, fl_rng_below(&rng, 8) < 5 ? 0 : (double)fl_rng_below(&rng, 3));
    else
        for (int64_t i = 0; i < n * in; i++)
            set(t, x, i, 2 * fl_rng_uniform_f64(&rng) - 1);
    void *y_ref = hbuf((size_t)(n * out) * e), *dx_ref = hbuf((size_t)(n * in) * e);
    R->pool_forward(t, FL_LAYOUT_NCHW, pool, n, &g, x, y_ref);
    R->pool_backward(t, FL_LAYOUT_NCHW, pool, n, &g, x, dy, dx_ref);
    bool max = pool == FL_POOL_MAX;
    void *xl = hbuf((size_t)(n * in) * e), *dyl = hbuf((size_t)(n * out) * e);
    void *tmp = hbuf((size_t)(n * in + n * out) * e);
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        char what[400];
        snprintf(what, sizeof what, "%s pool %s %s", max ? "max" : "avg", pc->name,
                 fl_layout_name(l));
        to_layout(t, l, n, pc->c, pc->h * pc->w, x, xl);
        to_layout(t, l, n, pc->c, g.oh * g.ow, dy, dyl);
        void *gx = dput(xl, (size_t)(n * in) * e), *gdy = dput(dyl, (size_t)(n * out) * e);
        void *gy = G->alloc((size_t)(n * out) * e), *gdx = G->alloc((size_t)(n * in) * e);
        G->pool_forward(t, l, pool, n, &g, gx, gy);
        G->pool_backward(t, l, pool, n, &g, gx, gdy, gdx);
        void *hy = dget(gy, (size_t)(n * out) * e), *hdx = dget(gdx, (size_t)(n * in) * e);
        from_layout(t, l, n, pc->c, g.oh * g.ow, hy, tmp);
        if (max)
            same_bits("max pool forward", what, tmp, y_ref, (size_t)(n * out) * e);
        else
            rel("avg pool forward", what, t, tmp, y_ref, n * out, t == FL_DTYPE_F32 ? 2e-6 : 1e-14);
        from_layout(t, l, n, pc->c, pc->h * pc->w, hdx, tmp);
        if (max)
            same_bits("max pool backward", what, tmp, dx_ref, (size_t)(n * in) * e);
        else
            rel("avg pool backward", what, t, tmp, dx_ref, n * in, t == FL_DTYPE_F32 ? 2e-6 : 1e-14);
        G->free(gx), G->free(gdy), G->free(gy), G->free(gdx), free(hy), free(hdx);
    }
    free(x), free(dy), free(y_ref), free(dx_ref), free(xl), free(dyl), free(tmp);
}

static void test_pool(void) {
    for (size_t i = 0; i < N_POOL_CASES; i++)
        for (int k = 0; k < 2; k++) {
            fl_dtype t = dtypes[k];
            check_pool(t, &pool_cases[i], FL_POOL_MAX);
            check_pool(t, &pool_cases[i], FL_POOL_AVG);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* batch norm: training and inference, with and without the ReLU, both layouts */

#define TOL_BN_FWD 2e-5
#define TOL_BN_BWD 1e-4

static void check_bn(fl_dtype t, const bn_case *bc) {
    int64_t n = bc->n, c = bc->c, hw = bc->hw, nx = n * c * hw;
    const double eps = 1e-5;
    size_t e = esz(t), xb = (size_t)nx * e, cb = (size_t)c * e, db = (size_t)c * sizeof(double);
    double tf = t == FL_DTYPE_F32 ? TOL_BN_FWD : 1e-10, tb = t == FL_DTYPE_F32 ? TOL_BN_BWD : 1e-10;
    void *x = hbuf(xb), *gamma = hrand(t, c, 0.5, 1.5), *beta = hrand(t, c, -0.5, 0.5);
    void *dy = hrand(t, nx, -1, 1), *dg0 = hrand(t, c, -1, 1), *db0 = hrand(t, c, -1, 1);
    double *rmean = hbuf(db), *rvar = hbuf(db), *mref = hbuf(db), *vref = hbuf(db);
    for (int64_t ch = 0; ch < c; ch++) {
        double off = 4 * fl_rng_uniform_f64(&rng) - 2, sc = 0.2 + 2 * fl_rng_uniform_f64(&rng);
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < hw; i++)
                set(t, x, (b * c + ch) * hw + i, off + sc * (2 * fl_rng_uniform_f64(&rng) - 1));
        rmean[ch] = off + 0.1 * (fl_rng_uniform_f64(&rng) - 0.5);
        rvar[ch] = sc * sc / 3 * (0.5 + fl_rng_uniform_f64(&rng));
    }
    void *y_ref = hbuf(xb), *dx_ref = hbuf(xb), *dg_ref = hbuf(cb), *db_ref = hbuf(cb);
    void *dga_ref = hbuf(cb), *dba_ref = hbuf(cb), *xl = hbuf(xb), *dyl = hbuf(xb);
    void *ryl = hbuf(xb), *tmp = hbuf(xb);
    void *gg = dput(gamma, cb), *gbeta = dput(beta, cb), *gdg = G->alloc(cb), *gdb = G->alloc(cb);
    double *gm = G->alloc(db), *gv = G->alloc(db);
    for (int training = 1; training >= 0; training--)
        for (int ai = 0; ai < 3; ai++) { /* the fused activation: none, relu, hardswish */
            fl_act act = ai == 0 ? FL_ACT_NONE : ai == 1 ? FL_ACT_RELU : FL_ACT_HARDSWISH;
            double *sm = training ? mref : rmean, *sv = training ? vref : rvar;
            R->bn_forward(t, FL_LAYOUT_NCHW, n, c, hw, x, gamma, beta, eps, training, sm, sv,
                          act, y_ref);
            R->bn_backward(t, FL_LAYOUT_NCHW, n, c, hw, x, act, y_ref, dy, gamma, beta, sm, sv,
                           eps, training, dx_ref, dg_ref, db_ref, false);
            for (int64_t i = 0; i < c; i++) {
                set(t, dga_ref, i, get(t, dg0, i) + get(t, dg_ref, i));
                set(t, dba_ref, i, get(t, db0, i) + get(t, db_ref, i));
            }
            for (int li = 0; li < 2; li++) {
                fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
                char pre[200], what[300];
                snprintf(pre, sizeof pre, "bn (%lld, %lld, %lld) %s %s%s", (long long)n,
                         (long long)c, (long long)hw, fl_layout_name(l),
                         training ? "training" : "inference",
                         act == FL_ACT_NONE ? "" : act == FL_ACT_RELU ? " relu" : " hardswish");
                const char *opf = training ? "bn forward training" : "bn forward inference";
                const char *opb = training ? "bn backward training" : "bn backward inference";
                to_layout(t, l, n, c, hw, x, xl);
                to_layout(t, l, n, c, hw, dy, dyl);
                to_layout(t, l, n, c, hw, y_ref, ryl);
                void *gx = dput(xl, xb), *gy = G->alloc(xb), *gdy = dput(dyl, xb);
                void *gry = dput(ryl, xb), *gdx = G->alloc(xb);
                G->copy(gm, rmean, db, FL_COPY_H2D, NULL);
                G->copy(gv, rvar, db, FL_COPY_H2D, NULL);
                G->bn_forward(t, l, n, c, hw, gx, gg, gbeta, eps, training, gm, gv, act, gy);
                void *hy = dget(gy, xb);
                from_layout(t, l, n, c, hw, hy, tmp);
                snprintf(what, sizeof what, "%s: y", pre);
                rel(opf, what, t, tmp, y_ref, nx, tf);
                double *hm = dget(gm, db), *hv = dget(gv, db);
                if (training) {
                    snprintf(what, sizeof what, "%s: mean", pre);
                    rel(opf, what, FL_DTYPE_F64, hm, mref, c, 1e-10); /* both in double */
                    snprintf(what, sizeof what, "%s: var", pre);
                    rel(opf, what, FL_DTYPE_F64, hv, vref, c, 1e-10);
                } else { /* read, not written */
                    same_bits(opf, "running mean untouched", hm, rmean, db);
                    same_bits(opf, "running var untouched", hv, rvar, db);
                }
                /* repeatable, and y may alias x */
                G->bn_forward(t, l, n, c, hw, gx, gg, gbeta, eps, training, gm, gv, act, gx);
                void *hy2 = dget(gx, xb);
                same_bits(opf, "again, in place", hy2, hy, xb);
                /* the same bits from arrays one element off 16-byte alignment (the kernels'
                 * element-at-a-time loads instead of 4 at once) */
                char *ux = G->alloc(xb + e), *uy = G->alloc(xb + e), *udy = G->alloc(xb + e);
                char *ury = G->alloc(xb + e), *udx = G->alloc(xb + e);
                G->copy(ux + e, xl, xb, FL_COPY_H2D, NULL);
                G->bn_forward(t, l, n, c, hw, ux + e, gg, gbeta, eps, training, gm, gv, act,
                              uy + e);
                void *hy3 = dget(uy + e, xb);
                same_bits(opf, "arrays not 16-byte aligned", hy3, hy, xb);
                double *hm3 = dget(gm, db), *hv3 = dget(gv, db);
                same_bits(opf, "arrays not 16-byte aligned: mean", hm3, hm, db);
                same_bits(opf, "arrays not 16-byte aligned: var", hv3, hv, db);
                /* backward with the ref's statistics */
                G->copy(gm, sm, db, FL_COPY_H2D, NULL);
                G->copy(gv, sv, db, FL_COPY_H2D, NULL);
                G->copy(gx, xl, xb, FL_COPY_H2D, NULL);
                G->bn_backward(t, l, n, c, hw, gx, act, gry, gdy, gg, gbeta, gm, gv, eps,
                               training, gdx, gdg, gdb, false);
                void *hdx = dget(gdx, xb), *hdg = dget(gdg, cb), *hdb = dget(gdb, cb);
                from_layout(t, l, n, c, hw, hdx, tmp);
                snprintf(what, sizeof what, "%s: dx", pre);
                rel(opb, what, t, tmp, dx_ref, nx, tb);
                snprintf(what, sizeof what, "%s: dgamma", pre);
                rel(opb, what, t, hdg, dg_ref, c, tb);
                snprintf(what, sizeof what, "%s: dbeta", pre);
                rel(opb, what, t, hdb, db_ref, c, tb);
                G->bn_backward(t, l, n, c, hw, gx, act, gry, gdy, gg, gbeta, gm, gv, eps,
                               training, gdx, gdg, gdb, false);
                void *hdx2 = dget(gdx, xb);
                same_bits(opb, "run twice", hdx2, hdx, xb);
                G->copy(ux + e, xl, xb, FL_COPY_H2D, NULL);
                G->copy(udy + e, dyl, xb, FL_COPY_H2D, NULL);
                G->copy(ury + e, ryl, xb, FL_COPY_H2D, NULL);
                G->bn_backward(t, l, n, c, hw, ux + e, act, ury + e, udy + e, gg, gbeta, gm,
                               gv, eps, training, udx + e, gdg, gdb, false);
                void *hdx3 = dget(udx + e, xb), *hdg3 = dget(gdg, cb), *hdb3 = dget(gdb, cb);
                same_bits(opb, "arrays not 16-byte aligned: dx", hdx3, hdx, xb);
                same_bits(opb, "arrays not 16-byte aligned: dgamma", hdg3, hdg, cb);
                same_bits(opb, "arrays not 16-byte aligned: dbeta", hdb3, hdb, cb);
                G->free(ux), G->free(uy), G->free(udy), G->free(ury), G->free(udx);
                free(hy3), free(hm3), free(hv3), free(hdx3), free(hdg3), free(hdb3);
                for (int with_dx = 0; with_dx < 2; with_dx++) { /* accumulating */
                    G->copy(gdg, dg0, cb, FL_COPY_H2D, NULL);
                    G->copy(gdb, db0, cb, FL_COPY_H2D, NULL);
                    G->bn_backward(t, l, n, c, hw, gx, act, gry, gdy, gg, gbeta, gm, gv, eps,
                                   training, with_dx ? gdx : NULL, gdg, gdb, true);
                    void *a1 = dget(gdg, cb), *a2 = dget(gdb, cb);
                    snprintf(what, sizeof what, "%s%s: dgamma accumulated", pre,
                             with_dx ? "" : " no dx");
                    rel(opb, what, t, a1, dga_ref, c, tb);
                    snprintf(what, sizeof what, "%s%s: dbeta accumulated", pre,
                             with_dx ? "" : " no dx");
                    rel(opb, what, t, a2, dba_ref, c, tb);
                    free(a1), free(a2);
                }
                G->free(gx), G->free(gy), G->free(gdy), G->free(gry), G->free(gdx);
                free(hy), free(hm), free(hv), free(hy2), free(hdx), free(hdg), free(hdb);
                free(hdx2);
            }
        }
    G->free(gg), G->free(gbeta), G->free(gdg), G->free(gdb), G->free(gm), G->free(gv);
    free(x), free(gamma), free(beta), free(dy), free(dg0), free(db0), free(rmean), free(rvar);
    free(mref), free(vref), free(y_ref), free(dx_ref), free(dg_ref), free(db_ref);
    free(dga_ref), free(dba_ref), free(xl), free(dyl), free(ryl), free(tmp);
}

static void test_bn(void) {
    for (size_t i = 0; i < N_BN_CASES; i++)
        check_bn(FL_DTYPE_F32, &bn_cases[i]);
    for (size_t i = 0; i < 4; i++)
        check_bn(FL_DTYPE_F64, &bn_cases[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Deep Gradient Compression: the CPU kernels' results, from the same inputs */

static float *frand(int64_t n, double sd) {
    float *p = hbuf((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(sd * fl_rng_normal(&rng));
    return p;
}

/* k of n at sparsity s: ceil(n (1 - s)), at least 1 */
static int64_t dgc_k_of(int64_t n, double s) {
    int64_t k = (int64_t)ceil((double)n * (1 - s));
    return k < 1 ? 1 : k;
}

/* the device's selection from v against the CPU's from the same v: the same count and, where
 * the orders are promised equal, the same indices in the same order; else the same set */
static void same_selection(const char *op, const char *what, const int32_t *got, int64_t ng,
                           const int32_t *want, int64_t nw, int64_t n, bool order) {
    if (ng != nw) {
        fprintf(stderr, "%s: %s: %lld chosen, the cpu %lld\n", op, what, (long long)ng,
                (long long)nw);
        test_failures++;
        note(op, INFINITY, 0);
        return;
    }
    if (order) {
        same_bits(op, what, got, want, (size_t)ng * sizeof *got);
        return;
    }
    char *in = hbuf((size_t)n + 1);
    for (int64_t j = 0; j < nw; j++)
        in[want[j]] = 1;
    bool ok = true;
    for (int64_t j = 0; j < ng; j++)
        ok &= got[j] >= 0 && got[j] < n && in[got[j]]-- == 1;
    note(op, ok ? 0 : INFINITY, 0);
    if (!ok) {
        fprintf(stderr, "%s: %s: another set of indices than the cpu's\n", op, what);
        test_failures++;
    }
    free(in);
}

static void test_dgc_select(void) {
    static const int64_t sizes[] = {0, 1, 7, 1000, 16384, 100000, 300001};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        size_t fb = (size_t)n * sizeof(float), ib = (size_t)n * sizeof(int32_t);
        float *v = hbuf(fb + 4), *scratch = hbuf(fb + 4 * (size_t)(n / 100 + 4096));
        int32_t *idx = hbuf(ib + 4);
        float *gv = G->alloc(fb), *gs = G->alloc(fb + 4 * (size_t)(n / 100 + 4096));
        int32_t *gi = G->alloc(ib);
        for (int kind = 0; kind < 4; kind++) {
            /* 0 normal, 1 half zeros, 2 all zeros, 3 few magnitudes (ties) */
            for (int64_t i = 0; i < n; i++) {
                double x = fl_rng_normal(&rng);
                v[i] = kind == 0   ? (float)x
                     : kind == 1   ? (fl_rng_below(&rng, 2) ? (float)x : 0.0f)
                     : kind == 2   ? 0.0f
                                   : (float)((x < 0 ? -1 : 1) * (double)(1 + fl_rng_below(&rng, 3)));
            }
            G->copy(gv, v, fb, FL_COPY_H2D, NULL);
            const int64_t ks[] = {n / 1000, n / 100, n / 10, n / 2, n, n + 5, 1, 0};
            for (size_t s = 0; s < sizeof ks / sizeof ks[0]; s++) {
                int64_t k = ks[s];
                char what[128];
                snprintf(what, sizeof what, "n %lld kind %d k %lld", (long long)n, kind,
                         (long long)k);
                int64_t want = R->dgc_select_exact(n, v, k, idx, scratch);
                int64_t got = G->dgc_select_exact(n, gv, k, gi, gs);
                int32_t *h = dget(gi, (size_t)(got > 0 ? got : 0) * sizeof(int32_t));
                same_selection("dgc_select_exact", what, h, got, idx, want, n, true);
                free(h);
            }
        }
        G->free(gv), G->free(gs), G->free(gi), free(v), free(scratch), free(idx);
    }
}

/* accumulation (u, v bit-identical to the CPU's), and the fused accumulate + select */
static void test_dgc_accumulate(void) {
    static const int64_t sizes[] = {1, 1000, 70000, 262144};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        size_t fb = (size_t)n * sizeof(float), ib = (size_t)n * sizeof(int32_t);
        size_t sb = fb + 4 * (size_t)(n / 100 + 4096);
        float *scratch = hbuf(sb), *gs = G->alloc(sb);
        int32_t *idx = hbuf(ib), *gi = G->alloc(ib);
        float *gg = G->alloc(fb), *gw = G->alloc(fb), *gu = G->alloc(fb), *gv = G->alloc(fb);
        for (int mode = 0; mode < 3; mode++) {
            fl_dgc_accum_args a = {.clip_scale = 0.5, .decay = 1e-3, .momentum = 0.9,
                                   .nesterov = mode == 1, .correction = mode != 2};
            float *w = frand(n, 1), *u = frand(n, 1), *v = frand(n, 3);
            G->copy(gw, w, fb, FL_COPY_H2D, NULL);
            G->copy(gu, u, fb, FL_COPY_H2D, NULL);
            G->copy(gv, v, fb, FL_COPY_H2D, NULL);
            float hint_c = 0, hint_g = 0;
            for (int step = 0; step < 3; step++) {
                float *g = frand(n, 1);
                G->copy(gg, g, fb, FL_COPY_H2D, NULL);
                char what[128];
                snprintf(what, sizeof what, "n %lld mode %d step %d", (long long)n, mode, step);
                int64_t k = dgc_k_of(n, step == 1 ? 0.999 : 0.99);
                if (step == 0) { /* plain accumulation */
                    R->dgc_accumulate(n, g, w, u, v, &a);
                    G->dgc_accumulate(n, gg, gw, gu, gv, &a);
                } else { /* fused, the hint carried from step to step */
                    int pc = -1, pg = -1;
                    int64_t want = R->dgc_accumulate_select(n, g, w, u, v, &a, k, idx, scratch,
                                                            (uint64_t)step, &hint_c, &pc);
                    int64_t got = G->dgc_accumulate_select(n, gg, gw, gu, gv, &a, k, gi, gs,
                                                           (uint64_t)step, &hint_g, &pg);
                    int32_t *h = dget(gi, (size_t)(got > 0 ? got : 0) * sizeof(int32_t));
                    /* the same order except after the CPU's fourth pass (exact selection) */
                    same_selection("dgc_accumulate_select", what, h, got, idx, want, n, pc < 4);
                    CHECK(hint_g == hint_c);
                    CHECK(pg == 0 || pg == 1);
                    free(h);
                }
                float *hu = dget(gu, fb), *hv = dget(gv, fb);
                same_bits("dgc_accumulate (cpu bits)", what, hu, u, fb);
                same_bits("dgc_accumulate (cpu bits)", what, hv, v, fb);
                free(hu), free(hv), free(g);
            }
            free(w), free(u), free(v);
        }
        G->free(gs), G->free(gi), G->free(gg), G->free(gw), G->free(gu), G->free(gv);
        free(scratch), free(idx);
    }
}

/* encoding; the scatter-add and the pairs' step with repeated indices across "ranks" (the
 * CPU's sums bit for bit), an index outside the space; the dense step */
static void test_dgc_pairs(void) {
    /* encode */
    int64_t n = 5000, cnt = 700;
    float *v = frand(n, 1), *u = frand(n, 1);
    int32_t *idx = hbuf((size_t)cnt * sizeof *idx);
    for (int64_t j = 0; j < cnt; j++)
        idx[j] = (int32_t)((j * 7919) % n); /* distinct, unordered */
    fl_dgc_pair *pairs = hbuf((size_t)cnt * sizeof *pairs);
    float *gv = dput(v, (size_t)n * 4), *gu = dput(u, (size_t)n * 4);
    int32_t *gi = dput(idx, (size_t)cnt * 4);
    fl_dgc_pair *gp = G->alloc((size_t)cnt * sizeof *gp);
    for (int mask = 0; mask < 2; mask++) {
        R->dgc_encode(idx, cnt, 1000, v, mask ? u : NULL, pairs);
        G->dgc_encode(gi, cnt, 1000, gv, mask ? gu : NULL, gp);
        void *hp = dget(gp, (size_t)cnt * sizeof *gp), *hv = dget(gv, (size_t)n * 4);
        void *hu = dget(gu, (size_t)n * 4);
        same_bits("dgc_encode", "pairs", hp, pairs, (size_t)cnt * sizeof *pairs);
        same_bits("dgc_encode", "v", hv, v, (size_t)n * 4);
        same_bits("dgc_encode", "u", hu, u, (size_t)n * 4);
        free(hp), free(hv), free(hu);
    }
    G->dgc_encode(gi, 0, 0, gv, gu, gp); /* nothing selected */
    G->free(gv), G->free(gu), G->free(gi), G->free(gp);
    free(v), free(u), free(idx), free(pairs);

    /* scatter-add and apply over 3 segments, 8 "ranks" of pairs with many repeats */
    const int nseg = 3;
    int64_t start[] = {0, 50000, 50001, 120000}, total = start[nseg];
    int64_t np = 200000;
    fl_dgc_pair *p = hbuf((size_t)np * sizeof *p);
    for (int64_t j = 0; j < np; j++) {
        /* a third of the pairs on 64 hot indices: long runs to add in order */
        p[j].index = (int32_t)(fl_rng_below(&rng, 3) ? fl_rng_below(&rng, (uint64_t)total)
                                                     : 1000 * fl_rng_below(&rng, 64));
        p[j].value = (float)fl_rng_normal(&rng);
    }
    float *hs[3], *gs[3], *hw[3], *gw[3];
    for (int s = 0; s < nseg; s++) {
        int64_t len = start[s + 1] - start[s];
        hs[s] = frand(len, 1), hw[s] = frand(len, 1);
        gs[s] = dput(hs[s], (size_t)len * 4), gw[s] = dput(hw[s], (size_t)len * 4);
    }
    fl_dgc_pair *gpp = dput(p, (size_t)np * sizeof *p);
    int64_t rc_c = R->dgc_scatter_add(p, np, nseg, start, hs);
    int64_t rc_g = G->dgc_scatter_add(gpp, np, nseg, start, (float *const *)gs);
    CHECK(rc_c == -1 && rc_g == -1);
    R->dgc_apply_pairs(p, np, nseg, start, hw, 0.1 / 8);
    G->dgc_apply_pairs(gpp, np, nseg, start, (float *const *)gw, 0.1 / 8);
    for (int s = 0; s < nseg; s++) {
        size_t len = (size_t)(start[s + 1] - start[s]) * 4;
        float *a = dget(gs[s], len), *b = dget(gw[s], len);
        same_bits("dgc_scatter_add (cpu bits)", "200000 pairs, repeats", a, hs[s], len);
        same_bits("dgc_apply_pairs (cpu bits)", "200000 pairs, repeats", b, hw[s], len);
        free(a), free(b);
    }
    /* nothing received; an index outside the space: its position, the pairs before it added */
    CHECK(G->dgc_scatter_add(gpp, 0, nseg, start, (float *const *)gs) == -1);
    fl_dgc_pair bad[] = {{3, 1.0f}, {7, 2.0f}, {(int32_t)total, 1.0f}, {2, 1.0f}, {-1, 1.0f}};
    fl_dgc_pair *gbad = dput(bad, sizeof bad);
    rc_c = R->dgc_scatter_add(bad, 5, nseg, start, hs);
    rc_g = G->dgc_scatter_add(gbad, 5, nseg, start, (float *const *)gs);
    CHECK(rc_c == 2 && rc_g == 2);
    float *a0 = dget(gs[0], (size_t)start[1] * 4);
    same_bits("dgc_scatter_add (cpu bits)", "up to a bad index", a0, hs[0], (size_t)start[1] * 4);
    free(a0);
    G->free(gbad), G->free(gpp), free(p);
    for (int s = 0; s < nseg; s++)
        G->free(gs[s]), G->free(gw[s]), free(hs[s]), free(hw[s]);

    /* the dense step: 0 no velocity, 1 velocity, 2 Nesterov */
    int64_t m = 100003;
    for (int mode = 0; mode < 3; mode++) {
        float *w = frand(m, 1), *g = frand(m, 1), *uu = frand(m, 1);
        float *dw = dput(w, (size_t)m * 4), *dg = dput(g, (size_t)m * 4);
        float *du = dput(uu, (size_t)m * 4);
        R->dgc_apply_dense(m, w, g, mode ? uu : NULL, 0.1, 0.5, 0.9, mode == 2, 1e-2);
        G->dgc_apply_dense(m, dw, dg, mode ? du : NULL, 0.1, 0.5, 0.9, mode == 2, 1e-2);
        float *a = dget(dw, (size_t)m * 4), *b = dget(dg, (size_t)m * 4), *c = dget(du, (size_t)m * 4);
        same_bits("dgc_apply_dense (cpu bits)", "w", a, w, (size_t)m * 4);
        same_bits("dgc_apply_dense (cpu bits)", "g zeroed", b, g, (size_t)m * 4);
        same_bits("dgc_apply_dense (cpu bits)", "u", c, uu, (size_t)m * 4);
        G->free(dw), G->free(dg), G->free(du), free(w), free(g), free(uu), free(a), free(b), free(c);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* low dtypes (backend.h, "Low dtypes"): each op in f16 and bf16 against the ref table's low op
 * on the same inputs. The ref computes every output in double from the values read and rounds
 * it once; the cuda kernels compute in float and round once on store. A float result within
 * less than one low unit of the exact one rounds to the correctly rounded value or a neighbour,
 * so an elementwise op is held to 1 ulp of the low dtype (ulp of the ref's value); copies (the
 * reorder, channel pad and slice, add_backward, max pooling's forward, convert) to the bits.
 * Where float arithmetic cancels (axpy, batch norm's z = x a + b and its dx, dgamma, dbeta) the
 * bound adds the float error of the terms, derived per op below; gemm and the convolutions add
 * the error of their f32 accumulation (acc_err). The cuda table's low_dtypes stays false
 * (FLEET_CUDA_LOW_DTYPES=1 turns it on) until these pass on a GPU (docs/amp.md). These tests'
 * rows in the summary are "low ..." and their worst error is the fraction of the tolerance
 * used (1: at the bound). */

static const fl_dtype lows[] = {FL_DTYPE_F16, FL_DTYPE_BF16};

static double lget(fl_dtype t, const void *p, int64_t i) {
    uint16_t h = ((const uint16_t *)p)[i];
    return t == FL_DTYPE_F16 ? (double)fl_f16_to_f32(h) : (double)fl_bf16_to_f32(h);
}
static void lset(fl_dtype t, void *p, int64_t i, double v) {
    ((uint16_t *)p)[i] = t == FL_DTYPE_F16 ? fl_f32_to_f16((float)v) : fl_f32_to_bf16((float)v);
}
/* n low values uniform in [lo, hi) (rounded to t), host memory */
static void *lrand(fl_dtype t, int64_t n, double lo, double hi) {
    void *p = hbuf((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        lset(t, p, i, lo + (hi - lo) * fl_rng_uniform_f64(&rng));
    return p;
}
static double lmaxabs(fl_dtype t, const void *p, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(lget(t, p, i)));
    return m;
}
/* one unit in the last place of t at |v|: 2^(e - 10) for f16, 2^(e - 7) for bf16, e the
 * exponent of v, no lower than the smallest normal's (the subnormals' spacing) */
static double lulp(fl_dtype t, double v) {
    int mant = t == FL_DTYPE_F16 ? 10 : 7, emin = t == FL_DTYPE_F16 ? -14 : -126, e = emin + 1;
    if (v != 0 && isfinite(v))
        frexp(fabs(v), &e);
    e -= 1; /* v = 1.f 2^e */
    return ldexp(1.0, (e < emin ? emin : e) - mant);
}

/* |got - want| <= lim elementwise over n values given as doubles (NaN only against NaN); the
 * worst |got - want| / lim noted for the summary, the first miss printed with its bound. The
 * low gemm and convolution tests give each element its own bound (below). */
static int within(const char *op, const char *what, const double *got, const double *want,
                  const double *lim, int64_t n) {
    double worst = 0;
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if ((isnan(got[i]) && isnan(want[i])) || got[i] == want[i])
            continue;
        double d = fabs(got[i] - want[i]), r = isfinite(d) && lim[i] > 0 ? d / lim[i] : INFINITY;
        worst = fmax(worst, r);
        if (bad < 0 && !(r <= 1))
            bad = i;
    }
    note(op, worst, 1);
    if (bad < 0)
        return 1;
    fprintf(stderr, "%s: %s: element %lld: got %.9g want %.9g, |diff| %.3g > bound %.3g\n", op,
            what, (long long)bad, got[bad], want[bad], fabs(got[bad] - want[bad]), lim[bad]);
    test_failures++;
    return 0;
}
/* n low elements, or n floats, as doubles (a new host array) */
static double *ldoubles(fl_dtype t, const void *p, int64_t n) {
    double *d = hbuf((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = lget(t, p, i);
    return d;
}
static double *fdoubles(const float *p, int64_t n) {
    double *d = hbuf((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

/* |got - want| <= ulps ulp(want) + atol elementwise over n low elements (NaN only against
 * NaN, inf only against the same inf); prints the first miss */
static int low_near(const char *op, const char *what, fl_dtype t, const void *got,
                    const void *want, int64_t n, double ulps, double atol) {
    double *g = ldoubles(t, got, n), *w = ldoubles(t, want, n);
    double *lim = hbuf((size_t)(n > 0 ? n : 1) * sizeof *lim);
    for (int64_t i = 0; i < n; i++)
        lim[i] = ulps * lulp(t, w[i]) + atol;
    char full[256];
    snprintf(full, sizeof full, "%s [%s] (bound %g ulp + %.3g)", what, fl_dtype_name(t), ulps,
             atol);
    int ok = within(op, full, g, w, lim, n);
    free(g), free(w), free(lim);
    return ok;
}
/* an f32 result (db, dgamma, dbeta): |got - want| <= atol + 2^-23 |want| (a double sum in
 * another order, rounded once to f32: one f32 unit, plus the float terms' error atol) */
static int f32_near(const char *op, const char *what, const float *got, const float *want,
                    int64_t n, double atol) {
    double worst = 0;
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double lim = atol + ldexp(fabs((double)want[i]), -23) + 1e-30;
        worst = fmax(worst, isnan(d) ? INFINITY : d / lim);
        if (bad < 0 && !(d <= lim))
            bad = i;
    }
    note(op, worst, 1);
    if (bad < 0)
        return 1;
    fprintf(stderr, "%s: %s: element %lld: got %.9g want %.9g (atol %.3g)\n", op, what,
            (long long)bad, (double)got[bad], (double)want[bad], atol);
    test_failures++;
    return 0;
}
/* device <-> host of n low elements */
static void *lput(const void *h, int64_t n) { return dput(h, (size_t)n * 2); }
static void *lback(const void *d, int64_t n) { return dget(d, (size_t)n * 2); }

/* convert: f32 -> low the bits of the ref's (one rounding to nearest even; overflow to inf,
 * NaN to a NaN), low -> f32 exact, equal dtypes a copy; inf, NaN, f16's overflow threshold,
 * subnormals and ties among the values */
static void test_low_convert(fl_dtype t) {
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f,
                                    1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 1e-40f, 1.0009765625f,
                                    1.00048828125f, 1.001953125f, 3.0e38f};
    const int nsp = (int)(sizeof special / sizeof special[0]);
    for (size_t ci = 0; ci < NCOUNTS; ci++) {
        int64_t n = counts[ci];
        float *x = hbuf((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            x[i] = i < nsp ? special[i] : (float)(8 * fl_rng_uniform_f64(&rng) - 4);
        if (n > nsp + 1)
            x[nsp] = INFINITY, x[nsp + 1] = NAN;
        uint16_t *want = hbuf((size_t)n * 2);
        R->convert(FL_DTYPE_F32, x, t, want, n);
        float *gx = dput(x, (size_t)n * 4), *gf = G->alloc((size_t)n * 4);
        void *gh = G->alloc((size_t)n * 2), *gc = G->alloc((size_t)n * 2);
        G->convert(FL_DTYPE_F32, gx, t, gh, n);
        uint16_t *got = lback(gh, n);
        char what[200];
        snprintf(what, sizeof what, "f32 -> %s, n %lld", fl_dtype_name(t), (long long)n);
        for (int64_t i = 0; i < n; i++) /* any NaN for a NaN */
            if (isnan(lget(t, got, i)) && isnan(lget(t, want, i)))
                got[i] = want[i];
        same_bits("low convert", what, got, want, (size_t)n * 2);
        G->convert(t, gh, FL_DTYPE_F32, gf, n);
        float *back = dget(gf, (size_t)n * 4), *back_ref = hbuf((size_t)n * 4);
        uint16_t *h = lback(gh, n);
        R->convert(t, h, FL_DTYPE_F32, back_ref, n);
        for (int64_t i = 0; i < n; i++)
            if (isnan(back[i]) && isnan(back_ref[i]))
                back[i] = back_ref[i];
        snprintf(what, sizeof what, "%s -> f32, n %lld", fl_dtype_name(t), (long long)n);
        same_bits("low convert", what, back, back_ref, (size_t)n * 4);
        G->convert(t, gh, t, gc, n); /* equal dtypes: a copy */
        uint16_t *copy = lback(gc, n);
        snprintf(what, sizeof what, "%s -> %s (copy), n %lld", fl_dtype_name(t),
                 fl_dtype_name(t), (long long)n);
        same_bits("low convert", what, copy, h, (size_t)n * 2);
        G->free(gx), G->free(gf), G->free(gh), G->free(gc);
        free(x), free(want), free(got), free(back), free(back_ref), free(h), free(copy);
    }
}

/* fill (1 ulp: the value goes through float), the elementwise ops (1 ulp), axpy (1 ulp plus
 * the float error of y + a x: a rounded to float and the product, 2^-23 |a x|, and the sum,
 * 2^-24 |y + a x|: at most 2^-22 (|y| + |a x|), which cancellation can make more than an ulp
 * of the result), scale, the residual add, dropout (the same mask: kept elements 1 ulp, dropped
 * ones exactly 0), add_backward (bits), sum and sumsq (double sums of exact values in another
 * order: 1e-12 relative) */
static void test_low_elementwise(fl_dtype t) {
    static const double fills[] = {0, 1, -2.5, 0.1, 1e-6, 7e4, -1e39};
    for (size_t ci = 0; ci < NCOUNTS; ci++) {
        int64_t n = counts[ci];
        char what[200];
        void *want = hbuf((size_t)n * 2), *gx = G->alloc((size_t)n * 2);
        for (size_t k = 0; k < sizeof fills / sizeof fills[0]; k++) {
            R->fill(t, want, n, fills[k]);
            G->fill(t, gx, n, fills[k]);
            void *got = lback(gx, n);
            snprintf(what, sizeof what, "fill %g, n %lld", fills[k], (long long)n);
            low_near("low fill", what, t, got, want, n, 1, 0);
            free(got);
        }
        G->free(gx), free(want);

        void *x = lrand(t, n, -4, 4), *dy = lrand(t, n, -1, 1), *y0 = lrand(t, n, -1, 1);
        if (n > 2)
            lset(t, x, 0, 3), lset(t, x, 1, -3), lset(t, x, 2, 0); /* the kinks */
        void *wy = hbuf((size_t)n * 2), *wdx = hbuf((size_t)n * 2);
        void *gxd = lput(x, n), *gdy = lput(dy, n), *gy = G->alloc((size_t)n * 2);
        void *gdx = G->alloc((size_t)n * 2);
        for (int a = 0; a < FL_ACT_COUNT; a++) {
            R->act_forward(t, (fl_act)a, x, wy, n);
            R->act_backward(t, (fl_act)a, x, wy, dy, wdx, n);
            G->act_forward(t, (fl_act)a, gxd, gy, n);
            void *got = lback(gy, n);
            snprintf(what, sizeof what, "%s, n %lld", fl_act_name((fl_act)a), (long long)n);
            low_near("low act_forward", what, t, got, wy, n, 1, 0);
            G->copy(gy, wy, (size_t)n * 2, FL_COPY_H2D, NULL); /* the ref's y for tanh, sigmoid */
            G->act_backward(t, (fl_act)a, gxd, gy, gdy, gdx, n);
            void *gotd = lback(gdx, n);
            low_near("low act_backward", what, t, gotd, wdx, n, 1, 0);
            free(got), free(gotd);
        }

        /* axpy, scale */
        const double a = 0.7;
        memcpy(wy, y0, (size_t)n * 2);
        R->axpy(t, n, a, x, wy);
        G->copy(gy, y0, (size_t)n * 2, FL_COPY_H2D, NULL);
        G->axpy(t, n, a, gxd, gy);
        void *got = lback(gy, n);
        snprintf(what, sizeof what, "a %g, n %lld", a, (long long)n);
        low_near("low axpy", what, t, got, wy, n, 1,
                 ldexp(lmaxabs(t, y0, n) + a * lmaxabs(t, x, n), -22));
        free(got);
        memcpy(wy, x, (size_t)n * 2);
        R->scale(t, n, -1.3, wy);
        G->scale(t, n, -1.3, gxd);
        got = lback(gxd, n);
        low_near("low scale", what, t, got, wy, n, 1, 0);
        free(got);
        G->copy(gxd, x, (size_t)n * 2, FL_COPY_H2D, NULL);

        /* the residual add, forward and backward, with and without the ReLU */
        void *gb = lput(y0, n);
        for (int relu = 0; relu < 2; relu++) {
            R->add_forward(t, x, y0, wy, n, relu);
            G->add_forward(t, gxd, gb, gy, n, relu);
            got = lback(gy, n);
            snprintf(what, sizeof what, "%s n %lld", relu ? "relu," : "", (long long)n);
            low_near("low add_forward", what, t, got, wy, n, 1, 0);
            free(got);
            /* backward with the ref's y as the mask */
            void *wda = hbuf((size_t)n * 2), *wdb = hbuf((size_t)n * 2);
            R->add_backward(t, wy, dy, wda, wdb, n, relu);
            G->copy(gy, wy, (size_t)n * 2, FL_COPY_H2D, NULL);
            void *gda = G->alloc((size_t)n * 2), *gdb = G->alloc((size_t)n * 2);
            G->add_backward(t, gy, gdy, gda, gdb, n, relu);
            void *hda = lback(gda, n), *hdb = lback(gdb, n);
            same_bits("low add_backward", what, hda, wda, (size_t)n * 2);
            same_bits("low add_backward", what, hdb, wdb, (size_t)n * 2);
            G->fill(t, gdb, n, 0);
            G->add_backward(t, gy, gdy, NULL, gdb, n, relu); /* da NULL */
            dback(hdb, gdb, (size_t)n * 2);
            same_bits("low add_backward", "da NULL", hdb, wdb, (size_t)n * 2);
            G->free(gda), G->free(gdb), free(wda), free(wdb), free(hda), free(hdb);
        }
        G->free(gb);

        /* dropout: the mask is the ref's, kept values in * 1 / (1 - p) */
        R->dropout_mask(t, 0x1234567890ull, 17, 0.3, x, wy, n);
        G->dropout_mask(t, 0x1234567890ull, 17, 0.3, gxd, gy, n);
        got = lback(gy, n);
        low_near("low dropout_mask", what, t, got, wy, n, 1, 0);
        int64_t mask_diff = 0;
        for (int64_t i = 0; i < n; i++)
            mask_diff += (lget(t, got, i) == 0) != (lget(t, wy, i) == 0);
        CHECK(mask_diff == 0);
        free(got);

        G->free(gxd), G->free(gdy), G->free(gy), G->free(gdx);
        free(x), free(dy), free(y0), free(wy), free(wdx);
    }
    for (size_t i = 0; i < sizeof reduce_ns / sizeof reduce_ns[0]; i++) {
        int64_t n = reduce_ns[i];
        void *x = lrand(t, n, -2, 3), *gx = lput(x, n);
        double s = G->sum(t, gx, n), q = G->sumsq(t, gx, n);
        double ws = R->sum(t, x, n), wq = R->sumsq(t, x, n), ab = 0;
        for (int64_t k = 0; k < n; k++)
            ab += fabs(lget(t, x, k));
        char what[120];
        snprintf(what, sizeof what, "sum n %lld [%s]", (long long)n, fl_dtype_name(t));
        note("low sum", fabs(s - ws) / (1e-12 * (1 + ab)), 1);
        CHECK_CLOSE(what, &s, &ws, 1, 1e-12 * (1 + ab), 0);
        snprintf(what, sizeof what, "sumsq n %lld [%s]", (long long)n, fl_dtype_name(t));
        note("low sumsq", fabs(q - wq) / (1e-12 * (1 + wq)), 1);
        CHECK_CLOSE(what, &q, &wq, 1, 1e-12 * (1 + wq), 0);
        G->free(gx), free(x);
    }
}

/* add_bias (bias f32: 1 ulp) and sum_rows (db f32: a double sum, rounded to f32; accumulating
 * adds to db's f32 value in double first) */
static void test_low_bias(fl_dtype t) {
    for (size_t i = 0; i < NSHAPES2D; i++) {
        int64_t rows = shapes2d[i][0], cols = shapes2d[i][1], n = rows * cols;
        void *y = lrand(t, n, -2, 2), *want = hdup(y, (size_t)n * 2);
        float *bias = hrand(FL_DTYPE_F32, cols, -1, 1), *db0 = hrand(FL_DTYPE_F32, cols, -1, 1);
        float *wdb = hbuf((size_t)cols * 4);
        void *gy = lput(y, n);
        float *gbias = dput(bias, (size_t)cols * 4), *gdb = G->alloc((size_t)cols * 4);
        R->add_bias(t, want, bias, rows, cols);
        G->add_bias(t, gy, gbias, rows, cols);
        void *got = lback(gy, n);
        char what[120];
        snprintf(what, sizeof what, "(%lld, %lld)", (long long)rows, (long long)cols);
        low_near("low add_bias", what, t, got, want, n, 1, 0);
        for (int acc = 0; acc < 2; acc++) {
            memcpy(wdb, db0, (size_t)cols * 4);
            G->copy(gdb, db0, (size_t)cols * 4, FL_COPY_H2D, NULL);
            G->copy(gy, y, (size_t)n * 2, FL_COPY_H2D, NULL); /* dy: y before the bias */
            R->sum_rows(t, y, wdb, rows, cols, acc);
            G->sum_rows(t, gy, gdb, rows, cols, acc);
            float *hdb = dget(gdb, (size_t)cols * 4);
            f32_near("low sum_rows", what, hdb, wdb, cols, 0);
            free(hdb);
        }
        G->free(gy), G->free(gbias), G->free(gdb);
        free(y), free(want), free(bias), free(db0), free(wdb), free(got);
    }
}

/* element (b, ch, p) of an (N, C, HW) tensor in layout l */
static int64_t lat(fl_layout l, int64_t c, int64_t hw, int64_t b, int64_t ch, int64_t p) {
    return l == FL_LAYOUT_NHWC ? (b * hw + p) * c + ch : (b * c + ch) * hw + p;
}

/* the layout ops in both layouts: reorder, channel_pad and channel_slice (bits), channel_mul
 * (y and dx 1 ulp: one float product of two low values, exact in float, rounded once; ds 1
 * ulp: a double sum rounded once) */
static void test_low_channel_ops(fl_dtype t) {
    static const int64_t shapes[][3] = {{0, 3, 4}, {1, 1, 1}, {2, 5, 9}, {3, 16, 49}, {2, 7, 13}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t n = shapes[si][0], c = shapes[si][1], hw = shapes[si][2], nx = n * c * hw;
        char what[200];
        void *x = lrand(t, nx, -2, 2), *dy = lrand(t, nx, -1, 1), *s = lrand(t, n * c, 0, 1);
        void *want = hbuf((size_t)nx * 2), *gx = lput(x, nx), *gy = G->alloc((size_t)nx * 2);
        for (int to = 0; to < 2; to++) {
            R->reorder(t, to, n, c, hw, x, want);
            G->reorder(t, to, n, c, hw, gx, gy);
            void *got = lback(gy, nx);
            snprintf(what, sizeof what, "reorder %s (%lld, %lld, %lld)", to ? "to NHWC" : "to NCHW",
                     (long long)n, (long long)c, (long long)hw);
            same_bits("low reorder", what, got, want, (size_t)nx * 2);
            free(got);
        }
        void *gs = lput(s, n * c), *gdy = lput(dy, nx), *gdx = G->alloc((size_t)nx * 2);
        void *gds = G->alloc((size_t)(n * c) * 2), *wdx = hbuf((size_t)nx * 2);
        void *wds = hbuf((size_t)(n * c) * 2);
        for (int li = 0; li < 2; li++) {
            fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            snprintf(what, sizeof what, "(%lld, %lld, %lld) %s", (long long)n, (long long)c,
                     (long long)hw, fl_layout_name(l));
            R->channel_mul_forward(t, l, n, c, hw, x, s, want);
            G->channel_mul_forward(t, l, n, c, hw, gx, gs, gy);
            void *got = lback(gy, nx);
            low_near("low channel_mul_forward", what, t, got, want, nx, 1, 0);
            R->channel_mul_backward(t, l, n, c, hw, x, s, dy, wdx, wds);
            G->channel_mul_backward(t, l, n, c, hw, gx, gs, gdy, gdx, gds);
            void *hdx = lback(gdx, nx), *hds = lback(gds, n * c);
            low_near("low channel_mul_backward", what, t, hdx, wdx, nx, 1, 0);
            low_near("low channel_mul_backward", what, t, hds, wds, n * c, 1, 0);
            free(got), free(hdx), free(hds);

            /* slice: x's c channels at offset 2 of 2 c + 3 */
            int64_t oc = 2 * c + 3, off = 2, ny = n * oc * hw;
            void *ybig = lrand(t, ny, -1, 1), *wybig = hdup(ybig, (size_t)ny * 2);
            void *gybig = lput(ybig, ny);
            R->channel_slice(t, l, n, hw, c, x, oc, off, wybig, true);
            G->channel_slice(t, l, n, hw, c, gx, oc, off, gybig, true);
            void *hyb = lback(gybig, ny);
            same_bits("low channel_slice", what, hyb, wybig, (size_t)ny * 2);
            void *xs = hbuf((size_t)nx * 2), *gxs = G->alloc((size_t)nx * 2);
            R->channel_slice(t, l, n, hw, c, xs, oc, off, ybig, false);
            G->copy(gybig, ybig, (size_t)ny * 2, FL_COPY_H2D, NULL);
            G->channel_slice(t, l, n, hw, c, gxs, oc, off, gybig, false);
            void *hxs = lback(gxs, nx);
            same_bits("low channel_slice", "backward", hxs, xs, (size_t)nx * 2);
            G->free(gybig), G->free(gxs), free(ybig), free(wybig), free(hyb), free(xs), free(hxs);
        }
        G->free(gx), G->free(gy), G->free(gs), G->free(gdy), G->free(gdx), G->free(gds);
        free(x), free(dy), free(s), free(want), free(wdx), free(wds);
    }
    /* the option-A shortcut (n, c, h, w, stride, oc), forward and backward: bits */
    static const int64_t pads[][6] = {{2, 3, 5, 7, 2, 8}, {1, 1, 1, 1, 1, 1}, {3, 4, 6, 6, 1, 4},
                                      {0, 2, 3, 3, 2, 4}};
    for (size_t pi = 0; pi < sizeof pads / sizeof pads[0]; pi++) {
        int64_t n = pads[pi][0], c = pads[pi][1], h = pads[pi][2], w = pads[pi][3];
        int64_t st = pads[pi][4], oc = pads[pi][5], oh = (h + st - 1) / st, ow = (w + st - 1) / st;
        int64_t nx = n * c * h * w, ny = n * oc * oh * ow;
        for (int li = 0; li < 2; li++) {
            fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            char what[200];
            snprintf(what, sizeof what, "pad (%lld, %lld, %lld, %lld) s%lld -> %lld %s",
                     (long long)n, (long long)c, (long long)h, (long long)w, (long long)st,
                     (long long)oc, fl_layout_name(l));
            void *x = lrand(t, nx, -1, 1), *y = lrand(t, ny, -1, 1);
            void *wy = hbuf((size_t)ny * 2), *wx = hbuf((size_t)nx * 2);
            void *gx = lput(x, nx), *gy = lput(y, ny); /* garbage in y: every element written */
            R->channel_pad(t, l, n, c, h, w, st, oc, x, wy, true);
            G->channel_pad(t, l, n, c, h, w, st, oc, gx, gy, true);
            void *hy = lback(gy, ny);
            same_bits("low channel_pad", what, hy, wy, (size_t)ny * 2);
            G->copy(gy, y, (size_t)ny * 2, FL_COPY_H2D, NULL);
            R->channel_pad(t, l, n, c, h, w, st, oc, wx, y, false);
            G->channel_pad(t, l, n, c, h, w, st, oc, gx, gy, false);
            void *hx = lback(gx, nx);
            same_bits("low channel_pad", "backward", hx, wx, (size_t)nx * 2);
            G->free(gx), G->free(gy), free(x), free(y), free(wy), free(wx), free(hy), free(hx);
        }
    }
}

/* pooling in both layouts (the ref's low pooling takes either): max forward the bits (a copy
 * of the first largest), average forward 1 ulp (the window's double sum, in the ref's order,
 * times 1 / (KH KW), rounded once), both backwards 1 ulp (double sums of dy, or dy / (KH KW),
 * in another order than the ref's, rounded once) plus POOL_DX_ATOL: where a pixel's terms
 * cancel (bf16's 8-bit dy cancel often) the result is near 0 and the two double sums' own
 * rounding, at most 16 terms of at most 1 each at 2^-53 on each side, 2^-44, is what is left
 * (the H200 run of 2026-11-27: 6.9e-18 against 1.04e-17 where the terms were about 0.1) */
#define POOL_DX_ATOL 0x1p-44
static void test_low_pool(fl_dtype t) {
    for (size_t i = 0; i < N_POOL_CASES; i++) {
        const pool_case *pc = &pool_cases[i];
        fl_conv_geom g = {.c = pc->c, .h = pc->h, .w = pc->w, .kh = pc->kh, .kw = pc->kw,
                          .sh = pc->sh, .sw = pc->sw, .ph = pc->ph, .pw = pc->pw, .dh = pc->dh,
                          .dw = pc->dw};
        CHECK(fl_conv_geom_out(&g));
        int64_t n = pc->n, nx = n * pc->c * pc->h * pc->w, ny = n * pc->c * g.oh * g.ow;
        void *x = hbuf((size_t)nx * 2), *dy = lrand(t, ny, -1, 1);
        for (int64_t k = 0; k < nx; k++)
            lset(t, x, k, pc->ties ? (fl_rng_below(&rng, 8) < 5 ? 0 : (double)fl_rng_below(&rng, 3))
                                   : 2 * fl_rng_uniform_f64(&rng) - 1);
        void *gx = lput(x, nx), *gdy = lput(dy, ny), *gy = G->alloc((size_t)ny * 2);
        void *gdx = G->alloc((size_t)nx * 2), *wy = hbuf((size_t)ny * 2), *wdx = hbuf((size_t)nx * 2);
        for (int pm = 0; pm < 2; pm++)
            for (int li = 0; li < 2; li++) {
                fl_pool pool = pm ? FL_POOL_AVG : FL_POOL_MAX;
                fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
                char what[300];
                snprintf(what, sizeof what, "%s pool %s %s", pm ? "avg" : "max", pc->name,
                         fl_layout_name(l));
                R->pool_forward(t, l, pool, n, &g, x, wy);
                R->pool_backward(t, l, pool, n, &g, x, dy, wdx);
                G->pool_forward(t, l, pool, n, &g, gx, gy);
                G->pool_backward(t, l, pool, n, &g, gx, gdy, gdx);
                void *hy = lback(gy, ny), *hdx = lback(gdx, nx);
                if (pm)
                    low_near("low avg pool forward", what, t, hy, wy, ny, 1, 0);
                else
                    same_bits("low max pool forward", what, hy, wy, (size_t)ny * 2);
                low_near(pm ? "low avg pool backward" : "low max pool backward", what, t, hdx, wdx,
                         nx, 1, POOL_DX_ATOL);
                free(hy), free(hdx);
            }
        G->free(gx), G->free(gdy), G->free(gy), G->free(gdx);
        free(x), free(dy), free(wy), free(wdx);
    }
}

/* batch norm, both layouts, training and inference, act none, relu, hardswish; gamma, beta,
 * dgamma, dbeta f32, mean and var double. The bounds, from the float arithmetic of the cuda
 * kernels (u = 2^-24), with A = max over channels of max|x| |a| + |b| (z = x a + b, a and b
 * rounded to float), K = max |gamma invstd|, S = max |dz| (1.5 max|dy| for hardswish), Xh =
 * max |xhat|, M = max |mean| invstd, N = the count per channel: y, 1 ulp + 2^-20 A (z's float
 * error is 4 u A, times hardswish's slope); dx = k d + bx (x - mean) + c0 in float, 1 ulp +
 * 2^-19 K (S (2 + Xh^2 + Xh M) + max|dy| A) (each term's rounding, mean rounded to float, the
 * means of d from float terms, hardswish' of a float z); dbeta and dgamma, double sums of N
 * float terms: N 2^-21 (S + max|dy| A), times (Xh + M + max|x| invstd) for dgamma. At
 * hardswish's kinks (z = +-3) hardswish' jumps by 1/2, and a float z within its error of a kink
 * can fall on the other side of the ref's double z: those elements (|z -+ 3| < 2^-18 A) are
 * left out of dx, and each adds its jump, dy / 2, to the sums' bounds. */
static void check_low_bn(fl_dtype t, const bn_case *bc) {
    int64_t n = bc->n, c = bc->c, hw = bc->hw, nx = n * c * hw, N = n * hw;
    const double eps = 1e-5;
    size_t xb = (size_t)nx * 2, cb = (size_t)c * 4, db = (size_t)c * sizeof(double);
    float *gamma = hrand(FL_DTYPE_F32, c, 0.5, 1.5), *beta = hrand(FL_DTYPE_F32, c, -0.5, 0.5);
    float *dg0 = hrand(FL_DTYPE_F32, c, -1, 1), *db0 = hrand(FL_DTYPE_F32, c, -1, 1);
    double *rmean = hbuf(db), *rvar = hbuf(db), *mref = hbuf(db), *vref = hbuf(db);
    void *x = hbuf(xb), *dy = lrand(t, nx, -1, 1), *wy = hbuf(xb), *wdx = hbuf(xb);
    float *wdg = hbuf(cb), *wdb = hbuf(cb);
    void *gg = dput(gamma, cb), *gbeta = dput(beta, cb), *gdg = G->alloc(cb), *gdb = G->alloc(cb);
    double *gm = G->alloc(db), *gv = G->alloc(db);
    double maxdy = lmaxabs(t, dy, nx);
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        for (int64_t ch = 0; ch < c; ch++) {
            double off = 4 * fl_rng_uniform_f64(&rng) - 2, sc = 0.2 + 2 * fl_rng_uniform_f64(&rng);
            for (int64_t b = 0; b < n; b++)
                for (int64_t p = 0; p < hw; p++)
                    lset(t, x, lat(l, c, hw, b, ch, p), off + sc * (2 * fl_rng_uniform_f64(&rng) - 1));
            rmean[ch] = off + 0.1 * (fl_rng_uniform_f64(&rng) - 0.5);
            rvar[ch] = sc * sc / 3 * (0.5 + fl_rng_uniform_f64(&rng));
        }
        double maxx = lmaxabs(t, x, nx);
        void *gx = lput(x, nx), *gdy = lput(dy, nx), *gy = G->alloc(xb), *gdx = G->alloc(xb);
        void *gry = G->alloc(xb);
        for (int training = 1; training >= 0; training--)
            for (int ai = 0; ai < 3; ai++) {
                fl_act act = ai == 0 ? FL_ACT_NONE : ai == 1 ? FL_ACT_RELU : FL_ACT_HARDSWISH;
                double *sm = training ? mref : rmean, *sv = training ? vref : rvar;
                char pre[200], what[300];
                snprintf(pre, sizeof pre, "bn (%lld, %lld, %lld) %s %s %s", (long long)n,
                         (long long)c, (long long)hw, fl_layout_name(l),
                         training ? "training" : "inference", fl_act_name(act));
                R->bn_forward(t, l, n, c, hw, x, gamma, beta, eps, training, sm, sv, act, wy);
                R->bn_backward(t, l, n, c, hw, x, act, wy, dy, gamma, beta, sm, sv, eps, training,
                               wdx, wdg, wdb, false);
                /* the bounds (above) from the ref's statistics */
                double A = 0, K = 0, Xh = 0, M = 0, ismax = 0, kink_dy = 0;
                bool *kink = hbuf((size_t)nx * sizeof(bool));
                for (int64_t ch = 0; ch < c; ch++) {
                    double is = 1 / sqrt(sv[ch] + eps), a = gamma[ch] * is;
                    double b = beta[ch] - sm[ch] * a;
                    A = fmax(A, maxx * fabs(a) + fabs(b)), K = fmax(K, fabs(a));
                    M = fmax(M, fabs(sm[ch]) * is), ismax = fmax(ismax, is);
                    for (int64_t bi = 0; bi < n; bi++)
                        for (int64_t p = 0; p < hw; p++)
                            Xh = fmax(Xh, fabs(lget(t, x, lat(l, c, hw, bi, ch, p)) - sm[ch]) * is);
                }
                for (int64_t ch = 0; ch < c && act == FL_ACT_HARDSWISH; ch++) {
                    double is = 1 / sqrt(sv[ch] + eps), a = gamma[ch] * is;
                    double b = beta[ch] - sm[ch] * a;
                    for (int64_t bi = 0; bi < n; bi++)
                        for (int64_t p = 0; p < hw; p++) {
                            int64_t e = lat(l, c, hw, bi, ch, p);
                            double z = lget(t, x, e) * a + b;
                            if (fabs(fabs(z) - 3) < ldexp(A, -18))
                                kink[e] = true, kink_dy += 0.5 * fabs(lget(t, dy, e));
                        }
                }
                double S = (act == FL_ACT_HARDSWISH ? 1.5 : 1) * maxdy;
                double tol_y = ldexp(A, -20);
                double tol_dx = ldexp(K * (S * (2 + Xh * Xh + Xh * M) + maxdy * A), -19) +
                                K * kink_dy * (1 + Xh * Xh) / (double)(N > 0 ? N : 1);
                double tol_db = ldexp((double)N * (S + maxdy * A), -21) + kink_dy;
                double tol_dg = ldexp((double)N * (S + maxdy * A), -21) * (Xh + M + maxx * ismax) +
                                kink_dy * Xh;

                G->copy(gm, rmean, db, FL_COPY_H2D, NULL);
                G->copy(gv, rvar, db, FL_COPY_H2D, NULL);
                G->bn_forward(t, l, n, c, hw, gx, gg, gbeta, eps, training, gm, gv, act, gy);
                void *hy = lback(gy, nx);
                snprintf(what, sizeof what, "%s: y", pre);
                low_near("low bn forward", what, t, hy, wy, nx, 1, tol_y);
                double *hm = dget(gm, db), *hv = dget(gv, db);
                if (training) { /* both double sums of the same exact values */
                    snprintf(what, sizeof what, "%s: mean", pre);
                    rel("low bn forward", what, FL_DTYPE_F64, hm, mref, c, 1e-10);
                    snprintf(what, sizeof what, "%s: var", pre);
                    rel("low bn forward", what, FL_DTYPE_F64, hv, vref, c, 1e-10);
                } else {
                    same_bits("low bn forward", "running mean untouched", hm, rmean, db);
                    same_bits("low bn forward", "running var untouched", hv, rvar, db);
                }
                /* backward with the ref's statistics and y (the relu's mask) */
                G->copy(gm, sm, db, FL_COPY_H2D, NULL);
                G->copy(gv, sv, db, FL_COPY_H2D, NULL);
                G->copy(gry, wy, xb, FL_COPY_H2D, NULL);
                G->bn_backward(t, l, n, c, hw, gx, act, gry, gdy, gg, gbeta, gm, gv, eps,
                               training, gdx, gdg, gdb, false);
                uint16_t *hdx = lback(gdx, nx);
                float *hdg = dget(gdg, cb), *hdb = dget(gdb, cb);
                for (int64_t e = 0; e < nx; e++)
                    if (kink[e])
                        hdx[e] = ((const uint16_t *)wdx)[e];
                snprintf(what, sizeof what, "%s: dx", pre);
                low_near("low bn backward", what, t, hdx, wdx, nx, 1, tol_dx);
                snprintf(what, sizeof what, "%s: dgamma", pre);
                f32_near("low bn backward", what, hdg, wdg, c, tol_dg);
                snprintf(what, sizeof what, "%s: dbeta", pre);
                f32_near("low bn backward", what, hdb, wdb, c, tol_db);
                /* accumulating, without dx */
                float *adg = hdup(dg0, cb), *adb = hdup(db0, cb);
                R->bn_backward(t, l, n, c, hw, x, act, wy, dy, gamma, beta, sm, sv, eps,
                               training, NULL, adg, adb, true);
                G->copy(gdg, dg0, cb, FL_COPY_H2D, NULL);
                G->copy(gdb, db0, cb, FL_COPY_H2D, NULL);
                G->bn_backward(t, l, n, c, hw, gx, act, gry, gdy, gg, gbeta, gm, gv, eps,
                               training, NULL, gdg, gdb, true);
                float *a1 = dget(gdg, cb), *a2 = dget(gdb, cb);
                snprintf(what, sizeof what, "%s: dgamma accumulated, no dx", pre);
                f32_near("low bn backward", what, a1, adg, c, tol_dg);
                snprintf(what, sizeof what, "%s: dbeta accumulated, no dx", pre);
                f32_near("low bn backward", what, a2, adb, c, tol_db);
                free(kink), free(hy), free(hm), free(hv), free(hdx), free(hdg), free(hdb);
                free(adg), free(adb), free(a1), free(a2);
            }
        G->free(gx), G->free(gdy), G->free(gy), G->free(gdx), G->free(gry);
    }
    G->free(gg), G->free(gbeta), G->free(gdg), G->free(gdb), G->free(gm), G->free(gv);
    free(gamma), free(beta), free(dg0), free(db0), free(rmean), free(rvar), free(mref);
    free(vref), free(x), free(dy), free(wy), free(wdx), free(wdg), free(wdb);
}

/* The error of an f32-accumulating product sum of K terms whose magnitudes sum to S (exact: a
 * product of two f16 or two bf16 values fits f32's 24 bits). Summed in f32 with rounding to
 * nearest, in any order, it is at most (K - 1) 2^-24 S (Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2002, eq. 4.4 without the second-order term). Tensor cores add a
 * block of products to the accumulator at once, aligning them to the largest and truncating
 * what falls below the f32 significand, and round the block's sum toward zero (Fasi, Higham,
 * Mikaitis and Pranesh 2021, "Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci.
 * 7:e384): each term can lose up to one f32 unit, 2^-23 of the largest, and the block's sum
 * another, so a block of b products costs at most (b + 2) 2^-23 times the magnitudes it adds,
 * no more than 3 2^-23 per term: 2^-21 (K + 2) S covers that with room (cuBLAS's and cuDNN's
 * split sums in f32 included; device_bind forbids cuBLAS's reductions in the 2-byte type). */
static double acc_err(int64_t k, double s) { return ldexp((double)(k + 2) * s, -21); }

/* gemm, f16 and bf16 (cublasGemmEx: a, b, c low, f32 compute) against the ref's gemm (the
 * double result rounded once): all four transposes, m, n, k of 1, odd sizes, k not a multiple
 * of 8, k = 0 (C = beta C), leading dimensions 3 wider than the rows, alpha and beta exact in
 * float (so cuBLAS's float scalars are the ref's). The GPU's c is alpha acc + beta c in f32,
 * acc within acc_err(k, S) of the exact sum, S = sum |a||b| of the element, then the products
 * with alpha and the add each round once in f32 (2^-24 of |alpha| S and of the result), then
 * one rounding to the low dtype: 1 ulp of the ref's value (the ref is within half an ulp of
 * the exact result, the GPU's value within half an ulp of its f32 result) plus
 * |alpha| acc_err(k, S) + 2^-23 (|alpha| S + |beta c|). C's padding columns keep their bits;
 * with beta 0, c's NaNs are not read. */
static void test_low_gemm(fl_dtype t) {
    static const int64_t sizes[][3] = {{0, 3, 4}, {3, 0, 4}, {1, 1, 1},  {7, 5, 3},
                                       {2, 9, 1}, {5, 3, 0}, {1, 33, 129}, {17, 1, 13},
                                       {33, 17, 65}, {64, 40, 256}, {130, 97, 71}};
    static const double ab[][2] = {{1, 0}, {0.75, -1.25}, {1, 1}, {-2, 0.5}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (size_t c = 0; c < sizeof ab / sizeof ab[0]; c++) {
                    double alpha = ab[c][0], beta = ab[c][1];
                    int64_t arows = ta ? k : m, acols = ta ? m : k;
                    int64_t brows = tb ? n : k, bcols = tb ? k : n;
                    int64_t lda = acols + 3, ldb = bcols + 3, ldc = n + 3, nc = m * ldc;
                    void *a = lrand(t, arows * lda, -1, 1), *b = lrand(t, brows * ldb, -1, 1);
                    void *c0 = lrand(t, nc, -1, 1);
                    if (beta == 0) /* not to be read */
                        for (int64_t i = 0; i < nc; i += 2)
                            lset(t, c0, i, NAN);
                    void *cr = hdup(c0, (size_t)nc * 2);
                    void *da = lput(a, arows * lda), *db = lput(b, brows * ldb), *dc = lput(c0, nc);
                    G->gemm(t, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc);
                    R->gemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cr, ldc);
                    uint16_t *cg = lback(dc, nc);
                    char what[160];
                    snprintf(what, sizeof what,
                             "gemm %c%c m=%lld n=%lld k=%lld alpha=%g beta=%g [%s]",
                             ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n,
                             (long long)k, alpha, beta, fl_dtype_name(t));
                    /* the elements of c (m x n) and their bounds; the padding by its bits */
                    int64_t mn = m * n;
                    double *got = hbuf((size_t)(mn ? mn : 1) * sizeof *got);
                    double *want = hbuf((size_t)(mn ? mn : 1) * sizeof *want);
                    double *lim = hbuf((size_t)(mn ? mn : 1) * sizeof *lim);
                    bool pad_ok = true;
                    for (int64_t i = 0; i < m; i++) {
                        for (int64_t j = n; j < ldc; j++)
                            pad_ok = pad_ok && cg[i * ldc + j] == ((uint16_t *)c0)[i * ldc + j];
                        for (int64_t j = 0; j < n; j++) {
                            double sab = 0;
                            for (int64_t p = 0; p < k; p++)
                                sab += fabs(lget(t, a, ta ? p * lda + i : i * lda + p) *
                                            lget(t, b, tb ? j * ldb + p : p * ldb + j));
                            double w = lget(t, cr, i * ldc + j);
                            double bc = beta == 0 ? 0 : fabs(beta * lget(t, c0, i * ldc + j));
                            got[i * n + j] = lget(t, cg, i * ldc + j), want[i * n + j] = w;
                            lim[i * n + j] = lulp(t, w) + fabs(alpha) * acc_err(k, sab) +
                                             ldexp(fabs(alpha) * sab + bc, -23);
                        }
                    }
                    within("low gemm", what, got, want, lim, mn);
                    note("low gemm", pad_ok ? 0 : INFINITY, 1);
                    if (!pad_ok) {
                        fprintf(stderr, "low gemm: %s: c's padding columns changed\n", what);
                        test_failures++;
                    }
                    G->free(da), G->free(db), G->free(dc);
                    free(a), free(b), free(c0), free(cr), free(cg), free(got), free(want),
                        free(lim);
                }
    }
}

/* The convolution cases the low test runs: those of backend_cases.h whose forward takes at most
 * 3M multiply-adds at the max batch (the ref's low convolutions are direct loops in double, run
 * here six times per case, layout and dtype), and a few random ones. */
static bool low_conv_small(const conv_case *cc) {
    fl_conv_geom g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh, .kw = cc->kw,
                      .sh = cc->sh, .sw = cc->sw, .ph = cc->ph, .pw = cc->pw, .dh = cc->dh,
                      .dw = cc->dw};
    if (!fl_conv_geom_out(&g))
        return false;
    double macs = (double)(cc->n + cc->extra) * (double)(cc->oc * g.oh * g.ow) *
                  (double)(cc->ic / cc->groups * cc->kh * cc->kw);
    return macs <= 3e6;
}

/* One convolution case in f16 or bf16, NCHW and NHWC, against the ref table's low plan on the
 * same inputs (x and dy low; w, bias, dw, dbias f32; w read rounded to t by both; the same
 * bytes given to both tables in the plan's layout): forward at the max batch and at the case's
 * smaller batch, backward data, backward filter written and accumulated into f32 dw and
 * dbias, the backwards bit-repeatable. Bounds per element, S the element's sum of |products|
 * (the ref's convolution of |x|, |w| or |dy|, rounded to t, so times 1 + 2^-7) over K terms
 * (forward IC/G KH KW, backward data OC/G KH KW, backward filter n OH OW), acc_err above:
 * forward without bias and backward data, 1 ulp + acc_err(K, S) (f32 accumulation, one rounding
 * to t: the two results are neighbours or closer); forward with bias, cuDNN's y rounded to t
 * and then the f32 bias added by fleet's kernel and rounded again: before that last rounding
 * the GPU's value is f = acc_err(K, S) + half an ulp of t at S (the first rounding) + 2^-23
 * (|y| + 1 ulp) (the float add) from the exact one, so the bound is f plus half an ulp at the
 * ref's value and half an ulp at |y| + f + 1 ulp (the GPU's can lie a binade above, where the
 * spacing doubles; a bias that cancels y makes the first rounding's ulp larger than y's);
 * dw (written), the low gradient converted exactly: 1 ulp
 * of t + acc_err(K, S); dw accumulated, dw0 + that in one f32 add on both sides: the written
 * bound times 1 + 2^-23, plus 2^-23 |want|; dbias, a double sum rounded to f32 (f32_near). The
 * bounds assume GEMM-like algorithms (implicit GEMM, the tensor-core kernels); were cuDNN to
 * pick a transform (FFT, Winograd) for a shape, its error would not be bounded by S (a miss
 * then names the case: FLEET_CUDA_CONV_LOG=1 shows the algorithms). */
static void check_low_conv(fl_dtype t, const conv_case *cc) {
    fl_conv_desc d = {.dtype = t, .oc = cc->oc, .groups = cc->groups, .bias = cc->bias,
                      .g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh, .kw = cc->kw,
                            .sh = cc->sh, .sw = cc->sw, .ph = cc->ph, .pw = cc->pw, .dh = cc->dh,
                            .dw = cc->dw}};
    CHECK(fl_conv_geom_out(&d.g));
    int64_t n = cc->n, N = cc->n + cc->extra, ohw = d.g.oh * d.g.ow;
    int64_t in = cc->ic * cc->h * cc->w, out = cc->oc * ohw, icg = cc->ic / cc->groups;
    int64_t nw = cc->oc * icg * cc->kh * cc->kw, oc = cc->oc;
    int64_t kf = icg * cc->kh * cc->kw, kd = cc->oc / cc->groups * cc->kh * cc->kw, kw_ = n * ohw;
    double ws = 1 / sqrt((double)kf), sfac = 1 + ldexp(1, -7);
    size_t wb = (size_t)nw * 4, cb = (size_t)oc * 4;
    /* x, dy low (random in either layout: the same bytes go to both tables); w, bias f32 */
    void *x = lrand(t, N * in, -1, 1), *dy = lrand(t, n * out, -1, 1);
    float *w = hrand(FL_DTYPE_F32, nw, -ws, ws), *b = hrand(FL_DTYPE_F32, oc, -.5, .5);
    float *dw0 = hrand(FL_DTYPE_F32, nw, -1, 1), *db0 = hrand(FL_DTYPE_F32, oc, -1, 1);
    void *xa = hbuf((size_t)(N * in) * 2), *dya = hbuf((size_t)(n * out) * 2);
    float *wa = hbuf(wb);
    for (int64_t i = 0; i < N * in; i++)
        lset(t, xa, i, fabs(lget(t, x, i)));
    for (int64_t i = 0; i < n * out; i++)
        lset(t, dya, i, fabs(lget(t, dy, i)));
    for (int64_t i = 0; i < nw; i++)
        wa[i] = fabsf(w[i]);
    const float *bias = cc->bias ? b : NULL;
    void *gw = dput(w, wb), *gb = dput(b, cb), *gx = lput(x, N * in), *gdy = lput(dy, n * out);
    void *gy = G->alloc((size_t)(N * out) * 2), *gdx = G->alloc((size_t)(n * in) * 2);
    void *gdw = G->alloc(wb), *gdb = G->alloc(cb);
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        char pre[500], what[600];
        snprintf(pre, sizeof pre, "conv %s %s [%s]", cc->name, fl_layout_name(l),
                 fl_dtype_name(t));
        d.layout = l, d.max_batch = N;
        /* the reference and the sums of magnitudes */
        fl_conv_plan *rp = R->conv_plan_create(&d);
        CHECK(rp);
        if (!rp)
            continue;
        void *y_ref = hbuf((size_t)(N * out) * 2), *dx_ref = hbuf((size_t)(n * in) * 2);
        void *sy = hbuf((size_t)(N * out) * 2), *sdx = hbuf((size_t)(n * in) * 2);
        float *dw_ref = hbuf(wb), *db_ref = hbuf(cb), *dwa_ref = hbuf(wb), *dba_ref = hbuf(cb);
        float *sdw = hbuf(wb);
        R->conv_forward(rp, N, x, w, bias, y_ref, NULL);
        R->conv_backward_data(rp, n, dy, w, dx_ref, NULL);
        R->conv_backward_filter(rp, n, x, dy, dw_ref, cc->bias ? db_ref : NULL, false, NULL);
        memcpy(dwa_ref, dw0, wb), memcpy(dba_ref, db0, cb);
        R->conv_backward_filter(rp, n, x, dy, dwa_ref, cc->bias ? dba_ref : NULL, true, NULL);
        R->conv_forward(rp, N, xa, wa, NULL, sy, NULL);
        R->conv_backward_data(rp, n, dya, wa, sdx, NULL);
        R->conv_backward_filter(rp, n, xa, dya, sdw, NULL, false, NULL);
        R->conv_plan_free(rp);

        fl_conv_plan *p = G->conv_plan_create(&d);
        CHECK(p);
        if (!p) {
            fprintf(stderr, "%s: cuda plan: %s\n", pre, fl_errmsg());
            free(y_ref), free(dx_ref), free(sy), free(sdx), free(dw_ref), free(db_ref);
            free(dwa_ref), free(dba_ref), free(sdw);
            continue;
        }
        void *s = G->alloc(G->conv_scratch_bytes(p));
        /* forward at the max batch, then at n (other algorithms): the first nn images */
        int64_t ny = N * out;
        double *want = ldoubles(t, y_ref, ny), *lim = hbuf((size_t)ny * sizeof *lim);
        for (int64_t i = 0; i < ny; i++) {
            double S = lget(t, sy, i) * sfac, e = acc_err(kf, S), u = lulp(t, want[i]);
            if (!cc->bias) {
                lim[i] = u + e;
                continue;
            }
            /* before the last rounding the GPU's value is within f of the exact one, so it
             * rounds to within half an ulp at |want| + f + u (a binade above want's, maybe) */
            double f = e + 0.5 * lulp(t, S + e) + ldexp(fabs(want[i]) + u, -23);
            lim[i] = f + 0.5 * u + 0.5 * lulp(t, fabs(want[i]) + f + u);
        }
        for (int k = 0; k < 2; k++) {
            int64_t nn = k ? n : N;
            G->conv_forward(p, nn, gx, gw, cc->bias ? gb : NULL, gy, s);
            void *h = lback(gy, nn * out);
            double *got = ldoubles(t, h, nn * out);
            snprintf(what, sizeof what, "%s: forward, batch %lld%s", pre, (long long)nn,
                     cc->bias ? ", bias" : "");
            within("low conv forward", what, got, want, lim, nn * out);
            free(h), free(got);
        }
        free(want), free(lim);
        /* backward data */
        G->conv_backward_data(p, n, gdy, gw, gdx, s);
        void *hdx = lback(gdx, n * in);
        double *got = ldoubles(t, hdx, n * in);
        want = ldoubles(t, dx_ref, n * in), lim = hbuf((size_t)(n * in) * sizeof *lim);
        for (int64_t i = 0; i < n * in; i++)
            lim[i] = lulp(t, want[i]) + acc_err(kd, lget(t, sdx, i) * sfac);
        snprintf(what, sizeof what, "%s: backward data", pre);
        within("low conv backward data", what, got, want, lim, n * in);
        free(got), free(want), free(lim);
        /* backward filter, written (dw holding garbage first) */
        G->copy(gdw, dw0, wb, FL_COPY_H2D, NULL);
        G->copy(gdb, db0, cb, FL_COPY_H2D, NULL);
        G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, false, s);
        float *hdw = dget(gdw, wb), *hdb = dget(gdb, cb);
        got = fdoubles(hdw, nw), want = fdoubles(dw_ref, nw), lim = hbuf(wb * 2);
        for (int64_t i = 0; i < nw; i++)
            lim[i] = lulp(t, want[i]) + acc_err(kw_, sdw[i] * sfac);
        snprintf(what, sizeof what, "%s: dw", pre);
        within("low conv backward filter", what, got, want, lim, nw);
        if (cc->bias) {
            snprintf(what, sizeof what, "%s: dbias", pre);
            f32_near("low conv backward filter", what, hdb, db_ref, oc, 0);
        }
        /* accumulated */
        G->copy(gdw, dw0, wb, FL_COPY_H2D, NULL);
        G->copy(gdb, db0, cb, FL_COPY_H2D, NULL);
        G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, true, s);
        float *hdwa = dget(gdw, wb), *hdba = dget(gdb, cb);
        double *gota = fdoubles(hdwa, nw), *wanta = fdoubles(dwa_ref, nw);
        for (int64_t i = 0; i < nw; i++)
            lim[i] = lim[i] * (1 + ldexp(1, -23)) + ldexp(fabs(wanta[i]), -23);
        snprintf(what, sizeof what, "%s: dw accumulated", pre);
        within("low conv backward filter", what, gota, wanta, lim, nw);
        if (cc->bias) {
            snprintf(what, sizeof what, "%s: dbias accumulated", pre);
            f32_near("low conv backward filter", what, hdba, dba_ref, oc, 0);
        }
        /* bit-repeatable (unless FLEET_CUDNN_DETERMINISTIC=0) */
        if (!fast_algorithms()) {
            G->conv_backward_data(p, n, gdy, gw, gdx, s);
            G->conv_backward_filter(p, n, gx, gdy, gdw, cc->bias ? gdb : NULL, false, s);
            void *hdx2 = lback(gdx, n * in);
            float *hdw2 = dget(gdw, wb);
            snprintf(what, sizeof what, "%s: run twice", pre);
            same_bits("low conv backward data (repeat)", what, hdx2, hdx, (size_t)(n * in) * 2);
            same_bits("low conv backward filter (repeat)", what, hdw2, hdw, wb);
            free(hdx2), free(hdw2);
        }
        G->free(s);
        G->conv_plan_free(p);
        free(hdx), free(got), free(want), free(lim), free(hdw), free(hdb), free(hdwa);
        free(hdba), free(gota), free(wanta);
        free(y_ref), free(dx_ref), free(sy), free(sdx), free(dw_ref), free(db_ref);
        free(dwa_ref), free(dba_ref), free(sdw);
    }
    G->free(gw), G->free(gb), G->free(gx), G->free(gdy), G->free(gy), G->free(gdx);
    G->free(gdw), G->free(gdb);
    free(x), free(dy), free(w), free(b), free(dw0), free(db0), free(xa), free(dya), free(wa);
}

static void test_low_conv(fl_dtype t) {
    int ran = 0;
    for (size_t i = 0; i < N_CONV_CASES; i++)
        if (low_conv_small(&conv_cases[i]))
            check_low_conv(t, &conv_cases[i]), ran++;
    CHECK(ran >= 15); /* 1x1, 3x3 p1, strides, groups, depthwise, dilation, batch 1 among them */
    for (int i = 0; i < 4; i++) {
        conv_case c;
        char name[400];
        conv_case_random(&rng, i, &c, name, sizeof name);
        check_low_conv(t, &c);
    }
}

/* The low-dtype flag (FLEET_CUDA_LOW_DTYPES, read once by fl_backend_cuda(); this process's
 * environment says what it must be), the preferred layouts (f16 / bf16 channels-last, f32 as
 * before), and that low plans do not change what f32 and f64 plans are: an f32 and an f64 plan
 * of either layout are still made (test_conv checks their values), a low one of either layout
 * now is, and a bad dtype is still refused naming it. */
static void test_low_flag(void) {
    const char *e = getenv("FLEET_CUDA_LOW_DTYPES"), *nh = getenv("FLEET_CUDA_NHWC");
    CHECK(G->low_dtypes == (e && e[0] == '1'));
    CHECK(G->convert != NULL);
    CHECK(G->preferred_layout(FL_DTYPE_F16) == FL_LAYOUT_NHWC);
    CHECK(G->preferred_layout(FL_DTYPE_BF16) == FL_LAYOUT_NHWC);
    CHECK(G->preferred_layout(FL_DTYPE_F32) ==
          (nh && nh[0] == '1' ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW));
    CHECK(G->preferred_layout(FL_DTYPE_F64) == FL_LAYOUT_NCHW);
    static const fl_dtype all[] = {FL_DTYPE_F32, FL_DTYPE_F64, FL_DTYPE_F16, FL_DTYPE_BF16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (int li = 0; li < 2; li++) {
            fl_conv_desc d = {.dtype = all[i], .layout = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW,
                              .max_batch = 2, .oc = 6, .groups = 2, .bias = true,
                              .g = {.c = 4, .h = 5, .w = 5, .kh = 3, .kw = 3, .sh = 1, .sw = 1,
                                    .ph = 1, .pw = 1, .dh = 1, .dw = 1}};
            CHECK(fl_conv_geom_out(&d.g));
            fl_conv_plan *p = G->conv_plan_create(&d);
            if (!p && all[i] == FL_DTYPE_F64 && li) /* as test_conv: f64 NHWC may be refused */
                continue;
            if (!p)
                fprintf(stderr, "%s %s plan: %s\n", fl_dtype_name(all[i]),
                        fl_layout_name(d.layout), fl_errmsg());
            CHECK(p != NULL);
            G->conv_plan_free(p);
        }
    fl_conv_desc d = {.dtype = FL_DTYPE_I32, .layout = FL_LAYOUT_NCHW, .max_batch = 2, .oc = 6,
                      .groups = 1, .g = {.c = 4, .h = 5, .w = 5, .kh = 3, .kw = 3, .sh = 1,
                                         .sw = 1, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(G->conv_plan_create(&d) == NULL);
    CHECK_MSG("i32");
}

/* every low op, f16 and bf16 */
static void test_low(void) {
    for (size_t i = 0; i < sizeof lows / sizeof lows[0]; i++) {
        fl_dtype t = lows[i];
        test_low_convert(t);
        test_low_elementwise(t);
        test_low_bias(t);
        test_low_channel_ops(t);
        test_low_pool(t);
        for (size_t k = 0; k < N_BN_CASES; k++)
            check_low_bn(t, &bn_cases[k]);
        test_low_gemm(t);
        test_low_conv(t);
    }
}

/* ------------------------------------------------------------------------------------------ */

int main(void) {
    G = fl_backend_cuda();
    if (!G)
        TEST_SKIP("no CUDA device (fleet was built without CUDA)");
    unsetenv("FLEET_CUDA_TF32"); /* f32 is checked with TF32 off */
    if (G->device_bind(0) != FL_OK) {
        char why[600];
        snprintf(why, sizeof why, "no CUDA device (%s)", fl_errmsg());
        TEST_SKIP(why);
    }
    R = fl_backend_ref();
    CPU = fl_backend_cpu();
    fl_rng_init(&rng, 20251125, 0);
    test_memory();
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        fl_dtype t = dtypes[i];
        test_gemm(t);
        test_bias_sum_rows(t);
        test_activations(t);
        test_axpy_scale_updates(t);
        test_bn_running(t);
        test_lars_run(t);
        test_reductions(t);
        test_softmax(t);
        test_layer_ops(t);
        test_channel_ops(t);
    }
    test_amp_round();
    test_conv();
    test_pool();
    test_bn();
    test_dgc_select();
    test_dgc_accumulate();
    test_dgc_pairs();
    test_low_flag();
    test_low();
    fprintf(stderr, "%-34s %8s %-11s %-11s\n", "op", "checks", "worst", "tolerance");
    for (int i = 0; i < nops; i++)
        fprintf(stderr, "%-34s %8ld %-11.2g %-11.2g\n", ops[i].op, ops[i].checks, ops[i].worst,
                ops[i].tol);
    fprintf(stderr, "memory_peak: %.1f MiB\n", (double)G->memory_peak() / (1 << 20));
    TEST_DONE();
}
