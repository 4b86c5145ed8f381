/* table_sparse_impl.h - what the sparse table's files share (table_sparse.c: memory, index,
 * rows, pulls and pushes; table_sparse_sync.c: a sync step's pending sums and the life cycle's
 * pass; table_sparse_visit.c: visiting, saving and loading): the record layout, the structs,
 * the accessors that every operation inlines, and the few functions the others call. The
 * layout itself is described at the top of table_sparse.c. Private to src/ps. */
#ifndef FLEET_PS_TABLE_SPARSE_IMPL_H
#define FLEET_PS_TABLE_SPARSE_IMPL_H

#include "table.h"

#include "cand.h"
#include "core/sort.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIM        4096
#define CHUNK_BYTES    (2u << 20) /* a chunk's target size */
#define MIN_CHUNK_SHIFT 6         /* 64 rows: whole words of dirty bits */
#define MAX_CHUNK_SHIFT 16
#define INDEX_MIN_BITS 10
#define MAX_ROWS       ((int64_t)UINT32_MAX - 1) /* slot + 1 fits an entry's 32 bits */
#define GOLDEN         0x9e3779b97f4a7c15ull
#define ID_FLOATS      2 /* a record's id: 8 bytes, then its counters, then its row */
#define SHOW_AT        2 /* floats into a record: show, click, meta */
#define CLICK_AT       3
#define META_AT        4
#define HEAD_FLOATS    5
#define META_UNSEEN    0xffffu   /* meta: passes unseen (saturating) */
#define META_FREE      0x10000u  /* meta: a free slot; its id field holds the next free + 1 */

typedef struct {
    uint32_t tag;   /* low 32 bits of the id's hash */
    uint32_t slot1; /* row slot + 1 (index) or pending entry + 1 (pending map); 0: empty */
} entry;

typedef struct {
    uint64_t *dirty; /* [R / 64] */
    float    *rows;  /* [R * stride]: each [id (8 bytes) | values (dim) | state] */
} chunk;

typedef struct { /* an open-addressing map of 2^bits entries */
    entry   *e;
    int      bits;
    int64_t  used;
} map;

struct fl_ps_sparse {
    int             table, dim, stride; /* stride: floats a record, HEAD_FLOATS + dim + state */
    fl_ps_rule      rule;
    fl_ps_init_rule init;
    fl_ps_sparse_opts opts;
    int             chunk_shift;        /* rows a chunk: 1 << chunk_shift */
    chunk          *chunks;
    int64_t         nchunks, chunks_cap;
    int64_t         rows;               /* live rows */
    int64_t         slots;              /* slots handed out, live or free */
    int64_t         free1;              /* first free slot + 1, 0: none */
    int64_t         passes;             /* shrink passes run */
    bool            passed;             /* a pass ran since mark_clean */
    map             index;              /* id -> row slot */
    ps_cand         cand;               /* entry COUNT: ids without a row yet */
    /* pending sums (sync): id -> entry of pids / psum / pcnt */
    map             pending;
    uint64_t       *pids;               /* [pcap] */
    float          *psum;               /* [pcap * dim] */
    float          *pcnt;               /* [pcap * 2]: shows, clicks */
    int64_t         pcap;
    float          *scratch;            /* [dim]: a scaled gradient */
};

/* ---- hashing ---- */
/* MurmurHash3's fmix64 (Appleby): the index's hash, another mixer than fl_ps_shard_of's, so the
 * ids one server or thread owns still spread over its index. */
static inline uint64_t index_hash(uint64_t id) {
    uint64_t z = id ^ 0x2545f4914f6cdd1dull;
    z = (z ^ (z >> 33)) * 0xff51afd7ed558ccdull;
    z = (z ^ (z >> 33)) * 0xc4ceb9fe1a85ec53ull;
    return z ^ (z >> 33);
}

/* ---- rows ---- */
static inline int64_t chunk_rows(const fl_ps_sparse *t) { return (int64_t)1 << t->chunk_shift; }

static inline chunk *chunk_of(const fl_ps_sparse *t, int64_t slot) {
    return &t->chunks[slot >> t->chunk_shift];
}
static inline int64_t in_chunk(const fl_ps_sparse *t, int64_t slot) {
    return slot & (chunk_rows(t) - 1);
}
/* A row's record: its id and counters, then the row (values, state) that row_at points to. */
static inline float *record_at(const fl_ps_sparse *t, int64_t slot) {
    return chunk_of(t, slot)->rows + in_chunk(t, slot) * t->stride;
}
static inline float *row_at(const fl_ps_sparse *t, int64_t slot) {
    return record_at(t, slot) + HEAD_FLOATS;
}
static inline uint32_t meta_of(const float *rec) {
    uint32_t m;
    memcpy(&m, rec + META_AT, sizeof m);
    return m;
}
static inline void set_meta(float *rec, uint32_t m) { memcpy(rec + META_AT, &m, sizeof m); }
static inline bool is_free(const fl_ps_sparse *t, int64_t slot) {
    return meta_of(record_at(t, slot)) & META_FREE;
}
static inline uint64_t id_at(const fl_ps_sparse *t, int64_t slot) {
    uint64_t id;
    memcpy(&id, record_at(t, slot), sizeof id); /* 4-byte aligned when the stride is odd */
    return id;
}
static inline void set_dirty(fl_ps_sparse *t, int64_t slot) {
    int64_t k = in_chunk(t, slot);
    chunk_of(t, slot)->dirty[k >> 6] |= 1ull << (k & 63);
}
static inline bool is_dirty(const fl_ps_sparse *t, int64_t slot) {
    int64_t k = in_chunk(t, slot);
    return chunk_of(t, slot)->dirty[k >> 6] >> (k & 63) & 1;
}
static inline void clear_dirty(fl_ps_sparse *t, int64_t slot) {
    int64_t k = in_chunk(t, slot);
    chunk_of(t, slot)->dirty[k >> 6] &= ~(1ull << (k & 63));
}

/* ---- maps ---- */
static inline uint64_t map_mask(const map *m) { return ((uint64_t)1 << m->bits) - 1; }
static inline uint64_t map_home(const map *m, uint64_t h) { return h >> (64 - m->bits); }
static inline bool map_full(const map *m) {
    return m->used + 1 > (int64_t)(((uint64_t)3 << m->bits) / 4);
}

/* Adds a push's counts to the row in slot s: shows, clicks, and a fresh unseen count. */
static inline void count_push(fl_ps_sparse *t, int64_t s, float show, float click) {
    float *rec = record_at(t, s);
    rec[SHOW_AT] += show;
    rec[CLICK_AT] += click;
    set_meta(rec, meta_of(rec) & ~META_UNSEEN);
}

/* ---- defined in table_sparse.c ---- */
/* An empty map of 2^bits entries: FL_OK or FL_ENOMEM. */
int ps_map_init(map *m, int bits);
/* Places (h, slot1) at the first free entry from its home; the key is known to be absent. */
void ps_map_place(map *m, uint64_t h, uint32_t slot1);
/* The slot of row id, created when missing whatever the entry rule; -1 and the error set when
 * memory runs out. */
int64_t ps_sparse_find_or_create(fl_ps_sparse *t, uint64_t id);
/* Removes the row in slot s (a pass): out of the index, its slot onto the free list. */
void ps_sparse_remove_row(fl_ps_sparse *t, int64_t s);
/* The slot of row id for a push of `show` shows: found, or created when the entry rule admits
 * it; -1 when it does not (dropped); -2 out of memory (error set). */
int64_t ps_sparse_push_slot(fl_ps_sparse *t, uint64_t id, float show);

/* The two arrays of n (id, slot) pairs a sort by id takes (core/sort.h: input and scratch):
 * FL_OK, or FL_ENOMEM naming the table and `what` was sorted (both NULL then). */
int ps_sparse_sort_arrays(const fl_ps_sparse *t, int64_t n, const char *what, fl_key_pair **a,
                          fl_key_pair **tmp);

#endif /* FLEET_PS_TABLE_SPARSE_IMPL_H */
