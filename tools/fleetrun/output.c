/* output.c - where the workers' output goes: each worker's pipe to LOG_DIR/workerlog.i (a
 * parameter-server job's servers: serverlog.i), rank 0 (PS: worker 0) also to the terminal in
 * whole lines; and the failure reports, which name the process (rank, or role and endpoint) and
 * end with the tail of its log. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleetrun.h"

#define TAIL_LINES    20
#define TAIL_BYTES    65536

static int write_all(int fd, const char *p, size_t n) {
    for (int tries = 0; n > 0 && tries < 1000000; tries++) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
            continue;
        }
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return n == 0 ? 0 : -1;
}

static void terminal_write(job *j, const char *p, size_t n) {
    if (j->term_fd >= 0 && write_all(j->term_fd, p, n) < 0)
        j->term_fd = -1; /* closed pipe or full disk: keep logging to files */
}

/* Rank 0 to the terminal in whole lines, so fleetrun's own messages never split one. */
void fr_terminal_copy(job *j, const char *p, size_t n, bool eof) {
    while (n > 0) {
        size_t k = LINEBUF_CAP - j->nline < n ? LINEBUF_CAP - j->nline : n;
        memcpy(j->line + j->nline, p, k);
        j->nline += k;
        p += k;
        n -= k;
        size_t upto = j->nline;
        while (upto > 0 && j->line[upto - 1] != '\n')
            upto--;
        if (upto == 0 && j->nline == LINEBUF_CAP)
            upto = j->nline; /* one very long line: let it through */
        terminal_write(j, j->line, upto);
        memmove(j->line, j->line + upto, j->nline - upto);
        j->nline -= upto;
    }
    if (eof && j->nline) {
        terminal_write(j, j->line, j->nline);
        j->nline = 0;
    }
}

void fr_proc_name(const job *j, int i, char *out, size_t cap) {
    const worker *w = &j->w[i];
    if (!j->o.ps) {
        snprintf(out, cap, "worker %d (rank %d)", i, w->rank);
        return;
    }
    bool server = w->role == ROLE_SERVER;
    const ps_entry *e = server ? &j->ps_servers[w->rank] : &j->ps_workers[w->rank];
    char ep[ENDPOINT_MAX];
    fr_format_endpoint(ep, e->ip, e->port);
    snprintf(out, cap, "%s %d (%s)", server ? "server" : "worker", w->rank, ep);
}

bool fr_to_terminal(const worker *w) { return w->role == ROLE_WORKER && w->rank == 0; }

/* Copies what worker i has written so far to its log (and the terminal for rank 0). */
void fr_pump(job *j, int i) {
    worker *w = &j->w[i];
    char buf[65536];
    for (int rounds = 0; w->out_fd >= 0 && rounds < 16; rounds++) {
        ssize_t k = read(w->out_fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return;
        if (k <= 0) {
            close(w->out_fd);
            w->out_fd = -1;
            if (fr_to_terminal(w))
                fr_terminal_copy(j, "", 0, true);
            return;
        }
        if (w->log_fd >= 0 && write_all(w->log_fd, buf, (size_t)k) < 0) {
            fr_say("warning: cannot write %s: %s; its output is lost from here", w->log_path,
                strerror(errno));
            close(w->log_fd);
            w->log_fd = -1;
        }
        if (fr_to_terminal(w))
            fr_terminal_copy(j, buf, (size_t)k, false);
    }
}

/* The last n lines of a file, or NULL; *len gets the length. Caller frees. */
static char *file_tail(const char *path, int n, size_t *len) {
    char *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        goto fail;
    off_t start = st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0;
    size_t want = (size_t)(st.st_size - start), got = 0;
    buf = malloc(want + 1);
    if (!buf)
        goto fail;
    for (int tries = 0; got < want && tries < 64; tries++) {
        ssize_t k = pread(fd, buf + got, want - got, start + (off_t)got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    size_t end = got, b = end;
    if (b > 0 && buf[b - 1] == '\n')
        b--;
    for (int lines = 0; b > 0; b--)
        if (buf[b - 1] == '\n' && ++lines == n)
            break;
    memmove(buf, buf + b, end - b);
    *len = end - b;
    buf[*len] = '\0';
    return buf;
fail:
    if (fd >= 0)
        close(fd);
    free(buf);
    return NULL;
}

void fr_describe_status(int st, char *out, size_t cap) {
    if (WIFEXITED(st)) {
        snprintf(out, cap, "exited with code %d", WEXITSTATUS(st));
    } else {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        snprintf(out, cap, "killed by signal %d (SIG%s)", WTERMSIG(st), abbrev ? abbrev : "?");
    }
}

/* The first failure: which worker, how, and the end of its log. */
void fr_report_failure(job *j, int i) {
    worker *w = &j->w[i];
    char how[64];
    fr_describe_status(w->status, how, sizeof how);
    for (int k = 0; k < 64 && w->out_fd >= 0; k++) /* its last words, before reading the log */
        fr_pump(j, i);
    char name[96];
    fr_proc_name(j, i, name, sizeof name);
    fr_say("%s %s", name, how);
    size_t len = 0;
    char *tail = file_tail(w->log_path, TAIL_LINES, &len);
    if (!tail || len == 0) {
        fprintf(stderr, "fleetrun: (%s is empty)\n", w->log_path);
    } else {
        fprintf(stderr, "----- last %d lines of %s -----\n", TAIL_LINES, w->log_path);
        fwrite(tail, 1, len, stderr);
        if (tail[len - 1] != '\n')
            fputc('\n', stderr);
        fprintf(stderr, "----- end of %s -----\n", w->log_path);
    }
    free(tail);
}

/* Later failures while the others wind down: one line each, with the log's last line (a fleet
 * worker names the dead peer there). */
void fr_report_secondary(job *j, int i) {
    worker *w = &j->w[i];
    char how[64];
    fr_describe_status(w->status, how, sizeof how);
    for (int k = 0; k < 64 && w->out_fd >= 0; k++)
        fr_pump(j, i);
    size_t len = 0;
    char *tail = file_tail(w->log_path, 1, &len);
    if (tail && len && tail[len - 1] == '\n')
        tail[--len] = '\0';
    char name[96];
    fr_proc_name(j, i, name, sizeof name);
    fr_say("%s %s%s%s", name, how, len ? ": " : "", len ? tail : "");
    free(tail);
}
