/* hier_views.c - the hierarchical allreduce composed of its node and cross views' own
 * collectives, for backends whose node group is not one of fleet's transports: with
 * comm.backend nccl the node view is an NCCL communicator of the node's GPUs (NVLink, PCIe)
 * and the cross view is tcp over fleet's own connections between the nodes (issue 15: "NCCL
 * inside the node and tcp between nodes"). The tcp backend itself runs hier.c, which fuses the
 * same three steps over its peers with bounded scratch. Whether an allreduce is hierarchical
 * is comm.c's one choice for every backend (hierarchical_now); each backend's hier_allreduce
 * entry says which of the two runs.
 *
 * Steps (Jia et al. 2018, sec. 4, as hier.c): the node's sum by the node view's allreduce;
 * this local rank's segment (fl_ring_segment: any count, segments differ by at most one
 * element) allreduced among the nodes by the cross view, every local rank over its own share of
 * the slow link in parallel; the segments handed round the node by the node view's allgatherv,
 * in place. The slow link carries 2 (M - 1) / M of the buffer per node in all, as hier.c's;
 * inside the node an allreduce is used where hier.c reduce-scatters (NCCL's reduce-scatter
 * takes equal blocks only): (L - 1) / L of the buffer more on the fast link.
 *
 * avg sums throughout and divides by L * M once (fl_reduce_finalize), on the segment, so every
 * rank gets the same bits (each segment is finalised on one local rank and then copied). */
#include "hier_views.h"

#include "algorithms.h"

#include "fleet/status.h"

#include <stdlib.h>

int fl_hier_views_allreduce(fl_comm *c, void *buf, size_t count, fl_dtype t, fl_redop op) {
    fl_comm *node = c->node_view, *cross = c->cross_view;
    FL_ASSERT(node && cross);
    int L = node->size, M = cross->size, l = node->rank;
    size_t es = fl_dtype_size(t), off, len;
    fl_redop inner = op == FL_REDOP_AVG ? FL_REDOP_SUM : op;
    if (count == 0)
        return 0;
    if (L > 1)
        FL_TRY(node->ops->allreduce(node, buf, count, t, inner));
    fl_ring_segment(count, L, l, &off, &len);
    char *seg = (char *)buf + off * es;
    if (M > 1 && len > 0)
        FL_TRY(cross->ops->allreduce(cross, seg, len, t, inner));
    fl_reduce_finalize(seg, len, t, op, L * M);
    if (L == 1)
        return 0;
    size_t *counts = malloc((size_t)L * sizeof *counts);
    if (!counts)
        return fl_fail(FL_ENOMEM, "comm: out of memory");
    for (int i = 0; i < L; i++) {
        size_t o;
        fl_ring_segment(count, L, i, &o, &counts[i]);
    }
    int rc = node->ops->allgatherv(node, seg, buf, counts, t);
    free(counts);
    return rc;
}
