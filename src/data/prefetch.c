/* prefetch.c - the sharded loader with worker threads and a bounded queue of batches made
 * ahead. Batches are cut exactly as fl_loader cuts them (loader_impl.h); workers claim single
 * samples of the oldest unfinished batch, so several threads share one batch and the queue
 * fills in order. A sample's value depends only on (dataset seed, epoch, index), never on the
 * thread, so the output equals the single-threaded loader's bit for bit. */
#include "fleet/data.h"

#include "data/loader_impl.h"
#include "fleet/status.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_HELD } slot_state;

typedef struct {
    slot_state state;
    int64_t    step;
    int64_t    lo, hi;  /* positions [lo, hi) of the epoch's order */
    int64_t    next;    /* next position to claim */
    int64_t    done;    /* samples finished */
    float     *x;       /* (B, sample) */
    int32_t   *labels;  /* (B) */
    uint8_t   *ok;      /* (B) 1 made, 0 skipped */
    int        err_rc;  /* first failure by position (0: none) */
    int64_t    err_pos;
    char      *err_msg;
} slot;

struct fl_prefetch {
    fl_dataset        *ds; /* borrowed */
    fl_prefetch_config cfg;
    int64_t            steps;
    int64_t           *perm;
    int64_t            epoch;
    int64_t            next_issue;   /* next step to give a slot */
    int64_t            next_consume; /* next step the consumer takes */
    int                nslots;
    slot              *slots;
    int                held;         /* slot the consumer holds, -1 if none */
    pthread_t         *threads;
    int                nthreads;
    pthread_mutex_t    mu;
    pthread_cond_t     work_cv;  /* workers: a slot was freed or work was issued */
    pthread_cond_t     ready_cv; /* consumer: a slot became ready */
    pthread_cond_t     idle_cv;  /* seek: no worker is making a sample */
    int                busy;     /* workers making a sample outside the lock */
    uint64_t           gen;      /* bumped by seek: samples of an older generation are dropped */
    bool               stop;
    int64_t            skipped;
    int                sticky_rc; /* error returned again until the next seek */
    char              *sticky_msg;
    fl_tensor          x;        /* view of the held slot's x */
    int64_t            shape[FL_MAX_DIMS];
};

/* Records the result of position pos in s; called under the lock (or with no workers). */
static void record(slot *s, int64_t pos, int rc, const char *msg) {
    s->ok[pos - s->lo] = rc == FL_OK;
    if (rc < 0 && (s->err_rc == 0 || pos < s->err_pos)) {
        free(s->err_msg);
        s->err_msg = strdup(msg);
        s->err_rc = rc;
        s->err_pos = pos;
    }
}

static int make_sample(fl_prefetch *p, slot *s, int64_t pos, char **msg) {
    int64_t j = pos - s->lo;
    int rc = fl_dataset_get_ex(p->ds, p->perm[pos], p->epoch, s->x + j * p->ds->sample_numel,
                               &s->labels[j]);
    *msg = rc < 0 ? strdup(fl_errmsg()) : NULL;
    return rc;
}

static void assign(fl_prefetch *p, slot *s, int64_t step) {
    s->step = step;
    fl_loader_slice(&p->cfg.base, p->ds->size, step, &s->lo, &s->hi);
    s->next = s->lo;
    s->done = 0;
    s->err_rc = 0;
    free(s->err_msg);
    s->err_msg = NULL;
    s->state = s->hi > s->lo ? SLOT_FILLING : SLOT_READY;
}

/* Under the lock: the oldest batch with samples left to claim, issuing a new one if there is
 * room in the queue; NULL when there is nothing to do. */
static slot *find_work(fl_prefetch *p) {
    for (;;) {
        slot *best = NULL, *free_slot = NULL;
        for (int i = 0; i < p->nslots; i++) {
            slot *s = &p->slots[i];
            if (s->state == SLOT_FILLING && s->next < s->hi && (!best || s->step < best->step))
                best = s;
            if (s->state == SLOT_FREE && !free_slot)
                free_slot = s;
        }
        if (best)
            return best;
        if (!free_slot || p->next_issue >= p->steps ||
            p->next_issue >= p->next_consume + p->cfg.prefetch)
            return NULL;
        assign(p, free_slot, p->next_issue++);
        if (free_slot->state == SLOT_READY)
            pthread_cond_broadcast(&p->ready_cv);
    }
}

static void *worker(void *arg) {
    fl_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        slot *s = find_work(p);
        if (!s) {
            pthread_cond_wait(&p->work_cv, &p->mu);
            continue;
        }
        int64_t pos = s->next++;
        uint64_t gen = p->gen;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        char *msg = NULL;
        int rc = make_sample(p, s, pos, &msg);
        pthread_mutex_lock(&p->mu);
        p->busy--;
        if (gen == p->gen) {
            record(s, pos, rc, msg ? msg : "out of memory");
            if (++s->done == s->hi - s->lo) {
                s->state = SLOT_READY;
                pthread_cond_broadcast(&p->ready_cv);
            }
        }
        free(msg);
        if (p->busy == 0)
            pthread_cond_broadcast(&p->idle_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

fl_prefetch *fl_prefetch_create(fl_dataset *ds, const fl_prefetch_config *cfg) {
    FL_ASSERT(ds && cfg);
    if (fl_loader_check_config(ds, &cfg->base) < 0)
        return NULL;
    if (cfg->num_workers < 0 || cfg->num_workers > 256) {
        fl_fail(FL_EINVAL, "loader: num_workers %d outside [0, 256]", cfg->num_workers);
        return NULL;
    }
    if (cfg->prefetch < 1 || cfg->prefetch > 1024) {
        fl_fail(FL_EINVAL, "loader: prefetch %d outside [1, 1024] (batches)", cfg->prefetch);
        return NULL;
    }
    fl_prefetch *p = calloc(1, sizeof *p);
    if (!p) {
        fl_fail(FL_ENOMEM, "loader: out of memory");
        return NULL;
    }
    p->ds = ds;
    p->cfg = *cfg;
    p->steps = fl_loader_count_steps(ds->size, &cfg->base);
    p->held = -1;
    p->nslots = cfg->num_workers ? cfg->prefetch + 1 : 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->ready_cv, NULL);
    pthread_cond_init(&p->idle_cv, NULL);
    int64_t B = cfg->base.batch_size, numel = ds->sample_numel;
    p->perm = malloc((size_t)(ds->size ? ds->size : 1) * sizeof *p->perm);
    p->slots = calloc((size_t)p->nslots, sizeof *p->slots);
    if (!p->perm || !p->slots)
        goto oom;
    for (int i = 0; i < p->nslots; i++) {
        slot *s = &p->slots[i];
        /* 64-byte aligned as fl_tensor_create's data, for the kernels that read it */
        size_t bytes = ((size_t)(B * numel) * sizeof *s->x + 63) / 64 * 64;
        s->x = aligned_alloc(64, bytes);
        s->labels = malloc((size_t)B * sizeof *s->labels);
        s->ok = malloc((size_t)B);
        if (!s->x || !s->labels || !s->ok)
            goto oom;
    }
    p->shape[0] = B;
    for (int i = 0; i < ds->ndim; i++)
        p->shape[i + 1] = ds->shape[i];
    p->epoch = -1;
    if (fl_prefetch_seek(p, 0, 0) < 0)
        goto fail;
    p->threads = calloc((size_t)(cfg->num_workers ? cfg->num_workers : 1), sizeof *p->threads);
    if (!p->threads)
        goto oom;
    for (; p->nthreads < cfg->num_workers; p->nthreads++)
        if (pthread_create(&p->threads[p->nthreads], NULL, worker, p) != 0) {
            fl_fail(FL_ENOMEM, "loader: cannot start worker thread %d of %d", p->nthreads + 1,
                    cfg->num_workers);
            goto fail;
        }
    return p;

oom:
    fl_fail(FL_ENOMEM, "loader: cannot allocate %d batches of %lld samples", p->nslots,
            (long long)B);
fail:
    fl_prefetch_free(p);
    return NULL;
}

void fl_prefetch_free(fl_prefetch *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    for (int i = 0; p->slots && i < p->nslots; i++) {
        free(p->slots[i].x);
        free(p->slots[i].labels);
        free(p->slots[i].ok);
        free(p->slots[i].err_msg);
    }
    free(p->slots);
    free(p->threads);
    free(p->perm);
    free(p->sticky_msg);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->ready_cv);
    pthread_cond_destroy(&p->idle_cv);
    free(p);
}

int64_t fl_prefetch_steps_per_epoch(const fl_prefetch *p) { return p->steps; }
int64_t fl_prefetch_skipped(const fl_prefetch *p) { return p->skipped; }

int fl_prefetch_seek(fl_prefetch *p, int64_t epoch, int64_t step) {
    FL_ASSERT(p);
    if (epoch < 0 || (uint64_t)epoch >= ((uint64_t)1 << 48))
        return fl_fail(FL_EINVAL, "loader: epoch %lld outside [0, 2^48)", (long long)epoch);
    if (step < 0 || step > p->steps)
        return fl_fail(FL_EINVAL, "loader: step %lld outside [0, %lld] (steps per epoch)",
                       (long long)step, (long long)p->steps);
    pthread_mutex_lock(&p->mu);
    if (epoch == p->epoch && step == p->next_consume && p->sticky_rc == 0) {
        /* already there (the usual seek to step 0 right after create): keep what is made */
        if (p->held >= 0) {
            p->slots[p->held].state = SLOT_FREE;
            p->held = -1;
            pthread_cond_broadcast(&p->work_cv);
        }
        pthread_mutex_unlock(&p->mu);
        return FL_OK;
    }
    /* stop issuing, drop every batch, and wait out the samples in the workers' hands: they
     * write into slot buffers and read perm outside the lock */
    p->gen++;
    p->next_issue = p->steps;
    for (int i = 0; i < p->nslots; i++)
        p->slots[i].state = SLOT_FREE;
    p->held = -1;
    while (p->busy > 0)
        pthread_cond_wait(&p->idle_cv, &p->mu);
    if (epoch != p->epoch)
        fl_loader_epoch_order(p->perm, p->ds->size, &p->cfg.base, epoch);
    p->epoch = epoch;
    p->next_issue = step;
    p->next_consume = step;
    p->sticky_rc = 0;
    free(p->sticky_msg);
    p->sticky_msg = NULL;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    return FL_OK;
}

/* Without workers: make batch `step` in slot 0 on the calling thread. */
static slot *make_inline(fl_prefetch *p, int64_t step) {
    slot *s = &p->slots[0];
    assign(p, s, step);
    for (int64_t pos = s->lo; pos < s->hi; pos++) {
        char *msg = NULL;
        int rc = make_sample(p, s, pos, &msg);
        record(s, pos, rc, msg ? msg : "out of memory");
        free(msg);
        if (rc < 0)
            break; /* as fl_loader: the first failure ends the batch */
    }
    return s;
}

int fl_prefetch_next(fl_prefetch *p, const fl_tensor **x, const int32_t **labels) {
    FL_ASSERT(p && x && labels);
    if (p->sticky_rc < 0)
        return fl_fail(p->sticky_rc, "%s", p->sticky_msg ? p->sticky_msg : "loader failed");
    slot *s;
    int64_t step;
    pthread_mutex_lock(&p->mu);
    if (p->held >= 0) {
        p->slots[p->held].state = SLOT_FREE;
        p->held = -1;
        pthread_cond_broadcast(&p->work_cv);
    }
    if (p->next_consume >= p->steps) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    step = p->next_consume++;
    if (p->nthreads == 0) {
        pthread_mutex_unlock(&p->mu);
        s = make_inline(p, step);
    } else {
        pthread_cond_broadcast(&p->work_cv); /* room for one more batch ahead */
        for (;;) {
            s = NULL;
            for (int i = 0; i < p->nslots; i++)
                if (p->slots[i].state == SLOT_READY && p->slots[i].step == step)
                    s = &p->slots[i];
            if (s)
                break;
            pthread_cond_wait(&p->ready_cv, &p->mu);
        }
        s->state = SLOT_HELD;
        p->held = (int)(s - p->slots);
        pthread_mutex_unlock(&p->mu);
    }
    if (s->err_rc < 0) {
        fl_fail(s->err_rc, "loader: epoch %lld step %lld sample %lld: %s", (long long)p->epoch,
                (long long)step, (long long)p->perm[s->err_pos], s->err_msg ? s->err_msg : "");
        p->sticky_rc = s->err_rc;
        free(p->sticky_msg);
        p->sticky_msg = strdup(fl_errmsg());
        return s->err_rc;
    }
    /* compact past skipped samples, keeping order, as fl_loader does */
    int64_t numel = p->ds->sample_numel, n = 0;
    for (int64_t j = 0; j < s->hi - s->lo; j++) {
        if (!s->ok[j]) {
            p->skipped++;
            continue;
        }
        if (n != j) {
            memmove(s->x + n * numel, s->x + j * numel, (size_t)numel * sizeof *s->x);
            s->labels[n] = s->labels[j];
        }
        n++;
    }
    p->shape[0] = n;
    fl_tensor_view(&p->x, FL_DTYPE_F32, p->ds->ndim + 1, p->shape, s->x);
    *x = &p->x;
    *labels = s->labels;
    return 1;
}
