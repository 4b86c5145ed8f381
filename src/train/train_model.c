/* train_model.c - the dataset and the untrained model a configuration describes (data.*,
 * model.*), on the backend train.device and train.backend name: the constructors that
 * fleet-train's setup, --print-model, the configuration's checks, fleet-eval and the
 * inference model all build from, so every one of them builds the same network. */
#include "train/train_impl.h"

#include <stdio.h>

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

fl_dataset *fl_train_make_dataset(const fl_train_config *cfg, int split,
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
    if (net && cfg->model.init == FL_MODEL_INIT_TORCH)
        fl_net_init_torch(net);
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

int fl_train_print_model(const fl_train_config *cfg, FILE *out) {
    fl_dataset *ds = fl_train_make_dataset(cfg, 0, NULL);
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
