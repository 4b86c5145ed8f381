/* localsgd.c - Local SGD: every worker steps its own replica with its own gradients and nothing
 * is sent, then every k steps the replicas are averaged (Lin et al. 2018, "Don't Use Large
 * Mini-Batches, Use Local SGD", arXiv:1808.07217, with post-local SGD's synchronous warm-up of
 * begin_step steps), with k fixed or chosen after each average from loss and learning rate
 * (adaptive communication: Wang & Joshi 2018, arXiv:1810.08313). The schedule is Paddle's
 * (localsgd_rule.c); the average is Paddle's too: each rank keeps a snapshot of the parameters
 * at the last average and allreduces its difference from it, in place in the parameter block:
 *     p = snapshot - p;  p = allreduce_avg(p);  p = snapshot - p;  snapshot = p
 * Persistable buffers (running statistics) follow the trainable values in the block and are
 * averaged in the same allreduce, as values. Optimizer state (momentum) stays local. */
#include "localsgd_rule.h"
#include "strategy_impl.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const fl_backend *be;  /* the network's: snapshot is its memory */
    void     *snapshot;    /* (numel) trainable values at the last average, in the net's dtype */
    void     *host;        /* (count) host staging of an average; NULL on the CPU backends */
    fl_param *snap;        /* (nsnap) "localsgd.snapshot.<param>": views into snapshot */
    int       nsnap;
    int64_t   numel;       /* trainable values: the first numel of the parameter block */
    int64_t   count;       /* trainable values and buffers: what one average sends */
    bool      adaptive;    /* strategy.adaptive_localsgd (else strategy.localsgd) */
    int64_t   begin_step;  /* synchronous steps first */
    int64_t   init_k;      /* adaptive: init_k_steps */
    bool      adacomm;     /* adaptive: Wang & Joshi's form of the rule (else Paddle's) */
    /* "localsgd.counters", i64 (2): [0] last step (1-based) that averaged, [1] the interval k.
     * "localsgd.adaptive", f64 (2): [0] loss0 (rank-averaged loss of step 1), [1] lr0 (the
     * largest learning rate so far: fl_localsgd_rule_lr0); adaptive only, zeros otherwise. Live values: checkpoints write them back. */
    fl_param  counters, rule;
    int64_t   counter_mem[2];
    double    rule_mem[2];
} localsgd;

#define LAST_SYNC(ls) ((ls)->counter_mem[0])
#define K(ls) ((ls)->counter_mem[1])
#define LOSS0(ls) ((ls)->rule_mem[0])
#define LR0(ls) ((ls)->rule_mem[1])

static const char *key(const localsgd *ls) {
    return ls->adaptive ? "strategy.adaptive_localsgd" : "strategy.localsgd";
}

static void free_state(localsgd *ls) {
    if (!ls)
        return;
    if (ls->be)
        ls->be->free(ls->snapshot);
    fl_free_aligned(ls->host);
    free(ls->snap);
    free(ls);
}

static int setup(fl_dist_optim *d) {
    int rc;
    localsgd *ls = calloc(1, sizeof *ls);
    if (!ls)
        return fl_fail(FL_ENOMEM, "strategy localsgd: out of memory");
    fl_net *net = d->net;
    fl_dtype t = fl_net_dtype(net);
    size_t es = fl_dtype_size(t);
    int np = fl_net_num_params(net);
    ls->adaptive = d->s.adaptive_localsgd;
    ls->begin_step = ls->adaptive ? d->s.adaptive_localsgd_configs.begin_step
                                  : d->s.localsgd_configs.begin_step;
    ls->init_k = d->s.adaptive_localsgd_configs.init_k_steps;
    ls->adacomm = d->s.adaptive_localsgd_configs.rule == FL_LOCALSGD_RULE_ADACOMM;
    K(ls) = ls->adaptive ? ls->init_k : d->s.localsgd_configs.k_steps;
    LAST_SYNC(ls) = ls->begin_step; /* Paddle's last_step starts at begin_step */
    if (ls->begin_step < 1 || K(ls) < 1) {
        rc = fl_fail(FL_ECONFIG, "%s: begin_step %lld and the interval %lld must be >= 1",
                     key(ls), (long long)ls->begin_step, (long long)K(ls));
        goto fail;
    }
    if (t != FL_DTYPE_F32 && t != FL_DTYPE_F64) {
        rc = fl_fail(FL_EUNSUPPORTED, "%s: needs an f32 or f64 network (this one computes in %s)",
                     key(ls), fl_dtype_name(t));
        goto fail;
    }
    ls->numel = fl_net_numel(net);
    ls->count = 0;
    for (int i = 0; i < np; i++) {
        ls->count += fl_net_param(net, i)->value.numel;
        ls->nsnap += fl_net_param(net, i)->trainable;
    }
    const fl_backend *be = ls->be = fl_net_backend(net);
    ls->snapshot = be->alloc((size_t)ls->numel * es);
    if (!be->host_memory &&
        !(ls->host = fl_alloc_aligned((size_t)(ls->count ? ls->count : 1) * es))) {
        rc = fl_fail(FL_ENOMEM, "%s: cannot allocate host staging of %lld values", key(ls),
                     (long long)ls->count);
        goto fail;
    }
    ls->snap = calloc((size_t)(ls->nsnap ? ls->nsnap : 1), sizeof *ls->snap);
    if (!ls->snapshot || !ls->snap) {
        rc = fl_fail(FL_ENOMEM, "%s: cannot allocate the snapshot of %lld parameters", key(ls),
                     (long long)ls->numel);
        goto fail;
    }
    /* the replicas are identical here (rank 0's broadcast): that is the first snapshot */
    const char *params = fl_net_flat_params(net);
    be->copy(ls->snapshot, params, (size_t)ls->numel * es, FL_COPY_D2D, NULL);
    for (int i = 0, j = 0; i < np; i++) {
        fl_param *p = fl_net_param(net, i);
        if (!p->trainable)
            continue;
        fl_param *s = &ls->snap[j++];
        int n = snprintf(s->name, sizeof s->name, "localsgd.snapshot.%s", p->name);
        if (n < 0 || (size_t)n >= sizeof s->name) {
            rc = fl_fail(FL_EINVAL, "%s: the parameter name '%s' is too long for its snapshot's "
                                    "name (at most %zu characters)",
                         key(ls), p->name, sizeof s->name - 1 - strlen("localsgd.snapshot."));
            goto fail;
        }
        ptrdiff_t off = ((const char *)p->value.data - params) / (ptrdiff_t)es;
        FL_ASSERT(off >= 0 && off + p->value.numel <= ls->numel); /* trainable values first */
        fl_tensor_view(&s->value, t, p->value.ndim, p->value.shape,
                       (char *)ls->snapshot + (size_t)off * es);
        s->value.device = fl_backend_device(be); /* checkpoints copy it through the host */
        s->trainable = false;
    }
    int64_t two = 2;
    snprintf(ls->counters.name, sizeof ls->counters.name, "localsgd.counters");
    fl_tensor_view(&ls->counters.value, FL_DTYPE_I64, 1, &two, ls->counter_mem);
    snprintf(ls->rule.name, sizeof ls->rule.name, "localsgd.adaptive");
    fl_tensor_view(&ls->rule.value, FL_DTYPE_F64, 1, &two, ls->rule_mem);
    FL_DEBUG("strategy localsgd: %s, begin_step %lld, %s %lld, %lld values per average "
             "(%lld of them buffers)",
             ls->adaptive ? "adaptive" : "fixed interval", (long long)ls->begin_step,
             ls->adaptive ? "init_k_steps" : "k_steps", (long long)K(ls), (long long)ls->count,
             (long long)(ls->count - ls->numel));
    d->impl = ls;
    return FL_OK;
fail:
    free_state(ls);
    return rc;
}

/* p = s - p over n values, through the backend (-p, then + 1 s: the same rounding as s - p) */
static void from_snapshot(const fl_backend *be, fl_dtype t, int64_t n, const void *s, void *p) {
    be->scale(t, n, -1.0, p);
    be->axpy(t, n, 1.0, s, p);
}

/* The average: one allreduce of the differences from the snapshot (and of the buffers' values).
 * A failed allreduce leaves the parameters undefined; the communicator is broken then anyway. */
static int average(fl_dist_optim *d, localsgd *ls, int64_t step) {
    fl_dtype t = fl_net_dtype(d->net);
    const fl_backend *be = fl_net_backend(d->net);
    void *p = fl_net_flat_params(d->net);
    size_t es = fl_dtype_size(t);
    if (d->world > 1) {
        from_snapshot(be, t, ls->numel, ls->snapshot, p);
        /* staged: a device-to-host copy and back on a GPU backend, nothing on the CPU */
        void *wire = fl_backend_stage_buf(be, p, ls->host);
        fl_backend_stage_out(be, p, wire, (size_t)ls->count * es, NULL);
        int rc = fl_comm_allreduce(d->comm, wire, (size_t)ls->count, t, FL_REDOP_AVG);
        if (rc < 0)
            return fl_fail_prefix(rc, "%s: averaging the parameters at step %lld", key(ls),
                                  (long long)step);
        fl_backend_stage_in(be, p, wire, (size_t)ls->count * es, NULL);
        from_snapshot(be, t, ls->numel, ls->snapshot, p);
    }
    be->copy(ls->snapshot, p, (size_t)ls->numel * es, FL_COPY_D2D, NULL);
    LAST_SYNC(ls) = step;
    return FL_OK;
}

/* This update's loss averaged over the ranks (a collective: only at averaging steps). */
static int mean_loss(fl_dist_optim *d, localsgd *ls, int64_t step, double *out) {
    double v = d->loss;
    if (d->world > 1) {
        int rc = fl_comm_allreduce(d->comm, &v, 1, FL_DTYPE_F64, FL_REDOP_AVG);
        if (rc < 0)
            return fl_fail_prefix(rc, "%s: averaging the loss of step %lld", key(ls),
                                  (long long)step);
    }
    *out = v;
    return FL_OK;
}

static int update(fl_dist_optim *d, double lr) {
    localsgd *ls = d->impl;
    int64_t step = DIST_STEP(d) + 1; /* Paddle's step counter starts at 1 */
    if (ls->adaptive && !isfinite(d->loss))
        return fl_fail(FL_ESTATE, "strategy.adaptive_localsgd: no loss for update %lld: call "
                                  "fl_dist_set_loss before each fl_dist_minimize (the interval "
                                  "follows the loss)",
                       (long long)DIST_STEP(d));
    /* the local step: this worker's own gradients, nothing sent */
    if (d->grad_scale != 1.0) /* gradient merge with avg */
        fl_net_backend(d->net)->scale(fl_net_dtype(d->net), ls->numel, d->grad_scale,
                                      fl_net_flat_grads(d->net));
    FL_TRY(fl_optim_step(d->opt, lr, NULL));
    if (ls->adaptive) {
        if (step == 1)
            FL_TRY(mean_loss(d, ls, step, &LOSS0(ls)));
        LR0(ls) = fl_localsgd_rule_lr0(LR0(ls), lr); /* the same rates on every rank */
    }
    if (!fl_localsgd_rule_due(step, ls->begin_step, LAST_SYNC(ls), K(ls)))
        return FL_OK;
    FL_TRY(average(d, ls, step));
    if (ls->adaptive && step > ls->begin_step) {
        double loss;
        FL_TRY(mean_loss(d, ls, step, &loss));
        K(ls) = ls->adacomm
                    ? fl_localsgd_rule_next_k_adacomm(LR0(ls), LOSS0(ls), lr, loss, ls->init_k)
                    : fl_localsgd_rule_next_k(LR0(ls), LOSS0(ls), lr, loss, ls->init_k);
        FL_DEBUG("strategy localsgd: step %lld: loss %g, lr %g: next average in %lld steps",
                 (long long)step, loss, lr, (long long)K(ls));
    }
    return FL_OK;
}

static void abandon(fl_dist_optim *d) {
    (void)d; /* nothing started during backward */
}

static void destroy(fl_dist_optim *d) {
    free_state(d->impl);
    d->impl = NULL;
}

static void stats(const fl_dist_optim *d, fl_dist_stats *out) {
    const localsgd *ls = d->impl;
    out->interval = K(ls);
}

static int num_state(const fl_dist_optim *d) {
    const localsgd *ls = d->impl;
    return ls->nsnap + 2;
}

static fl_param *state(fl_dist_optim *d, int i) {
    localsgd *ls = d->impl;
    if (i >= 0 && i < ls->nsnap)
        return &ls->snap[i];
    if (i == ls->nsnap)
        return &ls->counters;
    if (i == ls->nsnap + 1)
        return &ls->rule;
    return NULL;
}

const struct strategy_ops fl_localsgd_ops = {
    .name = "localsgd",
    .setup = setup,
    .grad_ready = NULL, /* nothing to overlap: gradients are not sent */
    .update = update,
    .abandon = abandon,
    .destroy = destroy,
    .num_state = num_state,
    .state = state,
    .stats = stats,
};
