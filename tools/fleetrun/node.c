/* node.c - the job as this node sees it, set up before any worker starts: which entry of --ips
 * this node is, the job token, every rank's endpoint (binding the local workers' sockets when
 * fleetrun owns the ports), the log files, and the environment table printed at start. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fleetrun.h"


bool fr_ifaddrs_have(const struct ifaddrs *ifs, ip_addr want) {
    for (const struct ifaddrs *f = ifs; f; f = f->ifa_next) {
        if (!f->ifa_addr)
            continue;
        ip_addr have = {.family = f->ifa_addr->sa_family};
        if (have.family == AF_INET)
            memcpy(have.a, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, 4);
        else if (have.family == AF_INET6)
            memcpy(have.a, &((struct sockaddr_in6 *)f->ifa_addr)->sin6_addr, 16);
        else
            continue;
        if (fr_ip_equal(want, have))
            return true;
    }
    return false;
}

void fr_ifaddrs_ipv4(const struct ifaddrs *ifs, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (const struct ifaddrs *f = ifs; f; f = f->ifa_next) {
        char s[INET6_ADDRSTRLEN];
        if (!f->ifa_addr || f->ifa_addr->sa_family != AF_INET)
            continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, s, sizeof s);
        if (used + strlen(s) + 3 < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", s);
    }
}

/* This node's index: --node_ip's position in --ips, or the first entry that is an address of
 * a local interface. A single node is node 0 without asking. Returns 0 or 2. */
int fr_find_node(job *j) {
    options *o = &j->o;
    if (o->node_ip) {
        ip_addr me = fr_parse_ip(o->node_ip);
        for (int n = 0; n < o->nnodes; n++)
            if (fr_ip_equal(fr_parse_ip(o->ips[n]), me)) {
                j->node = n;
                return 0;
            }
        return fr_arg_error("--node_ip %s is not one of --ips", o->node_ip);
    }
    if (o->nnodes == 1) {
        j->node = 0;
        return 0;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return fr_arg_error("cannot list this machine's addresses (%s); pass --node_ip",
                         strerror(errno));
    char local[1024];
    j->node = -1;
    for (int n = 0; n < o->nnodes && j->node < 0; n++)
        if (fr_ifaddrs_have(ifs, fr_parse_ip(o->ips[n])))
            j->node = n;
    fr_ifaddrs_ipv4(ifs, local, sizeof local);
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
int fr_make_token(job *j) {
    const char *t = getenv("FLEET_JOB_TOKEN");
    if (t && *t) {
        size_t n = strlen(t);
        if (n > MAX_TOKEN)
            return fr_arg_error("FLEET_JOB_TOKEN is %zu characters; at most %d", n, MAX_TOKEN);
        for (size_t i = 0; i < n; i++)
            if (t[i] <= ' ' || t[i] > '~')
                return fr_arg_error("FLEET_JOB_TOKEN: only printable characters without spaces");
        memcpy(j->token, t, n + 1);
        memcpy(j->base_token, t, n + 1);
        return 0;
    }
    if (random_hex(j->token, 16) < 0) {
        fr_say("error: cannot read /dev/urandom for the job token: %s", strerror(errno));
        return 1;
    }
    memcpy(j->base_token, j->token, sizeof j->base_token);
    if (j->o.nnodes > 1 || j->ps_remote) {
        if (j->ps_remote)
            fprintf(stderr, "fleetrun: error: a job whose servers and workers run on several "
                    "machines needs the same FLEET_JOB_TOKEN on every machine (servers and "
                    "workers refuse connections without it)\n");
        else
            fprintf(stderr, "fleetrun: error: a job on %d nodes needs the same FLEET_JOB_TOKEN "
                    "on every node (workers refuse connections without it)\n", j->o.nnodes);
        fprintf(stderr, "hint: export FLEET_JOB_TOKEN=%s   (this value, on every node, then "
                "rerun)\n", j->token);
        return 2;
    }
    return 0;
}

/* One listening socket per local worker on IP:0; the kernel picks free ports. */
static int bind_sockets(job *j) {
    const char *ip = j->o.ips[j->node];
    ip_addr a = fr_parse_ip(ip);
    for (int i = 0; i < j->o.nproc; i++) {
        struct sockaddr_storage ss;
        socklen_t len = fr_sockaddr(a, 0, &ss);
        int fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, SOMAXCONN) < 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
            fr_say("error: cannot listen on %s for worker %d: %s", ip, i, strerror(errno));
            if (fd >= 0)
                close(fd);
            return 1;
        }
        int port = ntohs(a.family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                             : ((struct sockaddr_in6 *)&ss)->sin6_port);
        j->w[i].listen_fd = fd;
        j->w[i].child_listen_fd = fd;
        fr_format_endpoint(j->endpoints[(size_t)j->node * j->o.nproc + i], ip, port);
    }
    return 0;
}

int fr_make_endpoints(job *j) {
    options *o = &j->o;
    if (o->ps)
        return fr_ps_endpoints(j);
    j->nranks = o->nnodes * o->nproc;
    j->endpoints = calloc((size_t)j->nranks, sizeof *j->endpoints);
    j->endpoints_str = calloc((size_t)j->nranks, ENDPOINT_MAX);
    if (!j->endpoints || !j->endpoints_str) {
        fr_say("error: out of memory");
        return 1;
    }
    if (!o->port && o->nnodes == 1) {
        j->own_sockets = true;
        int rc = bind_sockets(j);
        if (rc)
            return rc;
    } else {
        int port = o->port ? o->port : FR_DEFAULT_PORT;
        for (int n = 0; n < o->nnodes; n++)
            for (int i = 0; i < o->nproc; i++)
                fr_format_endpoint(j->endpoints[(size_t)n * o->nproc + i], o->ips[n], port + i);
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

int fr_open_logs(job *j) {
    if (make_dirs(j->o.log_dir) < 0) {
        fr_say("error: cannot create log directory '%s': %s", j->o.log_dir, strerror(errno));
        return 1;
    }
    for (int i = 0; i < j->o.nproc; i++) {
        worker *w = &j->w[i];
        /* PS: serverlog.N / workerlog.N by the index in the role, as Paddle's launcher */
        snprintf(w->log_path, sizeof w->log_path, "%s/%slog.%d", j->o.log_dir,
                 w->role == ROLE_SERVER ? "server" : "worker", j->o.ps ? w->rank : i);
        w->log_fd = open(w->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w->log_fd < 0) {
            fr_say("error: cannot open '%s': %s", w->log_path, strerror(errno));
            return 1;
        }
    }
    return 0;
}

/* The first local worker's environment as a box, as paddle.distributed.launch prints it. */
void fr_print_env_table(const job *j) {
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
    } rows[12] = {
        {"PADDLE_CURRENT_ENDPOINT", j->endpoints[w->rank]},
        {"PADDLE_TRAINERS_NUM", num},
        {"PADDLE_TRAINER_ENDPOINTS", j->endpoints_str},
        {"FLAGS_selected_gpus", w->gpu},
        {"PADDLE_TRAINER_ID", rank},
    };
    int nrows = 5;
    char bufs[8][32];
    if (j->o.ps) { /* the first local worker's rows, or the first server's */
        const char *ps_rows[10][2];
        nrows = fr_ps_env_rows(j, ps_rows, 10, bufs);
        for (int r = 0; r < nrows; r++) {
            rows[r].name = ps_rows[r][0];
            rows[r].value = ps_rows[r][1];
        }
        for (int i = 0; i < j->o.nproc; i++)
            if (j->w[i].role == ROLE_WORKER) {
                w = &j->w[i];
                break;
            }
        snprintf(fd, sizeof fd, "%d", w->child_listen_fd);
    }
    rows[nrows].name = "FLEET_JOB_TOKEN";
    rows[nrows++].value = tok;
    if (w->child_listen_fd >= 0) {
        rows[nrows].name = "FLEET_LISTEN_FD";
        rows[nrows++].value = fd;
    }
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
