/* reduce.cu - the cuda backend's sums: sum and sum of squares of an array (returned to the
 * host), the fc layer's bias gradient (column sums) and the convolution's (per-channel sums),
 * all through reduce.cuh's fixed-split, fixed-order reductions in double. f16 / bf16 inputs are
 * read exactly; the bias gradients beside them are f32. */
#include "reduce.cuh"

template <class T> struct load_f {
    const T *x;
    __device__ double operator()(int64_t i) const { return (double)lo_get(x[i]); }
};
template <class T> struct square_f {
    const T *x;
    __device__ double operator()(int64_t i) const {
        double v = (double)lo_get(x[i]);
        return v * v;
    }
};

extern "C" double cuda_sum(fl_dtype t, const void *x, int64_t n) {
    if (n <= 0)
        return 0;
    DISPATCH_TL("sum", t, return sum_to_host(load_f<T>{(const T *)x}, n, "sum"));
    return 0;
}

extern "C" double cuda_sumsq(fl_dtype t, const void *x, int64_t n) {
    if (n <= 0)
        return 0;
    DISPATCH_TL("sumsq", t, return sum_to_host(square_f<T>{(const T *)x}, n, "sumsq"));
    return 0;
}

/* (r, c) of a row-major (R, C) matrix, or of an (N, C, HW) activation */
template <class T> struct elem_f {
    const T *x;
    bool     nhwc;
    int64_t  C, hw;
    __device__ double2 operator()(int64_t r, int64_t c) const {
        return make_double2((double)lo_get(x[nchw_at(nhwc, r, c, C, hw)]), 0);
    }
};

/* db[c] = [db[c] +] sum, rounded once to acc_t<T> (T itself, or f32 beside low T: a bias's
 * gradient stays f32) */
template <class T> struct store_f {
    acc_t<T> *db;
    bool      accumulate;
    __device__ void operator()(int64_t c, double2 s) const {
        db[c] = (acc_t<T>)((accumulate ? (double)db[c] : 0.0) + s.x);
    }
};

extern "C" void cuda_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                              bool accumulate) {
    if (cols <= 0)
        return;
    rows = rows < 0 ? 0 : rows;
    /* a row-major matrix is NHWC with hw = 1 */
    DISPATCH_TL("sum_rows", t,
                colsum(false, elem_f<T>{(const T *)dy, true, cols, 1},
                       store_f<T>{(acc_t<T> *)db, accumulate}, rows, cols, "sum_rows"));
}

extern "C" void cuda_sum_channels(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                  const void *dy, void *db, bool accumulate) {
    if (c <= 0)
        return;
    bool nhwc = layout == FL_LAYOUT_NHWC;
    DISPATCH_TL("conv dbias", t,
                colsum(!nhwc, elem_f<T>{(const T *)dy, nhwc, c, hw},
                       store_f<T>{(acc_t<T> *)db, accumulate}, n * hw, c, "conv dbias"));
}
