/* log.h - leveled logging to stderr, and monotonic timers.
 *
 * The level comes from FLEET_LOG_LEVEL (debug, info, warn, error; default info) on first use,
 * or from fl_log_set_level. Lines look like "[fleet W 12:03:04.512] message". Thread-safe: each
 * line is written with a single fwrite. */
#ifndef FLEET_LOG_H
#define FLEET_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FL_LOG_DEBUG = 0, FL_LOG_INFO, FL_LOG_WARN, FL_LOG_ERROR, FL_LOG_OFF } fl_log_level;

void fl_log_set_level(fl_log_level level);
fl_log_level fl_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns 0 or FL_EINVAL. */
int  fl_log_parse_level(const char *s, fl_log_level *out);
void fl_log(fl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define FL_DEBUG(...) fl_log(FL_LOG_DEBUG, __VA_ARGS__)
#define FL_INFO(...)  fl_log(FL_LOG_INFO, __VA_ARGS__)
#define FL_WARN(...)  fl_log(FL_LOG_WARN, __VA_ARGS__)
#define FL_ERROR(...) fl_log(FL_LOG_ERROR, __VA_ARGS__)

/* Seconds on a monotonic clock (CLOCK_MONOTONIC); only differences are meaningful. */
double fl_now(void);

/* A stopwatch that accumulates: fl_timer_start ... fl_timer_stop adds to total. */
typedef struct {
    double started;
    double total;
    long   count;
} fl_timer;

void fl_timer_reset(fl_timer *t);
void fl_timer_start(fl_timer *t);
/* Adds the time since fl_timer_start to total; returns that interval in seconds. */
double fl_timer_stop(fl_timer *t);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_LOG_H */
