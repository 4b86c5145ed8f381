/* test_comm_hier.c - node groups and the hierarchical allreduce without processes: L x M threads
 * (layouts 2x2, 3x2, 2x3, 1x3, 3x1: ranks per node x nodes), each a rank of a tcp communicator
 * over socketpairs, split into nodes of L (fl_comm_split_nodes):
 *  - the whole collective matrix (tests/comm/comm_matrix.h) on the node view and on the cross
 *    view, and on the communicator with hierarchical allreduce on (its expected values are the
 *    flat sum: exact for small integers, within rounding for spread floats; every rank the same
 *    bits), also with tiny ring segments so that buffers take many passes;
 *  - hierarchical vs flat allreduce on the same random floats: equal within rounding, and
 *    repeatable to the bit;
 *  - async collectives on the communicator interleaved with blocking ones on its views complete
 *    in issue order with the right results;
 *  - bad splits are refused (ranks not divisible into nodes, an environment whose nodes are not
 *    numbered node by node, a second split of another size, a view split again or made
 *    hierarchical).
 * Ranks busy-poll before they sleep in poll (the transport's default) in the first layout only;
 * in the others they sleep at once (FLEET_COMM_SPIN_US=0: more threads than cores). */
#include "test.h"

#include "comm/algorithms.h"
#include "comm/comm_impl.h"
#include "comm/comm_matrix.h"
#include "comm/hier_views.h"
#include "comm/socket_mesh.h"
#include "comm/tcp.h"
#include "comm/transport.h"

#include "fleet/comm.h"
#include "fleet/status.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    int                rank, L, M;
    int               *fds, *fds2; /* fds2: a second mesh for fl_comm_tcp_view's transport */
    long               failures;
    pthread_barrier_t *bar;
} rank_arg;

#define FAILF(a, ...)                                                                             \
    do {                                                                                          \
        fprintf(stderr, "rank %d (%dx%d): ", (a)->rank, (a)->L, (a)->M);                          \
        fprintf(stderr, __VA_ARGS__);                                                             \
        fprintf(stderr, "\n");                                                                    \
        (a)->failures++;                                                                          \
    } while (0)

static long run_matrix(fl_comm *c, const char *what, int L, int M) {
    static const size_t counts[] = {0, 1, 7, 1000, 20011};
    mx_ctx m = {.c = c, .seed = 11};
    mx_run(&m, counts, 5);
    if (m.failures && fl_comm_rank(c) == 0)
        fprintf(stderr, "%dx%d, %s: %ld failures\n", L, M, what, m.failures);
    return m.failures + (m.fatal ? 1 : 0);
}

static float value(int rank, size_t i) { /* spread over magnitudes: sums depend on order */
    uint64_t x = mx_mix(((uint64_t)rank << 40) ^ i);
    return (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) *
           ldexpf(1.0f, (int)((x >> 3) % 24) - 12);
}

/* The same bits on every rank of c: the largest and the smallest (largest negated) over ranks
 * of a hash of buf agree. */
static bool same_on_all(fl_comm *c, const void *buf, size_t bytes) {
    uint64_t u = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++)
        u = (u ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
    int64_t hi = (int64_t)(u >> 1), neg_lo = -hi;
    return fl_comm_allreduce(c, &hi, 1, FL_DTYPE_I64, FL_REDOP_MAX) == 0 &&
           fl_comm_allreduce(c, &neg_lo, 1, FL_DTYPE_I64, FL_REDOP_MAX) == 0 && hi == -neg_lo;
}

typedef int (*allreduce_fn)(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op);

/* c's hierarchical allreduce (fl_comm_set_hierarchical, hier.c on tcp) */
static int hier_on(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    int rc = fl_comm_set_hierarchical(c, 1);
    return rc < 0 ? rc : fl_comm_allreduce(c, buf, count, t, op);
}

/* hier (named what) against the flat allreduce of c on the same spread floats: equal within
 * rounding, repeatable to the bit, the same bits on every rank. */
static void hier_vs_flat(rank_arg *a, fl_comm *c, const char *what, allreduce_fn hier) {
    enum { N = 100003 }; /* odd, not divisible by any rank count here */
    int n = a->L * a->M;
    float *flat = malloc(N * sizeof *flat), *h1 = malloc(N * sizeof *h1),
          *h2 = malloc(N * sizeof *h2);
    for (size_t i = 0; i < N; i++)
        flat[i] = h1[i] = h2[i] = value(a->rank, i);
    if (fl_comm_set_hierarchical(c, 0) < 0 ||
        fl_comm_allreduce(c, flat, N, FL_DTYPE_F32, FL_REDOP_AVG) < 0 ||
        hier(c, h1, N, FL_DTYPE_F32, FL_REDOP_AVG) < 0 ||
        hier(c, h2, N, FL_DTYPE_F32, FL_REDOP_AVG) < 0) {
        FAILF(a, "%s: %s", what, fl_errmsg());
        goto done;
    }
    if (memcmp(h1, h2, N * sizeof *h1) != 0)
        FAILF(a, "%s is not repeatable to the bit", what);
    if (!same_on_all(c, h1, N * sizeof *h1))
        FAILF(a, "%s: ranks hold different bits", what);
    int bad = 0;
    for (size_t i = 0; i < N && bad < 3; i++) {
        double sum_abs = 0;
        for (int q = 0; q < n; q++)
            sum_abs += fabs((double)value(q, i));
        double tol = 4.0 * 6e-8 * sum_abs + 1e-30;
        if (fabs((double)h1[i] - (double)flat[i]) > tol) {
            FAILF(a, "%s, element %zu: %.9g, flat %.9g", what, i, h1[i], flat[i]);
            bad++;
        }
    }
done:
    free(flat);
    free(h1);
    free(h2);
}

/* An async allreduce on c, a blocking one on the node view, another async one on c: each gets
 * its own right answer (ranks sum their rank numbers). */
static void interleaved(rank_arg *a, fl_comm *c, fl_comm *node) {
    int n = a->L * a->M;
    double x[3] = {a->rank, a->rank, a->rank}, y = a->rank % a->L;
    fl_request *r1 = NULL, *r2 = NULL;
    int rc = fl_comm_iallreduce(c, &x[0], 1, FL_DTYPE_F64, FL_REDOP_SUM, &r1);
    rc = rc < 0 ? rc : fl_comm_allreduce(node, &y, 1, FL_DTYPE_F64, FL_REDOP_SUM);
    rc = rc < 0 ? rc : fl_comm_iallreduce(c, &x[1], 2, FL_DTYPE_F64, FL_REDOP_MAX, &r2);
    int w1 = fl_request_wait(r1), w2 = fl_request_wait(r2);
    if (rc < 0 || w1 < 0 || w2 < 0) {
        FAILF(a, "interleaved: %s", fl_errmsg());
        return;
    }
    double want_y = a->L * (a->L - 1) / 2.0;
    if (x[0] != n * (n - 1) / 2.0 || y != want_y || x[1] != n - 1 || x[2] != n - 1)
        FAILF(a, "interleaved: got %g %g %g %g", x[0], y, x[1], x[2]);
}


/* The allreduce composed of the views' own collectives (hier_views.c, what the nccl backend
 * runs: NCCL's node allreduce and allgatherv, tcp's cross allreduce), here over tcp's views:
 * small counts (segments of 0 and 1 element) exact on integers for sum, max and avg; spread
 * floats equal to the flat allreduce within rounding, repeatable and the same on every rank. */
static void views_composed(rank_arg *a, fl_comm *c) {
    int n = a->L * a->M;
    static const size_t counts[] = {1, 2, 5, 7, 1000};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t m = counts[k];
        int32_t sum[1000], mx[1000], avg[1000];
        for (size_t i = 0; i < m; i++) {
            sum[i] = mx[i] = (int32_t)(a->rank * 1000 + (int)i);
            avg[i] = (int32_t)(a->rank * n + (int)i);
        }
        if (fl_hier_views_allreduce(c, sum, m, FL_DTYPE_I32, FL_REDOP_SUM) < 0 ||
            fl_hier_views_allreduce(c, mx, m, FL_DTYPE_I32, FL_REDOP_MAX) < 0 ||
            fl_hier_views_allreduce(c, avg, m, FL_DTYPE_I32, FL_REDOP_AVG) < 0) {
            FAILF(a, "views, count %zu: %s", m, fl_errmsg());
            return;
        }
        for (size_t i = 0; i < m; i++) {
            int32_t want_sum = (int32_t)(1000 * n * (n - 1) / 2 + n * (int)i);
            int32_t want_max = (int32_t)((n - 1) * 1000 + (int)i);
            int32_t want_avg = (int32_t)((n * n * (n - 1) / 2 + n * (int)i) / n);
            if (sum[i] != want_sum || mx[i] != want_max || avg[i] != want_avg) {
                FAILF(a, "views, count %zu, element %zu: sum %d (%d) max %d (%d) avg %d (%d)", m,
                      i, sum[i], want_sum, mx[i], want_max, avg[i], want_avg);
                return;
            }
        }
    }
    int32_t none = 7;
    if (fl_hier_views_allreduce(c, &none, 0, FL_DTYPE_I32, FL_REDOP_SUM) < 0 || none != 7)
        FAILF(a, "views: a count of 0 must change nothing");
    hier_vs_flat(a, c, "the allreduce composed of the views", fl_hier_views_allreduce);
}

/* fl_comm_tcp_view: a tcp communicator over another's transport (the nccl backend's cross
 * view), here the ranks with this local rank over a transport of all ranks: the collective
 * matrix on it; the transport outlives it and still works after it is freed. */
static void tcp_view(rank_arg *a) {
    int n = a->L * a->M, me_local = a->rank % a->L, members[8];
    fl_comm_counters counters = {0};
    fl_transport *tp = NULL;
    if (fl_transport_from_fds(a->rank, n, a->fds2, 60, &counters, &tp) < 0) {
        FAILF(a, "transport: %s", fl_errmsg());
        return;
    }
    for (int j = 0; j < a->M; j++)
        members[j] = j * a->L + me_local;
    fl_comm *v = fl_comm_new();
    if (!v) {
        FAILF(a, "fl_comm_new: %s", fl_errmsg());
        fl_transport_free(tp);
        return;
    }
    v->rank = a->rank / a->L;
    v->size = a->M;
    if (fl_comm_tcp_view(v, tp, members, 60) < 0)
        FAILF(a, "fl_comm_tcp_view: %s", fl_errmsg());
    else
        a->failures += run_matrix(v, "tcp view over another transport", a->L, a->M);
    fl_comm_free(v);
    if (fl_rd_barrier(fl_transport_peers(tp)) < 0)
        FAILF(a, "the transport after its view was freed: %s", fl_errmsg());
    fl_transport_free(tp);
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    int n = a->L * a->M;
    fl_comm *c = NULL, *node = NULL, *cross = NULL, *again = NULL;
    if (fl_comm_tcp_from_fds(a->rank, n, a->fds, 60, &c) < 0) {
        FAILF(a, "fl_comm_tcp_from_fds: %s", fl_errmsg());
        pthread_barrier_wait(a->bar);
        return NULL;
    }
    pthread_barrier_wait(a->bar);
    if (fl_comm_split_nodes(c, a->L, &node, &cross) < 0) {
        FAILF(a, "split: %s", fl_errmsg());
        fl_comm_free(c);
        return NULL;
    }
    if (fl_comm_rank(node) != a->rank % a->L || fl_comm_size(node) != a->L ||
        fl_comm_rank(cross) != a->rank / a->L || fl_comm_size(cross) != a->M ||
        fl_comm_local_size(c) != a->L)
        FAILF(a, "views: node %d/%d, cross %d/%d", fl_comm_rank(node), fl_comm_size(node),
              fl_comm_rank(cross), fl_comm_size(cross));
    if (fl_comm_split_nodes(c, a->L, &again, NULL) < 0 || again != node)
        FAILF(a, "a second split of the same size must return the same views");
    if (a->L > 1 && fl_comm_split_nodes(c, 1, NULL, NULL) != FL_EINVAL)
        FAILF(a, "a second split of another size must be refused");
    if (fl_comm_split_nodes(node, 1, NULL, NULL) != FL_EINVAL)
        FAILF(a, "a view must not split again");
    fl_comm_free(node); /* a no-op on a view */

    a->failures += run_matrix(node, "node view", a->L, a->M);
    a->failures += run_matrix(cross, "cross view", a->L, a->M);
    if (fl_comm_set_hierarchical(c, 1) < 0)
        FAILF(a, "set_hierarchical: %s", fl_errmsg());
    a->failures += run_matrix(c, "hierarchical", a->L, a->M);
    /* tiny segments: the node ring and the cross allreduce take many passes */
    fl_tcp_tuning def, tu;
    fl_comm_tcp_get_tuning(c, &def);
    tu = def;
    tu.seg_max_bytes = 4000;
    tu.rd_max_bytes = 0;
    fl_comm_tcp_set_tuning(c, &tu);
    a->failures += run_matrix(c, "hierarchical, ring segments of 4000 bytes", a->L, a->M);
    fl_comm_tcp_set_tuning(c, &def);
    hier_vs_flat(a, c, "hierarchical allreduce", hier_on);
    interleaved(a, c, node);
    views_composed(a, c);
    tcp_view(a);
    fl_comm_free(c);
    return NULL;
}

static void run_layout(int L, int M) {
    int n = L * M;
    int *fds = socket_mesh(n, 0), *fds2 = socket_mesh(n, 0);
    rank_arg args[8];
    pthread_t th[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    double t0 = fl_now();
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){.rank = r, .L = L, .M = M, .fds = fds + r * n,
                             .fds2 = fds2 + r * n, .bar = &bar};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    long failures = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        failures += args[r].failures;
    }
    pthread_barrier_destroy(&bar);
    fprintf(stderr, "%d ranks per node x %d nodes: %ld failures, %.2f s\n", L, M, failures,
            fl_now() - t0);
    if (failures)
        test_failures++;
    free(fds);
    free(fds2);
}

static void test_bad_split(void) {
    int *fds = socket_mesh(1, 0);
    fl_comm *c = NULL;
    CHECK_OK(fl_comm_tcp_from_fds(0, 1, fds, 10, &c));
    CHECK_RC(fl_comm_split_nodes(c, 2, NULL, NULL), FL_EINVAL);
    CHECK_MSG("1 ranks cannot form nodes of 2");
    /* the environment's topology numbers this rank's node otherwise than node by node */
    c->env_local_size = 1;
    c->env_node = 1;
    CHECK_RC(fl_comm_split_nodes(c, 0, NULL, NULL), FL_EINVAL);
    CHECK_MSG("rank 0 is on node 1, but node groups need ranks numbered node by node");
    c->env_local_size = 0;
    c->env_node = 0;
    fl_comm *node = NULL, *cross = NULL;
    CHECK_OK(fl_comm_split_nodes(c, 0, &node, &cross)); /* no topology: nodes of one */
    CHECK(fl_comm_size(node) == 1 && fl_comm_size(cross) == 1);
    CHECK_RC(fl_comm_set_hierarchical(node, 1), FL_EINVAL);
    CHECK_MSG("a node group has no hierarchy of its own");
    fl_comm_free(c);
    free(fds);
}

int main(void) {
    test_bad_split();
    static const int layouts[][2] = {{2, 2}, {3, 2}, {2, 3}, {1, 3}, {3, 1}};
    for (int i = 0; i < 5; i++) {
        /* ranks after the first layout sleep in poll rather than busy-poll first: with more
         * threads than cores the spinning took more CPU than the checks */
        if (i == 1)
            setenv("FLEET_COMM_SPIN_US", "0", 1);
        run_layout(layouts[i][0], layouts[i][1]);
    }
    unsetenv("FLEET_COMM_SPIN_US");
    TEST_DONE();
}
