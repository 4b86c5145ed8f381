/* args.c - the command line: usage text, options, and their checks before anything starts
 * (addresses, device lists, ports, and whether PROGRAM can be run at all). Bad arguments are
 * told with fr_arg_error and give exit status 2. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fleetrun.h"

#define MAX_RANKS     4096  /* FL_COMM_MAX_RANKS */

static const char usage_text[] =
    "usage: fleetrun [--ips IP1,IP2,...] [--nproc_per_node N | --gpus 0,1,...] [--log_dir DIR]\n"
    "                [--started_port P] [--node_ip IP] [--grace SECONDS] [--max_restarts N]\n"
    "                [--nnodes MIN:MAX] [--node_timeout SECONDS] [--coord_port P]\n"
    "                [--bind_to core|none] PROGRAM [ARGS...]\n"
    "       fleetrun --server_num S | --servers IP:PORT,...  --worker_num W | --workers IP:PORT,...\n"
    "                [--log_dir DIR] [--started_port P] [--node_ip IP] [--grace SECONDS]\n"
    "                [--max_restarts N] [--bind_to core|none] PROGRAM [ARGS...]\n"
    "\n"
    "Starts this node's workers of a collective job. Run the same line on every node of --ips;\n"
    "the first IP's first worker is rank 0. Each worker gets PADDLE_TRAINER_ID,\n"
    "PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, FLAGS_selected_gpus,\n"
    "FLEET_JOB_TOKEN, and torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (its node); worker\n"
    "i writes to LOG_DIR/workerlog.i, rank 0 also to this terminal.\n"
    "\n"
    "  --ips, --cluster_node_ips IPS  every node's address, comma-separated (default 127.0.0.1)\n"
    "  --nproc_per_node N             workers on this node (default: number of --gpus, or 1)\n"
    "  --gpus, --selected_gpus LIST   devices, one worker each; sets FLAGS_selected_gpus\n"
    "  --log_dir DIR                  where workerlog.i files go (default: log)\n"
    "  --started_port P               worker i listens on IP:P+i (default: $FLAGS_START_PORT;\n"
    "                                 one node without a port: fleetrun binds free ports and\n"
    "                                 hands each worker its socket as FLEET_LISTEN_FD;\n"
    "                                 several nodes: 6170)\n"
    "  --node_ip IP                   this node's entry of --ips (default: the first entry\n"
    "                                 that is an address of this machine)\n"
    "  --grace SECONDS                when a worker fails, how long the others may take to exit\n"
    "                                 on their own before SIGTERM, then SIGKILL (default 5)\n"
    "  --max_restarts, --max-restarts N  when a worker fails (exit status other than 0 and 2,\n"
    "                                 or a signal), stop the others and start all of them\n"
    "                                 again, up to N times (default 0); each round's workers\n"
    "                                 get FLEET_RESTART_COUNT and resume as they are told\n"
    "                                 (fleet-train: -o checkpoint.resume=auto). Exit status 2\n"
    "                                 is an error in the job (fleet-train: before training\n"
    "                                 began) and is not restarted. Every node restarts alike.\n"
    "  --nnodes N | MIN:MAX           nodes the job needs (default: every node of --ips); the\n"
    "                                 nodes start together (node 0 waits for the others); with\n"
    "                                 MIN below the number of --ips, a round goes on with the\n"
    "                                 nodes that came, if at least MIN (scale in)\n"
    "  --node_timeout SECONDS         several nodes with --max_restarts or --nnodes: how long\n"
    "                                 a round waits for every node to join (default 60)\n"
    "                                 before it ends the job or, with MIN:MAX, goes on\n"
    "  --coord_port P                 where node 0's fleetrun coordinates the rounds of a job\n"
    "                                 of several nodes (default: the workers' first port - 1)\n"
    "  --bind_to, --bind-to core|none core: the CPUs fleetrun may run on (its affinity, e.g.\n"
    "                                 from taskset) are cut into one contiguous set per worker,\n"
    "                                 of equal size (the first sets take one more each when\n"
    "                                 they do not divide), and worker i runs on set i, in every\n"
    "                                 round; a worker gets OMP_NUM_THREADS = its set's size\n"
    "                                 unless OMP_NUM_THREADS is set. More workers than CPUs is\n"
    "                                 refused. none (default): each worker may run on all of\n"
    "                                 fleetrun's CPUs (mpirun's --bind-to; it binds to cores\n"
    "                                 by default, torchrun and Paddle's launcher do not)\n"
    "  -h, --help                     this text\n"
    "\n"
    "Parameter-server jobs (Paddle's PS mode): servers own the parameters, workers pull and push.\n"
    "  --server_num S, --worker_num W  S servers and W workers on this machine, each on a port\n"
    "                                 of its own (free ports fleetrun binds and hands over as\n"
    "                                 FLEET_LISTEN_FD; with --started_port P: servers P.., then\n"
    "                                 the workers)\n"
    "  --servers, --workers IP:PORT,... every server's / worker's endpoint; run the same line on\n"
    "                                 each machine: it starts the entries whose IP is its own\n"
    "                                 (--node_ip, else an address of its interfaces). A list\n"
    "                                 and a count may be mixed (--servers with --worker_num:\n"
    "                                 the workers on this machine); both must agree if given\n"
    "Servers get TRAINING_ROLE=PSERVER, PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINER_ENDPOINTS,\n"
    "PADDLE_TRAINERS_NUM, POD_IP and PADDLE_PORT (their own endpoint); workers\n"
    "TRAINING_ROLE=TRAINER and a collective worker's variables, with PADDLE_PSERVERS_IP_PORT_LIST,\n"
    "POD_IP and PADDLE_PORT; both FLEET_JOB_TOKEN and FLEET_RESTART_COUNT. Logs:\n"
    "LOG_DIR/serverlog.N and workerlog.N; worker 0 also on this terminal. When every worker\n"
    "(all on this machine) has exited 0, the servers get --grace seconds to exit on their own,\n"
    "then SIGTERM, and the job ends 0. --max_restarts restarts servers and workers together\n"
    "(every entry on this machine). Not with --ips, --nproc_per_node, --gpus, --nnodes.\n"
    "\n"
    "Several nodes need the same FLEET_JOB_TOKEN exported on each. Workers' stdin is /dev/null.\n"
    "Programs that bind their endpoint themselves (not fleet's) need --started_port.\n"
    "Exit status: 0 when every worker succeeded; else the failed worker's code (128+signal):\n"
    "a worker killed by a signal is named as the cause before peers that exited on its loss;\n"
    "130/143 after SIGINT/SIGTERM; 2 for bad arguments. With --max_restarts: that of the\n"
    "last round.\n";

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_ips(options *o, const char *list) {
    free(o->ips_buf);
    o->ips_buf = strdup(list);
    o->nnodes = 0;
    if (!o->ips_buf)
        return fr_arg_error("out of memory");
    char *save = NULL;
    int n = 0;
    for (char *p = o->ips_buf;; p = NULL) {
        char *tok = strtok_r(p, ",", &save);
        if (!tok)
            break;
        if (n == MAX_NODES)
            return fr_arg_error("--ips: more than %d nodes", MAX_NODES);
        if (!fr_parse_ip(tok).family)
            return fr_arg_error("--ips: '%s' is not an IPv4 or IPv6 address", tok);
        for (int k = 0; k < n; k++)
            if (fr_ip_equal(fr_parse_ip(o->ips[k]), fr_parse_ip(tok)))
                return fr_arg_error("--ips: '%s' appears twice", tok);
        o->ips[n++] = tok;
    }
    if (n == 0)
        return fr_arg_error("--ips: empty list");
    o->nnodes = n;
    return 0;
}

static int parse_gpus(options *o, const char *list) {
    const char *p = list;
    o->ngpus = 0;
    for (int guard = 0; *p && guard <= MAX_NPROC; guard++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > 1000000 || (*end && *end != ','))
            return fr_arg_error("--gpus: '%s' is not a comma-separated list of device numbers", list);
        if (o->ngpus == MAX_NPROC)
            return fr_arg_error("--gpus: more than %d devices", MAX_NPROC);
        o->gpus[o->ngpus++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (o->ngpus == 0)
        return fr_arg_error("--gpus: empty list");
    return 0;
}

enum { OPT_IPS, OPT_NPROC, OPT_GPUS, OPT_LOG_DIR, OPT_PORT, OPT_NODE_IP, OPT_GRACE,
       OPT_RESTARTS, OPT_NNODES, OPT_NODE_TIMEOUT, OPT_COORD_PORT, OPT_BIND, OPT_SERVER_NUM,
       OPT_WORKER_NUM, OPT_SERVERS, OPT_WORKERS };

static const struct {
    const char *name;
    int         id;
} option_names[] = {
    {"--ips", OPT_IPS},           {"--cluster_node_ips", OPT_IPS},
    {"--nproc_per_node", OPT_NPROC},
    {"--gpus", OPT_GPUS},         {"--selected_gpus", OPT_GPUS},
    {"--log_dir", OPT_LOG_DIR},   {"--started_port", OPT_PORT},
    {"--node_ip", OPT_NODE_IP},   {"--grace", OPT_GRACE},
    {"--max_restarts", OPT_RESTARTS}, {"--max-restarts", OPT_RESTARTS}, /* torchrun's */
    {"--nnodes", OPT_NNODES},     {"--node_timeout", OPT_NODE_TIMEOUT},
    {"--coord_port", OPT_COORD_PORT},
    {"--bind_to", OPT_BIND},      {"--bind-to", OPT_BIND}, /* mpirun's */
    {"--server_num", OPT_SERVER_NUM}, {"--worker_num", OPT_WORKER_NUM}, /* PS mode (ps.c) */
    {"--servers", OPT_SERVERS},   {"--workers", OPT_WORKERS},
};

/* "N" or "MIN:MAX" */
static int parse_nnodes(options *o, const char *v) {
    int lo, hi;
    const char *colon = strchr(v, ':');
    char first[16];
    if (colon && (size_t)(colon - v) < sizeof first) {
        snprintf(first, sizeof first, "%.*s", (int)(colon - v), v);
        if (parse_int(first, 1, MAX_NODES, &lo) || parse_int(colon + 1, 1, MAX_NODES, &hi) ||
            lo > hi)
            return fr_arg_error("--nnodes: '%s' is not MIN:MAX with 1 <= MIN <= MAX", v);
    } else if (colon || parse_int(v, 1, MAX_NODES, &lo)) {
        return fr_arg_error("--nnodes: '%s' is not a number of nodes or MIN:MAX", v);
    } else {
        hi = lo;
    }
    o->min_nodes = lo;
    o->max_nodes = hi;
    return 0;
}

/* Parameter-server options (ps.c runs the job): sets o->ps when any is given, then refuses
 * those that do not go together or with collective-only ones; 0 or 2 (told). */
static int check_ps_args(options *o) {
    if (o->server_num || o->servers_arg || o->worker_num || o->workers_arg)
        o->ps = true;
    if (!o->ps)
        return 0;
    bool servers = o->server_num || o->servers_arg, workers = o->worker_num || o->workers_arg;
    if (!servers)
        return fr_arg_error("%s without --server_num or --servers: a parameter-server job needs "
                            "servers (a collective job takes --nproc_per_node)",
                            o->workers_arg ? "--workers" : "--worker_num");
    if (!workers)
        return fr_arg_error("%s without --worker_num or --workers: a parameter-server job needs "
                            "workers", o->servers_arg ? "--servers" : "--server_num");
    const char *coll = o->nproc ? "--nproc_per_node" : o->ngpus ? "--gpus" : o->ips_given ? "--ips"
                     : o->max_nodes ? "--nnodes" : o->coord_port ? "--coord_port" : NULL;
    if (coll)
        return fr_arg_error("%s is an option of collective jobs; a parameter-server job "
                            "(--server_num/--servers, --worker_num/--workers) places its "
                            "processes with those options alone", coll);
    if (o->port_given && o->servers_arg && o->workers_arg)
        return fr_arg_error("--started_port with --servers and --workers: the lists give every "
                            "port already");
    return 0;
}

/* Takes option id's value v into o (--ips into *ips). Returns 0 or fr_arg_error's status. */
static int apply_option(options *o, int id, const char *v, const char **ips) {
    int rc = 0;
    switch (id) {
    case OPT_IPS: *ips = v; o->ips_given = true; break;
    case OPT_SERVER_NUM:
        if (parse_int(v, 1, PS_MAX_SERVERS, &o->server_num))
            rc = fr_arg_error("--server_num: '%s' is not a number from 1 to %d", v,
                              PS_MAX_SERVERS);
        break;
    case OPT_WORKER_NUM:
        if (parse_int(v, 1, PS_MAX_WORKERS, &o->worker_num))
            rc = fr_arg_error("--worker_num: '%s' is not a number from 1 to %d", v,
                              PS_MAX_WORKERS);
        break;
    case OPT_SERVERS:
    case OPT_WORKERS:
        if (!*v)
            rc = fr_arg_error("%s: empty list", id == OPT_SERVERS ? "--servers" : "--workers");
        if (id == OPT_SERVERS)
            o->servers_arg = v;
        else
            o->workers_arg = v;
        break;
    case OPT_NPROC:
        if (parse_int(v, 1, MAX_NPROC, &o->nproc))
            rc = fr_arg_error("--nproc_per_node: '%s' is not a number from 1 to %d", v,
                           MAX_NPROC);
        break;
    case OPT_GPUS: rc = parse_gpus(o, v); break;
    case OPT_LOG_DIR: {
        size_t len = strlen(v);
        while (len > 1 && v[len - 1] == '/') /* "log/" names files log/workerlog.i */
            len--;
        if (!*v || len >= sizeof o->log_dir_buf)
            rc = fr_arg_error("--log_dir: empty or too long path '%s'", v);
        else
            snprintf(o->log_dir_buf, sizeof o->log_dir_buf, "%.*s", (int)len, v);
        o->log_dir = o->log_dir_buf;
        break;
    }
    case OPT_PORT:
        if (parse_int(v, 1, 65535, &o->port))
            rc = fr_arg_error("--started_port: '%s' is not a port number (1..65535)", v);
        o->port_given = true;
        break;
    case OPT_NODE_IP:
        if (!fr_parse_ip(v).family)
            rc = fr_arg_error("--node_ip: '%s' is not an IPv4 or IPv6 address", v);
        o->node_ip = v;
        break;
    case OPT_RESTARTS:
        if (parse_int(v, 0, 1000, &o->max_restarts))
            rc = fr_arg_error("--max_restarts: '%s' is not a number from 0 to 1000", v);
        break;
    case OPT_NNODES: rc = parse_nnodes(o, v); break;
    case OPT_BIND:
        if (strcmp(v, "core") && strcmp(v, "none"))
            rc = fr_arg_error("--bind_to: '%s' is not core or none", v);
        o->bind_core = !strcmp(v, "core");
        break;
    case OPT_COORD_PORT:
        if (parse_int(v, 1, 65535, &o->coord_port))
            rc = fr_arg_error("--coord_port: '%s' is not a port number (1..65535)", v);
        break;
    case OPT_NODE_TIMEOUT: {
        char *end;
        o->node_timeout = strtod(v, &end);
        if (end == v || *end || !(o->node_timeout >= 0.1 && o->node_timeout <= 86400))
            rc = fr_arg_error("--node_timeout: '%s' is not a number of seconds from 0.1 to "
                              "86400", v);
        break;
    }
    case OPT_GRACE: {
        char *end;
        o->grace = strtod(v, &end);
        if (end == v || *end || !(o->grace >= 0 && o->grace <= 3600))
            rc = fr_arg_error("--grace: '%s' is not a number of seconds from 0 to 3600", v);
        break;
    }
    }
    return rc;
}

/* A collective job's checks and defaults once every option is read: ranks, ports, the
 * coordinator of several nodes. Returns 0 or fr_arg_error's status. */
static int finish_collective(options *o) {
    if (o->ngpus && o->nproc && o->ngpus != o->nproc)
        return fr_arg_error("--nproc_per_node %d but --gpus lists %d devices", o->nproc, o->ngpus);
    if (!o->nproc)
        o->nproc = o->ngpus ? o->ngpus : 1;
    if ((long)o->nproc * o->nnodes > MAX_RANKS)
        return fr_arg_error("%d nodes x %d workers is more than %d ranks", o->nnodes, o->nproc,
                         MAX_RANKS);
    if (!o->port) {
        const char *env = getenv("FLAGS_START_PORT");
        if (env && *env && parse_int(env, 1, 65535, &o->port))
            return fr_arg_error("FLAGS_START_PORT='%s' is not a port number (1..65535)", env);
    }
    if (o->port && o->port + o->nproc - 1 > 65535)
        return fr_arg_error("ports %d..%d: past 65535", o->port, o->port + o->nproc - 1);
    if (o->max_nodes && o->max_nodes != o->nnodes)
        return fr_arg_error("--nnodes %d:%d, but --ips lists %d node(s): MAX is the number of "
                            "--ips", o->min_nodes, o->max_nodes, o->nnodes);
    /* several nodes that restart or name --nnodes: node 0's fleetrun coordinates the rounds */
    o->coordinated = o->nnodes > 1 && (o->max_restarts > 0 || o->max_nodes > 0);
    if (!o->max_nodes)
        o->min_nodes = o->max_nodes = o->nnodes;
    if (o->coordinated && !o->coord_port) {
        int first = o->port ? o->port : FR_DEFAULT_PORT;
        if (first < 2)
            return fr_arg_error("--started_port %d leaves no port below it for the "
                                "coordinator: give --coord_port", first);
        o->coord_port = first - 1;
    }
    return 0;
}

/* Returns 0, or the status to exit with (2: bad arguments; -1: --help printed, exit 0). */
int fr_parse_args(int argc, char **argv, options *o) {
    int i;
    const char *ips = NULL;
    o->log_dir = "log";
    o->grace = 5.0;
    o->node_timeout = 60.0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return -1;
        }
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
        int id = -1;
        for (size_t k = 0; k < sizeof option_names / sizeof option_names[0]; k++)
            if (strlen(option_names[k].name) == nlen && !strncmp(a, option_names[k].name, nlen))
                id = option_names[k].id;
        if (id < 0)
            return fr_arg_error("unknown option '%.*s'", (int)nlen, a);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return fr_arg_error("option '%s' needs a value", a);
        int rc = apply_option(o, id, v, &ips);
        if (rc)
            return rc;
    }
    if (i >= argc)
        return fr_arg_error("no PROGRAM to run");
    o->argv = argv + i;

    int rc = check_ps_args(o);
    if (rc)
        return rc;
    if (!ips)
        ips = o->node_ip ? o->node_ip : "127.0.0.1";
    if ((rc = parse_ips(o, ips)))
        return rc;
    if (o->ps) { /* ps.c places the processes (fr_ps_plan); ports from the lists or counts */
        const char *env = getenv("FLAGS_START_PORT");
        if (!o->port && env && *env && !(o->servers_arg && o->workers_arg) &&
            parse_int(env, 1, 65535, &o->port))
            return fr_arg_error("FLAGS_START_PORT='%s' is not a port number (1..65535)", env);
        o->min_nodes = o->max_nodes = 1;
        return 0;
    }
    return finish_collective(o);
}

/* Program lookup before anything starts, with execvp's rules: 127 not found, 126 not runnable. */
int fr_check_program(const char *prog) {
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) == 0)
            return 0;
        int e = errno;
        fr_say("error: cannot run '%s': %s", prog, strerror(e));
        return e == ENOENT ? 127 : 126;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char full[PATH_MAX];
        if (len == 0)
            snprintf(full, sizeof full, "%s", prog);
        else
            snprintf(full, sizeof full, "%.*s/%s", (int)len, p, prog);
        struct stat st;
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0)
            return 0;
        p = c ? c + 1 : p + len;
    }
    fr_say("error: '%s' not found in PATH", prog);
    return 127;
}
