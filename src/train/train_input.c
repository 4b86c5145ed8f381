/* train_input.c - the training batches where the network computes (fl_train_input,
 * train_impl.h). On a device the next batch is copied from the loader into page-locked host
 * memory and uploaded in a stream of its own while the current step computes: two slots, each
 * with host and device memory for a batch and the event that marks its upload; the compute
 * stream waits for that event before it reads the slot. A slot is written again only after its
 * last upload has finished (its host side) and after the compute queued so far, which read it
 * two steps ago (its device side). On the CPU backends the loader's batch is used in place. */
#include "train/train_impl.h"

#include <string.h>

static size_t x_bytes(const fl_train_input *in, int64_t rows) {
    return (size_t)(rows * in->sample) * sizeof(float);
}

int fl_train_input_init(fl_train_input *in, const fl_backend *k, fl_prefetch *loader,
                        int64_t max_batch, int64_t sample, int64_t classes) {
    memset(in, 0, sizeof *in);
    in->k = k;
    in->loader = loader;
    in->max_batch = max_batch;
    in->sample = sample;
    in->classes = classes;
    in->held_rc = 1;
    if (k->host_memory)
        return FL_OK;
    size_t lb = (size_t)max_batch * sizeof(int32_t);
    for (int i = 0; i < 2; i++) {
        fl_train_input_slot *s = &in->slot[i];
        if (!(s->hx = fl_backend_host_alloc(k, x_bytes(in, max_batch))) ||
            !(s->hlabels = fl_backend_host_alloc(k, lb)) ||
            !(s->x = k->alloc(x_bytes(in, max_batch))) || !(s->labels = k->alloc(lb))) {
            fl_train_input_clear(in);
            return fl_fail(FL_ENOMEM, "out of memory for the input's two batches of (%lld, %lld) "
                                      "samples", (long long)max_batch, (long long)sample);
        }
        s->landed = k->event_create();
    }
    in->up = k->stream_create();
    in->computed = k->event_create();
    return FL_OK;
}

void fl_train_input_clear(fl_train_input *in) {
    const fl_backend *k = in->k;
    if (!k || k->host_memory) {
        memset(in, 0, sizeof *in);
        return;
    }
    if (in->up) /* its uploads finish before their memory goes */
        k->stream_free(in->up);
    k->event_free(in->computed);
    for (int i = 0; i < 2; i++) {
        fl_train_input_slot *s = &in->slot[i];
        k->event_free(s->landed);
        fl_backend_host_free(k, s->hx);
        fl_backend_host_free(k, s->hlabels);
        k->free(s->x);
        k->free(s->labels);
    }
    memset(in, 0, sizeof *in);
}

int fl_train_input_seek(fl_train_input *in, int64_t epoch, int64_t batch) {
    in->ahead = false;
    in->held_rc = 1;
    return fl_prefetch_seek(in->loader, epoch, batch);
}

/* The loader's next batch into slot s, its upload queued in the input's stream: 1, or the
 * loader's 0 (end of the epoch) or error. */
static int stage(fl_train_input *in, fl_train_input_slot *s) {
    const fl_backend *k = in->k;
    const fl_tensor *x;
    const int32_t *labels;
    int rc = fl_prefetch_next(in->loader, &x, &labels);
    if (rc != 1)
        return rc;
    int64_t rows = x->shape[0];
    FL_ASSERT(rows <= in->max_batch && x->dtype == FL_DTYPE_F32 &&
              x->numel == rows * in->sample);
    FL_TRY(fl_labels_check(labels, rows, in->classes)); /* the loss cannot check them there */
    k->event_sync(s->landed); /* the slot's last upload has read its host memory */
    memcpy(s->hx, x->data, x_bytes(in, rows));
    memcpy(s->hlabels, labels, (size_t)rows * sizeof *labels);
    s->view = *x;
    s->view.data = s->x;
    s->view.device = fl_backend_device(k);
    /* what is queued for compute so far read the slot's device memory two steps ago */
    k->event_record(in->computed, NULL);
    k->event_wait(in->up, in->computed);
    k->copy(s->x, s->hx, x_bytes(in, rows), FL_COPY_H2D, in->up);
    k->copy(s->labels, s->hlabels, (size_t)rows * sizeof(int32_t), FL_COPY_H2D, in->up);
    k->event_record(s->landed, in->up);
    return 1;
}

int fl_train_input_next(fl_train_input *in, fl_tensor *x, const int32_t **labels,
                        const int32_t **hlabels) {
    if (in->k->host_memory) {
        const fl_tensor *lx;
        int rc = fl_prefetch_next(in->loader, &lx, labels);
        if (rc == 1) {
            *x = *lx;
            *hlabels = *labels;
        }
        return rc;
    }
    if (!in->ahead) { /* the first batch after a seek, or the loader's held answer */
        if (in->held_rc != 1) {
            int rc = in->held_rc;
            in->held_rc = 1;
            return rc;
        }
        int rc = stage(in, &in->slot[in->next]);
        if (rc != 1)
            return rc;
    }
    fl_train_input_slot *s = &in->slot[in->next];
    in->next ^= 1;
    /* the batch after it, uploading while this one computes; the loader's end or error is
     * held for the next call */
    int rc = stage(in, &in->slot[in->next]);
    in->ahead = rc == 1;
    if (rc != 1)
        in->held_rc = rc;
    in->k->event_wait(NULL, s->landed); /* compute reads the slot after its upload */
    *x = s->view;
    *labels = s->labels;
    *hlabels = s->hlabels;
    return 1;
}
