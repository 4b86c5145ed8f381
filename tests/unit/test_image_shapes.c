/* test_image_shapes.c - the synthetic shapes task: a pure function of (seed, split, index),
 * splits and seeds that differ, every class drawn, values about normalised, the colour part of
 * the class visible in the pixels (a crude classifier reads it), and bad arguments refused. */
#include "fleet/data.h"
#include "fleet/status.h"
#include "test.h"

#define S 32
#define NUMEL (3 * S * S)

static void test_deterministic(void) {
    fl_dataset *a = fl_dataset_shapes_create(100, 10, S, 5, 0);
    fl_dataset *b = fl_dataset_shapes_create(100, 10, S, 5, 0);
    fl_dataset *v = fl_dataset_shapes_create(100, 10, S, 5, 1);
    fl_dataset *c = fl_dataset_shapes_create(100, 10, S, 6, 0);
    CHECK(a && b && v && c);
    CHECK(a->ndim == 3 && a->shape[0] == 3 && a->shape[1] == S && a->sample_numel == NUMEL);
    float xa[NUMEL], xb[NUMEL];
    int32_t la, lb;
    int same_split = 0, same_seed = 0;
    for (int i = 0; i < 100; i++) {
        CHECK_OK(fl_dataset_get(a, i, xa, &la));
        CHECK_OK(fl_dataset_get(b, i, xb, &lb));
        CHECK(memcmp(xa, xb, sizeof xa) == 0 && la == lb);
        CHECK_OK(fl_dataset_get(v, i, xb, &lb));
        same_split += memcmp(xa, xb, sizeof xa) == 0;
        CHECK_OK(fl_dataset_get(c, i, xb, &lb));
        same_seed += memcmp(xa, xb, sizeof xa) == 0;
    }
    CHECK(same_split == 0 && same_seed == 0);
    fl_dataset_free(a);
    fl_dataset_free(b);
    fl_dataset_free(v);
    fl_dataset_free(c);
}

static void test_statistics(void) {
    fl_dataset *ds = fl_dataset_shapes_create(1000, 10, S, 1, 0);
    int count[10] = {0}, palette_right = 0;
    double sum = 0, sum2 = 0;
    float x[NUMEL];
    int32_t label;
    for (int i = 0; i < 1000; i++) {
        CHECK_OK(fl_dataset_get(ds, i, x, &label));
        CHECK(label >= 0 && label < 10);
        if (label < 0 || label >= 10)
            continue;
        count[label]++;
        /* the shape's pixels are the ones farthest from the image's mean colour; warm shapes
         * (classes 0-4) have red above blue there, cool ones (5-9) blue above red */
        double m[3] = {0, 0, 0};
        for (int c = 0; c < 3; c++)
            for (int k = 0; k < S * S; k++)
                m[c] += x[c * S * S + k] / (S * S);
        double rb = 0;
        int n = 0;
        for (int k = 0; k < S * S; k++) {
            double d = 0;
            for (int c = 0; c < 3; c++)
                d += fabs(x[c * S * S + k] - m[c]);
            if (d > 2.0) {
                rb += x[k] - x[2 * S * S + k];
                n++;
            }
        }
        palette_right += (rb > 0) == (label < 5);
        for (int k = 0; k < NUMEL; k++) {
            CHECK(isfinite(x[k]));
            sum += x[k];
            sum2 += (double)x[k] * x[k];
        }
    }
    for (int c = 0; c < 10; c++)
        CHECK(count[c] > 60 && count[c] < 140);
    CHECK(palette_right > 950);
    double mean = sum / (1000.0 * NUMEL), sd = sqrt(sum2 / (1000.0 * NUMEL) - mean * mean);
    CHECK(fabs(mean) < 1.0 && sd > 0.3 && sd < 3.0);
    fl_dataset_free(ds);
}

static void test_bad_args(void) {
    CHECK(fl_dataset_shapes_create(10, 1, S, 0, 0) == NULL);
    CHECK_MSG("classes 1 outside [2, 10]");
    CHECK(fl_dataset_shapes_create(10, 11, S, 0, 0) == NULL);
    CHECK(fl_dataset_shapes_create(10, 5, 4, 0, 0) == NULL);
    CHECK_MSG("image size 4");
    CHECK(fl_dataset_shapes_create(-1, 5, S, 0, 0) == NULL);
    CHECK(fl_dataset_shapes_create(10, 5, S, 0, 256) == NULL);
    fl_dataset *ok = fl_dataset_shapes_create(3, 5, 8, 0, 2);
    CHECK(ok && ok->size == 3 && ok->num_classes == 5);
    float x[3 * 8 * 8];
    int32_t l;
    CHECK_RC(fl_dataset_get(ok, 3, x, &l), FL_EINVAL);
    fl_dataset_free(ok);
}

int main(void) {
    test_deterministic();
    test_statistics();
    test_bad_args();
    TEST_DONE();
}
