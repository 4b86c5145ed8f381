/* network.c - layers in insertion order, each reading the previous layer's output or any
 * earlier one's (a small DAG, for residual networks): adding layers, forward, backward (with
 * recompute's replays and mixed precision's rounding), and what a network tells about itself.
 * Its memory is planned once by fl_net_build (network_build.c); the AMP and recompute settings
 * are amp.c's and recompute.c's. Steps allocate nothing. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

fl_net *fl_net_create(fl_dtype dtype, const fl_backend *k) {
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F64) {
        fl_fail(FL_EINVAL, "net: dtype %s is not supported (f32 or f64)", fl_dtype_name(dtype));
        return NULL;
    }
    fl_net *net = calloc(1, sizeof *net);
    if (!net) {
        fl_fail(FL_ENOMEM, "net: out of memory");
        return NULL;
    }
    net->dtype = dtype;
    net->k = k ? k : fl_backend_cpu();
    net->amp_want = FL_DTYPE_F32; /* no mixed precision asked before build */
    return net;
}

void fl_net_set_backend(fl_net *net, const fl_backend *k) {
    FL_ASSERT(net && !net->built);
    net->k = k ? k : fl_backend_cpu();
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->k = net->k;
}

void fl_net_init_torch(fl_net *net) {
    FL_ASSERT(net && !net->built);
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->init = FL_INIT_TORCH;
}

void fl_net_free(fl_net *net) {
    if (!net)
        return;
    nn_amp_free(net->k, net->amp);
    nn_net_unplan(net);
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        if (l->ops->destroy)
            l->ops->destroy(l);
        free(l); // its params live in net->params
    }
    free(net->layers);
    free(net->params);
    free(net->recompute_spec);
    free(net->amp_want_white);
    free(net);
}

/* Appends layer reading inputs[0..ninputs); returns its index or a negative status. */
static int add_layer(fl_net *net, fl_layer *layer, int ninputs, const int *inputs) {
    FL_ASSERT(net && layer);
    int rc;
    const fl_layer_ops *o = layer->ops;
    bool many = o->forwardn && o->backwardn, two = o->forward2 && o->backward2;
    if (ninputs < 1 || ninputs > FL_NET_MAX_INPUTS) {
        rc = fl_fail(FL_EINVAL, "%s: %d inputs (a layer reads 1 to FL_NET_MAX_INPUTS = %d)",
                     layer->name, ninputs, FL_NET_MAX_INPUTS);
        goto fail;
    }
    if (!many && (two ? ninputs != 2 : ninputs != 1 || !o->forward || !o->backward)) {
        rc = fl_fail(FL_EINVAL, "%s: a %s layer takes %s input%s, not %d (use %s)", layer->name,
                     o->type, two ? "two" : "one", two ? "s" : "", ninputs,
                     two ? "fl_net_add2" : "fl_net_add or fl_net_add_from");
        goto fail;
    }
    for (int i = 0; i < ninputs; i++) {
        if (inputs[i] < FL_NET_INPUT || inputs[i] >= net->nlayers) {
            rc = fl_fail(FL_EINVAL, "%s: input %d is not the network input (%d) or an earlier "
                         "layer (0 to %d)", layer->name, inputs[i], FL_NET_INPUT,
                         net->nlayers - 1);
            goto fail;
        }
        layer->inputs[i] = inputs[i];
    }
    layer->ninputs = ninputs;
    if (net->built) {
        rc = fl_fail(FL_ESTATE, "%s: cannot add a layer to a network that is already built",
                     layer->name);
        goto fail;
    }
    for (int i = 0; i < net->nlayers; i++) {
        if (strcmp(net->layers[i]->name, layer->name) == 0) {
            rc = fl_fail(FL_EINVAL, "%s: the network already has a layer of that name",
                         layer->name);
            goto fail;
        }
    }
    fl_layer **layers = realloc(net->layers, (size_t)(net->nlayers + 1) * sizeof *layers);
    if (!layers) {
        rc = fl_fail(FL_ENOMEM, "%s: out of memory", layer->name);
        goto fail;
    }
    net->layers = layers;
    fl_param *params = net->params;
    if (layer->nparams > 0) {
        params = realloc(net->params, (size_t)(net->nparams + layer->nparams) * sizeof *params);
        if (!params) {
            rc = fl_fail(FL_ENOMEM, "%s: out of memory", layer->name);
            goto fail;
        }
    }
    /* move the layer's params into the network's array, trainable ones first */
    net->params = params;
    int n = net->nparams;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < layer->nparams; i++)
            if (layer->params[i].trainable == (pass == 0))
                params[n++] = layer->params[i];
    for (int i = net->nparams; i < n; i++)
        params[i].value.dtype = params[i].grad.dtype = net->dtype;
    free(layer->params);
    net->nparams = n;
    layer->dtype = layer->adtype = net->dtype;
    layer->k = net->k;
    net->layers[net->nlayers++] = layer;
    /* the array may have moved: point every layer at its run again */
    int off = 0;
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        l->params = l->nparams ? net->params + off : NULL;
        off += l->nparams;
    }
    return net->nlayers - 1;
fail:
    fl_layer_free(layer);
    return rc;
}

int fl_net_add(fl_net *net, fl_layer *layer) {
    FL_ASSERT(net);
    int rc = add_layer(net, layer, 1, (int[]){net->nlayers - 1});
    return rc < 0 ? rc : FL_OK;
}

int fl_net_add_from(fl_net *net, fl_layer *layer, int from) {
    FL_ASSERT(net);
    return add_layer(net, layer, 1, &from);
}

int fl_net_add2(fl_net *net, fl_layer *layer, int a, int b) {
    FL_ASSERT(net);
    return add_layer(net, layer, 2, (int[]){a, b});
}

int fl_net_add_n(fl_net *net, fl_layer *layer, int n, const int *inputs) {
    FL_ASSERT(net && (inputs || n < 1));
    return add_layer(net, layer, n, inputs);
}

static void set_batch(fl_tensor *t, int64_t b) {
    t->shape[0] = b;
    t->numel = fl_shape_numel(t->ndim, t->shape);
}

/* Layer i's forward on its inputs (x: the network input in the network's layout). An input of
 * another dtype than the layer's activations is read converted (amp_native.c); a layer that
 * emulates reduced precision (fl_net_set_amp) reads rounded copies of its inputs and
 * parameters, and its output is rounded after. */
static int layer_forward(fl_net *net, int i, const fl_tensor *x, bool training) {
    fl_layer *l = net->layers[i];
    const fl_tensor *in[FL_NET_MAX_INPUTS];
    bool amp = nn_amp_emulated(net->amp, i);
    fl_tensor rin[FL_NET_MAX_INPUTS], cin[FL_NET_MAX_INPUTS];
    for (int k = 0; k < l->ninputs; k++) {
        in[k] = l->inputs[k] < 0 ? x : &net->out[l->inputs[k]];
        in[k] = nn_amp_edge_input(net, i, k, in[k], &cin[k]);
        if (amp)
            in[k] = nn_amp_input(net->amp, net->k, k, in[k], &rin[k]);
    }
    if (amp)
        nn_amp_params(net->amp, net->k, l, true);
    int rc = l->ops->forwardn ? l->ops->forwardn(l, l->ninputs, in, &net->out[i], training)
             : l->ninputs == 2 ? l->ops->forward2(l, in[0], in[1], &net->out[i], training)
                               : l->ops->forward(l, in[0], &net->out[i], training);
    if (amp) {
        nn_amp_params(net->amp, net->k, l, false);
        nn_amp_round(net->amp, net->k, &net->out[i]);
    }
    return rc;
}

int fl_net_forward(fl_net *net, const fl_tensor *x, bool training, const fl_tensor **out) {
    FL_ASSERT(net && x && out);
    char got[96], want[96];
    if (!net->built)
        return fl_fail(FL_ESTATE, "net: forward before fl_net_build");
    if (x->dtype != net->dtype)
        return fl_fail(FL_ESHAPE, "net: input is %s, the network computes in %s",
                       fl_dtype_name(x->dtype), fl_dtype_name(net->dtype));
    bool fits = x->ndim == net->in_ndim + 1;
    for (int i = 0; fits && i < net->in_ndim; i++)
        fits = x->shape[i + 1] == net->in_shape[i];
    if (!fits)
        return fl_fail(FL_ESHAPE, "net: input %s does not match (B, %s), the sample shape given "
                       "to fl_net_build",
                       fl_shape_str(x->ndim, x->shape, got, sizeof got),
                       fl_shape_str(net->in_ndim, net->in_shape, want, sizeof want) + 1);
    int64_t b = x->shape[0];
    if (b > net->max_batch)
        return fl_fail(FL_ESHAPE, "net: batch of %lld exceeds max_batch %lld of fl_net_build",
                       (long long)b, (long long)net->max_batch);
    FL_ASSERT(x->data || x->numel == 0);
    net->have_forward = false;
    fl_tensor xl = *x; // the input in the network's layout
    if (net->x_nhwc) {
        net->k->reorder(net->dtype, true, b, net->in_shape[0],
                        net->in_shape[1] * net->in_shape[2], x->data, net->x_nhwc);
        xl.data = net->x_nhwc;
    }
    x = &xl;
    for (int i = 0; i < net->nlayers; i++) {
        set_batch(&net->out[i], b);
        set_batch(&net->dout[i], b);
        FL_TRY(layer_forward(net, i, x, training));
    }
    net->x = *x;
    net->fwd_training = training;
    net->have_forward = true;
    *out = nn_amp_net_output(net, true);
    return FL_OK;
}

/* Recomputes the outputs of segment seg (ending at layer last) that were not kept, running its
 * layers' forwards as the last forward did; each layer is told (l->replay) to leave its state
 * alone: batch norm does not update its running statistics again, dropout draws the same mask. */
static int replay_segment(fl_net *net, int seg, int last) {
    int first = last;
    while (first > 0 && net->plan.segment[first - 1] == seg)
        first--;
    for (int i = first; i <= last; i++) {
        if (net->plan.kept[i])
            continue;
        fl_layer *l = net->layers[i];
        l->replay = true;
        int rc = layer_forward(net, i, &net->x, net->fwd_training);
        l->replay = false;
        if (rc < 0)
            return fl_fail_prefix(rc, "%s: recomputing its output for backward", l->name);
    }
    return FL_OK;
}

/* One layer's inputs in backward: what it reads (converted to its dtype, rounded when it
 * emulates), where it writes each input's gradient, and how that reaches the producer's. */
typedef struct {
    const fl_tensor *in[FL_NET_MAX_INPUTS];
    fl_tensor       *din[FL_NET_MAX_INPUTS];  /* NULL: not needed */
    fl_tensor       *target[FL_NET_MAX_INPUTS]; /* the producer's output gradient (or dx) */
    bool             edge[FL_NET_MAX_INPUTS];  /* din is in the layer's dtype, target not */
    bool             first[FL_NET_MAX_INPUTS]; /* din is the first gradient target receives */
    fl_tensor rin[FL_NET_MAX_INPUTS], cin[FL_NET_MAX_INPUTS], sum[FL_NET_MAX_INPUTS];
} bwd_inputs;

/* Layer i's inputs and gradient destinations: the first consumer (in reverse) of an output
 * writes its gradient, later ones a scratch in sum_mem that bwd_add_inputs adds; a gradient for
 * an input of another dtype goes to the edge buffer of the layer's dtype. */
static void bwd_inputs_for(fl_net *net, int i, bool amp, bwd_inputs *b) {
    fl_layer *l = net->layers[i];
    size_t sum_off = 0; /* where the next scratch starts in sum_mem */
    for (int k = 0; k < l->ninputs; k++) {
        int from = l->inputs[k];
        b->in[k] = from < 0 ? &net->x : &net->out[from];
        b->in[k] = nn_amp_edge_input(net, i, k, b->in[k], &b->cin[k]);
        if (amp)
            b->in[k] = nn_amp_input(net->amp, net->k, k, b->in[k], &b->rin[k]);
        b->din[k] = NULL; // the network input's gradient: only when asked for
        b->edge[k] = false;
        if (from < 0 && !net->input_grad)
            continue;
        fl_tensor *target = b->target[k] = from < 0 ? &net->dx : &net->dout[from];
        bool *set = from < 0 ? &net->dx_set : &net->dout_set[from];
        b->first[k] = !*set;
        *set = true;
        if (target->dtype != l->adtype) { /* converted after the layer's backward */
            b->sum[k] = *target;
            b->sum[k].dtype = l->adtype;
            b->sum[k].data = net->amp->edge_grad[k];
            b->din[k] = &b->sum[k];
            b->edge[k] = true;
        } else if (b->first[k]) {
            b->din[k] = target;
        } else {
            b->sum[k] = *target;
            b->sum[k].data = (char *)net->sum_mem + sum_off;
            sum_off += nn_round64(fl_tensor_nbytes(target));
            FL_ASSERT(sum_off <= net->sum_bytes); /* as plan_sums (network_build.c) found */
            b->din[k] = &b->sum[k];
        }
    }
}

/* After layer i's backward: each input gradient not written in place reaches its target. */
static void bwd_add_inputs(fl_net *net, int i, const bwd_inputs *b) {
    const fl_layer *l = net->layers[i];
    for (int k = 0; k < l->ninputs; k++) {
        fl_tensor *d = b->din[k], *target = b->target[k];
        if (!d)
            continue;
        if (b->edge[k])
            nn_amp_edge_grad(net, d, target, b->first[k]);
        else if (d->data != target->data)
            net->k->axpy(target->dtype, d->numel, 1.0, d->data, target->data);
    }
}

int fl_net_backward(fl_net *net, const fl_tensor *dout, fl_grad_ready_fn hook, void *ctx) {
    FL_ASSERT(net && dout);
    char got[96], want[96];
    if (!net->have_forward)
        return fl_fail(FL_ESTATE, "net: backward without a successful forward");
    const fl_tensor *last = nn_amp_net_output(net, false);
    if (dout->dtype != net->dtype || !fl_tensor_same_shape(dout, last))
        return fl_fail(FL_ESHAPE, "net: output gradient %s %s does not match the output %s %s",
                       fl_dtype_name(dout->dtype),
                       fl_shape_str(dout->ndim, dout->shape, got, sizeof got),
                       fl_dtype_name(last->dtype),
                       fl_shape_str(last->ndim, last->shape, want, sizeof want));
    memset(net->dout_set, 0, (size_t)net->nlayers * sizeof *net->dout_set);
    net->dx_set = false;
    if (net->input_grad)
        set_batch(&net->dx, net->x.shape[0]);
    fl_tensor scaled = *dout, low; /* mixed precision: dout times the loss scale, in our buffer */
    if (net->amp) {
        scaled.data = net->amp->dout;
        net->k->copy(scaled.data, dout->data, fl_tensor_nbytes(dout), FL_COPY_D2D, NULL);
        if (net->amp->loss_scale != 1.0f)
            net->k->scale(FL_DTYPE_F32, scaled.numel, net->amp->loss_scale, scaled.data);
        dout = nn_amp_last_grad(net, &scaled, &low); /* in the last layer's dtype */
    }
    int valid = net->plan.segment[net->nlayers - 1]; /* the segment whose outputs are in place */
    for (int i = net->nlayers - 1; i >= 0; i--) {
        fl_layer *l = net->layers[i];
        if (net->plan.segment[i] != valid) {
            valid = net->plan.segment[i];
            FL_TRY(replay_segment(net, valid, i));
        }
        const fl_tensor *dy = i == net->nlayers - 1 ? dout : &net->dout[i];
        /* emulated reduced precision: rounded inputs, output gradient and parameters;
         * gradients added to (gradient merge) are kept aside, so that only this backward's are
         * rounded */
        bool amp = nn_amp_emulated(net->amp, i);
        bool aside = amp && net->accumulate && nn_amp_rounds_params(l);
        if (amp) {
            nn_amp_round(net->amp, net->k, i == net->nlayers - 1 ? &scaled : &net->dout[i]);
            if (aside)
                nn_amp_grads_save(net->amp, net->k, l);
            nn_amp_params(net->amp, net->k, l, true);
        }
        bwd_inputs b;
        bwd_inputs_for(net, i, amp, &b);
        const fl_tensor *const *in = b.in;
        fl_tensor **din = b.din;
        bool acc = net->accumulate && !aside;
        int rc = l->ops->forwardn
                     ? l->ops->backwardn(l, l->ninputs, in, &net->out[i], dy, din, acc)
                 : l->ninputs == 2
                     ? l->ops->backward2(l, in[0], in[1], &net->out[i], dy, din[0], din[1], acc)
                     : l->ops->backward(l, in[0], &net->out[i], dy, din[0], acc);
        if (amp) {
            nn_amp_params(net->amp, net->k, l, false);
            if (rc < 0)
                return rc;
            nn_amp_grads_finish(net->amp, net->k, l, aside);
            for (int k = 0; k < l->ninputs; k++)
                if (din[k])
                    nn_amp_round(net->amp, net->k, din[k]);
        }
        FL_TRY(rc);
        bwd_add_inputs(net, i, &b);
        if (hook)
            for (int p = l->nparams - 1; p >= 0; p--)
                if (l->params[p].trainable)
                    hook(ctx, &l->params[p]);
    }
    return FL_OK;
}

void fl_net_set_accumulate(fl_net *net, bool on) { net->accumulate = on; }

int fl_net_set_input_grad(fl_net *net, bool on) {
    FL_ASSERT(net);
    if (net->built)
        return fl_fail(FL_ESTATE, "net: fl_net_set_input_grad after fl_net_build");
    net->input_grad = on;
    return FL_OK;
}

const fl_tensor *fl_net_input_grad(const fl_net *net) {
    FL_ASSERT(net);
    return net->built && net->input_grad ? &net->dx : NULL;
}

size_t fl_net_activation_bytes(const fl_net *net) {
    return net->built ? net->kept_bytes + net->arena_bytes + net->grad_bytes : 0;
}

void fl_net_activation_parts(const fl_net *net, size_t *outputs, size_t *arena, size_t *grads) {
    *outputs = net->built ? net->kept_bytes : 0;
    *arena = net->built ? net->arena_bytes : 0;
    *grads = net->built ? net->grad_bytes : 0;
}

void fl_net_zero_grad(fl_net *net) {
    if (net->built)
        net->k->fill(net->dtype, net->flat_grads, net->numel, 0.0);
}

fl_dtype fl_net_dtype(const fl_net *net) { return net->dtype; }
const fl_backend *fl_net_backend(const fl_net *net) { return net->k; }
fl_layout fl_net_layout(const fl_net *net) { return net->layout; }
int fl_net_num_layers(const fl_net *net) { return net->nlayers; }

fl_layer *fl_net_layer(fl_net *net, int i) {
    FL_ASSERT(i >= 0 && i < net->nlayers);
    return net->layers[i];
}

int fl_net_num_params(const fl_net *net) { return net->nparams; }

fl_param *fl_net_param(fl_net *net, int i) {
    FL_ASSERT(i >= 0 && i < net->nparams);
    return &net->params[i];
}

fl_param *fl_net_find_param(fl_net *net, const char *name) {
    for (int i = 0; i < net->nparams; i++)
        if (strcmp(net->params[i].name, name) == 0)
            return &net->params[i];
    fl_fail(FL_EINVAL, "net: no parameter named '%s'", name);
    return NULL;
}

int64_t fl_net_numel(const fl_net *net) { return net->built ? net->numel : 0; }
void *fl_net_flat_params(fl_net *net) { return net->flat_params; }
void *fl_net_flat_grads(fl_net *net) { return net->flat_grads; }

int fl_net_out_shape(const fl_net *net, int64_t *shape) {
    if (!net->built)
        return fl_fail(FL_ESTATE, "net: output shape asked before fl_net_build");
    const fl_tensor *last = &net->out[net->nlayers - 1];
    memcpy(shape, last->shape + 1, (size_t)(last->ndim - 1) * sizeof *shape);
    return last->ndim - 1;
}

void fl_net_summary(const fl_net *net, FILE *out) {
    char buf[96];
    /* columns as wide as the longest name and type (PP-LCNet's "blocks6.0.se.conv1.weight") */
    int nw = 20, tw = 10;
    for (int i = 0; i < net->nlayers; i++) {
        const fl_layer *l = net->layers[i];
        int len = (int)strlen(l->name), tl = (int)strlen(l->ops->type);
        nw = len > nw ? len : nw;
        tw = tl > tw ? tl : tw;
        for (int p = 0; p < l->nparams; p++) {
            len = (int)strlen(l->params[p].name) + 2;
            nw = len > nw ? len : nw;
        }
    }
    fprintf(out, "%-*s %-*s %-16s %12s\n", nw, "layer / param", tw, "type", "shape", "count");
    for (int i = 0; i < net->nlayers; i++) {
        const fl_layer *l = net->layers[i];
        const char *shape = "?";
        if (net->built)
            shape = fl_shape_str(net->out[i].ndim - 1, net->out[i].shape + 1, buf, sizeof buf);
        const char *rc = "";
        if (net->built && net->plan.enabled)
            rc = net->plan.checkpoint[i] ? " checkpoint"
                 : net->plan.kept[i]     ? " kept"
                                         : " recomputed";
        fprintf(out, "%-*s %-*s %-16s%s\n", nw, l->name, tw, l->ops->type, shape, rc);
        for (int p = 0; p < l->nparams; p++) {
            const fl_param *prm = &l->params[p];
            fprintf(out, "  %-*s %-*s %-16s %12lld\n", nw - 2, prm->name, tw,
                    prm->trainable ? "param" : "buffer",
                    fl_shape_str(prm->value.ndim, prm->value.shape, buf, sizeof buf),
                    (long long)prm->value.numel);
        }
    }
    int64_t total = 0, buffers = 0;
    for (int i = 0; i < net->nparams; i++) {
        if (net->params[i].trainable)
            total += net->params[i].value.numel;
        else
            buffers += net->params[i].value.numel;
    }
    fprintf(out, "total: %lld trainable parameters (%.1f KiB in %s)", (long long)total,
            (double)total * (double)fl_dtype_size(net->dtype) / 1024.0,
            fl_dtype_name(net->dtype));
    if (buffers)
        fprintf(out, ", %lld buffer values", (long long)buffers);
    fprintf(out, "\n");
    double mib = 1024.0 * 1024.0;
    if (net->built && net->plan.enabled)
        fprintf(out, "activations: %.1f MiB for batch %lld: outputs kept %.1f, recompute arena "
                "%.1f, output gradients %.1f\n", (double)fl_net_activation_bytes(net) / mib,
                (long long)net->max_batch, (double)net->kept_bytes / mib,
                (double)net->arena_bytes / mib, (double)net->grad_bytes / mib);
    else if (net->built)
        fprintf(out, "activations: %.1f MiB for batch %lld: outputs %.1f, output gradients %.1f\n",
                (double)fl_net_activation_bytes(net) / mib, (long long)net->max_batch,
                (double)net->kept_bytes / mib, (double)net->grad_bytes / mib);
}
