/* nn_impl.h - private to src/nn: what the layers share with the network, chiefly how each
 * parameter gets a random stream of its own (so one parameter's initial values do not depend on
 * how many numbers the others drew), and the network's state, which the files of src/nn that
 * build it, run it and keep its recompute and AMP settings share. */
#ifndef FLEET_NN_IMPL_H
#define FLEET_NN_IMPL_H

#include "fleet/nn.h"

/* Stream base of parameter initialisation: param j uses fl_rng_init(seed, NN_INIT_STREAM + j). */
#define NN_INIT_STREAM 0x1000u

/* The generator of a layer's i-th parameter, given the one fl_net_build passed to init
 * (which is that of parameter 0): the same seed, stream + i, position 0. */
static inline void nn_param_rng(const fl_rng *layer_rng, int i, fl_rng *out) {
    *out = *layer_rng;
    out->stream = layer_rng->stream + (uint64_t)i;
    out->position = 0;
    out->used = 4;
}

/* n rounded up to a multiple of 64 (where planned buffers start). */
static inline size_t nn_round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Which outputs a network keeps from forward to backward (recompute.c). Segments are runs of
 * layers in insertion order, each ending after a checkpoint (the last ends with the network);
 * an output is kept when it is a checkpoint, the last layer's, or read by a layer of a later
 * segment; backward recomputes a segment's other outputs before running back through it. */
typedef struct {
    bool  enabled;    /* false: every output kept, one segment */
    int   nsegments;
    int  *segment;    /* [nlayers] segment of each layer (non-decreasing) */
    bool *kept;       /* [nlayers] output kept from forward to backward */
    bool *checkpoint; /* [nlayers] named or chosen checkpoints */
} nn_recompute_plan;

/* Plans recompute for the layers of a network: spec NULL or "" (off), "auto" or
 * comma-separated layer names (an unknown one fails with FL_EINVAL listing the layers).
 * bytes[i] is the size of layer i's output (NULL: not known yet, when only the names are
 * checked); auto uses them to keep as few bytes as it can (recompute.c). */
int  nn_recompute_plan_make(fl_layer *const *layers, int nlayers, const char *spec,
                            const size_t *bytes, nn_recompute_plan *p);
void nn_recompute_plan_free(nn_recompute_plan *p);
/* Bytes of the outputs a plan keeps, and of its arena (the largest segment's other outputs),
 * bytes[i] being layer i's output size. */
void nn_recompute_plan_sizes(const nn_recompute_plan *p, int nlayers, const size_t *bytes,
                             size_t *kept, size_t *arena);

/* Mixed precision's emulation (amp.c; fl_net_set_amp): the rounded copies a white-listed
 * layer computes on, all of the network's backend memory, sized at set-up for the largest
 * white layer and the largest batch. */
typedef struct {
    fl_dtype low;        /* FL_DTYPE_F16 or FL_DTYPE_BF16 */
    bool    *white;      /* [nlayers] the layer computes in low */
    float    loss_scale; /* multiplies the output gradient at the start of backward */
    void    *in[FL_NET_MAX_INPUTS]; /* a white layer's inputs, rounded: slot k the largest
                                     * input k of a white layer, max batch (NULL: none) */
    void    *w;          /* its trainable parameters' values, rounded */
    void    *g;          /* accumulate mode: its gradients before its backward */
    void    *dout;       /* the last output's gradient times loss_scale (max batch) */
    void   **saved;      /* [most parameters of a layer] the values' own pointers */
    /* Native low precision (amp_native.c; fl_net_set_amp_native on a table with low_dtypes):
     * layers with runs[i] keep their activations in `low` (l->adtype), the others f32; where
     * a layer reads an input of the other dtype it reads a converted copy, and its gradient
     * for that input is converted back (edges). NULL runs: emulation only. */
    bool    *runs;       /* [nlayers] the layer runs in low */
    void    *edge_in[FL_NET_MAX_INPUTS];   /* input k converted (largest edge k, max batch) */
    void    *edge_grad[FL_NET_MAX_INPUTS]; /* its gradient in the layer's dtype */
    void    *edge_sum;   /* a converted gradient before it is added to another's */
    fl_tensor out32;     /* the last output in f32, for the loss (when the last layer runs low) */
    void    *dout_low;   /* the last output's scaled gradient in low */
} nn_amp;

/* in_bytes[0 .. nin): the input slots' sizes (nin <= FL_NET_MAX_INPUTS). */
int  nn_amp_create(const fl_backend *k, fl_dtype low, int nlayers, int nin,
                   const size_t *in_bytes, int64_t wnumel, int maxparams, size_t dout_bytes,
                   nn_amp **out);
void nn_amp_free(const fl_backend *k, nn_amp *a); /* NULL: no-op */
/* Whether a white layer's parameters are rounded (all but batch norm's). */
bool nn_amp_rounds_params(const fl_layer *l);
/* t's values rounded in place. */
void nn_amp_round(const nn_amp *a, const fl_backend *k, fl_tensor *t);
/* x rounded into input buffer slot k (the layer's input k): *view, which it returns,
 * describes the copy. */
const fl_tensor *nn_amp_input(nn_amp *a, const fl_backend *k, int slot, const fl_tensor *x,
                              fl_tensor *view);
/* on: l's trainable parameter values point at rounded copies; off: back at the masters. */
void nn_amp_params(nn_amp *a, const fl_backend *k, fl_layer *l, bool on);
/* Accumulate mode: l's gradients are kept aside (save) before a backward that overwrites them;
 * finish rounds what that backward wrote and, when saved, adds the kept sum back in f32. */
void nn_amp_grads_save(nn_amp *a, const fl_backend *k, fl_layer *l);
void nn_amp_grads_finish(nn_amp *a, const fl_backend *k, fl_layer *l, bool saved);

/* Whether layer i runs in the low dtype natively, and whether it is emulated (white, but
 * computing in f32 with rounded copies: every white layer without native low precision). */
static inline bool nn_amp_runs_low(const nn_amp *a, int i) { return a && a->runs && a->runs[i]; }
static inline bool nn_amp_emulated(const nn_amp *a, int i) {
    return a && a->white[i] && !nn_amp_runs_low(a, i);
}
/* amp.c. Which layers a comma-separated list of layer types names: is_white[nlayers]. 0, or
 * FL_EINVAL naming a word that is not a layer type. */
int  nn_amp_white_layers(const struct fl_net *net, const char *white_types, bool *is_white);
/* amp_native.c. Which layers run low natively given the white ones: white ones whose ops->low,
 * and gray ones, ops->low, all of whose inputs run low (runs[nlayers]). */
void nn_amp_native_runs(const struct fl_net *net, const bool *white, bool *runs);
/* After the emulation's set-up (a->white chosen): nn_amp_native_runs, the layers' adtype, the
 * network's activations planned again in those dtypes where any changed (not where
 * fl_net_build planned them so already), the edge buffers. 0, or a negative status (the
 * network is then unbuilt: nn_net_unplan). */
int  nn_amp_native_plan(struct fl_net *net);
/* Every layer's adtype back to the network's dtype and the activations planned again (after
 * native low precision, when it is turned off); 0 or as nn_amp_native_plan. */
int  nn_amp_native_unplan(struct fl_net *net);
void nn_amp_native_free(const fl_backend *k, nn_amp *a);
/* Input k of layer i (x, in the producer's dtype) in the layer's dtype: x itself, or a
 * converted copy in edge_in[k] that *view describes. */
const fl_tensor *nn_amp_edge_input(struct fl_net *net, int i, int k, const fl_tensor *x,
                                   fl_tensor *view);
/* Forward's last output for the loss (f32: out32 converted where the last layer runs low),
 * and the gradient backward starts the last layer from: dy (f32, scaled) or its low copy. */
const fl_tensor *nn_amp_net_output(struct fl_net *net, bool convert);
const fl_tensor *nn_amp_last_grad(struct fl_net *net, const fl_tensor *dy, fl_tensor *view);
/* g, a layer's gradient for an input of another dtype, converted into target (first: written;
 * else converted into edge_sum and added, in target's dtype). */
void nn_amp_edge_grad(struct fl_net *net, const fl_tensor *g, fl_tensor *target, bool first);

/* A network's state (fleet/nn.h keeps it opaque): network.c adds layers and runs forward and
 * backward, network_build.c plans its memory, amp.c and recompute.c keep their settings. */
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
    /* backward: a layer's input gradients for outputs whose gradient another consumer wrote
     * already (read by several layers, or twice by one), added to it after the layer's
     * backward; sum_bytes is the most one layer needs (plan_sums, network_build.c) */
    void      *sum_mem;
    size_t     sum_bytes;
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
    bool               amp_native;     /* fl_net_set_amp_native: run low where the table can */
    /* fl_net_set_amp before fl_net_build: the request the build carries out (low F32: none) */
    fl_dtype           amp_want;
    char              *amp_want_white;
    /* the input's gradient (fl_net_set_input_grad): dx (max_batch, in_shape) when on, written
     * by the input's first consumer in backward (dx_set), the others' added to it */
    bool       input_grad, dx_set;
    int        in_consumers; /* layer inputs that read the network input */
    fl_tensor  dx;
};

/* Frees what fl_net_build allocated and returns the network to its unbuilt state
 * (network_build.c); not the amp state, which its owners free (fl_net_free, fl_net_set_amp). */
void nn_net_unplan(fl_net *net);
/* Plans the activations again (shapes, layers' plans and scratch, placement) for the layers'
 * current adtype, keeping the parameters; 0, or a negative status after nn_net_unplan. */
int  nn_net_replan(fl_net *net);

/* Batch norm's epsilon (PyTorch's and Paddle's default): batch_norm.c, and pplcnetv2_fuse.c
 * which folds batch norms into convolutions. */
#define NN_BN_EPS 1e-5

/* zoo_blocks.c: the model builders' shared steps. */
/* Appends l to net reading layer `from` (-2: the previous layer); its index, or -1 (l NULL or
 * refused: fl_errmsg says why). */
int nn_put(fl_net *net, fl_layer *l, int from);
/* A created layer with Paddle's initialisation (fl_layer_set_init): the layer's Paddle
 * default, or KaimingNormal's fan in (PaddleClas's ConvBNLayer); NULL stays NULL. */
static inline fl_layer *nn_paddle_init(fl_layer *l) {
    return fl_layer_set_init(l, FL_INIT_PADDLE);
}
static inline fl_layer *nn_kaiming_in(fl_layer *l) {
    return fl_layer_set_init(l, FL_INIT_KAIMING_FAN_IN);
}
/* "<p>.<s>" into buf; returns buf. */
const char *nn_name(char *buf, size_t len, const char *p, const char *s);
/* PaddleClas's make_divisible(v, 8): v rounded to the nearest multiple of 8 (at least 8), one
 * more 8 where that lost over 10%. */
int64_t nn_make_divisible(double v);
/* PaddleClas's ConvBNLayer p reading `from`: p.conv (no bias, `groups`, padding (k - 1) / 2),
 * p.bn with act (FL_ACT_NONE, FL_ACT_RELU or FL_ACT_HARDSWISH) fused; the bn's index or
 * -1. */
int nn_conv_bn(fl_net *net, const char *p, int from, int64_t in, int64_t out, int64_t k,
               int64_t s, int64_t groups, fl_act act);

/* Fills t (F32 or F64) with U(-bound, bound). */
void nn_fill_uniform(fl_tensor *t, fl_rng *r, double bound);

#endif /* FLEET_NN_IMPL_H */
