/* auth.c - include/fleet/auth.h: the transport's private primitives (crypto.h) lent to programs
 * outside the library, so that fleetrun's coordinator uses the same calls, not a copy. */
#include "fleet/auth.h"

#include "crypto.h"

#include <openssl/crypto.h>

int fl_auth_random(void *buf, size_t n) { return fl_crypto_random(buf, n); }

int fl_auth_hmac(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                 uint8_t mac[FL_AUTH_MAC]) {
    return fl_crypto_hmac(key, keylen, msg, n, mac);
}

int fl_auth_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t *salt, size_t saltlen,
                 const uint8_t *info, size_t infolen, uint8_t *out, size_t outlen) {
    return fl_crypto_hkdf(ikm, ikmlen, salt, saltlen, info, infolen, out, outlen);
}

bool fl_auth_equal(const void *a, const void *b, size_t n) { return fl_crypto_equal(a, b, n); }

void fl_auth_wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }

_Static_assert(FL_AUTH_MAC == FL_CRYPTO_MAC && FL_AUTH_KEY == FL_CRYPTO_KEY,
               "auth.h and crypto.h name the same sizes");
