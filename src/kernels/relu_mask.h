/* relu_mask.h - the gradient of a fused ReLU, d where y > 0 else 0, for y >= 0 (a ReLU's
 * output), as an integer mask on the bits: y > 0 iff its bits are > 0, and GCC at -O2
 * vectorises the integer and-mask where it does not vectorise a float compare-and-select.
 * Shared by the layers with a fused ReLU (batch norm's kernels, the residual add). */
#ifndef FLEET_RELU_MASK_H
#define FLEET_RELU_MASK_H

#include <stdint.h>
#include <string.h>

static inline float keep_f32(float y, float d) {
    int32_t yi, di;
    memcpy(&yi, &y, sizeof yi);
    memcpy(&di, &d, sizeof di);
    di &= -(int32_t)(yi > 0);
    memcpy(&d, &di, sizeof d);
    return d;
}

static inline double keep_f64(double y, double d) {
    int64_t yi, di;
    memcpy(&yi, &y, sizeof yi);
    memcpy(&di, &d, sizeof di);
    di &= -(int64_t)(yi > 0);
    memcpy(&d, &di, sizeof d);
    return d;
}

#endif /* FLEET_RELU_MASK_H */
