/* metrics.h - metrics as JSON lines: one object per record, flushed as it is written, so a
 * crashed run keeps every record before the crash and any tool (jq, pandas) can read it.
 *
 *     fl_metrics_begin(m);
 *     fl_metrics_str(m, "phase", "train");
 *     fl_metrics_int(m, "step", 10);
 *     fl_metrics_num(m, "loss", 0.6931);
 *     fl_metrics_end(m);            // {"phase":"train","step":10,"loss":0.6931}\n
 *
 * Numbers are written with 17 significant digits (they read back exactly); NaN and infinities,
 * which JSON lacks, are written as null. Strings are escaped. Not thread-safe. */
#ifndef FLEET_METRICS_H
#define FLEET_METRICS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_metrics fl_metrics;

/* Opens (truncates) path for writing. NULL and fl_errmsg naming the path on failure. */
fl_metrics *fl_metrics_open(const char *path);
/* Closes the file. NULL is a no-op. */
void fl_metrics_close(fl_metrics *m);

void fl_metrics_begin(fl_metrics *m);
void fl_metrics_int(fl_metrics *m, const char *key, int64_t v);
void fl_metrics_num(fl_metrics *m, const char *key, double v);
void fl_metrics_str(fl_metrics *m, const char *key, const char *v);
/* Writes the record as one line and flushes; returns 0 or FL_EIO naming the path. */
int  fl_metrics_end(fl_metrics *m);


/* ---- CTR metrics (src/train/ctr_metrics.c) -------------------------------------------------
 * AUC as Paddle's auc operator computes it (paddle/phi/kernels/cpu/auc_kernel.cc, statAuc and
 * calcAuc): a prediction p in [0, 1] falls in bucket (uint32)(p * T) of T + 1 buckets (T =
 * num_thresholds, 4095 by default; p * T in float, as the kernel multiplies a float), counted in
 * a positive or a negative histogram; the ROC curve is walked from the top bucket down and its
 * area summed with the trapezoid rule, then divided by positives * negatives. Predictions in
 * one bucket are tied (a tie counts one half), so the AUC is the exact rank AUC of predictions
 * rounded down to multiples of 1/T. With no positives or no negatives Paddle's kernel leaves
 * the undivided area, which is 0: so is fl_ctr_metrics_auc.
 *
 * Beside the histograms: the sum of log losses, of predictions, the sample and click counts.
 * All of it is one array of doubles (counts are exact below 2^53), so workers merge their
 * metrics with one sum-allreduce of `data` (numel doubles), or fl_ctr_metrics_merge. */

#define FL_AUC_THRESHOLDS 4095

typedef struct {
    int     num_thresholds; /* T: T + 1 buckets */
    size_t  numel;          /* 2 * (T + 1) + 4 */
    double *data;           /* (NUMEL): pos (T + 1), neg (T + 1), loss_sum, pred_sum, count,
                             * clicks; owned */
} fl_ctr_metrics;

/* Zeroed metrics with num_thresholds in [1, 2^24]. FL_EINVAL, FL_ENOMEM (m left empty). */
int    fl_ctr_metrics_init(fl_ctr_metrics *m, int num_thresholds);
/* Frees data and empties m; an empty m is a no-op. */
void   fl_ctr_metrics_free(fl_ctr_metrics *m);
/* Zeroes every count and sum. */
void   fl_ctr_metrics_reset(fl_ctr_metrics *m);
/* Adds n predictions p[i] (probabilities of a click) with labels[i]. Checks all first: FL_EINVAL
 * naming the first index whose p is outside [0, 1] or NaN or whose label is not 0 or 1, and
 * nothing is added. The log loss of one sample is -log(p) or -log(1 - p) with p clipped to
 * [1e-15, 1 - 1e-15], in double. */
int    fl_ctr_metrics_add(fl_ctr_metrics *m, const float *p, const int32_t *labels, int64_t n);
/* m += other (the same num_thresholds, else FL_EINVAL): as if m had seen other's samples. */
int    fl_ctr_metrics_merge(fl_ctr_metrics *m, const fl_ctr_metrics *other);
/* The bucketed AUC above; 0 without positives or without negatives. */
double fl_ctr_metrics_auc(const fl_ctr_metrics *m);
/* Mean log loss, mean prediction (predicted CTR), fraction of positives (actual CTR); NaN
 * without samples. */
double fl_ctr_metrics_logloss(const fl_ctr_metrics *m);
double fl_ctr_metrics_pred_ctr(const fl_ctr_metrics *m);
double fl_ctr_metrics_actual_ctr(const fl_ctr_metrics *m);
/* Samples added (merged ones included). */
double fl_ctr_metrics_count(const fl_ctr_metrics *m);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_METRICS_H */
