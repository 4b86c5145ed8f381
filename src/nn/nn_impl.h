/* nn_impl.h - private to src/nn: what the layers share with the network, chiefly how each
 * parameter gets a random stream of its own (so one parameter's initial values do not depend on
 * how many numbers the others drew). */
#ifndef FLEET_NN_IMPL_H
#define FLEET_NN_IMPL_H

#include "fleet/nn.h"

/* Stream base of parameter initialisation: param j uses fl_rng_init(seed, NN_INIT_STREAM + j). */
#define NN_INIT_STREAM 0x1000u

/* The generator of a layer's i-th parameter, given the one fl_net_build passed to init
 * (which is that of parameter 0): the same seed, stream + i, position 0. */
static inline void nn_param_rng(const fl_rng *layer_rng, int i, fl_rng *out) {
    *out = *layer_rng;
    out->stream = layer_rng->stream + (uint64_t)i;
    out->position = 0;
    out->used = 4;
}

/* Fills t (F32 or F64) with U(-bound, bound). */
void nn_fill_uniform(fl_tensor *t, fl_rng *r, double bound);

#endif /* FLEET_NN_IMPL_H */
