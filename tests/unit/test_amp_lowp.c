/* test_amp_lowp.c - mixed precision with activations really in f16 / bf16 (fl_net_set_amp_native,
 * docs/amp.md "Real f16 / bf16") on the ref table, whose low ops are its own reference
 * (test_ref_lowp.c): an MLP (fc, tanh), ResNet-8 at 8 x 8 (conv, batch norm with its ReLU,
 * the option-A shortcut, the residual add, global average pooling, fc) and a squeeze-and-
 * excitation block concatenated with its input (channel_mul, concat), in both dtypes. The
 * native step's loss and gradients follow the emulation's (the same network on the ref table
 * with low_dtypes off) and, more loosely, the f32 network's; accumulation sums; recompute is
 * bit-identical; an f16 loss-scale overflow shows as in the emulation; activations take half
 * the bytes; a table without low dtypes keeps the emulation bit for bit.
 *
 * Tolerances, from the dtype's unit roundoff u (2^-11 for f16, 2^-8 for bf16) and R, the
 * roundings to the low dtype on the longest path through the step (each low layer's output in
 * forward, and each low layer's input gradient in backward: R = 2 x the low layers). Native and
 * emulated steps round the same white outputs; they differ by the gray outputs the native step
 * also rounds (at most u relative each), the bias fc rounds with its output rather than before,
 * and f32 against exact sums: so each value differs by at most about R u relative, and the
 * relative L2 distance of the gradient vectors is held to R u (errors of random sign add as
 * sqrt(R) u, so this bound has room; the loss to R u too). Against the f32 network every value
 * of the emulation's own gradient is already u-perturbed through R roundings plus the low
 * weights: held to 4 R u. */
#include "test.h"

#include "fleet/nn.h"
#include "fleet/status.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { B = 4 };

/* The ref table with its low dtypes switched off: fl_net_set_amp emulates on it. */
static fl_backend emu_table;

static double unit_roundoff(fl_dtype t) { return t == FL_DTYPE_F16 ? 0x1p-11 : 0x1p-8; }

typedef enum { KIND_MLP, KIND_RESNET, KIND_SE } kind;

typedef struct {
    kind        kind;
    int         ndim;
    int64_t     in[3];
    int64_t     classes;
    const char *name;
} model;

static const model MLP = {KIND_MLP, 1, {10}, 3, "mlp"};
static const model CNN = {KIND_RESNET, 3, {3, 8, 8}, 10, "resnet8"};
static const model SE = {KIND_SE, 3, {3, 8, 8}, 5, "se"};

/* A squeeze-and-excitation block as PP-LCNet's SEModule (a sigmoid gate here), its output
 * concatenated with its input as PP-HGNet's aggregation does: conv 3x3, relu, adaptive average
 * pool, 1x1 conv, relu, 1x1 conv, sigmoid, channel_mul (relu, sigmoid), concat (channel_mul,
 * relu), global average pool, fc. Every layer is white or fed by low ones only, so channel_mul
 * and concat run low; the relu's output is read three times. */
static fl_net *model_se(int64_t classes) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, NULL);
    fl_conv2d_opts c0 = {.in_channels = 3, .out_channels = 8, .kh = 3, .kw = 3, .ph = 1,
                         .pw = 1, .bias = true};
    fl_conv2d_opts c1 = {.in_channels = 8, .out_channels = 4, .kh = 1, .kw = 1, .bias = true};
    fl_conv2d_opts c2 = {.in_channels = 4, .out_channels = 8, .kh = 1, .kw = 1, .bias = true};
    CHECK_OK(fl_net_add(net, fl_conv2d_create("conv", &c0)));
    CHECK_OK(fl_net_add(net, fl_activation_create("relu", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_adaptive_avg_pool_create("se.pool")));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("se.conv1", &c1)));
    CHECK_OK(fl_net_add(net, fl_activation_create("se.relu", FL_ACT_RELU)));
    CHECK_OK(fl_net_add(net, fl_conv2d_create("se.conv2", &c2)));
    CHECK_OK(fl_net_add(net, fl_activation_create("se.gate", FL_ACT_SIGMOID)));
    CHECK(fl_net_add2(net, fl_channel_mul_create("se.mul"), 1, 6) == 7);
    CHECK(fl_net_add2(net, fl_concat_create("cat"), 7, 1) == 8);
    CHECK_OK(fl_net_add(net, fl_global_avg_pool_create("pool")));
    CHECK_OK(fl_net_add(net, fl_fc_create("fc", 16, classes, true)));
    return net;
}

/* The model on table k, built with one seed (so every variant starts from the same weights);
 * recompute "auto" when asked; amp: low (F32: off), native or emulated. */
static fl_net *make(const model *m, const fl_backend *k, bool recompute, fl_dtype low,
                    bool native) {
    int64_t hidden[] = {32, 24};
    fl_net *net = m->kind == KIND_SE ? model_se(m->classes)
                  : m->kind == KIND_RESNET
                      ? fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, m->classes, 'A')
                      : fl_model_mlp(FL_DTYPE_F32, 10, hidden, 2, FL_ACT_TANH, m->classes);
    CHECK(net != NULL);
    fl_net_set_backend(net, k);
    if (recompute)
        CHECK_OK(fl_net_set_recompute(net, "auto"));
    CHECK_OK(fl_net_build(net, m->ndim, m->in, B, 5));
    CHECK_OK(fl_net_set_amp_native(net, native));
    CHECK_OK(fl_net_set_amp(net, low, "conv2d,fc"));
    return net;
}

static int64_t in_numel(const model *m) { return B * m->in[0] * (m->ndim == 3 ? m->in[1] * m->in[2] : 1); }

/* One forward and backward of batch `seed` (inputs and labels derived from it); the loss, and
 * the gradient block copied into g. */
static double step(const model *m, fl_net *net, int seed, float *g) {
    const fl_backend *k = fl_net_backend(net);
    int64_t n = in_numel(m), xs[4] = {B, m->in[0], m->in[1], m->in[2]}, ps[2] = {B, m->classes};
    float *x = malloc((size_t)n * sizeof *x), pmem[B * 16];
    int32_t labels[B];
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(1.3 * sin(0.37 * (double)i + 0.7 * seed + 0.1));
    for (int i = 0; i < B; i++)
        labels[i] = (int32_t)((i + seed) % m->classes);
    fl_tensor xt, probs;
    fl_tensor_view(&xt, FL_DTYPE_F32, m->ndim + 1, xs, x);
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, ps, pmem);
    const fl_tensor *logits;
    double loss = NAN;
    CHECK_OK(fl_net_forward(net, &xt, true, &logits));
    CHECK(logits->dtype == FL_DTYPE_F32);
    CHECK_OK(fl_softmax_xent_forward(k, logits, labels, &probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(k, &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    memcpy(g, fl_net_flat_grads(net), (size_t)fl_net_numel(net) * sizeof *g);
    free(x);
    return loss;
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const float *b, int64_t n) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static void check_rel(const char *what, const model *m, fl_dtype t, double got, double tol) {
    if (!(got <= tol)) {
        fprintf(stderr, "FAIL %s %s %s: relative difference %.3g above %.3g\n", m->name,
                fl_dtype_name(t), what, got, tol);
        test_failures++;
    }
}

static int low_layers(fl_net *net) {
    int n = 0;
    for (int i = 0; i < fl_net_num_layers(net); i++)
        n += fl_net_amp_low(net, i);
    return n;
}

/* (1), (2), (6): native against emulated and f32, and the activation bytes */
static void test_follow(const model *m, fl_dtype t) {
    fl_net *f32 = make(m, fl_backend_ref(), false, FL_DTYPE_F32, false);
    fl_net *emu = make(m, &emu_table, false, t, true);
    fl_net *nat = make(m, fl_backend_ref(), false, t, true);
    int64_t n = fl_net_numel(nat);
    float *g32 = malloc((size_t)n * sizeof *g32), *ge = malloc((size_t)n * sizeof *ge);
    float *gn = malloc((size_t)n * sizeof *gn);
    /* every layer runs low: white conv / fc, and every gray one is fed by them (the input,
     * f32, reaches only the first convolution or fc, which converts it) */
    int nl = fl_net_num_layers(nat), lows = low_layers(nat);
    CHECK(lows == nl && low_layers(emu) == 0);
    double u = unit_roundoff(t), r = 2.0 * lows;
    double l32 = step(m, f32, 1, g32), le = step(m, emu, 1, ge), ln = step(m, nat, 1, gn);
    /* kappa: how far this network's gradient moves per rounding, from the emulation's own
     * distance to f32 over its 2 x whites roundings (at least 1) */
    int whites = 0;
    for (int i = 0; i < nl; i++)
        whites += fl_net_amp_white(emu, i);
    double kappa = fmax(1.0, rel_l2(ge, g32, n) / (2.0 * whites * u));
    check_rel("loss vs emulation", m, t, fabs(ln - le) / fabs(le), r * u);
    check_rel("gradients vs emulation", m, t, rel_l2(gn, ge, n), r * u * kappa);
    check_rel("loss vs f32", m, t, fabs(ln - l32) / fabs(l32), 2 * r * u);
    check_rel("gradients vs f32", m, t, rel_l2(gn, g32, n), 2 * r * u * kappa);
    if (getenv("FLEET_TEST_VERBOSE"))
        printf("%s %s: R %g, kappa %.2f; loss %.3g, gradients %.3g from the emulation; %.3g, "
               "%.3g from f32\n", m->name, fl_dtype_name(t), r, kappa, fabs(ln - le) / fabs(le),
               rel_l2(gn, ge, n), fabs(ln - l32) / fabs(l32), rel_l2(gn, g32, n));
    /* not trivially equal: the native step really computed in the low dtype */
    CHECK(rel_l2(gn, g32, n) > 0 && rel_l2(gn, ge, n) > 0);
    /* (6) 2-byte outputs and output gradients: half the f32 bytes (64-byte rounding aside) */
    double ratio = (double)fl_net_activation_bytes(nat) / (double)fl_net_activation_bytes(f32);
    CHECK(ratio >= 0.5 && ratio <= 0.53);
    if (!(ratio >= 0.5 && ratio <= 0.53))
        fprintf(stderr, "%s %s: activation bytes ratio %.3f\n", m->name, fl_dtype_name(t), ratio);
    CHECK(fl_net_activation_bytes(emu) == fl_net_activation_bytes(f32));
    /* amp off again: activations back in f32, the f32 network's step bit for bit */
    CHECK_OK(fl_net_set_amp(nat, FL_DTYPE_F32, NULL));
    CHECK(fl_net_activation_bytes(nat) == fl_net_activation_bytes(f32) && low_layers(nat) == 0);
    step(m, nat, 1, gn);
    CHECK_CLOSE_F32("native, then off", gn, g32, n, 0, 0);
    free(g32);
    free(ge);
    free(gn);
    fl_net_free(f32);
    fl_net_free(emu);
    fl_net_free(nat);
}

/* (3) two backwards into one gradient = the sum of each alone (added in f32: within one f32
 * rounding of the sum, 2^-23 of the larger addend, as batch norm's and the biases' f32 sums
 * round after adding the old value and fc's and conv's add an f32-converted gradient);
 * (4) recompute gives the same bits */
static void test_merge_recompute(const model *m, fl_dtype t) {
    fl_net *nat = make(m, fl_backend_ref(), false, t, true);
    fl_net *rc = make(m, fl_backend_ref(), true, t, true);
    int64_t n = fl_net_numel(nat);
    float *g1 = malloc((size_t)n * sizeof *g1), *g2 = malloc((size_t)n * sizeof *g2);
    float *gs = malloc((size_t)n * sizeof *gs), *gr = malloc((size_t)n * sizeof *gr);
    step(m, nat, 2, g1);
    step(m, nat, 3, g2);
    fl_net_set_accumulate(nat, false);
    step(m, nat, 2, gs);
    fl_net_set_accumulate(nat, true);
    step(m, nat, 3, gs);
    fl_net_set_accumulate(nat, false);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        double big = fmax(fabs(g1[i]), fabs(g2[i]));
        if (!(fabs((double)gs[i] - ((double)g1[i] + g2[i])) <= 0x1p-23 * big))
            bad = i;
    }
    if (bad >= 0) {
        fprintf(stderr, "FAIL %s %s accumulation: [%lld] %.9g, not %.9g + %.9g\n", m->name,
                fl_dtype_name(t), (long long)bad, gs[bad], g1[bad], g2[bad]);
        test_failures++;
    }
    /* recompute: the network with "auto" checkpoints against the same one without */
    CHECK(fl_net_activation_bytes(rc) < fl_net_activation_bytes(nat));
    step(m, nat, 4, g1);
    step(m, rc, 4, gr);
    CHECK_CLOSE_F32("recompute, native low", gr, g1, n, 0, 0);
    free(g1);
    free(g2);
    free(gs);
    free(gr);
    fl_net_free(nat);
    fl_net_free(rc);
}

/* Edges: x read by two low fc (their input gradients converted to f32 and summed into the
 * network's input gradient) and by a concat of both fc and x, which stays f32 (gray, and x is
 * f32) between them and the next fc (low -> f32 -> low in forward, back in backward), an output
 * read twice. */
static const model BRANCHY = {false, 1, {10}, 3, "branchy"};

static fl_net *make_branchy(const fl_backend *k, fl_dtype low, bool native) {
    fl_net *net = fl_net_create(FL_DTYPE_F32, k);
    int64_t in[] = {10};
    CHECK(fl_net_add_from(net, fl_fc_create("fa", 10, 16, true), FL_NET_INPUT) == 0);
    CHECK(fl_net_add_from(net, fl_fc_create("fb", 10, 16, true), FL_NET_INPUT) == 1);
    int cat_in[] = {0, 1, FL_NET_INPUT};
    CHECK(fl_net_add_n(net, fl_concat_create("cat"), 3, cat_in) == 2);
    CHECK_OK(fl_net_add(net, fl_fc_create("fo", 42, 12, true)));
    CHECK_OK(fl_net_add(net, fl_activation_create("t", FL_ACT_TANH)));
    CHECK(fl_net_add2(net, fl_add_create("res", false), 4, 3) == 5);
    CHECK_OK(fl_net_add(net, fl_fc_create("out", 12, 3, true)));
    CHECK_OK(fl_net_set_input_grad(net, true));
    CHECK_OK(fl_net_build(net, 1, in, B, 5));
    CHECK_OK(fl_net_set_amp_native(net, native));
    CHECK_OK(fl_net_set_amp(net, low, "fc"));
    return net;
}

static void test_edges(fl_dtype t) {
    const model *m = &BRANCHY;
    fl_net *f32 = make_branchy(fl_backend_ref(), FL_DTYPE_F32, false);
    fl_net *emu = make_branchy(&emu_table, t, true), *nat = make_branchy(fl_backend_ref(), t, true);
    const bool want_low[] = {true, true, false, true, true, true, true};
    for (int i = 0; i < 7; i++)
        CHECK(fl_net_amp_low(nat, i) == want_low[i]);
    int64_t n = fl_net_numel(nat), nx = B * 10;
    float *g = malloc((size_t)3 * (size_t)(n + nx) * sizeof *g);
    float *g32 = g, *ge = g + n + nx, *gn = ge + n + nx; /* gradients, then the input's */
    fl_net *nets[3] = {f32, emu, nat};
    float *gs[3] = {g32, ge, gn};
    double loss[3];
    for (int r = 0; r < 3; r++) {
        loss[r] = step(m, nets[r], 1, gs[r]);
        memcpy(gs[r] + n, fl_net_input_grad(nets[r])->data, (size_t)nx * sizeof *g);
    }
    int whites = 0;
    for (int i = 0; i < 7; i++)
        whites += fl_net_amp_white(emu, i);
    CHECK(whites == 4);
    double u = unit_roundoff(t), r = 2.0 * 6;
    double kappa = fmax(1.0, rel_l2(ge, g32, n + nx) / (2.0 * whites * u));
    check_rel("loss vs emulation", m, t, fabs(loss[2] - loss[1]) / fabs(loss[1]), r * u);
    check_rel("gradients vs emulation", m, t, rel_l2(gn, ge, n), r * u * kappa);
    check_rel("input gradient vs emulation", m, t, rel_l2(gn + n, ge + n, nx), r * u * kappa);
    check_rel("input gradient vs f32", m, t, rel_l2(gn + n, g32 + n, nx), 2 * r * u * kappa);
    CHECK(rel_l2(gn + n, ge + n, nx) > 0);
    free(g);
    fl_net_free(f32);
    fl_net_free(emu);
    fl_net_free(nat);
}

static int64_t nonfinite(const float *g, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++)
        c += !isfinite(g[i]);
    return c;
}

/* (5) a loss scale too large for f16 overflows (found-inf: a non-finite gradient), natively as
 * emulated; bf16's range takes it */
static void test_overflow(const model *m) {
    fl_net *nat = make(m, fl_backend_ref(), false, FL_DTYPE_F16, true);
    fl_net *emu = make(m, &emu_table, false, FL_DTYPE_F16, true);
    int64_t n = fl_net_numel(nat);
    float *g = malloc((size_t)n * sizeof *g);
    step(m, nat, 1, g);
    CHECK(nonfinite(g, n) == 0);
    fl_net_set_loss_scale(nat, 1e9f);
    fl_net_set_loss_scale(emu, 1e9f);
    step(m, nat, 1, g);
    CHECK(nonfinite(g, n) > 0);
    step(m, emu, 1, g);
    CHECK(nonfinite(g, n) > 0);
    CHECK_OK(fl_net_set_amp(nat, FL_DTYPE_BF16, "conv2d,fc"));
    fl_net_set_loss_scale(nat, 1e9f);
    step(m, nat, 1, g);
    CHECK(nonfinite(g, n) == 0);
    free(g);
    fl_net_free(nat);
    fl_net_free(emu);
}

/* The table's convert against the reference casts bit for bit: f32 -> f16 / bf16 as
 * fl_f32_to_f16 / fl_f32_to_bf16 round (every 65537th f32 bit pattern, ties, overflow, NaN
 * included), f16 / bf16 -> f32 exact, equal dtypes a copy. */
static void test_convert(void) {
    enum { N = 65536 + 4 };
    const fl_backend *k = fl_backend_ref();
    float *x = malloc(N * sizeof *x), *back = malloc(N * sizeof *back);
    uint16_t *h = malloc(N * sizeof *h);
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t bits = i * 65537u;
        memcpy(&x[i], &bits, sizeof bits);
    }
    x[65536] = 65520.0f;           /* f16: the tie above 65504, to inf */
    x[65537] = 1.0f + 0x1p-11f;    /* f16: a tie, to even (1) */
    x[65538] = 1.0f + 0x1p-8f;     /* bf16: a tie, to even (1) */
    x[65539] = 0x1p-25f;           /* f16: half the smallest subnormal, to 0 */
    const fl_dtype lows[] = {FL_DTYPE_F16, FL_DTYPE_BF16};
    for (int j = 0; j < 2; j++) {
        fl_dtype t = lows[j];
        k->convert(FL_DTYPE_F32, x, t, h, N);
        int64_t bad = -1;
        for (int64_t i = 0; i < N && bad < 0; i++) {
            uint16_t want = t == FL_DTYPE_F16 ? fl_f32_to_f16(x[i]) : fl_f32_to_bf16(x[i]);
            bool nan = isnan(x[i]) && isnan(t == FL_DTYPE_F16 ? fl_f16_to_f32(h[i])
                                                              : fl_bf16_to_f32(h[i]));
            if (h[i] != want && !nan)
                bad = i;
        }
        if (bad >= 0) {
            fprintf(stderr, "FAIL convert f32 -> %s: %.9g gave 0x%04x\n", fl_dtype_name(t),
                    x[bad], h[bad]);
            test_failures++;
        }
        k->convert(t, h, FL_DTYPE_F32, back, N);
        for (int64_t i = 0; i < N && bad < 0; i++) {
            float want = t == FL_DTYPE_F16 ? fl_f16_to_f32(h[i]) : fl_bf16_to_f32(h[i]);
            if (memcmp(&back[i], &want, sizeof want) != 0 && !(isnan(want) && isnan(back[i])))
                bad = i;
        }
        CHECK(bad < 0);
    }
    k->convert(FL_DTYPE_F32, x, FL_DTYPE_F32, back, N);
    CHECK(memcmp(back, x, N * sizeof *x) == 0);
    free(x);
    free(back);
    free(h);
}

/* A table without low dtypes (cpu) keeps the emulation: asking for native changes no bit. */
static void test_no_native(const model *m) {
    fl_net *a = make(m, fl_backend_cpu(), false, FL_DTYPE_F16, true);
    fl_net *b = make(m, fl_backend_cpu(), false, FL_DTYPE_F16, false);
    int64_t n = fl_net_numel(a);
    float *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
    CHECK(low_layers(a) == 0);
    CHECK(step(m, a, 1, ga) == step(m, b, 1, gb));
    CHECK_CLOSE_F32("cpu, native asked", ga, gb, n, 0, 0);
    CHECK(fl_net_activation_bytes(a) == fl_net_activation_bytes(b));
    /* the setting is read by fl_net_set_amp, so it comes first */
    CHECK_RC(fl_net_set_amp_native(a, false), FL_ESTATE);
    CHECK_MSG("after fl_net_set_amp");
    free(ga);
    free(gb);
    fl_net_free(a);
    fl_net_free(b);
}

/* The ref table laid out as the cuda table lays a low network out: channels-last for f16 /
 * bf16 (cuda's preferred_layout, the tensor cores' layout), NCHW for f32. */
static fl_backend nhwc_table;
static fl_layout nhwc_for_low(fl_dtype t) {
    return t == FL_DTYPE_F16 || t == FL_DTYPE_BF16 ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
}

/* (7) the native network in channels-last, as it runs on a GPU: the input's reorder, the low
 * convolutions, batch norm, pooling, the shortcut's channel pad, the SE block's channel ops and
 * the concatenation in NHWC. Every ref low op is the correctly rounded result of its inputs in
 * either layout, so the two steps differ only where a double sum's order moves a rounding:
 * held to a thousandth of the native-vs-emulation bound (measured: equal). */
static void test_nhwc(const model *m, fl_dtype t) {
    fl_net *nchw = make(m, fl_backend_ref(), false, t, true);
    fl_net *nhwc = make(m, &nhwc_table, false, t, true);
    CHECK(fl_net_layout(nchw) == FL_LAYOUT_NCHW);
    CHECK(fl_net_layout(nhwc) == FL_LAYOUT_NHWC);
    CHECK(low_layers(nhwc) == fl_net_num_layers(nhwc));
    int64_t n = fl_net_numel(nhwc);
    float *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
    double u = unit_roundoff(t), r = 2.0 * low_layers(nhwc);
    double la = step(m, nchw, 1, ga), lb = step(m, nhwc, 1, gb);
    check_rel("NHWC loss vs NCHW", m, t, fabs(lb - la) / fabs(la), 1e-3 * r * u);
    check_rel("NHWC gradients vs NCHW", m, t, rel_l2(gb, ga, n), 1e-3 * r * u);
    if (getenv("FLEET_TEST_VERBOSE"))
        printf("%s %s NHWC: loss %.3g, gradients %.3g from NCHW\n", m->name, fl_dtype_name(t),
               fabs(lb - la) / fabs(la), rel_l2(gb, ga, n));
    free(ga);
    free(gb);
    fl_net_free(nchw);
    fl_net_free(nhwc);
}

/* The ref table counting its convolution plans and the bytes it holds (count_table). */
static fl_backend count_table;
static int plans_made;
static size_t live_bytes, live_peak;
enum { MAX_BLOCKS = 4096 };
static struct {
    void  *p;
    size_t n;
} blocks[MAX_BLOCKS];
static int nblocks;
static void *count_alloc(size_t n) {
    void *p = fl_backend_ref()->alloc(n);
    FL_ASSERT(nblocks < MAX_BLOCKS);
    if (p) {
        blocks[nblocks].p = p, blocks[nblocks++].n = n;
        live_bytes += n;
        live_peak = live_bytes > live_peak ? live_bytes : live_peak;
    }
    return p;
}
static void count_free(void *p) {
    for (int i = 0; p && i < nblocks; i++)
        if (blocks[i].p == p) {
            live_bytes -= blocks[i].n;
            blocks[i] = blocks[--nblocks];
            break;
        }
    fl_backend_ref()->free(p);
}
static fl_conv_plan *count_plan(const fl_conv_desc *d) {
    plans_made++;
    return fl_backend_ref()->conv_plan_create(d);
}

/* The model on count_table with amp asked before the build (before) or set after it; its
 * plans, and the most bytes it held while it was made. */
static fl_net *make_counted(const model *m, fl_dtype low, bool before, bool recompute,
                            int *plans, size_t *peak) {
    size_t base = live_bytes; /* the networks alive already */
    plans_made = 0, live_peak = live_bytes;
    fl_net *net = m->kind == KIND_SE ? model_se(m->classes)
                                     : fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, m->classes, 'A');
    CHECK(net != NULL);
    fl_net_set_backend(net, &count_table);
    if (recompute)
        CHECK_OK(fl_net_set_recompute(net, "auto"));
    CHECK_OK(fl_net_set_amp_native(net, true));
    if (before)
        CHECK_OK(fl_net_set_amp(net, low, "conv2d,fc"));
    CHECK_OK(fl_net_build(net, m->ndim, m->in, B, 5));
    if (!before)
        CHECK_OK(fl_net_set_amp(net, low, "conv2d,fc"));
    *plans = plans_made, *peak = live_peak - base;
    return net;
}

/* (8) amp asked before the build (fl_net_set_amp before fl_net_build: fl_strategy_plan_amp,
 * as fleet-train and bench/cnn_step do): the low layers are planned once, in low (one
 * convolution plan per layer where setting it after the build makes the f32 ones first, then
 * again), the most memory held is less (no f32 activations first), and the step is the same
 * to the bit, with recompute too; asking again after the build (the strategy does) changes nothing;
 * fl_net_set_amp_native of the value in force is accepted; FL_DTYPE_F32 before the build drops
 * the request, and a word that is not a layer type is refused at once. */
static void test_before_build(const model *m, fl_dtype t, bool recompute) {
    int pa, pb;
    size_t peak_a, peak_b;
    fl_net *after = make_counted(m, t, false, recompute, &pa, &peak_a);
    fl_net *before = make_counted(m, t, true, recompute, &pb, &peak_b);
    CHECK(pb > 0 && pa == 2 * pb);
    CHECK(peak_b < peak_a);
    CHECK(low_layers(before) == low_layers(after) && low_layers(before) > 0);
    CHECK(fl_net_activation_bytes(before) == fl_net_activation_bytes(after));
    int64_t n = fl_net_numel(before);
    float *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
    CHECK(step(m, after, 1, ga) == step(m, before, 1, gb));
    CHECK_CLOSE_F32("amp asked before the build", gb, ga, n, 0, 0);
    plans_made = 0;
    CHECK_OK(fl_net_set_amp_native(before, true));
    CHECK_OK(fl_net_set_amp(before, t, "fc,conv2d"));
    CHECK(plans_made == 0);
    CHECK(step(m, after, 2, ga) == step(m, before, 2, gb));
    CHECK_CLOSE_F32("amp asked again", gb, ga, n, 0, 0);
    if (getenv("FLEET_TEST_VERBOSE"))
        printf("%s %s%s: %d plans, %zu bytes at most asked before the build; %d, %zu after\n",
               m->name, fl_dtype_name(t), recompute ? " (recompute)" : "", pb, peak_b, pa,
               peak_a);
    free(ga);
    free(gb);
    fl_net_free(after);
    fl_net_free(before);
    /* a dropped request: the f32 network */
    fl_net *off = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A');
    fl_net_set_backend(off, &count_table);
    CHECK_OK(fl_net_set_amp(off, t, "conv2d"));
    CHECK_OK(fl_net_set_amp(off, FL_DTYPE_F32, NULL));
    CHECK_OK(fl_net_build(off, CNN.ndim, CNN.in, B, 5));
    CHECK(low_layers(off) == 0 && !fl_net_amp_white(off, 0));
    CHECK_RC(fl_net_set_amp(off, t, "conv2d,conv"), FL_EINVAL);
    CHECK_MSG("'conv' is not a layer type");
    fl_net_free(off);
    fl_net *bad = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A');
    CHECK_RC(fl_net_set_amp(bad, t, "conv"), FL_EINVAL);
    CHECK_MSG("'conv' is not a layer type");
    fl_net_free(bad);
    CHECK(live_bytes == 0 && nblocks == 0);
}

int main(void) {
    nhwc_table = *fl_backend_ref();
    nhwc_table.preferred_layout = nhwc_for_low;
    count_table = *fl_backend_ref();
    count_table.alloc = count_alloc;
    count_table.free = count_free;
    count_table.conv_plan_create = count_plan;
    emu_table = *fl_backend_ref();
    emu_table.low_dtypes = false;
    emu_table.convert = NULL;
    test_convert();
    const model *models[] = {&MLP, &CNN, &SE};
    const fl_dtype lows[] = {FL_DTYPE_F16, FL_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 2; j++) {
            test_follow(models[i], lows[j]);
            test_merge_recompute(models[i], lows[j]);
            if (models[i]->ndim == 3) {
                test_nhwc(models[i], lows[j]);
                test_before_build(models[i], lows[j], false);
                test_before_build(models[i], lows[j], true);
            }
        }
        test_overflow(models[i]);
        test_no_native(models[i]);
    }
    for (int j = 0; j < 2; j++)
        test_edges(lows[j]);
    if (test_failures) {
        fprintf(stderr, "%d failure(s)\n", test_failures);
        return 1;
    }
    printf("test_amp_lowp: ok\n");
    return 0;
}
