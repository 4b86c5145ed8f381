/* topology.c - where each rank sits: its node and its place among the ranks of that node, for
 * the fast paths inside a machine and the hierarchical collectives between machines. Read
 * from the launcher's variables (LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK as torchrun and
 * fleetrun set them; OMPI_COMM_WORLD_LOCAL_RANK/SIZE under mpirun), else derived from the
 * endpoints (ranks whose endpoints name the same host share a node), else every rank is a node
 * of its own. Setting LOCAL_WORLD_SIZE by hand emulates several nodes on one machine. */
#include "comm_impl.h"

#include "fleet/status.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *get(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* name=v as an int in [lo, hi], else FL_ECONFIG naming it */
static int read_int(const char *name, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return fl_fail(FL_ECONFIG, "%s=%s is not a number from %ld to %ld", name, v, lo, hi);
    *out = (int)x;
    return 0;
}

/* The host part of "host:port" or "[v6]:port" (length into *len). */
static const char *host_of(const char *ep, size_t *len) {
    if (ep[0] == '[') {
        const char *close = strchr(ep, ']');
        *len = close ? (size_t)(close - ep - 1) : strlen(ep);
        return ep + 1;
    }
    const char *colon = strrchr(ep, ':');
    *len = colon ? (size_t)(colon - ep) : strlen(ep);
    return ep;
}

static bool same_host(const char *a, const char *b) {
    size_t na, nb;
    const char *ha = host_of(a, &na), *hb = host_of(b, &nb);
    return na == nb && memcmp(ha, hb, na) == 0;
}

/* LOCAL_RANK and LOCAL_WORLD_SIZE (or mpirun's pair): both or neither. 1: read; 0: absent. */
static int from_vars(fl_comm_env *env, const char *rn, const char *sn) {
    const char *r = get(rn), *s = get(sn);
    if (!r && !s)
        return 0;
    if (!r || !s)
        return fl_fail(FL_ECONFIG, "%s is set but %s is not (the launcher sets both)",
                       r ? rn : sn, r ? sn : rn);
    FL_TRY(read_int(sn, s, 1, env->size, &env->local_size));
    FL_TRY(read_int(rn, r, 0, env->local_size - 1, &env->local_rank));
    env->nnodes = (env->size + env->local_size - 1) / env->local_size;
    const char *g = get("GROUP_RANK");
    if (g)
        FL_TRY(read_int("GROUP_RANK", g, 0, env->nnodes - 1, &env->node));
    else
        env->node = env->rank / env->local_size;
    return 1;
}

int fl_comm_env_topology(fl_comm_env *env) {
    env->local_rank = 0;
    env->local_size = 1;
    env->node = env->rank;
    env->nnodes = env->size;
    int rc = from_vars(env, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    if (rc == 0)
        rc = from_vars(env, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
    if (rc != 0 || !env->endpoints)
        return rc < 0 ? rc : 0;
    /* from the endpoints: nodes numbered by first appearance */
    env->local_size = 0;
    env->nnodes = 0;
    for (int r = 0; r < env->size; r++) {
        int first = r;
        for (int q = 0; q < r && first == r; q++)
            if (same_host(env->endpoints[q], env->endpoints[r]))
                first = q;
        if (first == r)
            env->nnodes++;
        if (same_host(env->endpoints[r], env->endpoints[env->rank])) {
            if (r < env->rank)
                env->local_rank++;
            env->local_size++;
            if (r == first)
                env->node = env->nnodes - 1;
        }
    }
    return 0;
}
