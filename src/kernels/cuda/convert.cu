/* convert.cu - f32 <-> f16 / bf16 conversion kernels (convert.h), with CUDA's round-to-nearest-
 * even intrinsics, for mixed precision's master weights and loss-scaled gradients; the table's
 * `convert` entry over them (backend.h); and the f32 add of a low array into an f32 one (a low
 * convolution plan's weight gradient accumulated into its f32 dw). */
#include "common.cuh"
#include "convert.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <class D, class S, class F> __global__ void convert_k(D *dst, const S *src, int64_t n, F f) {
    GRID_STRIDE(i, n) dst[i] = f(src[i]);
}

struct to_f16 {
    __device__ __half operator()(float x) const { return __float2half_rn(x); }
};
struct to_bf16 {
    __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};
struct from_f16 {
    __device__ float operator()(__half x) const { return __half2float(x); }
};
struct from_bf16 {
    __device__ float operator()(__nv_bfloat16 x) const { return __bfloat162float(x); }
};

extern "C" int fl_cuda_convert(fl_dtype dst_t, void *dst, fl_dtype src_t, const void *src,
                               int64_t n, fl_stream *s) {
    if (n <= 0)
        return FL_OK;
    cuda_require_bound("convert");
    cudaStream_t st = cuda_stream_of(s);
    unsigned b = blocks_for(n);
    if (src_t == FL_DTYPE_F32 && dst_t == FL_DTYPE_F16)
        convert_k<<<b, THREADS, 0, st>>>((__half *)dst, (const float *)src, n, to_f16());
    else if (src_t == FL_DTYPE_F32 && dst_t == FL_DTYPE_BF16)
        convert_k<<<b, THREADS, 0, st>>>((__nv_bfloat16 *)dst, (const float *)src, n, to_bf16());
    else if (src_t == FL_DTYPE_F16 && dst_t == FL_DTYPE_F32)
        convert_k<<<b, THREADS, 0, st>>>((float *)dst, (const __half *)src, n, from_f16());
    else if (src_t == FL_DTYPE_BF16 && dst_t == FL_DTYPE_F32)
        convert_k<<<b, THREADS, 0, st>>>((float *)dst, (const __nv_bfloat16 *)src, n, from_bf16());
    else
        return fl_fail(FL_EINVAL, "cuda convert: %s -> %s: only f32 <-> f16 and f32 <-> bf16",
                       fl_dtype_name(src_t), fl_dtype_name(dst_t));
    CU_LAUNCHED("convert");
    return FL_OK;
}

/* backend.h's convert: equal dtypes copy, the pairs above convert in the backend's stream; any
 * other pair is a programming error (the table's ops abort on a dtype they do not take). */
extern "C" void cuda_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n) {
    if (n <= 0)
        return;
    if (from == to) {
        cuda_copy(dst, src, (size_t)n * fl_dtype_size(from), FL_COPY_D2D, NULL);
        return;
    }
    if (fl_cuda_convert(to, dst, from, src, n, NULL) != FL_OK)
        cuda_fatal("convert", "the dtype check", fl_errmsg(), __FILE__, __LINE__);
}

template <class S, class F> __global__ void add_low_k(float *dst, const S *src, int64_t n, F f) {
    GRID_STRIDE(i, n) dst[i] = dst[i] + f(src[i]); /* one f32 add (.cu files: --fmad=false) */
}

extern "C" void cuda_add_low_to_f32(fl_dtype low, const void *src, float *dst, int64_t n) {
    if (n <= 0)
        return;
    cuda_require_bound("add_low_to_f32");
    cudaStream_t st = cuda_stream();
    unsigned b = blocks_for(n);
    if (low == FL_DTYPE_F16)
        add_low_k<<<b, THREADS, 0, st>>>(dst, (const __half *)src, n, from_f16());
    else if (low == FL_DTYPE_BF16)
        add_low_k<<<b, THREADS, 0, st>>>(dst, (const __nv_bfloat16 *)src, n, from_bf16());
    else
        cuda_bad_dtype("add_low_to_f32", low);
    CU_LAUNCHED("add_low_to_f32");
}

/* A low convolution plan's filter and weight gradient where cuDNN takes the filter NHWC (conv.c
 * reorders): convert and reorder in one pass each way, the same bits as the two passes (a
 * rounding per element, then a permutation). to_ohwi: dst (n, hw, c) low = src (n, c, hw) f32
 * rounded; from_ohwi: dst (n, c, hw) f32 = src (n, hw, c) low widened, or added to dst (one f32
 * add, as add_low_k). */
template <class D, class F>
__global__ void to_ohwi_k(D *dst, const float *src, int64_t total, int64_t c, int64_t hw, F f) {
    GRID_STRIDE(i, total) { /* dst (img, p, ch) */
        int64_t img = i / (c * hw), r = i % (c * hw), p = r / c, ch = r % c;
        dst[i] = f(src[img * c * hw + ch * hw + p]);
    }
}
template <class S, class F>
__global__ void from_ohwi_k(float *dst, const S *src, int64_t total, int64_t c, int64_t hw,
                            bool add, F f) {
    GRID_STRIDE(i, total) { /* dst (img, ch, p) */
        int64_t img = i / (c * hw), r = i % (c * hw), ch = r / hw, p = r % hw;
        float v = f(src[img * c * hw + p * c + ch]);
        dst[i] = add ? dst[i] + v : v;
    }
}

/* Calls k(S(), to, from) with the storage type S of low (f16 or bf16) and its conversions. */
template <class K> static void with_low(fl_dtype low, const char *op, K k) {
    if (low == FL_DTYPE_F16)
        k(__half(), to_f16(), from_f16());
    else if (low == FL_DTYPE_BF16)
        k(__nv_bfloat16(), to_bf16(), from_bf16());
    else
        cuda_bad_dtype(op, low);
    CU_LAUNCHED(op);
}

extern "C" void cuda_f32_to_low_ohwi(fl_dtype low, const float *src, void *dst, int64_t n,
                                     int64_t c, int64_t hw) {
    int64_t total = n * c * hw;
    if (total > 0)
        with_low(low, "f32_to_low_ohwi", [&](auto s, auto to, auto) {
            to_ohwi_k<<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                (decltype(s) *)dst, src, total, c, hw, to);
        });
}

extern "C" void cuda_low_ohwi_to_f32(fl_dtype low, const void *src, float *dst, int64_t n,
                                     int64_t c, int64_t hw, bool add) {
    int64_t total = n * c * hw;
    if (total > 0)
        with_low(low, "low_ohwi_to_f32", [&](auto s, auto, auto from) {
            from_ohwi_k<<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                dst, (const decltype(s) *)src, total, c, hw, add, from);
        });
}
