/* banner.c - what fleetrun prints on stdout before the workers start: the banner line of a
 * collective job (this node, its ranks, the logs) or of a parameter-server job (servers and
 * workers here and in all), where the workers run (bind.c), and the first worker's
 * distributed environment as a table, as paddle.distributed.launch prints it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "fleetrun.h"

void fr_print_banner(const job *j) {
    printf("fleetrun: node %d of %d (%s), %d worker(s), ranks %d..%d of %d; logs in "
           "%s/workerlog.*\n", j->member_index, j->o.coordinated ? j->nmembers : j->o.nnodes,
           j->o.ips[j->node], j->o.nproc, j->w[0].rank, j->w[j->o.nproc - 1].rank, j->nranks,
           j->o.log_dir);
    fr_bind_describe(j);
    printf("fleetrun: first worker's distributed environment:\n");
    fr_print_env_table(j);
    if (j->node != 0)
        printf("fleetrun: rank 0 runs on node 0 (%s); this node's output is in "
               "%s/workerlog.*\n", j->o.ips[0], j->o.log_dir);
    fflush(stdout);
}

void fr_ps_banner(const job *j) {
    int ns = 0, nw = 0;
    bool worker0 = false;
    for (int i = 0; i < j->o.nproc; i++) {
        ns += j->w[i].role == ROLE_SERVER;
        nw += j->w[i].role == ROLE_WORKER;
        worker0 |= fr_to_terminal(&j->w[i]);
    }
    printf("fleetrun: parameter-server job: %d server(s) and %d worker(s); here %d server(s) "
           "and %d worker(s); logs in %s/serverlog.*, %s/workerlog.*\n", j->nservers,
           j->nworkers, ns, nw, j->o.log_dir, j->o.log_dir);
    fr_bind_describe(j);
    printf("fleetrun: first %s's distributed environment:\n", nw ? "worker" : "server");
    fr_print_env_table(j);
    if (!worker0)
        printf("fleetrun: worker 0 runs on %s; this machine's output is in %s/\n",
               j->endpoints[0], j->o.log_dir);
    fflush(stdout);
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
