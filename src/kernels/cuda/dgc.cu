/* dgc.cu - the cuda backend's Deep Gradient Compression kernels (Lin et al. 2018,
 * arXiv:1712.01887), with the contracts of the CPU ones (src/kernels/cpu/dgc_kernels.h):
 * - accumulation: the CPU's float operations in its order (no FMA: --fmad=false), so u and v
 *   are the CPU's bits;
 * - top-k: the k-th largest |v| exactly, by a radix select on the magnitudes' bits (4 passes of
 *   8-bit histograms, integer atomics only), then one stable compaction (per-tile counts, a
 *   scan, an ordered scatter). dgc_select_exact gives the CPU's order: those above the
 *   threshold ascending, then the ties with the highest indices, descending. The fused
 *   dgc_accumulate_select accumulates, then selects exactly: where the CPU samples (n >= 16384,
 *   k <= n / 64) its answer is the exact top k with the lowest-index ties, ascending, which is
 *   what this gives there (the CPU's rare fourth pass, exact selection, orders ties as above);
 *   elsewhere it is dgc_select_exact's. The seed and the hint's input are not needed;
 * - scatter-add and the pairs' step: pairs stably sorted by index (CUB's radix sort), then one
 *   thread per index adds its pairs in pair order: the CPU's sums, bit for bit, whatever the
 *   duplicates. */
#include "common.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <stdlib.h>
#include <string.h>

/* --- accumulation --- */

struct accum {
    float c, lam, m;
    bool  nesterov, correction;
};

static accum accum_of(const fl_dgc_accum_args *a) {
    accum s = {(float)a->clip_scale, (float)a->decay, (float)a->momentum, a->nesterov,
               a->correction};
    return s;
}

__device__ __forceinline__ void accumulate_at(int64_t i, const float *grad, const float *w,
                                              float *u, float *v, const accum &a) {
    float g = a.c * grad[i] + a.lam * w[i];
    if (!a.correction) {
        v[i] += g;
    } else if (a.nesterov) {
        float ui = a.m * (u[i] + g);
        u[i] = ui;
        v[i] += ui + g;
    } else {
        float ui = a.m * u[i] + g;
        u[i] = ui;
        v[i] += ui;
    }
}

__global__ void accumulate_k(int64_t n, const float *grad, const float *w, float *u, float *v,
                             accum a) {
    GRID_STRIDE(i, n)
        accumulate_at(i, grad, w, u, v, a);
}

extern "C" void cuda_dgc_accumulate(int64_t n, const float *grad, const float *w, float *u,
                                    float *v, const fl_dgc_accum_args *a) {
    if (n <= 0)
        return;
    accumulate_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(n, grad, w, u, v, accum_of(a));
    CU_LAUNCHED("dgc_accumulate");
}

/* --- top-k selection of one tensor, or of many in the same launches (blockIdx.y: the
 * tensor), with one wait for all their counts --- */

/* |v| as an ordered key: a non-negative float's bits order as its value */
__device__ __forceinline__ uint32_t mag_key(float x) { return __float_as_uint(x) & 0x7fffffffu; }

#define TILE 4096 /* elements per tile of the compaction: 256 threads x 16 */

typedef struct {
    uint32_t hist[256];
    uint32_t prefix, mask, kk; /* radix select: the key's bits found so far, which, rank left */
    uint32_t above, ties, take; /* totals of the compaction and the ties it keeps */
} sel_state;

/* One tensor of a selection: its values (and, where accumulated first, gradient, weights and
 * u), how many to keep (0: none), the tie order, its tiles' counts at cnt + 2 tile0, where its
 * indices go, and where the batch encodes its pairs (NULL: not encoded). */
typedef struct {
    const float *grad, *w;
    float       *u, *v;
    int64_t      n, tile0, tiles, base;
    uint32_t     k;
    bool         lowest, mask_u;
    int32_t     *idx;
    fl_dgc_pair *pairs;
} sel_item;

#define ITEM_LOOP(i, s)                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (s).n;             \
         i += (int64_t)gridDim.x * blockDim.x)

__global__ void accumulate_many_k(const sel_item *it, accum a) {
    const sel_item s = it[blockIdx.y];
    ITEM_LOOP(i, s)
        accumulate_at(i, s.grad, s.w, s.u, s.v, a);
}

/* histogram of byte `shift` of the keys that match the prefix found so far */
__global__ void hist_k(const sel_item *it, int shift, sel_state *sts) {
    const sel_item s = it[blockIdx.y];
    sel_state *st = sts + blockIdx.y;
    if (s.k == 0)
        return;
    __shared__ uint32_t h[256];
    h[threadIdx.x] = 0;
    __syncthreads();
    uint32_t prefix = st->prefix, mask = st->mask;
    ITEM_LOOP(i, s) {
        uint32_t key = mag_key(s.v[i]);
        if ((key & mask) == prefix)
            atomicAdd(&h[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (h[threadIdx.x])
        atomicAdd(&st->hist[threadIdx.x], h[threadIdx.x]);
}

/* the byte holding the kk-th largest key, counting from the top bin (a block per tensor) */
__global__ void pick_k(const sel_item *it, sel_state *sts, int shift) {
    sel_state *st = sts + blockIdx.x;
    if (it[blockIdx.x].k == 0)
        return;
    uint32_t cum = 0, kk = st->kk;
    for (int b = 255; b >= 0; b--) {
        uint32_t c = st->hist[b];
        if (cum + c >= kk) {
            st->kk = kk - cum;
            st->prefix |= (uint32_t)b << shift;
            st->mask |= 255u << shift;
            break;
        }
        cum += c;
    }
    for (int b = 0; b < 256; b++)
        st->hist[b] = 0;
}

/* per tile: (entries above tau, ties at tau > 0) */
__global__ void count_k(const sel_item *it, const sel_state *sts, uint32_t *cnt) {
    const sel_item s = it[blockIdx.y];
    if (s.k == 0 || blockIdx.x >= s.tiles)
        return;
    __shared__ uint32_t sa, sb;
    if (threadIdx.x == 0)
        sa = 0, sb = 0;
    __syncthreads();
    uint32_t tau = sts[blockIdx.y].prefix, a = 0, t = 0;
    int64_t lo = (int64_t)blockIdx.x * TILE, hi = lo + TILE < s.n ? lo + TILE : s.n;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        uint32_t key = mag_key(s.v[i]);
        a += key > tau;
        t += key == tau && tau > 0;
    }
    atomicAdd(&sa, a);
    atomicAdd(&sb, t);
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t *c = cnt + 2 * (s.tile0 + blockIdx.x);
        c[0] = sa, c[1] = sb;
    }
}

/* exclusive scan of a tensor's tiles' counts (a block per tensor), the totals, and the ties
 * kept: take = min(k - above, ties) */
__global__ void scan_k(const sel_item *it, uint32_t *cnt_all, sel_state *sts) {
    const sel_item s = it[blockIdx.x];
    if (s.k == 0)
        return;
    sel_state *st = sts + blockIdx.x;
    uint32_t *cnt = cnt_all + 2 * s.tile0, k = s.k;
    int64_t tiles = s.tiles;
    __shared__ uint32_t sh[2][1024];
    __shared__ uint32_t carry[2];
    if (threadIdx.x == 0)
        carry[0] = 0, carry[1] = 0;
    __syncthreads();
    for (int64_t base = 0; base < tiles; base += 1024) {
        int64_t b = base + threadIdx.x;
        uint32_t a = b < tiles ? cnt[2 * b] : 0, t = b < tiles ? cnt[2 * b + 1] : 0;
        sh[0][threadIdx.x] = a, sh[1][threadIdx.x] = t;
        __syncthreads();
        for (unsigned off = 1; off < 1024; off <<= 1) { /* inclusive Hillis-Steele */
            uint32_t xa = threadIdx.x >= off ? sh[0][threadIdx.x - off] : 0;
            uint32_t xt = threadIdx.x >= off ? sh[1][threadIdx.x - off] : 0;
            __syncthreads();
            sh[0][threadIdx.x] += xa, sh[1][threadIdx.x] += xt;
            __syncthreads();
        }
        if (b < tiles) {
            cnt[2 * b] = carry[0] + sh[0][threadIdx.x] - a;
            cnt[2 * b + 1] = carry[1] + sh[1][threadIdx.x] - t;
        }
        __syncthreads();
        if (threadIdx.x == 1023)
            carry[0] += sh[0][1023], carry[1] += sh[1][1023];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        st->above = carry[0], st->ties = carry[1];
        uint32_t left = k > carry[0] ? k - carry[0] : 0;
        st->take = left < carry[1] ? left : carry[1];
    }
}

/* Each tile writes its chosen indices in order: 16 rounds of 256 elements, each ranked within
 * the block by warp ballots. lowest: ties with the lowest indices, merged in ascending order;
 * else the CPU exact order (above ascending, then the highest-index ties descending). */
__global__ void scatter_k(const sel_item *it, const uint32_t *cnt_all, const sel_state *sts) {
    const sel_item s = it[blockIdx.y];
    if (s.k == 0 || blockIdx.x >= s.tiles)
        return;
    const sel_state *st = sts + blockIdx.y;
    const uint32_t *cnt = cnt_all + 2 * s.tile0;
    const float *v = s.v;
    int64_t n = s.n;
    bool lowest = s.lowest;
    int32_t *idx = s.idx;
    __shared__ uint32_t wa[8], wt[8];
    uint32_t tau = st->prefix, A = st->above, T = st->ties, take = st->take;
    uint32_t ra = cnt[2 * blockIdx.x], rt = cnt[2 * blockIdx.x + 1]; /* before this round */
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t lt = (1u << lane) - 1;
    int64_t lo = (int64_t)blockIdx.x * TILE;
    for (int round = 0; round < TILE / 256; round++) {
        int64_t i = lo + round * 256 + threadIdx.x;
        uint32_t key = i < n ? mag_key(v[i]) : 0;
        bool fa = i < n && key > tau, ft = i < n && key == tau && tau > 0;
        uint32_t ba = __ballot_sync(0xffffffffu, fa), bt = __ballot_sync(0xffffffffu, ft);
        if (lane == 0)
            wa[warp] = __popc(ba), wt[warp] = __popc(bt);
        __syncthreads();
        uint32_t oa = 0, ot = 0, sa = 0, st2 = 0;
        for (int w = 0; w < 8; w++) {
            if (w < warp)
                oa += wa[w], ot += wt[w];
            sa += wa[w], st2 += wt[w];
        }
        uint32_t ar = ra + oa + __popc(ba & lt), tr = rt + ot + __popc(bt & lt);
        if (lowest) {
            if (fa)
                idx[ar + (tr < take ? tr : take)] = (int32_t)i;
            else if (ft && tr < take)
                idx[ar + tr] = (int32_t)i;
        } else {
            if (fa)
                idx[ar] = (int32_t)i;
            else if (ft && tr >= T - take)
                idx[A + (T - 1 - tr)] = (int32_t)i;
        }
        ra += sa, rt += st2;
        __syncthreads();
    }
}

/* the batch's encoding: pairs[j] = {base + idx[j], v[idx[j]]}, v (and u where masked) zeroed */
__global__ void encode_many_k(const sel_item *it, const sel_state *sts) {
    const sel_item s = it[blockIdx.y];
    const sel_state *st = sts + blockIdx.y;
    if (s.k == 0 || !s.pairs)
        return;
    int64_t count = (int64_t)st->above + st->take;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < count;
         j += (int64_t)gridDim.x * blockDim.x) {
        int32_t i = s.idx[j];
        fl_dgc_pair p;
        p.index = (int32_t)(s.base + i);
        p.value = s.v[i];
        s.pairs[j] = p;
        s.v[i] = 0;
        if (s.mask_u)
            s.u[i] = 0;
    }
}

/* Accumulates (acc not NULL) and selects the top k of nt tensors (host items: n, k, lowest,
 * idx, and for the batch grad, w, u, v, base, pairs) in one set of launches: count[i] and
 * kth[i] (the k-th magnitude where count is k, else 0) come back with one wait. */
static void select_many(int nt, sel_item *items, const accum *acc, int64_t *count, float *kth,
                        const char *op) {
    int64_t tiles = 0, most = 1, most_tiles = 1;
    for (int i = 0; i < nt; i++) {
        sel_item *s = &items[i];
        if (s->n > INT32_MAX)
            cuda_fatal(op, "the size check", "more than 2^31 entries", __FILE__, __LINE__);
        if (s->n <= 0)
            s->k = 0;
        else if ((int64_t)s->k > s->n)
            s->k = (uint32_t)s->n;
        s->tile0 = tiles;
        s->tiles = s->k ? (s->n + TILE - 1) / TILE : 0;
        tiles += s->tiles;
        most = s->n > most ? s->n : most;
        most_tiles = s->tiles > most_tiles ? s->tiles : most_tiles;
        count[i] = 0, kth[i] = 0;
    }
    if (nt <= 0)
        return;
    size_t ib = (size_t)nt * sizeof(sel_item), sb = (size_t)nt * sizeof(sel_state);
    ib = (ib + 63) & ~(size_t)63;
    size_t cb = (size_t)(2 * (tiles > 0 ? tiles : 1)) * sizeof(uint32_t);
    char *host = (char *)calloc(1, ib + sb);
    if (!host)
        cuda_fatal(op, "calloc", "out of host memory", __FILE__, __LINE__);
    memcpy(host, items, (size_t)nt * sizeof(sel_item));
    sel_state *init = (sel_state *)(host + ib);
    for (int i = 0; i < nt; i++)
        init[i].kk = items[i].k;
    char *buf = (char *)cuda_get(ib + sb + cb, op);
    sel_item *dit = (sel_item *)buf;
    sel_state *st = (sel_state *)(buf + ib);
    uint32_t *cnt = (uint32_t *)(buf + ib + sb);
    CU_CHECK(op, cudaMemcpyAsync(buf, host, ib + sb, cudaMemcpyHostToDevice, cuda_stream()));
    cudaStream_t cs = cuda_stream();
    unsigned hb = blocks_for(most) < 1024 ? blocks_for(most) : 1024;
    if (acc)
        accumulate_many_k<<<dim3(hb, (unsigned)nt), THREADS, 0, cs>>>(dit, *acc);
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist_k<<<dim3(hb, (unsigned)nt), 256, 0, cs>>>(dit, shift, st);
        pick_k<<<(unsigned)nt, 1, 0, cs>>>(dit, st, shift);
    }
    dim3 tg((unsigned)most_tiles, (unsigned)nt);
    count_k<<<tg, 256, 0, cs>>>(dit, st, cnt);
    scan_k<<<(unsigned)nt, 1024, 0, cs>>>(dit, cnt, st);
    scatter_k<<<tg, 256, 0, cs>>>(dit, cnt, st);
    bool encode = false; /* the batch encodes; a single selection leaves that to dgc_encode */
    for (int i = 0; i < nt && !encode; i++)
        encode = items[i].pairs != NULL;
    if (encode)
        encode_many_k<<<dim3(hb, (unsigned)nt), THREADS, 0, cs>>>(dit, st);
    CU_LAUNCHED(op);
    CU_CHECK(op, cudaMemcpyAsync(init, st, sb, cudaMemcpyDeviceToHost, cs));
    cuda_sync(op);
    cuda_put(buf);
    for (int i = 0; i < nt; i++) {
        if (!items[i].k)
            continue;
        count[i] = (int64_t)init[i].above + init[i].take;
        if (count[i] == (int64_t)items[i].k) {
            uint32_t key = init[i].prefix;
            memcpy(&kth[i], &key, sizeof key);
        }
    }
    free(host);
}

/* The top k of |v| into idx (order as above); the count, and the k-th magnitude in *kth. */
static int64_t select_top(int64_t n, const float *v, int64_t k, int32_t *idx, bool lowest,
                          float *kth, const char *op) {
    sel_item one;
    memset(&one, 0, sizeof one);
    one.v = (float *)v, one.n = n, one.k = k > 0 ? (uint32_t)(k < n ? k : n) : 0;
    one.lowest = lowest, one.idx = idx;
    int64_t got;
    select_many(1, &one, NULL, &got, kth, op);
    return got;
}

extern "C" int64_t cuda_dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx,
                                         float *scratch) {
    (void)scratch;
    float kth;
    return select_top(n, v, k, idx, false, &kth, "dgc_select_exact");
}

/* where the CPU samples (dgc_kernels.h), its answer is ordered ascending with the lowest-index
 * ties */
static bool cpu_samples(int64_t n, int64_t k) {
    return !(k <= 0 || n <= 0 || k > n / 64 || n < 4 * 4096);
}

extern "C" int64_t cuda_dgc_accumulate_select(int64_t n, const float *grad, const float *w,
                                              float *u, float *v, const fl_dgc_accum_args *a,
                                              int64_t k, int32_t *idx, float *scratch,
                                              uint64_t seed, float *hint, int *passes) {
    (void)scratch, (void)seed;
    cuda_dgc_accumulate(n, grad, w, u, v, a);
    bool sampled = cpu_samples(n, k);
    float kth;
    int64_t got = select_top(n, v, k, idx, sampled, &kth, "dgc_accumulate_select");
    if (passes)
        *passes = sampled ? 0 : 1;
    if (hint)
        *hint = got == k && k > 0 ? kth : 0;
    return got;
}

extern "C" void cuda_dgc_accumulate_select_batch(int nt, const fl_dgc_batch_item *items,
                                                 const fl_dgc_accum_args *a, bool mask_u,
                                                 int64_t *count, int32_t *idx, float *scratch) {
    const char *op = "dgc_accumulate_select_batch";
    (void)idx, (void)scratch;
    if (nt <= 0)
        return;
    sel_item *si = (sel_item *)calloc((size_t)nt, sizeof *si);
    float *kth = (float *)calloc((size_t)nt, sizeof *kth);
    if (!si || !kth)
        cuda_fatal(op, "calloc", "out of host memory", __FILE__, __LINE__);
    int64_t ksum = 0;
    for (int i = 0; i < nt; i++)
        ksum += items[i].k > 0 && items[i].n > 0 ? (items[i].k < items[i].n ? items[i].k
                                                                             : items[i].n) : 0;
    int32_t *didx = (int32_t *)cuda_get((size_t)(ksum > 0 ? ksum : 1) * sizeof(int32_t), op);
    int64_t off = 0;
    for (int i = 0; i < nt; i++) {
        const fl_dgc_batch_item *b = &items[i];
        sel_item *s = &si[i];
        int64_t k = b->k > 0 && b->n > 0 ? (b->k < b->n ? b->k : b->n) : 0;
        s->grad = b->grad, s->w = b->w, s->u = b->u, s->v = b->v;
        s->n = b->n, s->k = (uint32_t)k, s->base = b->base;
        s->lowest = cpu_samples(b->n, b->k);
        s->mask_u = mask_u && b->u;
        s->idx = didx + off, s->pairs = b->pairs;
        off += k;
    }
    accum ac = accum_of(a);
    select_many(nt, si, &ac, count, kth, op);
    for (int i = 0; i < nt; i++)
        if (items[i].hint)
            *items[i].hint = count[i] == items[i].k && items[i].k > 0 ? kth[i] : 0;
    cuda_put(didx);
    free(si);
    free(kth);
}

/* --- encoding --- */

__global__ void encode_k(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                         fl_dgc_pair *pairs) {
    GRID_STRIDE(j, count) {
        int32_t i = idx[j];
        fl_dgc_pair p;
        p.index = (int32_t)(base + i);
        p.value = v[i];
        pairs[j] = p;
        v[i] = 0;
        if (u)
            u[i] = 0;
    }
}

extern "C" void cuda_dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v,
                                float *u, fl_dgc_pair *pairs) {
    if (count <= 0)
        return;
    encode_k<<<blocks_for(count), THREADS, 0, cuda_stream()>>>(idx, count, base, v, u, pairs);
    CU_LAUNCHED("dgc_encode");
}

/* --- scatter-add and the pairs' step: stable sort by index, then a thread per index --- */

/* the first pair (position) outside [0, total) */
__global__ void first_bad_k(const fl_dgc_pair *pairs, int64_t n, int64_t total,
                            unsigned long long *bad) {
    GRID_STRIDE(j, n) {
        int64_t i = pairs[j].index;
        if (i < 0 || i >= total)
            atomicMin(bad, (unsigned long long)j);
    }
}

__global__ void keys_k(const fl_dgc_pair *pairs, int64_t n, uint32_t *key, int32_t *pos) {
    GRID_STRIDE(j, n) {
        key[j] = (uint32_t)pairs[j].index; /* valid indices: >= 0 */
        pos[j] = (int32_t)j;
    }
}

__device__ __forceinline__ int segment_of(int64_t i, int nseg, const int64_t *start) {
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* one thread per run of equal indices (in sorted order): the run's pairs in pair order */
__global__ void runs_k(const fl_dgc_pair *pairs, const uint32_t *key, const int32_t *pos,
                       int64_t n, int nseg, const int64_t *start, float *const *seg, bool apply,
                       double step) {
    GRID_STRIDE(s, n) {
        uint32_t i = key[s];
        if (s > 0 && key[s - 1] == i)
            continue;
        int g = segment_of(i, nseg, start);
        float *p = seg[g] + ((int64_t)i - start[g]);
        float acc = *p;
        for (int64_t t = s; t < n && key[t] == i; t++) {
            float val = pairs[pos[t]].value;
            acc = apply ? (float)((double)acc - step * (double)val) : acc + val;
        }
        *p = acc;
    }
}

static void pairs_run(const fl_dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                      float *const *seg, bool apply, double step, const char *op) {
    if (n <= 0 || nseg <= 0)
        return;
    /* the segments' starts and pointers, host arrays, copied to the device */
    size_t meta = (size_t)(nseg + 1) * sizeof(int64_t) + (size_t)nseg * sizeof(float *);
    char *host = (char *)malloc(meta);
    if (!host)
        cuda_fatal(op, "malloc", "out of host memory", __FILE__, __LINE__);
    memcpy(host, start, (size_t)(nseg + 1) * sizeof(int64_t));
    memcpy(host + (size_t)(nseg + 1) * sizeof(int64_t), seg, (size_t)nseg * sizeof(float *));
    size_t kb = (size_t)n * sizeof(int32_t);
    int end_bit = 1;
    while (end_bit < 32 && ((int64_t)1 << end_bit) < start[nseg])
        end_bit++;
    size_t temp = 0;
    CU_CHECK(op, cub::DeviceRadixSort::SortPairs(NULL, temp, (const uint32_t *)NULL,
                                                 (uint32_t *)NULL, (const int32_t *)NULL,
                                                 (int32_t *)NULL, (int)n, 0, end_bit,
                                                 cuda_stream()));
    size_t temp_off = meta + 4 * kb;
    temp_off = (temp_off + 255) & ~(size_t)255;
    char *buf = (char *)cuda_get(temp_off + temp, op);
    int64_t *dstart = (int64_t *)buf;
    float *const *dseg = (float *const *)(buf + (size_t)(nseg + 1) * sizeof(int64_t));
    uint32_t *k0 = (uint32_t *)(buf + meta), *k1 = k0 + n;
    int32_t *p0 = (int32_t *)(k1 + n), *p1 = p0 + n;
    CU_CHECK(op, cudaMemcpyAsync(buf, host, meta, cudaMemcpyHostToDevice, cuda_stream()));
    free(host); /* a pageable source is staged before cudaMemcpyAsync returns */
    keys_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(pairs, n, k0, p0);
    CU_LAUNCHED(op);
    CU_CHECK(op, cub::DeviceRadixSort::SortPairs(buf + temp_off, temp, k0, k1, p0, p1, (int)n, 0,
                                                 end_bit, cuda_stream()));
    runs_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(pairs, k1, p1, n, nseg, dstart, dseg,
                                                         apply, step);
    CU_LAUNCHED(op);
    cuda_put(buf);
}

extern "C" int64_t cuda_dgc_scatter_add(const fl_dgc_pair *pairs, int64_t n, int nseg,
                                        const int64_t *start, float *const *dst) {
    const char *op = "dgc_scatter_add";
    if (n <= 0)
        return -1;
    if (n > INT32_MAX)
        cuda_fatal(op, "the size check", "more than 2^31 pairs", __FILE__, __LINE__);
    unsigned long long *bad = (unsigned long long *)cuda_get(sizeof *bad, op), first = 0;
    unsigned long long init = (unsigned long long)n;
    CU_CHECK(op, cudaMemcpyAsync(bad, &init, sizeof init, cudaMemcpyHostToDevice, cuda_stream()));
    first_bad_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(pairs, n, nseg > 0 ? start[nseg] : 0,
                                                              bad);
    CU_LAUNCHED(op);
    CU_CHECK(op, cudaMemcpyAsync(&first, bad, sizeof first, cudaMemcpyDeviceToHost,
                                 cuda_stream()));
    cuda_sync(op);
    cuda_put(bad);
    int64_t good = (int64_t)first;
    pairs_run(pairs, good, nseg, start, dst, false, 0, op);
    cuda_sync(op);
    return good < n ? good : -1;
}

extern "C" void cuda_dgc_apply_pairs(const fl_dgc_pair *pairs, int64_t n, int nseg,
                                     const int64_t *start, float *const *w, double step) {
    if (n > INT32_MAX)
        cuda_fatal("dgc_apply_pairs", "the size check", "more than 2^31 pairs", __FILE__,
                   __LINE__);
    pairs_run(pairs, n, nseg, start, w, true, step, "dgc_apply_pairs");
}

/* --- the dense step, in double as the CPU's --- */

__global__ void apply_dense_k(int64_t n, float *w, float *g, float *u, double lr, double inv_n,
                              double m, bool nesterov, double decay) {
    GRID_STRIDE(i, n) {
        double d = (double)g[i] * inv_n + decay * (double)w[i];
        double stepv = d;
        if (u) {
            double ui = m * (double)u[i] + d;
            u[i] = (float)ui;
            stepv = nesterov ? d + m * ui : ui;
        }
        w[i] = (float)((double)w[i] - lr * stepv);
        g[i] = 0;
    }
}

extern "C" void cuda_dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr,
                                     double inv_n, double m, bool nesterov, double decay) {
    if (n <= 0)
        return;
    apply_dense_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(n, w, g, u, lr, inv_n, m,
                                                                nesterov, decay);
    CU_LAUNCHED("dgc_apply_dense");
}
