/* train_config.c - the trainer's configuration schema: every key with its type, range, default
 * and help line in one table (the trainer's keys, the strategy section embedded from
 * fl_strategy_schema, comm.backend), plus the checks that involve several keys. */
#include "fleet/data.h"
#include "fleet/nn.h"
#include "fleet/backend.h"
#include "fleet/optim.h"
#include "fleet/status.h"
#include "fleet/train.h"
#include "train/train_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#define OFF(field) offsetof(fl_train_config, field)
#define BIG 1e15

/* room for the strategy section; build_schema asserts that it fits */
#define MAX_KEYS 160

/* enum choices are listed in the order of the C enums they map to */
static const fl_cfg_key own_keys[] = {
    {"model.type", FL_CFG_ENUM, OFF(model.type), 0, 0, 0,
     "mlp|resnet|resnet_cifar|pplcnet|pphgnet|pplcnetv2|wide_deep|deepfm", true,
     "model zoo entry: mlp; resnet (torchvision's, 224x224 inputs); resnet_cifar (32x32); "
     "pplcnet, pphgnet, pplcnetv2 (PaddleClas's PP-LCNet, PP-HGNet, PPLCNetV2_base: 224x224, "
     "or images under 112 pixels with the small-input stem); wide_deep, deepfm (CTR models "
     "over sparse tables: data.type criteo or ctr_synth; docs/ctr.md)"},
    {"model.input_size", FL_CFG_INT, OFF(model.input_size), 0, 0, BIG, NULL, false,
     "input features; 0 = the dataset's"},
    {"model.hidden", FL_CFG_INT_LIST, OFF(model.hidden), 0, 1, 1e6, NULL, false,
     "hidden layer sizes of the mlp (default [128, 128]) or of a CTR model's deep part "
     "(default [400, 400, 400])"},
    {"model.activation", FL_CFG_ENUM, OFF(model.activation), 0, 0, 0,
     "none|relu|tanh|sigmoid|hardswish|hardsigmoid", false, "activation after each hidden layer"},
    {"model.classes", FL_CFG_INT, OFF(model.classes), 0, 0, 1e7, NULL, false,
     "output classes; 0 = the dataset's"},
    {"model.depth", FL_CFG_INT, OFF(model.depth), 0, 0, 10000, NULL, false,
     "resnet: 18, 34, 50, 101 or 152 (0: 50); resnet_cifar: 6n+2, e.g. 20, 32, 56 (0: 20)"},
    {"model.shortcut", FL_CFG_ENUM, OFF(model.shortcut), 0, 0, 0, "A|B", false,
     "resnet_cifar shortcuts where the shape changes: A zero-padding, B 1x1 conv + bn"},
    {"model.scale", FL_CFG_DOUBLE, OFF(model.scale), 0, 0.25, 2.5, NULL, false,
     "pplcnet width scale: 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0 or 2.5 (PPLCNet_x0_25 ..)"},
    {"model.size", FL_CFG_ENUM, OFF(model.size), 0, 0, 0, "tiny|small|base", false,
     "pphgnet: PPHGNet_tiny, PPHGNet_small or PPHGNet_base"},
    {"model.embed_dim", FL_CFG_INT, OFF(model.embed_dim), 0, 1, 4096, NULL, false,
     "wide_deep, deepfm: values per row of the embedding table"},
    {"model.init", FL_CFG_ENUM, OFF(model.init), 0, 0, 0, "auto|torch", false,
     "how parameters start: auto, each model's own (the PaddleClas models Paddle's: "
     "KaimingNormal convolutions, Xavier fc; the others PyTorch's); torch, PyTorch's defaults "
     "for every layer (torchvision's fan-out He convolutions)"},
    {"model.pooling", FL_CFG_ENUM, OFF(model.pooling), 0, 0, 0, "sum|mean", false,
     "wide_deep, deepfm: how a slot's ids' rows become one vector"},

    {"data.type", FL_CFG_ENUM, OFF(data.type), 0, 0, 0,
     "random|teacher|shapes|cifar10|imagelist|mnist|criteo|ctr_synth", true,
     "random: the seed's gen_data (not learnable); teacher: labels from a random teacher net; "
     "shapes: synthetic images; cifar10: CIFAR-10 binary batches; imagelist: JPEG file lists; "
     "mnist: MNIST-format IDX files (gzip or plain), Fashion-MNIST by default; criteo: Criteo "
     "text files listed in data.train_list / data.val_list; ctr_synth: the synthetic CTR task "
     "(both for wide_deep and deepfm)"},
    {"data.features", FL_CFG_INT, OFF(data.features), 0, 1, 1e7, NULL, false,
     "features per sample"},
    {"data.classes", FL_CFG_INT, OFF(data.classes), 0, 2, 1e6, NULL, false, "number of classes"},
    {"data.train_size", FL_CFG_INT, OFF(data.train_size), 0, 1, 1e12, NULL, false,
     "training samples (ctr_synth: an epoch's samples, all workers together)"},
    {"data.val_size", FL_CFG_INT, OFF(data.val_size), 0, 0, 1e12, NULL, false,
     "validation samples (0: no validation)"},
    {"data.teacher_hidden", FL_CFG_INT, OFF(data.teacher_hidden), 0, 1, 1e6, NULL, false,
     "hidden units of the teacher network"},
    {"data.seed", FL_CFG_INT, OFF(data.seed), 0, 0, BIG, NULL, false,
     "seed of the synthetic data (and teacher), and of the image augmentation"},
    {"data.image_size", FL_CFG_INT, OFF(data.image_size), 0, 8, 256, NULL, false,
     "shapes: side of the square images"},
    {"data.root", FL_CFG_STRING, OFF(data.root), sizeof(((fl_train_config *)0)->data.root), 0, 0,
     NULL, false, "cifar10: directory of data_batch_*.bin; imagelist: root of the lists' paths; "
     "mnist: directory of {train,t10k}-*-ubyte[.gz] (empty: " FL_FASHION_MNIST_DIR ")"},
    {"data.train_list", FL_CFG_STRING, OFF(data.train_list),
     sizeof(((fl_train_config *)0)->data.train_list), 0, 0, NULL, false,
     "imagelist: training list, 'relative/path.jpeg label' per line; criteo: a list of data "
     "files, one path a line (relative to the list's directory)"},
    {"data.val_list", FL_CFG_STRING, OFF(data.val_list),
     sizeof(((fl_train_config *)0)->data.val_list), 0, 0, NULL, false,
     "imagelist, criteo: validation list (\"\": none)"},
    {"data.crop_size", FL_CFG_INT, OFF(data.crop_size), 0, 8, 4096, NULL, false,
     "imagelist: side of the network's input"},
    {"data.resize_short_size", FL_CFG_INT, OFF(data.resize_short_size), 0, 8, 8192, NULL, false,
     "imagelist evaluation: short side resized to this, then the centre crop"},
    {"data.lower_scale", FL_CFG_DOUBLE, OFF(data.lower_scale), 0, 0.001, 1, NULL, false,
     "imagelist training: smallest area fraction of the random resized crop"},
    {"data.lower_ratio", FL_CFG_DOUBLE, OFF(data.lower_ratio), 0, 0.01, 100, NULL, false,
     "imagelist training: smallest aspect ratio of the random resized crop"},
    {"data.upper_ratio", FL_CFG_DOUBLE, OFF(data.upper_ratio), 0, 0.01, 100, NULL, false,
     "imagelist training: largest aspect ratio of the random resized crop"},
    {"data.augment", FL_CFG_BOOL, OFF(data.augment), 0, 0, 0, NULL, false,
     "image sets: random crops and horizontal flips for training"},
    {"data.crop_padding", FL_CFG_INT, OFF(data.crop_padding), 0, 0, 64, NULL, false,
     "mnist training with data.augment: zero padding on each side before the random crop"},
    {"data.flip", FL_CFG_BOOL, OFF(data.flip), 0, 0, 0, NULL, false,
     "mnist training with data.augment: mirror left-right with probability 1/2"},
    {"data.bad_images", FL_CFG_ENUM, OFF(data.bad_images), 0, 0, 0, "skip|fail", false,
     "imagelist: a missing or corrupt image is skipped and counted, or fails naming it"},
    {"data.num_workers", FL_CFG_INT, OFF(data.num_workers), 0, 0, 256, NULL, false,
     "loader threads making samples (0: on the training thread)"},
    {"data.prefetch", FL_CFG_INT, OFF(data.prefetch), 0, 1, 1024, NULL, false,
     "batches the loader threads make ahead"},
    {"data.bad_lines", FL_CFG_ENUM, OFF(data.bad_lines), 0, 0, 0, "fail|skip", false,
     "criteo: a malformed line fails naming file:line, or is counted and skipped"},
    {"data.shard", FL_CFG_ENUM, OFF(data.shard), 0, 0, 0, "files|lines", false,
     "criteo: workers split the list by files (Paddle's get_file_shard; async and geo PS "
     "only) or by lines (every worker the same number of batches: collective and sync)"},
    {"data.missing_id", FL_CFG_BOOL, OFF(data.missing_id), 0, 0, 0, NULL, false,
     "criteo: an empty categorical field is its slot's 'missing' id (PaddleRec); false: an "
     "empty bag"},
    {"data.transform", FL_CFG_ENUM, OFF(data.transform), 0, 0, 0, "minmax|log|raw", false,
     "criteo, ctr_synth: how the 13 integer features become floats (PaddleRec's min-max)"},
    {"data.vocab", FL_CFG_INT, OFF(data.vocab), 0, 1, 4294967295.0, NULL, false,
     "ctr_synth: values per slot"},
    {"data.zipf", FL_CFG_DOUBLE, OFF(data.zipf), 0, 0.01, 10, NULL, false,
     "ctr_synth: popularity exponent of the slots' values (Zipf)"},
    {"data.max_ids", FL_CFG_INT, OFF(data.max_ids), 0, 1, 1000, NULL, false,
     "ctr_synth: each slot holds 1..max_ids ids"},
    {"data.ctr", FL_CFG_DOUBLE, OFF(data.ctr), 0, 0.001, 0.999, NULL, false,
     "ctr_synth: the positive rate the teacher is calibrated to"},

    {"optimizer.type", FL_CFG_ENUM, OFF(optimizer.type), 0, 0, 0, "sgd|momentum", false,
     "update rule"},
    {"optimizer.momentum", FL_CFG_DOUBLE, OFF(optimizer.momentum), 0, 0, 0.9999, NULL, false,
     "momentum factor mu"},
    {"optimizer.nesterov", FL_CFG_BOOL, OFF(optimizer.nesterov), 0, 0, 0, NULL, false,
     "Nesterov momentum"},
    {"optimizer.weight_decay", FL_CFG_DOUBLE, OFF(optimizer.weight_decay), 0, 0, 1, NULL, false,
     "L2 decay coefficient"},
    {"optimizer.label_smoothing", FL_CFG_DOUBLE, OFF(optimizer.label_smoothing), 0, 0, 0.999,
     NULL, false, "label smoothing epsilon of the cross-entropy (0: off)"},
    {"optimizer.clip_norm", FL_CFG_DOUBLE, OFF(optimizer.clip_norm), 0, 0, BIG, NULL, false,
     "clip gradients to this global norm; 0: off"},
    {"optimizer.lr.base", FL_CFG_DOUBLE, OFF(optimizer.lr.base), 0, 0, 100, NULL, false,
     "base learning rate"},
    {"optimizer.lr.schedule", FL_CFG_ENUM, OFF(optimizer.lr.schedule), 0, 0, 0,
     "constant|piecewise|cosine|polynomial", false, "learning-rate schedule"},
    {"optimizer.lr.boundaries", FL_CFG_INT_LIST, OFF(optimizer.lr.boundaries), 0, 1, BIG, NULL,
     false, "piecewise: steps where the rate changes"},
    {"optimizer.lr.values", FL_CFG_DOUBLE_LIST, OFF(optimizer.lr.values), 0, 0, 100, NULL, false,
     "piecewise: one more rate than boundaries"},
    {"optimizer.lr.decay_steps", FL_CFG_INT, OFF(optimizer.lr.decay_steps), 0, 0, BIG, NULL,
     false, "cosine/polynomial: steps to decay over; 0 = the whole run after warm-up"},
    {"optimizer.lr.end", FL_CFG_DOUBLE, OFF(optimizer.lr.end), 0, 0, 100, NULL, false,
     "cosine/polynomial: final rate"},
    {"optimizer.lr.power", FL_CFG_DOUBLE, OFF(optimizer.lr.power), 0, 1e-6, 100, NULL, false,
     "polynomial: exponent"},
    {"optimizer.lr.warmup_steps", FL_CFG_INT, OFF(optimizer.lr.warmup_steps), 0, 0, BIG, NULL,
     false, "linear warm-up steps"},
    {"optimizer.lr.warmup_start", FL_CFG_DOUBLE, OFF(optimizer.lr.warmup_start), 0, 0, 100, NULL,
     false, "rate at the first warm-up step"},

    {"train.batch_size", FL_CFG_INT, OFF(train.batch_size), 0, 1, 1e7, NULL, false,
     "samples per step per worker"},
    {"train.epochs", FL_CFG_INT, OFF(train.epochs), 0, 1, 1e6, NULL, false, "passes over the data"},
    {"train.max_steps", FL_CFG_INT, OFF(train.max_steps), 0, 0, BIG, NULL, false,
     "stop after this many steps; 0: run all epochs"},
    {"train.log_interval", FL_CFG_INT, OFF(train.log_interval), 0, 1, BIG, NULL, false,
     "steps between progress lines"},
    {"train.seed", FL_CFG_INT, OFF(train.seed), 0, 0, BIG, NULL, false,
     "seed of initialisation and shuffling"},
    {"train.threads", FL_CFG_INT, OFF(train.threads), 0, 0, 1024, NULL, false,
     "compute threads; 0: OpenMP's default (OMP_NUM_THREADS)"},
    {"train.backend", FL_CFG_ENUM, OFF(train.backend), 0, 0, 0, "auto|cpu|onednn|ref|cuda",
     false,
     "compute backend: onednn (oneDNN convolutions, NHWC), cpu (im2col + OpenBLAS), ref "
     "(plain loops), cuda (cuBLAS, cuDNN; train.device: gpu); auto: cuda on a GPU, else onednn "
     "where built, else cpu"},
    {"train.device", FL_CFG_ENUM, OFF(train.device), 0, 0, 0, "cpu|gpu", false,
     "where the network computes: gpu binds the GPU FLAGS_selected_gpus names (fleetrun "
     "--gpus sets it; 0 when unset) and trains with the cuda backend"},
    {"train.log_dir", FL_CFG_STRING, OFF(train.log_dir), sizeof(((fl_train_config *)0)->train.log_dir),
     0, 0, NULL, false, "directory for rank 0's metrics.jsonl; empty: none"},
    {"train.deterministic", FL_CFG_BOOL, OFF(train.deterministic), 0, 0, 0, NULL, false,
     "bit-repeatable runs; false lets a GPU backend choose its fastest kernels (cuDNN's "
     "non-deterministic backward algorithms, as PyTorch's default), whose last bits vary run to "
     "run"},
    {"train.eval_train", FL_CFG_BOOL, OFF(train.eval_train), 0, 0, 0, NULL, false,
     "after each epoch also evaluate over the whole training set (else the validation set "
     "only)"},

    {"sparse_optimizer.type", FL_CFG_ENUM, OFF(sparse_optimizer.type), 0, 0, 0,
     "sgd|adagrad|adam", false,
     "CTR: the rule of the sparse tables' rows, run where the rows live (servers, replicas); "
     "adagrad is Paddle's SparseAdaGradSGDRule"},
    {"sparse_optimizer.lr", FL_CFG_DOUBLE, OFF(sparse_optimizer.lr), 0, 0, 100, NULL, false,
     "CTR: the rows' learning rate (constant; the dense part follows optimizer.lr)"},
    {"sparse_optimizer.initial_g2sum", FL_CFG_DOUBLE, OFF(sparse_optimizer.initial_g2sum), 0,
     1e-6, 1e6, NULL, false, "CTR, adagrad: Paddle's initial_g2sum"},
    {"sparse_optimizer.initializer", FL_CFG_ENUM, OFF(sparse_optimizer.initializer), 0, 0, 0,
     "zero|uniform|normal", false,
     "CTR: a new embedding row's values (the wide table's rows start at zero)"},
    {"sparse_optimizer.init_range", FL_CFG_DOUBLE, OFF(sparse_optimizer.init_range), 0, 0, 100,
     NULL, false, "CTR: uniform in [-r, r), or normal with standard deviation r"},

    {"sparse_table.entry", FL_CFG_ENUM, OFF(sparse_table.entry), 0, 0, 0,
     "none|count|probability", false,
     "CTR: when an id gets rows in the sparse tables: none (at once), count (after "
     "sparse_table.entry_count shows; until then it reads as zeros), probability (a show "
     "creates it with sparse_table.entry_probability); Paddle's CountFilterEntry and "
     "ProbabilityEntry"},
    {"sparse_table.entry_count", FL_CFG_DOUBLE, OFF(sparse_table.entry_count), 0, 1, 1e9, NULL,
     false, "CTR, entry count: shows before an id gets its rows"},
    {"sparse_table.entry_probability", FL_CFG_DOUBLE, OFF(sparse_table.entry_probability), 0, 0,
     1, NULL, false, "CTR, entry probability: chance that a show of a new id creates its rows"},
    {"sparse_table.show_click_decay_rate", FL_CFG_DOUBLE, OFF(sparse_table.show_click_decay_rate),
     0, 0, 1, NULL, false,
     "CTR: a row's show and click counts are multiplied by it at each pass (each epoch's end); "
     "in (0, 1]"},
    {"sparse_table.delete_threshold", FL_CFG_DOUBLE, OFF(sparse_table.delete_threshold), 0, 0,
     1e9, NULL, false,
     "CTR: at each pass, rows whose score (show - click) * nonclk_coeff + click * click_coeff "
     "falls below it are removed; 0: none"},
    {"sparse_table.delete_after_unseen", FL_CFG_INT, OFF(sparse_table.delete_after_unseen), 0, 0,
     65535, NULL, false,
     "CTR: rows not shown in this many passes (epochs) are removed at a pass; 0: never "
     "(Paddle's delete_after_unseen_days)"},
    {"sparse_table.nonclk_coeff", FL_CFG_DOUBLE, OFF(sparse_table.nonclk_coeff), 0, 0, 1e6, NULL,
     false, "CTR: the weight of a show without a click in a row's score"},
    {"sparse_table.click_coeff", FL_CFG_DOUBLE, OFF(sparse_table.click_coeff), 0, 0, 1e6, NULL,
     false, "CTR: the weight of a click in a row's score"},

#define CKPT_STR(key, field, help)                                                         \
    {key, FL_CFG_STRING, OFF(checkpoint.field),                                             \
     sizeof(((fl_train_config *)0)->checkpoint.field), 0, 0, NULL, false, help}
    CKPT_STR("checkpoint.dir", dir,
             "directory for step_NNNNNNNN checkpoints and `latest`; empty: none"),
    {"checkpoint.save_interval", FL_CFG_INT, OFF(checkpoint.save_interval), 0, 0, BIG, NULL, false,
     "steps between checkpoints; 0: only the final one"},
    {"checkpoint.keep", FL_CFG_INT, OFF(checkpoint.keep), 0, 0, BIG, NULL, false,
     "checkpoints kept (the newest); 0: all"},
    {"checkpoint.per_rank", FL_CFG_BOOL, OFF(checkpoint.per_rank), 0, 0, 0, NULL, false,
     "every rank saves its own file (automatic where the state differs by rank)"},
    CKPT_STR("checkpoint.resume", resume,
             "checkpoint (step dir, or dir with `latest`) to resume from; auto: the newest in "
             "checkpoint.dir, or a fresh start when it has none; --resume DIR"),
    CKPT_STR("checkpoint.pretrained", pretrained,
             "weights (file or checkpoint) loaded by name where name and shape fit"),
    CKPT_STR("checkpoint.inference_model", inference_model,
             "rank 0 writes the network and its weights here at the end (for fleet-eval)"),
#undef CKPT_STR
};

/* after the strategy section */
static const fl_cfg_key comm_keys[] = {
    {"ps.server_threads", FL_CFG_INT, OFF(ps.server_threads), 0, 1, 256, NULL, false,
     "parameter-server mode: threads per server, each owning a shard of every table"},
    {"comm.backend", FL_CFG_ENUM, OFF(comm.backend), 0, 0, 0, "auto|tcp|mpi|nccl", false,
     "communicator: auto = mpi under mpirun, else tcp; nccl for GPU workers (docs/nccl.md)"},
    {"comm.encrypt", FL_CFG_ENUM, OFF(comm.encrypt), 0, 0, 0, "auto|off|on", false,
     "tcp frames through an AEAD (AES-256-GCM / ChaCha20-Poly1305): auto = between hosts, "
     "not on loopback or shared memory; FLEET_COMM_ENCRYPT=0|1 overrides (docs/comm.md)"},
};

static fl_cfg_key schema[MAX_KEYS];
static int nschema, strategy_first, nstrategy;
static pthread_once_t schema_once = PTHREAD_ONCE_INIT;

static void build_schema(void) {
    int nown = (int)(sizeof own_keys / sizeof own_keys[0]);
    int ncomm = (int)(sizeof comm_keys / sizeof comm_keys[0]);
    memcpy(schema, own_keys, sizeof own_keys);
    strategy_first = nown;
    nstrategy = fl_strategy_schema("strategy", OFF(strategy), schema + nown,
                                   MAX_KEYS - nown - ncomm);
    FL_ASSERT(nstrategy >= 0 && nstrategy <= MAX_KEYS - nown - ncomm);
    memcpy(schema + nown + nstrategy, comm_keys, sizeof comm_keys);
    nschema = nown + nstrategy + ncomm;
}

const fl_cfg_key *fl_train_schema(int *nkeys) {
    pthread_once(&schema_once, build_schema);
    *nkeys = nschema;
    return schema;
}

void fl_train_config_defaults(fl_train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model.type = FL_MODEL_MLP;
    cfg->ps.server_threads = 4;
    cfg->model.hidden.n = 2;
    cfg->model.hidden.v[0] = 128;
    cfg->model.hidden.v[1] = 128;
    cfg->model.activation = FL_ACT_TANH;
    cfg->model.scale = 1.0;
    cfg->data.type = FL_DATA_TEACHER;
    cfg->data.features = 32;
    cfg->data.classes = 2;
    cfg->data.train_size = 8192;
    cfg->data.val_size = 2048;
    cfg->data.teacher_hidden = 16;
    cfg->data.seed = 1;
    cfg->data.image_size = 32;
    cfg->data.crop_size = 224;
    cfg->data.resize_short_size = 256;
    cfg->data.lower_scale = 0.08;
    cfg->data.lower_ratio = 3.0 / 4.0;
    cfg->data.upper_ratio = 4.0 / 3.0;
    cfg->data.augment = true;
    cfg->data.crop_padding = 2;
    cfg->data.prefetch = 2;
    cfg->data.shard = 1; /* FL_CTR_SHARD_LINES */
    cfg->data.missing_id = true;
    cfg->data.vocab = 1000000;
    cfg->data.zipf = 1.1;
    cfg->data.max_ids = 1;
    cfg->data.ctr = 0.26;
    cfg->model.embed_dim = 10;
    cfg->sparse_optimizer.type = FL_SPARSE_OPT_ADAGRAD;
    cfg->sparse_optimizer.lr = 0.05;
    cfg->sparse_optimizer.initial_g2sum = 3.0;
    cfg->sparse_optimizer.initializer = 1; /* FL_PS_INIT_UNIFORM */
    cfg->sparse_optimizer.init_range = 0.05;
    cfg->sparse_table.entry = 0; /* FL_PS_ENTRY_NONE */
    cfg->sparse_table.entry_count = 1;
    cfg->sparse_table.entry_probability = 1;
    cfg->sparse_table.show_click_decay_rate = 1;
    cfg->sparse_table.nonclk_coeff = 0.1; /* Paddle's CtrAccessorParameter defaults */
    cfg->sparse_table.click_coeff = 1;
    cfg->train.eval_train = true;
    cfg->train.deterministic = true;
    cfg->optimizer.type = FL_OPTIM_SGD;
    cfg->optimizer.momentum = 0.9;
    cfg->optimizer.lr.base = 0.01; /* the seed's fluid.optimizer.SGD(learning_rate=0.01) */
    cfg->optimizer.lr.schedule = FL_LR_CONSTANT;
    cfg->optimizer.lr.power = 1.0;
    cfg->train.batch_size = 128;
    cfg->train.epochs = 1;
    cfg->train.log_interval = 10;
    cfg->train.seed = 0;
    cfg->checkpoint.keep = 3;
    fl_strategy_defaults(&cfg->strategy);
    cfg->comm.backend = FL_TRAIN_BACKEND_AUTO;
}

bool fl_train_ctr_lifecycle(const fl_train_config *cfg) {
    return cfg->sparse_table.entry != 0 || cfg->sparse_table.show_click_decay_rate < 1 ||
           cfg->sparse_table.delete_threshold > 0 || cfg->sparse_table.delete_after_unseen > 0;
}

/* The CTR trainer's own checks (docs/ctr.md "Training"). */
static int check_ctr(const fl_train_config *cfg) {
    const fl_strategy *s = &cfg->strategy;
    if (cfg->train.device == FL_TRAIN_DEVICE_GPU)
        return fl_fail(FL_ECONFIG, "train.device: gpu, but the CTR models compute on the CPU");
    if (cfg->data.type == FL_DATA_CRITEO && !cfg->data.train_list[0])
        return fl_fail(FL_ECONFIG, "data.train_list: needed by data.type criteo (a list of "
                                   "Criteo text files)");
    if (cfg->data.type == FL_DATA_CRITEO && cfg->data.shard == 0 && !s->a_sync)
        return fl_fail(FL_ECONFIG, "data.shard: files gives workers different numbers of "
                                   "batches, which collective and sync parameter-server "
                                   "training cannot take (every worker joins every step): use "
                                   "lines, or strategy.a_sync: true");
    if (s->gradient_merge)
        return fl_fail(FL_ECONFIG, "strategy.gradient_merge: not with the CTR models (their "
                                   "sparse rows are exchanged every step)");
    if (s->localsgd || s->adaptive_localsgd)
        return fl_fail(FL_ECONFIG, "strategy.%s: not with the CTR models: the sparse tables' "
                                   "replicas are kept identical every step; use "
                                   "parameter-server geo mode (strategy.a_sync_configs.k_steps)",
                       s->localsgd ? "localsgd" : "adaptive_localsgd");
    if (s->dgc)
        return fl_fail(FL_ECONFIG, "strategy.dgc: not with the CTR models");
    if (s->amp)
        return fl_fail(FL_ECONFIG, "strategy.amp: not with the CTR models (f32 on the CPU)");
    if (s->recompute)
        return fl_fail(FL_ECONFIG, "strategy.recompute: not with the CTR models");
    if (cfg->optimizer.label_smoothing > 0)
        return fl_fail(FL_ECONFIG, "optimizer.label_smoothing: not with the CTR models (sigmoid "
                                   "cross-entropy)");
    if (cfg->model.hidden.n > FL_CTR_MAX_HIDDEN)
        return fl_fail(FL_ECONFIG, "model.hidden: %d layers, a CTR model takes at most %d",
                       cfg->model.hidden.n, FL_CTR_MAX_HIDDEN);
    if (cfg->checkpoint.pretrained[0])
        return fl_fail(FL_ECONFIG, "checkpoint.pretrained: not with the CTR models");
    if (cfg->checkpoint.inference_model[0])
        return fl_fail(FL_ECONFIG, "checkpoint.inference_model: not with the CTR models (use "
                                   "the checkpoint itself with fleet-eval)");
    if (strcmp(cfg->checkpoint.resume, "auto") == 0 && !cfg->checkpoint.dir[0])
        return fl_fail(FL_ECONFIG, "checkpoint.resume: auto needs checkpoint.dir, where the "
                                   "checkpoints to resume from are saved");
    if (!(cfg->sparse_table.show_click_decay_rate > 0))
        return fl_fail(FL_ECONFIG, "sparse_table.show_click_decay_rate: 0 would forget every "
                                   "count at each pass; it is in (0, 1] (1: no decay)");
    if (s->a_sync && s->a_sync_configs.k_steps > 0 && fl_train_ctr_lifecycle(cfg))
        return fl_fail(FL_ECONFIG, "sparse_table: entry and shrink are not in geo mode (the "
                                   "workers train local copies of the tables that the servers' "
                                   "rules cannot reach, as Paddle's geo tables have no "
                                   "accessor): use sync or async, or the defaults");
    return FL_OK;
}

/* checks that involve more than one key; messages name the keys */
static int check_cross_keys(const fl_train_config *cfg) {
    static const char *const compute[] = {"auto", "cpu", "onednn", "ref", "cuda"};
    bool gpu = cfg->train.device == FL_TRAIN_DEVICE_GPU;
    if (gpu && cfg->train.backend != FL_TRAIN_COMPUTE_AUTO &&
        cfg->train.backend != FL_TRAIN_COMPUTE_CUDA)
        return fl_fail(FL_ECONFIG, "train.device: gpu needs train.backend auto or cuda, but it "
                                   "is %s, which computes on the CPU",
                       compute[cfg->train.backend]);
    if (!gpu && cfg->train.backend == FL_TRAIN_COMPUTE_CUDA)
        return fl_fail(FL_ECONFIG, "train.backend: cuda computes on a GPU: it needs "
                                   "train.device: gpu (train.device is cpu)");
    if (cfg->optimizer.type != FL_OPTIM_MOMENTUM && cfg->optimizer.nesterov)
        return fl_fail(FL_ECONFIG, "optimizer.nesterov: needs optimizer.type: momentum");
    if (cfg->optimizer.lr.schedule == FL_LR_PIECEWISE &&
        cfg->optimizer.lr.values.n != cfg->optimizer.lr.boundaries.n + 1)
        return fl_fail(FL_ECONFIG,
                       "optimizer.lr.values: %d values for %d boundaries (need boundaries + 1)",
                       cfg->optimizer.lr.values.n, cfg->optimizer.lr.boundaries.n);
    bool ctr_data = fl_data_is_ctr(cfg->data.type), ctr_model = fl_model_is_ctr(cfg->model.type);
    if (ctr_model && !ctr_data)
        return fl_fail(FL_ECONFIG, "model.type: %s is a CTR model: it needs CTR data (data.type "
                                   "criteo or ctr_synth)",
                       cfg->model.type == FL_MODEL_DEEPFM ? "deepfm" : "wide_deep");
    if (ctr_data && !ctr_model)
        return fl_fail(FL_ECONFIG, "data.type: %s is CTR data: it needs a CTR model (model.type "
                                   "wide_deep or deepfm)",
                       cfg->data.type == FL_DATA_CRITEO ? "criteo" : "ctr_synth");
    if (ctr_data)
        return check_ctr(cfg);
    bool images = cfg->data.type >= FL_DATA_SHAPES;
    /* an mlp flattens the small grey images of MNIST-format sets, as their baselines do */
    if (cfg->model.type == FL_MODEL_MLP && images && cfg->data.type != FL_DATA_MNIST)
        return fl_fail(FL_ECONFIG, "model.type: mlp takes feature vectors (data.type random, "
                                   "teacher or mnist); use resnet or resnet_cifar for images");
    if (cfg->model.type != FL_MODEL_MLP && !images)
        return fl_fail(FL_ECONFIG, "model.type: a convolutional network takes images (data.type "
                                   "shapes, cifar10, imagelist or mnist)");
    int64_t d = cfg->model.depth;
    if (cfg->model.type == FL_MODEL_RESNET && d && d != 18 && d != 34 && d != 50 && d != 101 &&
        d != 152)
        return fl_fail(FL_ECONFIG, "model.depth: %lld, but resnet has 18, 34, 50, 101 or 152 "
                                   "layers", (long long)d);
    if (cfg->model.type == FL_MODEL_PPLCNET && !fl_pplcnet_scale_known(cfg->model.scale))
        return fl_fail(FL_ECONFIG, "model.scale: %g, but PP-LCNet comes in scales 0.25, 0.35, "
                                   "0.5, 0.75, 1.0, 1.5, 2.0 and 2.5", cfg->model.scale);
    if (cfg->model.type == FL_MODEL_RESNET_CIFAR && d && (d < 8 || (d - 2) % 6 != 0))
        return fl_fail(FL_ECONFIG, "model.depth: %lld, but resnet_cifar has 6n + 2 layers "
                                   "(8, 14, 20, 32, 44, 56, 110, ...)", (long long)d);
    if (cfg->data.type == FL_DATA_CIFAR10 && cfg->data.classes != 10)
        return fl_fail(FL_ECONFIG, "data.classes: %lld, but CIFAR-10 has 10",
                       (long long)cfg->data.classes);
    if (cfg->data.type == FL_DATA_SHAPES && cfg->data.classes > 10)
        return fl_fail(FL_ECONFIG, "data.classes: %lld, but the shapes task draws at most 10",
                       (long long)cfg->data.classes);
    if ((cfg->data.type == FL_DATA_CIFAR10 || cfg->data.type == FL_DATA_IMAGELIST) &&
        !cfg->data.root[0])
        return fl_fail(FL_ECONFIG, "data.root: needed by data.type %s",
                       cfg->data.type == FL_DATA_CIFAR10 ? "cifar10" : "imagelist");
    if (cfg->data.type == FL_DATA_IMAGELIST && !cfg->data.train_list[0])
        return fl_fail(FL_ECONFIG, "data.train_list: needed by data.type imagelist");
    if (strcmp(cfg->checkpoint.resume, "auto") == 0 && !cfg->checkpoint.dir[0])
        return fl_fail(FL_ECONFIG, "checkpoint.resume: auto needs checkpoint.dir, where the "
                                   "checkpoints to resume from are saved");
    if (cfg->data.lower_ratio > cfg->data.upper_ratio)
        return fl_fail(FL_ECONFIG, "data.lower_ratio: %g is above data.upper_ratio %g",
                       cfg->data.lower_ratio, cfg->data.upper_ratio);
    if (cfg->model.input_size && cfg->data.type != FL_DATA_MNIST &&
        cfg->model.input_size != cfg->data.features)
        return fl_fail(FL_ECONFIG, "model.input_size: %lld, but data.features is %lld",
                       (long long)cfg->model.input_size, (long long)cfg->data.features);
    if (cfg->model.classes && cfg->model.classes != cfg->data.classes)
        return fl_fail(FL_ECONFIG, "model.classes: %lld, but data.classes is %lld",
                       (long long)cfg->model.classes, (long long)cfg->data.classes);
    return FL_OK;
}

/* Index of the longest schema key that a message starts with ("strategy.dgc: ..."), or -1. */
static int key_named(const fl_cfg_key *keys, int nkeys, const char *msg) {
    int best = -1;
    size_t best_len = 0;
    for (int k = 0; k < nkeys; k++) {
        size_t n = strlen(keys[k].path);
        if (n > best_len && strncmp(msg, keys[k].path, n) == 0 &&
            (msg[n] == ':' || msg[n] == ' ' || msg[n] == '\0')) {
            best = k;
            best_len = n;
        }
    }
    return best;
}

/* Prefixes the failed check's message with where the key it names was set: "file:LINE" or
 * "-o key=value"; else with the file, as the loader's own messages are. */
static int locate(int rc, const fl_cfg_key *keys, int nkeys, const int *lines, const char *path,
                  const char *const *overrides, int noverrides) {
    char msg[1024], where[384];
    snprintf(msg, sizeof msg, "%s", fl_errmsg());
    int k = key_named(keys, nkeys, msg);
    if (k >= 0 && fl_config_origin(path, lines[k], overrides, noverrides, keys[k].path, where,
                                   sizeof where) > 0)
        return fl_fail(rc, "%s: %s", where, msg);
    if (path)
        return fl_fail(rc, "%s: %s", path, msg);
    return fl_fail(rc, "%s", msg);
}

/* Whether key k holds different values in configs a and b. */
static bool differs(const fl_cfg_key *k, const fl_train_config *a, const fl_train_config *b) {
    const char *x = (const char *)a + k->offset, *y = (const char *)b + k->offset;
    switch (k->type) {
    case FL_CFG_BOOL:
        return *(const bool *)x != *(const bool *)y;
    case FL_CFG_INT:
        return *(const int64_t *)x != *(const int64_t *)y;
    case FL_CFG_DOUBLE:
        return *(const double *)x != *(const double *)y;
    case FL_CFG_STRING:
        return strncmp(x, y, k->size) != 0;
    case FL_CFG_ENUM:
        return *(const int *)x != *(const int *)y;
    case FL_CFG_INT_LIST: {
        const fl_cfg_int_list *p = (const fl_cfg_int_list *)x, *q = (const fl_cfg_int_list *)y;
        return p->n != q->n || memcmp(p->v, q->v, (size_t)p->n * sizeof p->v[0]) != 0;
    }
    case FL_CFG_DOUBLE_LIST: {
        const fl_cfg_double_list *p = (const fl_cfg_double_list *)x;
        const fl_cfg_double_list *q = (const fl_cfg_double_list *)y;
        if (p->n != q->n)
            return true;
        for (int i = 0; i < p->n; i++)
            if (p->v[i] != q->v[i])
                return true;
        return false;
    }
    }
    return true;
}

/* strategy.recompute: the checkpoints name layers of the configured model (its layer names do
 * not depend on the data, so a stand-in sample shape will do) */
static int check_checkpoints(const fl_train_config *cfg) {
    if (!cfg->strategy.recompute)
        return FL_OK;
    const char *spec = cfg->strategy.recompute_configs.checkpoints;
    if (!spec[strspn(spec, " \t,")])
        return fl_fail(FL_ECONFIG, "strategy.recompute: needs "
                                   "strategy.recompute_configs.checkpoints, the layers whose "
                                   "outputs are kept (fleet-train --print-model lists them), "
                                   "or auto");
    int64_t features = cfg->model.input_size ? cfg->model.input_size
                       : cfg->data.type == FL_DATA_MNIST ? 784 : cfg->data.features;
    fl_dataset stand_in = {.ndim = 3, .shape = {3, 32, 32}, .sample_numel = features};
    fl_net *net = fl_train_make_model(cfg, &stand_in);
    if (!net)
        return FL_OK; /* the model's own error is said where it is built */
    int rc = fl_net_set_recompute(net, spec);
    fl_net_free(net);
    return rc < 0 ? fl_fail_prefix(FL_ECONFIG, "strategy.recompute_configs.checkpoints") : FL_OK;
}

int fl_train_config_load(fl_train_config *cfg, const char *path, const char *const *overrides,
                         int noverrides) {
    int nkeys;
    const fl_cfg_key *keys = fl_train_schema(&nkeys);
    bool was_set[MAX_KEYS] = {0};
    int lines[MAX_KEYS] = {0}; /* where the file set each key: what locate names */
    fl_train_config defaults;
    fl_train_config_defaults(&defaults);
    *cfg = defaults;
    FL_TRY(fl_config_load_lines(path, overrides, noverrides, keys, nkeys, cfg, was_set, lines));
    /* a CTR model's deep part defaults to Paddle's quick start, 400-400-400 */
    for (int k = 0; k < nkeys; k++)
        if (fl_model_is_ctr(cfg->model.type) && strcmp(keys[k].path, "model.hidden") == 0 &&
            !was_set[k]) {
            cfg->model.hidden.n = 3;
            cfg->model.hidden.v[0] = cfg->model.hidden.v[1] = cfg->model.hidden.v[2] = 400;
        }
    /* a strategy key counts as set when it asks for something other than its default, so that
     * --print-config's output (every key, not-implemented features at their defaults) reads
     * back; a not-implemented feature configured away from its defaults is still refused */
    for (int k = strategy_first; k < strategy_first + nstrategy; k++)
        was_set[k] = was_set[k] && differs(&keys[k], cfg, &defaults);
    int rc = check_cross_keys(cfg);
    if (rc >= 0)
        rc = fl_strategy_check(&cfg->strategy, was_set + strategy_first,
                               (fl_optim_type)cfg->optimizer.type);
    if (rc >= 0)
        rc = check_checkpoints(cfg);
    if (rc < 0)
        return locate(rc, keys, nkeys, lines, path, overrides, noverrides);
    return FL_OK;
}
