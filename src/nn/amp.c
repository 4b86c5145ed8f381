/* amp.c - mixed precision's emulation inside the network (strategy.amp, docs/amp.md): a
 * white-listed layer reads inputs and weights rounded to f16 or bf16 and its output is rounded
 * after, and in backward its output gradient, input gradients and weight gradients are rounded
 * too: the values an f16 / bf16 tensor-core layer reads and writes, computed in f32 by the
 * unchanged f32 kernels. The master weights stay f32 (the layer reads a rounded copy), and the
 * rounded inputs are copies, so an output read by other layers stays as its producer wrote it
 * (a cast op's output, as in Paddle's O1 programs). */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

/* Batch norm keeps its scale and shift in f32 whatever its data's type (Paddle's batch_norm
 * takes f32 parameters with f16 inputs); every other layer's parameters are rounded. */
bool nn_amp_rounds_params(const fl_layer *l) {
    return strcmp(l->ops->type, "batch_norm") != 0;
}

int nn_amp_create(const fl_backend *k, fl_dtype low, int nlayers, size_t in_bytes,
                  int64_t wnumel, int maxparams, size_t dout_bytes, nn_amp **out) {
    nn_amp *a = calloc(1, sizeof *a);
    if (!a)
        return fl_fail(FL_ENOMEM, "net: amp: out of memory");
    a->low = low;
    a->loss_scale = 1.0f;
    a->white = calloc((size_t)(nlayers > 0 ? nlayers : 1), sizeof *a->white);
    a->saved = calloc((size_t)(maxparams > 0 ? maxparams : 1), sizeof *a->saved);
    size_t wbytes = (size_t)wnumel * sizeof(float);
    a->in[0] = k->alloc(in_bytes);
    a->in[1] = k->alloc(in_bytes);
    a->w = k->alloc(wbytes);
    a->g = k->alloc(wbytes);
    a->dout = k->alloc(dout_bytes);
    if (!a->white || !a->saved || !a->in[0] || !a->in[1] || !a->w || !a->g || !a->dout) {
        nn_amp_free(k, a);
        return fl_fail(FL_ENOMEM, "net: amp: cannot allocate %zu bytes of rounded copies",
                       2 * in_bytes + 2 * wbytes + dout_bytes);
    }
    *out = a;
    return FL_OK;
}

void nn_amp_free(const fl_backend *k, nn_amp *a) {
    if (!a)
        return;
    k->free(a->in[0]);
    k->free(a->in[1]);
    k->free(a->w);
    k->free(a->g);
    k->free(a->dout);
    free(a->white);
    free(a->saved);
    free(a);
}

void nn_amp_round(const nn_amp *a, const fl_backend *k, fl_tensor *t) {
    k->amp_round(a->low, t->numel, t->data);
}

const fl_tensor *nn_amp_input(nn_amp *a, const fl_backend *k, int slot, const fl_tensor *x,
                              fl_tensor *view) {
    *view = *x;
    view->data = a->in[slot];
    k->copy(view->data, x->data, fl_tensor_nbytes(x), FL_COPY_D2D, NULL);
    nn_amp_round(a, k, view);
    return view;
}

void nn_amp_params(nn_amp *a, const fl_backend *k, fl_layer *l, bool on) {
    if (!nn_amp_rounds_params(l))
        return;
    char *w = a->w;
    for (int p = 0; p < l->nparams; p++) {
        fl_tensor *v = &l->params[p].value;
        if (!l->params[p].trainable)
            continue;
        if (on) {
            a->saved[p] = v->data;
            k->copy(w, v->data, fl_tensor_nbytes(v), FL_COPY_D2D, NULL);
            v->data = w;
            nn_amp_round(a, k, v);
            w += fl_tensor_nbytes(v);
        } else {
            v->data = a->saved[p];
        }
    }
}

void nn_amp_grads_save(nn_amp *a, const fl_backend *k, fl_layer *l) {
    char *g = a->g;
    for (int p = 0; p < l->nparams; p++) {
        if (!l->params[p].trainable)
            continue;
        size_t nb = fl_tensor_nbytes(&l->params[p].grad);
        k->copy(g, l->params[p].grad.data, nb, FL_COPY_D2D, NULL);
        g += nb;
    }
}

void nn_amp_grads_finish(nn_amp *a, const fl_backend *k, fl_layer *l, bool saved) {
    if (!nn_amp_rounds_params(l))
        return;
    char *g = a->g;
    for (int p = 0; p < l->nparams; p++) {
        fl_tensor *t = &l->params[p].grad;
        if (!l->params[p].trainable)
            continue;
        nn_amp_round(a, k, t);
        if (saved) /* the micro-batches before, summed in f32 as master gradients are */
            k->axpy(FL_DTYPE_F32, t->numel, 1.0, g, t->data);
        g += fl_tensor_nbytes(t);
    }
}
