/* bind.c - --bind_to core (mpirun's --bind-to core): the CPUs fleetrun may run on, cut into one
 * contiguous set per worker, and each worker bound to its set in the child before exec, so that
 * no two workers share a core. Two ranks that the scheduler may put on one core take 2.78 us
 * per 4 KiB shared-memory allreduce; bound, 0.47 us (bench/RESULTS.md, shared memory). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fleetrun.h"

#define CPUS_MAX (1 << 16) /* sched_getaffinity is asked with sets up to this many CPUs */

static cpu_set_t *set_of(const job *j, int i) {
    return (cpu_set_t *)(j->bind_sets + (size_t)i * j->bind_size);
}

/* The CPUs this process may run on, in a set as large as the kernel's (CPU_ALLOC: owned by the
 * caller, CPU_FREE); NULL with errno. */
static cpu_set_t *own_cpus(size_t *size) {
    for (int n = CPU_SETSIZE; n <= CPUS_MAX; n *= 2) {
        cpu_set_t *set = CPU_ALLOC(n);
        if (!set)
            return NULL;
        *size = CPU_ALLOC_SIZE(n);
        if (sched_getaffinity(0, *size, set) == 0)
            return set;
        int e = errno;
        CPU_FREE(set);
        if (e != EINVAL) { /* EINVAL: the kernel has more CPUs than the set holds */
            errno = e;
            return NULL;
        }
    }
    errno = EINVAL;
    return NULL;
}

/* "0-3,8,10-11" into out (cap bytes; cut with "..." when it does not fit). */
static void format_cpus(const cpu_set_t *set, size_t size, char *out, size_t cap) {
    int ncpu = (int)(size * 8), len = 0;
    out[0] = '\0';
    for (int c = 0; c < ncpu; c++) {
        if (!CPU_ISSET_S(c, size, set))
            continue;
        int last = c;
        while (last + 1 < ncpu && CPU_ISSET_S(last + 1, size, set))
            last++;
        char part[32];
        if (last == c)
            snprintf(part, sizeof part, "%s%d", len ? "," : "", c);
        else
            snprintf(part, sizeof part, "%s%d-%d", len ? "," : "", c, last);
        if ((size_t)len + strlen(part) + 4 > cap) {
            snprintf(out + len, cap - (size_t)len, "...");
            return;
        }
        len += snprintf(out + len, cap - (size_t)len, "%s", part);
        c = last;
    }
}

/* Cut in the order of the CPUs' numbers: a set is CPUs next to each other in fleetrun's mask,
 * ncpu / nproc of them, one more for each of the first ncpu % nproc sets (mpirun's --bind-to
 * core maps by core in the same order; it counts physical cores where this counts the CPUs the
 * kernel lists). */
int fr_bind_plan(job *j) {
    if (!j->o.bind_core)
        return 0;
    size_t size;
    cpu_set_t *all = own_cpus(&size);
    if (!all) {
        fr_say("error: --bind_to core: cannot read the CPUs fleetrun may run on: %s",
               strerror(errno));
        return 1;
    }
    int n = j->o.nproc, ncpu = CPU_COUNT_S(size, all);
    if (n > ncpu) {
        char list[256];
        format_cpus(all, size, list, sizeof list);
        CPU_FREE(all);
        return fr_arg_error("--bind_to core: %d workers but fleetrun may run on %d CPU(s) (%s): "
                            "binding would put several workers on one CPU; give at most %d "
                            "workers or --bind_to none", n, ncpu, list, ncpu);
    }
    j->bind_sets = calloc((size_t)n, size);
    if (!j->bind_sets) {
        CPU_FREE(all);
        fr_say("error: out of memory");
        return 1;
    }
    j->bind_size = size;
    for (int i = 0, c = 0; i < n; i++) {
        int want = ncpu / n + (i < ncpu % n);
        for (int k = 0; k < want; c++)
            if (CPU_ISSET_S(c, size, all)) {
                CPU_SET_S(c, size, set_of(j, i));
                k++;
            }
    }
    CPU_FREE(all);
    return 0;
}

void fr_bind_child(const job *j, int i) {
    if (!j->bind_sets)
        return;
    const cpu_set_t *set = set_of(j, i);
    if (sched_setaffinity(0, j->bind_size, set) < 0) {
        int e = errno;
        char list[256];
        format_cpus(set, j->bind_size, list, sizeof list);
        dprintf(2, "fleetrun: cannot bind worker %d to CPU(s) %s: %s\n", i, list, strerror(e));
        _exit(126);
    }
    if (!getenv("OMP_NUM_THREADS")) {
        char v[16];
        snprintf(v, sizeof v, "%d", CPU_COUNT_S(j->bind_size, set));
        setenv("OMP_NUM_THREADS", v, 1);
    }
}

void fr_bind_describe(const job *j) {
    if (!j->bind_sets)
        return;
    int n = j->o.nproc;
    printf("fleetrun: --bind_to core:");
    for (int i = 0; i < n; i++) {
        if (n > 8 && i == 3) { /* the first three and the last one */
            printf(" ...,");
            i = n - 1;
        }
        char list[128];
        format_cpus(set_of(j, i), j->bind_size, list, sizeof list);
        const worker *w = &j->w[i]; /* a PS job: its role and index in the role */
        printf(" %s %d on CPU %s%s", w->role == ROLE_SERVER ? "server" : "worker",
               j->o.ps ? w->rank : i, list, i + 1 < n ? "," : "");
    }
    const char *omp = getenv("OMP_NUM_THREADS");
    int first = CPU_COUNT_S(j->bind_size, set_of(j, 0));
    int last = CPU_COUNT_S(j->bind_size, set_of(j, n - 1));
    if (omp)
        printf(" (OMP_NUM_THREADS=%s, as set)\n", omp);
    else if (first == last)
        printf(" (OMP_NUM_THREADS=%d each)\n", first);
    else
        printf(" (OMP_NUM_THREADS=%d or %d: each worker's number of CPUs)\n", first, last);
}
