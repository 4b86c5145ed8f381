/* fleetrun - the launcher: starts this node's workers of a data-parallel job with the environment
 * Paddle's launcher sets (PADDLE_TRAINER_ID, PADDLE_TRAINER_ENDPOINTS, ...), copies each worker's
 * output to LOG_DIR/workerlog.i (rank 0 also to the terminal), and stops the whole node when one
 * worker fails or on Ctrl-C. It runs any program and needs nothing from the library: one
 * process, one poll loop over the workers' pipes and a signalfd. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_NODES     1024
#define MAX_NPROC     1024
#define MAX_RANKS     4096  /* FL_COMM_MAX_RANKS */
#define MAX_TOKEN     64
#define DEFAULT_PORT  6170  /* paddle.distributed.launch's */
#define ENDPOINT_MAX  64
#define TAIL_LINES    20
#define TAIL_BYTES    65536
#define LINEBUF_CAP   65536
#define KILL_WAIT_S   5.0   /* after SIGKILL, how long to wait before giving up */
#define DRAIN_WAIT_S  1.0   /* after every worker is gone, how long to wait for pipe EOFs */
#define SETTLE_S      0.5   /* after the first failure, how long to gather others before naming
                               the cause (a killed rank's peers may be reaped before it) */

static const char usage_text[] =
    "usage: fleetrun [--ips IP1,IP2,...] [--nproc_per_node N | --gpus 0,1,...] [--log_dir DIR]\n"
    "                [--started_port P] [--node_ip IP] [--grace SECONDS] PROGRAM [ARGS...]\n"
    "\n"
    "Starts this node's workers of a collective job. Run the same line on every node of --ips;\n"
    "the first IP's first worker is rank 0. Each worker gets PADDLE_TRAINER_ID,\n"
    "PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT, FLAGS_selected_gpus\n"
    "and FLEET_JOB_TOKEN; worker i writes to LOG_DIR/workerlog.i, rank 0 also to this terminal.\n"
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
    "  -h, --help                     this text\n"
    "\n"
    "Several nodes need the same FLEET_JOB_TOKEN exported on each. Workers' stdin is /dev/null.\n"
    "Programs that bind their endpoint themselves (not fleet's) need --started_port.\n"
    "Exit status: 0 when every worker succeeded; else the failed worker's code (128+signal):\n"
    "a worker killed by a signal is named as the cause before peers that exited on its loss;\n"
    "130/143 after SIGINT/SIGTERM; 2 for bad arguments.\n";

typedef struct {
    char       *ips_buf;              /* owned copy of --ips, split in place */
    const char *ips[MAX_NODES];
    int         nnodes;
    int         nproc;                /* 0: not given */
    int         gpus[MAX_NPROC];
    int         ngpus;                /* 0: --gpus not given */
    const char *log_dir;
    char        log_dir_buf[PATH_MAX - 32];
    int         port;                 /* 0: not given */
    const char *node_ip;
    double      grace;
    char      **argv;                 /* PROGRAM ARGS... (borrowed from main's argv) */
} options;

typedef struct {
    pid_t  pid;
    int    rank;
    int    out_fd;                    /* read end of the worker's stdout+stderr pipe; -1 at EOF */
    int    log_fd;
    int    listen_fd;                 /* fleetrun's copy until the fork; -1 after */
    int    child_listen_fd;           /* the number the worker sees in FLEET_LISTEN_FD; -1: none */
    bool   reaped;
    bool   reported;                  /* its failure has been told */
    int    status;                    /* wait status once reaped */
    int    reap_order;                /* 1, 2, ... in the order failures were reaped; 0: none */
    char   log_path[PATH_MAX];
    char   gpu[16];
} worker;

enum phase { PHASE_RUN, PHASE_GRACE, PHASE_TERM, PHASE_KILL };

typedef struct {
    options     o;
    int         node;                 /* this node's index in --ips */
    int         nranks;
    char      (*endpoints)[ENDPOINT_MAX]; /* [nranks], node-major */
    char       *endpoints_str;        /* "ip:port,ip:port,..." */
    char        token[MAX_TOKEN + 1];
    bool        own_sockets;          /* fleetrun binds the ports (FLEET_LISTEN_FD) */
    worker     *w;                    /* [nproc] */
    int         nstarted;
    pid_t       self;
    int         sig_fd;
    int         term_fd;              /* 1 while copying rank 0 to the terminal, -1 after EPIPE */
    char       *line;                 /* rank 0's pending partial line (terminal only) */
    size_t      nline;
    enum phase  phase;
    double      deadline;             /* of the current phase (monotonic seconds) */
    int         exit_code;            /* the failure named as the cause: its code; -1 while none */
    int         nfailed;              /* failures reaped so far */
    double      settle_until;         /* > 0 while gathering failures before naming the cause */
    int         failed_unsignalled;   /* failures reaped before fleetrun signalled; -1: none sent */
    int         signal_seen;          /* SIGINT/SIGTERM/SIGHUP received, 0 if none */
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fleetrun: %s\n", buf);
}

/* An error in fleetrun's own arguments: message, usage hint, status 2. */
static int arg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int arg_error(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fleetrun: error: %s\nusage: fleetrun [options] PROGRAM [ARGS...]  "
                    "(fleetrun --help for the options)\n", buf);
    return 2;
}

static int write_all(int fd, const char *p, size_t n) {
    for (int tries = 0; n > 0 && tries < 1000000; tries++) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
            continue;
        }
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return n == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- arguments */

static int parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* Binary form of a numeric IPv4/IPv6 address; family 0 if it is neither. */
typedef struct {
    int           family;
    unsigned char a[16];
} ip_addr;

static ip_addr parse_ip(const char *s) {
    ip_addr ip = {0};
    if (inet_pton(AF_INET, s, ip.a) == 1)
        ip.family = AF_INET;
    else if (inet_pton(AF_INET6, s, ip.a) == 1)
        ip.family = AF_INET6;
    return ip;
}

static bool ip_equal(ip_addr x, ip_addr y) {
    return x.family == y.family && !memcmp(x.a, y.a, x.family == AF_INET ? 4 : 16);
}

static int parse_ips(options *o, const char *list) {
    free(o->ips_buf);
    o->ips_buf = strdup(list);
    o->nnodes = 0;
    if (!o->ips_buf)
        return arg_error("out of memory");
    char *save = NULL;
    int n = 0;
    for (char *p = o->ips_buf;; p = NULL) {
        char *tok = strtok_r(p, ",", &save);
        if (!tok)
            break;
        if (n == MAX_NODES)
            return arg_error("--ips: more than %d nodes", MAX_NODES);
        if (!parse_ip(tok).family)
            return arg_error("--ips: '%s' is not an IPv4 or IPv6 address", tok);
        for (int k = 0; k < n; k++)
            if (ip_equal(parse_ip(o->ips[k]), parse_ip(tok)))
                return arg_error("--ips: '%s' appears twice", tok);
        o->ips[n++] = tok;
    }
    if (n == 0)
        return arg_error("--ips: empty list");
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
            return arg_error("--gpus: '%s' is not a comma-separated list of device numbers", list);
        if (o->ngpus == MAX_NPROC)
            return arg_error("--gpus: more than %d devices", MAX_NPROC);
        o->gpus[o->ngpus++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (o->ngpus == 0)
        return arg_error("--gpus: empty list");
    return 0;
}

enum { OPT_IPS, OPT_NPROC, OPT_GPUS, OPT_LOG_DIR, OPT_PORT, OPT_NODE_IP, OPT_GRACE };

static const struct {
    const char *name;
    int         id;
} option_names[] = {
    {"--ips", OPT_IPS},           {"--cluster_node_ips", OPT_IPS},
    {"--nproc_per_node", OPT_NPROC},
    {"--gpus", OPT_GPUS},         {"--selected_gpus", OPT_GPUS},
    {"--log_dir", OPT_LOG_DIR},   {"--started_port", OPT_PORT},
    {"--node_ip", OPT_NODE_IP},   {"--grace", OPT_GRACE},
};

/* Returns 0, or the status to exit with (2: bad arguments; -1: --help printed, exit 0). */
static int parse_args(int argc, char **argv, options *o) {
    int i;
    const char *ips = NULL;
    o->log_dir = "log";
    o->grace = 5.0;
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
            return arg_error("unknown option '%.*s'", (int)nlen, a);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return arg_error("option '%s' needs a value", a);
        int rc = 0;
        switch (id) {
        case OPT_IPS: ips = v; break;
        case OPT_NPROC:
            if (parse_int(v, 1, MAX_NPROC, &o->nproc))
                rc = arg_error("--nproc_per_node: '%s' is not a number from 1 to %d", v,
                               MAX_NPROC);
            break;
        case OPT_GPUS: rc = parse_gpus(o, v); break;
        case OPT_LOG_DIR: {
            size_t len = strlen(v);
            while (len > 1 && v[len - 1] == '/') /* "log/" names files log/workerlog.i */
                len--;
            if (!*v || len >= sizeof o->log_dir_buf)
                rc = arg_error("--log_dir: empty or too long path '%s'", v);
            else
                snprintf(o->log_dir_buf, sizeof o->log_dir_buf, "%.*s", (int)len, v);
            o->log_dir = o->log_dir_buf;
            break;
        }
        case OPT_PORT:
            if (parse_int(v, 1, 65535, &o->port))
                rc = arg_error("--started_port: '%s' is not a port number (1..65535)", v);
            break;
        case OPT_NODE_IP:
            if (!parse_ip(v).family)
                rc = arg_error("--node_ip: '%s' is not an IPv4 or IPv6 address", v);
            o->node_ip = v;
            break;
        case OPT_GRACE: {
            char *end;
            o->grace = strtod(v, &end);
            if (end == v || *end || !(o->grace >= 0 && o->grace <= 3600))
                rc = arg_error("--grace: '%s' is not a number of seconds from 0 to 3600", v);
            break;
        }
        }
        if (rc)
            return rc;
    }
    if (i >= argc)
        return arg_error("no PROGRAM to run");
    o->argv = argv + i;

    if (!ips)
        ips = o->node_ip ? o->node_ip : "127.0.0.1";
    int rc = parse_ips(o, ips);
    if (rc)
        return rc;
    if (o->ngpus && o->nproc && o->ngpus != o->nproc)
        return arg_error("--nproc_per_node %d but --gpus lists %d devices", o->nproc, o->ngpus);
    if (!o->nproc)
        o->nproc = o->ngpus ? o->ngpus : 1;
    if ((long)o->nproc * o->nnodes > MAX_RANKS)
        return arg_error("%d nodes x %d workers is more than %d ranks", o->nnodes, o->nproc,
                         MAX_RANKS);
    if (!o->port) {
        const char *env = getenv("FLAGS_START_PORT");
        if (env && *env && parse_int(env, 1, 65535, &o->port))
            return arg_error("FLAGS_START_PORT='%s' is not a port number (1..65535)", env);
    }
    if (o->port && o->port + o->nproc - 1 > 65535)
        return arg_error("ports %d..%d: past 65535", o->port, o->port + o->nproc - 1);
    return 0;
}

/* Program lookup before anything starts, with execvp's rules: 127 not found, 126 not runnable. */
static int check_program(const char *prog) {
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) == 0)
            return 0;
        int e = errno;
        say("error: cannot run '%s': %s", prog, strerror(e));
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
    say("error: '%s' not found in PATH", prog);
    return 127;
}

/* ---------------------------------------------------------------- job set-up */

/* This node's index: --node_ip's position in --ips, or the first entry that is an address of
 * a local interface. A single node is node 0 without asking. Returns 0 or 2. */
static int find_node(job *j) {
    options *o = &j->o;
    if (o->node_ip) {
        ip_addr me = parse_ip(o->node_ip);
        for (int n = 0; n < o->nnodes; n++)
            if (ip_equal(parse_ip(o->ips[n]), me)) {
                j->node = n;
                return 0;
            }
        return arg_error("--node_ip %s is not one of --ips", o->node_ip);
    }
    if (o->nnodes == 1) {
        j->node = 0;
        return 0;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return arg_error("cannot list this machine's addresses (%s); pass --node_ip",
                         strerror(errno));
    char local[1024] = "";
    size_t used = 0;
    j->node = -1;
    for (int n = 0; n < o->nnodes && j->node < 0; n++) {
        ip_addr want = parse_ip(o->ips[n]);
        for (struct ifaddrs *f = ifs; f; f = f->ifa_next) {
            if (!f->ifa_addr)
                continue;
            ip_addr have = {.family = f->ifa_addr->sa_family};
            if (have.family == AF_INET)
                memcpy(have.a, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, 4);
            else if (have.family == AF_INET6)
                memcpy(have.a, &((struct sockaddr_in6 *)f->ifa_addr)->sin6_addr, 16);
            else
                continue;
            if (ip_equal(want, have)) {
                j->node = n;
                break;
            }
        }
    }
    for (struct ifaddrs *f = ifs; f && j->node < 0; f = f->ifa_next) {
        char s[INET6_ADDRSTRLEN];
        if (!f->ifa_addr || f->ifa_addr->sa_family != AF_INET)
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, s, sizeof s);
        if (used + strlen(s) + 2 < sizeof local)
            used += (size_t)snprintf(local + used, sizeof local - used, "%s%s", used ? ", " : "", s);
    }
    freeifaddrs(ifs);
    if (j->node < 0) {
        fprintf(stderr,
                "fleetrun: error: none of --ips is an address of this machine "
                "(its IPv4 addresses: %s)\n"
                "hint: add --node_ip with this node's entry of --ips\n", local);
        return 2;
    }
    return 0;
}

static int random_hex(char *out, size_t nbytes) {
    unsigned char raw[32];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || nbytes > sizeof raw)
        goto fail;
    size_t got = 0;
    for (int tries = 0; got < nbytes && tries < 100; tries++) {
        ssize_t k = read(fd, raw + got, nbytes - got);
        if (k > 0)
            got += (size_t)k;
        else if (k < 0 && errno != EINTR)
            break;
    }
    close(fd);
    if (got < nbytes)
        return -1;
    for (size_t i = 0; i < nbytes; i++)
        sprintf(out + 2 * i, "%02x", raw[i]);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    return -1;
}

/* The job token: FLEET_JOB_TOKEN passed through, or a fresh one (one node only). */
static int make_token(job *j) {
    const char *t = getenv("FLEET_JOB_TOKEN");
    if (t && *t) {
        size_t n = strlen(t);
        if (n > MAX_TOKEN)
            return arg_error("FLEET_JOB_TOKEN is %zu characters; at most %d", n, MAX_TOKEN);
        for (size_t i = 0; i < n; i++)
            if (t[i] <= ' ' || t[i] > '~')
                return arg_error("FLEET_JOB_TOKEN: only printable characters without spaces");
        memcpy(j->token, t, n + 1);
        return 0;
    }
    if (random_hex(j->token, 16) < 0) {
        say("error: cannot read /dev/urandom for the job token: %s", strerror(errno));
        return 1;
    }
    if (j->o.nnodes > 1) {
        fprintf(stderr,
                "fleetrun: error: a job on %d nodes needs the same FLEET_JOB_TOKEN on every node "
                "(workers refuse connections without it)\n"
                "hint: export FLEET_JOB_TOKEN=%s   (this value, on every node, then rerun)\n",
                j->o.nnodes, j->token);
        return 2;
    }
    return 0;
}

static void format_endpoint(char *out, const char *ip, int port) {
    if (strchr(ip, ':'))
        snprintf(out, ENDPOINT_MAX, "[%s]:%d", ip, port);
    else
        snprintf(out, ENDPOINT_MAX, "%s:%d", ip, port);
}

/* One listening socket per local worker on IP:0; the kernel picks free ports. */
static int bind_sockets(job *j) {
    const char *ip = j->o.ips[j->node];
    ip_addr a = parse_ip(ip);
    for (int i = 0; i < j->o.nproc; i++) {
        struct sockaddr_storage ss = {0};
        socklen_t len;
        if (a.family == AF_INET) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            s4->sin_family = AF_INET;
            memcpy(&s4->sin_addr, a.a, 4);
            len = sizeof *s4;
        } else {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            s6->sin6_family = AF_INET6;
            memcpy(&s6->sin6_addr, a.a, 16);
            len = sizeof *s6;
        }
        int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, SOMAXCONN) < 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
            say("error: cannot listen on %s for worker %d: %s", ip, i, strerror(errno));
            if (fd >= 0)
                close(fd);
            return 1;
        }
        int port = ntohs(a.family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                             : ((struct sockaddr_in6 *)&ss)->sin6_port);
        j->w[i].listen_fd = fd;
        j->w[i].child_listen_fd = fd;
        format_endpoint(j->endpoints[(size_t)j->node * j->o.nproc + i], ip, port);
    }
    return 0;
}

static int make_endpoints(job *j) {
    options *o = &j->o;
    j->nranks = o->nnodes * o->nproc;
    j->endpoints = calloc((size_t)j->nranks, sizeof *j->endpoints);
    j->endpoints_str = calloc((size_t)j->nranks, ENDPOINT_MAX);
    if (!j->endpoints || !j->endpoints_str) {
        say("error: out of memory");
        return 1;
    }
    if (!o->port && o->nnodes == 1) {
        j->own_sockets = true;
        int rc = bind_sockets(j);
        if (rc)
            return rc;
    } else {
        int port = o->port ? o->port : DEFAULT_PORT;
        for (int n = 0; n < o->nnodes; n++)
            for (int i = 0; i < o->nproc; i++)
                format_endpoint(j->endpoints[(size_t)n * o->nproc + i], o->ips[n], port + i);
    }
    size_t used = 0;
    for (int r = 0; r < j->nranks; r++)
        used += (size_t)sprintf(j->endpoints_str + used, "%s%s", r ? "," : "", j->endpoints[r]);
    return 0;
}

/* mkdir -p */
static int make_dirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(path, &st) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int open_logs(job *j) {
    if (make_dirs(j->o.log_dir) < 0) {
        say("error: cannot create log directory '%s': %s", j->o.log_dir, strerror(errno));
        return 1;
    }
    for (int i = 0; i < j->o.nproc; i++) {
        worker *w = &j->w[i];
        snprintf(w->log_path, sizeof w->log_path, "%s/workerlog.%d", j->o.log_dir, i);
        w->log_fd = open(w->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w->log_fd < 0) {
            say("error: cannot open '%s': %s", w->log_path, strerror(errno));
            return 1;
        }
    }
    return 0;
}

/* The first local worker's environment as a box, as paddle.distributed.launch prints it. */
static void print_env_table(const job *j) {
    const worker *w = &j->w[0];
    char rank[16], num[16], fd[16], tok[32];
    snprintf(rank, sizeof rank, "%d", w->rank);
    snprintf(num, sizeof num, "%d", j->nranks);
    snprintf(fd, sizeof fd, "%d", w->child_listen_fd);
    if (strlen(j->token) >= 16) /* a prefix to tell jobs apart; not enough to join one */
        snprintf(tok, sizeof tok, "%.8s\xe2\x80\xa6", j->token); /* U+2026: 1 column, 3 bytes */
    else
        snprintf(tok, sizeof tok, "(%zu chars)", strlen(j->token));
    struct {
        const char *name, *value;
    } rows[] = {
        {"PADDLE_CURRENT_ENDPOINT", j->endpoints[w->rank]},
        {"PADDLE_TRAINERS_NUM", num},
        {"PADDLE_TRAINER_ENDPOINTS", j->endpoints_str},
        {"FLAGS_selected_gpus", w->gpu},
        {"PADDLE_TRAINER_ID", rank},
        {"FLEET_JOB_TOKEN", tok},
        {"FLEET_LISTEN_FD", fd},
    };
    int nrows = j->own_sockets ? 7 : 6;
    enum { VALUE_MAX = 72 }; /* longer values (many endpoints) are cut with "..." */
    int wname = 16, wval = 5;
    for (int r = 0; r < nrows; r++) {
        int len = (int)strlen(rows[r].name);
        int vlen = (int)strlen(rows[r].value);
        if (strstr(rows[r].value, "\xe2\x80\xa6"))
            vlen -= 2;
        wname = len > wname ? len : wname;
        vlen = vlen > VALUE_MAX ? VALUE_MAX : vlen;
        wval = vlen > wval ? vlen : wval;
    }
    int inner = 4 + wname + 8 + wval + 4;
    char bar_eq[512], bar_dash[512];
    memset(bar_eq, '=', (size_t)inner);
    bar_eq[inner] = '\0';
    memset(bar_dash, '-', (size_t)inner);
    bar_dash[inner] = '\0';
    printf("    +%s+\n", bar_eq);
    printf("    |    %*s        %*s%*s    |\n", wname, "Distributed Envs", (wval + 5) / 2, "Value",
           wval - (wval + 5) / 2, "");
    printf("    +%s+\n", bar_dash);
    for (int r = 0; r < nrows; r++) {
        const char *v = rows[r].value;
        int vlen = (int)strlen(v), bytes = vlen;
        if (strstr(v, "\xe2\x80\xa6"))
            vlen -= 2;
        char cut[VALUE_MAX + 8];
        if (vlen > VALUE_MAX) {
            snprintf(cut, sizeof cut, "%.*s...", VALUE_MAX - 3, v);
            v = cut;
            vlen = bytes = VALUE_MAX;
        }
        int left = (wval - vlen) / 2, right = wval - vlen - left;
        printf("    |    %*s        %*s%.*s%*s    |\n", wname, rows[r].name, left, "", bytes, v,
               right, "");
    }
    printf("    +%s+\n", bar_eq);
    fflush(stdout);
}

/* ---------------------------------------------------------------- workers */

static void set_env_int(const char *name, int v) {
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

/* In the child: own process group, dies with fleetrun, worker i's environment, exec. */
static void run_child(job *j, int i, int out_fd) __attribute__((noreturn));
static void run_child(job *j, int i, int out_fd) {
    worker *w = &j->w[i];
    sigset_t none;
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != j->self) /* fleetrun died before prctl took effect */
        _exit(128 + SIGKILL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0 && null_fd != 0) {
        dup2(null_fd, 0);
        close(null_fd);
    }
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    set_env_int("PADDLE_TRAINER_ID", w->rank);
    set_env_int("PADDLE_TRAINERS_NUM", j->nranks);
    setenv("PADDLE_TRAINER_ENDPOINTS", j->endpoints_str, 1);
    setenv("PADDLE_CURRENT_ENDPOINT", j->endpoints[w->rank], 1);
    setenv("FLAGS_selected_gpus", w->gpu, 1);
    setenv("FLEET_JOB_TOKEN", j->token, 1);
    if (w->child_listen_fd >= 0) {
        set_env_int("FLEET_LISTEN_FD", w->child_listen_fd);
        fcntl(w->child_listen_fd, F_SETFD, 0); /* only this worker's socket survives exec */
    } else {
        unsetenv("FLEET_LISTEN_FD");
    }
    execvp(j->o.argv[0], j->o.argv);
    int e = errno;
    dprintf(2, "fleetrun: cannot execute '%s': %s\n", j->o.argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

static int start_worker(job *j, int i) {
    worker *w = &j->w[i];
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        say("error: pipe for worker %d: %s", i, strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        say("error: cannot start worker %d: %s", i, strerror(errno));
        close(p[0]);
        close(p[1]);
        return 1;
    }
    if (pid == 0)
        run_child(j, i, p[1]);
    setpgid(pid, pid); /* also here, so the group exists before we ever signal it */
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    w->pid = pid;
    w->out_fd = p[0];
    if (w->listen_fd >= 0) {
        close(w->listen_fd); /* the worker has its copy now */
        w->listen_fd = -1;
    }
    j->nstarted++;
    return 0;
}

/* A worker's process group still has members (the worker, or what it left behind). */
static bool group_alive(const worker *w) {
    if (w->pid <= 0)
        return false;
    if (!w->reaped)
        return true;
    return kill(-w->pid, 0) == 0;
}

static int groups_alive(const job *j) {
    int n = 0;
    for (int i = 0; i < j->nstarted; i++)
        n += group_alive(&j->w[i]);
    return n;
}

static void signal_groups(job *j, int sig) {
    for (int i = 0; i < j->nstarted; i++)
        if (group_alive(&j->w[i]))
            kill(-j->w[i].pid, sig);
}

/* ---------------------------------------------------------------- output */

static void terminal_write(job *j, const char *p, size_t n) {
    if (j->term_fd >= 0 && write_all(j->term_fd, p, n) < 0)
        j->term_fd = -1; /* closed pipe or full disk: keep logging to files */
}

/* Rank 0 to the terminal in whole lines, so fleetrun's own messages never split one. */
static void terminal_copy(job *j, const char *p, size_t n, bool eof) {
    while (n > 0) {
        size_t k = LINEBUF_CAP - j->nline < n ? LINEBUF_CAP - j->nline : n;
        memcpy(j->line + j->nline, p, k);
        j->nline += k;
        p += k;
        n -= k;
        size_t upto = j->nline;
        while (upto > 0 && j->line[upto - 1] != '\n')
            upto--;
        if (upto == 0 && j->nline == LINEBUF_CAP)
            upto = j->nline; /* one very long line: let it through */
        terminal_write(j, j->line, upto);
        memmove(j->line, j->line + upto, j->nline - upto);
        j->nline -= upto;
    }
    if (eof && j->nline) {
        terminal_write(j, j->line, j->nline);
        j->nline = 0;
    }
}

/* Copies what worker i has written so far to its log (and the terminal for rank 0). */
static void pump(job *j, int i) {
    worker *w = &j->w[i];
    char buf[65536];
    for (int rounds = 0; w->out_fd >= 0 && rounds < 16; rounds++) {
        ssize_t k = read(w->out_fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return;
        if (k <= 0) {
            close(w->out_fd);
            w->out_fd = -1;
            if (w->rank == 0)
                terminal_copy(j, "", 0, true);
            return;
        }
        if (w->log_fd >= 0 && write_all(w->log_fd, buf, (size_t)k) < 0) {
            say("warning: cannot write %s: %s; its output is lost from here", w->log_path,
                strerror(errno));
            close(w->log_fd);
            w->log_fd = -1;
        }
        if (w->rank == 0)
            terminal_copy(j, buf, (size_t)k, false);
    }
}

/* The last n lines of a file, or NULL; *len gets the length. Caller frees. */
static char *file_tail(const char *path, int n, size_t *len) {
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        goto fail;
    off_t start = st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0;
    size_t want = (size_t)(st.st_size - start), got = 0;
    buf = malloc(want + 1);
    if (!buf)
        goto fail;
    for (int tries = 0; got < want && tries < 64; tries++) {
        ssize_t k = pread(fd, buf + got, want - got, start + (off_t)got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    size_t end = got, b = end;
    if (b > 0 && buf[b - 1] == '\n')
        b--;
    for (int lines = 0; b > 0; b--)
        if (buf[b - 1] == '\n' && ++lines == n)
            break;
    memmove(buf, buf + b, end - b);
    *len = end - b;
    buf[*len] = '\0';
    return buf;
fail:
    if (fd >= 0)
        close(fd);
    free(buf);
    return NULL;
}

static void describe_status(int st, char *out, size_t cap) {
    if (WIFEXITED(st)) {
        snprintf(out, cap, "exited with code %d", WEXITSTATUS(st));
    } else {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        snprintf(out, cap, "killed by signal %d (SIG%s)", WTERMSIG(st), abbrev ? abbrev : "?");
    }
}

static int status_code(int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The first failure: which worker, how, and the end of its log. */
static void report_failure(job *j, int i) {
    worker *w = &j->w[i];
    char how[64];
    describe_status(w->status, how, sizeof how);
    for (int k = 0; k < 64 && w->out_fd >= 0; k++) /* its last words, before reading the log */
        pump(j, i);
    say("worker %d (rank %d) %s", i, w->rank, how);
    size_t len = 0;
    char *tail = file_tail(w->log_path, TAIL_LINES, &len);
    if (!tail || len == 0) {
        fprintf(stderr, "fleetrun: (%s is empty)\n", w->log_path);
    } else {
        fprintf(stderr, "----- last %d lines of %s -----\n", TAIL_LINES, w->log_path);
        fwrite(tail, 1, len, stderr);
        if (tail[len - 1] != '\n')
            fputc('\n', stderr);
        fprintf(stderr, "----- end of %s -----\n", w->log_path);
    }
    free(tail);
}

/* Later failures while the others wind down: one line each, with the log's last line (a fleet
 * worker names the dead peer there). */
static void report_secondary(job *j, int i) {
    worker *w = &j->w[i];
    char how[64];
    describe_status(w->status, how, sizeof how);
    for (int k = 0; k < 64 && w->out_fd >= 0; k++)
        pump(j, i);
    size_t len = 0;
    char *tail = file_tail(w->log_path, 1, &len);
    if (tail && len && tail[len - 1] == '\n')
        tail[--len] = '\0';
    say("worker %d (rank %d) %s%s%s", i, w->rank, how, len ? ": " : "", len ? tail : "");
    free(tail);
}

/* ---------------------------------------------------------------- the loop */

static void enter_phase(job *j, enum phase p, double seconds) {
    j->phase = p;
    j->deadline = now_s() + seconds;
    if ((p == PHASE_TERM || p == PHASE_KILL) && j->failed_unsignalled < 0)
        j->failed_unsignalled = j->nfailed;
    if (p == PHASE_TERM)
        signal_groups(j, SIGTERM);
    else if (p == PHASE_KILL)
        signal_groups(j, SIGKILL);
}

static void on_exit_status(job *j, int i, int st) {
    worker *w = &j->w[i];
    w->reaped = true;
    w->status = st;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return;
    w->reap_order = ++j->nfailed;
    if (j->phase == PHASE_RUN && !j->signal_seen) {
        /* the cause is named after SETTLE_S: when a rank is killed its peers see the reset
         * and may exit (and be reaped) before the killed one */
        j->settle_until = now_s() + SETTLE_S;
        enter_phase(j, PHASE_GRACE, j->o.grace);
    } else if (j->phase == PHASE_GRACE && j->settle_until == 0) {
        report_secondary(j, i);
        w->reported = true;
    }
}

/* End of the settle window: the cause is the first worker killed by a signal, else the first
 * failure reaped; it is reported in full, the others gathered so far one line each. */
static void name_cause(job *j) {
    int cause = -1;
    for (int pass = 0; pass < 2 && cause < 0; pass++)
        for (int i = 0; i < j->nstarted; i++) {
            worker *w = &j->w[i];
            bool ours = j->failed_unsignalled >= 0 && w->reap_order > j->failed_unsignalled;
            if (!w->reap_order || (pass == 0 && (!WIFSIGNALED(w->status) || ours)))
                continue;
            if (cause < 0 || w->reap_order < j->w[cause].reap_order)
                cause = i;
        }
    j->settle_until = 0;
    if (cause < 0)
        return;
    j->exit_code = status_code(j->w[cause].status);
    report_failure(j, cause);
    j->w[cause].reported = true;
    for (int order = 1; order <= j->nfailed; order++)
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].reap_order == order && !j->w[i].reported) {
                report_secondary(j, i);
                j->w[i].reported = true;
            }
}

static void reap(job *j) {
    for (int guard = 0; guard < 100000; guard++) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].pid == pid && !j->w[i].reaped)
                on_exit_status(j, i, st);
        /* anything else is an orphan of a worker, reparented to us (subreaper) */
    }
}

static void on_signal(job *j, int sig) {
    if (!j->signal_seen) {
        j->signal_seen = sig;
        say("got SIG%s: stopping %d worker(s) (SIGTERM, SIGKILL after %g s)", sigabbrev_np(sig),
            groups_alive(j), j->o.grace);
        enter_phase(j, PHASE_TERM, j->o.grace);
    } else if (j->phase != PHASE_KILL) {
        say("got SIG%s again: SIGKILL", sigabbrev_np(sig));
        enter_phase(j, PHASE_KILL, KILL_WAIT_S);
    }
}

static void run_loop(job *j) {
    double drain_until = -1;
    for (;;) {
        if (j->settle_until > 0 && now_s() >= j->settle_until)
            name_cause(j);
        int alive = groups_alive(j);
        int open_pipes = 0;
        for (int i = 0; i < j->nstarted; i++)
            open_pipes += j->w[i].out_fd >= 0;
        double t = now_s();
        if (alive == 0) {
            if (j->settle_until > 0)
                name_cause(j);
            if (drain_until < 0)
                drain_until = t + DRAIN_WAIT_S;
            if (open_pipes == 0 || t >= drain_until)
                return;
        }
        /* every worker's leader gone but its group not: stragglers get the grace, too */
        if (j->phase == PHASE_RUN && alive > 0) {
            int leaders = 0;
            for (int i = 0; i < j->nstarted; i++)
                leaders += !j->w[i].reaped;
            if (leaders == 0) {
                say("every worker exited, but %d process group(s) still hold processes they "
                    "started; SIGTERM to those in %g s", alive, j->o.grace);
                enter_phase(j, PHASE_GRACE, j->o.grace);
            }
        }
        if (j->phase != PHASE_RUN && t >= j->deadline) {
            if (j->phase == PHASE_GRACE) {
                enter_phase(j, PHASE_TERM, j->o.grace);
            } else if (j->phase == PHASE_TERM) {
                say("%d worker group(s) still running after SIGTERM + %g s: SIGKILL", alive,
                    j->o.grace);
                enter_phase(j, PHASE_KILL, KILL_WAIT_S);
            } else {
                say("error: %d worker group(s) survive SIGKILL after %g s; giving up", alive,
                    KILL_WAIT_S);
                return;
            }
            continue;
        }

        struct pollfd fds[1 + MAX_NPROC];
        int map[1 + MAX_NPROC], nfds = 0;
        fds[nfds] = (struct pollfd){.fd = j->sig_fd, .events = POLLIN};
        map[nfds++] = -1;
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].out_fd >= 0) {
                fds[nfds] = (struct pollfd){.fd = j->w[i].out_fd, .events = POLLIN};
                map[nfds++] = i;
            }
        int timeout_ms = -1;
        if (j->phase != PHASE_RUN || alive == 0) {
            /* group members that are not our children die without telling us: look often */
            double until = alive == 0 ? drain_until : j->deadline;
            double ms = (until - t) * 1000.0;
            timeout_ms = ms < 0 ? 0 : ms > 50 ? 50 : (int)ms + 1;
        } else {
            timeout_ms = 1000; /* a safety net; SIGCHLD wakes us */
        }
        int n = poll(fds, (nfds_t)nfds, timeout_ms);
        if (n < 0 && errno != EINTR) {
            say("error: poll: %s", strerror(errno));
            signal_groups(j, SIGKILL);
            return;
        }
        for (int k = 0; k < nfds && n > 0; k++) {
            if (!fds[k].revents)
                continue;
            if (map[k] >= 0) {
                pump(j, map[k]);
                continue;
            }
            struct signalfd_siginfo si[16];
            ssize_t got = read(j->sig_fd, si, sizeof si);
            for (ssize_t s = 0; s < got / (ssize_t)sizeof si[0]; s++)
                if (si[s].ssi_signo != SIGCHLD)
                    on_signal(j, (int)si[s].ssi_signo);
        }
        reap(j);
    }
}

/* ---------------------------------------------------------------- main */

static void ensure_std_fds(void) {
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0) {
            int n = open("/dev/null", O_RDWR);
            if (n >= 0 && n != fd)
                close(n);
        }
}

static void job_free(job *j) {
    for (int i = 0; j->w && i < j->o.nproc; i++) {
        worker *w = &j->w[i];
        if (w->out_fd >= 0)
            close(w->out_fd);
        if (w->log_fd >= 0)
            close(w->log_fd);
        if (w->listen_fd >= 0)
            close(w->listen_fd);
    }
    if (j->sig_fd >= 0)
        close(j->sig_fd);
    free(j->w);
    free(j->line);
    free(j->endpoints);
    free(j->endpoints_str);
    free(j->o.ips_buf);
}

int main(int argc, char **argv) {
    job j = {.sig_fd = -1, .term_fd = 1, .exit_code = -1,
             .failed_unsignalled = -1};
    int rc;
    ensure_std_fds();
    /* signals wait in the signalfd from the start: a Ctrl-C during set-up stops the workers
     * as soon as they exist instead of killing fleetrun and orphaning them */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);

    rc = parse_args(argc, argv, &j.o);
    if (rc)
        goto fail;
    if ((rc = check_program(j.o.argv[0])) || (rc = find_node(&j)) || (rc = make_token(&j)))
        goto fail;
    j.w = calloc((size_t)j.o.nproc, sizeof *j.w);
    j.line = malloc(LINEBUF_CAP);
    if (!j.w || !j.line) {
        say("error: out of memory");
        rc = 1;
        goto fail;
    }
    for (int i = 0; i < j.o.nproc; i++) {
        worker *w = &j.w[i];
        w->out_fd = w->log_fd = w->listen_fd = w->child_listen_fd = -1;
        w->rank = j.node * j.o.nproc + i;
        snprintf(w->gpu, sizeof w->gpu, "%d", j.o.ngpus ? j.o.gpus[i] : i);
    }
    if ((rc = make_endpoints(&j)) || (rc = open_logs(&j)))
        goto fail;
    j.sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (j.sig_fd < 0) {
        say("error: signalfd: %s", strerror(errno));
        rc = 1;
        goto fail;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans of workers come to us and get reaped */
    j.self = getpid();

    printf("fleetrun: node %d of %d (%s), %d worker(s), ranks %d..%d of %d; logs in %s/workerlog.*\n",
           j.node, j.o.nnodes, j.o.ips[j.node], j.o.nproc, j.w[0].rank,
           j.w[j.o.nproc - 1].rank, j.nranks, j.o.log_dir);
    printf("fleetrun: first worker's distributed environment:\n");
    print_env_table(&j);
    if (j.node != 0)
        printf("fleetrun: rank 0 runs on node 0 (%s); this node's output is in %s/workerlog.*\n",
               j.o.ips[0], j.o.log_dir);
    fflush(stdout);

    for (int i = 0; i < j.o.nproc; i++)
        if ((rc = start_worker(&j, i))) {
            j.exit_code = rc;
            enter_phase(&j, PHASE_TERM, j.o.grace);
            break;
        }
    run_loop(&j);
    if (j.settle_until > 0)
        name_cause(&j);
    if (j.signal_seen)
        rc = 128 + j.signal_seen;
    else
        rc = j.exit_code > 0 ? j.exit_code : 0;
    if (j.nline)
        terminal_copy(&j, "", 0, true);
fail:
    job_free(&j);
    return rc < 0 ? 0 : rc;
}
