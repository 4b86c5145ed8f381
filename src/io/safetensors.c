/* safetensors.c - writer and validating reader of the safetensors format (see safetensors.h).
 * The reader takes the whole file into memory and checks every byte range and checksum before
 * returning, so callers never see a damaged or partial file; the writer goes through
 * io/atomic.c so that a killed writer leaves the previous file in place. */
#include "fleet/safetensors.h"

#include "fleet/status.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/json_parse.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes host memory as little-endian data: port it to big-endian hosts"
#endif

#define MAX_HEADER (100u << 20) /* the format's own limit on the header size */
#define CRC_PREFIX "crc32."
#define META_CRC "crc32.__metadata__" /* over the other metadata: key NUL value NUL, in order */

/* CRC-32 through zlib's crc32_z (slice-by-8 tables, the same polynomial and result as the
 * table-driven loop this replaced, so files written before still verify). */
uint32_t fl_crc32(uint32_t crc, const void *data, size_t n) {
    if (n == 0) /* crc32_z(crc, NULL, 0) would return the initial value, not crc */
        return crc;
    return (uint32_t)crc32_z(crc, data, n);
}

static const char *const dtype_names[FL_DTYPE_COUNT] = {
    [FL_DTYPE_F32] = "F32", [FL_DTYPE_F64] = "F64", [FL_DTYPE_F16] = "F16",
    [FL_DTYPE_BF16] = "BF16", [FL_DTYPE_I32] = "I32", [FL_DTYPE_I64] = "I64",
    [FL_DTYPE_U8] = "U8",
};

const char *fl_safetensors_dtype_name(fl_dtype t) {
    FL_ASSERT(t >= 0 && t < FL_DTYPE_COUNT);
    return dtype_names[t];
}

static int dtype_from_name(const char *s, fl_dtype *out) {
    for (int t = 0; t < FL_DTYPE_COUNT; t++)
        if (strcmp(s, dtype_names[t]) == 0) {
            *out = (fl_dtype)t;
            return 1;
        }
    return 0;
}

/* --- writer --- */

static size_t entry_bytes(const fl_st_entry *e) {
    return (size_t)fl_shape_numel(e->ndim, e->shape) * fl_dtype_size(e->dtype);
}

static int build_header(const char *path, const fl_st_entry *t, int n, const fl_st_meta *meta,
                        int nmeta, fl_json_buf *h) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
            return fl_fail(FL_EINVAL, "%s: bad tensor name '%s'", path, t[i].name);
        if (t[i].ndim < 0 || t[i].ndim > FL_MAX_DIMS)
            return fl_fail(FL_EINVAL, "%s: tensor '%s' has %d dimensions", path, t[i].name,
                           t[i].ndim);
        for (int j = 0; j < i; j++)
            if (strcmp(t[i].name, t[j].name) == 0)
                return fl_fail(FL_EINVAL, "%s: tensor '%s' given twice", path, t[i].name);
    }
    for (int i = 0; i < nmeta; i++)
        if (strncmp(meta[i].key, CRC_PREFIX, strlen(CRC_PREFIX)) == 0)
            return fl_fail(FL_EINVAL, "%s: metadata key '%s' is reserved for checksums", path,
                           meta[i].key);
    fl_json_append(h, "{", 1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t nb = entry_bytes(&t[i]);
        fl_json_string(h, t[i].name, strlen(t[i].name));
        fl_json_appendf(h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[t[i].dtype]);
        for (int d = 0; d < t[i].ndim; d++)
            fl_json_appendf(h, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        fl_json_appendf(h, "],\"data_offsets\":[%zu,%zu]},", off, off + nb);
        off += nb;
    }
    fl_json_append(h, "\"__metadata__\":{", 16);
    for (int i = 0; i < nmeta; i++) {
        fl_json_string(h, meta[i].key, strlen(meta[i].key));
        fl_json_append(h, ":", 1);
        fl_json_string(h, meta[i].value, strlen(meta[i].value));
        fl_json_append(h, ",", 1);
    }
    uint32_t mcrc = 0;
    for (int i = 0; i < nmeta; i++) {
        mcrc = fl_crc32(mcrc, meta[i].key, strlen(meta[i].key) + 1);
        mcrc = fl_crc32(mcrc, meta[i].value, strlen(meta[i].value) + 1);
    }
    fl_json_appendf(h, "\"" META_CRC "\":\"%08" PRIx32 "\"%s", mcrc, n ? "," : "");
    for (int i = 0; i < n; i++) {
        char key[160];
        snprintf(key, sizeof key, CRC_PREFIX "%s", t[i].name);
        fl_json_string(h, key, strlen(key));
        fl_json_appendf(h, ":\"%08" PRIx32 "\"%s", fl_crc32(0, t[i].data, entry_bytes(&t[i])),
                        i + 1 < n ? "," : "");
    }
    fl_json_append(h, "}}", 2);
    while (h->len % 8) /* the data starts 8-byte aligned, as the reference writer does */
        fl_json_append(h, " ", 1);
    if (h->failed)
        return fl_fail(FL_ENOMEM, "%s: out of memory building the header", path);
    return FL_OK;
}

int fl_safetensors_write(const char *path, const fl_st_entry *t, int n, const fl_st_meta *meta,
                         int nmeta) {
    FL_ASSERT(path && (t || n == 0) && (meta || nmeta == 0));
    fl_json_buf h = {0};
    int rc = build_header(path, t, n, meta, nmeta, &h);
    if (rc < 0) {
        fl_json_buf_free(&h);
        return rc;
    }
    fl_atomic_file f;
    rc = fl_atomic_begin(&f, path);
    if (rc < 0) {
        fl_json_buf_free(&h);
        return rc;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    rc = fl_atomic_write(&f, len8, 8);
    if (rc >= 0)
        rc = fl_atomic_write(&f, h.p, h.len);
    for (int i = 0; rc >= 0 && i < n; i++)
        rc = fl_atomic_write(&f, t[i].data, entry_bytes(&t[i]));
    fl_json_buf_free(&h);
    if (rc < 0) {
        fl_atomic_abort(&f);
        return rc;
    }
    return fl_atomic_commit(&f);
}

/* --- reader --- */

struct fl_safetensors {
    char          *path;
    unsigned char *buf;   /* the whole file */
    size_t         size;
    fl_json       *header;
    int            n;
    fl_st_tensor  *t;     /* by data offset */
    int            nmeta;
    const char   **mkeys, **mvals;
    int            has_crc;
};

static int read_all(const char *path, unsigned char **buf, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) < 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return fl_fail(FL_EIO, "%s: not a regular file", path);
    }
    size_t n = (size_t)sb.st_size;
    unsigned char *b = malloc(n ? n : 1);
    if (!b) {
        fclose(f);
        return fl_fail(FL_ENOMEM, "%s: out of memory for %zu bytes", path, n);
    }
    size_t got = fread(b, 1, n, f);
    int err = ferror(f);
    fclose(f);
    if (got != n || err) {
        free(b);
        return fl_fail(FL_EIO, "%s: read %zu of %zu bytes", path, got, n);
    }
    *buf = b;
    *size = n;
    return FL_OK;
}

static int by_offset(const void *a, const void *b) {
    const fl_st_tensor *x = a, *y = b;
    const unsigned char *p = x->data, *q = y->data;
    if (p != q)
        return p < q ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* One tensor entry of the header: {"dtype", "shape", "data_offsets"} and nothing else. */
static int parse_entry(fl_safetensors *st, const char *name, const fl_json *v, size_t nheader,
                       size_t ndata, fl_st_tensor *out) {
    const char *p = st->path;
    if (v->type != FL_JSON_OBJECT)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': header entry is not an object", p, name);
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], "dtype") && strcmp(v->keys[i], "shape") &&
            strcmp(v->keys[i], "data_offsets"))
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': unknown field '%s'", p, name,
                           v->keys[i]);
    const fl_json *dt = fl_json_get(v, "dtype"), *sh = fl_json_get(v, "shape"),
                  *off = fl_json_get(v, "data_offsets");
    if (!dt || dt->type != FL_JSON_STRING)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': no dtype string", p, name);
    if (!dtype_from_name(dt->s, &out->dtype))
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': dtype '%s' is not one fleet reads "
                       "(F32, F64, F16, BF16, I32, I64, U8)", p, name, dt->s);
    if (!sh || sh->type != FL_JSON_ARRAY)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': no shape array", p, name);
    if (sh->n > FL_MAX_DIMS)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': %d dimensions (at most %d)", p, name, sh->n,
                       FL_MAX_DIMS);
    out->ndim = sh->n;
    uint64_t numel = 1;
    for (int d = 0; d < sh->n; d++) {
        const fl_json *e = sh->items[d];
        if (e->type != FL_JSON_NUMBER || !e->is_int || e->i < 0)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                           p, name, d);
        out->shape[d] = e->i;
        if (e->i && numel > (UINT64_MAX / 16) / (uint64_t)e->i)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': shape too large", p, name);
        numel *= (uint64_t)e->i;
    }
    out->numel = (int64_t)numel;
    if (!off || off->type != FL_JSON_ARRAY || off->n != 2)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': data_offsets is not [begin, end]", p, name);
    const fl_json *b = off->items[0], *e = off->items[1];
    if (b->type != FL_JSON_NUMBER || !b->is_int || b->i < 0 || e->type != FL_JSON_NUMBER ||
        !e->is_int || e->i < b->i)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': data_offsets are not integers "
                       "0 <= begin <= end", p, name);
    uint64_t want = numel * fl_dtype_size(out->dtype), got = (uint64_t)(e->i - b->i);
    if (want != got) {
        char s[96];
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': shape %s of %s needs %" PRIu64
                       " bytes but data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRIu64, p, name,
                       fl_shape_str(out->ndim, out->shape, s, sizeof s), dt->s, want, b->i, e->i,
                       got);
    }
    if ((uint64_t)e->i > ndata)
        return fl_fail(FL_EFORMAT, "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] run "
                       "past the end of the file (%zu data bytes): truncated?", p, name, b->i,
                       e->i, ndata);
    out->name = name;
    out->data = st->buf + 8 + nheader + (size_t)b->i;
    out->nbytes = (size_t)got;
    return FL_OK;
}

static int parse_metadata(fl_safetensors *st, const fl_json *m) {
    if (m->type != FL_JSON_OBJECT)
        return fl_fail(FL_EFORMAT, "%s: __metadata__ is not an object", st->path);
    st->mkeys = calloc((size_t)m->n + 1, sizeof *st->mkeys);
    st->mvals = calloc((size_t)m->n + 1, sizeof *st->mvals);
    if (!st->mkeys || !st->mvals)
        return fl_fail(FL_ENOMEM, "%s: out of memory", st->path);
    for (int i = 0; i < m->n; i++) {
        if (m->items[i]->type != FL_JSON_STRING)
            return fl_fail(FL_EFORMAT, "%s: metadata '%s' is not a string", st->path,
                           m->keys[i]);
        st->mkeys[i] = m->keys[i];
        st->mvals[i] = m->items[i]->s;
    }
    st->nmeta = m->n;
    return FL_OK;
}

/* the checksum of the metadata entries other than checksums, in file order */
static int verify_metadata(fl_safetensors *st) {
    const char *want = fl_safetensors_meta(st, META_CRC);
    if (!want)
        return FL_OK;
    uint32_t crc = 0;
    for (int i = 0; i < st->nmeta; i++) {
        if (strncmp(st->mkeys[i], CRC_PREFIX, strlen(CRC_PREFIX)) == 0)
            continue;
        crc = fl_crc32(crc, st->mkeys[i], strlen(st->mkeys[i]) + 1);
        crc = fl_crc32(crc, st->mvals[i], strlen(st->mvals[i]) + 1);
    }
    char got[16];
    snprintf(got, sizeof got, "%08" PRIx32, crc);
    if (strcmp(got, want) != 0)
        return fl_fail(FL_EFORMAT, "%s: metadata checksum mismatch (crc32 %s, header says %s): "
                       "the header is damaged", st->path, got, want);
    return FL_OK;
}

static int verify_checksums(fl_safetensors *st) {
    size_t np = strlen(CRC_PREFIX);
    for (int i = 0; i < st->nmeta; i++) {
        if (strncmp(st->mkeys[i], CRC_PREFIX, np) != 0)
            continue;
        st->has_crc = 1;
        if (strcmp(st->mkeys[i], META_CRC) == 0)
            continue;
        const char *name = st->mkeys[i] + np;
        const fl_st_tensor *t = fl_safetensors_find(st, name);
        if (!t)
            return fl_fail(FL_EFORMAT, "%s: checksum for tensor '%s', which is not in the file "
                           "(damaged header?)", st->path, name);
        char *end;
        const char *v = st->mvals[i];
        unsigned long want = strtoul(v, &end, 16);
        if (strlen(v) != 8 || strspn(v, "0123456789abcdefABCDEF") != 8 || *end)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': checksum '%s' is not 8 hex digits",
                           st->path, name, v);
        uint32_t got = fl_crc32(0, t->data, t->nbytes);
        if (got != (uint32_t)want)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': checksum mismatch (crc32 %08" PRIx32
                           ", header says %s): the file is damaged", st->path, name, got, v);
    }
    if (!st->has_crc)
        return FL_OK;
    if (!fl_safetensors_meta(st, META_CRC))
        return fl_fail(FL_EFORMAT, "%s: no metadata checksum (damaged header?)", st->path);
    FL_TRY(verify_metadata(st));
    for (int i = 0; i < st->n; i++) {
        char key[160];
        snprintf(key, sizeof key, CRC_PREFIX "%s", st->t[i].name);
        if (!fl_safetensors_meta(st, key))
            return fl_fail(FL_EFORMAT, "%s: tensor '%s' has no checksum (damaged header?)",
                           st->path, st->t[i].name);
    }
    return FL_OK;
}

static int parse_file(fl_safetensors *st) {
    const char *p = st->path;
    if (st->size < 8)
        return fl_fail(FL_EFORMAT, "%s: %zu bytes, shorter than the 8-byte header length: "
                       "truncated or not a safetensors file", p, st->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | st->buf[i];
    if (n > MAX_HEADER)
        return fl_fail(FL_EFORMAT, "%s: header length %" PRIu64 " is beyond the format's limit "
                       "(100 MiB): not a safetensors file?", p, n);
    if (n > st->size - 8)
        return fl_fail(FL_EFORMAT, "%s: header length %" PRIu64 " runs past the end of the file "
                       "(%zu bytes): truncated?", p, n, st->size);
    st->header = fl_json_parse((const char *)st->buf + 8, (size_t)n);
    if (!st->header)
        return fl_fail_prefix(FL_EFORMAT, "%s: header is not valid JSON", p);
    if (st->header->type != FL_JSON_OBJECT)
        return fl_fail(FL_EFORMAT, "%s: header is not a JSON object", p);
    size_t ndata = st->size - 8 - (size_t)n;
    st->t = calloc((size_t)st->header->n + 1, sizeof *st->t);
    if (!st->t)
        return fl_fail(FL_ENOMEM, "%s: out of memory", p);
    for (int i = 0; i < st->header->n; i++) {
        const char *key = st->header->keys[i];
        if (strcmp(key, "__metadata__") == 0) {
            FL_TRY(parse_metadata(st, st->header->items[i]));
            continue;
        }
        FL_TRY(parse_entry(st, key, st->header->items[i], (size_t)n, ndata, &st->t[st->n]));
        st->n++;
    }
    /* byte ranges: sorted by offset they must tile [0, ndata) exactly */
    qsort(st->t, (size_t)st->n, sizeof *st->t, by_offset);
    size_t at = 0;
    const unsigned char *base = st->buf + 8 + n;
    for (int i = 0; i < st->n; i++) {
        size_t b = (size_t)((const unsigned char *)st->t[i].data - base);
        if (b < at)
            return fl_fail(FL_EFORMAT, "%s: tensors '%s' and '%s' overlap in the data", p,
                           st->t[i - 1].name, st->t[i].name);
        if (b > at)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s': %zu unused bytes before its data", p,
                           st->t[i].name, b - at);
        at = b + st->t[i].nbytes;
    }
    if (at != ndata)
        return fl_fail(FL_EFORMAT, "%s: %zu bytes after the last tensor's data (file longer "
                       "than its header says)", p, ndata - at);
    return verify_checksums(st);
}

int fl_safetensors_open(const char *path, fl_safetensors **out) {
    FL_ASSERT(path && out);
    *out = NULL;
    fl_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return fl_fail(FL_ENOMEM, "%s: out of memory", path);
    st->path = strdup(path);
    int rc = st->path ? read_all(path, &st->buf, &st->size)
                      : fl_fail(FL_ENOMEM, "%s: out of memory", path);
    if (rc >= 0)
        rc = parse_file(st);
    if (rc < 0) {
        fl_safetensors_close(st);
        return rc;
    }
    *out = st;
    return FL_OK;
}

void fl_safetensors_close(fl_safetensors *st) {
    if (!st)
        return;
    fl_json_free(st->header);
    free(st->t);
    free(st->mkeys);
    free(st->mvals);
    free(st->buf);
    free(st->path);
    free(st);
}

const char *fl_safetensors_path(const fl_safetensors *st) { return st->path; }
int fl_safetensors_count(const fl_safetensors *st) { return st->n; }
int fl_safetensors_has_checksums(const fl_safetensors *st) { return st->has_crc; }

const fl_st_tensor *fl_safetensors_tensor(const fl_safetensors *st, int i) {
    return i >= 0 && i < st->n ? &st->t[i] : NULL;
}

const fl_st_tensor *fl_safetensors_find(const fl_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0)
            return &st->t[i];
    return NULL;
}

const char *fl_safetensors_meta(const fl_safetensors *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->mkeys[i], key) == 0)
            return st->mvals[i];
    return NULL;
}

int fl_safetensors_meta_count(const fl_safetensors *st) { return st->nmeta; }

void fl_safetensors_meta_at(const fl_safetensors *st, int i, const char **key,
                            const char **value) {
    FL_ASSERT(i >= 0 && i < st->nmeta);
    *key = st->mkeys[i];
    *value = st->mvals[i];
}
