/* infer.h - offline evaluation (fleet-eval; seed 002's evaluation program): runs a saved model
 * over a dataset and writes its output vectors (logits) as .npy, so that they can be compared
 * with a deployed service's, with loss, top-1 and top-5 where the samples have labels.
 *
 * The model is an inference model (checkpoint.inference_model: the network description, i.e.
 * the configuration keys the model is built from, plus every network tensor, batch-norm
 * statistics included) or a training checkpoint (its training state is skipped). The data and
 * the network are built by the same constructors fleet-train uses (src/train/train_model.c),
 * from a configuration assembled as: defaults, then the data configuration given (or, with
 * none, the training configuration stored in the model), then the model's network keys, then
 * the -o overrides. The validation split is read with the evaluation transforms, in order,
 * unsharded, in batches of train.batch_size (the trainer's evaluation batches, so the logits
 * are bit-identical to those its evaluation computes).
 *
 * A model with a re-parameterised inference form (pplcnetv2: nn.h's fl_model_pplcnetv2_fused)
 * runs in that form unless told otherwise: the training form is built and loaded, then the
 * fused network takes its parameters (fl_pplcnetv2_fuse) and runs in its place; its logits
 * equal the training form's to rounding (f32: about 1e-6 of their size). */
#ifndef FLEET_INFER_H
#define FLEET_INFER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which form of the network runs. */
typedef enum {
    FL_INFER_FORM_AUTO = 0, /* the fused form where the model has one, else the training form */
    FL_INFER_FORM_TRAIN,    /* the training form, as fleet-train evaluates it */
    FL_INFER_FORM_FUSED,    /* the fused form; FL_ECONFIG for a model without one */
} fl_infer_form;

typedef struct {
    const char        *model;       /* inference model file, or checkpoint (file or directory) */
    const char        *config;      /* YAML with the data section; NULL: the model's own */
    const char *const *overrides;   /* "key=value", applied last */
    int                noverrides;
    int                split;       /* 0: training set, 1: validation set */
    const char        *out_npy;     /* logits (N, C) '<f4' are written here; NULL: not written */
    const char        *inputs_npy;  /* the input samples (N, sample numel) too; NULL: not */
    fl_infer_form      form;
} fl_infer_args;

typedef struct {
    int64_t samples, classes;
    int     labelled;   /* every sample has a label in [0, classes) */
    double  loss;       /* mean softmax cross-entropy (labelled only) */
    double  top1, top5; /* accuracies (labelled only; top5 needs classes >= 5, else NaN) */
    int     fused;        /* 1: the network ran in its re-parameterised (fused) form */
    int64_t params;       /* trainable values of the network that ran */
    int64_t train_params; /* those of the training form (params when it ran) */
    /* a CTR model (wide_deep, deepfm; docs/ctr.md): no logits file, these instead */
    int     ctr;        /* 1: the fields below are set, loss/top1/top5 are not */
    double  auc;        /* Paddle's bucketed AUC (metrics.h) */
    double  logloss, pred_ctr, actual_ctr;
    int64_t table_rows; /* sparse rows loaded from the checkpoint */
} fl_infer_result;

/* Runs the evaluation described above on this process (no communication). 0, or a negative
 * status with a message naming the file, key or tensor at fault. */
int fl_infer_run(const fl_infer_args *a, fl_infer_result *res);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_INFER_H */
