/* strategy.h - the distributed strategy (Paddle's DistributedStrategy): which way the workers
 * keep their replicas in step, with the key names of the seed documents and DESIGN.md.
 *
 * Every key of DESIGN.md's strategy table exists here. Keys whose feature has not landed yet
 * are refused by fl_strategy_check with "not implemented yet" when set, never ignored.
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

typedef struct fl_strategy {
    /* dense: average gradients with allreduce, fused into buckets */
    double fuse_grad_size_in_MB; /* bucket capacity in MiB (default 32); 0: one per parameter */
    bool   overlap;              /* start a bucket's allreduce during backward (default true) */
    bool   fp16_allreduce;       /* send dense gradients as f16, pre-divided by N */
    bool   gradient_merge;       /* accumulate k micro-batches before communicating */
    struct {
        int64_t k_steps;         /* default 1 */
        bool    avg;             /* divide the merged gradient by k (default true) */
    } gradient_merge_configs;

    /* Deep Gradient Compression (not implemented yet) */
    bool dgc;
    struct {
        int64_t            rampup_begin_step;
        int64_t            rampup_step;
        fl_cfg_double_list sparsity;
    } dgc_configs;

    /* Local SGD (not implemented yet) */
    bool localsgd;
    struct {
        int64_t k_steps;
        int64_t begin_step;
    } localsgd_configs;
    bool adaptive_localsgd;
    struct {
        int64_t init_k_steps;
        int64_t begin_step;
    } adaptive_localsgd_configs;

    /* LARS (not implemented yet) */
    bool lars;
    struct {
        double lars_coeff;
        double lars_weight_decay;
        double epsilon;
        char   exclude_from_weight_decay[256]; /* comma-separated name fragments */
    } lars_configs;

    /* mixed precision with dynamic loss scaling (not implemented yet) */
    bool amp;
    struct {
        double  init_loss_scaling;
        bool    use_dynamic_loss_scaling;
        int64_t incr_every_n_steps;
        int64_t decr_every_n_nan_or_inf;
        double  incr_ratio;
        double  decr_ratio;
    } amp_configs;

    /* recompute (not implemented yet) */
    bool recompute;
    struct {
        char checkpoints[512]; /* comma-separated layer names */
    } recompute_configs;
} fl_strategy;

/* Paddle's defaults. */
void fl_strategy_defaults(fl_strategy *s);

/* The schema of the strategy section, for embedding in a larger config: keys are
 * "<prefix>.<key>" (prefix "strategy") with offsets shifted by base_offset (where the
 * fl_strategy sits inside the caller's struct). Writes up to cap keys into out and returns the
 * number of keys (call with cap 0 to size the array). The path strings live as long as the
 * program (they are built once and cached per prefix: call with the same prefix). */
int fl_strategy_schema(const char *prefix, size_t base_offset, fl_cfg_key *out, int cap);

/* Refuses, with a message that says why and names the key: a feature that is set but not
 * implemented yet ("strategy.dgc: not implemented yet"); any key of a not-implemented feature's
 * configs that was set (was_set: per key of fl_strategy_schema, may be NULL); values out of
 * range (k_steps < 1); combinations that cannot work (dgc with a non-momentum optimizer, dgc
 * with localsgd, localsgd with adaptive_localsgd). */
int fl_strategy_check(const fl_strategy *s, const bool *was_set, fl_optim_type optimizer);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_STRATEGY_H */
