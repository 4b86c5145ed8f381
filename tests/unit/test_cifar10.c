/* test_cifar10.c - the CIFAR-10 binary reader on files this test writes in the format (a label
 * byte and three 1024-byte planes per record): round trip of pixels and labels, augmentation as
 * a padded crop and flip of the original (checked against a direct reference), reproducible per
 * (seed, epoch, index), and truncated, missing or mislabelled files refused naming the file. */
#include "fleet/data.h"
#include "fleet/status.h"
#include "test.h"

#include <unistd.h>

#define REC 3073

static char dir[64];
static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, stdv[3] = {0.2470f, 0.2435f, 0.2616f};

static uint8_t pixel(int rec, int c, int y, int x) {
    return (uint8_t)(rec * 31 + c * 77 + y * 5 + x * 3);
}

/* Writes `n` records numbered from first into name; label = record % 10. */
static void write_batch(const char *name, int first, int n, long truncate_to) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    uint8_t *buf = malloc((size_t)n * REC);
    for (int r = 0; r < n; r++) {
        uint8_t *rec = buf + (size_t)r * REC;
        rec[0] = (uint8_t)((first + r) % 10);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 32; y++)
                for (int x = 0; x < 32; x++)
                    rec[1 + c * 1024 + y * 32 + x] = pixel(first + r, c, y, x);
    }
    fwrite(buf, 1, truncate_to >= 0 ? (size_t)truncate_to : (size_t)n * REC, f);
    fclose(f);
    free(buf);
}

static void write_all(void) {
    const int counts[5] = {3, 2, 4, 1, 2};
    int first = 0;
    char name[32];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", i + 1);
        write_batch(name, first, counts[i], -1);
        first += counts[i];
    }
    write_batch("test_batch.bin", 100, 5, -1);
}

static void test_round_trip(void) {
    fl_dataset *tr = fl_dataset_cifar10_create(dir, true, false, 0);
    fl_dataset *te = fl_dataset_cifar10_create(dir, false, false, 0);
    CHECK(tr && te);
    if (!tr || !te)
        return;
    CHECK(tr->size == 12 && te->size == 5 && tr->num_classes == 10);
    CHECK(tr->ndim == 3 && tr->shape[0] == 3 && tr->shape[1] == 32 && tr->shape[2] == 32);
    float x[3072], want[3072];
    int32_t label;
    for (int i = 0; i < 12 + 5; i++) {
        int rec = i < 12 ? i : 100 + i - 12;
        CHECK_OK(fl_dataset_get_ex(i < 12 ? tr : te, i < 12 ? i : i - 12, 3, x, &label));
        CHECK(label == rec % 10);
        for (int c = 0; c < 3; c++)
            for (int k = 0; k < 1024; k++)
                want[c * 1024 + k] = (pixel(rec, c, k / 32, k % 32) / 255.0f - mean[c]) / stdv[c];
        CHECK_CLOSE_F32("cifar pixels", x, want, 3072, 1e-5, 1e-5);
    }
    fl_dataset_free(tr);
    fl_dataset_free(te);
}

/* Does x equal record rec zero-padded by 4, cropped at (dy, dx) and flipped when flip? */
static bool is_crop(const float *x, int rec, int dy, int dx, int flip) {
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 32; y++)
            for (int xo = 0; xo < 32; xo++) {
                int sy = y + dy - 4, sx = (flip ? 31 - xo : xo) + dx - 4;
                float v = sy >= 0 && sy < 32 && sx >= 0 && sx < 32 ? pixel(rec, c, sy, sx) : 0.0f;
                if (fabsf(x[c * 1024 + y * 32 + xo] - (v / 255.0f - mean[c]) / stdv[c]) > 1e-4f)
                    return false;
            }
    return true;
}

static void test_augment(void) {
    fl_dataset *a = fl_dataset_cifar10_create(dir, true, true, 9);
    fl_dataset *b = fl_dataset_cifar10_create(dir, true, true, 9);
    CHECK(a && b);
    if (!a || !b)
        return;
    float x[3072], y[3072];
    int32_t la, lb;
    int flips = 0, shifted = 0, differ_epoch = 0;
    for (int e = 0; e < 4; e++)
        for (int i = 0; i < 12; i++) {
            CHECK_OK(fl_dataset_get_ex(a, i, e, x, &la));
            CHECK_OK(fl_dataset_get_ex(b, i, e, y, &lb));
            CHECK(memcmp(x, y, sizeof x) == 0 && la == lb && la == i % 10);
            int found = 0;
            for (int dy = 0; dy <= 8 && !found; dy++)
                for (int dx = 0; dx <= 8 && !found; dx++)
                    for (int f = 0; f < 2 && !found; f++)
                        if (is_crop(x, i, dy, dx, f)) {
                            found = 1;
                            flips += f;
                            shifted += dy != 4 || dx != 4;
                        }
            CHECK(found);
            CHECK_OK(fl_dataset_get_ex(a, i, e + 1, y, &lb));
            differ_epoch += memcmp(x, y, sizeof x) != 0;
        }
    CHECK(flips > 5 && flips < 43);    /* 48 draws of p = 1/2 */
    CHECK(shifted > 30);               /* 80 of 81 offsets move the image */
    CHECK(differ_epoch > 40);
    fl_dataset_free(a);
    fl_dataset_free(b);
}

static void test_bad_files(void) {
    write_batch("data_batch_3.bin", 5, 4, 2 * REC + 100); /* truncated mid-record */
    CHECK(fl_dataset_cifar10_create(dir, true, false, 0) == NULL);
    CHECK_MSG("data_batch_3.bin: 6246 bytes is not a whole number of 3073-byte records");
    write_batch("data_batch_3.bin", 5, 4, 0); /* empty */
    CHECK(fl_dataset_cifar10_create(dir, true, false, 0) == NULL);
    CHECK_MSG("data_batch_3.bin: 0 bytes");
    write_batch("data_batch_3.bin", 5, 4, -1);
    char path[128];
    snprintf(path, sizeof path, "%s/data_batch_5.bin", dir);
    unlink(path);
    CHECK(fl_dataset_cifar10_create(dir, true, false, 0) == NULL);
    CHECK_MSG("data_batch_5.bin: cannot open");
    write_batch("data_batch_5.bin", 11, 2, -1);
    /* a label byte above 9 */
    snprintf(path, sizeof path, "%s/test_batch.bin", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, REC, SEEK_SET);
    fputc(10, f);
    fclose(f);
    CHECK(fl_dataset_cifar10_create(dir, false, false, 0) == NULL);
    CHECK_MSG("test_batch.bin: record 1: label 10 outside [0, 10)");
    fl_dataset *ok = fl_dataset_cifar10_create(dir, true, false, 0);
    CHECK(ok && ok->size == 12);
    fl_dataset_free(ok);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/fl_cifar.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    write_all();
    test_round_trip();
    test_augment();
    test_bad_files();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
