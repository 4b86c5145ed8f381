/* bench_time.h - the clocks and the median the benchmarks share (header only, no library).
 * bench_wall_s: monotonic wall time in seconds; bench_cpu_s: this process's CPU time (all
 * threads) in seconds; bench_median sorts v[0..n) ascending and returns v[n / 2]. */
#ifndef FLEET_BENCH_TIME_H
#define FLEET_BENCH_TIME_H

#include <stdlib.h>
#include <time.h>

static inline double bench_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double bench_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort's comparison for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

#endif /* FLEET_BENCH_TIME_H */
