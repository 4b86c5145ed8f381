/* onednn.c - the fl_backend_onednn() table: the cpu table with convolution and pooling replaced
 * by oneDNN primitives on f32 (channels-last preferred) and a channels-last batch norm of its
 * own, all giving the same bits for any thread count (docs/backends.md); plus the engine, the
 * per-thread streams and the small helpers the other onednn files share. f64 goes to the cpu
 * table's ops throughout (oneDNN has no f64). */
#include "onednn_impl.h"

#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dnnl_engine_t engine;
static fl_backend onednn_ops;
static pthread_once_t once = PTHREAD_ONCE_INIT;

dnnl_engine_t onednn_engine(void) { return engine; }

/* One stream per thread, destroyed when the thread exits (OpenMP's workers run convolution
 * pieces and come and go as the thread count changes): the key's destructor. */
static _Thread_local dnnl_stream_t thread_stream;
static pthread_key_t stream_key;

static void stream_destroy(void *s) { dnnl_stream_destroy(s); }

dnnl_stream_t onednn_stream(void) {
    if (!thread_stream) {
        DNNL_MUST(dnnl_stream_create(&thread_stream, engine, dnnl_stream_default_flags));
        FL_ASSERT(pthread_setspecific(stream_key, thread_stream) == 0);
    }
    return thread_stream;
}

const fl_backend *onednn_cpu(void) { return fl_backend_cpu(); }

int onednn_threads(void) { return omp_get_max_threads(); }

void onednn_must(dnnl_status_t s, const char *expr, const char *file, int line) {
    if (s == dnnl_success)
        return;
    fprintf(stderr, "%s:%d: oneDNN call failed (%s): %s\n", file, line, dnnl_status2str(s), expr);
    fl_assert_fail("oneDNN call succeeded", file, line);
}

dnnl_memory_desc_t onednn_act_md(fl_layout layout, int64_t n, int64_t c, int64_t h, int64_t w) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {n, c, h, w};
    DNNL_MUST(dnnl_memory_desc_init_by_tag(&md, 4, dims, dnnl_f32,
                                           layout == FL_LAYOUT_NHWC ? dnnl_nhwc : dnnl_nchw));
    return md;
}

dnnl_memory_desc_t onednn_vec_md(int64_t n) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {n};
    DNNL_MUST(dnnl_memory_desc_init_by_tag(&md, 1, dims, dnnl_f32, dnnl_a));
    return md;
}

void onednn_arg(onednn_args *e, int kind, const dnnl_memory_desc_t *md, const void *p) {
    FL_ASSERT(e->n < ONEDNN_MAX_ARGS);
    dnnl_memory_t m;
    DNNL_MUST(dnnl_memory_create(&m, md, engine, (void *)p));
    e->a[e->n].arg = kind;
    e->a[e->n].memory = m;
    e->n++;
}

void onednn_run(dnnl_primitive_t prim, onednn_args *e) {
    dnnl_stream_t s = onednn_stream();
    DNNL_MUST(dnnl_primitive_execute(prim, s, e->n, e->a));
    DNNL_MUST(dnnl_stream_wait(s));
    for (int i = 0; i < e->n; i++)
        dnnl_memory_destroy(e->a[i].memory);
    e->n = 0;
}

int onednn_create(dnnl_primitive_t *prim, const_dnnl_op_desc_t op, const_dnnl_primitive_attr_t attr,
                  const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd_out,
                  const char *what) {
    dnnl_primitive_desc_t pd = NULL;
    *prim = NULL;
    if (pd_out)
        *pd_out = NULL;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, op, attr, engine, hint);
    if (s != dnnl_success && !what)
        return FL_EUNSUPPORTED;
    if (s != dnnl_success)
        return fl_fail(FL_EUNSUPPORTED, "onednn: %s: no implementation (%s)", what,
                       dnnl_status2str(s));
    s = dnnl_primitive_create(prim, pd);
    if (s != dnnl_success) {
        dnnl_primitive_desc_destroy(pd);
        *prim = NULL;
        if (!what)
            return FL_EUNSUPPORTED;
        return fl_fail(FL_EUNSUPPORTED, "onednn: %s: primitive creation failed (%s)", what,
                       dnnl_status2str(s));
    }
    if (pd_out)
        *pd_out = pd;
    else
        dnnl_primitive_desc_destroy(pd);
    return 0;
}

void *onednn_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        fl_fail(FL_ENOMEM, "onednn: out of memory allocating %zu bytes", bytes);
    return p;
}

void onednn_free(void *p) { free(p); }

/* Grown to the largest request on each thread, kept for the thread's life (per-channel
 * vectors: a few KB). */
static _Thread_local void *tls_buf;
static _Thread_local size_t tls_bytes;

void *onednn_tls_buf(size_t bytes) {
    if (bytes > tls_bytes) {
        void *p = onednn_alloc(bytes);
        FL_ASSERT(p);
        onednn_free(tls_buf);
        tls_buf = p;
        tls_bytes = bytes;
    }
    return tls_buf;
}

/* --- NCHW <-> NHWC, used when the cpu table has no reorder of its own --- */

/* Transposes each of n (rows, cols) matrices into (cols, rows), in TILE x TILE blocks so that
 * both sides are read and written a cache line at a time; a pure copy, so thread-independent. */
#define TILE 32
#define STAMP_TRANSPOSE(T, S)                                                                 \
    static void transpose_##S(int64_t n, int64_t rows, int64_t cols, const T *src, T *dst) {  \
        int64_t rt = (rows + TILE - 1) / TILE, ct = (cols + TILE - 1) / TILE;                 \
        _Pragma("omp parallel for collapse(2) schedule(static) if (n * rows * cols >= 32768)") \
        for (int64_t b = 0; b < n; b++) {                                                     \
            for (int64_t t = 0; t < rt * ct; t++) {                                           \
                int64_t r0 = t / ct * TILE, c0 = t % ct * TILE;                               \
                int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;                             \
                int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;                             \
                const T *s = src + b * rows * cols;                                           \
                T *d = dst + b * rows * cols;                                                 \
                for (int64_t c = c0; c < c1; c++)                                             \
                    for (int64_t r = r0; r < r1; r++)                                         \
                        d[c * rows + r] = s[r * cols + c];                                    \
            }                                                                                 \
        }                                                                                     \
    }
STAMP_TRANSPOSE(float, f32)
STAMP_TRANSPOSE(double, f64)

static void onednn_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                           const void *src, void *dst) {
    /* NCHW -> NHWC transposes each image's (C, HW) into (HW, C); the way back, (HW, C) */
    int64_t rows = to_nhwc ? c : hw, cols = to_nhwc ? hw : c;
    if (t == FL_DTYPE_F32)
        transpose_f32(n, rows, cols, src, dst);
    else if (t == FL_DTYPE_F64)
        transpose_f64(n, rows, cols, src, dst);
    else
        FL_ASSERT(!"onednn reorder: dtype must be f32 or f64");
}

static fl_layout onednn_preferred_layout(fl_dtype t) {
    /* direct (brgconv / jit avx512) convolutions on nhwc run 3-12x faster than the gemm
     * path oneDNN takes on nchw; f64 runs on the cpu table, which is NCHW only */
    return t == FL_DTYPE_F32 ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
}

static void init(void) {
    if (pthread_key_create(&stream_key, stream_destroy) != 0 ||
        dnnl_engine_get_count(dnnl_cpu) < 1 ||
        dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        engine = NULL;
        return;
    }
    onednn_ops = *fl_backend_cpu();
    onednn_ops.name = "onednn";
    onednn_ops.preferred_layout = onednn_preferred_layout;
    if (!onednn_ops.reorder)
        onednn_ops.reorder = onednn_reorder;
    onednn_ops.conv_plan_create = onednn_conv_plan_create;
    onednn_ops.conv_plan_free = onednn_conv_plan_free;
    onednn_ops.conv_scratch_bytes = onednn_conv_scratch_bytes;
    onednn_ops.conv_forward = onednn_conv_forward;
    onednn_ops.conv_backward_data = onednn_conv_backward_data;
    onednn_ops.conv_backward_filter = onednn_conv_backward_filter;
    onednn_ops.pool_forward = onednn_pool_forward;
    onednn_ops.pool_backward = onednn_pool_backward;
    onednn_ops.bn_forward = onednn_bn_forward;
    onednn_ops.bn_backward = onednn_bn_backward;
    /* the im2col building blocks are NCHW-only parts of the cpu convolution, not ours */
}

const fl_backend *fl_backend_onednn(void) {
    pthread_once(&once, init);
    return engine ? &onednn_ops : NULL;
}
