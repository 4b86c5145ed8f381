/* dgc_math.h - the arithmetic of Deep Gradient Compression (Lin et al. 2018, arXiv:1712.01887;
 * Paddle's dgc op), as pure functions over f32 arrays kept apart from the strategy (dgc.c), so
 * that tests/unit/test_dgc.c checks each against a plain float64 reference. Private to
 * src/strategy. Nothing here allocates, communicates or logs. */
#ifndef FLEET_DGC_MATH_H
#define FLEET_DGC_MATH_H

#include "fleet/backend.h"

#include <stdbool.h>
#include <stdint.h>

/* One selected entry on the wire and the accumulation's arguments: backend.h's types. */
typedef fl_dgc_pair dgc_pair;
typedef fl_dgc_accum_args dgc_accum_args;

/* --- schedule --- */

/* Sparsity of 0-based update `step`: -1 before rampup_begin_step (dense training), then
 * sparsity[min((step - begin) * n / rampup_step, n - 1)] (Paddle's DGC warm-up; seed 000:
 * rampup_step 100 and five values give steps 0-19 the first, 20-39 the second, ...). With
 * warmup false the ramp is skipped: sparsity[n - 1] from rampup_begin_step on. n >= 1,
 * rampup_step >= 1. */
double dgc_sparsity_at(int64_t step, int64_t begin, int64_t rampup_step, const double *sparsity,
                       int n, bool warmup);

/* k = ceil(numel * (1 - s)), the entries a tensor of numel elements sends at sparsity s in
 * [0, 1); values within 1e-9 relative above an integer count as that integer (numel 1000 at
 * s 0.999 is 1, not 2). 0 for numel 0. */
int64_t dgc_k(int64_t numel, double s);

/* Whether a sparse allgather sends fewer bytes than a dense allreduce: N * (1 - s) * 2 < 1
 * (8-byte pairs against 4-byte values, seed 000's warning that allgather grows with N). */
bool dgc_sparse_pays(int world, double s);

/* Local gradient clipping threshold: clip_norm * N^(-1/2) (paper sec. 3.2, seed 000). */
double dgc_local_clip_norm(double clip_norm, int world);

/* The received pairs' check (the kernels that use them are the backend's: dgc_kernels.h). */
/* The position of the first pair whose index is outside [0, space), or -1 if none is. */
int64_t dgc_check_pairs(const dgc_pair *pairs, int64_t n, int64_t space);

#endif /* FLEET_DGC_MATH_H */
