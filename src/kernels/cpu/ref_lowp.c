/* ref_lowp.c - the ref table's f16 / bf16 operations that the cpu table's float/double
 * templates serve for f32 / f64 (backend.h, "Low dtypes"): fill, reorder, the residual add,
 * dropout, channel padding and slicing, pooling, batch norm and convolution. Plain single-
 * threaded loops as in ref.c: each output element is computed in double from the values read
 * and rounded once on store; gradients that sum over windows gather (each dx element sums what
 * reaches it), so nothing needs scratch. Slow on purpose: it is what a GPU's low-dtype kernels
 * are held to. */
#include "ref_lowp.h"

#include "kernels/hardswish.h"
#include "fleet/rng.h"
#include "fleet/status.h"

#include <math.h>
#include <string.h>

#define ASSERT_LOW(t) FL_ASSERT(ref_lowp_is(t))

uint16_t ref_lowp_from_double(fl_dtype t, double v) {
    FL_ASSERT(ref_lowp_is(t));
    float f = (float)v;
    if (!isnan(v) && (double)f != v) { /* inexact: toward zero, then the last bit set */
        if (fabs((double)f) > fabs(v))
            f = nextafterf(f, 0.0f);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        u |= 1u;
        memcpy(&f, &u, sizeof f);
    }
    return t == FL_DTYPE_F16 ? fl_f32_to_f16(f) : fl_f32_to_bf16(f);
}

/* Element (i, ch, p) of an (N, C, HW) tensor in layout l: its index. */
static inline int64_t at(fl_layout l, int64_t c, int64_t hw, int64_t i, int64_t ch, int64_t p) {
    return l == FL_LAYOUT_NHWC ? (i * hw + p) * c + ch : (i * c + ch) * hw + p;
}

static inline double getf(const void *p, int64_t i) { return (double)((const float *)p)[i]; }

void ref_lowp_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n) {
    if (from == to) {
        if (n > 0)
            memcpy(dst, src, (size_t)n * fl_dtype_size(from));
        return;
    }
    FL_ASSERT((from == FL_DTYPE_F32 && ref_lowp_is(to)) ||
              (ref_lowp_is(from) && to == FL_DTYPE_F32));
    for (int64_t i = 0; i < n; i++) {
        if (from == FL_DTYPE_F32)
            ref_lowp_put(to, dst, i, getf(src, i));
        else
            ((float *)dst)[i] = (float)ref_lowp_get(from, src, i);
    }
}

void ref_lowp_fill(fl_dtype t, void *x, int64_t n, double v) {
    ASSERT_LOW(t);
    for (int64_t i = 0; i < n; i++)
        ref_lowp_put(t, x, i, v);
}

/* a copy: no rounding */
void ref_lowp_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                      const void *src, void *dst) {
    ASSERT_LOW(t);
    const uint16_t *s = src;
    uint16_t *d = dst;
    fl_layout from = to_nhwc ? FL_LAYOUT_NCHW : FL_LAYOUT_NHWC;
    fl_layout to = to_nhwc ? FL_LAYOUT_NHWC : FL_LAYOUT_NCHW;
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++)
                d[at(to, c, hw, i, ch, p)] = s[at(from, c, hw, i, ch, p)];
}

void ref_lowp_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                          bool relu) {
    ASSERT_LOW(t);
    for (int64_t i = 0; i < n; i++) {
        double v = ref_lowp_get(t, a, i) + ref_lowp_get(t, b, i);
        ref_lowp_put(t, y, i, relu && !(v > 0) ? 0.0 : v);
    }
}

/* copies of dy (or zeros): no rounding */
void ref_lowp_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                           int64_t n, bool relu) {
    ASSERT_LOW(t);
    for (int64_t i = 0; i < n; i++) {
        uint16_t v = relu && !(ref_lowp_get(t, y, i) > 0) ? 0 : ((const uint16_t *)dy)[i];
        if (da)
            ((uint16_t *)da)[i] = v;
        if (db)
            ((uint16_t *)db)[i] = v;
    }
}

/* the cpu table's mask (layer_ops.c), the kept values times 1 / (1 - p) in double */
void ref_lowp_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                           void *out, int64_t n) {
    ASSERT_LOW(t);
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t thresh = (uint32_t)(p * 4294967296.0);
    double scale = 1.0 / (1.0 - p);
    for (int64_t i = 0; i < n; i++) {
        uint64_t q = (uint64_t)i / 4;
        uint32_t ctr[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)step,
                           (uint32_t)(step >> 32)},
                 r[4];
        fl_philox4x32(ctr, key, r);
        ref_lowp_put(t, out, i, r[i % 4] >= thresh ? ref_lowp_get(t, in, i) * scale : 0.0);
    }
}

/* copies and zeros: no rounding */
void ref_lowp_channel_pad(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t h, int64_t w,
                          int64_t stride, int64_t oc, void *x, void *y, bool forward) {
    ASSERT_LOW(t);
    int64_t off = (oc - c) / 2, oh = (h + stride - 1) / stride, ow = (w + stride - 1) / stride;
    uint16_t *xs = x, *ys = y;
    if (forward)
        memset(y, 0, (size_t)(n * oc * oh * ow) * sizeof(uint16_t));
    else
        memset(x, 0, (size_t)(n * c * h * w) * sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    int64_t xe = at(l, c, h * w, i, ch, oy * stride * w + ox * stride);
                    int64_t ye = at(l, oc, oh * ow, i, ch + off, oy * ow + ox);
                    if (forward)
                        ys[ye] = xs[xe];
                    else
                        xs[xe] = ys[ye];
                }
}

/* copies: no rounding */
void ref_lowp_channel_slice(fl_dtype t, fl_layout l, int64_t n, int64_t hw, int64_t c, void *x,
                            int64_t oc, int64_t off, void *y, bool forward) {
    ASSERT_LOW(t);
    FL_ASSERT(off >= 0 && off + c <= oc);
    uint16_t *xs = x, *ys = y;
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t xe = at(l, c, hw, i, ch, p), ye = at(l, oc, hw, i, off + ch, p);
                if (forward)
                    ys[ye] = xs[xe];
                else
                    xs[xe] = ys[ye];
            }
}

/* --- pooling: plane (i, ch) of n images, pixel index y * W + x within it --- */

/* The window of output (oy, ox): max, or mean over KH KW with the padding counted (its sum in
 * row order times 1 / (KH KW)); *arg: the first largest input pixel (-1 when the window lies in
 * the padding only). */
static double pool_window(fl_dtype t, fl_layout l, fl_pool pool, const fl_conv_geom *g,
                          const void *x, int64_t i, int64_t ch, int64_t oy, int64_t ox,
                          int64_t *arg) {
    double best = 0, sum = 0;
    *arg = -1;
    for (int64_t ki = 0; ki < g->kh; ki++) {
        int64_t iy = oy * g->sh - g->ph + ki * g->dh;
        if (iy < 0 || iy >= g->h)
            continue;
        for (int64_t kj = 0; kj < g->kw; kj++) {
            int64_t ix = ox * g->sw - g->pw + kj * g->dw;
            if (ix < 0 || ix >= g->w)
                continue;
            double v = ref_lowp_get(t, x, at(l, g->c, g->h * g->w, i, ch, iy * g->w + ix));
            if (*arg < 0 || v > best) {
                best = v;
                *arg = iy * g->w + ix;
            }
            sum += v;
        }
    }
    return pool == FL_POOL_MAX ? best : sum * (1.0 / (double)(g->kh * g->kw));
}

void ref_lowp_pool_forward(fl_dtype t, fl_layout l, fl_pool pool, int64_t n,
                           const fl_conv_geom *g, const void *x, void *y) {
    ASSERT_LOW(t);
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    int64_t arg;
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < g->c; ch++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++)
                    ref_lowp_put(t, y, at(l, g->c, g->oh * g->ow, i, ch, oy * g->ow + ox),
                                 pool_window(t, l, pool, g, x, i, ch, oy, ox, &arg));
}

/* dx at each input pixel: the sum over the windows that cover it of dy / (KH KW) (average) or
 * of dy where the pixel is the window's first largest (max), windows in (ki, kj) order */
void ref_lowp_pool_backward(fl_dtype t, fl_layout l, fl_pool pool, int64_t n,
                            const fl_conv_geom *g, const void *x, const void *dy, void *dx) {
    ASSERT_LOW(t);
    FL_ASSERT(pool == FL_POOL_MAX || pool == FL_POOL_AVG);
    double inv = 1.0 / (double)(g->kh * g->kw);
    for (int64_t i = 0; i < n; i++)
        for (int64_t ch = 0; ch < g->c; ch++)
            for (int64_t iy = 0; iy < g->h; iy++)
                for (int64_t ix = 0; ix < g->w; ix++) {
                    double s = 0;
                    for (int64_t ki = 0; ki < g->kh; ki++) {
                        int64_t ty = iy + g->ph - ki * g->dh, oy = ty / g->sh;
                        if (ty < 0 || ty % g->sh || oy >= g->oh)
                            continue;
                        for (int64_t kj = 0; kj < g->kw; kj++) {
                            int64_t tx = ix + g->pw - kj * g->dw, ox = tx / g->sw, arg;
                            if (tx < 0 || tx % g->sw || ox >= g->ow)
                                continue;
                            double d = ref_lowp_get(
                                t, dy, at(l, g->c, g->oh * g->ow, i, ch, oy * g->ow + ox));
                            if (pool == FL_POOL_AVG)
                                s += d * inv;
                            else if (pool_window(t, l, pool, g, x, i, ch, oy, ox, &arg),
                                     arg == iy * g->w + ix)
                                s += d;
                        }
                    }
                    ref_lowp_put(t, dx, at(l, g->c, g->h * g->w, i, ch, iy * g->w + ix), s);
                }
}

/* --- batch norm (Ioffe & Szegedy 2015, arXiv:1502.03167), per channel in double --- */

/* the activation of a fused batch norm at z (bn_forward's act), in double */
static double bn_act(fl_act act, double z) {
    return act == FL_ACT_RELU ? (z > 0 ? z : 0.0) : act == FL_ACT_HARDSWISH ? hardswish_f64(z) : z;
}

void ref_lowp_bn_forward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                         const void *x, const void *gamma, const void *beta, double eps,
                         bool training, double *mean, double *var, fl_act act, void *y) {
    ASSERT_LOW(t);
    for (int64_t ch = 0; ch < c; ch++) {
        if (training) { /* the batch's mean, then the mean squared deviation from it */
            double s = 0, q = 0, cnt = (double)(n * hw);
            for (int64_t i = 0; i < n; i++)
                for (int64_t p = 0; p < hw; p++)
                    s += ref_lowp_get(t, x, at(l, c, hw, i, ch, p));
            double m = s / cnt;
            for (int64_t i = 0; i < n; i++)
                for (int64_t p = 0; p < hw; p++) {
                    double e = ref_lowp_get(t, x, at(l, c, hw, i, ch, p)) - m;
                    q += e * e;
                }
            mean[ch] = m;
            var[ch] = q / cnt;
        }
        double sc = getf(gamma, ch) / sqrt(var[ch] + eps), sh = getf(beta, ch) - mean[ch] * sc;
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = at(l, c, hw, i, ch, p);
                ref_lowp_put(t, y, e, bn_act(act, ref_lowp_get(t, x, e) * sc + sh));
            }
    }
}

/* dz at element e: dy masked by y > 0 (relu), dy hardswish'(z) with z recomputed in double as
 * the forward computed it (hardswish), or dy */
static double bn_dz(fl_dtype t, fl_act act, const void *x, const void *y, const void *dy,
                    double sc, double sh, int64_t e) {
    double d = ref_lowp_get(t, dy, e);
    if (act == FL_ACT_RELU)
        return ref_lowp_get(t, y, e) > 0 ? d : 0.0;
    if (act == FL_ACT_HARDSWISH)
        return d * hardswish_grad_f64(ref_lowp_get(t, x, e) * sc + sh);
    return d;
}

void ref_lowp_bn_backward(fl_dtype t, fl_layout l, int64_t n, int64_t c, int64_t hw,
                          const void *x, fl_act act, const void *y, const void *dy,
                          const void *gamma, const void *beta, const double *mean,
                          const double *var, double eps, bool training, void *dx, void *dgamma,
                          void *dbeta, bool accumulate) {
    ASSERT_LOW(t);
    for (int64_t ch = 0; ch < c; ch++) {
        double m = mean[ch], is = 1.0 / sqrt(var[ch] + eps), sdy = 0, sdyx = 0;
        /* the forward's z = x sc + sh */
        double sc = getf(gamma, ch) / sqrt(var[ch] + eps), sh = getf(beta, ch) - m * sc;
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = at(l, c, hw, i, ch, p);
                double d = bn_dz(t, act, x, y, dy, sc, sh, e);
                sdy += d;
                sdyx += d * (ref_lowp_get(t, x, e) - m) * is; /* d xhat */
            }
        float *dg = dgamma, *db = dbeta;
        dg[ch] = (float)((accumulate ? (double)dg[ch] : 0.0) + sdyx);
        db[ch] = (float)((accumulate ? (double)db[ch] : 0.0) + sdy);
        if (!dx)
            continue;
        /* gamma invstd (d - mean(d) - xhat mean(d xhat)); without the means outside training */
        double cnt = (double)(n * hw), k = getf(gamma, ch) * is;
        double mdy = training ? sdy / cnt : 0, mdyx = training ? sdyx / cnt : 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t e = at(l, c, hw, i, ch, p);
                double d = bn_dz(t, act, x, y, dy, sc, sh, e);
                double xhat = (ref_lowp_get(t, x, e) - m) * is;
                ref_lowp_put(t, dx, e, k * (d - mdy - xhat * mdyx));
            }
    }
}

/* --- convolution: direct loops; x (N, IC, H, W), y (N, OC, OH, OW) in d->layout, w (OC,
 * IC / groups, KH, KW) f32 read rounded to d->dtype --- */

/* weight element (o, ci, ki, kj) rounded to the plan's dtype, as a double */
static inline double wlow(const fl_conv_desc *d, const void *w, int64_t o, int64_t ci,
                          int64_t ki, int64_t kj) {
    int64_t icg = d->g.c / d->groups;
    float v = ((const float *)w)[((o * icg + ci) * d->g.kh + ki) * d->g.kw + kj];
    return ref_lowp_value(d->dtype, d->dtype == FL_DTYPE_F16 ? fl_f32_to_f16(v)
                                                             : fl_f32_to_bf16(v));
}

void ref_lowp_conv_forward(const fl_conv_desc *d, int64_t n, const void *x, const void *w,
                           const void *bias, void *y) {
    const fl_conv_geom *g = &d->g;
    fl_dtype t = d->dtype;
    fl_layout l = d->layout;
    ASSERT_LOW(t);
    FL_ASSERT(n <= d->max_batch);
    int64_t icg = g->c / d->groups, ocg = d->oc / d->groups, hw = g->h * g->w;
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < d->oc; o++)
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++) {
                    double s = 0;
                    for (int64_t ci = 0; ci < icg; ci++)
                        for (int64_t ki = 0; ki < g->kh; ki++) {
                            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                            if (iy < 0 || iy >= g->h)
                                continue;
                            for (int64_t kj = 0; kj < g->kw; kj++) {
                                int64_t ix = ox * g->sw - g->pw + kj * g->dw;
                                if (ix < 0 || ix >= g->w)
                                    continue;
                                int64_t xe = at(l, g->c, hw, i, o / ocg * icg + ci, iy * g->w + ix);
                                s += wlow(d, w, o, ci, ki, kj) * ref_lowp_get(t, x, xe);
                            }
                        }
                    if (bias)
                        s += getf(bias, o);
                    ref_lowp_put(t, y, at(l, d->oc, g->oh * g->ow, i, o, oy * g->ow + ox), s);
                }
}

/* dx (i, cin, iy, ix) = the sum over its group's outputs o and the kernel taps (ki, kj) whose
 * window position lands on it of w (o, ci, ki, kj) dy (i, o, oy, ox) */
void ref_lowp_conv_backward_data(const fl_conv_desc *d, int64_t n, const void *dy,
                                 const void *w, void *dx) {
    const fl_conv_geom *g = &d->g;
    fl_dtype t = d->dtype;
    fl_layout l = d->layout;
    ASSERT_LOW(t);
    FL_ASSERT(n <= d->max_batch);
    int64_t icg = g->c / d->groups, ocg = d->oc / d->groups, ohw = g->oh * g->ow;
    for (int64_t i = 0; i < n; i++)
        for (int64_t cin = 0; cin < g->c; cin++)
            for (int64_t iy = 0; iy < g->h; iy++)
                for (int64_t ix = 0; ix < g->w; ix++) {
                    int64_t gi = cin / icg, ci = cin % icg;
                    double s = 0;
                    for (int64_t o = gi * ocg; o < (gi + 1) * ocg; o++)
                        for (int64_t ki = 0; ki < g->kh; ki++) {
                            int64_t ty = iy + g->ph - ki * g->dh, oy = ty / g->sh;
                            if (ty < 0 || ty % g->sh || oy >= g->oh)
                                continue;
                            for (int64_t kj = 0; kj < g->kw; kj++) {
                                int64_t tx = ix + g->pw - kj * g->dw, ox = tx / g->sw;
                                if (tx < 0 || tx % g->sw || ox >= g->ow)
                                    continue;
                                s += wlow(d, w, o, ci, ki, kj) *
                                     ref_lowp_get(t, dy, at(l, d->oc, ohw, i, o, oy * g->ow + ox));
                            }
                        }
                    ref_lowp_put(t, dx, at(l, g->c, g->h * g->w, i, cin, iy * g->w + ix), s);
                }
}

/* dw (o, ci, ki, kj): the sum over images and output pixels of dy x, rounded to the plan's
 * dtype, then written or added in f32; dbias (o): the sum of dy in double (plus dbias when
 * accumulate), rounded to f32 */
void ref_lowp_conv_backward_filter(const fl_conv_desc *d, int64_t n, const void *x,
                                   const void *dy, void *dw, void *dbias, bool accumulate) {
    const fl_conv_geom *g = &d->g;
    fl_dtype t = d->dtype;
    fl_layout l = d->layout;
    ASSERT_LOW(t);
    FL_ASSERT(n <= d->max_batch);
    int64_t icg = g->c / d->groups, ocg = d->oc / d->groups, hw = g->h * g->w,
            ohw = g->oh * g->ow;
    float *dwf = dw;
    for (int64_t o = 0; o < d->oc; o++)
        for (int64_t ci = 0; ci < icg; ci++)
            for (int64_t ki = 0; ki < g->kh; ki++)
                for (int64_t kj = 0; kj < g->kw; kj++) {
                    double s = 0;
                    for (int64_t i = 0; i < n; i++)
                        for (int64_t oy = 0; oy < g->oh; oy++) {
                            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                            if (iy < 0 || iy >= g->h)
                                continue;
                            for (int64_t ox = 0; ox < g->ow; ox++) {
                                int64_t ix = ox * g->sw - g->pw + kj * g->dw;
                                if (ix < 0 || ix >= g->w)
                                    continue;
                                int64_t xe = at(l, g->c, hw, i, o / ocg * icg + ci, iy * g->w + ix);
                                s += ref_lowp_get(t, dy, at(l, d->oc, ohw, i, o, oy * g->ow + ox)) *
                                     ref_lowp_get(t, x, xe);
                            }
                        }
                    float low = (float)ref_lowp_value(t, ref_lowp_from_double(t, s));
                    int64_t e = ((o * icg + ci) * g->kh + ki) * g->kw + kj;
                    dwf[e] = accumulate ? dwf[e] + low : low;
                }
    if (!dbias)
        return;
    float *db = dbias;
    for (int64_t o = 0; o < d->oc; o++) {
        double s = accumulate ? (double)db[o] : 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t p = 0; p < ohw; p++)
                s += ref_lowp_get(t, dy, at(l, d->oc, ohw, i, o, p));
        db[o] = (float)s;
    }
}
