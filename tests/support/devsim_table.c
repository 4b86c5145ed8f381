/* devsim_table.c - devsim's table (devsim.h), assembled once per process: the kernels of the cpu
 * table, or of the ref table under FLEET_DEVSIM_TABLE=ref (for its low dtypes: docs/amp.md),
 * behind devsim.c's memory and guard and devsim_ops.c's checked compute ops. */
#include "devsim.h"
#include "devsim_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fl_backend table;

static void init(void) {
    const char *which = getenv("FLEET_DEVSIM_TABLE");
    if (which && strcmp(which, "ref") != 0 && strcmp(which, "cpu") != 0) {
        fprintf(stderr, "devsim: FLEET_DEVSIM_TABLE=%s: not a table devsim runs on (cpu, ref)\n",
                which);
        abort();
    }
    const fl_backend *kernels =
        which && strcmp(which, "ref") == 0 ? fl_backend_ref() : fl_backend_cpu();
    ds_guard_init(kernels);
    table = *kernels; /* low_dtypes as the table's: ref has them, cpu not */
    table.name = "devsim";
    ds_install_memory(&table);
    ds_install_ops(&table, kernels);
}

const fl_backend *fl_devsim_backend(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init);
    return &table;
}
