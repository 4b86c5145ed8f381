/* table_sparse_visit.c - a sparse table's rows and entry candidates visited (checkpoints and
 * delta saves, in id order), put back (loading) and cleared. */
#include "table_sparse_impl.h"

#include "core/sort.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

/* ---- visiting, saving, loading ---- */
static inline fl_ps_row_stat stat_at(const fl_ps_sparse *t, int64_t s) {
    const float *rec = record_at(t, s);
    return (fl_ps_row_stat){rec[SHOW_AT], rec[CLICK_AT], (int)(meta_of(rec) & META_UNSEEN)};
}

int fl_ps_sparse_visit(const fl_ps_sparse *t, bool only_dirty, fl_ps_row_fn fn, void *ctx) {
    FL_ASSERT(t && fn);
    int64_t n = 0;
    for (int64_t s = 0; s < t->slots; s++)
        n += only_dirty ? is_dirty(t, s) : !is_free(t, s);
    if (n == 0)
        return FL_OK;
    fl_key_pair *a, *tmp;
    FL_TRY(ps_sparse_sort_arrays(t, n, "rows by id", &a, &tmp));
    int64_t k = 0;
    for (int64_t s = 0; s < t->slots; s++)
        if (only_dirty ? is_dirty(t, s) : !is_free(t, s))
            a[k++] = (fl_key_pair){id_at(t, s), (uint64_t)s};
    fl_key_pair *sorted = fl_sort_key_pairs(a, tmp, n);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        int64_t s = (int64_t)sorted[i].value;
        const float *row = row_at(t, s);
        fl_ps_row_stat st = stat_at(t, s);
        rc = fn(ctx, sorted[i].key, row, row + t->dim, &st);
    }
    free(a);
    free(tmp);
    return rc;
}

void fl_ps_sparse_mark_clean(fl_ps_sparse *t) {
    FL_ASSERT(t);
    for (int64_t i = 0; i < t->nchunks; i++)
        memset(t->chunks[i].dirty, 0, (size_t)chunk_rows(t) / 64 * sizeof(uint64_t));
    t->passed = false;
}

int fl_ps_sparse_put(fl_ps_sparse *t, uint64_t id, const float *values, const float *state,
                     const fl_ps_row_stat *st) {
    FL_ASSERT(t && values);
    int64_t s = ps_sparse_find_or_create(t, id);
    if (s < 0)
        return FL_ENOMEM;
    float *rec = record_at(t, s), *row = rec + HEAD_FLOATS;
    memcpy(row, values, (size_t)t->dim * sizeof *row);
    if (state)
        memcpy(row + t->dim, state, (size_t)(t->stride - HEAD_FLOATS - t->dim) * sizeof *row);
    else
        fl_ps_rule_state_init(&t->rule, row + t->dim, t->dim);
    rec[SHOW_AT] = st ? st->show : 0;
    rec[CLICK_AT] = st ? st->click : 0;
    int unseen = st ? st->unseen : 0;
    set_meta(rec, unseen < 0 ? 0u : unseen > (int)META_UNSEEN ? META_UNSEEN : (uint32_t)unseen);
    set_dirty(t, s);
    return FL_OK;
}

typedef struct {
    fl_ps_cand_fn fn;
    void         *ctx;
} cand_visit;

static int visit_one(void *ctx, const ps_cand_entry *e) {
    cand_visit *v = ctx;
    return v->fn(v->ctx, e->id, e->seen, e->unseen);
}

int fl_ps_sparse_visit_candidates(const fl_ps_sparse *t, fl_ps_cand_fn fn, void *ctx) {
    FL_ASSERT(t && fn);
    cand_visit v = {fn, ctx};
    return ps_cand_visit(&t->cand, visit_one, &v);
}

int fl_ps_sparse_put_candidate(fl_ps_sparse *t, uint64_t id, float seen, int unseen) {
    FL_ASSERT(t);
    ps_cand_entry *e = ps_cand_get(&t->cand, id, true);
    if (!e)
        return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory for %lld entry candidates",
                       t->table, (long long)t->cand.used + 1);
    e->seen = seen;
    e->unseen = (uint16_t)(unseen < 0 ? 0 : unseen > UINT16_MAX ? UINT16_MAX : unseen);
    return FL_OK;
}

void fl_ps_sparse_clear_candidates(fl_ps_sparse *t) {
    FL_ASSERT(t);
    ps_cand_clear(&t->cand);
}
