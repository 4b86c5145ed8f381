/* hier.c - hierarchical allreduce (Paddle Fleet's use_hierarchical_allreduce, Horovod's
 * HOROVOD_HIERARCHICAL_ALLREDUCE; the 2D scheme of Jia et al. 2018, "Highly scalable deep
 * learning training system with mixed-precision", sec. 4): ranks form nodes of L; inside a node
 * a ring reduce-scatter leaves local rank l with one segment of the node's sum; the ranks with
 * the same local rank on every node (the cross group) allreduce that segment among the M nodes,
 * every local rank in parallel over its own share of the link; a ring allgather inside the node
 * hands the result to all. Each node's link carries 2(M-1)/M of the buffer in all (1/L of it
 * per local rank) where the flat ring carries 2(N-1)/N of it per rank: L times less per node.
 *
 * Order of combination depends only on (L, M, count), so results are repeatable and the same
 * on every rank (the allgather distributes one value per segment); they differ from the flat
 * ring's in rounding only. avg is summed throughout and divided by L * M once. */
#include "algorithms.h"

#include "fleet/status.h"

int fl_hier_allreduce(fl_peers *node, fl_peers *cross, fl_scratch *s,
                      const fl_hier_tuning *tune, void *buf, size_t count, fl_dtype t,
                      fl_redop op) {
    int L = fl_peers_size(node), M = fl_peers_size(cross), l = fl_peers_rank(node);
    size_t es = fl_dtype_size(t);
    fl_redop inner = op == FL_REDOP_AVG ? FL_REDOP_SUM : op;
    if (count == 0)
        return 0;
    /* passes bound the node ring's scratch to one segment of seg_max_bytes, as the flat ring */
    size_t passes = fl_ring_passes(count, L, es, tune->seg_max_bytes);
    char *b = buf;
    for (size_t p = 0; p < passes; p++) {
        size_t m = count / passes + (p < count % passes ? 1 : 0), off, len;
        FL_TRY(fl_ring_reduce_scatter_inplace(node, s, b, m, t, inner));
        fl_ring_segment(m, L, fl_ring_owned(l, L), &off, &len);
        char *seg = b + off * es;
        if (M > 1 && len > 0) {
            if (len * es <= tune->rd_max_bytes)
                FL_TRY(fl_rd_allreduce(cross, s, seg, len, t, inner));
            else
                FL_TRY(fl_ring_allreduce(cross, s, tune->seg_max_bytes, seg, len, t, inner));
        }
        fl_reduce_finalize(seg, len, t, op, L * M);
        FL_TRY(fl_ring_allgather_inplace(node, b, m, es));
        b += m * es;
    }
    return 0;
}
