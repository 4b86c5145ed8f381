/* dgc_batch.c - fl_backend_dgc_batch: DGC's accumulation, selection and encoding of many
 * tensors through a backend's batched entry where it has one (the cuda table: a few launches
 * and one wait for all), else through its per-tensor calls, which give the same results. */
#include "fleet/backend.h"

void fl_backend_dgc_batch(const fl_backend *be, int nt, const fl_dgc_batch_item *items,
                          const fl_dgc_accum_args *a, bool mask_u, int64_t *count, int32_t *idx,
                          float *scratch) {
    if (be->dgc_accumulate_select_batch) {
        be->dgc_accumulate_select_batch(nt, items, a, mask_u, count, idx, scratch);
        return;
    }
    for (int i = 0; i < nt; i++) {
        const fl_dgc_batch_item *t = &items[i];
        count[i] = be->dgc_accumulate_select(t->n, t->grad, t->w, t->u, t->v, a, t->k, idx,
                                             scratch, t->seed, t->hint, NULL);
        be->dgc_encode(idx, count[i], t->base, t->v, mask_u ? t->u : NULL, t->pairs);
    }
}
