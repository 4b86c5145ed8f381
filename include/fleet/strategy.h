/* strategy.h - the distributed strategy (Paddle's DistributedStrategy): which way the workers
 * keep their replicas in step, with the key names of the seed documents and DESIGN.md.
 *
 * Every key of DESIGN.md's strategy table exists here, and every feature has landed;
 * fl_strategy_check refuses combinations that cannot work, never ignores them.
 * Read from the `strategy:` section of a config through fl_strategy_schema. */
#ifndef FLEET_STRATEGY_H
#define FLEET_STRATEGY_H

#include "fleet/config.h"
#include "fleet/optim.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* amp_configs.dtype: the reduced precision white-listed layers compute in */
enum { FL_AMP_FLOAT16 = 0, FL_AMP_BFLOAT16 = 1 };

/* adaptive_localsgd_configs.rule: where init_k_steps enters the interval rule */
enum { FL_LOCALSGD_RULE_PADDLE = 0, FL_LOCALSGD_RULE_ADACOMM = 1 };

typedef struct fl_strategy {
    /* dense: average gradients with allreduce, fused into buckets */
    double fuse_grad_size_in_MB; /* bucket capacity in MiB (default 32); 0: one per parameter */
    bool   overlap;              /* start a bucket's allreduce (DGC: a tensor's pairs) during
                                    backward (default true) */
    bool   fp16_allreduce;       /* send dense gradients as f16, pre-divided by N */
    /* Paddle's use_hierarchical_allreduce (docs/comm.md "Hierarchical allreduce"): every
     * allreduce runs inside the node, then between nodes, then inside the node again
     * (fl_comm_set_hierarchical); with dgc the compression also works per node (docs/dgc.md
     * "Hierarchical DGC"). inter_nranks: ranks per node (0: the launcher's LOCAL_WORLD_SIZE). */
    bool    use_hierarchical_allreduce;
    int64_t hierarchical_allreduce_inter_nranks;
    /* comm.backend nccl: NCCL communicators, each on its own stream, that large allreduces are
     * split over (Paddle's nccl_comm_num; docs/nccl.md; default 1) */
    int64_t nccl_comm_num;
    bool   gradient_merge;       /* accumulate k micro-batches before communicating */
    struct {
        int64_t k_steps;         /* default 1 */
        bool    avg;             /* divide the merged gradient by k (default true) */
    } gradient_merge_configs;

    /* Deep Gradient Compression (docs/dgc.md; Lin et al. 2018, arXiv:1712.01887): Momentum
     * only; dense allreduce before rampup_begin_step, then each tensor of at least
     * min_compress_numel elements sends its top (1 - sparsity) entries of the momentum-corrected
     * accumulator as (index, value) pairs (one allgather per tensor, or one sparse allreduce of
     * them all: dgc_configs.exchange); smaller tensors stay dense. The five technique
     * switches exist for ablation (all on by default). Not with fp16_allreduce or lars. */
    bool dgc;
    struct {
        int64_t            rampup_begin_step;  /* dense steps first (default 0) */
        int64_t            rampup_step;        /* steps of the sparsity warm-up (default 1) */
        fl_cfg_double_list sparsity;           /* warm-up schedule (default [0.999]) */
        int64_t            min_compress_numel; /* smaller tensors stay dense (default 16384) */
        int                selection;          /* top-k: 0 sampled threshold, 1 exact */
        int                exchange;           /* pairs: 0 auto, 1 allgather, 2 sparse
                                                  allreduce (docs/dgc.md) */
        int64_t            sparse_budget;      /* the sparse allreduce keeps at most this
                                                  many times k summed pairs (default 4) */
        bool               dense_fallback;     /* dense allreduce when the pairs would send
                                                  half a dense allreduce or more (true) */
        bool               warmup;             /* false: sparsity[last] from the begin step */
        bool               momentum_correction;     /* false: accumulate gradients (eq. 6) */
        bool               local_clipping;          /* false: no clipping while compressing */
        bool               momentum_masking;        /* false: u keeps the sent entries */
        bool               weight_decay_correction; /* false: decay applied after aggregation */
    } dgc_configs;

    /* Local SGD (docs/localsgd.md): each worker steps its own replica and sends nothing; the
     * replicas are averaged at steps 1 .. begin_step (steps count from 1), then every k_steps
     * steps. SGD and Momentum (velocities stay local); gradient_merge works within a local
     * step; overlap and fuse_grad_size_in_MB do not apply (one allreduce of the parameters). */
    bool localsgd;
    struct {
        int64_t k_steps;    /* local steps between averages (default 1: dense SGD) */
        int64_t begin_step; /* averaged every step up to and including this one (default 1) */
    } localsgd_configs;
    /* Adaptive communication: after each average past begin_step the interval becomes
     * ceil(sqrt(lr0 * loss / (lr * loss0) * init_k_steps)) (rule "paddle") or
     * ceil(sqrt(lr0 * loss / (lr * loss0)) * init_k_steps) (rule "adacomm", Wang & Joshi's
     * form), in [1, 16]: loss averaged over the workers at that step, loss0 at step 1, lr0 the
     * largest rate so far. Needs fl_dist_set_loss every update. */
    bool adaptive_localsgd;
    struct {
        int64_t init_k_steps; /* the interval until the first adaptive choice (default 1) */
        int64_t begin_step;   /* averaged every step up to and including this one (default 1) */
        int     rule;         /* FL_LOCALSGD_RULE_PADDLE (default) or FL_LOCALSGD_RULE_ADACOMM */
    } adaptive_localsgd_configs;

    /* LARS (You et al. 2017, arXiv:1708.03888; Paddle's LarsMomentumOptimizer): the Momentum
     * optimizer becomes LARS momentum with these settings (fl_strategy_optim_config), so each
     * parameter tensor gets its own learning rate from the ratio of its weight and gradient
     * norms. Momentum only. */
    bool lars;
    struct {
        double lars_coeff;
        double lars_weight_decay;
        double epsilon;
        char   exclude_from_weight_decay[256]; /* comma-separated name fragments */
    } lars_configs;

    /* Mixed precision (docs/amp.md; Paddle's amp_configs): the white-listed layer types compute
     * in f16 or bf16 (emulated on the CPU: fl_net_set_amp), master weights and optimizer state
     * stay f32; the loss gradient is multiplied by the loss scale, the gradients are unscaled
     * in f32 before the strategy sees them, and a step whose gradients hold an inf or NaN on
     * any worker is skipped on every worker, the scale following Paddle's
     * update_loss_scaling (src/strategy/amp.h). */
    bool amp;
    struct {
        double  init_loss_scaling;        /* default 32768 */
        bool    use_dynamic_loss_scaling; /* default true; false: the scale stays */
        int64_t incr_every_n_steps;       /* finite steps in a row before scale *= incr_ratio */
        int64_t decr_every_n_nan_or_inf;  /* inf/NaN steps before scale *= decr_ratio (>= 1) */
        double  incr_ratio;               /* default 2 */
        double  decr_ratio;               /* default 0.8 */
        int     dtype;                    /* FL_AMP_FLOAT16 (default) or FL_AMP_BFLOAT16 */
        char    custom_white_list[256];   /* layer types added to the white list (conv2d, fc) */
        char    custom_black_list[256];   /* layer types computing in f32 whatever the lists */
    } amp_configs;

    /* Parameter-server mode (docs/ps.md; Paddle's a_sync and a_sync_configs), when the job was
     * started with servers (fleetrun --server_num; fl_fleet_set_ps): a_sync false is sync
     * (gradients merged on the servers once per step, the same computation as dense); a_sync
     * true with k_steps <= 0 is async (pushes applied as they arrive, no waiting); with
     * k_steps > 0 geo (local steps, the difference pushed every k_steps: GEO-SGD). Without
     * servers a_sync is refused. */
    bool a_sync;
    struct {
        int64_t k_steps;            /* default -1 (Paddle's): async; > 0: geo */
        int64_t max_merge_var_num;  /* async: the most queued gradients merged into one push
                                       (Paddle's; default 20) */
        bool    geo_background;     /* geo, the CTR trainer's sparse tables: exchanged by a
                                       communicator thread, the workers' exchange steps
                                       staggered (default true); false: on the training
                                       thread, every worker at the same step */
    } a_sync_configs;
    /* recompute (fl_net_set_recompute): keep the outputs of the checkpoint layers only */
    bool recompute;
    struct {
        char checkpoints[512]; /* comma-separated layer names, or "auto" */
    } recompute_configs;
} fl_strategy;

/* Paddle's defaults: fuse 32 MiB, overlap on, gradient_merge k_steps 1 and avg; dgc rampup
 * 0 / 1 / [0.999], min_compress_numel 16384, sampled selection, fallback and the five
 * techniques on; localsgd 1 / 1; adaptive_localsgd 1 / 1; lars 0.001 / 0.0005 / 0; amp
 * 32768 / dynamic / 1000 / 2 / 2.0 / 0.8 / float16, no custom lists; every switch off. */
void fl_strategy_defaults(fl_strategy *s);

/* The schema of the strategy section, for embedding in a larger config: keys are
 * "<prefix>.<key>" (prefix "strategy"; "" or NULL: bare keys), one per field above, with type,
 * range and help line, and offsets shifted by base_offset (where the fl_strategy sits inside the
 * caller's struct). Writes up to cap keys into out and returns the number of keys (call with
 * cap 0 to size the array), or FL_EINVAL for a prefix of 64 characters or more or a ninth
 * distinct prefix. The path strings live as long as the program (they are built once and
 * cached per prefix; thread-safe). */
int fl_strategy_schema(const char *prefix, size_t base_offset, fl_cfg_key *out, int cap);

/* Refuses what cannot run, in this order, with a message that names the key and says why:
 * - values out of range that a struct filled in code can hold (fuse_grad_size_in_MB negative or
 *   not finite, gradient_merge_configs.k_steps < 1, amp_configs' numbers): FL_ECONFIG;
 * - combinations that cannot work (dgc with a non-momentum optimizer, dgc with localsgd or
 *   adaptive_localsgd, localsgd with adaptive_localsgd, fp16_allreduce with localsgd or
 *   adaptive_localsgd, dgc with fp16_allreduce or lars, lars with a non-momentum optimizer),
 *   and dgc with an empty sparsity list: FL_ECONFIG, e.g. "strategy.dgc needs optimizer.type
 *   momentum (Deep Gradient Compression corrects momentum)";
 * - amp_configs.custom_white_list / custom_black_list naming something that is not a layer
 *   type (fl_layer_type_known; the black list also takes the loss, softmax_with_cross_entropy),
 *   or the same type in both: FL_ECONFIG, "strategy.amp_configs.custom_white_list: 'conv' is
 *   not a layer type (fc, conv2d, ...)". Checked whether amp is on or not (a typo is said).
 * was_set is no longer read (it may be NULL); it stays for the callers that pass it.
 * The messages always say "strategy.", whatever prefix the schema was built with. */
int fl_strategy_check(const fl_strategy *s, const bool *was_set, fl_optim_type optimizer);

/* What the strategy asks of the optimizer, as Paddle's fleet.distributed_optimizer swaps the
 * user's optimizer: with strategy.lars, a Momentum config becomes FL_OPTIM_LARS with
 * lars_configs' coefficient, weight decay, epsilon and exclusions (its momentum, L2
 * weight_decay and clip_norm kept). Anything else is left as it is. Create the optimizer from
 * the result; fl_distributed_optimizer refuses strategy.lars with an optimizer that is not
 * LARS. */
void fl_strategy_optim_config(const fl_strategy *s, fl_optim_config *oc);

struct fl_net;
/* strategy.amp's precisions for a network (docs/amp.md): with s->amp, the white layer types
 * (conv2d and fc, plus custom_white_list, less custom_black_list) in amp_configs.dtype,
 * natively where the network's backend table runs low dtypes (fl_net_set_amp_native, then
 * fl_net_set_amp), else emulated. Called before fl_net_build it is a request the build carries
 * out, so that the activations and convolution plans are made once, in their final dtypes
 * (after the build the f32 ones are made first and then made again); fl_distributed_optimizer
 * calls it again, which then changes nothing. Without s->amp it does nothing. 0, or as
 * fl_net_set_amp (prefixed "strategy.amp"). */
int fl_strategy_plan_amp(const fl_strategy *s, struct fl_net *net);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_STRATEGY_H */
