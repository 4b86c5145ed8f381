/* ps_server_bench.c - parameter-server throughput: one server with T shard threads on loopback
 * and W client threads pulling, then pushing, batches of distinct sparse ids (async mode, SGD:
 * every push applied on arrival). Prints rows pulled and pushed per second, in all and per
 * server thread, for each dim and T. Rows exist before timing (a warm-up pull creates them).
 *
 *     ps_server_bench [workers (4)] [rounds (20)] [batch (10000)]
 *
 * The clients run in the same process and share its cores with the server, as they would on
 * one machine; see bench/RESULTS.md "Parameter-server throughput". */
#include "bench_time.h"

#include "fleet/fleet.h"
#include "fleet/log.h"
#include "ps/ps_impl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAXW 64
#define SPACE 1000000 /* ids drawn from [0, SPACE) */

typedef struct {
    int  T, W, dim, rounds, batch;
    char ep[FL_ENDPOINT_MAX];
    int  fd;
    pthread_barrier_t bar;
    double t_pull, t_push;
    int  failed;
} bench;

typedef struct {
    bench *b;
    int    i;
} arg;

static fl_ps_roles roles(bench *b, bool server, int i, const char **sp) {
    sp[0] = b->ep;
    fl_ps_roles r = {.server = server, .index = i, .nservers = 1, .nworkers = b->W,
                     .servers = sp, .listen_fd = server ? b->fd : -1,
                     .msg = {.world = 1 + b->W, .timeout_s = 120}};
    snprintf(r.msg.token, sizeof r.msg.token, "bench-token");
    return r;
}

static void *server_main(void *p) {
    bench *b = p;
    const char *sp[1];
    fl_ps_roles r = roles(b, true, 0, sp);
    fl_ps *ps = NULL;
    fl_ps_server_config c = {.threads = b->T, .mode = FL_PS_ASYNC};
    if (fl_ps_create(&r, &ps) < 0 || fl_ps_init_server(ps, &c) < 0 || fl_ps_run_server(ps) < 0) {
        fprintf(stderr, "ps_server_bench: server: %s\n", fl_errmsg());
        b->failed = 1;
    }
    fl_ps_free(ps);
    return NULL;
}

static void *worker_main(void *p) {
    arg *a = p;
    bench *b = a->b;
    const char *sp[1];
    fl_ps_roles r = roles(b, false, a->i, sp);
    fl_ps *ps = NULL;
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_SGD);
    fl_ps_init_rule init = {FL_PS_INIT_UNIFORM, -0.01, 0.01, 1};
    size_t n = (size_t)b->batch;
    uint64_t *ids = malloc(n * sizeof *ids);
    float *rows = malloc(n * (size_t)b->dim * sizeof *rows);
    int rc = fl_ps_create(&r, &ps);
    if (rc == 0)
        rc = fl_ps_init_worker(ps, FL_PS_ASYNC);
    if (rc == 0)
        rc = fl_ps_sparse_init(ps, 0, b->dim, &rule, &init);
    /* warm-up: every id of the space exists before timing */
    for (int64_t lo = a->i * (int64_t)n; rc == 0 && lo < SPACE; lo += (int64_t)n * b->W) {
        for (size_t k = 0; k < n; k++)
            ids[k] = (uint64_t)((lo + (int64_t)k) % SPACE);
        rc = fl_ps_sparse_pull(ps, 0, ids, (int64_t)n, rows);
    }
    for (size_t k = 0; k < n * (size_t)b->dim; k++)
        rows[k] = 1e-3f;
    if (rc < 0) {
        fprintf(stderr, "ps_server_bench: worker %d: %s\n", a->i, fl_errmsg());
        b->failed = 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(a->i + 1);
    for (int phase = 0; phase < 2; phase++) {
        pthread_barrier_wait(&b->bar);
        double t0 = bench_wall_s();
        for (int it = 0; rc == 0 && it < b->rounds; it++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            uint64_t start = x % SPACE; /* a run of distinct ids */
            for (size_t k = 0; k < n; k++)
                ids[k] = (start + k) % SPACE;
            rc = phase == 0 ? fl_ps_sparse_pull(ps, 0, ids, (int64_t)n, rows)
                            : fl_ps_sparse_push(ps, 0, it, 0.01, ids, (int64_t)n, rows);
        }
        pthread_barrier_wait(&b->bar);
        if (a->i == 0)
            *(phase == 0 ? &b->t_pull : &b->t_push) = bench_wall_s() - t0;
    }
    if (rc < 0) {
        fprintf(stderr, "ps_server_bench: worker %d: %s\n", a->i, fl_errmsg());
        b->failed = 1;
    }
    if (ps && ps->cli)
        fl_ps_stop_worker(ps);
    fl_ps_free(ps);
    free(ids);
    free(rows);
    return NULL;
}

static int run(bench *b) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0 ||
        getsockname(s, (struct sockaddr *)&a, &len) < 0) {
        perror("ps_server_bench: listen");
        return -1;
    }
    b->fd = s;
    snprintf(b->ep, sizeof b->ep, "127.0.0.1:%d", ntohs(a.sin_port));
    pthread_barrier_init(&b->bar, NULL, (unsigned)b->W);
    pthread_t st, wt[MAXW];
    arg wa[MAXW];
    pthread_create(&st, NULL, server_main, b);
    for (int w = 0; w < b->W; w++) {
        wa[w] = (arg){b, w};
        pthread_create(&wt[w], NULL, worker_main, &wa[w]);
    }
    for (int w = 0; w < b->W; w++)
        pthread_join(wt[w], NULL);
    pthread_join(st, NULL);
    pthread_barrier_destroy(&b->bar);
    return b->failed ? -1 : 0;
}

int main(int argc, char **argv) {
    int W = argc > 1 ? atoi(argv[1]) : 4, rounds = argc > 2 ? atoi(argv[2]) : 20;
    int batch = argc > 3 ? atoi(argv[3]) : 10000;
    if (W < 1 || W > MAXW || rounds < 1 || batch < 1 || batch > SPACE) {
        fprintf(stderr, "usage: ps_server_bench [workers 1..%d] [rounds] [batch]\n", MAXW);
        return 2;
    }
    fl_log_set_level(FL_LOG_WARN);
    printf("ps_server_bench: 1 server, %d client threads, %d rounds of %d distinct ids each\n",
           W, rounds, batch);
    printf("%4s %8s %14s %14s %14s %14s\n", "dim", "threads", "pull rows/s", "per thread",
           "push rows/s", "per thread");
    const int dims[] = {8, 64}, threads[] = {1, 2, 4};
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 3; t++) {
            bench b = {.T = threads[t], .W = W, .dim = dims[d], .rounds = rounds,
                       .batch = batch};
            if (run(&b) < 0)
                return 1;
            double rows = (double)W * rounds * batch;
            printf("%4d %8d %14.0f %14.0f %14.0f %14.0f\n", b.dim, b.T, rows / b.t_pull,
                   rows / b.t_pull / b.T, rows / b.t_push, rows / b.t_push / b.T);
            fflush(stdout);
        }
    return 0;
}
