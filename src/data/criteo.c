/* criteo.c - the streaming reader of Criteo's text format over a file list: files or lines
 * sharded over the ranks, one line in memory at a time, batches of the CTR layout, bad lines
 * failing with file:line or skipped and counted. fl_loader's design (random access to
 * fixed-size samples by index) does not fit a text stream of variable-length samples, so the
 * reader has its own prefetch: one thread reading the next batch while the consumer uses the
 * current one (two buffers). */
#include "fleet/ctr.h"

#include "fleet/status.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MSG_MAX 512

enum { BUF_FREE, BUF_FILLING, BUF_READY, BUF_HELD };

typedef struct {
    int64_t lines;   /* data lines the batch covers (bad ones too) */
    int64_t skipped; /* bad lines left out */
} batch_meta;

struct fl_criteo_reader {
    fl_criteo_config cfg;
    char           **paths;  /* (NPATHS) the files this rank reads, in order */
    int              npaths;
    /* the source, touched only by whoever produces (the thread, or next without prefetch) */
    int              file;     /* index into paths of the open file */
    FILE            *fp;
    int64_t          line_no;  /* lines read from the open file */
    int64_t          gline;    /* data lines read over all files (line sharding) */
    int64_t          made;     /* batches made this pass */
    int              ended;    /* the pass has no more batches */
    char            *line;
    size_t           line_cap;
    /* the buffers and their hand-over */
    fl_ctr_batch     buf[2];
    batch_meta       meta[2];
    int              state[2];
    int              res[2];            /* produce's result for a READY buffer */
    char             msg[2][MSG_MAX];   /* its message when negative */
    int              held;              /* buffer the consumer holds, or -1 */
    int64_t          taken;             /* batches handed out this pass */
    int              done_rc;           /* 1 while batches may come; else 0 or the error */
    char             done_msg[MSG_MAX];
    pthread_t        thread;
    int              thread_on, stop;
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    fl_criteo_stats  stats;
};

fl_criteo_config fl_criteo_config_default(void) {
    return (fl_criteo_config){.format = fl_criteo_format_default(), .batch_size = 512,
                              .rank = 0, .world = 1, .shard = FL_CTR_SHARD_FILES,
                              .bad_lines = FL_BAD_LINES_FAIL, .prefetch = true};
}

/* ---- the file list ------------------------------------------------------------------------ */

static int push_path(char ***paths, int *n, int *cap, const char *dir, const char *p) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        char **np = realloc(*paths, (size_t)nc * sizeof *np);
        if (!np)
            return fl_fail(FL_ENOMEM, "criteo reader: out of memory");
        *paths = np;
        *cap = nc;
    }
    size_t dl = (dir && p[0] != '/') ? strlen(dir) : 0, pl = strlen(p);
    char *s = malloc(dl + pl + 2);
    if (!s)
        return fl_fail(FL_ENOMEM, "criteo reader: out of memory");
    if (dl) {
        memcpy(s, dir, dl);
        s[dl] = '/';
        memcpy(s + dl + 1, p, pl + 1);
    } else {
        memcpy(s, p, pl + 1);
    }
    (*paths)[(*n)++] = s;
    return FL_OK;
}

/* 0 if path names a regular file that can be opened for reading; else a message. */
static int check_file(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0)
        return fl_fail(FL_EIO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return fl_fail(FL_EIO, "%s: is a directory", path);
    FILE *f = fopen(path, "r");
    if (!f)
        return fl_fail(FL_EIO, "%s: %s", path, strerror(errno));
    fclose(f);
    return FL_OK;
}

/* All data files, in order: from the list file (relative to its directory) or cfg->files. */
static int read_list(const fl_criteo_config *cfg, char ***paths, int *n) {
    int cap = 0, rc = FL_OK;
    *paths = NULL;
    *n = 0;
    if (!cfg->file_list) {
        for (int i = 0; i < cfg->nfiles && rc >= 0; i++) {
            if ((rc = check_file(cfg->files[i])) < 0)
                rc = fl_fail_prefix(rc, "criteo reader: files[%d]", i);
            else
                rc = push_path(paths, n, &cap, NULL, cfg->files[i]);
        }
        if (rc >= 0 && *n == 0)
            rc = fl_fail(FL_EINVAL, "criteo reader: no data files (file_list unset, nfiles 0)");
        return rc;
    }
    const char *list = cfg->file_list;
    FILE *f = fopen(list, "r");
    if (!f)
        return fl_fail(FL_EIO, "%s: cannot open the file list: %s", list, strerror(errno));
    char *dir = NULL, *buf = NULL;
    const char *slash = strrchr(list, '/');
    if (slash && (dir = strndup(list, (size_t)(slash - list + (slash == list)))) == NULL)
        rc = fl_fail(FL_ENOMEM, "criteo reader: out of memory");
    size_t bcap = 0;
    ssize_t len;
    int line = 0;
    while (rc >= 0 && (len = getline(&buf, &bcap, f)) >= 0) {
        line++;
        if ((size_t)len != strlen(buf)) {
            rc = fl_fail(FL_EFORMAT, "%s:%d: the line holds a NUL byte", list, line);
            break;
        }
        char *s = buf, *e = buf + len;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
            e--;
        *e = '\0';
        if (s == e || *s == '#')
            continue;
        if ((rc = push_path(paths, n, &cap, dir, s)) < 0)
            break;
        if ((rc = check_file((*paths)[*n - 1])) < 0)
            rc = fl_fail_prefix(rc, "%s:%d", list, line);
    }
    if (rc >= 0 && ferror(f))
        rc = fl_fail(FL_EIO, "%s: read error", list);
    if (rc >= 0 && *n == 0)
        rc = fl_fail(FL_EFORMAT, "%s: the file list names no data files", list);
    free(buf);
    free(dir);
    fclose(f);
    return rc;
}

/* Paddle's fleet.util.get_file_shard: world contiguous blocks, the first (n % world) one
 * file longer. Keeps rank's block of paths (frees the rest). */
static void shard_files(char **paths, int *n, int rank, int world) {
    int block = *n / world, rem = *n % world;
    int begin = rank * block + (rank < rem ? rank : rem), count = block + (rank < rem);
    for (int i = 0; i < *n; i++)
        if (i < begin || i >= begin + count)
            free(paths[i]);
    memmove(paths, paths + begin, (size_t)count * sizeof *paths);
    *n = count;
}

/* ---- producing batches -------------------------------------------------------------------- */

/* Reads the next line of the pass into r->line (without its newline): 1 with *len, 0 at the
 * end of the last file, or a negative status. */
static int next_line(fl_criteo_reader *r, size_t *len) {
    for (;;) {
        if (!r->fp) {
            if (r->file >= r->npaths)
                return 0;
            r->fp = fopen(r->paths[r->file], "r");
            if (!r->fp)
                return fl_fail(FL_EIO, "%s: %s", r->paths[r->file], strerror(errno));
            r->line_no = 0;
        }
        ssize_t n = getline(&r->line, &r->line_cap, r->fp);
        if (n >= 0) {
            r->line_no++;
            if (n > 0 && r->line[n - 1] == '\n')
                n--;
            *len = (size_t)n;
            return 1;
        }
        if (ferror(r->fp))
            return fl_fail(FL_EIO, "%s: read error after line %lld", r->paths[r->file],
                           (long long)r->line_no);
        fclose(r->fp);
        r->fp = NULL;
        r->file++;
    }
}

/* Parses the current line into b: FL_OK, FL_OK with ++*skipped, or an error with file:line. */
static int take_line(fl_criteo_reader *r, size_t len, fl_ctr_batch *b, int64_t *skipped) {
    int rc = fl_criteo_parse_line(&r->cfg.format, r->line, len, b);
    if (rc == FL_EFORMAT && r->cfg.bad_lines == FL_BAD_LINES_SKIP) {
        fl_clear_error();
        ++*skipped;
        return FL_OK;
    }
    if (rc < 0)
        return fl_fail_prefix(rc, "%s:%lld", r->paths[r->file], (long long)r->line_no);
    return FL_OK;
}

/* Makes the next batch of this rank into b: 1, 0 at the end of the pass, or an error. */
static int produce(fl_criteo_reader *r, fl_ctr_batch *b, batch_meta *m) {
    fl_ctr_batch_clear(b);
    m->lines = m->skipped = 0;
    int64_t B = r->cfg.batch_size, W = r->cfg.world;
    size_t len = 0;
    int rc;
    while (!r->ended && m->lines < B) {
        if ((rc = next_line(r, &len)) < 0)
            return rc;
        if (rc == 0) {
            r->ended = 1;
            break;
        }
        if (r->cfg.shard == FL_CTR_SHARD_LINES) {
            int64_t i = r->gline++;
            if ((i / B) % W != r->cfg.rank)
                continue;
        }
        m->lines++;
        FL_TRY(take_line(r, len, b, &m->skipped));
    }
    if (m->lines > 0) {
        r->made++;
        return 1;
    }
    /* line sharding: every rank makes ceil(lines / (world * B)) batches, the last one empty
     * for a rank whose slice of the final global batch is past the end */
    if (r->cfg.shard == FL_CTR_SHARD_LINES && r->made < (r->gline + W * B - 1) / (W * B)) {
        r->made++;
        return 1;
    }
    return 0;
}

static void *producer_main(void *arg) {
    fl_criteo_reader *r = arg;
    for (int64_t k = 0;; k++) {
        int i = (int)(k % 2);
        pthread_mutex_lock(&r->mu);
        while (r->state[i] != BUF_FREE && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) {
            pthread_mutex_unlock(&r->mu);
            return NULL;
        }
        r->state[i] = BUF_FILLING;
        pthread_mutex_unlock(&r->mu);
        int rc = produce(r, &r->buf[i], &r->meta[i]);
        pthread_mutex_lock(&r->mu);
        r->res[i] = rc;
        if (rc < 0)
            snprintf(r->msg[i], MSG_MAX, "%s", fl_errmsg());
        r->state[i] = BUF_READY;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (rc <= 0)
            return NULL;
    }
}

static void stop_thread(fl_criteo_reader *r) {
    if (!r->thread_on)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    r->thread_on = 0;
}

/* Back to the first line with empty buffers; starts the thread with prefetch. */
static int start_pass(fl_criteo_reader *r) {
    if (r->fp)
        fclose(r->fp);
    r->fp = NULL;
    r->file = 0;
    r->line_no = r->gline = r->made = 0;
    r->ended = 0;
    r->state[0] = r->state[1] = BUF_FREE;
    r->held = -1;
    r->taken = 0;
    r->done_rc = 1;
    r->stop = 0;
    if (r->cfg.prefetch) {
        int e = pthread_create(&r->thread, NULL, producer_main, r);
        if (e != 0)
            return fl_fail(FL_EIO, "criteo reader: cannot start the prefetch thread: %s",
                           strerror(e));
        r->thread_on = 1;
    }
    return FL_OK;
}

/* ---- the public functions ----------------------------------------------------------------- */

fl_criteo_reader *fl_criteo_open(const fl_criteo_config *cfg) {
    if (fl_criteo_format_check(&cfg->format) < 0)
        return NULL;
    if (cfg->batch_size < 1 || cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world) {
        fl_fail(FL_EINVAL, "criteo reader: batch_size %lld, rank %d, world %d (want batch_size "
                ">= 1, 0 <= rank < world)", (long long)cfg->batch_size, cfg->rank, cfg->world);
        return NULL;
    }
    if ((unsigned)cfg->shard > FL_CTR_SHARD_LINES || (unsigned)cfg->bad_lines > FL_BAD_LINES_SKIP) {
        fl_fail(FL_EINVAL, "criteo reader: unknown shard mode %d or bad-lines policy %d",
                (int)cfg->shard, (int)cfg->bad_lines);
        return NULL;
    }
    fl_criteo_reader *r = calloc(1, sizeof *r);
    if (!r) {
        fl_fail(FL_ENOMEM, "criteo reader: out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    r->cfg.file_list = NULL;
    r->cfg.files = NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (read_list(cfg, &r->paths, &r->npaths) < 0)
        goto fail;
    if (cfg->shard == FL_CTR_SHARD_FILES)
        shard_files(r->paths, &r->npaths, cfg->rank, cfg->world);
    r->stats.files = r->npaths;
    int64_t ids = cfg->batch_size * (cfg->format.nslots ? cfg->format.nslots : 1);
    for (int i = 0; i < 2; i++)
        if (fl_ctr_batch_init(&r->buf[i], cfg->format.ndense, cfg->format.nslots,
                              cfg->batch_size, ids) < 0)
            goto fail;
    if (start_pass(r) < 0)
        goto fail;
    return r;
fail:
    fl_criteo_close(r);
    return NULL;
}

void fl_criteo_close(fl_criteo_reader *r) {
    if (!r)
        return;
    stop_thread(r);
    if (r->fp)
        fclose(r->fp);
    for (int i = 0; i < r->npaths; i++)
        free(r->paths[i]);
    free(r->paths);
    free(r->line);
    fl_ctr_batch_free(&r->buf[0]);
    fl_ctr_batch_free(&r->buf[1]);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int fl_criteo_next(fl_criteo_reader *r, const fl_ctr_batch **batch) {
    *batch = NULL;
    if (r->done_rc < 0)
        return fl_fail(r->done_rc, "%s", r->done_msg);
    if (r->done_rc == 0)
        return 0;
    int i, rc;
    if (!r->cfg.prefetch) {
        i = 0;
        rc = produce(r, &r->buf[0], &r->meta[0]);
        if (rc < 0)
            snprintf(r->msg[0], MSG_MAX, "%s", fl_errmsg());
    } else {
        pthread_mutex_lock(&r->mu);
        if (r->held >= 0) {
            r->state[r->held] = BUF_FREE;
            r->held = -1;
            pthread_cond_broadcast(&r->cv);
        }
        i = (int)(r->taken % 2);
        while (r->state[i] != BUF_READY)
            pthread_cond_wait(&r->cv, &r->mu);
        rc = r->res[i];
        r->state[i] = rc == 1 ? BUF_HELD : BUF_FREE;
        if (rc == 1) {
            r->held = i;
            r->taken++;
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (rc == 1) {
        r->stats.lines += r->meta[i].lines;
        r->stats.skipped += r->meta[i].skipped;
        r->stats.samples += r->buf[i].batch;
        *batch = &r->buf[i];
        return 1;
    }
    r->done_rc = rc;
    if (rc < 0) {
        snprintf(r->done_msg, MSG_MAX, "%s", r->msg[i]);
        return fl_fail(rc, "%s", r->done_msg);
    }
    return 0;
}

int fl_criteo_rewind(fl_criteo_reader *r) {
    stop_thread(r);
    return start_pass(r);
}

void fl_criteo_get_stats(const fl_criteo_reader *r, fl_criteo_stats *st) {
    *st = r->stats;
}
