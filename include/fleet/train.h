/* train.h - the trainer behind fleet-train: a configuration (the YAML schema), and a loop that
 * builds the model, data, optimizer and schedule from it and trains, on one worker or many.
 *
 * The configuration mirrors the seed documents' recipe (model, data, optimizer with its
 * learning-rate schedule, training length) plus the distributed strategy and the communicator
 * backend. Every key, its type, range and default is in one table, fl_train_schema(), which is
 * also what refuses unknown keys and bad values. docs/config.md lists the keys. */
#ifndef FLEET_TRAIN_H
#define FLEET_TRAIN_H

#include "fleet/backend.h"
#include "fleet/config.h"
#include "fleet/strategy.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* train.backend: the compute backend (fl_backend_by_name; auto = onednn where built, cuda
 * with train.device: gpu) */
typedef enum {
    FL_TRAIN_COMPUTE_AUTO = 0,
    FL_TRAIN_COMPUTE_CPU,
    FL_TRAIN_COMPUTE_ONEDNN,
    FL_TRAIN_COMPUTE_REF,
    FL_TRAIN_COMPUTE_CUDA
} fl_train_compute;

/* train.device: where the network computes. gpu: the cuda backend on the GPU that
 * FLAGS_selected_gpus names (its first entry, as Paddle takes it; 0 when unset) */
typedef enum { FL_TRAIN_DEVICE_CPU = 0, FL_TRAIN_DEVICE_GPU = 1 } fl_train_device;

typedef enum {
    FL_MODEL_MLP = 0,
    FL_MODEL_RESNET = 1,
    FL_MODEL_RESNET_CIFAR = 2,
    FL_MODEL_PPLCNET = 3, /* PaddleClas's PP-LCNet (fl_model_pplcnet) */
    FL_MODEL_PPHGNET = 4, /* PaddleClas's PP-HGNet (fl_model_pphgnet) */
    FL_MODEL_PPLCNETV2 = 5, /* PaddleClas's PPLCNetV2_base (fl_model_pplcnetv2) */
    FL_MODEL_WIDE_DEEP = 6, /* CTR: wide&deep (sparse.h fl_ctr_model), CTR data only */
    FL_MODEL_DEEPFM = 7,    /* CTR: DeepFM */
} fl_model_type;
typedef enum { FL_HGNET_TINY = 0, FL_HGNET_SMALL = 1, FL_HGNET_BASE = 2 } fl_hgnet_size;
typedef enum {
    FL_DATA_RANDOM = 0,
    FL_DATA_TEACHER = 1,
    FL_DATA_SHAPES = 2,    /* synthetic images (fl_dataset_shapes_create) */
    FL_DATA_CIFAR10 = 3,   /* CIFAR-10 binary batches in data.root */
    FL_DATA_IMAGELIST = 4, /* seed 002's file lists of JPEGs under data.root */
    FL_DATA_MNIST = 5,     /* MNIST-format IDX files (Fashion-MNIST by default) in data.root */
    FL_DATA_CRITEO = 6,    /* CTR: Criteo text files (ctr.h's reader) over data.train_list */
    FL_DATA_CTR_SYNTH = 7, /* CTR: the synthetic task with a hidden logistic teacher */
} fl_data_type;
/* Whether a data type / model type is a CTR one (the CTR trainer, docs/ctr.md "Training"). */
static inline bool fl_data_is_ctr(int type) {
    return type == FL_DATA_CRITEO || type == FL_DATA_CTR_SYNTH;
}
static inline bool fl_model_is_ctr(int type) {
    return type == FL_MODEL_WIDE_DEEP || type == FL_MODEL_DEEPFM;
}
/* sparse_optimizer.type: the rule the sparse tables run (fl_ps_rule_type's sparse ones) */
typedef enum { FL_SPARSE_OPT_SGD = 0, FL_SPARSE_OPT_ADAGRAD = 1, FL_SPARSE_OPT_ADAM = 2 }
    fl_sparse_opt_type;
typedef enum { FL_SHORTCUT_A = 0, FL_SHORTCUT_B = 1 } fl_shortcut_type;
/* model.init: auto is each model's own initialisation (Paddle's for the PaddleClas models,
 * PyTorch's for the others); torch gives every layer PyTorch's (fl_net_init_torch) */
typedef enum { FL_MODEL_INIT_AUTO = 0, FL_MODEL_INIT_TORCH = 1 } fl_model_init;
/* comm.backend: auto is mpi when started by mpirun (and mpi is built), else tcp; nccl only by
 * name (GPU workers, docs/nccl.md) */
typedef enum {
    FL_TRAIN_BACKEND_AUTO = 0,
    FL_TRAIN_BACKEND_TCP = 1,
    FL_TRAIN_BACKEND_MPI = 2,
    FL_TRAIN_BACKEND_NCCL = 3,
} fl_train_backend;

typedef struct fl_train_config {
    struct {
        int             type;       /* fl_model_type */
        int64_t         input_size; /* 0: the dataset's feature count */
        fl_cfg_int_list hidden;
        int             activation; /* fl_act */
        int64_t         classes;    /* 0: the dataset's class count */
        int64_t         depth;      /* resnet: 18..152 (0: 50); resnet_cifar: 6n+2 (0: 20) */
        int             shortcut;   /* resnet_cifar: fl_shortcut_type */
        double          scale;      /* pplcnet: PaddleClas's width scale (default 1.0) */
        int             init;       /* fl_model_init: the model's own, or PyTorch's for all */
        int             size;       /* pphgnet: fl_hgnet_size (default tiny) */
        int64_t         embed_dim;  /* CTR: the embedding table's row width (10) */
        int             pooling;    /* CTR: fl_sparse_pool of the slots' bags (sum) */
    } model;
    struct {
        int      type;       /* fl_data_type */
        int64_t  features;
        int64_t  classes;
        int64_t  train_size;
        int64_t  val_size;
        int64_t  teacher_hidden;
        int64_t  seed;       /* the dataset's (teacher's) seed */
        int64_t  image_size; /* shapes: side of the square images */
        char     root[256];  /* cifar10: the batches' directory; imagelist: the images' root;
                              * mnist: the IDX files' directory ("": Fashion-MNIST's) */
        char     train_list[256]; /* imagelist */
        char     val_list[256];   /* imagelist; "" for none */
        int64_t  crop_size;          /* imagelist */
        int64_t  resize_short_size;  /* imagelist, evaluation */
        double   lower_scale, lower_ratio, upper_ratio; /* imagelist, training */
        bool     augment;    /* image sets: random crops and flips when training */
        int64_t  crop_padding; /* mnist: zero padding of the random crop */
        bool     flip;         /* mnist: random horizontal flips when augmenting */
        int      bad_images; /* fl_bad_image_policy */
        int64_t  num_workers; /* loader threads (0: batches made on the training thread) */
        int64_t  prefetch;    /* batches made ahead */
        /* CTR data (docs/ctr.md): criteo reads train_list / val_list (file lists) */
        int      bad_lines;   /* criteo: fl_bad_lines_policy */
        int      shard;       /* criteo: fl_ctr_shard (lines by default) */
        bool     missing_id;  /* criteo: an empty field is the slot's "missing" id (true) */
        int      transform;   /* criteo, ctr_synth: fl_ctr_dense_transform (minmax) */
        int64_t  vocab;       /* ctr_synth: values per slot */
        double   zipf;        /* ctr_synth: popularity exponent */
        int64_t  max_ids;     /* ctr_synth: ids per slot at most */
        double   ctr;         /* ctr_synth: the positive rate */
    } data;
    struct {                  /* CTR: the sparse tables' own rule (Paddle's table accessor) */
        int     type;         /* fl_sparse_opt_type (adagrad) */
        double  lr;           /* constant learning rate of the rows */
        double  initial_g2sum; /* adagrad */
        int     initializer;  /* embedding rows: fl_ps_init_type (uniform); wide rows: zeros */
        double  init_range;   /* uniform in [-r, r); normal with std r */
    } sparse_optimizer;
    struct {                  /* CTR: the sparse tables' life cycle (Paddle's CtrCommonAccessor
                               * and entry attributes; fl_ps_sparse_opts, docs/ctr.md) */
        int     entry;        /* fl_ps_entry_type: none, count, probability */
        double  entry_count;  /* count: shows before an id gets a row (>= 1) */
        double  entry_probability; /* probability: of a push creating the row */
        double  show_click_decay_rate; /* per pass, in (0, 1]; a pass ends each epoch */
        double  delete_threshold;      /* rows scoring below it go at a pass */
        int64_t delete_after_unseen;   /* passes without a show before a row goes; 0 never */
        double  nonclk_coeff, click_coeff; /* the score's weights */
    } sparse_table;
    struct {
        int    type;         /* fl_optim_type */
        double momentum;
        bool   nesterov;
        double weight_decay;
        double clip_norm;
        double label_smoothing; /* epsilon of the smoothed cross-entropy */
        struct {
            double             base;
            int                schedule; /* fl_lr_type */
            fl_cfg_int_list    boundaries;
            fl_cfg_double_list values;
            int64_t            decay_steps; /* 0: the whole run */
            double             end;
            double             power;
            int64_t            warmup_steps;
            double             warmup_start;
        } lr;
    } optimizer;
    struct {
        int64_t batch_size;   /* per worker */
        int64_t epochs;
        int64_t max_steps;    /* > 0: stop after this many steps */
        int64_t log_interval; /* steps between log lines */
        int64_t seed;         /* initialisation and shuffling */
        int64_t threads;      /* compute threads; 0: leave OpenMP's default */
        int     backend;      /* fl_train_compute: the compute backend (docs/backends.md) */
        int     device;       /* fl_train_device */
        char    log_dir[256]; /* rank 0 writes metrics.jsonl here; "" for none */
        bool    eval_train;   /* also evaluate over the whole training set after each epoch */
        bool    deterministic; /* bit-repeatable runs (default); false: the backend's fastest
                                * kernels (backend.h set_deterministic) */
    } train;
    struct {                    /* docs/checkpoint.md */
        char    dir[256];       /* step-named checkpoints here; "" for none */
        int64_t save_interval;  /* steps between saves; 0: only the final save */
        int64_t keep;           /* the newest K checkpoints kept; 0: all */
        bool    per_rank;       /* one file per rank (forced where the state differs by rank) */
        char    resume[256];    /* restore everything from this checkpoint (--resume) */
        char    pretrained[256]; /* weights taken by name where they fit (seed 002's if_exist) */
        char    inference_model[256]; /* rank 0 writes network + weights here at the end */
    } checkpoint;
    fl_strategy strategy;       /* the `strategy:` section (fl_strategy_schema) */
    struct {                    /* parameter-server mode (docs/ps.md): a server's own knobs */
        int64_t server_threads; /* ps.server_threads: shard threads per server (default 4) */
    } ps;
    struct {
        int backend;            /* fl_train_backend */
        int encrypt;            /* comm.encrypt: 0 auto (between hosts), 1 off, 2 on
                                   (FL_COMM_ENCRYPT_*); FLEET_COMM_ENCRYPT wins */
    } comm;
} fl_train_config;

/* The schema of every key, in documentation order: the trainer's own keys, then the
 * `strategy.` keys of fl_strategy_schema, then `comm.backend` and `comm.encrypt`. Built once (thread-safe); the
 * array lives as long as the program. */
const fl_cfg_key *fl_train_schema(int *nkeys);
/* Fills cfg with the defaults of every key. */
void fl_train_config_defaults(fl_train_config *cfg);
/* Whether cfg's sparse_table keys ask for a life cycle beyond keeping every row: an entry
 * rule, a decay below 1, a delete threshold or delete_after_unseen. The CTR trainer then counts
 * shows and clicks and runs a pass at each epoch's end. */
bool fl_train_ctr_lifecycle(const fl_train_config *cfg);
/* Defaults, then the YAML file at path (may be NULL), then overrides "a.b=value"; then the
 * cross-key checks (e.g. piecewise values = boundaries + 1) and fl_strategy_check (strategy
 * keys that are set but not implemented, refused combinations). 0 or FL_ECONFIG/FL_EIO with a
 * message naming the key and where it was set ("file.yaml:LINE" or "-o key=value"). */
int fl_train_config_load(fl_train_config *cfg, const char *path, const char *const *overrides,
                         int noverrides);

/* What a finished run reports (also written to metrics.jsonl); the same on every rank. */
typedef struct {
    int64_t steps;        /* optimizer updates taken (with gradient_merge: k micro-batches each) */
    double  last_loss;    /* mean training loss over the last log interval, all ranks */
    double  train_loss;   /* full pass over the training set, evaluation mode */
    double  train_acc1;
    double  val_loss;     /* full pass over the validation set (0 samples: NaN) */
    double  val_acc1;
    double  samples_per_s; /* global: samples of all ranks per second */
    bool    started;      /* training began (set-up and resume succeeded): a failure after this
                           * is one of the run, before it one of the job (config, data, model) */
} fl_train_result;

/* Trains as cfg says as one worker of the job the environment describes (fleetrun, mpirun, or
 * none: a job of one; comm.backend picks the communicator). Each rank trains on its shard of
 * every global batch of world x batch_size samples and the distributed optimizer keeps the
 * replicas in step. Every rank prints progress lines to stdout, with loss and accuracy
 * averaged over the ranks, comm = megabytes this rank sent since the previous line, ips
 * = samples of all ranks per second, act = the network's planned activation memory
 * (fl_net_activation_bytes) and peak = the process's peak resident memory, in MB:
 *   worker_index: 0, epoch 0, step 10, loss 0.6931, acc1 0.5000, lr 0.1000, ips 812.4 img/s,
 *   comm 0.3 MB, act 0.4 MB, peak 12 MB
 * followed, on a backend that counts its memory (memory_peak: the GPU's), by
 * ", dev_peak N MB": the most device memory held at once so far. With train.device: gpu the
 * GPU is bound first (an error before training, naming train.device, where there is none).
 * and evaluation lines (sharded over the ranks, the same numbers on each) after each epoch.
 * Rank 0 alone writes metrics.jsonl. A dead peer fails the call with a message naming it.
 * result may be NULL. */
int fl_train_run(const fl_train_config *cfg, fl_train_result *result);

/* The backend train.device: gpu trains on, in place of fl_backend_cuda(): a seam for tests,
 * which install a guarded stand-in for a device (tests/support/devsim.h) so that every device
 * path of the trainer and of fl_infer_run runs on a machine without a GPU. NULL restores
 * cuda. Process-wide; call it before anything is built (not thread-safe). */
void fl_train_set_gpu_backend(const fl_backend *be);

/* Prints the model cfg describes, built for the training data at train.batch_size
 * (fl_net_summary: layer names, types, output shapes, parameters; with strategy.recompute which
 * outputs are checkpoints, kept or recomputed; the activation memory), without training. */
int fl_train_print_model(const fl_train_config *cfg, FILE *out);

/* fleet-ckpt merge-ps (docs/checkpoint.md, "Parameter-server jobs"): the model a
 * parameter-server job held at one step, in one safetensors file that fleet-eval and
 * checkpoint.pretrained read. The workers' checkpoint of the step in ckpt_dir (rank 0's file)
 * is the template: it gives the network (rebuilt from its fleet.config on the ref backend) and
 * the values the servers do not hold (batch-norm statistics); the trainable values come from
 * the servers' dense table 0 (fl_ps_snapshot_load: the network's flat trainable block), which
 * is the truth in async and geo modes. Other dense tables go in as "ps.dense.<t>.values"
 * (numel) and sparse tables as "ps.sparse.<t>.ids" (I64, rows ascending) and
 * "ps.sparse.<t>.values" (rows, dim), with their initializer in metadata
 * "ps.sparse.<t>.init". The file is an inference model (fleet.format inference_model,
 * fleet.network, the template's fleet.config, fleet.step, fleet.ps.*), written atomically.
 * step -1: the step ckpt_dir's `latest` names (without one, the servers' pointers'). Fails,
 * writing nothing, with a message naming the file: no workers' checkpoint of the step,
 * a server's shards missing or damaged (fl_ps_snapshot_load), no dense table 0, or one whose
 * size is not the network's trainable count. rep (may be NULL) says what was merged. */
typedef struct {
    int64_t step;
    int     servers;
    int64_t trainable;       /* values taken from dense table 0 */
    int64_t version_min, version_max; /* updates the servers had applied to it */
    int     dense_tables, sparse_tables; /* besides table 0 */
    int64_t sparse_rows;
    char    template_path[1100];
} fl_train_ps_merge_report;
int fl_train_ps_merge(const char *ckpt_dir, int64_t step, const char *out,
                      fl_train_ps_merge_report *rep);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_TRAIN_H */
