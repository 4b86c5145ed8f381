/* ctr_trainer.c - fleet-train's loop for the CTR models (docs/ctr.md "Training"), in both
 * architectures. A step: the worker's batch -> fl_ctr_model_prepare -> each table's rows filled
 * (replica, servers, local geo copy) -> forward -> sigmoid cross-entropy -> fl_dist_minimize
 * with the network output's gradient (the dense part's backward, exchange and update as the
 * strategy says: dense allreduce, or dense table 0 on the servers) -> the rows' gradients from
 * the network's input gradient -> the sparse update of the mode (ctr_sparse.c). Progress lines
 * carry the loss, Paddle's bucketed AUC (histograms summed over the workers with one allreduce
 * per line), log loss, predicted and actual CTR, examples/s, table rows and bytes, comm MB. */
#include "train/ctr_impl.h"

#include "fleet/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_ctr_metrics met;
    double   loss_sum;
    int64_t  samples, updates;
    double   start;
    uint64_t bytes_sent;
} ctr_window;

static void window_reset(ctr_trainer *c, ctr_window *w) {
    fl_ctr_metrics_reset(&w->met);
    w->loss_sum = 0;
    w->samples = w->updates = 0;
    w->start = fl_now();
    w->bytes_sent = fl_dist_bytes_sent(c->base.dopt);
}

/* Sums met (and extra[0..nextra)) over the workers: one allreduce. */
static int sum_over_workers(ctr_trainer *c, fl_ctr_metrics *met, double *extra, int nextra) {
    if (c->base.world == 1)
        return FL_OK;
    size_t n = met->numel + (size_t)nextra;
    double *buf = malloc(n * sizeof *buf);
    if (!buf)
        return fl_fail(FL_ENOMEM, "ctr: out of memory for the metrics");
    memcpy(buf, met->data, met->numel * sizeof *buf);
    if (nextra)
        memcpy(buf + met->numel, extra, (size_t)nextra * sizeof *buf);
    int rc = fl_comm_allreduce(fl_fleet_comm(c->base.fleet), buf, n, FL_DTYPE_F64, FL_REDOP_SUM);
    if (rc >= 0) {
        memcpy(met->data, buf, met->numel * sizeof *buf);
        if (nextra)
            memcpy(extra, buf + met->numel, (size_t)nextra * sizeof *buf);
    }
    free(buf);
    return rc < 0 ? fl_fail_prefix(rc, "summing the CTR metrics over the workers") : FL_OK;
}

static int log_progress(ctr_trainer *c, ctr_window *w, int64_t epoch, int64_t step, double lr,
                        fl_train_result *res) {
    trainer *t = &c->base;
    uint64_t bytes = fl_dist_bytes_sent(t->dopt); /* before this line's own allreduce */
    double extra[2] = {w->loss_sum, (double)w->samples};
    FL_TRY(sum_over_workers(c, &w->met, extra, 2));
    double now = fl_now();
    double loss = extra[1] > 0 ? extra[0] / extra[1] : NAN;
    double auc = fl_ctr_metrics_auc(&w->met), logloss = fl_ctr_metrics_logloss(&w->met);
    double pctr = fl_ctr_metrics_pred_ctr(&w->met), actr = fl_ctr_metrics_actual_ctr(&w->met);
    double ips = now > w->start ? extra[1] / (now - w->start) : 0.0;
    double comm_mb = (double)(bytes - w->bytes_sent) / 1e6;
    double step_ms = w->updates > 0 ? (now - w->start) * 1e3 / (double)w->updates : NAN;
    int64_t rows, tbytes;
    FL_TRY(ctr_tables_size(c, &rows, &tbytes));
    printf("worker_index: %d, epoch %lld, step %lld, loss %.4f, auc %.4f, logloss %.4f, "
           "pred_ctr %.4f, ctr %.4f, lr %.4f, ips %.1f ex/s, ",
           t->rank, (long long)epoch, (long long)step, loss, auc, logloss, pctr, actr, lr, ips);
    if (rows >= 0)
        printf("rows %lld, table %.1f MB, ", (long long)rows, (double)tbytes / 1e6);
    printf("comm %.1f MB\n", comm_mb);
    fflush(stdout);
    res->last_loss = loss;
    window_reset(c, w);
    w->bytes_sent = bytes;
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "train");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_num(t->metrics, "loss", loss);
    fl_metrics_num(t->metrics, "auc", auc);
    fl_metrics_num(t->metrics, "logloss", logloss);
    fl_metrics_num(t->metrics, "pred_ctr", pctr);
    fl_metrics_num(t->metrics, "actual_ctr", actr);
    fl_metrics_num(t->metrics, "lr", lr);
    fl_metrics_num(t->metrics, "ips", ips);
    fl_metrics_num(t->metrics, "comm_mb", comm_mb);
    fl_metrics_int(t->metrics, "workers", t->world);
    fl_metrics_str(t->metrics, "mode", ctr_mode_name(c->mode));
    fl_metrics_num(t->metrics, "time", now - t->start_time);
    fl_metrics_num(t->metrics, "step_ms", step_ms);
    fl_metrics_int(t->metrics, "bytes_sent", (int64_t)bytes);
    if (rows >= 0) {
        fl_metrics_int(t->metrics, "table_rows", rows);
        fl_metrics_int(t->metrics, "table_bytes", tbytes);
    }
    return fl_metrics_end(t->metrics);
}

/* p (B) f32 and the loss of the prepared batch; with dlogits, their gradient too. */
static int forward_loss(ctr_trainer *c, const fl_ctr_batch *b, bool training, float *p,
                        float *dl, double *loss) {
    const fl_tensor *lg;
    fl_tensor pt, dlt;
    int64_t shape[1] = {b->batch};
    FL_TRY(fl_ctr_model_forward(c->model, training, &lg));
    fl_tensor_view(&pt, FL_DTYPE_F32, 1, shape, p);
    *loss = 0;
    if (b->batch > 0)
        FL_TRY(fl_sigmoid_xent_forward(lg, b->labels, &pt, loss));
    if (dl) {
        fl_tensor_view(&dlt, FL_DTYPE_F32, 1, shape, dl);
        if (b->batch > 0)
            FL_TRY(fl_sigmoid_xent_backward(lg, b->labels, &dlt));
    }
    return FL_OK;
}

int ctr_evaluate(ctr_trainer *c, fl_ctr_metrics *met) {
    fl_ctr_metrics_reset(met);
    FL_TRY(ctr_source_seek(&c->val, 0));
    float *p = malloc((size_t)c->val.B * sizeof *p);
    if (!p)
        return fl_fail(FL_ENOMEM, "ctr: out of memory");
    const fl_ctr_batch *b;
    int rc;
    while ((rc = ctr_source_next(&c->val, &b)) == 1) {
        double loss;
        rc = fl_ctr_model_prepare(c->model, b);
        if (rc >= 0)
            rc = ctr_tables_fill(c);
        if (rc >= 0)
            rc = forward_loss(c, b, false, p, NULL, &loss);
        if (rc >= 0)
            rc = fl_ctr_metrics_add(met, p, b->labels, b->batch);
        if (rc < 0)
            break;
    }
    free(p);
    if (rc < 0)
        return fl_fail_prefix(rc, "evaluation");
    return sum_over_workers(c, met, NULL, 0);
}

static int eval_line(ctr_trainer *c, fl_ctr_metrics *met, int64_t epoch, int64_t step,
                     fl_train_result *res) {
    if (!c->has_val)
        return FL_OK;
    trainer *t = &c->base;
    FL_TRY(ctr_evaluate(c, met));
    double auc = fl_ctr_metrics_auc(met), logloss = fl_ctr_metrics_logloss(met);
    double pctr = fl_ctr_metrics_pred_ctr(met), actr = fl_ctr_metrics_actual_ctr(met);
    res->val_loss = logloss;
    res->val_acc1 = auc;
    printf("worker_index: %d, epoch %lld, step %lld, eval: auc %.4f, logloss %.4f, pred_ctr "
           "%.4f, ctr %.4f, samples %.0f",
           t->rank, (long long)epoch, (long long)step, auc, logloss, pctr, actr,
           fl_ctr_metrics_count(met));
    if (!isnan(c->best_auc))
        printf(", teacher's auc %.4f", c->best_auc);
    printf("\n");
    fflush(stdout);
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "eval");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_num(t->metrics, "auc", auc);
    fl_metrics_num(t->metrics, "logloss", logloss);
    fl_metrics_num(t->metrics, "pred_ctr", pctr);
    fl_metrics_num(t->metrics, "actual_ctr", actr);
    fl_metrics_num(t->metrics, "samples", fl_ctr_metrics_count(met));
    if (!isnan(c->best_auc))
        fl_metrics_num(t->metrics, "teacher_auc", c->best_auc);
    return fl_metrics_end(t->metrics);
}

/* One step on batch b as update `step`. */
static int train_step(ctr_trainer *c, const fl_ctr_batch *b, double lr, int64_t step, float *p,
                      float *dl, ctr_window *w) {
    double loss;
    FL_TRY(fl_ctr_model_prepare(c->model, b));
    FL_TRY(ctr_tables_fill(c));
    FL_TRY(forward_loss(c, b, true, p, dl, &loss));
    if (!isfinite(loss))
        return fl_fail(FL_EINVAL, "worker %d: loss became %f at step %lld; lower "
                                  "optimizer.lr.base or sparse_optimizer.lr",
                       c->base.rank, loss, (long long)step);
    FL_TRY(fl_ctr_metrics_add(&w->met, p, b->labels, b->batch));
    w->loss_sum += loss * (double)b->batch;
    w->samples += b->batch;
    fl_tensor dlt;
    const fl_tensor *dnet;
    fl_tensor_view(&dlt, FL_DTYPE_F32, 1, (int64_t[]){b->batch}, dl);
    FL_TRY(fl_ctr_model_dnet(c->model, &dlt, &dnet));
    bool updated;
    FL_TRY(fl_dist_minimize(c->base.dopt, dnet, lr, &updated));
    FL_TRY(fl_ctr_model_backward_rows(c->model, &dlt));
    return ctr_tables_update(c, step, b->labels);
}

/* The end of an epoch under the life cycle: a pass of both tables, said on worker 0. */
static int table_pass(ctr_trainer *c, int64_t epoch, int64_t step) {
    trainer *t = &c->base;
    int64_t removed[FL_CTR_NTABLES], rows, bytes;
    FL_TRY(ctr_tables_pass(c, removed));
    FL_TRY(ctr_tables_size(c, &rows, &bytes));
    if (t->rank != 0)
        return FL_OK;
    FL_INFO("sparse tables: pass at the end of epoch %lld (step %lld): %lld rows of '%s' and "
            "%lld of '%s' removed; %lld rows, %.1f MB left", (long long)epoch, (long long)step,
            (long long)removed[0], fl_ctr_model_table_name(0), (long long)removed[1],
            fl_ctr_model_table_name(1), (long long)rows, (double)bytes / 1e6);
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "table_pass");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_int(t->metrics, "removed_embedding", removed[0]);
    fl_metrics_int(t->metrics, "removed_wide", removed[1]);
    fl_metrics_int(t->metrics, "table_rows", rows);
    fl_metrics_int(t->metrics, "table_bytes", bytes);
    return fl_metrics_end(t->metrics);
}

static int run(ctr_trainer *c, const fl_train_config *cfg, fl_train_result *res) {
    trainer *t = &c->base;
    int64_t max_steps = cfg->train.max_steps, B = cfg->train.batch_size;
    char steps[32];
    if (c->train.steps > 0)
        snprintf(steps, sizeof steps, "%lld", (long long)c->train.steps);
    else
        snprintf(steps, sizeof steps, "the list's");
    FL_INFO("worker %d of %d: CTR training (%s, %s), %lld epochs of %s steps of %lld x %lld "
            "samples, %lld dense parameters", t->rank, t->world,
            fl_ctr_model_type_name(fl_ctr_model_config_of(c->model)->type),
            ctr_mode_name(c->mode), (long long)cfg->train.epochs, steps, (long long)t->world,
            (long long)B, (long long)fl_net_numel(t->net));
    train_pos start;
    FL_TRY(ctr_ckpt_restore(c, cfg, &start));
    int64_t step = start.step, last_epoch = start.epoch, batch = start.batch, local = 0;
    /* where a final checkpoint resumes: an epoch whose data ran out (and whose table pass ran)
     * is done, the next starts at its first batch */
    train_pos end = start;
    int64_t last_saved = start.step > 0 || cfg->checkpoint.resume[0] ? start.step : -1;
    res->started = true;
    float *p = malloc((size_t)B * sizeof *p), *dl = malloc((size_t)B * sizeof *dl);
    ctr_window w = {0};
    fl_ctr_metrics evm = {0};
    int rc = p && dl ? FL_OK : fl_fail(FL_ENOMEM, "ctr: out of memory");
    if (rc >= 0)
        rc = fl_ctr_metrics_init(&w.met, FL_AUC_THRESHOLDS);
    if (rc >= 0)
        rc = fl_ctr_metrics_init(&evm, FL_AUC_THRESHOLDS);
    double run_start = fl_now();
    t->start_time = run_start;
    if (rc >= 0)
        window_reset(c, &w);
    for (int64_t epoch = start.epoch; rc >= 0 && epoch < cfg->train.epochs; epoch++) {
        if (max_steps > 0 && step >= max_steps)
            break;
        last_epoch = epoch;
        batch = epoch == start.epoch ? start.batch : 0;
        rc = ctr_source_seek(&c->train, batch);
        const fl_ctr_batch *b;
        bool ended = false;
        while (rc >= 0 && !(ended = (rc = ctr_source_next(&c->train, &b)) == 0) && rc == 1) {
            batch++;
            double lr = fl_lr_at(&t->sched, step);
            rc = train_step(c, b, lr, step, p, dl, &w);
            if (rc < 0)
                break;
            local += b->batch;
            step++;
            w.updates++;
            if (step % cfg->train.log_interval == 0 || (max_steps > 0 && step == max_steps))
                rc = log_progress(c, &w, epoch, step, lr, res);
            if (rc >= 0 && fl_train_ckpt_due(cfg, step)) {
                rc = ctr_ckpt_save(c, cfg, &(train_pos){step, epoch, batch});
                last_saved = step;
            }
            if (max_steps > 0 && step >= max_steps)
                break;
        }
        if (rc < 0)
            break;
        /* a pass of the tables' life cycle ends each epoch the data ran out (not a stop at
         * train.max_steps; a resume at an epoch's last batch runs the pass it had not run) */
        if (ended && c->lifecycle) {
            double t0 = fl_now();
            rc = table_pass(c, epoch, step);
            w.start += fl_now() - t0;
            if (rc < 0)
                break;
        }
        end = ended ? (train_pos){step, epoch + 1, 0} : (train_pos){step, epoch, batch};
        if (epoch + 1 < cfg->train.epochs && !(max_steps > 0 && step >= max_steps)) {
            double t0 = fl_now();
            rc = eval_line(c, &evm, epoch, step, res);
            w.start += fl_now() - t0;
        }
    }
    /* geo: the last exchange; parameter-server async and geo: the servers' final values */
    if (rc >= 0)
        rc = ctr_tables_finish(c, step);
    if (rc >= 0)
        rc = fl_dist_finish(t->dopt);
    res->steps = step;
    res->samples_per_s = (double)local * t->world / (fl_now() - run_start);
    if (rc >= 0)
        rc = eval_line(c, &evm, last_epoch, step, res);
    if (rc >= 0 && cfg->checkpoint.dir[0] && last_saved != step)
        rc = ctr_ckpt_save(c, cfg, &end);
    fl_ctr_metrics_free(&w.met);
    fl_ctr_metrics_free(&evm);
    free(p);
    free(dl);
    return rc;
}

int fl_train_run_ctr(const fl_train_config *cfg, fl_train_result *res) {
    ctr_trainer c;
    memset(&c, 0, sizeof c);
    int rc = ctr_setup(&c, cfg);
    if (rc >= 0)
        rc = run(&c, cfg, res);
    ctr_teardown(&c);
    return rc;
}
