/* optim.h - optimizers (SGD, Momentum with Nesterov, LARS momentum), L2 weight decay, gradient
 * clipping by global norm, and learning-rate schedules.
 *
 * Order of one step, as Paddle and PyTorch apply it: clip gradients by their global norm
 * (optional), add L2 decay (g + wd * w), then the update rule:
 *     SGD:      w -= lr * g
 *     Momentum: v = mu * v + g;  w -= lr * v              (Nesterov: w -= lr * (g + mu * v))
 *     LARS:     per parameter tensor, with d = lars_weight_decay (0 for excluded names),
 *               local_lr = lr * lars_coeff * ||w|| / (||g|| + d * ||w|| + epsilon)
 *                          if d > 0, ||w|| > 0 and ||g|| > 0, else lr;
 *               v = mu * v + local_lr * (g + d * w);  w -= v
 *     (You et al. 2017, arXiv:1708.03888, as Paddle's lars_momentum kernel computes it, Paddle
 *     2.x phi/kernels/cpu/lars_momentum_kernel.cc: note lr sits inside v, and a parameter with
 *     d = 0 takes a plain momentum step v = mu * v + lr * g. Paddle 1.x scaled local_lr also
 *     when d = 0.) g there already holds the L2 term weight_decay * w when weight_decay > 0.
 * Optimizers work on fl_param arrays (names, values, gradients), never on networks. */
#ifndef FLEET_OPTIM_H
#define FLEET_OPTIM_H

#include "fleet/backend.h"
#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FL_OPTIM_SGD = 0, FL_OPTIM_MOMENTUM = 1, FL_OPTIM_LARS = 2 } fl_optim_type;

typedef struct {
    fl_optim_type type;
    double momentum;     /* mu, Momentum only, in [0, 1) */
    bool   nesterov;     /* Momentum only */
    double weight_decay; /* L2 coefficient lambda >= 0 */
    double clip_norm;    /* clip gradients to this global L2 norm; <= 0: off */
    /* LARS only (Paddle's LarsMomentumOptimizer; defaults there 0.001, 0.0005, 0) */
    double lars_coeff;        /* > 0 */
    double lars_weight_decay; /* >= 0 */
    double epsilon;           /* >= 0 */
    char   exclude_from_weight_decay[256]; /* comma-separated name fragments: a parameter whose
                                            * name contains one gets lars_weight_decay 0 */
} fl_optim_config;

typedef struct fl_optim fl_optim;

/* An optimizer over params[0..n) (borrowed: they must outlive it; only trainable ones with a
 * gradient are updated). Momentum allocates one zeroed velocity per trainable parameter, same
 * shape and dtype, named "opt.velocity.<param name>" (LARS likewise), in k's memory as the
 * parameters are (their tensors' `device` says so). Returns NULL and sets
 * fl_errmsg on a bad config (momentum outside [0, 1), momentum or nesterov with SGD, nesterov
 * with LARS, weight_decay < 0, lars_coeff <= 0, lars_weight_decay or epsilon < 0) or on
 * parameters whose value or gradient is not of `dtype` (f32 or f64). */
fl_optim *fl_optim_create(const fl_optim_config *cfg, fl_param *params, int n, fl_dtype dtype,
                          const fl_backend *k);
void fl_optim_free(fl_optim *opt);
/* One update with learning rate lr (finite, >= 0; else FL_EINVAL and nothing changes). If
 * grad_norm is not NULL it receives the global L2 norm of the gradients before clipping.
 * Gradients are modified in place only by clipping. */
int fl_optim_step(fl_optim *opt, double lr, double *grad_norm);
const fl_optim_config *fl_optim_get_config(const fl_optim *opt);
/* Optimizer state tensors (the velocities), for checkpoints; borrowed. 0 for SGD. */
int       fl_optim_num_state(const fl_optim *opt);
fl_param *fl_optim_state(fl_optim *opt, int i);

/* Global L2 norm of the trainable gradients of params[0..n), and, when max_norm > 0, scales
 * them by max_norm / max(norm, max_norm) (Paddle's ClipGradByGlobalNorm). Returns the norm
 * before scaling; a NaN or infinite norm is returned and the gradients are left as they are. */
double fl_clip_grad_norm(const fl_backend *k, fl_dtype t, fl_param *params, int n,
                         double max_norm);

/* Whether a parameter name contains one of the comma-separated fragments of list (spaces
 * around fragments ignored; empty fragments match nothing). */
bool fl_optim_name_excluded(const char *name, const char *list);

/* --- learning-rate schedules --- */
typedef enum {
    FL_LR_CONSTANT = 0,
    FL_LR_PIECEWISE = 1,  /* values[i] while step < boundaries[i]; values[n] after the last */
    FL_LR_COSINE = 2,     /* end + (base - end) * (1 + cos(pi * t / decay_steps)) / 2 */
    FL_LR_POLYNOMIAL = 3, /* end + (base - end) * (1 - t / decay_steps)^power */
} fl_lr_type;

#define FL_LR_MAX_PIECES 32

typedef struct {
    fl_lr_type type;
    double  base_lr;
    int     nboundaries;                      /* piecewise */
    int64_t boundaries[FL_LR_MAX_PIECES];     /* strictly increasing steps */
    double  values[FL_LR_MAX_PIECES + 1];     /* nboundaries + 1 values */
    int64_t decay_steps;                      /* cosine, polynomial: t is clamped to it */
    double  end_lr;                           /* cosine, polynomial */
    double  power;                            /* polynomial */
    int64_t warmup_steps;                     /* linear warm-up; 0: none */
    double  warmup_start_lr;
} fl_lr_schedule;

/* Checks the schedule's fields; FL_EINVAL with a message naming the field. */
int fl_lr_validate(const fl_lr_schedule *s);
/* Learning rate at 0-based step. During warm-up (step < warmup_steps) it rises linearly from
 * warmup_start_lr to the schedule's value at t = 0; afterwards the schedule runs on
 * t = step - warmup_steps (Paddle's LinearWarmup). */
double fl_lr_at(const fl_lr_schedule *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_OPTIM_H */
