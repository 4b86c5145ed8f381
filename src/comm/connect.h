/* connect.h - the tcp transport's set-up: every rank connected to every other, each connection
 * authenticated by the handshake of wire.h. Private to src/comm. */
#ifndef FLEET_CONNECT_H
#define FLEET_CONNECT_H

#include "listener.h"

#include "fleet/comm.h"

/* Connects rank `rank` of `size`: dials every lower rank j at endpoints[j] (retrying with
 * backoff while it is not listening yet) and takes every higher rank from the listener l (may
 * be NULL only when rank == size - 1), all in one poll loop. Fills fds[size] (fds[rank] = -1;
 * the caller owns the rest). Fails with FL_ETIMEOUT after timeout_s naming the ranks still
 * missing, or FL_EPEER when a peer refuses our handshake or answers it with garbage; then
 * every fd it opened is closed and fds[] is all -1. */
int fl_connect_all(int rank, int size, const char (*endpoints)[FL_ENDPOINT_MAX],
                   const char *token, fl_listener *l, double timeout_s, int *fds);

#endif /* FLEET_CONNECT_H */
