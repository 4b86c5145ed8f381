/* test_auc.c - the CTR metrics: Paddle's bucketed AUC against a direct rank AUC (exactly where
 * predictions sit on bucket edges, within the bucket resolution on random ones), ties, the
 * all-positive, all-negative and empty cases (0, as Paddle's kernel leaves them), merged
 * histograms equal to one, log loss and CTRs against direct sums, and refused inputs. */
#include "fleet/metrics.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    double p;
    int    y;
} pair_t;

static int by_p(const void *a, const void *b) {
    double x = ((const pair_t *)a)->p, y = ((const pair_t *)b)->p;
    return (x > y) - (x < y);
}

/* The exact AUC by ranks: for each positive, the negatives below it plus half the tied ones. */
static double rank_auc(const float *p, const int32_t *y, int64_t n) {
    pair_t *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (pair_t){p[i], y[i]};
    qsort(v, (size_t)n, sizeof *v, by_p);
    double pairs = 0, below = 0, pos = 0;
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        double gp = 0, gn = 0;
        for (; j < n && v[j].p == v[i].p; j++) {
            gp += v[j].y;
            gn += 1 - v[j].y;
        }
        pairs += gp * (below + 0.5 * gn);
        below += gn;
        pos += gp;
        i = j;
    }
    free(v);
    return pairs / (pos * below);
}

static void random_data(uint64_t seed, int64_t n, float *p, int32_t *y, int quantum) {
    fl_rng r;
    fl_rng_init(&r, seed, 0);
    for (int64_t i = 0; i < n; i++) {
        double q = fl_rng_uniform_f64(&r);
        p[i] = quantum ? (float)((double)fl_rng_below(&r, (uint64_t)quantum + 1) / quantum)
                       : (float)q;
        /* labels correlated with p so the AUC is well above 0.5 */
        y[i] = fl_rng_uniform_f64(&r) < 0.2 + 0.6 * p[i];
    }
}

static void test_exact_on_bucket_edges(void) {
    /* with T = 1024 every k / 1024 is a float whose bucket is k: the bucketed AUC is the
     * exact rank AUC with ties */
    enum { N = 5000 };
    float p[N];
    int32_t y[N];
    random_data(7, N, p, y, 1024);
    fl_ctr_metrics m;
    CHECK_OK(fl_ctr_metrics_init(&m, 1024));
    CHECK_OK(fl_ctr_metrics_add(&m, p, y, N));
    CHECK_NEAR(fl_ctr_metrics_auc(&m), rank_auc(p, y, N), 1e-12);
    /* and coarse predictions (17 values): heavy ties */
    random_data(8, N, p, y, 16);
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, p, y, N));
    CHECK_NEAR(fl_ctr_metrics_auc(&m), rank_auc(p, y, N), 1e-12);
    fl_ctr_metrics_free(&m);
}

static void test_random_within_resolution(void) {
    enum { N = 20000 };
    float *p = malloc(N * sizeof *p);
    int32_t *y = malloc(N * sizeof *y);
    random_data(9, N, p, y, 0);
    fl_ctr_metrics m;
    CHECK_OK(fl_ctr_metrics_init(&m, FL_AUC_THRESHOLDS));
    CHECK_OK(fl_ctr_metrics_add(&m, p, y, N));
    /* a positive-negative pair in one bucket counts 1/2 instead of 0 or 1: the difference is
     * at most half the share of such pairs */
    const double *pos = m.data, *neg = m.data + FL_AUC_THRESHOLDS + 1;
    double same = 0, P = 0, Nn = 0;
    for (int b = 0; b <= FL_AUC_THRESHOLDS; b++) {
        same += pos[b] * neg[b];
        P += pos[b];
        Nn += neg[b];
    }
    double bound = 0.5 * same / (P * Nn), exact = rank_auc(p, y, N);
    double got = fl_ctr_metrics_auc(&m);
    CHECK(bound < 1e-3);
    CHECK(fabs(got - exact) <= bound + 1e-12);
    CHECK(exact > 0.6);
    fprintf(stderr, "random: bucketed %.6f exact %.6f bound %.2e\n", got, exact, bound);
    fl_ctr_metrics_free(&m);
    free(p);
    free(y);
}

static void test_special_cases(void) {
    fl_ctr_metrics m;
    CHECK_OK(fl_ctr_metrics_init(&m, FL_AUC_THRESHOLDS));
    CHECK(fl_ctr_metrics_auc(&m) == 0.0); /* empty */
    CHECK(isnan(fl_ctr_metrics_logloss(&m)));
    float p[4] = {0.1f, 0.4f, 0.6f, 0.9f};
    int32_t ones[4] = {1, 1, 1, 1}, zeros[4] = {0, 0, 0, 0}, sep[4] = {0, 0, 1, 1},
            rev[4] = {1, 1, 0, 0};
    CHECK_OK(fl_ctr_metrics_add(&m, p, ones, 4));
    CHECK(fl_ctr_metrics_auc(&m) == 0.0); /* all positive: Paddle's undivided area, 0 */
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, p, zeros, 4));
    CHECK(fl_ctr_metrics_auc(&m) == 0.0); /* all negative */
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, p, sep, 4));
    CHECK(fl_ctr_metrics_auc(&m) == 1.0);
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, p, rev, 4));
    CHECK(fl_ctr_metrics_auc(&m) == 0.0);
    /* all tied: 0.5 */
    float same[4] = {0.3f, 0.3f, 0.3f, 0.3f};
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, same, sep, 4));
    CHECK(fl_ctr_metrics_auc(&m) == 0.5);
    /* Paddle's bucket of p = 1 is the last, T; of p = 0 the first */
    float ends[2] = {0.0f, 1.0f};
    int32_t ly[2] = {0, 1};
    fl_ctr_metrics_reset(&m);
    CHECK_OK(fl_ctr_metrics_add(&m, ends, ly, 2));
    CHECK(m.data[FL_AUC_THRESHOLDS] == 1.0);                /* pos[T] */
    CHECK(m.data[FL_AUC_THRESHOLDS + 1] == 1.0);            /* neg[0] */
    CHECK(fl_ctr_metrics_auc(&m) == 1.0);
    CHECK(isfinite(fl_ctr_metrics_logloss(&m)));            /* clipped, not inf */
    fl_ctr_metrics_free(&m);
}

static void test_merge_and_sums(void) {
    enum { N = 3000 };
    float p[N];
    int32_t y[N];
    random_data(11, N, p, y, 0);
    fl_ctr_metrics whole, part[3];
    CHECK_OK(fl_ctr_metrics_init(&whole, FL_AUC_THRESHOLDS));
    CHECK_OK(fl_ctr_metrics_add(&whole, p, y, N));
    for (int k = 0; k < 3; k++) {
        CHECK_OK(fl_ctr_metrics_init(&part[k], FL_AUC_THRESHOLDS));
        CHECK_OK(fl_ctr_metrics_add(&part[k], p + k * 1000, y + k * 1000, 1000));
    }
    CHECK_OK(fl_ctr_metrics_merge(&part[0], &part[1]));
    CHECK_OK(fl_ctr_metrics_merge(&part[0], &part[2]));
    int same = 1;
    for (int b = 0; b < 2 * (FL_AUC_THRESHOLDS + 1); b++)
        same &= part[0].data[b] == whole.data[b];
    CHECK(same);
    CHECK(fl_ctr_metrics_auc(&part[0]) == fl_ctr_metrics_auc(&whole));
    CHECK(fl_ctr_metrics_count(&part[0]) == N);
    /* direct sums */
    double loss = 0, pred = 0, clicks = 0;
    for (int i = 0; i < N; i++) {
        loss -= y[i] ? log((double)p[i]) : log(1.0 - (double)p[i]);
        pred += p[i];
        clicks += y[i];
    }
    CHECK_NEAR(fl_ctr_metrics_logloss(&part[0]), loss / N, 1e-12);
    CHECK_NEAR(fl_ctr_metrics_logloss(&whole), loss / N, 1e-12);
    CHECK_NEAR(fl_ctr_metrics_pred_ctr(&whole), pred / N, 1e-12);
    CHECK_NEAR(fl_ctr_metrics_actual_ctr(&whole), clicks / N, 1e-15);
    fl_ctr_metrics other;
    CHECK_OK(fl_ctr_metrics_init(&other, 200));
    CHECK_RC(fl_ctr_metrics_merge(&whole, &other), FL_EINVAL);
    CHECK_MSG("200");
    fl_ctr_metrics_free(&other);
    fl_ctr_metrics_free(&whole);
    for (int k = 0; k < 3; k++)
        fl_ctr_metrics_free(&part[k]);
}

static void test_refused(void) {
    fl_ctr_metrics m;
    CHECK_OK(fl_ctr_metrics_init(&m, FL_AUC_THRESHOLDS));
    float p[3] = {0.5f, 1.5f, 0.2f};
    int32_t y[3] = {0, 1, 0};
    CHECK_RC(fl_ctr_metrics_add(&m, p, y, 3), FL_EINVAL);
    CHECK_MSG("prediction 1 is 1.5");
    CHECK(fl_ctr_metrics_count(&m) == 0); /* nothing added */
    p[1] = NAN;
    CHECK_RC(fl_ctr_metrics_add(&m, p, y, 3), FL_EINVAL);
    p[1] = 0.5f;
    y[2] = 2;
    CHECK_RC(fl_ctr_metrics_add(&m, p, y, 3), FL_EINVAL);
    CHECK_MSG("label 2 is 2");
    fl_ctr_metrics_free(&m);
    CHECK_RC(fl_ctr_metrics_init(&m, 0), FL_EINVAL);
    CHECK(m.data == NULL);
}

int main(void) {
    test_exact_on_bucket_edges();
    test_random_within_resolution();
    test_special_cases();
    test_merge_and_sums();
    test_refused();
    TEST_DONE();
}
