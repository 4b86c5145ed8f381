/* alltoall.c - the personalised exchange (alltoallv) over the transport's pairs, by pairwise
 * exchange (Thakur, Rabenseifner & Gropp 2005, sec. 4.6): in step s = 1 .. n-1 rank r sends its
 * block for rank r+s while receiving rank r-s's block for it, so every step is one full-duplex
 * exchange per rank and no rank waits on two peers at once. n - 1 steps; each rank sends and
 * receives exactly its own blocks (no forwarding): the volume is what the counts say, which is
 * what sparse collectives built on it need. */
#include "algorithms.h"

#include "fleet/status.h"

#include <string.h>

int fl_pairwise_alltoallv(fl_peers *tp, const void *in, const size_t *send_counts, void *out,
                          const size_t *recv_counts, size_t es) {
    int r = fl_peers_rank(tp), n = fl_peers_size(tp);
    const char *src = in;
    char *dst = out;
    /* this rank's block offsets and the totals, in one pass */
    size_t stotal = 0, rtotal = 0, my_soff = 0, my_roff = 0;
    for (int j = 0; j < n; j++) {
        if (j == r) {
            my_soff = stotal;
            my_roff = rtotal;
        }
        stotal += send_counts[j] * es;
        rtotal += recv_counts[j] * es;
    }
    if (send_counts[r]) /* its own block (comm.c checked that both counts agree) */
        memcpy(dst + my_roff, src + my_soff, send_counts[r] * es);
    /* the offsets walk with the peers: `to` goes up (wrapping to block 0), `from` goes down
     * (wrapping to the last block), so a call costs O(n), not O(n^2) */
    size_t so = my_soff, ro = my_roff;
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n, from = (r - s + n) % n;
        so = to == 0 ? 0 : so + send_counts[to - 1] * es;
        ro = from == n - 1 ? rtotal - recv_counts[n - 1] * es : ro - recv_counts[from] * es;
        FL_TRY(fl_peers_sendrecv(tp, to, src + so, send_counts[to] * es, from, dst + ro,
                                     recv_counts[from] * es, NULL, NULL));
    }
    return 0;
}
