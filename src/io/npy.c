/* npy.c - NumPy .npy files (format 1.0) for f32 arrays: the writer fleet-eval uses for its
 * output vectors, and a reader of the same subset for tests and tools. */
#include "fleet/npy.h"

#include "fleet/status.h"
#include "io/atomic.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c writes host floats as '<f4': port it to big-endian hosts"
#endif

int fl_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data) {
    FL_ASSERT(ndim >= 1 && ndim <= 6);
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRId64 "%s", shape[d],
                      ndim == 1 ? "," : d + 1 < ndim ? ", " : "");
        numel *= shape[d];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic (6) + version (2) + length (2) + dict + padding + '\n' = a multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    unsigned char head[320];
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    uint16_t hlen = (uint16_t)(padded - 10);
    head[8] = (unsigned char)(hlen & 0xFF);
    head[9] = (unsigned char)(hlen >> 8);
    memcpy(head + 10, dict, (size_t)n);
    memset(head + 10 + n, ' ', padded - total);
    head[padded - 1] = '\n';
    fl_atomic_file f;
    FL_TRY(fl_atomic_begin(&f, path));
    int rc = fl_atomic_write(&f, head, padded);
    if (rc >= 0)
        rc = fl_atomic_write(&f, data, (size_t)numel * sizeof(float));
    if (rc < 0) {
        fl_atomic_abort(&f);
        return rc;
    }
    return fl_atomic_commit(&f);
}

int fl_npy_read_f32(const char *path, int *ndim, int64_t shape[6], float **data) {
    *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char pre[12];
    char *hdr = NULL;
    int rc = FL_OK;
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        rc = fl_fail(FL_EFORMAT, "%s: not a .npy file", path);
        goto out;
    }
    size_t hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    if (pre[6] == 2) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            rc = fl_fail(FL_EFORMAT, "%s: truncated header", path);
            goto out;
        }
        hlen |= (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    } else if (pre[6] != 1) {
        rc = fl_fail(FL_EFORMAT, "%s: .npy version %d is not 1 or 2", path, pre[6]);
        goto out;
    }
    hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        rc = fl_fail(FL_EFORMAT, "%s: truncated header", path);
        goto out;
    }
    hdr[hlen] = '\0';
    if (!strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False")) {
        rc = fl_fail(FL_EFORMAT, "%s: not a C-ordered '<f4' array: %s", path, hdr);
        goto out;
    }
    const char *s = strstr(hdr, "'shape': (");
    if (!s) {
        rc = fl_fail(FL_EFORMAT, "%s: no shape in header", path);
        goto out;
    }
    s += 10;
    *ndim = 0;
    int64_t numel = 1;
    while (*s && *s != ')') {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || *ndim == 6) {
            rc = fl_fail(FL_EFORMAT, "%s: bad shape in header", path);
            goto out;
        }
        shape[(*ndim)++] = v;
        numel *= v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    *data = malloc((size_t)(numel ? numel : 1) * sizeof(float));
    if (!*data) {
        rc = fl_fail(FL_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if (fread(*data, sizeof(float), (size_t)numel, f) != (size_t)numel) {
        rc = fl_fail(FL_EFORMAT, "%s: truncated data", path);
        free(*data);
        *data = NULL;
    }
out:
    free(hdr);
    fclose(f);
    return rc;
}
