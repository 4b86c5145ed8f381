/* amp.c - mixed precision's emulation inside the network (strategy.amp, docs/amp.md): a
 * white-listed layer reads inputs and weights rounded to f16 or bf16 and its output is rounded
 * after, and in backward its output gradient, input gradients and weight gradients are rounded
 * too: the values an f16 / bf16 tensor-core layer reads and writes, computed in f32 by the
 * unchanged f32 kernels. The master weights stay f32 (the layer reads a rounded copy), and the
 * rounded inputs are copies, so an output read by other layers stays as its producer wrote it
 * (a cast op's output, as in Paddle's O1 programs). fl_net_set_amp, at the end, chooses the
 * white layers and sizes the buffers; network.c's forward and backward call the nn_amp_* steps. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Batch norm keeps its scale and shift in f32 whatever its data's type (Paddle's batch_norm
 * takes f32 parameters with f16 inputs); every other layer's parameters are rounded. */
bool nn_amp_rounds_params(const fl_layer *l) {
    return strcmp(l->ops->type, "batch_norm") != 0;
}

int nn_amp_create(const fl_backend *k, fl_dtype low, int nlayers, int nin,
                  const size_t *in_bytes, int64_t wnumel, int maxparams, size_t dout_bytes,
                  nn_amp **out) {
    FL_ASSERT(nin >= 0 && nin <= FL_NET_MAX_INPUTS);
    nn_amp *a = calloc(1, sizeof *a);
    if (!a)
        return fl_fail(FL_ENOMEM, "net: amp: out of memory");
    a->low = low;
    a->loss_scale = 1.0f;
    a->white = calloc((size_t)(nlayers > 0 ? nlayers : 1), sizeof *a->white);
    a->saved = calloc((size_t)(maxparams > 0 ? maxparams : 1), sizeof *a->saved);
    size_t wbytes = (size_t)wnumel * sizeof(float);
    size_t all = 2 * wbytes + dout_bytes;
    bool ins = true;
    for (int i = 0; i < nin; i++) {
        ins &= (a->in[i] = k->alloc(in_bytes[i])) != NULL;
        all += in_bytes[i];
    }
    a->w = k->alloc(wbytes);
    a->g = k->alloc(wbytes);
    a->dout = k->alloc(dout_bytes);
    if (!a->white || !a->saved || !ins || !a->w || !a->g || !a->dout) {
        nn_amp_free(k, a);
        return fl_fail(FL_ENOMEM, "net: amp: cannot allocate %zu bytes of rounded copies", all);
    }
    *out = a;
    return FL_OK;
}

void nn_amp_free(const fl_backend *k, nn_amp *a) {
    if (!a)
        return;
    for (int i = 0; i < FL_NET_MAX_INPUTS; i++)
        k->free(a->in[i]);
    k->free(a->w);
    k->free(a->g);
    k->free(a->dout);
    nn_amp_native_free(k, a);
    free(a->white);
    free(a->saved);
    free(a);
}

void nn_amp_round(const nn_amp *a, const fl_backend *k, fl_tensor *t) {
    k->amp_round(a->low, t->numel, t->data);
}

const fl_tensor *nn_amp_input(nn_amp *a, const fl_backend *k, int slot, const fl_tensor *x,
                              fl_tensor *view) {
    FL_ASSERT(slot >= 0 && slot < FL_NET_MAX_INPUTS && a->in[slot]);
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

/* The network's setting (fleet/nn.h) */

/* Values per sample of a planned (batch, ...) tensor. */
static int64_t sample_numel(const fl_tensor *t) { return fl_shape_numel(t->ndim - 1, t->shape + 1); }

int nn_amp_white_layers(const fl_net *net, const char *white_types, bool *is_white) {
    char list[512];
    snprintf(list, sizeof list, "%s", white_types ? white_types : "");
    memset(is_white, 0, (size_t)net->nlayers * sizeof *is_white);
    for (char *save = NULL, *tok = strtok_r(list, ", \t", &save); tok;
         tok = strtok_r(NULL, ", \t", &save)) {
        if (!fl_layer_type_known(tok)) /* every type named must be one a network can hold */
            return fl_fail(FL_EINVAL, "net: amp: '%s' is not a layer type (%s)", tok,
                           fl_layer_type_names());
        for (int i = 0; i < net->nlayers; i++)
            is_white[i] |= strcmp(net->layers[i]->ops->type, tok) == 0;
    }
    return FL_OK;
}

/* Whether the network runs as asked already (the same dtype and layers, natively where the
 * table would now run them): fl_net_build carried the request out, and the strategy asks
 * again. */
static bool amp_as_asked(const fl_net *net, fl_dtype low, const bool *is_white) {
    const nn_amp *a = net->amp;
    bool native = net->amp_native && net->k->low_dtypes;
    return a && a->low == low && (a->runs != NULL) == native &&
           memcmp(a->white, is_white, (size_t)net->nlayers * sizeof *is_white) == 0;
}

/* Before build: keeps the request for fl_net_build (low F32: drops it). */
static int amp_request(fl_net *net, fl_dtype low, const char *white_types) {
    free(net->amp_want_white);
    net->amp_want_white = NULL;
    net->amp_want = FL_DTYPE_F32;
    if (low == FL_DTYPE_F32)
        return FL_OK;
    if (!(net->amp_want_white = strdup(white_types ? white_types : "")))
        return fl_fail(FL_ENOMEM, "net: amp: out of memory");
    net->amp_want = low;
    return FL_OK;
}

int fl_net_set_amp(fl_net *net, fl_dtype low, const char *white_types) {
    FL_ASSERT(net);
    if (low != FL_DTYPE_F32 && low != FL_DTYPE_F16 && low != FL_DTYPE_BF16)
        return fl_fail(FL_EINVAL, "net: amp: dtype %s (f16 or bf16, or f32 for off)",
                       fl_dtype_name(low));
    bool *is_white = NULL;
    if (low != FL_DTYPE_F32) {
        if (!(is_white = calloc((size_t)(net->nlayers > 0 ? net->nlayers : 1), sizeof *is_white)))
            return fl_fail(FL_ENOMEM, "net: amp: out of memory");
        int rc = nn_amp_white_layers(net, white_types, is_white);
        bool done = rc < 0 || !net->built || amp_as_asked(net, low, is_white);
        if (done)
            free(is_white);
        if (rc < 0)
            return rc;
        if (!net->built) /* checked: kept for fl_net_build */
            return amp_request(net, low, white_types);
        if (done) /* as asked already: nothing changes */
            return FL_OK;
    } else if (!net->built) {
        return amp_request(net, low, NULL);
    }
    bool was_native = net->amp && net->amp->runs;
    nn_amp_free(net->k, net->amp);
    net->amp = NULL;
    if (was_native) { /* activations back to f32 before anything else */
        int rc = nn_amp_native_unplan(net);
        if (rc < 0) {
            free(is_white);
            return rc;
        }
    }
    if (low == FL_DTYPE_F32)
        return FL_OK;
    if (net->dtype != FL_DTYPE_F32 || !net->k->amp_round) {
        free(is_white);
        if (net->dtype != FL_DTYPE_F32)
            return fl_fail(FL_EINVAL, "net: amp: the network computes in %s; mixed precision "
                           "needs f32 master weights", fl_dtype_name(net->dtype));
        return fl_fail(FL_EUNSUPPORTED, "net: amp: the %s backend cannot round to %s (its "
                       "table has no amp_round); the cpu, onednn, ref and cuda backends can",
                       net->k->name, fl_dtype_name(low));
    }
    /* the buffers: the largest white layer's inputs (slot k: the largest input k) and
     * parameters, the last output */
    size_t in_bytes[FL_NET_MAX_INPUTS] = {0};
    int nin = 0;
    int64_t wnumel = 0;
    int maxparams = 0;
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        if (!is_white[i])
            continue;
        for (int k = 0; k < l->ninputs; k++) {
            int from = l->inputs[k];
            int64_t sample = from < 0 ? fl_shape_numel(net->in_ndim, net->in_shape)
                                      : sample_numel(&net->out[from]);
            size_t nb = (size_t)(net->max_batch * sample) * sizeof(float);
            in_bytes[k] = nb > in_bytes[k] ? nb : in_bytes[k];
        }
        nin = l->ninputs > nin ? l->ninputs : nin;
        int64_t n = 0;
        for (int p = 0; p < l->nparams; p++)
            if (l->params[p].trainable)
                n += l->params[p].value.numel;
        wnumel = n > wnumel ? n : wnumel;
        maxparams = l->nparams > maxparams ? l->nparams : maxparams;
    }
    const fl_tensor *last = &net->out[net->nlayers - 1];
    size_t dout_bytes = (size_t)(sample_numel(last) * net->max_batch) * sizeof(float);
    int rc = nn_amp_create(net->k, low, net->nlayers, nin, in_bytes, wnumel, maxparams,
                           dout_bytes, &net->amp);
    if (rc == FL_OK)
        memcpy(net->amp->white, is_white, (size_t)net->nlayers * sizeof *is_white);
    free(is_white);
    if (rc == FL_OK && net->amp_native && net->k->low_dtypes &&
        (rc = nn_amp_native_plan(net)) < 0) { /* the network is unbuilt: no amp either */
        nn_amp_free(net->k, net->amp);
        net->amp = NULL;
    }
    return rc;
}

void fl_net_set_loss_scale(fl_net *net, float scale) {
    FL_ASSERT(net && net->amp && scale > 0);
    net->amp->loss_scale = scale;
}

bool fl_net_amp_white(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return net->amp && net->amp->white[i];
}
