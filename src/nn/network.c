/* network.c - layers in insertion order, each reading the previous layer's output or any
 * earlier one's (a small DAG, for residual networks), whose memory fl_net_build plans once
 * (llm.c style): flat parameter and gradient blocks in one order (a run of parameters is one
 * range, as gradient buckets need), per-layer output buffers, output-gradient buffers shared
 * where their lifetimes in backward do not overlap (plan_output_grads), one scratch
 * block lent to the layers, and the buffers that sum gradients of outputs read twice. Steps
 * allocate nothing. */
#include "nn_impl.h"

#include "fleet/status.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct fl_net {
    fl_dtype             dtype;
    const fl_backend *k;
    fl_layer           **layers;
    int                  nlayers;
    /* Every layer's parameters, in layer order, trainable first within a layer; each layer's
     * params field points at its run here, so fl_net_param(net, 0) starts an fl_param array. */
    fl_param            *params;
    int                  nparams;

    bool    built, accumulate, have_forward;
    int     in_ndim;
    int64_t in_shape[FL_MAX_DIMS];
    int64_t max_batch;
    int64_t numel;       /* trainable scalars: flat_grads holds exactly these */
    int64_t numel_all;   /* plus buffers, placed after the trainable values */
    void   *flat_params; /* (numel_all): trainable values in param order, then buffers */
    void   *flat_grads;  /* (numel): gradients, same order and offsets as flat_params */
    void   *act_mem;     /* all outputs, then all output gradients */
    fl_tensor *out;      /* [nlayers] output of layer i, (B, sample shape of layer i) */
    fl_tensor *dout;     /* [nlayers] gradient of the loss w.r.t. out[i]; the last is unused */
    fl_tensor  x;        /* input of the last forward (borrowed) */
    int       *consumers;/* [nlayers] how many layer inputs read out[i] */
    bool      *dout_set; /* [nlayers] backward: dout[i] already holds a consumer's gradient */
    void      *scratch;  /* lent to layers (ops->scratch_bytes), scratch_size bytes */
    size_t     scratch_size;
    void      *sum_mem[2]; /* input gradients of outputs read twice, summed into dout */
    /* activation layout: the backend's preferred one where every layer reading a spatial
     * (C, H, W) activation runs on it (ops->nhwc), else NCHW; an NHWC network reorders its
     * NCHW input into x_nhwc, its only edge (a network whose output is spatial stays NCHW) */
    fl_layout  layout;
    void      *x_nhwc;
    /* recompute (fl_net_set_recompute): outputs not kept live in one arena that every segment
     * reuses, in forward and again when backward recomputes them */
    char              *recompute_spec; /* NULL: off */
    nn_recompute_plan  plan;
    size_t             kept_bytes, arena_bytes, grad_bytes; /* activation memory: outputs
                                                             * kept, arena, output gradients */
    bool               fwd_training;   /* of the last forward, which backward replays */
    nn_amp            *amp;            /* mixed precision (fl_net_set_amp); NULL: off */
};

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
    return net;
}

void fl_net_set_backend(fl_net *net, const fl_backend *k) {
    FL_ASSERT(net && !net->built);
    net->k = k ? k : fl_backend_cpu();
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->k = net->k;
}

/* Frees what fl_net_build allocated and returns the network to its unbuilt state. */
static void unplan(fl_net *net) {
    nn_amp_free(net->k, net->amp);
    net->amp = NULL;
    net->k->free(net->flat_params);
    net->k->free(net->flat_grads);
    net->k->free(net->act_mem);
    net->k->free(net->scratch);
    net->k->free(net->sum_mem[0]);
    net->k->free(net->sum_mem[1]);
    net->k->free(net->x_nhwc);
    net->x_nhwc = NULL;
    nn_recompute_plan_free(&net->plan);
    net->kept_bytes = net->arena_bytes = net->grad_bytes = 0;
    free(net->out);
    free(net->dout);
    free(net->consumers);
    free(net->dout_set);
    net->flat_params = net->flat_grads = net->act_mem = NULL;
    net->scratch = net->sum_mem[0] = net->sum_mem[1] = NULL;
    net->scratch_size = 0;
    net->out = net->dout = NULL;
    net->consumers = NULL;
    net->dout_set = NULL;
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->scratch = NULL;
    for (int i = 0; i < net->nparams; i++) {
        net->params[i].value.data = NULL;
        net->params[i].grad.data = NULL;
    }
    net->built = net->have_forward = false;
}

void fl_net_free(fl_net *net) {
    if (!net)
        return;
    unplan(net);
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        if (l->ops->destroy)
            l->ops->destroy(l);
        free(l); // its params live in net->params
    }
    free(net->layers);
    free(net->params);
    free(net->recompute_spec);
    free(net);
}

/* Appends layer reading inputs[0..ninputs); returns its index or a negative status. */
static int add_layer(fl_net *net, fl_layer *layer, int ninputs, const int *inputs) {
    FL_ASSERT(net && layer);
    int rc;
    bool two = ninputs == 2;
    if (two ? !layer->ops->forward2 || !layer->ops->backward2
            : !layer->ops->forward || !layer->ops->backward) {
        rc = fl_fail(FL_EINVAL, "%s: a %s layer takes %s input%s (use %s)", layer->name,
                     layer->ops->type, two ? "one" : "two", two ? "" : "s",
                     two ? "fl_net_add or fl_net_add_from" : "fl_net_add2");
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
    layer->dtype = net->dtype;
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

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static void set_batch(fl_tensor *t, int64_t b) {
    t->shape[0] = b;
    t->numel = fl_shape_numel(t->ndim, t->shape);
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
            size_t need = round64(fl_tensor_nbytes(&net->dout[i]));
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
    size_t esize = fl_dtype_size(net->dtype);
    net->in_ndim = in_ndim;
    memcpy(net->in_shape, in_shape, (size_t)in_ndim * sizeof *in_shape);
    net->max_batch = max_batch;

    /* shapes: out[i] is (max_batch, sample shape of layer i) until forward sets B */
    net->out = calloc((size_t)net->nlayers, sizeof *net->out);
    net->dout = calloc((size_t)net->nlayers, sizeof *net->dout);
    net->consumers = calloc((size_t)net->nlayers, sizeof *net->consumers);
    net->dout_set = calloc((size_t)net->nlayers, sizeof *net->dout_set);
    if (!net->out || !net->dout || !net->consumers || !net->dout_set) {
        rc = fl_fail(FL_ENOMEM, "net: out of memory");
        goto fail;
    }
    size_t scratch = 0, sum_bytes = 0;
    /* pass 0 infers the shapes in NCHW and settles the layout; pass 1 infers them again in
     * that layout (layers plan their kernels for it) and sizes the memory */
    fl_layout best = net->k->preferred_layout(net->dtype);
    net->layout = FL_LAYOUT_NCHW;
    for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        l->layout = net->layout;
        /* the input sample shape: the network's or an earlier layer's output */
        int ndim = in_ndim;
        const int64_t *shape = in_shape;
        for (int k = 0; k < l->ninputs; k++) {
            int from = l->inputs[k];
            int kndim = from < 0 ? in_ndim : net->out[from].ndim - 1;
            const int64_t *kshape = from < 0 ? in_shape : net->out[from].shape + 1;
            if (from >= 0 && pass == 1)
                net->consumers[from]++;
            if (k == 0) {
                ndim = kndim;
                shape = kshape;
            } else if (kndim != ndim || memcmp(kshape, shape, (size_t)ndim * sizeof *shape)) {
                char other[96];
                rc = fl_fail(FL_ESHAPE, "%s: inputs %s and %s differ in shape", l->name,
                             fl_shape_str(ndim, shape, buf, sizeof buf),
                             fl_shape_str(kndim, kshape, other, sizeof other));
                goto fail;
            }
        }
        if (pass == 0 && ndim == 3 && !l->ops->nhwc)
            best = FL_LAYOUT_NCHW; // it would read a spatial activation in NCHW order
        int ondim = 0;
        int64_t oshape[FL_MAX_DIMS];
        rc = l->ops->infer_shape(l, ndim, shape, &ondim, oshape);
        if (rc < 0)
            goto fail;
        if (pass == 0 && i == net->nlayers - 1) {
            if (ondim == 3)
                best = FL_LAYOUT_NCHW; // the caller reads the output in NCHW order
            net->layout = best;
        }
        if (ondim < 0 || ondim > FL_MAX_DIMS - 1) {
            rc = fl_fail(FL_ESHAPE, "%s: output has %d dimensions (at most %d)", l->name, ondim,
                         FL_MAX_DIMS - 1);
            goto fail;
        }
        int64_t full[FL_MAX_DIMS] = {max_batch};
        memcpy(full + 1, oshape, (size_t)ondim * sizeof *oshape);
        int64_t sample = fl_shape_numel(ondim, oshape);
        if (sample < 0 || (sample > 0 && max_batch > INT64_MAX / (int64_t)esize / sample)) {
            rc = fl_fail(FL_ESHAPE, "%s: output %s is too large for batch %lld", l->name,
                         fl_shape_str(ondim, oshape, buf, sizeof buf), (long long)max_batch);
            goto fail;
        }
        fl_tensor_view(&net->out[i], net->dtype, ondim + 1, full, NULL);
        fl_tensor_view(&net->dout[i], net->dtype, ondim + 1, full, NULL);
        if (pass == 0)
            continue;
        if (l->ops->scratch_bytes) {
            size_t want = l->ops->scratch_bytes(l, max_batch);
            if (want == SIZE_MAX) {
                rc = fl_fail(FL_EINVAL, "%s: %s", l->name, fl_errmsg());
                goto fail;
            }
            scratch = want > scratch ? want : scratch;
        }
    }
    for (int i = 0; i < net->nlayers - 1; i++) {
        if (net->consumers[i] == 0) {
            rc = fl_fail(FL_ESHAPE, "%s: its output feeds no layer (only the last layer's "
                         "output may be unused)", net->layers[i]->name);
            goto fail;
        }
        if (net->consumers[i] > 1 && fl_tensor_nbytes(&net->out[i]) > sum_bytes)
            sum_bytes = fl_tensor_nbytes(&net->out[i]);
    }
    /* outputs: the kept ones each their own buffer, the others in the arena, where each
     * segment's take consecutive places from its start */
    size_t *out_sizes = malloc((size_t)net->nlayers * sizeof *out_sizes);
    if (!out_sizes) {
        rc = fl_fail(FL_ENOMEM, "net: out of memory");
        goto fail;
    }
    for (int i = 0; i < net->nlayers; i++)
        out_sizes[i] = round64(fl_tensor_nbytes(&net->out[i]));
    rc = nn_recompute_plan_make(net->layers, net->nlayers, net->recompute_spec, out_sizes,
                                &net->plan);
    size_t kept_bytes = 0, arena_bytes = 0;
    if (rc == FL_OK)
        nn_recompute_plan_sizes(&net->plan, net->nlayers, out_sizes, &kept_bytes, &arena_bytes);
    free(out_sizes);
    if (rc < 0)
        goto fail;
    size_t act_bytes = kept_bytes + arena_bytes;
    size_t *dout_off = calloc((size_t)net->nlayers, sizeof *dout_off);
    if (!dout_off) {
        rc = fl_fail(FL_ENOMEM, "net: out of memory");
        goto fail;
    }
    size_t out_bytes = act_bytes, grad_bytes = plan_output_grads(net, dout_off);
    if (grad_bytes == SIZE_MAX) {
        free(dout_off);
        rc = fl_fail(FL_ENOMEM, "net: out of memory");
        goto fail;
    }
    act_bytes += grad_bytes;
    if (net->layout == FL_LAYOUT_NHWC && in_ndim == 3 &&
        !(net->x_nhwc = net->k->alloc((size_t)(max_batch * fl_shape_numel(in_ndim, in_shape)) *
                                      esize))) {
        free(dout_off);
        rc = fl_fail(FL_ENOMEM, "net: cannot allocate the NHWC input");
        goto fail;
    }
    net->act_mem = net->k->alloc(act_bytes);
    if (!net->act_mem) {
        free(dout_off);
        rc = fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of activations", act_bytes);
        goto fail;
    }
    if (scratch > 0 && !(net->scratch = net->k->alloc(scratch))) {
        free(dout_off);
        rc = fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of layer scratch", scratch);
        goto fail;
    }
    net->scratch_size = scratch;
    for (int k = 0; k < 2 && sum_bytes > 0; k++) {
        if (!(net->sum_mem[k] = net->k->alloc(sum_bytes))) {
            free(dout_off);
            rc = fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes of gradient sums", sum_bytes);
            goto fail;
        }
    }
    for (int i = 0; i < net->nlayers; i++)
        net->layers[i]->scratch = net->scratch;
    char *p = net->act_mem, *arena = p + kept_bytes, *q = arena;
    for (int i = 0; i < net->nlayers; i++) {
        size_t nb = round64(fl_tensor_nbytes(&net->out[i]));
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
    free(dout_off);

    /* parameters: trainable values and gradients at the same offsets, buffers after */
    net->numel = net->numel_all = 0;
    for (int i = 0; i < net->nparams; i++) {
        net->numel_all += net->params[i].value.numel;
        if (net->params[i].trainable)
            net->numel += net->params[i].value.numel;
    }
    net->flat_params = net->k->alloc((size_t)net->numel_all * esize);
    net->flat_grads = net->k->alloc((size_t)net->numel * esize);
    if (!net->flat_params || !net->flat_grads) {
        rc = fl_fail(FL_ENOMEM, "net: cannot allocate %lld parameters",
                     (long long)net->numel_all);
        goto fail;
    }
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

    /* initialisation: param j from stream NN_INIT_STREAM + j (see nn_impl.h). Layers' init
     * writes host memory: on a device backend they write a host copy, which then moves. */
    size_t pbytes = (size_t)net->numel_all * esize;
    char *host = NULL;
    if (!net->k->host_memory) {
        if (!(host = fl_alloc_aligned(pbytes ? pbytes : 1))) {
            rc = fl_fail(FL_ENOMEM, "net: cannot allocate %zu bytes to initialise", pbytes);
            goto fail;
        }
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
    /* every tensor the network planned is the backend's memory */
    fl_device dev = fl_backend_device(net->k);
    for (int i = 0; i < net->nparams; i++)
        net->params[i].value.device = net->params[i].grad.device = dev;
    for (int i = 0; i < net->nlayers; i++)
        net->out[i].device = net->dout[i].device = dev;
    net->built = true;
    return FL_OK;
fail:
    unplan(net);
    return rc;
}

/* Layer i's forward on its inputs (x: the network input in the network's layout). A layer
 * that computes in reduced precision (fl_net_set_amp) reads rounded copies of its inputs and
 * parameters, and its output is rounded after. */
static int layer_forward(fl_net *net, int i, const fl_tensor *x, bool training) {
    fl_layer *l = net->layers[i];
    const fl_tensor *a = l->inputs[0] < 0 ? x : &net->out[l->inputs[0]];
    const fl_tensor *bx = NULL;
    if (l->ninputs == 2)
        bx = l->inputs[1] < 0 ? x : &net->out[l->inputs[1]];
    bool amp = net->amp && net->amp->white[i];
    fl_tensor ra, rb;
    if (amp) {
        a = nn_amp_input(net->amp, net->k, 0, a, &ra);
        if (bx)
            bx = nn_amp_input(net->amp, net->k, 1, bx, &rb);
        nn_amp_params(net->amp, net->k, l, true);
    }
    int rc = bx ? l->ops->forward2(l, a, bx, &net->out[i], training)
                : l->ops->forward(l, a, &net->out[i], training);
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
    *out = &net->out[net->nlayers - 1];
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

int fl_net_backward(fl_net *net, const fl_tensor *dout, fl_grad_ready_fn hook, void *ctx) {
    FL_ASSERT(net && dout);
    char got[96], want[96];
    if (!net->have_forward)
        return fl_fail(FL_ESTATE, "net: backward without a successful forward");
    const fl_tensor *last = &net->out[net->nlayers - 1];
    if (dout->dtype != net->dtype || !fl_tensor_same_shape(dout, last))
        return fl_fail(FL_ESHAPE, "net: output gradient %s %s does not match the output %s %s",
                       fl_dtype_name(dout->dtype),
                       fl_shape_str(dout->ndim, dout->shape, got, sizeof got),
                       fl_dtype_name(last->dtype),
                       fl_shape_str(last->ndim, last->shape, want, sizeof want));
    memset(net->dout_set, 0, (size_t)net->nlayers * sizeof *net->dout_set);
    fl_tensor scaled = *dout; /* mixed precision: dout times the loss scale, in our buffer */
    if (net->amp) {
        scaled.data = net->amp->dout;
        net->k->copy(scaled.data, dout->data, fl_tensor_nbytes(dout), FL_COPY_D2D, NULL);
        if (net->amp->loss_scale != 1.0f)
            net->k->scale(FL_DTYPE_F32, scaled.numel, net->amp->loss_scale, scaled.data);
        dout = &scaled;
    }
    int valid = net->plan.segment[net->nlayers - 1]; /* the segment whose outputs are in place */
    for (int i = net->nlayers - 1; i >= 0; i--) {
        fl_layer *l = net->layers[i];
        if (net->plan.segment[i] != valid) {
            valid = net->plan.segment[i];
            FL_TRY(replay_segment(net, valid, i));
        }
        const fl_tensor *dy = i == net->nlayers - 1 ? dout : &net->dout[i];
        /* reduced precision: rounded inputs, output gradient and parameters; gradients added
         * to (gradient merge) are kept aside, so that only this backward's are rounded */
        bool amp = net->amp && net->amp->white[i];
        bool aside = amp && net->accumulate && nn_amp_rounds_params(l);
        fl_tensor rin[2];
        if (amp) {
            nn_amp_round(net->amp, net->k, i == net->nlayers - 1 ? &scaled : &net->dout[i]);
            if (aside)
                nn_amp_grads_save(net->amp, net->k, l);
            nn_amp_params(net->amp, net->k, l, true);
        }
        const fl_tensor *in[2];
        fl_tensor *din[2], sum[2];
        for (int k = 0; k < l->ninputs; k++) {
            int from = l->inputs[k];
            in[k] = from < 0 ? &net->x : &net->out[from];
            if (amp)
                in[k] = nn_amp_input(net->amp, net->k, k, in[k], &rin[k]);
            din[k] = NULL; // the network input's gradient is not needed
            if (from < 0)
                continue;
            if (!net->dout_set[from]) { // the first consumer (in reverse) writes the gradient
                din[k] = &net->dout[from];
                net->dout_set[from] = true;
            } else { // later ones write a scratch that is added to it below
                sum[k] = net->dout[from];
                sum[k].data = net->sum_mem[k];
                din[k] = &sum[k];
            }
        }
        bool acc = net->accumulate && !aside;
        int rc = l->ninputs == 2 ? l->ops->backward2(l, in[0], in[1], &net->out[i], dy, din[0],
                                                     din[1], acc)
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
        for (int k = 0; k < l->ninputs; k++)
            if (din[k] && din[k]->data != net->dout[l->inputs[k]].data)
                net->k->axpy(net->dtype, din[k]->numel, 1.0, din[k]->data,
                             net->dout[l->inputs[k]].data);
        if (hook)
            for (int p = l->nparams - 1; p >= 0; p--)
                if (l->params[p].trainable)
                    hook(ctx, &l->params[p]);
    }
    return FL_OK;
}

void fl_net_set_accumulate(fl_net *net, bool on) { net->accumulate = on; }

/* Values per sample of a planned (batch, ...) tensor. */
static int64_t sample_numel(const fl_tensor *t) { return fl_shape_numel(t->ndim - 1, t->shape + 1); }

int fl_net_set_amp(fl_net *net, fl_dtype low, const char *white_types) {
    FL_ASSERT(net);
    nn_amp_free(net->k, net->amp);
    net->amp = NULL;
    if (low == FL_DTYPE_F32)
        return FL_OK;
    if (low != FL_DTYPE_F16 && low != FL_DTYPE_BF16)
        return fl_fail(FL_EINVAL, "net: amp: dtype %s (f16 or bf16, or f32 for off)",
                       fl_dtype_name(low));
    if (!net->built)
        return fl_fail(FL_ESTATE, "net: amp: set after fl_net_build");
    if (net->dtype != FL_DTYPE_F32)
        return fl_fail(FL_EINVAL, "net: amp: the network computes in %s; mixed precision "
                       "needs f32 master weights", fl_dtype_name(net->dtype));
    if (!net->k->amp_round)
        return fl_fail(FL_EUNSUPPORTED, "net: amp: the %s backend cannot round to %s (its "
                       "table has no amp_round); the cpu, onednn, ref and cuda backends can",
                       net->k->name, fl_dtype_name(low));
    /* which layers: every type named must be one a network can hold */
    char list[512];
    int ntypes = 0;
    const char *types[64];
    snprintf(list, sizeof list, "%s", white_types ? white_types : "");
    for (char *save = NULL, *tok = strtok_r(list, ", \t", &save); tok;
         tok = strtok_r(NULL, ", \t", &save)) {
        if (!fl_layer_type_known(tok))
            return fl_fail(FL_EINVAL, "net: amp: '%s' is not a layer type (%s)", tok,
                           fl_layer_type_names());
        if (ntypes < 64)
            types[ntypes++] = tok;
    }
    /* the buffers: the largest white layer's inputs and parameters, the last output */
    size_t in_bytes = 0;
    int64_t wnumel = 0;
    int maxparams = 0;
    bool *is_white = calloc((size_t)net->nlayers, sizeof *is_white);
    if (!is_white)
        return fl_fail(FL_ENOMEM, "net: amp: out of memory");
    for (int i = 0; i < net->nlayers; i++) {
        fl_layer *l = net->layers[i];
        for (int t = 0; t < ntypes; t++)
            is_white[i] |= strcmp(l->ops->type, types[t]) == 0;
        if (!is_white[i])
            continue;
        for (int k = 0; k < l->ninputs; k++) {
            int from = l->inputs[k];
            int64_t sample = from < 0 ? fl_shape_numel(net->in_ndim, net->in_shape)
                                      : sample_numel(&net->out[from]);
            size_t nb = (size_t)(net->max_batch * sample) * sizeof(float);
            in_bytes = nb > in_bytes ? nb : in_bytes;
        }
        int64_t n = 0;
        for (int p = 0; p < l->nparams; p++)
            if (l->params[p].trainable)
                n += l->params[p].value.numel;
        wnumel = n > wnumel ? n : wnumel;
        maxparams = l->nparams > maxparams ? l->nparams : maxparams;
    }
    const fl_tensor *last = &net->out[net->nlayers - 1];
    size_t dout_bytes = (size_t)(sample_numel(last) * net->max_batch) * sizeof(float);
    int rc = nn_amp_create(net->k, low, net->nlayers, in_bytes, wnumel, maxparams, dout_bytes,
                           &net->amp);
    if (rc == FL_OK)
        memcpy(net->amp->white, is_white, (size_t)net->nlayers * sizeof *is_white);
    free(is_white);
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

int fl_net_set_recompute(fl_net *net, const char *checkpoints) {
    FL_ASSERT(net);
    if (net->built)
        return fl_fail(FL_ESTATE, "net: recompute must be set before fl_net_build");
    free(net->recompute_spec);
    net->recompute_spec = NULL;
    if (!checkpoints || !checkpoints[0])
        return FL_OK;
    if (!(net->recompute_spec = strdup(checkpoints)))
        return fl_fail(FL_ENOMEM, "net: out of memory");
    /* the names are checked now, so that a typo is said before anything is allocated */
    nn_recompute_plan plan;
    int rc = nn_recompute_plan_make(net->layers, net->nlayers, checkpoints, NULL, &plan);
    nn_recompute_plan_free(&plan);
    if (rc < 0) {
        free(net->recompute_spec);
        net->recompute_spec = NULL;
    }
    return rc;
}

bool fl_net_is_checkpoint(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return net->built && net->plan.enabled && net->plan.checkpoint[i];
}

bool fl_net_output_kept(const fl_net *net, int i) {
    FL_ASSERT(net && i >= 0 && i < net->nlayers);
    return !net->built || net->plan.kept[i];
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
    fprintf(out, "%-20s %-10s %-16s %12s\n", "layer / param", "type", "shape", "count");
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
        fprintf(out, "%-20s %-10s %-16s%s\n", l->name, l->ops->type, shape, rc);
        for (int p = 0; p < l->nparams; p++) {
            const fl_param *prm = &l->params[p];
            fprintf(out, "  %-18s %-10s %-16s %12lld\n", prm->name,
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
