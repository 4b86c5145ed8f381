/* threads.c - one knob for the CPU kernels' thread count. OpenBLAS is the OpenMP build, so
 * both follow the OpenMP setting; OpenBLAS is told as well because it caches its own count. */
#include "fleet/backend.h"

#include <cblas.h>
#include <omp.h>

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
