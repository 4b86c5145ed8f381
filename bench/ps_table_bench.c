/* ps_table_bench.c - rows per second of a parameter server's sparse table (src/ps/table.h) on
 * one thread: pull (copy rows out) and push (Adagrad on each row) of batches of 10^4 ids (a
 * fresh batch for each call, so that a push does not find the rows its pull brought in) drawn
 * Zipf-like (rank k with probability ~ 1/k, hot ids scattered over the id space by a hash), on a
 * table filled beforehand with ROWS rows (every rank), at each dim. Also the time to fill (rows
 * created per second, index growth included) and the bytes a row. The reference, measured in the
 * same run: the same kind of batch gathered (memcpy) from a plain array indexed by rank, the
 * cost of moving the rows without any table; pull/array = pull rows/s over array rows/s.
 * Prints the median of REPS timed runs of BATCHES batches per cell.
 *   build/bench/ps_table_bench [ROWS in M (1,10)] [DIMS (8,64)] [REPS (5)] [BATCHES (100)] */
#include "ps/table.h"

#include "fleet/rng.h"
#include "bench_time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 10000

static uint64_t id_of_rank(uint64_t k) { /* splitmix64: ranks -> scattered 64-bit ids */
    uint64_t z = k + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A rank in [0, rows) with P(k) ~ 1 / (k + 1): k = floor(rows^u) - 1, u uniform. */
static uint64_t zipf_rank(fl_rng *r, int64_t rows) {
    double k = floor(exp(fl_rng_uniform_f64(r) * log((double)rows + 1))) - 1;
    return k < 0 ? 0 : k >= (double)rows ? (uint64_t)rows - 1 : (uint64_t)k;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int parse_list(const char *arg, double *out, int max) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ","))
        out[n++] = atof(tok);
    return n;
}

int main(int argc, char **argv) {
    double sizes[8], dims[8];
    int nsizes = parse_list(argc > 1 ? argv[1] : "1,10", sizes, 8);
    int ndims = parse_list(argc > 2 ? argv[2] : "8,64", dims, 8);
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    int batches = argc > 4 ? atoi(argv[4]) : 100;
    if (reps < 1 || batches < 1 || nsizes < 1 || ndims < 1) {
        fprintf(stderr, "usage: ps_table_bench [ROWS in M (1,10)] [DIMS (8,64)] [REPS] "
                        "[BATCHES]\n");
        return 2;
    }
    printf("# ps_table_bench: one thread, Adagrad rows, batches of %d Zipf-like ids, median of "
           "%d runs of %d batches\n", BATCH, reps, batches);
    printf("%10s %5s %12s %10s %14s %14s %14s %10s %12s\n", "rows", "dim", "fill rows/s",
           "bytes/row", "pull rows/s", "push rows/s", "array rows/s", "pull/array",
           "distinct/b");
    uint64_t *ids = malloc(BATCH * sizeof *ids), *ranks = malloc(BATCH * sizeof *ranks);
    double *tp = malloc((size_t)reps * sizeof *tp), *tu = malloc((size_t)reps * sizeof *tu);
    double *ta = malloc((size_t)reps * sizeof *ta);
    for (int di = 0; di < ndims; di++) {
        int dim = (int)dims[di];
        float *buf = malloc((size_t)BATCH * (size_t)dim * sizeof *buf);
        if (!ids || !ranks || !buf || !tp || !tu || !ta || dim < 1) {
            fprintf(stderr, "ps_table_bench: out of memory or bad dim %d\n", dim);
            return 1;
        }
        for (int si = 0; si < nsizes; si++) {
            int64_t rows = (int64_t)(sizes[si] * 1e6);
            fl_ps_rule rule;
            fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
            fl_ps_init_rule init = {.type = FL_PS_INIT_UNIFORM, .a = -0.01, .b = 0.01, .seed = 1};
            fl_ps_sparse *t;
            if (rows < 1 || fl_ps_sparse_create(0, dim, &rule, &init, &t) < 0) {
                fprintf(stderr, "ps_table_bench: cannot make a table of %lld rows of dim %d\n",
                        (long long)rows, dim);
                return 1;
            }
            double t0 = bench_wall_s();
            for (int64_t k = 0; k < rows; k += BATCH) {
                int64_t n = rows - k < BATCH ? rows - k : BATCH;
                for (int64_t i = 0; i < n; i++)
                    ids[i] = id_of_rank((uint64_t)(k + i));
                if (fl_ps_sparse_pull_rows(t, ids, n, buf) < 0) {
                    fprintf(stderr, "ps_table_bench: out of memory at %lld rows\n", (long long)k);
                    return 1;
                }
            }
            double fill = (double)rows / (bench_wall_s() - t0);
            /* the reference: the same rows gathered from a plain array indexed by rank */
            float *plain = calloc((size_t)rows * (size_t)dim, sizeof *plain);
            if (!plain) {
                fprintf(stderr, "ps_table_bench: out of memory for the plain array\n");
                return 1;
            }
            fl_rng r;
            fl_rng_init(&r, 7, (uint64_t)rows);
            for (int j = 0; j < BATCH * dim; j++)
                buf[j] = 0.01f * (float)fl_rng_normal(&r);
            int64_t distinct = 0;
            for (int rep = 0; rep < reps; rep++) {
                double pull = 0, push = 0, gather = 0;
                for (int b = 0; b < batches; b++) { /* a batch of ids for each */
                    for (int i = 0; i < BATCH; i++) {
                        ranks[i] = zipf_rank(&r, rows);
                        ids[i] = id_of_rank(ranks[i]);
                    }
                    double a = bench_wall_s();
                    for (int i = 0; i < BATCH; i++)
                        memcpy(buf + (size_t)i * dim, plain + ranks[i] * (size_t)dim,
                               (size_t)dim * sizeof *buf);
                    gather += bench_wall_s() - a;
                    for (int i = 0; i < BATCH; i++) /* fresh ids for the table */
                        ids[i] = id_of_rank(zipf_rank(&r, rows));
                    a = bench_wall_s();
                    fl_ps_sparse_pull_rows(t, ids, BATCH, buf);
                    pull += bench_wall_s() - a;
                    for (int i = 0; i < BATCH; i++)
                        ids[i] = id_of_rank(zipf_rank(&r, rows));
                    a = bench_wall_s();
                    fl_ps_sparse_push_rows(t, ids, BATCH, buf, 0.01);
                    push += bench_wall_s() - a;
                }
                tp[rep] = pull;
                tu[rep] = push;
                ta[rep] = gather;
            }
            if (fl_ps_sparse_rows(t) != rows)
                fprintf(stderr, "ps_table_bench: %lld rows after the runs, want %lld\n",
                        (long long)fl_ps_sparse_rows(t), (long long)rows);
            { /* distinct ids in one batch, for the reader: a Zipf batch repeats its hot ids */
                for (int i = 0; i < BATCH; i++)
                    ids[i] = zipf_rank(&r, rows);
                qsort(ids, BATCH, sizeof *ids, cmp_u64);
                distinct = 1;
                for (int i = 1; i < BATCH; i++)
                    distinct += ids[i] != ids[i - 1];
            }
            double n = (double)BATCH * batches, mp = bench_median(tp, reps);
            double ma = bench_median(ta, reps);
            printf("%10lld %5d %12.3g %10.1f %14.3g %14.3g %14.3g %10.2f %12lld\n",
                   (long long)rows, dim, fill, (double)fl_ps_sparse_bytes(t) / (double)rows,
                   n / mp, n / bench_median(tu, reps), n / ma, ma / mp, (long long)distinct);
            fflush(stdout);
            free(plain);
            fl_ps_sparse_free(t);
        }
        free(buf);
    }
    free(ids);
    free(ranks);
    free(tp);
    free(tu);
    free(ta);
    return 0;
}
