/* tensor.h - dtypes, devices, f16/bf16 conversion, the fl_tensor, and the named fl_param.
 *
 * A tensor is a dense row-major array with a dtype, a device, a shape and a flag saying whether
 * it owns its data. Views (fl_tensor_view) borrow memory: that is how a network carves one flat
 * block into named parameters and how a gradient bucket points into the flat gradient. */
#ifndef FLEET_TENSOR_H
#define FLEET_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FL_DTYPE_F32 = 0,
    FL_DTYPE_F64,
    FL_DTYPE_F16,
    FL_DTYPE_BF16,
    FL_DTYPE_I32,
    FL_DTYPE_I64,
    FL_DTYPE_U8,
    FL_DTYPE_COUNT
} fl_dtype;

/* Size in bytes of one element. */
size_t fl_dtype_size(fl_dtype t);
/* Lower-case name: "f32", "bf16", ... */
const char *fl_dtype_name(fl_dtype t);
/* Parses a name as written by fl_dtype_name (also "float32", "float16", "bfloat16", "int64"...);
 * returns 0 and sets *out, or FL_EINVAL. */
int fl_dtype_parse(const char *name, fl_dtype *out);
bool fl_dtype_is_float(fl_dtype t);

/* IEEE binary16 and bfloat16, round to nearest even; NaN stays NaN, overflow goes to inf. */
uint16_t fl_f32_to_f16(float f);
float    fl_f16_to_f32(uint16_t h);
uint16_t fl_f32_to_bf16(float f);
float    fl_bf16_to_f32(uint16_t h);
void fl_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void fl_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void fl_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void fl_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

typedef enum { FL_DEVICE_CPU = 0, FL_DEVICE_CUDA = 1 } fl_device_type;

/* Where a tensor's memory is. FL_DEVICE_CPU: host memory (also the memory of the CPU
 * backends, whose memory is the host's); FL_DEVICE_CUDA: the memory of a backend whose
 * host_memory is false (the cuda backend's, or the tests' stand-in for a device), which the
 * host reaches only through the backend's copy (backend.h's memory rule). */
typedef struct {
    fl_device_type type;
    int index; /* GPU ordinal; 0 on CPU */
} fl_device;

#define FL_MAX_DIMS 6

typedef struct fl_tensor {
    fl_dtype  dtype;
    fl_device device;
    int       ndim;
    int64_t   shape[FL_MAX_DIMS];
    int64_t   numel;
    void     *data;
    bool      owns_data; /* fl_tensor_free releases data only when true */
} fl_tensor;

/* Allocates a zero-filled CPU tensor (64-byte aligned data). Returns NULL and sets fl_errmsg on
 * failure (bad shape, out of memory). The caller frees it with fl_tensor_free. */
fl_tensor *fl_tensor_create(fl_dtype t, int ndim, const int64_t *shape);
/* A tensor struct that borrows data (not owned; data must outlive it). */
fl_tensor *fl_tensor_create_view(fl_dtype t, int ndim, const int64_t *shape, void *data);
/* Frees the struct and, if owned, its data. NULL is a no-op. */
void fl_tensor_free(fl_tensor *x);

/* Fills a caller-provided struct as a borrowing view (no allocation). */
void fl_tensor_view(fl_tensor *x, fl_dtype t, int ndim, const int64_t *shape, void *data);

/* Whether the host may read and write x's data directly (x->device is FL_DEVICE_CPU). */
static inline bool fl_tensor_on_host(const fl_tensor *x) {
    return x->device.type == FL_DEVICE_CPU;
}

/* Product of shape[0..ndim); 1 for ndim == 0. */
int64_t fl_shape_numel(int ndim, const int64_t *shape);
size_t  fl_tensor_nbytes(const fl_tensor *x);
bool    fl_tensor_same_shape(const fl_tensor *a, const fl_tensor *b);
/* Writes "(128, 32)" into buf; returns buf. */
char   *fl_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* 64-byte aligned allocation for hot buffers; fl_free_aligned(NULL) is a no-op. */
void *fl_alloc_aligned(size_t nbytes);
void  fl_free_aligned(void *p);

/* A named, trainable (or persistable) tensor and its gradient. Layers create them, networks
 * place them in flat memory, optimizers and strategies update them by name. */
typedef struct fl_param {
    char      name[96];   /* stable dotted name: "fc1.weight", "layer2.0.bn1.running_mean" */
    fl_tensor value;      /* view into the owner's flat parameter block */
    fl_tensor grad;       /* view into the flat gradient block; data NULL for buffers */
    bool      trainable;  /* false for persistable buffers such as running statistics */
} fl_param;

#ifdef __cplusplus
}
#endif
#endif /* FLEET_TENSOR_H */
