/* test_comm_nccl_open.c - opening backend nccl where it cannot run, with no GPU needed: a build
 * without NCCL says so (FL_EUNSUPPORTED naming the rank), a build with it on a machine without
 * a GPU says "backend nccl: rank R: no CUDA device (...)" at once, before any network traffic
 * (rank 1 of 2 with unreachable endpoints fails as fast as rank 0 of 1), and an unknown
 * backend's message lists nccl. On a machine with a GPU the one-rank communicator opens and
 * reduces (tests/unit/cuda/test_nccl.c runs the whole matrix there). */
#include "test.h"

#include "comm/nccl_comm.h"

#include "fleet/comm.h"
#include "fleet/log.h"
#include "fleet/status.h"

static fl_comm_env env_of(int rank, int size, char (*eps)[FL_ENDPOINT_MAX]) {
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.rank = rank;
    env.size = size;
    env.endpoints = eps;
    snprintf(env.token, sizeof env.token, "test-nccl-open");
    env.timeout_s = 5;
    env.listen_fd = -1;
    snprintf(env.backend, sizeof env.backend, "nccl");
    env.gpu = -1;
    env.local_rank = rank;
    env.local_size = size;
    env.nnodes = 1;
    return env;
}

/* Opening fails at once with the message for this build and machine; returns 1 when a GPU
 * made it succeed instead (then c was checked and freed). */
static int expect_refusal(const fl_comm_env *env) {
    fl_comm *c = NULL;
    double t0 = fl_now();
    int rc = fl_comm_init(env, &c);
    double dt = fl_now() - t0;
    char rank_s[32];
    snprintf(rank_s, sizeof rank_s, "rank %d", env->rank);
    if (rc == 0) {
        CHECK(fl_comm_nccl_available());
        CHECK(strcmp(fl_comm_backend(c), "nccl") == 0);
        float x[3] = {1, 2, 3};
        CHECK_OK(fl_comm_allreduce(c, x, 3, FL_DTYPE_F32, FL_REDOP_SUM));
        CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3);
        fl_comm_free(c);
        return 1;
    }
    CHECK(c == NULL);
    if (!fl_comm_nccl_available()) {
        CHECK_RC(rc, FL_EUNSUPPORTED);
        CHECK_MSG("backend nccl: ");
        CHECK_MSG("built without NCCL");
    } else {
        CHECK_RC(rc, FL_EIO);
        CHECK_MSG("backend nccl: ");
        CHECK_MSG("no CUDA device (cudaGetDeviceCount: ");
    }
    CHECK_MSG(rank_s);
    CHECK(dt < 2.0); /* no rendezvous was attempted: nothing to wait for */
    fprintf(stderr, "  rank %d of %d: %s\n", env->rank, env->size, fl_errmsg());
    return 0;
}

int main(void) {
    fl_log_set_level(FL_LOG_WARN);
    unsetenv("FLEET_NCCL_COMM_NUM");
    fl_comm_env one = env_of(0, 1, NULL);
    int gpu = expect_refusal(&one);
    if (!gpu) {
        /* rank 1 of 2: the endpoints lead nowhere, and the refusal comes before any connect */
        char eps[2][FL_ENDPOINT_MAX] = {"127.0.0.1:9", "127.0.0.1:9"};
        fl_comm_env two = env_of(1, 2, eps);
        CHECK(expect_refusal(&two) == 0);
        /* the environment's way: fl_comm_init_from_env with the override */
        unsetenv("PADDLE_TRAINER_ID");
        unsetenv("RANK");
        unsetenv("OMPI_COMM_WORLD_RANK");
        unsetenv("PMI_RANK");
        fl_comm *c = NULL;
        int rc = fl_comm_init_from_env("nccl", &c);
        CHECK(rc < 0 && c == NULL);
        CHECK_MSG("backend nccl: rank 0: ");
    }
    /* an unknown name lists every backend */
    fl_comm_env bad = env_of(0, 1, NULL);
    snprintf(bad.backend, sizeof bad.backend, "nickel");
    fl_comm *c = NULL;
    CHECK_RC(fl_comm_init(&bad, &c), FL_EINVAL);
    CHECK_MSG("want tcp, mpi or nccl");
    TEST_DONE();
}
