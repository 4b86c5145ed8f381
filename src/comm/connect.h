/* connect.h - the tcp transport's set-up: every rank connected to every other, each connection
 * authenticated by the handshake of wire.h. Private to src/comm. */
#ifndef FLEET_CONNECT_H
#define FLEET_CONNECT_H

#include "handshake.h"
#include "listener.h"

#include "fleet/comm.h"

/* Connects rank `rank` of `size`: dials every lower rank j at endpoints[j] (retrying with
 * backoff while it is not listening yet) and takes every higher rank from the listener l (may
 * be NULL only when rank == size - 1), all in one poll loop. Fills fds[size] (fds[rank] = -1;
 * the caller owns the rest) and sessions[size] (each connection's keys and encryption; the
 * caller wipes them). Fails with FL_ETIMEOUT after timeout_s naming the ranks still missing,
 * or FL_EPEER when a peer refuses our handshake, cannot prove it knows the token, speaks
 * another protocol version ("version" in the message) or answers with garbage; then every fd
 * it opened is closed, fds[] is all -1 and sessions[] wiped. */
int fl_connect_all(int rank, int size, const char (*endpoints)[FL_ENDPOINT_MAX],
                   const fl_hs_config *hs, fl_listener *l, double timeout_s, int *fds,
                   fl_hs_session *sessions);

#endif /* FLEET_CONNECT_H */
