/* safetensors.h - the safetensors file format (github.com/huggingface/safetensors), which fleet
 * uses for checkpoints and inference models so that they open with the tools users already
 * have (NumPy, PyTorch, the safetensors package):
 *
 *     8 bytes   N, the header length, unsigned little-endian
 *     N bytes   JSON: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...,
 *                      "__metadata__": {"<key>": "<string>", ...}}   (padded with spaces)
 *     ...       the tensors' bytes, little-endian, row-major; tensor data is [8+N+b, 8+N+e)
 *
 * fleet adds one CRC-32 per tensor (the zlib / IEEE 802.3 polynomial, so Python's zlib.crc32
 * checks it too) in the metadata as "crc32.<name>": "<8 hex digits>", and one over the other
 * metadata entries, "crc32.__metadata__" (the CRC-32 of key NUL value NUL for each entry that
 * is not a checksum, in file order), so that no byte of a fleet file goes unchecked. A file is
 * written atomically (temporary file in the same directory, fsync, rename, fsync of the directory), so
 * a reader sees the old file or the new one, never a mix. Opening reads the whole file and
 * validates all of it before anything is returned: header syntax, dtypes, shapes against the
 * byte ranges, ranges inside the file, neither overlapping nor leaving holes, and every
 * checksum. Hence a file that opens is whole, and callers copy from it only after they have
 * matched every tensor they need (nothing half-loaded). */
#ifndef FLEET_SAFETENSORS_H
#define FLEET_SAFETENSORS_H

#include "fleet/tensor.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32 (reflected polynomial 0xEDB88320): zlib's crc32. Start with crc = 0 and feed the
 * previous result to continue; n = 0 returns crc (data may then be NULL). */
uint32_t fl_crc32(uint32_t crc, const void *data, size_t n);

/* The format's dtype names: "F32", "F64", "F16", "BF16", "I32", "I64", "U8". */
const char *fl_safetensors_dtype_name(fl_dtype t);

/* One tensor to write; everything borrowed. */
typedef struct {
    const char    *name;
    fl_dtype       dtype;
    int            ndim;
    const int64_t *shape;
    const void    *data; /* fl_shape_numel(ndim, shape) elements of dtype */
} fl_st_entry;

/* One metadata entry (a string to string map in the format). */
typedef struct {
    const char *key;
    const char *value;
} fl_st_meta;

/* Writes tensors t[0..n) (names unique, not "__metadata__", no "crc32." keys in meta) and the
 * metadata entries meta[0..nmeta) plus one "crc32.<name>" per tensor to path, atomically.
 * FL_EIO naming the path on any failure (the previous file at path, if any, is left as it
 * was); FL_EINVAL for bad arguments (duplicate names). */
int fl_safetensors_write(const char *path, const fl_st_entry *t, int n, const fl_st_meta *meta,
                         int nmeta);

/* A tensor of an open file; borrowed from it. */
typedef struct {
    const char *name;
    fl_dtype    dtype;
    int         ndim;
    int64_t     shape[FL_MAX_DIMS];
    int64_t     numel;
    const void *data;   /* inside the file's buffer; may be unaligned */
    size_t      nbytes;
} fl_st_tensor;

typedef struct fl_safetensors fl_safetensors;

/* Reads and validates the whole file (see above). Tensors listed with a checksum must match it;
 * when any "crc32." entry is present every tensor must have one (a fleet file). Returns 0 and
 * *out (free with fl_safetensors_close), or FL_EIO (cannot read), FL_EFORMAT (damaged or
 * malformed: the message names the file and, where there is one, the tensor), FL_ENOMEM. */
int  fl_safetensors_open(const char *path, fl_safetensors **out);
void fl_safetensors_close(fl_safetensors *st);

const char         *fl_safetensors_path(const fl_safetensors *st);
int                 fl_safetensors_count(const fl_safetensors *st);
/* Tensors in data-offset order; NULL outside [0, count). */
const fl_st_tensor *fl_safetensors_tensor(const fl_safetensors *st, int i);
const fl_st_tensor *fl_safetensors_find(const fl_safetensors *st, const char *name);
/* Metadata value for key, or NULL. Entries in file order via count/at (key and value borrowed). */
const char *fl_safetensors_meta(const fl_safetensors *st, const char *key);
int         fl_safetensors_meta_count(const fl_safetensors *st);
void        fl_safetensors_meta_at(const fl_safetensors *st, int i, const char **key,
                                   const char **value);
/* Whether the file holds the checksum entries fleet writes. */
int         fl_safetensors_has_checksums(const fl_safetensors *st);

#ifdef __cplusplus
}
#endif
#endif /* FLEET_SAFETENSORS_H */
