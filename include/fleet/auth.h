/* auth.h - keyed hashing for protocols outside the library that authenticate with the job token
 * (fleetrun's coordinator between nodes, tools/fleetrun/auth.c): random bytes, HMAC-SHA256,
 * HKDF-SHA256 (RFC 5869), constant-time comparison and wiping. The same OpenSSL libcrypto
 * calls as the tcp transport's handshake (src/comm/crypto.h, private); nothing hand-written. */
#ifndef FLEET_AUTH_H
#define FLEET_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_AUTH_KEY 32 /* bytes of a key from fl_auth_hkdf as used here */
#define FL_AUTH_MAC 32 /* bytes of an HMAC-SHA256 */

/* n bytes from the system's CSPRNG (OpenSSL RAND_bytes). 0, or FL_EIO (message set). */
int fl_auth_random(void *buf, size_t n);

/* mac = HMAC-SHA256(key[keylen], msg[n]). 0, or FL_EIO (message set). */
int fl_auth_hmac(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                 uint8_t mac[FL_AUTH_MAC]);

/* HKDF-SHA256: extract from ikm[ikmlen] with salt[saltlen] (both may be empty), expand with
 * info[infolen] into out[outlen] (at most 255 * 32 bytes). 0, or FL_EIO (message set). */
int fl_auth_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t *salt, size_t saltlen,
                 const uint8_t *info, size_t infolen, uint8_t *out, size_t outlen);

/* Whether a[n] and b[n] are equal, in time that depends on n only (CRYPTO_memcmp). */
bool fl_auth_equal(const void *a, const void *b, size_t n);

/* Overwrites p[n] with zeros in a way the compiler keeps (OPENSSL_cleanse): for keys. */
void fl_auth_wipe(void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* FLEET_AUTH_H */
