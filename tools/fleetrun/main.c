/* main.c - fleetrun's main: blocks the signals it will read from a signalfd, sets the job up
 * step by step (args.c, ps.c, node.c), prints the banner (banner.c), starts the workers
 * (workers.c), runs the loop (supervise.c)
 * and turns its outcome into the exit status; round after round, as restart.c decides on one
 * node or node 0's coordinator (coord.c, member.c) for a job of several. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "fleetrun.h"

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
    if (j->coord_fd >= 0)
        close(j->coord_fd);
    fr_auth_wipe(&j->coord_auth);
    fr_coord_free(j);
    free(j->w);
    free(j->line);
    free(j->endpoints);
    free(j->endpoints_str);
    free(j->o.ips_buf);
    free(j->bind_sets);
    free(j->ps_servers);
    free(j->ps_workers);
    free(j->servers_str);
    free(j->server_eps);
}

/* A job of several nodes with restarts or scale-in: each round as node 0's coordinator says
 * (member.c); returns the exit status. */
static int run_coordinated(job *j) {
    if ((j->node == 0 && fr_coord_open(j)) || fr_member_connect(j))
        return 1;
    for (;;) {
        int rc = fr_member_join(j);
        if (rc < 0)
            return j->end_code;
        if (rc)
            return rc;
        if (j->round == 0) {
            fr_print_banner(j);
        } else {
            fr_say("round %d: this node's %d worker(s) are ranks %d..%d of %d on %d node(s) "
                   "(FLEET_RESTART_COUNT=%d)", j->round, j->o.nproc, j->w[0].rank,
                   j->w[j->o.nproc - 1].rank, j->nranks, j->nmembers, j->round);
            for (int i = 0; i < j->o.nproc; i++)
                if (j->w[i].log_fd >= 0)
                    dprintf(j->w[i].log_fd, "fleetrun: restart %d of %d: rank %d of %d\n",
                            j->round, j->o.max_restarts, j->w[i].rank, j->nranks);
        }
        j->restarts = j->round;
        for (int i = 0; i < j->o.nproc; i++)
            if ((rc = fr_start_worker(j, i))) {
                j->exit_code = rc;
                fr_enter_phase(j, PHASE_TERM, j->o.grace);
                break;
            }
        fr_run_loop(j);
        if (j->settle_until > 0)
            fr_name_cause(j);
        fr_member_exited(j);
        if (j->signal_seen)
            return 128 + j->signal_seen;
        if (j->end_code >= 0)
            return j->end_code;
        fr_reset_round(j);
    }
}

int main(int argc, char **argv) {
    job j = {.sig_fd = -1, .term_fd = 1, .exit_code = -1,
             .failed_unsignalled = -1, .cause = -1, .coord_fd = -1, .end_code = -1};
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

    rc = fr_parse_args(argc, argv, &j.o);
    if (rc || (j.o.ps && (rc = fr_ps_plan(&j))) || (rc = fr_bind_plan(&j)))
        goto fail;
    if ((rc = fr_check_program(j.o.argv[0])) || (rc = fr_find_node(&j)) || (rc = fr_make_token(&j)))
        goto fail;
    j.w = calloc((size_t)j.o.nproc, sizeof *j.w);
    j.line = malloc(LINEBUF_CAP);
    if (!j.w || !j.line) {
        fr_say("error: out of memory");
        rc = 1;
        goto fail;
    }
    for (int i = 0; i < j.o.nproc; i++) {
        worker *w = &j.w[i];
        w->out_fd = w->log_fd = w->listen_fd = w->child_listen_fd = -1;
        w->rank = j.node * j.o.nproc + i;
        snprintf(w->gpu, sizeof w->gpu, "%d", j.o.ngpus ? j.o.gpus[i] : i);
    }
    if (j.o.ps)
        fr_ps_assign(&j);
    j.member_index = j.node;
    if ((!j.o.coordinated && (rc = fr_make_endpoints(&j))) || (rc = fr_open_logs(&j)))
        goto fail;
    j.sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (j.sig_fd < 0) {
        fr_say("error: signalfd: %s", strerror(errno));
        rc = 1;
        goto fail;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* orphans of workers come to us and get reaped */
    j.self = getpid();
    if (j.o.coordinated) {
        rc = run_coordinated(&j);
        goto fail;
    }

    if (j.o.ps)
        fr_ps_banner(&j);
    else
        fr_print_banner(&j);

    for (;;) { /* one round; more with --max_restarts (restart.c) */
        for (int i = 0; i < j.o.nproc; i++)
            if ((rc = fr_start_worker(&j, i))) {
                j.exit_code = rc;
                fr_enter_phase(&j, PHASE_TERM, j.o.grace);
                break;
            }
        fr_run_loop(&j);
        if (j.settle_until > 0)
            fr_name_cause(&j);
        if (!fr_should_restart(&j))
            break;
        int ns = 0;
        for (int i = 0; i < j.o.nproc; i++)
            ns += j.w[i].role == ROLE_SERVER;
        if (j.o.ps)
            fr_say("restart %d of %d: starting %d server(s) and %d worker(s) again "
                   "(FLEET_RESTART_COUNT=%d)", j.restarts + 1, j.o.max_restarts, ns,
                   j.o.nproc - ns, j.restarts + 1);
        else
            fr_say("restart %d of %d: starting %d worker(s) again (FLEET_RESTART_COUNT=%d)",
                   j.restarts + 1, j.o.max_restarts, j.o.nproc, j.restarts + 1);
        if (fr_prepare_restart(&j)) {
            rc = 1;
            goto fail;
        }
    }
    if (j.signal_seen)
        rc = 128 + j.signal_seen;
    else
        rc = j.exit_code > 0 ? j.exit_code : 0;
    if (j.nline)
        fr_terminal_copy(&j, "", 0, true);
fail:
    job_free(&j);
    return rc < 0 ? 0 : rc;
}
