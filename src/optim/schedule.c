/* schedule.c - learning-rate schedules as pure functions of the step (constant, piecewise,
 * cosine, polynomial) with linear warm-up in front, after Paddle's PiecewiseDecay,
 * CosineAnnealingDecay, PolynomialDecay (cycle=False) and LinearWarmup. A pure function of the
 * step needs no state in checkpoints: resuming at step s gives the same rate as never stopping. */
#include "fleet/optim.h"

#include "fleet/status.h"

#include <math.h>
#include <stdio.h>

static int check_rate(const char *field, double v) {
    if (!(v >= 0) || !isfinite(v))
        return fl_fail(FL_EINVAL, "lr_schedule.%s: %g is not a finite rate >= 0", field, v);
    return FL_OK;
}

int fl_lr_validate(const fl_lr_schedule *s) {
    FL_ASSERT(s);
    if ((unsigned)s->type > FL_LR_POLYNOMIAL)
        return fl_fail(FL_EINVAL, "lr_schedule.type: unknown schedule %d", (int)s->type);
    FL_TRY(check_rate("base_lr", s->base_lr));
    if (s->warmup_steps < 0)
        return fl_fail(FL_EINVAL, "lr_schedule.warmup_steps: %lld is negative",
                       (long long)s->warmup_steps);
    if (s->warmup_steps > 0)
        FL_TRY(check_rate("warmup_start_lr", s->warmup_start_lr));

    switch (s->type) {
    case FL_LR_CONSTANT:
        break;
    case FL_LR_PIECEWISE:
        if (s->nboundaries < 0 || s->nboundaries > FL_LR_MAX_PIECES)
            return fl_fail(FL_EINVAL, "lr_schedule.nboundaries: %d outside [0, %d]",
                           s->nboundaries, FL_LR_MAX_PIECES);
        for (int i = 0; i < s->nboundaries; i++) {
            if (s->boundaries[i] <= 0)
                return fl_fail(FL_EINVAL, "lr_schedule.boundaries: %lld is not positive",
                               (long long)s->boundaries[i]);
            if (i > 0 && s->boundaries[i] <= s->boundaries[i - 1])
                return fl_fail(FL_EINVAL,
                               "lr_schedule.boundaries: %lld after %lld is not increasing",
                               (long long)s->boundaries[i], (long long)s->boundaries[i - 1]);
        }
        for (int i = 0; i <= s->nboundaries; i++) {
            char field[32];
            snprintf(field, sizeof field, "values[%d]", i);
            FL_TRY(check_rate(field, s->values[i]));
        }
        break;
    case FL_LR_COSINE:
    case FL_LR_POLYNOMIAL:
        if (s->decay_steps < 1)
            return fl_fail(FL_EINVAL, "lr_schedule.decay_steps: %lld, must be >= 1",
                           (long long)s->decay_steps);
        FL_TRY(check_rate("end_lr", s->end_lr));
        if (s->type == FL_LR_POLYNOMIAL && !(s->power > 0 && isfinite(s->power)))
            return fl_fail(FL_EINVAL, "lr_schedule.power: %g, must be > 0", s->power);
        break;
    }
    return FL_OK;
}

/* The schedule itself at t >= 0 steps after warm-up. */
static double schedule_at(const fl_lr_schedule *s, int64_t t) {
    switch (s->type) {
    case FL_LR_CONSTANT:
        return s->base_lr;
    case FL_LR_PIECEWISE: {
        int i = 0;
        while (i < s->nboundaries && t >= s->boundaries[i])
            i++;
        return s->values[i];
    }
    case FL_LR_COSINE: {
        double tc = (double)(t < s->decay_steps ? t : s->decay_steps);
        return s->end_lr +
               (s->base_lr - s->end_lr) * (1.0 + cos(M_PI * tc / (double)s->decay_steps)) / 2.0;
    }
    case FL_LR_POLYNOMIAL: {
        double tc = (double)(t < s->decay_steps ? t : s->decay_steps);
        return s->end_lr +
               (s->base_lr - s->end_lr) * pow(1.0 - tc / (double)s->decay_steps, s->power);
    }
    }
    FL_ASSERT(!"unknown lr schedule type");
    return 0.0;
}

double fl_lr_at(const fl_lr_schedule *s, int64_t step) {
    FL_ASSERT(s);
    if (step < 0)
        step = 0;
    if (step < s->warmup_steps) {
        double target = schedule_at(s, 0);
        return s->warmup_start_lr +
               (target - s->warmup_start_lr) * (double)step / (double)s->warmup_steps;
    }
    return schedule_at(s, step - s->warmup_steps);
}
