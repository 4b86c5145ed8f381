/* train_checkpoint.c - the trainer's checkpoints: what a checkpoint holds (every network tensor,
 * the optimizer's and the distributed optimizer's state tensors, whatever the strategy, and the
 * loop's position), periodic and final saves, exact resume, pretrained weights taken by name,
 * and the inference model. The layout on disk is checkpoint.h's; docs/checkpoint.md has it all.
 *
 * Which ranks write is decided from the state itself, so that no strategy needs a special
 * case: every rank checksums its state and one allreduce tells whether they all agree. If they
 * do, rank 0's model.safetensors stands for all; if not (DGC's residuals, Local SGD between
 * synchronisations), or when checkpoint.per_rank is set, every rank writes rank_<r>.safetensors.
 * Tensors in a device's memory are read and written through host copies (fl_train_stage).
 * A little over 600 lines: save and resume must list the same tensors in the same order, so
 * both stay beside the one list that names them. */
#include "train/train_impl.h"

#include "fleet/checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FL_VERSION
#define FL_VERSION "unknown"
#endif

/* train.state, an I64 tensor: the loop's position and what the data order depends on */
enum {
    ST_VERSION = 0, /* layout version of this tensor */
    ST_STEP,        /* optimizer updates done (the schedule's position) */
    ST_EPOCH,       /* epoch in progress */
    ST_BATCH,       /* loader batches of that epoch consumed (the data position) */
    ST_WORLD,       /* workers */
    ST_TRAIN_SEED,  /* initialisation and shuffling: the loader's order is (seed, epoch) */
    ST_DATA_SEED,   /* the synthetic data's own seed */
    ST_TOTAL_STEPS, /* the schedule's length (cosine and polynomial decay depend on it) */
    ST_BASE_WORLD,  /* workers the run began with: the learning rate's reference (layout 2) */
    ST_N
};
#define STATE_VERSION 2
#define STATE_N_V1    8 /* layout 1 had no ST_BASE_WORLD: read as base = world */
#define STATE_NAME "train.state"

/* Everything a checkpoint holds, borrowed from the trainer, in file order: network tensors
 * first, then training state (optimizer, distributed optimizer, train.state). */
typedef struct {
    fl_param **p;      /* host memory: a device's tensors replaced by their copies in stage */
    int        n, nnet;
    fl_param   progress;
    int64_t    progress_v[ST_N];
    fl_train_stage stage;
} state_list;

static void release(state_list *s) {
    fl_train_stage_free(&s->stage);
    free(s->p);
    s->p = NULL;
}

int fl_train_ckpt_tensors(trainer *t, int extra, fl_param ***p, int *n, int *nnet) {
    int np = fl_net_num_params(t->net), nopt = fl_optim_num_state(t->opt);
    int ndist = fl_dist_num_state(t->dopt);
    fl_param **q = calloc((size_t)(np + nopt + ndist + extra), sizeof *q);
    if (!q)
        return fl_fail(FL_ENOMEM, "checkpoint: out of memory");
    int k = 0;
    for (int i = 0; i < np; i++)
        q[k++] = fl_net_param(t->net, i);
    for (int i = 0; i < nopt; i++)
        q[k++] = fl_optim_state(t->opt, i);
    for (int i = 0; i < ndist; i++)
        q[k++] = fl_dist_state(t->dopt, i);
    *p = q;
    *n = k;
    *nnet = np;
    return FL_OK;
}

static int collect(trainer *t, state_list *s) {
    FL_TRY(fl_train_ckpt_tensors(t, 1, &s->p, &s->n, &s->nnet));
    memset(&s->progress, 0, sizeof s->progress);
    snprintf(s->progress.name, sizeof s->progress.name, STATE_NAME);
    int64_t shape[1] = {ST_N};
    fl_tensor_view(&s->progress.value, FL_DTYPE_I64, 1, shape, s->progress_v);
    s->p[s->n++] = &s->progress;
    int rc = fl_train_stage_create(&s->stage, s->p, s->n);
    if (rc < 0)
        release(s);
    return rc;
}

/* The effective configuration as YAML (fl_config_print); malloc'd, NULL when out of memory. */
static char *config_yaml(const fl_train_config *cfg) {
    int n;
    const fl_cfg_key *keys = fl_train_schema(&n);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fl_config_print(keys, n, cfg, f);
    fclose(f);
    return buf;
}

/* Comma-separated names of the training-state tensors (what fleet-eval and pretrained loading
 * skip in a checkpoint). malloc'd. */
static char *state_names(const state_list *s) {
    size_t cap = 1;
    for (int i = s->nnet; i < s->n; i++)
        cap += strlen(s->p[i]->name) + 1;
    char *out = calloc(cap, 1);
    if (!out)
        return NULL;
    for (int i = s->nnet; i < s->n; i++) {
        strcat(out, s->p[i]->name);
        if (i + 1 < s->n)
            strcat(out, ",");
    }
    return out;
}

bool fl_train_ckpt_due(const fl_train_config *cfg, int64_t step) {
    return cfg->checkpoint.dir[0] && cfg->checkpoint.save_interval > 0 &&
           step % cfg->checkpoint.save_interval == 0;
}

/* Allreduce (MAX) of doubles over the job; a job of one is a no-op. */
static int max_over_ranks(trainer *t, double *v, int n) {
    if (t->world == 1)
        return FL_OK;
    return fl_comm_allreduce(fl_fleet_comm(t->fleet), v, (size_t)n, FL_DTYPE_F64, FL_REDOP_MAX);
}

/* Whether every rank's state is bit-identical to the others' (one allreduce of a checksum). */
static int state_uniform(trainer *t, const state_list *s, bool *uniform) {
    uint32_t crc = 0;
    for (int i = 0; i < s->n; i++)
        crc = fl_crc32(crc, s->p[i]->value.data, fl_tensor_nbytes(&s->p[i]->value));
    double v[2] = {(double)crc, 4294967295.0 - (double)crc}; /* max and -min */
    FL_TRY(max_over_ranks(t, v, 2));
    *uniform = v[0] + v[1] == 4294967295.0;
    return FL_OK;
}

static int write_file(trainer *t, const fl_train_config *cfg, const state_list *s,
                      const char *path, bool per_rank) {
    char *yaml = config_yaml(cfg), *names = state_names(s);
    char world[16], rank[16], step[24], epoch[24];
    snprintf(world, sizeof world, "%d", t->world);
    snprintf(rank, sizeof rank, "%d", t->rank);
    snprintf(step, sizeof step, "%" PRId64, s->progress_v[ST_STEP]);
    snprintf(epoch, sizeof epoch, "%" PRId64, s->progress_v[ST_EPOCH]);
    int rc;
    if (!yaml || !names) {
        rc = fl_fail(FL_ENOMEM, "checkpoint: out of memory");
    } else {
        fl_st_meta meta[] = {
            {"fleet.format", "checkpoint"}, {"fleet.version", FL_VERSION},
            {"fleet.world_size", world},    {"fleet.rank", per_rank ? rank : "all"},
            {"fleet.step", step},           {"fleet.epoch", epoch},
            {"fleet.training_state", names}, {"fleet.config", yaml},
        };
        rc = fl_ckpt_save(path, s->p, s->n, meta, (int)(sizeof meta / sizeof meta[0]));
    }
    free(yaml);
    free(names);
    return rc;
}

int fl_train_ckpt_save(trainer *t, const fl_train_config *cfg, const train_pos *pos) {
    const char *root = cfg->checkpoint.dir;
    state_list s = {0};
    FL_TRY(collect(t, &s));
    fl_train_stage_pull(&s.stage, fl_net_backend(t->net));
    int64_t *v = s.progress_v;
    v[ST_VERSION] = STATE_VERSION;
    v[ST_STEP] = pos->step;
    v[ST_EPOCH] = pos->epoch;
    v[ST_BATCH] = pos->batch;
    v[ST_WORLD] = t->world;
    v[ST_TRAIN_SEED] = cfg->train.seed;
    v[ST_DATA_SEED] = cfg->data.seed;
    v[ST_TOTAL_STEPS] = t->total_steps;
    v[ST_BASE_WORLD] = t->base_world;

    static bool warned;
    bool uniform = true;
    char dir[1024], path[1100];
    int rc = state_uniform(t, &s, &uniform);
    bool per_rank = cfg->checkpoint.per_rank || !uniform;
    if (rc >= 0 && per_rank && !cfg->checkpoint.per_rank && t->rank == 0 && !warned) {
        warned = true;
        FL_WARN("checkpoint: the state differs between ranks (as with DGC, Local SGD between "
                "synchronisations, or batch-norm statistics between evaluations): every rank "
                "saves its own file (checkpoint.per_rank: true says so up front)");
    }
    /* 0. parameter-server mode: the servers' shards of the step first (worker 0 asks) */
    if (rc >= 0 && t->ps && t->rank == 0)
        rc = fl_ps_save(t->ps, pos->step, FL_PS_SAVE_ALL);
    /* 1. every file of the step, each atomically; the other layout's leftovers removed */
    if (rc >= 0)
        rc = fl_ckpt_step_dir(dir, sizeof dir, root, pos->step);
    if (rc >= 0)
        rc = fl_ckpt_mkdirs(dir);
    if (rc >= 0 && t->rank == 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (per_rank)
            unlink(path);
        /* rank files of this layout's other writers stay; the rest (all of them, or those of
         * a larger world that began this step before a restart with fewer workers) go */
        fl_ckpt_remove_rank_files(dir, per_rank ? t->world : 0);
    }
    if (rc >= 0 && (per_rank || t->rank == 0)) {
        if (per_rank)
            snprintf(path, sizeof path, "%s/rank_%d.safetensors", dir, t->rank);
        else
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = write_file(t, cfg, &s, path, per_rank);
    }
    release(&s);
    /* 2. all written (or one failed: then every rank fails) before `latest` moves */
    double failed = rc < 0 ? 1.0 : 0.0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? fl_errmsg() : "");
    int arc = max_over_ranks(t, &failed, 1);
    if (rc < 0)
        return fl_fail(rc, "checkpoint step %" PRId64 ": %s", pos->step, msg);
    FL_TRY(arc);
    if (failed > 0)
        return fl_fail(FL_EIO, "checkpoint step %" PRId64 ": another rank failed to save it",
                       pos->step);
    /* 3. rank 0 points `latest` at it and prunes; the others hear whether that worked */
    if (t->rank == 0) {
        rc = fl_ckpt_set_latest(root, pos->step);
        if (rc >= 0)
            rc = fl_ckpt_prune(root, cfg->checkpoint.keep);
        if (rc >= 0)
            FL_INFO("checkpoint: step %" PRId64 " saved in %s (%s)", pos->step, dir,
                    per_rank ? "one file per rank" : "model.safetensors");
    }
    failed = rc < 0 ? 1.0 : 0.0;
    snprintf(msg, sizeof msg, "%s", rc < 0 ? fl_errmsg() : "");
    arc = max_over_ranks(t, &failed, 1);
    if (rc < 0)
        return fl_fail(rc, "checkpoint step %" PRId64 ": %s", pos->step, msg);
    FL_TRY(arc);
    if (failed > 0)
        return fl_fail(FL_EIO, "checkpoint step %" PRId64 ": rank 0 failed to publish it",
                       pos->step);
    return FL_OK;
}

/* Keys whose values do not change the computation: a resume may change them silently. The
 * schedule's length (train.epochs, train.max_steps) is checked through train.state instead. */
static bool harmless_key(const char *line) {
    static const char *const prefixes[] = {"checkpoint.", "train.log_dir:", "train.log_interval:",
                                           "train.epochs:", "train.max_steps:", "comm.backend:",
                                           "comm.encrypt:"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncmp(line, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

/* Warns, naming each key, where the checkpoint's configuration differs from this run's. */
static void compare_configs(const char *saved, const char *now, const char *file) {
    char keys[512] = "";
    int ndiff = 0;
    for (const char *a = now; *a;) {
        const char *eol = strchr(a, '\n');
        size_t len = eol ? (size_t)(eol - a) : strlen(a);
        const char *colon = memchr(a, ':', len);
        if (colon && !harmless_key(a)) {
            /* the same "key: value" line must be in the saved text, at a line start */
            bool found = false;
            for (const char *b = saved; b && *b && !found;) {
                const char *beol = strchr(b, '\n');
                size_t blen = beol ? (size_t)(beol - b) : strlen(b);
                found = blen == len && memcmp(a, b, len) == 0;
                b = beol ? beol + 1 : NULL;
            }
            if (!found) {
                size_t klen = (size_t)(colon - a), kl = strlen(keys);
                if (kl + klen + 3 < sizeof keys)
                    snprintf(keys + kl, sizeof keys - kl, "%s%.*s", kl ? ", " : "", (int)klen, a);
                ndiff++;
            }
        }
        a = eol ? eol + 1 : a + len;
    }
    if (ndiff)
        FL_WARN("resume: %d key(s) differ from %s's configuration: %s; the run goes on, but "
                "will not be bit-identical to an uninterrupted one", ndiff, file, keys);
}

/* Whether step directory dir lies in checkpoint directory root (the same directory by inode). */
static bool same_parent(const char *dir, const char *root) {
    char parent[1100];
    snprintf(parent, sizeof parent, "%s/..", dir);
    struct stat a, b;
    return root[0] && stat(parent, &a) == 0 && stat(root, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* How each tensor of s combines over the old workers' files when the world changed. */
static fl_state_merge *merge_kinds(trainer *t, const state_list *s) {
    fl_state_merge *kind = calloc((size_t)s->n, sizeof *kind);
    if (!kind)
        return NULL;
    int nopt = fl_optim_num_state(t->opt), ndist = fl_dist_num_state(t->dopt);
    for (int i = 0; i < s->n; i++) {
        fl_dtype dt = s->p[i]->value.dtype;
        bool fp = dt == FL_DTYPE_F32 || dt == FL_DTYPE_F64;
        int di = i - s->nnet - nopt; /* index among the distributed optimizer's tensors */
        kind[i] = di >= 0 && di < ndist ? fl_dist_state_merge(t->dopt, di)
                  : fp && i < s->n - 1  ? FL_STATE_MEAN
                                        : FL_STATE_SAME; /* train.state, integer tensors */
    }
    return kind;
}

/* The schedule's length of a run with another world than it began with: the updates done
 * plus those the rest of the data takes in this world's batches (the same at every later
 * position of this world, so a resume in it keeps the schedule exactly). */
static void rescaled_length(trainer *t, const fl_train_config *cfg, const train_pos *pos) {
    int64_t spe = fl_prefetch_steps_per_epoch(t->loader);
    int64_t total = pos->step + (spe - pos->batch) / t->merge_k +
                    (cfg->train.epochs - pos->epoch - 1) * spe / t->merge_k;
    if (cfg->train.max_steps > 0 && cfg->train.max_steps < total)
        total = cfg->train.max_steps;
    fl_train_set_length(t, cfg, total);
}

/* After a world change (w0 workers wrote the checkpoint): the data position, the learning
 * rate's scale and the schedule's length in this job's terms (docs/elastic.md). */
static void rescale(trainer *t, const fl_train_config *cfg, int w0, train_pos *pos,
                    int nfiles) {
    int64_t b0 = pos->batch;
    pos->batch = fl_train_rescale_batch(t, b0, w0);
    rescaled_length(t, cfg, pos);
    int64_t spe = fl_prefetch_steps_per_epoch(t->loader), total = t->total_steps;
    if (t->rank == 0)
        FL_INFO("resume: the checkpoint was written by %d worker(s), this job has %d: batch "
                "size per worker kept, learning rate x %.4g (%d / %d, the workers the run "
                "began with), %s; data from batch %" PRId64 " of %" PRId64 " in epoch "
                "%" PRId64 " (was %" PRId64 " of the old world's), the run now %" PRId64
                " updates long", w0, t->world, t->lr_scale, t->world, t->base_world,
                nfiles > 1 ? "state of the old workers combined (parameters averaged, "
                             "DGC residuals summed)"
                           : "state shared by all workers taken as is",
                pos->batch, spe, pos->epoch, b0, total);
}

static int resume(trainer *t, const fl_train_config *cfg, train_pos *pos) {
    char dir[1024], path[1100];
    int nfiles;
    FL_TRY(fl_ckpt_resolve(cfg->checkpoint.resume, dir, sizeof dir));
    FL_TRY(fl_ckpt_rank_file(dir, 0, path, sizeof path, &nfiles));
    t->resumed_in_dir = same_parent(dir, cfg->checkpoint.dir);
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    const char *world = fl_safetensors_meta(st, "fleet.world_size");
    int w0 = world ? atoi(world) : 0;
    if (w0 < 1 || (nfiles && nfiles != w0)) {
        char said[32];
        snprintf(said, sizeof said, "%s", world ? world : "absent");
        fl_safetensors_close(st);
        if (w0 >= 1 && nfiles < w0)
            return fl_fail(FL_EFORMAT, "resume: %s: written by %d workers, but "
                           "rank_%d.safetensors is missing", dir, w0, nfiles);
        return fl_fail(FL_EFORMAT, "resume: %s: fleet.world_size '%s' but %d rank file(s)",
                       path, said, nfiles);
    }
    /* with rank files and the same world, each rank takes its own */
    if (nfiles && w0 == t->world && t->rank != 0) {
        fl_safetensors_close(st);
        FL_TRY(fl_ckpt_rank_file(dir, t->rank, path, sizeof path, &nfiles));
        FL_TRY(fl_safetensors_open(path, &st));
    }
    state_list s = {0};
    fl_state_merge *kind = NULL;
    int rc = collect(t, &s);
    const char *fmt = fl_safetensors_meta(st, "fleet.format");
    if (rc >= 0 && (!fmt || strcmp(fmt, "checkpoint") != 0))
        rc = fl_fail(FL_EFORMAT, "resume: %s is not a fleet training checkpoint (fleet.format "
                     "'%s'); use checkpoint.pretrained for weights alone", path,
                     fmt ? fmt : "absent");
    const fl_st_tensor *sv = fl_safetensors_find(st, STATE_NAME);
    if (rc >= 0 && sv && sv->ndim == 1 && sv->shape[0] == STATE_N_V1)
        s.progress.value.shape[0] = s.progress.value.numel = STATE_N_V1; /* layout 1 */
    if (rc >= 0)
        rc = fl_ckpt_load(st, s.p, s.n, FL_CKPT_STRICT, NULL, 0, NULL);
    if (rc >= 0 && nfiles > 1 && w0 != t->world) { /* on the host stand-ins, before the push */
        kind = merge_kinds(t, &s);
        rc = kind ? fl_train_merge_ranks(t, dir, w0, s.p, kind, s.n)
                  : fl_fail(FL_ENOMEM, "resume: out of memory");
    }
    if (rc >= 0)
        fl_train_stage_push(&s.stage, fl_net_backend(t->net));
    if (rc >= 0) {
        int64_t *v = s.progress_v;
        if (v[ST_VERSION] == 1 && s.progress.value.numel == STATE_N_V1)
            v[ST_BASE_WORLD] = v[ST_WORLD];
        int64_t layout = s.progress.value.numel == STATE_N_V1 ? 1 : STATE_VERSION;
        if (v[ST_VERSION] != layout || v[ST_WORLD] != w0 || v[ST_STEP] < 0 ||
            v[ST_EPOCH] < 0 || v[ST_BATCH] < 0 || v[ST_BASE_WORLD] < 1)
            rc = fl_fail(FL_EFORMAT, "resume: %s: tensor '" STATE_NAME "' holds an impossible "
                         "position (version %" PRId64 ", step %" PRId64 ", epoch %" PRId64
                         ", batch %" PRId64 ", world %" PRId64 " in a file of %d workers)",
                         path, v[ST_VERSION], v[ST_STEP], v[ST_EPOCH], v[ST_BATCH],
                         v[ST_WORLD], w0);
        else if (w0 == t->world && v[ST_BATCH] > fl_prefetch_steps_per_epoch(t->loader))
            rc = fl_fail(FL_EFORMAT, "resume: %s: batch %" PRId64 " of an epoch of %" PRId64
                         " batches", path, v[ST_BATCH], fl_prefetch_steps_per_epoch(t->loader));
        else if (fl_dist_step(t->dopt) != v[ST_STEP])
            rc = fl_fail(FL_EFORMAT, "resume: %s: dist.counters says %" PRId64 " updates, "
                         STATE_NAME " %" PRId64, path, fl_dist_step(t->dopt), v[ST_STEP]);
        else {
            *pos = (train_pos){.step = v[ST_STEP], .epoch = v[ST_EPOCH], .batch = v[ST_BATCH]};
            t->base_world = (int)v[ST_BASE_WORLD];
            t->lr_scale = (double)t->world / t->base_world;
            if (w0 != t->world)
                rescale(t, cfg, w0, pos, nfiles);
            else if (t->world != t->base_world)
                rescaled_length(t, cfg, pos);
            if (t->rank == 0) {
                char *now = config_yaml(cfg);
                const char *saved = fl_safetensors_meta(st, "fleet.config");
                if (now && saved)
                    compare_configs(saved, now, path);
                free(now);
                bool decays_over_run = (cfg->optimizer.lr.schedule == FL_LR_COSINE ||
                                        cfg->optimizer.lr.schedule == FL_LR_POLYNOMIAL) &&
                                       cfg->optimizer.lr.decay_steps == 0;
                if (v[ST_TOTAL_STEPS] != t->total_steps && decays_over_run)
                    FL_WARN("resume: the run is now %" PRId64 " steps long, the checkpoint's "
                            "was %" PRId64 ": the learning rate, which decays over the whole "
                            "run (optimizer.lr.decay_steps 0), changes with it", t->total_steps,
                            v[ST_TOTAL_STEPS]);
                FL_INFO("resumed from %s: step %" PRId64 ", epoch %" PRId64 ", batch %" PRId64,
                        path, pos->step, pos->epoch, pos->batch);
            }
        }
    }
    free(kind);
    release(&s);
    fl_safetensors_close(st);
    return rc;
}

/* The training-state names listed in a fleet checkpoint's metadata, as an array of strings
 * pointing into *buf (both malloc'd; *names may be NULL when there are none). */
static int split_state_names(const fl_safetensors *st, char **buf, const char ***names, int *n) {
    *buf = NULL;
    *names = NULL;
    *n = 0;
    const char *list = fl_safetensors_meta(st, "fleet.training_state");
    if (!list || !*list)
        return FL_OK;
    *buf = strdup(list);
    int cnt = 1;
    for (const char *c = list; *c; c++)
        cnt += *c == ',';
    *names = calloc((size_t)cnt, sizeof **names);
    if (!*buf || !*names) {
        free(*buf);
        free(*names);
        *buf = NULL;
        *names = NULL;
        return fl_fail(FL_ENOMEM, "out of memory");
    }
    for (char *tok = strtok(*buf, ","); tok; tok = strtok(NULL, ","))
        (*names)[(*n)++] = tok;
    return FL_OK;
}

/* The weights file a path names: a .safetensors file, or a checkpoint (rank 0's file). */
static int weights_file(const char *p, char *path, size_t cap) {
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if (snprintf(path, cap, "%s", p) >= (int)cap)
            return fl_fail(FL_EINVAL, "path too long: '%s'", p);
        return FL_OK;
    }
    char dir[1024];
    int nfiles;
    FL_TRY(fl_ckpt_resolve(p, dir, sizeof dir));
    return fl_ckpt_rank_file(dir, 0, path, cap, &nfiles);
}

static int pretrained(trainer *t, const fl_train_config *cfg) {
    char path[1100];
    FL_TRY(weights_file(cfg->checkpoint.pretrained, path, sizeof path));
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    char *buf;
    const char **skip;
    int nskip;
    int rc = split_state_names(st, &buf, &skip, &nskip);
    fl_ckpt_report rep;
    state_list s = {0};
    if (rc >= 0)
        rc = collect(t, &s);
    if (rc >= 0) /* the network's tensors only; those not in the file keep their values */
        fl_train_stage_pull(&s.stage, fl_net_backend(t->net));
    if (rc >= 0)
        rc = fl_ckpt_load(st, s.p, s.nnet, FL_CKPT_PARTIAL, skip, nskip, &rep);
    if (rc >= 0)
        fl_train_stage_push(&s.stage, fl_net_backend(t->net));
    release(&s);
    if (rc >= 0 && t->rank == 0) {
        FL_INFO("pretrained: %d of %d tensors loaded from %s", rep.loaded,
                fl_net_num_params(t->net), path);
        if (rep.missing)
            FL_WARN("pretrained: %d missing (initialised as usual): %s", rep.missing,
                    rep.missing_names);
        if (rep.mismatched)
            FL_WARN("pretrained: %d mismatched (left as initialised): %s", rep.mismatched,
                    rep.mismatched_names);
        if (rep.unexpected)
            FL_WARN("pretrained: %d unexpected in the file (ignored): %s", rep.unexpected,
                    rep.unexpected_names);
    }
    free(buf);
    free(skip);
    fl_safetensors_close(st);
    if (rc < 0)
        return fl_fail_prefix(rc, "checkpoint.pretrained");
    return FL_OK;
}

/* checkpoint.resume: auto resumes from the newest complete checkpoint of checkpoint.dir (the
 * one `latest` names: it moves only after a save completed on every rank), and starts afresh
 * when there is none yet: what a job restarted by fleetrun --max_restarts wants. */
static bool resume_auto(const fl_train_config *cfg) {
    return strcmp(cfg->checkpoint.resume, "auto") == 0;
}

int fl_train_ckpt_resume_point(const fl_train_config *cfg, int64_t *step, char *root,
                               size_t cap) {
    *step = -1;
    root[0] = '\0';
    char dir[1024];
    if (resume_auto(cfg)) {
        FL_TRY(fl_ckpt_latest_step(cfg->checkpoint.dir, step));
        if (*step >= 0)
            snprintf(root, cap, "%s", cfg->checkpoint.dir);
        return FL_OK;
    }
    if (!cfg->checkpoint.resume[0])
        return FL_OK;
    FL_TRY(fl_ckpt_resolve(cfg->checkpoint.resume, dir, sizeof dir));
    *step = fl_ckpt_dir_step(dir);
    if (*step < 0) { /* a step directory under another name: its file says */
        char path[1100];
        int nfiles;
        fl_safetensors *st;
        FL_TRY(fl_ckpt_rank_file(dir, 0, path, sizeof path, &nfiles));
        FL_TRY(fl_safetensors_open(path, &st));
        const char *v = fl_safetensors_meta(st, "fleet.step");
        char *end = NULL;
        long long x = v ? strtoll(v, &end, 10) : -1;
        fl_safetensors_close(st);
        if (!v || *end || x < 0)
            return fl_fail(FL_EFORMAT, "%s: no fleet.step metadata: not a fleet checkpoint",
                           path);
        *step = x;
    }
    /* the directory above the step directory */
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    while (n > 0 && dir[n - 1] != '/')
        n--;
    if (n == 0)
        snprintf(root, cap, ".");
    else
        snprintf(root, cap, "%.*s", (int)(n > 1 ? n - 1 : n), dir);
    return FL_OK;
}

int fl_train_ckpt_restore(trainer *t, const fl_train_config *cfg, train_pos *pos) {
    *pos = (train_pos){0};
    if (resume_auto(cfg)) {
        char latest[1100];
        snprintf(latest, sizeof latest, "%s/latest", cfg->checkpoint.dir);
        if (access(latest, F_OK) == 0) {
            fl_train_config c = *cfg;
            snprintf(c.checkpoint.resume, sizeof c.checkpoint.resume, "%s", cfg->checkpoint.dir);
            if (cfg->checkpoint.pretrained[0] && t->rank == 0)
                FL_INFO("resume: checkpoint.pretrained is not used when resuming");
            return resume(t, &c, pos);
        }
        if (t->rank == 0)
            FL_INFO("resume: auto: no checkpoint in %s yet; starting from step 0",
                    cfg->checkpoint.dir);
    } else if (cfg->checkpoint.resume[0]) {
        if (cfg->checkpoint.pretrained[0] && t->rank == 0)
            FL_INFO("resume: checkpoint.pretrained is not used when resuming");
        return resume(t, cfg, pos);
    }
    const char *restarts = getenv("FLEET_RESTART_COUNT"); /* fleetrun --max_restarts */
    if (!cfg->checkpoint.resume[0] && restarts && atoi(restarts) > 0 && t->rank == 0)
        FL_WARN("fleetrun restarted this job (restart %s), but checkpoint.resume is not set: "
                "training starts again from step 0 (-o checkpoint.resume=auto resumes from the "
                "newest checkpoint)", restarts);
    if (cfg->checkpoint.pretrained[0])
        return pretrained(t, cfg);
    return FL_OK;
}

/* The keys the network is built from (fl_train_make_model reads them), as "key: value" lines
 * of the configuration's YAML: the network description of an inference model. */
static bool network_key(const char *line) {
    return strncmp(line, "model.", 6) == 0 || strncmp(line, "data.features:", 14) == 0 ||
           strncmp(line, "data.classes:", 13) == 0;
}

char *fl_train_network_keys(const char *yaml) {
    char *out = calloc(strlen(yaml) + 1, 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (const char *a = yaml; *a;) {
        const char *eol = strchr(a, '\n');
        size_t len = eol ? (size_t)(eol - a + 1) : strlen(a);
        if (network_key(a)) {
            memcpy(out + n, a, len);
            n += len;
        }
        a += len;
    }
    return out;
}

static int save_inference_model(trainer *t, const fl_train_config *cfg) {
    const char *path = cfg->checkpoint.inference_model;
    char *yaml = config_yaml(cfg), *net = yaml ? fl_train_network_keys(yaml) : NULL;
    int rc;
    if (!net) {
        rc = fl_fail(FL_ENOMEM, "inference model: out of memory");
    } else {
        fl_st_meta meta[] = {
            {"fleet.format", "inference_model"}, {"fleet.version", FL_VERSION},
            {"fleet.network", net},              {"fleet.config", yaml},
        };
        fl_param **p = calloc((size_t)fl_net_num_params(t->net) + 1, sizeof *p);
        if (!p) {
            rc = fl_fail(FL_ENOMEM, "inference model: out of memory");
        } else {
            int n = fl_net_num_params(t->net);
            for (int i = 0; i < n; i++)
                p[i] = fl_net_param(t->net, i);
            fl_train_stage h;
            rc = fl_train_stage_create(&h, p, n);
            if (rc >= 0) {
                fl_train_stage_pull(&h, fl_net_backend(t->net));
                rc = fl_ckpt_save(path, p, n, meta, (int)(sizeof meta / sizeof meta[0]));
            }
            fl_train_stage_free(&h);
            free(p);
        }
    }
    free(net);
    free(yaml);
    if (rc < 0)
        return fl_fail_prefix(rc, "checkpoint.inference_model");
    FL_INFO("inference model saved in %s", path);
    return FL_OK;
}

int fl_train_ckpt_final(trainer *t, const fl_train_config *cfg, const train_pos *pos,
                        int64_t last_saved) {
    if (cfg->checkpoint.dir[0] && pos->step != last_saved)
        FL_TRY(fl_train_ckpt_save(t, cfg, pos));
    if (cfg->checkpoint.inference_model[0] && t->rank == 0)
        FL_TRY(save_inference_model(t, cfg));
    return FL_OK;
}
