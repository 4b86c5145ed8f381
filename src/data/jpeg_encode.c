/* jpeg_encode.c - RGB or gray u8 to JPEG with libjpeg-turbo, into memory or a file. Used by the
 * tests and the benchmark to make their own trees of JPEGs, so nothing has to be downloaded. */
#include "fleet/image.h"

#include "fleet/status.h"

#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf               jump;
    char                  msg[JMSG_LENGTH_MAX];
    unsigned char        *buf; /* jpeg_mem_dest's output, here so the error path can free it */
    unsigned long         len;
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *e = (error_mgr *)cinfo->err;
    cinfo->err->format_message(cinfo, e->msg);
    longjmp(e->jump, 1);
}

int fl_jpeg_encode(const fl_image *img, int quality, uint8_t **out, size_t *len) {
    FL_ASSERT(img && img->data && out && len);
    if (img->c != 1 && img->c != 3)
        return fl_fail(FL_EINVAL, "JPEG encode: %d channels (want 1 or 3)", img->c);
    if (quality < 1 || quality > 100)
        return fl_fail(FL_EINVAL, "JPEG encode: quality %d outside [1, 100]", quality);
    struct jpeg_compress_struct cinfo;
    error_mgr e;
    e.buf = NULL;
    e.len = 0;
    cinfo.err = jpeg_std_error(&e.mgr);
    e.mgr.error_exit = on_error;
    if (setjmp(e.jump)) {
        jpeg_destroy_compress(&cinfo);
        free(e.buf);
        return fl_fail(FL_EFORMAT, "JPEG encode: %s", e.msg);
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, &e.buf, &e.len);
    cinfo.image_width = (JDIMENSION)img->w;
    cinfo.image_height = (JDIMENSION)img->h;
    cinfo.input_components = img->c;
    cinfo.in_color_space = img->c == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = img->data + (size_t)cinfo.next_scanline * (size_t)img->w * (size_t)img->c;
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    *out = e.buf;
    *len = e.len;
    return FL_OK;
}

int fl_jpeg_write(const char *path, const fl_image *img, int quality) {
    uint8_t *buf = NULL;
    size_t len = 0;
    FL_TRY(fl_jpeg_encode(img, quality, &buf, &len));
    FILE *f = fopen(path, "wb");
    if (!f) {
        int err = errno;
        free(buf);
        return fl_fail(FL_EIO, "%s: cannot create: %s", path, strerror(err));
    }
    size_t n = fwrite(buf, 1, len, f);
    int closed = fclose(f);
    free(buf);
    if (n != len || closed != 0)
        return fl_fail(FL_EIO, "%s: write failed", path);
    return FL_OK;
}
