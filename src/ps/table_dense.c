/* table_dense.c - a dense block on its server: values, the rule's state and the sum of a sync
 * step's pushes, each one allocation made at declaration (nothing is allocated per step). */
#include "table.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

int fl_ps_block_init(fl_ps_block *b, int64_t numel, const fl_ps_rule *r) {
    FL_ASSERT(b && r);
    memset(b, 0, sizeof *b);
    if (numel < 1)
        return fl_fail(FL_EINVAL, "ps dense block: %lld values (want >= 1)", (long long)numel);
    FL_TRY(fl_ps_rule_check(r, false));
    int64_t nstate = numel * fl_ps_rule_state_per_value(r) + fl_ps_rule_state_per_row(r);
    b->numel = numel;
    b->value = calloc((size_t)numel, sizeof *b->value);
    b->accum = calloc((size_t)numel, sizeof *b->accum);
    b->state = malloc((size_t)(nstate ? nstate : 1) * sizeof *b->state);
    if (!b->value || !b->accum || !b->state) {
        fl_ps_block_clear(b);
        return fl_fail(FL_ENOMEM, "ps dense block: out of memory for %lld values",
                       (long long)numel);
    }
    fl_ps_rule_state_init(r, b->state, numel);
    return FL_OK;
}

void fl_ps_block_clear(fl_ps_block *b) {
    if (!b)
        return;
    free(b->value);
    free(b->state);
    free(b->accum);
    memset(b, 0, sizeof *b);
}

void fl_ps_block_accumulate(fl_ps_block *b, const float *g) {
    FL_ASSERT(b && b->accum && g);
    float *restrict a = b->accum;
    for (int64_t i = 0; i < b->numel; i++)
        a[i] += g[i];
    b->pushes++;
}

/* The mean gradient is rounded to f32 before the rule, as a collective's allreduce followed by
 * the ref backend's scale (x = (float)(x * a) in double) leaves it. */
void fl_ps_block_apply_accum(fl_ps_block *b, const fl_ps_rule *r, double lr, double scale) {
    FL_ASSERT(b && b->accum && r);
    float *a = b->accum;
    if (scale != 1.0)
        for (int64_t i = 0; i < b->numel; i++)
            a[i] = (float)((double)a[i] * scale);
    fl_ps_rule_apply(r, lr, b->value, a, b->state, b->numel);
    memset(a, 0, (size_t)b->numel * sizeof *a);
    b->pushes = 0;
}
