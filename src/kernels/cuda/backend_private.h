/* backend_private.h - private to the cuda backend: the one device context (context.c: stream,
 * cuBLAS and cuDNN handles, made by cuda.c's device_bind), the checks that turn a failed CUDA,
 * cuBLAS or cuDNN call into a fatal error naming the call and the op, the allocator's internal
 * scratch, and the per-file entry points that cuda.c gathers into fl_backend_cuda(). C and C++
 * (nvcc) both include it. Named for the backend, not for one file: every file here shares it. */
#ifndef FLEET_KERNELS_CUDA_BACKEND_PRIVATE_H
#define FLEET_KERNELS_CUDA_BACKEND_PRIVATE_H

#include "fleet/backend.h"
#include "fleet/status.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The process's device, bound once (device_bind). Every op runs in `stream`, which cuBLAS and
 * cuDNN are set to; NULL fl_stream means this stream. */
typedef struct cuda_ctx {
    bool                  bound;
    int                   device;
    cudaStream_t          stream;
    struct cublasContext *blas; /* cublasHandle_t */
    struct cudnnContext  *dnn;  /* cudnnHandle_t */
    bool                  tf32; /* FLEET_CUDA_TF32=1: TF32 tensor cores for f32 gemm and conv */
    bool                  find; /* FLEET_CUDNN_BENCHMARK=1: conv algorithms by timing them */
    bool                  det;  /* deterministic backward algorithms only (set_deterministic;
                                 * FLEET_CUDNN_DETERMINISTIC=0 clears it at bind) */
} cuda_ctx;
extern cuda_ctx cuda_g;

/* Prints "fleet: cuda backend: OP: CALL failed: WHAT (file:line)" and aborts: a device error
 * inside an op that returns nothing (docs/backends.md, "cuda"). */
void cuda_fatal(const char *op, const char *call, const char *what, const char *file, int line)
    __attribute__((noreturn));
#define CU_CHECK(op, call)                                                                   \
    do {                                                                                     \
        cudaError_t cu_e_ = (call);                                                          \
        if (cu_e_ != cudaSuccess)                                                            \
            cuda_fatal((op), #call, cudaGetErrorString(cu_e_), __FILE__, __LINE__);          \
    } while (0)
/* after a kernel launch: a bad configuration shows here, a fault at the next sync */
#define CU_LAUNCHED(op) CU_CHECK(op, cudaGetLastError())
/* the ops that run before device_bind abort naming it */
void cuda_require_bound(const char *op);
/* aborts naming the op: t is not a dtype it takes (f32 or f64; f16 or bf16 for the low ops) */
void cuda_bad_dtype(const char *op, fl_dtype t) __attribute__((noreturn));
/* The CUDA runtime's current device is per host thread: every op first makes the bound device
 * current on the calling thread (once per thread), so threads other than the one that called
 * device_bind (a comm thread staging buckets) run on the same device. */
extern __thread int cuda_tl_device;
void cuda_enter(void);
static inline void cuda_here(void) {
    if (cuda_tl_device != cuda_g.device)
        cuda_enter();
}
/* The backend's stream, and the one an fl_stream stands for (NULL: the backend's). */
static inline cudaStream_t cuda_stream(void) {
    cuda_here();
    return cuda_g.stream;
}
static inline cudaStream_t cuda_stream_of(fl_stream *s) {
    cuda_here();
    return s ? (cudaStream_t)s : cuda_g.stream;
}
/* Waits for the backend's stream (the ops that return a value to the host). */
void cuda_sync(const char *op);

/* alloc.c: the caching allocator behind alloc / free, and scratch for the ops themselves
 * (not zeroed, no sync; aborts when the device is out of memory; returned with cuda_put,
 * reusable by work queued later in the backend's stream). */
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void cuda_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s);
size_t cuda_memory_peak(void);
/* page-locked host memory for staging (host_alloc / host_free) */
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *p);
void *cuda_get(size_t bytes, const char *op);
void cuda_put(void *p);

/* elementwise.cu */
void cuda_fill(fl_dtype t, void *x, int64_t n, double v);
void cuda_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw, const void *src,
                  void *dst);
void cuda_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols);
void cuda_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n);
void cuda_act_backward(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                       void *dx, int64_t n);
void cuda_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y);
void cuda_scale(fl_dtype t, int64_t n, double a, void *x);
void cuda_amp_round(fl_dtype low, int64_t n, float *x);
void cuda_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd);
void cuda_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                          double mu, double wd, bool nesterov);
void cuda_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n, bool relu);
void cuda_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db, int64_t n,
                       bool relu);
void cuda_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                       void *out, int64_t n);
void cuda_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t stride, int64_t oc, void *x, void *y, bool forward);
/* y (N, C, HW) in layout += bias (C) per channel (the convolution's bias) */
void cuda_add_channel_bias(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                           void *y, const void *bias);

/* convert.cu: the table's convert (f32 <-> f16 / bf16, equal dtypes copied); and dst (n f32)
 * += src (n elements of low, f16 or bf16) converted exactly, one f32 add per element, in the
 * backend's stream (a low convolution's weight gradient accumulated into its f32 dw) */
void cuda_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n);
void cuda_add_low_to_f32(fl_dtype low, const void *src, float *dst, int64_t n);
/* convert and reorder in one pass: (n, c, hw) f32 -> (n, hw, c) low, and back into f32 (set or
 * add); a low convolution plan's NHWC filter and its weight gradient */
void cuda_f32_to_low_ohwi(fl_dtype low, const float *src, void *dst, int64_t n, int64_t c,
                          int64_t hw);
void cuda_low_ohwi_to_f32(fl_dtype low, const void *src, float *dst, int64_t n, int64_t c,
                          int64_t hw, bool add);

/* channel_ops.cu: squeeze-and-excitation's channel-wise scale and concatenation's copies */
void cuda_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                              const void *x, const void *s, void *y);
void cuda_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                               const void *x, const void *s, const void *dy, void *dx,
                               void *ds);
void cuda_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c, void *x,
                        int64_t oc, int64_t off, void *y, bool forward);

/* reduce.cu: deterministic sums (fixed splits, fixed order, in double) */
double cuda_sum(fl_dtype t, const void *x, int64_t n);
double cuda_sumsq(fl_dtype t, const void *x, int64_t n);
void cuda_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                   bool accumulate);
/* db (C) = [db +] the sum of dy (N, C, HW) in layout over N and HW (the convolution's dbias) */
void cuda_sum_channels(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                       const void *dy, void *db, bool accumulate);

/* softmax.cu */
double cuda_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                 void *probs, int64_t rows, int64_t classes);
void cuda_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                                void *dlogits, int64_t rows, int64_t classes, double scale);
double cuda_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows, int64_t classes);
void cuda_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits, int64_t rows,
                               int64_t classes, double on, double all);

/* gemm.c */
void cuda_gemm(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
               void *c, int64_t ldc);

/* conv.c */
fl_conv_plan *cuda_conv_plan_create(const fl_conv_desc *d);
void cuda_conv_plan_free(fl_conv_plan *p);
size_t cuda_conv_scratch_bytes(const fl_conv_plan *p);
void cuda_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                       const void *bias, void *y, void *scratch);
void cuda_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                             void *dx, void *scratch);
void cuda_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                               void *dw, void *dbias, bool accumulate, void *scratch);

/* pool.cu */
void cuda_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                       const fl_conv_geom *g, const void *x, void *y);
void cuda_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                        const fl_conv_geom *g, const void *x, const void *dy, void *dx);

/* bn.cu */
void cuda_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                     const void *x, const void *gamma, const void *beta, double eps,
                     bool training, double *mean, double *var, fl_act act, void *y);
void cuda_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                      const void *x, fl_act act, const void *y, const void *dy,
                      const void *gamma, const void *beta, const double *mean, const double *var,
                      double eps, bool training, void *dx, void *dgamma, void *dbeta,
                      bool accumulate);
void cuda_bn_running(fl_dtype t, int64_t c, const double *mean, const double *var, double count,
                     double momentum, void *running_mean, void *running_var);

/* lars.cu */
void cuda_lars_update_run(fl_dtype t, int nt, const int64_t *numel, const double *d, void *w,
                          const void *g, void *v, double lr, double mu, double wd, double coeff,
                          double eps);

/* dgc.cu */
void cuda_dgc_accumulate(int64_t n, const float *grad, const float *w, float *u, float *v,
                         const fl_dgc_accum_args *a);
int64_t cuda_dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx,
                              float *scratch);
int64_t cuda_dgc_accumulate_select(int64_t n, const float *grad, const float *w, float *u,
                                   float *v, const fl_dgc_accum_args *a, int64_t k, int32_t *idx,
                                   float *scratch, uint64_t seed, float *hint, int *passes);
void cuda_dgc_accumulate_select_batch(int nt, const fl_dgc_batch_item *items,
                                      const fl_dgc_accum_args *a, bool mask_u, int64_t *count,
                                      int32_t *idx, float *scratch);
void cuda_dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                     fl_dgc_pair *pairs);
int64_t cuda_dgc_scatter_add(const fl_dgc_pair *pairs, int64_t n, int nseg,
                             const int64_t *start, float *const *dst);
void cuda_dgc_apply_pairs(const fl_dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                          float *const *w, double step);
void cuda_dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr, double inv_n,
                          double m, bool nesterov, double decay);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_KERNELS_CUDA_BACKEND_PRIVATE_H */
