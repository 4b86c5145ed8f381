/* backend.h - the compute backend: one table of function pointers behind every layer, optimizer
 * and strategy (the project's vtable pattern; docs/backends.md says how to add one).
 *
 * A backend owns tensor memory (alloc / free / copy / fill, host<->device copies), a stream and
 * event notion (no-ops on the CPU), and whole operations: convolution forward, backward-data and
 * backward-filter, batch norm (training and inference, forward and backward), pooling, softmax
 * cross-entropy, the optimizer updates, elementwise ops and GEMM. Layers, optimizers and
 * strategies call only these; none knows which backend runs it.
 *
 * Backends: fl_backend_cpu() (OpenBLAS gemm, OpenMP loops, convolution as im2col + gemm),
 * fl_backend_ref() (plain single-threaded loops; the reference tests compare against), and
 * fl_backend_onednn() (oneDNN 2.x convolution and pooling and a batch norm of its own, on
 * channels-last activations, the rest from the cpu table; NULL when fleet was built without
 * oneDNN), and fl_backend_cuda() (cuBLAS, cuDNN and fleet's own kernels on an NVIDIA GPU).
 *
 * Memory rule (what a device backend relies on; tests/support/devsim.c enforces it on the CPU):
 * every data pointer a table function takes is backend memory, from its alloc: activations,
 * weights, gradients, optimizer state, labels (int32), batch norm's mean and var (C doubles
 * each), DGC's grad, w, u, v, idx, pairs and scratch, a convolution's scratch. Host memory are
 * the scalars and the struct arguments (fl_conv_desc, fl_conv_geom, fl_dgc_accum_args), the
 * small metadata arrays `start` (int64 per segment) and the host arrays of segment pointers
 * `dst` / `w` of dgc_scatter_add and dgc_apply_pairs (whose entries point to backend memory),
 * and `hint` and `passes` of dgc_accumulate_select; values a function returns come back to
 * the host. The host never reads or writes backend memory itself: it copies with `copy`
 * (FL_COPY_H2D / D2H) or computes with a table function. Comm (src/comm) sees only host
 * memory: strategies stage buffers through fl_backend_stage_out / fl_backend_stage_in below,
 * or, to keep the compute stream running, through host_alloc memory with a copy in a stream of
 * their own (the dense strategy's buckets: docs/backends.md "Comm staging").
 * fl_argmax is a host function over host memory. On a backend with host_memory true (cpu,
 * ref, onednn) backend memory is host memory and the copies are skipped, so following the
 * rule costs those backends nothing.
 *
 * Every kernel takes a dtype, FL_DTYPE_F32 or FL_DTYPE_F64 (f64 exists so gradient checks can use
 * finite differences; f16 and bf16 where a table has them, "Low dtypes" below), and raw pointers into the backend's memory; sizes may be 0. Results do
 * not depend on the thread count in any of the three tables: sums run over fixed chunks in a
 * fixed order (docs/backends.md says how). All kernels are thread-safe except gemm:
 * OpenBLAS keeps its thread count in globals, so concurrent gemm calls from several threads must
 * be serialised by the caller (fleet runs them on the training thread only).
 *
 * Low dtypes (mixed precision, docs/amp.md; the ref table, and the cuda table opt-in): the ops
 * over activations also take t = FL_DTYPE_F16 or FL_DTYPE_BF16 - fill, reorder, gemm, add_bias,
 * sum_rows, act_forward / backward, axpy, scale, sum, sumsq, convolution plans, pool_forward /
 * backward, bn_forward / backward, add_forward / backward, dropout_mask, channel_pad,
 * channel_mul_forward / backward, channel_slice. Then the activations are arrays of 2-byte
 * elements of t (x, y, dx, dy; gemm's a, b and c; add_bias's y and sum_rows's dy; the residual
 * add's a, b, da, db; channel_mul's s and ds, which are a sigmoid layer's output and its
 * gradient), and everything else stays f32: biases and their gradients (add_bias's bias,
 * sum_rows's db, a convolution's bias and dbias), batch norm's gamma, beta, dgamma and dbeta
 * (mean and var double as always), and a convolution's weights and weight gradient (the f32
 * master copies: a plan of dtype f16 / bf16 reads w rounded to its dtype, as a GPU's f16 copy of
 * the filter, and rounds the weight gradient to its dtype before it writes it into dw or, when
 * accumulating, adds it to dw with an f32 add, as an f16 wgrad converted into the f32 gradient
 * block). Each output element is computed in double from the values read (exact there) and
 * rounded ONCE on store to its array's dtype: to t, as fl_f32_to_f16 / fl_f32_to_bf16 round (to
 * nearest even, f16 overflowing to inf) but from the exact double, not through a cast to f32
 * (ref_lowp.h says how); an f32 output (db, dgamma, dbeta) is the double sum, plus its old
 * value when accumulating, rounded to f32. So a low result is the correctly rounded f64 result
 * on the same inputs, and a faster table's low ops (f32 arithmetic, other orders) are checked
 * against it with a tolerance per op. Copies (reorder, channel_pad, channel_slice,
 * add_backward) copy bits. Taking either layout is the low ops' own: on the ref table, whose f32
 * and f64 convolution, pooling and batch norm are NCHW only, they also run NHWC (the layout a
 * GPU runs them in); its preferred_layout stays NCHW. Not low: softmax cross-entropy and label
 * smoothing (the loss is f32), the optimizer updates, amp_round, DGC. Whether a table has them
 * is its low_dtypes flag (ref: true). A table without low dtypes refuses a low convolution
 * plan (FL_EUNSUPPORTED, fl_conv_desc_check's message) and asserts on a low t elsewhere: the
 * cpu and onednn tables. The cuda table takes f16 / bf16 in every op above (gemm through
 * cuBLAS's f32-computing GemmEx, convolution plans on cuDNN's half / bfloat16 kernels with f32
 * compute) ahead of its low_dtypes, which stays false until they have passed their tests on a
 * GPU unless FLEET_CUDA_LOW_DTYPES=1 in the environment when fl_backend_cuda() is first called
 * (docs/amp.md); its preferred_layout for f16 / bf16 is NHWC. */
#ifndef FLEET_BACKEND_H
#define FLEET_BACKEND_H

#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activations. hardswish(x) = x relu6(x + 3) / 6 and hardsigmoid(x) = relu6(x + 3) / 6 =
 * clip(x / 6 + 1/2, 0, 1) (Howard et al. 2019, MobileNetV3, arXiv:1905.02244; PyTorch's
 * definitions). Paddle's Hardsigmoid, which PaddleClas's SE modules use, is clip(slope x +
 * offset, 0, 1) with slope 0.1666667 and offset 0.5: the same function with 1/6 rounded to 7
 * digits (2e-7 relative), so fleet keeps the exact 1/6. */
typedef enum {
    FL_ACT_NONE = 0,
    FL_ACT_RELU,
    FL_ACT_TANH,
    FL_ACT_SIGMOID,
    FL_ACT_HARDSWISH,
    FL_ACT_HARDSIGMOID,
} fl_act;
#define FL_ACT_COUNT (FL_ACT_HARDSIGMOID + 1)

/* Parses "relu", "tanh", "sigmoid", "hardswish", "hardsigmoid", "none"; returns 0 or
 * FL_EINVAL. */
int fl_act_parse(const char *name, fl_act *out);
const char *fl_act_name(fl_act a);

/* Geometry of a 2-D window operation on one (C, H, W) image: convolution (im2col/col2im) or
 * pooling (then c counts the planes, N * C, pooled independently). Output size as PyTorch:
 * OH = (H + 2 PH - DH (KH - 1) - 1) / SH + 1, likewise OW. */
typedef struct fl_conv_geom {
    int64_t c, h, w;          /* input channels (planes), height, width */
    int64_t kh, kw;           /* window */
    int64_t sh, sw;           /* stride */
    int64_t ph, pw;           /* zero (conv) or -inf (max pool) padding on each side */
    int64_t dh, dw;           /* dilation (1: dense window) */
    int64_t oh, ow;           /* output height, width (fl_conv_geom_out fills them) */
} fl_conv_geom;

/* Fills g->oh, g->ow from the rest; returns false when the window does not fit (OH or OW < 1)
 * or a field is out of range (sizes < 1, padding < 0). */
bool fl_conv_geom_out(fl_conv_geom *g);

typedef enum { FL_POOL_MAX = 0, FL_POOL_AVG = 1 } fl_pool;

/* Memory order of activations with spatial dimensions, (N, C, H, W) logically: NCHW (planes of
 * one channel; PyTorch's default, the cpu and ref backends' only layout) or NHWC (channels
 * last: one pixel's channels together; what oneDNN's direct convolutions run fastest on).
 * Tensors of 1 or 2 dimensions, parameters and everything outside the network are in their
 * plain row-major order whatever the layout. */
typedef enum { FL_LAYOUT_NCHW = 0, FL_LAYOUT_NHWC = 1 } fl_layout;
static inline const char *fl_layout_name(fl_layout l) {
    return l == FL_LAYOUT_NHWC ? "NHWC" : "NCHW";
}

/* One convolution as a backend plans it (cuDNN's descriptor, oneDNN's primitive descriptor):
 * x (N, IC, H, W) -> y (N, OC, OH, OW) in `layout`, weight (OC, IC / groups, KH, KW) and bias
 * (OC) always in PyTorch's order, N <= max_batch. g holds IC (g.c), the input size, kernel,
 * stride, padding and dilation, and the output size (fl_conv_geom_out). */
typedef struct fl_conv_desc {
    fl_dtype     dtype;
    fl_layout    layout;
    int64_t      max_batch;
    int64_t      oc, groups;
    bool         bias;
    fl_conv_geom g;
} fl_conv_desc;

/* The checks every backend's conv_plan_create makes first: dtype f32 or f64, sizes >= 1, groups
 * dividing both channel counts, the output size fl_conv_geom_out gives, a known layout. 0, or
 * FL_EUNSUPPORTED (dtype f16 or bf16: this backend's convolutions need f32 or f64), FL_EINVAL
 * or FL_ESHAPE, with a message that begins with `who` ("onednn conv"). */
int fl_conv_desc_check(const fl_conv_desc *d, const char *who);
/* The same for a backend that also plans f16 / bf16 convolutions (the low dtypes, above): f16
 * and bf16 pass too. */
int fl_conv_desc_check_low(const fl_conv_desc *d, const char *who);

/* A backend's prepared convolution (algorithm, tiles, primitives); opaque, owned by the layer
 * that created it, used from one thread at a time. */
typedef struct fl_conv_plan fl_conv_plan;

/* Deep Gradient Compression (Lin et al. 2018, arXiv:1712.01887): one selected entry on the
 * wire, its index in the compressed index space (the compressed tensors one after the other)
 * and its value, 8 bytes; and the arguments of the accumulation. */
typedef struct fl_dgc_pair {
    int32_t index;
    float   value;
} fl_dgc_pair;

typedef struct fl_dgc_accum_args {
    double clip_scale; /* multiplies the gradient: local clipping's factor (1: none) */
    double decay;      /* lambda of the weight-decay correction, added as decay * w (0: none) */
    double momentum;   /* m */
    bool   nesterov;
    bool   correction; /* momentum correction; false: v accumulates the gradient itself */
} fl_dgc_accum_args;

/* One compressed tensor of a batched selection (dgc_accumulate_select_batch): n values' gradient,
 * weights, u and v (backend memory), the k to select, its first index in the compressed index
 * space (base), where its pairs go (backend memory, room for k), and dgc_accumulate_select's
 * seed and hint (host memory; hint may be NULL). */
typedef struct fl_dgc_batch_item {
    int64_t      n, k, base;
    const float *grad, *w;
    float       *u, *v;
    fl_dgc_pair *pairs;
    uint64_t     seed;
    float       *hint;
} fl_dgc_batch_item;

/* Kinds of copy between a backend's memory and the host's. */
typedef enum { FL_COPY_H2H = 0, FL_COPY_H2D, FL_COPY_D2H, FL_COPY_D2D } fl_copy_kind;

/* Streams order a backend's work, events mark points in a stream (CUDA's notions); on the CPU
 * every call runs to completion before it returns, so both are tokens and every stream and
 * event function is a no-op. NULL is the backend's default stream. */
typedef struct fl_stream fl_stream;
typedef struct fl_event  fl_event;

typedef struct fl_backend {
    const char *name; /* "cpu", "ref", "onednn", "cuda" */
    /* Memory the kernels read and write is host memory (the CPU backends): copies between it
     * and the host are plain memcpy, and the comm staging below is free. */
    bool host_memory;
    /* The activation layout the backend runs fastest on for dtype t; a network uses it where
     * every layer reading a spatial activation supports it (fl_net_build), else NCHW. Every
     * backend supports NCHW. */
    fl_layout (*preferred_layout)(fl_dtype t);
    /* The table runs the ops over activations in FL_DTYPE_F16 and FL_DTYPE_BF16 natively, with
     * the "Low dtypes" contract above, and has `convert`: a network may then keep its
     * activations in the low dtype (fl_net_set_amp_native, docs/amp.md). true: ref; false:
     * cpu, onednn, and cuda until its low ops have passed their tests on a GPU, unless
     * FLEET_CUDA_LOW_DTYPES=1 turns it on (fl_net_set_amp then emulates where false). */
    bool low_dtypes;

    /* --- memory --- */
    /* bytes of the backend's memory, 64-byte aligned, zero-filled; NULL on failure (fl_errmsg
     * set). alloc(0) returns a valid pointer that free accepts. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p); /* NULL: no-op */
    /* dst = src, bytes; on a device, asynchronous in stream (NULL: the default stream). */
    void (*copy)(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s);
    /* x[0 .. n) = v */
    void (*fill)(fl_dtype t, void *x, int64_t n, double v);
    /* dst[0 .. n) = src converted from dtype `from` to dtype `to`: f32 to f16 / bf16 rounds to
     * nearest even as fl_f32_to_f16 / fl_f32_to_bf16 do (f16 beyond 65504 becomes inf, inf and
     * NaN stay), f16 / bf16 to f32 is exact, equal dtypes copy; src and dst do not overlap.
     * Where a network running low activations meets an f32 one (its input, its output for the
     * loss, layers that stay f32) and for fc's low copy of its weights. NULL on the cpu and
     * onednn tables; the cuda table has it ahead of its low_dtypes, which is what a caller
     * checks. */
    void (*convert)(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n);
    /* Reorders n images of c channels and hw pixels between NCHW and NHWC (either direction:
     * to_nhwc); src and dst do not overlap. The network calls it at its edges. */
    void (*reorder)(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw, const void *src,
                    void *dst);

    /* --- streams and events (no-ops on the CPU) --- */
    fl_stream *(*stream_create)(void);
    void (*stream_free)(fl_stream *s);
    void (*stream_sync)(fl_stream *s);               /* wait for all work queued in s */
    fl_event *(*event_create)(void);
    void (*event_free)(fl_event *e);
    void (*event_record)(fl_event *e, fl_stream *s); /* e marks what s has queued so far */
    void (*event_wait)(fl_stream *s, fl_event *e);   /* s's later work waits for e */
    void (*event_sync)(fl_event *e);                 /* the host waits for e */

    /* C (M, N) = alpha * op(A) op(B) + beta * C, row-major; op(A) is (M, K): A is (M, K) with
     * lda >= K, or (K, M) with lda >= M when trans_a. Likewise B (K, N) or (N, K). */
    void (*gemm)(fl_dtype t, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                 double beta, void *c, int64_t ldc);

    /* y (ROWS, COLS) += bias (COLS) broadcast over rows. Low t: bias f32. */
    void (*add_bias)(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols);
    /* db (COLS) = (accumulate ? db : 0) + sum over rows of dy (ROWS, COLS). Low t: db f32. */
    void (*sum_rows)(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                     bool accumulate);

    /* y = act(x), n elements; y may alias x. */
    void (*act_forward)(fl_dtype t, fl_act act, const void *x, void *y, int64_t n);
    /* dx = dy * act'(x): relu, hardswish and hardsigmoid use x, tanh and sigmoid use
     * y = act(x); dx may alias dy. At the kinks: relu' (0) = 0; hardswish' is 0 below -3,
     * x / 3 + 1/2 on [-3, 3], 1 above; hardsigmoid' is 1/6 on (-3, 3), else 0 (PyTorch's). */
    void (*act_backward)(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                         void *dx, int64_t n);

    /* y += a * x */
    void (*axpy)(fl_dtype t, int64_t n, double a, const void *x, void *y);
    /* x *= a */
    void (*scale)(fl_dtype t, int64_t n, double a, void *x);
    /* Mixed precision's emulation (strategy.amp, docs/amp.md): each of x's n f32 values becomes
     * the nearest value of dtype low (FL_DTYPE_F16 or FL_DTYPE_BF16), ties to even, as a cast
     * to low and back gives: f16 beyond 65504 becomes inf, below 2^-24 zero; bf16 keeps f32's
     * range. inf and NaN stay. What f16/bf16 tensor-core operations read and write, computed in
     * f32. NULL where a backend has none: fl_net_set_amp refuses it. */
    void (*amp_round)(fl_dtype low, int64_t n, float *x);
    /* sum of x, and sum of x^2, accumulated in double */
    double (*sum)(fl_dtype t, const void *x, int64_t n);
    double (*sumsq)(fl_dtype t, const void *x, int64_t n);

    /* Fused softmax cross-entropy, numerically stable (max subtracted before exp).
     * logits, probs (ROWS, CLASSES); labels (ROWS) in [0, CLASSES). Writes probs = softmax and
     * returns the sum over rows of -log p[label] (computed as logsumexp - logit[label]). */
    double (*softmax_xent_forward)(fl_dtype t, const void *logits, const int32_t *labels,
                                   void *probs, int64_t rows, int64_t classes);
    /* dlogits = scale * (probs - onehot(labels)); dlogits may alias probs. */
    void (*softmax_xent_backward)(fl_dtype t, const void *probs, const int32_t *labels,
                                  void *dlogits, int64_t rows, int64_t classes, double scale);

    /* Optimizer updates over n elements (w, g, v of the same dtype):
     * sgd:      w -= lr * (g + wd * w)
     * momentum: d = g + wd * w;  v = mu * v + d;  w -= lr * (nesterov ? d + mu * v : v)
     * (Paddle's Momentum / PyTorch SGD(momentum, dampening=0), L2 decay folded into d). */
    void (*sgd_update)(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd);
    void (*momentum_update)(fl_dtype t, int64_t n, void *w, const void *g, void *v, double lr,
                            double mu, double wd, bool nesterov);
    /* LARS momentum (src/optim/lars.c, You, Gitman & Ginsburg 2017) over a run of nt parameter
     * tensors lying one after another in w, g and v (numel[k] elements each; d[k] its LARS
     * weight decay, 0 where the tensor is excluded): per tensor g' = g + wd w (wd > 0; g
     * itself is left as it is), local_lr = lr coeff ||w|| / (||g'|| + d ||w|| + eps) where
     * d > 0 and both norms > 0, else lr; v = mu v; v += local_lr g'; v += local_lr d w (d >
     * 0); w -= v. The same bits as lars.c's sequence of this table's sumsq, axpy and scale,
     * which waits twice a tensor for its norms; this waits for nothing. numel and d are host
     * arrays. NULL: the optimizer goes tensor by tensor (the cpu tables, whose norms cost no
     * wait). */
    void (*lars_update_run)(fl_dtype t, int nt, const int64_t *numel, const double *d, void *w,
                            const void *g, void *v, double lr, double mu, double wd,
                            double coeff, double eps);

    /* --- convolution: a plan per layer and shape, then forward and the two backwards --- */
    /* Prepares d (checked: FL_ESHAPE / FL_EINVAL through fl_errmsg, NULL returned, when the
     * backend cannot run it). The layer frees it with conv_plan_free. */
    fl_conv_plan *(*conv_plan_create)(const fl_conv_desc *d);
    void (*conv_plan_free)(fl_conv_plan *p);
    /* Scratch bytes forward and backward need for max_batch images; the caller lends that
     * much (64-byte aligned, contents not kept between calls) as `scratch`. */
    size_t (*conv_scratch_bytes)(const fl_conv_plan *p);
    /* y = conv(x, w) + bias (bias NULL when the plan has none); n <= max_batch images. A low
     * plan: w and bias f32, w read rounded to the plan's dtype, bias added as it is (f32, before
     * the one rounding). */
    void (*conv_forward)(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                         const void *bias, void *y, void *scratch);
    /* dx = the gradient w.r.t. x given dy (overwrites dx). */
    void (*conv_backward_data)(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                               void *dx, void *scratch);
    /* dw (and dbias, unless NULL) = the gradients w.r.t. the weight and bias given x and dy,
     * added to what they hold when accumulate. A low plan: dw and dbias f32; dw gets the weight
     * gradient rounded to the plan's dtype (then an f32 add when accumulate), dbias the double
     * sum of dy (plus dbias) rounded to f32. */
    void (*conv_backward_filter)(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                 void *dw, void *dbias, bool accumulate, void *scratch);

    /* --- pooling: n images of g->c channels (H, W) -> (OH, OW), in layout --- */
    /* Max or mean over each window. Max pool pads with -inf; average pool divides by KH KW,
     * padding included (PyTorch's count_include_pad = True): low t, the window's sum times
     * 1 / (KH KW), rounded once. */
    void (*pool_forward)(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                         const fl_conv_geom *g, const void *x, void *y);
    /* dx = gradient of the pooling given dy (overwrites dx); max pool sends each window's
     * gradient to its first largest x, as PyTorch's CPU kernel does. */
    void (*pool_backward)(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                          const fl_conv_geom *g, const void *x, const void *dy, void *dx);

    /* --- batch norm over the channels of x (N, C, HW) in layout (Ioffe & Szegedy 2015) --- */
    /* y = act(z), z = gamma (x - mean) / sqrt(var + eps) + beta, computed in t as
     * z = x a + b with a = gamma / sqrt(var + eps) and b = beta - mean a rounded to t per
     * channel; act is FL_ACT_NONE, FL_ACT_RELU or FL_ACT_HARDSWISH (the activation that follows
     * fused in: PP-HGNet's and ResNet's ReLUs, PP-LCNet's hardswish). training: mean and var
     * (C, in double) receive the batch's mean and biased variance; else they are read
     * (running statistics). y may alias x unless act is FL_ACT_HARDSWISH (whose backward reads
     * x). Low t: gamma and beta f32 (dgamma, dbeta too). */
    void (*bn_forward)(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                       const void *x, const void *gamma, const void *beta, double eps,
                       bool training, double *mean, double *var, fl_act act, void *y);
    /* Backward of bn_forward with the act, mean and var it used: dz = dy where act is none,
     * dy where y > 0 for relu (y is bn_forward's output; read only then), dy hardswish'(z)
     * for hardswish with z = x a + b recomputed as the forward computed it (act_backward's
     * hardswish'). Writes dgamma, dbeta (adding when accumulate) and, unless dx is NULL, dx:
     * with batch statistics (training) dx = gamma invstd (dz - mean(dz) - xhat mean(dz xhat)),
     * else dx = gamma invstd dz. */
    void (*bn_backward)(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                        const void *x, fl_act act, const void *y, const void *dy,
                        const void *gamma, const void *beta, const double *mean,
                        const double *var, double eps, bool training, void *dx, void *dgamma,
                        void *dbeta, bool accumulate);
    /* The running statistics after a training batch of count values per channel, in place
     * (PyTorch's and Paddle's momentum rule): running_mean = (1 - momentum) running_mean +
     * momentum mean, running_var = (1 - momentum) running_var + momentum var count / (count -
     * 1) (var itself where count <= 1), each product and sum in double in that order (no fused
     * multiply-add: every table gives the same bits), rounded once to t (f32 or f64, the
     * network's dtype); mean and var (C, double) as bn_forward wrote them. On the device, so a
     * training step waits for no copy back per batch-norm layer. */
    void (*bn_running)(fl_dtype t, int64_t c, const double *mean, const double *var,
                       double count, double momentum, void *running_mean, void *running_var);

    /* --- the small layers --- */
    /* y = a + b, then max(0, .) when relu (the residual join); y may alias a or b */
    void (*add_forward)(fl_dtype t, const void *a, const void *b, void *y, int64_t n, bool relu);
    /* da = db = dy, where y > 0 when relu; either may be NULL */
    void (*add_backward)(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                         int64_t n, bool relu);
    /* Inverted dropout: out = in / (1 - p) where kept, else 0 (low t: in times 1 / (1 - p)); element i is kept when word
     * i % 4 of the Philox4x32-10 block at counter (i / 4, step) with key seed is >= p 2^32, so
     * backward regenerates the same mask. in and out may alias. */
    void (*dropout_mask)(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                         void *out, int64_t n);
    /* The option-A shortcut (He et al. 2015) over n images in layout: forward, y (oc, ceil(h /
     * stride), ceil(w / stride)) = 0 except channels [(oc - c) / 2, + c), x's every stride-th
     * pixel; backward (forward false), x (c, h, w) = the adjoint from y. */
    void (*channel_pad)(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h,
                        int64_t w, int64_t stride, int64_t oc, void *x, void *y, bool forward);
    /* The channel-wise scale of squeeze-and-excitation (Hu et al. 2018, arXiv:1709.01507):
     * n images of c channels and hw pixels in layout, y = x * s with s (N, C) one factor per
     * image and channel (the same memory as (N, C, 1, 1) in either layout). y may alias x.
     * Low t: s (and ds) in t too. */
    void (*channel_mul_forward)(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                                const void *x, const void *s, void *y);
    /* Its backward: dx = dy * s (unless dx is NULL; may alias dy) and ds (N, C) = the sum over
     * the pixels of dy * x (unless ds is NULL), summed pixel by pixel in order (in double on
     * the host), whatever the thread count. */
    void (*channel_mul_backward)(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                 int64_t hw, const void *x, const void *s, const void *dy,
                                 void *dx, void *ds);
    /* Concatenation along channels, one input at a time: n images of hw pixels in layout;
     * forward: y's channels [off, off + c) of its oc = x's c channels; backward (forward
     * false): x = those channels of y. x and y do not overlap. */
    void (*channel_slice)(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c,
                          void *x, int64_t oc, int64_t off, void *y, bool forward);
    /* Label smoothing's extra term: the sum over rows of logsumexp(x_r) - mean_j(x_rj) */
    double (*xent_smooth_term)(fl_dtype t, const void *logits, int64_t rows, int64_t classes);
    /* dlogits[r][j] += (j == labels[r] ? on : 0) - all */
    void (*xent_smooth_backward)(fl_dtype t, const int32_t *labels, void *dlogits, int64_t rows,
                                 int64_t classes, double on, double all);

    /* --- Deep Gradient Compression over f32 (Lin et al. 2018; Paddle's dgc op). The exact
     * contracts are the CPU kernels' (src/kernels/cpu/dgc_kernels.h); in short: --- */
    /* clipping and weight-decay correction of grad, then momentum correction into u and v */
    void (*dgc_accumulate)(int64_t n, const float *grad, const float *w, float *u, float *v,
                           const fl_dgc_accum_args *a);
    /* the indices of the k entries of largest |v| (never a zero) into idx; returns how many.
     * scratch: n floats. */
    int64_t (*dgc_select_exact)(int64_t n, const float *v, int64_t k, int32_t *idx,
                                float *scratch);
    /* dgc_accumulate fused with a sampled-threshold selection of the same top k (hint: last
     * step's k-th magnitude, in and out); scratch: n + max(n / 100, 4096) floats */
    int64_t (*dgc_accumulate_select)(int64_t n, const float *grad, const float *w, float *u,
                                     float *v, const fl_dgc_accum_args *a, int64_t k,
                                     int32_t *idx, float *scratch, uint64_t seed, float *hint,
                                     int *passes);
    /* dgc_accumulate_select and then dgc_encode (u zeroed too where mask_u) for each of nt
     * tensors, their results those calls give: count[i] (host) tensor i's count, its pairs in
     * items[i].pairs. A device backend does them all in a few launches with one wait (the
     * per-tensor calls wait once each); idx (int32, the largest k) and scratch (the largest
     * tensor's dgc_accumulate_select scratch) serve the per-tensor calls. NULL: call
     * fl_backend_dgc_batch, which makes those calls. */
    void (*dgc_accumulate_select_batch)(int nt, const fl_dgc_batch_item *items,
                                        const fl_dgc_accum_args *a, bool mask_u, int64_t *count,
                                        int32_t *idx, float *scratch);
    /* pairs[i] = {base + idx[i], v[idx[i]]}; those entries of v (and u, unless NULL) zeroed */
    void (*dgc_encode)(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                       fl_dgc_pair *pairs);
    /* every pair's value added at its index in the segmented space (dst[s] holds segment s,
     * [start[s], start[s+1])); -1, or the position of the first pair outside the space */
    int64_t (*dgc_scatter_add)(const fl_dgc_pair *pairs, int64_t n, int nseg,
                               const int64_t *start, float *const *dst);
    /* w -= step * value at each pair's index, in pair order */
    void (*dgc_apply_pairs)(const fl_dgc_pair *pairs, int64_t n, int nseg, const int64_t *start,
                            float *const *w, double step);
    /* the step over a whole tensor from its summed gradient g (zeroed after) */
    void (*dgc_apply_dense)(int64_t n, float *w, float *g, float *u, double lr, double inv_n,
                            double m, bool nesterov, double decay);

    /* --- the device (NULL on the host backends) --- */
    /* Makes device `ordinal` (0-based among the visible ones) the calling process's device and
     * readies the backend's libraries on it; 0, or FL_EINVAL / FL_EIO with a message naming the
     * device and how many there are (also when there is no device or no driver). Called once,
     * before any other function of the table. */
    int (*device_bind)(int ordinal);
    /* The most bytes of backend memory held at once since device_bind (the allocator's cache
     * included), for the progress line and metrics.jsonl. */
    size_t (*memory_peak)(void);
    /* Host memory for staging between the device and the host (comm's buckets, input
     * batches): page-locked (cudaHostAlloc), so that copies in a stream to or from it run
     * asynchronously, overlapping compute; 64-byte aligned, zero-filled, NULL on failure
     * (fl_errmsg set). NULL entries: plain host memory (fl_backend_host_alloc below). */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* train.deterministic: false lets the backend trade bit-repeatability for speed (the cuda
     * backend: cuDNN's fastest backward algorithms, atomics included, as PyTorch's default);
     * true (the default) keeps every run's bits. Call after device_bind, before the network is
     * built: convolution plans keep the choice they were made with. NULL: the backend has
     * deterministic kernels only (cpu, ref, onednn). */
    void (*set_deterministic)(bool on);
    /* The device device_bind bound (-1 before) and, in *stream unless NULL, the stream the
     * backend's ops run in (a cudaStream_t), for a communicator on the same device (the nccl
     * backend orders its collectives after the compute queued there). NULL: no device. */
    int (*bound_device)(void **stream);
} fl_backend;

/* The OpenBLAS + OpenMP table. */
const fl_backend *fl_backend_cpu(void);
/* The plain reference table (single-threaded loops; plain-loop gemm). */
const fl_backend *fl_backend_ref(void);
/* oneDNN's convolution and pooling and a channels-last batch norm (f32; f64 falls back to the
 * cpu table's), the rest the cpu table's; NULL when fleet was built without oneDNN (configure
 * says which). */
const fl_backend *fl_backend_onednn(void);
/* cuBLAS, cuDNN and fleet's own CUDA kernels on an NVIDIA GPU; NULL when fleet was built
 * without CUDA (configure says which). Call device_bind first. Its low_dtypes is read from
 * FLEET_CUDA_LOW_DTYPES (1: on) at the first call, once per process (thread-safe). */
const fl_backend *fl_backend_cuda(void);
/* The backend called name: "cpu", "ref", "onednn", "cuda", or "auto" (onednn where built, else
 * cpu).
 * NULL with a message naming the valid ones when unknown or not built in. */
const fl_backend *fl_backend_by_name(const char *name);

/* What fl_tensor.device says of a tensor in be's memory: the host's (FL_DEVICE_CPU) when
 * be->host_memory, else a device's. */
static inline fl_device fl_backend_device(const fl_backend *be) {
    fl_device d = {be->host_memory ? FL_DEVICE_CPU : FL_DEVICE_CUDA, 0};
    return d;
}

/* Staging memory on the host for be (its host_alloc, else 64-byte aligned zeroed memory;
 * bytes 0 gives a valid pointer); freed with fl_backend_host_free (NULL: no-op). */
void *fl_backend_host_alloc(const fl_backend *be, size_t bytes);
void  fl_backend_host_free(const fl_backend *be, void *p);

/* The host memory holding `bytes` of backend memory src, for comm to send: src itself on a
 * host-memory backend (free), else staging after a device-to-host copy in stream s (complete
 * when this returns). */
static inline const void *fl_backend_stage_out(const fl_backend *be, const void *src,
                                               void *staging, size_t bytes, fl_stream *s) {
    if (be->host_memory)
        return src;
    be->copy(staging, src, bytes, FL_COPY_D2H, s);
    be->stream_sync(s);
    return staging;
}
/* Where comm should receive `bytes` bound for backend memory dst: dst itself on a host-memory
 * backend, else staging; fl_backend_stage_in then moves staging to dst (a no-op on the host). */
static inline void *fl_backend_stage_buf(const fl_backend *be, void *dst, void *staging) {
    return be->host_memory ? dst : staging;
}
static inline void fl_backend_stage_in(const fl_backend *be, void *dst, const void *staging,
                                       size_t bytes, fl_stream *s) {
    if (!be->host_memory)
        be->copy(dst, staging, bytes, FL_COPY_H2D, s);
}

/* be's dgc_accumulate_select_batch, or, where the table has none, dgc_accumulate_select and
 * dgc_encode tensor by tensor (same arguments and results). */
void fl_backend_dgc_batch(const fl_backend *be, int nt, const fl_dgc_batch_item *items,
                          const fl_dgc_accum_args *a, bool mask_u, int64_t *count, int32_t *idx,
                          float *scratch);

/* Number of threads the CPU kernels use: OpenMP loops and OpenBLAS both follow it. n <= 0
 * restores the default (OMP_NUM_THREADS, else one per core). Affects kernels called from the
 * calling thread afterwards; call it at set-up, not concurrently with kernels. */
void fl_kernels_set_threads(int n);
int  fl_kernels_get_threads(void);

/* For programs, first thing in main: how the kernels' OpenMP threads wait for work. Where
 * neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets GOMP_SPINCOUNT=3000 (spin briefly,
 * then sleep) and starts the program again with the same argv (execv of /proc/self/exe, the
 * same process: OpenMP reads these when it is loaded, before main), so that the program does
 * not spin away the CPUs that other busy processes need (threads.c says what was measured).
 * Returns 0 when the environment already decides (then nothing is done), -1 when the restart
 * failed (OpenMP's default then stays); does not return when it restarts. A library user's
 * process is left alone unless it calls this. */
int fl_kernels_wait_default(char **argv);
/* The wait in force, in words, for a log line ("spin 3000 rounds, then sleep (fleet's
 * default, GOMP_SPINCOUNT)", "OMP_WAIT_POLICY=passive", ...); a static buffer. */
const char *fl_kernels_wait_policy(void);

/* Index of the largest of n values (first on ties); used by accuracy and the teacher task. */
int64_t fl_argmax(fl_dtype t, const void *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_BACKEND_H */
