/* net.h - the socket plumbing the tcp transport, its listener, its set-up and the torchrun
 * rendezvous share: resolving endpoints, listening, tuning sockets, printable addresses, and
 * whole-buffer reads and writes bounded by a deadline. Private to src/comm. */
#ifndef FLEET_NET_H
#define FLEET_NET_H

#include <stddef.h>
#include <sys/socket.h>

#define FL_NET_ADDR_MAX 72 /* "[v6 address%zone]:port" */

/* Socket buffers asked for on every data connection (see net.c for the measurement). */
#define FL_NET_SOCKBUF (4 << 20)

/* Sets O_NONBLOCK; 0 or -1 (errno). */
int fl_net_set_nonblock(int fd);

/* Data-connection options: TCP_NODELAY (ignored on non-TCP sockets), SO_SNDBUF/SO_RCVBUF. */
void fl_net_tune(int fd);

/* Resolves "host:port" / "[v6]:port" (first address). what names the value for messages
 * ("rank 2's endpoint"). 0, or FL_ECONFIG/FL_EIO with a message. */
int fl_net_resolve(const char *endpoint, const char *what, struct sockaddr_storage *ss,
                   socklen_t *len);

/* A nonblocking listening socket bound to sa (SO_REUSEADDR, tuned buffers). If bind fails
 * with EADDRNOTAVAIL (an address that is not this host's, e.g. behind NAT) it binds the same
 * port on every interface instead. 0 or FL_EIO naming the address. */
int fl_net_listen(const struct sockaddr *sa, socklen_t len, int *out_fd);

/* Listens on a "host:port" endpoint (resolved as fl_net_resolve). A host name that resolves to
 * a loopback address (Debian maps the machine's own name to 127.0.1.1) is served on every
 * interface instead, so that peers on other hosts can reach it. 0 or a failure. */
int fl_net_listen_endpoint(const char *endpoint, const char *what, int *out_fd);

/* "1.2.3.4:5555" or "[::1]:5555" ("?" when it cannot be formatted). */
void fl_net_addr_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap);
/* The remote / local address of a connected socket; "local" for non-IP sockets. */
void fl_net_peer_str(int fd, char *buf, size_t cap);
void fl_net_local_str(int fd, char *buf, size_t cap);

/* Reads / writes exactly n bytes on a nonblocking socket, polling until fl_now() >= deadline.
 * Returns 0, -1 when the peer closed the connection first, or a positive errno (ETIMEDOUT at
 * the deadline). Writes use MSG_NOSIGNAL. */
int fl_net_read_full(int fd, void *buf, size_t n, double deadline);
int fl_net_write_full(int fd, const void *buf, size_t n, double deadline);

/* The address of this host's interface that routes to sa (port 0), via a connected UDP
 * socket (nothing is sent). 0 or FL_EIO. */
int fl_net_route_source(const struct sockaddr *sa, socklen_t len, struct sockaddr_storage *out,
                        socklen_t *outlen);

/* Milliseconds to wait in poll() until deadline (0 if passed, capped at 1 hour; -1 for
 * deadline <= 0 meaning "none"). */
int fl_net_poll_ms(double deadline);

#endif /* FLEET_NET_H */
