/* idx.c - the IDX format of MNIST and Fashion-MNIST (LeCun et al. 1998; Xiao et al. 2017,
 * arXiv:1708.07747): a 4-byte magic (two zero bytes, the element type, the number of
 * dimensions), one big-endian u32 per dimension, then the elements in row-major order. Files
 * are read through zlib's gzread, which inflates gzip and passes plain files through unchanged,
 * so `.gz` and uncompressed files take the same path. Every header field and the data length
 * are checked, so a truncated download or a label file of the wrong set fails at open, naming
 * the file and what is wrong. */
#include "fleet/data.h"

#include "fleet/status.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_UBYTE 0x08

static const char *gz_message(gzFile f) {
    int err = 0;
    const char *msg = gzerror(f, &err);
    if (err == Z_ERRNO)
        return strerror(errno);
    return msg && msg[0] ? msg : "read failed";
}

/* Reads exactly n bytes; FL_EFORMAT naming path and what when the file ends first. */
static int read_exact(gzFile f, const char *path, void *buf, size_t n, const char *what) {
    size_t got = 0;
    while (got < n) {
        unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0)
            return fl_fail(FL_EFORMAT, "%s: cannot read %s: %s (corrupt gzip stream?)", path,
                           what, gz_message(f));
        if (r == 0)
            return fl_fail(FL_EFORMAT, "%s: truncated: %s ends after %zu of %zu bytes", path,
                           what, got, n);
        got += (size_t)r;
    }
    return FL_OK;
}

void fl_idx_free(fl_idx *idx) {
    if (!idx)
        return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

int fl_idx_read(const char *path, fl_idx *out) {
    FL_ASSERT(path && out);
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, errno ? strerror(errno) : "gzopen");
    int rc = FL_OK;
    uint8_t magic[4];
    if ((rc = read_exact(f, path, magic, 4, "the magic number")) < 0)
        goto done;
    if (magic[0] != 0 || magic[1] != 0) {
        rc = fl_fail(FL_EFORMAT, "%s: not an IDX file (magic %02x %02x %02x %02x; an IDX file "
                     "starts with two zero bytes)", path, magic[0], magic[1], magic[2], magic[3]);
        goto done;
    }
    if (magic[2] != IDX_UBYTE) {
        rc = fl_fail(FL_EFORMAT, "%s: element type 0x%02x, but only unsigned bytes (0x08) are "
                     "read", path, magic[2]);
        goto done;
    }
    if (magic[3] < 1 || magic[3] > FL_IDX_MAX_DIMS) {
        rc = fl_fail(FL_EFORMAT, "%s: %d dimensions (1 to %d are read)", path, magic[3],
                     FL_IDX_MAX_DIMS);
        goto done;
    }
    out->ndim = magic[3];
    uint8_t dims[4 * FL_IDX_MAX_DIMS];
    if ((rc = read_exact(f, path, dims, 4 * (size_t)out->ndim, "the dimensions")) < 0)
        goto done;
    size_t count = 1;
    for (int i = 0; i < out->ndim; i++) {
        const uint8_t *d = dims + 4 * i;
        out->dims[i] = (int64_t)((uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 |
                                 (uint32_t)d[2] << 8 | d[3]);
        if (out->dims[i] == 0 || (i > 0 && out->dims[i] > 65536) ||
            count > ((size_t)1 << 40) / (size_t)out->dims[i]) {
            rc = fl_fail(FL_EFORMAT, "%s: dimension %d is %lld (implausible for a data set)",
                         path, i, (long long)out->dims[i]);
            goto done;
        }
        count *= (size_t)out->dims[i];
    }
    out->data = malloc(count);
    if (!out->data) {
        rc = fl_fail(FL_ENOMEM, "%s: cannot allocate %zu bytes", path, count);
        goto done;
    }
    if ((rc = read_exact(f, path, out->data, count, "the data")) < 0)
        goto done;
    uint8_t extra;
    int r = gzread(f, &extra, 1);
    if (r != 0) {
        rc = r < 0 ? fl_fail(FL_EFORMAT, "%s: %s", path, gz_message(f))
                   : fl_fail(FL_EFORMAT, "%s: longer than its header says (%zu bytes of data "
                             "expected)", path, count);
        goto done;
    }
done:
    gzclose(f);
    if (rc < 0)
        fl_idx_free(out);
    return rc;
}
