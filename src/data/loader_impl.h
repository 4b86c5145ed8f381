/* loader_impl.h - what fl_loader and fl_prefetch share, so that both cut epochs into the same
 * batches: the config check, the epoch's permutation and a rank's slice of a global batch. */
#ifndef FLEET_DATA_LOADER_IMPL_H
#define FLEET_DATA_LOADER_IMPL_H

#include "fleet/data.h"

/* FL_EINVAL with a message for a config fl_loader_create refuses. */
int     fl_loader_check_config(const fl_dataset *ds, const fl_loader_config *cfg);
/* Global batches per epoch. */
int64_t fl_loader_count_steps(int64_t size, const fl_loader_config *cfg);
/* perm[0..size) = epoch's order: the identity, shuffled by stream (tag | epoch) of cfg->seed
 * when cfg->shuffle. */
void    fl_loader_epoch_order(int64_t *perm, int64_t size, const fl_loader_config *cfg,
                              int64_t epoch);
/* Positions [lo, hi) of the epoch's order that rank cfg->rank takes at `step`. */
void    fl_loader_slice(const fl_loader_config *cfg, int64_t size, int64_t step, int64_t *lo,
                        int64_t *hi);

#endif
