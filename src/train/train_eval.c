/* train_eval.c - evaluation after each epoch: the ranks average their batch-norm statistics,
 * each runs the model over its shard of the training (train.eval_train) and validation sets,
 * and one allreduce of the sums gives every rank the same loss and accuracy over the whole set;
 * then the eval line, the images skipped so far, and rank 0's metrics record. */
#include "train/train_impl.h"

#include <math.h>
#include <stdio.h>

/* Sums over this rank's shard of ds: sums[0] loss, sums[1] correct, sums[2] samples. */
static int eval_shard(trainer *t, const fl_train_config *cfg, fl_dataset *ds, double sums[3]) {
    fl_prefetch_config lc = {.base = {.batch_size = cfg->train.batch_size, .shuffle = false,
                                      .drop_last = false, .seed = 0, .rank = t->rank,
                                      .world = t->world},
                             .num_workers = (int)cfg->data.num_workers,
                             .prefetch = (int)cfg->data.prefetch};
    fl_prefetch *l = fl_prefetch_create(ds, &lc);
    if (!l)
        return fl_fail_prefix(FL_EINVAL, "evaluation");
    const fl_backend *k = fl_net_backend(t->net);
    const fl_tensor *x, *logits;
    const int32_t *labels, *dlabels;
    int rc = fl_prefetch_seek(l, 0, 0);
    while (rc >= 0 && (rc = fl_prefetch_next(l, &x, &labels)) == 1) {
        int64_t b = x->shape[0];
        if (b == 0) /* this rank's slice of the last, partial global batch is empty */
            continue;
        fl_tensor dx, probs, hview;
        if ((rc = fl_train_batch_put(&t->batch, x, labels, &dx, &dlabels, &probs)) < 0 ||
            (rc = fl_net_forward(t->net, &dx, false, &logits)) < 0)
            break;
        double l_mean;
        if ((rc = fl_softmax_xent_forward(k, logits, dlabels, &probs, &l_mean)) < 0)
            break;
        sums[0] += l_mean * (double)b;
        sums[1] += (double)fl_topk_correct(fl_train_batch_logits(&t->batch, logits, &hview),
                                           labels, 1);
        sums[2] += (double)b;
    }
    fl_prefetch_free(l);
    return rc < 0 ? rc : FL_OK;
}

/* Persistable buffers (batch-norm running statistics) are each rank's own: every rank updates
 * them from its own batches, and the strategies average only trainable values. Before an
 * evaluation the ranks take their mean (timm's distribute_bn with reduce=True), so that all
 * ranks evaluate one model, the one the checkpoint and the inference model then hold. Buffers
 * follow the trainable values in the flat parameter block (fl_net_numel). */
static int average_buffers(trainer *t) {
    int64_t all = 0, trainable = fl_net_numel(t->net);
    for (int i = 0; i < fl_net_num_params(t->net); i++)
        all += fl_net_param(t->net, i)->value.numel;
    if (t->world == 1 || all == trainable)
        return FL_OK;
    fl_dtype dt = fl_net_dtype(t->net);
    const fl_backend *k = fl_net_backend(t->net);
    char *buffers = (char *)fl_net_flat_params(t->net) + (size_t)trainable * fl_dtype_size(dt);
    size_t bytes = (size_t)(all - trainable) * fl_dtype_size(dt);
    /* comm sees host memory: on a device the buffers go through t->hbuffers */
    void *wire = fl_backend_stage_buf(k, buffers, t->hbuffers);
    fl_backend_stage_out(k, buffers, wire, bytes, NULL);
    int rc = fl_comm_allreduce(fl_fleet_comm(t->fleet), wire, (size_t)(all - trainable), dt,
                               FL_REDOP_AVG);
    if (rc < 0)
        return fl_fail_prefix(rc, "averaging the running statistics");
    fl_backend_stage_in(k, buffers, wire, bytes, NULL);
    k->stream_sync(NULL);
    return FL_OK;
}

/* Image lists under data.bad_images: skip: this rank's line "skipped N images (M missing, C
 * corrupt)" per list with bad images found so far (distinct images this rank's training and
 * evaluation loaded; the ranks' shards differ, so each rank reports its own). */
static int report_skipped(trainer *t, const fl_train_config *cfg, int64_t epoch) {
    if (cfg->data.type != FL_DATA_IMAGELIST)
        return FL_OK;
    fl_dataset *sets[2] = {t->train_set, t->val_set};
    const char *lists[2] = {cfg->data.train_list, cfg->data.val_list};
    for (int i = 0; i < 2; i++) {
        fl_imagelist_stats st;
        if (!sets[i])
            continue;
        FL_TRY(fl_dataset_imagelist_stats(sets[i], &st));
        if (st.missing + st.corrupt > 0)
            printf("worker_index: %d, epoch %lld, %s: skipped %lld image%s (%lld missing, "
                   "%lld corrupt)\n",
                   t->rank, (long long)epoch, lists[i], (long long)(st.missing + st.corrupt),
                   st.missing + st.corrupt == 1 ? "" : "s", (long long)st.missing,
                   (long long)st.corrupt);
    }
    return FL_OK;
}

int fl_train_eval(trainer *t, const fl_train_config *cfg, int64_t epoch, int64_t step,
                  fl_train_result *res) {
    double sums[6] = {0}; /* train loss, correct, samples; val loss, correct, samples */
    FL_TRY(average_buffers(t));
    if (cfg->train.eval_train)
        FL_TRY(eval_shard(t, cfg, t->train_set, sums));
    if (t->val_set)
        FL_TRY(eval_shard(t, cfg, t->val_set, sums + 3));
    /* sums of doubles up to 2^53 are exact counts; every rank gets the same result */
    int rc = fl_comm_allreduce(fl_fleet_comm(t->fleet), sums, 6, FL_DTYPE_F64, FL_REDOP_SUM);
    if (rc < 0)
        return fl_fail_prefix(rc, "evaluation at step %lld: summing the metrics over ranks",
                              (long long)step);
    res->train_loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    res->train_acc1 = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    res->val_loss = sums[5] > 0 ? sums[3] / sums[5] : NAN;
    res->val_acc1 = sums[5] > 0 ? sums[4] / sums[5] : NAN;
    /* only what was measured: no train_* without train.eval_train, no val_* without a set */
    bool train = cfg->train.eval_train, val = t->val_set != NULL;
    printf("worker_index: %d, epoch %lld, step %lld, eval", t->rank, (long long)epoch,
           (long long)step);
    if (train)
        printf(" train_loss %.4f, train_acc1 %.4f%s", res->train_loss, res->train_acc1,
               val ? "," : "");
    if (val)
        printf(" val_loss %.4f, val_acc1 %.4f", res->val_loss, res->val_acc1);
    printf("\n");
    FL_TRY(report_skipped(t, cfg, epoch));
    fflush(stdout);
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "eval");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_num(t->metrics, "time", fl_now() - t->start_time);
    if (train) {
        fl_metrics_num(t->metrics, "train_loss", res->train_loss);
        fl_metrics_num(t->metrics, "train_acc1", res->train_acc1);
    }
    if (val) {
        fl_metrics_num(t->metrics, "val_loss", res->val_loss);
        fl_metrics_num(t->metrics, "val_acc1", res->val_acc1);
    }
    return fl_metrics_end(t->metrics);
}
