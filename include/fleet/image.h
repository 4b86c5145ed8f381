/* image.h - 8-bit images, JPEG decoding and encoding (libjpeg-turbo), and the crop / resize /
 * flip / normalise transforms of the ImageNet and CIFAR pipelines.
 *
 * Images are interleaved RGB, row-major (H, W, C) u8 as libjpeg produces them; the transforms
 * turn a box of one into a normalised (C, H, W) f32 network input in a single pass. Geometry
 * follows torchvision (RandomResizedCrop, Resize + CenterCrop) so the seeds' recipe carries
 * over; resampling is plain bilinear with half-pixel centres (OpenCV INTER_LINEAR, which
 * Paddle's reader uses), without PIL's antialiasing: where a crop is reduced by 2x or more, the
 * decoder's DCT scaling does the coarse part of the reduction, so bilinear never has to shrink
 * by more than 2x. */
#ifndef FLEET_IMAGE_H
#define FLEET_IMAGE_H

#include "fleet/rng.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_image {
    int      w, h, c; /* c = 3 (RGB) for everything decoded here */
    uint8_t *data;    /* (H, W, C), owned by the image */
} fl_image;

/* Allocates a zeroed w x h x c image. FL_EINVAL for a non-positive or too large size. */
int  fl_image_alloc(fl_image *img, int w, int h, int c);
/* Frees img->data and zeroes *img. NULL and a zeroed image are no-ops. */
void fl_image_free(fl_image *img);

/* A crop box in source pixel coordinates: x, y is the top-left corner, w, h the extent (not
 * necessarily integers: an evaluation crop mapped back from a resized image is fractional). */
typedef struct fl_box {
    double x, y, w, h;
} fl_box;

/* ---- JPEG (jpeg_decode.c, jpeg_encode.c) ---------------------------------------------------
 * Decoding never aborts the process: libjpeg errors go through a setjmp error manager and come
 * back as FL_EFORMAT with libjpeg's message. A truncated stream (libjpeg's "Premature end of
 * JPEG file" warning) is an error too; other warnings ("extraneous bytes before marker") are
 * tolerated as PIL tolerates them. Grayscale becomes RGB; CMYK/YCCK (a few ImageNet files) is
 * converted to RGB (Adobe's inverted CMYK when the Adobe marker says so). */

/* Reads the header only: the image's full-size width and height. */
int fl_jpeg_size(const uint8_t *buf, size_t len, int *w, int *h);

/* Decodes buf into *out (RGB), allocating out->data (the caller frees it with fl_image_free).
 * With min_w, min_h > 0 the decoder uses libjpeg's DCT scaling by num/8, num in {1, 2, 4, 8}
 * (the factors with SIMD inverse DCTs), choosing the smallest whose output is still at least
 * min_w x min_h, which decodes a large image for a small target several times faster; 0, 0
 * decodes at full size. *scale_num (may be NULL) receives the num used; the output size is
 * ceil(W * num / 8) x ceil(H * num / 8).
 * Pixel budget: images over 2^28 pixels are refused (FL_EFORMAT). Thread-safe. */
int fl_jpeg_decode(const uint8_t *buf, size_t len, int min_w, int min_h, fl_image *out,
                   int *scale_num);

/* fl_jpeg_decode limited to what `box` (full-size coordinates) needs for bilinear sampling:
 * the scaled image's pixels covering the box (mapped by num/8) plus one pixel around it, widened
 * by libjpeg to whole iMCU columns (jpeg_crop_scanline), the rows above skipped
 * (jpeg_skip_scanlines); the rest gets no inverse DCT or colour conversion. *out holds the
 * scaled image's columns [*out_x, *out_x + out->w) and rows [*out_y, *out_y + out->h), pixel for
 * pixel as fl_jpeg_decode at the same scale gives them (libjpeg's inexact crop-edge columns are
 * decoded and dropped; test_image_transforms checks this at every scale). The rows below are
 * still entropy-decoded, so a truncated or corrupt stream fails exactly as in fl_jpeg_decode,
 * whatever the box. Thread-safe. */
int fl_jpeg_decode_region(const uint8_t *buf, size_t len, fl_box box, int min_w, int min_h,
                          fl_image *out, int *scale_num, int *out_x, int *out_y);

/* Encodes an RGB (c = 3) or gray (c = 1) image at quality 1..100 into a malloc'd buffer
 * (*out, *len; the caller frees *out). For tests and benchmarks that make their own JPEGs. */
int fl_jpeg_encode(const fl_image *img, int quality, uint8_t **out, size_t *len);
/* fl_jpeg_encode into the file `path` (FL_EIO naming it when it cannot be written). */
int fl_jpeg_write(const char *path, const fl_image *img, int quality);

/* ---- transforms (transforms.c) ------------------------------------------------------------ */

/* torchvision's RandomResizedCrop.get_params on a W x H image: up to 10 attempts at an area
 * fraction uniform in [scale_lo, scale_hi] and an aspect ratio log-uniform in [ratio_lo,
 * ratio_hi], w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio)), accepted when
 * 0 < w <= W and 0 < h <= H, then a uniform integer position; otherwise the centre crop of the
 * whole image clamped to the ratio range. Integer box. Returns true when an attempt succeeded
 * (false: the fallback was used). Needs 0 < scale_lo <= scale_hi and 0 < ratio_lo <= ratio_hi
 * (FL_ASSERT). */
bool fl_random_resized_crop_box(fl_rng *r, int W, int H, double scale_lo, double scale_hi,
                                double ratio_lo, double ratio_hi, fl_box *box);

/* The evaluation geometry: resize so the short side is `short_size` (the long side rounded as
 * torchvision's Resize(int) does), then a centre crop of crop_w x crop_h; returned as the
 * equivalent box in the source's coordinates. */
fl_box fl_resize_center_crop_box(int W, int H, int short_size, int crop_w, int crop_h);

/* Resamples `box` of src (in src's pixel coordinates) to out_w x out_h with bilinear
 * interpolation (sample centres at box.x + (i + 0.5) * box.w / out_w - 0.5, clamped to the
 * image), mirrors it left-right when `flip`, and writes (C, out_h, out_w) f32
 * (v / 255 - mean[c]) / std[c]. mean/std NULL means 0 and 1. For a source decoded at DCT scale
 * num/8, a full-size box maps to (x * num / 8 - region x, ...): pixel p of the scaled image
 * covers full-size pixels [8p / num, 8(p + 1) / num). */
void fl_image_resample_chw(const fl_image *src, fl_box box, int out_w, int out_h, bool flip,
                           const float *mean, const float *std, float *out);

/* ImageNet's channel statistics (torchvision's Normalize values), RGB. */
extern const float fl_imagenet_mean[3], fl_imagenet_std[3];

#ifdef __cplusplus
}
#endif
#endif /* FLEET_IMAGE_H */
