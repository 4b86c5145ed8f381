/* train_rescale.c - resuming a checkpoint with another number of workers than wrote it (a job
 * that lost a node and goes on with fewer, fleetrun --nnodes MIN:MAX, or a resume by hand):
 * the old workers' files combined into each new worker's state, and the data position in the
 * new world's batches. The rules, and why, are docs/elastic.md's. */
#include "train/train_impl.h"

#include "fleet/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t fl_train_rescale_batch(const trainer *t, int64_t b0, int w0) {
    /* samples of the epoch trained on, in global batches of w0 * B; the new world's batch
     * that holds the first one not trained on */
    int64_t b1 = b0 * w0 / t->world;
    int64_t spe = fl_prefetch_steps_per_epoch(t->loader);
    return b1 < spe ? b1 : spe;
}

/* element k of a file tensor of dtype dt (F32 or F64), unaligned */
static double file_value(const fl_st_tensor *ft, int64_t k) {
    if (ft->dtype == FL_DTYPE_F64) {
        double d;
        memcpy(&d, (const char *)ft->data + 8 * k, 8);
        return d;
    }
    float f;
    memcpy(&f, (const char *)ft->data + 4 * k, 4);
    return f;
}

static bool same_shape(const fl_st_tensor *ft, const fl_tensor *v) {
    if (ft->dtype != v->dtype || ft->ndim != v->ndim)
        return false;
    for (int d = 0; d < v->ndim; d++)
        if (ft->shape[d] != v->shape[d])
            return false;
    return true;
}

/* acc[i] (numel doubles each) += file j's tensors as kind says; SAME tensors compared */
static int add_file(trainer *t, const fl_safetensors *st, int j, fl_param *const *p,
                    const fl_state_merge *kind, int n, double *const *acc) {
    for (int i = 0; i < n; i++) {
        const fl_tensor *v = &p[i]->value;
        const fl_st_tensor *ft = fl_safetensors_find(st, p[i]->name);
        if (!ft)
            return fl_fail(FL_EFORMAT, "resume: %s has no tensor '%s' (rank 0's file has)",
                           fl_safetensors_path(st), p[i]->name);
        if (!same_shape(ft, v))
            return fl_fail(FL_ESHAPE, "resume: %s: tensor '%s' differs in dtype or shape from "
                           "rank 0's file", fl_safetensors_path(st), p[i]->name);
        if (kind[i] == FL_STATE_SAME) {
            if (memcmp(ft->data, v->data, fl_tensor_nbytes(v)) != 0)
                return fl_fail(FL_EFORMAT, "resume: %s: tensor '%s' differs from rank 0's, "
                               "which every worker shares: the files are not of one "
                               "checkpoint", fl_safetensors_path(st), p[i]->name);
            continue;
        }
        if (kind[i] == FL_STATE_SUM && j % t->world != t->rank)
            continue;
        for (int64_t k = 0; k < v->numel; k++)
            acc[i][k] += file_value(ft, k);
    }
    return FL_OK;
}

int fl_train_merge_ranks(trainer *t, const char *dir, int w0, fl_param *const *p,
                         const fl_state_merge *kind, int n) {
    double **acc = calloc((size_t)n, sizeof *acc);
    int rc = acc ? FL_OK : fl_fail(FL_ENOMEM, "resume: out of memory");
    /* rank 0's values (in p already) start every sum: the mean's, and the sum of the worker
     * that takes rank 0's residuals; the others start at 0 */
    for (int i = 0; rc >= 0 && i < n; i++) {
        const fl_tensor *v = &p[i]->value;
        if (kind[i] == FL_STATE_SAME)
            continue;
        if (v->dtype != FL_DTYPE_F32 && v->dtype != FL_DTYPE_F64) {
            rc = fl_fail(FL_EINVAL, "resume: tensor '%s' cannot be combined over workers (not "
                         "floating point)", p[i]->name);
            break;
        }
        acc[i] = calloc((size_t)v->numel + 1, sizeof **acc);
        if (!acc[i]) {
            rc = fl_fail(FL_ENOMEM, "resume: out of memory combining '%s'", p[i]->name);
            break;
        }
        if (kind[i] == FL_STATE_MEAN || t->rank == 0)
            for (int64_t k = 0; k < v->numel; k++)
                acc[i][k] = v->dtype == FL_DTYPE_F64 ? ((const double *)v->data)[k]
                                                     : ((const float *)v->data)[k];
    }
    for (int j = 1; rc >= 0 && j < w0; j++) {
        char path[1100];
        int nfiles;
        fl_safetensors *st;
        rc = fl_ckpt_rank_file(dir, j, path, sizeof path, &nfiles);
        if (rc >= 0)
            rc = fl_safetensors_open(path, &st);
        if (rc >= 0) {
            rc = add_file(t, st, j, p, kind, n, acc);
            fl_safetensors_close(st);
        }
    }
    for (int i = 0; rc >= 0 && i < n; i++) {
        fl_tensor *v = &p[i]->value;
        if (kind[i] == FL_STATE_SAME)
            continue;
        double div = kind[i] == FL_STATE_MEAN ? w0 : 1;
        for (int64_t k = 0; k < v->numel; k++) {
            if (v->dtype == FL_DTYPE_F64)
                ((double *)v->data)[k] = acc[i][k] / div;
            else
                ((float *)v->data)[k] = (float)(acc[i][k] / div);
        }
    }
    for (int i = 0; acc && i < n; i++)
        free(acc[i]);
    free(acc);
    return rc;
}
