/* net.c - socket plumbing for the tcp transport (see net.h): resolving and listening, socket
 * options, printable addresses, and deadline-bounded whole-buffer I/O for the handshake and
 * rendezvous (the data path, transport_send.c and transport_recv.c, does its own I/O). */
#include "net.h"

#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int fl_net_set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return (fl & O_NONBLOCK) ? 0 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* 4 MiB both ways: enough for a 10 Gbit/s x 3 ms path; on loopback (test_transport --bench,
 * TCP and unix sockets) 256 KiB, 1 MiB, 4 MiB and the autotuned default were within the
 * machine's noise of each other, so the generous size costs nothing there. The kernel caps it
 * at net.core.[rw]mem_max (and doubles it for its own bookkeeping). */
void fl_net_tune(int fd) {
    int one = 1, buf = FL_NET_SOCKBUF;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails on AF_UNIX */
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int fl_net_resolve(const char *endpoint, const char *what, struct sockaddr_storage *ss,
                   socklen_t *len) {
    char host[FL_WIRE_ENDPOINT_LEN], reason[128], port[8];
    int p;
    if (fl_wire_endpoint_parse(endpoint, host, sizeof host, &p, reason, sizeof reason) != 0)
        return fl_fail(FL_ECONFIG, "cannot parse %s '%s': %s", what, endpoint, reason);
    snprintf(port, sizeof port, "%d", p);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 || !res)
        return fl_fail(FL_EIO, "cannot resolve %s '%s': %s", what, endpoint,
                       rc ? gai_strerror(rc) : "no address");
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static int listen_on(const struct sockaddr *sa, socklen_t len, int *out_fd) {
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errno;
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    fl_net_tune(fd); /* accepted sockets inherit the buffer sizes */
    if (bind(fd, sa, len) < 0 || listen(fd, 1024) < 0) {
        int e = errno;
        close(fd);
        return e;
    }
    *out_fd = fd;
    return 0;
}

int fl_net_listen(const struct sockaddr *sa, socklen_t len, int *out_fd) {
    char addr[FL_NET_ADDR_MAX];
    fl_net_addr_str(sa, len, addr, sizeof addr);
    int e = listen_on(sa, len, out_fd);
    if (e == EADDRNOTAVAIL) {
        struct sockaddr_storage any;
        memset(&any, 0, sizeof any);
        memcpy(&any, sa, len);
        if (sa->sa_family == AF_INET)
            ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
        else if (sa->sa_family == AF_INET6)
            ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
        FL_WARN("comm: %s is not an address of this host; listening on every interface", addr);
        e = listen_on((struct sockaddr *)&any, len, out_fd);
    }
    if (e)
        return fl_fail(FL_EIO, "cannot listen on %s: %s", addr, strerror(e));
    return 0;
}

static int is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return 0;
}

int fl_net_listen_endpoint(const char *endpoint, const char *what, int *out_fd) {
    struct sockaddr_storage ss;
    socklen_t len;
    char host[FL_WIRE_ENDPOINT_LEN];
    FL_TRY(fl_net_resolve(endpoint, what, &ss, &len));
    fl_wire_endpoint_parse(endpoint, host, sizeof host, NULL, NULL, 0);
    int literal = strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
                  strcmp(host, "::1") == 0;
    if (is_loopback(&ss) && !literal) {
        FL_DEBUG("comm: %s resolves to a loopback address; listening on every interface",
                 endpoint);
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&ss)->sin_addr.s_addr = htonl(INADDR_ANY);
        else
            ((struct sockaddr_in6 *)&ss)->sin6_addr = in6addr_any;
    }
    return fl_net_listen((struct sockaddr *)&ss, len, out_fd);
}

void fl_net_addr_str(const struct sockaddr *sa, socklen_t len, char *buf, size_t cap) {
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if ((sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
        getnameinfo(sa, len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, cap, "%s", sa->sa_family == AF_UNIX ? "local" : "?");
        return;
    }
    if (sa->sa_family == AF_INET6)
        snprintf(buf, cap, "[%s]:%s", host, serv);
    else
        snprintf(buf, cap, "%s:%s", host, serv);
}

void fl_net_peer_str(int fd, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    fl_net_addr_str((struct sockaddr *)&ss, len, buf, cap);
}

void fl_net_local_str(int fd, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    fl_net_addr_str((struct sockaddr *)&ss, len, buf, cap);
}

int fl_net_poll_ms(double deadline) {
    if (deadline < 0)
        return -1;
    double left = deadline - fl_now();
    if (left <= 0)
        return 0;
    if (left > 3600)
        return 3600 * 1000;
    return (int)ceil(left * 1000.0);
}

static int io_full(int fd, void *buf, size_t n, double deadline, int writing) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL)
                            : recv(fd, (char *)buf + done, n - done, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0 && !writing)
            return -1;
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == EPIPE ? -1 : errno;
        int ms = fl_net_poll_ms(deadline);
        if (ms == 0)
            return ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return errno;
    }
    return 0;
}

int fl_net_read_full(int fd, void *buf, size_t n, double deadline) {
    return io_full(fd, buf, n, deadline, 0);
}

int fl_net_write_full(int fd, const void *buf, size_t n, double deadline) {
    return io_full(fd, (void *)buf, n, deadline, 1);
}

int fl_net_route_source(const struct sockaddr *sa, socklen_t len, struct sockaddr_storage *out,
                        socklen_t *outlen) {
    char addr[FL_NET_ADDR_MAX];
    fl_net_addr_str(sa, len, addr, sizeof addr);
    int fd = socket(sa->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fl_fail(FL_EIO, "cannot find the interface that routes to %s: %s", addr,
                       strerror(errno));
    *outlen = sizeof *out;
    if (connect(fd, sa, len) < 0 || getsockname(fd, (struct sockaddr *)out, outlen) < 0) {
        int e = errno;
        close(fd);
        return fl_fail(FL_EIO, "cannot find the interface that routes to %s: %s", addr,
                       strerror(e));
    }
    close(fd);
    if (out->ss_family == AF_INET)
        ((struct sockaddr_in *)out)->sin_port = 0;
    else if (out->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)out)->sin6_port = 0;
    return 0;
}
