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

/* Paddle's defaults: fuse 32 MiB, overlap on, gradient_merge k_steps 1 and avg; dgc rampup
 * 0 / 1 / [0.999]; localsgd 1 / 1; adaptive_localsgd 1 / 1; lars 0.001 / 0.0005 / 0; amp
 * 32768 / dynamic / 1000 / 2 / 2.0 / 0.8; every switch off. */
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
 *   not finite, gradient_merge_configs.k_steps < 1): FL_ECONFIG;
 * - combinations that cannot work, whatever lands later (dgc with a non-momentum optimizer,
 *   dgc with localsgd or adaptive_localsgd, localsgd with adaptive_localsgd, lars with a
 *   non-momentum optimizer): FL_ECONFIG, e.g. "strategy.dgc needs optimizer.type momentum
 *   (Deep Gradient Compression corrects momentum)";
 * - a feature switched on that is not implemented yet (dgc, localsgd, adaptive_localsgd, lars,
 *   amp, recompute): FL_EUNSUPPORTED, "strategy.dgc: not implemented yet in this version of
 *   fleet";
 * - any key of such a feature's configs that was set, even to its default: FL_EUNSUPPORTED,
 *   "strategy.dgc_configs.sparsity: set, but strategy.dgc is not implemented yet in this
 *   version of fleet". was_set (may be NULL: this check is skipped) is indexed like the keys
 *   fl_strategy_schema writes, e.g. the was_set of fl_config_load plus the position of the
 *   strategy keys in the caller's schema.
 * The messages always say "strategy.", whatever prefix the schema was built with. */
int fl_strategy_check(const fl_strategy *s, const bool *was_set, fl_optim_type optimizer);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_STRATEGY_H */
