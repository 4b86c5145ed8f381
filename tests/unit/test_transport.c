/* test_transport.c - the tcp transport (src/comm/transport.c) with one thread per rank: ring
 * and all-pairs exchanges over socketpairs, on_recv order, byte counters, peers that close,
 * stay silent or break the framing (every surviving rank must name the same culprit), and real
 * loopback sockets with strangers attacking the ports during and after set-up.
 * `test_transport --bench` measures a 2-rank full-duplex exchange on loopback instead. */
#include "test.h"

#include "comm/local.h"
#include "comm/transport.h"
#include "comm/handshake.h"
#include "comm/wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXN 4
#define MIB  ((size_t)1 << 20)

typedef struct rank_ctx rank_ctx;
typedef void (*scenario_fn)(rank_ctx *);

struct rank_ctx {
    int              rank, n;
    int              fds[MAXN];
    double           timeout;
    fl_transport    *t;
    fl_comm_counters counters;
    scenario_fn      fn;
    int              rc;        /* what the scenario's decisive call returned */
    char             msg[1024]; /* and its message */
    double           elapsed;   /* and how long it took */
    int              fails;     /* checks failed in this thread */
    void            *shared;    /* scenario-specific */
};

/* CHECK for rank threads (test_failures is not thread-safe). */
#define TCHECK(x, cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: rank %d: CHECK failed: %s\n", __FILE__, __LINE__,       \
                    (x)->rank, #cond);                                                      \
            (x)->fails++;                                                                   \
        }                                                                                   \
    } while (0)

static uint8_t pattern(int rank, size_t i, int salt) {
    return (uint8_t)(rank * 131 + (int)(i * 7) + (int)(i >> 9) + salt * 17);
}
static void fill(uint8_t *b, size_t n, int rank, int salt) {
    for (size_t i = 0; i < n; i++)
        b[i] = pattern(rank, i, salt);
}
static size_t first_mismatch(const uint8_t *b, size_t n, int rank, int salt) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(rank, i, salt))
            return i;
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

/* Sends sn bytes to `to` and receives rn from `from` with patterns, checking order/content. */
static int exchange(rank_ctx *x, int to, size_t sn, int from, size_t rn, int salt) {
    uint8_t *s = malloc(sn + 1), *r = malloc(rn + 1);
    fill(s, sn, x->rank, salt);
    memset(r, 0xee, rn);
    order_ctx o = {.total = rn};
    int rc = fl_transport_sendrecv(x->t, to, s, sn, from, r, rn, on_chunk, &o);
    if (rc == 0) {
        TCHECK(x, o.bad == 0 && o.next == (from >= 0 ? rn : 0));
        TCHECK(x, rn > 0 || o.calls == 0);
        if (from >= 0) {
            size_t bad = first_mismatch(r, rn, from, salt);
            if (bad != rn)
                fprintf(stderr, "rank %d: byte %zu of %zu from rank %d differs\n", x->rank, bad,
                        rn, from);
            TCHECK(x, bad == rn);
        }
    } else {
        snprintf(x->msg, sizeof x->msg, "%s", fl_errmsg());
        if (getenv("TEST_VERBOSE"))
            fprintf(stderr, "rank %d: %s\n", x->rank, x->msg);
    }
    free(s);
    free(r);
    return rc;
}

static void *rank_main(void *arg) {
    rank_ctx *x = arg;
    if (fl_transport_from_fds(x->rank, x->n, x->fds, x->timeout, &x->counters, &x->t) < 0) {
        fprintf(stderr, "rank %d: from_fds: %s\n", x->rank, fl_errmsg());
        x->fails++;
        return NULL;
    }
    TCHECK(x, fl_transport_rank(x->t) == x->rank && fl_transport_size(x->t) == x->n);
    x->fn(x);
    fl_transport_free(x->t);
    return NULL;
}

/* Runs fn on n rank threads joined by fds[i][j] (socketpairs when fds is NULL). */
static void run_mesh_fds(int n, int (*fds)[MAXN], scenario_fn fn, double timeout, rank_ctx *x,
                         void *shared) {
    memset(x, 0, sizeof(rank_ctx) * (size_t)n);
    for (int i = 0; i < n; i++) {
        x[i].rank = i;
        x[i].n = n;
        x[i].timeout = timeout;
        x[i].fn = fn;
        x[i].shared = shared;
        x[i].fds[i] = -1;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            int sv[2];
            if (fds) {
                sv[0] = fds[i][j];
                sv[1] = fds[j][i];
            } else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                perror("socketpair");
                exit(1);
            }
            x[i].fds[j] = sv[0];
            x[j].fds[i] = sv[1];
        }
    pthread_t th[MAXN];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, rank_main, &x[i]);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        test_failures += x[i].fails;
    }
}

/* ---------------------------------------------------------------- exchanges */

static void run_mesh(int n, scenario_fn fn, double timeout, rank_ctx *x, void *shared) {
    run_mesh_fds(n, NULL, fn, timeout, x, shared);
}

static const size_t sizes[] = {0, 1, 7, MIB + 3};

static void sc_ring(rank_ctx *x) {
    int n = x->n, right = (x->rank + 1) % n, left = (x->rank + n - 1) % n;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        TCHECK(x, exchange(x, right, sizes[k], left, sizes[k], (int)k) == 0);
    /* all pairs: shift by s (for n = 2 this is to == from) */
    for (int s = 1; s < n; s++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            TCHECK(x, exchange(x, (x->rank + s) % n, sizes[k], (x->rank + n - s) % n, sizes[k],
                               s * 10 + (int)k) == 0);
    /* one way only: rank 0 sends, rank 1 receives */
    if (x->rank == 0)
        TCHECK(x, exchange(x, 1, 300001, -1, 0, 99) == 0);
    if (x->rank == 1)
        TCHECK(x, exchange(x, -1, 0, 0, 300001, 99) == 0);
    /* different sizes in the two directions */
    TCHECK(x, exchange(x, right, 1000 + (size_t)x->rank, left, 1000 + (size_t)left, 5) == 0);
}

static void test_exchanges(void) {
    rank_ctx x[MAXN];
    for (int n = 2; n <= 4; n++)
        run_mesh(n, sc_ring, 10, x, NULL);
}

/* Rank 2 sends its data for rank 0's second receive while rank 0 still waits on rank 1, so
 * rank 0 reads that frame's header ahead of the operation that consumes it. */
static void sc_readahead(rank_ctx *x) {
    if (x->rank == 0) {
        TCHECK(x, exchange(x, -1, 0, 1, 1000, 1) == 0);
        TCHECK(x, exchange(x, -1, 0, 2, 300000, 2) == 0);
        TCHECK(x, exchange(x, -1, 0, 2, 5, 3) == 0);
    } else if (x->rank == 1) {
        usleep(200 * 1000);
        TCHECK(x, exchange(x, 0, 1000, -1, 0, 1) == 0);
    } else {
        TCHECK(x, exchange(x, 0, 300000, -1, 0, 2) == 0);
        TCHECK(x, exchange(x, 0, 5, -1, 0, 3) == 0);
    }
}

static void sc_counters(rank_ctx *x) {
    size_t n = MIB + 3;
    TCHECK(x, exchange(x, 1 - x->rank, n, 1 - x->rank, n, 0) == 0);
    uint64_t s = atomic_load(&x->counters.bytes_sent), r = atomic_load(&x->counters.bytes_received);
    TCHECK(x, s == r);                                /* symmetric: headers included both ways */
    TCHECK(x, s > n + FL_WIRE_FRAME_SIZE && s < n + 64 * FL_WIRE_FRAME_SIZE);
}

static void test_readahead_and_counters(void) {
    rank_ctx x[MAXN];
    run_mesh(3, sc_readahead, 10, x, NULL);
    run_mesh(2, sc_counters, 10, x, NULL);
}

/* ---------------------------------------------------------------- failures */

/* Ring of 3 in which rank 1 goes away (via fl_transport_free, or by closing its raw sockets
 * when shared is non-NULL); ranks 0 and 2 must both fail naming rank 1. */
static void sc_close(rank_ctx *x) {
    if (x->rank == 1) {
        if (x->shared) { /* die without a goodbye: close the sockets under the transport */
            for (int p = 0; p < x->n; p++)
                if (p != x->rank)
                    shutdown(x->fds[p], SHUT_RDWR);
        }
        return;
    }
    usleep(100 * 1000);
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = exchange(x, (x->rank + 1) % 3, 7, (x->rank + 2) % 3, 7, i);
    x->rc = rc;
}

/* 4 ranks: rank 2 closes; only rank 3 reads from it; rank 0 waits on rank 3 and rank 1 on
 * rank 0: both learn of rank 2 from abort notices. */
static void sc_abort_chain(rank_ctx *x) {
    double t0 = fl_now();
    if (x->rank == 2)
        return; /* freed at once: goodbye, close */
    if (x->rank == 3)
        x->rc = exchange(x, -1, 0, 2, 10, 0);
    else if (x->rank == 0)
        x->rc = exchange(x, -1, 0, 3, 10, 0);
    else
        x->rc = exchange(x, -1, 0, 0, 10, 0);
    x->elapsed = fl_now() - t0;
    /* after a failure the transport stays failed with the same message */
    char first[1024];
    snprintf(first, sizeof first, "%s", fl_errmsg());
    TCHECK(x, fl_transport_sendrecv(x->t, -1, NULL, 0, (x->rank + 1) % 4, first, 1, NULL,
                                    NULL) == x->rc);
    TCHECK(x, strcmp(fl_errmsg(), first) == 0);
}

/* Ring of 3 where rank 1 stays silent past the timeout. */
static void sc_silent(rank_ctx *x) {
    if (x->rank == 1) {
        usleep((useconds_t)((x->timeout + 1.5) * 1e6));
        return;
    }
    double t0 = fl_now();
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = exchange(x, (x->rank + 1) % 3, 7, (x->rank + 2) % 3, 7, i);
    x->rc = rc;
    x->elapsed = fl_now() - t0;
}

/* Two ranks that both wait to receive from each other (mismatched calls): both alive, both
 * still time out, saying so, after the timeout plus the grace for live peers. */
static void sc_deadlock(rank_ctx *x) {
    double t0 = fl_now();
    x->rc = exchange(x, -1, 0, 1 - x->rank, 7, 0);
    x->elapsed = fl_now() - t0;
}

static void check_msg(const rank_ctx *x, const char *needle) {
    if (!strstr(x->msg, needle)) {
        fprintf(stderr, "rank %d: message \"%s\" lacks \"%s\"\n", x->rank, x->msg, needle);
        test_failures++;
    }
}

static void test_failures_named(void) {
    rank_ctx x[MAXN];
    int raw = 1;
    for (int mode = 0; mode < 2; mode++) {
        run_mesh(3, sc_close, 10, x, mode ? &raw : NULL);
        for (int r = 0; r <= 2; r += 2) {
            CHECK(x[r].rc == FL_EPEER);
            check_msg(&x[r], "rank 1 (local)");
        }
        check_msg(&x[2], "rank 1 (local) closed the connection");
    }

    run_mesh(4, sc_abort_chain, 10, x, NULL);
    CHECK(x[3].rc == FL_EPEER);
    check_msg(&x[3], "rank 2 (local) closed the connection");
    for (int r = 0; r < 2; r++) {
        CHECK(x[r].rc == FL_EPEER);
        check_msg(&x[r], "rank 2 (local) closed the connection (reported by rank 3)");
        CHECK(x[r].elapsed < 2.0);
    }

    double timeout = 1.0;
    run_mesh(3, sc_silent, timeout, x, NULL);
    CHECK(x[2].rc == FL_ETIMEOUT);
    check_msg(&x[2], "no data from rank 1 (local) for 1 s");
    CHECK(x[2].elapsed >= timeout - 0.05 && x[2].elapsed < timeout + 1.0);
    CHECK(x[0].rc == FL_EPEER);
    check_msg(&x[0], "no data from rank 1 (local) for 1 s (reported by rank 2)");
    CHECK(x[0].elapsed < timeout + 1.0);

    run_mesh(2, sc_deadlock, timeout, x, NULL);
    for (int r = 0; r < 2; r++) {
        CHECK(x[r].rc == FL_ETIMEOUT || x[r].rc == FL_EPEER); /* its own, or the other's */
        check_msg(&x[r], "it is alive but waiting too");
        CHECK(x[r].elapsed >= timeout && x[r].elapsed < timeout + 1.0);
    }
}

/* A raw peer (no transport) writes bytes at a transport that expects 7 bytes of DATA. */
static void malformed_case(const void *bytes, size_t n, int want_rc, const char *needle) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    fl_transport *t;
    int fds[2] = {-1, sv[0]};
    CHECK_OK(fl_transport_from_fds(0, 2, fds, 2.0, NULL, &t));
    CHECK(write(sv[1], bytes, n) == (ssize_t)n);
    uint8_t r[7];
    double t0 = fl_now();
    CHECK_RC(fl_transport_sendrecv(t, -1, NULL, 0, 1, r, sizeof r, NULL, NULL), want_rc);
    CHECK(fl_now() - t0 < (want_rc == FL_ETIMEOUT ? 3.0 : 1.0));
    CHECK_MSG(needle);
    fl_transport_free(t);
    close(sv[1]);
}

static void test_malformed(void) {
    uint8_t b[64];
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, 5);
    memset(b + FL_WIRE_FRAME_SIZE, 1, 5);
    malformed_case(b, FL_WIRE_FRAME_SIZE + 5, FL_EPEER,
                   "rank 1 (local) sent a malformed frame: data frame of 5 bytes, expected 7");
    memset(b, 0x5a, sizeof b);
    malformed_case(b, sizeof b, FL_EPEER, "rank 1 (local) sent a malformed frame: bad magic");
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, (uint64_t)1 << 62);
    malformed_case(b, FL_WIRE_FRAME_SIZE, FL_EPEER, "malformed frame: data frame of");
    fl_wire_frame_encode(b, FL_WIRE_DATA, 1, 7);
    malformed_case(b, FL_WIRE_FRAME_SIZE, FL_EPEER, "malformed frame: sequence number 1");
    fl_wire_frame_encode(b, 9, 0, 7);
    malformed_case(b, FL_WIRE_FRAME_SIZE, FL_EPEER, "malformed frame: unknown frame type 9");
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 0, 5000);
    malformed_case(b, FL_WIRE_FRAME_SIZE, FL_EPEER, "malformed frame: abort message");
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 0, 3);
    memcpy(b + FL_WIRE_FRAME_SIZE, "xyz", 3);
    malformed_case(b, FL_WIRE_FRAME_SIZE + 3, FL_EPEER, "unreadable abort notice");
    /* a well-formed abort notice: the original culprit, with the reporter */
    const char *note = "1:rank 5 (10.0.0.5:6175) reset the connection\n";
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 0, strlen(note));
    uint8_t buf[128];
    memcpy(buf, b, FL_WIRE_FRAME_SIZE);
    memcpy(buf + FL_WIRE_FRAME_SIZE, note, strlen(note));
    malformed_case(buf, FL_WIRE_FRAME_SIZE + strlen(note), FL_EPEER,
                   "rank 5 (10.0.0.5:6175) reset the connection? (reported by rank 1)");
    /* a goodbye (empty abort) and a plain close: "closed the connection" */
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 0, 0);
    malformed_case(b, FL_WIRE_FRAME_SIZE, FL_EPEER, "rank 1 (local) closed the connection");
    malformed_case(b, 0, FL_ETIMEOUT, "no data from rank 1 (local) for 2 s");
    /* half a header, then silence: the timeout still fires */
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, 7);
    malformed_case(b, 10, FL_ETIMEOUT, "no data from rank 1");
}

/* The peer closes with our data unsent: the sender fails rather than hangs. */
static void test_send_to_closed(void) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    fl_transport *t;
    int fds[2] = {sv[0], -1};
    CHECK_OK(fl_transport_from_fds(1, 2, fds, 2.0, NULL, &t));
    close(sv[1]);
    size_t n = 16 * MIB;
    uint8_t *b = calloc(1, n);
    CHECK_RC(fl_transport_sendrecv(t, 0, b, n, -1, NULL, 0, NULL, NULL), FL_EPEER);
    CHECK_MSG("rank 0 (local) closed the connection");
    free(b);
    fl_transport_free(t);
}

/* ---------------------------------------------------------------- real sockets */

static int listen_any(int *port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0 ||
        getsockname(s, (struct sockaddr *)&a, &len) < 0) {
        perror("listen_any");
        exit(1);
    }
    *port = ntohs(a.sin_port);
    return s;
}

typedef struct {
    int                n;
    int                ports[MAXN];
    int                lfds[MAXN];
    char             (*eps)[FL_ENDPOINT_MAX];
    const char        *master;
    const char        *tokens[MAXN];
    double             timeout;
    int                tcp_only;
    int                encrypt;  /* FL_COMM_ENCRYPT_* */
    double             start_delay[MAXN];
    atomic_int         opened;
    atomic_int         attack_done;
    int                rounds;
    char               endpoint_seen[MAXN][MAXN][FL_ENDPOINT_MAX];
} net_job;

typedef struct {
    net_job         *job;
    int              rank, rc, fails;
    char             msg[1024];
    double           setup_s;
    fl_comm_counters counters;
} net_rank;

static void *net_rank_main(void *arg) {
    net_rank *nr = arg;
    net_job *j = nr->job;
    rank_ctx x = {.rank = nr->rank, .n = j->n};
    if (j->start_delay[nr->rank] > 0)
        usleep((useconds_t)(j->start_delay[nr->rank] * 1e6));
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.rank = nr->rank;
    env.size = j->n;
    env.endpoints = j->master ? NULL : j->eps;
    if (j->master)
        snprintf(env.master, sizeof env.master, "%s", j->master);
    snprintf(env.token, sizeof env.token, "%s", j->tokens[nr->rank]);
    env.timeout_s = j->timeout;
    env.listen_fd = j->master ? -1 : j->lfds[nr->rank];
    env.gpu = -1;
    env.tcp_only = j->tcp_only;
    env.encrypt = j->encrypt;
    double t0 = fl_now();
    nr->rc = fl_transport_open(&env, &nr->counters, &x.t);
    nr->setup_s = fl_now() - t0;
    if (nr->rc < 0) {
        snprintf(nr->msg, sizeof nr->msg, "%s", fl_errmsg());
        return NULL;
    }
    for (int p = 0; p < j->n; p++)
        snprintf(j->endpoint_seen[nr->rank][p], FL_ENDPOINT_MAX, "%s",
                 fl_transport_endpoint(x.t, p));
    atomic_fetch_add(&j->opened, 1);
    int n = j->n, right = (nr->rank + 1) % n, left = (nr->rank + n - 1) % n;
    for (int i = 0; i < j->rounds; i++)
        TCHECK(&x, exchange(&x, right, MIB + 3, left, MIB + 3, i) == 0);
    for (int i = 0; i < 1000 && !atomic_load(&j->attack_done); i++)
        usleep(10 * 1000);
    TCHECK(&x, exchange(&x, left, 77, right, 77, 7) == 0); /* still fine after the attacks */
    double t1 = fl_now();
    fl_transport_free(x.t); /* stops the listener thread promptly */
    TCHECK(&x, fl_now() - t1 < 1.0);
    nr->fails += x.fails;
    return NULL;
}

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 8};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("dial");
        close(s);
        return -1;
    }
    return s;
}

/* Sends bytes as a stranger and returns the status of the refusal the listener answers with
 * (-1: closed without a reply). */
static int stranger(int port, const void *bytes, size_t n, int acceptor_rank) {
    int s = dial(port);
    if (s < 0)
        return -2;
    if (n && send(s, bytes, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(s);
        return -3;
    }
    uint8_t reply[FL_WIRE_REPLY_SIZE];
    size_t got = 0;
    while (got < sizeof reply) {
        ssize_t k = recv(s, reply + got, sizeof reply - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(s);
    if (got < sizeof reply)
        return -1;
    uint32_t theirs;
    fl_wire_reply_parse(reply, sizeof reply, (uint32_t)acceptor_rank, &theirs, NULL, 0);
    return (int)theirs;
}

/* A stranger that runs the whole challenge-response with `token` (wrong or right) as rank
 * `rank` of `size`: returns the status the listener refused it with, FL_WIRE_OK if it was
 * let in, -1 when closed without an answer. */
static int stranger_hs(int port, const char *token, uint32_t rank, uint32_t size,
                       uint16_t flags, int acceptor_rank) {
    fl_hs_config hs;
    if (fl_hs_config_init(&hs, token, 0, 0) < 0)
        return -4;
    int s = dial(port);
    if (s < 0)
        return -2;
    fl_wire_hello h = {.flags = flags, .rank = rank, .size = size};
    fl_crypto_random(h.nonce, sizeof h.nonce);
    uint8_t msg[FL_WIRE_HELLO_SIZE], ch[FL_WIRE_CHALLENGE_SIZE], auth[FL_WIRE_AUTH_SIZE];
    fl_wire_hello_encode(msg, &h);
    int st = -1;
    uint32_t theirs = FL_WIRE_OK;
    fl_wire_challenge c;
    size_t got = 0;
    if (send(s, msg, sizeof msg, MSG_NOSIGNAL) != (ssize_t)sizeof msg)
        goto done;
    for (size_t want = FL_WIRE_REPLY_SIZE; got < want;) {
        ssize_t k = recv(s, ch + got, want - got, 0);
        if (k <= 0)
            goto done;
        got += (size_t)k;
        st = fl_wire_challenge_parse(ch, got, (uint32_t)acceptor_rank, &theirs, &c, NULL, 0);
        if (st == FL_WIRE_TRUNCATED)
            want = FL_WIRE_CHALLENGE_SIZE;
    }
    if (st != FL_WIRE_OK) {
        st = theirs != FL_WIRE_OK ? (int)theirs : -1;
        goto done;
    }
    fl_hs_transcript t = {.flags = flags, .size = size, .rank_c = rank,
                          .rank_a = (uint32_t)acceptor_rank, .opt_c = 0, .opt_a = c.options};
    memcpy(t.nonce_c, h.nonce, sizeof t.nonce_c);
    memcpy(t.nonce_a, c.nonce, sizeof t.nonce_a);
    uint8_t mac[FL_WIRE_HS_MAC];
    fl_hs_mac(&hs, FL_HS_CONNECTOR, &t, mac); /* what a connector with `token` proves */
    fl_wire_auth_encode(auth, rank, mac);
    st = -1;
    if (send(s, auth, sizeof auth, MSG_NOSIGNAL) != (ssize_t)sizeof auth)
        goto done;
    for (got = 0; got < FL_WIRE_REPLY_SIZE;) {
        ssize_t k = recv(s, ch + got, FL_WIRE_REPLY_SIZE - got, 0);
        if (k <= 0)
            goto done;
        got += (size_t)k;
    }
    fl_wire_reply_parse(ch, FL_WIRE_REPLY_SIZE, (uint32_t)acceptor_rank, &theirs, NULL, 0);
    st = (int)theirs;
done:
    close(s);
    return st;
}

typedef struct {
    net_job *job;
    int      fails;
} attacker;

#define ACHECK(a, cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: attacker: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            (a)->fails++;                                                                   \
        }                                                                                   \
    } while (0)

static void *attacker_main(void *arg) {
    attacker *a = arg;
    net_job *j = a->job;
    uint8_t hello[FL_WIRE_HELLO_SIZE], frame[FL_WIRE_FRAME_SIZE], garbage[100];
    fl_wire_hello h = {.rank = 2, .size = 3};
    fl_wire_hello_encode(hello, &h);
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (uint8_t)(i * 37 + 11);
    /* a silent stranger, held open through set-up: must not block anyone */
    int silent = dial(j->ports[0]);
    /* during set-up (rank 2 starts late) */
    for (int r = 0; r < 2; r++) {
        int port = j->ports[r];
        int s = dial(port); /* port scan: connect, close */
        if (s >= 0)
            close(s);
        ACHECK(a, stranger(port, garbage, sizeof garbage, r) == FL_WIRE_BAD_MAGIC);
        ACHECK(a, stranger_hs(port, "not-the-token", 2, 3, 0, r) == FL_WIRE_BAD_TOKEN);
        fl_wire_frame_encode(frame, FL_WIRE_DATA, 0, UINT64_MAX);
        ACHECK(a, stranger(port, frame, sizeof frame, r) == FL_WIRE_BAD_MAGIC);
        ACHECK(a, stranger_hs(port, j->tokens[0], 2, 8, 0, r) == FL_WIRE_BAD_SIZE);
        ACHECK(a, stranger_hs(port, j->tokens[0], (uint32_t)r, 3, 0, r) == FL_WIRE_BAD_RANK);
        ACHECK(a, stranger_hs(port, j->tokens[0], 2, 3, FL_WIRE_FLAG_RENDEZVOUS, r) ==
                      FL_WIRE_BAD_FLAGS);
        s = dial(port); /* half a handshake, then gone */
        if (s >= 0) {
            (void)!send(s, hello, 40, MSG_NOSIGNAL);
            close(s);
        }
    }
    /* after set-up, while the ranks exchange data: the listener thread refuses */
    for (int i = 0; i < 500 && atomic_load(&j->opened) < j->n; i++)
        usleep(10 * 1000);
    ACHECK(a, atomic_load(&j->opened) == j->n);
    if (silent >= 0)
        close(silent);
    for (int round = 0; round < 3; round++) {
        for (int r = 0; r < j->n; r++) {
            int port = j->ports[r];
            int s = dial(port);
            if (s >= 0)
                close(s);
            ACHECK(a, stranger(port, garbage, sizeof garbage, r) == FL_WIRE_BAD_MAGIC);
            /* every rank is connected now: refused before any cryptography is spent */
            ACHECK(a, stranger_hs(port, "not-the-token", 2, 3, 0, r) ==
                          (r < 2 ? FL_WIRE_DUPLICATE : FL_WIRE_BAD_RANK));
            fl_wire_frame_encode(frame, FL_WIRE_DATA, 0, UINT64_MAX);
            ACHECK(a, stranger(port, frame, sizeof frame, r) == FL_WIRE_BAD_MAGIC);
            if (r < 2) { /* the right token, a rank that is already connected */
                ACHECK(a, stranger_hs(port, j->tokens[0], 2, 3, 0, r) == FL_WIRE_DUPLICATE);
            }
        }
    }
    atomic_store(&j->attack_done, 1);
    return NULL;
}

/* n ranks call fl_transport_open on loopback; optionally a stranger attacks the ports. */
static void run_net(net_job *j, net_rank *nr, bool attack) {
    for (int r = 0; r < j->n; r++) {
        nr[r] = (net_rank){.job = j, .rank = r};
    }
    pthread_t th[MAXN], at;
    attacker a = {.job = j};
    if (attack)
        pthread_create(&at, NULL, attacker_main, &a);
    else
        atomic_store(&j->attack_done, 1);
    for (int r = 0; r < j->n; r++)
        pthread_create(&th[r], NULL, net_rank_main, &nr[r]);
    for (int r = 0; r < j->n; r++) {
        pthread_join(th[r], NULL);
        test_failures += nr[r].fails;
    }
    if (attack) {
        pthread_join(at, NULL);
        test_failures += a.fails;
    }
}

static void net_job_init(net_job *j, int n, const char *token, bool listen) {
    memset(j, 0, sizeof *j);
    j->n = n;
    j->eps = calloc((size_t)n, sizeof *j->eps);
    j->timeout = 10;
    j->rounds = 20;
    for (int r = 0; r < n; r++) {
        j->tokens[r] = token;
        j->lfds[r] = -1;
        if (listen) {
            j->lfds[r] = listen_any(&j->ports[r]);
            snprintf(j->eps[r], FL_ENDPOINT_MAX, "127.0.0.1:%d", j->ports[r]);
        }
    }
}

static void net_job_clear(net_job *j) {
    for (int r = 0; r < j->n; r++)
        if (j->lfds[r] >= 0)
            close(j->lfds[r]);
    free(j->eps);
}

/* A connected loopback TCP pair. */
static void tcp_pair(int sv[2]) {
    int port, l = listen_any(&port);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    sv[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(sv[0], (struct sockaddr *)&a, sizeof a) < 0 ||
        (sv[1] = accept(l, NULL, NULL)) < 0) {
        perror("tcp_pair");
        exit(1);
    }
    close(l);
}

static int domain_of(int fd) {
    int d = -1;
    socklen_t len = sizeof d;
    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &d, &len);
    return d;
}

typedef struct {
    int  rank, n, allow, rc;
    int *fds;
    char msg[512];
} upgrade_ctx;

static void *upgrade_main(void *arg) {
    upgrade_ctx *u = arg;
    char eps[MAXN][FL_ENDPOINT_MAX] = {"a:1", "b:2", "c:3", "d:4"};
    u->rc = fl_local_upgrade(u->rank, u->n, u->fds, (const char(*)[FL_ENDPOINT_MAX])eps,
                             u->allow, fl_now() + 5, NULL);
    snprintf(u->msg, sizeof u->msg, "%s", fl_errmsg());
    return NULL;
}

/* The same-host shortcut alone: over TCP pairs, every pair moves to a unix socket unless one
 * side forbids it (rank 1 here, the second time), and data flows either way afterwards. */
static void test_local_upgrade(void) {
    const int n = 3;
    for (int forbid = 0; forbid < 2; forbid++) {
        int fds[MAXN][MAXN];
        for (int i = 0; i < n; i++) {
            fds[i][i] = -1;
            for (int j = i + 1; j < n; j++) {
                int sv[2];
                tcp_pair(sv);
                fds[i][j] = sv[0];
                fds[j][i] = sv[1];
            }
        }
        upgrade_ctx u[MAXN];
        pthread_t th[MAXN];
        for (int r = 0; r < n; r++) {
            u[r] = (upgrade_ctx){.rank = r, .n = n, .allow = !(forbid && r == 1), .fds = fds[r]};
            pthread_create(&th[r], NULL, upgrade_main, &u[r]);
        }
        for (int r = 0; r < n; r++) {
            pthread_join(th[r], NULL);
            if (u[r].rc)
                fprintf(stderr, "rank %d: %s\n", r, u[r].msg);
            CHECK(u[r].rc == 0);
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                if (i != j)
                    CHECK(domain_of(fds[i][j]) ==
                          (forbid && (i == 1 || j == 1) ? AF_INET : AF_UNIX));
        rank_ctx x[MAXN];
        run_mesh_fds(n, fds, sc_ring, 10, x, NULL);
    }
}

static void test_real_sockets(int tcp_only) {
    net_job j;
    net_rank nr[MAXN];
    net_job_init(&j, 3, "job-7f3a", true);
    j.tcp_only = tcp_only;
    j.start_delay[2] = 0.6; /* ranks 0 and 1 sit in set-up while the stranger attacks */
    run_net(&j, nr, true);
    for (int r = 0; r < 3; r++) {
        if (nr[r].rc != 0)
            fprintf(stderr, "rank %d: open: %s\n", r, nr[r].msg);
        CHECK(nr[r].rc == 0);
        CHECK(nr[r].setup_s < 4.0); /* the silent stranger (5 s deadline) blocked nobody */
        CHECK(atomic_load(&nr[r].counters.bytes_sent) > 3 * (MIB + 3));
        for (int p = 0; p < 3; p++)
            CHECK(strcmp(j.endpoint_seen[r][p], j.eps[p]) == 0);
    }
    net_job_clear(&j);

    if (tcp_only)
        return; /* the rest never gets as far as the same-host shortcut */

    /* a rank with the wrong token is refused at once; its peer times out naming it */
    net_job_init(&j, 2, "right", true);
    j.tokens[1] = "wrong";
    j.timeout = 1.0;
    fl_log_set_level(FL_LOG_ERROR);
    run_net(&j, nr, false);
    fl_log_set_level(FL_LOG_INFO);
    CHECK(nr[1].rc == FL_EPEER);
    /* the token never crossed the wire: the connector sees the acceptor's proof fail first */
    if (!strstr(nr[1].msg, "rank 0 (127.0.0.1:") || !strstr(nr[1].msg, "proof of the job token is wrong"))
        fprintf(stderr, "unexpected: %s\n", nr[1].msg), test_failures++;
    CHECK(nr[1].setup_s < 0.9);
    CHECK(nr[0].rc == FL_ETIMEOUT);
    if (!strstr(nr[0].msg, "rank 1 (127.0.0.1:"))
        fprintf(stderr, "unexpected: %s\n", nr[0].msg), test_failures++;
    CHECK(nr[0].setup_s >= 0.95 && nr[0].setup_s < 2.0);
    net_job_clear(&j);

    /* a peer that never listens: the dialling rank retries until the timeout, then names it */
    net_job_init(&j, 2, "t", true);
    close(j.lfds[0]);
    int hold = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* keep the port, not listening */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)j.ports[0]),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(hold, (struct sockaddr *)&a, sizeof a) == 0);
    j.lfds[0] = -1;
    j.timeout = 1.0;
    nr[1] = (net_rank){.job = &j, .rank = 1};
    pthread_t th;
    pthread_create(&th, NULL, net_rank_main, &nr[1]);
    pthread_join(th, NULL);
    CHECK(nr[1].rc == FL_ETIMEOUT);
    if (!strstr(nr[1].msg, "rank 0 (127.0.0.1:") || !strstr(nr[1].msg, "refused"))
        fprintf(stderr, "unexpected: %s\n", nr[1].msg), test_failures++;
    CHECK(nr[1].setup_s >= 0.95 && nr[1].setup_s < 2.0);
    close(hold);
    net_job_clear(&j);

    /* without FLEET_LISTEN_FD: each rank binds its endpoint itself */
    net_job_init(&j, 2, "own-bind", true);
    for (int r = 0; r < 2; r++) {
        close(j.lfds[r]);
        j.lfds[r] = -1;
    }
    run_net(&j, nr, false);
    for (int r = 0; r < 2; r++) {
        if (nr[r].rc)
            fprintf(stderr, "rank %d: %s\n", r, nr[r].msg);
        CHECK(nr[r].rc == 0);
    }
    net_job_clear(&j);
}

/* torchrun style: only the master's address is known; endpoints are exchanged. */
/* ---- encrypted frames through a relay that records and tampers (issue 35) ---- */

enum { T_NONE, T_FLIP, T_DROP, T_DUP, T_REORDER, T_REPLAY, T_SEQ, T_KA_OK, T_KA_FORGE,
       T_KA_REPLAY };
static const char *const tamper_names[] = {"none", "flip", "drop", "duplicate", "reorder",
                                           "replay", "seq", "keepalive", "forged keepalive",
                                           "replayed keepalive"};

typedef struct {
    int      lfd, to_port, mode;
    bool     enc;      /* frames carry a tag */
    int      keepalives; /* seen from rank 1 */
    uint8_t *rec;      /* what rank 1 sent rank 0, as it crossed */
    size_t   rec_len, rec_cap;
} relay;

static bool write_all(int fd, const uint8_t *b, size_t n) {
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k <= 0)
            return false;
        b += k;
        n -= (size_t)k;
    }
    return true;
}

/* Forwards both ways; rank 1 -> rank 0 is cut into frames after the handshake (hello 56,
 * proof 40, same-host decision 8) and data frame 3 is tampered with as the mode says; in the
 * keepalive modes, the first keepalive instead: replaced by a forged one (a counter never
 * used, a zero tag), or passed on twice. */
static void *relay_main(void *arg) {
    relay *rl = arg;
    int a = accept(rl->lfd, NULL, NULL), b = dial(rl->to_port);
    if (a < 0 || b < 0)
        return NULL;
    struct timeval tv = {0};
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t pre = FL_WIRE_HELLO_SIZE + FL_WIRE_AUTH_SIZE + FL_WIRE_DECISION_SIZE, used = 0;
    uint8_t *held = NULL, *prev = NULL;
    size_t held_n = 0, prev_n = 0;
    int data_frames = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, 20000) <= 0)
            break;
        if (p[1].revents) { /* rank 0 -> rank 1: as it is */
            uint8_t buf[1 << 16];
            ssize_t k = recv(b, buf, sizeof buf, 0);
            if (k <= 0 || !write_all(a, buf, (size_t)k))
                break;
        }
        if (!p[0].revents)
            continue;
        if (rl->rec_len + (1 << 16) > rl->rec_cap) {
            rl->rec_cap = 2 * rl->rec_cap + (1 << 20);
            rl->rec = realloc(rl->rec, rl->rec_cap);
        }
        ssize_t k = recv(a, rl->rec + rl->rec_len, 1 << 16, 0);
        if (k <= 0)
            break;
        rl->rec_len += (size_t)k;
        /* forward every whole message that is in */
        bool ok = true;
        for (;;) {
            uint8_t *m = rl->rec + used;
            size_t avail = rl->rec_len - used, len;
            if (used < pre)
                len = pre - used < avail ? pre - used : avail;
            else {
                if (avail < FL_WIRE_FRAME_SIZE)
                    break;
                uint32_t type = (uint32_t)m[4] | (uint32_t)m[5] << 8;
                uint64_t pl = 0;
                for (int i = 7; i >= 0; i--)
                    pl = pl << 8 | m[16 + i];
                if (type == FL_WIRE_KEEPALIVE)
                    len = rl->enc ? FL_WIRE_KEEPALIVE_SEALED : FL_WIRE_FRAME_SIZE;
                else
                    len = FL_WIRE_FRAME_SIZE + pl + (rl->enc ? FL_CRYPTO_TAG : 0);
                if (avail < len)
                    break;
                if (type == FL_WIRE_KEEPALIVE && ++rl->keepalives == 1 && rl->mode > T_KA_OK) {
                    uint8_t ka[FL_WIRE_KEEPALIVE_SEALED] = {0};
                    memcpy(ka, m, len);
                    if (rl->mode == T_KA_FORGE) {
                        ka[FL_WIRE_FRAME_SIZE] = 7; /* counter 7, tag of zeros */
                        memset(ka + FL_WIRE_KEEPALIVE_BODY, 0, FL_CRYPTO_TAG);
                        ok = write_all(b, ka, len);
                    } else {
                        ok = write_all(b, ka, len) && write_all(b, ka, len);
                    }
                } else if (type == FL_WIRE_DATA && ++data_frames == 3 && rl->mode != T_NONE &&
                           rl->mode < T_KA_OK) {
                    uint8_t *copy = malloc(len);
                    memcpy(copy, m, len);
                    switch (rl->mode) {
                    case T_FLIP: copy[FL_WIRE_FRAME_SIZE + 100] ^= 0x04; ok = write_all(b, copy, len); break;
                    case T_SEQ: copy[8] ^= 0x01; ok = write_all(b, copy, len); break;
                    case T_DROP: break;
                    case T_DUP: ok = write_all(b, copy, len) && write_all(b, copy, len); break;
                    case T_REORDER: held = copy, held_n = len, copy = NULL; break;
                    case T_REPLAY: ok = write_all(b, copy, len) && write_all(b, prev, prev_n); break;
                    }
                    free(copy);
                } else {
                    ok = write_all(b, m, len);
                    if (held && type == FL_WIRE_DATA) { /* the frame after it, then it */
                        ok = ok && write_all(b, held, held_n);
                        free(held);
                        held = NULL;
                    }
                    if (type == FL_WIRE_DATA) {
                        free(prev);
                        prev = malloc(len);
                        memcpy(prev, m, len);
                        prev_n = len;
                    }
                }
            }
            if (len && used < pre)
                ok = ok && write_all(b, m, len);
            used += len;
            if (!ok || len == 0)
                break;
        }
        if (!ok)
            break;
    }
    free(held);
    free(prev);
    close(a);
    close(b);
    return NULL;
}

typedef struct {
    net_job *j;
    int      rank, rc;
    char     msg[1024];
    double   fail_s;
    double   sleep_s; /* before the first exchange: the other rank waits, sending keepalives */
} tamper_rank;

static void *tamper_rank_main(void *arg) {
    tamper_rank *tr = arg;
    net_job *j = tr->j;
    rank_ctx x = {.rank = tr->rank, .n = 2};
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.rank = tr->rank;
    env.size = 2;
    env.endpoints = j->eps;
    snprintf(env.token, sizeof env.token, "%s", j->tokens[0]);
    env.timeout_s = j->timeout;
    env.listen_fd = j->lfds[tr->rank];
    env.gpu = -1;
    env.tcp_only = 1;
    env.encrypt = j->encrypt;
    tr->rc = fl_transport_open(&env, NULL, &x.t);
    if (tr->rc < 0) {
        snprintf(tr->msg, sizeof tr->msg, "%s", fl_errmsg());
        return NULL;
    }
    if (tr->sleep_s > 0)
        usleep((useconds_t)(tr->sleep_s * 1e6));
    double t0 = fl_now();
    for (int i = 0; i < 4 && tr->rc == 0; i++) {
        tr->rc = exchange(&x, 1 - tr->rank, MIB + 3, 1 - tr->rank, MIB + 3, i);
        if (tr->rc < 0)
            snprintf(tr->msg, sizeof tr->msg, "%s", x.msg);
    }
    tr->fail_s = fl_now() - t0;
    fl_transport_free(x.t);
    return NULL;
}

/* Runs 2 ranks whose rank 1 -> rank 0 bytes cross a relay in `mode`; returns what rank 0 saw. */
static void run_tampered(int mode, int encrypt, tamper_rank *tr, relay *rl) {
    net_job j;
    net_job_init(&j, 2, "tamper-token-0123456789", true);
    j.timeout = 3;
    j.encrypt = encrypt;
    int rport;
    *rl = (relay){.lfd = listen_any(&rport), .to_port = j.ports[0], .mode = mode,
                .enc = encrypt == FL_COMM_ENCRYPT_ON};
    snprintf(j.eps[0], FL_ENDPOINT_MAX, "127.0.0.1:%d", rport); /* rank 1 dials the relay */
    pthread_t th[2], rt;
    pthread_create(&rt, NULL, relay_main, rl);
    for (int r = 0; r < 2; r++) {
        /* rank 0 late: rank 1, done sending, waits on it and sends keepalives every 0.75 s */
        tr[r] = (tamper_rank){.j = &j, .rank = r,
                              .sleep_s = r == 0 && mode >= T_KA_OK ? 1.8 : 0};
        pthread_create(&th[r], NULL, tamper_rank_main, &tr[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    pthread_join(rt, NULL);
    close(rl->lfd);
    net_job_clear(&j);
}

static bool contains(const uint8_t *hay, size_t n, const void *needle, size_t k) {
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(hay + i, needle, k))
            return true;
    return false;
}

static void test_encrypted(void) {
    /* three ranks, every connection encrypted: the exchanges check every byte */
    net_job j;
    net_job_init(&j, 3, "enc", true);
    j.encrypt = FL_COMM_ENCRYPT_ON;
    j.tcp_only = 1;
    j.rounds = 5;
    net_rank nr[MAXN];
    run_net(&j, nr, false);
    for (int r = 0; r < 3; r++) {
        if (nr[r].rc)
            fprintf(stderr, "rank %d: %s\n", r, nr[r].msg);
        CHECK(nr[r].rc == 0);
    }
    net_job_clear(&j);

    /* what crossed: neither the token nor data in the clear (and the data in the clear when
     * encryption is off, so that the search itself is known to work) */
    tamper_rank tr[2];
    relay rl;
    uint8_t plain[64];
    fill(plain, sizeof plain, 1, 0);
    const char *tok = "tamper-token-0123456789";
    for (int enc = 0; enc < 2; enc++) {
        run_tampered(T_NONE, enc ? FL_COMM_ENCRYPT_ON : FL_COMM_ENCRYPT_OFF, tr, &rl);
        if (tr[0].rc || tr[1].rc)
            fprintf(stderr, "relay, encrypt %d: %s / %s\n", enc, tr[0].msg, tr[1].msg);
        CHECK(tr[0].rc == 0 && tr[1].rc == 0);
        CHECK(rl.rec_len > 4 * MIB);
        CHECK(!contains(rl.rec, rl.rec_len, tok, strlen(tok)));
        CHECK(!contains(rl.rec, rl.rec_len, tok, 8));
        CHECK(contains(rl.rec, rl.rec_len, plain, sizeof plain) == !enc);
        free(rl.rec);
    }

    /* a changed, dropped, duplicated, reordered or replayed frame: rank 0 fails naming rank 1
     * within the timeout, and never hands the frame on */
    fl_log_set_level(FL_LOG_ERROR);
    for (int mode = T_FLIP; mode <= T_SEQ; mode++) {
        run_tampered(mode, FL_COMM_ENCRYPT_ON, tr, &rl);
        free(rl.rec);
        bool named = strstr(tr[0].msg, "rank 1 (") != NULL;
        if (tr[0].rc != FL_EPEER && tr[0].rc != FL_ETIMEOUT)
            fprintf(stderr, "tamper %s: rank 0 returned %d\n", tamper_names[mode], tr[0].rc);
        if (!named)
            fprintf(stderr, "tamper %s: rank 0 said: %s\n", tamper_names[mode], tr[0].msg);
        CHECK(tr[0].rc == FL_EPEER || tr[0].rc == FL_ETIMEOUT);
        CHECK(named);
        CHECK(tr[0].fail_s < 3 + 1.5 + 1);
        CHECK(tr[1].rc < 0);
        printf("tamper %-9s: rank 0 after %.2f s: %s\n", tamper_names[mode], tr[0].fail_s,
               tr[0].msg);
    }

    /* keepalives on an encrypted connection carry a counter and a tag: authentic ones pass,
     * a forged one and a replayed one fail rank 0 naming rank 1 */
    for (int mode = T_KA_OK; mode <= T_KA_REPLAY; mode++) {
        run_tampered(mode, FL_COMM_ENCRYPT_ON, tr, &rl);
        free(rl.rec);
        printf("%-18s: %d keepalive(s) crossed; rank 0: %s\n", tamper_names[mode],
               rl.keepalives, tr[0].rc ? tr[0].msg : "ok");
        CHECK(rl.keepalives >= 1);
        if (mode == T_KA_OK) {
            CHECK(tr[0].rc == 0 && tr[1].rc == 0);
            continue;
        }
        CHECK(tr[0].rc == FL_EPEER);
        CHECK(strstr(tr[0].msg, "rank 1 (") != NULL);
        const char *want = mode == T_KA_FORGE
                               ? "keepalive that fails authentication"
                               : "sent keepalive 0 again or out of order (the last was 0)";
        CHECK(strstr(tr[0].msg, want) != NULL);
        CHECK(tr[1].rc < 0);
    }
    fl_log_set_level(FL_LOG_INFO);
}

static void test_rendezvous(void) {
    int port;
    int s = listen_any(&port);
    close(s); /* free now; the transport's rank 0 binds it */
    char master[32];
    snprintf(master, sizeof master, "127.0.0.1:%d", port);
    net_job j;
    net_rank nr[MAXN];
    net_job_init(&j, 3, "rdv-token", false);
    j.master = master;
    j.start_delay[0] = 0.3; /* the others retry until the master listens */
    run_net(&j, nr, false);
    for (int r = 0; r < 3; r++) {
        if (nr[r].rc)
            fprintf(stderr, "rank %d: %s\n", r, nr[r].msg);
        CHECK(nr[r].rc == 0);
        for (int p = 0; p < 3; p++) {
            CHECK(strncmp(j.endpoint_seen[r][p], "127.0.0.1:", 10) == 0);
            CHECK(strcmp(j.endpoint_seen[r][p], j.endpoint_seen[0][p]) == 0);
        }
    }
    net_job_clear(&j);
}

static void test_single_rank(void) {
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.size = 1;
    env.listen_fd = -1;
    fl_transport *t;
    CHECK_OK(fl_transport_open(&env, NULL, &t));
    CHECK(fl_transport_size(t) == 1);
    CHECK_OK(fl_transport_sendrecv(t, -1, NULL, 0, -1, NULL, 0, NULL, NULL));
    fl_transport_free(t);
    fl_transport_free(NULL);
}

/* ---------------------------------------------------------------- benchmark */

typedef struct {
    net_job *job;
    int      rank;
    double   seconds[8];
    double   latency_us; /* one 8-byte exchange */
} bench_rank;

static const size_t bench_sizes[] = {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB};
#define BENCH_ITERS 20

static void *bench_main(void *arg) {
    bench_rank *b = arg;
    net_job *j = b->job;
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.rank = b->rank;
    env.size = 2;
    env.endpoints = j->eps;
    snprintf(env.token, sizeof env.token, "bench");
    env.timeout_s = 30;
    env.listen_fd = j->lfds[b->rank];
    env.tcp_only = j->tcp_only;
    fl_transport *t;
    if (fl_transport_open(&env, NULL, &t) < 0) {
        fprintf(stderr, "bench: %s\n", fl_errmsg());
        exit(1);
    }
    size_t max = bench_sizes[3];
    uint8_t *s = malloc(max), *r = malloc(max);
    memset(s, 1, max);
    memset(r, 0, max);
    int peer = 1 - b->rank;
    for (size_t k = 0; k < sizeof bench_sizes / sizeof bench_sizes[0]; k++) {
        size_t n = bench_sizes[k];
        fl_transport_sendrecv(t, peer, s, n, peer, r, n, NULL, NULL); /* warm up */
        double t0 = fl_now();
        for (int i = 0; i < BENCH_ITERS; i++)
            if (fl_transport_sendrecv(t, peer, s, n, peer, r, n, NULL, NULL) < 0) {
                fprintf(stderr, "bench: %s\n", fl_errmsg());
                exit(1);
            }
        b->seconds[k] = fl_now() - t0;
    }
    uint8_t one[8] = {0}, two[8];
    double t0 = fl_now();
    for (int i = 0; i < 4000; i++)
        fl_transport_sendrecv(t, peer, one, sizeof one, peer, two, sizeof two, NULL, NULL);
    b->latency_us = (fl_now() - t0) / 4000 * 1e6;
    free(s);
    free(r);
    fl_transport_free(t);
    return NULL;
}

static void bench(int tcp_only) {
    net_job j;
    net_job_init(&j, 2, "bench", true);
    bench_rank b[2] = {{.job = &j, .rank = 0}, {.job = &j, .rank = 1}};
    j.tcp_only = tcp_only;
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        pthread_create(&th[r], NULL, bench_main, &b[r]);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    printf("2 threads on 127.0.0.1, %s, full-duplex sendrecv (each rank sends and receives "
           "n bytes), %d times\n", tcp_only ? "TCP only (FLEET_COMM_LOCAL=0)"
                                            : "same-host unix socket (default)", BENCH_ITERS);
    printf("%10s %14s %16s\n", "bytes", "MB/s each way", "MB/s both ways");
    for (size_t k = 0; k < sizeof bench_sizes / sizeof bench_sizes[0]; k++) {
        double sec = b[0].seconds[k] > b[1].seconds[k] ? b[0].seconds[k] : b[1].seconds[k];
        double mbs = (double)bench_sizes[k] * BENCH_ITERS / sec / 1e6;
        printf("%10zu %14.0f %16.0f\n", bench_sizes[k], mbs, 2 * mbs);
    }
    printf("%10d bytes: %.1f us per exchange\n", 8, b[0].latency_us);
    net_job_clear(&j);
}

static int open_fds(void) {
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench(1);
        bench(0);
        return 0;
    }
    int fds_before = open_fds();
    test_exchanges();
    test_readahead_and_counters();
    test_failures_named();
    test_malformed();
    test_send_to_closed();
    test_single_rank();
    test_local_upgrade();
    test_real_sockets(1);
    test_real_sockets(0);
    test_rendezvous();
    test_encrypted();
    int fds_after = open_fds();
    if (fds_after != fds_before)
        fprintf(stderr, "%d file descriptors open before the tests, %d after\n", fds_before,
                fds_after);
    CHECK(fds_after == fds_before); /* no fd leaks */
    TEST_DONE();
}
