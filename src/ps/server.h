/* server.h - the inside of a parameter server: its tables split over shard threads, the
 * tasks that carry work to them, and what the receiving threads (one per worker connection,
 * server.c) share. Private to src/ps.
 *
 * Ownership: a dense table's local block j (global block s + j*S) belongs to shard thread
 * j % T; a sparse id to thread fl_ps_thread_of(id, T), which holds its own fl_ps_sparse. Only
 * that thread touches them once serving starts (table creation happens before any task refers
 * to them; a SAVE pauses every shard thread while it reads). Bookkeeping (versions, sync
 * merges, who pulled what) lives under ps_server.mu, and every task is queued under it too, so
 * the order of tasks in each shard's queue is the order in which the server decided them. */
#ifndef FLEET_PS_SERVER_H
#define FLEET_PS_SERVER_H

#include "ps_impl.h"
#include "ps_wire.h"
#include "table.h"

#include "fleet/safetensors.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

enum {
    TASK_DENSE_SET,    /* values of worker 0's declaration into the blocks */
    TASK_DENSE_GET,    /* blocks into a pull's reply */
    TASK_DENSE_ACC,    /* sync: accumulate a push; apply (scale) when it completes a step */
    TASK_DENSE_APPLY,  /* async/geo: the rule with this push's gradient */
    TASK_SPARSE_PULL,
    TASK_SPARSE_ACC,   /* sync; apply pending when it completes a step */
    TASK_SPARSE_PUSH,  /* async/geo */
    TASK_SPARSE_SHRINK, /* a pass of the life cycle: result[0] rows removed */
    TASK_SPARSE_STATS, /* result[0] rows, result[1] bytes */
    TASK_PAUSE,        /* SAVE: hold still until released */
};

/* Completion of one request's tasks. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             left;
    int             rc;          /* first failure of a task */
    char            err[256];
} ps_done;

typedef struct ps_task {
    struct ps_task *next;
    int      op, table;
    float   *dst;                /* DENSE_GET: this server's values; SPARSE_PULL: reply rows */
    const float *src;            /* DENSE_SET / ACC / APPLY: this server's values */
    const uint64_t *ids;         /* sparse: this thread's ids */
    const int64_t  *pos;         /* sparse: where each id sits in the request */
    const float    *grads;       /* SPARSE_ACC / PUSH: the request's gradients [n * dim] */
    const float    *shows, *clicks; /* SPARSE_ACC / PUSH: the request's counts [n], or NULL */
    float   *tmpc;               /* SPARSE_ACC / PUSH with counts: scratch of 2 * n */
    int64_t  result[2];          /* SHRINK, STATS */
    float   *tmp;                /* sparse: scratch of n * dim */
    int64_t  n;
    double   lr, scale;
    bool     apply;              /* ACC: this push completes the step */
    ps_done *done;
} ps_task;

typedef struct {
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    ps_task        *head, *tail;
    bool            quit;
    bool            paused, release; /* TASK_PAUSE */
    struct ps_server *srv;
    int             id;
} ps_shard;

/* What sync merging, async staleness and deferred pulls need of a table (under mu). */
typedef struct {
    int64_t  version;            /* updates applied (sync: steps merged; async: pushes) */
    int64_t  merge_step;         /* sync: the step being merged when merged > 0 */
    int      merged;             /* pushes of merge_step received */
    bool    *pushed;             /* [W] */
    int64_t *pushes_by;          /* [W] the table's version when made or loaded plus the
                                  * pushes each worker made since: a sync sparse pull waits
                                  * until the version reaches it */
    int64_t *last_pull;          /* [W] version each worker last pulled (async staleness) */
} ps_sync;

typedef struct {
    bool         declared, ready, loaded;
    int          declared_by;    /* worker, or -1 when loaded from a checkpoint */
    int64_t      numel, nlocal;  /* values in the table, on this server */
    int          nblocks;        /* local blocks */
    fl_ps_rule   rule;
    fl_ps_block *blocks;         /* [nblocks] */
    ps_sync      sy;
} ps_dense;

typedef struct {
    bool            declared, loaded;
    int             declared_by;
    int             dim;
    fl_ps_rule      rule;
    fl_ps_init_rule init;
    fl_ps_sparse_opts opts;
    fl_ps_sparse  **parts;       /* [T] */
    ps_sync         sy;
} ps_sparse_table;

/* A checkpoint chain: a full save and the deltas on top of it, oldest first. */
#define PS_CHAIN_MAX 256
typedef struct {
    int  n;
    char files[PS_CHAIN_MAX][96];
    int64_t step;
} ps_chain;

typedef struct ps_server {
    fl_ps              *ps;
    fl_ps_server_config cfg;
    int                 S, W, T, s;
    fl_msg_listener    *listener;
    fl_msg_conn       **conns;    /* [W] */
    char              (*names)[160]; /* [W] "worker 2 (127.0.0.1:41234)" */
    ps_shard           *shards;   /* [T] */
    int                 nshards_started;
    ps_dense            dense[FL_PS_MAX_TABLES];
    ps_sparse_table     sparse[FL_PS_MAX_TABLES];
    pthread_mutex_t     mu;
    pthread_cond_t      cv;       /* versions, readiness, failure, stops */
    bool                failed;
    int                 fail_code;
    char                fail_msg[1024];
    int                 stopped;
    int64_t             loaded_step; /* -1: nothing loaded */
    ps_chain            chain;
    int64_t             stale_sum, stale_n, stale_max;
} ps_server;

/* ---- server_shard.c ---- */
int  ps_shards_start(ps_server *s);
void ps_shards_stop(ps_server *s);
void ps_done_init(ps_done *d);
void ps_done_destroy(ps_done *d);
/* Queues t on shard `shard` (t->done->left counted by the caller). */
void ps_task_enqueue(ps_server *s, int shard, ps_task *t);
/* Waits until every task of d has run; d->rc. */
int  ps_done_wait(ps_done *d);
/* Pauses every shard thread (SAVE) and releases them. */
void ps_shards_pause(ps_server *s, ps_done *d, ps_task *tasks);
void ps_shards_release(ps_server *s);

/* ---- server_tables.c ---- */
int  ps_sync_init(ps_sync *y, int W, int64_t version);
void ps_sync_free(ps_sync *y);
int  ps_dense_create(ps_server *s, ps_dense *d, int64_t numel, const fl_ps_rule *r);
void ps_dense_free(ps_dense *d);
int  ps_sparse_table_create(ps_server *s, int table, ps_sparse_table *t, int dim,
                            const fl_ps_rule *r, const fl_ps_init_rule *init,
                            const fl_ps_sparse_opts *o);
void ps_sparse_table_free(ps_server *s, ps_sparse_table *t);
/* "sgd", "momentum(0.9, nesterov)" ... for messages */
void ps_rule_str(const fl_ps_rule *r, char *buf, size_t cap);
bool ps_rule_equal(const fl_ps_rule *a, const fl_ps_rule *b);
bool ps_opts_equal(const fl_ps_sparse_opts *a, const fl_ps_sparse_opts *b);

/* ---- a checkpoint (its layout: server_save.c) ---- */
#define PS_META_KEY 64  /* longest tensor or metadata name, NUL included */
#define PS_META_VAL 192 /* longest metadata value */

/* server_save.c: writes this server's shards (shards paused by the caller) as step, then the
 * pointer, then prunes old steps' files (cfg.keep); FL_EIO naming the file. */
int ps_save(ps_server *s, int64_t step, int mode);
/* server_prune.c: removes the shards of steps the workers' checkpoints no longer keep
 * (cfg.keep; 0: none), keeping `step`'s and the current chain's (server_prune.c has the
 * rule). */
void ps_prune(ps_server *s, int64_t step);
/* server_pointer.c: writes chain c as this server's pointer in cfg.checkpoint_dir
 * (atomically; FL_EIO naming the file). Reads dir's ps.server<me>.latest into *c: 0 with
 * *have false when there is none; the pointer must say "server me of *nservers" (*nservers
 * <= 0: any count, which it receives); FL_EFORMAT / FL_EIO naming the file and line. */
int ps_write_pointer(ps_server *s, const ps_chain *c);
int ps_read_pointer(const char *dir, int me, int *nservers, ps_chain *c, bool *have);
/* server_meta.c: the checkpoint files' metadata (also read by snapshot.c): an integer (-1 when
 * absent, FL_EFORMAT naming the file when not an integer), a rule, an initializer
 * (FL_EFORMAT). */
int ps_meta_i64(const fl_safetensors *st, const char *key, int64_t *out);
int ps_parse_rule(const fl_safetensors *st, const char *key, fl_ps_rule *r);
int ps_parse_init(const fl_safetensors *st, const char *key, fl_ps_init_rule *init);
/* A sparse table's life cycle as saved ("entry count probability decay threshold nonclk
 * click unseen"); absent: the defaults (0); FL_EFORMAT naming the file. */
int ps_parse_opts(const fl_safetensors *st, const char *key, fl_ps_sparse_opts *o);
/* The same as text: "type nesterov momentum wd beta1 beta2 eps g2sum", "type a b seed",
 * "entry count probability decay threshold nonclk_coeff click_coeff unseen". */
void ps_rule_fmt(const fl_ps_rule *r, char *buf, size_t cap);
void ps_init_fmt(const fl_ps_init_rule *init, char *buf, size_t cap);
void ps_opts_fmt(const fl_ps_sparse_opts *o, char *buf, size_t cap);
/* server_load.c: loads cfg.resume_step's shards (-1: the chain the pointer names) from
 * cfg.resume_dir ("" checkpoint_dir) before serving: 0 (nothing there and no step asked for:
 * fresh start, loaded_step -1) or FL_EFORMAT / FL_EIO naming the file. */
int ps_load(ps_server *s);

/* One worker connection's receiving thread and its scratch (server.c, the request handlers). */
typedef struct {
    ps_server   *s;
    int          w;
    fl_msg_conn *m;
    const char  *name;
    pthread_t    thread;
    bool         started;
    void        *buf;
    size_t       cap;
    ps_task     *tasks;     /* [T] */
    ps_done      done;
    float       *out;       /* reply values */
    size_t       out_cap;   /* floats */
    /* a sparse request split over the shard threads */
    uint64_t    *ids;       /* [n] grouped by thread */
    int64_t     *pos;       /* [n] where each sits in the request */
    int32_t     *th;        /* [n] thread of each id */
    float       *tmp;       /* [n * dim] */
    float       *tmpc;      /* [2 * n]: shows and clicks grouped by thread */
    int64_t      part_cap, tmp_cap, tmpc_cap;
    int64_t     *cnt, *off; /* [T] */
} ps_recv;

/* server_tables.c: the monotonic clock in seconds; a wait on s->cv (s->mu held) until deadline
 * (false once it passed); failing the server with msg (the first failure sticks; wakes every
 * wait). */
double ps_now_s(void);
bool   ps_wait_until(ps_server *s, double deadline);
void   ps_server_fail(ps_server *s, int code, const char *msg);

/* ---- server_requests.c ---- */
/* One request: 1 after STOP, 0 to go on, < 0: the server has failed with it. */
int  ps_handle(ps_recv *r, const void *buf, size_t n, bool *hello);

/* ---- server_dense.c, server_sparse.c: each request type's handler (its result as
 * ps_handle's) ---- */
int  ps_on_dense_init(ps_recv *r, const fl_ps_req *q);
int  ps_on_dense_pull(ps_recv *r, const fl_ps_req *q);
int  ps_on_dense_push(ps_recv *r, const fl_ps_req *q);
int  ps_on_sparse_init(ps_recv *r, const fl_ps_req *q);
int  ps_on_sparse_pull(ps_recv *r, const fl_ps_req *q);
int  ps_on_sparse_push(ps_recv *r, const fl_ps_req *q);
/* SHRINK and STATS */
int  ps_on_table_pass(ps_recv *r, const fl_ps_req *q);

/* ---- server_reply.c ---- */
int  ps_send_reply(ps_recv *r, const fl_ps_rep *rep);
/* Refuses the request: answers the worker with the message, fails the server with it, and
 * returns code. */
int  ps_refuse(ps_recv *r, int type, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The refusal of a request that found the server failed (s->mu held; dropped while sending). */
int  ps_failed_reply(ps_recv *r, int type);
/* A table request's table must exist (and, dense, be ready): 0, or the refusal. */
int  ps_need_table(ps_recv *r, const fl_ps_req *q, bool dense);
/* "worker 2 (...) declared" or "server 0's checkpoint (step 7) has": who declared a table. */
void ps_describe_owner(ps_server *s, int by, char *buf, size_t cap);
/* Grows *p of *cap entries of size bytes to hold want (at least 1024); FL_ENOMEM. */
int  ps_grow(void **p, int64_t *cap, int64_t want, size_t size);
/* Room for n reply values in r->out; FL_ENOMEM. */
int  ps_out_reserve(ps_recv *r, int64_t n);

/* ---- server_sync.c (s->mu held for each) ---- */
/* sync: waits until y->version >= v; 0, or the refusal naming what the merge still lacks. */
int  ps_wait_version(ps_recv *r, const fl_ps_req *q, ps_sync *y, int64_t v, const char *kind);
/* sync: counts a push toward its step's merge: 1 when it completes the step, 0 when not, or
 * the refusal (a push of another step, or twice). */
int  ps_sync_push(ps_recv *r, const fl_ps_req *q, ps_sync *y, const char *kind);
/* async: counts a push's staleness in the server's statistics. */
void ps_count_staleness(ps_server *s, int64_t st);
/* sync: whether some table's merge waits for worker w (what it waits for into what). */
bool ps_waiting_on(ps_server *s, int w, char *what, size_t cap);

#endif /* FLEET_PS_SERVER_H */
