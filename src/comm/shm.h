/* shm.h - the shared-memory transport: ranks of one host exchange bytes through one segment of
 * shared memory (an SPSC ring per ordered pair of ranks) instead of sockets, and implement the
 * pair interface of peers.h, so every algorithm runs over it unchanged. The segment is a memfd
 * passed by descriptor (never a name in /dev/shm), so nothing outlives the processes, however
 * they end. Private to src/comm and its tests. */
#ifndef FLEET_SHM_H
#define FLEET_SHM_H

#include "comm_impl.h"
#include "peers.h"

/* Ranks of `boot` map one segment and talk through it. Collective: every rank of boot calls it.
 *
 * boot: any connected fl_peers over the same ranks (the socket transport), used only during
 * set-up and borrowed (not freed, not used after return). Every rank must run on this host in
 * this pid namespace and this network namespace (the descriptor travels over an abstract unix
 * socket); otherwise every rank gets FL_EUNSUPPORTED with the same message, and the caller keeps
 * using boot. counters (byte counters of comm_impl.h) borrowed, may be NULL.
 *
 * Returns 0 and *out, an fl_peers (owned by the caller: fl_peers_free) whose ranks are boot's
 * and whose sendrecv moves bytes through shared memory, with peers.h's contract:
 * - FL_EPEER when a peer died (detected within ~10 ms from its pidfd while waiting), freed its
 *   transport while we still wait on it, or sent a message of another size; FL_ETIMEOUT when
 *   no byte moved for timeout_s (a peer that is itself blocked gets grace, as on TCP); the
 *   message names "rank R (pid P)". The first rank to fail writes its message into the segment
 *   and wakes everyone: every rank then fails with that same message and refuses further calls.
 * - A waiting rank spins for at most FLEET_COMM_SPIN_US per call (default 50 us; up to 16 times
 *   that while wake-ups prove slower than the budget), then sleeps on a futex: no core is burnt
 *   while waiting. While spinning it yields the core every few checks when the ranks outnumber
 *   the CPUs they may run on together (fl_shm_crowded) or the peer last ran on this core.
 * Set-up failures: FL_EPEER / FL_ETIMEOUT from boot, FL_ENOMEM / FL_EIO for the segment, the
 * same code and message on every rank that completes the exchange with rank 0.
 *
 * Ring size: FLEET_SHM_RING_KIB (power of two, 64 .. 65536; default 1024, smaller when many
 * ranks would make the segment exceed 256 MiB). One fl_peers is used by one thread at a time. */
int fl_shm_open(fl_peers *boot, double timeout_s, fl_comm_counters *counters, fl_peers **out);

/* Fails p with code (< 0) and msg as if it had noticed that failure itself: msg goes into the
 * segment unless another rank's failure got there first, every local rank waiting or calling
 * later fails with it, and p refuses further calls. For a layer above that saw the failure
 * elsewhere (the hierarchical allreduce's inter-node transport), so that the ranks of this host
 * name the same culprit. Returns the failure p ends with (code and fl_errmsg). */
int fl_shm_abort(fl_peers *p, int code, const char *msg);

/* Says that this rank waits elsewhere (waiting = 1: e.g. the inter-node step of a
 * hierarchical collective) until called again with 0. Local peers that time out waiting on it
 * meanwhile allow it the grace they give a peer blocked in sendrecv (timeout/2, at most 10 s),
 * so that its own wait, which started later, times out first and names the real culprit. */
void fl_shm_hold(fl_peers *p, int waiting);

/* The bytes of ring per ordered pair that p uses (tests aim at its boundaries); p from
 * fl_shm_open. */
size_t fl_shm_ring_bytes(const fl_peers *p);

/* Whether p's ranks outnumber the CPUs in the union of their affinity masks (each rank's as it
 * was in fl_shm_open), so that a waiting rank yields its core while it spins; the same on every
 * rank. For tests; p from fl_shm_open. */
bool fl_shm_crowded(const fl_peers *p);

#endif /* FLEET_SHM_H */
