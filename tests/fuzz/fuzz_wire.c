/* fuzz_wire.c - libFuzzer target for the tcp transport's wire parsers (src/comm/wire.c:
 * version 2's hello (collective, rendezvous and message connections), challenge, proof and
 * reply, frame headers, encrypted keepalives, same-host messages, endpoints): arbitrary bytes
 * go through every parser, and whatever a parser accepts must satisfy its contract (fields in
 * range, re-encoding gives back the same bytes). Built by tests/fuzz/CMakeLists.txt with clang
 * -fsanitize=fuzzer,address,undefined. */
#include "comm/wire.h"

#include <stdint.h>
#include <string.h>

#define REQUIRE(x)              \
    do {                        \
        if (!(x))               \
            __builtin_trap();   \
    } while (0)

static void hello(const uint8_t *d, size_t n, uint16_t flags, uint32_t size, uint32_t round) {
    fl_wire_hello h;
    char why[160];
    if (fl_wire_hello_parse(d, n, flags, size, round, &h, why, sizeof why) != FL_WIRE_OK)
        return;
    REQUIRE(n >= FL_WIRE_HELLO_SIZE && h.rank < size && h.size == size && h.flags == flags);
    REQUIRE(h.round == round && !(h.options & ~FL_WIRE_OPT_ALL) &&
            (h.options & FL_WIRE_OPT_ENC_MASK) != 3);
    uint8_t again[FL_WIRE_HELLO_SIZE];
    fl_wire_hello_encode(again, &h);
    REQUIRE(memcmp(again, d, FL_WIRE_HELLO_SIZE) == 0);
}

/* the acceptor's challenge (or a refusal in its place) and the connector's proof */
static void challenge(const uint8_t *d, size_t n) {
    fl_wire_challenge c;
    char why[160];
    uint32_t theirs;
    int st = fl_wire_challenge_parse(d, n, 1, &theirs, &c, why, sizeof why);
    REQUIRE(st >= 0 && st < FL_WIRE_STATUS_COUNT);
    if (st == FL_WIRE_OK) {
        REQUIRE(n >= FL_WIRE_CHALLENGE_SIZE && c.rank == 1 && theirs == FL_WIRE_OK);
        uint8_t again[FL_WIRE_CHALLENGE_SIZE];
        fl_wire_challenge_encode(again, &c);
        REQUIRE(memcmp(again, d, FL_WIRE_CHALLENGE_SIZE) == 0);
    }
    uint8_t mac[FL_WIRE_HS_MAC];
    if (fl_wire_auth_parse(d, n, 2, mac, why, sizeof why) == FL_WIRE_OK) {
        uint8_t again[FL_WIRE_AUTH_SIZE];
        fl_wire_auth_encode(again, 2, mac);
        REQUIRE(n >= FL_WIRE_AUTH_SIZE && memcmp(again, d, FL_WIRE_AUTH_SIZE) == 0);
    }
}

static void frame(const uint8_t *d, size_t n, uint64_t seq, uint64_t want, uint64_t max) {
    fl_wire_frame f;
    char why[160];
    if (fl_wire_frame_parse(d, n, seq, want, max, &f, why, sizeof why) != FL_WIRE_OK)
        return;
    REQUIRE(n >= FL_WIRE_FRAME_SIZE && f.seq == seq);
    if (f.type == FL_WIRE_DATA)
        REQUIRE(want == FL_WIRE_LEN_ANY ? f.len >= 1 && f.len <= max : f.len == want);
    else if (f.type == FL_WIRE_ABORT)
        REQUIRE(f.len <= FL_WIRE_ABORT_MAX);
    else
        REQUIRE(f.type == FL_WIRE_KEEPALIVE && f.len == 0);
    uint8_t again[FL_WIRE_FRAME_SIZE];
    fl_wire_frame_encode(again, f.type, f.seq, f.len);
    REQUIRE(memcmp(again, d, FL_WIRE_FRAME_SIZE) == 0);
}

/* an encrypted connection's keepalive: header and counter (the tag is the transport's) */
static void keepalive(const uint8_t *d, size_t n, uint64_t seq) {
    uint64_t counter;
    char why[160];
    if (fl_wire_keepalive_parse(d, n, seq, &counter, why, sizeof why) != FL_WIRE_OK)
        return;
    REQUIRE(n >= FL_WIRE_KEEPALIVE_BODY);
    uint8_t again[FL_WIRE_KEEPALIVE_BODY];
    fl_wire_keepalive_encode(again, seq, counter);
    REQUIRE(memcmp(again, d, FL_WIRE_KEEPALIVE_BODY) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
    hello(d, n, 0, 4, 0);
    hello(d, n, FL_WIRE_FLAG_RENDEZVOUS, 4, 1);
    hello(d, n, FL_WIRE_FLAG_MSG, 4, 0); /* a message connection (msgconn.h) */
    challenge(d, n);
    char why[160];
    uint32_t theirs, v;
    int st = fl_wire_reply_parse(d, n, 1, &theirs, why, sizeof why);
    REQUIRE(st >= 0 && st < FL_WIRE_STATUS_COUNT);
    REQUIRE(theirs == FL_WIRE_OK || (theirs == (uint32_t)st && st > FL_WIRE_TRUNCATED));
    frame(d, n, 0, 7, 0);
    frame(d, n, 0, FL_WIRE_LEN_ANY, 1 << 18);
    frame(d, n, (uint64_t)1 << 40, 1 << 18, 0);
    keepalive(d, n, 0);
    keepalive(d, n, 5);

    fl_wire_offer o;
    if (fl_wire_offer_parse(d, n, &o, why, sizeof why) == FL_WIRE_OK) {
        REQUIRE(o.has_unix <= 1 && memchr(o.name, '\0', sizeof o.name));
        uint8_t again[FL_WIRE_OFFER_SIZE];
        fl_wire_offer_encode(again, &o);
        REQUIRE(memcmp(again, d, FL_WIRE_OFFER_SIZE) == 0);
    }
    if (fl_wire_decision_parse(d, n, &v, why, sizeof why) == FL_WIRE_OK)
        REQUIRE(v <= 1);
    uint8_t nonce[FL_WIRE_NONCE];
    if (fl_wire_proof_parse(d, n, 4, &v, nonce, why, sizeof why) == FL_WIRE_OK)
        REQUIRE(v < 4);

    char ep[FL_WIRE_ENDPOINT_LEN + 16], host[FL_WIRE_ENDPOINT_LEN];
    size_t k = n < sizeof ep - 1 ? n : sizeof ep - 1;
    memcpy(ep, d, k);
    ep[k] = '\0';
    int port = 0;
    if (fl_wire_endpoint_parse(ep, host, sizeof host, &port, why, sizeof why) == FL_WIRE_OK)
        REQUIRE(port >= 1 && port <= 65535 && host[0] && strlen(ep) < FL_WIRE_ENDPOINT_LEN);
    return 0;
}
