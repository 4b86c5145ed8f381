/* dist_optim.c - the distributed optimizer (Paddle's fleet.distributed_optimizer): makes the
 * replicas start identical, runs the step that replaces minimize (gradient merge, backward with
 * the gradient-ready hook, the optimizer), and leaves the averaging to a strategy behind
 * struct strategy_ops, so that DGC and Local SGD plug in beside dense. */
#include "strategy_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies rank 0's parameter block (trainable values, then buffers, contiguous) to every rank:
 * the replicas' own initialisations are discarded, as DDP does at construction. On a device
 * the block goes through a host copy (comm sees host memory only). */
static int broadcast_params(fl_dist_optim *d) {
    const fl_backend *k = fl_net_backend(d->net);
    int64_t count = 0;
    for (int i = 0; i < fl_net_num_params(d->net); i++)
        count += fl_net_param(d->net, i)->value.numel;
    size_t bytes = (size_t)count * fl_dtype_size(fl_net_dtype(d->net));
    void *params = fl_net_flat_params(d->net), *host = NULL;
    if (!k->host_memory && !(host = fl_alloc_aligned(bytes ? bytes : 1)))
        return fl_fail(FL_ENOMEM, "distributed optimizer: cannot allocate %zu bytes to "
                                  "broadcast the parameters", bytes);
    void *wire = fl_backend_stage_buf(k, params, host);
    fl_backend_stage_out(k, params, wire, bytes, NULL);
    int rc = fl_comm_broadcast(d->comm, wire, (size_t)count, fl_net_dtype(d->net), 0);
    if (rc >= 0) {
        fl_backend_stage_in(k, params, wire, bytes, NULL);
        k->stream_sync(NULL);
    }
    fl_free_aligned(host);
    if (rc < 0)
        return fl_fail_prefix(rc, "distributed optimizer: broadcasting rank 0's parameters");
    return FL_OK;
}

fl_dist_optim *fl_distributed_optimizer(fl_fleet *f, fl_net *net, fl_optim *opt,
                                        const fl_strategy *s) {
    FL_ASSERT(f && net && opt && s);
    fl_dist_optim *d = NULL;
    if (fl_strategy_check(s, NULL, fl_optim_get_config(opt)->type) < 0)
        return NULL;
    if (s->lars && fl_optim_get_config(opt)->type != FL_OPTIM_LARS) {
        fl_fail(FL_ECONFIG, "strategy.lars: the optimizer is Momentum, not LARS momentum (build "
                            "its config through fl_strategy_optim_config)");
        return NULL;
    }
    if (!fl_net_flat_params(net)) {
        fl_fail(FL_ESTATE, "distributed optimizer: the network is not built (fl_net_build first)");
        return NULL;
    }
    d = calloc(1, sizeof *d);
    if (!d) {
        fl_fail(FL_ENOMEM, "distributed optimizer: out of memory");
        return NULL;
    }
    d->fleet = f;
    d->comm = fl_fleet_comm(f);
    d->net = net;
    d->opt = opt;
    d->s = *s;
    d->rank = fl_worker_index(f);
    d->world = fl_worker_num(f);
    d->k_steps = s->gradient_merge ? s->gradient_merge_configs.k_steps : 1;
    d->grad_scale = s->gradient_merge && s->gradient_merge_configs.avg ? 1.0 / (double)d->k_steps
                                                                       : 1.0;
    d->loss = NAN;
    snprintf(d->counters.name, sizeof d->counters.name, "dist.counters");
    int64_t two = 2;
    fl_tensor_view(&d->counters.value, FL_DTYPE_I64, 1, &two, d->counter_mem);
    if (s->dgc)
        d->ops = &fl_dgc_ops;
    else if (s->localsgd || s->adaptive_localsgd)
        d->ops = &fl_localsgd_ops;
    else
        d->ops = &fl_dense_ops;
    if (s->use_hierarchical_allreduce && d->world > 1) {
        int rc = fl_comm_split_nodes(d->comm, (int)s->hierarchical_allreduce_inter_nranks,
                                     &d->node, &d->cross);
        if (rc == 0)
            rc = fl_comm_set_hierarchical(d->comm, 1);
        if (rc < 0) {
            fl_fail_prefix(rc, "strategy.use_hierarchical_allreduce");
            goto fail;
        }
    }
    if (d->world > 1 && broadcast_params(d) < 0)
        goto fail;
    if (d->ops->setup(d) < 0) {
        d->ops = NULL; /* setup cleans up after itself */
        goto fail;
    }
    fl_comm_stats st;
    fl_comm_get_stats(d->comm, &st);
    d->bytes_base = st.bytes_sent;
    return d;
fail:
    fl_dist_optim_free(d);
    return NULL;
}

void fl_dist_optim_free(fl_dist_optim *d) {
    if (!d)
        return;
    if (d->ops)
        d->ops->destroy(d);
    free(d);
}

int fl_dist_minimize(fl_dist_optim *d, const fl_tensor *dout, double lr, bool *updated) {
    FL_ASSERT(d && dout);
    if (updated)
        *updated = false;
    /* gradient merge: micro-batches before the last only accumulate, locally; the first of a
     * cycle overwrites the previous update's gradients, the later ones add to them */
    bool last = DIST_MICRO(d) + 1 >= d->k_steps;
    fl_net_set_accumulate(d->net, DIST_MICRO(d) > 0);
    if (!last) {
        FL_TRY(fl_net_backward(d->net, dout, NULL, NULL));
        DIST_MICRO(d)++;
        return FL_OK;
    }
    fl_grad_ready_fn hook = d->s.overlap ? d->ops->grad_ready : NULL;
    uint64_t sent_before = fl_dist_bytes_sent(d); /* the strategy's bytes: what this update sends */
    int rc;
    rc = fl_net_backward(d->net, dout, hook, d);
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fl_errmsg());
        d->ops->abandon(d); /* waiting may fail too: keep backward's message */
        return fl_fail(rc, "%s", msg);
    }
    DIST_MICRO(d) = 0;
    fl_net_set_accumulate(d->net, false);
    rc = d->ops->update(d, lr);
    DIST_STEP(d)++;
    d->loss = NAN;
    if (rc < 0)
        return rc;
    if (fl_dist_bytes_sent(d) != sent_before)
        d->synced++;
    if (updated)
        *updated = true;
    return FL_OK;
}

int fl_dist_set_loss(fl_dist_optim *d, double loss) {
    FL_ASSERT(d);
    if (!isfinite(loss))
        return fl_fail(FL_EINVAL, "distributed optimizer: the loss of update %lld is %g",
                       (long long)DIST_STEP(d), loss);
    d->loss = loss;
    return FL_OK;
}

int64_t fl_dist_step(const fl_dist_optim *d) {
    FL_ASSERT(d);
    return d->counter_mem[0];
}

int fl_dist_num_state(const fl_dist_optim *d) {
    FL_ASSERT(d);
    return 1 + (d->ops && d->ops->num_state ? d->ops->num_state(d) : 0);
}

fl_param *fl_dist_state(fl_dist_optim *d, int i) {
    FL_ASSERT(d);
    if (i == 0)
        return &d->counters;
    if (i < 0 || i >= fl_dist_num_state(d))
        return NULL;
    return d->ops->state(d, i - 1);
}

fl_state_merge fl_dist_state_merge(const fl_dist_optim *d, int i) {
    FL_ASSERT(d && i >= 0 && i < fl_dist_num_state(d));
    if (i > 0 && d->ops->merge)
        return d->ops->merge(d, i - 1);
    fl_dtype t = fl_dist_state((fl_dist_optim *)d, i)->value.dtype;
    return t == FL_DTYPE_I64 || t == FL_DTYPE_I32 ? FL_STATE_SAME : FL_STATE_MEAN;
}

uint64_t fl_dist_bytes_sent(const fl_dist_optim *d) {
    FL_ASSERT(d);
    fl_comm_stats st;
    fl_comm_get_stats(d->comm, &st);
    return st.bytes_sent - d->bytes_base;
}

void fl_dist_get_stats(const fl_dist_optim *d, fl_dist_stats *out) {
    FL_ASSERT(d && out);
    *out = (fl_dist_stats){.updates = DIST_STEP(d), .synced = d->synced, .interval = 0,
                           .sparsity = NAN};
    if (d->ops && d->ops->stats)
        d->ops->stats(d, out);
}
