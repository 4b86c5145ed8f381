/* onednn_impl.h - private to the onednn backend: the engine and streams, the cpu table it falls
 * back to, small helpers around oneDNN's C API, and the per-file entry points that onednn.c
 * gathers into fl_backend_onednn(). Only files under src/kernels/onednn include dnnl.h. */
#ifndef FLEET_KERNELS_ONEDNN_IMPL_H
#define FLEET_KERNELS_ONEDNN_IMPL_H

#include "fleet/backend.h"
#include "fleet/status.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CPU engine (index 0), created once. */
dnnl_engine_t onednn_engine(void);
/* The calling thread's stream on that engine, created on first use and destroyed when the
 * thread exits: oneDNN does not promise that one stream may be used from several threads at
 * once, and fleet's kernels are thread-safe (and run convolution pieces on OpenMP's workers),
 * so each thread gets its own. */
dnnl_stream_t onednn_stream(void);
/* The table every f64 call and every case oneDNN cannot run goes to (NCHW only). */
const fl_backend *onednn_cpu(void);
/* The thread count oneDNN's OpenMP runtime uses for what the calling thread runs now; oneDNN
 * fixes a primitive's work split when it creates it, so cached primitives are keyed by it. */
int onednn_threads(void);

/* Aborts with the call, file:line and oneDNN's status name unless s is dnnl_success: for
 * execution, whose failures are programming errors (creation failures are reported). */
void onednn_must(dnnl_status_t s, const char *expr, const char *file, int line);
#define DNNL_MUST(call) onednn_must((call), #call, __FILE__, __LINE__)

/* The memory descriptor of activations (N, C, H, W) stored in layout, f32. */
dnnl_memory_desc_t onednn_act_md(fl_layout layout, int64_t n, int64_t c, int64_t h, int64_t w);
/* A plain f32 vector of n elements. */
dnnl_memory_desc_t onednn_vec_md(int64_t n);

/* The arguments of one execution: memory objects wrapping caller pointers, created by
 * onednn_arg and destroyed by onednn_run. */
#define ONEDNN_MAX_ARGS 10
typedef struct onednn_args {
    int n;
    dnnl_exec_arg_t a[ONEDNN_MAX_ARGS];
} onednn_args;
/* Adds argument `kind` (DNNL_ARG_*): memory of descriptor md at p (borrowed; oneDNN does not
 * write inputs, the cast drops const only to fit the API). */
void onednn_arg(onednn_args *e, int kind, const dnnl_memory_desc_t *md, const void *p);
/* Executes prim with e's arguments on the calling thread's stream, waits, and destroys e's
 * memory objects (e is empty again afterwards). */
void onednn_run(dnnl_primitive_t prim, onednn_args *e);
/* Creates the primitive of op descriptor op (attr and hint may be NULL); on failure returns a
 * negative status with a message naming `what` (no message when what is NULL: the caller
 * falls back quietly) and leaves *prim NULL. With pd_out, the
 * primitive descriptor is returned there as well (the caller destroys it). */
int onednn_create(dnnl_primitive_t *prim, const_dnnl_op_desc_t op, const_dnnl_primitive_attr_t attr,
                  const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd_out,
                  const char *what);

/* 64-byte aligned host memory (uninitialised); NULL on failure, fl_errmsg set. onednn_free
 * accepts NULL. */
void *onednn_alloc(size_t bytes);
void onednn_free(void *p);
/* A buffer of at least `bytes`, 64-byte aligned, private to the calling thread and reused by
 * its next call (contents not kept): for per-channel temporaries and partial sums inside one
 * kernel call. */
void *onednn_tls_buf(size_t bytes);

/* onednn_conv.c */
fl_conv_plan *onednn_conv_plan_create(const fl_conv_desc *d);
void onednn_conv_plan_free(fl_conv_plan *p);
size_t onednn_conv_scratch_bytes(const fl_conv_plan *p);
void onednn_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                         const void *bias, void *y, void *scratch);
void onednn_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                               void *dx, void *scratch);
void onednn_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                 void *dw, void *dbias, bool accumulate, void *scratch);

/* onednn_dw.c: the weight gradient of an NHWC f32 depthwise convolution (groups = C = OC) */
/* Taps (KH KW) at most. */
#define ONEDNN_DW_MAX_TAPS 49
/* Whether onednn_dw_backward_filter runs geometry g (its window has at most the taps above). */
bool onednn_dw_supported(const fl_conv_geom *g);
/* The scratch onednn_dw_backward_filter needs for up to max_batch images. */
size_t onednn_dw_scratch_bytes(const fl_conv_geom *g, int64_t max_batch);
/* dw (C, 1, KH, KW) and db (C; NULL: none) = the gradient of n images' x (N, H, W, C) and dy
 * (N, OH, OW, C), added to dw's and db's values when accumulate; the same bits for any thread
 * count. scratch: onednn_dw_scratch_bytes(g, >= n), 8-byte aligned. */
void onednn_dw_backward_filter(const fl_conv_geom *g, int64_t n, const float *x,
                               const float *dy, float *dw, float *db, bool accumulate,
                               double *scratch);

/* onednn_wino.c: Winograd F(4x4, 3x3) for NHWC f32 3x3 stride-1 convolutions (groups 1,
 * dilation 1, padding 0..2), forward and backward data; the same bits for any thread count. */
/* Whether d is such a convolution (the plan also asks onednn_wino_faster). */
bool onednn_wino_supported(const fl_conv_desc *d);
/* Whether it measured faster than oneDNN's direct kernel for d's shape (onednn_wino.c). */
bool onednn_wino_faster(const fl_conv_desc *d);
/* The scratch either pass needs (the transformed weights), any batch; 4-byte aligned. */
size_t onednn_wino_scratch_bytes(const fl_conv_desc *d);
/* y (N, OH, OW, OC) = the convolution of n images x (N, H, W, C) with w (OC, C, 3, 3), plus
 * bias (OC; NULL: none). */
void onednn_wino_forward(const fl_conv_desc *d, int64_t n, const float *x, const float *w,
                         const float *bias, float *y, void *scratch);
/* dx (N, H, W, C) = the gradient of n images' input from dy (N, OH, OW, OC), written. */
void onednn_wino_backward_data(const fl_conv_desc *d, int64_t n, const float *dy,
                               const float *w, float *dx, void *scratch);
/* Whether onednn_wino_backward_filter measured faster than oneDNN for d's shape. */
bool onednn_wino_wgrad_faster(const fl_conv_desc *d);
/* The scratch onednn_wino_backward_filter needs for up to max_batch images (the batch's
 * transformed tiles of x and dy, and the 36 sums), 4-byte aligned. */
size_t onednn_wino_wgrad_scratch_bytes(const fl_conv_desc *d, int64_t max_batch);
/* dw (OC, C, 3, 3) and db (OC; NULL: none) = the gradient of n >= 1 images' x and dy, added
 * to dw's and db's values when accumulate; by F(3x3, 4x4). */
void onednn_wino_backward_filter(const fl_conv_desc *d, int64_t n, const float *x,
                                 const float *dy, float *dw, float *db, bool accumulate,
                                 void *scratch);

/* onednn_pool.c */
void onednn_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                         const fl_conv_geom *g, const void *x, void *y);
void onednn_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                          const fl_conv_geom *g, const void *x, const void *dy, void *dx);

/* onednn_bn.c */
void onednn_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                       const void *x, const void *gamma, const void *beta, double eps,
                       bool training, double *mean, double *var, fl_act act, void *y);
void onednn_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                        const void *x, fl_act act, const void *y, const void *dy,
                        const void *gamma, const void *beta, const double *mean, const double *var,
                        double eps, bool training, void *dx, void *dgamma, void *dbeta,
                        bool accumulate);

#endif /* FLEET_KERNELS_ONEDNN_IMPL_H */
