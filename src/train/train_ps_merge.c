/* train_ps_merge.c - fleet-ckpt merge-ps (train.h, fl_train_ps_merge): a parameter-server job's
 * model at one step in one file. The servers hold the network's trainable values as dense
 * table 0 (the flat block, in fl_net_flat_params order: the strategy's layout, strategy/ps.c);
 * the network itself, its tensor names and the values the servers never see (batch-norm
 * statistics) come from the workers' checkpoint of the same step. The network is rebuilt
 * from that checkpoint's configuration, so each trainable tensor's place in the flat block is
 * the network's own and not guessed from the file. */
#include "train/train_impl.h"

#include "fleet/checkpoint.h"
#include "fleet/ps.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef FL_VERSION
#define FL_VERSION "unknown"
#endif

#define MAX_KEYS 1024
#define META_MAX (8 + FL_PS_MAX_TABLES)

/* The template's configuration on the ref backend (the merge computes nothing). */
static int template_config(const fl_safetensors *st, fl_train_config *cfg) {
    const char *path = fl_safetensors_path(st), *yaml = fl_safetensors_meta(st, "fleet.config");
    if (!yaml)
        return fl_fail(FL_EFORMAT, "%s: no fleet.config metadata: not written by fleet-train",
                       path);
    char *text = strdup(yaml);
    const char **ov = calloc(MAX_KEYS + 2, sizeof *ov);
    int n = 0, rc = text && ov ? FL_OK : fl_fail(FL_ENOMEM, "out of memory");
    if (rc >= 0)
        rc = fl_train_yaml_overrides(text, ov, &n, MAX_KEYS);
    if (rc >= 0) {
        ov[n++] = "train.device=cpu";
        ov[n++] = "train.backend=ref";
        rc = fl_train_config_load(cfg, NULL, ov, n);
    }
    if (rc < 0)
        rc = fl_fail_prefix(rc, "configuration from %s", path);
    free(text);
    free(ov);
    return rc;
}

/* The network's tensors from the template (training state skipped), strictly. */
static int load_template(const fl_safetensors *st, fl_net *net, fl_param **p, int n) {
    const char *list = fl_safetensors_meta(st, "fleet.training_state");
    char *buf = strdup(list ? list : "");
    const char **skip = calloc(strlen(list ? list : "") + 1, sizeof *skip);
    int nskip = 0, rc = buf && skip ? FL_OK : fl_fail(FL_ENOMEM, "out of memory");
    for (char *tok = rc < 0 ? NULL : strtok(buf, ","); tok; tok = strtok(NULL, ","))
        skip[nskip++] = tok;
    for (int i = 0; i < n; i++)
        p[i] = fl_net_param(net, i);
    if (rc >= 0)
        rc = fl_ckpt_load(st, p, n, FL_CKPT_STRICT, skip, nskip, NULL);
    free(buf);
    free(skip);
    return rc;
}

typedef struct {
    fl_st_meta m[META_MAX];
    char       keys[META_MAX][64], vals[META_MAX][192];
    int        n;
} meta_list;

static void meta_add(meta_list *l, const char *key, const char *val) {
    FL_ASSERT(l->n < META_MAX);
    snprintf(l->keys[l->n], sizeof l->keys[0], "%s", key);
    snprintf(l->vals[l->n], sizeof l->vals[0], "%s", val);
    l->m[l->n] = (fl_st_meta){l->keys[l->n], l->vals[l->n]};
    l->n++;
}

/* The extra tensors: dense tables other than 0, sparse tables; appended to p at *n. */
static void add_tables(const fl_ps_snapshot *snap, fl_param *extra, fl_param **p, int *n,
                       meta_list *ml, fl_train_ps_merge_report *rep) {
    int k = 0;
    for (int t = 1; t < FL_PS_MAX_TABLES; t++) {
        const fl_ps_dense_snapshot *d = &snap->dense[t];
        if (!d->present)
            continue;
        fl_param *x = &extra[k++];
        snprintf(x->name, sizeof x->name, "ps.dense.%d.values", t);
        fl_tensor_view(&x->value, FL_DTYPE_F32, 1, &d->numel, d->values);
        p[(*n)++] = x;
        rep->dense_tables++;
    }
    for (int t = 0; t < FL_PS_MAX_TABLES; t++) {
        const fl_ps_sparse_snapshot *sp = &snap->sparse[t];
        if (!sp->present)
            continue;
        char key[64], val[192];
        snprintf(key, sizeof key, "ps.sparse.%d.init", t);
        snprintf(val, sizeof val, "%d %.17g %.17g %" PRIu64 " dim %d", (int)sp->init.type,
                 sp->init.a, sp->init.b, sp->init.seed, sp->dim);
        meta_add(ml, key, val);
        rep->sparse_tables++;
        rep->sparse_rows += sp->rows;
        if (sp->rows == 0)
            continue; /* no tensor of no rows; the metadata says the table was there */
        int64_t shape[2] = {sp->rows, sp->dim};
        fl_param *ids = &extra[k++], *vals = &extra[k++];
        snprintf(ids->name, sizeof ids->name, "ps.sparse.%d.ids", t);
        fl_tensor_view(&ids->value, FL_DTYPE_I64, 1, shape, sp->ids);
        snprintf(vals->name, sizeof vals->name, "ps.sparse.%d.values", t);
        fl_tensor_view(&vals->value, FL_DTYPE_F32, 2, shape, sp->values);
        p[(*n)++] = ids;
        p[(*n)++] = vals;
    }
}

int fl_train_ps_merge(const char *ckpt_dir, int64_t step, const char *out,
                      fl_train_ps_merge_report *rep) {
    FL_ASSERT(ckpt_dir && out);
    fl_train_ps_merge_report local;
    if (!rep)
        rep = &local;
    memset(rep, 0, sizeof *rep);
    fl_ps_snapshot snap = {0};
    fl_safetensors *st = NULL;
    fl_dataset *ds = NULL;
    fl_net *net = NULL;
    fl_param **p = NULL, *extra = NULL;
    meta_list *ml = NULL;
    char *network = NULL, dir[1024], num[3][32];
    int nfiles, rc = FL_OK;
    fl_train_config cfg;
    /* the step: the workers' newest complete checkpoint, else the servers' pointers */
    if (step < 0)
        rc = fl_ckpt_latest_step(ckpt_dir, &step);
    if (rc >= 0)
        rc = fl_ps_snapshot_load(ckpt_dir, step, &snap);
    if (rc >= 0)
        rc = fl_ckpt_step_dir(dir, sizeof dir, ckpt_dir, snap.step);
    struct stat sb;
    if (rc >= 0 && stat(dir, &sb) != 0)
        rc = fl_fail(FL_EIO, "%s: missing: the workers' checkpoint of step %" PRId64 " gives "
                     "the merged model its network (checkpoint.keep may have removed it)", dir,
                     snap.step);
    if (rc >= 0)
        rc = fl_ckpt_rank_file(dir, 0, rep->template_path, sizeof rep->template_path, &nfiles);
    if (rc >= 0)
        rc = fl_safetensors_open(rep->template_path, &st);
    const char *fmt = st ? fl_safetensors_meta(st, "fleet.format") : NULL;
    if (rc >= 0 && (!fmt || strcmp(fmt, "checkpoint") != 0))
        rc = fl_fail(FL_EFORMAT, "%s: fleet.format '%s', not a training checkpoint",
                     rep->template_path, fmt ? fmt : "absent");
    const char *saved = st ? fl_safetensors_meta(st, "fleet.step") : NULL;
    snprintf(num[2], sizeof num[2], "%" PRId64, snap.step);
    if (rc >= 0 && (!saved || strcmp(saved, num[2]) != 0))
        rc = fl_fail(FL_EFORMAT, "%s holds step %s, the servers' shards step %" PRId64,
                     rep->template_path, saved ? saved : "(none)", snap.step);
    if (rc >= 0)
        rc = template_config(st, &cfg);
    if (rc >= 0 && !(ds = fl_train_make_dataset(&cfg, 0, NULL)))
        rc = fl_fail_prefix(FL_EINVAL, "%s: data (for the network's input shape)",
                            rep->template_path);
    if (rc >= 0 && !(net = fl_train_make_model(&cfg, ds)))
        rc = fl_fail_prefix(FL_ECONFIG, "%s: model", rep->template_path);
    if (rc >= 0)
        rc = fl_net_build(net, ds->ndim, ds->shape, 1, 0);
    int n = rc >= 0 ? fl_net_num_params(net) : 0, total = n;
    p = calloc((size_t)n + 3 * FL_PS_MAX_TABLES + 1, sizeof *p);
    extra = calloc(3 * FL_PS_MAX_TABLES, sizeof *extra);
    ml = calloc(1, sizeof *ml);
    if (rc >= 0 && (!p || !extra || !ml))
        rc = fl_fail(FL_ENOMEM, "out of memory");
    if (rc >= 0)
        rc = load_template(st, net, p, n);
    const fl_ps_dense_snapshot *d0 = &snap.dense[0];
    if (rc >= 0 && !d0->present)
        rc = fl_fail(FL_EFORMAT, "%s/ps.server*.%" PRId64 "*: the servers hold no dense table 0 "
                     "(the network's trainable values)", ckpt_dir, snap.step);
    else if (rc >= 0 && d0->numel != fl_net_numel(net))
        rc = fl_fail(FL_ESHAPE, "%s/ps.server*.%" PRId64 "*: dense table 0 holds %" PRId64
                     " values, but the network of %s has %" PRId64 " trainable values (shards "
                     "and checkpoint of different jobs?)", ckpt_dir, snap.step, d0->numel,
                     rep->template_path, fl_net_numel(net));
    if (rc >= 0) {
        memcpy(fl_net_flat_params(net), d0->values, (size_t)d0->numel * sizeof(float));
        const char *yaml = fl_safetensors_meta(st, "fleet.config");
        network = fl_train_network_keys(yaml);
        if (!network)
            rc = fl_fail(FL_ENOMEM, "out of memory");
        snprintf(num[0], sizeof num[0], "%" PRId64, snap.step);
        snprintf(num[1], sizeof num[1], "%d", snap.servers);
        meta_add(ml, "fleet.format", "inference_model");
        meta_add(ml, "fleet.version", FL_VERSION);
        meta_add(ml, "fleet.step", num[0]);
        meta_add(ml, "fleet.ps.servers", num[1]);
        meta_add(ml, "fleet.ps.merged_from", ckpt_dir);
        add_tables(&snap, extra, p, &total, ml, rep);
    }
    if (rc >= 0) {
        /* the two long texts do not fit meta_list's values: borrowed as they are */
        fl_st_meta *m = calloc((size_t)ml->n + 2, sizeof *m);
        if (!m) {
            rc = fl_fail(FL_ENOMEM, "out of memory");
        } else {
            memcpy(m, ml->m, (size_t)ml->n * sizeof *m);
            m[ml->n] = (fl_st_meta){"fleet.network", network};
            m[ml->n + 1] = (fl_st_meta){"fleet.config", fl_safetensors_meta(st, "fleet.config")};
            rc = fl_ckpt_save(out, p, total, m, ml->n + 2);
            free(m);
        }
    }
    if (rc >= 0) {
        rep->step = snap.step;
        rep->servers = snap.servers;
        rep->trainable = d0->numel;
        rep->version_min = d0->version_min;
        rep->version_max = d0->version_max;
    }
    free(network);
    free(ml);
    free(extra);
    free(p);
    fl_net_free(net);
    fl_dataset_free(ds);
    if (st)
        fl_safetensors_close(st);
    fl_ps_snapshot_clear(&snap);
    return rc;
}
