/* ctr_impl.h - what the CTR data files (ctr_batch.c, criteo_line.c, ctr_synth.c) share
 * privately: growing a batch before writing a sample in place at its end. */
#ifndef FLEET_CTR_IMPL_H
#define FLEET_CTR_IMPL_H

#include "fleet/ctr.h"

/* Makes room for `samples` samples and `ids` ids in all (doubling), so that a sample can be
 * written past the end and committed by b->batch++ once it is whole. FL_ENOMEM leaves b as it
 * was. */
int fl_ctr_batch_reserve(fl_ctr_batch *b, int64_t samples, int64_t ids);

#endif /* FLEET_CTR_IMPL_H */
