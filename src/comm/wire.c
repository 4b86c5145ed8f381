/* wire.c - encoding and validating the tcp transport's handshake, reply, frame headers and
 * endpoints (layouts in wire.h). Pure functions over byte buffers, no I/O and no library
 * state, so that tests/fuzz/fuzz_wire.c can drive them with arbitrary bytes. */
#include "wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Writes the reason (if wanted) and returns status. */
static int refuse(int status, char *reason, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int refuse(int status, char *reason, size_t cap, const char *fmt, ...) {
    if (reason && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *fl_wire_status_str(int status) {
    switch (status) {
    case FL_WIRE_OK: return "ok";
    case FL_WIRE_TRUNCATED: return "truncated";
    case FL_WIRE_BAD_MAGIC: return "bad magic";
    case FL_WIRE_BAD_VERSION: return "protocol version mismatch";
    case FL_WIRE_BAD_FLAGS:
        return "unexpected handshake kind (a collective rank, a rendezvous or a message "
               "connection on a port meant for another)";
    case FL_WIRE_BAD_TOKEN: return "wrong job token (or a replayed handshake)";
    case FL_WIRE_BAD_SIZE: return "world size mismatch";
    case FL_WIRE_BAD_RANK: return "rank not expected here";
    case FL_WIRE_DUPLICATE: return "rank already connected";
    case FL_WIRE_BAD_TYPE: return "bad frame type";
    case FL_WIRE_BAD_SEQ: return "bad sequence number";
    case FL_WIRE_BAD_LENGTH: return "bad frame length";
    case FL_WIRE_BAD_STATUS: return "unknown status";
    case FL_WIRE_BAD_ENDPOINT: return "bad endpoint";
    case FL_WIRE_BAD_ROUND: return "job round mismatch (a worker of another restart round?)";
    default: return "unknown status";
    }
}

/* ---- handshake ---- */

void fl_wire_hello_encode(uint8_t out[FL_WIRE_HELLO_SIZE], const fl_wire_hello *h) {
    put32(out, FL_WIRE_MAGIC);
    put16(out + 4, FL_WIRE_VERSION);
    put16(out + 6, h->flags);
    put32(out + 8, h->rank);
    put32(out + 12, h->size);
    put32(out + 16, h->round);
    put32(out + 20, h->options);
    memcpy(out + 24, h->nonce, FL_WIRE_HS_NONCE);
}

/* Magic and version, common to hello, challenge and reply. */
static int head_ok(const uint8_t *buf, size_t n, char *reason, size_t cap) {
    if (n >= 4 && get32(buf) != FL_WIRE_MAGIC)
        return refuse(FL_WIRE_BAD_MAGIC, reason, cap, "bad magic 0x%08x", (unsigned)get32(buf));
    if (n >= 6 && get16(buf + 4) != FL_WIRE_VERSION)
        return refuse(FL_WIRE_BAD_VERSION, reason, cap, "protocol version %u, expected %u",
                      (unsigned)get16(buf + 4), (unsigned)FL_WIRE_VERSION);
    return FL_WIRE_OK;
}

/* What a hello's flags say it opens. */
static const char *kind(unsigned flags) {
    switch (flags) {
    case FL_WIRE_FLAG_COLLECTIVE: return "a collective-transport peer";
    case FL_WIRE_FLAG_RENDEZVOUS: return "a rendezvous check-in";
    case FL_WIRE_FLAG_MSG: return "a message connection";
    default: return "unknown kind";
    }
}

int fl_wire_hello_parse(const uint8_t *buf, size_t n, uint16_t want_flags, uint32_t want_size,
                        uint32_t want_round, fl_wire_hello *out, char *reason, size_t cap) {
    int st = head_ok(buf, n, reason, cap);
    if (st != FL_WIRE_OK)
        return st;
    if (n >= 8 && get16(buf + 6) != want_flags) {
        unsigned f = get16(buf + 6);
        if (want_flags == FL_WIRE_FLAG_MSG)
            return refuse(FL_WIRE_BAD_FLAGS, reason, cap,
                          "not a message connection (handshake flags 0x%x: %s)", f, kind(f));
        return refuse(FL_WIRE_BAD_FLAGS, reason, cap,
                      "handshake flags 0x%x (%s), expected 0x%x (%s)", f, kind(f),
                      (unsigned)want_flags, kind(want_flags));
    }
    if (n >= 16) {
        uint32_t rank = get32(buf + 8), size = get32(buf + 12);
        if (size != want_size)
            return refuse(FL_WIRE_BAD_SIZE, reason, cap, "world size %u, expected %u",
                          (unsigned)size, (unsigned)want_size);
        if (rank >= size)
            return refuse(FL_WIRE_BAD_RANK, reason, cap, "rank %u out of range for %u ranks",
                          (unsigned)rank, (unsigned)size);
    }
    if (n >= 20 && get32(buf + 16) != want_round)
        return refuse(FL_WIRE_BAD_ROUND, reason, cap, "job round %u, expected %u",
                      (unsigned)get32(buf + 16), (unsigned)want_round);
    if (n >= 24) {
        uint32_t o = get32(buf + 20);
        if ((o & ~FL_WIRE_OPT_ALL) || (o & FL_WIRE_OPT_ENC_MASK) == 3)
            return refuse(FL_WIRE_BAD_FLAGS, reason, cap, "unknown handshake options 0x%x",
                          (unsigned)o);
    }
    if (n < FL_WIRE_HELLO_SIZE)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated handshake (%zu of %d bytes)", n,
                      FL_WIRE_HELLO_SIZE);
    if (out) {
        out->version = get16(buf + 4);
        out->flags = get16(buf + 6);
        out->rank = get32(buf + 8);
        out->size = get32(buf + 12);
        out->round = get32(buf + 16);
        out->options = get32(buf + 20);
        memcpy(out->nonce, buf + 24, FL_WIRE_HS_NONCE);
    }
    return FL_WIRE_OK;
}

void fl_wire_challenge_encode(uint8_t out[FL_WIRE_CHALLENGE_SIZE], const fl_wire_challenge *c) {
    memset(out, 0, FL_WIRE_CHALLENGE_SIZE);
    put32(out, FL_WIRE_MAGIC);
    put16(out + 4, FL_WIRE_VERSION);
    put32(out + 8, FL_WIRE_OK);
    put32(out + 12, c->rank);
    put32(out + 16, c->options);
    memcpy(out + 24, c->nonce, FL_WIRE_HS_NONCE);
    memcpy(out + 56, c->mac, FL_WIRE_HS_MAC);
}

int fl_wire_challenge_parse(const uint8_t *buf, size_t n, uint32_t want_rank,
                            uint32_t *their_status, fl_wire_challenge *out, char *reason,
                            size_t cap) {
    if (their_status)
        *their_status = FL_WIRE_OK;
    if (n >= 12 && get32(buf + 8) != FL_WIRE_OK) /* a refusal: exactly a reply */
        return fl_wire_reply_parse(buf, n, want_rank, their_status, reason, cap);
    int st = head_ok(buf, n, reason, cap);
    if (st != FL_WIRE_OK)
        return st;
    if (n >= 16 && get32(buf + 12) != want_rank)
        return refuse(FL_WIRE_BAD_RANK, reason, cap, "challenge from rank %u, expected rank %u",
                      (unsigned)get32(buf + 12), (unsigned)want_rank);
    if (n >= 20) {
        uint32_t o = get32(buf + 16);
        if ((o & ~FL_WIRE_OPT_ALL) || (o & FL_WIRE_OPT_ENC_MASK) == 3)
            return refuse(FL_WIRE_BAD_FLAGS, reason, cap, "unknown handshake options 0x%x",
                          (unsigned)o);
    }
    if (n < FL_WIRE_CHALLENGE_SIZE)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated challenge (%zu of %d bytes)",
                      n, FL_WIRE_CHALLENGE_SIZE);
    if (get16(buf + 6) != 0 || get32(buf + 20) != 0)
        return refuse(FL_WIRE_BAD_FLAGS, reason, cap, "reserved challenge fields are not 0");
    if (out) {
        out->rank = get32(buf + 12);
        out->options = get32(buf + 16);
        memcpy(out->nonce, buf + 24, FL_WIRE_HS_NONCE);
        memcpy(out->mac, buf + 56, FL_WIRE_HS_MAC);
    }
    return FL_WIRE_OK;
}

void fl_wire_auth_encode(uint8_t out[FL_WIRE_AUTH_SIZE], uint32_t rank,
                         const uint8_t mac[FL_WIRE_HS_MAC]) {
    put32(out, FL_WIRE_AUTH_MAGIC);
    put32(out + 4, rank);
    memcpy(out + 8, mac, FL_WIRE_HS_MAC);
}

int fl_wire_auth_parse(const uint8_t *buf, size_t n, uint32_t want_rank,
                       uint8_t mac[FL_WIRE_HS_MAC], char *reason, size_t cap) {
    if (n >= 4 && get32(buf) != FL_WIRE_AUTH_MAGIC)
        return refuse(FL_WIRE_BAD_MAGIC, reason, cap, "bad magic 0x%08x in the proof",
                      (unsigned)get32(buf));
    if (n >= 8 && get32(buf + 4) != want_rank)
        return refuse(FL_WIRE_BAD_RANK, reason, cap, "proof from rank %u after a hello from "
                      "rank %u", (unsigned)get32(buf + 4), (unsigned)want_rank);
    if (n < FL_WIRE_AUTH_SIZE)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated proof (%zu of %d bytes)", n,
                      FL_WIRE_AUTH_SIZE);
    if (mac)
        memcpy(mac, buf + 8, FL_WIRE_HS_MAC);
    return FL_WIRE_OK;
}

void fl_wire_reply_encode(uint8_t out[FL_WIRE_REPLY_SIZE], uint32_t status, uint32_t rank) {
    memset(out, 0, FL_WIRE_REPLY_SIZE);
    put32(out, FL_WIRE_MAGIC);
    put16(out + 4, FL_WIRE_VERSION);
    put32(out + 8, status);
    put32(out + 12, rank);
}

int fl_wire_reply_parse(const uint8_t *buf, size_t n, uint32_t want_rank, uint32_t *their_status,
                        char *reason, size_t cap) {
    if (their_status)
        *their_status = FL_WIRE_OK;
    int hst = head_ok(buf, n, reason, cap);
    if (hst != FL_WIRE_OK)
        return hst;
    if (n < FL_WIRE_REPLY_SIZE)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated reply (%zu of %d bytes)", n,
                      FL_WIRE_REPLY_SIZE);
    uint32_t status = get32(buf + 8), rank = get32(buf + 12);
    if (rank != want_rank)
        return refuse(FL_WIRE_BAD_RANK, reason, cap, "reply from rank %u, expected rank %u",
                      (unsigned)rank, (unsigned)want_rank);
    if (status == FL_WIRE_OK)
        return FL_WIRE_OK;
    if (status == FL_WIRE_TRUNCATED || status >= FL_WIRE_STATUS_COUNT)
        return refuse(FL_WIRE_BAD_STATUS, reason, cap, "reply with unknown status %u",
                      (unsigned)status);
    if (their_status)
        *their_status = status;
    return refuse((int)status, reason, cap, "refused: %s", fl_wire_status_str((int)status));
}

/* ---- frames ---- */

void fl_wire_frame_encode(uint8_t out[FL_WIRE_FRAME_SIZE], uint32_t type, uint64_t seq,
                          uint64_t len) {
    put32(out, FL_WIRE_FRAME_MAGIC);
    put32(out + 4, type);
    put64(out + 8, seq);
    put64(out + 16, len);
}

int fl_wire_frame_parse(const uint8_t *buf, size_t n, uint64_t want_seq, uint64_t want_len,
                        uint64_t max_any, fl_wire_frame *out, char *reason, size_t cap) {
    if (n >= 4 && get32(buf) != FL_WIRE_FRAME_MAGIC)
        return refuse(FL_WIRE_BAD_MAGIC, reason, cap, "bad magic 0x%08x", (unsigned)get32(buf));
    if (n >= 8 && get32(buf + 4) != FL_WIRE_DATA && get32(buf + 4) != FL_WIRE_ABORT &&
        get32(buf + 4) != FL_WIRE_KEEPALIVE)
        return refuse(FL_WIRE_BAD_TYPE, reason, cap, "unknown frame type %u",
                      (unsigned)get32(buf + 4));
    if (n >= 16 && get64(buf + 8) != want_seq)
        return refuse(FL_WIRE_BAD_SEQ, reason, cap, "sequence number %llu, expected %llu",
                      (unsigned long long)get64(buf + 8), (unsigned long long)want_seq);
    if (n < FL_WIRE_FRAME_SIZE)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated frame header (%zu of %d bytes)",
                      n, FL_WIRE_FRAME_SIZE);
    uint32_t type = get32(buf + 4);
    uint64_t len = get64(buf + 16);
    if (type == FL_WIRE_ABORT) {
        if (len > FL_WIRE_ABORT_MAX)
            return refuse(FL_WIRE_BAD_LENGTH, reason, cap,
                          "abort message of %llu bytes, at most %d", (unsigned long long)len,
                          FL_WIRE_ABORT_MAX);
    } else if (type == FL_WIRE_KEEPALIVE) {
        if (len != 0)
            return refuse(FL_WIRE_BAD_LENGTH, reason, cap, "keepalive of %llu bytes, expected 0",
                          (unsigned long long)len);
    } else if (want_len == FL_WIRE_LEN_ANY) {
        if (len == 0 || len > max_any)
            return refuse(FL_WIRE_BAD_LENGTH, reason, cap,
                          "data frame of %llu bytes, expected 1 to %llu",
                          (unsigned long long)len, (unsigned long long)max_any);
    } else if (len != want_len) {
        return refuse(FL_WIRE_BAD_LENGTH, reason, cap, "data frame of %llu bytes, expected %llu",
                      (unsigned long long)len, (unsigned long long)want_len);
    }
    if (out) {
        out->type = type;
        out->seq = get64(buf + 8);
        out->len = len;
    }
    return FL_WIRE_OK;
}

void fl_wire_keepalive_encode(uint8_t out[FL_WIRE_KEEPALIVE_BODY], uint64_t seq,
                              uint64_t counter) {
    fl_wire_frame_encode(out, FL_WIRE_KEEPALIVE, seq, 0);
    put64(out + FL_WIRE_FRAME_SIZE, counter);
}

int fl_wire_keepalive_parse(const uint8_t *buf, size_t n, uint64_t want_seq, uint64_t *counter,
                            char *reason, size_t cap) {
    fl_wire_frame f;
    int st = fl_wire_frame_parse(buf, n, want_seq, 0, 0, &f, reason, cap);
    if (st != FL_WIRE_OK)
        return st;
    if (f.type != FL_WIRE_KEEPALIVE)
        return refuse(FL_WIRE_BAD_TYPE, reason, cap, "frame type %u, expected a keepalive",
                      (unsigned)f.type);
    if (n < FL_WIRE_KEEPALIVE_BODY)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated keepalive (%zu of %d bytes)", n,
                      FL_WIRE_KEEPALIVE_BODY);
    *counter = get64(buf + FL_WIRE_FRAME_SIZE);
    return FL_WIRE_OK;
}

/* ---- same-host upgrade ---- */

static int magic_ok(const uint8_t *buf, size_t n, size_t need, uint32_t magic, const char *what,
                    char *reason, size_t cap) {
    if (n >= 4 && get32(buf) != magic)
        return refuse(FL_WIRE_BAD_MAGIC, reason, cap, "bad magic 0x%08x in %s",
                      (unsigned)get32(buf), what);
    if (n < need)
        return refuse(FL_WIRE_TRUNCATED, reason, cap, "truncated %s (%zu of %zu bytes)", what, n,
                      need);
    return FL_WIRE_OK;
}

void fl_wire_offer_encode(uint8_t out[FL_WIRE_OFFER_SIZE], const fl_wire_offer *o) {
    memset(out, 0, FL_WIRE_OFFER_SIZE);
    put32(out, FL_WIRE_OFFER_MAGIC);
    put32(out + 4, o->has_unix);
    memcpy(out + 8, o->name, strnlen(o->name, FL_WIRE_LOCAL_NAME - 1));
    memcpy(out + 32, o->nonce, FL_WIRE_NONCE);
}

int fl_wire_offer_parse(const uint8_t *buf, size_t n, fl_wire_offer *out, char *reason,
                        size_t cap) {
    int st = magic_ok(buf, n, FL_WIRE_OFFER_SIZE, FL_WIRE_OFFER_MAGIC, "local offer", reason,
                      cap);
    if (st != FL_WIRE_OK)
        return st;
    uint32_t has = get32(buf + 4);
    if (has > 1)
        return refuse(FL_WIRE_BAD_TYPE, reason, cap, "local offer flag %u", (unsigned)has);
    const uint8_t *name = buf + 8;
    size_t len = 0;
    while (len < FL_WIRE_LOCAL_NAME && name[len])
        len++;
    if (len == FL_WIRE_LOCAL_NAME || (has && len == 0))
        return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "bad local socket name");
    for (size_t i = 0; i < len; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
              name[i] == '-'))
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "bad local socket name");
    for (size_t i = len; i < FL_WIRE_LOCAL_NAME; i++)
        if (name[i])
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "bad local socket name");
    if (out) {
        out->has_unix = has;
        memcpy(out->name, name, FL_WIRE_LOCAL_NAME);
        memcpy(out->nonce, buf + 32, FL_WIRE_NONCE);
    }
    return FL_WIRE_OK;
}

void fl_wire_decision_encode(uint8_t out[FL_WIRE_DECISION_SIZE], uint32_t use_unix) {
    put32(out, FL_WIRE_DECIDE_MAGIC);
    put32(out + 4, use_unix);
}

int fl_wire_decision_parse(const uint8_t *buf, size_t n, uint32_t *use_unix, char *reason,
                           size_t cap) {
    int st = magic_ok(buf, n, FL_WIRE_DECISION_SIZE, FL_WIRE_DECIDE_MAGIC, "local decision",
                      reason, cap);
    if (st != FL_WIRE_OK)
        return st;
    if (get32(buf + 4) > 1)
        return refuse(FL_WIRE_BAD_TYPE, reason, cap, "local decision %u",
                      (unsigned)get32(buf + 4));
    if (use_unix)
        *use_unix = get32(buf + 4);
    return FL_WIRE_OK;
}

void fl_wire_proof_encode(uint8_t out[FL_WIRE_PROOF_SIZE], uint32_t rank,
                          const uint8_t nonce[FL_WIRE_NONCE]) {
    put32(out, FL_WIRE_PROOF_MAGIC);
    put32(out + 4, rank);
    memcpy(out + 8, nonce, FL_WIRE_NONCE);
}

int fl_wire_proof_parse(const uint8_t *buf, size_t n, uint32_t size, uint32_t *rank,
                        uint8_t nonce[FL_WIRE_NONCE], char *reason, size_t cap) {
    int st = magic_ok(buf, n, FL_WIRE_PROOF_SIZE, FL_WIRE_PROOF_MAGIC, "local proof", reason,
                      cap);
    if (st != FL_WIRE_OK)
        return st;
    if (get32(buf + 4) >= size)
        return refuse(FL_WIRE_BAD_RANK, reason, cap, "rank %u out of range for %u ranks",
                      (unsigned)get32(buf + 4), (unsigned)size);
    if (rank)
        *rank = get32(buf + 4);
    if (nonce)
        memcpy(nonce, buf + 8, FL_WIRE_NONCE);
    return FL_WIRE_OK;
}

/* ---- endpoints ---- */

static int host_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_';
}
static int v6_char(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == ':' || ch == '.' || ch == '%' || ch == '_' || ch == '-';
}

int fl_wire_endpoint_parse(const char *s, char *host, size_t hostcap, int *port, char *reason,
                           size_t cap) {
    size_t len = strnlen(s, FL_WIRE_ENDPOINT_LEN);
    if (len >= FL_WIRE_ENDPOINT_LEN)
        return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "longer than %d characters",
                      FL_WIRE_ENDPOINT_LEN - 1);
    const char *hb, *he, *colon;
    if (s[0] == '[') {
        hb = s + 1;
        he = memchr(hb, ']', len - 1);
        if (!he)
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "'[' without ']'");
        for (const char *p = hb; p < he; p++)
            if (!v6_char(*p))
                return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "bad character in IPv6 address");
        if (he[1] != ':')
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "no ':port' after ']'");
        colon = he + 1;
    } else {
        colon = memchr(s, ':', len);
        if (!colon)
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "no ':port'");
        hb = s;
        he = colon;
        if (memchr(colon + 1, ':', len - (size_t)(colon + 1 - s)))
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap,
                          "more than one ':' (write IPv6 addresses as [addr]:port)");
        for (const char *p = hb; p < he; p++)
            if (!host_char(*p))
                return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "bad character in host name");
    }
    if (he == hb)
        return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "empty host");
    const char *ps = colon + 1;
    long v = 0;
    int digits = 0;
    for (; *ps; ps++, digits++) {
        if (*ps < '0' || *ps > '9' || digits >= 5)
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "port is not a number in 1..65535");
        v = v * 10 + (*ps - '0');
    }
    if (digits == 0 || v < 1 || v > 65535)
        return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "port is not a number in 1..65535");
    size_t hl = (size_t)(he - hb);
    if (host) {
        if (hl >= hostcap)
            return refuse(FL_WIRE_BAD_ENDPOINT, reason, cap, "host name too long");
        memcpy(host, hb, hl);
        host[hl] = '\0';
    }
    if (port)
        *port = (int)v;
    return FL_WIRE_OK;
}
