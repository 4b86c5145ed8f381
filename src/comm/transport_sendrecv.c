/* transport_sendrecv.c - fl_transport_sendrecv (transport.h): one poll loop that progresses
 * both directions of an exchange (transport_send.c, transport_recv.c) under an inactivity
 * deadline. It busy-polls briefly before sleeping; once it stalls it also watches every other
 * peer for abort notices and sends keepalives (transport_keepalive.c); a failure is broadcast
 * (transport_abort.c) before the call returns it. */
#include "transport_conn.h"

#include "net.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <string.h>

/* One sendrecv in progress: its two halves and what the poll loop knows of them. */
typedef struct {
    send_state s;
    recv_state r;
    int        to, from;
    bool       sready, rready; /* the socket may take / have more without a poll */
    /* stalled: a poll found nothing for STALL_S; from then on this call also watches every
     * peer for abort notices and sends keepalives. alive: the peer we wait on sent keepalives,
     * so it is blocked on someone else: its own waiters will name the culprit. */
    bool       stalled, alive;
    double     last;           /* when data last moved */
    double     ka_next;        /* when keepalives are due */
    double     spin_left;      /* busy-poll budget left */
} exchange;

/* Where the poll set of one wait stands: n entries, the first nmain for the sockets this call
 * moves data on (sidx: the sending one, ridx: the receiving one, -1: none). */
typedef struct {
    int n, nmain, sidx, ridx;
} poll_set;

/* Watches peer p (not one this call moves data with) for an abort notice. */
static bool watchable(const fl_transport *t, int p) {
    const conn *c = &t->conns[p];
    return p != t->rank && c->fd >= 0 && !c->closed &&
           (c->hdr_got < HDR || c->in_abort || c->in_keepalive);
}

static int check_open(fl_transport *t, int p) {
    if (t->conns[p].closed)
        return transport_fail_local(t, FL_EPEER, p, "%s closed the connection",
                                    t->conns[p].name);
    return 0;
}

/* Moves what the ready sockets take or have; *moved counts the bytes. 0 or a failure. */
static int move_data(fl_transport *t, exchange *x, size_t *moved) {
    bool blocked = false, ka = false;
    if (x->sready && !x->s.done) {
        int rc = transport_send_step(t, &x->s, &blocked, moved);
        if (rc < 0)
            return rc;
        x->sready = !blocked;
    }
    blocked = false;
    if (x->rready && !x->r.done) {
        int rc = transport_recv_step(t, &x->r, &blocked, moved, &ka);
        if (rc < 0)
            return rc;
        x->rready = !blocked;
        x->alive |= ka;
    }
    return 0;
}

static int fail_timeout(fl_transport *t, const exchange *x, double limit) {
    const char *why = x->alive ? " (it is alive but waiting too: do all ranks call the same "
                                 "collectives in the same order with the same sizes?)"
                               : "";
    if (!x->r.done)
        return transport_fail_local(t, FL_ETIMEOUT, -1, "no data from %s for %g s%s",
                                    t->conns[x->from].name, limit, why);
    return transport_fail_local(t, FL_ETIMEOUT, -1, "%s accepted no data for %g s%s",
                                t->conns[x->to].name, limit, why);
}

/* The sockets to wait for: those we move data on; after a stall also every peer that may send
 * an abort notice. */
static poll_set fill_poll_set(fl_transport *t, const exchange *x) {
    poll_set ps = {.n = 0, .sidx = -1, .ridx = -1};
    if (!x->s.done) {
        ps.sidx = ps.n;
        t->pfd_peer[ps.n] = x->to;
        t->pfd[ps.n++] = (struct pollfd){.fd = t->conns[x->to].fd, .events = POLLOUT};
    }
    if (!x->r.done) {
        if (ps.sidx >= 0 && x->to == x->from) {
            ps.ridx = ps.sidx;
            t->pfd[ps.sidx].events |= POLLIN;
        } else {
            ps.ridx = ps.n;
            t->pfd_peer[ps.n] = x->from;
            t->pfd[ps.n++] = (struct pollfd){.fd = t->conns[x->from].fd, .events = POLLIN};
        }
    }
    ps.nmain = ps.n;
    for (int p = 0; x->stalled && p < t->size; p++) {
        if (p == x->from || !watchable(t, p))
            continue;
        if (p == x->to && ps.sidx >= 0) {
            t->pfd[ps.sidx].events |= POLLIN;
            continue;
        }
        t->pfd_peer[ps.n] = p;
        t->pfd[ps.n++] = (struct pollfd){.fd = t->conns[p].fd, .events = POLLIN};
    }
    return ps;
}

/* Waits until `until` for the poll set. Busy-polls briefly before sleeping: a small message's
 * reply usually comes within tens of microseconds, and waking a sleeping vCPU costs about as
 * much again (OpenMPI spins for the same reason). The budget is per call, so a long transfer
 * sleeps as before and at most spin_s of CPU is taken from ranks sharing a core. Returns the
 * ready entries, 0 when none (or interrupted), or a failure. */
static int wait_sockets(fl_transport *t, exchange *x, int n, double now, double until) {
    int pr = 0;
    if (!x->stalled && x->spin_left > 0) {
        double spin_end = now + x->spin_left;
        do
            pr = poll(t->pfd, (nfds_t)n, 0);
        while (pr == 0 && fl_now() < spin_end);
        x->spin_left = spin_end - fl_now();
    }
    if (pr == 0)
        pr = poll(t->pfd, (nfds_t)n, fl_net_poll_ms(until));
    if (pr < 0 && errno != EINTR)
        return transport_fail_local(t, FL_EIO, -1, "rank %d: poll failed: %s", t->rank,
                                    strerror(errno));
    return pr < 0 ? 0 : pr;
}

/* What the poll found: ready data sockets, and abort notices (or keepalives) from the peers
 * watched. 0 or a failure. */
static int take_events(fl_transport *t, exchange *x, const poll_set *ps) {
    const short in = POLLIN | POLLERR | POLLHUP, out = POLLOUT | POLLERR | POLLHUP;
    if (ps->sidx >= 0 && (t->pfd[ps->sidx].revents & out))
        x->sready = true;
    if (ps->ridx >= 0 && (t->pfd[ps->ridx].revents & in))
        x->rready = true;
    for (int i = 0; i < ps->n; i++) {
        int p = t->pfd_peer[i];
        if (p == x->from || !(t->pfd[i].revents & in) || (i < ps->nmain && p != x->to) ||
            !watchable(t, p))
            continue;
        bool peer_alive = false;
        int rc = transport_read_header(t, p, FL_WIRE_LEN_ANY, &peer_alive);
        if (rc < 0)
            return rc;
        if (peer_alive && p == x->to && !x->s.done)
            x->alive = true;
    }
    return 0;
}

int fl_transport_sendrecv(fl_transport *t, int to, const void *sbuf, size_t sbytes, int from,
                          void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx) {
    if (t->failed)
        return fl_fail(t->fail_code, "%s", t->fail_msg);
    bool do_send = to >= 0 && sbytes > 0, do_recv = from >= 0 && rbytes > 0;
    FL_ASSERT(!do_send || (to < t->size && to != t->rank && sbuf));
    FL_ASSERT(!do_recv || (from < t->size && from != t->rank && rbuf));
    /* the receive starts with a poll: right after our own send its data is rarely there yet,
     * and when it is, poll returns at once (one syscall either way) */
    exchange x = {
        .s = {.peer = to, .buf = sbuf, .total = sbytes, .done = !do_send},
        .r = {.peer = from, .buf = rbuf, .total = rbytes, .done = !do_recv, .on_recv = on_recv,
              .ctx = ctx},
        .to = to, .from = from, .sready = do_send, .last = fl_now(), .spin_left = t->spin_s,
    };
    int rc = 0;
    if (do_send) {
        x.s.nframes = (sbytes + CHUNK - 1) / CHUNK;
        x.s.seq0 = t->conns[to].send_seq;
        if ((rc = check_open(t, to)) < 0)
            goto fail;
    }
    if (do_recv) {
        x.r.nframes = (rbytes + CHUNK - 1) / CHUNK;
        if ((rc = check_open(t, from)) < 0)
            goto fail;
    }
    for (;;) {
        size_t moved = 0;
        if ((rc = move_data(t, &x, &moved)) < 0)
            goto fail;
        if (x.s.done && x.r.done)
            break;
        double now = fl_now();
        if (moved)
            x.last = now;
        if ((x.sready && !x.s.done) || (x.rready && !x.r.done))
            continue;
        double limit = t->timeout_s + (x.alive ? transport_grace_s(t) : 0);
        if (now - x.last >= limit) {
            rc = fail_timeout(t, &x, limit);
            goto fail;
        }
        if (x.stalled && now >= x.ka_next) {
            transport_send_keepalives(t, to, !x.s.done);
            x.ka_next = now + transport_keepalive_s(t);
        }
        poll_set ps = fill_poll_set(t, &x);
        double until = x.last + limit;
        if (!x.stalled && now + STALL_S < until)
            until = now + STALL_S;
        if (x.stalled && x.ka_next < until)
            until = x.ka_next;
        int pr = wait_sockets(t, &x, ps.n, now, until);
        if (pr < 0) {
            rc = pr;
            goto fail;
        }
        if (pr == 0) {
            x.stalled = true;
            continue;
        }
        if ((rc = take_events(t, &x, &ps)) < 0)
            goto fail;
    }
    return 0;
fail: /* the failure is in t */
    if (do_send && !x.s.done)
        transport_send_abandon(t, &x.s);
    transport_broadcast_abort(t);
    return fl_fail(t->fail_code, "%s", t->fail_msg);
}
