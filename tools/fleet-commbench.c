/* fleet-commbench - the collective benchmark, in the style of nccl-tests: one process per rank
 * (under fleetrun or mpirun), a range of message sizes, and per size the time (max over ranks),
 * algbw, busbw (nccl-tests' definitions) and the number of wrong elements. Only the public
 * communicator API: what it measures is what a program using the library gets. */
#include "fleet/comm.h"
#include "fleet/status.h"
#include "fleet/tensor.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_BROADCAST } bench_op;

static const char *op_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

typedef struct {
    size_t      min_bytes, max_bytes;
    size_t      factor;
    bench_op    op;
    fl_dtype    dtype;
    fl_redop    redop;
    int         iters, warmup;
    int         check;
    const char *backend; /* NULL: automatic */
} bench_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: fleet-commbench [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-o OP] [-d TYPE]\n"
            "                       [-r REDOP] [-n ITERS] [-w WARMUP] [-c 1|0] [--backend tcp|mpi|nccl]\n"
            "One process per rank, started by a launcher:\n"
            "  fleetrun --nproc_per_node 4 fleet-commbench -b 1K -e 64M -f 4\n"
            "  mpirun -np 4 fleet-commbench --backend mpi -o allgather\n"
            "\n"
            "  -b, --minbytes N     smallest message (default 8; suffixes K, M, G = 2^10, 2^20, 2^30)\n"
            "  -e, --maxbytes N     largest message (default 16M)\n"
            "  -f, --stepfactor F   size multiplier from one row to the next (default 2)\n"
            "  -o, --op OP          allreduce (default), reduce_scatter, allgather, broadcast\n"
            "  -d, --datatype T     f32 (default), f64, f16, bf16, i32, i64\n"
            "  -r, --redop OP       sum (default), avg, max (allreduce, reduce_scatter)\n"
            "  -n, --iters N        timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N untimed iterations before them (default 2)\n"
            "  -c, --check 1|0      verify every result once per size (default 1)\n"
            "      --backend B      tcp, mpi or nccl (default: mpi under mpirun, else tcp)\n"
            "size is the whole buffer (for reduce_scatter the input, for allgather the output);\n"
            "time is the mean per iteration, max over ranks; algbw = size / time;\n"
            "busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (reduce_scatter, allgather), x 1\n"
            "(broadcast): comparable with the link rate whatever the rank count.\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "64M" -> 67108864; -1 if malformed. */
static int parse_bytes(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -1;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end || v * mult > 64.0 * 1024 * 1024 * 1024)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_count(const char *s, long lo, long hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int arg_error(const char *what, const char *value) {
    fprintf(stderr, "fleet-commbench: error: %s: '%s'\n"
                    "usage: fleet-commbench [options]  (fleet-commbench --help)\n", what, value);
    return 2;
}

/* Returns 0, 2 for bad arguments, -1 after --help. */
static int parse_args(int argc, char **argv, bench_opts *o) {
    static const struct option longs[] = {
        {"minbytes", required_argument, NULL, 'b'},  {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'}, {"op", required_argument, NULL, 'o'},
        {"datatype", required_argument, NULL, 'd'},  {"redop", required_argument, NULL, 'r'},
        {"iters", required_argument, NULL, 'n'},     {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},     {"backend", required_argument, NULL, 'B'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    *o = (bench_opts){.min_bytes = 8, .max_bytes = 16u << 20, .factor = 2, .op = OP_ALLREDUCE,
                      .dtype = FL_DTYPE_F32, .redop = FL_REDOP_SUM, .iters = 20, .warmup = 2,
                      .check = 1};
    int ch, factor;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "b:e:f:o:d:r:n:w:c:h", longs, NULL)) != -1) {
        switch (ch) {
        case 'b':
            if (parse_bytes(optarg, &o->min_bytes))
                return arg_error("-b: not a size such as 8, 1K, 64M", optarg);
            break;
        case 'e':
            if (parse_bytes(optarg, &o->max_bytes))
                return arg_error("-e: not a size such as 8, 1K, 64M", optarg);
            break;
        case 'f':
            if (parse_count(optarg, 2, 1 << 20, &factor))
                return arg_error("-f: not an integer factor >= 2", optarg);
            o->factor = (size_t)factor;
            break;
        case 'o': {
            int k = 0;
            while (k < 4 && strcmp(optarg, op_names[k]))
                k++;
            if (k == 4)
                return arg_error("-o: not one of allreduce, reduce_scatter, allgather, broadcast",
                                 optarg);
            o->op = (bench_op)k;
            break;
        }
        case 'd':
            if (fl_dtype_parse(optarg, &o->dtype) < 0 || o->dtype == FL_DTYPE_U8)
                return arg_error("-d: not one of f32, f64, f16, bf16, i32, i64", optarg);
            break;
        case 'r':
            if (fl_redop_parse(optarg, &o->redop) < 0)
                return arg_error("-r: not one of sum, avg, max", optarg);
            break;
        case 'n':
            if (parse_count(optarg, 1, 1000000, &o->iters))
                return arg_error("-n: not a number of iterations >= 1", optarg);
            break;
        case 'w':
            if (parse_count(optarg, 0, 1000000, &o->warmup))
                return arg_error("-w: not a number of iterations >= 0", optarg);
            break;
        case 'c':
            if (parse_count(optarg, 0, 1, &o->check))
                return arg_error("-c: not 1 or 0", optarg);
            break;
        case 'B':
            if (strcmp(optarg, "tcp") && strcmp(optarg, "mpi") && strcmp(optarg, "nccl"))
                return arg_error("--backend: not tcp, mpi or nccl", optarg);
            o->backend = optarg;
            break;
        case 'h': usage(stdout); return -1;
        default:
            return arg_error("unknown option or missing value",
                             optind > 0 && optind <= argc ? argv[optind - 1] : "?");
        }
    }
    if (optind < argc)
        return arg_error("unexpected argument", argv[optind]);
    if (o->max_bytes < o->min_bytes) {
        char s[64];
        snprintf(s, sizeof s, "%zu < %zu", o->max_bytes, o->min_bytes);
        return arg_error("-e is smaller than -b", s);
    }
    return 0;
}

/* ---------------------------------------------------------------- data and checks */

/* Rank r's element j: a small integer (0, 1, 2), so that sums over up to 128 ranks are exact
 * in every type, bf16 included, whatever order the reduction takes. */
static double value_of(int r, size_t j) { return (double)(((size_t)r + j) % 3); }

static void set_elem(void *buf, fl_dtype t, size_t i, double v) {
    switch (t) {
    case FL_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case FL_DTYPE_F64: ((double *)buf)[i] = v; break;
    case FL_DTYPE_F16: ((uint16_t *)buf)[i] = fl_f32_to_f16((float)v); break;
    case FL_DTYPE_BF16: ((uint16_t *)buf)[i] = fl_f32_to_bf16((float)v); break;
    case FL_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case FL_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

static double get_elem(const void *buf, fl_dtype t, size_t i) {
    switch (t) {
    case FL_DTYPE_F32: return ((const float *)buf)[i];
    case FL_DTYPE_F64: return ((const double *)buf)[i];
    case FL_DTYPE_F16: return fl_f16_to_f32(((const uint16_t *)buf)[i]);
    case FL_DTYPE_BF16: return fl_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FL_DTYPE_I32: return ((const int32_t *)buf)[i];
    case FL_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    default: return NAN;
    }
}

/* Expected reduction over all ranks of value_of(r, j), by j % 3 (precomputed: O(3 n)). */
typedef struct {
    double v[3];
} reduced;

static reduced expected_reduction(int n, fl_redop op, fl_dtype t) {
    reduced e = {{0, 0, 0}};
    for (int k = 0; k < 3; k++) {
        double s = 0, m = -1;
        for (int r = 0; r < n; r++) {
            double v = value_of(r, (size_t)k);
            s += v;
            m = v > m ? v : m;
        }
        if (op == FL_REDOP_MAX)
            e.v[k] = m;
        else if (op == FL_REDOP_AVG)
            e.v[k] = fl_dtype_is_float(t) ? s / n : trunc(s / n);
        else
            e.v[k] = s;
    }
    return e;
}

static double tolerance(fl_dtype t, fl_redop op, int n) {
    if (!fl_dtype_is_float(t))
        return 0;
    double eps = t == FL_DTYPE_F64 ? 0x1p-52 : t == FL_DTYPE_F32 ? 0x1p-23
               : t == FL_DTYPE_F16 ? 0x1p-10 : 0x1p-7;
    return op == FL_REDOP_MAX ? 0 : eps * (n > 128 ? n : 2); /* sums beyond 2n > 256 round */
}

static bool close_enough(double got, double want, double tol) {
    if (got == want)
        return true;
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

/* Fills the inputs for one checked run; buffers hold count_in / count_out elements. */
static void fill(const bench_opts *o, int rank, void *in, size_t count_in, void *out,
                 size_t count_out) {
    switch (o->op) {
    case OP_ALLREDUCE:
        for (size_t i = 0; i < count_out; i++)
            set_elem(out, o->dtype, i, value_of(rank, i));
        break;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER:
        for (size_t i = 0; i < count_in; i++)
            set_elem(in, o->dtype, i, value_of(rank, i));
        for (size_t i = 0; i < count_out; i++)
            set_elem(out, o->dtype, i, 7);
        break;
    case OP_BROADCAST:
        for (size_t i = 0; i < count_out; i++)
            set_elem(out, o->dtype, i, rank == 0 ? value_of(0, i) : 7);
        break;
    }
}

/* Wrong elements of this rank's output; `per` is the per-rank count (reduce_scatter,
 * allgather). */
static uint64_t count_wrong(const bench_opts *o, int rank, int n, const void *out,
                            size_t count_out, size_t per) {
    uint64_t wrong = 0;
    reduced e = expected_reduction(n, o->redop, o->dtype);
    double tol = tolerance(o->dtype, o->redop, n);
    for (size_t i = 0; i < count_out; i++) {
        double want;
        switch (o->op) {
        case OP_ALLREDUCE: want = e.v[i % 3]; break;
        case OP_REDUCE_SCATTER: want = e.v[((size_t)rank * per + i) % 3]; break;
        case OP_ALLGATHER: want = value_of((int)(i / per), i % per); break;
        default: want = value_of(0, i); break;
        }
        wrong += !close_enough(get_elem(out, o->dtype, i), want, tol);
    }
    return wrong;
}

static int run_op(fl_comm *c, const bench_opts *o, void *in, void *out, size_t count,
                  size_t per) {
    switch (o->op) {
    case OP_ALLREDUCE: return fl_comm_allreduce(c, out, count, o->dtype, o->redop);
    case OP_REDUCE_SCATTER: return fl_comm_reduce_scatter(c, in, out, per, o->dtype, o->redop);
    case OP_ALLGATHER: return fl_comm_allgather(c, in, out, per, o->dtype);
    default: return fl_comm_broadcast(c, out, count, o->dtype, 0);
    }
}

static double bus_factor(bench_op op, int n) {
    if (op == OP_ALLREDUCE)
        return 2.0 * (n - 1) / n;
    if (op == OP_BROADCAST)
        return 1.0;
    return (double)(n - 1) / n;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    bench_opts o;
    fl_comm *c = NULL;
    void *in = NULL, *out = NULL;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (fl_comm_init_from_env(o.backend, &c) < 0) {
        fprintf(stderr, "fleet-commbench: error: %s\n", fl_errmsg());
        return 1;
    }
    int rank = fl_comm_rank(c), n = fl_comm_size(c);
    size_t esize = fl_dtype_size(o.dtype);
    in = malloc(o.max_bytes + esize);
    out = malloc(o.max_bytes + esize);
    if (!in || !out) {
        fprintf(stderr, "fleet-commbench: error: rank %d: cannot allocate 2 x %zu bytes\n", rank,
                o.max_bytes);
        rc = 1;
        goto fail;
    }
    bool reduces = o.op == OP_ALLREDUCE || o.op == OP_REDUCE_SCATTER;
    const char *redop = reduces ? fl_redop_name(o.redop) : "none";
    int root = o.op == OP_BROADCAST ? 0 : -1;
    if (rank == 0) {
        printf("# fleet-commbench: %s, %s, redop %s, %d ranks, backend %s, iters %d, warmup %d, "
               "check %d\n", op_names[o.op], fl_dtype_name(o.dtype), redop, n, fl_comm_backend(c),
               o.iters, o.warmup, o.check);
        for (int r = 0; r < n && r < 64; r++)
            if (fl_comm_endpoint(c, r)[0])
                printf("#  rank %4d  %s\n", r, fl_comm_endpoint(c, r));
        printf("#\n# %10s  %12s  %6s  %6s  %5s  %10s  %8s  %8s  %7s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %6s  %6s  %5s  %10s  %8s  %8s  %7s\n", "(B)", "(elements)", "", "",
               "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }

    double busbw_sum = 0;
    int rows = 0;
    uint64_t wrong_total = 0;
    /* sizes min, min*f, min*f^2 ... up to max (a 0-byte row is followed by one element) */
    for (size_t bytes = o.min_bytes, row = 0; bytes <= o.max_bytes && row < 4096; row++) {
        size_t count = bytes / esize, per = count;
        if (o.op == OP_REDUCE_SCATTER || o.op == OP_ALLGATHER) {
            per = count / (size_t)n;
            count = per * (size_t)n;
        }
        size_t count_in = o.op == OP_REDUCE_SCATTER ? count : per;
        size_t count_out = o.op == OP_REDUCE_SCATTER ? per : count;
        size_t size = count * esize;

        uint64_t wrong = 0;
        if (o.check) {
            fill(&o, rank, in, count_in, out, count_out);
            if ((rc = run_op(c, &o, in, out, count, per)) < 0)
                goto comm_fail;
            wrong = count_wrong(&o, rank, n, out, count_out, per);
        }
        /* timing on zeros: sums stay in range however many iterations run */
        memset(in, 0, count_in * esize);
        memset(out, 0, count_out * esize);
        for (int it = 0; it < o.warmup; it++)
            if ((rc = run_op(c, &o, in, out, count, per)) < 0)
                goto comm_fail;
        if ((rc = fl_comm_barrier(c)) < 0)
            goto comm_fail;
        double t0 = now_s();
        for (int it = 0; it < o.iters; it++)
            if ((rc = run_op(c, &o, in, out, count, per)) < 0)
                goto comm_fail;
        double dt = (now_s() - t0) / o.iters;
        int64_t wrong_all = (int64_t)wrong;
        if ((rc = fl_comm_allreduce(c, &dt, 1, FL_DTYPE_F64, FL_REDOP_MAX)) < 0 ||
            (rc = fl_comm_allreduce(c, &wrong_all, 1, FL_DTYPE_I64, FL_REDOP_SUM)) < 0)
            goto comm_fail;
        double algbw = dt > 0 ? (double)size / dt / 1e9 : 0;
        double busbw = algbw * bus_factor(o.op, n);
        busbw_sum += busbw;
        rows++;
        wrong_total += (uint64_t)wrong_all;
        if (rank == 0) {
            char wrong_str[24] = "N/A";
            if (o.check)
                snprintf(wrong_str, sizeof wrong_str, "%lld", (long long)wrong_all);
            printf("  %10zu  %12zu  %6s  %6s  %5d  %10.1f  %8.3f  %8.3f  %7s\n", size, count,
                   fl_dtype_name(o.dtype), redop, root, dt * 1e6, algbw, busbw, wrong_str);
            fflush(stdout);
        }
        if (bytes > o.max_bytes / o.factor)
            break;
        bytes = bytes ? bytes * o.factor : esize;
    }
    fl_comm_stats st;
    fl_comm_get_stats(c, &st);
    if (rank == 0) {
        double avg = rows ? busbw_sum / rows : 0;
        printf("# Out of bounds values : %llu %s\n", (unsigned long long)wrong_total,
               !o.check ? "(not checked)" : wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %.3f GB/s (%.3f Gbit/s)\n", avg, avg * 8);
        printf("# rank 0 wire traffic  : %.1f MB sent, %.1f MB received, %llu collectives, "
               "%.2f s inside them\n", (double)st.bytes_sent / 1e6,
               (double)st.bytes_received / 1e6, (unsigned long long)st.ops, st.seconds);
        fflush(stdout);
    }
    rc = wrong_total ? 1 : 0;
    goto fail;
comm_fail:
    fprintf(stderr, "fleet-commbench: error: rank %d: %s\n", rank, fl_errmsg());
    rc = 1;
fail:
    fl_comm_free(c);
    free(in);
    free(out);
    return rc;
}
