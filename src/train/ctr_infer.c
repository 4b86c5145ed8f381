/* ctr_infer.c - fleet-eval for the CTR models: the checkpoint's network tensors by name and its
 * sparse tables, either a collective checkpoint's replicas ("sparse.<table>.ids/.values") or a
 * file fleet-ckpt merge-ps wrote from the servers' shards ("ps.sparse.<n>.ids/.values", n the
 * PS table: 1 embedding, 2 wide), into local tables; then the validation (or training) split
 * through the model: Paddle's bucketed AUC, log loss, predicted and actual CTR. An id the file
 * lacks reads as the table's initializer gives it (as in training). One process. */
#include "train/ctr_impl.h"

#include "fleet/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Table t's rows from st, under either naming; *found false when st holds none. */
static int load_rows(const fl_safetensors *st, fl_ps_sparse *tab, int t, int64_t *nrows) {
    char ni[96], nv[96];
    const char *path = fl_safetensors_path(st);
    snprintf(ni, sizeof ni, "sparse.%s.ids", fl_ctr_model_table_name(t));
    snprintf(nv, sizeof nv, "sparse.%s.values", fl_ctr_model_table_name(t));
    const fl_st_tensor *ids = fl_safetensors_find(st, ni), *val = fl_safetensors_find(st, nv);
    if (!ids && !val) {
        snprintf(ni, sizeof ni, "ps.sparse.%d.ids", CTR_PS_TABLE(t));
        snprintf(nv, sizeof nv, "ps.sparse.%d.values", CTR_PS_TABLE(t));
        ids = fl_safetensors_find(st, ni);
        val = fl_safetensors_find(st, nv);
    }
    if (!ids || !val)
        return fl_fail(FL_EFORMAT, "%s: no rows of sparse table '%s' (tensors sparse.%s.ids and "
                       ".values: a collective checkpoint; or ps.sparse.%d.*: fleet-ckpt merge-ps "
                       "of a parameter-server checkpoint)", path, fl_ctr_model_table_name(t),
                       fl_ctr_model_table_name(t), CTR_PS_TABLE(t));
    int dim = fl_ps_sparse_dim(tab);
    int64_t n = ids->numel;
    if (ids->dtype != FL_DTYPE_I64 || val->dtype != FL_DTYPE_F32 || val->numel != n * dim)
        return fl_fail(FL_ESHAPE, "%s: %s and %s do not hold %lld rows of %d values", path, ni,
                       nv, (long long)n, dim);
    float *v = malloc((size_t)dim * sizeof *v);
    if (!v)
        return fl_fail(FL_ENOMEM, "out of memory");
    int rc = FL_OK;
    for (int64_t i = 0; rc >= 0 && i < n; i++) {
        uint64_t id;
        memcpy(&id, (const char *)ids->data + i * 8, 8);
        memcpy(v, (const char *)val->data + i * dim * 4, (size_t)dim * 4);
        rc = fl_ps_sparse_put(tab, id, v, NULL, NULL);
    }
    free(v);
    *nrows += n;
    return rc;
}

static int load_net(const fl_safetensors *st, fl_net *net) {
    const char *path = fl_safetensors_path(st);
    for (int i = 0; i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        const fl_st_tensor *x = fl_safetensors_find(st, p->name);
        if (!x)
            return fl_fail(FL_EFORMAT, "%s: tensor '%s' of the network is missing", path,
                           p->name);
        if (x->dtype != p->value.dtype || (size_t)x->nbytes != fl_tensor_nbytes(&p->value))
            return fl_fail(FL_ESHAPE, "%s: tensor '%s' has another type or size than the "
                           "model's", path, p->name);
        memcpy(p->value.data, x->data, x->nbytes);
    }
    return FL_OK;
}

int ctr_infer_run(const fl_train_config *cfg, const fl_safetensors *st, int split,
                  fl_infer_result *res) {
    ctr_trainer c;
    memset(&c, 0, sizeof c);
    c.mode = CTR_COLLECTIVE;
    c.base.world = 1;
    bool present = false;
    fl_ctr_metrics met = {0};
    float *p = NULL;
    int rc = ctr_source_open(&c.val, cfg, split, 0, 1, cfg->train.batch_size, &present);
    if (rc >= 0 && !present)
        rc = fl_fail(FL_ECONFIG, "the configuration has no %s split to evaluate (data.%s)",
                     split ? "validation" : "training",
                     cfg->data.type == FL_DATA_CRITEO ? (split ? "val_list" : "train_list")
                                                      : (split ? "val_size" : "train_size"));
    if (rc >= 0)
        rc = ctr_build_model(cfg, &c.model);
    if (rc >= 0)
        rc = load_net(st, fl_ctr_model_net(c.model));
    if (rc >= 0) {
        ctr_sparse_rules(cfg, &c.rule, c.init);
        ctr_sparse_opts(cfg, &c.opts); /* an id without a row reads as training read it */
        rc = ctr_tables_init(&c);
    }
    for (int t = 0; rc >= 0 && t < FL_CTR_NTABLES; t++)
        rc = load_rows(st, c.rep[t], t, &res->table_rows);
    c.has_val = true;
    if (rc >= 0)
        rc = fl_ctr_metrics_init(&met, FL_AUC_THRESHOLDS);
    if (rc >= 0)
        rc = ctr_evaluate(&c, &met);
    if (rc >= 0) {
        res->ctr = 1;
        res->samples = (int64_t)fl_ctr_metrics_count(&met);
        res->classes = 1;
        res->labelled = 1;
        res->auc = fl_ctr_metrics_auc(&met);
        res->logloss = fl_ctr_metrics_logloss(&met);
        res->pred_ctr = fl_ctr_metrics_pred_ctr(&met);
        res->actual_ctr = fl_ctr_metrics_actual_ctr(&met);
        res->params = fl_net_numel(fl_ctr_model_net(c.model));
        res->train_params = res->params;
    }
    free(p);
    fl_ctr_metrics_free(&met);
    ctr_tables_free(&c);
    fl_ctr_model_free(c.model);
    ctr_source_close(&c.val);
    return rc;
}
