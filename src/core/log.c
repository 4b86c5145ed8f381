/* log.c - leveled logging to stderr and monotonic timers. */
#include "fleet/log.h"

#include "fleet/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int current_level = -1; /* -1: not yet read from the environment */

int fl_log_parse_level(const char *s, fl_log_level *out) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i <= FL_LOG_OFF; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (fl_log_level)i;
            return FL_OK;
        }
    }
    return fl_fail(FL_EINVAL, "unknown log level '%s' (expected debug, info, warn, error, off)", s);
}

fl_log_level fl_log_get_level(void) {
    int level = __atomic_load_n(&current_level, __ATOMIC_RELAXED);
    if (level < 0) {
        fl_log_level parsed = FL_LOG_INFO;
        const char *env = getenv("FLEET_LOG_LEVEL");
        if (env && fl_log_parse_level(env, &parsed) < 0)
            parsed = FL_LOG_INFO;
        level = (int)parsed;
        __atomic_store_n(&current_level, level, __ATOMIC_RELAXED);
    }
    return (fl_log_level)level;
}

void fl_log_set_level(fl_log_level level) {
    __atomic_store_n(&current_level, (int)level, __ATOMIC_RELAXED);
}

void fl_log(fl_log_level level, const char *fmt, ...) {
    if (level < fl_log_get_level())
        return;
    static const char tag[] = "DIWE";
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "[fleet %c %02d:%02d:%02d.%03ld] ", tag[level], tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stderr);
}

double fl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fl_timer_reset(fl_timer *t) {
    t->started = 0;
    t->total = 0;
    t->count = 0;
}

void fl_timer_start(fl_timer *t) { t->started = fl_now(); }

double fl_timer_stop(fl_timer *t) {
    double dt = fl_now() - t->started;
    t->total += dt;
    t->count++;
    return dt;
}
