/* comm.c - the communicator behind comm.h: argument checks, dispatch to the backend's table,
 * the async requests, counters, and the sticky failure state.
 *
 * Blocking calls run on the caller's thread (no hand-off: small allreduces are latency-bound),
 * after any outstanding async requests. Async calls go into a FIFO served by one comm thread,
 * created on the first async call, so they complete in issue order; waiters sleep on a
 * condition variable (no spinning: training threads need the cores). exec_lock makes sure
 * only one collective runs at a time. Once a collective fails, every later call fails at once
 * with the first failure's message. About 800 lines in one file on purpose: the blocking path,
 * the async queue and the failure state share exec_lock and the queue's invariants, which a
 * reader checks in one place. */
#include "comm_impl.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    OP_ALLREDUCE = 0,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER,
    OP_ALLGATHERV,
    OP_BROADCAST,
    OP_BARRIER,
    OP_ALLTOALLV,
    OP_ALLTOALL,
} op_kind;

static const char *const op_names[] = {"allreduce", "reduce_scatter", "allgather",
                                       "allgatherv", "broadcast", "barrier", "alltoallv",
                                       "alltoall"};

/* One collective's arguments, as the caller passed them (validated). */
typedef struct {
    op_kind       kind;
    const void   *in;
    void         *out; /* buf for allreduce and broadcast */
    size_t        count;
    const size_t *counts; /* allgatherv; alltoallv's send counts */
    const size_t *recv_counts; /* alltoallv */
    fl_dtype      t;
    fl_redop      op;
    int           root;
    void        (*ready)(void *arg); /* async only: waited for before the collective starts */
    void         *ready_arg;
} call;

struct fl_request {
    fl_comm    *c;
    call        a;
    size_t     *counts_copy; /* allgatherv, alltoallv: the caller's counts may go away after
                              * issue (alltoallv: send counts, then receive counts) */
    bool        done;        /* guarded by the queue's mu */
    int         status;
    char        msg[512];
    fl_request *next;
};

struct comm_request_queue {
    pthread_t       thread;
    pthread_mutex_t mu;   /* guards everything below, and c->failed/fail_*, seconds, ops_done
                             once the queue exists */
    pthread_cond_t  work; /* the comm thread: a request arrived, or stop */
    pthread_cond_t  done; /* waiters: a request completed */
    fl_request     *head, *tail;
    size_t          pending; /* issued, not yet complete */
    bool            stop;
};

/* --- shared state under the queue's mutex (plain when there is no comm thread yet) --- */

/* The communicator whose queue, locks, failure state and statistics a view shares. */
static fl_comm *root_of(const fl_comm *c) { return c->root ? c->root : (fl_comm *)c; }

static void lock_shared(fl_comm *c) {
    c = root_of(c);
    if (c->queue)
        pthread_mutex_lock(&c->queue->mu);
}

static void unlock_shared(fl_comm *c) {
    c = root_of(c);
    if (c->queue)
        pthread_mutex_unlock(&c->queue->mu);
}

/* Records the first failure (message from this thread's fl_errmsg). */
static void mark_failed(fl_comm *c, int code) {
    c = root_of(c);
    lock_shared(c);
    if (!c->failed) {
        c->failed = true;
        c->fail_code = code;
        snprintf(c->fail_msg, sizeof c->fail_msg, "%s", fl_errmsg());
    }
    unlock_shared(c);
}

/* Caller holds the shared lock (or there is no queue). */
static int failed_already(const fl_comm *c) {
    c = root_of(c);
    return fl_fail(c->fail_code, "%s", c->fail_msg);
}

/* Alltoall on a backend without one: its alltoallv with every count the same. */
static int alltoall_by_alltoallv(fl_comm *c, const call *a) {
    size_t *counts = malloc((size_t)c->size * sizeof *counts);
    if (!counts)
        return fl_fail(FL_ENOMEM, "comm: out of memory");
    for (int r = 0; r < c->size; r++)
        counts[r] = a->count;
    int rc = c->ops->alltoallv(c, a->in, counts, a->out, counts, a->t);
    free(counts);
    return rc;
}

/* Whether an allreduce of c runs hierarchically: the one place that decides it for every
 * backend (the backend's hier_allreduce says how). */
static bool hierarchical_now(const fl_comm *c) {
    return c->hierarchical && c->node_view && c->cross_view && c->cross_view->size > 1 &&
           c->ops->hier_allreduce;
}

/* Runs one collective on this thread; the caller holds exec_lock. */
static int execute(fl_comm *c, const call *a) {
    const struct fl_comm_ops *ops = c->ops;
    double t0 = fl_now();
    int rc = 0;
    switch (a->kind) {
    case OP_ALLREDUCE:
        if (a->count)
            rc = hierarchical_now(c) ? ops->hier_allreduce(c, a->out, a->count, a->t, a->op)
                                     : ops->allreduce(c, a->out, a->count, a->t, a->op);
        break;
    case OP_REDUCE_SCATTER:
        if (a->count)
            rc = ops->reduce_scatter(c, a->in, a->out, a->count, a->t, a->op);
        break;
    case OP_ALLGATHER:
        if (a->count)
            rc = ops->allgather(c, a->in, a->out, a->count, a->t);
        break;
    case OP_ALLGATHERV: {
        size_t total = 0;
        for (int r = 0; r < c->size; r++)
            total += a->counts[r];
        if (total)
            rc = ops->allgatherv(c, a->in, a->out, a->counts, a->t);
        break;
    }
    case OP_BROADCAST:
        if (a->count)
            rc = ops->broadcast(c, a->out, a->count, a->t, a->root);
        break;
    case OP_BARRIER:
        if (c->size > 1)
            rc = ops->barrier(c);
        break;
    case OP_ALLTOALLV: {
        size_t total = 0;
        for (int r = 0; r < c->size; r++)
            total += a->counts[r] + a->recv_counts[r];
        if (total)
            rc = ops->alltoallv(c, a->in, a->counts, a->out, a->recv_counts, a->t);
        break;
    }
    case OP_ALLTOALL:
        if (a->count)
            rc = ops->alltoall ? ops->alltoall(c, a->in, a->out, a->count, a->t)
                               : alltoall_by_alltoallv(c, a);
        break;
    }
    double dt = fl_now() - t0;
    if (rc < 0) {
        fl_fail_prefix(rc, "%s", op_names[a->kind]);
        mark_failed(c, rc);
        return rc;
    }
    fl_comm *root = root_of(c);
    lock_shared(root);
    root->seconds += dt;
    root->ops_done++;
    unlock_shared(root);
    return 0;
}

/* --- argument checks --- */

static int check_backend(const fl_comm *c, op_kind k) {
    const struct fl_comm_ops *o = c->ops;
    const void *fn = NULL;
    switch (k) {
    case OP_ALLREDUCE: fn = (const void *)o->allreduce; break;
    case OP_REDUCE_SCATTER: fn = (const void *)o->reduce_scatter; break;
    case OP_ALLGATHER: fn = (const void *)o->allgather; break;
    case OP_ALLGATHERV: fn = (const void *)o->allgatherv; break;
    case OP_BROADCAST: fn = (const void *)o->broadcast; break;
    case OP_BARRIER: fn = (const void *)o->barrier; break;
    case OP_ALLTOALLV: fn = (const void *)o->alltoallv; break;
    case OP_ALLTOALL:
        fn = o->alltoall ? (const void *)o->alltoall : (const void *)o->alltoallv;
        break;
    }
    if (!fn)
        return fl_fail(FL_EUNSUPPORTED, "backend %s has no %s", o->name, op_names[k]);
    return 0;
}

static bool reducible(fl_dtype t) {
    return t == FL_DTYPE_F32 || t == FL_DTYPE_F64 || t == FL_DTYPE_F16 || t == FL_DTYPE_BF16 ||
           t == FL_DTYPE_I32 || t == FL_DTYPE_I64;
}

static int check_dtype(op_kind k, fl_dtype t, bool reduces) {
    if ((unsigned)t >= FL_DTYPE_COUNT)
        return fl_fail(FL_EINVAL, "%s: invalid dtype %d", op_names[k], (int)t);
    if (reduces && !reducible(t))
        return fl_fail(FL_EINVAL, "%s: dtype %s cannot be reduced (want f32, f64, f16, bf16, "
                       "i32 or i64)", op_names[k], fl_dtype_name(t));
    return 0;
}

static int check_op(op_kind k, fl_redop op) {
    if ((unsigned)op >= FL_REDOP_COUNT)
        return fl_fail(FL_EINVAL, "%s: invalid reduction op %d (want sum, avg or max)",
                       op_names[k], (int)op);
    return 0;
}

/* n elements of t, times `times`, as bytes, refusing what would overflow size_t. */
static int check_bytes(op_kind k, size_t n, size_t times, fl_dtype t, size_t *bytes) {
    size_t es = fl_dtype_size(t);
    if (times && n > SIZE_MAX / times / es)
        return fl_fail(FL_EINVAL, "%s: %zu x %zu elements of %s overflow the address space",
                       op_names[k], times, n, fl_dtype_name(t));
    *bytes = n * times * es;
    return 0;
}

static int check_ptr(op_kind k, const char *what, const void *p, size_t bytes) {
    if (!p && bytes)
        return fl_fail(FL_EINVAL, "%s: %s is NULL with %zu bytes to move", op_names[k], what,
                       bytes);
    return 0;
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static int validate(const fl_comm *c, const call *a) {
    FL_ASSERT(c != NULL);
    op_kind k = a->kind;
    size_t ib = 0, ob = 0;
    switch (k) {
    case OP_ALLREDUCE:
        FL_TRY(check_dtype(k, a->t, true));
        FL_TRY(check_op(k, a->op));
        FL_TRY(check_bytes(k, a->count, 1, a->t, &ob));
        FL_TRY(check_ptr(k, "buf", a->out, ob));
        break;
    case OP_REDUCE_SCATTER:
        FL_TRY(check_dtype(k, a->t, true));
        FL_TRY(check_op(k, a->op));
        FL_TRY(check_bytes(k, a->count, (size_t)c->size, a->t, &ib));
        FL_TRY(check_bytes(k, a->count, 1, a->t, &ob));
        FL_TRY(check_ptr(k, "in", a->in, ib));
        FL_TRY(check_ptr(k, "out", a->out, ob));
        if (overlap(a->in, ib, a->out, ob))
            return fl_fail(FL_EINVAL, "reduce_scatter: out overlaps in (not supported in place)");
        break;
    case OP_ALLGATHER:
        FL_TRY(check_dtype(k, a->t, false));
        FL_TRY(check_bytes(k, a->count, 1, a->t, &ib));
        FL_TRY(check_bytes(k, a->count, (size_t)c->size, a->t, &ob));
        FL_TRY(check_ptr(k, "in", a->in, ib));
        FL_TRY(check_ptr(k, "out", a->out, ob));
        if (overlap(a->in, ib, a->out, ob) &&
            (const char *)a->in != (const char *)a->out + (size_t)c->rank * ib)
            return fl_fail(FL_EINVAL, "allgather: in overlaps out other than as out's own "
                           "block %d (in place)", c->rank);
        break;
    case OP_ALLGATHERV: {
        FL_TRY(check_dtype(k, a->t, false));
        if (!a->counts)
            return fl_fail(FL_EINVAL, "allgatherv: counts is NULL");
        size_t total = 0, mine_off = 0;
        for (int r = 0; r < c->size; r++) {
            if (a->counts[r] > SIZE_MAX - total)
                return fl_fail(FL_EINVAL, "allgatherv: the counts overflow size_t");
            if (r == c->rank)
                mine_off = total;
            total += a->counts[r];
        }
        FL_TRY(check_bytes(k, a->counts[c->rank], 1, a->t, &ib));
        FL_TRY(check_bytes(k, total, 1, a->t, &ob));
        FL_TRY(check_ptr(k, "in", a->in, ib));
        FL_TRY(check_ptr(k, "out", a->out, ob));
        if (overlap(a->in, ib, a->out, ob) &&
            (const char *)a->in != (const char *)a->out + mine_off * fl_dtype_size(a->t))
            return fl_fail(FL_EINVAL, "allgatherv: in overlaps out other than as out's own "
                           "block %d (in place)", c->rank);
        break;
    }
    case OP_BROADCAST:
        FL_TRY(check_dtype(k, a->t, false));
        if (a->root < 0 || a->root >= c->size)
            return fl_fail(FL_EINVAL, "broadcast: root %d is not a rank (size %d)", a->root,
                           c->size);
        FL_TRY(check_bytes(k, a->count, 1, a->t, &ob));
        FL_TRY(check_ptr(k, "buf", a->out, ob));
        break;
    case OP_BARRIER:
        break;
    case OP_ALLTOALLV: {
        FL_TRY(check_dtype(k, a->t, false));
        if (!a->counts || !a->recv_counts)
            return fl_fail(FL_EINVAL, "alltoallv: %s is NULL",
                           a->counts ? "recv_counts" : "send_counts");
        size_t stotal = 0, rtotal = 0;
        for (int r = 0; r < c->size; r++) {
            if (a->counts[r] > SIZE_MAX - stotal || a->recv_counts[r] > SIZE_MAX - rtotal)
                return fl_fail(FL_EINVAL, "alltoallv: the counts overflow size_t");
            stotal += a->counts[r];
            rtotal += a->recv_counts[r];
        }
        FL_TRY(check_bytes(k, stotal, 1, a->t, &ib));
        FL_TRY(check_bytes(k, rtotal, 1, a->t, &ob));
        FL_TRY(check_ptr(k, "in", a->in, ib));
        FL_TRY(check_ptr(k, "out", a->out, ob));
        if (overlap(a->in, ib, a->out, ob))
            return fl_fail(FL_EINVAL, "alltoallv: out overlaps in (not supported in place)");
        if (a->counts[c->rank] != a->recv_counts[c->rank])
            return fl_fail(FL_EINVAL, "alltoallv: rank %d sends itself %zu elements but "
                           "expects %zu", c->rank, a->counts[c->rank], a->recv_counts[c->rank]);
        break;
    }
    case OP_ALLTOALL:
        FL_TRY(check_dtype(k, a->t, false));
        FL_TRY(check_bytes(k, a->count, (size_t)c->size, a->t, &ib));
        ob = ib;
        FL_TRY(check_ptr(k, "in", a->in, ib));
        FL_TRY(check_ptr(k, "out", a->out, ob));
        if (overlap(a->in, ib, a->out, ob))
            return fl_fail(FL_EINVAL, "alltoall: out overlaps in (not supported in place)");
        break;
    }
    return check_backend(c, k);
}

/* --- the comm thread and the queue --- */

static void *comm_thread(void *arg) {
    fl_comm *c = arg;
    comm_request_queue *q = c->queue;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->work, &q->mu);
        if (!q->head)
            break; /* stop, and everything issued has run */
        fl_request *r = q->head;
        q->head = r->next;
        if (!q->head)
            q->tail = NULL;
        int rc;
        if (c->failed) {
            rc = c->fail_code;
            snprintf(r->msg, sizeof r->msg, "%s", c->fail_msg);
        } else {
            pthread_mutex_unlock(&q->mu);
            if (r->a.ready) /* the buffer's producer (a device copy) finishes first */
                r->a.ready(r->a.ready_arg);
            pthread_mutex_lock(&c->exec_lock);
            rc = execute(r->c, &r->a); /* r->c: c or one of its views */
            pthread_mutex_unlock(&c->exec_lock);
            if (rc < 0)
                snprintf(r->msg, sizeof r->msg, "%s", fl_errmsg());
            pthread_mutex_lock(&q->mu);
        }
        r->status = rc;
        r->done = true;
        q->pending--;
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static int start_queue(fl_comm *c) {
    comm_request_queue *q = calloc(1, sizeof *q);
    if (!q)
        return fl_fail(FL_ENOMEM, "comm: out of memory");
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, NULL);
    c->queue = q;
    int err = pthread_create(&q->thread, NULL, comm_thread, c);
    if (err) {
        c->queue = NULL;
        pthread_cond_destroy(&q->done);
        pthread_cond_destroy(&q->work);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return fl_fail(FL_EIO, "comm: cannot start the comm thread: %s", strerror(err));
    }
    return 0;
}

/* Waits until every issued request has completed. */
static void drain(fl_comm *c) {
    comm_request_queue *q = c->queue;
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    while (q->pending)
        pthread_cond_wait(&q->done, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

static int run_blocking(fl_comm *c, const call *a) {
    FL_TRY(validate(c, a));
    fl_comm *root = root_of(c);
    drain(root); /* the comm thread is idle from here until this thread issues again */
    if (root->failed)
        return failed_already(root);
    pthread_mutex_lock(&root->exec_lock);
    int rc = execute(c, a);
    pthread_mutex_unlock(&root->exec_lock);
    return rc;
}

static int submit(fl_comm *c, const call *a, fl_request **req) {
    FL_ASSERT(req != NULL);
    *req = NULL;
    FL_TRY(validate(c, a));
    fl_request *r = calloc(1, sizeof *r);
    if (!r)
        return fl_fail(FL_ENOMEM, "comm: out of memory");
    r->c = c;
    r->a = *a;
    if (a->kind == OP_ALLGATHERV || a->kind == OP_ALLTOALLV) {
        size_t n = (size_t)c->size, arrays = a->kind == OP_ALLTOALLV ? 2 : 1;
        r->counts_copy = malloc(arrays * n * sizeof *r->counts_copy);
        if (!r->counts_copy) {
            free(r);
            return fl_fail(FL_ENOMEM, "comm: out of memory");
        }
        memcpy(r->counts_copy, a->counts, n * sizeof *r->counts_copy);
        r->a.counts = r->counts_copy;
        if (arrays == 2) {
            memcpy(r->counts_copy + n, a->recv_counts, n * sizeof *r->counts_copy);
            r->a.recv_counts = r->counts_copy + n;
        }
    }
    fl_comm *root = root_of(c);
    int rc = root->queue ? 0 : start_queue(root);
    if (rc < 0)
        goto fail;
    comm_request_queue *q = root->queue;
    pthread_mutex_lock(&q->mu);
    if (root->failed) {
        rc = failed_already(c);
        pthread_mutex_unlock(&q->mu);
        goto fail;
    }
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->pending++;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    *req = r;
    return 0;
fail:
    free(r->counts_copy);
    free(r);
    return rc;
}

int fl_request_wait(fl_request *r) {
    if (!r)
        return 0;
    comm_request_queue *q = root_of(r->c)->queue;
    pthread_mutex_lock(&q->mu);
    while (!r->done)
        pthread_cond_wait(&q->done, &q->mu);
    pthread_mutex_unlock(&q->mu);
    int rc = r->status;
    if (rc < 0)
        fl_fail(rc, "%s", r->msg);
    free(r->counts_copy);
    free(r);
    return rc;
}

int fl_request_test(fl_request *r) {
    if (!r)
        return 1;
    comm_request_queue *q = root_of(r->c)->queue;
    pthread_mutex_lock(&q->mu);
    int done = r->done;
    pthread_mutex_unlock(&q->mu);
    return done;
}

/* --- life cycle --- */

static void free_blank_view(fl_comm *v); /* node groups, below */

fl_comm *fl_comm_new(void) {
    fl_comm *c = calloc(1, sizeof *c);
    if (!c) {
        fl_fail(FL_ENOMEM, "comm: out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->exec_lock, NULL);
    atomic_init(&c->counters.bytes_sent, 0);
    atomic_init(&c->counters.bytes_received, 0);
    return c;
}

void fl_comm_free(fl_comm *c) {
    if (!c || c->root) /* a view goes with its communicator */
        return;
    comm_request_queue *q = c->queue;
    if (q) { /* the comm thread runs what was issued, then exits */
        pthread_mutex_lock(&q->mu);
        q->stop = true;
        pthread_cond_signal(&q->work);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
        pthread_cond_destroy(&q->done);
        pthread_cond_destroy(&q->work);
        pthread_mutex_destroy(&q->mu);
        free(q);
        c->queue = NULL;
    }
    free_blank_view(c->node_view); /* views first: they borrow the connections */
    free_blank_view(c->cross_view);
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
    free(c->endpoints);
    pthread_mutex_destroy(&c->exec_lock);
    free(c);
}

/* --- node groups --- */

/* A blank view of root with the given rank, size and members' endpoints. */
static fl_comm *new_view(fl_comm *root, int rank, int size, const int *members) {
    fl_comm *v = fl_comm_new();
    if (!v)
        return NULL;
    v->root = root;
    v->rank = rank;
    v->size = size;
    if (root->endpoints) {
        v->endpoints = calloc((size_t)size, sizeof *v->endpoints);
        if (!v->endpoints) {
            pthread_mutex_destroy(&v->exec_lock);
            free(v);
            fl_fail(FL_ENOMEM, "comm: out of memory");
            return NULL;
        }
        for (int i = 0; i < size; i++)
            memcpy(v->endpoints[i], root->endpoints[members[i]], FL_ENDPOINT_MAX);
    }
    return v;
}

static void free_blank_view(fl_comm *v) {
    if (!v)
        return;
    if (v->ops && v->ops->destroy)
        v->ops->destroy(v);
    free(v->endpoints);
    pthread_mutex_destroy(&v->exec_lock);
    free(v);
}

int fl_comm_split_nodes(fl_comm *c, int local_size, fl_comm **node, fl_comm **cross) {
    FL_ASSERT(c != NULL);
    if (c->root)
        return fl_fail(FL_EINVAL, "comm: a node group cannot be split again");
    int L = local_size > 0 ? local_size : c->env_local_size > 0 ? c->env_local_size : 1;
    if (c->size % L != 0)
        return fl_fail(FL_EINVAL, "comm: %d ranks cannot form nodes of %d ranks each (every "
                       "node needs the same number of ranks)", c->size, L);
    if (local_size <= 0 && c->env_local_size > 0 && c->env_node != c->rank / L)
        return fl_fail(FL_EINVAL, "comm: rank %d is on node %d, but node groups need ranks "
                       "numbered node by node (node %d would hold ranks %d..%d)", c->rank,
                       c->env_node, c->rank / L, c->rank / L * L, c->rank / L * L + L - 1);
    if (c->node_view) {
        if (c->split_local_size != L)
            return fl_fail(FL_EINVAL, "comm: already split into nodes of %d ranks, not %d",
                           c->split_local_size, L);
    } else {
        if (!c->ops->split)
            return fl_fail(FL_EUNSUPPORTED, "comm: backend %s has no node groups (use tcp)",
                           c->ops->name);
        int M = c->size / L, me_node = c->rank / L, me_local = c->rank % L;
        int *nm = malloc((size_t)L * sizeof *nm), *cm = malloc((size_t)M * sizeof *cm);
        fl_comm *nv = NULL, *cv = NULL;
        int rc = FL_ENOMEM;
        if (nm && cm) {
            for (int i = 0; i < L; i++)
                nm[i] = me_node * L + i;
            for (int j = 0; j < M; j++)
                cm[j] = j * L + me_local;
            nv = new_view(c, me_local, L, nm);
            cv = nv ? new_view(c, me_node, M, cm) : NULL;
            if (cv) { /* the split may talk (shared memory for the node): nothing else may */
                drain(c);
                pthread_mutex_lock(&c->exec_lock);
                rc = c->ops->split(c, nv, nm, cv, cm);
                pthread_mutex_unlock(&c->exec_lock);
            }
        } else {
            fl_fail(FL_ENOMEM, "comm: out of memory");
        }
        free(nm);
        free(cm);
        if (rc < 0) {
            free_blank_view(nv);
            free_blank_view(cv);
            return rc;
        }
        c->node_view = nv;
        c->cross_view = cv;
        c->split_local_size = L;
    }
    if (node)
        *node = c->node_view;
    if (cross)
        *cross = c->cross_view;
    return 0;
}

int fl_comm_set_hierarchical(fl_comm *c, int on) {
    FL_ASSERT(c != NULL);
    if (c->root)
        return fl_fail(FL_EINVAL, "comm: a node group has no hierarchy of its own");
    if (on && !c->node_view)
        FL_TRY(fl_comm_split_nodes(c, 0, NULL, NULL));
    drain(c);
    pthread_mutex_lock(&c->exec_lock);
    c->hierarchical = on != 0;
    pthread_mutex_unlock(&c->exec_lock);
    return 0;
}

int fl_comm_local_size(const fl_comm *c) {
    FL_ASSERT(c != NULL);
    const fl_comm *r = root_of(c);
    return r->split_local_size ? r->split_local_size
                               : r->env_local_size > 0 ? r->env_local_size : 1;
}

/* --- queries --- */

int fl_comm_rank(const fl_comm *c) {
    FL_ASSERT(c != NULL);
    return c->rank;
}

int fl_comm_size(const fl_comm *c) {
    FL_ASSERT(c != NULL);
    return c->size;
}

const char *fl_comm_backend(const fl_comm *c) {
    FL_ASSERT(c != NULL);
    return c->ops ? c->ops->name : "";
}

const char *fl_comm_endpoint(const fl_comm *c, int r) {
    FL_ASSERT(c != NULL);
    if (!c->endpoints || r < 0 || r >= c->size)
        return "";
    return c->endpoints[r];
}

void fl_comm_get_stats(const fl_comm *c, fl_comm_stats *out) {
    FL_ASSERT(c != NULL && out != NULL);
    fl_comm *m = root_of(c); /* the lock is not part of the value */
    out->bytes_sent = atomic_load(&m->counters.bytes_sent);
    out->bytes_received = atomic_load(&m->counters.bytes_received);
    lock_shared(m);
    out->seconds = m->seconds;
    out->ops = m->ops_done;
    unlock_shared(m);
}

void fl_comm_reset_stats(fl_comm *c) {
    FL_ASSERT(c != NULL);
    c = root_of(c);
    atomic_store(&c->counters.bytes_sent, 0);
    atomic_store(&c->counters.bytes_received, 0);
    lock_shared(c);
    c->seconds = 0;
    c->ops_done = 0;
    unlock_shared(c);
}

/* --- the collectives --- */

int fl_comm_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    call a = {.kind = OP_ALLREDUCE, .out = buf, .count = count, .t = t, .op = op};
    return run_blocking(c, &a);
}

int fl_comm_reduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                           fl_redop op) {
    call a = {.kind = OP_REDUCE_SCATTER, .in = in, .out = out, .count = count, .t = t, .op = op};
    return run_blocking(c, &a);
}

int fl_comm_allgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    call a = {.kind = OP_ALLGATHER, .in = in, .out = out, .count = count, .t = t};
    return run_blocking(c, &a);
}

int fl_comm_allgatherv(fl_comm *c, const void *in, void *out, const size_t *counts, fl_dtype t) {
    call a = {.kind = OP_ALLGATHERV, .in = in, .out = out, .counts = counts, .t = t};
    return run_blocking(c, &a);
}

int fl_comm_alltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                      const size_t *recv_counts, fl_dtype t) {
    call a = {.kind = OP_ALLTOALLV, .in = in, .out = out, .counts = send_counts,
              .recv_counts = recv_counts, .t = t};
    return run_blocking(c, &a);
}

int fl_comm_ialltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                       const size_t *recv_counts, fl_dtype t, fl_request **req) {
    call a = {.kind = OP_ALLTOALLV, .in = in, .out = out, .counts = send_counts,
              .recv_counts = recv_counts, .t = t};
    return submit(c, &a, req);
}

int fl_comm_alltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    call a = {.kind = OP_ALLTOALL, .in = in, .out = out, .count = count, .t = t};
    return run_blocking(c, &a);
}

int fl_comm_ialltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                      fl_request **req) {
    call a = {.kind = OP_ALLTOALL, .in = in, .out = out, .count = count, .t = t};
    return submit(c, &a, req);
}

int fl_comm_broadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root) {
    call a = {.kind = OP_BROADCAST, .out = buf, .count = count, .t = t, .root = root};
    return run_blocking(c, &a);
}

int fl_comm_barrier(fl_comm *c) {
    call a = {.kind = OP_BARRIER};
    return run_blocking(c, &a);
}

int fl_comm_iallreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op,
                       fl_request **req) {
    call a = {.kind = OP_ALLREDUCE, .out = buf, .count = count, .t = t, .op = op};
    return submit(c, &a, req);
}

int fl_comm_iallreduce_gated(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op,
                             void (*ready)(void *arg), void *arg, fl_request **req) {
    call a = {.kind = OP_ALLREDUCE, .out = buf, .count = count, .t = t, .op = op,
              .ready = ready, .ready_arg = arg};
    return submit(c, &a, req);
}

int fl_comm_ireduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                            fl_redop op, fl_request **req) {
    call a = {.kind = OP_REDUCE_SCATTER, .in = in, .out = out, .count = count, .t = t, .op = op};
    return submit(c, &a, req);
}

int fl_comm_iallgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                       fl_request **req) {
    call a = {.kind = OP_ALLGATHER, .in = in, .out = out, .count = count, .t = t};
    return submit(c, &a, req);
}

int fl_comm_iallgatherv(fl_comm *c, const void *in, void *out, const size_t *counts, fl_dtype t,
                        fl_request **req) {
    call a = {.kind = OP_ALLGATHERV, .in = in, .out = out, .counts = counts, .t = t};
    return submit(c, &a, req);
}

int fl_comm_ibroadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root,
                       fl_request **req) {
    call a = {.kind = OP_BROADCAST, .out = buf, .count = count, .t = t, .root = root};
    return submit(c, &a, req);
}
