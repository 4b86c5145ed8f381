/* test_localsgd.c - Local SGD (src/strategy/localsgd.c): the schedule as pure functions (which
 * steps average, begin_step and k_steps) and the adaptive rule against hand-computed values;
 * then the real strategy in 2 and 4 forked worker processes on loopback TCP: which steps send
 * bytes (fixed and adaptive, the adaptive one driven by a scripted loss averaged over ranks),
 * bytes per step falling as 1/k (and k = 1 sending what dense sends), parameters equal to the
 * average of independently trained local models at every average (the paper's math),
 * velocities left local, and the checkpoint state restoring a run exactly. */
#include "test.h"

#include "fleet/fleet.h"
#include "strategy/localsgd_rule.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- the schedule --- */

/* The steps in 1..nsteps that average, by the rule, with last_sync kept as the strategy does. */
static int due_steps(int64_t begin, int64_t k, int64_t nsteps, int64_t *out) {
    int n = 0;
    int64_t last = begin;
    for (int64_t s = 1; s <= nsteps; s++)
        if (fl_localsgd_rule_due(s, begin, last, k)) {
            out[n++] = s;
            last = s;
        }
    return n;
}

static void check_steps(const char *what, const int64_t *got, int ngot, const int64_t *want,
                        int nwant) {
    int ok = ngot == nwant;
    for (int i = 0; ok && i < nwant; i++)
        ok = got[i] == want[i];
    if (!ok) {
        fprintf(stderr, "%s: averaging steps", what);
        for (int i = 0; i < ngot; i++)
            fprintf(stderr, " %lld", (long long)got[i]);
        fprintf(stderr, ", want");
        for (int i = 0; i < nwant; i++)
            fprintf(stderr, " %lld", (long long)want[i]);
        fprintf(stderr, "\n");
        test_failures++;
    }
}

static void test_schedule(void) {
    int64_t got[64];
    int n;
    /* k = 1: every step (dense SGD) */
    n = due_steps(1, 1, 6, got);
    check_steps("begin 1, k 1", got, n, (int64_t[]){1, 2, 3, 4, 5, 6}, 6);
    /* Paddle's defaults with k = 4: step 1, then every 4th */
    n = due_steps(1, 4, 14, got);
    check_steps("begin 1, k 4", got, n, (int64_t[]){1, 5, 9, 13}, 4);
    /* post-local: synchronous through step 5, then every 3 */
    n = due_steps(5, 3, 15, got);
    check_steps("begin 5, k 3", got, n, (int64_t[]){1, 2, 3, 4, 5, 8, 11, 14}, 8);
    /* an interval longer than the run: only the warm-up averages */
    n = due_steps(2, 100, 50, got);
    check_steps("begin 2, k 100", got, n, (int64_t[]){1, 2}, 2);
    /* the rule itself at the edges */
    CHECK(fl_localsgd_rule_due(7, 7, 3, 100));  /* step == begin_step: synchronous */
    CHECK(!fl_localsgd_rule_due(8, 7, 7, 2));   /* one step after */
    CHECK(fl_localsgd_rule_due(9, 7, 7, 2));
    CHECK(fl_localsgd_rule_due(10, 7, 7, 2)); /* step 9 was skipped (amp): 10 averages */
}

static void test_adaptive_rule(void) {
    /* k = ceil(sqrt(lr0 * loss / (lr * loss0) * init_k)) clamped to [1, 16], by hand */
    const struct {
        double  lr0, loss0, lr, loss;
        int64_t init_k, want;
    } trace[] = {
        {0.1, 2.0, 0.1, 2.0, 2, 2},        /* x = 2: ceil(1.414) */
        {0.1, 2.0, 0.1, 1.0, 2, 1},        /* x = 1 */
        {0.1, 2.0, 0.01, 1.0, 2, 4},       /* x = 10: ceil(3.162) */
        {0.1, 2.0, 0.001, 0.5, 2, 8},      /* x = 50: ceil(7.071) */
        {0.1, 2.0, 0.0001, 0.5, 2, 16},    /* x = 500: 23 clamped */
        {0.1, 2.0, 0.1, 0.2, 2, 1},        /* x = 0.2: ceil(0.447) */
        {225, 1, 1, 1, 1, 15},             /* x = 225: exactly 15 */
        {226, 1, 1, 1, 1, 16},             /* x = 226: ceil(15.03) */
        {9, 1, 1, 1, 1, 3},                /* x = 9: exactly 3 */
        {1, 1, 1, 4.5, 2, 3},              /* x = 9 */
        {1, 1, 1, 8, 2, 4},                /* x = 16 */
        {0.05, 1, 0.025, 2.25, 2, 3},      /* x = 9: the learning rate halved */
        {0.1, 2.0, 0.0, 1.0, 2, 16},       /* lr = 0: +inf */
        {0.0, 2.0, 0.1, 1.0, 2, 1},        /* lr0 = 0 (a warm-up from 0): 0 */
        {0.0, 2.0, 0.0, 1.0, 2, 1},        /* 0/0 */
        {0.1, 0.0, 0.1, 1.0, 2, 16},       /* loss0 = 0 */
    };
    for (size_t i = 0; i < sizeof trace / sizeof trace[0]; i++) {
        int64_t k = fl_localsgd_rule_next_k(trace[i].lr0, trace[i].loss0, trace[i].lr,
                                            trace[i].loss, trace[i].init_k);
        if (k != trace[i].want) {
            fprintf(stderr, "adaptive rule, case %zu: k %lld, want %lld\n", i, (long long)k,
                    (long long)trace[i].want);
            test_failures++;
        }
    }
}

static void test_adacomm_rule(void) {
    /* k = ceil(sqrt(lr0 * loss / (lr * loss0)) * init_k) clamped to [1, 16], by hand */
    const struct {
        double  lr0, loss0, lr, loss;
        int64_t init_k, want;
    } trace[] = {
        {0.1, 2.0, 0.1, 2.0, 8, 8},       /* ratio 1: init_k, as in the paper */
        {0.1, 2.0, 0.1, 0.5, 8, 4},       /* sqrt(1/4) * 8 */
        {0.1, 2.0, 0.1, 0.4, 8, 4},       /* sqrt(0.2) * 8 = 3.58 */
        {0.1, 1.0, 0.01, 1.0, 4, 13},     /* sqrt(10) * 4 = 12.65 */
        {0.1, 1.0, 0.001, 1.0, 4, 16},    /* sqrt(100) * 4 = 40 clamped */
        {1, 1, 1, 225, 1, 15},            /* exactly 15 */
        {1, 1, 1, 226, 1, 16},            /* 15.03 */
        {0.1, 2.0, 0.1, 0.02, 2, 1},      /* sqrt(0.01) * 2 = 0.2 */
        {0.1, 2.0, 0.0, 1.0, 2, 16},      /* lr = 0: +inf */
        {0.0, 2.0, 0.0, 1.0, 2, 1},       /* 0/0 */
    };
    for (size_t i = 0; i < sizeof trace / sizeof trace[0]; i++) {
        int64_t k = fl_localsgd_rule_next_k_adacomm(trace[i].lr0, trace[i].loss0, trace[i].lr,
                                                    trace[i].loss, trace[i].init_k);
        if (k != trace[i].want) {
            fprintf(stderr, "adacomm rule, case %zu: k %lld, want %lld\n", i, (long long)k,
                    (long long)trace[i].want);
            test_failures++;
        }
    }
}

/* lr0 is the running maximum of the rates: under a warm-up from 0 (linear over 200 steps to
 * 0.1, then a cosine decay to 0 at step 2000, and a loss that falls from 2.3 towards 0.3) the
 * interval leaves 1 after the warm-up and grows as the rate decays; with lr0 taken at step 1
 * (the rule before) it was 1 throughout. Piecewise decay: the interval grows by about
 * sqrt(10) at each tenfold drop. (The falling loss keeps k at 2 through mid-run: the rule
 * weighs the loss as much as the rate.) */
static double warmup_cosine_lr(int64_t s) {
    if (s <= 200)
        return 0.1 * (double)(s - 1) / 200.0;
    return 0.05 * (1.0 + cos(acos(-1.0) * (double)(s - 200) / 1800.0));
}

static double falling_loss(int64_t s) { return 0.3 + 2.0 * exp(-(double)s / 400.0); }

static void test_adaptive_lr0(void) {
    CHECK(fl_localsgd_rule_lr0(0.0, 0.0) == 0.0);
    CHECK(fl_localsgd_rule_lr0(0.0, 0.01) == 0.01);
    CHECK(fl_localsgd_rule_lr0(0.1, 0.05) == 0.1);
    CHECK(fl_localsgd_rule_lr0(0.1, NAN) == 0.1);
    /* the schedule through the rule as localsgd.c drives it: init_k 4, begin_step 1 */
    double lr0 = 0, loss0 = falling_loss(1);
    int64_t last = 0, k = 4, syncs = 0, k_at_900 = 0, k_max = 0, k_warm = 0;
    for (int64_t s = 1; s <= 1990; s++) {
        double lr = warmup_cosine_lr(s);
        lr0 = fl_localsgd_rule_lr0(lr0, lr);
        if (!fl_localsgd_rule_due(s, 1, last, k))
            continue;
        syncs++;
        last = s;
        if (s > 1)
            k = fl_localsgd_rule_next_k(lr0, loss0, lr, falling_loss(s), 4);
        if (s > 1 && s <= 200 && k > k_warm)
            k_warm = k;
        if (s <= 900)
            k_at_900 = k;
        if (k > k_max)
            k_max = k;
    }
    /* in the warm-up lr0 = lr: k = ceil(sqrt(4 * loss / loss0)) <= 2 */
    if (k_warm != 2 || k_at_900 < 2 || k_max != FL_LOCALSGD_MAX_K || syncs > 1990 / 2) {
        fprintf(stderr, "adaptive under warm-up + cosine: k %lld in the warm-up, %lld at step "
                        "900, %lld at most, %lld averages in 1990 steps\n",
                (long long)k_warm, (long long)k_at_900, (long long)k_max, (long long)syncs);
        test_failures++;
    }
    /* step 1's rate as lr0 (0 here) would keep k = 1: NaN ratio during the warm-up, then
     * lr0 / lr = 0 */
    CHECK(fl_localsgd_rule_next_k(warmup_cosine_lr(1), loss0, warmup_cosine_lr(900),
                                  falling_loss(900), 4) == 1);
    /* piecewise: 0.1 for 1000 steps, 0.01, 0.001; a flat loss: k = 2, then ceil(sqrt(40)),
     * then ceil(sqrt(400)) clamped */
    const double rates[] = {0.1, 0.01, 0.001};
    const int64_t want[] = {2, 7, 16};
    lr0 = 0;
    for (int i = 0; i < 3; i++) {
        lr0 = fl_localsgd_rule_lr0(lr0, rates[i]);
        int64_t got = fl_localsgd_rule_next_k(lr0, 1.0, rates[i], 1.0, 4);
        if (got != want[i]) {
            fprintf(stderr, "adaptive, piecewise rate %g: k %lld, want %lld\n", rates[i],
                    (long long)got, (long long)want[i]);
            test_failures++;
        }
    }
}

/* --- the real strategy --- */

enum { FEAT = 6, CLASSES = 3, BATCH = 8 };
static const int64_t hidden[] = {16};

typedef struct {
    fl_fleet      *fleet;
    int            rank, world;
    fl_net        *net, *shadow; /* shadow: the same model trained locally, averaged by hand */
    fl_optim      *opt, *shadow_opt;
    fl_dist_optim *d;
    float          xs[BATCH * FEAT], probs_mem[BATCH * CLASSES];
    int32_t        ys[BATCH];
} worker;

/* rank r's batch of step s (1-based): different on every rank */
static void batch_of(worker *w, int64_t s) {
    fl_rng rng;
    fl_rng_init(&rng, 1000 + (uint64_t)s, (uint64_t)w->rank);
    for (int i = 0; i < BATCH * FEAT; i++)
        w->xs[i] = (float)fl_rng_normal(&rng);
    for (int i = 0; i < BATCH; i++)
        w->ys[i] = (int32_t)fl_rng_below(&rng, CLASSES);
}

static int backward_of(worker *w, fl_net *net, fl_tensor *probs) {
    fl_tensor x;
    const fl_tensor *logits;
    double loss;
    int64_t shape[] = {BATCH, FEAT};
    fl_tensor_view(&x, FL_DTYPE_F32, 2, shape, w->xs);
    FL_TRY(fl_net_forward(net, &x, true, &logits));
    fl_tensor_view(probs, FL_DTYPE_F32, 2, logits->shape, w->probs_mem);
    FL_TRY(fl_softmax_xent_forward(fl_net_backend(net), logits, w->ys, probs, &loss));
    return fl_softmax_xent_backward(fl_net_backend(net), probs, w->ys, probs);
}

static fl_net *model(void) {
    int64_t in_shape[] = {FEAT};
    fl_net *net = fl_model_mlp(FL_DTYPE_F32, FEAT, hidden, 1, FL_ACT_TANH, CLASSES);
    if (net && fl_net_build(net, 1, in_shape, BATCH, 5) < 0) {
        fl_net_free(net);
        return NULL;
    }
    return net;
}

static void worker_free(worker *w) {
    fl_dist_optim_free(w->d);
    fl_optim_free(w->opt);
    fl_optim_free(w->shadow_opt);
    fl_net_free(w->net);
    fl_net_free(w->shadow);
    w->d = NULL, w->opt = w->shadow_opt = NULL, w->net = w->shadow = NULL;
}

/* Two fresh replicas (the strategy's and the shadow) under strategy s; rank-dependent seeds,
 * so that only the broadcast makes them equal. */
static int worker_start(worker *w, const fl_strategy *s, fl_optim_type type) {
    fl_optim_config oc = {.type = type, .momentum = type == FL_OPTIM_MOMENTUM ? 0.9 : 0,
                          .weight_decay = 1e-3};
    w->net = model();
    w->shadow = model();
    if (!w->net || !w->shadow)
        return FL_ENOMEM;
    w->opt = fl_optim_create(&oc, fl_net_param(w->net, 0), fl_net_num_params(w->net),
                             FL_DTYPE_F32, fl_net_backend(w->net));
    w->shadow_opt = fl_optim_create(&oc, fl_net_param(w->shadow, 0),
                                    fl_net_num_params(w->shadow), FL_DTYPE_F32,
                                    fl_net_backend(w->shadow));
    if (!w->opt || !w->shadow_opt)
        return FL_EINVAL;
    /* make the replicas differ before the broadcast */
    float *p = fl_net_flat_params(w->net);
    for (int64_t i = 0; i < fl_net_numel(w->net); i++)
        p[i] += 0.01f * (float)w->rank;
    if (!(w->d = fl_distributed_optimizer(w->fleet, w->net, w->opt, s)))
        return FL_EINVAL;
    memcpy(fl_net_flat_params(w->shadow), p, (size_t)fl_net_numel(w->net) * sizeof(float));
    return FL_OK;
}

/* The largest |a - b| over the ranks of the local values v[0..n) (a collective) */
static double spread(worker *w, const float *v, int64_t n, float *scratch) {
    double hi, lo;
    memcpy(scratch, v, (size_t)n * sizeof *scratch);
    fl_comm_allreduce(fl_fleet_comm(w->fleet), scratch, (size_t)n, FL_DTYPE_F32, FL_REDOP_MAX);
    float *neg = scratch + n;
    for (int64_t i = 0; i < n; i++)
        neg[i] = -v[i];
    fl_comm_allreduce(fl_fleet_comm(w->fleet), neg, (size_t)n, FL_DTYPE_F32, FL_REDOP_MAX);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        hi = scratch[i], lo = -neg[i];
        if (hi - lo > worst)
            worst = hi - lo;
    }
    return worst;
}

/* Scripted loss of step s on this rank: 7 except at the steps listed, offset per rank so that
 * only the average over ranks is the listed value (dyadic fractions: the average is exact). */
static double scripted_loss(const worker *w, int64_t s) {
    double base = 7.0;
    switch (s) {
    case 1: base = 1.0; break;
    case 4: base = 8.0; break;
    case 8: base = 2.0; break;
    case 10: base = 0.5; break;
    case 11: base = 200.0; break;
    case 27: base = 2.25; break;
    default: break;
    }
    return base * (1.0 + 0.5 * (w->rank - (w->world - 1) / 2.0) / w->world);
}
static double scripted_lr(int64_t s) { return s < 20 ? 0.05 : 0.025; }

typedef struct {
    int64_t steps;       /* run steps 1..steps */
    bool    adaptive;    /* set the scripted loss and learning rate */
    bool    shadow;      /* check against the hand-averaged shadow model */
    int64_t sent_steps[64];
    int     nsent;
    uint64_t sent_bytes[65]; /* per step, [s] */
} run_log;

/* Steps from..to of the run (batches and losses by step number), logging which sent. */
static void run_steps(worker *w, run_log *log, int64_t from, int64_t to) {
    fl_tensor probs;
    int64_t numel = fl_net_numel(w->net);
    float *scratch = malloc((size_t)(2 * numel) * sizeof *scratch);
    for (int64_t s = from; s <= to; s++) {
        double lr = log->adaptive ? scripted_lr(s) : 0.05;
        batch_of(w, s);
        CHECK_OK(backward_of(w, w->net, &probs));
        if (log->adaptive)
            CHECK_OK(fl_dist_set_loss(w->d, scripted_loss(w, s)));
        uint64_t before = fl_dist_bytes_sent(w->d);
        CHECK_OK(fl_dist_minimize(w->d, &probs, lr, NULL));
        uint64_t sent = fl_dist_bytes_sent(w->d) - before;
        CHECK(fl_dist_step(w->d) == s);
        log->sent_bytes[s] = sent;
        if (sent)
            log->sent_steps[log->nsent++] = s;
        if (!log->shadow)
            continue;
        /* the shadow: a plain local step, and at the same steps a plain average */
        CHECK_OK(backward_of(w, w->shadow, &probs));
        CHECK_OK(fl_net_backward(w->shadow, &probs, NULL, NULL));
        CHECK_OK(fl_optim_step(w->shadow_opt, lr, NULL));
        if (sent)
            CHECK_OK(fl_comm_allreduce(fl_fleet_comm(w->fleet), fl_net_flat_params(w->shadow),
                                       (size_t)numel, FL_DTYPE_F32, FL_REDOP_AVG));
        if (!CHECK_CLOSE_F32("parameters vs the average of local models",
                             fl_net_flat_params(w->net), fl_net_flat_params(w->shadow), numel,
                             1e-6, 1e-5))
            fprintf(stderr, "rank %d, step %lld\n", w->rank, (long long)s);
        if (sent)
            CHECK(spread(w, fl_net_flat_params(w->net), numel, scratch) == 0);
    }
    free(scratch);
}

/* Fixed interval with momentum: the averaging steps, the math, local velocities. */
static void worker_fixed(worker *w) {
    fl_strategy s;
    fl_strategy_defaults(&s);
    s.localsgd = true;
    s.localsgd_configs.k_steps = 3;
    s.localsgd_configs.begin_step = 5;
    CHECK_OK(worker_start(w, &s, FL_OPTIM_MOMENTUM));
    if (!w->d)
        goto done;
    run_log log = {.steps = 15, .shadow = true};
    run_steps(w, &log, 1, log.steps);
    check_steps("fixed k 3, begin 5, through the strategy", log.sent_steps, log.nsent,
                (int64_t[]){1, 2, 3, 4, 5, 8, 11, 14}, 8);
    /* after step 15 (a local one) the replicas differ, and velocities were never averaged */
    int64_t numel = fl_net_numel(w->net);
    float *scratch = malloc((size_t)(2 * numel) * sizeof *scratch);
    CHECK(spread(w, fl_net_flat_params(w->net), numel, scratch) > 0);
    fl_param *vel = fl_optim_state(w->opt, 0);
    CHECK(vel && spread(w, vel->value.data, vel->value.numel, scratch) > 0);
    free(scratch);
done:
    worker_free(w);
}

/* Copies of every state tensor (parameters, velocities, the distributed optimizer's). */
typedef struct {
    void  *mem[64];
    size_t nbytes[64];
    int    n;
} saved;

static fl_tensor *state_at(worker *w, int i) {
    int nv = fl_optim_num_state(w->opt);
    if (i < nv)
        return &fl_optim_state(w->opt, i)->value;
    return &fl_dist_state(w->d, i - nv)->value;
}

static void save(worker *w, saved *sv) {
    int64_t count = 0;
    for (int i = 0; i < fl_net_num_params(w->net); i++)
        count += fl_net_param(w->net, i)->value.numel;
    sv->n = 1 + fl_optim_num_state(w->opt) + fl_dist_num_state(w->d);
    FL_ASSERT(sv->n <= 64);
    sv->nbytes[0] = (size_t)count * sizeof(float);
    sv->mem[0] = malloc(sv->nbytes[0]);
    memcpy(sv->mem[0], fl_net_flat_params(w->net), sv->nbytes[0]);
    for (int i = 1; i < sv->n; i++) {
        fl_tensor *t = state_at(w, i - 1);
        sv->nbytes[i] = (size_t)t->numel * fl_dtype_size(t->dtype);
        sv->mem[i] = malloc(sv->nbytes[i]);
        memcpy(sv->mem[i], t->data, sv->nbytes[i]);
    }
}

static void restore(worker *w, saved *sv) {
    memcpy(fl_net_flat_params(w->net), sv->mem[0], sv->nbytes[0]);
    for (int i = 1; i < sv->n; i++) {
        memcpy(state_at(w, i - 1)->data, sv->mem[i], sv->nbytes[i]);
        free(sv->mem[i]);
    }
    free(sv->mem[0]);
}

/* Adaptive: the scripted loss picks the intervals; the checkpoint state restores the run. */
static void worker_adaptive(worker *w) {
    fl_strategy s;
    fl_strategy_defaults(&s);
    s.adaptive_localsgd = true;
    s.adaptive_localsgd_configs.init_k_steps = 2;
    s.adaptive_localsgd_configs.begin_step = 2;
    CHECK_OK(worker_start(w, &s, FL_OPTIM_MOMENTUM));
    if (!w->d)
        goto done;
    /* the state: dist.counters, a snapshot per trainable parameter, the two counters */
    int ntrain = 0;
    for (int i = 0; i < fl_net_num_params(w->net); i++)
        ntrain += fl_net_param(w->net, i)->trainable;
    CHECK(fl_dist_num_state(w->d) == 1 + ntrain + 2);
    CHECK(!strcmp(fl_dist_state(w->d, 1)->name, "localsgd.snapshot.fc1.weight"));
    CHECK(fl_dist_state(w->d, 1)->value.numel == fl_net_param(w->net, 0)->value.numel);
    CHECK(fl_dist_state(w->d, 1)->value.data != fl_net_param(w->net, 0)->value.data);
    CHECK(!strcmp(fl_dist_state(w->d, 1 + ntrain)->name, "localsgd.counters"));
    CHECK(!strcmp(fl_dist_state(w->d, 2 + ntrain)->name, "localsgd.adaptive"));
    CHECK(fl_dist_state(w->d, 3 + ntrain) == NULL);
    /* loss0 = 1 (step 1), lr0 = 0.05; warm-up 1, 2 at init_k 2; step 4: loss 8 -> k 4;
     * 8: loss 2 -> 2; 10: loss 0.5 -> 1; 11: loss 200 -> 16; 27: loss 2.25 at lr 0.025 -> 3;
     * 30: loss 7 at lr 0.025 -> ceil(sqrt(28)) = 6 (the losses between averages never count) */
    const int64_t want[] = {1, 2, 4, 8, 10, 11, 27, 30};
    run_log log = {.steps = 30, .adaptive = true, .shadow = true};
    saved sv;
    run_steps(w, &log, 1, 14);
    save(w, &sv);
    run_steps(w, &log, 15, log.steps);
    check_steps("adaptive through the strategy", log.sent_steps, log.nsent, want, 8);
    const int64_t *counters = fl_dist_state(w->d, 1 + ntrain)->value.data;
    const double *rule = fl_dist_state(w->d, 2 + ntrain)->value.data;
    CHECK(counters[0] == 30 && counters[1] == 6);
    CHECK(rule[0] == 1.0 && rule[1] == 0.05);
    /* a sync step sends the parameters and the 8-byte loss; step 1 the loss once more */
    CHECK(log.sent_bytes[4] == log.sent_bytes[8] && log.sent_bytes[4] > log.sent_bytes[2]);
    int64_t numel = fl_net_numel(w->net);
    float *final = malloc((size_t)numel * sizeof *final);
    memcpy(final, fl_net_flat_params(w->net), (size_t)numel * sizeof *final);
    /* back to step 14 (mid-interval: the next average is step 27) and again */
    restore(w, &sv);
    CHECK(fl_dist_step(w->d) == 14);
    run_log again = {.steps = 30, .adaptive = true};
    run_steps(w, &again, 15, again.steps);
    check_steps("adaptive after restoring step 14", again.sent_steps, again.nsent,
                (int64_t[]){27, 30}, 2);
    CHECK(memcmp(final, fl_net_flat_params(w->net), (size_t)numel * sizeof *final) == 0);
    free(final);
done:
    worker_free(w);
}

/* Bytes per step: k = 1 sends what dense sends; after the first step, 1/k of it. */
static void worker_bytes(worker *w) {
    fl_strategy s;
    fl_strategy_defaults(&s);
    CHECK_OK(worker_start(w, &s, FL_OPTIM_SGD));
    run_log dense = {.steps = 3};
    if (w->d)
        run_steps(w, &dense, 1, dense.steps);
    worker_free(w);
    uint64_t per_step = dense.sent_bytes[2];
    CHECK(per_step > 0 && dense.sent_bytes[3] == per_step);
    enum { STEPS = 33 };
    for (int64_t k = 1; k <= 16; k *= 2) {
        s.localsgd = true;
        s.localsgd_configs.k_steps = k;
        CHECK_OK(worker_start(w, &s, FL_OPTIM_SGD));
        run_log log = {.steps = STEPS};
        if (w->d)
            run_steps(w, &log, 1, STEPS);
        uint64_t total = 0;
        for (int64_t st = 2; st <= STEPS; st++) {
            total += log.sent_bytes[st];
            CHECK(log.sent_bytes[st] == ((st - 1) % k == 0 ? per_step : 0));
        }
        if (total * (uint64_t)k != (STEPS - 1) * per_step) {
            fprintf(stderr, "k %lld: %llu bytes in steps 2..%d, want %llu / k\n", (long long)k,
                    (unsigned long long)total, STEPS, (unsigned long long)(STEPS - 1) * per_step);
            test_failures++;
        }
        if (w->rank == 0)
            printf("rank 0, %d ranks: k %2lld: %6.0f bytes per step (dense: %llu)\n", w->world,
                   (long long)k, (double)total / (STEPS - 1), (unsigned long long)per_step);
        worker_free(w);
    }
}

/* One forked worker of a job of n on loopback: the launcher environment, then the cases. */
static int worker_main(int rank, int n, const int *ports, int listen_fd) {
    char endpoints[256] = "", me[32];
    for (int r = 0; r < n; r++) {
        size_t len = strlen(endpoints);
        snprintf(endpoints + len, sizeof endpoints - len, "%s127.0.0.1:%d", r ? "," : "",
                 ports[r]);
    }
    snprintf(me, sizeof me, "127.0.0.1:%d", ports[rank]);
    char id[16], num[16], fd[16];
    snprintf(id, sizeof id, "%d", rank);
    snprintf(num, sizeof num, "%d", n);
    snprintf(fd, sizeof fd, "%d", listen_fd);
    setenv("PADDLE_TRAINER_ID", id, 1);
    setenv("PADDLE_TRAINERS_NUM", num, 1);
    setenv("PADDLE_TRAINER_ENDPOINTS", endpoints, 1);
    setenv("PADDLE_CURRENT_ENDPOINT", me, 1);
    setenv("FLEET_LISTEN_FD", fd, 1);
    setenv("FLEET_COMM_TIMEOUT", "60", 1);
    setenv("FLEET_JOB_TOKEN", "test_localsgd", 1);
    worker w = {0};
    if (fl_fleet_init("tcp", &w.fleet) < 0) {
        fprintf(stderr, "rank %d: %s\n", rank, fl_errmsg());
        return 1;
    }
    w.rank = fl_worker_index(w.fleet);
    w.world = fl_worker_num(w.fleet);
    CHECK(w.rank == rank && w.world == n);
    worker_fixed(&w);
    worker_adaptive(&w);
    worker_bytes(&w);
    fl_fleet_free(w.fleet);
    return test_failures ? 1 : 0;
}

static void test_workers(int n) {
    int fds[8], ports[8];
    for (int r = 0; r < n; r++) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        fds[r] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[r] < 0 || bind(fds[r], (struct sockaddr *)&a, sizeof a) < 0 ||
            listen(fds[r], 16) < 0 || getsockname(fds[r], (struct sockaddr *)&a, &len) < 0) {
            perror("test_localsgd: loopback socket");
            test_failures++;
            return;
        }
        ports[r] = ntohs(a.sin_port);
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            for (int q = 0; q < n; q++)
                if (q != r)
                    close(fds[q]);
            int rc = worker_main(r, n, ports, fds[r]);
            fflush(stdout);
            _exit(rc);
        }
    }
    for (int r = 0; r < n; r++) {
        int st = 0;
        close(fds[r]);
        if (pids[r] < 0 || waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) ||
            WEXITSTATUS(st) != 0) {
            fprintf(stderr, "%d workers: rank %d failed (status %d)\n", n, r, st);
            test_failures++;
        }
    }
}

/* --- a job of one --- */

static void test_single_worker(void) {
    if (getenv("PADDLE_TRAINERS_NUM") || getenv("WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE"))
        return; /* run under a launcher: not a job of one */
    worker w = {0};
    CHECK_OK(fl_fleet_init(NULL, &w.fleet));
    if (!w.fleet)
        return;
    w.world = 1;
    fl_strategy s;
    fl_strategy_defaults(&s);

    /* refusals: the combinations fl_strategy_check turns away */
    s.localsgd = true;
    s.fp16_allreduce = true;
    CHECK_RC(fl_strategy_check(&s, NULL, FL_OPTIM_SGD), FL_ECONFIG);
    CHECK_MSG("strategy.fp16_allreduce cannot be combined with strategy.localsgd");
    s.localsgd = false;
    s.adaptive_localsgd = true;
    CHECK_RC(fl_strategy_check(&s, NULL, FL_OPTIM_MOMENTUM), FL_ECONFIG);
    CHECK_MSG("strategy.fp16_allreduce cannot be combined with strategy.adaptive_localsgd");
    s.fp16_allreduce = false;

    /* adaptive without the loss: a clear error, nothing updated */
    CHECK_OK(worker_start(&w, &s, FL_OPTIM_SGD));
    if (w.d) {
        fl_tensor probs;
        batch_of(&w, 1);
        CHECK_OK(backward_of(&w, w.net, &probs));
        int64_t numel = fl_net_numel(w.net);
        float *before = malloc((size_t)numel * sizeof *before);
        memcpy(before, fl_net_flat_params(w.net), (size_t)numel * sizeof *before);
        CHECK_RC(fl_dist_minimize(w.d, &probs, 0.1, NULL), FL_ESTATE);
        CHECK_MSG("strategy.adaptive_localsgd: no loss for update 0: call fl_dist_set_loss");
        CHECK(memcmp(before, fl_net_flat_params(w.net), (size_t)numel * sizeof *before) == 0);
        free(before);
    }
    worker_free(&w);

    /* gradient merge inside local steps: with one worker, local SGD is plain training, so
     * local SGD with merge 4 of batch B equals dense with merge 4, bit for bit */
    fl_strategy_defaults(&s);
    s.gradient_merge = true;
    s.gradient_merge_configs.k_steps = 4;
    worker ref = {.fleet = w.fleet, .world = 1};
    CHECK_OK(worker_start(&ref, &s, FL_OPTIM_MOMENTUM));
    s.localsgd = true;
    s.localsgd_configs.k_steps = 3;
    CHECK_OK(worker_start(&w, &s, FL_OPTIM_MOMENTUM));
    for (int64_t st = 1; w.d && ref.d && st <= 12; st++) {
        fl_tensor probs;
        batch_of(&w, st);
        memcpy(ref.xs, w.xs, sizeof w.xs);
        memcpy(ref.ys, w.ys, sizeof w.ys);
        CHECK_OK(backward_of(&w, w.net, &probs));
        CHECK_OK(fl_dist_minimize(w.d, &probs, 0.1, NULL));
        CHECK_OK(backward_of(&ref, ref.net, &probs));
        CHECK_OK(fl_dist_minimize(ref.d, &probs, 0.1, NULL));
    }
    CHECK(w.d && fl_dist_step(w.d) == 3 && fl_dist_bytes_sent(w.d) == 0);
    CHECK(w.d && ref.d &&
          memcmp(fl_net_flat_params(w.net), fl_net_flat_params(ref.net),
                 (size_t)fl_net_numel(w.net) * sizeof(float)) == 0);
    worker_free(&ref);
    worker_free(&w);
    fl_fleet_free(w.fleet);
}

int main(void) {
    test_schedule();
    test_adaptive_rule();
    test_adaptive_lr0();
    test_adacomm_rule();
    test_single_worker();
    if (!getenv("PADDLE_TRAINERS_NUM")) {
        test_workers(2);
        test_workers(4);
    }
    if (test_failures) {
        fprintf(stderr, "test_localsgd: %d failure(s)\n", test_failures);
        return 1;
    }
    printf("test_localsgd: ok\n");
    return 0;
}
