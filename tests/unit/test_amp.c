/* test_amp.c - mixed precision (docs/amp.md): the loss-scale rule (Paddle's update_loss_scaling)
 * against hand-computed sequences (growth after N finite steps, shrinking after M inf steps,
 * the floor at 1, a growth that would overflow, static mode); the white list; the f16 / bf16
 * rounding kernel against the reference cast bit for bit (overflow to inf above 65504 in f16,
 * none in bf16, ties to even, subnormals); and the network's emulation: a white fc computes on
 * rounded values, the loss scale multiplies the gradients exactly, an f16 overflow really
 * appears as inf, recompute and gradient accumulation keep their guarantees under amp, on the
 * cpu, ref and onednn backends. */
#include "test.h"

#include "fleet/nn.h"
#include "fleet/status.h"
#include "strategy/amp.h"

#include <stdint.h>
#include <string.h>

/* --- the loss-scale rule --- */

typedef struct {
    bool   inf;
    double scale, good, bad, skipped; /* after the step */
} step_want;

static void run_rule(const char *what, const fl_amp_rule *r, const step_want *w, int n) {
    double st[FL_AMP_NSTATE];
    fl_amp_state_init(r, st);
    CHECK(st[FL_AMP_SCALE] == r->init_loss_scaling && st[FL_AMP_GOOD] == 0);
    for (int i = 0; i < n; i++) {
        fl_amp_update(r, w[i].inf, st);
        if (st[FL_AMP_SCALE] != w[i].scale || st[FL_AMP_GOOD] != w[i].good ||
            st[FL_AMP_BAD] != w[i].bad || st[FL_AMP_SKIPPED] != w[i].skipped) {
            fprintf(stderr, "%s: step %d (%s): got scale %g good %g bad %g skipped %g, want %g %g "
                    "%g %g\n", what, i + 1, w[i].inf ? "inf" : "finite", st[FL_AMP_SCALE],
                    st[FL_AMP_GOOD], st[FL_AMP_BAD], st[FL_AMP_SKIPPED], w[i].scale, w[i].good,
                    w[i].bad, w[i].skipped);
            test_failures++;
            return;
        }
    }
}

static void test_rule(void) {
    /* grow after 3 finite steps (x2), shrink after 2 inf steps (x0.5); an inf resets good, a
     * finite step resets bad */
    fl_amp_rule r = {.init_loss_scaling = 8, .dynamic = true, .incr_every_n_steps = 3,
                     .decr_every_n_nan_or_inf = 2, .incr_ratio = 2, .decr_ratio = 0.5f};
    const step_want a[] = {
        {false, 8, 1, 0, 0},  {false, 8, 2, 0, 0},  {false, 16, 0, 0, 0}, /* grown */
        {false, 16, 1, 0, 0}, {true, 16, 0, 1, 1},                        /* good reset */
        {false, 16, 1, 0, 1},                                             /* bad reset */
        {true, 16, 0, 1, 2},  {true, 8, 0, 0, 3},                         /* shrunk */
        {true, 8, 0, 1, 4},   {true, 4, 0, 0, 5},  {true, 4, 0, 1, 6},  {true, 2, 0, 0, 7},
        {true, 2, 0, 1, 8},   {true, 1, 0, 0, 9},                         /* 1 */
        {true, 1, 0, 1, 10},  {true, 1, 0, 0, 11},                        /* floor: 0.5 -> 1 */
        {false, 1, 1, 0, 11}, {false, 1, 2, 0, 11}, {false, 2, 0, 0, 11},
    };
    run_rule("dynamic", &r, a, (int)(sizeof a / sizeof a[0]));
    /* Paddle's defaults: 32768, x0.8 after 2 inf steps, in f32 (26214.4f, 20971.52f) */
    fl_amp_rule p = {.init_loss_scaling = 32768, .dynamic = true, .incr_every_n_steps = 1000,
                     .decr_every_n_nan_or_inf = 2, .incr_ratio = 2, .decr_ratio = 0.8f};
    const step_want b[] = {{true, 32768, 0, 1, 1}, {true, (float)(32768 * 0.8f), 0, 0, 2},
                           {true, (float)(32768 * 0.8f), 0, 1, 3},
                           {true, (float)((float)(32768 * 0.8f) * 0.8f), 0, 0, 4}};
    run_rule("paddle defaults", &p, b, 4);
    CHECK_NEAR(b[1].scale, 26214.4, 1e-2);
    /* a growth to inf keeps the scale (Paddle: isfinite(new) ? new : old) */
    fl_amp_rule g = {.init_loss_scaling = 3e38f, .dynamic = true, .incr_every_n_steps = 1,
                     .decr_every_n_nan_or_inf = 1, .incr_ratio = 2, .decr_ratio = 0.5f};
    const step_want c[] = {{false, 3e38f, 0, 0, 0}, {true, 1.5e38f, 0, 0, 1}};
    run_rule("growth to inf", &g, c, 2);
    /* static: the scale and counters stay; inf steps are still counted (and skipped) */
    fl_amp_rule s = r;
    s.dynamic = false;
    const step_want d[] = {{false, 8, 0, 0, 0}, {false, 8, 0, 0, 0}, {false, 8, 0, 0, 0},
                           {true, 8, 0, 0, 1},  {true, 8, 0, 0, 2},  {true, 8, 0, 0, 3}};
    run_rule("static", &s, d, 6);

    /* from a strategy; the white list; the test hook's syntax */
    fl_strategy st;
    fl_strategy_defaults(&st);
    fl_amp_rule_from(&st, &r);
    CHECK(r.init_loss_scaling == 32768 && r.dynamic && r.incr_every_n_steps == 1000 &&
          r.decr_every_n_nan_or_inf == 2 && r.incr_ratio == 2 && r.decr_ratio == 0.8f);
    char w[128];
    CHECK_OK(fl_amp_white_types(&st, w, sizeof w));
    CHECK(strcmp(w, "conv2d,fc") == 0);
    snprintf(st.amp_configs.custom_white_list, sizeof st.amp_configs.custom_white_list,
             "batch_norm, add,conv2d");
    snprintf(st.amp_configs.custom_black_list, sizeof st.amp_configs.custom_black_list,
             "fc,softmax_with_cross_entropy");
    CHECK_OK(fl_amp_white_types(&st, w, sizeof w));
    CHECK(strcmp(w, "conv2d,batch_norm,add") == 0);
    CHECK_RC(fl_amp_white_types(&st, w, 8), FL_EINVAL);
    int64_t step;
    int rank;
    CHECK_OK(fl_amp_inject_parse(NULL, &step, &rank));
    CHECK(step == 0);
    CHECK_OK(fl_amp_inject_parse("7", &step, &rank));
    CHECK(step == 7 && rank == -1);
    CHECK_OK(fl_amp_inject_parse("12,1", &step, &rank));
    CHECK(step == 12 && rank == 1);
    const char *bad[] = {"0", "x", "3,", "3,-1", "3,1x", "-2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_RC(fl_amp_inject_parse(bad[i], &step, &rank), FL_EINVAL);
        CHECK_MSG("FLEET_AMP_INJECT_INF");
    }
}

/* --- the rounding kernel --- */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* k's amp_round against the reference cast, bit for bit (NaN: a NaN) */
static void test_round(const fl_backend *k) {
    enum { N = 1 << 20 };
    static float x[N], want[N];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t u = (uint32_t)s;
        if (i % 4 == 1) /* near f16's range: exponents 100 .. 150 */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (s >> 40) % 51) << 23);
        if (i % 4 == 2) /* exact ties of f16's normals and subnormals */
            u = (u & 0xffffe000u) | 0x1000u;
        x[i] = from_bits(u);
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e5f, 3.4e38f, 0x1p-14f,
                           0x1p-15f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 0.0f, -0.0f,
                           INFINITY, -INFINITY, 1.0f + 0x1p-11f, 1.0f + 0x1.8p-11f};
    memcpy(x, edges, sizeof edges);
    for (int low = 0; low < 2; low++) {
        fl_dtype t = low ? FL_DTYPE_BF16 : FL_DTYPE_F16;
        memcpy(want, x, sizeof x);
        fl_backend_ref()->amp_round(t, N, want);
        float *got = k->alloc(sizeof x);
        k->copy(got, x, sizeof x, FL_COPY_H2D, NULL);
        k->amp_round(t, N, got);
        float *host = malloc(sizeof x);
        k->copy(host, got, sizeof x, FL_COPY_D2H, NULL);
        long bad = 0, first = -1;
        for (long i = 0; i < N; i++)
            if (!(bits(host[i]) == bits(want[i]) || (isnan(host[i]) && isnan(want[i])))) {
                if (first < 0)
                    first = i;
                bad++;
            }
        if (bad) {
            fprintf(stderr, "%s amp_round %s: %ld of %d differ from the cast; first [%ld] %a -> "
                    "%a, want %a\n", k->name, fl_dtype_name(t), bad, N, first, x[first],
                    host[first], want[first]);
            test_failures++;
        }
        free(host);
        k->free(got);
    }
    /* what the edges become */
    float e[] = {65504.0f, 65519.0f, 65520.0f, 1e5f, 0x1p-25f, 0x1.8p-25f, 1.0f + 0x1p-11f};
    k->amp_round(FL_DTYPE_F16, 7, e);
    CHECK(e[0] == 65504.0f && e[1] == 65504.0f && isinf(e[2]) && isinf(e[3]));
    CHECK(e[4] == 0.0f && e[5] == 0x1p-24f && e[6] == 1.0f); /* ties to even */
    float f[] = {65520.0f, 1e5f, 3e38f, 1.0f + 0x1p-8f};
    k->amp_round(FL_DTYPE_BF16, 4, f);
    CHECK(f[0] == 65536.0f && f[1] == 99840.0f && isfinite(f[2]) && f[3] == 1.0f);
}

/* --- the network's emulation --- */

static bool f16_exact(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (fl_f16_to_f32(fl_f32_to_f16(v[i])) != v[i])
            return false;
    return true;
}

static fl_net *mlp(const fl_backend *k) {
    int64_t hidden[] = {24}, in[] = {10};
    fl_net *net = fl_model_mlp(FL_DTYPE_F32, 10, hidden, 1, FL_ACT_TANH, 3);
    fl_net_set_backend(net, k);
    CHECK_OK(fl_net_build(net, 1, in, 8, 3));
    return net;
}

/* One forward and backward of batch x (8, 10) with labels; gradients into g (numel). */
static void step(fl_net *net, const float *x, const int32_t *labels, float *g, float *out) {
    int64_t xs[] = {8, 10}, ps[] = {8, 3};
    fl_tensor xt, probs;
    static float pmem[8 * 3];
    fl_tensor_view(&xt, FL_DTYPE_F32, 2, xs, (void *)x);
    const fl_tensor *logits;
    double loss;
    CHECK_OK(fl_net_forward(net, &xt, true, &logits));
    if (out)
        memcpy(out, logits->data, sizeof pmem);
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, ps, pmem);
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), logits, labels, &probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), &probs, labels, &probs));
    CHECK_OK(fl_net_backward(net, &probs, NULL, NULL));
    memcpy(g, fl_net_flat_grads(net), (size_t)fl_net_numel(net) * sizeof *g);
}

static void test_net(const fl_backend *k) {
    float x[80];
    int32_t labels[8];
    for (int i = 0; i < 80; i++)
        x[i] = (float)sin(0.37 * i + 0.1) * 1.3f;
    for (int i = 0; i < 8; i++)
        labels[i] = i % 3;
    fl_net *ref = mlp(k), *net = mlp(k);
    int64_t n = fl_net_numel(net);
    float *g32 = malloc((size_t)n * sizeof *g32), *g16 = malloc((size_t)n * sizeof *g16);
    float *g2 = malloc((size_t)n * sizeof *g2), out[24], out32[24];

    /* refusals */
    CHECK_RC(fl_net_set_amp(net, FL_DTYPE_F16, "fc,conv"), FL_EINVAL);
    CHECK_MSG("'conv' is not a layer type");
    CHECK_RC(fl_net_set_amp(net, FL_DTYPE_I32, "fc"), FL_EINVAL);

    /* fc in f16: the logits and every fc gradient are f16 values; the master weights stay */
    CHECK_OK(fl_net_set_amp(net, FL_DTYPE_F16, "fc"));
    CHECK(fl_net_amp_white(net, 0) && !fl_net_amp_white(net, 1) && fl_net_amp_white(net, 2));
    float w0 = ((float *)fl_net_flat_params(net))[0];
    step(ref, x, labels, g32, out32);
    step(net, x, labels, g16, out);
    CHECK(f16_exact(out, 24));
    CHECK(!f16_exact(out32, 24)); /* the f32 network's are not */
    CHECK(f16_exact(g16, n));
    CHECK(((float *)fl_net_flat_params(net))[0] == w0 && !f16_exact(&w0, 1));
    CHECK_CLOSE_F32("f16 gradients vs f32", g16, g32, n, 2e-4, 2e-2);

    /* the loss scale multiplies the gradient exactly (a power of two, in range) */
    fl_net_set_loss_scale(net, 1024.0f);
    step(net, x, labels, g2, NULL);
    for (int64_t i = 0; i < n; i++)
        g2[i] /= 1024.0f;
    CHECK_CLOSE_F32("scale 1024, unscaled", g2, g16, n, 0, 0);
    /* and too large a scale overflows f16 into inf, not bf16 */
    fl_net_set_loss_scale(net, 1e9f);
    step(net, x, labels, g2, NULL);
    int64_t infs = 0;
    for (int64_t i = 0; i < n; i++)
        infs += !isfinite(g2[i]); /* inf, and NaN where infs of both signs met */
    CHECK(infs > 0);
    CHECK_OK(fl_net_set_amp(net, FL_DTYPE_BF16, "fc"));
    fl_net_set_loss_scale(net, 1e9f);
    step(net, x, labels, g2, NULL);
    infs = 0;
    for (int64_t i = 0; i < n; i++)
        infs += !isfinite(g2[i]);
    CHECK(infs == 0);

    /* gradient accumulation: two backwards of the same batch give twice one's gradient (each
     * rounded alone, summed in f32) */
    CHECK_OK(fl_net_set_amp(net, FL_DTYPE_F16, "fc"));
    step(net, x, labels, g16, NULL);
    fl_net_set_accumulate(net, true);
    step(net, x, labels, g2, NULL);
    fl_net_set_accumulate(net, false);
    for (int64_t i = 0; i < n; i++)
        g16[i] *= 2;
    CHECK_CLOSE_F32("accumulated twice", g2, g16, n, 0, 0);

    /* off again: the f32 network's gradients */
    CHECK_OK(fl_net_set_amp(net, FL_DTYPE_F32, NULL));
    step(net, x, labels, g2, NULL);
    CHECK_CLOSE_F32("amp off", g2, g32, n, 0, 0);
    free(g32);
    free(g16);
    free(g2);
    fl_net_free(ref);
    fl_net_free(net);
}

/* recompute under amp: the same gradients as without it (a replayed layer rounds alike), for a
 * residual network with every type white */
static void test_recompute(const fl_backend *k) {
    int64_t in[] = {3, 16, 16};
    fl_net *nets[2];
    float *g[2];
    float x[4 * 3 * 16 * 16];
    int32_t labels[4] = {0, 3, 5, 9};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = (float)cos(0.11 * (double)i);
    for (int r = 0; r < 2; r++) {
        nets[r] = fl_model_resnet_cifar(FL_DTYPE_F32, 8, 3, 10, 'A');
        fl_net_set_backend(nets[r], k);
        if (r)
            CHECK_OK(fl_net_set_recompute(nets[r], "auto"));
        CHECK_OK(fl_net_build(nets[r], 3, in, 4, 9));
        CHECK_OK(fl_net_set_amp(nets[r], FL_DTYPE_F16,
                                "conv2d,fc,batch_norm,add,shortcut_pad,global_avg_pool"));
        fl_net_set_loss_scale(nets[r], 4096.0f);
        int64_t xs[] = {4, 3, 16, 16}, ps[] = {4, 10};
        fl_tensor xt, probs;
        float pmem[40];
        fl_tensor_view(&xt, FL_DTYPE_F32, 4, xs, x);
        const fl_tensor *logits;
        double loss;
        CHECK_OK(fl_net_forward(nets[r], &xt, true, &logits));
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, ps, pmem);
        CHECK_OK(fl_softmax_xent_forward(k, logits, labels, &probs, &loss));
        CHECK_OK(fl_softmax_xent_backward(k, &probs, labels, &probs));
        CHECK_OK(fl_net_backward(nets[r], &probs, NULL, NULL));
        g[r] = fl_net_flat_grads(nets[r]);
    }
    CHECK_CLOSE_F32("recompute under amp", g[1], g[0], fl_net_numel(nets[0]), 0, 0);
    fl_net_free(nets[0]);
    fl_net_free(nets[1]);
}

int main(void) {
    test_rule();
    const fl_backend *backends[] = {fl_backend_cpu(), fl_backend_ref(), fl_backend_onednn()};
    for (int b = 0; b < 3; b++) {
        if (!backends[b])
            continue;
        test_round(backends[b]);
        test_net(backends[b]);
        test_recompute(backends[b]);
    }
    if (test_failures) {
        fprintf(stderr, "%d failures\n", test_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
