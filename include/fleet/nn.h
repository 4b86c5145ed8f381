/* nn.h - layers with explicit forward/backward, the network that runs them, losses, model zoo.
 *
 * A layer is a table of function pointers (fl_layer_ops) plus its named parameters. A network
 * is a sequence of layers; fl_net_build plans all memory once (llm.c style): one flat block
 * for parameter values, one for gradients (in parameter order, so a run of parameters is one
 * contiguous range, which is what gradient buckets need), one activation buffer per layer, and
 * activation-gradient buffers shared by layers whose gradients are not alive at the same time in
 * backward (a chain needs two), all sized for the largest batch, in the backend's memory.
 * Nothing is allocated in forward or backward.
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
 *     fl_softmax_xent_forward(fl_net_backend(net), logits, labels, &probs, &loss);
 *     fl_softmax_xent_backward(fl_net_backend(net), &probs, labels, &probs); // in place
 *     fl_net_backward(net, &probs, NULL, NULL);             // fills fl_net_flat_grads(net)
 *     ... optimizer step over fl_net_param(net, 0 .. fl_net_num_params(net) - 1) ...
 *     fl_net_free(net);
 *
 * Gradient-ready hook: fl_net_backward calls hook(ctx, param) for each trainable parameter as
 * soon as its gradient is final, last layer first. The distributed optimizer uses it to start
 * communicating a bucket while backward is still running (as PyTorch DDP does).
 *
 * Graphs (residual networks): a layer reads the previous layer's output unless it is added with
 * fl_net_add_from (any earlier layer's output, or the network input), for two-input layers
 * such as fl_add_create with fl_net_add2, or for N-input layers (fl_concat_create) with
 * fl_net_add_n (up to FL_NET_MAX_INPUTS inputs). The network is then a small DAG kept in
 * insertion order:
 * forward runs the layers in that order, backward in reverse, and where an output feeds several
 * layers their input gradients are summed (the first consumer in reverse order writes the
 * output's gradient buffer, later ones write a planned scratch that is added to it). Every
 * output except the last must feed some layer. Each layer runs once per step, so its
 * parameters' gradients are final right after its backward: the hook contract above holds,
 * and parameter order (one flat block, insertion order) is unchanged. A layer may also ask for
 * scratch memory (ops->scratch_bytes); the network plans one block of the largest request and
 * lends it to every layer during its forward or backward (l->scratch), so nothing is allocated
 * in a step. Example, y = relu(bn(conv(x)) + x):
 *     int in = fl_net_num_layers(net) - 1;                  // the block input's layer
 *     fl_net_add(net, fl_conv2d_create("c", &opts));
 *     fl_net_add(net, fl_batch_norm_create("bn", 64, false));
 *     fl_net_add2(net, fl_add_create("add", true), fl_net_num_layers(net) - 1, in);
 */
#ifndef FLEET_NN_H
#define FLEET_NN_H

#include "fleet/backend.h"
#include "fleet/rng.h"
#include "fleet/tensor.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_layer fl_layer;

/* The most inputs one layer reads (fl_net_add_n): PP-HGNet-base's aggregation concatenates 8. */
#define FL_NET_MAX_INPUTS 16

typedef struct fl_layer_ops {
    const char *type; /* "fc", "relu", ... */
    /* Output sample shape (no batch dimension) for an input sample shape; FL_ESHAPE with a
     * message naming the layer if the input does not fit. */
    int (*infer_shape)(fl_layer *l, int in_ndim, const int64_t *in_shape, int *out_ndim,
                       int64_t *out_shape);
    /* Fills parameter values (called by fl_net_build after memory is placed). May be NULL.
     * The values' data are host memory here (on a device backend a host copy, which
     * fl_net_build then copies to the device): init writes them directly and calls no table
     * function.
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
    /* Optional: bytes of scratch the layer needs for a batch of max_batch, asked after
     * infer_shape; the network lends l->scratch (64-byte aligned, shared by all layers, contents
     * not kept between calls) during forward and backward. NULL: none. SIZE_MAX: the layer
     * cannot run (fl_errmsg says why); fl_net_build fails naming it. */
    size_t (*scratch_bytes)(fl_layer *l, int64_t max_batch);
    /* Layers read one input (forward/backward, above), two (forward2/backward2) or any number
     * from 1 to FL_NET_MAX_INPUTS (forwardn/backwardn): a layer sets one of the three pairs.
     * Two-input layers (fl_net_add2) set these instead of forward/backward; both inputs have
     * the same shape, which infer_shape receives. da, db are written (not added to); either
     * may be NULL when not needed. */
    int (*forward2)(fl_layer *l, const fl_tensor *a, const fl_tensor *b, fl_tensor *y,
                    bool training);
    int (*backward2)(fl_layer *l, const fl_tensor *a, const fl_tensor *b, const fl_tensor *y,
                     const fl_tensor *dy, fl_tensor *da, fl_tensor *db, bool accumulate);
    /* Two-input layers whose inputs may differ in shape (concatenation, the channel-wise
     * multiply) set this as well as infer_shape (which the network then does not call): it
     * receives both sample shapes, a's and b's. NULL: both inputs must have one shape. */
    int (*infer_shape2)(fl_layer *l, int a_ndim, const int64_t *a_shape, int b_ndim,
                        const int64_t *b_shape, int *out_ndim, int64_t *out_shape);
    /* N-input layers (concatenation) set these instead of forward/backward: added with any of
     * fl_net_add (n = 1), fl_net_add_from (1), fl_net_add2 (2) or fl_net_add_n (1 to
     * FL_NET_MAX_INPUTS), they receive their n inputs in the order added, x[0] .. x[n - 1]
     * (one tensor may come several times when an output is read twice). infer_shapen receives
     * every input's sample shape (ndim[k], shape[k]) and checks that they fit (the network does
     * not compare them, nor calls infer_shape); NULL: every input must have one shape, which
     * infer_shape receives. backwardn writes dx[k] (not added to; the network sums the
     * gradients of an output read by several layers, or twice by one); any dx[k] may be NULL
     * when not needed. */
    int (*infer_shapen)(fl_layer *l, int n, const int *ndim, const int64_t *const *shape,
                        int *out_ndim, int64_t *out_shape);
    int (*forwardn)(fl_layer *l, int n, const fl_tensor *const *x, fl_tensor *y, bool training);
    int (*backwardn)(fl_layer *l, int n, const fl_tensor *const *x, const fl_tensor *y,
                     const fl_tensor *dy, fl_tensor *const *dx, bool accumulate);
    /* The layer runs on spatial (C, H, W) activations in either layout (l->layout); a network
     * uses its backend's NHWC layout only when every layer reading a spatial input sets this
     * (elementwise layers, convolution, batch norm, pooling; not fc, which would flatten in
     * the layout's order). */
    bool nhwc;
    /* The layer computes in l->adtype, its activations' dtype, and may run in f16 / bf16 (the
     * table's "Low dtypes", fleet/backend.h): its inputs, output and their gradients are then
     * 2-byte arrays, its parameters and their gradients stay l->dtype (f32). A network runs it
     * low only under fl_net_set_amp_native on a table with low_dtypes; layers without it stay
     * f32 there, the network converting at their edges. */
    bool low;
} fl_layer_ops;

struct fl_layer {
    const fl_layer_ops  *ops;
    char                 name[64]; /* prefix of its parameters' names: "fc1" */
    fl_dtype             dtype;    /* set by fl_net_add */
    fl_dtype             adtype;   /* of its activations: dtype, or the low dtype where the
                                    * network runs it in f16 / bf16 (ops->low; set by
                                    * fl_net_set_amp before it plans the layer again) */
    const fl_backend    *k;        /* set by fl_net_add */
    fl_layout            layout;   /* of spatial activations; set by fl_net_build before
                                    * infer_shape */
    int                  nparams;
    fl_param            *params;   /* declared at create; memory placed by fl_net_build */
    void                *impl;
    int                  ninputs;  /* set by fl_net_add*: 1, 2 for forward2 layers, 1 to
                                    * FL_NET_MAX_INPUTS for forwardn layers */
    int                  inputs[FL_NET_MAX_INPUTS]; /* layer indices read (inputs[0 ..
                                    * ninputs)), FL_NET_INPUT for the network input */
    void                *scratch;  /* lent by the network (see scratch_bytes) */
    /* Set by the network while it recomputes this layer's output for backward (recompute):
     * forward must then give the output of the last training forward again and change no
     * state (batch norm leaves its running statistics, dropout reuses its last mask). */
    bool                 replay;
    int                  init;     /* fl_init_scheme (fl_layer_set_init) */
};

/* The network input, as a layer input index (fl_net_add_from). */
#define FL_NET_INPUT (-1)

/* Creates a layer struct with the given ops and name (copied); impl is borrowed until
 * ops->destroy frees it. Returns NULL on out-of-memory. Used by layer constructors. */
fl_layer *fl_layer_new(const fl_layer_ops *ops, const char *name, void *impl);
/* Declares a parameter "<layer name>.<suffix>" of the given shape; returns its index or a
 * negative status. Values and grads stay NULL until fl_net_build. */
int fl_layer_add_param(fl_layer *l, const char *suffix, int ndim, const int64_t *shape,
                       bool trainable);
/* Destroys a layer that was never added to a network (a network frees its own). */
void fl_layer_free(fl_layer *l);

/* How a layer's parameters start (fl_layer_set_init, before fl_net_build initialises them):
 *   FL_INIT_TORCH (the default): as each layer's create says (PyTorch's and torchvision's);
 *   FL_INIT_PADDLE: Paddle 2's defaults for the layer: conv2d weight N(0, sqrt(2 / (IN kh kw)))
 *     (paddle.nn.Conv2D's own; IN the input channels, groups or not), fc weight Xavier
 *     uniform U(-sqrt(6 / (IN + OUT)), +) (paddle.nn.Linear's), biases 0;
 *   FL_INIT_KAIMING_FAN_IN: conv2d weight N(0, sqrt(2 / (IN / groups kh kw))), bias 0:
 *     paddle.nn.initializer.KaimingNormal(), which PaddleClas's ConvBNLayer asks for (He et
 *     al. 2015, arXiv:1502.01852, fan-in mode).
 * The draws come from the layer's own stream, as with the default. */
typedef enum { FL_INIT_TORCH = 0, FL_INIT_PADDLE = 1, FL_INIT_KAIMING_FAN_IN = 2 } fl_init_scheme;
/* Sets l's scheme and returns l (NULL stays NULL, so calls nest around a create). A scheme
 * the layer does not have (conv2d has all three, fc TORCH and PADDLE, the others TORCH) is
 * FL_EINVAL naming the layer: l is freed and NULL returned, as a failed create. */
fl_layer *fl_layer_set_init(fl_layer *l, fl_init_scheme s);

/* --- layers --- */
/* Linear: y (B, OUT) = x (B, IN) W^T + b; weight (OUT, IN) as in PyTorch, bias (OUT).
 * Initialised as PyTorch's nn.Linear: U(-1/sqrt(IN), 1/sqrt(IN)) for both. */
fl_layer *fl_fc_create(const char *name, int64_t in_features, int64_t out_features, bool bias);
/* Elementwise activation (relu, tanh, sigmoid, hardswish, hardsigmoid; backend.h defines
 * them); any shape. */
fl_layer *fl_activation_create(const char *name, fl_act act);

/* Convolution options, PyTorch's nn.Conv2d arguments (NCHW). */
typedef struct {
    int64_t in_channels, out_channels;
    int64_t kh, kw;           /* kernel */
    int64_t sh, sw;           /* stride (0 means 1) */
    int64_t ph, pw;           /* zero padding */
    int64_t dh, dw;           /* dilation (0 means 1) */
    int64_t groups;           /* 0 means 1; divides both channel counts */
    bool    bias;
} fl_conv2d_opts;

/* 2-D convolution: x (B, IC, H, W) -> y (B, OC, OH, OW); weight (OC, IC / groups, KH, KW),
 * bias (OC) as in PyTorch. Initialised as torchvision's ResNet does (He et al. 2015,
 * arXiv:1502.01852: normal with std sqrt(2 / (OC KH KW)), "fan_out"), bias 0 (not nn.Conv2d's
 * default uniform). Computed by the backend (conv_plan_create when the network is built, then
 * conv_forward / conv_backward_filter / conv_backward_data): oneDNN on NHWC activations, or
 * im2col + gemm per image on the cpu backend; results do not depend on the thread count
 * (docs/backends.md). NULL with a message on bad options. */
fl_layer *fl_conv2d_create(const char *name, const fl_conv2d_opts *o);
/* Batch normalisation over the channels of x (B, C, ...) (Ioffe & Szegedy 2015): weight,
 * bias (C) trainable (init 1, 0); running_mean, running_var (C) persistable buffers (init 0, 1).
 * Training forward normalises with the batch's mean and biased variance and updates
 * running = (1 - 0.1) running + 0.1 batch (running_var with the unbiased variance), eps 1e-5:
 * PyTorch's BatchNorm2d defaults. Inference uses the running statistics. act fuses the
 * activation after it: FL_ACT_RELU (y = max(0, bn(x))) or FL_ACT_HARDSWISH (y =
 * hardswish(bn(x))), FL_ACT_NONE for none; no parameter changes; another act: NULL,
 * FL_EINVAL. */
fl_layer *fl_batch_norm_create(const char *name, int64_t channels, fl_act act);
/* Max or average pooling (B, C, H, W) -> (B, C, OH, OW), kernel k, stride s (0: k), padding p,
 * both dimensions alike; semantics as the kernels (fl_backend.pool_forward). */
fl_layer *fl_pool2d_create(const char *name, fl_pool pool, int64_t k, int64_t s, int64_t p);
/* Global average pooling: (B, C, H, W) -> (B, C) (the mean of each plane). */
fl_layer *fl_global_avg_pool_create(const char *name);
/* Global average pooling keeping the spatial dimensions: (B, C, H, W) -> (B, C, 1, 1), Paddle's
 * AdaptiveAvgPool2D(1) (what a squeeze-and-excitation block's 1x1 convolutions read). */
fl_layer *fl_adaptive_avg_pool_create(const char *name);
/* (B, d1, d2, ...) -> (B, d1 d2 ...) in NCHW order whatever the network's layout (an NHWC
 * input is reordered), Paddle's nn.Flatten(1, -1): what lets an fc follow (C, H, W). */
fl_layer *fl_flatten_create(const char *name);
/* y = a + b (then max(0, .) when relu), for fl_net_add2; any shape, both inputs alike. */
fl_layer *fl_add_create(const char *name, bool relu);
/* The channel-wise scale of squeeze-and-excitation (Hu et al. 2018, arXiv:1709.01507), for
 * fl_net_add2: y = a * b with a (B, C, H, W) and b (B, C, 1, 1) or (B, C), one factor per
 * sample and channel broadcast over the pixels (paddle.multiply(x, y) with y (N, C, 1, 1));
 * backward gives both inputs' gradients. No parameters. */
fl_layer *fl_channel_mul_create(const char *name);
/* Concatenation along channels of n inputs in one layer (forwardn; fl_net_add_n, or fl_net_add2
 * / fl_net_add / fl_net_add_from for 2 or 1): x_k (B, C_k, H, W), k = 0 .. n - 1, ->
 * (B, C_0 + .. + C_{n-1}, H, W), x_0's channels first (paddle.concat(axis=1), PP-HGNet's
 * aggregation); also (B, C_k) inputs. The inputs' H and W (and their number of dimensions)
 * must agree: FL_ESHAPE naming the layer and the input that differs at build. Forward copies
 * each input once into its channels (the backend's channel_slice, either layout); backward
 * hands each input its channels of dy. No parameters. */
fl_layer *fl_concat_create(const char *name);
/* Columns [start, start + count) of a (B, F) input -> (B, count), paddle.slice(x, axes=[1],
 * starts=[start], ends=[start + count]) (a wide&deep model's dense features out of its input);
 * backward gives zeros to the other columns. start >= 0, count >= 1; the input is checked at
 * build (FL_ESHAPE naming the layer). No parameters. */
fl_layer *fl_slice_create(const char *name, int64_t start, int64_t count);
/* Inverted dropout: in training y = x * m / (1 - p) with m ~ Bernoulli(1 - p) per element; in
 * inference y = x. The mask of a forward is a function of (seed, step) only (Philox stream
 * `step`), step counting the layer's training forwards from 0, so runs are reproducible and
 * backward regenerates the mask instead of storing it. p in [0, 1). */
fl_layer *fl_dropout_create(const char *name, double p, uint64_t seed);
/* Sets the step the next training forward uses (resuming, or a fixed mask in tests). */
void fl_dropout_set_step(fl_layer *l, uint64_t step);
/* The CIFAR ResNet's "option A" shortcut (He et al. 2015, arXiv:1512.03385, sec. 4.2): takes
 * every stride-th pixel and zero-pads the channels to out_channels, the input's channels placed
 * in the middle ((out - in) / 2 zero channels before them), no parameters. */
fl_layer *fl_shortcut_pad_create(const char *name, int64_t out_channels, int64_t stride);

/* --- network --- */
typedef void (*fl_grad_ready_fn)(void *ctx, fl_param *p);

typedef struct fl_net fl_net;

/* An empty network computing in dtype (F32, or F64 for gradient checks) on backend k
 * (NULL: fl_backend_cpu()); the network's memory is the backend's. */
fl_net *fl_net_create(fl_dtype dtype, const fl_backend *k);
/* Moves an unbuilt network (and its layers) to backend k (NULL: fl_backend_cpu()); the zoo's
 * constructors build on the cpu backend, fleet-train then sets train.backend's. */
void fl_net_set_backend(fl_net *net, const fl_backend *k);
/* Gives every layer of an unbuilt network FL_INIT_TORCH (fl_layer_set_init): a zoo model built
 * with Paddle's initialisers starts as PyTorch's layers would (fleet-train's model.init: torch). */
void fl_net_init_torch(fl_net *net);
/* Frees the network, its layers and all planned memory. NULL is a no-op. */
void fl_net_free(fl_net *net);
/* Appends a layer reading the previous layer's output (the network input for the first); the
 * network owns it from now on, also when this fails. Returns FL_OK or a negative status. */
int fl_net_add(fl_net *net, fl_layer *layer);
/* Appends a layer reading the output of layer `from` (0 .. layers - 1, or FL_NET_INPUT).
 * Returns the new layer's index (>= 0) or a negative status; owns layer as fl_net_add. */
int fl_net_add_from(fl_net *net, fl_layer *layer, int from);
/* Appends a two-input layer (ops->forward2, or an N-input one: forwardn) reading layers a and
 * b. Returns its index. */
int fl_net_add2(fl_net *net, fl_layer *layer, int a, int b);
/* Appends an N-input layer (ops->forwardn) reading inputs[0 .. n) in that order (each 0 ..
 * layers - 1 or FL_NET_INPUT; one may come several times), 1 <= n <= FL_NET_MAX_INPUTS; a
 * two-input layer (forward2) for n = 2, a one-input layer for n = 1. Returns the new layer's
 * index or a negative status: FL_EINVAL naming the layer for n out of range, an input that is
 * not an earlier layer or a count the layer does not take. Owns layer as fl_net_add. */
int fl_net_add_n(fl_net *net, fl_layer *layer, int n, const int *inputs);
/* Infers every shape from the input sample shape, places parameters and gradients in flat
 * blocks, allocates activations for up to max_batch samples, and initialises the parameters
 * from seed. Fails with FL_ESHAPE naming the layer when shapes do not fit. */
int fl_net_build(fl_net *net, int in_ndim, const int64_t *in_shape, int64_t max_batch,
                 uint64_t seed);
/* Runs the layers on x (B, in_shape...), B <= max_batch (else FL_ESHAPE). *out (borrowed,
 * valid until the next forward) is the last layer's output. x is borrowed too: backward reads
 * it, so it must stay alive and unchanged until fl_net_backward. x's data, *out's, dout's and
 * every parameter's value and gradient are the backend's memory (backend.h's memory rule): on
 * a device the caller copies its input there and the output back (the tensors the network
 * plans say so in their `device`). */
int fl_net_forward(fl_net *net, const fl_tensor *x, bool training, const fl_tensor **out);
/* Back-propagates dout (the gradient of the loss w.r.t. the last output) through the layers of
 * the last forward. Gradients overwrite (or add to, see fl_net_set_accumulate) the flat
 * gradient block; hook, if not NULL, is called per trainable parameter as it becomes final. */
int fl_net_backward(fl_net *net, const fl_tensor *dout, fl_grad_ready_fn hook, void *ctx);
/* Recompute (activation checkpointing, Chen et al. 2016, arXiv:1604.06174; Paddle's
 * strategy.recompute): called before fl_net_build, keeps only the outputs of the checkpoint
 * layers (plus the last layer's and any read across a checkpoint) from forward to backward;
 * backward recomputes the others segment by segment (a segment: the layers after one
 * checkpoint up to the next), just before running back through it, in one arena of the
 * largest segment's size. checkpoints: comma-separated layer names, "auto" (every residual
 * block's output, i.e. every layer of two or more inputs after which nothing earlier is read;
 * in a network without such layers every ceil(sqrt(n))-th layer), or NULL / "" (off). Gradients are
 * bit-identical to those without recompute (the same kernels run on the same inputs); batch
 * norm's running statistics are updated once per step and dropout replays its mask. The last
 * segment is not recomputed: its outputs are still in place after forward. FL_EINVAL naming
 * the unknown layer and listing the network's layers; FL_ESTATE after build. */
int  fl_net_set_recompute(fl_net *net, const char *checkpoints);
/* After build: whether layer i is a recompute checkpoint, and whether its output is kept from
 * forward to backward (every output when recompute is off). */
bool fl_net_is_checkpoint(const fl_net *net, int i);
bool fl_net_output_kept(const fl_net *net, int i);
/* Bytes of activation memory planned by build: the outputs kept, the recompute arena and the
 * output gradients (0 before build). */
size_t fl_net_activation_bytes(const fl_net *net);
/* Its three parts: the outputs kept from forward to backward (all of them without
 * recompute), the arena the other outputs share, and the output gradients. */
void   fl_net_activation_parts(const fl_net *net, size_t *outputs, size_t *arena, size_t *grads);
/* Mixed precision, emulated (strategy.amp; docs/amp.md): after build, the layers whose type is
 * in white_types (comma-separated, e.g. "conv2d,fc"; fl_layer_type_known) compute as f16 or
 * bf16 tensor-core operations do: each reads its inputs and trainable parameters rounded to
 * low (FL_DTYPE_F16 or FL_DTYPE_BF16; batch norm's scale and shift stay f32) and its output is
 * rounded; in backward its output gradient, input gradients and parameter gradients are
 * rounded too (so an f16 gradient above 65504 becomes inf). The kernels compute in f32; the
 * parameters (master weights) and their gradient block stay f32, rounded copies live in
 * buffers this allocates once (the largest white layer's inputs and parameters, the last
 * output's gradient). Works on every backend with amp_round (cpu, onednn, ref) and with
 * recompute (a replayed layer rounds alike). With fl_net_set_amp_native on a table with
 * low_dtypes it runs layers in low for real instead (below). low FL_DTYPE_F32 turns it off and
 * frees them (activations back in f32 after native low precision).
 * Before fl_net_build it is a request the build carries out (FL_DTYPE_F32 drops it): the layers
 * that will run low natively are planned in low from the start, so their activations and
 * convolution plans are made once (after the build the network's f32 ones exist first and
 * are made again). Set again after the build as it is (the same dtype and layers), it changes
 * nothing.
 * FL_EINVAL for another dtype, an unknown type (listed in the message; at once, also before
 * build) or an f64 network, FL_EUNSUPPORTED on a backend without amp_round (these two from
 * fl_net_build for a request). */
int  fl_net_set_amp(fl_net *net, fl_dtype low, const char *white_types);
/* Mixed precision for real (docs/amp.md, "Real f16 / bf16"): called before fl_net_set_amp, on makes
 * it run layers in low natively where the backend's table has low_dtypes (ref; not cpu, onednn, nor
 * cuda unless FLEET_CUDA_LOW_DTYPES=1): a white layer whose ops->low, and every other ops->low
 * layer ("gray": elementwise, pooling, batch norm, add, flatten, dropout, ...) all of whose inputs
 * are such layers' outputs, keeps its output and output gradient in low (2-byte arrays: the
 * activation bytes halve), computing with the table's low ops (batch norm's scale, shift and
 * statistics f32; fc keeps a low copy of its f32 weights, converted at each forward, and converts
 * its low weight gradient into the f32 gradient block; convolution plans of dtype low do both
 * themselves). Every other layer stays f32 (white ones emulated as above); where dtypes meet (the
 * network input, a low layer feeding an f32 one or back, the last output, f32 for the loss) the
 * network converts, and it converts the gradients back. fl_net_set_amp plans the activations again
 * (the parameters stay), so call it before a forward; if that planning fails the network is left
 * unbuilt. Loss scaling, accumulation and recompute work as in the emulation. On other tables the
 * emulation runs, so the strategy may always turn this on. Off by default. FL_ESTATE while amp is
 * set, unless on is the value in force. */
int  fl_net_set_amp_native(fl_net *net, bool on);
/* Whether layer i runs in the low dtype natively (fl_net_set_amp_native). */
bool fl_net_amp_low(const fl_net *net, int i);
/* Loss scaling (mixed precision on): backward starts from dout times scale (> 0, default 1),
 * in a buffer of the network's (dout itself is not written). */
void fl_net_set_loss_scale(fl_net *net, float scale);
/* Whether layer i computes in reduced precision. */
bool fl_net_amp_white(const fl_net *net, int i);
/* Whether type is the ops->type of a layer of src/nn ("fc", "conv2d", "batch_norm", ...), and
 * all of them, comma-separated, for messages. */
bool        fl_layer_type_known(const char *type);
const char *fl_layer_type_names(void);
/* Input gradient: called before fl_net_build, on makes backward also compute the gradient of
 * the loss w.r.t. the network input (summed over the layers that read the input), for what
 * produced the input outside the network (a sparse embedding, fleet/sparse.h). Off by default
 * (nothing is computed or allocated for it). FL_ESTATE after build; build fails with
 * FL_EUNSUPPORTED when the network computes in NHWC on a spatial input. */
int fl_net_set_input_grad(fl_net *net, bool on);
/* After a backward with the input gradient on: (B, in_shape...) of the last backward, in the
 * backend's memory, owned by the network (overwritten by the next backward, not added to under
 * fl_net_set_accumulate). NULL when off or before build. */
const fl_tensor *fl_net_input_grad(const fl_net *net);
/* When on, backward adds to existing gradients instead of overwriting (gradient merge). */
void fl_net_set_accumulate(fl_net *net, bool on);
void fl_net_zero_grad(fl_net *net);

fl_dtype             fl_net_dtype(const fl_net *net);
const fl_backend *fl_net_backend(const fl_net *net);
/* Layout of the network's spatial activations (valid after build): NHWC where the backend
 * prefers it and every layer supports it (fl_layer_ops.nhwc), else NCHW. Input and output
 * are NCHW either way; the network reorders its input. */
fl_layout            fl_net_layout(const fl_net *net);
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
/* FL_EINVAL naming the first row whose label is outside [0, classes); labels in host memory. */
int fl_labels_check(const int32_t *labels, int64_t rows, int64_t classes);
/* Mean softmax cross-entropy over the batch: probs (B, C) receives softmax(logits);
 * *loss = mean over rows of -log p[label]. logits, probs and labels are k's memory. Labels
 * outside [0, C) fail with FL_EINVAL naming the row where the host can read them (k's
 * host_memory); on a device the caller checks its host labels with fl_labels_check before
 * copying them there. */
int fl_softmax_xent_forward(const fl_backend *k, const fl_tensor *logits,
                            const int32_t *labels, fl_tensor *probs, double *loss);
/* dlogits = (probs - onehot) / B: the gradient of the mean loss. dlogits may be probs. */
int fl_softmax_xent_backward(const fl_backend *k, const fl_tensor *probs,
                             const int32_t *labels, fl_tensor *dlogits);
/* Label smoothing (Szegedy et al. 2016, arXiv:1512.00567, sec. 7): the same with the target
 * q = (1 - epsilon) onehot + epsilon / C, i.e. loss = mean over rows of -sum_j q_j log p_j, and
 * dlogits = (probs - q) / B. epsilon in [0, 1) (else FL_EINVAL); 0 gives the plain functions. */
int fl_softmax_xent_smooth_forward(const fl_backend *k, const fl_tensor *logits,
                                   const int32_t *labels, double epsilon, fl_tensor *probs,
                                   double *loss);
int fl_softmax_xent_smooth_backward(const fl_backend *k, const fl_tensor *probs,
                                    const int32_t *labels, double epsilon, fl_tensor *dlogits);
/* Mean sigmoid cross-entropy with logits, for binary labels (CTR; Paddle's
 * sigmoid_cross_entropy_with_logits, PyTorch's BCEWithLogitsLoss): logits (B) or (B, 1), f32 or
 * f64, host memory; labels (B) 0 or 1 (fl_ctr_batch's). *loss = mean over rows of
 * max(z, 0) - z y + log(1 + exp(-|z|)), in double (no overflow for any finite z); probs (same
 * shape and dtype; may be NULL) receives sigmoid(z). FL_EINVAL naming the first row whose label
 * is not 0 or 1, FL_ESHAPE on shapes or dtypes that do not fit. */
int fl_sigmoid_xent_forward(const fl_tensor *logits, const int32_t *labels, fl_tensor *probs,
                            double *loss);
/* dlogits = (sigmoid(z) - y) / B, the gradient of the mean loss; dlogits may be logits. */
int fl_sigmoid_xent_backward(const fl_tensor *logits, const int32_t *labels,
                             fl_tensor *dlogits);
/* Number of rows whose label is among the k largest logits (ties counted against). A host
 * function: logits and labels in host memory (on a device, copy the logits back first). */
int64_t fl_topk_correct(const fl_tensor *logits, const int32_t *labels, int k);

/* --- model zoo --- */
/* mlp(in, [h1, h2, ...], act, classes): fc1, act1, fc2, act2, ..., fcN (logits).
 * The seed's model is fl_model_mlp(t, 32, {128, 128}, 2, FL_ACT_TANH, 2). NULL on failure. */
fl_net *fl_model_mlp(fl_dtype t, int64_t in_features, const int64_t *hidden, int nhidden,
                     fl_act act, int64_t classes);

/* ResNet as torchvision builds it (He et al. 2015, arXiv:1512.03385; stride in the 3x3 of the
 * bottleneck, "v1.5"): layers 18, 34 (basic blocks) or 50, 101, 152 (bottlenecks), input
 * (3, 224, 224) or any size the stem and four stride-2 stages fit, classes outputs. Layer and
 * parameter names are torchvision's ("conv1.weight", "layer1.0.bn2.running_var",
 * "layer2.0.downsample.0.weight", "fc.bias"; num_batches_tracked is not kept), in its order.
 * ReLUs are fused into the batch norms and adds. resnet50 with 1000 classes has 25,557,032
 * trainable parameters, resnet18 11,689,512. NULL with a message for other depths. */
fl_net *fl_model_resnet(fl_dtype t, int layers, int64_t classes);
/* The CIFAR ResNet of He et al. sec. 4.2 for (in_channels, 32, 32) inputs (3 for CIFAR, 1 for
 * the 28 x 28 grey images of MNIST-format sets; any side the two stride-2 stages fit): depth = 6n + 2 (20, 32, 44,
 * 56, 110, ...), a 3x3 16-channel stem, three stages of n basic blocks with 16, 32, 64
 * channels (stride 2 at stages 2 and 3), global average pooling, fc. Shortcuts where the
 * shape changes: option 'A' (fl_shortcut_pad_create, no parameters, as the paper) or 'B'
 * (1x1 convolution + batch norm, "layerK.0.downsample.0/1"). Names follow the torchvision
 * scheme. ResNet-20 with option A and 10 classes has 269,722 trainable parameters. */
fl_net *fl_model_resnet_cifar(fl_dtype t, int depth, int64_t in_channels, int64_t classes,
                              char shortcut);

/* PP-LCNet (Cui et al. 2021, arXiv:2109.15099) as PaddleClas builds it (PPLCNet_x<scale>):
 * channels make_divisible(c * scale, 8), a 3x3 stride-2 stem and 13 depthwise-separable blocks
 * (3x3 / 5x5 depthwise, SE in the last two), hardswish, pooling, a 1280-wide 1x1 convolution,
 * dropout 0.2 and fc, for (in_channels, 224, 224) inputs (any size the five stride-2 steps fit).
 * small_input: stride 1 in the stem and in blocks3 (PaddleClas's stride_list [1, 1, 2, 2, 2])
 * for 28 x 28 and 32 x 32 images. Names are PaddleClas's ("blocks6.0.se.conv1.weight"). With
 * 1000 classes PPLCNet_x1_0 has 2,952,520 trainable parameters (PaddleClas publishes 3.0M),
 * x0_25 1,521,184 (1.5M), x2_5 9,017,560 (9.0M); docs/models.md lists every scale. scale in
 * (0, 8] (PaddleClas's are 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5:
 * fl_pplcnet_scale_known); NULL with a message otherwise. */
fl_net *fl_model_pplcnet(fl_dtype t, double scale, int64_t in_channels, bool small_input,
                         int64_t classes);
bool    fl_pplcnet_scale_known(double scale);
/* PP-LCNetV2 (PaddleClas's PPLCNetV2_base) in its training form: re-parameterisable
 * multi-scale depthwise blocks (5x5 + 3x3 (+ 1x1) ConvBN branches summed), SE with a sigmoid and
 * split pointwise convolutions in stage 3, a shortcut in stage 4, for (in_channels, 224, 224);
 * small_input: stride 1 in the stem and stage1. Names are PaddleClas's. At 1000 classes:
 * 6,687,208 trainable values and 40,832 batch-norm buffer values; PaddleClas's published 6.6M
 * is the re-parameterised inference model's count (6,624,232: fl_model_pplcnetv2_fused). */
fl_net *fl_model_pplcnetv2(fl_dtype t, int64_t in_channels, bool small_input, int64_t classes);
/* The same network in its re-parameterised inference form (PaddleClas's
 * RepDepthwiseSeparable.rep(), after RepVGG, Ding et al. 2021, arXiv:2101.03697): each rep
 * block's ConvBN branches and their sum replaced by one k x k depthwise convolution with bias,
 * "<block>.dw_conv" (Paddle's name), and its ReLU "<block>.act"; every other layer and name as
 * the training form's. 6,624,232 trainable values at 1000 classes. Its parameters are set from
 * a trained network by fl_pplcnetv2_fuse; it is meant for inference (forward with training
 * false). NULL with a message as fl_model_pplcnetv2. */
fl_net *fl_model_pplcnetv2_fused(fl_dtype t, int64_t in_channels, bool small_input,
                                 int64_t classes);
/* Sets every parameter of fused (fl_model_pplcnetv2_fused, built) from trained
 * (fl_model_pplcnetv2 with the same arguments, built for the same input): the tensors both
 * have are copied; each rep block's dw_conv is the sum over its branches of the branch's
 * kernel times gamma / sqrt(running_var + eps), zero-padded to k x k, with bias the sum of
 * beta - running_mean gamma / sqrt(running_var + eps) (each batch norm folded into its
 * convolution with its running statistics, as inference computes it). fused then computes,
 * in inference, what trained computes in inference, up to rounding. Works on any backend (the
 * values pass through the host) and in f32 or f64; neither network's other state changes.
 * 0, or FL_EINVAL naming the tensor when the two are not such a pair (a parameter of one
 * with no counterpart in the other, a shape that differs, a rep block without branches),
 * FL_ESTATE when either is not built, FL_ENOMEM. */
int fl_pplcnetv2_fuse(fl_net *fused, fl_net *trained);
/* PP-HGNet (PaddleClas's PPHGNet_tiny / _small / _base; size "tiny", "small", "base"): VoVNet-
 * style HG blocks (a chain of 3x3 ConvBNAct whose outputs and input are concatenated, a 1x1
 * aggregation, ESE attention), depthwise stride-2 downsampling, a 2048-wide last convolution,
 * for (in_channels, 224, 224); small_input: stride 1 in the stem's first convolution (28 x 28,
 * 32 x 32). Names are PaddleClas's ("stages.2.blocks.1.att.conv.weight"). At 1000 classes:
 * tiny 14,735,864 trainable values and 15,040 batch-norm buffer values, 14,750,904 in all
 * (PaddleClas publishes 14.75M, counting the buffers), small 24,381,864 in all (24.38M), base
 * 71,624,584 (71.62M). NULL with a message for another size. */
fl_net *fl_model_pphgnet(fl_dtype t, const char *size, int64_t in_channels, bool small_input,
                         int64_t classes);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_NN_H */
