/* group.c - a subset of an fl_peers' ranks as an fl_peers of its own (group.h): ranks are
 * translated on the way through, so chunks, deadlines and failures are the parent's. */
#include "group.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    fl_peers  peers;   /* first: the interface */
    fl_peers *parent;  /* borrowed */
    int      *members; /* [size]: group rank -> parent rank */
} group;

static int parent_rank(const group *g, int r) { return r < 0 ? -1 : g->members[r]; }

static int group_sendrecv(fl_peers *p, int to, const void *sbuf, size_t sbytes, int from,
                          void *rbuf, size_t rbytes, fl_recv_fn on_recv, void *ctx) {
    group *g = (group *)p;
    FL_ASSERT(to < p->size && from < p->size);
    return fl_peers_sendrecv(g->parent, parent_rank(g, to), sbuf, sbytes, parent_rank(g, from),
                             rbuf, rbytes, on_recv, ctx);
}

static const char *group_name(const fl_peers *p, int r) {
    const group *g = (const group *)p;
    if (r < 0 || r >= p->size)
        return "rank ?";
    return fl_peers_name(g->parent, g->members[r]);
}

static void group_free(fl_peers *p) {
    group *g = (group *)p;
    free(g->members);
    free(g);
}

static const struct fl_peers_ops group_ops = {
    .sendrecv = group_sendrecv, .peer_name = group_name, .free = group_free};

fl_peers *fl_group_new(fl_peers *parent, const int *members, int n) {
    FL_ASSERT(parent && members && n >= 1 && n <= parent->size);
    group *g = calloc(1, sizeof *g);
    int *m = malloc((size_t)n * sizeof *m);
    if (!g || !m) {
        free(g);
        free(m);
        fl_fail(FL_ENOMEM, "comm: out of memory for a group of %d ranks", n);
        return NULL;
    }
    int me = -1;
    for (int i = 0; i < n; i++) {
        FL_ASSERT(members[i] >= 0 && members[i] < parent->size);
        m[i] = members[i];
        if (m[i] == parent->rank)
            me = i;
    }
    FL_ASSERT(me >= 0);
    g->peers = (fl_peers){.ops = &group_ops, .rank = me, .size = n};
    g->parent = parent;
    g->members = m;
    return &g->peers;
}
