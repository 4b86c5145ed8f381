/* cuda.c - the fl_backend_cuda() table: binding the device (stream, cuBLAS and cuDNN handles,
 * made once by device_bind, into context.c's context), streams and events as real
 * cudaStream_t / cudaEvent_t, and the table's low_dtypes, opt-in (FLEET_CUDA_LOW_DTYPES=1) until
 * its f16 / bf16 ops have passed on a GPU. The ops live in the files beside it
 * (backend_private.h). */
#include "backend_private.h"
#include "cublas_load.h"

#include <cublas_v2.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- device_bind --- */

#define CUBLAS_WORKSPACE (32u << 20) /* cuBLAS's workspace, ours so no cudaMalloc in a step */

static void release(cudaStream_t st, cublasHandle_t blas, cudnnHandle_t dnn, void *ws) {
    if (dnn)
        cudnnDestroy(dnn);
    if (blas)
        cuda_cublas.cublasDestroy(blas);
    if (ws)
        cuda_free(ws);
    if (st)
        cudaStreamDestroy(st);
}

/* cuBLAS's math mode: TF32 for f32 only under FLEET_CUDA_TF32=1; and for the f16 / bf16 gemm
 * (cublasGemmEx, f32 compute) split-K partial sums reduced in f32, not in the 2-byte output
 * type, which cuBLAS otherwise may do (PyTorch's allow_fp16_reduced_precision_reduction) and
 * which would round the sum more than once (gemm.c; the flag touches no f32 / f64 routine). */
static cublasMath_t math_mode(void) {
    int m = cuda_g.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    return (cublasMath_t)(m | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

static int cuda_device_bind(int ordinal) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fl_fail(FL_EIO,
                       "CUDA device %d: no CUDA device: cudaGetDeviceCount says %s (%s); a GPU "
                       "and its driver are needed for the cuda backend",
                       ordinal, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (count == 0)
        return fl_fail(FL_EIO, "CUDA device %d: no CUDA device: cudaGetDeviceCount says 0 "
                       "devices", ordinal);
    if (ordinal < 0 || ordinal >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return fl_fail(FL_EINVAL,
                       "CUDA device %d does not exist: %d device(s) visible (ordinals 0 to %d; "
                       "CUDA_VISIBLE_DEVICES=%s)",
                       ordinal, count, count - 1, vis ? vis : "(unset)");
    }
    if (cuda_g.bound) {
        if (ordinal == cuda_g.device)
            return FL_OK;
        return fl_fail(FL_EINVAL, "CUDA device %d: this process is already bound to device %d "
                       "(one device per process)", ordinal, cuda_g.device);
    }
    e = cudaSetDevice(ordinal);
    if (e != cudaSuccess)
        return fl_fail(FL_EIO, "CUDA device %d of %d: cudaSetDevice: %s", ordinal, count,
                       cudaGetErrorString(e));
    cuda_tl_device = ordinal;
    cudaStream_t st = NULL;
    cublasHandle_t blas = NULL;
    cudnnHandle_t dnn = NULL;
    void *ws = NULL;
    const char *call = "";
    char why[256] = "";
    if ((e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking)) != cudaSuccess) {
        call = "cudaStreamCreate", snprintf(why, sizeof why, "%s", cudaGetErrorString(e));
        goto fail;
    }
    cuda_g.stream = st; /* the allocator's memset runs in it */
    cuda_g.device = ordinal;
    cuda_g.bound = true;
    const char *tf = getenv("FLEET_CUDA_TF32");
    cuda_g.tf32 = tf && tf[0] == '1';
    const char *find = getenv("FLEET_CUDNN_BENCHMARK");
    cuda_g.find = find && find[0] == '1';
    const char *det = getenv("FLEET_CUDNN_DETERMINISTIC");
    cuda_g.det = !(det && det[0] == '0');
    if (cuda_cublas_load() != FL_OK) {
        call = "cuBLAS", snprintf(why, sizeof why, "%s", fl_errmsg());
        goto fail;
    }
    const cuda_cublas_api *cb = &cuda_cublas;
    cublasStatus_t bs;
    if ((bs = cb->cublasCreate(&blas)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cb->cublasSetStream(blas, st)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cb->cublasSetMathMode(blas, math_mode())) != CUBLAS_STATUS_SUCCESS) {
        call = "cuBLAS set-up", snprintf(why, sizeof why, "%s", cb->cublasGetStatusString(bs));
        goto fail;
    }
    ws = cuda_alloc(CUBLAS_WORKSPACE);
    if (!ws) {
        call = "the cuBLAS workspace", snprintf(why, sizeof why, "%s", fl_errmsg());
        goto fail;
    }
    if ((bs = cb->cublasSetWorkspace(blas, ws, CUBLAS_WORKSPACE)) != CUBLAS_STATUS_SUCCESS) {
        call = "cublasSetWorkspace",
        snprintf(why, sizeof why, "%s", cb->cublasGetStatusString(bs));
        goto fail;
    }
    cudnnStatus_t ds;
    if ((ds = cudnnCreate(&dnn)) != CUDNN_STATUS_SUCCESS ||
        (ds = cudnnSetStream(dnn, st)) != CUDNN_STATUS_SUCCESS) {
        call = "cuDNN set-up", snprintf(why, sizeof why, "%s", cudnnGetErrorString(ds));
        goto fail;
    }
    cuda_g.blas = blas;
    cuda_g.dnn = dnn;
    return FL_OK;
fail:
    release(st, blas, dnn, ws);
    memset(&cuda_g, 0, sizeof cuda_g);
    cuda_tl_device = -1;
    return fl_fail(FL_EIO, "CUDA device %d of %d: %s: %s", ordinal, count, call, why);
}

/* --- streams and events --- */

static fl_stream *cuda_stream_create(void) {
    cuda_require_bound("stream_create");
    cuda_here();
    cudaStream_t s;
    CU_CHECK("stream_create", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return (fl_stream *)s;
}

static void cuda_stream_free(fl_stream *s) {
    if (s) {
        cuda_here();
        CU_CHECK("stream_free", cudaStreamDestroy((cudaStream_t)s));
    }
}

static void cuda_stream_sync(fl_stream *s) {
    CU_CHECK("stream_sync", cudaStreamSynchronize(cuda_stream_of(s)));
}

static fl_event *cuda_event_create(void) {
    cuda_require_bound("event_create");
    cuda_here();
    cudaEvent_t e;
    CU_CHECK("event_create", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (fl_event *)e;
}

static void cuda_event_free(fl_event *e) {
    if (e) {
        cuda_here();
        CU_CHECK("event_free", cudaEventDestroy((cudaEvent_t)e));
    }
}

static void cuda_event_record(fl_event *e, fl_stream *s) {
    CU_CHECK("event_record", cudaEventRecord((cudaEvent_t)e, cuda_stream_of(s)));
}

static void cuda_event_wait(fl_stream *s, fl_event *e) {
    CU_CHECK("event_wait", cudaStreamWaitEvent(cuda_stream_of(s), (cudaEvent_t)e, 0));
}

static void cuda_event_sync(fl_event *e) {
    cuda_here();
    CU_CHECK("event_sync", cudaEventSynchronize((cudaEvent_t)e));
}

static int cuda_bound_device(void **stream) {
    if (stream)
        *stream = cuda_g.bound ? (void *)cuda_g.stream : NULL;
    return cuda_g.bound ? cuda_g.device : -1;
}

static void cuda_set_deterministic(bool on) {
    cuda_require_bound("set_deterministic");
    cuda_g.det = on;
}

/* f32 and f64 convolutions run on NCHW (cuDNN's FMA kernels are as fast there); f16 and bf16
 * channels-last, the layout of cuDNN's tensor-core kernels (they transpose NCHW tensors around
 * every call). FLEET_CUDA_NHWC=1 asks for NHWC in f32 too, to measure it with TF32 (cuDNN's
 * TF32 kernels are NHWC and transpose NCHW tensors: 9% of a TF32 ResNet-50 step on an H200,
 * bench/RESULTS.md) before it becomes a default. */
static fl_layout cuda_preferred_layout(fl_dtype t) {
    if (t == FL_DTYPE_F16 || t == FL_DTYPE_BF16)
        return FL_LAYOUT_NHWC;
    const char *e = getenv("FLEET_CUDA_NHWC");
    return t == FL_DTYPE_F32 && e && e[0] == '1' ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
}

/* Not const: fl_backend_cuda() sets low_dtypes from the environment once (below). */
static fl_backend cuda_ops = {
    .name = "cuda",
    .host_memory = false,
    .preferred_layout = cuda_preferred_layout,
    /* Every low op is written (fill, reorder, gemm through cublasGemmEx, bias, activations,
     * axpy, scale, sums, the convolution plans on cuDNN's f16 / bf16 kernels with the f32
     * master weights, pooling, batch norm, the residual add, dropout, the channel ops: f16 /
     * bf16 storage computed in float) and so is convert, and the table takes them whatever this
     * flag says; but they have not yet run on a GPU, so low_dtypes (which makes a network keep
     * its activations low: strategy.amp) stays false unless FLEET_CUDA_LOW_DTYPES=1, until
     * test_cuda_backend's low cases (test_low_*) pass on one (docs/amp.md, "Real f16 / bf16 on
     * the GPU"). */
    .low_dtypes = false,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .convert = cuda_convert, /* ahead of low_dtypes, for the tests */
    .reorder = cuda_reorder,
    .stream_create = cuda_stream_create,
    .stream_free = cuda_stream_free,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_sync = cuda_event_sync,
    .gemm = cuda_gemm,
    .add_bias = cuda_add_bias,
    .sum_rows = cuda_sum_rows,
    .act_forward = cuda_act_forward,
    .act_backward = cuda_act_backward,
    .axpy = cuda_axpy,
    .scale = cuda_scale,
    .amp_round = cuda_amp_round,
    .sum = cuda_sum,
    .sumsq = cuda_sumsq,
    .softmax_xent_forward = cuda_softmax_xent_forward,
    .softmax_xent_backward = cuda_softmax_xent_backward,
    .sgd_update = cuda_sgd_update,
    .momentum_update = cuda_momentum_update,
    .conv_plan_create = cuda_conv_plan_create,
    .conv_plan_free = cuda_conv_plan_free,
    .conv_scratch_bytes = cuda_conv_scratch_bytes,
    .conv_forward = cuda_conv_forward,
    .conv_backward_data = cuda_conv_backward_data,
    .conv_backward_filter = cuda_conv_backward_filter,
    .pool_forward = cuda_pool_forward,
    .pool_backward = cuda_pool_backward,
    .bn_forward = cuda_bn_forward,
    .bn_backward = cuda_bn_backward,
    .bn_running = cuda_bn_running,
    .lars_update_run = cuda_lars_update_run,
    .add_forward = cuda_add_forward,
    .add_backward = cuda_add_backward,
    .dropout_mask = cuda_dropout_mask,
    .channel_pad = cuda_channel_pad,
    .channel_mul_forward = cuda_channel_mul_forward,
    .channel_mul_backward = cuda_channel_mul_backward,
    .channel_slice = cuda_channel_slice,
    .xent_smooth_term = cuda_xent_smooth_term,
    .xent_smooth_backward = cuda_xent_smooth_backward,
    .dgc_accumulate = cuda_dgc_accumulate,
    .dgc_select_exact = cuda_dgc_select_exact,
    .dgc_accumulate_select = cuda_dgc_accumulate_select,
    .dgc_accumulate_select_batch = cuda_dgc_accumulate_select_batch,
    .dgc_encode = cuda_dgc_encode,
    .dgc_scatter_add = cuda_dgc_scatter_add,
    .dgc_apply_pairs = cuda_dgc_apply_pairs,
    .dgc_apply_dense = cuda_dgc_apply_dense,
    .device_bind = cuda_device_bind,
    .memory_peak = cuda_memory_peak,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .set_deterministic = cuda_set_deterministic,
    .bound_device = cuda_bound_device,
};

static pthread_once_t low_once = PTHREAD_ONCE_INIT;

static void read_low_dtypes(void) {
    const char *e = getenv("FLEET_CUDA_LOW_DTYPES");
    cuda_ops.low_dtypes = e && e[0] == '1';
}

/* The table, its low_dtypes read from FLEET_CUDA_LOW_DTYPES on the first call (pthread_once:
 * every caller sees the same table, the variable read once per process). */
const fl_backend *fl_backend_cuda(void) {
    pthread_once(&low_once, read_low_dtypes);
    return &cuda_ops;
}
