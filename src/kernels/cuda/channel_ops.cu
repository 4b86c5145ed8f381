/* channel_ops.cu - the cuda backend's per-channel operations of the squeeze-and-excitation and
 * concatenation layers (backend.h): y = x * s per image and channel, its backward, and the copy
 * of a run of channels in or out of a wider tensor, in either layout. One thread per element;
 * ds, one thread per (image, channel) summing its pixels in order in double, as the CPU does
 * (SE runs on small late-stage maps, where this is short). f32, f64, and f16 / bf16 (x, s, y,
 * dy, dx, ds all low; products in float, ds's sum in double, each rounded once on store). */
#include "common.cuh"

/* the (image, channel) of element i of an (N, C, HW) tensor */
__device__ __forceinline__ int64_t ic_of(bool nhwc, int64_t i, int64_t c, int64_t hw) {
    return nhwc ? i / (hw * c) * c + i % c : i / hw;
}

template <class T>
__global__ void mul_k(bool nhwc, int64_t total, int64_t c, int64_t hw, const T *x, const T *s,
                      T *y) {
    GRID_STRIDE(i, total) y[i] = lo_put<T>(lo_get(x[i]) * lo_get(s[ic_of(nhwc, i, c, hw)]));
}

template <class T>
__global__ void mul_ds_k(bool nhwc, int64_t nc, int64_t c, int64_t hw, const T *x, const T *dy,
                         T *ds) {
    GRID_STRIDE(j, nc) {
        int64_t img = j / c, ch = j % c;
        double acc = 0;
        for (int64_t p = 0; p < hw; p++) {
            int64_t e = nhwc ? (img * hw + p) * c + ch : j * hw + p;
            acc += (double)lo_get(dy[e]) * (double)lo_get(x[e]);
        }
        ds[j] = lo_put_d<T>(acc);
    }
}

extern "C" void cuda_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                         int64_t hw, const void *x, const void *s, void *y) {
    int64_t total = n * c * hw;
    if (total <= 0)
        return;
    DISPATCH_TL("channel_mul_forward", t,
               mul_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   layout == FL_LAYOUT_NHWC, total, c, hw, (const T *)x, (const T *)s, (T *)y));
    CU_LAUNCHED("channel_mul_forward");
}

extern "C" void cuda_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                          int64_t hw, const void *x, const void *s,
                                          const void *dy, void *dx, void *ds) {
    int64_t total = n * c * hw;
    if (total <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    if (ds) /* before dx: dx may alias dy */
        DISPATCH_TL("channel_mul_backward", t,
                   mul_ds_k<T><<<blocks_for(n * c), THREADS, 0, cuda_stream()>>>(
                       nhwc, n * c, c, hw, (const T *)x, (const T *)dy, (T *)ds));
    if (dx)
        DISPATCH_TL("channel_mul_backward", t,
                   mul_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                       nhwc, total, c, hw, (const T *)dy, (const T *)s, (T *)dx));
    CU_LAUNCHED("channel_mul_backward");
}

/* one thread per element of x: its place in y */
template <class T>
__global__ void slice_k(bool nhwc, bool forward, int64_t total, int64_t hw, int64_t c, T *x,
                        int64_t oc, int64_t off, T *y) {
    GRID_STRIDE(i, total) {
        int64_t e;
        if (nhwc)
            e = i / c * oc + off + i % c;
        else
            e = (i / (c * hw) * oc + off) * hw + i % (c * hw);
        if (forward)
            y[e] = x[i];
        else
            x[i] = y[e];
    }
}

extern "C" void cuda_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw,
                                   int64_t c, void *x, int64_t oc, int64_t off, void *y,
                                   bool forward) {
    int64_t total = n * c * hw;
    if (total <= 0)
        return;
    DISPATCH_TL("channel_slice", t,
               slice_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   layout == FL_LAYOUT_NHWC, forward, total, hw, c, (T *)x, oc, off, (T *)y));
    CU_LAUNCHED("channel_slice");
}
