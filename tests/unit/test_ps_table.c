/* test_ps_table.c - the parameter server's rules and tables (src/ps/table.h): SGD and Momentum
 * bit for bit against fl_optim_step on the ref backend, Adam and Adagrad against plain double
 * references, the dense block's merge of a sync step, and the sparse table: deterministic row
 * creation, repeated ids, pending sums, growth through rehashes, id order, dirty rows, put,
 * bytes per row at 10^6 rows (counters included); the life cycle on hand-built sequences
 * (show and click counts, entry count and probability, shrink by score and by unseen passes,
 * slots and bytes reused; pushes with slot hints, fresh or stale, as pushes without); and
 * the refusals of bad rules and tables, naming the field. */
#include "ps/table.h"

#include "fleet/backend.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>

static void fill_normal(fl_rng *r, float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * fl_rng_normal(r));
}

/* ---- rules ---- */

/* SGD and Momentum (+Nesterov, +L2) against fl_optim_step on the ref backend: the values and
 * the velocities must agree in every bit after each of several steps. */
static void test_rule_matches_optim(fl_ps_rule_type type, bool nesterov, double wd) {
    enum { N = 67, STEPS = 6 };
    char what[96];
    snprintf(what, sizeof what, "%s%s wd=%g", fl_ps_rule_name(type), nesterov ? " nesterov" : "",
             wd);
    float w_opt[N], g[N], w_ps[N], state[N];
    fl_rng r;
    fl_rng_init(&r, 11, 0);
    fill_normal(&r, w_opt, N, 1.0);
    memcpy(w_ps, w_opt, sizeof w_ps);

    fl_param p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "w");
    int64_t shape[] = {N};
    fl_tensor_view(&p.value, FL_DTYPE_F32, 1, shape, w_opt);
    fl_tensor_view(&p.grad, FL_DTYPE_F32, 1, shape, g);
    p.trainable = true;
    fl_optim_config cfg = {.type = type == FL_PS_RULE_SGD ? FL_OPTIM_SGD : FL_OPTIM_MOMENTUM,
                           .momentum = type == FL_PS_RULE_SGD ? 0 : 0.9,
                           .nesterov = nesterov, .weight_decay = wd};
    fl_optim *opt = fl_optim_create(&cfg, &p, 1, FL_DTYPE_F32, fl_backend_ref());
    CHECK(opt != NULL);
    if (!opt)
        return;

    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, type);
    rule.nesterov = nesterov;
    rule.weight_decay = wd;
    CHECK_OK(fl_ps_rule_check(&rule, false));
    CHECK(fl_ps_rule_state_per_value(&rule) == (type == FL_PS_RULE_SGD ? 0 : 1));
    CHECK(fl_ps_rule_state_per_row(&rule) == 0);
    fl_ps_rule_state_init(&rule, state, N);

    for (int t = 0; t < STEPS; t++) {
        double lr = 0.1 / (1 + t); /* a different rate each step */
        fill_normal(&r, g, N, 0.5);
        CHECK_OK(fl_optim_step(opt, lr, NULL));
        fl_ps_rule_apply(&rule, lr, w_ps, g, state, N);
        if (memcmp(w_ps, w_opt, sizeof w_ps) != 0) {
            fprintf(stderr, "%s step %d: values differ from fl_optim_step's bits\n", what, t);
            test_failures++;
            break;
        }
        if (type == FL_PS_RULE_MOMENTUM &&
            memcmp(state, fl_optim_state(opt, 0)->value.data, sizeof state) != 0) {
            fprintf(stderr, "%s step %d: velocities differ from fl_optim_step's bits\n", what, t);
            test_failures++;
            break;
        }
    }
    fl_optim_free(opt);
}

/* Adam against Kingma & Ba's algorithm in double with Paddle's epsilon placement:
 * w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps sqrt(1 - b2^t)). The f32 state and
 * the f32 beta powers round where the reference does not: over 12 steps the values stay within
 * 1e-6 + 1e-5 |w|. */
static void test_rule_adam(double wd) {
    enum { N = 33, STEPS = 12 };
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAM);
    CHECK(rule.beta1 == 0.9 && rule.beta2 == 0.999 && rule.epsilon == 1e-8);
    rule.weight_decay = wd;
    CHECK_OK(fl_ps_rule_check(&rule, false));
    CHECK_OK(fl_ps_rule_check(&rule, true));
    CHECK(fl_ps_rule_state_per_value(&rule) == 2 && fl_ps_rule_state_per_row(&rule) == 2);
    float w[N], g[N], state[2 * N + 2];
    double rw[N], rm[N] = {0}, rv[N] = {0}, b1p = 1, b2p = 1;
    fl_rng r;
    fl_rng_init(&r, 12, 0);
    fill_normal(&r, w, N, 1.0);
    for (int i = 0; i < N; i++)
        rw[i] = w[i];
    fl_ps_rule_state_init(&rule, state, N);
    CHECK(state[2 * N] == 1.0f && state[2 * N + 1] == 1.0f && state[0] == 0 && state[N] == 0);
    for (int t = 0; t < STEPS; t++) {
        double lr = 0.01 * (1 + t % 3);
        fill_normal(&r, g, N, 0.3);
        fl_ps_rule_apply(&rule, lr, w, g, state, N);
        b1p *= 0.9;
        b2p *= 0.999;
        for (int i = 0; i < N; i++) {
            double d = g[i] + wd * rw[i];
            rm[i] = 0.9 * rm[i] + 0.1 * d;
            rv[i] = 0.999 * rv[i] + 0.001 * d * d;
            double lr_t = lr * sqrt(1 - b2p) / (1 - b1p);
            rw[i] -= lr_t * rm[i] / (sqrt(rv[i]) + 1e-8 * sqrt(1 - b2p));
        }
    }
    double got[N];
    for (int i = 0; i < N; i++)
        got[i] = w[i];
    CHECK_CLOSE(wd > 0 ? "adam wd" : "adam", got, rw, N, 1e-6, 1e-5);
    CHECK_NEAR(state[2 * N], b1p, 1e-6);
    CHECK_NEAR(state[2 * N + 1], b2p, 1e-6);
}

/* Adagrad against Paddle's SparseAdaGradSGDRule in double: one g2sum for the row. */
static void test_rule_adagrad(void) {
    enum { N = 8, STEPS = 15 };
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    CHECK(rule.initial_g2sum == 3 && rule.epsilon == 1e-6);
    CHECK_OK(fl_ps_rule_check(&rule, true));
    CHECK(fl_ps_rule_state_per_value(&rule) == 0 && fl_ps_rule_state_per_row(&rule) == 1);
    float w[N], g[N], g2sum;
    double rw[N], rg2 = 0;
    fl_rng r;
    fl_rng_init(&r, 13, 0);
    fill_normal(&r, w, N, 0.1);
    for (int i = 0; i < N; i++)
        rw[i] = w[i];
    fl_ps_rule_state_init(&rule, &g2sum, N);
    CHECK(g2sum == 0.0f);
    for (int t = 0; t < STEPS; t++) {
        double lr = 0.05;
        fill_normal(&r, g, N, 1.0 + t);
        fl_ps_rule_apply(&rule, lr, w, g, &g2sum, N);
        double add = 0;
        for (int i = 0; i < N; i++) {
            rw[i] -= lr * g[i] * sqrt(3.0 / (3.0 + rg2));
            add += (double)g[i] * g[i];
        }
        rg2 += add / N;
    }
    double got[N];
    for (int i = 0; i < N; i++)
        got[i] = w[i];
    CHECK_CLOSE("adagrad", got, rw, N, 1e-6, 1e-5);
    CHECK_NEAR(g2sum, rg2, 1e-5 * rg2);
}

static void test_rule_sum(void) {
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_SUM);
    CHECK_OK(fl_ps_rule_check(&rule, false));
    CHECK_OK(fl_ps_rule_check(&rule, true));
    float w[3] = {1, 2, 3}, g[3] = {0.5f, -2, 0.25f};
    fl_ps_rule_apply(&rule, 123.0, w, g, NULL, 3); /* lr ignored */
    CHECK(w[0] == 1.5f && w[1] == 0.0f && w[2] == 3.25f);
}

/* A bad field is refused with FL_ECONFIG and named. */
static void test_rule_check(void) {
    struct {
        fl_ps_rule_type type;
        bool sparse;
        const char *field;
        double value;
        const char *needle;
    } cases[] = {
        {FL_PS_RULE_MOMENTUM, false, "momentum", 1.0, "momentum 1"},
        {FL_PS_RULE_MOMENTUM, false, "momentum", -0.5, "momentum -0.5"},
        {FL_PS_RULE_SGD, false, "momentum", 0.9, "momentum 0.9"},
        {FL_PS_RULE_SGD, true, "weight_decay", -1, "weight_decay -1"},
        {FL_PS_RULE_MOMENTUM, false, "weight_decay", NAN, "weight_decay"},
        {FL_PS_RULE_ADAGRAD, true, "weight_decay", 0.1, "weight_decay 0.1"},
        {FL_PS_RULE_ADAM, false, "beta1", 1.0, "beta1 1"},
        {FL_PS_RULE_ADAM, true, "beta2", -0.1, "beta2 -0.1"},
        {FL_PS_RULE_ADAM, false, "epsilon", 0.0, "epsilon 0"},
        {FL_PS_RULE_ADAGRAD, true, "initial_g2sum", 0.0, "initial_g2sum 0"},
        {FL_PS_RULE_ADAGRAD, true, "initial_g2sum", INFINITY, "initial_g2sum inf"},
        {FL_PS_RULE_ADAGRAD, true, "epsilon", -1e-6, "epsilon -1e-06"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fl_ps_rule r;
        fl_ps_rule_defaults(&r, cases[c].type);
        CHECK_OK(fl_ps_rule_check(&r, cases[c].sparse));
        double *f = !strcmp(cases[c].field, "momentum")       ? &r.momentum
                    : !strcmp(cases[c].field, "weight_decay") ? &r.weight_decay
                    : !strcmp(cases[c].field, "beta1")        ? &r.beta1
                    : !strcmp(cases[c].field, "beta2")        ? &r.beta2
                    : !strcmp(cases[c].field, "epsilon")      ? &r.epsilon
                                                              : &r.initial_g2sum;
        *f = cases[c].value;
        CHECK_RC(fl_ps_rule_check(&r, cases[c].sparse), FL_ECONFIG);
        CHECK_MSG(cases[c].needle);
        CHECK_MSG(fl_ps_rule_name(cases[c].type));
    }
    fl_ps_rule r;
    fl_ps_rule_defaults(&r, FL_PS_RULE_SGD);
    r.nesterov = true;
    CHECK_RC(fl_ps_rule_check(&r, false), FL_ECONFIG);
    CHECK_MSG("nesterov");
    fl_ps_rule_defaults(&r, FL_PS_RULE_MOMENTUM);
    CHECK_RC(fl_ps_rule_check(&r, true), FL_ECONFIG);
    CHECK_MSG("momentum cannot serve a sparse table");
    fl_ps_rule_defaults(&r, FL_PS_RULE_ADAGRAD);
    CHECK_RC(fl_ps_rule_check(&r, false), FL_ECONFIG);
    CHECK_MSG("adagrad cannot serve a dense table");
    fl_ps_rule_defaults(&r, FL_PS_RULE_SGD);
    r.type = (fl_ps_rule_type)9;
    CHECK_RC(fl_ps_rule_check(&r, false), FL_ECONFIG);
    CHECK_MSG("type 9");
    CHECK(!strcmp(fl_ps_rule_name(FL_PS_RULE_ADAGRAD), "adagrad"));
    CHECK(!strcmp(fl_ps_rule_name((fl_ps_rule_type)9), "unknown"));
}

/* ---- dense ---- */

/* Three pushes summed, applied with scale 1/3: the rule applied once to the f32 mean. */
static void test_dense_block(void) {
    enum { N = 1000, W = 3 };
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_MOMENTUM);
    rule.nesterov = true;
    rule.weight_decay = 1e-4;
    fl_ps_block b;
    CHECK_OK(fl_ps_block_init(&b, N, &rule));
    if (!b.value)
        return;
    static float w0[N], v[N], g[W][N], mean[N];
    fl_rng r;
    fl_rng_init(&r, 21, 0);
    fill_normal(&r, b.value, N, 1.0);
    memcpy(w0, b.value, sizeof w0);
    fl_ps_rule_state_init(&rule, v, N);
    for (int step = 0; step < 2; step++) {
        for (int k = 0; k < W; k++) {
            fill_normal(&r, g[k], N, 1.0);
            fl_ps_block_accumulate(&b, g[k]);
        }
        CHECK(b.pushes == W);
        for (int i = 0; i < N; i++)
            mean[i] = (float)((double)((g[0][i] + g[1][i]) + g[2][i]) * (1.0 / W));
        fl_ps_block_apply_accum(&b, &rule, 0.05, 1.0 / W);
        fl_ps_rule_apply(&rule, 0.05, w0, mean, v, N);
        CHECK(memcmp(w0, b.value, sizeof w0) == 0);
        CHECK(memcmp(v, b.state, sizeof v) == 0);
        CHECK(b.pushes == 0);
        bool zero = true;
        for (int i = 0; i < N; i++)
            zero &= b.accum[i] == 0.0f;
        CHECK(zero);
    }
    fl_ps_block_clear(&b);
    CHECK(b.value == NULL && b.numel == 0);
    fl_ps_block_clear(&b); /* twice: harmless */

    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    CHECK_RC(fl_ps_block_init(&b, N, &rule), FL_ECONFIG);
    fl_ps_rule_defaults(&rule, FL_PS_RULE_SGD);
    CHECK_RC(fl_ps_block_init(&b, 0, &rule), FL_EINVAL);
    CHECK_MSG("0 values");
}

/* ---- sparse ---- */

static fl_ps_sparse *make_table(int table, int dim, fl_ps_rule_type type, fl_ps_init_type init,
                                double a, double b, uint64_t seed) {
    fl_ps_rule r;
    fl_ps_rule_defaults(&r, type);
    fl_ps_init_rule in = {.type = init, .a = a, .b = b, .seed = seed};
    fl_ps_sparse *t = NULL;
    CHECK_OK(fl_ps_sparse_create(table, dim, &r, &in, &t));
    return t;
}

static void test_sparse_create_refuses(void) {
    fl_ps_rule r;
    fl_ps_rule_defaults(&r, FL_PS_RULE_SGD);
    fl_ps_init_rule in = {.type = FL_PS_INIT_UNIFORM, .a = -1, .b = 1};
    fl_ps_sparse *t = (fl_ps_sparse *)&r;
    CHECK_RC(fl_ps_sparse_create(2, 0, &r, &in, &t), FL_EINVAL);
    CHECK_MSG("dim 0");
    CHECK(t == NULL);
    CHECK_RC(fl_ps_sparse_create(2, 4097, &r, &in, &t), FL_EINVAL);
    CHECK_MSG("dim 4097");
    in.a = 2;
    CHECK_RC(fl_ps_sparse_create(2, 8, &r, &in, &t), FL_EINVAL);
    CHECK_MSG("uniform");
    in = (fl_ps_init_rule){.type = FL_PS_INIT_NORMAL, .a = 0, .b = -1};
    CHECK_RC(fl_ps_sparse_create(2, 8, &r, &in, &t), FL_EINVAL);
    CHECK_MSG("normal");
    in = (fl_ps_init_rule){.type = (fl_ps_init_type)7};
    CHECK_RC(fl_ps_sparse_create(2, 8, &r, &in, &t), FL_EINVAL);
    CHECK_MSG("initializer type 7");
    in = (fl_ps_init_rule){.type = FL_PS_INIT_ZERO};
    fl_ps_rule_defaults(&r, FL_PS_RULE_MOMENTUM);
    CHECK_RC(fl_ps_sparse_create(2, 8, &r, &in, &t), FL_ECONFIG);
    CHECK_MSG("ps sparse table 2");
    CHECK_MSG("sparse");
    fl_ps_sparse_free(NULL);
}

/* A row is a function of (seed, table, id): the same in two tables whatever the order of the
 * pulls, different for another id, table number or seed. */
static void test_sparse_deterministic(void) {
    enum { DIM = 9 };
    fl_ps_sparse *a = make_table(3, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_NORMAL, 0, 0.5, 7);
    fl_ps_sparse *b = make_table(3, DIM, FL_PS_RULE_SGD, FL_PS_INIT_NORMAL, 0, 0.5, 7);
    fl_ps_sparse *c = make_table(4, DIM, FL_PS_RULE_SGD, FL_PS_INIT_NORMAL, 0, 0.5, 7);
    fl_ps_sparse *d = make_table(3, DIM, FL_PS_RULE_SGD, FL_PS_INIT_NORMAL, 0, 0.5, 8);
    if (!a || !b || !c || !d)
        goto done;
    uint64_t ids[] = {42, 7, UINT64_MAX, 0, 42, 1ull << 40};
    uint64_t rev[] = {1ull << 40, 42, 0, UINT64_MAX, 7, 42};
    float ra[6][DIM], rb[6][DIM], rc[6][DIM], rd[6][DIM];
    CHECK_OK(fl_ps_sparse_pull_rows(a, ids, 6, &ra[0][0]));
    CHECK_OK(fl_ps_sparse_pull_rows(b, rev, 6, &rb[0][0]));
    CHECK_OK(fl_ps_sparse_pull_rows(c, ids, 6, &rc[0][0]));
    CHECK_OK(fl_ps_sparse_pull_rows(d, ids, 6, &rd[0][0]));
    CHECK(fl_ps_sparse_rows(a) == 5 && fl_ps_sparse_rows(b) == 5);
    CHECK(fl_ps_sparse_dim(a) == DIM);
    for (int i = 0; i < 6; i++) {
        CHECK(memcmp(ra[i], rb[5 - i], sizeof ra[i]) == 0);
        CHECK(memcmp(ra[i], rc[i], sizeof ra[i]) != 0);
        CHECK(memcmp(ra[i], rd[i], sizeof ra[i]) != 0);
    }
    CHECK(memcmp(ra[0], ra[4], sizeof ra[0]) == 0); /* 42 twice */
    for (int i = 0; i < 4; i++)
        for (int k = i + 1; k < 4; k++)
            CHECK(memcmp(ra[i], ra[k], sizeof ra[i]) != 0);
    bool distinct = true; /* values inside a row differ too */
    for (int j = 1; j < DIM; j++)
        distinct &= ra[0][j] != ra[0][j - 1];
    CHECK(distinct);
done:
    fl_ps_sparse_free(a);
    fl_ps_sparse_free(b);
    fl_ps_sparse_free(c);
    fl_ps_sparse_free(d);
}

/* Mean and standard deviation of 160000 drawn values near the initializer's: within 0.03 of
 * them (the standard errors are 0.005 and below: 6 of them). */
static void test_sparse_init_moments(fl_ps_init_type type, double a, double b, double mean,
                                     double sd) {
    enum { DIM = 8, ROWS = 20000 };
    fl_ps_sparse *t = make_table(1, DIM, FL_PS_RULE_SGD, type, a, b, 99);
    static uint64_t ids[ROWS];
    static float out[ROWS * DIM];
    if (!t)
        return;
    for (int i = 0; i < ROWS; i++)
        ids[i] = (uint64_t)i * 1000003u; /* spread ids */
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, ROWS, out));
    double s = 0, s2 = 0, lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < ROWS * DIM; i++) {
        s += out[i];
        s2 += (double)out[i] * out[i];
        lo = fmin(lo, out[i]);
        hi = fmax(hi, out[i]);
    }
    double m = s / (ROWS * DIM), v = s2 / (ROWS * DIM) - m * m;
    printf("init %d (%g, %g): mean %.4f sd %.4f over %d values, range [%.4f, %.4f]\n", (int)type,
           a, b, m, sqrt(v), ROWS * DIM, lo, hi);
    CHECK_NEAR(m, mean, 0.03 * (sd > 0 ? sd : 1));
    CHECK_NEAR(sqrt(v), sd, 0.03 * (sd > 0 ? sd : 1));
    if (type == FL_PS_INIT_UNIFORM)
        CHECK(lo >= a && hi < b);
    if (type == FL_PS_INIT_ZERO)
        CHECK(lo == 0 && hi == 0);
    fl_ps_sparse_free(t);
}

/* Push with a repeated id updates it once per occurrence, in order (Adagrad: order matters). */
static void test_sparse_push_repeats(void) {
    enum { DIM = 4 };
    fl_ps_sparse *t = make_table(0, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_UNIFORM, -1, 1, 5);
    if (!t)
        return;
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    uint64_t ids[] = {5, 9, 5, 5};
    float g[4][DIM] = {{1, 2, 3, 4}, {-1, 0, 1, 0}, {0.5f, 0.5f, -0.5f, 2}, {3, -3, 1, 1}};
    float row5[DIM], row9[DIM], g2_5 = 0, g2_9 = 0;
    CHECK_OK(fl_ps_sparse_pull_rows(t, &ids[0], 1, row5));
    CHECK_OK(fl_ps_sparse_pull_rows(t, &ids[1], 1, row9));
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, 4, &g[0][0], 0.1));
    fl_ps_rule_apply(&rule, 0.1, row5, g[0], &g2_5, DIM);
    fl_ps_rule_apply(&rule, 0.1, row9, g[1], &g2_9, DIM);
    fl_ps_rule_apply(&rule, 0.1, row5, g[2], &g2_5, DIM);
    fl_ps_rule_apply(&rule, 0.1, row5, g[3], &g2_5, DIM);
    float got[2][DIM];
    uint64_t q[] = {5, 9};
    CHECK_OK(fl_ps_sparse_pull_rows(t, q, 2, &got[0][0]));
    CHECK(memcmp(got[0], row5, sizeof row5) == 0);
    CHECK(memcmp(got[1], row9, sizeof row9) == 0);
    /* a push to a missing row creates it first (initializer), then applies the rule */
    fl_ps_sparse *u = make_table(0, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_UNIFORM, -1, 1, 5);
    if (u) {
        uint64_t id = 77;
        float fresh[DIM], g2 = 0, after[DIM];
        CHECK_OK(fl_ps_sparse_pull_rows(t, &id, 1, fresh)); /* t's row 77: the same draw */
        CHECK_OK(fl_ps_sparse_push_rows(u, &id, 1, g[0], 0.1));
        fl_ps_rule_apply(&rule, 0.1, fresh, g[0], &g2, DIM);
        CHECK_OK(fl_ps_sparse_pull_rows(u, &id, 1, after));
        CHECK(memcmp(after, fresh, sizeof after) == 0);
        fl_ps_sparse_free(u);
    }
    fl_ps_sparse_free(t);
}

/* Three workers' pushes accumulated and applied with scale 1/3 equal one push of the f32 means
 * (sums in arrival order), ids in ascending order; the pending sums are then gone. */
static void test_sparse_pending(void) {
    enum { DIM = 8, W = 3, PER = 50 };
    fl_ps_sparse *t = make_table(6, DIM, FL_PS_RULE_ADAM, FL_PS_INIT_NORMAL, 0, 0.1, 3);
    fl_ps_sparse *ref = make_table(6, DIM, FL_PS_RULE_ADAM, FL_PS_INIT_NORMAL, 0, 0.1, 3);
    if (!t || !ref)
        goto done;
    static uint64_t ids[W][PER];
    static float g[W][PER][DIM];
    static float sum_f[64][DIM]; /* ids are 0..63 */
    static bool seen[64];
    memset(sum_f, 0, sizeof sum_f);
    memset(seen, 0, sizeof seen);
    fl_rng r;
    fl_rng_init(&r, 31, 0);
    for (int step = 0; step < 2; step++) {
        memset(sum_f, 0, sizeof sum_f);
        memset(seen, 0, sizeof seen);
        for (int k = 0; k < W; k++) {
            for (int i = 0; i < PER; i++) {
                ids[k][i] = fl_rng_below(&r, 64); /* repeats within and across workers */
                fill_normal(&r, g[k][i], DIM, 1.0);
                for (int j = 0; j < DIM; j++)
                    sum_f[ids[k][i]][j] += g[k][i][j];
                seen[ids[k][i]] = true;
            }
            CHECK_OK(fl_ps_sparse_accumulate(t, ids[k], PER, &g[k][0][0]));
        }
        CHECK_OK(fl_ps_sparse_apply_pending(t, 0.01, 1.0 / W));
        uint64_t uids[64];
        float mean[64][DIM];
        int n = 0;
        for (int id = 0; id < 64; id++) {
            if (!seen[id])
                continue;
            uids[n] = (uint64_t)id;
            for (int j = 0; j < DIM; j++)
                mean[n][j] = (float)((double)sum_f[id][j] * (1.0 / W));
            n++;
        }
        CHECK_OK(fl_ps_sparse_push_rows(ref, uids, n, &mean[0][0], 0.01));
        CHECK(fl_ps_sparse_rows(t) == fl_ps_sparse_rows(ref));
    }
    /* nothing pending any more: applying again changes nothing */
    CHECK_OK(fl_ps_sparse_apply_pending(t, 0.01, 1.0 / W));
    uint64_t all[64];
    for (int i = 0; i < 64; i++)
        all[i] = (uint64_t)i;
    static float got[64][DIM], want[64][DIM];
    CHECK_OK(fl_ps_sparse_pull_rows(t, all, 64, &got[0][0]));
    CHECK_OK(fl_ps_sparse_pull_rows(ref, all, 64, &want[0][0]));
    CHECK(memcmp(got, want, sizeof got) == 0);
done:
    fl_ps_sparse_free(t);
    fl_ps_sparse_free(ref);
}

/* Visit collecting ids, checking ascending order and each row's contents. */
typedef struct {
    int64_t n;
    uint64_t last;
    bool ascending;
    uint64_t *ids; /* may be NULL */
    int64_t cap;
    int dim;
    bool values_ok; /* rows put by test_sparse_growth: value j = id + j, state g2sum = id */
    int stop_after;
} visit_ctx;

static int collect(void *ctx, uint64_t id, const float *values, const float *state,
                   const fl_ps_row_stat *rs) {
    (void)rs;
    visit_ctx *c = ctx;
    if (c->n > 0 && id <= c->last)
        c->ascending = false;
    c->last = id;
    if (c->ids && c->n < c->cap)
        c->ids[c->n] = id;
    if (c->values_ok)
        for (int j = 0; j < c->dim; j++)
            if (values[j] != (float)(id % 1000) + (float)j || state[0] != (float)(id % 77))
                c->values_ok = false;
    c->n++;
    return c->stop_after && c->n == c->stop_after ? 5 : 0;
}

/* Rows put through many index doublings are all found again; visit returns them in ascending
 * id order; the ids are those of one shard of 4 (as a server thread holds them). */
static void test_sparse_growth(void) {
    enum { DIM = 3, N = 150000 };
    fl_ps_sparse *t = make_table(2, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_ZERO, 0, 0, 1);
    if (!t)
        return;
    uint64_t *ids = malloc(N * sizeof *ids);
    float *out = malloc((size_t)N * DIM * sizeof *out);
    fl_rng r;
    fl_rng_init(&r, 41, 0);
    int64_t n = 0;
    uint64_t small = 0;
    size_t bytes0 = fl_ps_sparse_bytes(t);
    while (n < N) {
        uint64_t id = n % 3 == 0 ? small++ : fl_rng_u64(&r); /* small and huge ids */
        if (fl_ps_shard_of(id, 4) != 1)
            continue;
        ids[n++] = id;
        float v[DIM], st = (float)(id % 77);
        for (int j = 0; j < DIM; j++)
            v[j] = (float)(id % 1000) + (float)j;
        CHECK_OK(fl_ps_sparse_put(t, id, v, &st, NULL));
    }
    /* a small id may repeat a random one only with probability ~0: count the distinct ones */
    CHECK(fl_ps_sparse_rows(t) <= N && fl_ps_sparse_rows(t) > N - 5);
    CHECK(fl_ps_sparse_bytes(t) > bytes0 + (size_t)N * (DIM + 1) * sizeof(float));
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, N, out));
    bool ok = true;
    for (int64_t i = 0; i < N && ok; i++)
        for (int j = 0; j < DIM; j++)
            if (out[i * DIM + j] != (float)(ids[i] % 1000) + (float)j) {
                fprintf(stderr, "growth: row %lld (id %llu) value %d = %g\n", (long long)i,
                        (unsigned long long)ids[i], j, out[i * DIM + j]);
                ok = false;
                break;
            }
    CHECK(ok);
    CHECK(fl_ps_sparse_rows(t) <= N); /* the pulls created nothing */
    visit_ctx c = {.ascending = true, .dim = DIM, .values_ok = true};
    CHECK_OK(fl_ps_sparse_visit(t, false, collect, &c));
    CHECK(c.n == fl_ps_sparse_rows(t));
    CHECK(c.ascending);
    CHECK(c.values_ok);
    visit_ctx stop = {.ascending = true, .stop_after = 10};
    CHECK_RC(fl_ps_sparse_visit(t, false, collect, &stop), 5);
    CHECK(stop.n == 10);
    free(ids);
    free(out);
    fl_ps_sparse_free(t);
}

/* Dirty rows: those created, pushed, accumulated-and-applied or put since mark_clean. */
static void test_sparse_dirty(void) {
    enum { DIM = 2 };
    fl_ps_sparse *t = make_table(0, DIM, FL_PS_RULE_SGD, FL_PS_INIT_UNIFORM, 0, 1, 2);
    if (!t)
        return;
    uint64_t ids[200];
    static float out[200 * DIM], g[200 * DIM];
    for (int i = 0; i < 200; i++)
        ids[i] = (uint64_t)(199 - i) * 7;
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, 200, out));
    uint64_t got[16];
    visit_ctx c = {.ascending = true, .ids = got, .cap = 16};
    CHECK_OK(fl_ps_sparse_visit(t, true, collect, &c));
    CHECK(c.n == 200); /* created: dirty */
    fl_ps_sparse_mark_clean(t);
    c = (visit_ctx){.ascending = true, .ids = got, .cap = 16};
    CHECK_OK(fl_ps_sparse_visit(t, true, collect, &c));
    CHECK(c.n == 0);
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, 200, out)); /* reading dirties nothing */
    uint64_t push_ids[] = {70, 14, 70};
    CHECK_OK(fl_ps_sparse_push_rows(t, push_ids, 3, g, 0.1));
    uint64_t acc_id = 1386, new_id = 5; /* 5 is new */
    CHECK_OK(fl_ps_sparse_accumulate(t, &acc_id, 1, g));
    c = (visit_ctx){.ascending = true, .ids = got, .cap = 16};
    CHECK_OK(fl_ps_sparse_visit(t, true, collect, &c));
    CHECK(c.n == 2 && got[0] == 14 && got[1] == 70); /* pending is not applied yet */
    CHECK_OK(fl_ps_sparse_apply_pending(t, 0.1, 1.0));
    CHECK_OK(fl_ps_sparse_pull_rows(t, &new_id, 1, out));
    float v[DIM] = {1, 2};
    CHECK_OK(fl_ps_sparse_put(t, 21, v, NULL, NULL));
    c = (visit_ctx){.ascending = true, .ids = got, .cap = 16};
    CHECK_OK(fl_ps_sparse_visit(t, true, collect, &c));
    CHECK(c.n == 5 && c.ascending);
    if (c.n == 5)
        CHECK(got[0] == 5 && got[1] == 14 && got[2] == 21 && got[3] == 70 && got[4] == 1386);
    c = (visit_ctx){.ascending = true};
    CHECK_OK(fl_ps_sparse_visit(t, false, collect, &c));
    CHECK(c.n == 201 && c.ascending);
    fl_ps_sparse_free(t);
}

/* Put then pull; put with a state, read back by visit; put without one: a fresh state. */
typedef struct {
    uint64_t id;
    float state[2 * 3 + 2];
    bool found;
} find_ctx;

static int find_row(void *ctx, uint64_t id, const float *values, const float *state,
                    const fl_ps_row_stat *rs) {
    (void)rs;
    (void)values;
    find_ctx *f = ctx;
    if (id == f->id) {
        memcpy(f->state, state, sizeof f->state);
        f->found = true;
    }
    return 0;
}

static void test_sparse_put(void) {
    enum { DIM = 3 };
    fl_ps_sparse *t = make_table(0, DIM, FL_PS_RULE_ADAM, FL_PS_INIT_NORMAL, 0, 1, 2);
    if (!t)
        return;
    float v[DIM] = {1.5f, -2, 3}, st[2 * DIM + 2] = {1, 2, 3, 4, 5, 6, 0.5f, 0.25f}, out[DIM];
    uint64_t id = 123456789;
    CHECK_OK(fl_ps_sparse_put(t, id, v, st, NULL));
    CHECK_OK(fl_ps_sparse_pull_rows(t, &id, 1, out));
    CHECK(memcmp(out, v, sizeof v) == 0);
    find_ctx f = {.id = id};
    CHECK_OK(fl_ps_sparse_visit(t, false, find_row, &f));
    CHECK(f.found && memcmp(f.state, st, sizeof st) == 0);
    v[0] = 9; /* overwrite, no state given: fresh state */
    CHECK_OK(fl_ps_sparse_put(t, id, v, NULL, NULL));
    CHECK_OK(fl_ps_sparse_pull_rows(t, &id, 1, out));
    CHECK(out[0] == 9 && fl_ps_sparse_rows(t) == 1);
    f.found = false;
    CHECK_OK(fl_ps_sparse_visit(t, false, find_row, &f));
    CHECK(f.found && f.state[0] == 0 && f.state[2 * DIM] == 1 && f.state[2 * DIM + 1] == 1);
    fl_ps_sparse_free(t);
}

/* 10^6 rows of dim 8 with Adagrad: at most 80 bytes a row, everything counted (values,
 * g2sum, id, show/click/unseen counters, index, chunk slack). */
static void test_sparse_bytes(void) {
    enum { DIM = 8, ROWS = 1000000, BATCH = 10000 };
    fl_ps_sparse *t = make_table(0, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_UNIFORM, -0.01, 0.01, 4);
    if (!t)
        return;
    uint64_t *ids = malloc(BATCH * sizeof *ids);
    float *out = malloc((size_t)BATCH * DIM * sizeof *out);
    fl_rng r;
    fl_rng_init(&r, 51, 0);
    for (int64_t done = 0; done < ROWS; done += BATCH) {
        for (int i = 0; i < BATCH; i++)
            ids[i] = fl_rng_u64(&r);
        CHECK_OK(fl_ps_sparse_pull_rows(t, ids, BATCH, out));
    }
    int64_t rows = fl_ps_sparse_rows(t);
    double per_row = (double)fl_ps_sparse_bytes(t) / (double)rows;
    printf("sparse dim %d adagrad: %lld rows, %zu bytes, %.1f bytes/row (row data %zu)\n", DIM,
           (long long)rows, fl_ps_sparse_bytes(t), per_row, (DIM + 1 + 3) * sizeof(float) + 8);
    CHECK(rows == ROWS);
    CHECK(per_row <= 80.0);
    free(ids);
    free(out);
    fl_ps_sparse_free(t);
}


/* ---- the life cycle (fl_ps_sparse_opts) ---- */

typedef struct {
    uint64_t *ids;
    int64_t   n;
} ids_seen;

static int take_id(void *ctx, uint64_t id, const float *values, const float *state,
                   const fl_ps_row_stat *rs) {
    (void)values, (void)state, (void)rs;
    ids_seen *a = ctx;
    a->ids[a->n++] = id;
    return 0;
}


static fl_ps_sparse *make_life(int dim, const fl_ps_sparse_opts *o, uint64_t seed) {
    fl_ps_sparse *t = make_table(0, dim, FL_PS_RULE_SGD, FL_PS_INIT_UNIFORM, -1, 1, seed);
    if (t && o)
        CHECK_OK(fl_ps_sparse_set_opts(t, o));
    return t;
}

/* The counters of one row, found by a visit. */
typedef struct {
    uint64_t       id;
    bool           found;
    fl_ps_row_stat st;
    float          v0;
} stat_find;

static int find_stat(void *ctx, uint64_t id, const float *values, const float *state,
                     const fl_ps_row_stat *rs) {
    (void)state;
    stat_find *f = ctx;
    if (id == f->id) {
        f->found = true;
        f->st = *rs;
        f->v0 = values[0];
    }
    return 0;
}

static stat_find stat_of(const fl_ps_sparse *t, uint64_t id) {
    stat_find f = {.id = id};
    CHECK_OK(fl_ps_sparse_visit(t, false, find_stat, &f));
    return f;
}

/* Shows and clicks add up exactly, per occurrence and per sync step; a push without counts
 * counts one show an occurrence. */
static void test_life_counts(void) {
    enum { DIM = 2 };
    fl_ps_sparse *t = make_life(DIM, NULL, 1);
    if (!t)
        return;
    uint64_t ids[5] = {10, 20, 10, 30, 10};
    float g[5 * DIM] = {0}, shows[5] = {1, 2, 3, 0.5f, 1}, clicks[5] = {1, 0, 1, 0, 0};
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, ids, 5, g, shows, clicks, 0.1));
    stat_find a = stat_of(t, 10), b = stat_of(t, 20), c = stat_of(t, 30);
    CHECK(a.found && a.st.show == 5 && a.st.click == 2 && a.st.unseen == 0);
    CHECK(b.found && b.st.show == 2 && b.st.click == 0);
    CHECK(c.found && c.st.show == 0.5f && c.st.click == 0);
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, 5, g, 0.1)); /* one show an occurrence */
    a = stat_of(t, 10);
    CHECK(a.st.show == 8 && a.st.click == 2);
    /* sync: the step's counts summed, added once at the apply */
    CHECK_OK(fl_ps_sparse_accumulate_counts(t, ids, 5, g, shows, clicks));
    CHECK_OK(fl_ps_sparse_accumulate(t, ids, 2, g));
    a = stat_of(t, 10);
    CHECK(a.st.show == 8); /* nothing before the apply */
    CHECK_OK(fl_ps_sparse_apply_pending(t, 0.1, 0.5));
    a = stat_of(t, 10);
    b = stat_of(t, 20);
    CHECK(a.st.show == 8 + 5 + 1 && a.st.click == 4);
    CHECK(b.st.show == 1 + 2 + 2 + 1 && b.st.click == 0);
    /* a pull counts nothing */
    float out[5 * DIM];
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, 5, out));
    CHECK(stat_of(t, 10).st.show == 14);
    fl_ps_sparse_free(t);
}

/* entry count 3 on a hand-built sequence: an id's row appears at the push that brings its
 * shows to 3, that push's gradient applied and the shows before it kept; until then pulls
 * read zeros and create nothing, pushes change nothing but the count. */
static void test_life_entry_count(void) {
    enum { DIM = 2 };
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.entry = FL_PS_ENTRY_COUNT;
    o.entry_count = 3;
    fl_ps_sparse *t = make_life(DIM, &o, 2), *ref = make_life(DIM, NULL, 2);
    if (!t || !ref)
        return;
    uint64_t a = 111, b = 222;
    float g1[DIM] = {1, 1}, g3[DIM] = {0.5f, -0.25f}, out[DIM], init[DIM];
    CHECK_OK(fl_ps_sparse_pull_rows(ref, &a, 1, init)); /* the row a will get */
    CHECK_OK(fl_ps_sparse_pull_rows(t, &a, 1, out));
    CHECK(out[0] == 0 && out[1] == 0 && fl_ps_sparse_rows(t) == 0);
    CHECK_OK(fl_ps_sparse_push_rows(t, &a, 1, g1, 1.0)); /* seen 1 */
    CHECK(fl_ps_sparse_rows(t) == 0 && fl_ps_sparse_candidates(t) == 1);
    CHECK_OK(fl_ps_sparse_push_rows(t, &a, 1, g1, 1.0)); /* seen 2 */
    CHECK_OK(fl_ps_sparse_pull_rows(t, &a, 1, out));
    CHECK(out[0] == 0 && out[1] == 0 && fl_ps_sparse_rows(t) == 0);
    CHECK_OK(fl_ps_sparse_push_rows(t, &a, 1, g3, 1.0)); /* seen 3: the row, with g3 only */
    CHECK(fl_ps_sparse_rows(t) == 1 && fl_ps_sparse_candidates(t) == 0);
    CHECK_OK(fl_ps_sparse_pull_rows(t, &a, 1, out));
    CHECK(out[0] == init[0] - 0.5f && out[1] == init[1] + 0.25f);
    stat_find f = stat_of(t, a);
    CHECK(f.found && f.st.show == 3);
    /* shows given with the push: 5 at once is enough; 2 + 0.5 is not, 0.5 more is */
    float five = 5, two = 2, half = 0.5f, g0[DIM] = {0, 0};
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, &b, 1, g0, &five, NULL, 1.0));
    CHECK(fl_ps_sparse_rows(t) == 2 && stat_of(t, b).st.show == 5);
    uint64_t c = 333;
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, &c, 1, g0, &two, NULL, 1.0));
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, &c, 1, g0, &half, NULL, 1.0));
    CHECK(fl_ps_sparse_rows(t) == 2);
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, &c, 1, g0, &half, NULL, 1.0));
    CHECK(fl_ps_sparse_rows(t) == 3 && stat_of(t, c).st.show == 3);
    /* sync: a step's occurrences count together; 2 workers each seeing d once: no row, the
     * next step's pushes make it */
    uint64_t d = 444, dd[2] = {444, 444};
    float g2[2 * DIM] = {1, 1, 1, 1};
    CHECK_OK(fl_ps_sparse_accumulate(t, &d, 1, g1));
    CHECK_OK(fl_ps_sparse_accumulate(t, &d, 1, g1));
    CHECK_OK(fl_ps_sparse_apply_pending(t, 1.0, 0.5));
    CHECK(fl_ps_sparse_rows(t) == 3 && fl_ps_sparse_candidates(t) == 1);
    CHECK_OK(fl_ps_sparse_accumulate(t, dd, 2, g2));
    CHECK_OK(fl_ps_sparse_apply_pending(t, 1.0, 0.5));
    CHECK(fl_ps_sparse_rows(t) == 4 && stat_of(t, d).st.show == 4);
    /* the life cycle is set before any row, and checked */
    CHECK_RC(fl_ps_sparse_set_opts(t, &o), FL_ESTATE);
    fl_ps_sparse *u = make_life(DIM, NULL, 2);
    o.entry_count = 0.5;
    CHECK_RC(fl_ps_sparse_set_opts(u, &o), FL_ECONFIG);
    CHECK_MSG("entry count 0.5");
    fl_ps_sparse_opts_defaults(&o);
    o.show_click_decay = 1.5;
    CHECK_RC(fl_ps_sparse_set_opts(u, &o), FL_ECONFIG);
    CHECK_MSG("show_click_decay 1.5");
    fl_ps_sparse_free(u);
    fl_ps_sparse_free(t);
    fl_ps_sparse_free(ref);
}

/* entry probability p: pushes admit a fraction p of new ids, the same ids in every table of
 * the same seed; pulls admit none; an id turned down gets a new draw at the next pass. */
static void test_life_entry_probability(void) {
    enum { N = 20000 };
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.entry = FL_PS_ENTRY_PROBABILITY;
    o.entry_probability = 0.25;
    fl_ps_sparse *t = make_life(1, &o, 3), *u = make_life(1, &o, 3);
    uint64_t *ids = malloc(N * sizeof *ids);
    float *g = calloc(N, sizeof *g), *out = malloc(N * sizeof *out);
    if (!t || !u || !ids || !g || !out)
        return;
    for (int i = 0; i < N; i++)
        ids[i] = (uint64_t)i * 7919 + 5;
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, N, out));
    CHECK(fl_ps_sparse_rows(t) == 0 && out[0] == 0 && out[N - 1] == 0);
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, N, g, 0.1));
    int64_t r0 = fl_ps_sparse_rows(t);
    printf("entry probability 0.25: %lld of %d ids admitted\n", (long long)r0, N);
    CHECK(r0 > N / 4 - 5 * 62 && r0 < N / 4 + 5 * 62); /* 5 standard deviations */
    /* the same ids in reverse order in another table: the same rows */
    for (int i = N - 1; i >= 0; i--)
        CHECK_OK(fl_ps_sparse_push_rows(u, &ids[i], 1, g, 0.1));
    CHECK(fl_ps_sparse_rows(u) == r0);
    ids_seen ta = {0}, ua = {0};
    ta.ids = malloc(N * sizeof *ta.ids);
    ua.ids = malloc(N * sizeof *ua.ids);
    if (!ta.ids || !ua.ids)
        return;
    CHECK_OK(fl_ps_sparse_visit(t, false, take_id, &ta));
    CHECK_OK(fl_ps_sparse_visit(u, false, take_id, &ua));
    CHECK(ta.n == r0 && ua.n == r0 && memcmp(ta.ids, ua.ids, (size_t)r0 * 8) == 0);
    free(ta.ids);
    free(ua.ids);
    /* pushing again in the same pass admits nothing more; after a pass, a quarter of the rest */
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, N, g, 0.1));
    CHECK(fl_ps_sparse_rows(t) == r0);
    CHECK(fl_ps_sparse_pass(t) == 0);
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, N, g, 0.1));
    int64_t r1 = fl_ps_sparse_rows(t) - r0;
    double want = 0.25 * (double)(N - r0);
    CHECK(r1 > want - 5 * 54 && r1 < want + 5 * 54);
    /* p = 0 admits none, p = 1 all */
    fl_ps_sparse *z = make_life(1, &o, 3);
    o.entry_probability = 0;
    fl_ps_sparse *none = make_life(1, &o, 3);
    o.entry_probability = 1;
    fl_ps_sparse *all = make_life(1, &o, 3);
    CHECK_OK(fl_ps_sparse_push_rows(none, ids, N, g, 0.1));
    CHECK_OK(fl_ps_sparse_push_rows(all, ids, N, g, 0.1));
    CHECK(fl_ps_sparse_rows(none) == 0 && fl_ps_sparse_rows(all) == N);
    fl_ps_sparse_free(z);
    fl_ps_sparse_free(none);
    fl_ps_sparse_free(all);
    free(ids);
    free(g);
    free(out);
    fl_ps_sparse_free(t);
    fl_ps_sparse_free(u);
}

/* Shrink by score on a hand-built sequence: decay 0.5, score = show (nonclk 1, click 1),
 * threshold 1. Shows 8, 3, 1.5 become 4, 1.5, 0.75 (the last goes), then 2, 0.75 (the second
 * goes), then 1 (stays: not below), then 0.5 (goes). */
static void test_life_shrink_threshold(void) {
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.show_click_decay = 0.5;
    o.delete_threshold = 1;
    o.nonclk_coeff = 1;
    o.click_coeff = 1;
    fl_ps_sparse *t = make_life(1, &o, 4);
    if (!t)
        return;
    uint64_t ids[3] = {1, 2, 3};
    float g[3] = {0}, shows[3] = {8, 3, 1.5f}, clicks[3] = {2, 0, 1.5f};
    CHECK_OK(fl_ps_sparse_push_rows_counts(t, ids, 3, g, shows, clicks, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 1);
    CHECK(stat_of(t, 1).found && stat_of(t, 2).found && !stat_of(t, 3).found);
    stat_find f = stat_of(t, 1);
    CHECK(f.st.show == 4 && f.st.click == 1 && f.st.unseen == 1);
    CHECK(fl_ps_sparse_pass(t) == 1);
    CHECK(stat_of(t, 1).found && !stat_of(t, 2).found && fl_ps_sparse_rows(t) == 1);
    CHECK(fl_ps_sparse_pass(t) == 0 && stat_of(t, 1).st.show == 1);
    CHECK(fl_ps_sparse_pass(t) == 1 && fl_ps_sparse_rows(t) == 0);
    CHECK(fl_ps_sparse_passes(t) == 4 && fl_ps_sparse_passed(t));
    fl_ps_sparse_mark_clean(t);
    CHECK(!fl_ps_sparse_passed(t));
    /* clicks weigh click_coeff: show 1, click 1 at coefficients (0.1, 2) scores 2 */
    fl_ps_sparse_opts_defaults(&o);
    o.delete_threshold = 1.5;
    o.click_coeff = 2;
    fl_ps_sparse *u = make_life(1, &o, 4);
    float one = 1;
    CHECK_OK(fl_ps_sparse_push_rows_counts(u, &ids[0], 1, g, &one, &one, 0.1));
    CHECK_OK(fl_ps_sparse_push_rows_counts(u, &ids[1], 1, g, &one, NULL, 0.1)); /* 0.1 */
    CHECK(fl_ps_sparse_pass(u) == 1 && stat_of(u, 1).found && !stat_of(u, 2).found);
    fl_ps_sparse_free(u);
    fl_ps_sparse_free(t);
}

/* Shrink by unseen passes (delete_after_unseen 2) on a hand-built sequence: a row goes at the
 * end of the second pass in a row without a push; a push starts the count again. Candidates
 * of entry COUNT unseen that long go too. */
static void test_life_shrink_unseen(void) {
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.delete_after_unseen = 2;
    fl_ps_sparse *t = make_life(1, &o, 5);
    if (!t)
        return;
    uint64_t a = 1, b = 2, c = 3, abc[3] = {1, 2, 3};
    float g[3] = {0};
    CHECK_OK(fl_ps_sparse_push_rows(t, abc, 3, g, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 0); /* pass 1: all pushed in it */
    CHECK_OK(fl_ps_sparse_push_rows(t, &a, 1, g, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 0); /* pass 2: b, c unseen once */
    CHECK(stat_of(t, b).st.unseen == 2 && stat_of(t, a).st.unseen == 1);
    CHECK_OK(fl_ps_sparse_push_rows(t, &b, 1, g, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 1); /* pass 3: c unseen in passes 2 and 3 */
    CHECK(stat_of(t, a).found && stat_of(t, b).found && !stat_of(t, c).found);
    CHECK(fl_ps_sparse_pass(t) == 1); /* pass 4: a unseen in 3 and 4 */
    CHECK(!stat_of(t, a).found && stat_of(t, b).found);
    CHECK(fl_ps_sparse_pass(t) == 1 && fl_ps_sparse_rows(t) == 0);
    fl_ps_sparse_free(t);

    o.entry = FL_PS_ENTRY_COUNT;
    o.entry_count = 10;
    t = make_life(1, &o, 5);
    CHECK_OK(fl_ps_sparse_push_rows(t, abc, 3, g, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 0 && fl_ps_sparse_candidates(t) == 3);
    CHECK_OK(fl_ps_sparse_push_rows(t, &a, 1, g, 0.1));
    CHECK(fl_ps_sparse_pass(t) == 0 && fl_ps_sparse_candidates(t) == 3);
    CHECK(fl_ps_sparse_pass(t) == 0 && fl_ps_sparse_candidates(t) == 1); /* b, c dropped */
    CHECK(fl_ps_sparse_pass(t) == 0 && fl_ps_sparse_candidates(t) == 0);
    fl_ps_sparse_free(t);
}

/* A dump of a table's rows (id, values, state, counters) in id order, for comparing tables. */
typedef struct {
    float  *buf; /* [cap * (2 + dim + 1 + 3)] */
    int64_t n, cap;
    int     dim;
} dump_ctx;

static int dump_row(void *ctx, uint64_t id, const float *values, const float *state,
                    const fl_ps_row_stat *rs) {
    dump_ctx *d = ctx;
    if (d->n == d->cap)
        return 1;
    float *o = d->buf + d->n++ * (d->dim + 6);
    memcpy(o, &id, sizeof id);
    memcpy(o + 2, values, (size_t)d->dim * sizeof *o);
    o[2 + d->dim] = state[0]; /* Adagrad's g2sum */
    o[3 + d->dim] = rs->show;
    o[4 + d->dim] = rs->click;
    o[5 + d->dim] = (float)rs->unseen;
    return 0;
}

/* Pushes with slot hints (fl_ps_sparse_push_rows_slots) leave a table as pushes without them,
 * whatever the hints: fresh ones from pull_rows_slots (repeats included), none (-1), out of
 * range, and stale ones after a pass removed rows: slots now free (their id field holds the
 * free list: ids are chosen so that a stale hint's free record reads as its id), then reused by
 * other ids. The pull gives pull_rows' values and each id's slot. */
static void test_sparse_slots(void) {
    enum { N = 4000, DIM = 3, W = DIM + 6 };
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.delete_after_unseen = 1;
    /* Adagrad: a state a row to compare */
    fl_ps_sparse *t = make_table(0, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_UNIFORM, -1, 1, 8);
    fl_ps_sparse *ref = make_table(0, DIM, FL_PS_RULE_ADAGRAD, FL_PS_INIT_UNIFORM, -1, 1, 8);
    if (t && ref) {
        CHECK_OK(fl_ps_sparse_set_opts(t, &o));
        CHECK_OK(fl_ps_sparse_set_opts(ref, &o));
    }
    uint64_t *ids = malloc(2 * N * sizeof *ids);
    int64_t *slots = malloc(2 * N * sizeof *slots), *none = malloc(N * sizeof *none);
    float *g = malloc((size_t)N * DIM * sizeof *g), *out = malloc((size_t)N * DIM * sizeof *out);
    float *want = malloc((size_t)N * DIM * sizeof *want), *shows = malloc(N * sizeof *shows);
    dump_ctx a = {.cap = 2 * N, .dim = DIM}, b = {.cap = 2 * N, .dim = DIM};
    a.buf = malloc((size_t)a.cap * W * sizeof(float));
    b.buf = malloc((size_t)b.cap * W * sizeof(float));
    if (!t || !ref || !ids || !slots || !none || !g || !out || !want || !shows || !a.buf ||
        !b.buf)
        return;
    /* id k + 1 in slot k + 1 after a first id in slot 0: when a pass frees slots in ascending
     * order, a freed slot's id field (the previous free slot + 1) can equal its old id */
    ids[0] = 1u << 30;
    for (int i = 1; i < N; i++)
        ids[i] = (uint64_t)i - 1;
    ids[N - 1] = ids[5]; /* a repeat */
    for (int i = 0; i < N; i++) {
        none[i] = i % 3 ? -1 : (int64_t)1 << 40; /* no hint, or out of range */
        shows[i] = (float)(i % 4);
    }
    for (int i = 0; i < N * DIM; i++)
        g[i] = (float)(i % 11) - 5;
    CHECK_OK(fl_ps_sparse_pull_rows_slots(t, ids, N, out, slots));
    CHECK_OK(fl_ps_sparse_pull_rows(ref, ids, N, want));
    CHECK(memcmp(out, want, (size_t)N * DIM * sizeof *out) == 0);
    CHECK(slots[N - 1] == slots[5] && slots[0] >= 0 && slots[1] != slots[2]);
    int rounds_ok = 1;
    for (int round = 0; round < 4; round++) {
        /* 0: fresh hints, then a pass; 1: the odd entries pushed, then a pass removes the
         * even rows; 2: the first half pushed with stale hints to free slots, then new ids
         * pulled into the slots still free; 3: all pushed, stale hints to slots other ids
         * took */
        int step = round == 1 ? 2 : 1, from = round == 1 ? 1 : 0, to = round == 2 ? N / 2 : N;
        for (int i = from; i < to; i += step) {
            const int64_t *h = round == 0 && i % 5 == 0 ? none + i : slots + i;
            CHECK_OK(fl_ps_sparse_push_rows_slots(t, &ids[i], h, 1, g + (int64_t)i * DIM,
                                                  shows + i, NULL, 0.5));
            CHECK_OK(fl_ps_sparse_push_rows_counts(ref, &ids[i], 1, g + (int64_t)i * DIM,
                                                   shows + i, NULL, 0.5));
        }
        if (round < 2) {
            int64_t gone = fl_ps_sparse_pass(t);
            CHECK(gone == fl_ps_sparse_pass(ref) && gone == (round ? N / 2 : 0));
        }
        if (round == 2) {
            for (int i = 0; i < N; i++)
                ids[N + i] = ((uint64_t)1 << 32) + (uint64_t)i;
            CHECK_OK(fl_ps_sparse_pull_rows_slots(t, ids + N, N, out, slots + N));
            CHECK_OK(fl_ps_sparse_pull_rows(ref, ids + N, N, want));
        }
        a.n = b.n = 0;
        CHECK_OK(fl_ps_sparse_visit(t, false, dump_row, &a));
        CHECK_OK(fl_ps_sparse_visit(ref, false, dump_row, &b));
        if (a.n != b.n || memcmp(a.buf, b.buf, (size_t)a.n * W * sizeof(float)) != 0)
            rounds_ok = 0;
        CHECK(a.n == b.n);
        CHECK(memcmp(a.buf, b.buf, (size_t)(a.n < b.n ? a.n : b.n) * W * sizeof(float)) == 0);
    }
    CHECK(rounds_ok);
    free(ids);
    free(slots);
    free(none);
    free(g);
    free(out);
    free(want);
    free(shows);
    free(a.buf);
    free(b.buf);
    fl_ps_sparse_free(t);
    fl_ps_sparse_free(ref);
}

/* Removed rows' memory is reused: after half the rows go, as many new ids take their slots
 * and index entries and the bytes stay the same; every row left reads what it held, every new
 * row its initial values (the index after many backward-shift deletions finds them all). */
static void test_life_reuse(void) {
    enum { N = 200000, DIM = 4 };
    fl_ps_sparse_opts o;
    fl_ps_sparse_opts_defaults(&o);
    o.delete_after_unseen = 1;
    fl_ps_sparse *t = make_life(DIM, &o, 6), *ref = make_life(DIM, NULL, 6);
    uint64_t *ids = malloc(2 * N * sizeof *ids);
    float *g = malloc((size_t)N * DIM * sizeof *g), *out = malloc((size_t)N * DIM * sizeof *out);
    float *want = malloc((size_t)N * DIM * sizeof *want);
    if (!t || !ref || !ids || !g || !out || !want)
        return;
    fl_rng r;
    fl_rng_init(&r, 61, 0);
    for (int i = 0; i < 2 * N; i++)
        ids[i] = fl_rng_u64(&r);
    for (int i = 0; i < N * DIM; i++)
        g[i] = (float)(i % 7) - 3;
    CHECK_OK(fl_ps_sparse_push_rows(t, ids, N, g, 0.5));
    CHECK(fl_ps_sparse_pass(t) == 0);
    /* the odd rows are pushed again (they stay), the even ones not (they go) */
    for (int i = 1; i < N; i += 2)
        CHECK_OK(fl_ps_sparse_push_rows(t, &ids[i], 1, g + (int64_t)i * DIM, 0.5));
    size_t bytes = fl_ps_sparse_bytes(t);
    CHECK(fl_ps_sparse_pass(t) == N / 2 && fl_ps_sparse_rows(t) == N / 2);
    CHECK(fl_ps_sparse_bytes(t) == bytes);
    /* N / 2 new ids: the free slots, no new chunk, no larger index */
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids + N, N / 2, out));
    CHECK(fl_ps_sparse_rows(t) == N && fl_ps_sparse_bytes(t) == bytes);
    CHECK_OK(fl_ps_sparse_pull_rows(ref, ids + N, N / 2, want));
    CHECK(memcmp(out, want, (size_t)N / 2 * DIM * sizeof(float)) == 0);
    /* the rows left: the initial values minus two SGD steps of their gradient */
    int bad = 0;
    CHECK_OK(fl_ps_sparse_pull_rows(ref, ids, N, want));
    CHECK_OK(fl_ps_sparse_pull_rows(t, ids, N, out)); /* the even ones come back fresh */
    for (int i = 0; i < N; i++)
        for (int j = 0; j < DIM; j++) {
            float w = want[i * DIM + j], gg = g[i * DIM + j];
            if (i % 2) {
                w = (float)((double)w - 0.5 * (double)gg);
                w = (float)((double)w - 0.5 * (double)gg);
            }
            bad += out[i * DIM + j] != w;
        }
    CHECK(bad == 0);
    CHECK(fl_ps_sparse_rows(t) == N + N / 2);
    free(ids);
    free(g);
    free(out);
    free(want);
    fl_ps_sparse_free(t);
    fl_ps_sparse_free(ref);
}

/* fl_ps_shard_of: in range, and consecutive ids spread evenly over the servers. */
static void test_shard_of(void) {
    enum { S = 5, N = 100000 };
    int count[S] = {0};
    for (uint64_t id = 0; id < N; id++) {
        int s = fl_ps_shard_of(id, S);
        CHECK(s >= 0 && s < S);
        if (s >= 0 && s < S)
            count[s]++;
    }
    for (int s = 0; s < S; s++)
        CHECK(abs(count[s] - N / S) < 1000); /* 11 standard deviations */
    CHECK(fl_ps_shard_of(UINT64_MAX, 1) == 0);
    CHECK(fl_ps_shard_of(12345, 7) == fl_ps_shard_of(12345, 7));
}

int main(void) {
    test_rule_matches_optim(FL_PS_RULE_SGD, false, 0.0);
    test_rule_matches_optim(FL_PS_RULE_SGD, false, 1e-3);
    test_rule_matches_optim(FL_PS_RULE_MOMENTUM, false, 0.0);
    test_rule_matches_optim(FL_PS_RULE_MOMENTUM, false, 1e-3);
    test_rule_matches_optim(FL_PS_RULE_MOMENTUM, true, 0.0);
    test_rule_matches_optim(FL_PS_RULE_MOMENTUM, true, 1e-3);
    test_rule_adam(0.0);
    test_rule_adam(0.01);
    test_rule_adagrad();
    test_rule_sum();
    test_rule_check();
    test_dense_block();
    test_sparse_create_refuses();
    test_sparse_deterministic();
    test_sparse_init_moments(FL_PS_INIT_NORMAL, 0.5, 2.0, 0.5, 2.0);
    test_sparse_init_moments(FL_PS_INIT_UNIFORM, -1, 1, 0, 1 / sqrt(3.0));
    test_sparse_init_moments(FL_PS_INIT_ZERO, 0, 0, 0, 0);
    test_sparse_push_repeats();
    test_sparse_pending();
    test_sparse_growth();
    test_sparse_dirty();
    test_sparse_put();
    test_sparse_bytes();
    test_life_counts();
    test_life_entry_count();
    test_life_entry_probability();
    test_life_shrink_threshold();
    test_life_shrink_unseen();
    test_life_reuse();
    test_sparse_slots();
    test_shard_of();
    if (test_failures)
        fprintf(stderr, "test_ps_table: %d failures\n", test_failures);
    return test_failures ? 1 : 0;
}
