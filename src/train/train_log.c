/* train_log.c - the progress lines: what each rank saw since the previous line, averaged over
 * the ranks with one allreduce of three numbers per line (never per step), printed by every
 * rank in DESIGN.md's format and recorded by rank 0 in metrics.jsonl. */
#include "train/train_impl.h"

#include <math.h>
#include <stdio.h>
#include <sys/resource.h>

void fl_train_window_reset(trainer *t, train_window *w) {
    w->loss_sum = 0;
    w->correct = w->samples = 0;
    w->start = fl_now();
    w->bytes_sent = fl_dist_bytes_sent(t->dopt);
    w->updates = 0;
}

int fl_train_log_progress(trainer *t, train_window *w, int64_t epoch, int64_t step, double lr,
                          fl_train_result *res) {
    /* read before the allreduce below, whose few bytes count towards the next line */
    uint64_t bytes = fl_dist_bytes_sent(t->dopt);
    double sums[3] = {w->loss_sum, (double)w->correct, (double)w->samples};
    int rc = fl_comm_allreduce(fl_fleet_comm(t->fleet), sums, 3, FL_DTYPE_F64, FL_REDOP_SUM);
    if (rc < 0)
        return fl_fail_prefix(rc, "step %lld: summing the progress line's loss over ranks",
                              (long long)step);
    double now = fl_now();
    double loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    double acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    double ips = now > w->start ? sums[2] / (now - w->start) : 0.0;
    double comm_mb = (double)(bytes - w->bytes_sent) / 1e6;
    double step_ms = w->updates > 0 ? (now - w->start) * 1e3 / (double)w->updates : NAN;
    /* memory: the network's planned activations (recompute shrinks them) and the process's
     * peak resident set so far */
    double act_mb = (double)fl_net_activation_bytes(t->net) / 1e6;
    struct rusage ru;
    double peak_mb = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 / 1e6 : NAN;
    /* and on a device that counts it, the most device memory held at once */
    const fl_backend *k = fl_net_backend(t->net);
    double dev_mb = k->memory_peak ? (double)k->memory_peak() / 1e6 : NAN;
    printf("worker_index: %d, epoch %lld, step %lld, loss %.4f, acc1 %.4f, lr %.4f, "
           "ips %.1f img/s, comm %.1f MB, act %.1f MB, peak %.0f MB",
           t->rank, (long long)epoch, (long long)step, loss, acc, lr, ips, comm_mb, act_mb,
           peak_mb);
    if (k->memory_peak)
        printf(", dev_peak %.0f MB", dev_mb);
    /* strategy.amp: the scale the next update uses, and the updates skipped so far */
    fl_dist_stats st;
    fl_dist_get_stats(t->dopt, &st);
    if (!isnan(st.loss_scale))
        printf(", loss_scale %g, skipped %lld", st.loss_scale, (long long)st.skipped);
    printf("\n");
    fflush(stdout);
    res->last_loss = loss;
    w->loss_sum = 0;
    w->correct = w->samples = 0;
    w->start = now;
    w->bytes_sent = bytes;
    w->updates = 0;
    if (!t->metrics)
        return FL_OK;
    fl_metrics_begin(t->metrics);
    fl_metrics_str(t->metrics, "phase", "train");
    fl_metrics_int(t->metrics, "epoch", epoch);
    fl_metrics_int(t->metrics, "step", step);
    fl_metrics_num(t->metrics, "loss", loss);
    fl_metrics_num(t->metrics, "acc1", acc);
    fl_metrics_num(t->metrics, "lr", lr);
    fl_metrics_num(t->metrics, "ips", ips);
    fl_metrics_num(t->metrics, "comm_mb", comm_mb);
    fl_metrics_int(t->metrics, "workers", t->world);
    fl_metrics_num(t->metrics, "time", now - t->start_time);
    fl_metrics_num(t->metrics, "step_ms", step_ms);
    fl_metrics_int(t->metrics, "bytes_sent", (int64_t)bytes);
    fl_metrics_int(t->metrics, "synced_steps", st.synced);
    fl_metrics_num(t->metrics, "act_mb", act_mb);
    fl_metrics_num(t->metrics, "peak_mb", peak_mb);
    if (k->memory_peak)
        fl_metrics_num(t->metrics, "dev_peak_mb", dev_mb);
    if (st.interval > 0)
        fl_metrics_int(t->metrics, "localsgd_k", st.interval);
    if (!isnan(st.sparsity))
        fl_metrics_num(t->metrics, "dgc_sparsity", st.sparsity);
    if (!isnan(st.loss_scale)) {
        fl_metrics_num(t->metrics, "loss_scale", st.loss_scale);
        fl_metrics_int(t->metrics, "skipped_steps", st.skipped);
    }
    if (st.pairs > 0)
        fl_metrics_num(t->metrics, "dgc_dropped", (double)st.dropped / (double)st.pairs);
    return fl_metrics_end(t->metrics);
}
