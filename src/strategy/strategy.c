/* strategy.c - the distributed strategy: Paddle's defaults, the schema of the `strategy:` config
 * section (one table, as the trainer's schema), and the checks that refuse what cannot run:
 * combinations that cannot work and values a config file could not have produced. */
#include "fleet/strategy.h"

#include "amp.h"
#include "dgc_math.h"
#include "fleet/status.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define OFF(field) offsetof(fl_strategy, field)
#define SIZE(field) sizeof(((fl_strategy *)0)->field)
#define BIG 1e15

/* Paths are relative to the prefix; fl_strategy_schema prepends it. */
static const fl_cfg_key keys[] = {
    {"fuse_grad_size_in_MB", FL_CFG_DOUBLE, OFF(fuse_grad_size_in_MB), 0, 0, 1048576, NULL, false,
     "gradient bucket capacity in MiB (buckets fill in reverse parameter order); 0: one per "
     "parameter"},
    {"overlap", FL_CFG_BOOL, OFF(overlap), 0, 0, 0, NULL, false,
     "start a bucket's allreduce during backward, as soon as its gradients are final"},
    {"fp16_allreduce", FL_CFG_BOOL, OFF(fp16_allreduce), 0, 0, 0, NULL, false,
     "send dense gradients as f16 (divided by the worker count first): half the bytes"},
    {"use_hierarchical_allreduce", FL_CFG_BOOL, OFF(use_hierarchical_allreduce), 0, 0, 0, NULL,
     false, "allreduce inside each node, then between nodes (one share per local rank), then "
     "inside the node; with dgc, compress each node's sum once"},
    {"hierarchical_allreduce_inter_nranks", FL_CFG_INT,
     OFF(hierarchical_allreduce_inter_nranks), 0, 0, 4096, NULL, false,
     "ranks per node for use_hierarchical_allreduce; 0: the launcher's LOCAL_WORLD_SIZE"},
    {"nccl_comm_num", FL_CFG_INT, OFF(nccl_comm_num), 0, 1, 8, NULL, false,
     "comm.backend nccl: communicators (each on its own stream) large allreduces are split over"},
    {"gradient_merge", FL_CFG_BOOL, OFF(gradient_merge), 0, 0, 0, NULL, false,
     "accumulate k_steps micro-batches locally, then communicate and update once"},
    {"gradient_merge_configs.k_steps", FL_CFG_INT, OFF(gradient_merge_configs.k_steps), 0, 1, 1e6,
     NULL, false, "micro-batches per update"},
    {"gradient_merge_configs.avg", FL_CFG_BOOL, OFF(gradient_merge_configs.avg), 0, 0, 0, NULL,
     false, "divide the merged gradient by k_steps (false: their sum)"},

    {"dgc", FL_CFG_BOOL, OFF(dgc), 0, 0, 0, NULL, false,
     "Deep Gradient Compression: send the top (1 - sparsity) of each large gradient (Momentum "
     "only; docs/dgc.md)"},
    {"dgc_configs.rampup_begin_step", FL_CFG_INT, OFF(dgc_configs.rampup_begin_step), 0, 0, BIG,
     NULL, false, "dense steps before compression starts"},
    {"dgc_configs.rampup_step", FL_CFG_INT, OFF(dgc_configs.rampup_step), 0, 1, BIG, NULL, false,
     "steps over which sparsity warms up through the sparsity list"},
    {"dgc_configs.sparsity", FL_CFG_DOUBLE_LIST, OFF(dgc_configs.sparsity), 0, 0, 0.999999, NULL,
     false, "warm-up sparsity schedule, e.g. [0.75, 0.9375, 0.984375, 0.996, 0.999]"},
    {"dgc_configs.min_compress_numel", FL_CFG_INT, OFF(dgc_configs.min_compress_numel), 0, 1,
     2147483647.0, NULL, false,
     "tensors with fewer elements stay dense (allreduce every step); Paddle: 16384"},
    {"dgc_configs.selection", FL_CFG_ENUM, OFF(dgc_configs.selection), 0, 0, 0, "sampled|exact",
     false, "top-k selection: sampled threshold refined to the exact top k, or quickselect"},
    {"dgc_configs.exchange", FL_CFG_ENUM, OFF(dgc_configs.exchange), 0, 0, 0,
     "auto|allgather|sparse", false,
     "how the pairs travel: allgather (k (N - 1) received per worker), sparse (a sparse "
     "allreduce, (1 + sparse_budget) k whatever N), auto (the cheaper by an alpha-beta estimate)"},
    {"dgc_configs.sparse_budget", FL_CFG_INT, OFF(dgc_configs.sparse_budget), 0, 1, 64, NULL,
     false,
     "the sparse allreduce keeps the largest budget * k summed pairs and defers the rest a step: "
     "larger keeps more (accuracy), smaller sends less to each worker (scaling)"},
    {"dgc_configs.dense_fallback", FL_CFG_BOOL, OFF(dgc_configs.dense_fallback), 0, 0, 0, NULL,
     false, "use dense allreduce for steps where the pairs would send half its bytes or more"},
    {"dgc_configs.warmup", FL_CFG_BOOL, OFF(dgc_configs.warmup), 0, 0, 0, NULL, false,
     "ablation: false skips the sparsity warm-up (the last sparsity from rampup_begin_step)"},
    {"dgc_configs.momentum_correction", FL_CFG_BOOL, OFF(dgc_configs.momentum_correction), 0, 0,
     0, NULL, false, "ablation: false accumulates gradients, momentum on the aggregate"},
    {"dgc_configs.local_clipping", FL_CFG_BOOL, OFF(dgc_configs.local_clipping), 0, 0, 0, NULL,
     false, "ablation: false skips clipping (optimizer.clip_norm) while compressing"},
    {"dgc_configs.momentum_masking", FL_CFG_BOOL, OFF(dgc_configs.momentum_masking), 0, 0, 0,
     NULL, false, "ablation: false keeps the momentum of entries just sent"},
    {"dgc_configs.weight_decay_correction", FL_CFG_BOOL,
     OFF(dgc_configs.weight_decay_correction), 0, 0, 0, NULL, false,
     "ablation: false applies weight decay after aggregation instead of locally"},

    {"localsgd", FL_CFG_BOOL, OFF(localsgd), 0, 0, 0, NULL, false,
     "Local SGD: local steps, parameters averaged every k_steps (SGD and Momentum)"},
    {"localsgd_configs.k_steps", FL_CFG_INT, OFF(localsgd_configs.k_steps), 0, 1, 1e6, NULL, false,
     "local steps between parameter averages"},
    {"localsgd_configs.begin_step", FL_CFG_INT, OFF(localsgd_configs.begin_step), 0, 1, BIG, NULL,
     false, "synchronous steps before Local SGD starts (post-local SGD)"},
    {"adaptive_localsgd", FL_CFG_BOOL, OFF(adaptive_localsgd), 0, 0, 0, NULL, false,
     "Local SGD with an interval that follows loss and learning rate (needs the loss)"},
    {"adaptive_localsgd_configs.init_k_steps", FL_CFG_INT,
     OFF(adaptive_localsgd_configs.init_k_steps), 0, 1, 16, NULL, false,
     "initial local steps (the interval is capped at 16)"},
    {"adaptive_localsgd_configs.begin_step", FL_CFG_INT, OFF(adaptive_localsgd_configs.begin_step),
     0, 1, BIG, NULL, false, "synchronous steps before adaptive Local SGD starts"},
    {"adaptive_localsgd_configs.rule", FL_CFG_ENUM, OFF(adaptive_localsgd_configs.rule), 0, 0, 0,
     "paddle|adacomm", false,
     "interval rule: paddle ceil(sqrt(ratio * init_k_steps)), adacomm (Wang & Joshi) "
     "ceil(sqrt(ratio) * init_k_steps)"},

    {"lars", FL_CFG_BOOL, OFF(lars), 0, 0, 0, NULL, false,
     "LARS layer-wise learning rates: Momentum becomes LARS momentum (You et al. 2017)"},
    {"lars_configs.lars_coeff", FL_CFG_DOUBLE, OFF(lars_configs.lars_coeff), 0, 1e-12, 1e3, NULL,
     false, "trust coefficient"},
    {"lars_configs.lars_weight_decay", FL_CFG_DOUBLE, OFF(lars_configs.lars_weight_decay), 0, 0, 1,
     NULL, false, "weight decay inside the LARS update"},
    {"lars_configs.epsilon", FL_CFG_DOUBLE, OFF(lars_configs.epsilon), 0, 0, 1, NULL, false,
     "added to the norm ratio's denominator"},
    {"lars_configs.exclude_from_weight_decay", FL_CFG_STRING,
     OFF(lars_configs.exclude_from_weight_decay), SIZE(lars_configs.exclude_from_weight_decay), 0,
     0, NULL, false, "comma-separated name fragments of parameters without weight decay"},

    {"amp", FL_CFG_BOOL, OFF(amp), 0, 0, 0, NULL, false,
     "mixed precision: white-listed layers in f16/bf16 (emulated on the CPU), f32 master "
     "weights, loss scaling; a step with inf/nan gradients on any worker is skipped "
     "(docs/amp.md)"},
    {"amp_configs.init_loss_scaling", FL_CFG_DOUBLE, OFF(amp_configs.init_loss_scaling), 0, 1,
     1e30, NULL, false, "initial loss scale"},
    {"amp_configs.use_dynamic_loss_scaling", FL_CFG_BOOL,
     OFF(amp_configs.use_dynamic_loss_scaling), 0, 0, 0, NULL, false,
     "grow the scale while gradients are finite, shrink it on inf/nan"},
    {"amp_configs.incr_every_n_steps", FL_CFG_INT, OFF(amp_configs.incr_every_n_steps), 0, 1, BIG,
     NULL, false, "finite steps before the scale grows"},
    {"amp_configs.decr_every_n_nan_or_inf", FL_CFG_INT, OFF(amp_configs.decr_every_n_nan_or_inf),
     0, 1, BIG, NULL, false, "inf/nan steps before the scale shrinks"},
    {"amp_configs.incr_ratio", FL_CFG_DOUBLE, OFF(amp_configs.incr_ratio), 0, 1, 1e3, NULL, false,
     "growth factor of the scale"},
    {"amp_configs.decr_ratio", FL_CFG_DOUBLE, OFF(amp_configs.decr_ratio), 0, 1e-6, 1, NULL,
     false, "shrink factor of the scale (never below 1)"},
    {"amp_configs.dtype", FL_CFG_ENUM, OFF(amp_configs.dtype), 0, 0, 0, "float16|bfloat16",
     false, "the reduced precision of the white-listed layers"},
    {"amp_configs.custom_white_list", FL_CFG_STRING, OFF(amp_configs.custom_white_list),
     SIZE(amp_configs.custom_white_list), 0, 0, NULL, false,
     "comma-separated layer types computing in reduced precision besides conv2d and fc, e.g. "
     "batch_norm,add"},
    {"amp_configs.custom_black_list", FL_CFG_STRING, OFF(amp_configs.custom_black_list),
     SIZE(amp_configs.custom_black_list), 0, 0, NULL, false,
     "comma-separated layer types kept in f32, e.g. fc (besides the loss and batch_norm)"},

    {"a_sync", FL_CFG_BOOL, OFF(a_sync), 0, 0, 0, NULL, false,
     "parameter-server mode: false sync, true async (k_steps <= 0) or geo (k_steps > 0)"},
    {"a_sync_configs.k_steps", FL_CFG_INT, OFF(a_sync_configs.k_steps), 0, -1, 1e6, NULL, false,
     "geo: local steps between pushes of the difference; <= 0: async"},
    {"a_sync_configs.max_merge_var_num", FL_CFG_INT, OFF(a_sync_configs.max_merge_var_num), 0,
     1, 1e6, NULL, false, "async: the most queued gradients merged into one push"},
    {"a_sync_configs.geo_background", FL_CFG_BOOL, OFF(a_sync_configs.geo_background), 0, 0, 0,
     NULL, false, "geo, CTR sparse tables: exchanged by a communicator thread, the workers "
     "staggered (false: on the training thread, all at the same step)"},

    {"recompute", FL_CFG_BOOL, OFF(recompute), 0, 0, 0, NULL, false,
     "keep only the checkpoint layers' outputs, recompute the rest in backward"},
    {"recompute_configs.checkpoints", FL_CFG_STRING, OFF(recompute_configs.checkpoints),
     SIZE(recompute_configs.checkpoints), 0, 0, NULL, false,
     "comma-separated names of the layers whose outputs are kept"},
};

#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

void fl_strategy_defaults(fl_strategy *s) {
    FL_ASSERT(s);
    memset(s, 0, sizeof *s);
    s->fuse_grad_size_in_MB = 32;
    s->overlap = true;
    s->nccl_comm_num = 1;
    s->gradient_merge_configs.k_steps = 1;
    s->gradient_merge_configs.avg = true;
    s->dgc_configs.rampup_begin_step = 0;
    s->dgc_configs.rampup_step = 1;
    s->dgc_configs.sparsity.n = 1;
    s->dgc_configs.sparsity.v[0] = 0.999;
    s->dgc_configs.min_compress_numel = 16384;
    s->dgc_configs.sparse_budget = DGC_SPARSE_BUDGET;
    s->dgc_configs.selection = 0;
    s->dgc_configs.dense_fallback = true;
    s->dgc_configs.warmup = true;
    s->dgc_configs.momentum_correction = true;
    s->dgc_configs.local_clipping = true;
    s->dgc_configs.momentum_masking = true;
    s->dgc_configs.weight_decay_correction = true;
    s->localsgd_configs.k_steps = 1;
    s->a_sync_configs.k_steps = -1;
    s->a_sync_configs.max_merge_var_num = 20;
    s->a_sync_configs.geo_background = true;
    s->localsgd_configs.begin_step = 1;
    s->adaptive_localsgd_configs.init_k_steps = 1;
    s->adaptive_localsgd_configs.begin_step = 1;
    s->lars_configs.lars_coeff = 0.001;
    s->lars_configs.lars_weight_decay = 0.0005;
    s->lars_configs.epsilon = 0;
    s->amp_configs.init_loss_scaling = 32768;
    s->amp_configs.use_dynamic_loss_scaling = true;
    s->amp_configs.incr_every_n_steps = 1000;
    s->amp_configs.decr_every_n_nan_or_inf = 2;
    s->amp_configs.incr_ratio = 2.0;
    s->amp_configs.decr_ratio = 0.8;
    s->amp_configs.dtype = FL_AMP_FLOAT16;
}

/* Full paths per prefix, built on first use and kept for the life of the program (the
 * fl_cfg_key arrays handed out point at them). A handful of prefixes is all a program uses. */
#define MAX_PREFIXES 8
#define PATH_CAP 128

static struct {
    char prefix[PATH_CAP / 2];
    char paths[NKEYS][PATH_CAP];
} cache[MAX_PREFIXES];
static int ncached;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static int paths_for(const char *prefix, char (**out)[PATH_CAP]) {
    int rc = FL_OK;
    if (strlen(prefix) >= sizeof cache[0].prefix)
        return fl_fail(FL_EINVAL, "strategy schema: prefix '%s' is longer than %zu characters",
                       prefix, sizeof cache[0].prefix - 1);
    pthread_mutex_lock(&cache_lock);
    int i;
    for (i = 0; i < ncached; i++)
        if (strcmp(cache[i].prefix, prefix) == 0)
            break;
    if (i == ncached) {
        if (ncached == MAX_PREFIXES) {
            rc = fl_fail(FL_EINVAL, "strategy schema: more than %d different prefixes",
                         MAX_PREFIXES);
            goto done;
        }
        snprintf(cache[i].prefix, sizeof cache[i].prefix, "%s", prefix);
        for (int k = 0; k < NKEYS; k++)
            snprintf(cache[i].paths[k], PATH_CAP, "%s%s%s", prefix, prefix[0] ? "." : "",
                     keys[k].path);
        ncached++;
    }
    *out = cache[i].paths;
done:
    pthread_mutex_unlock(&cache_lock);
    return rc;
}

int fl_strategy_schema(const char *prefix, size_t base_offset, fl_cfg_key *out, int cap) {
    if (cap <= 0)
        return NKEYS;
    FL_ASSERT(out);
    char (*paths)[PATH_CAP] = NULL;
    FL_TRY(paths_for(prefix ? prefix : "", &paths));
    for (int i = 0; i < NKEYS && i < cap; i++) {
        out[i] = keys[i];
        out[i].path = paths[i];
        out[i].offset += base_offset;
    }
    return NKEYS;
}

int fl_strategy_check(const fl_strategy *s, const bool *was_set, fl_optim_type optimizer) {
    FL_ASSERT(s);
    /* values out of range (a config file cannot produce these; a struct filled in code can) */
    if (!isfinite(s->fuse_grad_size_in_MB) || s->fuse_grad_size_in_MB < 0)
        return fl_fail(FL_ECONFIG, "strategy.fuse_grad_size_in_MB: %g must be a finite number >= 0",
                       s->fuse_grad_size_in_MB);
    if (s->gradient_merge_configs.k_steps < 1)
        return fl_fail(FL_ECONFIG, "strategy.gradient_merge_configs.k_steps: %lld must be >= 1",
                       (long long)s->gradient_merge_configs.k_steps);

    /* combinations that cannot work: said first, since they hold whatever lands later */
    if (s->dgc && optimizer != FL_OPTIM_MOMENTUM)
        return fl_fail(FL_ECONFIG, "strategy.dgc needs optimizer.type momentum (Deep Gradient "
                                   "Compression corrects momentum)");
    if (s->dgc && s->localsgd)
        return fl_fail(FL_ECONFIG, "strategy.dgc cannot be combined with strategy.localsgd (DGC "
                                   "compresses every step's gradients, Local SGD averages "
                                   "parameters every k steps): choose one");
    if (s->dgc && s->adaptive_localsgd)
        return fl_fail(FL_ECONFIG, "strategy.dgc cannot be combined with "
                                   "strategy.adaptive_localsgd (DGC compresses every step's "
                                   "gradients, Local SGD averages parameters): choose one");
    if (s->localsgd && s->adaptive_localsgd)
        return fl_fail(FL_ECONFIG, "strategy.localsgd cannot be combined with "
                                   "strategy.adaptive_localsgd: choose a fixed or an adaptive "
                                   "interval");
    if (s->fp16_allreduce && (s->localsgd || s->adaptive_localsgd))
        return fl_fail(FL_ECONFIG, "strategy.fp16_allreduce cannot be combined with "
                                   "strategy.%s (fp16_allreduce sends gradients as f16; Local "
                                   "SGD sends no gradients, it averages parameters in their "
                                   "own precision)",
                       s->localsgd ? "localsgd" : "adaptive_localsgd");
    if (s->dgc && s->fp16_allreduce)
        return fl_fail(FL_ECONFIG, "strategy.dgc cannot be combined with "
                                   "strategy.fp16_allreduce (DGC sends f32 values of the selected "
                                   "entries and keeps its dense steps exact): choose one");
    if (s->dgc && s->lars)
        return fl_fail(FL_ECONFIG, "strategy.dgc cannot be combined with strategy.lars (DGC "
                                   "applies its own SGD step to the compressed tensors, where "
                                   "LARS's per-layer learning rates would be ignored): choose "
                                   "one");
    if (s->dgc && s->dgc_configs.sparsity.n < 1)
        return fl_fail(FL_ECONFIG, "strategy.dgc_configs.sparsity: the list is empty (give at "
                                   "least one sparsity, e.g. [0.999])");
    if (s->dgc && s->dgc_configs.rampup_step < 1)
        return fl_fail(FL_ECONFIG, "strategy.dgc_configs.rampup_step: %lld must be >= 1",
                       (long long)s->dgc_configs.rampup_step);
    /* FL_OPTIM_LARS: the Momentum optimizer already turned into LARS momentum (optim.h) */
    if (s->lars && optimizer != FL_OPTIM_MOMENTUM && optimizer != FL_OPTIM_LARS)
        return fl_fail(FL_ECONFIG, "strategy.lars needs optimizer.type momentum (LARS scales "
                                   "the learning rate of Momentum per layer)");

    (void)was_set; /* every feature has landed: nothing is refused for being configured */
    return fl_amp_check_config(s);
}

void fl_strategy_optim_config(const fl_strategy *s, fl_optim_config *oc) {
    FL_ASSERT(s && oc);
    if (!s->lars || oc->type != FL_OPTIM_MOMENTUM)
        return;
    oc->type = FL_OPTIM_LARS;
    oc->lars_coeff = s->lars_configs.lars_coeff;
    oc->lars_weight_decay = s->lars_configs.lars_weight_decay;
    oc->epsilon = s->lars_configs.epsilon;
    snprintf(oc->exclude_from_weight_decay, sizeof oc->exclude_from_weight_decay, "%s",
             s->lars_configs.exclude_from_weight_decay);
}
