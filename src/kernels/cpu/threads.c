/* threads.c - the CPU kernels' threads: one knob for their count (OpenBLAS is the OpenMP
 * build, so both follow the OpenMP setting; OpenBLAS is told as well because it caches its own
 * count), and how fleet's programs have them wait for work (fl_kernels_wait_default). */
#include "fleet/backend.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A thread that finds no work spins GOMP_SPINCOUNT rounds before it sleeps: libgomp's default,
 * 300000 rounds (milliseconds), is the fastest on a machine of the process's own and ruinous
 * beside other busy processes, whose work the spinning threads hold off: two 2-thread
 * trainings side by side on 2 cores took 148 s each, 7-14 s with 3000 rounds (a fraction of a
 * millisecond), 10 s with no spinning (OMP_WAIT_POLICY=passive), which costs 16% alone where
 * 3000 rounds cost about 2%, within the noise (bench/RESULTS.md, "OpenMP's wait"). */
#define FLEET_SPINCOUNT "3000"

int fl_kernels_wait_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return 0;
    /* libgomp reads both once, when it is loaded, before main: the program starts again */
    setenv("GOMP_SPINCOUNT", FLEET_SPINCOUNT, 1);
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT"); /* not restarted: OpenMP's default stays, and says so */
    return -1;
}

const char *fl_kernels_wait_policy(void) {
    static char buf[96];
    const char *p = getenv("OMP_WAIT_POLICY"), *s = getenv("GOMP_SPINCOUNT");
    if (p && s)
        snprintf(buf, sizeof buf, "OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s", p, s);
    else if (p)
        snprintf(buf, sizeof buf, "OMP_WAIT_POLICY=%s", p);
    else if (s && !strcmp(s, FLEET_SPINCOUNT))
        snprintf(buf, sizeof buf, "spin " FLEET_SPINCOUNT " rounds, then sleep (fleet's default, "
                 "GOMP_SPINCOUNT)");
    else if (s)
        snprintf(buf, sizeof buf, "GOMP_SPINCOUNT=%s", s);
    else
        snprintf(buf, sizeof buf, "OpenMP's default (spin, then sleep)");
    return buf;
}

static int default_threads = 0; /* omp_get_max_threads() before the first change */

void fl_kernels_set_threads(int n) {
    if (default_threads == 0)
        default_threads = omp_get_max_threads();
    if (n <= 0)
        n = default_threads;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int fl_kernels_get_threads(void) { return omp_get_max_threads(); }
