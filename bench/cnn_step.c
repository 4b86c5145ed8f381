/* cnn_step.c - times one training step (forward, softmax cross-entropy, backward, Momentum
 * update) of a ResNet, the workload of bench/cnn_step_torch.py, for the comparison that
 * bench/cnn_step.sh prints, and of bench/recompute.sh. Usage:
 *   [CNN_STEP_AMP=f16|bf16] cnn_step MODEL BATCH ITERS REPEATS [BACKEND [CHECKPOINTS]]
 * MODEL one of resnet20 (CIFAR, option A, 3x32x32, 10 classes), resnet18/34/50/101/152
 * (3x224x224, 1000 classes), mlpD (D hidden ReLU layers of 1024, 1024 inputs, 10 classes), or
 * PaddleClas's pplcnet_x<scale> (x0_25 .. x2_5), pplcnetv2 (base, training form) and
 * pphgnet_<size> (tiny, small, base) at 1000 classes on 3 x S x S, S = CNN_STEP_SIZE (default
 * 224; the ImageNet stem at every size, for bench/pplcnet_step.sh),
 * BACKEND auto (default), onednn, cpu or ref, CHECKPOINTS none (default), auto or layer names
 * (fl_net_set_recompute). Prints the median over REPEATS of the mean step time of ITERS steps,
 * in ms (and on stderr the median CPU time per step, all threads together, the network's
 * trainable parameters, its activation memory and the process's peak resident memory). The
 * first CNN_STEP_WARMUP (default 1) repeats are warm-up, untimed; with CNN_STEP_MIN_S set,
 * repeats go on past REPEATS (up to 64) until that many seconds are timed.
 * BACKEND cuda trains on GPU 0 (FLAGS_selected_gpus picks another; FLEET_CUDA_TF32=1 allows
 * TF32): the batch lives on the device, each repeat ends with a stream sync, and stderr adds
 * the device's peak memory. CNN_STEP_DGC=S (a sparsity, e.g. 0.999) adds DGC's local work to
 * every step as the strategy does it (src/strategy/dgc.c prepare: the fused accumulation and
 * sampled top-k selection, encoding, the pairs copied to the host) for each parameter of at
 * least the strategy's min_compress_numel (16384) values, all in one batched call
 * (fl_backend_dgc_batch; CNN_STEP_DGC_BATCH=0: tensor by tensor, as the strategy does on the
 * CPU), and stderr says what that work costs as a share of the step.
 * CNN_STEP_AMP=f16|bf16 (unset or f32: off) runs strategy.amp's step instead, as fleet-train
 * does under strategy.amp (docs/amp.md): the distributed optimizer of a job of one
 * (fl_distributed_optimizer, fl_dist_minimize) makes the network compute Paddle's white list
 * (conv2d, fc) in float16 / bfloat16, natively where the table has low_dtypes (ref; cuda with
 * FLEET_CUDA_LOW_DTYPES=1: 2-byte activations), else emulated (f32 kernels, rounded values);
 * the loss gradient is scaled by a static 1024, the gradients are checked for inf/NaN (such a
 * step is skipped) and unscaled before the Momentum update. stderr has the strategy's start-up
 * line ("strategy amp: native float16 activations on the ref table (N of M layers, ...)" or
 * "emulated on the cpu table ...") and the last line adds "amp float16 native N of M layers"
 * (or "emulated"), the steps skipped and the losses that were not finite. Not with
 * CNN_STEP_DGC. The step is the strategy's, costs included (its inf/NaN check: one sum over the
 * gradient block, one wait per update on a GPU, as PyTorch's GradScaler). */
#include "fleet/backend.h"
#include "fleet/fleet.h"
#include "fleet/log.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "fleet/strategy.h"
#include "strategy/dgc_math.h"
#include "bench_time.h"

#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* DGC's local work per step (CNN_STEP_DGC): per compressed tensor its u and v, the selection's
 * index and scratch space, its pairs on the backend and on the host, and last step's k-th value
 * (the hint the strategy passes from the second step on). */
typedef struct dgc_tensor {
    fl_param    *p;
    int64_t      k;
    float       *u, *v, *scratch, hint;
    int32_t     *idx;
    fl_dgc_pair *pairs, *host;
} dgc_tensor;
typedef struct dgc_work {
    int                n;
    int64_t            values, pairs_total;
    double             sparsity;
    bool               batched; /* CNN_STEP_DGC_BATCH=0: tensor by tensor, as before */
    int                big;     /* the largest tensor: its idx and scratch serve the batch */
    dgc_tensor        *t;
    fl_dgc_batch_item *items;   /* the batched call's tensors */
    int64_t           *count;
    fl_dgc_pair       *pairs, *host; /* every tensor's pairs, one after the other */
} dgc_work;

static int dgc_work_init(dgc_work *w, fl_net *net, double sparsity) {
    const fl_backend *k = fl_net_backend(net);
    if (!(sparsity > 0 && sparsity < 1))
        return fl_fail(FL_EINVAL, "sparsity %g is not in (0, 1)", sparsity);
    w->sparsity = sparsity;
    fl_strategy defaults;
    fl_strategy_defaults(&defaults);
    int64_t smallest = defaults.dgc_configs.min_compress_numel;
    w->t = calloc((size_t)fl_net_num_params(net), sizeof *w->t);
    if (!w->t)
        return fl_fail(FL_ENOMEM, "out of memory");
    for (int i = 0; i < fl_net_num_params(net); i++) {
        fl_param *p = fl_net_param(net, i);
        int64_t n = p->value.numel;
        if (!p->trainable || n < smallest) /* small tensors go dense, as in the strategy */
            continue;
        dgc_tensor *t = &w->t[w->n++];
        t->p = p;
        t->k = dgc_k(n, sparsity);
        size_t scratch = (size_t)(n + (n / 100 > 4096 ? n / 100 : 4096)) * sizeof(float);
        t->u = k->alloc((size_t)n * sizeof(float));
        t->v = k->alloc((size_t)n * sizeof(float));
        t->scratch = k->alloc(scratch);
        t->idx = k->alloc((size_t)n * sizeof(int32_t));
        if (!t->u || !t->v || !t->scratch || !t->idx)
            return fl_fail(FL_ENOMEM, "out of memory for %s's DGC buffers", p->name);
        w->values += n;
        w->pairs_total += t->k;
    }
    const char *b = getenv("CNN_STEP_DGC_BATCH");
    w->batched = !(b && b[0] == '0');
    w->pairs = k->alloc((size_t)w->pairs_total * sizeof(fl_dgc_pair));
    w->host = fl_backend_host_alloc(k, (size_t)w->pairs_total * sizeof(fl_dgc_pair));
    w->items = calloc((size_t)(w->n ? w->n : 1), sizeof *w->items);
    w->count = calloc((size_t)(w->n ? w->n : 1), sizeof *w->count);
    if (!w->pairs || !w->host || !w->items || !w->count)
        return fl_fail(FL_ENOMEM, "out of memory for the DGC pairs");
    int64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        dgc_tensor *t = &w->t[i];
        if (t->p->value.numel > w->t[w->big].p->value.numel)
            w->big = i;
        t->pairs = w->pairs + off;
        t->host = w->host + off;
        w->items[i] = (fl_dgc_batch_item){.n = t->p->value.numel, .k = t->k, .base = 0,
                                          .grad = t->p->grad.data, .w = t->p->value.data,
                                          .u = t->u, .v = t->v, .pairs = t->pairs,
                                          .hint = &t->hint};
        off += t->k;
    }
    return FL_OK;
}

/* One step's DGC work on every compressed tensor, timed from the backward's end (a sync) to
 * the pairs' arrival on the host; seconds. */
static double dgc_work_step(dgc_work *w, const fl_backend *k, int step) {
    fl_dgc_accum_args a = {.clip_scale = 1, .decay = 1e-4, .momentum = 0.9, .correction = true};
    k->stream_sync(NULL);
    double t0 = fl_now();
    if (w->batched) { /* every tensor in one call, the pairs back in one copy */
        for (int i = 0; i < w->n; i++)
            w->items[i].seed = (uint64_t)step * 1000003u + (uint64_t)i;
        fl_backend_dgc_batch(k, w->n, w->items, &a, true, w->count, w->t[w->big].idx,
                             w->t[w->big].scratch);
        fl_backend_stage_out(k, w->pairs, w->host, (size_t)w->pairs_total * sizeof *w->pairs,
                             NULL);
        return fl_now() - t0;
    }
    for (int i = 0; i < w->n; i++) {
        dgc_tensor *t = &w->t[i];
        int64_t n = t->p->value.numel;
        int64_t cnt = k->dgc_accumulate_select(n, t->p->grad.data, t->p->value.data, t->u, t->v,
                                               &a, t->k, t->idx, t->scratch,
                                               (uint64_t)step * 1000003u + (uint64_t)i, &t->hint,
                                               NULL);
        k->dgc_encode(t->idx, cnt, 0, t->v, t->u, t->pairs);
        fl_backend_stage_out(k, t->pairs, t->host, (size_t)cnt * sizeof *t->pairs, NULL);
    }
    k->stream_sync(NULL);
    return fl_now() - t0;
}

/* CNN_STEP_AMP (env): strategy.amp in s (the dtype, a static loss scale of 1024; s->amp false
 * when env is unset, "" or f32), asked of the network before its build as fleet-train does
 * (fl_strategy_plan_amp: the low layers planned once). FL_EINVAL naming CNN_STEP_AMP for
 * another value. */
static int amp_request(const char *env, fl_strategy *s, fl_net *net) {
    fl_strategy_defaults(s);
    if (!env || !env[0] || !strcmp(env, "f32"))
        return FL_OK;
    if (!strcmp(env, "f16") || !strcmp(env, "float16"))
        s->amp_configs.dtype = FL_AMP_FLOAT16;
    else if (!strcmp(env, "bf16") || !strcmp(env, "bfloat16"))
        s->amp_configs.dtype = FL_AMP_BFLOAT16;
    else
        return fl_fail(FL_EINVAL, "CNN_STEP_AMP=%s: not f16, bf16 or f32", env);
    s->amp = true;
    s->amp_configs.init_loss_scaling = 1024;
    s->amp_configs.use_dynamic_loss_scaling = false;
    return fl_strategy_plan_amp(s, net);
}

/* With s->amp: strategy.amp over opt, set up by the distributed optimizer of a job of one,
 * whose fl_dist_minimize then replaces backward and the optimizer's step; *fleet and *out are
 * NULL without. Says in how (64 bytes) which precision runs: "float16 native 21 of 21 layers"
 * or "float16 emulated 8 of 21 layers". The strategy's failures. */
static int amp_setup(const fl_strategy *s, fl_net *net, fl_optim *opt, fl_fleet **fleet,
                     fl_dist_optim **out, char *how) {
    *fleet = NULL, *out = NULL;
    snprintf(how, 64, "f32");
    if (!s->amp)
        return FL_OK;
    FL_TRY(fl_fleet_init(NULL, fleet));
    if (!(*out = fl_distributed_optimizer(*fleet, net, opt, s)))
        return fl_fail_prefix(FL_ESTATE, "CNN_STEP_AMP");
    int n = fl_net_num_layers(net), low = 0, white = 0;
    for (int i = 0; i < n; i++) {
        low += fl_net_amp_low(net, i);
        white += fl_net_amp_white(net, i);
    }
    const char *dname = s->amp_configs.dtype == FL_AMP_BFLOAT16 ? "bfloat16" : "float16";
    if (low > 0)
        snprintf(how, 64, "%s native %d of %d layers", dname, low, n);
    else
        snprintf(how, 64, "%s emulated %d of %d layers", dname, white, n);
    return FL_OK;
}

/* CPU seconds of the whole process (all threads): less disturbed by other jobs than wall time */
int main(int argc, char **argv) {
    if (argc < 5 || argc > 7) {
        fprintf(stderr, "usage: [CNN_STEP_AMP=f16|bf16] cnn_step MODEL BATCH ITERS REPEATS "
                        "[auto|onednn|cpu|ref|cuda [none|auto|LAYER,...]]\n");
        return 2;
    }
    int64_t batch = atoll(argv[2]);
    int iters = atoi(argv[3]), repeats = atoi(argv[4]);
    if (batch < 1 || iters < 1 || repeats < 1 || repeats > 64) {
        fprintf(stderr, "cnn_step: bad arguments\n");
        return 2;
    }
    fl_net *net = NULL;
    int64_t size = 224, classes = 1000;
    int depth = strncmp(argv[1], "resnet", 6) == 0 ? atoi(argv[1] + 6) : 0;
    if (depth == 18 || depth == 34 || depth == 50 || depth == 101 || depth == 152) {
        net = fl_model_resnet(FL_DTYPE_F32, depth, classes);
    } else if (depth > 0) { /* CIFAR: 20, 32, 44, 56, 110 */
        size = 32, classes = 10;
        net = fl_model_resnet_cifar(FL_DTYPE_F32, depth, 3, classes, 'A');
    }
    const char *m = argv[1], *side = getenv("CNN_STEP_SIZE");
    if (!strncmp(m, "pplcnet_x", 9) || !strcmp(m, "pplcnetv2") || !strncmp(m, "pphgnet_", 8)) {
        size = side ? atoll(side) : 224;
        if (size < 32 || size > 4096) {
            fprintf(stderr, "cnn_step: CNN_STEP_SIZE %s is not in [32, 4096]\n", side);
            return 2;
        }
    }
    if (!strncmp(m, "pplcnet_x", 9)) { /* x0_25 -> 0.25 */
        char sc[16];
        snprintf(sc, sizeof sc, "%s", m + 9);
        for (char *c = sc; *c; c++)
            *c = *c == '_' ? '.' : *c;
        net = fl_model_pplcnet(FL_DTYPE_F32, atof(sc), 3, false, classes);
    } else if (!strcmp(m, "pplcnetv2")) {
        net = fl_model_pplcnetv2(FL_DTYPE_F32, 3, false, classes);
    } else if (!strncmp(m, "pphgnet_", 8)) {
        net = fl_model_pphgnet(FL_DTYPE_F32, m + 8, 3, false, classes);
    }
    int in_ndim = 3;
    if (strncmp(argv[1], "mlp", 3) == 0 && atoi(argv[1] + 3) > 0) {
        int64_t hidden[256];
        int d = atoi(argv[1] + 3) > 256 ? 256 : atoi(argv[1] + 3);
        for (int i = 0; i < d; i++)
            hidden[i] = 1024;
        size = 1024, classes = 10, in_ndim = 1;
        net = fl_model_mlp(FL_DTYPE_F32, size, hidden, d, FL_ACT_RELU, classes);
    }
    int64_t in_shape[3] = {3, size, size};
    if (in_ndim == 1)
        in_shape[0] = size;
    const fl_backend *be = fl_backend_by_name(argc >= 6 ? argv[5] : "auto");
    const char *checkpoints = argc == 7 && strcmp(argv[6], "none") ? argv[6] : NULL;
    if (!be) {
        fprintf(stderr, "cnn_step: %s\n", fl_errmsg());
        return 2;
    }
    if (!be->host_memory && be->device_bind) { /* a GPU: bind it before anything is built */
        const char *sel = getenv("FLAGS_selected_gpus");
        if (be->device_bind(sel ? atoi(sel) : 0) < 0) {
            fprintf(stderr, "cnn_step: %s\n", fl_errmsg());
            return 1;
        }
    }
    if (net)
        fl_net_set_backend(net, be);
    fl_strategy amp_s; /* CNN_STEP_AMP */
    if (!net || fl_net_set_recompute(net, checkpoints) < 0 ||
        amp_request(getenv("CNN_STEP_AMP"), &amp_s, net) < 0 ||
        fl_net_build(net, in_ndim, in_shape, batch, 1) < 0) {
        fprintf(stderr, "cnn_step: %s: %s\n", argv[1], fl_errmsg());
        return 1;
    }
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9, .weight_decay = 1e-4};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
    fl_tensor *x = in_ndim == 1
                       ? fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){batch, size})
                       : fl_tensor_create(FL_DTYPE_F32, 4, (int64_t[]){batch, 3, size, size});
    fl_tensor *probs = fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){batch, classes});
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
    if (!opt || !x || !probs || !labels) {
        fprintf(stderr, "cnn_step: %s\n", fl_errmsg());
        return 1;
    }
    fl_rng r;
    fl_rng_init(&r, 3, 0);
    float *xf = x->data;
    for (int64_t i = 0; i < x->numel; i++)
        xf[i] = 2 * fl_rng_uniform(&r) - 1;
    for (int64_t i = 0; i < batch; i++)
        labels[i] = (int32_t)fl_rng_below(&r, (uint64_t)classes);

    const fl_backend *k = fl_net_backend(net);
    const int32_t *klabels = labels;
    fl_tensor xdev, pdev, *xin = x, *pout = probs; /* the batch where the backend computes */
    if (!k->host_memory) { /* the batch, its labels and the probabilities on the device */
        void *dx = k->alloc(fl_tensor_nbytes(x)), *dl = k->alloc((size_t)batch * sizeof *labels);
        void *dp = k->alloc(fl_tensor_nbytes(probs));
        if (!dx || !dl || !dp) {
            fprintf(stderr, "cnn_step: device memory for the batch: %s\n", fl_errmsg());
            return 1;
        }
        k->copy(dx, x->data, fl_tensor_nbytes(x), FL_COPY_H2D, NULL);
        k->copy(dl, labels, (size_t)batch * sizeof *labels, FL_COPY_H2D, NULL);
        k->stream_sync(NULL);
        fl_tensor_view(&xdev, x->dtype, x->ndim, x->shape, dx);
        xdev.device = fl_backend_device(k);
        fl_tensor_view(&pdev, probs->dtype, 2, probs->shape, dp);
        pdev.device = fl_backend_device(k);
        xin = &xdev, pout = &pdev;
        klabels = dl;
    }
    fl_fleet *fleet;
    fl_dist_optim *amp; /* CNN_STEP_AMP: strategy.amp's step, else NULL */
    char amp_how[64];
    if (amp_setup(&amp_s, net, opt, &fleet, &amp, amp_how) < 0) {
        fprintf(stderr, "cnn_step: %s: %s\n", argv[1], fl_errmsg());
        return 1;
    }
    if (amp && getenv("CNN_STEP_DGC")) {
        fprintf(stderr, "cnn_step: CNN_STEP_DGC with CNN_STEP_AMP: not measured together\n");
        return 2;
    }
    dgc_work dgc = {0};
    if (getenv("CNN_STEP_DGC") && dgc_work_init(&dgc, net, atof(getenv("CNN_STEP_DGC"))) < 0) {
        fprintf(stderr, "cnn_step: CNN_STEP_DGC: %s\n", fl_errmsg());
        return 1;
    }
    double times[64], cpu[64], dgc_ms[64];
    double loss = 0;
    int64_t nonfinite = 0; /* steps whose loss was inf or NaN */
    int warmup = getenv("CNN_STEP_WARMUP") ? atoi(getenv("CNN_STEP_WARMUP")) : 1;
    double min_s = getenv("CNN_STEP_MIN_S") ? atof(getenv("CNN_STEP_MIN_S")) : 0, timed = 0;
    for (int rep = -warmup; rep < repeats || (timed < min_s && rep < 64); rep++) {
        /* negative reps warm up; then REPEATS, or more (up to 64) until CNN_STEP_MIN_S */
        double t0 = fl_now(), c0 = bench_cpu_s(), in_dgc = 0;
        for (int it = 0; it < iters; it++) {
            const fl_tensor *logits;
            if (fl_net_forward(net, xin, true, &logits) < 0 ||
                fl_softmax_xent_forward(k, logits, klabels, pout, &loss) < 0 ||
                fl_softmax_xent_backward(k, pout, klabels, pout) < 0 ||
                (amp ? fl_dist_minimize(amp, pout, 0.01, NULL)
                     : fl_net_backward(net, pout, NULL, NULL)) < 0) {
                fprintf(stderr, "cnn_step: %s\n", fl_errmsg());
                return 1;
            }
            nonfinite += !isfinite(loss);
            if (amp) /* backward, the inf check, unscaling and the update are done */
                continue;
            if (dgc.n)
                in_dgc += dgc_work_step(&dgc, k, rep * iters + it);
            if (fl_optim_step(opt, 0.01, NULL) < 0) {
                fprintf(stderr, "cnn_step: %s\n", fl_errmsg());
                return 1;
            }
        }
        k->stream_sync(NULL);
        if (rep >= 0) {
            timed += fl_now() - t0;
            if (rep >= repeats)
                repeats = rep + 1;
            times[rep] = (fl_now() - t0) * 1e3 / iters;
            cpu[rep] = (bench_cpu_s() - c0) * 1e3 / iters;
            dgc_ms[rep] = in_dgc * 1e3 / iters;
        }
    }
    qsort(times, (size_t)repeats, sizeof times[0], bench_cmp_double);
    qsort(cpu, (size_t)repeats, sizeof cpu[0], bench_cmp_double);
    qsort(dgc_ms, (size_t)repeats, sizeof dgc_ms[0], bench_cmp_double);
    printf("%.4f\n", times[repeats / 2]);
    if (dgc.n)
        fprintf(stderr, "cnn_step: dgc at sparsity %g over %d tensors (%lld values, %s): %.3f "
                "ms per step, %.1f%% of the step's %.3f ms\n", dgc.sparsity, dgc.n,
                (long long)dgc.values, dgc.batched ? "batched" : "tensor by tensor",
                dgc_ms[repeats / 2],
                100 * dgc_ms[repeats / 2] / times[repeats / 2], times[repeats / 2]);
    if (k->memory_peak)
        fprintf(stderr, "cnn_step: device memory peak %.1f MiB\n",
                (double)k->memory_peak() / (1 << 20));
    if (amp) {
        fl_dist_stats st;
        fl_dist_get_stats(amp, &st);
        fprintf(stderr, "cnn_step: amp %s, loss scale %g (static), %lld of %lld updates "
                "(warm-up included) skipped (inf/NaN gradients), %lld losses not finite\n",
                amp_how, st.loss_scale, (long long)st.skipped, (long long)st.updates,
                (long long)nonfinite);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t kept, arena, grads;
    fl_net_activation_parts(net, &kept, &arena, &grads);
    fprintf(stderr, "cnn_step: %s (%s, %s, recompute %s, amp %s) params %lld, steps %d, "
            "final loss %.4f, cpu %.1f ms per step, act %.1f MB (outputs %.1f arena %.1f grads "
            "%.1f), maxrss %.1f MB\n", argv[1], be->name, fl_layout_name(fl_net_layout(net)),
            checkpoints ? checkpoints : "none", amp_how, (long long)fl_net_numel(net),
            repeats * iters, loss, cpu[repeats / 2],
            (double)fl_net_activation_bytes(net) / 1e6, (double)kept / 1e6, (double)arena / 1e6,
            (double)grads / 1e6, (double)ru.ru_maxrss / 1024.0);
    free(labels);
    fl_tensor_free(probs);
    fl_tensor_free(x);
    fl_dist_optim_free(amp);
    fl_fleet_free(fleet);
    fl_optim_free(opt);
    fl_net_free(net);
    return 0;
}
