/* listener.h - the accepting side of the tcp transport: takes connections on a listening
 * socket, holds each until its handshake arrives (short per-connection deadline), and lets
 * through only the ranks expected here, each once, after the challenge-response of
 * handshake.h. Everything else (strangers, port scans, garbage, wrong tokens, replayed
 * handshakes, other protocol versions, duplicates) is logged with its address and the reason,
 * and closed.
 * Driven from the caller's poll loop during set-up, then from its own thread for the life of
 * the transport. Private to src/comm. */
#ifndef FLEET_LISTENER_H
#define FLEET_LISTENER_H

#include "handshake.h"

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fl_listener fl_listener;

#define FL_LISTENER_HANDSHAKE_S 5.0 /* a connection must say who it is within this time */
#define FL_LISTENER_PENDING_MAX 64  /* connections awaiting their handshake; the oldest goes */
#define FL_LISTENER_EXTRA_MAX   64  /* bytes a hello may carry after itself (rendezvous) */

/* Listens on listen_fd (ownership passes, also on failure) as rank `rank` of `size`: accepts
 * hellos with `flags` from ranks above `rank`, each followed by `extra` bytes, that prove
 * knowledge of the token behind hs (copied; wiped on free). 0 or FL_ENOMEM. */
int fl_listener_create(int listen_fd, int rank, int size, const fl_hs_config *hs,
                       uint16_t flags, size_t extra, fl_listener **out);

/* Stops the thread if one runs, closes the listening socket, every pending connection and
 * every accepted one not taken. NULL is a no-op. */
void fl_listener_free(fl_listener *l);

/* --- driven by the caller's poll loop --- */
/* The most pollfds fl_listener_pollfds fills. */
#define FL_LISTENER_POLLFDS (1 + FL_LISTENER_PENDING_MAX)
/* Fills pfd[] (at most FL_LISTENER_POLLFDS) and lowers *deadline (absolute, fl_now clock)
 * to the earliest handshake deadline. Returns the count. */
int  fl_listener_pollfds(fl_listener *l, struct pollfd *pfd, double *deadline);
/* Processes the poll results of the n pollfds last returned, and expired handshakes. */
void fl_listener_handle(fl_listener *l, const struct pollfd *pfd, int n);
/* Pops the next connection that passed the handshake: returns its fd (the caller owns it),
 * sets *rank, copies its extra bytes and its session (keys; may be NULL); -1 when none is
 * waiting. */
int  fl_listener_take(fl_listener *l, int *rank, uint8_t *extra, fl_hs_session *session);

/* --- after set-up --- */
/* Starts a thread that keeps accepting and refusing (every expected rank is connected by
 * now) until fl_listener_free. It blocks in poll. 0 or FL_EIO. */
int  fl_listener_start(fl_listener *l);

#endif /* FLEET_LISTENER_H */
