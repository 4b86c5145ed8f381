/* train_impl.h - what the trainer's files share: the trainer's state, built once by
 * train_setup.c, and the evaluation and logging steps the loop in trainer.c calls.
 * Private to src/train/. */
#ifndef FLEET_TRAIN_IMPL_H
#define FLEET_TRAIN_IMPL_H

#include "fleet/fleet.h"
#include "fleet/train.h"

#include <stdbool.h>
#include <stdint.h>

/* A batch where the network computes (train_device.c): the loader's batches are host memory;
 * on a device backend they are copied into x and labels, the loss's buffer probs is the
 * backend's memory, and the logits come back into host memory for accuracy. On the CPU
 * backends (host_memory) nothing is copied: x and labels are NULL and the loader's own batch
 * is used. */
typedef struct {
    const fl_backend *k;
    int64_t  max_batch, sample, classes; /* sample: values per sample */
    void    *x;       /* (max_batch, sample) f32, k's memory; NULL on the CPU backends */
    int32_t *labels;  /* (max_batch) k's memory; NULL on the CPU backends */
    float   *probs;   /* (max_batch, classes) k's memory: softmax, then its gradient */
    float   *logits;  /* (max_batch, classes) host copy of the logits; NULL on the CPU */
} fl_train_batch;

/* Plans b for batches of up to max_batch samples of `sample` values on k. FL_ENOMEM. */
int  fl_train_batch_init(fl_train_batch *b, const fl_backend *k, int64_t max_batch,
                         int64_t sample, int64_t classes);
void fl_train_batch_clear(fl_train_batch *b);
/* The loader's batch (x, labels: host memory) where k computes: *dx and *dlabels are x and
 * labels themselves on the CPU backends, else copies in b. On a device the labels are checked
 * first (fl_labels_check: the loss cannot read them there); labels NULL: none to copy (an
 * unlabelled evaluation). *probs views b's loss buffer for the batch's rows. */
int  fl_train_batch_put(fl_train_batch *b, const fl_tensor *x, const int32_t *labels,
                        fl_tensor *dx, const int32_t **dlabels, fl_tensor *probs);
/* *probs views b's loss buffer for rows samples. */
void fl_train_batch_probs(fl_train_batch *b, int64_t rows, fl_tensor *probs);
/* The network's logits in host memory, for accuracy (fl_topk_correct): logits themselves on
 * the CPU backends, else a copy in b viewed by *view. */
const fl_tensor *fl_train_batch_logits(fl_train_batch *b, const fl_tensor *logits,
                                       fl_tensor *view);

/* The training batches where the network computes (train_input.c). On a device the loader's
 * next batch is uploaded in a stream of its own (from page-locked memory) while the current
 * step computes, one batch ahead; on the CPU backends the loader's batch is used in place. */
typedef struct {
    float      *hx;       /* (max_batch, sample) page-locked host memory */
    int32_t    *hlabels;  /* (max_batch) page-locked; the accuracy reads them */
    void       *x;        /* (max_batch, sample) f32, the backend's memory */
    int32_t    *labels;   /* (max_batch) the backend's memory */
    fl_event   *landed;   /* the upload's end in the input's stream */
    fl_tensor   view;     /* the batch's shape over x */
} fl_train_input_slot;

typedef struct {
    const fl_backend   *k;
    fl_prefetch        *loader;
    int64_t             max_batch, sample, classes;
    fl_train_input_slot slot[2];
    fl_stream          *up;       /* the uploads */
    fl_event           *computed; /* the compute stream's point an upload waits for */
    int                 next;     /* the slot of the next batch */
    bool                ahead;    /* it is staged already */
    int                 held_rc;  /* 1, or the loader's end (0) or error met looking ahead */
} fl_train_input;

/* Plans in for loader's batches of up to max_batch samples on k (two device batches and their
 * page-locked host copies on a device). FL_ENOMEM. */
int  fl_train_input_init(fl_train_input *in, const fl_backend *k, fl_prefetch *loader,
                         int64_t max_batch, int64_t sample, int64_t classes);
void fl_train_input_clear(fl_train_input *in);
/* fl_prefetch_seek, dropping the batch staged ahead. */
int  fl_train_input_seek(fl_train_input *in, int64_t epoch, int64_t batch);
/* As fl_prefetch_next: 1 with the next batch, x and *labels in k's memory (the compute stream
 * waits for their upload), *hlabels the same labels in host memory (checked with
 * fl_labels_check on a device), valid until the call after next; 0 at the end of the epoch;
 * a negative status with the loader's message. */
int  fl_train_input_next(fl_train_input *in, fl_tensor *x, const int32_t **labels,
                         const int32_t **hlabels);

/* The backend cfg's train.device and train.backend name; with train.device: gpu the GPU
 * FLAGS_selected_gpus names is bound first, once per process (device_bind). NULL with a
 * message naming train.device (no GPU backend, no such GPU) or train.backend. */
const fl_backend *fl_train_compute_backend(const fl_train_config *cfg);

/* Host stand-ins for the tensors of a checkpoint list that live in a device's memory
 * (fl_tensor_on_host false): fl_train_stage_create puts a host copy in place of each such
 * p[i]; pull copies their values from the device, push writes them back. Nothing is copied
 * where every tensor is host memory (the CPU backends). */
typedef struct {
    fl_param **orig;   /* (n) the tensors replaced, NULL where p[i] was kept */
    fl_param  *copy;   /* (n) their host copies */
    char      *mem;
    int        n;
} fl_train_stage;
int  fl_train_stage_create(fl_train_stage *h, fl_param **p, int n);
void fl_train_stage_pull(const fl_train_stage *h, const fl_backend *k);
void fl_train_stage_push(const fl_train_stage *h, const fl_backend *k);
void fl_train_stage_free(fl_train_stage *h);

typedef struct {
    fl_fleet      *fleet;
    int            rank, world;
    fl_dataset    *train_set, *val_set;
    fl_prefetch   *loader;    /* this rank's shard of each global batch (data.num_workers) */
    fl_net        *net;
    fl_optim      *opt;
    fl_dist_optim *dopt;      /* wraps opt; replaces backward + step */
    fl_ps         *ps;        /* parameter-server mode: this worker's client, else NULL */
    fl_train_batch batch;     /* the batch on the network's backend, its loss buffer */
    fl_train_input input;     /* the training batches on it, one uploaded ahead on a device */
    void          *hbuffers;  /* host staging of the persistable buffers for their average
                               * (a device backend with several ranks only) */
    fl_metrics    *metrics;   /* rank 0 only; NULL elsewhere or without train.log_dir */
    fl_lr_schedule sched;     /* indexed by optimizer update */
    int64_t        merge_k;   /* micro-batches (loader batches) per optimizer update */
    int64_t        total_steps; /* optimizer updates the run will take */
    int            base_world; /* workers the run began with (the checkpoints carry it) */
    double         lr_scale;  /* world / base_world: the linear scaling rule (docs/elastic.md) */
    bool           resumed_in_dir; /* the resumed checkpoint is one of checkpoint.dir's */
    double         label_smoothing; /* optimizer.label_smoothing */
    double         start_time; /* fl_now() when training began: metrics' "time" */
} trainer;

/* What happened since the previous progress line, on this rank. */
typedef struct {
    double   loss_sum;   /* sum over samples of the training loss */
    int64_t  correct;
    int64_t  samples;
    double   start;      /* fl_now() at the previous line (moved on by evaluations) */
    int64_t  updates;    /* optimizer updates since the previous line */
    uint64_t bytes_sent; /* fl_dist_bytes_sent at the previous line */
} train_window;

/* Builds everything (fleet first) from cfg; on failure what was built is left for
 * fl_train_teardown. */
int  fl_train_setup(trainer *t, const fl_train_config *cfg);
void fl_train_teardown(trainer *t);

/* Averages the ranks' persistable buffers (batch-norm running statistics), then evaluates the
 * model over the whole training (train.eval_train) and validation sets, sharded over the ranks
 * with the sums all-reduced (every rank gets the same numbers), fills res's train_/val_ fields,
 * prints the eval line (and the images skipped so far) and writes its metrics record.
 * Collective: every rank calls it. */
int fl_train_eval(trainer *t, const fl_train_config *cfg, int64_t epoch, int64_t step,
                  fl_train_result *res);

/* Starts a window at the current time and byte count. */
void fl_train_window_reset(trainer *t, train_window *w);
/* Averages the window over the ranks (one allreduce of three numbers), prints the progress
 * line, writes its metrics record, sets res->last_loss and starts the next window.
 * Collective: every rank calls it at the same step. */
int fl_train_log_progress(trainer *t, train_window *w, int64_t epoch, int64_t step, double lr,
                          fl_train_result *res);

/* Where the loop stands: optimizer updates done, the epoch, and the loader batches of that
 * epoch already consumed (the data position a resumed run seeks to). */
typedef struct {
    int64_t step, epoch, batch;
} train_pos;

/* The dataset (split 0 train, 1 validation) and the untrained model cfg describes for samples
 * shaped as ds's (borrowed: the mlp's input features, the resnets' input channels); the same
 * constructors fleet-train and fleet-eval build from (train_model.c). train_set (borrowed, or
 * NULL): the training split already made, whose statistics normalise MNIST's test split (NULL:
 * read from the training images). NULL with fl_errmsg. */
fl_dataset *fl_train_make_dataset(const fl_train_config *cfg, int split,
                                  const fl_dataset *train_set);
fl_net     *fl_train_make_model(const fl_train_config *cfg, const fl_dataset *ds);
/* Whether cfg's model has a re-parameterised inference form (pplcnetv2: nn.h's
 * fl_model_pplcnetv2_fused), and that form, built as fl_train_make_model builds the training
 * form (FL_ECONFIG for a model without one). Its parameters come from the trained network
 * (fl_pplcnetv2_fuse). */
bool        fl_train_has_fused(const fl_train_config *cfg);
fl_net     *fl_train_make_fused_model(const fl_train_config *cfg, const fl_dataset *ds);
/* Whether cfg has a validation set (val_size > 0, a val_list, CIFAR-10's test batch). */
bool        fl_train_has_val(const fl_train_config *cfg);

/* train_checkpoint.c. Restores everything from checkpoint.resume (then *pos is where the
 * checkpoint stood) or takes checkpoint.pretrained's weights by name (then *pos is zero).
 * Collective. */
int  fl_train_ckpt_restore(trainer *t, const fl_train_config *cfg, train_pos *pos);
/* Where the run will resume from, without loading anything: *step the step of the checkpoint
 * checkpoint.resume names (auto: checkpoint.dir's `latest`), -1 for a fresh start (no resume,
 * or auto with nothing saved yet), and root[cap] the directory holding that step directory.
 * What the parameter servers load and the workers declare to them (train_ps.c). FL_EIO or
 * FL_EFORMAT naming the path when checkpoint.resume names no checkpoint. */
int  fl_train_ckpt_resume_point(const fl_train_config *cfg, int64_t *step, char *root,
                                size_t cap);
/* The tensors every checkpoint of t holds, in their order: the network's parameters (the
 * first *nnet), the optimizer's state, the distributed optimizer's; *p (calloc'd, the caller
 * frees) has room for `extra` more after the *n filled. FL_ENOMEM. */
int  fl_train_ckpt_tensors(trainer *t, int extra, fl_param ***p, int *n, int *nnet);
/* Whether a periodic checkpoint is due after update `step`. */
bool fl_train_ckpt_due(const fl_train_config *cfg, int64_t step);
/* Saves a checkpoint of the state at pos into checkpoint.dir (see checkpoint.h), then points
 * `latest` at it and prunes. Collective: every rank calls it at the same step. */
int  fl_train_ckpt_save(trainer *t, const fl_train_config *cfg, const train_pos *pos);
/* train_rescale.c: resuming with another number of workers (docs/elastic.md). */

/* Combines the rank files of checkpoint directory dir, written by w0 workers, into this rank's
 * state p[0..n), which holds rank 0's file already: kind[i] says how (fl_state_merge). Every
 * file is checked (a tensor missing, of another dtype or shape, or a SAME tensor that differs
 * from rank 0's is an error naming the file and the tensor). */
int fl_train_merge_ranks(trainer *t, const char *dir, int w0, fl_param *const *p,
                         const fl_state_merge *kind, int n);
/* The data position in a job of t->world workers that matches batch b0 of an epoch in a job of
 * w0 workers: the global batch holding the first sample not yet trained on, so that no sample
 * of the epoch is skipped and fewer than one global batch is seen twice. */
int64_t fl_train_rescale_batch(const trainer *t, int64_t b0, int w0);
/* train_schedule.c: sets the run's length (t->total_steps) to total optimizer updates and
 * rebuilds t->sched for it from optimizer.lr.*; at set-up and when a resume changes the
 * length. */
void fl_train_set_length(trainer *t, const fl_train_config *cfg, int64_t total);

/* "key: value" lines of text as "key=value" overrides, appended to list[*n..cap) (pointers
 * into text, which is modified in place); FL_EINVAL when they do not fit. */
int fl_train_yaml_overrides(char *text, const char **list, int *n, int cap);
/* The "key: value" lines of a configuration's YAML (fl_config_print) that the network is built
 * from (model.*, and data.features, data.classes, which fl_train_make_model reads): an
 * inference model's network description. malloc'd; NULL when out of memory. */
char *fl_train_network_keys(const char *yaml);
/* At the end of training: the final checkpoint (unless pos->step was just saved) and rank 0's
 * inference model, as configured. Collective. */
int  fl_train_ckpt_final(trainer *t, const fl_train_config *cfg, const train_pos *pos,
                         int64_t last_saved);

/* Parameter-server mode (train_ps.c): whether the environment gives this process a role
 * (TRAINING_ROLE), whether it is a server; a server's whole life (serve until every worker is
 * done; *started: it got as far as serving); a worker's joining of the servers (after the fleet, before the distributed optimizer)
 * and its leaving (teardown). */
bool fl_train_ps_mode(void);
bool fl_train_ps_is_server(void);
int  fl_train_serve(const fl_train_config *cfg, bool *started);
int  fl_train_ps_join(trainer *t, const fl_train_config *cfg);
void fl_train_ps_leave(trainer *t);

#endif /* FLEET_TRAIN_IMPL_H */
