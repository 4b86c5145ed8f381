/* dgc_exchange - DGC's exchange on its own, one process per rank (under fleetrun): k (index,
 * value) pairs per rank of a tensor of n values (k = density * n), a fraction `shared` of the
 * indices the same on every rank (top-k sets of real gradients overlap), the rest each rank's
 * own; the pairs exchanged by allgather (DGC's exchange: allgather) and by the sparse allreduce
 * with DGC's default budget of 7 k sums (--budget; exchange: sparse), plus a dense allreduce of
 * the n values and an allgather of 8 bytes (one message per round: the latency the cost model
 * calls alpha). Per operation: the median over the iterations of the slowest rank's time, the
 * bytes each rank received (mean over ranks), and for the sparse allreduce the fraction of pairs
 * dropped.
 * Rank 0 prints one line per operation:
 *   op ranks k n time_ms recv_bytes dropped
 * Used by bench/dgc_exchange.sh (netlab) and bench/dgc_cost.py (the model it validates). */
#include "fleet/comm.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Ascending distinct indices: `shared` of them from a seed every rank uses, the rest from the
 * rank's own (a bitmap keeps them distinct). */
static int64_t make_indices(int64_t n, int64_t k, double shared, int rank, int32_t *idx) {
    uint8_t *used = calloc((size_t)n, 1);
    if (!used)
        return -1;
    int64_t ks = (int64_t)(shared * (double)k), got = 0;
    fl_rng common, own;
    fl_rng_init(&common, 12345, 0);
    fl_rng_init(&own, 777, (uint64_t)rank + 1);
    while (got < ks) {
        int64_t i = (int64_t)fl_rng_below(&common, (uint64_t)n);
        if (!used[i])
            used[i] = 1, got++;
    }
    while (got < k) {
        int64_t i = (int64_t)fl_rng_below(&own, (uint64_t)n);
        if (!used[i])
            used[i] = 1, got++;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (used[i])
            idx[m++] = (int32_t)i;
    free(used);
    return m;
}

typedef struct {
    const char *name;
    double      time_ms;
    double      recv;
    double      dropped;
} result;

typedef enum { OP_LATENCY, OP_ALLGATHER, OP_SPARSE, OP_DENSE } op_kind;

typedef struct {
    fl_comm *c;
    int64_t  n, k;
    int32_t *idx, *pairs, *gathered, *oidx;
    float   *val, *oval, *dense;
    uint8_t *kept;
    int64_t  budget; /* sums the sparse allreduce keeps */
    int64_t  dropped;
} bufs;

static int run_once(bufs *b, op_kind op) {
    int64_t got = 0;
    int32_t one[2] = {0, 0};
    switch (op) {
    case OP_LATENCY: /* gathered holds 2 k values per rank, k >= 1 */
        return fl_comm_allgather(b->c, one, b->gathered, 2, FL_DTYPE_I32);
    case OP_ALLGATHER:
        return fl_comm_allgather(b->c, b->pairs, b->gathered, (size_t)(2 * b->k), FL_DTYPE_I32);
    case OP_SPARSE: {
        int rc = fl_comm_sparse_allreduce(b->c, b->n, b->idx, b->val, b->k, b->budget, b->oidx,
                                          b->oval, &got, b->kept);
        for (int64_t i = 0; i < b->k; i++)
            b->dropped += !b->kept[i];
        return rc;
    }
    case OP_DENSE:
        return fl_comm_allreduce(b->c, b->dense, (size_t)b->n, FL_DTYPE_F32, FL_REDOP_SUM);
    }
    return -1;
}

static int measure(bufs *b, op_kind op, int iters, int warmup, result *out) {
    int size = fl_comm_size(b->c);
    double *t = malloc((size_t)iters * sizeof *t);
    if (!t)
        return fl_fail(FL_ENOMEM, "out of memory");
    int rc = FL_OK;
    for (int i = 0; i < warmup && rc == FL_OK; i++)
        rc = run_once(b, op);
    double own[2] = {0, 0}; /* bytes received by the operation itself, pairs dropped */
    b->dropped = 0;
    for (int i = 0; i < iters && rc == FL_OK; i++) {
        fl_comm_stats a, z;
        if ((rc = fl_comm_barrier(b->c)) < 0)
            break;
        fl_comm_get_stats(b->c, &a);
        double t0 = now_s();
        if ((rc = run_once(b, op)) < 0)
            break;
        t[i] = now_s() - t0;
        fl_comm_get_stats(b->c, &z);
        own[0] += (double)(z.bytes_received - a.bytes_received);
        rc = fl_comm_allreduce(b->c, &t[i], 1, FL_DTYPE_F64, FL_REDOP_MAX);
    }
    own[1] = (double)b->dropped;
    if (rc == FL_OK)
        rc = fl_comm_allreduce(b->c, own, 2, FL_DTYPE_F64, FL_REDOP_SUM);
    if (rc == FL_OK) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        out->time_ms = 1e3 * t[iters / 2];
        out->recv = own[0] / size / iters;
        out->dropped = op == OP_SPARSE ? own[1] / ((double)b->k * size * iters) : 0;
    }
    free(t);
    return rc;
}

int main(int argc, char **argv) {
    int64_t n = 1 << 20;
    double density = 0.001, shared = 0.5, budget = 7; /* DGC_SPARSE_BUDGET */
    int iters = 10, warmup = 2;
    const char *ops = "latency,allgather,sparse,dense";
    for (int i = 1; i < argc; i += 2) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && !strcmp(f, "--numel"))
            n = atoll(v);
        else if (v && !strcmp(f, "--density"))
            density = atof(v);
        else if (v && !strcmp(f, "--budget"))
            budget = atof(v);
        else if (v && !strcmp(f, "--shared"))
            shared = atof(v);
        else if (v && !strcmp(f, "--iters"))
            iters = atoi(v);
        else if (v && !strcmp(f, "--warmup"))
            warmup = atoi(v);
        else if (v && !strcmp(f, "--ops"))
            ops = v;
        else {
            fprintf(stderr, "usage: dgc_exchange [--numel N] [--density D] [--shared F] "
                            "[--budget B] [--iters I] [--warmup W]\n"
                            "                    [--ops latency,allgather,sparse,dense]\n");
            return 2;
        }
    }
    if (n < 1 || n > INT32_MAX || !(density > 0 && density <= 1) || !(shared >= 0 && shared <= 1) ||
        !(budget >= 0 && budget <= 64) || iters < 1 || warmup < 0) {
        fprintf(stderr, "dgc_exchange: numel in [1, 2^31), density in (0, 1], shared in [0, 1], "
                        "budget in [0, 64], iters >= 1\n");
        return 2;
    }
    fl_comm *c = NULL;
    if (fl_comm_init_from_env(NULL, &c) < 0) {
        fprintf(stderr, "dgc_exchange: %s\n", fl_errmsg());
        return 1;
    }
    int rank = fl_comm_rank(c), size = fl_comm_size(c);
    int64_t k = (int64_t)ceil(density * (double)n);
    bufs b = {.c = c, .n = n, .k = k, .budget = (int64_t)ceil(budget * (double)k)};
    b.idx = malloc((size_t)k * sizeof *b.idx);
    b.val = malloc((size_t)k * sizeof *b.val);
    b.pairs = malloc((size_t)(2 * k) * sizeof *b.pairs);
    b.gathered = malloc((size_t)(2 * k * size) * sizeof *b.gathered);
    b.oidx = malloc((size_t)(b.budget + 1) * sizeof *b.oidx);
    b.oval = malloc((size_t)(b.budget + 1) * sizeof *b.oval);
    b.kept = malloc((size_t)k);
    b.dense = calloc((size_t)n, sizeof *b.dense);
    int rc = 1;
    if (!b.idx || !b.val || !b.pairs || !b.gathered || !b.oidx || !b.oval || !b.kept || !b.dense ||
        make_indices(n, k, shared, rank, b.idx) != k) {
        fprintf(stderr, "dgc_exchange: out of memory\n");
        goto done;
    }
    fl_rng r;
    fl_rng_init(&r, 99, (uint64_t)rank);
    for (int64_t i = 0; i < k; i++) {
        b.val[i] = (float)fl_rng_normal(&r);
        b.pairs[2 * i] = b.idx[i];
        memcpy(&b.pairs[2 * i + 1], &b.val[i], 4);
    }
    static const char *names[] = {"latency", "allgather", "sparse", "dense"};
    for (int op = 0; op < 4; op++) {
        if (!strstr(ops, names[op]))
            continue;
        result res = {.name = names[op]};
        if (measure(&b, (op_kind)op, iters, warmup, &res) < 0) {
            fprintf(stderr, "dgc_exchange: %s: %s\n", names[op], fl_errmsg());
            goto done;
        }
        if (rank == 0)
            printf("%s %d %lld %lld %.4f %.0f %.4f\n", res.name, size, (long long)k, (long long)n,
                   res.time_ms, res.recv, res.dropped);
    }
    rc = 0;
done:
    free(b.idx);
    free(b.val);
    free(b.pairs);
    free(b.gathered);
    free(b.oidx);
    free(b.oval);
    free(b.kept);
    free(b.dense);
    fl_comm_free(c);
    return rc;
}
