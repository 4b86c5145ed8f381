/* listener.h - the accepting side of the tcp transport: takes connections on a listening
 * socket, holds each until its handshake arrives (short per-connection deadline), and lets
 * through only the ranks expected here, each once. Everything else (strangers, port scans,
 * garbage, wrong tokens, duplicates) is logged with its address and the reason, and closed.
 * Driven from the caller's poll loop during set-up, then from its own thread for the life of
 * the transport. Private to src/comm. */
#ifndef FLEET_LISTENER_H
#define FLEET_LISTENER_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fl_listener fl_listener;

#define FL_LISTENER_HANDSHAKE_S 5.0 /* a connection must say who it is within this time */
#define FL_LISTENER_PENDING_MAX 64  /* connections awaiting their handshake; the oldest goes */
#define FL_LISTENER_EXTRA_MAX   64  /* bytes a hello may carry after itself (rendezvous) */

/* Listens on listen_fd (ownership passes, also on failure) as rank `rank` of `size`: accepts
 * hellos with `flags` and `token` from ranks above `rank`, each followed by `extra` bytes.
 * token is copied. 0 or FL_ENOMEM. */
int fl_listener_create(int listen_fd, int rank, int size, const char *token, uint16_t flags,
                       size_t extra, fl_listener **out);

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
 * sets *rank and copies its extra bytes; -1 when none is waiting. */
int  fl_listener_take(fl_listener *l, int *rank, uint8_t *extra);

/* --- after set-up --- */
/* Starts a thread that keeps accepting and refusing (every expected rank is connected by
 * now) until fl_listener_free. It blocks in poll. 0 or FL_EIO. */
int  fl_listener_start(fl_listener *l);

#endif /* FLEET_LISTENER_H */
