/* test_nn_gradcheck.c - every layer's backward against central finite differences in f64, with
 * both kernel tables: single layers under a random projection loss (arbitrary dy, input gradient
 * included), softmax cross-entropy, and whole MLPs (tanh, relu, sigmoid) through the mean loss.
 * The two-input layers and PP-LCNet's blocks: test_nn_pplcnet.c. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#define EPS 1e-6
#define RTOL 1e-6
#define ATOL 1e-8

static fl_rng rng;

static double uniform(double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform_f64(&rng); }

/* x (B, sample) values: uniform in [lo, hi), or +-[0.1, 1.1) when away_from_zero (relu) */
static void fill_input(double *x, int64_t n, double lo, double hi, bool away_from_zero) {
    for (int64_t i = 0; i < n; i++) {
        if (away_from_zero)
            x[i] = (fl_rng_uniform_f64(&rng) < 0.5 ? -1 : 1) * uniform(0.1, 1.1);
        else
            x[i] = uniform(lo, hi);
    }
}

/* L = sum(r * f(x)) */
static double proj_loss(fl_net *net, const fl_tensor *x, const double *r) {
    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, x, true, &y));
    if (!y)
        return NAN;
    const double *yd = y->data;
    double l = 0;
    for (int64_t i = 0; i < y->numel; i++)
        l += r[i] * yd[i];
    return l;
}

/* Central difference of proj_loss in v[i]. */
static double numeric(fl_net *net, const fl_tensor *x, const double *r, double *v, int64_t i) {
    double keep = v[i];
    v[i] = keep + EPS;
    double lp = proj_loss(net, x, r);
    v[i] = keep - EPS;
    double lm = proj_loss(net, x, r);
    v[i] = keep;
    return (lp - lm) / (2 * EPS);
}

/* Builds a one-layer f64 network around layer and checks d L / d params and d L / d x. */
static void gradcheck_layer(const char *what, const fl_backend *k, fl_layer *layer,
                            int in_ndim, const int64_t *in_shape, int64_t batch, double lo,
                            double hi, bool away_from_zero) {
    char label[128];
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    CHECK(net != NULL);
    CHECK(layer != NULL);
    if (!net || !layer)
        return;
    CHECK_OK(fl_net_add(net, layer));
    CHECK_OK(fl_net_build(net, in_ndim, in_shape, batch, 42));

    int64_t xshape[FL_MAX_DIMS] = {batch};
    memcpy(xshape + 1, in_shape, (size_t)in_ndim * sizeof *in_shape);
    int64_t nx = fl_shape_numel(in_ndim + 1, xshape);
    double *xd = malloc((size_t)nx * sizeof *xd);
    fill_input(xd, nx, lo, hi, away_from_zero);
    fl_tensor x;
    fl_tensor_view(&x, FL_DTYPE_F64, in_ndim + 1, xshape, xd);

    const fl_tensor *y = NULL;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    int64_t ny = y->numel;
    double *r = malloc((size_t)ny * sizeof *r);
    for (int64_t i = 0; i < ny; i++)
        r[i] = uniform(-1, 1);
    fl_tensor dy;
    fl_tensor_view(&dy, FL_DTYPE_F64, y->ndim, y->shape, r);

    /* analytic parameter gradients through the network */
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    int64_t np = fl_net_numel(net);
    double *g = malloc((size_t)(np > 0 ? np : 1) * sizeof *g);
    if (np > 0)
        memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    double *gnum = malloc((size_t)(np > 0 ? np : 1) * sizeof *gnum);
    double *w = fl_net_flat_params(net);
    for (int64_t i = 0; i < np; i++)
        gnum[i] = numeric(net, &x, r, w, i);
    snprintf(label, sizeof label, "%s [%s] d/dparams", what, k->name);
    CHECK_CLOSE(label, g, gnum, np, ATOL, RTOL);

    /* analytic input gradient: the layer's backward, called directly with a dx buffer */
    fl_layer *l = fl_net_layer(net, 0);
    double *dxd = malloc((size_t)nx * sizeof *dxd);
    fl_tensor dx;
    fl_tensor_view(&dx, FL_DTYPE_F64, in_ndim + 1, xshape, dxd);
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK_OK(l->ops->backward(l, &x, y, &dy, &dx, false));
    double *dxnum = malloc((size_t)nx * sizeof *dxnum);
    for (int64_t i = 0; i < nx; i++)
        dxnum[i] = numeric(net, &x, r, xd, i);
    snprintf(label, sizeof label, "%s [%s] d/dx", what, k->name);
    CHECK_CLOSE(label, dxd, dxnum, nx, ATOL, RTOL);

    free(xd);
    free(r);
    free(g);
    free(gnum);
    free(dxd);
    free(dxnum);
    fl_net_free(net);
}

static void test_layers(const fl_backend *k) {
    int64_t in5[] = {5}, in234[] = {2, 3, 4};
    gradcheck_layer("fc 5->4 bias", k, fl_fc_create("fc", 5, 4, true), 1, in5, 3, -1, 1, false);
    gradcheck_layer("fc 5->4 no bias", k, fl_fc_create("fc", 5, 4, false), 1, in5, 3, -1, 1,
                    false);
    gradcheck_layer("fc (2,3,4)->7 flattening", k, fl_fc_create("fc", 24, 7, true), 3, in234, 2,
                    -1, 1, false);
    gradcheck_layer("fc batch 1", k, fl_fc_create("fc", 5, 1, true), 1, in5, 1, -1, 1, false);
    gradcheck_layer("relu", k, fl_activation_create("relu", FL_ACT_RELU), 3, in234, 3, 0, 0,
                    true);
    gradcheck_layer("tanh", k, fl_activation_create("tanh", FL_ACT_TANH), 3, in234, 3, -2, 2,
                    false);
    gradcheck_layer("sigmoid", k, fl_activation_create("sigmoid", FL_ACT_SIGMOID), 1, in5, 4, -3,
                    3, false);
    /* the hard activations on (-5, 5): both flat tails, the ramp (no sample within EPS of a
     * kink at +-3 with this seed) */
    gradcheck_layer("hardswish", k, fl_activation_create("hardswish", FL_ACT_HARDSWISH), 3, in234,
                    3, -5, 5, false);
    gradcheck_layer("hardsigmoid", k,
                    fl_activation_create("hardsigmoid", FL_ACT_HARDSIGMOID), 3, in234, 3, -5, 5,
                    false);
    gradcheck_layer("adaptive_avg_pool", k, fl_adaptive_avg_pool_create("pool"), 3, in234, 2, -1,
                    1, false);
    gradcheck_layer("flatten", k, fl_flatten_create("flatten"), 3, in234, 2, -1, 1, false);
    gradcheck_layer("slice [1, 4) of 5", k, fl_slice_create("slice", 1, 3), 1, in5, 3, -1, 1,
                    false);
    /* depthwise convolutions (the cpu table's direct loops; ref's im2col per group) */
    int64_t in655[] = {6, 5, 5}, in479[] = {4, 7, 9};
    fl_conv2d_opts dw3 = {.in_channels = 6, .out_channels = 6, .kh = 3, .kw = 3, .sh = 2, .sw = 2,
                          .ph = 1, .pw = 1, .groups = 6, .bias = true};
    gradcheck_layer("depthwise 3x3 s2 p1 bias", k, fl_conv2d_create("dw", &dw3), 3, in655, 2, -1,
                    1, false);
    fl_conv2d_opts dw5 = {.in_channels = 4, .out_channels = 4, .kh = 5, .kw = 5, .ph = 2,
                          .pw = 3, .dw = 2, .sw = 2, .groups = 4};
    gradcheck_layer("depthwise 5x5 p(2,3) s(1,2) d(1,2)", k, fl_conv2d_create("dw", &dw5), 3,
                    in479, 2, -1, 1, false);
}

/* fl_net_set_input_grad: the input read by two layers (an fc, and a slice feeding an fc), their
 * outputs added; the network's input gradient (the sum of both paths) against differences. */
static void test_input_grad(const fl_backend *k) {
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    CHECK_OK(fl_net_add(net, fl_fc_create("deep", 5, 4, true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("act", FL_ACT_TANH)));
    int a = fl_net_num_layers(net) - 1;
    CHECK(fl_net_add_from(net, fl_slice_create("cols", 2, 3), FL_NET_INPUT) == 2);
    CHECK_OK(fl_net_add(net, fl_fc_create("wide", 3, 4, false)));
    CHECK(fl_net_add2(net, fl_add_create("sum", false), a, 3) == 4);
    CHECK_OK(fl_net_set_input_grad(net, true));
    int64_t in5[] = {5};
    CHECK_OK(fl_net_build(net, 1, in5, 4, 7));
    CHECK_RC(fl_net_set_input_grad(net, false), FL_ESTATE);
    double xd[3 * 5], r[3 * 4], dxnum[3 * 5];
    fill_input(xd, 15, -1, 1, false);
    for (int i = 0; i < 12; i++)
        r[i] = uniform(-1, 1);
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F64, 2, (int64_t[]){3, 5}, xd);
    fl_tensor_view(&dy, FL_DTYPE_F64, 2, (int64_t[]){3, 4}, r);
    const fl_tensor *y;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    const fl_tensor *dx = fl_net_input_grad(net);
    CHECK(dx && dx->ndim == 2 && dx->shape[0] == 3 && dx->shape[1] == 5);
    for (int i = 0; i < 15; i++)
        dxnum[i] = numeric(net, &x, r, xd, i);
    char label[96];
    snprintf(label, sizeof label, "input gradient, two readers [%s]", k->name);
    if (dx)
        CHECK_CLOSE(label, dx->data, dxnum, 15, ATOL, RTOL);
    fl_net_free(net);
    /* off (the default): none */
    net = fl_net_create(FL_DTYPE_F64, k);
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 5, 4, true)));
    CHECK_OK(fl_net_build(net, 1, in5, 4, 7));
    CHECK(fl_net_input_grad(net) == NULL);
    fl_net_free(net);
}

/* mean softmax cross-entropy of logits (B, C) */
static double xent(const fl_backend *k, const fl_tensor *logits, const int32_t *labels,
                   fl_tensor *probs) {
    double loss = NAN;
    CHECK_OK(fl_softmax_xent_forward(k, logits, labels, probs, &loss));
    return loss;
}

static void test_softmax_xent(const fl_backend *k) {
    enum { B = 4, C = 5 };
    double lg[B * C], pr[B * C], d[B * C], dnum[B * C];
    int32_t labels[B] = {0, 4, 2, 2};
    for (int i = 0; i < B * C; i++)
        lg[i] = uniform(-3, 3);
    int64_t shape[] = {B, C};
    fl_tensor logits, probs, dlogits;
    fl_tensor_view(&logits, FL_DTYPE_F64, 2, shape, lg);
    fl_tensor_view(&probs, FL_DTYPE_F64, 2, shape, pr);
    fl_tensor_view(&dlogits, FL_DTYPE_F64, 2, shape, d);
    xent(k, &logits, labels, &probs);
    CHECK_OK(fl_softmax_xent_backward(k, &probs, labels, &dlogits));
    for (int i = 0; i < B * C; i++) {
        double keep = lg[i];
        lg[i] = keep + EPS;
        double lp = xent(k, &logits, labels, &probs);
        lg[i] = keep - EPS;
        double lm = xent(k, &logits, labels, &probs);
        lg[i] = keep;
        dnum[i] = (lp - lm) / (2 * EPS);
    }
    char label[64];
    snprintf(label, sizeof label, "softmax_xent [%s] d/dlogits", k->name);
    CHECK_CLOSE(label, d, dnum, B * C, ATOL, RTOL);
}

/* mean cross-entropy of the whole network on (x, labels) */
static double net_loss(fl_net *net, const fl_tensor *x, const int32_t *labels, double *probs_mem,
                       fl_tensor *probs) {
    const fl_tensor *logits = NULL;
    CHECK_OK(fl_net_forward(net, x, true, &logits));
    if (!logits)
        return NAN;
    fl_tensor_view(probs, FL_DTYPE_F64, 2, logits->shape, probs_mem);
    return xent(fl_net_backend(net), logits, labels, probs);
}

static void test_mlp(const fl_backend *k, fl_act act) {
    enum { B = 5, IN = 6, C = 3 };
    int64_t hidden[] = {8, 7}, in_shape[] = {IN};
    /* the zoo's layer sequence, on a network that uses kernel table k */
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    CHECK_OK(fl_net_add(net, fl_fc_create("fc1", IN, hidden[0], true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("act1", act)));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc2", hidden[0], hidden[1], true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("act2", act)));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc3", hidden[1], C, true)));
    CHECK_OK(fl_net_build(net, 1, in_shape, B, 3));

    double xd[B * IN], probs_mem[B * C];
    int32_t labels[B] = {0, 2, 1, 1, 0};
    fill_input(xd, B * IN, -1.5, 1.5, false);
    int64_t xshape[] = {B, IN};
    fl_tensor x, probs;
    fl_tensor_view(&x, FL_DTYPE_F64, 2, xshape, xd);

    net_loss(net, &x, labels, probs_mem, &probs);
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    int64_t np = fl_net_numel(net);
    CHECK(np == IN * 8 + 8 + 8 * 7 + 7 + 7 * C + C); // fc1, fc2, fc3
    double *g = malloc((size_t)np * sizeof *g), *gnum = malloc((size_t)np * sizeof *gnum);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    double *w = fl_net_flat_params(net);
    for (int64_t i = 0; i < np; i++) {
        double keep = w[i];
        w[i] = keep + EPS;
        double lp = net_loss(net, &x, labels, probs_mem, &probs);
        w[i] = keep - EPS;
        double lm = net_loss(net, &x, labels, probs_mem, &probs);
        w[i] = keep;
        gnum[i] = (lp - lm) / (2 * EPS);
    }
    char label[64];
    snprintf(label, sizeof label, "mlp %s [%s] d/dparams", fl_act_name(act), k->name);
    CHECK_CLOSE(label, g, gnum, np, ATOL, RTOL);
    free(g);
    free(gnum);
    fl_net_free(net);
}

/* The zoo's own MLP end to end (cpu kernels): the same check on fl_model_mlp as built. */
static void test_zoo_mlp(fl_act act) {
    enum { B = 4, IN = 5, C = 4 };
    int64_t hidden[] = {6, 3}, in_shape[] = {IN};
    fl_net *net = fl_model_mlp(FL_DTYPE_F64, IN, hidden, 2, act, C);
    CHECK(net != NULL);
    if (!net)
        return;
    CHECK_OK(fl_net_build(net, 1, in_shape, B, 11));
    double xd[B * IN], probs_mem[B * C];
    int32_t labels[B] = {3, 0, 1, 3};
    fill_input(xd, B * IN, -2, 2, false);
    int64_t xshape[] = {B, IN};
    fl_tensor x, probs;
    fl_tensor_view(&x, FL_DTYPE_F64, 2, xshape, xd);
    net_loss(net, &x, labels, probs_mem, &probs);
    CHECK_OK(fl_softmax_xent_backward(NULL, &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    int64_t np = fl_net_numel(net);
    double *g = malloc((size_t)np * sizeof *g), *gnum = malloc((size_t)np * sizeof *gnum);
    memcpy(g, fl_net_flat_grads(net), (size_t)np * sizeof *g);
    double *w = fl_net_flat_params(net);
    for (int64_t i = 0; i < np; i++) {
        double keep = w[i];
        w[i] = keep + EPS;
        double lp = net_loss(net, &x, labels, probs_mem, &probs);
        w[i] = keep - EPS;
        double lm = net_loss(net, &x, labels, probs_mem, &probs);
        w[i] = keep;
        gnum[i] = (lp - lm) / (2 * EPS);
    }
    char label[64];
    snprintf(label, sizeof label, "fl_model_mlp %s d/dparams", fl_act_name(act));
    CHECK_CLOSE(label, g, gnum, np, ATOL, RTOL);
    free(g);
    free(gnum);
    fl_net_free(net);
}

int main(void) {
    fl_rng_init(&rng, 2024, 1);
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    for (int t = 0; t < 2; t++) {
        test_layers(tables[t]);
        test_softmax_xent(tables[t]);
        test_input_grad(tables[t]);
        test_mlp(tables[t], FL_ACT_TANH);
        test_mlp(tables[t], FL_ACT_RELU);
        test_mlp(tables[t], FL_ACT_SIGMOID);
    }
    test_zoo_mlp(FL_ACT_TANH);
    test_zoo_mlp(FL_ACT_RELU);
    TEST_DONE();
}
