/* dgc.c - the Deep Gradient Compression strategy's exchange (Lin et al. 2018, arXiv:1712.01887,
 * as Paddle's DGCMomentumOptimizer does it): dense Momentum before rampup_begin_step (the dense
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
 * dgc_math.c; the plan, the buffers and the checkpointable state (u, v per rank) in
 * dgc_plan.c. The arrays the kernels work on are the backend's memory; what the communicator
 * sends and receives is host memory: on a device the pairs, the small tensors' gradients and
 * the dense fallback's v travel through host copies (on the CPU backends those are the arrays
 * themselves). A little over 600 lines: the hooks and update share one step's state and
 * order (begin_sparse_step .. sparse_apply), which reads best in one file. */
#include "dgc_plan.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void destroy(fl_dist_optim *d) {
    dgc *g = d->impl;
    if (!g)
        return;
    wait_launched(g);
    dgc_plan_free(fl_net_backend(d->net), g);
    d->impl = NULL;
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
                                         dgc_budget(d)));
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
        g->ready[c] = false;
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
                                                           d->world, k, sp, dgc_budget(d));
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
                1e3 * dgc_exchange_seconds(DGC_EXCHANGE_ALLGATHER, d->world, k, dgc_budget(d)),
                1e3 * dgc_exchange_seconds(DGC_EXCHANGE_SPARSE, d->world, k, dgc_budget(d)));
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

/* Group j's local work (dgc_plan.h's selection groups): prepare's, for every tensor of the
 * group in one batched call (one wait for the device, the pairs copied back in one piece),
 * then padded on the host as prepare pads them. Exact selection, and one-tensor groups, go
 * tensor by tensor. */
static void prepare_group(fl_dist_optim *d, dgc *g, int j, double gscale) {
    const fl_backend *be = fl_net_backend(d->net);
    int lo = g->group_lo[j], hi = g->group_lo[j + 1];
    if (hi - lo == 1 || d->s.dgc_configs.selection) {
        for (int c = hi - 1; c >= lo; c--)
            if (!g->prepared[c])
                prepare(d, g, c, gscale);
        return;
    }
    dgc_accum_args acc = accum_args(d, gscale);
    bool mask = d->s.dgc_configs.momentum_masking && acc.correction && !g->xsparse;
    for (int c = lo; c < hi; c++) {
        ctensor *t = &g->ct[c];
        if (g->hint_k[c] != g->kk[c]) /* last step's k-th value says nothing about another k */
            g->hint[c] = 0, g->hint_k[c] = g->kk[c];
        g->items[c - lo] = (fl_dgc_batch_item){
            .n = t->p->value.numel, .k = g->kk[c], .base = g->start[c], .grad = g->gseg[c],
            .w = g->wseg[c], .u = t->u.value.data, .v = t->v.value.data,
            .pairs = g->send + g->soff[c], .seed = (uint64_t)g->step * 1000003u + (uint64_t)c,
            .hint = &g->hint[c]};
    }
    fl_backend_dgc_batch(be, hi - lo, g->items, &acc, mask, g->gcount, g->idx, g->scratch);
    dgc_pair *out = send_wire(d, g);
    fl_backend_stage_out(be, g->send + g->soff[lo], out + g->soff[lo],
                         (size_t)(g->soff[hi] - g->soff[lo]) * sizeof *out, NULL);
    for (int c = lo; c < hi; c++) {
        int64_t cnt = g->gcount[c - lo];
        g->cnt[c] = cnt;
        g->pairs += cnt;
        for (int64_t q = cnt; q < g->kk[c]; q++)
            out[g->soff[c] + q] = (dgc_pair){.index = (int32_t)g->start[c], .value = 0.0f};
        g->prepared[c] = true;
    }
}

/* Whether every gradient of tensor c's group is final. */
static bool group_ready(const dgc *g, int c) {
    int j = g->group_of[c];
    for (int q = g->group_lo[j]; q < g->group_lo[j + 1]; q++)
        if (!g->ready[q])
            return false;
    return true;
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
    g->ready[c] = true;
    if (rc == FL_OK && g->early && !g->prepared[c] && group_ready(g, c)) {
        prepare_group(d, g, g->group_of[c], d->grad_scale);
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
    for (int j = g->ngroups - 1; j >= 0; j--)
        if (!g->prepared[g->group_lo[j]])
            prepare_group(d, g, j, gscale);
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
                                      dgc_budget(d) * k, g->oidx, g->oval, &got, g->xkept);
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
    .setup = dgc_plan_setup,
    .grad_ready = grad_ready,
    .update = update,
    .abandon = abandon,
    .destroy = destroy,
    .num_state = dgc_plan_num_state,
    .state = dgc_plan_state,
    .merge = dgc_plan_merge,
    .stats = stats,
};
