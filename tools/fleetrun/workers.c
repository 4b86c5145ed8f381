/* workers.c - starting workers (and a parameter-server job's servers) and signalling them.
 * Each is forked into its own process group with the Paddle environment, so fleetrun can signal
 * a worker together with whatever it started. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "fleetrun.h"

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
    set_env_int("FLEET_RESTART_COUNT", j->restarts);
    set_env_int("LOCAL_RANK", i); /* torchrun's names for the node-local layout */
    set_env_int("LOCAL_WORLD_SIZE", j->o.nproc);
    set_env_int("GROUP_RANK", j->member_index);
    if (j->o.ps) {
        fr_ps_child_env(j, i); /* its role's variables (ps.c) */
    } else { /* a collective worker is no parameter-server process, whatever fleetrun got */
        unsetenv("TRAINING_ROLE");
        unsetenv("PADDLE_PSERVERS_IP_PORT_LIST");
    }
    if (w->child_listen_fd >= 0) {
        set_env_int("FLEET_LISTEN_FD", w->child_listen_fd);
        fcntl(w->child_listen_fd, F_SETFD, 0); /* only this worker's socket survives exec */
    } else {
        unsetenv("FLEET_LISTEN_FD");
    }
    fr_bind_child(j, i); /* --bind_to core: in every round */
    execvp(j->o.argv[0], j->o.argv);
    int e = errno;
    dprintf(2, "fleetrun: cannot execute '%s': %s\n", j->o.argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

int fr_start_worker(job *j, int i) {
    worker *w = &j->w[i];
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        fr_say("error: pipe for process %d: %s", i, strerror(errno));
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        char name[96];
        fr_proc_name(j, i, name, sizeof name);
        fr_say("error: cannot start %s: %s", name, strerror(errno));
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

int fr_groups_alive(const job *j) {
    int n = 0;
    for (int i = 0; i < j->nstarted; i++)
        n += group_alive(&j->w[i]);
    return n;
}

void fr_signal_groups(job *j, int sig) {
    for (int i = 0; i < j->nstarted; i++)
        if (group_alive(&j->w[i])) {
            kill(-j->w[i].pid, sig);
            if (sig == SIGTERM) /* a stopped worker (SIGSTOP, ^Z) acts on it only once running */
                kill(-j->w[i].pid, SIGCONT);
        }
}

/* Whether process pid is stopped (SIGSTOP; state T or t in /proc/PID/stat). */
static bool stopped(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

bool fr_workers_all_stopped(const job *j) {
    int n = 0;
    for (int i = 0; i < j->nstarted; i++) {
        const worker *w = &j->w[i];
        if (w->pid <= 0 || w->reaped)
            continue;
        if (!stopped(w->pid))
            return false;
        n++;
    }
    return n > 0;
}
