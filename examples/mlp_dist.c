/* mlp_dist.c - the seed document's "FleetAPI分布式训练实例": its single-worker MLP
 * (train.py) made distributed in the four steps of "四步改造法". Run it on two local workers with
 *     fleetrun --nproc_per_node 2 examples/mlp_dist [STEPS]
 * or alone (a job of one). Each worker trains on its own slice of every global batch. */
#include "fleet/fleet.h"

#include <stdio.h>
#include <stdlib.h>

#define BATCH 128 /* per worker, as the seed's gen_data */

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 100;
    fl_fleet *fleet = NULL;
    fl_net *net = NULL;
    fl_dataset *ds = NULL;
    fl_loader *loader = NULL;
    fl_optim *opt = NULL;
    fl_dist_optim *dopt = NULL;
    int rc = 1;

    /* Step 1: the cluster environment fleetrun (or mpirun, torchrun) describes */
    if (fl_fleet_init(NULL, &fleet) < 0)
        goto fail;
    int rank = fl_worker_index(fleet), world = fl_worker_num(fleet);

    /* the single-worker program: mlp(32, [128, 128], tanh, 2), gen_data, SGD(0.01) */
    int64_t hidden[] = {128, 128}, in_shape[] = {32};
    net = fl_model_mlp(FL_DTYPE_F32, 32, hidden, 2, FL_ACT_TANH, 2);
    if (!net || fl_net_build(net, 1, in_shape, BATCH, 1) < 0)
        goto fail;
    ds = fl_dataset_random_create((int64_t)steps * world * BATCH, 32, 2, 7);
    /* ... whose loader takes this worker's slice of each global batch */
    fl_loader_config lc = {.batch_size = BATCH, .shuffle = true, .drop_last = true, .seed = 7,
                           .rank = rank, .world = world};
    if (!ds || !(loader = fl_loader_create(ds, &lc)))
        goto fail;
    fl_optim_config oc = {.type = FL_OPTIM_SGD};
    opt = fl_optim_create(&oc, fl_net_param(net, 0), fl_net_num_params(net), FL_DTYPE_F32,
                          fl_net_backend(net));
    if (!opt)
        goto fail;

    /* Step 2: wrap the optimizer under a strategy (Paddle's DistributedStrategy defaults:
     * fused buckets of 32 MiB, allreduce overlapped with backward) */
    fl_strategy strategy;
    fl_strategy_defaults(&strategy);
    if (!(dopt = fl_distributed_optimizer(fleet, net, opt, &strategy)))
        goto fail;

    /* Step 3: train; fl_dist_minimize replaces backward + optimizer step */
    float probs_mem[BATCH * 2];
    for (int step = 0; step < steps; step++) {
        const fl_tensor *x, *logits;
        const int32_t *y;
        fl_tensor probs;
        double cost;
        if (fl_loader_next(loader, &x, &y) != 1 || fl_net_forward(net, x, true, &logits) < 0)
            goto fail;
        fl_tensor_view(&probs, FL_DTYPE_F32, 2, logits->shape, probs_mem);
        if (fl_softmax_xent_forward(fl_net_backend(net), logits, y, &probs, &cost) < 0 ||
            fl_softmax_xent_backward(fl_net_backend(net), &probs, y, &probs) < 0 ||
            fl_dist_minimize(dopt, &probs, 0.01, NULL) < 0)
            goto fail;
        if (step % 10 == 0)
            printf("worker_index: %d, step%d cost = %f\n", rank, step, cost);
    }

    /* Step 4: save on rank 0 only (checkpoint files come with a later version: a checksum) */
    if (rank == 0)
        printf("worker_index: 0, saved: parameter checksum %.9g over %lld values\n",
               fl_net_backend(net)->sum(FL_DTYPE_F32, fl_net_flat_params(net), fl_net_numel(net)),
               (long long)fl_net_numel(net));
    rc = 0;
fail:
    if (rc)
        fprintf(stderr, "mlp_dist: error: %s\n", fl_errmsg());
    fl_dist_optim_free(dopt);
    fl_optim_free(opt);
    fl_loader_free(loader);
    fl_dataset_free(ds);
    fl_net_free(net);
    fl_fleet_free(fleet);
    return rc;
}
