/* server_shard.c - a parameter server's shard threads: each owns its part of every table
 * (server.h) and runs the tasks the receiving threads queue for it, in queue order, without
 * locks on the tables. A request waits for its tasks through a ps_done countdown. */
#include "server.h"

#include "fleet/log.h"
#include "fleet/status.h"

#include <stdio.h>
#include <string.h>

void ps_done_init(ps_done *d) {
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->left = 0;
    d->rc = 0;
    d->err[0] = '\0';
}

void ps_done_destroy(ps_done *d) {
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
}

static void done_one(ps_done *d, int rc, const char *err) {
    pthread_mutex_lock(&d->mu);
    if (rc < 0 && d->rc == 0) {
        d->rc = rc;
        snprintf(d->err, sizeof d->err, "%s", err);
    }
    if (--d->left == 0)
        pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

int ps_done_wait(ps_done *d) {
    pthread_mutex_lock(&d->mu);
    while (d->left > 0)
        pthread_cond_wait(&d->cv, &d->mu);
    int rc = d->rc;
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void ps_task_enqueue(ps_server *s, int shard, ps_task *t) {
    ps_shard *q = &s->shards[shard];
    t->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = t;
    else
        q->head = t;
    q->tail = t;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* Dense blocks of this shard: local blocks j with j % T == id, at offset j * block. */
static void run_dense(ps_shard *sh, ps_task *t) {
    ps_server *s = sh->srv;
    ps_dense *d = &s->dense[t->table];
    for (int j = sh->id; j < d->nblocks; j += s->T) {
        fl_ps_block *b = &d->blocks[j];
        int64_t off = (int64_t)j * FL_PS_DENSE_BLOCK;
        switch (t->op) {
        case TASK_DENSE_SET:
            memcpy(b->value, t->src + off, (size_t)b->numel * sizeof(float));
            break;
        case TASK_DENSE_GET:
            memcpy(t->dst + off, b->value, (size_t)b->numel * sizeof(float));
            break;
        case TASK_DENSE_ACC:
            fl_ps_block_accumulate(b, t->src + off);
            if (t->apply)
                fl_ps_block_apply_accum(b, &d->rule, t->lr, t->scale);
            break;
        case TASK_DENSE_APPLY:
            fl_ps_rule_apply(&d->rule, t->lr, b->value, t->src + off, b->state, b->numel);
            break;
        }
    }
}

static int run_sparse(ps_shard *sh, ps_task *t) {
    ps_server *s = sh->srv;
    ps_sparse_table *tb = &s->sparse[t->table];
    fl_ps_sparse *part = tb->parts[sh->id];
    int64_t dim = tb->dim;
    int rc = 0;
    switch (t->op) {
    case TASK_SPARSE_PULL:
        rc = fl_ps_sparse_pull_rows(part, t->ids, t->n, t->tmp);
        for (int64_t k = 0; rc == 0 && k < t->n; k++)
            memcpy(t->dst + t->pos[k] * dim, t->tmp + k * dim, (size_t)dim * sizeof(float));
        return rc;
    case TASK_SPARSE_SHRINK: {
        int64_t removed = fl_ps_sparse_pass(part);
        t->result[0] = removed;
        return removed < 0 ? (int)removed : 0;
    }
    case TASK_SPARSE_STATS:
        t->result[0] = fl_ps_sparse_rows(part);
        t->result[1] = (int64_t)fl_ps_sparse_bytes(part);
        return 0;
    }
    for (int64_t k = 0; k < t->n; k++)
        memcpy(t->tmp + k * dim, t->grads + t->pos[k] * dim, (size_t)dim * sizeof(float));
    float *shows = NULL, *clicks = NULL;
    if (t->shows) { /* this thread's counts, in the order of its ids */
        shows = t->tmpc;
        clicks = t->tmpc + t->n;
        for (int64_t k = 0; k < t->n; k++) {
            shows[k] = t->shows[t->pos[k]];
            clicks[k] = t->clicks[t->pos[k]];
        }
    }
    if (t->op == TASK_SPARSE_PUSH)
        return fl_ps_sparse_push_rows_counts(part, t->ids, t->n, t->tmp, shows, clicks,
                                             t->lr);
    if (t->n > 0)
        rc = fl_ps_sparse_accumulate_counts(part, t->ids, t->n, t->tmp, shows, clicks);
    if (rc == 0 && t->apply)
        rc = fl_ps_sparse_apply_pending(part, t->lr, t->scale);
    return rc;
}

static void *shard_main(void *arg) {
    ps_shard *sh = arg;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        while (!sh->head && !sh->quit)
            pthread_cond_wait(&sh->cv, &sh->mu);
        if (!sh->head) {
            pthread_mutex_unlock(&sh->mu);
            return NULL;
        }
        ps_task *t = sh->head;
        sh->head = t->next;
        if (!sh->head)
            sh->tail = NULL;
        pthread_mutex_unlock(&sh->mu);

        int rc = 0;
        char err[256] = "";
        switch (t->op) {
        case TASK_PAUSE: {
            ps_done *d = t->done;
            pthread_mutex_lock(&sh->mu);
            sh->paused = true;
            pthread_mutex_unlock(&sh->mu);
            done_one(d, 0, NULL);
            pthread_mutex_lock(&sh->mu);
            while (!sh->release)
                pthread_cond_wait(&sh->cv, &sh->mu);
            sh->release = false;
            sh->paused = false;
            pthread_mutex_unlock(&sh->mu);
            continue;
        }
        case TASK_SPARSE_PULL:
        case TASK_SPARSE_ACC:
        case TASK_SPARSE_PUSH:
        case TASK_SPARSE_SHRINK:
        case TASK_SPARSE_STATS:
            rc = run_sparse(sh, t);
            if (rc < 0)
                snprintf(err, sizeof err, "shard thread %d: %s", sh->id, fl_errmsg());
            break;
        default:
            run_dense(sh, t);
            break;
        }
        done_one(t->done, rc, err);
    }
}

int ps_shards_start(ps_server *s) {
    for (int i = 0; i < s->T; i++) {
        ps_shard *sh = &s->shards[i];
        sh->srv = s;
        sh->id = i;
        pthread_mutex_init(&sh->mu, NULL);
        pthread_cond_init(&sh->cv, NULL);
    }
    for (int i = 0; i < s->T; i++) {
        if (pthread_create(&s->shards[i].thread, NULL, shard_main, &s->shards[i]) != 0) {
            ps_shards_stop(s);
            return fl_fail(FL_ENOMEM, "server %d: cannot start shard thread %d", s->s, i);
        }
        s->nshards_started++;
    }
    return 0;
}

void ps_shards_stop(ps_server *s) {
    for (int i = 0; i < s->nshards_started; i++) {
        ps_shard *sh = &s->shards[i];
        pthread_mutex_lock(&sh->mu);
        sh->quit = true;
        sh->release = true;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
    for (int i = 0; i < s->nshards_started; i++)
        pthread_join(s->shards[i].thread, NULL);
    s->nshards_started = 0;
}

void ps_shards_pause(ps_server *s, ps_done *d, ps_task *tasks) {
    d->left = s->T;
    d->rc = 0;
    for (int i = 0; i < s->T; i++) {
        memset(&tasks[i], 0, sizeof tasks[i]);
        tasks[i].op = TASK_PAUSE;
        tasks[i].done = d;
        ps_task_enqueue(s, i, &tasks[i]);
    }
    ps_done_wait(d);
}

void ps_shards_release(ps_server *s) {
    for (int i = 0; i < s->T; i++) {
        ps_shard *sh = &s->shards[i];
        pthread_mutex_lock(&sh->mu);
        sh->release = true;
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
}
