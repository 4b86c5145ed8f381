/* test_nn_concat.c - concatenation along channels as one layer of N inputs (fl_concat_create,
 * fl_net_add_n): the layer alone for N = 1, 2, 3, 7 inputs of different channel counts (and
 * (C) inputs) on every CPU table (cpu, onednn, ref) in NCHW and NHWC: f32 forward and backward
 * bit-identical to ref's and to the index formula, some input gradients left out, f64 input
 * gradients against central finite differences; inside a network (an output read by the
 * concatenation and by another layer, the network input among the inputs): every parameter's
 * and the input's gradient by finite differences in f64 on each table, f32 on cpu and onednn
 * (NHWC) against ref; outputs read several times by one layer get the sum of every gradient
 * (several gradient sums in one layer's backward); recompute gives bit-identical gradients;
 * bf16 mixed precision rounds a white concatenation's inputs and gradients; the refusals
 * (input counts, layers that take one or two inputs, shapes that do not fit) name the layer. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"
#include "model_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-6
#define RTOL 1e-6
#define ATOL 1e-8

static fl_rng rng;

static double uniform(double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform_f64(&rng); }

/* the CPU tables: cpu, ref and onednn where built */
static int cpu_tables(const fl_backend **t) {
    int n = 0;
    t[n++] = fl_backend_cpu();
    t[n++] = fl_backend_ref();
    if (fl_backend_onednn())
        t[n++] = fl_backend_onednn();
    return n;
}

/* --- the layer alone --- */

enum { B = 2, H = 3, W = 2 };

typedef struct {
    const char *what;
    int         n, ndim; /* inputs; 3: (C, H, W), 1: (C) */
    int64_t     c[8];
} cat_case;

static const cat_case cases[] = {
    {"N=1", 1, 3, {3}},
    {"N=2", 2, 3, {2, 5}},
    {"N=3", 3, 3, {1, 4, 2}},
    {"N=7", 7, 3, {3, 1, 2, 5, 1, 4, 2}},
    {"N=3 (C)", 3, 1, {2, 3, 1}},
};

static int64_t pixels(const cat_case *cc) { return cc->ndim == 3 ? H * W : 1; }

static int64_t out_channels(const cat_case *cc) {
    int64_t oc = 0;
    for (int k = 0; k < cc->n; k++)
        oc += cc->c[k];
    return oc;
}

/* A concat layer for case cc, as a network would set it up; NULL when infer_shapen failed. */
static fl_layer *make_layer(const cat_case *cc, const fl_backend *k, fl_dtype t, fl_layout lay) {
    fl_layer *l = fl_concat_create("cat");
    CHECK(l != NULL);
    if (!l)
        return NULL;
    l->dtype = l->adtype = t;
    l->k = k;
    l->layout = lay;
    int nd[FL_NET_MAX_INPUTS], ond = 0;
    int64_t sh[FL_NET_MAX_INPUTS][3], os[FL_MAX_DIMS];
    const int64_t *sp[FL_NET_MAX_INPUTS];
    for (int i = 0; i < cc->n; i++) {
        nd[i] = cc->ndim;
        sh[i][0] = cc->c[i];
        sh[i][1] = H;
        sh[i][2] = W;
        sp[i] = sh[i];
    }
    int rc = l->ops->infer_shapen(l, cc->n, nd, sp, &ond, os);
    CHECK_OK(rc);
    CHECK(ond == cc->ndim && os[0] == out_channels(cc));
    if (cc->ndim == 3)
        CHECK(os[1] == H && os[2] == W);
    if (rc < 0) {
        fl_layer_free(l);
        return NULL;
    }
    return l;
}

/* Tensors of case cc: inputs x[k] (B, c_k, ...), y and dy (B, oc, ...), dx[k], dtype t, in
 * one allocation each (data owned by the caller through bufs). */
typedef struct {
    fl_tensor x[8], dx[8], y, dy;
    void     *bufs[18];
    int       nbufs;
} cat_io;

static void io_init(cat_io *io, const cat_case *cc, fl_dtype t) {
    memset(io, 0, sizeof *io);
    size_t es = fl_dtype_size(t);
    int64_t shape[4] = {B, 0, H, W};
    for (int k = 0; k < cc->n; k++) {
        shape[1] = cc->c[k];
        int64_t n = B * cc->c[k] * pixels(cc);
        void *xd = calloc((size_t)n, es), *dd = calloc((size_t)n, es);
        io->bufs[io->nbufs++] = xd;
        io->bufs[io->nbufs++] = dd;
        fl_tensor_view(&io->x[k], t, cc->ndim + 1, shape, xd);
        fl_tensor_view(&io->dx[k], t, cc->ndim + 1, shape, dd);
        for (int64_t i = 0; i < n; i++) {
            double v = uniform(-1, 1);
            if (t == FL_DTYPE_F32)
                ((float *)xd)[i] = (float)v;
            else
                ((double *)xd)[i] = v;
        }
    }
    shape[1] = out_channels(cc);
    int64_t ny = B * shape[1] * pixels(cc);
    void *yd = calloc((size_t)ny, es), *dyd = calloc((size_t)ny, es);
    io->bufs[io->nbufs++] = yd;
    io->bufs[io->nbufs++] = dyd;
    fl_tensor_view(&io->y, t, cc->ndim + 1, shape, yd);
    fl_tensor_view(&io->dy, t, cc->ndim + 1, shape, dyd);
    for (int64_t i = 0; i < ny; i++) {
        double v = uniform(-1, 1);
        if (t == FL_DTYPE_F32)
            ((float *)dyd)[i] = (float)v;
        else
            ((double *)dyd)[i] = v;
    }
}

static void io_free(cat_io *io) {
    for (int i = 0; i < io->nbufs; i++)
        free(io->bufs[i]);
}

/* Where value (b, channel ch of input k, pixel p) sits in y: the index formula */
static int64_t y_index(const cat_case *cc, fl_layout lay, int k, int64_t b, int64_t ch,
                       int64_t p) {
    int64_t off = 0, oc = out_channels(cc), hw = pixels(cc);
    for (int j = 0; j < k; j++)
        off += cc->c[j];
    return lay == FL_LAYOUT_NCHW ? (b * oc + off + ch) * hw + p : (b * hw + p) * oc + off + ch;
}

static int64_t x_index(const cat_case *cc, fl_layout lay, int k, int64_t b, int64_t ch,
                       int64_t p) {
    int64_t hw = pixels(cc);
    return lay == FL_LAYOUT_NCHW ? (b * cc->c[k] + ch) * hw + p : (b * hw + p) * cc->c[k] + ch;
}

/* f32 on table k in layout lay: forward and backward equal the index formula exactly (what
 * ref gives too: compared below), then again with every other input gradient left out */
static void check_f32(const cat_case *cc, const fl_backend *k, fl_layout lay, float **ref_y,
                      float ***ref_dx) {
    fl_layer *l = make_layer(cc, k, FL_DTYPE_F32, lay);
    if (!l)
        return;
    cat_io io;
    fl_rng_init(&rng, 7, 1); /* the same data on every table */
    io_init(&io, cc, FL_DTYPE_F32);
    const fl_tensor *xs[FL_NET_MAX_INPUTS];
    fl_tensor *dxs[FL_NET_MAX_INPUTS];
    for (int i = 0; i < cc->n; i++) {
        xs[i] = &io.x[i];
        dxs[i] = &io.dx[i];
    }
    CHECK_OK(l->ops->forwardn(l, cc->n, xs, &io.y, true));
    CHECK_OK(l->ops->backwardn(l, cc->n, xs, &io.y, &io.dy, dxs, false));
    const float *y = io.y.data, *dy = io.dy.data;
    int bad_y = 0, bad_dx = 0;
    for (int i = 0; i < cc->n; i++) {
        const float *x = io.x[i].data, *dx = io.dx[i].data;
        for (int64_t b = 0; b < B; b++)
            for (int64_t ch = 0; ch < cc->c[i]; ch++)
                for (int64_t p = 0; p < pixels(cc); p++) {
                    int64_t yi = y_index(cc, lay, i, b, ch, p), xi = x_index(cc, lay, i, b, ch, p);
                    bad_y += y[yi] != x[xi];
                    bad_dx += dx[xi] != dy[yi];
                }
    }
    if (bad_y || bad_dx)
        fprintf(stderr, "concat %s [%s %s]: %d outputs, %d input gradients differ from the "
                "index formula\n", cc->what, k->name, fl_layout_name(lay), bad_y, bad_dx);
    CHECK(bad_y == 0 && bad_dx == 0);
    /* against ref's results (the first table run) */
    if (!*ref_y) {
        *ref_y = malloc((size_t)io.y.numel * sizeof **ref_y);
        memcpy(*ref_y, y, (size_t)io.y.numel * sizeof **ref_y);
        *ref_dx = calloc((size_t)cc->n, sizeof **ref_dx);
        for (int i = 0; i < cc->n; i++) {
            (*ref_dx)[i] = malloc((size_t)io.dx[i].numel * sizeof(float));
            memcpy((*ref_dx)[i], io.dx[i].data, (size_t)io.dx[i].numel * sizeof(float));
        }
    } else {
        CHECK(memcmp(*ref_y, y, (size_t)io.y.numel * sizeof(float)) == 0);
        for (int i = 0; i < cc->n; i++)
            CHECK(memcmp((*ref_dx)[i], io.dx[i].data, (size_t)io.dx[i].numel * sizeof(float)) ==
                  0);
    }
    /* input gradients left out (NULL): the others still right, the left-out buffers untouched */
    for (int i = 0; i < cc->n; i++) {
        float *d = io.dx[i].data;
        for (int64_t j = 0; j < io.dx[i].numel; j++)
            d[j] = -7.0f;
        dxs[i] = i % 2 ? NULL : &io.dx[i];
    }
    CHECK_OK(l->ops->backwardn(l, cc->n, xs, &io.y, &io.dy, dxs, false));
    for (int i = 0; i < cc->n; i++) {
        const float *d = io.dx[i].data;
        if (i % 2) {
            int touched = 0;
            for (int64_t j = 0; j < io.dx[i].numel; j++)
                touched += d[j] != -7.0f;
            CHECK(touched == 0);
        } else {
            CHECK(memcmp((*ref_dx)[i], d, (size_t)io.dx[i].numel * sizeof(float)) == 0);
        }
    }
    io_free(&io);
    fl_layer_free(l);
}

/* L = sum(r * concat(x)) in f64 */
static double loss_f64(fl_layer *l, const cat_case *cc, const fl_tensor *const *xs, cat_io *io) {
    CHECK_OK(l->ops->forwardn(l, cc->n, xs, &io->y, true));
    double s = 0;
    const double *y = io->y.data, *r = io->dy.data;
    for (int64_t i = 0; i < io->y.numel; i++)
        s += r[i] * y[i];
    return s;
}

/* f64 on table k in layout lay: every input's gradient against central differences of L */
static void check_f64(const cat_case *cc, const fl_backend *k, fl_layout lay) {
    fl_layer *l = make_layer(cc, k, FL_DTYPE_F64, lay);
    if (!l)
        return;
    cat_io io;
    io_init(&io, cc, FL_DTYPE_F64);
    const fl_tensor *xs[FL_NET_MAX_INPUTS];
    fl_tensor *dxs[FL_NET_MAX_INPUTS];
    for (int i = 0; i < cc->n; i++) {
        xs[i] = &io.x[i];
        dxs[i] = &io.dx[i];
    }
    loss_f64(l, cc, xs, &io);
    CHECK_OK(l->ops->backwardn(l, cc->n, xs, &io.y, &io.dy, dxs, false));
    for (int i = 0; i < cc->n; i++) {
        int64_t n = io.x[i].numel;
        double *x = io.x[i].data, *num = malloc((size_t)n * sizeof *num);
        for (int64_t j = 0; j < n; j++) {
            double keep = x[j];
            x[j] = keep + EPS;
            double lp = loss_f64(l, cc, xs, &io);
            x[j] = keep - EPS;
            double lm = loss_f64(l, cc, xs, &io);
            x[j] = keep;
            num[j] = (lp - lm) / (2 * EPS);
        }
        char label[160];
        snprintf(label, sizeof label, "concat %s [%s %s] d/dx%d", cc->what, k->name,
                 fl_layout_name(lay), i);
        CHECK_CLOSE(label, io.dx[i].data, num, n, ATOL, RTOL);
        free(num);
    }
    io_free(&io);
    fl_layer_free(l);
}

static void test_layer(void) {
    const fl_backend *t[3];
    int nt = cpu_tables(t);
    /* ref first: the others are compared with its results */
    const fl_backend *order[3] = {fl_backend_ref(), fl_backend_cpu(), NULL};
    if (nt == 3)
        order[2] = fl_backend_onednn();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int lay = 0; lay < 2; lay++) {
            fl_layout layout = lay ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            float *ref_y = NULL, **ref_dx = NULL;
            for (int i = 0; i < nt; i++) {
                check_f32(&cases[c], order[i], layout, &ref_y, &ref_dx);
                check_f64(&cases[c], order[i], layout);
            }
            free(ref_y);
            for (int i = 0; ref_dx && i < cases[c].n; i++)
                free(ref_dx[i]);
            free(ref_dx);
        }
}

/* --- inside a network --- */

enum { NC = 2, NH = 4, NW = 3, NB = 3, NCLASS = 3 };

/* net built for NB images of NC x NH x NW with seed; NULL (and the failure counted) if not */
static fl_net *built(fl_net *net, uint64_t seed) {
    int64_t shape[] = {NC, NH, NW};
    int rc = fl_net_build(net, 3, shape, NB, seed);
    CHECK_OK(rc);
    if (rc < 0) {
        fl_net_free(net);
        return NULL;
    }
    return net;
}
/* x (2, 4, 3) -> a = conv 3x3 (3) -> b = relu(a) -> c = conv 1x1 (2) of b ->
 * concat(x, a, b, c, a) (13 channels: a read by relu and twice by the concatenation) ->
 * conv 1x1 (4) -> flatten -> fc (3) */
static fl_net *branchy_net(fl_dtype t, const fl_backend *k, bool input_grad,
                           const char *recompute) {
    fl_net *net = fl_net_create(t, k);
    CHECK(net != NULL);
    if (!net)
        return NULL;
    fl_conv2d_opts ca = {.in_channels = NC, .out_channels = 3, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1, .bias = true};
    fl_conv2d_opts cc = {.in_channels = 3, .out_channels = 2, .kh = 1, .kw = 1, .bias = true};
    fl_conv2d_opts cd = {.in_channels = 13, .out_channels = 4, .kh = 1, .kw = 1, .bias = true};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("a", &ca)));
    CHECK_OK(fl_net_add(net, fl_activation_create("b", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("c", &cc)));
    int in[] = {FL_NET_INPUT, 0, 1, 2, 0};
    CHECK(fl_net_add_n(net, fl_concat_create("cat"), 5, in) == 3);
    CHECK_OK(fl_net_add(net, fl_conv2d_create("d", &cd)));
    CHECK_OK(fl_net_add(net, fl_flatten_create("flatten")));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 4 * NH * NW, NCLASS, true)));
    CHECK_OK(fl_net_set_input_grad(net, input_grad));
    CHECK_OK(fl_net_set_recompute(net, recompute));
    return built(net, 11);
}

/* f64: every parameter's and the input's gradient against central differences */
static void test_net_gradcheck(const fl_backend *k) {
    fl_net *net = branchy_net(FL_DTYPE_F64, k, true, NULL);
    if (!net)
        return;
    CHECK(fl_net_layout(net) == FL_LAYOUT_NCHW); /* f64 */
    fl_rng_init(&rng, 3, 0);
    double *w = fl_net_flat_params(net);
    int64_t np = fl_net_numel(net);
    for (int64_t i = 0; i < np; i++)
        w[i] = uniform(-0.6, 0.6);
    int64_t xs[] = {NB, NC, NH, NW}, nx = NB * NC * NH * NW;
    double *xd = malloc((size_t)nx * sizeof *xd), r[NB * NCLASS];
    for (int64_t i = 0; i < nx; i++)
        xd[i] = uniform(-2, 2);
    for (int i = 0; i < NB * NCLASS; i++)
        r[i] = uniform(-1, 1);
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F64, 4, xs, xd);
    net_proj(net, &x, r);
    int64_t ys[] = {NB, NCLASS};
    fl_tensor_view(&dy, FL_DTYPE_F64, 2, ys, r);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    double *g = malloc((size_t)np * sizeof *g), *gn = malloc((size_t)np * sizeof *gn);
    double *gx = malloc((size_t)nx * sizeof *gx), *gxn = malloc((size_t)nx * sizeof *gxn);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    memcpy(gx, fl_net_input_grad(net)->data, (size_t)nx * sizeof *gx);
    fd_grads(net, &x, r, w, np, EPS, gn);
    fd_grads(net, &x, r, xd, nx, EPS, gxn);
    char label[96];
    snprintf(label, sizeof label, "concat network [%s] d/dparams", k->name);
    CHECK_CLOSE(label, g, gn, np, 1e-7, 1e-5);
    snprintf(label, sizeof label, "concat network [%s] d/dx", k->name);
    CHECK_CLOSE(label, gx, gxn, nx, 1e-7, 1e-5);
    free(g);
    free(gn);
    free(gx);
    free(gxn);
    free(xd);
    fl_net_free(net);
}

/* One f32 step (forward, backward of L = sum(r * out)) from the build's seeded parameters:
 * the loss and a copy of the gradients (freed by the caller). */
static float *f32_step(fl_net *net, double *loss) {
    fl_rng_init(&rng, 5, 0);
    int64_t xs[] = {NB, NC, NH, NW}, nx = NB * NC * NH * NW;
    float *xd = malloc((size_t)nx * sizeof *xd), r[NB * NCLASS];
    for (int64_t i = 0; i < nx; i++)
        xd[i] = (float)uniform(-2, 2);
    for (int i = 0; i < NB * NCLASS; i++)
        r[i] = (float)uniform(-1, 1);
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F32, 4, xs, xd);
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    *loss = 0;
    for (int64_t i = 0; y && i < y->numel; i++)
        *loss += r[i] * ((const float *)y->data)[i];
    int64_t ys[] = {NB, NCLASS};
    fl_tensor_view(&dy, FL_DTYPE_F32, 2, ys, r);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    int64_t np = fl_net_numel(net);
    float *g = malloc((size_t)np * sizeof *g);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    free(xd);
    return g;
}

/* f32 on cpu and onednn (NHWC) against ref (NCHW); recompute (auto, and a checkpoint named)
 * bit-identical to none on each table */
static void test_net_tables(void) {
    const fl_backend *t[3];
    int nt = cpu_tables(t);
    fl_net *ref = branchy_net(FL_DTYPE_F32, fl_backend_ref(), false, NULL);
    if (!ref)
        return;
    double ref_loss;
    float *ref_g = f32_step(ref, &ref_loss);
    int64_t np = fl_net_numel(ref);
    for (int i = 0; i < nt; i++) {
        fl_net *net = branchy_net(FL_DTYPE_F32, t[i], false, NULL);
        if (!net)
            continue;
        if (t[i] == fl_backend_onednn())
            CHECK(fl_net_layout(net) == FL_LAYOUT_NHWC);
        double loss;
        float *g = f32_step(net, &loss);
        char label[96];
        snprintf(label, sizeof label, "concat network f32 [%s vs ref] grads", t[i]->name);
        CHECK_CLOSE_F32(label, g, ref_g, np, 1e-5, 1e-4);
        CHECK_NEAR(loss, ref_loss, 1e-4 * (1 + fabs(ref_loss)));
        const char *specs[] = {"auto", "b", "cat"};
        for (int s = 0; s < 3; s++) {
            fl_net *rn = branchy_net(FL_DTYPE_F32, t[i], false, specs[s]);
            if (!rn)
                continue;
            double rloss;
            float *rg = f32_step(rn, &rloss);
            if (memcmp(rg, g, (size_t)np * sizeof *g) != 0 || rloss != loss)
                fprintf(stderr, "recompute %s [%s]: gradients differ from those without\n",
                        specs[s], t[i]->name);
            CHECK(memcmp(rg, g, (size_t)np * sizeof *g) == 0 && rloss == loss);
            free(rg);
            fl_net_free(rn);
        }
        free(g);
        fl_net_free(net);
    }
    free(ref_g);
    fl_net_free(ref);
}

/* a = relu(x), b = relu(a), cat = concat(a, b, a, x, b), out = concat(cat, a): with x > 0 every
 * input is x, the output six copies of it, and the input gradient the sum of the output
 * gradient's six slices (a gets four gradients, three of them in one backward, x three) */
static fl_net *twice_net(const fl_backend *k) {
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    CHECK(net != NULL);
    if (!net)
        return NULL;
    CHECK_OK(fl_net_add(net, fl_activation_create("a", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_activation_create("b", FL_ACT_RELU)));
    int in[] = {0, 1, 0, FL_NET_INPUT, 1};
    CHECK(fl_net_add_n(net, fl_concat_create("cat"), 5, in) == 2);
    CHECK(fl_net_add2(net, fl_concat_create("out"), 2, 0) == 3);
    CHECK_OK(fl_net_set_input_grad(net, true));
    return built(net, 1);
}

static void test_read_twice(const fl_backend *k) {
    fl_net *net = twice_net(k);
    if (!net)
        return;
    enum { N = NB * NC * NH * NW, HW = NH * NW };
    double xd[N], r[6 * N], want[N], want_y[6 * N];
    for (int i = 0; i < N; i++)
        xd[i] = uniform(0.1, 2);
    for (int i = 0; i < 6 * N; i++)
        r[i] = uniform(-1, 1);
    int64_t xs[] = {NB, NC, NH, NW}, ys[] = {NB, 6 * NC, NH, NW};
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F64, 4, xs, xd);
    fl_tensor_view(&dy, FL_DTYPE_F64, 4, ys, r);
    for (int b = 0; b < NB; b++)
        for (int c = 0; c < NC; c++)
            for (int p = 0; p < HW; p++) {
                double s = 0;
                for (int j = 0; j < 6; j++) {
                    int yi = (b * 6 * NC + j * NC + c) * HW + p;
                    s += r[yi];
                    want_y[yi] = xd[(b * NC + c) * HW + p];
                }
                want[(b * NC + c) * HW + p] = s;
            }
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK(y && y->numel == 6 * N && memcmp(y->data, want_y, sizeof want_y) == 0);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    char label[96];
    snprintf(label, sizeof label, "inputs read several times [%s] d/dx", k->name);
    CHECK_CLOSE(label, fl_net_input_grad(net)->data, want, N, 1e-12, 1e-12);
    fl_net_free(net);
}

/* bf16 mixed precision with the concatenation white: its inputs are read rounded (the output
 * is bf16 x, six times) and its output and input gradients are rounded; the relus stay f32 */
static void test_amp(const fl_backend *k) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, k);
    if (!net)
        return;
    CHECK_OK(fl_net_add(net, fl_activation_create("a", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_activation_create("b", FL_ACT_RELU)));
    int in[] = {0, 1, 0, FL_NET_INPUT, 1, 0};
    CHECK(fl_net_add_n(net, fl_concat_create("cat"), 6, in) == 2);
    CHECK_OK(fl_net_set_input_grad(net, true));
    int64_t shape[] = {NC, NH, NW};
    CHECK_OK(fl_net_build(net, 3, shape, NB, 1));
    CHECK_OK(fl_net_set_amp(net, FL_DTYPE_BF16, "concat"));
    CHECK(fl_net_amp_white(net, 2) && !fl_net_amp_white(net, 0));
    enum { N = NB * NC * NH * NW, HW = NH * NW };
    float xd[N], xr[N], r[6 * N], rr[6 * N], want[N];
    for (int i = 0; i < N; i++)
        xr[i] = xd[i] = (float)uniform(0.1, 2);
    for (int i = 0; i < 6 * N; i++)
        rr[i] = r[i] = (float)uniform(-1, 1);
    fl_backend_ref()->amp_round(FL_DTYPE_BF16, N, xr);
    fl_backend_ref()->amp_round(FL_DTYPE_BF16, 6 * N, rr);
    int64_t xs[] = {NB, NC, NH, NW}, ys[] = {NB, 6 * NC, NH, NW};
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F32, 4, xs, xd);
    fl_tensor_view(&dy, FL_DTYPE_F32, 4, ys, r);
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    int bad = 0;
    for (int b = 0; b < NB; b++)
        for (int c = 0; c < NC; c++)
            for (int p = 0; p < HW; p++) {
                double s = 0;
                for (int j = 0; j < 6; j++) {
                    int yi = (b * 6 * NC + j * NC + c) * HW + p;
                    bad += y && ((const float *)y->data)[yi] != xr[(b * NC + c) * HW + p];
                    s += rr[yi];
                }
                want[(b * NC + c) * HW + p] = (float)s;
            }
    CHECK(y && bad == 0);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    char label[96];
    snprintf(label, sizeof label, "amp bf16 concat [%s] d/dx", k->name);
    CHECK_CLOSE_F32(label, fl_net_input_grad(net)->data, want, N, 1e-6, 1e-6);
    fl_net_free(net);
}

/* the most inputs a layer takes: FL_NET_MAX_INPUTS copies of the network input */
static void test_max_inputs(void) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    int in[FL_NET_MAX_INPUTS + 1];
    for (int i = 0; i <= FL_NET_MAX_INPUTS; i++)
        in[i] = FL_NET_INPUT;
    CHECK(fl_net_add_n(net, fl_concat_create("cat"), FL_NET_MAX_INPUTS, in) == 0);
    int64_t shape[] = {2}, xs[] = {1, 2};
    CHECK_OK(fl_net_build(net, 1, shape, 1, 1));
    float xd[] = {1.5f, -2.0f};
    fl_tensor x;
    fl_tensor_view(&x, FL_DTYPE_F32, 2, xs, xd);
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK(y && y->numel == 2 * FL_NET_MAX_INPUTS);
    for (int i = 0; y && i < 2 * FL_NET_MAX_INPUTS; i++)
        CHECK(((const float *)y->data)[i] == xd[i % 2]);
    fl_net_free(net);
}

/* refusals name the layer */
static void test_refusals(void) {
    int in[FL_NET_MAX_INPUTS + 1] = {FL_NET_INPUT, FL_NET_INPUT, FL_NET_INPUT};
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_RC(fl_net_add_n(net, fl_concat_create("none"), 0, in), FL_EINVAL);
    CHECK_MSG("none");
    CHECK_RC(fl_net_add_n(net, fl_concat_create("many"), FL_NET_MAX_INPUTS + 1, in), FL_EINVAL);
    CHECK_MSG("many");
    CHECK_RC(fl_net_add_n(net, fl_activation_create("act", FL_ACT_RELU), 2, in), FL_EINVAL);
    CHECK_MSG("act");
    CHECK_MSG("one input");
    CHECK_RC(fl_net_add_n(net, fl_add_create("add3", false), 3, in), FL_EINVAL);
    CHECK_MSG("add3");
    CHECK_MSG("two inputs");
    CHECK_RC(fl_net_add(net, fl_add_create("add1", false)), FL_EINVAL);
    CHECK_MSG("add1");
    int later[] = {FL_NET_INPUT, 4};
    CHECK_RC(fl_net_add_n(net, fl_concat_create("later"), 2, later), FL_EINVAL);
    CHECK_MSG("later");
    CHECK(fl_net_num_layers(net) == 0);
    /* two-input layers take fl_net_add_n of 2 as fl_net_add2; concat takes any count */
    CHECK(fl_net_add_n(net, fl_add_create("add", false), 2, in) == 0);
    CHECK(fl_net_add(net, fl_concat_create("one")) == FL_OK);
    CHECK(fl_net_add2(net, fl_concat_create("two"), 1, 0) == 2);
    fl_net_free(net);
    /* shapes that do not fit: pooled H, W beside the input's; (C) beside (C, H, W) */
    net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_pool2d_create("pool", FL_POOL_MAX, 2, 2, 0)));
    int mix[] = {FL_NET_INPUT, FL_NET_INPUT, 0};
    CHECK(fl_net_add_n(net, fl_concat_create("agg"), 3, mix) == 1);
    int64_t shape[] = {2, 4, 4};
    CHECK_RC(fl_net_build(net, 3, shape, 2, 1), FL_ESHAPE);
    CHECK_MSG("agg");
    CHECK_MSG("input 2");
    fl_net_free(net);
    net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_global_avg_pool_create("gap")));
    int flat[] = {0, FL_NET_INPUT};
    CHECK(fl_net_add_n(net, fl_concat_create("agg2"), 2, flat) == 1);
    CHECK_RC(fl_net_build(net, 3, shape, 2, 1), FL_ESHAPE);
    CHECK_MSG("agg2");
    fl_net_free(net);
}

int main(void) {
    fl_rng_init(&rng, 42, 0);
    test_layer();
    const fl_backend *t[3];
    int nt = cpu_tables(t);
    for (int i = 0; i < nt; i++) {
        test_net_gradcheck(t[i]);
        test_read_twice(t[i]);
        test_amp(t[i]);
    }
    test_net_tables();
    test_max_inputs();
    test_refusals();
    TEST_DONE();
}
