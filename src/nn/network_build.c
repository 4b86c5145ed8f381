/* network_build.c - fl_net_build: a network's memory, planned once (llm.c style) in four
 * steps: the shapes (and the activation layout), activation placement (per-layer output
 * buffers, or recompute's arena; output-gradient buffers shared where their lifetimes in
 * backward do not overlap, plan_output_grads; one scratch block lent to the layers; the
 * block where gradients of outputs read several times are summed, plan_sums), parameter
 * placement (flat parameter and gradient blocks in one order: a run of parameters is one
 * range, as gradient buckets need), and initialisation. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Frees the activation side of the plan (what nn_net_replan makes again). */
static void unplan_activations(fl_net *net) {
    net->k->free(net->act_mem);
    net->k->free(net->scratch);
    net->k->free(net->sum_mem);
    net->k->free(net->x_nhwc);
    net->x_nhwc = NULL;
    net->k->free(net->dx.data);
    memset(&net->dx, 0, sizeof net->dx);
    net->in_consumers = 0;
    nn_recompute_plan_free(&net->plan);
    net->kept_bytes = net->arena_bytes = net->grad_bytes = 0;
    free(net->out);
    free(net->dout);
    free(net->consumers);
    free(net->dout_set);
    net->act_mem = NULL;
    net->scratch = net->sum_mem = NULL;
    net->scratch_size = net->sum_bytes = 0;
    net->out = net->dout = NULL;
    net->consumers = NULL;
    net->dout_set = NULL;
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->scratch = NULL;
    net->have_forward = false;
}

void nn_net_unplan(fl_net *net) {
    net->k->free(net->flat_params);
    net->k->free(net->flat_grads);
    net->flat_params = net->flat_grads = NULL;
    unplan_activations(net);
    for (int i = 0; i < net->nparams; i++) {
        net->params[i].value.data = NULL;
        net->params[i].grad.data = NULL;
    }
    net->built = net->have_forward = false;
}

/* Output gradients share memory where their lifetimes do not overlap. In backward (layer j at
 * time nlayers - 1 - j) the gradient of output i is written first by its last consumer and read
 * last by layer i itself: live from time nlayers - 1 - (last consumer) to nlayers - 1 - i.
 * Greedily, in order of first write, each takes a slot free before it starts (the smallest
 * that fits, else the largest, grown), or a new one. Writes each gradient's byte offset and
 * returns the bytes of all slots: a chain of layers needs two slots, not one per layer;
 * SIZE_MAX when out of memory. */
static size_t plan_output_grads(fl_net *net, size_t *off) {
    int n = net->nlayers - 1; // the last output's gradient is the caller's
    int *last = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    int *slot_of = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    typedef struct {
        size_t size;
        int    busy_until; /* backward time of its current gradient's last read */
    } slot;
    slot *slots = malloc(sizeof(slot) * (size_t)(n > 0 ? n : 1));
    size_t *base = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1)); /* per slot (<= n) */
    size_t total = SIZE_MAX;
    if (!last || !slot_of || !slots || !base)
        goto done;
    for (int i = 0; i < n; i++)
        last[i] = i;
    for (int j = 0; j < net->nlayers; j++)
        for (int k = 0; k < net->layers[j]->ninputs; k++)
            if (net->layers[j]->inputs[k] >= 0 && j > last[net->layers[j]->inputs[k]])
                last[net->layers[j]->inputs[k]] = j;
    int nslots = 0;
    /* first write at time nlayers - 1 - last[i]: later last consumers start earlier */
    for (int t = 0; t < net->nlayers; t++)
        for (int i = 0; i < n; i++) {
            if (net->nlayers - 1 - last[i] != t)
                continue;
            size_t need = nn_round64(fl_tensor_nbytes(&net->dout[i]));
            int best = -1;
            for (int s = 0; s < nslots; s++) {
                if (slots[s].busy_until >= t)
                    continue;
                bool fits = slots[s].size >= need, bfits = best >= 0 && slots[best].size >= need;
                if (best < 0 || (fits && (!bfits || slots[s].size < slots[best].size)) ||
                    (!fits && !bfits && slots[s].size > slots[best].size))
                    best = s;
            }
            if (best < 0)
                slots[best = nslots++] = (slot){0, 0};
            if (slots[best].size < need)
                slots[best].size = need;
            slots[best].busy_until = net->nlayers - 1 - i;
            slot_of[i] = best;
        }
    total = 0;
    for (int s = 0; s < nslots; s++) {
        base[s] = total;
        total += slots[s].size;
    }
    for (int i = 0; i < n; i++)
        off[i] = base[slot_of[i]];
done:
    free(base);
    free(slots);
    free(slot_of);
    free(last);
    return total;
}

/* The sample shape of layer input `from` (an earlier layer's output or the network input). */
static void shape_of(const fl_net *net, int from, int *ndim, const int64_t **shape) {
    *ndim = from < 0 ? net->in_ndim : net->out[from].ndim - 1;
    *shape = from < 0 ? net->in_shape : net->out[from].shape + 1;
}

/* The input sample shape of layer l (*ndim, *shape): the network's input or an earlier
 * layer's output (its first input's), the same for each of its inputs unless the layer has
 * infer_shape2 or infer_shapen (which receive them all); count: add l to its producers'
 * consumers. */
static int layer_input_shape(fl_net *net, const fl_layer *l, bool count, int *ndim,
                             const int64_t **shape) {
    char buf[96], other[96];
    *ndim = net->in_ndim;
    *shape = net->in_shape;
    for (int k = 0; k < l->ninputs; k++) {
        int from = l->inputs[k], kndim;
        const int64_t *kshape;
        shape_of(net, from, &kndim, &kshape);
        if (from >= 0 && count)
            net->consumers[from]++;
        else if (count)
            net->in_consumers++;
        if (k == 0) {
            *ndim = kndim;
            *shape = kshape;
        } else if (!l->ops->infer_shape2 && !l->ops->infer_shapen &&
                   (kndim != *ndim || memcmp(kshape, *shape, (size_t)*ndim * sizeof **shape))) {
            return fl_fail(FL_ESHAPE, "%s: inputs %s and %s differ in shape", l->name,
                           fl_shape_str(*ndim, *shape, buf, sizeof buf),
                           fl_shape_str(kndim, kshape, other, sizeof other));
        }
    }
    return FL_OK;
}

/* The most bytes of gradient sums one layer's backward needs, as network.c's backward takes
 * them: layers run back in reverse order, the first to reach an output (or the network input,
 * when its gradient is on) writes its gradient, and each later input reading it writes a
 * scratch of its own in sum_mem (64-byte aligned, one after the other), added in after the
 * layer's backward. Sizes at max_batch. */
static size_t plan_sums(fl_net *net) {
    bool *set = net->dout_set, dx_set = false; /* unused until backward: reset below */
    size_t most = 0;
    for (int i = net->nlayers - 1; i >= 0; i--) {
        const fl_layer *l = net->layers[i];
        size_t need = 0;
        for (int k = 0; k < l->ninputs; k++) {
            int from = l->inputs[k];
            if (from < 0 && !net->input_grad)
                continue;
            bool *s = from < 0 ? &dx_set : &set[from];
            if (*s)
                need += nn_round64(fl_tensor_nbytes(from < 0 ? &net->dx : &net->out[from]));
            *s = true;
        }
        most = need > most ? need : most;
    }
    memset(set, 0, (size_t)net->nlayers * sizeof *set);
    return most;
}

/* Shapes: out[i] and dout[i] become (max_batch, sample shape of layer i) views until forward
 * sets B; net->layout is settled; every output but the last must feed a layer. Returns in
 * *scratch the most scratch a layer asks for, in *sum_bytes the gradient sums' (plan_sums). */
static int plan_shapes(fl_net *net, size_t *scratch, size_t *sum_bytes) {
    char buf[96];
    int rc;
    size_t esize = fl_dtype_size(net->dtype);
    int64_t max_batch = net->max_batch;
    net->out = calloc((size_t)net->nlayers, sizeof *net->out);
    net->dout = calloc((size_t)net->nlayers, sizeof *net->dout);
    net->consumers = calloc((size_t)net->nlayers, sizeof *net->consumers);
    net->dout_set = calloc((size_t)net->nlayers, sizeof *net->dout_set);
    if (!net->out || !net->dout || !net->consumers || !net->dout_set)
        return fl_fail(FL_ENOMEM, "net: out of memory");
    net->in_consumers = 0;
    *scratch = *sum_bytes = 0;
    /* pass 0 infers the shapes in NCHW and settles the layout; pass 1 infers them again in
     * that layout (layers plan their kernels for it) and sizes the memory */
    fl_dtype act = net->dtype; /* the low dtype where mixed precision runs layers in it */
    for (int i = 0; i < net->nlayers; i++)
        act = net->layers[i]->adtype != net->dtype ? net->layers[i]->adtype : act;
    fl_layout best = net->k->preferred_layout(act);
    net->layout = FL_LAYOUT_NCHW;
    for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        l->layout = net->layout;
        int ndim;
        const int64_t *shape;
        if ((rc = layer_input_shape(net, l, pass == 1, &ndim, &shape)) < 0)
            return rc;
        if (pass == 0 && ndim == 3 && !l->ops->nhwc)
            best = FL_LAYOUT_NCHW; // it would read a spatial activation in NCHW order
        int ondim = 0;
        int64_t oshape[FL_MAX_DIMS];
        if (l->ops->forwardn && l->ops->infer_shapen) {
            int ndims[FL_NET_MAX_INPUTS];
            const int64_t *shapes[FL_NET_MAX_INPUTS];
            for (int k = 0; k < l->ninputs; k++)
                shape_of(net, l->inputs[k], &ndims[k], &shapes[k]);
            rc = l->ops->infer_shapen(l, l->ninputs, ndims, shapes, &ondim, oshape);
        } else if (l->ninputs == 2 && l->ops->infer_shape2) {
            int ndim2;
            const int64_t *shape2;
            shape_of(net, l->inputs[1], &ndim2, &shape2);
            rc = l->ops->infer_shape2(l, ndim, shape, ndim2, shape2, &ondim, oshape);
        } else {
            rc = l->ops->infer_shape(l, ndim, shape, &ondim, oshape);
        }
        if (rc < 0)
            return rc;
        if (pass == 0 && i == net->nlayers - 1) {
            if (ondim == 3)
                best = FL_LAYOUT_NCHW; // the caller reads the output in NCHW order
            net->layout = best;
        }
        if (ondim < 0 || ondim > FL_MAX_DIMS - 1)
            return fl_fail(FL_ESHAPE, "%s: output has %d dimensions (at most %d)", l->name,
                           ondim, FL_MAX_DIMS - 1);
        int64_t full[FL_MAX_DIMS] = {max_batch};
        memcpy(full + 1, oshape, (size_t)ondim * sizeof *oshape);
        int64_t sample = fl_shape_numel(ondim, oshape);
        if (sample < 0 || (sample > 0 && max_batch > INT64_MAX / (int64_t)esize / sample))
            return fl_fail(FL_ESHAPE, "%s: output %s is too large for batch %lld", l->name,
                           fl_shape_str(ondim, oshape, buf, sizeof buf), (long long)max_batch);
        fl_tensor_view(&net->out[i], l->adtype, ondim + 1, full, NULL);
        fl_tensor_view(&net->dout[i], l->adtype, ondim + 1, full, NULL);
        if (pass == 0 || !l->ops->scratch_bytes)
            continue;
        size_t want = l->ops->scratch_bytes(l, max_batch);
        if (want == SIZE_MAX)
            return fl_fail(FL_EINVAL, "%s: %s", l->name, fl_errmsg());
        *scratch = want > *scratch ? want : *scratch;
    }
    for (int i = 0; i < net->nlayers - 1; i++) {
        if (net->consumers[i] == 0)
            return fl_fail(FL_ESHAPE, "%s: its output feeds no layer (only the last layer's "
                           "output may be unused)", net->layers[i]->name);
    }
    if (net->input_grad) {
        if (net->layout == FL_LAYOUT_NHWC && net->in_ndim == 3)
            return fl_fail(FL_EUNSUPPORTED, "net: the input gradient of a network computing in "
                           "NHWC is not supported (fl_net_set_input_grad)");
        int64_t full[FL_MAX_DIMS] = {max_batch};
        memcpy(full + 1, net->in_shape, (size_t)net->in_ndim * sizeof *full);
        fl_tensor_view(&net->dx, net->dtype, net->in_ndim + 1, full, NULL);
    }
    *sum_bytes = plan_sums(net);
    return FL_OK;
}

/* The backend memory of the activations: one block of act_bytes (outputs, then output
 * gradients), the NHWC copy of the input where the network runs in NHWC, the layers' scratch
 * and the gradient sums' block. */
static int alloc_activations(fl_net *net, size_t act_bytes, size_t scratch, size_t sum_bytes) {
    size_t esize = fl_dtype_size(net->dtype);
    if (net->layout == FL_LAYOUT_NHWC && net->in_ndim == 3 &&
        !(net->x_nhwc = net->k->alloc((size_t)(net->max_batch *
                                               fl_shape_numel(net->in_ndim, net->in_shape)) *
                                      esize)))
        return fl_fail(FL_ENOMEM, "net: cannot allocate the NHWC input");
    net->act_mem = net->k->alloc(act_bytes);
    if (!net->act_mem)
        return fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of activations", act_bytes);
    if (scratch > 0 && !(net->scratch = net->k->alloc(scratch)))
        return fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of layer scratch", scratch);
    net->scratch_size = scratch;
    if (net->input_grad && !(net->dx.data = net->k->alloc(fl_tensor_nbytes(&net->dx))))
        return fl_fail(FL_ENOMEM, "net: cannot allocate the input gradient");
    if (sum_bytes > 0 && !(net->sum_mem = net->k->alloc(sum_bytes)))
        return fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of gradient sums", sum_bytes);
    net->sum_bytes = sum_bytes;
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->scratch = net->scratch;
    return FL_OK;
}

/* Activation placement: the recompute plan decides which outputs are kept; the kept ones
 * each get their own buffer, the others live in the arena, where each segment's take
 * consecutive places from its start; output gradients follow in their shared slots. */
static int place_activations(fl_net *net, size_t scratch, size_t sum_bytes) {
    int rc;
    size_t *out_sizes = malloc((size_t)net->nlayers * sizeof *out_sizes);
    if (!out_sizes)
        return fl_fail(FL_ENOMEM, "net: out of memory");
    for (int i = 0; i < net->nlayers; i++)
        out_sizes[i] = nn_round64(fl_tensor_nbytes(&net->out[i]));
    rc = nn_recompute_plan_make(net->layers, net->nlayers, net->recompute_spec, out_sizes,
                                &net->plan);
    size_t kept_bytes = 0, arena_bytes = 0;
    if (rc == FL_OK)
        nn_recompute_plan_sizes(&net->plan, net->nlayers, out_sizes, &kept_bytes, &arena_bytes);
    free(out_sizes);
    if (rc < 0)
        return rc;
    size_t *dout_off = calloc((size_t)net->nlayers, sizeof *dout_off);
    if (!dout_off)
        return fl_fail(FL_ENOMEM, "net: out of memory");
    size_t out_bytes = kept_bytes + arena_bytes, grad_bytes = plan_output_grads(net, dout_off);
    if (grad_bytes == SIZE_MAX) {
        rc = fl_fail(FL_ENOMEM, "net: out of memory");
        goto done;
    }
    if ((rc = alloc_activations(net, out_bytes + grad_bytes, scratch, sum_bytes)) < 0)
        goto done;
    char *p = net->act_mem, *arena = p + kept_bytes, *q = arena;
    for (int i = 0; i < net->nlayers; i++) {
        size_t nb = nn_round64(fl_tensor_nbytes(&net->out[i]));
        if (i > 0 && net->plan.segment[i] != net->plan.segment[i - 1])
            q = arena;
        if (net->plan.kept[i]) {
            net->out[i].data = p;
            p += nb;
        } else {
            net->out[i].data = q;
            q += nb;
        }
    }
    net->kept_bytes = kept_bytes;
    net->arena_bytes = arena_bytes;
    net->grad_bytes = grad_bytes;
    for (int i = 0; i < net->nlayers - 1; i++)
        net->dout[i].data = (char *)net->act_mem + out_bytes + dout_off[i];
done:
    free(dout_off);
    return rc;
}

/* Parameter placement: trainable values and gradients at the same offsets, buffers after. */
static int place_params(fl_net *net) {
    size_t esize = fl_dtype_size(net->dtype);
    net->numel = net->numel_all = 0;
    for (int i = 0; i < net->nparams; i++) {
        net->numel_all += net->params[i].value.numel;
        if (net->params[i].trainable)
            net->numel += net->params[i].value.numel;
    }
    net->flat_params = net->k->alloc((size_t)net->numel_all * esize);
    net->flat_grads = net->k->alloc((size_t)net->numel * esize);
    if (!net->flat_params || !net->flat_grads)
        return fl_fail(FL_ENOMEM, "net: cannot allocate %lld parameters",
                       (long long)net->numel_all);
    int64_t off = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < net->nparams; i++) {
            fl_param *prm = &net->params[i];
            if (prm->trainable != (pass == 0))
                continue;
            prm->value.data = (char *)net->flat_params + (size_t)off * esize;
            prm->grad.data = prm->trainable ? (char *)net->flat_grads + (size_t)off * esize : NULL;
            off += prm->value.numel;
        }
    }
    return FL_OK;
}

/* Initialisation: param j from stream NN_INIT_STREAM + j (see nn_impl.h). Layers' init writes
 * host memory: on a device backend they write a host copy, which then moves. */
static int init_params(fl_net *net, uint64_t seed) {
    size_t pbytes = (size_t)net->numel_all * fl_dtype_size(net->dtype);
    char *host = NULL;
    if (!net->k->host_memory) {
        if (!(host = fl_alloc_aligned(pbytes ? pbytes : 1)))
            return fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes to initialise", pbytes);
        memset(host, 0, pbytes);
        for (int i = 0; i < net->nparams; i++)
            net->params[i].value.data =
                host + ((char *)net->params[i].value.data - (char *)net->flat_params);
    }
    int j = 0;
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        if (l->ops->init && l->nparams > 0) {
            fl_rng r;
            fl_rng_init(&r, seed, NN_INIT_STREAM + (uint64_t)j);
            l->ops->init(l, &r);
        }
        j += l->nparams;
    }
    if (host) {
        for (int i = 0; i < net->nparams; i++)
            net->params[i].value.data =
                (char *)net->flat_params + ((char *)net->params[i].value.data - host);
        net->k->copy(net->flat_params, host, pbytes, FL_COPY_H2D, NULL);
        net->k->stream_sync(NULL);
        fl_free_aligned(host);
    }
    return FL_OK;
}

/* fl_net_set_amp before build (strategy.amp through fl_strategy_plan_amp): the layers that
 * will run low natively take their low adtype before anything is planned, so that their
 * activations and convolution plans are made once (fl_net_set_amp after build plans the f32
 * ones first: on the cuda table with ResNet-50 at batch 64, a 7.7 GB f32 activation block and
 * 53 f32 plans before the 3.9 GB low ones). The emulation and the rest of the set-up follow
 * the build (apply_amp_request). */
static int preset_amp_dtypes(fl_net *net) {
    if (net->amp_want == FL_DTYPE_F32 || !net->amp_native || !net->k->low_dtypes ||
        !net->k->convert || net->dtype != FL_DTYPE_F32 || !net->k->amp_round)
        return FL_OK; /* emulated, or refused by fl_net_set_amp after the build */
    size_t n = (size_t)(net->nlayers > 0 ? net->nlayers : 1);
    bool *white = calloc(n, sizeof *white), *runs = calloc(n, sizeof *runs);
    int rc = white && runs ? nn_amp_white_layers(net, net->amp_want_white, white)
                           : fl_fail(FL_ENOMEM, "net: amp: out of memory");
    if (rc == FL_OK) {
        nn_amp_native_runs(net, white, runs);
        for (int i = 0; i < net->nlayers; i++)
            net->layers[i]->adtype = runs[i] ? net->amp_want : net->dtype;
    }
    free(white);
    free(runs);
    return rc;
}

/* After the build: fl_net_set_amp as asked (it finds the low layers planned already), the
 * request dropped; on failure the network is unbuilt and every layer back in its dtype. */
static int apply_amp_request(fl_net *net) {
    fl_dtype low = net->amp_want;
    char *white = net->amp_want_white;
    net->amp_want = FL_DTYPE_F32;
    net->amp_want_white = NULL;
    int rc = low == FL_DTYPE_F32 ? FL_OK : fl_net_set_amp(net, low, white);
    free(white);
    if (rc < 0) {
        nn_net_unplan(net);
        for (int i = 0; i < net->nlayers; i++)
            net->layers[i]->adtype = net->dtype;
    }
    return rc;
}

int fl_net_build(fl_net *net, int in_ndim, const int64_t *in_shape, int64_t max_batch,
                 uint64_t seed) {
    FL_ASSERT(net);
    int rc;
    char buf[96];
    if (net->built)
        return fl_fail(FL_ESTATE, "net: already built");
    if (net->nlayers == 0)
        return fl_fail(FL_ESTATE, "net: no layers to build");
    if (in_ndim < 1 || in_ndim > FL_MAX_DIMS - 1)
        return fl_fail(FL_ESHAPE, "net: input sample has %d dimensions (1 to %d allowed)",
                       in_ndim, FL_MAX_DIMS - 1);
    for (int i = 0; i < in_ndim; i++)
        if (in_shape[i] < 1)
            return fl_fail(FL_ESHAPE, "net: input sample shape %s has an empty dimension",
                           fl_shape_str(in_ndim, in_shape, buf, sizeof buf));
    if (max_batch < 1)
        return fl_fail(FL_EINVAL, "net: max_batch %lld must be at least 1",
                       (long long)max_batch);
    net->in_ndim = in_ndim;
    memcpy(net->in_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    net->max_batch = max_batch;

    size_t scratch = 0, sum_bytes = 0;
    if ((rc = preset_amp_dtypes(net)) < 0 || (rc = plan_shapes(net, &scratch, &sum_bytes)) < 0 ||
        (rc = place_activations(net, scratch, sum_bytes)) < 0 ||
        (rc = place_params(net)) < 0 || (rc = init_params(net, seed)) < 0) {
        nn_net_unplan(net);
        for (int i = 0; i < net->nlayers; i++) /* as before preset_amp_dtypes */
            net->layers[i]->adtype = net->dtype;
        return rc;
    }
    /* every tensor the network planned is the backend's memory */
    fl_device dev = fl_backend_device(net->k);
    for (int i = 0; i < net->nparams; i++)
        net->params[i].value.device = net->params[i].grad.device = dev;
    for (int i = 0; i < net->nlayers; i++)
        net->out[i].device = net->dout[i].device = dev;
    net->dx.device = dev;
    net->built = true;
    return apply_amp_request(net);
}

int nn_net_replan(fl_net *net) {
    FL_ASSERT(net->built);
    unplan_activations(net);
    size_t scratch = 0, sum_bytes = 0;
    int rc;
    if ((rc = plan_shapes(net, &scratch, &sum_bytes)) < 0 ||
        (rc = place_activations(net, scratch, sum_bytes)) < 0) {
        nn_net_unplan(net);
        return rc;
    }
    fl_device dev = fl_backend_device(net->k);
    for (int i = 0; i < net->nlayers; i++)
        net->out[i].device = net->dout[i].device = dev;
    net->dx.device = dev;
    return FL_OK;
}
