/* server_prune.c - which of a parameter server's checkpoint files go after a save: the steps
 * the workers' checkpoints no longer keep (checkpoint.keep), unfinished writes, and steps above
 * the workers' latest, never the current chain's files. */
#include "server.h"

#include "fleet/checkpoint.h"
#include "fleet/log.h"
#include "fleet/status.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The step and kind of "ps.server<s>.<step>[.delta].safetensors[.tmp-<pid>]" of server s;
 * -1 when name is not one. *tmp: an unfinished write's leftover. */
static int64_t file_step(const char *name, int s, bool *tmp) {
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "ps.server%d.", s);
    if (strncmp(name, prefix, (size_t)n) != 0)
        return -1;
    const char *p = name + n;
    int64_t v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    if (strncmp(p, ".delta", 6) == 0)
        p += 6;
    if (strncmp(p, ".safetensors", 12) != 0)
        return -1;
    p += 12;
    *tmp = strncmp(p, ".tmp-", 5) == 0;
    return *p == '\0' || *tmp ? v : -1;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* After the save of `step`: keeps the shards of the steps the workers' checkpoints keep (the
 * newest cfg.keep at or below the step their `latest` names, which moves only after this save
 * completed on every worker), this step's, and the current chain's files; removes the other
 * steps' files, those above `step` (a run killed before its save completed, then resumed from
 * an earlier one) and unfinished writes. Without the workers' `latest`, the newest keep steps
 * at or below `step`. Failures to remove are logged, not fatal: the save itself is complete.
 * Called again when serving ends, after the workers' last `latest` moved. */
void ps_prune(ps_server *s, int64_t step) {
    if (s->cfg.keep <= 0)
        return;
    const char *root = s->cfg.checkpoint_dir;
    int64_t latest;
    if (fl_ckpt_latest_step(root, &latest) < 0 || latest > step) {
        FL_WARN("ps server %d: not pruning old shards: %s", s->s,
                latest > step ? "the workers' latest is beyond this save" : fl_errmsg());
        return;
    }
    int64_t bound = latest >= 0 ? latest : step;
    DIR *d = opendir(root);
    if (!d)
        return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    bool tmp;
    while ((e = readdir(d)) != NULL) { /* the distinct steps at or below bound */
        int64_t v = file_step(e->d_name, s->s, &tmp);
        if (v < 0 || tmp || v > bound)
            continue;
        bool seen = false;
        for (size_t i = 0; i < n && !seen; i++)
            seen = steps[i] == v;
        if (seen)
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            int64_t *g = realloc(steps, c * sizeof *g);
            if (!g)
                break;
            steps = g;
            cap = c;
        }
        steps[n++] = v;
    }
    qsort(steps, n, sizeof *steps, cmp_desc);
    int64_t oldest_kept = n > (size_t)s->cfg.keep ? steps[s->cfg.keep - 1] : -1;
    rewinddir(d);
    while ((e = readdir(d)) != NULL) {
        int64_t v = file_step(e->d_name, s->s, &tmp);
        if (v < 0 || (!tmp && (v == step || (v <= bound && v >= oldest_kept))))
            continue;
        bool chained = false;
        for (int i = 0; i < s->chain.n && !chained; i++)
            chained = strcmp(s->chain.files[i], e->d_name) == 0;
        if (chained)
            continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (unlink(path) < 0 && errno != ENOENT)
            FL_WARN("ps server %d: cannot remove %s: %s", s->s, path, strerror(errno));
    }
    closedir(d);
    free(steps);
}
