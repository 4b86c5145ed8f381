/* test_backend_onednn.c - every op the onednn backend overrides (convolution forward and both
 * backwards, max and average pooling, batch norm in training and inference with and without the
 * fused ReLU), in both layouts, against the ref table on f32: random shapes (batch 1, odd
 * channels, 1x1 / 3x3 / 7x7, stride, padding, groups, dilation), ResNet-50's shapes, windows
 * with ties; a smaller batch than a plan's max; the f64 fallback to the cpu table; and that
 * every op gives the same bits with 1, 2, 3 and 4 threads, and again with 2 (failed where not,
 * and printed as a table: docs/backends.md). */
#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "backend_cases.h"
#include "test.h"

#include <stdbool.h>
#include <stdint.h>

static fl_rng rng;
static const fl_backend *R, *O; /* ref, onednn */

/* Thread counts of the runs of each op: run 0 (1 thread) against runs 1-3 tells thread-count
 * dependence, the last run (2 threads again) against run 1 whether a run repeats itself. Runs
 * 0 and 1 are checked against the ref as well. */
#define NRUNS 5
static const int THREADS[NRUNS] = {1, 2, 3, 4, 2};

enum {
    OP_CONV_FWD, OP_CONV_BWD_DATA, OP_CONV_BWD_FILTER, OP_POOL_MAX_FWD, OP_POOL_MAX_BWD,
    OP_POOL_AVG_FWD, OP_POOL_AVG_BWD, OP_BN_FWD_TRAIN, OP_BN_FWD_INFER, OP_BN_BWD_TRAIN,
    OP_BN_BWD_INFER, OP_COUNT
};
static const char *op_name[OP_COUNT] = {
    "conv forward", "conv backward data", "conv backward filter", "max pool forward",
    "max pool backward", "avg pool forward", "avg pool backward", "bn forward training",
    "bn forward inference", "bn backward training", "bn backward inference"};
/* Tolerances, f32: max |got - ref| <= tol * (1 + max |ref|) over each output, the ref table
 * computing in double. Convolution: a sum of K products in float, so tol grows with K (sqrt K:
 * rounding errors of random sign), 1e-5 at K <= 1600 and up to 1e-4; the weight gradient's K
 * is N OH OW. Pooling: max exact (a copy, and the same adds in the same order backward),
 * average within float rounding of a mean. Batch norm: statistics in double as the ref's, y and
 * dx in float with other formulas than the ref's float ones, scaled by 1 / standard deviation
 * (the dx of a two-sample channel is the residue of a cancellation). */
#define TOL_POOL_AVG 2e-6
#define TOL_BN_FWD 2e-5
#define TOL_BN_BWD 1e-4
static double conv_tol(int64_t k) {
    double t = 2.5e-7 * sqrt((double)k);
    return t < 1e-5 ? 1e-5 : t > 1e-4 ? 1e-4 : t;
}
/* [op][layout]: the first thread count whose bits differed from 1 thread's (0: none); whether
 * two runs with 2 threads differed */
static int thread_dep[OP_COUNT][2];
static bool run_dep[OP_COUNT][2];
static double worst[OP_COUNT][2]; /* largest max|diff| / (1 + max|ref|) seen, per layout */
static double worst_tol[OP_COUNT];
static fl_layout cur_layout; /* the layout check_rel counts a result under */

/* Fails unless the runs of op in layout l (`bytes` each, `what` naming the case) gave the
 * same bits for every thread count, and when repeated. */
static void note_bytes(int op, fl_layout l, const char *what, const void *const r[NRUNS],
                       size_t bytes) {
    for (int i = 1; i < NRUNS - 1; i++)
        if (memcmp(r[0], r[i], bytes)) {
            fprintf(stderr, "%s %s: %s: %d threads give other bits than 1\n", what,
                    fl_layout_name(l), op_name[op], THREADS[i]);
            test_failures++;
            if (!thread_dep[op][l])
                thread_dep[op][l] = THREADS[i];
            break;
        }
    if (memcmp(r[1], r[NRUNS - 1], bytes)) {
        fprintf(stderr, "%s %s: %s: two runs with %d threads differ\n", what, fl_layout_name(l),
                op_name[op], THREADS[1]);
        test_failures++;
        run_dep[op][l] = true;
    }
}
static void note_runs(int op, fl_layout l, const char *what, float *const r[NRUNS], int64_t n) {
    const void *p[NRUNS];
    for (int i = 0; i < NRUNS; i++)
        p[i] = r[i];
    note_bytes(op, l, what, p, (size_t)n * sizeof(float));
}

/* got against want (n floats): max |diff| <= tol (1 + max |want|) */
static void check_rel(int op, const char *what, const float *got, const float *want, int64_t n,
                      double tol) {
    double mx = 0, md = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs((double)want[i]));
        md = fmax(md, fabs((double)got[i] - (double)want[i]));
    }
    if (md / (1 + mx) > worst[op][cur_layout])
        worst[op][cur_layout] = md / (1 + mx);
    if (tol > worst_tol[op])
        worst_tol[op] = tol;
    CHECK_CLOSE_F32(what, got, want, n, tol * (1 + mx), 0);
}

static float *fbuf(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    FL_ASSERT(p);
    return p;
}

static void fill(float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(lo + (hi - lo) * fl_rng_uniform_f64(&rng));
}

/* NCHW (N, C, HW) <-> layout, by hand (independent of the backend under test) */
static void to_layout(fl_layout l, int64_t n, int64_t c, int64_t hw, const float *src,
                      float *dst) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < hw; i++)
                dst[l == FL_LAYOUT_NHWC ? (b * hw + i) * c + ch : (b * c + ch) * hw + i] =
                    src[(b * c + ch) * hw + i];
}
static void from_layout(fl_layout l, int64_t n, int64_t c, int64_t hw, const float *src,
                        float *dst) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < hw; i++)
                dst[(b * c + ch) * hw + i] =
                    src[l == FL_LAYOUT_NHWC ? (b * hw + i) * c + ch : (b * c + ch) * hw + i];
}

/* ------------------------------------------------------------------------------------------ */
/* convolution */


static void check_conv(const conv_case *cc) {
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NCHW, .oc = cc->oc,
                      .groups = cc->groups, .bias = cc->bias,
                      .g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh, .kw = cc->kw,
                            .sh = cc->sh, .sw = cc->sw, .ph = cc->ph, .pw = cc->pw,
                            .dh = cc->dh, .dw = cc->dw}};
    CHECK(fl_conv_geom_out(&d.g));
    int64_t n = cc->n, N = cc->n + cc->extra, oh = d.g.oh, ow = d.g.ow;
    int64_t in = cc->ic * cc->h * cc->w, out = cc->oc * oh * ow;
    int64_t nw = cc->oc * (cc->ic / cc->groups) * cc->kh * cc->kw;
    float *x = fbuf(N * in), *w = fbuf(nw), *b = fbuf(cc->oc), *dy = fbuf(n * out);
    float *dw0 = fbuf(nw), *db0 = fbuf(cc->oc);
    fill(x, N * in, -1, 1);
    fill(w, nw, -1 / sqrt((double)nw / cc->oc), 1 / sqrt((double)nw / cc->oc));
    fill(b, cc->oc, -0.5, 0.5);
    fill(dy, n * out, -1, 1);
    fill(dw0, nw, -1, 1);
    fill(db0, cc->oc, -1, 1);
    const float *bias = cc->bias ? b : NULL;

    /* the reference: forward on all N images, the backwards on the first n */
    d.max_batch = N;
    fl_conv_plan *rp = R->conv_plan_create(&d);
    CHECK(rp);
    if (!rp) {
        fprintf(stderr, "%s: ref plan: %s\n", cc->name, fl_errmsg());
        return;
    }
    void *rs = R->alloc(R->conv_scratch_bytes(rp));
    float *y_ref = fbuf(N * out), *dx_ref = fbuf(n * in), *dw_ref = fbuf(nw);
    float *db_ref = fbuf(cc->oc), *dwa_ref = fbuf(nw), *dba_ref = fbuf(cc->oc);
    R->conv_forward(rp, N, x, w, bias, y_ref, rs);
    R->conv_backward_data(rp, n, dy, w, dx_ref, rs);
    R->conv_backward_filter(rp, n, x, dy, dw_ref, cc->bias ? db_ref : NULL, false, rs);
    for (int64_t i = 0; i < nw; i++)
        dwa_ref[i] = (float)((double)dw0[i] + dw_ref[i]);
    for (int64_t i = 0; i < cc->oc; i++)
        dba_ref[i] = (float)((double)db0[i] + db_ref[i]);
    R->free(rs);
    R->conv_plan_free(rp);

    int64_t kf = cc->ic / cc->groups * cc->kh * cc->kw;
    int64_t kd = cc->oc / cc->groups * cc->kh * cc->kw, kw_ = n * oh * ow;
    float *xl = fbuf(N * in), *dyl = fbuf(n * out), *yN = fbuf(N * out);
    float *t = fbuf(N * out + n * in);
    float *y[NRUNS], *dx[NRUNS], *dw[NRUNS], *db[NRUNS], *dwa[NRUNS], *dba[NRUNS];
    for (int r = 0; r < NRUNS; r++) {
        y[r] = fbuf(n * out), dx[r] = fbuf(n * in), dw[r] = fbuf(nw), db[r] = fbuf(cc->oc);
        dwa[r] = fbuf(nw), dba[r] = fbuf(cc->oc);
    }
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        char what[600];
        cur_layout = l;
        d.layout = l;
        d.max_batch = N;
        fl_conv_plan *p = O->conv_plan_create(&d);
        CHECK(p);
        if (!p) {
            fprintf(stderr, "%s %s: onednn plan: %s\n", cc->name, fl_layout_name(l), fl_errmsg());
            continue;
        }
        void *s = O->alloc(O->conv_scratch_bytes(p));
        to_layout(l, N, cc->ic, cc->h * cc->w, x, xl);
        to_layout(l, n, cc->oc, oh * ow, dy, dyl);
        /* the plan's max batch, 2 threads */
        fl_kernels_set_threads(2);
        O->conv_forward(p, N, xl, w, bias, yN, s);
        from_layout(l, N, cc->oc, oh * ow, yN, t);
        snprintf(what, sizeof what, "%s %s: forward, batch %lld", cc->name, fl_layout_name(l),
                 (long long)N);
        check_rel(OP_CONV_FWD, what, t, y_ref, N * out, conv_tol(kf));
        /* n images on the same plan, a run per thread count */
        for (int r = 0; r < NRUNS; r++) {
            fl_kernels_set_threads(THREADS[r]);
            O->conv_forward(p, n, xl, w, bias, y[r], s);
            O->conv_backward_data(p, n, dyl, w, dx[r], s);
            O->conv_backward_filter(p, n, xl, dyl, dw[r], cc->bias ? db[r] : NULL, false, s);
            memcpy(dwa[r], dw0, (size_t)nw * sizeof(float));
            memcpy(dba[r], db0, (size_t)cc->oc * sizeof(float));
            O->conv_backward_filter(p, n, xl, dyl, dwa[r], cc->bias ? dba[r] : NULL, true, s);
        }
        fl_kernels_set_threads(2);
        for (int r = 0; r < 2; r++) {
            snprintf(what, sizeof what, "%s %s %d thread(s): forward", cc->name,
                     fl_layout_name(l), THREADS[r]);
            from_layout(l, n, cc->oc, oh * ow, y[r], t);
            check_rel(OP_CONV_FWD, what, t, y_ref, n * out, conv_tol(kf));
            snprintf(what, sizeof what, "%s %s %d thread(s): backward data", cc->name,
                     fl_layout_name(l), THREADS[r]);
            from_layout(l, n, cc->ic, cc->h * cc->w, dx[r], t);
            check_rel(OP_CONV_BWD_DATA, what, t, dx_ref, n * in, conv_tol(kd));
            snprintf(what, sizeof what, "%s %s %d thread(s): dw", cc->name, fl_layout_name(l),
                     THREADS[r]);
            check_rel(OP_CONV_BWD_FILTER, what, dw[r], dw_ref, nw, conv_tol(kw_));
            snprintf(what, sizeof what, "%s %s %d thread(s): dw accumulated", cc->name,
                     fl_layout_name(l), THREADS[r]);
            check_rel(OP_CONV_BWD_FILTER, what, dwa[r], dwa_ref, nw, conv_tol(kw_));
            if (cc->bias) {
                snprintf(what, sizeof what, "%s %s %d thread(s): dbias", cc->name,
                         fl_layout_name(l), THREADS[r]);
                check_rel(OP_CONV_BWD_FILTER, what, db[r], db_ref, cc->oc, conv_tol(kw_));
                snprintf(what, sizeof what, "%s %s %d thread(s): dbias accumulated", cc->name,
                         fl_layout_name(l), THREADS[r]);
                check_rel(OP_CONV_BWD_FILTER, what, dba[r], dba_ref, cc->oc, conv_tol(kw_));
            }
        }
        note_runs(OP_CONV_FWD, l, cc->name, y, n * out);
        note_runs(OP_CONV_BWD_DATA, l, cc->name, dx, n * in);
        note_runs(OP_CONV_BWD_FILTER, l, cc->name, dw, nw);
        note_runs(OP_CONV_BWD_FILTER, l, cc->name, dwa, nw);
        if (cc->bias) {
            note_runs(OP_CONV_BWD_FILTER, l, cc->name, db, cc->oc);
            note_runs(OP_CONV_BWD_FILTER, l, cc->name, dba, cc->oc);
        }
        O->free(s);
        O->conv_plan_free(p);
    }
    for (int r = 0; r < NRUNS; r++)
        free(y[r]), free(dx[r]), free(dw[r]), free(db[r]), free(dwa[r]), free(dba[r]);
    free(xl), free(dyl), free(yN), free(t);
    free(y_ref), free(dx_ref), free(dw_ref), free(db_ref), free(dwa_ref), free(dba_ref);
    free(x), free(w), free(b), free(dy), free(dw0), free(db0);
}

static void test_conv(void) {
    for (size_t i = 0; i < N_CONV_CASES; i++)
        check_conv(&conv_cases[i]);
    for (int i = 0; i < N_CONV_RANDOM; i++) {
        conv_case c;
        char name[400];
        conv_case_random(&rng, i, &c, name, sizeof name);
        check_conv(&c);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* pooling */


static void check_pool(const pool_case *pc, fl_pool pool) {
    fl_conv_geom g = {.c = pc->c, .h = pc->h, .w = pc->w, .kh = pc->kh, .kw = pc->kw,
                      .sh = pc->sh, .sw = pc->sw, .ph = pc->ph, .pw = pc->pw, .dh = pc->dh,
                      .dw = pc->dw};
    CHECK(fl_conv_geom_out(&g));
    int64_t n = pc->n, in = pc->c * pc->h * pc->w, out = pc->c * g.oh * g.ow;
    float *x = fbuf(n * in), *dy = fbuf(n * out), *y_ref = fbuf(n * out), *dx_ref = fbuf(n * in);
    if (pc->ties)
        for (int64_t i = 0; i < n * in; i++)
            x[i] = (float)(fl_rng_below(&rng, 8) < 5 ? 0 : fl_rng_below(&rng, 3));
    else
        fill(x, n * in, -1, 1);
    fill(dy, n * out, -1, 1);
    R->pool_forward(FL_DTYPE_F32, FL_LAYOUT_NCHW, pool, n, &g, x, y_ref);
    R->pool_backward(FL_DTYPE_F32, FL_LAYOUT_NCHW, pool, n, &g, x, dy, dx_ref);
    bool max = pool == FL_POOL_MAX;
    int opf = max ? OP_POOL_MAX_FWD : OP_POOL_AVG_FWD;
    int opb = max ? OP_POOL_MAX_BWD : OP_POOL_AVG_BWD;
    double tol = max ? 0 : TOL_POOL_AVG;
    float *xl = fbuf(n * in), *dyl = fbuf(n * out), *t = fbuf(n * in + n * out);
    float *y[NRUNS], *dx[NRUNS];
    char name[300];
    snprintf(name, sizeof name, "%s pool %s", max ? "max" : "avg", pc->name);
    for (int r = 0; r < NRUNS; r++)
        y[r] = fbuf(n * out), dx[r] = fbuf(n * in);
    for (int li = 0; li < 2; li++) {
        fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
        cur_layout = l;
        to_layout(l, n, pc->c, pc->h * pc->w, x, xl);
        to_layout(l, n, pc->c, g.oh * g.ow, dy, dyl);
        for (int r = 0; r < NRUNS; r++) {
            fl_kernels_set_threads(THREADS[r]);
            O->pool_forward(FL_DTYPE_F32, l, pool, n, &g, xl, y[r]);
            O->pool_backward(FL_DTYPE_F32, l, pool, n, &g, xl, dyl, dx[r]);
        }
        fl_kernels_set_threads(2);
        for (int r = 0; r < 2; r++) {
            char what[600];
            snprintf(what, sizeof what, "%s pool %s %s %d thread(s): forward", max ? "max" : "avg",
                     pc->name, fl_layout_name(l), THREADS[r]);
            from_layout(l, n, pc->c, g.oh * g.ow, y[r], t);
            check_rel(opf, what, t, y_ref, n * out, tol);
            snprintf(what, sizeof what, "%s pool %s %s %d thread(s): backward", max ? "max" : "avg",
                     pc->name, fl_layout_name(l), THREADS[r]);
            from_layout(l, n, pc->c, pc->h * pc->w, dx[r], t);
            check_rel(opb, what, t, dx_ref, n * in, tol);
        }
        note_runs(opf, l, name, y, n * out);
        note_runs(opb, l, name, dx, n * in);
    }
    for (int r = 0; r < NRUNS; r++)
        free(y[r]), free(dx[r]);
    free(x), free(dy), free(y_ref), free(dx_ref), free(xl), free(dyl), free(t);
}

static void test_pool(void) {
    for (size_t i = 0; i < N_POOL_CASES; i++) {
        check_pool(&pool_cases[i], FL_POOL_MAX);
        check_pool(&pool_cases[i], FL_POOL_AVG);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* batch norm */


/* copies of the double statistics into float, to compare with check_rel */
static void to_f32(const double *a, float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        b[i] = (float)a[i];
}

static void check_bn(const bn_case *bc) {
    int64_t n = bc->n, c = bc->c, hw = bc->hw, nx = n * c * hw;
    const double eps = 1e-5;
    size_t fb = (size_t)nx * sizeof(float), cb = (size_t)c * sizeof(float);
    size_t db = (size_t)c * sizeof(double);
    float *x = fbuf(nx), *gamma = fbuf(c), *beta = fbuf(c), *dy = fbuf(nx);
    float *dg0 = fbuf(c), *db0 = fbuf(c);
    double *rmean = malloc(db), *rvar = malloc(db), *mean_ref = malloc(db), *var_ref = malloc(db);
    double *m = malloc(db), *v = malloc(db);
    FL_ASSERT(rmean && rvar && mean_ref && var_ref && m && v);
    /* per channel offset and scale, so the statistics are not all 0 and 1 */
    for (int64_t ch = 0; ch < c; ch++) {
        double off = 4 * fl_rng_uniform_f64(&rng) - 2, sc = 0.2 + 2 * fl_rng_uniform_f64(&rng);
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < hw; i++)
                x[(b * c + ch) * hw + i] = (float)(off + sc * (2 * fl_rng_uniform_f64(&rng) - 1));
        rmean[ch] = off + 0.1 * (fl_rng_uniform_f64(&rng) - 0.5);
        rvar[ch] = sc * sc / 3 * (0.5 + fl_rng_uniform_f64(&rng));
    }
    fill(gamma, c, 0.5, 1.5);
    fill(beta, c, -0.5, 0.5);
    fill(dy, nx, -1, 1);
    fill(dg0, c, -1, 1);
    fill(db0, c, -1, 1);

    float *xl = fbuf(nx), *dyl = fbuf(nx), *ryl = fbuf(nx), *t = fbuf(nx);
    float *y_ref = fbuf(nx), *yr_ref = fbuf(nx), *dx_ref = fbuf(nx), *dg_ref = fbuf(c);
    float *db_ref = fbuf(c), *dga_ref = fbuf(c), *dba_ref = fbuf(c), *dga = fbuf(c);
    float *dba = fbuf(c), *ms[2] = {fbuf(c), fbuf(c)}, *vs[2] = {fbuf(c), fbuf(c)};
    float *y[NRUNS], *dx[NRUNS], *dg[NRUNS], *dbt[NRUNS];
    double *st[NRUNS]; /* each run's mean and var (training) */
    const void *stp[NRUNS];
    for (int r = 0; r < NRUNS; r++) {
        y[r] = fbuf(nx), dx[r] = fbuf(nx), dg[r] = fbuf(c), dbt[r] = fbuf(c);
        stp[r] = st[r] = malloc(2 * db);
        FL_ASSERT(st[r]);
    }
    char pre[160], what[300];

    for (int training = 1; training >= 0; training--) {
        for (int ai = 0; ai < 3; ai++) {
            /* the fused activation: none, relu, hardswish */
            fl_act act = ai == 0 ? FL_ACT_NONE : ai == 1 ? FL_ACT_RELU : FL_ACT_HARDSWISH;
            /* the reference: forward (its output is the backward's y), backward */
            double *sm = training ? mean_ref : rmean, *sv = training ? var_ref : rvar;
            R->bn_forward(FL_DTYPE_F32, FL_LAYOUT_NCHW, n, c, hw, x, gamma, beta, eps, training,
                          sm, sv, act, y_ref);
            memcpy(yr_ref, y_ref, fb);
            R->bn_backward(FL_DTYPE_F32, FL_LAYOUT_NCHW, n, c, hw, x, act, yr_ref, dy, gamma,
                           beta, sm, sv, eps, training, dx_ref, dg_ref, db_ref, false);
            for (int64_t i = 0; i < c; i++) {
                dga_ref[i] = (float)((double)dg0[i] + dg_ref[i]);
                dba_ref[i] = (float)((double)db0[i] + db_ref[i]);
            }
            int opf = training ? OP_BN_FWD_TRAIN : OP_BN_FWD_INFER;
            int opb = training ? OP_BN_BWD_TRAIN : OP_BN_BWD_INFER;
            for (int li = 0; li < 2; li++) {
                fl_layout l = li ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
                cur_layout = l;
                snprintf(pre, sizeof pre, "bn (%lld, %lld, %lld) %s %s%s", (long long)n,
                         (long long)c, (long long)hw, fl_layout_name(l),
                         training ? "training" : "inference",
                         act == FL_ACT_NONE ? "" : act == FL_ACT_RELU ? " relu" : " hardswish");
                to_layout(l, n, c, hw, x, xl);
                to_layout(l, n, c, hw, dy, dyl);
                to_layout(l, n, c, hw, yr_ref, ryl);
                /* forward: y, and in training the batch's mean and biased variance */
                for (int r = 0; r < NRUNS; r++) {
                    fl_kernels_set_threads(THREADS[r]);
                    memcpy(m, rmean, db);
                    memcpy(v, rvar, db);
                    O->bn_forward(FL_DTYPE_F32, l, n, c, hw, xl, gamma, beta, eps, training, m, v,
                                  act, y[r]);
                    memcpy(st[r], m, db);
                    memcpy(st[r] + c, v, db);
                    if (r < 2 && training) {
                        to_f32(mean_ref, ms[0], c), to_f32(m, ms[1], c);
                        to_f32(var_ref, vs[0], c), to_f32(v, vs[1], c);
                        snprintf(what, sizeof what, "%s %d thread(s): mean", pre, THREADS[r]);
                        check_rel(opf, what, ms[1], ms[0], c, TOL_BN_FWD);
                        snprintf(what, sizeof what, "%s %d thread(s): var", pre, THREADS[r]);
                        check_rel(opf, what, vs[1], vs[0], c, TOL_BN_FWD);
                    }
                }
                fl_kernels_set_threads(2);
                for (int r = 0; r < 2; r++) {
                    snprintf(what, sizeof what, "%s %d thread(s): y", pre, THREADS[r]);
                    from_layout(l, n, c, hw, y[r], t);
                    check_rel(opf, what, t, y_ref, nx, TOL_BN_FWD);
                }
                note_runs(opf, l, pre, y, nx);
                if (training)
                    note_bytes(opf, l, pre, stp, 2 * db);
                /* y may alias x */
                memcpy(t, xl, fb);
                O->bn_forward(FL_DTYPE_F32, l, n, c, hw, t, gamma, beta, eps, training, m, v, act,
                              t);
                CHECK(!memcmp(t, y[NRUNS - 1], fb));
                /* backward, with the statistics the ref's forward used */
                for (int r = 0; r < NRUNS; r++) {
                    fl_kernels_set_threads(THREADS[r]);
                    O->bn_backward(FL_DTYPE_F32, l, n, c, hw, xl, act, ryl, dyl, gamma, beta,
                                   sm, sv, eps, training, dx[r], dg[r], dbt[r], false);
                }
                fl_kernels_set_threads(2);
                for (int r = 0; r < 2; r++) {
                    snprintf(what, sizeof what, "%s %d thread(s): dx", pre, THREADS[r]);
                    from_layout(l, n, c, hw, dx[r], t);
                    check_rel(opb, what, t, dx_ref, nx, TOL_BN_BWD);
                    snprintf(what, sizeof what, "%s %d thread(s): dgamma", pre, THREADS[r]);
                    check_rel(opb, what, dg[r], dg_ref, c, TOL_BN_BWD);
                    snprintf(what, sizeof what, "%s %d thread(s): dbeta", pre, THREADS[r]);
                    check_rel(opb, what, dbt[r], db_ref, c, TOL_BN_BWD);
                }
                note_runs(opb, l, pre, dx, nx);
                note_runs(opb, l, pre, dg, c);
                note_runs(opb, l, pre, dbt, c);
                /* accumulating, with dx and without (dgamma, dbeta only) */
                for (int with_dx = 0; with_dx < 2; with_dx++) {
                    memcpy(dga, dg0, cb);
                    memcpy(dba, db0, cb);
                    O->bn_backward(FL_DTYPE_F32, l, n, c, hw, xl, act, ryl, dyl, gamma, beta,
                                   sm, sv, eps, training, with_dx ? t : NULL, dga, dba, true);
                    snprintf(what, sizeof what, "%s%s: dgamma accumulated", pre,
                             with_dx ? "" : " no dx");
                    check_rel(opb, what, dga, dga_ref, c, TOL_BN_BWD);
                    snprintf(what, sizeof what, "%s%s: dbeta accumulated", pre,
                             with_dx ? "" : " no dx");
                    check_rel(opb, what, dba, dba_ref, c, TOL_BN_BWD);
                }
            }
        }
    }
    for (int r = 0; r < NRUNS; r++)
        free(y[r]), free(dx[r]), free(dg[r]), free(dbt[r]), free(st[r]);
    free(x), free(gamma), free(beta), free(dy), free(dg0), free(db0), free(rmean), free(rvar);
    free(mean_ref), free(var_ref), free(m), free(v), free(xl), free(dyl), free(ryl), free(t);
    free(y_ref), free(yr_ref), free(dx_ref), free(dg_ref), free(db_ref), free(dga_ref);
    free(dba_ref), free(dga), free(dba), free(ms[0]), free(ms[1]), free(vs[0]), free(vs[1]);
}

/* largest |a - b| / (1 + max |b|) over n */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / (1 + m);
}

/* A batch norm with the hardswish fused gives the bits of a batch norm followed by the
 * hardswish activation (forward y; backward dx, dgamma, dbeta through act_backward's dz) on
 * this table (both layouts), in training and inference; on the ref table (NCHW: the cpu
 * table's batch norm) within 1e-6, since its activations compute in double and round once. */
static void test_bn_hardswish_fused(void) {
    const int64_t n = 3, c = 19, hw = 37, nx = n * c * hw;
    const double eps = 1e-5;
    size_t fb = (size_t)nx * sizeof(float), cb = (size_t)c * sizeof(float);
    float *x = fbuf(nx), *dy = fbuf(nx), *gamma = fbuf(c), *beta = fbuf(c);
    fill(x, nx, -3, 5);
    fill(dy, nx, -1, 1);
    fill(gamma, c, 0.5, 3); /* wide enough that z reaches both sides of -3 and 3 */
    fill(beta, c, -2, 2);
    float *z = fbuf(nx), *y[2] = {fbuf(nx), fbuf(nx)}, *dz = fbuf(nx), *dx[2] = {fbuf(nx), fbuf(nx)};
    float *dg[2] = {fbuf(c), fbuf(c)}, *dbt[2] = {fbuf(c), fbuf(c)};
    double mean[2][64], var[2][64];
    for (int training = 1; training >= 0; training--)
        for (int ti = 0; ti < 3; ti++) {
            const fl_backend *k = ti == 0 ? R : O;
            fl_layout l = ti == 2 ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            for (int64_t i = 0; i < c; i++)
                mean[0][i] = mean[1][i] = 0.3 * (double)i - 1, var[0][i] = var[1][i] = 0.5 + i;
            /* unfused: bn, hardswish; fused: one call */
            k->bn_forward(FL_DTYPE_F32, l, n, c, hw, x, gamma, beta, eps, training, mean[0],
                          var[0], FL_ACT_NONE, z);
            k->act_forward(FL_DTYPE_F32, FL_ACT_HARDSWISH, z, y[0], nx);
            k->act_backward(FL_DTYPE_F32, FL_ACT_HARDSWISH, z, y[0], dy, dz, nx);
            k->bn_backward(FL_DTYPE_F32, l, n, c, hw, x, FL_ACT_NONE, NULL, dz, gamma, beta,
                           mean[0], var[0], eps, training, dx[0], dg[0], dbt[0], false);
            k->bn_forward(FL_DTYPE_F32, l, n, c, hw, x, gamma, beta, eps, training, mean[1],
                          var[1], FL_ACT_HARDSWISH, y[1]);
            k->bn_backward(FL_DTYPE_F32, l, n, c, hw, x, FL_ACT_HARDSWISH, y[1], dy, gamma, beta,
                           mean[1], var[1], eps, training, dx[1], dg[1], dbt[1], false);
            bool same = !memcmp(y[0], y[1], fb) && !memcmp(dx[0], dx[1], fb) &&
                        !memcmp(dg[0], dg[1], cb) && !memcmp(dbt[0], dbt[1], cb);
            if (ti == 0) /* ref: close */
                same = rel_diff(y[1], y[0], nx) <= 1e-6 && rel_diff(dx[1], dx[0], nx) <= 1e-6 &&
                       rel_diff(dg[1], dg[0], c) <= 1e-6 && rel_diff(dbt[1], dbt[0], c) <= 1e-6;
            int64_t below = 0, above = 0;
            for (int64_t i = 0; i < nx; i++)
                below += z[i] < -3, above += z[i] > 3;
            if (!same || below == 0 || above == 0) {
                fprintf(stderr, "bn + hardswish fused, %s %s %s: %s (z below -3 %lld, above 3 "
                        "%lld times)\n", ti ? "onednn" : "ref", fl_layout_name(l),
                        training ? "training" : "inference",
                        same ? "z does not reach both kinks"
                        : memcmp(y[0], y[1], fb) ? "y not the unfused bits"
                        : memcmp(dx[0], dx[1], fb) ? "dx not the unfused bits"
                                                   : "dgamma or dbeta not the unfused bits",
                        (long long)below, (long long)above);
                test_failures++;
            }
        }
    free(x), free(dy), free(gamma), free(beta), free(z), free(dz);
    for (int i = 0; i < 2; i++)
        free(y[i]), free(dx[i]), free(dg[i]), free(dbt[i]);
}

static void test_bn(void) {
    for (size_t i = 0; i < N_BN_CASES; i++)
        check_bn(&bn_cases[i]);
    test_bn_hardswish_fused();
}

/* ------------------------------------------------------------------------------------------ */
/* f64 runs on the cpu table: NCHW, within 1e-12 of the ref */

static void check_close_f64(const char *what, const double *got, const double *want, int64_t n) {
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    CHECK_CLOSE(what, got, want, n, 1e-12 * (1 + mx), 0);
}

static double *dbuf(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    FL_ASSERT(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = 2 * fl_rng_uniform_f64(&rng) - 1;
    return p;
}

static void test_f64(void) {
    fl_conv_desc d = {.dtype = FL_DTYPE_F64, .layout = FL_LAYOUT_NCHW, .max_batch = 3, .oc = 6,
                      .groups = 2, .bias = true,
                      .g = {.c = 4, .h = 9, .w = 8, .kh = 3, .kw = 3, .sh = 2, .sw = 1, .ph = 1,
                            .pw = 1, .dh = 1, .dw = 2}};
    CHECK(fl_conv_geom_out(&d.g));
    int64_t n = 2, in = 4 * 9 * 8, out = 6 * d.g.oh * d.g.ow, nw = 6 * 2 * 9;
    double *x = dbuf(n * in), *w = dbuf(nw), *b = dbuf(6), *dy = dbuf(n * out);
    double *y[2], *dx[2], *dw[2], *db[2];
    fl_conv_plan *p[2] = {R->conv_plan_create(&d), O->conv_plan_create(&d)};
    CHECK(p[0] && p[1]);
    if (!p[0] || !p[1])
        return;
    for (int k = 0; k < 2; k++) {
        const fl_backend *be = k ? O : R;
        void *s = be->alloc(be->conv_scratch_bytes(p[k]));
        y[k] = dbuf(n * out), dx[k] = dbuf(n * in), dw[k] = dbuf(nw), db[k] = dbuf(6);
        be->conv_forward(p[k], n, x, w, b, y[k], s);
        be->conv_backward_data(p[k], n, dy, w, dx[k], s);
        be->conv_backward_filter(p[k], n, x, dy, dw[k], db[k], false, s);
        be->free(s);
        be->conv_plan_free(p[k]);
    }
    check_close_f64("f64 conv forward", y[1], y[0], n * out);
    check_close_f64("f64 conv backward data", dx[1], dx[0], n * in);
    check_close_f64("f64 conv dw", dw[1], dw[0], nw);
    check_close_f64("f64 conv dbias", db[1], db[0], 6);

    /* pooling and batch norm on (2, 4, 9, 8) -> d.g's pooled geometry */
    fl_conv_geom g = d.g;
    g.dw = 1;
    CHECK(fl_conv_geom_out(&g));
    int64_t po = 4 * g.oh * g.ow;
    double *pdy = dbuf(n * po), *bdy = dbuf(n * in);
    for (int pool = 0; pool < 2; pool++) {
        double *py[2], *pdx[2];
        for (int k = 0; k < 2; k++) {
            const fl_backend *be = k ? O : R;
            py[k] = dbuf(n * po), pdx[k] = dbuf(n * in);
            be->pool_forward(FL_DTYPE_F64, FL_LAYOUT_NCHW, pool, n, &g, x, py[k]);
            be->pool_backward(FL_DTYPE_F64, FL_LAYOUT_NCHW, pool, n, &g, x, pdy, pdx[k]);
        }
        check_close_f64(pool ? "f64 avg pool forward" : "f64 max pool forward", py[1], py[0],
                        n * po);
        check_close_f64(pool ? "f64 avg pool backward" : "f64 max pool backward", pdx[1], pdx[0],
                        n * in);
        for (int k = 0; k < 2; k++)
            free(py[k]), free(pdx[k]);
    }
    double *gam = dbuf(4), *bet = dbuf(4), *by[2], *bm[2], *bv[2], *bdx[2], *bdg[2], *bdb[2];
    for (int k = 0; k < 2; k++) {
        const fl_backend *be = k ? O : R;
        by[k] = dbuf(n * in), bm[k] = dbuf(4), bv[k] = dbuf(4), bdx[k] = dbuf(n * in);
        bdg[k] = dbuf(4), bdb[k] = dbuf(4);
        be->bn_forward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, 4, 72, x, gam, bet, 1e-5, true, bm[k],
                       bv[k], FL_ACT_RELU, by[k]);
        be->bn_backward(FL_DTYPE_F64, FL_LAYOUT_NCHW, n, 4, 72, x, FL_ACT_RELU, by[k], bdy, gam,
                        bet, bm[k], bv[k], 1e-5, true, bdx[k], bdg[k], bdb[k], false);
    }
    check_close_f64("f64 bn forward", by[1], by[0], n * in);
    check_close_f64("f64 bn mean", bm[1], bm[0], 4);
    check_close_f64("f64 bn var", bv[1], bv[0], 4);
    check_close_f64("f64 bn dx", bdx[1], bdx[0], n * in);
    check_close_f64("f64 bn dgamma", bdg[1], bdg[0], 4);
    check_close_f64("f64 bn dbeta", bdb[1], bdb[0], 4);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dx[k]), free(dw[k]), free(db[k]), free(by[k]), free(bm[k]), free(bv[k]),
            free(bdx[k]), free(bdg[k]), free(bdb[k]);
    free(x), free(w), free(b), free(dy), free(gam), free(bet), free(pdy), free(bdy);
}

/* ------------------------------------------------------------------------------------------ */

static void test_table(void) {
    CHECK(!strcmp(O->name, "onednn"));
    CHECK(O->preferred_layout(FL_DTYPE_F32) == FL_LAYOUT_NHWC);
    CHECK(O->preferred_layout(FL_DTYPE_F64) == FL_LAYOUT_NCHW);
    CHECK(O->gemm == fl_backend_cpu()->gemm); /* the rest is the cpu table's */
    CHECK(fl_backend_by_name("onednn") == O);
    /* the reorder, both ways, against the hand-written one */
    int64_t n = 2, c = 5, hw = 37;
    float *a = fbuf(n * c * hw), *b = fbuf(n * c * hw), *e = fbuf(n * c * hw);
    float *back = fbuf(n * c * hw);
    fill(a, n * c * hw, -1, 1);
    O->reorder(FL_DTYPE_F32, true, n, c, hw, a, b);
    to_layout(FL_LAYOUT_NHWC, n, c, hw, a, e);
    CHECK(!memcmp(b, e, (size_t)(n * c * hw) * sizeof(float)));
    O->reorder(FL_DTYPE_F32, false, n, c, hw, b, back);
    CHECK(!memcmp(a, back, (size_t)(n * c * hw) * sizeof(float)));
    free(a), free(b), free(e), free(back);
    /* bad descriptors fail with a message, not an abort */
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NHWC, .max_batch = 2, .oc = 5,
                      .groups = 2, .g = {.c = 4, .h = 5, .w = 5, .kh = 3, .kw = 3, .sh = 1,
                                         .sw = 1, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(O->conv_plan_create(&d) == NULL); /* 5 output channels in 2 groups */
    CHECK_MSG("groups");
    d.oc = 6, d.dtype = FL_DTYPE_F64;
    CHECK(O->conv_plan_create(&d) == NULL); /* f64 channels-last */
    CHECK_MSG("NCHW");
}

int main(void) {
    O = fl_backend_onednn();
    if (!O)
        TEST_SKIP("fleet was built without oneDNN (fl_backend_onednn() is NULL)");
    R = fl_backend_ref();
    fl_rng_init(&rng, 20240611, 0);
    test_table();
    test_conv();
    test_pool();
    test_bn();
    test_f64();
    fl_kernels_set_threads(0);
    /* worst error against the ref per layout, the largest tolerance applied, and whether the
     * bits were the same with 1, 2, 3 and 4 threads (each difference failed above) */
    fprintf(stderr, "%-22s %-11s %-11s %-9s %-14s %s\n", "op", "worst NCHW", "worst NHWC",
            "tolerance", "NCHW 1-4 thr", "NHWC 1-4 threads");
    for (int op = 0; op < OP_COUNT; op++) {
        char v[2][32];
        for (int l = 0; l < 2; l++) {
            if (run_dep[op][l])
                snprintf(v[l], sizeof v[l], "runs differ");
            else if (thread_dep[op][l])
                snprintf(v[l], sizeof v[l], "differ at %d", thread_dep[op][l]);
            else
                snprintf(v[l], sizeof v[l], "identical");
        }
        fprintf(stderr, "%-22s %-11.2g %-11.2g %-9.2g %-14s %s\n", op_name[op], worst[op][0],
                worst[op][1], worst_tol[op], v[0], v[1]);
    }
    TEST_DONE();
}
