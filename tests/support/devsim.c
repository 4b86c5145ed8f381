/* devsim.c - the guard of the device stand-in (devsim.h): its memory, the checks its table's
 * wrappers (devsim_ops.c) make, copies, streams and events; devsim_table.c assembles the table.
 * The wrappers check that each data pointer is backend memory, open the pages those pointers
 * span (PROT_READ | PROT_WRITE) for the duration of the kernel and close them again
 * (PROT_NONE). Host code
 * touching backend memory between table calls faults; the SIGSEGV handler says which
 * allocation it was. Only the pages the arguments span are opened (a kernel reads and writes
 * nothing else; opening every allocation made each call cost tens of mprotects, and opening
 * an argument's whole allocation a walk over all its pages). Serialised by
 * one recursive mutex: the table is called from the training thread, and a comm thread that
 * touched backend memory would fault, which is the point. */
#define _GNU_SOURCE
#include "devsim.h"
#include "devsim_impl.h"

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
/* the allocations the call being prepared reads or writes (ds_check_dev() adds them; the calling
 * thread's, as the checks run before the lock is taken) */
#define MAX_OPEN 64
static __thread struct {
    int   n;
    char *base[MAX_OPEN];
    size_t len[MAX_OPEN];
} pending;
static size_t  live, peak, page;
static int     bound = -1;

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
void ds_enter(void) {
    pthread_mutex_lock(&lock);
    if (depth++ == 0)
        protect_pending(PROT_READ | PROT_WRITE);
}

void ds_leave(void) {
    if (--depth == 0) {
        protect_pending(PROT_NONE);
        pending.n = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* ds_check_dev()'s size for an argument whose extent the wrapper does not work out (a convolution's
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
void ds_check_dev(const char *fn, const char *arg, const void *p, size_t bytes) {
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
void ds_check_host(const char *fn, const char *arg, const void *p) {
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

/* the table whose kernels run the copies: cpu, or ref (ds_guard_init) */
static const fl_backend *under;

/* Checks a copy's pointers and opens them for the next ds_enter(). */
static void copy_args(void *dst, const void *src, size_t bytes, fl_copy_kind kind) {
    static const char *const names[] = {"copy H2H", "copy H2D", "copy D2H", "copy D2D"};
    const char *fn = (unsigned)kind < 4 ? names[kind] : "copy";
    bool ddst = kind == FL_COPY_H2D || kind == FL_COPY_D2D;
    bool dsrc = kind == FL_COPY_D2H || kind == FL_COPY_D2D;
    if (!bytes)
        return;
    if (ddst)
        ds_check_dev(fn, "dst", dst, bytes);
    else
        ds_check_host(fn, "dst", dst);
    if (dsrc)
        ds_check_dev(fn, "src", src, bytes);
    else
        ds_check_host(fn, "src", src);
}

static void run_copy(void *dst, const void *src, size_t bytes, fl_copy_kind kind) {
    copy_args(dst, src, bytes, kind);
    ds_enter();
    under->copy(dst, src, bytes, kind, NULL);
    ds_leave();
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

void ds_guard_init(const fl_backend *kernels) {
    under = kernels;
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
}

void ds_install_memory(fl_backend *t) {
    t->host_memory = false;
    t->alloc = ds_alloc;
    t->free = ds_free;
    t->copy = ds_copy;
    t->stream_create = ds_stream_create;
    t->stream_free = ds_stream_free;
    t->stream_sync = ds_stream_sync;
    t->event_create = ds_event_create;
    t->event_free = ds_event_free;
    t->event_record = ds_event_record;
    t->event_wait = ds_event_wait;
    t->event_sync = ds_event_sync;
    t->device_bind = ds_device_bind;
    t->memory_peak = ds_memory_peak;
}
