/* conv.c - the cuda backend's convolution: cuDNN's legacy API (v9: cudnnConvolutionForward,
 * BackwardData, BackwardFilter) with descriptors for the plan's layout, groups and dilation;
 * algorithms from cuDNN's heuristics (_v7), or timed by cuDNN's Find where
 * FLEET_CUDNN_BENCHMARK=1 (PyTorch's cudnn.benchmark: faster, but the choice, and so the last
 * bits, may differ from run to run), chosen once per batch size (the max batch's at plan time,
 * a smaller batch's on first use), deterministic ones preferred for the backwards unless
 * set_deterministic(false) (train.deterministic: false) lets the fastest serve; bias and its
 * gradient by fleet's own kernels (fixed-order sums).
 * Weights stay in PyTorch's (OC, IC / groups, KH, KW) order: cuDNN is given an NCHW filter
 * with NHWC activations, and where it has no algorithm for that mix the plan keeps an NHWC
 * (OHWI) copy of the weights, reordered on every call, and reorders the gradient back.
 * f16 / bf16 plans (backend.h, "Low dtypes"): activations CUDNN_DATA_HALF / BFLOAT16, f32
 * compute, tensor-op math; the weights and their gradient are the f32 masters, so the plan
 * converts w into a low copy of its own on every forward and backward-data call (and reorders
 * that to OHWI where the filter is NHWC: for NHWC activations tried first, the layout of the
 * tensor-core kernels), and lets cuDNN write the low weight gradient into that copy, then
 * converts it into dw or adds it to dw in f32. */
#include "backend_private.h"

#include <cudnn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most workspace one algorithm may take (at the max batch): FLEET_CUDNN_WORKSPACE_MB, else
 * 1 GiB, and never more than 1/16 of the device's memory. The layers share one scratch (the
 * largest asked), so this bounds one buffer; PyTorch lets cuDNN's choice take what is free. */
static size_t ws_cap(void) {
    static size_t cap;
    if (cap)
        return cap;
    size_t want = (size_t)1 << 30, fr = 0, total = 0;
    const char *e = getenv("FLEET_CUDNN_WORKSPACE_MB");
    if (e && atol(e) > 0)
        want = (size_t)atol(e) << 20;
    if (cudaMemGetInfo(&fr, &total) == cudaSuccess && total / 16 < want)
        want = total / 16;
    return cap = want;
}
#define WS_CAP ws_cap()
#define NCACHE 8                   /* batch sizes whose algorithms a plan keeps */

typedef struct {
    int64_t                         n;
    cudnnConvolutionFwdAlgo_t       fwd;
    cudnnConvolutionBwdDataAlgo_t   bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t                          need; /* the workspace the three take (at most) */
    bool                            det;  /* both backward algorithms deterministic */
} algos;

struct fl_conv_plan {
    fl_conv_desc                 d;
    cudnnDataType_t              dt;   /* of the activations and the filter */
    cudnnDataType_t              ct;   /* the convolution's compute type */
    bool                         low;  /* f16 / bf16: w, dw f32 masters, the filter wlow */
    cudnnTensorFormat_t          fmt;  /* of the activations */
    cudnnTensorDescriptor_t      x, y; /* set to each call's batch */
    cudnnFilterDescriptor_t      w;
    cudnnConvolutionDescriptor_t conv;
    bool                         w_nhwc; /* the filter is NHWC: an OHWI copy in wbuf */
    void                        *wbuf;   /* OC IC/G KH KW elements of dt (reorders) */
    void                        *wlow;   /* OC IC/G KH KW elements of dt in OIHW order (low,
                                          * where it does not reorder: else wbuf serves) */
    size_t                       ws;     /* the caller's scratch (the max batch's choice) */
    void                        *xws;    /* a smaller batch's own workspace where its */
    size_t                       xws_bytes; /* deterministic algorithms need more than ws */
    algos                        cache[NCACHE];
    int                          ncache;
    bool                         nondet_warned;
};

static const char *dnn_err(cudnnStatus_t s) { return cudnnGetErrorString(s); }

#define DNN_CHECK(op, call)                                                                   \
    do {                                                                                      \
        cudnnStatus_t dnn_s_ = (call);                                                        \
        if (dnn_s_ != CUDNN_STATUS_SUCCESS)                                                   \
            cuda_fatal((op), #call, dnn_err(dnn_s_), __FILE__, __LINE__);                     \
    } while (0)

static cudnnStatus_t set_batch(fl_conv_plan *p, int64_t n) {
    const fl_conv_geom *g = &p->d.g;
    cudnnStatus_t s = cudnnSetTensor4dDescriptor(p->x, p->fmt, p->dt, (int)n, (int)g->c,
                                                 (int)g->h, (int)g->w);
    if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnSetTensor4dDescriptor(p->y, p->fmt, p->dt, (int)n, (int)p->d.oc, (int)g->oh,
                                       (int)g->ow);
    return s;
}

/* f32: TF32 tensor cores only when FLEET_CUDA_TF32=1; f16 / bf16: tensor cores are what the
 * plan is for (any math); f64: any (cuDNN has no f64 tensor-op convolution) */
static bool math_ok(const fl_conv_plan *p, cudnnMathType_t m) {
    if (p->low || p->d.dtype != FL_DTYPE_F32)
        return true;
    return cuda_g.tf32 || (m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

/* The first usable result of a heuristic query (best first): success, TF32 only if allowed,
 * deterministic where det (else any), and a workspace (asked of cuDNN for that algorithm, the
 * query's figure is only an estimate) within limit; its index into out and its workspace into
 * *ws, -1 when none. WS(algo, &bytes) is the op's cudnnGet...WorkspaceSize call. */
#define PICK(perf, cnt, limit, det, out, ws, WS)                                              \
    do {                                                                                      \
        (out) = -1;                                                                           \
        for (int pass = (det) ? 0 : 1; pass < 2 && (out) < 0; pass++)                         \
            for (int i_ = 0; i_ < (cnt) && (out) < 0; i_++) {                                 \
                size_t b_ = 0;                                                                \
                if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && math_ok(p, (perf)[i_].mathType) && \
                    (pass || (perf)[i_].determinism == CUDNN_DETERMINISTIC) &&                \
                    WS((perf)[i_].algo, &b_) == CUDNN_STATUS_SUCCESS && b_ <= (limit))        \
                    (out) = i_, *(ws) = b_;                                                   \
            }                                                                                 \
    } while (0)

/* FLEET_CUDA_CONV_LOG=1: every algorithm list choose() reads, on stderr (which algorithm, its
 * status, determinism, math, workspace and Find's time: -1 from the heuristics), to see why a
 * shape got the algorithm it got */
static bool conv_log(void) {
    static int on = -1;
    if (on < 0)
        on = getenv("FLEET_CUDA_CONV_LOG") && getenv("FLEET_CUDA_CONV_LOG")[0] == '1';
    return on;
}
#define LOG_PERF(what, perf, cnt)                                                             \
    for (int j_ = 0; conv_log() && j_ < (cnt); j_++)                                          \
    fprintf(stderr, "fleet: cuda conv %s %s %lld -> %lld %lldx%lld n %lld (limit %zu): %s "   \
            "#%d: algo %d, %s, %s, math %d, workspace %zu, %.3f ms\n",                        \
            fl_dtype_name(p->d.dtype), fl_layout_name(p->d.layout), (long long)p->d.g.c,      \
            (long long)p->d.oc, (long long)p->d.g.kh, (long long)p->d.g.kw, (long long)n,     \
            limit, what, j_, (int)(perf)[j_].algo, cudnnGetErrorString((perf)[j_].status),     \
            (perf)[j_].determinism == CUDNN_DETERMINISTIC ? "deterministic"                   \
                                                          : "non-deterministic",              \
            (int)(perf)[j_].mathType, (perf)[j_].memory, (double)(perf)[j_].time)

/* One of the three choices into `pick`: cuDNN's Find list first where FLEET_CUDNN_BENCHMARK=1
 * (timed, fastest first, with its own memory, at plan time), then the heuristics' list, also
 * where Find's has nothing usable (its trials can fail for want of memory). FIND and V7 are
 * the two queries filling perf; what names the direction in messages; returns -1 from
 * choose() with why filled when neither list has a usable algorithm. */
#define QUERY_PICK(perf, FIND, V7, det, WS, what)                                            \
    do {                                                                                      \
        pick = -1;                                                                            \
        for (int src_ = cuda_g.find ? 0 : 1; src_ < 2 && pick < 0; src_++) {                  \
            s = src_ == 0 ? (FIND) : (V7);                                                    \
            if (s != CUDNN_STATUS_SUCCESS)                                                    \
                continue;                                                                     \
            LOG_PERF(what, perf, cnt);                                                        \
            PICK(perf, cnt, limit, det, pick, &sz, WS);                                       \
        }                                                                                     \
        if (s != CUDNN_STATUS_SUCCESS) {                                                      \
            snprintf(why, whylen, "%s heuristics: %s", what, dnn_err(s));                     \
            return -1;                                                                        \
        }                                                                                     \
        if (pick < 0) {                                                                       \
            snprintf(why, whylen, "no %s algorithm (of %d) for this shape", what, cnt);       \
            return -1;                                                                        \
        }                                                                                     \
    } while (0)

/* Chooses the three algorithms for n images within limit bytes of workspace each; the largest
 * workspace they need in a->need. 0, or -1 with why filled. */
static int choose(fl_conv_plan *p, int64_t n, size_t limit, algos *a, char *why,
                  size_t whylen) {
    cudnnHandle_t h = cuda_g.dnn;
    cudnnStatus_t s = set_batch(p, n);
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(why, whylen, "tensor descriptors: %s", dnn_err(s));
        return -1;
    }
    int cnt = 0;
    size_t ws = 0, sz = 0;
#define FWD_WS(algo, bytes) cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv, p->y, algo, bytes)
#define DATA_WS(algo, bytes) cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv, p->x, algo, bytes)
#define FILTER_WS(algo, bytes) cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv, p->w, algo, bytes)
    cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int pick;
    QUERY_PICK(fp,
               cudnnFindConvolutionForwardAlgorithm(h, p->x, p->w, p->conv, p->y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &cnt, fp),
               cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv, p->y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &cnt, fp),
               false, FWD_WS, "forward");
    a->fwd = fp[pick].algo, ws = sz > ws ? sz : ws;
    QUERY_PICK(dp,
               cudnnFindConvolutionBackwardDataAlgorithm(h, p->w, p->y, p->conv, p->x,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                         &cnt, dp),
               cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, p->conv, p->x,
                                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                           &cnt, dp),
               cuda_g.det, DATA_WS, "backward-data");
    a->bwd_data = dp[pick].algo, ws = sz > ws ? sz : ws;
    bool det = dp[pick].determinism == CUDNN_DETERMINISTIC;
    QUERY_PICK(wp,
               cudnnFindConvolutionBackwardFilterAlgorithm(h, p->x, p->y, p->conv, p->w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                           &cnt, wp),
               cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                   h, p->x, p->y, p->conv, p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &cnt, wp),
               cuda_g.det, FILTER_WS, "backward-filter");
#undef FWD_WS
#undef DATA_WS
#undef FILTER_WS
    a->bwd_filter = wp[pick].algo, ws = sz > ws ? sz : ws;
    a->det = det && wp[pick].determinism == CUDNN_DETERMINISTIC;
    a->n = n;
    a->need = ws;
    return 0;
}

/* Says once per plan that a shape's backward is not bit-repeatable. */
static void warn_nondet(fl_conv_plan *p, const algos *a) {
    if (a->det || p->nondet_warned || !cuda_g.det)
        return;
    p->nondet_warned = true;
    fprintf(stderr, "fleet: cuda conv %lld -> %lld %lldx%lld (batch %lld): cuDNN offers no "
            "deterministic backward algorithm for this shape; results may vary in the last "
            "bits\n", (long long)p->d.g.c, (long long)p->d.oc, (long long)p->d.g.kh,
            (long long)p->d.g.kw, (long long)a->n);
}

static void plan_release(fl_conv_plan *p) {
    if (p->conv)
        cudnnDestroyConvolutionDescriptor(p->conv);
    if (p->w)
        cudnnDestroyFilterDescriptor(p->w);
    if (p->x)
        cudnnDestroyTensorDescriptor(p->x);
    if (p->y)
        cudnnDestroyTensorDescriptor(p->y);
    p->conv = NULL, p->w = NULL, p->x = NULL, p->y = NULL;
}

/* The convolution descriptor's math: f32 FMA (TF32 tensor ops under FLEET_CUDA_TF32=1), f16 /
 * bf16 tensor ops, f64 cuDNN's default. */
static cudnnMathType_t math_type(const fl_conv_plan *p) {
    if (p->low)
        return CUDNN_TENSOR_OP_MATH;
    if (p->d.dtype == FL_DTYPE_F32)
        return cuda_g.tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    return CUDNN_DEFAULT_MATH;
}

/* Descriptors with the filter in filter_fmt, and the max batch's algorithms. */
static int plan_setup(fl_conv_plan *p, cudnnTensorFormat_t filter_fmt, char *why, size_t whylen) {
    const fl_conv_desc *d = &p->d;
    const fl_conv_geom *g = &d->g;
    cudnnStatus_t s;
    if ((s = cudnnCreateTensorDescriptor(&p->x)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateTensorDescriptor(&p->y)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateFilterDescriptor(&p->w)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateConvolutionDescriptor(&p->conv)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetFilter4dDescriptor(p->w, p->dt, filter_fmt, (int)d->oc,
                                        (int)(g->c / d->groups), (int)g->kh, (int)g->kw)) !=
            CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetConvolution2dDescriptor(p->conv, (int)g->ph, (int)g->pw, (int)g->sh,
                                             (int)g->sw, (int)g->dh, (int)g->dw,
                                             CUDNN_CROSS_CORRELATION, p->ct)) !=
            CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetConvolutionGroupCount(p->conv, (int)d->groups)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetConvolutionMathType(p->conv, math_type(p))) != CUDNN_STATUS_SUCCESS) {
        snprintf(why, whylen, "descriptors: %s", dnn_err(s));
        return -1;
    }
    int on, oc, oh, ow;
    if ((s = set_batch(p, d->max_batch)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &on, &oc, &oh, &ow)) !=
            CUDNN_STATUS_SUCCESS) {
        snprintf(why, whylen, "descriptors: %s", dnn_err(s));
        return -1;
    }
    if (oc != d->oc || oh != g->oh || ow != g->ow) {
        snprintf(why, whylen, "cuDNN's output %dx%dx%d differs from %lldx%lldx%lld", oc, oh, ow,
                 (long long)d->oc, (long long)g->oh, (long long)g->ow);
        return -1;
    }
    if (choose(p, d->max_batch, WS_CAP, &p->cache[0], why, whylen))
        return -1;
    warn_nondet(p, &p->cache[0]);
    p->ncache = 1;
    p->ws = p->cache[0].need;
    return 0;
}

/* Whether the filter cuDNN reads is a reordered copy: an NHWC filter (OHWI) of a window larger
 * than 1x1. Of a 1x1 window OHWI and OIHW are the same array, so the weights (or their low
 * copy) serve as they are: ResNet-50 has 36 such layers of 53, three reorders each a step
 * saved (the H200 profile of 2026-11-27: 159 reorder launches, 5.7% of an f16 step). */
static bool reorders(const fl_conv_plan *p) { return p->w_nhwc && p->d.g.kh * p->d.g.kw > 1; }

/* The plan's own weight buffers, sized once: the OHWI copy where it reorders (for an f16 / bf16
 * plan the low weights rounded straight into it), else for a low plan the low copy of the f32
 * weights. 0, or -1 with why filled. */
static int plan_buffers(fl_conv_plan *p, char *why, size_t whylen) {
    const fl_conv_geom *g = &p->d.g;
    size_t nw = (size_t)(p->d.oc * (g->c / p->d.groups) * g->kh * g->kw) *
                fl_dtype_size(p->d.dtype);
    if ((reorders(p) && !(p->wbuf = cuda_alloc(nw))) ||
        (p->low && !reorders(p) && !(p->wlow = cuda_alloc(nw)))) {
        snprintf(why, whylen, "%s", fl_errmsg());
        cuda_free(p->wbuf), cuda_free(p->wlow);
        p->wbuf = p->wlow = NULL;
        return -1;
    }
    return 0;
}

fl_conv_plan *cuda_conv_plan_create(const fl_conv_desc *d) {
    const fl_conv_geom *g = &d->g;
    if (fl_conv_desc_check_low(d, "cuda conv") < 0)
        return NULL;
    int64_t big = d->max_batch * (g->c > d->oc ? g->c : d->oc) * g->h * g->w;
    if (d->max_batch > INT_MAX || g->c > INT_MAX || d->oc > INT_MAX || g->h > INT_MAX ||
        g->w > INT_MAX || big > INT_MAX) {
        fl_fail(FL_ESHAPE, "cuda conv: %lld images of %lldx%lldx%lld: beyond cuDNN's 32-bit "
                "sizes", (long long)d->max_batch, (long long)g->c, (long long)g->h,
                (long long)g->w);
        return NULL;
    }
    if (!cuda_g.bound) {
        fl_fail(FL_ESTATE, "cuda conv: plan before device_bind (bind a GPU first)");
        return NULL;
    }
    cuda_here();
    fl_conv_plan *p = calloc(1, sizeof *p);
    if (!p) {
        fl_fail(FL_ENOMEM, "cuda conv: out of memory for a plan");
        return NULL;
    }
    p->d = *d;
    p->low = d->dtype == FL_DTYPE_F16 || d->dtype == FL_DTYPE_BF16;
    p->dt = d->dtype == FL_DTYPE_F32   ? CUDNN_DATA_FLOAT
            : d->dtype == FL_DTYPE_F64 ? CUDNN_DATA_DOUBLE
            : d->dtype == FL_DTYPE_F16 ? CUDNN_DATA_HALF
                                       : CUDNN_DATA_BFLOAT16;
    p->ct = p->low ? CUDNN_DATA_FLOAT : p->dt; /* cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 */
    p->fmt = d->layout == FL_LAYOUT_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    /* the filter formats to try: NCHW (PyTorch's order, no copy), then for NHWC activations an
     * NHWC filter; a low NHWC plan the other way round (cuDNN's tensor-core kernels are
     * NHWC activations with an NHWC filter) */
    bool nhwc_first = p->low && d->layout == FL_LAYOUT_NHWC;
    cudnnTensorFormat_t fmts[2] = {nhwc_first ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   nhwc_first ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC};
    int tries = d->layout == FL_LAYOUT_NHWC ? 2 : 1;
    char why[2][256] = {"", ""};
    for (int i = 0; i < tries; i++) {
        if (!plan_setup(p, fmts[i], why[i], sizeof why[i])) {
            p->w_nhwc = fmts[i] == CUDNN_TENSOR_NHWC;
            if (!plan_buffers(p, why[i], sizeof why[i]))
                return p;
            p->w_nhwc = false;
        }
        plan_release(p);
    }
    free(p);
    fl_fail(FL_EUNSUPPORTED, "cuda conv %s %s: %lld -> %lld channels (groups %lld), %lldx%lld "
            "input, %lldx%lld window, stride %lldx%lld, dilation %lldx%lld: cuDNN%s: %s%s%s",
            fl_dtype_name(d->dtype), fl_layout_name(d->layout), (long long)g->c,
            (long long)d->oc, (long long)d->groups, (long long)g->h, (long long)g->w,
            (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw,
            (long long)g->dh, (long long)g->dw, nhwc_first ? " with an NHWC filter" : "",
            why[0],
            tries < 2 ? "" : nhwc_first ? "; with an NCHW filter: " : "; with an NHWC filter: ",
            why[1]);
    return NULL;
}

void cuda_conv_plan_free(fl_conv_plan *p) {
    if (!p)
        return;
    plan_release(p);
    cuda_free(p->wbuf);
    cuda_free(p->wlow);
    cuda_free(p->xws);
    free(p);
}

size_t cuda_conv_scratch_bytes(const fl_conv_plan *p) { return p->ws; }

/* The algorithms for n images (descriptors set to n): cached, or chosen on first use within
 * the plan's workspace; where that leaves only non-deterministic backward algorithms, as it
 * can (cuDNN's deterministic backward-filter algorithm may need workspace at a smaller batch
 * where the max batch's needed none), within WS_CAP in the plan's own workspace xws, so that
 * every batch size repeats its bits. */
static const algos *for_batch(fl_conv_plan *p, int64_t n, const char *op) {
    cuda_here();
    if (n < 1 || n > p->d.max_batch)
        cuda_fatal(op, "the batch check", "n is not in 1 .. max_batch", __FILE__, __LINE__);
    DNN_CHECK(op, set_batch(p, n));
    for (int i = 0; i < p->ncache; i++)
        if (p->cache[i].n == n)
            return &p->cache[i];
    algos a;
    char why[256];
    if (choose(p, n, p->ws, &a, why, sizeof why))
        cuda_fatal(op, "choosing cuDNN algorithms for a smaller batch", why, __FILE__, __LINE__);
    algos wide;
    if (!a.det && cuda_g.det && choose(p, n, WS_CAP, &wide, why, sizeof why) == 0 && wide.det) {
        void *m = NULL;
        if (wide.need <= p->xws_bytes) {
            a = wide;
        } else if ((m = cuda_alloc(wide.need))) {
            cuda_free(p->xws);
            p->xws = m, p->xws_bytes = wide.need;
            a = wide;
        } /* else out of memory: the non-deterministic choice stays (warned below) */
    }
    warn_nondet(p, &a);
    int slot = p->ncache < NCACHE ? p->ncache++ : NCACHE - 1; /* slot 0: the max batch */
    p->cache[slot] = a;
    DNN_CHECK(op, set_batch(p, n));
    return &p->cache[slot];
}

/* The workspace of a's algorithms: the caller's scratch, or the plan's own (for_batch). */
static void *ws_of(const fl_conv_plan *p, const algos *a, void *scratch, size_t *bytes) {
    if (a->need <= p->ws) {
        *bytes = p->ws;
        return scratch;
    }
    *bytes = p->xws_bytes;
    return p->xws;
}

/* alpha and beta in the compute type: double for f64, float for f32 and for f16 / bf16 (whose
 * compute type is float) */
typedef union {
    float  f;
    double d;
} scalar;
static scalar sc(const fl_conv_plan *p, double v) {
    scalar s;
    if (p->d.dtype == FL_DTYPE_F64)
        s.d = v;
    else
        s.f = (float)v;
    return s;
}

/* the weights as cuDNN's filter: w itself, or for a low plan w (f32) rounded to the plan's
 * dtype into wlow; then, where the filter is NHWC of a larger window than 1x1, its OHWI copy
 * (a low plan's rounded and reordered in one pass) */
static const void *filter_of(fl_conv_plan *p, const void *w) {
    const fl_conv_geom *g = &p->d.g;
    int64_t icg = g->c / p->d.groups;
    const void *f = w;
    if (p->low && reorders(p)) { /* rounded and reordered in one pass */
        cuda_f32_to_low_ohwi(p->d.dtype, w, p->wbuf, p->d.oc, icg, g->kh * g->kw);
        return p->wbuf;
    }
    if (p->low) {
        cuda_convert(FL_DTYPE_F32, w, p->d.dtype, p->wlow, p->d.oc * icg * g->kh * g->kw);
        f = p->wlow;
    }
    if (!reorders(p))
        return f;
    cuda_reorder(p->d.dtype, true, p->d.oc, icg, g->kh * g->kw, f, p->wbuf);
    return p->wbuf;
}

void cuda_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                       const void *bias, void *y, void *scratch) {
    const algos *a = for_batch(p, n, "conv_forward");
    scalar one = sc(p, 1), zero = sc(p, 0);
    const void *f = filter_of(p, w);
    size_t wsb;
    void *ws = ws_of(p, a, scratch, &wsb);
    DNN_CHECK("conv_forward",
              cudnnConvolutionForward(cuda_g.dnn, &one, p->x, x, p->w, f, p->conv, a->fwd,
                                      ws, wsb, &zero, p->y, y));
    /* a low plan: cuDNN has rounded y to the low dtype, the bias (f32) is added to that and
     * rounded again, two roundings where the reference makes one (PyTorch's cuDNN path adds
     * its bias to the rounded output too) */
    if (bias)
        cuda_add_channel_bias(p->d.dtype, p->d.layout, n, p->d.oc, p->d.g.oh * p->d.g.ow, y,
                              bias);
}

void cuda_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w, void *dx,
                             void *scratch) {
    const algos *a = for_batch(p, n, "conv_backward_data");
    scalar one = sc(p, 1), zero = sc(p, 0);
    const void *f = filter_of(p, w);
    size_t wsb;
    void *ws = ws_of(p, a, scratch, &wsb);
    DNN_CHECK("conv_backward_data",
              cudnnConvolutionBackwardData(cuda_g.dnn, &one, p->w, f, p->y, dy, p->conv,
                                           a->bwd_data, ws, wsb, &zero, p->x, dx));
}

void cuda_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                               void *dw, void *dbias, bool accumulate, void *scratch) {
    const algos *a = for_batch(p, n, "conv_backward_filter");
    const fl_conv_geom *g = &p->d.g;
    int64_t icg = g->c / p->d.groups, khw = g->kh * g->kw;
    size_t wsb;
    void *ws = ws_of(p, a, scratch, &wsb);
    if (p->low) {
        /* the low gradient into the plan's copy (OHWI in wbuf where it reorders, else OIHW in
         * wlow), then into the f32 dw (back to OIHW on the way): converted, or added with one
         * f32 add */
        scalar one = sc(p, 1), zero = sc(p, 0);
        void *out = reorders(p) ? p->wbuf : p->wlow;
        DNN_CHECK("conv_backward_filter",
                  cudnnConvolutionBackwardFilter(cuda_g.dnn, &one, p->x, x, p->y, dy, p->conv,
                                                 a->bwd_filter, ws, wsb, &zero, p->w, out));
        if (reorders(p)) /* back to OIHW and into the f32 dw in one pass */
            cuda_low_ohwi_to_f32(p->d.dtype, p->wbuf, dw, p->d.oc, icg, khw, accumulate);
        else if (accumulate)
            cuda_add_low_to_f32(p->d.dtype, p->wlow, dw, p->d.oc * icg * khw);
        else
            cuda_convert(p->d.dtype, p->wlow, FL_DTYPE_F32, dw, p->d.oc * icg * khw);
    } else {
        scalar one = sc(p, 1), beta = sc(p, accumulate ? 1 : 0);
        void *out = dw;
        if (reorders(p)) { /* into the OHWI copy (holding dw when adding), then back */
            out = p->wbuf;
            if (accumulate)
                cuda_reorder(p->d.dtype, true, p->d.oc, icg, khw, dw, out);
        }
        DNN_CHECK("conv_backward_filter",
                  cudnnConvolutionBackwardFilter(cuda_g.dnn, &one, p->x, x, p->y, dy, p->conv,
                                                 a->bwd_filter, ws, wsb, &beta, p->w, out));
        if (reorders(p))
            cuda_reorder(p->d.dtype, false, p->d.oc, icg, khw, out, dw);
    }
    /* low: dy low, dbias f32 (the double sum, rounded to f32) */
    if (dbias)
        cuda_sum_channels(p->d.dtype, p->d.layout, n, p->d.oc, g->oh * g->ow, dy, dbias,
                          accumulate);
}
