/* amp.h - mixed precision's loss scaling (docs/amp.md), as the distributed optimizer runs it:
 * Paddle's update_loss_scaling rule over a state that checkpoints keep, the white list the
 * network's emulation takes, and the checks of amp_configs. Private to src/strategy (the unit
 * tests include it). */
#ifndef FLEET_STRATEGY_AMP_H
#define FLEET_STRATEGY_AMP_H

#include "fleet/strategy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The state, "amp.state" in checkpoints: f64 values holding the f32 loss scale and counters
 * exactly. GOOD and BAD are Paddle's num_good_steps and num_bad_steps; SKIPPED counts the steps
 * skipped since the run began. */
enum { FL_AMP_SCALE = 0, FL_AMP_GOOD, FL_AMP_BAD, FL_AMP_SKIPPED, FL_AMP_NSTATE };

/* amp_configs' scaling rule, the ratios and the scale in f32 as Paddle's op has them. */
typedef struct {
    float   init_loss_scaling;
    bool    dynamic;                 /* use_dynamic_loss_scaling */
    int64_t incr_every_n_steps;
    int64_t decr_every_n_nan_or_inf;
    float   incr_ratio, decr_ratio;
} fl_amp_rule;

void fl_amp_rule_from(const fl_strategy *s, fl_amp_rule *r);
/* st = {init_loss_scaling, 0, 0, 0}. */
void fl_amp_state_init(const fl_amp_rule *r, double st[FL_AMP_NSTATE]);
/* After a step whose gradients were (found_inf) or were not all finite on every worker.
 * Dynamic (Paddle's update_loss_scaling, operators/amp/update_loss_scaling_op.h): an inf step
 * sets good = 0 and bad += 1, and when bad reaches decr_every_n_nan_or_inf, scale *=
 * decr_ratio (at least 1) and bad = 0; a finite step sets bad = 0 and good += 1, and when good
 * reaches incr_every_n_steps, scale *= incr_ratio (unless that is not finite: then it stays)
 * and good = 0. Static (dynamic false): the scale and counters stay. SKIPPED counts inf steps
 * in both modes (every one is skipped). The products are rounded to f32. */
void fl_amp_update(const fl_amp_rule *r, bool found_inf, double st[FL_AMP_NSTATE]);

/* The layer types computing in reduced precision: conv2d and fc, plus custom_white_list, less
 * custom_black_list, comma-separated into buf (cap bytes; FL_EINVAL if it does not fit). */
int fl_amp_white_types(const fl_strategy *s, char *buf, size_t cap);
/* The checks of amp_configs for fl_strategy_check (its contract says which). */
int fl_amp_check_config(const fl_strategy *s);

/* The test hook FLEET_AMP_INJECT_INF=STEP[,RANK] (docs/amp.md): update STEP (counted from 1,
 * as the progress lines count steps) gets an inf in one gradient on rank RANK (every rank when
 * RANK is left out). env NULL or "": *step = 0 (none). FL_EINVAL naming the variable when it
 * does not parse. */
int fl_amp_inject_parse(const char *env, int64_t *step, int *rank);

#endif /* FLEET_STRATEGY_AMP_H */
