/* handshake.h - the tcp transport's challenge-response handshake (wire protocol version 2):
 * both sides send fresh random nonces and each proves it knows the job token with an
 * HMAC-SHA256 over everything the handshake said; the token itself never goes on the wire.
 * The same transcript gives each connection its two frame keys (HKDF). Message layouts are in
 * wire.h; this file is the cryptography and the checks around them. Private to src/comm.
 *
 *   connector                                       acceptor
 *     hello(rank c, size, round, opt_c, nonce_c)  ->
 *                                                 <- challenge(rank a, opt_a, nonce_a, MAC_a)
 *     proof(rank c, MAC_c)                        ->
 *                                                 <- reply(ok)
 *
 * MAC_x = HMAC(K_auth, label_x | version | flags | size | round | c | a | opt_c | opt_a |
 * nonce_c | nonce_a) with label "fleet acceptor" or "fleet connector": the labels differ, so a
 * MAC cannot be reflected back to the side that made it; both ranks are inside, so it cannot be
 * replayed to another rank; both nonces are inside, so a recorded handshake is worth nothing
 * once either side draws a new nonce. K_auth and the frame keys' master come from the token by
 * HKDF, so what sits in memory for the life of a job is never the token itself. */
#ifndef FLEET_HANDSHAKE_H
#define FLEET_HANDSHAKE_H

#include "crypto.h"
#include "wire.h"

#include <stdbool.h>
#include <stdint.h>

/* Encryption wanted for frames (comm.encrypt, FLEET_COMM_ENCRYPT; fl_comm_env.encrypt). */
enum { FL_HS_ENCRYPT_AUTO = 0, FL_HS_ENCRYPT_OFF = 1, FL_HS_ENCRYPT_ON = 2 };

/* What a rank knows before any connection: keys derived from the token, the job round, the
 * encryption it wants. */
typedef struct {
    uint8_t  auth[FL_CRYPTO_KEY];   /* K_auth: MACs of the handshake */
    uint8_t  master[FL_CRYPTO_KEY]; /* input to the frame keys */
    uint32_t round;                 /* FLEET_RESTART_COUNT */
    int      encrypt;               /* FL_HS_ENCRYPT_* */
    bool     has_aes;
} fl_hs_config;

/* Derives the keys from token ("" allowed for a job of one). 0 or FL_EIO. */
int  fl_hs_config_init(fl_hs_config *c, const char *token, uint32_t round, int encrypt);
/* Wipes the keys (OPENSSL_cleanse). */
void fl_hs_config_wipe(fl_hs_config *c);

/* Our options word for a hello (connector: loopback = we dialled a loopback address) or a
 * challenge. */
uint32_t fl_hs_options(const fl_hs_config *c, bool loopback);

/* Everything the MACs cover. */
typedef struct {
    uint16_t flags;
    uint32_t size, round, rank_c, rank_a, opt_c, opt_a;
    uint8_t  nonce_c[FL_WIRE_HS_NONCE], nonce_a[FL_WIRE_HS_NONCE];
} fl_hs_transcript;

enum { FL_HS_CONNECTOR = 0, FL_HS_ACCEPTOR = 1 };

/* MAC of the given role over t. 0 or FL_EIO. */
int fl_hs_mac(const fl_hs_config *c, int role, const fl_hs_transcript *t,
              uint8_t mac[FL_WIRE_HS_MAC]);
/* Whether mac is role's MAC over t (constant-time compare). */
bool fl_hs_check(const fl_hs_config *c, int role, const fl_hs_transcript *t,
                 const uint8_t mac[FL_WIRE_HS_MAC]);

/* A connection's outcome: whether its frames are encrypted, with which cipher and keys. */
typedef struct {
    bool           encrypt;   /* frames go through the AEAD */
    bool           automatic; /* decided by "auto" (then a same-host unix socket turns it off) */
    fl_aead_cipher cipher;
    uint8_t        tx[FL_CRYPTO_KEY], rx[FL_CRYPTO_KEY]; /* our sending and receiving keys */
} fl_hs_session;

/* Decides encryption from both options words (on if either side wants it on; else off if
 * either wants it off; else on unless the connector dialled a loopback address) and the
 * cipher (AES-256-GCM when both have AES instructions, else ChaCha20-Poly1305), and derives
 * the keys: HKDF(master, salt = nonce_c | nonce_a, info = "fleet frames v2 c->a" or "a->c" |
 * ranks | size | round | options). role: ours. 0 or FL_EIO. */
int  fl_hs_session_make(const fl_hs_config *c, int role, const fl_hs_transcript *t,
                        fl_hs_session *out);
void fl_hs_session_wipe(fl_hs_session *s);

/* Whether a connected socket's peer is a loopback address (127.0.0.0/8, ::1) or a unix socket. */
bool fl_hs_fd_is_loopback(int fd);

/* The connector's side, blocking, on a connected socket fd (rendezvous): sends a hello with
 * `flags` (+ extra[extra_len] behind it), checks the challenge of rank want_rank, proves, reads
 * the reply. FL_WIRE_OK, or the fl_wire_status of the failure with a reason in reason[cap]
 * (*their_status: the status the acceptor sent, FL_WIRE_OK if the fault is on its side), or
 * -errno for I/O (ETIMEDOUT past deadline, -1 closed). session may be NULL. */
int fl_hs_connect_blocking(int fd, const fl_hs_config *c, uint16_t flags, uint32_t rank,
                           uint32_t size, uint32_t want_rank, const uint8_t *extra,
                           size_t extra_len, double deadline, uint32_t *their_status,
                           fl_hs_session *session, char *reason, size_t cap);

#endif /* FLEET_HANDSHAKE_H */
