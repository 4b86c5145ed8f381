/* local.h - the tcp transport's same-host shortcut: after the TCP set-up, peers in the same
 * network namespace move their connection to an AF_UNIX socket, which skips the TCP/IP stack
 * (about 3x the throughput of loopback TCP on the development machine). Private to src/comm. */
#ifndef FLEET_LOCAL_H
#define FLEET_LOCAL_H

#include "handshake.h"

#include "fleet/comm.h"

/* Runs the upgrade over the authenticated TCP connections fds[size] (fds[rank] = -1): for each
 * pair the lower rank offers a one-time unix socket name and nonce, the higher rank connects to
 * it if it can (same network namespace) and says whether it did. Upgraded entries of fds[] are
 * replaced by the unix socket (the TCP one is closed). Every rank takes part even with
 * allow = 0 (FLEET_COMM_LOCAL=0): it then neither offers nor accepts. 0, or FL_EPEER /
 * FL_ETIMEOUT naming the peer (endpoints[size] for names) if the exchange itself fails.
 * sessions[size] (the handshake's keys, or NULL): the proof on the unix socket is then an HMAC
 * of the nonce under the connection's key, not the nonce itself, which crossed the network in
 * the clear: someone on the path and on this host cannot take the pair over. */
int fl_local_upgrade(int rank, int size, int *fds, const char (*endpoints)[FL_ENDPOINT_MAX],
                     int allow, double deadline, const fl_hs_session *sessions);

#endif /* FLEET_LOCAL_H */
