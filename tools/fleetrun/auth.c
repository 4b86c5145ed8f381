/* auth.c - the authentication of the coordinator's line protocol (lines.c): the proofs of the
 * challenge-response that opens every connection between a node and the coordinator, its
 * session keys, and the MAC that seals every later line. The job token never goes on the wire.
 *
 *   K_auth  = HKDF-SHA256(token, salt "fleetrun coordinator v2", info "auth")
 *   K_lines = HKDF-SHA256(token, salt "fleetrun coordinator v2", info "lines")
 *   T(label) = label (16 bytes) || version || node || nproc || round || nonce_m || nonce_c
 *              (numbers as 4 bytes little-endian; nonces 32 fresh random bytes of each side)
 *   proof of the member      = HMAC-SHA256(K_auth, T("fleetrun member"))
 *   proof of the coordinator = HMAC-SHA256(K_auth, T("fleetrun coord"))
 *   key of member -> coord   = HKDF-SHA256(K_lines, salt nonce_m || nonce_c,
 *                                          info T("fleetrun m>c"))
 *   key of coord -> member   = HKDF-SHA256(K_lines, salt nonce_m || nonce_c,
 *                                          info T("fleetrun c>m"))
 *   a sealed line            = hex(HMAC-SHA256(key of its direction, seq || text)) " " text
 *
 * seq counts the lines of a direction from 0 (8 bytes little-endian) and is not sent: a changed,
 * dropped, reordered, replayed or inserted line fails its check. The labels differ per side, so
 * a proof cannot be reflected; both nonces are inside, so a recorded exchange cannot be replayed;
 * the node, its worker count and the round are inside, so they cannot be changed on the way.
 * The primitives are the library's (include/fleet/auth.h: OpenSSL libcrypto). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "fleet/auth.h"
#include "fleetrun.h"

static const char SALT[] = "fleetrun coordinator v2";

_Static_assert(FR_NONCE == 32 && FR_KEY == FL_AUTH_KEY && FR_MAC == FL_AUTH_MAC,
               "fleetrun.h's sizes are auth.h's");

static void hex_of(const unsigned char *b, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

static int digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool fr_parse_hex(const char *s, unsigned char *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int hi = digit(s[2 * i]), lo = hi < 0 ? -1 : digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return s[2 * n] == 0 || s[2 * n] == ' ';
}

int fr_auth_nonce(unsigned char nonce[FR_NONCE], char hex[2 * FR_NONCE + 1]) {
    if (fl_auth_random(nonce, FR_NONCE) < 0)
        return -1;
    hex_of(nonce, FR_NONCE, hex);
    return 0;
}

/* K_auth or K_lines of the token. */
static int token_key(const char *token, const char *info, unsigned char key[FR_KEY]) {
    return fl_auth_hkdf((const uint8_t *)token, strnlen(token, MAX_TOKEN),
                        (const uint8_t *)SALT, sizeof SALT - 1, (const uint8_t *)info,
                        strlen(info), key, FR_KEY);
}

#define T_LEN (16 + 5 * 4 + 2 * FR_NONCE)
static void transcript(const char *label, const fr_auth *a, unsigned char out[T_LEN]) {
    uint32_t v[5] = {FR_COORD_VERSION, (uint32_t)a->node, (uint32_t)a->nproc, a->round, 0};
    memset(out, 0, T_LEN);
    memcpy(out, label, strnlen(label, 16));
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 4; b++)
            out[16 + 4 * k + b] = (unsigned char)(v[k] >> (8 * b));
    /* 4 reserved zero bytes: room for a flag without a new layout */
    memcpy(out + 36, a->nonce_m, FR_NONCE);
    memcpy(out + 36 + FR_NONCE, a->nonce_c, FR_NONCE);
}

static int proof(const char *token, int side, const fr_auth *a, unsigned char mac[FR_MAC]) {
    unsigned char key[FR_KEY], t[T_LEN];
    transcript(side == FR_SIDE_MEMBER ? "fleetrun member" : "fleetrun coord", a, t);
    int rc = token_key(token, "auth", key) < 0 ? -1 : fl_auth_hmac(key, FR_KEY, t, T_LEN, mac);
    fl_auth_wipe(key, sizeof key);
    return rc < 0 ? -1 : 0;
}

int fr_auth_proof(const char *token, int side, const fr_auth *a, char hex[2 * FR_MAC + 1]) {
    unsigned char mac[FR_MAC];
    if (proof(token, side, a, mac) < 0)
        return -1;
    hex_of(mac, FR_MAC, hex);
    return 0;
}

bool fr_auth_check(const char *token, int side, const fr_auth *a, const char *hex) {
    unsigned char want[FR_MAC], got[FR_MAC];
    bool ok = fr_parse_hex(hex, got, FR_MAC) && hex[2 * FR_MAC] == 0 &&
              proof(token, side, a, want) == 0 && fl_auth_equal(want, got, FR_MAC);
    fl_auth_wipe(want, sizeof want);
    return ok;
}

int fr_auth_keys(const char *token, int side, fr_auth *a) {
    unsigned char master[FR_KEY], salt[2 * FR_NONCE], t[T_LEN], m2c[FR_KEY], c2m[FR_KEY];
    memcpy(salt, a->nonce_m, FR_NONCE);
    memcpy(salt + FR_NONCE, a->nonce_c, FR_NONCE);
    int rc = token_key(token, "lines", master);
    transcript("fleetrun m>c", a, t);
    if (rc == 0)
        rc = fl_auth_hkdf(master, FR_KEY, salt, sizeof salt, t, T_LEN, m2c, FR_KEY);
    transcript("fleetrun c>m", a, t);
    if (rc == 0)
        rc = fl_auth_hkdf(master, FR_KEY, salt, sizeof salt, t, T_LEN, c2m, FR_KEY);
    memcpy(a->tx, side == FR_SIDE_MEMBER ? m2c : c2m, FR_KEY);
    memcpy(a->rx, side == FR_SIDE_MEMBER ? c2m : m2c, FR_KEY);
    a->tx_seq = a->rx_seq = 0;
    a->step = rc == 0 ? FR_AUTH_DONE : a->step;
    fl_auth_wipe(master, sizeof master);
    fl_auth_wipe(m2c, sizeof m2c);
    fl_auth_wipe(c2m, sizeof c2m);
    return rc < 0 ? -1 : 0;
}

void fr_auth_wipe(fr_auth *a) { fl_auth_wipe(a, sizeof *a); }

/* HMAC(key, seq || text) */
static int line_mac(const unsigned char key[FR_KEY], uint64_t seq, const char *text, size_t n,
                    unsigned char mac[FR_MAC]) {
    unsigned char msg[8 + LINEBUF_CAP];
    if (n > LINEBUF_CAP)
        return -1;
    for (int b = 0; b < 8; b++)
        msg[b] = (unsigned char)(seq >> (8 * b));
    memcpy(msg + 8, text, n);
    return fl_auth_hmac(key, FR_KEY, msg, 8 + n, mac) < 0 ? -1 : 0;
}

int fr_send_sealed(int fd, fr_auth *a, const char *fmt, ...) {
    char buf[16384];
    unsigned char mac[FR_MAC];
    const size_t head = 2 * FR_MAC + 1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + head, sizeof buf - head - 1, fmt, ap);
    va_end(ap);
    if (a->step != FR_AUTH_DONE || n < 0 || (size_t)n >= sizeof buf - head - 1 ||
        line_mac(a->tx, a->tx_seq, buf + head, (size_t)n, mac) < 0)
        return -1;
    a->tx_seq++;
    hex_of(mac, FR_MAC, buf);
    buf[2 * FR_MAC] = ' ';
    size_t len = head + (size_t)n;
    buf[len++] = '\n';
    ssize_t k = send(fd, buf, len, MSG_NOSIGNAL);
    return k == (ssize_t)len ? 0 : -1;
}

int fr_open_sealed(fr_auth *a, char *line) {
    unsigned char got[FR_MAC], want[FR_MAC];
    size_t len = strlen(line);
    if (a->step != FR_AUTH_DONE || len < 2 * FR_MAC + 1 || line[2 * FR_MAC] != ' ' ||
        !fr_parse_hex(line, got, FR_MAC))
        return -1;
    const char *text = line + 2 * FR_MAC + 1;
    size_t n = len - 2 * FR_MAC - 1;
    bool ok = line_mac(a->rx, a->rx_seq, text, n, want) == 0 && fl_auth_equal(want, got, FR_MAC);
    if (!ok)
        return -1;
    a->rx_seq++;
    memmove(line, text, n + 1);
    return 0;
}
