/* trainer.c - the training loop of fleet-train, the same on one worker or many: each rank
 * trains on its shard of every global batch and fl_dist_minimize (backward, gradient averaging
 * as the strategy says, optimizer update) keeps the replicas in step. Set-up, evaluation and
 * progress lines live in train_setup.c, train_eval.c and train_log.c. */
#include "train/train_impl.h"

#include <math.h>
#include <stdbool.h>

/* One micro-batch: forward, loss, then fl_dist_minimize in place of backward + optimizer
 * step. *updated says whether the optimizer updated (with gradient_merge, every k-th call). */
static int train_step(trainer *t, const fl_tensor *x, const int32_t *labels, double lr,
                      double *loss, int64_t *correct, bool *updated) {
    const fl_tensor *logits;
    FL_TRY(fl_net_forward(t->net, x, true, &logits));
    fl_tensor probs;
    int64_t pshape[2] = {x->shape[0], logits->shape[1]};
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, pshape, t->probs->data);
    const fl_kernel_ops *k = fl_net_kernels(t->net);
    FL_TRY(fl_softmax_xent_forward(k, logits, labels, &probs, loss));
    *correct = fl_topk_correct(logits, labels, 1);
    FL_TRY(fl_softmax_xent_backward(k, &probs, labels, &probs));
    if (isfinite(*loss)) /* adaptive Local SGD follows the loss */
        FL_TRY(fl_dist_set_loss(t->dopt, *loss));
    return fl_dist_minimize(t->dopt, &probs, lr, updated);
}

/* A "step" is an optimizer update: the schedule, log_interval and max_steps count those. */
static int run(trainer *t, const fl_train_config *cfg, fl_train_result *res) {
    int64_t max_steps = cfg->train.max_steps;
    int64_t step = 0, last_epoch = 0, local_samples = 0;
    double run_start = fl_now();
    train_window w;
    const fl_tensor *x;
    const int32_t *labels;

    FL_INFO("worker %d of %d: training %lld epochs of %lld steps of %lld x %lld samples, %lld "
            "parameters", t->rank, t->world, (long long)cfg->train.epochs,
            (long long)(fl_loader_steps_per_epoch(t->loader) / t->merge_k),
            (long long)(t->merge_k * t->world), (long long)cfg->train.batch_size,
            (long long)fl_net_numel(t->net));
    fl_train_window_reset(t, &w);
    for (int64_t epoch = 0; epoch < cfg->train.epochs; epoch++) {
        if (max_steps > 0 && step >= max_steps)
            break;
        last_epoch = epoch;
        FL_TRY(fl_loader_seek(t->loader, epoch, 0));
        int rc;
        while ((rc = fl_loader_next(t->loader, &x, &labels)) == 1) {
            double lr = fl_lr_at(&t->sched, step), loss;
            int64_t correct;
            bool updated = true;
            FL_TRY(train_step(t, x, labels, lr, &loss, &correct, &updated));
            if (!isfinite(loss))
                return fl_fail(FL_EINVAL,
                               "worker %d: loss became %f at step %lld; lower "
                               "optimizer.lr.base or set optimizer.clip_norm",
                               t->rank, loss, (long long)step);
            w.loss_sum += loss * (double)x->shape[0];
            w.correct += correct;
            w.samples += x->shape[0];
            local_samples += x->shape[0];
            if (!updated)
                continue;
            step++;
            if (step % cfg->train.log_interval == 0 || (max_steps > 0 && step == max_steps))
                FL_TRY(fl_train_log_progress(t, &w, epoch, step, lr, res));
            if (max_steps > 0 && step >= max_steps)
                break;
        }
        FL_TRY(rc);
        if (epoch + 1 < cfg->train.epochs && !(max_steps > 0 && step >= max_steps))
            FL_TRY(fl_train_eval(t, cfg, epoch, step, res));
    }
    res->steps = step;
    /* drop_last: every rank sees the same number of samples */
    res->samples_per_s = (double)local_samples * t->world / (fl_now() - run_start);
    return fl_train_eval(t, cfg, last_epoch, step, res);
}

int fl_train_run(const fl_train_config *cfg, fl_train_result *result) {
    trainer t = {0};
    fl_train_result res = {0};
    int rc = fl_train_setup(&t, cfg);
    if (rc >= 0)
        rc = run(&t, cfg, &res);
    fl_train_teardown(&t);
    if (result)
        *result = res;
    return rc;
}
