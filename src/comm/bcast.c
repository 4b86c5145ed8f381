/* bcast.c - broadcast: a binomial tree for small messages (ceil(log2 p) rounds, latency-bound),
 * and for large ones a pipelined chain root -> root+1 -> ... -> root-1 in which each rank
 * forwards chunk k to the right while receiving chunk k+1 from the left (full duplex).
 *
 * Why a chain and not scatter + allgather (van de Geijn): on a full-duplex network the chain
 * moves the buffer over every link once and finishes in about (bytes + (p-2) * chunk) / bw,
 * while scatter + allgather needs about 2 (p-1)/p * bytes / bw, nearly twice as long for large
 * buffers; its only cost is the pipeline's fill time, which a chunk of a few hundred KiB keeps
 * small. Both are deterministic: broadcast copies, it never combines. */
#include "algorithms.h"

#include "fleet/status.h"

int fl_bcast_tree(fl_peers *tp, void *buf, size_t nbytes, int root) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    int v = (r - root + n) % n; /* rank relative to the root */
    int mask = 1;
    /* receive from the parent: v with its lowest set bit cleared */
    while (mask < n) {
        if (v & mask) {
            int parent = (v - mask + root) % n;
            FL_TRY(fl_peers_sendrecv(tp, -1, NULL, 0, parent, buf, nbytes, NULL, NULL));
            break;
        }
        mask <<= 1;
    }
    /* send to the children v + mask/2, v + mask/4, ..., v + 1 (the farthest subtree first) */
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (v + mask < n) {
            int child = (v + mask + root) % n;
            FL_TRY(fl_peers_sendrecv(tp, child, buf, nbytes, -1, NULL, 0, NULL, NULL));
        }
    }
    return 0;
}

int fl_bcast_chain(fl_peers *tp, void *buf, size_t nbytes, int root, size_t chunk) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    int v = (r - root + n) % n;
    int left = v > 0 ? (r - 1 + n) % n : -1;
    int right = v < n - 1 ? (r + 1) % n : -1;
    char *b = buf;
    if (chunk == 0)
        chunk = nbytes;
    size_t nchunks = (nbytes + chunk - 1) / chunk;
    /* step k: send chunk k-1 to the right while receiving chunk k from the left */
    for (size_t k = 0; k <= nchunks; k++) {
        int to = k > 0 ? right : -1, from = k < nchunks ? left : -1;
        if (to < 0 && from < 0)
            continue;
        size_t soff = k > 0 ? (k - 1) * chunk : 0, roff = k * chunk;
        size_t slen = to < 0 ? 0 : (nbytes - soff < chunk ? nbytes - soff : chunk);
        size_t rlen = from < 0 ? 0 : (nbytes - roff < chunk ? nbytes - roff : chunk);
        FL_TRY(fl_peers_sendrecv(tp, to, b + soff, slen, from, b + roff, rlen, NULL, NULL));
    }
    return 0;
}
