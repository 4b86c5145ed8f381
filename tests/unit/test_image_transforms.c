/* test_image_transforms.c - the image transforms against plain references (bilinear resampling
 * against the direct formula and against affine images it must reproduce exactly, the crop
 * boxes against torchvision's rules, normalisation), and JPEG decoding: round trip, DCT scaling,
 * gray and CMYK input, and corrupt or truncated streams that must fail without crashing. */
#include "fleet/image.h"
#include "fleet/status.h"
#include "test.h"

#include <jpeglib.h>

/* The direct formula, in double: the value at source position (u, v) by bilinear interpolation
 * between the four neighbours, positions clamped to the image. */
static double bilinear_ref(const fl_image *im, double u, double v, int c) {
    u = u < 0 ? 0 : u > im->w - 1 ? im->w - 1 : u;
    v = v < 0 ? 0 : v > im->h - 1 ? im->h - 1 : v;
    int x0 = (int)floor(u), y0 = (int)floor(v);
    int x1 = x0 + 1 < im->w ? x0 + 1 : x0, y1 = y0 + 1 < im->h ? y0 + 1 : y0;
    double fx = u - x0, fy = v - y0;
#define P(x, y) ((double)im->data[((size_t)(y) * im->w + (x)) * 3 + c])
    return (1 - fy) * ((1 - fx) * P(x0, y0) + fx * P(x1, y0)) +
           fy * ((1 - fx) * P(x0, y1) + fx * P(x1, y1));
#undef P
}

static void random_image(fl_image *im, int w, int h, unsigned seed) {
    CHECK_OK(fl_image_alloc(im, w, h, 3));
    fl_rng r;
    fl_rng_init(&r, seed, 0);
    for (size_t i = 0; i < (size_t)w * h * 3; i++)
        im->data[i] = (uint8_t)fl_rng_below(&r, 256);
}

static void test_bilinear_reference(void) {
    fl_image im;
    random_image(&im, 13, 9, 1);
    const fl_box boxes[] = {{0, 0, 13, 9}, {2, 1, 7.5, 5.25}, {3.3, 2.7, 4, 4}, {0, 0, 2, 3}};
    const int sizes[][2] = {{13, 9}, {5, 4}, {17, 11}, {1, 1}};
    for (int b = 0; b < 4; b++)
        for (int sz = 0; sz < 4; sz++)
            for (int flip = 0; flip < 2; flip++) {
                int ow = sizes[sz][0], oh = sizes[sz][1];
                float *got = malloc(sizeof *got * 3 * ow * oh);
                double *gotd = malloc(sizeof *gotd * 3 * ow * oh);
                double *want = malloc(sizeof *want * 3 * ow * oh);
                fl_image_resample_chw(&im, boxes[b], ow, oh, flip, NULL, NULL, got);
                for (int c = 0; c < 3; c++)
                    for (int y = 0; y < oh; y++)
                        for (int x = 0; x < ow; x++) {
                            int xs = flip ? ow - 1 - x : x;
                            double u = boxes[b].x + (xs + 0.5) * boxes[b].w / ow - 0.5;
                            double v = boxes[b].y + (y + 0.5) * boxes[b].h / oh - 0.5;
                            size_t k = ((size_t)c * oh + y) * ow + x;
                            want[k] = bilinear_ref(&im, u, v, c) / 255.0;
                            gotd[k] = got[k];
                        }
                CHECK_CLOSE("bilinear vs direct formula", gotd, want, 3 * ow * oh, 1e-5, 0);
                free(got);
                free(gotd);
                free(want);
            }
    /* the whole image at its own size is the image itself */
    float *id = malloc(sizeof *id * 3 * 13 * 9);
    fl_image_resample_chw(&im, (fl_box){0, 0, 13, 9}, 13, 9, false, NULL, NULL, id);
    int exact = 1;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 13 * 9; i++)
            exact &= fabsf(id[c * 117 + i] * 255.0f - (float)im.data[i * 3 + c]) < 1e-3f;
    CHECK(exact);
    free(id);
    fl_image_free(&im);
}

/* Bilinear interpolation reproduces an affine image exactly wherever it does not clamp. */
static void test_bilinear_affine(void) {
    fl_image im;
    CHECK_OK(fl_image_alloc(&im, 40, 30, 3));
    for (int y = 0; y < 30; y++)
        for (int x = 0; x < 40; x++)
            for (int c = 0; c < 3; c++)
                im.data[(y * 40 + x) * 3 + c] = (uint8_t)(10 + 3 * x + 2 * y + c);
    fl_box box = {5.25, 4.5, 20, 15};
    int ow = 23, oh = 17;
    float *out = malloc(sizeof *out * 3 * ow * oh);
    fl_image_resample_chw(&im, box, ow, oh, false, NULL, NULL, out);
    double maxerr = 0;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++) {
                double u = box.x + (x + 0.5) * box.w / ow - 0.5;
                double v = box.y + (y + 0.5) * box.h / oh - 0.5;
                double want = (10 + 3 * u + 2 * v + c) / 255.0;
                double d = fabs(out[(c * oh + y) * ow + x] - want);
                maxerr = d > maxerr ? d : maxerr;
            }
    CHECK(maxerr < 1e-5);
    free(out);
    fl_image_free(&im);
}

static void test_normalise(void) {
    fl_image im;
    CHECK_OK(fl_image_alloc(&im, 4, 4, 3));
    memset(im.data, 128, 48);
    float out[48];
    fl_image_resample_chw(&im, (fl_box){0, 0, 4, 4}, 4, 4, true, fl_imagenet_mean,
                          fl_imagenet_std, out);
    for (int c = 0; c < 3; c++) {
        double want = (128.0 / 255.0 - fl_imagenet_mean[c]) / fl_imagenet_std[c];
        for (int i = 0; i < 16; i++)
            CHECK_NEAR(out[c * 16 + i], want, 1e-5);
    }
    CHECK_NEAR(fl_imagenet_mean[0], 0.485, 1e-7);
    CHECK_NEAR(fl_imagenet_std[2], 0.225, 1e-7);
    fl_image_free(&im);
}

static void test_crop_boxes(void) {
    fl_rng r;
    fl_rng_init(&r, 42, 0);
    const int W = 500, H = 375;
    int fallbacks = 0, left_edge = 0, right_edge = 0;
    double sum_log_ratio = 0;
    for (int i = 0; i < 4000; i++) {
        fl_box b;
        bool ok = fl_random_resized_crop_box(&r, W, H, 0.08, 1.0, 3.0 / 4, 4.0 / 3, &b);
        fallbacks += !ok;
        CHECK(b.x == floor(b.x) && b.y == floor(b.y) && b.w == floor(b.w) && b.h == floor(b.h));
        CHECK(b.x >= 0 && b.y >= 0 && b.w >= 1 && b.h >= 1 && b.x + b.w <= W && b.y + b.h <= H);
        if (!ok)
            continue;
        /* w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio)): within half a pixel */
        CHECK((b.w + 0.5) * (b.h + 0.5) >= 0.08 * W * H);
        CHECK((b.w + 0.5) / (b.h - 0.5) >= 3.0 / 4 && (b.w - 0.5) / (b.h + 0.5) <= 4.0 / 3);
        left_edge += b.x == 0;
        right_edge += b.x + b.w == W;
        sum_log_ratio += log(b.w / b.h);
    }
    CHECK(fallbacks < 40); /* 10 attempts rarely all fail on a 4:3 image */
    CHECK(left_edge > 0 && right_edge > 0);
    CHECK(fabs(sum_log_ratio / (4000 - fallbacks)) < 0.05); /* log-uniform, symmetric */
    /* the fallback: centre crop clamped to the ratio range */
    fl_box b;
    CHECK(!fl_random_resized_crop_box(&r, 1000, 10, 0.9, 1.0, 3.0 / 4, 4.0 / 3, &b));
    CHECK(b.x == 493 && b.y == 0 && b.w == 13 && b.h == 10);
    CHECK(!fl_random_resized_crop_box(&r, 10, 1000, 0.9, 1.0, 3.0 / 4, 4.0 / 3, &b));
    CHECK(b.x == 0 && b.y == 493 && b.w == 10 && b.h == 13);
    CHECK(!fl_random_resized_crop_box(&r, 10, 1000, 0.9, 1.0, 0.001, 1000, &b) || b.h <= 1000);
    /* same stream, same boxes */
    fl_rng r1, r2;
    fl_rng_init(&r1, 7, 3);
    fl_rng_init(&r2, 7, 3);
    fl_box b1, b2;
    fl_random_resized_crop_box(&r1, W, H, 0.08, 1, 0.75, 4.0 / 3, &b1);
    fl_random_resized_crop_box(&r2, W, H, 0.08, 1, 0.75, 4.0 / 3, &b2);
    CHECK(memcmp(&b1, &b2, sizeof b1) == 0);

    /* evaluation: Resize(256) gives 341 x 256, CenterCrop(224) at (round(58.5) = 58, 16) */
    fl_box e = fl_resize_center_crop_box(500, 375, 256, 224, 224);
    CHECK_NEAR(e.x, 58 * 500.0 / 341, 1e-9);
    CHECK_NEAR(e.y, 16 * 375.0 / 256, 1e-9);
    CHECK_NEAR(e.w, 224 * 500.0 / 341, 1e-9);
    CHECK_NEAR(e.h, 224 * 375.0 / 256, 1e-9);
    e = fl_resize_center_crop_box(300, 600, 256, 224, 224); /* tall: 256 x 512 */
    CHECK_NEAR(e.x, 16 * 300.0 / 256, 1e-9);
    CHECK_NEAR(e.y, 144 * 600.0 / 512, 1e-9);
}

static void smooth_image(fl_image *im, int w, int h) {
    CHECK_OK(fl_image_alloc(im, w, h, 3));
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *p = im->data + ((size_t)y * w + x) * 3;
            p[0] = (uint8_t)(128 + 100 * sin(x * 0.05));
            p[1] = (uint8_t)(128 + 100 * cos(y * 0.07));
            p[2] = (uint8_t)(128 + 100 * sin((x + y) * 0.03));
        }
}

static void test_jpeg_round_trip(void) {
    fl_image im, out;
    smooth_image(&im, 400, 300);
    uint8_t *buf;
    size_t len;
    CHECK_OK(fl_jpeg_encode(&im, 95, &buf, &len));
    int w, h, num;
    CHECK_OK(fl_jpeg_size(buf, len, &w, &h));
    CHECK(w == 400 && h == 300);
    CHECK_OK(fl_jpeg_decode(buf, len, 0, 0, &out, &num));
    CHECK(out.w == 400 && out.h == 300 && out.c == 3 && num == 8);
    double sum = 0;
    int maxd = 0;
    for (size_t i = 0; i < (size_t)400 * 300 * 3; i++) {
        int d = abs((int)out.data[i] - (int)im.data[i]);
        sum += d;
        maxd = d > maxd ? d : maxd;
    }
    CHECK(sum / (400.0 * 300 * 3) < 2.0);
    CHECK(maxd < 40);
    fl_image_free(&out);
    /* DCT scaling: the smallest of 1/8, 1/4, 1/2, 1 that keeps the requested size */
    CHECK_OK(fl_jpeg_decode(buf, len, 100, 75, &out, &num));
    CHECK(num == 2 && out.w == 100 && out.h == 75);
    fl_image_free(&out);
    CHECK_OK(fl_jpeg_decode(buf, len, 101, 10, &out, &num));
    CHECK(num == 4 && out.w == 200 && out.h == 150);
    fl_image_free(&out);
    CHECK_OK(fl_jpeg_decode(buf, len, 20, 20, &out, &num));
    CHECK(num == 1 && out.w == 50 && out.h == 38); /* ceil(300 / 8) */
    fl_image_free(&out);
    CHECK_OK(fl_jpeg_decode(buf, len, 5000, 5000, &out, &num));
    CHECK(num == 8 && out.w == 400);
    fl_image_free(&out);

    /* corrupt and truncated streams fail with FL_EFORMAT, never crash */
    CHECK_RC(fl_jpeg_decode(buf, len / 2, 0, 0, &out, NULL), FL_EFORMAT);
    CHECK_MSG("JPEG");
    CHECK(out.data == NULL);
    CHECK_RC(fl_jpeg_decode(buf, 100, 0, 0, &out, NULL), FL_EFORMAT);
    uint8_t junk[256];
    for (int i = 0; i < 256; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    CHECK_RC(fl_jpeg_decode(junk, sizeof junk, 0, 0, &out, NULL), FL_EFORMAT);
    CHECK_MSG("corrupt JPEG");
    CHECK_RC(fl_jpeg_decode(junk, 0, 0, 0, &out, NULL), FL_EFORMAT);
    CHECK_RC(fl_jpeg_size(junk, sizeof junk, &w, &h), FL_EFORMAT);
    /* scrambled entropy-coded data in the middle: an error or a warning, never a crash */
    uint8_t *bad = malloc(len);
    memcpy(bad, buf, len);
    for (size_t i = len / 3; i < len / 3 + 64; i++)
        bad[i] ^= 0x5a;
    int rc = fl_jpeg_decode(bad, len, 0, 0, &out, NULL);
    CHECK(rc == FL_OK || rc == FL_EFORMAT);
    fl_image_free(&out);
    free(bad);
    free(buf);
    fl_image_free(&im);
}

/* A region decode is the full decode (at the same scale) cut to a window that covers the box
 * with a pixel to spare. */
static void test_jpeg_region(void) {
    fl_image im;
    smooth_image(&im, 403, 301); /* not a multiple of the 16-pixel iMCU */
    for (int y = 0; y < 301; y++)  /* texture, so misplaced pixels would show */
        for (int x = 0; x < 403; x++)
            im.data[((size_t)y * 403 + x) * 3 + 1] ^= (uint8_t)((x * 7 + y * 13) & 31);
    uint8_t *buf;
    size_t len;
    CHECK_OK(fl_jpeg_encode(&im, 90, &buf, &len));
    const fl_box boxes[] = {{0, 0, 403, 301}, {17, 33, 200, 150}, {390, 290, 13, 11},
                            {0, 100, 50, 201}, {123.4, 5.6, 77.7, 88.8}, {200, 0, 203, 1}};
    const int mins[][2] = {{0, 0}, {40, 40}, {120, 80}, {300, 300}};
    for (int b = 0; b < 6; b++)
        for (int m = 0; m < 4; m++) {
            fl_image full, reg;
            int nf, nr, ox = -1, oy = -1;
            CHECK_OK(fl_jpeg_decode(buf, len, mins[m][0], mins[m][1], &full, &nf));
            CHECK_OK(fl_jpeg_decode_region(buf, len, boxes[b], mins[m][0], mins[m][1], &reg, &nr,
                                           &ox, &oy));
            CHECK(nf == nr && full.w == (403 * nf + 7) / 8 && full.h == (301 * nf + 7) / 8);
            double k = nf / 8.0; /* a block of 8 becomes nf pixels */
            int need_x0 = (int)floor(boxes[b].x * k) - 1, need_y0 = (int)floor(boxes[b].y * k) - 1;
            int need_x1 = (int)ceil((boxes[b].x + boxes[b].w) * k) + 1;
            int need_y1 = (int)ceil((boxes[b].y + boxes[b].h) * k) + 1;
            need_x0 = need_x0 < 0 ? 0 : need_x0, need_y0 = need_y0 < 0 ? 0 : need_y0;
            need_x1 = need_x1 > full.w ? full.w : need_x1;
            need_y1 = need_y1 > full.h ? full.h : need_y1;
            CHECK(ox >= 0 && oy >= 0 && ox <= need_x0 && oy <= need_y0);
            CHECK(ox + reg.w >= need_x1 && oy + reg.h >= need_y1);
            CHECK(ox + reg.w <= full.w && oy + reg.h <= full.h);
            int maxd = 0;
            for (int y = 0; y < reg.h && reg.data && full.data; y++)
                for (int x = 0; x < reg.w * 3; x++) {
                    int d = abs((int)reg.data[(size_t)y * reg.w * 3 + x] -
                                (int)full.data[((size_t)(oy + y) * full.w + ox) * 3 + x]);
                    maxd = d > maxd ? d : maxd;
                }
            if (maxd != 0) {
                fprintf(stderr, "region %d scale %d/8: max |region - full| = %d\n", b, nf, maxd);
                test_failures++;
            }
            fl_image_free(&full);
            fl_image_free(&reg);
        }
    /* a truncated stream fails for a box in its intact top rows too */
    fl_image reg;
    CHECK_RC(fl_jpeg_decode_region(buf, len * 2 / 3, (fl_box){0, 0, 40, 20}, 0, 0, &reg, NULL,
                                   NULL, NULL), FL_EFORMAT);
    CHECK(reg.data == NULL);
    free(buf);
    fl_image_free(&im);
}

static void test_jpeg_gray_and_cmyk(void) {
    fl_image g, out;
    CHECK_OK(fl_image_alloc(&g, 32, 16, 1));
    for (int i = 0; i < 32 * 16; i++)
        g.data[i] = (uint8_t)(i % 32 * 8);
    uint8_t *buf;
    size_t len;
    CHECK_OK(fl_jpeg_encode(&g, 100, &buf, &len));
    CHECK_OK(fl_jpeg_decode(buf, len, 0, 0, &out, NULL));
    CHECK(out.c == 3 && out.w == 32 && out.h == 16);
    int same = 1, close = 1;
    for (int i = 0; i < 32 * 16; i++) {
        same &= out.data[3 * i] == out.data[3 * i + 1] && out.data[3 * i] == out.data[3 * i + 2];
        close &= abs((int)out.data[3 * i] - g.data[i]) <= 6;
    }
    CHECK(same && close);
    fl_image_free(&out);
    free(buf);
    fl_image_free(&g);

    /* an Adobe CMYK JPEG (inverted, as Photoshop writes): stored (255, 0, 0, 255) is red */
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    unsigned char *mem = NULL;
    unsigned long mlen = 0;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    jpeg_mem_dest(&ci, &mem, &mlen);
    ci.image_width = 16;
    ci.image_height = 16;
    ci.input_components = 4;
    ci.in_color_space = JCS_CMYK;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 100, TRUE);
    jpeg_start_compress(&ci, TRUE);
    uint8_t row[16 * 4];
    for (int i = 0; i < 16; i++)
        row[4 * i] = 255, row[4 * i + 1] = 0, row[4 * i + 2] = 0, row[4 * i + 3] = 255;
    while (ci.next_scanline < 16) {
        JSAMPROW rp = row;
        jpeg_write_scanlines(&ci, &rp, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    CHECK_OK(fl_jpeg_decode(mem, mlen, 0, 0, &out, NULL));
    CHECK(out.c == 3 && out.w == 16);
    if (out.data)
        CHECK(out.data[0] >= 250 && out.data[1] <= 5 && out.data[2] <= 5);
    fl_image_free(&out);
    int ox, oy;
    CHECK_OK(fl_jpeg_decode_region(mem, mlen, (fl_box){9, 9, 3, 3}, 0, 0, &out, NULL, &ox, &oy));
    CHECK(out.c == 3 && out.w >= 5 && ox <= 8 && oy == 8);
    if (out.data)
        CHECK(out.data[0] >= 250 && out.data[1] <= 5 && out.data[2] <= 5);
    fl_image_free(&out);
    free(mem);
}

int main(void) {
    test_bilinear_reference();
    test_bilinear_affine();
    test_normalise();
    test_crop_boxes();
    test_jpeg_round_trip();
    test_jpeg_region();
    test_jpeg_gray_and_cmyk();
    TEST_DONE();
}
