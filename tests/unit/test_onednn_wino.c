/* test_onednn_wino.c - the onednn backend's Winograd F(4x4, 3x3) convolutions (onednn_wino.c)
 * against a direct sum in double: forward (with and without bias) and backward data over
 * shapes with partial edge tiles, 1x1 and 2x2 images, paddings 0..2, channel counts that are
 * not multiples of 8, 1 and 3 images; the same bits at 1-4 threads; and shapes outside its set
 * (stride 2, dilation, groups) still on oneDNN, bit for bit what the switch's off gives. */
#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#ifndef FL_USE_ONEDNN
/* built without oneDNN (FLEET_ONEDNN=OFF, as scripts/gpu-check.sh builds): the backend's private
 * header needs <oneapi/dnnl/dnnl.h>, so there is nothing to compile against */
int main(void) {
    TEST_SKIP("fleet was built without oneDNN");
}
#else
#include "kernels/onednn/onednn_impl.h"

#include <stdint.h>
#include <stdlib.h>

/* Tolerance: max |got - want| <= TOL * S, S = the largest over outputs of the direct sum of
 * |products| (sum |x| |w| over the window and channels). F(4x4, 3x3)'s rounding error is
 * that of the direct sum (a few eps per term) amplified by the transforms: B^T's rows have
 * absolute sums up to 10, A^T's up to 19, G's 1/2, applied in two dimensions each, so the worst
 * case is about (10 * 19 / 2)^2 ~ 9e3 eps (eps = 6e-8: 5e-4 S) and random roundings give
 * its square root's order, ~1e-5 S (the error's growth with the tile size and points:
 * Barabasz et al. 2020, arXiv:1803.10986). The weight gradient, F(3x3, 4x4), has the same
 * matrices. Measured here at most 1.6e-6 S; a wrong transform gives errors of order S. */
#define TOL 3e-5

static const fl_backend *O;
static fl_rng rng;

typedef struct wcase {
    const char *name;
    int64_t n, c, h, w, oc, ph, pw;
    bool bias;
} wcase;

static void fill(float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        a[i] = (float)(2 * fl_rng_uniform(&rng) - 1);
}

/* y (N, OH, OW, OC) and its scale S; dx (N, H, W, C) and its scale; dw (OC, C, 3, 3), db
 * (OC) and their scale; in double */
static void direct(const wcase *k, const fl_conv_geom *g, const float *x, const float *w,
                   const float *b, const float *dy, double *y, double *dx, double *sy,
                   double *sdx, double *dw, double *db, double *sdw) {
    int64_t nw = k->oc * k->c * 9;
    double *adw = calloc((size_t)nw, sizeof(double));
    for (int64_t i = 0; i < nw; i++)
        dw[i] = 0;
    for (int64_t o = 0; o < k->oc; o++)
        db[o] = 0;
    int64_t C = k->c, OC = k->oc;
    *sy = *sdx = 0;
    for (int64_t i = 0; i < k->n * g->oh * g->ow * OC; i++)
        y[i] = 0;
    for (int64_t i = 0; i < k->n * k->h * k->w * C; i++)
        dx[i] = 0;
    double *ay = calloc((size_t)(k->n * g->oh * g->ow * OC), sizeof(double));
    double *adx = calloc((size_t)(k->n * k->h * k->w * C), sizeof(double));
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++)
                for (int64_t o = 0; o < OC; o++) {
                    int64_t yi = ((n * g->oh + oy) * g->ow + ox) * OC + o;
                    for (int64_t i = 0; i < 3; i++)
                        for (int64_t j = 0; j < 3; j++) {
                            int64_t iy = oy + i - k->ph, ix = ox + j - k->pw;
                            if (iy < 0 || iy >= k->h || ix < 0 || ix >= k->w)
                                continue;
                            int64_t xi = ((n * k->h + iy) * k->w + ix) * C;
                            for (int64_t c = 0; c < C; c++) {
                                double wv = w[((o * C + c) * 3 + i) * 3 + j];
                                y[yi] += x[xi + c] * wv;
                                ay[yi] += fabs(x[xi + c] * wv);
                                dx[xi + c] += dy[yi] * wv;
                                adx[xi + c] += fabs(dy[yi] * wv);
                                dw[((o * C + c) * 3 + i) * 3 + j] += (double)dy[yi] * x[xi + c];
                                adw[((o * C + c) * 3 + i) * 3 + j] += fabs(dy[yi] * x[xi + c]);
                            }
                        }
                    if (b)
                        y[yi] += b[o], ay[yi] += fabs(b[o]);
                    db[o] += dy[yi];
                }
    *sdw = 0;
    for (int64_t i = 0; i < nw; i++)
        *sdw = fmax(*sdw, adw[i]);
    free(adw);
    for (int64_t i = 0; i < k->n * g->oh * g->ow * OC; i++)
        *sy = fmax(*sy, ay[i]);
    for (int64_t i = 0; i < k->n * k->h * k->w * C; i++)
        *sdx = fmax(*sdx, adx[i]);
    free(ay);
    free(adx);
}

/* max |got - want| / scale, printing it */
static double rel_err(const char *what, const float *got, const double *want, int64_t n,
                      double scale) {
    double md = 0;
    for (int64_t i = 0; i < n; i++)
        md = fmax(md, fabs(got[i] - want[i]));
    if (isnan(md) || !(md <= TOL * scale))
        fprintf(stderr, "%s: max |diff| %.3g > %.3g * %.3g\n", what, md, TOL, scale);
    return md / scale;
}

static double worst_fwd, worst_bwd, worst_w;

static void check_case(const wcase *k) {
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NHWC, .max_batch = k->n,
                      .oc = k->oc, .groups = 1, .bias = k->bias,
                      .g = {.c = k->c, .h = k->h, .w = k->w, .kh = 3, .kw = 3, .sh = 1,
                            .sw = 1, .ph = k->ph, .pw = k->pw, .dh = 1, .dw = 1}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(onednn_wino_supported(&d));
    const fl_conv_geom *g = &d.g;
    int64_t nx = k->n * k->h * k->w * k->c, ny = k->n * g->oh * g->ow * k->oc;
    int64_t nw = k->oc * k->c * 9;
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw);
    float *b = malloc(sizeof(float) * (size_t)k->oc), *dy = malloc(sizeof(float) * (size_t)ny);
    fill(x, nx), fill(w, nw), fill(b, k->oc), fill(dy, ny);
    double *yr = malloc(sizeof(double) * (size_t)ny), *dxr = malloc(sizeof(double) * (size_t)nx);
    double *dwr = malloc(sizeof(double) * (size_t)nw), *dwar = malloc(sizeof(double) * (size_t)nw);
    double *dbr = malloc(sizeof(double) * (size_t)k->oc);
    double *dbar = malloc(sizeof(double) * (size_t)k->oc);
    double sy, sdx, sdw;
    direct(k, g, x, w, k->bias ? b : NULL, dy, yr, dxr, &sy, &sdx, dwr, dbr, &sdw);
    /* accumulated: the gradient added to w's values (and b's) */
    for (int64_t i = 0; i < nw; i++)
        dwar[i] = dwr[i] + w[i];
    for (int64_t o = 0; o < k->oc; o++)
        dbar[o] = dbr[o] + b[o];

    setenv("FLEET_ONEDNN_WINOGRAD", "1", 1);
    fl_conv_plan *p = O->conv_plan_create(&d);
    CHECK(p);
    if (!p) {
        fprintf(stderr, "%s: %s\n", k->name, fl_errmsg());
        return;
    }
    void *s = O->alloc(O->conv_scratch_bytes(p));
    float *y[4], *dx[4], *dw[4], *db[4], *dwa = malloc(sizeof(float) * (size_t)nw);
    float *dba = malloc(sizeof(float) * (size_t)k->oc);
    for (int t = 0; t < 4; t++) {
        y[t] = malloc(sizeof(float) * (size_t)ny), dx[t] = malloc(sizeof(float) * (size_t)nx);
        dw[t] = malloc(sizeof(float) * (size_t)nw), db[t] = malloc(sizeof(float) * (size_t)k->oc);
        fl_kernels_set_threads(t + 1);
        O->conv_forward(p, k->n, x, w, k->bias ? b : NULL, y[t], s);
        O->conv_backward_data(p, k->n, dy, w, dx[t], s);
        O->conv_backward_filter(p, k->n, x, dy, dw[t], k->bias ? db[t] : NULL, false, s);
    }
    memcpy(dwa, w, sizeof(float) * (size_t)nw);
    memcpy(dba, b, sizeof(float) * (size_t)k->oc);
    O->conv_backward_filter(p, k->n, x, dy, dwa, k->bias ? dba : NULL, true, s);
    fl_kernels_set_threads(2);
    char what[200];
    snprintf(what, sizeof what, "%s: forward", k->name);
    double ef = rel_err(what, y[0], yr, ny, sy);
    CHECK(ef <= TOL);
    snprintf(what, sizeof what, "%s: backward data", k->name);
    double eb = rel_err(what, dx[0], dxr, nx, sdx);
    CHECK(eb <= TOL);
    snprintf(what, sizeof what, "%s: weight gradient", k->name);
    double ew = rel_err(what, dw[0], dwr, nw, sdw);
    CHECK(ew <= TOL);
    snprintf(what, sizeof what, "%s: weight gradient accumulated", k->name);
    CHECK(rel_err(what, dwa, dwar, nw, sdw) <= TOL);
    if (k->bias) {
        snprintf(what, sizeof what, "%s: bias gradient", k->name);
        CHECK(rel_err(what, db[0], dbr, k->oc, sdw) <= TOL);
        snprintf(what, sizeof what, "%s: bias gradient accumulated", k->name);
        CHECK(rel_err(what, dba, dbar, k->oc, sdw) <= TOL);
    }
    worst_fwd = fmax(worst_fwd, ef), worst_bwd = fmax(worst_bwd, eb);
    worst_w = fmax(worst_w, ew);
    for (int t = 1; t < 4; t++) {
        if (memcmp(y[t], y[0], sizeof(float) * (size_t)ny) ||
            memcmp(dx[t], dx[0], sizeof(float) * (size_t)nx) ||
            memcmp(dw[t], dw[0], sizeof(float) * (size_t)nw) ||
            (k->bias && memcmp(db[t], db[0], sizeof(float) * (size_t)k->oc))) {
            fprintf(stderr, "%s: %d threads' bits differ from 1 thread's\n", k->name, t + 1);
            CHECK(!"the same bits for any thread count");
        }
    }
    /* the plan ran onednn_wino.c: its bits are those of a direct call */
    float *yd = malloc(sizeof(float) * (size_t)ny);
    void *ws = O->alloc(onednn_wino_scratch_bytes(&d));
    onednn_wino_forward(&d, k->n, x, w, k->bias ? b : NULL, yd, ws);
    CHECK(memcmp(yd, y[0], sizeof(float) * (size_t)ny) == 0);
    O->free(ws);
    free(yd);
    fprintf(stderr, "%-34s forward %.2g  backward data %.2g  weights %.2g (of S)\n", k->name,
            ef, eb, ew);
    for (int t = 0; t < 4; t++)
        free(y[t]), free(dx[t]), free(dw[t]), free(db[t]);
    free(dwa), free(dba), free(dwr), free(dwar), free(dbr), free(dbar);
    O->free(s);
    O->conv_plan_free(p);
    free(x), free(w), free(b), free(dy), free(yr), free(dxr);
}

/* A shape outside Winograd's set runs oneDNN's kernel whatever the switch says. */
static void check_outside(const char *name, int64_t sh, int64_t dl, int64_t groups) {
    fl_conv_desc d = {.dtype = FL_DTYPE_F32, .layout = FL_LAYOUT_NHWC, .max_batch = 2,
                      .oc = 16, .groups = groups, .bias = false,
                      .g = {.c = 16, .h = 11, .w = 10, .kh = 3, .kw = 3, .sh = sh, .sw = sh,
                            .ph = dl, .pw = dl, .dh = dl, .dw = dl}};
    CHECK(fl_conv_geom_out(&d.g));
    CHECK(!onednn_wino_supported(&d));
    int64_t nx = 2 * 16 * 11 * 10, ny = 2 * 16 * d.g.oh * d.g.ow, nw = 16 * 16 / groups * 9;
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw);
    float *y[2], *dx[2];
    fill(x, nx), fill(w, nw);
    for (int on = 0; on < 2; on++) {
        setenv("FLEET_ONEDNN_WINOGRAD", on ? "1" : "0", 1);
        fl_conv_plan *p = O->conv_plan_create(&d);
        CHECK(p);
        if (!p)
            return;
        void *s = O->alloc(O->conv_scratch_bytes(p));
        y[on] = malloc(sizeof(float) * (size_t)ny), dx[on] = malloc(sizeof(float) * (size_t)nx);
        O->conv_forward(p, 2, x, w, NULL, y[on], s);
        O->conv_backward_data(p, 2, y[on], w, dx[on], s);
        O->free(s);
        O->conv_plan_free(p);
    }
    if (memcmp(y[0], y[1], sizeof(float) * (size_t)ny) ||
        memcmp(dx[0], dx[1], sizeof(float) * (size_t)nx)) {
        fprintf(stderr, "%s: the switch changed a shape Winograd does not run\n", name);
        CHECK(!"outside shapes stay on oneDNN");
    }
    for (int on = 0; on < 2; on++)
        free(y[on]), free(dx[on]);
    free(x), free(w);
}

int main(void) {
    O = fl_backend_onednn();
    if (!O)
        TEST_SKIP("fleet was built without oneDNN (fl_backend_onednn() is NULL)");
    fl_rng_init(&rng, 20261128, 0);
    static const wcase cases[] = {
        {"1x1 image p1, 3 -> 17", 1, 3, 1, 1, 17, 1, 1, true},
        {"2x2 image p1, 17 -> 3, 3 images", 3, 17, 2, 2, 3, 1, 1, false},
        {"2x2 image p2, 8 -> 8", 1, 8, 2, 2, 8, 2, 2, true},
        {"9x7 p0, 17 -> 9, 3 images", 3, 17, 9, 7, 9, 0, 0, false},
        {"10x13 p1, 16 -> 24 bias", 3, 16, 10, 13, 24, 1, 1, true},
        {"6x11 p(2,1), 5 -> 16", 1, 5, 6, 11, 16, 2, 1, false},
        {"7x5 p(0,2), 24 -> 7", 3, 24, 7, 5, 7, 0, 2, true},
        {"24x24 p1, 20 -> 16 (2 pieces)", 3, 20, 24, 24, 16, 1, 1, true},
        {"23x21 p1, 40 -> 33 (3 pieces)", 3, 40, 23, 21, 33, 1, 1, false},
        /* ResNet-50's widest 3x3 (layer4: 512 channels at 7x7): the sums over 4608 products */
        {"7x7 p1, 512 -> 512 (ResNet-50's layer4)", 1, 512, 7, 7, 512, 1, 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_case(&cases[i]);
    check_outside("stride 2", 2, 1, 1);
    check_outside("dilation 2", 1, 2, 1);
    check_outside("groups 2", 1, 1, 2);
    unsetenv("FLEET_ONEDNN_WINOGRAD");
    fl_kernels_set_threads(0);
    fprintf(stderr,
            "worst error (of S): forward %.2g, backward data %.2g, weights %.2g; tolerance %.2g\n",
            worst_fwd, worst_bwd, worst_w, TOL);
    TEST_DONE();
}
#endif /* FL_USE_ONEDNN */
