/* nccl_wait.c - the nccl backend's waiting and failing: every wait polls a CUDA event or
 * NCCL's asynchronous error with a deadline (FLEET_COMM_TIMEOUT), and a failure aborts every
 * communicator and asks the tcp transport which peer is gone (nccl.c's header says why). */
#include "nccl_state.h"

#include "algorithms.h"
#include "transport.h"

#include "fleet/backend.h"
#include "fleet/log.h"

#include <sched.h>
#include <stdarg.h>
#include <time.h>

/* --- failure: abort, probe, report --- */

void nccl_abort_all(nccl_state *st) {
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
int nccl_fail_op(nccl_state *st, const op_name *o, int code, const char *fmt, ...) {
    char head[160], why[384], probe[512] = "";
    describe(o, head, sizeof head);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    bool nccl_side = code == FL_EPEER || code == FL_ETIMEOUT;
    nccl_abort_all(st);
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
int nccl_compute_device(void **stream) {
    const fl_backend *cb = fl_backend_cuda();
    if (stream)
        *stream = NULL;
    return cb && cb->bound_device ? cb->bound_device(stream) : -1;
}

int nccl_cuda_failed(nccl_state *st, const op_name *o, const char *call, cudaError_t e) {
    (void)cudaGetLastError();
    return nccl_fail_op(st, o, FL_EIO, "%s: %s (%s)", call, cudaGetErrorString(e),
                   cudaGetErrorName(e));
}

int nccl_failed(nccl_state *st, const op_name *o, const char *call, ncclResult_t r,
                       ncclComm_t comm) {
    const char *last = comm ? ncclGetLastError(comm) : ncclGetLastError(NULL);
    int code = r == ncclInvalidArgument || r == ncclInvalidUsage ? FL_EINVAL : FL_EPEER;
    return nccl_fail_op(st, o, code, "%s: %s%s%s", call, ncclGetErrorString(r),
                   last && *last ? ": " : "", last ? last : "");
}

/* --- waiting with a deadline --- */

/* Sleeps a little longer each round: yields first (latency), then up to 1 ms (the comm thread
 * shares the cores with training). */
void nccl_backoff(unsigned *round) {
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
int nccl_check_async(nccl_state *st, const op_name *o, int n, bool *in_progress) {
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
int nccl_wait_enqueued(nccl_state *st, const op_name *o, int n, double deadline) {
    unsigned round = 0;
    for (;;) {
        bool busy;
        FL_TRY(nccl_check_async(st, o, n, &busy));
        if (!busy)
            return 0;
        if (fl_now() > deadline)
            return nccl_fail_op(st, o, FL_ETIMEOUT, "NCCL did not take the operation within %g s "
                           "(FLEET_COMM_TIMEOUT)", st->timeout_s);
        nccl_backoff(&round);
    }
}

/* Waits for ev (recorded after everything the collective queued), watching lanes [0, n). */
int nccl_wait_done(nccl_state *st, const op_name *o, cudaEvent_t ev, int n, double deadline) {
    unsigned round = 0;
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return nccl_cuda_failed(st, o, "cudaEventQuery", e);
        FL_TRY(nccl_check_async(st, o, n, NULL));
        if (fl_now() > deadline)
            return nccl_fail_op(st, o, FL_ETIMEOUT, "not complete after %g s (FLEET_COMM_TIMEOUT); "
                           "a peer is slow, stuck or gone", st->timeout_s);
        nccl_backoff(&round);
    }
}
