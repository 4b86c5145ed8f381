/* strategy_impl.h - the inside of a distributed optimizer, and the table of function pointers
 * behind which each strategy plugs in (dense now; dgc and localsgd later), as comm backends and
 * layers do. dist_optim.c owns the step (gradient merge, backward, optimizer); a strategy only
 * turns each worker's local gradient into the averaged one. */
#ifndef FLEET_STRATEGY_IMPL_H
#define FLEET_STRATEGY_IMPL_H

#include "fleet/fleet.h"

#include <stdbool.h>
#include <stdint.h>

struct strategy_ops {
    const char *name;
    /* Plans every buffer the strategy needs (d->impl), once, at creation. */
    int (*setup)(fl_dist_optim *d);
    /* fl_grad_ready_fn (ctx is the fl_dist_optim): called during a communicating backward, when
     * strategy.overlap is on, as each trainable parameter's gradient becomes final. Errors are
     * kept and reported by finish. */
    void (*grad_ready)(void *ctx, fl_param *p);
    /* After a successful communicating backward: completes the average over all workers in the
     * flat gradient block, multiplied by d->grad_scale. Leaves nothing outstanding. */
    int (*finish)(fl_dist_optim *d);
    /* After a failed backward: waits for whatever grad_ready started; leaves nothing
     * outstanding. */
    void (*abandon)(fl_dist_optim *d);
    /* Frees d->impl. */
    void (*destroy)(fl_dist_optim *d);
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
    int64_t                    k_steps;    /* micro-batches per update: gradient merge's k, or 1 */
    int64_t                    micro;      /* micro-batches done in the current update */
    double                     grad_scale; /* 1/k under gradient merge with avg, else 1 */
    uint64_t                   bytes_base; /* fl_comm_stats.bytes_sent once created */
};

/* dense.c: average with allreduce, fused into buckets, started during backward. */
extern const struct strategy_ops fl_dense_ops;

#endif /* FLEET_STRATEGY_IMPL_H */
