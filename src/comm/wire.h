/* wire.h - the tcp transport's bytes on the wire: the handshake a connection opens with, the
 * acceptor's reply, the header in front of every later frame, and "host:port" endpoints.
 * Pure encode/parse functions (no I/O, no allocation, no library state) so they can be fuzzed
 * alone; every parser bounds what it accepts and says why it refused in a short reason.
 *
 * All integers are little-endian. The handshake (version 2) is a challenge-response: the job
 * token never goes on the wire, each side proves it knows it with an HMAC over both sides'
 * fresh nonces (handshake.h has the MAC's input). Layouts (byte offsets):
 *   hello     (connector -> acceptor, 56 B): 0 magic "FLET" | 4 version u16 | 6 flags u16 |
 *                                          8 sender rank u32 | 12 world size u32 |
 *                                          16 job round u32 | 20 options u32 | 24 nonce, 32 B
 *   challenge (acceptor -> connector, 88 B): 0 magic "FLET" | 4 version u16 | 6 reserved u16 |
 *                                          8 status u32 (0) | 12 acceptor rank u32 |
 *                                          16 options u32 | 20 reserved u32 | 24 nonce, 32 B |
 *                                          56 acceptor's MAC, 32 B
 *   proof     (connector -> acceptor, 40 B): 0 magic "FLAU" | 4 sender rank u32 | 8 its MAC, 32 B
 *   reply     (acceptor -> connector, 16 B): 0 magic "FLET" | 4 version u16 | 6 reserved u16 (0) |
 *                                          8 status u32 (0 ok, else fl_wire_status) |
 *                                          12 acceptor rank u32
 *   A refusal is a reply in place of the challenge (status != 0) or after the proof. Bytes 0-15
 *   of hello and reply are laid out as in version 1, so a peer of either version names the
 *   other's version instead of calling it garbage.
 *   flags: the kind of connection (FL_WIRE_FLAG_*: 0 collective, 1 rendezvous, 2 message).
 *   options: bits 0-1 encryption wanted (0 auto, 1 off, 2 on), bit 2 the connector dialled a
 *   loopback address, bit 3 the sender has AES instructions.
 *   frame header (every later message, 24 B): 0 magic "FLFR" | 4 type u32 | 8 seq u64 |
 *                                         16 payload length u64 (DATA=1, ABORT=2, KEEPALIVE=3)
 *   On an encrypted connection the payload of DATA and ABORT frames is ciphertext followed by
 *   a 16-byte AEAD tag (not counted in the length; the header is the associated data), and a
 *   KEEPALIVE (length 0) is followed by 24 bytes, 48 in all: 24 counter u64 | 32 AEAD tag, 16 B
 *   (over no payload; header and counter are the associated data; nonce: the counter in the
 *   keepalives' own nonce space, crypto.h). The counter starts at 0 per connection and
 *   direction and rises by one per keepalive sealed; a receiver accepts only a counter above
 *   the last it accepted, so a keepalive cannot be forged or replayed (one lost on the way is
 *   no harm).
 * A frame's magic differs from the handshake's, so a frame sent where a handshake belongs is
 * refused at its first four bytes. */
#ifndef FLEET_WIRE_H
#define FLEET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define FL_WIRE_MAGIC       0x54454c46u /* "FLET" as bytes on the wire */
#define FL_WIRE_FRAME_MAGIC 0x52464c46u /* "FLFR" */
#define FL_WIRE_OFFER_MAGIC 0x4f4c4c46u /* "FLLO" */
#define FL_WIRE_DECIDE_MAGIC 0x444c4c46u /* "FLLD" */
#define FL_WIRE_PROOF_MAGIC 0x504c4c46u /* "FLLP" */
#define FL_WIRE_AUTH_MAGIC  0x55414c46u /* "FLAU" */
#define FL_WIRE_VERSION     2
#define FL_WIRE_TOKEN_LEN   64  /* longest job token */
#define FL_WIRE_HS_NONCE    32  /* handshake nonce */
#define FL_WIRE_HS_MAC      32  /* HMAC-SHA256 */
#define FL_WIRE_HELLO_SIZE  56
#define FL_WIRE_CHALLENGE_SIZE 88
#define FL_WIRE_AUTH_SIZE   40
#define FL_WIRE_REPLY_SIZE  16
#define FL_WIRE_FRAME_SIZE  24
#define FL_WIRE_ABORT_MAX   1024 /* longest abort message */
#define FL_WIRE_ENDPOINT_LEN 64  /* an endpoint in the rendezvous table: NUL padded */
#define FL_WIRE_MAX_RANKS   4096

/* hello flags: what kind of connection the hello opens. A listener asks for exactly one kind
 * (fl_wire_hello_parse's want_flags), so a connection of another kind on its port is refused
 * with a reason naming both. */
#define FL_WIRE_FLAG_COLLECTIVE 0x0u /* a collective-transport peer (transport.c) */
#define FL_WIRE_FLAG_RENDEZVOUS 0x1u /* torchrun-style endpoint exchange, not a data connection */
#define FL_WIRE_FLAG_MSG        0x2u /* a message connection (msgconn.h: parameter server) */

/* Frame types. KEEPALIVE (no payload) is what a rank blocked in the transport sends its peers
 * now and then, so that a rank waiting on it can tell "alive but waiting on someone else" from
 * "silent"; it carries the next sequence number without using it up (and, encrypted, a
 * counter and tag of its own: above). */
enum { FL_WIRE_DATA = 1, FL_WIRE_ABORT = 2, FL_WIRE_KEEPALIVE = 3 };

/* Why a parser refused (also the status an acceptor sends back in its reply). */
typedef enum {
    FL_WIRE_OK = 0,
    FL_WIRE_TRUNCATED,   /* not enough bytes yet (all that is there is valid) */
    FL_WIRE_BAD_MAGIC,
    FL_WIRE_BAD_VERSION,
    FL_WIRE_BAD_FLAGS,
    FL_WIRE_BAD_TOKEN,
    FL_WIRE_BAD_SIZE,    /* world size differs from ours */
    FL_WIRE_BAD_RANK,    /* rank out of range, or not one that should connect here */
    FL_WIRE_DUPLICATE,   /* rank already connected */
    FL_WIRE_BAD_TYPE,
    FL_WIRE_BAD_SEQ,
    FL_WIRE_BAD_LENGTH,
    FL_WIRE_BAD_STATUS,  /* a reply carrying a status code we do not know */
    FL_WIRE_BAD_ENDPOINT,
    FL_WIRE_BAD_ROUND,   /* job round (fleetrun restart) differs from ours */
    FL_WIRE_STATUS_COUNT
} fl_wire_status;

/* Short fixed description of a status ("wrong job token"), for replies from the far side. */
const char *fl_wire_status_str(int status);

/* hello options (wire.h header comment) */
#define FL_WIRE_OPT_ENC_MASK 0x3u
#define FL_WIRE_OPT_LOOPBACK 0x4u
#define FL_WIRE_OPT_AES      0x8u
#define FL_WIRE_OPT_ALL      0xfu

typedef struct {
    uint16_t version, flags;
    uint32_t rank, size, round, options;
    uint8_t  nonce[FL_WIRE_HS_NONCE];
} fl_wire_hello;

void fl_wire_hello_encode(uint8_t out[FL_WIRE_HELLO_SIZE], const fl_wire_hello *h);

/* Parses the first n bytes of a hello (n may be short: fields are checked as far as they go,
 * so garbage is refused after 4 bytes). Checks magic, version, flags == want_flags (one of
 * FL_WIRE_FLAG_*; a hello of another kind is FL_WIRE_BAD_FLAGS with a reason naming both
 * kinds: "not a message connection (...)"), size ==
 * want_size, rank < size, round == want_round, known options (an encryption mode of 3 is
 * refused). Returns FL_WIRE_OK (out filled), FL_WIRE_TRUNCATED, or the refusal, with a reason
 * in reason[cap] ("protocol version 3, expected 2"). out and reason may be NULL. */
int fl_wire_hello_parse(const uint8_t *buf, size_t n, uint16_t want_flags, uint32_t want_size,
                        uint32_t want_round, fl_wire_hello *out, char *reason, size_t cap);

typedef struct {
    uint32_t rank, options;
    uint8_t  nonce[FL_WIRE_HS_NONCE], mac[FL_WIRE_HS_MAC];
} fl_wire_challenge;

void fl_wire_challenge_encode(uint8_t out[FL_WIRE_CHALLENGE_SIZE], const fl_wire_challenge *c);

/* Parses what the acceptor (want_rank) answered a hello with: a challenge, or a refusal in
 * the reply's 16 bytes. FL_WIRE_OK (out filled; the caller checks the MAC), FL_WIRE_TRUNCATED
 * (more bytes needed: 16, then 88 when it is no refusal), or as fl_wire_reply_parse. */
int fl_wire_challenge_parse(const uint8_t *buf, size_t n, uint32_t want_rank,
                            uint32_t *their_status, fl_wire_challenge *out, char *reason,
                            size_t cap);

void fl_wire_auth_encode(uint8_t out[FL_WIRE_AUTH_SIZE], uint32_t rank,
                         const uint8_t mac[FL_WIRE_HS_MAC]);
/* Checks magic and rank == want_rank (the rank its hello claimed); copies the MAC. */
int fl_wire_auth_parse(const uint8_t *buf, size_t n, uint32_t want_rank,
                       uint8_t mac[FL_WIRE_HS_MAC], char *reason, size_t cap);

void fl_wire_reply_encode(uint8_t out[FL_WIRE_REPLY_SIZE], uint32_t status, uint32_t rank);

/* Parses a reply from the rank we connected to (want_rank). FL_WIRE_OK if it accepted us;
 * else the refusal it sent (*their_status set, reason "refused: wrong job token") or why the
 * reply itself is bad. */
int fl_wire_reply_parse(const uint8_t *buf, size_t n, uint32_t want_rank, uint32_t *their_status,
                        char *reason, size_t cap);

typedef struct {
    uint32_t type;
    uint64_t seq;
    uint64_t len;
} fl_wire_frame;

void fl_wire_frame_encode(uint8_t out[FL_WIRE_FRAME_SIZE], uint32_t type, uint64_t seq,
                          uint64_t len);

/* Any DATA length up to this bound is accepted when want_len is FL_WIRE_LEN_ANY (used to look at
 * a frame that arrived ahead of the operation that will consume it; that operation re-parses
 * with the exact length). */
#define FL_WIRE_LEN_ANY UINT64_MAX

/* Parses a frame header: magic, type, seq == want_seq, and the length: DATA exactly want_len
 * (or 1..max_any when want_len is FL_WIRE_LEN_ANY), ABORT at most FL_WIRE_ABORT_MAX,
 * KEEPALIVE 0. */
int fl_wire_frame_parse(const uint8_t *buf, size_t n, uint64_t want_seq, uint64_t want_len,
                        uint64_t max_any, fl_wire_frame *out, char *reason, size_t cap);

/* A keepalive on an encrypted connection: header and counter (the caller appends the tag). */
#define FL_WIRE_KEEPALIVE_BODY (FL_WIRE_FRAME_SIZE + 8)
#define FL_WIRE_KEEPALIVE_SEALED (FL_WIRE_KEEPALIVE_BODY + 16)
void fl_wire_keepalive_encode(uint8_t out[FL_WIRE_KEEPALIVE_BODY], uint64_t seq,
                              uint64_t counter);
/* Parses one: a KEEPALIVE header with seq == want_seq (as fl_wire_frame_parse), then its
 * counter into *counter. FL_WIRE_TRUNCATED while fewer than FL_WIRE_KEEPALIVE_BODY bytes,
 * FL_WIRE_BAD_TYPE for another frame type. The tag is checked by the caller. */
int fl_wire_keepalive_parse(const uint8_t *buf, size_t n, uint64_t want_seq, uint64_t *counter,
                            char *reason, size_t cap);

/* ---- same-host upgrade (local.c), after the handshake, on the TCP connection ----
 *   offer    (lower rank -> higher, 48 B): 0 magic "FLLO" | 4 has_unix u32 (0/1) |
 *                                          8 abstract unix socket name, 24 B, NUL padded |
 *                                          32 nonce, 16 B
 *   decision (higher -> lower, 8 B):       0 magic "FLLD" | 4 use_unix u32 (0/1)
 *   proof    (higher -> lower, on the unix socket, 24 B): 0 magic "FLLP" | 4 rank u32 |
 *                                          8 nonce, 16 B */
#define FL_WIRE_OFFER_SIZE    48
#define FL_WIRE_DECISION_SIZE 8
#define FL_WIRE_PROOF_SIZE    24
#define FL_WIRE_LOCAL_NAME    24 /* incl. NUL: [a-z0-9-], 1..23 characters */
#define FL_WIRE_NONCE         16

typedef struct {
    uint32_t has_unix;
    char     name[FL_WIRE_LOCAL_NAME];
    uint8_t  nonce[FL_WIRE_NONCE];
} fl_wire_offer;

void fl_wire_offer_encode(uint8_t out[FL_WIRE_OFFER_SIZE], const fl_wire_offer *o);
/* Checks magic, has_unix in {0, 1} and (when 1) the name. FL_WIRE_OK or the refusal. */
int  fl_wire_offer_parse(const uint8_t *buf, size_t n, fl_wire_offer *out, char *reason,
                         size_t cap);
void fl_wire_decision_encode(uint8_t out[FL_WIRE_DECISION_SIZE], uint32_t use_unix);
int  fl_wire_decision_parse(const uint8_t *buf, size_t n, uint32_t *use_unix, char *reason,
                            size_t cap);
void fl_wire_proof_encode(uint8_t out[FL_WIRE_PROOF_SIZE], uint32_t rank,
                          const uint8_t nonce[FL_WIRE_NONCE]);
/* Checks magic and rank < size; copies the nonce (the caller compares it). */
int  fl_wire_proof_parse(const uint8_t *buf, size_t n, uint32_t size, uint32_t *rank,
                         uint8_t nonce[FL_WIRE_NONCE], char *reason, size_t cap);

/* Parses "host:port", "[v6]:port" (len < FL_WIRE_ENDPOINT_LEN; host: letters, digits, '.', '-',
 * '_'; bracketed: hex digits, ':', '.', '%' and a zone name; port 1..65535). Copies the host
 * without brackets into host[hostcap]. FL_WIRE_OK or FL_WIRE_BAD_ENDPOINT with a reason. */
int fl_wire_endpoint_parse(const char *s, char *host, size_t hostcap, int *port, char *reason,
                           size_t cap);

#endif /* FLEET_WIRE_H */
