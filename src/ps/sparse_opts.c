/* sparse_opts.c - a sparse table's life-cycle options (fl_ps_sparse_opts in include/fleet/ps.h):
 * defaults that keep every row forever, and the range checks, after Paddle's
 * CtrCommonAccessor parameters (show_click_decay_rate, delete_threshold,
 * delete_after_unseen_days, nonclk_coeff, click_coeff) and entry attributes. */
#include "fleet/ps.h"

#include "fleet/status.h"

#include <math.h>

void fl_ps_sparse_opts_defaults(fl_ps_sparse_opts *o) {
    FL_ASSERT(o);
    *o = (fl_ps_sparse_opts){.entry = FL_PS_ENTRY_NONE, .entry_count = 1,
                             .entry_probability = 1, .show_click_decay = 1,
                             .delete_threshold = 0, .nonclk_coeff = 0.1, .click_coeff = 1,
                             .delete_after_unseen = 0};
}

const char *fl_ps_entry_name(fl_ps_entry_type e) {
    switch (e) {
    case FL_PS_ENTRY_NONE: return "none";
    case FL_PS_ENTRY_COUNT: return "count";
    case FL_PS_ENTRY_PROBABILITY: return "probability";
    }
    return NULL;
}

int fl_ps_sparse_opts_check(const fl_ps_sparse_opts *o) {
    FL_ASSERT(o);
    if (!fl_ps_entry_name(o->entry))
        return fl_fail(FL_ECONFIG, "ps sparse table: entry %d is none of none, count, "
                       "probability", (int)o->entry);
    if (o->entry == FL_PS_ENTRY_COUNT && !(o->entry_count >= 1 && o->entry_count <= 1e9))
        return fl_fail(FL_ECONFIG, "ps sparse table: entry count %g outside [1, 1e9]",
                       o->entry_count);
    if (o->entry == FL_PS_ENTRY_PROBABILITY &&
        !(o->entry_probability >= 0 && o->entry_probability <= 1))
        return fl_fail(FL_ECONFIG, "ps sparse table: entry probability %g outside [0, 1]",
                       o->entry_probability);
    if (!(o->show_click_decay > 0 && o->show_click_decay <= 1))
        return fl_fail(FL_ECONFIG, "ps sparse table: show_click_decay %g outside (0, 1]",
                       o->show_click_decay);
    if (!(o->delete_threshold >= 0 && isfinite(o->delete_threshold)))
        return fl_fail(FL_ECONFIG, "ps sparse table: delete_threshold %g is not a finite "
                       "number >= 0", o->delete_threshold);
    if (!(o->nonclk_coeff >= 0 && isfinite(o->nonclk_coeff)))
        return fl_fail(FL_ECONFIG, "ps sparse table: nonclk_coeff %g is not a finite number "
                       ">= 0", o->nonclk_coeff);
    if (!(o->click_coeff >= 0 && isfinite(o->click_coeff)))
        return fl_fail(FL_ECONFIG, "ps sparse table: click_coeff %g is not a finite number "
                       ">= 0", o->click_coeff);
    if (o->delete_after_unseen < 0 || o->delete_after_unseen > 65535)
        return fl_fail(FL_ECONFIG, "ps sparse table: delete_after_unseen %d outside [0, 65535]",
                       o->delete_after_unseen);
    return FL_OK;
}
