/* member.c - every node's side of a coordinated job (coord.c runs the rounds on node 0): join
 * a round and learn its nodes, whose workers are ranks in node order (a node's ranks follow
 * the nodes before it, each node with its own --nproc_per_node); tell the coordinator a
 * failure as soon as its cause is named and when this node's workers are all gone; stop the
 * workers when the coordinator says so. Losing the coordinator (node 0) ends the job here.
 * The connection first proves the job token both ways (auth.c: this node sends AUTH, answers
 * the coordinator's CHALLENGE with its PROOF and checks the coordinator's), then every line is
 * sealed; a line from the coordinator that fails its check stops this node and is reported
 * (BADMAC), so that the coordinator ends the job.
 * Stopping is the run loop's (supervise.c owns phase changes): fr_member_service only says so. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleet/status.h"
#include "fleetrun.h"

int fr_member_connect(job *j) {
    const char *ip = j->o.ips[0];
    int fd = fr_connect(ip, j->o.coord_port, fr_now() + j->o.node_timeout);
    if (fd < 0) {
        fr_say("error: cannot reach the job's coordinator at %s:%d (node 0's fleetrun) within "
               "%g s: %s", ip, j->o.coord_port, j->o.node_timeout, strerror(errno));
        return 1;
    }
    j->coord_fd = fd;
    /* the handshake goes on in the poll loops: node 0's coordinator answers in this process */
    fr_auth *a = &j->coord_auth;
    memset(a, 0, sizeof *a);
    a->node = j->node;
    a->nproc = j->o.nproc;
    char hex[2 * FR_NONCE + 1];
    if (fr_auth_nonce(a->nonce_m, hex) < 0) {
        fr_say("error: %s", fl_errmsg());
        return 1;
    }
    if (fr_send_line(fd, "AUTH fleetrun/%d %d %d %s", FR_COORD_VERSION, j->node, j->o.nproc,
                     hex) < 0) {
        fr_say("error: cannot write to the job's coordinator at %s:%d: %s", ip,
               j->o.coord_port, strerror(errno));
        return 1;
    }
    return 0;
}

static int port_base(const job *j) { return j->o.port ? j->o.port : FR_DEFAULT_PORT; }

/* "GO <round> <n> <node>:<nproc>..." (text after the tab cut off): the round's ranks and
 * endpoints; 0, or 1 when the message does not make sense. */
static int apply_go(job *j, const char *msg) {
    int round, n, off = 0;
    if (sscanf(msg, "GO %d %d%n", &round, &n, &off) != 2 || n < 1 || n > MAX_NODES)
        return 1;
    int node[MAX_NODES], nproc[MAX_NODES], total = 0, first = -1;
    const char *p = msg + off;
    for (int m = 0; m < n; m++) {
        int used = 0;
        if (sscanf(p, " %d:%d%n", &node[m], &nproc[m], &used) != 2 || node[m] < 0 ||
            node[m] >= j->o.nnodes || nproc[m] < 1 || nproc[m] > MAX_NPROC)
            return 1;
        p += used;
        if (node[m] == j->node) {
            first = total;
            j->member_index = m;
            if (nproc[m] != j->o.nproc)
                return 1;
        }
        total += nproc[m];
    }
    if (first < 0 || total > 4096)
        return 1;
    free(j->endpoints);
    free(j->endpoints_str);
    j->endpoints = calloc((size_t)total, sizeof *j->endpoints);
    j->endpoints_str = calloc((size_t)total, ENDPOINT_MAX);
    if (!j->endpoints || !j->endpoints_str)
        return 1;
    int r = 0;
    for (int m = 0; m < n; m++)
        for (int i = 0; i < nproc[m]; i++)
            fr_format_endpoint(j->endpoints[r++], j->o.ips[node[m]], port_base(j) + i);
    size_t used = 0;
    for (int k = 0; k < total; k++)
        used += (size_t)sprintf(j->endpoints_str + used, "%s%s", k ? "," : "", j->endpoints[k]);
    j->nranks = total;
    j->nmembers = n;
    j->round = round;
    for (int i = 0; i < j->o.nproc; i++)
        j->w[i].rank = first + i;
    char suffix[16] = "";
    int ns = round ? snprintf(suffix, sizeof suffix, ".%d", round) : 0;
    snprintf(j->token, sizeof j->token, "%.*s%s", MAX_TOKEN - ns, j->base_token, suffix);
    return 0;
}

static int send_hello(job *j) {
    return fr_send_sealed(j->coord_fd, &j->coord_auth, "HELLO %d %d", j->node, j->o.nproc);
}

/* A line from the coordinator as it came: 1 when line now holds an authenticated message; 0
 * when it was a step of the handshake (done here; its end sends this node's HELLO); -1 when
 * this node must leave the job (told, j->end_code set). Before the handshake is done an END is
 * passed on as it is (the coordinator's refusal: unauthenticated, it can only end this node). */
static int take_line(job *j, char *line) {
    fr_auth *a = &j->coord_auth;
    const char *ip = j->o.ips[0];
    int port = j->o.coord_port;
    char hex[2 * FR_MAC + 1];
    if (a->step == FR_AUTH_DONE) {
        if (fr_open_sealed(a, line) == 0)
            return 1;
        fr_say("error: a line from the job's coordinator at %s:%d (node 0's fleetrun) failed "
               "its integrity check at node %d (%s) (changed or forged on the way; not used): "
               "this node leaves the job", ip, port, j->node, j->o.ips[j->node]);
        fr_send_sealed(j->coord_fd, a, "BADMAC"); /* so that the coordinator ends the job */
        j->end_code = 1;
        return -1;
    }
    if (strncmp(line, "END ", 4) == 0)
        return 1;
    unsigned round;
    int off = 0;
    if (a->step == FR_AUTH_START && sscanf(line, "CHALLENGE %u %n", &round, &off) == 1 && off &&
        fr_parse_hex(line + off, a->nonce_c, FR_NONCE) && !line[off + 2 * FR_NONCE]) {
        a->round = round;
        if (fr_auth_proof(j->base_token, FR_SIDE_MEMBER, a, hex) < 0 ||
            fr_send_line(j->coord_fd, "PROOF %s", hex) < 0) {
            fr_say("error: cannot answer the challenge of the job's coordinator at %s:%d",
                   ip, port);
            j->end_code = 1;
            return -1;
        }
        a->step = FR_AUTH_PROVED;
        return 0;
    }
    if (a->step == FR_AUTH_PROVED && strncmp(line, "PROOF ", 6) == 0) {
        if (!fr_auth_check(j->base_token, FR_SIDE_COORD, a, line + 6)) {
            fr_say("error: the job's coordinator at %s:%d did not prove that it knows the job "
                   "token (another job's fleetrun, or a stranger, answers there): this node "
                   "leaves the job", ip, port);
            j->end_code = 1;
            return -1;
        }
        if (fr_auth_keys(j->base_token, FR_SIDE_MEMBER, a) < 0 || send_hello(j) < 0) {
            fr_say("error: cannot join the job's coordinator at %s:%d", ip, port);
            j->end_code = 1;
            return -1;
        }
        return 0;
    }
    fr_say("error: the job's coordinator at %s:%d answered '%.60s', not a step of fleetrun's "
           "authentication (another program on that port, or another fleetrun version on node "
           "0?)", ip, port, line);
    j->end_code = 1;
    return -1;
}

/* A line from the coordinator outside the join: STOP or END stop this node's workers; true
 * when this line is the one that stops them. */
static bool on_line(job *j, char *line) {
    char *tab = strchr(line, '\t');
    const char *why = tab ? tab + 1 : "";
    if (tab)
        *tab = 0;
    int round, code;
    bool stop = sscanf(line, "STOP %d", &round) == 1 && round == j->round;
    if (sscanf(line, "END %d", &code) == 1) {
        j->end_code = code;
        stop = true;
    }
    if (!stop || j->stopped_remote)
        return false;
    j->stopped_remote = true;
    if (j->phase == PHASE_RUN && fr_groups_alive(j))
        fr_say("stopping this node's %d worker(s): %s", fr_groups_alive(j), why);
    return true;
}

/* Closes the connection; true when this node's workers are to stop (not already stopped). */
static bool lost_coordinator(job *j, const char *how) {
    if (j->end_code < 0) {
        fr_say("error: lost the job's coordinator at %s:%d (node 0's fleetrun): %s; stopping "
               "this node's workers", j->o.ips[0], j->o.coord_port, how);
        j->end_code = 1;
    }
    close(j->coord_fd);
    j->coord_fd = -1;
    fr_auth_wipe(&j->coord_auth);
    if (j->stopped_remote)
        return false;
    j->stopped_remote = true;
    return true;
}

int fr_member_pollfds(job *j, struct pollfd *fds, int cap) {
    int n = 0;
    if (j->coord_fd >= 0 && cap > 0)
        fds[n++] = (struct pollfd){.fd = j->coord_fd, .events = POLLIN};
    return n + fr_coord_pollfds(j, fds + n, cap - n);
}

bool fr_member_service(job *j, const struct pollfd *fds, int n) {
    int own = 0;
    bool stop = false;
    if (j->coord_fd >= 0 && n > 0 && fds[0].fd == j->coord_fd) {
        own = 1;
        /* lines read with the round's GO wait in coord_in: taken even when nothing new came */
        int rc = fds[0].revents ? fr_recv(j->coord_fd, &j->coord_in) : 1;
        char line[16384];
        bool gone = false;
        while (!gone && fr_next_line(&j->coord_in, line, sizeof line)) {
            int t = take_line(j, line);
            if (t > 0)
                stop |= on_line(j, line);
            else if (t < 0) { /* told */
                stop |= lost_coordinator(j, "a line failed its check");
                gone = true;
            }
        }
        if (!gone && rc <= 0)
            stop |= lost_coordinator(j, rc < 0 ? "connection broken" : "connection closed");
    }
    fr_coord_service(j, fds + own, n - own);
    return stop;
}

int fr_member_join(job *j) {
    /* the first round's HELLO follows the handshake (take_line) */
    if (j->coord_auth.step == FR_AUTH_DONE && send_hello(j) < 0) {
        (void)lost_coordinator(j, "cannot send"); /* no workers yet: nothing to stop */
        return 1;
    }
    for (;;) {
        struct pollfd fds[2 + MAX_NODES + 32];
        fds[0] = (struct pollfd){.fd = j->sig_fd, .events = POLLIN};
        int n = 1 + fr_member_pollfds(j, fds + 1, (int)(sizeof fds / sizeof fds[0]) - 1);
        double wait = fr_coord_deadline(j) - fr_now();
        int ms = wait > 1.0 ? 1000 : wait < 0 ? 0 : (int)(wait * 1000) + 1;
        if (memchr(j->coord_in.buf, '\n', j->coord_in.len)) /* a line is waiting already */
            ms = 0;
        if (poll(fds, (nfds_t)n, ms) < 0 && errno != EINTR) {
            fr_say("error: poll: %s", strerror(errno));
            return 1;
        }
        if (fds[0].revents) {
            struct signalfd_siginfo si[16];
            ssize_t got = read(j->sig_fd, si, sizeof si);
            for (ssize_t s = 0; s < got / (ssize_t)sizeof si[0]; s++)
                if (si[s].ssi_signo != SIGCHLD) {
                    fr_say("got SIG%s while waiting for the round to start: stopping",
                           sigabbrev_np((int)si[s].ssi_signo));
                    return 128 + (int)si[s].ssi_signo;
                }
            while (waitpid(-1, NULL, WNOHANG) > 0) /* orphans of the last round */
                ;
        }
        /* the coordinator first (node 0): it may answer this node's HELLO at once */
        int own = j->coord_fd >= 0 ? 1 : 0;
        fr_coord_service(j, fds + 1 + own, n - 1 - own);
        if (!own)
            continue;
        int rc = fds[1].revents ? fr_recv(j->coord_fd, &j->coord_in) : 1;
        char line[16384];
        while (fr_next_line(&j->coord_in, line, sizeof line)) {
            int t = take_line(j, line);
            if (t < 0) {
                (void)lost_coordinator(j, "a line failed its check"); /* told; no workers */
                return 1;
            }
            if (t == 0)
                continue;
            char *tab = strchr(line, '\t');
            const char *why = tab ? tab + 1 : "";
            if (tab)
                *tab = 0;
            int code;
            if (sscanf(line, "END %d", &code) == 1) {
                if (why[0])
                    fr_say("%s", why);
                j->end_code = code;
                return -1;
            }
            if (strncmp(line, "GO ", 3) == 0) {
                if (apply_go(j, line)) {
                    fr_say("error: the coordinator's round does not make sense here: '%.200s'",
                           line);
                    return 1;
                }
                if (why[0])
                    fr_say("%s", why);
                return 0;
            }
            /* a STOP of a round already over: nothing to do */
        }
        if (rc <= 0) {
            fr_say("error: lost the job's coordinator at %s:%d (node 0's fleetrun) while "
                   "waiting for the round to start%s", j->o.ips[0], j->o.coord_port,
                   j->coord_auth.step == FR_AUTH_DONE ? ""
                   : ", before it authenticated (another fleetrun version on node 0?)");
            return 1;
        }
    }
}

void fr_member_failed(job *j) {
    if (j->coord_fd < 0 || j->cause < 0)
        return;
    const worker *w = &j->w[j->cause];
    bool ours = j->failed_unsignalled >= 0 && w->reap_order > j->failed_unsignalled;
    /* a STOP may arrive while this node gathers its own failures (another node's workers saw
     * the reset first): a worker killed by a signal not ours still outranks their exit codes */
    if (j->stopped_remote && (!WIFSIGNALED(w->status) || ours))
        return;
    char how[64];
    fr_describe_status(w->status, how, sizeof how);
    fr_send_sealed(j->coord_fd, &j->coord_auth,
                   "FAIL %d %d %d\tnode %d (%s): worker %d (rank %d) %s", j->round, j->exit_code,
                   WIFSIGNALED(w->status) && !ours ? 1 : 0, j->node, j->o.ips[j->node], j->cause,
                   w->rank, how);
}

void fr_member_exited(job *j) {
    if (j->coord_fd < 0)
        return;
    const char *how = j->exit_code > 0 ? "failed" : j->stopped_remote ? "stopped" : "ok";
    if (j->exit_code <= 0 && !j->stopped_remote)
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].reaped && j->w[i].status != 0)
                how = "failed";
    fr_send_sealed(j->coord_fd, &j->coord_auth, "EXIT %d %d %s", j->round,
                   j->exit_code > 0 ? j->exit_code : 0, how);
}
