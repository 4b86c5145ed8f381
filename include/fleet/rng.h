/* rng.h - deterministic counter-based random numbers (Philox4x32-10).
 *
 * Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a
 * 128-bit counter and a 64-bit key to 128 random bits with integer arithmetic only, so the same
 * (seed, stream) gives the same numbers on any machine. fleet keys it with the seed and uses the
 * stream (usually the rank, or a sample index) as the high counter words: streams never overlap,
 * and any position can be reached directly, which makes data generation random-access and
 * checkpoints tiny (seed, stream, position). */
#ifndef FLEET_RNG_H
#define FLEET_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: out = philox(ctr, key). */
void fl_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

typedef struct fl_rng {
    uint32_t key[2];   /* the seed */
    uint64_t stream;   /* counter words 2-3 */
    uint64_t position; /* counter words 0-1: index of the next 128-bit block */
    uint32_t buf[4];   /* the current block */
    int      used;     /* words of buf already consumed (4 = empty) */
} fl_rng;

/* Starts stream `stream` of seed `seed` at position 0. */
void     fl_rng_init(fl_rng *r, uint64_t seed, uint64_t stream);
uint32_t fl_rng_u32(fl_rng *r);
uint64_t fl_rng_u64(fl_rng *r);
/* Uniform in [0, 1) with 24 (float) or 53 (double) random bits; exact on every machine. */
float    fl_rng_uniform(fl_rng *r);
double   fl_rng_uniform_f64(fl_rng *r);
/* Uniform integer in [0, n), unbiased (rejection); n > 0. */
uint64_t fl_rng_below(fl_rng *r, uint64_t n);
/* Standard normal (Box-Muller; uses libm log/cos/sin). */
double   fl_rng_normal(fl_rng *r);
/* out[0..n) = n calls of fl_rng_normal(r) in order, bit for bit, and r where they leave it;
 * faster for large n (the Philox blocks of several draws at once). n >= 0. */
void     fl_rng_normals(fl_rng *r, double *out, int64_t n);
/* In-place Fisher-Yates shuffle of idx[0..n). */
void     fl_rng_shuffle(fl_rng *r, int64_t *idx, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_RNG_H */
