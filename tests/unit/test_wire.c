/* test_wire.c - the tcp transport's wire formats (src/comm/wire.c): encode/parse round trips,
 * every refusal with its reason, truncation at every length, and random bytes never accepted. */
#include "test.h"

#include "comm/wire.h"

#include <stdint.h>

static int has(const char *s, const char *needle) {
    if (strstr(s, needle))
        return 1;
    fprintf(stderr, "reason \"%s\" lacks \"%s\"\n", s, needle);
    return 0;
}

static void hello_make(uint8_t *b, uint16_t flags, uint32_t rank, uint32_t size) {
    fl_wire_hello h = {.flags = flags, .rank = rank, .size = size, .round = 5, .options = 0xa};
    for (int i = 0; i < FL_WIRE_HS_NONCE; i++)
        h.nonce[i] = (uint8_t)(i * 7 + 1);
    fl_wire_hello_encode(b, &h);
}

static void test_hello(void) {
    uint8_t b[FL_WIRE_HELLO_SIZE];
    fl_wire_hello h;
    char why[160];
    hello_make(b, 0, 3, 4);
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, &h, why, sizeof why) == FL_WIRE_OK);
    CHECK(h.rank == 3 && h.size == 4 && h.version == FL_WIRE_VERSION && h.flags == 0);
    CHECK(h.round == 5 && h.options == 0xa && h.nonce[1] == 8);
    CHECK(memcmp(b, "FLET", 4) == 0); /* the magic reads as text on the wire */

    /* each refusal and its reason */
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 6, NULL, why, sizeof why) == FL_WIRE_BAD_ROUND);
    CHECK(has(why, "job round 5, expected 6"));
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 8, 5, NULL, why, sizeof why) == FL_WIRE_BAD_SIZE);
    CHECK(has(why, "world size 4, expected 8"));
    CHECK(fl_wire_hello_parse(b, sizeof b, FL_WIRE_FLAG_RENDEZVOUS, 4, 5, NULL, why,
                              sizeof why) == FL_WIRE_BAD_FLAGS);
    CHECK(has(why, "handshake flags 0x0 (a collective-transport peer), expected 0x1"));
    /* message connections (msgconn.h) and collective ranks refuse each other by the flag */
    CHECK(fl_wire_hello_parse(b, sizeof b, FL_WIRE_FLAG_MSG, 4, 5, NULL, why, sizeof why) ==
          FL_WIRE_BAD_FLAGS);
    CHECK(has(why, "not a message connection (handshake flags 0x0: a collective-transport"));
    CHECK(fl_wire_hello_parse(b, 8, FL_WIRE_FLAG_MSG, 4, 5, NULL, why, sizeof why) ==
          FL_WIRE_BAD_FLAGS); /* known as soon as the flags are in */
    hello_make(b, FL_WIRE_FLAG_MSG, 3, 4);
    CHECK(fl_wire_hello_parse(b, sizeof b, FL_WIRE_FLAG_MSG, 4, 5, &h, why, sizeof why) ==
          FL_WIRE_OK);
    CHECK(h.flags == FL_WIRE_FLAG_MSG && h.rank == 3);
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_FLAGS);
    CHECK(has(why, "handshake flags 0x2 (a message connection), expected 0x0"));
    hello_make(b, 0x6, 3, 4);
    CHECK(fl_wire_hello_parse(b, sizeof b, FL_WIRE_FLAG_MSG, 4, 5, NULL, why, sizeof why) ==
          FL_WIRE_BAD_FLAGS);
    CHECK(has(why, "unknown kind"));
    hello_make(b, 0, 7, 4);
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_RANK);
    CHECK(has(why, "rank 7 out of range for 4 ranks"));
    hello_make(b, 0, 1, 4);
    b[4] = 3;
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) ==
          FL_WIRE_BAD_VERSION);
    CHECK(has(why, "protocol version 3, expected 2"));
    b[4] = 1; /* a version-1 peer is named by its version after 6 bytes */
    CHECK(fl_wire_hello_parse(b, 6, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_VERSION);
    CHECK(has(why, "protocol version 1, expected 2"));
    hello_make(b, 0, 1, 4);
    b[0] = 'G';
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_MAGIC);
    CHECK(has(why, "bad magic"));
    hello_make(b, 0, 1, 4);
    b[20] = 3; /* encryption mode 3 does not exist */
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_FLAGS);
    b[20] = 0x10;
    CHECK(fl_wire_hello_parse(b, sizeof b, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_BAD_FLAGS);

    /* truncation: never accepted; garbage refused as soon as the magic is in */
    hello_make(b, 0, 1, 4);
    for (size_t n = 0; n < FL_WIRE_HELLO_SIZE; n++)
        CHECK(fl_wire_hello_parse(b, n, 0, 4, 5, NULL, why, sizeof why) == FL_WIRE_TRUNCATED);
    uint8_t frame[FL_WIRE_FRAME_SIZE];
    fl_wire_frame_encode(frame, FL_WIRE_DATA, 0, 1);
    for (size_t n = 4; n <= sizeof frame; n++)
        CHECK(fl_wire_hello_parse(frame, n, 0, 4, 5, NULL, why, sizeof why) ==
              FL_WIRE_BAD_MAGIC);
}

static void test_challenge(void) {
    uint8_t b[FL_WIRE_CHALLENGE_SIZE], p[FL_WIRE_AUTH_SIZE], mac[FL_WIRE_HS_MAC];
    fl_wire_challenge c = {.rank = 2, .options = 0x6}, out;
    char why[160];
    uint32_t theirs;
    for (int i = 0; i < FL_WIRE_HS_NONCE; i++)
        c.nonce[i] = (uint8_t)i, c.mac[i] = (uint8_t)(255 - i);
    fl_wire_challenge_encode(b, &c);
    CHECK(fl_wire_challenge_parse(b, sizeof b, 2, &theirs, &out, why, sizeof why) == FL_WIRE_OK);
    CHECK(out.rank == 2 && out.options == 0x6 && !memcmp(out.nonce, c.nonce, sizeof c.nonce) &&
          !memcmp(out.mac, c.mac, sizeof c.mac));
    CHECK(fl_wire_challenge_parse(b, sizeof b, 1, &theirs, &out, why, sizeof why) ==
          FL_WIRE_BAD_RANK);
    for (size_t n = 0; n < sizeof b; n++)
        CHECK(fl_wire_challenge_parse(b, n, 2, &theirs, NULL, why, sizeof why) ==
              FL_WIRE_TRUNCATED);
    /* a refusal in its place is a 16-byte reply */
    fl_wire_reply_encode(b, FL_WIRE_BAD_TOKEN, 2);
    CHECK(fl_wire_challenge_parse(b, FL_WIRE_REPLY_SIZE, 2, &theirs, NULL, why, sizeof why) ==
          FL_WIRE_BAD_TOKEN);
    CHECK(theirs == FL_WIRE_BAD_TOKEN);
    /* an old peer's refusal names its version */
    b[4] = 1;
    CHECK(fl_wire_challenge_parse(b, FL_WIRE_REPLY_SIZE, 2, &theirs, NULL, why, sizeof why) ==
          FL_WIRE_BAD_VERSION);
    CHECK(has(why, "protocol version 1, expected 2"));
    /* proof */
    fl_wire_auth_encode(p, 3, c.mac);
    CHECK(fl_wire_auth_parse(p, sizeof p, 3, mac, why, sizeof why) == FL_WIRE_OK);
    CHECK(!memcmp(mac, c.mac, sizeof mac));
    CHECK(fl_wire_auth_parse(p, sizeof p, 2, mac, why, sizeof why) == FL_WIRE_BAD_RANK);
    for (size_t n = 0; n < sizeof p; n++)
        CHECK(fl_wire_auth_parse(p, n, 3, mac, why, sizeof why) == FL_WIRE_TRUNCATED);
    p[0] = 'X';
    CHECK(fl_wire_auth_parse(p, sizeof p, 3, mac, why, sizeof why) == FL_WIRE_BAD_MAGIC);
}

static void test_reply(void) {
    uint8_t b[FL_WIRE_REPLY_SIZE];
    char why[160];
    uint32_t theirs;
    fl_wire_reply_encode(b, FL_WIRE_OK, 2);
    CHECK(fl_wire_reply_parse(b, sizeof b, 2, &theirs, why, sizeof why) == FL_WIRE_OK);
    CHECK(theirs == FL_WIRE_OK);
    CHECK(fl_wire_reply_parse(b, sizeof b, 1, &theirs, why, sizeof why) == FL_WIRE_BAD_RANK);
    CHECK(has(why, "reply from rank 2, expected rank 1"));
    CHECK(theirs == FL_WIRE_OK);
    for (int st = FL_WIRE_BAD_MAGIC; st < FL_WIRE_STATUS_COUNT; st++) {
        fl_wire_reply_encode(b, (uint32_t)st, 0);
        CHECK(fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why) == st);
        CHECK(theirs == (uint32_t)st);
        CHECK(has(why, "refused: "));
    }
    fl_wire_reply_encode(b, FL_WIRE_BAD_TOKEN, 0);
    fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why);
    CHECK(has(why, "refused: wrong job token"));
    fl_wire_reply_encode(b, FL_WIRE_BAD_VERSION, 0);
    fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why);
    CHECK(has(why, "version"));
    fl_wire_reply_encode(b, 99, 0);
    CHECK(fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why) == FL_WIRE_BAD_STATUS);
    CHECK(theirs == FL_WIRE_OK);
    fl_wire_reply_encode(b, FL_WIRE_TRUNCATED, 0); /* not a refusal anyone sends */
    CHECK(fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why) == FL_WIRE_BAD_STATUS);
    fl_wire_reply_encode(b, FL_WIRE_OK, 0);
    for (size_t n = 0; n < sizeof b; n++)
        CHECK(fl_wire_reply_parse(b, n, 0, &theirs, why, sizeof why) == FL_WIRE_TRUNCATED);
    b[5] = 9;
    CHECK(fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why) == FL_WIRE_BAD_VERSION);
    b[0] = 0;
    CHECK(fl_wire_reply_parse(b, sizeof b, 0, &theirs, why, sizeof why) == FL_WIRE_BAD_MAGIC);
}

static void test_frame(void) {
    uint8_t b[FL_WIRE_FRAME_SIZE];
    fl_wire_frame f;
    char why[160];
    const uint64_t big = (uint64_t)1 << 40;
    fl_wire_frame_encode(b, FL_WIRE_DATA, big + 5, 524288);
    CHECK(fl_wire_frame_parse(b, sizeof b, big + 5, 524288, 0, &f, why, sizeof why) ==
          FL_WIRE_OK);
    CHECK(f.type == FL_WIRE_DATA && f.seq == big + 5 && f.len == 524288);
    CHECK(fl_wire_frame_parse(b, sizeof b, big + 5, FL_WIRE_LEN_ANY, 524288, &f, why,
                              sizeof why) == FL_WIRE_OK);
    CHECK(fl_wire_frame_parse(b, sizeof b, big + 5, FL_WIRE_LEN_ANY, 524287, &f, why,
                              sizeof why) == FL_WIRE_BAD_LENGTH);
    CHECK(fl_wire_frame_parse(b, sizeof b, big + 5, 7, 0, &f, why, sizeof why) ==
          FL_WIRE_BAD_LENGTH);
    CHECK(has(why, "data frame of 524288 bytes, expected 7"));
    CHECK(fl_wire_frame_parse(b, sizeof b, 4, 524288, 0, &f, why, sizeof why) ==
          FL_WIRE_BAD_SEQ);
    CHECK(has(why, "expected 4"));
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, UINT64_MAX - 1); /* huge: refused, not allocated */
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_LENGTH);
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, FL_WIRE_LEN_ANY, 1 << 20, &f, why, sizeof why) ==
          FL_WIRE_BAD_LENGTH);
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, 0);
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, FL_WIRE_LEN_ANY, 1 << 20, &f, why, sizeof why) ==
          FL_WIRE_BAD_LENGTH);

    /* abort: any expected length, message at most 1024 bytes */
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 3, FL_WIRE_ABORT_MAX);
    CHECK(fl_wire_frame_parse(b, sizeof b, 3, 7, 0, &f, why, sizeof why) == FL_WIRE_OK);
    CHECK(f.type == FL_WIRE_ABORT && f.len == FL_WIRE_ABORT_MAX);
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 3, 0);
    CHECK(fl_wire_frame_parse(b, sizeof b, 3, FL_WIRE_LEN_ANY, 1, &f, why, sizeof why) ==
          FL_WIRE_OK);
    fl_wire_frame_encode(b, FL_WIRE_ABORT, 3, FL_WIRE_ABORT_MAX + 1);
    CHECK(fl_wire_frame_parse(b, sizeof b, 3, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_LENGTH);
    CHECK(has(why, "abort message"));

    fl_wire_frame_encode(b, 9, 0, 7);
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_TYPE);
    CHECK(has(why, "unknown frame type 9"));
    fl_wire_frame_encode(b, 0, 0, 7);
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_TYPE);

    /* keepalive: no payload, carries the next sequence number */
    fl_wire_frame_encode(b, FL_WIRE_KEEPALIVE, 12, 0);
    CHECK(fl_wire_frame_parse(b, sizeof b, 12, 7, 0, &f, why, sizeof why) == FL_WIRE_OK);
    CHECK(f.type == FL_WIRE_KEEPALIVE && f.len == 0);
    CHECK(fl_wire_frame_parse(b, sizeof b, 13, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_SEQ);
    fl_wire_frame_encode(b, FL_WIRE_KEEPALIVE, 12, 7);
    CHECK(fl_wire_frame_parse(b, sizeof b, 12, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_LENGTH);
    CHECK(has(why, "keepalive of 7 bytes"));

    /* an encrypted connection's keepalive: header, counter (then the caller's tag) */
    uint8_t ka[FL_WIRE_KEEPALIVE_SEALED];
    uint64_t counter = 0;
    fl_wire_keepalive_encode(ka, 12, big + 3);
    CHECK(fl_wire_frame_parse(ka, sizeof ka, 12, 7, 0, &f, why, sizeof why) == FL_WIRE_OK);
    CHECK(f.type == FL_WIRE_KEEPALIVE && f.len == 0);
    CHECK(fl_wire_keepalive_parse(ka, FL_WIRE_KEEPALIVE_BODY, 12, &counter, why, sizeof why) ==
          FL_WIRE_OK);
    CHECK(counter == big + 3);
    CHECK(fl_wire_keepalive_parse(ka, FL_WIRE_KEEPALIVE_BODY - 1, 12, &counter, why,
                                  sizeof why) == FL_WIRE_TRUNCATED);
    CHECK(fl_wire_keepalive_parse(ka, 10, 12, &counter, why, sizeof why) == FL_WIRE_TRUNCATED);
    CHECK(fl_wire_keepalive_parse(ka, sizeof ka, 13, &counter, why, sizeof why) ==
          FL_WIRE_BAD_SEQ);
    fl_wire_frame_encode(ka, FL_WIRE_ABORT, 12, 0);
    CHECK(fl_wire_keepalive_parse(ka, sizeof ka, 12, &counter, why, sizeof why) ==
          FL_WIRE_BAD_TYPE);
    CHECK(has(why, "expected a keepalive"));
    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, 7);
    b[3] ^= 0x40;
    CHECK(fl_wire_frame_parse(b, sizeof b, 0, 7, 0, &f, why, sizeof why) == FL_WIRE_BAD_MAGIC);
    /* a handshake where a frame belongs is refused by its magic */
    uint8_t hello[FL_WIRE_HELLO_SIZE];
    hello_make(hello, 0, 0, 2);
    CHECK(fl_wire_frame_parse(hello, FL_WIRE_FRAME_SIZE, 0, 7, 0, &f, why, sizeof why) ==
          FL_WIRE_BAD_MAGIC);

    fl_wire_frame_encode(b, FL_WIRE_DATA, 0, 7);
    for (size_t n = 0; n < sizeof b; n++)
        CHECK(fl_wire_frame_parse(b, n, 0, 7, 0, &f, why, sizeof why) == FL_WIRE_TRUNCATED);
}

static void test_endpoint(void) {
    char host[64], why[128];
    int port = 0;
    CHECK(fl_wire_endpoint_parse("127.0.0.1:6170", host, sizeof host, &port, why, sizeof why) ==
          FL_WIRE_OK);
    CHECK(strcmp(host, "127.0.0.1") == 0 && port == 6170);
    CHECK(fl_wire_endpoint_parse("node-3.cluster_a:1", host, sizeof host, &port, why,
                                 sizeof why) == FL_WIRE_OK);
    CHECK(strcmp(host, "node-3.cluster_a") == 0 && port == 1);
    CHECK(fl_wire_endpoint_parse("[::1]:65535", host, sizeof host, &port, why, sizeof why) ==
          FL_WIRE_OK);
    CHECK(strcmp(host, "::1") == 0 && port == 65535);
    CHECK(fl_wire_endpoint_parse("[fe80::1%eth0]:80", host, sizeof host, &port, why,
                                 sizeof why) == FL_WIRE_OK);
    CHECK(strcmp(host, "fe80::1%eth0") == 0);
    CHECK(fl_wire_endpoint_parse("h:80", NULL, 0, NULL, NULL, 0) == FL_WIRE_OK);
    const char *bad[] = {"localhost:abc", "localhost", ":80",     "host:0",      "host:65536",
                         "host:",         "::1:80",    "[::1]80", "[::1",        "a b:80",
                         "host:123456",   "host:-1",   "host:+80", "[]:80",      "[::1]:",
                         "",              "h:8 0",     "ho/st:80", "[::1]:80x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = fl_wire_endpoint_parse(bad[i], host, sizeof host, &port, why, sizeof why);
        if (st != FL_WIRE_BAD_ENDPOINT)
            fprintf(stderr, "endpoint '%s' accepted\n", bad[i]);
        CHECK(st == FL_WIRE_BAD_ENDPOINT);
    }
    fl_wire_endpoint_parse("localhost:abc", host, sizeof host, &port, why, sizeof why);
    CHECK(has(why, "port"));
    fl_wire_endpoint_parse("::1:80", host, sizeof host, &port, why, sizeof why);
    CHECK(has(why, "[addr]:port"));
    char longest[80];
    memset(longest, 'a', sizeof longest);
    strcpy(longest + 57, ":65535"); /* 63 characters: the longest that fits */
    CHECK(fl_wire_endpoint_parse(longest, host, sizeof host, &port, why, sizeof why) ==
          FL_WIRE_OK);
    memset(longest, 'a', sizeof longest);
    strcpy(longest + 58, ":65535");
    CHECK(fl_wire_endpoint_parse(longest, host, sizeof host, &port, why, sizeof why) ==
          FL_WIRE_BAD_ENDPOINT);
    CHECK(fl_wire_endpoint_parse("abcdef:80", host, 4, &port, why, sizeof why) ==
          FL_WIRE_BAD_ENDPOINT); /* host buffer too small */
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_garbage(void) {
    uint8_t b[200];
    char why[160], ep[FL_WIRE_ENDPOINT_LEN + 8];
    uint32_t theirs;
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = next_rand() % sizeof b;
        for (size_t i = 0; i < n; i++)
            b[i] = (uint8_t)next_rand();
        /* half the time, start with a valid magic so later checks are reached */
        if (iter % 2 && n >= 4)
            memcpy(b, iter % 4 == 1 ? "FLET" : "FLFR", 4);
        CHECK(fl_wire_hello_parse(b, n, 0, 4, 0, NULL, why, sizeof why) != FL_WIRE_OK);
        fl_wire_challenge_parse(b, n, 1, &theirs, NULL, why, sizeof why);
        fl_wire_auth_parse(b, n, 1, NULL, why, sizeof why);
        int st = fl_wire_reply_parse(b, n, 1, &theirs, why, sizeof why);
        CHECK(st != FL_WIRE_OK || (n >= 16 && b[8] == 0 && b[9] == 0 && b[10] == 0 &&
                                   b[11] == 0 && b[12] == 1 && !b[13] && !b[14] && !b[15]));
        fl_wire_frame f;
        st = fl_wire_frame_parse(b, n, 0, 7, 0, &f, why, sizeof why);
        CHECK(st != FL_WIRE_OK ||
              (n >= 24 && f.seq == 0 && ((f.type == FL_WIRE_DATA && f.len == 7) ||
                                         (f.type == FL_WIRE_ABORT && f.len <= 1024) ||
                                         (f.type == FL_WIRE_KEEPALIVE && f.len == 0))));
        size_t k = n < sizeof ep - 1 ? n : sizeof ep - 1;
        for (size_t i = 0; i < k; i++)
            ep[i] = (char)(b[i] ? b[i] : 'x');
        ep[k] = '\0';
        int port = -1;
        if (fl_wire_endpoint_parse(ep, NULL, 0, &port, why, sizeof why) == FL_WIRE_OK)
            CHECK(port >= 1 && port <= 65535);
    }
}

int main(void) {
    test_hello();
    test_challenge();
    test_reply();
    test_frame();
    test_endpoint();
    test_garbage();
    TEST_DONE();
}
