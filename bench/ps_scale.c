/* ps_scale.c - parameter-server tables at scale (issue 33, benchmark c): S server processes
 * (forked, 1 shard thread each) on loopback and one worker filling a sparse table of dim 8
 * with Adagrad and the life-cycle counters to N rows, then timing steps of 10^5 ids: a pull,
 * then a push with show and click counts. Prints the table's rows and bytes (STATS, summed
 * over the servers), the servers' resident memory (VmRSS), bytes a row, and per step the
 * median pull and push times and rows per second.
 *
 *     ps_scale <rows> [servers (2)] [steps (10)] [batch (100000)]
 *
 * Ids: row i is splitmix64(i) (a bijection), so the table holds exactly N distinct ids, spread
 * over the servers; a step draws its batch uniformly from [0, N), the coldest case for the
 * caches. Fill pulls create the rows (entry none) in batches of `batch` distinct ids. */
#include "bench_time.h"

#include "fleet/fleet.h"
#include "fleet/log.h"
#include "ps/ps_impl.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXS 8
#define DIM 8

static char eps[MAXS][FL_ENDPOINT_MAX];
static const char *sp[MAXS];

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static fl_ps_roles roles(int S, bool server, int i, int fd) {
    for (int s = 0; s < S; s++)
        sp[s] = eps[s];
    fl_ps_roles r = {.server = server, .index = i, .nservers = S, .nworkers = 1, .servers = sp,
                     .listen_fd = fd, .msg = {.world = S + 1, .timeout_s = 600}};
    snprintf(r.msg.token, sizeof r.msg.token, "ps-scale-token");
    return r;
}

static int serve(int S, int s, int fd) {
    fl_ps_roles r = roles(S, true, s, fd);
    fl_ps *ps = NULL;
    fl_ps_server_config c = {.threads = 1, .mode = FL_PS_ASYNC};
    int rc = fl_ps_create(&r, &ps);
    if (rc == 0)
        rc = fl_ps_init_server(ps, &c);
    if (rc == 0)
        rc = fl_ps_run_server(ps);
    if (rc < 0)
        fprintf(stderr, "ps_scale: server %d: %s\n", s, fl_errmsg());
    fl_ps_free(ps);
    return rc < 0 ? 1 : 0;
}

/* Resident kilobytes of process pid (VmRSS), -1 when unreadable. */
static long rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? (int64_t)atof(argv[1]) : 1000000;
    int S = argc > 2 ? atoi(argv[2]) : 2, steps = argc > 3 ? atoi(argv[3]) : 10;
    int64_t B = argc > 4 ? (int64_t)atof(argv[4]) : 100000;
    if (N < 1 || S < 1 || S > MAXS || steps < 1 || B < 1 || B > 10000000) {
        fprintf(stderr, "usage: ps_scale <rows> [servers 1..%d] [steps] [batch]\n", MAXS);
        return 2;
    }
    fl_log_set_level(FL_LOG_WARN);
    int fds[MAXS];
    pid_t pids[MAXS];
    for (int s = 0; s < S; s++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
            perror("ps_scale: listen");
            return 1;
        }
        fds[s] = fd;
        snprintf(eps[s], sizeof eps[s], "127.0.0.1:%d", ntohs(a.sin_port));
    }
    for (int s = 0; s < S; s++) {
        pids[s] = fork();
        if (pids[s] < 0) {
            perror("ps_scale: fork");
            return 1;
        }
        if (pids[s] == 0)
            _exit(serve(S, s, fds[s]));
    }
    for (int s = 0; s < S; s++)
        close(fds[s]);

    fl_ps_roles r = roles(S, false, 0, -1);
    fl_ps *ps = NULL;
    fl_ps_rule rule;
    fl_ps_rule_defaults(&rule, FL_PS_RULE_ADAGRAD);
    fl_ps_init_rule init = {FL_PS_INIT_UNIFORM, -0.01, 0.01, 1};
    uint64_t *ids = malloc((size_t)B * sizeof *ids);
    float *rows = malloc((size_t)B * DIM * sizeof *rows);
    float *shows = malloc((size_t)B * sizeof *shows), *clicks = malloc((size_t)B * sizeof *clicks);
    double *tpull = malloc((size_t)steps * sizeof *tpull), *tpush = malloc((size_t)steps * sizeof *tpush);
    int rc = ids && rows && shows && clicks && tpull && tpush ? 0 : FL_ENOMEM;
    if (rc == 0)
        rc = fl_ps_create(&r, &ps);
    if (rc == 0)
        rc = fl_ps_init_worker(ps, FL_PS_ASYNC);
    if (rc == 0)
        rc = fl_ps_sparse_init_opts(ps, 0, DIM, &rule, &init, NULL);
    double t0 = bench_wall_s();
    for (int64_t lo = 0; rc == 0 && lo < N; lo += B) {
        int64_t n = N - lo < B ? N - lo : B;
        for (int64_t k = 0; k < n; k++)
            ids[k] = mix64((uint64_t)(lo + k));
        rc = fl_ps_sparse_pull(ps, 0, ids, n, rows);
    }
    double fill = bench_wall_s() - t0;
    int64_t have = 0, bytes = 0;
    if (rc == 0)
        rc = fl_ps_sparse_stats(ps, 0, &have, &bytes);
    long rss = 0;
    for (int s = 0; s < S; s++)
        rss += rss_kb(pids[s]);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int64_t k = 0; k < B * DIM; k++)
        rows[k] = 1e-3f;
    for (int it = 0; rc == 0 && it < steps; it++) {
        for (int64_t k = 0; k < B; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids[k] = mix64(x % (uint64_t)N);
            shows[k] = 1;
            clicks[k] = (float)(x >> 63);
        }
        double a = bench_wall_s();
        rc = fl_ps_sparse_pull(ps, 0, ids, B, rows);
        double b = bench_wall_s();
        if (rc == 0)
            rc = fl_ps_sparse_push_counts(ps, 0, it, 0.01, ids, B, rows, shows, clicks);
        tpull[it] = b - a;
        tpush[it] = bench_wall_s() - b;
    }
    int64_t after = 0;
    if (rc == 0)
        rc = fl_ps_sparse_stats(ps, 0, &after, NULL);
    if (rc < 0)
        fprintf(stderr, "ps_scale: worker: %s\n", fl_errmsg());
    if (ps && ps->cli)
        fl_ps_stop_worker(ps);
    fl_ps_free(ps);
    int failed = rc < 0;
    for (int s = 0; s < S; s++) {
        int st;
        if (failed)
            kill(pids[s], SIGTERM);
        if (waitpid(pids[s], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    }
    if (failed)
        return 1;
    double mpull = bench_median(tpull, steps), mpush = bench_median(tpush, steps);
    printf("rows %" PRId64 " (stats %" PRId64 ", after steps %" PRId64 "), servers %d, fill %.1f s "
           "(%.2e rows/s)\n", N, have, after, S, fill, (double)N / fill);
    printf("bytes %" PRId64 " (%.1f a row), servers' VmRSS %.2f GiB (%.1f a row)\n", bytes,
           (double)bytes / (double)have, (double)rss / (1 << 20), (double)rss * 1024 / (double)have);
    printf("step of %" PRId64 " ids, median of %d: pull %.1f ms (%.2e rows/s), push %.1f ms "
           "(%.2e rows/s)\n", B, steps, 1e3 * mpull, (double)B / mpull, 1e3 * mpush,
           (double)B / mpush);
    free(ids);
    free(rows);
    free(shows);
    free(clicks);
    free(tpull);
    free(tpush);
    return 0;
}
