/* ps.h - parameter-server mode (Paddle Fleet's second architecture; DESIGN.md "Parameter-server
 * mode"): servers own the parameters and run the optimizer, workers pull parameters and push
 * gradients.
 *
 * The API mirrors Paddle's fleet.init(is_collective=False):
 *
 *     fl_ps *ps;
 *     fl_ps_init(&ps);                        // roles from TRAINING_ROLE, PADDLE_* (fleetrun)
 *     if (fl_ps_is_server(ps)) {
 *         fl_ps_init_server(ps, &server_cfg);  // listen, load this server's checkpoint shards
 *         fl_ps_run_server(ps);                // serve until every worker has stopped
 *     } else {
 *         fl_ps_init_worker(ps);               // connect to every server
 *         ... fl_ps_dense_init / pull / push, fl_ps_sparse_pull / push ...
 *         fl_ps_stop_worker(ps);
 *     }
 *     fl_ps_free(ps);
 *
 * Tables. A dense table is a flat block of `numel` f32 values split into blocks of
 * FL_PS_DENSE_BLOCK values; block b lives on server b % S. A sparse table maps 64-bit ids to
 * rows of `dim` values, an id living on server fl_ps_shard_of(id, S). Each table has its
 * optimizer rule (fl_ps_rule), applied on the server.
 *
 * Modes (strategy.a_sync, a_sync_configs.k_steps, as Paddle's DistributedStrategy):
 *   sync  (a_sync false): the server sums a step's pushes from every worker, divides by the
 *         number of workers and applies the rule once; a pull of version v waits until v
 *         steps were applied. The same computation as collective dense training.
 *   async (a_sync true, k_steps 0): each push is applied when it arrives (the rule on that
 *         worker's gradient); pulls return what is there now; the server counts, per push, the
 *         updates it missed (staleness: applied versions since the version the worker pulled).
 *   geo   (k_steps > 0): workers train their own copies; every k steps a worker pushes the
 *         difference since its last push divided by the number of workers (GEO-SGD, Paddle's
 *         GeoCommunicator), which the server adds (rule FL_PS_RULE_SUM), and pulls the sum.
 * The worker-side orchestration of the modes (communicator thread, geo snapshots) lives in
 * fl_ps_communicator (ps_comm.h) and in the "ps" distributed-optimizer strategy. */
#ifndef FLEET_PS_H
#define FLEET_PS_H

#include "fleet/comm.h"
#include "fleet/optim.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FL_PS_MAX_SERVERS 256
#define FL_PS_MAX_TABLES  64
#define FL_PS_DENSE_BLOCK 65536 /* values per dense block: the unit spread over the servers */

typedef enum { FL_PS_SYNC = 0, FL_PS_ASYNC = 1, FL_PS_GEO = 2 } fl_ps_mode;
const char *fl_ps_mode_name(fl_ps_mode m);

/* The optimizer a table runs on its server. Dense tables: SGD, Momentum (+Nesterov), Adam,
 * and SUM (geo: add what is pushed). Sparse tables, per row: SGD, Adagrad (Paddle's
 * SparseAdaGradSGDRule: one g2sum per row), Adam (per-row moments and beta powers), SUM.
 * SGD and Momentum compute exactly as fl_optim_step on the ref backend (f32, L2 decay
 * g + wd * w first), so that sync PS and collective training agree. */
typedef enum {
    FL_PS_RULE_SGD = 0,
    FL_PS_RULE_MOMENTUM = 1,
    FL_PS_RULE_ADAM = 2,
    FL_PS_RULE_ADAGRAD = 3,
    FL_PS_RULE_SUM = 4,
} fl_ps_rule_type;

typedef struct {
    fl_ps_rule_type type;
    double momentum;        /* Momentum: mu in [0, 1) */
    bool   nesterov;        /* Momentum */
    double weight_decay;    /* L2 lambda >= 0 (SGD, Momentum, Adam: g + wd * w) */
    double beta1, beta2;    /* Adam (defaults 0.9, 0.999) */
    double epsilon;         /* Adam (1e-8), Adagrad (1e-6: Paddle's) */
    double initial_g2sum;   /* Adagrad (Paddle's initial_g2sum, default 3) */
} fl_ps_rule;

/* Defaults for type (Paddle's). */
void fl_ps_rule_defaults(fl_ps_rule *r, fl_ps_rule_type type);
/* FL_ECONFIG naming the field when out of range, or when the type cannot serve the table kind
 * (Adagrad for dense, Momentum for sparse). */
int  fl_ps_rule_check(const fl_ps_rule *r, bool sparse);
const char *fl_ps_rule_name(fl_ps_rule_type t);

/* Initial values of a sparse row created on first pull: drawn from (seed, table, id) alone, so a
 * row is the same whichever server or thread creates it, and whenever. */
typedef enum { FL_PS_INIT_ZERO = 0, FL_PS_INIT_UNIFORM = 1, FL_PS_INIT_NORMAL = 2 } fl_ps_init_type;
typedef struct {
    fl_ps_init_type type;
    double a, b;     /* uniform in [a, b); normal mean a, standard deviation b */
    uint64_t seed;
} fl_ps_init_rule;

/* A sparse table's life cycle, as Paddle's CtrCommonAccessor
 * (paddle/fluid/distributed/ps/table/ctr_accessor.cc) and entry attributes
 * (python/paddle/distributed/entry_attr.py). Every row counts its shows and clicks (pushed with
 * fl_ps_sparse_push_counts; fl_ps_sparse_push counts one show per id and push) and the passes
 * since its last push (a pass ends at each fl_ps_sparse_shrink).
 *   entry: when an id without a row becomes one. NONE: at its first pull or push. COUNT: once
 *     its pushed shows reach entry_count (until then a pull reads zeros, a push adds only its
 *     shows to a small side map of candidates). PROBABILITY: at a push, with probability
 *     entry_probability, drawn from (seed, table, id, pass) so every server and restart draws
 *     the same; an id turned down may get in at a later pass (Paddle draws at each push).
 *     With COUNT or PROBABILITY a pull never creates a row.
 *   shrink (fl_ps_sparse_shrink, one pass): show and click *= show_click_decay, then a row goes
 *     when its score (show - click) * nonclk_coeff + click * click_coeff < delete_threshold,
 *     or when it saw no push in the last delete_after_unseen passes (0: never); its memory
 *     is reused by the next rows created. Candidates of COUNT unseen that long go too.
 * fl_ps_sparse_opts_defaults gives today's behaviour: entry NONE, no decay (1), threshold 0
 * (scores are never negative), delete_after_unseen 0, Paddle's coefficients (0.1, 1). */
typedef enum {
    FL_PS_ENTRY_NONE = 0,
    FL_PS_ENTRY_COUNT = 1,
    FL_PS_ENTRY_PROBABILITY = 2,
} fl_ps_entry_type;

typedef struct {
    fl_ps_entry_type entry;
    double entry_count;          /* COUNT: shows before a row is created, >= 1 */
    double entry_probability;    /* PROBABILITY: in [0, 1] */
    double show_click_decay;     /* per pass, in (0, 1] (Paddle's show_click_decay_rate) */
    double delete_threshold;     /* >= 0: rows scoring below it go at a pass */
    double nonclk_coeff;         /* >= 0, Paddle's default 0.1 */
    double click_coeff;          /* >= 0, Paddle's default 1 */
    int    delete_after_unseen;  /* passes without a push before a row goes, 0: never
                                  * (at most 65535) */
} fl_ps_sparse_opts;

void fl_ps_sparse_opts_defaults(fl_ps_sparse_opts *o);
/* FL_ECONFIG naming the field when out of range. */
int  fl_ps_sparse_opts_check(const fl_ps_sparse_opts *o);
/* "none", "count", "probability"; NULL for another value. */
const char *fl_ps_entry_name(fl_ps_entry_type e);

/* The server of an id among nservers (a 64-bit mix of the id, so consecutive ids spread). */
int fl_ps_shard_of(uint64_t id, int nservers);

typedef struct fl_ps fl_ps;

/* Paddle's role maker from the environment:
 *   TRAINING_ROLE=PSERVER|TRAINER, PADDLE_PSERVERS_IP_PORT_LIST ("ip:port,..."),
 *   PADDLE_TRAINER_ENDPOINTS, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID (workers),
 *   POD_IP and PADDLE_PORT (a server finds its index as the entry POD_IP:PADDLE_PORT of the
 *   server list), FLEET_JOB_TOKEN, FLEET_COMM_TIMEOUT, FLEET_LISTEN_FD, FLEET_COMM_ENCRYPT,
 *   FLEET_RESTART_COUNT. Refuses inconsistent values naming the variable (a server endpoint
 *   not in the list, an empty list, a trainer id out of range). */
int  fl_ps_init(fl_ps **out);
void fl_ps_free(fl_ps *ps);

bool        fl_ps_is_server(const fl_ps *ps);
bool        fl_ps_is_worker(const fl_ps *ps);
int         fl_ps_server_num(const fl_ps *ps);
int         fl_ps_server_index(const fl_ps *ps);  /* -1 on a worker */
const char *fl_ps_server_endpoint(const fl_ps *ps, int i); /* NULL outside [0, server_num) */
int         fl_ps_worker_num(const fl_ps *ps);
int         fl_ps_worker_index(const fl_ps *ps);  /* -1 on a server */

/* --- server --- */
typedef struct {
    int        threads;          /* shard threads (ps.server_threads; default 4) */
    fl_ps_mode mode;             /* what the workers will run (checked against their hellos) */
    char       checkpoint_dir[1024]; /* "" none: where SAVE writes and where a restart loads */
    bool       resume;           /* load this server's shards (below) before serving */
    int64_t    resume_step;      /* with resume: the step to load (the one the workers resume
                                  * from); -1: the newest that ps.server<s>.latest names */
    char       resume_dir[1024]; /* with resume: where the shards are; "": checkpoint_dir */
    int64_t    keep;             /* after each save, keep the shards of the newest `keep` steps
                                  * the workers' checkpoints keep (checkpoint.keep; 0: all) */
} fl_ps_server_config;

/* Listens on this server's endpoint (or FLEET_LISTEN_FD). With c->resume, loads its shards
 * first: resume_step -1 loads the chain ps.server<s>.latest names, none being a fresh start;
 * resume_step N loads step N (that chain when the pointer is at N, else the full save
 * ps.server<s>.N.safetensors) and fails with FL_EIO naming the file when it is not there.
 * A damaged file, or one of another server or server count, fails naming it. */
int fl_ps_init_server(fl_ps *ps, const fl_ps_server_config *c);
/* Accepts every worker, then serves until each has stopped (0). A worker that dies or breaks
 * the protocol is named (worker index and endpoint) and the server fails (FL_EPEER) in sync
 * mode; in async and geo modes too (restarts are fleetrun's). */
int fl_ps_run_server(fl_ps *ps);

/* --- worker ---
 * The calls below may come from several threads on one handle (async: a communicator thread
 * and the training thread): each runs whole, one at a time. */
/* Connects to every server (fl_msg_connect) and says which mode it runs. */
int fl_ps_init_worker(fl_ps *ps, fl_ps_mode mode);
/* Tells every server this worker is done and closes the connections. */
int fl_ps_stop_worker(fl_ps *ps);

/* The step this worker resumed from (its own checkpoint), sent with each fl_ps_dense_init:
 * a server that loaded another step (or none) refuses it naming both. -1 (the default): a
 * fresh start, accepted whatever the server loaded (the reply's step says what that was). */
void fl_ps_set_resume_step(fl_ps *ps, int64_t step);

/* Declares dense table `table` of numel values with rule r. Every worker calls it with the same
 * shape and rule (the servers refuse a mismatch naming both workers). Worker 0 gives the
 * initial values (values non-NULL: it sends them; others pass NULL); a server that resumed from
 * a checkpoint keeps its own and answers with the saved step. *step_out (may be NULL) receives
 * the table's version (updates applied) after the declaration. */
int fl_ps_dense_init(fl_ps *ps, int table, int64_t numel, const fl_ps_rule *r,
                     const float *values, int64_t *step_out);
/* Fills values[numel] with the table. version: sync waits until that many updates were applied
 * (at most FLEET_COMM_TIMEOUT; a worker that never pushes is named); < 0: whatever is there. */
int fl_ps_dense_pull(fl_ps *ps, int table, int64_t version, float *values);
/* Pushes grads[numel] (already scaled as the worker wants them) for update `step` with
 * learning rate lr. Sync: counted toward step's merge; async: applied on arrival; geo: added. */
int fl_ps_dense_push(fl_ps *ps, int table, int64_t step, double lr, const float *grads);

/* Declares sparse table `table` of rows of dim values with rule r and initializer init. */
int fl_ps_sparse_init(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                      const fl_ps_init_rule *init);
/* fl_ps_sparse_init with the table's life cycle (o NULL: the defaults, as fl_ps_sparse_init).
 * Every worker declares the same options (the servers refuse a mismatch naming both). */
int fl_ps_sparse_init_opts(fl_ps *ps, int table, int dim, const fl_ps_rule *r,
                           const fl_ps_init_rule *init, const fl_ps_sparse_opts *o);
/* Rows of ids[0..n) into rows[n * dim] (created on first pull, under entry NONE). ids need not be unique; the
 * worker sends each distinct id once per server. */
int fl_ps_sparse_pull(fl_ps *ps, int table, const uint64_t *ids, int64_t n, float *rows);
/* Gradients grads[n * dim] of rows ids[0..n) (duplicates are summed before sending). */
int fl_ps_sparse_push(fl_ps *ps, int table, int64_t step, double lr, const uint64_t *ids,
                      int64_t n, const float *grads);
/* fl_ps_sparse_push that also counts, per occurrence i, shows[i] shows and clicks[i] clicks
 * (summed per id like the gradients; shows NULL: one a occurrence; clicks NULL: none). Both
 * finite and >= 0 (FL_EINVAL naming the first that is not). A CTR model passes its labels as
 * clicks. */
int fl_ps_sparse_push_counts(fl_ps *ps, int table, int64_t step, double lr,
                             const uint64_t *ids, int64_t n, const float *grads,
                             const float *shows, const float *clicks);
/* One pass of the table's life cycle on every server (fl_ps_sparse_opts: decay, removals).
 * Worker 0 calls it, e.g. at each epoch's end; in sync mode after its push of the step and
 * before the next, as a save. *removed (may be NULL): rows removed over all servers. */
int fl_ps_sparse_shrink(fl_ps *ps, int table, int64_t *removed);
/* The table's rows and the bytes its servers hold for it (rows, state, counters, index,
 * candidates), summed over the servers; either pointer may be NULL. */
int fl_ps_sparse_stats(fl_ps *ps, int table, int64_t *rows, int64_t *bytes);

/* Every server writes its shards of every table into checkpoint_dir (atomically) labelled with
 * step; mode FL_PS_SAVE_ALL or FL_PS_SAVE_DELTA (sparse rows changed since the last save, on
 * top of the last full save). Worker 0 calls it; returns when all servers have written. */
enum { FL_PS_SAVE_ALL = 0, FL_PS_SAVE_DELTA = 1 };
int fl_ps_save(fl_ps *ps, int64_t step, int mode);

/* --- a job's saved tables read back whole (fleet-ckpt merge-ps; docs/checkpoint.md) --- */
typedef struct {
    bool         present;
    int64_t      numel;
    fl_ps_rule   rule;
    int64_t      version_min, version_max; /* updates applied, over the servers (async: may differ) */
    float       *values;     /* (numel), table order: block b from server b % S */
} fl_ps_dense_snapshot;
typedef struct {
    bool            present;
    int             dim;
    fl_ps_rule      rule;
    fl_ps_init_rule init;
    int64_t         rows;
    int64_t        *ids;     /* (rows) ascending */
    float          *values;  /* (rows, dim): a delta's row replaces its base's */
} fl_ps_sparse_snapshot;
typedef struct {
    int64_t               step;
    int                   servers;
    fl_ps_dense_snapshot  dense[FL_PS_MAX_TABLES];
    fl_ps_sparse_snapshot sparse[FL_PS_MAX_TABLES];
} fl_ps_snapshot;

/* Reads every server's shards of `step` from dir (a server's chain when its ps.server<s>.latest
 * is at that step, else its full save ps.server<s>.<step>.safetensors) into *out, each table
 * whole. step -1: the step the pointers name (every server's must agree). The server count is
 * server 0's. Fails, freeing what it read, with a message naming the file: FL_EIO a server's
 * shards of the step missing; FL_EFORMAT a damaged file, a step or server count other than
 * the others', a table declared on some servers only or with another numel, dim or rule, a
 * dense block missing or of the wrong size, a sparse id on a server not its own. */
int  fl_ps_snapshot_load(const char *dir, int64_t step, fl_ps_snapshot *out);
/* Frees what the snapshot holds; a zeroed snapshot is a no-op. */
void fl_ps_snapshot_clear(fl_ps_snapshot *s);

/* Traffic and staleness seen by this worker. */
typedef struct {
    uint64_t bytes_sent, bytes_received;
    int64_t  pulls, pushes;
    double   mean_staleness; /* async: mean updates missed per push, as the servers reported */
    int64_t  max_staleness;
} fl_ps_stats;
void fl_ps_get_stats(const fl_ps *ps, fl_ps_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* FLEET_PS_H */
