/* make_image_tree.c - writes a small ImageNet-style tree for the image-list tests: JPEGs (made
 * with fleet's own fl_jpeg_write) under DIR/train/nCCCCCCCC/ and DIR/val/nCCCCCCCC/, and the
 * lists DIR/train.txt and DIR/val.txt in seed 002's format ("relative/path.jpeg label").
 *
 * Class c is a stripe pattern a small CNN can learn from a few hundred images: stripes of colour
 * c % ncolours (red, green, blue, yellow; ncolours = ceil(K / 2)) running horizontally for
 * c < ncolours, vertically otherwise, on a noisy dark background. Orientation survives the
 * training transforms (random resized crops change the aspect ratio but not the direction of a
 * stripe; a left-right flip maps horizontal to horizontal), so the task stays learnable under
 * augmentation. Images are 40-90 px wide with aspect ratios (h / w) in [0.6, 1.6]; stripe
 * period, phase, colour intensity, background and pixel noise vary per image. Everything comes
 * from --seed: the same arguments write the same bytes.
 *
 * With --bad, also DIR/train_bad.txt: train.txt with its line 7 naming an image that does not
 * exist and its line 12 naming a truncated copy of a JPEG (same labels), for the skip/fail
 * policy tests; the two lines are printed. */
#include "fleet/image.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_CLASSES 8
#define BAD_MISSING_LINE 7
#define BAD_CORRUPT_LINE 12
#define NOISE 40.0 /* pixel noise, standard deviation */

static const int palette[4][3] = {{220, 40, 40}, {40, 200, 60}, {50, 80, 230}, {220, 200, 40}};

static void usage(FILE *f) {
    fprintf(f, "usage: make_image_tree DIR [--train N (640)] [--val N (200)] [--classes K (6)]\n"
               "                       [--seed S (1)] [--bad]\n"
               "  K in [2, %d]; writes DIR/train.txt, DIR/val.txt (and DIR/train_bad.txt with "
               "--bad)\n",
            MAX_CLASSES);
}

static int make_dir(const char *path) {
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
        return fl_fail(FL_EIO, "cannot create '%s': %s", path, strerror(errno));
    return FL_OK;
}

static uint8_t clamp_u8(double v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)(v + 0.5); }

/* Draws image `index` of class c into *img (allocated here). */
static int draw(fl_image *img, int c, int classes, uint64_t seed, uint64_t index) {
    fl_rng r;
    fl_rng_init(&r, seed, index);
    int ncolours = (classes + 1) / 2;
    int vertical = c >= ncolours;
    const int *col = palette[c % ncolours];
    int w = 40 + (int)fl_rng_below(&r, 51);
    double aspect = 0.6 + 1.0 * fl_rng_uniform_f64(&r);
    int h = (int)(w * aspect + 0.5);
    FL_TRY(fl_image_alloc(img, w, h, 3));
    int period = 6 + (int)fl_rng_below(&r, 7);
    int phase = (int)fl_rng_below(&r, (uint64_t)period);
    double bg = 40 + 60 * fl_rng_uniform_f64(&r);
    double contrast = 0.2 + 0.8 * fl_rng_uniform_f64(&r); /* some images are faint */
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            int t = (vertical ? x : y) + phase;
            int on = t % period < period / 2;
            uint8_t *px = img->data + ((size_t)y * w + x) * 3;
            for (int k = 0; k < 3; k++) {
                double v = on ? bg + contrast * (col[k] - bg) : bg;
                px[k] = clamp_u8(v + NOISE * fl_rng_normal(&r));
            }
        }
    }
    return FL_OK;
}

/* Writes n images of `split` ("train" or "val") and the list DIR/<split>.txt. Class of image i
 * is i % classes, so every class is equally frequent. */
static int write_split(const char *dir, const char *split, int n, int classes, uint64_t seed) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, split);
    FL_TRY(make_dir(path));
    for (int c = 0; c < classes; c++) {
        snprintf(path, sizeof path, "%s/%s/n%08d", dir, split, c);
        FL_TRY(make_dir(path));
    }
    snprintf(path, sizeof path, "%s/%s.txt", dir, split);
    FILE *list = fopen(path, "w");
    if (!list)
        return fl_fail(FL_EIO, "cannot write '%s': %s", path, strerror(errno));
    uint64_t stream0 = strcmp(split, "train") ? (uint64_t)1 << 32 : 0; /* disjoint splits */
    int rc = FL_OK;
    for (int i = 0; i < n && rc >= 0; i++) {
        int c = i % classes;
        fl_image img = {0};
        rc = draw(&img, c, classes, seed, stream0 + (uint64_t)i);
        char rel[256];
        snprintf(rel, sizeof rel, "%s/n%08d/%05d.jpeg", split, c, i);
        snprintf(path, sizeof path, "%s/%s", dir, rel);
        if (rc >= 0)
            rc = fl_jpeg_write(path, &img, 90);
        fl_image_free(&img);
        if (rc >= 0)
            fprintf(list, "%s %d\n", rel, c);
    }
    if (fclose(list) != 0 && rc >= 0)
        rc = fl_fail(FL_EIO, "cannot write '%s/%s.txt'", dir, split);
    return rc;
}

/* DIR/train_bad.txt: train.txt with BAD_MISSING_LINE naming a file that does not exist and
 * BAD_CORRUPT_LINE a copy of that line's image cut to half its bytes. */
static int write_bad_list(const char *dir, int n) {
    if (n < BAD_CORRUPT_LINE)
        return fl_fail(FL_EINVAL, "--bad needs --train %d or more", BAD_CORRUPT_LINE);
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/train.txt", dir);
    FILE *in = fopen(path, "r");
    snprintf(path, sizeof path, "%s/train_bad.txt", dir);
    FILE *out = in ? fopen(path, "w") : NULL;
    int rc = FL_OK;
    if (!in || !out) {
        rc = fl_fail(FL_EIO, "cannot rewrite %s/train.txt as train_bad.txt", dir);
        goto out;
    }
    for (int no = 1; rc >= 0 && fgets(line, sizeof line, in); no++) {
        char rel[256];
        int label;
        if (sscanf(line, "%255s %d", rel, &label) != 2) {
            rc = fl_fail(FL_EFORMAT, "%s/train.txt:%d: not 'path label'", dir, no);
            break;
        }
        if (no == BAD_MISSING_LINE) {
            fprintf(out, "train/missing/absent.jpeg %d\n", label);
            printf("train_bad.txt:%d: train/missing/absent.jpeg (missing)\n", no);
        } else if (no == BAD_CORRUPT_LINE) {
            char src[4096], dst[4096];
            snprintf(src, sizeof src, "%s/%s", dir, rel);
            snprintf(dst, sizeof dst, "%s/train/truncated.jpeg", dir);
            FILE *f = fopen(src, "rb");
            FILE *g = f ? fopen(dst, "wb") : NULL;
            uint8_t buf[1 << 16];
            size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (!g || len < 64 || len == sizeof buf ||
                fwrite(buf, 1, len / 2, g) != len / 2)
                rc = fl_fail(FL_EIO, "cannot make a truncated copy of '%s' as '%s'", src, dst);
            if (f)
                fclose(f);
            if (g && fclose(g) != 0 && rc >= 0)
                rc = fl_fail(FL_EIO, "cannot write '%s'", dst);
            fprintf(out, "train/truncated.jpeg %d\n", label);
            printf("train_bad.txt:%d: train/truncated.jpeg (corrupt: %zu of %zu bytes)\n", no,
                   len / 2, len);
        } else {
            fputs(line, out);
        }
    }
out:
    if (in)
        fclose(in);
    if (out && fclose(out) != 0 && rc >= 0)
        rc = fl_fail(FL_EIO, "cannot write '%s'", path);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = NULL;
    long ntrain = 640, nval = 200, classes = 6, seed = 1;
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        long *num = !strcmp(s, "--train")     ? &ntrain
                    : !strcmp(s, "--val")     ? &nval
                    : !strcmp(s, "--classes") ? &classes
                    : !strcmp(s, "--seed")    ? &seed
                                              : NULL;
        if (num && i + 1 < argc) {
            char *end;
            *num = strtol(argv[++i], &end, 10);
            if (*end || *num < 0) {
                fprintf(stderr, "make_image_tree: error: %s '%s': not a count\n", s, argv[i]);
                return 2;
            }
        } else if (!strcmp(s, "--bad")) {
            bad = 1;
        } else if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            usage(stdout);
            return 0;
        } else if (s[0] != '-' && !dir) {
            dir = s;
        } else {
            fprintf(stderr, "make_image_tree: error: unexpected argument '%s'\n", s);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || classes < 2 || classes > MAX_CLASSES || ntrain < 1 || nval < 1 ||
        ntrain > 1000000 || nval > 1000000) {
        usage(stderr);
        return 2;
    }
    int rc = make_dir(dir);
    if (rc >= 0)
        rc = write_split(dir, "train", (int)ntrain, (int)classes, (uint64_t)seed);
    if (rc >= 0)
        rc = write_split(dir, "val", (int)nval, (int)classes, (uint64_t)seed);
    if (rc >= 0 && bad)
        rc = write_bad_list(dir, (int)ntrain);
    if (rc < 0) {
        fprintf(stderr, "make_image_tree: error: %s\n", fl_errmsg());
        return 1;
    }
    return 0;
}
