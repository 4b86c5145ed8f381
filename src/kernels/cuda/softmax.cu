/* softmax.cu - the cuda backend's fused softmax cross-entropy and label smoothing's two terms:
 * one block per row (max-subtracted exp, sums in double by a fixed tree), row losses summed by
 * reduce.cuh's fixed-order sum; labels are device int32, checked in the forward (which waits
 * for its result anyway); an out-of-range label there is fatal, as FL_ASSERT is on the CPU. */
#include "reduce.cuh"

#include <math.h>
#include <string.h>

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }

/* probs may alias logits: every read of a row ends (block barriers) before its first write */
template <class T>
__global__ void xent_fwd_k(const T *logits, const int32_t *labels, T *probs, int64_t classes,
                           double *loss, int *bad) {
    __shared__ double sh[THREADS];
    __shared__ T shm[THREADS];
    int64_t r = blockIdx.x;
    const T *x = logits + r * classes;
    T *p = probs + r * classes;
    int32_t label = labels[r];
    bool ok = label >= 0 && label < classes;
    T xl = ok ? x[label] : (T)0;
    T mx = x[0];
    for (int64_t j = threadIdx.x; j < classes; j += THREADS)
        mx = x[j] > mx ? x[j] : mx;
    mx = block_max(mx, shm);
    double s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += THREADS)
        s += (double)exp_t(x[j] - mx);
    s = block_sum(s, sh);
    T inv = (T)(1.0 / s);
    for (int64_t j = threadIdx.x; j < classes; j += THREADS)
        p[j] = exp_t(x[j] - mx) * inv;
    if (threadIdx.x == 0) {
        loss[r] = ok ? log(s) + (double)mx - (double)xl : 0.0;
        if (!ok)
            *bad = 1;
    }
}

struct load_d {
    const double *x;
    __device__ double operator()(int64_t i) const { return x[i]; }
};

/* scratch: rows doubles of row losses, then the total, then the bad-label flag */
static double *row_scratch(int64_t rows, const char *op) {
    double *d = (double *)cuda_get((size_t)(rows + 2) * sizeof(double), op);
    CU_CHECK(op, cudaMemsetAsync(d + rows + 1, 0, sizeof(double), cuda_stream()));
    return d;
}

extern "C" double cuda_softmax_xent_forward(fl_dtype t, const void *logits,
                                            const int32_t *labels, void *probs, int64_t rows,
                                            int64_t classes) {
    const char *op = "softmax_xent_forward";
    if (rows <= 0)
        return 0;
    if (classes <= 0)
        cuda_fatal(op, "the shape check", "rows > 0 with no classes", __FILE__, __LINE__);
    double *d = row_scratch(rows, op);
    int *bad = (int *)(d + rows + 1);
    DISPATCH_T(op, t,
               xent_fwd_k<T><<<(unsigned)rows, THREADS, 0, cuda_stream()>>>(
                   (const T *)logits, labels, (T *)probs, classes, d, bad));
    CU_LAUNCHED(op);
    sum_into(load_d{d}, rows, d + rows, op);
    double out[2];
    fetch(out, d + rows, sizeof out, op);
    cuda_put(d);
    int flag;
    memcpy(&flag, &out[1], sizeof flag);
    if (flag)
        cuda_fatal(op, "the label check", "a label is outside [0, classes)", __FILE__, __LINE__);
    return out[0];
}

/* dlogits = scale (probs - onehot); an invalid label (the forward reported it) adds no -1 */
template <class T>
__global__ void xent_bwd_k(const T *probs, const int32_t *labels, T *d, int64_t total,
                           int64_t classes, T scale) {
    GRID_STRIDE(i, total) {
        int64_t r = i / classes, j = i % classes;
        T p = probs[i];
        d[i] = j == labels[r] ? scale * (p - (T)1) : scale * p;
    }
}

extern "C" void cuda_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                                           void *dlogits, int64_t rows, int64_t classes,
                                           double scale) {
    int64_t total = rows * classes;
    if (total <= 0)
        return;
    DISPATCH_T("softmax_xent_backward", t,
               xent_bwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   (const T *)probs, labels, (T *)dlogits, total, classes, (T)scale));
    CU_LAUNCHED("softmax_xent_backward");
}

/* per row, in double: logsumexp(x) - mean(x) */
template <class T>
__global__ void smooth_term_k(const T *logits, int64_t classes, double *term) {
    __shared__ double sh[THREADS];
    const T *x = logits + (int64_t)blockIdx.x * classes;
    double mx = -INFINITY, mean = 0;
    for (int64_t j = threadIdx.x; j < classes; j += THREADS) {
        double v = (double)x[j];
        mx = v > mx ? v : mx;
        mean += v;
    }
    mx = block_max(mx, sh);
    mean = block_sum(mean, sh);
    double s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += THREADS)
        s += exp((double)x[j] - mx);
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        term[blockIdx.x] = log(s) + mx - mean / (double)classes;
}

extern "C" double cuda_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows,
                                        int64_t classes) {
    const char *op = "xent_smooth_term";
    if (rows <= 0)
        return 0;
    double *d = row_scratch(rows, op);
    DISPATCH_T(op, t,
               smooth_term_k<T><<<(unsigned)rows, THREADS, 0, cuda_stream()>>>(
                   (const T *)logits, classes, d));
    CU_LAUNCHED(op);
    sum_into(load_d{d}, rows, d + rows, op);
    double out;
    fetch(&out, d + rows, sizeof out, op);
    cuda_put(d);
    return out;
}

/* dlogits[r][j] += (T)((j == label ? on : 0) - all), as the CPU rounds it */
template <class T>
__global__ void smooth_bwd_k(const int32_t *labels, T *d, int64_t total, int64_t classes,
                             double on, double all) {
    GRID_STRIDE(i, total) {
        int64_t r = i / classes, j = i % classes;
        d[i] += (T)((j == labels[r] ? on : 0.0) - all);
    }
}

extern "C" void cuda_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits,
                                          int64_t rows, int64_t classes, double on, double all) {
    int64_t total = rows * classes;
    if (total <= 0)
        return;
    DISPATCH_T("xent_smooth_backward", t,
               smooth_bwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   labels, (T *)dlogits, total, classes, on, all));
    CU_LAUNCHED("xent_smooth_backward");
}
