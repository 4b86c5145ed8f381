/* transport.h - the tcp backend's transport: one authenticated, full-duplex connection to every
 * peer, and the one primitive the algorithms use: send to one peer while receiving from
 * another (full duplex), in bounded frames, with a deadline. Algorithms (ring.c, rd.c,
 * bcast.c) talk to "rank r" and never see a socket, as gloo's algorithms only use pairs. */
#ifndef FLEET_TRANSPORT_H
#define FLEET_TRANSPORT_H

#include "comm_impl.h"

#include <stddef.h>

typedef struct fl_transport fl_transport;

/* Called as each received chunk [off, off + len) of rbuf is complete, in order, so the caller
 * can reduce it while later chunks are still in flight (pipelining). */
typedef void (*fl_recv_fn)(void *ctx, size_t off, size_t len);

/* Listens on env's endpoint (or the inherited env->listen_fd), connects to every peer (rank r
 * connects to every lower rank, accepts every higher one), and authenticates each connection
 * with the handshake of wire.h. Connections that fail the handshake (strangers, wrong token,
 * garbage, duplicates, port scans) are logged and dropped without disturbing the job; after
 * set-up a listener thread keeps doing so for the life of the transport. Peers in the same
 * network namespace then move to an AF_UNIX socket (local.h) unless env->tcp_only. With
 * env->master set (torchrun) the endpoints are first exchanged through it (rendezvous.h).
 * Fails with FL_ETIMEOUT after env->timeout_s naming the ranks never heard from. counters is
 * borrowed. */
int fl_transport_open(const fl_comm_env *env, fl_comm_counters *counters, fl_transport **out);

/* A transport over already-connected sockets (fds[r] for each r != rank, fds[rank] = -1), e.g.
 * socketpair()s between threads in tests. Takes ownership of the fds. */
int fl_transport_from_fds(int rank, int size, const int *fds, double timeout_s,
                          fl_comm_counters *counters, fl_transport **out);

/* Sends an abort notice to every peer still connected, then closes everything. NULL no-op. */
void fl_transport_free(fl_transport *t);

int fl_transport_rank(const fl_transport *t);
int fl_transport_size(const fl_transport *t);

/* Sends sbytes of sbuf to rank `to` while receiving exactly rbytes into rbuf from rank `from`
 * (either side may be skipped with rank -1 or 0 bytes; to may equal from). Both sides of a
 * pair must agree on the sizes. on_recv (may be NULL) is called per completed received chunk.
 * Fails with FL_EPEER (peer closed, reset, sent an abort, or broke the framing) or FL_ETIMEOUT
 * (no progress within the timeout), the message naming the rank and endpoint. After a failure
 * the transport tells every peer (abort frame) so that all ranks report the same culprit. */
int fl_transport_sendrecv(fl_transport *t, int to, const void *sbuf, size_t sbytes, int from,
                          void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx);

/* "ip:port" of rank r: the endpoint it was reached at (after a torchrun-style rendezvous, the
 * one exchanged through the master); "" for transports made from fds. */
const char *fl_transport_endpoint(const fl_transport *t, int rank);

/* "rank 3 (127.0.0.1:6173)" for messages. */
const char *fl_transport_peer_name(const fl_transport *t, int rank);

#endif /* FLEET_TRANSPORT_H */
