/* clip.c - gradient clipping by global L2 norm (Paddle's ClipGradByGlobalNorm, PyTorch's
 * clip_grad_norm_): one norm over every trainable gradient, one common scale, so the update's
 * direction is kept and only its length is bounded. */
#include "fleet/optim.h"

#include "fleet/status.h"

#include <math.h>

double fl_clip_grad_norm(const fl_backend *k, fl_dtype t, fl_param *params, int n,
                         double max_norm) {
    FL_ASSERT(k && (params || n == 0));
    /* parameter order is fixed and sumsq is deterministic, so every rank gets the same norm
     * from the same gradients */
    double sumsq = 0.0;
    for (int i = 0; i < n; i++) {
        fl_param *p = &params[i];
        if (!p->trainable || !p->grad.data)
            continue;
        FL_ASSERT(p->grad.dtype == t);
        sumsq += k->sumsq(t, p->grad.data, p->grad.numel);
    }
    double norm = sqrt(sumsq);
    /* scale = max_norm / max(norm, max_norm); a NaN or infinite norm is left for the caller to
     * see (scaling by it would only spread the NaN into every gradient) */
    if (max_norm > 0 && isfinite(norm) && norm > max_norm) {
        double scale = max_norm / norm;
        for (int i = 0; i < n; i++) {
            fl_param *p = &params[i];
            if (p->trainable && p->grad.data)
                k->scale(t, p->grad.numel, scale, p->grad.data);
        }
    }
    return norm;
}
