/* mpi.c - the mpi backend: each collective is the matching MPI call on a duplicate of
 * MPI_COMM_WORLD, so a job started by mpirun / srun uses the MPI library's own tuned
 * algorithms and networks. Compiled only when CMake finds MPI (FL_USE_MPI).
 *
 * - MPI_Init_thread(MPI_THREAD_SERIALIZED) unless the program initialised MPI already (then we
 *   leave MPI_Finalize to it); the comm thread and the caller never call MPI at the same time
 *   (comm.c's exec_lock).
 * - f16 and bf16 travel as MPI_UINT16_T and reduce through user-defined commutative MPI_Ops
 *   that call fl_reduce_into (f32 inside, rounded after each addition) as the tcp backend does.
 * - avg is MPI_SUM followed by fl_reduce_finalize.
 * - Errors come back (MPI_ERRORS_RETURN on our communicator) and become FL_EPEER with
 *   MPI_Error_string's text.
 * - Counters: the bytes MPI's algorithms move are not observable from outside; bytes_sent and
 *   bytes_received count the payload handed to MPI and received from it (e.g. allreduce of B
 *   bytes: +B each), not what went over the wire. */
#include "comm_impl.h"

#include "fleet/status.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    MPI_Comm comm;
    bool     we_initialised;
    MPI_Op   sum16[2], max16[2]; /* [0] f16, [1] bf16 */
} mpi_state;

static mpi_state *state_of(const fl_comm *c) { return c->backend; }

static int mpi_failed(int err, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", err);
    return fl_fail(FL_EPEER, "mpi: %s: %s", what, text);
}

/* --- user-defined ops for the 16-bit floats: inout = inout op in (both commutative) --- */

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    fl_reduce_into(inout, in, (size_t)*len, FL_DTYPE_F16, FL_REDOP_SUM);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    fl_reduce_into(inout, in, (size_t)*len, FL_DTYPE_BF16, FL_REDOP_SUM);
}
static void max_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    fl_reduce_into(inout, in, (size_t)*len, FL_DTYPE_F16, FL_REDOP_MAX);
}
static void max_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    fl_reduce_into(inout, in, (size_t)*len, FL_DTYPE_BF16, FL_REDOP_MAX);
}

static MPI_Datatype mpi_type(fl_dtype t) {
    switch (t) {
    case FL_DTYPE_F32: return MPI_FLOAT;
    case FL_DTYPE_F64: return MPI_DOUBLE;
    case FL_DTYPE_F16:
    case FL_DTYPE_BF16: return MPI_UINT16_T;
    case FL_DTYPE_I32: return MPI_INT32_T;
    case FL_DTYPE_I64: return MPI_INT64_T;
    case FL_DTYPE_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(const mpi_state *st, fl_dtype t, fl_redop op) {
    bool max = op == FL_REDOP_MAX;
    if (t == FL_DTYPE_F16 || t == FL_DTYPE_BF16) {
        int i = t == FL_DTYPE_BF16;
        return max ? st->max16[i] : st->sum16[i];
    }
    return max ? MPI_MAX : MPI_SUM;
}

static void count_bytes(fl_comm *c, size_t sent, size_t received) {
    atomic_fetch_add(&c->counters.bytes_sent, sent);
    atomic_fetch_add(&c->counters.bytes_received, received);
}

/* --- the collectives (arguments validated by comm.c; counts > 0) --- */

static int mpi_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    mpi_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    char *b = buf;
    /* MPI counts are ints: go in pieces of at most INT_MAX elements */
    for (size_t done = 0; done < count;) {
        size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        int err = MPI_Allreduce(MPI_IN_PLACE, b + done * es, (int)n, mpi_type(t),
                                mpi_op(st, t, op), st->comm);
        if (err != MPI_SUCCESS)
            return mpi_failed(err, "MPI_Allreduce");
        done += n;
    }
    fl_reduce_finalize(buf, count, t, op, c->size);
    count_bytes(c, count * es, count * es);
    return 0;
}

static int mpi_reduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                              fl_redop op) {
    mpi_state *st = state_of(c);
    if (count > (size_t)INT_MAX)
        return fl_fail(FL_EUNSUPPORTED, "mpi: reduce_scatter of %zu elements per rank: MPI "
                       "counts stop at INT_MAX", count);
    int err = MPI_Reduce_scatter_block(in, out, (int)count, mpi_type(t), mpi_op(st, t, op),
                                       st->comm);
    if (err != MPI_SUCCESS)
        return mpi_failed(err, "MPI_Reduce_scatter_block");
    fl_reduce_finalize(out, count, t, op, c->size);
    size_t es = fl_dtype_size(t);
    count_bytes(c, (size_t)c->size * count * es, count * es);
    return 0;
}

static int mpi_allgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    mpi_state *st = state_of(c);
    if (count > (size_t)INT_MAX)
        return fl_fail(FL_EUNSUPPORTED, "mpi: allgather of %zu elements per rank: MPI counts "
                       "stop at INT_MAX", count);
    size_t es = fl_dtype_size(t);
    const void *send = in;
    if ((const char *)in == (const char *)out + (size_t)c->rank * count * es)
        send = MPI_IN_PLACE;
    int err = MPI_Allgather(send, (int)count, mpi_type(t), out, (int)count, mpi_type(t),
                            st->comm);
    if (err != MPI_SUCCESS)
        return mpi_failed(err, "MPI_Allgather");
    count_bytes(c, count * es, (size_t)c->size * count * es);
    return 0;
}

static int mpi_allgatherv(fl_comm *c, const void *in, void *out, const size_t *counts,
                          fl_dtype t) {
    mpi_state *st = state_of(c);
    size_t es = fl_dtype_size(t), total = 0, mine = 0;
    int *cnt = malloc(2 * (size_t)c->size * sizeof *cnt), rc = 0;
    if (!cnt)
        return fl_fail(FL_ENOMEM, "mpi: out of memory");
    int *displ = cnt + c->size;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > (size_t)INT_MAX || total > (size_t)INT_MAX) {
            rc = fl_fail(FL_EUNSUPPORTED, "mpi: allgatherv: rank %d's %zu elements at offset "
                         "%zu: MPI counts and offsets stop at INT_MAX", r, counts[r], total);
            goto done;
        }
        if (r == c->rank)
            mine = total;
        cnt[r] = (int)counts[r];
        displ[r] = (int)total;
        total += counts[r];
    }
    const void *send = (const char *)in == (const char *)out + mine * es ? MPI_IN_PLACE : in;
    int err = MPI_Allgatherv(send, cnt[c->rank], mpi_type(t), out, cnt, displ, mpi_type(t),
                             st->comm);
    if (err != MPI_SUCCESS) {
        rc = mpi_failed(err, "MPI_Allgatherv");
        goto done;
    }
    count_bytes(c, counts[c->rank] * es, total * es);
done:
    free(cnt);
    return rc;
}

static int mpi_alltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                         const size_t *recv_counts, fl_dtype t) {
    mpi_state *st = state_of(c);
    size_t es = fl_dtype_size(t), stotal = 0, rtotal = 0;
    int n = c->size, rc = 0;
    int *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v)
        return fl_fail(FL_ENOMEM, "mpi: out of memory");
    int *scnt = v, *sdis = v + n, *rcnt = v + 2 * n, *rdis = v + 3 * n;
    for (int r = 0; r < n; r++) {
        if (send_counts[r] > (size_t)INT_MAX || stotal > (size_t)INT_MAX ||
            recv_counts[r] > (size_t)INT_MAX || rtotal > (size_t)INT_MAX) {
            rc = fl_fail(FL_EUNSUPPORTED, "mpi: alltoallv: the block of rank %d is beyond "
                         "INT_MAX elements or offset, where MPI counts stop", r);
            goto done;
        }
        scnt[r] = (int)send_counts[r];
        sdis[r] = (int)stotal;
        rcnt[r] = (int)recv_counts[r];
        rdis[r] = (int)rtotal;
        stotal += send_counts[r];
        rtotal += recv_counts[r];
    }
    int err = MPI_Alltoallv(in, scnt, sdis, mpi_type(t), out, rcnt, rdis, mpi_type(t), st->comm);
    if (err != MPI_SUCCESS) {
        rc = mpi_failed(err, "MPI_Alltoallv");
        goto done;
    }
    count_bytes(c, (stotal - send_counts[c->rank]) * es, (rtotal - recv_counts[c->rank]) * es);
done:
    free(v);
    return rc;
}

static int mpi_alltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    mpi_state *st = state_of(c);
    if (count > (size_t)INT_MAX)
        return fl_fail(FL_EUNSUPPORTED, "mpi: alltoall of %zu elements per block: MPI counts "
                       "stop at INT_MAX", count);
    int err = MPI_Alltoall(in, (int)count, mpi_type(t), out, (int)count, mpi_type(t), st->comm);
    if (err != MPI_SUCCESS)
        return mpi_failed(err, "MPI_Alltoall");
    size_t others = (size_t)(c->size - 1) * count * fl_dtype_size(t);
    count_bytes(c, others, others);
    return 0;
}

static int mpi_broadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root) {
    mpi_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    char *b = buf;
    for (size_t done = 0; done < count;) {
        size_t n = count - done < (size_t)INT_MAX ? count - done : (size_t)INT_MAX;
        int err = MPI_Bcast(b + done * es, (int)n, mpi_type(t), root, st->comm);
        if (err != MPI_SUCCESS)
            return mpi_failed(err, "MPI_Bcast");
        done += n;
    }
    if (c->rank == root)
        count_bytes(c, count * es, 0);
    else
        count_bytes(c, 0, count * es);
    return 0;
}

static int mpi_barrier(fl_comm *c) {
    int err = MPI_Barrier(state_of(c)->comm);
    return err == MPI_SUCCESS ? 0 : mpi_failed(err, "MPI_Barrier");
}

static void free_state(mpi_state *st) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        for (int i = 0; i < 2; i++) {
            if (st->sum16[i] != MPI_OP_NULL)
                MPI_Op_free(&st->sum16[i]);
            if (st->max16[i] != MPI_OP_NULL)
                MPI_Op_free(&st->max16[i]);
        }
        if (st->comm != MPI_COMM_NULL)
            MPI_Comm_free(&st->comm);
        if (st->we_initialised)
            MPI_Finalize();
    }
    free(st);
}

static void mpi_destroy(fl_comm *c) {
    mpi_state *st = state_of(c);
    if (st)
        free_state(st);
    c->backend = NULL;
}

static const struct fl_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .allgatherv = mpi_allgatherv,
    .alltoallv = mpi_alltoallv,
    .alltoall = mpi_alltoall,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

int fl_comm_mpi_open(fl_comm *c, const fl_comm_env *env) {
    (void)env; /* rank and size come from MPI itself */
    int inited = 0, finalized = 0, provided = 0, err, rc;
    MPI_Finalized(&finalized);
    if (finalized)
        return fl_fail(FL_ESTATE, "mpi: MPI was already finalised in this process");
    mpi_state *st = calloc(1, sizeof *st);
    if (!st)
        return fl_fail(FL_ENOMEM, "mpi: out of memory");
    st->comm = MPI_COMM_NULL;
    for (int i = 0; i < 2; i++)
        st->sum16[i] = st->max16[i] = MPI_OP_NULL;
    MPI_Initialized(&inited);
    if (!inited) {
        err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (err != MPI_SUCCESS) {
            rc = mpi_failed(err, "MPI_Init_thread");
            goto fail;
        }
        st->we_initialised = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        rc = fl_fail(FL_EUNSUPPORTED, "mpi: the MPI library gives thread level %d, the comm "
                     "thread needs MPI_THREAD_SERIALIZED", provided);
        goto fail;
    }
    if ((err = MPI_Comm_dup(MPI_COMM_WORLD, &st->comm)) != MPI_SUCCESS) {
        rc = mpi_failed(err, "MPI_Comm_dup");
        goto fail;
    }
    MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(st->comm, &c->rank);
    MPI_Comm_size(st->comm, &c->size);
    if (MPI_Op_create(sum_f16, 1, &st->sum16[0]) != MPI_SUCCESS ||
        MPI_Op_create(sum_bf16, 1, &st->sum16[1]) != MPI_SUCCESS ||
        MPI_Op_create(max_f16, 1, &st->max16[0]) != MPI_SUCCESS ||
        MPI_Op_create(max_bf16, 1, &st->max16[1]) != MPI_SUCCESS) {
        rc = fl_fail(FL_EUNSUPPORTED, "mpi: MPI_Op_create failed");
        goto fail;
    }
    c->ops = &mpi_ops;
    c->backend = st;
    return 0;
fail:
    free_state(st);
    return rc;
}
