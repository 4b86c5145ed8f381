/* dgc_ledger.c - the conservation check of DGC's exchange (see dgc_ledger.h). */
#include "dgc_ledger.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_T 64

struct dgc_ledger {
    fl_dist_optim *dopt;
    int            n;                /* compressed tensors */
    fl_param      *u[MAX_T], *v[MAX_T], *w[MAX_T];
    int64_t        numel;            /* their values */
    float         *v0, *w0;          /* (numel) before the update */
    double        *left, *right;     /* (numel) */
    double         worst;
};

static fl_param *param_named(fl_net *net, const char *name) {
    for (int i = 0; i < fl_net_num_params(net); i++)
        if (!strcmp(fl_net_param(net, i)->name, name))
            return fl_net_param(net, i);
    return NULL;
}

static fl_param *state_named(fl_dist_optim *d, const char *prefix, const char *name) {
    size_t len = strlen(prefix);
    for (int i = 0; i < fl_dist_num_state(d); i++) {
        fl_param *s = fl_dist_state(d, i);
        if (!strncmp(s->name, prefix, len) && !strcmp(s->name + len, name))
            return s;
    }
    return NULL;
}

dgc_ledger *dgc_ledger_create(fl_dist_optim *dopt, fl_net *net) {
    dgc_ledger *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->dopt = dopt;
    for (int i = 0; i < fl_dist_num_state(dopt); i++) {
        fl_param *s = fl_dist_state(dopt, i);
        if (strncmp(s->name, "dgc.v.", 6) != 0)
            continue;
        if (l->n == MAX_T)
            goto fail; /* more compressed tensors than the ledger holds */
        l->v[l->n] = s;
        l->u[l->n] = state_named(dopt, "dgc.u.", s->name + 6);
        l->w[l->n] = param_named(net, s->name + 6);
        if (!l->u[l->n] || !l->w[l->n])
            goto fail;
        l->numel += s->value.numel;
        l->n++;
    }
    size_t n = (size_t)(l->numel ? l->numel : 1);
    l->v0 = malloc(n * sizeof *l->v0);
    l->w0 = malloc(n * sizeof *l->w0);
    l->left = malloc(n * sizeof *l->left);
    l->right = malloc(n * sizeof *l->right);
    if (l->n == 0 || !l->v0 || !l->w0 || !l->left || !l->right)
        goto fail;
    return l;
fail:
    dgc_ledger_free(l);
    return NULL;
}

void dgc_ledger_before(dgc_ledger *l) {
    int64_t off = 0;
    for (int t = 0; t < l->n; t++) {
        size_t b = (size_t)l->v[t]->value.numel * sizeof(float);
        memcpy(l->v0 + off, l->v[t]->value.data, b);
        memcpy(l->w0 + off, l->w[t]->value.data, b);
        off += l->v[t]->value.numel;
    }
}

int dgc_ledger_after(dgc_ledger *l, fl_comm *comm, double lr) {
    int64_t off = 0;
    for (int t = 0; t < l->n; t++) {
        const float *u = l->u[t]->value.data, *v = l->v[t]->value.data,
                    *w = l->w[t]->value.data;
        for (int64_t i = 0; i < l->v[t]->value.numel; i++, off++) {
            float acc = l->v0[off] + u[i]; /* the accumulation's own float sum */
            l->left[off] = (double)acc - (double)v[i];
            l->right[off] = ((double)l->w0[off] - (double)w[i]) / lr;
        }
    }
    int world = fl_comm_size(comm);
    int rc = fl_comm_allreduce(comm, l->left, (size_t)l->numel, FL_DTYPE_F64, FL_REDOP_SUM);
    if (rc < 0)
        return rc;
    double big = 0, err = 0;
    for (int64_t i = 0; i < l->numel; i++) {
        double r = world * l->right[i];
        big = fabs(r) > big ? fabs(r) : big;
        err = fabs(l->left[i] - r) > err ? fabs(l->left[i] - r) : err;
    }
    double rel = big > 0 ? err / big : err;
    l->worst = rel > l->worst ? rel : l->worst;
    return 0;
}

double dgc_ledger_worst(const dgc_ledger *l) {
    return l->worst;
}

void dgc_ledger_free(dgc_ledger *l) {
    if (!l)
        return;
    free(l->v0);
    free(l->w0);
    free(l->left);
    free(l->right);
    free(l);
}
