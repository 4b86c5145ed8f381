/* supervise.c - the event loop that runs the job to its end: one poll over the workers' pipes
 * and a signalfd, reaping workers, the phases of winding down (grace, SIGTERM, SIGKILL) after a
 * failure, a signal or the coordinator's STOP (member.c reports it; the loop alone changes
 * phase), and naming which failure caused the others. In a parameter-server job the servers
 * are supervised as the workers are, and once every worker has exited 0 they are wound down
 * the same way (grace, SIGTERM, SIGKILL) without that counting as a failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fleetrun.h"

#define KILL_WAIT_S   5.0   /* after SIGKILL, how long to wait before giving up */
#define DRAIN_WAIT_S  1.0   /* after every worker is gone, how long to wait for pipe EOFs */
#define SETTLE_S      0.5   /* after the first failure, how long to gather others before naming
                               the cause (a killed rank's peers may be reaped before it) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int status_code(int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void fr_enter_phase(job *j, enum phase p, double seconds) {
    if (p == PHASE_GRACE && fr_workers_all_stopped(j)) /* they would never exit on their own */
        p = PHASE_TERM;
    j->phase = p;
    j->deadline = now_s() + seconds;
    if ((p == PHASE_TERM || p == PHASE_KILL) && j->failed_unsignalled < 0)
        j->failed_unsignalled = j->nfailed;
    if (p == PHASE_TERM)
        fr_signal_groups(j, SIGTERM);
    else if (p == PHASE_KILL)
        fr_signal_groups(j, SIGKILL);
}

static void on_exit_status(job *j, int i, int st) {
    worker *w = &j->w[i];
    w->reaped = true;
    w->status = st;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return;
    /* a PS job's server that fleetrun stopped after every worker finished: not a failure */
    if (j->servers_stopping && j->phase != PHASE_GRACE)
        return;
    w->reap_order = ++j->nfailed;
    /* a server failing on its own once the workers finished is the job's failure, too */
    bool first = j->phase == PHASE_RUN ||
                 (j->servers_stopping && j->exit_code < 0 && j->settle_until == 0);
    if (first && !j->signal_seen) {
        /* the cause is named after SETTLE_S: when a rank is killed its peers see the reset
         * and may exit (and be reaped) before the killed one */
        j->settle_until = now_s() + SETTLE_S;
        if (j->phase == PHASE_RUN)
            fr_enter_phase(j, PHASE_GRACE, j->o.grace);
    } else if (j->phase == PHASE_GRACE && j->settle_until == 0) {
        fr_report_secondary(j, i);
        w->reported = true;
    }
}

/* End of the settle window: the cause is the first worker killed by a signal, else the first
 * failure reaped; it is reported in full, the others gathered so far one line each. */
void fr_name_cause(job *j) {
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
    j->cause = cause;
    j->exit_code = status_code(j->w[cause].status);
    fr_report_failure(j, cause);
    j->w[cause].reported = true;
    fr_member_failed(j); /* a coordinated job: the other nodes stop, too */
    for (int order = 1; order <= j->nfailed; order++)
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].reap_order == order && !j->w[i].reported) {
                fr_report_secondary(j, i);
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
        fr_say("got SIG%s: stopping %d %s (SIGTERM, SIGKILL after %g s)", sigabbrev_np(sig),
            fr_groups_alive(j), j->o.ps ? "server(s) and worker(s)" : "worker(s)", j->o.grace);
        fr_enter_phase(j, PHASE_TERM, j->o.grace);
    } else if (j->phase != PHASE_KILL) {
        fr_say("got SIG%s again: SIGKILL", sigabbrev_np(sig));
        fr_enter_phase(j, PHASE_KILL, KILL_WAIT_S);
    }
}

void fr_run_loop(job *j) {
    double drain_until = -1;
    for (;;) {
        if (j->settle_until > 0 && now_s() >= j->settle_until)
            fr_name_cause(j);
        int alive = fr_groups_alive(j);
        int open_pipes = 0;
        for (int i = 0; i < j->nstarted; i++)
            open_pipes += j->w[i].out_fd >= 0;
        double t = now_s();
        if (alive == 0) {
            if (j->settle_until > 0)
                fr_name_cause(j);
            if (drain_until < 0)
                drain_until = t + DRAIN_WAIT_S;
            if (open_pipes == 0 || t >= drain_until)
                return;
        }
        /* a PS job whose workers all finished: the servers get the grace to exit on their own
         * (they do once every worker has said STOP), then SIGTERM */
        if (j->o.ps && j->phase == PHASE_RUN && !j->signal_seen && alive > 0 &&
            fr_ps_workers_done(j)) {
            j->servers_stopping = true;
            fr_enter_phase(j, PHASE_GRACE, j->o.grace);
        }
        /* every worker's leader gone but its group not: stragglers get the grace, too */
        if (j->phase == PHASE_RUN && alive > 0) {
            int leaders = 0;
            for (int i = 0; i < j->nstarted; i++)
                leaders += !j->w[i].reaped;
            if (leaders == 0) {
                fr_say("every worker exited, but %d process group(s) still hold processes they "
                    "started; SIGTERM to those in %g s", alive, j->o.grace);
                fr_enter_phase(j, PHASE_GRACE, j->o.grace);
            }
        }
        if (j->phase != PHASE_RUN && t >= j->deadline) {
            if (j->phase == PHASE_GRACE) {
                if (j->servers_stopping)
                    fr_say("every worker finished, but %d server(s) still run after --grace "
                           "%g s: SIGTERM", alive, j->o.grace);
                fr_enter_phase(j, PHASE_TERM, j->o.grace);
            } else if (j->phase == PHASE_TERM) {
                fr_say("%d worker group(s) still running after SIGTERM + %g s: SIGKILL", alive,
                    j->o.grace);
                fr_enter_phase(j, PHASE_KILL, KILL_WAIT_S);
            } else {
                fr_say("error: %d worker group(s) survive SIGKILL after %g s; giving up", alive,
                    KILL_WAIT_S);
                return;
            }
            continue;
        }

        struct pollfd fds[1 + MAX_NPROC + 1 + MAX_NODES + 32];
        int map[1 + MAX_NPROC], nfds = 0;
        fds[nfds] = (struct pollfd){.fd = j->sig_fd, .events = POLLIN};
        map[nfds++] = -1;
        for (int i = 0; i < j->nstarted; i++)
            if (j->w[i].out_fd >= 0) {
                fds[nfds] = (struct pollfd){.fd = j->w[i].out_fd, .events = POLLIN};
                map[nfds++] = i;
            }
        /* a coordinated job: this node's connection, and node 0's coordinator */
        int nworker_fds = nfds;
        nfds += fr_member_pollfds(j, fds + nfds, (int)(sizeof fds / sizeof fds[0]) - nfds);
        int timeout_ms = -1;
        if (j->phase != PHASE_RUN || alive == 0) {
            /* group members that are not our children die without telling us: look often */
            double until = alive == 0 ? drain_until : j->deadline;
            double ms = (until - t) * 1000.0;
            timeout_ms = ms < 0 ? 0 : ms > 50 ? 50 : (int)ms + 1;
        } else {
            timeout_ms = 1000; /* a safety net; SIGCHLD wakes us */
        }
        double coord_ms = (fr_coord_deadline(j) - t) * 1000.0;
        if (coord_ms < timeout_ms)
            timeout_ms = coord_ms < 0 ? 0 : (int)coord_ms + 1;
        int n = poll(fds, (nfds_t)nfds, timeout_ms);
        if (n < 0 && errno != EINTR) {
            fr_say("error: poll: %s", strerror(errno));
            fr_signal_groups(j, SIGKILL);
            return;
        }
        /* the coordinator stopped this round (or was lost): stop this node's workers */
        if (fr_member_service(j, fds + nworker_fds, nfds - nworker_fds) &&
            j->phase == PHASE_RUN && fr_groups_alive(j))
            fr_enter_phase(j, PHASE_TERM, j->o.grace);
        for (int k = 0; k < nworker_fds && n > 0; k++) {
            if (!fds[k].revents)
                continue;
            if (map[k] >= 0) {
                fr_pump(j, map[k]);
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
