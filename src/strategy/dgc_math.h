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

/* --- the exchange of the pairs (docs/dgc.md "Beyond 128 workers") --- */

/* dgc_configs.exchange: the strategy's config values, in the schema's order. */
typedef enum { DGC_EXCHANGE_AUTO, DGC_EXCHANGE_ALLGATHER, DGC_EXCHANGE_SPARSE } dgc_exchange;

/* The sparse allreduce keeps at most budget * k summed pairs (k: the pairs each rank gives;
 * dgc_configs.sparse_budget, this by default): up to `budget` ranks never lose an entry, and a
 * rank receives ~(1 + budget) k pairs whatever N.
 * Measured on Fashion-MNIST's small ResNet with 8 workers against allgather-DGC (docs/dgc.md,
 * bench/RESULTS.md): budgets of 4 and 5 k dropped 38% and 23% of the pairs and cost 0.36 and
 * 0.26 pt; 7 k drops ~7% and costs nothing measurable (-0.02 pt, s.e. 0.05, 16 seeds). By
 * bench/dgc_cost.py, 7 k keeps ResNet-50 at 128 workers on 1 Gbit/s at 1.27x its computation
 * (4 k: 1.22x, 8 k: 1.29x). */
#define DGC_SPARSE_BUDGET 7

/* The estimate behind exchange auto: seconds to exchange k pairs per rank among `world` ranks
 * on a link of DGC_COST_ALPHA_S latency per message and DGC_COST_BYTE_S seconds per byte
 * (fleet's target, 1 Gbit/s Ethernet), with the tcp backend's algorithms: allgather
 * g(8 k N) alpha + 8 k (N - 1) beta; the sparse allreduce ((N - 1) + 2 ceil(log2 N) +
 * g(8 k budget) + 2 rd(N)) alpha + 8 k (1 + budget) (N - 1) / N beta, where g(B), the rounds of
 * an allgather of B bytes in all, is Bruck's ceil(log2 N) up to DGC_COST_BRUCK_MAX_BYTES or
 * DGC_COST_BRUCK_ROUND_BYTES per round it saves (N - 1 - ceil(log2 N)), the ring's N - 1
 * above (fl_tcp_gather_bruck's rule over sockets), and rd(N), recursive doubling's, is
 * log2 N, + 2 when N is not a power of two (the pairs' alltoallv takes N - 1 rounds; Bruck's
 * alltoall of the counts and allgather of the kept counts ceil(log2 N) each; two histogram
 * allreduces rd(N) each; bench/dgc_cost.py is the same model). */
#define DGC_COST_ALPHA_S 50e-6
#define DGC_COST_BYTE_S 8e-9
#define DGC_COST_BRUCK_MAX_BYTES 1048576.0  /* TCP_BRUCK_MAX_BYTES, src/comm/tcp.c */
#define DGC_COST_BRUCK_ROUND_BYTES 262144.0 /* TCP_BRUCK_ROUND_BYTES, src/comm/tcp.c */
double dgc_exchange_seconds(dgc_exchange e, int world, int64_t k, int budget);

/* The exchange a step at sparsity s uses: allgather for one rank; `mode` itself unless auto,
 * which takes the one that pays (dgc_sparse_pays) if only one does, else the cheaper estimate
 * (allgather on a tie). */
dgc_exchange dgc_choose_exchange(dgc_exchange mode, int world, int64_t k, double s,
                                 int budget);

/* Whether exchange `mode` at sparsity s sends less than half the bytes of a dense allreduce:
 * allgather N (1 - s) 2 < 1 (8-byte pairs against 4-byte values, seed 000's warning that
 * allgather grows with N); sparse (1 + budget) (1 - s) 2 < 1 (one rank: allgather's rule);
 * auto: either. */
bool dgc_sparse_pays(int world, double s, dgc_exchange mode, int budget);

/* After a sparse allreduce of this rank's m pairs (global indices idx, values val sent from v,
 * which encoding zeroed), what goes back into the accumulators, sorted out on the host for the
 * backend to apply: a kept pair's momentum is masked (u[idx] = 0, when `mask`): its index goes
 * to masked[0 .. *nmasked); a dropped pair's value goes back to the accumulator (v[idx] = val;
 * it competes again next step, as an entry never selected does): the pair goes to
 * back[0 .. *nback), which the strategy adds to v (encoding zeroed v there and selection never
 * picks a zero, so 0 + val is exactly val). masked may be idx itself (each is written at or
 * before the place read). */
void dgc_settle_split(int64_t m, const int32_t *idx, const float *val, const uint8_t *kept,
                      bool mask, int32_t *masked, int64_t *nmasked, dgc_pair *back,
                      int64_t *nback);

/* Local gradient clipping threshold: clip_norm * N^(-1/2) (paper sec. 3.2, seed 000). */
double dgc_local_clip_norm(double clip_norm, int world);

/* The received pairs' check (the kernels that use them are the backend's: dgc_kernels.h). */
/* The position of the first pair whose index is outside [0, space), or -1 if none is. */
int64_t dgc_check_pairs(const dgc_pair *pairs, int64_t n, int64_t space);

#endif /* FLEET_DGC_MATH_H */
