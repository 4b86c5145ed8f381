/* table.h - the parameter server's tables and the optimizer rules it runs on them: dense
 * blocks (a slice of a flat parameter block) and sparse tables (64-bit id -> row of dim f32
 * values plus the rule's state), with save and load of a server's shards.
 *
 * Not thread-safe: each shard thread of a server owns its blocks and its part of every sparse
 * table (ids are split over the threads by fl_ps_shard_of on the server's side too), so no
 * table takes a lock. Private to src/ps. */
#ifndef FLEET_PS_TABLE_H
#define FLEET_PS_TABLE_H

#include "fleet/ps.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- rules ---- */
/* f32 values of state per parameter value the rule keeps (SGD 0, Momentum 1, Adam 2,
 * Adagrad 0, SUM 0) and per row or block (Adam 2: beta1^t and beta2^t; Adagrad 1: g2sum). */
int fl_ps_rule_state_per_value(const fl_ps_rule *r);
int fl_ps_rule_state_per_row(const fl_ps_rule *r);

/* One update of n values w[] (a dense block, or one sparse row: n = dim) with gradient g[]
 * and learning rate lr; state[] holds n * per_value + per_row floats laid out as
 * [per-value state (value-major: m[n], v[n]) | per-row state] (NULL when it holds none).
 * SGD and Momentum as fl_optim_step on the ref backend, bit for bit; Adam:
 * m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m /
 * (sqrt(v) + eps * sqrt(1 - b2^t)) (Paddle's adam kernel, phi's AdamFunctor; rule.c says where
 * Paddle's PS rule differs); Adagrad as Paddle's SparseAdaGradSGDRule (g2sum per row:
 * w -= lr * g * sqrt(g2sum0 / (g2sum0 + g2sum)), then g2sum += mean(g^2)); SUM: w += g (lr
 * ignored). L2 decay (SGD, Momentum, Adam) adds wd * w to g first. */
void fl_ps_rule_apply(const fl_ps_rule *r, double lr, float *w, const float *g, float *state,
                      int64_t n);
/* Sets the state of a fresh block or row (zeros; Adam's beta powers 1). */
void fl_ps_rule_state_init(const fl_ps_rule *r, float *state, int64_t n);

/* ---- dense ---- */
/* One dense block on its server: values, rule state, and the sum of the pushes of the step
 * being merged (sync). */
typedef struct {
    int64_t numel;
    float  *value;   /* [numel] */
    float  *state;   /* [numel * per_value + per_row] */
    float  *accum;   /* [numel]: sum of this step's pushes (sync) */
    int     pushes;  /* pushes summed into accum */
} fl_ps_block;

int  fl_ps_block_init(fl_ps_block *b, int64_t numel, const fl_ps_rule *r);
void fl_ps_block_clear(fl_ps_block *b);
/* accum += g; pushes++. */
void fl_ps_block_accumulate(fl_ps_block *b, const float *g);
/* Applies the rule with gradient accum * scale (e.g. 1 / workers), then zeroes accum. */
void fl_ps_block_apply_accum(fl_ps_block *b, const fl_ps_rule *r, double lr, double scale);

/* ---- sparse ---- */
typedef struct fl_ps_sparse fl_ps_sparse;

/* A row's counters (fl_ps_sparse_opts): shows and clicks pushed, decayed at each pass, and
 * the passes since its last push. */
typedef struct {
    float show, click;
    int   unseen;
} fl_ps_row_stat;

/* An empty table of rows of dim values (1 .. 4096) with rule r (its state lives beside each
 * row), initializer init (`table` enters its draw) and the default life cycle
 * (fl_ps_sparse_opts_defaults: every row kept). FL_ENOMEM; FL_EINVAL (dim, initializer);
 * FL_ECONFIG (a rule fl_ps_rule_check refuses for a sparse table). A row is never moved; a
 * row removed by a pass leaves its slot to the next row created. */
int  fl_ps_sparse_create(int table, int dim, const fl_ps_rule *r, const fl_ps_init_rule *init,
                         fl_ps_sparse **out);
/* Sets the life cycle (entry rule, shrink) of a table that holds no row and no candidate
 * yet: FL_ECONFIG (fl_ps_sparse_opts_check), FL_ESTATE (rows there). */
int  fl_ps_sparse_set_opts(fl_ps_sparse *t, const fl_ps_sparse_opts *o);
void fl_ps_sparse_free(fl_ps_sparse *t);
int     fl_ps_sparse_dim(const fl_ps_sparse *t);
int64_t fl_ps_sparse_rows(const fl_ps_sparse *t);
/* Ids counted toward entry COUNT that have no row yet. */
int64_t fl_ps_sparse_candidates(const fl_ps_sparse *t);
/* Passes (fl_ps_sparse_pass) run; fl_ps_sparse_set_passes when loading. */
int64_t fl_ps_sparse_passes(const fl_ps_sparse *t);
void    fl_ps_sparse_set_passes(fl_ps_sparse *t, int64_t passes);
/* Bytes held: rows (values, state, counters, ids), index, candidates, pending sums. */
size_t  fl_ps_sparse_bytes(const fl_ps_sparse *t);

/* Copies the rows of ids[0..n) into out[n * dim]. Under entry NONE a missing row is created
 * with the initializer (the same values whatever order or thread: a draw of (seed, table,
 * id)) and the rule's fresh state; under COUNT and PROBABILITY it reads as zeros and is not
 * created. FL_ENOMEM (the rows before the failing one were served). Named _rows because ps.h's
 * worker call owns fl_ps_sparse_pull. */
int fl_ps_sparse_pull_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, float *out);
/* fl_ps_sparse_pull_rows, and slots[i] gets the slot of row ids[i] (-1: no row; all n set,
 * -1 from the failing id on, on FL_ENOMEM): a hint for fl_ps_sparse_push_rows_slots, which
 * then finds the rows without their index (a step's push of the rows it pulled). */
int fl_ps_sparse_pull_rows_slots(fl_ps_sparse *t, const uint64_t *ids, int64_t n, float *out,
                                 int64_t *slots);
/* Applies the rule to each row ids[i] with gradient g[i * dim] and counts shows[i] shows
 * and clicks[i] clicks (shows NULL: one each; clicks NULL: none), its unseen passes back to 0;
 * a repeated id is updated once per occurrence, in order. A missing row is created when the
 * entry rule admits it (COUNT: its shows, with this push's, reach the count; PROBABILITY: the
 * draw of (seed, table, id, pass)); an occurrence it does not admit is dropped, its shows
 * counted toward COUNT. FL_ENOMEM. */
int fl_ps_sparse_push_rows_counts(fl_ps_sparse *t, const uint64_t *ids, int64_t n,
                                  const float *g, const float *shows, const float *clicks,
                                  double lr);
/* fl_ps_sparse_push_rows_counts with slots[i] (NULL: none) a hint for row ids[i], as
 * fl_ps_sparse_pull_rows_slots gives: a slot that still holds that id's row is used without a
 * lookup, any other (-1, out of range, a row removed since, its slot reused) is looked up. The
 * result is push_rows_counts' whatever the hints. FL_ENOMEM. */
int fl_ps_sparse_push_rows_slots(fl_ps_sparse *t, const uint64_t *ids, const int64_t *slots,
                                 int64_t n, const float *g, const float *shows,
                                 const float *clicks, double lr);
/* fl_ps_sparse_push_rows_counts(t, ids, n, g, NULL, NULL, lr). */
int fl_ps_sparse_push_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *g,
                           double lr);
/* Adds d[i * dim ..] to the values of row ids[i] (created first when missing), leaving the
 * rule's state as it is: a geo worker folds the others' progress into its own copy. FL_ENOMEM. */
int fl_ps_sparse_add_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *d);
/* Sync mode: adds g, shows and clicks (NULL as above) into the pending sums of each id for
 * the step being merged... */
int fl_ps_sparse_accumulate_counts(fl_ps_sparse *t, const uint64_t *ids, int64_t n,
                                   const float *g, const float *shows, const float *clicks);
int fl_ps_sparse_accumulate(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *g);
/* ...and applies every pending row's rule with gradient (float)(sum * scale), once, in id
 * order, adding its summed shows and clicks; then forgets the pending sums. Missing rows pass
 * the entry rule (with their summed shows) and are created before any rule runs, so FL_ENOMEM
 * leaves every row's values and the pending sums as they were (candidates' counts may have
 * moved). */
int fl_ps_sparse_apply_pending(fl_ps_sparse *t, double lr, double scale);

/* One pass of the life cycle: every row's show and click *= show_click_decay; a row whose
 * score (show - click) * nonclk_coeff + click * click_coeff < delete_threshold, or that saw no
 * push in the last delete_after_unseen passes (> 0), is removed (its slot and index entry
 * freed for the next rows); the others count one more unseen pass. Candidates unseen that
 * long are dropped too. Returns the rows removed, or FL_ENOMEM (nothing removed). */
int64_t fl_ps_sparse_pass(fl_ps_sparse *t);

/* Visits every row (id, values[dim], state, counters) in ascending id order (for saving and
 * merging). fn returns 0 to go on, else stops and is returned. only_dirty: the rows created
 * or changed (push, apply_pending, put) since the last fl_ps_sparse_mark_clean. Sorts the
 * visited rows by id first: 32 bytes of scratch a visited row (FL_ENOMEM when they cannot be
 * had). */
typedef int (*fl_ps_row_fn)(void *ctx, uint64_t id, const float *values, const float *state,
                            const fl_ps_row_stat *st);
int  fl_ps_sparse_visit(const fl_ps_sparse *t, bool only_dirty, fl_ps_row_fn fn, void *ctx);
/* Forgets which rows changed, and that a pass ran. */
void fl_ps_sparse_mark_clean(fl_ps_sparse *t);
/* Whether a pass (fl_ps_sparse_pass) ran since fl_ps_sparse_mark_clean: it changed every
 * row's counters and may have removed rows, which a delta save cannot say, so the next save
 * must be a full one. */
bool fl_ps_sparse_passed(const fl_ps_sparse *t);
/* Inserts or overwrites a row (loading): values[dim], state (NULL: a fresh state) and
 * counters (NULL: zeros), whatever the entry rule. Marks the row dirty like any change: a
 * loader calls fl_ps_sparse_mark_clean after loading. FL_ENOMEM. */
int  fl_ps_sparse_put(fl_ps_sparse *t, uint64_t id, const float *values, const float *state,
                      const fl_ps_row_stat *st);
/* The candidates of entry COUNT (saving): fn(ctx, id, shows seen, unseen passes), in no
 * particular order; and putting one back (loading; FL_ENOMEM), or forgetting them all. */
typedef int (*fl_ps_cand_fn)(void *ctx, uint64_t id, float seen, int unseen);
int  fl_ps_sparse_visit_candidates(const fl_ps_sparse *t, fl_ps_cand_fn fn, void *ctx);
int  fl_ps_sparse_put_candidate(fl_ps_sparse *t, uint64_t id, float seen, int unseen);
void fl_ps_sparse_clear_candidates(fl_ps_sparse *t);

#endif /* FLEET_PS_TABLE_H */
