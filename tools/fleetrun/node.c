/* node.c - the job as this node sees it, set up before any worker starts: which entry of --ips
 * this node is, the job token, every rank's endpoint (binding the local workers' sockets when
 * fleetrun owns the ports; ps.c's endpoints in a parameter-server job), the log files. */
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
