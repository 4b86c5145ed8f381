/* coord.c - node 0's coordinator of a job of several nodes (--max_restarts or --nnodes
 * MIN:MAX with several --ips), torchrun's rendezvous in fleetrun's terms. Every node's fleetrun
 * (node 0's too, over loopback) joins each round here (member.c). A round starts when every
 * node has joined, or, after --node_timeout, with the nodes that did if they are at least MIN
 * (scale in; node 0 must be one: it holds this coordinator and rank 0). A failure anywhere
 * stops the round on every node; once every node's workers are gone, the cause is named (a
 * lost node before a worker killed by a signal before one that exited, each in the order
 * heard) and the restart policy decided here, once for the job: status 2 is not restarted,
 * after --max_restarts rounds the job ends with the last failure's status, else every node
 * that comes back joins the next round. The wire is lines.c's: every connection first proves
 * that both ends know the job token (auth.c; a stranger, a wrong token or an older fleetrun is
 * refused, named by its address, while the job goes on), then every line is sealed, and a line
 * that fails its check ends the job naming the node. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fleet/status.h"
#include "fleetrun.h"

#define MAX_CONN  (MAX_NODES + 16) /* every node, and a few strangers at a time */
#define AUTH_WAIT 10.0             /* seconds a connection has to prove the token */

typedef struct {
    int     fd;
    int     node;    /* -1 until its HELLO */
    int     nproc;
    bool    waiting; /* joined the next round */
    bool    member;  /* of the round running */
    bool    exited;  /* its workers are gone (EXIT heard, or the node lost) */
    bool    failed;  /* it sent a FAIL this round */
    fr_auth auth;    /* its challenge-response, then its line keys (auth.c) */
    double  auth_deadline; /* until the handshake is done */
    char    peer[ENDPOINT_MAX]; /* its address, "ip:port" */
    linebuf in;
} conn;

enum cstate { C_JOIN, C_RUN, C_END };

struct coord {
    int         listen_fd;
    conn       *c[MAX_CONN];
    int         nconn;
    enum cstate state;
    int         round;          /* joined or running */
    double      join_deadline;  /* C_JOIN */
    int         nmembers;       /* C_RUN */
    /* the running round's failure: the cause so far, and how long the nodes may take to stop */
    bool        failed;
    int         cause_prio, cause_code;
    char        cause[640];
    double      stop_deadline;
    char        note[1024];     /* why the next round starts */
};

static const char *node_ip(const job *j, int node) { return j->o.ips[node]; }

int fr_coord_open(job *j) {
    coord *k = calloc(1, sizeof *k);
    if (!k) {
        fr_say("error: out of memory");
        return 1;
    }
    k->listen_fd = -1;
    j->coord = k;
    const char *ip = node_ip(j, 0);
    ip_addr a = fr_parse_ip(ip);
    struct sockaddr_storage ss;
    socklen_t len = fr_sockaddr(a, j->o.coord_port, &ss);
    int one = 1, fd = socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, SOMAXCONN) < 0) {
        fr_say("error: cannot listen on %s:%d for the job's coordinator (--coord_port): %s", ip,
               j->o.coord_port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    k->listen_fd = fd;
    k->state = C_JOIN;
    k->join_deadline = fr_now() + j->o.node_timeout;
    return 0;
}

static void drop(coord *k, int i) {
    close(k->c[i]->fd);
    fr_auth_wipe(&k->c[i]->auth);
    free(k->c[i]);
    k->c[i] = k->c[--k->nconn];
}

void fr_coord_free(job *j) {
    coord *k = j->coord;
    if (!k)
        return;
    while (k->nconn)
        drop(k, 0);
    if (k->listen_fd >= 0)
        close(k->listen_fd);
    free(k);
    j->coord = NULL;
}

int fr_coord_pollfds(job *j, struct pollfd *fds, int cap) {
    coord *k = j->coord;
    int n = 0;
    if (!k || cap < 1)
        return 0;
    fds[n++] = (struct pollfd){.fd = k->listen_fd, .events = POLLIN};
    for (int i = 0; i < k->nconn && n < cap; i++)
        fds[n++] = (struct pollfd){.fd = k->c[i]->fd, .events = POLLIN};
    return n;
}

double fr_coord_deadline(const job *j) {
    const coord *k = j->coord;
    if (!k)
        return 1e300;
    double t = 1e300;
    if (k->state == C_JOIN)
        t = k->join_deadline;
    if (k->state == C_RUN && k->failed)
        t = k->stop_deadline;
    for (int i = 0; i < k->nconn; i++)
        if (k->c[i]->auth.step != FR_AUTH_DONE && k->c[i]->auth_deadline < t)
            t = k->c[i]->auth_deadline;
    return t;
}

/* "ip:port" of the connection's other end, into out (ENDPOINT_MAX bytes). */
static void peer_of(int fd, char *out) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
            port = ntohs(a->sin6_port);
        }
    }
    fr_format_endpoint(out, ip, port);
}

/* One line to a connection: sealed once it is authenticated, else in the clear (the
 * handshake, and a refusal before it is done). */
static void tell(conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tell(conn *c, const char *fmt, ...) {
    char text[16000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (c->auth.step == FR_AUTH_DONE)
        fr_send_sealed(c->fd, &c->auth, "%s", text);
    else
        fr_send_line(c->fd, "%s", text);
}

/* The job is over: END to every node that joined, code and why. */
static void end_job(job *j, int code, const char *why) {
    coord *k = j->coord;
    k->state = C_END;
    for (int i = 0; i < k->nconn; i++)
        if (k->c[i]->node >= 0)
            tell(k->c[i], "END %d\t%s", code, why);
}

/* A failure of the running round: the first sends STOP to every node still running. */
static void record_failure(job *j, int prio, int code, const char *text) {
    coord *k = j->coord;
    if (!k->failed) {
        k->failed = true;
        k->stop_deadline = fr_now() + j->o.node_timeout + 3 * j->o.grace;
        for (int i = 0; i < k->nconn; i++)
            if (k->c[i]->member && !k->c[i]->exited)
                tell(k->c[i], "STOP %d\t%s", k->round, text);
    }
    if (k->cause[0] == 0 || prio > k->cause_prio) {
        k->cause_prio = prio;
        k->cause_code = code;
        snprintf(k->cause, sizeof k->cause, "%s", text);
    }
}

static int by_node(const void *a, const void *b) {
    return (*(conn *const *)a)->node - (*(conn *const *)b)->node;
}

/* Starts the round with the nodes waiting; missing lists those that are not (for the note). */
static void start_round(job *j, const char *missing) {
    coord *k = j->coord;
    conn *m[MAX_NODES];
    int n = 0;
    for (int i = 0; i < k->nconn; i++)
        if (k->c[i]->node >= 0 && k->c[i]->waiting)
            m[n++] = k->c[i];
    qsort(m, (size_t)n, sizeof *m, by_node);
    char list[MAX_NODES * 12] = "";
    size_t used = 0;
    int workers = 0;
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(list + used, sizeof list - used, " %d:%d", m[i]->node,
                                 m[i]->nproc);
        workers += m[i]->nproc;
    }
    if (missing[0]) {
        size_t nl = strlen(k->note);
        snprintf(k->note + nl, sizeof k->note - nl, "%scontinuing with %d of %d nodes (%d "
                 "workers): %s (--nnodes %d:%d)", nl ? "; " : "", n, j->o.nnodes, workers,
                 missing, j->o.min_nodes, j->o.max_nodes);
    }
    for (int i = 0; i < n; i++) {
        m[i]->waiting = m[i]->exited = m[i]->failed = false;
        m[i]->member = true;
        tell(m[i], "GO %d %d%s\t%s", k->round, n, list, k->note);
        /* a node gone already fails the round when its EOF is read */
    }
    k->nmembers = n;
    k->state = C_RUN;
    k->failed = false;
    k->cause[0] = 0;
    k->note[0] = 0;
}

/* C_JOIN: start when every node joined, or at the deadline with at least MIN (node 0 one). */
static void check_join(job *j) {
    coord *k = j->coord;
    bool joined[MAX_NODES] = {false};
    int n = 0;
    for (int i = 0; i < k->nconn; i++)
        if (k->c[i]->node >= 0 && k->c[i]->waiting) {
            joined[k->c[i]->node] = true;
            n++;
        }
    bool late = fr_now() >= k->join_deadline;
    if (n < j->o.nnodes && !late)
        return;
    char missing[1024] = "";
    size_t used = 0;
    int nmissing = 0;
    for (int node = 0; node < j->o.nnodes; node++)
        if (!joined[node] && used + 64 < sizeof missing) {
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%snode %d (%s)",
                                     used ? ", " : "", node, node_ip(j, node));
            nmissing++;
        }
    if (used)
        snprintf(missing + used, sizeof missing - used, " did not %s within %g s",
                 k->round ? "rejoin" : "join", j->o.node_timeout);
    if (n >= j->o.min_nodes && joined[0]) {
        start_round(j, missing);
        return;
    }
    char why[1600];
    snprintf(why, sizeof why, "error: round %d: %s; the job needs %s%d node(s)%s", k->round,
             missing, j->o.min_nodes < j->o.nnodes ? "at least " : "", j->o.min_nodes,
             joined[0] ? "" : ", node 0 among them");
    end_job(j, 1, why);
}

/* C_RUN: once every member's workers are gone, the next step. */
static void check_round(job *j) {
    coord *k = j->coord;
    int gone = 0;
    for (int i = 0; i < k->nconn; i++)
        gone += k->c[i]->member && k->c[i]->exited;
    /* members lost (their connection dropped) are no longer in c[] */
    int live = 0;
    for (int i = 0; i < k->nconn; i++)
        live += k->c[i]->member;
    double now = fr_now();
    if (k->failed && now >= k->stop_deadline && gone < live) {
        for (int i = k->nconn - 1; i >= 0; i--)
            if (k->c[i]->member && !k->c[i]->exited) {
                fr_say("node %d (%s) did not stop its workers within %g s of being told: "
                       "dropped from the job", k->c[i]->node, node_ip(j, k->c[i]->node),
                       j->o.node_timeout + 3 * j->o.grace);
                drop(k, i);
            }
        return;
    }
    if (gone < live) /* every node reports its failure before its exit: all is heard now */
        return;
    for (int i = 0; i < k->nconn; i++)
        k->c[i]->member = false;
    if (!k->failed) {
        end_job(j, 0, "");
        return;
    }
    char why[1200];
    if (k->cause_code == 2 && k->cause_prio == 0) {
        snprintf(why, sizeof why, "not restarting: %s, an error in the job itself (it failed "
                 "before training began), which another round would repeat", k->cause);
        end_job(j, 2, j->o.max_restarts > 0 ? why : "");
        return;
    }
    if (k->round >= j->o.max_restarts) {
        snprintf(why, sizeof why, "giving up: the job failed again after %d restart(s) "
                 "(--max_restarts %d): %s", k->round, j->o.max_restarts, k->cause);
        end_job(j, k->cause_code > 0 ? k->cause_code : 1, j->o.max_restarts > 0 ? why : "");
        return;
    }
    k->round++;
    snprintf(k->note, sizeof k->note, "restart %d of %d after %s", k->round,
             j->o.max_restarts, k->cause);
    k->state = C_JOIN;
    k->join_deadline = now + j->o.node_timeout;
    check_join(j);
}

/* A connection ended (EOF, error, garbage, or a stranger refused). */
static void lost(job *j, int i, const char *how) {
    coord *k = j->coord;
    conn *c = k->c[i];
    if (c->node < 0) {
        if (how)
            fr_say("refused a connection to the coordinator from %s: %s", c->peer, how);
    } else if (c->member && !c->exited && k->state == C_RUN) {
        char text[400];
        snprintf(text, sizeof text, "node %d (%s) lost: its fleetrun is gone (%s)", c->node,
                 node_ip(j, c->node), how ? how : "connection closed");
        c->exited = true;
        drop(k, i);
        record_failure(j, 2, 1, text);
        return;
    }
    drop(k, i);
}

/* Refuses connection i before it joined: the reason to it (END, in the clear unless it is
 * authenticated) and to this node's output, naming its address; drops it. Returns false. */
static bool refuse(job *j, int i, const char *why) {
    conn *c = j->coord->c[i];
    tell(c, "END 1\terror: the coordinator at %s:%d refused this node: %s", node_ip(j, 0),
         j->o.coord_port, why);
    lost(j, i, why);
    return false;
}

/* A line of connection i's handshake (auth.c: AUTH, then PROOF); false when it was refused. */
static bool on_auth_line(job *j, int i, const char *line) {
    coord *k = j->coord;
    conn *c = k->c[i];
    fr_auth *a = &c->auth;
    char why[300], hex[2 * FR_MAC + 1];
    if (a->step == FR_AUTH_START) {
        int version, node, nproc, off = 0;
        if (strncmp(line, "HELLO ", 6) == 0)
            return refuse(j, i, "it sent a job token in the clear (HELLO), as fleetrun did "
                          "before its coordinator authenticated: every node must run the same "
                          "fleetrun version");
        if (sscanf(line, "AUTH fleetrun/%d %d %d %n", &version, &node, &nproc, &off) != 3 ||
            off == 0)
            return refuse(j, i, "not a fleetrun of this job (its first line is not an AUTH)");
        if (version != FR_COORD_VERSION) {
            snprintf(why, sizeof why, "it speaks version %d of fleetrun's coordinator protocol, "
                     "this one %d: every node must run the same fleetrun version", version,
                     FR_COORD_VERSION);
            return refuse(j, i, why);
        }
        if (!fr_parse_hex(line + off, a->nonce_m, FR_NONCE) || line[off + 2 * FR_NONCE])
            return refuse(j, i, "a malformed AUTH line (its nonce is not 64 hex digits)");
        if (node < 0 || node >= j->o.nnodes || nproc < 1 || nproc > MAX_NPROC) {
            snprintf(why, sizeof why, "node %d with %d workers: not a node of --ips", node,
                     nproc);
            return refuse(j, i, why);
        }
        a->node = node;
        a->nproc = nproc;
        a->round = (unsigned)k->round;
        if (fr_auth_nonce(a->nonce_c, hex) < 0)
            return refuse(j, i, fl_errmsg());
        fr_send_line(c->fd, "CHALLENGE %u %s", a->round, hex);
        a->step = FR_AUTH_PROVED;
        return true;
    }
    if (strncmp(line, "PROOF ", 6) != 0 ||
        !fr_auth_check(j->base_token, FR_SIDE_MEMBER, a, line + 6)) {
        snprintf(why, sizeof why, "its proof of the job token is wrong (node %d with another "
                 "FLEET_JOB_TOKEN, or a recorded exchange replayed?)", a->node);
        return refuse(j, i, why);
    }
    if (fr_auth_proof(j->base_token, FR_SIDE_COORD, a, hex) < 0 ||
        fr_send_line(c->fd, "PROOF %s", hex) < 0 ||
        fr_auth_keys(j->base_token, FR_SIDE_COORD, a) < 0) {
        lost(j, i, "cannot answer its proof");
        return false;
    }
    return true;
}

/* Connection i sent a line that fails its check, or says one of ours failed there (from
 * true): somebody changes the bytes between the nodes. The job ends, naming the node. */
static void tampered(job *j, int i, bool theirs) {
    coord *k = j->coord;
    conn *c = k->c[i];
    char why[400];
    if (theirs)
        snprintf(why, sizeof why, "error: a line from the coordinator to node %d (%s) failed "
                 "its integrity check there (changed or forged on the way; not used): ending "
                 "the job", c->auth.node, node_ip(j, c->auth.node));
    else
        snprintf(why, sizeof why, "error: a line from node %d (%s) failed its integrity check "
                 "at the coordinator (changed or forged on the way; not used): ending the job",
                 c->auth.node, node_ip(j, c->auth.node));
    if (k->state != C_END) {
        if (c->node < 0)
            tell(c, "END 1\t%s", why);
        end_job(j, 1, why);
    }
    drop(k, i);
}

/* One line from connection i; false when the connection was dropped. */
static bool on_line(job *j, int i, char *line) {
    coord *k = j->coord;
    conn *c = k->c[i];
    if (c->auth.step != FR_AUTH_DONE)
        return on_auth_line(j, i, line);
    if (fr_open_sealed(&c->auth, line) < 0) {
        tampered(j, i, false);
        return false;
    }
    int node, nproc, round, code, prio, off = 0;
    char *tab = strchr(line, '\t');
    const char *text = tab ? tab + 1 : "";
    if (tab)
        *tab = 0;
    if (sscanf(line, "HELLO %d %d%n", &node, &nproc, &off) == 2 && !line[off]) {
        char why[200] = "";
        if (node != c->auth.node || nproc != c->auth.nproc)
            snprintf(why, sizeof why, "it proved itself as node %d with %d workers, then said "
                     "node %d with %d", c->auth.node, c->auth.nproc, node, nproc);
        else if (c->node >= 0 && (node != c->node || nproc != c->nproc))
            snprintf(why, sizeof why, "node %d said it was node %d with %d workers", c->node,
                     node, nproc);
        for (int o = 0; o < k->nconn && !why[0] && c->node < 0; o++)
            if (o != i && k->c[o]->node == node)
                snprintf(why, sizeof why, "node %d (%s) is connected already", node,
                         node_ip(j, node));
        if (why[0])
            return refuse(j, i, why);
        c->node = node;
        c->nproc = nproc;
        c->waiting = true;
        if (k->state == C_END) /* too late: tell it */
            tell(c, "END 1\terror: the job is over");
        return true;
    }
    if (c->node < 0) {
        lost(j, i, "not a fleetrun of this job (no HELLO after its proof)");
        return false;
    }
    if (strcmp(line, "BADMAC") == 0) {
        tampered(j, i, true);
        return false;
    }
    if (sscanf(line, "FAIL %d %d %d%n", &round, &code, &prio, &off) == 3 && !line[off]) {
        if (k->state == C_RUN && c->member && round == k->round) {
            c->failed = true;
            record_failure(j, prio > 1 ? 1 : prio < 0 ? 0 : prio, code, text);
        }
        return true;
    }
    char how[16];
    if (sscanf(line, "EXIT %d %d %15s%n", &round, &code, how, &off) == 3 && !line[off]) {
        if (k->state == C_RUN && c->member && round == k->round) {
            c->exited = true;
            if (strcmp(how, "ok") != 0 && !c->failed && strcmp(how, "stopped") != 0) {
                char t[200];
                snprintf(t, sizeof t, "node %d (%s): its workers failed (status %d)", c->node,
                         node_ip(j, c->node), code);
                record_failure(j, 0, code, t);
            }
        }
        return true;
    }
    char why[120];
    snprintf(why, sizeof why, "node %d sent '%.60s', not a message of this protocol", c->node,
             line);
    lost(j, i, why);
    return false;
}

void fr_coord_service(job *j, const struct pollfd *fds, int n) {
    coord *k = j->coord;
    if (!k)
        return;
    /* the connections first (fds[1..] in c[] order as of fr_coord_pollfds), back to front so
     * that a drop (which moves the last into the hole) never skips one */
    for (int f = n - 1; f >= 1; f--) {
        if (!fds[f].revents)
            continue;
        int i = -1;
        for (int c = 0; c < k->nconn; c++)
            if (k->c[c]->fd == fds[f].fd)
                i = c;
        if (i < 0)
            continue;
        int rc = fr_recv(k->c[i]->fd, &k->c[i]->in);
        char line[16384];
        bool alive = true;
        while (alive && fr_next_line(&k->c[i]->in, line, sizeof line))
            alive = on_line(j, i, line);
        if (alive && rc <= 0)
            lost(j, i, rc < 0 ? "connection broken (or a line too long)" : NULL);
    }
    if (n >= 1 && fds[0].revents) {
        for (int tries = 0; tries < 64; tries++) {
            int fd = accept4(k->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0)
                break;
            conn *c = k->nconn < MAX_CONN ? calloc(1, sizeof *c) : NULL;
            if (!c) {
                close(fd);
                continue;
            }
            fr_socket_setup(fd);
            c->fd = fd;
            c->node = -1;
            c->auth_deadline = fr_now() + AUTH_WAIT;
            peer_of(fd, c->peer);
            k->c[k->nconn++] = c;
        }
    }
    /* connections that did not prove the token in time */
    double now = fr_now();
    for (int i = k->nconn - 1; i >= 0; i--)
        if (k->c[i]->auth.step != FR_AUTH_DONE && now >= k->c[i]->auth_deadline) {
            char why[80];
            snprintf(why, sizeof why, "no proof of the job token within %g s", AUTH_WAIT);
            refuse(j, i, why);
        }
    if (k->state == C_JOIN)
        check_join(j);
    else if (k->state == C_RUN)
        check_round(j);
}
