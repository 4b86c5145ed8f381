/* nccl_open.c - the nccl backend's set-up and tear-down: the rank's GPU, the NCCL unique ids
 * over fleet's authenticated tcp transport, the lanes' communicators and streams, node groups
 * (ncclCommSplit), and closing with a bounded finalize (nccl.c's header says why). */
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
                nccl_backoff(&round);
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

void nccl_destroy(fl_comm *c) {
    free_state(state_of(c));
    c->backend = NULL;
}

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
            return nccl_cuda_failed(st, o, "creating the communication streams", e);
    }
    if ((e = cudaEventCreateWithFlags(&st->compute, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&st->fork, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&st->token, sizeof *st->token)) != cudaSuccess ||
        (e = cudaMemset(st->token, 0, sizeof *st->token)) != cudaSuccess)
        return nccl_cuda_failed(st, o, "creating events and the barrier's token", e);
    return 0;
}

/* The GPU of this rank: FLAGS_selected_gpus, else the device the cuda backend is bound to,
 * else LOCAL_RANK (one GPU per local rank). */
static int pick_device(const fl_comm_env *env, int count, int *out) {
    int rank = env->rank, dev;
    const char *from;
    if (env->gpu >= 0)
        dev = env->gpu, from = "FLAGS_selected_gpus";
    else if (nccl_compute_device(NULL) >= 0)
        dev = nccl_compute_device(NULL), from = "the cuda backend's device";
    else
        dev = env->local_rank > 0 ? env->local_rank : 0, from = "LOCAL_RANK";
    if (dev >= count)
        return fl_fail(FL_EINVAL, "backend nccl: rank %d: GPU %d (%s) does not exist: %d "
                       "device(s) visible (CUDA_VISIBLE_DEVICES=%s); set FLAGS_selected_gpus",
                       rank, dev, from, count,
                       getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                      : "(unset)");
    if (nccl_compute_device(NULL) >= 0 && nccl_compute_device(NULL) != dev)
        return fl_fail(FL_EINVAL, "backend nccl: rank %d: GPU %d (%s), but the cuda backend is "
                       "bound to GPU %d: one GPU per process", rank, dev, from,
                       nccl_compute_device(NULL));
    *out = dev;
    return 0;
}

/* Node groups (fl_comm_split_nodes): the node view is NCCL again, every lane's communicator
 * split by node (ncclCommSplit, collective over all ranks, in lane order on every rank), with
 * streams of its own and this communicator's transport for the failure probe; the cross view
 * is tcp over that transport (tcp.h: fl_comm_tcp_view), so that the nodes talk through
 * fleet's sockets, dense or DGC's pairs, while each node's GPUs reduce through NCCL. */
int nccl_split(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
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
    node->ops = &nccl_comm_ops;
    node->backend = ns; /* from here the view's destroy frees ns */
    cudaError_t e = cudaSetDevice(st->device);
    if (e != cudaSuccess)
        return nccl_cuda_failed(st, &o, "cudaSetDevice", e);
    FL_TRY(open_streams(ns, &o));
    double deadline = fl_now() + st->timeout_s;
    for (int i = 0; i < st->nlanes; i++) {
        /* NULL config: the child is non-blocking as its parent */
        ncclResult_t r = ncclCommSplit(st->lanes[i].comm, cross->rank, node->rank,
                                       &ns->lanes[i].comm, NULL);
        if (r != ncclSuccess && r != ncclInProgress)
            return nccl_failed(st, &o, "ncclCommSplit", r, st->lanes[i].comm);
        FL_TRY(nccl_wait_enqueued(st, &o, st->nlanes, deadline));
        FL_TRY(nccl_wait_enqueued(ns, &o, i + 1, deadline));
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
        rc = nccl_cuda_failed(st, &o, "cudaSetDevice", e);
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
        if ((rc = nccl_wait_enqueued(st, &o, i + 1, deadline)) < 0)
            goto fail;
    }
    int version = 0;
    ncclGetVersion(&version);
    FL_INFO("comm: nccl %d.%d.%d: rank %d of %d on GPU %d, %d communicator%s", version / 10000,
            version / 100 % 100, version % 100, env->rank, env->size, st->device, st->nlanes,
            st->nlanes == 1 ? "" : "s");
    c->ops = &nccl_comm_ops;
    return 0;
fail:
    free(c->endpoints);
    c->endpoints = NULL;
    c->backend = NULL;
    nccl_abort_all(st); /* set-up never finished: nothing to flush */
    free_state(st);
    return rc;
}
