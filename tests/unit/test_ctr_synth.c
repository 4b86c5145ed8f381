/* test_ctr_synth.c - the synthetic CTR task: the Zipf sampler against its law, samples that
 * depend on (seed, split, index) alone, exact sharding of steps over ranks, the positive rate
 * near 0.26, a popular head and a thin tail, the best AUC against a direct computation, and
 * lines in Criteo's format that the reader turns back into the same samples. */
#include "fleet/ctr.h"
#include "fleet/status.h"
#include "test.h"

#include "data/zipf.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int batches_equal(const fl_ctr_batch *a, const fl_ctr_batch *b) {
    if (a->batch != b->batch || a->ndense != b->ndense || a->nslots != b->nslots)
        return 0;
    int64_t n = fl_ctr_batch_nids(a);
    return n == fl_ctr_batch_nids(b) &&
           !memcmp(a->labels, b->labels, (size_t)a->batch * sizeof *a->labels) &&
           !memcmp(a->dense, b->dense, (size_t)(a->batch * a->ndense) * sizeof *a->dense) &&
           !memcmp(a->offsets, b->offsets, (size_t)(a->batch * a->nslots + 1) * 8) &&
           !memcmp(a->ids, b->ids, (size_t)n * sizeof *a->ids);
}

static void test_zipf(void) {
    /* frequencies of 1..10 within 5 sigma of k^-s / sum_j j^-s, for s = 1.1 and s = 1 */
    double ss[2] = {1.1, 1.0};
    for (int t = 0; t < 2; t++) {
        fl_zipf z;
        CHECK_OK(fl_zipf_init(&z, 10, ss[t]));
        enum { DRAWS = 200000 };
        int64_t count[11] = {0};
        fl_rng r;
        fl_rng_init(&r, 5, (uint64_t)t);
        for (int i = 0; i < DRAWS; i++) {
            int64_t k = fl_zipf_sample(&z, &r);
            CHECK(k >= 1 && k <= 10);
            if (k >= 1 && k <= 10)
                count[k]++;
        }
        double norm = 0;
        for (int k = 1; k <= 10; k++)
            norm += pow(k, -ss[t]);
        for (int k = 1; k <= 10; k++) {
            double pk = pow(k, -ss[t]) / norm, sd = sqrt(DRAWS * pk * (1 - pk));
            CHECK_NEAR((double)count[k], DRAWS * pk, 5 * sd);
        }
    }
    /* a range of 10^8: draws stay inside, the first value is the most common */
    fl_zipf z;
    CHECK_OK(fl_zipf_init(&z, 100000000, 1.1));
    fl_rng r;
    fl_rng_init(&r, 6, 0);
    int64_t ones = 0, big = 0;
    for (int i = 0; i < 100000; i++) {
        int64_t k = fl_zipf_sample(&z, &r);
        CHECK(k >= 1 && k <= 100000000);
        ones += k == 1;
        big += k > 1000000;
    }
    CHECK(ones > 10000); /* P(1) is about 0.11 at s = 1.1 over 10^8 */
    CHECK(big > 0);
    CHECK_RC(fl_zipf_init(&z, 0, 1.1), FL_EINVAL);
    CHECK_RC(fl_zipf_init(&z, 10, 0), FL_EINVAL);
}

static fl_ctr_synth_config small_cfg(void) {
    fl_ctr_synth_config c = fl_ctr_synth_config_default();
    c.seed = 42;
    c.vocab = 1000;
    return c;
}

static void test_determinism_and_sharding(void) {
    fl_ctr_synth_config c = small_cfg();
    c.max_ids = 3;
    fl_ctr_synth *a = fl_ctr_synth_create(&c), *b = fl_ctr_synth_create(&c);
    CHECK(a && b);
    if (!a || !b)
        return;
    CHECK(fl_ctr_synth_bias(a) == fl_ctr_synth_bias(b));
    fl_ctr_batch x, y, one;
    CHECK_OK(fl_ctr_batch_init(&x, 13, 26, 4, 16));
    CHECK_OK(fl_ctr_batch_init(&y, 13, 26, 4, 16));
    CHECK_OK(fl_ctr_batch_init(&one, 13, 26, 4, 16));
    /* the same samples from two instances, and in any order */
    CHECK_OK(fl_ctr_synth_batch(a, 3, 0, 1, 50, &x));
    for (int64_t i = 0; i < 50; i++)
        CHECK_OK(fl_ctr_synth_add(b, 150 + i, &y, NULL));
    CHECK(batches_equal(&x, &y));
    for (int k = 0; k < 26; k++)
        CHECK(fl_ctr_synth_weight(a, k, 17) == fl_ctr_synth_weight(b, k, 17));
    /* ids carry their slot; bags hold 1..3 ids or none (missing) */
    int bad = 0;
    for (int64_t i = 0; i < x.batch; i++)
        for (int s = 0; s < 26; s++) {
            int64_t n;
            const uint64_t *ids = fl_ctr_bag(&x, i, s, &n);
            bad += n > 3;
            for (int64_t j = 0; j < n; j++)
                bad += fl_ctr_id_slot(ids[j]) != s;
        }
    CHECK(bad == 0);
    /* step 2 over 3 ranks of 7 = step 2 of one rank of 21... as samples [42*... ) */
    fl_ctr_batch_clear(&y);
    for (int r = 0; r < 3; r++) {
        CHECK_OK(fl_ctr_synth_batch(a, 2, r, 3, 7, &one));
        for (int64_t i = 0; i < one.batch; i++) {
            int32_t counts[26];
            for (int s = 0; s < 26; s++)
                counts[s] = (int32_t)(one.offsets[i * 26 + s + 1] - one.offsets[i * 26 + s]);
            CHECK_OK(fl_ctr_batch_add(&y, one.labels[i], one.dense + i * 13,
                                      one.ids + one.offsets[i * 26], counts));
        }
    }
    CHECK_OK(fl_ctr_synth_batch(a, 2, 0, 1, 21, &x));
    CHECK(batches_equal(&x, &y));
    /* a copy into a smaller batch grows it */
    fl_ctr_batch cp;
    CHECK_OK(fl_ctr_batch_init(&cp, 13, 26, 1, 1));
    CHECK_OK(fl_ctr_batch_copy(&cp, &x));
    CHECK(batches_equal(&cp, &x) && cp.cap_samples >= 21);
    fl_ctr_batch_free(&cp);
    fl_ctr_batch_free(&cp); /* twice is a no-op */
    /* another split, another seed: other samples */
    fl_ctr_synth_config c1 = c;
    c1.split = 1;
    fl_ctr_synth *v = fl_ctr_synth_create(&c1);
    CHECK(v != NULL);
    CHECK(v && fl_ctr_synth_bias(v) == fl_ctr_synth_bias(a)); /* one teacher */
    CHECK_OK(fl_ctr_synth_batch(v, 2, 0, 1, 21, &y));
    CHECK(!batches_equal(&x, &y));
    c1.split = 0;
    c1.seed = 43;
    fl_ctr_synth *o = fl_ctr_synth_create(&c1);
    CHECK(o && fl_ctr_synth_weight(o, 0, 17) != fl_ctr_synth_weight(a, 0, 17));
    CHECK_RC(fl_ctr_synth_add(a, -1, &x, NULL), FL_EINVAL);
    CHECK_RC(fl_ctr_synth_add(a, (int64_t)1 << 40, &x, NULL), FL_EINVAL);
    fl_ctr_synth_free(o);
    fl_ctr_synth_free(v);
    fl_ctr_batch_free(&x);
    fl_ctr_batch_free(&y);
    fl_ctr_batch_free(&one);
    fl_ctr_synth_free(a);
    fl_ctr_synth_free(b);
}

typedef struct {
    uint64_t id;
    int      v;
} id_value;

static int by_id(const void *a, const void *b) {
    uint64_t x = ((const id_value *)a)->id, y = ((const id_value *)b)->id;
    return (x > y) - (x < y);
}

static void test_rate_and_popularity(void) {
    fl_ctr_synth_config c = small_cfg();
    fl_ctr_synth *s = fl_ctr_synth_create(&c);
    CHECK(s != NULL);
    if (!s)
        return;
    enum { N = 100000 };
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, 13, 26, N, N * 26));
    for (int64_t i = 0; i < N; i++)
        CHECK_OK(fl_ctr_synth_add(s, i, &b, NULL));
    double pos = 0;
    for (int64_t i = 0; i < b.batch; i++)
        pos += b.labels[i];
    fprintf(stderr, "positive rate %.4f over %d samples (bias %.4f)\n", pos / N, N,
            fl_ctr_synth_bias(s));
    CHECK_NEAR(pos / N, 0.26, 0.01);
    /* slot 0's ids by value: the id of value v is the hash of "%08x" */
    id_value idv[1000];
    for (uint32_t v = 0; v < 1000; v++) {
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", v);
        idv[v] = (id_value){fl_ctr_id(0, fl_ctr_hash(hex, 8)), (int)v};
    }
    qsort(idv, 1000, sizeof *idv, by_id);
    int64_t count[1000] = {0}, unknown = 0, missing = 0;
    for (int64_t i = 0; i < b.batch; i++) {
        int64_t n;
        const uint64_t *ids = fl_ctr_bag(&b, i, 0, &n);
        missing += n == 0;
        for (int64_t j = 0; j < n; j++) {
            id_value key = {ids[j], 0};
            const id_value *hit = bsearch(&key, idv, 1000, sizeof *idv, by_id);
            if (!hit)
                unknown++;
            else
                count[hit->v]++;
        }
    }
    CHECK(unknown == 0);
    CHECK_NEAR((double)missing / N, 0.1, 0.01);
    int64_t head = 0, tail = 0;
    for (int v = 0; v < 10; v++)
        head += count[v];
    for (int v = 500; v < 1000; v++)
        tail += count[v];
    fprintf(stderr, "slot 0: values 0..9 drawn %lld times, 500..999 %lld times\n",
            (long long)head, (long long)tail);
    CHECK(head > 2 * tail);
    CHECK(count[0] > count[1] && count[1] > count[9] && count[9] > count[999]);
    fl_ctr_batch_free(&b);
    fl_ctr_synth_free(s);
}

typedef struct {
    double p;
    int    y;
} pair_t;

static int by_p(const void *a, const void *b) {
    double x = ((const pair_t *)a)->p, y = ((const pair_t *)b)->p;
    return (x > y) - (x < y);
}

static void test_best_auc(void) {
    fl_ctr_synth_config c = small_cfg();
    c.split = 1;
    fl_ctr_synth *s = fl_ctr_synth_create(&c);
    CHECK(s != NULL);
    if (!s)
        return;
    enum { N = 20000 };
    double auc = 0;
    CHECK_OK(fl_ctr_synth_best_auc(s, N, &auc));
    /* direct: each positive against each negative, by sorting; ties count one half */
    pair_t *v = malloc(N * sizeof *v);
    fl_ctr_batch b;
    CHECK_OK(fl_ctr_batch_init(&b, 13, 26, 1, 26));
    for (int64_t i = 0; i < N; i++) {
        fl_ctr_batch_clear(&b);
        CHECK_OK(fl_ctr_synth_add(s, i, &b, &v[i].p));
        v[i].y = b.labels[0];
    }
    qsort(v, N, sizeof *v, by_p);
    double pairs = 0, below = 0, pos = 0;
    for (int i = 0; i < N;) {
        int j = i;
        double gp = 0, gn = 0;
        for (; j < N && v[j].p == v[i].p; j++) {
            gp += v[j].y;
            gn += 1 - v[j].y;
        }
        pairs += gp * (below + 0.5 * gn);
        below += gn;
        pos += gp;
        i = j;
    }
    double direct = pairs / (pos * below);
    fprintf(stderr, "best AUC %.6f over %d validation samples\n", auc, N);
    CHECK(auc > 0.5);
    CHECK_NEAR(auc, direct, 1e-12);
    CHECK_RC(fl_ctr_synth_best_auc(s, 1, &auc), FL_EINVAL);
    free(v);
    fl_ctr_batch_free(&b);
    fl_ctr_synth_free(s);
}

static void test_lines_round_trip(void) {
    fl_ctr_synth_config c = small_cfg();
    c.max_ids = 3;
    c.missing = 0.3;
    for (int t = 0; t < 2; t++) {
        c.transform = t ? FL_CTR_DENSE_LOG : FL_CTR_DENSE_MINMAX;
        fl_ctr_synth *s = fl_ctr_synth_create(&c);
        CHECK(s != NULL);
        if (!s)
            return;
        fl_criteo_format f = fl_criteo_format_default();
        f.transform = c.transform;
        f.missing_id = false;
        fl_ctr_batch from_lines, direct;
        CHECK_OK(fl_ctr_batch_init(&from_lines, 13, 26, 1, 1));
        CHECK_OK(fl_ctr_batch_init(&direct, 13, 26, 1, 1));
        size_t cap = fl_ctr_synth_line_max(s);
        char *line = malloc(cap);
        for (int64_t i = 0; i < 300; i++) {
            double p1, p2;
            int len = fl_ctr_synth_line(s, i, line, cap, &p1);
            CHECK(len > 0 && (size_t)len == strlen(line));
            CHECK_OK(fl_criteo_parse_line(&f, line, (size_t)len, &from_lines));
            CHECK_OK(fl_ctr_synth_add(s, i, &direct, &p2));
            CHECK(p1 == p2);
        }
        CHECK(batches_equal(&from_lines, &direct));
        CHECK_RC(fl_ctr_synth_line(s, 0, line, cap - 1, NULL), FL_EINVAL);
        free(line);
        fl_ctr_batch_free(&from_lines);
        fl_ctr_batch_free(&direct);
        fl_ctr_synth_free(s);
    }
}

static void test_bad_config(void) {
    fl_ctr_synth_config c = small_cfg();
    c.vocab = 0;
    CHECK(fl_ctr_synth_create(&c) == NULL);
    CHECK_MSG("vocab");
    c = small_cfg();
    c.ndense = 5; /* minmax has 13 columns */
    CHECK(fl_ctr_synth_create(&c) == NULL);
    CHECK_MSG("transform");
    c = small_cfg();
    c.ctr = 1.0;
    CHECK(fl_ctr_synth_create(&c) == NULL);
    CHECK_MSG("ctr");
}

int main(void) {
    test_zipf();
    test_determinism_and_sharding();
    test_rate_and_popularity();
    test_best_auc();
    test_lines_round_trip();
    test_bad_config();
    TEST_DONE();
}
