/* test_nn_cnn.c - the CNN layers' backward against central finite differences in f64 (conv
 * with stride, padding, dilation, groups; batch norm in training and inference, with and
 * without the fused ReLU; max, average and global pooling; dropout with a fixed mask; the
 * option-A shortcut; residual add through the network's gradient summation), with both kernel
 * tables; batch-norm running statistics, dropout statistics and reproducibility; label
 * smoothing against its definition and finite differences; the graph API's errors, accumulate
 * mode and gradient-ready hook. */
#include "fleet/backend.h"
#include "fleet/nn.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#define EPS 1e-6
#define RTOL 1e-5
#define ATOL 1e-7

static fl_rng rng;
static fl_layer *pinned_dropout; /* when set, every forward uses dropout step 7 */
static bool train_mode = true;

static double uniform(double lo, double hi) { return lo + (hi - lo) * fl_rng_uniform_f64(&rng); }

/* L = sum(r * net(x)) */
static double proj_loss(fl_net *net, const fl_tensor *x, const double *r) {
    const fl_tensor *y = NULL;
    if (pinned_dropout)
        fl_dropout_set_step(pinned_dropout, 7);
    CHECK_OK(fl_net_forward(net, x, train_mode, &y));
    if (!y)
        return NAN;
    double l = 0;
    for (int64_t i = 0; i < y->numel; i++)
        l += r[i] * ((const double *)y->data)[i];
    return l;
}

static double numeric(fl_net *net, const fl_tensor *x, const double *r, double *v, int64_t i) {
    double keep = v[i];
    v[i] = keep + EPS;
    double lp = proj_loss(net, x, r);
    v[i] = keep - EPS;
    double lm = proj_loss(net, x, r);
    v[i] = keep;
    return (lp - lm) / (2 * EPS);
}

/* Builds net (f64) for samples in_shape, checks d L / d params through fl_net_backward (every
 * parameter, or `stride`-spaced ones) and, when the net has one layer, d L / d x through the
 * layer's own backward. */
static void gradcheck(const char *what, fl_net *net, int in_ndim, const int64_t *in_shape,
                      int64_t batch, int64_t stride) {
    char label[160];
    CHECK_OK(fl_net_build(net, in_ndim, in_shape, batch, 42));
    int64_t xshape[FL_MAX_DIMS] = {batch};
    memcpy(xshape + 1, in_shape, (size_t)in_ndim * sizeof *in_shape);
    int64_t nx = fl_shape_numel(in_ndim + 1, xshape);
    double *xd = malloc((size_t)nx * sizeof *xd);
    for (int64_t i = 0; i < nx; i++)
        xd[i] = uniform(-1, 1);
    fl_tensor x;
    fl_tensor_view(&x, FL_DTYPE_F64, in_ndim + 1, xshape, xd);
    /* non-trivial batch-norm parameters, so that gamma and beta matter */
    for (int i = 0; i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        if (strstr(p->name, "bn") && p->trainable)
            for (int64_t j = 0; j < p->value.numel; j++)
                ((double *)p->value.data)[j] += uniform(-0.3, 0.3);
        if (strstr(p->name, "running_var"))
            for (int64_t j = 0; j < p->value.numel; j++)
                ((double *)p->value.data)[j] = uniform(0.5, 2);
    }
    const fl_tensor *y = NULL;
    if (pinned_dropout)
        fl_dropout_set_step(pinned_dropout, 7);
    CHECK_OK(fl_net_forward(net, &x, train_mode, &y));
    if (!y)
        return;
    int64_t ny = y->numel;
    double *r = malloc((size_t)ny * sizeof *r);
    for (int64_t i = 0; i < ny; i++)
        r[i] = uniform(-1, 1);
    fl_tensor dy;
    fl_tensor_view(&dy, FL_DTYPE_F64, y->ndim, y->shape, r);
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    int64_t np = fl_net_numel(net), nc = 0;
    double *g = malloc((size_t)(np + 1) * sizeof *g), *gnum = malloc((size_t)(np + 1) * 8);
    double *w = fl_net_flat_params(net), *grads = fl_net_flat_grads(net);
    for (int64_t i = 0; i < np; i += stride, nc++) {
        g[nc] = grads[i];
        gnum[nc] = numeric(net, &x, r, w, i);
    }
    snprintf(label, sizeof label, "%s [%s] d/dparams", what, fl_net_backend(net)->name);
    CHECK_CLOSE(label, g, gnum, nc, ATOL, RTOL);
    if (fl_net_num_layers(net) == 1) {
        fl_layer *l = fl_net_layer(net, 0);
        double *dxd = malloc((size_t)nx * sizeof *dxd), *dxnum = malloc((size_t)nx * 8);
        fl_tensor dx;
        fl_tensor_view(&dx, FL_DTYPE_F64, in_ndim + 1, xshape, dxd);
        if (pinned_dropout)
            fl_dropout_set_step(pinned_dropout, 7);
        CHECK_OK(fl_net_forward(net, &x, train_mode, &y));
        CHECK_OK(l->ops->backward(l, &x, y, &dy, &dx, false));
        for (int64_t i = 0; i < nx; i++)
            dxnum[i] = numeric(net, &x, r, xd, i);
        snprintf(label, sizeof label, "%s [%s] d/dx", what, fl_net_backend(net)->name);
        CHECK_CLOSE(label, dxd, dxnum, nx, ATOL, RTOL);
        free(dxd), free(dxnum);
    }
    free(xd), free(r), free(g), free(gnum);
    fl_net_free(net);
}

static fl_net *one(const fl_backend *k, fl_layer *l) {
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    CHECK(l != NULL);
    CHECK_OK(fl_net_add(net, l));
    return net;
}

static void test_conv(const fl_backend *k) {
    int64_t s1[] = {3, 6, 5}, s2[] = {4, 7, 7};
    gradcheck("conv 3x3 pad 1 bias", one(k, fl_conv2d_create("conv", &(fl_conv2d_opts){
              .in_channels = 3, .out_channels = 2, .kh = 3, .kw = 3, .ph = 1, .pw = 1,
              .bias = true})), 3, s1, 2, 1);
    gradcheck("conv 3x2 stride (2,1) pad (1,0) dilation (1,2)", one(k, fl_conv2d_create("conv",
              &(fl_conv2d_opts){.in_channels = 3, .out_channels = 2, .kh = 3, .kw = 2, .sh = 2,
              .ph = 1, .dw = 2})), 3, s1, 2, 1);
    gradcheck("conv groups 2 stride 2", one(k, fl_conv2d_create("conv", &(fl_conv2d_opts){
              .in_channels = 4, .out_channels = 6, .kh = 3, .kw = 3, .sh = 2, .sw = 2, .ph = 1,
              .pw = 1, .groups = 2, .bias = true})), 3, s2, 2, 1);
    gradcheck("conv 1x1", one(k, fl_conv2d_create("conv", &(fl_conv2d_opts){.in_channels = 3,
              .out_channels = 4, .kh = 1, .kw = 1, .bias = true})), 3, s1, 3, 1);
    /* stride 1: dx as a convolution with the flipped kernel (dilated; asymmetric kernel), and
     * the col2im fallback when the padding exceeds the dilated kernel */
    gradcheck("conv 3x2 dilation 2 pad (1,2) (dx by flipped kernel)", one(k, fl_conv2d_create(
              "conv", &(fl_conv2d_opts){.in_channels = 2, .out_channels = 3, .kh = 3, .kw = 2,
              .ph = 1, .pw = 2, .dh = 2, .dw = 2})), 3, (int64_t[]){2, 6, 5}, 2, 1);
    gradcheck("conv 3x3 pad 3 (col2im fallback)", one(k, fl_conv2d_create("conv",
              &(fl_conv2d_opts){.in_channels = 3, .out_channels = 2, .kh = 3, .kw = 3, .ph = 3,
              .pw = 3})), 3, s1, 2, 1);
    /* more images than slots: dW partials of 1 and 2 images added */
    gradcheck("conv batch 11", one(k, fl_conv2d_create("conv", &(fl_conv2d_opts){
              .in_channels = 2, .out_channels = 2, .kh = 3, .kw = 3, .ph = 1, .pw = 1})), 3,
              (int64_t[]){2, 3, 3}, 11, 1);
    gradcheck("conv 1x1 batch 10", one(k, fl_conv2d_create("conv", &(fl_conv2d_opts){
              .in_channels = 2, .out_channels = 3, .kh = 1, .kw = 1})), 3,
              (int64_t[]){2, 2, 3}, 10, 1);
}

static void test_bn(const fl_backend *k) {
    int64_t s[] = {3, 4, 5}, flat[] = {4};
    gradcheck("batch_norm train", one(k, fl_batch_norm_create("bn", 3, FL_ACT_NONE)), 3, s, 3, 1);
    gradcheck("batch_norm train relu", one(k, fl_batch_norm_create("bn", 3, FL_ACT_RELU)), 3, s, 3, 1);
    gradcheck("batch_norm train hardswish",
              one(k, fl_batch_norm_create("bn", 3, FL_ACT_HARDSWISH)), 3, s, 3, 1);
    gradcheck("batch_norm (B, C) train", one(k, fl_batch_norm_create("bn", 4, FL_ACT_NONE)), 1, flat,
              5, 1);
    train_mode = false;
    gradcheck("batch_norm eval", one(k, fl_batch_norm_create("bn", 3, FL_ACT_NONE)), 3, s, 2, 1);
    gradcheck("batch_norm eval relu", one(k, fl_batch_norm_create("bn", 3, FL_ACT_RELU)), 3, s, 2, 1);
    gradcheck("batch_norm eval hardswish",
              one(k, fl_batch_norm_create("bn", 3, FL_ACT_HARDSWISH)), 3, s, 2, 1);
    CHECK(fl_batch_norm_create("bn", 3, FL_ACT_TANH) == NULL);
    CHECK_MSG("fuses relu or hardswish, not tanh");
    train_mode = true;
}

static void test_pool(const fl_backend *k) {
    int64_t s[] = {2, 7, 6};
    gradcheck("max_pool 3 stride 2 pad 1", one(k, fl_pool2d_create("p", FL_POOL_MAX, 3, 2, 1)),
              3, s, 2, 1);
    gradcheck("max_pool 2", one(k, fl_pool2d_create("p", FL_POOL_MAX, 2, 0, 0)), 3, s, 2, 1);
    gradcheck("avg_pool 3 stride 2 pad 1", one(k, fl_pool2d_create("p", FL_POOL_AVG, 3, 2, 1)),
              3, s, 2, 1);
    gradcheck("global_avg_pool", one(k, fl_global_avg_pool_create("gap")), 3, s, 3, 1);
}

static void test_misc(const fl_backend *k) {
    int64_t s[] = {2, 5, 4}, s3[] = {3, 5, 5};
    fl_layer *d = fl_dropout_create("drop", 0.4, 99);
    pinned_dropout = d;
    gradcheck("dropout p 0.4 (fixed mask)", one(k, d), 3, s, 2, 1);
    pinned_dropout = NULL;
    gradcheck("shortcut_pad 2 -> 4 stride 2", one(k, fl_shortcut_pad_create("sc", 4, 2)), 3, s,
              2, 1);
    gradcheck("shortcut_pad 3 -> 8 stride 2 (odd sizes)", one(k, fl_shortcut_pad_create("sc", 8,
              2)), 3, s3, 2, 1);

    /* a residual block: y = relu(bn2(conv2(relu(bn1(conv1(x))))) + conv0(x)), conv0's output
     * feeding two layers (gradient summation), then a pooled head */
    fl_net *net = fl_net_create(FL_DTYPE_F64, k);
    fl_conv2d_opts c3 = {.in_channels = 3, .out_channels = 3, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv0", &c3)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv1", &c3)));
    CHECK_OK(fl_net_add(net, fl_batch_norm_create("bn1", 3, FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv2", &c3)));
    CHECK_OK(fl_net_add(net, fl_batch_norm_create("bn2", 3, FL_ACT_NONE)));
    CHECK(fl_net_add2(net, fl_add_create("add", true), 4, 0) == 5);
    CHECK(fl_net_add_from(net, fl_pool2d_create("pool", FL_POOL_MAX, 2, 0, 0), 5) == 6);
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 3 * 2 * 2, 3, true)));
    gradcheck("residual block (add, summed gradients)", net, 3, (int64_t[]){3, 4, 5}, 3, 1);

    /* the add reading the network input (whose gradient is not needed) and an output read by
     * two adds and a conv (two summed into scratch) */
    net = fl_net_create(FL_DTYPE_F64, k);
    fl_conv2d_opts c2 = {.in_channels = 2, .out_channels = 2, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv0", &c2)));                  // 0
    CHECK(fl_net_add2(net, fl_add_create("add1", false), 0, FL_NET_INPUT) == 1); // 1
    CHECK(fl_net_add_from(net, fl_conv2d_create("conv1", &c2), 0) == 2);         // 2
    CHECK(fl_net_add2(net, fl_add_create("add2", true), 2, 0) == 3);             // 3
    CHECK(fl_net_add2(net, fl_add_create("add3", false), 3, 1) == 4);            // 4
    gradcheck("graph: output read three times", net, 3, (int64_t[]){2, 3, 3}, 2, 1);
}

/* running statistics, inference mode, dropout statistics */
static void test_bn_stats(void) {
    enum { B = 4, C = 2, HW = 6 };
    fl_net *net = one(fl_backend_cpu(), fl_batch_norm_create("bn", C, FL_ACT_NONE));
    CHECK_OK(fl_net_build(net, 2, (int64_t[]){C, HW}, B, 1));
    double xd[B * C * HW];
    for (int i = 0; i < B * C * HW; i++)
        xd[i] = uniform(-2, 3);
    fl_tensor x;
    fl_tensor_view(&x, FL_DTYPE_F64, 3, (int64_t[]){B, C, HW}, xd);
    const fl_tensor *y;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    const double *rm = fl_net_find_param(net, "bn.running_mean")->value.data;
    const double *rv = fl_net_find_param(net, "bn.running_var")->value.data;
    CHECK(!fl_net_find_param(net, "bn.running_mean")->trainable);
    for (int c = 0; c < C; c++) {
        double m = 0, v = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++)
                m += xd[(b * C + c) * HW + i];
        m /= B * HW;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < HW; i++)
                v += pow(xd[(b * C + c) * HW + i] - m, 2);
        CHECK_NEAR(rm[c], 0.1 * m, 1e-12);                          // 0.9 * 0 + 0.1 * mean
        CHECK_NEAR(rv[c], 0.9 + 0.1 * v / (B * HW - 1), 1e-12);     // unbiased variance
        /* training output: normalised with the biased variance, gamma 1, beta 0 */
        double y0 = ((const double *)y->data)[c * HW];
        CHECK_NEAR(y0, (xd[c * HW] - m) / sqrt(v / (B * HW) + 1e-5), 1e-10);
    }
    CHECK_OK(fl_net_forward(net, &x, false, &y)); // inference: running statistics
    for (int c = 0; c < C; c++)
        CHECK_NEAR(((const double *)y->data)[c * HW], (xd[c * HW] - rm[c]) / sqrt(rv[c] + 1e-5),
                   1e-12);
    fl_net_free(net);

    /* dropout: about p dropped, kept ones scaled by 1 / (1 - p), same step same mask,
     * another step another mask, inference the identity */
    enum { N = 20000 };
    fl_layer *d = fl_dropout_create("drop", 0.3, 5);
    net = one(fl_backend_cpu(), d);
    CHECK_OK(fl_net_build(net, 1, (int64_t[]){N}, 1, 1));
    float *xf = malloc(N * sizeof *xf), *first = malloc(N * sizeof *first);
    for (int i = 0; i < N; i++)
        xf[i] = 1.0f + (float)i / N;
    fl_tensor xt;
    fl_tensor_view(&xt, FL_DTYPE_F32, 2, (int64_t[]){1, N}, xf);
    fl_net_free(net);
    net = fl_net_create(FL_DTYPE_F32, NULL);
    d = fl_dropout_create("drop", 0.3, 5);
    CHECK_OK(fl_net_add(net, d));
    CHECK_OK(fl_net_build(net, 1, (int64_t[]){N}, 1, 1));
    CHECK_OK(fl_net_forward(net, &xt, true, &y));
    int dropped = 0, bad = 0;
    for (int i = 0; i < N; i++) {
        float v = ((const float *)y->data)[i];
        first[i] = v;
        dropped += v == 0;
        bad += v != 0 && fabsf(v - xf[i] / 0.7f) > 1e-6f;
    }
    CHECK(bad == 0);
    CHECK(fabs((double)dropped / N - 0.3) < 0.015);
    CHECK_OK(fl_net_forward(net, &xt, true, &y)); // step 1: a different mask
    int same = 0;
    for (int i = 0; i < N; i++)
        same += (((const float *)y->data)[i] == 0) == (first[i] == 0);
    CHECK(same < N * 0.7);
    fl_dropout_set_step(d, 0); // step 0 again: the first mask
    CHECK_OK(fl_net_forward(net, &xt, true, &y));
    CHECK(memcmp(y->data, first, N * sizeof(float)) == 0);
    CHECK_OK(fl_net_forward(net, &xt, false, &y));
    CHECK(memcmp(y->data, xf, N * sizeof(float)) == 0);
    CHECK(fl_dropout_create("d", 1.0, 0) == NULL);
    CHECK_MSG("d: dropout probability 1");
    free(xf), free(first);
    fl_net_free(net);
}

/* label smoothing: loss = mean -sum q log p; gradient vs finite differences */
static void test_label_smoothing(const fl_backend *k) {
    enum { B = 3, C = 5 };
    double lg[B * C], pr[B * C], d[B * C], dnum[B * C];
    int32_t labels[B] = {4, 0, 2};
    for (int i = 0; i < B * C; i++)
        lg[i] = uniform(-4, 4);
    int64_t shape[] = {B, C};
    fl_tensor logits, probs, dl;
    fl_tensor_view(&logits, FL_DTYPE_F64, 2, shape, lg);
    fl_tensor_view(&probs, FL_DTYPE_F64, 2, shape, pr);
    fl_tensor_view(&dl, FL_DTYPE_F64, 2, shape, d);
    const double e = 0.1;
    double loss = 0, want = 0;
    CHECK_OK(fl_softmax_xent_smooth_forward(k, &logits, labels, e, &probs, &loss));
    for (int r = 0; r < B; r++) {
        double s = 0;
        for (int j = 0; j < C; j++)
            s += exp(lg[r * C + j]);
        for (int j = 0; j < C; j++) {
            double q = (j == labels[r] ? 1 - e : 0) + e / C;
            want -= q * (lg[r * C + j] - log(s)) / B;
        }
    }
    CHECK_NEAR(loss, want, 1e-12);
    CHECK_OK(fl_softmax_xent_smooth_backward(k, &probs, labels, e, &dl));
    for (int i = 0; i < B * C; i++) {
        double keep = lg[i], lp, lm;
        lg[i] = keep + EPS;
        CHECK_OK(fl_softmax_xent_smooth_forward(k, &logits, labels, e, &probs, &lp));
        lg[i] = keep - EPS;
        CHECK_OK(fl_softmax_xent_smooth_forward(k, &logits, labels, e, &probs, &lm));
        lg[i] = keep;
        dnum[i] = (lp - lm) / (2 * EPS);
    }
    char label[64];
    snprintf(label, sizeof label, "label smoothing 0.1 [%s] d/dlogits", k->name);
    CHECK_CLOSE(label, d, dnum, B * C, ATOL, RTOL);
    /* epsilon 0 is the plain loss; epsilon out of range fails */
    double plain = 0, zero = 0;
    CHECK_OK(fl_softmax_xent_forward(k, &logits, labels, &probs, &plain));
    CHECK_OK(fl_softmax_xent_smooth_forward(k, &logits, labels, 0.0, &probs, &zero));
    CHECK(plain == zero);
    CHECK_RC(fl_softmax_xent_smooth_forward(k, &logits, labels, 1.0, &probs, &zero), FL_EINVAL);
    CHECK_MSG("epsilon 1 is outside [0, 1)");
    /* huge logits: no overflow (computed from logits, not from log p) */
    lg[0] = 1e4;
    CHECK_OK(fl_softmax_xent_smooth_forward(k, &logits, labels, e, &probs, &loss));
    CHECK(isfinite(loss));
}

static int hook_calls;
static char hook_last[96];
static void hook(void *ctx, fl_param *p) {
    (void)ctx;
    hook_calls++;
    snprintf(hook_last, sizeof hook_last, "%s", p->name);
}

static void test_graph_api(void) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_RC(fl_net_add_from(net, fl_add_create("add", false), FL_NET_INPUT), FL_EINVAL);
    CHECK_MSG("add: a add layer takes two inputs");
    CHECK_RC(fl_net_add2(net, fl_batch_norm_create("bn", 2, FL_ACT_NONE), -1, -1), FL_EINVAL);
    CHECK_MSG("bn: a batch_norm layer takes one input");
    CHECK_RC(fl_net_add_from(net, fl_batch_norm_create("bn", 2, FL_ACT_NONE), 3), FL_EINVAL);
    CHECK_MSG("bn: input 3 is not the network input");
    CHECK(fl_net_add_from(net, fl_batch_norm_create("bn", 2, FL_ACT_NONE), FL_NET_INPUT) == 0);
    CHECK(fl_net_add_from(net, fl_pool2d_create("pool", FL_POOL_MAX, 2, 0, 0), FL_NET_INPUT) ==
          1);
    CHECK(fl_net_add2(net, fl_add_create("add", false), 0, 1) == 2);
    CHECK_RC(fl_net_build(net, 3, (int64_t[]){2, 4, 4}, 2, 1), FL_ESHAPE);
    CHECK_MSG("add: inputs (2, 4, 4) and (2, 2, 2) differ in shape");
    fl_net_free(net);
    net = fl_net_create(FL_DTYPE_F32, NULL);
    CHECK_OK(fl_net_add(net, fl_batch_norm_create("bn1", 2, FL_ACT_NONE)));
    CHECK(fl_net_add_from(net, fl_batch_norm_create("bn2", 2, FL_ACT_NONE), FL_NET_INPUT) == 1);
    CHECK_RC(fl_net_build(net, 3, (int64_t[]){2, 4, 4}, 2, 1), FL_ESHAPE);
    CHECK_MSG("bn1: its output feeds no layer");
    fl_net_free(net);

    /* accumulate doubles the gradient; the hook sees every trainable parameter once */
    net = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 3, 'B');
    CHECK(net != NULL);
    CHECK_OK(fl_net_build(net, 3, (int64_t[]){3, 8, 8}, 2, 1));
    float xd[2 * 3 * 8 * 8], dyd[2 * 3];
    for (int i = 0; i < 2 * 3 * 8 * 8; i++)
        xd[i] = (float)uniform(-1, 1);
    for (int i = 0; i < 6; i++)
        dyd[i] = (float)uniform(-1, 1);
    fl_tensor x, dy;
    fl_tensor_view(&x, FL_DTYPE_F32, 4, (int64_t[]){2, 3, 8, 8}, xd);
    fl_tensor_view(&dy, FL_DTYPE_F32, 2, (int64_t[]){2, 3}, dyd);
    const fl_tensor *y;
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK_OK(fl_net_backward(net, &dy, hook, NULL));
    int trainable = 0;
    for (int i = 0; i < fl_net_num_params(net); i++)
        trainable += fl_net_param(net, i)->trainable;
    CHECK(hook_calls == trainable);
    CHECK(strcmp(hook_last, "conv1.weight") == 0);
    int64_t n = fl_net_numel(net);
    float *once = malloc((size_t)n * sizeof *once);
    memcpy(once, fl_net_flat_grads(net), (size_t)n * sizeof *once);
    fl_net_set_accumulate(net, true);
    CHECK_OK(fl_net_forward(net, &x, true, &y));
    CHECK_OK(fl_net_backward(net, &dy, NULL, NULL));
    int off = 0;
    const float *twice = fl_net_flat_grads(net);
    for (int64_t i = 0; i < n; i++)
        off += fabsf(twice[i] - 2 * once[i]) > 1e-5f * (1 + fabsf(once[i]));
    CHECK(off == 0);
    free(once);
    fl_net_free(net);
}

int main(void) {
    fl_rng_init(&rng, 2026, 9);
    const fl_backend *tables[] = {fl_backend_cpu(), fl_backend_ref()};
    for (int t = 0; t < 2; t++) {
        test_conv(tables[t]);
        test_bn(tables[t]);
        test_pool(tables[t]);
        test_misc(tables[t]);
        test_label_smoothing(tables[t]);
    }
    test_bn_stats();
    test_graph_api();
    TEST_DONE();
}
