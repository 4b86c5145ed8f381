/* backend_private.h - private to the CPU kernels (the cpu and ref tables): the per-file entry
 * points that cpu.c and ref.c gather into their tables, the dtype dispatch, and the loop macros
 * that decide between a plain vectorised loop and an OpenMP one (a parallel region costs
 * microseconds; small loops skip it). Named for the backend, not for one file. */
#ifndef FLEET_KERNELS_CPU_BACKEND_PRIVATE_H
#define FLEET_KERNELS_CPU_BACKEND_PRIVATE_H

#include "fleet/backend.h"
#include "fleet/status.h"
#include "dgc_kernels.h"

#include <stdbool.h>
#include <stdint.h>

/* Below this many elements a loop runs on the calling thread only. */
#define PAR_MIN 32768
/* Reductions sum chunks of CHUNK elements into one double each and add the chunk sums in
 * order, so the result does not depend on how chunks are spread over threads. */
#define CHUNK 4096

/* Calls fn_f32(...) or fn_f64(...) according to dtype t; other dtypes are programming errors. */
#define DISPATCH(t, fn, ...)                                         \
    do {                                                             \
        if ((t) == FL_DTYPE_F32)                                     \
            fn##_f32(__VA_ARGS__);                                   \
        else if ((t) == FL_DTYPE_F64)                                \
            fn##_f64(__VA_ARGS__);                                   \
        else                                                         \
            FL_ASSERT(!"kernel dtype must be f32 or f64");           \
    } while (0)

/* Same, for kernels that return a double. */
#define DISPATCH_RET(t, fn, ...)                                     \
    do {                                                             \
        if ((t) == FL_DTYPE_F32)                                     \
            return fn##_f32(__VA_ARGS__);                            \
        if ((t) == FL_DTYPE_F64)                                     \
            return fn##_f64(__VA_ARGS__);                            \
        FL_ASSERT(!"kernel dtype must be f32 or f64");               \
        return 0;                                                    \
    } while (0)

/* for (int64_t i = 0; i < n; i++) body; vectorised, and split over threads when n >= PAR_MIN.
 * The body must touch element i only (it may read and write the same array). */
#define ELEMENTWISE(n, i, ...)                                              \
    do {                                                                    \
        int64_t n_ = (n);                                                   \
        if (n_ < PAR_MIN) {                                                 \
            _Pragma("omp simd") for (int64_t i = 0; i < n_; i++) {          \
                __VA_ARGS__;                                                \
            }                                                               \
        } else {                                                            \
            _Pragma("omp parallel for simd schedule(static)")               \
            for (int64_t i = 0; i < n_; i++) {                              \
                __VA_ARGS__;                                                \
            }                                                               \
        }                                                                   \
    } while (0)

/* gemm.c */
void cpu_gemm(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              double alpha, const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
              void *c, int64_t ldc);

/* elementwise.c */
void cpu_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols);
void cpu_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                  bool accumulate);
void cpu_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y);
void cpu_scale(fl_dtype t, int64_t n, double a, void *x);
void cpu_amp_round(fl_dtype low, int64_t n, float *x);
void cpu_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd);
void cpu_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                         double mu, double wd, bool nesterov);

/* act_kernels.c */
void cpu_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n);
void cpu_act_backward(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                      void *dx, int64_t n);

/* reduce.c */
double cpu_sum(fl_dtype t, const void *x, int64_t n);
double cpu_sumsq(fl_dtype t, const void *x, int64_t n);

/* softmax.c */
double cpu_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                void *probs, int64_t rows, int64_t classes);
void cpu_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                               void *dlogits, int64_t rows, int64_t classes, double scale);

/* im2col.c, pool.c, batch_norm.c (shared by the cpu and ref tables) */
void cpu_im2col(fl_dtype t, const fl_conv_geom *g, const void *x, void *col, int64_t ldc);
void cpu_col2im(fl_dtype t, const fl_conv_geom *g, const void *col, int64_t ldc, void *x);
void cpu_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                      const fl_conv_geom *g, const void *x, void *y);
void cpu_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                       const fl_conv_geom *g, const void *x, const void *dy, void *dx);
void cpu_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                    const void *x, const void *gamma, const void *beta, double eps,
                    bool training, double *mean, double *var, fl_act act, void *y);
void cpu_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                     const void *x, fl_act act, const void *y, const void *dy,
                     const void *gamma, const void *beta, const double *mean, const double *var,
                     double eps, bool training, void *dx, void *dgamma, void *dbeta,
                     bool accumulate);
void cpu_bn_running(fl_dtype t, int64_t c, const double *mean, const double *var, double count,
                    double momentum, void *running_mean, void *running_var);

/* conv.c: the im2col convolution, running on the gemm / axpy / sum of be (the cpu or ref
 * table) and on cpu_im2col / cpu_col2im, its private steps; direct_depthwise: depthwise
 * convolutions (groups = IC = OC) run conv_depthwise.c's direct loops instead (the cpu table
 * asks for them, the ref table does not). Returns NULL with fl_fail set on a bad descriptor. */
fl_conv_plan *cpu_conv_plan_create_with(const fl_backend *be, const fl_conv_desc *d,
                                        bool direct_depthwise);
void cpu_conv_plan_free(fl_conv_plan *p);
/* A plan that only holds d, which the caller has checked (no scratch: cpu_conv_scratch_bytes
 * gives 0; cpu_conv_forward and the backwards must not be called on it): the ref table's f16 /
 * bf16 convolutions, which ref_lowp.c runs from the descriptor. NULL on out of memory. */
fl_conv_plan *cpu_conv_plan_hold(const fl_conv_desc *d);
/* The descriptor a plan was made for. */
const fl_conv_desc *cpu_conv_plan_desc(const fl_conv_plan *p);
size_t cpu_conv_scratch_bytes(const fl_conv_plan *p);
void cpu_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                      const void *bias, void *y, void *scratch);
void cpu_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                            void *dx, void *scratch);
void cpu_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                              void *dw, void *dbias, bool accumulate, void *scratch);

/* conv_depthwise.c: the cpu table's depthwise convolution (groups = IC = OC), direct loops;
 * x (N, C, H, W), w (C, 1, KH, KW), bias (C) or NULL, y (N, C, OH, OW); dW overwritten or added
 * to (accumulate) */
void cpu_conv_dw_forward(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *x,
                         const void *w, const void *bias, void *y);
void cpu_conv_dw_backward_data(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *dy,
                               const void *w, void *dx);
void cpu_conv_dw_backward_filter(fl_dtype t, const fl_conv_geom *g, int64_t n, const void *x,
                                 const void *dy, void *dw, bool accumulate);

/* layer_ops.c: the residual add, dropout's mask, option-A padding, label smoothing */
void cpu_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n, bool relu);
void cpu_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db, int64_t n,
                      bool relu);
void cpu_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                      void *out, int64_t n);
void cpu_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h, int64_t w,
                     int64_t stride, int64_t oc, void *x, void *y, bool forward);
double cpu_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows, int64_t classes);
void cpu_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits, int64_t rows,
                              int64_t classes, double on, double all);

/* channel_ops.c: squeeze-and-excitation's channel-wise scale and concatenation's copies */
void cpu_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                             const void *x, const void *s, void *y);
void cpu_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                              const void *x, const void *s, const void *dy, void *dx, void *ds);
void cpu_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c, void *x,
                       int64_t oc, int64_t off, void *y, bool forward);

/* memory.c: host memory, copies, the NCHW <-> NHWC reorder, stream and event tokens */
void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
void cpu_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s);
void cpu_fill(fl_dtype t, void *x, int64_t n, double v);
void cpu_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw, const void *src,
                 void *dst);
fl_stream *cpu_stream_create(void);
void cpu_stream_free(fl_stream *s);
void cpu_stream_sync(fl_stream *s);
fl_event *cpu_event_create(void);
void cpu_event_free(fl_event *e);
void cpu_event_record(fl_event *e, fl_stream *s);
void cpu_event_wait(fl_stream *s, fl_event *e);
void cpu_event_sync(fl_event *e);

/* NCHW, the only layout of the cpu and ref tables' convolution */
fl_layout cpu_nchw_only(fl_dtype t);

/* The fields the cpu and ref tables share: NCHW, host memory, token streams, label
 * smoothing, DGC's kernels. (fill, reorder and the small layers' loops are each table's own:
 * the ref table's also take f16 / bf16, ref_lowp.h.) */
#define CPU_BACKEND_SHARED                                                                    \
    .preferred_layout = cpu_nchw_only, .host_memory = true, .alloc = cpu_alloc,               \
    .free = cpu_free, .copy = cpu_copy,                                                       \
    .stream_create = cpu_stream_create, .stream_free = cpu_stream_free,                       \
    .stream_sync = cpu_stream_sync, .event_create = cpu_event_create,                         \
    .event_free = cpu_event_free, .event_record = cpu_event_record,                           \
    .event_wait = cpu_event_wait, .event_sync = cpu_event_sync,                               \
    .xent_smooth_term = cpu_xent_smooth_term,                                                 \
    .xent_smooth_backward = cpu_xent_smooth_backward, .dgc_accumulate = dgc_accumulate,       \
    .dgc_select_exact = dgc_select_exact, .dgc_accumulate_select = dgc_accumulate_select,     \
    .dgc_encode = dgc_encode, .dgc_scatter_add = dgc_scatter_add,                             \
    .dgc_apply_pairs = dgc_apply_pairs, .dgc_apply_dense = dgc_apply_dense

#endif /* FLEET_KERNELS_CPU_BACKEND_PRIVATE_H */
