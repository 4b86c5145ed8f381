/* nccl.c - the nccl backend: each collective is NCCL's on the rank's GPU, so GPU workers reduce
 * over NVLink / InfiniBand with NCCL's own rings and trees. Compiled only when CMake finds CUDA
 * and NCCL (FL_USE_NCCL); docs/nccl.md is the user's view. This file: the transfers and the
 * collectives, the ops table; nccl_wait.c waits and fails, nccl_open.c sets up and closes.
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
 *   bound_device), else the legacy default stream. Allreduce and broadcast of at least
 *   FLEET_NCCL_SPLIT_MIN_BYTES (1 MiB) are cut into one contiguous part per lane, run concurrently in one NCCL group;
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
#include "nccl_state.h"

#include "algorithms.h"
#include "hier_views.h"
#include "tcp.h"
#include "transport.h"

#include "fleet/backend.h"
#include "fleet/log.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
        return nccl_fail_op(st, o, FL_EINVAL, "buffer %p is memory of GPU %d, not of this rank's GPU",
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
        return nccl_cuda_failed(st, &x->o, "cudaSetDevice", e);
    x->deadline = fl_now() + st->timeout_s;
    x->in_dev = x->out_dev = false;
    if (x->in && x->in_bytes)
        FL_TRY(on_device(st, &x->o, x->in, &x->in_dev));
    if (x->out_bytes)
        FL_TRY(on_device(st, &x->o, x->out, &x->out_dev));
    cudaStream_t s = st->lanes[x->lane].stream;
    if ((x->in_dev || x->out_dev) && !x->internal) {
        void *bs = NULL;
        cudaStream_t compute = nccl_compute_device(&bs) == st->device ? (cudaStream_t)bs
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
    FL_TRY(nccl_wait_enqueued(st, &x->o, watch, x->deadline));
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
    FL_TRY(nccl_wait_done(st, &x->o, done, watch, x->deadline));
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

static int nccl_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    return split_op(c, "allreduce", buf, count, t, op, -1);
}

/* Hierarchical (comm.c chose it: strategy.use_hierarchical_allreduce): NCCL inside the node,
 * tcp between the nodes (hier_views.c). The cross step reduces on the host, so the buffer must
 * be host memory (the strategies stage their buckets there). */
static int nccl_hier_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    op_name o = {c, "hierarchical allreduce", count, t};
    bool dev;
    FL_TRY(on_device(state_of(c), &o, buf, &dev));
    if (dev)
        return fl_fail(FL_EINVAL, "nccl: rank %d: hierarchical allreduce of %zu %s: the buffer "
                       "is GPU memory, but the step between nodes is tcp's and takes host "
                       "memory", c->rank, count, fl_dtype_name(t));
    return fl_hier_views_allreduce(c, buf, count, t, op);
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

const struct fl_comm_ops nccl_comm_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .hier_allreduce = nccl_hier_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .allgatherv = nccl_allgatherv,
    .alltoallv = nccl_alltoallv,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .destroy = nccl_destroy,
};
