/* test_strategy.c - the distributed strategy: Paddle's defaults; the schema embedded in a larger
 * config (YAML file, -o overrides, was_set, refusals with key and line); fl_strategy_check's
 * refusal of every not-implemented feature and config key and of every impossible combination;
 * and, in a job of one, the distributed optimizer's refusals, gradient merge against the big
 * batch, and the Fleet API's worker queries. (Multi-worker runs: tests/cli/test_dist_*.sh.) */
#include "fleet/fleet.h"
#include "test.h"

#include <stddef.h>
#include <unistd.h>

/* a program's config with the strategy section inside, as the trainer embeds it */
typedef struct {
    int64_t     epochs;
    fl_strategy strategy;
    double      lr;
} wrapper;

#define MAX_KEYS 64
static fl_cfg_key schema[MAX_KEYS];
static int nkeys;

static void build_schema(void) {
    schema[0] = (fl_cfg_key){"epochs", FL_CFG_INT, offsetof(wrapper, epochs), 0, 1, 1000, NULL,
                             false, "epochs"};
    int n = fl_strategy_schema("strategy", offsetof(wrapper, strategy), schema + 1, MAX_KEYS - 2);
    CHECK(n > 20 && n <= MAX_KEYS - 2);
    schema[1 + n] = (fl_cfg_key){"lr", FL_CFG_DOUBLE, offsetof(wrapper, lr), 0, 0, 10, NULL,
                                 false, "learning rate"};
    nkeys = n + 2;
}

static int key_index(const char *path) {
    for (int i = 0; i < nkeys; i++)
        if (strcmp(schema[i].path, path) == 0)
            return i;
    return -1;
}

static char dir[] = "/tmp/fleet_test_strategy_XXXXXX";
static char file[300];

static const char *write_yaml(const char *text) {
    snprintf(file, sizeof file, "%s/c.yaml", dir);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return file;
}

/* loads text (and overrides) into w over defaults; returns fl_config_load's status */
static int load(const char *text, const char *const *ov, int nov, wrapper *w, bool *was_set) {
    memset(w, 0, sizeof *w);
    w->epochs = 1;
    fl_strategy_defaults(&w->strategy);
    w->lr = 0.1;
    return fl_config_load(text ? write_yaml(text) : NULL, ov, nov, schema, nkeys, w, was_set);
}

static void test_defaults(void) {
    fl_strategy s;
    memset(&s, 0xff, sizeof s);
    fl_strategy_defaults(&s);
    CHECK(s.fuse_grad_size_in_MB == 32);
    CHECK(s.overlap && !s.fp16_allreduce && !s.gradient_merge);
    CHECK(s.gradient_merge_configs.k_steps == 1 && s.gradient_merge_configs.avg);
    CHECK(!s.dgc && s.dgc_configs.rampup_begin_step == 0 && s.dgc_configs.rampup_step == 1);
    CHECK(s.dgc_configs.sparsity.n == 1 && s.dgc_configs.sparsity.v[0] == 0.999);
    CHECK(s.dgc_configs.min_compress_numel == 16384 && s.dgc_configs.selection == 0 &&
          s.dgc_configs.exchange == 0 /* auto */ && s.dgc_configs.sparse_budget == 7 &&
          s.dgc_configs.dense_fallback && s.dgc_configs.warmup &&
          s.dgc_configs.momentum_correction && s.dgc_configs.local_clipping &&
          s.dgc_configs.momentum_masking && s.dgc_configs.weight_decay_correction);
    CHECK(!s.localsgd && s.localsgd_configs.k_steps == 1 && s.localsgd_configs.begin_step == 1);
    CHECK(!s.adaptive_localsgd && s.adaptive_localsgd_configs.init_k_steps == 1 &&
          s.adaptive_localsgd_configs.begin_step == 1);
    CHECK(!s.lars && s.lars_configs.lars_coeff == 0.001 &&
          s.lars_configs.lars_weight_decay == 0.0005 && s.lars_configs.epsilon == 0 &&
          s.lars_configs.exclude_from_weight_decay[0] == 0);
    CHECK(!s.amp && s.amp_configs.init_loss_scaling == 32768 &&
          s.amp_configs.use_dynamic_loss_scaling && s.amp_configs.incr_every_n_steps == 1000 &&
          s.amp_configs.decr_every_n_nan_or_inf == 2 && s.amp_configs.incr_ratio == 2.0 &&
          s.amp_configs.decr_ratio == 0.8);
    CHECK(!s.recompute && s.recompute_configs.checkpoints[0] == 0);
    /* the defaults pass with either optimizer */
    CHECK_OK(fl_strategy_check(&s, NULL, FL_OPTIM_SGD));
    CHECK_OK(fl_strategy_check(&s, NULL, FL_OPTIM_MOMENTUM));
}

static void test_schema(void) {
    int n = fl_strategy_schema("strategy", 0, NULL, 0);
    CHECK(nkeys == n + 2);
    /* every field has a prefixed key with help; no duplicates; offsets inside the struct */
    for (int i = 1; i <= n; i++) {
        CHECK(strncmp(schema[i].path, "strategy.", 9) == 0);
        CHECK(schema[i].help && schema[i].help[0]);
        CHECK(schema[i].offset >= offsetof(wrapper, strategy) &&
              schema[i].offset < offsetof(wrapper, strategy) + sizeof(fl_strategy));
        for (int j = 1; j < i; j++)
            CHECK(strcmp(schema[i].path, schema[j].path) != 0);
    }
    const char *want[] = {"strategy.fuse_grad_size_in_MB", "strategy.overlap",
                          "strategy.fp16_allreduce", "strategy.use_hierarchical_allreduce",
                          "strategy.hierarchical_allreduce_inter_nranks",
                          "strategy.nccl_comm_num",
                          "strategy.gradient_merge",
                          "strategy.gradient_merge_configs.k_steps",
                          "strategy.gradient_merge_configs.avg", "strategy.dgc",
                          "strategy.dgc_configs.rampup_begin_step",
                          "strategy.dgc_configs.rampup_step", "strategy.dgc_configs.sparsity",
                          "strategy.dgc_configs.min_compress_numel",
                          "strategy.dgc_configs.selection", "strategy.dgc_configs.exchange",
                          "strategy.dgc_configs.sparse_budget",
                          "strategy.dgc_configs.dense_fallback",
                          "strategy.dgc_configs.warmup", "strategy.dgc_configs.momentum_correction",
                          "strategy.dgc_configs.local_clipping",
                          "strategy.dgc_configs.momentum_masking",
                          "strategy.dgc_configs.weight_decay_correction",
                          "strategy.localsgd", "strategy.localsgd_configs.k_steps",
                          "strategy.localsgd_configs.begin_step", "strategy.adaptive_localsgd",
                          "strategy.adaptive_localsgd_configs.init_k_steps",
                          "strategy.adaptive_localsgd_configs.begin_step",
                          "strategy.adaptive_localsgd_configs.rule", "strategy.lars",
                          "strategy.lars_configs.lars_coeff",
                          "strategy.lars_configs.lars_weight_decay",
                          "strategy.lars_configs.epsilon",
                          "strategy.lars_configs.exclude_from_weight_decay", "strategy.amp",
                          "strategy.amp_configs.init_loss_scaling",
                          "strategy.amp_configs.use_dynamic_loss_scaling",
                          "strategy.amp_configs.incr_every_n_steps",
                          "strategy.amp_configs.decr_every_n_nan_or_inf",
                          "strategy.amp_configs.incr_ratio", "strategy.amp_configs.decr_ratio",
                          "strategy.amp_configs.dtype", "strategy.amp_configs.custom_white_list",
                          "strategy.amp_configs.custom_black_list", "strategy.a_sync",
                          "strategy.a_sync_configs.k_steps",
                          "strategy.a_sync_configs.max_merge_var_num",
                          "strategy.a_sync_configs.geo_background", "strategy.recompute",
                          "strategy.recompute_configs.checkpoints"};
    CHECK(n == (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (key_index(want[i]) < 0) {
            fprintf(stderr, "missing key %s\n", want[i]);
            test_failures++;
        }
    /* the same prefix gives the same (cached) strings; another prefix its own */
    fl_cfg_key again[MAX_KEYS], other[MAX_KEYS];
    CHECK(fl_strategy_schema("strategy", 0, again, MAX_KEYS) == n);
    CHECK(again[0].path == schema[1].path);
    CHECK(again[0].offset + offsetof(wrapper, strategy) == schema[1].offset);
    CHECK(fl_strategy_schema("train.dist", 0, other, 3) == n); /* cap 3: only 3 written */
    CHECK(strcmp(other[0].path, "train.dist.fuse_grad_size_in_MB") == 0);
    CHECK(strcmp(other[2].path, "train.dist.fp16_allreduce") == 0);
}

static void test_load(void) {
    wrapper w;
    bool was_set[MAX_KEYS];
    /* a file sets some keys, -o others; the rest keep the defaults */
    const char *yaml = "epochs: 3\n"
                       "strategy:\n"
                       "  fuse_grad_size_in_MB: 0.5\n"
                       "  overlap: false\n"
                       "  gradient_merge: true\n"
                       "  gradient_merge_configs: {k_steps: 4, avg: false}\n"
                       "lr: 0.2\n";
    const char *ov[] = {"strategy.fp16_allreduce=true",
                        "strategy.gradient_merge_configs.k_steps=8"};
    CHECK_OK(load(yaml, ov, 2, &w, was_set));
    CHECK(w.epochs == 3 && w.lr == 0.2);
    CHECK(w.strategy.fuse_grad_size_in_MB == 0.5 && !w.strategy.overlap);
    CHECK(w.strategy.fp16_allreduce && w.strategy.gradient_merge);
    CHECK(w.strategy.gradient_merge_configs.k_steps == 8 && !w.strategy.gradient_merge_configs.avg);
    CHECK(w.strategy.dgc_configs.sparsity.n == 1 && w.strategy.lars_configs.lars_coeff == 0.001);
    CHECK(was_set[key_index("strategy.overlap")] && !was_set[key_index("strategy.dgc")]);
    CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_SGD));

    /* dotted keys and lists; a not-implemented feature's config key is refused via was_set */
    CHECK_OK(load("strategy.dgc_configs.sparsity: [0.75, 0.9375, 0.999]\n", NULL, 0, &w, was_set));
    CHECK(w.strategy.dgc_configs.sparsity.n == 3 && w.strategy.dgc_configs.sparsity.v[1] == 0.9375);
    CHECK_OK(fl_strategy_check(&w.strategy, NULL, FL_OPTIM_MOMENTUM)); /* without was_set */
    CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_MOMENTUM)); /* dgc has landed */
    CHECK_OK(load("strategy.amp_configs.incr_ratio: 3\n", NULL, 0, &w, was_set));
    CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_MOMENTUM)); /* amp has landed */
    CHECK(w.strategy.amp_configs.incr_ratio == 3 && w.strategy.amp_configs.dtype == FL_AMP_FLOAT16);
    CHECK_OK(load("strategy:\n  amp: true\n  amp_configs: {dtype: bfloat16, custom_white_list: "
                  "'batch_norm, add', custom_black_list: fc}\n", NULL, 0, &w, was_set));
    CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_SGD));
    CHECK(w.strategy.amp && w.strategy.amp_configs.dtype == FL_AMP_BFLOAT16);
    CHECK(strcmp(w.strategy.amp_configs.custom_white_list, "batch_norm, add") == 0);
    CHECK_RC(load("strategy.amp_configs.dtype: float8\n", NULL, 0, &w, NULL), FL_ECONFIG);
    CHECK_MSG("strategy.amp_configs.dtype");

    /* the config layer's refusals name the strategy key and its line */
    CHECK_RC(load("epochs: 2\nstrategy:\n  dgc_config:\n    sparsity: [0.9]\n", NULL, 0, &w, NULL),
             FL_ECONFIG);
    CHECK_MSG("c.yaml:3: unknown key 'strategy.dgc_config'");
    CHECK_MSG("did you mean 'strategy.dgc_configs'");
    CHECK_RC(load("strategy:\n  gradient_merge_configs:\n    k_steps: 0\n", NULL, 0, &w, NULL),
             FL_ECONFIG);
    CHECK_MSG("c.yaml:3: strategy.gradient_merge_configs.k_steps");
    CHECK_RC(load("strategy:\n  overlap: sometimes\n", NULL, 0, &w, NULL), FL_ECONFIG);
    CHECK_MSG("strategy.overlap");
    const char *neg[] = {"strategy.fuse_grad_size_in_MB=-1"};
    CHECK_RC(load(NULL, neg, 1, &w, NULL), FL_ECONFIG);
    CHECK_MSG("strategy.fuse_grad_size_in_MB");
    const char *sp[] = {"strategy.dgc_configs.sparsity=[0.5, 1.5]"};
    CHECK_RC(load(NULL, sp, 1, &w, NULL), FL_ECONFIG);
    CHECK_MSG("strategy.dgc_configs.sparsity");
}

/* check(): amp's lists, each bad combination */
static void test_check(void) {
    wrapper w;
    bool was_set[MAX_KEYS];
    /* every feature has landed: each switch alone passes, with or without was_set */
    static const char *sw[] = {"strategy.amp=true", "strategy.dgc=true", "strategy.lars=true",
                               "strategy.localsgd=true", "strategy.gradient_merge=true"};
    for (size_t f = 0; f < sizeof sw / sizeof sw[0]; f++) {
        const char *o[] = {sw[f]};
        CHECK_OK(load(NULL, o, 1, &w, was_set));
        CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_MOMENTUM));
    }
    /* amp's lists: layer types only (the loss in the black list), never in both */
    struct {
        const char *ov;
        const char *msg; /* NULL: accepted */
    } lists[] = {
        {"strategy.amp_configs.custom_white_list=conv2d,batch_norm,add", NULL},
        {"strategy.amp_configs.custom_black_list=softmax_with_cross_entropy,fc", NULL},
        {"strategy.amp_configs.custom_white_list=conv",
         "strategy.amp_configs.custom_white_list: 'conv' is not a layer type (the types are fc, "
         "conv2d,"},
        {"strategy.amp_configs.custom_black_list=fc,softmaxx",
         "strategy.amp_configs.custom_black_list: 'softmaxx' is not a layer type"},
        {"strategy.amp_configs.custom_white_list=softmax_with_cross_entropy",
         "strategy.amp_configs.custom_white_list: 'softmax_with_cross_entropy': the loss always "
         "computes in f32"},
    };
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) {
        const char *o[] = {lists[i].ov};
        CHECK_OK(load(NULL, o, 1, &w, NULL));
        int rc = fl_strategy_check(&w.strategy, NULL, FL_OPTIM_SGD);
        if (!lists[i].msg) {
            CHECK_OK(rc);
            continue;
        }
        CHECK_RC(rc, FL_ECONFIG);
        CHECK(strncmp(fl_errmsg(), lists[i].msg, strlen(lists[i].msg)) == 0);
        if (strncmp(fl_errmsg(), lists[i].msg, strlen(lists[i].msg)) != 0)
            fprintf(stderr, "  got  %s\n  want %s\n", fl_errmsg(), lists[i].msg);
    }
    const char *both[] = {"strategy.amp_configs.custom_white_list=add,batch_norm",
                          "strategy.amp_configs.custom_black_list=batch_norm"};
    CHECK_OK(load(NULL, both, 2, &w, NULL));
    CHECK_RC(fl_strategy_check(&w.strategy, NULL, FL_OPTIM_SGD), FL_ECONFIG);
    CHECK_MSG("strategy.amp_configs.custom_white_list: 'batch_norm' is also in "
              "strategy.amp_configs.custom_black_list");

    /* combinations are refused with their reason */
    struct {
        const char *ov[2];
        fl_optim_type opt;
        const char *msg;
    } combos[] = {
        {{"strategy.dgc=true", NULL}, FL_OPTIM_SGD,
         "strategy.dgc needs optimizer.type momentum (Deep Gradient Compression corrects "
         "momentum)"},
        {{"strategy.dgc=true", "strategy.localsgd=true"}, FL_OPTIM_MOMENTUM,
         "strategy.dgc cannot be combined with strategy.localsgd"},
        {{"strategy.dgc=true", "strategy.adaptive_localsgd=true"}, FL_OPTIM_MOMENTUM,
         "strategy.dgc cannot be combined with strategy.adaptive_localsgd"},
        {{"strategy.localsgd=true", "strategy.adaptive_localsgd=true"}, FL_OPTIM_SGD,
         "strategy.localsgd cannot be combined with strategy.adaptive_localsgd"},
        {{"strategy.lars=true", NULL}, FL_OPTIM_SGD, "strategy.lars needs optimizer.type momentum"},
        {{"strategy.dgc=true", "strategy.fp16_allreduce=true"}, FL_OPTIM_MOMENTUM,
         "strategy.dgc cannot be combined with strategy.fp16_allreduce (DGC sends f32 values"},
        {{"strategy.dgc=true", "strategy.lars=true"}, FL_OPTIM_MOMENTUM,
         "strategy.dgc cannot be combined with strategy.lars"},
        {{"strategy.dgc=true", "strategy.dgc_configs.sparsity=[]"}, FL_OPTIM_MOMENTUM,
         "strategy.dgc_configs.sparsity: the list is empty"},
        {{"strategy.localsgd=true", "strategy.fp16_allreduce=true"}, FL_OPTIM_SGD,
         "strategy.fp16_allreduce cannot be combined with strategy.localsgd (fp16_allreduce "
         "sends gradients as f16; Local SGD sends no gradients"},
        {{"strategy.adaptive_localsgd=true", "strategy.fp16_allreduce=true"}, FL_OPTIM_MOMENTUM,
         "strategy.fp16_allreduce cannot be combined with strategy.adaptive_localsgd"},
    };
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        CHECK_OK(load(NULL, combos[c].ov, combos[c].ov[1] ? 2 : 1, &w, was_set));
        CHECK_RC(fl_strategy_check(&w.strategy, was_set + 1, combos[c].opt), FL_ECONFIG);
        CHECK_MSG(combos[c].msg);
    }

    /* values a struct filled in code can hold and a config cannot */
    fl_strategy s;
    fl_strategy_defaults(&s);
    s.gradient_merge = true;
    s.gradient_merge_configs.k_steps = 0;
    CHECK_RC(fl_strategy_check(&s, NULL, FL_OPTIM_SGD), FL_ECONFIG);
    CHECK_MSG("strategy.gradient_merge_configs.k_steps: 0 must be >= 1");
    fl_strategy_defaults(&s);
    s.fuse_grad_size_in_MB = NAN;
    CHECK_RC(fl_strategy_check(&s, NULL, FL_OPTIM_SGD), FL_ECONFIG);
    CHECK_MSG("strategy.fuse_grad_size_in_MB");
    fl_strategy_defaults(&s); /* what is implemented combines freely */
    s.fp16_allreduce = s.gradient_merge = true;
    s.gradient_merge_configs.k_steps = 4;
    s.overlap = false;
    s.fuse_grad_size_in_MB = 0;
    CHECK_OK(fl_strategy_check(&s, NULL, FL_OPTIM_MOMENTUM));
    /* Local SGD, fixed or adaptive, with SGD or Momentum, with gradient merge */
    const char *local[][3] = {
        {"strategy.localsgd=true", "strategy.localsgd_configs.k_steps=4",
         "strategy.localsgd_configs.begin_step=100"},
        {"strategy.adaptive_localsgd=true", "strategy.adaptive_localsgd_configs.init_k_steps=16",
         "strategy.gradient_merge=true"},
    };
    for (int c = 0; c < 2; c++) {
        CHECK_OK(load(NULL, local[c], 3, &w, was_set));
        CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_SGD));
        CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_MOMENTUM));
    }
    /* DGC with Momentum, its warm-up and ablation switches set, gradient merge on */
    const char *dgc_on[] = {"strategy.dgc=true", "strategy.dgc_configs.sparsity=[0.75, 0.999]",
                            "strategy.dgc_configs.momentum_masking=false",
                            "strategy.gradient_merge=true"};
    CHECK_OK(load(NULL, dgc_on, 4, &w, was_set));
    CHECK_OK(fl_strategy_check(&w.strategy, was_set + 1, FL_OPTIM_MOMENTUM));
    CHECK(!w.strategy.dgc_configs.momentum_masking && w.strategy.dgc_configs.sparsity.n == 2);
    const char *bad_k[] = {"strategy.adaptive_localsgd_configs.init_k_steps=17"};
    CHECK_RC(load(NULL, bad_k, 1, &w, was_set), FL_ECONFIG);
    CHECK_MSG("strategy.adaptive_localsgd_configs.init_k_steps");
}

/* one step of the MLP on batch (x, y): forward, loss, gradient of the loss into probs */
static void forward(fl_net *net, const fl_tensor *x, const int32_t *y, float *probs_mem,
                    fl_tensor *probs) {
    const fl_tensor *logits;
    double loss;
    CHECK_OK(fl_net_forward(net, x, true, &logits));
    fl_tensor_view(probs, FL_DTYPE_F32, 2, logits->shape, probs_mem);
    CHECK_OK(fl_softmax_xent_forward(fl_net_backend(net), logits, y, probs, &loss));
    CHECK_OK(fl_softmax_xent_backward(fl_net_backend(net), probs, y, probs));
}

/* A job of one (no launcher environment): the Fleet API's queries, the optimizer's refusals,
 * and gradient merge of k micro-batches against one batch of k times the size. */
static void test_single_worker(void) {
    if (getenv("PADDLE_TRAINERS_NUM") || getenv("WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE"))
        return; /* run under a launcher: not a job of one */
    fl_fleet *fleet = NULL;
    CHECK_OK(fl_fleet_init(NULL, &fleet));
    if (!fleet)
        return;
    CHECK(fl_worker_index(fleet) == 0 && fl_worker_num(fleet) == 1);
    CHECK(fl_worker_endpoint(fleet, 0) != NULL && fl_worker_endpoint(fleet, 1) == NULL);
    CHECK(fl_fleet_comm(fleet) != NULL);
    CHECK_OK(fl_barrier(fleet));

    enum { B = 8, K = 4 };
    int64_t hidden[] = {16}, in_shape[] = {6};
    fl_net *nets[2];
    fl_optim *opts[2];
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-3};
    for (int i = 0; i < 2; i++) {
        nets[i] = fl_model_mlp(FL_DTYPE_F32, 6, hidden, 1, FL_ACT_TANH, 3);
        CHECK_OK(fl_net_build(nets[i], 1, in_shape, i == 0 ? B * K : B, 5));
        opts[i] = fl_optim_create(&oc, fl_net_param(nets[i], 0), fl_net_num_params(nets[i]),
                                  FL_DTYPE_F32, fl_net_backend(nets[i]));
    }
    fl_strategy s;
    fl_strategy_defaults(&s);

    /* refusals: a strategy that does not pass check, an unbuilt network, f16 with f64 */
    s.amp = true;
    snprintf(s.amp_configs.custom_white_list, sizeof s.amp_configs.custom_white_list, "conv");
    CHECK(fl_distributed_optimizer(fleet, nets[0], opts[0], &s) == NULL);
    CHECK_MSG("strategy.amp_configs.custom_white_list: 'conv' is not a layer type");
    fl_strategy_defaults(&s);
    fl_net *unbuilt = fl_model_mlp(FL_DTYPE_F32, 6, hidden, 1, FL_ACT_TANH, 3);
    CHECK(fl_distributed_optimizer(fleet, unbuilt, opts[0], &s) == NULL);
    CHECK_MSG("not built");
    fl_net_free(unbuilt);
    fl_net *f64 = fl_model_mlp(FL_DTYPE_F64, 6, hidden, 1, FL_ACT_TANH, 3);
    CHECK_OK(fl_net_build(f64, 1, in_shape, B, 5));
    fl_optim *o64 = fl_optim_create(&oc, fl_net_param(f64, 0), fl_net_num_params(f64),
                                    FL_DTYPE_F64, fl_net_backend(f64));
    s.fp16_allreduce = true;
    CHECK(fl_distributed_optimizer(fleet, f64, o64, &s) == NULL);
    CHECK_MSG("strategy.fp16_allreduce: needs an f32 network");
    s.fp16_allreduce = false;
    s.dgc = true;
    CHECK(fl_distributed_optimizer(fleet, f64, o64, &s) == NULL);
    CHECK_MSG("strategy.dgc: needs an f32 network");
    fl_optim_free(o64);
    fl_net_free(f64);

    /* nets[0] takes batches of K*B; nets[1] the same samples as K micro-batches of B */
    fl_strategy_defaults(&s);
    fl_dist_optim *big = fl_distributed_optimizer(fleet, nets[0], opts[0], &s);
    s.gradient_merge = true;
    s.gradient_merge_configs.k_steps = K;
    s.fuse_grad_size_in_MB = 0;
    fl_dist_optim *merged = fl_distributed_optimizer(fleet, nets[1], opts[1], &s);
    CHECK(big && merged);
    float xs[K * B * 6], probs_mem[K * B * 3];
    int32_t ys[K * B];
    fl_rng rng;
    fl_rng_init(&rng, 11, 0);
    for (int step = 0; big && merged && step < 5; step++) {
        for (int i = 0; i < K * B * 6; i++)
            xs[i] = (float)fl_rng_normal(&rng);
        for (int i = 0; i < K * B; i++)
            ys[i] = (int32_t)fl_rng_below(&rng, 3);
        fl_tensor x, probs;
        int64_t shape[] = {K * B, 6};
        fl_tensor_view(&x, FL_DTYPE_F32, 2, shape, xs);
        forward(nets[0], &x, ys, probs_mem, &probs);
        bool updated = false;
        CHECK_OK(fl_dist_minimize(big, &probs, 0.1, &updated));
        CHECK(updated);
        for (int j = 0; j < K; j++) {
            shape[0] = B;
            fl_tensor_view(&x, FL_DTYPE_F32, 2, shape, xs + j * B * 6);
            forward(nets[1], &x, ys + j * B, probs_mem, &probs);
            CHECK_OK(fl_dist_minimize(merged, &probs, 0.1, &updated));
            CHECK(updated == (j == K - 1));
        }
        CHECK_CLOSE_F32("merged parameters", fl_net_flat_params(nets[1]),
                        fl_net_flat_params(nets[0]), fl_net_numel(nets[0]), 1e-6, 1e-5);
    }
    CHECK(big && fl_dist_bytes_sent(big) == 0);
    fl_dist_optim_free(big);
    fl_dist_optim_free(merged);
    fl_dist_optim_free(NULL);
    for (int i = 0; i < 2; i++) {
        fl_optim_free(opts[i]);
        fl_net_free(nets[i]);
    }
    fl_fleet_free(fleet);
    fl_fleet_free(NULL);
}

/* strategy.lars swaps Momentum for LARS momentum with lars_configs, and the distributed
 * optimizer refuses strategy.lars over an optimizer that is not LARS */
static void test_lars_optimizer(void) {
    fl_strategy s;
    fl_strategy_defaults(&s);
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4,
                          .clip_norm = 5};
    fl_optim_config same = oc;
    fl_strategy_optim_config(&s, &oc); /* lars off: unchanged */
    CHECK(memcmp(&oc, &same, sizeof oc) == 0);
    s.lars = true;
    s.lars_configs.lars_coeff = 0.02;
    s.lars_configs.lars_weight_decay = 5e-5;
    s.lars_configs.epsilon = 1e-9;
    snprintf(s.lars_configs.exclude_from_weight_decay,
             sizeof s.lars_configs.exclude_from_weight_decay, "bn,bias");
    fl_strategy_optim_config(&s, &oc);
    CHECK(oc.type == FL_OPTIM_LARS && oc.lars_coeff == 0.02 && oc.lars_weight_decay == 5e-5 &&
          oc.epsilon == 1e-9 && strcmp(oc.exclude_from_weight_decay, "bn,bias") == 0);
    CHECK(oc.momentum == 0.9 && oc.weight_decay == 1e-4 && oc.clip_norm == 5);
    fl_optim_config sgd = {.type = FL_OPTIM_SGD};
    fl_strategy_optim_config(&s, &sgd); /* only Momentum becomes LARS; check() refuses SGD */
    CHECK(sgd.type == FL_OPTIM_SGD);
    CHECK_RC(fl_strategy_check(&s, NULL, FL_OPTIM_SGD), FL_ECONFIG);
    CHECK_MSG("strategy.lars needs optimizer.type momentum");
    CHECK_OK(fl_strategy_check(&s, NULL, FL_OPTIM_LARS));

    if (getenv("PADDLE_TRAINERS_NUM") || getenv("WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE"))
        return;
    fl_fleet *fleet = NULL;
    CHECK_OK(fl_fleet_init(NULL, &fleet));
    int64_t hidden[] = {8}, in_shape[] = {4};
    fl_net *net = fl_model_mlp(FL_DTYPE_F32, 4, hidden, 1, FL_ACT_TANH, 3);
    CHECK(net != NULL);
    if (!fleet || !net)
        return;
    CHECK_OK(fl_net_build(net, 1, in_shape, 4, 1));
    fl_optim_config mom = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    fl_optim *opt = fl_optim_create(&mom, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    CHECK(opt != NULL);
    CHECK(fl_distributed_optimizer(fleet, net, opt, &s) == NULL);
    CHECK_MSG("strategy.lars: the optimizer is Momentum, not LARS momentum");
    fl_optim_free(opt);
    fl_strategy_optim_config(&s, &mom);
    opt = fl_optim_create(&mom, fl_net_param(net, 0), fl_net_num_params(net), FL_DTYPE_F32,
                          fl_net_backend(net));
    CHECK(opt != NULL);
    fl_dist_optim *d = fl_distributed_optimizer(fleet, net, opt, &s);
    CHECK(d != NULL);
    if (d) { /* the generic state and loss entry points */
        CHECK_RC(fl_dist_set_loss(d, NAN), FL_EINVAL);
        CHECK_MSG("the loss of update 0 is nan");
        CHECK_OK(fl_dist_set_loss(d, 0.5));
        CHECK(fl_dist_step(d) == 0);
        CHECK(fl_dist_num_state(d) >= 1);
        fl_param *c = fl_dist_state(d, 0);
        CHECK(c && strcmp(c->name, "dist.counters") == 0 && c->value.numel == 2);
        CHECK(fl_dist_state(d, -1) == NULL && fl_dist_state(d, fl_dist_num_state(d)) == NULL);
    }
    fl_dist_optim_free(d);
    fl_optim_free(opt);
    fl_net_free(net);
    fl_fleet_free(fleet);
}

int main(void) {
    if (!mkdtemp(dir))
        TEST_SKIP("cannot create a temporary directory");
    build_schema();
    test_defaults();
    test_schema();
    test_load();
    test_check();
    test_single_worker();
    test_lars_optimizer();
    unlink(file);
    rmdir(dir);
    TEST_DONE();
}
