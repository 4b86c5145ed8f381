/* shm.c - the shared-memory transport's data path (shm.h): one memfd segment mapped by every
 * rank of the host, holding a single-producer single-consumer byte ring per ordered pair of
 * ranks. sendrecv copies into the peer's ring as space frees and out of its own as data lands,
 * both directions in one loop; a waiting rank spins briefly, then sleeps on a futex word of its
 * own that writers ring only when it said it sleeps. Liveness comes from pidfds, and the first
 * failure is written into the segment, so every rank names the same culprit (transport_abort.c's
 * ABORT frames). The set-up that makes the segment and hands it out is shm_setup.c's. */
#define _GNU_SOURCE
#include "shm_impl.h"

#include "net.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Granularity of on_recv and of each copy into a ring. With 2 ranks exchanging 1-64 MiB
 * (test_shm --bench), 32 KiB to 256 KiB are within noise of each other; 64 KiB keeps a chunk in
 * L1/L2 while the caller reduces it and lets the peer start on a message early. */
#define CHUNK ((size_t)64 << 10)
#define MSG_HDR          64   /* every message starts with one cache line: magic, seq, length */
#define POLL_S           0.01 /* a sleeping rank wakes this often to check on its peers */
#define SPIN_GROWTH      16   /* adapted spin budget: at most this times FLEET_COMM_SPIN_US */
#define QUICK_SPINS      16   /* ring checks (~0.5 us of PAUSE) before a wait reads the clock */
#define YIELD_SPINS      4    /* then ring checks between two sched_yield()s while spinning */
#define MSG_MAGIC        0x4d534c46u           /* "FLSM" */

typedef struct {
    uint32_t magic, pad;
    uint64_t seq, len;
} msg_hdr;


/* ---------------------------------------------------------------- the transport */

static ring_ctl *ring_of(shm *s, int from, int to) {
    return &s->rings[(size_t)from * (size_t)s->base.size + (size_t)to];
}
static uint8_t *ring_data(shm *s, int from, int to) {
    size_t k = (size_t)from * (size_t)(s->base.size - 1) + (size_t)(to < from ? to : to - 1);
    return s->data + k * s->cap;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

/* Wakes rank p if it said it sleeps. Called after publishing a head or tail: the seq_cst store
 * before it and the seq_cst load here pair with the sleeper's store of `sleeping` and its
 * re-check of the rings (Dekker), so either it sees our update or we see it asleep. */
static void wake(shm *s, int p) {
    rank_ctl *c = &s->ctl[p];
    if (atomic_load_explicit(&c->sleeping, memory_order_seq_cst)) {
        atomic_fetch_add_explicit(&c->bell, 1, memory_order_seq_cst);
        futex(&c->bell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

static void wake_all(shm *s) {
    for (int p = 0; p < s->base.size; p++) {
        if (p == s->base.rank)
            continue;
        atomic_fetch_add_explicit(&s->ctl[p].bell, 1, memory_order_seq_cst);
        futex(&s->ctl[p].bell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* ---------------------------------------------------------------- failure */

static int set_failed(shm *s, int code, int reporter, const char *msg) {
    s->failed = true;
    s->fail_code = code;
    if (reporter == s->base.rank)
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s", msg);
    else
        snprintf(s->fail_msg, sizeof s->fail_msg, "%s (reported by rank %d)", msg, reporter);
    return fl_fail(code, "%s", s->fail_msg);
}

/* Takes the failure another rank published in the segment (waiting a moment if it is being
 * written); own_code/own_msg if it never completes (its writer died half-way). */
static int adopt_failure(shm *s, int own_code, const char *own_msg) {
    seg_hdr *h = s->hdr;
    double end = fl_now() + 1.0;
    while (atomic_load_explicit(&h->abort_state, memory_order_acquire) != 2 && fl_now() < end)
        sched_yield();
    if (atomic_load_explicit(&h->abort_state, memory_order_acquire) != 2)
        return set_failed(s, own_code, s->base.rank, own_msg);
    char msg[ABORT_MAX];
    memcpy(msg, h->abort_msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    for (char *q = msg; *q; q++) /* it came from another process: keep it printable */
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e)
            *q = '?';
    int code = h->abort_code, reporter = h->abort_reporter;
    if (code != FL_EPEER && code != FL_ETIMEOUT && code != FL_EIO)
        code = FL_EPEER;
    if (reporter < 0 || reporter >= s->base.size)
        reporter = s->base.rank;
    return set_failed(s, code, reporter, msg);
}

/* A failure this rank noticed: the first failure published in the segment wins, so every rank
 * reports the same one. Wakes every rank so that sleepers see it at once. */
static int fail_job(shm *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_job(shm *s, int code, const char *fmt, ...) {
    char msg[ABORT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    seg_hdr *h = s->hdr;
    uint32_t none = 0;
    if (!atomic_compare_exchange_strong_explicit(&h->abort_state, &none, 1, memory_order_acq_rel,
                                                 memory_order_acquire))
        return adopt_failure(s, code, msg);
    h->abort_code = code;
    h->abort_reporter = s->base.rank;
    memcpy(h->abort_msg, msg, sizeof msg);
    atomic_store_explicit(&h->abort_state, 2, memory_order_release);
    wake_all(s);
    return set_failed(s, code, s->base.rank, msg);
}

/* ---------------------------------------------------------------- moving bytes */

typedef struct {
    int            peer;
    const uint8_t *buf;
    size_t         total, sent;
    ring_ctl      *rc;
    uint8_t       *ring;
    uint64_t       head, tail; /* our head (published or not), the reader's tail as last seen */
    bool           hdr_done, done;
} send_op;

typedef struct {
    int            peer;
    uint8_t       *buf;
    size_t         total, got, reported;
    ring_ctl      *rc;
    const uint8_t *ring;
    uint64_t       tail, head; /* our tail, the writer's head as last seen */
    bool           hdr_done, done;
    fl_recv_fn     on_recv;
    void          *ctx;
} recv_op;

static void copy_in(uint8_t *ring, size_t cap, uint64_t pos, const uint8_t *src, size_t n) {
    size_t at = (size_t)(pos & (cap - 1)), first = cap - at < n ? cap - at : n;
    memcpy(ring + at, src, first);
    if (first < n)
        memcpy(ring, src + first, n - first);
}

static void copy_out(uint8_t *dst, const uint8_t *ring, size_t cap, uint64_t pos, size_t n) {
    size_t at = (size_t)(pos & (cap - 1)), first = cap - at < n ? cap - at : n;
    memcpy(dst, ring + at, first);
    if (first < n)
        memcpy(dst + first, ring, n - first);
}

/* Bytes of padding after position pos up to the next cache line. */
static size_t pad_after(uint64_t pos) { return (size_t)((64 - (pos & 63)) & 63); }

/* Copies at most one chunk into the peer's ring and publishes it. Room must hold the header
 * (before the first byte), at least one byte, and the padding after the last one, which the
 * head skips. The reader's tail is re-read only when the last one seen leaves too little room,
 * so that on return 0 it is fresh (ready() compares against it). Returns bytes moved. */
static size_t send_step(shm *s, send_op *w) {
    size_t left = w->total - w->sent, hdr = w->hdr_done ? 0 : MSG_HDR, n = 0;
    for (int fresh = 0; n == 0; fresh++) {
        if (fresh) {
            if (fresh > 1)
                return 0;
            w->tail = atomic_load_explicit(&w->rc->tail, memory_order_acquire);
        }
        uint64_t room = s->cap - (w->head - w->tail);
        if (room <= hdr)
            continue;
        room -= hdr;
        n = left < CHUNK ? left : CHUNK;
        if (n > room)
            n = (size_t)room;
        if (n == left && pad_after(w->head + hdr + n) > room - n)
            n = left - 1; /* finish once the padding fits too (the reader releases only at
                           * 64-byte positions, so this does not happen while CHUNK is a
                           * multiple of 64) */
    }
    if (!w->hdr_done) { /* head is 64-aligned at a message start: the header never wraps */
        msg_hdr m = {.magic = MSG_MAGIC, .seq = s->send_seq[w->peer], .len = w->total};
        memcpy(w->ring + (w->head & (s->cap - 1)), &m, sizeof m);
        w->head += MSG_HDR;
        w->hdr_done = true;
    }
    copy_in(w->ring, s->cap, w->head, w->buf + w->sent, n);
    w->head += n;
    w->sent += n;
    if (w->sent == w->total) { /* the next message starts on a fresh cache line */
        w->head += pad_after(w->head);
        w->done = true;
        s->send_seq[w->peer]++;
    }
    atomic_store_explicit(&w->rc->head, w->head, memory_order_seq_cst);
    wake(s, w->peer);
    return n;
}

/* Copies what has landed, up to the next chunk boundary, and releases it to the writer; calls
 * on_recv when a chunk is complete. Returns bytes moved, or a failure (malformed message). */
static long recv_step(shm *s, recv_op *r) {
    uint64_t avail = r->head - r->tail;
    size_t need = r->hdr_done ? 1 : MSG_HDR + 1;
    if (avail < need) {
        r->head = atomic_load_explicit(&r->rc->head, memory_order_acquire);
        avail = r->head - r->tail;
        if (avail < need)
            return 0;
    }
    if (!r->hdr_done) {
        msg_hdr m;
        memcpy(&m, r->ring + (r->tail & (s->cap - 1)), sizeof m);
        if (m.magic != MSG_MAGIC || m.seq != s->recv_seq[r->peer])
            return fail_job(s, FL_EPEER, "%s sent a malformed message (message %llu expected)",
                            s->names[r->peer], (unsigned long long)s->recv_seq[r->peer]);
        if (m.len != r->total)
            return fail_job(s, FL_EPEER, "%s sent %llu bytes where %zu were expected (do all "
                            "ranks call the same collectives in the same order with the same "
                            "sizes?)", s->names[r->peer], (unsigned long long)m.len, r->total);
        r->tail += MSG_HDR;
        avail -= MSG_HDR;
        r->hdr_done = true;
    }
    size_t upto = (r->got / CHUNK + 1) * CHUNK;
    if (upto > r->total)
        upto = r->total;
    size_t n = upto - r->got;
    if (n > avail)
        n = (size_t)avail;
    copy_out(r->buf + r->got, r->ring, s->cap, r->tail, n);
    r->tail += n;
    r->got += n;
    if (r->got == r->total) {
        r->tail += pad_after(r->tail);
        r->done = true;
        s->recv_seq[r->peer]++;
    }
    atomic_store_explicit(&r->rc->tail, r->tail, memory_order_seq_cst);
    wake(s, r->peer);
    if (r->got == upto && r->on_recv) {
        r->on_recv(r->ctx, r->reported, r->got - r->reported);
        r->reported = r->got;
    }
    return (long)n;
}

/* ---------------------------------------------------------------- waiting */

typedef struct {
    int    peer;       /* the one this call waits on: receiving from, else sending to */
    bool   stalled, blocked;
    double since;      /* when the current stall began */
    double spin_left;  /* of this call's spin budget */
    double next_check; /* of the peers' liveness */
} wait_state;

/* Something this call waits for may have changed (or a failure was published). seq_cst: after
 * a store of `sleeping` these loads must not move before it (see wake). */
static bool ready(shm *s, const send_op *w, const recv_op *r) {
    if (!w->done && atomic_load_explicit(&w->rc->tail, memory_order_seq_cst) != w->tail)
        return true;
    if (!r->done && atomic_load_explicit(&r->rc->head, memory_order_seq_cst) != r->head)
        return true;
    return atomic_load_explicit(&s->hdr->abort_state, memory_order_seq_cst) != 0;
}

static bool peer_dead(shm *s, int p) {
    if (s->have_pidfd) {
        struct pollfd pf = {.fd = s->pfd[p].fd, .events = POLLIN};
        return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR));
    }
    return kill(s->ctl[p].pid, 0) < 0 && errno == ESRCH; /* no pidfd: zombies look alive */
}

/* The peers this call moves data with, while nothing moves: one that died or closed fails the
 * call unless its data is still in the ring. Peers not involved are left alone (a rank may
 * finish and leave while others still work; whoever needs it next will tell). */
static int check_peers(shm *s, const send_op *w, const recv_op *r) {
    if (!r->done) {
        int p = r->peer;
        bool closed = atomic_load_explicit(&s->ctl[p].closed, memory_order_acquire);
        bool dead = !closed && peer_dead(s, p);
        if ((closed || dead) &&
            atomic_load_explicit(&r->rc->head, memory_order_acquire) == r->head)
            return fail_job(s, FL_EPEER, closed ? "%s closed the connection" : "%s died",
                            s->names[p]);
    }
    if (!w->done) {
        int p = w->peer;
        bool closed = atomic_load_explicit(&s->ctl[p].closed, memory_order_acquire);
        if (closed || peer_dead(s, p))
            return fail_job(s, FL_EPEER, closed ? "%s closed the connection" : "%s died",
                            s->names[p]);
    }
    return 0;
}

static double grace_s(const shm *s) {
    double v = s->timeout_s / 2;
    return v > 10 ? 10 : v;
}

/* One round of waiting while nothing moves: spin on the rings within the call's budget, else
 * sleep on our futex for at most POLL_S; then look at failures, peers and the deadline.
 * Returns 0 to try moving bytes again, or a failure. */
static int wait_round(shm *s, const send_op *w, const recv_op *r, wait_state *ws) {
    rank_ctl *me = &s->ctl[s->base.rank];
    double now = fl_now();
    if (!ws->stalled) {
        ws->stalled = true;
        ws->since = now;
    }
    if (ws->spin_left > 0) {
        double end = now + ws->spin_left;
        for (;;) {
            for (int i = 0; i < YIELD_SPINS; i++) {
                if (ready(s, w, r)) {
                    ws->spin_left = end - fl_now();
                    goto checks;
                }
                cpu_relax();
            }
            if ((now = fl_now()) >= end)
                break;
            /* with more ranks than the CPUs they may run on together (crowded: the union of
             * their affinity masks, fl_shm_open), or a peer that last ran on this very core,
             * the rank we wait for (or the one it waits for) may need this core: let it run
             * now rather than after our time slice (2 ranks on one core: 10 us per 4 KiB
             * allreduce without this, 2.6 us with; 4 ranks on 2 cores: 82 us without
             * spinning, 12 us spinning thus). Not otherwise: a yield is a syscall that delays
             * noticing a peer running on another core, and ranks bound one to a core (fleetrun
             * --bind_to core) each see a single CPU of their own but never share one. */
            if (s->crowded ||
                atomic_load_explicit(&s->ctl[ws->peer].cpu, memory_order_relaxed) ==
                    sched_getcpu())
                sched_yield();
        }
        ws->spin_left = 0;
    }
    if (!ws->blocked) {
        atomic_store_explicit(&me->blocked, 1, memory_order_relaxed);
        ws->blocked = true;
    }
    atomic_store_explicit(&me->sleeping, 1, memory_order_seq_cst);
    uint32_t bell = atomic_load_explicit(&me->bell, memory_order_seq_cst);
    if (!ready(s, w, r)) {
        double left = ws->since + s->timeout_s + grace_s(s) - now;
        if (left > POLL_S)
            left = POLL_S;
        if (left < 1e-4)
            left = 1e-4;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(left * 1e9)};
        long woke = futex(&me->bell, FUTEX_WAIT, bell, &ts);
        /* A sleep that a peer ended soon after the spin gave up: had we spun a little longer we
         * would not have slept, and a peer that then spins out waiting for the sleeper's late
         * reply sleeps too (a convoy that lasts while wake-ups are slower than the budget).
         * Spin longer from now on, up to SPIN_GROWTH times the budget; back to it after a long
         * wait, when sleeping was right. */
        double stall = fl_now() - ws->since;
        if (s->spin_s > 0 && (woke == 0 || errno != ETIMEDOUT) && stall < SPIN_GROWTH * s->spin_s)
            s->spin_cur = 2 * s->spin_cur < SPIN_GROWTH * s->spin_s ? 2 * s->spin_cur
                                                                    : SPIN_GROWTH * s->spin_s;
        else if (stall > SPIN_GROWTH * s->spin_s)
            s->spin_cur = s->spin_s;
    }
    atomic_store_explicit(&me->sleeping, 0, memory_order_relaxed);
checks:
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_acquire) != 0)
        return adopt_failure(s, FL_EPEER, "another rank failed");
    now = fl_now();
    if (now < ws->next_check)
        return 0;
    ws->next_check = now + POLL_S;
    FL_TRY(check_peers(s, w, r));
    int peer = !r->done ? r->peer : w->peer;
    bool alive = atomic_load_explicit(&s->ctl[peer].blocked, memory_order_relaxed);
    double limit = s->timeout_s + (alive ? grace_s(s) : 0);
    if (now - ws->since < limit)
        return 0;
    const char *why = alive ? " (it is alive but waiting too: do all ranks call the same "
                              "collectives in the same order with the same sizes?)"
                            : "";
    if (!r->done)
        return fail_job(s, FL_ETIMEOUT, "no data from %s for %g s%s", s->names[peer], limit, why);
    return fail_job(s, FL_ETIMEOUT, "%s accepted no data for %g s%s", s->names[peer], limit, why);
}

/* ---------------------------------------------------------------- fl_peers */

static int shm_sendrecv(fl_peers *pp, int to, const void *sbuf, size_t sbytes, int from,
                        void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx) {
    shm *s = (shm *)pp;
    if (s->failed)
        return fl_fail(s->fail_code, "%s", s->fail_msg);
    int rank = s->base.rank, n = s->base.size;
    bool do_send = to >= 0 && sbytes > 0, do_recv = from >= 0 && rbytes > 0;
    FL_ASSERT(!do_send || (to < n && to != rank && sbuf));
    FL_ASSERT(!do_recv || (from < n && from != rank && rbuf));
    if (!do_send && !do_recv)
        return 0;
    if (atomic_load_explicit(&s->hdr->abort_state, memory_order_relaxed) != 0)
        return adopt_failure(s, FL_EPEER, "another rank failed");
    send_op w = {.peer = to, .buf = sbuf, .total = sbytes, .done = !do_send};
    recv_op r = {.peer = from, .buf = rbuf, .total = rbytes, .done = !do_recv,
                 .on_recv = on_recv, .ctx = ctx};
    if (do_send) {
        w.rc = ring_of(s, rank, to);
        w.ring = ring_data(s, rank, to);
        w.head = atomic_load_explicit(&w.rc->head, memory_order_relaxed);
        w.tail = atomic_load_explicit(&w.rc->tail, memory_order_acquire);
    }
    if (do_recv) {
        r.rc = ring_of(s, from, rank);
        r.ring = ring_data(s, from, rank);
        r.tail = atomic_load_explicit(&r.rc->tail, memory_order_relaxed);
        r.head = atomic_load_explicit(&r.rc->head, memory_order_acquire);
    }
    wait_state ws = {.spin_left = s->spin_cur, .peer = do_recv ? from : to};
    int cpu = sched_getcpu();
    if (cpu != s->cpu) { /* written only on a change: peers read this line on every publish */
        s->cpu = cpu;
        atomic_store_explicit(&s->ctl[rank].cpu, cpu, memory_order_relaxed);
    }
    int rc = 0;
    for (;;) {
        size_t moved = 0;
        if (!w.done)
            moved += send_step(s, &w);
        if (!r.done) {
            long k = recv_step(s, &r);
            if (k < 0) {
                rc = (int)k;
                break;
            }
            moved += (size_t)k;
        }
        if (w.done && r.done)
            break;
        if (moved) {
            ws.stalled = false;
            continue;
        }
        /* a small message's reply usually lands within a microsecond: look a few times
         * before wait_round reads the clock */
        bool soon = false;
        for (int i = 0; i < QUICK_SPINS && ws.spin_left > 0 && !soon; i++) {
            cpu_relax();
            soon = ready(s, &w, &r);
        }
        if (soon && !atomic_load_explicit(&s->hdr->abort_state, memory_order_relaxed))
            continue;
        rc = wait_round(s, &w, &r, &ws);
        if (rc < 0)
            break;
    }
    if (ws.blocked && !s->held)
        atomic_store_explicit(&s->ctl[rank].blocked, 0, memory_order_relaxed);
    /* counted once per call: only what was delivered, not a failed call's partial bytes */
    if (rc == 0) {
        atomic_fetch_add_explicit(&s->counters->bytes_sent, w.sent, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->counters->bytes_received, r.got, memory_order_relaxed);
    }
    return rc;
}

static const char *shm_peer_name(const fl_peers *pp, int rank) {
    const shm *s = (const shm *)pp;
    if (rank < 0 || rank >= s->base.size)
        return "rank ?";
    return s->names[rank];
}

void shm_peers_free(fl_peers *pp) {
    shm *s = (shm *)pp;
    if (s->hdr && !s->failed)
        atomic_store_explicit(&s->ctl[s->base.rank].closed, 1, memory_order_release);
    if (s->seg)
        munmap(s->seg, s->seg_bytes);
    for (int p = 0; s->pfd && p < s->base.size; p++)
        if (s->pfd[p].fd >= 0)
            close(s->pfd[p].fd);
    free(s->pfd);
    free(s->send_seq);
    free(s->recv_seq);
    free(s->names);
    free(s);
}

const struct fl_peers_ops shm_peers_ops = {
    .sendrecv  = shm_sendrecv,
    .peer_name = shm_peer_name,
    .free      = shm_peers_free,
};

int fl_shm_abort(fl_peers *p, int code, const char *msg) {
    FL_ASSERT(p && p->ops == &shm_peers_ops && code < 0);
    shm *s = (shm *)p;
    if (s->failed)
        return fl_fail(s->fail_code, "%s", s->fail_msg);
    if (!s->hdr) /* a single rank: nobody to tell */
        return set_failed(s, code, s->base.rank, msg);
    return fail_job(s, code, "%s", msg);
}

void fl_shm_hold(fl_peers *p, int waiting) {
    FL_ASSERT(p && p->ops == &shm_peers_ops);
    shm *s = (shm *)p;
    s->held = waiting != 0;
    if (s->hdr)
        atomic_store_explicit(&s->ctl[s->base.rank].blocked, s->held ? 1 : 0,
                              memory_order_relaxed);
}

size_t fl_shm_ring_bytes(const fl_peers *p) {
    FL_ASSERT(p && p->ops == &shm_peers_ops);
    return ((const shm *)p)->cap;
}

bool fl_shm_crowded(const fl_peers *p) {
    FL_ASSERT(p && p->ops == &shm_peers_ops);
    return ((const shm *)p)->crowded;
}
