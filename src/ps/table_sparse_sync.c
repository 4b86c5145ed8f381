/* table_sparse_sync.c - a sparse table's pending sums (sync mode: every worker's rows of a step
 * added, in a small map of the index's kind, then applied once in id order by
 * fl_ps_sparse_apply_pending) and the life cycle's pass (rows whose decayed shows fall below
 * the threshold or unseen for too many passes removed, after Paddle's
 * CtrCommonAccessor::Shrink). */
#include "table_sparse_impl.h"

#include "core/sort.h"

#include "fleet/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- pending sums (sync) ---- */
static int pending_grow(fl_ps_sparse *t) {
    map bigger;
    if (ps_map_init(&bigger, t->pending.e ? t->pending.bits + 1 : INDEX_MIN_BITS) < 0)
        return FL_ENOMEM;
    for (int64_t k = 0; k < t->pending.used; k++)
        ps_map_place(&bigger, index_hash(t->pids[k]), (uint32_t)(k + 1));
    free(t->pending.e);
    t->pending = bigger;
    /* pids / psum / pcnt hold up to 3/4 of the map's entries */
    int64_t cap = (int64_t)(((uint64_t)3 << bigger.bits) / 4);
    uint64_t *ids = realloc(t->pids, (size_t)cap * sizeof *ids);
    if (!ids)
        return FL_ENOMEM;
    t->pids = ids;
    float *sum = realloc(t->psum, (size_t)cap * (size_t)t->dim * sizeof *sum);
    if (!sum)
        return FL_ENOMEM;
    t->psum = sum;
    float *cnt = realloc(t->pcnt, (size_t)cap * 2 * sizeof *cnt);
    if (!cnt)
        return FL_ENOMEM;
    t->pcnt = cnt;
    t->pcap = cap;
    return FL_OK;
}

int fl_ps_sparse_accumulate_counts(fl_ps_sparse *t, const uint64_t *ids, int64_t n,
                                   const float *g, const float *shows, const float *clicks) {
    FL_ASSERT(t && (ids || n == 0) && (g || n == 0));
    int dim = t->dim;
    for (int64_t i = 0; i < n; i++) {
        uint64_t id = ids[i], h = index_hash(id);
        map *m = &t->pending;
        int64_t k = -1;
        uint64_t p = 0;
        if (m->e) {
            uint64_t mask = map_mask(m);
            uint32_t tag = (uint32_t)h;
            for (p = map_home(m, h); m->e[p].slot1; p = (p + 1) & mask)
                if (m->e[p].tag == tag && t->pids[m->e[p].slot1 - 1] == id) {
                    k = (int64_t)m->e[p].slot1 - 1;
                    break;
                }
        }
        if (k < 0) {
            if (!m->e || m->used >= t->pcap) {
                if (pending_grow(t) < 0)
                    return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory for the "
                                   "pending sums of %lld rows", t->table,
                                   (long long)t->pending.used + 1);
            }
            k = m->used;
            t->pids[k] = id;
            memset(t->psum + k * dim, 0, (size_t)dim * sizeof(float));
            t->pcnt[2 * k] = t->pcnt[2 * k + 1] = 0;
            ps_map_place(m, h, (uint32_t)(k + 1));
        }
        float *restrict s = t->psum + k * dim;
        const float *gi = g + i * dim;
        for (int j = 0; j < dim; j++)
            s[j] += gi[j];
        t->pcnt[2 * k] += shows ? shows[i] : 1;
        t->pcnt[2 * k + 1] += clicks ? clicks[i] : 0;
    }
    return FL_OK;
}

int fl_ps_sparse_accumulate(fl_ps_sparse *t, const uint64_t *ids, int64_t n, const float *g) {
    return fl_ps_sparse_accumulate_counts(t, ids, n, g, NULL, NULL);
}

int fl_ps_sparse_apply_pending(fl_ps_sparse *t, double lr, double scale) {
    FL_ASSERT(t);
    int64_t n = t->pending.used;
    if (n == 0)
        return FL_OK;
    fl_key_pair *a, *tmp;
    FL_TRY(ps_sparse_sort_arrays(t, n, "pending rows", &a, &tmp));
    for (int64_t k = 0; k < n; k++)
        a[k] = (fl_key_pair){t->pids[k], (uint64_t)k};
    fl_key_pair *sorted = fl_sort_key_pairs(a, tmp, n);
    fl_key_pair *slots = sorted == a ? tmp : a;
    /* create every missing row the entry rule admits first, so that running out of memory
     * applies nothing */
    for (int64_t i = 0; i < n; i++) {
        int64_t s = ps_sparse_push_slot(t, sorted[i].key, t->pcnt[2 * sorted[i].value]);
        if (s == -2) {
            free(a);
            free(tmp);
            return FL_ENOMEM;
        }
        slots[i].value = (uint64_t)s; /* -1: dropped */
    }
    int dim = t->dim;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = (int64_t)slots[i].value;
        if (s < 0)
            continue;
        int64_t k = (int64_t)sorted[i].value;
        const float *sum = t->psum + k * dim;
        for (int j = 0; j < dim; j++)
            t->scratch[j] = (float)((double)sum[j] * scale);
        count_push(t, s, t->pcnt[2 * k], t->pcnt[2 * k + 1]);
        float *row = row_at(t, s);
        fl_ps_rule_apply(&t->rule, lr, row, t->scratch, row + dim, dim);
        set_dirty(t, s);
    }
    free(a);
    free(tmp);
    memset(t->pending.e, 0, sizeof(entry) << t->pending.bits);
    t->pending.used = 0;
    return FL_OK;
}

/* ---- the life cycle ---- */
int64_t fl_ps_sparse_pass(fl_ps_sparse *t) {
    FL_ASSERT(t);
    const fl_ps_sparse_opts *o = &t->opts;
    int max_unseen = o->delete_after_unseen;
    /* candidates first: the only step that allocates, so a failure changes nothing */
    if (ps_cand_pass(&t->cand, max_unseen) < 0)
        return fl_fail(FL_ENOMEM, "ps sparse table %d: out of memory pruning %lld entry "
                       "candidates", t->table, (long long)t->cand.used);
    float decay = (float)o->show_click_decay;
    int64_t removed = 0;
    for (int64_t s = 0; s < t->slots; s++) {
        float *rec = record_at(t, s);
        uint32_t m = meta_of(rec);
        if (m & META_FREE)
            continue;
        if (decay != 1) { /* Paddle's CtrCommonAccessor::Shrink: decay, then judge */
            rec[SHOW_AT] *= decay;
            rec[CLICK_AT] *= decay;
        }
        double show = rec[SHOW_AT], click = rec[CLICK_AT];
        double score = (show - click) * o->nonclk_coeff + click * o->click_coeff;
        uint32_t unseen = m & META_UNSEEN;
        if (score < o->delete_threshold || (max_unseen > 0 && unseen >= (uint32_t)max_unseen)) {
            ps_sparse_remove_row(t, s);
            removed++;
        } else if (unseen < META_UNSEEN) {
            set_meta(rec, m + 1);
        }
    }
    t->passes++;
    t->passed = true;
    return removed;
}
