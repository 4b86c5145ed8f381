/* optim_impl.h - private to src/optim: the LARS update that optim.c calls per parameter. */
#ifndef FLEET_OPTIM_IMPL_H
#define FLEET_OPTIM_IMPL_H

#include "fleet/optim.h"

/* FL_EINVAL naming the field when the LARS fields of c are out of range. */
int lars_check_config(const fl_optim_config *c);
/* One LARS momentum step of parameter p, whose LARS decay is d (lars_decay_of), with velocity
 * v (optim.h gives the formula). scratch holds at least p's bytes when c->weight_decay > 0 (it
 * receives g + weight_decay * w). */
void lars_update(const fl_backend *k, fl_dtype t, const fl_optim_config *c, fl_param *p,
                 double d, void *v, void *scratch, double lr);
/* The LARS weight decay of the parameter named name: 0 where exclude_from_weight_decay names
 * it, else lars_weight_decay. */
double lars_decay_of(const fl_optim_config *c, const char *name);

#endif /* FLEET_OPTIM_IMPL_H */
