/* bn.cu - the cuda backend's batch norm (Ioffe & Szegedy 2015, arXiv:1502.03167), NCHW and
 * NHWC, forward (training: the batch's mean and biased variance, in double, into the caller's
 * device arrays; inference: those arrays read) with the fused ReLU or hardswish, and backward
 * masking by the ReLU's output or recomputing the hardswish's input.
 * fleet's own kernels, not cuDNN's: cuDNN keeps a float inverse variance and updates running
 * statistics itself, where fleet's contract is double statistics returned to the layer. The
 * per-channel sums are this file's fixed-order reductions in double (bn_sums: NCHW planes a
 * block per channel and split, NHWC rows 4 channels a thread), the statistics one pass over x
 * (shifted sums of d and d^2); the per-channel coefficients are computed in double and rounded
 * once, as the cpu table does, and the elementwise passes apply them, 4 elements a thread with
 * 16-byte loads where shape and alignment allow (the same bits either way). Every kernel finds
 * an element's channel with fastdiv.h's multiply-and-shift where the call's indices fit in 31
 * bits. f16 / bf16 activations (x, y, dy, dx) are read exactly and computed with in float, each
 * output rounded once on store; gamma, beta, dgamma, dbeta and the coefficients are then f32
 * (acc_t), mean and var double as always. */
#include "fastdiv.h"
#include "reduce.cuh"

#include <math.h>

/* --- where element (row r, channel c) lies: rows are the N HW pixels of the batch --- */

/* The shape of a call, with dividers for HW and C where every index fits in 31 bits (SMALL):
 * NCHW's position of (r, c) needs r / HW, an element's channel (i / HW) % C or i % C, and
 * 64-bit division per element cost these kernels most of their time. */
struct bn_shape {
    bool       nhwc;
    int64_t    C, hw;
    fl_fastdiv dhw, dc;
};

static bn_shape shape_of(bool nhwc, int64_t c, int64_t hw, bool small) {
    bn_shape s = {nhwc, c, hw, {}, {}};
    if (small)
        s.dhw = fl_fastdiv_make((uint32_t)hw), s.dc = fl_fastdiv_make((uint32_t)c);
    return s;
}

template <bool SMALL> __device__ __forceinline__ int64_t bn_at(const bn_shape &s, int64_t r, int64_t c) {
    if (s.nhwc)
        return r * s.C + c;
    if (SMALL) {
        uint32_t n = fl_fastdiv_q(s.dhw, (uint32_t)r);
        return ((int64_t)n * s.C + c) * s.hw + (r - (int64_t)n * s.hw);
    }
    return (r / s.hw * s.C + c) * s.hw + r % s.hw;
}

template <bool SMALL> __device__ __forceinline__ int64_t bn_channel(const bn_shape &s, int64_t i) {
    if (SMALL)
        return fl_fastdiv_r(s.dc, s.nhwc ? (uint32_t)i : fl_fastdiv_q(s.dhw, (uint32_t)i));
    return s.nhwc ? i % s.C : (i / s.hw) % s.C;
}

/* Whether a call can move 4 elements at a time: 4 consecutive elements share a channel (NCHW,
 * HW % 4 == 0) or are 4 consecutive channels (NHWC, C % 4 == 0), and every array is 16-byte
 * aligned. The sums' order does not depend on it (below), only the loads' width. */
static bool vec_ok(bool nhwc, int64_t c, int64_t hw, const void *a, const void *b, const void *d,
                   const void *e) {
    bool shape = nhwc ? c % 4 == 0 : hw % 4 == 0;
    return shape && all_aligned16(a, b, d, e);
}

/* --- per-channel sums of two quantities in one pass over the rows (the N HW pixels) ---
 * A functor F gives a channel's constants (F::ch, from channel(c)), loads the arrays it reads
 * at one element (load1) or four (load4) into F::vals, and adds element j of them to a
 * channel's double2 (add). Each split of rows is summed in an order fixed by the shape alone:
 * NCHW, a block per (channel, split), thread t taking rows r0 + 4t .. r0 + 4t + 3, then
 * r0 + 4t + 4 THREADS ..., each added in row order, the threads' sums by a fixed shuffle tree;
 * NHWC, a block per (4 TX channels, split), 4 channels a thread, thread row y taking rows
 * r0 + y, r0 + y + TY, ..., the TY rows' sums added in order. The splits are then added in a
 * fixed order too (bn_finish_k). Bit-repeatable, and the same bits whether 4 elements came in
 * one load or four. */

/* The sum of v over the block (blockDim.x = THREADS), valid in thread 0; every thread calls. */
__device__ __forceinline__ double2 block_sum2(double2 v, double2 *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        v.x += __shfl_down_sync(0xffffffffu, v.x, o);
        v.y += __shfl_down_sync(0xffffffffu, v.y, o);
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    if (l == 0)
        sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < THREADS / 32 ? sh[l] : make_double2(0, 0);
        for (int o = 16; o > 0; o >>= 1) {
            v.x += __shfl_down_sync(0xffffffffu, v.x, o);
            v.y += __shfl_down_sync(0xffffffffu, v.y, o);
        }
    }
    return v;
}

template <class F, bool SMALL, bool VEC>
__global__ void bn_sum_planes_k(F f, bn_shape s, int64_t R, int64_t rps, double2 *part) {
    __shared__ double2 sh[THREADS / 32];
    int64_t c = blockIdx.x, sp = blockIdx.y;
    int64_t r0 = sp * rps, r1 = r0 + rps < R ? r0 + rps : R;
    typename F::ch h{};
    if (r0 < r1) /* no rows (N HW = 0): nothing to read */
        h = f.channel(c);
    double2 acc = make_double2(0, 0);
    for (int64_t r = r0 + 4 * (int64_t)threadIdx.x; r < r1; r += 4 * THREADS) {
        typename F::vals v;
        if (VEC) { /* HW % 4 == 0 and r % 4 == 0: the 4 rows lie in one plane, together */
            f.load4(bn_at<SMALL>(s, r, c), v);
            for (int j = 0; j < 4; j++)
                f.add(h, v, j, acc);
        } else {
            for (int j = 0; j < 4 && r + j < r1; j++) {
                f.load1(bn_at<SMALL>(s, r + j, c), v, j);
                f.add(h, v, j, acc);
            }
        }
    }
    acc = block_sum2(acc, sh);
    if (threadIdx.x == 0)
        part[sp * s.C + c] = acc;
}

/* NHWC: a block of TX x TY threads (TX TY = THREADS) takes 4 TX channels and a split of rows,
 * thread (x, y) channels 4 (blockIdx.x TX + x) .. + 3 and rows r0 + y, r0 + y + TY, ...; the
 * TY rows' sums of a channel are then added in order of y. TX is the power of two that covers
 * the channels' quads (at most 32), so that a few channels keep every thread busy. Dynamic
 * shared memory: TY x 4 x (TX + 1) double2. */
template <class F, bool VEC>
__global__ void bn_sum_rows_k(F f, bn_shape s, int64_t R, int64_t rps, double2 *part) {
    extern __shared__ double2 rows_sh[];
    int tx = blockDim.x, ty = blockDim.y, x = threadIdx.x, y = threadIdx.y;
    int64_t C = s.C, c0 = ((int64_t)blockIdx.x * tx + x) * 4, sp = blockIdx.y;
    int64_t r0 = sp * rps, r1 = r0 + rps < R ? r0 + rps : R;
    int m = C - c0 < 0 ? 0 : C - c0 < 4 ? (int)(C - c0) : 4;
    typename F::ch h[4];
    double2 acc[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc[j] = make_double2(0, 0);
        if (j < m && r0 < r1)
            h[j] = f.channel(c0 + j);
    }
    /* the loops over j run to 4 with m tested inside, so that they unroll and the arrays stay
     * in registers (a loop to m indexes them at run time: local memory) */
    if (m > 0)
        for (int64_t r = r0 + y; r < r1; r += ty) {
            typename F::vals v;
            int64_t i = r * C + c0;
            if (VEC) { /* C % 4 == 0: m == 4 */
                f.load4(i, v);
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j < m)
                        f.load1(i + j, v, j);
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < m)
                    f.add(h[j], v, j, acc[j]);
        }
#pragma unroll
    for (int j = 0; j < 4; j++)
        rows_sh[(y * 4 + j) * (tx + 1) + x] = acc[j];
    __syncthreads();
    if (y == 0)
        for (int j = 0; j < m; j++) {
            double2 t = rows_sh[j * (tx + 1) + x];
            for (int k = 1; k < ty; k++) {
                double2 u = rows_sh[(k * 4 + j) * (tx + 1) + x];
                t.x += u.x, t.y += u.y;
            }
            part[sp * C + c0 + j] = t;
        }
}

/* g(c, the S splits' sums of channel c): a block of 32 x FINISH_ROWS threads per 32 channels,
 * thread (x, y) adding splits y, y + FINISH_ROWS, ... in order, then the rows in order of y.
 * 32 rows (8 until 2026-11-27): NHWC has up to 512 splits, and with 8 rows a channel's 64
 * dependent loads per thread made the finish 7% of an f16 ResNet-50 step's kernels on the
 * H200, for a few blocks (C = 64: two). */
#define FINISH_ROWS 32
template <class G>
__global__ void bn_finish_k(const double2 *part, int64_t S, int64_t C, G g) {
    __shared__ double2 sh[FINISH_ROWS][33];
    int x = threadIdx.x, y = threadIdx.y;
    int64_t c = (int64_t)blockIdx.x * 32 + x;
    double2 t = make_double2(0, 0);
    if (c < C)
        for (int64_t k = y; k < S; k += FINISH_ROWS)
            t.x += part[k * C + c].x, t.y += part[k * C + c].y;
    sh[y][x] = t;
    __syncthreads();
    if (y == 0 && c < C) {
        for (int k = 1; k < FINISH_ROWS; k++)
            t.x += sh[k][x].x, t.y += sh[k][x].y;
        g(c, t);
    }
}

/* Calls g(c, the sums of f over channel c) for every channel. Splits of rows, fixed by the
 * shape: NCHW at least 4096 rows and at most 64 splits (a block's threads take 16 or more
 * elements each), a multiple of 4 THREADS; NHWC enough splits for about 2048 blocks, at most
 * 512. */
template <class F, class G>
static void bn_sums(bool small, bool vec, const bn_shape &s, F f, G g, int64_t R,
                    const char *op) {
    int64_t C = s.C, rps, S;
    unsigned tx = 1, gx = 1;
    if (s.nhwc) {
        int64_t quads = (C + 3) / 4;
        while (tx < 32 && tx < quads)
            tx *= 2;
        gx = (unsigned)((quads + tx - 1) / tx);
        S = (2048 + gx - 1) / gx;
        S = S > 512 ? 512 : S;
        int64_t most = (R + THREADS / tx - 1) / (THREADS / tx); /* a row for each thread row */
        S = S > most ? most : S;
        S = S < 1 ? 1 : S;
        rps = (R + S - 1) / S;
        rps = rps < 1 ? 1 : rps;
    } else {
        const int64_t q = 4 * THREADS;
        rps = (R + 63) / 64;
        rps = rps < 4096 ? 4096 : (rps + q - 1) / q * q;
    }
    S = R > 0 ? (R + rps - 1) / rps : 1;
    double2 *part = (double2 *)cuda_get((size_t)(S * C) * sizeof(double2), op);
    DISPATCH_BOOL(V, vec, {
        if (s.nhwc) {
            unsigned ty = THREADS / tx;
            size_t shb = (size_t)ty * 4 * (tx + 1) * sizeof(double2);
            bn_sum_rows_k<F, V><<<dim3(gx, (unsigned)S), dim3(tx, ty), shb, cuda_stream()>>>(
                f, s, R, rps, part);
        } else if (small) {
            bn_sum_planes_k<F, true, V>
                <<<dim3((unsigned)C, (unsigned)S), THREADS, 0, cuda_stream()>>>(f, s, R, rps, part);
        } else {
            bn_sum_planes_k<F, false, V>
                <<<dim3((unsigned)C, (unsigned)S), THREADS, 0, cuda_stream()>>>(f, s, R, rps, part);
        }
    });
    CU_LAUNCHED(op);
    bn_finish_k<<<(unsigned)((C + 31) / 32), dim3(32, FINISH_ROWS), 0, cuda_stream()>>>(
        part, S, C, g);
    CU_LAUNCHED(op);
    cuda_put(part);
}

/* --- statistics in one pass: sums of d and d^2 with d = x - K, K the channel's first value
 * (shifted data: with K near the mean, E[d^2] - E[d]^2 loses no more than the two-pass
 * formula, where E[x^2] - E[x]^2 would cancel when |mean| >> std) --- */

template <class T> struct stat_f {
    const T *x;
    bn_shape s;
    struct ch {
        double k;
    };
    struct vals {
        T x[4];
    };
    __device__ ch channel(int64_t c) const {
        return ch{(double)lo_get(x[s.nhwc ? c : c * s.hw])}; /* element (0, c) */
    }
    __device__ void load1(int64_t i, vals &v, int j) const { v.x[j] = x[i]; }
    __device__ void load4(int64_t i, vals &v) const { ::load4(x + i, v.x); }
    __device__ void add(const ch &h, const vals &v, int j, double2 &acc) const {
        double d = (double)lo_get(v.x[j]) - h.k;
        acc.x += d, acc.y += d * d;
    }
};

/* the batch's mean and variance, and from them the apply's coefficients a, b as bn_coef_k
 * computes them (the same doubles: one launch fewer per training forward) */
template <class T> struct stat_store {
    typedef acc_t<T> A;
    const T *x;
    bn_shape s;
    double  *mean, *var;
    double   cnt;
    const A *gamma, *beta;
    double   eps;
    A       *ab;
    __device__ void operator()(int64_t c, double2 t) const {
        double k = cnt > 0 ? (double)lo_get(x[s.nhwc ? c : c * s.hw]) : 0, m = t.x / cnt;
        double v = t.y / cnt - m * m;
        double mc = k + m, vc = v > 0 ? v : 0 * v; /* rounding can leave -1e-17; NaN stays */
        mean[c] = mc, var[c] = vc;
        double sc = (double)gamma[c] / sqrt(vc + eps);
        ab[c] = (A)sc;
        ab[s.C + c] = (A)((double)beta[c] - mc * sc);
    }
};

/* --- y = act(x a + b), a = gamma / sqrt(var + eps), b = beta - mean a; act none, relu or
 * hardswish. The coefficients, gamma and beta are of A = acc_t<T> (f32 beside low T). --- */

template <class A>
__global__ void bn_coef_k(const A *gamma, const A *beta, const double *mean, const double *var,
                          double eps, int64_t C, A *ab) {
    GRID_STRIDE(c, C) {
        double s = (double)gamma[c] / sqrt(var[c] + eps);
        ab[c] = (A)s;
        ab[C + c] = (A)((double)beta[c] - mean[c] * s);
    }
}

template <class T> __device__ __forceinline__ T bn_affine(T x, T a, T b, fl_act act) {
    T v = x * a + b;
    return act == FL_ACT_RELU        ? (v > (T)0 ? v : (T)0)
           : act == FL_ACT_HARDSWISH ? act_hardswish(v)
                                     : v;
}

/* the gradient dz of the activation at z = x a + b (recomputed for hardswish; the relu's mask
 * from its output y) */
template <class T>
__device__ __forceinline__ T bn_dz(fl_act act, T x, T y, T dy, T a, T b) {
    return act == FL_ACT_RELU        ? relu_keep(y, dy)
           : act == FL_ACT_HARDSWISH ? dy * act_hardswish_grad(x * a + b)
                                     : dy;
}

/* VEC: element i = 4 q and the next three, one channel (NCHW) or channels c .. c + 3 (NHWC) */
template <class T, bool SMALL, bool VEC>
__global__ void bn_apply_k(bn_shape s, int64_t total, const T *x, const acc_t<T> *ab, fl_act act,
                           T *y) {
    if (VEC) {
        GRID_STRIDE(q, total / 4) {
            int64_t i = 4 * q, c = bn_channel<SMALL>(s, i), d = s.nhwc ? 1 : 0;
            T v[4];
            load4(x + i, v);
            for (int j = 0; j < 4; j++)
                v[j] = lo_put<T>(bn_affine(lo_get(v[j]), ab[c + d * j], ab[s.C + c + d * j], act));
            store4(y + i, v);
        }
    } else {
        GRID_STRIDE(i, total) {
            int64_t c = bn_channel<SMALL>(s, i);
            y[i] = lo_put<T>(bn_affine(lo_get(x[i]), ab[c], ab[s.C + c], act));
        }
    }
}

static void check_layout(const char *op, fl_layout layout) {
    if (layout != FL_LAYOUT_NCHW && layout != FL_LAYOUT_NHWC)
        cuda_fatal(op, "the layout check", "unknown layout", __FILE__, __LINE__);
}

extern "C" void cuda_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                const void *x, const void *gamma, const void *beta, double eps,
                                bool training, double *mean, double *var, fl_act act, void *y) {
    const char *op = "bn_forward";
    check_layout(op, layout);
    if (c <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    int64_t R = n * hw, total = R * c;
    bool small = total < INT32_MAX && hw >= 1;
    bool vec = vec_ok(nhwc, c, hw, x, y, NULL, NULL);
    bn_shape s = shape_of(nhwc, c, hw, small);
    DISPATCH_TL(op, t, {
        typedef acc_t<T> A;
        const T *xt = (const T *)x;
        A *ab = (A *)cuda_get((size_t)(2 * c) * sizeof(A), op);
        if (training) { /* the statistics, and the coefficients with them */
            bn_sums(small, vec, s, stat_f<T>{xt, s},
                    stat_store<T>{xt, s, mean, var, (double)R, (const A *)gamma,
                                  (const A *)beta, eps, ab},
                    R, op);
        } else {
            bn_coef_k<A><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
                (const A *)gamma, (const A *)beta, mean, var, eps, c, ab);
            CU_LAUNCHED(op);
        }
        if (total > 0) {
            DISPATCH_BOOL(S, small, DISPATCH_BOOL(V, vec, {
                bn_apply_k<T, S, V><<<blocks_for_vec(total, V), THREADS, 0, cuda_stream()>>>(
                    s, total, xt, ab, act, (T *)y);
            }));
            CU_LAUNCHED(op);
        }
        cuda_put(ab);
    });
}

/* --- backward --- */

/* (d, d (x - mean)) with d = bn_dz (ry: the relu's output, ab: the forward's a, b for
 * hardswish); x - mean in acc_t<T> (T as the cpu table for f32 / f64) */
template <class T> struct grad_f {
    typedef acc_t<T> A;
    const T      *x, *ry, *dy;
    const A      *ab;
    const double *mean;
    fl_act        act;
    int64_t       C;
    struct ch {
        A m, a, b;
    };
    struct vals {
        T x[4], ry[4], dy[4];
    };
    __device__ ch channel(int64_t c) const {
        return ab ? ch{(A)mean[c], ab[c], ab[C + c]} : ch{(A)mean[c], (A)0, (A)0};
    }
    __device__ void load1(int64_t i, vals &v, int j) const {
        v.x[j] = x[i], v.dy[j] = dy[i];
        if (ry)
            v.ry[j] = ry[i];
    }
    __device__ void load4(int64_t i, vals &v) const {
        ::load4(x + i, v.x), ::load4(dy + i, v.dy);
        if (ry)
            ::load4(ry + i, v.ry);
    }
    __device__ void add(const ch &h, const vals &v, int j, double2 &acc) const {
        A xj = lo_get(v.x[j]);
        A d = bn_dz(act, xj, ry ? lo_get(v.ry[j]) : (A)0, lo_get(v.dy[j]), h.a, h.b);
        acc.x += (double)d, acc.y += (double)(d * (xj - h.m));
    }
};

/* dgamma, dbeta (adding when accumulate), and dx's coefficients per channel:
 * dx = k (d - mean(d) - xhat mean(d xhat)) = a d + bx (x - mean) + c0 */
template <class T> struct grad_store {
    typedef acc_t<T> A;
    const A      *gamma;
    const double *mean, *var;
    double        eps, cnt;
    bool          training, accumulate;
    A            *dgamma, *dbeta, *coef; /* coef: a (C), bx (C), c0 (C) */
    int64_t       C;
    __device__ void operator()(int64_t c, double2 s) const {
        double is = 1.0 / sqrt(var[c] + eps), sdy = s.x, sdyx = s.y * is;
        dgamma[c] = (A)((accumulate ? (double)dgamma[c] : 0.0) + sdyx);
        dbeta[c] = (A)((accumulate ? (double)dbeta[c] : 0.0) + sdy);
        double k = (double)gamma[c] * is;
        double mdy = training ? sdy / cnt : 0, mdyx = training ? sdyx / cnt : 0;
        coef[c] = (A)k;
        coef[C + c] = (A)(-k * is * mdyx);
        coef[2 * C + c] = (A)(-k * mdy);
    }
};

/* in A = acc_t of the activations' dtype */
template <class A>
__device__ __forceinline__ A bn_dx(const A *coef, const A *ab, int64_t C, int64_t c,
                                   const double *mean, fl_act act, A x, A ry, A dy) {
    A d = bn_dz(act, x, ry, dy, ab ? ab[c] : (A)0, ab ? ab[C + c] : (A)0);
    return coef[c] * d + coef[C + c] * (x - (A)mean[c]) + coef[2 * C + c];
}

template <class T, bool SMALL, bool VEC>
__global__ void bn_dx_k(bn_shape s, int64_t total, const T *x, fl_act act, const T *ry,
                        const T *dy, const acc_t<T> *ab, const double *mean,
                        const acc_t<T> *coef, T *dx) {
    typedef acc_t<T> A;
    int64_t C = s.C;
    if (VEC) {
        GRID_STRIDE(q, total / 4) {
            int64_t i = 4 * q, c = bn_channel<SMALL>(s, i), d = s.nhwc ? 1 : 0;
            T xv[4], rv[4], dv[4];
            load4(x + i, xv), load4(dy + i, dv);
            if (ry)
                load4(ry + i, rv);
            for (int j = 0; j < 4; j++)
                xv[j] = lo_put<T>(bn_dx(coef, ab, C, c + d * j, mean, act, lo_get(xv[j]),
                                        ry ? lo_get(rv[j]) : (A)0, lo_get(dv[j])));
            store4(dx + i, xv);
        }
    } else {
        GRID_STRIDE(i, total) {
            int64_t c = bn_channel<SMALL>(s, i);
            dx[i] = lo_put<T>(bn_dx(coef, ab, C, c, mean, act, lo_get(x[i]),
                                    ry ? lo_get(ry[i]) : (A)0, lo_get(dy[i])));
        }
    }
}

extern "C" void cuda_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                 const void *x, fl_act act, const void *y, const void *dy,
                                 const void *gamma, const void *beta, const double *mean,
                                 const double *var, double eps, bool training, void *dx,
                                 void *dgamma, void *dbeta, bool accumulate) {
    const char *op = "bn_backward";
    check_layout(op, layout);
    if (c <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    int64_t R = n * hw, total = R * c;
    bool small = total < INT32_MAX && hw >= 1;
    const void *relu_y = act == FL_ACT_RELU ? y : NULL;
    bool vec = vec_ok(nhwc, c, hw, x, relu_y, dy, dx);
    bn_shape s = shape_of(nhwc, c, hw, small);
    DISPATCH_TL(op, t, {
        typedef acc_t<T> A;
        const T *xt = (const T *)x, *ry = (const T *)relu_y, *dyt = (const T *)dy;
        A *coef = (A *)cuda_get((size_t)(5 * c) * sizeof(A), op), *ab = NULL;
        if (act == FL_ACT_HARDSWISH) { /* the forward's a, b, for z */
            ab = coef + 3 * c;
            bn_coef_k<A><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
                (const A *)gamma, (const A *)beta, mean, var, eps, c, ab);
            CU_LAUNCHED(op);
        }
        grad_store<T> st = {(const A *)gamma, mean, var, eps, (double)R, training, accumulate,
                            (A *)dgamma, (A *)dbeta, coef, c};
        bn_sums(small, vec, s, grad_f<T>{xt, ry, dyt, ab, mean, act, c}, st, R, op);
        if (dx && total > 0) {
            DISPATCH_BOOL(S, small, DISPATCH_BOOL(V, vec, {
                bn_dx_k<T, S, V><<<blocks_for_vec(total, V), THREADS, 0, cuda_stream()>>>(
                    s, total, xt, act, ry, dyt, ab, mean, coef, (T *)dx);
            }));
            CU_LAUNCHED(op);
        }
        cuda_put(coef);
    });
}

/* --- the running statistics (backend.h bn_running): the cpu table's arithmetic, each product
 * and sum rounded on its own (__dmul_rn, __dadd_rn: explicit, though the .cu files are built
 * with --fmad=false too), so the bits match the cpu table's (test_cuda_backend) --- */

__device__ __forceinline__ double running_step(double r, double v, double momentum) {
    return __dadd_rn(__dmul_rn(1 - momentum, r), __dmul_rn(momentum, v));
}

template <class R>
__global__ void bn_running_k(int64_t C, const double *mean, const double *var, double count,
                             double momentum, R *rm, R *rv) {
    GRID_STRIDE(c, C) {
        double unbiased = count > 1 ? __ddiv_rn(__dmul_rn(var[c], count), count - 1) : var[c];
        rm[c] = (R)running_step((double)rm[c], mean[c], momentum);
        rv[c] = (R)running_step((double)rv[c], unbiased, momentum);
    }
}

extern "C" void cuda_bn_running(fl_dtype t, int64_t c, const double *mean, const double *var,
                                double count, double momentum, void *running_mean,
                                void *running_var) {
    const char *op = "bn_running";
    if (c <= 0)
        return;
    if (t == FL_DTYPE_F32)
        bn_running_k<float><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
            c, mean, var, count, momentum, (float *)running_mean, (float *)running_var);
    else if (t == FL_DTYPE_F64)
        bn_running_k<double><<<blocks_for(c), THREADS, 0, cuda_stream()>>>(
            c, mean, var, count, momentum, (double *)running_mean, (double *)running_var);
    else
        cuda_fatal(op, "the dtype check", "running statistics are f32 or f64", __FILE__,
                   __LINE__);
    CU_LAUNCHED(op);
}
