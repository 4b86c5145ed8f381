/* train_setup.c - builds a trainer from a fl_train_config: joins the job (fl_fleet_init), then
 * data with this rank's shard, model, optimizer wrapped in the distributed optimizer, schedule
 * and rank 0's metrics file. Everything the step loop needs is allocated here, once. */
#include "train/train_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const backend_names[] = {"auto", "tcp", "mpi", "nccl"}; /* by fl_train_backend */

static fl_dataset *make_imagelist(const fl_train_config *cfg, int split) {
    fl_imagelist_config ic = fl_imagelist_config_default();
    ic.list = split == 0 ? cfg->data.train_list : cfg->data.val_list;
    ic.root = cfg->data.root;
    ic.classes = (int)cfg->data.classes;
    ic.train = split == 0 && cfg->data.augment;
    ic.crop_size = (int)cfg->data.crop_size;
    ic.resize_short_size = (int)cfg->data.resize_short_size;
    ic.lower_scale = cfg->data.lower_scale;
    ic.lower_ratio = cfg->data.lower_ratio;
    ic.upper_ratio = cfg->data.upper_ratio;
    ic.seed = (uint64_t)cfg->data.seed;
    ic.on_bad_image = (fl_bad_image_policy)cfg->data.bad_images;
    return fl_dataset_imagelist_create(&ic);
}

/* The test split is normalised with the training split's statistics: read from train_set when
 * the caller has it, else from the training images (fleet-eval's test split). */
static fl_dataset *make_mnist(const fl_train_config *cfg, int split, const fl_dataset *train_set) {
    fl_mnist_config mc = fl_mnist_config_default();
    if (cfg->data.root[0])
        mc.dir = cfg->data.root;
    mc.train = split == 0;
    mc.augment = split == 0 && cfg->data.augment;
    mc.crop_padding = (int)cfg->data.crop_padding;
    mc.flip = cfg->data.flip;
    mc.classes = (int)cfg->data.classes;
    mc.seed = (uint64_t)cfg->data.seed;
    if (split == 1) {
        fl_dataset *own = NULL;
        if (!train_set) {
            fl_mnist_config tc = mc;
            tc.train = true;
            tc.augment = false;
            if (!(own = fl_dataset_mnist_create(&tc)))
                return NULL;
            train_set = own;
        }
        int rc = fl_dataset_mnist_stats(train_set, &mc.mean, &mc.std);
        fl_dataset_free(own);
        if (rc < 0)
            return NULL;
    }
    return fl_dataset_mnist_create(&mc);
}

static fl_dataset *make_dataset(const fl_train_config *cfg, int split,
                                const fl_dataset *train_set) {
    int64_t size = split == 0 ? cfg->data.train_size : cfg->data.val_size;
    switch ((fl_data_type)cfg->data.type) {
    case FL_DATA_RANDOM: /* each split its own seed: disjoint samples */
        return fl_dataset_random_create(size, cfg->data.features, (int)cfg->data.classes,
                                        (uint64_t)cfg->data.seed * 2 + (uint64_t)split);
    case FL_DATA_TEACHER:
        return fl_dataset_teacher_create(size, cfg->data.features, cfg->data.teacher_hidden,
                                         (int)cfg->data.classes, (uint64_t)cfg->data.seed,
                                         split);
    case FL_DATA_SHAPES:
        return fl_dataset_shapes_create(size, (int)cfg->data.classes, (int)cfg->data.image_size,
                                        (uint64_t)cfg->data.seed, split);
    case FL_DATA_CIFAR10:
        return fl_dataset_cifar10_create(cfg->data.root, split == 0,
                                         split == 0 && cfg->data.augment,
                                         (uint64_t)cfg->data.seed);
    case FL_DATA_IMAGELIST:
        return make_imagelist(cfg, split);
    case FL_DATA_MNIST:
        return make_mnist(cfg, split, train_set);
    case FL_DATA_CRITEO:
    case FL_DATA_CTR_SYNTH:
        break; /* CTR batches are not samples of a fl_dataset: the CTR trainer reads them */
    }
    if (fl_data_is_ctr(cfg->data.type)) {
        fl_fail(FL_ECONFIG, "data.type: %s is CTR data, read by the CTR trainer only (not "
                            "--print-model or an image tool)",
                cfg->data.type == FL_DATA_CRITEO ? "criteo" : "ctr_synth");
        return NULL;
    }
    fl_fail(FL_ECONFIG, "data.type: %d is not a data type", cfg->data.type);
    return NULL;
}

/* Whether cfg describes a validation set. */
bool fl_train_has_val(const fl_train_config *cfg) {
    switch ((fl_data_type)cfg->data.type) {
    case FL_DATA_CIFAR10:
    case FL_DATA_MNIST:
        return true;
    case FL_DATA_IMAGELIST:
        return cfg->data.val_list[0] != '\0';
    default:
        return cfg->data.val_size > 0;
    }
}

/* ds (the training set) gives the input: the mlp's features, the CNNs' channels and size;
 * fused: the re-parameterised inference form (the caller checked fl_train_has_fused) */
static fl_net *make_net(const fl_train_config *cfg, const fl_dataset *ds, bool fused);

/* The model on the backend train.device and train.backend name (its device bound). */
static fl_net *make_model(const fl_train_config *cfg, const fl_dataset *ds, bool fused) {
    const fl_backend *be = fl_train_compute_backend(cfg);
    if (!be)
        return NULL;
    fl_net *net = make_net(cfg, ds, fused);
    if (net)
        fl_net_set_backend(net, be);
    return net;
}

static fl_net *make_net(const fl_train_config *cfg, const fl_dataset *ds, bool fused) {
    int64_t depth = cfg->model.depth;
    int64_t features = ds->sample_numel;
    switch ((fl_model_type)cfg->model.type) {
    case FL_MODEL_MLP:
        if (cfg->model.input_size && cfg->model.input_size != features) {
            fl_fail(FL_ECONFIG, "model.input_size: %lld, but the data's samples have %lld values",
                    (long long)cfg->model.input_size, (long long)features);
            return NULL;
        }
        return fl_model_mlp(FL_DTYPE_F32, features, cfg->model.hidden.v, cfg->model.hidden.n,
                            (fl_act)cfg->model.activation, cfg->data.classes);
    case FL_MODEL_RESNET:
        return fl_model_resnet(FL_DTYPE_F32, depth ? (int)depth : 50, cfg->data.classes);
    case FL_MODEL_RESNET_CIFAR:
        return fl_model_resnet_cifar(FL_DTYPE_F32, depth ? (int)depth : 20,
                                     ds->ndim == 3 ? ds->shape[0] : 3, cfg->data.classes,
                                     cfg->model.shortcut == FL_SHORTCUT_B ? 'B' : 'A');
    case FL_MODEL_PPLCNET: {
        /* images under 112 pixels (28 x 28, 32 x 32) take the small-input stem */
        bool small = ds->ndim == 3 && (ds->shape[1] < 112 || ds->shape[2] < 112);
        return fl_model_pplcnet(FL_DTYPE_F32, cfg->model.scale, ds->ndim == 3 ? ds->shape[0] : 3,
                                small, cfg->data.classes);
    }
    case FL_MODEL_PPHGNET: {
        static const char *const sizes[] = {"tiny", "small", "base"};
        bool small = ds->ndim == 3 && (ds->shape[1] < 112 || ds->shape[2] < 112);
        return fl_model_pphgnet(FL_DTYPE_F32, sizes[cfg->model.size],
                                ds->ndim == 3 ? ds->shape[0] : 3, small, cfg->data.classes);
    }
    case FL_MODEL_PPLCNETV2: {
        bool small = ds->ndim == 3 && (ds->shape[1] < 112 || ds->shape[2] < 112);
        return (fused ? fl_model_pplcnetv2_fused : fl_model_pplcnetv2)(
            FL_DTYPE_F32, ds->ndim == 3 ? ds->shape[0] : 3, small, cfg->data.classes);
    }
    case FL_MODEL_WIDE_DEEP:
    case FL_MODEL_DEEPFM:
        fl_fail(FL_ECONFIG, "model.type: a CTR model is built by the CTR trainer");
        return NULL;
    }
    fl_fail(FL_ECONFIG, "model.type: %d is not a model", cfg->model.type);
    return NULL;
}

/* total_steps counts optimizer updates, the unit of the schedule */
static void make_schedule(const fl_train_config *cfg, int64_t total_steps, fl_lr_schedule *s) {
    memset(s, 0, sizeof *s);
    s->type = (fl_lr_type)cfg->optimizer.lr.schedule;
    s->base_lr = cfg->optimizer.lr.base;
    s->nboundaries = cfg->optimizer.lr.boundaries.n;
    for (int i = 0; i < s->nboundaries; i++)
        s->boundaries[i] = cfg->optimizer.lr.boundaries.v[i];
    for (int i = 0; i < cfg->optimizer.lr.values.n && i <= FL_LR_MAX_PIECES; i++)
        s->values[i] = cfg->optimizer.lr.values.v[i];
    int64_t after_warmup = total_steps - cfg->optimizer.lr.warmup_steps;
    s->decay_steps = cfg->optimizer.lr.decay_steps ? cfg->optimizer.lr.decay_steps
                                                   : (after_warmup > 0 ? after_warmup : 1);
    s->end_lr = cfg->optimizer.lr.end;
    s->power = cfg->optimizer.lr.power;
    s->warmup_steps = cfg->optimizer.lr.warmup_steps;
    s->warmup_start_lr = cfg->optimizer.lr.warmup_start;
}

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

    t->train_set = make_dataset(cfg, 0, NULL);
    if (!t->train_set)
        return fl_fail_prefix(FL_EINVAL, "data");
    if (fl_train_has_val(cfg)) {
        t->val_set = make_dataset(cfg, 1, t->train_set);
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

    t->net = make_model(cfg, t->train_set, false);
    if (!t->net)
        return fl_fail_prefix(FL_ECONFIG, "model");
    if (cfg->strategy.recompute &&
        fl_net_set_recompute(t->net, cfg->strategy.recompute_configs.checkpoints) < 0)
        return fl_fail_prefix(FL_ECONFIG, "strategy.recompute_configs.checkpoints");
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

void fl_train_set_length(trainer *t, const fl_train_config *cfg, int64_t total) {
    t->total_steps = total;
    make_schedule(cfg, total, &t->sched);
}

int fl_train_print_model(const fl_train_config *cfg, FILE *out) {
    fl_dataset *ds = make_dataset(cfg, 0, NULL);
    if (!ds)
        return fl_fail_prefix(FL_EINVAL, "data");
    int rc = FL_OK;
    fl_net *net = make_model(cfg, ds, false);
    if (!net)
        rc = fl_fail_prefix(FL_ECONFIG, "model");
    else if (cfg->strategy.recompute &&
             fl_net_set_recompute(net, cfg->strategy.recompute_configs.checkpoints) < 0)
        rc = fl_fail_prefix(FL_ECONFIG, "strategy.recompute_configs.checkpoints");
    else if ((rc = fl_net_build(net, ds->ndim, ds->shape, cfg->train.batch_size, 0)) == FL_OK)
        fl_net_summary(net, out);
    fl_net_free(net);
    fl_dataset_free(ds);
    return rc;
}

fl_dataset *fl_train_make_dataset(const fl_train_config *cfg, int split) {
    return make_dataset(cfg, split, NULL);
}

fl_net *fl_train_make_model(const fl_train_config *cfg, const fl_dataset *ds) {
    return make_model(cfg, ds, false);
}

bool fl_train_has_fused(const fl_train_config *cfg) {
    return cfg->model.type == FL_MODEL_PPLCNETV2;
}

fl_net *fl_train_make_fused_model(const fl_train_config *cfg, const fl_dataset *ds) {
    if (!fl_train_has_fused(cfg)) {
        fl_fail(FL_ECONFIG, "model.type: only pplcnetv2 has a re-parameterised (fused) form");
        return NULL;
    }
    return make_model(cfg, ds, true);
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
