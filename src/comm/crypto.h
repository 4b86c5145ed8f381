/* crypto.h - the few cryptographic primitives the tcp transport needs, all from OpenSSL's
 * libcrypto (no hand-written primitives): random bytes, HMAC-SHA256, HKDF-SHA256 (RFC 5869)
 * and an AEAD per connection and direction (AES-256-GCM, or ChaCha20-Poly1305 where the CPU
 * has no AES instructions) whose 96-bit nonce is the frame's 64-bit sequence number (or a
 * keepalive's counter, in a nonce space of its own). Private
 * to src/comm. */
#ifndef FLEET_CRYPTO_H
#define FLEET_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FL_CRYPTO_KEY 32 /* HMAC and AEAD keys, HKDF output per key */
#define FL_CRYPTO_MAC 32 /* HMAC-SHA256 */
#define FL_CRYPTO_TAG 16 /* AEAD tag appended to every encrypted frame */

typedef enum { FL_AEAD_AES256GCM = 0, FL_AEAD_CHACHA20POLY1305 = 1 } fl_aead_cipher;

/* n bytes from the OS's CSPRNG (RAND_bytes). 0 or FL_EIO. */
int fl_crypto_random(void *buf, size_t n);

/* HMAC-SHA256(key[keylen], msg[n]) into mac. 0 or FL_EIO. */
int fl_crypto_hmac(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                   uint8_t mac[FL_CRYPTO_MAC]);

/* HKDF-SHA256 (RFC 5869): extract with salt (may be empty), expand with info into out[outlen].
 * 0 or FL_EIO. */
int fl_crypto_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t *salt, size_t saltlen,
                   const uint8_t *info, size_t infolen, uint8_t *out, size_t outlen);

/* Constant-time equality of two n-byte strings (CRYPTO_memcmp). */
bool fl_crypto_equal(const void *a, const void *b, size_t n);

/* Whether this CPU runs AES-GCM in hardware (x86 AES-NI and PCLMULQDQ; ARMv8 crypto
 * extensions are assumed where AES is compiled in). The handshake uses AES-256-GCM only when
 * both sides say yes, else ChaCha20-Poly1305, which is fast in software everywhere. */
bool fl_crypto_has_aes(void);

const char *fl_aead_cipher_name(fl_aead_cipher c);

/* One direction of one connection: a key and its cipher context. Not thread-safe. */
typedef struct fl_aead fl_aead;

/* key is copied. 0, FL_ENOMEM or FL_EIO. */
int  fl_aead_create(fl_aead_cipher cipher, const uint8_t key[FL_CRYPTO_KEY], fl_aead **out);
/* Wipes the key (OPENSSL_cleanse) and frees. NULL is a no-op. */
void fl_aead_free(fl_aead *a);

/* Nonce spaces under one key (the nonce's first 4 bytes): frames use their sequence number in
 * FL_AEAD_FRAMES, keepalives their own counter in FL_AEAD_KEEPALIVES, so the two never share a
 * nonce. */
enum { FL_AEAD_FRAMES = 0, FL_AEAD_KEEPALIVES = 1 };

/* Encrypts buf[n] in place (out may equal in) under nonce (FL_AEAD_FRAMES, seq), authenticating aad[aadlen]
 * too; writes the tag. in and out may be the same buffer or disjoint. 0 or FL_EIO. */
int fl_aead_seal(fl_aead *a, uint64_t seq, const uint8_t *aad, size_t aadlen, const uint8_t *in,
                 uint8_t *out, size_t n, uint8_t tag[FL_CRYPTO_TAG]);
/* Decrypts buf[n] in place and checks the tag: 0 when authentic, -1 when not (the buffer then
 * holds garbage and must not be used). */
int fl_aead_open(fl_aead *a, uint64_t seq, const uint8_t *aad, size_t aadlen, uint8_t *buf,
                 size_t n, const uint8_t tag[FL_CRYPTO_TAG]);
/* A tag over aad alone (an empty payload) under nonce (space, n): authenticates a message
 * that has nothing secret (a keepalive). The caller never uses an n twice in a space. 0 or
 * FL_EIO. */
int fl_aead_seal_empty(fl_aead *a, uint32_t space, uint64_t n, const uint8_t *aad,
                       size_t aadlen, uint8_t tag[FL_CRYPTO_TAG]);
/* 0 when tag is fl_aead_seal_empty's for the same space, n and aad under this key; -1 when not. */
int fl_aead_open_empty(fl_aead *a, uint32_t space, uint64_t n, const uint8_t *aad,
                       size_t aadlen, const uint8_t tag[FL_CRYPTO_TAG]);

#endif /* FLEET_CRYPTO_H */
