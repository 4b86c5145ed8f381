/* listener.c - accepting and authenticating connections for the tcp transport (listener.h).
 * Each accepted connection waits in a small table with its own handshake deadline, so a silent
 * port scanner or a slow stranger never holds up the peers behind it; the table is polled
 * together with the listening socket, by the set-up loop first and by a thread afterwards. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "listener.h"

#include "net.h"
#include "wire.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <openssl/crypto.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int              fd;
    double           deadline;
    size_t           got;
    bool             challenged; /* hello answered: now reading its proof */
    fl_hs_transcript t;
    uint8_t          buf[FL_WIRE_HELLO_SIZE + FL_LISTENER_EXTRA_MAX];
    char             addr[FL_NET_ADDR_MAX];
} pending;

typedef struct {
    int           fd, rank;
    uint8_t       extra[FL_LISTENER_EXTRA_MAX];
    fl_hs_session session;
} accepted;

struct fl_listener {
    int       fd;
    int       rank, size;
    fl_hs_config hs;
    uint16_t  flags;
    size_t    extra;
    bool     *connected; /* [size] ranks that passed the handshake */
    pending   pend[FL_LISTENER_PENDING_MAX];
    int       npend, polled; /* polled: pending entries handed to the last pollfds */
    accepted *acc;           /* [size] FIFO of connections not yet taken */
    int       acc_head, acc_tail;
    double    paused_until;  /* out of fds: stop accepting for a moment instead of spinning */
    double    log_window;    /* start of the current 10 s window of warnings */
    int       logged, unlogged; /* warnings in it; refusals past the limit, not logged */
    pthread_t thread;
    bool      thread_started;
    int       wake[2];       /* a byte on wake[1] stops the thread */
};

int fl_listener_create(int listen_fd, int rank, int size, const fl_hs_config *hs,
                       uint16_t flags, size_t extra, fl_listener **out) {
    FL_ASSERT(extra <= FL_LISTENER_EXTRA_MAX && size >= 1 && rank >= 0 && rank < size);
    fl_listener *l = calloc(1, sizeof *l);
    if (!l)
        goto fail;
    l->fd = listen_fd;
    l->wake[0] = l->wake[1] = -1;
    l->rank = rank;
    l->size = size;
    l->hs = *hs;
    l->flags = flags;
    l->extra = extra;
    l->connected = calloc((size_t)size, sizeof *l->connected);
    l->acc = calloc((size_t)size, sizeof *l->acc);
    if (!l->connected || !l->acc)
        goto fail;
    (void)fl_net_set_nonblock(listen_fd);
    *out = l;
    return 0;
fail:
    if (l) {
        free(l->connected);
        free(l->acc);
        free(l);
    }
    close(listen_fd);
    return fl_fail(FL_ENOMEM, "out of memory creating the listener");
}

void fl_listener_free(fl_listener *l) {
    if (!l)
        return;
    if (l->thread_started) {
        ssize_t w;
        do
            w = write(l->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(l->thread, NULL);
    }
    if (l->wake[0] >= 0)
        close(l->wake[0]);
    if (l->wake[1] >= 0)
        close(l->wake[1]);
    for (int i = 0; i < l->npend; i++)
        close(l->pend[i].fd);
    for (int i = l->acc_head; i < l->acc_tail; i++)
        close(l->acc[i].fd);
    for (int i = 0; i < l->acc_tail; i++)
        fl_hs_session_wipe(&l->acc[i].session);
    for (int i = 0; i < l->npend; i++)
        OPENSSL_cleanse(&l->pend[i].t, sizeof l->pend[i].t);
    fl_hs_config_wipe(&l->hs);
    if (l->fd >= 0)
        close(l->fd);
    free(l->connected);
    free(l->acc);
    free(l);
}

int fl_listener_pollfds(fl_listener *l, struct pollfd *pfd, double *deadline) {
    int n = 0;
    if (l->paused_until > 0) {
        if (*deadline < 0 || l->paused_until < *deadline)
            *deadline = l->paused_until;
        pfd[n++] = (struct pollfd){.fd = -1}; /* ignored by poll; keeps the layout */
    } else {
        pfd[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN};
    }
    for (int i = 0; i < l->npend; i++) {
        pfd[n++] = (struct pollfd){.fd = l->pend[i].fd, .events = POLLIN};
        if (*deadline < 0 || l->pend[i].deadline < *deadline)
            *deadline = l->pend[i].deadline;
    }
    l->polled = l->npend;
    return n;
}

/* A port scan should not flood the log: at most LOG_MAX warnings per LOG_WINDOW_S, then a
 * count of the rest when the next window opens. */
#define LOG_MAX      20
#define LOG_WINDOW_S 10.0

static void warn(fl_listener *l, const char *addr, const char *what, const char *reason) {
    double now = fl_now();
    if (now - l->log_window >= LOG_WINDOW_S) {
        if (l->unlogged)
            FL_WARN("comm: rank %d dropped %d more connection(s) in the last %.0f s (not logged)",
                    l->rank, l->unlogged, LOG_WINDOW_S);
        l->log_window = now;
        l->logged = l->unlogged = 0;
    }
    if (l->logged++ < LOG_MAX)
        FL_WARN("comm: rank %d %s a connection from %s: %s", l->rank, what, addr, reason);
    else
        l->unlogged++;
}

/* Closes pending entry i (marked fd -1; compacted later). */
static void drop(pending *p) {
    close(p->fd);
    p->fd = -1;
}

static void refuse(fl_listener *l, pending *p, int status, const char *reason) {
    uint8_t reply[FL_WIRE_REPLY_SIZE];
    fl_wire_reply_encode(reply, (uint32_t)status, (uint32_t)l->rank);
    (void)!send(p->fd, reply, sizeof reply, MSG_NOSIGNAL | MSG_DONTWAIT);
    warn(l, p->addr, "refused", reason);
    drop(p);
}

/* The hello is whole and valid: answer with our nonce and our proof. */
static void challenge(fl_listener *l, pending *p, const fl_wire_hello *h) {
    p->t = (fl_hs_transcript){.flags = h->flags, .size = h->size, .round = h->round,
                              .rank_c = h->rank, .rank_a = (uint32_t)l->rank,
                              .opt_c = h->options, .opt_a = fl_hs_options(&l->hs, false)};
    memcpy(p->t.nonce_c, h->nonce, FL_WIRE_HS_NONCE);
    fl_wire_challenge c = {.rank = (uint32_t)l->rank, .options = p->t.opt_a};
    if (fl_crypto_random(p->t.nonce_a, FL_WIRE_HS_NONCE) < 0 ||
        fl_hs_mac(&l->hs, FL_HS_ACCEPTOR, &p->t, c.mac) < 0) {
        warn(l, p->addr, "dropped", fl_errmsg());
        drop(p);
        return;
    }
    memcpy(c.nonce, p->t.nonce_a, FL_WIRE_HS_NONCE);
    uint8_t msg[FL_WIRE_CHALLENGE_SIZE];
    fl_wire_challenge_encode(msg, &c);
    /* a fresh socket's send buffer always takes 88 bytes */
    if (send(p->fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof msg) {
        warn(l, p->addr, "dropped", "cannot send the handshake challenge");
        drop(p);
        return;
    }
    memmove(p->buf + FL_WIRE_AUTH_SIZE, p->buf + FL_WIRE_HELLO_SIZE, l->extra); /* keep extra */
    p->challenged = true;
    p->got = 0;
}

/* Its hello claims rank r: refuses (and returns false) unless r may connect here now. */
static bool rank_welcome(fl_listener *l, pending *p, uint32_t r) {
    char reason[160];
    if ((int)r <= l->rank) {
        snprintf(reason, sizeof reason,
                 "rank %u claims to connect to rank %d (ranks connect only to lower ranks)",
                 (unsigned)r, l->rank);
        refuse(l, p, FL_WIRE_BAD_RANK, reason);
        return false;
    }
    if (l->connected[r]) {
        snprintf(reason, sizeof reason, "rank %u is already connected", (unsigned)r);
        refuse(l, p, FL_WIRE_DUPLICATE, reason);
        return false;
    }
    return true;
}

/* The proof is whole: checks it and accepts the connection. */
static void prove(fl_listener *l, pending *p) {
    char reason[160];
    uint8_t mac[FL_WIRE_HS_MAC];
    int st = fl_wire_auth_parse(p->buf, FL_WIRE_AUTH_SIZE, p->t.rank_c, mac, reason,
                                sizeof reason);
    if (st != FL_WIRE_OK) {
        refuse(l, p, st, reason);
        return;
    }
    if (!fl_hs_check(&l->hs, FL_HS_CONNECTOR, &p->t, mac)) {
        snprintf(reason, sizeof reason, "rank %u's proof of the job token is wrong (wrong "
                 "FLEET_JOB_TOKEN, or a replayed handshake)", (unsigned)p->t.rank_c);
        refuse(l, p, FL_WIRE_BAD_TOKEN, reason);
        return;
    }
    if (!rank_welcome(l, p, p->t.rank_c)) /* another proved the same rank meanwhile */
        return;
    accepted *a = &l->acc[l->acc_tail]; /* at most size - 1 ever: each rank once */
    if (fl_hs_session_make(&l->hs, FL_HS_ACCEPTOR, &p->t, &a->session) < 0) {
        warn(l, p->addr, "dropped", fl_errmsg());
        drop(p);
        return;
    }
    uint8_t reply[FL_WIRE_REPLY_SIZE];
    fl_wire_reply_encode(reply, FL_WIRE_OK, (uint32_t)l->rank);
    if (send(p->fd, reply, sizeof reply, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof reply) {
        FL_WARN("comm: rank %d dropped rank %u from %s: cannot send the handshake reply",
                l->rank, (unsigned)p->t.rank_c, p->addr);
        fl_hs_session_wipe(&a->session);
        drop(p);
        return;
    }
    FL_DEBUG("comm: rank %d accepted rank %u from %s%s", l->rank, (unsigned)p->t.rank_c,
             p->addr, a->session.encrypt ? " (encrypted)" : "");
    l->connected[p->t.rank_c] = true;
    l->acc_tail++;
    a->fd = p->fd;
    a->rank = (int)p->t.rank_c;
    memcpy(a->extra, p->buf + FL_WIRE_AUTH_SIZE, l->extra);
    OPENSSL_cleanse(&p->t, sizeof p->t);
    p->fd = -1;
}

/* Reads what a pending connection sent; refuses, keeps waiting, challenges, or accepts it. */
static void pending_read(fl_listener *l, pending *p) {
    size_t need = p->challenged ? FL_WIRE_AUTH_SIZE : FL_WIRE_HELLO_SIZE + l->extra;
    ssize_t k = recv(p->fd, p->buf + p->got, need - p->got, 0);
    if (k == 0) {
        char why[80];
        snprintf(why, sizeof why, "closed before the handshake's %s (%zu bytes)",
                 p->challenged ? "proof" : "end", p->got);
        warn(l, p->addr, "dropped", why);
        drop(p);
        return;
    }
    if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        warn(l, p->addr, "dropped", strerror(errno));
        drop(p);
        return;
    }
    p->got += (size_t)k;
    if (p->challenged) {
        char reason[160];
        int st = fl_wire_auth_parse(p->buf, p->got, p->t.rank_c, NULL, reason, sizeof reason);
        if (st == FL_WIRE_TRUNCATED)
            return;
        if (st != FL_WIRE_OK)
            refuse(l, p, st, reason);
        else
            prove(l, p);
        return;
    }
    char reason[160];
    fl_wire_hello h;
    size_t hn = p->got < FL_WIRE_HELLO_SIZE ? p->got : FL_WIRE_HELLO_SIZE;
    int st = fl_wire_hello_parse(p->buf, hn, l->flags, (uint32_t)l->size, l->hs.round, &h,
                                 reason, sizeof reason);
    if (st == FL_WIRE_TRUNCATED || (st == FL_WIRE_OK && p->got < need))
        return;
    if (st != FL_WIRE_OK) {
        refuse(l, p, st, reason);
        return;
    }
    if (rank_welcome(l, p, h.rank))
        challenge(l, p, &h);
}

static void accept_new(fl_listener *l, double now) {
    for (int i = 0; i < 32; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                FL_WARN("comm: rank %d cannot accept connections: %s", l->rank,
                        strerror(errno));
                l->paused_until = now + 0.1;
            }
            return; /* EAGAIN, or an aborted connection: next time */
        }
        if (l->npend == FL_LISTENER_PENDING_MAX) {
            warn(l, l->pend[0].addr, "dropped", "too many connections awaiting a handshake");
            close(l->pend[0].fd);
            memmove(l->pend, l->pend + 1, (size_t)(l->npend - 1) * sizeof *l->pend);
            l->npend--;
        }
        pending *p = &l->pend[l->npend++];
        p->fd = fd;
        p->got = 0;
        p->challenged = false;
        p->deadline = now + FL_LISTENER_HANDSHAKE_S;
        fl_net_addr_str((struct sockaddr *)&ss, len, p->addr, sizeof p->addr);
    }
}

void fl_listener_handle(fl_listener *l, const struct pollfd *pfd, int n) {
    double now = fl_now();
    for (int i = 0; i + 1 < n && i < l->polled && i < l->npend; i++) {
        pending *p = &l->pend[i];
        if (p->fd == pfd[1 + i].fd && pfd[1 + i].revents)
            pending_read(l, p);
    }
    for (int i = 0; i < l->npend; i++) {
        pending *p = &l->pend[i];
        if (p->fd >= 0 && now >= p->deadline) {
            char why[64];
            snprintf(why, sizeof why, "no handshake within %.0f s (%zu bytes)",
                     FL_LISTENER_HANDSHAKE_S, p->got);
            warn(l, p->addr, "dropped", why);
            drop(p);
        }
    }
    int k = 0;
    for (int i = 0; i < l->npend; i++)
        if (l->pend[i].fd >= 0)
            l->pend[k++] = l->pend[i];
    l->npend = k;
    l->polled = 0;
    if (l->paused_until > 0 && now >= l->paused_until)
        l->paused_until = 0;
    if (n > 0 && pfd[0].fd == l->fd && (pfd[0].revents & POLLIN))
        accept_new(l, now);
}

int fl_listener_take(fl_listener *l, int *rank, uint8_t *extra, fl_hs_session *session) {
    if (l->acc_head == l->acc_tail)
        return -1;
    accepted *a = &l->acc[l->acc_head++];
    *rank = a->rank;
    if (extra)
        memcpy(extra, a->extra, l->extra);
    if (session)
        *session = a->session;
    fl_hs_session_wipe(&a->session);
    return a->fd;
}

static void *listener_main(void *arg) {
    fl_listener *l = arg;
    struct pollfd pfd[FL_LISTENER_POLLFDS + 1];
    for (;;) {
        double deadline = -1;
        int n = fl_listener_pollfds(l, pfd, &deadline);
        pfd[n] = (struct pollfd){.fd = l->wake[0], .events = POLLIN};
        int rc = poll(pfd, (nfds_t)n + 1, fl_net_poll_ms(deadline));
        if (rc < 0 && errno != EINTR) {
            FL_ERROR("comm: rank %d stops accepting connections: poll: %s", l->rank,
                     strerror(errno));
            break;
        }
        if (rc > 0 && pfd[n].revents)
            break;
        fl_listener_handle(l, pfd, rc > 0 ? n : 0);
        int rank, fd;
        while ((fd = fl_listener_take(l, &rank, NULL, NULL)) >= 0) /* cannot happen: all connected */
            close(fd);
    }
    return NULL;
}

int fl_listener_start(fl_listener *l) {
    FL_ASSERT(!l->thread_started);
    for (int r = l->rank + 1; r < l->size; r++)
        l->connected[r] = true; /* from now on every hello is a duplicate or a stranger */
    if (pipe2(l->wake, O_CLOEXEC) < 0)
        return fl_fail(FL_EIO, "cannot create the listener's wake-up pipe: %s", strerror(errno));
    int rc = pthread_create(&l->thread, NULL, listener_main, l);
    if (rc != 0)
        return fl_fail(FL_EIO, "cannot start the listener thread: %s", strerror(rc));
    l->thread_started = true;
    return 0;
}
