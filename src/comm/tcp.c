/* tcp.c - the tcp backend: a transport (one authenticated full-duplex connection per peer) and
 * the choice of algorithm per collective: recursive doubling (rd.c) for small allreduces,
 * Rabenseifner's (rh.c) for medium ones at 8 ranks or more, the ring (ring.c) for large ones
 * and for reduce-scatter, Bruck (bruck.c) for small allgathers and alltoalls, the ring and
 * pairwise exchange (alltoall.c) for large ones, tree or chain broadcast (bcast.c). One rank
 * needs no network at all: collectives are local copies. */
#include "tcp.h"

#include "algorithms.h"
#include "group.h"
#include "shm.h"
#include "transport.h"

#include "fleet/log.h"

#include "fleet/status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Allreduce switch point: recursive doubling up to here, ring above (from 8 ranks Rabenseifner's
 * takes the range from 64 KiB to 4 MiB: below). Measured on one host
 * (Debian 12 VM, 2 cores: 4 ranks are oversubscribed) with
 *     FLEET_TCP_RD_MAX_BYTES=0 (ring) or 100000000 (rd) comm_check --bench 4096,...,1048576
 * under FLEET_COMM_LOCAL=0 (loopback TCP) and the default (peers on one host switch to unix
 * sockets); median microseconds per f32 sum allreduce, range of two runs:
 *
 *                  loopback TCP                          unix sockets
 *     bytes    2 ranks rd / ring   4 ranks rd / ring     2 ranks rd / ring   4 ranks rd / ring
 *     4 KiB        31-36 / 56-67    119-125 / 273-274        18-48 / 27        74-76 / 146-168
 *     64 KiB       48-67 / 71-87    176-218 / 324-356        61-69 / 40-49     99-162 / 198-215
 *     128 KiB      91-92 / 88-121   195-362 / 373-376        52-54 / 65       138-248 / 217-222
 *     256 KiB    208-298 / 213-286  629-705 / 710-711        61-63 / 117-121  228-417 / 418-436
 *     512 KiB    374-410 / 369-420 843-1283 / 1156-1163       112 / 181-194   416-824 / 543-603
 *     1 MiB      764-917 / 796-943 3095-3267 / 2236-2356     209-210 / 335-367 845-1783 / 914-1018
 *
 * Over TCP the two meet between 256 and 512 KiB for both rank counts (unix sockets favour
 * recursive doubling longer). Chosen: 256 KiB, the low end, because on slower links the
 * crossover moves down (for 4 ranks it is about 8 alpha / beta: latency over time per byte)
 * and recursive doubling sends log2(p) whole buffers where the ring sends 2(p-1)/p of one.
 * Overridable for benchmarking: FLEET_TCP_RD_MAX_BYTES. */
#define TCP_RD_MAX_BYTES ((size_t)256 << 10)
/* Rabenseifner's allreduce (rh.c) from 8 ranks, for 64 KiB to 4 MiB; recursive doubling below
 * 64 KiB there. Not measured (this host has 2 cores: 8 ranks would time the scheduler); chosen
 * from the alpha-beta costs of p ranks (a power of two) reducing n bytes, a the latency of a
 * round and b the time per byte:
 *     recursive doubling   log p (a + n b)
 *     Rabenseifner         2 log p a + 2 (p-1)/p n b
 *     ring                 2 (p-1) a + 2 (p-1)/p n b
 * Rabenseifner beats recursive doubling above n = a/b log p / (log p - 2 (p-1)/p): never at 2
 * ranks (the same bytes in twice the rounds), from 4 a/b at 4 ranks, 2.4 a/b at 8, 1.9 a/b at
 * 16. Below 8 ranks recursive doubling's log p copies of the buffer cost little more than
 * Rabenseifner's two halves and it takes half the rounds: at 4 ranks (1.5 buffers against 2, 4
 * rounds against 2) Rabenseifner is at most 11% faster, at 8 a/b, where the ring is as fast
 * (the table above puts that at 256-512 KiB on loopback: a/b is 32-64 KiB). From 8 ranks the
 * gap grows with log p: at 212 KB (DGC's dense remainder in ResNet-50) and a/b = 32 KiB,
 * Rabenseifner takes 17.3 a at 8 ranks where recursive doubling takes 22.4 a and the ring
 * 25.3 a. 64 KiB is 2 a/b there: just below the crossover at 8 ranks (Rabenseifner 6% slower),
 * above it at 16, and networks slower than loopback have a smaller a/b, which moves it down.
 * Over the ring Rabenseifner saves 2 (p-1) - 2 log p rounds (8 of 14 at 8 ranks) for the same
 * bytes, which matters less as n grows: 3% at 4 MiB and 8 ranks, where the ring takes over
 * with its bounded scratch (one 1 MiB segment; rh.c needs a buffer the size of the message).
 * Ranks beyond a power of two fold first in both recursive algorithms (one more buffer and 2
 * more rounds each). Overridable: FLEET_TCP_RH_MIN_RANKS, FLEET_TCP_RH_MIN_BYTES,
 * FLEET_TCP_RH_MAX_BYTES. */
#define TCP_RH_MIN_RANKS 8
#define TCP_RH_MIN_BYTES ((size_t)64 << 10)
#define TCP_RH_MAX_BYTES ((size_t)4 << 20)
/* Ring segments of at most 1 MiB: larger buffers go round in several passes, which keeps the
 * scratch buffer at 1 MiB whatever the size of the gradients. On loopback 1-4 MiB segments
 * were as fast as or faster than 16-64 MiB ones for 4-64 MiB allreduces; on netlab (4 hosts,
 * 1 Gbit/s) 1 MiB segments reached 0.99-1.00 of the ideal goodput at 16 and 64 MiB against
 * 0.91-0.95 with 4 MiB (bench/RESULTS.md). Overridable: FLEET_TCP_SEG_MAX_BYTES. */
#define TCP_SEG_MAX_BYTES ((size_t)1 << 20)
/* Broadcast: binomial tree up to 256 KiB, pipelined chain in 256 KiB chunks above (not
 * measured separately; bcast.c explains the choice of algorithms). */
#define TCP_BCAST_TREE_MAX_BYTES ((size_t)256 << 10)
#define TCP_BCAST_CHUNK_BYTES ((size_t)256 << 10)
/* Allgather(v) and alltoall: Bruck (bruck.c, ceil(log2 p) rounds) up to this many bytes
 * gathered (allgather(v): the whole result) or sent by each rank (alltoall: size * count), the
 * ring and pairwise exchange (p - 1 rounds) above. Measured on a 2-core Debian 12 VM shared
 * with other jobs at the time (load 3-5; runs of one setting differed up to 2x), with
 *     FLEET_TCP_BRUCK_MAX_BYTES=0 or 1000000000 comm_check --bench 4096,...,4194304 --op OP
 * under FLEET_COMM_LOCAL=0 (loopback TCP) and the default (shared memory); median over 7
 * alternated runs of the per-run median microseconds, Bruck / ring (or pairwise):
 *
 *                        allgather                               alltoall
 *                  loopback TCP     shared memory          loopback TCP     shared memory
 *   bytes     3 ranks   4 ranks  3 ranks  4 ranks     3 ranks   4 ranks  3 ranks  4 ranks
 *   4 KiB     172/201   141/225  7.7/7.3    20/10     136/137   200/250  8.0/7.7    11/20
 *   16 KiB    176/113   153/224  8.2/7.7    16/11     137/136   204/272  8.8/8.1    13/21
 *   64 KiB    183/196   258/228   11/9.5    17/14     142/139   268/281    13/10    22/25
 *   256 KiB   229/235   260/274    25/19    34/28     187/173   382/305    37/19    65/51
 *   1 MiB     386/387   363/436    93/64  107/100     343/285   891/516   114/62  267/173
 *   4 MiB   1424/2002 1809/2017  533/351  789/321   1636/1345 5415/1628  907/517 2232/949
 *
 * With 3 ranks both take 2 rounds, and differ by noise and Bruck's copies; with 4 (2 rounds
 * against 3) Bruck's allgather is ahead or even over TCP up to 4 MiB, while its alltoall, which
 * forwards blocks, falls behind from 256 KiB (1.7x at 1 MiB), and over shared memory, where a
 * round costs ~5 us, the copies make both lose from 256 KiB. Chosen: 1 MiB, for the allgather:
 * it moves the ring's bytes, and the rounds it saves grow with the rank count (at 128 ranks
 * and 50 us per message, 7 rounds are 0.35 ms where 127 are 6.4 ms). Alltoalls between about
 * 128 KiB and 1 MiB would do better on pairwise exchange; the one the sparse allreduce needs
 * carries counts (8 bytes per rank). Overridable: FLEET_TCP_BRUCK_MAX_BYTES. */
#define TCP_BRUCK_MAX_BYTES ((size_t)1 << 20)
/* Over sockets the allgather's switch point also grows with the rounds Bruck saves: the ring
 * takes n - 1 rounds where Bruck takes ceil(log2 n), both move the same bytes, and Bruck pays
 * one local copy of the result to un-rotate it. At alpha per round and a copy of c seconds per
 * byte, Bruck is ahead while bytes * c < (n - 1 - ceil(log2 n)) alpha: with alpha = 50 us (a
 * message round on 1 GbE in a cloud zone, docs/dgc.md) and ~5 GB/s of memcpy, 256 KiB per
 * round saved. It binds only above 8 ranks (at 8, 4 rounds saved give the 1 MiB measured
 * above); at 128 ranks it is 30 MiB, where the ring's 120 extra rounds cost 6 ms (DGC's sparse
 * allreduce gathers ~1.4 MB of kept sums there at its default budget, bench/dgc_cost.py). Not
 * over shared memory, where a round costs ~5 us. Overridable: FLEET_TCP_BRUCK_ROUND_BYTES. */
#define TCP_BRUCK_ROUND_BYTES ((size_t)256 << 10)

typedef struct {
    fl_transport  *tp;    /* the connections; NULL for a single rank and for views */
    fl_peers      *group; /* a view's ranks (group.h) over its communicator's tp; owned */
    fl_peers      *shm;   /* shared memory (shm.h) when every rank is on this host; owned */
    bool           allow_shm; /* FLEET_COMM_LOCAL and FLEET_COMM_SHM allow it */
    double         timeout_s;
    fl_scratch     scratch;
    fl_tcp_tuning  tune;
} tcp_state;

static tcp_state *state_of(const fl_comm *c) { return c->backend; }
/* Whom the collectives talk to; NULL: this rank alone (a single rank, or a view of one). */
static fl_peers *peers(tcp_state *st) {
    return st->shm ? st->shm : st->group ? st->group : st->tp ? fl_transport_peers(st->tp) : NULL;
}

/* Moves the ranks of p (parent ranks members[], or 0 .. size-1 when NULL) to shared memory if
 * every one of them is on this host (its connection is a unix socket: same network namespace,
 * local.h). Collective over p: one allreduce says whether any rank has a remote peer, so that
 * every rank takes the same path; shm.c itself refuses, on every rank alike, ranks in other
 * pid namespaces (then the sockets stay). */
static int try_shm(tcp_state *st, fl_transport *tp, fl_peers *p, const int *members,
                   fl_comm_counters *counters) {
    int me = members ? members[p->rank] : p->rank;
    int32_t remote = 0;
    for (int i = 0; i < p->size; i++) {
        int r = members ? members[i] : i;
        if (r != me && !fl_transport_is_local(tp, r))
            remote = 1;
    }
    FL_TRY(fl_rd_allreduce(p, &st->scratch, &remote, 1, FL_DTYPE_I32, FL_REDOP_MAX));
    if (remote)
        return 0;
    int rc = fl_shm_open(p, st->timeout_s, counters, &st->shm);
    if (rc == FL_EUNSUPPORTED) {
        FL_INFO("tcp: %d ranks of this host stay on unix sockets: %s", p->size, fl_errmsg());
        return 0;
    }
    if (rc == 0 && p->rank == 0)
        FL_INFO("tcp: %d ranks of this host talk through shared memory (%zu KiB rings)",
                p->size, fl_shm_ring_bytes(st->shm) >> 10);
    return rc;
}

/* Rabenseifner's at many ranks for medium sizes; else recursive doubling up to rd_max_bytes,
 * but at many ranks only below Rabenseifner's range (above it the ring beats log2 p copies of
 * the buffer); the ring for the rest. */
fl_tcp_allreduce fl_tcp_allreduce_choice(const fl_tcp_tuning *tune, int n, size_t bytes) {
    bool many = (size_t)n >= tune->rh_min_ranks;
    if (many && bytes >= tune->rh_min_bytes && bytes <= tune->rh_max_bytes)
        return FL_TCP_ALLREDUCE_RH;
    if (bytes <= tune->rd_max_bytes && (!many || bytes < tune->rh_min_bytes))
        return FL_TCP_ALLREDUCE_RD;
    return FL_TCP_ALLREDUCE_RING;
}

static int tcp_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    tcp_state *st = state_of(c);
    if (!peers(st)) {
        fl_reduce_finalize(buf, count, t, op, 1);
        return 0;
    }
    switch (fl_tcp_allreduce_choice(&st->tune, fl_peers_size(peers(st)),
                                    count * fl_dtype_size(t))) {
    case FL_TCP_ALLREDUCE_RD: return fl_rd_allreduce(peers(st), &st->scratch, buf, count, t, op);
    case FL_TCP_ALLREDUCE_RH: return fl_rh_allreduce(peers(st), &st->scratch, buf, count, t, op);
    case FL_TCP_ALLREDUCE_RING: break;
    }
    return fl_ring_allreduce(peers(st), &st->scratch, st->tune.seg_max_bytes, buf, count, t, op);
}

/* The hierarchical allreduce (comm.c chose it): hier.c over the node's and the cross group's
 * peers; with one rank per node it is the flat allreduce (nothing to reduce inside a node). */
static int tcp_hier_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    tcp_state *st = state_of(c);
    if (!peers(st) || c->node_view->size < 2)
        return tcp_allreduce(c, buf, count, t, op);
    fl_hier_tuning ht = {st->tune.rd_max_bytes, st->tune.seg_max_bytes};
    tcp_state *ns = state_of(c->node_view);
    int rc = fl_hier_allreduce(peers(ns), peers(state_of(c->cross_view)), &st->scratch, &ht, buf,
                               count, t, op);
    /* a failure between nodes is handed to this node's shared memory, so that its ranks name
     * the same culprit instead of the rank that stopped answering them */
    if (rc < 0 && ns->shm)
        rc = fl_shm_abort(ns->shm, rc, fl_errmsg());
    return rc;
}

static int tcp_reduce_scatter(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t,
                              fl_redop op) {
    tcp_state *st = state_of(c);
    if (!peers(st)) {
        if (count)
            memcpy(out, in, count * fl_dtype_size(t));
        return 0;
    }
    return fl_ring_reduce_scatter(peers(st), &st->scratch, st->tune.seg_max_bytes, in, out, count,
                                  t, op);
}

bool fl_tcp_gather_bruck(const fl_tcp_tuning *tune, int n, size_t bytes, bool shm) {
    if (bytes <= tune->bruck_max_bytes)
        return true;
    int lg = 0;
    while ((1 << lg) < n)
        lg++;
    size_t saved = n - 1 > lg ? (size_t)(n - 1 - lg) : 0;
    if (shm || saved == 0)
        return false;
    return tune->bruck_round_bytes > SIZE_MAX / saved || bytes <= saved * tune->bruck_round_bytes;
}

/* Bruck's allgather(v) for `bytes` gathered over this communicator's ranks. */
static bool gather_bruck(const fl_comm *c, size_t bytes) {
    const tcp_state *st = state_of(c);
    return fl_tcp_gather_bruck(&st->tune, c->size, bytes, st->shm != NULL);
}

static int tcp_allgather(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    tcp_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    if (!peers(st)) {
        if (count && in != out)
            memcpy(out, in, count * es);
        return 0;
    }
    if (gather_bruck(c, (size_t)c->size * count * es))
        return fl_bruck_allgatherv(peers(st), &st->scratch, in, out, NULL, count, es);
    return fl_ring_allgatherv(peers(st), in, out, NULL, count, es);
}

static int tcp_allgatherv(fl_comm *c, const void *in, void *out, const size_t *counts,
                          fl_dtype t) {
    tcp_state *st = state_of(c);
    size_t es = fl_dtype_size(t), total = 0;
    if (!peers(st)) {
        if (counts[0] && in != out)
            memcpy(out, in, counts[0] * es);
        return 0;
    }
    for (int r = 0; r < c->size; r++)
        total += counts[r];
    if (gather_bruck(c, total * es))
        return fl_bruck_allgatherv(peers(st), &st->scratch, in, out, counts, 0, es);
    return fl_ring_allgatherv(peers(st), in, out, counts, 0, es);
}

static int tcp_alltoallv(fl_comm *c, const void *in, const size_t *send_counts, void *out,
                         const size_t *recv_counts, fl_dtype t) {
    tcp_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    if (!peers(st)) { /* one rank: its own block (comm.c checked that both counts agree) */
        if (send_counts[0])
            memcpy(out, in, send_counts[0] * es);
        return 0;
    }
    return fl_pairwise_alltoallv(peers(st), in, send_counts, out, recv_counts, es);
}

static int tcp_alltoall(fl_comm *c, const void *in, void *out, size_t count, fl_dtype t) {
    tcp_state *st = state_of(c);
    size_t es = fl_dtype_size(t);
    if (!peers(st)) {
        memcpy(out, in, count * es);
        return 0;
    }
    if ((size_t)c->size * count * es <= st->tune.bruck_max_bytes)
        return fl_bruck_alltoall(peers(st), &st->scratch, in, out, count * es);
    /* pairwise exchange with every count the same; the counts live in scratch, which it
     * does not use */
    size_t *counts = fl_scratch_get(&st->scratch, (size_t)c->size * sizeof *counts);
    if (!counts)
        return FL_ENOMEM;
    for (int r = 0; r < c->size; r++)
        counts[r] = count;
    return fl_pairwise_alltoallv(peers(st), in, counts, out, counts, es);
}

static int tcp_broadcast(fl_comm *c, void *buf, size_t count, fl_dtype t, int root) {
    tcp_state *st = state_of(c);
    size_t bytes = count * fl_dtype_size(t);
    if (!peers(st) || bytes == 0)
        return 0;
    if (bytes <= st->tune.bcast_tree_max_bytes)
        return fl_bcast_tree(peers(st), buf, bytes, root);
    return fl_bcast_chain(peers(st), buf, bytes, root, st->tune.bcast_chunk_bytes);
}

static int tcp_barrier(fl_comm *c) {
    tcp_state *st = state_of(c);
    return peers(st) ? fl_rd_barrier(peers(st)) : 0;
}

static void tcp_destroy(fl_comm *c) {
    tcp_state *st = state_of(c);
    if (!st)
        return;
    fl_peers_free(st->shm);
    fl_peers_free(st->group);
    fl_transport_free(st->tp);
    fl_scratch_free(&st->scratch);
    free(st);
    c->backend = NULL;
}

static int new_state(tcp_state **out);
static const struct fl_comm_ops tcp_ops;

/* Fills the blank view with tcp over members[view->size] of parent (NULL for a view of one);
 * *out: its state. */
static int view_over(fl_comm *view, fl_peers *parent, const int *members, double timeout_s,
                     tcp_state **out) {
    tcp_state *vs = NULL;
    FL_TRY(new_state(&vs));
    vs->timeout_s = timeout_s;
    view->ops = &tcp_ops;
    view->backend = vs; /* from here the view's destroy frees vs */
    if (view->size > 1 && !(vs->group = fl_group_new(parent, members, view->size)))
        return fl_fail(FL_ENOMEM, "tcp: out of memory");
    *out = vs;
    return 0;
}

/* A view over the members' ranks of c's transport (a group of one needs no peers); a node
 * view of ranks that all share this host moves to shared memory (when c itself is not there
 * already: then the view is a group of c's shared memory). */
static int open_view(fl_comm *c, fl_comm *view, const int *members, bool node) {
    tcp_state *st = state_of(c), *vs = NULL;
    FL_TRY(view_over(view, peers(st), members, st->timeout_s, &vs));
    vs->tune = st->tune;
    if (node && view->size > 1 && st->tp && !st->shm && st->allow_shm)
        return try_shm(vs, st->tp, vs->group, members, &c->counters);
    return 0;
}

int fl_comm_tcp_view(fl_comm *view, fl_transport *tp, const int *members, double timeout_s) {
    FL_ASSERT(tp || view->size == 1);
    tcp_state *vs = NULL;
    return view_over(view, tp ? fl_transport_peers(tp) : NULL, members, timeout_s, &vs);
}

static int tcp_split(fl_comm *c, fl_comm *node, const int *node_ranks, fl_comm *cross,
                     const int *cross_ranks) {
    FL_TRY(open_view(c, node, node_ranks, true));
    return open_view(c, cross, cross_ranks, false);
}

static const struct fl_comm_ops tcp_ops = {
    .name = "tcp",
    .allreduce = tcp_allreduce,
    .hier_allreduce = tcp_hier_allreduce,
    .reduce_scatter = tcp_reduce_scatter,
    .allgather = tcp_allgather,
    .allgatherv = tcp_allgatherv,
    .alltoallv = tcp_alltoallv,
    .alltoall = tcp_alltoall,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    .split = tcp_split,
    .destroy = tcp_destroy,
};

/* A byte count (or a rank count: what says which) from the environment (benchmarking
 * knobs); *out untouched when unset. */
static int env_size(const char *name, const char *what, size_t *out) {
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || *v == '-')
        return fl_fail(FL_EINVAL, "%s=%s is not a %s", name, v, what);
    *out = (size_t)x;
    return 0;
}

/* FLEET_COMM_SHM=0 keeps same-host ranks on unix sockets (benchmarks compare the two);
 * FLEET_COMM_LOCAL=0 keeps them on TCP altogether. */
static bool shm_wanted(void) {
    const char *v = getenv("FLEET_COMM_SHM");
    return !(v && strcmp(v, "0") == 0);
}

/* Defaults, then FLEET_TCP_RD_MAX_BYTES, FLEET_TCP_RH_MIN_RANKS, FLEET_TCP_RH_MIN_BYTES,
 * FLEET_TCP_RH_MAX_BYTES, FLEET_TCP_SEG_MAX_BYTES, FLEET_TCP_BRUCK_MAX_BYTES and
 * FLEET_TCP_BRUCK_ROUND_BYTES if set. */
static int new_state(tcp_state **out) {
    *out = NULL;
    tcp_state *st = calloc(1, sizeof *st);
    if (!st)
        return fl_fail(FL_ENOMEM, "tcp: out of memory");
    st->tune.rd_max_bytes = TCP_RD_MAX_BYTES;
    st->tune.rh_min_ranks = TCP_RH_MIN_RANKS;
    st->tune.rh_min_bytes = TCP_RH_MIN_BYTES;
    st->tune.rh_max_bytes = TCP_RH_MAX_BYTES;
    st->tune.seg_max_bytes = TCP_SEG_MAX_BYTES;
    st->tune.bcast_tree_max_bytes = TCP_BCAST_TREE_MAX_BYTES;
    st->tune.bcast_chunk_bytes = TCP_BCAST_CHUNK_BYTES;
    st->tune.bruck_max_bytes = TCP_BRUCK_MAX_BYTES;
    st->tune.bruck_round_bytes = TCP_BRUCK_ROUND_BYTES;
    int rc;
    if ((rc = env_size("FLEET_TCP_RD_MAX_BYTES", "byte count", &st->tune.rd_max_bytes)) < 0 ||
        (rc = env_size("FLEET_TCP_RH_MIN_RANKS", "rank count", &st->tune.rh_min_ranks)) < 0 ||
        (rc = env_size("FLEET_TCP_RH_MIN_BYTES", "byte count", &st->tune.rh_min_bytes)) < 0 ||
        (rc = env_size("FLEET_TCP_RH_MAX_BYTES", "byte count", &st->tune.rh_max_bytes)) < 0 ||
        (rc = env_size("FLEET_TCP_SEG_MAX_BYTES", "byte count", &st->tune.seg_max_bytes)) < 0 ||
        (rc = env_size("FLEET_TCP_BRUCK_MAX_BYTES", "byte count", &st->tune.bruck_max_bytes)) <
            0 ||
        (rc = env_size("FLEET_TCP_BRUCK_ROUND_BYTES", "byte count",
                       &st->tune.bruck_round_bytes)) < 0) {
        free(st);
        return rc;
    }
    if (st->tune.seg_max_bytes < 4096)
        st->tune.seg_max_bytes = 4096;
    *out = st;
    return 0;
}

int fl_comm_tcp_open(fl_comm *c, const fl_comm_env *env) {
    tcp_state *st = NULL;
    int rc;
    if (env->size < 1 || env->size > FL_COMM_MAX_RANKS || env->rank < 0 ||
        env->rank >= env->size)
        return fl_fail(FL_EINVAL, "tcp: rank %d of %d is out of range", env->rank, env->size);
    if ((rc = new_state(&st)) < 0)
        return rc;
    c->rank = env->rank;
    c->size = env->size;
    st->timeout_s = env->timeout_s > 0 ? env->timeout_s : 300;
    st->allow_shm = !env->tcp_only && shm_wanted();
    if (env->size > 1 && (rc = fl_transport_open(env, &c->counters, &st->tp)) < 0)
        goto fail;
    if (st->tp && st->allow_shm &&
        (rc = try_shm(st, st->tp, fl_transport_peers(st->tp), NULL, &c->counters)) < 0)
        goto fail;
    /* the endpoints as the transport reached them (torchrun's come from the rendezvous) */
    if (st->tp || env->endpoints) {
        c->endpoints = calloc((size_t)env->size, sizeof *c->endpoints);
        if (!c->endpoints) {
            rc = fl_fail(FL_ENOMEM, "tcp: out of memory");
            goto fail;
        }
        for (int r = 0; r < env->size; r++)
            snprintf(c->endpoints[r], sizeof c->endpoints[r], "%s",
                     st->tp ? fl_transport_endpoint(st->tp, r) : env->endpoints[r]);
    }
    c->ops = &tcp_ops;
    c->backend = st;
    return 0;
fail:
    free(c->endpoints);
    c->endpoints = NULL;
    fl_peers_free(st->shm);
    fl_transport_free(st->tp);
    free(st);
    return rc;
}

int fl_comm_tcp_open_fds(fl_comm *c, int rank, int size, const int *fds, double timeout_s) {
    FL_ASSERT(size >= 1 && size <= FL_COMM_MAX_RANKS && rank >= 0 && rank < size);
    tcp_state *st = NULL;
    int rc = new_state(&st);
    if (rc < 0) { /* the fds are ours to close */
        for (int r = 0; r < size; r++)
            if (r != rank && fds[r] >= 0)
                close(fds[r]);
        return rc;
    }
    c->rank = rank;
    c->size = size;
    c->ops = &tcp_ops;
    c->backend = st; /* from here fl_comm_free destroys st through tcp_destroy */
    if (size > 1)
        rc = fl_transport_from_fds(rank, size, fds, timeout_s, &c->counters, &st->tp);
    return rc;
}

void fl_comm_tcp_get_tuning(const fl_comm *c, fl_tcp_tuning *out) {
    FL_ASSERT(c->ops == &tcp_ops);
    *out = state_of(c)->tune;
}

void fl_comm_tcp_set_tuning(fl_comm *c, const fl_tcp_tuning *tuning) {
    FL_ASSERT(c->ops == &tcp_ops);
    state_of(c)->tune = *tuning;
}
