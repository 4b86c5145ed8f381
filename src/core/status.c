/* status.c - thread-local error message behind fl_fail / fl_errmsg.
 * One fixed buffer per thread: no allocation on the failure path. */
#include "fleet/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERRMSG_CAP 1024

static _Thread_local char errmsg[ERRMSG_CAP];

const char *fl_status_name(int code) {
    switch (code) {
    case FL_OK: return "FL_OK";
    case FL_EINVAL: return "FL_EINVAL";
    case FL_ENOMEM: return "FL_ENOMEM";
    case FL_EIO: return "FL_EIO";
    case FL_ECONFIG: return "FL_ECONFIG";
    case FL_EFORMAT: return "FL_EFORMAT";
    case FL_ESHAPE: return "FL_ESHAPE";
    case FL_EUNSUPPORTED: return "FL_EUNSUPPORTED";
    case FL_ETIMEOUT: return "FL_ETIMEOUT";
    case FL_EPEER: return "FL_EPEER";
    case FL_ESTATE: return "FL_ESTATE";
    default: return "FL_E?";
    }
}

const char *fl_errmsg(void) { return errmsg; }

void fl_clear_error(void) { errmsg[0] = '\0'; }

int fl_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int fl_fail_prefix(int code, const char *fmt, ...) {
    char prefix[ERRMSG_CAP];
    char old[ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    size_t len = strlen(prefix);
    if (len > sizeof errmsg - 3)
        len = sizeof errmsg - 3;
    memcpy(errmsg, prefix, len);
    memcpy(errmsg + len, ": ", 2);
    size_t rest = strnlen(old, sizeof errmsg - len - 3);
    memcpy(errmsg + len + 2, old, rest);
    errmsg[len + 2 + rest] = '\0';
    return code;
}

void fl_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "fleet: assertion failed at %s:%d: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
