/* handshake.c - keys, MACs and the encryption decision of the challenge-response handshake
 * (handshake.h), plus the connector's side as one blocking call for the rendezvous. The
 * nonblocking connector (connect.c) and the acceptor (listener.c) use the same pieces. */
#include "handshake.h"

#include "net.h"

#include "fleet/status.h"

#include <openssl/crypto.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static const char AUTH_SALT[] = "fleet handshake v2";

int fl_hs_config_init(fl_hs_config *c, const char *token, uint32_t round, int encrypt) {
    memset(c, 0, sizeof *c);
    const uint8_t *ikm = (const uint8_t *)(token ? token : "");
    size_t n = token ? strnlen(token, FL_WIRE_TOKEN_LEN) : 0;
    int rc = fl_crypto_hkdf(ikm, n, (const uint8_t *)AUTH_SALT, sizeof AUTH_SALT - 1,
                            (const uint8_t *)"auth", 4, c->auth, sizeof c->auth);
    if (rc == 0)
        rc = fl_crypto_hkdf(ikm, n, (const uint8_t *)AUTH_SALT, sizeof AUTH_SALT - 1,
                            (const uint8_t *)"frames", 6, c->master, sizeof c->master);
    c->round = round;
    c->encrypt = encrypt;
    c->has_aes = fl_crypto_has_aes();
    return rc;
}

void fl_hs_config_wipe(fl_hs_config *c) { OPENSSL_cleanse(c, sizeof *c); }

uint32_t fl_hs_options(const fl_hs_config *c, bool loopback) {
    uint32_t o = (uint32_t)c->encrypt & FL_WIRE_OPT_ENC_MASK;
    if (loopback)
        o |= FL_WIRE_OPT_LOOPBACK;
    if (c->has_aes)
        o |= FL_WIRE_OPT_AES;
    return o;
}

static uint8_t *put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

/* The transcript as bytes, behind a 16-byte label. Returns the length. */
#define TRANSCRIPT_MAX (16 + 4 + 7 * 4 + 2 * FL_WIRE_HS_NONCE)
static size_t serialize(const char *label, const fl_hs_transcript *t,
                        uint8_t out[TRANSCRIPT_MAX]) {
    uint8_t *p = out;
    memset(p, 0, 16);
    memcpy(p, label, strnlen(label, 16));
    p += 16;
    p = put32(p, FL_WIRE_VERSION);
    p = put32(p, t->flags);
    p = put32(p, t->size);
    p = put32(p, t->round);
    p = put32(p, t->rank_c);
    p = put32(p, t->rank_a);
    p = put32(p, t->opt_c);
    p = put32(p, t->opt_a);
    memcpy(p, t->nonce_c, FL_WIRE_HS_NONCE);
    p += FL_WIRE_HS_NONCE;
    memcpy(p, t->nonce_a, FL_WIRE_HS_NONCE);
    p += FL_WIRE_HS_NONCE;
    return (size_t)(p - out);
}

int fl_hs_mac(const fl_hs_config *c, int role, const fl_hs_transcript *t,
              uint8_t mac[FL_WIRE_HS_MAC]) {
    uint8_t msg[TRANSCRIPT_MAX];
    size_t n = serialize(role == FL_HS_ACCEPTOR ? "fleet acceptor" : "fleet connector", t, msg);
    return fl_crypto_hmac(c->auth, sizeof c->auth, msg, n, mac);
}

bool fl_hs_check(const fl_hs_config *c, int role, const fl_hs_transcript *t,
                 const uint8_t mac[FL_WIRE_HS_MAC]) {
    uint8_t want[FL_WIRE_HS_MAC];
    bool ok = fl_hs_mac(c, role, t, want) == 0 && fl_crypto_equal(want, mac, FL_WIRE_HS_MAC);
    OPENSSL_cleanse(want, sizeof want);
    return ok;
}

int fl_hs_session_make(const fl_hs_config *c, int role, const fl_hs_transcript *t,
                       fl_hs_session *out) {
    memset(out, 0, sizeof *out);
    uint32_t ec = t->opt_c & FL_WIRE_OPT_ENC_MASK, ea = t->opt_a & FL_WIRE_OPT_ENC_MASK;
    if (ec == FL_HS_ENCRYPT_ON || ea == FL_HS_ENCRYPT_ON)
        out->encrypt = true;
    else if (ec == FL_HS_ENCRYPT_OFF || ea == FL_HS_ENCRYPT_OFF)
        out->encrypt = false;
    else {
        out->automatic = true;
        out->encrypt = !(t->opt_c & FL_WIRE_OPT_LOOPBACK);
    }
    out->cipher = (t->opt_c & FL_WIRE_OPT_AES) && (t->opt_a & FL_WIRE_OPT_AES)
                      ? FL_AEAD_AES256GCM
                      : FL_AEAD_CHACHA20POLY1305;
    uint8_t salt[2 * FL_WIRE_HS_NONCE], info[TRANSCRIPT_MAX], c2a[FL_CRYPTO_KEY],
        a2c[FL_CRYPTO_KEY];
    memcpy(salt, t->nonce_c, FL_WIRE_HS_NONCE);
    memcpy(salt + FL_WIRE_HS_NONCE, t->nonce_a, FL_WIRE_HS_NONCE);
    size_t n = serialize("fleet frames c>a", t, info);
    int rc = fl_crypto_hkdf(c->master, sizeof c->master, salt, sizeof salt, info, n, c2a,
                            sizeof c2a);
    n = serialize("fleet frames a>c", t, info);
    if (rc == 0)
        rc = fl_crypto_hkdf(c->master, sizeof c->master, salt, sizeof salt, info, n, a2c,
                            sizeof a2c);
    memcpy(out->tx, role == FL_HS_CONNECTOR ? c2a : a2c, FL_CRYPTO_KEY);
    memcpy(out->rx, role == FL_HS_CONNECTOR ? a2c : c2a, FL_CRYPTO_KEY);
    OPENSSL_cleanse(c2a, sizeof c2a);
    OPENSSL_cleanse(a2c, sizeof a2c);
    return rc;
}

void fl_hs_session_wipe(fl_hs_session *s) { OPENSSL_cleanse(s, sizeof *s); }

bool fl_hs_fd_is_loopback(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
        return false;
    if (ss.ss_family == AF_UNIX)
        return true;
    if (ss.ss_family == AF_INET)
        return (ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

/* -errno of a fl_net_* result (-1 closed stays -1). */
static int io_status(int e) { return e < 0 ? -1 : -e; }

int fl_hs_connect_blocking(int fd, const fl_hs_config *c, uint16_t flags, uint32_t rank,
                           uint32_t size, uint32_t want_rank, const uint8_t *extra,
                           size_t extra_len, double deadline, uint32_t *their_status,
                           fl_hs_session *session, char *reason, size_t cap) {
    *their_status = FL_WIRE_OK;
    fl_hs_transcript t = {.flags = flags, .size = size, .round = c->round, .rank_c = rank,
                          .rank_a = want_rank, .opt_c = fl_hs_options(c, fl_hs_fd_is_loopback(fd))};
    if (fl_crypto_random(t.nonce_c, sizeof t.nonce_c) < 0) {
        snprintf(reason, cap, "%s", fl_errmsg());
        return FL_WIRE_BAD_STATUS;
    }
    fl_wire_hello h = {.flags = flags, .rank = rank, .size = size, .round = c->round,
                       .options = t.opt_c};
    memcpy(h.nonce, t.nonce_c, sizeof h.nonce);
    uint8_t msg[FL_WIRE_HELLO_SIZE + FL_WIRE_ENDPOINT_LEN], ch[FL_WIRE_CHALLENGE_SIZE];
    FL_ASSERT(extra_len <= FL_WIRE_ENDPOINT_LEN);
    fl_wire_hello_encode(msg, &h);
    if (extra_len)
        memcpy(msg + FL_WIRE_HELLO_SIZE, extra, extra_len);
    int e = fl_net_write_full(fd, msg, FL_WIRE_HELLO_SIZE + extra_len, deadline);
    if (e)
        return io_status(e);
    /* 16 bytes first: a refusal is no longer */
    e = fl_net_read_full(fd, ch, FL_WIRE_REPLY_SIZE, deadline);
    if (e)
        return io_status(e);
    fl_wire_challenge cg;
    int st = fl_wire_challenge_parse(ch, FL_WIRE_REPLY_SIZE, want_rank, their_status, &cg, reason,
                                     cap);
    if (st == FL_WIRE_TRUNCATED) {
        e = fl_net_read_full(fd, ch + FL_WIRE_REPLY_SIZE, sizeof ch - FL_WIRE_REPLY_SIZE,
                             deadline);
        if (e)
            return io_status(e);
        st = fl_wire_challenge_parse(ch, sizeof ch, want_rank, their_status, &cg, reason, cap);
    }
    if (st != FL_WIRE_OK)
        return st;
    t.opt_a = cg.options;
    memcpy(t.nonce_a, cg.nonce, sizeof t.nonce_a);
    if (!fl_hs_check(c, FL_HS_ACCEPTOR, &t, cg.mac)) {
        snprintf(reason, cap, "its proof of the job token is wrong (another job's token?)");
        return FL_WIRE_BAD_TOKEN;
    }
    uint8_t mac[FL_WIRE_HS_MAC], auth[FL_WIRE_AUTH_SIZE], reply[FL_WIRE_REPLY_SIZE];
    if (fl_hs_mac(c, FL_HS_CONNECTOR, &t, mac) < 0) {
        snprintf(reason, cap, "%s", fl_errmsg());
        return FL_WIRE_BAD_STATUS;
    }
    fl_wire_auth_encode(auth, rank, mac);
    e = fl_net_write_full(fd, auth, sizeof auth, deadline);
    if (!e)
        e = fl_net_read_full(fd, reply, sizeof reply, deadline);
    if (e)
        return io_status(e);
    st = fl_wire_reply_parse(reply, sizeof reply, want_rank, their_status, reason, cap);
    if (st != FL_WIRE_OK)
        return st;
    if (session && fl_hs_session_make(c, FL_HS_CONNECTOR, &t, session) < 0) {
        snprintf(reason, cap, "%s", fl_errmsg());
        return FL_WIRE_BAD_STATUS;
    }
    return FL_WIRE_OK;
}
