/* table_sparse.c - a sparse table: 64-bit id -> row of dim f32 values, the rule's state and
 * the row's counters, built for 10^8 rows in little memory (dim 8 with Adagrad: about 75 bytes
 * a row, all counted).
 *
 * Rows live in chunks of 2^k records allocated as the table grows and never moved, so a row's
 * pointer stays valid and nothing is allocated per row. A chunk holds a dirty bit per row (delta
 * saves) and the records, each [id (8 bytes) | show f32 | click f32 | meta u32 | values (dim) |
 * state]: the id beside its row, so that a lookup's id check brings the row into cache too;
 * meta holds the passes unseen (16 bits) and a flag for a free slot. The index is an
 * open-addressing hash table with linear probing (Knuth, TAOCP vol. 3, 6.4, algorithm L) of
 * 8-byte entries: 32 bits of the id's hash as a tag and the row's slot + 1 (0: empty); a probe
 * reads the record's id only when the tag matches. Its home position is the hash's top bits;
 * past 3/4 full it doubles and is rebuilt from the records' ids, read in order. A row removed
 * by a pass (the life cycle, after Paddle's CtrCommonAccessor::Shrink) leaves the index by
 * backward shift (algorithm R: no tombstones) and its slot on a free list threaded through the
 * free records' id fields, which the next rows created take first. The candidates of entry
 * COUNT sit in their own small map (cand.h). The pending sums of a sync step sit in a second,
 * small map of the index's kind, emptied by each apply. Sorting by id (visit, apply) is an LSD
 * radix sort of (id, slot) pairs (core/sort.h). This file: memory, the index, rows, pulls and
 * pushes; a sync step's pending sums and the pass in table_sparse_sync.c, visiting and loading
 * in table_sparse_visit.c (table_sparse_impl.h between them). */
#include "table_sparse_impl.h"

#include "core/sort.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- hashing ---- */
/* The splitmix64 output function (Steele, Lea & Flood, OOPSLA 2014): the initializer's draws. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- rows ---- */
static size_t chunk_bytes(const fl_ps_sparse *t) {
    size_t r = (size_t)chunk_rows(t);
    return r / 64 * sizeof(uint64_t) + r * (size_t)t->stride * sizeof(float);
}

/* The initial values of row id: value j is a function of (seed, table, id, j) alone. */
static void init_row(const fl_ps_sparse *t, uint64_t id, float *v) {
    const fl_ps_init_rule *in = &t->init;
    if (in->type == FL_PS_INIT_ZERO) {
        memset(v, 0, (size_t)t->dim * sizeof *v);
        return;
    }
    uint64_t key = mix64(mix64(mix64(in->seed + GOLDEN) ^ (uint64_t)(uint32_t)t->table) ^ id);
    /* draw j: the splitmix64 sequence seeded with key, at position j */
#define DRAW(j) mix64(key + ((uint64_t)(j) + 1) * GOLDEN)
#define UNIT(h) ((double)((h) >> 11) * 0x1p-53) /* [0, 1) */
    if (in->type == FL_PS_INIT_UNIFORM) {
        float hi = (float)in->b;
        for (int j = 0; j < t->dim; j++) {
            float x = (float)(in->a + (in->b - in->a) * UNIT(DRAW(j)));
            v[j] = x < hi || in->a == in->b ? x : nextafterf(hi, -INFINITY);
        }
        return;
    }
    /* normal: Box-Muller (Box & Muller 1958) on draws (2p, 2p + 1) for values 2p and 2p + 1 */
    for (int j = 0; j < t->dim; j += 2) {
        double u1 = 1.0 - UNIT(DRAW(j)); /* (0, 1] */
        double u2 = UNIT(DRAW(j + 1));
        double r = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
        v[j] = (float)(in->a + in->b * r * cos(a));
        if (j + 1 < t->dim)
            v[j + 1] = (float)(in->a + in->b * r * sin(a));
    }
#undef DRAW
#undef UNIT
}

/* ---- memory ---- */
/* Random ids touch a new page of the index at nearly every lookup: an index of 4 MiB or more
 * (a power of two, so whole huge pages) is aligned to 2 MiB and asks for transparent huge
 * pages, so that a lookup costs a cache miss but seldom a TLB miss too (~20% more rows/s at
 * 10^7 rows on the development machine). */
#define HUGE_BYTES ((size_t)2 << 20)
static void *big_alloc(size_t bytes, bool zero) {
    if (bytes < 2 * HUGE_BYTES)
        return zero ? calloc(1, bytes) : malloc(bytes);
    void *p = NULL;
    size_t n = (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
    if (posix_memalign(&p, HUGE_BYTES, n) != 0)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice only: without it, small pages */
    if (zero)
        memset(p, 0, bytes);
    return p;
}

/* A chunk's records: on whole cache lines (a 64-byte record, dim 10 with Adagrad, is then one
 * line, not two), and a chunk of whole huge pages (2 MiB, or more with at most 1/8 of it
 * rounding) on huge pages, as the index (big_alloc), so that a row's record seldom costs a TLB
 * miss besides its cache miss. */
static void *rows_alloc(size_t bytes) {
    void *p = NULL;
    size_t n = (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
    if (bytes < HUGE_BYTES || n - bytes > bytes / 8)
        return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
    if (posix_memalign(&p, HUGE_BYTES, n) != 0)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice only: without it, small pages */
    return p;
}

/* ---- maps ---- */
int ps_map_init(map *m, int bits) {
    m->e = big_alloc(sizeof *m->e << bits, true);
    m->bits = bits;
    m->used = 0;
    return m->e ? FL_OK : FL_ENOMEM;
}

/* Places (h, value + 1) at the first free entry from its home; the key is known to be absent. */
void ps_map_place(map *m, uint64_t h, uint32_t slot1) {
    uint64_t mask = map_mask(m), p = map_home(m, h);
    while (m->e[p].slot1)
        p = (p + 1) & mask;
    m->e[p].tag = (uint32_t)h;
    m->e[p].slot1 = slot1;
    m->used++;
}

/* The row slot of id, or -1; *pos gets the entry where it is or where it would go. */
static inline int64_t index_find(const fl_ps_sparse *t, uint64_t id, uint64_t h, uint64_t *pos) {
    const map *m = &t->index;
    uint64_t mask = map_mask(m), p = map_home(m, h);
    uint32_t tag = (uint32_t)h;
    for (;; p = (p + 1) & mask) {
        entry e = m->e[p];
        if (!e.slot1)
            break;
        if (e.tag == tag && id_at(t, (int64_t)e.slot1 - 1) == id) {
            *pos = p;
            return (int64_t)e.slot1 - 1;
        }
    }
    *pos = p;
    return -1;
}

/* Doubles the index and places every row again, reading the records' ids in order. */
static int index_grow(fl_ps_sparse *t) {
    map bigger;
    if (ps_map_init(&bigger, t->index.bits + 1) < 0)
        return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory growing its index to %llu "
                       "entries (%lld rows)", t->table, 1ull << (t->index.bits + 1),
                       (long long)t->rows);
    for (int64_t s = 0; s < t->slots; s++)
        if (!is_free(t, s))
            ps_map_place(&bigger, index_hash(id_at(t, s)), (uint32_t)(s + 1));
    free(t->index.e);
    t->index = bigger;
    return FL_OK;
}

/* Removes the index entry at p by backward shift: each entry after it in the run moves into
 * the hole unless its home lies cyclically in (hole, entry]; reading its record's id gives
 * the home. */
static void index_remove(fl_ps_sparse *t, uint64_t p) {
    map *m = &t->index;
    uint64_t mask = map_mask(m), q = p;
    for (;;) {
        q = (q + 1) & mask;
        entry e = m->e[q];
        if (!e.slot1)
            break;
        uint64_t h = map_home(m, index_hash(id_at(t, (int64_t)e.slot1 - 1)));
        bool stays = p <= q ? (h > p && h <= q) : (h > p || h <= q);
        if (!stays) {
            m->e[p] = e;
            p = q;
        }
    }
    m->e[p] = (entry){0, 0};
    m->used--;
}

static int add_chunk(fl_ps_sparse *t) {
    if (t->nchunks == t->chunks_cap) {
        int64_t cap = t->chunks_cap ? 2 * t->chunks_cap : 16;
        chunk *c = realloc(t->chunks, (size_t)cap * sizeof *c);
        if (!c)
            goto nomem;
        t->chunks = c;
        t->chunks_cap = cap;
    }
    size_t r = (size_t)chunk_rows(t);
    chunk *c = &t->chunks[t->nchunks];
    c->dirty = calloc(r / 64, sizeof *c->dirty);
    c->rows = rows_alloc(r * (size_t)t->stride * sizeof *c->rows);
    if (!c->dirty || !c->rows) {
        free(c->dirty);
        free(c->rows);
        goto nomem;
    }
    t->nchunks++;
    return FL_OK;
nomem:
    return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory for rows beyond %lld",
                   t->table, (long long)t->rows);
}

/* Creates row id (initializer, fresh state, counters zero, dirty) in a free slot or a new
 * one, its index entry at *pos (where index_find said it would go; found again when the index
 * grows). The slot, or -1 and the error set when memory runs out. */
static int64_t create_row(fl_ps_sparse *t, uint64_t id, uint64_t h, uint64_t *pos) {
    if (!t->free1 && t->slots >= MAX_ROWS) {
        fl_fail(FL_ENOMEM, "ps sparse table %d: more than %lld rows on one shard", t->table,
                (long long)MAX_ROWS);
        return -1;
    }
    if (map_full(&t->index)) {
        if (index_grow(t) < 0)
            return -1;
        index_find(t, id, h, pos);
    }
    int64_t s;
    if (t->free1) {
        s = t->free1 - 1;
        uint64_t next;
        memcpy(&next, record_at(t, s), sizeof next);
        t->free1 = (int64_t)next;
    } else {
        if (t->slots == t->nchunks * chunk_rows(t) && add_chunk(t) < 0)
            return -1;
        s = t->slots++;
    }
    t->rows++;
    float *rec = record_at(t, s);
    memcpy(rec, &id, sizeof id);
    rec[SHOW_AT] = rec[CLICK_AT] = 0;
    set_meta(rec, 0);
    float *row = rec + HEAD_FLOATS;
    init_row(t, id, row);
    fl_ps_rule_state_init(&t->rule, row + t->dim, t->dim);
    set_dirty(t, s);
    t->index.e[*pos].tag = (uint32_t)h;
    t->index.e[*pos].slot1 = (uint32_t)(s + 1);
    t->index.used++;
    return s;
}

/* The slot of row id, created when missing whatever the entry rule; -1 and the error set
 * when memory runs out. */
int64_t ps_sparse_find_or_create(fl_ps_sparse *t, uint64_t id) {
    uint64_t h = index_hash(id), pos;
    int64_t s = index_find(t, id, h, &pos);
    return s >= 0 ? s : create_row(t, id, h, &pos);
}

/* Removes the row in slot s (a pass): out of the index, its slot onto the free list. */
void ps_sparse_remove_row(fl_ps_sparse *t, int64_t s) {
    uint64_t id = id_at(t, s), pos;
    int64_t found = index_find(t, id, index_hash(id), &pos);
    FL_ASSERT(found == s);
    index_remove(t, pos);
    float *rec = record_at(t, s);
    uint64_t next = (uint64_t)t->free1;
    memcpy(rec, &next, sizeof next);
    set_meta(rec, META_FREE);
    clear_dirty(t, s);
    t->free1 = s + 1;
    t->rows--;
}

/* The entry rule for a missing row id that a push of `show` shows reaches: 1 create it
 * (*carry: shows counted before, which the row starts with), 0 drop the push, -1 out of
 * memory (error set). */
static int admit(fl_ps_sparse *t, uint64_t id, float show, float *carry) {
    *carry = 0;
    switch (t->opts.entry) {
    case FL_PS_ENTRY_NONE:
        return 1;
    case FL_PS_ENTRY_COUNT: {
        ps_cand_entry *e = ps_cand_get(&t->cand, id, true);
        if (!e) {
            fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory for %lld entry candidates",
                    t->table, (long long)t->cand.used + 1);
            return -1;
        }
        if ((double)e->seen + show < t->opts.entry_count) {
            e->seen += show;
            e->unseen = 0;
            return 0;
        }
        *carry = e->seen;
        ps_cand_remove(&t->cand, e);
        return 1;
    }
    case FL_PS_ENTRY_PROBABILITY: {
        /* a draw of (seed, table, id, pass): the same on every server and after a restart */
        uint64_t key = mix64(mix64(mix64(t->init.seed ^ 0x5851f42d4c957f2dull) ^
                                   (uint64_t)(uint32_t)t->table) ^ id);
        uint64_t d = mix64(key + ((uint64_t)t->passes + 1) * GOLDEN);
        return (double)(d >> 11) * 0x1p-53 < t->opts.entry_probability;
    }
    }
    return 1;
}

/* Batches hide the memory latency of random ids with a two-stage software pipeline: AHEAD
 * ids ahead the index entry's line is fetched; AHEAD / 2 ahead, when that entry's tag matches,
 * the record (id and row). The lookup then finds them in cache. */
#define AHEAD 16

static inline void prefetch_entry(const fl_ps_sparse *t, uint64_t id) {
    __builtin_prefetch(&t->index.e[map_home(&t->index, index_hash(id))]);
}

static inline void prefetch_row(const fl_ps_sparse *t, uint64_t id) {
    uint64_t h = index_hash(id);
    entry e = t->index.e[map_home(&t->index, h)];
    if (e.slot1 && e.tag == (uint32_t)h) {
        int64_t s = (int64_t)e.slot1 - 1;
        const float *rec = record_at(t, s);
        __builtin_prefetch(rec, 1);
        __builtin_prefetch(rec + t->stride - 1, 1);
    }
}

static inline void prefetch_ahead(const fl_ps_sparse *t, const uint64_t *ids, int64_t i,
                                  int64_t n) {
    if (i + AHEAD < n)
        prefetch_entry(t, ids[i + AHEAD]);
    if (i + AHEAD / 2 < n)
        prefetch_row(t, ids[i + AHEAD / 2]);
}

int ps_sparse_sort_arrays(const fl_ps_sparse *t, int64_t n, const char *what, fl_key_pair **a,
                          fl_key_pair **tmp) {
    *a = malloc((size_t)n * sizeof **a);
    *tmp = malloc((size_t)n * sizeof **tmp);
    if (*a && *tmp)
        return FL_OK;
    free(*a);
    free(*tmp);
    *a = *tmp = NULL;
    return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory sorting %lld %s", t->table,
                   (long long)n, what);
}

/* ---- the API ---- */
int fl_ps_sparse_create(int table, int dim, const fl_ps_rule *r, const fl_ps_init_rule *init,
                        fl_ps_sparse **out) {
    FL_ASSERT(r && init && out);
    *out = NULL;
    if (dim < 1 || dim > MAX_DIM)
        return fl_fail(FL_EINVAL, "ps sparse table %d: dim %d outside [1, %d]", table, dim,
                       MAX_DIM);
    int rc = fl_ps_rule_check(r, true);
    if (rc < 0)
        return fl_fail_prefix(rc, "ps sparse table %d", table);
    switch (init->type) {
    case FL_PS_INIT_ZERO:
        break;
    case FL_PS_INIT_UNIFORM:
        if (!isfinite(init->a) || !isfinite(init->b) || !(init->a <= init->b))
            return fl_fail(FL_EINVAL,
                           "ps sparse table %d: uniform initializer [a %g, b %g) needs finite "
                           "a <= b", table, init->a, init->b);
        break;
    case FL_PS_INIT_NORMAL:
        if (!isfinite(init->a) || !isfinite(init->b) || !(init->b >= 0))
            return fl_fail(FL_EINVAL,
                           "ps sparse table %d: normal initializer mean a %g, std b %g needs "
                           "finite values and b >= 0", table, init->a, init->b);
        break;
    default:
        return fl_fail(FL_EINVAL, "ps sparse table %d: initializer type %d is none of zero, "
                       "uniform, normal", table, (int)init->type);
    }
    fl_ps_sparse *t = calloc(1, sizeof *t);
    if (!t)
        return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory", table);
    t->table = table;
    t->dim = dim;
    t->rule = *r;
    t->init = *init;
    fl_ps_sparse_opts_defaults(&t->opts);
    t->stride = HEAD_FLOATS + dim + dim * fl_ps_rule_state_per_value(r) +
                fl_ps_rule_state_per_row(r);
    size_t row_bytes = (size_t)t->stride * sizeof(float);
    t->chunk_shift = MIN_CHUNK_SHIFT;
    while (t->chunk_shift < MAX_CHUNK_SHIFT &&
           ((size_t)2 << t->chunk_shift) * row_bytes <= CHUNK_BYTES)
        t->chunk_shift++;
    t->scratch = malloc((size_t)dim * sizeof *t->scratch);
    if (!t->scratch || ps_map_init(&t->index, INDEX_MIN_BITS) < 0) {
        fl_ps_sparse_free(t);
        return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory", table);
    }
    *out = t;
    return FL_OK;
}

int fl_ps_sparse_set_opts(fl_ps_sparse *t, const fl_ps_sparse_opts *o) {
    FL_ASSERT(t && o);
    int rc = fl_ps_sparse_opts_check(o);
    if (rc < 0)
        return fl_fail_prefix(rc, "ps sparse table %d", t->table);
    if (t->rows > 0 || t->cand.used > 0)
        return fl_fail(FL_ESTATE, "ps sparse table %d: life cycle set after %lld rows were "
                       "created", t->table, (long long)t->rows);
    t->opts = *o;
    return FL_OK;
}

void fl_ps_sparse_free(fl_ps_sparse *t) {
    if (!t)
        return;
    for (int64_t i = 0; i < t->nchunks; i++) {
        free(t->chunks[i].dirty);
        free(t->chunks[i].rows);
    }
    free(t->chunks);
    free(t->index.e);
    ps_cand_clear(&t->cand);
    free(t->pending.e);
    free(t->pids);
    free(t->psum);
    free(t->pcnt);
    free(t->scratch);
    free(t);
}

int fl_ps_sparse_dim(const fl_ps_sparse *t) { return t->dim; }
int64_t fl_ps_sparse_rows(const fl_ps_sparse *t) { return t->rows; }
int64_t fl_ps_sparse_candidates(const fl_ps_sparse *t) { return t->cand.used; }
int64_t fl_ps_sparse_passes(const fl_ps_sparse *t) { return t->passes; }
void fl_ps_sparse_set_passes(fl_ps_sparse *t, int64_t passes) { t->passes = passes; }
bool fl_ps_sparse_passed(const fl_ps_sparse *t) { return t->passed; }

size_t fl_ps_sparse_bytes(const fl_ps_sparse *t) {
    size_t b = sizeof *t + (size_t)t->chunks_cap * sizeof(chunk) +
               (size_t)t->nchunks * chunk_bytes(t) + (sizeof(entry) << t->index.bits) +
               (size_t)t->dim * sizeof(float) + ps_cand_bytes(&t->cand);
    if (t->pending.e)
        b += sizeof(entry) << t->pending.bits;
    b += (size_t)t->pcap * (sizeof(uint64_t) + (size_t)(t->dim + 2) * sizeof(float));
    return b;
}

int fl_ps_sparse_pull_rows_slots(fl_ps_sparse *t, const uint64_t *ids, int64_t n, float *out,
                                 int64_t *slots) {
    FL_ASSERT(t && (ids || n == 0) && (out || n == 0));
    size_t bytes = (size_t)t->dim * sizeof(float);
    bool create = t->opts.entry == FL_PS_ENTRY_NONE;
    for (int64_t i = 0; i < n; i++) {
        prefetch_ahead(t, ids, i, n);
        uint64_t h = index_hash(ids[i]), pos;
        int64_t s = index_find(t, ids[i], h, &pos);
        if (s < 0 && create && (s = create_row(t, ids[i], h, &pos)) < 0) {
            for (int64_t k = i; slots && k < n; k++)
                slots[k] = -1;
            return FL_ENOMEM;
        }
        if (slots)
            slots[i] = s;
        if (s < 0)
            memset(out + i * t->dim, 0, bytes);
        else
            memcpy(out + i * t->dim, row_at(t, s), bytes);
    }
    return FL_OK;
}

int fl_ps_sparse_pull_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, float *out) {
    return fl_ps_sparse_pull_rows_slots(t, ids, n, out, NULL);
}

/* The slot of row id for a push of `show` shows: found, or created when the entry rule admits
 * it; -1 when it does not (dropped); -2 out of memory (error set). */
int64_t ps_sparse_push_slot(fl_ps_sparse *t, uint64_t id, float show) {
    uint64_t h = index_hash(id), pos;
    int64_t s = index_find(t, id, h, &pos);
    if (s >= 0)
        return s;
    float carry;
    int a = admit(t, id, show, &carry);
    if (a <= 0)
        return a < 0 ? -2 : -1;
    if ((s = create_row(t, id, h, &pos)) < 0)
        return -2;
    record_at(t, s)[SHOW_AT] = carry;
    return s;
}

/* slots[i] (NULL: none) is a hint: the slot still holding row ids[i] (live, that id) is used
 * as it is, any other is looked up. Prefetches as prefetch_ahead does, from the hints. */
static inline int64_t hinted_slot(const fl_ps_sparse *t, const int64_t *slots, int64_t i,
                                  uint64_t id) {
    int64_t s = slots ? slots[i] : -1;
    if (s < 0 || s >= t->slots)
        return -1;
    const float *rec = record_at(t, s);
    uint64_t at;
    memcpy(&at, rec, sizeof at);
    return !(meta_of(rec) & META_FREE) && at == id ? s : -1;
}

static inline void prefetch_slot(const fl_ps_sparse *t, const int64_t *slots, int64_t i,
                                 int64_t n) {
    if (i + AHEAD / 2 < n && slots[i + AHEAD / 2] >= 0 && slots[i + AHEAD / 2] < t->slots) {
        const float *rec = record_at(t, slots[i + AHEAD / 2]);
        __builtin_prefetch(rec, 1);
        __builtin_prefetch(rec + t->stride - 1, 1);
    }
}

int fl_ps_sparse_push_rows_slots(fl_ps_sparse *t, const uint64_t *ids, const int64_t *slots,
                                 int64_t n, const float *g, const float *shows,
                                 const float *clicks, double lr) {
    FL_ASSERT(t && (ids || n == 0) && (g || n == 0));
    for (int64_t i = 0; i < n; i++) {
        if (slots)
            prefetch_slot(t, slots, i, n);
        else
            prefetch_ahead(t, ids, i, n);
        float show = shows ? shows[i] : 1, click = clicks ? clicks[i] : 0;
        int64_t s = hinted_slot(t, slots, i, ids[i]);
        if (s < 0)
            s = ps_sparse_push_slot(t, ids[i], show);
        if (s == -2)
            return FL_ENOMEM;
        if (s < 0)
            continue;
        count_push(t, s, show, click);
        float *row = row_at(t, s);
        fl_ps_rule_apply(&t->rule, lr, row, g + i * t->dim, row + t->dim, t->dim);
        set_dirty(t, s);
    }
    return FL_OK;
}

int fl_ps_sparse_push_rows_counts(fl_ps_sparse *t, const uint64_t *ids, int64_t n,
                                  const float *g, const float *shows, const float *clicks,
                                  double lr) {
    return fl_ps_sparse_push_rows_slots(t, ids, NULL, n, g, shows, clicks, lr);
}

int fl_ps_sparse_add_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *d) {
    FL_ASSERT(t && (ids || n == 0) && (d || n == 0));
    for (int64_t i = 0; i < n; i++) {
        int64_t s = ps_sparse_find_or_create(t, ids[i]);
        if (s < 0)
            return FL_ENOMEM;
        float *row = row_at(t, s);
        for (int k = 0; k < t->dim; k++)
            row[k] += d[i * t->dim + k];
        set_dirty(t, s);
    }
    return FL_OK;
}

int fl_ps_sparse_push_rows(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *g,
                           double lr) {
    return fl_ps_sparse_push_rows_counts(t, ids, n, g, NULL, NULL, lr);
}

