/* devsim.c - the guarded device stand-in (devsim.h): the cpu table (or the ref table, under
 * FLEET_DEVSIM_TABLE=ref, for its low dtypes) behind wrappers that check
 * each data pointer is backend memory, open the allocations those pointers are in (PROT_READ |
 * PROT_WRITE) for the duration of the cpu kernel and close them again (PROT_NONE). Host code
 * touching backend memory between table calls faults; the SIGSEGV handler says which
 * allocation it was. Only the pages the arguments span are opened (a kernel reads and writes
 * nothing else; opening every allocation made each call cost tens of mprotects, and opening
 * an argument's whole allocation a walk over all its pages). Serialised by
 * one recursive mutex: the table is called from the training thread, and a comm thread that
 * touched backend memory would fault, which is the point. */
#define _GNU_SOURCE
#include "devsim.h"

#include "fleet/status.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BT_DEPTH 24

typedef struct {
    char  *base;
    size_t size;   /* bytes asked for */
    size_t mapped; /* whole pages */
    void  *bt[BT_DEPTH];
    int    nbt;
} region;

static pthread_mutex_t lock;
static region *regions; /* sorted by base */
static int     nregions, cap;
static int     depth; /* table calls in progress (under lock) */
/* the allocations the call being prepared reads or writes (dev() adds them; the calling
 * thread's, as the checks run before the lock is taken) */
#define MAX_OPEN 64
static __thread struct {
    int   n;
    char *base[MAX_OPEN];
    size_t len[MAX_OPEN];
} pending;
static size_t  live, peak, page;
static int     bound = -1;
static fl_backend table;

/* --- the registry --- */

/* index of the region holding p, or -1 */
static int find(const void *p) {
    int lo = 0, hi = nregions - 1;
    const char *c = p;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (c < regions[mid].base)
            hi = mid - 1;
        else if (c >= regions[mid].base + regions[mid].mapped)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

static void say(const char *s) {
    ssize_t w = write(STDERR_FILENO, s, strlen(s));
    (void)w;
}

static void protect_pending(int prot) {
    for (int i = 0; i < pending.n; i++)
        if (mprotect(pending.base[i], pending.len[i], prot) != 0) {
            perror("devsim: mprotect");
            abort();
        }
}

/* the kernel may now touch the allocations its arguments are in */
static void enter(void) {
    pthread_mutex_lock(&lock);
    if (depth++ == 0)
        protect_pending(PROT_READ | PROT_WRITE);
}

static void leave(void) {
    if (--depth == 0) {
        protect_pending(PROT_NONE);
        pending.n = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* dev()'s size for an argument whose extent the wrapper does not work out (a convolution's
 * arrays: the plan knows them): its whole allocation is opened, only its start checked */
#define SPAN_UNKNOWN SIZE_MAX

/* Opens for the call the pages of bytes [p, p + bytes) (within one allocation): a kernel
 * touches only what its arguments span, and opening a whole large allocation (a batch, an
 * arena) cost every call one page-table walk over all of it. */
static void add_pending(const void *p, size_t bytes) {
    uintptr_t lo = (uintptr_t)p / page * page;
    uintptr_t hi = ((uintptr_t)p + bytes + page - 1) / page * page;
    if (bytes == SPAN_UNKNOWN) { /* the whole allocation */
        const region *r = &regions[find(p)];
        lo = (uintptr_t)r->base;
        hi = lo + r->mapped;
    }
    for (int i = 0; i < pending.n; i++) {
        uintptr_t b = (uintptr_t)pending.base[i], e = b + pending.len[i];
        if (lo >= b && hi <= e)
            return;
        if (lo <= e && hi >= b) { /* overlapping or adjacent: one range covering both */
            lo = lo < b ? lo : b;
            hi = hi > e ? hi : e;
            pending.base[i] = (char *)lo;
            pending.len[i] = hi - lo;
            return;
        }
    }
    if (pending.n == MAX_OPEN) {
        say("devsim: more than 64 ranges in one call\n");
        abort();
    }
    pending.base[pending.n] = (char *)lo;
    pending.len[pending.n++] = hi - lo;
}

/* A table function was given memory on the wrong side: says which and aborts. */
static void misuse(const char *fn, const char *arg, const void *p, const char *what) {
    char buf[512];
    snprintf(buf, sizeof buf, "devsim: %s: argument %s (%p) %s\ndevsim: called from:\n", fn,
             arg, p, what);
    say(buf);
    void *bt[BT_DEPTH];
    backtrace_symbols_fd(bt, backtrace(bt, BT_DEPTH), STDERR_FILENO);
    abort();
}

/* Argument arg of fn must be `bytes` of backend memory (nothing to check when bytes is 0). */
static void dev(const char *fn, const char *arg, const void *p, size_t bytes) {
    if (bytes == 0)
        return;
    pthread_mutex_lock(&lock);
    int i = p ? find(p) : -1;
    bool fits = i >= 0 && (bytes == SPAN_UNKNOWN ||
                           (const char *)p + bytes <= regions[i].base + regions[i].size);
    if (fits)
        add_pending(p, bytes);
    pthread_mutex_unlock(&lock);
    if (i < 0)
        misuse(fn, arg, p, "is not backend memory: the host passed its own memory to the device "
                           "(copy it there first)");
    if (!fits) {
        char what[160];
        snprintf(what, sizeof what, "+ %zu bytes runs past its allocation's end", bytes);
        misuse(fn, arg, p, what);
    }
}

/* Argument arg of fn is host memory (metadata, scalars' homes): it must not be backend memory. */
static void host(const char *fn, const char *arg, const void *p) {
    if (p && fl_devsim_owns(p))
        misuse(fn, arg, p, "is backend memory, but this argument is host memory (backend.h's "
                           "memory rule)");
}

bool fl_devsim_owns(const void *p) {
    pthread_mutex_lock(&lock);
    bool in = find(p) >= 0;
    pthread_mutex_unlock(&lock);
    return in;
}

size_t fl_devsim_live_bytes(void) {
    pthread_mutex_lock(&lock);
    size_t n = live;
    pthread_mutex_unlock(&lock);
    return n;
}

int fl_devsim_live_count(void) {
    pthread_mutex_lock(&lock);
    int n = nregions;
    pthread_mutex_unlock(&lock);
    return n;
}

int fl_devsim_bound(void) { return bound; }

/* --- the SIGSEGV handler: which allocation the host touched --- */

static void on_segv(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    int i = find(si->si_addr); /* no lock: the process is going down */
    if (i < 0) { /* not ours: the default action, on return the access faults again */
        signal(sig, SIG_DFL);
        return;
    }
    char buf[512];
    region *r = &regions[i];
    snprintf(buf, sizeof buf,
             "devsim: the host touched backend memory at %p, byte %zu of an allocation of %zu "
             "bytes at %p, outside the backend's functions: copy it to the host with the "
             "table's copy (FL_COPY_D2H), or compute it with a table function\n"
             "devsim: the access, from:\n",
             si->si_addr, (size_t)((char *)si->si_addr - r->base), r->size, (void *)r->base);
    say(buf);
    void *bt[BT_DEPTH];
    backtrace_symbols_fd(bt, backtrace(bt, BT_DEPTH), STDERR_FILENO);
    say("devsim: the allocation, made at:\n");
    backtrace_symbols_fd(r->bt, r->nbt, STDERR_FILENO);
    say("devsim: (static functions show as program+0xOFFSET: addr2line -f -e PROGRAM 0xOFFSET "
        "names them)\n");
    signal(SIGABRT, SIG_DFL);
    abort();
}

/* --- memory --- */

static void *ds_alloc(size_t bytes) {
    size_t mapped = (bytes + page - 1) / page * page;
    if (mapped == 0)
        mapped = page;
    void *p = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fl_fail(FL_ENOMEM, "devsim: cannot map %zu bytes", bytes);
        return NULL;
    }
    region r = {.base = p, .size = bytes, .mapped = mapped};
    r.nbt = backtrace(r.bt, BT_DEPTH);
    pthread_mutex_lock(&lock);
    if (nregions == cap) {
        int ncap = cap ? 2 * cap : 64;
        region *nr = realloc(regions, (size_t)ncap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&lock);
            munmap(p, mapped);
            fl_fail(FL_ENOMEM, "devsim: out of memory");
            return NULL;
        }
        regions = nr;
        cap = ncap;
    }
    int at = nregions;
    while (at > 0 && regions[at - 1].base > r.base)
        at--;
    memmove(regions + at + 1, regions + at, (size_t)(nregions - at) * sizeof *regions);
    regions[at] = r;
    nregions++;
    live += bytes;
    peak = live > peak ? live : peak;
    pthread_mutex_unlock(&lock);
    return p;
}

static void check_unqueued(const char *base, size_t len);

static void ds_free(void *p) {
    if (!p)
        return;
    pthread_mutex_lock(&lock);
    int i = find(p);
    if (i < 0 || regions[i].base != p) {
        pthread_mutex_unlock(&lock);
        misuse("free", "p", p, "is not an allocation of this backend");
    }
    check_unqueued(regions[i].base, regions[i].size);
    munmap(regions[i].base, regions[i].mapped);
    live -= regions[i].size;
    memmove(regions + i, regions + i + 1, (size_t)(nregions - i - 1) * sizeof *regions);
    nregions--;
    pthread_mutex_unlock(&lock);
}

/* the table whose kernels run: cpu, or ref under FLEET_DEVSIM_TABLE=ref (set by init) */
static const fl_backend *under;

/* Checks a copy's pointers and opens them for the next enter(). */
static void copy_args(void *dst, const void *src, size_t bytes, fl_copy_kind kind) {
    static const char *const names[] = {"copy H2H", "copy H2D", "copy D2H", "copy D2D"};
    const char *fn = (unsigned)kind < 4 ? names[kind] : "copy";
    bool ddst = kind == FL_COPY_H2D || kind == FL_COPY_D2D;
    bool dsrc = kind == FL_COPY_D2H || kind == FL_COPY_D2D;
    if (!bytes)
        return;
    if (ddst)
        dev(fn, "dst", dst, bytes);
    else
        host(fn, "dst", dst);
    if (dsrc)
        dev(fn, "src", src, bytes);
    else
        host(fn, "src", src);
}

static void run_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind) {
    copy_args(dst, src, bytes, kind);
    enter();
    under->copy(dst, src, bytes, kind, NULL);
    leave();
}

/* --- streams and events: the default stream (NULL) runs every call at once, as the cpu
 * table does; a stream of stream_create runs nothing until the host or the default stream
 * waits for it. Its copies are queued and done, reading their source then, only when an
 * event recorded after them is waited for (event_sync, event_wait) or the stream is synced.
 * A device runs them at some moment in between; the latest moment is the one that exposes a
 * missing wait: a host buffer read before its copy was waited for holds stale data, a source
 * changed before the copy ran gives the changed data. Freeing memory a queued copy still
 * uses aborts. --- */

typedef struct ds_stream ds_stream;
typedef struct {
    bool          wait;  /* a wait for stream `on` up to `upto`, else a copy */
    void         *dst;
    const void   *src;
    size_t        bytes;
    fl_copy_kind  kind;
    ds_stream    *on;
    uint64_t      upto;
} ds_op;

struct ds_stream {
    ds_op     *ops;      /* queued: ops[head .. n) are numbers first + head .. first + n - 1 */
    size_t     head, n, cap;
    uint64_t   first;
    int        refs;     /* the handle (until stream_free) and the events recorded in it */
    ds_stream *next;     /* all streams with references, for free's check */
};

typedef struct {
    ds_stream *s; /* NULL: complete (recorded in the default stream, or never) */
    uint64_t   upto;
} ds_event;

static ds_stream *streams;

static void stream_unref(ds_stream *s) {
    if (!s || --s->refs > 0)
        return;
    for (ds_stream **pp = &streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    free(s->ops);
    free(s);
}

/* Runs s's queued work numbered below upto (everything: UINT64_MAX), under lock. */
static void flush(ds_stream *s, uint64_t upto) {
    while (s && s->head < s->n && s->first + s->head < upto) {
        ds_op op = s->ops[s->head++];
        if (op.wait) {
            flush(op.on, op.upto);
            stream_unref(op.on);
        } else {
            run_copy(op.dst, op.src, op.bytes, op.kind);
        }
    }
    if (s && s->head == s->n) {
        s->first += s->n;
        s->head = s->n = 0;
    }
}

static void push(ds_stream *s, ds_op op) {
    if (s->n == s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 16;
        ds_op *no = realloc(s->ops, ncap * sizeof *no);
        if (!no) {
            say("devsim: out of memory queueing stream work\n");
            abort();
        }
        s->ops = no;
        s->cap = ncap;
    }
    s->ops[s->n++] = op;
}

static void ds_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind, fl_stream *s) {
    if (!s || !bytes) {
        run_copy(dst, src, bytes, kind);
        return;
    }
    copy_args(dst, src, bytes, kind); /* named now, at the call that is wrong */
    pthread_mutex_lock(&lock);
    if (depth == 0)
        pending.n = 0; /* opened when the copy runs */
    push((ds_stream *)s, (ds_op){.dst = dst, .src = src, .bytes = bytes, .kind = kind});
    pthread_mutex_unlock(&lock);
}

/* A zeroed handle; out of memory ends the process (cudaStreamCreate and cudaEventCreate's
 * callers here have no error path). `what` completes "devsim: out of memory for ...". */
static void *handle_alloc(size_t bytes, const char *what) {
    void *h = calloc(1, bytes);
    if (!h) {
        say("devsim: out of memory for ");
        say(what);
        say("\n");
        abort();
    }
    return h;
}

static fl_stream *ds_stream_create(void) {
    ds_stream *s = handle_alloc(sizeof *s, "a stream");
    s->refs = 1;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&lock);
    return (fl_stream *)s;
}

/* As cudaStreamDestroy: queued work still completes (here: now). */
static void ds_stream_free(fl_stream *fs) {
    pthread_mutex_lock(&lock);
    flush((ds_stream *)fs, UINT64_MAX);
    stream_unref((ds_stream *)fs);
    pthread_mutex_unlock(&lock);
}

static void ds_stream_sync(fl_stream *fs) {
    pthread_mutex_lock(&lock);
    flush((ds_stream *)fs, UINT64_MAX);
    pthread_mutex_unlock(&lock);
}

static fl_event *ds_event_create(void) {
    return handle_alloc(sizeof(ds_event), "an event");
}

static void ds_event_free(fl_event *fe) {
    ds_event *e = (ds_event *)fe;
    if (!e)
        return;
    pthread_mutex_lock(&lock);
    stream_unref(e->s);
    pthread_mutex_unlock(&lock);
    free(e);
}

static void ds_event_record(fl_event *fe, fl_stream *fs) {
    ds_event *e = (ds_event *)fe;
    ds_stream *s = (ds_stream *)fs;
    pthread_mutex_lock(&lock);
    stream_unref(e->s);
    e->s = s && s->head < s->n ? s : NULL; /* nothing queued: complete already */
    if (e->s) {
        e->s->refs++;
        e->upto = s->first + s->n;
    }
    pthread_mutex_unlock(&lock);
}

/* The default stream waits by running the work now; a stream queues the wait. */
static void ds_event_wait(fl_stream *fs, fl_event *fe) {
    ds_event *e = (ds_event *)fe;
    ds_stream *s = (ds_stream *)fs;
    pthread_mutex_lock(&lock);
    if (!s) {
        flush(e->s, e->upto);
    } else if (e->s && e->s != s) {
        e->s->refs++;
        push(s, (ds_op){.wait = true, .on = e->s, .upto = e->upto});
    }
    pthread_mutex_unlock(&lock);
}

static void ds_event_sync(fl_event *fe) {
    ds_event *e = (ds_event *)fe;
    pthread_mutex_lock(&lock);
    flush(e->s, e->upto);
    pthread_mutex_unlock(&lock);
}

/* Aborts when a queued copy reads or writes [base, base + len). */
static void check_unqueued(const char *base, size_t len) {
    for (ds_stream *s = streams; s; s = s->next)
        for (size_t i = s->head; i < s->n; i++) {
            const ds_op *op = &s->ops[i];
            if (op->wait)
                continue;
            const char *d = op->dst, *c = op->src;
            if ((d < base + len && d + op->bytes > base) ||
                (c < base + len && c + op->bytes > base)) {
                pthread_mutex_unlock(&lock);
                misuse("free", "p", base, "is used by a copy still queued in a stream (sync the "
                                          "stream or an event after the copy first)");
            }
        }
}

static size_t es(fl_dtype t) { return fl_dtype_size(t); }
/* the element size of what stays f32 when t is a low dtype (biases, batch norm's scale and
 * shift and their gradients; backend.h "Low dtypes"), else of t */
static size_t side(fl_dtype t) {
    return t == FL_DTYPE_F16 || t == FL_DTYPE_BF16 ? sizeof(float) : es(t);
}
static size_t nb(int64_t n, size_t size) { return n > 0 ? (size_t)n * size : 0; }
/* extent of a (rows, cols) matrix with leading dimension ld */
static size_t mat(int64_t rows, int64_t cols, int64_t ld, size_t size) {
    return rows > 0 && cols > 0 ? ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * size : 0;
}

/* Wraps a void table function: checks, then the kernel with memory open. */
#define RUN(call)                                                                              \
    do {                                                                                       \
        enter();                                                                               \
        under->call;                                                                           \
        leave();                                                                               \
    } while (0)
#define RUN_RET(type, call)                                                                    \
    do {                                                                                       \
        enter();                                                                               \
        type r_ = under->call;                                                                 \
        leave();                                                                               \
        return r_;                                                                             \
    } while (0)

static void ds_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n) {
    dev("convert", "src", src, nb(n, es(from)));
    dev("convert", "dst", dst, nb(n, es(to)));
    RUN(convert(from, src, to, dst, n));
}

static void ds_fill(fl_dtype t, void *x, int64_t n, double v) {
    dev("fill", "x", x, nb(n, es(t)));
    RUN(fill(t, x, n, v));
}

static void ds_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                       const void *src, void *dst) {
    size_t b = nb(n * c * hw, es(t));
    dev("reorder", "src", src, b);
    dev("reorder", "dst", dst, b);
    RUN(reorder(t, to_nhwc, n, c, hw, src, dst));
}

static void ds_gemm(fl_dtype t, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                    double beta, void *c, int64_t ldc) {
    size_t s = es(t);
    if (m > 0 && n > 0) {
        dev("gemm", "a", a, ta ? mat(k, m, lda, s) : mat(m, k, lda, s));
        dev("gemm", "b", b, tb ? mat(n, k, ldb, s) : mat(k, n, ldb, s));
    }
    dev("gemm", "c", c, mat(m, n, ldc, s));
    RUN(gemm(t, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

static void ds_add_bias(fl_dtype t, void *y, const void *bias, int64_t rows, int64_t cols) {
    dev("add_bias", "y", y, nb(rows * cols, es(t)));
    if (rows > 0)
        dev("add_bias", "bias", bias, nb(cols, side(t)));
    RUN(add_bias(t, y, bias, rows, cols));
}

static void ds_sum_rows(fl_dtype t, const void *dy, void *db, int64_t rows, int64_t cols,
                        bool acc) {
    dev("sum_rows", "dy", dy, nb(rows * cols, es(t)));
    dev("sum_rows", "db", db, nb(cols, side(t)));
    RUN(sum_rows(t, dy, db, rows, cols, acc));
}

static void ds_act_forward(fl_dtype t, fl_act act, const void *x, void *y, int64_t n) {
    dev("act_forward", "x", x, nb(n, es(t)));
    dev("act_forward", "y", y, nb(n, es(t)));
    RUN(act_forward(t, act, x, y, n));
}

static void ds_act_backward(fl_dtype t, fl_act act, const void *x, const void *y,
                            const void *dy, void *dx, int64_t n) {
    if (x)
        dev("act_backward", "x", x, nb(n, es(t)));
    if (y)
        dev("act_backward", "y", y, nb(n, es(t)));
    dev("act_backward", "dy", dy, nb(n, es(t)));
    dev("act_backward", "dx", dx, nb(n, es(t)));
    RUN(act_backward(t, act, x, y, dy, dx, n));
}

static void ds_axpy(fl_dtype t, int64_t n, double a, const void *x, void *y) {
    dev("axpy", "x", x, nb(n, es(t)));
    dev("axpy", "y", y, nb(n, es(t)));
    RUN(axpy(t, n, a, x, y));
}

static void ds_scale(fl_dtype t, int64_t n, double a, void *x) {
    dev("scale", "x", x, nb(n, es(t)));
    RUN(scale(t, n, a, x));
}

static void ds_amp_round(fl_dtype low, int64_t n, float *x) {
    dev("amp_round", "x", x, nb(n, sizeof(float)));
    RUN(amp_round(low, n, x));
}

static double ds_sum(fl_dtype t, const void *x, int64_t n) {
    dev("sum", "x", x, nb(n, es(t)));
    RUN_RET(double, sum(t, x, n));
}

static double ds_sumsq(fl_dtype t, const void *x, int64_t n) {
    dev("sumsq", "x", x, nb(n, es(t)));
    RUN_RET(double, sumsq(t, x, n));
}

static double ds_softmax_xent_forward(fl_dtype t, const void *logits, const int32_t *labels,
                                      void *probs, int64_t rows, int64_t classes) {
    const char *fn = "softmax_xent_forward";
    dev(fn, "logits", logits, nb(rows * classes, es(t)));
    dev(fn, "labels", labels, nb(rows, sizeof *labels));
    dev(fn, "probs", probs, nb(rows * classes, es(t)));
    RUN_RET(double, softmax_xent_forward(t, logits, labels, probs, rows, classes));
}

static void ds_softmax_xent_backward(fl_dtype t, const void *probs, const int32_t *labels,
                                     void *dlogits, int64_t rows, int64_t classes,
                                     double scale) {
    const char *fn = "softmax_xent_backward";
    dev(fn, "probs", probs, nb(rows * classes, es(t)));
    dev(fn, "labels", labels, nb(rows, sizeof *labels));
    dev(fn, "dlogits", dlogits, nb(rows * classes, es(t)));
    RUN(softmax_xent_backward(t, probs, labels, dlogits, rows, classes, scale));
}

static void ds_sgd_update(fl_dtype t, int64_t n, void *w, const void *g, double lr, double wd) {
    dev("sgd_update", "w", w, nb(n, es(t)));
    dev("sgd_update", "g", g, nb(n, es(t)));
    RUN(sgd_update(t, n, w, g, lr, wd));
}

static void ds_momentum_update(fl_dtype t, int64_t n, void *w, const void *g, void *v,
                               double lr, double mu, double wd, bool nesterov) {
    dev("momentum_update", "w", w, nb(n, es(t)));
    dev("momentum_update", "g", g, nb(n, es(t)));
    dev("momentum_update", "v", v, nb(n, es(t)));
    RUN(momentum_update(t, n, w, g, v, lr, mu, wd, nesterov));
}

/* --- convolution: plans are host objects; the data pointers are checked by their start --- */

static fl_conv_plan *ds_conv_plan_create(const fl_conv_desc *d) {
    host("conv_plan_create", "d", d);
    return under->conv_plan_create(d);
}

static void ds_conv_plan_free(fl_conv_plan *p) { under->conv_plan_free(p); }

static size_t ds_conv_scratch_bytes(const fl_conv_plan *p) {
    return under->conv_scratch_bytes(p);
}

static void ds_conv_forward(fl_conv_plan *p, int64_t n, const void *x, const void *w,
                            const void *bias, void *y, void *scratch) {
    size_t one = n > 0 ? SPAN_UNKNOWN : 0;
    dev("conv_forward", "x", x, one);
    dev("conv_forward", "w", w, one);
    if (bias)
        dev("conv_forward", "bias", bias, one);
    dev("conv_forward", "y", y, one);
    if (scratch)
        dev("conv_forward", "scratch", scratch, one);
    RUN(conv_forward(p, n, x, w, bias, y, scratch));
}

static void ds_conv_backward_data(fl_conv_plan *p, int64_t n, const void *dy, const void *w,
                                  void *dx, void *scratch) {
    size_t one = n > 0 ? SPAN_UNKNOWN : 0;
    dev("conv_backward_data", "dy", dy, one);
    dev("conv_backward_data", "w", w, one);
    dev("conv_backward_data", "dx", dx, one);
    if (scratch)
        dev("conv_backward_data", "scratch", scratch, one);
    RUN(conv_backward_data(p, n, dy, w, dx, scratch));
}

static void ds_conv_backward_filter(fl_conv_plan *p, int64_t n, const void *x, const void *dy,
                                    void *dw, void *dbias, bool acc, void *scratch) {
    dev("conv_backward_filter", "x", x, n > 0 ? SPAN_UNKNOWN : 0);
    dev("conv_backward_filter", "dy", dy, n > 0 ? SPAN_UNKNOWN : 0);
    dev("conv_backward_filter", "dw", dw, SPAN_UNKNOWN);
    if (dbias)
        dev("conv_backward_filter", "dbias", dbias, SPAN_UNKNOWN);
    if (scratch)
        dev("conv_backward_filter", "scratch", scratch, n > 0 ? SPAN_UNKNOWN : 0);
    RUN(conv_backward_filter(p, n, x, dy, dw, dbias, acc, scratch));
}

/* --- pooling, batch norm, the small layers --- */

static void ds_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                            const fl_conv_geom *g, const void *x, void *y) {
    host("pool_forward", "g", g);
    dev("pool_forward", "x", x, nb(n * g->c * g->h * g->w, es(t)));
    dev("pool_forward", "y", y, nb(n * g->c * g->oh * g->ow, es(t)));
    RUN(pool_forward(t, layout, pool, n, g, x, y));
}

static void ds_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                             const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    host("pool_backward", "g", g);
    dev("pool_backward", "x", x, nb(n * g->c * g->h * g->w, es(t)));
    dev("pool_backward", "dy", dy, nb(n * g->c * g->oh * g->ow, es(t)));
    dev("pool_backward", "dx", dx, nb(n * g->c * g->h * g->w, es(t)));
    RUN(pool_backward(t, layout, pool, n, g, x, dy, dx));
}

static void ds_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                          const void *x, const void *gamma, const void *beta, double eps,
                          bool training, double *mean, double *var, bool relu, void *y) {
    const char *fn = "bn_forward";
    dev(fn, "x", x, nb(n * c * hw, es(t)));
    dev(fn, "gamma", gamma, nb(c, side(t)));
    dev(fn, "beta", beta, nb(c, side(t)));
    dev(fn, "mean", mean, nb(c, sizeof *mean));
    dev(fn, "var", var, nb(c, sizeof *var));
    dev(fn, "y", y, nb(n * c * hw, es(t)));
    RUN(bn_forward(t, layout, n, c, hw, x, gamma, beta, eps, training, mean, var, relu, y));
}

static void ds_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                           const void *x, const void *relu_y, const void *dy, const void *gamma,
                           const double *mean, const double *var, double eps, bool training,
                           void *dx, void *dgamma, void *dbeta, bool acc) {
    const char *fn = "bn_backward";
    size_t act = nb(n * c * hw, es(t)), ch = nb(c, side(t));
    dev(fn, "x", x, act);
    if (relu_y)
        dev(fn, "relu_y", relu_y, act);
    dev(fn, "dy", dy, act);
    dev(fn, "gamma", gamma, ch);
    dev(fn, "mean", mean, nb(c, sizeof *mean));
    dev(fn, "var", var, nb(c, sizeof *var));
    if (dx)
        dev(fn, "dx", dx, act);
    dev(fn, "dgamma", dgamma, ch);
    dev(fn, "dbeta", dbeta, ch);
    RUN(bn_backward(t, layout, n, c, hw, x, relu_y, dy, gamma, mean, var, eps, training, dx,
                    dgamma, dbeta, acc));
}

static void ds_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                           bool relu) {
    dev("add_forward", "a", a, nb(n, es(t)));
    dev("add_forward", "b", b, nb(n, es(t)));
    dev("add_forward", "y", y, nb(n, es(t)));
    RUN(add_forward(t, a, b, y, n, relu));
}

static void ds_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                            int64_t n, bool relu) {
    if (y || relu)
        dev("add_backward", "y", y, nb(n, es(t)));
    dev("add_backward", "dy", dy, nb(n, es(t)));
    if (da)
        dev("add_backward", "da", da, nb(n, es(t)));
    if (db)
        dev("add_backward", "db", db, nb(n, es(t)));
    RUN(add_backward(t, y, dy, da, db, n, relu));
}

static void ds_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                            void *out, int64_t n) {
    dev("dropout_mask", "in", in, nb(n, es(t)));
    dev("dropout_mask", "out", out, nb(n, es(t)));
    RUN(dropout_mask(t, seed, step, p, in, out, n));
}

static void ds_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h,
                           int64_t w, int64_t stride, int64_t oc, void *x, void *y, bool fwd) {
    int64_t oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    dev("channel_pad", "x", x, nb(n * c * h * w, es(t)));
    dev("channel_pad", "y", y, nb(n * oc * oh * ow, es(t)));
    RUN(channel_pad(t, layout, n, c, h, w, stride, oc, x, y, fwd));
}

static void ds_channel_mul_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                   int64_t hw, const void *x, const void *s, void *y) {
    dev("channel_mul_forward", "x", x, nb(n * c * hw, es(t)));
    dev("channel_mul_forward", "s", s, nb(n * c, es(t)));
    dev("channel_mul_forward", "y", y, nb(n * c * hw, es(t)));
    RUN(channel_mul_forward(t, layout, n, c, hw, x, s, y));
}

static void ds_channel_mul_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c,
                                    int64_t hw, const void *x, const void *s, const void *dy,
                                    void *dx, void *dsc) {
    dev("channel_mul_backward", "x", x, nb(n * c * hw, es(t)));
    dev("channel_mul_backward", "s", s, nb(n * c, es(t)));
    dev("channel_mul_backward", "dy", dy, nb(n * c * hw, es(t)));
    if (dx)
        dev("channel_mul_backward", "dx", dx, nb(n * c * hw, es(t)));
    if (dsc)
        dev("channel_mul_backward", "ds", dsc, nb(n * c, es(t)));
    RUN(channel_mul_backward(t, layout, n, c, hw, x, s, dy, dx, dsc));
}

static void ds_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c,
                             void *x, int64_t oc, int64_t off, void *y, bool fwd) {
    dev("channel_slice", "x", x, nb(n * c * hw, es(t)));
    dev("channel_slice", "y", y, nb(n * oc * hw, es(t)));
    RUN(channel_slice(t, layout, n, hw, c, x, oc, off, y, fwd));
}

static double ds_xent_smooth_term(fl_dtype t, const void *logits, int64_t rows,
                                  int64_t classes) {
    dev("xent_smooth_term", "logits", logits, nb(rows * classes, es(t)));
    RUN_RET(double, xent_smooth_term(t, logits, rows, classes));
}

static void ds_xent_smooth_backward(fl_dtype t, const int32_t *labels, void *dlogits,
                                    int64_t rows, int64_t classes, double on, double all) {
    dev("xent_smooth_backward", "labels", labels, nb(rows, sizeof *labels));
    dev("xent_smooth_backward", "dlogits", dlogits, nb(rows * classes, es(t)));
    RUN(xent_smooth_backward(t, labels, dlogits, rows, classes, on, all));
}

/* --- DGC --- */

static void ds_dgc_accumulate(int64_t n, const float *grad, const float *w, float *u, float *v,
                              const fl_dgc_accum_args *a) {
    const char *fn = "dgc_accumulate";
    dev(fn, "grad", grad, nb(n, 4));
    dev(fn, "w", w, nb(n, 4));
    if (u || a->correction)
        dev(fn, "u", u, nb(n, 4));
    dev(fn, "v", v, nb(n, 4));
    host(fn, "a", a);
    RUN(dgc_accumulate(n, grad, w, u, v, a));
}

static int64_t ds_dgc_select_exact(int64_t n, const float *v, int64_t k, int32_t *idx,
                                   float *scratch) {
    const char *fn = "dgc_select_exact";
    dev(fn, "v", v, nb(n, 4));
    dev(fn, "idx", idx, nb(n, 4));
    dev(fn, "scratch", scratch, nb(n, 4));
    RUN_RET(int64_t, dgc_select_exact(n, v, k, idx, scratch));
}

static int64_t ds_dgc_accumulate_select(int64_t n, const float *grad, const float *w, float *u,
                                        float *v, const fl_dgc_accum_args *a, int64_t k,
                                        int32_t *idx, float *scratch, uint64_t seed,
                                        float *hint, int *passes) {
    const char *fn = "dgc_accumulate_select";
    int64_t sample = n / 100 > 4096 ? n / 100 : 4096;
    dev(fn, "grad", grad, nb(n, 4));
    dev(fn, "w", w, nb(n, 4));
    if (u || a->correction)
        dev(fn, "u", u, nb(n, 4));
    dev(fn, "v", v, nb(n, 4));
    host(fn, "a", a);
    dev(fn, "idx", idx, nb(n, 4));
    dev(fn, "scratch", scratch, n > 0 ? nb(n + sample, 4) : 0);
    host(fn, "hint", hint);
    host(fn, "passes", passes);
    RUN_RET(int64_t, dgc_accumulate_select(n, grad, w, u, v, a, k, idx, scratch, seed, hint,
                                           passes));
}

static void ds_dgc_encode(const int32_t *idx, int64_t count, int64_t base, float *v, float *u,
                          fl_dgc_pair *pairs) {
    const char *fn = "dgc_encode";
    dev(fn, "idx", idx, nb(count, 4));
    dev(fn, "v", v, count > 0 ? SPAN_UNKNOWN : 0);
    if (u)
        dev(fn, "u", u, count > 0 ? SPAN_UNKNOWN : 0);
    dev(fn, "pairs", pairs, nb(count, sizeof *pairs));
    RUN(dgc_encode(idx, count, base, v, u, pairs));
}

/* the segmented space: start and the array of segment pointers are host memory, each segment
 * backend memory */
static void segments(const char *fn, const char *arg, int nseg, const int64_t *start,
                     float *const *seg) {
    host(fn, "start", start);
    host(fn, arg, seg);
    for (int s = 0; s < nseg; s++)
        dev(fn, arg, seg[s], nb(start[s + 1] - start[s], 4));
}

static int64_t ds_dgc_scatter_add(const fl_dgc_pair *pairs, int64_t n, int nseg,
                                  const int64_t *start, float *const *dst) {
    dev("dgc_scatter_add", "pairs", pairs, nb(n, sizeof *pairs));
    segments("dgc_scatter_add", "dst", nseg, start, dst);
    RUN_RET(int64_t, dgc_scatter_add(pairs, n, nseg, start, dst));
}

static void ds_dgc_apply_pairs(const fl_dgc_pair *pairs, int64_t n, int nseg,
                               const int64_t *start, float *const *w, double step) {
    dev("dgc_apply_pairs", "pairs", pairs, nb(n, sizeof *pairs));
    segments("dgc_apply_pairs", "w", nseg, start, w);
    RUN(dgc_apply_pairs(pairs, n, nseg, start, w, step));
}

static void ds_dgc_apply_dense(int64_t n, float *w, float *g, float *u, double lr, double inv_n,
                               double m, bool nesterov, double decay) {
    dev("dgc_apply_dense", "w", w, nb(n, 4));
    dev("dgc_apply_dense", "g", g, nb(n, 4));
    if (u)
        dev("dgc_apply_dense", "u", u, nb(n, 4));
    RUN(dgc_apply_dense(n, w, g, u, lr, inv_n, m, nesterov, decay));
}

/* --- the device --- */

static int ds_device_bind(int ordinal) {
    if (ordinal < 0 || ordinal >= FL_DEVSIM_DEVICES)
        return fl_fail(FL_EINVAL, "devsim: device %d: there are %d (0 to %d)", ordinal,
                       FL_DEVSIM_DEVICES, FL_DEVSIM_DEVICES - 1);
    bound = ordinal;
    return FL_OK;
}

static size_t ds_memory_peak(void) {
    pthread_mutex_lock(&lock);
    size_t p = peak;
    pthread_mutex_unlock(&lock);
    return p;
}

static void init(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&lock, &a);
    pthread_mutexattr_destroy(&a);
    page = (size_t)sysconf(_SC_PAGESIZE);
    void *bt[2];
    backtrace(bt, 2); /* loads libgcc now, not first inside the signal handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);

    const char *which = getenv("FLEET_DEVSIM_TABLE");
    if (which && strcmp(which, "ref") != 0 && strcmp(which, "cpu") != 0) {
        fprintf(stderr, "devsim: FLEET_DEVSIM_TABLE=%s: not a table devsim runs on (cpu, ref)\n",
                which);
        abort();
    }
    under = which && strcmp(which, "ref") == 0 ? fl_backend_ref() : fl_backend_cpu();
    table = *under; /* low_dtypes as the table's: ref has them, cpu not */
    table.name = "devsim";
    table.convert = under->convert ? ds_convert : NULL;
    table.host_memory = false;
    table.alloc = ds_alloc;
    table.free = ds_free;
    table.copy = ds_copy;
    table.stream_create = ds_stream_create;
    table.stream_free = ds_stream_free;
    table.stream_sync = ds_stream_sync;
    table.event_create = ds_event_create;
    table.event_free = ds_event_free;
    table.event_record = ds_event_record;
    table.event_wait = ds_event_wait;
    table.event_sync = ds_event_sync;
    table.fill = ds_fill;
    table.reorder = ds_reorder;
    table.gemm = ds_gemm;
    table.add_bias = ds_add_bias;
    table.sum_rows = ds_sum_rows;
    table.act_forward = ds_act_forward;
    table.act_backward = ds_act_backward;
    table.axpy = ds_axpy;
    table.scale = ds_scale;
    table.amp_round = ds_amp_round;
    table.sum = ds_sum;
    table.sumsq = ds_sumsq;
    table.softmax_xent_forward = ds_softmax_xent_forward;
    table.softmax_xent_backward = ds_softmax_xent_backward;
    table.sgd_update = ds_sgd_update;
    table.momentum_update = ds_momentum_update;
    table.conv_plan_create = ds_conv_plan_create;
    table.conv_plan_free = ds_conv_plan_free;
    table.conv_scratch_bytes = ds_conv_scratch_bytes;
    table.conv_forward = ds_conv_forward;
    table.conv_backward_data = ds_conv_backward_data;
    table.conv_backward_filter = ds_conv_backward_filter;
    table.pool_forward = ds_pool_forward;
    table.pool_backward = ds_pool_backward;
    table.bn_forward = ds_bn_forward;
    table.bn_backward = ds_bn_backward;
    table.add_forward = ds_add_forward;
    table.add_backward = ds_add_backward;
    table.dropout_mask = ds_dropout_mask;
    table.channel_pad = ds_channel_pad;
    table.channel_mul_forward = ds_channel_mul_forward;
    table.channel_mul_backward = ds_channel_mul_backward;
    table.channel_slice = ds_channel_slice;
    table.xent_smooth_term = ds_xent_smooth_term;
    table.xent_smooth_backward = ds_xent_smooth_backward;
    table.dgc_accumulate = ds_dgc_accumulate;
    table.dgc_select_exact = ds_dgc_select_exact;
    table.dgc_accumulate_select = ds_dgc_accumulate_select;
    table.dgc_encode = ds_dgc_encode;
    table.dgc_scatter_add = ds_dgc_scatter_add;
    table.dgc_apply_pairs = ds_dgc_apply_pairs;
    table.dgc_apply_dense = ds_dgc_apply_dense;
    table.device_bind = ds_device_bind;
    table.memory_peak = ds_memory_peak;
}

const fl_backend *fl_devsim_backend(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init);
    return &table;
}
