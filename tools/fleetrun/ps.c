/* ps.c - parameter-server mode (DESIGN.md "Parameter-server mode"), as Paddle's launcher runs
 * it: `--server_num S --worker_num W` starts S servers and W workers on this machine, each on a
 * port of its own (free ports bound by fleetrun and handed over as FLEET_LISTEN_FD, or
 * --started_port P: servers P.., then workers); `--servers IP:PORT,... --workers IP:PORT,...`
 * names every process of a job across machines, and each machine's fleetrun starts the entries
 * whose address is its own (--node_ip, else an address of one of its interfaces: the rule
 * fleetrun uses to find its entry of --ips). A list and a count may be mixed (--servers with
 * --worker_num: the workers on this machine).
 *
 * Each process gets the environment Paddle's role maker reads (fl_ps_init, include/fleet/ps.h):
 *   servers  TRAINING_ROLE=PSERVER, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINER_ENDPOINTS,
 *            PADDLE_TRAINERS_NUM, POD_IP and PADDLE_PORT (its own endpoint)
 *   workers  TRAINING_ROLE=TRAINER, PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
 *            PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, PADDLE_PSERVERS_IP_PORT_LIST,
 *            POD_IP, PADDLE_PORT, FLAGS_selected_gpus (its index among this machine's workers)
 * and both the job's FLEET_JOB_TOKEN and FLEET_RESTART_COUNT (workers.c). The workers' variables
 * are those of a collective job too: they form a communicator among themselves. */
#define _GNU_SOURCE
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleetrun.h"

/* "IP:PORT" or "[IPv6]:PORT" into *e; -1 when it is neither. */
static int parse_endpoint(const char *s, ps_entry *e) {
    const char *colon;
    char ip[64];
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof ip)
            return -1;
        snprintf(ip, sizeof ip, "%.*s", (int)(close - s - 1), s + 1);
        colon = close + 1;
        if (fr_parse_ip(ip).family != AF_INET6)
            return -1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof ip)
            return -1;
        snprintf(ip, sizeof ip, "%.*s", (int)(colon - s), s);
        if (fr_parse_ip(ip).family != AF_INET)
            return -1;
    }
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port < 1 || port > 65535 || colon[1] == '+' ||
        colon[1] == '-' || colon[1] == ' ')
        return -1;
    snprintf(e->ip, sizeof e->ip, "%s", ip);
    e->port = (int)port;
    return 0;
}

/* --servers or --workers: the entries in order, each IP:PORT; *out allocated. 0 or 2. */
static int parse_list(const char *opt, const char *list, int max, ps_entry **out, int *n) {
    int count = 1;
    for (const char *p = list; *p; p++)
        count += *p == ',';
    if (count > max)
        return fr_arg_error("%s: %d entries, more than %d", opt, count, max);
    *out = calloc((size_t)count, sizeof **out);
    if (!*out)
        return fr_arg_error("out of memory");
    *n = 0;
    for (const char *p = list;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char entry[128];
        if (len == 0)
            return fr_arg_error("%s: entry %d is empty in '%s'", opt, *n + 1, list);
        if (len >= sizeof entry)
            return fr_arg_error("%s: entry %d is too long: '%.*s'", opt, *n + 1, (int)len, p);
        snprintf(entry, sizeof entry, "%.*s", (int)len, p);
        if (parse_endpoint(entry, &(*out)[*n]))
            return fr_arg_error("%s: '%s' (entry %d) is not IP:PORT (a numeric IPv4 address, "
                                "or [IPv6]:PORT; port 1..65535)", opt, entry, *n + 1);
        (*n)++;
        if (!c)
            break;
        p = c + 1;
    }
    return 0;
}

static const char *role_name(int server) { return server ? "server" : "worker"; }

/* Two entries of the job on one endpoint: refused, naming both. */
static int check_duplicates(const job *j) {
    int total = j->nservers + j->nworkers;
    for (int a = 0; a < total; a++) {
        const ps_entry *x = a < j->nservers ? &j->ps_servers[a] : &j->ps_workers[a - j->nservers];
        if (!x->port)
            continue;
        for (int b = a + 1; b < total; b++) {
            const ps_entry *y = b < j->nservers ? &j->ps_servers[b]
                                                : &j->ps_workers[b - j->nservers];
            if (y->port != x->port || !fr_ip_equal(fr_parse_ip(x->ip), fr_parse_ip(y->ip)))
                continue;
            char ep[ENDPOINT_MAX];
            fr_format_endpoint(ep, x->ip, x->port);
            int ia = a < j->nservers ? a : a - j->nservers;
            int ib = b < j->nservers ? b : b - j->nservers;
            return fr_arg_error("%s %d and %s %d are both on %s: every server and worker needs "
                                "an endpoint of its own", role_name(a < j->nservers), ia,
                                role_name(b < j->nservers), ib, ep);
        }
    }
    return 0;
}

/* The entries of a count: on this machine (--node_ip, else 127.0.0.1), ports from
 * --started_port (servers first) or bound by fleetrun later (port 0). */
static int counted(job *j, int n, int first_port, ps_entry **out) {
    *out = calloc((size_t)n, sizeof **out);
    if (!*out)
        return fr_arg_error("out of memory");
    for (int i = 0; i < n; i++) {
        snprintf((*out)[i].ip, sizeof (*out)[i].ip, "%s", j->o.ips[0]);
        (*out)[i].port = first_port ? first_port + i : 0;
        (*out)[i].local = true;
    }
    return 0;
}

int fr_ps_plan(job *j) {
    options *o = &j->o;
    int rc;
    if (o->servers_arg && (rc = parse_list("--servers", o->servers_arg, PS_MAX_SERVERS,
                                           &j->ps_servers, &j->nservers)))
        return rc;
    if (o->workers_arg && (rc = parse_list("--workers", o->workers_arg, PS_MAX_WORKERS,
                                           &j->ps_workers, &j->nworkers)))
        return rc;
    if (o->servers_arg && o->server_num && o->server_num != j->nservers)
        return fr_arg_error("--server_num %d but --servers lists %d endpoint(s)", o->server_num,
                            j->nservers);
    if (o->workers_arg && o->worker_num && o->worker_num != j->nworkers)
        return fr_arg_error("--worker_num %d but --workers lists %d endpoint(s)", o->worker_num,
                            j->nworkers);
    /* counted roles: on this machine, servers' ports first from --started_port */
    int port = o->port, ncounted = (o->servers_arg ? 0 : o->server_num) +
                                   (o->workers_arg ? 0 : o->worker_num);
    if (port && port + ncounted - 1 > 65535)
        return fr_arg_error("--started_port %d: ports %d..%d go past 65535", port, port,
                            port + ncounted - 1);
    if (!o->servers_arg) {
        j->nservers = o->server_num;
        if ((rc = counted(j, j->nservers, port, &j->ps_servers)))
            return rc;
        port = port ? port + j->nservers : 0;
    }
    if (!o->workers_arg) {
        j->nworkers = o->worker_num;
        if ((rc = counted(j, j->nworkers, port, &j->ps_workers)))
            return rc;
    }
    if ((rc = check_duplicates(j)))
        return rc;

    /* the listed entries that are this machine's */
    struct ifaddrs *ifs = NULL;
    if (!o->node_ip && getifaddrs(&ifs) < 0)
        return fr_arg_error("cannot list this machine's addresses (%s); pass --node_ip",
                            strerror(errno));
    ip_addr me = o->node_ip ? fr_parse_ip(o->node_ip) : (ip_addr){0};
    int nlocal = 0;
    for (int k = 0; k < j->nservers + j->nworkers; k++) {
        bool server = k < j->nservers;
        ps_entry *e = server ? &j->ps_servers[k] : &j->ps_workers[k - j->nservers];
        bool listed = server ? o->servers_arg != NULL : o->workers_arg != NULL;
        if (listed) {
            ip_addr a = fr_parse_ip(e->ip);
            e->local = o->node_ip ? fr_ip_equal(a, me) : fr_ifaddrs_have(ifs, a);
        }
        nlocal += e->local;
        j->ps_remote |= !e->local;
    }
    char addrs[1024] = "";
    if (ifs)
        fr_ifaddrs_ipv4(ifs, addrs, sizeof addrs);
    freeifaddrs(ifs);
    if (nlocal == 0) {
        fprintf(stderr, "fleetrun: error: no entry of --servers %s or --workers %s is on this "
                "machine (", o->servers_arg ? o->servers_arg : "(none)",
                o->workers_arg ? o->workers_arg : "(none)");
        if (o->node_ip)
            fprintf(stderr, "--node_ip %s)\n", o->node_ip);
        else
            fprintf(stderr, "its IPv4 addresses: %s)\n", addrs);
        fprintf(stderr, "hint: run this line on the machines the lists name, or pass --node_ip "
                "with this machine's address in them\n");
        return 2;
    }
    if (nlocal > MAX_NPROC)
        return fr_arg_error("%d servers and workers on this machine, more than %d", nlocal,
                            MAX_NPROC);
    if (j->ps_remote && o->max_restarts > 0)
        return fr_arg_error("--max_restarts with servers or workers on other machines: each "
                            "machine's fleetrun would restart its own alone; run every entry "
                            "on one machine to restart them together");
    o->nproc = nlocal;
    return 0;
}

void fr_ps_assign(job *j) {
    int i = 0, gpu = 0;
    for (int s = 0; s < j->nservers; s++)
        if (j->ps_servers[s].local) {
            j->w[i].role = ROLE_SERVER;
            j->w[i].rank = s;
            j->w[i].gpu[0] = '\0';
            i++;
        }
    for (int w = 0; w < j->nworkers; w++)
        if (j->ps_workers[w].local) {
            j->w[i].role = ROLE_WORKER;
            j->w[i].rank = w;
            snprintf(j->w[i].gpu, sizeof j->w[i].gpu, "%d", gpu++);
            i++;
        }
}

/* Whether port on ip is a listed entry's (fleetrun does not bind those: their programs do). */
static bool listed_port(const job *j, ip_addr a, int port) {
    for (int k = 0; k < j->nservers + j->nworkers; k++) {
        bool server = k < j->nservers;
        const ps_entry *e = server ? &j->ps_servers[k] : &j->ps_workers[k - j->nservers];
        bool listed = server ? j->o.servers_arg != NULL : j->o.workers_arg != NULL;
        if (listed && e->port == port && fr_ip_equal(fr_parse_ip(e->ip), a))
            return true;
    }
    return false;
}

/* A listening socket on a free port of e->ip for local process i, not a listed entry's port;
 * fills e->port. 0 or 1. */
static int bind_one(job *j, int i, ps_entry *e) {
    ip_addr a = fr_parse_ip(e->ip);
    int held[16], nheld = 0, rc = 1;
    while (nheld < 16) {
        struct sockaddr_storage ss;
        socklen_t len = fr_sockaddr(a, 0, &ss);
        int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 ||
            listen(fd, SOMAXCONN) < 0 || getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
            fr_say("error: cannot listen on %s for %s %d: %s", e->ip,
                   role_name(j->w[i].role == ROLE_SERVER), j->w[i].rank, strerror(errno));
            if (fd >= 0)
                close(fd);
            break;
        }
        int port = ntohs(a.family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                             : ((struct sockaddr_in6 *)&ss)->sin6_port);
        if (listed_port(j, a, port)) { /* held until a port is found, so it is not given again */
            held[nheld++] = fd;
            continue;
        }
        e->port = port;
        j->w[i].listen_fd = j->w[i].child_listen_fd = fd;
        rc = 0;
        break;
    }
    if (rc && nheld == 16)
        fr_say("error: no free port on %s for %s %d", e->ip,
               role_name(j->w[i].role == ROLE_SERVER), j->w[i].rank);
    while (nheld > 0)
        close(held[--nheld]);
    return rc;
}

/* "ep,ep,..." of n entries into eps and a fresh string. */
static char *join(const ps_entry *e, int n, char (*eps)[ENDPOINT_MAX]) {
    char *s = calloc((size_t)n, ENDPOINT_MAX);
    if (!s)
        return NULL;
    size_t used = 0;
    for (int k = 0; k < n; k++) {
        fr_format_endpoint(eps[k], e[k].ip, e[k].port);
        used += (size_t)sprintf(s + used, "%s%s", k ? "," : "", eps[k]);
    }
    return s;
}

int fr_ps_endpoints(job *j) {
    bool fresh = !j->o.port; /* counted entries get fleetrun's sockets, in every round */
    for (int i = 0; i < j->o.nproc; i++) {
        worker *w = &j->w[i];
        bool counted = w->role == ROLE_SERVER ? !j->o.servers_arg : !j->o.workers_arg;
        if (!counted || !fresh)
            continue;
        ps_entry *e = w->role == ROLE_SERVER ? &j->ps_servers[w->rank] : &j->ps_workers[w->rank];
        j->own_sockets = true;
        if (bind_one(j, i, e))
            return 1;
    }
    free(j->server_eps);
    free(j->servers_str);
    free(j->endpoints);
    free(j->endpoints_str);
    j->server_eps = calloc((size_t)j->nservers, sizeof *j->server_eps);
    j->endpoints = calloc((size_t)j->nworkers, sizeof *j->endpoints);
    j->servers_str = j->server_eps ? join(j->ps_servers, j->nservers, j->server_eps) : NULL;
    j->endpoints_str = j->endpoints ? join(j->ps_workers, j->nworkers, j->endpoints) : NULL;
    j->nranks = j->nworkers;
    if (!j->servers_str || !j->endpoints_str) {
        fr_say("error: out of memory");
        return 1;
    }
    return 0;
}

static void set_int(const char *name, int v) {
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

void fr_ps_child_env(const job *j, int i) {
    const worker *w = &j->w[i];
    bool server = w->role == ROLE_SERVER;
    const ps_entry *e = server ? &j->ps_servers[w->rank] : &j->ps_workers[w->rank];
    setenv("TRAINING_ROLE", server ? "PSERVER" : "TRAINER", 1);
    setenv("PADDLE_PSERVERS_IP_PORT_LIST", j->servers_str, 1);
    setenv("PADDLE_TRAINER_ENDPOINTS", j->endpoints_str, 1);
    set_int("PADDLE_TRAINERS_NUM", j->nworkers);
    setenv("POD_IP", e->ip, 1);
    set_int("PADDLE_PORT", e->port);
    /* the topology of the workers' communicator comes from their endpoints' hosts: the
     * per-node counts of a collective job need not hold here */
    unsetenv("LOCAL_RANK");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("GROUP_RANK");
    if (server) {
        unsetenv("PADDLE_TRAINER_ID");
        unsetenv("PADDLE_CURRENT_ENDPOINT");
        unsetenv("FLAGS_selected_gpus");
    } else {
        set_int("PADDLE_TRAINER_ID", w->rank);
        setenv("PADDLE_CURRENT_ENDPOINT", j->endpoints[w->rank], 1);
        setenv("FLAGS_selected_gpus", w->gpu, 1);
    }
}

int fr_ps_env_rows(const job *j, const char *(*rows)[2], int cap, char (*bufs)[32]) {
    const worker *w = NULL;
    for (int i = 0; i < j->o.nproc && !w; i++)
        if (j->w[i].role == ROLE_WORKER)
            w = &j->w[i];
    if (!w)
        w = &j->w[0];
    bool server = w->role == ROLE_SERVER;
    const ps_entry *e = server ? &j->ps_servers[w->rank] : &j->ps_workers[w->rank];
    snprintf(bufs[0], 32, "%d", j->nworkers);
    snprintf(bufs[1], 32, "%d", w->rank);
    snprintf(bufs[2], 32, "%d", e->port);
    int n = 0;
#define ROW(name, value) do { if (n < cap) { rows[n][0] = name; rows[n][1] = value; n++; } } while (0)
    ROW("TRAINING_ROLE", server ? "PSERVER" : "TRAINER");
    ROW("PADDLE_PSERVERS_IP_PORT_LIST", j->servers_str);
    if (server) {
        ROW("POD_IP", e->ip);
        ROW("PADDLE_PORT", bufs[2]);
    } else {
        ROW("PADDLE_CURRENT_ENDPOINT", j->endpoints[w->rank]);
    }
    ROW("PADDLE_TRAINERS_NUM", bufs[0]);
    ROW("PADDLE_TRAINER_ENDPOINTS", j->endpoints_str);
    if (!server)
        ROW("PADDLE_TRAINER_ID", bufs[1]);
#undef ROW
    return n;
}

bool fr_ps_workers_done(const job *j) {
    if (j->nstarted < j->o.nproc)
        return false;
    int local = 0;
    for (int i = 0; i < j->o.nproc; i++) {
        const worker *w = &j->w[i];
        if (w->role != ROLE_WORKER)
            continue;
        if (!w->reaped || !WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0)
            return false;
        local++;
    }
    return local == j->nworkers; /* workers elsewhere may still need the servers */
}
