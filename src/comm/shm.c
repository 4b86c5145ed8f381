/* shm.c - the shared-memory transport (shm.h): one memfd segment mapped by every rank of the
 * host, holding a single-producer single-consumer byte ring per ordered pair of ranks. sendrecv
 * copies into the peer's ring as space frees and out of its own as data lands, both directions
 * in one loop; a waiting rank spins briefly, then sleeps on a futex word of its own that writers
 * ring only when it said it sleeps. Liveness comes from pidfds, and the first failure is written
 * into the segment, so every rank names the same culprit (transport.c's ABORT frames). */
#define _GNU_SOURCE /* memfd_create, SO_PEERCRED, accept4 */
#include "shm.h"

#include "net.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Granularity of on_recv and of each copy into a ring. With 2 ranks exchanging 1-64 MiB
 * (test_shm --bench), 32 KiB to 256 KiB are within noise of each other; 64 KiB keeps a chunk in
 * L1/L2 while the caller reduces it and lets the peer start on a message early. */
#define CHUNK ((size_t)64 << 10)
/* Ring per ordered pair: 1 MiB measured best for 64 MiB allreduce between 2 ranks (256 KiB to
 * 4 MiB within ~10%; smaller rings make the writer wait for the reader more often). Many ranks
 * shrink it so that a segment stays within SEG_BUDGET (pages are only used once touched). */
#define RING_KIB_DEFAULT 1024
#define RING_KIB_MIN     64
#define RING_KIB_MAX     65536
#define SEG_BUDGET       ((size_t)256 << 20)
#define MAX_RANKS        512
#define MSG_HDR          64   /* every message starts with one cache line: magic, seq, length */
#define POLL_S           0.01 /* a sleeping rank wakes this often to check on its peers */
#define SPIN_GROWTH      16   /* adapted spin budget: at most this times FLEET_COMM_SPIN_US */
#define QUICK_SPINS      16   /* ring checks (~0.5 us of PAUSE) before a wait reads the clock */
#define YIELD_SPINS      4    /* then ring checks between two sched_yield()s while spinning */
#define ABORT_MAX        512
#define SEG_MAGIC        0x314d485354454c46ull /* "FLETSHM1" */
#define MSG_MAGIC        0x4d534c46u           /* "FLSM" */
#define NAME_MAX_LEN     (FL_ENDPOINT_MAX + 32)

/* ---------------------------------------------------------------- the segment */

/* Head and tail of one ring on lines of their own: the writer stores head, the reader tail. */
typedef struct {
    alignas(64) _Atomic uint64_t head; /* bytes published by the writer (monotonic) */
    alignas(64) _Atomic uint64_t tail; /* bytes released by the reader */
} ring_ctl;

typedef struct {
    alignas(64) _Atomic uint32_t bell; /* futex word: bumped by whoever wakes this rank */
    _Atomic uint32_t sleeping;         /* 1 while this rank is (about to be) in FUTEX_WAIT */
    _Atomic uint32_t blocked;          /* 1 while a sendrecv of this rank waits (timeout grace) */
    _Atomic uint32_t closed;           /* freed without failure: it sends nothing more */
    _Atomic int32_t  cpu;              /* where this rank last started a sendrecv */
    int32_t          pid;
    /* the CPUs this rank may run on, written before the handshake's end and read once after
     * it (crowded); empty: not known (a mask beyond CPU_SETSIZE) */
    alignas(64) cpu_set_t cpus;
} rank_ctl;

typedef struct {
    uint64_t magic, cookie, seg_bytes, ring_bytes;
    uint32_t size;
    alignas(64) _Atomic uint32_t abort_state; /* 0 none, 1 being written, 2 published */
    int32_t abort_code, abort_reporter;
    char    abort_msg[ABORT_MAX];
} seg_hdr;

typedef struct {
    uint32_t magic, pad;
    uint64_t seq, len;
} msg_hdr;

/* Where things lie in a segment of n ranks with rings of cap bytes. */
typedef struct {
    size_t ctl, rings, data, total;
} seg_layout;

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static seg_layout layout(int n, size_t cap) {
    seg_layout l;
    l.ctl = round_up(sizeof(seg_hdr), 4096);
    l.rings = l.ctl + round_up((size_t)n * sizeof(rank_ctl), 4096);
    l.data = l.rings + round_up((size_t)n * (size_t)n * sizeof(ring_ctl), 4096);
    l.total = l.data + (size_t)n * (size_t)(n - 1) * cap;
    return l;
}

/* ---------------------------------------------------------------- the transport */

typedef struct {
    fl_peers          base;
    uint8_t          *seg;
    size_t            seg_bytes, cap;
    seg_hdr          *hdr;
    rank_ctl         *ctl;   /* [size] */
    ring_ctl         *rings; /* [size * size]: ring i -> j at i * size + j */
    uint8_t          *data;  /* ring i -> j's bytes at data_index(i, j) * cap */
    double            timeout_s;
    double            spin_s, spin_cur; /* spin budget per call: configured, and as adapted */
    bool              crowded;          /* more ranks than the CPUs they may run on together */
    int               cpu;              /* the last one written to our rank_ctl */
    fl_comm_counters *counters, own_counters;
    struct pollfd    *pfd;      /* [size] pidfd of each peer (-1 for self; none if !have_pidfd) */
    bool              have_pidfd;
    uint64_t         *send_seq, *recv_seq; /* [size] next message's number, per direction */
    char            (*names)[NAME_MAX_LEN]; /* [size] "rank 3 (127.0.0.1:6173)" */
    bool              held;   /* fl_shm_hold: waiting elsewhere, so peers give grace */
    bool              failed;
    int               fail_code;
    char              fail_msg[1024];
} shm;

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

static void shm_free(fl_peers *pp) {
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

static const struct fl_peers_ops shm_ops = {
    .sendrecv  = shm_sendrecv,
    .peer_name = shm_peer_name,
    .free      = shm_free,
};

int fl_shm_abort(fl_peers *p, int code, const char *msg) {
    FL_ASSERT(p && p->ops == &shm_ops && code < 0);
    shm *s = (shm *)p;
    if (s->failed)
        return fl_fail(s->fail_code, "%s", s->fail_msg);
    if (!s->hdr) /* a single rank: nobody to tell */
        return set_failed(s, code, s->base.rank, msg);
    return fail_job(s, code, "%s", msg);
}

void fl_shm_hold(fl_peers *p, int waiting) {
    FL_ASSERT(p && p->ops == &shm_ops);
    shm *s = (shm *)p;
    s->held = waiting != 0;
    if (s->hdr)
        atomic_store_explicit(&s->ctl[s->base.rank].blocked, s->held ? 1 : 0,
                              memory_order_relaxed);
}

size_t fl_shm_ring_bytes(const fl_peers *p) {
    FL_ASSERT(p && p->ops == &shm_ops);
    return ((const shm *)p)->cap;
}

bool fl_shm_crowded(const fl_peers *p) {
    FL_ASSERT(p && p->ops == &shm_ops);
    return ((const shm *)p)->crowded;
}

/* ---------------------------------------------------------------- set-up */

/* What each rank tells rank 0, and what rank 0 answers (through boot; same host, so native
 * byte order). */
typedef struct {
    uint64_t magic;
    int32_t  rank, pid;
    uint64_t pidns_dev, pidns_ino, netns_dev, netns_ino;
    char     boot_id[40];
} hello;

typedef struct {
    uint64_t magic;
    int32_t  code; /* 0: go on; else every rank fails with it and msg */
    int32_t  pid0;
    uint64_t cookie, seg_bytes, ring_bytes;
    char     sock[32];  /* abstract unix socket name that hands out the memfd */
    uint8_t  nonce[16]; /* proves to rank 0 that the connection is this rank's */
    char     msg[256];
} plan;

typedef struct {
    uint64_t magic;
    int32_t  code, pad;
    char     msg[256];
} status;

typedef struct {
    uint32_t rank;
    uint8_t  nonce[16];
} proof;

static void random_bytes(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom((char *)buf + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) { /* no getrandom: unique enough for a name, weak as a secret */
            uint64_t x = (uint64_t)(fl_now() * 1e9) ^ ((uint64_t)getpid() << 32);
            for (; got < n; got++, x = x * 6364136223846793005ull + 1442695040888963407ull)
                ((uint8_t *)buf)[got] = (uint8_t)(x >> 56);
            return;
        }
        got += (size_t)k;
    }
}

static void ns_id(const char *path, uint64_t *dev, uint64_t *ino) {
    struct stat st;
    if (stat(path, &st) == 0) {
        *dev = (uint64_t)st.st_dev;
        *ino = (uint64_t)st.st_ino;
    } else {
        *dev = *ino = 0;
    }
}

static hello make_hello(int rank) {
    hello h;
    memset(&h, 0, sizeof h);
    h.magic = SEG_MAGIC;
    h.rank = rank;
    h.pid = (int32_t)getpid();
    ns_id("/proc/self/ns/pid", &h.pidns_dev, &h.pidns_ino);
    ns_id("/proc/self/ns/net", &h.netns_dev, &h.netns_ino);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(h.boot_id, sizeof h.boot_id, f))
            h.boot_id[0] = '\0';
        fclose(f);
    }
    h.boot_id[sizeof h.boot_id - 1] = '\0';
    return h;
}

/* Whether every rank shares rank 0's host (boot id), pid namespace (pids and pidfds mean the
 * same) and network namespace (the abstract socket reaches). 0, or FL_EUNSUPPORTED in msg. */
static int check_hellos(const hello *h, int n, char *msg, size_t cap) {
    if (!h[0].boot_id[0] || !h[0].pidns_ino || !h[0].netns_ino) {
        snprintf(msg, cap, "shared memory: rank 0 cannot read its host and namespace identity "
                 "from /proc");
        return FL_EUNSUPPORTED;
    }
    for (int r = 1; r < n; r++) {
        const char *where = NULL;
        if (h[r].magic != SEG_MAGIC || h[r].rank != r) {
            snprintf(msg, cap, "shared memory: rank %d sent a malformed hello", r);
            return FL_EPEER;
        }
        if (strcmp(h[r].boot_id, h[0].boot_id) != 0)
            where = "on a different host";
        else if (h[r].pidns_ino != h[0].pidns_ino || h[r].pidns_dev != h[0].pidns_dev)
            where = "in a different pid namespace";
        else if (h[r].netns_ino != h[0].netns_ino || h[r].netns_dev != h[0].netns_dev)
            where = "in a different network namespace";
        if (where) {
            snprintf(msg, cap, "shared memory: rank %d is %s from rank 0", r, where);
            return FL_EUNSUPPORTED;
        }
    }
    return 0;
}

static size_t ring_bytes_for(int n) {
    size_t kib = RING_KIB_DEFAULT;
    const char *v = getenv("FLEET_SHM_RING_KIB");
    if (v && *v) {
        char *end;
        long k = strtol(v, &end, 10);
        if (*end || k < RING_KIB_MIN || k > RING_KIB_MAX || (k & (k - 1)) != 0)
            FL_WARN("FLEET_SHM_RING_KIB=%s is not a power of two in [%d, %d]; using %d", v,
                    RING_KIB_MIN, RING_KIB_MAX, RING_KIB_DEFAULT);
        else
            return (size_t)k << 10;
    }
    while (kib > RING_KIB_MIN && (size_t)n * (size_t)(n - 1) * (kib << 10) > SEG_BUDGET)
        kib /= 2;
    return kib << 10;
}

/* name: a NUL-terminated string of at most 31 characters (plan.sock). */
static socklen_t unix_addr(const char name[32], struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, 31);
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = '\0': the abstract namespace */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Maps fd (seg_bytes) and checks the header; 0 or FL_EIO / FL_EPEER in msg. */
static int map_segment(shm *s, int fd, size_t seg_bytes, char *msg, size_t cap) {
    void *m = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(msg, cap, "rank %d: mapping %zu bytes of shared memory failed: %s",
                 s->base.rank, seg_bytes, strerror(errno));
        return FL_EIO;
    }
    (void)madvise(m, seg_bytes, MADV_DONTFORK); /* children forked later keep nothing alive */
    s->seg = m;
    s->seg_bytes = seg_bytes;
    seg_layout l = layout(s->base.size, s->cap);
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

/* Rank 0: the memfd, sized and initialised (pids from the hellos). 0 or a failure in msg. */
static int create_segment(shm *s, const hello *h, uint64_t cookie, int *fd_out, char *msg,
                          size_t cap) {
    int n = s->base.size;
    seg_layout l = layout(n, s->cap);
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
    int rc = map_segment(s, fd, l.total, msg, cap);
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

/* Rank 0: hands the memfd to every rank that connects with its nonce (from its own pid), until
 * `expected` ranks are served or the deadline. Strangers are dropped. 0 or a failure in msg. */
static int serve_fd(shm *s, int lfd, int memfd, const hello *h, uint8_t (*nonces)[16],
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

/* Rank r > 0: connects to rank 0's socket and proves itself. The socket, or -1 (msg says). */
static int join(const plan *pl, int rank, double deadline, char *msg, size_t cap) {
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

/* Rank r > 0: receives the memfd on sock, maps it and checks it is rank 0's. */
static int attach(shm *s, const plan *pl, int sock, double deadline, char *msg, size_t cap) {
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
        rc = map_segment(s, fd, (size_t)pl->seg_bytes, msg, cap);
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

/* Names (boot's: "rank 3 (127.0.0.1:6173)", as the sockets name them; "rank 3 (pid P)" when
 * boot has no endpoints) and pidfds of the peers (pids from the segment). 0 or a failure in
 * msg. */
static int watch_peers(shm *s, fl_peers *boot, char *msg, size_t cap) {
    int n = s->base.size;
    s->have_pidfd = true;
    for (int p = 0; p < n; p++) {
        const char *bn = fl_peers_name(boot, p);
        if (strchr(bn, ':'))
            snprintf(s->names[p], NAME_MAX_LEN, "%s", bn);
        else
            snprintf(s->names[p], NAME_MAX_LEN, "rank %d (pid %d)", p, (int)s->ctl[p].pid);
        s->pfd[p].fd = -1;
    }
    for (int p = 0; p < n; p++) {
        if (p == s->base.rank)
            continue;
        int fd = (int)syscall(SYS_pidfd_open, (pid_t)s->ctl[p].pid, 0);
        if (fd < 0 && errno == ENOSYS) {
            FL_DEBUG("comm: no pidfd_open: shared-memory peers are watched with kill(pid, 0)");
            s->have_pidfd = false;
            break;
        }
        if (fd < 0) {
            snprintf(msg, cap, "shared memory: rank %d cannot watch %s: %s", s->base.rank,
                     s->names[p], strerror(errno));
            return FL_EPEER;
        }
        s->pfd[p].fd = fd;
    }
    return 0;
}

/* Writes the CPUs this rank may run on into its control slot, for group_crowded (empty when
 * its mask does not fit in CPU_SETSIZE). Before this rank's next message of the handshake. */
static void publish_cpus(shm *s) {
    cpu_set_t *set = &s->ctl[s->base.rank].cpus;
    if (sched_getaffinity(0, sizeof *set, set) != 0)
        CPU_ZERO(set);
    atomic_thread_fence(memory_order_release);
}

/* Whether the ranks outnumber the CPUs they may run on together: the union of every rank's
 * published mask, so that it is a property of the group (ranks bound one to a core each see one
 * CPU, yet are not crowded; ranks bound to one core together are). Every mask is published
 * once agree() succeeded. A mask not known counts as every online CPU. */
static bool group_crowded(const shm *s) {
    atomic_thread_fence(memory_order_acquire);
    int n = s->base.size;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int r = 0; r < n; r++) {
        if (CPU_COUNT(&s->ctl[r].cpus) == 0)
            return n > (int)sysconf(_SC_NPROCESSORS_ONLN);
        CPU_OR(&all, &all, &s->ctl[r].cpus);
    }
    return CPU_COUNT(&all) < n;
}

/* Rank 0 collects one status from every rank and sends them all the first failure (its own
 * first), so that every rank returns the same code and message. Returns that code (set). */
static int agree(fl_peers *boot, const status *mine) {
    int rank = boot->rank, n = boot->size;
    status v = *mine;
    if (rank == 0) {
        for (int r = 1; r < n; r++) {
            status st;
            FL_TRY(fl_peers_sendrecv(boot, -1, NULL, 0, r, &st, sizeof st, NULL, NULL));
            st.msg[sizeof st.msg - 1] = '\0';
            if (v.code == 0 && (st.magic != SEG_MAGIC || st.code != 0)) {
                v = st;
                if (st.magic != SEG_MAGIC || st.code > 0 || st.code < FL_ESTATE) {
                    v.code = FL_EPEER;
                    snprintf(v.msg, sizeof v.msg, "shared memory: rank %d sent a malformed "
                             "status", r);
                }
            }
        }
        for (int r = 1; r < n; r++)
            FL_TRY(fl_peers_sendrecv(boot, r, &v, sizeof v, -1, NULL, 0, NULL, NULL));
    } else {
        FL_TRY(fl_peers_sendrecv(boot, 0, mine, sizeof *mine, -1, NULL, 0, NULL, NULL));
        FL_TRY(fl_peers_sendrecv(boot, -1, NULL, 0, 0, &v, sizeof v, NULL, NULL));
        v.msg[sizeof v.msg - 1] = '\0';
        if (v.magic != SEG_MAGIC || v.code > 0 || v.code < FL_ESTATE)
            return fl_fail(FL_EPEER, "shared memory: rank 0 sent a malformed verdict");
    }
    return v.code ? fl_fail(v.code, "%s", v.msg) : 0;
}

int fl_shm_open(fl_peers *boot, double timeout_s, fl_comm_counters *counters, fl_peers **out) {
    FL_ASSERT(boot && out);
    int rank = boot->rank, n = boot->size, rc = 0, memfd = -1, lfd = -1, sock = -1;
    double deadline = fl_now() + (timeout_s > 0 ? timeout_s : 300);
    hello *hellos = NULL;
    uint8_t(*nonces)[16] = NULL;
    bool *expect = NULL;
    *out = NULL;
    if (n > MAX_RANKS)
        return fl_fail(FL_EUNSUPPORTED, "shared memory: %d ranks on one host (at most %d)", n,
                       MAX_RANKS);
    shm *s = calloc(1, sizeof *s);
    if (!s)
        return fl_fail(FL_ENOMEM, "out of memory opening shared memory for %d ranks", n);
    s->base.ops = &shm_ops;
    s->base.rank = rank;
    s->base.size = n;
    s->timeout_s = timeout_s > 0 ? timeout_s : 300;
    /* spinning yields the core where that may help (wait_round, s->crowded), so it also pays
     * when there are more ranks than cores */
    s->spin_s = s->spin_cur = fl_comm_spin_budget_s();
    s->counters = counters ? counters : &s->own_counters;
    s->pfd = calloc((size_t)n, sizeof *s->pfd);
    s->send_seq = calloc((size_t)n, sizeof *s->send_seq);
    s->recv_seq = calloc((size_t)n, sizeof *s->recv_seq);
    s->names = calloc((size_t)n, sizeof *s->names);
    if (!s->pfd || !s->send_seq || !s->recv_seq || !s->names) {
        rc = fl_fail(FL_ENOMEM, "out of memory opening shared memory for %d ranks", n);
        goto fail;
    }
    for (int p = 0; p < n; p++) {
        s->pfd[p].fd = -1;
        snprintf(s->names[p], NAME_MAX_LEN, "rank %d", p);
    }
    if (n == 1) { /* nothing to share: sendrecv has no peer to move bytes with */
        *out = &s->base;
        return 0;
    }

    /* 1. every rank's identity to rank 0 */
    hello me = make_hello(rank);
    if (rank == 0) {
        hellos = calloc((size_t)n, sizeof *hellos);
        nonces = calloc((size_t)n, sizeof *nonces);
        expect = calloc((size_t)n, sizeof *expect);
        if (!hellos || !nonces || !expect) {
            rc = fl_fail(FL_ENOMEM, "out of memory opening shared memory for %d ranks", n);
            goto fail;
        }
        hellos[0] = me;
        for (int r = 1; r < n; r++) {
            rc = fl_peers_sendrecv(boot, -1, NULL, 0, r, &hellos[r], sizeof *hellos, NULL, NULL);
            if (rc < 0)
                goto fail;
            hellos[r].boot_id[sizeof hellos[r].boot_id - 1] = '\0';
        }
    } else {
        rc = fl_peers_sendrecv(boot, 0, &me, sizeof me, -1, NULL, 0, NULL, NULL);
        if (rc < 0)
            goto fail;
    }

    /* 2. rank 0 checks them, makes the segment and a socket to hand it out, tells everyone */
    plan pl;
    memset(&pl, 0, sizeof pl);
    if (rank == 0) {
        pl.magic = SEG_MAGIC;
        pl.pid0 = me.pid;
        s->cap = ring_bytes_for(n);
        random_bytes(&pl.cookie, sizeof pl.cookie);
        pl.code = check_hellos(hellos, n, pl.msg, sizeof pl.msg);
        if (!pl.code)
            pl.code = create_segment(s, hellos, pl.cookie, &memfd, pl.msg, sizeof pl.msg);
        if (!pl.code) {
            uint64_t name;
            random_bytes(&name, sizeof name);
            snprintf(pl.sock, sizeof pl.sock, "fleet-shm-%016llx", (unsigned long long)name);
            struct sockaddr_un a;
            socklen_t len = unix_addr(pl.sock, &a);
            lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, len) < 0 || listen(lfd, n + 16) < 0) {
                snprintf(pl.msg, sizeof pl.msg, "shared memory: rank 0 cannot listen on a unix "
                         "socket: %s", strerror(errno));
                pl.code = FL_EUNSUPPORTED;
            }
        }
        pl.seg_bytes = s->seg_bytes;
        pl.ring_bytes = s->cap;
        for (int r = 1; r < n; r++) {
            random_bytes(nonces[r], sizeof nonces[r]);
            memcpy(pl.nonce, nonces[r], sizeof pl.nonce);
            rc = fl_peers_sendrecv(boot, r, &pl, sizeof pl, -1, NULL, 0, NULL, NULL);
            if (rc < 0)
                goto fail;
        }
    } else {
        rc = fl_peers_sendrecv(boot, -1, NULL, 0, 0, &pl, sizeof pl, NULL, NULL);
        if (rc < 0)
            goto fail;
        pl.msg[sizeof pl.msg - 1] = '\0';
        pl.sock[sizeof pl.sock - 1] = '\0';
        if (pl.magic != SEG_MAGIC || pl.code > 0 || pl.code < FL_ESTATE ||
            (!pl.code && (pl.ring_bytes < ((size_t)RING_KIB_MIN << 10) ||
                          (pl.ring_bytes & (pl.ring_bytes - 1)) ||
                          pl.ring_bytes > ((size_t)RING_KIB_MAX << 10)))) {
            rc = fl_fail(FL_EPEER, "shared memory: rank 0 sent a malformed plan");
            goto fail;
        }
        s->cap = (size_t)pl.ring_bytes;
    }
    if (pl.code) {
        rc = fl_fail(pl.code, "%s", pl.msg);
        goto fail;
    }

    /* 3. ranks connect to rank 0's socket (the backlog holds them) and say whether they could;
     * rank 0 then hands the memfd to each that did */
    status st = {.magic = SEG_MAGIC};
    if (rank == 0) {
        int expected = 0;
        for (int r = 1; r < n; r++) {
            status got;
            rc = fl_peers_sendrecv(boot, -1, NULL, 0, r, &got, sizeof got, NULL, NULL);
            if (rc < 0)
                goto fail;
            got.msg[sizeof got.msg - 1] = '\0';
            expect[r] = got.magic == SEG_MAGIC && got.code == 0;
            expected += expect[r];
            if (!expect[r] && st.code == 0) {
                st.code = got.magic == SEG_MAGIC && got.code < 0 ? got.code : FL_EPEER;
                snprintf(st.msg, sizeof st.msg, "%s", got.msg);
            }
        }
        int e = serve_fd(s, lfd, memfd, hellos, nonces, expect, expected, deadline, st.msg,
                         sizeof st.msg);
        if (e && st.code == 0)
            st.code = e;
        close(lfd);
        close(memfd); /* from now on only the mappings hold the memory */
        lfd = memfd = -1;
    } else {
        sock = join(&pl, rank, deadline, st.msg, sizeof st.msg);
        if (sock < 0)
            st.code = FL_EUNSUPPORTED;
        rc = fl_peers_sendrecv(boot, 0, &st, sizeof st, -1, NULL, 0, NULL, NULL);
        if (rc < 0)
            goto fail;
        if (sock >= 0)
            st.code = attach(s, &pl, sock, deadline, st.msg, sizeof st.msg);
    }
    if (st.code == 0) {
        publish_cpus(s);
        st.code = watch_peers(s, boot, st.msg, sizeof st.msg);
    }

    /* 4. everyone agrees on the outcome; then every rank's CPUs are in the segment */
    rc = agree(boot, &st);
    if (rc < 0)
        goto fail;
    s->crowded = group_crowded(s);
    if (sock >= 0)
        close(sock);
    free(hellos);
    free(nonces);
    free(expect);
    FL_DEBUG("comm: rank %d shares memory with %d local peer(s) (rings of %zu KiB%s)", rank,
             n - 1, s->cap >> 10, s->crowded ? "; more ranks than CPUs: spinning yields" : "");
    *out = &s->base;
    return 0;
fail:
    if (sock >= 0)
        close(sock);
    if (lfd >= 0)
        close(lfd);
    if (memfd >= 0)
        close(memfd);
    free(hellos);
    free(nonces);
    free(expect);
    s->failed = true; /* no goodbye into a segment nobody will use */
    shm_free(&s->base);
    return rc;
}
