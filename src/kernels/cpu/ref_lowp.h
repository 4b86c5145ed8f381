/* ref_lowp.h - the ref table's f16 / bf16 operations (backend.h, "Low dtypes"): element access
 * to 2-byte arrays, the one rounding on store, and the ops the ref table otherwise borrows from
 * the cpu table's float/double templates (which stay f32 / f64 only). ref.c's own loops read and
 * write low arrays through ref_lowp_get / ref_lowp_put and call the rest when t is low. */
#ifndef FLEET_KERNELS_CPU_REF_LOWP_H
#define FLEET_KERNELS_CPU_REF_LOWP_H

#include "fleet/backend.h"

#include <stdbool.h>
#include <stdint.h>

/* Whether t is one of the low dtypes (FL_DTYPE_F16, FL_DTYPE_BF16). */
static inline bool ref_lowp_is(fl_dtype t) { return t == FL_DTYPE_F16 || t == FL_DTYPE_BF16; }

/* v (a double) rounded once to the nearest value of low dtype t, ties to even, with
 * fl_f32_to_f16's rules for overflow (inf), underflow (signed zero) and NaN: v is first rounded
 * to f32 with round-to-odd (toward zero, the last bit set when inexact), which f32's 13 or 16
 * extra bits make innocuous: rounding to odd with at least 2 more bits, then to nearest, is
 * one rounding to nearest (Boldo & Melquiond 2008, "Emulation of FMA and correctly rounded sums:
 * proved algorithms using rounding to odd", IEEE Trans. Computers 57(4)), then to t. A plain
 * (float) cast first would round twice and miss by one unit next to a tie. */
uint16_t ref_lowp_from_double(fl_dtype t, double v);

/* The value of low element h, exact in float and double. */
static inline double ref_lowp_value(fl_dtype t, uint16_t h) {
    return t == FL_DTYPE_F16 ? (double)fl_f16_to_f32(h) : (double)fl_bf16_to_f32(h);
}

/* Element i of low array p, as a double; and a store of v, rounded once. */
static inline double ref_lowp_get(fl_dtype t, const void *p, int64_t i) {
    return ref_lowp_value(t, ((const uint16_t *)p)[i]);
}
static inline void ref_lowp_put(fl_dtype t, void *p, int64_t i, double v) {
    ((uint16_t *)p)[i] = ref_lowp_from_double(t, v);
}

/* The table's entries for t low, with backend.h's contracts and its low-dtype rule. */
/* backend.h's convert: f32 <-> f16 / bf16 (f32 to low is one rounding, from an exact double),
 * or a copy between equal dtypes. */
void ref_lowp_convert(fl_dtype from, const void *src, fl_dtype to, void *dst, int64_t n);
void ref_lowp_fill(fl_dtype t, void *x, int64_t n, double v);
void ref_lowp_reorder(fl_dtype t, bool to_nhwc, int64_t n, int64_t c, int64_t hw,
                      const void *src, void *dst);
void ref_lowp_add_forward(fl_dtype t, const void *a, const void *b, void *y, int64_t n,
                          bool relu);
void ref_lowp_add_backward(fl_dtype t, const void *y, const void *dy, void *da, void *db,
                           int64_t n, bool relu);
void ref_lowp_dropout_mask(fl_dtype t, uint64_t seed, uint64_t step, double p, const void *in,
                           void *out, int64_t n);
void ref_lowp_channel_pad(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t h,
                          int64_t w, int64_t stride, int64_t oc, void *x, void *y,
                          bool forward);
void ref_lowp_channel_slice(fl_dtype t, fl_layout layout, int64_t n, int64_t hw, int64_t c,
                            void *x, int64_t oc, int64_t off, void *y, bool forward);
void ref_lowp_pool_forward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                           const fl_conv_geom *g, const void *x, void *y);
void ref_lowp_pool_backward(fl_dtype t, fl_layout layout, fl_pool pool, int64_t n,
                            const fl_conv_geom *g, const void *x, const void *dy, void *dx);
/* gamma, beta, dgamma, dbeta: f32; mean, var: double */
void ref_lowp_bn_forward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                         const void *x, const void *gamma, const void *beta, double eps,
                         bool training, double *mean, double *var, fl_act act, void *y);
void ref_lowp_bn_backward(fl_dtype t, fl_layout layout, int64_t n, int64_t c, int64_t hw,
                          const void *x, fl_act act, const void *y, const void *dy,
                          const void *gamma, const void *beta, const double *mean, const double *var,
                          double eps, bool training, void *dx, void *dgamma, void *dbeta,
                          bool accumulate);

/* The convolution of a plan whose d->dtype is low (checked by fl_conv_desc_check_low), direct
 * loops in either layout, no scratch: x, y, dx, dy low; w, bias, dw, dbias f32 (w read rounded
 * to d->dtype; dw gets the weight gradient rounded to d->dtype, written or added in f32). */
void ref_lowp_conv_forward(const fl_conv_desc *d, int64_t n, const void *x, const void *w,
                           const void *bias, void *y);
void ref_lowp_conv_backward_data(const fl_conv_desc *d, int64_t n, const void *dy,
                                 const void *w, void *dx);
void ref_lowp_conv_backward_filter(const fl_conv_desc *d, int64_t n, const void *x,
                                   const void *dy, void *dw, void *dbias, bool accumulate);

#endif /* FLEET_KERNELS_CPU_REF_LOWP_H */
