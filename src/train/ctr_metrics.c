/* ctr_metrics.c - the metrics of a CTR model: AUC bucketed as Paddle's auc operator does it
 * (paddle/phi/kernels/cpu/auc_kernel.cc: histograms of predictions by label, trapezoids over
 * the ROC curve), log loss, predicted and actual CTR. One array of doubles holds everything so
 * that workers merge with a single sum. */
#include "fleet/metrics.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_EPS 1e-15

/* the four sums after the histograms */
enum { SUM_LOSS, SUM_PRED, SUM_COUNT, SUM_CLICKS, NSUMS };

static double *sums(const fl_ctr_metrics *m) {
    return m->data + 2 * ((size_t)m->num_thresholds + 1);
}

int fl_ctr_metrics_init(fl_ctr_metrics *m, int num_thresholds) {
    memset(m, 0, sizeof *m);
    if (num_thresholds < 1 || num_thresholds > (1 << 24))
        return fl_fail(FL_EINVAL, "ctr metrics: num_thresholds %d outside [1, 2^24]",
                       num_thresholds);
    size_t n = 2 * ((size_t)num_thresholds + 1) + NSUMS;
    m->data = calloc(n, sizeof *m->data);
    if (!m->data)
        return fl_fail(FL_ENOMEM, "ctr metrics: out of memory");
    m->num_thresholds = num_thresholds;
    m->numel = n;
    return FL_OK;
}

void fl_ctr_metrics_free(fl_ctr_metrics *m) {
    if (!m)
        return;
    free(m->data);
    memset(m, 0, sizeof *m);
}

void fl_ctr_metrics_reset(fl_ctr_metrics *m) {
    memset(m->data, 0, m->numel * sizeof *m->data);
}

int fl_ctr_metrics_add(fl_ctr_metrics *m, const float *p, const int32_t *labels, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!(p[i] >= 0.0f && p[i] <= 1.0f))
            return fl_fail(FL_EINVAL, "ctr metrics: prediction %lld is %g, not a probability "
                           "in [0, 1]", (long long)i, (double)p[i]);
        if (labels[i] != 0 && labels[i] != 1)
            return fl_fail(FL_EINVAL, "ctr metrics: label %lld is %d, not 0 or 1",
                           (long long)i, (int)labels[i]);
    }
    int T = m->num_thresholds;
    double *pos = m->data, *neg = m->data + T + 1, *s = sums(m);
    for (int64_t i = 0; i < n; i++) {
        /* the kernel's bucket: a float product truncated (p = 1 lands in bucket T) */
        uint32_t bin = (uint32_t)(p[i] * (float)T);
        double q = fmin(fmax((double)p[i], LOSS_EPS), 1.0 - LOSS_EPS);
        if (labels[i]) {
            pos[bin] += 1;
            s[SUM_LOSS] -= log(q);
        } else {
            neg[bin] += 1;
            s[SUM_LOSS] -= log1p(-q);
        }
        s[SUM_PRED] += p[i];
        s[SUM_CLICKS] += labels[i];
    }
    s[SUM_COUNT] += (double)n;
    return FL_OK;
}

int fl_ctr_metrics_merge(fl_ctr_metrics *m, const fl_ctr_metrics *other) {
    if (other->num_thresholds != m->num_thresholds)
        return fl_fail(FL_EINVAL, "ctr metrics: cannot merge %d thresholds into %d",
                       other->num_thresholds, m->num_thresholds);
    for (size_t i = 0; i < m->numel; i++)
        m->data[i] += other->data[i];
    return FL_OK;
}

double fl_ctr_metrics_auc(const fl_ctr_metrics *m) {
    int T = m->num_thresholds;
    const double *pos = m->data, *neg = m->data + T + 1;
    /* from the highest bucket down, each bucket moves the ROC point from (fp, tp) to
     * (fp + neg, tp + pos); the area under that step is a trapezoid */
    double area = 0, tp = 0, fp = 0;
    for (int b = T; b >= 0; b--) {
        double tp1 = tp + pos[b], fp1 = fp + neg[b];
        area += (fp1 - fp) * (tp1 + tp) * 0.5;
        tp = tp1;
        fp = fp1;
    }
    return tp > 0 && fp > 0 ? area / tp / fp : area;
}

double fl_ctr_metrics_logloss(const fl_ctr_metrics *m) {
    const double *s = sums(m);
    return s[SUM_COUNT] > 0 ? s[SUM_LOSS] / s[SUM_COUNT] : NAN;
}

double fl_ctr_metrics_pred_ctr(const fl_ctr_metrics *m) {
    const double *s = sums(m);
    return s[SUM_COUNT] > 0 ? s[SUM_PRED] / s[SUM_COUNT] : NAN;
}

double fl_ctr_metrics_actual_ctr(const fl_ctr_metrics *m) {
    const double *s = sums(m);
    return s[SUM_COUNT] > 0 ? s[SUM_CLICKS] / s[SUM_COUNT] : NAN;
}

double fl_ctr_metrics_count(const fl_ctr_metrics *m) {
    return sums(m)[SUM_COUNT];
}
