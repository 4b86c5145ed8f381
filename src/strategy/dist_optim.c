/* dist_optim.c - the distributed optimizer (Paddle's fleet.distributed_optimizer): makes the
 * replicas start identical, runs the step that replaces minimize (gradient merge, backward with
 * the gradient-ready hook, the optimizer), and leaves the averaging to a strategy behind
 * struct strategy_ops, so that DGC and Local SGD plug in beside dense. Mixed precision's loss
 * scaling is part of the step's frame, around whichever strategy runs: the scale goes into
 * backward, a found-inf flag is gathered per gradient and combined over the workers, and a
 * step with an inf or NaN anywhere is skipped everywhere (docs/amp.md). */
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

/* strategy.amp's start-up line: which precision runs where, so that a user knows whether the
 * activations really are 2-byte on this table (native: the layers that run low, and any white
 * one that cannot and is emulated) or whether f32 kernels compute on rounded values (emulated,
 * every table without low_dtypes; docs/amp.md). */
static void amp_announce(const fl_dist_optim *d, fl_dtype low, const char *white) {
    const char *dname = low == FL_DTYPE_BF16 ? "bfloat16" : "float16";
    const char *table = fl_net_backend(d->net)->name;
    int n = fl_net_num_layers(d->net), lows = 0, emulated = 0;
    for (int i = 0; i < n; i++) {
        lows += fl_net_amp_low(d->net, i);
        emulated += fl_net_amp_white(d->net, i) && !fl_net_amp_low(d->net, i);
    }
    char how[192];
    if (lows > 0)
        snprintf(how, sizeof how, "native %s activations on the %s table (%d of %d layers, "
                 "%d emulated)", dname, table, lows, n, emulated);
    else if (emulated == 0)
        snprintf(how, sizeof how, "no layer computes in %s on the %s table (none is of a white "
                 "type)", dname, table);
    else
        snprintf(how, sizeof how, "emulated on the %s table (f32 kernels, values rounded to "
                 "%s; %d of %d layers)", table, dname, emulated, n);
    FL_INFO("strategy amp: %s, white %s, loss scale %g (%s)", how, white[0] ? white : "(none)",
            d->amp_mem[FL_AMP_SCALE], d->amp_rule.dynamic ? "dynamic" : "static");
}

/* strategy.amp: the network computes the white-listed layers in reduced precision, the state
 * starts at init_loss_scaling, and the test hook is read. */
static int amp_setup(fl_dist_optim *d) {
    char white[512];
    FL_TRY(fl_amp_white_types(&d->s, white, sizeof white));
    fl_dtype low = d->s.amp_configs.dtype == FL_AMP_BFLOAT16 ? FL_DTYPE_BF16 : FL_DTYPE_F16;
    /* nothing changes where the caller asked before fl_net_build (fl_strategy_plan_amp) */
    FL_TRY(fl_strategy_plan_amp(&d->s, d->net));
    d->amp = true;
    fl_amp_rule_from(&d->s, &d->amp_rule);
    fl_amp_state_init(&d->amp_rule, d->amp_mem);
    snprintf(d->amp_state.name, sizeof d->amp_state.name, "amp.state");
    int64_t n = FL_AMP_NSTATE;
    fl_tensor_view(&d->amp_state.value, FL_DTYPE_F64, 1, &n, d->amp_mem);
    FL_TRY(fl_amp_inject_parse(getenv("FLEET_AMP_INJECT_INF"), &d->inject_step,
                               &d->inject_rank));
    if (d->inject_step > 0)
        FL_WARN("FLEET_AMP_INJECT_INF: an inf goes into a gradient of step %lld on %s (a test "
                "hook)", (long long)d->inject_step,
                d->inject_rank < 0 ? "every rank" : d->inject_rank == d->rank ? "this rank"
                                                                               : "another rank");
    amp_announce(d, low, white);
    return FL_OK;
}

/* The found-inf check, once per update: whether the sum of every trainable gradient, one flat
 * block (in double: finite f32 values cannot overflow it), is not finite, i.e. whether any is
 * inf or NaN. One reduction and one wait, where a check per gradient waits for each on a GPU
 * (about 160 per ResNet-50 step; PyTorch's GradScaler waits once). Not where a strategy's hook
 * starts sending gradients during backward from host memory: its allreduce works in place
 * there (dense on a CPU table) and could be changing the block while this reads it; then
 * each gradient is checked in the hook, before its send (amp_check_in_hook). On a device the
 * sends read host copies, the averages come back into the block only after this check, and
 * what the hook may do to it before (fp16_allreduce's scaling by 1 / N, in the same stream)
 * keeps an inf or a NaN what it is. */
static bool amp_check_in_hook(const fl_dist_optim *d) {
    return d->amp_next && fl_net_backend(d->net)->host_memory;
}
static void amp_check_grads(fl_dist_optim *d) {
    const fl_backend *k = fl_net_backend(d->net);
    double s = k->sum(FL_DTYPE_F32, fl_net_flat_grads(d->net), fl_net_numel(d->net));
    d->amp_found = !isfinite(s);
}

/* The gradient-ready hook under strategy.amp, called for every trainable parameter of the
 * update's last backward as its (scaled, merged) gradient becomes final: the test hook's inf,
 * this gradient's found-inf check where amp_check_in_hook (above), then the strategy's own hook
 * when it may run (amp_next). */
static void amp_grad_ready(void *ctx, fl_param *p) {
    fl_dist_optim *d = ctx;
    const fl_backend *k = fl_net_backend(d->net);
    if (d->inject_now) {
        k->fill(FL_DTYPE_F32, p->grad.data, 1, INFINITY);
        d->inject_now = false;
    }
    if (amp_check_in_hook(d) && !d->amp_found &&
        !isfinite(k->sum(FL_DTYPE_F32, p->grad.data, p->grad.numel)))
        d->amp_found = true;
    if (d->amp_next)
        d->amp_next(ctx, p);
}

/* Whether any worker found an inf or NaN in this update's gradients: one allreduce (max) of a
 * flag, which also waits for the sends the hooks started. */
static int amp_found_anywhere(fl_dist_optim *d, bool *found) {
    int32_t flag = d->amp_found;
    if (d->world > 1) {
        int rc = fl_comm_allreduce(d->comm, &flag, 1, FL_DTYPE_I32, FL_REDOP_MAX);
        if (rc < 0)
            return fl_fail_prefix(rc, "strategy.amp: step %lld: combining the found-inf flag",
                                  (long long)DIST_STEP(d) + 1);
    }
    *found = flag != 0;
    return FL_OK;
}

/* What parameter-server mode cannot run with: the strategies that exchange among workers. */
static int ps_check(const fl_strategy *s) {
    const char *bad = s->dgc                          ? "dgc"
                      : s->localsgd                   ? "localsgd"
                      : s->adaptive_localsgd          ? "adaptive_localsgd"
                      : s->fp16_allreduce             ? "fp16_allreduce"
                      : s->lars                       ? "lars"
                      : s->use_hierarchical_allreduce ? "use_hierarchical_allreduce"
                                                      : NULL;
    if (bad)
        return fl_fail(FL_ECONFIG, "strategy.%s cannot run in parameter-server mode (the "
                                   "servers hold the parameters; geo, strategy.a_sync_configs."
                                   "k_steps, is its answer to slow networks)", bad);
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
    d->merge_scale = d->grad_scale;
    d->loss = NAN;
    snprintf(d->counters.name, sizeof d->counters.name, "dist.counters");
    int64_t two = 2;
    fl_tensor_view(&d->counters.value, FL_DTYPE_I64, 1, &two, d->counter_mem);
    if (s->amp && amp_setup(d) < 0)
        goto fail;
    if (fl_fleet_ps(f)) {
        if (ps_check(s) < 0)
            goto fail;
        d->ops = &fl_ps_ops;
    } else if (s->a_sync) {
        fl_fail(FL_ECONFIG, "strategy.a_sync: the job has no parameter servers (start it with "
                            "fleetrun --server_num S --worker_num W)");
        goto fail;
    } else if (s->dgc)
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
    if (d->amp && d->world > 1) { /* what one found-inf flag sends, for fl_dist_stats.synced */
        bool found;
        if (amp_found_anywhere(d, &found) < 0)
            goto fail;
        uint64_t before = st.bytes_sent;
        fl_comm_get_stats(d->comm, &st);
        d->amp_flag_bytes = st.bytes_sent - before;
    }
    d->bytes_base = st.bytes_sent;
    if (fl_fleet_ps(f)) {
        fl_ps_stats ps;
        fl_ps_get_stats(fl_fleet_ps(f), &ps);
        d->ps_bytes_base = ps.bytes_sent;
    }
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
    if (d->amp) /* one scale for every micro-batch of an update: their sum is scaled alike */
        fl_net_set_loss_scale(d->net, (float)d->amp_mem[FL_AMP_SCALE]);
    if (!last) {
        FL_TRY(fl_net_backward(d->net, dout, NULL, NULL));
        DIST_MICRO(d)++;
        return FL_OK;
    }
    fl_grad_ready_fn hook = d->s.overlap ? d->ops->grad_ready : NULL;
    uint64_t sent_before = fl_dist_bytes_sent(d); /* the strategy's bytes: what this update sends */
    int rc;
    if (d->amp) {
        /* the strategy sees unscaled gradients: grad_scale divides by the loss scale (dense
         * averages the scaled ones and unscales the average: an inf survives the sum) */
        d->grad_scale = d->merge_scale / d->amp_mem[FL_AMP_SCALE];
        d->amp_next = hook && d->ops->grad_ready_undoable ? hook : NULL;
        d->amp_found = false;
        d->inject_now = d->inject_step == DIST_STEP(d) + 1 &&
                        (d->inject_rank < 0 || d->inject_rank == d->rank);
        hook = amp_grad_ready;
    }
    rc = fl_net_backward(d->net, dout, hook, d);
    if (rc < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fl_errmsg());
        d->ops->abandon(d); /* waiting may fail too: keep backward's message */
        return fl_fail(rc, "%s", msg);
    }
    DIST_MICRO(d) = 0;
    fl_net_set_accumulate(d->net, false);
    bool skip = false;
    if (d->amp) {
        if (!amp_check_in_hook(d))
            amp_check_grads(d);
        rc = amp_found_anywhere(d, &skip);
        if (rc < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fl_errmsg());
            d->ops->abandon(d);
            return fl_fail(rc, "%s", msg);
        }
    }
    /* a skipped step (Paddle: the optimizer does not run when found_inf) is still a step: the
     * data, the schedule and the counters move on; parameters and every state stay */
    rc = skip ? (d->ops->abandon(d), FL_OK) : d->ops->update(d, lr);
    DIST_STEP(d)++;
    d->loss = NAN;
    if (rc < 0)
        return rc;
    if (d->amp)
        fl_amp_update(&d->amp_rule, skip, d->amp_mem);
    if (!skip && fl_dist_bytes_sent(d) - sent_before > d->amp_flag_bytes)
        d->synced++; /* the strategy sent something: more than the found-inf flag */
    if (updated)
        *updated = true;
    return FL_OK;
}

int fl_dist_finish(fl_dist_optim *d) {
    FL_ASSERT(d);
    if (!d->ops->finish)
        return FL_OK;
    int rc = d->ops->finish(d);
    return rc < 0 ? fl_fail_prefix(rc, "strategy %s: finishing", d->ops->name) : FL_OK;
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

/* The frame's own state tensors: dist.counters, and amp.state under strategy.amp. */
static int own_state(const fl_dist_optim *d) { return 1 + d->amp; }

int fl_dist_num_state(const fl_dist_optim *d) {
    FL_ASSERT(d);
    return own_state(d) + (d->ops && d->ops->num_state ? d->ops->num_state(d) : 0);
}

fl_param *fl_dist_state(fl_dist_optim *d, int i) {
    FL_ASSERT(d);
    if (i == 0)
        return &d->counters;
    if (i == 1 && d->amp)
        return &d->amp_state;
    if (i < 0 || i >= fl_dist_num_state(d))
        return NULL;
    return d->ops->state(d, i - own_state(d));
}

fl_state_merge fl_dist_state_merge(const fl_dist_optim *d, int i) {
    FL_ASSERT(d && i >= 0 && i < fl_dist_num_state(d));
    if (i == 1 && d->amp)
        return FL_STATE_SAME; /* the same scale and counters on every rank */
    if (i >= own_state(d) && d->ops->merge)
        return d->ops->merge(d, i - own_state(d));
    fl_dtype t = fl_dist_state((fl_dist_optim *)d, i)->value.dtype;
    return t == FL_DTYPE_I64 || t == FL_DTYPE_I32 ? FL_STATE_SAME : FL_STATE_MEAN;
}

uint64_t fl_dist_bytes_sent(const fl_dist_optim *d) {
    FL_ASSERT(d);
    fl_comm_stats st;
    fl_comm_get_stats(d->comm, &st);
    uint64_t ps_bytes = 0;
    if (fl_fleet_ps(d->fleet)) { /* parameter-server mode: what went to the servers too */
        fl_ps_stats ps;
        fl_ps_get_stats(fl_fleet_ps(d->fleet), &ps);
        ps_bytes = ps.bytes_sent - d->ps_bytes_base;
    }
    return st.bytes_sent - d->bytes_base + ps_bytes;
}

void fl_dist_get_stats(const fl_dist_optim *d, fl_dist_stats *out) {
    FL_ASSERT(d && out);
    *out = (fl_dist_stats){.updates = DIST_STEP(d), .synced = d->synced, .interval = 0,
                           .sparsity = NAN, .loss_scale = NAN};
    if (d->amp) {
        out->loss_scale = d->amp_mem[FL_AMP_SCALE];
        out->skipped = (int64_t)d->amp_mem[FL_AMP_SKIPPED];
    }
    if (d->ops && d->ops->stats)
        d->ops->stats(d, out);
}
