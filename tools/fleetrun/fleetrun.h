/* fleetrun.h - what the parts of the launcher share: the options, the job and its workers, the
 * phases of winding down, and the functions each part lends the others. One file per job:
 * args.c (command line), endpoint.c (addresses and endpoints), node.c (job set-up), banner.c
 * (what is printed at start), workers.c (starting and signalling workers), output.c (worker
 * output, failure reports), supervise.c (the event loop), restart.c (the restart policy of
 * --max_restarts on one node), coord.c (node 0's coordinator of the rounds of a job of several
 * nodes), member.c (every node's side of it), lines.c (the line protocol between them), auth.c
 * (its challenge-response and sealed lines), bind.c (--bind_to core), ps.c (parameter-server
 * mode: the servers' and workers' endpoints and which of them run here), messages.c
 * (fleetrun's own messages), main.c. */
#include <poll.h>
#ifndef FLEETRUN_H
#define FLEETRUN_H

/* fleetrun - the launcher: starts this node's workers of a data-parallel job with the environment
 * Paddle's launcher sets (PADDLE_TRAINER_ID, PADDLE_TRAINER_ENDPOINTS, ...), copies each worker's
 * output to LOG_DIR/workerlog.i (rank 0 also to the terminal), and stops the whole node when one
 * worker fails or on Ctrl-C. In parameter-server mode (ps.c) it starts this node's servers and
 * workers alike, each with its role's environment (TRAINING_ROLE, ...), logs serverlog.i and
 * workerlog.i. It runs any program and needs nothing from the library but the keyed hashing of
 * its coordinator's protocol (include/fleet/auth.h): one process, one poll loop over the
 * workers' pipes and a signalfd. */

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

struct ifaddrs;

#define MAX_NODES     1024
#define MAX_NPROC     1024
#define MAX_TOKEN     64
#define ENDPOINT_MAX  64
#define LINEBUF_CAP   65536
#define FR_DEFAULT_PORT 6170          /* paddle.distributed.launch's first worker port */
#define PS_MAX_SERVERS 256            /* FL_PS_MAX_SERVERS */
#define PS_MAX_WORKERS 4096           /* FL_COMM_MAX_RANKS: the workers form a communicator */

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
    int         max_restarts;         /* --max_restarts: rounds after the first (0: none) */
    int         min_nodes, max_nodes; /* --nnodes MIN:MAX (both nnodes when not given) */
    double      node_timeout;         /* --node_timeout: how long a round waits for nodes */
    int         coord_port;           /* --coord_port (coordinated jobs; 0: not given) */
    bool        coordinated;          /* several nodes with restarts or scale-in: coord.c */
    bool        bind_core;            /* --bind_to core: bind.c */
    bool        ips_given;            /* --ips on the command line (collective only) */
    bool        port_given;           /* --started_port on the command line */
    /* parameter-server mode (ps.c): --server_num/--servers and --worker_num/--workers */
    bool        ps;
    int         server_num, worker_num;      /* 0: not given */
    const char *servers_arg, *workers_arg;  /* the lists as given; NULL: not given */
    char      **argv;                 /* PROGRAM ARGS... (borrowed from main's argv) */
} options;

enum role { ROLE_WORKER = 0, ROLE_SERVER = 1 }; /* collective jobs have workers only */

typedef struct {
    pid_t  pid;
    int    rank;                      /* collective: the rank; PS: the index in its role */
    enum role role;
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

typedef struct coord coord; /* coord.c's state; node 0 of a coordinated job only */

/* One server or worker of a parameter-server job (ps.c). */
typedef struct {
    char ip[64];                      /* numeric, without brackets */
    int  port;                        /* 0: fleetrun binds a free one (FLEET_LISTEN_FD) */
    bool local;                       /* started by this fleetrun */
} ps_entry;

/* The coordinator's line protocol, authenticated (auth.c): its version, and one end of a
 * connection between a node (the member) and the coordinator. */
#define FR_COORD_VERSION 2
#define FR_NONCE 32
#define FR_KEY   32
#define FR_MAC   32
enum { FR_SIDE_MEMBER = 0, FR_SIDE_COORD = 1 };
/* Steps: the member sent AUTH (START), got CHALLENGE and sent its PROOF (PROVED), or the
 * coordinator got AUTH and sent CHALLENGE (PROVED); DONE once both sides proved the token. */
enum { FR_AUTH_START = 0, FR_AUTH_PROVED = 1, FR_AUTH_DONE = 2 };
typedef struct {
    int                step;
    int                node, nproc;       /* the member's, from its AUTH line */
    unsigned           round;             /* the coordinator's, from its CHALLENGE */
    unsigned char      nonce_m[FR_NONCE], nonce_c[FR_NONCE];
    unsigned char      tx[FR_KEY], rx[FR_KEY]; /* line keys: this end's sending, receiving */
    unsigned long long tx_seq, rx_seq;    /* the next line's number in each direction */
} fr_auth;

/* Bytes received on a connection, not yet a whole line. */
typedef struct {
    char   buf[16384];
    size_t len;
} linebuf;

typedef struct {
    options     o;
    int         node;                 /* this node's index in --ips */
    int         nranks;
    char      (*endpoints)[ENDPOINT_MAX]; /* [nranks], node-major */
    char       *endpoints_str;        /* "ip:port,ip:port,..." */
    char        token[MAX_TOKEN + 16]; /* the job's token; ".<restart>" appended after restarts */
    char        base_token[MAX_TOKEN + 1];
    int         restarts;             /* rounds started after the first so far */
    int         cause;                /* worker whose failure was named the cause; -1: none */
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
    /* a coordinated job (o.coordinated): rounds decided by node 0's coordinator */
    coord      *coord;                /* node 0 only; NULL elsewhere */
    int         coord_fd;             /* this node's connection to the coordinator; -1: none */
    fr_auth     coord_auth;           /* its authentication and line keys (auth.c) */
    linebuf     coord_in;
    int         round;                /* the round in progress: 0, then one per restart */
    int         member_index;         /* this node's place among the round's nodes */
    int         nmembers;             /* nodes in the round */
    bool        stopped_remote;       /* the coordinator stopped this round's workers */
    int         end_code;             /* the coordinator ended the job with it; -1: not yet */
    /* --bind_to core (bind.c): worker i's CPUs, a CPU_ALLOC set of bind_size bytes at
     * bind_sets + i * bind_size; NULL: workers are not bound */
    unsigned char *bind_sets;
    size_t      bind_size;
    /* parameter-server mode (ps.c): every server and worker of the job; the workers'
     * endpoints are also endpoints/endpoints_str (nranks = nworkers), as in a collective job */
    ps_entry   *ps_servers, *ps_workers;
    int         nservers, nworkers;
    char       *servers_str;          /* "ip:port,..." of every server */
    char      (*server_eps)[ENDPOINT_MAX];
    bool        ps_remote;            /* some entry runs on another machine */
    bool        servers_stopping;     /* every worker finished: the servers are being stopped */
} job;

/* Binary form of a numeric IPv4/IPv6 address; family 0 if it is neither. */
typedef struct {
    int           family;
    unsigned char a[16];
} ip_addr;

/* messages.c */

/* "fleetrun: " + the message on stderr. */
void fr_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An error in fleetrun's own arguments: message and usage hint on stderr; returns 2. */
int fr_arg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* args.c */

/* Fills *o from argv (o borrows argv); 0, 2 for bad arguments (told), -1 after --help. */
int fr_parse_args(int argc, char **argv, options *o);
/* 0 if execvp would find and run prog; else tells why and returns 127 (not found) or 126. */
int fr_check_program(const char *prog);

/* endpoint.c: addresses and endpoints (no job state) */

/* Binary form of a numeric IPv4/IPv6 address; family 0 if it is neither. */
ip_addr fr_parse_ip(const char *s);
/* Same family and same address. */
bool fr_ip_equal(ip_addr x, ip_addr y);
/* a (IPv4 or IPv6) and port as a socket address in *ss; returns its length. */
socklen_t fr_sockaddr(ip_addr a, int port, struct sockaddr_storage *ss);
/* "ip:port", or "[ip]:port" for IPv6, into out (ENDPOINT_MAX bytes). */
void fr_format_endpoint(char *out, const char *ip, int port);
/* Whether ip is an address of one of the interfaces in ifs (getifaddrs). */
bool fr_ifaddrs_have(const struct ifaddrs *ifs, ip_addr ip);
/* This machine's IPv4 addresses, ", "-separated, into out (cap bytes). */
void fr_ifaddrs_ipv4(const struct ifaddrs *ifs, char *out, size_t cap);

/* node.c: job set-up; each returns 0, or the status to exit with after telling why. */

/* Sets j->node from --node_ip or this machine's addresses; 0 or 2. */
int fr_find_node(job *j);
/* Sets j->token from FLEET_JOB_TOKEN or a fresh random one (one node only); 0, 1 or 2. */
int fr_make_token(job *j);
/* Allocates j->endpoints and j->endpoints_str; binds the workers' sockets when fleetrun owns
 * the ports (one node, no port given). 0 or 1. */
int fr_make_endpoints(job *j);
/* Creates the log directory and opens every worker's log_fd; 0 or 1. */
int fr_open_logs(job *j);

/* banner.c: what is printed on stdout at start */

/* A collective job's banner: this node (the round's place among its nodes in a coordinated
 * job), its ranks and logs, where the workers run, the environment table. */
void fr_print_banner(const job *j);
/* The banner line(s) of a PS job, and its environment table. */
void fr_ps_banner(const job *j);
/* Prints the first local worker's environment as a table on stdout (PS: fr_ps_env_rows). */
void fr_print_env_table(const job *j);

/* workers.c */

/* Forks process i (a worker, or a PS server) in its own process group with its environment; 0, or 1 after telling why. */
int fr_start_worker(job *j, int i);
/* How many started workers' process groups still have members. */
int fr_groups_alive(const job *j);
/* Sends sig to every started worker's process group that still has members (SIGTERM comes
 * with SIGCONT, so that a stopped worker acts on it at once). */
void fr_signal_groups(job *j, int sig);
/* Whether every worker still running is stopped (SIGSTOP): none of them can exit on its own,
 * so waiting --grace for them would only add to the time a frozen rank costs the job. */
bool fr_workers_all_stopped(const job *j);

/* bind.c: --bind_to core */

/* With --bind_to core: cuts the CPUs fleetrun may run on into one set per worker (bind.c),
 * j->bind_sets. 0; 2 (told as a bad argument) when there are more workers than CPUs; 1 (told)
 * when it cannot read them or allocate. Nothing without --bind_to core. */
int fr_bind_plan(job *j);
/* In worker i's child before exec: binds it to its set and sets OMP_NUM_THREADS to the set's
 * size unless it is set; _exits 126 after telling why it could not bind. Nothing unbound. */
void fr_bind_child(const job *j, int i);
/* One line on stdout saying where each worker runs; nothing unbound. */
void fr_bind_describe(const job *j);

/* output.c */

/* How reports name process i: "worker 2 (rank 2)" in a collective job; "server 1
 * (127.0.0.1:6170)" or "worker 0 (127.0.0.1:6172)" in a parameter-server job. */
void fr_proc_name(const job *j, int i, char *out, size_t cap);
/* Whether process i's output goes to the terminal too: rank 0 (PS: worker 0). */
bool fr_to_terminal(const worker *w);

/* Copies what worker i has written so far to its log (rank 0 also to the terminal). */
void fr_pump(job *j, int i);
/* Rank 0's output to the terminal in whole lines; eof flushes the pending partial line. */
void fr_terminal_copy(job *j, const char *p, size_t n, bool eof);
/* Tells worker i's failure in full: how it ended and the last lines of its log. */
void fr_report_failure(job *j, int i);
/* Tells worker i's failure in one line, with the last line of its log. */
void fr_report_secondary(job *j, int i);
/* "exited with code C" or "killed by signal S (SIGNAME)" for a wait status. */
void fr_describe_status(int st, char *out, size_t cap);

/* supervise.c */

/* Enters phase p for the given seconds; PHASE_TERM/PHASE_KILL signal every live group. */
void fr_enter_phase(job *j, enum phase p, double seconds);
/* Ends the settle window: names the cause among the failures gathered so far, sets
 * j->exit_code to its code, reports it in full and the others in one line each. */
void fr_name_cause(job *j);
/* Pumps output, reaps workers and handles signals until every worker group is gone and its
 * pipe drained (or a group survives SIGKILL, or poll fails). */
void fr_run_loop(job *j);

/* ps.c: parameter-server mode */

/* Parses --servers/--workers (naming a bad or duplicate entry), makes the counted entries, and
 * picks this machine's entries (--node_ip, else the addresses of its interfaces); sets o->nproc
 * to their number. 0, 2 (told: bad lists, no entry here, a combination it cannot run) or 1. */
int  fr_ps_plan(job *j);
/* Gives the local processes their roles and indices: servers first, then workers. */
void fr_ps_assign(job *j);
/* Every entry's endpoint, binding a free port for the counted entries of this node when no
 * --started_port is given (FLEET_LISTEN_FD); j->servers_str, j->endpoints (the workers'). 0 or 1. */
int  fr_ps_endpoints(job *j);
/* In process i's child: the environment of Paddle's role maker for its role. */
void fr_ps_child_env(const job *j, int i);
/* The first local worker's (else server's) environment as rows for the table; returns how many
 * (at most cap). bufs holds the formatted numbers. */
int  fr_ps_env_rows(const job *j, const char *(*rows)[2], int cap, char (*bufs)[32]);
/* Whether every worker of the job is local and has exited 0 (the servers may be stopped). */
bool fr_ps_workers_done(const job *j);

/* restart.c */

/* After a round: whether --max_restarts allows another one (a failure, not status 2, not a
 * signal to fleetrun, restarts left); says why not when it could have. */
bool fr_should_restart(const job *j);
/* Readies the job for its next round, restart number j->restarts + 1: the token becomes
 * "<token>.<restart>" (workers of an earlier round cannot join this one; every node counts
 * its restarts alike), fresh sockets when fleetrun owns the ports, worker and loop state
 * cleared, a line in every log. 0 or 1. */
int fr_prepare_restart(job *j);
/* Clears the workers' and the loop's state of the round that ended (both kinds of job). */
void fr_reset_round(job *j);

/* lines.c: the coordinator's protocol, one text line per message (lines.c's header) */

/* Sends one line (fmt's text and "\n", at most 16 KiB) on a non-blocking socket; -1 if it
 * could not be sent whole (the peer is gone or does not read). */
int fr_send_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads what fd has into lb; 1 when some came, 0 at EOF, -1 on an error or a line longer than
 * the buffer. */
int fr_recv(int fd, linebuf *lb);
/* Takes the next whole line out of lb into out (without "\n"); false when there is none. */
bool fr_next_line(linebuf *lb, char *out, size_t cap);
/* Monotonic seconds. */
double fr_now(void);
/* A TCP connection to ip:port (non-blocking once connected, keepalive on), tried until
 * `until` (fr_now); -1 with errno after the last try. */
int fr_connect(const char *ip, int port, double until);
/* Keepalive and non-blocking reads on an accepted connection. */
void fr_socket_setup(int fd);

/* auth.c: the coordinator protocol's challenge-response and sealed lines (auth.c's header).
 * token is the job's token (FLEET_JOB_TOKEN, without a round's suffix). */

/* Fresh random bytes for a nonce, and their hex (64 digits); 0, or -1 (told by the library). */
int  fr_auth_nonce(unsigned char nonce[FR_NONCE], char hex[2 * FR_NONCE + 1]);
/* Whether s starts with exactly 2n hex digits (then its end or a space); the bytes in out. */
bool fr_parse_hex(const char *s, unsigned char *out, size_t n);
/* The proof of `side` over a's node, nproc, round and both nonces, as 64 hex digits; 0 or -1. */
int  fr_auth_proof(const char *token, int side, const fr_auth *a, char hex[2 * FR_MAC + 1]);
/* Whether hex (64 digits and nothing after) is the proof of `side` for a; constant time. */
bool fr_auth_check(const char *token, int side, const fr_auth *a, const char *hex);
/* Both proofs checked: derives the line keys of both directions for `side` (the end a is),
 * numbers both directions from 0 and sets a->step to FR_AUTH_DONE; 0 or -1. */
int  fr_auth_keys(const char *token, int side, fr_auth *a);
/* Wipes keys, nonces and all. */
void fr_auth_wipe(fr_auth *a);
/* Sends fmt's text as one sealed line (its MAC, a space, the text, "\n"); -1 when not
 * authenticated yet or it could not be sent whole. */
int  fr_send_sealed(int fd, fr_auth *a, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Checks a received line's MAC against the next number of its direction: 0 and the text alone
 * left in line; -1 when it fails (changed, forged, replayed, out of order; line untouched). */
int  fr_open_sealed(fr_auth *a, char *line);

/* coord.c: node 0's coordinator of a coordinated job. */

/* Listens on the first node's address, port o.coord_port; 0, or 1 after telling why. */
int    fr_coord_open(job *j);
void   fr_coord_free(job *j);
/* Adds the coordinator's sockets to fds (at most cap); returns how many. */
int    fr_coord_pollfds(job *j, struct pollfd *fds, int cap);
/* Handles what poll found on them (fds as fr_coord_pollfds filled them) and the timers. */
void   fr_coord_service(job *j, const struct pollfd *fds, int n);
/* The coordinator's next timer (fr_now seconds); a large value when none. */
double fr_coord_deadline(const job *j);

/* member.c: every node's side of a coordinated job. */

/* Connects to the coordinator (node 0's; waiting up to --node_timeout for it); 0 or 1. */
int  fr_member_connect(job *j);
/* Joins the next round and waits for the coordinator's decision: 0 when the round starts (the
 * ranks, endpoints and token of this node's workers set up); -1 when the coordinator ended the
 * job (its status in j->end_code); else the status to exit with (a lost coordinator, a
 * signal). */
int  fr_member_join(job *j);
/* Tells the coordinator this node's failure (the cause fr_name_cause named). */
void fr_member_failed(job *j);
/* Tells the coordinator this node's workers are all gone, and how the round ended here. */
void fr_member_exited(job *j);
/* The sockets the run loop watches besides the workers' (this node's connection, node 0's
 * coordinator); returns how many it added to fds (at most cap). */
int  fr_member_pollfds(job *j, struct pollfd *fds, int cap);
/* Handles what poll found on them. True when this node's workers are to stop now (the
 * coordinator's STOP or END, or the coordinator lost; j->stopped_remote set): the run loop
 * enters PHASE_TERM. */
bool fr_member_service(job *j, const struct pollfd *fds, int n);

#endif
