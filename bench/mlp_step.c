/* mlp_step.c - times one training step (forward, softmax cross-entropy, backward, Momentum
 * update) of an MLP, the workload of bench/mlp_step_torch.py, for the comparison that
 * bench/mlp_step.sh prints. Usage: mlp_step IN H1,H2,... ACT CLASSES BATCH ITERS REPEATS
 * Prints the median over REPEATS of the mean step time of ITERS steps, in ms. */
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

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: mlp_step IN H1,H2,... ACT CLASSES BATCH ITERS REPEATS\n");
        return 2;
    }
    int64_t in = atoll(argv[1]), classes = atoll(argv[4]), batch = atoll(argv[5]);
    int iters = atoi(argv[6]), repeats = atoi(argv[7]);
    int64_t hidden[16];
    int nh = 0;
    for (char *tok = strtok(argv[2], ","); tok && nh < 16; tok = strtok(NULL, ","))
        hidden[nh++] = atoll(tok);
    fl_act act;
    if (fl_act_parse(argv[3], &act) < 0 || repeats < 1 || repeats > 64 || iters < 1) {
        fprintf(stderr, "mlp_step: bad arguments: %s\n", fl_errmsg());
        return 2;
    }

    fl_net *net = fl_model_mlp(FL_DTYPE_F32, in, hidden, nh, act, classes);
    int64_t in_shape[1] = {in};
    if (!net || fl_net_build(net, 1, in_shape, batch, 1) < 0) {
        fprintf(stderr, "mlp_step: %s\n", fl_errmsg());
        return 1;
    }
    fl_optim_config oc = {.type = FL_OPTIM_MOMENTUM, .momentum = 0.9};
    fl_optim *opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net),
                                    FL_DTYPE_F32, fl_net_backend(net));
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
    double times[64];
    double loss = 0;
    for (int rep = -1; rep < repeats; rep++) { /* rep -1 warms up */
        double t0 = fl_now();
        for (int it = 0; it < iters; it++) {
            const fl_tensor *logits;
            if (fl_net_forward(net, x, true, &logits) < 0 ||
                fl_softmax_xent_forward(k, logits, labels, probs, &loss) < 0 ||
                fl_softmax_xent_backward(k, probs, labels, probs) < 0 ||
                fl_net_backward(net, probs, NULL, NULL) < 0 || fl_optim_step(opt, 0.01, NULL) < 0) {
                fprintf(stderr, "mlp_step: %s\n", fl_errmsg());
                return 1;
            }
        }
        if (rep >= 0)
            times[rep] = (fl_now() - t0) * 1e3 / iters;
    }
    qsort(times, (size_t)repeats, sizeof times[0], bench_cmp_double);
    printf("%.4f\n", times[repeats / 2]);
    fprintf(stderr, "mlp_step: final loss %.4f\n", loss);
    free(labels);
    fl_tensor_free(probs);
    fl_tensor_free(x);
    fl_optim_free(opt);
    fl_net_free(net);
    return 0;
}
