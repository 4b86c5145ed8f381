/* dgc_kernels.h - the CPU backends' Deep Gradient Compression kernels (dgc.c), which the cpu,
 * ref and onednn tables hold as their dgc_* operations; private to src/kernels, and to the tests
 * and benchmarks that check and time them directly. */
#ifndef FLEET_KERNELS_CPU_DGC_KERNELS_H
#define FLEET_KERNELS_CPU_DGC_KERNELS_H

#include "fleet/backend.h"

#include <stdbool.h>
#include <stdint.h>

typedef fl_dgc_pair dgc_pair;
typedef fl_dgc_accum_args dgc_accum_args;

/* --- accumulation on each rank --- */


/* For i < n: g = clip_scale * grad[i] + decay * w[i] (clipping, then the weight-decay
 * correction, the order fleet's optimizer clips and decays), then
 *     correction:  u = m * u + g,    v = v + u         (paper eq. 7)
 *     Nesterov:    u = m * (u + g),  v = v + u + g     (Paddle's dgc op)
 *     off:         v = v + g                           (u untouched)
 * grad and w are only read: the pass reads 4 arrays and writes 2 (it is memory-bound). */
void dgc_accumulate(int64_t n, const float *grad, const float *w, float *u, float *v,
                    const dgc_accum_args *a);

/* --- top-k selection: the k entries of largest |v| --- */

/* Exact: the k-th largest magnitude by quickselect (O(n) expected), then one pass. Writes the
 * chosen indices (ascending within those above the threshold, then ties) to idx and returns
 * their number: min(k, number of nonzero entries), zeros are never chosen (sending them would
 * change nothing). scratch holds n floats; idx holds n int32 (used as working space). */
int64_t dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx, float *scratch);

/* Sampled threshold (paper sec. 5: sample 0.1-1 %, take the threshold from the sample's top-k,
 * then one pass): samples max(n / 100, 4096) random positions (seeded by seed), takes the
 * magnitude that should leave about 2k entries at or above it, gathers those entries as
 * candidates, and selects the exact top k among them. The result is the same set as
 * dgc_select_exact's (up to ties at the threshold). A threshold that leaves fewer than k is
 * lowered (aiming at 4 times as many) and the pass repeated (at most 3 passes), then it falls
 * back to exact selection. Tensors where sampling cannot pay (k > n / 64, or fewer
 * than 4 * 4096 entries) go straight to exact selection. Same outputs as dgc_select_exact;
 * scratch holds n + max(n / 100, 4096) floats, idx n int32. *passes (may be NULL) receives the
 * passes over v made (1 when it went straight to exact selection; 4: 3 tries, then exact). */
int64_t dgc_select_sampled(int64_t n, const float *v, int64_t k, int32_t *idx, float *scratch,
                           uint64_t seed, int *passes);

/* dgc_accumulate, then the top k of the new v as dgc_select_sampled finds them, with the
 * candidate gathering fused into the accumulation pass: a threshold is drawn first — from
 * *hint when it is > 0 (90% of it), else from a sample whose entries' new values are computed
 * ahead (chunks of 16 at random offsets) — so that one pass over the tensor both accumulates
 * and gathers the entries at or above it. When that threshold leaves fewer than k it falls back
 * to dgc_select_sampled on the accumulated v. Same outputs as dgc_select_sampled (the exact top
 * k up to ties, whatever the hint; zeros never chosen) and the same buffers. hint (may be NULL):
 * in, last step's k-th largest magnitude of this tensor at the same k (0: none); out, this
 * step's (0 when fewer than k were chosen) — the k-th value moves little between steps, so the
 * hint saves the sample's scattered reads. *passes (may be NULL) receives the passes over v
 * beyond the fused one (0 normally). Tensors where sampling cannot pay are accumulated, then
 * selected exactly (*passes 1). */
int64_t dgc_accumulate_select(int64_t n, const float *grad, const float *w, float *u, float *v,
                              const dgc_accum_args *a, int64_t k, int32_t *idx, float *scratch,
                              uint64_t seed, float *hint, int *passes);

/* Writes pairs[i] = {base + idx[i], v[idx[i]]} for i < count, then zeroes v[idx[i]] (the sent
 * entries leave the accumulator) and, when u is not NULL, u[idx[i]] (momentum factor masking,
 * paper sec. 4). base + idx must fit in int32 (the caller plans that). */
void dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                dgc_pair *pairs);

/* --- aggregation: every rank's pairs --- */

/* The compressed index space is cut into nseg segments: segment s is [start[s], start[s+1]),
 * start[0] = 0, ascending, and its values live at dst[s]. Adds each pair's value at its index
 * (the ablations' dense steps need the sum in a buffer the caller cleared).
 * Returns -1 when every index was inside [0, start[nseg]), else the position of the first pair
 * outside it (nothing is added from it on). */
int64_t dgc_scatter_add(const dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                        float *const *dst);

/* The plain SGD step of the sparse aggregate, pair by pair: w -= step * value at each pair's
 * index (step = lr / N; an index several ranks sent gets each rank's share in turn, which is
 * the sum up to rounding). No gradient buffer is needed, so the accumulation never clears one.
 * Every rank applies the same pairs in the same order: the replicas stay bit-identical.
 * Indices must be valid (dgc_check_pairs). */
void dgc_apply_pairs(const dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                     float *const *w, double step);

/* The step over a whole tensor, for the ablations and the dense fallback: d = G * inv_n +
 * decay * w; with u (the velocity kept on the aggregate when momentum correction is off):
 * u = m * u + d, w -= lr * (nesterov ? d + m * u : u); without: w -= lr * d. G = 0 after. */
void dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr, double inv_n, double m,
                     bool nesterov, double decay);

#endif /* FLEET_KERNELS_CPU_DGC_KERNELS_H */
