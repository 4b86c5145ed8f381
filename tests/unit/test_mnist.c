/* test_mnist.c - the IDX reader and the MNIST-format dataset on small files this test writes,
 * gzip-compressed and plain: pixels and labels round-trip, normalisation uses the split's own
 * statistics or the ones given, the augmentation is a zero-padded crop (and optional flip) of the
 * original, reproducible per (seed, epoch, index); truncated, over-long, wrong-magic, corrupt
 * gzip and mismatched files are refused naming the file and what is wrong. */
#include "fleet/data.h"
#include "fleet/status.h"
#include "test.h"

#include <math.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define R 6 /* rows */
#define C 5 /* columns */

static char dir[64];

static uint8_t pixel(int i, int y, int x) { return (uint8_t)(i * 37 + y * 11 + x * 5 + 3); }

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* Writes bytes to dir/name, through gzip when the name ends in .gz. */
static void write_file(const char *name, const uint8_t *b, size_t n) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = strlen(name);
    if (len > 3 && strcmp(name + len - 3, ".gz") == 0) {
        gzFile f = gzopen(path, "wb");
        CHECK(f != NULL);
        CHECK(gzwrite(f, b, (unsigned)n) == (int)n);
        CHECK(gzclose(f) == Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        CHECK(fwrite(b, 1, n, f) == n);
        fclose(f);
    }
}

/* An image file of n images (R x C), with magic type/ndim as given; `cut` bytes dropped from
 * the end (negative: that many extra bytes appended). */
static void write_images(const char *name, int n, uint8_t type, long cut) {
    size_t size = 16 + (size_t)n * R * C;
    uint8_t *b = calloc(size + 8, 1);
    b[2] = type, b[3] = 3;
    put_u32(b + 4, (uint32_t)n), put_u32(b + 8, R), put_u32(b + 12, C);
    for (int i = 0; i < n; i++)
        for (int y = 0; y < R; y++)
            for (int x = 0; x < C; x++)
                b[16 + (size_t)i * R * C + y * C + x] = pixel(i, y, x);
    write_file(name, b, (size_t)((long)size - cut));
    free(b);
}

static void write_labels(const char *name, int n, int bad_at) {
    uint8_t *b = calloc(8 + (size_t)n, 1);
    b[2] = 0x08, b[3] = 1;
    put_u32(b + 4, (uint32_t)n);
    for (int i = 0; i < n; i++)
        b[8 + i] = (uint8_t)(i == bad_at ? 12 : i % 10);
    write_file(name, b, 8 + (size_t)n);
    free(b);
}

static void rm(const char *name) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    unlink(path);
}

static void test_idx_reader(void) {
    char path[160];
    fl_idx idx;
    write_images("a.gz", 3, 0x08, 0);
    snprintf(path, sizeof path, "%s/a.gz", dir);
    CHECK(fl_idx_read(path, &idx) == FL_OK);
    CHECK(idx.ndim == 3 && idx.dims[0] == 3 && idx.dims[1] == R && idx.dims[2] == C);
    CHECK(idx.data[2 * R * C + 4 * C + 1] == pixel(2, 4, 1));
    fl_idx_free(&idx);
    write_images("a", 3, 0x08, 0); /* plain: the same path through gzread */
    snprintf(path, sizeof path, "%s/a", dir);
    CHECK(fl_idx_read(path, &idx) == FL_OK);
    CHECK(idx.dims[0] == 3 && idx.data[R * C] == pixel(1, 0, 0));
    fl_idx_free(&idx);

    write_images("t.gz", 3, 0x08, 7); /* truncated inside the data */
    snprintf(path, sizeof path, "%s/t.gz", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG(path);
    CHECK_MSG("truncated");
    CHECK(idx.data == NULL);
    write_images("h", 3, 0x08, (long)(16 + 3 * R * C - 6)); /* truncated inside the header */
    snprintf(path, sizeof path, "%s/h", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG("truncated");
    write_images("l", 3, 0x08, -3); /* longer than announced */
    snprintf(path, sizeof path, "%s/l", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG("longer than its header says");
    write_images("f", 3, 0x0D, 0); /* floats: not read */
    snprintf(path, sizeof path, "%s/f", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG("element type 0x0d");
    uint8_t png[24] = {0x89, 'P', 'N', 'G'};
    write_file("m", png, sizeof png); /* wrong magic */
    snprintf(path, sizeof path, "%s/m", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG("not an IDX file");

    /* a gzip stream corrupted in the middle: zlib's reason, not garbage pixels */
    write_images("c.gz", 40, 0x08, 0);
    snprintf(path, sizeof path, "%s/c.gz", dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size / 2, SEEK_SET);
    uint8_t junk[16];
    memset(junk, 0xA5, sizeof junk);
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    CHECK(fl_idx_read(path, &idx) == FL_EFORMAT);
    CHECK_MSG(path);

    snprintf(path, sizeof path, "%s/absent", dir);
    CHECK(fl_idx_read(path, &idx) == FL_EIO);
    CHECK_MSG("absent");
    fl_idx_free(&idx); /* empty: a no-op */
}

static fl_mnist_config config(bool train) {
    fl_mnist_config mc = fl_mnist_config_default();
    mc.dir = dir;
    mc.train = train;
    return mc;
}

static void test_dataset(void) {
    write_images("train-images-idx3-ubyte.gz", 7, 0x08, 0);
    write_labels("train-labels-idx1-ubyte.gz", 7, -1);
    write_images("t10k-images-idx3-ubyte", 4, 0x08, 0); /* plain files for the test split */
    write_labels("t10k-labels-idx1-ubyte", 4, -1);
    fl_mnist_config mc = config(true);
    fl_dataset *tr = fl_dataset_mnist_create(&mc);
    CHECK(tr != NULL);
    CHECK(tr->size == 7 && tr->ndim == 3 && tr->shape[0] == 1 && tr->shape[1] == R &&
          tr->shape[2] == C && tr->sample_numel == R * C && tr->num_classes == 10);
    /* the split's own statistics, computed here in double */
    double s = 0, ss = 0;
    for (int i = 0; i < 7; i++)
        for (int y = 0; y < R; y++)
            for (int x = 0; x < C; x++) {
                double v = pixel(i, y, x) / 255.0;
                s += v, ss += v * v;
            }
    double n = 7.0 * R * C, mean = s / n, sd = sqrt(ss / n - mean * mean), m, d;
    CHECK(fl_dataset_mnist_stats(tr, &m, &d) == FL_OK);
    CHECK(fabs(m - mean) < 1e-12 && fabs(d - sd) < 1e-12);
    float x[R * C];
    int32_t label;
    CHECK(fl_dataset_get(tr, 5, x, &label) == FL_OK);
    CHECK(label == 5);
    for (int y = 0; y < R; y++)
        for (int c = 0; c < C; c++)
            CHECK(fabsf(x[y * C + c] - (float)((pixel(5, y, c) / 255.0 - mean) / sd)) < 1e-5f);

    /* the test split with the training statistics given */
    fl_mnist_config tc = config(false);
    tc.mean = m, tc.std = d;
    fl_dataset *te = fl_dataset_mnist_create(&tc);
    CHECK(te != NULL && te->size == 4);
    CHECK(fl_dataset_get(te, 3, x, &label) == FL_OK);
    CHECK(label == 3 && fabsf(x[0] - (float)((pixel(3, 0, 0) / 255.0 - m) / d)) < 1e-5f);

    /* augmentation: a crop of the zero-padded image (zero before normalising), flips only when
     * asked, the same sample for the same (seed, epoch, index), different epochs differ */
    fl_mnist_config ac = config(true);
    ac.augment = true, ac.crop_padding = 2, ac.mean = 0, ac.std = 1, ac.seed = 9;
    fl_dataset *aug = fl_dataset_mnist_create(&ac);
    ac.flip = true;
    fl_dataset *augf = fl_dataset_mnist_create(&ac);
    CHECK(aug && augf);
    int shifted = 0, flipped = 0;
    for (int64_t e = 0; e < 8; e++) {
        float a[R * C], b[R * C];
        CHECK(fl_dataset_get_ex(aug, 2, e, a, &label) == FL_OK);
        CHECK(fl_dataset_get_ex(aug, 2, e, b, &label) == FL_OK);
        CHECK(memcmp(a, b, sizeof a) == 0);
        /* find the offset (dy, dx) in [-2, 2]^2 that explains every pixel */
        bool found = false;
        for (int dy = -2; dy <= 2 && !found; dy++)
            for (int dx = -2; dx <= 2 && !found; dx++) {
                bool ok = true;
                for (int y = 0; y < R && ok; y++)
                    for (int c = 0; c < C && ok; c++) {
                        int sy = y + dy, sx = c + dx;
                        float want = sy >= 0 && sy < R && sx >= 0 && sx < C
                                         ? pixel(2, sy, sx) / 255.0f : 0.0f;
                        ok = fabsf(a[y * C + c] - want) < 1e-6f;
                    }
                found = ok;
                shifted += ok && (dy || dx);
            }
        CHECK(found);
        CHECK(fl_dataset_get_ex(augf, 2, e, b, &label) == FL_OK);
        flipped += memcmp(a, b, sizeof a) != 0;
    }
    CHECK(shifted > 0 && flipped > 0);
    fl_dataset_free(aug);
    fl_dataset_free(augf);
    fl_dataset_free(te);
    fl_dataset_free(tr);

    /* mismatched counts, a label outside [0, classes), a missing file: named */
    write_labels("t10k-labels-idx1-ubyte", 5, -1);
    CHECK(fl_dataset_mnist_create(&tc) == NULL);
    CHECK_MSG("5 labels");
    CHECK_MSG("4 images");
    CHECK_MSG("t10k-labels-idx1-ubyte");
    write_labels("t10k-labels-idx1-ubyte", 4, 2);
    CHECK(fl_dataset_mnist_create(&tc) == NULL);
    CHECK_MSG("label 2 is 12");
    write_images("t10k-labels-idx1-ubyte", 4, 0x08, 0); /* images where labels go */
    CHECK(fl_dataset_mnist_create(&tc) == NULL);
    CHECK_MSG("labels are (count)");
    rm("t10k-images-idx3-ubyte");
    CHECK(fl_dataset_mnist_create(&tc) == NULL);
    CHECK_MSG("t10k-images-idx3-ubyte");
    CHECK_MSG("cannot open");
}

/* The real set, where Debian's package put it: sizes and label balance (skipped if absent). */
static void test_fashion_mnist(void) {
    if (access(FL_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("fashion-mnist not installed: real-set checks skipped\n");
        return;
    }
    fl_mnist_config mc = fl_mnist_config_default();
    fl_dataset *tr = fl_dataset_mnist_create(&mc);
    mc.train = false;
    fl_dataset *te = fl_dataset_mnist_create(&mc);
    CHECK(tr && te);
    CHECK(tr->size == 60000 && te->size == 10000 && tr->shape[1] == 28 && tr->shape[2] == 28);
    double m, d;
    CHECK(fl_dataset_mnist_stats(tr, &m, &d) == FL_OK);
    CHECK(fabs(m - 0.2860) < 1e-3 && fabs(d - 0.3530) < 1e-3); /* the published statistics */
    int count[10] = {0};
    float x[784];
    int32_t label;
    for (int64_t i = 0; i < te->size; i++) {
        CHECK(fl_dataset_get(te, i, x, &label) == FL_OK);
        count[label]++;
    }
    for (int c = 0; c < 10; c++)
        CHECK(count[c] == 1000);
    fl_dataset_free(te);
    fl_dataset_free(tr);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_mnist.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    test_idx_reader();
    test_dataset();
    test_fashion_mnist();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    TEST_DONE();
}
