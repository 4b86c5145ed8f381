/* mlp_phases.c - where the time of one training step of an MLP goes, for bench/dense_overlap.sh's
 * analysis: forward (with the loss), backward, Momentum update, and the moment within backward
 * at which each gradient is final (the network's gradient-ready hook, which the dense strategy
 * uses to start its buckets). With a fusion size it plans the dense strategy's buckets the way
 * src/strategy/dense.c does (reverse parameter order, a bucket closes before it would pass the
 * cap) and gives each bucket's ready time. With COMM_MS it also simulates a perfect overlap:
 * the buckets' allreduces run one after the other on one link, bucket i taking COMM_MS x its
 * share of the bytes, each starting when it is ready and the previous one has finished; the
 * step ends with the later of backward and the last allreduce, then the update:
 *   ideal overlap    = fwd + max(bwd, end of the last allreduce) + upd
 *   no overlap       = fwd + bwd + COMM_MS + upd
 *   ideal hidden     = (no overlap - ideal overlap) / COMM_MS
 * SCALE multiplies every compute time first (e.g. the no-comm step of a contended run / this
 * step: compute slowed by CPU sharing).
 * Usage: mlp_phases IN H1,H2,... ACT CLASSES BATCH ITERS FUSE_MB [COMM_MS [SCALE]]
 * Every time is the median over ITERS steps after a warm-up step. */
#include "fleet/backend.h"
#include "fleet/log.h"
#include "fleet/nn.h"
#include "fleet/optim.h"
#include "fleet/rng.h"
#include "fleet/status.h"
#include "bench_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITERS 256
#define MAX_PARAMS 64

typedef struct {
    fl_net *net;
    double  t0;
    double  ready[MAX_PARAMS]; /* seconds since backward began, by parameter index */
} hook_ctx;

static void on_ready(void *ctx, fl_param *p) {
    hook_ctx *h = ctx;
    ptrdiff_t i = p - fl_net_param(h->net, 0);
    if (i >= 0 && i < MAX_PARAMS)
        h->ready[i] = fl_now() - h->t0;
}

int main(int argc, char **argv) {
    if (argc < 8 || argc > 10) {
        fprintf(stderr, "usage: mlp_phases IN H1,H2,... ACT CLASSES BATCH ITERS FUSE_MB "
                        "[COMM_MS [SCALE]]\n");
        return 2;
    }
    int64_t in = atoll(argv[1]), classes = atoll(argv[4]), batch = atoll(argv[5]);
    int iters = atoi(argv[6]);
    double fuse_mb = atof(argv[7]), comm_ms = argc > 8 ? atof(argv[8]) : 0,
           scale = argc > 9 ? atof(argv[9]) : 1;
    int64_t hidden[16];
    int nh = 0;
    for (char *tok = strtok(argv[2], ","); tok && nh < 16; tok = strtok(NULL, ","))
        hidden[nh++] = atoll(tok);
    fl_act act;
    if (fl_act_parse(argv[3], &act) < 0 || iters < 1 || iters > MAX_ITERS || fuse_mb < 0 ||
        scale <= 0) {
        fprintf(stderr, "mlp_phases: bad arguments: %s\n", fl_errmsg());
        return 2;
    }
    fl_net *net = fl_model_mlp(FL_DTYPE_F32, in, hidden, nh, act, classes);
    int64_t in_shape[1] = {in};
    if (!net || fl_net_build(net, 1, in_shape, batch, 1) < 0) {
        fprintf(stderr, "mlp_phases: %s\n", fl_errmsg());
        return 1;
    }
    int np = fl_net_num_params(net);
    if (np > MAX_PARAMS) {
        fprintf(stderr, "mlp_phases: more than %d parameters\n", MAX_PARAMS);
        return 1;
    }
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), np, FL_DTYPE_F32,
                                    fl_net_backend(net));
    fl_tensor *x = fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){batch, in});
    fl_tensor *probs = fl_tensor_create(FL_DTYPE_F32, 2, (int64_t[]){batch, classes});
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
    fl_rng r;
    fl_rng_init(&r, 3, 0);
    float *xf = x->data;
    for (int64_t i = 0; i < x->numel; i++)
        xf[i] = fl_rng_uniform(&r);
    for (int64_t i = 0; i < batch; i++)
        labels[i] = (int32_t)fl_rng_below(&r, (uint64_t)classes);

    const fl_backend *k = fl_net_backend(net);
    static double fwd[MAX_ITERS], bwd[MAX_ITERS], upd[MAX_ITERS], ready[MAX_PARAMS][MAX_ITERS];
    hook_ctx h = {.net = net};
    double loss = 0;
    for (int it = -1; it < iters; it++) { /* it -1 warms up */
        const fl_tensor *logits;
        double t0 = fl_now();
        if (fl_net_forward(net, x, true, &logits) < 0 ||
            fl_softmax_xent_forward(k, logits, labels, probs, &loss) < 0 ||
            fl_softmax_xent_backward(k, probs, labels, probs) < 0)
            goto fail;
        double t1 = fl_now();
        h.t0 = t1;
        if (fl_net_backward(net, probs, on_ready, &h) < 0)
            goto fail;
        double t2 = fl_now();
        if (fl_optim_step(opt, 0.01, NULL) < 0)
            goto fail;
        double t3 = fl_now();
        if (it < 0)
            continue;
        fwd[it] = (t1 - t0) * 1e3 * scale;
        bwd[it] = (t2 - t1) * 1e3 * scale;
        upd[it] = (t3 - t2) * 1e3 * scale;
        for (int p = 0; p < np; p++)
            ready[p][it] = h.ready[p] * 1e3 * scale;
    }
    double f = bench_median(fwd, iters), b = bench_median(bwd, iters), u = bench_median(upd, iters);
    printf("# mlp_phases: batch %lld, %d steps, compute times x %.3f\n", (long long)batch, iters,
           scale);
    printf("forward_ms %.2f backward_ms %.2f update_ms %.2f step_ms %.2f\n", f, b, u, f + b + u);
    double ready_ms[MAX_PARAMS];
    for (int p = np - 1; p >= 0; p--) {
        fl_param *pp = fl_net_param(net, p);
        ready_ms[p] = pp->trainable ? bench_median(ready[p], iters) : 0;
        if (pp->trainable)
            printf("ready %-12s %9lld values at %7.2f ms of backward\n", pp->name,
                   (long long)pp->grad.numel, ready_ms[p]);
    }

    /* buckets as src/strategy/dense.c plans them */
    double cap = fuse_mb * 1048576.0, bytes = 0, total = 0;
    double bk_ready[MAX_PARAMS], bk_bytes[MAX_PARAMS];
    int nb = 0;
    for (int p = np - 1; p >= 0; p--) {
        fl_param *pp = fl_net_param(net, p);
        if (!pp->trainable)
            continue;
        double pb = (double)pp->grad.numel * 4;
        if (nb == 0 || bytes + pb > cap) {
            bk_ready[nb] = 0;
            bk_bytes[nb] = 0;
            nb++;
            bytes = 0;
        }
        bytes += pb;
        bk_bytes[nb - 1] += pb;
        if (ready_ms[p] > bk_ready[nb - 1])
            bk_ready[nb - 1] = ready_ms[p];
        total += pb;
    }
    for (int i = 0; i < nb; i++)
        printf("bucket %2d %10.0f bytes ready at %7.2f ms of backward\n", i, bk_bytes[i],
               bk_ready[i]);
    if (comm_ms > 0) {
        double end = 0;
        for (int i = 0; i < nb; i++) {
            double start = bk_ready[i] > end ? bk_ready[i] : end;
            end = start + comm_ms * bk_bytes[i] / total;
        }
        double ov = f + (b > end ? b : end) + u, no = f + b + comm_ms + u;
        printf("comm_ms %.1f ideal_overlap_ms %.1f no_overlap_ms %.1f ideal_hidden %.3f\n",
               comm_ms, ov, no, (no - ov) / comm_ms);
    }
    free(labels);
    fl_tensor_free(probs);
    fl_tensor_free(x);
    fl_optim_free(opt);
    fl_net_free(net);
    return 0;
fail:
    fprintf(stderr, "mlp_phases: %s\n", fl_errmsg());
    return 1;
}
