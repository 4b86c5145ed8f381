/* nn.h - layers with explicit forward/backward, the network that runs them, losses, model zoo.
 *
 * A layer is a table of function pointers (fl_layer_ops) plus its named parameters. A network
 * is a sequence of layers; fl_net_build plans all memory once (llm.c style): one flat block
 * for parameter values, one for gradients (in parameter order, so a run of parameters is one
 * contiguous range, which is what gradient buckets need), and one activation and one
 * activation-gradient buffer per layer, sized for the largest batch. Nothing is allocated in
 * forward or backward.
 *
 * Example: one training step of the seed's MLP (error checks left out; x is an f32 tensor
 * (B, 32) with B <= 128, labels holds B class indices):
 *     int64_t hidden[] = {128, 128}, in_shape[] = {32};
 *     fl_net *net = fl_model_mlp(FL_DTYPE_F32, 32, hidden, 2, FL_ACT_TANH, 2);
 *     fl_net_build(net, 1, in_shape, 128, seed);           // max batch 128
 *     float probs_mem[128 * 2];
 *     const fl_tensor *logits;                              // (B, 2), owned by net
 *     fl_tensor probs;
 *     double loss;
 *     fl_net_forward(net, x, true, &logits);
 *     fl_tensor_view(&probs, FL_DTYPE_F32, 2, logits->shape, probs_mem);
 *     fl_softmax_xent_forward(fl_net_kernels(net), logits, labels, &probs, &loss);
 *     fl_softmax_xent_backward(fl_net_kernels(net), &probs, labels, &probs); // in place
 *     fl_net_backward(net, &probs, NULL, NULL);             // fills fl_net_flat_grads(net)
 *     ... optimizer step over fl_net_param(net, 0 .. fl_net_num_params(net) - 1) ...
 *     fl_net_free(net);
 *
 * Gradient-ready hook: fl_net_backward calls hook(ctx, param) for each trainable parameter as
 * soon as its gradient is final, last layer first. The distributed optimizer uses it to start
 * communicating a bucket while backward is still running (as PyTorch DDP does). */
#ifndef FLEET_NN_H
#define FLEET_NN_H

#include "fleet/kernels.h"
#include "fleet/rng.h"
#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_layer fl_layer;

typedef struct fl_layer_ops {
    const char *type; /* "fc", "relu", ... */
    /* Output sample shape (no batch dimension) for an input sample shape; FL_ESHAPE with a
     * message naming the layer if the input does not fit. */
    int (*infer_shape)(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                       int64_t *out_shape);
    /* Fills parameter values (called by fl_net_build after memory is placed). May be NULL.
     * rng is stream 0x1000 + j of the build seed, j being the network index of the layer's
     * first parameter; a layer gives its parameter i stream 0x1000 + j + i (the same seed,
     * position 0), so every parameter of a network has a stream of its own. */
    void (*init)(fl_layer *l, fl_rng *rng);
    /* y = f(x). x and y have a leading batch dimension; y is preallocated by the network. */
    int (*forward)(fl_layer *l, const fl_tensor *x, fl_tensor *y, bool training);
    /* Given x, y = f(x) and dy, writes parameter gradients (overwriting, or adding to them when
     * accumulate is set) and, unless dx is NULL, dx. */
    int (*backward)(fl_layer *l, const fl_tensor *x, const fl_tensor *y, const fl_tensor *dy,
                    fl_tensor *dx, bool accumulate);
    /* Frees impl (not the fl_layer itself, nor parameter memory). May be NULL. */
    void (*destroy)(fl_layer *l);
} fl_layer_ops;

struct fl_layer {
    const fl_layer_ops  *ops;
    char                 name[64]; /* prefix of its parameters' names: "fc1" */
    fl_dtype             dtype;    /* set by fl_net_add */
    const fl_kernel_ops *k;        /* set by fl_net_add */
    int                  nparams;
    fl_param            *params;   /* declared at create; memory placed by fl_net_build */
    void                *impl;
};

/* Creates a layer struct with the given ops and name (copied); impl is borrowed until
 * ops->destroy frees it. Returns NULL on out-of-memory. Used by layer constructors. */
fl_layer *fl_layer_new(const fl_layer_ops *ops, const char *name, void *impl);
/* Declares a parameter "<layer name>.<suffix>" of the given shape; returns its index or a
 * negative status. Values and grads stay NULL until fl_net_build. */
int fl_layer_add_param(fl_layer *l, const char *suffix, int ndim, const int64_t *shape,
                       bool trainable);
/* Destroys a layer that was never added to a network (a network frees its own). */
void fl_layer_free(fl_layer *l);

/* --- layers --- */
/* Linear: y (B, OUT) = x (B, IN) W^T + b; weight (OUT, IN) as in PyTorch, bias (OUT).
 * Initialised as PyTorch's nn.Linear: U(-1/sqrt(IN), 1/sqrt(IN)) for both. */
fl_layer *fl_fc_create(const char *name, int64_t in_features, int64_t out_features, bool bias);
/* Elementwise activation (relu, tanh, sigmoid); any shape. */
fl_layer *fl_activation_create(const char *name, fl_act act);

/* --- network --- */
typedef void (*fl_grad_ready_fn)(void *ctx, fl_param *p);

typedef struct fl_net fl_net;

/* An empty network computing in dtype (F32, or F64 for gradient checks) with kernel table k
 * (NULL: fl_kernels_cpu()). */
fl_net *fl_net_create(fl_dtype dtype, const fl_kernel_ops *k);
/* Frees the network, its layers and all planned memory. NULL is a no-op. */
void fl_net_free(fl_net *net);
/* Appends a layer; the network owns it from now on, also when this fails. */
int fl_net_add(fl_net *net, fl_layer *layer);
/* Infers every shape from the input sample shape, places parameters and gradients in flat
 * blocks, allocates activations for up to max_batch samples, and initialises the parameters
 * from seed. Fails with FL_ESHAPE naming the layer when shapes do not fit. */
int fl_net_build(fl_net *net, int in_ndim, const int64_t *in_shape, int64_t max_batch,
                 uint64_t seed);
/* Runs the layers on x (B, in_shape...), B <= max_batch (else FL_ESHAPE). *out (borrowed,
 * valid until the next forward) is the last layer's output. x is borrowed too: backward reads
 * it, so it must stay alive and unchanged until fl_net_backward. */
int fl_net_forward(fl_net *net, const fl_tensor *x, bool training, const fl_tensor **out);
/* Back-propagates dout (the gradient of the loss w.r.t. the last output) through the layers of
 * the last forward. Gradients overwrite (or add to, see fl_net_set_accumulate) the flat
 * gradient block; hook, if not NULL, is called per trainable parameter as it becomes final. */
int fl_net_backward(fl_net *net, const fl_tensor *dout, fl_grad_ready_fn hook, void *ctx);
/* When on, backward adds to existing gradients instead of overwriting (gradient merge). */
void fl_net_set_accumulate(fl_net *net, bool on);
void fl_net_zero_grad(fl_net *net);

fl_dtype             fl_net_dtype(const fl_net *net);
const fl_kernel_ops *fl_net_kernels(const fl_net *net);
int                  fl_net_num_layers(const fl_net *net);
fl_layer            *fl_net_layer(fl_net *net, int i);
/* All parameters in order (trainable ones first within each layer); borrowed. They form one
 * array: fl_net_param(net, 0) .. + fl_net_num_params(net) - 1 (what fl_optim_create takes). */
int       fl_net_num_params(const fl_net *net);
fl_param *fl_net_param(fl_net *net, int i);
fl_param *fl_net_find_param(fl_net *net, const char *name);
/* Number of trainable scalars, and the flat blocks holding them (valid after build; NULL
 * before). The first fl_net_numel values of the parameter block are the trainable ones, at the
 * same offsets as their gradients in the gradient block; persistable buffers follow them. */
int64_t   fl_net_numel(const fl_net *net);
void     *fl_net_flat_params(fl_net *net);
void     *fl_net_flat_grads(fl_net *net);
/* Output sample shape after build. */
int       fl_net_out_shape(const fl_net *net, int64_t *shape);
/* Prints one line per layer and parameter (name, shape, count) and the total. */
void      fl_net_summary(const fl_net *net, FILE *out);

/* --- losses and metrics --- */
/* Mean softmax cross-entropy over the batch: probs (B, C) receives softmax(logits);
 * *loss = mean over rows of -log p[label]. Labels outside [0, C) fail with FL_EINVAL naming
 * the row. */
int fl_softmax_xent_forward(const fl_kernel_ops *k, const fl_tensor *logits,
                            const int32_t *labels, fl_tensor *probs, double *loss);
/* dlogits = (probs - onehot) / B: the gradient of the mean loss. dlogits may be probs. */
int fl_softmax_xent_backward(const fl_kernel_ops *k, const fl_tensor *probs,
                             const int32_t *labels, fl_tensor *dlogits);
/* Number of rows whose label is among the k largest logits (ties counted against). */
int64_t fl_topk_correct(const fl_tensor *logits, const int32_t *labels, int k);

/* --- model zoo --- */
/* mlp(in, [h1, h2, ...], act, classes): fc1, act1, fc2, act2, ..., fcN (logits).
 * The seed's model is fl_model_mlp(t, 32, {128, 128}, 2, FL_ACT_TANH, 2). NULL on failure. */
fl_net *fl_model_mlp(fl_dtype t, int64_t in_features, const int64_t *hidden, int nhidden,
                     fl_act act, int64_t classes);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_NN_H */
