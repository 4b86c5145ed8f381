/* crypto.c - random bytes, HMAC, HKDF and the frame AEAD over OpenSSL's libcrypto (crypto.h).
 * The AEAD keeps one EVP_CIPHER_CTX per direction with its key set once, so a frame costs one
 * IV set plus the cipher itself (no allocation in the step loop). */
#include "crypto.h"

#include "fleet/status.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct fl_aead {
    EVP_CIPHER_CTX *ctx;
    fl_aead_cipher  cipher;
    uint8_t         key[FL_CRYPTO_KEY];
};

int fl_crypto_random(void *buf, size_t n) {
    if (n > INT_MAX || RAND_bytes(buf, (int)n) != 1)
        return fl_fail(FL_EIO, "comm: the system's random number generator failed "
                       "(OpenSSL RAND_bytes)");
    return 0;
}

int fl_crypto_hmac(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                   uint8_t mac[FL_CRYPTO_MAC]) {
    unsigned int len = 0;
    if (keylen > INT_MAX || !HMAC(EVP_sha256(), key, (int)keylen, msg, n, mac, &len) ||
        len != FL_CRYPTO_MAC)
        return fl_fail(FL_EIO, "comm: HMAC-SHA256 failed (OpenSSL)");
    return 0;
}

int fl_crypto_hkdf(const uint8_t *ikm, size_t ikmlen, const uint8_t *salt, size_t saltlen,
                   const uint8_t *info, size_t infolen, uint8_t *out, size_t outlen) {
    static const uint8_t nothing[1];
    EVP_PKEY_CTX *p = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t len = outlen;
    /* OpenSSL refuses an empty key; a job of one rank may have an empty token */
    int ok = p && EVP_PKEY_derive_init(p) > 0 && EVP_PKEY_CTX_set_hkdf_md(p, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_salt(p, saltlen ? salt : nothing, (int)saltlen) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(p, ikmlen ? ikm : nothing, ikmlen ? (int)ikmlen : 1) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(p, info, (int)infolen) > 0 &&
             EVP_PKEY_derive(p, out, &len) > 0 && len == outlen;
    EVP_PKEY_CTX_free(p);
    return ok ? 0 : fl_fail(FL_EIO, "comm: HKDF-SHA256 failed (OpenSSL)");
}

bool fl_crypto_equal(const void *a, const void *b, size_t n) {
    return CRYPTO_memcmp(a, b, n) == 0;
}

bool fl_crypto_has_aes(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRYPTO)
    return true;
#else
    return false;
#endif
}

const char *fl_aead_cipher_name(fl_aead_cipher c) {
    return c == FL_AEAD_AES256GCM ? "AES-256-GCM" : "ChaCha20-Poly1305";
}

static const EVP_CIPHER *evp_of(fl_aead_cipher c) {
    return c == FL_AEAD_AES256GCM ? EVP_aes_256_gcm() : EVP_chacha20_poly1305();
}

int fl_aead_create(fl_aead_cipher cipher, const uint8_t key[FL_CRYPTO_KEY], fl_aead **out) {
    fl_aead *a = calloc(1, sizeof *a);
    if (!a)
        return fl_fail(FL_ENOMEM, "out of memory for a connection's cipher");
    a->cipher = cipher;
    memcpy(a->key, key, FL_CRYPTO_KEY);
    a->ctx = EVP_CIPHER_CTX_new();
    /* the key is set once; every frame only sets its nonce (12 bytes: the default for both) */
    if (!a->ctx || EVP_CipherInit_ex(a->ctx, evp_of(cipher), NULL, a->key, NULL, -1) != 1) {
        fl_aead_free(a);
        return fl_fail(FL_EIO, "comm: cannot set up %s (OpenSSL)", fl_aead_cipher_name(cipher));
    }
    *out = a;
    return 0;
}

void fl_aead_free(fl_aead *a) {
    if (!a)
        return;
    EVP_CIPHER_CTX_free(a->ctx); /* clears its key schedule */
    OPENSSL_cleanse(a->key, sizeof a->key);
    free(a);
}

/* 96-bit nonce: the nonce space (crypto.h) in 4 bytes, then the number, little-endian. Keys
 * differ per connection and direction, and a direction's numbers never repeat in a space. */
static void nonce_of(uint32_t space, uint64_t seq, uint8_t iv[12]) {
    for (int i = 0; i < 4; i++)
        iv[i] = (uint8_t)(space >> (8 * i));
    for (int i = 0; i < 8; i++)
        iv[4 + i] = (uint8_t)(seq >> (8 * i));
}

/* One AEAD pass; enc 1 seals, 0 opens. Lengths above INT_MAX go in INT_MAX pieces. */
static int pass(fl_aead *a, int enc, uint32_t space, uint64_t seq, const uint8_t *aad,
                size_t aadlen, const uint8_t *in, uint8_t *out, size_t n, uint8_t *tag) {
    uint8_t iv[12];
    int len;
    nonce_of(space, seq, iv);
    if (EVP_CipherInit_ex(a->ctx, NULL, NULL, NULL, iv, enc) != 1)
        return -1;
    if (aadlen && EVP_CipherUpdate(a->ctx, NULL, &len, aad, (int)aadlen) != 1)
        return -1;
    for (size_t done = 0; done < n;) {
        size_t k = n - done > INT_MAX ? INT_MAX : n - done;
        if (EVP_CipherUpdate(a->ctx, out + done, &len, in + done, (int)k) != 1)
            return -1;
        done += k;
    }
    if (!enc && EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_SET_TAG, FL_CRYPTO_TAG, tag) != 1)
        return -1;
    if (EVP_CipherFinal_ex(a->ctx, out + n, &len) != 1)
        return -1; /* opening: the tag did not match */
    if (enc && EVP_CIPHER_CTX_ctrl(a->ctx, EVP_CTRL_AEAD_GET_TAG, FL_CRYPTO_TAG, tag) != 1)
        return -1;
    return 0;
}

int fl_aead_seal(fl_aead *a, uint64_t seq, const uint8_t *aad, size_t aadlen, const uint8_t *in,
                 uint8_t *out, size_t n, uint8_t tag[FL_CRYPTO_TAG]) {
    if (pass(a, 1, FL_AEAD_FRAMES, seq, aad, aadlen, in, out, n, tag) < 0)
        return fl_fail(FL_EIO, "comm: %s encryption failed (OpenSSL)",
                       fl_aead_cipher_name(a->cipher));
    return 0;
}

int fl_aead_open(fl_aead *a, uint64_t seq, const uint8_t *aad, size_t aadlen, uint8_t *buf,
                 size_t n, const uint8_t tag[FL_CRYPTO_TAG]) {
    uint8_t t[FL_CRYPTO_TAG];
    memcpy(t, tag, sizeof t);
    return pass(a, 0, FL_AEAD_FRAMES, seq, aad, aadlen, buf, buf, n, t);
}

int fl_aead_seal_empty(fl_aead *a, uint32_t space, uint64_t n, const uint8_t *aad,
                       size_t aadlen, uint8_t tag[FL_CRYPTO_TAG]) {
    uint8_t none[1] = {0};
    if (pass(a, 1, space, n, aad, aadlen, none, none, 0, tag) < 0)
        return fl_fail(FL_EIO, "comm: %s failed (OpenSSL)", fl_aead_cipher_name(a->cipher));
    return 0;
}

int fl_aead_open_empty(fl_aead *a, uint32_t space, uint64_t n, const uint8_t *aad,
                       size_t aadlen, const uint8_t tag[FL_CRYPTO_TAG]) {
    uint8_t none[1] = {0}, t[FL_CRYPTO_TAG];
    memcpy(t, tag, sizeof t);
    return pass(a, 0, space, n, aad, aadlen, none, none, 0, t);
}
