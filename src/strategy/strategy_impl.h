/* strategy_impl.h - the inside of a distributed optimizer, and the table of function pointers
 * behind which each strategy plugs in (dense, dgc, localsgd), as comm backends and layers do.
 * dist_optim.c owns the step's frame (gradient merge, backward with the hook, counters); a
 * strategy owns what follows backward: from each worker's local gradients to updated
 * parameters (averaging and the optimizer step, or a local step and a parameter average). */
#ifndef FLEET_STRATEGY_IMPL_H
#define FLEET_STRATEGY_IMPL_H

#include "amp.h"
#include "fleet/fleet.h"

#include <stdbool.h>
#include <stdint.h>

struct strategy_ops {
    const char *name;
    /* Plans every buffer the strategy needs (d->impl), once, at creation. */
    int (*setup)(fl_dist_optim *d);
    /* fl_grad_ready_fn (ctx is the fl_dist_optim), or NULL for none: called during the
     * backward of an update's last micro-batch, when strategy.overlap is on, as each trainable
     * parameter's gradient becomes final. Errors are kept and reported by update. d->step is
     * the 0-based index of the update being computed. */
    void (*grad_ready)(void *ctx, fl_param *p);
    /* Whether grad_ready only starts sending, so that abandon leaves no trace of it: under
     * strategy.amp, where a step may be skipped after backward, only such a hook runs during
     * backward (dense's); a hook that changes the strategy's state (DGC's residuals) is left
     * out and update does its work instead, as with overlap off. */
    bool grad_ready_undoable;
    /* After a successful backward of an update's last micro-batch (the flat gradient block
     * holds this worker's gradients, merged over d->k_steps micro-batches, not yet multiplied
     * by d->grad_scale, which under strategy.amp unscales them too): everything up to updated parameters with learning rate lr, e.g.
     * average the gradients (times grad_scale) and call fl_optim_step. d->step is the 0-based
     * index of this update and d->loss the local loss set for it (NaN if none). Leaves nothing
     * outstanding. dist_optim.c increments d->step afterwards, also on failure. */
    int (*update)(fl_dist_optim *d, double lr);
    /* After a failed backward: waits for whatever grad_ready started; leaves nothing
     * outstanding. */
    void (*abandon)(fl_dist_optim *d);
    /* Frees d->impl. */
    void (*destroy)(fl_dist_optim *d);
    /* The strategy's state for checkpoints (may be NULL: none): tensors named
     * "<strategy>.<what>[.<param name>]", borrowed, living in d->impl. They are the live state,
     * counters included (kept as i64/f64 tensors, not copies), so that writing their values
     * restores the strategy exactly. */
    int (*num_state)(const fl_dist_optim *d);
    fl_param *(*state)(fl_dist_optim *d, int i);
    /* Optional: how state i combines over workers when the number of workers changes
     * (fl_state_merge); NULL: SAME for integer tensors, MEAN for floating-point ones. */
    fl_state_merge (*merge)(const fl_dist_optim *d, int i);
    /* Optional: after the last update, brings this worker's replica to the job's final state
     * (the parameter-server strategy: flush what is queued, take the servers' values). A
     * collective call on every worker (fl_dist_finish). NULL: nothing to do. */
    int (*finish)(fl_dist_optim *d);
    /* Optional: fills the strategy's own fields of fl_dist_stats (interval, sparsity), which
     * fl_dist_get_stats has set to "not this strategy" (0, NaN) before. */
    void (*stats)(const fl_dist_optim *d, fl_dist_stats *out);
};

struct fl_dist_optim {
    fl_fleet                  *fleet; /* borrowed */
    fl_comm                   *comm;  /* borrowed from fleet */
    fl_net                    *net;   /* borrowed */
    fl_optim                  *opt;   /* borrowed */
    fl_strategy                s;     /* copied */
    const struct strategy_ops *ops;
    void                      *impl;  /* the strategy's state */
    int                        rank, world;
    /* use_hierarchical_allreduce: views of comm (fl_comm_split_nodes), NULL otherwise */
    fl_comm                   *node, *cross;
    int64_t                    k_steps;    /* micro-batches per update: gradient merge's k, or 1 */
    double                     grad_scale; /* what the strategy multiplies the local gradients
                                            * by: 1/k under gradient merge with avg (else 1),
                                            * divided by the loss scale under strategy.amp */
    double                     merge_scale; /* the gradient-merge part of grad_scale */
    uint64_t                   bytes_base; /* fl_comm_stats.bytes_sent once created */
    uint64_t                   ps_bytes_base; /* fl_ps_stats.bytes_sent once created */
    double                     loss;       /* local loss of the current update, NaN if unset */
    int64_t                    synced;     /* updates that sent bytes (fl_dist_stats) */
    /* "dist.counters", i64 (2): [0] updates done (the 0-based index of the next one), [1]
     * micro-batches done in the current update. The live counters, checkpointed as they are. */
    fl_param                   counters;
    int64_t                    counter_mem[2];
    /* strategy.amp (amp.h): "amp.state", f64 (FL_AMP_NSTATE), the live loss scale and
     * counters; the rule; this update's found-inf flag (this rank's, until combined) and the
     * strategy hook the AMP hook passes on to (NULL: none during backward); the test hook */
    bool                       amp;
    fl_amp_rule                amp_rule;
    fl_param                   amp_state;
    double                     amp_mem[FL_AMP_NSTATE];
    bool                       amp_found;
    fl_grad_ready_fn           amp_next;
    int64_t                    inject_step; /* FLEET_AMP_INJECT_INF (0: none) */
    int                        inject_rank; /* -1: every rank */
    bool                       inject_now;  /* the next gradient-ready call injects */
    uint64_t                   amp_flag_bytes; /* what one flag's allreduce sends */
};

/* The live counters, by name. */
#define DIST_STEP(d) ((d)->counter_mem[0])
#define DIST_MICRO(d) ((d)->counter_mem[1])

/* dense.c: average with allreduce, fused into buckets, started during backward. */
extern const struct strategy_ops fl_dense_ops;
/* localsgd.c: local steps, parameters averaged every k steps (fixed or adaptive). */
extern const struct strategy_ops fl_localsgd_ops;
/* dgc.c (with dgc_plan.c): Deep Gradient Compression, sparse (index, value) pairs, one allgather
 * per tensor. */
extern const struct strategy_ops fl_dgc_ops;

/* ps.c: parameter-server mode (sync, async, geo) over the fleet's fl_ps (docs/ps.md). */
extern const struct strategy_ops fl_ps_ops;

/* The dense strategy's averaging, for strategies that fall back to it (DGC before its warm-up
 * ends): a dense state planned over d's network as fl_dense_ops.setup does (buckets, f16
 * staging), its gradient-ready step (call it from the strategy's own grad_ready), completion of
 * the average (times d->grad_scale) in the flat gradient block without the optimizer step, and
 * the wait after a failed backward. */
typedef struct dense_state dense_state;
int  fl_dense_state_create(fl_dist_optim *d, dense_state **out);
void fl_dense_state_free(dense_state *ds);
void fl_dense_state_grad_ready(fl_dist_optim *d, dense_state *ds, fl_param *p);
int  fl_dense_state_finish(fl_dist_optim *d, dense_state *ds);
void fl_dense_state_abandon(fl_dist_optim *d, dense_state *ds);

#endif /* FLEET_STRATEGY_IMPL_H */
