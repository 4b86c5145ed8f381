/* lars.cu - LARS momentum over a run of parameter tensors in three launches and no wait
 * (backend.h lars_update_run; the rule is src/optim/lars.c's, after You, Gitman & Ginsburg 2017,
 * arXiv:1708.03888). lars.c on this table asks sumsq for ||w|| and ||g'|| of each tensor, two
 * waits a tensor (322 a ResNet-50 step); here every tensor's norms are summed in one launch, the
 * local rates computed on the device in a second, and the update applied in a third.
 *
 * The bits are lars.c's on this table: each tensor is cut into the blocks that reduce.cuh's
 * sum_into cuts an array of its size into, each block summing with the same thread pattern and
 * tree, the blocks' partials added as sum_final_k adds them; the rate is lars.c's expression in
 * double (the .cu files are built with --fmad=false); the update is scale_k's and axpy_k's
 * float operations in their order, on g' = g + wd w computed as axpy_k computes it. */
#include "common.cuh"

#include <string.h>

namespace {

struct lars_chunk { /* a block's range of the run's elements, and its tensor */
    int64_t lo, hi;
    int     tensor;
};
struct lars_tensor { /* a tensor's blocks (chunks first .. first + count) and LARS decay */
    int64_t first, count;
    double  d;
};

/* the elements of one tensor per block, as sum_into chooses them for an array of n */
int64_t per_block(int64_t n) {
    int64_t per = (n + 1023) / 1024;
    return per < 8192 ? 8192 : per;
}

/* g' = g + wd w as axpy_k computes y + a x (g itself where wd is 0: lars.c adds nothing) */
template <class T>
__device__ __forceinline__ acc_t<T> decayed(const T *g, const T *w, int64_t i, acc_t<T> wd,
                                            bool has_wd) {
    return has_wd ? lo_get(lo_put<T>(lo_get(g[i]) + wd * lo_get(w[i]))) : lo_get(g[i]);
}

/* part[j] = (sum of w^2, sum of g'^2) over chunk j, in sum_part_k's order */
template <class T>
__global__ void lars_norms_k(const lars_chunk *chunks, const T *w, const T *g, acc_t<T> wd,
                             bool has_wd, double2 *part) {
    __shared__ double sh[THREADS];
    lars_chunk ch = chunks[blockIdx.x];
    double sw = 0, sg = 0;
    for (int64_t i = ch.lo + threadIdx.x; i < ch.hi; i += THREADS) {
        double wv = (double)lo_get(w[i]), gv = (double)decayed(g, w, i, wd, has_wd);
        sw += wv * wv;
        sg += gv * gv;
    }
    double tw = block_sum(sw, sh), tg = block_sum(sg, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = make_double2(tw, tg);
}

/* rate[k] = (local_lr, local_lr d) of tensor k: its blocks' partials added as sum_final_k
 * adds them, then lars.c's expression */
__global__ void lars_rates_k(const lars_tensor *tensors, const double2 *part, double lr,
                             double coeff, double eps, double2 *rate) {
    __shared__ double sh[THREADS];
    lars_tensor t = tensors[blockIdx.x];
    double sw = 0, sg = 0;
    for (int64_t i = threadIdx.x; i < t.count; i += THREADS) {
        sw += part[t.first + i].x;
        sg += part[t.first + i].y;
    }
    double tw = block_sum(sw, sh), tg = block_sum(sg, sh);
    if (threadIdx.x == 0) {
        double local = lr;
        if (t.d > 0) {
            double wn = sqrt(tw), gn = sqrt(tg);
            if (wn > 0 && gn > 0)
                local = lr * coeff * wn / (gn + t.d * wn + eps);
        }
        rate[blockIdx.x] = make_double2(local, local * t.d);
    }
}

/* v = mu v; v += local_lr g'; v += local_lr d w (d > 0); w -= v: scale_k's and axpy_k's
 * operations, each rounded to T as they round it */
template <class T>
__global__ void lars_apply_k(const lars_chunk *chunks, const lars_tensor *tensors,
                             const double2 *rate, T *w, const T *g, T *v, acc_t<T> wd,
                             bool has_wd, acc_t<T> mu) {
    typedef acc_t<T> A;
    lars_chunk ch = chunks[blockIdx.x];
    bool with_d = tensors[ch.tensor].d > 0;
    A lr = (A)rate[ch.tensor].x, lrd = (A)rate[ch.tensor].y, minus1 = (A)-1.0;
    for (int64_t i = ch.lo + threadIdx.x; i < ch.hi; i += THREADS) {
        A gp = decayed(g, w, i, wd, has_wd);
        T vv = lo_put<T>(lo_get(v[i]) * mu);
        vv = lo_put<T>(lo_get(vv) + lr * gp);
        if (with_d)
            vv = lo_put<T>(lo_get(vv) + lrd * lo_get(w[i]));
        v[i] = vv;
        w[i] = lo_put<T>(lo_get(w[i]) + minus1 * lo_get(vv));
    }
}

/* The chunk and tensor tables of the last run seen, on the device: a run's layout stays the same
 * step after step, so they are uploaded when it changes (FNV-1a of numel and d), not per call.
 * One optimizer thread calls this. */
struct lars_tables {
    uint64_t     key;
    int          nt;
    int64_t      nchunks;
    lars_chunk  *chunks;
    lars_tensor *tensors;
};
lars_tables cached;

uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* The device tables for this run (uploaded in the stream where they changed). */
const lars_tables *tables_for(int nt, const int64_t *numel, const double *d, const char *op) {
    uint64_t key = fnv(fnv(fnv(1469598103934665603ull, &nt, sizeof nt), numel,
                           (size_t)nt * sizeof *numel), d, (size_t)nt * sizeof *d);
    if (cached.chunks && cached.key == key && cached.nt == nt)
        return &cached;
    int64_t nchunks = 0;
    for (int k = 0; k < nt; k++)
        nchunks += numel[k] > 0 ? (numel[k] + per_block(numel[k]) - 1) / per_block(numel[k]) : 1;
    lars_chunk *hc = (lars_chunk *)malloc((size_t)nchunks * sizeof *hc);
    lars_tensor *ht = (lars_tensor *)malloc((size_t)nt * sizeof *ht);
    if (!hc || !ht)
        cuda_fatal(op, "malloc", "out of host memory for the LARS tables", __FILE__, __LINE__);
    int64_t j = 0, off = 0;
    for (int k = 0; k < nt; k++) {
        int64_t n = numel[k], per = per_block(n), nb = n > 0 ? (n + per - 1) / per : 1;
        ht[k] = lars_tensor{j, nb, d[k]};
        for (int64_t b = 0; b < nb; b++, j++) {
            int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
            hc[j] = lars_chunk{off + lo, off + (hi > lo ? hi : lo), k};
        }
        off += n > 0 ? n : 0;
    }
    cuda_put(cached.chunks);
    cuda_put(cached.tensors);
    cached.chunks = (lars_chunk *)cuda_get((size_t)nchunks * sizeof *hc, op);
    cached.tensors = (lars_tensor *)cuda_get((size_t)nt * sizeof *ht, op);
    /* from pageable memory: staged before this returns, ordered before the kernels after */
    CU_CHECK(op, cudaMemcpyAsync(cached.chunks, hc, (size_t)nchunks * sizeof *hc,
                                 cudaMemcpyHostToDevice, cuda_stream()));
    CU_CHECK(op, cudaMemcpyAsync(cached.tensors, ht, (size_t)nt * sizeof *ht,
                                 cudaMemcpyHostToDevice, cuda_stream()));
    free(hc);
    free(ht);
    cached.key = key, cached.nt = nt, cached.nchunks = nchunks;
    return &cached;
}

} // namespace

extern "C" void cuda_lars_update_run(fl_dtype t, int nt, const int64_t *numel, const double *d,
                                     void *w, const void *g, void *v, double lr, double mu,
                                     double wd, double coeff, double eps) {
    const char *op = "lars_update_run";
    if (nt <= 0)
        return;
    const lars_tables *tb = tables_for(nt, numel, d, op);
    double2 *part = (double2 *)cuda_get((size_t)tb->nchunks * sizeof(double2), op);
    double2 *rate = (double2 *)cuda_get((size_t)nt * sizeof(double2), op);
    bool has_wd = wd > 0;
    unsigned nb = (unsigned)tb->nchunks;
    DISPATCH_T(op, t, {
        lars_norms_k<T><<<nb, THREADS, 0, cuda_stream()>>>(tb->chunks, (const T *)w,
                                                             (const T *)g, (T)wd, has_wd, part);
        CU_LAUNCHED(op);
        lars_rates_k<<<(unsigned)nt, THREADS, 0, cuda_stream()>>>(tb->tensors, part, lr, coeff,
                                                                  eps, rate);
        CU_LAUNCHED(op);
        lars_apply_k<T><<<nb, THREADS, 0, cuda_stream()>>>(tb->chunks, tb->tensors, rate,
                                                             (T *)w, (const T *)g, (T *)v,
                                                             (T)wd, has_wd, (T)mu);
        CU_LAUNCHED(op);
    });
    cuda_put(part);
    cuda_put(rate);
}
