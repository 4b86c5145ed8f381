/* test_handshake.c - the challenge-response handshake (src/comm/handshake.c, wire protocol 2)
 * against a real listener on loopback (a port the kernel picks, so parallel tests cannot
 * collide): an honest connector gets in and both sides hold the same keys; the bytes that
 * cross hold neither the token nor a key; a wrong token, a replayed handshake, a reflected
 * MAC and an old protocol version are refused, with the version named, while the listener
 * goes on serving the real peers. */
#include "test.h"

#include "comm/handshake.h"
#include "comm/listener.h"
#include "comm/net.h"
#include "comm/transport.h"
#include "comm/wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOKEN "handshake-test-token-5d41402abc4b2a76"

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

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 5};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        close(s);
        return -1;
    }
    return s;
}

/* ---- a listener (rank 0 of 4) driven by its own poll loop, as fl_connect_all drives it ---- */
typedef struct {
    fl_listener  *l;
    int           port;
    atomic_int    stop, accepted;
    int           fds[4];
    fl_hs_session ses[4];
} server;

static void *server_main(void *arg) {
    server *sv = arg;
    struct pollfd pfd[FL_LISTENER_POLLFDS];
    while (!atomic_load(&sv->stop)) {
        double wake = fl_now() + 0.05;
        int n = fl_listener_pollfds(sv->l, pfd, &wake);
        poll(pfd, (nfds_t)n, fl_net_poll_ms(wake));
        fl_listener_handle(sv->l, pfd, n);
        int r, fd;
        fl_hs_session s;
        while ((fd = fl_listener_take(sv->l, &r, NULL, &s)) >= 0) {
            sv->fds[r] = fd;
            sv->ses[r] = s;
            atomic_fetch_add(&sv->accepted, 1);
        }
    }
    return NULL;
}

static void server_start(server *sv, pthread_t *th, int encrypt) {
    memset(sv, 0, sizeof *sv);
    fl_hs_config hs;
    CHECK(fl_hs_config_init(&hs, TOKEN, 0, encrypt) == 0);
    CHECK(fl_listener_create(listen_any(&sv->port), 0, 4, &hs, 0, 0, &sv->l) == 0);
    fl_hs_config_wipe(&hs);
    for (int r = 0; r < 4; r++)
        sv->fds[r] = -1;
    pthread_create(th, NULL, server_main, sv);
}

static void server_stop(server *sv, pthread_t th) {
    atomic_store(&sv->stop, 1);
    pthread_join(th, NULL);
    fl_listener_free(sv->l);
    for (int r = 0; r < 4; r++)
        if (sv->fds[r] >= 0)
            close(sv->fds[r]);
}

static bool wait_accepted(server *sv, int n) {
    for (int i = 0; i < 300 && atomic_load(&sv->accepted) < n; i++)
        usleep(10000);
    return atomic_load(&sv->accepted) == n;
}

/* ---- a connector by hand, recording what crosses ---- */
typedef struct {
    uint8_t sent[FL_WIRE_HELLO_SIZE + FL_WIRE_AUTH_SIZE];
    uint8_t got[FL_WIRE_CHALLENGE_SIZE + FL_WIRE_REPLY_SIZE];
    size_t  got_n;
} record;

enum { HONEST, REPLAY, REFLECT };

static bool read_n(int s, uint8_t *b, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t k = recv(s, b + got, n - got, 0);
        if (k <= 0)
            return false;
        got += (size_t)k;
    }
    return true;
}

/* Runs the connector's side as rank `rank` with `token`; REPLAY sends old->sent instead of a
 * fresh hello and proof, REFLECT proves with the acceptor's own MAC. Returns the status the
 * listener answered (FL_WIRE_OK: accepted), -1 when it closed without one. */
static int by_hand(int port, const char *token, uint32_t rank, int how, const record *old,
                   record *rec) {
    fl_hs_config hs;
    fl_hs_config_init(&hs, token, 0, 0);
    int s = dial(port), st = -1;
    if (s < 0)
        return -2;
    fl_hs_transcript t = {.size = 4, .rank_c = rank, .rank_a = 0};
    fl_wire_hello h = {.rank = rank, .size = 4};
    fl_crypto_random(h.nonce, sizeof h.nonce);
    memcpy(t.nonce_c, h.nonce, sizeof h.nonce);
    fl_wire_hello_encode(rec->sent, &h);
    if (how == REPLAY)
        memcpy(rec->sent, old->sent, FL_WIRE_HELLO_SIZE);
    uint32_t theirs = FL_WIRE_OK;
    fl_wire_challenge c;
    rec->got_n = 0;
    if (send(s, rec->sent, FL_WIRE_HELLO_SIZE, MSG_NOSIGNAL) != FL_WIRE_HELLO_SIZE ||
        !read_n(s, rec->got, FL_WIRE_REPLY_SIZE))
        goto done;
    rec->got_n = FL_WIRE_REPLY_SIZE;
    st = fl_wire_challenge_parse(rec->got, FL_WIRE_REPLY_SIZE, 0, &theirs, &c, NULL, 0);
    if (st != FL_WIRE_TRUNCATED) {
        st = theirs != FL_WIRE_OK ? (int)theirs : -1;
        goto done;
    }
    if (!read_n(s, rec->got + FL_WIRE_REPLY_SIZE, FL_WIRE_CHALLENGE_SIZE - FL_WIRE_REPLY_SIZE))
        goto done;
    rec->got_n = FL_WIRE_CHALLENGE_SIZE;
    CHECK(fl_wire_challenge_parse(rec->got, FL_WIRE_CHALLENGE_SIZE, 0, &theirs, &c, NULL, 0) ==
          FL_WIRE_OK);
    t.opt_a = c.options;
    memcpy(t.nonce_a, c.nonce, sizeof t.nonce_a);
    if (how == HONEST) /* the acceptor proved it knows the token */
        CHECK(fl_hs_check(&hs, FL_HS_ACCEPTOR, &t, c.mac) == (strcmp(token, TOKEN) == 0));
    uint8_t mac[FL_WIRE_HS_MAC];
    fl_hs_mac(&hs, FL_HS_CONNECTOR, &t, mac);
    fl_wire_auth_encode(rec->sent + FL_WIRE_HELLO_SIZE, rank, how == REFLECT ? c.mac : mac);
    if (how == REPLAY)
        memcpy(rec->sent + FL_WIRE_HELLO_SIZE, old->sent + FL_WIRE_HELLO_SIZE, FL_WIRE_AUTH_SIZE);
    st = -1;
    if (send(s, rec->sent + FL_WIRE_HELLO_SIZE, FL_WIRE_AUTH_SIZE, MSG_NOSIGNAL) !=
            FL_WIRE_AUTH_SIZE ||
        !read_n(s, rec->got + rec->got_n, FL_WIRE_REPLY_SIZE))
        goto done;
    fl_wire_reply_parse(rec->got + rec->got_n, FL_WIRE_REPLY_SIZE, 0, &theirs, NULL, 0);
    rec->got_n += FL_WIRE_REPLY_SIZE;
    st = (int)theirs;
done:
    close(s);
    fl_hs_config_wipe(&hs);
    return st;
}

static bool contains(const uint8_t *hay, size_t n, const void *needle, size_t k) {
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(hay + i, needle, k))
            return true;
    return false;
}

static void test_honest_and_keys(void) {
    for (int enc = FL_HS_ENCRYPT_AUTO; enc <= FL_HS_ENCRYPT_ON; enc++) {
        server sv;
        pthread_t th;
        server_start(&sv, &th, enc);
        fl_hs_config hs;
        CHECK(fl_hs_config_init(&hs, TOKEN, 0, FL_HS_ENCRYPT_AUTO) == 0);
        int s = dial(sv.port);
        fl_net_set_nonblock(s);
        char why[160] = "";
        uint32_t theirs;
        fl_hs_session ses;
        int st = fl_hs_connect_blocking(s, &hs, 0, 2, 4, 0, NULL, 0, fl_now() + 5, &theirs, &ses,
                                        why, sizeof why);
        if (st != FL_WIRE_OK)
            fprintf(stderr, "honest connector: %d %s\n", st, why);
        CHECK(st == FL_WIRE_OK);
        CHECK(wait_accepted(&sv, 1) && sv.fds[2] >= 0);
        /* both sides derived the same two keys, crosswise, and differ per direction */
        CHECK(!memcmp(ses.tx, sv.ses[2].rx, FL_CRYPTO_KEY));
        CHECK(!memcmp(ses.rx, sv.ses[2].tx, FL_CRYPTO_KEY));
        CHECK(memcmp(ses.tx, ses.rx, FL_CRYPTO_KEY) != 0);
        /* loopback: encrypted only when a side asks for it */
        CHECK(ses.encrypt == (enc == FL_HS_ENCRYPT_ON) && sv.ses[2].encrypt == ses.encrypt);
        CHECK(ses.automatic == (enc == FL_HS_ENCRYPT_AUTO));
        CHECK(ses.cipher == sv.ses[2].cipher);
        /* a second connection of the same rank is refused: it is connected */
        record rec;
        CHECK(by_hand(sv.port, TOKEN, 2, HONEST, NULL, &rec) == FL_WIRE_DUPLICATE);
        close(s);
        fl_hs_config_wipe(&hs);
        server_stop(&sv, th);
    }
}

static void test_refusals(void) {
    /* a handshake recorded at another listener of the same job (same token) */
    server old;
    pthread_t oth;
    server_start(&old, &oth, FL_HS_ENCRYPT_AUTO);
    record rec, rec2;
    CHECK(by_hand(old.port, TOKEN, 3, HONEST, NULL, &rec) == FL_WIRE_OK);
    CHECK(wait_accepted(&old, 1));
    /* what crossed holds neither the token (nor any 8 bytes of it) nor a key */
    for (size_t i = 0; i + 8 <= strlen(TOKEN); i++) {
        CHECK(!contains(rec.sent, sizeof rec.sent, TOKEN + i, 8));
        CHECK(!contains(rec.got, rec.got_n, TOKEN + i, 8));
    }
    CHECK(!contains(rec.sent, sizeof rec.sent, old.ses[3].tx, 8));
    CHECK(!contains(rec.got, rec.got_n, old.ses[3].rx, 8));
    fl_hs_config hs;
    fl_hs_config_init(&hs, TOKEN, 0, 0);
    CHECK(!contains(rec.sent, sizeof rec.sent, hs.auth, 8) && !contains(rec.sent, sizeof rec.sent, hs.master, 8));
    fl_hs_config_wipe(&hs);
    server_stop(&old, oth);

    server sv;
    pthread_t th;
    server_start(&sv, &th, FL_HS_ENCRYPT_AUTO);
    fl_log_set_level(FL_LOG_ERROR);
    /* replayed: the listener's fresh nonce makes the recorded proof worthless */
    CHECK(by_hand(sv.port, TOKEN, 3, REPLAY, &rec, &rec2) == FL_WIRE_BAD_TOKEN);
    /* a stranger without the token */
    CHECK(by_hand(sv.port, "not-the-token", 3, HONEST, NULL, &rec2) == FL_WIRE_BAD_TOKEN);
    CHECK(by_hand(sv.port, "", 3, HONEST, NULL, &rec2) == FL_WIRE_BAD_TOKEN);
    /* the acceptor's own MAC sent back as ours */
    CHECK(by_hand(sv.port, "not-the-token", 3, REFLECT, NULL, &rec2) == FL_WIRE_BAD_TOKEN);
    /* a peer of protocol version 1 (the token in the clear at bytes 16-79) */
    int s = dial(sv.port);
    uint8_t v1[80] = "FLET\x01\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00" TOKEN, reply[16];
    CHECK(send(s, v1, sizeof v1, MSG_NOSIGNAL) == (ssize_t)sizeof v1 && read_n(s, reply, 16));
    uint32_t theirs;
    char why[160];
    CHECK(fl_wire_reply_parse(reply, 16, 0, &theirs, why, sizeof why) == FL_WIRE_BAD_VERSION);
    CHECK(theirs == FL_WIRE_BAD_VERSION && strstr(why, "version"));
    close(s);
    fl_log_set_level(FL_LOG_INFO);
    CHECK(atomic_load(&sv.accepted) == 0);
    /* and the real rank 3 still gets in */
    CHECK(by_hand(sv.port, TOKEN, 3, HONEST, NULL, &rec2) == FL_WIRE_OK);
    CHECK(wait_accepted(&sv, 1) && sv.fds[3] >= 0);
    server_stop(&sv, th);
}

/* An acceptor of protocol version 1: refuses our hello as version 1 does. */
static void *old_acceptor(void *arg) {
    int l = *(int *)arg;
    for (int i = 0; i < 2; i++) {
        int s = accept(l, NULL, NULL);
        if (s < 0)
            return NULL;
        uint8_t in[6];
        read_n(s, in, sizeof in);
        uint8_t r[16] = "FLET\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00"; /* BAD_VERSION */
        (void)!send(s, r, sizeof r, MSG_NOSIGNAL);
        close(s);
    }
    return NULL;
}

static void test_old_acceptor(void) {
    int port, l = listen_any(&port);
    pthread_t th;
    pthread_create(&th, NULL, old_acceptor, &l);
    fl_hs_config hs;
    fl_hs_config_init(&hs, TOKEN, 0, 0);
    int s = dial(port);
    fl_net_set_nonblock(s);
    char why[160] = "";
    uint32_t theirs;
    int st = fl_hs_connect_blocking(s, &hs, 0, 1, 2, 0, NULL, 0, fl_now() + 5, &theirs, NULL,
                                    why, sizeof why);
    CHECK(st == FL_WIRE_BAD_VERSION && strstr(why, "protocol version 1, expected 2"));
    close(s);
    fl_hs_config_wipe(&hs);
    /* the transport says so naming the endpoint */
    char (*eps)[FL_ENDPOINT_MAX] = calloc(2, sizeof *eps);
    int port1, l1 = listen_any(&port1);
    snprintf(eps[0], FL_ENDPOINT_MAX, "127.0.0.1:%d", port);
    snprintf(eps[1], FL_ENDPOINT_MAX, "127.0.0.1:%d", port1);
    fl_comm_env env = {.rank = 1, .size = 2, .endpoints = eps, .timeout_s = 3, .listen_fd = l1,
                       .gpu = -1};
    snprintf(env.token, sizeof env.token, "%s", TOKEN);
    fl_transport *t = NULL;
    CHECK(fl_transport_open(&env, NULL, &t) == FL_EPEER);
    printf("old acceptor: %s\n", fl_errmsg());
    CHECK(strstr(fl_errmsg(), "version") && strstr(fl_errmsg(), eps[0]) &&
          strstr(fl_errmsg(), "rank 0"));
    fl_transport_free(t);
    pthread_join(th, NULL);
    close(l);
    close(l1);
    free(eps);
}

int main(void) {
    test_honest_and_keys();
    test_refusals();
    test_old_acceptor();
    TEST_DONE();
}
