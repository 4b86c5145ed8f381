/* nccl.c - the nccl backend: each collective is NCCL's on the rank's GPU, so GPU workers reduce
 * over NVLink / InfiniBand with NCCL's own rings and trees. Compiled only when CMake finds CUDA
 * and NCCL (FL_USE_NCCL); docs/nccl.md is the user's view.
 *
 * - Set-up: NCCL's unique ids (rank 0's ncclGetUniqueId, one per communicator) travel to every
 *   rank over fleet's own authenticated tcp transport (transport.h: job token, handshake), not
 *   over a channel of their own; the transport stays open for the failure probe below.
 * - Buffers: comm.h hands us pointers. cudaPointerGetAttributes decides: device (or managed)
 *   memory of this rank's GPU is given to NCCL directly; anything else is host memory and is
 *   staged through a cached device buffer and a pinned host buffer (grown to the largest
 *   collective, freed with the communicator): memcpy into pinned, H2D, the collective, D2H into
 *   pinned, memcpy out, all in the communication stream. Pinned buffers keep every copy
 *   asynchronous, so no CUDA call can block the host while a collective is stuck.
 * - Streams: FLEET_NCCL_COMM_NUM communicators ("lanes"), each on its own non-blocking stream.
 *   Before a collective on device memory the lane's stream waits on an event recorded on the
 *   compute stream: the cuda backend's stream when it is bound to this GPU (the table's
 *   bound_device), else the legacy default stream. Allreduce and broadcast of at least FLEET_NCCL_SPLIT_MIN_BYTES
 *   (1 MiB) are cut into one contiguous part per lane, run concurrently in one NCCL group;
 *   other collectives go to the lanes in turn. Parts depend only on (count, lanes), so every
 *   rank cuts the same way.
 * - Waiting never hangs: communicators are non-blocking (ncclConfig_t.blocking = 0); every wait
 *   polls a CUDA event with a deadline (FLEET_COMM_TIMEOUT) and ncclCommGetAsyncError. On an
 *   error or the deadline all communicators are aborted (ncclCommAbort) and the call fails with
 *   FL_EPEER / FL_ETIMEOUT. NCCL does not say which peer failed: the message names the
 *   operation, the size, the rank count and NCCL's last error, and then a barrier over the tcp
 *   transport probes the peers: one that died or stays silent is named with its endpoint (a
 *   dead process's sockets are closed, so this is quick), and that verdict wins.
 * - Reductions: f16 -> ncclFloat16, bf16 -> ncclBfloat16 (NCCL adds in f32 and rounds after each
 *   addition, as comm.h says), avg -> ncclAvg: integers are summed and divided (toward zero),
 *   floats are multiplied by 1/size before the sum, which equals sum / size exactly for a power
 *   of two ranks and may differ in the last bit otherwise (the tcp and mpi backends divide
 *   after the sum). Results are bit-identical on every rank (NCCL's rings and trees end with
 *   every rank holding the same reduced bytes).
 * - Node groups (nccl_split): the node view is NCCL (ncclCommSplit by node), the cross view tcp
 *   over the transport above; a hierarchical allreduce is the views' own collectives
 *   (hier_views.c), on host memory.
 * - Counters: as mpi.c, the payload handed to NCCL and received from it. */
#include "nccl_comm.h"

#include "algorithms.h"
#include "hier_views.h"
#include "tcp.h"
#include "transport.h"

#include "fleet/backend.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl backend needs NCCL 2.14 or newer (ncclAvg, bf16, non-blocking communicators)"
#endif

#define NCCL_LANES_MAX 8
#define NCCL_SPLIT_MIN_BYTES ((size_t)1 << 20)

/* One NCCL communicator and the stream its collectives run in. */
typedef struct {
    ncclComm_t   comm;
    cudaStream_t stream;
    cudaEvent_t  done; /* what this lane queued for the current collective */
} lane;

/* A staging pair: device memory for NCCL, pinned host memory for asynchronous copies. */
typedef struct {
    void  *dev;
    char  *host;
    size_t cap;
} stage;

typedef struct {
    int           device;
    int           nlanes;
    lane          lanes[NCCL_LANES_MAX];
    cudaEvent_t   compute; /* the compute stream's point a collective on device memory waits for */
    cudaEvent_t   fork;    /* the primary lane's point the other lanes wait for */
    stage         in, out;
    int32_t      *token;   /* barrier: one int32 on the device */
    unsigned      next;    /* the lane of the next collective that is not split */
    size_t        split_min_bytes;
    double        timeout_s;
    fl_transport *tp;      /* set-up and the failure probe; NULL for one rank */
    bool          tp_borrowed; /* a node view's: its communicator's transport, not freed here */
    bool          dead;    /* communicators aborted */
} nccl_state;

static nccl_state *state_of(const fl_comm *c) { return c->backend; }

/* What a collective is, for messages: "allreduce of 1001 f32 over 4 ranks (GPU 0)". */
typedef struct {
    fl_comm    *c;
    const char *what;
    size_t      count;
    fl_dtype    t;
} op_name;

static void describe(const op_name *o, char *buf, size_t n) {
    const nccl_state *st = state_of(o->c);
    snprintf(buf, n, "nccl: rank %d: %s of %zu %s over %d rank%s (GPU %d)", o->c->rank, o->what,
             o->count, fl_dtype_name(o->t), o->c->size, o->c->size == 1 ? "" : "s", st->device);
}

/* --- failure: abort, probe, report --- */

static void abort_all(nccl_state *st) {
    if (st->dead)
        return;
    st->dead = true;
    for (int i = 0; i < st->nlanes; i++)
        if (st->lanes[i].comm) {
            ncclCommAbort(st->lanes[i].comm);
            st->lanes[i].comm = NULL;
        }
}

/* Fails the collective o with code and the reason fmt: aborts every NCCL communicator, then
 * (several ranks) asks the tcp transport whether a peer is gone: a barrier that fails names
 * the rank and endpoint, and its verdict (FL_EPEER / FL_ETIMEOUT) replaces ours. */
static int fail_op(nccl_state *st, const op_name *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_op(nccl_state *st, const op_name *o, int code, const char *fmt, ...) {
    char head[160], why[384], probe[512] = "";
    describe(o, head, sizeof head);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    bool nccl_side = code == FL_EPEER || code == FL_ETIMEOUT;
    abort_all(st);
    if (st->tp && nccl_side) {
        int rc = fl_rd_barrier(fl_transport_peers(st->tp));
        if (rc < 0) {
            snprintf(probe, sizeof probe, "; the tcp transport names the culprit: %s",
                     fl_errmsg());
            code = rc;
        } else {
            snprintf(probe, sizeof probe, "; every rank answered on the tcp transport, so no "
                     "process died (NCCL does not say which peer failed)");
        }
    }
    return fl_fail(code, "%s: %s%s", head, why, probe);
}

/* The GPU the cuda backend is bound to (-1: none) and its compute stream. */
static int compute_device(void **stream) {
    const fl_backend *cb = fl_backend_cuda();
    if (stream)
        *stream = NULL;
    return cb && cb->bound_device ? cb->bound_device(stream) : -1;
}

static int cuda_failed(nccl_state *st, const op_name *o, const char *call, cudaError_t e) {
    (void)cudaGetLastError();
    return fail_op(st, o, FL_EIO, "%s: %s (%s)", call, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

#define CUDA_TRY(st, o, call)                                                                \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return cuda_failed((st), (o), #call, e_);                                        \
    } while (0)

static int nccl_failed(nccl_state *st, const op_name *o, const char *call, ncclResult_t r,
                       ncclComm_t comm) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    int code = r == ncclInvalidArgument || r == ncclInvalidUsage ? FL_EINVAL : FL_EPEER;
    return fail_op(st, o, code, "%s: %s%s%s", call, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

/* --- waiting with a deadline --- */

/* Sleeps a little longer each round: yields first (latency), then up to 1 ms (the comm thread
 * shares the cores with training). */
static void backoff(unsigned *round) {
    if (*round < 64) {
        sched_yield();
    } else {
        long us = *round < 256 ? 20 : *round < 1024 ? 100 : 1000;
        struct timespec ts = {0, us * 1000};
        nanosleep(&ts, NULL);
    }
    (*round)++;
}

/* An asynchronous error on lanes [0, n), or 0. */
static int check_async(nccl_state *st, const op_name *o, int n, bool *in_progress) {
    if (in_progress)
        *in_progress = false;
    for (int i = 0; i < n; i++) {
        ncclResult_t a = ncclSuccess, r = ncclCommGetAsyncError(st->lanes[i].comm, &a);
        if (r != ncclSuccess)
            return nccl_failed(st, o, "ncclCommGetAsyncError", r, st->lanes[i].comm);
        if (a == ncclInProgress) {
            if (in_progress)
                *in_progress = true;
        } else if (a != ncclSuccess) {
            return nccl_failed(st, o, "NCCL (asynchronous error)", a, st->lanes[i].comm);
        }
    }
    return 0;
}

/* Non-blocking communicators: calls may return ncclInProgress while NCCL finishes them in the
 * background; waits until lanes [0, n) are ready for the next call. */
static int wait_enqueued(nccl_state *st, const op_name *o, int n, double deadline) {
    unsigned round = 0;
    for (;;) {
        bool busy;
        FL_TRY(check_async(st, o, n, &busy));
        if (!busy)
            return 0;
        if (fl_now() > deadline)
            return fail_op(st, o, FL_ETIMEOUT, "NCCL did not take the operation within %g s "
                           "(FLEET_COMM_TIMEOUT)", st->timeout_s);
        backoff(&round);
    }
}

/* Waits for ev (recorded after everything the collective queued), watching lanes [0, n). */
static int wait_done(nccl_state *st, const op_name *o, cudaEvent_t ev, int n, double deadline) {
    unsigned round = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_failed(st, o, "cudaEventQuery", e);
        FL_TRY(check_async(st, o, n, NULL));
        if (fl_now() > deadline)
            return fail_op(st, o, FL_ETIMEOUT, "not complete after %g s (FLEET_COMM_TIMEOUT); "
                           "a peer is slow, stuck or gone", st->timeout_s);
        backoff(&round);
    }
}

/* --- buffers --- */

/* Whether p (bytes > 0) is device memory NCCL can use; FL_EINVAL for another GPU's memory. */
static int on_device(nccl_state *st, const op_name *o, const void *p, bool *dev) {
    *dev = false;
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) { /* plain host memory on old runtimes */
        (void)cudaGetLastError();
        return 0;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return 0;
    if (a.type == cudaMemoryTypeDevice && a.device != st->device)
        return fail_op(st, o, FL_EINVAL, "buffer %p is memory of GPU %d, not of this rank's GPU",
                       p, a.device);
    *dev = true;
    return 0;
}

/* s holds at least bytes (device and pinned); grows by freeing and allocating. */
static int reserve(nccl_state *st, const op_name *o, stage *s, size_t bytes) {
    if (bytes <= s->cap)
        return 0;
    size_t cap = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
    if (s->dev)
        cudaFree(s->dev);
    if (s->host)
        cudaFreeHost(s->host);
    s->dev = s->host = NULL;
    s->cap = 0;
    CUDA_TRY(st, o, cudaMalloc(&s->dev, cap));
    CUDA_TRY(st, o, cudaMallocHost((void **)&s->host, cap));
    s->cap = cap;
    return 0;
}

/* One collective's buffers as NCCL sees them. */
typedef struct {
    op_name     o;
    const void *in;      /* caller's input (NULL: in place in out) */
    size_t      in_bytes;
    void       *out;     /* caller's output */
    size_t      out_bytes;
    size_t      in_off;  /* in place: where in lies inside out */
    bool        load_out; /* out's contents are input too (allreduce, broadcast's root) */
    bool        in_dev, out_dev;
    const char *din;     /* what NCCL reads and writes */
    char       *dout;
    int         lane;    /* the primary lane */
    bool        internal; /* our own device memory (barrier): no wait for the compute stream */
    double      deadline;
} xfer;

/* Classifies the buffers, stages host input into the device (primary lane's stream, after the
 * compute stream when device memory is involved). */
static int xfer_begin(nccl_state *st, xfer *x) {
    cudaError_t e = cudaSetDevice(st->device); /* the comm thread's first call lands here */
    if (e != cudaSuccess)
        return cuda_failed(st, &x->o, "cudaSetDevice", e);
    x->deadline = fl_now() + st->timeout_s;
    x->in_dev = x->out_dev = false;
    if (x->in && x->in_bytes)
        FL_TRY(on_device(st, &x->o, x->in, &x->in_dev));
    if (x->out_bytes)
        FL_TRY(on_device(st, &x->o, x->out, &x->out_dev));
    cudaStream_t s = st->lanes[x->lane].stream;
    if ((x->in_dev || x->out_dev) && !x->internal) {
        void *bs = NULL;
        cudaStream_t compute = compute_device(&bs) == st->device ? (cudaStream_t)bs
                                                                 : cudaStreamLegacy;
        CUDA_TRY(st, &x->o, cudaEventRecord(st->compute, compute));
        CUDA_TRY(st, &x->o, cudaStreamWaitEvent(s, st->compute, 0));
    }
    if (x->out_dev) {
        x->dout = x->out;
    } else {
        FL_TRY(reserve(st, &x->o, &st->out, x->out_bytes));
        x->dout = st->out.dev;
        if (x->load_out && x->out_bytes) {
            memcpy(st->out.host, x->out, x->out_bytes);
            CUDA_TRY(st, &x->o, cudaMemcpyAsync(x->dout, st->out.host, x->out_bytes,
                                                cudaMemcpyHostToDevice, s));
        }
    }
    if (!x->in) { /* in place: our share already lies in out at in_off */
        x->din = x->dout + x->in_off;
        if (!x->out_dev && !x->load_out && x->in_bytes) {
            memcpy(st->out.host + x->in_off, (const char *)x->out + x->in_off, x->in_bytes);
            CUDA_TRY(st, &x->o, cudaMemcpyAsync(x->dout + x->in_off, st->out.host + x->in_off,
                                                x->in_bytes, cudaMemcpyHostToDevice, s));
        }
    } else if (x->in_dev || !x->in_bytes) {
        x->din = x->in;
    } else {
        FL_TRY(reserve(st, &x->o, &st->in, x->in_bytes));
        memcpy(st->in.host, x->in, x->in_bytes);
        CUDA_TRY(st, &x->o, cudaMemcpyAsync(st->in.dev, st->in.host, x->in_bytes,
                                            cudaMemcpyHostToDevice, s));
        x->din = st->in.dev;
    }
    return 0;
}

/* Lanes other than the primary wait for what the primary has queued (copies, compute). Call
 * before launching on them. */
static int fork_lanes(nccl_state *st, xfer *x, int n) {
    if (n <= 1)
        return 0;
    CUDA_TRY(st, &x->o, cudaEventRecord(st->fork, st->lanes[x->lane].stream));
    for (int i = 0; i < n; i++)
        if (i != x->lane)
            CUDA_TRY(st, &x->o, cudaStreamWaitEvent(st->lanes[i].stream, st->fork, 0));
    return 0;
}

/* After the launches (lanes [0, n) used when n > 1, else the primary alone): joins the lanes,
 * copies host output back, waits with the deadline. */
static int xfer_end(nccl_state *st, xfer *x, int n) {
    int watch = n > 1 ? n : st->nlanes; /* which communicators to poll: all is cheap enough */
    FL_TRY(wait_enqueued(st, &x->o, watch, x->deadline));
    cudaStream_t s = st->lanes[x->lane].stream;
    if (n > 1)
        for (int i = 0; i < n; i++) {
            if (i == x->lane)
                continue;
            CUDA_TRY(st, &x->o, cudaEventRecord(st->lanes[i].done, st->lanes[i].stream));
            CUDA_TRY(st, &x->o, cudaStreamWaitEvent(s, st->lanes[i].done, 0));
        }
    if (!x->out_dev && x->out_bytes)
        CUDA_TRY(st, &x->o, cudaMemcpyAsync(st->out.host, x->dout, x->out_bytes,
                                            cudaMemcpyDeviceToHost, s));
    cudaEvent_t done = st->lanes[x->lane].done;
    CUDA_TRY(st, &x->o, cudaEventRecord(done, s));
    FL_TRY(wait_done(st, &x->o, done, watch, x->deadline));
    if (!x->out_dev && x->out_bytes)
        memcpy(x->out, st->out.host, x->out_bytes);
    return 0;
}

/* --- types --- */

static ncclDataType_t nccl_type(fl_dtype t) {
    switch (t) {
    case FL_DTYPE_F32: return ncclFloat32;
    case FL_DTYPE_F64: return ncclFloat64;
    case FL_DTYPE_F16: return ncclFloat16;
    case FL_DTYPE_BF16: return ncclBfloat16;
    case FL_DTYPE_I32: return ncclInt32;
    case FL_DTYPE_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(fl_redop op) {
    return op == FL_REDOP_MAX ? ncclMax : op == FL_REDOP_AVG ? ncclAvg : ncclSum;
}

static void count_bytes(fl_comm *c, size_t sent, size_t received) {
    fl_comm *r = c->root ? c->root : c; /* a node view counts into its communicator */
    atomic_fetch_add(&r->counters.bytes_sent, sent);
    atomic_fetch_add(&r->counters.bytes_received, received);
}

/* The lane of a collective that is not split: in turn, the same on every rank. */
static int next_lane(nccl_state *st) { return (int)(st->next++ % (unsigned)st->nlanes); }

/* How many parts an allreduce / broadcast of bytes is cut into. */
static int parts_for(const nccl_state *st, size_t count, size_t bytes) {
    if (st->nlanes == 1 || bytes < st->split_min_bytes)
        return 1;
    return count < (size_t)st->nlanes ? (int)count : st->nlanes;
}

#define NCCL_TRY(st, o, comm, call)                                                          \
    do {                                                                                     \
        ncclResult_t r_ = (call);                                                            \
        if (r_ != ncclSuccess && r_ != ncclInProgress)                                       \
            return nccl_failed((st), (o), #call, r_, (comm));                                \
    } while (0)

/* Inside ncclGroupStart / ncclGroupEnd: the first failure is kept in g and the launches after
 * it are skipped, so that the group is always closed (NCCL's group depth is per thread). */
typedef struct {
    ncclResult_t r;
    const char  *call;
    ncclComm_t   comm;
} group_result;

#define GROUP_CALL(g, comm_, expr)                                                           \
    do {                                                                                     \
        if ((g)->r == ncclSuccess || (g)->r == ncclInProgress) {                             \
            ncclResult_t r_ = (expr);                                                        \
            if (r_ != ncclSuccess && r_ != ncclInProgress)                                   \
                (g)->r = r_, (g)->call = #expr, (g)->comm = (comm_);                         \
        }                                                                                    \
    } while (0)

/* Closes the group; the first failure inside it, or of ncclGroupEnd itself. */
static int group_end(nccl_state *st, const op_name *o, group_result *g) {
    ncclResult_t r = ncclGroupEnd();
    if (g->r != ncclSuccess && g->r != ncclInProgress)
        return nccl_failed(st, o, g->call, g->r, g->comm);
    if (r != ncclSuccess && r != ncclInProgress)
        return nccl_failed(st, o, "ncclGroupEnd", r, NULL);
    return 0;
}

/* --- the collectives (arguments validated by comm.c; counts > 0) --- */

/* Allreduce and broadcast: one part per lane when large (root < 0: allreduce). */
static int split_op(fl_comm *c, const char *what, void *buf, size_t count, fl_dtype t,
                    fl_redop op, int root) {
    nccl_state *st = state_of(c);
    size_t es = fl_dtype_size(t), bytes = count * es;
    int np = parts_for(st, count, bytes);
    xfer x = {.o = {c, what, count, t}, .out = buf, .out_bytes = bytes,
              .load_out = root < 0 || root == c->rank, .lane = np > 1 ? 0 : next_lane(st)};
    FL_TRY(xfer_begin(st, &x));
    FL_TRY(fork_lanes(st, &x, np));
    group_result g = {ncclSuccess, NULL, NULL};
    NCCL_TRY(st, &x.o, NULL, ncclGroupStart());
    for (int i = 0; i < np; i++) {
        size_t lo = count * (size_t)i / (size_t)np, hi = count * (size_t)(i + 1) / (size_t)np;
        lane *l = &st->lanes[np > 1 ? i : x.lane];
        char *p = x.dout + lo * es;
        if (root < 0)
            GROUP_CALL(&g, l->comm, ncclAllReduce(p, p, hi - lo, nccl_type(t), nccl_op(op),
                                                  l->comm, l->stream));
        else
            GROUP_CALL(&g, l->comm, ncclBroadcast(p, p, hi - lo, nccl_type(t), root, l->comm,
                                                  l->stream));
    }
    FL_TRY(group_end(st, &x.o, &g));
    FL_TRY(xfer_end(st, &x, np));
    if (root < 0)
        count_bytes(c, bytes, bytes);
    else if (root == c->rank)
        count_bytes(c, bytes, 0);
    else
        count_bytes(c, 0, bytes);
    return 0;
}

/* Hierarchical (fl_comm_set_hierarchical, strategy.use_hierarchical_allreduce): NCCL inside
 * the node, tcp between the nodes (hier_views.c). The cross step reduces on the host, so the
 * buffer must be host memory (the strategies stage their buckets there). */
static int nccl_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    if (c->hierarchical && c->node_view && c->cross_view->size > 1) {
        op_name o = {c, "hierarchical allreduce", count, t};
        bool dev;
        FL_TRY(on_device(state_of(c), &o, buf, &dev));
        if (dev)
            return fl_fail(FL_EINVAL, "nccl: rank %d: hierarchical allreduce of %zu %s: the "
                           "buffer is GPU memory, but the step between nodes is tcp's and "
                           "takes host memory", c->rank, count, fl_dtype_name(t));
        return fl_hier_views_allreduce(c, buf, count, t, op);
    }
    return split_op(c, "allreduce", buf, count, t, op, -1);
}

static int nccl_broadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root) {
    return split_op(c, "broadcast", buf, count, t, FL_REDOP_SUM, root);
}

static int nccl_reduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                               fl_redop op) {
    nccl_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    xfer x = {.o = {c, "reduce_scatter", count, t}, .in = in,
              .in_bytes = (size_t)c->size * count * es, .out = out, .out_bytes = count * es,
              .lane = next_lane(st)};
    FL_TRY(xfer_begin(st, &x));
    lane *l = &st->lanes[x.lane];
    NCCL_TRY(st, &x.o, l->comm, ncclReduceScatter(x.din, x.dout, count, nccl_type(t),
                                                  nccl_op(op), l->comm, l->stream));
    FL_TRY(xfer_end(st, &x, 1));
    count_bytes(c, x.in_bytes, x.out_bytes);
    return 0;
}

static int nccl_allgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    nccl_state *st = state_of(c);
    size_t bytes = count * fl_dtype_size(t), off = (size_t)c->rank * bytes;
    bool inplace = (const char *)in == (const char *)out + off;
    xfer x = {.o = {c, "allgather", count, t}, .in = inplace ? NULL : in, .in_bytes = bytes,
              .out = out, .out_bytes = (size_t)c->size * bytes, .in_off = off,
              .lane = next_lane(st)};
    FL_TRY(xfer_begin(st, &x));
    lane *l = &st->lanes[x.lane];
    NCCL_TRY(st, &x.o, l->comm, ncclAllGather(x.din, x.dout, bytes, ncclUint8, l->comm,
                                              l->stream));
    FL_TRY(xfer_end(st, &x, 1));
    count_bytes(c, bytes, x.out_bytes);
    return 0;
}

/* One broadcast per rank with a share (NCCL has no allgatherv), grouped so NCCL runs them
 * together. */
static int nccl_allgatherv(fl_comm *c, const void *in, void *out, const size_t *counts,
                           fl_dtype t) {
    nccl_state *st = state_of(c);
    size_t es = fl_dtype_size(t), total = 0, mine = 0;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            mine = total;
        total += counts[r];
    }
    bool inplace = (const char *)in == (const char *)out + mine * es;
    xfer x = {.o = {c, "allgatherv", total, t}, .in = inplace ? NULL : in,
              .in_bytes = counts[c->rank] * es, .out = out, .out_bytes = total * es,
              .in_off = mine * es, .lane = next_lane(st)};
    FL_TRY(xfer_begin(st, &x));
    lane *l = &st->lanes[x.lane];
    group_result g = {ncclSuccess, NULL, NULL};
    NCCL_TRY(st, &x.o, NULL, ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r]) {
            const void *send = r == c->rank ? (const void *)x.din : (const void *)(x.dout + off);
            GROUP_CALL(&g, l->comm, ncclBroadcast(send, x.dout + off, counts[r] * es, ncclUint8,
                                                  r, l->comm, l->stream));
        }
        off += counts[r] * es;
    }
    FL_TRY(group_end(st, &x.o, &g));
    FL_TRY(xfer_end(st, &x, 1));
    count_bytes(c, counts[c->rank] * es, total * es);
    return 0;
}

/* Point-to-point in one group: a send and a receive per peer, our own block copied. */
static int nccl_alltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                          const size_t *recv_counts, fl_dtype t) {
    nccl_state *st = state_of(c);
    size_t es = fl_dtype_size(t), stotal = 0, rtotal = 0;
    for (int r = 0; r < c->size; r++) {
        stotal += send_counts[r];
        rtotal += recv_counts[r];
    }
    xfer x = {.o = {c, "alltoallv", stotal, t}, .in = in, .in_bytes = stotal * es, .out = out,
              .out_bytes = rtotal * es, .lane = next_lane(st)};
    FL_TRY(xfer_begin(st, &x));
    lane *l = &st->lanes[x.lane];
    size_t soff = 0, roff = 0;
    for (int r = 0; r < c->rank; r++) {
        soff += send_counts[r] * es;
        roff += recv_counts[r] * es;
    }
    if (send_counts[c->rank]) /* our own block (comm.c checked that both counts agree) */
        CUDA_TRY(st, &x.o, cudaMemcpyAsync(x.dout + roff, x.din + soff, send_counts[c->rank] * es,
                                           cudaMemcpyDeviceToDevice, l->stream));
    group_result g = {ncclSuccess, NULL, NULL};
    NCCL_TRY(st, &x.o, NULL, ncclGroupStart());
    soff = roff = 0;
    for (int r = 0; r < c->size; r++) {
        size_t sb = send_counts[r] * es, rb = recv_counts[r] * es;
        if (r != c->rank && sb)
            GROUP_CALL(&g, l->comm, ncclSend(x.din + soff, sb, ncclUint8, r, l->comm,
                                             l->stream));
        if (r != c->rank && rb)
            GROUP_CALL(&g, l->comm, ncclRecv(x.dout + roff, rb, ncclUint8, r, l->comm,
                                             l->stream));
        soff += sb;
        roff += rb;
    }
    FL_TRY(group_end(st, &x.o, &g));
    FL_TRY(xfer_end(st, &x, 1));
    count_bytes(c, (stotal - send_counts[c->rank]) * es, (rtotal - recv_counts[c->rank]) * es);
    return 0;
}

/* A one-element allreduce of a device int32 that stays 0. */
static int nccl_barrier(fl_comm *c) {
    nccl_state *st = state_of(c);
    xfer x = {.o = {c, "barrier", 1, FL_DTYPE_I32}, .out = st->token,
              .out_bytes = sizeof *st->token, .lane = next_lane(st), .internal = true};
    FL_TRY(xfer_begin(st, &x));
    lane *l = &st->lanes[x.lane];
    NCCL_TRY(st, &x.o, l->comm, ncclAllReduce(st->token, st->token, 1, ncclInt32, ncclSum,
                                              l->comm, l->stream));
    return xfer_end(st, &x, 1);
}

/* --- set-up and tear-down --- */

static void free_state(nccl_state *st) {
    if (!st)
        return;
    cudaSetDevice(st->device);
    if (!st->dead) {
        /* flush and release; a peer that is gone turns Finalize into a wait: bounded, then
         * abort */
        double deadline = fl_now() + st->timeout_s;
        bool ok = true;
        for (int i = 0; i < st->nlanes; i++) {
            ncclResult_t r = st->lanes[i].comm ? ncclCommFinalize(st->lanes[i].comm)
                                               : ncclSuccess;
            if (r != ncclSuccess && r != ncclInProgress)
                ok = false;
        }
        for (int i = 0; i < st->nlanes && ok; i++) {
            unsigned round = 0;
            ncclResult_t a = st->lanes[i].comm ? ncclInProgress : ncclSuccess;
            while (st->lanes[i].comm && ncclCommGetAsyncError(st->lanes[i].comm, &a) ==
                   ncclSuccess && a == ncclInProgress && fl_now() <= deadline)
                backoff(&round);
            if (a != ncclSuccess)
                ok = false;
        }
        for (int i = 0; i < st->nlanes; i++)
            if (st->lanes[i].comm) {
                if (ok)
                    ncclCommDestroy(st->lanes[i].comm);
                else
                    ncclCommAbort(st->lanes[i].comm);
                st->lanes[i].comm = NULL;
            }
        if (!ok)
            FL_WARN("nccl: closing the communicators did not complete within %g s; aborted",
                    st->timeout_s);
    }
    for (int i = 0; i < st->nlanes; i++) {
        if (st->lanes[i].done)
            cudaEventDestroy(st->lanes[i].done);
        if (st->lanes[i].stream)
            cudaStreamDestroy(st->lanes[i].stream);
    }
    if (st->compute)
        cudaEventDestroy(st->compute);
    if (st->fork)
        cudaEventDestroy(st->fork);
    stage *sts[2] = {&st->in, &st->out};
    for (int i = 0; i < 2; i++) {
        if (sts[i]->dev)
            cudaFree(sts[i]->dev);
        if (sts[i]->host)
            cudaFreeHost(sts[i]->host);
    }
    if (st->token)
        cudaFree(st->token);
    if (!st->tp_borrowed)
        fl_transport_free(st->tp);
    free(st);
}

static void nccl_destroy(fl_comm *c) {
    free_state(state_of(c));
    c->backend = NULL;
}

static int nccl_split(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
                      const int *cross_ranks);

static const struct fl_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .allgatherv = nccl_allgatherv,
    .alltoallv = nccl_alltoallv,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .destroy = nccl_destroy,
};

bool fl_comm_nccl_available(void) { return true; }

/* A positive integer from the environment, at most max; *out untouched when unset. */
static int env_count(const char *name, long min, long max, long *out) {
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < min || x > max)
        return fl_fail(FL_EINVAL, "%s=%s: want an integer from %ld to %ld", name, v, min, max);
    *out = x;
    return 0;
}

/* Each lane's stream and event, the compute and fork events, the barrier's token. */
static int open_streams(nccl_state *st, const op_name *o) {
    cudaError_t e;
    for (int i = 0; i < st->nlanes; i++) {
        lane *l = &st->lanes[i];
        if ((e = cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking)) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&l->done, cudaEventDisableTiming)) != cudaSuccess)
            return cuda_failed(st, o, "creating the communication streams", e);
    }
    if ((e = cudaEventCreateWithFlags(&st->compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&st->fork, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&st->token, sizeof *st->token)) != cudaSuccess ||
        (e = cudaMemset(st->token, 0, sizeof *st->token)) != cudaSuccess)
        return cuda_failed(st, o, "creating events and the barrier's token", e);
    return 0;
}

/* The GPU of this rank: FLAGS_selected_gpus, else the device the cuda backend is bound to,
 * else LOCAL_RANK (one GPU per local rank). */
static int pick_device(const fl_comm_env *env, int count, int *out) {
    int rank = env->rank, dev;
    const char *from;
    if (env->gpu >= 0)
        dev = env->gpu, from = "FLAGS_selected_gpus";
    else if (compute_device(NULL) >= 0)
        dev = compute_device(NULL), from = "the cuda backend's device";
    else
        dev = env->local_rank > 0 ? env->local_rank : 0, from = "LOCAL_RANK";
    if (dev >= count)
        return fl_fail(FL_EINVAL, "backend nccl: rank %d: GPU %d (%s) does not exist: %d "
                       "device(s) visible (CUDA_VISIBLE_DEVICES=%s); set FLAGS_selected_gpus",
                       rank, dev, from, count,
                       getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                      : "(unset)");
    if (compute_device(NULL) >= 0 && compute_device(NULL) != dev)
        return fl_fail(FL_EINVAL, "backend nccl: rank %d: GPU %d (%s), but the cuda backend is "
                       "bound to GPU %d: one GPU per process", rank, dev, from,
                       compute_device(NULL));
    *out = dev;
    return 0;
}

/* Node groups (fl_comm_split_nodes): the node view is NCCL again, every lane's communicator
 * split by node (ncclCommSplit, collective over all ranks, in lane order on every rank), with
 * streams of its own and this communicator's transport for the failure probe; the cross view
 * is tcp over that transport (tcp.h: fl_comm_tcp_view), so that the nodes talk through
 * fleet's sockets, dense or DGC's pairs, while each node's GPUs reduce through NCCL. */
static int nccl_split(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
                      const int *cross_ranks) {
    (void)node_ranks;
    nccl_state *st = state_of(c);
    op_name o = {c, "split into nodes", 0, FL_DTYPE_U8};
    /* several ranks always have the transport; a view of one rank needs none */
    FL_TRY(fl_comm_tcp_view(cross, st->tp, cross_ranks, st->timeout_s));
    nccl_state *ns = calloc(1, sizeof *ns);
    if (!ns)
        return fl_fail(FL_ENOMEM, "nccl: out of memory");
    ns->device = st->device;
    ns->nlanes = st->nlanes;
    ns->split_min_bytes = st->split_min_bytes;
    ns->timeout_s = st->timeout_s;
    ns->tp = st->tp;
    ns->tp_borrowed = true;
    node->ops = &nccl_ops;
    node->backend = ns; /* from here the view's destroy frees ns */
    cudaError_t e = cudaSetDevice(st->device);
    if (e != cudaSuccess)
        return cuda_failed(st, &o, "cudaSetDevice", e);
    FL_TRY(open_streams(ns, &o));
    double deadline = fl_now() + st->timeout_s;
    for (int i = 0; i < st->nlanes; i++) {
        /* NULL config: the child is non-blocking as its parent */
        ncclResult_t r = ncclCommSplit(st->lanes[i].comm, cross->rank, node->rank,
                                       &ns->lanes[i].comm, NULL);
        if (r != ncclSuccess && r != ncclInProgress)
            return nccl_failed(st, &o, "ncclCommSplit", r, st->lanes[i].comm);
        FL_TRY(wait_enqueued(st, &o, st->nlanes, deadline));
        FL_TRY(wait_enqueued(ns, &o, i + 1, deadline));
    }
    FL_INFO("comm: nccl: rank %d: node of %d GPUs through NCCL, %d nodes through tcp", c->rank,
            node->size, cross->size);
    return 0;
}

int fl_comm_nccl_open(fl_comm *c, const fl_comm_env *env) {
    if (env->size < 1 || env->size > FL_COMM_MAX_RANKS || env->rank < 0 ||
        env->rank >= env->size)
        return fl_fail(FL_EINVAL, "nccl: rank %d of %d is out of range", env->rank, env->size);
    int count = 0, rc;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return fl_fail(FL_EIO, "backend nccl: rank %d: no CUDA device (cudaGetDeviceCount: %s); "
                       "NCCL needs one GPU per rank: use backend tcp on CPU workers", env->rank,
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    long lanes = 1;
    size_t split = NCCL_SPLIT_MIN_BYTES;
    long split_l = -1;
    if ((rc = env_count("FLEET_NCCL_COMM_NUM", 1, NCCL_LANES_MAX, &lanes)) < 0 ||
        (rc = env_count("FLEET_NCCL_SPLIT_MIN_BYTES", 0, 0x7fffffffL, &split_l)) < 0)
        return rc;
    if (split_l >= 0)
        split = (size_t)split_l;
    nccl_state *st = calloc(1, sizeof *st);
    if (!st)
        return fl_fail(FL_ENOMEM, "nccl: out of memory");
    st->nlanes = (int)lanes;
    st->split_min_bytes = split;
    st->timeout_s = env->timeout_s > 0 ? env->timeout_s : 300;
    c->rank = env->rank;
    c->size = env->size;
    op_name o = {c, "set-up", 0, FL_DTYPE_U8};
    c->backend = st; /* describe() reads it */
    if ((rc = pick_device(env, count, &st->device)) < 0)
        goto fail;
    if ((e = cudaSetDevice(st->device)) != cudaSuccess) {
        rc = cuda_failed(st, &o, "cudaSetDevice", e);
        goto fail;
    }
    /* the ids: rank 0 makes them, fleet's authenticated transport carries them */
    ncclUniqueId ids[NCCL_LANES_MAX];
    memset(ids, 0, sizeof ids);
    if (env->size > 1 && (rc = fl_transport_open(env, &c->counters, &st->tp)) < 0)
        goto fail;
    if (env->rank == 0)
        for (int i = 0; i < st->nlanes; i++) {
            ncclResult_t r = ncclGetUniqueId(&ids[i]);
            if (r != ncclSuccess) {
                rc = fl_fail(FL_EIO, "backend nccl: rank 0: ncclGetUniqueId: %s: %s",
                             ncclGetErrorString(r), ncclGetLastError(NULL));
                goto fail; /* freeing the transport tells the others */
            }
        }
    if (st->tp &&
        (rc = fl_bcast_tree(fl_transport_peers(st->tp), ids,
                            (size_t)st->nlanes * sizeof ids[0], 0)) < 0) {
        fl_fail_prefix(rc, "backend nccl: rank %d: receiving NCCL's unique id", env->rank);
        goto fail;
    }
    if (st->tp || env->endpoints) {
        c->endpoints = calloc((size_t)env->size, sizeof *c->endpoints);
        if (!c->endpoints) {
            rc = fl_fail(FL_ENOMEM, "nccl: out of memory");
            goto fail;
        }
        for (int r = 0; r < env->size; r++)
            snprintf(c->endpoints[r], sizeof c->endpoints[r], "%s",
                     st->tp ? fl_transport_endpoint(st->tp, r) : env->endpoints[r]);
    }
    if ((rc = open_streams(st, &o)) < 0)
        goto fail;
    /* the communicators, one after the other (every rank in the same order), non-blocking so
     * that a rank that never joins costs a timeout, not a hang */
    double deadline = fl_now() + st->timeout_s;
    for (int i = 0; i < st->nlanes; i++) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&st->lanes[i].comm, env->size, ids[i],
                                                env->rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            rc = nccl_failed(st, &o, "ncclCommInitRankConfig", r, st->lanes[i].comm);
            goto fail;
        }
        if ((rc = wait_enqueued(st, &o, i + 1, deadline)) < 0)
            goto fail;
    }
    int version = 0;
    ncclGetVersion(&version);
    FL_INFO("comm: nccl %d.%d.%d: rank %d of %d on GPU %d, %d communicator%s", version / 10000,
            version / 100 % 100, version % 100, env->rank, env->size, st->device, st->nlanes,
            st->nlanes == 1 ? "" : "s");
    c->ops = &nccl_ops;
    return 0;
fail:
    free(c->endpoints);
    c->endpoints = NULL;
    c->backend = NULL;
    abort_all(st); /* set-up never finished: nothing to flush */
    free_state(st);
    return rc;
}
