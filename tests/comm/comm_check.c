/* comm_check.c - checks every collective of a real communicator, one process per rank, started
 * by a launcher (fleetrun, mpirun, or PADDLE_* variables by hand): the matrix of comm_matrix.h
 * (each rank computes the expected results for all ranks, and compares every output across
 * ranks by hash), or with --loop repeated large allreduces checked each time (fault tests kill
 * a peer or connect strangers meanwhile), or with --bench allreduce (allgather, alltoall with
 * --op) timings per message size (how the tcp backend's switch points were measured). Prints
 * one summary line; exits 0 when all passed. */
#include "comm_matrix.h"

#include <errno.h>
#include <getopt.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: comm_check [--counts N,N,...] [--quick] [--seed N] [--backend tcp|mpi]\n"
            "                  [--loop SECONDS [--loop-count N] [--loop-pause MS]]\n"
            "                  [--bench BYTES,BYTES,...\n"
            "                  [--op allreduce|allgather|alltoall]] [-v]\n"
            "Run one process per rank under a launcher, e.g.\n"
            "  fleetrun --nproc_per_node=4 comm_check --quick\n"
            "  mpirun -np 4 comm_check --quick\n"
            "Default counts 0,1,7,1000,1048579; --quick: 0,1,7,1000,100003.\n"
            "--loop: allreduces of --loop-count floats (default 4Mi) for SECONDS, each checked;\n"
            "--loop-pause: every rank sleeps MS milliseconds after each (a job that is running\n"
            "but not busy: strangers meanwhile, at a tenth of the CPU).\n"
            "--bench: median time of f32 sum allreduces of each size (max over ranks), and the\n"
            "bus bandwidth 2(n-1)/n * bytes / time; --op allgather: of f32 allgathers of BYTES\n"
            "gathered, --op alltoall: of f32 alltoalls of BYTES sent per rank (BYTES / size per\n"
            "block); bus bandwidth (n-1)/n * bytes / time for both.\n");
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-')
        return -1;
    *out = (size_t)v;
    return 0;
}

static int parse_counts(const char *arg, size_t *counts, int cap, int *n) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", arg);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == cap || parse_size(tok, &counts[*n]) < 0)
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

/* Rank q's element i in iteration it: small integers, so sums are exact. */
static float loop_value(long it, int q, size_t i) {
    return (float)((i * 7 + (size_t)it * 13 + (size_t)q * 5) % 17) - 8.0f;
}

/* Allreduces of count floats until rank 0's clock passes `seconds` (rank 0 decides, and tells
 * the others with a broadcast each iteration, so that all stop after the same iteration);
 * pause_ms > 0: each rank sleeps that long after each iteration. */
static int run_loop(fl_comm *c, double seconds, size_t count, long pause_ms, bool verbose) {
    int rank = fl_comm_rank(c), size = fl_comm_size(c);
    float *buf = mx_alloc(count * sizeof *buf);
    double t0 = fl_now();
    long it = 0, bad = 0;
    int rc = 0;
    for (;; it++) {
        int32_t go = rank == 0 ? fl_now() - t0 < seconds : 0;
        if ((rc = fl_comm_broadcast(c, &go, 1, FL_DTYPE_I32, 0)) < 0 || !go)
            break;
        for (size_t i = 0; i < count; i++)
            buf[i] = loop_value(it, rank, i);
        if ((rc = fl_comm_allreduce(c, buf, count, FL_DTYPE_F32, FL_REDOP_SUM)) < 0)
            break;
        for (size_t i = 0; i < count; i++) {
            float want = 0;
            for (int q = 0; q < size; q++)
                want += loop_value(it, q, i);
            if (buf[i] != want) {
                if (bad++ < 5)
                    fprintf(stderr, "comm_check: rank %d: iteration %ld element %zu: got %g "
                            "want %g\n", rank, it, i, (double)buf[i], (double)want);
                break;
            }
        }
        if (verbose && rank == 0)
            fprintf(stderr, "comm_check: iteration %ld ok\n", it);
        if (pause_ms > 0)
            nanosleep(&(struct timespec){pause_ms / 1000, (pause_ms % 1000) * 1000000L}, NULL);
    }
    free(buf);
    if (rc < 0) {
        fprintf(stderr, "comm_check: rank %d: error after %ld iterations: %s\n", rank, it,
                fl_errmsg());
        return 1;
    }
    if (rank == 0)
        printf("comm_check: loop: backend %s, %d ranks, %ld allreduces of %zu floats in %.1f s, "
               "%s\n", fl_comm_backend(c), size, it, count, fl_now() - t0,
               bad ? "WRONG RESULTS" : "ok");
    fflush(stdout);
    return bad ? 1 : 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef enum { BENCH_ALLREDUCE = 0, BENCH_ALLGATHER, BENCH_ALLTOALL } bench_op;
static const char *const bench_ops[] = {"allreduce", "allgather", "alltoall"}; /* --op */
static const char *const bench_names[] = {"f32 sum allreduce", "f32 allgather",
                                          "f32 alltoall"};

/* Median over iterations of the time of one collective of each size (bytes: the allreduce's
 * buffer, the allgather's result, what each rank sends in the alltoall; rounded down to whole
 * f32 elements per rank); every iteration starts after a barrier. Rank 0 prints one line per
 * size. */
static int run_bench(fl_comm *c, bench_op op, const size_t *sizes, int nsizes) {
    int rank = fl_comm_rank(c), size = fl_comm_size(c);
    if (rank == 0)
        printf("# backend %s, %d ranks: %s\n# %12s %8s %12s %12s %12s\n", fl_comm_backend(c),
               size, bench_names[op], "bytes", "iters", "median_us", "algbw_GB/s",
               "busbw_GB/s");
    for (int k = 0; k < nsizes; k++) {
        /* count: the allreduce's elements, else each rank's (allgather) or each block's */
        size_t count = sizes[k] / 4 / (op == BENCH_ALLREDUCE ? 1 : (size_t)size);
        size_t bytes = count * 4 * (op == BENCH_ALLREDUCE ? 1 : (size_t)size);
        int iters = (int)(2e8 / (double)(sizes[k] + 4096));
        iters = iters < 10 ? 10 : iters > 2000 ? 2000 : iters;
        float *buf = mx_alloc(bytes), *out = mx_alloc(bytes);
        double *t = mx_alloc((size_t)iters * sizeof *t);
        for (size_t i = 0; i < bytes / 4; i++)
            buf[i] = (float)(i % 5);
        for (int it = -3; it < iters; it++) {
            if (fl_comm_barrier(c) < 0)
                goto fail;
            double t0 = fl_now();
            int rc = op == BENCH_ALLREDUCE
                         ? fl_comm_allreduce(c, buf, count, FL_DTYPE_F32, FL_REDOP_SUM)
                     : op == BENCH_ALLGATHER ? fl_comm_allgather(c, buf, out, count, FL_DTYPE_F32)
                                             : fl_comm_alltoall(c, buf, out, count, FL_DTYPE_F32);
            if (rc < 0)
                goto fail;
            if (it >= 0)
                t[it] = fl_now() - t0;
        }
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        double med = t[iters / 2];
        if (fl_comm_allreduce(c, &med, 1, FL_DTYPE_F64, FL_REDOP_MAX) < 0)
            goto fail;
        double factor = op == BENCH_ALLREDUCE ? 2.0 * (size - 1) / size : (double)(size - 1) / size;
        if (rank == 0)
            printf("  %12zu %8d %12.1f %12.3f %12.3f\n", bytes, iters, med * 1e6,
                   (double)bytes / med / 1e9, factor * (double)bytes / med / 1e9);
        fflush(stdout);
        free(buf);
        free(out);
        free(t);
        continue;
    fail:
        fprintf(stderr, "comm_check: rank %d: error: %s\n", rank, fl_errmsg());
        free(buf);
        free(out);
        free(t);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t counts[32] = {0, 1, 7, 1000, (1u << 20) + 3};
    int ncounts = 5;
    uint64_t seed = 1;
    const char *backend = NULL;
    double loop = -1;
    size_t loop_count = (size_t)4 << 20; /* 16 MiB of floats */
    size_t loop_pause = 0;                /* ms */
    bool verbose = false;
    size_t bench[32];
    int nbench = 0;
    bench_op bop = BENCH_ALLREDUCE;
    static const struct option longopts[] = {
        {"counts", required_argument, NULL, 'c'}, {"quick", no_argument, NULL, 'q'},
        {"seed", required_argument, NULL, 's'},   {"backend", required_argument, NULL, 'b'},
        {"loop", required_argument, NULL, 'l'},   {"loop-count", required_argument, NULL, 'n'},
        {"loop-pause", required_argument, NULL, 'p'},
        {"bench", required_argument, NULL, 'B'},  {"verbose", no_argument, NULL, 'v'},
        {"op", required_argument, NULL, 'o'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int ch;
    size_t v;
    while ((ch = getopt_long(argc, argv, "vh", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            if (parse_counts(optarg, counts, 32, &ncounts) < 0) {
                fprintf(stderr, "comm_check: error: --counts %s: want up to 32 comma-separated "
                        "element counts\n", optarg);
                return 2;
            }
            break;
        case 'q': {
            static const size_t quick[] = {0, 1, 7, 1000, 100003};
            memcpy(counts, quick, sizeof quick);
            ncounts = 5;
            break;
        }
        case 's':
            if (parse_size(optarg, &v) < 0) {
                fprintf(stderr, "comm_check: error: --seed %s is not a number\n", optarg);
                return 2;
            }
            seed = v;
            break;
        case 'b': backend = optarg; break;
        case 'l': {
            char *end;
            loop = strtod(optarg, &end);
            if (*end || !(loop >= 0)) {
                fprintf(stderr, "comm_check: error: --loop %s is not a number of seconds\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'n':
            if (parse_size(optarg, &loop_count) < 0 || loop_count == 0) {
                fprintf(stderr, "comm_check: error: --loop-count %s: want a positive count\n",
                        optarg);
                return 2;
            }
            break;
        case 'p':
            if (parse_size(optarg, &loop_pause) < 0 || loop_pause > 60000) {
                fprintf(stderr, "comm_check: error: --loop-pause %s: want milliseconds, 0 to "
                        "60000\n", optarg);
                return 2;
            }
            break;
        case 'B':
            if (parse_counts(optarg, bench, 32, &nbench) < 0) {
                fprintf(stderr, "comm_check: error: --bench %s: want up to 32 comma-separated "
                        "byte counts\n", optarg);
                return 2;
            }
            break;
        case 'o': {
            int found = -1;
            for (int i = 0; i < 3; i++)
                if (strcmp(optarg, bench_ops[i]) == 0)
                    found = i;
            if (found < 0) {
                fprintf(stderr, "comm_check: error: --op %s: want allreduce, allgather or "
                        "alltoall\n", optarg);
                return 2;
            }
            bop = (bench_op)found;
            break;
        }
        case 'v': verbose = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "comm_check: error: unexpected argument %s\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    fl_comm *c = NULL;
    if (fl_comm_init_from_env(backend, &c) < 0) {
        fprintf(stderr, "comm_check: error: %s\n", fl_errmsg());
        return 2;
    }
    int status;
    if (nbench) {
        status = run_bench(c, bop, bench, nbench);
    } else if (loop >= 0) {
        status = run_loop(c, loop, loop_count, (long)loop_pause, verbose);
    } else {
        mx_ctx m = {.c = c, .seed = seed, .verbose = verbose};
        double t0 = fl_now();
        mx_run(&m, counts, ncounts);
        int64_t total = m.failures;
        if (!m.fatal && fl_comm_allreduce(c, &total, 1, FL_DTYPE_I64, FL_REDOP_SUM) < 0) {
            fprintf(stderr, "comm_check: rank %d: error: %s\n", m.rank, fl_errmsg());
            m.fatal = true;
        }
        fl_comm_stats st;
        fl_comm_get_stats(c, &st);
        if (m.fatal) {
            status = 1;
        } else {
            status = total ? 1 : 0;
            if (m.rank == 0) {
                char list[256] = "";
                for (int i = 0; i < ncounts; i++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%zu",
                             i ? "," : "", counts[i]);
                printf("comm_check: backend %s, %d ranks, counts %s: %ld checks, %lld failures, "
                       "hash %016llx, %.2f s (%llu collectives, %.1f MB sent by rank 0)\n",
                       fl_comm_backend(c), m.size, list, m.checks, (long long)total,
                       (unsigned long long)m.hash, fl_now() - t0, (unsigned long long)st.ops,
                       (double)st.bytes_sent / 1e6);
            }
        }
        fflush(stdout);
    }
    fl_comm_free(c);
    return status;
}
