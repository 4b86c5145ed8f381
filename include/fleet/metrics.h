/* metrics.h - metrics as JSON lines: one object per record, flushed as it is written, so a
 * crashed run keeps every record before the crash and any tool (jq, pandas) can read it.
 *
 *     fl_metrics_begin(m);
 *     fl_metrics_str(m, "phase", "train");
 *     fl_metrics_int(m, "step", 10);
 *     fl_metrics_num(m, "loss", 0.6931);
 *     fl_metrics_end(m);            // {"phase":"train","step":10,"loss":0.6931}\n
 *
 * Numbers are written with 17 significant digits (they read back exactly); NaN and infinities,
 * which JSON lacks, are written as null. Strings are escaped. Not thread-safe. */
#ifndef FLEET_METRICS_H
#define FLEET_METRICS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_metrics fl_metrics;

/* Opens (truncates) path for writing. NULL and fl_errmsg naming the path on failure. */
fl_metrics *fl_metrics_open(const char *path);
/* Closes the file. NULL is a no-op. */
void fl_metrics_close(fl_metrics *m);

void fl_metrics_begin(fl_metrics *m);
void fl_metrics_int(fl_metrics *m, const char *key, int64_t v);
void fl_metrics_num(fl_metrics *m, const char *key, double v);
void fl_metrics_str(fl_metrics *m, const char *key, const char *v);
/* Writes the record as one line and flushes; returns 0 or FL_EIO naming the path. */
int  fl_metrics_end(fl_metrics *m);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_METRICS_H */
