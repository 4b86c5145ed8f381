/* fuzz_ps_stubs.c - the one library function ps_wire.c calls besides libc (FL_ASSERT's
 * failure path), so that the fuzz target links ps_wire.c alone. */
#include "fleet/status.h"

#include <stdio.h>
#include <stdlib.h>

void fl_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}
