/* dgc_ledger.h - dist_train --check-dgc: DGC's bookkeeping checked from outside, update by
 * update, on every rank. With momentum correction on and masking off (so u after an update is
 * the u the accumulation made) and weight-decay correction on, the paper's step moves the
 * compressed parameters by what left the accumulators, summed over ranks:
 *     sum_r (v_r before + u_r after - v_r after) = N / lr * (w before - w after)
 * An entry that was sent and kept left v (the left side counts it, the right side applied it);
 * one never sent, or sent and then dropped by the sparse allreduce's threshold and returned,
 * is still in v (0 on both sides). A dropped entry that was not returned would count on the
 * left only. The left side is exact per rank (the same float sum the accumulation made). */
#ifndef FLEET_TESTS_DGC_LEDGER_H
#define FLEET_TESTS_DGC_LEDGER_H

#include "fleet/fleet.h"

typedef struct dgc_ledger dgc_ledger;

/* The ledger of dopt's compressed tensors (its "dgc.v.<param>" state, at most 64); NULL on
 * failure or without any. */
dgc_ledger *dgc_ledger_create(fl_dist_optim *dopt, fl_net *net);
/* Before an update: copies v and w. */
void dgc_ledger_before(dgc_ledger *l);
/* After it: checks the balance (collective over comm); keeps the largest relative error. */
int dgc_ledger_after(dgc_ledger *l, fl_comm *comm, double lr);
/* The largest |left - right| / max |right| over the updates checked so far. */
double dgc_ledger_worst(const dgc_ledger *l);
void   dgc_ledger_free(dgc_ledger *l);

#endif
