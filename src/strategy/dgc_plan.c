/* dgc_plan.c - the Deep Gradient Compression strategy's plan and state (dgc_plan.h): which
 * tensors are compressed and which stay dense, the per-parameter tables (one block), the
 * buffers of the kernels (the backend's memory) and of comm (the host's), and u and v of each
 * compressed tensor as named, checkpointable state. The exchange that uses them is dgc.c's. */
#include "dgc_plan.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VEL_PREFIX "opt.velocity."

void dgc_plan_free(const fl_backend *be, dgc *g) {
    if (!g)
        return;
    fl_dense_state_free(g->dense);
    be->free(g->ublock);
    be->free(g->vblock);
    fl_free_aligned(g->hv);
    be->free(g->dstage);
    fl_free_aligned(g->hdstage);
    be->free(g->scratch);
    be->free(g->idx);
    be->free(g->send);
    be->free(g->recv);
    be->free(g->kidx);
    fl_free_aligned(g->hsend);
    fl_free_aligned(g->hrecv);
    fl_free_aligned(g->xidx);
    fl_free_aligned(g->xval);
    fl_free_aligned(g->xkept);
    fl_free_aligned(g->oidx);
    fl_free_aligned(g->oval);
    free(g->tables);
    free(g);
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

/* The most pairs a rank sends in one step: k at the lowest sparsity that runs sparse. */
static int64_t plan_send_cap(const fl_dist_optim *d, const dgc *g) {
    const fl_cfg_double_list *sl = &d->s.dgc_configs.sparsity;
    double smin = 2;
    for (int i = 0; i < sl->n; i++)
        if (!d->s.dgc_configs.dense_fallback ||
            dgc_sparse_pays(d->world, sl->v[i], (dgc_exchange)d->s.dgc_configs.exchange,
                            dgc_budget(d)))
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

/* n entries of size bytes at the next max-aligned offset of a block; with base NULL it only
 * measures (returns NULL). */
static void *carve(char *base, size_t *off, size_t n, size_t size) {
    size_t a = alignof(max_align_t), at = (*off + a - 1) / a * a;
    *off = at + n * size;
    return base ? base + at : NULL;
}

/* Points g's per-parameter tables into base (nps entries each, or nps + 1; xcounts nnode);
 * returns the bytes they take (base NULL: measures only). */
static size_t carve_tables(dgc *g, char *base, size_t nps, size_t nnode) {
    size_t off = 0;
    g->ct = carve(base, &off, nps, sizeof *g->ct);
    g->start = carve(base, &off, nps + 1, sizeof *g->start);
    g->gseg = carve(base, &off, nps, sizeof *g->gseg);
    g->wseg = carve(base, &off, nps, sizeof *g->wseg);
    g->vseg = carve(base, &off, nps, sizeof *g->vseg);
    g->dp = carve(base, &off, nps, sizeof *g->dp);
    g->dvel = carve(base, &off, nps, sizeof *g->dvel);
    g->vel_of = carve(base, &off, nps, sizeof *g->vel_of);
    g->ct_of = carve(base, &off, nps, sizeof *g->ct_of);
    g->kk = carve(base, &off, nps, sizeof *g->kk);
    g->cnt = carve(base, &off, nps, sizeof *g->cnt);
    g->soff = carve(base, &off, nps + 1, sizeof *g->soff);
    g->prepared = carve(base, &off, nps, sizeof *g->prepared);
    g->req = carve(base, &off, nps, sizeof *g->req);
    g->xreq = carve(base, &off, nps, sizeof *g->xreq);
    g->xcounts = carve(base, &off, nnode, sizeof *g->xcounts);
    g->hint = carve(base, &off, nps, sizeof *g->hint);
    g->hint_k = carve(base, &off, nps, sizeof *g->hint_k);
    g->group_of = carve(base, &off, nps, sizeof *g->group_of);
    g->group_lo = carve(base, &off, nps + 1, sizeof *g->group_lo);
    g->ready = carve(base, &off, nps, sizeof *g->ready);
    g->items = carve(base, &off, nps, sizeof *g->items);
    g->gcount = carve(base, &off, nps, sizeof *g->gcount);
    return off;
}

/* Which tensors are compressed (Paddle: 16384 elements or more) and which stay dense, in
 * parameter order; *max_numel: the largest compressed one. */
static int plan_tensors(fl_dist_optim *d, dgc *g, int64_t *max_numel) {
    int np = fl_net_num_params(d->net);
    *max_numel = 0;
    for (int i = 0; i < np; i++) {
        fl_param *p = fl_net_param(d->net, i);
        g->ct_of[i] = -1;
        if (!p->trainable || !p->grad.data)
            continue;
        if (p->value.numel >= d->s.dgc_configs.min_compress_numel) {
            g->ct_of[i] = g->nct;
            g->start[g->nct + 1] = g->start[g->nct] + p->value.numel;
            g->gseg[g->nct] = p->grad.data;
            g->wseg[g->nct] = p->value.data;
            g->ct[g->nct].vel = g->vel_of[i];
            g->ct[g->nct++].p = p;
            *max_numel = p->value.numel > *max_numel ? p->value.numel : *max_numel;
        } else {
            g->dvel[g->ndp] = g->vel_of[i];
            g->dp[g->ndp++] = p;
            g->dnumel += p->value.numel;
        }
    }
    g->cnumel = g->start[g->nct];
    if (g->cnumel > INT32_MAX)
        return fl_fail(FL_EUNSUPPORTED, "strategy.dgc: %lld compressed values exceed the %d an "
                                        "int32 index holds (raise dgc_configs.min_compress_numel "
                                        "or use the dense strategy)",
                       (long long)g->cnumel, INT32_MAX);
    return FL_OK;
}

/* The kernels' arrays in the backend's memory (zero-filled), comm's in the host's: on a
 * device, host copies of what travels. */
static int alloc_buffers(fl_dist_optim *d, dgc *g, int64_t max_numel) {
    int rc = FL_OK;
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
    int64_t recv_cap = g->send_cap * (d->world > dgc_budget(d) ? d->world : dgc_budget(d));
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
    if (d->s.dgc_configs.exchange != DGC_EXCHANGE_ALLGATHER && d->world > 1) {
        size_t cap = (size_t)g->send_cap, keep = (size_t)dgc_budget(d) * cap;
        g->xidx = alloc_or_fail(NULL, cap * sizeof(int32_t), &rc, "the sparse exchange");
        g->xval = alloc_or_fail(NULL, cap * sizeof(float), &rc, "the sparse exchange");
        g->xkept = alloc_or_fail(NULL, cap, &rc, "the sparse exchange");
        g->oidx = alloc_or_fail(NULL, keep * sizeof(int32_t), &rc, "the sparse exchange");
        g->oval = alloc_or_fail(NULL, keep * sizeof(float), &rc, "the sparse exchange");
        g->kidx = alloc_or_fail(be, cap * sizeof(int32_t), &rc, "the sparse exchange");
    }
    return rc;
}

/* Selection groups (dgc_plan.h): runs of tensors of at least DGC_GROUP_VALUES values, cut
 * from the last tensor down (backward produces them in that order), the first group closing
 * with tensor 0; on the host one tensor a group. */
static void plan_groups(dgc *g, bool host) {
    int j = 0;
    int64_t acc = 0;
    for (int c = g->nct - 1; c >= 0; c--) { /* group numbers in backward's order, for now */
        g->group_of[c] = j;
        acc += g->ct[c].p->value.numel;
        if (host || acc >= DGC_GROUP_VALUES || c == 0)
            j++, acc = 0;
    }
    g->ngroups = j;
    for (int c = 0; c < g->nct; c++) /* renumbered so that group numbers ascend with c */
        g->group_of[c] = j - 1 - g->group_of[c];
    for (int c = g->nct - 1; c >= 0; c--)
        g->group_lo[g->group_of[c]] = c;
    g->group_lo[g->ngroups] = g->nct;
}

/* One line that says the plan: what is compressed, the schedule, the exchange. */
static void say_plan(const fl_dist_optim *d, const dgc *g) {
    const fl_strategy *s = &d->s;
    char sched[256], budget_note[48] = "", groups[64] = "";
    if (g->ngroups < g->nct)
        snprintf(groups, sizeof groups, "; selection in %d batched groups", g->ngroups);
    int off = 0;
    if (s->dgc_configs.exchange != DGC_EXCHANGE_ALLGATHER)
        snprintf(budget_note, sizeof budget_note, " (sparse allreduce keeps up to %d k)",
                 dgc_budget(d));
    for (int i = 0; i < s->dgc_configs.sparsity.n && off < (int)sizeof sched - 16; i++)
        off += snprintf(sched + off, sizeof sched - (size_t)off, "%s%g", i ? ", " : "",
                        s->dgc_configs.sparsity.v[i]);
    FL_INFO("strategy dgc: %d tensors (%lld values) compressed, %d (%lld values) dense (< %lld "
            "elements); dense until step %lld, then sparsity [%s] over %lld steps%s; %s top-k; "
            "exchange %s%s%s",
            g->nct, (long long)g->cnumel, g->ndp, (long long)g->dnumel,
            (long long)s->dgc_configs.min_compress_numel,
            (long long)s->dgc_configs.rampup_begin_step, sched,
            (long long)s->dgc_configs.rampup_step, s->dgc_configs.warmup ? "" : " (warm-up off)",
            s->dgc_configs.selection ? "exact" : "sampled", exchange_name(s->dgc_configs.exchange),
            budget_note, groups);
}

int dgc_plan_setup(fl_dist_optim *d) {
    int rc = FL_OK;
    dgc *g = calloc(1, sizeof *g);
    if (!g)
        return fl_fail(FL_ENOMEM, "strategy.dgc: out of memory");
    d->impl = g;
    g->said = -1;
    g->said_exchange = -1;
    g->step = -1;
    if (fl_net_dtype(d->net) != FL_DTYPE_F32) {
        rc = fl_fail(FL_EUNSUPPORTED, "strategy.dgc: needs an f32 network (this one computes in "
                                      "%s)",
                     fl_dtype_name(fl_net_dtype(d->net)));
        goto fail;
    }
    if ((rc = fl_dense_state_create(d, &g->dense)) < 0)
        goto fail;
    int np = fl_net_num_params(d->net);
    size_t nps = (size_t)(np ? np : 1), nnode = d->node ? (size_t)fl_comm_size(d->node) : 1;
    if (!(g->tables = calloc(1, carve_tables(g, NULL, nps, nnode)))) {
        rc = fl_fail(FL_ENOMEM, "strategy.dgc: out of memory planning %d parameters", np);
        goto fail;
    }
    carve_tables(g, g->tables, nps, nnode);
    int64_t max_numel;
    if ((rc = find_velocities(d, g)) < 0 || (rc = plan_tensors(d, g, &max_numel)) < 0 ||
        (rc = alloc_buffers(d, g, max_numel)) < 0)
        goto fail;
    for (int c = 0; c < g->nct; c++)
        g->vseg[c] = g->vblock + g->start[c];
    plan_groups(g, fl_net_backend(d->net)->host_memory);
    for (int c = 0; c < g->nct; c++) {
        ctensor *t = &g->ct[c];
        if ((rc = name_state(&t->u, "u", t->p, g->ublock + g->start[c])) < 0 ||
            (rc = name_state(&t->v, "v", t->p, g->vblock + g->start[c])) < 0)
            goto fail;
    }
    say_plan(d, g);
    return FL_OK;
fail:
    dgc_plan_free(fl_net_backend(d->net), g);
    d->impl = NULL;
    return rc;
}

int dgc_plan_num_state(const fl_dist_optim *d) {
    const dgc *g = d->impl;
    return 2 * g->nct;
}

fl_param *dgc_plan_state(fl_dist_optim *d, int i) {
    dgc *g = d->impl;
    if (i < 0 || i >= 2 * g->nct)
        return NULL;
    return i % 2 ? &g->ct[i / 2].v : &g->ct[i / 2].u;
}

/* u and v of the old workers are summed: v's sum over the workers is the update still owed
 * (each entry leaves v only when it is sent), u's the momentum behind it (docs/elastic.md) */
fl_state_merge dgc_plan_merge(const fl_dist_optim *d, int i) { return FL_STATE_SUM; }
