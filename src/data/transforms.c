/* transforms.c - the geometry of torchvision's RandomResizedCrop and Resize + CenterCrop, and
 * one fused pass that resamples a box bilinearly, flips, normalises and writes CHW f32, so a
 * training sample touches its pixels once after decoding. */
#include "fleet/image.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const float fl_imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
const float fl_imagenet_std[3] = {0.229f, 0.224f, 0.225f};

int fl_image_alloc(fl_image *img, int w, int h, int c) {
    FL_ASSERT(img);
    memset(img, 0, sizeof *img);
    if (w < 1 || h < 1 || c < 1 || (int64_t)w * h * c > ((int64_t)1 << 31))
        return fl_fail(FL_EINVAL, "image: bad size %d x %d x %d", w, h, c);
    img->data = calloc((size_t)w * (size_t)h * (size_t)c, 1);
    if (!img->data)
        return fl_fail(FL_ENOMEM, "image: cannot allocate %d x %d x %d", w, h, c);
    img->w = w, img->h = h, img->c = c;
    return FL_OK;
}

void fl_image_free(fl_image *img) {
    if (!img)
        return;
    free(img->data);
    memset(img, 0, sizeof *img);
}

/* torchvision.transforms.RandomResizedCrop.get_params (v0.14); Python's round() is
 * round-half-even, which nearbyint() gives in the default rounding mode. */
bool fl_random_resized_crop_box(fl_rng *r, int W, int H, double scale_lo, double scale_hi,
                                double ratio_lo, double ratio_hi, fl_box *box) {
    FL_ASSERT(r && box && W > 0 && H > 0);
    FL_ASSERT(scale_lo > 0 && scale_lo <= scale_hi && ratio_lo > 0 && ratio_lo <= ratio_hi);
    double area = (double)W * H, log_lo = log(ratio_lo), log_hi = log(ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale_lo + (scale_hi - scale_lo) * fl_rng_uniform_f64(r));
        double aspect = exp(log_lo + (log_hi - log_lo) * fl_rng_uniform_f64(r));
        double w = nearbyint(sqrt(target * aspect)), h = nearbyint(sqrt(target / aspect));
        if (w > 0 && w <= W && h > 0 && h <= H) {
            double y = (double)fl_rng_below(r, (uint64_t)(H - (int)h + 1));
            double x = (double)fl_rng_below(r, (uint64_t)(W - (int)w + 1));
            *box = (fl_box){.x = x, .y = y, .w = w, .h = h};
            return true;
        }
    }
    double in_ratio = (double)W / H, w = W, h = H;
    if (in_ratio < ratio_lo)
        h = nearbyint(w / ratio_lo);
    else if (in_ratio > ratio_hi)
        w = nearbyint(h * ratio_hi);
    *box = (fl_box){.x = (double)((W - (int)w) / 2), .y = (double)((H - (int)h) / 2), .w = w,
                    .h = h};
    return false;
}

/* torchvision Resize(short_size): the long side is int(short_size * long / short), truncated;
 * CenterCrop: offsets int(round((size - crop) / 2)). */
fl_box fl_resize_center_crop_box(int W, int H, int short_size, int crop_w, int crop_h) {
    FL_ASSERT(W > 0 && H > 0 && short_size > 0 && crop_w > 0 && crop_h > 0);
    int64_t rw, rh;
    if (W <= H) {
        rw = short_size;
        rh = (int64_t)short_size * H / W;
    } else {
        rh = short_size;
        rw = (int64_t)short_size * W / H;
    }
    double left = nearbyint((double)(rw - crop_w) / 2.0);
    double top = nearbyint((double)(rh - crop_h) / 2.0);
    double sx = (double)W / (double)rw, sy = (double)H / (double)rh;
    return (fl_box){.x = left * sx, .y = top * sy, .w = crop_w * sx, .h = crop_h * sy};
}

typedef struct {
    int   i0, i1; /* neighbouring source pixels */
    float f;      /* weight of i1 */
} tap;

static void make_taps(tap *t, int n, double start, double extent, int src_n, bool flip) {
    for (int i = 0; i < n; i++) {
        int o = flip ? n - 1 - i : i;
        double s = start + (o + 0.5) * extent / n - 0.5;
        if (s < 0)
            s = 0;
        if (s > src_n - 1)
            s = src_n - 1;
        int i0 = (int)s;
        t[i] = (tap){.i0 = i0, .i1 = i0 + 1 < src_n ? i0 + 1 : i0, .f = (float)(s - i0)};
    }
}

/* One source row interpolated horizontally at the output columns: (3, out_w) planes. */
static void hpass(const uint8_t *row, const tap *tx, int out_w, float *h) {
    for (int x = 0; x < out_w; x++) {
        const uint8_t *p0 = row + (size_t)tx[x].i0 * 3, *p1 = row + (size_t)tx[x].i1 * 3;
        float f = tx[x].f;
        for (int c = 0; c < 3; c++)
            h[c * out_w + x] = p0[c] + f * (float)(p1[c] - p0[c]);
    }
}

/* Separable: each source row the output needs is interpolated horizontally once (two rows
 * cached, as output rows walk down the source), then rows are blended vertically, normalised
 * and written plane by plane in contiguous, vectorisable loops. */
void fl_image_resample_chw(const fl_image *src, fl_box box, int out_w, int out_h, bool flip,
                           const float *mean, const float *std, float *out) {
    FL_ASSERT(src && src->data && src->c == 3 && out_w > 0 && out_h > 0);
    tap *tx = malloc(sizeof *tx * (size_t)out_w), *ty = malloc(sizeof *ty * (size_t)out_h);
    float *rows = malloc(sizeof *rows * 6 * (size_t)out_w);
    FL_ASSERT(tx && ty && rows); /* a few KB: out of memory here leaves nothing sensible to do */
    make_taps(tx, out_w, box.x, box.w, src->w, flip);
    make_taps(ty, out_h, box.y, box.h, src->h, false);
    float a[3], b[3]; /* out = v * a + b = (v / 255 - mean) / std */
    for (int c = 0; c < 3; c++) {
        float m = mean ? mean[c] : 0.0f, s = std ? std[c] : 1.0f;
        a[c] = 1.0f / (255.0f * s);
        b[c] = -m / s;
    }
    size_t plane = (size_t)out_w * (size_t)out_h, stride = (size_t)src->w * 3;
    float *cache[2] = {rows, rows + 3 * (size_t)out_w};
    int cached[2] = {-1, -1}; /* source row held by each cache buffer */
    for (int y = 0; y < out_h; y++) {
        const float *h[2];
        for (int k = 0; k < 2; k++) {
            int sy = k ? ty[y].i1 : ty[y].i0;
            int slot = cached[0] == sy ? 0 : cached[1] == sy ? 1 : -1;
            if (slot < 0) { /* replace the buffer the other tap does not use */
                int other = k ? ty[y].i0 : -2;
                slot = cached[0] == other ? 1 : 0;
                hpass(src->data + (size_t)sy * stride, tx, out_w, cache[slot]);
                cached[slot] = sy;
            }
            h[k] = cache[slot];
        }
        float fy = ty[y].f;
        for (int c = 0; c < 3; c++) {
            const float *t = h[0] + (size_t)c * out_w, *u = h[1] + (size_t)c * out_w;
            float *o = out + c * plane + (size_t)y * out_w, ac = a[c], bc = b[c];
#pragma omp simd
            for (int x = 0; x < out_w; x++)
                o[x] = (t[x] + fy * (u[x] - t[x])) * ac + bc;
        }
    }
    free(rows);
    free(tx);
    free(ty);
}
