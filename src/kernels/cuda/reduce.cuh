/* reduce.cuh - the cuda backend's deterministic sums, as templates for the files that sum:
 * whole arrays (sum, sumsq, the loss of a batch) and per-column sums of an (R, C) matrix read
 * through a functor (bias gradients, batch norm's statistics). Work is cut into splits fixed by
 * the shape alone, each split summed in double by a fixed thread pattern and a fixed tree, and
 * the splits' partials added in order: bit-repeatable, independent of the GPU's SM count, with
 * no atomics on floating point. */
#ifndef FLEET_KERNELS_CUDA_REDUCE_CUH
#define FLEET_KERNELS_CUDA_REDUCE_CUH

#include "common.cuh"

/* Copies bytes from the device to the host and waits (the ops that return a value). */
static inline void fetch(void *host, const void *dev, size_t bytes, const char *op) {
    CU_CHECK(op, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
    cuda_sync(op);
}

/* --- whole arrays: part[b] = the sum of f(i) over block b's range, then their sum --- */

template <class F> __global__ void sum_part_k(F f, int64_t n, int64_t per, double *part) {
    __shared__ double sh[THREADS];
    int64_t lo = (int64_t)blockIdx.x * per, hi = lo + per < n ? lo + per : n;
    double acc = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += THREADS)
        acc += f(i);
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* one block: thread t sums part[t], part[t + THREADS], ..., then the tree */
template <class D> __global__ void sum_final_k(const D *part, int64_t nb, D *out) {
    __shared__ double sh[THREADS];
    double acc = 0;
    for (int64_t i = threadIdx.x; i < nb; i += THREADS)
        acc += part[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0)
        *out = s;
}

/* Sums f(i) for i < n into *out (device memory). */
template <class F> static void sum_into(F f, int64_t n, double *out, const char *op) {
    int64_t per = (n + 1023) / 1024;
    per = per < 8192 ? 8192 : per;
    int64_t nb = n > 0 ? (n + per - 1) / per : 1;
    double *part = (double *)cuda_get((size_t)nb * sizeof(double), op);
    sum_part_k<<<(unsigned)nb, THREADS, 0, cuda_stream()>>>(f, n, per, part);
    CU_LAUNCHED(op);
    sum_final_k<double><<<1, THREADS, 0, cuda_stream()>>>(part, nb, out);
    CU_LAUNCHED(op);
    cuda_put(part);
}

/* The same, returned to the host. */
template <class F> static double sum_to_host(F f, int64_t n, const char *op) {
    double *d = (double *)cuda_get(sizeof(double), op), h = 0;
    sum_into(f, n, d, op);
    fetch(&h, d, sizeof h, op);
    cuda_put(d);
    return h;
}

/* --- per-column sums of two quantities, f(r, c) -> double2, over rows r < R --- */

/* rows of one column far apart in memory (a row-major matrix, NHWC): blocks of 32 columns x
 * 8 rows, threads along the columns */
template <class F>
__global__ void colsum_rows_k(F f, int64_t R, int64_t C, int64_t rps, double2 *part) {
    __shared__ double2 sh[8][33];
    int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x, s = blockIdx.y;
    int64_t r0 = s * rps, r1 = r0 + rps < R ? r0 + rps : R;
    double2 acc = make_double2(0, 0);
    if (c < C)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            double2 v = f(r, c);
            acc.x += v.x, acc.y += v.y;
        }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double2 t = sh[0][threadIdx.x];
        for (int j = 1; j < 8; j++)
            t.x += sh[j][threadIdx.x].x, t.y += sh[j][threadIdx.x].y;
        part[s * C + c] = t;
    }
}

/* consecutive rows of a column together in memory (NCHW planes): a block per (column, split),
 * threads along the rows */
template <class F>
__global__ void colsum_planes_k(F f, int64_t R, int64_t C, int64_t rps, double2 *part) {
    __shared__ double sh[THREADS];
    int64_t c = blockIdx.x, s = blockIdx.y;
    int64_t r0 = s * rps, r1 = r0 + rps < R ? r0 + rps : R;
    double2 acc = make_double2(0, 0);
    for (int64_t r = r0 + threadIdx.x; r < r1; r += THREADS) {
        double2 v = f(r, c);
        acc.x += v.x, acc.y += v.y;
    }
    double x = block_sum(acc.x, sh), y = block_sum(acc.y, sh);
    if (threadIdx.x == 0)
        part[s * C + c] = make_double2(x, y);
}

/* g(c, the column's two sums), the splits added in order */
template <class G>
__global__ void colsum_finish_k(const double2 *part, int64_t S, int64_t C, G g) {
    GRID_STRIDE(c, C) {
        double2 t = part[c];
        for (int64_t s = 1; s < S; s++)
            t.x += part[s * C + c].x, t.y += part[s * C + c].y;
        g(c, t);
    }
}

/* Calls g(c, sums of f(r, c) over r < R) for every c < C; planes chooses the thread mapping
 * (the sums are fixed by R and C either way). */
template <class F, class G>
static void colsum(bool planes, F f, G g, int64_t R, int64_t C, const char *op) {
    if (C <= 0)
        return;
    int64_t rps = (R + 255) / 256;
    rps = rps < 1024 ? 1024 : rps;
    int64_t S = R > 0 ? (R + rps - 1) / rps : 1;
    double2 *part = (double2 *)cuda_get((size_t)(S * C) * sizeof(double2), op);
    if (planes) {
        colsum_planes_k<<<dim3((unsigned)C, (unsigned)S), THREADS, 0, cuda_stream()>>>(f, R, C,
                                                                                     rps, part);
    } else {
        dim3 grid((unsigned)((C + 31) / 32), (unsigned)S);
        colsum_rows_k<<<grid, dim3(32, 8), 0, cuda_stream()>>>(f, R, C, rps, part);
    }
    CU_LAUNCHED(op);
    colsum_finish_k<<<blocks_for(C), THREADS, 0, cuda_stream()>>>(part, S, C, g);
    CU_LAUNCHED(op);
    cuda_put(part);
}

/* Element (r, c) of an (N, C, HW) activation seen as N HW rows of C channels. */
__host__ __device__ __forceinline__ int64_t nchw_at(bool nhwc, int64_t r, int64_t c, int64_t C,
                                                    int64_t hw) {
    return nhwc ? r * C + c : (r / hw * C + c) * hw + r % hw;
}

#endif /* FLEET_KERNELS_CUDA_REDUCE_CUH */
