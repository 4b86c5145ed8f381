/* lines.c - the wire between the fleetrun of every node and the coordinator on node 0: one
 * message per text line on a TCP connection (non-blocking, keepalive so that a machine that
 * vanishes is noticed in about 11 s), at most 16 KiB a line. First a challenge-response in the
 * clear (auth.c; nonces and MACs as 64 hex digits; the job token never on the wire):
 *
 *   node -> coordinator   AUTH fleetrun/2 <node> <nproc> <nonce_m> this node and its nonce
 *   coordinator -> node   CHALLENGE <round> <nonce_c>              the coordinator's nonce
 *   node -> coordinator   PROOF <mac_m>                            the node knows the token
 *   coordinator -> node   PROOF <mac_c>                            so does the coordinator
 *                         (or END 1\t<why>: refused)
 *
 * then every line sealed, "<mac> <message>" (the MAC over the line's number and the message,
 * under the connection's key of that direction):
 *
 *   node -> coordinator   HELLO <node> <nproc>                     join the next round
 *                         FAIL <round> <code> <prio>\t<text>       a worker failed (prio 1: by
 *                                                                  a signal, 0: an exit code)
 *                         EXIT <round> <code> <how>                this node's workers are all
 *                                                                  gone (how: ok, failed, stopped)
 *                         BADMAC                                   a line from the coordinator
 *                                                                  failed its check here
 *   coordinator -> node   GO <round> <nmembers> <node>:<nproc>...\t<why>   the round starts
 *                         STOP <round>\t<why>                      stop this round's workers
 *                         END <code>\t<why>                        the job is over: exit code */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fleetrun.h"

double fr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int fr_send_line(int fd, const char *fmt, ...) {
    char buf[16384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof buf - 1)
        return -1;
    buf[n++] = '\n';
    ssize_t k = send(fd, buf, (size_t)n, MSG_NOSIGNAL);
    return k == n ? 0 : -1;
}

int fr_recv(int fd, linebuf *lb) {
    if (lb->len == sizeof lb->buf)
        return -1; /* a line longer than any message */
    ssize_t k = recv(fd, lb->buf + lb->len, sizeof lb->buf - lb->len, 0);
    if (k > 0) {
        lb->len += (size_t)k;
        return 1;
    }
    if (k == 0)
        return 0;
    return errno == EAGAIN || errno == EINTR ? 1 : -1;
}

bool fr_next_line(linebuf *lb, char *out, size_t cap) {
    char *nl = memchr(lb->buf, '\n', lb->len);
    if (!nl)
        return false;
    size_t n = (size_t)(nl - lb->buf);
    snprintf(out, cap, "%.*s", (int)n, lb->buf);
    memmove(lb->buf, nl + 1, lb->len - n - 1);
    lb->len -= n + 1;
    return true;
}

static void keepalive(int fd) {
    int one = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int fr_connect(const char *ip, int port, double until) {
    ip_addr a = fr_parse_ip(ip);
    struct sockaddr_storage ss;
    socklen_t len = fr_sockaddr(a, port, &ss);
    for (int tries = 0; tries < 1000000; tries++) {
        int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&ss, len) == 0) {
            keepalive(fd);
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            return fd;
        }
        int e = errno;
        close(fd);
        if (fr_now() >= until) {
            errno = e;
            return -1;
        }
        usleep(100000); /* node 0 may not be up yet */
    }
    return -1;
}

/* used by coord.c for the connections it accepts */
void fr_socket_setup(int fd) {
    keepalive(fd);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}
