/* test_msgconn.c - message connections (src/comm/msgconn.c, msg_listener.c): messages of every
 * size over socketpairs, in the clear and sealed, delivered whole or a byte at a time, across
 * timeouts, both directions at once; closes, resets and every broken frame (malformed, too
 * long, out of sequence, altered, replayed); and real loopback sockets: a server and three
 * clients, encryption asked for by either side, wrong tokens, collective ranks and message
 * clients on each other's ports, newcomers after set-up, clients that never come. */
#define _GNU_SOURCE /* memmem */
#include "test.h"

#include "comm/crypto.h"
#include "comm/handshake.h"
#include "comm/listener.h"
#include "comm/msgconn_impl.h"
#include "comm/net.h"
#include "comm/wire.h"

#include "fleet/log.h"
#include "fleet/msgconn.h"
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

#define MIB   ((size_t)1 << 20)
#define TOKEN "msgconn-test-token-0123456789abcdef"
#define LONG_S 30.0 /* a bound against hangs, never a measured threshold */

static uint8_t pattern(size_t i, int salt) {
    return (uint8_t)(i * 7 + (i >> 9) + (size_t)salt * 31 + 1);
}
static void fill(uint8_t *b, size_t n, int salt) {
    for (size_t i = 0; i < n; i++)
        b[i] = pattern(i, salt);
}
static int intact(const uint8_t *b, size_t n, int salt) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(i, salt)) {
            fprintf(stderr, "byte %zu of %zu differs (salt %d)\n", i, n, salt);
            return 0;
        }
    return 1;
}

static fl_msg_config config(int world, const char *token, int encrypt, double timeout) {
    fl_msg_config c;
    memset(&c, 0, sizeof c);
    c.world = world;
    snprintf(c.token, sizeof c.token, "%s", token);
    c.encrypt = encrypt;
    c.timeout_s = timeout;
    return c;
}

/* ---------------------------------------------------------------- socketpairs */

/* Two connections over a socketpair, in the clear (fl_msg_conn_from_fd) or sealed with matching
 * keys, as a handshake would give them (fl_msg_conn_create). */
static void make_pair(bool sealed, fl_aead_cipher cipher, fl_msg_conn **a, fl_msg_conn **b) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    if (!sealed) {
        fl_msg_config c = config(2, TOKEN, 0, LONG_S);
        CHECK_OK(fl_msg_conn_from_fd(sv[0], &c, "peer a", a));
        CHECK_OK(fl_msg_conn_from_fd(sv[1], &c, "peer b", b));
        return;
    }
    fl_hs_session sa = {.encrypt = true, .cipher = cipher}, sb;
    CHECK_OK(fl_crypto_random(sa.tx, sizeof sa.tx));
    CHECK_OK(fl_crypto_random(sa.rx, sizeof sa.rx));
    sb = sa;
    memcpy(sb.tx, sa.rx, sizeof sb.tx);
    memcpy(sb.rx, sa.tx, sizeof sb.rx);
    CHECK_OK(fl_msg_conn_create(sv[0], LONG_S, "peer a", &sa, a));
    CHECK_OK(fl_msg_conn_create(sv[1], LONG_S, "peer b", &sb, b));
    CHECK(sa.encrypt == false); /* the session was wiped */
}

static const size_t SIZES[] = {0, 1, 2, 7, 24, 4095, 65537, 3 * MIB + 5};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

typedef struct {
    fl_msg_conn *m;
    int          salt, rc;
} sender;

/* Sends every size of SIZES as three parts split at uneven places (and one empty part). */
static void *send_sizes(void *arg) {
    sender *s = arg;
    uint8_t *b = malloc(3 * MIB + 5);
    for (size_t k = 0; k < NSIZES && s->rc == 0; k++) {
        size_t n = SIZES[k], cut1 = n / 3, cut2 = n - n / 5;
        fill(b, n, s->salt + (int)k);
        fl_msg_part parts[4] = {
            {b, cut1}, {NULL, 0}, {b + cut1, cut2 - cut1}, {b + cut2, n - cut2}};
        s->rc = fl_msg_sendv(s->m, parts, 4);
    }
    free(b);
    return NULL;
}

/* Receives what send_sizes sends; 1 when all came intact. */
static int recv_sizes(fl_msg_conn *m, int salt);

typedef struct {
    fl_msg_conn *m;
    int          salt, ok;
} receiver;

static void *recv_main(void *arg) {
    receiver *r = arg;
    r->ok = recv_sizes(r->m, r->salt);
    return NULL;
}

static int recv_sizes(fl_msg_conn *m, int salt) {
    void *buf = NULL;
    size_t cap = 0, n = 0;
    int ok = 1;
    for (size_t k = 0; k < NSIZES; k++) {
        int rc = fl_msg_recv(m, &buf, &cap, &n, -1);
        if (rc != 1) {
            fprintf(stderr, "message %zu: %d %s\n", k, rc, fl_errmsg());
            ok = 0;
            break;
        }
        if (n != SIZES[k] || cap < n || !intact(buf, n, salt + (int)k))
            ok = 0;
    }
    free(buf);
    return ok;
}

static void test_sizes(bool sealed, fl_aead_cipher cipher) {
    fl_msg_conn *a, *b;
    make_pair(sealed, cipher, &a, &b);
    CHECK(fl_msg_encrypted(a) == sealed && fl_msg_encrypted(b) == sealed);
    CHECK(strcmp(fl_msg_peer_name(a), "peer a") == 0 && fl_msg_fd(a) >= 0);
    /* both directions at once: on each connection a sender and a receiver thread */
    sender sa = {.m = a, .salt = 1}, sb = {.m = b, .salt = 50};
    receiver ra = {.m = a, .salt = 50};
    pthread_t ta, tb, tr;
    pthread_create(&ta, NULL, send_sizes, &sa);
    pthread_create(&tb, NULL, send_sizes, &sb);
    pthread_create(&tr, NULL, recv_main, &ra);
    CHECK(recv_sizes(b, 1));
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_join(tr, NULL);
    CHECK(ra.ok);
    CHECK_OK(sa.rc);
    CHECK_OK(sb.rc);
    uint64_t total = 0;
    for (size_t k = 0; k < NSIZES; k++)
        total += SIZES[k];
    CHECK(fl_msg_bytes_sent(a) == total && fl_msg_bytes_received(b) == total);
    CHECK(fl_msg_bytes_sent(b) == total && fl_msg_bytes_received(a) == total);
    /* fl_msg_send is sendv with one part */
    uint8_t small[100];
    fill(small, sizeof small, 9);
    CHECK_OK(fl_msg_send(a, small, sizeof small));
    void *buf = NULL;
    size_t cap = 0, n = 0;
    CHECK(fl_msg_recv(b, &buf, &cap, &n, -1) == 1 && n == sizeof small && intact(buf, n, 9));
    /* too long to send: refused before anything goes */
    fl_msg_part huge[2] = {{small, FL_MSG_MAX_BYTES}, {small, 1}};
    CHECK_RC(fl_msg_sendv(a, huge, 2), FL_EINVAL);
    CHECK_MSG("peer a");
    CHECK_OK(fl_msg_send(a, small, 3)); /* still fine */
    CHECK(fl_msg_recv(b, &buf, &cap, &n, -1) == 1 && n == 3);
    free(buf);
    fl_msg_close(a);
    fl_msg_close(b);
}

/* Raw frames for tests: an end of a socketpair the test writes to, read by a connection. */
typedef struct {
    int          raw; /* the test's end */
    fl_msg_conn *m;   /* reads from the other end */
} rig;

static rig rig_make(const char *name) {
    int sv[2];
    rig r = {-1, NULL};
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    fl_msg_config c = config(2, TOKEN, 0, LONG_S);
    CHECK_OK(fl_msg_conn_from_fd(sv[1], &c, name, &r.m));
    r.raw = sv[0];
    return r;
}

static void rig_free(rig *r) {
    fl_msg_close(r->m);
    close(r->raw);
}

static void put(int fd, const void *p, size_t n) {
    CHECK(write(fd, p, n) == (ssize_t)n);
}

/* A DATA frame in the clear: header and n pattern bytes in out (HDR + n). */
static size_t frame(uint8_t *out, uint64_t seq, size_t n, int salt) {
    fl_wire_frame_encode(out, FL_WIRE_DATA, seq, n);
    fill(out + FL_WIRE_FRAME_SIZE, n, salt);
    return FL_WIRE_FRAME_SIZE + n;
}

typedef struct {
    int            fd;
    const uint8_t *bytes;
    size_t         n;
    atomic_int    *gate; /* if set: the last byte waits until it is nonzero */
} trickle;

static void *trickle_main(void *arg) {
    trickle *t = arg;
    for (size_t i = 0; i < t->n; i++) {
        for (int w = 0; t->gate && i + 1 == t->n && !atomic_load(t->gate) && w < 30000; w++)
            usleep(1000);
        if (write(t->fd, t->bytes + i, 1) != 1)
            break;
        if (i % 16 == 0)
            usleep(100);
    }
    return NULL;
}

/* A message arriving a byte at a time, received by a poll loop with timeout 0 (so most calls
 * time out in the middle of it), then one received with the connection's timeout. */
static void test_partial(void) {
    rig r = rig_make("peer p");
    enum { N = 3000 };
    uint8_t f[2][FL_WIRE_FRAME_SIZE + N];
    size_t len0 = frame(f[0], 0, N, 3), len1 = frame(f[1], 1, N - 1, 4);
    atomic_int gate = 0; /* the message is never whole before a call timed out in it */
    trickle t = {r.raw, f[0], len0, &gate};
    pthread_t th;
    pthread_create(&th, NULL, trickle_main, &t);
    void *buf = NULL;
    size_t cap = 0, n = 0;
    int rc, timeouts = 0, others = 0;
    while ((rc = fl_msg_recv(r.m, &buf, &cap, &n, 0)) == FL_ETIMEOUT) {
        timeouts++;
        atomic_store(&gate, 1);
        if (buf) /* between calls the buffer is the caller's to scribble on */
            memset(buf, 0xee, cap);
        if (timeouts % 7 == 0) { /* a fresh buffer now and then: the message must not care */
            void *other = malloc(10);
            free(buf);
            buf = other;
            cap = 10;
        }
        struct pollfd p = {.fd = fl_msg_fd(r.m), .events = POLLIN};
        if (poll(&p, 1, (int)(LONG_S * 1000)) != 1)
            others++;
    }
    pthread_join(th, NULL);
    CHECK(rc == 1 && n == N && intact(buf, n, 3) && others == 0);
    CHECK(timeouts > 0);
    t.bytes = f[1];
    t.n = len1;
    t.gate = NULL;
    pthread_create(&th, NULL, trickle_main, &t);
    CHECK(fl_msg_recv(r.m, &buf, &cap, &n, -1) == 1 && n == N - 1 && intact(buf, n, 4));
    pthread_join(th, NULL);
    free(buf);
    rig_free(&r);
}

/* Timeouts in each place a message can stop: nothing, part of the header, part of the payload;
 * the caller's buffer stays the caller's, and the message arrives whole afterwards. */
static void test_timeouts(void) {
    rig r = rig_make("peer t");
    void *buf = malloc(16), *orig = buf;
    size_t cap = 16, n = 0;
    memset(buf, 0x5a, 16);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &n, 0.05), FL_ETIMEOUT);
    CHECK_MSG("no message from peer t");
    uint8_t f[FL_WIRE_FRAME_SIZE + 100];
    size_t len = frame(f, 0, 100, 5);
    put(r.raw, f, 10);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &n, 0.02), FL_ETIMEOUT);
    CHECK_MSG("part of a frame header");
    put(r.raw, f + 10, 40);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &n, 0), FL_ETIMEOUT);
    CHECK_MSG("peer t sent 26 of a 100-byte message");
    CHECK(buf == orig || cap >= 100); /* grown (realloc) or not, it is still ours */
    void *other = NULL; /* the rest arrives into another buffer */
    size_t ocap = 0;
    CHECK_RC(fl_msg_recv(r.m, &other, &ocap, &n, 0), FL_ETIMEOUT);
    put(r.raw, f + 50, len - 50);
    CHECK(fl_msg_recv(r.m, &other, &ocap, &n, 0) == 1);
    CHECK(n == 100 && ocap >= 100 && intact(other, n, 5));
    free(buf); /* the first buffer was never taken */
    free(other);
    rig_free(&r);
}

/* Clean closes are 0 (again and again); a peer that goes without a goodbye is FL_EPEER. */
static void test_close(bool sealed) {
    fl_msg_conn *a, *b;
    make_pair(sealed, FL_AEAD_CHACHA20POLY1305, &a, &b);
    void *buf = NULL;
    size_t cap = 0, n = 0;
    CHECK_OK(fl_msg_send(a, "last", 4));
    fl_msg_close(a);
    CHECK(fl_msg_recv(b, &buf, &cap, &n, -1) == 1 && n == 4 && memcmp(buf, "last", 4) == 0);
    CHECK(fl_msg_recv(b, &buf, &cap, &n, -1) == 0);
    CHECK(fl_msg_recv(b, &buf, &cap, &n, 0) == 0);
    fl_msg_close(b);

    rig r = rig_make("worker 3 (10.0.0.3:41234)");
    close(r.raw); /* no goodbye */
    r.raw = -1;
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &n, -1), FL_EPEER);
    CHECK_MSG("worker 3 (10.0.0.3:41234) closed the connection without a goodbye");
    fl_msg_close(r.m);

    r = rig_make("peer c");
    uint8_t f[FL_WIRE_FRAME_SIZE + 10];
    put(r.raw, f, frame(f, 0, 10, 1) - 3);
    close(r.raw);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &n, -1), FL_EPEER);
    CHECK_MSG("peer c closed the connection in the middle of a message");
    fl_msg_close(r.m);
    free(buf);
}

/* After one good message, writes bytes (a broken frame) to a fresh rig and expects FL_EPEER
 * naming the peer, with needle. */
static void expect_broken(const uint8_t *bytes, size_t n, const char *needle) {
    rig r = rig_make("server 1 (127.0.0.1:6170)");
    uint8_t f[FL_WIRE_FRAME_SIZE + 5];
    put(r.raw, f, frame(f, 0, 5, 1)); /* one good message first */
    put(r.raw, bytes, n);
    void *buf = NULL;
    size_t cap = 0, len = 0;
    CHECK(fl_msg_recv(r.m, &buf, &cap, &len, -1) == 1 && len == 5);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &len, -1), FL_EPEER);
    CHECK_MSG("server 1 (127.0.0.1:6170)");
    CHECK_MSG(needle);
    CHECK_RC(fl_msg_recv(r.m, &buf, &cap, &len, 0), FL_EPEER); /* and it stays broken */
    CHECK_MSG(needle);
    CHECK(cap < 1000); /* nothing was allocated for what a broken header announced */
    free(buf);
    rig_free(&r);
}

static void test_broken_frames(void) {
    uint8_t h[FL_WIRE_FRAME_SIZE];
    fl_wire_frame_encode(h, FL_WIRE_DATA, 1, 10);
    h[0] = 'X';
    expect_broken(h, sizeof h, "sent a malformed frame: bad magic");
    fl_wire_frame_encode(h, 9, 1, 10);
    expect_broken(h, sizeof h, "unknown frame type 9");
    fl_wire_frame_encode(h, FL_WIRE_DATA, 1, (uint64_t)FL_MSG_MAX_BYTES + 1);
    expect_broken(h, sizeof h, "a message of 2147483649 bytes, more than the 2147483648");
    fl_wire_frame_encode(h, FL_WIRE_DATA, 0, 10); /* the first message again */
    expect_broken(h, sizeof h, "sent message 0 where 1 was next: replayed, reordered");
    fl_wire_frame_encode(h, FL_WIRE_DATA, 2, 10); /* one skipped */
    expect_broken(h, sizeof h, "sent message 2 where 1 was next");
    fl_wire_frame_encode(h, FL_WIRE_KEEPALIVE, 1, 4);
    expect_broken(h, sizeof h, "keepalive of 4 bytes");
    uint8_t ab[FL_WIRE_FRAME_SIZE + 6];
    fl_wire_frame_encode(ab, FL_WIRE_ABORT, 1, 6);
    memcpy(ab + FL_WIRE_FRAME_SIZE, "oops\n!", 6);
    expect_broken(ab, sizeof ab, "gave up: oops?!");

    /* a keepalive uses up no sequence number and is no message */
    rig r = rig_make("peer k");
    uint8_t f[FL_WIRE_FRAME_SIZE + 8];
    fl_wire_frame_encode(h, FL_WIRE_KEEPALIVE, 0, 0);
    put(r.raw, h, sizeof h);
    put(r.raw, f, frame(f, 0, 8, 2));
    void *buf = NULL;
    size_t cap = 0, n = 0;
    CHECK(fl_msg_recv(r.m, &buf, &cap, &n, -1) == 1 && n == 8 && intact(buf, 8, 2));
    fl_wire_frame_encode(h, FL_WIRE_DATA, 1, 0); /* an empty message in the clear */
    put(r.raw, h, sizeof h);
    CHECK(fl_msg_recv(r.m, &buf, &cap, &n, -1) == 1 && n == 0);
    free(buf);
    rig_free(&r);
}

/* ---------------------------------------------------------------- sealed frames in transit */

/* A sealed connection whose frames the test carries by hand: a -> (capture) -> b. */
typedef struct {
    fl_msg_conn *a, *b;
    int          a_far, b_near; /* the socket a writes into (read here), the one b reads */
} relay;

static relay relay_make(void) {
    int sa[2], sb[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sa) == 0);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sb) == 0);
    fl_hs_session s1 = {.encrypt = true, .cipher = FL_AEAD_AES256GCM}, s2;
    fl_crypto_random(s1.tx, sizeof s1.tx);
    fl_crypto_random(s1.rx, sizeof s1.rx);
    s2 = s1;
    memcpy(s2.tx, s1.rx, sizeof s2.tx);
    memcpy(s2.rx, s1.tx, sizeof s2.rx);
    relay r = {.a_far = sa[1], .b_near = sb[0]};
    CHECK_OK(fl_msg_conn_create(sa[0], LONG_S, "a", &s1, &r.a));
    CHECK_OK(fl_msg_conn_create(sb[1], LONG_S, "server 1 (127.0.0.1:6170)", &s2, &r.b));
    return r;
}

static void relay_free(relay *r) {
    fl_msg_close(r->a);
    fl_msg_close(r->b);
    close(r->a_far);
    close(r->b_near);
}

/* a sends n pattern bytes; the sealed frame (HDR + n + TAG bytes) lands in out. */
static size_t capture(relay *r, size_t n, int salt, uint8_t *out) {
    uint8_t msg[256];
    fill(msg, n, salt);
    CHECK_OK(fl_msg_send(r->a, msg, n));
    size_t want = FL_WIRE_FRAME_SIZE + n + FL_CRYPTO_TAG, got = 0;
    while (got < want) {
        ssize_t k = read(r->a_far, out + got, want - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    CHECK(got == want);
    uint8_t clear[256];
    fill(clear, n, salt);
    CHECK(n < 8 || memmem(out, want, clear, 8) == NULL); /* sealed, not in the clear */
    return want;
}

static void expect_auth_failure(relay *r, const char *needle) {
    void *buf = NULL;
    size_t cap = 0, n = 0;
    CHECK_RC(fl_msg_recv(r->b, &buf, &cap, &n, -1), FL_EPEER);
    CHECK_MSG(needle);
    free(buf);
}

static void test_sealed_in_transit(void) {
    const char *AUTH = "message from server 1 (127.0.0.1:6170) failed authentication: altered, "
                       "reordered or replayed";
    uint8_t f0[256], f1[256], f2[256];
    void *buf = NULL;
    size_t cap = 0, n = 0;
    /* carried faithfully: fine, also an empty message */
    relay r = relay_make();
    size_t n0 = capture(&r, 40, 1, f0), n1 = capture(&r, 0, 0, f1);
    put(r.b_near, f0, n0);
    put(r.b_near, f1, n1);
    CHECK(fl_msg_recv(r.b, &buf, &cap, &n, -1) == 1 && n == 40 && intact(buf, 40, 1));
    CHECK(fl_msg_recv(r.b, &buf, &cap, &n, -1) == 1 && n == 0);
    relay_free(&r);
    /* one bit flipped in the payload, or in the tag */
    for (int where = 0; where < 2; where++) {
        r = relay_make();
        n0 = capture(&r, 40, 1, f0);
        f0[where == 0 ? FL_WIRE_FRAME_SIZE + 17 : n0 - 1] ^= 0x10;
        put(r.b_near, f0, n0);
        expect_auth_failure(&r, AUTH);
        relay_free(&r);
    }
    /* replayed as it was: its sequence number gives it away */
    r = relay_make();
    n0 = capture(&r, 40, 1, f0);
    put(r.b_near, f0, n0);
    put(r.b_near, f0, n0);
    CHECK(fl_msg_recv(r.b, &buf, &cap, &n, -1) == 1);
    expect_auth_failure(&r, "sent message 0 where 1 was next: replayed, reordered or lost");
    relay_free(&r);
    /* replayed renumbered (seq 0 -> 1): the sequence number is the nonce, so it fails */
    r = relay_make();
    n0 = capture(&r, 40, 1, f0);
    n1 = capture(&r, 40, 2, f1);
    put(r.b_near, f0, n0);
    f0[8] = 1;
    put(r.b_near, f0, n0);
    CHECK(fl_msg_recv(r.b, &buf, &cap, &n, -1) == 1);
    expect_auth_failure(&r, AUTH);
    relay_free(&r);
    /* two messages swapped, each renumbered to fit */
    r = relay_make();
    n0 = capture(&r, 30, 1, f0);
    n1 = capture(&r, 30, 2, f1);
    f1[8] = 0;
    put(r.b_near, f1, n1);
    expect_auth_failure(&r, AUTH);
    relay_free(&r);
    /* a forged goodbye: an unsealed empty ABORT cannot end a sealed connection quietly */
    r = relay_make();
    n0 = capture(&r, 10, 1, f0);
    uint8_t bye[FL_WIRE_FRAME_SIZE + FL_CRYPTO_TAG] = {0};
    fl_wire_frame_encode(bye, FL_WIRE_ABORT, 0, 0);
    put(r.b_near, bye, sizeof bye);
    expect_auth_failure(&r, "goodbye from server 1 (127.0.0.1:6170) failed authentication");
    relay_free(&r);
    /* an injected keepalive: nothing seals it, so a sealed connection refuses it */
    r = relay_make();
    uint8_t ka[FL_WIRE_FRAME_SIZE];
    fl_wire_frame_encode(ka, FL_WIRE_KEEPALIVE, 0, 0);
    put(r.b_near, ka, sizeof ka);
    expect_auth_failure(&r, "server 1 (127.0.0.1:6170) sent an unauthenticated keepalive on an "
                            "encrypted message connection");
    relay_free(&r);
    /* sealed bytes a byte at a time */
    r = relay_make();
    size_t n2 = capture(&r, 200, 7, f2);
    trickle t = {r.b_near, f2, n2, NULL};
    pthread_t th;
    pthread_create(&th, NULL, trickle_main, &t);
    CHECK(fl_msg_recv(r.b, &buf, &cap, &n, -1) == 1 && n == 200 && intact(buf, 200, 7));
    pthread_join(th, NULL);
    relay_free(&r);
    free(buf);
}

/* ---------------------------------------------------------------- real sockets */

/* A listening socket on 127.0.0.1, port chosen by the kernel (listen now or later). */
static int listen_any(int *port, bool now) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || (now && listen(s, 64) < 0) ||
        getsockname(s, (struct sockaddr *)&a, &len) < 0) {
        perror("listen_any");
        exit(1);
    }
    *port = ntohs(a.sin_port);
    return s;
}

typedef struct {
    fl_msg_config c;
    int           rank, server, rc, fails;
    char          endpoint[FL_ENDPOINT_MAX], msg[512];
    fl_msg_conn  *m;
    bool          exchange, encrypted;
} client;

/* Connects; with exchange, sends "hello from r" and expects the reply "welcome r". */
static void *client_main(void *arg) {
    client *k = arg;
    k->rc = fl_msg_connect(&k->c, k->rank, k->server, k->endpoint, &k->m);
    if (k->rc < 0) {
        snprintf(k->msg, sizeof k->msg, "%s", fl_errmsg());
        return NULL;
    }
    k->encrypted = fl_msg_encrypted(k->m);
    if (!k->exchange)
        return NULL;
    char out[64], want[64];
    snprintf(out, sizeof out, "hello from %d", k->rank);
    snprintf(want, sizeof want, "welcome %d", k->rank);
    void *buf = NULL;
    size_t cap = 0, n = 0;
    if (fl_msg_send(k->m, out, strlen(out)) < 0 ||
        fl_msg_recv(k->m, &buf, &cap, &n, -1) != 1 || n != strlen(want) ||
        memcmp(buf, want, n) != 0) {
        fprintf(stderr, "client %d: exchange failed: %s\n", k->rank, fl_errmsg());
        k->fails++;
    }
    if (fl_msg_recv(k->m, &buf, &cap, &n, -1) != 0) { /* the server closes politely */
        fprintf(stderr, "client %d: no goodbye: %s\n", k->rank, fl_errmsg());
        k->fails++;
    }
    free(buf);
    fl_msg_close(k->m);
    k->m = NULL;
    return NULL;
}

typedef struct {
    fl_msg_listener *l;
    int              lo, hi, rc;
    fl_msg_conn     *conns[8];
    char             msg[512];
} acceptor;

static void *accept_main(void *arg) {
    acceptor *a = arg;
    a->rc = fl_msg_accept_all(a->l, a->lo, a->hi, a->conns);
    if (a->rc < 0)
        snprintf(a->msg, sizeof a->msg, "%s", fl_errmsg());
    return NULL;
}

static client client_make(int world, const char *token, int encrypt, int rank, int port) {
    client k = {.c = config(world, token, encrypt, LONG_S), .rank = rank, .exchange = true};
    snprintf(k.endpoint, sizeof k.endpoint, "127.0.0.1:%d", port);
    return k;
}

/* A server (rank 0) and three clients (ranks 1-3) exchange a message each way. late: the
 * clients dial before the server listens (they retry). */
static void test_server_clients(int server_enc, int client_enc, bool want_sealed, bool late) {
    int port, fd = listen_any(&port, !late);
    fl_msg_config c = config(4, TOKEN, server_enc, LONG_S);
    client k[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        k[i] = client_make(4, TOKEN, client_enc, i + 1, port);
        pthread_create(&th[i], NULL, client_main, &k[i]);
    }
    if (late) {
        usleep(50 * 1000); /* the clients are refused meanwhile, or not: either way works */
        CHECK(listen(fd, 64) == 0);
    }
    fl_msg_listener *l = NULL;
    CHECK_OK(fl_msg_listen(&c, 0, NULL, fd, &l));
    fl_msg_conn *conns[3] = {NULL};
    CHECK_OK(fl_msg_accept_all(l, 1, 4, conns));
    void *buf = NULL;
    size_t cap = 0, n = 0;
    for (int i = 0; i < 3 && conns[i]; i++) {
        char want[64], name[64], reply[64];
        snprintf(want, sizeof want, "hello from %d", i + 1);
        snprintf(name, sizeof name, "rank %d (127.0.0.1:", i + 1);
        CHECK(strncmp(fl_msg_peer_name(conns[i]), name, strlen(name)) == 0);
        CHECK(fl_msg_encrypted(conns[i]) == want_sealed);
        CHECK(fl_msg_recv(conns[i], &buf, &cap, &n, -1) == 1 && n == strlen(want) &&
              memcmp(buf, want, n) == 0);
        snprintf(reply, sizeof reply, "welcome %d", i + 1);
        fl_msg_set_name(conns[i], "worker x");
        CHECK(strcmp(fl_msg_peer_name(conns[i]), "worker x") == 0);
        CHECK_OK(fl_msg_send(conns[i], reply, strlen(reply)));
        CHECK(fl_msg_bytes_received(conns[i]) == strlen(want));
    }
    for (int i = 0; i < 3; i++)
        fl_msg_close(conns[i]);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(k[i].rc == 0 && k[i].fails == 0);
        if (k[i].rc)
            fprintf(stderr, "client %d: %s\n", i + 1, k[i].msg);
        CHECK(k[i].encrypted == want_sealed);
    }
    free(buf);
    fl_msg_listener_free(l);
}

/* Runs fn with stderr going to a file; returns what was logged (caller frees). */
static char *logged_during(void (*fn)(void *), void *arg) {
    char path[] = "/tmp/test_msgconn_log_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    fflush(stderr);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)size + 1);
    if (pread(fd, text, (size_t)size, 0) != size)
        text[0] = '\0';
    close(fd);
    unlink(path);
    fputs(text, stderr); /* still shown */
    return text;
}

typedef struct {
    int port;
    int failures;
    char wrong_msg[512];
    int hs_status;
    uint32_t theirs;
} intruders;

/* While the server waits for ranks 1 and 2: a client with the wrong token, a collective rank's
 * hello, then the right clients. */
static void intrude(void *arg) {
    intruders *x = arg;
    int fd = listen_any(&x->port, true);
    fl_msg_config c = config(3, TOKEN, 0, LONG_S);
    fl_msg_listener *l = NULL;
    CHECK_OK(fl_msg_listen(&c, 0, NULL, fd, &l));
    acceptor a = {.l = l, .lo = 1, .hi = 3};
    pthread_t th;
    pthread_create(&th, NULL, accept_main, &a);

    client wrong = client_make(3, "another-jobs-token", 0, 1, x->port);
    client_main(&wrong);
    CHECK_RC(wrong.rc, FL_EPEER);
    snprintf(x->wrong_msg, sizeof x->wrong_msg, "%s", wrong.msg);

    /* a collective-transport rank (hello flags 0) dialling the server's port */
    fl_hs_config hs;
    CHECK_OK(fl_hs_config_init(&hs, TOKEN, 0, 0));
    char ep[32], reason[160] = "";
    snprintf(ep, sizeof ep, "127.0.0.1:%d", x->port);
    struct sockaddr_storage ss;
    socklen_t len;
    CHECK_OK(fl_net_resolve(ep, "test", &ss, &len));
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(connect(s, (struct sockaddr *)&ss, len) == 0);
    CHECK(fl_net_set_nonblock(s) == 0);
    x->hs_status = fl_hs_connect_blocking(s, &hs, FL_WIRE_FLAG_COLLECTIVE, 2, 3, 0, NULL, 0,
                                          fl_now() + LONG_S, &x->theirs, NULL, reason,
                                          sizeof reason);
    close(s);
    fl_hs_config_wipe(&hs);

    client k[2] = {client_make(3, TOKEN, 0, 1, x->port), client_make(3, TOKEN, 0, 2, x->port)};
    pthread_t tk[2];
    for (int i = 0; i < 2; i++) {
        k[i].exchange = false;
        pthread_create(&tk[i], NULL, client_main, &k[i]);
    }
    pthread_join(th, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(tk[i], NULL);
    CHECK_OK(a.rc);
    if (a.rc)
        fprintf(stderr, "accept_all: %s\n", a.msg);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(k[i].rc);
        if (a.rc == 0 && k[i].rc == 0) { /* the pairs talk */
            void *buf = NULL;
            size_t cap = 0, n = 0;
            CHECK_OK(fl_msg_send(k[i].m, "x", 1));
            CHECK(fl_msg_recv(a.conns[i], &buf, &cap, &n, -1) == 1 && n == 1);
            free(buf);
        }
    }
    /* after set-up a newcomer, even with the right token, is refused */
    client late = client_make(3, TOKEN, 0, 2, x->port);
    late.c.timeout_s = 5;
    client_main(&late);
    CHECK_RC(late.rc, FL_EPEER);
    CHECK(strstr(late.msg, "rank already connected") != NULL);
    if (!strstr(late.msg, "rank already connected"))
        fprintf(stderr, "late client: %s\n", late.msg);
    for (int i = 0; i < 2; i++) {
        fl_msg_close(k[i].m);
        fl_msg_close(a.conns[i]);
    }
    fl_msg_listener_free(l);
}

static void test_refusals(void) {
    intruders x = {0};
    char *log = logged_during(intrude, &x);
    CHECK(strstr(x.wrong_msg, "server 0 (127.0.0.1:") != NULL);
    CHECK(strstr(x.wrong_msg, "job token") != NULL && strstr(x.wrong_msg, "FLEET_JOB_TOKEN"));
    CHECK(x.hs_status == FL_WIRE_BAD_FLAGS && x.theirs == FL_WIRE_BAD_FLAGS);
    CHECK(strstr(log, "not a message connection (handshake flags 0x0: a collective-transport "
                      "peer)") != NULL);
    free(log);
}

/* A message client dialling a collective rank's listener is refused by it, and says so. */
static void test_collective_port(void) {
    int port, fd = listen_any(&port, true);
    fl_hs_config hs;
    CHECK_OK(fl_hs_config_init(&hs, TOKEN, 0, 0));
    fl_listener *l = NULL;
    CHECK_OK(fl_listener_create(fd, 0, 2, &hs, FL_WIRE_FLAG_COLLECTIVE, 0, &l));
    fl_hs_config_wipe(&hs);
    CHECK_OK(fl_listener_start(l));
    client k = client_make(2, TOKEN, 0, 1, port);
    client_main(&k);
    CHECK_RC(k.rc, FL_EPEER);
    CHECK(strstr(k.msg, "server 0 (127.0.0.1:") && strstr(k.msg, "not a message listener"));
    if (k.rc == 0 || !strstr(k.msg, "not a message listener"))
        fprintf(stderr, "client: %s\n", k.msg);
    fl_listener_free(l);
}

/* accept_all gives up after the timeout naming who never came, and keeps nothing. */
static void test_missing(void) {
    int port, fd = listen_any(&port, true);
    fl_msg_config c = config(5, TOKEN, 0, 0.3);
    fl_msg_listener *l = NULL;
    CHECK_OK(fl_msg_listen(&c, 0, NULL, fd, &l));
    fl_msg_conn *conns[4] = {NULL};
    CHECK_RC(fl_msg_accept_all(l, 1, 5, conns), FL_ETIMEOUT);
    CHECK_MSG("server 0 (127.0.0.1:");
    CHECK_MSG("no client connected as rank 1, 2, 3, 4 within 0.3 s");
    fl_msg_listener_free(l);

    /* one of them came: the others are named. The client is in time on any sane machine;
     * if it is not, the message must say so, so only what happened is checked. */
    fd = listen_any(&port, true);
    c.timeout_s = 1;
    CHECK_OK(fl_msg_listen(&c, 0, NULL, fd, &l));
    client k = client_make(5, TOKEN, 0, 2, port);
    k.exchange = false;
    k.c.timeout_s = 3;
    pthread_t th;
    pthread_create(&th, NULL, client_main, &k);
    CHECK_RC(fl_msg_accept_all(l, 1, 5, conns), FL_ETIMEOUT);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fl_errmsg());
    CHECK(!conns[0] && !conns[1] && !conns[2] && !conns[3]);
    fl_msg_listener_free(l);
    pthread_join(th, NULL);
    CHECK(strstr(msg, k.rc == 0 ? "no client connected as rank 1, 3, 4 within 1 s"
                                : "no client connected as rank 1, 2, 3, 4 within 1 s"));
    if (k.rc == 0) { /* its connection was closed, politely */
        void *buf = NULL;
        size_t cap = 0, n = 0;
        CHECK(fl_msg_recv(k.m, &buf, &cap, &n, -1) == 0);
        free(buf);
        fl_msg_close(k.m);
    }

    /* nobody listening at all: the client gives up after its timeout, naming the server */
    fd = listen_any(&port, false); /* bound, never listening: connections are refused */
    client none = client_make(2, TOKEN, 0, 1, port);
    none.c.timeout_s = 0.3;
    client_main(&none);
    CHECK_RC(none.rc, FL_ETIMEOUT);
    CHECK(strstr(none.msg, "cannot reach server 0 (127.0.0.1:") != NULL);
    close(fd);
}

/* Bad arguments are configuration errors with a message, not crashes. */
static void test_config(void) {
    fl_msg_config c = config(3, "", 0, 1);
    fl_msg_conn *m = NULL;
    fl_msg_listener *l = NULL;
    CHECK_RC(fl_msg_connect(&c, 1, 0, "127.0.0.1:9", &m), FL_ECONFIG);
    CHECK_MSG("no job token");
    c = config(3, TOKEN, 0, 1);
    CHECK_RC(fl_msg_connect(&c, 1, 1, "127.0.0.1:9", &m), FL_ECONFIG);
    CHECK_MSG("rank 1 cannot dial rank 1");
    CHECK_RC(fl_msg_connect(&c, 3, 0, "127.0.0.1:9", &m), FL_ECONFIG);
    CHECK_RC(fl_msg_connect(&c, 1, 0, "127.0.0.1", &m), FL_ECONFIG);
    CHECK_MSG("server 0's endpoint");
    CHECK_RC(fl_msg_listen(&c, 0, "nonsense", -1, &l), FL_ECONFIG);
    CHECK(l == NULL && m == NULL);
    fl_msg_close(NULL);
    fl_msg_listener_free(NULL);
}

int main(void) {
    test_config();
    test_sizes(false, FL_AEAD_AES256GCM);
    test_sizes(true, FL_AEAD_AES256GCM);
    test_sizes(true, FL_AEAD_CHACHA20POLY1305);
    test_partial();
    test_timeouts();
    test_close(false);
    test_close(true);
    test_broken_frames();
    test_sealed_in_transit();
    /* loopback: auto leaves it in the clear; on, asked by either side, seals both ways */
    test_server_clients(FL_COMM_ENCRYPT_AUTO, FL_COMM_ENCRYPT_AUTO, false, false);
    test_server_clients(FL_COMM_ENCRYPT_ON, FL_COMM_ENCRYPT_AUTO, true, true);
    test_server_clients(FL_COMM_ENCRYPT_AUTO, FL_COMM_ENCRYPT_ON, true, false);
    test_server_clients(FL_COMM_ENCRYPT_OFF, FL_COMM_ENCRYPT_OFF, false, false);
    test_refusals();
    test_collective_port();
    test_missing();
    if (test_failures)
        fprintf(stderr, "%d check(s) failed\n", test_failures);
    return test_failures ? 1 : 0;
}
