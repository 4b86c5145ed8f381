/* elementwise.cu - the cuda backend's one-pass kernels: fill, the NCHW <-> NHWC reorder, bias,
 * activations (hardswish and hardsigmoid included), axpy and scale, the SGD and Momentum updates over a flat block in one launch,
 * the residual add, dropout's Philox mask (bit-identical to the CPU's), the option-A shortcut
 * and the convolution's per-channel bias. Grid-stride loops; arithmetic as the CPU table's
 * (same float operations, no FMA contraction: --fmad=false), so the updates give its bits.
 * The ops over activations also take f16 / bf16 (DISPATCH_TL: stored low, computed in float,
 * rounded once on store; biases f32); the optimizer updates stay f32 / f64. */
#include "common.cuh"

#include <math.h>

/* --- fill, reorder --- */

template <class T> __global__ void fill_k(T *x, int64_t n, acc_t<T> v) {
    T s = lo_put<T>(v);
    GRID_STRIDE(i, n) x[i] = s;
}

extern "C" void cuda_fill(fl_dtype t, void *x, int64_t n, double v) {
    if (n <= 0)
        return;
    DISPATCH_TL("fill", t,
                fill_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>((T *)x, n, (acc_t<T>)v));
    CU_LAUNCHED("fill");
}

/* one thread per destination element */
template <class T>
__global__ void reorder_k(bool to_nhwc, int64_t total, int64_t c, int64_t hw, const T *src,
                          T *dst) {
    GRID_STRIDE(i, total) {
        int64_t img = i / (c * hw), r = i % (c * hw);
        int64_t ch, p;
        if (to_nhwc) /* dst (p, ch) */
            p = r / c, ch = r % c;
        else /* dst (ch, p) */
            ch = r / hw, p = r % hw;
        int64_t s = to_nhwc ? ch * hw + p : p * c + ch;
        dst[i] = src[img * c * hw + s];
    }
}

extern "C" void cuda_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                             const void *src, void *dst) {
    int64_t total = n * c * hw;
    if (total <= 0)
        return;
    DISPATCH_TL("reorder", t,
               reorder_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                   to_nhwc, total, c, hw, (const T *)src, (T *)dst));
    CU_LAUNCHED("reorder");
}

/* --- bias --- */

/* low T: the bias f32 (acc_t) */
template <class T>
__global__ void add_bias_k(T *y, const acc_t<T> *b, int64_t total, int64_t cols) {
    GRID_STRIDE(i, total) y[i] = lo_put<T>(lo_get(y[i]) + b[i % cols]);
}

extern "C" void cuda_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    int64_t total = rows * cols;
    if (total <= 0)
        return;
    DISPATCH_TL("add_bias", t,
                add_bias_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                    (T *)y, (const acc_t<T> *)bias, total, cols));
    CU_LAUNCHED("add_bias");
}

template <class T>
__global__ void add_channel_bias_k(bool nhwc, T *y, const acc_t<T> *b, int64_t total, int64_t c,
                                   int64_t hw) {
    GRID_STRIDE(i, total) y[i] = lo_put<T>(lo_get(y[i]) + b[nhwc ? i % c : (i / hw) % c]);
}

extern "C" void cuda_add_channel_bias(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                      int64_t hw, void *y, const void *bias) {
    int64_t total = n * c * hw;
    if (total <= 0)
        return;
    DISPATCH_TL("conv bias", t,
                add_channel_bias_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                    layout == FL_LAYOUT_NHWC, (T *)y, (const acc_t<T> *)bias, total, c, hw));
    CU_LAUNCHED("conv bias");
}

/* --- activations --- */

__device__ __forceinline__ float act_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double act_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float act_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double act_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/* MobileNetV3's hardsigmoid (arXiv:1905.02244), written as the CPU table's; hardswish is
 * common.cuh's */
template <class T> __device__ __forceinline__ T act_hardsigmoid(T x) {
    T v = x + (T)3;
    return (v < (T)0 ? (T)0 : v > (T)6 ? (T)6 : v) / (T)6;
}

template <class T> __global__ void act_fwd_k(fl_act a, const T *x, T *y, int64_t n) {
    typedef acc_t<T> A;
    GRID_STRIDE(i, n) {
        A v = lo_get(x[i]);
        switch (a) {
        case FL_ACT_RELU: v = v < (A)0 ? (A)0 : v; break;
        case FL_ACT_TANH: v = act_tanh(v); break;
        case FL_ACT_SIGMOID: v = act_sigmoid(v); break;
        case FL_ACT_HARDSWISH: v = act_hardswish(v); break;
        case FL_ACT_HARDSIGMOID: v = act_hardsigmoid(v); break;
        default: break;
        }
        y[i] = lo_put<T>(v);
    }
}

template <class T>
__global__ void act_bwd_k(fl_act a, const T *x, const T *y, const T *dy, T *dx, int64_t n) {
    typedef acc_t<T> A;
    GRID_STRIDE(i, n) {
        A d = lo_get(dy[i]), xi, yi;
        switch (a) {
        case FL_ACT_RELU: d = lo_get(x[i]) > (A)0 ? d : (A)0; break;
        case FL_ACT_TANH: yi = lo_get(y[i]), d = d * ((A)1 - yi * yi); break;
        case FL_ACT_SIGMOID: yi = lo_get(y[i]), d = d * yi * ((A)1 - yi); break;
        case FL_ACT_HARDSWISH: d = d * act_hardswish_grad(lo_get(x[i])); break;
        case FL_ACT_HARDSIGMOID:
            xi = lo_get(x[i]);
            d = xi > (A)-3 && xi < (A)3 ? d * ((A)1 / (A)6) : (A)0;
            break;
        default: break;
        }
        dx[i] = lo_put<T>(d);
    }
}

static void check_act(const char *op, fl_act a) {
    if ((unsigned)a >= FL_ACT_COUNT)
        cuda_fatal(op, "the activation check", "unknown activation", __FILE__, __LINE__);
}

extern "C" void cuda_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n) {
    check_act("act_forward", act);
    if (n <= 0 || (act == FL_ACT_NONE && x == y))
        return;
    DISPATCH_TL("act_forward", t,
               act_fwd_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>(act, (const T *)x,
                                                                          (T *)y, n));
    CU_LAUNCHED("act_forward");
}

extern "C" void cuda_act_backward(fl_dtype t, fl_act act, const void *x, const void *y,
                                  const void *dy, void *dx, int64_t n) {
    check_act("act_backward", act);
    if (n <= 0 || (act == FL_ACT_NONE && dx == dy))
        return;
    DISPATCH_TL("act_backward", t,
               act_bwd_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>(
                   act, (const T *)x, (const T *)y, (const T *)dy, (T *)dx, n));
    CU_LAUNCHED("act_backward");
}

/* --- axpy, scale, optimizer updates (scalars rounded to T first, as the CPU table does) --- */

/* The elementwise kernels below take 4 elements a thread where every array is 16-byte aligned
 * (VEC): quads q < n / 4, then the n % 4 left one by one; the same values either way. */

template <class T, bool VEC>
__global__ void axpy_k(int64_t n, acc_t<T> a, const T *x, T *y) {
    int64_t done = 0;
    if (VEC) {
        GRID_STRIDE(q, n / 4) {
            T xv[4], yv[4];
            load4(x + 4 * q, xv), load4(y + 4 * q, yv);
            for (int j = 0; j < 4; j++)
                yv[j] = lo_put<T>(lo_get(yv[j]) + a * lo_get(xv[j]));
            store4(y + 4 * q, yv);
        }
        done = n / 4 * 4;
    }
    GRID_STRIDE(i, n - done) y[done + i] = lo_put<T>(lo_get(y[done + i]) + a * lo_get(x[done + i]));
}
template <class T> __global__ void scale_k(int64_t n, acc_t<T> a, T *x) {
    GRID_STRIDE(i, n) x[i] = lo_put<T>(lo_get(x[i]) * a);
}

extern "C" void cuda_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    if (n <= 0)
        return;
    bool vec = all_aligned16(x, y);
    DISPATCH_TL("axpy", t, DISPATCH_BOOL(V, vec, {
                    axpy_k<T, V><<<blocks_for_vec(n, V), THREADS, 0, cuda_stream()>>>(
                        n, (acc_t<T>)a, (const T *)x, (T *)y);
                }));
    CU_LAUNCHED("axpy");
}

extern "C" void cuda_scale(fl_dtype t, int64_t n, double a, void *x) {
    if (n <= 0)
        return;
    DISPATCH_TL("scale", t,
                scale_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>(n, (acc_t<T>)a, (T *)x));
    CU_LAUNCHED("scale");
}

/* amp_round: the cpu table's bit manipulations (src/kernels/cpu/elementwise.c), so that the
 * emulation of mixed precision gives the CPU's bits: nearest f16 / bf16 value, ties to even,
 * f16's overflow to inf and its subnormals (the add of 0.5 rounds to 2^-24 steps; nvcc's
 * default keeps subnormals), inf and NaN as they are. */
__device__ static float amp_round_f16(float x) {
    uint32_t u = __float_as_uint(x), a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return x;
    if (a < 0x38800000u) {
        float t = __fadd_rn(fabsf(x), 0.5f);
        return copysignf(__fsub_rn(t, 0.5f), x);
    }
    a += 0x0fffu + ((a >> 13) & 1u);
    a &= ~0x1fffu;
    if (a > 0x477fe000u)
        a = 0x7f800000u;
    return __uint_as_float((u & 0x80000000u) | a);
}
__device__ static float amp_round_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}
__global__ void amp_round_k(int64_t n, float *x, bool f16) {
    GRID_STRIDE(i, n) x[i] = f16 ? amp_round_f16(x[i]) : amp_round_bf16(x[i]);
}

extern "C" void cuda_amp_round(fl_dtype low, int64_t n, float *x) {
    if (low != FL_DTYPE_F16 && low != FL_DTYPE_BF16)
        cuda_fatal("amp_round", "the dtype check", "low is neither f16 nor bf16", __FILE__,
                   __LINE__);
    if (n <= 0)
        return;
    amp_round_k<<<blocks_for(n), THREADS, 0, cuda_stream()>>>(n, x, low == FL_DTYPE_F16);
    CU_LAUNCHED("amp_round");
}

template <class T> __global__ void sgd_k(int64_t n, T *w, const T *g, T lr, T wd) {
    GRID_STRIDE(i, n) w[i] -= lr * (g[i] + wd * w[i]);
}

template <class T>
__global__ void momentum_k(int64_t n, T *w, const T *g, T *v, T lr, T mu, T wd, bool nesterov) {
    GRID_STRIDE(i, n) {
        T d = g[i] + wd * w[i];
        T vi = mu * v[i] + d;
        v[i] = vi;
        w[i] -= lr * (nesterov ? d + mu * vi : vi);
    }
}

extern "C" void cuda_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr,
                                double wd) {
    if (n <= 0)
        return;
    DISPATCH_T("sgd_update", t,
               sgd_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>(n, (T *)w, (const T *)g,
                                                                      (T)lr, (T)wd));
    CU_LAUNCHED("sgd_update");
}

extern "C" void cuda_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v,
                                     double lr, double mu, double wd, bool nesterov) {
    if (n <= 0)
        return;
    DISPATCH_T("momentum_update", t,
               momentum_k<T><<<blocks_for(n), THREADS, 0, cuda_stream()>>>(
                   n, (T *)w, (const T *)g, (T *)v, (T)lr, (T)mu, (T)wd, nesterov));
    CU_LAUNCHED("momentum_update");
}

/* --- the residual add --- */

/* a + b, then max(0, .) when relu, in acc_t and rounded once to T */
template <class T> __device__ __forceinline__ T add_relu(T a, T b, bool relu) {
    typedef acc_t<T> A;
    A v = lo_get(a) + lo_get(b);
    return lo_put<T>(relu ? (v > (A)0 ? v : (A)0) : v);
}

template <class T, bool VEC>
__global__ void add_fwd_k(const T *a, const T *b, T *y, int64_t n, bool relu) {
    int64_t done = 0;
    if (VEC) {
        GRID_STRIDE(q, n / 4) {
            T av[4], bv[4];
            load4(a + 4 * q, av), load4(b + 4 * q, bv);
            for (int j = 0; j < 4; j++)
                av[j] = add_relu(av[j], bv[j], relu);
            store4(y + 4 * q, av);
        }
        done = n / 4 * 4;
    }
    GRID_STRIDE(i, n - done) y[done + i] = add_relu(a[done + i], b[done + i], relu);
}

template <class T, bool VEC>
__global__ void add_bwd_k(const T *y, const T *dy, T *da, T *db, int64_t n, bool relu) {
    int64_t done = 0;
    if (VEC) {
        GRID_STRIDE(q, n / 4) {
            T v[4], yv[4];
            load4(dy + 4 * q, v);
            if (relu) {
                load4(y + 4 * q, yv);
                for (int j = 0; j < 4; j++)
                    v[j] = relu_keep(yv[j], v[j]);
            }
            if (da)
                store4(da + 4 * q, v);
            if (db)
                store4(db + 4 * q, v);
        }
        done = n / 4 * 4;
    }
    GRID_STRIDE(k, n - done) {
        int64_t i = done + k;
        T v = relu ? relu_keep(y[i], dy[i]) : dy[i];
        if (da)
            da[i] = v;
        if (db)
            db[i] = v;
    }
}

extern "C" void cuda_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                                 bool relu) {
    if (n <= 0)
        return;
    bool vec = all_aligned16(a, b, y);
    DISPATCH_TL("add_forward", t, DISPATCH_BOOL(V, vec, {
                    add_fwd_k<T, V><<<blocks_for_vec(n, V), THREADS, 0, cuda_stream()>>>(
                        (const T *)a, (const T *)b, (T *)y, n, relu);
                }));
    CU_LAUNCHED("add_forward");
}

extern "C" void cuda_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                                  int64_t n, bool relu) {
    if (n <= 0 || (!da && !db))
        return;
    bool vec = all_aligned16(dy, relu ? y : NULL, da, db);
    DISPATCH_TL("add_backward", t, DISPATCH_BOOL(V, vec, {
                    add_bwd_k<T, V><<<blocks_for_vec(n, V), THREADS, 0, cuda_stream()>>>(
                        (const T *)y, (const T *)dy, (T *)da, (T *)db, n, relu);
                }));
    CU_LAUNCHED("add_backward");
}

/* --- dropout: Philox4x32-10 (Salmon et al. SC 2011) as src/core/rng.c computes it --- */

__device__ __forceinline__ void philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                           uint32_t k0, uint32_t k1, uint32_t out[4]) {
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* one thread per block of 4 elements: element i kept when word i % 4 of the block at counter
 * (i / 4, step), key seed, is >= thresh */
template <class T>
__global__ void dropout_k(uint32_t k0, uint32_t k1, uint64_t step, uint32_t thresh,
                          acc_t<T> scale, const T *in, T *out, int64_t n) {
    int64_t quads = (n + 3) / 4;
    GRID_STRIDE(q, quads) {
        uint32_t r[4];
        philox4x32((uint32_t)q, (uint32_t)((uint64_t)q >> 32), (uint32_t)step,
                   (uint32_t)(step >> 32), k0, k1, r);
        for (int j = 0; j < 4 && 4 * q + j < n; j++) {
            int64_t i = 4 * q + j;
            out[i] = lo_put<T>(r[j] >= thresh ? lo_get(in[i]) * scale : (acc_t<T>)0);
        }
    }
}

extern "C" void cuda_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p,
                                  const void *in, void *out, int64_t n) {
    if (n <= 0)
        return;
    uint32_t thresh = (uint32_t)(uint64_t)(p * 4294967296.0); /* the CPU's conversion */
    DISPATCH_TL("dropout_mask", t,
                dropout_k<T><<<blocks_for((n + 3) / 4), THREADS, 0, cuda_stream()>>>(
                    (uint32_t)seed, (uint32_t)(seed >> 32), step, thresh,
                    (acc_t<T>)(1.0 / (1.0 - p)), (const T *)in, (T *)out, n));
    CU_LAUNCHED("dropout_mask");
}

/* --- the option-A shortcut: every output element written once (zeros included) --- */

template <class T>
__global__ void pad_fwd_k(bool nhwc, int64_t total, int64_t c, int64_t h, int64_t w,
                          int64_t stride, int64_t oc, int64_t oh, int64_t ow, const T *x, T *y) {
    int64_t off = (oc - c) / 2;
    GRID_STRIDE(i, total) {
        coord4<int64_t> k = coord_of(nhwc, i, oc, oh, ow);
        int64_t ch = k.c - off;
        y[i] = ch >= 0 && ch < c ? x[index_of(nhwc, k.n, ch, k.y * stride, k.x * stride, c, h, w)]
                                 : lo_put<T>(0);
    }
}

template <class T>
__global__ void pad_bwd_k(bool nhwc, int64_t total, int64_t c, int64_t h, int64_t w,
                          int64_t stride, int64_t oc, int64_t oh, int64_t ow, T *x, const T *y) {
    int64_t off = (oc - c) / 2;
    GRID_STRIDE(i, total) {
        coord4<int64_t> k = coord_of(nhwc, i, c, h, w);
        bool hit = k.y % stride == 0 && k.x % stride == 0;
        x[i] = hit ? y[index_of(nhwc, k.n, k.c + off, k.y / stride, k.x / stride, oc, oh, ow)]
                   : lo_put<T>(0);
    }
}

extern "C" void cuda_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h,
                                 int64_t w, int64_t stride, int64_t oc, void *x, void *y,
                                 bool forward) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    int64_t total = forward ? n * oc * oh * ow : n * c * h * w;
    if (total <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    if (forward)
        DISPATCH_TL("channel_pad", t,
                    pad_fwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                        nhwc, total, c, h, w, stride, oc, oh, ow, (const T *)x, (T *)y));
    else
        DISPATCH_TL("channel_pad", t,
                    pad_bwd_k<T><<<blocks_for(total), THREADS, 0, cuda_stream()>>>(
                        nhwc, total, c, h, w, stride, oc, oh, ow, (T *)x, (const T *)y));
    CU_LAUNCHED("channel_pad");
}
