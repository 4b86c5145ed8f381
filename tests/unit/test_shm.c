/* test_shm.c - the shared-memory transport (src/comm/shm.c) with one forked process per rank
 * (2..7 ranks; shared memory between threads would hide what only processes show): raw
 * sendrecv patterns byte for byte around chunk and ring boundaries, the tcp backend's
 * allreduce over it against the exact reference, a SIGKILLed peer named by every survivor within a bounded time,
 * a silent peer (FL_ETIMEOUT), a peer that leaves or sends the wrong size, CPU left idle while
 * waiting, crowding decided by the group's CPUs (ranks bound to distinct CPUs are not crowded,
 * ranks bound to one are), and after every rank's fl_peers_free no segment left: the segment
 * is a memfd, so there is no name in /dev/shm to leak; each child checks that no memfd
 * mapping, memfd fd or pidfd of its own survives the free, and the parent that /dev/shm did
 * not change.
 *
 * The boot transport is fl_transport_from_fds over socketpairs (fl_transport_peers); the
 * allreduce is the tcp backend's: recursive doubling up to 256 KiB, ring.c's ring above.
 *
 * `test_shm --bench [-p NPROC] [-n ITERS] [-w WARMUP] [-r REPS] [--bind_to core|none] SIZE...`
 * times allreduce (f32 sum in place) over shared memory the way bench/mpi_allreduce.c times
 * MPI_Allreduce, and prints rows in its format (bench/shm_allreduce.sh runs the two side by
 * side); --bind_to core binds the forked ranks as fleetrun --bind_to core binds its workers. */
#define _GNU_SOURCE
#include "test.h"

#include "comm/algorithms.h"
#include "comm/comm_impl.h"
#include "comm/peers.h"
#include "comm/shm.h"
#include "comm/socket_mesh.h"
#include "comm/transport.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <dirent.h>
#include <malloc.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 7
#define KIB  ((size_t)1 << 10)
#define MIB  ((size_t)1 << 20)

/* ---------------------------------------------------------------- processes */

/* What a child reports back, in memory shared with the parent. */
typedef struct {
    int    rc;        /* the scenario's decisive call */
    int    fails;     /* checks failed in the child */
    int    opened;    /* fl_shm_open returned */
    int    finished;  /* the child got to the end */
    double t_fail;    /* CLOCK_MONOTONIC when rc came back */
    char   msg[512];  /* fl_errmsg() then */
} child_result;

typedef struct rank_ctx rank_ctx;
typedef void (*scenario_fn)(rank_ctx *);

struct rank_ctx {
    int           rank, n;
    fl_peers     *p;
    child_result *res;
    const void   *arg;
};

static child_result *results; /* [MAXN], MAP_SHARED */

/* While ranks_bound, rank r runs on rank_cpus[r] from before fl_shm_open on (set by the parent
 * before it forks). */
static bool      ranks_bound;
static cpu_set_t rank_cpus[MAXN];

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TCHECK(x, cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s\n", __FILE__, __LINE__,       \
                    (x)->rank, #cond);                                                      \
            (x)->res->fails++;                                                              \
        }                                                                                   \
    } while (0)

static void record(rank_ctx *x, int rc) {
    x->res->rc = rc;
    x->res->t_fail = mono_s();
    snprintf(x->res->msg, sizeof x->res->msg, "%s", rc < 0 ? fl_errmsg() : "");
    if (rc < 0 && getenv("TEST_VERBOSE"))
        fprintf(stderr, "rank %d: %s\n", x->rank, x->res->msg);
}

/* Counts what this process still holds of a shared-memory transport: memfd mappings, memfd
 * descriptors and pidfds. All zero after fl_peers_free. */
static int shm_leftovers(void) {
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        found += strstr(line, "memfd:fleet-shm") != NULL;
    if (f)
        fclose(f);
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof target - 1);
        if (k <= 0)
            continue;
        target[k] = '\0';
        found += strstr(target, "memfd:") != NULL || strstr(target, "pidfd") != NULL;
    }
    if (d)
        closedir(d);
    return found;
}

static void child_main(int rank, int n, int *fds, double timeout, scenario_fn fn,
                       const void *arg) {
    child_result *res = &results[rank];
    rank_ctx x = {.rank = rank, .n = n, .res = res, .arg = arg};
    /* buffers up to 32 MiB freed stay in the heap for the next exchange, rather than being
     * unmapped and faulted in again (those page faults were a third of the exchanges' CPU) */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    if (ranks_bound && sched_setaffinity(0, sizeof rank_cpus[rank], &rank_cpus[rank]) < 0) {
        fprintf(stderr, "rank %d: sched_setaffinity: %s\n", rank, strerror(errno));
        _exit(1);
    }
    fl_transport *boot = NULL;
    if (fl_transport_from_fds(rank, n, fds, 10, NULL, &boot) < 0) {
        fprintf(stderr, "rank %d: from_fds: %s\n", rank, fl_errmsg());
        _exit(1);
    }
    int rc = fl_shm_open(fl_transport_peers(boot), timeout, NULL, &x.p);
    if (rc < 0) {
        fprintf(stderr, "rank %d: fl_shm_open: %s\n", rank, fl_errmsg());
        res->fails++;
        _exit(1);
    }
    TCHECK(&x, fl_peers_rank(x.p) == rank && fl_peers_size(x.p) == n);
    res->opened = 1;
    fl_transport_free(boot); /* boot is only needed during set-up */
    fn(&x);
    fl_peers_free(x.p);
    int left = shm_leftovers();
    if (left)
        fprintf(stderr, "rank %d: %d memfd mapping(s) or descriptor(s) left after free\n", rank,
                left);
    TCHECK(&x, left == 0);
    res->finished = 1;
    _exit(res->fails ? 1 : 0);
}

/* Forks n ranks joined by socketpairs and runs fn in each; kill_rank (>= 0) is SIGKILLed
 * kill_after_s after every rank opened its transport (*t_kill set). Children still running after max_s are killed
 * and count as a failure (a hang). Results in results[0 .. n). */
static void run_job(int n, scenario_fn fn, double timeout, const void *arg, int kill_rank,
                    double kill_after_s, double *t_kill, double max_s) {
    memset(results, 0, sizeof(child_result) * MAXN);
    int *fds = socket_mesh(n, SOCK_CLOEXEC); /* fds[i * n + j]: i's end towards j */
    fflush(NULL);
    pid_t pid[MAXN];
    double t0 = mono_s();
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            exit(1);
        }
        if (pid[r] == 0) {
            for (int i = 0; i < n * n; i++)
                if (i / n != r && fds[i] >= 0)
                    close(fds[i]);
            child_main(r, n, fds + r * n, timeout, fn, arg);
        }
    }
    for (int i = 0; i < n * n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    int left = n;
    bool killed = false, alive[MAXN];
    for (int r = 0; r < n; r++)
        alive[r] = true;
    double t_open = 0;
    while (left > 0) {
        double now = mono_s();
        int opened = 0;
        for (int r = 0; r < n; r++)
            opened += results[r].opened;
        if (opened == n && t_open == 0)
            t_open = now;
        if (kill_rank >= 0 && !killed && t_open > 0 && now - t_open >= kill_after_s) {
            kill(pid[kill_rank], SIGKILL);
            *t_kill = mono_s();
            killed = true;
        }
        if (now - t0 > max_s) {
            fprintf(stderr, "job of %d ranks still running after %g s: killing it\n", n, max_s);
            test_failures++;
            for (int r = 0; r < n; r++)
                if (alive[r])
                    kill(pid[r], SIGKILL);
        }
        for (int r = 0; r < n; r++) {
            int st;
            if (!alive[r] || waitpid(pid[r], &st, WNOHANG) != pid[r])
                continue;
            alive[r] = false;
            left--;
            bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
            if (r == kill_rank)
                ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
            if (!ok) {
                fprintf(stderr, "rank %d of %d: %s %d\n", r, n,
                        WIFEXITED(st) ? "exit status" : "signal",
                        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                test_failures++;
            }
        }
        usleep(2000);
    }
}

static void check_msg(int r, const char *needle) {
    if (!strstr(results[r].msg, needle)) {
        fprintf(stderr, "rank %d: message \"%s\" lacks \"%s\"\n", r, results[r].msg, needle);
        test_failures++;
    }
}

/* ---------------------------------------------------------------- raw exchanges */

static uint8_t pattern(int rank, size_t i, int salt) {
    return (uint8_t)(rank * 131 + (int)(i * 7) + (int)(i >> 9) + salt * 17);
}

/* Within each 512-byte block pattern steps by 7 from pattern(rank, block start, salt): row v of
 * pattern_rows is such a block starting at v, so that the messages are made and checked with
 * memcpy and memcmp (main fills the rows, and checks them against pattern). */
static uint8_t pattern_rows[256][512];

static void fill_rows(void) {
    for (int v = 0; v < 256; v++)
        for (int j = 0; j < 512; j++)
            pattern_rows[v][j] = (uint8_t)(v + 7 * j);
}

/* The stretch of row (rank, salt) under bytes i .. of a block: how many, and where. */
static const uint8_t *pattern_at(int rank, size_t i, size_t end, int salt, size_t *len) {
    size_t b0 = i & ~(size_t)511;
    *len = (b0 + 512 < end ? b0 + 512 : end) - i;
    return pattern_rows[pattern(rank, b0, salt)] + (i - b0);
}

/* pattern(rank, i, salt) for i = 0 .. n-1 into dst. */
static void fill_pattern(uint8_t *dst, size_t n, int rank, int salt) {
    for (size_t i = 0, len = 0; i < n; i += len) {
        const uint8_t *src = pattern_at(rank, i, n, salt, &len);
        memcpy(dst + i, src, len);
    }
}

/* The first of buf's n bytes that differs from pattern(rank, i, salt), or n. */
static size_t first_bad(const uint8_t *buf, size_t n, int rank, int salt) {
    for (size_t i = 0, len = 0; i < n; i += len) {
        const uint8_t *want = pattern_at(rank, i, n, salt, &len);
        if (memcmp(buf + i, want, len) != 0)
            for (size_t k = 0;; k++)
                if (buf[i + k] != want[k])
                    return i + k;
    }
    return n;
}

typedef struct {
    size_t next, total, calls;
    int    bad;
} order_ctx;

static void on_chunk(void *p, size_t off, size_t len) {
    order_ctx *o = p;
    if (off != o->next || len == 0 || off + len > o->total)
        o->bad++;
    o->next = off + len;
    o->calls++;
}

/* Sends sn pattern bytes to `to`, receives rn from `from` and checks them and on_recv's order. */
static int exchange(rank_ctx *x, int to, size_t sn, int from, size_t rn, int salt) {
    uint8_t *s = malloc(sn + 1), *r = malloc(rn + 1);
    fill_pattern(s, sn, x->rank, salt);
    memset(r, 0xee, rn + 1);
    order_ctx o = {.total = rn};
    int rc = fl_peers_sendrecv(x->p, to, s, sn, from, r, rn, on_chunk, &o);
    if (rc == 0) {
        TCHECK(x, o.bad == 0 && o.next == (from >= 0 ? rn : 0));
        TCHECK(x, r[rn] == 0xee); /* nothing written past the end */
        if (from >= 0) {
            size_t bad = first_bad(r, rn, from, salt);
            if (bad != rn)
                fprintf(stderr, "rank %d: byte %zu of %zu from rank %d differs (salt %d)\n",
                        x->rank, bad, rn, from, salt);
            TCHECK(x, bad == rn);
        }
    } else {
        record(x, rc);
    }
    free(s);
    free(r);
    return rc;
}

/* Sizes around the message header, the 64 KiB chunk and the ring, in a sequence that walks the
 * ring's wrap-around through many offsets. */
static size_t sizes_for(const fl_peers *p, size_t *out) {
    size_t ring = fl_shm_ring_bytes(p), chunk = 64 * KIB, k = 0;
    const size_t fixed[] = {0, 1, 7, 63, 64, 65, 4095, 4096, 4097};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        out[k++] = fixed[i];
    for (int d = -1; d <= 1; d++) {
        out[k++] = chunk + (size_t)d;
        out[k++] = 3 * chunk + (size_t)d;
        out[k++] = ring - 64 + (size_t)d;
        out[k++] = ring + (size_t)d;
        out[k++] = 2 * ring + (size_t)d;
    }
    out[k++] = 3 * MIB + 5;
    return k;
}

static void sc_exchanges(rank_ctx *x) {
    int n = x->n, r = x->rank;
    size_t sizes[32];
    size_t ns = sizes_for(x->p, sizes);
    int salt = 0;
    /* every shift s: send to r+s, receive from r-s (s = n/2 with n even: to == from) */
    for (int s = 1; s < n; s++)
        for (size_t k = 0; k < ns; k++)
            TCHECK(x, exchange(x, (r + s) % n, sizes[k], (r + n - s) % n, sizes[k], salt++) == 0);
    /* pairs swapping with to == from: 0<->1, 2<->3, ...; an odd rank out sits it out */
    int mate = r ^ 1;
    for (size_t k = 0; k < ns; k++)
        if (mate < n)
            TCHECK(x, exchange(x, mate, sizes[k], mate, sizes[k], salt + (int)k) == 0);
    salt += (int)ns;
    /* one way only: rank 0 sends, rank 1 receives (-1 and 0-byte sides) */
    if (r == 0) {
        TCHECK(x, exchange(x, 1, 300001, -1, 0, salt) == 0);
        TCHECK(x, exchange(x, 1, 5, 1, 0, salt + 1) == 0);
    }
    if (r == 1) {
        TCHECK(x, exchange(x, -1, 0, 0, 300001, salt) == 0);
        TCHECK(x, exchange(x, 0, 0, 0, 5, salt + 1) == 0);
    }
    salt += 2;
    /* different sizes in the two directions */
    int right = (r + 1) % n, left = (r + n - 1) % n;
    TCHECK(x, exchange(x, right, 1000 + 4099 * (size_t)r, left, 1000 + 4099 * (size_t)left,
                       salt++) == 0);
    /* a burst: many small messages queued in the ring before the peer reads them */
    if (r == 0)
        for (int i = 0; i < 50; i++)
            TCHECK(x, exchange(x, 1, 100 + (size_t)i, -1, 0, 1000 + i) == 0);
    if (r == 1) {
        usleep(20 * 1000);
        for (int i = 0; i < 50; i++)
            TCHECK(x, exchange(x, -1, 0, 0, 100 + (size_t)i, 1000 + i) == 0);
    }
}

static void sc_big(rank_ctx *x) {
    int n = x->n, r = x->rank;
    TCHECK(x, exchange(x, (r + 1) % n, 64 * MIB, (r + n - 1) % n, 64 * MIB, 3) == 0);
    if (n == 2)
        TCHECK(x, exchange(x, 1 - r, 64 * MIB + 1, 1 - r, 64 * MIB + 1, 4) == 0);
}

/* Many messages of random sizes (the same sequence on both sides) through a small ring: message
 * ends land at every offset, with the ring as full as the reader leaves it. Rank 1 sometimes
 * dawdles so that rank 0's sends find the ring nearly full. */
static void sc_random(rank_ctx *x) {
    uint64_t seed = 88172645463325252ull;
    int peer = 1 - x->rank;
    for (int i = 0; i < 400; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        size_t len = 1 + (size_t)(seed % (3 * fl_shm_ring_bytes(x->p) / 2));
        if (x->rank == 1 && seed % 5 == 0)
            usleep(200);
        if (seed % 3 == 0) /* one way, so the sender runs ahead */
            TCHECK(x, exchange(x, x->rank == 0 ? 1 : -1, len, x->rank == 1 ? 0 : -1, len, i) == 0);
        else
            TCHECK(x, exchange(x, peer, len, peer, len, i) == 0);
    }
}

static void test_exchanges(void) {
    for (int n = 2; n <= MAXN; n++)
        run_job(n, sc_exchanges, 30, NULL, -1, 0, NULL, 120);
    for (int n = 2; n <= 3; n++)
        run_job(n, sc_big, 30, NULL, -1, 0, NULL, 120);
    /* no spinning at all: every wait sleeps on the futex */
    setenv("FLEET_COMM_SPIN_US", "0", 1);
    run_job(3, sc_exchanges, 30, NULL, -1, 0, NULL, 120);
    /* the smallest ring: messages larger than it stream through */
    setenv("FLEET_SHM_RING_KIB", "64", 1);
    run_job(4, sc_exchanges, 30, NULL, -1, 0, NULL, 120);
    run_job(2, sc_random, 30, NULL, -1, 0, NULL, 120);
    unsetenv("FLEET_SHM_RING_KIB");
    unsetenv("FLEET_COMM_SPIN_US");
}

/* ---------------------------------------------------------------- allreduce */

/* As the tcp backend picks (tcp.c's defaults): recursive doubling up to 256 KiB, else the ring
 * in segments of at most 1 MiB. (That every received chunk comes through on_recv, which the
 * ring's reduction relies on, exchange() checks for every size.) */
static int allreduce(fl_peers *p, fl_scratch *s, float *buf, size_t m) {
    if (m * 4 <= 256 * KIB)
        return fl_rd_allreduce(p, s, buf, m, FL_DTYPE_F32, FL_REDOP_SUM);
    return fl_ring_allreduce(p, s, MIB, buf, m, FL_DTYPE_F32, FL_REDOP_SUM);
}

/* Small integers: every sum is exact in f32, whatever the order. They depend on i only through
 * 7 i mod 1001, of period 143 (1001 = 7 x 143): VALUE_PERIOD. */
static float value(int rank, size_t i) { return (float)((int)((i * 7 + (size_t)rank * 13) % 1001) - 500); }
#define VALUE_PERIOD 143

static void sc_allreduce(rank_ctx *x) {
    int n = x->n, r = x->rank;
    const size_t counts[] = {0, 1, 7, (size_t)n * 1000 + 3, MIB / 4 + 1, 16 * MIB}; /* 64 MiB */
    /* this rank's values and the expected sums over ranks, over 64 periods: buffers are filled
     * with memcpy and checked with memcmp a run of them at a time */
    enum { RUN = 64 * VALUE_PERIOD };
    static float mine[RUN], want[RUN];
    for (size_t i = 0; i < RUN; i++) {
        float w = 0;
        for (int q = 0; q < n; q++)
            w += value(q, i);
        mine[i] = value(r, i);
        want[i] = w;
    }
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t m = counts[k];
        float *buf = malloc(m * 4 + 4);
        fl_scratch scratch = {0};
        for (size_t i = 0; i < m; i += RUN)
            memcpy(buf + i, mine, (m - i < RUN ? m - i : RUN) * 4);
        int rc = allreduce(x->p, &scratch, buf, m);
        TCHECK(x, rc == 0);
        if (rc < 0)
            record(x, rc);
        size_t bad = m;
        for (size_t i = 0; i < m && rc == 0 && bad == m; i += RUN) {
            size_t len = m - i < RUN ? m - i : RUN;
            if (memcmp(buf + i, want, len * 4) != 0)
                for (bad = i; memcmp(&buf[bad], &want[bad - i], 4) == 0; bad++)
                    ;
        }
        if (bad != m)
            fprintf(stderr, "rank %d of %d: allreduce of %zu: element %zu is %g\n", r, n, m,
                    bad, (double)buf[bad]);
        TCHECK(x, bad == m);
        free(buf);
        fl_scratch_free(&scratch);
    }
}

static void test_allreduce(void) {
    for (int n = 2; n <= MAXN; n++)
        run_job(n, sc_allreduce, 30, NULL, -1, 0, NULL, 120);
}

/* ---------------------------------------------------------------- failures */

/* Ranks exchange 1 MiB around the ring until something fails; the parent kills rank 1. */
static void sc_killed_busy(rank_ctx *x) {
    int n = x->n, r = x->rank, rc = 0;
    for (int i = 0; rc == 0 && i < 1000000; i++)
        rc = exchange(x, (r + 1) % n, MIB, (r + n - 1) % n, MIB, i & 7);
    if (rc == 0)
        record(x, 0);
    /* a failed transport stays failed with the same message */
    char first[512];
    snprintf(first, sizeof first, "%s", x->res->msg);
    uint8_t b = 0;
    TCHECK(x, fl_peers_sendrecv(x->p, (r + 1) % n, &b, 1, -1, NULL, 0, NULL, NULL) == rc);
    TCHECK(x, strcmp(fl_errmsg(), first) == 0);
}

/* Rank 1 never arrives (it is killed while the others sleep waiting for it). */
static void sc_killed_idle(rank_ctx *x) {
    int r = x->rank;
    if (r == 1)
        pause();
    /* rank 0 waits on rank 1; the others wait on rank 0 (a chain: they learn from the segment) */
    int rc = r == 0 ? exchange(x, -1, 0, 1, 10, 0) : exchange(x, -1, 0, r == 2 ? 0 : r - 1, 10, 0);
    record(x, rc);
}

static void test_killed(void) {
    const struct {
        int         n;
        scenario_fn fn;
        double      after;
    } cases[] = {{2, sc_killed_busy, 0.3}, {3, sc_killed_busy, 0.3}, {5, sc_killed_busy, 0.5},
                 {4, sc_killed_idle, 0.5}, {7, sc_killed_busy, 0.5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c].n;
        double t_kill = 0;
        /* a 60 s timeout: the culprit must be found from its pid, not by the timeout */
        run_job(n, cases[c].fn, 60, NULL, 1, cases[c].after, &t_kill, 30);
        for (int r = 0; r < n; r++) {
            if (r == 1)
                continue;
            CHECK(results[r].finished);
            CHECK(results[r].rc == FL_EPEER);
            check_msg(r, "rank 1 (pid ");
            check_msg(r, "died");
            double late = results[r].t_fail - t_kill;
            if (late > 2.0 || getenv("TEST_VERBOSE"))
                fprintf(stderr, "rank %d of %d noticed the kill after %.3f s\n", r, n, late);
            CHECK(late < 2.0); /* ~10 ms on an idle machine; loose for ctest -j */
        }
    }
}

/* Ring of 3 where rank 1 stays silent past the timeout, then tries. */
static void sc_silent(rank_ctx *x) {
    if (x->rank == 1) {
        usleep(2500 * 1000);
        record(x, exchange(x, 2, 7, 0, 7, 0));
        return;
    }
    double t0 = mono_s();
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) /* rank 0's first one completes */
        rc = exchange(x, (x->rank + 1) % 3, 7, (x->rank + 2) % 3, 7, i);
    record(x, rc);
    x->res->t_fail -= t0; /* here: how long it took */
}

/* Rank 1 frees its transport at once; rank 0 waits for its data. */
static void sc_leaves(rank_ctx *x) {
    if (x->rank == 1)
        return;
    usleep(50 * 1000);
    record(x, exchange(x, -1, 0, 1, 100, 0));
}

/* Rank 0 sends 100 bytes where rank 1 expects 200; rank 0 then learns from the segment. */
static void sc_mismatch(rank_ctx *x) {
    if (x->rank == 0) {
        TCHECK(x, exchange(x, 1, 100, -1, 0, 0) == 0);
        record(x, exchange(x, -1, 0, 1, 10, 1));
    } else {
        record(x, exchange(x, -1, 0, 0, 200, 0));
    }
}

/* Rank 0 waits 1 s for rank 1's message: it must sleep, not spin. */
static void sc_idle_cpu(rank_ctx *x) {
    if (x->rank == 1) {
        usleep(1000 * 1000);
        TCHECK(x, exchange(x, 0, 4096, -1, 0, 0) == 0);
        return;
    }
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    TCHECK(x, exchange(x, -1, 0, 1, 4096, 0) == 0);
    getrusage(RUSAGE_SELF, &b);
    double cpu = (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec + b.ru_stime.tv_sec -
                          a.ru_stime.tv_sec) +
                 1e-6 * (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec + b.ru_stime.tv_usec -
                                 a.ru_stime.tv_usec);
    if (cpu > 0.05)
        fprintf(stderr, "rank 0 used %.3f s of CPU waiting 1 s\n", cpu);
    TCHECK(x, cpu < 0.05);
}

/* Rank 2 learns of a failure elsewhere (an inter-node transport) and hands it to the segment
 * while ranks 0 and 1 wait on it. */
static void sc_abort(rank_ctx *x) {
    if (x->rank == 2) {
        usleep(100 * 1000);
        record(x, fl_shm_abort(x->p, FL_EPEER, "rank 9 (10.0.0.2:6170) closed the connection"));
        return;
    }
    record(x, exchange(x, -1, 0, x->rank == 0 ? 2 : 0, 10, 0));
}

/* Rank 1 waits elsewhere (fl_shm_hold) longer than the timeout, then fails there: rank 0, which
 * waits on it, gives it grace and reports rank 1's culprit, not rank 1. */
static void sc_hold(rank_ctx *x) {
    if (x->rank == 1) {
        fl_shm_hold(x->p, 1);
        usleep(2200 * 1000);
        record(x, fl_shm_abort(x->p, FL_ETIMEOUT, "no data from rank 5 (10.0.0.3:6170) for 2 s"));
        fl_shm_hold(x->p, 0);
        return;
    }
    record(x, exchange(x, -1, 0, 1, 10, 0));
}

static void test_failures_named(void) {
    run_job(2, sc_hold, 2, NULL, -1, 0, NULL, 30); /* rank 0 waits 2 s + 1 s of grace */
    for (int r = 0; r < 2; r++) {
        CHECK(results[r].rc == FL_ETIMEOUT);
        check_msg(r, "no data from rank 5 (10.0.0.3:6170)");
    }

    run_job(3, sc_abort, 10, NULL, -1, 0, NULL, 30);
    for (int r = 0; r < 3; r++) {
        CHECK(results[r].rc == FL_EPEER);
        check_msg(r, "rank 9 (10.0.0.2:6170) closed the connection");
    }
    check_msg(0, "(reported by rank 2)");
    check_msg(1, "(reported by rank 2)");

    run_job(3, sc_silent, 1, NULL, -1, 0, NULL, 30);
    for (int r = 0; r < 3; r++) {
        CHECK(results[r].rc == FL_ETIMEOUT);
        check_msg(r, "no data from rank 1 (pid ");
    }
    /* one culprit: rank 2 noticed first; the others say it reported it */
    CHECK(strcmp(results[0].msg, results[1].msg) == 0);
    CHECK(strncmp(results[0].msg, results[2].msg, strlen(results[2].msg)) == 0);
    check_msg(0, "(reported by rank 2)");
    for (int r = 0; r <= 2; r += 2) { /* the timeout, not forever (loose: ctest -j) */
        CHECK(results[r].t_fail >= 0.95);
        CHECK(results[r].t_fail < 3.0);
    }

    run_job(2, sc_leaves, 10, NULL, -1, 0, NULL, 30);
    CHECK(results[0].rc == FL_EPEER);
    check_msg(0, "rank 1 (pid ");
    check_msg(0, "closed the connection");

    run_job(2, sc_mismatch, 10, NULL, -1, 0, NULL, 30);
    for (int r = 0; r < 2; r++) {
        CHECK(results[r].rc == FL_EPEER);
        check_msg(r, "rank 0 (pid ");
        check_msg(r, "sent 100 bytes where 200 were expected");
    }
    check_msg(0, "(reported by rank 1)");

    run_job(2, sc_idle_cpu, 10, NULL, -1, 0, NULL, 30);
}

/* ---------------------------------------------------------------- crowded */

/* The CPUs this process may run on, in increasing order, into cpus (at most cap); how many. */
static int own_cpus(int *cpus, int cap) {
    cpu_set_t set;
    int k = 0;
    if (sched_getaffinity(0, sizeof set, &set) < 0)
        return 0;
    for (int c = 0; c < CPU_SETSIZE && k < cap; c++)
        if (CPU_ISSET(c, &set))
            cpus[k++] = c;
    return k;
}

/* The group's crowding, and a round trip that works either way (arg: the expected crowding). */
static void sc_crowded(rank_ctx *x) {
    bool want = *(const bool *)x->arg, got = fl_shm_crowded(x->p);
    if (got != want)
        fprintf(stderr, "rank %d of %d: crowded %d, want %d\n", x->rank, x->n, got, want);
    TCHECK(x, got == want);
    TCHECK(x, exchange(x, (x->rank + 1) % x->n, 4096, (x->rank + x->n - 1) % x->n, 4096, 0) == 0);
}

/* n ranks, rank r bound to the CPUs cpus[i] for each bit i of pick[r] (pick NULL: unbound). */
static void crowded_case(int n, const unsigned *pick, const int *cpus, bool want) {
    ranks_bound = pick != NULL;
    for (int r = 0; pick && r < n; r++) {
        CPU_ZERO(&rank_cpus[r]);
        for (int i = 0; i < 2; i++)
            if (pick[r] >> i & 1)
                CPU_SET(cpus[i], &rank_cpus[r]);
    }
    run_job(n, sc_crowded, 10, &want, -1, 0, NULL, 60);
    ranks_bound = false;
}

/* Whether spinning must yield is the group's: more ranks than CPUs in the union of their
 * affinity masks. Bound one to a CPU each, every rank sees a single CPU of its own, yet the two
 * are not crowded; bound to one CPU together they are. */
static void test_crowded(void) {
    int cpus[MAXN + 1];
    int ncpu = own_cpus(cpus, MAXN + 1);
    CHECK(ncpu >= 1);
    if (ncpu < 1)
        return;
    crowded_case(2, (const unsigned[]){1, 1}, cpus, true); /* both on one CPU */
    /* unbound: every rank may use the CPUs this process may use */
    crowded_case(2, NULL, cpus, ncpu < 2);
    crowded_case(4, NULL, cpus, ncpu < 4);
    if (ncpu < 2) {
        fprintf(stderr, "test_shm: skipped: ranks on distinct CPUs (this process may run on "
                        "one CPU only)\n");
        return;
    }
    crowded_case(2, (const unsigned[]){1, 2}, cpus, false); /* one CPU each, distinct */
    crowded_case(2, (const unsigned[]){1, 3}, cpus, false); /* the union counts, not one's own */
    crowded_case(3, (const unsigned[]){1, 2, 1}, cpus, true); /* 3 ranks on 2 CPUs */
}

/* ---------------------------------------------------------------- odds and ends */

static void test_single_rank(void) {
    fl_transport *boot = NULL;
    int fd = -1;
    CHECK_OK(fl_transport_from_fds(0, 1, &fd, 1, NULL, &boot));
    fl_peers *p = NULL;
    CHECK_OK(fl_shm_open(fl_transport_peers(boot), 1, NULL, &p));
    if (p) {
        CHECK(fl_peers_rank(p) == 0 && fl_peers_size(p) == 1);
        CHECK_OK(fl_peers_sendrecv(p, -1, NULL, 0, -1, NULL, 0, NULL, NULL));
        CHECK(strstr(fl_peers_name(p, 0), "rank 0") != NULL);
    }
    fl_peers_free(p);
    fl_peers_free(NULL);
    fl_transport_free(boot);
}

/* Entries of /dev/shm that could be fleet's (other programs, mpirun's for one, come and go). */
static int fleet_dev_shm(void) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, "fleet")) {
            fprintf(stderr, "/dev/shm/%s\n", e->d_name);
            n++;
        }
    if (d)
        closedir(d);
    return n;
}

/* ---------------------------------------------------------------- benchmark */

typedef struct {
    int    iters, warmup, reps, nsizes;
    size_t sizes[16];
} bench_args;

static double *bench_times; /* [MAXN], MAP_SHARED: each rank's time of the last repetition */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void sc_bench(rank_ctx *x) {
    const bench_args *a = x->arg;
    int n = x->n;
    double *rep = calloc((size_t)a->reps, sizeof *rep);
    if (x->rank == 0) {
        printf("# test_shm --bench: allreduce f32 sum in place over shared memory, %d ranks, "
               "iters %d, warmup %d, reps %d, ring %zu KiB\n", n, a->iters, a->warmup, a->reps,
               fl_shm_ring_bytes(x->p) >> 10);
        printf("# %10s %7s %12s %10s %10s\n", "bytes", "iters", "time_us", "algbw_GBps",
               "busbw_GBps");
        fflush(stdout);
    }
    for (int k = 0; k < a->nsizes; k++) {
        size_t m = a->sizes[k] / 4, bytes = m * 4;
        float *buf = calloc(m, 4);
        fl_scratch scratch = {0};
        int rc = 0;
        for (int i = 0; i < a->warmup && rc == 0; i++)
            rc = allreduce(x->p, &scratch, buf, m);
        for (int rr = 0; rr < a->reps && rc == 0; rr++) {
            rc = fl_rd_barrier(x->p);
            double t0 = mono_s();
            for (int i = 0; i < a->iters && rc == 0; i++)
                rc = allreduce(x->p, &scratch, buf, m);
            bench_times[x->rank] = (mono_s() - t0) / a->iters;
            if (rc == 0)
                rc = fl_rd_barrier(x->p);
            double worst = 0;
            for (int q = 0; q < n; q++)
                worst = bench_times[q] > worst ? bench_times[q] : worst;
            rep[rr] = worst;
            if (rc == 0)
                rc = fl_rd_barrier(x->p); /* nobody overwrites bench_times before all have read */
        }
        if (rc < 0) {
            fprintf(stderr, "rank %d: %s\n", x->rank, fl_errmsg());
            x->res->fails++;
            break;
        }
        qsort(rep, (size_t)a->reps, sizeof *rep, cmp_double);
        double t = rep[(a->reps - 1) / 2], algbw = (double)bytes / t / 1e9;
        if (x->rank == 0) {
            printf("  %10zu %7d %12.2f %10.3f %10.3f\n", bytes, a->iters, t * 1e6, algbw,
                   algbw * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
        free(buf);
        fl_scratch_free(&scratch);
    }
    free(rep);
}

/* fleetrun --bind_to core's rule (tools/fleetrun/bind.c), for ranks forked here where fleetrun
 * cannot reach them: the CPUs this process may run on, in order, cut into n contiguous sets of
 * equal size, the first ones taking one more each while n does not divide them; rank r gets set
 * r. Prints the sets; false (told) when there are fewer CPUs than ranks. */
static bool bind_like_fleetrun(int n) {
    static int cpus[CPU_SETSIZE];
    int ncpu = own_cpus(cpus, CPU_SETSIZE);
    if (ncpu < n) {
        fprintf(stderr, "test_shm --bench: --bind_to core: %d ranks but this process may run on "
                "%d CPU(s)\n", n, ncpu);
        return false;
    }
    printf("# ranks bound as by fleetrun --bind_to core:");
    for (int r = 0, next = 0; r < n; r++) {
        int size = ncpu / n + (r < ncpu % n);
        CPU_ZERO(&rank_cpus[r]);
        printf("%s rank %d on CPU", r ? "," : "", r);
        for (int i = 0; i < size; i++) {
            printf("%s%d", i ? "," : " ", cpus[next]);
            CPU_SET(cpus[next++], &rank_cpus[r]);
        }
    }
    printf("\n");
    ranks_bound = true;
    return true;
}

static int bench_main(int argc, char **argv) {
    bench_args a = {.iters = 20, .warmup = 5, .reps = 1};
    int nproc = 2;
    const char *bind = "none";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--bind_to") && i + 1 < argc) {
            bind = argv[++i];
            continue;
        }
        int *opt = !strcmp(argv[i], "-n")   ? &a.iters
                   : !strcmp(argv[i], "-w") ? &a.warmup
                   : !strcmp(argv[i], "-r") ? &a.reps
                   : !strcmp(argv[i], "-p") ? &nproc
                                            : NULL;
        char *end;
        if (opt && i + 1 < argc) {
            *opt = atoi(argv[++i]);
            continue;
        }
        unsigned long long v = strtoull(argv[i], &end, 10);
        if (*end == 'K' || *end == 'k')
            v <<= 10, end++;
        else if (*end == 'M' || *end == 'm')
            v <<= 20, end++;
        if (opt || *end || v < 4 || a.nsizes == 16) {
            fprintf(stderr, "usage: test_shm --bench [-p NPROC] [-n ITERS] [-w WARMUP] "
                    "[-r REPS] [--bind_to core|none] SIZE...\n");
            return 2;
        }
        a.sizes[a.nsizes++] = (size_t)v;
    }
    if (a.nsizes == 0 || nproc < 2 || nproc > MAXN || a.iters < 1 || a.reps < 1 || a.warmup < 0) {
        fprintf(stderr, "test_shm --bench: give sizes; 2 <= NPROC <= %d\n", MAXN);
        return 2;
    }
    if (strcmp(bind, "core") && strcmp(bind, "none")) {
        fprintf(stderr, "test_shm --bench: --bind_to '%s' is not core or none\n", bind);
        return 2;
    }
    if (!strcmp(bind, "core") && !bind_like_fleetrun(nproc))
        return 2;
    bench_times = mmap(NULL, MAXN * sizeof(double), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    run_job(nproc, sc_bench, 60, &a, -1, 0, NULL, 3600);
    return test_failures ? 1 : 0;
}

int main(int argc, char **argv) {
    results = mmap(NULL, MAXN * sizeof(child_result), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        return bench_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    /* the fast forms of the inputs are what they stand for */
    fill_rows();
    static uint8_t pat[3000];
    fill_pattern(pat, sizeof pat, 5, 9);
    for (size_t i = 0; i < sizeof pat; i++)
        CHECK(pat[i] == pattern(5, i, 9));
    CHECK(first_bad(pat, sizeof pat, 5, 9) == sizeof pat);
    pat[2222] ^= 1;
    CHECK(first_bad(pat, sizeof pat, 5, 9) == 2222);
    for (int q = 0; q < MAXN; q++)
        for (size_t i = 0; i < 3 * VALUE_PERIOD; i++)
            CHECK(value(q, i) == value(q, i % VALUE_PERIOD));
    int shm_before = fleet_dev_shm();
    test_single_rank();
    test_exchanges();
    test_allreduce();
    test_killed();
    test_failures_named();
    test_crowded();
    CHECK(fleet_dev_shm() == shm_before); /* memfd: there is never a name to leak */
    TEST_DONE();
}
