/* comm_impl.h - what a communicator backend implements (a table of blocking collectives), and
 * the state every communicator shares: ranks, endpoints, counters, the async request queue.
 * comm.c validates arguments, keeps async requests in issue order on one comm thread, and
 * calls the backend; backends (tcp.c, mpi.c) never see requests; registry.c makes them. */
#ifndef FLEET_COMM_IMPL_H
#define FLEET_COMM_IMPL_H

#include "fleet/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Counters updated by the transport as bytes move (any thread). */
typedef struct {
    _Atomic uint64_t bytes_sent;
    _Atomic uint64_t bytes_received;
} fl_comm_counters;

/* A backend: blocking collectives with already-validated arguments. An entry left NULL means
 * "not supported"; comm.c says so. All receive the communicator for rank/size/backend state. */
struct fl_comm_ops {
    const char *name;
    int  (*allreduce)(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op);
    /* Optional: the hierarchical allreduce. comm.c alone chooses it (fl_comm_set_hierarchical
     * on, node and cross views made, more than one node) over allreduce; the backend says how:
     * tcp's fuses the three steps over its peers with bounded scratch (hier.c), nccl's composes
     * its views' own collectives (hier_views.c). NULL: allreduce serves. */
    int  (*hier_allreduce)(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op);
    int  (*reduce_scatter)(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                           fl_redop op);
    int  (*allgather)(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t);
    int  (*allgatherv)(fl_comm *c, const void *in, void *out, const size_t *counts, fl_dtype t);
    int  (*alltoallv)(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                      const size_t *recv_counts, fl_dtype t);
    /* Optional: NULL runs alltoallv with every count `count` instead (comm.c). */
    int  (*alltoall)(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t);
    int  (*broadcast)(fl_comm *c, void *buf, size_t count, fl_dtype t, int root);
    int  (*barrier)(fl_comm *c);
    /* Fills the blank views node (this node's ranks) and cross (this local rank on every node),
     * whose rank and size comm.c has set, with their ops and backend state over c's
     * connections; node_ranks[node->size] and cross_ranks[cross->size] are their members' ranks
     * in c. NULL: the backend has no node groups. */
    int  (*split)(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
                  const int *cross_ranks);
    /* Releases backend state (connections, MPI). */
    void (*destroy)(fl_comm *c);
};

/* Reads the FLEET_* knobs (FLEET_JOB_TOKEN, FLEET_COMM_TIMEOUT, FLEET_LISTEN_FD,
 * FLEET_COMM_ENCRYPT, FLEET_RESTART_COUNT, ...) into env, which the caller has given its
 * defaults; FL_ECONFIG naming the variable. Part of fl_comm_env_read; the parameter server's
 * role maker (src/ps/ps_role.c) reads them alone, its ranks coming from other variables. */
int fl_comm_env_knobs(fl_comm_env *env);

/* Backend constructors (registry.c picks one). Each fills c->ops and c->backend, or fails
 * with a message. */
int fl_comm_tcp_open(fl_comm *c, const fl_comm_env *env);
int fl_comm_mpi_open(fl_comm *c, const fl_comm_env *env); /* FL_EUNSUPPORTED when not built */
bool fl_comm_mpi_available(void);

typedef struct comm_request_queue comm_request_queue; /* comm.c */

struct fl_comm {
    const struct fl_comm_ops *ops;
    void                     *backend; /* the backend's own state */
    int                       rank, size;
    char                    (*endpoints)[FL_ENDPOINT_MAX]; /* [size], owned */
    fl_comm_counters          counters;
    /* seconds inside collectives and completed ops: written only by the thread that runs
     * collectives while it holds exec_lock */
    double                    seconds;
    uint64_t                  ops_done;
    pthread_mutex_t           exec_lock; /* one collective runs at a time, in issue order */
    comm_request_queue       *queue;     /* async requests; NULL until the first one */
    bool                      failed;    /* a collective failed: the communicator is unusable */
    char                      fail_msg[512];
    int                       fail_code;
    /* topology as the environment described it (fl_comm_env): ranks per node, this rank's node */
    int                       env_local_size, env_node;
    /* node groups (fl_comm_split_nodes): views of this communicator, owned by it */
    fl_comm                  *node_view, *cross_view;
    int                       split_local_size;
    bool                      hierarchical; /* allreduce runs node / cross / node (hier.c) */
    /* a view: the communicator whose queue, locks, failure state and counters it shares
     * (NULL for a communicator of its own) */
    fl_comm                  *root;
};

/* comm.c: a zeroed communicator with its locks initialised and no backend (ops NULL), to be
 * filled by a backend constructor (registry.c) and released with fl_comm_free. NULL (message
 * set) when out of memory. */
fl_comm *fl_comm_new(void);

/* env.c: FLEET_COMM_SPIN_US in seconds (default 50 us; a bad value is warned about and the
 * default used): how long the transports (transport_sendrecv.c, shm.c) busy-poll per exchange
 * before they sleep. */
double fl_comm_spin_budget_s(void);

/* Reductions used by every backend that reduces by itself: acc[i] = acc[i] op in[i] for
 * n elements (avg reduces as sum; fl_reduce_finalize divides by the rank count at the end).
 * f16/bf16 go through f32 and are rounded after each operation. */
void fl_reduce_into(void *acc, const void *in, size_t n, fl_dtype t, fl_redop op);
void fl_reduce_finalize(void *buf, size_t n, fl_dtype t, fl_redop op, int nranks);

#endif /* FLEET_COMM_IMPL_H */
