/* ctr_impl.h - what the CTR trainer's files share (docs/ctr.md "Training"): the trainer's state
 * around the image trainer's (fleet, distributed optimizer, parameter-server client, schedule,
 * metrics file), the CTR data sources, and the sparse tables in either architecture.
 * Private to src/train/. */
#ifndef FLEET_CTR_IMPL_H
#define FLEET_CTR_IMPL_H

#include "train/train_impl.h"

#include "fleet/ctr.h"
#include "fleet/infer.h"
#include "fleet/safetensors.h"
#include "fleet/metrics.h"
#include "fleet/ps.h"
#include "fleet/sparse.h"
#include "ps/table.h"

#include <stdbool.h>
#include <stdint.h>

/* Where the sparse tables live and how their rows are updated. */
typedef enum {
    CTR_COLLECTIVE = 0, /* a replica per worker; row gradients all-gathered every step */
    CTR_PS_SYNC = 1,    /* on the servers, merged once per step from every worker */
    CTR_PS_ASYNC = 2,   /* on the servers, each push applied on arrival */
    CTR_PS_GEO = 3,     /* a local copy trained alone; differences exchanged every k steps */
} ctr_mode;
const char *ctr_mode_name(ctr_mode m);

/* A CTR data set split of this worker: ctr_synth's samples (steps batches an epoch, the same
 * samples every epoch) or a Criteo reader (until it ends). */
typedef struct {
    fl_ctr_synth     *synth;
    fl_criteo_reader *rd;
    fl_ctr_batch      buf;   /* ctr_synth's batch */
    int64_t           B;     /* samples per batch of this worker */
    int64_t           steps; /* ctr_synth: batches an epoch; criteo: -1 (until the end) */
    int64_t           next;  /* batches taken this epoch */
    int               rank, world;
} ctr_source;

/* Opens split 0 (training) or 1 (validation) as cfg says, for this worker; *present false
 * when cfg has no such split (criteo without val_list, ctr_synth with val_size 0). */
int  ctr_source_open(ctr_source *s, const fl_train_config *cfg, int split, int rank, int world,
                     int64_t B, bool *present);
void ctr_source_close(ctr_source *s);
/* Back to the epoch's first batch, then `skip` batches further (a resume). */
int  ctr_source_seek(ctr_source *s, int64_t skip);
/* 1 with the next batch (borrowed until the next call), 0 at the end of the epoch, or the
 * reader's error ("file:line: what"). */
int  ctr_source_next(ctr_source *s, const fl_ctr_batch **b);

/* A set of ids (geo: the rows touched since the last hand-off). */
typedef struct {
    uint64_t *keys; /* open addressing; 0 marks a free slot, id 0 kept aside */
    int64_t   cap, n;
    bool      has_zero;
} ctr_idset;

typedef struct {
    trainer        base;     /* fleet, rank, world, net (the model's), opt, dopt, ps, metrics,
                              * sched, total_steps, start_time */
    fl_ctr_model  *model;
    ctr_source     train, val;
    bool           has_val;
    ctr_mode       mode;
    fl_ps_rule     rule;     /* the sparse tables' */
    fl_ps_init_rule init[FL_CTR_NTABLES];
    double         sparse_lr;
    fl_ps_sparse_opts opts;  /* both tables' life cycle (sparse_table.*) */
    bool           lifecycle; /* fl_train_ctr_lifecycle: shows and clicks counted, passes run */
    float         *shows, *clicks; /* the prepared batch's counts per distinct id */
    int64_t        counts_cap;
    fl_ps_sparse  *rep[FL_CTR_NTABLES];  /* collective: replicas; geo: the local copies */
    int64_t       *slots[FL_CTR_NTABLES]; /* geo: the prepared batch's rows' slots in rep */
    int64_t        slots_cap[FL_CTR_NTABLES];
    struct ctr_geo *geo;     /* geo: snapshots, touched ids, the communicator (ctr_geo.c) */
    int64_t        geo_k;
    bool           geo_background; /* strategy.a_sync_configs.geo_background */
    char          *xbuf;     /* collective: this worker's ids and gradients, then everyone's */
    size_t         xcap;
    double         best_auc; /* ctr_synth: the teacher's AUC on the validation samples; NAN */
} ctr_trainer;

/* The PS table number of model table t (dense table 0 is the network's block). */
#define CTR_PS_TABLE(t) ((t) + 1)

/* ctr_setup.c: the model cfg describes (its dense part initialised from train.seed); the
 * sparse tables' rule and initializers (embedding as sparse_optimizer says, wide zeros). */
int  ctr_build_model(const fl_train_config *cfg, fl_ctr_model **out);
void ctr_sparse_rules(const fl_train_config *cfg, fl_ps_rule *rule,
                      fl_ps_init_rule init[FL_CTR_NTABLES]);
/* ctr_setup.c: both tables' life cycle from the sparse_table keys. */
void ctr_sparse_opts(const fl_train_config *cfg, fl_ps_sparse_opts *o);
/* ctr_infer.c: fleet-eval of a CTR checkpoint st (its configuration in cfg) over split. */
int  ctr_infer_run(const fl_train_config *cfg, const fl_safetensors *st, int split,
                   fl_infer_result *res);
/* ctr_setup.c: everything from cfg (joins the job first); teardown frees what was built. */
int  ctr_setup(ctr_trainer *c, const fl_train_config *cfg);
void ctr_teardown(ctr_trainer *c);

/* ctr_sparse.c: the tables in c->mode. Declares them (PS: on the servers; else local). */
int  ctr_tables_init(ctr_trainer *c);
void ctr_tables_free(ctr_trainer *c);
/* Fills the prepared batch's rows of both tables. */
int  ctr_tables_fill(ctr_trainer *c);
/* Applies the prepared batch's row gradients (after the model's backward) as update `step`;
 * with the life cycle also its shows and clicks (labels: the batch's, B). */
int  ctr_tables_update(ctr_trainer *c, int64_t step, const int32_t *labels);
/* Geo: the last exchange, complete and on this thread, after the one in flight; then every
 * worker's (a barrier), and the evaluation reads the servers' tables (every worker calls it at
 * the end). Else a no-op. */
int  ctr_tables_finish(ctr_trainer *c, int64_t step);
/* Rows and bytes of the tables: those this worker holds (replicas, geo copies), or in PS sync
 * and async the servers' (worker 0 asks them; the other workers get -1). */
int  ctr_tables_size(ctr_trainer *c, int64_t *rows, int64_t *bytes);
/* The end of a pass over the data (an epoch): one pass of both tables' life cycle (decay,
 * removals; fl_ps_sparse_pass) where the rows live: every replica, or the servers (worker 0
 * asks; every worker waits for it, so what follows reads the same tables). removed[t]: rows
 * table t lost. Collective. */
int  ctr_tables_pass(ctr_trainer *c, int64_t removed[FL_CTR_NTABLES]);

/* ctr_checkpoint.c. Save the state at pos (collective: rank 0's file with the replicas;
 * PS: the servers' shards through fl_ps_save, and rank 0's file of the worker state), and
 * resume from checkpoint.resume (the same number of workers). Collective. */
int  ctr_ckpt_save(ctr_trainer *c, const fl_train_config *cfg, const train_pos *pos);
int  ctr_ckpt_restore(ctr_trainer *c, const fl_train_config *cfg, train_pos *pos);
/* The step checkpoint.resume names (its fleet.step), or -1 without one: a parameter-server
 * worker declares it before the distributed optimizer joins the tables. */
int64_t ctr_ckpt_resume_step(const fl_train_config *cfg);

/* ctr_trainer.c: evaluation over the validation split (every worker; metrics summed). */
int  ctr_evaluate(ctr_trainer *c, fl_ctr_metrics *met);
/* fleet-train's entry for CTR data (fl_train_run dispatches here). */
int  fl_train_run_ctr(const fl_train_config *cfg, fl_train_result *res);

/* ctr_geo.c: geo mode's exchanges (c->rep[] are the local copies). init: the snapshots and,
 * with background, the communicator thread (worker r's first exchange after k + r*k/W steps);
 * free joins the thread (an exchange in flight ends first) and frees everything (NULL geo: a
 * no-op). poll: at a safe point of the training thread (before the copies are read), folds an
 * exchange the thread finished, or returns its error (its message names the table, server
 * and endpoint). update: the prepared batch's row gradients into the copies (slots[t]: the
 * hints fl_ps_sparse_pull_rows_slots gave, or NULL), and every k steps the hand-off, after
 * waiting for and folding the exchange before. finish: waits for the exchange in flight, runs
 * the last one on this thread, waits for every worker's (collective: a barrier); from then on
 * ctr_geo_final is true and reads go to the servers. */
int  ctr_geo_init(ctr_trainer *c, bool background);
void ctr_geo_free(ctr_trainer *c);
int  ctr_geo_poll(ctr_trainer *c);
int  ctr_geo_update(ctr_trainer *c, int64_t step, int64_t *const slots[FL_CTR_NTABLES]);
int  ctr_geo_finish(ctr_trainer *c, int64_t step);
bool ctr_geo_final(const ctr_trainer *c);

/* ctr_sparse.c: the id set. */
int  ctr_idset_add(ctr_idset *s, const uint64_t *ids, int64_t n);
void ctr_idset_clear(ctr_idset *s);
void ctr_idset_free(ctr_idset *s);
/* The ids, ascending, into a malloc'd array (*n of them). FL_ENOMEM. */
int  ctr_idset_sorted(const ctr_idset *s, uint64_t **ids, int64_t *n);

#endif /* FLEET_CTR_IMPL_H */
