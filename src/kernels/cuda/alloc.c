/* alloc.c - the cuda backend's memory: a caching device allocator (sizes rounded to size
 * classes, a free list per class, cudaMalloc only on a miss, so a training step that frees and
 * allocates the same sizes allocates nothing from the driver after warm-up; PyTorch's caching
 * allocator is the model; blocks of 1 GiB and more are not cached), memory_peak, and copies in a stream. One mutex guards it. */
#include "backend_private.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Size classes: 512-byte multiples up to 4 KiB, then 4 steps per power of two (at most 25%
 * over the request). class_size(class_of(b)) >= b. */
#define MIN_BLOCK 512
#define NCLASSES 256

static int class_of(size_t bytes) {
    if (bytes <= 4096)
        return bytes <= MIN_BLOCK ? 0 : (int)((bytes - 1) / MIN_BLOCK); /* 0..7 */
    int lg = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^lg < bytes <= 2^(lg+1) */
    size_t quarter = (size_t)1 << (lg - 2);
    int step = (int)((bytes - 1 - ((size_t)1 << lg)) / quarter); /* 0..3 */
    return 8 + (lg - 12) * 4 + step;
}

static size_t class_size(int c) {
    if (c < 8)
        return (size_t)(c + 1) * MIN_BLOCK;
    int lg = 12 + (c - 8) / 4, step = (c - 8) % 4;
    return ((size_t)1 << lg) + (size_t)(step + 1) * ((size_t)1 << (lg - 2));
}

typedef struct {
    void **p;
    size_t n, cap;
} ptr_stack;

/* live blocks: open addressing, pointer -> class (+1; 0 = empty, -1 = deleted) */
typedef struct {
    void *p;
    int cls;
} live_slot;

static struct {
    pthread_mutex_t mu;
    ptr_stack       free_list[NCLASSES];
    live_slot      *live;
    size_t          live_cap, live_used; /* used counts deleted slots too */
    size_t          held, peak;          /* bytes from cudaMalloc, cached included */
} A = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t slot_of(void *p) {
    uintptr_t h = (uintptr_t)p >> 8;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(h ^ (h >> 29));
}

static bool live_grow(void) {
    size_t cap = A.live_cap ? A.live_cap * 2 : 1024;
    live_slot *t = calloc(cap, sizeof *t);
    if (!t)
        return false;
    for (size_t i = 0; i < A.live_cap; i++)
        if (A.live[i].cls > 0) {
            size_t j = slot_of(A.live[i].p) & (cap - 1);
            while (t[j].cls)
                j = (j + 1) & (cap - 1);
            t[j] = A.live[i];
        }
    size_t used = 0;
    for (size_t i = 0; i < cap; i++)
        used += t[i].cls > 0;
    free(A.live);
    A.live = t, A.live_cap = cap, A.live_used = used;
    return true;
}

static bool live_put(void *p, int cls) {
    if ((A.live_used + 1) * 2 > A.live_cap && !live_grow())
        return false;
    size_t j = slot_of(p) & (A.live_cap - 1);
    while (A.live[j].cls > 0)
        j = (j + 1) & (A.live_cap - 1);
    if (A.live[j].cls == 0)
        A.live_used++;
    A.live[j] = (live_slot){p, cls + 1};
    return true;
}

/* the class of live block p, removed from the map; -1 when p is not one */
static int live_take(void *p) {
    if (!A.live_cap)
        return -1;
    size_t j = slot_of(p) & (A.live_cap - 1);
    while (A.live[j].cls != 0) {
        if (A.live[j].cls > 0 && A.live[j].p == p) {
            int c = A.live[j].cls - 1;
            A.live[j].cls = -1;
            return c;
        }
        j = (j + 1) & (A.live_cap - 1);
    }
    return -1;
}

static bool stack_push(ptr_stack *s, void *p) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        void **q = realloc(s->p, cap * sizeof *q);
        if (!q)
            return false;
        s->p = q, s->cap = cap;
    }
    s->p[s->n++] = p;
    return true;
}

/* Gives the driver back every cached block (before retrying a failed cudaMalloc). */
static void release_cache(void) {
    for (int c = 0; c < NCLASSES; c++) {
        ptr_stack *s = &A.free_list[c];
        for (size_t i = 0; i < s->n; i++) {
            cudaFree(s->p[i]);
            A.held -= class_size(c);
        }
        s->n = 0;
    }
}

/* A block of at least bytes, or NULL with the message set. Not zeroed. */
static void *get_block(size_t bytes) {
    int c = class_of(bytes);
    if (c >= NCLASSES) {
        fl_fail(FL_ENOMEM, "cuda: %zu bytes is beyond the allocator's largest block", bytes);
        return NULL;
    }
    size_t size = class_size(c);
    cuda_here(); /* cudaMalloc allocates on the calling thread's device */
    pthread_mutex_lock(&A.mu);
    void *p = NULL;
    ptr_stack *s = &A.free_list[c];
    if (s->n) {
        p = s->p[--s->n];
    } else {
        cudaError_t e = cudaMalloc(&p, size);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            release_cache();
            e = cudaMalloc(&p, size);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            pthread_mutex_unlock(&A.mu);
            fl_fail(FL_ENOMEM, "cuda: out of device memory allocating %zu bytes on device %d "
                    "(%zu bytes held, peak %zu): %s", bytes, cuda_g.device, A.held, A.peak,
                    cudaGetErrorString(e));
            return NULL;
        }
        A.held += size;
        if (A.held > A.peak)
            A.peak = A.held;
    }
    if (!live_put(p, c)) {
        stack_push(s, p);
        pthread_mutex_unlock(&A.mu);
        fl_fail(FL_ENOMEM, "cuda: out of host memory for the allocator's map");
        return NULL;
    }
    pthread_mutex_unlock(&A.mu);
    return p;
}

/* Blocks of at least this many bytes go back to the driver when freed instead of into the
 * cache: a network's activation block, allocated once per planning. strategy.amp plans the
 * network again in f16 / bf16 after it was built in f32, and the 7.7 GB f32 block of ResNet-50
 * at batch 64 stayed cached beside the 3.9 GB low one (14 GB held against PyTorch's 3.5 on the
 * H200, 2026-11-27). Nothing a step allocates is this large (the convolution workspace is
 * capped at 1 GiB and kept by its plan). */
#define CACHE_MAX_BYTES ((size_t)1 << 30)

static void put_block(void *p, const char *op) {
    if (!p)
        return;
    pthread_mutex_lock(&A.mu);
    int c = live_take(p);
    if (c < 0) {
        pthread_mutex_unlock(&A.mu);
        cuda_fatal(op, "free", "not a pointer the cuda backend allocated (or freed twice)",
                   __FILE__, __LINE__);
    }
    if (class_size(c) >= CACHE_MAX_BYTES || !stack_push(&A.free_list[c], p)) {
        /* too large to keep, or no host memory for the list: back to the driver (cudaFree
         * waits for the device, so no queued work still uses it) */
        cudaFree(p);
        A.held -= class_size(c);
    }
    pthread_mutex_unlock(&A.mu);
}

/* Zero-filled for any stream: the memset runs in the backend's stream, which is then waited
 * for (so work queued there that last used the block is done too). */
void *cuda_alloc(size_t bytes) {
    if (!cuda_g.bound) {
        fl_fail(FL_ESTATE, "cuda: alloc before device_bind (bind a GPU first)");
        return NULL;
    }
    void *p = get_block(bytes);
    if (!p)
        return NULL;
    if (bytes)
        CU_CHECK("alloc", cudaMemsetAsync(p, 0, bytes, cuda_stream()));
    CU_CHECK("alloc", cudaStreamSynchronize(cuda_stream()));
    return p;
}

/* The block goes back to the cache; a later alloc or op may reuse it once queued work in the
 * backend's stream is done (stream order), so free what other streams still use only after
 * waiting for them. */
void cuda_free(void *p) { put_block(p, "free"); }

void *cuda_get(size_t bytes, const char *op) {
    cuda_require_bound(op);
    void *p = get_block(bytes);
    if (!p)
        cuda_fatal(op, "scratch allocation", fl_errmsg(), __FILE__, __LINE__);
    return p;
}

void cuda_put(void *p) { put_block(p, "scratch release"); }

size_t cuda_memory_peak(void) {
    pthread_mutex_lock(&A.mu);
    size_t p = A.peak;
    pthread_mutex_unlock(&A.mu);
    return p;
}

/* Page-locked host memory: copies in a stream to and from it return at once and overlap the
 * compute (portable: usable from every thread and context). Not cached: staging buffers are
 * made once, at set-up. */
void *cuda_host_alloc(size_t bytes) {
    cuda_require_bound("host_alloc");
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fl_fail(FL_ENOMEM, "cuda backend: cannot allocate %zu bytes of page-locked host memory: "
                           "%s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

void cuda_host_free(void *p) {
    if (p)
        CU_CHECK("host_free", cudaFreeHost(p));
}

/* Asynchronous in the stream; a pageable host buffer makes cudaMemcpyAsync wait for the copy
 * (device to host) or for its staging (host to device), so such buffers may be reused at
 * once. */
void cuda_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s) {
    static const enum cudaMemcpyKind kinds[] = {
        [FL_COPY_H2H] = cudaMemcpyHostToHost, [FL_COPY_H2D] = cudaMemcpyHostToDevice,
        [FL_COPY_D2H] = cudaMemcpyDeviceToHost, [FL_COPY_D2D] = cudaMemcpyDeviceToDevice};
    if (!bytes || dst == src)
        return;
    FL_ASSERT((unsigned)kind <= FL_COPY_D2D);
    cuda_require_bound("copy");
    CU_CHECK("copy", cudaMemcpyAsync(dst, src, bytes, kinds[kind], cuda_stream_of(s)));
}
