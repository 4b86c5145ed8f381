/* fleet-plot - draws training runs' metrics.jsonl (fleet-train's train.log_dir) into one PNG or
 * SVG figure through gnuplot: one panel per metric (loss, accuracy, learning rate, bytes sent,
 * Local SGD interval, DGC sparsity, step time, throughput) against step or wall time, every run
 * a line of its own colour in every panel. The records are read with the library's strict JSON
 * parser; gnuplot gets one script (the data inline, as datablocks) and writes a temporary file
 * that is renamed over the output only when it succeeded. docs/plot.md. */
#include "fleet/status.h"
#include "io/json_parse.h"

#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum { PHASE_TRAIN, PHASE_EVAL, NPHASE };

/* One line of a panel: a field of the records of one phase, scaled. */
typedef struct {
    int         phase;
    const char *field;
    double      scale;
    bool        dashed; /* evaluation numbers beside training ones */
    const char *suffix; /* after the run's label in the key */
} series;

typedef struct {
    const char *name;   /* --metrics */
    const char *ylabel;
    series      lines[2];
    int         nlines;
} metric;

static const metric metrics[] = {
    {"loss", "loss", {{PHASE_TRAIN, "loss", 1, false, ""}, {PHASE_EVAL, "val_loss", 1, true, " val"}}, 2},
    {"acc", "top-1 accuracy", {{PHASE_TRAIN, "acc1", 1, false, ""}, {PHASE_EVAL, "val_acc1", 1, true, " val"}}, 2},
    {"val_acc", "test accuracy", {{PHASE_EVAL, "val_acc1", 1, false, ""}}, 1},
    {"lr", "learning rate", {{PHASE_TRAIN, "lr", 1, false, ""}}, 1},
    {"bytes", "MB sent per worker", {{PHASE_TRAIN, "bytes_sent", 1e-6, false, ""}}, 1},
    {"interval", "Local SGD interval k", {{PHASE_TRAIN, "localsgd_k", 1, false, ""}}, 1},
    {"sparsity", "DGC sparsity", {{PHASE_TRAIN, "dgc_sparsity", 1, false, ""}}, 1},
    {"step_ms", "ms per step", {{PHASE_TRAIN, "step_ms", 1, false, ""}}, 1},
    {"ips", "samples/s", {{PHASE_TRAIN, "ips", 1, false, ""}}, 1},
};
enum { NMETRIC = sizeof metrics / sizeof metrics[0], MAX_PANELS = 16, MAX_RUNS = 32 };

/* A run: its records, as the parsed JSON objects of each phase. */
typedef struct {
    char      label[256];
    char      path[4096];
    fl_json **rec[NPHASE];
    int       nrec[NPHASE];
} run;

static void usage(FILE *out) {
    fprintf(out,
            "usage: fleet-plot -o OUT.png|OUT.svg [--x step|time] [--metrics LIST]\n"
            "                  [--title TEXT] [--size WxH] RUN...\n"
            "\n"
            "RUN is LABEL=PATH or PATH: a metrics.jsonl, or the directory holding one\n"
            "(fleet-train's train.log_dir); the label defaults to the directory's name and\n"
            "ends at the last '=' (a RUN that exists as a path is a path).\n"
            "--metrics: comma-separated panels (default loss,val_acc,lr,bytes) of\n"
            "  loss      training loss (solid) and test loss (dashed)\n"
            "  acc       training top-1 (solid) and test top-1 (dashed)\n"
            "  val_acc   test top-1 after each evaluation\n"
            "  lr        learning rate\n"
            "  bytes     MB this worker has sent since the start\n"
            "  interval  Local SGD's interval k\n"
            "  sparsity  DGC's sparsity\n"
            "  step_ms   wall ms per step\n"
            "  ips       samples per second\n"
            "--x time: seconds since training started (evaluations excluded) instead of steps.\n"
            "gnuplot (Debian's gnuplot-nox) draws; FLEET_GNUPLOT names another binary.\n"
            "Exit status: 0 drawn, 1 gnuplot missing or failed, 2 bad arguments or input.\n");
}

static const metric *find_metric(const char *name, size_t n) {
    for (int i = 0; i < NMETRIC; i++)
        if (strlen(metrics[i].name) == n && !strncmp(metrics[i].name, name, n))
            return &metrics[i];
    return NULL;
}

static int parse_metrics(const char *list, const metric **out, int *n) {
    *n = 0;
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        const metric *m = find_metric(p, len);
        if (!m) {
            fprintf(stderr, "fleet-plot: --metrics: unknown metric '%.*s' (valid:", (int)len, p);
            for (int i = 0; i < NMETRIC; i++)
                fprintf(stderr, " %s", metrics[i].name);
            fprintf(stderr, ")\n");
            return -1;
        }
        if (*n == MAX_PANELS) {
            fprintf(stderr, "fleet-plot: --metrics: at most %d panels\n", MAX_PANELS);
            return -1;
        }
        out[(*n)++] = m;
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

/* Reads a whole file into a NUL-terminated buffer. */
static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += got;
        if (cap - len - 1 == 0) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (!buf || err) {
        free(buf);
        errno = err ? err : ENOMEM;
        return NULL;
    }
    buf[len] = '\0';
    *n = len;
    return buf;
}

static int add_record(run *r, int phase, fl_json *rec) {
    fl_json **grown = realloc(r->rec[phase], (size_t)(r->nrec[phase] + 1) * sizeof *grown);
    if (!grown)
        return -1;
    r->rec[phase] = grown;
    grown[r->nrec[phase]++] = rec;
    return 0;
}

/* Reads the run's file: every line one JSON object. A last line without its newline that does
 * not parse is a run cut short while writing: a warning. Returns 0 or -1 (said). */
static int read_run(run *r) {
    size_t n;
    char *text = slurp(r->path, &n);
    if (!text) {
        fprintf(stderr, "fleet-plot: %s: cannot open %s: %s\n", r->label, r->path, strerror(errno));
        return -1;
    }
    int rc = 0, line = 0;
    for (char *p = text; *p && rc == 0; line++) {
        char *end = strchr(p, '\n');
        bool last = !end;
        size_t len = last ? strlen(p) : (size_t)(end - p);
        char *next = last ? p + len : end + 1;
        if (strspn(p, " \t\r") >= len) {
            p = next;
            continue;
        }
        fl_json *rec = fl_json_parse(p, len);
        if (!rec && last) {
            fprintf(stderr, "fleet-plot: warning: %s:%d: an incomplete last line (%s), skipped\n",
                    r->path, line + 1, fl_errmsg());
        } else if (!rec || rec->type != FL_JSON_OBJECT) {
            fprintf(stderr, "fleet-plot: %s:%d: %s\n", r->path, line + 1,
                    rec ? "not a JSON object" : fl_errmsg());
            rc = -1;
        } else {
            const fl_json *ph = fl_json_get(rec, "phase");
            int phase = !ph || ph->type != FL_JSON_STRING ? -1
                        : !strcmp(ph->s, "train")         ? PHASE_TRAIN
                        : !strcmp(ph->s, "eval")          ? PHASE_EVAL
                                                          : -1;
            if (phase >= 0 && add_record(r, phase, rec) == 0)
                rec = NULL;
            else if (phase >= 0)
                rc = -1, fprintf(stderr, "fleet-plot: out of memory\n");
        }
        fl_json_free(rec);
        p = next;
    }
    free(text);
    if (rc == 0 && r->nrec[PHASE_TRAIN] + r->nrec[PHASE_EVAL] == 0) {
        fprintf(stderr, "fleet-plot: %s: no train or eval records (is it fleet-train's "
                        "metrics.jsonl?)\n", r->path);
        rc = -1;
    }
    return rc;
}

static void free_run(run *r) {
    for (int p = 0; p < NPHASE; p++) {
        for (int i = 0; i < r->nrec[p]; i++)
            fl_json_free(r->rec[p][i]);
        free(r->rec[p]);
    }
}

/* LABEL=PATH or PATH; a directory means its metrics.jsonl. An argument that exists as a path
 * is a path; otherwise the label ends at the last '=' (so a label may hold '=' itself). */
static int parse_run(const char *arg, run *r) {
    memset(r, 0, sizeof *r);
    struct stat sb;
    const char *eq = stat(arg, &sb) == 0 ? NULL : strrchr(arg, '=');
    const char *path = eq ? eq + 1 : arg;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    int w = snprintf(r->path, sizeof r->path, dir ? "%s/metrics.jsonl" : "%s", path);
    if (w < 0 || (size_t)w >= sizeof r->path || !*path) {
        fprintf(stderr, "fleet-plot: '%s': not a usable path\n", arg);
        return -1;
    }
    if (eq) {
        snprintf(r->label, sizeof r->label, "%.*s", (int)(eq - arg), arg);
    } else { /* the directory's name: .../NAME/metrics.jsonl or .../NAME */
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", dir ? path : r->path);
        size_t len = strlen(tmp);
        while (len > 1 && tmp[len - 1] == '/')
            tmp[--len] = '\0';
        char *slash = strrchr(tmp, '/');
        if (!dir && slash && !strcmp(slash + 1, "metrics.jsonl") && slash != tmp) {
            *slash = '\0';
            slash = strrchr(tmp, '/');
        }
        snprintf(r->label, sizeof r->label, "%s", slash ? slash + 1 : tmp);
    }
    return 0;
}

/* A gnuplot double-quoted string: backslash and quote escaped, no control characters. */
static void put_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
    }
    fputc('"', f);
}

static bool field_num(const fl_json *rec, const char *key, double *out) {
    const fl_json *v = fl_json_get(rec, key);
    if (!v || v->type != FL_JSON_NUMBER || !isfinite(v->d))
        return false;
    *out = v->d;
    return true;
}

/* Writes run r's points of one series as datablock $dRUN_PANEL_LINE; returns their count. */
static int put_block(FILE *f, const run *r, int ri, int pi, int li, const series *s,
                     const char *xfield) {
    int n = 0;
    fprintf(f, "$d%d_%d_%d << EOD\n", ri, pi, li);
    for (int i = 0; i < r->nrec[s->phase]; i++) {
        double x, y;
        if (field_num(r->rec[s->phase][i], xfield, &x) && field_num(r->rec[s->phase][i], s->field, &y)) {
            fprintf(f, "%.17g %.17g\n", x, y * s->scale);
            n++;
        }
    }
    fprintf(f, "EOD\n");
    return n;
}

static int write_script(FILE *f, const char *out, bool svg, int width, int height,
                        const char *title, const char *xfield, const metric **panels,
                        int npanels, const run *runs, int nruns) {
    static int counts[MAX_RUNS][MAX_PANELS][2];
    for (int ri = 0; ri < nruns; ri++)
        for (int pi = 0; pi < npanels; pi++)
            for (int li = 0; li < panels[pi]->nlines; li++)
                counts[ri][pi][li] = put_block(f, &runs[ri], ri, pi, li, &panels[pi]->lines[li],
                                               xfield);
    fprintf(f, "set terminal %s size %d,%d noenhanced font \"sans,9\"\nset output ",
            svg ? "svg dynamic" : "pngcairo", width, height);
    put_quoted(f, out);
    int cols = npanels > 1 ? 2 : 1, rows = (npanels + cols - 1) / cols;
    fprintf(f, "\nset multiplot layout %d,%d", rows, cols);
    if (title) {
        fprintf(f, " title ");
        put_quoted(f, title);
    }
    /* the key under each panel, off the lines; a margin above, so that a constant line (k = 16)
     * is not hidden by the border */
    fprintf(f, "\nset grid\nset key below horizontal samplen 2\n"
               "set offsets 0, 0, graph 0.05, 0\n");
    fprintf(f, "set xlabel \"%s\"\n", !strcmp(xfield, "time") ? "seconds" : "step");
    for (int pi = 0; pi < npanels; pi++) {
        const metric *m = panels[pi];
        fprintf(f, "unset label\nset autoscale\nset ylabel \"%s\"\n", m->ylabel);
        int plotted = 0;
        for (int ri = 0; ri < nruns; ri++)
            for (int li = 0; li < m->nlines; li++) {
                if (!counts[ri][pi][li])
                    continue;
                fprintf(f, "%s $d%d_%d_%d with %s lc %d dt %d title ", plotted ? "," : "plot",
                        ri, pi, li, counts[ri][pi][li] == 1 ? "points pt 7" : "lines lw 1.5",
                        ri + 1, m->lines[li].dashed ? 2 : 1);
                char key[300]; /* label (< 256) and suffix */
                snprintf(key, sizeof key, "%.255s%.16s", runs[ri].label, m->lines[li].suffix);
                put_quoted(f, key);
                plotted++;
            }
        if (!plotted) /* an empty panel, with its name */
            fprintf(f, "set label \"no data\" at graph 0.5, 0.5 center\nset xrange [0:1]\n"
                       "set yrange [0:1]\nplot 2 notitle");
        fputc('\n', f);
    }
    fprintf(f, "unset multiplot\nset output\n");
    return ferror(f) ? -1 : 0;
}

/* Runs gnuplot on the script file; its messages go to our stderr. Returns 0, or 1 (said). */
static int run_gnuplot(const char *script) {
    const char *gp = getenv("FLEET_GNUPLOT");
    if (!gp || !*gp)
        gp = "gnuplot";
    char *argv[] = {(char *)gp, (char *)script, NULL};
    pid_t pid;
    int rc = strchr(gp, '/') ? posix_spawn(&pid, gp, NULL, NULL, argv, environ)
                             : posix_spawnp(&pid, gp, NULL, NULL, argv, environ);
    if (rc == ENOENT || rc == EACCES) {
        fprintf(stderr, "fleet-plot: gnuplot not found (%s: %s; install gnuplot-nox: "
                        "scripts/install-deps.sh)\n", gp, strerror(rc));
        return 1;
    }
    if (rc) {
        fprintf(stderr, "fleet-plot: cannot start %s: %s\n", gp, strerror(rc));
        return 1;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            fprintf(stderr, "fleet-plot: waiting for %s: %s\n", gp, strerror(errno));
            return 1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) { /* the exec failed after the fork */
        fprintf(stderr, "fleet-plot: gnuplot not found (%s; install gnuplot-nox: "
                        "scripts/install-deps.sh)\n", gp);
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "fleet-plot: %s failed (%s %d)\n", gp,
                WIFEXITED(status) ? "exit status" : "signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return 1;
    }
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

int main(int argc, char **argv) {
    const char *out = NULL, *xfield = "step", *title = NULL, *mlist = "loss,val_acc,lr,bytes";
    int width = 0, height = 0;
    static run runs[MAX_RUNS];
    int nruns = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--x") || !strcmp(a, "--metrics") ||
                   !strcmp(a, "--title") || !strcmp(a, "--size")) {
            if (!has_value) {
                fprintf(stderr, "fleet-plot: %s needs a value\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "-o"))
                out = v;
            else if (!strcmp(a, "--x"))
                xfield = v;
            else if (!strcmp(a, "--metrics"))
                mlist = v;
            else if (!strcmp(a, "--title"))
                title = v;
            else if (sscanf(v, "%dx%d", &width, &height) != 2 || width < 100 || height < 100 ||
                     width > 10000 || height > 10000) {
                fprintf(stderr, "fleet-plot: --size '%s': want WxH, 100..10000 pixels each\n", v);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "fleet-plot: unknown option '%s' (fleet-plot --help)\n", a);
            return 2;
        } else if (nruns == MAX_RUNS) {
            fprintf(stderr, "fleet-plot: at most %d runs in one figure\n", MAX_RUNS);
            return 2;
        } else if (parse_run(a, &runs[nruns++]) < 0) {
            return 2;
        }
    }
    if (!out || !nruns) {
        usage(stderr);
        return 2;
    }
    bool svg = ends_with(out, ".svg");
    if (!svg && !ends_with(out, ".png")) {
        fprintf(stderr, "fleet-plot: -o %s: the name must end in .png or .svg\n", out);
        return 2;
    }
    if (strcmp(xfield, "step") && strcmp(xfield, "time")) {
        fprintf(stderr, "fleet-plot: --x '%s': want step or time\n", xfield);
        return 2;
    }
    const metric *panels[MAX_PANELS];
    int npanels;
    if (parse_metrics(mlist, panels, &npanels) < 0)
        return 2;
    int rc = 0;
    for (int i = 0; i < nruns && rc == 0; i++)
        rc = read_run(&runs[i]) < 0 ? 2 : 0;

    char tmp_out[4200], script[4200];
    snprintf(tmp_out, sizeof tmp_out, "%s.tmp.%d%s", out, (int)getpid(), svg ? ".svg" : ".png");
    snprintf(script, sizeof script, "%s.tmp.%d.gp", out, (int)getpid());
    if (rc == 0) {
        int cols = npanels > 1 ? 2 : 1, rows = (npanels + cols - 1) / cols;
        if (!width)
            width = 560 * cols, height = 360 * rows + (title ? 30 : 0);
        FILE *f = fopen(script, "w");
        if (!f) {
            fprintf(stderr, "fleet-plot: cannot write %s: %s\n", script, strerror(errno));
            rc = 2;
        } else {
            int wrc = write_script(f, tmp_out, svg, width, height, title, xfield, panels,
                                   npanels, runs, nruns);
            if (fclose(f) != 0 || wrc < 0) {
                fprintf(stderr, "fleet-plot: cannot write %s\n", script);
                rc = 2;
            }
        }
        if (rc == 0)
            rc = run_gnuplot(script);
        struct stat sb;
        if (rc == 0 && (stat(tmp_out, &sb) != 0 || sb.st_size == 0)) {
            fprintf(stderr, "fleet-plot: gnuplot wrote no %s\n", out);
            rc = 1;
        }
        if (rc == 0 && rename(tmp_out, out) != 0) {
            fprintf(stderr, "fleet-plot: cannot write %s: %s\n", out, strerror(errno));
            rc = 2;
        }
        unlink(script);
        if (rc)
            unlink(tmp_out);
    }
    for (int i = 0; i < nruns; i++)
        free_run(&runs[i]);
    if (rc == 0)
        printf("fleet-plot: %s: %d run(s), %d panel(s) against %s\n", out, nruns, npanels, xfield);
    return rc;
}
