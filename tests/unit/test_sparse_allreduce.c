/* test_sparse_allreduce.c - fl_comm_sparse_allreduce over N = 1..8 ranks (threads on a tcp
 * communicator over socketpairs) against the dense sum of the sparsified inputs: with a budget
 * that holds every index, the result is that sum exactly (in rank order); with a smaller one,
 * the kept pairs are exact sums, at most max_keep of them, none smaller than a dropped one
 * beyond the threshold's resolution, and the dropped contributions (kept[i] = 0) plus the
 * kept sums account for every input value. Disjoint, overlapping and empty index sets, all
 * indices of the tensor on every rank (k >= n), every rank the same answer; bad input refused. */
#include "test.h"

#include "comm/socket_mesh.h"
#include "comm/tcp.h"

#include "fleet/comm.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAXR = 8 };

typedef struct {
    int      kind;     /* 0 random, 1 disjoint, 2 identical, 3 empty on odd ranks, 4 all, 5 none */
    int64_t  n, m;     /* tensor size, pairs per rank (before the kind's changes) */
    int64_t  max_keep;
    uint64_t seed;
} case_t;

typedef struct {
    int      rank, size, *fds;
    pthread_barrier_t *bar;
    const case_t *cs;
    /* this rank's input and result */
    int32_t *idx;
    float   *val;
    int64_t  m;
    int32_t *out_idx;
    float   *out_val;
    int64_t  out_count;
    uint8_t *kept;
    int      rc;
} rank_t;

/* Rank r's input for case cs: ascending unique indices and values. */
static void make_input(const case_t *cs, int r, int size, rank_t *a) {
    fl_rng g;
    fl_rng_init(&g, cs->seed, (uint64_t)r);
    a->idx = malloc((size_t)(cs->n + 1) * sizeof *a->idx);
    a->val = malloc((size_t)(cs->n + 1) * sizeof *a->val);
    a->m = 0;
    for (int64_t i = 0; i < cs->n; i++) {
        bool take;
        switch (cs->kind) {
        case 1: take = i % size == r && fl_rng_uniform(&g) < (double)cs->m * size / cs->n; break;
        case 2: take = i % 3 == 0; break;
        case 3: take = r % 2 == 0 && fl_rng_uniform(&g) < (double)cs->m / cs->n; break;
        case 4: take = true; break;
        case 5: take = false; break;
        default: take = fl_rng_uniform(&g) < (double)cs->m / cs->n; break;
        }
        if (take) {
            a->idx[a->m] = (int32_t)i;
            /* values of many magnitudes, whose f32 sums depend on the order of the terms */
            a->val[a->m] = (float)((fl_rng_uniform(&g) - 0.5) * ldexp(1.0, (int)fl_rng_below(&g, 24) - 12));
            a->m++;
        }
    }
}

static void *rank_main(void *p) {
    rank_t *a = p;
    fl_comm *c = NULL;
    if (fl_comm_tcp_from_fds(a->rank, a->size, a->fds, 60, &c) < 0) {
        fprintf(stderr, "rank %d: %s\n", a->rank, fl_errmsg());
        a->rc = -1;
        return NULL;
    }
    int64_t cap = a->cs->max_keep + 1;
    a->out_idx = malloc((size_t)cap * sizeof *a->out_idx);
    a->out_val = malloc((size_t)cap * sizeof *a->out_val);
    a->kept = malloc((size_t)a->m + 1);
    a->rc = fl_comm_sparse_allreduce(c, a->cs->n, a->idx, a->val, a->m, a->cs->max_keep,
                                     a->out_idx, a->out_val, &a->out_count, a->kept);
    if (a->rc < 0)
        fprintf(stderr, "rank %d: %s\n", a->rank, fl_errmsg());
    fl_comm_free(c);
    return NULL;
}

static uint32_t mag(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x7fffffffu) >> 15; /* the threshold's resolution: exponent + 8 bits */
}

/* Runs one case on n ranks and checks it. */
static void run_case(int size, const case_t *cs) {
    int *fds = socket_mesh(size, 0);
    rank_t a[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < size; r++) {
        memset(&a[r], 0, sizeof a[r]);
        a[r].rank = r;
        a[r].size = size;
        a[r].fds = fds + r * size;
        a[r].cs = cs;
        make_input(cs, r, size, &a[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);

    /* the dense sum of the sparsified inputs, in rank order, and which indices appear */
    float *dense = calloc((size_t)cs->n + 1, sizeof *dense);
    uint8_t *seen = calloc((size_t)cs->n + 1, 1);
    double total_in = 0, total_abs = 0;
    int64_t distinct = 0;
    for (int r = 0; r < size; r++)
        for (int64_t i = 0; i < a[r].m; i++) {
            int32_t j = a[r].idx[i];
            dense[j] = seen[j] ? dense[j] + a[r].val[i] : a[r].val[i];
            distinct += !seen[j];
            seen[j] = 1;
            total_in += a[r].val[i];
            total_abs += fabs(a[r].val[i]);
        }
    char what[160];
    snprintf(what, sizeof what, "%d ranks, kind %d, n %lld, m %lld, max_keep %lld", size,
             cs->kind, (long long)cs->n, (long long)cs->m, (long long)cs->max_keep);
    bool ok = true;
    for (int r = 0; r < size; r++)
        ok &= a[r].rc == 0;
    if (!ok) {
        fprintf(stderr, "%s: a rank failed\n", what);
        test_failures++;
    }
    /* every rank the same answer */
    for (int r = 1; ok && r < size; r++)
        if (a[r].out_count != a[0].out_count ||
            memcmp(a[r].out_idx, a[0].out_idx, (size_t)a[0].out_count * 4) ||
            memcmp(a[r].out_val, a[0].out_val, (size_t)a[0].out_count * 4)) {
            fprintf(stderr, "%s: rank %d's result differs from rank 0's\n", what, r);
            test_failures++;
            ok = false;
        }
    int64_t G = ok ? a[0].out_count : 0;
    if (ok) {
        CHECK(G <= cs->max_keep);
        if (distinct <= cs->max_keep && G != distinct) {
            fprintf(stderr, "%s: %lld kept of %lld distinct within the budget\n", what,
                    (long long)G, (long long)distinct);
            test_failures++;
        }
        uint32_t min_kept = UINT32_MAX;
        uint8_t *in_out = calloc((size_t)cs->n + 1, 1);
        for (int64_t g = 0; g < G; g++) {
            int32_t j = a[0].out_idx[g];
            bool good = j >= 0 && j < cs->n && seen[j] && (g == 0 || j > a[0].out_idx[g - 1]) &&
                        memcmp(&a[0].out_val[g], &dense[j], 4) == 0;
            if (!good) {
                fprintf(stderr, "%s: kept pair %lld (index %d): %.9g, dense sum %.9g\n", what,
                        (long long)g, j, a[0].out_val[g], j >= 0 && j < cs->n ? dense[j] : 0);
                test_failures++;
                break;
            }
            in_out[j] = 1;
            if (mag(a[0].out_val[g]) < min_kept)
                min_kept = mag(a[0].out_val[g]);
        }
        /* dropped: none larger than a kept one (at the threshold's resolution) */
        for (int64_t j = 0; j < cs->n; j++)
            if (seen[j] && !in_out[j] && mag(dense[j]) > min_kept) {
                fprintf(stderr, "%s: index %lld dropped with |%.9g| above a kept one\n", what,
                        (long long)j, dense[j]);
                test_failures++;
                break;
            }
        /* kept flags, and nothing lost: kept sums + dropped contributions = every input */
        double acc = 0;
        for (int64_t g = 0; g < G; g++)
            acc += a[0].out_val[g];
        for (int r = 0; r < size; r++)
            for (int64_t i = 0; i < a[r].m; i++) {
                if (a[r].kept[i] != in_out[a[r].idx[i]]) {
                    fprintf(stderr, "%s: rank %d pair %lld: kept flag %d, index %s kept\n", what,
                            r, (long long)i, a[r].kept[i], in_out[a[r].idx[i]] ? "" : "not");
                    test_failures++;
                    r = size;
                    break;
                }
                if (!a[r].kept[i])
                    acc += a[r].val[i];
            }
        /* (the kept sums are f32: rounding of one part in 2^24 per term at most) */
        CHECK_NEAR(acc, total_in, 1e-6 * (1 + total_abs));
        free(in_out);
    }
    for (int r = 0; r < size; r++) {
        free(a[r].idx);
        free(a[r].val);
        free(a[r].out_idx);
        free(a[r].out_val);
        free(a[r].kept);
    }
    free(dense);
    free(seen);
    free(fds);
}

int main(void) {
    int cases = 0;
    for (int size = 1; size <= MAXR; size++) {
        for (int kind = 0; kind <= 5; kind++) {
            int64_t ns[] = {0, 1, 37, 1000, 20011};
            for (int k = 0; k < 5; k++) {
                int64_t n = ns[k], m = n / 10 + 1 < n ? n / 10 + 1 : n;
                if (n == 0 && kind != 5)
                    continue;
                int64_t budgets[] = {n * size + 1, m, m / 3, 0};
                for (int b = 0; b < 4; b++) {
                    case_t cs = {.kind = kind, .n = n, .m = m, .max_keep = budgets[b],
                                 .seed = (uint64_t)(size * 1000 + kind * 10 + k)};
                    run_case(size, &cs);
                    cases++;
                }
            }
        }
    }
    /* bad input is refused on the rank that gave it (one rank: nothing to wait for) */
    int fds[1] = {-1};
    fl_comm *c;
    CHECK_OK(fl_comm_tcp_from_fds(0, 1, fds, 5, &c));
    int32_t idx[] = {3, 2}, oi[4];
    float val[] = {1, 2}, ov[4];
    uint8_t kept[2];
    int64_t cnt;
    CHECK_RC(fl_comm_sparse_allreduce(c, 10, idx, val, 2, 4, oi, ov, &cnt, kept), FL_EINVAL);
    CHECK_MSG("pair 1: index 2 is not above the one before");
    idx[0] = 1;
    idx[1] = 10;
    CHECK_RC(fl_comm_sparse_allreduce(c, 10, idx, val, 2, 4, oi, ov, &cnt, kept), FL_EINVAL);
    CHECK_MSG("pair 1: index 10 is outside the tensor");
    fl_comm_free(c);
    fprintf(stderr, "test_sparse_allreduce: %d cases\n", cases);
    TEST_DONE();
}
