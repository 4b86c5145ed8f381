/* trainer.c - the training loop of fleet-train, the same on one worker or many: each rank
 * trains on its shard of every global batch and fl_dist_minimize (backward, gradient averaging
 * as the strategy says, optimizer update) keeps the replicas in step. Set-up, evaluation and
 * progress lines live in train_setup.c, train_eval.c and train_log.c. */
#include "train/ctr_impl.h"
#include "train/straggler.h"
#include "train/train_impl.h"

#include <math.h>
#include <stdbool.h>

/* One micro-batch: forward, loss, then fl_dist_minimize in place of backward + optimizer
 * step. *updated says whether the optimizer updated (with gradient_merge, every k-th call).
 * x and labels are where the network computes (fl_train_input), hlabels the labels in host
 * memory; on a device the logits come back once for the accuracy. */
static int train_step(trainer *t, const fl_tensor *x, const int32_t *labels,
                      const int32_t *hlabels, double lr, double *loss, int64_t *correct,
                      bool *updated) {
    const fl_tensor *logits;
    fl_tensor probs, hview;
    fl_train_batch_probs(&t->batch, x->shape[0], &probs);
    FL_TRY(fl_net_forward(t->net, x, true, &logits));
    const fl_backend *k = fl_net_backend(t->net);
    double eps = t->label_smoothing;
    FL_TRY(fl_softmax_xent_smooth_forward(k, logits, labels, eps, &probs, loss));
    *correct = fl_topk_correct(fl_train_batch_logits(&t->batch, logits, &hview), hlabels, 1);
    FL_TRY(fl_softmax_xent_smooth_backward(k, &probs, labels, eps, &probs));
    if (x->shape[0] == 0) /* every sample of this rank's batch was a skipped image */
        *loss = 0;
    if (isfinite(*loss)) /* adaptive Local SGD follows the loss */
        FL_TRY(fl_dist_set_loss(t->dopt, *loss));
    return fl_dist_minimize(t->dopt, &probs, lr, updated);
}

/* A "step" is an optimizer update: the schedule, log_interval and max_steps count those. */
static int run(trainer *t, const fl_train_config *cfg, fl_train_result *res) {
    int64_t max_steps = cfg->train.max_steps;
    int64_t step = 0, last_epoch = 0, local_samples = 0, batch = 0;
    double run_start = fl_now();
    t->start_time = run_start;
    train_window w;
    fl_tensor x;
    const int32_t *labels, *hlabels;

    FL_INFO("worker %d of %d: training %lld epochs of %lld steps of %lld x %lld samples, %lld "
            "parameters", t->rank, t->world, (long long)cfg->train.epochs,
            (long long)(fl_prefetch_steps_per_epoch(t->loader) / t->merge_k),
            (long long)(t->merge_k * t->world), (long long)cfg->train.batch_size,
            (long long)fl_net_numel(t->net));
    FL_INFO("worker %d of %d: %d compute threads, idle ones: %s", t->rank, t->world,
            fl_kernels_get_threads(), fl_kernels_wait_policy());
    /* --resume: the step, epoch and data position the checkpoint stood at */
    train_pos start;
    FL_TRY(fl_train_ckpt_restore(t, cfg, &start));
    step = start.step;
    last_epoch = start.epoch;
    /* a checkpoint resumed from elsewhere (another directory, another world) is saved again
     * in checkpoint.dir at the end, even when no step is taken */
    int64_t last_saved = t->resumed_in_dir ? start.step : -1;
    res->started = true;
    fl_train_window_reset(t, &w);
    fl_straggler slow; /* FLEET_BENCH_SLOW: a benchmark's random straggler (straggler.h) */
    FL_TRY(fl_straggler_from_env(&slow, t->rank, t->world));
    for (int64_t epoch = start.epoch; epoch < cfg->train.epochs; epoch++) {
        if (max_steps > 0 && step >= max_steps)
            break;
        last_epoch = epoch;
        batch = epoch == start.epoch ? start.batch : 0;
        FL_TRY(fl_train_input_seek(&t->input, epoch, batch));
        int rc;
        while ((rc = fl_train_input_next(&t->input, &x, &labels, &hlabels)) == 1) {
            batch++;
            double lr = fl_lr_at(&t->sched, step) * t->lr_scale, loss;
            int64_t correct;
            bool updated = true;
            fl_straggler_step(&slow);
            FL_TRY(train_step(t, &x, labels, hlabels, lr, &loss, &correct, &updated));
            if (!isfinite(loss))
                return fl_fail(FL_EINVAL,
                               "worker %d: loss became %f at step %lld; lower "
                               "optimizer.lr.base or set optimizer.clip_norm",
                               t->rank, loss, (long long)step);
            w.loss_sum += loss * (double)x.shape[0];
            w.correct += correct;
            w.samples += x.shape[0];
            local_samples += x.shape[0];
            if (!updated)
                continue;
            step++;
            w.updates++;
            if (step % cfg->train.log_interval == 0 || (max_steps > 0 && step == max_steps))
                FL_TRY(fl_train_log_progress(t, &w, epoch, step, lr, res));
            if (fl_train_ckpt_due(cfg, step)) {
                FL_TRY(fl_train_ckpt_save(t, cfg, &(train_pos){step, epoch, batch}));
                last_saved = step;
            }
            if (max_steps > 0 && step >= max_steps)
                break;
        }
        FL_TRY(rc);
        if (epoch + 1 < cfg->train.epochs && !(max_steps > 0 && step >= max_steps)) {
            double eval_start = fl_now();
            FL_TRY(fl_train_eval(t, cfg, epoch, step, res));
            w.start += fl_now() - eval_start; /* step times and ips leave evaluations out */
        }
    }
    /* parameter-server async and geo: every worker takes the servers' final values */
    FL_TRY(fl_dist_finish(t->dopt));
    /* ... which a periodic save of the last step, taken before, does not hold: saved again */
    if (t->ps && cfg->strategy.a_sync)
        last_saved = -1;
    res->steps = step;
    /* drop_last: every rank sees the same number of samples */
    res->samples_per_s = (double)local_samples * t->world / (fl_now() - run_start);
    FL_TRY(fl_train_eval(t, cfg, last_epoch, step, res));
    /* the final checkpoint and the inference model, when configured */
    return fl_train_ckpt_final(t, cfg, &(train_pos){step, last_epoch, batch}, last_saved);
}

int fl_train_run(const fl_train_config *cfg, fl_train_result *result) {
    trainer t = {0};
    fl_train_result res = {0};
    if (fl_train_ps_is_server()) { /* parameter-server mode: this process serves the tables */
        int rc = fl_train_serve(cfg, &res.started);
        if (result)
            *result = res;
        return rc;
    }
    if (fl_data_is_ctr(cfg->data.type)) { /* CTR models over sparse tables (ctr_trainer.c) */
        int rc = fl_train_run_ctr(cfg, &res);
        if (result)
            *result = res;
        return rc;
    }
    int rc = fl_train_setup(&t, cfg);
    if (rc >= 0)
        rc = run(&t, cfg, &res);
    fl_train_teardown(&t);
    if (result)
        *result = res;
    return rc;
}
