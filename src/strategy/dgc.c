/* dgc.c - the Deep Gradient Compression strategy (Lin et al. 2018, arXiv:1712.01887, as
 * Paddle's DGCMomentumOptimizer does it): dense Momentum before rampup_begin_step (the dense
 * strategy's buckets); then every tensor of at least min_compress_numel elements accumulates
 * its momentum-corrected gradient locally and sends only the top (1 - s) of it as (index,
 * value) pairs, while the small tensors are averaged with one allreduce and stepped by
 * Momentum. Each compressed tensor is accumulated, selected and sent from the gradient-ready
 * hook as soon as backward has produced its gradient (one allgather per tensor: k is the same
 * on every rank, so no counts travel), so its exchange overlaps the rest of backward. Or, with
 * dgc_configs.exchange sparse (or auto where it is estimated cheaper: many workers), the
 * hooks only prepare, and one sparse allreduce of every tensor's pairs runs in update: each
 * worker receives at most ~5 k pairs whatever N, and the pairs its global threshold drops go
 * back into the accumulators (docs/dgc.md "Beyond 128 workers"). The arithmetic is in
 * dgc_math.c; this file plans buffers, talks to the communicator and keeps the state (u, v per
 * rank) checkpointable. The arrays the kernels work on are the backend's memory; what the
 * communicator sends and receives is host memory: on a device the pairs, the small tensors'
 * gradients and the dense fallback's v travel through host copies (on the CPU backends those
 * are the arrays themselves). */
#include "dgc_math.h"
#include "strategy_impl.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VEL_PREFIX "opt.velocity."

typedef struct {
    fl_param *p;    /* borrowed: the network's parameter */
    fl_param *vel;  /* borrowed: its optimizer velocity */
    fl_param  u, v; /* "dgc.u.<name>" (momentum), "dgc.v.<name>" (accumulator): views */
} ctensor;

typedef struct {
    dense_state *dense;  /* the dense phase before rampup_begin_step */
    ctensor     *ct;     /* (nct) compressed tensors, in parameter order */
    int          nct;
    int64_t     *start;  /* (nct + 1) their ranges in the compressed index space */
    float      **gseg;   /* (nct) their gradients: the scatter-add target */
    float      **wseg;   /* (nct) their values */
    float      **vseg;   /* (nct) their accumulators: where the sparse exchange's dropped pairs
                          * return */
    int64_t      cnumel; /* compressed elements */
    float       *ublock, *vblock; /* (cnumel) the state's memory, u and v of every tensor */
    float       *hv;     /* (cnumel) host copy of vblock for the dense fallback's allreduce */
    fl_param   **dp;     /* (ndp) trainable tensors that stay dense */
    fl_param   **dvel;   /* (ndp) their optimizer velocities (borrowed from the optimizer) */
    int          ndp;
    int64_t      dnumel;
    float       *dstage;  /* (dnumel) their gradients packed for one allreduce */
    float       *hdstage; /* (dnumel) its host copy, for comm */
    fl_param   **vel_of;  /* (nparams) optimizer velocity of each parameter, or NULL */
    float       *scratch; /* selection: largest tensor + its sample */
    int32_t     *idx;     /* selection: largest tensor */
    int         *ct_of;   /* (nparams) compressed tensor of each parameter, or -1 */
    dgc_pair    *send;    /* (send_cap) this rank's pairs: tensor c's kk[c] at soff[c] */
    dgc_pair    *recv;    /* (max(world, budget) * send_cap) allgather: every rank's,
                           * tensor c's at world * soff[c]; sparse: the kept sums */
    dgc_pair    *hsend, *hrecv; /* host copies of send and recv, for comm (and the padding) */
    int32_t     *kidx;    /* (send_cap) the sparse exchange's kept indices, whose u is masked */
    int64_t      send_cap;
    double       said;     /* sparsity whose dense fallback was last logged; -1: none */
    int          said_exchange; /* the exchange last logged; -1: none */
    int64_t      pairs, dropped; /* pairs given to the exchange, dropped by its threshold */
    /* the sparse exchange (host memory): this rank's pairs in index order, the kept sums, the
     * kept flags */
    int32_t     *xidx;    /* host memory, as xval, xkept, oidx and oval */
    float       *xval;
    uint8_t     *xkept;
    int32_t     *oidx; /* (budget * send_cap) the kept sums */
    float       *oval;
    /* the sparse step in flight, begun by the first hook or by update */
    int64_t      step;     /* the update these describe; -1: none */
    bool         early;    /* tensors are prepared by the hook (not with local clipping) */
    bool         avg_early; /* hierarchical: the hook starts each tensor's node average */
    bool         xsparse;  /* this step's pairs go through the sparse allreduce */
    int64_t     *kk;       /* (nct) pairs every rank sends for each tensor in this step */
    int64_t     *cnt;      /* (nct) of which this rank's real ones (the rest: zero padding) */
    int64_t     *soff;     /* (nct + 1) where they start in send */
    bool        *prepared; /* (nct) accumulated, selected and encoded */
    fl_request **req;      /* (nct) each tensor's allgather in flight, or NULL */
    fl_request **xreq;     /* (nct) hierarchical: each tensor's node average, then its
                            * allgather between nodes */
    size_t      *xcounts;  /* (node size) hierarchical: the node allgatherv's counts */
    int          launched; /* tensors launched, in launch order: the last (c = nct - 1) first */
    float       *hint;     /* (nct) each tensor's k-th largest |v| at its last selection, or 0 */
    int64_t     *hint_k;   /* (nct) the k it was for (a new k starts without one) */
    int          error;    /* first failure of the hook in this step */
    char         errmsg[512];
} dgc;

static void wait_launched(dgc *g);

static void destroy(fl_dist_optim *d) {
    dgc *g = d->impl;
    if (!g)
        return;
    const fl_backend *be = fl_net_backend(d->net);
    wait_launched(g);
    fl_dense_state_free(g->dense);
    free(g->ct);
    free(g->start);
    free(g->gseg);
    free(g->wseg);
    free(g->vseg);
    be->free(g->ublock);
    be->free(g->vblock);
    fl_free_aligned(g->hv);
    free(g->dp);
    free(g->dvel);
    be->free(g->dstage);
    fl_free_aligned(g->hdstage);
    free(g->vel_of);
    be->free(g->scratch);
    be->free(g->idx);
    be->free(g->send);
    be->free(g->recv);
    be->free(g->kidx);
    fl_free_aligned(g->hsend);
    fl_free_aligned(g->hrecv);
    free(g->ct_of);
    free(g->kk);
    free(g->cnt);
    free(g->soff);
    fl_free_aligned(g->xidx);
    fl_free_aligned(g->xval);
    fl_free_aligned(g->xkept);
    fl_free_aligned(g->oidx);
    fl_free_aligned(g->oval);
    free(g->prepared);
    free(g->req);
    free(g->xreq);
    free(g->xcounts);
    free(g->hint);
    free(g->hint_k);
    free(g);
    d->impl = NULL;
}

/* The optimizer's velocity of each trainable parameter, by name ("opt.velocity.<name>"). */
static int find_velocities(fl_dist_optim *d, dgc *g) {
    int np = fl_net_num_params(d->net), nv = fl_optim_num_state(d->opt);
    for (int i = 0; i < np; i++) {
        fl_param *p = fl_net_param(d->net, i);
        if (!p->trainable)
            continue;
        for (int j = 0; j < nv && !g->vel_of[i]; j++) {
            fl_param *v = fl_optim_state(d->opt, j);
            if (strncmp(v->name, VEL_PREFIX, strlen(VEL_PREFIX)) == 0 &&
                strcmp(v->name + strlen(VEL_PREFIX), p->name) == 0)
                g->vel_of[i] = v;
        }
        if (!g->vel_of[i])
            return fl_fail(FL_ESTATE, "strategy.dgc: the optimizer has no velocity for '%s' (is "
                                      "it the network's Momentum optimizer?)",
                           p->name);
    }
    return FL_OK;
}

/* bytes of host memory (be NULL) or of be's memory */
static void *alloc_or_fail(const fl_backend *be, size_t bytes, int *rc, const char *what) {
    void *p = be ? be->alloc(bytes) : fl_alloc_aligned(bytes ? bytes : 1);
    if (!p && *rc == FL_OK)
        *rc = fl_fail(FL_ENOMEM, "strategy.dgc: cannot allocate %zu bytes for %s", bytes, what);
    return p;
}

/* dgc_configs.sparse_budget: the sparse allreduce keeps at most budget * k summed pairs. */
static int budget(const fl_dist_optim *d) {
    return (int)d->s.dgc_configs.sparse_budget;
}

/* The most pairs a rank sends in one step: k at the lowest sparsity that runs sparse. */
static int64_t plan_send_cap(const fl_dist_optim *d, const dgc *g) {
    const fl_cfg_double_list *sl = &d->s.dgc_configs.sparsity;
    double smin = 2;
    for (int i = 0; i < sl->n; i++)
        if (!d->s.dgc_configs.dense_fallback ||
            dgc_sparse_pays(d->world, sl->v[i], (dgc_exchange)d->s.dgc_configs.exchange,
                            budget(d)))
            smin = sl->v[i] < smin ? sl->v[i] : smin;
    if (smin > 1)
        return 0; /* every step falls back to dense */
    int64_t cap = 0;
    for (int c = 0; c < g->nct; c++)
        cap += dgc_k(g->ct[c].p->value.numel, smin);
    return cap;
}

static int name_state(fl_param *st, const char *what, const fl_param *p, float *mem) {
    int len = snprintf(st->name, sizeof st->name, "dgc.%s.%s", what, p->name);
    if (len < 0 || (size_t)len >= sizeof st->name)
        return fl_fail(FL_EINVAL, "strategy.dgc: state name 'dgc.%s.%s' is longer than %zu "
                                  "characters",
                       what, p->name, sizeof st->name - 1);
    fl_tensor_view(&st->value, FL_DTYPE_F32, p->value.ndim, p->value.shape, mem);
    st->value.device = p->value.device; /* the network's backend's memory, as p */
    fl_tensor_view(&st->grad, FL_DTYPE_F32, p->value.ndim, p->value.shape, NULL);
    st->trainable = false;
    return FL_OK;
}

static const char *exchange_name(int e) {
    return e == DGC_EXCHANGE_SPARSE ? "sparse" : e == DGC_EXCHANGE_ALLGATHER ? "allgather" : "auto";
}

static int setup(fl_dist_optim *d) {
    int rc = FL_OK;
    const fl_strategy *s = &d->s;
    dgc *g = calloc(1, sizeof *g);
    if (!g)
        return fl_fail(FL_ENOMEM, "strategy.dgc: out of memory");
    d->impl = g;
    g->said = -1;
    g->said_exchange = -1;
    if (fl_net_dtype(d->net) != FL_DTYPE_F32) {
        rc = fl_fail(FL_EUNSUPPORTED, "strategy.dgc: needs an f32 network (this one computes in "
                                      "%s)",
                     fl_dtype_name(fl_net_dtype(d->net)));
        goto fail;
    }
    if ((rc = fl_dense_state_create(d, &g->dense)) < 0)
        goto fail;
    int np = fl_net_num_params(d->net);
    size_t nps = (size_t)(np ? np : 1);
    g->vel_of = calloc(nps, sizeof *g->vel_of);
    g->ct = calloc(nps, sizeof *g->ct);
    g->start = calloc(nps + 1, sizeof *g->start);
    g->gseg = calloc(nps, sizeof *g->gseg);
    g->wseg = calloc(nps, sizeof *g->wseg);
    g->vseg = calloc(nps, sizeof *g->vseg);
    g->dp = calloc(nps, sizeof *g->dp);
    g->dvel = calloc(nps, sizeof *g->dvel);
    g->ct_of = malloc(nps * sizeof *g->ct_of);
    g->kk = calloc(nps, sizeof *g->kk);
    g->cnt = calloc(nps, sizeof *g->cnt);
    g->soff = calloc(nps + 1, sizeof *g->soff);
    g->prepared = calloc(nps, sizeof *g->prepared);
    g->req = calloc(nps, sizeof *g->req);
    g->xreq = calloc(nps, sizeof *g->xreq);
    g->xcounts = calloc(d->node ? (size_t)fl_comm_size(d->node) : 1, sizeof *g->xcounts);
    g->hint = calloc(nps, sizeof *g->hint);
    g->hint_k = calloc(nps, sizeof *g->hint_k);
    g->step = -1;
    if (!g->vel_of || !g->ct || !g->start || !g->gseg || !g->wseg || !g->vseg || !g->dp ||
        !g->dvel ||
        !g->ct_of || !g->kk || !g->cnt || !g->soff || !g->prepared || !g->req || !g->hint || !g->xreq || !g->xcounts ||
        !g->hint_k) {
        rc = fl_fail(FL_ENOMEM, "strategy.dgc: out of memory planning %d parameters", np);
        goto fail;
    }
    if ((rc = find_velocities(d, g)) < 0)
        goto fail;

    /* which tensors are compressed (Paddle: 16384 elements or more), which stay dense */
    int64_t max_numel = 0;
    for (int i = 0; i < np; i++) {
        fl_param *p = fl_net_param(d->net, i);
        g->ct_of[i] = -1;
        if (!p->trainable || !p->grad.data)
            continue;
        if (p->value.numel >= s->dgc_configs.min_compress_numel) {
            g->ct_of[i] = g->nct;
            g->start[g->nct + 1] = g->start[g->nct] + p->value.numel;
            g->gseg[g->nct] = p->grad.data;
            g->wseg[g->nct] = p->value.data;
            g->ct[g->nct].vel = g->vel_of[i];
            g->ct[g->nct++].p = p;
            max_numel = p->value.numel > max_numel ? p->value.numel : max_numel;
        } else {
            g->dvel[g->ndp] = g->vel_of[i];
            g->dp[g->ndp++] = p;
            g->dnumel += p->value.numel;
        }
    }
    g->cnumel = g->start[g->nct];
    if (g->cnumel > INT32_MAX) {
        rc = fl_fail(FL_EUNSUPPORTED, "strategy.dgc: %lld compressed values exceed the %d an "
                                      "int32 index holds (raise dgc_configs.min_compress_numel "
                                      "or use the dense strategy)",
                     (long long)g->cnumel, INT32_MAX);
        goto fail;
    }
    /* the kernels' arrays in the backend's memory (zero-filled), comm's in the host's: on a
     * device, host copies of what travels */
    const fl_backend *be = fl_net_backend(d->net);
    bool dev = !be->host_memory;
    size_t cbytes = (size_t)g->cnumel * sizeof(float), dbytes = (size_t)g->dnumel * sizeof(float);
    g->ublock = alloc_or_fail(be, cbytes, &rc, "the momentum u");
    g->vblock = alloc_or_fail(be, cbytes, &rc, "the accumulator v");
    g->dstage = alloc_or_fail(be, dbytes, &rc, "the dense gradients");
    int64_t sample = max_numel / 100 > 4096 ? max_numel / 100 : 4096;
    g->scratch = alloc_or_fail(be, (size_t)(max_numel + sample) * sizeof(float), &rc,
                               "selection");
    g->idx = alloc_or_fail(be, (size_t)max_numel * sizeof(int32_t), &rc, "selection");
    g->send_cap = plan_send_cap(d, g);
    size_t send_bytes = (size_t)g->send_cap * sizeof(dgc_pair);
    g->send = alloc_or_fail(be, send_bytes, &rc, "the pairs sent");
    int64_t recv_cap = g->send_cap * (d->world > budget(d) ? d->world : budget(d));
    size_t recv_bytes = (size_t)recv_cap * sizeof(dgc_pair);
    g->recv = alloc_or_fail(be, recv_bytes, &rc, "the pairs received");
    if (dev) {
        g->hsend = alloc_or_fail(NULL, send_bytes, &rc, "the pairs sent");
        g->hrecv = alloc_or_fail(NULL, recv_bytes, &rc, "the pairs received");
        if (d->world > 1) {
            g->hdstage = alloc_or_fail(NULL, dbytes, &rc, "the dense gradients");
            g->hv = alloc_or_fail(NULL, cbytes, &rc, "the dense fallback");
        }
    }
    if (s->dgc_configs.exchange != DGC_EXCHANGE_ALLGATHER && d->world > 1) {
        size_t cap = (size_t)g->send_cap, keep = (size_t)budget(d) * cap;
        g->xidx = alloc_or_fail(NULL, cap * sizeof(int32_t), &rc, "the sparse exchange");
        g->xval = alloc_or_fail(NULL, cap * sizeof(float), &rc, "the sparse exchange");
        g->xkept = alloc_or_fail(NULL, cap, &rc, "the sparse exchange");
        g->oidx = alloc_or_fail(NULL, keep * sizeof(int32_t), &rc, "the sparse exchange");
        g->oval = alloc_or_fail(NULL, keep * sizeof(float), &rc, "the sparse exchange");
        g->kidx = alloc_or_fail(be, cap * sizeof(int32_t), &rc, "the sparse exchange");
    }
    if (rc < 0)
        goto fail;
    for (int c = 0; c < g->nct; c++)
        g->vseg[c] = g->vblock + g->start[c];
    for (int c = 0; c < g->nct; c++) {
        ctensor *t = &g->ct[c];
        if ((rc = name_state(&t->u, "u", t->p, g->ublock + g->start[c])) < 0 ||
            (rc = name_state(&t->v, "v", t->p, g->vblock + g->start[c])) < 0)
            goto fail;
    }
    char sched[256], budget_note[48] = "";
    int off = 0;
    if (s->dgc_configs.exchange != DGC_EXCHANGE_ALLGATHER)
        snprintf(budget_note, sizeof budget_note, " (sparse allreduce keeps up to %d k)",
                 budget(d));
    for (int i = 0; i < s->dgc_configs.sparsity.n && off < (int)sizeof sched - 16; i++)
        off += snprintf(sched + off, sizeof sched - (size_t)off, "%s%g", i ? ", " : "",
                        s->dgc_configs.sparsity.v[i]);
    FL_INFO("strategy dgc: %d tensors (%lld values) compressed, %d (%lld values) dense (< %lld "
            "elements); dense until step %lld, then sparsity [%s] over %lld steps%s; %s top-k; "
            "exchange %s%s",
            g->nct, (long long)g->cnumel, g->ndp, (long long)g->dnumel,
            (long long)s->dgc_configs.min_compress_numel,
            (long long)s->dgc_configs.rampup_begin_step, sched,
            (long long)s->dgc_configs.rampup_step, s->dgc_configs.warmup ? "" : " (warm-up off)",
            s->dgc_configs.selection ? "exact" : "sampled", exchange_name(s->dgc_configs.exchange),
            budget_note);
    return FL_OK;
fail:
    destroy(d);
    return rc;
}

static void keep_error(dgc *g, int rc) {
    if (g->error)
        return;
    g->error = rc;
    snprintf(g->errmsg, sizeof g->errmsg, "%s", fl_errmsg());
}

/* Waits for every tensor's exchange in flight (after a failure: their results are dropped). */
static void wait_launched(dgc *g) {
    if (!g->req)
        return;
    for (int c = 0; c < g->nct; c++) {
        fl_request_wait(g->xreq[c]);
        fl_request_wait(g->req[c]);
        g->req[c] = g->xreq[c] = NULL;
    }
    g->launched = 0;
}

/* Hierarchical DGC (docs/dgc.md): with use_hierarchical_allreduce and several nodes of several
 * ranks, the compressed tensors' gradients are averaged inside the node first, so that u and v
 * are the node's (the same on each of its ranks), and the nodes exchange pairs: the "workers"
 * of DGC's exchange are the nodes. */
static bool hierarchical(const fl_dist_optim *d) {
    return d->node && fl_comm_size(d->node) > 1 && fl_comm_size(d->cross) > 1;
}

/* How many parties exchange pairs: the nodes, or the workers. */
static int exchange_world(const fl_dist_optim *d) {
    return hierarchical(d) ? fl_comm_size(d->cross) : d->world;
}

/* The dense phase ends: each rank's u starts from the common velocity, so that the sum of the
 * ranks' u over N is the dense Momentum's velocity and training goes on without a jump. */
static void start_compression(const fl_backend *be, dgc *g) {
    for (int c = 0; c < g->nct; c++)
        be->copy(g->ct[c].u.value.data, g->ct[c].vel->value.data,
                 (size_t)g->ct[c].p->value.numel * sizeof(float), FL_COPY_D2D, NULL);
}

/* Where comm reads the pairs sent and writes those received: send and recv themselves on the
 * CPU backends, else their host copies. */
static dgc_pair *send_wire(const fl_dist_optim *d, const dgc *g) {
    return fl_backend_stage_buf(fl_net_backend(d->net), g->send, g->hsend);
}
static dgc_pair *recv_wire(const fl_dist_optim *d, const dgc *g) {
    return fl_backend_stage_buf(fl_net_backend(d->net), g->recv, g->hrecv);
}

/* The sparsity of update `step` (-1: the dense phase before rampup_begin_step). */
static double sparsity_of(const fl_dist_optim *d, int64_t step) {
    const fl_strategy *s = &d->s;
    return dgc_sparsity_at(step, s->dgc_configs.rampup_begin_step, s->dgc_configs.rampup_step,
                           s->dgc_configs.sparsity.v, s->dgc_configs.sparsity.n,
                           s->dgc_configs.warmup);
}

/* Whether update `step` at sparsity sp exchanges pairs (else: dense, or the dense fallback). */
static bool sparse_step(const fl_dist_optim *d, double sp) {
    return sp >= 0 && !(d->s.dgc_configs.dense_fallback &&
                        !dgc_sparse_pays(exchange_world(d), sp,
                                         hierarchical(d) ? DGC_EXCHANGE_ALLGATHER
                                                         : (dgc_exchange)d->s.dgc_configs.exchange,
                                         budget(d)));
}

static bool local_clipping(const fl_dist_optim *d) {
    return fl_optim_get_config(d->opt)->clip_norm > 0 && d->s.dgc_configs.local_clipping;
}

/* Plans the sparse step `step` once (from the first hook or from update): k and the place of
 * each tensor's pairs; the first compressed step copies the velocity into u. */
static int begin_sparse_step(fl_dist_optim *d, dgc *g, int64_t step, double sp) {
    if (g->step == step)
        return FL_OK;
    g->step = step;
    /* clipping needs the norm of every gradient first; the hierarchical step the node's
     * average of every gradient */
    g->early = !local_clipping(d) && !hierarchical(d);
    /* the node's average overlaps backward where nothing must see every gradient first and
     * no gradient-merge scale is pending (the scale would follow the average: other bits) */
    g->avg_early = hierarchical(d) && !local_clipping(d) && d->grad_scale == 1.0;
    for (int c = 0; c < g->nct; c++) {
        g->kk[c] = dgc_k(g->ct[c].p->value.numel, sp);
        g->soff[c + 1] = g->soff[c] + g->kk[c];
        g->prepared[c] = false;
    }
    g->launched = 0;
    if (step == d->s.dgc_configs.rampup_begin_step)
        start_compression(fl_net_backend(d->net), g);
    if (g->soff[g->nct] > g->send_cap) /* a sparsity outside the planned schedule */
        return fl_fail(FL_ESTATE, "strategy dgc: step %lld: %lld pairs exceed the %lld planned",
                       (long long)step, (long long)g->soff[g->nct], (long long)g->send_cap);
    int64_t k = g->soff[g->nct];
    dgc_exchange e = hierarchical(d) ? DGC_EXCHANGE_ALLGATHER
                                     : dgc_choose_exchange((dgc_exchange)d->s.dgc_configs.exchange,
                                                           d->world, k, sp, budget(d));
    g->xsparse = e == DGC_EXCHANGE_SPARSE;
    if (hierarchical(d) && g->said_exchange != (int)e) {
        FL_INFO("strategy dgc: step %lld: %lld pairs per node, hierarchical: %d nodes of %d "
                "workers, each worker sends 1/%d of its node's pairs to the other nodes",
                (long long)step, (long long)k, fl_comm_size(d->cross), fl_comm_size(d->node),
                fl_comm_size(d->node));
        g->said_exchange = (int)e;
    } else if (d->world > 1 && g->said_exchange != (int)e) {
        FL_INFO("strategy dgc: step %lld: %lld pairs per worker, %d workers: exchange by %s "
                "(estimate at 1 Gbit/s: allgather %.2f ms, sparse allreduce %.2f ms)",
                (long long)step, (long long)k, d->world,
                g->xsparse ? "sparse allreduce" : "allgather",
                1e3 * dgc_exchange_seconds(DGC_EXCHANGE_ALLGATHER, d->world, k, budget(d)),
                1e3 * dgc_exchange_seconds(DGC_EXCHANGE_SPARSE, d->world, k, budget(d)));
        g->said_exchange = (int)e;
    }
    return FL_OK;
}

/* The accumulation's arguments for this job's options, the gradient times gscale. */
static dgc_accum_args accum_args(const fl_dist_optim *d, double gscale) {
    const fl_optim_config *oc = fl_optim_get_config(d->opt);
    return (dgc_accum_args){
        .clip_scale = gscale,
        .decay = d->s.dgc_configs.weight_decay_correction ? oc->weight_decay : 0,
        .momentum = oc->momentum, .nesterov = oc->nesterov,
        .correction = d->s.dgc_configs.momentum_correction};
}

/* Tensor c's local work: accumulate (gradient times gscale, weight-decay correction, momentum
 * correction), select its top kk[c], encode them into its place in send (masking u and v) and
 * pad with zero-valued pairs, which change nothing, when v has fewer than kk[c] nonzeros. */
static void prepare(fl_dist_optim *d, dgc *g, int c, double gscale) {
    const fl_backend *be = fl_net_backend(d->net);
    const fl_strategy *s = &d->s;
    dgc_accum_args acc = accum_args(d, gscale);
    ctensor *t = &g->ct[c];
    int64_t n = t->p->value.numel, kk = g->kk[c], cnt;
    float *v = t->v.value.data, *u = t->u.value.data;
    if (s->dgc_configs.selection) {
        be->dgc_accumulate(n, g->gseg[c], g->wseg[c], u, v, &acc);
        cnt = be->dgc_select_exact(n, v, kk, g->idx, g->scratch);
    } else { /* accumulation and candidate gathering in one pass */
        if (g->hint_k[c] != kk) /* last step's k-th value says nothing about another k */
            g->hint[c] = 0, g->hint_k[c] = kk;
        cnt = be->dgc_accumulate_select(n, g->gseg[c], g->wseg[c], u, v, &acc, kk, g->idx, g->scratch,
                                    (uint64_t)g->step * 1000003u + (uint64_t)c, &g->hint[c],
                                    NULL);
    }
    bool mask = s->dgc_configs.momentum_masking && acc.correction;
    /* the sparse exchange masks u only where its pair is kept (dgc_settle_split) */
    be->dgc_encode(g->idx, cnt, g->start[c], v, mask && !g->xsparse ? u : NULL,
                   g->send + g->soff[c]);
    /* the pairs where comm reads them (copied back from a device), padded there */
    dgc_pair *out = send_wire(d, g) + g->soff[c];
    fl_backend_stage_out(be, g->send + g->soff[c], out, (size_t)cnt * sizeof *out, NULL);
    g->cnt[c] = cnt;
    g->pairs += cnt;
    for (int64_t j = cnt; j < kk; j++)
        out[j] = (dgc_pair){.index = (int32_t)g->start[c], .value = 0.0f};
    g->prepared[c] = true;
}

/* Tensor c's pairs between nodes: the node's kk pairs (the same on each of its L ranks) are cut
 * into L pieces; local rank l allgathers piece l with the other nodes (M pieces received, so
 * the node's link carries kk (M - 1) pairs in all, 1/L of them per rank), then the node
 * allgathers the pieces: every rank holds the M nodes' kk pairs, piece by piece. */
static int launch_hierarchical(fl_dist_optim *d, dgc *g, int c) {
    int L = fl_comm_size(d->node), M = fl_comm_size(d->cross), l = fl_comm_rank(d->node);
    int64_t kk = g->kk[c];
    dgc_pair *in = send_wire(d, g) + g->soff[c], *out = recv_wire(d, g) + M * g->soff[c];
    int64_t off = 0, mine = 0;
    for (int q = 0; q < L; q++) {
        int64_t len = kk / L + (q < kk % L ? 1 : 0);
        if (q == l)
            mine = off;
        g->xcounts[q] = (size_t)(M * len * 2);
        off += len;
    }
    int64_t len = kk / L + (l < kk % L ? 1 : 0);
    int rc = fl_comm_iallgather(d->cross, in + mine, out + M * mine, (size_t)len * 2,
                                FL_DTYPE_I32, &g->xreq[c]);
    if (rc == FL_OK)
        rc = fl_comm_iallgatherv(d->node, out + M * mine, out, g->xcounts, FL_DTYPE_I32,
                                 &g->req[c]);
    if (rc < 0)
        return fl_fail_prefix(rc, "strategy dgc: step %lld: hierarchical allgather of %s's %lld "
                                  "pairs", (long long)g->step, g->ct[c].p->name, (long long)kk);
    return FL_OK;
}

/* Starts tensor c's node average (hierarchical DGC) in place: on a device through its host
 * staging in hv. */
static int start_node_average(fl_dist_optim *d, dgc *g, int c) {
    const fl_backend *be = fl_net_backend(d->net);
    size_t n = (size_t)g->ct[c].p->value.numel;
    float *wire = fl_backend_stage_buf(be, g->gseg[c], g->hv ? g->hv + g->start[c] : NULL);
    fl_backend_stage_out(be, g->gseg[c], wire, n * sizeof(float), NULL);
    int rc = fl_comm_iallreduce(d->node, wire, n, FL_DTYPE_F32, FL_REDOP_AVG, &g->xreq[c]);
    if (rc < 0) {
        g->xreq[c] = NULL;
        return fl_fail_prefix(rc, "strategy dgc: step %lld: the node's average of %s",
                              (long long)DIST_STEP(d), g->ct[c].p->name);
    }
    return FL_OK;
}

/* The node's average of the compressed tensors' gradients (hierarchical DGC), in place: the
 * averages the hooks started (g->avg_early, in backward's order, the same on every rank), then
 * the others in tensor order; all waited for. */
static int node_average(fl_dist_optim *d, dgc *g) {
    const fl_backend *be = fl_net_backend(d->net);
    int rc = FL_OK;
    for (int c = 0; c < g->nct && rc == FL_OK; c++)
        if (!g->xreq[c])
            rc = start_node_average(d, g, c);
    char msg[512] = "";
    if (rc < 0)
        snprintf(msg, sizeof msg, "%s", fl_errmsg());
    for (int c = 0; c < g->nct; c++) {
        int rc1 = fl_request_wait(g->xreq[c]);
        g->xreq[c] = NULL;
        if (rc1 < 0 && rc == FL_OK) {
            rc = rc1;
            snprintf(msg, sizeof msg, "%s", fl_errmsg());
        }
        if (rc == FL_OK) {
            size_t n = (size_t)g->ct[c].p->value.numel;
            float *wire = fl_backend_stage_buf(be, g->gseg[c], g->hv ? g->hv + g->start[c] : NULL);
            fl_backend_stage_in(be, g->gseg[c], wire, n * sizeof(float), NULL);
        }
    }
    if (rc < 0)
        return fl_fail(rc, "strategy dgc: step %lld: the node's average of the gradients: %s",
                       (long long)DIST_STEP(d), msg);
    return FL_OK;
}

/* Starts the exchange of prepared tensors in launch order only (the last tensor first, as
 * backward produces them): every rank issues the same collectives in the same order. */
static int launch_ready(fl_dist_optim *d, dgc *g) {
    if (g->xsparse)
        return FL_OK; /* one sparse allreduce of them all, in update */
    while (g->launched < g->nct) {
        int c = g->nct - 1 - g->launched;
        if (!g->prepared[c])
            break;
        int64_t kk = g->kk[c];
        if (hierarchical(d)) {
            FL_TRY(launch_hierarchical(d, g, c));
            g->launched++;
            continue;
        }
        dgc_pair *in = send_wire(d, g) + g->soff[c], *out = recv_wire(d, g) + d->world * g->soff[c];
        if (d->world == 1) {
            memcpy(out, in, (size_t)kk * sizeof *in);
        } else if (kk > 0) {
            int rc = fl_comm_iallgather(d->comm, in, out, (size_t)kk * 2, FL_DTYPE_I32,
                                        &g->req[c]);
            if (rc < 0) {
                g->req[c] = NULL;
                return fl_fail_prefix(rc, "strategy dgc: step %lld: allgather of %s's %lld pairs",
                                      (long long)g->step, g->ct[c].p->name, (long long)kk);
            }
        }
        g->launched++;
    }
    return FL_OK;
}

static void grad_ready(void *ctx, fl_param *p) {
    fl_dist_optim *d = ctx;
    dgc *g = d->impl;
    int64_t step = DIST_STEP(d);
    double sp = sparsity_of(d, step);
    if (sp < 0) {
        fl_dense_state_grad_ready(d, g->dense, p);
        return;
    }
    ptrdiff_t i = p - fl_net_param(d->net, 0);
    FL_ASSERT(i >= 0 && i < fl_net_num_params(d->net));
    int c = g->ct_of[i];
    if (c < 0 || g->error || !sparse_step(d, sp))
        return;
    int rc = begin_sparse_step(d, g, step, sp);
    if (rc == FL_OK && g->avg_early && !g->xreq[c])
        rc = start_node_average(d, g, c);
    if (rc == FL_OK && g->early && !g->prepared[c]) {
        prepare(d, g, c, d->grad_scale);
        rc = launch_ready(d, g);
    }
    if (rc < 0)
        keep_error(g, rc);
}

static void abandon(fl_dist_optim *d) {
    dgc *g = d->impl;
    fl_dense_state_abandon(d, g->dense);
    wait_launched(g);
    g->step = -1;
    g->error = 0;
}

/* The small tensors' gradients packed into dstage (or unpacked from it), on the backend. */
static void dense_pack(const fl_backend *be, dgc *g, bool unpack) {
    int64_t off = 0;
    for (int i = 0; i < g->ndp; i++) {
        fl_param *p = g->dp[i];
        size_t bytes = (size_t)p->value.numel * sizeof(float);
        if (unpack)
            be->copy(p->grad.data, g->dstage + off, bytes, FL_COPY_D2D, NULL);
        else
            be->copy(g->dstage + off, p->grad.data, bytes, FL_COPY_D2D, NULL);
        off += p->value.numel;
    }
}

/* The dense fallback's compressed tensors: every entry would be sent, so one dense allreduce
 * of v (accumulated as usual) is cheaper and exact. */
static int fallback_step(fl_dist_optim *d, dgc *g, double sp, double lr) {
    const fl_backend *be = fl_net_backend(d->net);
    const fl_optim_config *oc = fl_optim_get_config(d->opt);
    const bool corr = d->s.dgc_configs.momentum_correction;
    const bool wdc = d->s.dgc_configs.weight_decay_correction;
    dgc_accum_args acc = accum_args(d, 1.0);
    int64_t step = DIST_STEP(d);
    for (int c = 0; c < g->nct; c++)
        be->dgc_accumulate(g->ct[c].p->value.numel, g->gseg[c], g->wseg[c], g->ct[c].u.value.data,
                       g->ct[c].v.value.data, &acc);
    if (g->said != sp) {
        FL_INFO("strategy dgc: step %lld: sparsity %g with %d workers: N * (1 - s) * 2 = %g >= 1, "
                "a sparse allgather would send more than a dense allreduce; steps at this "
                "sparsity use dense allreduce",
                (long long)step, sp, d->world, d->world * (1 - sp) * 2);
        g->said = sp;
    }
    if (d->world > 1 && g->cnumel > 0) {
        size_t bytes = (size_t)g->cnumel * sizeof(float);
        float *wire = fl_backend_stage_buf(be, g->vblock, g->hv);
        fl_backend_stage_out(be, g->vblock, wire, bytes, NULL);
        int rc = fl_comm_allreduce(d->comm, wire, (size_t)g->cnumel, FL_DTYPE_F32, FL_REDOP_AVG);
        if (rc < 0)
            return fl_fail_prefix(rc, "strategy dgc: step %lld: dense fallback allreduce of %lld "
                                      "values",
                                  (long long)step, (long long)g->cnumel);
        fl_backend_stage_in(be, g->vblock, wire, bytes, NULL);
    }
    for (int c = 0; c < g->nct; c++)
        be->dgc_apply_dense(g->ct[c].p->value.numel, g->wseg[c], g->ct[c].v.value.data,
                        corr ? NULL : g->ct[c].u.value.data, lr, 1.0, oc->momentum, oc->nesterov,
                        wdc ? 0 : oc->weight_decay);
    return FL_OK;
}

/* The rest of the sparse step's sending: what the hooks did not prepare (overlap off, local
 * clipping), then every exchange not yet started. */
static int sparse_launch_rest(fl_dist_optim *d, dgc *g, double gscale) {
    for (int j = 0; j < g->nct; j++) {
        int c = g->nct - 1 - j;
        if (!g->prepared[c])
            prepare(d, g, c, gscale);
    }
    return launch_ready(d, g);
}

static int cmp_pair_index(const void *a, const void *b) {
    const dgc_pair *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

/* The sparse allreduce of this rank's real pairs (the padding left out), tensor by tensor in
 * index order; the kept sums land in recv's wire as pairs (*total of them), this rank's
 * dropped pairs go back into v and its kept ones are masked in u. Collective. */
static int exchange_sparse(fl_dist_optim *d, dgc *g, int64_t *total) {
    const fl_backend *be = fl_net_backend(d->net);
    int64_t m = 0, k = g->soff[g->nct], got = 0;
    for (int c = 0; c < g->nct; c++) {
        dgc_pair *p = send_wire(d, g) + g->soff[c];
        qsort(p, (size_t)g->cnt[c], sizeof *p, cmp_pair_index);
        for (int64_t j = 0; j < g->cnt[c]; j++, m++) {
            g->xidx[m] = p[j].index;
            g->xval[m] = p[j].value;
        }
    }
    int rc = fl_comm_sparse_allreduce(d->comm, g->cnumel, g->xidx, g->xval, m,
                                      budget(d) * k, g->oidx, g->oval, &got, g->xkept);
    if (rc < 0)
        return fl_fail_prefix(rc, "strategy dgc: step %lld: sparse allreduce of %lld pairs",
                              (long long)g->step, (long long)m);
    bool mask = d->s.dgc_configs.momentum_masking && d->s.dgc_configs.momentum_correction;
    /* sorted on the host, applied by the backend: the dropped pairs (into send's wire, whose
     * pairs are spent) are added back to v, then u is masked at the kept indices (the encode
     * zeroes them; its pairs, a by-product, go to send, now free on the device too) */
    dgc_pair *back = send_wire(d, g);
    int32_t *masked = fl_backend_stage_buf(be, g->kidx, g->xidx);
    int64_t nmasked, nback;
    dgc_settle_split(m, g->xidx, g->xval, g->xkept, mask, masked, &nmasked, back, &nback);
    fl_backend_stage_in(be, g->send, back, (size_t)nback * sizeof *back, NULL);
    fl_backend_stage_in(be, g->kidx, masked, (size_t)nmasked * sizeof *masked, NULL);
    if (nback > 0)
        be->dgc_scatter_add(g->send, nback, g->nct, g->start, g->vseg);
    if (nmasked > 0)
        be->dgc_encode(g->kidx, nmasked, 0, g->ublock, NULL, g->send);
    g->dropped += nback;
    dgc_pair *recv = recv_wire(d, g);
    for (int64_t i = 0; i < got; i++)
        recv[i] = (dgc_pair){.index = g->oidx[i], .value = g->oval[i]};
    *total = got;
    return FL_OK;
}

/* The sparse step's end: every rank's pairs received, checked and applied. */
static int sparse_apply(fl_dist_optim *d, dgc *g, double lr) {
    const fl_backend *be = fl_net_backend(d->net);
    const fl_optim_config *oc = fl_optim_get_config(d->opt);
    const bool corr = d->s.dgc_configs.momentum_correction;
    const bool wdc = d->s.dgc_configs.weight_decay_correction;
    int64_t step = DIST_STEP(d);
    int rc = FL_OK;
    char msg[512]; /* the first failure's message: later waits overwrite fl_errmsg */
    for (int c = g->nct - 1; c >= 0; c--) {
        int rc0 = fl_request_wait(g->xreq[c]);
        int rc1 = fl_request_wait(g->req[c]);
        g->req[c] = g->xreq[c] = NULL;
        if (rc0 < 0)
            rc1 = rc0;
        if (rc1 < 0 && rc == FL_OK) {
            rc = fl_fail_prefix(rc1, "strategy dgc: step %lld: allgather of %s's pairs",
                                (long long)step, g->ct[c].p->name);
            snprintf(msg, sizeof msg, "%s", fl_errmsg());
        }
    }
    g->launched = 0;
    if (rc < 0)
        return fl_fail(rc, "%s", msg);
    const int xw = exchange_world(d);
    int64_t total = xw * g->soff[g->nct];
    if (g->xsparse)
        FL_TRY(exchange_sparse(d, g, &total));
    const dgc_pair *recv = recv_wire(d, g); /* checked on the host, then moved to the device */
    int64_t bad = dgc_check_pairs(recv, total, g->cnumel);
    if (bad >= 0 && g->xsparse)
        return fl_fail(FL_EPEER, "strategy dgc: step %lld: the sparse allreduce returned index %d "
                                 "outside the %lld compressed values",
                       (long long)step, recv[bad].index, (long long)g->cnumel);
    if (bad >= 0 && hierarchical(d))
        return fl_fail(FL_EPEER, "strategy dgc: step %lld: a node sent index %d outside the "
                                 "%lld compressed values",
                       (long long)step, recv[bad].index, (long long)g->cnumel);
    if (bad >= 0) {
        int c = 0;
        while (c + 1 < g->nct && bad >= d->world * g->soff[c + 1])
            c++;
        int64_t r = (bad - d->world * g->soff[c]) / (g->kk[c] ? g->kk[c] : 1);
        return fl_fail(FL_EPEER, "strategy dgc: step %lld: rank %lld sent index %d outside the "
                                 "%lld compressed values",
                       (long long)step, (long long)r, recv[bad].index, (long long)g->cnumel);
    }
    fl_backend_stage_in(be, g->recv, recv, (size_t)total * sizeof *recv, NULL);
    if (corr && wdc) { /* the paper's step: the pairs, as plain SGD */
        be->dgc_apply_pairs(g->recv, total, g->nct, g->start, g->wseg, lr / (double)xw);
    } else { /* the ablations: a whole-tensor step on the aggregate */
        for (int c = 0; c < g->nct; c++)
            be->fill(FL_DTYPE_F32, g->gseg[c], g->ct[c].p->value.numel, 0.0);
        be->dgc_scatter_add(g->recv, total, g->nct, g->start, g->gseg);
        for (int c = 0; c < g->nct; c++)
            be->dgc_apply_dense(g->ct[c].p->value.numel, g->wseg[c], g->gseg[c],
                            corr ? NULL : g->ct[c].u.value.data, lr, 1.0 / xw,
                            oc->momentum, oc->nesterov, wdc ? 0 : oc->weight_decay);
    }
    return FL_OK;
}

static int update(fl_dist_optim *d, double lr) {
    dgc *g = d->impl;
    const fl_strategy *s = &d->s;
    const fl_optim_config *oc = fl_optim_get_config(d->opt);
    const fl_backend *k = fl_net_backend(d->net);
    int64_t step = DIST_STEP(d);
    double sp = sparsity_of(d, step);
    if (sp < 0) { /* warm-up's dense phase: the dense strategy */
        FL_TRY(fl_dense_state_finish(d, g->dense));
        return fl_optim_step(d->opt, lr, NULL);
    }
    int rc = g->error;
    if (rc < 0) { /* a hook failed: its message, after waiting for what it started */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", g->errmsg);
        abandon(d);
        return fl_fail(rc, "%s", msg);
    }
    if (!(lr >= 0) || !isfinite(lr)) {
        abandon(d);
        return fl_fail(FL_EINVAL, "strategy dgc: learning rate %g is not a finite number >= 0",
                       lr);
    }
    bool sparse = sparse_step(d, sp);
    if (sparse && (rc = begin_sparse_step(d, g, step, sp)) < 0) {
        abandon(d);
        return rc;
    }
    /* the local gradient: gradient merge's 1/k (for tensors the hooks prepared: inside their
     * accumulation), then local clipping at clip_norm / sqrt(N) */
    double gscale = d->grad_scale;
    if (!sparse || !g->early) {
        if (gscale != 1.0)
            k->scale(FL_DTYPE_F32, fl_net_numel(d->net), gscale, fl_net_flat_grads(d->net));
        gscale = 1.0;
        /* hierarchical: u and v are the node's, fed by the node's average (also in the dense
         * fallback's steps, so that they stay the same on every rank of the node) */
        if (hierarchical(d) && (rc = node_average(d, g)) < 0) {
            abandon(d);
            return rc;
        }
        if (local_clipping(d))
            fl_clip_grad_norm(k, FL_DTYPE_F32, fl_net_param(d->net, 0), fl_net_num_params(d->net),
                              dgc_local_clip_norm(oc->clip_norm, exchange_world(d)));
    } else if (gscale != 1.0) {
        for (int i = 0; i < g->ndp; i++)
            k->scale(FL_DTYPE_F32, g->dp[i]->value.numel, gscale, g->dp[i]->grad.data);
    }

    /* the compressed tensors' pairs go first, then the small tensors' average; the pairs are
     * applied while that travels */
    rc = sparse ? sparse_launch_rest(d, g, gscale) : FL_OK;
    fl_request *dreq = NULL;
    float *dwire = fl_backend_stage_buf(k, g->dstage, g->hdstage);
    size_t dbytes = (size_t)g->dnumel * sizeof(float);
    if (rc == FL_OK && d->world > 1 && g->dnumel > 0) {
        dense_pack(k, g, false);
        fl_backend_stage_out(k, g->dstage, dwire, dbytes, NULL);
        rc = fl_comm_iallreduce(d->comm, dwire, (size_t)g->dnumel, FL_DTYPE_F32, FL_REDOP_AVG,
                                &dreq);
        if (rc < 0) {
            dreq = NULL;
            rc = fl_fail_prefix(rc, "strategy dgc: step %lld: allreduce of the dense tensors",
                                (long long)step);
        }
    }
    if (rc == FL_OK && sparse) {
        rc = sparse_apply(d, g, lr);
    } else if (rc == FL_OK) {
        if (step == s->dgc_configs.rampup_begin_step)
            start_compression(k, g);
        rc = fallback_step(d, g, sp, lr);
    }
    char msg[512]; /* the first failure's message, before waiting overwrites it */
    if (rc < 0)
        snprintf(msg, sizeof msg, "%s", fl_errmsg());
    int rcd = fl_request_wait(dreq);
    if (rcd < 0 && rc == FL_OK) {
        rc = fl_fail_prefix(rcd, "strategy dgc: step %lld: allreduce of the dense tensors",
                            (long long)step);
        snprintf(msg, sizeof msg, "%s", fl_errmsg());
    }
    if (rc < 0) {
        abandon(d);
        return fl_fail(rc, "%s", msg);
    }
    g->step = -1;

    /* the small tensors: their average, then Momentum with the optimizer's velocity */
    if (d->world > 1 && g->dnumel > 0) {
        fl_backend_stage_in(k, g->dstage, dwire, dbytes, NULL);
        dense_pack(k, g, true);
    }
    for (int i = 0; i < g->ndp; i++)
        k->momentum_update(FL_DTYPE_F32, g->dp[i]->value.numel, g->dp[i]->value.data,
                           g->dp[i]->grad.data, g->dvel[i]->value.data, lr, oc->momentum,
                           oc->weight_decay, oc->nesterov);
    return FL_OK;
}

static int num_state(const fl_dist_optim *d) {
    const dgc *g = d->impl;
    return 2 * g->nct;
}

static fl_param *state(fl_dist_optim *d, int i) {
    dgc *g = d->impl;
    if (i < 0 || i >= 2 * g->nct)
        return NULL;
    return i % 2 ? &g->ct[i / 2].v : &g->ct[i / 2].u;
}

/* u and v of the old workers are summed: v's sum over the workers is the update still owed
 * (each entry leaves v only when it is sent), u's the momentum behind it (docs/elastic.md) */
static fl_state_merge merge(const fl_dist_optim *d, int i) { return FL_STATE_SUM; }

static void stats(const fl_dist_optim *d, fl_dist_stats *out) {
    const dgc *g = d->impl;
    if (DIST_STEP(d) == 0) {
        out->sparsity = 0;
        return;
    }
    double sp = sparsity_of(d, DIST_STEP(d) - 1); /* the last update's */
    out->sparsity = sparse_step(d, sp) ? sp : 0;
    out->pairs = g->pairs;
    out->dropped = g->dropped;
}

const struct strategy_ops fl_dgc_ops = {
    .name = "dgc",
    .setup = setup,
    .grad_ready = grad_ready,
    .update = update,
    .abandon = abandon,
    .destroy = destroy,
    .num_state = num_state,
    .state = state,
    .merge = merge,
    .stats = stats,
};
