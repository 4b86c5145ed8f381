/* dense.c - the dense strategy: gradients averaged with allreduce, fused into buckets planned in
 * reverse parameter order and started during backward as soon as each is complete (PyTorch
 * DDP's reducer: Li et al., "PyTorch Distributed", VLDB 2020, sec. 3.2.3). Backward finishes the
 * last parameters first, so the first bucket's allreduce overlaps the rest of backward; the flat
 * gradient block is in parameter order, so each bucket is one contiguous range, one iallreduce.
 *
 * On a device (a backend without host memory) a bucket travels through page-locked host memory:
 * when it is complete, its device-to-host copy is queued in a copy stream of its own, after an
 * event of the compute stream, and its allreduce is issued at once, gated on the copy (the comm
 * thread waits for the copy's event just before it sends). The training thread goes on queueing
 * backward; bucket i is sent while bucket i + 1 is copied. The results come back with
 * host-to-device copies in the compute stream, queued as each allreduce completes. */
#include "strategy_impl.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t     off, n;      /* range of the flat gradient block, in elements */
    int         first, last; /* parameter indices it spans (for messages) */
    int         nparams;     /* trainable parameters in it */
    int         ready;       /* of which final in the current backward */
    fl_request *req;         /* in flight; NULL otherwise */
    /* on a device: the compute stream's point where the bucket is final, and the copy
     * stream's where its host copy is; the comm thread waits for `staged` (bucket_staged) */
    fl_event          *computed, *staged;
    const fl_backend  *be;
} bucket;

struct dense_state {
    bucket   *buckets;     /* (nbuckets) in launch order: the last parameters first */
    int       nbuckets;
    int      *bucket_of;   /* (nparams) bucket of each parameter; -1 for buffers */
    int       launched;    /* buckets [0, launched) have started in the current step */
    int       error;       /* first failure of the current step */
    char      errmsg[512]; /* and its message (grad_ready cannot return it) */
    uint16_t *staging;     /* (numel) f16 gradients on the wire: fp16_allreduce only */
    /* (numel) host copies of the gradients for comm where the backend's memory is a device's,
     * page-locked (fl_backend_host_alloc); NULL on the CPU backends, whose gradients comm sends
     * in place */
    void     *host;
    fl_stream *copy;       /* on a device: the stream of the buckets' device-to-host copies */
    const fl_backend *be;  /* whose host memory, stream and events these are */
};
typedef struct dense_state dense;

static void keep_error(dense *ds, int rc) {
    if (ds->error)
        return;
    ds->error = rc;
    snprintf(ds->errmsg, sizeof ds->errmsg, "%s", fl_errmsg());
}

/* Walks the parameters last to first, closing a bucket when the next gradient would take it
 * past fuse_grad_size_in_MB (a larger parameter is a bucket alone; 0 gives one per parameter). */
static int plan(fl_dist_optim *d, dense *ds) {
    int np = fl_net_num_params(d->net);
    size_t es = fl_dtype_size(fl_net_dtype(d->net));
    const char *grads = fl_net_flat_grads(d->net);
    double cap = d->s.fuse_grad_size_in_MB * 1048576.0, bytes = 0;
    ds->bucket_of = malloc((size_t)(np ? np : 1) * sizeof *ds->bucket_of);
    ds->buckets = calloc((size_t)(np ? np : 1), sizeof *ds->buckets); /* at most one each */
    if (!ds->bucket_of || !ds->buckets)
        return fl_fail(FL_ENOMEM, "strategy dense: out of memory planning %d buckets", np);
    int nb = 0;
    for (int i = np - 1; i >= 0; i--) {
        fl_param *p = fl_net_param(d->net, i);
        ds->bucket_of[i] = -1;
        if (!p->trainable)
            continue;
        int64_t off = (int64_t)(((const char *)p->grad.data - grads) / (ptrdiff_t)es);
        double pbytes = (double)p->grad.numel * (double)es;
        if (nb == 0 || bytes + pbytes > cap) {
            ds->buckets[nb++] = (bucket){.off = off + p->grad.numel, .last = i};
            bytes = 0;
        }
        bucket *b = &ds->buckets[nb - 1];
        FL_ASSERT(off + p->grad.numel == b->off); /* the flat block is in parameter order */
        b->off = off;
        b->n += p->grad.numel;
        b->first = i;
        b->nparams++;
        bytes += pbytes;
        ds->bucket_of[i] = nb - 1;
    }
    ds->nbuckets = nb;
    FL_DEBUG("strategy dense: %d buckets of at most %g MiB over %lld gradients, overlap %s, %s "
             "allreduce",
             nb, d->s.fuse_grad_size_in_MB, (long long)fl_net_numel(d->net),
             d->s.overlap ? "on" : "off",
             d->s.fp16_allreduce ? "f16" : fl_dtype_name(fl_net_dtype(d->net)));
    for (int i = 0; i < nb; i++)
        FL_DEBUG("strategy dense: bucket %d: %s .. %s, %lld values", i,
                 fl_net_param(d->net, ds->buckets[i].first)->name,
                 fl_net_param(d->net, ds->buckets[i].last)->name, (long long)ds->buckets[i].n);
    return FL_OK;
}

void fl_dense_state_free(dense_state *ds) {
    if (!ds)
        return;
    if (ds->copy) /* its copies are done before their host memory goes */
        ds->be->stream_free(ds->copy);
    for (int i = 0; ds->be && ds->buckets && i < ds->nbuckets; i++) {
        ds->be->event_free(ds->buckets[i].computed);
        ds->be->event_free(ds->buckets[i].staged);
    }
    free(ds->buckets);
    free(ds->bucket_of);
    fl_free_aligned(ds->staging);
    fl_backend_host_free(ds->be, ds->host);
    free(ds);
}

/* The device-side state: page-locked host gradients, the copy stream, two events a bucket. */
static int stage_create(fl_dist_optim *d, dense *ds) {
    const fl_backend *be = ds->be;
    size_t bytes = (size_t)fl_net_numel(d->net) * fl_dtype_size(fl_net_dtype(d->net));
    if (!(ds->host = fl_backend_host_alloc(be, bytes)))
        return fl_fail_prefix(FL_ENOMEM, "strategy dense: %zu bytes of host gradients", bytes);
    if (d->s.fp16_allreduce) /* cast on the host: its copies wait where they are made */
        return FL_OK;
    ds->copy = be->stream_create();
    for (int i = 0; i < ds->nbuckets; i++) {
        bucket *b = &ds->buckets[i];
        b->be = be;
        b->computed = be->event_create();
        b->staged = be->event_create();
    }
    return FL_OK;
}

int fl_dense_state_create(fl_dist_optim *d, dense_state **out) {
    int rc;
    *out = NULL;
    dense *ds = calloc(1, sizeof *ds);
    if (!ds)
        return fl_fail(FL_ENOMEM, "strategy dense: out of memory");
    if (d->s.fp16_allreduce && fl_net_dtype(d->net) != FL_DTYPE_F32) {
        rc = fl_fail(FL_EUNSUPPORTED, "strategy.fp16_allreduce: needs an f32 network (this one "
                                      "computes in %s)",
                     fl_dtype_name(fl_net_dtype(d->net)));
        goto fail;
    }
    if ((rc = plan(d, ds)) < 0)
        goto fail;
    if (d->s.fp16_allreduce && d->world > 1) {
        int64_t numel = fl_net_numel(d->net);
        ds->staging = fl_alloc_aligned((size_t)(numel ? numel : 1) * sizeof *ds->staging);
        if (!ds->staging) {
            rc = fl_fail(FL_ENOMEM, "strategy.fp16_allreduce: cannot allocate %lld f16 gradients",
                         (long long)numel);
            goto fail;
        }
    }
    ds->be = fl_net_backend(d->net);
    if (!ds->be->host_memory && d->world > 1 && (rc = stage_create(d, ds)) < 0)
        goto fail;
    *out = ds;
    return FL_OK;
fail:
    fl_dense_state_free(ds);
    return rc;
}

static void *range_of(fl_dist_optim *d, const bucket *b) {
    return (char *)fl_net_flat_grads(d->net) + (size_t)b->off * fl_dtype_size(fl_net_dtype(d->net));
}

/* Where bucket b travels: its gradients themselves on a host-memory backend, else its part of
 * the host copy. */
static void *wire_of(fl_dist_optim *d, dense *ds, const bucket *b) {
    size_t es = fl_dtype_size(fl_net_dtype(d->net));
    return fl_backend_stage_buf(fl_net_backend(d->net), range_of(d, b),
                                ds->host ? (char *)ds->host + (size_t)b->off * es : NULL);
}

/* The comm thread, before it sends bucket arg: its host copy must have landed. */
static void bucket_staged(void *arg) {
    const bucket *b = arg;
    b->be->event_sync(b->staged);
}

static int launch(fl_dist_optim *d, dense *ds, bucket *b) {
    fl_dtype t = fl_net_dtype(d->net);
    void *g = range_of(d, b);
    int rc;
    if (d->s.fp16_allreduce) {
        /* divided by N (and k) in f32 before the cast, so that the f16 sum over N workers
         * overflows only where the average itself would; cast on the host (on a device, from
         * the host copy) */
        fl_net_backend(d->net)->scale(t, b->n, d->grad_scale / d->world, g);
        const float *hg = fl_backend_stage_out(fl_net_backend(d->net), g, wire_of(d, ds, b),
                                               (size_t)b->n * sizeof(float), NULL);
        fl_f32_to_f16_n(hg, ds->staging + b->off, (size_t)b->n);
        rc = fl_comm_iallreduce(d->comm, ds->staging + b->off, (size_t)b->n, FL_DTYPE_F16,
                                FL_REDOP_SUM, &b->req);
    } else if (ds->copy) {
        /* on a device: copied in the copy stream once the compute stream has made it; sent
         * when the copy has landed */
        const fl_backend *be = ds->be;
        void *wire = wire_of(d, ds, b);
        be->event_record(b->computed, NULL);
        be->event_wait(ds->copy, b->computed);
        be->copy(wire, g, (size_t)b->n * fl_dtype_size(t), FL_COPY_D2H, ds->copy);
        be->event_record(b->staged, ds->copy);
        rc = fl_comm_iallreduce_gated(d->comm, wire, (size_t)b->n, t, FL_REDOP_AVG,
                                      bucket_staged, b, &b->req);
    } else {
        rc = fl_comm_iallreduce(d->comm, g, (size_t)b->n, t, FL_REDOP_AVG, &b->req);
    }
    if (rc < 0)
        return fl_fail_prefix(rc, "strategy dense: allreduce of the bucket %s .. %s",
                              fl_net_param(d->net, b->first)->name,
                              fl_net_param(d->net, b->last)->name);
    return FL_OK;
}

/* Starts complete buckets, in bucket order only: every rank issues the same collectives in the
 * same order, whatever order the hooks came in. */
static int launch_ready(fl_dist_optim *d, dense *ds) {
    while (ds->launched < ds->nbuckets) {
        bucket *b = &ds->buckets[ds->launched];
        if (b->ready < b->nparams)
            break;
        FL_TRY(launch(d, ds, b));
        ds->launched++;
    }
    return FL_OK;
}

void fl_dense_state_grad_ready(fl_dist_optim *d, dense_state *ds, fl_param *p) {
    if (d->world == 1 || ds->error)
        return;
    ptrdiff_t i = p - fl_net_param(d->net, 0);
    FL_ASSERT(i >= 0 && i < fl_net_num_params(d->net));
    int b = ds->bucket_of[i];
    if (b < 0)
        return;
    ds->buckets[b].ready++;
    int rc = launch_ready(d, ds);
    if (rc < 0)
        keep_error(ds, rc);
}

/* Waits for every started bucket; with keep, unpacks each result into the gradients (on a
 * device: a host-to-device copy in the compute stream, queued as each bucket completes, so
 * the first buckets' copies run while the host waits for the last ones). */
static void complete(fl_dist_optim *d, dense *ds, bool keep) {
    for (int i = 0; i < ds->launched; i++) {
        bucket *b = &ds->buckets[i];
        int rc = fl_request_wait(b->req);
        b->req = NULL;
        if (rc < 0) {
            keep_error(ds, fl_fail_prefix(rc, "strategy dense: allreduce of the bucket %s .. %s",
                                          fl_net_param(d->net, b->first)->name,
                                          fl_net_param(d->net, b->last)->name));
            keep = false;
        }
        if (!keep || ds->error)
            continue;
        void *g = range_of(d, b), *wire = wire_of(d, ds, b);
        if (d->s.fp16_allreduce)
            fl_f16_to_f32_n(ds->staging + b->off, wire, (size_t)b->n);
        fl_backend_stage_in(fl_net_backend(d->net), g, wire,
                            (size_t)b->n * fl_dtype_size(fl_net_dtype(d->net)), NULL);
        if (!d->s.fp16_allreduce && d->grad_scale != 1.0)
            fl_net_backend(d->net)->scale(fl_net_dtype(d->net), b->n, d->grad_scale, g);
    }
    for (int i = 0; i < ds->nbuckets; i++)
        ds->buckets[i].ready = 0;
    ds->launched = 0;
}

int fl_dense_state_finish(fl_dist_optim *d, dense_state *ds) {
    if (d->world == 1) { /* nothing to average with; only gradient merge's 1/k */
        if (d->grad_scale != 1.0)
            fl_net_backend(d->net)->scale(fl_net_dtype(d->net), fl_net_numel(d->net),
                                          d->grad_scale, fl_net_flat_grads(d->net));
        return FL_OK;
    }
    /* overlap off (or buckets the hooks did not complete): start the rest now, in order */
    if (!ds->error) {
        for (int i = ds->launched; i < ds->nbuckets; i++)
            ds->buckets[i].ready = ds->buckets[i].nparams;
        int rc = launch_ready(d, ds);
        if (rc < 0)
            keep_error(ds, rc);
    }
    complete(d, ds, true);
    int rc = ds->error;
    ds->error = 0;
    if (rc < 0)
        return fl_fail(rc, "%s", ds->errmsg);
    return FL_OK;
}

void fl_dense_state_abandon(fl_dist_optim *d, dense_state *ds) {
    complete(d, ds, false);
    ds->error = 0;
}

/* --- the dense strategy: the state above, then the optimizer --- */

static int setup(fl_dist_optim *d) {
    dense_state *ds = NULL;
    FL_TRY(fl_dense_state_create(d, &ds));
    d->impl = ds;
    return FL_OK;
}

static void grad_ready(void *ctx, fl_param *p) {
    fl_dist_optim *d = ctx;
    fl_dense_state_grad_ready(d, d->impl, p);
}

static int update(fl_dist_optim *d, double lr) {
    FL_TRY(fl_dense_state_finish(d, d->impl));
    return fl_optim_step(d->opt, lr, NULL);
}

static void abandon(fl_dist_optim *d) {
    fl_dense_state_abandon(d, d->impl);
}

static void destroy(fl_dist_optim *d) {
    fl_dense_state_free(d->impl);
    d->impl = NULL;
}

const struct strategy_ops fl_dense_ops = {
    .name = "dense",
    .setup = setup,
    .grad_ready = grad_ready,
    .grad_ready_undoable = true, /* it only starts allreduces */
    .update = update,
    .abandon = abandon,
    .destroy = destroy,
};
