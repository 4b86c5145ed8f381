/* hier_views.h - the hierarchical allreduce over a communicator's node and cross views' own
 * backends (hier_views.c): for a backend whose views are not fleet's peers (nccl). */
#ifndef FLEET_COMM_HIER_VIEWS_H
#define FLEET_COMM_HIER_VIEWS_H

#include "comm_impl.h"

/* buf (count, host memory unless both views' backends take the caller's memory) becomes op
 * over all of c's ranks: node allreduce, cross allreduce of this local rank's segment, node
 * allgatherv. c must be split (c->node_view, c->cross_view) with ranks numbered node by node;
 * runs on c's comm thread, inside c's own collective: the views' ops are called directly.
 * Results are the same bits on every rank; they differ from a flat allreduce in rounding only
 * (the order of the sum is node first). Fails with the first view's error. */
int fl_hier_views_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op);

#endif /* FLEET_COMM_HIER_VIEWS_H */
