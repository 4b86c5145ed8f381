/* train_infer.c - offline evaluation behind fleet-eval (infer.h): rebuilds the network from the
 * description stored in a model file with fleet-train's own constructors, loads the weights
 * strictly (every network tensor, right dtype and shape), re-parameterises it where the model
 * has a fused inference form (PP-LCNetV2), and runs the dataset in order in evaluation mode,
 * collecting the logits for a .npy file and the loss and top-k accuracy. */
#include "train/ctr_impl.h"

#include "fleet/checkpoint.h"
#include "fleet/infer.h"
#include "fleet/npy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int fl_train_yaml_overrides(char *text, const char **list, int *n, int cap) {
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strstr(line, ": ");
        if (!colon)
            continue;
        if (*n == cap)
            return fl_fail(FL_EINVAL, "fleet-eval: too many configuration keys");
        /* "key: value" -> "key=value": shift the value left by one over the space */
        *colon = '=';
        memmove(colon + 1, colon + 2, strlen(colon + 2) + 1);
        list[(*n)++] = line;
    }
    return FL_OK;
}

static int model_file(const char *p, char *path, size_t cap) {
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        snprintf(path, cap, "%s", p);
        return FL_OK;
    }
    char dir[1024];
    int nfiles;
    FL_TRY(fl_ckpt_resolve(p, dir, sizeof dir));
    return fl_ckpt_rank_file(dir, 0, path, cap, &nfiles);
}

/* The configuration: defaults <- data config (or the stored training config) <- the stored
 * network keys <- the user's overrides. */
static int build_config(const fl_infer_args *a, const fl_safetensors *st, fl_train_config *cfg) {
    const char *path = fl_safetensors_path(st);
    const char *net = fl_safetensors_meta(st, "fleet.network");
    const char *all = fl_safetensors_meta(st, "fleet.config");
    if (!all)
        return fl_fail(FL_EFORMAT, "%s: no fleet.config metadata: not a model written by "
                       "fleet-train", path);
    char *text = malloc(strlen(all) + (net ? strlen(net) : 0) + 2);
    int max = 1024 + a->noverrides, n = 0;
    const char **ov = calloc((size_t)max, sizeof *ov);
    int rc = FL_OK;
    if (!text || !ov) {
        rc = fl_fail(FL_ENOMEM, "out of memory");
        goto out;
    }
    /* with a data config, only the network keys come from the model (a training checkpoint
     * has no fleet.network: they are picked from its configuration); else all its keys */
    if (a->config) {
        char *picked = net ? NULL : fl_train_network_keys(all);
        if (!net && !picked) {
            rc = fl_fail(FL_ENOMEM, "out of memory");
            goto out;
        }
        strcpy(text, net ? net : picked);
        free(picked);
    } else {
        strcpy(text, all);
    }
    rc = fl_train_yaml_overrides(text, ov, &n, max - a->noverrides);
    for (int i = 0; rc >= 0 && i < a->noverrides; i++)
        ov[n++] = a->overrides[i];
    if (rc >= 0)
        rc = fl_train_config_load(cfg, a->config, ov, n);
    if (rc < 0)
        rc = fl_fail_prefix(rc, "configuration from %s%s%s", path, a->config ? " and " : "",
                            a->config ? a->config : "");
out:
    free(text);
    free(ov);
    return rc;
}

/* Loads every network tensor of net from st; a checkpoint's training state is skipped. */
static int load_weights(const fl_safetensors *st, fl_net *net) {
    int n = fl_net_num_params(net);
    fl_param **p = calloc((size_t)n + 1, sizeof *p);
    char *buf = NULL;
    const char **skip = NULL;
    int nskip = 0, rc = FL_OK;
    if (!p)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        p[i] = fl_net_param(net, i);
    const char *list = fl_safetensors_meta(st, "fleet.training_state");
    /* a merged parameter-server model's tables outside the network (fleet-ckpt merge-ps) */
    static const char *const ps_tables[] = {"ps.dense.", "ps.sparse."};
    size_t len = list ? strlen(list) : 0;
    buf = strdup(list ? list : "");
    skip = calloc(len + 3, sizeof *skip);
    if (!buf || !skip)
        rc = fl_fail(FL_ENOMEM, "out of memory");
    for (char *tok = rc < 0 ? NULL : strtok(buf, ","); tok; tok = strtok(NULL, ","))
        skip[nskip++] = tok;
    for (int i = 0; rc >= 0 && i < 2; i++)
        skip[nskip++] = ps_tables[i];
    fl_train_stage h = {0}; /* a device's tensors are loaded into host copies, then moved */
    if (rc >= 0)
        rc = fl_train_stage_create(&h, p, n);
    if (rc >= 0)
        rc = fl_ckpt_load(st, p, n, FL_CKPT_STRICT, skip, nskip, NULL);
    if (rc >= 0)
        fl_train_stage_push(&h, fl_net_backend(net));
    fl_train_stage_free(&h);
    free(skip);
    free(buf);
    free(p);
    return rc;
}

static int run_eval(const fl_train_config *cfg, fl_dataset *ds, fl_net *net,
                    const fl_infer_args *a, fl_infer_result *res) {
    int64_t n = ds->size, c = res->classes, b = cfg->train.batch_size, f = ds->sample_numel;
    float *logits = malloc((size_t)(n * c + 1) * sizeof *logits);
    float *inputs = a->inputs_npy ? malloc((size_t)(n * f + 1) * sizeof *inputs) : NULL;
    fl_train_batch tb; /* the batch where the network computes, its loss buffer */
    int rc = fl_train_batch_init(&tb, fl_net_backend(net), b, f, c);
    fl_loader_config lc = {.batch_size = b, .shuffle = false, .drop_last = false, .rank = 0,
                           .world = 1};
    fl_loader *l = fl_loader_create(ds, &lc);
    if (rc < 0)
        goto out;
    if (!logits || (a->inputs_npy && !inputs)) {
        rc = fl_fail(FL_ENOMEM, "out of memory for %lld x %lld logits", (long long)n,
                     (long long)c);
        goto out;
    }
    if (!l) {
        rc = fl_fail_prefix(FL_EINVAL, "evaluation data");
        goto out;
    }
    const fl_backend *k = fl_net_backend(net);
    const fl_tensor *x, *out;
    const int32_t *labels, *dlabels;
    double loss_sum = 0, top1 = 0, top5 = 0;
    int64_t at = 0;
    res->labelled = 1;
    while (rc >= 0 && (rc = fl_loader_next(l, &x, &labels)) == 1) {
        int64_t rows = x->shape[0];
        if (rows == 0)
            continue;
        for (int64_t i = 0; i < rows; i++)
            if (labels[i] < 0 || labels[i] >= c)
                res->labelled = 0;
        fl_tensor dx, pt, hview;
        if ((rc = fl_train_batch_put(&tb, x, res->labelled ? labels : NULL, &dx, &dlabels,
                                     &pt)) < 0 ||
            (rc = fl_net_forward(net, &dx, false, &out)) < 0)
            break;
        const fl_tensor *hout = fl_train_batch_logits(&tb, out, &hview); /* host memory */
        memcpy(logits + at * c, hout->data, (size_t)(rows * c) * sizeof(float));
        if (inputs)
            memcpy(inputs + at * f, x->data, (size_t)(rows * f) * sizeof(float));
        if (res->labelled) {
            double mean;
            if ((rc = fl_softmax_xent_forward(k, out, dlabels, &pt, &mean)) < 0)
                break;
            loss_sum += mean * (double)rows;
            top1 += (double)fl_topk_correct(hout, labels, 1);
            if (c >= 5)
                top5 += (double)fl_topk_correct(hout, labels, 5);
        }
        at += rows;
    }
    if (rc < 0)
        goto out;
    rc = FL_OK;
    res->samples = at;
    if (fl_loader_skipped(l) > 0) /* data.bad_images: skip: rows for the loaded images only */
        FL_WARN("%lld of %lld images skipped as missing or corrupt: the output has a row per "
                "image loaded, in list order (data.bad_images=fail names the first)",
                (long long)fl_loader_skipped(l), (long long)n);
    res->loss = res->labelled && at ? loss_sum / (double)at : NAN;
    res->top1 = res->labelled && at ? top1 / (double)at : NAN;
    res->top5 = res->labelled && at && c >= 5 ? top5 / (double)at : NAN;
    int64_t shape[2] = {at, c};
    if (a->out_npy)
        rc = fl_npy_write_f32(a->out_npy, 2, shape, logits);
    shape[1] = f;
    if (rc >= 0 && a->inputs_npy)
        rc = fl_npy_write_f32(a->inputs_npy, 2, shape, inputs);
out:
    fl_loader_free(l);
    fl_train_batch_clear(&tb);
    free(inputs);
    free(logits);
    return rc;
}

/* Puts the fused form of *net (built, loaded) in its place where form asks for it; fills
 * res's form and parameter counts. */
static int fuse(const fl_train_config *cfg, const fl_dataset *ds, fl_infer_form form,
                fl_net **net, fl_infer_result *res) {
    res->train_params = res->params = fl_net_numel(*net);
    if (form == FL_INFER_FORM_TRAIN || (form == FL_INFER_FORM_AUTO && !fl_train_has_fused(cfg)))
        return FL_OK;
    fl_net *f = fl_train_make_fused_model(cfg, ds);
    int rc = f ? fl_net_build(f, ds->ndim, ds->shape, cfg->train.batch_size, 0) : FL_ECONFIG;
    if (rc >= 0)
        rc = fl_pplcnetv2_fuse(f, *net);
    if (rc < 0) {
        fl_net_free(f);
        return fl_fail_prefix(rc, "the re-parameterised (fused) form");
    }
    fl_net_free(*net);
    *net = f;
    res->fused = 1;
    res->params = fl_net_numel(f);
    return FL_OK;
}

int fl_infer_run(const fl_infer_args *a, fl_infer_result *res) {
    FL_ASSERT(a && a->model && res);
    memset(res, 0, sizeof *res);
    char path[1100];
    FL_TRY(model_file(a->model, path, sizeof path));
    fl_safetensors *st;
    FL_TRY(fl_safetensors_open(path, &st));
    fl_train_config cfg;
    fl_dataset *ds = NULL;
    fl_net *net = NULL;
    int rc = build_config(a, st, &cfg);
    if (rc >= 0 && fl_data_is_ctr(cfg.data.type)) { /* a CTR model (ctr_infer.c) */
        if (a->out_npy || a->inputs_npy)
            rc = fl_fail(FL_ECONFIG, "--out / --inputs: a CTR model's evaluation writes no "
                                     "vectors (it reports AUC and log loss)");
        else
            rc = ctr_infer_run(&cfg, st, a->split, res);
        fl_safetensors_close(st);
        return rc;
    }
    if (rc >= 0 && a->split == 1 && !fl_train_has_val(&cfg))
        rc = fl_fail(FL_ECONFIG, "the configuration has no validation set to evaluate (%s): "
                     "--split train, or set it",
                     cfg.data.type == FL_DATA_IMAGELIST ? "data.val_list is empty"
                                                        : "data.val_size is 0");
    if (rc >= 0 && !(ds = fl_train_make_dataset(&cfg, a->split, NULL)))
        rc = fl_fail_prefix(FL_EINVAL, "data");
    if (rc >= 0 && !(net = fl_train_make_model(&cfg, ds)))
        rc = fl_fail_prefix(FL_ECONFIG, "model");
    if (rc >= 0)
        rc = fl_net_build(net, ds->ndim, ds->shape, cfg.train.batch_size, 0);
    if (rc >= 0)
        rc = load_weights(st, net);
    if (rc >= 0)
        rc = fuse(&cfg, ds, a->form, &net, res);
    if (rc >= 0) {
        int64_t oshape[FL_MAX_DIMS];
        int ond = fl_net_out_shape(net, oshape);
        if (ond != 1)
            rc = fl_fail(FL_ESHAPE, "%s: the network's output is not one vector per sample",
                         path);
        else
            res->classes = oshape[0];
    }
    if (rc >= 0)
        rc = run_eval(&cfg, ds, net, a, res);
    fl_net_free(net);
    fl_dataset_free(ds);
    fl_safetensors_close(st);
    return rc;
}
