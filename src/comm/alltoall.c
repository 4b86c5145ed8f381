/* alltoall.c - the personalised exchange (alltoallv) over the transport's pairs, by pairwise
 * exchange (Thakur, Rabenseifner & Gropp 2005, sec. 4.6): in step s = 1 .. n-1 rank r sends its
 * block for rank r+s while receiving rank r-s's block for it, so every step is one full-duplex
 * exchange per rank and no rank waits on two peers at once. n - 1 steps; each rank sends and
 * receives exactly its own blocks (no forwarding): the volume is what the counts say, which is
 * what sparse collectives built on it need. */
#include "tcp.h"

#include "fleet/status.h"

#include <string.h>

int fl_pairwise_alltoallv(fl_transport *tp, const void *in, const size_t *send_counts, void *out,
                          const size_t *recv_counts, size_t es) {
    int r = fl_transport_rank(tp), n = fl_transport_size(tp);
    const char *src = in;
    char *dst = out;
    /* block offsets, walked once: sofs/rofs of rank j's block */
    size_t soff = 0, roff = 0, my_soff = 0, my_roff = 0;
    for (int j = 0; j < n; j++) {
        if (j == r) {
            my_soff = soff;
            my_roff = roff;
        }
        soff += send_counts[j] * es;
        roff += recv_counts[j] * es;
    }
    if (send_counts[r] != recv_counts[r])
        return fl_fail(FL_EINVAL, "alltoallv: rank %d sends itself %zu elements but expects %zu",
                       r, send_counts[r], recv_counts[r]);
    if (send_counts[r])
        memcpy(dst + my_roff, src + my_soff, send_counts[r] * es);
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n, from = (r - s + n) % n;
        size_t so = 0, ro = 0;
        for (int j = 0; j < to; j++)
            so += send_counts[j] * es;
        for (int j = 0; j < from; j++)
            ro += recv_counts[j] * es;
        FL_TRY(fl_transport_sendrecv(tp, to, src + so, send_counts[to] * es, from, dst + ro,
                                     recv_counts[from] * es, NULL, NULL));
    }
    return 0;
}
