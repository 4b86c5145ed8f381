/* test_data.c - the synthetic datasets (determinism, ranges, balance, splits) and the sharded
 * loader: every sample once per epoch, the union over ranks equals the single-worker batch of
 * world * B, seek equals iterating, bad configs refused with messages. */
#include "fleet/data.h"
#include "fleet/status.h"
#include "test.h"

#include <stdint.h>

/* --- a dataset whose sample i is x = (i, -i), label i % 7: the loader's order made visible */
static int index_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    (void)ds;
    x[0] = (float)index;
    x[1] = -(float)index;
    *label = (int32_t)(index % 7);
    return FL_OK;
}
static const fl_dataset_ops index_ops = {.name = "index", .get = index_get};

static fl_dataset index_dataset(int64_t n) {
    fl_dataset ds = {.ops = &index_ops, .size = n, .ndim = 1, .sample_numel = 2, .num_classes = 7};
    ds.shape[0] = 2;
    return ds;
}

static int same_sample(fl_dataset *a, fl_dataset *b, int64_t i) {
    float xa[64], xb[64];
    int32_t la = -1, lb = -2;
    if (fl_dataset_get(a, i, xa, &la) < 0 || fl_dataset_get(b, i, xb, &lb) < 0)
        return 0;
    return la == lb && memcmp(xa, xb, (size_t)a->sample_numel * sizeof(float)) == 0;
}

static void test_random(void) {
    fl_dataset *a = fl_dataset_random_create(10000, 32, 2, 7);
    fl_dataset *b = fl_dataset_random_create(10000, 32, 2, 7);
    fl_dataset *c = fl_dataset_random_create(10000, 32, 2, 8);
    CHECK(a && b && c);
    if (!a || !b || !c)
        goto out;
    CHECK(a->ndim == 1 && a->shape[0] == 32 && a->sample_numel == 32 && a->num_classes == 2);
    CHECK(strcmp(a->ops->name, "random") == 0);

    int same = 1, differ = 0;
    for (int64_t i = 0; i < 200; i++) {
        same &= same_sample(a, b, i);
        differ += !same_sample(a, c, i);
    }
    CHECK(same);
    CHECK(differ == 200);

    /* range and balance over 10000 samples */
    float x[32];
    int32_t label;
    int64_t ones = 0, bad_x = 0, bad_label = 0;
    double sum = 0;
    for (int64_t i = 0; i < a->size; i++) {
        CHECK_OK(fl_dataset_get(a, i, x, &label));
        for (int j = 0; j < 32; j++) {
            bad_x += !(x[j] >= 0.0f && x[j] < 1.0f);
            sum += x[j];
        }
        bad_label += label != 0 && label != 1;
        ones += label == 1;
    }
    CHECK(bad_x == 0);
    CHECK(bad_label == 0);
    CHECK(ones >= 4500 && ones <= 5500);
    CHECK_NEAR(sum / (32.0 * (double)a->size), 0.5, 0.01);

    /* random access: the order of requests does not matter */
    float x5a[32], x5b[32], x3[32];
    int32_t l5a, l5b, l3;
    CHECK_OK(fl_dataset_get(a, 5, x5a, &l5a));
    CHECK_OK(fl_dataset_get(a, 3, x3, &l3));
    CHECK_OK(fl_dataset_get(a, 5, x5b, &l5b));
    CHECK(l5a == l5b && memcmp(x5a, x5b, sizeof x5a) == 0);
    fl_dataset *d = fl_dataset_random_create(10, 32, 2, 7);
    CHECK(d && same_sample(a, d, 3) && same_sample(a, d, 9)); /* size does not change samples */
    fl_dataset_free(d);

    /* out of range */
    CHECK_RC(fl_dataset_get(a, 10000, x, &label), FL_EINVAL);
    CHECK_MSG("dataset 'random'");
    CHECK_MSG("10000");
    CHECK_RC(fl_dataset_get(a, -1, x, &label), FL_EINVAL);
    CHECK_MSG("-1");

    /* bad arguments */
    CHECK(fl_dataset_random_create(10, 0, 2, 1) == NULL);
    CHECK_MSG("features");
    CHECK(fl_dataset_random_create(10, 4, 1, 1) == NULL);
    CHECK_MSG("classes");
    CHECK(fl_dataset_random_create(-1, 4, 2, 1) == NULL);
    CHECK_MSG("size");
out:
    fl_dataset_free(a);
    fl_dataset_free(b);
    fl_dataset_free(c);
    fl_dataset_free(NULL);
}

static void test_teacher_balance(int classes, int64_t features, int64_t hidden, uint64_t seed) {
    fl_dataset *ds = fl_dataset_teacher_create(5000, features, hidden, classes, seed, 0);
    CHECK(ds);
    if (!ds)
        return;
    int64_t count[16] = {0};
    float x[64];
    int32_t label;
    int bad = 0;
    for (int64_t i = 0; i < ds->size; i++) {
        CHECK_OK(fl_dataset_get(ds, i, x, &label));
        if (label < 0 || label >= classes)
            bad++;
        else
            count[label]++;
    }
    CHECK(bad == 0);
    for (int c = 0; c < classes; c++) {
        if (count[c] * 4 * classes < ds->size) {
            fprintf(stderr, "teacher classes=%d seed=%llu: class %d has %lld of %lld samples\n",
                    classes, (unsigned long long)seed, c, (long long)count[c],
                    (long long)ds->size);
            test_failures++;
        }
    }
    fl_dataset_free(ds);
}

static void test_teacher(void) {
    fl_dataset *a = fl_dataset_teacher_create(3000, 32, 64, 10, 11, 0);
    fl_dataset *b = fl_dataset_teacher_create(3000, 32, 64, 10, 11, 0);
    fl_dataset *v = fl_dataset_teacher_create(3000, 32, 64, 10, 11, 1);
    fl_dataset *o = fl_dataset_teacher_create(3000, 32, 64, 10, 12, 0);
    CHECK(a && b && v && o);
    if (!a || !b || !v || !o)
        goto out;
    CHECK(strcmp(a->ops->name, "teacher") == 0);
    CHECK(a->ndim == 1 && a->shape[0] == 32 && a->num_classes == 10 && a->size == 3000);

    /* deterministic across creations; validation and train streams differ; another teacher
     * labels the same kind of inputs differently */
    int same = 1, split_same_x = 0;
    int64_t label_agree = 0;
    float xa[32], xv[32], xo[32];
    int32_t la, lv, lo;
    double sum = 0, sumsq = 0;
    for (int64_t i = 0; i < a->size; i++) {
        same &= same_sample(a, b, i);
        CHECK_OK(fl_dataset_get(a, i, xa, &la));
        CHECK_OK(fl_dataset_get(v, i, xv, &lv));
        CHECK_OK(fl_dataset_get(o, i, xo, &lo));
        split_same_x += memcmp(xa, xv, sizeof xa) == 0;
        label_agree += la == lo;
        for (int j = 0; j < 32; j++) {
            sum += xa[j];
            sumsq += (double)xa[j] * xa[j];
        }
    }
    CHECK(same);
    CHECK(split_same_x == 0);
    double n = 32.0 * (double)a->size;
    CHECK_NEAR(sum / n, 0.0, 0.02);        /* x ~ N(0, 1) */
    CHECK_NEAR(sumsq / n, 1.0, 0.03);
    /* the other teacher draws the same x stream layout from another seed: its labels are not
     * this teacher's (10 classes: agreement near 10%) */
    CHECK(label_agree < a->size / 4);

    CHECK_RC(fl_dataset_get(a, 3000, xa, &la), FL_EINVAL);
    CHECK_MSG("dataset 'teacher'");
    CHECK_MSG("3000");

    /* bad arguments */
    CHECK(fl_dataset_teacher_create(10, 4, 8, 2, 1, 2) == NULL);
    CHECK_MSG("split");
    CHECK(fl_dataset_teacher_create(10, 4, 0, 2, 1, 0) == NULL);
    CHECK_MSG("hidden");
    CHECK(fl_dataset_teacher_create(10, 4, 8, 1, 1, 0) == NULL);
    CHECK_MSG("classes");
out:
    fl_dataset_free(a);
    fl_dataset_free(b);
    fl_dataset_free(v);
    fl_dataset_free(o);

    for (uint64_t seed = 1; seed <= 3; seed++) {
        test_teacher_balance(2, 32, 64, seed);
        test_teacher_balance(10, 32, 64, seed);
        test_teacher_balance(10, 8, 16, seed);
    }
}

/* The labels are a function of x that generalises: 1-nearest-neighbour on the train split
 * predicts the validation split far above chance (an independent check that label = f(x)). */
static void test_teacher_learnable(void) {
    enum { F = 4, NTRAIN = 2000, NVAL = 300, C = 3 };
    fl_dataset *tr = fl_dataset_teacher_create(NTRAIN, F, 16, C, 5, 0);
    fl_dataset *va = fl_dataset_teacher_create(NVAL, F, 16, C, 5, 1);
    static float xt[NTRAIN][F];
    static int32_t lt[NTRAIN];
    CHECK(tr && va);
    if (!tr || !va)
        goto out;
    for (int i = 0; i < NTRAIN; i++)
        CHECK_OK(fl_dataset_get(tr, i, xt[i], &lt[i]));
    int correct = 0;
    for (int i = 0; i < NVAL; i++) {
        float x[F];
        int32_t label;
        CHECK_OK(fl_dataset_get(va, i, x, &label));
        double best = INFINITY;
        int32_t pred = -1;
        for (int j = 0; j < NTRAIN; j++) {
            double d = 0;
            for (int k = 0; k < F; k++)
                d += ((double)x[k] - xt[j][k]) * ((double)x[k] - xt[j][k]);
            if (d < best) {
                best = d;
                pred = lt[j];
            }
        }
        correct += pred == label;
    }
    fprintf(stderr, "teacher 1-NN accuracy: %.3f (chance %.3f)\n", (double)correct / NVAL,
            1.0 / C);
    CHECK(correct > NVAL * 7 / 10);
out:
    fl_dataset_free(tr);
    fl_dataset_free(va);
}

/* Collects one epoch of a loader's sample indices into out (appending); returns the count of
 * samples, or -1 on a malformed batch. *steps receives the number of batches. */
static int64_t collect_epoch(fl_loader *l, int64_t epoch, int64_t *out, int64_t *steps) {
    const fl_tensor *x;
    const int32_t *labels;
    int64_t n = 0;
    *steps = 0;
    if (fl_loader_seek(l, epoch, 0) < 0)
        return -1;
    int rc;
    while ((rc = fl_loader_next(l, &x, &labels)) == 1) {
        (*steps)++;
        const float *xd = x->data;
        if (x->ndim != 2 || x->shape[1] != 2 || x->numel != x->shape[0] * 2)
            return -1;
        for (int64_t i = 0; i < x->shape[0]; i++) {
            int64_t idx = (int64_t)xd[2 * i];
            if (xd[2 * i + 1] != -xd[2 * i] || labels[i] != idx % 7)
                return -1;
            out[n++] = idx;
        }
    }
    return rc == 0 ? n : -1;
}

static int is_permutation(const int64_t *v, int64_t n) {
    char seen[1024] = {0};
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= n || seen[v[i]])
            return 0;
        seen[v[i]] = 1;
    }
    return 1;
}

static void test_loader_single(void) {
    fl_dataset ds = index_dataset(103);
    fl_loader_config cfg = {.batch_size = 5, .shuffle = true, .seed = 42, .rank = 0, .world = 1};
    fl_loader *l = fl_loader_create(&ds, &cfg);
    fl_loader *l2 = fl_loader_create(&ds, &cfg);
    cfg.seed = 43;
    fl_loader *l3 = fl_loader_create(&ds, &cfg);
    cfg.seed = 42;
    cfg.shuffle = false;
    fl_loader *seq = fl_loader_create(&ds, &cfg);
    CHECK(l && l2 && l3 && seq);
    if (!l || !l2 || !l3 || !seq)
        goto out;
    CHECK(fl_loader_steps_per_epoch(l) == 21);

    int64_t e0[103], e1[103], e0b[103], e0c[103], s0[103], steps;
    CHECK(collect_epoch(l, 0, e0, &steps) == 103 && steps == 21);
    CHECK(is_permutation(e0, 103));
    CHECK(collect_epoch(l, 1, e1, &steps) == 103 && steps == 21);
    CHECK(is_permutation(e1, 103));
    CHECK(memcmp(e0, e1, sizeof e0) != 0);           /* epochs differ */
    CHECK(collect_epoch(l2, 0, e0b, &steps) == 103);
    CHECK(memcmp(e0, e0b, sizeof e0) == 0);          /* same seed, same order */
    CHECK(collect_epoch(l3, 0, e0c, &steps) == 103);
    CHECK(memcmp(e0, e0c, sizeof e0) != 0);          /* another seed, another order */
    CHECK(collect_epoch(l, 0, e0b, &steps) == 103);  /* back to epoch 0 after epoch 1 */
    CHECK(memcmp(e0, e0b, sizeof e0) == 0);
    CHECK(collect_epoch(seq, 3, s0, &steps) == 103); /* no shuffle: 0, 1, 2, ... every epoch */
    int sequential = 1;
    for (int64_t i = 0; i < 103; i++)
        sequential &= s0[i] == i;
    CHECK(sequential);

    /* after the last batch, next keeps returning 0 until a seek */
    const fl_tensor *x;
    const int32_t *labels;
    CHECK(fl_loader_next(l, &x, &labels) == 0);
    CHECK(fl_loader_next(l, &x, &labels) == 0);
    CHECK_OK(fl_loader_seek(l, 0, 20));
    CHECK(fl_loader_next(l, &x, &labels) == 1 && x->shape[0] == 3);
    CHECK(fl_loader_next(l, &x, &labels) == 0);
out:
    fl_loader_free(l);
    fl_loader_free(l2);
    fl_loader_free(l3);
    fl_loader_free(seq);
}

/* world ranks of batch B over n samples against one worker with batch world * B. */
static void test_loader_sharded(int world, int64_t n, int64_t B, bool drop_last) {
    fl_dataset ds = index_dataset(n);
    fl_loader_config one_cfg = {.batch_size = world * B, .shuffle = true, .drop_last = drop_last,
                                .seed = 9, .rank = 0, .world = 1};
    fl_loader *one = fl_loader_create(&ds, &one_cfg);
    fl_loader *ranks[8] = {0};
    int ok = one != NULL;
    for (int r = 0; r < world; r++) {
        fl_loader_config cfg = one_cfg;
        cfg.batch_size = B;
        cfg.rank = r;
        cfg.world = world;
        ranks[r] = fl_loader_create(&ds, &cfg);
        ok &= ranks[r] != NULL;
    }
    CHECK(ok);
    if (!ok)
        goto out;
    int64_t steps = fl_loader_steps_per_epoch(one);
    int64_t want_steps = drop_last ? n / (world * B) : (n + world * B - 1) / (world * B);
    CHECK(steps == want_steps);
    for (int r = 0; r < world; r++)
        CHECK(fl_loader_steps_per_epoch(ranks[r]) == steps);

    for (int64_t epoch = 0; epoch < 2; epoch++) {
        CHECK_OK(fl_loader_seek(one, epoch, 0));
        for (int r = 0; r < world; r++)
            CHECK_OK(fl_loader_seek(ranks[r], epoch, 0));
        int64_t seen[1024] = {0};
        int64_t total = 0;
        for (int64_t s = 0; s < steps; s++) {
            const fl_tensor *x;
            const int32_t *labels;
            CHECK(fl_loader_next(one, &x, &labels) == 1);
            int64_t want[1024], got[1024], nwant = x->shape[0], ngot = 0;
            for (int64_t i = 0; i < nwant; i++)
                want[i] = (int64_t)((const float *)x->data)[2 * i];
            for (int r = 0; r < world; r++) {
                const fl_tensor *xr;
                const int32_t *lr;
                CHECK(fl_loader_next(ranks[r], &xr, &lr) == 1);
                CHECK(xr->shape[0] >= 0 && xr->shape[0] <= B);
                for (int64_t i = 0; i < xr->shape[0]; i++) {
                    got[ngot] = (int64_t)((const float *)xr->data)[2 * i];
                    CHECK(lr[i] == got[ngot] % 7);
                    seen[got[ngot]]++;
                    ngot++;
                }
            }
            /* the ranks' slices in rank order are exactly the single worker's batch */
            CHECK(ngot == nwant && memcmp(got, want, (size_t)nwant * sizeof *want) == 0);
            total += ngot;
        }
        /* every rank is then at the end of the epoch, all after the same number of steps */
        const fl_tensor *x;
        const int32_t *labels;
        for (int r = 0; r < world; r++)
            CHECK(fl_loader_next(ranks[r], &x, &labels) == 0);
        int once = 1, at_most_once = 1;
        for (int64_t i = 0; i < n; i++) {
            once &= seen[i] == 1;
            at_most_once &= seen[i] <= 1;
        }
        if (drop_last) {
            CHECK(total == steps * world * B);
            CHECK(at_most_once);
        } else {
            CHECK(total == n);
            CHECK(once);
        }
    }

    /* seek(epoch, step) gives what iterating from the epoch's start gives at that step */
    for (int r = 0; r < world; r++) {
        int64_t target = steps / 2;
        fl_loader_config cfg = one_cfg;
        cfg.batch_size = B;
        cfg.rank = r;
        cfg.world = world;
        fl_loader *fresh = fl_loader_create(&ds, &cfg);
        CHECK(fresh != NULL);
        if (!fresh)
            break;
        const fl_tensor *x, *y;
        const int32_t *lx, *ly;
        CHECK_OK(fl_loader_seek(ranks[r], 3, 0));
        for (int64_t s = 0; s < target; s++)
            CHECK(fl_loader_next(ranks[r], &x, &lx) == 1);
        CHECK(fl_loader_next(ranks[r], &x, &lx) == 1);
        CHECK_OK(fl_loader_seek(fresh, 3, target));
        CHECK(fl_loader_next(fresh, &y, &ly) == 1);
        CHECK(x->shape[0] == y->shape[0]);
        CHECK(memcmp(x->data, y->data, (size_t)x->numel * sizeof(float)) == 0);
        CHECK(memcmp(lx, ly, (size_t)x->shape[0] * sizeof *lx) == 0);
        fl_loader_free(fresh);
    }
out:
    fl_loader_free(one);
    for (int r = 0; r < world; r++)
        fl_loader_free(ranks[r]);
}

static void test_loader_edges(void) {
    /* world 4, 103 samples, B 5: the last global batch has 3 samples, all on rank 0; ranks 1..3
     * still take that step with an empty batch */
    fl_dataset ds = index_dataset(103);
    fl_loader_config cfg = {.batch_size = 5, .seed = 1, .rank = 3, .world = 4};
    fl_loader *l = fl_loader_create(&ds, &cfg);
    CHECK(l != NULL);
    if (l) {
        CHECK(fl_loader_steps_per_epoch(l) == 6);
        const fl_tensor *x;
        const int32_t *labels;
        CHECK_OK(fl_loader_seek(l, 0, 5));
        CHECK(fl_loader_next(l, &x, &labels) == 1);
        CHECK(x->shape[0] == 0 && x->numel == 0 && x->ndim == 2);
        CHECK(fl_loader_next(l, &x, &labels) == 0);
        /* without shuffle, rank 3 of step 1 holds samples 35..39 */
        CHECK_OK(fl_loader_seek(l, 0, 1));
        CHECK(fl_loader_next(l, &x, &labels) == 1);
        CHECK(x->shape[0] == 5 && ((const float *)x->data)[0] == 35.0f &&
              ((const float *)x->data)[8] == 39.0f);
        /* seek bounds: steps_per_epoch itself is the end of the epoch */
        CHECK_OK(fl_loader_seek(l, 0, 6));
        CHECK(fl_loader_next(l, &x, &labels) == 0);
        CHECK_RC(fl_loader_seek(l, 0, 7), FL_EINVAL);
        CHECK_MSG("step 7");
        CHECK_RC(fl_loader_seek(l, -1, 0), FL_EINVAL);
        CHECK_MSG("epoch -1");
        fl_loader_free(l);
    }

    /* an empty dataset: no steps */
    fl_dataset empty = index_dataset(0);
    cfg.rank = 0;
    l = fl_loader_create(&empty, &cfg);
    CHECK(l != NULL);
    if (l) {
        const fl_tensor *x;
        const int32_t *labels;
        CHECK(fl_loader_steps_per_epoch(l) == 0);
        CHECK(fl_loader_next(l, &x, &labels) == 0);
        fl_loader_free(l);
    }
    fl_loader_free(NULL);
}

static void test_loader_bad_config(void) {
    fl_dataset ds = index_dataset(103);
    fl_loader_config good = {.batch_size = 5, .seed = 1, .rank = 0, .world = 2};
    fl_loader_config cfg = good;
    cfg.batch_size = 0;
    CHECK(fl_loader_create(&ds, &cfg) == NULL);
    CHECK_MSG("batch_size");
    cfg = good;
    cfg.world = 0;
    CHECK(fl_loader_create(&ds, &cfg) == NULL);
    CHECK_MSG("world");
    cfg = good;
    cfg.rank = 2;
    CHECK(fl_loader_create(&ds, &cfg) == NULL);
    CHECK_MSG("rank 2 outside [0, 2)");
    cfg.rank = -1;
    CHECK(fl_loader_create(&ds, &cfg) == NULL);
    CHECK_MSG("rank -1");

    fl_dataset *t = fl_dataset_teacher_create(100, 8, 8, 2, 1, 0);
    CHECK(t != NULL);
    if (t) {
        cfg = good;
        cfg.batch_size = 64;
        cfg.drop_last = true;
        CHECK(fl_loader_create(t, &cfg) == NULL);
        CHECK_MSG("dataset 'teacher' has 100 samples, fewer than one global batch of 2 x 64");
        cfg.drop_last = false; /* without drop_last a partial global batch is fine */
        fl_loader *l = fl_loader_create(t, &cfg);
        CHECK(l && fl_loader_steps_per_epoch(l) == 1);
        fl_loader_free(l);
    }
    fl_dataset_free(t);
}

int main(void) {
    test_random();
    test_teacher();
    test_teacher_learnable();
    test_loader_single();
    for (int world = 2; world <= 4; world++) {
        test_loader_sharded(world, 103, 5, false);
        test_loader_sharded(world, 103, 5, true);
        test_loader_sharded(world, 100, 5, false); /* divisible for world 2 and 4 */
    }
    test_loader_sharded(1, 103, 5, false);
    test_loader_sharded(3, 7, 1, false);
    test_loader_edges();
    test_loader_bad_config();
    TEST_DONE();
}
