/* checkpoint.c - named tensors to and from safetensors files (strict for resume, partial for
 * pretrained weights, all matching decided before any copy), and the step directories with
 * their atomically replaced `latest` pointer and pruning. */
#include "fleet/checkpoint.h"

#include "fleet/status.h"
#include "io/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STEP_FMT "step_%08lld"

int fl_ckpt_save(const char *path, fl_param *const *params, int n, const fl_st_meta *meta,
                 int nmeta) {
    fl_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    if (!e)
        return fl_fail(FL_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) {
        const fl_tensor *v = &params[i]->value;
        e[i] = (fl_st_entry){.name = params[i]->name, .dtype = v->dtype, .ndim = v->ndim,
                             .shape = v->shape, .data = v->data};
    }
    int rc = fl_safetensors_write(path, e, n, meta, nmeta);
    free(e);
    return rc;
}

/* appends name to a comma-separated list, ending it with "..." when it would not fit */
static void list_add(char *list, size_t cap, const char *name) {
    size_t len = strlen(list);
    if (len >= 3 && strcmp(list + len - 3, "...") == 0)
        return;
    size_t need = strlen(name) + (len ? 2 : 0);
    if (len + need + 4 > cap) {
        snprintf(list + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(list + len, cap - len, "%s%s", len ? ", " : "", name);
}

static bool ignored(const char *name, const char *const *prefixes, int n) {
    for (int i = 0; i < n; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

static bool same_layout(const fl_st_tensor *t, const fl_tensor *v) {
    if (t->dtype != v->dtype || t->ndim != v->ndim)
        return false;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != v->shape[d])
            return false;
    return true;
}

int fl_ckpt_load(const fl_safetensors *st, fl_param *const *params, int n, fl_ckpt_mode mode,
                 const char *const *ignore_prefixes, int nignore, fl_ckpt_report *report) {
    const char *path = fl_safetensors_path(st);
    fl_ckpt_report rep;
    memset(&rep, 0, sizeof rep);
    const fl_st_tensor **src = calloc((size_t)n + 1, sizeof *src);
    if (!src)
        return fl_fail(FL_ENOMEM, "%s: out of memory", path);
    int rc = FL_OK;
    /* 1. decide every match */
    for (int i = 0; i < n; i++) {
        const fl_tensor *v = &params[i]->value;
        const fl_st_tensor *t = fl_safetensors_find(st, params[i]->name);
        if (!t) {
            rep.missing++;
            list_add(rep.missing_names, sizeof rep.missing_names, params[i]->name);
            if (mode == FL_CKPT_STRICT && rc == 0)
                rc = fl_fail(FL_EFORMAT, "%s: tensor '%s' is missing", path, params[i]->name);
            continue;
        }
        if (!same_layout(t, v)) {
            char a[96], b[96], item[400];
            fl_shape_str(t->ndim, t->shape, a, sizeof a);
            fl_shape_str(v->ndim, v->shape, b, sizeof b);
            snprintf(item, sizeof item, "%s (file %s %s, model %s %s)", params[i]->name, a,
                     fl_safetensors_dtype_name(t->dtype), b, fl_safetensors_dtype_name(v->dtype));
            rep.mismatched++;
            list_add(rep.mismatched_names, sizeof rep.mismatched_names, item);
            if (mode == FL_CKPT_STRICT && rc == 0)
                rc = fl_fail(FL_ESHAPE, "%s: tensor '%s' is %s %s in the file but %s %s here",
                             path, params[i]->name, fl_safetensors_dtype_name(t->dtype), a,
                             fl_safetensors_dtype_name(v->dtype), b);
            continue;
        }
        src[i] = t;
    }
    int nfile = fl_safetensors_count(st);
    for (int j = 0; j < nfile; j++) {
        const fl_st_tensor *t = fl_safetensors_tensor(st, j);
        if (ignored(t->name, ignore_prefixes, nignore))
            continue;
        bool wanted = false;
        for (int i = 0; i < n && !wanted; i++)
            wanted = strcmp(params[i]->name, t->name) == 0;
        if (wanted)
            continue;
        rep.unexpected++;
        list_add(rep.unexpected_names, sizeof rep.unexpected_names, t->name);
        if (mode == FL_CKPT_STRICT && rc == 0)
            rc = fl_fail(FL_EFORMAT, "%s: unexpected tensor '%s' (written with another model, "
                         "optimizer or strategy?)", path, t->name);
    }
    for (int i = 0; i < n; i++)
        rep.loaded += src[i] != NULL;
    if (rc == 0 && mode == FL_CKPT_PARTIAL && rep.loaded == 0 && n > 0)
        rc = fl_fail(FL_EFORMAT, "%s: no tensor matches by name, dtype and shape (%d missing, %d "
                     "mismatched): not weights of this model?", path, rep.missing,
                     rep.mismatched);
    /* 2. copy, only when everything was accepted */
    if (rc == 0)
        for (int i = 0; i < n; i++)
            if (src[i])
                memcpy(params[i]->value.data, src[i]->data, src[i]->nbytes);
    if (rc < 0)
        rep.loaded = 0;
    free(src);
    if (report)
        *report = rep;
    return rc;
}

int fl_ckpt_step_dir(char *buf, size_t cap, const char *root, int64_t step) {
    int w = snprintf(buf, cap, "%s/" STEP_FMT, root, (long long)step);
    if (w < 0 || (size_t)w >= cap)
        return fl_fail(FL_EINVAL, "checkpoint path too long: '%s'", root);
    return FL_OK;
}

int fl_ckpt_mkdirs(const char *path) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return fl_fail(FL_EINVAL, "path too long: '%s'", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return fl_fail(FL_EIO, "cannot create directory '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return fl_fail(FL_EIO, "cannot create directory '%s': %s", buf, strerror(errno));
    return FL_OK;
}

int fl_ckpt_set_latest(const char *root, int64_t step) {
    char path[1100], line[64];
    snprintf(path, sizeof path, "%s/latest", root);
    int n = snprintf(line, sizeof line, STEP_FMT "\n", (long long)step);
    return fl_atomic_write_file(path, line, (size_t)n);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* the step of a directory name "step_NNNNNNNN", or -1 */
static int64_t step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || strlen(name) < 13)
        return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* the step `latest` of root names, or -1 with a message */
static int64_t read_latest(const char *root) {
    char path[1100], line[128] = {0};
    snprintf(path, sizeof path, "%s/latest", root);
    FILE *f = fopen(path, "r");
    if (!f) {
        fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (!fgets(line, sizeof line, f))
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    int64_t s = step_of(line);
    if (s < 0)
        fl_fail(FL_EFORMAT, "%s: '%s' is not a step directory name (step_NNNNNNNN)", path, line);
    return s;
}

int fl_ckpt_latest_step(const char *root, int64_t *step) {
    char path[1100];
    snprintf(path, sizeof path, "%s/latest", root);
    *step = -1;
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return FL_OK;
    FILE *f = fopen(path, "r"); /* read_latest's failure to open, with its own code */
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open: %s", path, strerror(errno));
    fclose(f);
    *step = read_latest(root);
    return *step < 0 ? FL_EFORMAT : FL_OK;
}

int64_t fl_ckpt_dir_step(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') /* "ckpt/step_00000040/" */
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    char name[64];
    if (n - b >= sizeof name)
        return -1;
    memcpy(name, dir + b, n - b);
    name[n - b] = '\0';
    return step_of(name);
}

int fl_ckpt_resolve(const char *path, char *dir, size_t cap) {
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/model.safetensors", path);
    bool step_dir = is_file(probe);
    snprintf(probe, sizeof probe, "%s/rank_0.safetensors", path);
    step_dir = step_dir || is_file(probe);
    if (step_dir) {
        if (snprintf(dir, cap, "%s", path) >= (int)cap)
            return fl_fail(FL_EINVAL, "path too long: '%s'", path);
        return FL_OK;
    }
    snprintf(probe, sizeof probe, "%s/latest", path);
    if (!is_file(probe))
        return fl_fail(FL_EIO, "%s: not a checkpoint: no model.safetensors, rank_0.safetensors "
                       "or latest in it", path);
    int64_t s = read_latest(path);
    if (s < 0)
        return FL_EFORMAT;
    return fl_ckpt_step_dir(dir, cap, path, s);
}

int fl_ckpt_rank_file(const char *dir, int rank, char *path, size_t cap, int *nfiles) {
    *nfiles = 0;
    if (snprintf(path, cap, "%s/model.safetensors", dir) >= (int)cap)
        return fl_fail(FL_EINVAL, "path too long: '%s'", dir);
    if (is_file(path))
        return FL_OK;
    char probe[1100];
    for (int r = 0;; r++) {
        snprintf(probe, sizeof probe, "%s/rank_%d.safetensors", dir, r);
        if (!is_file(probe))
            break;
        ++*nfiles;
    }
    if (*nfiles == 0)
        return fl_fail(FL_EIO, "%s: holds neither model.safetensors nor rank_0.safetensors", dir);
    snprintf(path, cap, "%s/rank_%d.safetensors", dir, rank);
    return FL_OK;
}

void fl_ckpt_remove_rank_files(const char *dir, int from) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int r, end = 0;
        if (sscanf(e->d_name, "rank_%d.safetensors%n", &r, &end) == 1 && e->d_name[end] == 0 &&
            r >= from) {
            char path[1400];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
}

/* removes a step directory and the files in it (no subdirectories are made there) */
static int remove_step_dir(const char *root, const char *name) {
    char dir[1100], file[1400];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    DIR *d = opendir(dir);
    if (!d)
        return fl_fail(FL_EIO, "cannot open '%s': %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        unlink(file);
    }
    closedir(d);
    if (rmdir(dir) < 0 && errno != ENOENT)
        return fl_fail(FL_EIO, "cannot remove '%s': %s", dir, strerror(errno));
    return FL_OK;
}

static int cmp_i64_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int fl_ckpt_prune(const char *root, int64_t keep) {
    int64_t latest = read_latest(root);
    if (latest < 0)
        return FL_EFORMAT;
    DIR *d = opendir(root);
    if (!d)
        return fl_fail(FL_EIO, "cannot open '%s': %s", root, strerror(errno));
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    int rc = FL_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s = step_of(e->d_name);
        if (s < 0)
            continue;
        if (s > latest) { /* a save that never completed, from an abandoned run */
            rc = remove_step_dir(root, e->d_name);
            if (rc < 0)
                break;
            continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *p = realloc(steps, cap * sizeof *p);
            if (!p) {
                rc = fl_fail(FL_ENOMEM, "out of memory pruning '%s'", root);
                break;
            }
            steps = p;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (rc == 0 && keep > 0 && n > (size_t)keep) {
        qsort(steps, n, sizeof *steps, cmp_i64_desc);
        for (size_t i = (size_t)keep; i < n && rc == 0; i++) {
            char name[64];
            snprintf(name, sizeof name, STEP_FMT, (long long)steps[i]);
            rc = remove_step_dir(root, name);
        }
    }
    free(steps);
    return rc;
}
