/* test_comm_algorithms.c - the tcp backend's algorithms without processes: N = 1..5 threads
 * (6..8 with small counts), each a rank of a communicator over socketpairs
 * (fl_comm_tcp_from_fds), run the matrix of tests/comm/comm_matrix.h under four tunings
 * (default switch points; the bandwidth algorithms forced: ring, chain and pairwise exchange,
 * with tiny segments so that buffers take many passes; the latency algorithms forced:
 * recursive doubling, tree and Bruck; Rabenseifner's allreduce forced), and the alltoalls once
 * more through comm.c's fallback for backends without one (alltoallv). The Rabenseifner tuning
 * changes only the allreduce, so it runs the matrix's allreduce rows alone, for N = 1..8
 * (every fold, 1 to 3 halvings), and checks that they also have recursive doubling's bits.
 * Ranks sleep in poll rather than busy-poll first (FLEET_COMM_SPIN_US=0: more threads than
 * cores), but for a repeated run of 3 ranks, which must give the same bits.
 * Also: the reduction kernels against core/half.c, argument checks, a single rank with no
 * network, and a peer that leaves (every later call fails with the first failure's message),
 * whichever collective meets it first. */
#include "test.h"

#include "comm/comm_matrix.h"
#include "comm/socket_mesh.h"
#include "comm/tcp.h"

#include "fleet/comm.h"
#include "fleet/status.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

static uint64_t rng_state = 12345;
static uint64_t next_u64(void) { return mx_mix(rng_state++); }

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* --- the reduction kernels --- */

static void test_reduce_kernels(void) {
    /* f16 / bf16 sums and averages equal core/half.c's conversions of the f32 results */
    enum { N = 1 << 16 };
    uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *x = malloc(N * 2);
    for (int k = 0; k < 2; k++) {
        fl_dtype t = k ? FL_DTYPE_BF16 : FL_DTYPE_F16;
        float (*to_f32)(uint16_t) = k ? fl_bf16_to_f32 : fl_f16_to_f32;
        uint16_t (*from_f32)(float) = k ? fl_f32_to_bf16 : fl_f32_to_f16;
        for (int i = 0; i < N; i++) { /* every half as x; random pairs as a + b */
            x[i] = (uint16_t)i;
            a[i] = (uint16_t)next_u64();
            b[i] = (uint16_t)(i % 7 == 0 ? a[i] ^ 0x8000u : next_u64()); /* some cancel */
        }
        uint16_t *acc = malloc(N * 2);
        memcpy(acc, a, N * 2);
        fl_reduce_into(acc, b, N, t, FL_REDOP_SUM);
        int bad = 0;
        for (int i = 0; i < N && bad < 3; i++) {
            uint16_t want = from_f32(to_f32(a[i]) + to_f32(b[i]));
            bool both_nan = isnan(to_f32(want)) && isnan(to_f32(acc[i]));
            if (acc[i] != want && !both_nan) {
                fprintf(stderr, "%s sum %04x + %04x: got %04x want %04x\n", fl_dtype_name(t),
                        a[i], b[i], acc[i], want);
                bad++;
            }
        }
        memcpy(acc, x, N * 2);
        fl_reduce_finalize(acc, N, t, FL_REDOP_AVG, 3);
        for (int i = 0; i < N && bad < 6; i++) {
            uint16_t want = from_f32(to_f32(x[i]) / 3.0f);
            if (acc[i] != want) {
                fprintf(stderr, "%s avg %04x / 3: got %04x want %04x\n", fl_dtype_name(t), x[i],
                        acc[i], want);
                bad++;
            }
        }
        CHECK(bad == 0);
        free(acc);
    }
    free(a);
    free(b);
    free(x);

    /* max is commutative to the bit (NaNs, -0 and +0 included) and is the larger value */
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN,
                                    1e-45f, -1e-45f, 3.4e38f};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < ns; i++) {
        for (int j = 0; j < ns; j++) {
            float p = special[i], q = special[j], pq = p, qp = q;
            fl_reduce_into(&pq, &q, 1, FL_DTYPE_F32, FL_REDOP_MAX);
            fl_reduce_into(&qp, &p, 1, FL_DTYPE_F32, FL_REDOP_MAX);
            CHECK(f32_bits(pq) == f32_bits(qp));
            if (isnan(p) || isnan(q))
                CHECK(isnan(pq));
            else if (p != q)
                CHECK(pq == (p > q ? p : q));
            else if (p == 0)
                CHECK(f32_bits(pq) == f32_bits(signbit(p) && signbit(q) ? -0.0f : 0.0f));
            double dp = p, dq = q, dpq = dp, dqp = dq;
            fl_reduce_into(&dpq, &dq, 1, FL_DTYPE_F64, FL_REDOP_MAX);
            fl_reduce_into(&dqp, &dp, 1, FL_DTYPE_F64, FL_REDOP_MAX);
            CHECK(memcmp(&dpq, &dqp, 8) == 0);
            CHECK(isnan(dp) || isnan(dq) ? isnan(dpq) : dpq == (dp > dq ? dp : dq));
            uint16_t hp = fl_f32_to_f16(p), hq = fl_f32_to_f16(q), hpq = hp, hqp = hq;
            fl_reduce_into(&hpq, &hq, 1, FL_DTYPE_F16, FL_REDOP_MAX);
            fl_reduce_into(&hqp, &hp, 1, FL_DTYPE_F16, FL_REDOP_MAX);
            CHECK(hpq == hqp);
            uint16_t bp = fl_f32_to_bf16(p), bq = fl_f32_to_bf16(q), bpq = bp, bqp = bq;
            fl_reduce_into(&bpq, &bq, 1, FL_DTYPE_BF16, FL_REDOP_MAX);
            fl_reduce_into(&bqp, &bp, 1, FL_DTYPE_BF16, FL_REDOP_MAX);
            CHECK(bpq == bqp);
            if (!isnan(p) && !isnan(q) && p != q) {
                CHECK(fl_f16_to_f32(hpq) == fmaxf(fl_f16_to_f32(hp), fl_f16_to_f32(hq)));
                CHECK(fl_bf16_to_f32(bpq) == fmaxf(fl_bf16_to_f32(bp), fl_bf16_to_f32(bq)));
            }
        }
    }

    /* integers: sums wrap, avg rounds toward zero, max */
    int32_t i32[4] = {INT32_MAX, -7, 7, -5}, j32[4] = {1, 0, 0, 3};
    fl_reduce_into(i32, j32, 4, FL_DTYPE_I32, FL_REDOP_SUM);
    CHECK(i32[0] == INT32_MIN && i32[1] == -7 && i32[3] == -2);
    fl_reduce_finalize(i32 + 1, 3, FL_DTYPE_I32, FL_REDOP_AVG, 2);
    CHECK(i32[1] == -3 && i32[2] == 3 && i32[3] == -1);
    int64_t i64[3] = {INT64_MAX, -9, 5}, j64[3] = {1, -10, 6};
    fl_reduce_into(i64, j64, 3, FL_DTYPE_I64, FL_REDOP_SUM);
    CHECK(i64[0] == INT64_MIN && i64[1] == -19 && i64[2] == 11);
    fl_reduce_finalize(i64 + 1, 2, FL_DTYPE_I64, FL_REDOP_AVG, 4);
    CHECK(i64[1] == -4 && i64[2] == 2);
    int64_t m64[2] = {-3, 8}, n64[2] = {-2, 7};
    fl_reduce_into(m64, n64, 2, FL_DTYPE_I64, FL_REDOP_MAX);
    CHECK(m64[0] == -2 && m64[1] == 8);

    fl_redop op;
    CHECK_OK(fl_redop_parse("avg", &op));
    CHECK(op == FL_REDOP_AVG);
    CHECK_OK(fl_redop_parse("max", &op));
    CHECK(op == FL_REDOP_MAX && strcmp(fl_redop_name(op), "max") == 0);
    CHECK_RC(fl_redop_parse("min", &op), FL_EINVAL);
    CHECK_MSG("min");
}

/* --- one rank: no network; argument checks --- */

static void test_single_rank(void) {
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.size = 1;
    env.listen_fd = -1;
    env.timeout_s = 10;
    env.gpu = -1;
    snprintf(env.backend, sizeof env.backend, "tcp");
    fl_comm *c = NULL;
    CHECK_OK(fl_comm_init(&env, &c));
    if (!c)
        return;
    CHECK(fl_comm_rank(c) == 0 && fl_comm_size(c) == 1);
    CHECK(strcmp(fl_comm_backend(c), "tcp") == 0);
    CHECK(strcmp(fl_comm_endpoint(c, 0), "") == 0);

    float f[3] = {1, 2, 3}, g[6] = {0};
    CHECK_RC(fl_comm_allreduce(c, NULL, 3, FL_DTYPE_F32, FL_REDOP_SUM), FL_EINVAL);
    CHECK_MSG("buf is NULL");
    CHECK_OK(fl_comm_allreduce(c, NULL, 0, FL_DTYPE_F32, FL_REDOP_SUM));
    CHECK_RC(fl_comm_allreduce(c, f, 3, FL_DTYPE_U8, FL_REDOP_SUM), FL_EINVAL);
    CHECK_MSG("u8 cannot be reduced");
    CHECK_RC(fl_comm_allreduce(c, f, 3, FL_DTYPE_F32, (fl_redop)7), FL_EINVAL);
    CHECK_MSG("invalid reduction op");
    CHECK_RC(fl_comm_allreduce(c, f, SIZE_MAX / 2, FL_DTYPE_F32, FL_REDOP_SUM), FL_EINVAL);
    CHECK_MSG("overflow");
    CHECK_RC(fl_comm_broadcast(c, f, 3, FL_DTYPE_F32, 1), FL_EINVAL);
    CHECK_MSG("root 1");
    CHECK_RC(fl_comm_reduce_scatter(c, g, g + 1, 3, FL_DTYPE_F32, FL_REDOP_SUM), FL_EINVAL);
    CHECK_MSG("overlaps");
    CHECK_RC(fl_comm_allgatherv(c, f, g, NULL, FL_DTYPE_F32), FL_EINVAL);
    size_t three = 3, two = 2;
    CHECK_RC(fl_comm_alltoallv(c, f, &three, g, NULL, FL_DTYPE_F32), FL_EINVAL);
    CHECK_MSG("recv_counts is NULL");
    CHECK_RC(fl_comm_alltoallv(c, g, &three, g + 1, &three, FL_DTYPE_F32), FL_EINVAL);
    CHECK_MSG("out overlaps in");
    CHECK_RC(fl_comm_alltoallv(c, f, &three, g, &two, FL_DTYPE_F32), FL_EINVAL);
    CHECK_MSG("rank 0 sends itself 3 elements but expects 2");
    CHECK_RC(fl_comm_alltoall(c, NULL, g, 3, FL_DTYPE_F32), FL_EINVAL);
    CHECK_MSG("in is NULL");
    CHECK_RC(fl_comm_alltoall(c, g, g + 2, 3, FL_DTYPE_F32), FL_EINVAL);
    CHECK_MSG("alltoall: out overlaps in");
    CHECK_RC(fl_comm_alltoall(c, f, g, SIZE_MAX / 4, FL_DTYPE_F64), FL_EINVAL);
    CHECK_MSG("overflow");
    CHECK_OK(fl_comm_alltoall(c, NULL, NULL, 0, FL_DTYPE_F32));
    fl_request *r = (fl_request *)&r;
    CHECK_RC(fl_comm_iallreduce(c, NULL, 3, FL_DTYPE_F32, FL_REDOP_SUM, &r), FL_EINVAL);
    CHECK(r == NULL);
    CHECK_OK(fl_request_wait(NULL));
    /* bad arguments do not break the communicator */
    CHECK_OK(fl_comm_allreduce(c, f, 3, FL_DTYPE_F32, FL_REDOP_AVG));
    CHECK(f[0] == 1 && f[2] == 3);
    CHECK_OK(fl_comm_allgather(c, f, g, 3, FL_DTYPE_F32));
    CHECK(g[1] == 2);
    memset(g, 0, sizeof g);
    CHECK_OK(fl_comm_alltoallv(c, f, &three, g, &three, FL_DTYPE_F32)); /* its own block */
    CHECK(g[0] == 1 && g[2] == 3);
    memset(g, 0, sizeof g);
    CHECK_OK(fl_comm_alltoall(c, f, g, 3, FL_DTYPE_F32));
    CHECK(g[0] == 1 && g[2] == 3);

    fl_comm_stats st;
    fl_comm_reset_stats(c);
    CHECK_OK(fl_comm_barrier(c));
    CHECK_OK(fl_comm_iallreduce(c, f, 3, FL_DTYPE_F32, FL_REDOP_SUM, &r));
    CHECK_OK(fl_request_wait(r));
    fl_comm_get_stats(c, &st);
    CHECK(st.ops == 2 && st.bytes_sent == 0 && st.seconds >= 0);

    mx_ctx m = {.c = c, .seed = 7};
    static const size_t counts[] = {0, 1, 7, 1000};
    mx_run(&m, counts, 4);
    CHECK(m.failures == 0 && !m.fatal);
    fl_comm_free(c);

    snprintf(env.backend, sizeof env.backend, "carrier-pigeon");
    CHECK_RC(fl_comm_init(&env, &c), FL_EINVAL);
    CHECK_MSG("carrier-pigeon");
    CHECK(c == NULL);
}

/* --- which allreduce the tcp backend picks --- */

static void test_allreduce_choice(void) {
    /* the defaults, as tcp.c documents them (a tcp communicator of one rank holds them) */
    static const char *const knobs[] = {"FLEET_TCP_RD_MAX_BYTES", "FLEET_TCP_RH_MIN_RANKS",
                                        "FLEET_TCP_RH_MIN_BYTES", "FLEET_TCP_RH_MAX_BYTES",
                                        "FLEET_TCP_BRUCK_MAX_BYTES", "FLEET_TCP_BRUCK_ROUND_BYTES"};
    const int nknobs = (int)(sizeof knobs / sizeof knobs[0]);
    for (int i = 0; i < nknobs; i++)
        unsetenv(knobs[i]);
    int fd = -1;
    fl_comm *c = NULL;
    CHECK_OK(fl_comm_tcp_from_fds(0, 1, &fd, 10, &c));
    if (!c)
        return;
    fl_tcp_tuning tu;
    fl_comm_tcp_get_tuning(c, &tu);
    fl_comm_free(c);
    CHECK(tu.rd_max_bytes == 256 << 10 && tu.rh_min_ranks == 8 && tu.rh_min_bytes == 64 << 10 &&
          tu.rh_max_bytes == 4 << 20);
    static const struct {
        int    n;
        size_t bytes;
    } cases[] = {{2, 0}, {4, 1000}, {4, 256 << 10}, {4, (256 << 10) + 1},
                 {7, 53120 * 4}, /* DGC's dense values in ResNet-50, f32 */
                 {8, 0}, {8, (64 << 10) - 1}, {8, 64 << 10}, {8, 53120 * 4}, {8, 4 << 20},
                 {8, (4 << 20) + 1}, {64, 100000}};
    static const fl_tcp_allreduce want[] = {
        FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RING,
        FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RH,
        FL_TCP_ALLREDUCE_RH, FL_TCP_ALLREDUCE_RH, FL_TCP_ALLREDUCE_RING, FL_TCP_ALLREDUCE_RH};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fl_tcp_allreduce got = fl_tcp_allreduce_choice(&tu, cases[i].n, cases[i].bytes);
        if (got != want[i])
            fprintf(stderr, "%d ranks, %zu bytes: allreduce %d, want %d\n", cases[i].n,
                    cases[i].bytes, (int)got, (int)want[i]);
        CHECK(got == want[i]);
    }
    /* at many ranks, recursive doubling only below Rabenseifner's range, even when rd_max_bytes
     * reaches above it: the ring there */
    tu.rh_max_bytes = 100 << 10;
    CHECK(fl_tcp_allreduce_choice(&tu, 8, 200 << 10) == FL_TCP_ALLREDUCE_RING);
    CHECK(fl_tcp_allreduce_choice(&tu, 7, 200 << 10) == FL_TCP_ALLREDUCE_RD);
    tu.rh_min_ranks = SIZE_MAX; /* off */
    CHECK(fl_tcp_allreduce_choice(&tu, 64, 100 << 10) == FL_TCP_ALLREDUCE_RD);

    /* Bruck's allgather: 1 MiB up to 8 ranks, then 256 KiB per round it saves over sockets
     * (16 ranks: 11 rounds; 128: 120), the flat 1 MiB over shared memory */
    CHECK(tu.bruck_max_bytes == 1 << 20 && tu.bruck_round_bytes == 256 << 10);
    CHECK(fl_tcp_gather_bruck(&tu, 2, 1 << 20, false));
    CHECK(!fl_tcp_gather_bruck(&tu, 2, (1 << 20) + 1, false));
    CHECK(fl_tcp_gather_bruck(&tu, 8, 1 << 20, false));
    CHECK(!fl_tcp_gather_bruck(&tu, 8, (1 << 20) + 1, false));
    CHECK(fl_tcp_gather_bruck(&tu, 16, 11 * (256 << 10), false));
    CHECK(!fl_tcp_gather_bruck(&tu, 16, 11 * (256 << 10) + 1, false));
    CHECK(fl_tcp_gather_bruck(&tu, 128, 1600000, false));
    CHECK(!fl_tcp_gather_bruck(&tu, 128, 1600000, true));
    CHECK(fl_tcp_gather_bruck(&tu, 128, 1 << 20, true));
    tu.bruck_max_bytes = tu.bruck_round_bytes = 0; /* the ring for everything but 0 bytes */
    CHECK(!fl_tcp_gather_bruck(&tu, 128, 1, false) && fl_tcp_gather_bruck(&tu, 128, 0, false));
    tu.bruck_round_bytes = SIZE_MAX; /* no overflow */
    CHECK(fl_tcp_gather_bruck(&tu, 1000, SIZE_MAX, false));

    /* the environment overrides the defaults; a bad value is refused by name */
    setenv("FLEET_TCP_RH_MIN_RANKS", "4", 1);
    setenv("FLEET_TCP_RH_MIN_BYTES", "1000", 1);
    setenv("FLEET_TCP_RH_MAX_BYTES", "2000", 1);
    setenv("FLEET_TCP_BRUCK_ROUND_BYTES", "3000", 1);
    CHECK_OK(fl_comm_tcp_from_fds(0, 1, &fd, 10, &c));
    if (c) {
        fl_comm_tcp_get_tuning(c, &tu);
        CHECK(tu.rh_min_ranks == 4 && tu.rh_min_bytes == 1000 && tu.rh_max_bytes == 2000);
        CHECK(tu.bruck_round_bytes == 3000);
        fl_comm_free(c);
    }
    setenv("FLEET_TCP_BRUCK_ROUND_BYTES", "lots", 1);
    CHECK_RC(fl_comm_tcp_from_fds(0, 1, &fd, 10, &c), FL_EINVAL);
    CHECK_MSG("FLEET_TCP_BRUCK_ROUND_BYTES=lots is not a byte count");
    unsetenv("FLEET_TCP_BRUCK_ROUND_BYTES");
    setenv("FLEET_TCP_RH_MIN_RANKS", "eight", 1);
    CHECK_RC(fl_comm_tcp_from_fds(0, 1, &fd, 10, &c), FL_EINVAL);
    CHECK_MSG("FLEET_TCP_RH_MIN_RANKS=eight is not a rank count");
    for (int i = 0; i < nknobs; i++)
        unsetenv(knobs[i]);
}

/* --- N ranks as threads --- */

/* The allreduce rows of the matrix alone (mx_run's loops, then the async ones): what a tuning
 * that changes only the allreduce needs, at a fraction of the time. Then halves that span two
 * of the transport's 256 KiB frames, so that Rabenseifner's partials are combined chunk by
 * chunk as they land. */
static void allreduce_rows(mx_ctx *m, const size_t *counts, int ncounts) {
    static const fl_redop ops[] = {FL_REDOP_SUM, FL_REDOP_AVG, FL_REDOP_MAX};
    m->rank = fl_comm_rank(m->c);
    m->size = fl_comm_size(m->c);
    if (m->max_reports == 0)
        m->max_reports = 20;
    for (int ci = 0; ci < ncounts && !m->fatal; ci++) {
        for (int d = 0; d < MX_NDTYPES && !m->fatal; d++) {
            fl_dtype t = mx_dtypes[d];
            for (int o = 0; o < 3 && !m->fatal; o++) {
                mx_allreduce(m, t, ops[o], MX_EXACT, counts[ci]);
                if (fl_dtype_is_float(t) && ops[o] != FL_REDOP_MAX)
                    mx_allreduce(m, t, ops[o], MX_ORDER, counts[ci]);
            }
        }
        if (!m->fatal && counts[ci] > 0)
            mx_async(m, counts[ci]);
    }
    if (!m->fatal)
        mx_allreduce(m, FL_DTYPE_I64, FL_REDOP_SUM, MX_EXACT, 70001);
    if (!m->fatal)
        mx_allreduce(m, FL_DTYPE_F64, FL_REDOP_AVG, MX_ORDER, 70001);
}

/* This rank's outputs of the allreduce rows, and of f64 avg over 70001 order-sensitive values,
 * hashed (no checks: allreduce_rows does them): for comparing two algorithms' bits. Returns
 * false on an error. */
static bool allreduce_bits(fl_comm *c, const size_t *counts, int ncounts, uint64_t *hash) {
    static const fl_redop ops[] = {FL_REDOP_SUM, FL_REDOP_AVG, FL_REDOP_MAX};
    mx_ctx m = {.c = c, .seed = 5, .rank = fl_comm_rank(c), .size = fl_comm_size(c)};
    *hash = 0;
    for (int ci = 0; ci <= ncounts; ci++) {
        size_t count = ci < ncounts ? counts[ci] : 70001;
        for (int d = 0; d < MX_NDTYPES; d++) {
            fl_dtype t = mx_dtypes[d];
            size_t es = fl_dtype_size(t);
            for (int o = 0; o < 3; o++) {
                for (int kind = MX_EXACT; kind <= MX_ORDER; kind++) {
                    if (kind == MX_ORDER && (!fl_dtype_is_float(t) || ops[o] == FL_REDOP_MAX))
                        continue;
                    if (ci == ncounts &&
                        (t != FL_DTYPE_F64 || ops[o] != FL_REDOP_AVG || kind != MX_ORDER))
                        continue;
                    m.case_id++;
                    void *buf = mx_alloc(count * es);
                    mx_gen g;
                    mx_gen_init(&g, t, kind);
                    mx_fill(&g, mx_key(&m, m.rank, 0), buf, count);
                    int rc = fl_comm_allreduce(c, buf, count, t, ops[o]);
                    *hash = mx_hash_bytes(*hash, buf, count * es);
                    free(buf);
                    if (rc < 0) {
                        fprintf(stderr, "rank %d: allreduce: %s\n", m.rank, fl_errmsg());
                        return false;
                    }
                }
            }
        }
    }
    return true;
}

enum { TUNE_DEFAULT = 0, TUNE_RING, TUNE_RD, TUNE_RH, TUNE_COUNT };
static const char *const tune_names[] = {"default", "ring+chain+pairwise, tiny segments",
                                         "recursive doubling+tree+Bruck", "Rabenseifner"};
#define TUNE_ALL ((1u << TUNE_COUNT) - 1)

typedef struct {
    int             rank, size;
    int            *fds; /* [size] */
    const size_t   *counts;
    int             ncounts;
    unsigned        tunings; /* bit k: run tuning k */
    long            failures;
    uint64_t        hash[TUNE_COUNT];
    pthread_barrier_t *bar;
} rank_arg;

/* fl_comm_iallreduce_gated: the gate runs on the comm thread after the earlier request is
 * complete and before the collective reads the buffer, which it fills here (as a device copy
 * landing would). */
typedef struct {
    fl_request *before; /* the request issued just before */
    float      *buf;
    size_t      n;
    int         rank;
    int         calls, early; /* gate calls; of which before `before` completed */
} gate_arg;

static void gate_fill(void *p) {
    gate_arg *g = p;
    g->calls++;
    if (!fl_request_test(g->before))
        g->early++;
    for (size_t i = 0; i < g->n; i++)
        g->buf[i] = (float)(g->rank + 1) * (float)(i + 1);
}

static long gated_allreduce(fl_comm *c, int rank, int size) {
    enum { N = 1001 };
    static _Thread_local float first[N], buf[N];
    long bad = 0;
    for (int i = 0; i < N; i++)
        first[i] = 1.0f, buf[i] = -1.0f;
    fl_request *r1, *r2;
    gate_arg g = {.buf = buf, .n = N, .rank = rank};
    if (fl_comm_iallreduce(c, first, N, FL_DTYPE_F32, FL_REDOP_SUM, &r1) < 0)
        return 1;
    g.before = r1;
    if (fl_comm_iallreduce_gated(c, buf, N, FL_DTYPE_F32, FL_REDOP_SUM, gate_fill, &g, &r2) < 0)
        return 1;
    int rc2 = fl_request_wait(r2), rc1 = fl_request_wait(r1);
    float ranks = (float)size * (float)(size + 1) / 2; /* sum of rank + 1 */
    for (int i = 0; i < N; i++)
        bad += buf[i] != ranks * (float)(i + 1) || first[i] != (float)size;
    bad += rc1 < 0 || rc2 < 0 || g.calls != 1 || g.early != 0;
    if (bad)
        fprintf(stderr, "rank %d of %d: gated allreduce: %ld wrong (gate called %d times, %d "
                "before the earlier request completed)\n", rank, size, bad, g.calls, g.early);
    return bad;
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    fl_comm *c = NULL;
    if (fl_comm_tcp_from_fds(a->rank, a->size, a->fds, 60, &c) < 0) {
        fprintf(stderr, "rank %d: fl_comm_tcp_from_fds: %s\n", a->rank, fl_errmsg());
        a->failures++;
        pthread_barrier_wait(a->bar);
        return NULL;
    }
    pthread_barrier_wait(a->bar);
    a->failures += gated_allreduce(c, a->rank, a->size);
    fl_tcp_tuning def;
    fl_comm_tcp_get_tuning(c, &def);
    for (int k = 0; k < TUNE_COUNT; k++) {
        if (!(a->tunings & (1u << k)))
            continue;
        fl_tcp_tuning tu = def;
        if (k == TUNE_RING) {
            tu.rd_max_bytes = 0;
            tu.rh_min_ranks = SIZE_MAX;
            tu.seg_max_bytes = 4000; /* not a multiple of any element size but 8 */
            tu.bcast_tree_max_bytes = 0;
            tu.bcast_chunk_bytes = 1000;
            tu.bruck_max_bytes = 0;
            tu.bruck_round_bytes = 0;
        } else if (k == TUNE_RD) {
            tu.rd_max_bytes = SIZE_MAX;
            tu.rh_min_ranks = SIZE_MAX;
            tu.bcast_tree_max_bytes = SIZE_MAX;
            tu.bruck_max_bytes = SIZE_MAX;
        } else if (k == TUNE_RH) { /* every allreduce, whatever the size and rank count */
            tu.rh_min_ranks = 1;
            tu.rh_min_bytes = 0;
            tu.rh_max_bytes = SIZE_MAX;
        }
        fl_comm_tcp_set_tuning(c, &tu);
        mx_ctx m = {.c = c, .seed = 3};
        if (k == TUNE_RH) {
            allreduce_rows(&m, a->counts, a->ncounts);
            /* rh.c combines every element in rd.c's order: every output (the order-sensitive
             * sums too) has recursive doubling's bits */
            uint64_t h_rh, h_rd;
            if (!m.fatal && !allreduce_bits(c, a->counts, a->ncounts, &h_rh)) {
                m.failures++;
                m.fatal = true;
            }
            if (!m.fatal) {
                tu.rd_max_bytes = SIZE_MAX;
                tu.rh_min_ranks = SIZE_MAX;
                fl_comm_tcp_set_tuning(c, &tu);
                if (!allreduce_bits(c, a->counts, a->ncounts, &h_rd)) {
                    m.failures++;
                    m.fatal = true;
                } else if (h_rd != h_rh) {
                    fprintf(stderr, "rank %d of %d: Rabenseifner's results differ from "
                            "recursive doubling's\n", a->rank, a->size);
                    m.failures++;
                }
            }
        } else {
            mx_run(&m, a->counts, a->ncounts);
        }
        if (m.failures && a->rank == 0)
            fprintf(stderr, "%d ranks, tuning %s: %ld failures\n", a->size, tune_names[k],
                    m.failures);
        a->failures += m.failures;
        a->hash[k] = m.hash;
        if (m.fatal)
            break;
    }
    { /* a backend without alltoall (nccl): comm.c runs its alltoallv instead */
        const struct fl_comm_ops *tcp = c->ops;
        struct fl_comm_ops without = *tcp;
        without.alltoall = NULL;
        c->ops = &without;
        mx_ctx m = {.c = c, .seed = 5, .rank = a->rank, .size = a->size, .max_reports = 20};
        for (int ci = 0; ci < a->ncounts && !m.fatal; ci++)
            for (int d = 0; d < MX_NDTYPES && !m.fatal; d++)
                mx_alltoall(&m, mx_dtypes[d], a->counts[ci], d % 2 == 0);
        if (m.failures && a->rank == 0)
            fprintf(stderr, "%d ranks, alltoall by alltoallv: %ld failures\n", a->size,
                    m.failures);
        a->failures += m.failures;
        c->ops = tcp;
    }
    fl_comm_free(c);
    return NULL;
}

static void run_ranks(int n, const size_t *counts, int ncounts, unsigned tunings,
                      uint64_t *hash) {
    int *fds = socket_mesh(n, 0);
    rank_arg args[8];
    pthread_t th[8];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    for (int r = 0; r < n; r++) {
        args[r] = (rank_arg){.rank = r, .size = n, .fds = fds + r * n, .counts = counts,
                             .ncounts = ncounts, .tunings = tunings, .bar = &bar};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    long failures = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        failures += args[r].failures;
    }
    pthread_barrier_destroy(&bar);
    if (failures) {
        fprintf(stderr, "%d ranks: %ld failures\n", n, failures);
        test_failures++;
    }
    for (int k = 0; k < TUNE_COUNT; k++)
        hash[k] = args[0].hash[k];
    free(fds);
}

/* --- a peer that leaves --- */

/* The collective that meets the missing peer first: each algorithm must give up cleanly. */
enum { FIRST_ALLREDUCE = 0, FIRST_ALLGATHER, FIRST_ALLGATHERV, FIRST_ALLTOALL, FIRST_COUNT };
static const char *const first_names[] = {"allreduce", "allgather", "allgatherv", "alltoall"};

typedef struct {
    int   rank, first;
    int  *fds;
    int   rc1, rc2, rc3;
    char  msg1[512], msg2[512];
    pthread_barrier_t *bar;
} leave_arg;

static void *leave_main(void *p) {
    leave_arg *a = p;
    fl_comm *c = NULL;
    if (fl_comm_tcp_from_fds(a->rank, 3, a->fds, 20, &c) < 0) {
        a->rc1 = 1;
        pthread_barrier_wait(a->bar);
        return NULL;
    }
    pthread_barrier_wait(a->bar);
    if (a->rank == 2) { /* leaves without a word of warning */
        fl_comm_free(c);
        return NULL;
    }
    float buf[100] = {0}, out[300] = {0};
    size_t counts[3] = {7, 0, 50};
    switch (a->first) { /* small: recursive doubling and Bruck */
    case FIRST_ALLREDUCE:
        a->rc1 = fl_comm_allreduce(c, buf, 100, FL_DTYPE_F32, FL_REDOP_SUM);
        break;
    case FIRST_ALLGATHER: a->rc1 = fl_comm_allgather(c, buf, out, 100, FL_DTYPE_F32); break;
    case FIRST_ALLGATHERV: a->rc1 = fl_comm_allgatherv(c, buf, out, counts, FL_DTYPE_F32); break;
    default: a->rc1 = fl_comm_alltoall(c, out, out + 150, 50, FL_DTYPE_F32); break;
    }
    snprintf(a->msg1, sizeof a->msg1, "%s", fl_errmsg());
    a->rc2 = fl_comm_barrier(c);
    snprintf(a->msg2, sizeof a->msg2, "%s", fl_errmsg());
    fl_request *r = NULL;
    a->rc3 = fl_comm_iallreduce(c, buf, 100, FL_DTYPE_F32, FL_REDOP_SUM, &r);
    fl_request_wait(r);
    fl_comm_free(c);
    return NULL;
}

static void test_peer_leaves(int first) {
    int *fds = socket_mesh(3, 0);
    leave_arg args[3];
    pthread_t th[3];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 3);
    for (int r = 0; r < 3; r++) {
        args[r] = (leave_arg){.rank = r, .first = first, .fds = fds + r * 3, .bar = &bar};
        pthread_create(&th[r], NULL, leave_main, &args[r]);
    }
    for (int r = 0; r < 3; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < 2; r++) {
        leave_arg *a = &args[r];
        CHECK(a->rc1 == FL_EPEER || a->rc1 == FL_ETIMEOUT);
        CHECK(a->rc2 == a->rc1 && a->rc3 == a->rc1);
        CHECK(strcmp(a->msg1, a->msg2) == 0);
        CHECK(strstr(a->msg1, first_names[first]) != NULL);
        fprintf(stderr, "rank %d after its peer left: %s\n", r, a->msg1);
    }
    free(fds);
}

int main(void) {
    test_reduce_kernels();
    test_single_rank();
    test_allreduce_choice();

    /* Ranks wait for data asleep in poll: with more ranks than cores, the transport's default
     * busy-poll before sleeping (FLEET_COMM_SPIN_US) took more CPU than the whole matrix. The
     * repeated run of 3 ranks spins as by default, and must give the same bits. */
    setenv("FLEET_COMM_SPIN_US", "0", 1);
    static const size_t counts[] = {0, 1, 7, 1000, 20011};
    for (int n = 1; n <= 8; n++) {
        uint64_t h1[TUNE_COUNT] = {0}, h2[TUNE_COUNT] = {0};
        /* beyond 5 ranks only Rabenseifner's: 6 and 7 fold 2 and 3 pairs, 8 halves 3 times */
        unsigned tunings = n <= 5 ? TUNE_ALL : 1u << TUNE_RH;
        double t0 = fl_now();
        run_ranks(n, counts, 5, tunings, h1);
        fprintf(stderr, "%d ranks: matrix x %d tunings in %.2f s\n", n, n <= 5 ? TUNE_COUNT : 1,
                fl_now() - t0);
        if (n == 3) { /* repeated runs give the same bits, spinning or not */
            unsetenv("FLEET_COMM_SPIN_US");
            run_ranks(n, counts, 5, tunings, h2);
            setenv("FLEET_COMM_SPIN_US", "0", 1);
            CHECK(memcmp(h1, h2, sizeof h1) == 0);
        }
    }
    /* 6..8 ranks, small counts: Bruck's last round moves 2, 3 and 4 of the 4 blocks held */
    static const size_t small[] = {0, 1, 7, 33};
    for (int n = 6; n <= 8; n++) {
        uint64_t h[TUNE_COUNT];
        double t0 = fl_now();
        run_ranks(n, small, 4, TUNE_ALL & ~(1u << TUNE_RH), h); /* RH: the loop above */
        fprintf(stderr, "%d ranks: small counts x %d tunings in %.2f s\n", n, TUNE_COUNT - 1,
                fl_now() - t0);
    }
    for (int first = 0; first < FIRST_COUNT; first++)
        test_peer_leaves(first);
    TEST_DONE();
}
