/* fleet-plot - draws training runs' metrics.jsonl (fleet-train's train.log_dir) into one PNG or
 * SVG figure through gnuplot: one panel per metric against step or time, every run a line of its
 * own colour in every panel. The records are read with the library's strict JSON parser and kept
 * as the few numbers drawn; gnuplot gets one script on its stdin (the data inline, as datablocks)
 * and writes OUT.tmp.PID, which is renamed over OUT only when it succeeded. docs/plot.md. */
#include "fleet/status.h"
#include "io/json_parse.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { PHASE_TRAIN, PHASE_EVAL, NPHASE };

/* The fields fleet-plot reads (docs/config.md, "Output"); the rest of a record is ignored. */
enum field {
    F_STEP, F_TIME, F_LOSS, F_ACC1, F_LR, F_BYTES_SENT, F_LOCALSGD_K, F_DGC_SPARSITY, F_STEP_MS,
    F_IPS, F_VAL_LOSS, F_VAL_ACC1, NFIELD
};
static const char *const field_names[NFIELD] = {
    [F_STEP] = "step", [F_TIME] = "time", [F_LOSS] = "loss", [F_ACC1] = "acc1", [F_LR] = "lr",
    [F_BYTES_SENT] = "bytes_sent", [F_LOCALSGD_K] = "localsgd_k",
    [F_DGC_SPARSITY] = "dgc_sparsity", [F_STEP_MS] = "step_ms", [F_IPS] = "ips",
    [F_VAL_LOSS] = "val_loss", [F_VAL_ACC1] = "val_acc1",
};

/* One line of a panel: a field of one phase's records, scaled. */
typedef struct {
    int         phase;
    enum field  field;
    double      scale;
    bool        dashed; /* evaluation numbers beside training ones */
    const char *suffix; /* after the run's label in the key */
} series;

/* One panel (--metrics). */
typedef struct {
    const char *name;
    const char *ylabel;
    const char *help;
    series      lines[2];
    int         nlines;
} metric;

static const metric metrics[] = {
    {"loss", "loss", "training loss (solid) and test loss (dashed)",
     {{PHASE_TRAIN, F_LOSS, 1, false, ""}, {PHASE_EVAL, F_VAL_LOSS, 1, true, " val"}}, 2},
    {"acc", "top-1 accuracy", "training top-1 (solid) and test top-1 (dashed)",
     {{PHASE_TRAIN, F_ACC1, 1, false, ""}, {PHASE_EVAL, F_VAL_ACC1, 1, true, " val"}}, 2},
    {"val_acc", "test accuracy", "test top-1 after each evaluation",
     {{PHASE_EVAL, F_VAL_ACC1, 1, false, ""}}, 1},
    {"lr", "learning rate", "learning rate", {{PHASE_TRAIN, F_LR, 1, false, ""}}, 1},
    {"bytes", "MB sent per worker", "MB this worker has sent since the start",
     {{PHASE_TRAIN, F_BYTES_SENT, 1e-6, false, ""}}, 1},
    {"interval", "Local SGD interval k", "Local SGD's interval k",
     {{PHASE_TRAIN, F_LOCALSGD_K, 1, false, ""}}, 1},
    {"sparsity", "DGC sparsity", "DGC's sparsity", {{PHASE_TRAIN, F_DGC_SPARSITY, 1, false, ""}}, 1},
    {"step_ms", "ms per step", "wall ms per step", {{PHASE_TRAIN, F_STEP_MS, 1, false, ""}}, 1},
    {"ips", "samples/s", "samples per second", {{PHASE_TRAIN, F_IPS, 1, false, ""}}, 1},
};
enum { NMETRIC = sizeof metrics / sizeof metrics[0], MAX_PANELS = 16, MAX_RUNS = 32 };
#define DEFAULT_METRICS "loss,val_acc,lr,bytes"

/* One record's numbers, NAN where the record has no such (finite, numeric) field. */
typedef struct {
    double v[NFIELD];
} record;

/* A run: where it came from and its train and eval records, in file order. */
typedef struct {
    char    label[256];
    char    path[PATH_MAX];
    record *rec[NPHASE];
    int     nrec[NPHASE];
} run;

/* The figure asked for on the command line. */
typedef struct {
    const char   *out;
    bool          svg;
    enum field    x;
    const char   *title;
    int           width, height; /* 0: from the number of panels */
    const metric *panels[MAX_PANELS];
    int           npanels;
} figure;

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-plot -o OUT.png|OUT.svg [--x step|time] [--metrics LIST]\n"
            "                  [--title TEXT] [--size WxH] RUN...\n"
            "\n"
            "  RUN                LABEL=PATH or PATH: a metrics.jsonl, or the directory holding\n"
            "                     one (fleet-train's train.log_dir); the label defaults to the\n"
            "                     directory's name\n"
            "  -o, --output FILE  the figure; .png (pngcairo) or .svg\n"
            "  --x step|time      x axis: update steps (default) or seconds since training\n"
            "                     started, evaluations excluded\n"
            "  --metrics LIST     comma-separated panels (default " DEFAULT_METRICS "):\n");
    for (int i = 0; i < NMETRIC; i++)
        fprintf(out, "                       %-9s %s\n", metrics[i].name, metrics[i].help);
    fprintf(out,
            "  --title TEXT       a title above the panels\n"
            "  --size WxH         pixels (default 560x360 per panel, two panels a row)\n"
            "  -h, --help         this text\n"
            "\n"
            "gnuplot (Debian's gnuplot-nox) draws; FLEET_GNUPLOT names another binary.\n"
            "Exit status: 0 drawn, 1 gnuplot missing or failed, 2 bad arguments or input.\n");
}

static void errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errorf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fleet-plot: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const metric *find_metric(const char *name, size_t n) {
    for (int i = 0; i < NMETRIC; i++)
        if (strlen(metrics[i].name) == n && !strncmp(metrics[i].name, name, n))
            return &metrics[i];
    return NULL;
}

static int parse_metrics(const char *list, figure *fig) {
    fig->npanels = 0;
    for (const char *p = list;; p++) {
        size_t len = strcspn(p, ",");
        const metric *m = find_metric(p, len);
        if (!m) {
            fprintf(stderr, "fleet-plot: error: --metrics: unknown metric '%.*s' (valid:", (int)len,
                    p);
            for (int i = 0; i < NMETRIC; i++)
                fprintf(stderr, " %s", metrics[i].name);
            fprintf(stderr, ")\n");
            return -1;
        }
        if (fig->npanels == MAX_PANELS) {
            errorf("--metrics: at most %d panels", MAX_PANELS);
            return -1;
        }
        fig->panels[fig->npanels++] = m;
        p += len;
        if (!*p)
            return 0;
    }
}

/* The last component of path into out; for "", "." or ".." (and "/"), of its real path. */
static void base_name(const char *path, char *out, size_t n) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/')
        buf[--len] = '\0';
    char *slash = strrchr(buf, '/'), *base = slash ? slash + 1 : buf;
    if ((!*base || !strcmp(base, ".") || !strcmp(base, "..")) && realpath(path, buf)) {
        slash = strrchr(buf, '/');
        base = slash && slash[1] ? slash + 1 : buf;
    }
    snprintf(out, n, "%s", base);
}

/* RUN is LABEL=PATH or PATH. An argument that exists as a path is a path; otherwise it splits
 * at the first '=' whose right side exists (a label or a path may hold '=', as in lr=0.1), or,
 * when none does, at the first '='. A directory means its metrics.jsonl. */
static int parse_run(const char *arg, run *r) {
    memset(r, 0, sizeof *r);
    struct stat sb;
    const char *eq = NULL;
    if (stat(arg, &sb) != 0) {
        for (const char *p = strchr(arg, '='); p && !eq; p = strchr(p + 1, '='))
            if (stat(p + 1, &sb) == 0)
                eq = p;
        if (!eq)
            eq = strchr(arg, '=');
    }
    const char *path = eq ? eq + 1 : arg;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    int w = snprintf(r->path, sizeof r->path, dir ? "%s/metrics.jsonl" : "%s", path);
    if (!*path || w < 0 || (size_t)w >= sizeof r->path) {
        errorf("'%s': not a usable path", arg);
        return -1;
    }
    if (eq && eq > arg) {
        snprintf(r->label, sizeof r->label, "%.*s", (int)(eq - arg), arg);
    } else if (dir) {
        base_name(path, r->label, sizeof r->label);
    } else { /* .../NAME/metrics.jsonl is NAME; another file is its own name */
        char name[256];
        base_name(path, name, sizeof name);
        if (!strcmp(name, "metrics.jsonl")) {
            char parent[PATH_MAX];
            const char *slash = strrchr(path, '/');
            snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - path + 1) : 1,
                     slash ? path : ".");
            base_name(parent, name, sizeof name);
        }
        snprintf(r->label, sizeof r->label, "%s", name);
    }
    return 0;
}

/* Adds a parsed line to run r when it is a train or eval record; other phases are ignored. */
static int add_record(run *r, const fl_json *o) {
    const fl_json *ph = fl_json_get(o, "phase");
    int phase = !ph || ph->type != FL_JSON_STRING ? -1
                : !strcmp(ph->s, "train")         ? PHASE_TRAIN
                : !strcmp(ph->s, "eval")          ? PHASE_EVAL
                                                  : -1;
    if (phase < 0)
        return 0;
    int n = r->nrec[phase];
    if ((n & (n - 1)) == 0) { /* grows at 1, 2, 4, ... */
        record *grown = realloc(r->rec[phase], (size_t)(n ? 2 * n : 1) * sizeof *grown);
        if (!grown) {
            errorf("out of memory reading %s", r->path);
            return -1;
        }
        r->rec[phase] = grown;
    }
    record *rec = &r->rec[phase][r->nrec[phase]++];
    for (int f = 0; f < NFIELD; f++) {
        const fl_json *v = fl_json_get(o, field_names[f]);
        rec->v[f] = v && v->type == FL_JSON_NUMBER && isfinite(v->d) ? v->d : NAN;
    }
    return 0;
}

/* Reads the run's file, one JSON object a line. A last line without its newline that does not
 * parse is a run killed while writing it: a warning. Returns 0 or -1 (said). */
static int read_run(run *r) {
    FILE *f = fopen(r->path, "r");
    if (!f) {
        errorf("%s: cannot open %s: %s", r->label, r->path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (int lineno = 1; rc == 0 && (len = getline(&line, &cap, f)) >= 0; lineno++) {
        if (strspn(line, " \t\r\n") >= (size_t)len)
            continue;
        fl_json *o = fl_json_parse(line, (size_t)len);
        if (!o && line[len - 1] != '\n') {
            fprintf(stderr, "fleet-plot: warning: %s:%d: incomplete last line skipped (%s)\n",
                    r->path, lineno, fl_errmsg());
        } else if (!o || o->type != FL_JSON_OBJECT) {
            errorf("%s:%d: %s", r->path, lineno, o ? "not a JSON object" : fl_errmsg());
            rc = -1;
        } else {
            rc = add_record(r, o);
        }
        fl_json_free(o);
    }
    if (rc == 0 && ferror(f)) {
        errorf("%s: cannot read %s: %s", r->label, r->path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc == 0 && r->nrec[PHASE_TRAIN] + r->nrec[PHASE_EVAL] == 0) {
        errorf("%s: no train or eval records (is it fleet-train's metrics.jsonl?)", r->path);
        rc = -1;
    }
    return rc;
}

static void free_run(run *r) {
    for (int p = 0; p < NPHASE; p++)
        free(r->rec[p]);
}

/* A gnuplot string: single-quoted, so that no backslash escape, `command` or @macro inside is
 * interpreted (a quote is doubled); control characters become spaces. */
static void put_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc((unsigned char)*s < 0x20 || *s == 0x7f ? ' ' : *s, f);
    }
    fputc('\'', f);
}

typedef struct {
    double lo, hi;
} range;

static void widen(range *r, double v) {
    r->lo = fmin(r->lo, v);
    r->hi = fmax(r->hi, v);
}

/* Writes run r's points of series s as datablock $dRUN_PANEL_LINE, widening the panel's ranges;
 * returns their count. */
static int put_block(FILE *f, const run *r, int ri, int pi, int li, const series *s,
                     enum field x, range *xr, range *yr) {
    int n = 0;
    fprintf(f, "$d%d_%d_%d << EOD\n", ri, pi, li);
    for (int i = 0; i < r->nrec[s->phase]; i++) {
        const record *rec = &r->rec[s->phase][i];
        double xv = rec->v[x], yv = rec->v[s->field] * s->scale;
        if (isnan(xv) || isnan(yv))
            continue;
        fprintf(f, "%.17g %.17g\n", xv, yv);
        widen(xr, xv);
        widen(yr, yv);
        n++;
    }
    fprintf(f, "EOD\n");
    return n;
}

/* An axis' range: autoscaled, or around its one value (gnuplot warns of an empty range). */
static void put_range(FILE *f, char axis, range r) {
    if (r.lo < r.hi) {
        fprintf(f, "set %crange [*:*]\n", axis);
    } else {
        double d = r.lo != 0 ? fabs(r.lo) * 0.05 : 1;
        fprintf(f, "set %crange [%.17g:%.17g]\n", axis, r.lo - d, r.lo + d);
    }
}

/* One panel: every run's lines of metric m, in the run's colour, or "no data". */
static void put_panel(FILE *f, const metric *m, int pi, const run *runs, int nruns,
                      int counts[][2], range xr, range yr) {
    fprintf(f, "unset label\nset ylabel '%s'\n", m->ylabel);
    int plotted = 0;
    for (int ri = 0; ri < nruns; ri++)
        for (int li = 0; li < m->nlines; li++) {
            int n = counts[ri][li];
            if (!n)
                continue;
            if (!plotted) {
                put_range(f, 'x', xr);
                put_range(f, 'y', yr);
            }
            fprintf(f, "%s $d%d_%d_%d with %s lc %d dt %d title ", plotted++ ? ", \\\n  " : "plot",
                    ri, pi, li, n == 1 ? "points pt 7" : "lines lw 1.5", ri + 1,
                    m->lines[li].dashed ? 2 : 1);
            char key[300]; /* label (< 256) and suffix */
            snprintf(key, sizeof key, "%.255s%.16s", runs[ri].label, m->lines[li].suffix);
            put_quoted(f, key);
        }
    if (!plotted)
        fprintf(f, "set label 'no data' at graph 0.5, 0.5 center\nunset xtics\nunset ytics\n"
                   "set xrange [0:1]\nset yrange [0:1]\nplot NaN notitle\nset xtics\nset ytics");
    fputc('\n', f);
}

/* The whole gnuplot script: the datablocks, then the multiplot drawing into tmp_out. */
static int put_script(FILE *f, const figure *fig, const char *tmp_out, const run *runs,
                      int nruns) {
    int cols = fig->npanels > 1 ? 2 : 1, rows = (fig->npanels + cols - 1) / cols;
    int width = fig->width ? fig->width : 560 * cols;
    int height = fig->height ? fig->height : 360 * rows + (fig->title ? 30 : 0);
    static int counts[MAX_PANELS][MAX_RUNS][2];
    range xr[MAX_PANELS], yr[MAX_PANELS];
    for (int pi = 0; pi < fig->npanels; pi++) {
        xr[pi] = yr[pi] = (range){INFINITY, -INFINITY};
        for (int ri = 0; ri < nruns; ri++)
            for (int li = 0; li < fig->panels[pi]->nlines; li++)
                counts[pi][ri][li] = put_block(f, &runs[ri], ri, pi, li,
                                               &fig->panels[pi]->lines[li], fig->x, &xr[pi],
                                               &yr[pi]);
    }
    fprintf(f, "set terminal %s size %d,%d noenhanced font 'sans,9'\nset output ",
            fig->svg ? "svg dynamic" : "pngcairo", width, height);
    put_quoted(f, tmp_out);
    fprintf(f, "\nset multiplot layout %d,%d", rows, cols);
    if (fig->title) {
        fprintf(f, " title ");
        put_quoted(f, fig->title);
    }
    /* the key under each panel, off the lines; margins above and below, so that a constant line
     * (k = 1, no bytes sent) is not hidden by the border */
    fprintf(f, "\nset grid\nset key below horizontal samplen 2\n"
               "set offsets 0, 0, graph 0.05, graph 0.05\nset xlabel '%s' offset 0, 0.5\n",
            fig->x == F_TIME ? "seconds" : "step");
    for (int pi = 0; pi < fig->npanels; pi++)
        put_panel(f, fig->panels[pi], pi, runs, nruns, counts[pi], xr[pi], yr[pi]);
    fprintf(f, "unset multiplot\nset output\n");
    return ferror(f) ? -1 : 0;
}

/* Starts gnuplot reading its script from a pipe; its stdout (where the figure would go if it
 * could not open the output) is /dev/null, its stderr ours. Returns the pipe's write end, or -1
 * (said). */
static int spawn_gnuplot(const char *gp, pid_t *pid) {
    int fd[2];
    if (pipe(fd) != 0 || fcntl(fd[0], F_SETFD, FD_CLOEXEC) || fcntl(fd[1], F_SETFD, FD_CLOEXEC)) {
        errorf("pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[0], STDIN_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    char *argv[] = {(char *)gp, NULL};
    int rc = strchr(gp, '/') ? posix_spawn(pid, gp, &fa, NULL, argv, environ)
                             : posix_spawnp(pid, gp, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[0]);
    if (rc) {
        close(fd[1]);
        errorf("gnuplot not found (install gnuplot-nox: scripts/install-deps.sh)");
        fprintf(stderr, "hint: ran '%s': %s; FLEET_GNUPLOT names the binary\n", gp, strerror(rc));
        return -1;
    }
    return fd[1];
}

/* Draws the figure into tmp_out through gnuplot. Returns 0, or 1 (said). */
static int run_gnuplot(const figure *fig, const char *tmp_out, const run *runs, int nruns) {
    const char *gp = getenv("FLEET_GNUPLOT");
    if (!gp || !*gp)
        gp = "gnuplot";
    pid_t pid;
    int fd = spawn_gnuplot(gp, &pid);
    if (fd < 0)
        return 1;
    FILE *f = fdopen(fd, "w");
    int wrc = f ? put_script(f, fig, tmp_out, runs, nruns) : -1;
    int werr = errno;
    if (f ? fclose(f) != 0 : close(fd) != 0)
        wrc = -1, werr = errno;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            errorf("waiting for %s: %s", gp, strerror(errno));
            return 1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) { /* exec failed after the fork */
        errorf("gnuplot not found (install gnuplot-nox: scripts/install-deps.sh)");
        fprintf(stderr, "hint: ran '%s'; FLEET_GNUPLOT names the binary\n", gp);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        errorf("%s failed (%s %d)", gp, WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return 1;
    }
    if (wrc < 0) {
        errorf("writing the script to %s: %s", gp, strerror(werr));
        return 1;
    }
    struct stat sb;
    if (stat(tmp_out, &sb) != 0 || sb.st_size == 0) {
        errorf("%s wrote nothing to %s", gp, tmp_out);
        return 1;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Reads the runs and draws them into fig->out through a temporary file beside it. Returns the
 * exit status. */
static int plot(const figure *fig, run *runs, int nruns) {
    for (int i = 0; i < nruns; i++)
        if (read_run(&runs[i]) < 0)
            return 2;
    char tmp_out[PATH_MAX + 32];
    snprintf(tmp_out, sizeof tmp_out, "%s.tmp.%ld", fig->out, (long)getpid());
    /* made here, so that an unwritable place is our error (gnuplot would draw to stdout) */
    int fd = open(tmp_out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        errorf("cannot write %s: %s", tmp_out, strerror(errno));
        return 2;
    }
    close(fd);
    int rc = run_gnuplot(fig, tmp_out, runs, nruns);
    if (rc == 0 && rename(tmp_out, fig->out) != 0) {
        errorf("cannot write %s: %s", fig->out, strerror(errno));
        rc = 2;
    }
    if (rc)
        unlink(tmp_out);
    return rc;
}

/* --size WxH */
static int parse_size(const char *v, figure *fig) {
    int end = 0;
    if (sscanf(v, "%dx%d%n", &fig->width, &fig->height, &end) != 2 || v[end] ||
        fig->width < 100 || fig->height < 100 || fig->width > 10000 || fig->height > 10000) {
        errorf("--size '%s': want WxH, 100..10000 pixels each", v);
        return -1;
    }
    return 0;
}

/* Options taking a value: "-o OUT", "--x time" or "--x=time". */
static bool takes_value(const char *name) {
    static const char *const names[] = {"-o", "--output", "--x", "--metrics", "--title", "--size"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (!strcmp(name, names[k]))
            return true;
    return false;
}

int main(int argc, char **argv) {
    figure fig = {.x = F_STEP};
    const char *xname = "step", *mlist = DEFAULT_METRICS;
    static run runs[MAX_RUNS];
    int nruns = 0;
    bool options = true; /* until "--" */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!options || a[0] != '-' || !a[1]) { /* a run ("-" would be a file) */
            if (nruns == MAX_RUNS) {
                errorf("at most %d runs in one figure", MAX_RUNS);
                return 2;
            }
            if (parse_run(a, &runs[nruns++]) < 0)
                return 2;
            continue;
        }
        if (!strcmp(a, "--")) {
            options = false;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL, *v = eq ? eq + 1 : NULL;
        char name[32];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        if (!takes_value(name)) {
            errorf("unknown option '%s' (fleet-plot --help)", a);
            return 2;
        }
        if (!v && i + 1 < argc)
            v = argv[++i];
        if (!v) {
            errorf("%s needs a value", name);
            return 2;
        }
        if (!strcmp(name, "-o") || !strcmp(name, "--output"))
            fig.out = v;
        else if (!strcmp(name, "--x"))
            xname = v;
        else if (!strcmp(name, "--metrics"))
            mlist = v;
        else if (!strcmp(name, "--title"))
            fig.title = v;
        else if (parse_size(v, &fig) < 0)
            return 2;
    }
    if (!fig.out || !nruns) {
        errorf("%s", !fig.out ? "no output given (-o OUT.png or OUT.svg)" : "no run given");
        usage(stderr);
        return 2;
    }
    fig.svg = ends_with(fig.out, ".svg");
    if (!fig.svg && !ends_with(fig.out, ".png")) {
        errorf("-o %s: the name must end in .png or .svg", fig.out);
        return 2;
    }
    if (strcmp(xname, "step") && strcmp(xname, "time")) {
        errorf("--x '%s': want step or time", xname);
        return 2;
    }
    fig.x = !strcmp(xname, "time") ? F_TIME : F_STEP;
    if (parse_metrics(mlist, &fig) < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN); /* a gnuplot that dies early: EPIPE, and its exit status said */
    int rc = plot(&fig, runs, nruns);
    for (int i = 0; i < nruns; i++)
        free_run(&runs[i]);
    if (rc == 0)
        printf("fleet-plot: %s: %d run(s), %d panel(s) against %s\n", fig.out, nruns,
               fig.npanels, xname);
    return rc;
}
