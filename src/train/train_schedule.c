/* train_schedule.c - the learning-rate schedule of a run (optimizer.lr.*) for its length in
 * optimizer updates: built at set-up and rebuilt when a resume changes the run's length (another
 * number of workers, another train.epochs). */
#include "train/train_impl.h"

#include <string.h>

/* total_steps counts optimizer updates, the unit of the schedule */
static void make_schedule(const fl_train_config *cfg, int64_t total_steps, fl_lr_schedule *s) {
    memset(s, 0, sizeof *s);
    s->type = (fl_lr_type)cfg->optimizer.lr.schedule;
    s->base_lr = cfg->optimizer.lr.base;
    s->nboundaries = cfg->optimizer.lr.boundaries.n;
    for (int i = 0; i < s->nboundaries; i++)
        s->boundaries[i] = cfg->optimizer.lr.boundaries.v[i];
    for (int i = 0; i < cfg->optimizer.lr.values.n && i <= FL_LR_MAX_PIECES; i++)
        s->values[i] = cfg->optimizer.lr.values.v[i];
    int64_t after_warmup = total_steps - cfg->optimizer.lr.warmup_steps;
    s->decay_steps = cfg->optimizer.lr.decay_steps ? cfg->optimizer.lr.decay_steps
                                                   : (after_warmup > 0 ? after_warmup : 1);
    s->end_lr = cfg->optimizer.lr.end;
    s->power = cfg->optimizer.lr.power;
    s->warmup_steps = cfg->optimizer.lr.warmup_steps;
    s->warmup_start_lr = cfg->optimizer.lr.warmup_start;
}

void fl_train_set_length(trainer *t, const fl_train_config *cfg, int64_t total) {
    t->total_steps = total;
    make_schedule(cfg, total, &t->sched);
}
