/* amp_native.c - mixed precision with activations really in f16 / bf16 (docs/amp.md, "Real f16
 * / bf16"), on a table whose low_dtypes says it runs them (ref; cuda with FLEET_CUDA_LOW_DTYPES=1): which layers run
 * low (white ones, and gray ones fed only by low ones: Paddle's O1 runs a gray op in f16 when
 * its inputs are), the network's activations planned again in those dtypes (2-byte outputs and
 * output gradients), and the conversions at the edges between a low layer and an f32 one, the
 * network input and the output the loss reads. amp.c keeps the emulation and the lists. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdlib.h>
#include <string.h>

void nn_amp_native_free(const fl_backend *k, nn_amp *a) {
    if (!a)
        return;
    for (int i = 0; i < FL_NET_MAX_INPUTS; i++) {
        k->free(a->edge_in[i]);
        k->free(a->edge_grad[i]);
    }
    k->free(a->edge_sum);
    k->free(a->out32.data);
    k->free(a->dout_low);
    free(a->runs);
}

/* The dtype of layer input `from` (an earlier output or the network input, f32). */
static fl_dtype input_dtype(const fl_net *net, int from) {
    return from < 0 ? net->dtype : net->out[from].dtype;
}

/* Edge buffers (sized for f32, the wider side, at max batch) and the last output's f32 copy. */
static int alloc_edges(fl_net *net) {
    nn_amp *a = net->amp;
    const fl_backend *k = net->k;
    size_t in_bytes[FL_NET_MAX_INPUTS] = {0}, most = 0;
    for (int i = 0; i < net->nlayers; i++) {
        const fl_layer *l = net->layers[i];
        for (int j = 0; j < l->ninputs; j++) {
            int from = l->inputs[j];
            if (input_dtype(net, from) == l->adtype)
                continue;
            int64_t sample = from < 0 ? fl_shape_numel(net->in_ndim, net->in_shape)
                                      : fl_shape_numel(net->out[from].ndim - 1,
                                                       net->out[from].shape + 1);
            size_t nb = (size_t)(sample * net->max_batch) * sizeof(float);
            in_bytes[j] = nb > in_bytes[j] ? nb : in_bytes[j];
            most = nb > most ? nb : most;
        }
    }
    bool ok = true;
    for (int j = 0; j < FL_NET_MAX_INPUTS; j++)
        if (in_bytes[j] > 0)
            ok &= (a->edge_in[j] = k->alloc(in_bytes[j])) && (a->edge_grad[j] = k->alloc(in_bytes[j]));
    if (most > 0)
        ok &= (a->edge_sum = k->alloc(most)) != NULL;
    const fl_tensor *last = &net->out[net->nlayers - 1];
    if (a->runs[net->nlayers - 1]) {
        fl_tensor_view(&a->out32, net->dtype, last->ndim, last->shape, NULL);
        a->out32.device = last->device;
        ok &= (a->out32.data = k->alloc(fl_tensor_nbytes(&a->out32))) != NULL;
        ok &= (a->dout_low = k->alloc(fl_tensor_nbytes(last))) != NULL;
    }
    return ok ? FL_OK : fl_fail(FL_ENOMEM, "net: amp: cannot allocate the conversion buffers "
                                           "between %s and %s layers",
                                fl_dtype_name(a->low), fl_dtype_name(net->dtype));
}

void nn_amp_native_runs(const fl_net *net, const bool *white, bool *runs) {
    for (int i = 0; i < net->nlayers; i++) {
        const fl_layer *l = net->layers[i];
        bool fed_low = true;
        for (int j = 0; j < l->ninputs; j++)
            fed_low &= l->inputs[j] >= 0 && runs[l->inputs[j]];
        runs[i] = l->ops->low && (white[i] || fed_low);
    }
}

int nn_amp_native_plan(fl_net *net) {
    nn_amp *a = net->amp;
    FL_ASSERT(a && net->k->low_dtypes && net->k->convert && !a->runs);
    if (!(a->runs = calloc((size_t)net->nlayers, sizeof *a->runs))) {
        nn_net_unplan(net);
        return fl_fail(FL_ENOMEM, "net: amp: out of memory");
    }
    nn_amp_native_runs(net, a->white, a->runs);
    bool changed = false;
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        fl_dtype t = a->runs[i] ? a->low : net->dtype;
        changed |= l->adtype != t;
        l->adtype = t;
    }
    /* planned already in these dtypes where fl_net_build carried out a request */
    int rc = changed ? nn_net_replan(net) : FL_OK; /* net->amp survives unless this fails */
    if (rc == FL_OK && (rc = alloc_edges(net)) < 0)
        nn_net_unplan(net);
    return rc;
}

int nn_amp_native_unplan(fl_net *net) {
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->adtype = net->dtype;
    return nn_net_replan(net);
}

const fl_tensor *nn_amp_edge_input(fl_net *net, int i, int k, const fl_tensor *x,
                                   fl_tensor *view) {
    fl_dtype t = net->layers[i]->adtype;
    if (x->dtype == t)
        return x;
    FL_ASSERT(net->amp && net->amp->edge_in[k]);
    *view = *x;
    view->dtype = t;
    view->data = net->amp->edge_in[k];
    net->k->convert(x->dtype, x->data, t, view->data, x->numel);
    return view;
}

void nn_amp_edge_grad(fl_net *net, const fl_tensor *g, fl_tensor *target, bool first) {
    if (first) {
        net->k->convert(g->dtype, g->data, target->dtype, target->data, g->numel);
        return;
    }
    net->k->convert(g->dtype, g->data, target->dtype, net->amp->edge_sum, g->numel);
    net->k->axpy(target->dtype, g->numel, 1.0, net->amp->edge_sum, target->data);
}

const fl_tensor *nn_amp_net_output(fl_net *net, bool convert) {
    const fl_tensor *last = &net->out[net->nlayers - 1];
    if (!nn_amp_runs_low(net->amp, net->nlayers - 1))
        return last;
    fl_tensor *o = &net->amp->out32;
    o->shape[0] = last->shape[0];
    o->numel = last->numel;
    if (convert)
        net->k->convert(last->dtype, last->data, o->dtype, o->data, last->numel);
    return o;
}

const fl_tensor *nn_amp_last_grad(fl_net *net, const fl_tensor *dy, fl_tensor *view) {
    const fl_tensor *last = &net->out[net->nlayers - 1];
    if (!nn_amp_runs_low(net->amp, net->nlayers - 1))
        return dy;
    *view = *last;
    view->data = net->amp->dout_low;
    net->k->convert(dy->dtype, dy->data, last->dtype, view->data, dy->numel);
    return view;
}

/* The network's settings (fleet/nn.h) */

int fl_net_set_amp_native(fl_net *net, bool on) {
    FL_ASSERT(net);
    if (net->amp && on != net->amp_native)
        return fl_fail(FL_ESTATE, "net: amp: fl_net_set_amp_native after fl_net_set_amp (call "
                                  "it first, or turn amp off with FL_DTYPE_F32)");
    net->amp_native = on;
    return FL_OK;
}

bool fl_net_amp_low(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return nn_amp_runs_low(net->amp, i);
}
