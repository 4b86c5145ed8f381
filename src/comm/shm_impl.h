/* shm_impl.h - private to the shared-memory transport (shm.h), which is three files: shm.c,
 * the data path (rings, waiting, failure; the fl_peers table), and its set-up, shm_setup.c
 * (hellos, the plan, the verdict, watching peers: fl_shm_open) with shm_segment.c (the memfd
 * segment and how it travels to the ranks). What they share: the segment's layout, the
 * transport's state, and the set-up's messages. */
#ifndef FLEET_SHM_IMPL_H
#define FLEET_SHM_IMPL_H

#include "shm.h"

#include <poll.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Ring per ordered pair: 1 MiB measured best for 64 MiB allreduce between 2 ranks (256 KiB to
 * 4 MiB within ~10%; smaller rings make the writer wait for the reader more often). Many ranks
 * shrink it so that a segment stays within SEG_BUDGET (pages are only used once touched). */
#define RING_KIB_DEFAULT 1024
#define RING_KIB_MIN     64
#define RING_KIB_MAX     65536
#define SEG_BUDGET       ((size_t)256 << 20)
#define MAX_RANKS        512
#define ABORT_MAX        512
#define SEG_MAGIC        0x314d485354454c46ull /* "FLETSHM1" */
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

/* Where things lie in a segment of n ranks with rings of cap bytes. */
typedef struct {
    size_t ctl, rings, data, total;
} seg_layout;

static inline size_t shm_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static inline seg_layout shm_layout(int n, size_t cap) {
    seg_layout l;
    l.ctl = shm_round_up(sizeof(seg_hdr), 4096);
    l.rings = l.ctl + shm_round_up((size_t)n * sizeof(rank_ctl), 4096);
    l.data = l.rings + shm_round_up((size_t)n * (size_t)n * sizeof(ring_ctl), 4096);
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

/* shm.c: the transport's table (its sendrecv, peer names and free) */
extern const struct fl_peers_ops shm_peers_ops;
/* Frees s and everything it holds; says "closed" in the segment unless s->failed. */
void shm_peers_free(fl_peers *pp);

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

/* shm_segment.c: the segment, and how it travels from rank 0 to the others. Each returns 0
 * or a failure code with its message in msg (cap bytes), unless said otherwise. */

/* Maps fd (seg_bytes) into s and checks its size against s's layout: FL_EIO / FL_EPEER. */
int shm_map_segment(shm *s, int fd, size_t seg_bytes, char *msg, size_t cap);
/* Rank 0: the memfd, sized and initialised (pids from the hellos), in *fd_out. */
int shm_create_segment(shm *s, const hello *h, uint64_t cookie, int *fd_out, char *msg,
                       size_t cap);
/* Rank 0: a listening abstract unix socket named name (plan.sock), or -1 (msg says). */
int shm_listen(const char name[32], int backlog, char *msg, size_t cap);
/* Rank 0: hands the memfd to every rank that connects with its nonce (from its own pid), until
 * `expected` ranks are served or the deadline. Strangers are dropped. */
int shm_serve_fd(shm *s, int lfd, int memfd, const hello *h, uint8_t (*nonces)[16],
                 const bool *expect, int expected, double deadline, char *msg, size_t cap);
/* Rank r > 0: connects to rank 0's socket and proves itself. The socket, or -1 (msg says). */
int shm_join(const plan *pl, int rank, double deadline, char *msg, size_t cap);
/* Rank r > 0: receives the memfd on sock, maps it and checks it is rank 0's. */
int shm_attach(shm *s, const plan *pl, int sock, double deadline, char *msg, size_t cap);

#endif /* FLEET_SHM_IMPL_H */
