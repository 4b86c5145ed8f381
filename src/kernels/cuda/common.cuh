/* common.cuh - what the cuda backend's kernels share: launch sizes, the f32/f64 dispatch and the
 * one with the low dtypes (f16 / bf16 storage computed in float, rounded once on store), the
 * fused ReLU's mask, 4-element vector loads and stores, and a fixed-order block reduction in
 * double (a tree over shared memory whose shape depends on the block size only, so sums are
 * bit-repeatable run to run). */
#ifndef FLEET_KERNELS_CUDA_COMMON_CUH
#define FLEET_KERNELS_CUDA_COMMON_CUH

#include "backend_private.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define THREADS 256

/* blocks for a grid-stride loop over n items */
static inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* blocks for a grid-stride loop over n items taken 4 at a time when vec */
static inline unsigned blocks_for_vec(int64_t n, bool vec) {
    return blocks_for(vec ? n / 4 : n);
}

#define GRID_STRIDE(i, n)                                                                     \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
         i += (int64_t)gridDim.x * blockDim.x)

/* Runs BODY with T = float or double according to t; other dtypes abort naming op. */
#define DISPATCH_T(op, t, ...)                                                                \
    do {                                                                                      \
        if ((t) == FL_DTYPE_F32) {                                                            \
            typedef float T;                                                                  \
            __VA_ARGS__;                                                                      \
        } else if ((t) == FL_DTYPE_F64) {                                                     \
            typedef double T;                                                                 \
            __VA_ARGS__;                                                                      \
        } else {                                                                              \
            cuda_bad_dtype(op, t);                                                            \
        }                                                                                     \
    } while (0)

/* --- low dtypes (backend.h, "Low dtypes") ---
 * A kernel over activations is a template on its storage type S (float, double, __half,
 * __nv_bfloat16) and computes in acc_t<S>: float for f32, f16 and bf16, double for f64. lo_get
 * reads an element into acc_t (exact), lo_put rounds a value of acc_t once to S (to nearest
 * even, f16 overflowing to inf, as fl_f32_to_f16 / fl_f32_to_bf16); for f32 and f64 both are
 * the identity, so those kernels give the bits they gave before. What stays f32 beside low
 * activations (biases and their gradients, batch norm's gamma, beta, dgamma, dbeta) is of type
 * acc_t<S> too: f32 for low S, S itself for f32 and f64. */
template <class S> struct acc_of {
    typedef float type;
};
template <> struct acc_of<double> {
    typedef double type;
};
template <class S> using acc_t = typename acc_of<S>::type;

__device__ __forceinline__ float lo_get(float v) { return v; }
__device__ __forceinline__ double lo_get(double v) { return v; }
__device__ __forceinline__ float lo_get(__half v) { return __half2float(v); }
__device__ __forceinline__ float lo_get(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class S> __device__ __forceinline__ S lo_put(acc_t<S> v);
template <> __device__ __forceinline__ float lo_put<float>(float v) { return v; }
template <> __device__ __forceinline__ double lo_put<double>(double v) { return v; }
template <> __device__ __forceinline__ __half lo_put<__half>(float v) {
    return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 lo_put<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/* v rounded once to S from a double (a sum kept in double): the same rounding as the ref
 * table's for f16 and bf16 (nearest even from the exact double, no detour through float) */
template <class S> __device__ __forceinline__ S lo_put_d(double v);
template <> __device__ __forceinline__ float lo_put_d<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double lo_put_d<double>(double v) { return v; }
template <> __device__ __forceinline__ __half lo_put_d<__half>(double v) {
    return __double2half(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 lo_put_d<__nv_bfloat16>(double v) {
    return __double2bfloat16(v);
}

/* Whether S is a low dtype's storage (2 bytes). */
template <class S> struct is_low {
    static constexpr bool value = sizeof(S) == 2;
};

/* Runs BODY with T = __half or __nv_bfloat16 for t f16 or bf16, else as DISPATCH_T (float,
 * double; other dtypes abort naming op): the storage type of the activations; compute in
 * acc_t<T>. The ops of backend.h's low-dtype list use it; the rest keep DISPATCH_T. */
#define DISPATCH_TL(op, t, ...)                                                               \
    do {                                                                                      \
        if ((t) == FL_DTYPE_F16) {                                                            \
            typedef __half T;                                                                 \
            __VA_ARGS__;                                                                      \
        } else if ((t) == FL_DTYPE_BF16) {                                                    \
            typedef __nv_bfloat16 T;                                                          \
            __VA_ARGS__;                                                                      \
        } else {                                                                              \
            DISPATCH_T(op, t, __VA_ARGS__);                                                   \
        }                                                                                     \
    } while (0)

/* d where y > 0 (y a ReLU's output), on the bits as the CPU's keep_f32 / keep_f64: -0 and
 * negative y drop d, NaN keeps it */
__device__ __forceinline__ float relu_keep(float y, float d) {
    return __float_as_int(y) > 0 ? d : 0.0f;
}
__device__ __forceinline__ double relu_keep(double y, double d) {
    return __double_as_longlong(y) > 0 ? d : 0.0;
}
/* the same on f16 / bf16 bits (add_backward's low copy of dy: no arithmetic) */
__device__ __forceinline__ __half relu_keep(__half y, __half d) {
    return __half_as_short(y) > 0 ? d : __ushort_as_half((unsigned short)0);
}
__device__ __forceinline__ __nv_bfloat16 relu_keep(__nv_bfloat16 y, __nv_bfloat16 d) {
    return __bfloat16_as_short(y) > 0 ? d : __ushort_as_bfloat16((unsigned short)0);
}

/* hardswish (MobileNetV3, arXiv:1905.02244) and its derivative, written as the CPU table's
 * (kernels/hardswish.h): the activation kernels and batch norm's fused hardswish */
template <class T> __device__ __forceinline__ T act_hardswish(T x) {
    return x <= (T)-3 ? (T)0 : x >= (T)3 ? x : x * (x + (T)3) / (T)6;
}
template <class T> __device__ __forceinline__ T act_hardswish_grad(T x) {
    return x < (T)-3 ? (T)0 : x > (T)3 ? (T)1 : x / (T)3 + (T)0.5;
}

/* The sum of v over the block (blockDim.x a power of two <= 1024), valid in thread 0; every
 * thread must call it. */
__device__ __forceinline__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

template <class T> __device__ __forceinline__ T block_max(T v, T *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = sh[threadIdx.x + s] > sh[threadIdx.x] ? sh[threadIdx.x + s]
                                                                    : sh[threadIdx.x];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

/* One element of an (N, C, H, W) batch in a layout: its coordinates from its position in
 * memory, and its position from them, in index type I (int64_t; int where every index of a
 * call fits in 31 bits: 64-bit division is a long routine on the GPU). The first argument
 * fixes I, the others convert to it. */
template <class I> struct same_as {
    typedef I type;
};
template <class I> struct coord4 {
    I n, c, y, x;
};
template <class I>
__host__ __device__ __forceinline__ coord4<I> coord_of(bool nhwc, I i, typename same_as<I>::type c,
                                                       typename same_as<I>::type h,
                                                       typename same_as<I>::type w) {
    coord4<I> k;
    if (nhwc) {
        k.c = i % c, i /= c;
        k.x = i % w, i /= w;
        k.y = i % h, k.n = i / h;
    } else {
        k.x = i % w, i /= w;
        k.y = i % h, i /= h;
        k.c = i % c, k.n = i / c;
    }
    return k;
}
template <class I>
__host__ __device__ __forceinline__ I index_of(bool nhwc, I n, typename same_as<I>::type ch,
                                               typename same_as<I>::type y,
                                               typename same_as<I>::type x,
                                               typename same_as<I>::type c,
                                               typename same_as<I>::type h,
                                               typename same_as<I>::type w) {
    return nhwc ? ((n * h + y) * w + x) * c + ch : ((n * c + ch) * h + y) * w + x;
}

/* Vector access: 4 elements at once (one 16-byte load or store for float, one 8-byte for f16 /
 * bf16, two 16-byte for double), the same values as 4 single ones. Callers use them at element
 * 4 q of arrays they checked with aligned16, so every such access is aligned to its width.
 * (Until 2026-11-27 f16 / bf16 took four 2-byte loads: batch norm in f16 ran no faster than in
 * f32 on the H200.) */

template <class T> __device__ __forceinline__ void load4(const T *p, T *v) {
    for (int j = 0; j < 4; j++)
        v[j] = p[j];
}
template <> __device__ __forceinline__ void load4<float>(const float *p, float *v) {
    float4 q = *reinterpret_cast<const float4 *>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
template <class T> __device__ __forceinline__ void store4(T *p, const T *v) {
    for (int j = 0; j < 4; j++)
        p[j] = v[j];
}
template <> __device__ __forceinline__ void store4<float>(float *p, const float *v) {
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
/* 2-byte and 8-byte elements: the vector's bytes moved whole (memcpy of registers: no
 * conversion, the same bits) */
template <class T, class V> __device__ __forceinline__ void load4_as(const T *p, T *v) {
    V q[sizeof(T) * 4 / sizeof(V)];
    for (int k = 0; k < (int)(sizeof q / sizeof q[0]); k++)
        q[k] = reinterpret_cast<const V *>(p)[k];
    memcpy(v, q, sizeof q);
}
template <class T, class V> __device__ __forceinline__ void store4_as(T *p, const T *v) {
    V q[sizeof(T) * 4 / sizeof(V)];
    memcpy(q, v, sizeof q);
    for (int k = 0; k < (int)(sizeof q / sizeof q[0]); k++)
        reinterpret_cast<V *>(p)[k] = q[k];
}
template <> __device__ __forceinline__ void load4<__half>(const __half *p, __half *v) {
    load4_as<__half, uint2>(p, v);
}
template <> __device__ __forceinline__ void load4<__nv_bfloat16>(const __nv_bfloat16 *p,
                                                                 __nv_bfloat16 *v) {
    load4_as<__nv_bfloat16, uint2>(p, v);
}
template <> __device__ __forceinline__ void load4<double>(const double *p, double *v) {
    load4_as<double, double2>(p, v);
}
template <> __device__ __forceinline__ void store4<__half>(__half *p, const __half *v) {
    store4_as<__half, uint2>(p, v);
}
template <> __device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16 *p,
                                                                  const __nv_bfloat16 *v) {
    store4_as<__nv_bfloat16, uint2>(p, v);
}
template <> __device__ __forceinline__ void store4<double>(double *p, const double *v) {
    store4_as<double, double2>(p, v);
}

static inline bool aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}
/* Whether every array given is 16-byte aligned (NULL, an array not passed, counts as aligned). */
static inline bool all_aligned16(const void *a, const void *b = NULL, const void *c = NULL,
                                 const void *d = NULL) {
    return aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}


/* Runs BODY with NAME a constexpr bool equal to flag: a run-time choice made a template
 * argument (DISPATCH_BOOL(V, vec, kernel<T, V><<<...>>>(...))). */
#define DISPATCH_BOOL(NAME, flag, ...)                                                        \
    do {                                                                                      \
        if (flag) {                                                                           \
            constexpr bool NAME = true;                                                       \
            __VA_ARGS__;                                                                      \
        } else {                                                                              \
            constexpr bool NAME = false;                                                      \
            __VA_ARGS__;                                                                      \
        }                                                                                     \
    } while (0)

#endif /* FLEET_KERNELS_CUDA_COMMON_CUH */
