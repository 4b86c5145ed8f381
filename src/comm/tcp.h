/* tcp.h - the tcp backend's knobs: where it switches algorithms (algorithms.h), and a tcp
 * communicator over sockets made elsewhere (tests). Private to src/comm and its tests. */
#ifndef FLEET_COMM_TCP_H
#define FLEET_COMM_TCP_H

#include "comm_impl.h"
#include "transport.h"

#include <stddef.h>

/* Where the tcp backend switches algorithms (see tcp.c for how the defaults were measured). */
typedef struct {
    size_t rd_max_bytes;      /* allreduce: recursive doubling up to this many bytes (unless
                                 Rabenseifner's applies), else ring
                                 (env FLEET_TCP_RD_MAX_BYTES overrides the default) */
    size_t rh_min_ranks;      /* allreduce: Rabenseifner's with at least this many ranks for
                                 buffers of rh_min_bytes to rh_max_bytes bytes (env
                                 FLEET_TCP_RH_MIN_RANKS, _RH_MIN_BYTES, _RH_MAX_BYTES) */
    size_t rh_min_bytes;
    size_t rh_max_bytes;
    size_t seg_max_bytes;     /* ring: at most this many bytes per segment; larger buffers go
                                 round the ring in several passes (bounds the scratch buffer) */
    size_t bcast_tree_max_bytes; /* broadcast: binomial tree up to this many bytes, else chain */
    size_t bcast_chunk_bytes; /* broadcast chain: pipeline chunk */
    size_t bruck_max_bytes;   /* allgather(v): Bruck up to this many gathered bytes, else ring;
                                 alltoall: Bruck up to this many bytes in (size * count), else
                                 pairwise exchange (env FLEET_TCP_BRUCK_MAX_BYTES) */
    size_t bruck_round_bytes; /* allgather(v) over sockets: also Bruck up to this many gathered
                                 bytes per message round it saves against the ring (n - 1 -
                                 ceil(log2 n)) (env FLEET_TCP_BRUCK_ROUND_BYTES) */
} fl_tcp_tuning;

/* The allreduce the tcp backend runs for `bytes` over n ranks (a flat communicator; the
 * hierarchical one is hier.c's): Rabenseifner's when n >= rh_min_ranks and bytes is within
 * [rh_min_bytes, rh_max_bytes]; else recursive doubling when bytes <= rd_max_bytes and
 * (n < rh_min_ranks or bytes < rh_min_bytes); else the ring. */
typedef enum { FL_TCP_ALLREDUCE_RD, FL_TCP_ALLREDUCE_RH, FL_TCP_ALLREDUCE_RING } fl_tcp_allreduce;
fl_tcp_allreduce fl_tcp_allreduce_choice(const fl_tcp_tuning *tune, int n, size_t bytes);

/* Whether the tcp backend gathers `bytes` in all over n ranks with Bruck's allgather(v) rather
 * than the ring: up to bruck_max_bytes, and over sockets (shm false) also up to
 * bruck_round_bytes for every round it saves (n - 1 - ceil(log2 n)), so the switch point grows
 * with the rank count (1 MiB up to 8 ranks, 30 MiB at 128 by default). */
bool fl_tcp_gather_bruck(const fl_tcp_tuning *tune, int n, size_t bytes, bool shm);

/* A tcp communicator over already-connected sockets (fds[r] for r != rank, fds[rank] = -1;
 * ownership passes to the communicator), e.g. socketpair()s between threads in tests
 * (registry.c: it makes communicators). */
int fl_comm_tcp_from_fds(int rank, int size, const int *fds, double timeout_s, fl_comm **out);
/* tcp.c: fills the blank communicator c (fl_comm_new) as fl_comm_tcp_from_fds describes; the
 * fds are closed on failure, c is then freed by the caller. */
int fl_comm_tcp_open_fds(fl_comm *c, int rank, int size, const int *fds, double timeout_s);
/* Fills the blank view `view` (rank and size set by comm.c's split) with the tcp backend over
 * members[view->size], ranks of another backend's transport tp (NULL when the view has one
 * rank), which stays that backend's (it must outlive the view): the cross-node view of the
 * nccl backend's node groups (hier_views.h). Always sockets, never shared memory: its ranks
 * are on different nodes. */
int fl_comm_tcp_view(fl_comm *view, fl_transport *tp, const int *members, double timeout_s);
/* Reads / replaces the switch points of a tcp communicator (tests force each algorithm). */
void fl_comm_tcp_get_tuning(const fl_comm *c, fl_tcp_tuning *out);
void fl_comm_tcp_set_tuning(fl_comm *c, const fl_tcp_tuning *tuning);

#endif /* FLEET_COMM_TCP_H */
