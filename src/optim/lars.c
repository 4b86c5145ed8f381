/* lars.c - LARS momentum (You, Gitman & Ginsburg 2017, "Large batch training of convolutional
 * networks", arXiv:1708.03888): a trust ratio ||w|| / (||g|| + d ||w||) per parameter tensor
 * scales the learning rate, as Paddle's lars_momentum kernel (2.x) computes it; names matching
 * exclude_from_weight_decay (batch-norm and bias parameters, typically) get d = 0 and with it a
 * plain momentum step. Norms come from the kernel table's sumsq, the update from axpy/scale. */
#include "optim_impl.h"

#include "fleet/status.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

int lars_check_config(const fl_optim_config *c) {
    if (!(c->lars_coeff > 0) || !isfinite(c->lars_coeff))
        return fl_fail(FL_EINVAL, "optimizer: lars_coeff %g is not a finite number > 0",
                       c->lars_coeff);
    if (!(c->lars_weight_decay >= 0) || !isfinite(c->lars_weight_decay))
        return fl_fail(FL_EINVAL, "optimizer: lars_weight_decay %g is not a finite number >= 0",
                       c->lars_weight_decay);
    if (!(c->epsilon >= 0) || !isfinite(c->epsilon))
        return fl_fail(FL_EINVAL, "optimizer: LARS epsilon %g is not a finite number >= 0",
                       c->epsilon);
    if (!memchr(c->exclude_from_weight_decay, '\0', sizeof c->exclude_from_weight_decay))
        return fl_fail(FL_EINVAL, "optimizer: exclude_from_weight_decay is not terminated");
    return FL_OK;
}

bool fl_optim_name_excluded(const char *name, const char *list) {
    FL_ASSERT(name);
    if (!list)
        return false;
    const char *p = list;
    while (*p) {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        size_t len = (size_t)(end - p);
        while (len > 0 && isspace((unsigned char)p[len - 1]))
            len--;
        if (len > 0) {
            for (const char *s = name; *s; s++)
                if (strncmp(s, p, len) == 0)
                    return true;
        }
        p = end;
    }
    return false;
}

double lars_decay_of(const fl_optim_config *c, const char *name) {
    return fl_optim_name_excluded(name, c->exclude_from_weight_decay) ? 0.0 : c->lars_weight_decay;
}

void lars_update(const fl_backend *k, fl_dtype t, const fl_optim_config *c, fl_param *p,
                 double d, void *v, void *scratch, double lr) {
    int64_t n = p->value.numel;
    void *w = p->value.data;
    const void *g = p->grad.data;
    if (c->weight_decay > 0) { // the L2 regulariser is part of the gradient LARS sees
        k->copy(scratch, g, fl_tensor_nbytes(&p->value), FL_COPY_D2D, NULL);
        k->axpy(t, n, c->weight_decay, w, scratch);
        g = scratch;
    }
    double local_lr = lr;
    if (d > 0) {
        double wn = sqrt(k->sumsq(t, w, n)), gn = sqrt(k->sumsq(t, g, n));
        if (wn > 0 && gn > 0)
            local_lr = lr * c->lars_coeff * wn / (gn + d * wn + c->epsilon);
    }
    // v = mu v + local_lr (g + d w);  w -= v
    k->scale(t, n, c->momentum, v);
    k->axpy(t, n, local_lr, g, v);
    if (d > 0)
        k->axpy(t, n, local_lr * d, w, v);
    k->axpy(t, n, -1.0, v, w);
}
