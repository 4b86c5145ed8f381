/* shm_setup.c - opening the shared-memory transport (fl_shm_open, shm.h) over a bootstrap
 * fl_peers, in four exchanges with rank 0: every rank's hello (host, namespaces, pid); rank
 * 0's plan (the ring size, the segment's cookie, the socket that hands it out, a nonce per
 * rank); each rank's status after fetching and mapping the segment (shm_segment.c) and
 * watching its peers' pidfds; and rank 0's verdict, the same on every rank. */
#define _GNU_SOURCE /* pidfd_open, sched_getaffinity */
#include "shm_impl.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* What fl_shm_open holds while it runs; opening_close releases it on every path. */
typedef struct {
    fl_peers *boot;
    double    deadline;
    hello     me;
    hello    *hellos;      /* rank 0: [size] */
    uint8_t (*nonces)[16]; /* rank 0: [size] */
    bool     *expect;      /* rank 0: [size] the ranks that connected to its socket */
    int       memfd, lfd;  /* rank 0: the segment, the socket that hands it out */
    int       sock;        /* rank r > 0: its connection to that socket */
    plan      pl;
    status    st;          /* this rank's outcome of fetching the segment */
} opening;

static void opening_close(opening *o) {
    if (o->sock >= 0)
        close(o->sock);
    if (o->lfd >= 0)
        close(o->lfd);
    if (o->memfd >= 0)
        close(o->memfd);
    free(o->hellos);
    free(o->nonces);
    free(o->expect);
}

/* 1. every rank's identity to rank 0 */
static int send_hellos(shm *s, opening *o) {
    int n = s->base.size, rc;
    o->me = make_hello(s->base.rank);
    if (s->base.rank != 0) {
        rc = fl_peers_sendrecv(o->boot, 0, &o->me, sizeof o->me, -1, NULL, 0, NULL, NULL);
        return rc < 0 ? rc : 0;
    }
    o->hellos = calloc((size_t)n, sizeof *o->hellos);
    o->nonces = calloc((size_t)n, sizeof *o->nonces);
    o->expect = calloc((size_t)n, sizeof *o->expect);
    if (!o->hellos || !o->nonces || !o->expect)
        return fl_fail(FL_ENOMEM, "out of memory opening shared memory for %d ranks", n);
    o->hellos[0] = o->me;
    for (int r = 1; r < n; r++) {
        rc = fl_peers_sendrecv(o->boot, -1, NULL, 0, r, &o->hellos[r], sizeof *o->hellos, NULL,
                               NULL);
        if (rc < 0)
            return rc;
        o->hellos[r].boot_id[sizeof o->hellos[r].boot_id - 1] = '\0';
    }
    return 0;
}

/* 2, rank 0: checks the hellos, makes the segment and a socket to hand it out, and tells every
 * rank (each with a nonce of its own). A failure in o->pl.code is every rank's. */
static int send_plan(shm *s, opening *o) {
    int n = s->base.size, rc;
    plan *pl = &o->pl;
    pl->magic = SEG_MAGIC;
    pl->pid0 = o->me.pid;
    s->cap = ring_bytes_for(n);
    random_bytes(&pl->cookie, sizeof pl->cookie);
    pl->code = check_hellos(o->hellos, n, pl->msg, sizeof pl->msg);
    if (!pl->code)
        pl->code = shm_create_segment(s, o->hellos, pl->cookie, &o->memfd, pl->msg,
                                      sizeof pl->msg);
    if (!pl->code) {
        uint64_t name;
        random_bytes(&name, sizeof name);
        snprintf(pl->sock, sizeof pl->sock, "fleet-shm-%016llx", (unsigned long long)name);
        o->lfd = shm_listen(pl->sock, n + 16, pl->msg, sizeof pl->msg);
        if (o->lfd < 0)
            pl->code = FL_EUNSUPPORTED;
    }
    pl->seg_bytes = s->seg_bytes;
    pl->ring_bytes = s->cap;
    for (int r = 1; r < n; r++) {
        random_bytes(o->nonces[r], sizeof o->nonces[r]);
        memcpy(pl->nonce, o->nonces[r], sizeof pl->nonce);
        rc = fl_peers_sendrecv(o->boot, r, pl, sizeof *pl, -1, NULL, 0, NULL, NULL);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* 2, rank r > 0: receives the plan and checks its form; the ring size is rank 0's. */
static int receive_plan(shm *s, opening *o) {
    plan *pl = &o->pl;
    int rc = fl_peers_sendrecv(o->boot, -1, NULL, 0, 0, pl, sizeof *pl, NULL, NULL);
    if (rc < 0)
        return rc;
    pl->msg[sizeof pl->msg - 1] = '\0';
    pl->sock[sizeof pl->sock - 1] = '\0';
    if (pl->magic != SEG_MAGIC || pl->code > 0 || pl->code < FL_ESTATE ||
        (!pl->code && (pl->ring_bytes < ((size_t)RING_KIB_MIN << 10) ||
                       (pl->ring_bytes & (pl->ring_bytes - 1)) ||
                       pl->ring_bytes > ((size_t)RING_KIB_MAX << 10))))
        return fl_fail(FL_EPEER, "shared memory: rank 0 sent a malformed plan");
    s->cap = (size_t)pl->ring_bytes;
    return 0;
}

/* 3, rank 0: learns which ranks reached its socket (the backlog holds them) and hands the
 * memfd to each of those; then only the mappings hold the memory. Its outcome in o->st. */
static int hand_out(shm *s, opening *o) {
    int n = s->base.size, expected = 0, rc;
    status *st = &o->st;
    for (int r = 1; r < n; r++) {
        status got;
        rc = fl_peers_sendrecv(o->boot, -1, NULL, 0, r, &got, sizeof got, NULL, NULL);
        if (rc < 0)
            return rc;
        got.msg[sizeof got.msg - 1] = '\0';
        o->expect[r] = got.magic == SEG_MAGIC && got.code == 0;
        expected += o->expect[r];
        if (!o->expect[r] && st->code == 0) {
            st->code = got.magic == SEG_MAGIC && got.code < 0 ? got.code : FL_EPEER;
            snprintf(st->msg, sizeof st->msg, "%s", got.msg);
        }
    }
    int e = shm_serve_fd(s, o->lfd, o->memfd, o->hellos, o->nonces, o->expect, expected,
                         o->deadline, st->msg, sizeof st->msg);
    if (e && st->code == 0)
        st->code = e;
    close(o->lfd);
    close(o->memfd);
    o->lfd = o->memfd = -1;
    return 0;
}

/* 3, rank r > 0: connects to rank 0's socket, says whether it could, and fetches and maps the
 * segment. Its outcome in o->st. */
static int fetch(shm *s, opening *o) {
    status *st = &o->st;
    o->sock = shm_join(&o->pl, s->base.rank, o->deadline, st->msg, sizeof st->msg);
    if (o->sock < 0)
        st->code = FL_EUNSUPPORTED;
    int rc = fl_peers_sendrecv(o->boot, 0, st, sizeof *st, -1, NULL, 0, NULL, NULL);
    if (rc < 0)
        return rc;
    if (o->sock >= 0)
        st->code = shm_attach(s, &o->pl, o->sock, o->deadline, st->msg, sizeof st->msg);
    return 0;
}

/* The transport's state before any exchange: every peer named "rank P", none watched yet. */
static shm *shm_new(int rank, int n, double timeout_s, fl_comm_counters *counters) {
    shm *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->base.ops = &shm_peers_ops;
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
        s->failed = true;
        shm_peers_free(&s->base);
        return NULL;
    }
    for (int p = 0; p < n; p++) {
        s->pfd[p].fd = -1;
        snprintf(s->names[p], NAME_MAX_LEN, "rank %d", p);
    }
    return s;
}

int fl_shm_open(fl_peers *boot, double timeout_s, fl_comm_counters *counters, fl_peers **out) {
    FL_ASSERT(boot && out);
    int rank = boot->rank, n = boot->size, rc = 0;
    *out = NULL;
    if (n > MAX_RANKS)
        return fl_fail(FL_EUNSUPPORTED, "shared memory: %d ranks on one host (at most %d)", n,
                       MAX_RANKS);
    shm *s = shm_new(rank, n, timeout_s, counters);
    if (!s)
        return fl_fail(FL_ENOMEM, "out of memory opening shared memory for %d ranks", n);
    if (n == 1) { /* nothing to share: sendrecv has no peer to move bytes with */
        *out = &s->base;
        return 0;
    }
    opening o = {.boot = boot, .deadline = fl_now() + (timeout_s > 0 ? timeout_s : 300),
                 .memfd = -1, .lfd = -1, .sock = -1, .st = {.magic = SEG_MAGIC}};
    if ((rc = send_hellos(s, &o)) < 0 ||
        (rc = rank == 0 ? send_plan(s, &o) : receive_plan(s, &o)) < 0)
        goto fail;
    if (o.pl.code) {
        rc = fl_fail(o.pl.code, "%s", o.pl.msg);
        goto fail;
    }
    if ((rc = rank == 0 ? hand_out(s, &o) : fetch(s, &o)) < 0)
        goto fail;
    if (o.st.code == 0) {
        publish_cpus(s);
        o.st.code = watch_peers(s, boot, o.st.msg, sizeof o.st.msg);
    }
    /* 4. everyone agrees on the outcome; then every rank's CPUs are in the segment */
    if ((rc = agree(boot, &o.st)) < 0)
        goto fail;
    s->crowded = group_crowded(s);
    opening_close(&o);
    FL_DEBUG("comm: rank %d shares memory with %d local peer(s) (rings of %zu KiB%s)", rank,
             n - 1, s->cap >> 10, s->crowded ? "; more ranks than CPUs: spinning yields" : "");
    *out = &s->base;
    return 0;
fail:
    opening_close(&o);
    s->failed = true; /* no goodbye into a segment nobody will use */
    shm_peers_free(&s->base);
    return rc;
}
