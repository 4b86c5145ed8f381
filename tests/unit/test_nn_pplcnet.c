/* test_nn_pplcnet.c - PP-LCNet's layers and model: the channel-wise multiply (concat:
 * test_nn_concat.c) against central finite differences in f64 on both kernel tables and both
 * layouts; a squeeze-and-excitation block inside a network (every parameter's gradient by finite
 * differences); the zoo's PP-LCNet: parameter counts at 1000 classes against the architecture
 * (PaddleClas's published sizes, rounded), PaddleClas's names, its shapes at 224, 32 and 28;
 * one training step of a small PP-LCNet on onednn (NHWC) and cpu against ref (NCHW); and the cpu
 * table's direct depthwise convolution against ref's im2col on backend_cases.h's grouped
 * cases, forward and both backwards, bit-identical for 1 and 3 threads; recompute gives
 * bit-identical gradients, bf16 mixed precision a close loss. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"
#include "model_check.h"
#include "unit/backend_cases.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-6
#define RTOL 1e-6
#define ATOL 1e-8

static fl_rng rng;

static double uniform(double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform_f64(&rng); }

static double *rand_f64(int64_t n, double lo, double hi) {
    double *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = uniform(lo, hi);
    return p;
}

/* L = sum(r * layer(a, b)) */
static double loss2(fl_layer *l, fl_tensor *a, fl_tensor *b, fl_tensor *y, const double *r) {
    CHECK_OK(l->ops->forward2(l, a, b, y, true));
    double s = 0;
    const double *yd = y->data;
    for (int64_t i = 0; i < y->numel; i++)
        s += r[i] * yd[i];
    return s;
}

/* A two-input layer alone, in f64 on table k in layout lay: da, db against finite
 * differences of L in every element of a and b. */
static void gradcheck2(const char *what, const fl_backend *k, fl_layout lay, fl_layer *l,
                       int andim, const int64_t *ash, int bndim, const int64_t *bsh, int64_t n) {
    CHECK(l != NULL);
    if (!l)
        return;
    l->dtype = l->adtype = FL_DTYPE_F64; /* as fl_net_add sets them */
    l->k = k;
    l->layout = lay;
    int ondim = 0;
    int64_t osh[FL_MAX_DIMS];
    CHECK_OK(l->ops->infer_shape2(l, andim, ash, bndim, bsh, &ondim, osh));
    int64_t af[FL_MAX_DIMS] = {n}, bf[FL_MAX_DIMS] = {n}, of[FL_MAX_DIMS] = {n};
    memcpy(af + 1, ash, (size_t)andim * sizeof *ash);
    memcpy(bf + 1, bsh, (size_t)bndim * sizeof *bsh);
    memcpy(of + 1, osh, (size_t)ondim * sizeof *osh);
    int64_t na = fl_shape_numel(andim + 1, af), nb = fl_shape_numel(bndim + 1, bf);
    int64_t ny = fl_shape_numel(ondim + 1, of);
    double *ad = rand_f64(na, -1, 1), *bd = rand_f64(nb, -1, 1), *yd = rand_f64(ny, 0, 0);
    double *r = rand_f64(ny, -1, 1), *da = rand_f64(na, 0, 0), *db = rand_f64(nb, 0, 0);
    double *dan = rand_f64(na, 0, 0), *dbn = rand_f64(nb, 0, 0);
    fl_tensor a, b, y, dy, dat, dbt;
    fl_tensor_view(&a, FL_DTYPE_F64, andim + 1, af, ad);
    fl_tensor_view(&b, FL_DTYPE_F64, bndim + 1, bf, bd);
    fl_tensor_view(&y, FL_DTYPE_F64, ondim + 1, of, yd);
    fl_tensor_view(&dy, FL_DTYPE_F64, ondim + 1, of, r);
    fl_tensor_view(&dat, FL_DTYPE_F64, andim + 1, af, da);
    fl_tensor_view(&dbt, FL_DTYPE_F64, bndim + 1, bf, db);
    loss2(l, &a, &b, &y, r);
    CHECK_OK(l->ops->backward2(l, &a, &b, &y, &dy, &dat, &dbt, false));
    double *vs[2] = {ad, bd}, *num[2] = {dan, dbn};
    int64_t ns[2] = {na, nb};
    for (int in = 0; in < 2; in++)
        for (int64_t i = 0; i < ns[in]; i++) {
            double keep = vs[in][i];
            vs[in][i] = keep + EPS;
            double lp = loss2(l, &a, &b, &y, r);
            vs[in][i] = keep - EPS;
            double lm = loss2(l, &a, &b, &y, r);
            vs[in][i] = keep;
            num[in][i] = (lp - lm) / (2 * EPS);
        }
    char label[160];
    snprintf(label, sizeof label, "%s [%s %s] d/da", what, k->name, fl_layout_name(lay));
    CHECK_CLOSE(label, da, dan, na, ATOL, RTOL);
    snprintf(label, sizeof label, "%s [%s %s] d/db", what, k->name, fl_layout_name(lay));
    CHECK_CLOSE(label, db, dbn, nb, ATOL, RTOL);
    /* either gradient may be left out */
    CHECK_OK(l->ops->backward2(l, &a, &b, &y, &dy, NULL, &dbt, false));
    CHECK_OK(l->ops->backward2(l, &a, &b, &y, &dy, &dat, NULL, false));
    CHECK_CLOSE(label, da, dan, na, ATOL, RTOL);
    double *bufs[] = {ad, bd, yd, r, da, db, dan, dbn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    fl_layer_free(l);
}

static void test_two_input_layers(void) {
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    int64_t x[] = {5, 3, 4}, s3[] = {5, 1, 1}, s1[] = {5};
    for (int t = 0; t < 2; t++)
        for (int lay = 0; lay < 2; lay++) {
            fl_layout l = lay ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
            gradcheck2("channel_mul (5,3,4) * (5,1,1)", tables[t], l,
                       fl_channel_mul_create("mul"), 3, x, 3, s3, 3);
            gradcheck2("channel_mul (5,3,4) * (5)", tables[t], l, fl_channel_mul_create("mul"), 3,
                       x, 1, s1, 2);
        }
    /* shapes that do not fit are refused naming the layer */
    fl_layer *m = fl_channel_mul_create("se.multiply");
    int od;
    int64_t os[FL_MAX_DIMS], bad[] = {4, 1, 1}, wide[] = {5, 3, 1};
    CHECK_RC(m->ops->infer_shape2(m, 3, x, 3, bad, &od, os), FL_ESHAPE);
    CHECK_MSG("se.multiply");
    CHECK_RC(m->ops->infer_shape2(m, 3, x, 3, wide, &od, os), FL_ESHAPE);
    fl_layer_free(m);
}

/* depthwise conv -> SE (pool, 1x1 conv, relu, 1x1 conv, hardsigmoid, multiply) -> concat with
 * the depthwise output -> flatten -> fc, in f64: every parameter by finite differences */
static void test_se_block(const fl_backend *k) {
    enum { B = 3, C = 8, H = 5, W = 4 };
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    fl_conv2d_opts dw = {.in_channels = C, .out_channels = C, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1, .groups = C, .bias = true};
    fl_conv2d_opts c1 = {.in_channels = C, .out_channels = C / 4, .kh = 1, .kw = 1, .bias = true};
    fl_conv2d_opts c2 = {.in_channels = C / 4, .out_channels = C, .kh = 1, .kw = 1, .bias = true};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("dw", &dw)));
    CHECK_OK(fl_net_add(net, fl_activation_create("hs", FL_ACT_HARDSWISH)));
    int in = fl_net_num_layers(net) - 1;
    CHECK_OK(fl_net_add(net, fl_adaptive_avg_pool_create("se.avg_pool")));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("se.conv1", &c1)));
    CHECK_OK(fl_net_add(net, fl_activation_create("se.relu", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("se.conv2", &c2)));
    CHECK_OK(fl_net_add(net, fl_activation_create("se.hardsigmoid", FL_ACT_HARDSIGMOID)));
    int mul = fl_net_add2(net, fl_channel_mul_create("se.multiply"), in,
                          fl_net_num_layers(net) - 1);
    CHECK(mul >= 0);
    CHECK(fl_net_add2(net, fl_concat_create("cat"), mul, in) >= 0);
    CHECK_OK(fl_net_add(net, fl_flatten_create("flatten")));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 2 * C * H * W, 3, true)));
    int64_t in_shape[] = {C, H, W};
    CHECK_OK(fl_net_build(net, 3, in_shape, B, 5));
    /* SE's convolutions start at zero bias: move them off so that its relu is not at a kink
     * and the hardsigmoid is on its ramp */
    double *w = fl_net_flat_params(net);
    int64_t np = fl_net_numel(net);
    for (int64_t i = 0; i < np; i++)
        w[i] = uniform(-0.6, 0.6);
    int64_t xs[] = {B, C, H, W};
    double *xd = rand_f64(B * C * H * W, -2, 2), *r = rand_f64(B * 3, -1, 1);
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F64, 4, xs, xd);
    net_proj(net, &x, r);
    int64_t ys[] = {B, 3};
    fl_tensor_view(&dy, FL_DTYPE_F64, 2, ys, r);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    double *g = malloc((size_t)np * sizeof *g), *gn = malloc((size_t)np * sizeof *gn);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    fd_grads(net, &x, r, w, np, EPS, gn);
    char label[96];
    snprintf(label, sizeof label, "SE block + concat [%s] d/dparams", k->name);
    CHECK_CLOSE(label, g, gn, np, ATOL, RTOL);
    free(g);
    free(gn);
    free(xd);
    free(r);
    fl_net_free(net);
}

/* the trainable parameters of a network, counted from the declared shapes */
static int64_t count_params(fl_net *net) {
    int64_t total = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        if (fl_net_param(net, i)->trainable)
            total += fl_net_param(net, i)->value.numel;
    return total;
}

/* Exact counts of PaddleClas's architecture (pp_lcnet.py) at 1000 classes, worked out from its
 * NET_CONFIG with make_divisible; PaddleClas publishes them rounded: 1.5M, 1.6M, 1.9M, 2.4M,
 * 3.0M, 4.5M, 6.5M, 9.0M. Batch norm's running statistics are buffers, not counted. */
static void test_param_counts(void) {
    static const struct {
        double  scale;
        int64_t params;
        double  published; /* millions */
    } want[] = {{0.25, 1521184, 1.5}, {0.35, 1643090, 1.6}, {0.5, 1879576, 1.9},
                {0.75, 2357008, 2.4}, {1.0, 2952520, 3.0},  {1.5, 4499832, 4.5},
                {2.0, 6521512, 6.5},  {2.5, 9017560, 9.0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(fl_pplcnet_scale_known(want[i].scale));
        fl_net *net = fl_model_pplcnet(FL_DTYPE_F32, want[i].scale, 3, false, 1000);
        CHECK(net != NULL);
        if (!net)
            continue;
        int64_t got = count_params(net);
        if (got != want[i].params)
            fprintf(stderr, "pplcnet x%g: %lld parameters, want %lld\n", want[i].scale,
                    (long long)got, (long long)want[i].params);
        CHECK(got == want[i].params);
        CHECK(fabs(round((double)got / 1e5) / 10 - want[i].published) < 1e-9);
        fl_net_free(net);
    }
    CHECK(!fl_pplcnet_scale_known(0.3));
    CHECK(fl_model_pplcnet(FL_DTYPE_F32, 0, 3, false, 1000) == NULL);
    CHECK_MSG("pplcnet");
    CHECK(fl_model_pplcnet(FL_DTYPE_F32, 1.0, 3, false, 0) == NULL);
}

/* PaddleClas's names, in its order; the shapes at 224 and at the small inputs */
static void test_names_and_shapes(void) {
    fl_net *net = fl_model_pplcnet(FL_DTYPE_F32, 1.0, 3, false, 1000);
    CHECK(net != NULL);
    if (!net)
        return;
    CHECK(strcmp(fl_net_param(net, 0)->name, "conv1.conv.weight") == 0);
    CHECK(strcmp(fl_net_param(net, 1)->name, "conv1.bn.weight") == 0);
    const char *names[] = {"blocks2.0.dw_conv.conv.weight", "blocks3.1.pw_conv.bn.bias",
                           "blocks5.5.dw_conv.conv.weight", "blocks6.0.se.conv1.weight",
                           "blocks6.1.se.conv2.bias",       "last_conv.weight",
                           "fc.weight",                     "fc.bias"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(fl_net_find_param(net, names[i]) != NULL);
        if (!fl_net_find_param(net, names[i]))
            fprintf(stderr, "no parameter %s\n", names[i]);
    }
    fl_param *dw = fl_net_find_param(net, "blocks5.1.dw_conv.conv.weight");
    CHECK(dw && dw->value.ndim == 4 && dw->value.shape[0] == 256 && dw->value.shape[1] == 1 &&
          dw->value.shape[2] == 5);
    CHECK(fl_net_find_param(net, "last_conv.bias") == NULL); /* bias_attr=False */
    CHECK(fl_net_find_param(net, "blocks5.0.se.conv1.weight") == NULL); /* SE in blocks6 only */
    int64_t s224[] = {3, 224, 224}, out[FL_MAX_DIMS];
    CHECK_OK(fl_net_build(net, 3, s224, 1, 1));
    CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 1000);
    fl_net_free(net);
    /* small inputs: 28 x 28 grey and 32 x 32 colour, stride 1 in the stem and blocks3 */
    int64_t sizes[][3] = {{1, 28, 28}, {3, 32, 32}};
    for (int i = 0; i < 2; i++) {
        net = fl_model_pplcnet(FL_DTYPE_F32, 0.25, sizes[i][0], true, 10);
        CHECK(net != NULL);
        if (!net)
            continue;
        CHECK_OK(fl_net_build(net, 3, sizes[i], 2, 1));
        CHECK(fl_net_out_shape(net, out) == 1 && out[0] == 10);
        fl_net_free(net);
    }
}

/* sample standard deviation (mean 0 assumed) and largest magnitude of an f32 parameter */
static void param_stats(fl_net *net, const char *name, double *std, double *maxabs) {
    fl_param *p = fl_net_find_param(net, name);
    *std = *maxabs = -1;
    CHECK(p != NULL);
    if (!p)
        return;
    const float *v = p->value.data;
    double ss = 0, m = 0;
    for (int64_t i = 0; i < p->value.numel; i++) {
        ss += (double)v[i] * v[i];
        m = fabs(v[i]) > m ? fabs(v[i]) : m;
    }
    *std = sqrt(ss / (double)p->value.numel);
    *maxabs = m;
}

static bool near(double got, double want, double rel) { return fabs(got - want) <= rel * want; }

/* PaddleClas's initialisation (fl_layer_set_init): ConvBNLayer convolutions KaimingNormal by
 * fan in, SE and last convolutions Paddle's Conv2D default N(0, sqrt(2 / (IN k k))), fc Xavier
 * uniform with a zero bias; fl_net_init_torch back to PyTorch's (fan-out He, U(1/sqrt(IN))). */
static void test_init(void) {
    int64_t in[] = {3, 32, 32};
    double sd, mx;
    for (int torch = 0; torch < 2; torch++) {
        fl_net *net = fl_model_pplcnet(FL_DTYPE_F32, 1.0, 3, true, 10);
        CHECK(net != NULL);
        if (!net)
            return;
        if (torch)
            fl_net_init_torch(net);
        CHECK_OK(fl_net_build(net, 3, in, 1, 1));
        /* depthwise 5 x 5 of 256 channels: fan in 25, fan out 6400 */
        param_stats(net, "blocks5.1.dw_conv.conv.weight", &sd, &mx);
        CHECK(near(sd, torch ? sqrt(2.0 / 6400) : sqrt(2.0 / 25), 0.05));
        /* pointwise 256 -> 256 */
        param_stats(net, "blocks5.1.pw_conv.conv.weight", &sd, &mx);
        CHECK(near(sd, sqrt(2.0 / 256), 0.05));
        /* SE conv1 of blocks6.1, 512 -> 128 (Paddle's default: fan in 512; torchvision's: fan out 128) */
        param_stats(net, "blocks6.1.se.conv1.weight", &sd, &mx);
        CHECK(near(sd, torch ? sqrt(2.0 / 128) : sqrt(2.0 / 512), 0.05));
        param_stats(net, "last_conv.weight", &sd, &mx);
        CHECK(near(sd, torch ? sqrt(2.0 / 1280) : sqrt(2.0 / 512), 0.05));
        /* fc 1280 -> 10: Xavier's bound sqrt(6 / 1290), a zero bias; PyTorch's 1 / sqrt(1280) */
        double bound = torch ? 1.0 / sqrt(1280.0) : sqrt(6.0 / 1290.0);
        param_stats(net, "fc.weight", &sd, &mx);
        CHECK(mx <= bound && mx > 0.99 * bound);
        param_stats(net, "fc.bias", &sd, &mx);
        CHECK(torch ? mx > 0 && mx <= bound : mx == 0);
        fl_net_free(net);
    }
    /* a scheme the layer does not have is refused, naming it */
    CHECK(fl_layer_set_init(fl_activation_create("act9", FL_ACT_RELU), FL_INIT_PADDLE) == NULL);
    CHECK_MSG("act9");
    CHECK(fl_layer_set_init(fl_fc_create("fc9", 4, 2, true), FL_INIT_KAIMING_FAN_IN) == NULL);
    CHECK_MSG("fc9");
    fl_layer *ok = fl_layer_set_init(fl_fc_create("fc8", 4, 2, true), FL_INIT_PADDLE);
    CHECK(ok != NULL);
    fl_layer_free(ok);
}

/* one step of PP-LCNet x0.25 on 32 x 32 (f32) on table k against ref: logits, loss and every
 * gradient; onednn runs it in NHWC, cpu and ref in NCHW */
static void test_step_vs_ref(const fl_backend *k) {
    enum { B = 4, CLS = 10 };
    int64_t shape[] = {3, 32, 32};
    const fl_backend *be[2] = {fl_backend_ref(), k};
    float *grads[2] = {NULL, NULL}, *logit[2] = {NULL, NULL};
    double loss[2] = {0, 0};
    int64_t np = 0, nl = B * CLS;
    float *xd = malloc(B * 3 * 32 * 32 * sizeof *xd);
    for (int i = 0; i < B * 3 * 32 * 32; i++)
        xd[i] = (float)uniform(-1, 1);
    int32_t labels[B] = {1, 7, 3, 3};
    for (int j = 0; j < 2; j++) {
        fl_net *net = fl_model_pplcnet(FL_DTYPE_F32, 0.25, 3, true, CLS);
        CHECK(net != NULL);
        if (!net)
            return;
        fl_net_set_backend(net, be[j]);
        CHECK_OK(fl_net_build(net, 3, shape, B, 7));
        if (j == 1 && be[j]->preferred_layout(FL_DTYPE_F32) == FL_LAYOUT_NHWC)
            CHECK(fl_net_layout(net) == FL_LAYOUT_NHWC);
        int64_t xs[] = {B, 3, 32, 32};
        fl_tensor x, probs;
        fl_tensor_view(&x, FL_DTYPE_F32, 4, xs, xd);
        const fl_tensor *lg = NULL;
        CHECK_OK(fl_net_forward(net, &x, true, &lg));
        logit[j] = malloc((size_t)nl * sizeof(float));
        memcpy(logit[j], lg->data, (size_t)nl * sizeof(float));
        float pm[B * CLS];
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, lg->shape, pm);
        CHECK_OK(fl_softmax_xent_forward(be[j], lg, labels, &probs, &loss[j]));
        CHECK_OK(fl_softmax_xent_backward(be[j], &probs, labels, &probs));
        CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
        np = fl_net_numel(net);
        grads[j] = malloc((size_t)np * sizeof(float));
        memcpy(grads[j], fl_net_flat_grads(net), (size_t)np * sizeof(float));
        fl_net_free(net);
    }
    char label[96];
    snprintf(label, sizeof label, "pplcnet x0.25 logits [%s vs ref]", k->name);
    CHECK_CLOSE_F32(label, logit[1], logit[0], nl, 1e-4, 1e-3);
    CHECK_NEAR(loss[1], loss[0], 1e-4);
    snprintf(label, sizeof label, "pplcnet x0.25 gradients [%s vs ref]", k->name);
    /* f32 sums in other orders through 40 layers of batch norm: relative to the largest */
    double mx = 0;
    for (int64_t i = 0; i < np; i++)
        mx = fmax(mx, fabs(grads[0][i]));
    CHECK_CLOSE_F32(label, grads[1], grads[0], np, 1e-4 * mx, 1e-3); /* seen: 1e-5 mx */
    double worst = 0, wl = 0;
    for (int64_t i = 0; i < np; i++)
        worst = fmax(worst, fabs(grads[1][i] - grads[0][i]));
    for (int64_t i = 0; i < nl; i++)
        wl = fmax(wl, fabs(logit[1][i] - logit[0][i]));
    fprintf(stderr, "%s: largest |gradient difference| %.3g (largest gradient %.3g), logits %.3g\n",
            label, worst, mx, wl);
    free(xd);
    for (int j = 0; j < 2; j++) {
        free(grads[j]);
        free(logit[j]);
    }
}

static void *fill_rand(fl_dtype t, int64_t n) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++) {
        double v = uniform(-1, 1);
        if (t == FL_DTYPE_F32)
            ((float *)p)[i] = (float)v;
        else
            ((double *)p)[i] = v;
    }
    return p;
}

static void to_f64(fl_dtype t, const void *p, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = t == FL_DTYPE_F32 ? ((const float *)p)[i] : ((const double *)p)[i];
}

/* one convolution's three results on table k with th threads */
static void conv_run(const fl_backend *k, const fl_conv_desc *d, int64_t n, int th,
                     const void *x, const void *w, const void *b, const void *dy, void *y,
                     void *dx, void *dw, void *db) {
    fl_kernels_set_threads(th);
    fl_conv_plan *p = k->conv_plan_create(d);
    CHECK(p != NULL);
    if (!p)
        return;
    void *scratch = malloc(k->conv_scratch_bytes(p) + 64);
    k->conv_forward(p, n, x, w, b, y, scratch);
    k->conv_backward_data(p, n, dy, w, dx, scratch);
    k->conv_backward_filter(p, n, x, dy, dw, db, false, scratch);
    free(scratch);
    k->conv_plan_free(p);
    fl_kernels_set_threads(0);
}

static void test_depthwise_vs_ref(void) {
    const fl_backend *C = fl_backend_cpu(), *R = fl_backend_ref();
    fl_dtype dts[] = {FL_DTYPE_F32, FL_DTYPE_F64};
    for (size_t ci = 0; ci < N_CONV_CASES; ci++) {
        const conv_case *cc = &conv_cases[ci];
        if (cc->groups == 1)
            continue;
        for (int di = 0; di < 2; di++) {
            fl_dtype t = dts[di];
            fl_conv_desc d = {.dtype = t, .layout = FL_LAYOUT_NCHW, .max_batch = cc->n + cc->extra,
                              .oc = cc->oc, .groups = cc->groups, .bias = cc->bias,
                              .g = {.c = cc->ic, .h = cc->h, .w = cc->w, .kh = cc->kh,
                                    .kw = cc->kw, .sh = cc->sh, .sw = cc->sw, .ph = cc->ph,
                                    .pw = cc->pw, .dh = cc->dh, .dw = cc->dw}};
            CHECK(fl_conv_geom_out(&d.g));
            int64_t n = cc->n, nx = n * cc->ic * cc->h * cc->w;
            int64_t ny = n * cc->oc * d.g.oh * d.g.ow;
            int64_t nw = cc->oc * (cc->ic / cc->groups) * cc->kh * cc->kw;
            void *x = fill_rand(t, nx), *w = fill_rand(t, nw), *b = fill_rand(t, cc->oc);
            void *dy = fill_rand(t, ny);
            void *out[3][4]; /* ref, cpu 1 thread, cpu 3 threads: y, dx, dw, db */
            int64_t sz[4] = {ny, nx, nw, cc->oc};
            for (int r = 0; r < 3; r++) {
                for (int q = 0; q < 4; q++)
                    out[r][q] = calloc((size_t)sz[q] + 1, 8);
                conv_run(r ? C : R, &d, n, r == 2 ? 3 : 1, x, w, cc->bias ? b : NULL, dy,
                         out[r][0], out[r][1], out[r][2], cc->bias ? out[r][3] : NULL);
            }
            const char *what[4] = {"forward", "backward data", "backward filter", "bias"};
            for (int q = 0; q < 4; q++) {
                double *g = malloc((size_t)sz[q] * 8 + 8), *want = malloc((size_t)sz[q] * 8 + 8);
                to_f64(t, out[1][q], sz[q], g);
                to_f64(t, out[0][q], sz[q], want);
                char label[160];
                snprintf(label, sizeof label, "%s %s [cpu vs ref, %s]", cc->name, what[q],
                         fl_dtype_name(t));
                double tol = t == FL_DTYPE_F32 ? 2e-5 : 1e-12;
                CHECK_CLOSE(label, g, want, sz[q], tol, tol);
                CHECK(memcmp(out[1][q], out[2][q], (size_t)sz[q] * fl_dtype_size(t)) == 0);
                free(g);
                free(want);
            }
            for (int r = 0; r < 3; r++)
                for (int q = 0; q < 4; q++)
                    free(out[r][q]);
            free(x), free(w), free(b), free(dy);
        }
    }
}

/* one step of x0.25 (32 x 32, f32, cpu): the loss and every gradient, with recompute ("auto"
 * or every SE multiply and a pointwise batch norm (its hardswish fused) named) or mixed precision (bf16 conv2d and fc)
 * as asked */
static double step(const char *recompute, bool amp, float *grads, int64_t *np) {
    enum { B = 4, CLS = 10 };
    int64_t shape[] = {3, 32, 32}, xs[] = {B, 3, 32, 32};
    fl_net *net = fl_model_pplcnet(FL_DTYPE_F32, 0.25, 3, true, CLS);
    CHECK(net != NULL);
    if (!net)
        return NAN;
    if (recompute)
        CHECK_OK(fl_net_set_recompute(net, recompute));
    CHECK_OK(fl_net_build(net, 3, shape, B, 3));
    if (amp)
        CHECK_OK(fl_net_set_amp(net, FL_DTYPE_BF16, "conv2d,fc"));
    fl_rng r;
    fl_rng_init(&r, 99, 0);
    float *xd = malloc(B * 3 * 32 * 32 * sizeof *xd), pm[B * CLS];
    for (int i = 0; i < B * 3 * 32 * 32; i++)
        xd[i] = 2 * fl_rng_uniform(&r) - 1;
    int32_t labels[B] = {0, 9, 4, 4};
    fl_tensor x, probs;
    fl_tensor_view(&x, FL_DTYPE_F32, 4, xs, xd);
    const fl_tensor *lg = NULL;
    double loss = NAN;
    CHECK_OK(fl_net_forward(net, &x, true, &lg));
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, lg->shape, pm);
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), lg, labels, &probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    *np = fl_net_numel(net);
    memcpy(grads, fl_net_flat_grads(net), (size_t)*np * sizeof(float));
    free(xd);
    fl_net_free(net);
    return loss;
}

static void test_recompute_amp(void) {
    int64_t np = 0;
    enum { MAXP = 300000 };
    float *g0 = malloc(MAXP * sizeof *g0), *g1 = malloc(MAXP * sizeof *g1);
    double l0 = step(NULL, false, g0, &np);
    CHECK(np > 0 && np < MAXP);
    const char *specs[] = {"auto", "blocks6.0.se.multiply,blocks6.1.se.multiply,"
                                   "blocks4.1.pw_conv.bn,avg_pool"};
    for (int i = 0; i < 2; i++) {
        double l1 = step(specs[i], false, g1, &np);
        CHECK(l1 == l0);
        CHECK(memcmp(g0, g1, (size_t)np * sizeof *g0) == 0); /* bit-identical gradients */
        if (memcmp(g0, g1, (size_t)np * sizeof *g0) != 0)
            fprintf(stderr, "recompute %s: gradients differ\n", specs[i]);
    }
    /* bf16 conv2d and fc: the same network to bf16's precision */
    double la = step(NULL, true, g1, &np);
    CHECK(isfinite(la));
    CHECK_NEAR(la, l0, 5e-2);
    free(g0);
    free(g1);
}

int main(void) {
    fl_rng_init(&rng, 36, 1);
    test_two_input_layers();
    test_se_block(fl_backend_cpu());
    test_se_block(fl_backend_ref());
    test_depthwise_vs_ref();
    test_recompute_amp();
    test_param_counts();
    test_names_and_shapes();
    test_init();
    test_step_vs_ref(fl_backend_cpu());
    if (fl_backend_onednn())
        test_step_vs_ref(fl_backend_onednn());
    TEST_DONE();
}
