/* criteo_line.c - one line of Criteo's text format (label, NDENSE integers, NSLOTS hexadecimal
 * values, tab-separated, empty = missing) parsed straight into the tail of a CTR batch and
 * committed only when the whole line is good, so a bad line leaves the batch as it was. */
#include "fleet/ctr.h"

#include "ctr_impl.h"
#include "fleet/status.h"

#include <string.h>

fl_criteo_format fl_criteo_format_default(void) {
    return (fl_criteo_format){.ndense = FL_CRITEO_DENSE, .nslots = FL_CRITEO_SLOTS,
                              .transform = FL_CTR_DENSE_MINMAX, .missing_id = true};
}

int fl_criteo_format_check(const fl_criteo_format *f) {
    if (f->ndense < 0 || f->ndense > 4096)
        return fl_fail(FL_EINVAL, "criteo format: ndense %d outside [0, 4096]", f->ndense);
    if (f->nslots < 0 || f->nslots > FL_CTR_MAX_SLOTS)
        return fl_fail(FL_EINVAL, "criteo format: nslots %d outside [0, %d] (the slot is the "
                       "id's high %d bits)", f->nslots, FL_CTR_MAX_SLOTS, FL_CTR_SLOT_BITS);
    if ((unsigned)f->transform > FL_CTR_DENSE_RAW)
        return fl_fail(FL_EINVAL, "criteo format: unknown dense transform %d", (int)f->transform);
    if (f->transform == FL_CTR_DENSE_MINMAX && f->ndense != FL_CRITEO_DENSE)
        return fl_fail(FL_EINVAL, "criteo format: the minmax transform has PaddleRec's tables "
                       "for %d dense features, not %d (use log or raw)", FL_CRITEO_DENSE,
                       f->ndense);
    return FL_OK;
}

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A field as "%.*s" for messages, shortened past 40 bytes. */
#define FIELD_FMT "'%.*s%s'"
#define FIELD_ARGS(p, n) (int)((n) > 40 ? 40 : (n)), (p), ((n) > 40 ? "..." : "")

/* Decimal integer with an optional '-'; 0 on success. */
static int parse_int(const char *p, size_t n, int64_t *out) {
    size_t i = 0;
    int neg = 0;
    if (n > 0 && p[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i == n)
        return -1;
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (limit - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

int fl_criteo_parse_line(const fl_criteo_format *f, const char *line, size_t len,
                         fl_ctr_batch *out) {
    FL_ASSERT(out->ndense == f->ndense && out->nslots == f->nslots);
    if (len > 0 && line[len - 1] == '\r')
        len--;
    int want = 1 + f->ndense + f->nslots;
    size_t fields = 1, commas = 0;
    for (size_t i = 0; i < len; i++) {
        if (line[i] == '\t')
            fields++;
        else if (line[i] == ',')
            commas++;
        else if (line[i] == '\0')
            return fl_fail(FL_EFORMAT, "the line holds a NUL byte");
    }
    if (fields != (size_t)want)
        return fl_fail(FL_EFORMAT, "%zu fields, want %d (label, %d integer, %d categorical; "
                       "tab-separated)", fields, want, f->ndense, f->nslots);
    int64_t k0 = out->batch * out->nslots, base = out->offsets[k0];
    FL_TRY(fl_ctr_batch_reserve(out, out->batch + 1, base + f->nslots + (int64_t)commas));
    float *dense = out->dense + out->batch * out->ndense;
    int64_t *offs = out->offsets + k0, nid = base;

    const char *p = line, *end = line + len;
    for (int field = 0; field < want; field++) {
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        const char *fe = tab ? tab : end;
        size_t n = (size_t)(fe - p);
        if (field == 0) {
            if (n != 1 || (p[0] != '0' && p[0] != '1'))
                return fl_fail(FL_EFORMAT, "field 1: label " FIELD_FMT " is not 0 or 1",
                               FIELD_ARGS(p, n));
            out->labels[out->batch] = p[0] - '0';
        } else if (field <= f->ndense) {
            int j = field - 1;
            int64_t x = 0;
            if (n == 0)
                dense[j] = 0.0f;
            else if (parse_int(p, n, &x) < 0)
                return fl_fail(FL_EFORMAT, "field %d (I%d): " FIELD_FMT " is not an integer",
                               field + 1, j + 1, FIELD_ARGS(p, n));
            else
                dense[j] = fl_ctr_dense_value(f->transform, j, x);
        } else {
            int s = field - 1 - f->ndense;
            if (n == 0 && f->missing_id)
                out->ids[nid++] = fl_ctr_id(s, fl_ctr_hash("", 0));
            for (const char *v = p; n > 0 && v <= fe;) {
                const char *ve = memchr(v, ',', (size_t)(fe - v));
                if (!ve)
                    ve = fe;
                size_t vn = (size_t)(ve - v), i = 0;
                while (i < vn && is_hex(v[i]))
                    i++;
                if (vn == 0 || i < vn)
                    return fl_fail(FL_EFORMAT, "field %d (C%d): " FIELD_FMT " is not "
                                   "hexadecimal%s", field + 1, s + 1, FIELD_ARGS(p, n),
                                   vn == 0 ? " (an empty value between commas)" : "");
                out->ids[nid++] = fl_ctr_id(s, fl_ctr_hash(v, vn));
                v = ve + 1;
            }
            offs[s + 1] = nid;
        }
        p = fe + 1;
    }
    out->batch++;
    return FL_OK;
}
