/* metrics.c - metrics as JSON lines. A record is built in memory and written with one fwrite
 * and an fflush, so a crash leaves every earlier record whole and at most the last one absent. */
#include "fleet/metrics.h"

#include "fleet/status.h"
#include "io/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fl_metrics {
    FILE *f;
    char *path;
    fl_json_buf rec; /* the record being built */
    bool in_record;  /* between begin and end */
    int nfields;
};

fl_metrics *fl_metrics_open(const char *path) {
    FL_ASSERT(path);
    fl_metrics *m = calloc(1, sizeof *m);
    if (!m) {
        fl_fail(FL_ENOMEM, "out of memory opening metrics file '%s'", path);
        goto fail;
    }
    m->path = strdup(path);
    if (!m->path) {
        fl_fail(FL_ENOMEM, "out of memory opening metrics file '%s'", path);
        goto fail;
    }
    m->f = fopen(path, "w");
    if (!m->f) {
        fl_fail(FL_EIO, "cannot open metrics file '%s': %s", path, strerror(errno));
        goto fail;
    }
    return m;
fail:
    if (m)
        free(m->path);
    free(m);
    return NULL;
}

void fl_metrics_close(fl_metrics *m) {
    if (!m)
        return;
    fclose(m->f);
    fl_json_buf_free(&m->rec);
    free(m->path);
    free(m);
}

void fl_metrics_begin(fl_metrics *m) {
    FL_ASSERT(m && !m->in_record);
    fl_json_buf_reset(&m->rec);
    fl_json_append(&m->rec, "{", 1);
    m->in_record = true;
    m->nfields = 0;
}

/* Starts a field: the comma before all but the first, then "key":. */
static void field(fl_metrics *m, const char *key) {
    FL_ASSERT(m && m->in_record && key);
    if (m->nfields++)
        fl_json_append(&m->rec, ",", 1);
    fl_json_string(&m->rec, key, strlen(key));
    fl_json_append(&m->rec, ":", 1);
}

void fl_metrics_int(fl_metrics *m, const char *key, int64_t v) {
    field(m, key);
    fl_json_appendf(&m->rec, "%" PRId64, v);
}

void fl_metrics_num(fl_metrics *m, const char *key, double v) {
    field(m, key);
    fl_json_number(&m->rec, v);
}

void fl_metrics_str(fl_metrics *m, const char *key, const char *v) {
    field(m, key);
    if (v)
        fl_json_string(&m->rec, v, strlen(v));
    else
        fl_json_append(&m->rec, "null", 4);
}

int fl_metrics_end(fl_metrics *m) {
    FL_ASSERT(m && m->in_record);
    m->in_record = false;
    fl_json_append(&m->rec, "}\n", 2);
    if (m->rec.failed)
        return fl_fail(FL_ENOMEM, "%s: out of memory building a metrics record", m->path);
    errno = 0;
    if (fwrite(m->rec.p, 1, m->rec.len, m->f) != m->rec.len || fflush(m->f) != 0)
        return fl_fail(FL_EIO, "cannot write metrics file '%s': %s", m->path,
                       errno ? strerror(errno) : "write failed");
    return FL_OK;
}
