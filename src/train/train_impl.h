/* train_impl.h - what the trainer's files share: the trainer's state, built once by
 * train_setup.c, and the evaluation and logging steps the loop in trainer.c calls.
 * Private to src/train/. */
#ifndef FLEET_TRAIN_IMPL_H
#define FLEET_TRAIN_IMPL_H

#include "fleet/fleet.h"
#include "fleet/train.h"

#include <stdint.h>

typedef struct {
    fl_fleet      *fleet;
    int            rank, world;
    fl_dataset    *train_set, *val_set;
    fl_loader     *loader;    /* this rank's shard of each global batch */
    fl_net        *net;
    fl_optim      *opt;
    fl_dist_optim *dopt;      /* wraps opt; replaces backward + step */
    fl_tensor     *probs;     /* (B, C) softmax of the last forward; reused as dlogits */
    fl_metrics    *metrics;   /* rank 0 only; NULL elsewhere or without train.log_dir */
    fl_lr_schedule sched;     /* indexed by optimizer update */
    int64_t        merge_k;   /* micro-batches (loader batches) per optimizer update */
    int64_t        total_steps; /* optimizer updates the run will take */
} trainer;

/* What happened since the previous progress line, on this rank. */
typedef struct {
    double   loss_sum;   /* sum over samples of the training loss */
    int64_t  correct;
    int64_t  samples;
    double   start;      /* fl_now() at the previous line */
    uint64_t bytes_sent; /* fl_dist_bytes_sent at the previous line */
} train_window;

/* Builds everything (fleet first) from cfg; on failure what was built is left for
 * fl_train_teardown. */
int  fl_train_setup(trainer *t, const fl_train_config *cfg);
void fl_train_teardown(trainer *t);

/* Evaluates the model over the whole training and validation sets, sharded over the ranks with
 * the sums all-reduced (every rank gets the same numbers), fills res's train_/val_ fields,
 * prints the eval line and writes its metrics record. Collective: every rank calls it. */
int fl_train_eval(trainer *t, const fl_train_config *cfg, int64_t epoch, int64_t step,
                  fl_train_result *res);

/* Starts a window at the current time and byte count. */
void fl_train_window_reset(trainer *t, train_window *w);
/* Averages the window over the ranks (one allreduce of three numbers), prints the progress
 * line, writes its metrics record, sets res->last_loss and starts the next window.
 * Collective: every rank calls it at the same step. */
int fl_train_log_progress(trainer *t, train_window *w, int64_t epoch, int64_t step, double lr,
                          fl_train_result *res);

#endif /* FLEET_TRAIN_IMPL_H */
