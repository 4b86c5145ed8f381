/* rng.c - Philox4x32-10 and the streams built on it.
 * Constants and round function from Salmon et al. (SC 2011), as in Random123. */
#include "fleet/rng.h"

#include "fleet/status.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void fl_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void fl_rng_init(fl_rng *r, uint64_t seed, uint64_t stream) {
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->stream = stream;
    r->position = 0;
    r->used = 4;
}

static void refill(fl_rng *r) {
    uint32_t ctr[4] = {(uint32_t)r->position, (uint32_t)(r->position >> 32), (uint32_t)r->stream,
                       (uint32_t)(r->stream >> 32)};
    fl_philox4x32(ctr, r->key, r->buf);
    r->position++;
    r->used = 0;
}

uint32_t fl_rng_u32(fl_rng *r) {
    if (r->used == 4)
        refill(r);
    return r->buf[r->used++];
}

uint64_t fl_rng_u64(fl_rng *r) {
    uint64_t hi = fl_rng_u32(r);
    return (hi << 32) | fl_rng_u32(r);
}

float fl_rng_uniform(fl_rng *r) { return (float)(fl_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double fl_rng_uniform_f64(fl_rng *r) {
    return (double)(fl_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t fl_rng_below(fl_rng *r, uint64_t n) {
    FL_ASSERT(n > 0);
    /* reject the top partial range so every residue is equally likely */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = fl_rng_u64(r);
    while (x >= limit);
    return x % n;
}

/* Box-Muller (Box and Muller 1958), the cosine branch only: u1, u2 uniform in [0, 1). */
static inline double box_muller(double u1, double u2) {
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* fl_rng_uniform_f64 of the words hi, lo (drawn in that order) */
static inline double u53(uint32_t hi, uint32_t lo) {
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

double fl_rng_normal(fl_rng *r) {
    double u1 = fl_rng_uniform_f64(r);
    double u2 = fl_rng_uniform_f64(r);
    return box_muller(u1, u2);
}

/* Philox4x32-10 of LANES consecutive blocks, position .. position + LANES - 1 of a stream, as
 * fl_philox4x32 computes each: w[word][lane]. The lanes are arrays side by side, so that the
 * compiler runs them in vector registers (one block's rounds alone are a chain of dependent
 * multiplies). Left out of the sanitizers' instrumentation: every index is a constant-bounded
 * loop's, and the checks kept the lanes in memory, which made initialising a model's
 * parameters (fl_rng_normals) most of a model test's time under ASan (ResNet-50's 23M draws,
 * 6 times in test_recompute); fl_rng_normals' own writes to out are still checked. */
enum { LANES = 8 };
#if defined(__GNUC__) || defined(__clang__)
__attribute__((no_sanitize("address", "undefined")))
#endif
static void philox_lanes(const fl_rng *r, uint32_t w[4][LANES]) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    for (int i = 0; i < LANES; i++) {
        uint64_t pos = r->position + (uint64_t)i;
        c0[i] = (uint32_t)pos;
        c1[i] = (uint32_t)(pos >> 32);
        c2[i] = (uint32_t)r->stream;
        c3[i] = (uint32_t)(r->stream >> 32);
    }
    uint32_t k0 = r->key[0], k1 = r->key[1];
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < LANES; i++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[i];
            uint64_t p1 = (uint64_t)PHILOX_M1 * c2[i];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[i] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[i] ^ k1;
            c0[i] = n0;
            c1[i] = (uint32_t)p1;
            c2[i] = n2;
            c3[i] = (uint32_t)p0;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int i = 0; i < LANES; i++) {
        w[0][i] = c0[i];
        w[1][i] = c1[i];
        w[2][i] = c2[i];
        w[3][i] = c3[i];
    }
}

/* A normal draw takes four words: from a block boundary (used == 4), draw i is block i's. */
void fl_rng_normals(fl_rng *r, double *out, int64_t n) {
    int64_t i = 0;
    for (; r->used == 4 && i + LANES <= n; i += LANES) {
        uint32_t w[4][LANES];
        philox_lanes(r, w);
        r->position += LANES;
        for (int j = 0; j < LANES; j++)
            out[i + j] = box_muller(u53(w[0][j], w[1][j]), u53(w[2][j], w[3][j]));
    }
    for (; i < n; i++)
        out[i] = fl_rng_normal(r);
}

void fl_rng_shuffle(fl_rng *r, int64_t *idx, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)fl_rng_below(r, (uint64_t)i + 1);
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}
