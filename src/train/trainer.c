/* trainer.c - the single-worker training loop of fleet-train: builds data, model, optimizer
 * and schedule from a fl_train_config, trains, evaluates after each epoch, and reports
 * progress lines and JSON-lines metrics. Everything is allocated before the first step. */
#include "fleet/data.h"
#include "fleet/kernels.h"
#include "fleet/log.h"
#include "fleet/metrics.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/status.h"
#include "fleet/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    fl_dataset *train_set, *val_set;
    fl_loader  *loader;
    fl_net     *net;
    fl_optim   *opt;
    fl_tensor  *probs;   /* (B, C) softmax of the last forward; reused as dlogits */
    fl_metrics *metrics;
    fl_lr_schedule sched;
} trainer;

static void trainer_free(trainer *t) {
    fl_metrics_close(t->metrics);
    fl_tensor_free(t->probs);
    fl_optim_free(t->opt);
    fl_net_free(t->net);
    fl_loader_free(t->loader);
    fl_dataset_free(t->val_set);
    fl_dataset_free(t->train_set);
}

static fl_dataset *make_dataset(const fl_train_config *cfg, int split) {
    int64_t size = split == 0 ? cfg->data.train_size : cfg->data.val_size;
    if (cfg->data.type == FL_DATA_RANDOM) /* each split its own seed: disjoint samples */
        return fl_dataset_random_create(size, cfg->data.features, (int)cfg->data.classes,
                                        (uint64_t)cfg->data.seed * 2 + (uint64_t)split);
    return fl_dataset_teacher_create(size, cfg->data.features, cfg->data.teacher_hidden,
                                     (int)cfg->data.classes, (uint64_t)cfg->data.seed, split);
}

static fl_net *make_model(const fl_train_config *cfg) {
    /* model.type has one value so far (mlp); the zoo grows with later issues */
    return fl_model_mlp(FL_DTYPE_F32, cfg->data.features, cfg->model.hidden.v, cfg->model.hidden.n,
                        (fl_act)cfg->model.activation, cfg->data.classes);
}

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

/* mkdir -p for the log directory */
static int make_dirs(const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return fl_fail(FL_EIO, "train.log_dir: cannot create '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return fl_fail(FL_EIO, "train.log_dir: cannot create '%s': %s", buf, strerror(errno));
    return FL_OK;
}

static int setup(trainer *t, const fl_train_config *cfg) {
    if (cfg->train.threads > 0)
        fl_kernels_set_threads((int)cfg->train.threads);
    t->train_set = make_dataset(cfg, 0);
    if (!t->train_set)
        return fl_fail_prefix(FL_EINVAL, "data");
    if (cfg->data.val_size > 0) {
        t->val_set = make_dataset(cfg, 1);
        if (!t->val_set)
            return fl_fail_prefix(FL_EINVAL, "data");
    }
    fl_loader_config lc = {.batch_size = cfg->train.batch_size, .shuffle = true,
                           .drop_last = true, .seed = (uint64_t)cfg->train.seed,
                           .rank = 0, .world = 1};
    t->loader = fl_loader_create(t->train_set, &lc);
    if (!t->loader)
        return fl_fail_prefix(FL_ECONFIG, "train.batch_size");

    t->net = make_model(cfg);
    if (!t->net)
        return fl_fail_prefix(FL_ECONFIG, "model");
    FL_TRY(fl_net_build(t->net, t->train_set->ndim, t->train_set->shape, cfg->train.batch_size,
                        (uint64_t)cfg->train.seed));

    fl_optim_config oc = {.type = (fl_optim_type)cfg->optimizer.type,
                          .momentum = cfg->optimizer.type == FL_OPTIM_MOMENTUM
                                          ? cfg->optimizer.momentum : 0.0,
                          .nesterov = cfg->optimizer.nesterov,
                          .weight_decay = cfg->optimizer.weight_decay,
                          .clip_norm = cfg->optimizer.clip_norm};
    t->opt = fl_optim_create(&oc, fl_net_param(t->net, 0), fl_net_num_params(t->net),
                             FL_DTYPE_F32, fl_net_kernels(t->net));
    if (!t->opt)
        return fl_fail_prefix(FL_ECONFIG, "optimizer");

    int64_t total = fl_loader_steps_per_epoch(t->loader) * cfg->train.epochs;
    if (cfg->train.max_steps > 0 && cfg->train.max_steps < total)
        total = cfg->train.max_steps;
    make_schedule(cfg, total, &t->sched);
    int rc = fl_lr_validate(&t->sched);
    if (rc < 0)
        return fl_fail_prefix(FL_ECONFIG, "optimizer.lr");

    int64_t pshape[2] = {cfg->train.batch_size, cfg->data.classes};
    t->probs = fl_tensor_create(FL_DTYPE_F32, 2, pshape);
    if (!t->probs)
        return FL_ENOMEM;

    if (cfg->train.log_dir[0]) {
        FL_TRY(make_dirs(cfg->train.log_dir));
        char path[300];
        snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->train.log_dir);
        t->metrics = fl_metrics_open(path);
        if (!t->metrics)
            return FL_EIO;
    }
    return FL_OK;
}

/* Mean loss and top-1 accuracy of the network over a whole dataset, in evaluation mode. */
static int evaluate(trainer *t, fl_dataset *ds, int64_t batch, double *loss, double *acc1) {
    fl_loader_config lc = {.batch_size = batch, .shuffle = false, .drop_last = false,
                           .seed = 0, .rank = 0, .world = 1};
    fl_loader *l = fl_loader_create(ds, &lc);
    if (!l)
        return FL_EINVAL;
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    int rc = fl_loader_seek(l, 0, 0);
    const fl_tensor *x, *logits;
    const int32_t *labels;
    while (rc >= 0 && (rc = fl_loader_next(l, &x, &labels)) == 1) {
        int64_t b = x->shape[0];
        if (b == 0)
            continue;
        if ((rc = fl_net_forward(t->net, x, false, &logits)) < 0)
            break;
        fl_tensor probs;
        int64_t pshape[2] = {b, logits->shape[1]};
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, pshape, t->probs->data);
        double l_mean;
        if ((rc = fl_softmax_xent_forward(fl_net_kernels(t->net), logits, labels, &probs,
                                          &l_mean)) < 0)
            break;
        loss_sum += l_mean * (double)b;
        correct += fl_topk_correct(logits, labels, 1);
        seen += b;
    }
    fl_loader_free(l);
    if (rc < 0)
        return rc;
    *loss = seen ? loss_sum / (double)seen : NAN;
    *acc1 = seen ? (double)correct / (double)seen : NAN;
    return FL_OK;
}

static int log_eval(trainer *t, const fl_train_config *cfg, int64_t epoch, int64_t step,
                    fl_train_result *res) {
    FL_TRY(evaluate(t, t->train_set, cfg->train.batch_size, &res->train_loss, &res->train_acc1));
    res->val_loss = res->val_acc1 = NAN;
    if (t->val_set)
        FL_TRY(evaluate(t, t->val_set, cfg->train.batch_size, &res->val_loss, &res->val_acc1));
    printf("worker_index: 0, epoch %lld, step %lld, eval train_loss %.4f, train_acc1 %.4f, "
           "val_loss %.4f, val_acc1 %.4f\n",
           (long long)epoch, (long long)step, res->train_loss, res->train_acc1, res->val_loss,
           res->val_acc1);
    fflush(stdout);
    if (t->metrics) {
        fl_metrics_begin(t->metrics);
        fl_metrics_str(t->metrics, "phase", "eval");
        fl_metrics_int(t->metrics, "epoch", epoch);
        fl_metrics_int(t->metrics, "step", step);
        fl_metrics_num(t->metrics, "train_loss", res->train_loss);
        fl_metrics_num(t->metrics, "train_acc1", res->train_acc1);
        fl_metrics_num(t->metrics, "val_loss", res->val_loss);
        fl_metrics_num(t->metrics, "val_acc1", res->val_acc1);
        FL_TRY(fl_metrics_end(t->metrics));
    }
    return FL_OK;
}

/* One optimizer step on one batch; returns the batch's mean loss and correct count. */
static int train_step(trainer *t, const fl_tensor *x, const int32_t *labels, double lr,
                      double *loss, int64_t *correct) {
    const fl_tensor *logits;
    FL_TRY(fl_net_forward(t->net, x, true, &logits));
    fl_tensor probs;
    int64_t pshape[2] = {x->shape[0], logits->shape[1]};
    fl_tensor_view(&probs, FL_DTYPE_F32, 2, pshape, t->probs->data);
    const fl_kernel_ops *k = fl_net_kernels(t->net);
    FL_TRY(fl_softmax_xent_forward(k, logits, labels, &probs, loss));
    *correct = fl_topk_correct(logits, labels, 1);
    FL_TRY(fl_softmax_xent_backward(k, &probs, labels, &probs));
    FL_TRY(fl_net_backward(t->net, &probs, NULL, NULL));
    return fl_optim_step(t->opt, lr, NULL);
}

static int run(trainer *t, const fl_train_config *cfg, fl_train_result *res) {
    int64_t steps_per_epoch = fl_loader_steps_per_epoch(t->loader);
    int64_t max_steps = cfg->train.max_steps;
    int64_t step = 0, last_epoch = 0;
    double win_loss = 0, win_start = fl_now(), run_start = win_start;
    int64_t win_correct = 0, win_samples = 0, win_steps = 0, total_samples = 0;
    const fl_tensor *x;
    const int32_t *labels;

    FL_INFO("training %lld epochs of %lld steps, %lld parameters", (long long)cfg->train.epochs,
            (long long)steps_per_epoch, (long long)fl_net_numel(t->net));
    for (int64_t epoch = 0; epoch < cfg->train.epochs; epoch++) {
        if (max_steps > 0 && step >= max_steps)
            break;
        last_epoch = epoch;
        FL_TRY(fl_loader_seek(t->loader, epoch, 0));
        int rc;
        while ((rc = fl_loader_next(t->loader, &x, &labels)) == 1) {
            double lr = fl_lr_at(&t->sched, step), loss;
            int64_t correct;
            FL_TRY(train_step(t, x, labels, lr, &loss, &correct));
            if (!isfinite(loss))
                return fl_fail(FL_EINVAL,
                               "loss became %f at step %lld; lower optimizer.lr.base or set "
                               "optimizer.clip_norm",
                               loss, (long long)step);
            step++;
            win_loss += loss;
            win_correct += correct;
            win_samples += x->shape[0];
            total_samples += x->shape[0];
            win_steps++;
            if (step % cfg->train.log_interval == 0 || (max_steps > 0 && step == max_steps)) {
                double now = fl_now();
                double ips = (double)win_samples / (now - win_start);
                res->last_loss = win_loss / (double)win_steps;
                double acc = (double)win_correct / (double)win_samples;
                printf("worker_index: 0, epoch %lld, step %lld, loss %.4f, acc1 %.4f, lr %.4f, "
                       "ips %.1f img/s, comm 0.0 MB\n",
                       (long long)epoch, (long long)step, res->last_loss, acc, lr, ips);
                fflush(stdout);
                if (t->metrics) {
                    fl_metrics_begin(t->metrics);
                    fl_metrics_str(t->metrics, "phase", "train");
                    fl_metrics_int(t->metrics, "epoch", epoch);
                    fl_metrics_int(t->metrics, "step", step);
                    fl_metrics_num(t->metrics, "loss", res->last_loss);
                    fl_metrics_num(t->metrics, "acc1", acc);
                    fl_metrics_num(t->metrics, "lr", lr);
                    fl_metrics_num(t->metrics, "ips", ips);
                    fl_metrics_num(t->metrics, "comm_mb", 0.0);
                    FL_TRY(fl_metrics_end(t->metrics));
                }
                win_loss = 0;
                win_correct = win_samples = win_steps = 0;
                win_start = now;
            }
            if (max_steps > 0 && step >= max_steps)
                break;
        }
        FL_TRY(rc);
        if (epoch + 1 < cfg->train.epochs && !(max_steps > 0 && step >= max_steps))
            FL_TRY(log_eval(t, cfg, epoch, step, res));
    }
    res->steps = step;
    res->samples_per_s = (double)total_samples / (fl_now() - run_start);
    return log_eval(t, cfg, last_epoch, step, res);
}

int fl_train_run(const fl_train_config *cfg, fl_train_result *result) {
    trainer t = {0};
    fl_train_result res = {0};
    int rc = setup(&t, cfg);
    if (rc >= 0)
        rc = run(&t, cfg, &res);
    trainer_free(&t);
    if (result)
        *result = res;
    return rc;
}
