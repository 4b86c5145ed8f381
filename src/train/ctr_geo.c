/* ctr_geo.c - PS geo mode's sparse tables (docs/ctr.md "Training"): GEO-SGD (Paddle's
 * GeoCommunicator) on the CTR model's two tables. Each worker trains a local copy with the rule;
 * every k steps it hands the rows it touched since the last hand-off, with their differences
 * (copy - snapshot) / W taken at the hand-off, to a communicator thread, which pushes them (the
 * servers' rule is SUM: a server row is the sum of the workers' differences) and pulls the
 * servers' rows back while training goes on. The training thread folds them in at its next safe
 * point (the start of a step, or the next hand-off, which waits for the exchange in flight):
 * copy += fresh - copy-at-hand-off and snapshot = fresh, so the copy is the servers' row plus
 * the worker's own progress not sent yet. Worker r's first hand-off is at step k + r*k/W, so the
 * workers' exchanges spread over the k steps. The thread shares the worker's PS client with the
 * training thread (its calls are serialised whole under the client's lock, as async mode's dense
 * communicator does); with geo_background false the same exchange runs on the training thread,
 * every worker at the same step. */
#include "train/ctr_impl.h"

#include "fleet/log.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One table's part of an exchange. */
typedef struct {
    uint64_t *ids;   /* (n) ascending: the rows touched since the previous hand-off */
    int64_t   n;
    float    *base;  /* (n, dim) the copy's rows at the hand-off */
    float    *delta; /* (n, dim) (base - snapshot) / W: pushed; at the fold, fresh - base */
    float    *fresh; /* (n, dim) the servers' rows after the push */
    int64_t   cap;   /* floats each of base, delta, fresh hold */
} geo_part;

typedef enum { GEO_IDLE, GEO_QUEUED, GEO_RUNNING, GEO_DONE } geo_state;

typedef struct ctr_geo {
    fl_ps          *ps;        /* borrowed */
    int             W, rank, dim[FL_CTR_NTABLES];
    int64_t         k;
    bool            background;
    fl_ps_sparse   *snap[FL_CTR_NTABLES]; /* the values at the last fold (rule SUM) */
    ctr_idset       touched[FL_CTR_NTABLES];
    geo_part        part[FL_CTR_NTABLES];
    int64_t         since;     /* steps since the last hand-off; negative before the first */
    int64_t         step;      /* the exchange's step (the servers ignore it in geo mode) */
    /* the communicator thread and what it shares with the training thread (under mu) */
    pthread_t       thread;
    bool            started, stop;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    geo_state       state;
    int             err;       /* the failed exchange's status; its message in errmsg */
    char            errmsg[1024];
    /* what the training thread counts */
    int64_t         exchanges, rows_sent, first_step;
    double          wait_s;    /* training blocked on an exchange in flight */
    bool            final;     /* after ctr_geo_finish: reads go to the servers */
} ctr_geo;

/* Pushes every table's differences and pulls the servers' rows: the network half of an
 * exchange (the communicator thread's, or the training thread's without geo_background). */
static int send_and_receive(ctr_geo *g) {
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        geo_part *p = &g->part[t];
        int rc = fl_ps_sparse_push(g->ps, CTR_PS_TABLE(t), g->step, 0.0, p->ids, p->n, p->delta);
        if (rc >= 0)
            rc = fl_ps_sparse_pull(g->ps, CTR_PS_TABLE(t), p->ids, p->n, p->fresh);
        if (rc < 0)
            return fl_fail_prefix(rc, "geo exchange of sparse table '%s'",
                                  fl_ctr_model_table_name(t));
    }
    return FL_OK;
}

static void *communicator(void *arg) {
    ctr_geo *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (g->state != GEO_QUEUED && !g->stop)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->stop) /* teardown: what is queued is not sent */
            break;
        g->state = GEO_RUNNING;
        pthread_mutex_unlock(&g->mu);
        int rc = send_and_receive(g);
        pthread_mutex_lock(&g->mu);
        if (rc < 0) {
            g->err = rc;
            snprintf(g->errmsg, sizeof g->errmsg, "%s", fl_errmsg());
        }
        g->state = GEO_DONE;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Folds a finished exchange into the copies (training thread; the thread idle, its state
 * already back to IDLE): copy += fresh - base, snapshot = fresh. The thread's error, if it
 * failed, with its message. */
static int fold(ctr_trainer *c) {
    ctr_geo *g = c->geo;
    if (g->err)
        return fl_fail(g->err, "%s", g->errmsg);
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        geo_part *p = &g->part[t];
        int64_t m = p->n * g->dim[t];
        for (int64_t i = 0; i < m; i++)
            p->delta[i] = p->fresh[i] - p->base[i];
        int rc = fl_ps_sparse_add_rows(c->rep[t], p->ids, p->n, p->delta);
        for (int64_t i = 0; i < p->n && rc >= 0; i++)
            rc = fl_ps_sparse_put(g->snap[t], p->ids[i], p->fresh + i * g->dim[t], NULL, NULL);
        if (rc < 0)
            return fl_fail_prefix(rc, "geo exchange of sparse table '%s': folding %lld rows",
                                  fl_ctr_model_table_name(t), (long long)p->n);
    }
    return FL_OK;
}

/* Waits for the exchange in flight, if any, and folds it. */
static int drain(ctr_trainer *c) {
    ctr_geo *g = c->geo;
    if (!g->started)
        return FL_OK; /* the exchanges ran and were folded at their hand-off */
    pthread_mutex_lock(&g->mu);
    if (g->state == GEO_QUEUED || g->state == GEO_RUNNING) {
        double t0 = fl_now();
        while (g->state != GEO_DONE)
            pthread_cond_wait(&g->cv, &g->mu);
        g->wait_s += fl_now() - t0;
    }
    bool done = g->state == GEO_DONE;
    if (done)
        g->state = GEO_IDLE;
    pthread_mutex_unlock(&g->mu);
    return done ? fold(c) : FL_OK;
}

static int part_reserve(geo_part *p, int64_t floats) {
    if (floats <= p->cap)
        return FL_OK;
    int64_t cap = p->cap ? p->cap : 4096;
    while (cap < floats)
        cap *= 2;
    float **bufs[3] = {&p->base, &p->delta, &p->fresh};
    for (int i = 0; i < 3; i++) {
        float *q = realloc(*bufs[i], (size_t)cap * sizeof *q);
        if (!q)
            return fl_fail(FL_ENOMEM, "ctr: out of memory for %lld rows' values of a geo "
                                      "exchange", (long long)floats);
        *bufs[i] = q;
    }
    p->cap = cap;
    return FL_OK;
}

/* Takes the touched rows and their differences (training thread, nothing in flight) and runs
 * the exchange: queued to the thread, or (here, or without the thread) run and folded. */
static int hand_off(ctr_trainer *c, int64_t step, bool here) {
    ctr_geo *g = c->geo;
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        geo_part *p = &g->part[t];
        free(p->ids);
        p->ids = NULL;
        p->n = 0;
        FL_TRY(ctr_idset_sorted(&g->touched[t], &p->ids, &p->n));
        int dim = g->dim[t];
        int rc = part_reserve(p, p->n * dim);
        if (rc >= 0)
            rc = fl_ps_sparse_pull_rows(c->rep[t], p->ids, p->n, p->base);
        if (rc >= 0)
            rc = fl_ps_sparse_pull_rows(g->snap[t], p->ids, p->n, p->delta);
        if (rc < 0)
            return fl_fail_prefix(rc, "geo exchange of sparse table '%s'",
                                  fl_ctr_model_table_name(t));
        float inv = (float)g->W;
        for (int64_t i = 0; i < p->n * dim; i++)
            p->delta[i] = (p->base[i] - p->delta[i]) / inv;
        ctr_idset_clear(&g->touched[t]);
        g->rows_sent += p->n;
    }
    g->step = step;
    g->since = 0;
    if (g->exchanges++ == 0)
        g->first_step = step + 1;
    if (here || !g->started) { /* the thread, if any, idle */
        FL_TRY(send_and_receive(g));
        return fold(c);
    }
    pthread_mutex_lock(&g->mu);
    g->state = GEO_QUEUED;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return FL_OK;
}

int ctr_geo_init(ctr_trainer *c, bool background) {
    ctr_geo *g = calloc(1, sizeof *g);
    if (!g)
        return fl_fail(FL_ENOMEM, "ctr: out of memory");
    c->geo = g;
    g->ps = c->base.ps;
    g->W = c->base.world;
    g->rank = c->base.rank;
    g->k = c->geo_k;
    g->background = background;
    g->first_step = -1;
    fl_ps_rule sum;
    fl_ps_rule_defaults(&sum, FL_PS_RULE_SUM);
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        g->dim[t] = fl_ctr_model_table_dim(c->model, t);
        FL_TRY(fl_ps_sparse_create(CTR_PS_TABLE(t), g->dim[t], &sum, &c->init[t], &g->snap[t]));
    }
    /* stagger: worker r's first exchange after k + r*k/W steps, the next every k */
    g->since = background ? -(int64_t)g->rank * g->k / g->W : 0;
    if (!background)
        return FL_OK;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, communicator, g) != 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        return fl_fail(FL_EIO, "ctr: cannot start the geo communicator thread");
    }
    g->started = true;
    return FL_OK;
}

void ctr_geo_free(ctr_trainer *c) {
    ctr_geo *g = c->geo;
    if (!g)
        return;
    if (g->started) {
        /* an exchange in flight ends first (at worst by the client's timeout); one queued is
         * dropped (ctr_geo_finish sends everything on a run that ends well) */
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_ps_sparse_free(g->snap[t]);
        ctr_idset_free(&g->touched[t]);
        free(g->part[t].ids);
        free(g->part[t].base);
        free(g->part[t].delta);
        free(g->part[t].fresh);
    }
    free(g);
    c->geo = NULL;
}

bool ctr_geo_final(const ctr_trainer *c) { return c->geo && c->geo->final; }

int ctr_geo_poll(ctr_trainer *c) {
    ctr_geo *g = c->geo;
    if (!g->started || g->final)
        return FL_OK;
    pthread_mutex_lock(&g->mu);
    bool done = g->state == GEO_DONE;
    if (done)
        g->state = GEO_IDLE;
    pthread_mutex_unlock(&g->mu);
    return done ? fold(c) : FL_OK;
}

int ctr_geo_update(ctr_trainer *c, int64_t step, int64_t *const slots[FL_CTR_NTABLES]) {
    ctr_geo *g = c->geo;
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        fl_sparse_rows *r = fl_ctr_model_rows(c->model, t);
        FL_TRY(fl_ps_sparse_push_rows_slots(c->rep[t], r->ids, slots[t], r->n, r->grads, NULL,
                                            NULL, c->sparse_lr));
        FL_TRY(ctr_idset_add(&g->touched[t], r->ids, r->n));
    }
    if (++g->since < g->k)
        return FL_OK;
    FL_TRY(drain(c));
    return hand_off(c, step, false);
}

/* The rows of a copy (fl_ps_sparse_visit), ids and values. */
typedef struct {
    uint64_t *ids;
    float    *vals;
    int64_t   n, cap;
    int       dim;
} row_list;

static int collect_row(void *ctx, uint64_t id, const float *values, const float *state,
                       const fl_ps_row_stat *st) {
    (void)state;
    (void)st;
    row_list *l = ctx;
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 1024;
        uint64_t *a = realloc(l->ids, (size_t)cap * sizeof *a);
        if (a)
            l->ids = a;
        float *b = a ? realloc(l->vals, (size_t)cap * (size_t)l->dim * sizeof *b) : NULL;
        if (!b)
            return fl_fail(FL_ENOMEM, "ctr: out of memory listing %lld rows", (long long)cap);
        l->vals = b;
        l->cap = cap;
    }
    l->ids[l->n] = id;
    memcpy(l->vals + l->n * l->dim, values, (size_t)l->dim * sizeof *values);
    l->n++;
    return 0;
}

/* FLEET_CTR_GEO_CHECK=1 (a test's hook): every row of the copies against the servers' after
 * the barrier, said in one line. With one worker they must agree (its copy is all the servers
 * know) up to the rounding of the folds; with more, the rows another worker changed after
 * this one's last exchange differ. */
static int check_copies(ctr_trainer *c) {
    ctr_geo *g = c->geo;
    double worst = 0;
    int64_t rows[FL_CTR_NTABLES] = {0};
    for (int t = 0; t < FL_CTR_NTABLES; t++) {
        row_list l = {.dim = g->dim[t]};
        float *srv = NULL;
        int rc = fl_ps_sparse_visit(c->rep[t], false, collect_row, &l);
        if (rc >= 0 && !(srv = malloc((size_t)(l.n ? l.n : 1) * (size_t)l.dim * sizeof *srv)))
            rc = fl_fail(FL_ENOMEM, "ctr: out of memory");
        if (rc >= 0)
            rc = fl_ps_sparse_pull(g->ps, CTR_PS_TABLE(t), l.ids, l.n, srv);
        for (int64_t i = 0; rc >= 0 && i < l.n * l.dim; i++)
            worst = fmax(worst, fabs((double)srv[i] - (double)l.vals[i]));
        rows[t] = l.n;
        free(l.ids);
        free(l.vals);
        free(srv);
        if (rc < 0)
            return fl_fail_prefix(rc, "geo check of sparse table '%s'",
                                  fl_ctr_model_table_name(t));
    }
    FL_INFO("ps geo check: worker %d: after the final exchange, %lld rows of '%s' and %lld of "
            "'%s' against the servers': max |difference| %.3g", g->rank, (long long)rows[0],
            fl_ctr_model_table_name(0), (long long)rows[1], fl_ctr_model_table_name(1), worst);
    return FL_OK;
}

int ctr_geo_finish(ctr_trainer *c, int64_t step) {
    ctr_geo *g = c->geo;
    if (g->final)
        return FL_OK;
    FL_TRY(drain(c));
    bool left = false;
    for (int t = 0; t < FL_CTR_NTABLES; t++)
        left |= g->touched[t].n > 0 || g->touched[t].has_zero;
    if (left) /* the last exchange, on this thread */
        FL_TRY(hand_off(c, step, true));
    /* every worker's last push is in before anyone reads the tables */
    if (g->W > 1) {
        int rc = fl_barrier(c->base.fleet);
        if (rc < 0)
            return fl_fail_prefix(rc, "geo: waiting for every worker's last exchange");
    }
    g->final = true;
    const char *chk = getenv("FLEET_CTR_GEO_CHECK");
    if (chk && strcmp(chk, "1") == 0)
        FL_TRY(check_copies(c));
    FL_INFO("ps geo: worker %d: %lld exchanges of the sparse tables (%lld rows sent)%s, the "
            "first after step %lld, then every %lld; training waited %.2f s for them",
            g->rank, (long long)g->exchanges, (long long)g->rows_sent,
            g->background ? " by the communicator thread" : " on the training thread",
            (long long)g->first_step, (long long)g->k, g->wait_s);
    return FL_OK;
}
