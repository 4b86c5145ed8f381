/* train_setup.c - builds a trainer from a fl_train_config: joins the job (fl_fleet_init), then
 * data with this rank's shard, model (both made by train_model.c), optimizer wrapped in the
 * distributed optimizer, schedule (train_schedule.c) and rank 0's metrics file. Everything the
 * step loop needs is allocated here, once. */
#include "train/train_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const backend_names[] = {"auto", "tcp", "mpi", "nccl"}; /* by fl_train_backend */

/* mkdir -p for the log directory */
static int make_dirs(const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return fl_fail(FL_EIO, "train.log_dir: cannot create '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return fl_fail(FL_EIO, "train.log_dir: cannot create '%s': %s", buf, strerror(errno));
    return FL_OK;
}

static int open_metrics(trainer *t, const fl_train_config *cfg) {
    if (t->rank != 0 || !cfg->train.log_dir[0])
        return FL_OK;
    FL_TRY(make_dirs(cfg->train.log_dir));
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->train.log_dir);
    t->metrics = fl_metrics_open(path);
    return t->metrics ? FL_OK : FL_EIO;
}

int fl_train_setup(trainer *t, const fl_train_config *cfg) {
    if (cfg->train.threads > 0)
        fl_kernels_set_threads((int)cfg->train.threads);
    /* a GPU asked for and not there: said before joining the job */
    if (!fl_train_compute_backend(cfg))
        return FL_ECONFIG;
    /* a plain process is a job of one; comm.backend auto lets the environment decide */
    const char *backend = backend_names[cfg->comm.backend];
    if (cfg->comm.backend == FL_TRAIN_BACKEND_NCCL) { /* Paddle's nccl_comm_num (docs/nccl.md) */
        char n[16];
        snprintf(n, sizeof n, "%lld", (long long)cfg->strategy.nccl_comm_num);
        setenv("FLEET_NCCL_COMM_NUM", n, 1);
    }
    /* comm.encrypt reaches the communicator as FLEET_COMM_ENCRYPT, which, when set, wins */
    if (cfg->comm.encrypt != FL_COMM_ENCRYPT_AUTO && !getenv("FLEET_COMM_ENCRYPT"))
        setenv("FLEET_COMM_ENCRYPT", cfg->comm.encrypt == FL_COMM_ENCRYPT_ON ? "1" : "0", 1);
    int rc = fl_fleet_init(cfg->comm.backend == FL_TRAIN_BACKEND_AUTO ? NULL : backend, &t->fleet);
    if (rc < 0)
        return fl_fail_prefix(rc, "joining the job (comm.backend %s)", backend);
    t->rank = fl_worker_index(t->fleet);
    t->world = fl_worker_num(t->fleet);
    if (fl_train_ps_mode())
        FL_TRY(fl_train_ps_join(t, cfg));

    t->train_set = fl_train_make_dataset(cfg, 0, NULL);
    if (!t->train_set)
        return fl_fail_prefix(FL_EINVAL, "data");
    if (fl_train_has_val(cfg)) {
        t->val_set = fl_train_make_dataset(cfg, 1, t->train_set);
        if (!t->val_set)
            return fl_fail_prefix(FL_EINVAL, "data");
    }
    /* rank r takes the r-th slice of every global batch of world x batch_size samples */
    fl_prefetch_config lc = {.base = {.batch_size = cfg->train.batch_size, .shuffle = true,
                                      .drop_last = true, .seed = (uint64_t)cfg->train.seed,
                                      .rank = t->rank, .world = t->world},
                             .num_workers = (int)cfg->data.num_workers,
                             .prefetch = (int)cfg->data.prefetch};
    t->loader = fl_prefetch_create(t->train_set, &lc);
    if (!t->loader)
        return fl_fail_prefix(FL_ECONFIG, "train.batch_size (x %d workers)", t->world);

    t->net = fl_train_make_model(cfg, t->train_set);
    if (!t->net)
        return fl_fail_prefix(FL_ECONFIG, "model");
    if (cfg->strategy.recompute &&
        fl_net_set_recompute(t->net, cfg->strategy.recompute_configs.checkpoints) < 0)
        return fl_fail_prefix(FL_ECONFIG, "strategy.recompute_configs.checkpoints");
    /* strategy.amp before the build: the layers that run low are planned once, in low */
    FL_TRY(fl_strategy_plan_amp(&cfg->strategy, t->net));
    FL_TRY(fl_net_build(t->net, t->train_set->ndim, t->train_set->shape, cfg->train.batch_size,
                        (uint64_t)cfg->train.seed));

    fl_optim_config oc = {.type = (fl_optim_type)cfg->optimizer.type,
                          .momentum = cfg->optimizer.type == FL_OPTIM_MOMENTUM
                                          ? cfg->optimizer.momentum : 0.0,
                          .nesterov = cfg->optimizer.nesterov,
                          .weight_decay = cfg->optimizer.weight_decay,
                          .clip_norm = cfg->optimizer.clip_norm};
    fl_strategy_optim_config(&cfg->strategy, &oc); /* strategy.lars: LARS momentum */
    t->opt = fl_optim_create(&oc, fl_net_param(t->net, 0), fl_net_num_params(t->net),
                             FL_DTYPE_F32, fl_net_backend(t->net));
    if (!t->opt)
        return fl_fail_prefix(FL_ECONFIG, "optimizer");
    /* checks the strategy again, broadcasts rank 0's parameters, plans the buckets */
    t->dopt = fl_distributed_optimizer(t->fleet, t->net, t->opt, &cfg->strategy);
    if (!t->dopt)
        return fl_fail_prefix(FL_EINVAL, "strategy");

    t->label_smoothing = cfg->optimizer.label_smoothing;
    t->merge_k = cfg->strategy.gradient_merge ? cfg->strategy.gradient_merge_configs.k_steps : 1;
    int64_t total = fl_prefetch_steps_per_epoch(t->loader) * cfg->train.epochs / t->merge_k;
    if (cfg->train.max_steps > 0 && cfg->train.max_steps < total)
        total = cfg->train.max_steps;
    fl_train_set_length(t, cfg, total);
    if (fl_lr_validate(&t->sched) < 0)
        return fl_fail_prefix(FL_ECONFIG, "optimizer.lr");
    t->base_world = t->world; /* until a checkpoint says otherwise */
    t->lr_scale = 1.0;

    const fl_backend *k = fl_net_backend(t->net);
    FL_TRY(fl_train_batch_init(&t->batch, k, cfg->train.batch_size, t->train_set->sample_numel,
                               cfg->data.classes));
    FL_TRY(fl_train_input_init(&t->input, k, t->loader, cfg->train.batch_size,
                               t->train_set->sample_numel, cfg->data.classes));
    size_t buffers = 0; /* persistable values after the trainable ones: averaged before evals */
    for (int i = 0; i < fl_net_num_params(t->net); i++)
        if (!fl_net_param(t->net, i)->trainable)
            buffers += fl_tensor_nbytes(&fl_net_param(t->net, i)->value);
    if (!k->host_memory && t->world > 1 && buffers > 0 &&
        !(t->hbuffers = fl_alloc_aligned(buffers)))
        return fl_fail(FL_ENOMEM, "out of memory for %zu bytes of host buffers", buffers);
    return open_metrics(t, cfg);
}


void fl_train_teardown(trainer *t) {
    fl_metrics_close(t->metrics);
    fl_train_batch_clear(&t->batch);
    fl_train_input_clear(&t->input);
    fl_free_aligned(t->hbuffers);
    fl_dist_optim_free(t->dopt);
    fl_train_ps_leave(t);
    fl_optim_free(t->opt);
    fl_net_free(t->net);
    fl_prefetch_free(t->loader);
    fl_dataset_free(t->val_set);
    fl_dataset_free(t->train_set);
    fl_fleet_free(t->fleet);
}
