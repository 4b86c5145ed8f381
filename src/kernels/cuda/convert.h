/* convert.h - f32 <-> f16 / bf16 conversion on the device for mixed precision (the AMP work):
 * private to fleet (not in the backend table, which has no such entry yet). */
#ifndef FLEET_KERNELS_CUDA_CONVERT_H
#define FLEET_KERNELS_CUDA_CONVERT_H

#include "fleet/backend.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst (n elements of dst_t) = src (n elements of src_t), device memory, in stream s (NULL: the
 * backend's), rounding to nearest even: f32 -> f16 or bf16 (overflow gives +-inf, NaN stays
 * NaN), f16 or bf16 -> f32 (exact). 0, or FL_EINVAL naming the pair when it is another. */
int fl_cuda_convert(fl_dtype dst_t, void *dst, fl_dtype src_t, const void *src, int64_t n,
                    fl_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_KERNELS_CUDA_CONVERT_H */
