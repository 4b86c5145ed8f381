/* msgconn.h - authenticated message connections: the transport under the parameter server.
 *
 * The collective transport (src/comm/transport.h) connects every rank to every other and moves
 * buffers whose sizes both sides know. A parameter server instead answers requests of any size
 * from any of its clients, in whatever order they come. This is that: a listener that accepts
 * clients, and connections that carry whole messages of any length (up to a bound), each one
 * frame of the tcp transport's wire format (src/comm/wire.h) with its sequence number, opened
 * with the same challenge-response handshake (the job token never on the wire, handshake.h)
 * and, where the session says so, sealed with the same AEAD (comm.encrypt, FLEET_COMM_ENCRYPT:
 * off on loopback by default, on between hosts), so that a changed, dropped, reordered or
 * replayed message fails the connection naming its peer.
 *
 * Ranks: a job of S servers and W workers is one handshake world of S + W ranks: server s is
 * rank s, worker w is rank S + w. Clients connect to servers (a higher rank dials a lower one,
 * as in the collective transport); every connection carries the hello flag
 * FL_WIRE_FLAG_MSG, so a collective rank that dials a server port (or the reverse) is refused
 * with "not a message connection" instead of being taken for a peer.
 *
 * Threads: one connection may be used by one sender and one receiver thread at the same time
 * (sends are serialised by a lock inside; so are receives). Listener calls are not
 * thread-safe. */
#ifndef FLEET_MSGCONN_H
#define FLEET_MSGCONN_H

#include "fleet/comm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_MSG_MAX_BYTES ((size_t)1 << 31) /* largest message either side accepts */

/* What both ends must agree on (besides the token): from fl_comm_env_read, or filled in tests. */
typedef struct {
    int      world;                  /* servers + workers */
    char     token[FL_TOKEN_MAX];    /* FLEET_JOB_TOKEN ("" allowed only for world 1) */
    unsigned round;                  /* FLEET_RESTART_COUNT */
    int      encrypt;                /* FL_COMM_ENCRYPT_AUTO / OFF / ON */
    double   timeout_s;              /* FLEET_COMM_TIMEOUT: connect, and any wait for a message */
} fl_msg_config;

typedef struct fl_msg_conn fl_msg_conn;
typedef struct fl_msg_listener fl_msg_listener;

/* --- server side --- */
/* Listens as rank `rank` on endpoint ("host:port"), or on listen_fd when >= 0 (FLEET_LISTEN_FD,
 * inherited from fleetrun; ownership passes, also on failure). 0 or FL_EIO/FL_ECONFIG naming the
 * endpoint. */
int fl_msg_listen(const fl_msg_config *c, int rank, const char *endpoint, int listen_fd,
                  fl_msg_listener **out);
/* Accepts the clients of ranks lo .. hi-1 (each once, any order), authenticating each;
 * strangers, wrong tokens, garbage, duplicates and other protocol versions are logged with their
 * address and dropped without disturbing the job. conns[i] receives the connection of rank
 * lo + i. Fails with FL_ETIMEOUT after c->timeout_s naming the ranks never heard from (then
 * nothing is kept). Afterwards a thread keeps refusing newcomers until fl_msg_listener_free. */
int fl_msg_accept_all(fl_msg_listener *l, int lo, int hi, fl_msg_conn **conns);
void fl_msg_listener_free(fl_msg_listener *l);

/* --- client side --- */
/* Dials rank `server` (< rank) at endpoint, retrying while it is not listening yet, until
 * c->timeout_s; authenticates both ways. FL_ETIMEOUT / FL_EPEER naming "server 1
 * (127.0.0.1:6170)" and why (refused: wrong job token, protocol version, ...). */
int fl_msg_connect(const fl_msg_config *c, int rank, int server, const char *endpoint,
                   fl_msg_conn **out);

/* A connection over an already-connected socket fd (ownership passes), with no handshake and
 * no encryption: socketpair()s between threads in tests. name is used in messages. */
int fl_msg_conn_from_fd(int fd, const fl_msg_config *c, const char *name, fl_msg_conn **out);

/* --- both --- */
/* Sends one message of n bytes (n <= FL_MSG_MAX_BYTES; 0 allowed) as `parts` pieces gathered
 * in order (iov-like; saves a copy of a header in front of a payload). Blocks until written or
 * c->timeout_s passes without progress. FL_EPEER / FL_ETIMEOUT naming the peer. */
typedef struct {
    const void *p;
    size_t      n;
} fl_msg_part;
int fl_msg_sendv(fl_msg_conn *m, const fl_msg_part *parts, int nparts);
int fl_msg_send(fl_msg_conn *m, const void *p, size_t n);

/* Receives the next message into *buf (grown with realloc as needed; *cap its capacity; the
 * caller frees) and its length into *n. Waits at most timeout_s (< 0: the connection's
 * timeout; 0: poll once) without progress. Returns 1 with a message, 0 when the peer closed
 * cleanly between messages (after fl_msg_close, which says goodbye), FL_ETIMEOUT when nothing
 * came (the connection stays usable), FL_EPEER when the peer reset, closed without a goodbye
 * (it died), broke the framing, or a sealed message failed authentication (then the
 * connection is unusable; the message names the peer and says which).
 * A message cut short by FL_ETIMEOUT keeps what arrived of it inside the connection, so
 * between calls *buf is the caller's; the call that completes it may hand over the
 * connection's buffer in place of *buf (the old one freed, as realloc may move it). */
int fl_msg_recv(fl_msg_conn *m, void **buf, size_t *cap, size_t *n, double timeout_s);

/* A descriptor that polls readable when fl_msg_recv may have something (for poll loops). */
int         fl_msg_fd(const fl_msg_conn *m);
/* "worker 2 (127.0.0.1:41234)" style name set with fl_msg_set_name (before other threads use
 * the connection), else "rank R (addr)" (accepted) or "server S (endpoint)" (dialled). */
const char *fl_msg_peer_name(const fl_msg_conn *m);
void        fl_msg_set_name(fl_msg_conn *m, const char *name);
bool        fl_msg_encrypted(const fl_msg_conn *m);
/* Bytes of messages sent and received (payloads, not headers or tags). */
uint64_t    fl_msg_bytes_sent(const fl_msg_conn *m);
uint64_t    fl_msg_bytes_received(const fl_msg_conn *m);
/* Half-closes politely (a goodbye frame, then shutdown: the peer's recv returns 0), wipes the
 * keys and frees. Not while another thread uses the connection. NULL: no-op. */
void        fl_msg_close(fl_msg_conn *m);

#ifdef __cplusplus
}
#endif

#endif /* FLEET_MSGCONN_H */
