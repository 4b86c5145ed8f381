/* shm_segment.c - the shared-memory segment and how it travels (shm_impl.h): rank 0 makes a
 * memfd and listens on an abstract unix socket whose name, with a nonce per rank, goes out in
 * the plan; each rank connects, proves itself (nonce, and its pid by SO_PEERCRED) and receives
 * the descriptor (SCM_RIGHTS), then maps it and checks it is this job's. A descriptor, never a
 * name in /dev/shm, so nothing outlives the processes. */
#define _GNU_SOURCE /* memfd_create, SO_PEERCRED, accept4 */
#include "shm_impl.h"

#include "net.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* name: a NUL-terminated string of at most 31 characters (plan.sock). */
static socklen_t unix_addr(const char name[32], struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, 31);
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = '\0': the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int shm_listen(const char name[32], int backlog, char *msg, size_t cap) {
    struct sockaddr_un a;
    socklen_t len = unix_addr(name, &a);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, len) < 0 || listen(lfd, backlog) < 0) {
        snprintf(msg, cap, "shared memory: rank 0 cannot listen on a unix socket: %s",
                 strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    return lfd;
}

int shm_map_segment(shm *s, int fd, size_t seg_bytes, char *msg, size_t cap) {
    void *m = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(msg, cap, "rank %d: mapping %zu bytes of shared memory failed: %s",
                 s->base.rank, seg_bytes, strerror(errno));
        return FL_EIO;
    }
    (void)madvise(m, seg_bytes, MADV_DONTFORK); /* children forked later keep nothing alive */
    s->seg = m;
    s->seg_bytes = seg_bytes;
    seg_layout l = shm_layout(s->base.size, s->cap);
    if (l.total != seg_bytes) {
        snprintf(msg, cap, "rank %d: shared memory segment of %zu bytes, %zu expected",
                 s->base.rank, seg_bytes, l.total);
        return FL_EPEER;
    }
    s->hdr = (seg_hdr *)s->seg;
    s->ctl = (rank_ctl *)(s->seg + l.ctl);
    s->rings = (ring_ctl *)(s->seg + l.rings);
    s->data = s->seg + l.data;
    return 0;
}

int shm_create_segment(shm *s, const hello *h, uint64_t cookie, int *fd_out, char *msg,
                       size_t cap) {
    int n = s->base.size;
    seg_layout l = shm_layout(n, s->cap);
    int fd = memfd_create("fleet-shm", MFD_CLOEXEC);
    if (fd < 0) {
        snprintf(msg, cap, "shared memory: memfd_create failed: %s", strerror(errno));
        return errno == ENOSYS ? FL_EUNSUPPORTED : FL_EIO;
    }
    if (ftruncate(fd, (off_t)l.total) < 0) {
        snprintf(msg, cap, "shared memory: sizing a %zu-byte segment failed: %s", l.total,
                 strerror(errno));
        close(fd);
        return FL_EIO;
    }
    int rc = shm_map_segment(s, fd, l.total, msg, cap);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    s->hdr->magic = SEG_MAGIC;
    s->hdr->cookie = cookie;
    s->hdr->seg_bytes = l.total;
    s->hdr->ring_bytes = s->cap;
    s->hdr->size = (uint32_t)n;
    for (int r = 0; r < n; r++)
        s->ctl[r].pid = h[r].pid;
    *fd_out = fd;
    return 0;
}

/* Sends fd over a connected unix socket with one byte of payload. */
static int send_fd(int sock, int fd, double deadline) {
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char           buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    for (;;) {
        ssize_t k = sendmsg(sock, &m, MSG_NOSIGNAL);
        if (k == 1)
            return 0;
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return errno;
        struct pollfd pf = {.fd = sock, .events = POLLOUT};
        if (poll(&pf, 1, fl_net_poll_ms(deadline)) == 0)
            return ETIMEDOUT;
    }
}

/* Receives the fd sent by send_fd; -1 with errno (ETIMEDOUT at the deadline, EPROTO if the
 * message carried none). */
static int recv_fd(int sock, double deadline) {
    for (;;) {
        char byte;
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union {
            char           buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                           .msg_controllen = sizeof u.buf};
        ssize_t k = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (k == 1) {
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
                c->cmsg_len != CMSG_LEN(sizeof(int)) || (m.msg_flags & MSG_CTRUNC)) {
                errno = EPROTO;
                return -1;
            }
            int fd;
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
            return fd;
        }
        if (k == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno != EAGAIN && errno != EINTR)
            return -1;
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        if (poll(&pf, 1, fl_net_poll_ms(deadline)) == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
}

static pid_t peer_pid(int sock) {
    struct ucred cr;
    socklen_t len = sizeof cr;
    return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 ? cr.pid : -1;
}

int shm_serve_fd(shm *s, int lfd, int memfd, const hello *h, uint8_t (*nonces)[16],
                 const bool *expect, int expected, double deadline, char *msg, size_t cap) {
    int n = s->base.size;
    bool *served = calloc((size_t)n, sizeof *served);
    if (!served) {
        snprintf(msg, cap, "rank 0: out of memory");
        return FL_ENOMEM;
    }
    int left = expected, rc = 0;
    while (left > 0) {
        struct pollfd pf = {.fd = lfd, .events = POLLIN};
        int pr = poll(&pf, 1, fl_net_poll_ms(deadline));
        if (pr == 0) {
            int missing = -1;
            for (int r = 1; r < n && missing < 0; r++)
                if (expect[r] && !served[r])
                    missing = r;
            snprintf(msg, cap, "shared memory: rank %d (pid %d) never fetched the segment",
                     missing, missing >= 0 ? h[missing].pid : 0);
            rc = FL_ETIMEOUT;
            break;
        }
        int a = pr > 0 ? accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC) : -1;
        if (a < 0)
            continue;
        proof pr_;
        double until = fl_now() + 2.0 < deadline ? fl_now() + 2.0 : deadline;
        int e = fl_net_read_full(a, &pr_, sizeof pr_, until);
        int r = (int)pr_.rank;
        if (e || r <= 0 || r >= n || !expect[r] || served[r] ||
            memcmp(pr_.nonce, nonces[r], sizeof pr_.nonce) != 0 || peer_pid(a) != h[r].pid) {
            FL_WARN("comm: rank 0 dropped a connection to its shared-memory socket that did "
                    "not prove itself");
            close(a);
            continue;
        }
        e = send_fd(a, memfd, deadline);
        close(a);
        if (e) {
            snprintf(msg, cap, "shared memory: handing the segment to rank %d (pid %d) failed: "
                     "%s", r, h[r].pid, strerror(e));
            rc = FL_EIO;
            break;
        }
        served[r] = true;
        left--;
    }
    free(served);
    return rc;
}

int shm_join(const plan *pl, int rank, double deadline, char *msg, size_t cap) {
    struct sockaddr_un a;
    socklen_t len = unix_addr(pl->sock, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    proof p = {.rank = (uint32_t)rank};
    memcpy(p.nonce, pl->nonce, sizeof p.nonce);
    int e = 0;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, len) < 0)
        e = errno;
    else if (peer_pid(fd) != pl->pid0)
        e = EPERM;
    else
        e = fl_net_write_full(fd, &p, sizeof p, deadline);
    if (e) {
        snprintf(msg, cap, "shared memory: rank %d cannot reach rank 0's socket: %s", rank,
                 e < 0 ? "closed" : strerror(e));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int shm_attach(shm *s, const plan *pl, int sock, double deadline, char *msg, size_t cap) {
    int fd = recv_fd(sock, deadline);
    if (fd < 0) {
        snprintf(msg, cap, "shared memory: rank %d got no segment from rank 0: %s",
                 s->base.rank, strerror(errno));
        return errno == ETIMEDOUT ? FL_ETIMEOUT : FL_EPEER;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != pl->seg_bytes) {
        snprintf(msg, cap, "shared memory: rank %d got a segment of the wrong size",
                 s->base.rank);
        rc = FL_EPEER;
    } else {
        rc = shm_map_segment(s, fd, (size_t)pl->seg_bytes, msg, cap);
    }
    close(fd); /* the mapping keeps the memory; nothing is left to clean up */
    if (rc == 0 && (s->hdr->magic != SEG_MAGIC || s->hdr->cookie != pl->cookie ||
                    s->hdr->size != (uint32_t)s->base.size || s->hdr->ring_bytes != s->cap ||
                    s->ctl[s->base.rank].pid != (int32_t)getpid())) {
        snprintf(msg, cap, "shared memory: rank %d got a segment that is not this job's",
                 s->base.rank);
        rc = FL_EPEER;
    }
    return rc;
}
