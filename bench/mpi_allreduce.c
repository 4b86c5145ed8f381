/* mpi_allreduce.c - MPI_Allreduce (f32, sum, in place) timed the way fleet-commbench times
 * fleet's allreduce, as a reference for bench/allreduce_peers.sh.
 *
 *   mpirun -np 2 build/bench/mpi_allreduce [-n ITERS] [-w WARMUP] [-r REPS] SIZE...
 *
 * SIZE in bytes, with optional suffix K, M, G (2^10, 2^20, 2^30). For each size: WARMUP untimed
 * allreduces, then REPS repetitions of (barrier; ITERS timed allreduces); a repetition's time is
 * the mean per allreduce, max over ranks; the size's time is the median over repetitions.
 * algbw = bytes / time, busbw = algbw x 2(n-1)/n (GB = 1e9 bytes), as in fleet-commbench.
 * The buffer holds zeros (sums stay in range however many iterations run).
 * Output (rank 0): comment lines starting with '#', then one row per size:
 *   bytes  iters  time_us  algbw_GBps  busbw_GBps */
#include "bench_time.h"

#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int parse_size(const char *s, size_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
    }
    if (*end || v == 0)
        return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: mpi_allreduce [-n ITERS] [-w WARMUP] [-r REPS] SIZE...\n");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);

    int iters = 20, warmup = 5, reps = 1;
    size_t sizes[64];
    int nsizes = 0;
    for (int i = 1; i < argc; i++) {
        int *opt = !strcmp(argv[i], "-n") ? &iters
                   : !strcmp(argv[i], "-w") ? &warmup
                   : !strcmp(argv[i], "-r") ? &reps
                                           : NULL;
        if (opt) {
            if (i + 1 >= argc || (*opt = atoi(argv[++i])) < (opt == &warmup ? 0 : 1)) {
                if (rank == 0)
                    usage();
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
        } else if (nsizes < 64 && parse_size(argv[i], &sizes[nsizes]) == 0) {
            nsizes++;
        } else {
            if (rank == 0)
                usage();
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (nsizes == 0) {
        if (rank == 0)
            usage();
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    double *rep_t = malloc(sizeof(double) * (size_t)reps);
    if (!rep_t)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (rank == 0) {
        printf("# mpi_allreduce: MPI_Allreduce f32 sum in place, %d ranks, iters %d, warmup %d, "
               "reps %d\n", n, iters, warmup, reps);
        printf("# %10s %7s %12s %10s %10s\n", "bytes", "iters", "time_us", "algbw_GBps",
               "busbw_GBps");
        fflush(stdout);
    }
    for (int s = 0; s < nsizes; s++) {
        size_t count = sizes[s] / sizeof(float), bytes = count * sizeof(float);
        if (count == 0 || count > (size_t)0x7fffffff)
            MPI_Abort(MPI_COMM_WORLD, 2);
        float *buf = calloc(count, sizeof(float));
        if (!buf)
            MPI_Abort(MPI_COMM_WORLD, 1);
        for (int it = 0; it < warmup; it++)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (int r = 0; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = bench_wall_s();
            for (int it = 0; it < iters; it++)
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = (bench_wall_s() - t0) / iters;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            rep_t[r] = dt;
        }
        qsort(rep_t, (size_t)reps, sizeof(double), bench_cmp_double);
        double t = rep_t[(reps - 1) / 2];
        double algbw = (double)bytes / t / 1e9;
        double busbw = algbw * 2.0 * (n - 1) / n;
        if (rank == 0) {
            printf("  %10zu %7d %12.1f %10.3f %10.3f\n", bytes, iters, t * 1e6, algbw, busbw);
            fflush(stdout);
        }
        free(buf);
    }
    free(rep_t);
    MPI_Finalize();
    return 0;
}
