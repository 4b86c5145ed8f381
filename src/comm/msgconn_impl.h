/* msgconn_impl.h - what the two halves of the message connections (include/fleet/msgconn.h)
 * share: msgconn.c (a connection: framing, sealing, the receive state kept across calls) and
 * msg_listener.c (listening, accepting and dialling, both through the handshake of
 * handshake.h). Private to src/comm; tests use fl_msg_conn_create to build encrypted
 * connections over socketpairs. */
#ifndef FLEET_MSGCONN_IMPL_H
#define FLEET_MSGCONN_IMPL_H

#include "fleet/msgconn.h"

#include "handshake.h"

/* The timeout a config gives (its timeout_s, else 300 s as the transport). */
double fl_msg_config_timeout(const fl_msg_config *c);

/* A connection over a connected socket fd (ownership passes, also on failure), named name
 * ("server 1 (127.0.0.1:6170)"), whose frames are sealed when ses says so (ses may be NULL:
 * in the clear). ses is wiped here either way. 0, FL_ENOMEM or FL_EIO. */
int fl_msg_conn_create(int fd, double timeout_s, const char *name, fl_hs_session *ses,
                       fl_msg_conn **out);

#endif /* FLEET_MSGCONN_IMPL_H */
