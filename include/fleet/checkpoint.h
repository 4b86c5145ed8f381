/* checkpoint.h - named tensors to and from safetensors files, and checkpoint directories.
 *
 * A checkpoint is a directory ROOT/step_00000120/ holding model.safetensors (state shared by
 * every rank, written by rank 0) or rank_0.safetensors ... rank_<N-1>.safetensors (one per
 * rank, where state differs by rank), and ROOT/latest, a one-line file naming the newest
 * complete step directory. Each file and `latest` are replaced atomically and `latest` is
 * written only after every file of its step is complete, so a writer killed at any moment
 * leaves `latest` naming a loadable checkpoint.
 *
 * Loading (fl_ckpt_load) matches an array of fl_param against a file in one of two modes:
 *   FL_CKPT_STRICT   resume: every tensor present with its dtype and shape, nothing unexpected;
 *   FL_CKPT_PARTIAL  pretrained weights (seed 002's load_vars with `if_exist`): each tensor
 *                    that exists by name with the same dtype and shape is taken, and the report
 *                    says what was missing, unexpected or mismatched.
 * Either way every match is decided before the first byte is copied: a refused load changes
 * nothing. */
#ifndef FLEET_CHECKPOINT_H
#define FLEET_CHECKPOINT_H

#include "fleet/safetensors.h"
#include "fleet/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes params[0..n) (their value tensors, by name) and meta to path, atomically. */
int fl_ckpt_save(const char *path, fl_param *const *params, int n, const fl_st_meta *meta,
                 int nmeta);

typedef enum { FL_CKPT_STRICT = 0, FL_CKPT_PARTIAL = 1 } fl_ckpt_mode;

/* What a load did; the lists are comma-separated names, truncated with "..." when long. */
typedef struct {
    int  loaded, missing, unexpected, mismatched;
    char missing_names[512];
    char unexpected_names[512];
    char mismatched_names[1024]; /* "fc3.weight (file (2, 128) F32, model (10, 128) F32)" */
} fl_ckpt_report;

/* Copies the file's tensors into params[0..n) as mode says. Tensors of the file whose name
 * starts with one of ignore_prefixes[0..nignore) (e.g. "opt.", training state when loading only
 * weights) are neither loaded nor counted as unexpected. Strict mode fails with FL_ESHAPE (shape
 * or dtype) or FL_EFORMAT (missing or unexpected tensor) naming the file and the first tensor at
 * fault; partial mode fails only when nothing at all matched. report may be NULL. */
int fl_ckpt_load(const fl_safetensors *st, fl_param *const *params, int n, fl_ckpt_mode mode,
                 const char *const *ignore_prefixes, int nignore, fl_ckpt_report *report);

/* --- checkpoint directories --- */

/* "ROOT/step_%08lld" into buf; FL_EINVAL if it does not fit. */
int fl_ckpt_step_dir(char *buf, size_t cap, const char *root, int64_t step);
/* mkdir -p. FL_EIO naming the directory. */
int fl_ckpt_mkdirs(const char *path);
/* Points ROOT/latest at step (atomically). */
int fl_ckpt_set_latest(const char *root, int64_t step);
/* Resolves what --resume was given: a step directory (it holds model.safetensors or
 * rank_0.safetensors) or a root holding `latest`. Writes the step directory into dir.
 * FL_EIO naming the path when it is neither. */
int fl_ckpt_resolve(const char *path, char *dir, size_t cap);
/* The step ROOT/latest names into *step: FL_OK, with *step -1 when ROOT has no `latest` (nothing
 * saved there yet); FL_EFORMAT or FL_EIO naming the file when it is there but unreadable. */
int fl_ckpt_latest_step(const char *root, int64_t *step);
/* The step a step directory's path names (its last component "step_NNNNNNNN"), or -1. */
int64_t fl_ckpt_dir_step(const char *dir);
/* The file this rank loads from step directory dir: "model.safetensors", else
 * "rank_<rank>.safetensors" (then *nfiles receives the number of rank files, for the world
 * size check). FL_EIO naming the directory when neither exists. */
int fl_ckpt_rank_file(const char *dir, int rank, char *path, size_t cap, int *nfiles);
/* Removes rank_<r>.safetensors for every r >= from from step directory dir (from 0: all of
 * them; the world size: those a larger world left there). */
void fl_ckpt_remove_rank_files(const char *dir, int from);
/* Removes step directories of ROOT beyond the newest `keep` at or below the step `latest`
 * names, and every step directory above it (left by a run killed before it could finish a
 * save, then resumed from an earlier one). keep <= 0 keeps all below latest. */
int fl_ckpt_prune(const char *root, int64_t keep);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_CHECKPOINT_H */
