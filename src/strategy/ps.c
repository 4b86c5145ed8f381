/* ps.c - the distributed optimizer's parameter-server strategy: the worker's side of sync,
 * async and geo training (docs/ps.md). The network's trainable block is dense table 0 on the
 * servers, which run the optimizer; the worker pushes gradients and pulls parameters through
 * the client of include/fleet/ps.h.
 *   sync:  push this update's gradients, then pull version step + 1, which the servers make
 *          once every worker has pushed (the same computation as dense allreduce + step).
 *   async: the gradients go into a send buffer; a communicator thread pushes what queued up
 *          (their mean: Paddle's merged send queue averages for the optimizers the servers
 *          run, at most a_sync_configs.max_merge_var_num gradients per push) and pulls the
 *          newest parameters, which the next update takes.
 *          Training never waits for the network unless the queue is full.
 *   geo:   the local optimizer steps the worker's own copy; every k_steps updates the worker
 *          pushes (params - snapshot) / workers, which the servers add (rule SUM), and pulls
 *          the sum: GEO-SGD, as Paddle's GeoCommunicator.
 * Persistable buffers (batch-norm statistics) stay on the workers, averaged by the trainer's
 * evaluation as in collective mode. */
#include "strategy_impl.h"

#include "fleet/log.h"
#include "fleet/ps.h"
#include "fleet/status.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PS_DENSE_TABLE 0

typedef struct {
    fl_ps            *ps;      /* borrowed from the fleet */
    fl_ps_mode        mode;
    int64_t           numel;   /* trainable values: dense table 0 */
    const fl_backend *be;
    float            *host;    /* (numel) staging on a device backend; NULL on the host */
    float            *snapshot; /* geo: the values at the last exchange (host memory) */
    bool              resync;  /* geo: take the snapshot from the parameters at the next
                                * update (after a checkpoint restored them) */
    int64_t           k;       /* geo: updates between exchanges */
    /* async: the communicator thread and what it shares with the training thread */
    pthread_t         thread;
    bool              thread_started;
    pthread_mutex_t   mu;
    pthread_cond_t    wake;    /* to the thread: gradients queued, or stop */
    pthread_cond_t    room;    /* to the trainer: the queue has room, or the thread is idle */
    pthread_mutex_t   io;      /* one request at a time on the client */
    float            *pending; /* sum of the queued gradients (pushed as their mean) */
    float            *sending; /* what the thread is pushing */
    float            *pulled;  /* where the thread pulls into */
    float            *fresh;   /* the newest pulled values, not yet taken */
    int64_t           npending, max_merge, pending_step;
    double            pending_lr;
    bool              has_fresh, busy, stop;
    int               err;
    char              errmsg[512];
    int64_t           pushes;  /* async: pushes sent (merged gradients count once) */
} ps_state;

static const char *mode_key(const ps_state *s) {
    return s->mode == FL_PS_SYNC ? "strategy.a_sync: false (sync)"
           : s->mode == FL_PS_GEO ? "strategy.a_sync_configs.k_steps (geo)"
                                  : "strategy.a_sync (async)";
}

static void free_state(ps_state *s) {
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->mode == FL_PS_ASYNC) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->io);
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->room);
    }
    fl_free_aligned(s->host);
    fl_free_aligned(s->snapshot);
    fl_free_aligned(s->pending);
    fl_free_aligned(s->sending);
    fl_free_aligned(s->pulled);
    fl_free_aligned(s->fresh);
    free(s);
}

/* The table's rule from the worker's optimizer: the servers run it (sync, async), or add the
 * pushed differences (geo). */
static int table_rule(const fl_dist_optim *d, const ps_state *s, fl_ps_rule *r) {
    const fl_optim_config *oc = fl_optim_get_config(d->opt);
    if (s->mode == FL_PS_GEO) {
        fl_ps_rule_defaults(r, FL_PS_RULE_SUM);
        return FL_OK;
    }
    if (oc->clip_norm > 0)
        return fl_fail(FL_ECONFIG, "optimizer.clip_norm: not in parameter-server %s mode: the "
                                   "servers hold the gradients in shards and never see their "
                                   "global norm (geo mode clips on the workers)",
                       fl_ps_mode_name(s->mode));
    switch (oc->type) {
    case FL_OPTIM_SGD:
        fl_ps_rule_defaults(r, FL_PS_RULE_SGD);
        break;
    case FL_OPTIM_MOMENTUM:
        fl_ps_rule_defaults(r, FL_PS_RULE_MOMENTUM);
        r->momentum = oc->momentum;
        r->nesterov = oc->nesterov;
        break;
    default:
        return fl_fail(FL_ECONFIG, "optimizer.type: LARS cannot run on parameter servers (its "
                                   "per-tensor rate needs whole tensors; use momentum)");
    }
    r->weight_decay = oc->weight_decay;
    return fl_ps_rule_check(r, false);
}

/* --- async: the communicator thread --- */

static void *communicator(void *arg) {
    ps_state *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->npending == 0 && !s->stop)
            pthread_cond_wait(&s->wake, &s->mu);
        if (s->npending == 0) /* stopping, nothing left to send */
            break;
        float *t = s->sending;
        s->sending = s->pending;
        s->pending = t;
        int64_t step = s->pending_step;
        double lr = s->pending_lr;
        if (s->npending > 1) { /* the mean of what queued up */
            float inv = 1.0f / (float)s->npending;
            for (int64_t i = 0; i < s->numel; i++)
                s->sending[i] *= inv;
        }
        s->npending = 0;
        s->busy = true;
        pthread_cond_broadcast(&s->room);
        pthread_mutex_unlock(&s->mu);

        pthread_mutex_lock(&s->io);
        int rc = fl_ps_dense_push(s->ps, PS_DENSE_TABLE, step, lr, s->sending);
        if (rc == 0)
            rc = fl_ps_dense_pull(s->ps, PS_DENSE_TABLE, -1, s->pulled);
        pthread_mutex_unlock(&s->io);

        pthread_mutex_lock(&s->mu);
        s->busy = false;
        if (rc < 0) {
            s->err = rc;
            snprintf(s->errmsg, sizeof s->errmsg, "%s", fl_errmsg());
            pthread_cond_broadcast(&s->room);
            break;
        }
        s->pushes++;
        t = s->fresh;
        s->fresh = s->pulled;
        s->pulled = t;
        s->has_fresh = true;
        pthread_cond_broadcast(&s->room);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int thread_error(ps_state *s) {
    return fl_fail(s->err, "parameter server (async communicator): %s", s->errmsg);
}

/* Copies the newest pulled values into the parameters (called with s->mu held). */
static void take_fresh(fl_dist_optim *d, ps_state *s) {
    if (!s->has_fresh)
        return;
    s->be->copy(fl_net_flat_params(d->net), s->fresh, (size_t)s->numel * sizeof(float),
                s->be->host_memory ? FL_COPY_D2D : FL_COPY_H2D, NULL);
    s->has_fresh = false;
}

static int alloc_host(ps_state *s, float **p) {
    *p = fl_alloc_aligned((size_t)(s->numel ? s->numel : 1) * sizeof(float));
    if (!*p)
        return fl_fail(FL_ENOMEM, "strategy ps: cannot allocate %lld values", (long long)s->numel);
    memset(*p, 0, (size_t)s->numel * sizeof(float));
    return FL_OK;
}

static int setup(fl_dist_optim *d) {
    int rc;
    ps_state *s = calloc(1, sizeof *s);
    if (!s)
        return fl_fail(FL_ENOMEM, "strategy ps: out of memory");
    s->ps = fl_fleet_ps(d->fleet);
    s->mode = !d->s.a_sync ? FL_PS_SYNC
              : d->s.a_sync_configs.k_steps > 0 ? FL_PS_GEO
                                                : FL_PS_ASYNC;
    s->k = d->s.a_sync_configs.k_steps;
    s->max_merge = d->s.a_sync_configs.max_merge_var_num;
    s->numel = fl_net_numel(d->net);
    s->be = fl_net_backend(d->net);
    if (fl_net_dtype(d->net) != FL_DTYPE_F32) {
        rc = fl_fail(FL_EUNSUPPORTED, "%s: parameter servers keep f32 tables (this network "
                                      "computes in %s)",
                     mode_key(s), fl_dtype_name(fl_net_dtype(d->net)));
        goto fail;
    }
    fl_ps_rule rule;
    if ((rc = table_rule(d, s, &rule)) < 0)
        goto fail;
    if (!s->be->host_memory && (rc = alloc_host(s, &s->host)) < 0)
        goto fail;
    if (s->mode == FL_PS_GEO && (rc = alloc_host(s, &s->snapshot)) < 0)
        goto fail;
    if (s->mode == FL_PS_ASYNC) {
        if ((rc = alloc_host(s, &s->pending)) < 0 || (rc = alloc_host(s, &s->sending)) < 0 ||
            (rc = alloc_host(s, &s->pulled)) < 0 || (rc = alloc_host(s, &s->fresh)) < 0)
            goto fail;
        pthread_mutex_init(&s->mu, NULL);
        pthread_mutex_init(&s->io, NULL);
        pthread_cond_init(&s->wake, NULL);
        pthread_cond_init(&s->room, NULL);
    }
    /* worker 0 offers its values (every replica holds them after the broadcast); a server that
     * resumed from its checkpoint keeps its own; everyone then starts from the tables */
    float *params = fl_net_flat_params(d->net);
    size_t bytes = (size_t)s->numel * sizeof(float);
    const float *mine = fl_backend_stage_out(s->be, params, s->host, bytes, NULL);
    int64_t version = 0;
    rc = fl_ps_dense_init(s->ps, PS_DENSE_TABLE, s->numel, &rule, d->rank == 0 ? mine : NULL,
                          &version);
    if (rc == 0) {
        float *into = fl_backend_stage_buf(s->be, params, s->host);
        rc = fl_ps_dense_pull(s->ps, PS_DENSE_TABLE, s->mode == FL_PS_SYNC ? version : -1, into);
        if (rc == 0)
            fl_backend_stage_in(s->be, params, into, bytes, NULL);
    }
    if (rc < 0) {
        fl_fail_prefix(rc, "%s: declaring the network's %lld values as dense table %d",
                       mode_key(s), (long long)s->numel, PS_DENSE_TABLE);
        goto fail;
    }
    /* nobody pushes before every worker has its starting values */
    if (d->world > 1 && (rc = fl_barrier(d->fleet)) < 0) {
        fl_fail_prefix(rc, "%s: waiting for every worker to join the tables", mode_key(s));
        goto fail;
    }
    s->resync = true;
    if (s->mode == FL_PS_ASYNC) {
        if (pthread_create(&s->thread, NULL, communicator, s) != 0) {
            rc = fl_fail(FL_EIO, "strategy ps: cannot start the communicator thread");
            goto fail;
        }
        s->thread_started = true;
    }
    FL_INFO("strategy ps: %s mode, %lld values in dense table %d (rule %s)%s",
            fl_ps_mode_name(s->mode), (long long)s->numel, PS_DENSE_TABLE,
            fl_ps_rule_name(rule.type), s->mode == FL_PS_GEO ? ", exchanged every k steps" : "");
    if (s->mode == FL_PS_GEO)
        FL_INFO("strategy ps: geo k_steps %lld", (long long)s->k);
    d->impl = s;
    return FL_OK;
fail:
    free_state(s);
    return rc;
}

/* The flat gradients times grad_scale, in host memory. */
static const float *host_grads(fl_dist_optim *d, ps_state *s) {
    void *g = fl_net_flat_grads(d->net);
    if (d->grad_scale != 1.0)
        s->be->scale(FL_DTYPE_F32, s->numel, d->grad_scale, g);
    return fl_backend_stage_out(s->be, g, s->host, (size_t)s->numel * sizeof(float), NULL);
}

static int update_sync(fl_dist_optim *d, ps_state *s, double lr) {
    int64_t step = DIST_STEP(d);
    void *params = fl_net_flat_params(d->net);
    FL_TRY(fl_ps_dense_push(s->ps, PS_DENSE_TABLE, step, lr, host_grads(d, s)));
    float *into = fl_backend_stage_buf(s->be, params, s->host);
    FL_TRY(fl_ps_dense_pull(s->ps, PS_DENSE_TABLE, step + 1, into));
    fl_backend_stage_in(s->be, params, into, (size_t)s->numel * sizeof(float), NULL);
    return FL_OK;
}

static int update_async(fl_dist_optim *d, ps_state *s, double lr) {
    const float *g = host_grads(d, s);
    pthread_mutex_lock(&s->mu);
    while (s->npending >= s->max_merge && !s->err)
        pthread_cond_wait(&s->room, &s->mu);
    if (s->err) {
        pthread_mutex_unlock(&s->mu);
        return thread_error(s);
    }
    if (s->npending == 0)
        memcpy(s->pending, g, (size_t)s->numel * sizeof(float));
    else
        for (int64_t i = 0; i < s->numel; i++)
            s->pending[i] += g[i];
    s->npending++;
    s->pending_step = DIST_STEP(d);
    s->pending_lr = lr;
    pthread_cond_signal(&s->wake);
    take_fresh(d, s);
    pthread_mutex_unlock(&s->mu);
    return FL_OK;
}

/* geo: the local step, and every k updates the exchange of differences. */
static int update_geo(fl_dist_optim *d, ps_state *s, double lr) {
    float *params = fl_net_flat_params(d->net);
    size_t bytes = (size_t)s->numel * sizeof(float);
    if (s->resync) { /* the values the local steps start from (the servers', or a checkpoint's) */
        memcpy(s->snapshot, fl_backend_stage_out(s->be, params, s->host, bytes, NULL), bytes);
        s->resync = false;
    }
    if (d->grad_scale != 1.0)
        s->be->scale(FL_DTYPE_F32, s->numel, d->grad_scale, fl_net_flat_grads(d->net));
    FL_TRY(fl_optim_step(d->opt, lr, NULL));
    int64_t step = DIST_STEP(d) + 1;
    if (step % s->k != 0)
        return FL_OK;
    /* delta = (params - snapshot) / workers, in the staging buffer (or a scratch on the host:
     * the snapshot itself, which the pull overwrites anyway) */
    const float *p = fl_backend_stage_out(s->be, params, s->host, bytes, NULL);
    float inv = 1.0f / (float)d->world;
    for (int64_t i = 0; i < s->numel; i++)
        s->snapshot[i] = (p[i] - s->snapshot[i]) * inv;
    FL_TRY(fl_ps_dense_push(s->ps, PS_DENSE_TABLE, DIST_STEP(d), lr, s->snapshot));
    FL_TRY(fl_ps_dense_pull(s->ps, PS_DENSE_TABLE, -1, s->snapshot));
    fl_backend_stage_in(s->be, params, s->snapshot, bytes, NULL);
    if (s->be->host_memory)
        memcpy(params, s->snapshot, bytes);
    return FL_OK;
}

static int update(fl_dist_optim *d, double lr) {
    ps_state *s = d->impl;
    int rc = s->mode == FL_PS_SYNC    ? update_sync(d, s, lr)
             : s->mode == FL_PS_ASYNC ? update_async(d, s, lr)
                                      : update_geo(d, s, lr);
    if (rc < 0)
        return fl_fail_prefix(rc, "%s, update %lld", mode_key(s), (long long)DIST_STEP(d));
    return FL_OK;
}

/* After the last update: async sends what is queued and waits for it, geo sends its
 * difference since the last exchange; then every mode takes the tables' newest values. */
static int finish(fl_dist_optim *d) {
    ps_state *s = d->impl;
    float *params = fl_net_flat_params(d->net);
    size_t bytes = (size_t)s->numel * sizeof(float);
    if (s->mode == FL_PS_SYNC)
        return FL_OK; /* every replica already holds the tables' values */
    if (s->mode == FL_PS_ASYNC) {
        pthread_mutex_lock(&s->mu);
        while ((s->npending > 0 || s->busy) && !s->err)
            pthread_cond_wait(&s->room, &s->mu);
        int err = s->err;
        pthread_mutex_unlock(&s->mu);
        if (err)
            return thread_error(s);
    } else if (!s->resync && DIST_STEP(d) % s->k != 0) {
        const float *p = fl_backend_stage_out(s->be, params, s->host, bytes, NULL);
        float inv = 1.0f / (float)d->world;
        for (int64_t i = 0; i < s->numel; i++)
            s->snapshot[i] = (p[i] - s->snapshot[i]) * inv;
        FL_TRY(fl_ps_dense_push(s->ps, PS_DENSE_TABLE, DIST_STEP(d), 0.0, s->snapshot));
    }
    /* every worker's last push is in before anyone takes the final values */
    FL_TRY(fl_barrier(d->fleet));
    if (s->mode == FL_PS_ASYNC)
        pthread_mutex_lock(&s->io);
    float *into = fl_backend_stage_buf(s->be, params, s->host);
    int rc = fl_ps_dense_pull(s->ps, PS_DENSE_TABLE, -1, into);
    if (s->mode == FL_PS_ASYNC)
        pthread_mutex_unlock(&s->io);
    FL_TRY(rc);
    fl_backend_stage_in(s->be, params, into, bytes, NULL);
    if (s->mode == FL_PS_GEO)
        memcpy(s->snapshot, fl_backend_stage_out(s->be, params, s->host, bytes, NULL), bytes);
    fl_ps_stats st;
    fl_ps_get_stats(s->ps, &st);
    if (s->mode == FL_PS_ASYNC)
        FL_INFO("strategy ps: async: %lld updates in %lld pushes (queued gradients merged), "
                "staleness mean %.2f, max %lld updates of other workers; sent %.1f MB, "
                "received %.1f MB", (long long)DIST_STEP(d), (long long)s->pushes,
                st.mean_staleness, (long long)st.max_staleness, st.bytes_sent / 1e6,
                st.bytes_received / 1e6);
    else
        FL_INFO("strategy ps: geo: %lld updates, exchanges every %lld; sent %.1f MB, received "
                "%.1f MB", (long long)DIST_STEP(d), (long long)s->k, st.bytes_sent / 1e6,
                st.bytes_received / 1e6);
    return FL_OK;
}

static void abandon(fl_dist_optim *d) {
    (void)d; /* nothing starts during backward */
}

static void destroy(fl_dist_optim *d) {
    free_state(d->impl);
    d->impl = NULL;
}

static void stats(const fl_dist_optim *d, fl_dist_stats *out) {
    const ps_state *s = d->impl;
    out->interval = s->mode == FL_PS_GEO ? s->k : 0;
}

const struct strategy_ops fl_ps_ops = {
    .name = "ps",
    .setup = setup,
    .grad_ready = NULL,
    .update = update,
    .abandon = abandon,
    .destroy = destroy,
    .stats = stats,
    .finish = finish,
};
