/* optim.c - SGD, Momentum (optionally Nesterov) and LARS momentum (lars.c) over an array of
 * named parameters, with L2 decay and global-norm clipping. Velocities live in one zeroed block allocated at create
 * (llm.c style) and are exposed as named params "opt.velocity.<name>" for checkpoints; the
 * arithmetic is the kernel table's sgd_update / momentum_update (Paddle's Momentum, PyTorch's
 * SGD with dampening 0: v = mu * v + g, not the v = mu * v + lr * g of Sutskever et al.). */
#include "fleet/optim.h"

#include "optim_impl.h"

#include "fleet/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_PREFIX "opt.velocity."

struct fl_optim {
    fl_optim_config      cfg;
    fl_param            *params; /* (n) borrowed */
    int                  n;
    fl_dtype             dtype;
    const fl_backend *k;
    int                  nstate;
    fl_param            *state;       /* (nstate) velocities, Momentum only */
    int                 *velocity_of; /* (n) index into state, or -1 */
    void                *block;       /* the velocities' memory (k's) */
    void                *lars_scratch;/* LARS with weight_decay: g + wd w of the largest param
                                       * (k's memory) */
    int64_t             *run_numel;   /* (n) LARS on a table with lars_update_run: a run's */
    double              *run_decay;   /* tensors' sizes and LARS decays, host memory */
    double              *decay_of;    /* (n) LARS: each parameter's decay (lars_decay_of, once) */
};

static int check_config(const fl_optim_config *c) {
    if (c->type != FL_OPTIM_SGD && c->type != FL_OPTIM_MOMENTUM && c->type != FL_OPTIM_LARS)
        return fl_fail(FL_EINVAL, "optimizer: unknown type %d", (int)c->type);
    if (c->type == FL_OPTIM_LARS)
        FL_TRY(lars_check_config(c));
    if (c->type != FL_OPTIM_SGD && !(c->momentum >= 0 && c->momentum < 1))
        return fl_fail(FL_EINVAL, "optimizer: momentum %g outside [0, 1)", c->momentum);
    if (c->type == FL_OPTIM_SGD && c->momentum != 0)
        return fl_fail(FL_EINVAL, "optimizer: momentum %g given to SGD (use type momentum)",
                       c->momentum);
    if (c->nesterov && c->type != FL_OPTIM_MOMENTUM)
        return fl_fail(FL_EINVAL, "optimizer: nesterov needs type momentum");
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return fl_fail(FL_EINVAL, "optimizer: weight_decay %g is not a finite number >= 0",
                       c->weight_decay);
    if (isnan(c->clip_norm))
        return fl_fail(FL_EINVAL, "optimizer: clip_norm is NaN");
    return FL_OK;
}

static int check_param(const fl_param *p, fl_dtype dtype, bool has_state) {
    if (!p->trainable)
        return FL_OK;
    if (p->value.dtype != dtype || !p->value.data)
        return fl_fail(FL_ESHAPE, "optimizer: parameter '%s' is %s%s, optimizer is %s", p->name,
                       fl_dtype_name(p->value.dtype), p->value.data ? "" : " without data",
                       fl_dtype_name(dtype));
    if (p->grad.data && (p->grad.dtype != dtype || p->grad.numel != p->value.numel))
        return fl_fail(FL_ESHAPE,
                       "optimizer: gradient of '%s' is %s with %lld elements, value is %s with "
                       "%lld",
                       p->name, fl_dtype_name(p->grad.dtype), (long long)p->grad.numel,
                       fl_dtype_name(p->value.dtype), (long long)p->value.numel);
    if (has_state && strlen(p->name) + strlen(STATE_PREFIX) >= sizeof p->name)
        return fl_fail(FL_EINVAL,
                       "optimizer: state name '" STATE_PREFIX "%s' is longer than %zu characters",
                       p->name, sizeof p->name - 1);
    return FL_OK;
}

/* Bytes of a velocity. The velocities lie back to back in the block, in parameter order, as a
 * network's flat parameter and gradient blocks do (fl_net_build), so that one kernel call can
 * update a whole run of parameters (run_end). */
static size_t velocity_bytes(const fl_param *p) { return fl_tensor_nbytes(&p->value); }

fl_optim *fl_optim_create(const fl_optim_config *cfg, fl_param *params, int n, fl_dtype dtype,
                          const fl_backend *k) {
    FL_ASSERT(cfg && k && n >= 0 && (params || n == 0));
    fl_optim *opt = NULL;
    if (check_config(cfg) < 0)
        goto fail;
    if (dtype != FL_DTYPE_F32 && dtype != FL_DTYPE_F64) {
        fl_fail(FL_EUNSUPPORTED, "optimizer: dtype %s (kernels take f32 or f64)",
                fl_dtype_name(dtype));
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if (check_param(&params[i], dtype, cfg->type != FL_OPTIM_SGD) < 0)
            goto fail;

    opt = calloc(1, sizeof *opt);
    if (!opt)
        goto nomem;
    opt->cfg = *cfg;
    opt->params = params;
    opt->n = n;
    opt->dtype = dtype;
    opt->k = k;
    opt->velocity_of = malloc((size_t)(n ? n : 1) * sizeof *opt->velocity_of);
    if (!opt->velocity_of)
        goto nomem;
    for (int i = 0; i < n; i++)
        opt->velocity_of[i] = -1;
    if (cfg->type == FL_OPTIM_SGD)
        return opt;

    /* one velocity per trainable parameter, same shape and dtype, zero to start with */
    size_t bytes = 0;
    int nstate = 0;
    for (int i = 0; i < n; i++) {
        if (params[i].trainable) {
            bytes += velocity_bytes(&params[i]);
            nstate++;
        }
    }
    opt->state = calloc((size_t)(nstate ? nstate : 1), sizeof *opt->state);
    opt->block = k->alloc(bytes); /* zero-filled */
    if (!opt->state || !opt->block)
        goto nomem;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const fl_param *p = &params[i];
        if (!p->trainable)
            continue;
        fl_param *v = &opt->state[opt->nstate];
        /* check_param made sure the name fits */
        size_t plen = strlen(STATE_PREFIX), nlen = strlen(p->name);
        memcpy(v->name, STATE_PREFIX, plen);
        memcpy(v->name + plen, p->name, nlen + 1);
        fl_tensor_view(&v->value, dtype, p->value.ndim, p->value.shape, (char *)opt->block + off);
        fl_tensor_view(&v->grad, dtype, p->value.ndim, p->value.shape, NULL);
        v->value.device = fl_backend_device(k);
        v->trainable = false;
        off += velocity_bytes(p);
        opt->velocity_of[i] = opt->nstate++;
    }
    if (cfg->type == FL_OPTIM_LARS) {
        size_t m = (size_t)(n ? n : 1);
        if (!(opt->decay_of = malloc(m * sizeof *opt->decay_of)))
            goto nomem;
        for (int i = 0; i < n; i++) /* the names' matching, not repeated every step */
            opt->decay_of[i] = lars_decay_of(cfg, params[i].name);
        if (k->lars_update_run && (!(opt->run_numel = malloc(m * sizeof *opt->run_numel)) ||
                                   !(opt->run_decay = malloc(m * sizeof *opt->run_decay))))
            goto nomem;
    }
    if (cfg->type == FL_OPTIM_LARS && cfg->weight_decay > 0) {
        size_t most = 0;
        for (int i = 0; i < n; i++)
            if (params[i].trainable && fl_tensor_nbytes(&params[i].value) > most)
                most = fl_tensor_nbytes(&params[i].value);
        if (!(opt->lars_scratch = k->alloc(most)))
            goto nomem;
    }
    return opt;

nomem:
    fl_fail(FL_ENOMEM, "optimizer: out of memory for the state of %d parameters", n);
fail:
    fl_optim_free(opt);
    return NULL;
}

void fl_optim_free(fl_optim *opt) {
    if (!opt)
        return;
    opt->k->free(opt->block);
    opt->k->free(opt->lars_scratch);
    free(opt->state);
    free(opt->velocity_of);
    free(opt->run_numel);
    free(opt->run_decay);
    free(opt->decay_of);
    free(opt);
}

/* The end of the run of parameters from i (trainable, with a gradient) whose values,
 * gradients and velocities each follow one another in memory, non-trainable ones between them
 * skipped; *numel gets the run's elements. A network's parameters are usually one run (its
 * flat blocks), so SGD and Momentum update them in one kernel call instead of one a tensor:
 * the same arithmetic per element, the same bits. */
static int run_end(const fl_optim *opt, int i, int64_t *numel) {
    size_t e = fl_dtype_size(opt->dtype);
    const fl_param *p = &opt->params[i];
    const fl_param *v = opt->velocity_of[i] >= 0 ? &opt->state[opt->velocity_of[i]] : NULL;
    int64_t n = p->value.numel;
    const char *w0 = p->value.data, *g0 = p->grad.data, *v0 = v ? v->value.data : NULL;
    int j = i + 1;
    for (; j < opt->n; j++) {
        const fl_param *q = &opt->params[j];
        if (!q->trainable)
            continue;
        size_t off = (size_t)n * e;
        const fl_param *qv = opt->velocity_of[j] >= 0 ? &opt->state[opt->velocity_of[j]] : NULL;
        if (!q->grad.data || (const char *)q->value.data != w0 + off ||
            (const char *)q->grad.data != g0 + off ||
            (v0 && (const char *)qv->value.data != v0 + off))
            break;
        n += q->value.numel;
    }
    *numel = n;
    return j;
}

/* LARS over the run from parameter i (run_end's) in one call of the table's lars_update_run:
 * the same bits as lars_update tensor by tensor, without its waits for the norms. The end of the
 * run. */
static int lars_run(fl_optim *opt, int i, double lr) {
    const fl_optim_config *c = &opt->cfg;
    int64_t n;
    int end = run_end(opt, i, &n), nt = 0;
    for (int j = i; j < end; j++) {
        const fl_param *q = &opt->params[j];
        if (!q->trainable)
            continue;
        opt->run_numel[nt] = q->value.numel;
        opt->run_decay[nt++] = opt->decay_of[j];
    }
    fl_param *p = &opt->params[i], *v = &opt->state[opt->velocity_of[i]];
    opt->k->lars_update_run(opt->dtype, nt, opt->run_numel, opt->run_decay, p->value.data,
                            p->grad.data, v->value.data, lr, c->momentum, c->weight_decay,
                            c->lars_coeff, c->epsilon);
    return end;
}

int fl_optim_step(fl_optim *opt, double lr, double *grad_norm) {
    FL_ASSERT(opt);
    if (!(lr >= 0) || !isfinite(lr))
        return fl_fail(FL_EINVAL, "optimizer: learning rate %g is not a finite number >= 0", lr);
    const fl_optim_config *c = &opt->cfg;
    if (c->clip_norm > 0 || grad_norm) {
        double norm = fl_clip_grad_norm(opt->k, opt->dtype, opt->params, opt->n,
                                        c->clip_norm > 0 ? c->clip_norm : 0.0);
        if (grad_norm)
            *grad_norm = norm;
    }
    for (int i = 0, next; i < opt->n; i = next) {
        fl_param *p = &opt->params[i];
        next = i + 1;
        if (!p->trainable || !p->grad.data)
            continue;
        if (c->type == FL_OPTIM_LARS && opt->k->lars_update_run) {
            next = lars_run(opt, i, lr);
            continue;
        }
        if (c->type == FL_OPTIM_LARS) { /* layer-wise: each tensor its own rate */
            fl_param *v = &opt->state[opt->velocity_of[i]];
            lars_update(opt->k, opt->dtype, c, p, opt->decay_of[i], v->value.data,
                        opt->lars_scratch, lr);
            continue;
        }
        int64_t n;
        next = run_end(opt, i, &n);
        if (c->type == FL_OPTIM_SGD) {
            opt->k->sgd_update(opt->dtype, n, p->value.data, p->grad.data, lr, c->weight_decay);
        } else {
            fl_param *v = &opt->state[opt->velocity_of[i]];
            opt->k->momentum_update(opt->dtype, n, p->value.data, p->grad.data, v->value.data,
                                    lr, c->momentum, c->weight_decay, c->nesterov);
        }
    }
    return FL_OK;
}

const fl_optim_config *fl_optim_get_config(const fl_optim *opt) {
    FL_ASSERT(opt);
    return &opt->cfg;
}

int fl_optim_num_state(const fl_optim *opt) {
    FL_ASSERT(opt);
    return opt->nstate;
}

fl_param *fl_optim_state(fl_optim *opt, int i) {
    FL_ASSERT(opt && i >= 0 && i < opt->nstate);
    return &opt->state[i];
}
