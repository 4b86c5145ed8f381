/* test_prefetch.c - the threaded, prefetching loader against the single-threaded fl_loader: the
 * same bytes, labels and batch sizes for every rank, batch size, worker count, queue depth,
 * shuffle and drop_last setting, across epochs, seeks and skipped samples; errors reported with
 * the sample and repeated until a seek; bad configs refused; freeing mid-epoch never hangs. */
#include "fleet/data.h"
#include "fleet/status.h"
#include "test.h"

#include <time.h>

/* A dataset whose samples depend on (index, epoch): skipped when index % 5 == skip_mod5, a
 * failure at index fail_at, a short sleep per sample when slow. */
typedef struct {
    int     skip_mod5; /* -1: none */
    int64_t fail_at;   /* -1: none */
    bool    slow;
} probe_impl;

static int probe_get_ex(fl_dataset *ds, int64_t index, int64_t epoch, float *x, int32_t *label) {
    const probe_impl *p = ds->impl;
    if (p->slow) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    if (index == p->fail_at)
        return fl_fail(FL_EFORMAT, "probe: bad sample %lld", (long long)index);
    if (p->skip_mod5 >= 0 && index % 5 == p->skip_mod5)
        return FL_DATASET_SKIP;
    for (int j = 0; j < 3; j++)
        x[j] = (float)(index * 1000 + epoch * 10 + j);
    *label = (int32_t)(index % 7);
    return FL_OK;
}
static int probe_get(fl_dataset *ds, int64_t index, float *x, int32_t *label) {
    return probe_get_ex(ds, index, 0, x, label);
}
static const fl_dataset_ops probe_ops = {
    .name = "probe", .get = probe_get, .get_ex = probe_get_ex, .destroy = NULL};

static fl_dataset probe(int64_t size, probe_impl *impl) {
    return (fl_dataset){.ops = &probe_ops, .size = size, .ndim = 1, .shape = {3},
                        .sample_numel = 3, .num_classes = 7, .impl = impl};
}

/* Runs both loaders side by side over the given (epoch, step) seeks, checking every batch. */
static void compare(fl_dataset *ds, fl_loader_config lc, int workers, int prefetch,
                    const int64_t (*seeks)[2], int nseeks) {
    fl_loader *a = fl_loader_create(ds, &lc);
    fl_prefetch_config pc = {.base = lc, .num_workers = workers, .prefetch = prefetch};
    fl_prefetch *b = fl_prefetch_create(ds, &pc);
    CHECK(a && b);
    if (!a || !b) {
        fl_loader_free(a);
        fl_prefetch_free(b);
        return;
    }
    CHECK(fl_loader_steps_per_epoch(a) == fl_prefetch_steps_per_epoch(b));
    for (int s = 0; s < nseeks; s++) {
        CHECK_OK(fl_loader_seek(a, seeks[s][0], seeks[s][1]));
        CHECK_OK(fl_prefetch_seek(b, seeks[s][0], seeks[s][1]));
        for (;;) {
            const fl_tensor *xa, *xb;
            const int32_t *ya, *yb;
            int ra = fl_loader_next(a, &xa, &ya), rb = fl_prefetch_next(b, &xb, &yb);
            CHECK(ra == rb);
            if (ra != 1 || rb != 1)
                break;
            CHECK(xa->ndim == xb->ndim && xb->ndim == ds->ndim + 1 &&
                  memcmp(xa->shape, xb->shape, sizeof(int64_t) * (size_t)xa->ndim) == 0);
            if (xa->numel == xb->numel) {
                CHECK(memcmp(xa->data, xb->data, (size_t)xa->numel * sizeof(float)) == 0);
                CHECK(memcmp(ya, yb, (size_t)xa->shape[0] * sizeof *ya) == 0);
            }
        }
    }
    CHECK(fl_loader_skipped(a) == fl_prefetch_skipped(b));
    fl_loader_free(a);
    fl_prefetch_free(b);
}

static void test_equal_to_loader(void) {
    probe_impl plain = {.skip_mod5 = -1, .fail_at = -1}, skipping = {.skip_mod5 = 2, .fail_at = -1};
    const int64_t seeks[][2] = {{0, 0}, {1, 0}, {2, 1}, {0, 3}, {0, 0}};
    const int64_t sizes[] = {4, 23, 40};
    const int64_t batches[] = {1, 4, 7};
    const int kinds[][2] = {{0, 1}, {1, 1}, {2, 3}, {4, 2}};
    for (int si = 0; si < 3; si++)
        for (int bi = 0; bi < 3; bi++)
            for (int world = 1; world <= 3; world++)
                for (int flags = 0; flags < 4; flags++) {
                    fl_loader_config lc = {.batch_size = batches[bi], .shuffle = flags & 1,
                                           .drop_last = flags & 2, .seed = 17, .world = world,
                                           .rank = world - 1};
                    if (lc.drop_last && sizes[si] < world * batches[bi])
                        continue;
                    fl_dataset ds = probe(sizes[si], (flags & 1) ? &skipping : &plain);
                    int64_t steps = lc.drop_last ? sizes[si] / (world * batches[bi])
                                                 : (sizes[si] + world * batches[bi] - 1) /
                                                       (world * batches[bi]);
                    int nseeks = steps >= 3 ? 5 : 2;
                    int k = (si + bi + world + flags) % 4;
                    compare(&ds, lc, kinds[k][0], kinds[k][1], seeks, nseeks);
                }
    /* the skipped count is the number of skipped samples met */
    fl_dataset ds = probe(23, &skipping);
    fl_prefetch_config pc = {.base = {.batch_size = 4, .shuffle = true, .seed = 1, .world = 1},
                             .num_workers = 3, .prefetch = 2};
    fl_prefetch *p = fl_prefetch_create(&ds, &pc);
    const fl_tensor *x;
    const int32_t *y;
    int64_t n = 0;
    while (fl_prefetch_next(p, &x, &y) == 1)
        n += x->shape[0];
    CHECK(n == 23 - 5 && fl_prefetch_skipped(p) == 5); /* indices 2, 7, 12, 17, 22 */
    fl_prefetch_free(p);
}

static void test_errors(void) {
    probe_impl failing = {.skip_mod5 = -1, .fail_at = 13};
    fl_dataset ds = probe(30, &failing);
    for (int workers = 0; workers <= 3; workers += 3) {
        fl_prefetch_config pc = {.base = {.batch_size = 8, .shuffle = false, .world = 1},
                                 .num_workers = workers, .prefetch = 2};
        fl_prefetch *p = fl_prefetch_create(&ds, &pc);
        const fl_tensor *x;
        const int32_t *y;
        CHECK(fl_prefetch_next(p, &x, &y) == 1);
        CHECK_RC(fl_prefetch_next(p, &x, &y), FL_EFORMAT); /* batch 1 holds sample 13 */
        CHECK_MSG("epoch 0 step 1 sample 13: probe: bad sample 13");
        fl_clear_error();
        CHECK_RC(fl_prefetch_next(p, &x, &y), FL_EFORMAT); /* again, until a seek */
        CHECK_MSG("bad sample 13");
        CHECK_OK(fl_prefetch_seek(p, 0, 2));
        CHECK(fl_prefetch_next(p, &x, &y) == 1 && ((float *)x->data)[0] == 16000.0f);
        CHECK_RC(fl_prefetch_seek(p, 0, 5), FL_EINVAL);
        CHECK_MSG("step 5 outside [0, 4]");
        CHECK_RC(fl_prefetch_seek(p, -1, 0), FL_EINVAL);
        fl_prefetch_free(p);
    }
    fl_loader_config lc = {.batch_size = 8, .world = 1};
    fl_prefetch_config pc = {.base = lc, .num_workers = -1, .prefetch = 2};
    CHECK(fl_prefetch_create(&ds, &pc) == NULL);
    CHECK_MSG("num_workers");
    pc.num_workers = 2;
    pc.prefetch = 0;
    CHECK(fl_prefetch_create(&ds, &pc) == NULL);
    CHECK_MSG("prefetch 0");
    pc.prefetch = 2;
    pc.base.rank = 1;
    CHECK(fl_prefetch_create(&ds, &pc) == NULL);
    CHECK_MSG("rank 1 outside [0, 1)");
    pc.base = (fl_loader_config){.batch_size = 40, .drop_last = true, .world = 1};
    CHECK(fl_prefetch_create(&ds, &pc) == NULL);
    CHECK_MSG("fewer than one global batch");
}

/* Freed at every point of an epoch while slow workers are busy: returns, no leak (ASan). */
static void test_free_mid_epoch(void) {
    probe_impl slow = {.skip_mod5 = -1, .fail_at = -1, .slow = true};
    fl_dataset ds = probe(64, &slow);
    for (int consumed = 0; consumed < 4; consumed++) {
        fl_prefetch_config pc = {.base = {.batch_size = 4, .shuffle = true, .world = 2, .rank = 1},
                                 .num_workers = 3, .prefetch = 3};
        fl_prefetch *p = fl_prefetch_create(&ds, &pc);
        const fl_tensor *x;
        const int32_t *y;
        for (int i = 0; i < consumed; i++)
            CHECK(fl_prefetch_next(p, &x, &y) == 1);
        if (consumed == 2)
            CHECK_OK(fl_prefetch_seek(p, 5, 1)); /* a seek with batches in flight */
        fl_prefetch_free(p);
    }
    fl_prefetch_free(NULL);
}

/* Real datasets through the prefetcher: the teacher (get only) and the shapes task. */
static void test_real_datasets(void) {
    fl_dataset *t = fl_dataset_teacher_create(50, 8, 16, 3, 4, 0);
    fl_dataset *s = fl_dataset_shapes_create(30, 10, 16, 4, 0);
    const int64_t seeks[][2] = {{0, 0}, {1, 0}, {3, 2}};
    fl_loader_config lc = {.batch_size = 6, .shuffle = true, .seed = 3, .world = 2, .rank = 0};
    compare(t, lc, 2, 2, seeks, 3);
    lc.rank = 1;
    compare(s, lc, 3, 1, seeks, 3);
    fl_dataset_free(t);
    fl_dataset_free(s);
}

int main(void) {
    test_equal_to_loader();
    test_errors();
    test_free_mid_epoch();
    test_real_datasets();
    TEST_DONE();
}
