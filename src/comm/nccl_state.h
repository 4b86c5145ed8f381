/* nccl_state.h - private to the nccl backend: its state, and what its three files share:
 * nccl.c (the collectives and their transfers, the ops table), nccl_wait.c (waiting with a
 * deadline, aborting and naming the failure), nccl_open.c (set-up and tear-down). Compiled
 * only with NCCL (FL_USE_NCCL). */
#ifndef FLEET_COMM_NCCL_STATE_H
#define FLEET_COMM_NCCL_STATE_H

#include "nccl_comm.h"
#include "transport.h"

#include "fleet/status.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>

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

static inline nccl_state *state_of(const fl_comm *c) { return c->backend; }

/* What a collective is, for messages: "allreduce of 1001 f32 over 4 ranks (GPU 0)". */
typedef struct {
    fl_comm    *c;
    const char *what;
    size_t      count;
    fl_dtype    t;
} op_name;

static inline void describe(const op_name *o, char *buf, size_t n) {
    const nccl_state *st = state_of(o->c);
    snprintf(buf, n, "nccl: rank %d: %s of %zu %s over %d rank%s (GPU %d)", o->c->rank, o->what,
             o->count, fl_dtype_name(o->t), o->c->size, o->c->size == 1 ? "" : "s", st->device);
}

/* --- nccl_wait.c: failure and waiting --- */

/* Aborts every NCCL communicator of st (once). */
void nccl_abort_all(nccl_state *st);
/* Fails the collective o with code and the reason fmt: aborts every NCCL communicator, then
 * (several ranks) asks the tcp transport whether a peer is gone: a barrier that fails names
 * the rank and endpoint, and its verdict (FL_EPEER / FL_ETIMEOUT) replaces ours. */
int nccl_fail_op(nccl_state *st, const op_name *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The GPU the cuda backend is bound to (-1: none) and its compute stream. */
int nccl_compute_device(void **stream);
int nccl_cuda_failed(nccl_state *st, const op_name *o, const char *call, cudaError_t e);
int nccl_failed(nccl_state *st, const op_name *o, const char *call, ncclResult_t r,
                ncclComm_t comm);
#define CUDA_TRY(st, o, call)                                                                \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return nccl_cuda_failed((st), (o), #call, e_);                                        \
    } while (0)
/* Sleeps a little longer each round (yields first). */
void nccl_backoff(unsigned *round);
/* An asynchronous error on lanes [0, n), or 0; *in_progress: some lane is still busy. */
int nccl_check_async(nccl_state *st, const op_name *o, int n, bool *in_progress);
/* Waits until lanes [0, n) are ready for the next call (non-blocking communicators). */
int nccl_wait_enqueued(nccl_state *st, const op_name *o, int n, double deadline);
/* Waits for ev (recorded after everything the collective queued), watching lanes [0, n). */
int nccl_wait_done(nccl_state *st, const op_name *o, cudaEvent_t ev, int n, double deadline);

/* --- nccl.c: the ops table; nccl_open.c: what it names of set-up and tear-down --- */

extern const struct fl_comm_ops nccl_comm_ops;
void nccl_destroy(fl_comm *c);
int  nccl_split(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
                const int *cross_ranks);

#endif /* FLEET_COMM_NCCL_STATE_H */
