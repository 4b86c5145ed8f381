/* train_eval.c - evaluation after each epoch: each rank runs the model over its shard of the
 * training and validation sets and one allreduce of the sums gives every rank the same loss and
 * accuracy over the whole set; then the eval line and rank 0's metrics record. */
#include "train/train_impl.h"

#include <math.h>
#include <stdio.h>

/* Sums over this rank's shard of ds: sums[0] loss, sums[1] correct, sums[2] samples. */
static int eval_shard(trainer *t, fl_dataset *ds, int64_t batch, double sums[3]) {
    fl_loader_config lc = {.batch_size = batch, .shuffle = false, .drop_last = false,
                           .seed = 0, .rank = t->rank, .world = t->world};
    fl_loader *l = fl_loader_create(ds, &lc);
    if (!l)
        return fl_fail_prefix(FL_EINVAL, "evaluation");
    const fl_kernel_ops *k = fl_net_kernels(t->net);
    const fl_tensor *x, *logits;
    const int32_t *labels;
    int rc = fl_loader_seek(l, 0, 0);
    while (rc >= 0 && (rc = fl_loader_next(l, &x, &labels)) == 1) {
        int64_t b = x->shape[0];
        if (b == 0) /* this rank's slice of the last, partial global batch is empty */
            continue;
        if ((rc = fl_net_forward(t->net, x, false, &logits)) < 0)
            break;
        fl_tensor probs;
        int64_t pshape[2] = {b, logits->shape[1]};
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, pshape, t->probs->data);
        double l_mean;
        if ((rc = fl_softmax_xent_forward(k, logits, labels, &probs, &l_mean)) < 0)
            break;
        sums[0] += l_mean * (double)b;
        sums[1] += (double)fl_topk_correct(logits, labels, 1);
        sums[2] += (double)b;
    }
    fl_loader_free(l);
    return rc < 0 ? rc : FL_OK;
}

int fl_train_eval(trainer *t, const fl_train_config *cfg, int64_t epoch, int64_t step,
                  fl_train_result *res) {
    double sums[6] = {0}; /* train loss, correct, samples; val loss, correct, samples */
    FL_TRY(eval_shard(t, t->train_set, cfg->train.batch_size, sums));
    if (t->val_set)
        FL_TRY(eval_shard(t, t->val_set, cfg->train.batch_size, sums + 3));
    /* sums of doubles up to 2^53 are exact counts; every rank gets the same result */
    FL_TRY(fl_comm_allreduce(fl_fleet_comm(t->fleet), sums, 6, FL_DTYPE_F64, FL_REDOP_SUM));
    res->train_loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    res->train_acc1 = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    res->val_loss = sums[5] > 0 ? sums[3] / sums[5] : NAN;
    res->val_acc1 = sums[5] > 0 ? sums[4] / sums[5] : NAN;
    printf("worker_index: %d, epoch %lld, step %lld, eval train_loss %.4f, train_acc1 %.4f, "
           "val_loss %.4f, val_acc1 %.4f\n",
           t->rank, (long long)epoch, (long long)step, res->train_loss, res->train_acc1,
           res->val_loss, res->val_acc1);
    fflush(stdout);
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "eval");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_num(t->metrics, "train_loss", res->train_loss);
    fl_metrics_num(t->metrics, "train_acc1", res->train_acc1);
    fl_metrics_num(t->metrics, "val_loss", res->val_loss);
    fl_metrics_num(t->metrics, "val_acc1", res->val_acc1);
    return fl_metrics_end(t->metrics);
}
