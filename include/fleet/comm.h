/* comm.h - the communicator: ranks, collectives (blocking and async), counters; backends tcp
 * (built in, default) and mpi (when OpenMPI is found) behind one table of function pointers.
 *
 *     fl_comm *c;
 *     if (fl_comm_init_from_env(NULL, &c) < 0) { fprintf(stderr, "%s\n", fl_errmsg()); ... }
 *     fl_comm_allreduce(c, grads, n, FL_DTYPE_F32, FL_REDOP_AVG);     // in place, every rank
 *     fl_request *r;
 *     fl_comm_iallreduce(c, bucket, m, FL_DTYPE_F32, FL_REDOP_SUM, &r); // runs on the comm thread
 *     ... compute ...
 *     fl_request_wait(r);                                               // frees r
 *     fl_comm_free(c);
 *
 * Semantics, the same on every backend:
 * - Collectives are called by every rank in the same order with the same counts, dtype and op.
 *   Async ones complete in issue order; a blocking call first waits for outstanding async ones.
 * - Results are bit-identical on every rank and across repeated runs with the same size and
 *   rank count: reductions happen in a fixed order that depends only on (rank count, count).
 * - f16 and bf16 are reduced in f32 and rounded after each addition (as NCCL does). avg on
 *   integer types is the sum divided by the rank count, rounded toward zero.
 * - Every wait has a deadline (FLEET_COMM_TIMEOUT seconds, default 300). A peer that dies or
 *   stays silent fails the call with FL_EPEER / FL_ETIMEOUT and a message naming its rank and
 *   endpoint; the rank that notices tells the others, so every surviving rank names the same
 *   culprit. After a failure the communicator is unusable: free it.
 * - Thread-safety: one thread issues collectives on a communicator (the comm thread is internal).
 */
#ifndef FLEET_COMM_H
#define FLEET_COMM_H

#include "fleet/tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FL_REDOP_SUM = 0, FL_REDOP_AVG, FL_REDOP_MAX, FL_REDOP_COUNT } fl_redop;

const char *fl_redop_name(fl_redop op);
int fl_redop_parse(const char *name, fl_redop *out);

#define FL_COMM_MAX_RANKS 4096
#define FL_ENDPOINT_MAX 64 /* "host:port" incl. NUL */
#define FL_TOKEN_MAX 65    /* job token, up to 64 chars incl. NUL */
enum { FL_COMM_ENCRYPT_AUTO = 0, FL_COMM_ENCRYPT_OFF = 1, FL_COMM_ENCRYPT_ON = 2 };

/* Who this process is in the job, as a launcher (fleetrun, torchrun, mpirun) described it. */
typedef struct {
    int    rank;
    int    size;
    char (*endpoints)[FL_ENDPOINT_MAX]; /* [size] "ip:port" of every rank (tcp); owned; NULL
                                           under mpirun, and under torchrun (see master) */
    char   master[FL_ENDPOINT_MAX];     /* torchrun: "MASTER_ADDR:MASTER_PORT"; when set, the
                                           endpoints are exchanged through it at rendezvous
                                           (fl_transport_open); "" otherwise */
    char   token[FL_TOKEN_MAX];         /* FLEET_JOB_TOKEN */
    double timeout_s;                   /* FLEET_COMM_TIMEOUT */
    int    listen_fd;                   /* FLEET_LISTEN_FD: a listening socket fleetrun
                                           inherited to us (-1: bind the endpoint ourselves) */
    char   backend[16];                 /* "tcp", "mpi", or "" for automatic */
    int    tcp_only;                    /* FLEET_COMM_LOCAL=0: keep TCP to peers on this host
                                           (default 0: they switch to a unix socket) */
    int    gpu;                         /* FLAGS_selected_gpus, -1 if unset */
    int    encrypt;                     /* FLEET_COMM_ENCRYPT: 0 auto (between hosts only;
                                           the default), 1 off, 2 on (FL_COMM_ENCRYPT_*) */
    unsigned round;                     /* FLEET_RESTART_COUNT: fleetrun's restart round,
                                           bound into the handshake (0 without) */
    /* topology (src/comm/topology.c): this rank's node (0 .. nnodes - 1) and its place among
     * the local_size ranks of that node. From LOCAL_RANK + LOCAL_WORLD_SIZE (+ GROUP_RANK;
     * torchrun, fleetrun) or OMPI_COMM_WORLD_LOCAL_RANK/_SIZE, else ranks whose endpoints
     * name the same host share a node, else each rank is a node of its own. */
    int    local_rank, local_size, node, nnodes;
} fl_comm_env;

/* Splits a launcher's endpoint list ("ip:port,ip:port", blanks around entries allowed) named
 * `name` in messages (the variable) into *out (calloc'd, the caller frees; *count entries).
 * FL_ECONFIG naming the variable for more than max entries, an empty or unparseable entry, or
 * one endpoint listed twice; FL_ENOMEM. */
int  fl_comm_endpoints_split(const char *name, const char *list, int max,
                             char (**out)[FL_ENDPOINT_MAX], int *count);
/* Whether two endpoints are the same, written alike or not ("LOCALHOST:6170", "localhost:6170"). */
bool fl_comm_same_endpoint(const char *a, const char *b);

/* Reads the environment: PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,
 * PADDLE_CURRENT_ENDPOINT (fleetrun / paddle.distributed.launch), else RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT (torchrun; endpoints are then exchanged through the master at
 * rendezvous), else OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE (mpirun: backend mpi), else
 * a single rank. Refuses inconsistent values with a message saying which variable is wrong
 * (id out of range, endpoint count != trainer count, unparseable endpoint, current endpoint
 * not the id-th entry). Also reads FLEET_JOB_TOKEN (a multi-rank tcp job without one gets a
 * token derived from the endpoints, with a warning), FLEET_COMM_TIMEOUT, FLEET_LISTEN_FD,
 * FLEET_COMM_BACKEND, FLEET_COMM_LOCAL, FLEET_COMM_ENCRYPT, FLEET_RESTART_COUNT and
 * FLAGS_selected_gpus. fl_comm_env_clear frees
 * endpoints. */
int  fl_comm_env_read(fl_comm_env *env);
/* Fills the topology fields of env (rank, size and endpoints already read); FL_ECONFIG naming
 * the variable when LOCAL_RANK / LOCAL_WORLD_SIZE / GROUP_RANK are inconsistent. Called by
 * fl_comm_env_read. */
int  fl_comm_env_topology(fl_comm_env *env);
void fl_comm_env_clear(fl_comm_env *env);

typedef struct fl_comm fl_comm;
typedef struct fl_request fl_request;

/* Creates the communicator described by env (NULL: fl_comm_env_read()). Backend: env->backend,
 * or mpi when started by mpirun and mpi is built, else tcp. For tcp this listens, connects to
 * every peer, and authenticates each with the challenge-response handshake (proof of the
 * job token without sending it; src/comm/handshake.h) before returning; strangers are logged and dropped. Blocks until all ranks are connected or
 * the timeout passes (then FL_ETIMEOUT naming the ranks still missing). */
int  fl_comm_init(const fl_comm_env *env, fl_comm **out);
/* Convenience: fl_comm_env_read + fl_comm_init (backend_override, if not NULL, wins). */
int  fl_comm_init_from_env(const char *backend_override, fl_comm **out);
/* Waits for outstanding requests, closes connections, frees. NULL is a no-op. */
void fl_comm_free(fl_comm *c);

int         fl_comm_rank(const fl_comm *c);
int         fl_comm_size(const fl_comm *c);
const char *fl_comm_backend(const fl_comm *c);
/* "ip:port" of rank r ("" on backends without endpoints). */
const char *fl_comm_endpoint(const fl_comm *c, int r);

/* --- blocking collectives (count = elements; 0 is allowed everywhere) --- */
/* buf (count) on every rank becomes op over all ranks' buf. */
int fl_comm_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op);
/* in (size * count): rank r receives into out (count) op over all ranks of in[r*count ..). */
int fl_comm_reduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                           fl_redop op);
/* in (count) from each rank, concatenated in rank order into out (size * count). */
int fl_comm_allgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t);
/* in (counts[rank]) from each rank, concatenated in rank order into out (sum of counts).
 * counts[] is the same on every rank; entries may be 0. */
int fl_comm_allgatherv(fl_comm *c, const void *in, void *out, const size_t *counts, fl_dtype t);
/* Personalised exchange (MPI_Alltoallv): in holds one block per rank in rank order, the j-th
 * of send_counts[j] elements, sent to rank j; out receives one block per rank in rank order,
 * the j-th of recv_counts[j] elements, from rank j. The counts may differ per pair and be 0,
 * but must agree: recv_counts[j] on rank r is send_counts[r] on rank j (a mismatch breaks the
 * exchange with that peer, which is named; a rank whose own two counts differ gets FL_EINVAL).
 * in and out must not overlap. The building block
 * of sparse collectives (docs/comm.md). */
int fl_comm_alltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                      const size_t *recv_counts, fl_dtype t);
/* Personalised exchange of equal blocks (MPI_Alltoall): in holds size blocks of count elements
 * in rank order, the j-th sent to rank j; out receives size blocks of count elements, the j-th
 * from rank j. count is the same on every rank and may be 0; in and out must not overlap. On
 * tcp, small exchanges take ceil(log2 size) rounds instead of size - 1 (docs/comm.md). */
int fl_comm_alltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t);
/* Sparse allreduce (src/comm/sparse.c; docs/dgc.md): each rank gives m (index, value) pairs
 * of a tensor of n values, indices strictly ascending in [0, n). Every rank receives the same
 * out_count <= max_keep pairs, ascending by index: for each index given by any rank, the sum of
 * its values in rank order (bit for bit what a dense sum in rank order gives), all of them when
 * there are at most max_keep distinct indices, else those above a global magnitude threshold
 * (a top max_keep at 17-bit resolution: at most max_keep kept). kept[i] (m bytes) says whether
 * the rank's i-th pair's index is among them: a caller returns the others to its residual.
 * Each rank sends about m and receives about m + max_keep pairs, whatever the rank count
 * (alltoallv to range owners, allgatherv of the kept sums). Collective; FL_EINVAL for
 * indices out of order or range. out_idx / out_val hold max_keep entries. */
int fl_comm_sparse_allreduce(fl_comm *c, int64_t n, const int32_t *idx, const float *val,
                             int64_t m, int64_t max_keep, int32_t *out_idx, float *out_val,
                             int64_t *out_count, uint8_t *kept);
/* buf (count) of root copied to every rank. */
int fl_comm_broadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root);
int fl_comm_barrier(fl_comm *c);

/* --- async forms: same arguments; buffers must stay valid and untouched until the request
 * completes. *req is owned by the caller until fl_request_wait, which frees it. --- */
int fl_comm_iallreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op,
                       fl_request **req);
/* fl_comm_iallreduce for a buffer that is still being filled when it is issued (a
 * device-to-host copy in flight): the comm thread calls ready(arg) after every earlier request
 * and before this collective touches buf; ready returns once buf holds the data (a device
 * event's sync). ready cannot fail: a device error ends the process (the peers name it). */
int fl_comm_iallreduce_gated(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op,
                             void (*ready)(void *arg), void *arg, fl_request **req);
int fl_comm_ireduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                            fl_redop op, fl_request **req);
int fl_comm_iallgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                       fl_request **req);
int fl_comm_iallgatherv(fl_comm *c, const void *in, void *out, const size_t *counts, fl_dtype t,
                        fl_request **req);
int fl_comm_ialltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                       const size_t *recv_counts, fl_dtype t, fl_request **req);
int fl_comm_ialltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                      fl_request **req);
int fl_comm_ibroadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root,
                       fl_request **req);
/* Waits for completion and frees req; returns the operation's status (its message in
 * fl_errmsg on failure). NULL is a no-op returning 0. */
int fl_request_wait(fl_request *req);
/* 1 if complete (then fl_request_wait returns at once), 0 if not. */
int fl_request_test(fl_request *req);

/* --- node groups (Horovod's local and cross communicators) and hierarchical allreduce --- */
/* Splits c's ranks into nodes of local_size consecutive ranks (0: the topology of the
 * environment, fl_comm_env's local_size; LOCAL_WORLD_SIZE set by hand emulates several nodes on
 * one machine): *node (may be NULL) gets a communicator of this node's ranks (rank = local
 * rank), *cross one of the ranks with this local rank on every node (rank = node index). Both
 * are views: they share c's connections, comm thread, failure state and counters (their stats
 * are c's), collectives on c and on its views run one at a time in issue order, and they are
 * freed with c (fl_comm_free on a view does nothing). Every rank calls it with the same
 * local_size; a second call returns the same views. FL_EINVAL when the ranks do not divide into
 * equal nodes or are not numbered node by node; FL_EUNSUPPORTED on backends without groups
 * (mpi). Collective over each node: ranks of a node that share a host (tcp backend) move to
 * shared memory for the node view (FLEET_COMM_SHM=0 or FLEET_COMM_LOCAL=0: they do not). */
int fl_comm_split_nodes(fl_comm *c, int local_size, fl_comm **node, fl_comm **cross);
/* Paddle's use_hierarchical_allreduce: with on, allreduce on c (blocking and async) becomes a
 * reduce-scatter inside the node, an allreduce of each rank's share among the nodes and an
 * allgather inside the node (src/comm/hier.c), whenever there are several nodes of several
 * ranks (splitting with the environment's topology first if c was not split). Results are
 * bit-identical on every rank, and equal to the flat allreduce's up to rounding. Every rank
 * makes the same choice; waits for outstanding requests. */
int fl_comm_set_hierarchical(fl_comm *c, int on);
/* Ranks per node: as split, else as the environment says (1 when it says nothing). */
int fl_comm_local_size(const fl_comm *c);

/* --- counters --- */
typedef struct {
    uint64_t bytes_sent;     /* payload bytes this rank sent (headers included) */
    uint64_t bytes_received;
    double   seconds;        /* wall time inside collectives (from start to completion) */
    uint64_t ops;            /* collectives completed */
} fl_comm_stats;

void fl_comm_get_stats(const fl_comm *c, fl_comm_stats *out);
void fl_comm_reset_stats(fl_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_COMM_H */
