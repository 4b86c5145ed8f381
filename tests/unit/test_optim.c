/* test_optim.c - optimizers against hand-computed arithmetic in double (SGD, Momentum, Nesterov,
 * each with and without L2 decay), velocity state naming, global-norm clipping, config checks,
 * every learning-rate schedule at hand-computed steps, and the f32 update of the cpu kernels
 * against the reference kernels. */
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <float.h>
#include <stdint.h>

/* --- a small f64 parameter set: fc.weight (2, 2), fc.bias (2), and a buffer that must be
 * left alone (not trainable, though it has a gradient-shaped block) */
#define NW 4
#define NB 2
typedef struct {
    double w[NW], gw[NW], b[NB], gb[NB], buf[2], gbuf[2];
    fl_param p[3];
} small_net;

static const double w0[NW] = {1.0, -2.0, 0.5, 3.0};
static const double b0[NB] = {0.25, -0.75};
static const double gw0[NW] = {0.5, 1.5, -0.25, -1.0};
static const double gb0[NB] = {-0.5, 2.0};

static void small_net_init(small_net *s) {
    memcpy(s->w, w0, sizeof w0);
    memcpy(s->b, b0, sizeof b0);
    s->buf[0] = 7.0;
    s->buf[1] = -7.0;
    s->gbuf[0] = s->gbuf[1] = 100.0;
    int64_t wshape[] = {2, 2}, bshape[] = {2};
    memset(s->p, 0, sizeof s->p);
    snprintf(s->p[0].name, sizeof s->p[0].name, "fc.weight");
    fl_tensor_view(&s->p[0].value, FL_DTYPE_F64, 2, wshape, s->w);
    fl_tensor_view(&s->p[0].grad, FL_DTYPE_F64, 2, wshape, s->gw);
    s->p[0].trainable = true;
    snprintf(s->p[1].name, sizeof s->p[1].name, "fc.bias");
    fl_tensor_view(&s->p[1].value, FL_DTYPE_F64, 1, bshape, s->b);
    fl_tensor_view(&s->p[1].grad, FL_DTYPE_F64, 1, bshape, s->gb);
    s->p[1].trainable = true;
    snprintf(s->p[2].name, sizeof s->p[2].name, "bn.running_mean");
    fl_tensor_view(&s->p[2].value, FL_DTYPE_F64, 1, bshape, s->buf);
    fl_tensor_view(&s->p[2].grad, FL_DTYPE_F64, 1, bshape, s->gbuf);
    s->p[2].trainable = false;
}

/* The gradients of step t: the base gradients times (1 + t/4), so the steps differ. */
static void small_net_set_grads(small_net *s, int t) {
    for (int i = 0; i < NW; i++)
        s->gw[i] = gw0[i] * (1.0 + 0.25 * t);
    for (int i = 0; i < NB; i++)
        s->gb[i] = gb0[i] * (1.0 + 0.25 * t);
}

/* The update rules of optim.h, one scalar at a time, written out in double. */
static void expected_update(fl_optim_type type, bool nesterov, double wd, double lr, double mu,
                            double *w, double g, double *v) {
    double d = g + wd * *w;
    if (type == FL_OPTIM_SGD) {
        *w = *w - lr * d;
        return;
    }
    *v = mu * *v + d;
    *w = *w - lr * (nesterov ? d + mu * *v : *v);
}

static void run_rule(const fl_backend *k, fl_optim_type type, bool nesterov, double wd) {
    const double lr = 0.1, mu = 0.9;
    char what[128];
    snprintf(what, sizeof what, "%s %s%s wd=%g", k->name,
             type == FL_OPTIM_SGD ? "sgd" : nesterov ? "nesterov" : "momentum",
             "", wd);
    small_net s;
    small_net_init(&s);
    fl_optim_config cfg = {.type = type, .momentum = type == FL_OPTIM_MOMENTUM ? mu : 0.0,
                           .nesterov = nesterov, .weight_decay = wd};
    fl_optim *opt = fl_optim_create(&cfg, s.p, 3, FL_DTYPE_F64, k);
    CHECK(opt != NULL);
    if (!opt)
        return;

    double ew[NW], eb[NB], vw[NW] = {0}, vb[NB] = {0};
    memcpy(ew, w0, sizeof ew);
    memcpy(eb, b0, sizeof eb);
    for (int t = 0; t < 3; t++) {
        small_net_set_grads(&s, t);
        double norm = -1;
        CHECK_OK(fl_optim_step(opt, lr, &norm));
        double sq = 0;
        for (int i = 0; i < NW; i++)
            sq += s.gw[i] * s.gw[i];
        for (int i = 0; i < NB; i++)
            sq += s.gb[i] * s.gb[i];
        CHECK_NEAR(norm, sqrt(sq), 1e-12); /* the buffer's gradient is not counted */
        for (int i = 0; i < NW; i++)
            expected_update(type, nesterov, wd, lr, mu, &ew[i], s.gw[i], &vw[i]);
        for (int i = 0; i < NB; i++)
            expected_update(type, nesterov, wd, lr, mu, &eb[i], s.gb[i], &vb[i]);
    }
    CHECK_CLOSE(what, s.w, ew, NW, 1e-14, 1e-14);
    CHECK_CLOSE(what, s.b, eb, NB, 1e-14, 1e-14);
    CHECK(s.buf[0] == 7.0 && s.buf[1] == -7.0);       /* buffers are not updated */
    CHECK(s.gbuf[0] == 100.0 && s.gbuf[1] == 100.0);
    if (type == FL_OPTIM_MOMENTUM) {
        CHECK(fl_optim_num_state(opt) == 2);
        CHECK_CLOSE(what, (const double *)fl_optim_state(opt, 0)->value.data, vw, NW, 1e-14, 1e-14);
        CHECK_CLOSE(what, (const double *)fl_optim_state(opt, 1)->value.data, vb, NB, 1e-14, 1e-14);
    } else {
        CHECK(fl_optim_num_state(opt) == 0);
    }
    fl_optim_free(opt);
}

/* Element 0 of fc.weight (w = 1, g = 0.5, 0.625, 0.75 over the three steps), lr 0.1, mu 0.9,
 * worked by hand: an anchor for the scalar rule above. */
static void test_hand_values(const fl_backend *k) {
    struct {
        fl_optim_type type;
        bool nesterov;
        double wd, want;
    } cases[] = {
        /* SGD: w = 1 - 0.1 * (0.5 + 0.625 + 0.75) */
        {FL_OPTIM_SGD, false, 0.0, 1.0 - 0.1 * (0.5 + 0.625 + 0.75)},
        /* SGD + wd 0.1: d1 = 0.5 + 0.1 = 0.6, w1 = 0.94; d2 = 0.625 + 0.094 = 0.719,
         * w2 = 0.8681; d3 = 0.75 + 0.08681 = 0.83681, w3 = 0.8681 - 0.083681 */
        {FL_OPTIM_SGD, false, 0.1, 0.784419},
        /* Momentum: v1 = 0.5, w1 = 0.95; v2 = 0.45 + 0.625 = 1.075, w2 = 0.8425;
         * v3 = 0.9675 + 0.75 = 1.7175, w3 = 0.8425 - 0.17175 */
        {FL_OPTIM_MOMENTUM, false, 0.0, 0.67075},
        /* Nesterov: v1 = 0.5, w1 = 1 - 0.1 (0.5 + 0.45) = 0.905; v2 = 1.075,
         * w2 = 0.905 - 0.1 (0.625 + 0.9675) = 0.74575; v3 = 1.7175,
         * w3 = 0.74575 - 0.1 (0.75 + 1.54575) */
        {FL_OPTIM_MOMENTUM, true, 0.0, 0.74575 - 0.229575},
        /* Momentum + wd 0.1: d1 = 0.6, v1 = 0.6, w1 = 0.94; d2 = 0.625 + 0.094 = 0.719,
         * v2 = 0.54 + 0.719 = 1.259, w2 = 0.8141; d3 = 0.75 + 0.08141 = 0.83141,
         * v3 = 1.1331 + 0.83141 = 1.96451, w3 = 0.8141 - 0.196451 */
        {FL_OPTIM_MOMENTUM, false, 0.1, 0.617649},
        /* Nesterov + wd 0.1: d1 = 0.6, v1 = 0.6, w1 = 1 - 0.1 (0.6 + 0.54) = 0.886;
         * d2 = 0.625 + 0.0886 = 0.7136, v2 = 0.54 + 0.7136 = 1.2536,
         * w2 = 0.886 - 0.1 (0.7136 + 1.12824) = 0.701816;
         * d3 = 0.75 + 0.0701816 = 0.8201816, v3 = 1.12824 + 0.8201816 = 1.9484216,
         * w3 = 0.701816 - 0.1 (0.8201816 + 1.75357944) */
        {FL_OPTIM_MOMENTUM, true, 0.1, 0.701816 - 0.257376104},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        small_net s;
        small_net_init(&s);
        fl_optim_config cfg = {.type = cases[c].type,
                               .momentum = cases[c].type == FL_OPTIM_MOMENTUM ? 0.9 : 0.0,
                               .nesterov = cases[c].nesterov, .weight_decay = cases[c].wd};
        fl_optim *opt = fl_optim_create(&cfg, s.p, 3, FL_DTYPE_F64, k);
        CHECK(opt != NULL);
        if (!opt)
            continue;
        for (int t = 0; t < 3; t++) {
            small_net_set_grads(&s, t);
            CHECK_OK(fl_optim_step(opt, 0.1, NULL));
        }
        if (fabs(s.w[0] - cases[c].want) > 1e-12) {
            fprintf(stderr, "%s: hand case %zu: w = %.15g, want %.15g\n", k->name, c, s.w[0],
                    cases[c].want);
            test_failures++;
        }
        fl_optim_free(opt);
    }
}

static void test_state(void) {
    small_net s;
    small_net_init(&s);
    fl_optim_config cfg = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .nesterov = true};
    fl_optim *opt = fl_optim_create(&cfg, s.p, 3, FL_DTYPE_F64, fl_backend_ref());
    CHECK(opt != NULL);
    if (!opt)
        return;
    CHECK(fl_optim_num_state(opt) == 2);
    const char *names[] = {"opt.velocity.fc.weight", "opt.velocity.fc.bias"};
    for (int i = 0; i < 2; i++) {
        fl_param *v = fl_optim_state(opt, i);
        CHECK(strcmp(v->name, names[i]) == 0);
        CHECK(fl_tensor_same_shape(&v->value, &s.p[i].value));
        CHECK(v->value.dtype == FL_DTYPE_F64 && v->value.numel == s.p[i].value.numel);
        CHECK(!v->trainable && v->grad.data == NULL && !v->value.owns_data);
        for (int64_t j = 0; j < v->value.numel; j++)
            CHECK(((const double *)v->value.data)[j] == 0.0);
    }
    const fl_optim_config *got = fl_optim_get_config(opt);
    CHECK(got->type == FL_OPTIM_MOMENTUM && got->momentum == 0.9 && got->nesterov);
    fl_optim_free(opt);
    fl_optim_free(NULL);
}

static void test_clip(const fl_backend *k) {
    /* two params: a (2) = grads (3, 0), b (1) = (4); norm 5. A frozen buffer's gradient is
     * neither counted nor scaled. */
    double va[2] = {1, 1}, ga[2] = {3, 0}, vb[1] = {1}, gb[1] = {4}, vc[1] = {0}, gc[1] = {12};
    int64_t s2[] = {2}, s1[] = {1};
    fl_param p[3];
    memset(p, 0, sizeof p);
    fl_tensor_view(&p[0].value, FL_DTYPE_F64, 1, s2, va);
    fl_tensor_view(&p[0].grad, FL_DTYPE_F64, 1, s2, ga);
    fl_tensor_view(&p[1].value, FL_DTYPE_F64, 1, s1, vb);
    fl_tensor_view(&p[1].grad, FL_DTYPE_F64, 1, s1, gb);
    fl_tensor_view(&p[2].value, FL_DTYPE_F64, 1, s1, vc);
    fl_tensor_view(&p[2].grad, FL_DTYPE_F64, 1, s1, gc);
    p[0].trainable = p[1].trainable = true;
    snprintf(p[0].name, sizeof p[0].name, "a");
    snprintf(p[1].name, sizeof p[1].name, "b");
    snprintf(p[2].name, sizeof p[2].name, "c");

    /* below the threshold: unchanged, norm returned */
    CHECK_NEAR(fl_clip_grad_norm(k, FL_DTYPE_F64, p, 3, 10.0), 5.0, 1e-15);
    CHECK(ga[0] == 3 && ga[1] == 0 && gb[0] == 4 && gc[0] == 12);
    /* exactly at the threshold: unchanged */
    CHECK_NEAR(fl_clip_grad_norm(k, FL_DTYPE_F64, p, 3, 5.0), 5.0, 1e-15);
    CHECK(ga[0] == 3 && gb[0] == 4);
    /* max_norm <= 0: only the norm */
    CHECK_NEAR(fl_clip_grad_norm(k, FL_DTYPE_F64, p, 3, 0.0), 5.0, 1e-15);
    CHECK(ga[0] == 3 && gb[0] == 4);
    /* above: scaled by 2.5 / 5 to norm 2.5; the pre-clip norm is returned */
    CHECK_NEAR(fl_clip_grad_norm(k, FL_DTYPE_F64, p, 3, 2.5), 5.0, 1e-15);
    CHECK_NEAR(ga[0], 1.5, 1e-15);
    CHECK(ga[1] == 0);
    CHECK_NEAR(gb[0], 2.0, 1e-15);
    CHECK(gc[0] == 12);
    CHECK_NEAR(fl_clip_grad_norm(k, FL_DTYPE_F64, p, 3, 0.0), 2.5, 1e-15);

    /* through the optimizer: SGD lr 1 with clip_norm 1 moves (1, 1, 1) by (0.6, 0, 0.8) */
    ga[0] = 3;
    ga[1] = 0;
    gb[0] = 4;
    fl_optim_config cfg = {.type = FL_OPTIM_SGD, .clip_norm = 1.0};
    fl_optim *opt = fl_optim_create(&cfg, p, 3, FL_DTYPE_F64, k);
    CHECK(opt != NULL);
    if (opt) {
        double norm = 0;
        CHECK_OK(fl_optim_step(opt, 1.0, &norm));
        CHECK_NEAR(norm, 5.0, 1e-15);
        CHECK_NEAR(va[0], 0.4, 1e-15);
        CHECK_NEAR(va[1], 1.0, 1e-15);
        CHECK_NEAR(vb[0], 0.2, 1e-15);
        CHECK(vc[0] == 0 && gc[0] == 12);
        /* the step clipped the gradients in place; with clipping off the norm is still
         * reported when asked for */
        fl_optim_free(opt);
        cfg.clip_norm = 0;
        opt = fl_optim_create(&cfg, p, 3, FL_DTYPE_F64, k);
        CHECK(opt != NULL);
        if (opt) {
            CHECK_OK(fl_optim_step(opt, 0.0, &norm));
            CHECK_NEAR(norm, 1.0, 1e-15);
        }
        fl_optim_free(opt);
    }
}

static void test_bad_configs(void) {
    small_net s;
    small_net_init(&s);
    const fl_backend *k = fl_backend_ref();
    struct {
        fl_optim_config cfg;
        const char *msg;
    } bad[] = {
        {{.type = FL_OPTIM_MOMENTUM, .momentum = 1.0}, "momentum 1 outside [0, 1)"},
        {{.type = FL_OPTIM_MOMENTUM, .momentum = -0.1}, "momentum -0.1"},
        {{.type = FL_OPTIM_MOMENTUM, .momentum = NAN}, "momentum"},
        {{.type = FL_OPTIM_SGD, .nesterov = true}, "nesterov"},
        {{.type = FL_OPTIM_SGD, .momentum = 0.9}, "momentum 0.9 given to SGD"},
        {{.type = FL_OPTIM_SGD, .weight_decay = -1e-4}, "weight_decay"},
        {{.type = FL_OPTIM_SGD, .weight_decay = INFINITY}, "weight_decay"},
        {{.type = (fl_optim_type)7}, "unknown type 7"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_clear_error();
        fl_optim *opt = fl_optim_create(&bad[i].cfg, s.p, 3, FL_DTYPE_F64, k);
        CHECK(opt == NULL);
        fl_optim_free(opt);
        CHECK_MSG(bad[i].msg);
    }
    fl_optim_config ok = {.type = FL_OPTIM_SGD};
    /* parameters of another dtype than the optimizer's */
    CHECK(fl_optim_create(&ok, s.p, 3, FL_DTYPE_F32, k) == NULL);
    CHECK_MSG("'fc.weight' is f64");
    CHECK(fl_optim_create(&ok, s.p, 3, FL_DTYPE_F16, k) == NULL);
    CHECK_MSG("f16");
    /* a gradient whose size is not the value's */
    s.p[1].grad.numel = 3;
    CHECK(fl_optim_create(&ok, s.p, 3, FL_DTYPE_F64, k) == NULL);
    CHECK_MSG("gradient of 'fc.bias'");
    s.p[1].grad.numel = 2;
    /* a state name that does not fit (SGD keeps no state, so it does not mind) */
    memset(s.p[0].name, 'x', sizeof s.p[0].name - 1);
    fl_optim *sgd = fl_optim_create(&ok, s.p, 3, FL_DTYPE_F64, k);
    CHECK(sgd != NULL);
    fl_optim_free(sgd);
    fl_optim_config mom = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    CHECK(fl_optim_create(&mom, s.p, 3, FL_DTYPE_F64, k) == NULL);
    CHECK_MSG("opt.velocity.xxx");
    snprintf(s.p[0].name, sizeof s.p[0].name, "fc.weight");
    /* a bad learning rate at step time */
    fl_optim *opt = fl_optim_create(&ok, s.p, 3, FL_DTYPE_F64, k);
    CHECK(opt != NULL);
    if (opt) {
        CHECK_RC(fl_optim_step(opt, -0.1, NULL), FL_EINVAL);
        CHECK_MSG("learning rate -0.1");
        CHECK_RC(fl_optim_step(opt, NAN, NULL), FL_EINVAL);
        CHECK(memcmp(s.w, w0, sizeof w0) == 0); /* refused steps change nothing */
    }
    fl_optim_free(opt);
    /* no parameters at all is fine */
    ok.type = FL_OPTIM_MOMENTUM;
    ok.momentum = 0.5;
    opt = fl_optim_create(&ok, NULL, 0, FL_DTYPE_F32, k);
    CHECK(opt && fl_optim_num_state(opt) == 0);
    if (opt)
        CHECK_OK(fl_optim_step(opt, 0.1, NULL));
    fl_optim_free(opt);
}

/* --- schedules --- */
#define CHECK_LR(s, step, want) CHECK_NEAR(fl_lr_at((s), (step)), (want), 1e-12)

static void test_schedules(void) {
    fl_lr_schedule s = {.type = FL_LR_CONSTANT, .base_lr = 0.1};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 0.1);
    CHECK_LR(&s, 1000000, 0.1);

    /* piecewise: 0.1 before 100, 0.01 in [100, 200), 0.001 from 200 */
    s = (fl_lr_schedule){.type = FL_LR_PIECEWISE, .nboundaries = 2, .boundaries = {100, 200},
                         .values = {0.1, 0.01, 0.001}};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 0.1);
    CHECK_LR(&s, 99, 0.1);
    CHECK_LR(&s, 100, 0.01);
    CHECK_LR(&s, 101, 0.01);
    CHECK_LR(&s, 199, 0.01);
    CHECK_LR(&s, 200, 0.001);
    CHECK_LR(&s, 1000000, 0.001);
    s.nboundaries = 0; /* one value throughout */
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 500, 0.1);

    /* cosine from 1 to 0 over 100 steps; then clamped */
    s = (fl_lr_schedule){.type = FL_LR_COSINE, .base_lr = 1.0, .end_lr = 0.0, .decay_steps = 100};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 1.0);
    CHECK_LR(&s, 50, 0.5);
    CHECK_LR(&s, 100, 0.0);
    CHECK_LR(&s, 150, 0.0);
    s.end_lr = 0.1; /* 0.1 + 0.9 (1 + cos(pi/4)) / 2 at t = 25 */
    CHECK_LR(&s, 25, 0.1 + 0.9 * (1.0 + sqrt(0.5)) / 2.0);
    CHECK_LR(&s, 50, 0.55);
    CHECK_LR(&s, 100, 0.1);
    CHECK_LR(&s, 1000, 0.1);

    /* polynomial from 1 to 0.1 over 100 steps */
    s = (fl_lr_schedule){.type = FL_LR_POLYNOMIAL, .base_lr = 1.0, .end_lr = 0.1,
                         .decay_steps = 100, .power = 1.0};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 1.0);
    CHECK_LR(&s, 50, 0.55);           /* 0.1 + 0.9 * 0.5 */
    CHECK_LR(&s, 100, 0.1);
    CHECK_LR(&s, 200, 0.1);
    s.power = 2.0;
    CHECK_LR(&s, 50, 0.1 + 0.9 * 0.25);
    CHECK_LR(&s, 75, 0.1 + 0.9 * 0.0625);
    CHECK_LR(&s, 100, 0.1);

    /* warm-up 10 steps from 0 into the cosine above (base 1, end 0.1) */
    s = (fl_lr_schedule){.type = FL_LR_COSINE, .base_lr = 1.0, .end_lr = 0.1, .decay_steps = 100,
                         .warmup_steps = 10, .warmup_start_lr = 0.0};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 0.0);
    CHECK_LR(&s, 5, 0.5);
    CHECK_LR(&s, 9, 0.9);
    CHECK_LR(&s, 10, 1.0);  /* first step after warm-up = the schedule at t = 0 */
    CHECK_LR(&s, 60, 0.55); /* t = 50 */
    CHECK_LR(&s, 110, 0.1);
    /* warm-up from 0.01 into piecewise: boundaries count after the warm-up */
    s = (fl_lr_schedule){.type = FL_LR_PIECEWISE, .nboundaries = 1, .boundaries = {100},
                         .values = {0.1, 0.01}, .warmup_steps = 10, .warmup_start_lr = 0.01};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 0, 0.01);
    CHECK_LR(&s, 5, 0.01 + 0.09 * 0.5);
    CHECK_LR(&s, 10, 0.1);
    CHECK_LR(&s, 109, 0.1);
    CHECK_LR(&s, 110, 0.01);
    /* a warm-up down to a smaller rate is allowed too */
    s = (fl_lr_schedule){.type = FL_LR_CONSTANT, .base_lr = 0.1, .warmup_steps = 4,
                         .warmup_start_lr = 0.5};
    CHECK_OK(fl_lr_validate(&s));
    CHECK_LR(&s, 2, 0.3);
    CHECK_LR(&s, 4, 0.1);
}

static void test_bad_schedules(void) {
    fl_lr_schedule s = {.type = FL_LR_PIECEWISE, .nboundaries = 2, .boundaries = {500, 300},
                        .values = {0.1, 0.01, 0.001}};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.boundaries: 300 after 500 is not increasing");
    s.boundaries[1] = 500;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.boundaries: 500 after 500");
    s.boundaries[0] = 0;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.boundaries: 0 is not positive");
    s.boundaries[0] = 100;
    s.values[1] = -0.01;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.values[1]");
    s.values[1] = 0.01;
    CHECK_OK(fl_lr_validate(&s));
    s.nboundaries = FL_LR_MAX_PIECES + 1;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.nboundaries");
    s.nboundaries = -1;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.nboundaries");

    s = (fl_lr_schedule){.type = FL_LR_COSINE, .base_lr = 0.1, .decay_steps = 0};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.decay_steps");
    s = (fl_lr_schedule){.type = FL_LR_POLYNOMIAL, .base_lr = 0.1, .decay_steps = 10};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL); /* power 0 */
    CHECK_MSG("lr_schedule.power");
    s.power = 1;
    s.end_lr = -1;
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.end_lr");
    s = (fl_lr_schedule){.type = FL_LR_CONSTANT, .base_lr = -0.1};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.base_lr");
    s = (fl_lr_schedule){.type = FL_LR_CONSTANT, .base_lr = 0.1, .warmup_steps = -5};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.warmup_steps");
    s = (fl_lr_schedule){.type = FL_LR_CONSTANT, .base_lr = 0.1, .warmup_steps = 5,
                         .warmup_start_lr = NAN};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.warmup_start_lr");
    s = (fl_lr_schedule){.type = (fl_lr_type)9, .base_lr = 0.1};
    CHECK_RC(fl_lr_validate(&s), FL_EINVAL);
    CHECK_MSG("lr_schedule.type");
}

/* --- f32: the cpu table's updates against the reference table's, over sizes that include 0,
 * 1 and more than one parallel chunk */
static void fill_uniform(float *x, int64_t n, fl_rng *r, float lo, float hi) {
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * fl_rng_uniform(r);
}

/* Rounding bound for one f32 evaluation of a sum whose terms have magnitudes adding up to
 * `terms`: a couple of ulps of the largest quantity involved, which is what evaluating in f32
 * (cpu) instead of in double and rounding once (ref) can cost. */
static double f32_tol(double terms) { return 3.0 * FLT_EPSILON * terms + 1e-30; }

static void test_f32_cpu_vs_ref(void) {
    const fl_backend *cpu = fl_backend_cpu(), *ref = fl_backend_ref();
    const int64_t sizes[] = {0, 1, 7, 1000, 100003};
    const double lr = 0.05, mu = 0.9, wd = 1e-4;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        size_t nb = (size_t)(n ? n : 1) * sizeof(float);
        float *g = malloc(nb), *w = malloc(nb), *v = malloc(nb), *wc = malloc(nb),
              *vc = malloc(nb), *wr = malloc(nb), *vr = malloc(nb);
        if (!g || !w || !v || !wc || !vc || !wr || !vr) {
            CHECK(!"out of memory");
            goto next;
        }
        for (int variant = 0; variant < 3; variant++) {
            fl_rng r;
            fl_rng_init(&r, 1234, (uint64_t)si);
            fill_uniform(w, n, &r, -1, 1);
            memset(v, 0, nb);
            /* three steps; each starts both tables from the same (reference) state, so that
             * the comparison is of one evaluation, not of compounded differences */
            for (int t = 0; t < 3; t++) {
                fill_uniform(g, n, &r, -2, 2);
                memcpy(wc, w, nb);
                memcpy(wr, w, nb);
                memcpy(vc, v, nb);
                memcpy(vr, v, nb);
                bool nest = variant == 2;
                if (variant == 0) {
                    cpu->sgd_update(FL_DTYPE_F32, n, wc, g, lr, wd);
                    ref->sgd_update(FL_DTYPE_F32, n, wr, g, lr, wd);
                } else {
                    cpu->momentum_update(FL_DTYPE_F32, n, wc, g, vc, lr, mu, wd, nest);
                    ref->momentum_update(FL_DTYPE_F32, n, wr, g, vr, lr, mu, wd, nest);
                }
                int64_t bad = -1;
                double maxdiff = 0;
                for (int64_t i = 0; i < n; i++) {
                    double d = fabs((double)g[i]) + wd * fabs((double)w[i]);
                    double vnew = mu * fabs((double)v[i]) + d;
                    double tv = f32_tol(vnew);
                    double tw = f32_tol(fabs((double)w[i]) + lr * (d + 2.0 * vnew));
                    double dw = fabs((double)wc[i] - wr[i]), dv = fabs((double)vc[i] - vr[i]);
                    maxdiff = fmax(maxdiff, fmax(dw, dv));
                    if (bad < 0 && (!(dw <= tw) || (variant && !(dv <= tv))))
                        bad = i;
                }
                if (bad >= 0) {
                    fprintf(stderr,
                            "f32 update variant %d n=%lld step %d: mismatch at [%lld]: w cpu "
                            "%.9g ref %.9g, v cpu %.9g ref %.9g; max |diff| %.3g\n",
                            variant, (long long)n, t, (long long)bad, (double)wc[bad],
                            (double)wr[bad], (double)vc[bad], (double)vr[bad], maxdiff);
                    test_failures++;
                }
                memcpy(w, wr, nb);
                memcpy(v, vr, nb);
            }
        }
        /* sumsq and scale, which clipping uses */
        double sc = cpu->sumsq(FL_DTYPE_F32, g, n), sr = ref->sumsq(FL_DTYPE_F32, g, n);
        CHECK_NEAR(sc, sr, 1e-9 * (1 + fabs(sr)));
        memcpy(wc, g, nb);
        memcpy(wr, g, nb);
        cpu->scale(FL_DTYPE_F32, n, 0.37, wc);
        ref->scale(FL_DTYPE_F32, n, 0.37, wr);
        CHECK_CLOSE_F32("f32 scale cpu vs ref", wc, wr, n, 1e-30, 2.5e-7);
    next:
        free(g);
        free(w);
        free(v);
        free(wc);
        free(vc);
        free(wr);
        free(vr);
    }
}

/* A whole optimizer (Nesterov, decay, clipping) on f32 params with each table. */
static void test_f32_optim_cpu_vs_ref(void) {
    enum { N = 5000 };
    static float w[2][N], gr[2][N];
    const fl_backend *tables[2] = {fl_backend_cpu(), fl_backend_ref()};
    fl_param p[2][1];
    fl_optim *opt[2] = {0};
    int64_t shape[] = {50, 100};
    fl_optim_config cfg = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .nesterov = true,
                           .weight_decay = 5e-4, .clip_norm = 1.0};
    for (int k = 0; k < 2; k++) {
        fl_rng r;
        fl_rng_init(&r, 77, 0);
        fill_uniform(w[k], N, &r, -0.5f, 0.5f);
        memset(p[k], 0, sizeof p[k]);
        snprintf(p[k][0].name, sizeof p[k][0].name, "w");
        fl_tensor_view(&p[k][0].value, FL_DTYPE_F32, 2, shape, w[k]);
        fl_tensor_view(&p[k][0].grad, FL_DTYPE_F32, 2, shape, gr[k]);
        p[k][0].trainable = true;
        opt[k] = fl_optim_create(&cfg, p[k], 1, FL_DTYPE_F32, tables[k]);
        CHECK(opt[k] != NULL);
    }
    if (!opt[0] || !opt[1])
        goto out;
    for (int t = 0; t < 3; t++) {
        double norm[2];
        for (int k = 0; k < 2; k++) {
            fl_rng r;
            fl_rng_init(&r, 78, (uint64_t)t);
            fill_uniform(gr[k], N, &r, -0.1f, 0.1f);
            CHECK_OK(fl_optim_step(opt[k], 0.1, &norm[k]));
        }
        CHECK(norm[0] > 1.0); /* so clipping did act */
        CHECK_NEAR(norm[0], norm[1], 1e-9 * norm[1]);
    }
    CHECK_CLOSE_F32("f32 optimizer cpu vs ref", w[0], w[1], N, 1e-7, 1e-6);
out:
    fl_optim_free(opt[0]);
    fl_optim_free(opt[1]);
}

/* --- runs: parameters back to back in memory are updated by one kernel call --- */

static int calls;
static int64_t call_n[8];
static fl_backend counting; /* the cpu table, its two updates counted */
static void count_sgd(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd) {
    if (calls < 8)
        call_n[calls] = n;
    calls++;
    fl_backend_cpu()->sgd_update(t, n, w, g, lr, wd);
}
static void count_momentum(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                           double mu, double wd, bool nesterov) {
    if (calls < 8)
        call_n[calls] = n;
    calls++;
    fl_backend_cpu()->momentum_update(t, n, w, g, v, lr, mu, wd, nesterov);
}

/* Three trainable tensors (3, 5, 4 values) and a buffer listed between the first two, values
 * in one block and gradients in another (a network's layout); split: the third's gradient
 * elsewhere.
 * The optimizer must give the bits of one update per tensor, in as many calls as there are
 * runs. */
static void check_runs(fl_optim_type type, bool split) {
    enum { NV = 12 };
    static const int64_t len[4] = {3, 2, 5, 4}; /* w0, buffer, w1, w2 */
    float w[NV + 2], g[NV], g2[4], want[NV + 2], vel[NV];
    fl_rng r;
    fl_rng_init(&r, 5, (uint64_t)split);
    fill_uniform(w, NV + 2, &r, -1, 1);
    fill_uniform(g, NV, &r, -1, 1);
    memcpy(g2, g + 8, sizeof g2);
    memcpy(want, w, sizeof w);
    memset(vel, 0, sizeof vel);
    fl_param p[4];
    memset(p, 0, sizeof p);
    int64_t off = 0, goff = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(p[i].name, sizeof p[i].name, "p%d", i);
        p[i].trainable = i != 1;
        fl_tensor_view(&p[i].value, FL_DTYPE_F32, 1, &len[i], w + off);
        if (p[i].trainable) {
            fl_tensor_view(&p[i].grad, FL_DTYPE_F32, 1, &len[i],
                           split && i == 3 ? g2 : g + goff);
            goff += len[i];
        }
        off += len[i];
    }
    /* the buffer's value behind the others (as a network's buffers are), its parameter
     * between theirs in the list */
    p[1].value.data = w + NV;
    p[2].value.data = w + 3, p[3].value.data = w + 8;
    fl_optim_config cfg = {.type = type, .momentum = type == FL_OPTIM_SGD ? 0 : 0.9,
                           .weight_decay = 1e-2};
    fl_optim *opt = fl_optim_create(&cfg, p, 4, FL_DTYPE_F32, &counting);
    CHECK(opt != NULL);
    if (!opt)
        return;
    for (int step = 0; step < 2; step++) {
        calls = 0;
        CHECK_OK(fl_optim_step(opt, 0.5, NULL));
        CHECK(calls == (split ? 2 : 1));
        if (!split)
            CHECK(call_n[0] == NV);
        else
            CHECK(call_n[0] == 8 && call_n[1] == 4);
        for (int i = 0; i < 4; i++) { /* the same update a tensor at a time */
            if (!p[i].trainable)
                continue;
            int64_t at = (float *)p[i].value.data - w;
            const float *gi = p[i].grad.data;
            float *vi = vel + at; /* the velocities follow the values' order */
            if (type == FL_OPTIM_SGD)
                fl_backend_cpu()->sgd_update(FL_DTYPE_F32, len[i], want + at, gi, 0.5, 1e-2);
            else
                fl_backend_cpu()->momentum_update(FL_DTYPE_F32, len[i], want + at, gi, vi, 0.5,
                                                  0.9, 1e-2, false);
        }
        CHECK(memcmp(w, want, sizeof w) == 0);
    }
    fl_optim_free(opt);
}

static void test_runs(void) {
    counting = *fl_backend_cpu();
    counting.sgd_update = count_sgd;
    counting.momentum_update = count_momentum;
    for (int split = 0; split < 2; split++) {
        check_runs(FL_OPTIM_SGD, split);
        check_runs(FL_OPTIM_MOMENTUM, split);
    }
}

int main(void) {
    const fl_backend *tables[] = {fl_backend_ref(), fl_backend_cpu()};
    for (int k = 0; k < 2; k++) {
        for (int wdi = 0; wdi < 2; wdi++) {
            double wd = wdi ? 0.1 : 0.0;
            run_rule(tables[k], FL_OPTIM_SGD, false, wd);
            run_rule(tables[k], FL_OPTIM_MOMENTUM, false, wd);
            run_rule(tables[k], FL_OPTIM_MOMENTUM, true, wd);
        }
        test_hand_values(tables[k]);
        test_clip(tables[k]);
    }
    test_state();
    test_bad_configs();
    test_schedules();
    test_bad_schedules();
    test_f32_cpu_vs_ref();
    test_f32_optim_cpu_vs_ref();
    test_runs();
    TEST_DONE();
}
