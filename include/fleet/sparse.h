/* sparse.h - sparse features: the sparse embedding (Paddle's sparse_embedding, PyTorch's
 * EmbeddingBag with sum or mean pooling) and the CTR models built on it (wide&deep, DeepFM).
 *
 * The tables live outside the models, wherever their owner keeps them (a parameter server, a
 * local fl_ps_sparse replica). The unit of exchange is a batch's DISTINCT ids and their rows:
 *
 *     fl_sparse_lookup lk = {0};
 *     fl_sparse_rows   emb = {0};
 *     fl_sparse_lookup_collect(&lk, batch, NULL, 0);      // distinct ids of all slots, ascending
 *     fl_sparse_rows_prepare(&emb, 10, &lk);               // emb.ids = lk.ids, room for rows
 *     fl_ps_sparse_pull(ps, 0, emb.ids, emb.n, emb.rows);  // the owner fills the rows
 *     fl_sparse_embedding_forward(&lk, &emb, FL_SPARSE_SUM, FL_DTYPE_F32, out, 0);
 *     ...                                                  // out (B, S * 10) feeds a network
 *     fl_sparse_embedding_backward(&lk, &emb, FL_SPARSE_SUM, FL_DTYPE_F32, dout, 0);
 *     fl_ps_sparse_push(ps, 0, step, lr, emb.ids, emb.n, emb.grads); // only the touched rows
 *
 * A CTR model (fl_ctr_model) does the same for its two tables and runs its dense layers as a
 * regular fl_net (one flat parameter block, what the collective strategies and the PS's dense
 * tables already exchange). docs/ctr.md, "Models", describes both. */
#ifndef FLEET_SPARSE_H
#define FLEET_SPARSE_H

#include "fleet/ctr.h"
#include "fleet/nn.h"
#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the sparse embedding (sparse_embedding.c, sparse_lookup.c) ------------------------- */

/* How a bag's rows become one vector: their sum, or their mean (an empty bag gives zeros
 * either way), as PyTorch's EmbeddingBag mode 'sum' / 'mean'. A repeated id counts as often as
 * it occurs. */
typedef enum { FL_SPARSE_SUM = 0, FL_SPARSE_MEAN = 1 } fl_sparse_pool;
/* "sum", "mean"; and back: FL_EINVAL naming the word. */
const char *fl_sparse_pool_name(fl_sparse_pool p);
int         fl_sparse_pool_parse(const char *name, fl_sparse_pool *p);

/* A batch's distinct ids over S chosen slots, and for each bag the positions of its ids among
 * them. Bag k = i * S + j is sample i's j-th chosen slot (sample-major, so an embedding's output
 * (B, S * DIM) has bag k at k * DIM). All arrays are owned by the lookup and reused by the next
 * collect (they grow as needed; a zeroed struct is an empty lookup). */
typedef struct fl_sparse_lookup {
    int64_t   batch;     /* B */
    int       nslots;    /* S: slots chosen */
    int       slots[FL_CTR_MAX_SLOTS]; /* batch slot of chosen slot j, j < S */
    int64_t   n;         /* N: distinct ids */
    uint64_t *ids;       /* (N) ascending */
    int64_t   nocc;      /* id occurrences in the chosen bags */
    int64_t  *offsets;   /* (B * S + 1) bag k's occurrences are [offsets[k], offsets[k + 1]) */
    int32_t  *index;     /* (NOCC) the row (into ids) of each occurrence, in the batch's order */
    /* the transpose, for backward: row r's occurrences, as bag numbers in ascending order, are
     * occ_bag[row_start[r] .. row_start[r + 1]) */
    int64_t  *row_start; /* (N + 1) */
    int32_t  *occ_bag;   /* (NOCC) */
    /* scratch and capacities (private) */
    int64_t   cap_bags, cap_occ, cap_n, cap_hash;
    uint64_t *hash_ids;
    int32_t  *hash_pos, *fill, *rank;
} fl_sparse_lookup;

/* Collects batch b's distinct ids over slots[0..nslots) (each in [0, b->nslots), in the order
 * given, repeats allowed), or over every slot of b in order when slots is NULL (nslots ignored),
 * into lk: ids ascending (the same whatever the order of the batch's ids), each bag's
 * occurrence positions and the transpose. Deduplicates with an open-addressing hash table and
 * sorts the distinct ids; one thread. FL_EINVAL naming the slot out of range, or when the batch
 * holds 2^31 ids or more; FL_ENOMEM (lk then holds no batch: n = 0, batch = 0). */
int  fl_sparse_lookup_collect(fl_sparse_lookup *lk, const fl_ctr_batch *b, const int *slots,
                              int nslots);
/* Per distinct id r < lk->n, what a parameter server's life cycle counts (Paddle's show and
 * click, fl_ps_sparse_push_counts): shows[r] = the id's occurrences in the chosen bags, and
 * clicks[r] = the sum of labels[i] over those occurrences (sample i = bag / S); labels (B)
 * are 0 or 1 (NULL: no clicks). shows and clicks hold lk->n floats each. */
void fl_sparse_lookup_counts(const fl_sparse_lookup *lk, const int32_t *labels, float *shows,
                             float *clicks);
/* Frees lk's arrays and zeroes it; a zeroed lookup is a no-op. */
void fl_sparse_lookup_free(fl_sparse_lookup *lk);

/* The rows of one table for a lookup's ids: what the table's owner fills (rows) and what
 * backward gives back (grads). The arrays are owned by the struct (a zeroed struct is empty);
 * its owner may also point ids/rows/grads at memory of its own with cap 0 (never freed here). */
typedef struct fl_sparse_rows {
    int       dim;   /* DIM: values per row */
    int64_t   n;     /* N: rows held */
    uint64_t *ids;   /* (N) the ids of the rows, ascending as the lookup's */
    float    *rows;  /* (N, DIM) the table's values for those ids (filled by the owner) */
    float    *grads; /* (N, DIM) the loss's gradient w.r.t. them (written by backward) */
    int64_t   cap;   /* rows allocated for; 0: the arrays are borrowed */
} fl_sparse_rows;

/* Sizes r for lk's ids with dim values per row (dim >= 1): copies the ids, grows rows and
 * grads as needed (their contents are then undefined until the owner fills rows). FL_EINVAL
 * for dim < 1, FL_ENOMEM (r keeps its previous arrays, n = 0). */
int  fl_sparse_rows_prepare(fl_sparse_rows *r, int dim, const fl_sparse_lookup *lk);
/* Frees the arrays r owns (cap > 0) and zeroes r. A zeroed struct is a no-op. */
void fl_sparse_rows_free(fl_sparse_rows *r);

/* Pools each bag of lk into out: out[i * ld + j * DIM + c] = pool over bag (i, j) of
 * r->rows[index * DIM + c], for sample i < B, chosen slot j < S, c < DIM. ld is the distance
 * between samples in elements (0: S * DIM, a dense (B, S * DIM); larger to write into the first
 * columns of a wider matrix); columns beyond S * DIM are not touched. t: FL_DTYPE_F32 or
 * FL_DTYPE_F64 (out's type; sums accumulate in t, in the bag's order). Threads (OpenMP) split the
 * samples: the result does not depend on their number. FL_EINVAL when r does not hold lk's ids
 * (n or an id differs), ld < S * DIM or t is another type. Host memory. */
int fl_sparse_embedding_forward(const fl_sparse_lookup *lk, const fl_sparse_rows *r,
                                fl_sparse_pool pool, fl_dtype t, void *out, int64_t ld);
/* The gradient of the rows from dout (B, S * DIM) at stride ld (as forward's out, type t):
 * r->grads[row] = the sum over the row's occurrences (bag k, ascending) of dout's bag k vector,
 * divided by the bag's size under mean; rows of the table not in the batch get nothing (there
 * is no dense gradient of the table). Threads split the rows, each summed in one fixed order in
 * t, then rounded to f32: the same bits whatever the thread count. Errors as forward. */
int fl_sparse_embedding_backward(const fl_sparse_lookup *lk, fl_sparse_rows *r,
                                 fl_sparse_pool pool, fl_dtype t, const void *dout, int64_t ld);

/* ---- CTR models (ctr_model.c) ------------------------------------------------------------- */

/* Wide&deep (Cheng et al. 2016, arXiv:1606.07792) as Paddle's parameter-server quick start and
 * PaddleRec's wide_deep build it, and DeepFM (Guo et al. 2017, arXiv:1703.04247). For a sample
 * with dense features x (NDENSE) and slots s < S with bags of ids:
 *   e_s = pool of the bag's rows of table "embedding" (DIM values a row);
 *   w_s = pool of the bag's rows of table "wide"      (1 value a row);
 *   deep = MLP([e_0 .. e_{S-1}, x]): hidden ReLU layers, then one output;
 *   wide&deep: logit = deep + (wide_part . x + b) + sum_s w_s
 *   DeepFM:    logit = deep + (dense_w_one . x) + sum_s w_s
 *                    + 1/2 sum_c ((sum_s e_sc)^2 - sum_s e_sc^2)   (FM's second order, eq. 2 of
 *                      Rendle 2010 as rewritten in lemma 3.1; over the slot embeddings only:
 *                      PaddleRec also gives each dense feature an FM vector, fleet does not)
 * The dense layers are one fl_net whose input is [e_0 .. e_{S-1}, x] (B, S * DIM + NDENSE) and
 * whose output is (B, 1): deep + the dense linear term. Its layers, PaddleRec's names:
 * "linear_0", "act_0", ..., "linear_H" (the output, no activation), "dense_slice" (x out of the
 * input), "wide_part" (wide&deep: fc NDENSE -> 1 with bias) or "dense_w_one" (DeepFM: no bias),
 * "logit" (add). Its parameters are the flat block of fl_net_flat_params, initialised from the
 * config's seed (fc's default init). The two tables are separate (table 0 "embedding" of DIM,
 * table 1 "wide" of 1); both use the same distinct ids (every slot of the batch). */
typedef enum { FL_CTR_WIDE_DEEP = 0, FL_CTR_DEEPFM = 1 } fl_ctr_model_type;

#define FL_CTR_MAX_HIDDEN 16
enum { FL_CTR_TABLE_EMBEDDING = 0, FL_CTR_TABLE_WIDE = 1, FL_CTR_NTABLES = 2 };

typedef struct {
    fl_ctr_model_type type;
    int            nslots;    /* S, 1 .. FL_CTR_MAX_SLOTS (26) */
    int            ndense;    /* NDENSE >= 0 (13) */
    int            embed_dim; /* DIM >= 1 (10) */
    int            nhidden;   /* hidden layers, 0 .. FL_CTR_MAX_HIDDEN (3) */
    int64_t        hidden[FL_CTR_MAX_HIDDEN]; /* their widths (400, 400, 400) */
    fl_sparse_pool pool;      /* of both tables' bags (sum) */
    fl_dtype       dtype;     /* of the dense part and the logits: F32, or F64 for gradient
                               * checks (the tables' rows and grads stay f32) */
    int64_t        max_batch; /* B at most (512) */
    uint64_t       seed;      /* initialises the dense parameters (1) */
} fl_ctr_model_config;

/* Paddle's quick-start sizes for type: 26 slots, 13 dense, dim 10, 400-400-400, sum, f32. */
fl_ctr_model_config fl_ctr_model_config_default(fl_ctr_model_type type);
/* "wide_deep", "deepfm"; and back: FL_EINVAL naming the word and listing both. */
const char *fl_ctr_model_type_name(fl_ctr_model_type t);
int         fl_ctr_model_type_parse(const char *name, fl_ctr_model_type *t);

typedef struct fl_ctr_model fl_ctr_model;

/* Builds the model (its fl_net, on the cpu backend, with the input gradient on) and plans its
 * buffers for max_batch. FL_EINVAL / FL_ECONFIG naming the field on a bad config; FL_ENOMEM. */
int  fl_ctr_model_create(const fl_ctr_model_config *c, fl_ctr_model **out);
void fl_ctr_model_free(fl_ctr_model *m); /* NULL is a no-op */
const fl_ctr_model_config *fl_ctr_model_config_of(const fl_ctr_model *m);
/* The dense part (borrowed): fl_net_param / fl_net_flat_params / fl_net_flat_grads are what
 * an optimizer or a strategy works on. Do not run it directly between prepare and backward. */
fl_net *fl_ctr_model_net(fl_ctr_model *m);
/* Table t's name ("embedding", "wide") and row width (DIM, 1); NULL / -1 outside [0, 2). */
const char *fl_ctr_model_table_name(int t);
int         fl_ctr_model_table_dim(const fl_ctr_model *m, int t);

/* One step, in four calls:
 *   fl_ctr_model_prepare(m, b)   collects b's distinct ids and sizes both tables' rows;
 *   (the owner fills fl_ctr_model_rows(m, t)->rows for t = 0, 1)
 *   fl_ctr_model_forward(m, training, &logits)   logits (B) in the model's dtype;
 *   fl_ctr_model_backward(m, dlogits)   the dense part's gradients into fl_net_flat_grads and
 *                                       both tables' rows' gradients into their grads.
 * prepare: b (borrowed until backward returns, unchanged) must have the config's nslots and
 * ndense (else FL_ESHAPE naming both) and at most max_batch samples (FL_ESHAPE). */
int  fl_ctr_model_prepare(fl_ctr_model *m, const fl_ctr_batch *b);
/* Table t's rows for the prepared batch (borrowed; ids ascending, fill rows). */
fl_sparse_rows *fl_ctr_model_rows(fl_ctr_model *m, int t);
/* The prepared batch's lookup (borrowed): the distinct ids and each bag's positions. */
const fl_sparse_lookup *fl_ctr_model_lookup(const fl_ctr_model *m);
/* *logits (borrowed, valid until the next forward) is (B) in the model's dtype. FL_ESTATE
 * before prepare. */
int  fl_ctr_model_forward(fl_ctr_model *m, bool training, const fl_tensor **logits);
/* dlogits (B) in the model's dtype (the loss's gradient w.r.t. the logits, e.g.
 * fl_sigmoid_xent_backward's). FL_ESTATE without a forward; FL_ESHAPE on a wrong shape. An
 * empty batch (B = 0) gives zero dense gradients (fl_net_zero_grad) and no rows. */
int  fl_ctr_model_backward(fl_ctr_model *m, const fl_tensor *dlogits);
/* The same step for a caller that runs the dense part's backward itself (a distributed
 * optimizer's fl_dist_minimize, which exchanges and applies the dense gradients as it goes):
 *   fl_ctr_model_dnet(m, dlogits, &dnet)  the network output's gradient (B, 1), borrowed from
 *                                         m, valid until the next call; errors as backward;
 *   fl_net_backward(net, dnet, ...)       run by the caller (B = 0: the caller's business);
 *   fl_ctr_model_backward_rows(m, dlogits)  both tables' rows' gradients from the network's
 *                                         input gradient (FL_ESTATE when the network's
 *                                         backward of this batch has not run); B = 0: none.
 * fl_ctr_model_backward is exactly these three. */
int  fl_ctr_model_dnet(fl_ctr_model *m, const fl_tensor *dlogits, const fl_tensor **dnet);
int  fl_ctr_model_backward_rows(fl_ctr_model *m, const fl_tensor *dlogits);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_SPARSE_H */
