/* messages.c - fleetrun's own voice on stderr: status lines and errors prefixed "fleetrun: ",
 * and errors in its arguments, which add a usage hint and mean exit status 2. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>

#include "fleetrun.h"

void fr_say(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fleetrun: %s\n", buf);
}

/* An error in fleetrun's own arguments: message, usage hint, status 2. */
int fr_arg_error(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fleetrun: error: %s\nusage: fleetrun [options] PROGRAM [ARGS...]  "
                    "(fleetrun --help for the options)\n", buf);
    return 2;
}
