/* train_device.c - the trainer's side of a device backend (backend.h's memory rule): the
 * backend train.device and train.backend choose, with the GPU bound before anything is built;
 * evaluation batches copied to the device (training's: train_input.c); the logits copied back once
 * for accuracy; and host stand-ins for the tensors checkpoints read and write. On the CPU
 * backends (host_memory) every one of these is the memory itself, and nothing is copied. */
#include "train/train_impl.h"

#include "fleet/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- the backend and the device --- */

static const fl_backend *gpu_seam; /* fl_train_set_gpu_backend: tests' stand-in for cuda */

void fl_train_set_gpu_backend(const fl_backend *be) { gpu_seam = be; }

/* The GPU this worker is given: the first entry of FLAGS_selected_gpus (fleetrun --gpus sets
 * it per worker; Paddle takes the first too), 0 when unset. */
static int selected_gpu(int *ordinal) {
    const char *v = getenv("FLAGS_selected_gpus");
    *ordinal = 0;
    if (!v || !*v)
        return FL_OK;
    char *end;
    errno = 0;
    long g = strtol(v, &end, 10);
    if (end == v || (*end && *end != ',') || errno || g < 0 || g > 4096)
        return fl_fail(FL_ECONFIG, "train.device: gpu, but FLAGS_selected_gpus=%s is not a list "
                                   "of GPU numbers", v);
    *ordinal = (int)g;
    return FL_OK;
}

/* train.deterministic into a bound device backend (before any plan is made), said once */
static const fl_backend *set_determinism(const fl_backend *be, const fl_train_config *cfg) {
    static int said = -1; /* the setting last logged */
    bool det = cfg->train.deterministic;
    if (be->set_deterministic)
        be->set_deterministic(det);
    if (said == (int)det)
        return be;
    said = det;
    if (!be->set_deterministic) { /* the CPU backends: deterministic kernels only */
        if (!det)
            FL_INFO("train.deterministic: false has no effect on the %s backend (its kernels "
                    "are deterministic): runs repeat to the bit", be->name);
    } else {
        FL_INFO("train.deterministic: %s", det ? "true (runs repeat to the bit; false lets "
                "cuDNN choose its fastest, non-deterministic backward algorithms)"
                : "false (cuDNN's fastest backward algorithms, some non-deterministic: runs "
                "differ in the last bits)");
    }
    return be;
}

const fl_backend *fl_train_compute_backend(const fl_train_config *cfg) {
    static const char *const names[] = {"auto", "cpu", "onednn", "ref", "cuda"};
    static const fl_backend *bound; /* the backend whose device this process bound */
    static int bound_ordinal;
    if (cfg->train.device != FL_TRAIN_DEVICE_GPU) {
        const fl_backend *be = fl_backend_by_name(names[cfg->train.backend]);
        if (!be)
            fl_fail_prefix(FL_ECONFIG, "train.backend");
        return be ? set_determinism(be, cfg) : NULL;
    }
    const fl_backend *be = gpu_seam ? gpu_seam : fl_backend_cuda();
    if (!be) {
        fl_fail(FL_ECONFIG, "train.device: gpu, but this fleet was built without CUDA (nvcc, "
                            "cuBLAS and cuDNN were not found at configure time), so it has no "
                            "GPU to train on; train.device: cpu trains on the CPU");
        return NULL;
    }
    int ordinal;
    if (selected_gpu(&ordinal) < 0)
        return NULL;
    if (bound == be && bound_ordinal == ordinal)
        return set_determinism(be, cfg);
    if (!be->device_bind) {
        fl_fail(FL_ECONFIG, "train.device: gpu, but backend %s has no device to bind", be->name);
        return NULL;
    }
    int rc = be->device_bind(ordinal);
    if (rc < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", fl_errmsg());
        fl_fail(FL_ECONFIG, "train.device: gpu, but GPU %d (FLAGS_selected_gpus) cannot be "
                            "used: %s", ordinal, why);
        return NULL;
    }
    bound = be;
    bound_ordinal = ordinal;
    FL_INFO("train.device: gpu %d bound (FLAGS_selected_gpus), backend %s", ordinal, be->name);
    return set_determinism(be, cfg);
}

/* --- batches --- */

int fl_train_batch_init(fl_train_batch *b, const fl_backend *k, int64_t max_batch,
                        int64_t sample, int64_t classes) {
    memset(b, 0, sizeof *b);
    b->k = k;
    b->max_batch = max_batch;
    b->sample = sample;
    b->classes = classes;
    size_t out = (size_t)(max_batch * classes) * sizeof(float);
    if (!(b->probs = k->alloc(out)))
        goto nomem;
    if (k->host_memory)
        return FL_OK;
    if (!(b->x = k->alloc((size_t)(max_batch * sample) * sizeof(float))) ||
        !(b->labels = k->alloc((size_t)max_batch * sizeof(int32_t))) ||
        !(b->logits = malloc(out ? out : 1)))
        goto nomem;
    return FL_OK;
nomem:
    fl_train_batch_clear(b);
    return fl_fail(FL_ENOMEM, "out of memory for batches of (%lld, %lld) samples and their "
                              "(%lld, %lld) outputs",
                   (long long)max_batch, (long long)sample, (long long)max_batch,
                   (long long)classes);
}

void fl_train_batch_clear(fl_train_batch *b) {
    if (b->k) {
        b->k->free(b->probs);
        b->k->free(b->x);
        b->k->free(b->labels);
    }
    free(b->logits);
    memset(b, 0, sizeof *b);
}

void fl_train_batch_probs(fl_train_batch *b, int64_t rows, fl_tensor *probs) {
    FL_ASSERT(rows <= b->max_batch);
    fl_tensor_view(probs, FL_DTYPE_F32, 2, (int64_t[]){rows, b->classes}, b->probs);
    probs->device = fl_backend_device(b->k);
}

int fl_train_batch_put(fl_train_batch *b, const fl_tensor *x, const int32_t *labels,
                       fl_tensor *dx, const int32_t **dlabels, fl_tensor *probs) {
    int64_t rows = x->shape[0];
    FL_ASSERT(rows <= b->max_batch && x->dtype == FL_DTYPE_F32 &&
              x->numel == rows * b->sample);
    fl_train_batch_probs(b, rows, probs);
    *dx = *x;
    *dlabels = labels;
    if (b->k->host_memory)
        return FL_OK;
    if (labels)
        FL_TRY(fl_labels_check(labels, rows, b->classes));
    dx->data = b->x;
    dx->device = fl_backend_device(b->k);
    b->k->copy(b->x, x->data, fl_tensor_nbytes(x), FL_COPY_H2D, NULL);
    if (labels) {
        b->k->copy(b->labels, labels, (size_t)rows * sizeof *labels, FL_COPY_H2D, NULL);
        *dlabels = b->labels;
    }
    return FL_OK;
}

const fl_tensor *fl_train_batch_logits(fl_train_batch *b, const fl_tensor *logits,
                                       fl_tensor *view) {
    if (fl_tensor_on_host(logits))
        return logits;
    FL_ASSERT(logits->dtype == FL_DTYPE_F32 && logits->numel <= b->max_batch * b->classes);
    fl_tensor_view(view, logits->dtype, logits->ndim, logits->shape, b->logits);
    b->k->copy(b->logits, logits->data, fl_tensor_nbytes(logits), FL_COPY_D2H, NULL);
    b->k->stream_sync(NULL);
    return view;
}

/* --- checkpoints' host stand-ins --- */

int fl_train_stage_create(fl_train_stage *h, fl_param **p, int n) {
    memset(h, 0, sizeof *h);
    size_t bytes = 0;
    int ndev = 0;
    for (int i = 0; i < n; i++)
        if (!fl_tensor_on_host(&p[i]->value)) {
            bytes += (fl_tensor_nbytes(&p[i]->value) + 63) & ~(size_t)63;
            ndev++;
        }
    if (ndev == 0)
        return FL_OK;
    h->orig = calloc((size_t)n, sizeof *h->orig);
    h->copy = calloc((size_t)n, sizeof *h->copy);
    h->mem = fl_alloc_aligned(bytes ? bytes : 64);
    if (!h->orig || !h->copy || !h->mem) {
        fl_train_stage_free(h);
        return fl_fail(FL_ENOMEM, "checkpoint: cannot allocate %zu bytes of host copies", bytes);
    }
    h->n = n;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (fl_tensor_on_host(&p[i]->value))
            continue;
        h->orig[i] = p[i];
        h->copy[i] = *p[i];
        h->copy[i].value.data = h->mem + off;
        h->copy[i].value.device = (fl_device){FL_DEVICE_CPU, 0};
        h->copy[i].grad.data = NULL;
        off += (fl_tensor_nbytes(&p[i]->value) + 63) & ~(size_t)63;
        p[i] = &h->copy[i];
    }
    return FL_OK;
}

void fl_train_stage_pull(const fl_train_stage *h, const fl_backend *k) {
    for (int i = 0; i < h->n; i++)
        if (h->orig[i])
            k->copy(h->copy[i].value.data, h->orig[i]->value.data,
                    fl_tensor_nbytes(&h->orig[i]->value), FL_COPY_D2H, NULL);
    if (h->n)
        k->stream_sync(NULL);
}

void fl_train_stage_push(const fl_train_stage *h, const fl_backend *k) {
    for (int i = 0; i < h->n; i++)
        if (h->orig[i])
            k->copy(h->orig[i]->value.data, h->copy[i].value.data,
                    fl_tensor_nbytes(&h->orig[i]->value), FL_COPY_H2D, NULL);
    if (h->n)
        k->stream_sync(NULL);
}

void fl_train_stage_free(fl_train_stage *h) {
    free(h->orig);
    free(h->copy);
    fl_free_aligned(h->mem);
    memset(h, 0, sizeof *h);
}
