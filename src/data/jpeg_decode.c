/* jpeg_decode.c - JPEG to RGB with libjpeg-turbo, behind a setjmp error manager so that a
 * corrupt file comes back as FL_EFORMAT instead of libjpeg's default exit(). DCT scaling
 * (scale_num / 8) decodes big images for small targets without the full-size inverse DCT, and
 * libjpeg-turbo's jpeg_crop_scanline / jpeg_skip_scanlines skip the inverse DCT and colour
 * conversion of what a crop does not need. */
#include "fleet/image.h"

#include "fleet/status.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t declared first */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#define MAX_PIXELS ((int64_t)1 << 28)

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf               jump;
    bool                  truncated; /* saw "Premature end of JPEG file" */
    char                  msg[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *e = (error_mgr *)cinfo->err;
    cinfo->err->format_message(cinfo, e->msg);
    longjmp(e->jump, 1);
}

/* Warnings (level -1) are tolerated except the end-of-file one; trace messages are dropped. */
static void on_message(j_common_ptr cinfo, int level) {
    error_mgr *e = (error_mgr *)cinfo->err;
    if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
        e->truncated = true;
}

static void init_errors(struct jpeg_decompress_struct *cinfo, error_mgr *e) {
    cinfo->err = jpeg_std_error(&e->mgr);
    e->mgr.error_exit = on_error;
    e->mgr.emit_message = on_message;
    e->truncated = false;
    e->msg[0] = '\0';
}

int fl_jpeg_size(const uint8_t *buf, size_t len, int *w, int *h) {
    FL_ASSERT(buf && w && h);
    struct jpeg_decompress_struct cinfo;
    error_mgr e;
    init_errors(&cinfo, &e);
    if (setjmp(e.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return fl_fail(FL_EFORMAT, "corrupt JPEG: %s", e.msg);
    }
    jpeg_create_decompress(&cinfo);
    if (len > ULONG_MAX)
        len = ULONG_MAX;
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    *w = (int)cinfo.image_width;
    *h = (int)cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return FL_OK;
}

/* CMYK as libjpeg returns it, 4 bytes a pixel, to RGB. Adobe writes CMYK inverted (0 = full
 * ink), which is what PIL and OpenCV assume when the Adobe marker is present. */
static void cmyk_to_rgb(const uint8_t *in, uint8_t *out, int w, bool inverted) {
    for (int i = 0; i < w; i++) {
        unsigned c = in[4 * i], m = in[4 * i + 1], y = in[4 * i + 2], k = in[4 * i + 3];
        if (!inverted) {
            c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        }
        out[3 * i] = (uint8_t)((c * k + 127) / 255);
        out[3 * i + 1] = (uint8_t)((m * k + 127) / 255);
        out[3 * i + 2] = (uint8_t)((y * k + 127) / 255);
    }
}

/* Both decoders: the whole scaled image (box NULL), or the rows and iMCU columns around box. */
static int decode(const uint8_t *buf, size_t len, const fl_box *box, int min_w, int min_h,
                  fl_image *out, int *scale_num, int *out_x, int *out_y) {
    FL_ASSERT(buf && out);
    struct jpeg_decompress_struct cinfo;
    error_mgr e;
    /* written after setjmp and read after longjmp: volatile, so not cached in registers */
    uint8_t *volatile pixels = NULL;
    uint8_t *volatile line = NULL; /* one scanline, for CMYK and for region decodes */
    memset(out, 0, sizeof *out);
    init_errors(&cinfo, &e);
    if (setjmp(e.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        free(line);
        return fl_fail(FL_EFORMAT, "corrupt JPEG: %s", e.msg);
    }
    jpeg_create_decompress(&cinfo);
    if (len > ULONG_MAX)
        len = ULONG_MAX;
    jpeg_mem_src(&cinfo, buf, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    int64_t W = cinfo.image_width, H = cinfo.image_height;
    if (W < 1 || H < 1 || W * H > MAX_PIXELS) {
        jpeg_destroy_decompress(&cinfo);
        return fl_fail(FL_EFORMAT, "JPEG of %lld x %lld pixels is outside the decoder's budget "
                       "(1 to 2^28 pixels)", (long long)W, (long long)H);
    }
    int num = 8;
    if (min_w > 0 && min_h > 0)
        for (num = 1; num < 8; num *= 2)
            if ((W * num + 7) / 8 >= min_w && (H * num + 7) / 8 >= min_h)
                break;
    cinfo.scale_num = (unsigned)num;
    cinfo.scale_denom = 8;
    bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    JDIMENSION sw = cinfo.output_width, sh = cinfo.output_height;
    JDIMENSION x0 = 0, y0 = 0, y1 = sh, lx = 0, ow = sw;
    if (box) {
        /* the box in scaled pixels, one pixel of margin for the bilinear neighbours */
        double kx = num / 8.0, ky = kx; /* an 8 x 8 block becomes num x num pixels */
        double bx0 = floor(box->x * kx) - 1, bx1 = ceil((box->x + box->w) * kx) + 1;
        double by0 = floor(box->y * ky) - 1, by1 = ceil((box->y + box->h) * ky) + 1;
        JDIMENSION wx0 = bx0 < 0 ? 0 : bx0 >= sw ? sw - 1 : (JDIMENSION)bx0;
        JDIMENSION wx1 = bx1 > sw ? sw : bx1 <= wx0 ? wx0 + 1 : (JDIMENSION)bx1;
        y0 = by0 < 0 ? 0 : by0 >= sh ? sh - 1 : (JDIMENSION)by0;
        y1 = by1 > sh ? sh : by1 <= y0 ? y0 + 1 : (JDIMENSION)by1;
        /* libjpeg's crop widens to whole iMCU columns; its edge columns are upsampled without
         * their outer chroma neighbour, so ask for one more on each side and drop those */
        JDIMENSION cx = wx0 > 0 ? wx0 - 1 : 0, cw = (wx1 < sw ? wx1 + 1 : sw) - cx;
        if (cw < sw)
            jpeg_crop_scanline(&cinfo, &cx, &cw);
        else
            cx = 0, cw = sw;
        x0 = cx > 0 ? cx + 1 : 0;
        JDIMENSION x1 = cx + cw < sw ? cx + cw - 1 : sw;
        lx = x0 - cx;
        ow = x1 - x0;
        if (y0 > 0)
            jpeg_skip_scanlines(&cinfo, y0);
    }
    int oh = (int)(y1 - y0);
    bool direct = !box && !cmyk; /* decode straight into the image */
    pixels = malloc((size_t)ow * (size_t)oh * 3);
    if (!direct)
        line = malloc((size_t)cinfo.output_width * 4);
    if (!pixels || (!direct && !line)) {
        jpeg_destroy_decompress(&cinfo);
        free(pixels);
        free(line);
        return fl_fail(FL_ENOMEM, "JPEG: cannot allocate %u x %d pixels", ow, oh);
    }
    while (cinfo.output_scanline < y1) {
        uint8_t *dst = pixels + (size_t)(cinfo.output_scanline - y0) * (size_t)ow * 3;
        JSAMPROW row = direct ? dst : line;
        jpeg_read_scanlines(&cinfo, &row, 1);
        if (cmyk)
            cmyk_to_rgb(line + (size_t)lx * 4, dst, (int)ow, cinfo.saw_Adobe_marker);
        else if (!direct)
            memcpy(dst, line + (size_t)lx * 3, (size_t)ow * 3);
    }
    /* the rows below are still entropy-decoded (skipping all of them would not read the data
     * at all), so that a truncated or corrupt stream fails the same way whatever the box */
    if (y1 < sh) {
        if (sh - y1 > 1)
            jpeg_skip_scanlines(&cinfo, sh - y1 - 1);
        JSAMPROW row = line;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(line);
    if (e.truncated) {
        free(pixels);
        return fl_fail(FL_EFORMAT, "corrupt JPEG: premature end of file (truncated)");
    }
    *out = (fl_image){.w = (int)ow, .h = oh, .c = 3, .data = pixels};
    if (scale_num)
        *scale_num = num;
    if (out_x)
        *out_x = (int)x0;
    if (out_y)
        *out_y = (int)y0;
    return FL_OK;
}

int fl_jpeg_decode(const uint8_t *buf, size_t len, int min_w, int min_h, fl_image *out,
                   int *scale_num) {
    return decode(buf, len, NULL, min_w, min_h, out, scale_num, NULL, NULL);
}

int fl_jpeg_decode_region(const uint8_t *buf, size_t len, fl_box box, int min_w, int min_h,
                          fl_image *out, int *scale_num, int *out_x, int *out_y) {
    return decode(buf, len, &box, min_w, min_h, out, scale_num, out_x, out_y);
}
