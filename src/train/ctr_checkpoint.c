/* ctr_checkpoint.c - the CTR trainer's checkpoints, in checkpoint.h's directory layout
 * (step_NNNNNNNN/model.safetensors, `latest`, pruning): the network's tensors, the optimizer's
 * and the distributed optimizer's state, "ctr.state" (the loop's position) and, in collective
 * mode, the sparse replicas as "sparse.<table>.ids" (I64 [rows]), ".values" (F32 [rows, dim])
 * and ".state" (F32 [rows, k], the rule's per-row state; absent when k = 0), rows in ascending
 * id order; under a life cycle (sparse_table.*) also ".counts" (F32 [rows, 3]: show, click,
 * passes unseen), ".candidates" (I64 [c]) with ".candidate_counts" (F32 [c, 2]: shows seen,
 * passes unseen) for entry count, and ".passes" (I64 [1]). The replicas are identical on every worker, so rank 0's file stands for all. In
 * parameter-server mode worker 0 first has every server save its shards (fl_ps_save, as the
 * image trainer does); a resumed server loads them, the workers load rank 0's file. A resume
 * takes the same number of workers (another number is refused naming both). */
#include "train/ctr_impl.h"

#include "fleet/checkpoint.h"
#include "fleet/log.h"
#include "fleet/safetensors.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef FL_VERSION
#define FL_VERSION "unknown"
#endif

enum { CS_VERSION = 0, CS_STEP, CS_EPOCH, CS_BATCH, CS_WORLD, CS_MODE, CS_N };
#define CS_LAYOUT 1
#define CS_NAME "ctr.state"

/* The fixed tensors: network, optimizer, distributed optimizer, ctr.state (the last). */
typedef struct {
    fl_param **p;
    int        n, nnet;
    fl_param   state;
    int64_t    v[CS_N];
} fixed_list;

static int collect(ctr_trainer *c, fixed_list *f) {
    FL_TRY(fl_train_ckpt_tensors(&c->base, 1, &f->p, &f->n, &f->nnet));
    memset(&f->state, 0, sizeof f->state);
    snprintf(f->state.name, sizeof f->state.name, CS_NAME);
    fl_tensor_view(&f->state.value, FL_DTYPE_I64, 1, (int64_t[]){CS_N}, f->v);
    f->p[f->n++] = &f->state;
    return FL_OK;
}

/* One table's rows, gathered for saving. */
typedef struct {
    int64_t  n, cap;
    int      dim, k;
    int64_t *ids;
    float   *values, *state;
    float   *counts;           /* life cycle: (show, click, unseen) a row; else NULL */
    int64_t  ncand, cand_cap;  /* entry count's candidates */
    int64_t *cand_ids;
    float   *cand_counts;      /* (seen, unseen) a candidate */
    int64_t  passes;
} table_rows;

static int gather_row(void *ctx, uint64_t id, const float *values, const float *state,
                      const fl_ps_row_stat *st) {
    table_rows *r = ctx;
    if (r->n >= r->cap)
        return FL_EINVAL;
    r->ids[r->n] = (int64_t)id;
    memcpy(r->values + r->n * r->dim, values, (size_t)r->dim * sizeof(float));
    if (r->k)
        memcpy(r->state + r->n * r->k, state, (size_t)r->k * sizeof(float));
    if (r->counts) {
        float *q = r->counts + r->n * 3;
        q[0] = st->show;
        q[1] = st->click;
        q[2] = (float)st->unseen;
    }
    r->n++;
    return 0;
}

static int gather_cand(void *ctx, uint64_t id, float seen, int unseen) {
    table_rows *r = ctx;
    if (r->ncand >= r->cand_cap)
        return FL_EINVAL;
    r->cand_ids[r->ncand] = (int64_t)id;
    r->cand_counts[r->ncand * 2] = seen;
    r->cand_counts[r->ncand * 2 + 1] = (float)unseen;
    r->ncand++;
    return 0;
}

static int state_floats(const ctr_trainer *c, int dim) {
    return fl_ps_rule_state_per_value(&c->rule) * dim + fl_ps_rule_state_per_row(&c->rule);
}

static void rows_free(table_rows *r) {
    free(r->ids);
    free(r->values);
    free(r->state);
    free(r->counts);
    free(r->cand_ids);
    free(r->cand_counts);
}

static int gather_table(ctr_trainer *c, int t, table_rows *r) {
    memset(r, 0, sizeof *r);
    r->dim = fl_ps_sparse_dim(c->rep[t]);
    r->k = state_floats(c, r->dim);
    r->cap = fl_ps_sparse_rows(c->rep[t]);
    size_t rows = (size_t)(r->cap > 0 ? r->cap : 1);
    r->ids = malloc(rows * sizeof *r->ids);
    r->values = malloc(rows * (size_t)r->dim * sizeof *r->values);
    r->state = malloc(rows * (size_t)(r->k > 0 ? r->k : 1) * sizeof *r->state);
    if (c->lifecycle) {
        r->counts = malloc(rows * 3 * sizeof *r->counts);
        r->cand_cap = fl_ps_sparse_candidates(c->rep[t]);
        size_t nc = (size_t)(r->cand_cap > 0 ? r->cand_cap : 1);
        r->cand_ids = malloc(nc * sizeof *r->cand_ids);
        r->cand_counts = malloc(nc * 2 * sizeof *r->cand_counts);
        r->passes = fl_ps_sparse_passes(c->rep[t]);
    }
    if (!r->ids || !r->values || !r->state ||
        (c->lifecycle && (!r->counts || !r->cand_ids || !r->cand_counts)))
        return fl_fail(FL_ENOMEM, "checkpoint: out of memory for %lld rows of table '%s'",
                       (long long)r->cap, fl_ctr_model_table_name(t));
    int rc = fl_ps_sparse_visit(c->rep[t], false, gather_row, r);
    if (rc == 0 && c->lifecycle)
        rc = fl_ps_sparse_visit_candidates(c->rep[t], gather_cand, r);
    if (rc != 0)
        return fl_fail(rc < 0 ? rc : FL_EINVAL, "checkpoint: reading table '%s'",
                       fl_ctr_model_table_name(t));
    return FL_OK;
}

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

/* Rank 0's file: the fixed tensors and the replicas. */
static int write_file(ctr_trainer *c, const fl_train_config *cfg, fixed_list *f,
                      const char *path) {
    table_rows rows[FL_CTR_NTABLES] = {0};
    int ntab = c->mode == CTR_COLLECTIVE ? FL_CTR_NTABLES : 0;
    enum { PER_TABLE = 7 }; /* ids, values, state, counts, candidates, their counts, passes */
    fl_st_entry *e = calloc((size_t)(f->n + PER_TABLE * FL_CTR_NTABLES), sizeof *e);
    char names[PER_TABLE * FL_CTR_NTABLES][96];
    int64_t shapes[PER_TABLE * FL_CTR_NTABLES][2];
    char *yaml = config_yaml(cfg);
    size_t cap = 64;
    for (int i = f->nnet; i < f->n; i++)
        cap += strlen(f->p[i]->name) + 1;
    cap += PER_TABLE * FL_CTR_NTABLES * 40;
    char *state_names = calloc(cap, 1);
    int rc = e && yaml && state_names ? FL_OK : fl_fail(FL_ENOMEM, "checkpoint: out of memory");
    int n = 0;
    for (int i = 0; rc >= 0 && i < f->n; i++) {
        const fl_tensor *v = &f->p[i]->value;
        e[n++] = (fl_st_entry){f->p[i]->name, v->dtype, v->ndim, v->shape, v->data};
        if (i >= f->nnet) {
            strcat(state_names, f->p[i]->name);
            strcat(state_names, ",");
        }
    }
    for (int t = 0; rc >= 0 && t < ntab; t++) {
        rc = gather_table(c, t, &rows[t]);
        if (rc < 0)
            break;
        const char *tn = fl_ctr_model_table_name(t);
        int j = PER_TABLE * t;
        snprintf(names[j], 96, "sparse.%s.ids", tn);
        shapes[j][0] = rows[t].n;
        e[n++] = (fl_st_entry){names[j], FL_DTYPE_I64, 1, shapes[j], rows[t].ids};
        snprintf(names[j + 1], 96, "sparse.%s.values", tn);
        shapes[j + 1][0] = rows[t].n;
        shapes[j + 1][1] = rows[t].dim;
        e[n++] = (fl_st_entry){names[j + 1], FL_DTYPE_F32, 2, shapes[j + 1], rows[t].values};
        if (rows[t].k) {
            snprintf(names[j + 2], 96, "sparse.%s.state", tn);
            shapes[j + 2][0] = rows[t].n;
            shapes[j + 2][1] = rows[t].k;
            e[n++] = (fl_st_entry){names[j + 2], FL_DTYPE_F32, 2, shapes[j + 2], rows[t].state};
        }
        if (rows[t].counts) {
            table_rows *r = &rows[t];
            snprintf(names[j + 3], 96, "sparse.%s.counts", tn);
            shapes[j + 3][0] = r->n;
            shapes[j + 3][1] = 3;
            e[n++] = (fl_st_entry){names[j + 3], FL_DTYPE_F32, 2, shapes[j + 3], r->counts};
            snprintf(names[j + 4], 96, "sparse.%s.candidates", tn);
            shapes[j + 4][0] = r->ncand;
            e[n++] = (fl_st_entry){names[j + 4], FL_DTYPE_I64, 1, shapes[j + 4], r->cand_ids};
            snprintf(names[j + 5], 96, "sparse.%s.candidate_counts", tn);
            shapes[j + 5][0] = r->ncand;
            shapes[j + 5][1] = 2;
            e[n++] = (fl_st_entry){names[j + 5], FL_DTYPE_F32, 2, shapes[j + 5], r->cand_counts};
            snprintf(names[j + 6], 96, "sparse.%s.passes", tn);
            shapes[j + 6][0] = 1;
            e[n++] = (fl_st_entry){names[j + 6], FL_DTYPE_I64, 1, shapes[j + 6], &r->passes};
        }
    }
    if (rc >= 0) {
        size_t l = strlen(state_names);
        if (l && state_names[l - 1] == ',')
            state_names[l - 1] = '\0';
        char world[16], step[24], epoch[24];
        snprintf(world, sizeof world, "%d", c->base.world);
        snprintf(step, sizeof step, "%" PRId64, f->v[CS_STEP]);
        snprintf(epoch, sizeof epoch, "%" PRId64, f->v[CS_EPOCH]);
        fl_st_meta meta[] = {
            {"fleet.format", "checkpoint"}, {"fleet.version", FL_VERSION},
            {"fleet.world_size", world},    {"fleet.rank", "all"},
            {"fleet.step", step},           {"fleet.epoch", epoch},
            {"fleet.training_state", state_names}, {"fleet.config", yaml},
            {"fleet.ctr_mode", ctr_mode_name(c->mode)},
        };
        rc = fl_safetensors_write(path, e, n, meta, (int)(sizeof meta / sizeof meta[0]));
    }
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        rows_free(&rows[t]);
    free(e);
    free(yaml);
    free(state_names);
    return rc;
}

/* Whether any worker failed (rc < 0 here): one allreduce. */
static int all_ok(ctr_trainer *c, int rc, const char *what, int64_t step) {
    double failed = rc < 0 ? 1.0 : 0.0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? fl_errmsg() : "");
    int arc = c->base.world > 1 ? fl_comm_allreduce(fl_fleet_comm(c->base.fleet), &failed, 1,
                                                    FL_DTYPE_F64, FL_REDOP_MAX)
                                : FL_OK;
    if (rc < 0)
        return fl_fail(rc, "checkpoint step %" PRId64 ": %s", step, msg);
    FL_TRY(arc);
    if (failed > 0)
        return fl_fail(FL_EIO, "checkpoint step %" PRId64 ": another worker failed to %s", step,
                       what);
    return FL_OK;
}

int ctr_ckpt_save(ctr_trainer *c, const fl_train_config *cfg, const train_pos *pos) {
    trainer *t = &c->base;
    const char *root = cfg->checkpoint.dir;
    fixed_list f = {0};
    int rc = collect(c, &f);
    f.v[CS_VERSION] = CS_LAYOUT;
    f.v[CS_STEP] = pos->step;
    f.v[CS_EPOCH] = pos->epoch;
    f.v[CS_BATCH] = pos->batch;
    f.v[CS_WORLD] = t->world;
    f.v[CS_MODE] = c->mode;
    char dir[1024], path[1100];
    /* parameter-server mode: the servers' shards of the step first (worker 0 asks), once
     * every worker's sparse push of the step has returned (a sync merge is then complete) */
    if (rc >= 0 && t->ps && t->world > 1) {
        double token = 0;
        rc = fl_comm_allreduce(fl_fleet_comm(t->fleet), &token, 1, FL_DTYPE_F64, FL_REDOP_SUM);
    }
    if (rc >= 0 && t->ps && t->rank == 0) {
        rc = fl_ckpt_mkdirs(root); /* the servers write their shards there */
        if (rc >= 0)
            rc = fl_ps_save(t->ps, pos->step, FL_PS_SAVE_ALL);
    }
    if (rc >= 0)
        rc = fl_ckpt_step_dir(dir, sizeof dir, root, pos->step);
    if (rc >= 0 && t->rank == 0) {
        rc = fl_ckpt_mkdirs(dir);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (rc >= 0)
            rc = write_file(c, cfg, &f, path);
    }
    free(f.p);
    FL_TRY(all_ok(c, rc, "save it", pos->step));
    if (t->rank == 0) {
        rc = fl_ckpt_set_latest(root, pos->step);
        if (rc >= 0)
            rc = fl_ckpt_prune(root, cfg->checkpoint.keep);
        if (rc >= 0)
            FL_INFO("checkpoint: step %" PRId64 " saved in %s%s", pos->step, dir,
                    t->ps ? " (sparse and dense tables: the servers' shards)" : "");
    }
    return all_ok(c, rc, "publish it", pos->step);
}

/* The step directory checkpoint.resume names, or "" for a fresh start (auto without one). */
static int resume_dir(const fl_train_config *cfg, char *dir, size_t cap) {
    dir[0] = '\0';
    const char *from = cfg->checkpoint.resume;
    if (!from[0])
        return FL_OK;
    if (strcmp(from, "auto") == 0) {
        char latest[1100];
        snprintf(latest, sizeof latest, "%s/latest", cfg->checkpoint.dir);
        if (access(latest, F_OK) != 0)
            return FL_OK;
        from = cfg->checkpoint.dir;
    }
    return fl_ckpt_resolve(from, dir, cap);
}

int64_t ctr_ckpt_resume_step(const fl_train_config *cfg) {
    char dir[1024], path[1100];
    int nfiles;
    fl_safetensors *st;
    if (resume_dir(cfg, dir, sizeof dir) < 0 || !dir[0] ||
        fl_ckpt_rank_file(dir, 0, path, sizeof path, &nfiles) < 0 ||
        fl_safetensors_open(path, &st) < 0)
        return -1;
    const char *s = fl_safetensors_meta(st, "fleet.step");
    int64_t step = s ? atoll(s) : -1;
    fl_safetensors_close(st);
    return step;
}

/* Counters a checkpoint may hold: finite, >= 0, unseen a whole number of passes. */
static bool counts_ok(float show, float click, float unseen) {
    return show >= 0 && show < INFINITY && click >= 0 && click < INFINITY && unseen >= 0 &&
           unseen <= 65535 && unseen == (float)(int)unseen;
}

/* "sparse.<tn>.counts" of n rows, or *out NULL when the file has none (a run without a life
 * cycle wrote it: the rows start with zero counts). */
static int find_counts(const fl_safetensors *st, const char *path, const char *tn, int64_t n,
                       const fl_st_tensor **out) {
    char name[96];
    snprintf(name, sizeof name, "sparse.%s.counts", tn);
    const fl_st_tensor *x = fl_safetensors_find(st, name);
    if (x && (x->dtype != FL_DTYPE_F32 || x->ndim != 2 || x->shape[0] != n || x->shape[1] != 3))
        return fl_fail(FL_ESHAPE, "resume: %s: tensor '%s' is not F32 [%lld, 3]", path, name,
                       (long long)n);
    *out = x;
    return FL_OK;
}

/* Entry count's candidates and the passes run, where the file has them. */
static int load_life(ctr_trainer *c, const fl_safetensors *st, const char *path, int t) {
    const char *tn = fl_ctr_model_table_name(t);
    char name[3][96];
    snprintf(name[0], 96, "sparse.%s.candidates", tn);
    snprintf(name[1], 96, "sparse.%s.candidate_counts", tn);
    snprintf(name[2], 96, "sparse.%s.passes", tn);
    const fl_st_tensor *ids = fl_safetensors_find(st, name[0]);
    const fl_st_tensor *cc = fl_safetensors_find(st, name[1]);
    const fl_st_tensor *ps = fl_safetensors_find(st, name[2]);
    if (ps) {
        int64_t passes;
        if (ps->dtype != FL_DTYPE_I64 || ps->numel != 1)
            return fl_fail(FL_ESHAPE, "resume: %s: tensor '%s' is not I64 [1]", path, name[2]);
        memcpy(&passes, ps->data, 8);
        if (passes < 0)
            return fl_fail(FL_EFORMAT, "resume: %s: tensor '%s' holds %lld passes", path,
                           name[2], (long long)passes);
        fl_ps_sparse_set_passes(c->rep[t], passes);
    }
    if (!ids && !cc)
        return FL_OK;
    if (!ids || !cc || ids->dtype != FL_DTYPE_I64 || ids->ndim != 1 ||
        cc->dtype != FL_DTYPE_F32 || cc->ndim != 2 || cc->shape[0] != ids->numel ||
        cc->shape[1] != 2)
        return fl_fail(FL_ESHAPE, "resume: %s: tensors '%s' (I64 [c]) and '%s' (F32 [c, 2]) "
                       "do not match", path, name[0], name[1]);
    for (int64_t i = 0; i < ids->numel; i++) {
        uint64_t id;
        float q[2];
        memcpy(&id, (const char *)ids->data + i * 8, 8);
        memcpy(q, (const char *)cc->data + i * 8, 8);
        if (!counts_ok(q[0], 0, q[1]))
            return fl_fail(FL_EFORMAT, "resume: %s: candidate %lld of table '%s' holds "
                           "impossible counts (seen %g, unseen %g)", path, (long long)i, tn,
                           q[0], q[1]);
        FL_TRY(fl_ps_sparse_put_candidate(c->rep[t], id, q[0], (int)q[1]));
    }
    return FL_OK;
}

static int load_table(ctr_trainer *c, const fl_safetensors *st, const char *path, int t) {
    const char *tn = fl_ctr_model_table_name(t);
    char name[3][96];
    snprintf(name[0], 96, "sparse.%s.ids", tn);
    snprintf(name[1], 96, "sparse.%s.values", tn);
    snprintf(name[2], 96, "sparse.%s.state", tn);
    const fl_st_tensor *ids = fl_safetensors_find(st, name[0]);
    const fl_st_tensor *val = fl_safetensors_find(st, name[1]);
    const fl_st_tensor *sta = fl_safetensors_find(st, name[2]);
    int dim = fl_ps_sparse_dim(c->rep[t]), k = state_floats(c, dim);
    if (!ids || !val || (k && !sta))
        return fl_fail(FL_EFORMAT, "resume: %s: tensor '%s' missing (a collective CTR "
                       "checkpoint holds the sparse replicas)", path,
                       !ids ? name[0] : !val ? name[1] : name[2]);
    int64_t n = ids->numel;
    if (ids->dtype != FL_DTYPE_I64 || ids->ndim != 1 || val->dtype != FL_DTYPE_F32 ||
        val->ndim != 2 || val->shape[0] != n || val->shape[1] != dim ||
        (k && (sta->dtype != FL_DTYPE_F32 || sta->ndim != 2 || sta->shape[0] != n ||
               sta->shape[1] != k)))
        return fl_fail(FL_ESHAPE, "resume: %s: table '%s' holds rows of another shape, type "
                       "or rule than this run's (dim %d, %d state values a row, sparse_"
                       "optimizer.type %s)", path, tn, dim, k, fl_ps_rule_name(c->rule.type));
    const fl_st_tensor *cnt = NULL;
    FL_TRY(find_counts(st, path, tn, n, &cnt));
    float *v = malloc((size_t)dim * sizeof *v), *s = malloc((size_t)(k + 1) * sizeof *s);
    int rc = v && s ? FL_OK : fl_fail(FL_ENOMEM, "resume: out of memory");
    const char *ip = ids->data, *vp = val->data, *sp = sta ? sta->data : NULL;
    for (int64_t i = 0; rc >= 0 && i < n; i++) {
        uint64_t id;
        memcpy(&id, ip + i * 8, 8); /* the file's buffer may be unaligned */
        memcpy(v, vp + i * dim * 4, (size_t)dim * 4);
        if (k)
            memcpy(s, sp + i * k * 4, (size_t)k * 4);
        fl_ps_row_stat rs = {0};
        if (cnt) {
            float q[3];
            memcpy(q, (const char *)cnt->data + i * 12, 12);
            if (!counts_ok(q[0], q[1], q[2])) {
                rc = fl_fail(FL_EFORMAT, "resume: %s: sparse.%s.counts row %lld holds "
                             "impossible counts (show %g, click %g, unseen %g)", path, tn,
                             (long long)i, q[0], q[1], q[2]);
                break;
            }
            rs = (fl_ps_row_stat){q[0], q[1], (int)q[2]};
        }
        rc = fl_ps_sparse_put(c->rep[t], id, v, k ? s : NULL, cnt ? &rs : NULL);
    }
    if (rc >= 0)
        rc = load_life(c, st, path, t);
    if (rc >= 0)
        fl_ps_sparse_mark_clean(c->rep[t]);
    free(v);
    free(s);
    return rc;
}

int ctr_ckpt_restore(ctr_trainer *c, const fl_train_config *cfg, train_pos *pos) {
    trainer *t = &c->base;
    *pos = (train_pos){0};
    char dir[1024], path[1100];
    FL_TRY(resume_dir(cfg, dir, sizeof dir));
    if (!dir[0]) {
        if (cfg->checkpoint.resume[0] && t->rank == 0)
            FL_INFO("resume: auto: no checkpoint in %s yet; starting from step 0",
                    cfg->checkpoint.dir);
        return FL_OK;
    }
    int nfiles;
    FL_TRY(fl_ckpt_rank_file(dir, 0, path, sizeof path, &nfiles));
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    fixed_list f = {0};
    int rc = collect(c, &f);
    const char *fmt = fl_safetensors_meta(st, "fleet.format");
    const char *mode = fl_safetensors_meta(st, "fleet.ctr_mode");
    if (rc >= 0 && (!fmt || strcmp(fmt, "checkpoint") != 0 || !mode))
        rc = fl_fail(FL_EFORMAT, "resume: %s is not a checkpoint of CTR training", path);
    static const char *const ignore[] = {"sparse."};
    if (rc >= 0)
        rc = fl_ckpt_load(st, f.p, f.n, FL_CKPT_STRICT, ignore, 1, NULL);
    int64_t *v = f.v;
    if (rc >= 0 && (v[CS_VERSION] != CS_LAYOUT || v[CS_STEP] < 0 || v[CS_EPOCH] < 0 ||
                    v[CS_BATCH] < 0))
        rc = fl_fail(FL_EFORMAT, "resume: %s: tensor '" CS_NAME "' holds an impossible "
                     "position", path);
    if (rc >= 0 && v[CS_WORLD] != t->world)
        rc = fl_fail(FL_ECONFIG, "resume: %s was written by %" PRId64 " workers, this job has "
                     "%d: a CTR job resumes with as many workers", path, v[CS_WORLD], t->world);
    if (rc >= 0 && (v[CS_MODE] == CTR_COLLECTIVE) != (c->mode == CTR_COLLECTIVE))
        rc = fl_fail(FL_ECONFIG, "resume: %s was written in %s mode, this job runs %s (the "
                     "sparse tables live elsewhere)", path, mode, ctr_mode_name(c->mode));
    if (rc >= 0 && fl_dist_step(t->dopt) != v[CS_STEP])
        rc = fl_fail(FL_EFORMAT, "resume: %s: dist.counters says %" PRId64 " updates, "
                     CS_NAME " %" PRId64, path, fl_dist_step(t->dopt), v[CS_STEP]);
    for (int tb = 0; rc >= 0 && c->mode == CTR_COLLECTIVE && tb < FL_CTR_NTABLES; tb++)
        rc = load_table(c, st, path, tb);
    if (rc >= 0) {
        *pos = (train_pos){.step = v[CS_STEP], .epoch = v[CS_EPOCH], .batch = v[CS_BATCH]};
        if (t->rank == 0)
            FL_INFO("resumed from %s: step %" PRId64 ", epoch %" PRId64 ", batch %" PRId64 "%s",
                    path, pos->step, pos->epoch, pos->batch,
                    t->ps ? " (the tables from the servers' shards)" : "");
    }
    free(f.p);
    fl_safetensors_close(st);
    return rc;
}
