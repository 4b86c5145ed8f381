/* test_nccl.c - backend nccl on one GPU with one rank (NCCL refuses two ranks on one GPU):
 * every collective, blocking and async, on host buffers (staged), device buffers (given to NCCL
 * as they are) and mixed, every reducible dtype and op, counts 0, 1, odd and 64 MiB, with 1 and
 * 2 communicators (FLEET_NCCL_COMM_NUM; FLEET_NCCL_SPLIT_MIN_BYTES=0 splits even small
 * allreduces over both). With one rank every result is known exactly: the input (avg of one
 * rank multiplies by 1/1, integers divide by 1), compared bit for bit. Also: a device buffer
 * the cuda backend is still writing in its stream is reduced after the write (the comm stream
 * waits on the compute stream); node groups (an NCCL node view, a tcp cross view). Built only with CUDA; skipped (77) without a GPU or NCCL. */
#include "test.h"

#include "comm/nccl_comm.h"

#include "fleet/backend.h"
#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

static const fl_dtype dtypes[] = {FL_DTYPE_F32, FL_DTYPE_F64, FL_DTYPE_F16, FL_DTYPE_BF16,
                                  FL_DTYPE_I32, FL_DTYPE_I64};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

/* n values of t, small integers (exact in every dtype, bf16 included), seeded */
static void pattern(void *p, fl_dtype t, size_t n, int seed) {
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 37u + (size_t)seed * 11u) % 201u) - 100;
        switch (t) {
        case FL_DTYPE_F32: ((float *)p)[i] = (float)v; break;
        case FL_DTYPE_F64: ((double *)p)[i] = v; break;
        case FL_DTYPE_F16: ((uint16_t *)p)[i] = fl_f32_to_f16((float)v); break;
        case FL_DTYPE_BF16: ((uint16_t *)p)[i] = fl_f32_to_bf16((float)v); break;
        case FL_DTYPE_I32: ((int32_t *)p)[i] = v; break;
        case FL_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)v * 1000000007LL; break;
        default: ((uint8_t *)p)[i] = (uint8_t)v; break;
        }
    }
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    FL_ASSERT(cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess);
    return p;
}
/* The test's own set-up runs on the legacy default stream, which the comm stream does not wait
 * for once the cuda backend is bound (it waits for the backend's compute stream: docs/nccl.md),
 * and cudaMemcpy from pageable memory and cudaMemset may return before the device has the
 * bytes: so each set-up ends with the device idle (without it the H200 run of 2026-11-27 saw
 * 0xa5 fill bytes land after NCCL's output). */
static void h2d(void *d, const void *h, size_t b) {
    if (b)
        FL_ASSERT(cudaMemcpy(d, h, b, cudaMemcpyHostToDevice) == cudaSuccess);
    FL_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
}
static void dset(void *d, int byte, size_t b) {
    FL_ASSERT(cudaMemset(d, byte, b ? b : 1) == cudaSuccess);
    FL_ASSERT(cudaDeviceSynchronize() == cudaSuccess);
}
static void d2h(void *h, const void *d, size_t b) {
    if (b)
        FL_ASSERT(cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static void check_bytes(const char *what, const void *got, const void *want, size_t b,
                        fl_dtype t, size_t n, int mode) {
    if (b && memcmp(got, want, b) != 0) {
        size_t i = 0;
        while (((const uint8_t *)got)[i] == ((const uint8_t *)want)[i])
            i++;
        fprintf(stderr, "%s: %s n=%zu %s buffers: first differing byte %zu\n", what,
                fl_dtype_name(t), n, mode == 0 ? "host" : mode == 1 ? "device" : "mixed", i);
        test_failures++;
    }
}

/* mode: 0 host, 1 device, 2 mixed (input on the host, output on the device) */
static void run_matrix(fl_comm *c, size_t n, int mode) {
    for (size_t k = 0; k < NDTYPES; k++) {
        fl_dtype t = dtypes[k];
        size_t es = fl_dtype_size(t), b = n * es;
        uint8_t *want = malloc(b + 1), *h = malloc(b + 1), *h2 = malloc(b + 1);
        FL_ASSERT(want && h && h2);
        pattern(want, t, n, (int)k);
        void *d = dev_alloc(b), *d2 = dev_alloc(b);
        /* allreduce: every op is the identity on one rank */
        for (int op = 0; op < FL_REDOP_COUNT; op++) {
            memcpy(h, want, b);
            if (mode == 0) {
                CHECK_OK(fl_comm_allreduce(c, h, n, t, (fl_redop)op));
            } else {
                h2d(d, want, b);
                CHECK_OK(fl_comm_allreduce(c, d, n, t, (fl_redop)op));
                d2h(h, d, b);
            }
            check_bytes(fl_redop_name((fl_redop)op), h, want, b, t, n, mode);
        }
        /* reduce_scatter, allgather (out of place and in place), allgatherv, alltoallv,
         * broadcast: copies on one rank */
        for (int which = 0; which < 6; which++) {
            const char *names[] = {"reduce_scatter", "allgather", "allgather in place",
                                   "allgatherv", "alltoallv", "broadcast"};
            memset(h2, 0xa5, b);
            const void *in = want;
            void *out = h2;
            if (mode >= 1) {
                h2d(d, want, b);
                in = mode == 1 ? d : (const void *)want;
                dset(d2, 0xa5, b);
                out = d2;
            }
            size_t counts[1] = {n};
            int rc = 0;
            switch (which) {
            case 0: rc = fl_comm_reduce_scatter(c, in, out, n, t, FL_REDOP_SUM); break;
            case 1: rc = fl_comm_allgather(c, in, out, n, t); break;
            case 2:
                if (mode == 0)
                    memcpy(h2, want, b);
                else
                    h2d(d2, want, b);
                rc = fl_comm_allgather(c, out, out, n, t);
                break;
            case 3: rc = fl_comm_allgatherv(c, in, out, counts, t); break;
            case 4: rc = fl_comm_alltoallv(c, in, counts, out, counts, t); break;
            case 5:
                if (mode == 0)
                    memcpy(h2, want, b);
                else
                    h2d(d2, want, b);
                rc = fl_comm_broadcast(c, out, n, t, 0);
                break;
            }
            CHECK_OK(rc);
            if (mode >= 1)
                d2h(h2, d2, b);
            check_bytes(names[which], h2, want, b, t, n, mode);
        }
        cudaFree(d);
        cudaFree(d2);
        free(want), free(h), free(h2);
    }
}

/* async requests in flight together complete in issue order with the right contents */
static void run_async(fl_comm *c) {
    enum { R = 6, N = 4099 };
    float *h[R];
    fl_request *req[R];
    for (int i = 0; i < R; i++) {
        h[i] = malloc(N * sizeof(float));
        pattern(h[i], FL_DTYPE_F32, N, i);
        CHECK_OK(fl_comm_iallreduce(c, h[i], N, FL_DTYPE_F32, FL_REDOP_SUM, &req[i]));
    }
    for (int i = 0; i < R; i++) {
        CHECK_OK(fl_request_wait(req[i]));
        float want[N];
        pattern(want, FL_DTYPE_F32, N, i);
        check_bytes("iallreduce", h[i], want, sizeof want, FL_DTYPE_F32, N, 0);
        free(h[i]);
    }
}

/* 64 MiB of f32, host and device, avg */
static void run_large(fl_comm *c) {
    size_t n = (size_t)16 << 20, b = n * sizeof(float);
    float *want = malloc(b), *h = malloc(b);
    FL_ASSERT(want && h);
    pattern(want, FL_DTYPE_F32, n, 7);
    memcpy(h, want, b);
    CHECK_OK(fl_comm_allreduce(c, h, n, FL_DTYPE_F32, FL_REDOP_AVG));
    check_bytes("allreduce 64 MiB", h, want, b, FL_DTYPE_F32, n, 0);
    void *d = dev_alloc(b);
    h2d(d, want, b);
    CHECK_OK(fl_comm_allreduce(c, d, n, FL_DTYPE_F32, FL_REDOP_AVG));
    CHECK_OK(fl_comm_broadcast(c, d, n, FL_DTYPE_F32, 0));
    d2h(h, d, b);
    check_bytes("allreduce + broadcast 64 MiB", h, want, b, FL_DTYPE_F32, n, 1);
    cudaFree(d);
    free(want), free(h);
}

/* The cuda backend fills a device buffer in its stream, asynchronously; the allreduce issued
 * right after must see the filled values (the comm stream waits for the compute stream). */
static void run_ordering(fl_comm *c, const fl_backend *G) {
    size_t n = (size_t)8 << 20;
    float *d = G->alloc(n * sizeof(float)), *h = malloc(n * sizeof(float));
    FL_ASSERT(d && h);
    for (int round = 0; round < 4; round++) {
        G->fill(FL_DTYPE_F32, d, (int64_t)n, 3.0 + round);
        CHECK_OK(fl_comm_allreduce(c, d, n, FL_DTYPE_F32, FL_REDOP_SUM));
        G->copy(h, d, n * sizeof(float), FL_COPY_D2H, NULL);
        G->stream_sync(NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += h[i] != (float)(3.0 + round);
        if (bad) {
            fprintf(stderr, "ordering: round %d: %zu of %zu values not the filled ones\n", round,
                    bad, n);
            test_failures++;
        }
    }
    G->free(d);
    free(h);
}

/* Node groups: the node view is NCCL again (ncclCommSplit), the cross view tcp over the
 * communicator's transport; with one rank both are views of one, and the hierarchical
 * allreduce (NCCL inside the node, tcp between nodes: hier_views.c) reduces to the node's.
 * Several nodes need several GPUs (docs/nccl.md names the runs). */
static void run_split(fl_comm *c) {
    fl_comm *node = NULL, *cross = NULL;
    CHECK_OK(fl_comm_split_nodes(c, 1, &node, &cross));
    if (!node || !cross)
        return;
    CHECK(strcmp(fl_comm_backend(node), "nccl") == 0);
    CHECK(strcmp(fl_comm_backend(cross), "tcp") == 0);
    CHECK(fl_comm_size(node) == 1 && fl_comm_size(cross) == 1);
    size_t sizes[] = {0, 1, 1001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (int mode = 0; mode < 3; mode++)
            run_matrix(node, sizes[s], mode);
        run_matrix(cross, sizes[s], 0); /* tcp: host memory only */
    }
    CHECK_OK(fl_comm_set_hierarchical(c, 1));
    for (int mode = 0; mode < 3; mode++)
        run_matrix(c, 1001, mode);
    CHECK_OK(fl_comm_set_hierarchical(c, 0));
}

static fl_comm *open_one(void) {
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.size = 1;
    env.timeout_s = 60;
    env.listen_fd = -1;
    env.gpu = -1;
    env.local_size = 1;
    env.nnodes = 1;
    snprintf(env.backend, sizeof env.backend, "nccl");
    fl_comm *c = NULL;
    CHECK_OK(fl_comm_init(&env, &c));
    return c;
}

int main(void) {
    fl_log_set_level(FL_LOG_WARN);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
        TEST_SKIP("no CUDA device");
    if (!fl_comm_nccl_available())
        TEST_SKIP("fleet was built without NCCL");
    const fl_backend *G = fl_backend_cuda();
    FL_ASSERT(G);
    if (G->device_bind(0) != FL_OK) {
        char why[600];
        snprintf(why, sizeof why, "no CUDA device (%s)", fl_errmsg());
        TEST_SKIP(why);
    }
    static const char *lanes[] = {"1", "2"};
    for (int l = 0; l < 2; l++) {
        setenv("FLEET_NCCL_COMM_NUM", lanes[l], 1);
        setenv("FLEET_NCCL_SPLIT_MIN_BYTES", l ? "0" : "1048576", 1);
        fl_comm *c = open_one();
        if (!c)
            break;
        CHECK(strcmp(fl_comm_backend(c), "nccl") == 0);
        CHECK(fl_comm_rank(c) == 0 && fl_comm_size(c) == 1);
        size_t sizes[] = {0, 1, 2, 3, 1001, 65537};
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int mode = 0; mode < 3; mode++)
                run_matrix(c, sizes[s], mode);
        CHECK_OK(fl_comm_barrier(c));
        run_async(c);
        run_large(c);
        run_ordering(c, G);
        run_split(c);
        fl_comm_stats stats;
        fl_comm_get_stats(c, &stats);
        CHECK(stats.ops > 0);
        fprintf(stderr, "  %s communicator(s): %llu collectives, %.3f s\n", lanes[l],
                (unsigned long long)stats.ops, stats.seconds);
        fl_comm_free(c);
    }
    unsetenv("FLEET_NCCL_COMM_NUM");
    unsetenv("FLEET_NCCL_SPLIT_MIN_BYTES");
    /* a bad communicator count is refused naming the variable */
    setenv("FLEET_NCCL_COMM_NUM", "9", 1);
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.size = 1;
    env.listen_fd = -1;
    env.gpu = -1;
    snprintf(env.backend, sizeof env.backend, "nccl");
    fl_comm *bad = NULL;
    CHECK_RC(fl_comm_init(&env, &bad), FL_EINVAL);
    CHECK_MSG("FLEET_NCCL_COMM_NUM=9");
    unsetenv("FLEET_NCCL_COMM_NUM");
    TEST_DONE();
}
