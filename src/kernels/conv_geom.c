/* conv_geom.c - the geometry of a sliding window (convolution, pooling): the output size of a
 * window over an image, and the descriptor checks every backend's conv_plan_create makes
 * first. Its own file, below every backend: layers and all backends use it, none owns it. */
#include "fleet/backend.h"
#include "fleet/status.h"

bool fl_conv_geom_out(fl_conv_geom *g) {
    if (g->c < 1 || g->h < 1 || g->w < 1 || g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 ||
        g->ph < 0 || g->pw < 0 || g->dh < 1 || g->dw < 1)
        return false;
    int64_t eh = g->dh * (g->kh - 1) + 1, ew = g->dw * (g->kw - 1) + 1;
    if (g->h + 2 * g->ph < eh || g->w + 2 * g->pw < ew)
        return false;
    g->oh = (g->h + 2 * g->ph - eh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - ew) / g->sw + 1;
    return true;
}

/* low: f16 and bf16 are the backend's too */
static int desc_check(const fl_conv_desc *d, const char *who, bool low) {
    const fl_conv_geom *g = &d->g;
    bool is_low = d->dtype == FL_DTYPE_F16 || d->dtype == FL_DTYPE_BF16;
    if (is_low && !low)
        return fl_fail(FL_EUNSUPPORTED,
                       "%s: dtype %s: this backend's convolutions need f32 or f64 (f16 / bf16 "
                       "plans: the ref backend's, docs/amp.md)",
                       who, fl_dtype_name(d->dtype));
    if (d->dtype != FL_DTYPE_F32 && d->dtype != FL_DTYPE_F64 && !is_low)
        return fl_fail(FL_EINVAL, "%s: dtype %s: need f32 or f64%s", who,
                       fl_dtype_name(d->dtype), low ? ", f16 or bf16" : "");
    fl_conv_geom chk = *g;
    if (d->max_batch < 1 || d->oc < 1 || d->groups < 1 || g->c % d->groups ||
        d->oc % d->groups || !fl_conv_geom_out(&chk) || chk.oh != g->oh || chk.ow != g->ow)
        return fl_fail(FL_ESHAPE,
                       "%s: bad shape: batch %lld, %lld -> %lld channels in %lld groups, "
                       "%lldx%lld input, %lldx%lld window, output %lldx%lld",
                       who, (long long)d->max_batch, (long long)g->c, (long long)d->oc,
                       (long long)d->groups, (long long)g->h, (long long)g->w,
                       (long long)g->kh, (long long)g->kw, (long long)g->oh, (long long)g->ow);
    if (d->layout != FL_LAYOUT_NCHW && d->layout != FL_LAYOUT_NHWC)
        return fl_fail(FL_EINVAL, "%s: unknown layout %d", who, (int)d->layout);
    return FL_OK;
}

int fl_conv_desc_check(const fl_conv_desc *d, const char *who) {
    return desc_check(d, who, false);
}

int fl_conv_desc_check_low(const fl_conv_desc *d, const char *who) {
    return desc_check(d, who, true);
}
