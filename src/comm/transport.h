/* transport.h - the tcp backend's transport: one authenticated, full-duplex connection to every
 * peer, and the one primitive the algorithms use: send to one peer while receiving from
 * another (full duplex), in bounded frames, with a deadline. It implements the pair interface
 * of peers.h, which is all the algorithms (algorithms.h) ever see. */
#ifndef FLEET_TRANSPORT_H
#define FLEET_TRANSPORT_H

#include "comm_impl.h"
#include "peers.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct fl_transport fl_transport;

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

/* The transport as the algorithms see it (peers.h): sendrecv is fl_transport_sendrecv, free is
 * fl_transport_free. Owned by t. */
fl_peers *fl_transport_peers(fl_transport *t);

/* Whether rank r is reached through a unix socket (same host and network namespace: local.h). */
bool fl_transport_is_local(const fl_transport *t, int rank);

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
