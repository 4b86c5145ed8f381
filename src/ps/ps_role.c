/* ps_role.c - who this process is in a parameter-server job: Paddle's role maker over the
 * environment fleetrun exports (TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM,
 * PADDLE_TRAINER_ID, POD_IP, PADDLE_PORT, ...), the handle's life cycle and its accessors.
 * Every refusal names the variable and its value. */
#include "ps_impl.h"

#include "comm/comm_impl.h"
#include "comm/wire.h"
#include "fleet/log.h"
#include "fleet/status.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *env_get(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static int parse_int(const char *name, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || isspace((unsigned char)v[0]))
        return fl_fail(FL_ECONFIG, "%s=%s is not an integer", name, v);
    if (n < lo || n > hi)
        return fl_fail(FL_ECONFIG, "%s=%s is out of range (%ld..%ld)", name, v, lo, hi);
    *out = n;
    return 0;
}

static uint64_t fnv1a(uint64_t h, const char *s) {
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

int fl_ps_create(const fl_ps_roles *r, fl_ps **out) {
    FL_ASSERT(r && out && r->servers);
    *out = NULL;
    if (r->nservers < 1 || r->nservers > FL_PS_MAX_SERVERS)
        return fl_fail(FL_ECONFIG, "%d parameter servers (1..%d)", r->nservers,
                       FL_PS_MAX_SERVERS);
    if (r->nworkers < 1 || r->nservers + r->nworkers > FL_COMM_MAX_RANKS)
        return fl_fail(FL_ECONFIG, "%d workers beside %d servers (at most %d ranks in all)",
                       r->nworkers, r->nservers, FL_COMM_MAX_RANKS);
    int of = r->server ? r->nservers : r->nworkers;
    if (r->index < 0 || r->index >= of)
        return fl_fail(FL_ECONFIG, "%s index %d out of range (0..%d)",
                       r->server ? "server" : "worker", r->index, of - 1);
    fl_ps *ps = calloc(1, sizeof *ps);
    if (!ps)
        return fl_fail(FL_ENOMEM, "out of memory");
    ps->server = r->server;
    ps->index = r->index;
    ps->nservers = r->nservers;
    ps->nworkers = r->nworkers;
    ps->msg = r->msg;
    ps->msg.world = r->nservers + r->nworkers;
    ps->listen_fd = r->listen_fd;
    ps->resume_step = -1;
    ps->servers = calloc((size_t)r->nservers, sizeof *ps->servers);
    if (r->workers)
        ps->workers = calloc((size_t)r->nworkers, sizeof *ps->workers);
    if (!ps->servers || (r->workers && !ps->workers)) {
        fl_ps_free(ps);
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    for (int i = 0; i < r->nservers; i++)
        snprintf(ps->servers[i], FL_ENDPOINT_MAX, "%s", r->servers[i]);
    for (int i = 0; r->workers && i < r->nworkers; i++)
        snprintf(ps->workers[i], FL_ENDPOINT_MAX, "%s", r->workers[i]);
    *out = ps;
    return 0;
}

/* TRAINING_ROLE: *server true for PSERVER, false for TRAINER. */
static int read_role(const char **role, bool *server) {
    *role = env_get("TRAINING_ROLE");
    if (!*role)
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE is not set (PSERVER or TRAINER; fleetrun "
                       "--server_num/--worker_num sets it)");
    if (strcmp(*role, "PSERVER") == 0)
        *server = true;
    else if (strcmp(*role, "TRAINER") == 0)
        *server = false;
    else
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE=%s: expected PSERVER or TRAINER", *role);
    return 0;
}

/* A server's index: the entry of servers[0..ns) (PADDLE_PSERVERS_IP_PORT_LIST=slist) that
 * POD_IP and PADDLE_PORT name. */
static int server_index(char (*servers)[FL_ENDPOINT_MAX], int ns, const char *slist,
                        long *index) {
    const char *ip = env_get("POD_IP"), *port = env_get("PADDLE_PORT");
    if (!ip || !port)
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE=PSERVER needs POD_IP and PADDLE_PORT (%s is "
                       "not set)", ip ? "PADDLE_PORT" : "POD_IP");
    long p;
    FL_TRY(parse_int("PADDLE_PORT", port, 1, 65535, &p));
    char me[FL_ENDPOINT_MAX + 16];
    snprintf(me, sizeof me, strchr(ip, ':') && ip[0] != '[' ? "[%s]:%ld" : "%s:%ld", ip, p);
    for (int i = 0; i < ns; i++)
        if (fl_comm_same_endpoint(me, servers[i]))
            *index = i;
    if (*index < 0)
        return fl_fail(FL_ECONFIG, "POD_IP=%s PADDLE_PORT=%s (%s) is not an entry of "
                       "PADDLE_PSERVERS_IP_PORT_LIST=%s", ip, port, me, slist);
    return 0;
}

/* A worker's index: PADDLE_TRAINER_ID, one of nw (PADDLE_TRAINERS_NUM=num). */
static int worker_index(long nw, const char *num, long *index) {
    const char *id = env_get("PADDLE_TRAINER_ID");
    if (!id)
        return fl_fail(FL_ECONFIG, "TRAINING_ROLE=TRAINER needs PADDLE_TRAINER_ID");
    char what[64];
    snprintf(what, sizeof what, "PADDLE_TRAINER_ID");
    int rc = parse_int(what, id, 0, nw - 1, index);
    if (rc < 0)
        fl_fail_prefix(rc, "with PADDLE_TRAINERS_NUM=%s", num);
    return rc;
}

/* Without FLEET_JOB_TOKEN, a token derived from the job's servers and worker count, as the
 * collective transport does (comm/env.c): two jobs must not join by accident. */
static void derive_token(char *token, size_t cap, const char *slist, const char *num) {
    uint64_t a = fnv1a(14695981039346656037ull, "fleet-ps-token\n");
    uint64_t b = fnv1a(0x6a09e667f3bcc908ull, "fleet-ps-token\n");
    a = fnv1a(fnv1a(a, slist), num);
    b = fnv1a(fnv1a(b, slist), num);
    snprintf(token, cap, "derived-%016llx%016llx", (unsigned long long)a,
             (unsigned long long)b);
    FL_WARN("ps: FLEET_JOB_TOKEN is not set; using a token derived from "
            "PADDLE_PSERVERS_IP_PORT_LIST (fleetrun always sets one)");
}

/* The handle for roles read from the environment (endpoints borrowed; workers may be NULL). */
static int create_from(const fl_comm_env *env, bool server, long index,
                       char (*servers)[FL_ENDPOINT_MAX], int ns,
                       char (*workers)[FL_ENDPOINT_MAX], long nw, fl_ps **out) {
    const char *sp[FL_PS_MAX_SERVERS];
    for (int i = 0; i < ns; i++)
        sp[i] = servers[i];
    const char **wp = NULL;
    if (workers) {
        wp = calloc((size_t)nw, sizeof *wp);
        if (!wp)
            return fl_fail(FL_ENOMEM, "out of memory");
        for (int i = 0; i < nw; i++)
            wp[i] = workers[i];
    }
    fl_ps_roles r = {
        .server = server, .index = (int)index, .nservers = ns, .nworkers = (int)nw,
        .servers = sp, .workers = wp, .listen_fd = server ? env->listen_fd : -1,
        .msg = {.world = ns + (int)nw, .round = env->round, .encrypt = env->encrypt,
                .timeout_s = env->timeout_s},
    };
    memcpy(r.msg.token, env->token, sizeof r.msg.token);
    int rc = fl_ps_create(&r, out);
    free(wp);
    return rc;
}

int fl_ps_init(fl_ps **out) {
    FL_ASSERT(out);
    *out = NULL;
    fl_comm_env env;
    memset(&env, 0, sizeof env);
    env.timeout_s = 300.0;
    env.listen_fd = -1;
    env.gpu = -1;
    FL_TRY(fl_comm_env_knobs(&env));
    const char *role;
    bool server = false;
    FL_TRY(read_role(&role, &server));
    const char *slist = env_get("PADDLE_PSERVERS_IP_PORT_LIST");
    if (!slist)
        return fl_fail(FL_ECONFIG, "PADDLE_PSERVERS_IP_PORT_LIST is not set (TRAINING_ROLE=%s "
                       "needs the servers' endpoints)", role);
    const char *num = env_get("PADDLE_TRAINERS_NUM");
    if (!num)
        return fl_fail(FL_ECONFIG, "PADDLE_TRAINERS_NUM is not set (TRAINING_ROLE=%s)", role);
    char (*servers)[FL_ENDPOINT_MAX] = NULL, (*workers)[FL_ENDPOINT_MAX] = NULL;
    int ns = 0, nwl = 0, rc;
    long nw = 0, index = -1;
    rc = fl_comm_endpoints_split("PADDLE_PSERVERS_IP_PORT_LIST", slist, FL_PS_MAX_SERVERS,
                                 &servers, &ns);
    if (rc < 0)
        goto done;
    rc = parse_int("PADDLE_TRAINERS_NUM", num, 1, FL_COMM_MAX_RANKS - ns, &nw);
    if (rc < 0)
        goto done;
    const char *wlist = env_get("PADDLE_TRAINER_ENDPOINTS");
    if (wlist) {
        rc = fl_comm_endpoints_split("PADDLE_TRAINER_ENDPOINTS", wlist, FL_COMM_MAX_RANKS,
                                     &workers, &nwl);
        if (rc < 0)
            goto done;
        if (nwl != nw) {
            rc = fl_fail(FL_ECONFIG, "PADDLE_TRAINER_ENDPOINTS has %d entries but "
                         "PADDLE_TRAINERS_NUM=%s", nwl, num);
            goto done;
        }
    }
    rc = server ? server_index(servers, ns, slist, &index) : worker_index(nw, num, &index);
    if (rc < 0)
        goto done;
    if (!env.token[0] && ns + nw > 1)
        derive_token(env.token, sizeof env.token, slist, num);
    rc = create_from(&env, server, index, servers, ns, workers, nw, out);
done:
    free(servers);
    free(workers);
    return rc;
}

void fl_ps_free(fl_ps *ps) {
    if (!ps)
        return;
    fl_ps_server_free(ps->srv);
    fl_ps_client_free(ps->cli);
    free(ps->servers);
    free(ps->workers);
    free(ps);
}

bool fl_ps_is_server(const fl_ps *ps) { return ps && ps->server; }
bool fl_ps_is_worker(const fl_ps *ps) { return ps && !ps->server; }
int  fl_ps_server_num(const fl_ps *ps) { return ps->nservers; }
int  fl_ps_server_index(const fl_ps *ps) { return ps->server ? ps->index : -1; }
int  fl_ps_worker_num(const fl_ps *ps) { return ps->nworkers; }
int  fl_ps_worker_index(const fl_ps *ps) { return ps->server ? -1 : ps->index; }
const char *fl_ps_server_endpoint(const fl_ps *ps, int i) {
    return i >= 0 && i < ps->nservers ? ps->servers[i] : NULL;
}
void fl_ps_set_resume_step(fl_ps *ps, int64_t step) { ps->resume_step = step < 0 ? -1 : step; }
