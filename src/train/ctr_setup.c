/* ctr_setup.c - builds the CTR trainer from a fl_train_config: joins the job (and the
 * parameter servers when the environment gives a role), opens this worker's data, builds the
 * CTR model, wraps its dense network's optimizer in the distributed optimizer (dense allreduce,
 * or dense table 0 on the servers) and declares the sparse tables where the mode keeps them. */
#include "train/ctr_impl.h"

#include "fleet/checkpoint.h"
#include "fleet/log.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const backend_names[] = {"auto", "tcp", "mpi", "nccl"};

static int join_job(ctr_trainer *c, const fl_train_config *cfg) {
    trainer *t = &c->base;
    const char *backend = backend_names[cfg->comm.backend];
    if (cfg->comm.backend == FL_TRAIN_BACKEND_NCCL)
        return fl_fail(FL_ECONFIG, "comm.backend: nccl is for GPU workers; the CTR models "
                                   "train on the CPU (tcp or mpi)");
    if (cfg->comm.encrypt != FL_COMM_ENCRYPT_AUTO && !getenv("FLEET_COMM_ENCRYPT"))
        setenv("FLEET_COMM_ENCRYPT", cfg->comm.encrypt == FL_COMM_ENCRYPT_ON ? "1" : "0", 1);
    int rc = fl_fleet_init(cfg->comm.backend == FL_TRAIN_BACKEND_AUTO ? NULL : backend, &t->fleet);
    if (rc < 0)
        return fl_fail_prefix(rc, "joining the job (comm.backend %s)", backend);
    t->rank = fl_worker_index(t->fleet);
    t->world = fl_worker_num(t->fleet);
    if (fl_train_ps_mode())
        FL_TRY(fl_train_ps_join(t, cfg));
    return FL_OK;
}

int ctr_build_model(const fl_train_config *cfg, fl_ctr_model **out) {
    fl_ctr_model_type type =
        cfg->model.type == FL_MODEL_DEEPFM ? FL_CTR_DEEPFM : FL_CTR_WIDE_DEEP;
    fl_ctr_model_config mc = fl_ctr_model_config_default(type);
    mc.embed_dim = (int)cfg->model.embed_dim;
    mc.nhidden = cfg->model.hidden.n;
    for (int i = 0; i < mc.nhidden; i++)
        mc.hidden[i] = cfg->model.hidden.v[i];
    mc.pool = (fl_sparse_pool)cfg->model.pooling;
    mc.max_batch = cfg->train.batch_size;
    mc.seed = (uint64_t)cfg->train.seed;
    int rc = fl_ctr_model_create(&mc, out);
    if (rc < 0)
        return fl_fail_prefix(rc, "model (%s)", fl_ctr_model_type_name(type));
    return FL_OK;
}

void ctr_sparse_rules(const fl_train_config *cfg, fl_ps_rule *rule,
                      fl_ps_init_rule init[FL_CTR_NTABLES]) {
    static const fl_ps_rule_type types[] = {FL_PS_RULE_SGD, FL_PS_RULE_ADAGRAD, FL_PS_RULE_ADAM};
    fl_ps_rule_defaults(rule, types[cfg->sparse_optimizer.type]);
    if (rule->type == FL_PS_RULE_ADAGRAD)
        rule->initial_g2sum = cfg->sparse_optimizer.initial_g2sum;
    double r = cfg->sparse_optimizer.init_range;
    fl_ps_init_type it = (fl_ps_init_type)cfg->sparse_optimizer.initializer;
    init[FL_CTR_TABLE_EMBEDDING] = (fl_ps_init_rule){
        .type = it, .a = it == FL_PS_INIT_UNIFORM ? -r : 0.0, .b = r,
        .seed = (uint64_t)cfg->train.seed};
    init[FL_CTR_TABLE_WIDE] = (fl_ps_init_rule){.type = FL_PS_INIT_ZERO,
                                                   .seed = (uint64_t)cfg->train.seed};
}

void ctr_sparse_opts(const fl_train_config *cfg, fl_ps_sparse_opts *o) {
    fl_ps_sparse_opts_defaults(o);
    o->entry = (fl_ps_entry_type)cfg->sparse_table.entry;
    o->entry_count = cfg->sparse_table.entry_count;
    o->entry_probability = cfg->sparse_table.entry_probability;
    o->show_click_decay = cfg->sparse_table.show_click_decay_rate;
    o->delete_threshold = cfg->sparse_table.delete_threshold;
    o->delete_after_unseen = (int)cfg->sparse_table.delete_after_unseen;
    o->nonclk_coeff = cfg->sparse_table.nonclk_coeff;
    o->click_coeff = cfg->sparse_table.click_coeff;
}

static int open_metrics(ctr_trainer *c, const fl_train_config *cfg) {
    if (c->base.rank != 0 || !cfg->train.log_dir[0])
        return FL_OK;
    FL_TRY(fl_ckpt_mkdirs(cfg->train.log_dir));
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->train.log_dir);
    c->base.metrics = fl_metrics_open(path);
    return c->base.metrics ? FL_OK : FL_EIO;
}

int ctr_setup(ctr_trainer *c, const fl_train_config *cfg) {
    trainer *t = &c->base;
    c->best_auc = NAN;
    if (cfg->train.threads > 0)
        fl_kernels_set_threads((int)cfg->train.threads);
    FL_TRY(join_job(c, cfg));
    const fl_strategy *s = &cfg->strategy;
    c->mode = !t->ps ? CTR_COLLECTIVE
              : !s->a_sync ? CTR_PS_SYNC
              : s->a_sync_configs.k_steps > 0 ? CTR_PS_GEO : CTR_PS_ASYNC;
    c->geo_k = s->a_sync_configs.k_steps;
    c->geo_background = s->a_sync_configs.geo_background;
    if (!t->ps && s->a_sync)
        return fl_fail(FL_ECONFIG, "strategy.a_sync: parameter-server training, but no role in "
                                   "the environment (TRAINING_ROLE): start the job with "
                                   "fleetrun --server_num");
    if (cfg->data.type == FL_DATA_CRITEO && cfg->data.shard == FL_CTR_SHARD_FILES &&
        c->mode != CTR_PS_ASYNC && c->mode != CTR_PS_GEO)
        return fl_fail(FL_ECONFIG, "data.shard: files needs async or geo parameter-server "
                                   "training");
    if (c->mode == CTR_PS_GEO && cfg->checkpoint.dir[0])
        return fl_fail(FL_ECONFIG, "checkpoint.dir: not in geo mode with CTR models yet (the "
                                   "workers' local sparse copies are not saved): use sync or "
                                   "async");

    int64_t B = cfg->train.batch_size;
    bool present;
    FL_TRY(ctr_source_open(&c->train, cfg, 0, t->rank, t->world, B, &present));
    FL_TRY(ctr_source_open(&c->val, cfg, 1, t->rank, t->world, B, &c->has_val));
    if (c->val.synth && t->rank == 0) {
        /* the teacher's own AUC on the validation samples: what a run is judged against */
        int64_t n = c->val.steps * B * t->world;
        if (fl_ctr_synth_best_auc(c->val.synth, n, &c->best_auc) < 0)
            c->best_auc = NAN;
    }

    FL_TRY(ctr_build_model(cfg, &c->model));
    t->net = fl_ctr_model_net(c->model);
    fl_optim_config oc = {.type = (fl_optim_type)cfg->optimizer.type,
                          .momentum = cfg->optimizer.type == FL_OPTIM_MOMENTUM
                                          ? cfg->optimizer.momentum : 0.0,
                          .nesterov = cfg->optimizer.nesterov,
                          .weight_decay = cfg->optimizer.weight_decay,
                          .clip_norm = cfg->optimizer.clip_norm};
    fl_strategy_optim_config(s, &oc);
    t->opt = fl_optim_create(&oc, fl_net_param(t->net, 0), fl_net_num_params(t->net),
                             FL_DTYPE_F32, fl_net_backend(t->net));
    if (!t->opt)
        return fl_fail_prefix(FL_ECONFIG, "optimizer");
    /* a resuming worker tells the servers which step it resumes, before the tables join */
    if (t->ps && cfg->checkpoint.resume[0])
        fl_ps_set_resume_step(t->ps, ctr_ckpt_resume_step(cfg));
    t->dopt = fl_distributed_optimizer(t->fleet, t->net, t->opt, s);
    if (!t->dopt)
        return fl_fail_prefix(FL_EINVAL, "strategy");
    ctr_sparse_rules(cfg, &c->rule, c->init);
    ctr_sparse_opts(cfg, &c->opts);
    c->lifecycle = fl_train_ctr_lifecycle(cfg);
    c->sparse_lr = cfg->sparse_optimizer.lr;
    FL_TRY(ctr_tables_init(c));

    /* the schedule counts steps; a Criteo list's length is known only by reading it */
    int64_t total = cfg->train.max_steps;
    if (c->train.steps > 0) {
        int64_t all = c->train.steps * cfg->train.epochs;
        if (total == 0 || all < total)
            total = all;
    }
    bool decays = (cfg->optimizer.lr.schedule == FL_LR_COSINE ||
                   cfg->optimizer.lr.schedule == FL_LR_POLYNOMIAL) &&
                  cfg->optimizer.lr.decay_steps == 0;
    if (total == 0 && decays)
        return fl_fail(FL_ECONFIG, "optimizer.lr.decay_steps: 0 decays over the whole run, "
                                   "whose length a Criteo list does not tell: set it, or "
                                   "train.max_steps");
    t->merge_k = 1;
    fl_train_set_length(t, cfg, total > 0 ? total : 1);
    if (fl_lr_validate(&t->sched) < 0)
        return fl_fail_prefix(FL_ECONFIG, "optimizer.lr");
    t->base_world = t->world;
    t->lr_scale = 1.0;
    return open_metrics(c, cfg);
}

void ctr_teardown(ctr_trainer *c) {
    trainer *t = &c->base;
    fl_metrics_close(t->metrics);
    ctr_tables_free(c);
    fl_dist_optim_free(t->dopt);
    fl_train_ps_leave(t);
    fl_optim_free(t->opt);
    fl_ctr_model_free(c->model); /* frees the network */
    ctr_source_close(&c->train);
    ctr_source_close(&c->val);
    fl_fleet_free(t->fleet);
    memset(c, 0, sizeof *c);
}
