/* restart.c - the restart policy of --max_restarts (torchrun's --max-restarts): after a round
 * ended in a failure, whether to start the workers again, and readying the job for the next
 * round. A worker that exits with status 2 (fleet-train: an error in the job, before training
 * began: a bad config, missing data) is not restarted: another round would fail the same way. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleetrun.h"

bool fr_should_restart(const job *j) {
    if (j->signal_seen || j->exit_code <= 0)
        return false; /* done, or stopped by the user */
    const worker *w = j->cause >= 0 ? &j->w[j->cause] : NULL;
    if (w && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 2) {
        char name[96];
        fr_proc_name(j, j->cause, name, sizeof name);
        if (j->o.max_restarts > 0)
            fr_say("not restarting: %s exited with status 2, an error in the job itself (it "
                   "failed before training began), which another round would repeat", name);
        return false;
    }
    if (j->restarts >= j->o.max_restarts) {
        if (j->o.max_restarts > 0)
            fr_say("giving up: the job failed again after %d restart(s) (--max_restarts %d)",
                   j->restarts, j->o.max_restarts);
        return false;
    }
    return true;
}

void fr_reset_round(job *j) {
    if (j->nline) /* rank 0's pending partial line */
        fr_terminal_copy(j, "", 0, true);
    for (int i = 0; i < j->o.nproc; i++) {
        worker *w = &j->w[i];
        if (w->out_fd >= 0)
            close(w->out_fd);
        if (w->listen_fd >= 0)
            close(w->listen_fd);
        w->out_fd = w->listen_fd = w->child_listen_fd = -1;
        w->pid = 0;
        w->reaped = w->reported = false;
        w->status = w->reap_order = 0;
    }
    j->nstarted = 0;
    j->phase = PHASE_RUN;
    j->deadline = 0;
    j->exit_code = -1;
    j->nfailed = 0;
    j->settle_until = 0;
    j->failed_unsignalled = -1;
    j->cause = -1;
    j->stopped_remote = false;
    j->servers_stopping = false;
}

int fr_prepare_restart(job *j) {
    j->restarts++;
    char suffix[16];
    int ns = snprintf(suffix, sizeof suffix, ".%d", j->restarts);
    /* within the wire's MAX_TOKEN characters: the token's end gives way to the suffix */
    snprintf(j->token, sizeof j->token, "%.*s%s", MAX_TOKEN - ns, j->base_token, suffix);
    fr_reset_round(j);
    for (int i = 0; i < j->o.nproc; i++)
        if (j->w[i].log_fd >= 0)
            dprintf(j->w[i].log_fd, "fleetrun: restart %d of %d\n", j->restarts,
                    j->o.max_restarts);
    if (j->own_sockets) { /* fresh ports: a late connection of the last round finds none */
        free(j->endpoints);
        free(j->endpoints_str);
        j->endpoints = NULL;
        j->endpoints_str = NULL;
        if (fr_make_endpoints(j))
            return 1;
    }
    return 0;
}
