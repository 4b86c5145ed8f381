/* npy.h - NumPy's .npy format, version 1.0 (numpy.lib.format): the magic "\x93NUMPY", version
 * 1.0, a 2-byte little-endian header length, a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (N, C), } padded with spaces and a newline
 * so that the data starts 64-byte aligned, then the raw little-endian data in C order.
 * fleet-eval writes its output vectors this way, for numpy.load. */
#ifndef FLEET_NPY_H
#define FLEET_NPY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Writes an f32 array of shape[0..ndim) (1 <= ndim <= 6) from data to path, atomically.
 * FL_EIO naming the path on failure. */
int fl_npy_write_f32(const char *path, int ndim, const int64_t *shape, const float *data);

/* Reads an f32 .npy file written in C order ('<f4', version 1.0 or 2.0): *data (malloc'd, the
 * caller frees it) and the shape. FL_EFORMAT naming the file when it is anything else. */
int fl_npy_read_f32(const char *path, int *ndim, int64_t shape[6], float **data);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_NPY_H */
