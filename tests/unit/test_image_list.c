/* test_image_list.c - the image-list dataset and both loaders on a small ImageNet-style tree of
 * JPEGs this test writes with libjpeg: every sample of an epoch exactly once across ranks,
 * augmentation reproducible under a seed, threaded loader == single-threaded, malformed list
 * lines refused with file:line, missing and corrupt images skipped and counted or failing by
 * option. Image i's red channel is the constant 10 i, so a crop of it still says which it is. */
#include "fleet/data.h"
#include "fleet/image.h"
#include "fleet/status.h"
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

#define N 23   /* images: not divisible by 2, 3 or the batch */
#define CROP 16
#define CLASSES 3

static char root[64];
static char path_buf[256];

static const char *at(const char *rel) {
    snprintf(path_buf, sizeof path_buf, "%s/%s", root, rel);
    return path_buf;
}

static void write_text(const char *rel, const char *text) {
    FILE *f = fopen(at(rel), "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* root/train/c<k>/img<i>.jpeg, sizes varying with i, red = 10 i, smooth green and blue */
static void make_tree(void) {
    snprintf(root, sizeof root, "/tmp/fl_imglist.XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    mkdir(at("train"), 0755);
    char rel[64];
    for (int k = 0; k < CLASSES; k++) {
        snprintf(rel, sizeof rel, "train/c%d", k);
        mkdir(at(rel), 0755);
    }
    FILE *list = fopen(at("train.txt"), "w");
    fprintf(list, "# ImageNet-style list: path label\n\n");
    for (int i = 0; i < N; i++) {
        fl_image im;
        int w = 40 + 3 * i, h = 60 - i;
        CHECK_OK(fl_image_alloc(&im, w, h, 3));
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                uint8_t *p = im.data + ((size_t)y * w + x) * 3;
                p[0] = (uint8_t)(10 * i);
                p[1] = (uint8_t)(128 + 90 * sin(0.2 * x + 0.1 * i));
                p[2] = (uint8_t)(128 + 90 * cos(0.15 * y));
            }
        snprintf(rel, sizeof rel, "train/c%d/img%02d.jpeg", i % CLASSES, i);
        CHECK_OK(fl_jpeg_write(at(rel), &im, 95));
        fprintf(list, "%s\t%d\r\n", rel + strlen("train/"), i % CLASSES);
        fl_image_free(&im);
    }
    fclose(list);
}

static fl_dataset *open_list(const char *list, bool train, uint64_t seed,
                             fl_bad_image_policy policy) {
    char lp[256];
    snprintf(lp, sizeof lp, "%s/%s", root, list);
    char rp[256];
    snprintf(rp, sizeof rp, "%s/train", root);
    fl_imagelist_config c = fl_imagelist_config_default();
    c.list = lp;
    c.root = rp;
    c.classes = CLASSES;
    c.train = train;
    c.crop_size = CROP;
    c.resize_short_size = 20;
    c.seed = seed;
    c.on_bad_image = policy;
    return fl_dataset_imagelist_create(&c);
}

/* Which image a sample is: its mean red channel, un-normalised, over 10. */
static int identify(const float *x) {
    double s = 0;
    for (int i = 0; i < CROP * CROP; i++)
        s += x[i];
    double red = (s / (CROP * CROP) * fl_imagenet_std[0] + fl_imagenet_mean[0]) * 255.0;
    return (int)lround(red / 10.0);
}

/* One loader of either kind behind one interface. */
typedef struct {
    fl_loader   *l;
    fl_prefetch *p;
} any_loader;

static any_loader make_loader(fl_dataset *ds, int world, int rank, int64_t B, uint64_t seed,
                              int workers, int prefetch) {
    fl_loader_config lc = {.batch_size = B, .shuffle = true, .drop_last = false, .seed = seed,
                           .rank = rank, .world = world};
    any_loader a = {0};
    if (workers < 0) {
        a.l = fl_loader_create(ds, &lc);
        CHECK(a.l != NULL);
    } else {
        fl_prefetch_config pc = {.base = lc, .num_workers = workers, .prefetch = prefetch};
        a.p = fl_prefetch_create(ds, &pc);
        CHECK(a.p != NULL);
    }
    return a;
}
static int any_seek(any_loader *a, int64_t e, int64_t s) {
    return a->l ? fl_loader_seek(a->l, e, s) : fl_prefetch_seek(a->p, e, s);
}
static int any_next(any_loader *a, const fl_tensor **x, const int32_t **y) {
    return a->l ? fl_loader_next(a->l, x, y) : fl_prefetch_next(a->p, x, y);
}
static int64_t any_skipped(any_loader *a) {
    return a->l ? fl_loader_skipped(a->l) : fl_prefetch_skipped(a->p);
}
static void any_free(any_loader *a) {
    fl_loader_free(a->l);
    fl_prefetch_free(a->p);
}

/* Runs one epoch; appends the samples to out (may be NULL) and returns how many. */
static int64_t run_epoch(any_loader *a, int64_t epoch, float *out, int32_t *labels) {
    const fl_tensor *x;
    const int32_t *y;
    int64_t n = 0;
    CHECK_OK(any_seek(a, epoch, 0));
    int rc;
    while ((rc = any_next(a, &x, &y)) == 1) {
        if (out)
            memcpy(out + n * 3 * CROP * CROP, x->data, (size_t)x->numel * sizeof(float));
        if (labels)
            memcpy(labels + n, y, (size_t)x->shape[0] * sizeof *y);
        n += x->shape[0];
    }
    CHECK_RC(rc, 0);
    return n;
}

static void test_exactly_once(fl_dataset *ds) {
    /* {workers, prefetch}; workers -1 is fl_loader */
    const int kinds[][2] = {{-1, 0}, {0, 1}, {2, 2}, {3, 1}};
    float *buf = malloc(sizeof *buf * N * 3 * CROP * CROP);
    int32_t labels[N];
    for (int world = 1; world <= 3; world++)
        for (int k = 0; k < 4; k++) {
            int seen[N] = {0};
            for (int rank = 0; rank < world; rank++) {
                any_loader a = make_loader(ds, world, rank, 4, 99, kinds[k][0], kinds[k][1]);
                int64_t n = run_epoch(&a, 1, buf, labels);
                for (int64_t i = 0; i < n; i++) {
                    int id = identify(buf + i * 3 * CROP * CROP);
                    CHECK(id >= 0 && id < N);
                    if (id >= 0 && id < N) {
                        seen[id]++;
                        CHECK(labels[i] == id % CLASSES);
                    }
                }
                any_free(&a);
            }
            for (int i = 0; i < N; i++)
                if (seen[i] != 1) {
                    fprintf(stderr, "world %d kind %d: image %d seen %d times\n", world, k, i,
                            seen[i]);
                    test_failures++;
                }
        }
    free(buf);
}

/* The whole epoch of one rank as bytes. */
static float *epoch_bytes(fl_dataset *ds, int world, int rank, int64_t B, int64_t epoch,
                          int workers, int prefetch, int64_t *n) {
    float *buf = calloc((size_t)N * 3 * CROP * CROP, sizeof *buf);
    any_loader a = make_loader(ds, world, rank, B, 5, workers, prefetch);
    *n = run_epoch(&a, epoch, buf, NULL);
    any_free(&a);
    return buf;
}

static void test_reproducible(void) {
    fl_dataset *a = open_list("train.txt", true, 11, FL_BAD_IMAGE_FAIL);
    fl_dataset *b = open_list("train.txt", true, 11, FL_BAD_IMAGE_FAIL);
    fl_dataset *c = open_list("train.txt", true, 12, FL_BAD_IMAGE_FAIL);
    size_t bytes = sizeof(float) * N * 3 * CROP * CROP;
    int64_t n;
    float *ea = epoch_bytes(a, 1, 0, 5, 0, -1, 0, &n);
    float *eb = epoch_bytes(b, 1, 0, 5, 0, -1, 0, &n);
    float *ec = epoch_bytes(c, 1, 0, 5, 0, -1, 0, &n);
    CHECK(n == N);
    CHECK(memcmp(ea, eb, bytes) == 0);       /* same seed: the same bytes */
    CHECK(memcmp(ea, ec, bytes) != 0);       /* another seed: other crops */
    /* another epoch: same samples (sorted by identity), other crops */
    float *e1 = epoch_bytes(a, 1, 0, 5, 1, -1, 0, &n);
    int differ = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            const float *s0 = ea + (size_t)i * 3 * CROP * CROP;
            const float *s1 = e1 + (size_t)j * 3 * CROP * CROP;
            if (identify(s0) == identify(s1))
                differ += memcmp(s0, s1, sizeof(float) * 3 * CROP * CROP) != 0;
        }
    CHECK(differ >= N - 1);
    /* threaded == single-threaded, for several ranks, worker counts and queue depths */
    for (int rank = 0; rank < 3; rank++) {
        int64_t n0, n1, n2;
        float *s = epoch_bytes(a, 3, rank, 2, 4, -1, 0, &n0);
        float *t1 = epoch_bytes(a, 3, rank, 2, 4, 2, 1, &n1);
        float *t2 = epoch_bytes(a, 3, rank, 2, 4, 3, 4, &n2);
        CHECK(n0 == n1 && n0 == n2);
        CHECK(memcmp(s, t1, bytes) == 0);
        CHECK(memcmp(s, t2, bytes) == 0);
        free(s);
        free(t1);
        free(t2);
    }
    /* evaluation transforms ignore seed and epoch */
    fl_dataset *v1 = open_list("train.txt", false, 1, FL_BAD_IMAGE_FAIL);
    fl_dataset *v2 = open_list("train.txt", false, 2, FL_BAD_IMAGE_FAIL);
    float *x1 = malloc(sizeof *x1 * 3 * CROP * CROP), *x2 = malloc(sizeof *x2 * 3 * CROP * CROP);
    int32_t l1, l2;
    CHECK_OK(fl_dataset_get_ex(v1, 7, 0, x1, &l1));
    CHECK_OK(fl_dataset_get_ex(v2, 7, 5, x2, &l2));
    CHECK(memcmp(x1, x2, sizeof(float) * 3 * CROP * CROP) == 0 && l1 == 7 % CLASSES && l2 == l1);
    CHECK(identify(x1) == 7);
    free(x1);
    free(x2);
    free(ea);
    free(eb);
    free(ec);
    free(e1);
    fl_dataset_free(a);
    fl_dataset_free(b);
    fl_dataset_free(c);
    fl_dataset_free(v1);
    fl_dataset_free(v2);
}

/* Resuming at (epoch, step) gives the batches that running from step 0 gives from there on. */
static void test_seek(fl_dataset *ds) {
    any_loader a = make_loader(ds, 2, 1, 3, 8, -1, 0), b = make_loader(ds, 2, 1, 3, 8, 2, 2);
    const fl_tensor *x, *xb;
    const int32_t *y, *yb;
    CHECK_OK(any_seek(&a, 3, 0));
    float first[3 * 3 * CROP * CROP];
    for (int s = 0; s < 3; s++)
        CHECK(any_next(&a, &x, &y) == 1);
    memcpy(first, x->data, (size_t)x->numel * sizeof(float));
    CHECK(any_next(&b, &xb, &yb) == 1); /* epoch 0 in flight, then jump */
    CHECK_OK(any_seek(&b, 3, 2));
    CHECK(any_next(&b, &xb, &yb) == 1);
    CHECK(xb->numel == x->numel && memcmp(first, xb->data, (size_t)x->numel * sizeof(float)) == 0);
    any_free(&a);
    any_free(&b);
    /* freed in the middle of an epoch with batches in flight: no hang, no leak */
    any_loader c = make_loader(ds, 1, 0, 2, 8, 3, 4);
    CHECK(any_next(&c, &x, &y) == 1);
    any_free(&c);
    any_loader d = make_loader(ds, 1, 0, 2, 8, 2, 8); /* never consumed at all */
    any_free(&d);
}

/* A training sample against the pipeline written out by hand: the crop box and flip from
 * Philox stream (epoch << 40 | index) of the seed, the whole image decoded at the scale the
 * crop allows, the box resampled from it. Region decoding must not change a single value. */
static void test_against_reference(void) {
    const uint64_t seed = 77;
    fl_dataset *ds = open_list("train.txt", true, seed, FL_BAD_IMAGE_FAIL);
    float *got = malloc(sizeof *got * 3 * CROP * CROP);
    float *want = malloc(sizeof *want * 3 * CROP * CROP);
    int flips = 0;
    for (int64_t epoch = 0; epoch < 3; epoch++)
        for (int i = 0; i < N; i++) {
            int32_t label;
            CHECK_OK(fl_dataset_get_ex(ds, i, epoch, got, &label));
            char rel[64];
            snprintf(rel, sizeof rel, "train/c%d/img%02d.jpeg", i % CLASSES, i);
            FILE *f = fopen(at(rel), "rb");
            static uint8_t buf[1 << 16];
            size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f)
                fclose(f);
            int W, H, num;
            CHECK_OK(fl_jpeg_size(buf, len, &W, &H));
            fl_rng r;
            fl_rng_init(&r, seed, (uint64_t)epoch << 40 | (uint64_t)i);
            fl_box box;
            fl_random_resized_crop_box(&r, W, H, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, &box);
            bool flip = fl_rng_below(&r, 2) == 1;
            flips += flip;
            fl_image full;
            CHECK_OK(fl_jpeg_decode(buf, len, (int)ceil(W * (double)CROP / box.w),
                                    (int)ceil(H * (double)CROP / box.h), &full, &num));
            double k = num / 8.0;
            fl_box sbox = {box.x * k, box.y * k, box.w * k, box.h * k};
            fl_image_resample_chw(&full, sbox, CROP, CROP, flip, fl_imagenet_mean, fl_imagenet_std,
                                  want);
            CHECK_CLOSE_F32("sample vs reference pipeline", got, want, 3 * CROP * CROP, 1e-6, 0);
            CHECK(label == i % CLASSES);
            fl_image_free(&full);
        }
    CHECK(flips > 3 * N / 4 && flips < 3 * N * 3 / 4); /* flip with probability 1/2 */
    free(got);
    free(want);
    fl_dataset_free(ds);
}

static void expect_bad_list(const char *text, int line, const char *what) {
    write_text("bad.txt", text);
    fl_dataset *ds = open_list("bad.txt", true, 0, FL_BAD_IMAGE_SKIP);
    CHECK(ds == NULL);
    char where[300];
    snprintf(where, sizeof where, "bad.txt:%d: ", line);
    CHECK_MSG(where);
    CHECK_MSG(what);
    fl_dataset_free(ds);
}

static void test_malformed_lists(void) {
    expect_bad_list("c0/img00.jpeg 0\nc1/img01.jpeg\n", 2, "has no label");
    expect_bad_list("# c\n\nc0/img00.jpeg zero\n", 3, "label 'zero' is not an integer");
    expect_bad_list("c0/img00.jpeg 1.5\n", 1, "label '1.5' is not an integer");
    expect_bad_list("c0/img00.jpeg 2x\n", 1, "is not an integer");
    expect_bad_list("c0/img00.jpeg +1\n", 1, "is not an integer");
    expect_bad_list("c0/img00.jpeg 99999999999999999999\n", 1, "is not an integer");
    expect_bad_list("c0/img00.jpeg 0\nc0/img03.jpeg 3\n", 2, "label 3 outside [0, 3)");
    expect_bad_list("c0/img00.jpeg -1\n", 1, "label -1 outside [0, 3)");
    expect_bad_list("c0/img00.jpeg 0 extra\n", 1, "extra field 'extra'");
    expect_bad_list("my image.jpeg 0\n", 1, "extra field '0'");
    expect_bad_list("/etc/passwd 0\n", 1, "is absolute");
    expect_bad_list("c0/../../secret.jpeg 0\n", 1, "'..' component");
    expect_bad_list("../x.jpeg 1\n", 1, "escape the root");
    write_text("empty.txt", "# nothing\n\n   \n");
    CHECK(open_list("empty.txt", true, 0, FL_BAD_IMAGE_SKIP) == NULL);
    CHECK_MSG("no samples");
    CHECK(open_list("no-such-list.txt", true, 0, FL_BAD_IMAGE_SKIP) == NULL);
    CHECK_MSG("no-such-list.txt");
    /* a list that is fine: comments, blank lines, tabs, CRLF, a '..' inside a name */
    write_text("ok.txt",
               "# header\n\n  c0/img00.jpeg   0\r\nc1/img01.jpeg\t1\n# c2/x 9\nc2/a..b.jpeg 2");
    fl_dataset *ds = open_list("ok.txt", true, 0, FL_BAD_IMAGE_SKIP);
    CHECK(ds != NULL && ds->size == 3 && ds->num_classes == CLASSES);
    CHECK(ds && ds->ndim == 3 && ds->shape[0] == 3 && ds->shape[1] == CROP && ds->shape[2] == CROP);
    fl_dataset_free(ds);
}

/* A list with a missing file, a corrupt file and a truncated JPEG among the good ones. */
static void test_bad_images(void) {
    write_text("train/c0/corrupt.jpeg", "this is not a JPEG file at all, just text\n");
    FILE *f = fopen(at("train/c1/img01.jpeg"), "rb");
    uint8_t buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    f = fopen(at("train/c1/truncated.jpeg"), "wb");
    if (f) {
        fwrite(buf, 1, len / 2, f);
        fclose(f);
    }
    FILE *src = fopen(at("train.txt"), "r"), *dst = fopen(at("mixed.txt"), "w");
    char line[256];
    int lines = 0;
    while (fgets(line, sizeof line, src)) {
        fputs(line, dst);
        if (++lines == 6) {
            fputs("c2/missing.jpeg 2\n", dst);      /* line 7 */
            fputs("c0/corrupt.jpeg 0\n", dst);      /* line 8 */
            fputs("c1/truncated.jpeg 1\n", dst);    /* line 9 */
        }
    }
    fclose(src);
    fclose(dst);
    for (int workers = -1; workers <= 2; workers += 3) {
        fl_dataset *ds = open_list("mixed.txt", true, 3, FL_BAD_IMAGE_SKIP);
        CHECK(ds && ds->size == N + 3);
        if (!ds)
            continue;
        int seen[N] = {0};
        int64_t total = 0;
        for (int rank = 0; rank < 2; rank++) {
            any_loader a = make_loader(ds, 2, rank, 4, 1, workers, 2);
            float *out = malloc(sizeof *out * (N + 3) * 3 * CROP * CROP);
            int64_t n = run_epoch(&a, 0, out, NULL);
            for (int64_t i = 0; i < n; i++) {
                int id = identify(out + i * 3 * CROP * CROP);
                if (id >= 0 && id < N)
                    seen[id]++;
            }
            total += n + any_skipped(&a);
            CHECK(any_skipped(&a) <= 3);
            free(out);
            any_free(&a);
        }
        CHECK(total == N + 3);
        for (int i = 0; i < N; i++)
            CHECK(seen[i] == 1);
        fl_imagelist_stats st;
        CHECK_OK(fl_dataset_imagelist_stats(ds, &st));
        CHECK(st.missing == 1 && st.corrupt == 2);
        if (st.missing != 1 || st.corrupt != 2)
            fprintf(stderr, "missing %lld corrupt %lld\n", (long long)st.missing,
                    (long long)st.corrupt);
        fl_dataset_free(ds);

        /* the fail policy: the loader stops naming list line and file */
        ds = open_list("mixed.txt", true, 3, FL_BAD_IMAGE_FAIL);
        any_loader a = make_loader(ds, 1, 0, 64, 1, workers, 2);
        const fl_tensor *x;
        const int32_t *y;
        int rc = any_next(&a, &x, &y);
        CHECK(rc == FL_EIO || rc == FL_EFORMAT);
        CHECK_MSG("mixed.txt:");
        CHECK(strstr(fl_errmsg(), "missing.jpeg") || strstr(fl_errmsg(), "corrupt.jpeg") ||
              strstr(fl_errmsg(), "truncated.jpeg"));
        any_free(&a);
        /* one at a time, in list order: each names its own line */
        const char *names[] = {"mixed.txt:7: ", "mixed.txt:8: ", "mixed.txt:9: "};
        const char *files[] = {"missing.jpeg: cannot open", "corrupt.jpeg: corrupt JPEG",
                               "truncated.jpeg: corrupt JPEG"};
        float *one = malloc(sizeof *one * 3 * CROP * CROP);
        int32_t lab;
        for (int k = 0; k < 3; k++) {
            CHECK(fl_dataset_get_ex(ds, 4 + k, 0, one, &lab) < 0);
            CHECK_MSG(names[k]);
            CHECK_MSG(files[k]);
        }
        CHECK_OK(fl_dataset_get_ex(ds, 3, 0, one, &lab));
        free(one);
        CHECK_OK(fl_dataset_imagelist_stats(ds, &st));
        CHECK(st.missing == 0 && st.corrupt == 0);
        fl_dataset_free(ds);
    }
    fl_dataset *r = fl_dataset_random_create(4, 2, 2, 0);
    fl_imagelist_stats st;
    CHECK_RC(fl_dataset_imagelist_stats(r, &st), FL_EINVAL);
    fl_dataset_free(r);
}

static void test_bad_config(void) {
    fl_imagelist_config c = fl_imagelist_config_default();
    CHECK(fl_dataset_imagelist_create(&c) == NULL); /* no list */
    CHECK_MSG("list and root");
    c.list = at("train.txt");
    c.root = root;
    c.lower_scale = 0;
    CHECK(fl_dataset_imagelist_create(&c) == NULL);
    CHECK_MSG("lower_scale");
    c.lower_scale = 0.08;
    c.lower_ratio = 2;
    CHECK(fl_dataset_imagelist_create(&c) == NULL);
    CHECK_MSG("lower_ratio");
    c.lower_ratio = 0.75;
    c.train = false;
    c.resize_short_size = 100;
    CHECK(fl_dataset_imagelist_create(&c) == NULL);
    CHECK_MSG("resize_short_size");
}

static void remove_tree(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (strncmp(root, "/tmp/fl_imglist.", 16) == 0 && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
}

int main(void) {
    make_tree();
    fl_dataset *ds = open_list("train.txt", true, 1, FL_BAD_IMAGE_FAIL);
    CHECK(ds != NULL && ds->size == N);
    if (!ds) {
        fprintf(stderr, "%s\n", fl_errmsg());
        remove_tree();
        return 1;
    }
    test_exactly_once(ds);
    test_seek(ds);
    test_reproducible();
    test_against_reference();
    test_malformed_lists();
    test_bad_images();
    test_bad_config();
    fl_dataset_free(ds);
    remove_tree();
    TEST_DONE();
}
