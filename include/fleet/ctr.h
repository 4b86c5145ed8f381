/* ctr.h - click-through-rate (CTR) data: the CTR batch (labels, dense features and per-slot
 * bags of 64-bit feature ids), feature hashing, the reader of Criteo's text format and the
 * synthetic CTR task `ctr_synth` with a hidden logistic teacher. The metrics (AUC as Paddle's
 * auc operator computes it, log loss, predicted and actual CTR) are in fleet/metrics.h.
 *
 *     fl_criteo_config c = fl_criteo_config_default();
 *     c.file_list = "train.list"; c.batch_size = 512; c.rank = r; c.world = w;
 *     fl_criteo_reader *rd = fl_criteo_open(&c);
 *     const fl_ctr_batch *b;
 *     while ((rc = fl_criteo_next(rd, &b)) == 1)
 *         for (int64_t i = 0; i < b->batch; i++)
 *             for (int s = 0; s < b->nslots; s++) {
 *                 int64_t n; const uint64_t *ids = fl_ctr_bag(b, i, s, &n);  // pool these
 *             }
 *
 * docs/ctr.md describes the formats, the hashing, the transforms and the teacher. */
#ifndef FLEET_CTR_H
#define FLEET_CTR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the CTR batch (ctr_batch.c) ---------------------------------------------------------- */

#define FL_CTR_SLOT_BITS 8                      /* a feature id's high bits: its slot */
#define FL_CTR_HASH_BITS 56                     /* its low bits: the hash of the value */
#define FL_CTR_MAX_SLOTS (1 << FL_CTR_SLOT_BITS)
#define FL_CTR_HASH_MASK ((((uint64_t)1) << FL_CTR_HASH_BITS) - 1)
#define FL_CRITEO_DENSE  13                     /* Criteo's integer features I1..I13 */
#define FL_CRITEO_SLOTS  26                     /* Criteo's categorical features C1..C26 */

/* B samples, each a label, NDENSE floats and NSLOTS bags of feature ids (0 or more ids each).
 * The layout is a contract (a sparse embedding layer reads it directly):
 *   - bag k = i * NSLOTS + s is sample i's slot s (sample-major, as the concatenated output of
 *     a per-slot EmbeddingBag is laid out);
 *   - its ids are ids[offsets[k] .. offsets[k + 1]) in the order they were read; offsets has
 *     B * NSLOTS + 1 entries, offsets[0] = 0, non-decreasing (PyTorch's EmbeddingBag offsets
 *     with the total appended);
 *   - every id of slot s has s in its high FL_CTR_SLOT_BITS bits (fl_ctr_id), so ids of two
 *     slots never collide and one table can hold every slot;
 *   - a bag may repeat an id (pooling counts it twice, as EmbeddingBag does).
 * The arrays belong to the batch; the cap_ fields are its allocated capacities. */
typedef struct fl_ctr_batch {
    int64_t   batch;       /* B: samples held */
    int       ndense;      /* dense floats per sample */
    int       nslots;      /* bags per sample, <= FL_CTR_MAX_SLOTS */
    int32_t  *labels;      /* (B) 0 or 1 */
    float    *dense;       /* (B, NDENSE) */
    int64_t  *offsets;     /* (B * NSLOTS + 1) */
    uint64_t *ids;         /* (offsets[B * NSLOTS]) */
    int64_t   cap_samples; /* samples allocated for */
    int64_t   cap_ids;     /* ids allocated for */
} fl_ctr_batch;

/* Prepares an empty batch for samples of ndense floats and nslots bags (ndense >= 0, nslots in
 * [0, FL_CTR_MAX_SLOTS]) with room for cap_samples samples and cap_ids ids (it grows as samples
 * are added). FL_EINVAL on bad sizes, FL_ENOMEM; on failure b is left empty (free is safe). */
int  fl_ctr_batch_init(fl_ctr_batch *b, int ndense, int nslots, int64_t cap_samples,
                       int64_t cap_ids);
/* Frees the arrays and zeroes b. A zeroed or already freed batch is a no-op. */
void fl_ctr_batch_free(fl_ctr_batch *b);
/* Empties b (B = 0), keeping its memory. */
void fl_ctr_batch_clear(fl_ctr_batch *b);
/* Appends one sample: its label, ndense floats, and per slot s counts[s] ids taken in order
 * from ids (sum(counts) ids in all). Grows the arrays by doubling: FL_ENOMEM leaves b as it
 * was. FL_EINVAL if a count is negative. */
int  fl_ctr_batch_add(fl_ctr_batch *b, int32_t label, const float *dense, const uint64_t *ids,
                      const int32_t *counts);
/* Copies src into dst (which must have been initialised; it is resized). FL_ENOMEM. */
int  fl_ctr_batch_copy(fl_ctr_batch *dst, const fl_ctr_batch *src);

/* The ids of sample i's slot s and their count (*n); borrowed from b. */
static inline const uint64_t *fl_ctr_bag(const fl_ctr_batch *b, int64_t i, int s, int64_t *n) {
    int64_t k = i * b->nslots + s;
    *n = b->offsets[k + 1] - b->offsets[k];
    return b->ids + b->offsets[k];
}
/* Ids held by the batch (all bags). */
static inline int64_t fl_ctr_batch_nids(const fl_ctr_batch *b) {
    return b->offsets[b->batch * b->nslots];
}

/* ---- feature ids and dense transforms (ctr_batch.c) -------------------------------------- */

/* The FL_CTR_HASH_BITS-bit hash of a categorical value's bytes (the text as written, without
 * its slot): 64-bit FNV-1a (Fowler, Noll, Vo) over the bytes, then the splitmix64 finaliser
 * (Steele et al., OOPSLA 2014) so that every bit depends on every byte, masked to 56 bits. The
 * same on every machine. The empty string (a missing value) has a hash too. */
uint64_t fl_ctr_hash(const char *s, size_t len);
/* The feature id of a value with hash h in slot s (0 <= s < FL_CTR_MAX_SLOTS):
 * s << 56 | (h & FL_CTR_HASH_MASK). */
static inline uint64_t fl_ctr_id(int s, uint64_t h) {
    return ((uint64_t)s << FL_CTR_HASH_BITS) | (h & FL_CTR_HASH_MASK);
}
static inline int fl_ctr_id_slot(uint64_t id) {
    return (int)(id >> FL_CTR_HASH_BITS);
}

/* How an integer feature x becomes the float the model sees. A missing (empty) value is 0.0
 * under every transform, as PaddleRec's reader has it. */
typedef enum {
    /* PaddleRec's CTR-DNN reader (models/rank/dnn/data/get_slot_data.py) and Paddle's PS test
     * generator (test/ps/dataset_generator_B.py): (x - cont_min[j]) / cont_diff[j] with the
     * fixed tables below, not clipped. Only for ndense == FL_CRITEO_DENSE. */
    FL_CTR_DENSE_MINMAX = 0,
    FL_CTR_DENSE_LOG    = 1, /* log(1 + x) for x >= 0, -log(1 - x) for x < 0 */
    FL_CTR_DENSE_RAW    = 2, /* x itself */
} fl_ctr_dense_transform;

/* PaddleRec's tables for I1..I13: cont_min and cont_diff (= cont_max - cont_min). */
extern const int32_t fl_criteo_cont_min[FL_CRITEO_DENSE];
extern const int32_t fl_criteo_cont_diff[FL_CRITEO_DENSE];

/* Transformed value of dense feature j (0-based) with integer value x. */
float fl_ctr_dense_value(fl_ctr_dense_transform t, int j, int64_t x);
/* "minmax", "log", "raw"; and back: FL_EINVAL naming the word on an unknown one. */
const char *fl_ctr_dense_name(fl_ctr_dense_transform t);
int fl_ctr_dense_parse(const char *name, fl_ctr_dense_transform *t);

/* ---- one line of Criteo's text format (criteo_line.c) ------------------------------------- */

/* A line is 1 + NDENSE + NSLOTS fields separated by single tabs (a trailing '\r' is ignored):
 *   label            "0" or "1";
 *   NDENSE integers  decimal, optional '-', or empty (missing);
 *   NSLOTS values    hexadecimal ([0-9a-fA-F]+) or empty (missing). fleet extends the format
 *                    for multi-valued slots: a field may hold several values joined by ','
 *                    ("a1,b2"), each one id; real Criteo files never hold a ','. */
typedef struct {
    int  ndense;                      /* FL_CRITEO_DENSE */
    int  nslots;                      /* FL_CRITEO_SLOTS, at most FL_CTR_MAX_SLOTS */
    fl_ctr_dense_transform transform; /* FL_CTR_DENSE_MINMAX */
    /* true (PaddleRec: it hashes str(slot) + "" for an empty field): a missing value is the
     * slot's own "missing" id fl_ctr_id(s, fl_ctr_hash("", 0)); false: an empty bag. */
    bool missing_id;
} fl_criteo_format;

/* Criteo's shape with PaddleRec's transform and missing ids. */
fl_criteo_format fl_criteo_format_default(void);
/* FL_EINVAL naming the field if the format is unusable (sizes out of range, minmax with
 * ndense != 13). */
int fl_criteo_format_check(const fl_criteo_format *f);

/* Parses line[0..len) (no newline; line need not be NUL-terminated) and appends its sample to
 * out (whose ndense and nslots must be f's). FL_EFORMAT with a message that names the field and
 * what is wrong with it ("field 15 (C2): 'zz' is not hexadecimal", "12 fields, want 40",
 * "label '2' is not 0 or 1", "field 3 (I2): '1.5' is not an integer") and out unchanged; the
 * caller prefixes file:line. FL_ENOMEM. */
int fl_criteo_parse_line(const fl_criteo_format *f, const char *line, size_t len,
                         fl_ctr_batch *out);

/* ---- the streaming reader over a file list (criteo.c) ------------------------------------ */

typedef enum {
    FL_BAD_LINES_FAIL = 0, /* the reader fails with "file:line: what" */
    FL_BAD_LINES_SKIP = 1, /* the line is counted (fl_criteo_stats) and left out */
} fl_bad_lines_policy;

typedef enum {
    /* Paddle's fleet.util.get_file_shard: the list is cut into world contiguous blocks of
     * files, the first (files % world) blocks one file longer; rank r reads block r, in list
     * order. Ranks may make different numbers of batches (rank r has none without files). */
    FL_CTR_SHARD_FILES = 0,
    /* By lines, as fl_loader slices global batches: the data lines of all files in list order
     * are numbered i = 0, 1, ...; line i belongs to rank (i / batch_size) % world. Step g's
     * batches over the ranks are lines [g*world*B, (g+1)*world*B); every rank makes the same
     * number of batches (a rank with nothing in the final global batch gets one empty batch).
     * Every rank reads every file but parses only its own lines. */
    FL_CTR_SHARD_LINES = 1,
} fl_ctr_shard;

typedef struct {
    /* The data files: a list file, one path per line (relative paths are relative to the
     * list's directory; blank lines and lines starting with '#' are skipped; surrounding
     * blanks trimmed), or, when file_list is NULL, files[0..nfiles). */
    const char         *file_list;
    const char *const  *files;
    int                 nfiles;
    fl_criteo_format    format;
    int64_t             batch_size; /* samples per batch of this rank, >= 1 */
    int                 rank, world;
    fl_ctr_shard        shard;
    fl_bad_lines_policy bad_lines;
    bool                prefetch;   /* a thread reads the next batch while this one is used */
} fl_criteo_config;

/* The default format, batch 512, rank 0 of 1, file sharding, bad lines fail, prefetch on. */
fl_criteo_config fl_criteo_config_default(void);

typedef struct fl_criteo_reader fl_criteo_reader;

/* Opens a reader: checks the config and the list, and that every data file of the list can be
 * opened, refusing with "list:line: path: reason" (a list with no files is refused too). Data
 * files are read line by line (one line in memory at a time, however large the file), from
 * the first batch on. NULL and fl_errmsg on failure. cfg's strings are copied. */
fl_criteo_reader *fl_criteo_open(const fl_criteo_config *cfg);
/* Stops the prefetch thread and frees everything. NULL is a no-op. */
void fl_criteo_close(fl_criteo_reader *r);
/* The next batch of this rank: *batch (owned by the reader, valid until the next call of next,
 * rewind or close) holds 1 to batch_size samples, 0 only as line sharding's final empty batch
 * or where skipped lines emptied it. Returns 1 with a batch, 0 at the end of the pass, or a
 * negative status: "file:line: what" for a bad line under the fail policy, "file: reason" for
 * I/O; the same status again on every call until a rewind. */
int  fl_criteo_next(fl_criteo_reader *r, const fl_ctr_batch **batch);
/* Starts a new pass (epoch) from the first line: the same batches again. */
int  fl_criteo_rewind(fl_criteo_reader *r);

typedef struct {
    int64_t lines;   /* data lines of this rank in the batches returned so far, bad ones too */
    int64_t samples; /* samples returned */
    int64_t skipped; /* bad lines skipped (FL_BAD_LINES_SKIP) */
    int     files;   /* data files this rank reads */
} fl_criteo_stats;
/* Counts since open (not reset by rewind), for the batches returned so far only: what the
 * prefetch thread read ahead is not counted until it is returned. */
void fl_criteo_get_stats(const fl_criteo_reader *r, fl_criteo_stats *st);

/* ---- the synthetic CTR task (ctr_synth.c) ------------------------------------------------- */

typedef struct {
    uint64_t seed;         /* the teacher and the samples */
    int      split;        /* 0 (train) or 1 (validation): disjoint samples of one teacher */
    int      ndense;       /* FL_CRITEO_DENSE */
    int      nslots;       /* FL_CRITEO_SLOTS */
    int64_t  vocab;        /* values per slot, [1, 2^32) (10^6) */
    double   zipf;         /* popularity exponent s > 0: P(rank k) ~ k^-s (1.1) */
    int      max_ids;      /* each slot holds 1..max_ids ids, uniformly (1) */
    double   missing;      /* probability that a slot is empty and a dense value missing (0.1) */
    double   ctr;          /* the positive rate the bias is calibrated to, (0, 1) (0.26) */
    double   sparse_scale; /* std of the sparse part of the teacher's logit (1.5) */
    double   dense_scale;  /* std of a dense weight times sqrt(ndense) (1.0) */
    fl_ctr_dense_transform transform; /* how the dense integers become floats (minmax) */
} fl_ctr_synth_config;

fl_ctr_synth_config fl_ctr_synth_config_default(void);

typedef struct fl_ctr_synth fl_ctr_synth;

/* The synthetic task. Sample i (0 <= i < 2^40) of a split derives from (seed, split, i) alone;
 * slot s of a sample holds 1..max_ids values (none with probability `missing`) drawn from a
 * Zipf law over [0, vocab) (value 0 the most popular); its ids are the ids Criteo's reader
 * gives the value's text, fl_ctr_id(s, fl_ctr_hash("%08x" of the value)). Dense integer j is
 * log-uniform in [cont_min[j], cont_min[j] + cont_diff[j]] (PaddleRec's tables, j mod 13) or
 * missing, then transformed. The label is Bernoulli(p), p = sigmoid(bias + sum over slots of
 * the mean of the bag's hidden weights + sum_j u_j * dense_j); the weight of (slot, value) is
 * drawn from (seed, slot, value) alone, N(0, sparse_scale^2 / nslots); u_j ~ N(0,
 * dense_scale^2 / ndense); bias is set by bisection so that the mean p over 2^15 calibration
 * samples is `ctr`. NULL and fl_errmsg naming the field on a bad config. */
fl_ctr_synth *fl_ctr_synth_create(const fl_ctr_synth_config *cfg);
void fl_ctr_synth_free(fl_ctr_synth *s);
const fl_ctr_synth_config *fl_ctr_synth_config_of(const fl_ctr_synth *s);
/* The calibrated bias of the teacher's logit. */
double fl_ctr_synth_bias(const fl_ctr_synth *s);

/* Appends sample `index` to b (ndense and nslots must match the task's) and, if p is not NULL,
 * writes the teacher's probability there. FL_EINVAL on an index out of range; FL_ENOMEM.
 * Thread-safe (s is only read). */
int fl_ctr_synth_add(const fl_ctr_synth *s, int64_t index, fl_ctr_batch *b, double *p);
/* Clears b and fills it with rank's slice of global batch `step`: samples [g*world*B + rank*B,
 * g*world*B + (rank+1)*B) with g = step, as fl_loader slices sequential batches, so the union
 * over ranks of one step is the single-worker batch of world * B. */
int fl_ctr_synth_batch(const fl_ctr_synth *s, int64_t step, int rank, int world, int64_t B,
                       fl_ctr_batch *b);
/* Writes sample `index` as one line of Criteo's text format (no newline; the ',' extension
 * when max_ids > 1, values as 8 lowercase hex digits, missing values as empty fields) into
 * buf[0..cap) with a NUL; returns its length, or FL_EINVAL if cap < fl_ctr_synth_line_max.
 * Reading the line back with fl_criteo_parse_line (the task's transform, missing_id false)
 * gives exactly the sample fl_ctr_synth_add gives. p as in fl_ctr_synth_add. */
int fl_ctr_synth_line(const fl_ctr_synth *s, int64_t index, char *buf, size_t cap, double *p);
size_t fl_ctr_synth_line_max(const fl_ctr_synth *s);
/* The hidden weight of value v of slot `slot` (what the teacher adds for it). */
double fl_ctr_synth_weight(const fl_ctr_synth *s, int slot, uint32_t v);
/* The best possible AUC on this split: the exact AUC (ties count one half) of the teacher's
 * p against the labels of samples [0, n), n >= 2. FL_EINVAL if n < 2 or the samples hold only
 * one class; FL_ENOMEM. */
int fl_ctr_synth_best_auc(const fl_ctr_synth *s, int64_t n, double *auc);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_CTR_H */
