/* memory.c - what the CPU backends (cpu, ref, onednn) do for the backend's memory and streams:
 * host memory from aligned_alloc, copies as memcpy, streams and events as tokens (every kernel
 * has finished when it returns), and the NCHW <-> NHWC reorder the network runs at its edges. */
#include "backend_private.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

void *cpu_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) {
        fl_fail(FL_ENOMEM, "out of memory allocating %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, n ? n : 64);
    return p;
}

void cpu_free(void *p) { free(p); }

void cpu_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s) {
    (void)kind, (void)s;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

void cpu_fill(fl_dtype t, void *x, int64_t n, double v) {
    FL_ASSERT(t == FL_DTYPE_F32 || t == FL_DTYPE_F64);
    if (t == FL_DTYPE_F32) {
        float f = (float)v, *p = x;
        ELEMENTWISE(n, i, p[i] = f);
    } else {
        double *p = x;
        ELEMENTWISE(n, i, p[i] = v);
    }
}

/* dst[n][p][c] = src[n][c][p] (to_nhwc) or back; images in parallel, one element size at a
 * time (a copy, so any dtype of 4 or 8 bytes). */
#define STAMP_REORDER(T, S)                                                                   \
    static void reorder_##S(bool to_nhwc, int64_t n, int64_t c, int64_t hw, const T *src,     \
                            T *dst) {                                                         \
        _Pragma("omp parallel for schedule(static) if (n * c * hw >= PAR_MIN)")               \
        for (int64_t i = 0; i < n; i++) {                                                     \
            const T *s = src + i * c * hw;                                                    \
            T *d = dst + i * c * hw;                                                          \
            if (to_nhwc)                                                                      \
                for (int64_t ch = 0; ch < c; ch++)                                            \
                    for (int64_t p = 0; p < hw; p++)                                          \
                        d[p * c + ch] = s[ch * hw + p];                                       \
            else                                                                              \
                for (int64_t p = 0; p < hw; p++)                                              \
                    for (int64_t ch = 0; ch < c; ch++)                                        \
                        d[ch * hw + p] = s[p * c + ch];                                       \
        }                                                                                     \
    }
STAMP_REORDER(float, f32)
STAMP_REORDER(double, f64)

void cpu_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw, const void *src,
                 void *dst) {
    DISPATCH(t, reorder, to_nhwc, n, c, hw, src, dst);
}

/* Streams and events: one token each, never NULL, so callers need not special-case the CPU. */
static char token;
fl_stream *cpu_stream_create(void) { return (fl_stream *)&token; }
void cpu_stream_free(fl_stream *s) { (void)s; }
void cpu_stream_sync(fl_stream *s) { (void)s; }
fl_event *cpu_event_create(void) { return (fl_event *)&token; }
void cpu_event_free(fl_event *e) { (void)e; }
void cpu_event_record(fl_event *e, fl_stream *s) { (void)e, (void)s; }
void cpu_event_wait(fl_stream *s, fl_event *e) { (void)s, (void)e; }
void cpu_event_sync(fl_event *e) { (void)e; }

fl_layout cpu_nchw_only(fl_dtype t) {
    (void)t;
    return FL_LAYOUT_NCHW;
}
